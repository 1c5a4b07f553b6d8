"""What a dataset is, and how its images are preprocessed, as data.

`DatasetInfo` describes a dataset -- classes and their names, image shape,
splits and their sizes -- as TFDS reports it (`tfds_data.dataset_info`) or,
for the built-in `synthetic` set, as `synthetic_info` states it.
`preprocessing_config` turns it into the `Preprocessing` of a network of a
given input size, which training stores in config.json (`to_dict`;
`from_dict` reads it back) and `preprocessing.preprocess_for_eval` applies
inside exported models. Pure Python: flags and configurations are checked
before TensorFlow loads.

The choice follows the images' size (Section 4 of Hardt & Ma, 2017, after
the 2016 tensorflow/models resnet): fixed-size images no larger than the
network's input S get the CIFAR treatment ("cifar": zero-padded to S x S,
random translation by S/8 pixels, flips, per-image standardisation), larger
or variable-size ones the ImageNet treatment ("imagenet": random-resized
crops, flips, per-channel normalisation). Grayscale images are replicated
to RGB. Either kind takes the other normalisation when asked
(`preprocessing_config`'s STANDARDIZE): per-channel normalisation of
fixed-size images uses their training images' statistics
(`rgb_statistics`), per-image standardisation of larger ones standardises
each crop.
"""

import dataclasses
import hashlib

from identity_tf import errors

