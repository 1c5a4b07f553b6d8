"""Input pipelines: any TFDS image-classification dataset, and `synthetic`.

`build_dataset(name, split, batch_size, training=...)` returns a `tf.data`
pipeline of (images float32 [batch, S, S, 3], labels int32 [batch]) batches
for the network's input size S. The augmentation is the one of the original
setup (Section 4 of Hardt & Ma, 2017, which follows the 2016
tensorflow/models resnet), chosen by the images' size:

* "cifar" (fixed-size images no larger than S: CIFAR, SVHN, Fashion-MNIST,
  `synthetic`, ...): zero-pad to S x S (28 -> 32 adds 2 pixels per side),
  then pad S/8 pixels with zeros, random S x S crop, random horizontal flip,
  per-image standardisation. Evaluation: the zero-padding and the
  standardisation.
* "imagenet" (larger or variable-size images): random-resized crop (8%-100%
  of the area, aspect ratio 3/4-4/3, as Inception/ResNet training does)
  resized to S, random flip, per-channel mean/std normalisation.
  Evaluation: resize the shorter side to S * 8/7 (256 for 224), centre crop.

Grayscale images are replicated to 3 channels in both. What a dataset is --
its classes and their names, image shape, splits and their sizes -- is read
from TFDS (`dataset_info`), never hard-coded.

The parameters of that preprocessing are a JSON-serialisable dict
(`preprocessing_config`) that training stores with the model, and
`preprocess_for_eval` applies it with pure TensorFlow ops, so an exported
model can embed exactly the preprocessing it was evaluated with.

Determinism. Every random choice -- the order of the examples in an epoch and
every augmentation -- is computed with stateless random ops from
(seed, example index, epoch), never from a random state. With
`deterministic=True` tf.data also keeps the element order of its parallel
maps, so two runs yield identical batches and a checkpointed iterator
(`tf.train.Checkpoint(iterator=iter(ds))`) resumes exactly where it stopped.

"cifar"-style datasets are held in memory and shuffled globally: the i-th
element of epoch e is example `index_shuffle(i, seed, epoch)`, so
`start_step` resumes a pipeline at any step for free. "imagenet"-style ones
stream from TFDS's files (shuffled file order plus a shuffle buffer) and
identify each example by its TFDS id.
"""

import dataclasses
import functools
import gzip
import os
import shutil

import numpy as np
import tensorflow as tf

# The one dataset that is not TFDS's: generated in process (`synthetic_arrays`).
SYNTHETIC = "synthetic"


class DatasetNotReadyError(ValueError):
  """A TFDS dataset that is not prepared in the data directory.

  The message is one line naming --data_dir and how to prepare the dataset.
  The pipeline never downloads anything.
  """


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


# The per-channel statistics of the ImageNet training images on the 0-255
# scale (RGB), the normalisation used by most ImageNet ResNet pipelines and
# our default for every "imagenet"-style dataset.
IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)

# Datasets of digits and characters: a mirror image is another symbol (or
# none), so random flips are off by default.
NO_FLIP = ("mnist", "emnist", "kmnist", "svhn_cropped", "binarized_mnist")

# Shuffle buffer (in examples) of the streaming path; it holds encoded images
# (~110 kB each for ImageNet) and is saved with iterator checkpoints (~60 MB);
# TFDS already shuffled the examples when preparing and the file order is
# reshuffled every epoch.
_IMAGENET_SHUFFLE_BUFFER = 512

# The features every image-classification dataset of TFDS has (for cifar100
# "label" is the 100 fine classes; the paper does not use "coarse_label").
_IMAGE = "image"
_LABEL = "label"


def _synthetic_info():
  return DatasetInfo(
      SYNTHETIC, num_classes=10, image_shape=(32, 32, 3),
      class_names=tuple(f"texture{i}" for i in range(10)),
      train_split="train", eval_split="test", num_train_examples=10_000,
      num_eval_examples=2_000)


def _builder(name, data_dir):
  """TFDS's builder of NAME (reads only what is on disk; never downloads).

  Raises ValueError for a name TFDS does not know, from the builders TFDS
  ships (not `tfds.list_builders()`, which writes ~/.cache and goes online
  for the community datasets).
  """
  tfds = _tfds()
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        f"unknown dataset {name!r}: not {SYNTHETIC} and not a dataset of "
        f"tensorflow-datasets {tfds.__version__} (see "
        "https://www.tensorflow.org/datasets/catalog)") from None


