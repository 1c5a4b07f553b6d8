"""Training presets as code: one frozen `Config` per preset.

Every hyper-parameter of a run lives in one `Config` (the spirit of the 2016
tensorflow/models resnet's single `HParams` tuple and big_vision's configs as
code). `PRESETS` holds the paper's runs and a smoke run, `STUDIES` the grids
of //bin:study; `from_preset` applies overrides (the training binary's
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
MODEL_FIELDS = ("model", "dataset", "width", "units", "init", "head", "norm",
                "use_bias", "seed", "residual", "projection_scale",
                "logit_scale", "ws_init_scale")
# The fields that change how a run is carried out, logged or evaluated but
# not what it learns: a study (`training.study`) accepts a run that differs
# from its arm's in these alone, and refuses one that differs in any other.
BOOKKEEPING_FIELDS = ("preset", "checkpoint_steps", "keep_checkpoints",
                      "log_steps", "steps_per_loop", "eval_steps",
                      "eval_at_end", "eval_batch_size", "eval_train_at_end",
                      "strategy", "deterministic", "jit_compile")


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
  residual: str = _field(None, f"Residual branch of the paper's unit: "
                         f"{_names(architectures.RESIDUALS)} (skipinit: a "
                         "trained scalar gain from 0; gain: from 1; fixup: "
                         "Fixup's scalars and initialisation; skipinit_ws: "
                         "skipinit with C1 and C2 scaled-weight-"
                         "standardised, NF-ResNet's convolutions; "
                         "skipinit_ws_small: the same with C1 and C2 drawn "
                         "at the paper's scale; default plain).")
  projection_scale: str = _field(
      None, "Variance of the random projection's entries: classes "
      "(1/classes, the default) or features (1/d).")
  logit_scale: float = _field(
      None, "Multiplier of the random projection's entries: a fixed scale "
      "of the logits (default 1).")
  ws_init_scale: float = _field(
      None, "--residual=skipinit_ws_small draws C1 and C2 at this times the "
      "paper's std 1/(k^2 c): the same function, steps turning them this "
      "squared times slower (default 1).")
  # The data: any TFDS image-classification dataset, or "synthetic".
  dataset: str = _field("cifar10", "Dataset: synthetic (built in) or any TFDS "
                        "image-classification dataset, e.g. cifar10, "
                        "fashion_mnist.")
  num_train_examples: int = _field(None, "Train on the first N examples of "
                                   "the split only (default: all).")
  num_eval_examples: int = _field(None, "Evaluate on the first N examples "
                                  "only (default: all).")
  flip: bool = _field(None, "Random horizontal flips (default: on, except "
                      "for digit and character datasets).")
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
# network trained as before, so it takes the batch-norm baseline's recipe
# (the paper's, unclipped).
_SKIPINIT = dataclasses.replace(
    _CIFAR10_LITERAL, preset="skipinit_cifar", model="skipinit")

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

PRESETS = {
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
    "skipinit_cifar": _SKIPINIT,
    "nf_resnet_cifar": _NF_RESNET,
}

_FIELDS = {f.name: f for f in dataclasses.fields(Config)}

# //bin:train's --help: one heading per group of Config fields, in this
# order (every field but `preset`, each once: tests/reliability_test.py).
FLAG_GROUPS = (
    ("the network", ("model", "width", "units", "init", "head", "norm",
                     "use_bias", "seed", "residual", "projection_scale",
                     "logit_scale", "ws_init_scale")),
    ("the data", ("dataset", "num_train_examples", "num_eval_examples",
                  "flip")),
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


@dataclasses.dataclass(frozen=True)
class Arm:
  """One configuration of a study: a preset with overrides, run per seed."""
  name: str
  preset: str
  overrides: tuple = ()        # (Config field, value) pairs.
  seeds: tuple = (0,)
  description: str = ""


@dataclasses.dataclass(frozen=True)
class Study:
  """A grid of configurations x seeds that //bin:study runs on one dataset.

  The study's budget (epochs), dataset and width are the binary's flags;
  the presets' learning-rate boundaries are scaled to the budget.
  """
  name: str
  description: str
  arms: tuple


_LITERAL = "cifar10_paper_literal"
# The arms that clip take the presets' own stabiliser, so that the `clip`
# arm stays what cifar10_paper adds to the literal recipe.
_CLIP = tuple(STABILISER.items())
_WARMUP = (("warmup_steps", 1000),)
_COSINE = (("lr_schedule", "cosine"), ("lr_boundaries", ()),
           ("nesterov", True))
# What paper_ws_small changes in cifar10_paper: the gap study's closest
# configuration to batch norm at width 0.25, which diverges at full width.
_WS_SMALL = _COSINE + (("logit_scale", 4.0),
                       ("residual", "skipinit_ws_small"))
# What paper_best changes: the same with C1 and C2 drawn at twice the
# paper's std, which trains at every width measured (docs/results.md).
_PAPER_BEST = _WS_SMALL + (("ws_init_scale", 2.0),)

STUDIES = {
    # Why the paper's recipe diverges on real images and what stops it
    # (docs/results.md).
    "stabilisers": Study(
        "stabilisers",
        "The paper's CIFAR recipe as written, each stabiliser alone (the "
        "one the cifar10_paper preset adds for three seeds), a looser clip, "
        "two pairs, and the batch-norm baseline.",
        arms=(
            Arm("literal", _LITERAL,
                description="Section 4.1 as written"),
            Arm("clip", _LITERAL, _CLIP,
                seeds=(0, 1, 2),
                description="global gradient norm clipped to 1: the "
                            "cifar10_paper preset"),
            # The next three are adaptations to the paper's network and
            # recipe (its frozen projection, rate and initialisation), not
            # the methods as their authors ran them: those are the
            # `normfree` study's arms.
            Arm("literal+agc", _LITERAL, (("agc_clip", 0.01),),
                description="adaptive gradient clipping, lambda = 0.01"),
            Arm("warmup", _LITERAL, _WARMUP,
                description="linear warm-up over 1000 steps"),
            Arm("projection_1/d", _LITERAL,
                (("projection_scale", "features"),),
                description="projection entries N(0, 1/d)"),
            Arm("literal+skipinit_gain", _LITERAL,
                (("residual", "skipinit"),),
                description="a zero-initialised gain on every branch"),
            Arm("literal+fixup_scalars", _LITERAL, (("residual", "fixup"),),
                description="Fixup's initialisation, scalar biases and "
                            "multipliers"),
            # A bound of 1 stays active after the early growth of the
            # gradient (its norm is still about 3 at the end of the rate-0.05
            # phase, docs/results.md): a looser bound tests whether that
            # costs accuracy (it does not: 90.88 % against 90.96 %).
            Arm("clip_5", _LITERAL, (("grad_clip_norm", 5.0),),
                description="global gradient norm clipped to 5"),
            Arm("clip+projection_1/d", _LITERAL,
                _CLIP + (("projection_scale", "features"),),
                description="the two together"),
            # The two stabilisers that trained best alone: whether bounding
            # the first steps harder closes clip's gap to batch norm.
            Arm("clip+warmup", _LITERAL, _CLIP + _WARMUP,
                description="clipped to 1 and warmed up over 1000 steps"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                seeds=(0, 1, 2),
                description="the batch-norm baseline, the paper's recipe"),
        )),
    # Whether 16-bit compute costs the identity parametrisation accuracy
    # (docs/results.md): the preset and the batch-norm baseline in float32
    # (the stabilisers study's arms of the same name) and in bfloat16.
    "precision": Study(
        "precision",
        "cifar10_paper (clipped) and the batch-norm baseline, each in "
        "float32 and in mixed_bfloat16.",
        arms=(
            Arm("clip", _LITERAL, _CLIP, seeds=(0, 1, 2),
                description="cifar10_paper, float32"),
            Arm("clip_bf16", _LITERAL,
                _CLIP + (("precision", "mixed_bfloat16"),), seeds=(0, 1, 2),
                description="cifar10_paper, mixed_bfloat16"),
            # The branches the paper's initialisation makes small are partly
            # rounded away in a bfloat16 sum (BENCHMARKS.md, bf16_identity):
            # whether adding them in float32 matters.
            Arm("clip_bf16_stream", _LITERAL,
                _CLIP + (("precision", "mixed_bfloat16"),
                         ("float32_stream", True)), seeds=(0,),
                description="cifar10_paper, mixed_bfloat16, float32 "
                            "residual stream"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                seeds=(0, 1, 2), description="batch norm, float32"),
            Arm("resnet_bn_bf16", _LITERAL,
                (("model", "resnet_bn"), ("precision", "mixed_bfloat16")),
                seeds=(0, 1, 2), description="batch norm, mixed_bfloat16"),
        )),
    # Whether identity-parametrised networks can do without batch norm:
    # the peers in their own recipes, the paper's network and the best
    # configuration of it found by the `gap` study, and batch norm.
    "normfree": Study(
        "normfree",
        "The normalisation-free methods in their authors' recipes, the "
        "paper's network (clipped) and batch norm, on Table 1's widths and "
        "depths, under one budget and augmentation.",
        arms=(
            Arm("fixup", "fixup_cifar", seeds=(0, 1, 2),
                description="Fixup (Zhang et al., 2019), its authors' CIFAR "
                            "recipe"),
            # On Fashion-MNIST that recipe takes one step of gradient norm
            # over 100 when the loss first falls (step 70-80 at width
            # 0.125), every weight grows 10-20 fold and the last stage's
            # ReLUs die (docs/results.md): the smallest remedy, a warm-up.
            Arm("fixup_warmup", "fixup_cifar", (("warmup_steps", 469),),
                seeds=(0, 1, 2),
                description="Fixup's recipe with the rate warmed up over "
                            "469 steps (an epoch of Fashion-MNIST)"),
            # The authors' cifar_train.py mixes every batch by default
            # (alpha 1): their recipe in full.
            Arm("fixup_mixup", "fixup_cifar", (("mixup_alpha", 1.0),),
                seeds=(0, 1, 2),
                description="Fixup's recipe with its code's default mixup "
                            "(alpha 1)"),
            Arm("skipinit", "skipinit_cifar",
                description="SkipInit (De & Smith, 2020): batch norm's "
                            "recipe, a zero gain per branch"),
            Arm("skipinit_warmup", "skipinit_cifar",
                (("warmup_steps", 469),), seeds=(0, 1, 2),
                description="SkipInit with the rate warmed up over 469 "
                            "steps"),
            Arm("nf_resnet", "nf_resnet_cifar", seeds=(0, 1, 2),
                description="NF-ResNet (Brock et al., 2021), its authors' "
                            "recipe"),
            Arm("nf_resnet_agc_0.04", "nf_resnet_cifar",
                (("agc_clip", 0.04),),
                description="NF-ResNet with NFNets' adaptive gradient "
                            "clipping, lambda 0.04"),
            Arm("paper", "cifar10_paper", seeds=(0, 1, 2),
                description="the paper's network, clipped (cifar10_paper)"),
            # The best configuration that trains at every width measured
            # (widths 0.25 and 1.0, docs/results.md): the paper's unit and
            # frozen projection, C1 and C2 scaled-weight-standardised and
            # drawn at twice the paper's std, a branch gain from 0,
            # NF-ResNet's schedule, the projection's entries times 4, the
            # clip kept. The same runs as the gap study's
            # `nesterov_cosine+logit_scale_4+skipinit_ws_small+ws_init_2`;
            # its batch norm is `resnet_bn_cosine`, the same schedule.
            Arm("paper_best", "cifar10_paper", _PAPER_BEST,
                seeds=(0, 1, 2),
                description="the paper's network, clipped, C1 and C2 "
                            "scaled-weight-standardised and drawn at std "
                            "2/(k^2 c), a branch gain from 0, Nesterov "
                            "momentum, cosine decay, the projection's "
                            "entries times 4"),
            # The same drawn at the paper's std: the closest to batch norm
            # at width 0.25, but its kernels, smaller at full width, turn
            # too fast there and it diverges within 50 steps. The gap
            # study's `nesterov_cosine+logit_scale_4+skipinit_ws_small`.
            # Named paper_best until it was run at full width.
            Arm("paper_ws_small", "cifar10_paper", _WS_SMALL,
                seeds=(0, 1, 2),
                description="the paper's network, clipped, C1 and C2 "
                            "scaled-weight-standardised and drawn at std "
                            "1/(k^2 c), a branch gain from 0, Nesterov "
                            "momentum, cosine decay, the projection's "
                            "entries times 4"),
            # The best in the paper's own recipe (the gap study's
            # `skipinit_ws`). Named paper_best until skipinit_ws_small was
            # measured.
            Arm("paper_ws", "cifar10_paper", (("residual", "skipinit_ws"),),
                seeds=(0, 1, 2),
                description="the paper's network, clipped, C1 and C2 "
                            "scaled-weight-standardised, a branch gain from "
                            "0"),
            # The best before them (the gap study's `fixup_init`): each unit
            # exactly the identity (C2 = 0) but off the saddle of the small
            # initialisation (C1 at He's scale). Named paper_best until
            # skipinit_ws was measured.
            Arm("paper_fixup_init", "cifar10_paper", (("init", "fixup"),),
                seeds=(0, 1, 2),
                description="the paper's network, clipped, C2 = 0 and C1 "
                            "He-normal x L^-1/2"),
            # The 3-epoch screen's best, not better at 10 epochs.
            Arm("paper_lr_0.1", "cifar10_paper", (("learning_rate", 0.1),),
                seeds=(0, 1, 2),
                description="the paper's network, clipped, at rate 0.1"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                seeds=(0, 1, 2),
                description="the batch-norm baseline, the paper's recipe"),
            Arm("resnet_bn_cosine", _LITERAL, (("model", "resnet_bn"),)
                + _COSINE, seeds=(0, 1, 2),
                description="the batch-norm baseline, Nesterov momentum, "
                            "cosine decay (paper_best's schedule)"),
        )),
    # Fixup's and SkipInit's own recipes (and a warm-up) lose their units
    # in the first epoch on Fashion-MNIST (docs/results.md): the largest
    # rate at which each trains, as their authors would tune it.
    "peer_rates": Study(
        "peer_rates",
        "Fixup's and SkipInit's recipes at lower learning rates.",
        arms=tuple(
            Arm(f"{peer}_lr{rate:g}", f"{peer}_cifar",
                (("learning_rate", rate),),
                description=f"{peer}'s recipe at rate {rate:g}")
            for peer, rates in (("fixup", (0.05, 0.02)),
                                ("skipinit", (0.02, 0.01)))
            for rate in rates)),
    # AGC's threshold for NF-ResNet at a batch of 128 (NFNets chose 0.01 at
    # 4096 and say smaller batches tolerate larger thresholds): none is best.
    "nf_agc": Study(
        "nf_agc",
        "NF-ResNet's recipe with AGC's lambda from 0.01 to 0.32, and "
        "without AGC.",
        arms=tuple(
            Arm(f"lambda_{value:g}", "nf_resnet_cifar",
                (("agc_clip", value),),
                description=f"AGC, lambda = {value:g}" if value else
                            "no clipping")
            for value in (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.0))),
    # What makes the paper's network -- its unit and frozen projection kept
    # -- optimise as well as batch norm: each candidate alone on top of
    # cifar10_paper, and the changes of the recipe on both networks.
    "gap": Study(
        "gap",
        "Candidates that keep the paper's unit and frozen projection, each "
        "on top of cifar10_paper; recipe changes on both networks.",
        arms=(
            Arm("paper", "cifar10_paper",
                description="cifar10_paper: the global norm clipped to 1"),
            Arm("agc_0.04", _LITERAL, (("agc_clip", 0.04),),
                description="unit-wise AGC (lambda 0.04) instead of the "
                            "global clip"),
            Arm("agc_0.16", _LITERAL, (("agc_clip", 0.16),),
                description="unit-wise AGC (lambda 0.16) instead of the "
                            "global clip"),
            Arm("gain", "cifar10_paper", (("residual", "gain"),),
                description="a trained scalar gain from 1 on every branch"),
            # The small initialisation starts every unit at a saddle (C1 and
            # C2 both near 0: each one's gradient is proportional to the
            # other); C2 = 0 keeps the identity exactly while C1 at He's
            # scale gives C2 a gradient from the first step.
            Arm("fixup_init", "cifar10_paper", (("init", "fixup"),),
                description="clipped, C2 = 0 and C1 He-normal x L^-1/2 "
                            "(Fixup's rule 2 on the paper's unit)"),
            Arm("fixup_init_unclipped", _LITERAL, (("init", "fixup"),),
                description="the same without clipping"),
            Arm("lr_0.1+fixup_init", "cifar10_paper",
                (("learning_rate", 0.1), ("init", "fixup")),
                description="clipped, rate 0.1, C2 = 0 and C1 He-normal x "
                            "L^-1/2"),
            # The best initialisation with what led the 3-epoch screen
            # besides it: whether their early lead adds to it.
            Arm("nesterov_cosine+fixup_init", "cifar10_paper",
                _COSINE + (("init", "fixup"),),
                description="clipped, Nesterov momentum, cosine decay, C2 = 0 "
                            "and C1 He-normal x L^-1/2"),
            Arm("logit_scale_4+fixup_init", "cifar10_paper",
                (("logit_scale", 4.0), ("init", "fixup")),
                description="clipped, the frozen projection's entries times "
                            "4, C2 = 0 and C1 He-normal x L^-1/2"),
            # A diagnosis, not a candidate (it gives up the paper's frozen
            # projection): how much of the gap the fixed head accounts for.
            Arm("trainable_head+fixup_init", "cifar10_paper",
                (("head", "trainable"), ("init", "fixup")),
                description="clipped, C2 = 0 and C1 He-normal x L^-1/2, "
                            "the random projection trained (from the same "
                            "start)"),
            Arm("warmup+fixup_init_unclipped", _LITERAL,
                _WARMUP + (("init", "fixup"),),
                description="unclipped, warmed up over 1000 steps, C2 = 0 "
                            "and C1 He-normal x L^-1/2"),
            Arm("clip_first_epoch", _LITERAL, _CLIP + (
                ("grad_clip_steps", 469),),
                description="clipped during the first epoch only"),
            Arm("logit_scale_4", "cifar10_paper", (("logit_scale", 4.0),),
                description="clipped, the frozen projection's entries "
                            "times 4"),
            Arm("lr_0.1", "cifar10_paper", (("learning_rate", 0.1),),
                description="clipped, at twice the rate"),
            Arm("lr_0.2", "cifar10_paper", (("learning_rate", 0.2),),
                description="clipped, at four times the rate"),
            Arm("nesterov_cosine", "cifar10_paper", _COSINE,
                description="clipped, Nesterov momentum, cosine decay"),
            Arm("resnet_bn_cosine", _LITERAL, (("model", "resnet_bn"),)
                + _COSINE,
                description="batch norm, Nesterov momentum, cosine decay"),
            Arm("label_smoothing+fixup_init", "cifar10_paper",
                (("label_smoothing", 0.1), ("init", "fixup")),
                description="clipped, C2 = 0 and C1 He-normal x L^-1/2, "
                            "labels smoothed by 0.1"),
            Arm("resnet_bn_label_smoothing", _LITERAL,
                (("model", "resnet_bn"), ("label_smoothing", 0.1)),
                description="batch norm, labels smoothed by 0.1"),
            # Weight averaging on both networks (a horizon of about two
            # epochs: 1 / (1 - 0.999) steps).
            Arm("ema+fixup_init", "cifar10_paper",
                (("ema_decay", 0.999), ("init", "fixup")),
                description="clipped, C2 = 0 and C1 He-normal x L^-1/2, "
                            "the weights' moving average (decay 0.999) "
                            "evaluated"),
            Arm("resnet_bn_ema", _LITERAL,
                (("model", "resnet_bn"), ("ema_decay", 0.999)),
                description="batch norm, the weights' moving average "
                            "(decay 0.999) evaluated"),
            # Without batch norm, weight decay only pulls the weights towards
            # zero, the branches towards the identity (with it, it also
            # raises the effective rate of the kernels a batch norm
            # follows): whether that pull is what keeps the paper's
            # training loss above batch norm's.
            Arm("no_decay+fixup_init", "cifar10_paper",
                (("weight_decay", 0.0), ("init", "fixup")),
                description="clipped, C2 = 0 and C1 He-normal x L^-1/2, "
                            "no weight decay"),
            Arm("resnet_bn_no_decay", _LITERAL,
                (("model", "resnet_bn"), ("weight_decay", 0.0)),
                description="batch norm, no weight decay"),
            # NF-ResNet, in its own recipe, reaches a training loss below
            # batch norm's at width 0.25: whether its standardised
            # convolutions do that for the paper's unit. A reparametrisation
            # of C1 and C2, the unit's function class and the frozen
            # projection kept; the branch gain from 0 keeps the identity at
            # initialisation (standardised kernels cannot be zero).
            Arm("skipinit_ws", "cifar10_paper",
                (("residual", "skipinit_ws"),),
                description="clipped, C1 and C2 scaled-weight-standardised, "
                            "a trained branch gain from 0"),
            Arm("skipinit_ws_unclipped", _LITERAL,
                (("residual", "skipinit_ws"),),
                description="the same without clipping"),
            # With every branch off and the stem at the paper's small scale
            # the logits start near 0 and skipinit_ws stays at chance for
            # its first 100 steps (batch norm's loss is 0.88 at step 100):
            # whether a larger stem or larger logits shorten that start.
            # The stem is not a residual unit: its scale is not the paper's
            # identity parametrisation.
            Arm("skipinit_ws+standard_stem", "cifar10_paper",
                (("residual", "skipinit_ws"), ("init", "standard")),
                description="clipped, C1 and C2 scaled-weight-standardised, "
                            "a trained branch gain from 0, the stem drawn "
                            "at std 1/(k sqrt(c)) instead of 1/(k^2 c)"),
            Arm("logit_scale_4+skipinit_ws", "cifar10_paper",
                (("logit_scale", 4.0), ("residual", "skipinit_ws")),
                description="clipped, C1 and C2 scaled-weight-standardised, "
                            "a trained branch gain from 0, the frozen "
                            "projection's entries times 4"),
            Arm("nesterov_cosine+skipinit_ws", "cifar10_paper",
                _COSINE + (("residual", "skipinit_ws"),),
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised, a trained "
                            "branch gain from 0"),
            # The two shorter starts of the 3-epoch screen under the
            # schedule that brought skipinit_ws closest to batch norm
            # (compare with resnet_bn_cosine).
            Arm("nesterov_cosine+logit_scale_4+skipinit_ws", "cifar10_paper",
                _COSINE + (("logit_scale", 4.0),
                           ("residual", "skipinit_ws")),
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised, a trained "
                            "branch gain from 0, the frozen projection's "
                            "entries times 4"),
            Arm("nesterov_cosine+logit_scale_4+skipinit_ws+standard_stem",
                "cifar10_paper",
                _COSINE + (("logit_scale", 4.0),
                           ("residual", "skipinit_ws"), ("init", "standard")),
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised, a trained "
                            "branch gain from 0, the frozen projection's "
                            "entries times 4, the stem drawn at std "
                            "1/(k sqrt(c)) instead of 1/(k^2 c)"),
            # The closest configuration's training loss stays above batch
            # norm's from its start (twice it over the first 500 steps)
            # while the clip bounds its steps: its largest gradient norm per
            # 100 steps is 24 at step 100 and 2-3 to the end, against the
            # bound of 1 (batch norm, never clipped: 1.3-1.5 after step
            # 500). Longer steps, two ways: no clip after a warm-up of an
            # epoch (a standardised kernel's output does not grow with the
            # kernel), or twice the rate under the clip.
            Arm("warmup+nesterov_cosine+logit_scale_4+skipinit_ws_unclipped",
                _LITERAL,
                (("warmup_steps", 469),) + _COSINE + (
                    ("logit_scale", 4.0), ("residual", "skipinit_ws")),
                description="unclipped, warmed up over 469 steps, Nesterov "
                            "momentum, cosine decay, C1 and C2 "
                            "scaled-weight-standardised, a trained branch "
                            "gain from 0, the frozen projection's entries "
                            "times 4"),
            Arm("nesterov_cosine+lr_0.1+logit_scale_4+skipinit_ws",
                "cifar10_paper",
                _COSINE + (("learning_rate", 0.1), ("logit_scale", 4.0),
                           ("residual", "skipinit_ws")),
                description="clipped, rate 0.1, Nesterov momentum, cosine "
                            "decay, C1 and C2 scaled-weight-standardised, a "
                            "trained branch gain from 0, the frozen "
                            "projection's entries times 4"),
            # Batch norm's shift is a trained bias per channel before every
            # ReLU; the paper's convolutions have none (--use_bias adds them
            # to every convolution, the stem's too). Biases from 0 keep
            # each unit the identity at initialisation and make it the
            # convolutional form of the paper's dense unit, h + V ReLU(U h +
            # b) (Section 3).
            Arm("nesterov_cosine+logit_scale_4+skipinit_ws+bias",
                "cifar10_paper",
                _COSINE + (("logit_scale", 4.0),
                           ("residual", "skipinit_ws"), ("use_bias", True)),
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised, a trained "
                            "branch gain from 0, the frozen projection's "
                            "entries times 4, every convolution with a "
                            "trained bias from 0"),
            # Every change above follows one curve after 1 000 steps. Batch
            # norm's network draws its kernels at the paper's small scale
            # and is not clipped: the kernels a batch norm follows turn
            # fast while they are small and slow down as they grow. The
            # standardised kernels drawn as small do the same; without the
            # clip (after a warm-up), as batch norm trains, or with it.
            Arm("warmup+nesterov_cosine+logit_scale_4+skipinit_ws_small"
                "_unclipped", _LITERAL,
                (("warmup_steps", 469),) + _COSINE + (
                    ("logit_scale", 4.0), ("residual", "skipinit_ws_small")),
                description="unclipped, warmed up over 469 steps, Nesterov "
                            "momentum, cosine decay, C1 and C2 "
                            "scaled-weight-standardised and drawn at std "
                            "1/(k^2 c), a trained branch gain from 0, the "
                            "frozen projection's entries times 4"),
            Arm("nesterov_cosine+logit_scale_4+skipinit_ws_small",
                "cifar10_paper", _WS_SMALL,
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised and drawn at "
                            "std 1/(k^2 c), a trained branch gain from 0, the "
                            "frozen projection's entries times 4"),
            # At full width that configuration diverges within 50 steps
            # (gradient norm 56 000, stage 3 first; docs/results.md) where
            # kernels at unit fan-in train; with the gains -- the branches'
            # and the standardised convolutions' -- at a tenth of the rate,
            # as Fixup's recipe trains its scalars, it trains there too:
            # whether it keeps the result at width 0.25.
            Arm("nesterov_cosine+logit_scale_4+skipinit_ws_small+gain_lr_0.1",
                "cifar10_paper", _WS_SMALL + (("bias_lr_factor", 0.1),),
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised and drawn at "
                            "std 1/(k^2 c), a trained branch gain from 0, the "
                            "frozen projection's entries times 4, the gains "
                            "at a tenth of the rate"),
            # Slowing the gains costs a third of a point at width 0.25 (seed
            # 0). Adaptive gradient clipping bounds instead each output
            # channel's step relative to its kernel (Brock et al., 2021b,
            # Section 4), the small kernels' steps that turn them; at full
            # width it trains with lambda 0.1 or 0.3 (docs/results.md).
            *(Arm(f"nesterov_cosine+logit_scale_4+skipinit_ws_small+agc_{lam}",
                  "cifar10_paper", _WS_SMALL + (("agc_clip", lam),),
                  description="clipped, Nesterov momentum, cosine decay, C1 "
                              "and C2 scaled-weight-standardised and drawn "
                              "at std 1/(k^2 c), a trained branch gain from "
                              "0, the frozen projection's entries times 4, "
                              f"adaptive gradient clipping at lambda {lam} "
                              "before the global clip")
              for lam in (0.1, 0.3)),
            # At width 0.25 a stage's kernels of c channels start with norm
            # 1/(3 sqrt(c)) per output channel; at full width c is 4 times
            # larger and that norm half. Drawn at twice the paper's std the
            # full-width kernels start as width 0.25's do, and train there
            # (docs/results.md); what that costs at width 0.25.
            Arm("nesterov_cosine+logit_scale_4+skipinit_ws_small+ws_init_2",
                "cifar10_paper", _PAPER_BEST,
                description="clipped, Nesterov momentum, cosine decay, C1 "
                            "and C2 scaled-weight-standardised and drawn at "
                            "std 2/(k^2 c), a trained branch gain from 0, the "
                            "frozen projection's entries times 4"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                description="the batch-norm baseline, the paper's recipe"),
        )),
    # Minutes on two cores (synthetic data): to try the binary.
    "smoke": Study(
        "smoke", "The smoke preset as it is and with its rate raised ten "
        "times, plain and clipped.",
        arms=(
            Arm("smoke", "smoke"),
            Arm("lr_x10", "smoke", (("learning_rate", 0.1),)),
            Arm("lr_x10_clip", "smoke", (("learning_rate", 0.1),
                                         ("grad_clip_norm", 1.0))),
        )),
}


def _positive(config, name):
  value = getattr(config, name)
  if value is None or not value > 0:  # NaN is not > 0 either.
    raise errors.ConfigError(f"--{name} must be positive, got {value}")


def _non_negative(config, name):
  value = getattr(config, name)
  if value is None or not value >= 0:
    raise errors.ConfigError(f"--{name} must be >= 0 (0: off), got {value}")


def validate(config):
  """ValueError (one line naming the flag and the fix) if CONFIG is bad."""
  # Infinities pass every bound below (and would be written to config.json
  # as the non-JSON Infinity); NaN fails them with a less useful line.
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if isinstance(value, float) and not math.isfinite(value):
      raise errors.ConfigError(
          f"--{field.name} must be a finite number, got {value}")
  # The seed reaches NumPy's generator (keras.utils.set_random_seed), which
  # takes 32-bit seeds only: refused here, naming the flag, before
  # TensorFlow loads.
  if not 0 <= config.seed < 2**32:
    raise errors.ConfigError(f"--seed={config.seed}: must be between 0 and "
                             "2**32 - 1")
  def one_of(name, valid, optional=False):
    value = getattr(config, name)
    if value not in valid and not (optional and value is None):
      raise errors.ConfigError(f"--{name} must be one of {', '.join(valid)}; "
                               f"got {value!r}")
  # The network's options have one validator, the architecture table's.
  architectures.complete_options(
      config.model, width=config.width, units=config.units, init=config.init,
      head=config.head, norm=config.norm, use_bias=config.use_bias,
      seed=config.seed, residual=config.residual,
      projection_scale=config.projection_scale,
      logit_scale=config.logit_scale, ws_init_scale=config.ws_init_scale)
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
               "agc_clip", "eval_steps", "mixup_alpha"):
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
  """The Config stored by `to_dict` (extra keys, e.g. derived ones, ignored)."""
  known = {name: _coerce(name, value) if value is not None else None
           for name, value in values.items() if name in _FIELDS}
  return Config(**known)

