"""The paper's architectures and the options of its networks, as data.

The table of `model.build_model`'s networks (Table 1 of Hardt & Ma, 2017,
and the 34-layer ImageNet variant), their default options and the valid
values of every option, with `complete_options`, the one validator of a
network's options, which returns them complete as a `ModelOptions`. Pure
Python: configurations and flags are checked with it before TensorFlow
loads.
"""

import dataclasses

from identity_tf import errors

# The values of the networks' options (see `layers` for what they mean).
# The final layer (`model.build_model`): the paper's random projection,
# frozen or trained, or a trained dense classifier with bias drawn as Fixup
# ("zero") or NF-ResNet ("normal": N(0, 0.01^2)) draw theirs.
HEADS = ("frozen", "trainable", "zero", "normal")
# How the paper's networks draw their weights: "paper" std 1/(k^2 c) and
# "standard" 1/(k sqrt(c)) for every convolution (`layers.ResidualInitializer`);
# "fixup" the paper's stem, C2 = 0 (every unit exactly the identity) and C1
# He-normal scaled by L^(-1/2) for L units: Fixup's rule 2 (Zhang, Dauphin &
# Ma, 2019) on the paper's unit, without Fixup's scalars.
INIT_SCHEMES = ("paper", "standard", "fixup")
# How a residual unit's branch is parametrised (`layers.ConvResidualUnit`):
#   plain     x + C2(ReLU(C1 x)), the paper's unit;
#   skipinit  x + a C2(ReLU(C1 x)) with a trainable scalar a = 0 at init
#             (SkipInit, De & Smith 2020; ReZero, Bachlechner et al. 2020);
#   gain      x + g C2(ReLU(C1 x)) with a trainable scalar g = 1 at init
#             (the branch starts as small as the paper's init makes it);
#   fixup     Fixup (Zhang, Dauphin & Ma 2019): scalar biases and a scalar
#             multiplier in the branch, C2 = 0 and C1 He-initialised scaled
#             by L^(-1/2) for L branches;
#   skipinit_ws  skipinit with C1 and C2 Scaled-Weight-Standardised (NF-
#             ResNet's convolutions, Brock, De & Smith 2021), drawn at unit
#             fan-in variance whatever the init scheme (it sets the stem's);
#   skipinit_ws_small  the same with C1 and C2 drawn at the paper's small
#             scale, std 1/(k^2 c), as the batch-norm baseline's kernels are.
# These parametrise the paper's unit; the methods' own networks are the
# PEERS below.
RESIDUALS = ("plain", "skipinit", "gain", "fixup", "skipinit_ws",
             "skipinit_ws_small")
# The scale of `layers.RandomProjection`'s entries: N(0, 1/classes) (the
# norm of the features is kept) or N(0, 1/d) (each logit has the variance of
# one feature, the 2016 resnet's unit-scaling initialiser for its last
# layer).
PROJECTION_SCALES = ("classes", "features")


# Table 1 / the 34-layer variant. `stem` lists the plain convolutions before
# the residual stages as (kernel size, channels, stride).
@dataclasses.dataclass(frozen=True)
class Architecture:
  stem: tuple
  widths: tuple
  units: tuple
  strides: tuple
  image_size: int


CIFAR = Architecture(stem=((3, 16, 1),), widths=(64, 128, 256),
                     units=(9, 9, 9), strides=(1, 2, 2), image_size=32)
IMAGENET = Architecture(stem=((7, 64, 2), (3, 64, 2)),
                        widths=(64, 128, 256, 512), units=(3, 4, 6, 3),
                        strides=(1, 2, 2, 2), image_size=224)

