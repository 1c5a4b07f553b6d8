"""Training presets as code: one frozen `Config` per preset.

Every hyper-parameter of a run lives in one `Config` (the spirit of the 2016
tensorflow/models resnet's single `HParams` tuple and big_vision's configs as
code). `PRESETS` holds the paper's runs and a smoke run (the grids of
//bin:study that vary them are `studies`); `from_preset` applies overrides (the training binary's
flags) on top of a preset and validates the result; `to_dict` / `from_dict` round-trip
it through `model_dir/config.json`. Pure Python: importing it does not load
TensorFlow, so flags are checked at once.

Sources, Hardt & Ma, "Identity Matters in Deep Learning" (ICLR 2017):

* `cifar10_paper`, `cifar100_paper` -- Section 4.1: momentum optimizer with
  momentum 0.9, batch size 128, weight decay 1e-4 on the convolution weights,
  learning rate 0.05 dropped by a factor 10 at 30k and 50k steps; Table 1's
  network (`identity_tf.model`, "cifar10"/"cifar100"), the initialisation of
  Section 4 (std 1/(k^2 c)) and the random projection that is never trained.
* `imagenet_paper` -- Section 4.2: asynchronous SGD (here: the
  `parameter_server` strategy), batch size 256, learning rate 0.1 decayed by a
  factor 0.94 every 2 epochs, momentum 0.9.
* `smoke` -- ours: a narrow, shallow member of the same family on the built-in
  `synthetic` dataset, a few hundred steps (README.md has the time).

Values the paper does not state are marked "ours" below and in
docs/training.md.
"""

import dataclasses
import math

from identity_tf import architectures
from identity_tf import errors
from identity_tf.data import datasets

# Names of the learning-rate schedules (`optimization.learning_rate_schedule`)
# and of the strategies (`distribute.create_strategy`).
SCHEDULES = ("piecewise", "exponential", "cosine", "constant")
STRATEGIES = ("default", "mirrored", "multi_worker_mirrored", "tpu",
              "parameter_server")
# Keras dtype policies: the weights stay float32 in all three.
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
MODELS = tuple(sorted(architectures.MODELS))
# Which trainable weights weight decay decays (`optimization.decayed_weights`).
WEIGHT_DECAY_SCOPES = ("convolutions", "kernels", "all")

# The fields that define the network and its input; a model_dir holds one
# such network, so resuming with different values is refused.
MODEL_FIELDS = ("model", "dataset", "width", "units", "stem_channels",
                "init", "head", "norm", "use_bias", "seed",
                *architectures.BRANCH_FIELDS, "projection_scale",
                "logit_scale", "standardize")
# Fields of earlier versions' config.json that `from_dict` reads as today's
# (`architectures.translate_legacy`).
LEGACY_FIELDS = ("ws_init_scale",)
# The fields that change how a run is carried out, logged or evaluated but
# not what it learns: a study (`training.study`) accepts a run that differs
# from its arm's in these alone, and refuses one that differs in any other.
BOOKKEEPING_FIELDS = ("preset", "checkpoint_steps", "keep_checkpoints",
                      "log_steps", "steps_per_loop", "eval_steps",
                      "eval_at_end", "eval_batch_size", "eval_train_at_end",
                      "strategy", "deterministic", "jit_compile")


# The largest finite float32: the run's learning rates, scales and losses
# are float32 tensors.
FLOAT32_MAX = 3.4028234663852886e38


def _field(default, help_text):
  """A `Config` field with its help text: //bin:train's flag of that name
  says this (`cli.define_config_flags`)."""
  return dataclasses.field(default=default, metadata={"help": help_text})


def _names(values):
  return ", ".join(values)