def info_from_builder(builder):
  """The `DatasetInfo` of a TFDS builder, prepared or not.

  Raises ValueError if it is not an image-classification dataset (an "image"
  and a "label" ClassLabel feature) with 1 or 3 channels.
  """
  tfds = _tfds()
  name = builder.info.name
  features = builder.info.features
  image = features[_IMAGE] if _IMAGE in features else None
  label = features[_LABEL] if _LABEL in features else None
  if not (isinstance(image, tfds.features.Image) and
          isinstance(label, tfds.features.ClassLabel)):
    raise ValueError(
        f"dataset {name!r} is not an image-classification dataset: training "
        f"needs an 'image' and a 'label' (ClassLabel) feature; it has "
        f"{', '.join(features.keys())}")
  shape = tuple(image.shape)
  if shape[-1] not in (1, 3):
    raise ValueError(
        f"dataset {name!r} has {shape[-1]}-channel images; training reads "
        "grayscale (1) or RGB (3)")
  splits = builder.info.splits if builder.is_prepared() else {}
  # The held-out split: "validation" where a dataset has one (ImageNet's
  # "test" has no labels), else "test" (CIFAR, MNIST, SVHN).
  eval_split = next((s for s in ("validation", "test") if s in splits), None)

  def size(split):
    return splits[split].num_examples if split in splits else None

  return DatasetInfo(
      name, num_classes=int(label.num_classes), image_shape=shape,
      class_names=tuple(label.names), train_split="train",
      eval_split=eval_split, num_train_examples=size("train"),
      num_eval_examples=size(eval_split),
      jpeg=getattr(image, "encoding_format", None) == "jpeg")


def dataset_info(name, data_dir=None):
  """The `DatasetInfo` of NAME: `synthetic` or any TFDS image dataset.

  Reads DATA_DIR (None: TFDS's default) for the split sizes of a prepared
  dataset; never downloads. Raises ValueError for unknown names and
  datasets that are not image classification.
  """
  if name == SYNTHETIC:
    return _synthetic_info()
  data_dir = os.fspath(data_dir) if data_dir else None
  return info_from_builder(_builder(name, data_dir))