# The one dataset that is not TFDS's: generated in process (`synthetic_arrays`).
SYNTHETIC = "synthetic"
# Seeds the choice of the training images held out for validation
# (`held_out`): fixed, so that every run and every --seed holds out the
# same images and a selection made on them holds for all.
VALIDATION_SEED = 2017


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What training needs to know about a dataset, read from TFDS.

  `image_shape` is (height, width, channels) with None for a size that
  varies. Split sizes are None when the dataset is not prepared (the
  features, hence classes and image shape, are known from TFDS's code
  without the data).
  """
  name: str
  num_classes: int
  image_shape: tuple
  class_names: tuple
  train_split: str
  eval_split: str
  num_train_examples: int = None
  num_eval_examples: int = None
  # Encoded JPEG on disk (streaming pipelines decode only the crop window).
  jpeg: bool = False

  def to_dict(self):
    """JSON-serialisable (for config.json)."""
    return {**dataclasses.asdict(self),
            "image_shape": list(self.image_shape),
            "class_names": list(self.class_names)}

  @classmethod
  def from_dict(cls, values):
    """The `DatasetInfo` that `to_dict` wrote (unknown keys ignored)."""
    known = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in values.items() if k in known}
    return cls(**{**values, "image_shape": tuple(values["image_shape"]),
                  "class_names": tuple(values["class_names"])})


# The per-channel statistics of the ImageNet training images on the 0-255
# scale (RGB), the normalisation used by most ImageNet ResNet pipelines and
# our default for every "imagenet"-style dataset.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

# Datasets of digits and characters: a mirror image is another symbol (or
# none), so random flips are off by default.
NO_FLIP = ("mnist", "emnist", "kmnist", "svhn_cropped", "binarized_mnist")


# Datasets that a Debian package installs, so that a machine without internet
# access can prepare them: TFDS name -> (package, directory of its files).
DEBIAN_SOURCES = {
    "fashion_mnist": ("dataset-fashion-mnist",
                      "/usr/share/datasets/fashion-mnist"),
}


def synthetic_info():
  """The `DatasetInfo` of the built-in synthetic set (`synthetic`)."""
  return DatasetInfo(
      SYNTHETIC, num_classes=10, image_shape=(32, 32, 3),
      class_names=tuple(f"texture{i}" for i in range(10)),
      train_split="train", eval_split="test", num_train_examples=10_000,
      num_eval_examples=2_000)


_KINDS = ("cifar", "imagenet")
# How images are normalised (`Preprocessing.standardize`, the --standardize
# option of a run).
STANDARDIZATIONS = ("per_image", "per_channel")
# The fields that only one kind of preprocessing, or only per-channel
# normalisation, has; None in any other.
_KIND_FIELDS = {"cifar": ("input_size", "pad"),
                "imagenet": ("resize", "crop_area_range",
                             "crop_aspect_ratio_range")}
_STATISTICS = ("mean", "std")
_INTEGERS = ("image_size", "channels", "pad", "resize")
_TUPLES = ("input_size", "crop_area_range", "crop_aspect_ratio_range",
           "mean", "std")


@dataclasses.dataclass(frozen=True)
class Preprocessing:
  """How a network's input images are preprocessed: `preprocessing_config`.

  The module docstring says which images get which kind (Section 4 of Hardt
  & Ma, 2017). Training stores `to_dict()` in config.json and an export in
  model_info.json; `preprocessing.preprocess_for_eval` and the training
  augmentation read everything they do from here.

  Attributes:
    kind: "cifar" (fixed-size images zero-padded to S x S; training
      translates and flips them) or "imagenet" (training takes
      random-resized crops and flips them; evaluation resizes and crops
      the centre).
    image_size: S, the height and width of the network's input.
    channels: the raw images' channels: 1 (grayscale, replicated to RGB in
      every use) or 3.
    flip: training flips each image left-right with probability 1/2.
    standardize: "per_image" (each image to zero mean and unit variance, as
      the 2016 resnet's CIFAR input) or "per_channel" ((x - mean) / std).
    input_size: "cifar": the raw images' (height, width), which are
      zero-padded centrally to S x S.
    pad: "cifar": training zero-pads PAD pixels a side and crops S x S at
      random, a translation by up to PAD pixels.
    resize: "imagenet": evaluation resizes the shorter side to RESIZE, then
      crops the central S x S.
    crop_area_range: "imagenet": training's crop covers this (low, high)
      fraction of the image's area ...
    crop_aspect_ratio_range: ... with its width over height in this range;
      it is resized to S x S.
    mean, std: "per_channel": the RGB channels' statistics, 0-255 scale:
      ImageNet's for "imagenet" (`IMAGENET_MEAN`, `IMAGENET_STD`), and for
      "cifar" those of the run's training images (`rgb_statistics`).

  A field that does not apply to the kind or standardisation is None. The
  constructor raises DataError for values that make no preprocessing.
  """
  kind: str
  image_size: int
  channels: int
  flip: bool
  standardize: str
  input_size: tuple = None
  pad: int = None
  resize: int = None
  crop_area_range: tuple = None
  crop_aspect_ratio_range: tuple = None
  mean: tuple = None
  std: tuple = None

  def __post_init__(self):
    _check_kind(self.kind)
    if self.standardize not in STANDARDIZATIONS:
      raise errors.DataError(
          f"unknown standardize {self.standardize!r}; valid: "
          f"{', '.join(STANDARDIZATIONS)}")
    if self.channels not in (1, 3):
      raise errors.DataError(f"channels must be 1 or 3, got "
                             f"{self.channels!r}")
    applies = self._fields_that_apply()
    missing = [name for name in applies if getattr(self, name) is None]
    extra = [f.name for f in dataclasses.fields(self)
             if f.name not in applies and getattr(self, f.name) is not None]
    if missing or extra:
      raise errors.DataError(
          f"{self.kind} preprocessing with {self.standardize} "
          "standardisation "
          + " and ".join((["needs " + ", ".join(missing)] if missing else [])
                         + (["has no " + ", ".join(extra)] if extra else []))
          + " (use preprocessing_config(dataset))")

  def _fields_that_apply(self):
    """The names of the fields this kind and standardisation have."""
    return (("kind", "image_size", "channels", "flip", "standardize")
            + _KIND_FIELDS[self.kind]
            + (_STATISTICS if self.standardize == "per_channel" else ()))

  @property
  def input_shape(self):
    """[height, width, channels] of the raw images this takes.

    None for the height and width of "imagenet" preprocessing, which takes
    any size. This is the shape an exported model's pixel signature accepts.
    """
    if self.kind == "imagenet":
      return [None, None, self.channels]
    return [*self.input_size, self.channels]

  def to_dict(self):
    """The JSON dict of config.json and model_info.json: the fields that
    apply, tuples as lists. Sorted by key as config.json stores it, so that
    model_info.json, which an export writes from config.json, lists them as
    exports always have."""
    values = {name: getattr(self, name)
              for name in sorted(self._fields_that_apply())}
    return {name: list(value) if isinstance(value, tuple) else value
            for name, value in values.items()}

  @classmethod
  def from_dict(cls, values):
    """The `Preprocessing` of a dict `to_dict` wrote, or an older version:
    config.json of a run from before grayscale datasets has no "channels"
    (its images were RGB) and no "input_size" (they were S x S), and a
    missing "flip" means on, as the readers of these dicts always took it.
    DataError (one line) for a dict that makes no preprocessing."""
    if not isinstance(values, dict):
      raise errors.DataError(
          f"preprocessing must be a dict (config.json's), got "
          f"{type(values).__name__}")
    _check_kind(values.get("kind"))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    missing = [name for name in ("image_size", "standardize")
               if name not in values]
    if unknown or missing:
      raise errors.DataError(
          "preprocessing " + "; ".join(
              ([f"without {', '.join(missing)}"] if missing else []) +
              ([f"with unknown {', '.join(unknown)}"] if unknown else [])))
    values = {name: _typed(name, value) for name, value in values.items()}
    size = values["image_size"]
    defaults = {"channels": 3, "flip": True,
                "input_size": (size, size) if values["kind"] == "cifar"
                              else None}
    return cls(**{**defaults, **values})


def _check_kind(kind):
  if kind not in _KINDS:
    raise errors.DataError(
        f"unknown preprocessing kind {kind!r}; valid: {', '.join(_KINDS)} "
        "(use preprocessing_config(dataset))")


def _typed(name, value):
  """A JSON VALUE of field NAME as the field holds it: integers, tuples."""
  try:
    if name in _INTEGERS:
      return int(value)
    if name == "input_size":
      return tuple(int(n) for n in value)
    if name in _TUPLES:
      return tuple(value)
  except (TypeError, ValueError):
    raise errors.DataError(
        f"preprocessing's {name} is {value!r}, not "
        f"{'an integer' if name in _INTEGERS else 'a list of numbers'}"
    ) from None
  return bool(value) if name == "flip" else value


def _image_size(info, image_size):
  """IMAGE_SIZE as an integer; None: the images' own size for fixed-size
  datasets, 224 for variable-size ones."""
  height, width, _ = info.image_shape
  if image_size is None:
    fixed = height is not None and width is not None
    image_size = max(height, width) if fixed else 224
  return int(image_size)


def preprocessing_kind(info, image_size=None):
  """"cifar" or "imagenet": which treatment dataset INFO's images get for a
  network of input IMAGE_SIZE (the module docstring; `preprocessing_config`
  builds it). Reads no data."""
  height, width, _ = info.image_shape
  fixed = height is not None and width is not None
  return ("cifar" if fixed and max(height, width) <= _image_size(
      info, image_size) else "imagenet")


def preprocessing_config(info, image_size=None, flip=None, standardize=None,
                         statistics=None):
  """The `Preprocessing` of dataset INFO for a network of input IMAGE_SIZE.

  IMAGE_SIZE None means the images' own size for fixed-size datasets and
  224 for variable-size ones. FLIP None means on, except for the digit and
  character datasets of `NO_FLIP`. STANDARDIZE (`STANDARDIZATIONS`) None
  means the kind's: per_image for "cifar", per_channel for "imagenet".
  STATISTICS: (mean, std), the RGB channels' on the 0-255 scale, for
  per_channel; "cifar" needs them (the run's training images', which
  `run.prepare` computes with `rgb_statistics`), "imagenet" takes
  ImageNet's without them.

  Raises DataError if the images are less than half the input size (a
  frame of zeros around a small image; use a network with a smaller input),
  or for per_channel "cifar" preprocessing without STATISTICS.
  """
  height, width, depth = info.image_shape
  kind = preprocessing_kind(info, image_size)
  image_size = _image_size(info, image_size)
  flip = info.name not in NO_FLIP if flip is None else bool(flip)
  standardize = standardize or (
      "per_image" if kind == "cifar" else "per_channel")
  if standardize not in STANDARDIZATIONS:
    raise errors.DataError(
        f"unknown standardize {standardize!r}; valid: "
        f"{', '.join(STANDARDIZATIONS)}")
  if standardize == "per_image":
    normalisation = {}
  elif statistics is not None:
    mean, std = statistics
    normalisation = {"mean": tuple(mean), "std": tuple(std)}
  elif kind == "imagenet":
    normalisation = {"mean": IMAGENET_MEAN, "std": IMAGENET_STD}
  else:
    raise errors.DataError(
        f"per_channel normalisation of {info.name}'s images needs the mean "
        "and std of its training images (statistics=); run.prepare "
        "computes them")
  if kind == "cifar":
    if 2 * max(height, width) < image_size:
      raise errors.DataError(
          f"{info.name}'s {height}x{width} images are less than half the "
          f"network's {image_size}x{image_size} input; use a network of the "
          "CIFAR family (32x32 input)")
    return Preprocessing(
        "cifar", image_size, channels=depth, flip=flip,
        standardize=standardize, input_size=(height, width),
        pad=max(1, image_size // 8), **normalisation)
  return Preprocessing(
      "imagenet", image_size, channels=depth, flip=flip,
      standardize=standardize, resize=round(image_size * 8 / 7),
      crop_area_range=(0.08, 1.0), crop_aspect_ratio_range=(3 / 4, 4 / 3),
      **normalisation)


# Images per block of `rgb_statistics`: a block's index array (8 bytes a
# value) stays near 25 MB for CIFAR's 32x32x3.
_STATISTICS_BLOCK = 1024


def rgb_statistics(images):
  """(mean, std) of IMAGES' RGB channels, each a tuple of 3 floats, 0-255.

  IMAGES: uint8 [N, H, W, C], C = 3, or 1 (grayscale, replicated to RGB in
  every use: its one channel's statistics three times). The mean and the
  population standard deviation over all N x H x W pixels of each channel,
  in float64 from one pass over the images: a histogram of the 256 values
  per channel, exact in integers, from which both follow. Fixup's authors'
  CIFAR input is normalised per channel too (Zhang, Dauphin & Ma, 2019,
  their cifar_train.py), with constants written in their code; these are
  computed from the images given. DataError for no images, images other
  than uint8, or a constant channel (a std of 0, which normalising would
  divide by).
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  images = np.asarray(images)
  if images.ndim != 4 or images.shape[-1] not in (1, 3) or not images.size:
    raise errors.DataError(
        f"the statistics need images [N, H, W, 1 or 3], N > 0; got shape "
        f"{images.shape}")
  if images.dtype != np.uint8:
    raise errors.DataError(f"the statistics are of uint8 images (0-255), "
                           f"got {images.dtype}")
  channels = images.shape[-1]
  offsets = np.arange(channels, dtype=np.intp) * 256
  counts = np.zeros(channels * 256, np.int64)
  for start in range(0, len(images), _STATISTICS_BLOCK):
    block = images[start:start + _STATISTICS_BLOCK].reshape(-1, channels)
    counts += np.bincount((block.astype(np.intp) + offsets).ravel(),
                          minlength=channels * 256)
  counts = counts.reshape(channels, 256).astype(np.float64)
  values = np.arange(256, dtype=np.float64)
  pixels = counts.sum(axis=1)
  mean = counts @ values / pixels
  std = np.sqrt((counts * (values - mean[:, None]) ** 2).sum(axis=1)
                / pixels)
  if not np.all(std > 0):
    raise errors.DataError(
        "a channel of the training images is constant (std 0): per_channel "
        "normalisation would divide by zero; use per_image")
  replicate = 3 if channels == 1 else 1
  return (tuple(float(m) for m in mean) * replicate,
          tuple(float(s) for s in std) * replicate)


def check_fits(preprocessing, info):
  """DataError unless PREPROCESSING takes the images of dataset INFO.

  PREPROCESSING (e.g. read back from a model's config.json) must be what
  `preprocessing_config` gives for INFO at its image_size: the same kind,
  and for "cifar" the same image size and channels.
  """
  check_preprocessing(preprocessing)
  expected = preprocessing_config(info, preprocessing.image_size)
  if preprocessing.kind != expected.kind or (
      preprocessing.kind == "cifar" and
      preprocessing.input_shape != expected.input_shape):
    raise errors.DataError(
        f"this preprocessing ({preprocessing.kind}, for "
        f"{shape_text(preprocessing.input_shape)} images) does not fit "
        f"{info.name}'s {shape_text(info.image_shape)} images; use "
        f"preprocessing_config() of {info.name}")


def shape_text(shape):
  """[28, 28, 1] -> "28x28x1"; a size that varies is "?"."""
  return "x".join("?" if n is None else str(n) for n in shape)


def check_preprocessing(preprocessing):
  """DataError unless PREPROCESSING is a `Preprocessing` (whose values its
  constructor checked)."""
  if not isinstance(preprocessing, Preprocessing):
    raise errors.DataError(
        f"preprocessing must be a datasets.Preprocessing (from "
        f"preprocessing_config(), or Preprocessing.from_dict() of a stored "
        f"dict), got {type(preprocessing).__name__}")


def held_out(size, count):
  """The COUNT of SIZE training examples held out for validation
  (--validation_examples), and the rest: (held-out indices, training
  indices), each sorted.

  The held-out ones are those whose keys sha256("VALIDATION_SEED:index")
  are the COUNT smallest: a uniform random choice, fixed by the seed, that
  no NumPy or Python version changes. DataError unless 0 <= COUNT < SIZE.
  """
  if not 0 <= count < size:
    raise errors.DataError(
        f"--validation_examples={count} must be below the {size} examples "
        "of the training split: lower it")
  def key(index):
    return hashlib.sha256(f"{VALIDATION_SEED}:{index}".encode()).digest()
  validation = sorted(sorted(range(size), key=key)[:count])
  chosen = set(validation)
  return validation, [i for i in range(size) if i not in chosen]