@dataclasses.dataclass(frozen=True)
class Config:
  """Everything a training run needs except where its files go.

  Attributes are grouped: the network (`identity_tf.build_model` options), the
  data, the optimiser, bookkeeping, and how the run is distributed; each
  field's help text is its flag's. Derived values (the classes and
  preprocessing of the dataset) are not stored here: `training.run.prepare`
  derives them, and config.json records both.
  """
  preset: str = "custom"
  # The network. None: the model's own default (`architectures.MODELS`): the
  # paper's for cifar10/cifar100/imagenet, batch norm, a trained head and
  # the standard initialisation for resnet_bn.
  model: str = _field("cifar10", f"Network: {_names(MODELS)}.")
  width: float = _field(1.0, "Multiplier of every layer width (1.0 = the "
                        "paper's).")
  units: tuple = _field(None, "Residual units per stage: one integer, or one "
                        "per stage (default: the architecture's, 9 per stage "
                        "in Table 1).")
  stem_channels: int = _field(
      None, "Channels of every stem convolution at width 1, times --width "
      "like every layer (default: the architecture's, 16 in Table 1; 64: "
      "as wide as stage 1, the layout of Fixup's authors' CIFAR code).")
  init: str = _field(None, f"Initialisation: "
                     f"{_names(architectures.INIT_SCHEMES)} (paper: std "
                     "1/(k^2 c); fixup: C2 = 0 and C1 He-normal x L^-1/2, "
                     "the paper's stem; default: the model's).")
  head: str = _field(None, f"Final layer: {_names(architectures.HEADS)} "
                     "(frozen: the paper's random projection; trainable: "
                     "the same, trained; zero: a trained dense layer with "
                     "bias, zero at initialisation (Fixup's); normal: the "
                     "same drawn from N(0, 0.01^2) (NF-ResNet's); default: "
                     "the model's).")
  norm: bool = _field(None, "Batch-norm pre-activation units (default: the "
                      "model's).")
  use_bias: bool = _field(False, "Biases in the convolutions.")
  seed: int = _field(0, "Seeds the initial weights, the projection, the "
                     "data order and --mixup_alpha's mixing.")
  # The residual branch of the paper's unit, one option per change
  # (`architectures.BRANCH_FIELDS`).
  residual: str = _field(None, f"Form of the paper's residual branch: "
                         f"{_names(architectures.RESIDUALS)} (plain: x + "
                         "C2(ReLU(C1 x)); fixup: Fixup's scalar biases and "
                         "multiplier in it, C2 = 0 and C1 He-normal x "
                         "L^-1/2; default plain).")
  branch_gain: str = _field(None, f"A trained scalar on every branch: "
                            f"{_names(architectures.BRANCH_GAINS)} (zero: "
                            "from 0, SkipInit's, each unit starts as its "
                            "shortcut; one: from 1; default none).")
  weight_standardization: bool = _field(
      None, "Scaled weight standardisation of C1 and C2 (NF-ResNet's "
      "convolutions): each output channel's kernel at zero mean and unit "
      "fan-in variance, times a per-channel gain (default off).")
  ws_gain: str = _field(None, f"The standardised convolutions' per-channel "
                        f"gain: {_names(architectures.WS_GAINS)} (trained "
                        "from 1, NF-ResNet's; frozen: kept at 1; default "
                        "trained).")
  branch_init: str = _field(None, f"How C1 and C2 are drawn: "
                            f"{_names(architectures.BRANCH_INITS)} (paper: "
                            "std 1/(k^2 c); standard: 1/(k sqrt(c)); fan_in: "
                            "N(0, 1/fan_in), NF-ResNet's; default: as "
                            "--init).")
  branch_init_scale: float = _field(
      None, "C1 and C2's std times this (default 1). Under "
      "--weight_standardization the function is the same and a step turns "
      "the kernels this squared times slower.")
  projection_scale: str = _field(
      None, "Variance of the random projection's entries: classes "
      "(1/classes, the default) or features (1/d).")
  logit_scale: float = _field(
      None, "Multiplier of the random projection's entries: a fixed scale "
      "of the logits (default 1).")
  # The data: any TFDS image-classification dataset, or "synthetic".
  dataset: str = _field("cifar10", "Dataset: synthetic (built in) or any TFDS "
                        "image-classification dataset, e.g. cifar10, "
                        "fashion_mnist.")
  num_train_examples: int = _field(None, "Train on the first N examples of "
                                   "the split only (default: all).")
  num_eval_examples: int = _field(None, "Evaluate on the first N examples "
                                  "only (default: all).")
  validation_examples: int = _field(
      0, "Hold out N training images, chosen by a fixed seed (the same for "
      "every run and --seed) and never trained on; the evaluations during "
      "training (--eval_steps) score them, and the evaluation split is read "
      "only at the end (--eval_at_end). 0: off, all are trained on.")
  flip: bool = _field(None, "Random horizontal flips (default: on, except "
                      "for digit and character datasets).")
  standardize: str = _field(
      None, f"Input normalisation: {_names(datasets.STANDARDIZATIONS)} "
      "(per_image: each image to zero mean and unit variance; per_channel: "
      "(x - mean) / std per RGB channel, for small fixed-size images the "
      "mean and std of the run's training examples, computed once when the "
      "run starts and kept in config.json, for larger ones ImageNet's; "
      "default: the dataset's, per_image for CIFAR-sized images).")
  # The optimiser: SGD with momentum; global (all-replica) batch.
  batch_size: int = _field(128, "Global batch size (all replicas together).")
  train_steps: int = _field(70000, "Total SGD steps (the run stops at this "
                            "global step).")
  learning_rate: float = _field(0.05, "Initial learning rate.")
  lr_schedule: str = _field("piecewise", f"Learning-rate schedule: "
                            f"{_names(SCHEDULES)}.")
  lr_boundaries: tuple = _field((30000, 50000), "piecewise: steps at which "
                                "the rate is multiplied by --lr_decay_factor, "
                                "comma-separated.")
  lr_decay_factor: float = _field(0.1, "Factor per boundary (piecewise) or "
                                  "per period (exponential).")
  lr_decay_epochs: float = _field(2.0, "exponential: decay period in epochs.")
  momentum: float = _field(0.9, "SGD momentum.")
  nesterov: bool = _field(False, "Nesterov's momentum.")
  weight_decay: float = _field(1e-4, "L2 weight decay (of the weights "
                               "--weight_decay_scope names).")
  weight_decay_scope: str = _field(
      "convolutions", f"Weights decayed: {_names(WEIGHT_DECAY_SCOPES)} "
      "(convolutions: the paper's; kernels: every kernel, the classifier's "
      "too, no bias or gain (NFNets); all: every trained weight (Fixup's "
      "code)).")
  bias_lr_factor: float = _field(
      1.0, "Learning-rate factor of the biases and scalar weights (Fixup's "
      "authors train them at 0.1).")
  label_smoothing: float = _field(
      0.0, "Label smoothing of the training loss (0: off); evaluations "
      "report the plain cross-entropy.")
  mixup_alpha: float = _field(
      0.0, "mixup (Zhang et al., 2018): every training batch mixed with a "
      "permutation of itself, images and loss alike, by one weight drawn "
      "from Beta(alpha, alpha) per batch (0: off; Fixup's CIFAR code: 1); "
      "the progress lines' loss and top-1 are the mixed batch's.")
  ema_decay: float = _field(
      0.0, "Evaluate and export an exponential moving average of the "
      "trained weights, updated after every step with this decay (e.g. "
      "0.999; 0: off); the progress lines' training loss and top-1 stay "
      "the weights' own.")
  # Stabilisers, all off (0) in the paper's text: linear warm-up of the
  # learning rate over the first steps, clipping of the global gradient norm
  # (Pascanu et al., 2013), adaptive gradient clipping (Brock et al., 2021).
  warmup_steps: int = _field(0, "Linear learning-rate warm-up over the first "
                             "N steps (0: off).")
  grad_clip_norm: float = _field(0.0, "Clip the global gradient norm to this "
                                 "(0: off).")
  grad_clip_steps: int = _field(0, "Clip the global gradient norm during "
                                "the first N steps only (0: throughout).")
  agc_clip: float = _field(0.0, "Adaptive gradient clipping threshold lambda "
                           "(NFNets' unit-wise rule, the final layer "
                           "unclipped; 0: off).")
  # Bookkeeping.
  checkpoint_steps: int = _field(1000, "Write a checkpoint every N steps.")
  keep_checkpoints: int = _field(5, "Keep the last N checkpoints.")
  log_steps: int = _field(100, "Progress line and TensorBoard scalars every "
                          "N steps.")
  steps_per_loop: int = _field(100, "Most steps per tf.function call (TPUs "
                               "want many); a run on one machine runs fewer "
                               "when they would take over 10 s, so that "
                               "SIGTERM is honoured in time.")
  eval_steps: int = _field(0, "Evaluate on the evaluation split every N "
                           "steps (0: only at the end).")
  eval_at_end: bool = _field(True, "Evaluate on the evaluation split when "
                             "training ends.")
  eval_batch_size: int = _field(500, "Batch size of the evaluation.")
  eval_train_at_end: bool = _field(
      False, "At the end, also evaluate on the whole training split (no "
      "augmentation): the training loss and top-1 that tell an "
      "optimisation gap from a generalisation gap.")
  # Distribution and reproducibility.
  strategy: str = _field("default", f"tf.distribute strategy: "
                         f"{_names(STRATEGIES)}.")
  deterministic: bool = _field(False, "Deterministic ops and input: "
                               "bit-identical reruns and resumes on CPU.")
  # Speed. Mixed precision computes the convolutions in 16 bits and keeps
  # the weights, the frozen projection, the logits and the loss in float32.
  precision: str = _field(
      "float32", f"Compute precision: {_names(PRECISIONS)}. "
      "mixed_bfloat16 suits CPUs with AVX512-BF16 or AMX and TPUs; "
      "mixed_float16 suits GPUs and adds Keras's dynamic loss scaling. The "
      "weights, the logits and the loss stay float32 (BENCHMARKS.md).")
  float32_stream: bool = _field(
      False, "Under mixed precision, add each residual branch (computed in "
      "16 bits) to a float32 stream: a branch far smaller than its input, as "
      "the paper's initialisation makes them, is then not rounded away.")
  jit_compile: bool = _field(False, "Compile the train step's forward and "
                             "backward pass with XLA (GPUs and TPUs; slower "
                             "on CPU, BENCHMARKS.md).")


