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
# The residual unit's branch (`layers.ConvResidualUnit`), by orthogonal
# options; every combination allowed starts as exactly the unit's shortcut
# where `branch_gain` is "zero" or C2 is zero.
#   residual        plain: x + C2(ReLU(C1 x)), the paper's unit; fixup:
#                   Fixup's scalar biases and multiplier in the branch, C2 = 0
#                   and C1 He-normal x L^-1/2 (Zhang, Dauphin & Ma, 2019).
#   branch_gain     none; zero: x + a C2(ReLU(C1 x)), a trained scalar a = 0 at
#                   initialisation (SkipInit, De & Smith 2020; ReZero); one:
#                   the same from a = 1.
#   weight_standardization  C1 and C2 scaled-weight-standardised
#                   (`layers.ScaledWSConv2D`, NF-ResNet's convolutions, Brock,
#                   De & Smith 2021, Section 4.2).
#   ws_gain         trained: the standardised convolutions' per-output-channel
#                   gain is trained from 1 (NF-ResNet's); frozen: it stays 1.
#   branch_init     how C1 and C2 are drawn, when not as `init` draws the
#                   stem: paper, standard (`layers.ResidualInitializer`) or
#                   fan_in (N(0, 1/fan_in) truncated at 2 std, NF-ResNet's).
#   branch_init_scale  C1 and C2's std times this.
# These parametrise the paper's unit; the methods' own networks are the
# PEERS below.
#
# The fixed scales' ranges. A kernel entry drawn at std up to 1/3 (a 3x3
# kernel of one channel) times branch_init_scale, summed over a fan-in of
# thousands, or a logit times logit_scale, must stay well inside float16's
# 65504 and float32's 3.4e38 (a scale of 1e300 made the first step
# infinite); under weight standardisation a kernel of std below 1e-3
# times the paper's leaves float16's normal range when it is squared.
SCALE_RANGES = {"branch_init_scale": (1e-3, 1e3), "logit_scale": (1e-3, 1e3)}
RESIDUALS = ("plain", "fixup")
BRANCH_GAINS = ("none", "zero", "one")
WS_GAINS = ("trained", "frozen")
BRANCH_INITS = ("paper", "standard", "fan_in")
# The options above, by name (a network's and a configuration's alike).
BRANCH_FIELDS = ("residual", "branch_gain", "weight_standardization",
                 "ws_gain", "branch_init", "branch_init_scale")
# The one `residual` option of versions before these, which named
# combinations: what each value (with its `ws_init_scale`) is now.
LEGACY_RESIDUALS = {
    "plain": {},
    "skipinit": {"branch_gain": "zero"},
    "gain": {"branch_gain": "one"},
    "fixup": {"residual": "fixup"},
    "skipinit_ws": {"branch_gain": "zero", "weight_standardization": True,
                    "ws_gain": "trained", "branch_init": "fan_in"},
    "skipinit_ws_small": {"branch_gain": "zero",
                          "weight_standardization": True,
                          "ws_gain": "trained", "branch_init": "paper"},
}


def translate_legacy(options):
  """OPTIONS (a dict of network options or of a config.json's "config")
  with the names of earlier versions replaced by today's: `residual` values
  that named combinations (`LEGACY_RESIDUALS`) and `ws_init_scale` (the
  draw of skipinit_ws_small's kernels, now `branch_init_scale`). A dict
  that uses today's names comes back unchanged. An earlier name beside a
  today's option it contradicts (set, to another value) is refused: which
  one the user meant cannot be told, and either reading would erase the
  other (ConfigError naming both)."""
  options = dict(options)
  scale = options.pop("ws_init_scale", None)
  residual = options.get("residual")
  if isinstance(residual, str) and residual not in RESIDUALS and (
      residual in LEGACY_RESIDUALS):
    del options["residual"]  # The plain form, today's default.
    meaning = LEGACY_RESIDUALS[residual]
    for name, value in meaning.items():
      if options.get(name) is not None and options[name] != value:
        raise errors.ContradictionError(
            f"residual {residual!r} (an earlier version's name for "
            + ", ".join(f"{k} {v!r}" for k, v in meaning.items())
            + f") contradicts {name} {options[name]!r}: keep one of them")
    options.update(meaning)
  if scale is not None:
    current = options.get("branch_init_scale")
    if current is not None and current != scale:
      raise errors.ContradictionError(
          f"ws_init_scale {scale!r} (an earlier version's name for "
          f"branch_init_scale) contradicts branch_init_scale {current!r}: "
          "keep one of them")
    if scale != 1:
      options["branch_init_scale"] = scale
  return options


