"""Preprocessing and augmentation of images: TensorFlow ops.

What to do is a `datasets.Preprocessing` (`datasets.preprocessing_config`);
this module does it, the same way in the training pipeline (`pipeline`), in
evaluation and inside exported SavedModels (`export`).

Every random choice is a stateless op seeded from (seed, example index,
epoch) (`example_seeds`), never from a random state, so that augmentation
does not depend on which worker reads an example or after how many
restarts.
"""

import tensorflow as tf

from identity_tf.data import datasets

def _to_rgb(images, preprocessing):
  """Float32 [..., C] with the preprocessing's C -> [..., 3]: grey replicated."""
  if preprocessing.channels == 1:
    return tf.image.grayscale_to_rgb(images)
  return images


def _standardize(images, preprocessing):
  """Float32 raw 0-255 images [..., H, W, 3] -> normalised float32."""
  if preprocessing.standardize == "per_image":
    # (x - mean) / max(std, 1/sqrt(#pixels)) over each image's H, W and
    # channels, as in the 2016 resnet's CIFAR input.
    return tf.image.per_image_standardization(images)
  mean = tf.constant(preprocessing.mean, tf.float32)
  std = tf.constant(preprocessing.std, tf.float32)
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
    preprocessing: a `datasets.Preprocessing`.

  Returns:
    float32 [batch, image_size, image_size, 3], normalised. Pure TF ops, so it
    can run inside a SavedModel signature.
  """
  datasets.check_preprocessing(preprocessing)
  images = _to_rgb(tf.cast(images, tf.float32), preprocessing)
  size = preprocessing.image_size
  if preprocessing.kind == "imagenet":
    images = _resize_shorter_side_and_center_crop(
        images, float(preprocessing.resize), size)
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
  size, pad = preprocessing.image_size, preprocessing.pad
  image = _to_rgb(tf.cast(image, tf.float32), preprocessing)
  image = tf.image.resize_with_crop_or_pad(image, size, size)
  if pad:
    image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
    image = tf.image.stateless_random_crop(image, [size, size, 3], seeds[0])
  if preprocessing.flip:
    image = tf.image.stateless_random_flip_left_right(image, seeds[1])
  return image


def augment_cifar(image, preprocessing, seeds):
  """Training augmentation of one raw CIFAR-sized image (uint8 or float32).

  `random_pad_crop_flip`, then the standardisation of `preprocessing`
  (per-image for CIFAR unless a run asks for per-channel statistics): the
  2016 resnet's CIFAR training input.
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
      aspect_ratio_range=preprocessing.crop_aspect_ratio_range,
      area_range=preprocessing.crop_area_range, max_attempts=10,
      use_image_if_no_bounding_boxes=True)
  return begin, size


def augment_imagenet(image, preprocessing, seeds):
  """Training augmentation of one large image: encoded JPEG or uint8 HxWxC.

  Random-resized crop: a window of 8%-100% of the image's area with aspect
  ratio in [3/4, 4/3] (by default; from `preprocessing`), resized to
  image_size x image_size; random left-right flip; normalisation. For JPEG
  bytes only the window is decoded. SEEDS is [2, 2] int32.
  """
  size = preprocessing.image_size
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
  if preprocessing.flip:
    image = tf.image.stateless_random_flip_left_right(image, seeds[1])
  return tf.ensure_shape(_standardize(image, preprocessing), [size, size, 3])


def eval_one(image, preprocessing):
  """`preprocess_for_eval` of one image of any size (streaming pipelines)."""
  if image.dtype == tf.string:
    image = tf.io.decode_image(image, channels=preprocessing.channels,
                               expand_animations=False)
  return preprocess_for_eval(image[tf.newaxis], preprocessing)[0]