# Section 4.1, the same for CIFAR-10 and CIFAR-100, as the text states it.
# train_steps is ours: the paper's model "reaches peak performance at around
# 50k steps"; 70k leaves 20k at the final rate. The network's initialisation
# (std 1/(k^2 c)) and frozen random projection are the cifar10/cifar100
# models' defaults.
_CIFAR10_LITERAL = Config(
    preset="cifar10_paper_literal", model="cifar10", dataset="cifar10",
    batch_size=128, learning_rate=0.05, lr_schedule="piecewise",
    lr_boundaries=(30000, 50000), lr_decay_factor=0.1, momentum=0.9,
    weight_decay=1e-4, train_steps=70000, checkpoint_steps=1000)

# Section 4.2 as the text states it. The run was asynchronous;
# `--strategy=parameter_server` reproduces that on a cluster (the preset
# defaults to one machine). train_steps (about 40 epochs of 1,281,167
# images) and weight_decay are ours: the paper does not state them.
_IMAGENET_LITERAL = Config(
    preset="imagenet_paper_literal", model="imagenet", dataset="imagenet2012",
    batch_size=256, learning_rate=0.1, lr_schedule="exponential",
    lr_boundaries=(), lr_decay_factor=0.94, lr_decay_epochs=2.0,
    momentum=0.9, weight_decay=1e-4, train_steps=200000,
    checkpoint_steps=2000, eval_batch_size=250)