def prepared_info(name, data_dir=None):
  """`dataset_info` of NAME, which must be prepared in DATA_DIR.

  Raises DatasetNotReadyError (one line saying how to prepare it) if not.
  """
  if name == SYNTHETIC:
    return _synthetic_info()
  return info_from_builder(_prepared_builder(name, data_dir, "train"))


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
  height, width, channels = info.image_shape
  fixed = height is not None and width is not None
  if image_size is None:
    image_size = max(height, width) if fixed else 224
  image_size = int(image_size)
  flip = info.name not in NO_FLIP if flip is None else bool(flip)
  if fixed and max(height, width) <= image_size:
    if 2 * max(height, width) < image_size:
      raise ValueError(
          f"{info.name}'s {height}x{width} images are less than half the "
          f"network's {image_size}x{image_size} input; use a network of the "
          "CIFAR family (32x32 input)")
    return {
        "kind": "cifar",
        "image_size": image_size,
        "input_size": [height, width],        # Zero-padded to image_size.
        "channels": channels,                 # 1: replicated to 3.
        "pad": max(1, image_size // 8),       # Training: random translation.
        "flip": flip,
        "standardize": "per_image",
    }
  return {
      "kind": "imagenet",
      "image_size": image_size,
      "channels": channels,
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
  _check_preprocessing(preprocessing)
  expected = preprocessing_config(info, preprocessing["image_size"])
  if preprocessing["kind"] != expected["kind"] or (
      preprocessing["kind"] == "cifar" and
      input_shape(preprocessing) != input_shape(expected)):
    raise ValueError(
        f"this preprocessing ({preprocessing['kind']}, for "
        f"{shape_text(input_shape(preprocessing))} images) does not fit "
        f"{info.name}'s {shape_text(info.image_shape)} images; use "
        f"preprocessing_config() of {info.name}")


def shape_text(shape):
  """[28, 28, 1] -> "28x28x1"; a size that varies is "?"."""
  return "x".join("?" if n is None else str(n) for n in shape)


# ---------------------------------------------------------------------------
# Preprocessing: pure TensorFlow, shared by the pipelines and exported models.

_KINDS = ("cifar", "imagenet")
_STANDARDIZE = ("per_image", "per_channel")


def _check_preprocessing(preprocessing):
  if not isinstance(preprocessing, dict):
    raise ValueError(
        f"preprocessing must be a dict from preprocessing_config(), got "
        f"{type(preprocessing).__name__}")
  kind = preprocessing.get("kind")
  if kind not in _KINDS:
    raise ValueError(
        f"unknown preprocessing kind {kind!r}; valid: {', '.join(_KINDS)} "
        "(use preprocessing_config(dataset))")
  standardize = preprocessing.get("standardize")
  if standardize not in _STANDARDIZE:
    raise ValueError(
        f"unknown standardize {standardize!r}; valid: "
        f"{', '.join(_STANDARDIZE)}")
  if _channels(preprocessing) not in (1, 3):
    raise ValueError(f"channels must be 1 or 3, got "
                     f"{preprocessing['channels']!r}")


def _channels(preprocessing):
  # Configs written before grayscale datasets were supported have no
  # "channels": they were RGB.
  return int(preprocessing.get("channels", 3))


def input_shape(preprocessing):
  """[height, width, channels] of the raw images PREPROCESSING takes.

  None for the height and width of "imagenet" preprocessing, which takes any
  size. This is the shape an exported model's pixel signature accepts.
  """
  if preprocessing["kind"] == "imagenet":
    return [None, None, _channels(preprocessing)]
  size = int(preprocessing["image_size"])
  height, width = preprocessing.get("input_size", [size, size])
  return [int(height), int(width), _channels(preprocessing)]


def _to_rgb(images, preprocessing):
  """Float32 [..., C] with the preprocessing's C -> [..., 3]: grey replicated."""
  if _channels(preprocessing) == 1:
    return tf.image.grayscale_to_rgb(images)
  return images


def _standardize(images, preprocessing):
  """Float32 raw 0-255 images [..., H, W, 3] -> normalised float32."""
  if preprocessing["standardize"] == "per_image":
    # (x - mean) / max(std, 1/sqrt(#pixels)) over each image's H, W and
    # channels, as in the 2016 resnet's CIFAR input.
    return tf.image.per_image_standardization(images)
  mean = tf.constant(preprocessing["mean"], tf.float32)
  std = tf.constant(preprocessing["std"], tf.float32)
  return (images - mean) / std


def _resize_shorter_side_and_center_crop(images, resize, size):
  """[batch, H, W, 3] float32 -> shorter side RESIZE, central SIZE x SIZE."""
  shape = tf.shape(images)
  height = tf.cast(shape[1], tf.float32)
  width = tf.cast(shape[2], tf.float32)
  scale = resize / tf.minimum(height, width)
  new_height = tf.maximum(size, tf.cast(tf.round(height * scale), tf.int32))
  new_width = tf.maximum(size, tf.cast(tf.round(width * scale), tf.int32))
  images = tf.image.resize(images, tf.stack([new_height, new_width]),
                           method="bilinear")
  top = (new_height - size) // 2
  left = (new_width - size) // 2
  return images[:, top:top + size, left:left + size, :]


def preprocess_for_eval(images, preprocessing):
  """Evaluation preprocessing of a batch of raw images.

  Args:
    images: uint8, or float32 holding raw 0-255 values, [batch, H, W, C] with
      the preprocessing's channels C (1: grayscale, replicated to RGB). For
      "cifar" preprocessing H, W = `input_size` (centrally zero-padded, or
      cropped, to image_size); for "imagenet" any H, W (resized so the
      shorter side is `resize`, then centre-cropped).
    preprocessing: a dict from `preprocessing_config`.

  Returns:
    float32 [batch, image_size, image_size, 3], normalised. Pure TF ops, so it
    can run inside a SavedModel signature.
  """
  _check_preprocessing(preprocessing)
  images = _to_rgb(tf.cast(images, tf.float32), preprocessing)
  size = int(preprocessing["image_size"])
  if preprocessing["kind"] == "imagenet":
    images = _resize_shorter_side_and_center_crop(
        images, float(preprocessing["resize"]), size)
  else:
    images = tf.image.resize_with_crop_or_pad(images, size, size)
  images = _standardize(images, preprocessing)
  return tf.ensure_shape(images, [None, size, size, 3])


def example_seeds(seed, index, epoch, count):
  """COUNT stateless random seeds, [count, 2], for one example in one epoch.

  A pure function of (SEED, INDEX, EPOCH): the augmentation of an example
  never depends on which worker reads it, in which order, or after how many
  restarts.
  """
  key = tf.random.experimental.stateless_fold_in(
      tf.stack([tf.constant(seed, tf.int64), tf.constant(0x1D_7A, tf.int64)]),
      tf.cast(index, tf.int64))
  key = tf.random.experimental.stateless_fold_in(key, tf.cast(epoch, tf.int64))
  return tf.random.experimental.stateless_split(key, num=count)


def random_pad_crop_flip(image, preprocessing, seeds):
  """CIFAR's geometric augmentation of one raw image, before normalising.

  The image [H, W, C] (`input_size`, the preprocessing's channels) becomes
  RGB and is zero-padded centrally to S x S (S = image_size), as in
  evaluation. Then it is zero-padded by `pad` pixels on every side and a
  random S x S crop is taken (the content moves by up to `pad` pixels), and
  it is flipped left-right with probability 1/2 if `flip`. SEEDS is [2, 2]
  int32: one stateless seed for the crop, one for the flip. Returns float32
  [S, S, 3] with the input's values.
  """
  size = int(preprocessing["image_size"])
  pad = int(preprocessing["pad"])
  image = _to_rgb(tf.cast(image, tf.float32), preprocessing)
  image = tf.image.resize_with_crop_or_pad(image, size, size)
  if pad:
    image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
    image = tf.image.stateless_random_crop(image, [size, size, 3], seeds[0])
  if preprocessing.get("flip", True):
    image = tf.image.stateless_random_flip_left_right(image, seeds[1])
  return image


def augment_cifar(image, preprocessing, seeds):
  """Training augmentation of one raw CIFAR-sized image (uint8 or float32).

  `random_pad_crop_flip`, then the standardisation of `preprocessing`
  (per-image for CIFAR): the 2016 resnet's CIFAR training input.
  """
  return _standardize(random_pad_crop_flip(image, preprocessing, seeds),
                      preprocessing)


def random_resized_crop_window(shape, preprocessing, seed):
  """A random crop window (begin [3], size [3]) of an image of SHAPE [3].

  The window covers `crop_area_range` of the image's area with aspect ratio
  in `crop_aspect_ratio_range` (Inception's sampling, 10 attempts, falling
  back to the whole image).
  """
  whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4])
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, whole_image, seed=seed, min_object_covered=0.0,
      aspect_ratio_range=preprocessing["crop_aspect_ratio_range"],
      area_range=preprocessing["crop_area_range"], max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  return begin, size