# name -> (architecture, default options)
MODELS = {
    "cifar10": (CIFAR, dict(classes=10)),
    "cifar100": (CIFAR, dict(classes=100)),
    "imagenet": (IMAGENET, dict(classes=1000)),
    "resnet_bn": (CIFAR, dict(classes=10, norm=True, head="trainable",
                              init="standard")),
    # The normalisation-free methods' own networks at Table 1's widths and
    # depths (`identity_tf.peers`); each draws its weights as its authors
    # do, so `init`, `residual` and `projection_scale` do not apply.
    "fixup": (CIFAR, dict(classes=10, head="zero")),
    "skipinit": (CIFAR, dict(classes=10, head="normal")),
    "nf_resnet": (CIFAR, dict(classes=10, head="normal")),
}
PEERS = ("fixup", "skipinit", "nf_resnet")
DEFAULTS = dict(classes=None, width=1.0, units=None, norm=False, head="frozen",
                init="paper", seed=0, image_size=None, use_bias=False,
                residual="plain", projection_scale="classes",
                logit_scale=1.0, ws_init_scale=1.0)


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """The complete options of a network of `MODELS` (`complete_options`).

  `model.build_model(name, **options.to_dict())` builds it; training stores
  `to_dict()` in config.json and an export in model_info.json, as
  "model": {"name": ..., "options": ...}. Every field is set, so that a
  stored run rebuilds the same network if a default changes.

  Attributes:
    classes: the number of classes (logits).
    width: the multiplier of every layer's channels (1.0: Table 1's).
    units: the residual units of each stage, one integer per stage.
    norm: batch-norm pre-activation units (the `resnet_bn` baseline).
    head: the final layer, one of `HEADS`.
    init: how the convolutions are drawn, one of `INIT_SCHEMES`
      (`layers.ResidualInitializer`).
    seed: seeds every initial weight and the random projection.
    image_size: the height and width of the input images.
    use_bias: the convolutions have biases.
    residual: the parametrisation of a residual unit's branch, one of
      `RESIDUALS`.
    projection_scale: the variance of the random projection's entries, one
      of `PROJECTION_SCALES`.
    logit_scale: a fixed multiplier of the random projection's entries
      (`layers.RandomProjection`).
    ws_init_scale: residual skipinit_ws_small's C1 and C2 are drawn at this
      times the paper's std 1/(k^2 c) (`layers.ConvResidualUnit`).
  """
  classes: int
  width: float
  units: tuple
  norm: bool
  head: str
  init: str
  seed: int
  image_size: int
  use_bias: bool
  residual: str
  projection_scale: str
  logit_scale: float
  ws_init_scale: float

  def to_dict(self):
    """The JSON dict of config.json and model_info.json, units a list.
    Sorted by key as config.json stores it, so that model_info.json, which
    an export writes from config.json, lists them as exports always have."""
    values = {**dataclasses.asdict(self), "units": list(self.units)}
    return dict(sorted(values.items()))

  @classmethod
  def from_dict(cls, name, values):
    """The options of network NAME that VALUES (a `to_dict` dict) stores,
    checked by `complete_options`. An older version's config.json may lack
    an option added since: it takes its default, the network it built."""
    _check(isinstance(values, dict),
           f"the options of model {name} must be a dict, got "
           f"{type(values).__name__}")
    return complete_options(name, **values)[1]