# The paper's recipe diverges on real images within a few hundred steps
# (docs/results.md: Fashion-MNIST, at the study's width and at full width).
# The presets that train add the smallest stabiliser that trained in the
# study: the global gradient norm clipped to 1 (ours, not the paper's), one
# scalar of the optimiser. Every other value is the paper's.
STABILISER = dict(grad_clip_norm=1.0)

# The normalisation-free methods that came after the paper, each in its own
# authors' recipe on Table 1's widths and depths (the networks:
# `identity_tf.peers`). CIFAR-10's epoch is 391 steps of 128.
_CIFAR_EPOCH = 391

# Zhang, Dauphin & Ma (2019), "Fixup initialization", and the authors' CIFAR
# code (hongyi-zhang/Fixup, cifar/cifar_train.py): SGD with momentum 0.9 at
# 0.1 for a batch of 128, divided by 10 at epochs 100 and 150 of 200; the
# scalar biases and multipliers at a tenth of the rate; PyTorch's weight
# decay 1e-4 on every parameter; no clipping. Their default mixup (alpha 1)
# is a regulariser for that 200-epoch budget; it is left out here and is the
# normfree study's `fixup_mixup`.
_FIXUP = Config(
    preset="fixup_cifar", model="fixup", dataset="cifar10", batch_size=128,
    learning_rate=0.1, lr_schedule="piecewise",
    lr_boundaries=(100 * _CIFAR_EPOCH, 150 * _CIFAR_EPOCH),
    lr_decay_factor=0.1, momentum=0.9, weight_decay=1e-4,
    weight_decay_scope="all", bias_lr_factor=0.1,
    train_steps=200 * _CIFAR_EPOCH, checkpoint_steps=1000)