def augment_imagenet(image, preprocessing, seeds):
  """Training augmentation of one large image: encoded JPEG or uint8 HxWxC.

  Random-resized crop: a window of 8%-100% of the image's area with aspect
  ratio in [3/4, 4/3] (by default; from `preprocessing`), resized to
  image_size x image_size; random left-right flip; normalisation. For JPEG
  bytes only the window is decoded. SEEDS is [2, 2] int32.
  """
  size = int(preprocessing["image_size"])
  encoded = image.dtype == tf.string
  shape = (tf.image.extract_jpeg_shape(image) if encoded
           else tf.shape(image))
  begin, window = random_resized_crop_window(shape, preprocessing, seeds[0])
  top, left, _ = tf.unstack(begin)
  height, width, _ = tf.unstack(window)
  if encoded:
    # channels=3 turns grayscale JPEGs into RGB as well.
    image = tf.image.decode_and_crop_jpeg(
        image, tf.stack([top, left, height, width]), channels=3)
  else:
    image = _to_rgb(tf.cast(
        tf.slice(image, [top, left, 0], [height, width, -1]), tf.float32),
                    preprocessing)
  image = tf.image.resize(tf.cast(image, tf.float32), [size, size],
                          method="bilinear")
  if preprocessing.get("flip", True):
    image = tf.image.stateless_random_flip_left_right(image, seeds[1])
  return tf.ensure_shape(_standardize(image, preprocessing), [size, size, 3])


def _eval_one(image, preprocessing):
  """`preprocess_for_eval` of one image of any size (streaming pipelines)."""
  if image.dtype == tf.string:
    image = tf.io.decode_image(image, channels=_channels(preprocessing),
                               expand_animations=False)
  return preprocess_for_eval(image[tf.newaxis], preprocessing)[0]


# ---------------------------------------------------------------------------
# The synthetic dataset.

SYNTHETIC_SEED = 2017
_SYNTHETIC_GRATINGS = 3  # Per class.


@functools.lru_cache(maxsize=None)
def synthetic_arrays(split):
  """The synthetic dataset's (images uint8 [N, 32, 32, 3], labels int32 [N]).

  Deterministic (NumPy, fixed seed) and learnable but not trivially: every
  class is a texture, a sum of 3 colour gratings with class-specific spatial
  frequencies, orientations and colours, plus a faint class-specific tint.
  Each image is its class texture with a random phase per grating (so no
  single pixel is informative), random contrast and brightness, and strong
  Gaussian pixel noise. A small convnet with global pooling picks up the
  textures within a few hundred steps. The arrays are cached per process and
  read-only.
  """
  info = _synthetic_info()
  if split not in (info.train_split, info.eval_split):
    raise ValueError(
        f"synthetic has splits {info.train_split!r} and {info.eval_split!r}, "
        f"not {split!r}")
  classes, size = info.num_classes, info.image_shape[0]
  class_rng = np.random.default_rng(SYNTHETIC_SEED)
  # Distinct integer frequency vectors (fy, fx), |f| <= 5 cycles per image.
  candidates = [(fy, fx) for fy in range(-5, 6) for fx in range(0, 6)
                if (fx > 0 or fy > 0) and fy * fy + fx * fx <= 25]
  picks = class_rng.permutation(len(candidates))[:classes * _SYNTHETIC_GRATINGS]
  freqs = np.array(candidates, np.float32)[picks].reshape(
      classes, _SYNTHETIC_GRATINGS, 2)
  colours = class_rng.standard_normal((classes, _SYNTHETIC_GRATINGS, 3))
  colours /= np.linalg.norm(colours, axis=-1, keepdims=True)
  tints = class_rng.standard_normal((classes, 3))

  is_train = split == info.train_split
  count = info.num_train_examples if is_train else info.num_eval_examples
  rng = np.random.default_rng([SYNTHETIC_SEED, 0 if is_train else 1])
  labels = rng.integers(0, classes, count).astype(np.int32)
  phases = rng.uniform(0, 2 * np.pi, (count, _SYNTHETIC_GRATINGS))
  contrast = rng.uniform(0.6, 1.4, (count, 1, 1, 1)).astype(np.float32)
  brightness = rng.uniform(-20, 20, (count, 1, 1, 1)).astype(np.float32)

  coords = np.arange(size, dtype=np.float32)
  images = np.empty((count, size, size, 3), np.uint8)
  chunk = 1000
  for start in range(0, count, chunk):
    sl = slice(start, min(count, start + chunk))
    f = freqs[labels[sl]]                                    # [n, g, 2]
    # angle[n, g, y, x] = 2 pi (fy y + fx x) / S + phase[n, g]: a random
    # phase per grating, so the texture sits at a random position.
    angle = (2 * np.pi / size) * (
        f[:, :, 0, None, None] * coords[None, None, :, None] +
        f[:, :, 1, None, None] * coords[None, None, None, :])
    angle = angle + phases[sl, :, None, None].astype(np.float32)
    texture = np.einsum("ngyx,ngc->nyxc", np.cos(angle).astype(np.float32),
                        colours[labels[sl]].astype(np.float32))
    noise = rng.standard_normal(texture.shape, dtype=np.float32)
    pixels = (128.0 + brightness[sl] +
              contrast[sl] * (28.0 * texture +
                              8.0 * tints[labels[sl], None, None, :]) +
              48.0 * noise)
    images[sl] = np.clip(np.round(pixels), 0, 255).astype(np.uint8)
  images.setflags(write=False)
  labels.setflags(write=False)
  return images, labels