# The scale of `layers.RandomProjection`'s entries: N(0, 1/classes) (the
# norm of the features is kept) or N(0, 1/d) (each logit has the variance of
# one feature, the 2016 resnet's unit-scaling initialiser for its last
# layer).
PROJECTION_SCALES = ("classes", "features")


# Table 1 / the 34-layer variant. `stem` lists the plain convolutions before
# the residual stages as (kernel size, channels, stride); in both every stem
# convolution has one width (16, and 64), which the `stem_channels` option
# replaces (`stem_plan`).
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
DEFAULTS = dict(classes=None, width=1.0, units=None, stem_channels=None,
                norm=False, head="frozen", init="paper", seed=0,
                image_size=None, use_bias=False,
                residual="plain", branch_gain="none",
                weight_standardization=False, ws_gain="trained",
                branch_init=None, branch_init_scale=1.0,
                projection_scale="classes", logit_scale=1.0)


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
    stem_channels: the channels of every stem convolution at width 1
      (scaled by `width` like every other layer): the architecture's (16 in
      Table 1's CIFAR network, 64 in the ImageNet one) unless set; 64 in
      the CIFAR network is a stem as wide as stage 1, the layout of Fixup's
      authors' CIFAR ResNets (Zhang, Dauphin & Ma, 2019), whose stem is as
      wide as their first stage. An older config.json without it built
      the architecture's.
    norm: batch-norm pre-activation units (the `resnet_bn` baseline).
    head: the final layer, one of `HEADS`.
    init: how the convolutions are drawn, one of `INIT_SCHEMES`
      (`layers.ResidualInitializer`).
    seed: seeds every initial weight and the random projection.
    image_size: the height and width of the input images.
    use_bias: the convolutions have biases.
    residual: the form of a residual unit's branch, one of `RESIDUALS`.
    branch_gain: a trained scalar on every branch, one of `BRANCH_GAINS`.
    weight_standardization: C1 and C2 scaled-weight-standardised.
    ws_gain: their per-channel gain, one of `WS_GAINS`.
    branch_init: how C1 and C2 are drawn, one of `BRANCH_INITS`, or None:
      as `init`.
    branch_init_scale: C1 and C2's std times this.
    projection_scale: the variance of the random projection's entries, one
      of `PROJECTION_SCALES`.
    logit_scale: a fixed multiplier of the random projection's entries
      (`layers.RandomProjection`).
  """
  classes: int
  width: float
  units: tuple
  stem_channels: int
  norm: bool
  head: str
  init: str
  seed: int
  image_size: int
  use_bias: bool
  residual: str
  branch_gain: str
  weight_standardization: bool
  ws_gain: str
  branch_init: str
  branch_init_scale: float
  projection_scale: str
  logit_scale: float

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
    an option added since: it takes its default, the network it built; its
    options of other names are read as today's (`translate_legacy`)."""
    _check(isinstance(values, dict),
           f"the options of model {name} must be a dict, got "
           f"{type(values).__name__}")
    return complete_options(name, **translate_legacy(values))[1]


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
  _check_stem(arch, opts)
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
  _check_branch(name, opts)
  for option, (low, high) in SCALE_RANGES.items():
    value = opts[option]
    _check(isinstance(value, (int, float)) and not isinstance(value, bool)
           and low <= value <= high,
           f"{option} must be a number from {low:g} to {high:g} (beyond, "
           f"the draws or the logits leave the range the run's 16- and "
           f"32-bit floats hold), got {value!r}")
  _check(opts["projection_scale"] in PROJECTION_SCALES,
         f"unknown projection_scale {opts['projection_scale']!r}; valid: "
         f"{', '.join(PROJECTION_SCALES)}")
  opts["image_size"] = opts["image_size"] or arch.image_size
  _check(opts["image_size"] >= 8,
         f"image_size must be at least 8, got {opts['image_size']}")
  return arch, ModelOptions(**opts)