# De & Smith (2020), "Batch normalization biases residual blocks towards the
# identity function in deep networks": SkipInit replaces batch norm in a
# network trained as before. The authors publish no CIFAR recipe of their
# own, so this is the batch-norm baseline's recipe (the paper's, unclipped)
# with SkipInit's network, and named so.
_SKIPINIT = dataclasses.replace(
    _CIFAR10_LITERAL, preset="skipinit_bn_recipe", model="skipinit")

# Brock, De & Smith (2021), "Characterizing signal propagation to close the
# performance gap in unnormalized ResNets", Section 5 and Appendix: SGD with
# Nesterov momentum 0.9, learning rate 0.1 per 256 examples, cosine decay
# after a 5-epoch linear warm-up, 90 epochs, weight decay 5e-5 on the
# weights but not the gains and biases; no gradient clipping. Adaptive
# gradient clipping came after, with NFNets (Brock et al., 2021b), for
# batches of 1024 and more: at 128 every lambda the `nf_agc` study tried
# (0.01-0.16) trains more slowly than none (docs/results.md).
_NF_RESNET = Config(
    preset="nf_resnet_cifar", model="nf_resnet", dataset="cifar10",
    batch_size=128, learning_rate=0.05, lr_schedule="cosine",
    lr_boundaries=(), warmup_steps=5 * _CIFAR_EPOCH, momentum=0.9,
    nesterov=True, weight_decay=5e-5, weight_decay_scope="kernels",
    train_steps=90 * _CIFAR_EPOCH,
    checkpoint_steps=1000)

# Ours: the paper's unit and frozen random projection with the changes that
# brought it level with batch norm in the same schedule on Fashion-MNIST
# (docs/results.md). On top of cifar10_paper (its
# network, rate, batch, weight decay and clip):
#   * C1 and C2 scaled-weight-standardised with a trained per-output-channel
#     gain (NF-ResNet's convolutions: Brock, De & Smith, 2021, Section 4.2),
#   * a trained scalar gain from 0 on every branch (SkipInit: De & Smith,
#     2020), so that every unit starts as exactly its shortcut,
#   * C1 and C2 drawn at twice the paper's std, 2/(k^2 c): under the
#     standardisation the same function, steps turning the kernels 4 times
#     slower, which keeps full width from diverging,
#   * the frozen projection's entries times 4 (a fixed scale of the logits),
#   * NF-ResNet's schedule: Nesterov momentum and cosine decay to 0.
# The `ablation` study removes each of these in turn.
_CIFAR10_WS = dataclasses.replace(
    _CIFAR10_LITERAL, preset="cifar10_ws", **STABILISER,
    branch_gain="zero", weight_standardization=True, ws_gain="trained",
    branch_init="paper", branch_init_scale=2.0, logit_scale=4.0, lr_schedule="cosine",
    lr_boundaries=(), nesterov=True)
# Its batch-norm twin: the batch-norm baseline (`resnet_bn`: pre-activation
# units, a trained head, kernels at 1/(k sqrt(c))) in the same recipe --
# schedule and clip alike -- so that the two differ in their network only.
_CIFAR10_WS_BN = dataclasses.replace(
    _CIFAR10_LITERAL, preset="cifar10_ws_bn", model="resnet_bn",
    **STABILISER, lr_schedule="cosine", lr_boundaries=(), nesterov=True)