# ---------------------------------------------------------------------------
# TFDS.

def _tfds():
  # Imported lazily: tensorflow_datasets takes seconds to import and the
  # synthetic dataset does not need it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


# Datasets that a Debian package installs, so that a machine without internet
# access can prepare them: TFDS name -> (package, directory of its files).
DEBIAN_SOURCES = {
    "fashion_mnist": ("dataset-fashion-mnist",
                      "/usr/share/datasets/fashion-mnist"),
}


def _how_to_prepare(name, data_dir):
  if name == "imagenet2012":
    return (f"put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from "
            f"image-net.org into {manual_dir(data_dir)} and run 'bazel run "
            "//bin:prepare_data -- --dataset=imagenet2012 "
            f"--data_dir={data_dir}' (no internet needed)")
  command = (f"'bazel run //bin:prepare_data -- --dataset={name} "
             f"--data_dir={data_dir}'")
  if name in DEBIAN_SOURCES:
    return (f"run 'apt-get install {DEBIAN_SOURCES[name][0]}', then "
            f"{command} (no internet needed)")
  return (f"run {command} on a machine with internet access and copy that "
          "directory here")


def _not_ready_message(name, data_dir, given, problem):
  """One line: what is missing where, and how to prepare it."""
  where = (f"--data_dir={data_dir}" if given else
           f"{data_dir} (TFDS's default; --data_dir not set)")
  return (f"dataset {name} is not prepared in {where} ({problem}): "
          f"{_how_to_prepare(name, data_dir)}, or pass --data_dir pointing "
          f"to a prepared copy (or use --dataset={SYNTHETIC})")


def _prepared_builder(name, data_dir, split=None):
  """The TFDS builder of NAME in DATA_DIR, checked to hold SPLIT.

  Only reads what is on disk: never downloads, never prepares.

  Raises:
    ValueError: NAME is not a TFDS dataset.
    DatasetNotReadyError: the directory, the prepared dataset or the split
      is missing.
  """
  tfds = _tfds()
  given = bool(data_dir)
  # TFDS's default (TFDS_DATA_DIR or ~/tensorflow_datasets), made explicit so
  # that the error message can name it.
  data_dir = os.fspath(data_dir) if given else tfds.core.constants.DATA_DIR
  builder = _builder(name, data_dir)
  if not tf.io.gfile.isdir(data_dir):
    raise DatasetNotReadyError(
        _not_ready_message(name, data_dir, given, "no such directory"))
  try:
    prepared = builder.is_prepared()
  except Exception as e:  # pylint: disable=broad-except
    # Whatever TFDS raises for an unreadable directory becomes the one-line
    # error the contract promises.
    problem = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise DatasetNotReadyError(_not_ready_message(
        name, data_dir, given, f"TFDS: {problem}")) from e
  if not prepared:
    raise DatasetNotReadyError(_not_ready_message(
        name, data_dir, given, f"no {name}/{builder.version} in it"))
  if split is not None and split not in builder.info.splits:
    raise DatasetNotReadyError(_not_ready_message(
        name, data_dir, given,
        f"split {split!r} missing from {name}/{builder.version}"))
  return builder


def manual_dir(data_dir):
  """Where TFDS looks for ImageNet's manually downloaded archives."""
  return os.path.join(data_dir, "downloads", "manual")


IMAGENET_ARCHIVES = ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar")


def _local_download_manager(source_dir, download_dir, dataset_name):
  """A TFDS download manager that answers every download from SOURCE_DIR.

  A URL resolves to the file of the same name in SOURCE_DIR; extracting it
  (gzip, tar, zip) is TFDS's own code, so the builder prepares exactly what
  it would from the publisher's files. TFDS's registered checksums are not
  checked: they are the publisher's archives' bytes, and a repackaged copy
  of the same content has others (Debian recompresses the .gz files).
  """
  tfds = _tfds()

  class LocalFiles(tfds.download.DownloadManager):

    missing = None  # The one-line error, once a file was not found.

    def download(self, url_or_urls):
      def local(url):
        url = getattr(url, "url", url)  # A str or a tfds.download.Resource.
        path = os.path.join(source_dir, os.path.basename(url.split("?")[0]))
        if not os.path.isfile(path):
          self.missing = (
              f"{source_dir} has no {os.path.basename(path)}, which "
              f"{dataset_name} downloads from {url}; put the file there "
              "(same name) and run this again")
          raise FileNotFoundError(self.missing)
        return tfds.core.Path(path)
      return tf.nest.map_structure(local, url_or_urls)

    def download_and_extract(self, url_or_urls):
      return self.extract(self.download(url_or_urls))

  return LocalFiles(download_dir=download_dir, dataset_name=dataset_name)


