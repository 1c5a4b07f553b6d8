"""What a dataset is, and how its images are preprocessed, as data.

`DatasetInfo` describes a dataset -- classes and their names, image shape,
splits and their sizes -- as TFDS reports it (`tfds_data.dataset_info`) or,
for the built-in `synthetic` set, as `synthetic_info` states it.
`preprocessing_config` turns it into the JSON-serialisable preprocessing of
a network of a given input size, which training stores in config.json and
`preprocessing.preprocess_for_eval` applies inside exported models. Pure
Python: flags and configurations are checked before TensorFlow loads.

The choice follows the images' size (Section 4 of Hardt & Ma, 2017, after
the 2016 tensorflow/models resnet): fixed-size images no larger than the
network's input S get the CIFAR treatment ("cifar": zero-padded to S x S,
random translation by S/8 pixels, flips, per-image standardisation), larger
or variable-size ones the ImageNet treatment ("imagenet": random-resized
crops, flips, per-channel normalisation). Grayscale images are replicated
to RGB.
"""

import dataclasses

from identity_tf import errors

# The one dataset that is not TFDS's: generated in process (`synthetic_arrays`).
SYNTHETIC = "synthetic"


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


def preprocessing_config(info, image_size=None, flip=None):
  """The preprocessing of dataset INFO for a network of input IMAGE_SIZE.

  A JSON-serialisable dict; training stores it with the model, and
  `preprocess_for_eval` and the training augmentation read everything they
  do from it. IMAGE_SIZE None means the images' own size for fixed-size
  datasets and 224 for variable-size ones. FLIP None means on, except for
  the digit and character datasets of `NO_FLIP`.

  Raises ValueError if the images are less than half the input size (a
  frame of zeros around a small image; use a network with a smaller input).
  """
  height, width, depth = info.image_shape
  fixed = height is not None and width is not None
  if image_size is None:
    image_size = max(height, width) if fixed else 224
  image_size = int(image_size)
  flip = info.name not in NO_FLIP if flip is None else bool(flip)
  if fixed and max(height, width) <= image_size:
    if 2 * max(height, width) < image_size:
      raise errors.DataError(
          f"{info.name}'s {height}x{width} images are less than half the "
          f"network's {image_size}x{image_size} input; use a network of the "
          "CIFAR family (32x32 input)")
    return {
        "kind": "cifar",
        "image_size": image_size,
        "input_size": [height, width],        # Zero-padded to image_size.
        "channels": depth,                 # 1: replicated to 3.
        "pad": max(1, image_size // 8),       # Training: random translation.
        "flip": flip,
        "standardize": "per_image",
    }
  return {
      "kind": "imagenet",
      "image_size": image_size,
      "channels": depth,
      "resize": round(image_size * 8 / 7),    # Evaluation: shorter side.
      "crop_area_range": [0.08, 1.0],         # Training: random-resized crop.
      "crop_aspect_ratio_range": [3 / 4, 4 / 3],
      "flip": flip,
      "standardize": "per_channel",
      "mean": list(IMAGENET_MEAN),
      "std": list(IMAGENET_STD),
  }


def check_fits(preprocessing, info):
  """ValueError unless PREPROCESSING takes the images of dataset INFO.

  PREPROCESSING (e.g. read back from a model's config.json) must be what
  `preprocessing_config` gives for INFO at its image_size: the same kind,
  and for "cifar" the same image size and channels.
  """
  check_preprocessing(preprocessing)
  expected = preprocessing_config(info, preprocessing["image_size"])
  if preprocessing["kind"] != expected["kind"] or (
      preprocessing["kind"] == "cifar" and
      input_shape(preprocessing) != input_shape(expected)):
    raise errors.DataError(
        f"this preprocessing ({preprocessing['kind']}, for "
        f"{shape_text(input_shape(preprocessing))} images) does not fit "
        f"{info.name}'s {shape_text(info.image_shape)} images; use "
        f"preprocessing_config() of {info.name}")


def shape_text(shape):
  """[28, 28, 1] -> "28x28x1"; a size that varies is "?"."""
  return "x".join("?" if n is None else str(n) for n in shape)


_KINDS = ("cifar", "imagenet")
_STANDARDIZE = ("per_image", "per_channel")


def check_preprocessing(preprocessing):
  """ValueError unless PREPROCESSING is a valid `preprocessing_config`."""
  if not isinstance(preprocessing, dict):
    raise errors.DataError(
        f"preprocessing must be a dict from preprocessing_config(), got "
        f"{type(preprocessing).__name__}")
  kind = preprocessing.get("kind")
  if kind not in _KINDS:
    raise errors.DataError(
        f"unknown preprocessing kind {kind!r}; valid: {', '.join(_KINDS)} "
        "(use preprocessing_config(dataset))")
  standardize = preprocessing.get("standardize")
  if standardize not in _STANDARDIZE:
    raise errors.DataError(
        f"unknown standardize {standardize!r}; valid: "
        f"{', '.join(_STANDARDIZE)}")
  if channels(preprocessing) not in (1, 3):
    raise errors.DataError(f"channels must be 1 or 3, got "
                           f"{preprocessing['channels']!r}")


def channels(preprocessing):
  """The channels of the raw images PREPROCESSING takes (1 or 3)."""
  # Configs written before grayscale datasets were supported have no
  # "channels": they were RGB.
  return int(preprocessing.get("channels", 3))


def input_shape(preprocessing):
  """[height, width, channels] of the raw images PREPROCESSING takes.

  None for the height and width of "imagenet" preprocessing, which takes any
  size. This is the shape an exported model's pixel signature accepts.
  """
  if preprocessing["kind"] == "imagenet":
    return [None, None, channels(preprocessing)]
  size = int(preprocessing["image_size"])
  height, width = preprocessing.get("input_size", [size, size])
  return [int(height), int(width), channels(preprocessing)]