PRESETS = {
    "cifar10_ws": _CIFAR10_WS,
    "cifar10_ws_bn": _CIFAR10_WS_BN,
    "cifar10_paper": dataclasses.replace(
        _CIFAR10_LITERAL, preset="cifar10_paper", **STABILISER),
    "cifar100_paper": dataclasses.replace(
        _CIFAR10_LITERAL, preset="cifar100_paper", model="cifar100",
        dataset="cifar100", **STABILISER),
    "imagenet_paper": dataclasses.replace(
        _IMAGENET_LITERAL, preset="imagenet_paper", **STABILISER),
    "cifar10_paper_literal": _CIFAR10_LITERAL,
    "cifar100_paper_literal": dataclasses.replace(
        _CIFAR10_LITERAL, preset="cifar100_paper_literal", model="cifar100",
        dataset="cifar100"),
    "imagenet_paper_literal": _IMAGENET_LITERAL,
    # Ours (README.md has the measured time). A constant rate: the run is too short for a schedule;
    # 0.01 because without normalisation this shallow, narrow net diverges
    # at 0.02 and above within a few hundred steps.
    "smoke": Config(
        preset="smoke", model="cifar10", dataset="synthetic", width=0.25,
        units=(1,), batch_size=64, learning_rate=0.01,
        lr_schedule="constant", lr_boundaries=(), momentum=0.9,
        weight_decay=1e-4, train_steps=500, checkpoint_steps=100,
        log_steps=50, steps_per_loop=50, keep_checkpoints=3,
        eval_batch_size=500, num_eval_examples=None),
    "fixup_cifar": _FIXUP,
    "skipinit_bn_recipe": _SKIPINIT,
    "nf_resnet_cifar": _NF_RESNET,
}

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}

# //bin:train's --help: one heading per group of Config fields, in this
# order (every field but `preset`, each once: tests/reliability_test.py).
FLAG_GROUPS = (
    ("the network", ("model", "width", "units", "stem_channels", "init",
                     "head", "norm", "use_bias", "seed",
                     *architectures.BRANCH_FIELDS, "projection_scale",
                     "logit_scale")),
    ("the data", ("dataset", "num_train_examples", "num_eval_examples",
                  "validation_examples", "flip", "standardize")),
    ("the optimiser", ("batch_size", "train_steps", "learning_rate",
                       "lr_schedule", "lr_boundaries", "lr_decay_factor",
                       "lr_decay_epochs", "momentum", "nesterov",
                       "weight_decay", "weight_decay_scope",
                       "bias_lr_factor", "label_smoothing", "mixup_alpha",
                       "ema_decay")),
    ("stabilisers", ("warmup_steps", "grad_clip_norm", "grad_clip_steps",
                     "agc_clip")),
    ("checkpoints, progress and evaluation", (
        "checkpoint_steps", "keep_checkpoints", "log_steps",
        "steps_per_loop", "eval_steps", "eval_at_end", "eval_batch_size",
        "eval_train_at_end")),
    ("distribution, precision and speed", (
        "strategy", "deterministic", "precision", "float32_stream",
        "jit_compile")),
)


def _positive(config, name):
  value = getattr(config, name)
  if value is None or not value > 0:  # NaN is not > 0 either.
    raise errors.ConfigError(f"--{name} must be positive, got {value}")


def _non_negative(config, name):
  value = getattr(config, name)
  if value is None or not value >= 0:
    raise errors.ConfigError(f"--{name} must be >= 0 (0: off), got {value}")


def branch_options(config):
  """CONFIG's options of the residual branch (`architectures.BRANCH_FIELDS`),
  as `architectures.complete_options` takes them."""
  return {name: getattr(config, name) for name in architectures.BRANCH_FIELDS}