def prepare(name, data_dir=None, source_dir=None, echo=print):
  """Prepares TFDS dataset NAME in DATA_DIR; the one step that may download.

  NAME is any TFDS dataset. Its files come from SOURCE_DIR if given (the
  files TFDS would download, under the same names), else from the directory
  of the Debian package that installs them (`DEBIAN_SOURCES`: Fashion-MNIST
  from dataset-fashion-mnist) if it is installed, else from the internet
  (CIFAR-10/100: about 160 MB each). ImageNet is converted from the two
  archives the user put into `manual_dir(data_dir)` (no internet needed).
  TFDS's own builder converts the files. A dataset already prepared is left
  as it is.

  Returns:
    The directory of the prepared dataset (DATA_DIR/NAME/VERSION).

  Raises:
    ValueError: `synthetic` (nothing to prepare), an unknown name, missing
      local files or ImageNet archives, or a failed download (one line
      saying what to do instead).
  """
  if name == SYNTHETIC:
    raise ValueError(f"dataset {SYNTHETIC} is generated in process; there is "
                     "nothing to prepare")
  tfds = _tfds()
  data_dir = os.fspath(data_dir) if data_dir else tfds.core.constants.DATA_DIR
  builder = _builder(name, data_dir)
  if source_dir is not None and not os.path.isdir(source_dir):
    raise ValueError(f"--source_dir={source_dir} is not a directory")
  if source_dir is None and name in DEBIAN_SOURCES and os.path.isdir(
      DEBIAN_SOURCES[name][1]):
    source_dir = DEBIAN_SOURCES[name][1]
  # TFDS would first look for a prepared copy on Google Cloud Storage: not
  # wanted when the files are here, and slow to fail offline.
  download_config = tfds.download.DownloadConfig(
      try_download_gcs=source_dir is None)
  if name == "imagenet2012":
    manual = manual_dir(data_dir)
    missing = [f for f in IMAGENET_ARCHIVES
               if not tf.io.gfile.exists(os.path.join(manual, f))]
    if missing:
      raise ValueError(
          f"imagenet2012 needs {' and '.join(missing)} in {manual}: download "
          "them from image-net.org (registration required) and run this again")
    download_config = tfds.download.DownloadConfig(manual_dir=manual)
  if builder.is_prepared():
    echo(f"{name} is already prepared in {builder.data_dir}")
    return builder.data_dir
  local = None
  if source_dir is not None:
    echo(f"preparing {name} in {data_dir} with TFDS from the files in "
         f"{source_dir} (no download)")
    # TFDS has no public way to hand a builder local files whose checksums
    # differ from the registered ones; the download manager is the one place
    # where downloading happens, so it is the one thing replaced.
    local = _local_download_manager(
        source_dir, os.path.join(data_dir, "downloads"), name)
    builder._make_download_manager = lambda **unused: local  # pylint: disable=protected-access
  else:
    echo(f"preparing {name} in {data_dir} with TFDS (downloads and converts; "
         "CIFAR takes a few minutes, ImageNet hours)")
  try:
    builder.download_and_prepare(download_config=download_config)
  except Exception as e:  # pylint: disable=broad-except
    if local is not None and local.missing:
      raise ValueError(local.missing) from None
    # Network failures surface as many different exception types; the user
    # needs one line and the way out, not TFDS's traceback.
    problem = (str(e).strip().splitlines() or [type(e).__name__])[0]
    advice = ("check the files in --source_dir" if source_dir else
              "on a machine without internet access prepare it elsewhere and "
              "copy the directory here, or pass --source_dir with the files "
              "it downloads")
    raise ValueError(
        f"could not prepare {name} in {data_dir} ({type(e).__name__}: "
        f"{problem}); {advice}") from e
  return builder.data_dir