def _check_stem(arch, opts):
  """Sets OPTS' stem_channels to ARCH's where unset; ConfigError unless it
  is a positive integer no wider than stage 1 (at width 1; `scaled_channels`
  keeps that order at every width): a residual unit's shortcut pads
  channels, it cannot drop them (`layers.StridedUnit`)."""
  stem = opts["stem_channels"]
  if stem is None:
    opts["stem_channels"] = arch.stem[0][1]
    return
  _check(isinstance(stem, int) and not isinstance(stem, bool) and stem >= 1,
         f"stem_channels must be a positive integer (the stem's channels at "
         f"width 1), got {stem!r}")
  _check(stem <= arch.widths[0],
         f"stem_channels={stem} is wider than stage 1's {arch.widths[0]} "
         f"channels, which its first unit cannot shrink to; use at most "
         f"{arch.widths[0]}")


def _check_branch(name, opts):
  """ConfigError unless OPTS' residual-branch options (`BRANCH_FIELDS`) are
  valid values that combine with each other and with network NAME."""
  _check(opts["branch_gain"] in BRANCH_GAINS,
         f"unknown branch_gain {opts['branch_gain']!r}; valid: "
         f"{', '.join(BRANCH_GAINS)}")
  _check(opts["ws_gain"] in WS_GAINS,
         f"unknown ws_gain {opts['ws_gain']!r}; valid: {', '.join(WS_GAINS)}")
  _check(opts["branch_init"] is None or opts["branch_init"] in BRANCH_INITS,
         f"unknown branch_init {opts['branch_init']!r}; valid: "
         f"{', '.join(BRANCH_INITS)} (unset: as init)")
  _check(isinstance(opts["weight_standardization"], bool),
         f"weight_standardization must be true or false, got "
         f"{opts['weight_standardization']!r}")
  fixup = "fixup" in (opts["residual"], opts["init"])
  # The fixup draw is a rule of its own: C2 = 0 (which a standardisation
  # would divide by zero), C1 at He's scale over the depth.
  _check(not (fixup and opts["weight_standardization"]),
         "weight_standardization standardises C1 and C2, which Fixup's "
         "draw sets to zero; use init paper or standard and residual plain")
  _check(not (fixup and (opts["branch_init"] is not None
                         or opts["branch_init_scale"] != 1)),
         "branch_init and branch_init_scale change how C1 and C2 are drawn, "
         "which Fixup's rule fixes; leave them unset with init or residual "
         "fixup")
  _check(not (opts["residual"] == "fixup" and opts["branch_gain"] != "none"),
         "residual fixup has its own trained multiplier on the branch; "
         "leave branch_gain at none")
  _check(opts["ws_gain"] == "trained" or opts["weight_standardization"],
         "ws_gain is the gain of the standardised convolutions: set "
         "weight_standardization, or leave ws_gain at trained")
  _check(opts["branch_init"] != "fan_in" or opts["weight_standardization"],
         "branch_init fan_in is NF-ResNet's draw for standardised kernels: "
         "set weight_standardization, or use paper or standard")
  changed = [key for key in BRANCH_FIELDS if opts[key] != DEFAULTS[key]]
  _check(not (opts["norm"] and changed),
         f"{', '.join(changed)}: {'an option' if len(changed) == 1 else 'options'}"
         " of the normalisation-free identity unit, which does not combine "
         "with norm=True (the batch-norm baseline's units)")
  _check(name not in PEERS or (not changed and not opts["norm"]),
         f"model {name} is its authors' network: it takes no "
         f"{', '.join(changed or ['norm'])} (they change the paper's unit)")


def scaled_channels(channels, width):
  """CHANNELS times the width multiplier, rounded, at least 1."""
  return max(1, int(round(channels * width)))


def stem_plan(arch, opts):
  """The plain convolutions before the residual stages, in order: (name,
  kernel size, channels, stride) each, ARCH's kernels and strides at the
  width and stem_channels of OPTS (its `ModelOptions`). Every network
  builder (`model`, `identity_tf.peers`) builds its stem from this."""
  return [(f"stem{i + 1}", kernel,
           scaled_channels(opts.stem_channels, opts.width), stride)
          for i, (kernel, _, stride) in enumerate(arch.stem)]


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