def _validate_numbers(config):
  """ConfigError if a number in CONFIG is not finite, beyond float32's
  range or beyond int32."""
  # Infinities pass every bound below (and would be written to config.json
  # as the non-JSON Infinity); NaN fails them with a less useful line. And
  # every number the run computes with becomes a float32 (or 16-bit)
  # tensor: one beyond float32's range is infinite there.
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if isinstance(value, float) and not math.isfinite(value):
      raise errors.ConfigError(
          f"--{field.name} must be a finite number, got {value}")
    if isinstance(value, float) and abs(value) > FLOAT32_MAX:
      raise errors.ConfigError(
          f"--{field.name}={value:g} is beyond float32's range "
          f"({FLOAT32_MAX:.3g}), which the run computes in; lower it")
  # The seed reaches NumPy's generator (keras.utils.set_random_seed), which
  # takes 32-bit seeds only: refused here, naming the flag, before
  # TensorFlow loads.
  if not 0 <= config.seed < 2**32:
    raise errors.ConfigError(f"--seed={config.seed}: must be between 0 and "
                             "2**32 - 1")
  # Every other integer (steps, batch sizes, example counts, units, the
  # learning-rate boundaries) reaches TensorFlow as int32 (shapes, loop
  # counts) and the run's arithmetic (schedules, the ETA as a timedelta):
  # one beyond int32 is no run any machine carries out, refused here and
  # not as an OverflowError once the run has started.
  largest = 2**31 - 1
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    numbers = value if isinstance(value, tuple) else (value,)
    if field.name != "seed" and any(
        isinstance(n, int) and not isinstance(n, bool) and abs(n) > largest
        for n in numbers):
      shown = (",".join(map(str, value)) if isinstance(value, tuple)
               else value)
      raise errors.ConfigError(
          f"--{field.name}={shown} is beyond {largest} (2**31 - 1), the "
          "largest integer a run takes; lower it")


def validate(config):
  """ValueError (one line naming the flag and the fix) if CONFIG is bad."""
  _validate_numbers(config)
  def one_of(name, valid, optional=False):
    value = getattr(config, name)
    if value not in valid and not (optional and value is None):
      raise errors.ConfigError(f"--{name} must be one of {', '.join(valid)}; "
                               f"got {value!r}")
  # The network's options have one validator, the architecture table's.
  architectures.complete_options(
      config.model, width=config.width, units=config.units,
      stem_channels=config.stem_channels, init=config.init,
      head=config.head, norm=config.norm, use_bias=config.use_bias,
      seed=config.seed, **branch_options(config),
      projection_scale=config.projection_scale,
      logit_scale=config.logit_scale)
  one_of("standardize", datasets.STANDARDIZATIONS, optional=True)
  one_of("lr_schedule", SCHEDULES)
  one_of("weight_decay_scope", WEIGHT_DECAY_SCOPES)
  one_of("strategy", STRATEGIES)
  one_of("precision", PRECISIONS)
  # Which datasets exist is TFDS's to say (when the run starts); here only
  # the form of a TFDS name, e.g. fashion_mnist or emnist/letters.
  if not (isinstance(config.dataset, str) and config.dataset and
          all(c.isalnum() or c in "_/.:-" for c in config.dataset)):
    raise errors.ConfigError(
        f"--dataset must be synthetic or a TFDS dataset name "
        f"such as cifar10 or fashion_mnist; got "
        f"{config.dataset!r}")
  for name in ("batch_size", "train_steps", "learning_rate",
               "checkpoint_steps", "keep_checkpoints", "log_steps",
               "steps_per_loop", "eval_batch_size", "lr_decay_factor",
               "lr_decay_epochs", "bias_lr_factor"):
    _positive(config, name)
  for name in ("num_train_examples", "num_eval_examples"):
    if getattr(config, name) is not None:
      _positive(config, name)
  for name in ("warmup_steps", "grad_clip_norm", "grad_clip_steps",
               "agc_clip", "eval_steps", "mixup_alpha",
               "validation_examples"):
    _non_negative(config, name)
  if not 0 <= config.ema_decay < 1:
    raise errors.ConfigError(f"--ema_decay must be in [0, 1) (0: off), got "
                             f"{config.ema_decay}")
  if not 0 <= config.label_smoothing < 1:
    raise errors.ConfigError(f"--label_smoothing must be in [0, 1), got "
                             f"{config.label_smoothing}")
  if config.warmup_steps >= config.train_steps:
    raise errors.ConfigError(
        f"--warmup_steps={config.warmup_steps} must be below "
        f"--train_steps={config.train_steps}: lower it")
  if not 0 <= config.momentum < 1:
    raise errors.ConfigError(
        f"--momentum must be in [0, 1), got {config.momentum}")
  _non_negative(config, "weight_decay")
  boundaries = list(config.lr_boundaries)
  if any(b <= 0 for b in boundaries) or boundaries != sorted(set(boundaries)):
    raise errors.ConfigError(
        f"--lr_boundaries must be increasing positive steps, "
        f"got {boundaries}")
  _check_peak_rate(config)