def _tfds_arrays(builder, split, stop, image_shape):
  """Split SPLIT[:STOP] of a small TFDS dataset, decoded, in memory.

  Returns (images uint8 [n, *IMAGE_SHAPE], labels int32 [n]).
  """
  tfds = _tfds()
  ds = builder.as_dataset(split=f"{split}[:{stop}]", shuffle_files=False,
                          read_config=tfds.ReadConfig(
                              interleave_cycle_length=1))
  ds = ds.map(lambda ex: (ex[_IMAGE], tf.cast(ex[_LABEL], tf.int32)),
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  images, labels = [], []
  for image_batch, label_batch in ds.batch(4096).as_numpy_iterator():
    images.append(image_batch)
    labels.append(label_batch)
  images = (np.concatenate(images) if images
            else np.zeros((0, *image_shape), np.uint8))
  labels = np.concatenate(labels) if labels else np.zeros((0,), np.int32)
  return images, labels


def load_arrays(name, split, data_dir=None, num_examples=None):
  """The first NUM_EXAMPLES (all if None) raw examples of NAME's SPLIT.

  Returns (images uint8 [n, H, W, C], labels int32 [n], `DatasetInfo`), for
  fixed-size image datasets (what fits in memory). Never downloads.

  Raises:
    ValueError / DatasetNotReadyError: as `build_dataset`.
  """
  if name == SYNTHETIC:
    images, labels = synthetic_arrays(split)
    return images[:num_examples], labels[:num_examples], _synthetic_info()
  builder = _prepared_builder(name, data_dir, split)
  info = info_from_builder(builder)
  if None in info.image_shape:
    raise ValueError(f"{name} has images of varying size; they are streamed, "
                     "not loaded into memory")
  size = builder.info.splits[split].num_examples
  stop = size if num_examples is None else min(num_examples, size)
  images, labels = _tfds_arrays(builder, split, stop, info.image_shape)
  return images, labels, info


# ---------------------------------------------------------------------------
# Pipelines.

def _shard_layout(input_context, batch_size):
  """(pipeline id, pipelines, replicas per pipeline, global batch)."""
  if input_context is None:
    return 0, 1, 1, batch_size
  pipelines = input_context.num_input_pipelines
  # Asynchronous (parameter-server) training has fewer replicas in sync than
  # pipelines; each pipeline then feeds one replica.
  per_pipeline = max(1, input_context.num_replicas_in_sync // pipelines)
  return (input_context.input_pipeline_id, pipelines, per_pipeline,
          batch_size * per_pipeline * pipelines)


def _options(deterministic):
  options = tf.data.Options()
  options.deterministic = bool(deterministic)
  options.experimental_optimization.map_parallelization = True
  # Not tf.data's symbolic checkpointing, although it would shrink iterator
  # checkpoints to a few counters: with it, `dataset.skip(n)` takes time
  # quadratic in n (TF 2.21; 50 batches of 128: 4 minutes instead of 4 s).
  # `start_step` is the fast way to skip.
  options.experimental_symbolic_checkpoint = False
  return options


def _in_memory_dataset(images, labels, batch_size, preprocessing, *, training,
                       seed, input_context, start_step):
  """Batches from arrays held in memory, globally shuffled per epoch.

  Training: an infinite stream in which global position g (over all
  pipelines; replica r of step t holds positions t*B + r*b .. t*B + r*b + b-1
  for per-replica batch b and global batch B) is example
  index_shuffle(g mod N; seed, epoch = g div N). Each pipeline computes only
  its replicas' positions, so every step of a multi-pipeline run sees
  exactly the examples and augmentations of a single-pipeline run with the
  same global batch. Evaluation: each pipeline takes a contiguous 1/P of the
  examples in order.
  """
  count = len(labels)
  images = tf.constant(images)
  labels = tf.constant(labels, tf.int32)
  pipeline, pipelines, per_pipeline, global_batch = _shard_layout(
      input_context, batch_size)

  if not training:
    start = pipeline * count // pipelines
    stop = (pipeline + 1) * count // pipelines
    ds = tf.data.Dataset.range(start, stop).batch(batch_size)
    return ds.map(
        lambda indices: (
            preprocess_for_eval(tf.gather(images, indices), preprocessing),
            tf.gather(labels, indices)),
        num_parallel_calls=tf.data.AUTOTUNE)

  if count < global_batch:
    raise ValueError(
        f"training needs at least one global batch ({global_batch} examples)"
        f" but the dataset has {count}; lower --batch_size or raise "
        "num_examples")
  local_batch_span = batch_size * per_pipeline

  def example(local_position):
    step = local_position // local_batch_span
    within = local_position % local_batch_span  # Replica-major.
    position = (step * global_batch + pipeline * local_batch_span + within)
    epoch = position // count
    index = tf.random.experimental.index_shuffle(
        position % count,
        tf.random.experimental.stateless_fold_in(
            tf.constant([seed, 0x5EED], tf.int64), epoch),
        count - 1)
    seeds = example_seeds(seed, index, epoch, 2)
    image = augment_cifar(tf.gather(images, index), preprocessing, seeds)
    return image, tf.gather(labels, index)

  # Resuming at START_STEP costs nothing: positions are computed, not read.
  ds = tf.data.Dataset.counter(start=start_step * local_batch_span,
                               dtype=tf.int64)
  ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch_size, drop_remainder=True)


def _streaming_dataset(builder, split, batch_size, preprocessing, *,
                       training, seed, input_context, stop, start_step, jpeg):
  """Batches streamed from TFDS files (ImageNet and other large images).

  JPEG files stay encoded until augmentation decodes only the crop window;
  other encodings are decoded by TFDS.
  """
  tfds = _tfds()
  pipeline, pipelines, per_pipeline, _ = _shard_layout(input_context,
                                                       batch_size)
  # Disjoint, contiguous example ranges per pipeline: TFDS reads only the
  # files (and records) of its own range.
  start = pipeline * stop // pipelines
  end = (pipeline + 1) * stop // pipelines
  if end <= start:
    raise ValueError(
        f"{split} has {stop} examples, too few for {pipelines} input "
        "pipelines; use more examples or fewer workers")
  read_config = tfds.ReadConfig(
      shuffle_seed=seed, add_tfds_id=True,
      shuffle_reshuffle_each_iteration=True)
  ds = builder.as_dataset(
      split=f"{split}[{start}:{end}]", shuffle_files=training,
      read_config=read_config,
      decoders={_IMAGE: tfds.decode.SkipDecoding()} if jpeg else None)
  length = end - start

  if not training:
    ds = ds.map(lambda ex: (_eval_one(ex[_IMAGE], preprocessing),
                            tf.cast(ex[_LABEL], tf.int32)),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=False)

  # The example's identity for its augmentation seed: a hash of its TFDS id
  # ("<file>__<record>"), which does not depend on the read order.
  ds = ds.map(lambda ex: (ex[_IMAGE], tf.cast(ex[_LABEL], tf.int32),
                          tf.strings.to_hash_bucket_fast(ex["tfds_id"],
                                                         2**62)))
  ds = ds.repeat().enumerate()
  ds = ds.map(lambda position, ex: (*ex, position // length))
  ds = ds.shuffle(_IMAGENET_SHUFFLE_BUFFER, seed=seed,
                  reshuffle_each_iteration=True)
  if start_step:
    # Skips the encoded examples before the expensive decoding: reads (and
    # shuffles) them again, but does not decode or augment them.
    ds = ds.skip(start_step * per_pipeline * batch_size)

  def example(image, label, index, epoch):
    seeds = example_seeds(seed, index, epoch, 2)
    return augment_imagenet(image, preprocessing, seeds), label

  ds = ds.map(example, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch_size, drop_remainder=True)


def build_dataset(name, split, batch_size, *, training, data_dir=None, seed=0,
                  deterministic=False, input_context=None, repeat=None,
                  num_examples=None, preprocessing=None, start_step=0):
  """The input pipeline of dataset NAME, split SPLIT.

  Args:
    name: `synthetic` or a TFDS image-classification dataset.
    split: a split of the dataset, e.g. `dataset_info(name).train_split`.
    batch_size: examples per batch *per replica* (the pipeline serves the
      replicas of `input_context`).
    training: True: augmentation, shuffling, endless repetition, full batches
      only. False: evaluation preprocessing, one pass in order, the final
      partial batch kept.
    data_dir: TFDS data directory (None: TFDS's default). Not used by
      `synthetic`.
    seed: seeds the shuffling and every augmentation.
    deterministic: tf.data keeps the element order of parallel maps, so
      identical arguments give identical batches and a restored iterator
      replays exactly. Augmentation is always a pure function of (seed,
      example index, epoch); this flag only gives up some parallel speed.
      Evaluation pipelines are always deterministic.
    input_context: a `tf.distribute.InputContext` (from
      `distribute_datasets_from_function`); the pipeline reads only its shard.
    repeat: whether to repeat forever; None means `training`. Only
      repeat=training is supported.
    num_examples: use only the first NUM_EXAMPLES examples of the split.
    preprocessing: a `preprocessing_config` dict to use instead of the
      dataset's own at its native size (for example one read back from a
      model's config.json, for the network's input size).
    start_step: training only: start as if START_STEP steps (global batches)
      had already been taken, yielding exactly what the uninterrupted pipeline
      yields from there (with deterministic=True). A way to resume the input
      position without an iterator checkpoint, e.g. under strategies whose
      distributed iterators cannot be checkpointed. Free for in-memory
      ("cifar") datasets; streamed ones re-read (without decoding) the
      skipped examples.

  Returns:
    A `tf.data.Dataset` of (images float32 [batch_size, S, S, 3], labels
    int32 [batch_size]) with S the preprocessing's image_size. Its iterators
    are checkpointable.

  Raises:
    DatasetNotReadyError: a TFDS dataset is not prepared in DATA_DIR.
    ValueError: any other bad argument.
  """
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be a positive integer, got "
                     f"{batch_size!r}")
  if repeat is not None and bool(repeat) != bool(training):
    raise ValueError(
        f"repeat={repeat} with training={training} is not supported: training "
        "pipelines repeat forever, evaluation pipelines make one pass")
  if num_examples is not None and (
      not isinstance(num_examples, (int, np.integer)) or num_examples < 1):
    raise ValueError(
        f"num_examples must be a positive integer or None, got "
        f"{num_examples!r}")
  if not isinstance(start_step, (int, np.integer)) or start_step < 0 or (
      start_step and not training):
    raise ValueError(
        f"start_step must be a non-negative integer, and 0 unless training; "
        f"got {start_step!r} with training={training}")
  start_step = int(start_step)
  seed = int(seed)

  # Data loading runs eagerly even when called while tracing a tf.function
  # (as ParameterServerStrategy does with per-worker datasets).
  with tf.init_scope():
    if name == SYNTHETIC:
      info, builder = _synthetic_info(), None
      if split not in (info.train_split, info.eval_split):
        raise ValueError(
            f"unknown split {split!r} of {name}; valid: {info.train_split}, "
            f"{info.eval_split}")
    else:
      builder = _prepared_builder(name, data_dir, split)
      info = info_from_builder(builder)
    preprocessing = dict(preprocessing or preprocessing_config(info))
    check_fits(preprocessing, info)
    if builder is None:
      size = len(synthetic_arrays(split)[1])
    else:
      size = builder.info.splits[split].num_examples
    stop = size if num_examples is None else min(num_examples, size)
    if preprocessing["kind"] == "cifar":
      if builder is None:
        images, labels = (a[:stop] for a in synthetic_arrays(split))
      else:
        images, labels = _tfds_arrays(builder, split, stop, info.image_shape)

  if preprocessing["kind"] == "cifar":
    ds = _in_memory_dataset(images, labels, batch_size, preprocessing,
                            training=training, seed=seed,
                            input_context=input_context,
                            start_step=start_step)
  else:
    ds = _streaming_dataset(builder, split, batch_size, preprocessing,
                            training=training, seed=seed,
                            input_context=input_context, stop=stop,
                            start_step=start_step, jpeg=info.jpeg)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  # Evaluation always keeps its order (and its final partial batch last);
  # only training may trade order for speed.
  return ds.with_options(_options(deterministic or not training))