def input_size(name):
  """The height and width of network NAME's input images (its default)."""
  _check(name in MODELS,
         f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
  return MODELS[name][0].image_size


def _text(value):
  """A flag's value as the user wrote it: (1, 2) -> "1,2"."""
  if isinstance(value, (tuple, list)):
    return ",".join(map(str, value))
  return repr(value)


def _check(condition, message):
  if not condition:
    raise errors.ConfigError(message)


def complete_options(name, **options):
  """Validates NAME and OPTIONS; returns (architecture, `ModelOptions`).

  The one validator of a network's options: `model.build_model` and
  `configs.validate` both call it. Options that are None take the model's
  default; a bad one raises ConfigError naming the valid values.
  """
  _check(name in MODELS,
         f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
  unknown = sorted(set(options) - set(DEFAULTS))
  _check(not unknown, f"unknown option(s) {', '.join(unknown)} for "
         f"build_model; valid: {', '.join(sorted(DEFAULTS))}")
  arch, model_defaults = MODELS[name]
  opts = {**DEFAULTS, **model_defaults,
          **{k: v for k, v in options.items() if v is not None}}
  # One integer (or a sequence of one) is the same in every stage.
  units = opts["units"] if opts["units"] is not None else arch.units
  units = tuple(units) if isinstance(units, (tuple, list)) else (units,)
  if len(units) == 1:
    units *= len(arch.widths)
  _check(len(units) == len(arch.widths) and all(
      isinstance(u, int) and not isinstance(u, bool) and u >= 1
      for u in units),
         f"units must be one positive integer or {len(arch.widths)} (one per "
         f"stage of {name}), got {_text(opts['units'])}")
  opts["units"] = units
  _check(isinstance(opts["width"], (int, float)) and opts["width"] > 0,
         f"width must be a positive multiplier (1.0 = the paper's widths), "
         f"got {opts['width']!r}")
  _check(isinstance(opts["classes"], int) and opts["classes"] >= 2,
         f"classes must be an integer >= 2, got {opts['classes']!r}")
  _check(opts["head"] in HEADS,
         f"unknown head {opts['head']!r}; valid: {', '.join(HEADS)}")
  _check(opts["init"] in INIT_SCHEMES,
         f"unknown init {opts['init']!r}; valid: "
         f"{', '.join(INIT_SCHEMES)}")
  _check(not (opts["norm"] and opts["init"] == "fixup"),
         "init fixup is the paper's unit with C2 = 0: batch-norm networks "
         "take init paper or standard")
  _check(opts["residual"] in RESIDUALS,
         f"unknown residual {opts['residual']!r}; valid: "
         f"{', '.join(RESIDUALS)}")
  _check(not (opts["residual"].startswith("skipinit_ws")
              and opts["init"] == "fixup"),
         f"residual {opts['residual']} standardises C1 and C2, which init "
         "fixup would set to zero; use init paper or standard")
  _check(not (opts["norm"] and opts["residual"] != "plain"),
         f"residual={opts['residual']!r} is a normalisation-free "
         "parametrisation of the identity unit; it does not combine with "
         "norm=True (the batch-norm baseline's units)")
  _check(name not in PEERS or (opts["residual"] == "plain"
                               and not opts["norm"]),
         f"model {name} is its authors' network: it takes neither "
         "residual= nor norm= (they change the paper's unit)")
  _check(isinstance(opts["logit_scale"], (int, float))
         and 0 < opts["logit_scale"] < float("inf"),
         f"logit_scale must be a positive number, got "
         f"{opts['logit_scale']!r}")
  _check(isinstance(opts["ws_init_scale"], (int, float))
         and 0 < opts["ws_init_scale"] < float("inf"),
         f"ws_init_scale must be a positive number, got "
         f"{opts['ws_init_scale']!r}")
  _check(opts["ws_init_scale"] == 1 or opts["residual"] == "skipinit_ws_small",
         f"ws_init_scale scales the draw of residual skipinit_ws_small's "
         f"kernels; with residual {opts['residual']} leave it at 1")
  _check(opts["projection_scale"] in PROJECTION_SCALES,
         f"unknown projection_scale {opts['projection_scale']!r}; valid: "
         f"{', '.join(PROJECTION_SCALES)}")
  opts["image_size"] = opts["image_size"] or arch.image_size
  _check(opts["image_size"] >= 8,
         f"image_size must be at least 8, got {opts['image_size']}")
  return arch, ModelOptions(**opts)


def scaled_channels(channels, width):
  """CHANNELS times the width multiplier, rounded, at least 1."""
  return max(1, int(round(channels * width)))


def unit_plan(arch, opts):
  """The residual units of a network, in order: (name, channels, stride,
  index within its stage) per unit, at the width and units per stage of
  OPTS (its `ModelOptions`)."""
  plan = []
  for stage, (width, units, stride) in enumerate(
      zip(arch.widths, opts.units, arch.strides)):
    for unit in range(units):
      plan.append((f"stage{stage + 1}_unit{unit + 1}",
                   scaled_channels(width, opts.width),
                   stride if unit == 0 else 1, unit))
  return plan