def _check_peak_rate(config):
  """ConfigError if the largest rate CONFIG's schedule reaches -- the
  learning rate times --bias_lr_factor, times --lr_decay_factor at each
  piecewise boundary where it is above 1 -- is not a finite float32."""
  peak = config.learning_rate * max(1.0, config.bias_lr_factor)
  if config.lr_schedule == "piecewise" and config.lr_decay_factor > 1:
    peak *= config.lr_decay_factor ** len(config.lr_boundaries)
  if not math.isfinite(peak) or peak > FLOAT32_MAX:
    raise errors.ConfigError(
        f"--learning_rate={config.learning_rate:g} with "
        f"--bias_lr_factor={config.bias_lr_factor:g} and "
        f"--lr_decay_factor={config.lr_decay_factor:g} reaches a rate beyond "
        f"float32's range ({FLOAT32_MAX:.3g}); lower them")


def parse_integers(name, value):
  """"1,2" or ["1", "2"] (a flag's value) -> (1, 2); ValueError naming NAME."""
  if isinstance(value, str):
    value = [v for v in value.replace(" ", "").split(",") if v]
  try:
    return tuple(int(v) for v in value)
  except (TypeError, ValueError):
    raise errors.ConfigError(f"--{name} must be comma-separated integers, "
                             f"got {value!r}") from None


def parse_numbers(values, kind, flag, example):
  """A list flag's strings (or numbers) as KIND (int or float); ConfigError
  naming --FLAG, with EXAMPLE (e.g. "2,4,8") of what it takes."""
  try:
    return [kind(str(v)) for v in values]
  except (TypeError, ValueError):
    raise errors.ConfigError(
        f"--{flag} must be a comma-separated list of "
        f"{'integers' if kind is int else 'numbers'}, e.g. --{flag}={example}"
        f"; got {','.join(map(str, values))}") from None


def _coerce(name, value):
  """Converts a flag value to the type of the Config field NAME."""
  if name in ("units", "lr_boundaries"):
    return parse_integers(name, value)
  return value


def from_preset(preset, **overrides):
  """PRESETS[preset] with OVERRIDES (None values ignored), validated."""
  if preset not in PRESETS:
    raise errors.ConfigError(f"unknown --preset {preset!r}; valid: "
                             f"{', '.join(PRESETS)}")
  return override(PRESETS[preset], **overrides)


def override(config, **overrides):
  """CONFIG with OVERRIDES (None values ignored), validated."""
  unknown = sorted(set(overrides) - set(_FIELDS))
  if unknown:
    raise errors.ConfigError(
        f"unknown configuration field(s): {', '.join(unknown)}")
  changes = {name: _coerce(name, value) for name, value in overrides.items()
             if value is not None}
  config = dataclasses.replace(config, **changes)
  validate(config)
  return config


def to_dict(config):
  """A JSON-serialisable dict of CONFIG (tuples become lists)."""
  return {name: list(value) if isinstance(value, tuple) else value
          for name, value in dataclasses.asdict(config).items()}


def from_dict(values):
  """The Config stored by `to_dict` (extra keys, e.g. derived ones, ignored).
  An earlier version's names (`LEGACY_FIELDS`, `residual` values that named
  combinations) are read as today's options."""
  values = architectures.translate_legacy(values)
  known = {name: _coerce(name, value) if value is not None else None
           for name, value in values.items() if name in _FIELDS}
  return Config(**known)

