"""Export of a trained run as a versioned SavedModel for TF Serving.

`export_run(model_dir, export_dir)` restores the run's checkpoint
(`checkpoints.restore_model`) and writes `EXPORT_DIR/<version>/`, the layout TF
Serving's `--model_base_path` expects (`commands.export.export_command`
says so, as //bin:export does), holding:

* a SavedModel whose signatures carry the run's evaluation preprocessing, so
  clients send raw pixels or image files and never re-implement it:
  - `serving_default`: images float32 [batch, H, W, 3], raw 0-255 values
    (H = W = the model's input size for CIFAR-style runs, any H, W for
    ImageNet, which is resized and centre-cropped in the graph);
  - `predict_images`: images string [batch], encoded JPEG or PNG files (what
    REST clients send as {"b64": ...});
  both returning probabilities float32 [batch, classes] (softmax of the
  model's logits) and classes int64 [batch] (the most probable class);
* model_info.json: the facts a person deploying it needs (classes and their
  names, input size, preprocessing, training step, preset, checkpoint).

A version is written to a hidden temporary directory in EXPORT_DIR and
renamed into place, so a crash never leaves a half-written version for a
server to load (TF Serving only loads directories named by an integer).

Requests the model cannot answer fail inside the graph with an ordinary
InvalidArgumentError naming the element, e.g. "images[2] is not 32x32
pixels, the size this model takes: resize it first": the server answers
that request with an error and keeps serving. Wrong rank, size or dtype
is rejected by the signature's input spec before the graph runs (and the
shape is checked again inside it).
"""

import datetime
import json
import os
import re
import shutil
import uuid

import keras
import tensorflow as tf

from identity_tf import errors
from identity_tf.data import datasets
from identity_tf.data import preprocessing as prep
from identity_tf.serving import contract

MODEL_INFO_FILE = contract.MODEL_INFO_FILE
# Prefixes of the hidden directories of an export in progress (or of a
# version being replaced); TF Serving ignores them: not integers.
_TEMPORARY_PREFIX = ".export-tmp-"
_REPLACED_PREFIX = ".export-old-"

# ---------------------------------------------------------------------------
# Versions.

def _is_local(path):
  return "://" not in path


# TF Serving reads version numbers as int64: a directory named by a larger
# number is never served.
MAX_VERSION = 2**63 - 1


def _version_names(export_dir):
  """{version: is a directory} of the entries of EXPORT_DIR named by a
  version number (ASCII digits, at most MAX_VERSION; "²" is a digit to
  Python but no version)."""
  if not os.path.isdir(export_dir):
    return {}
  names = {}
  for name in os.listdir(export_dir):
    if re.fullmatch(r"[0-9]+", name) and int(name) <= MAX_VERSION:
      names[int(name)] = os.path.isdir(os.path.join(export_dir, name))
  return names


def existing_versions(export_dir):
  """The versions in EXPORT_DIR, sorted: subdirectories named by integers
  TF Serving can load."""
  return sorted(v for v, is_dir in _version_names(export_dir).items()
                if is_dir)


def choose_version(export_dir, version=None, overwrite=False):
  """The version to write: VERSION, or one more than the highest existing.

  Raises ValueError if VERSION exists and not OVERWRITE, or is not positive.
  """
  if not _is_local(export_dir):
    raise errors.ServingError(
        f"--export_dir={export_dir} is not a local directory; export "
        f"locally (the atomic rename needs a POSIX filesystem), then copy the "
        f"finished version directory")
  if os.path.exists(export_dir) and not os.path.isdir(export_dir):
    raise errors.ServingError(
        f"--export_dir={export_dir} is a file, not a directory: "
        "give TF Serving's model base path, a directory")
  names = _version_names(export_dir)
  versions = sorted(v for v, is_dir in names.items() if is_dir)
  # A file named by a number takes that number too (the version directory
  # cannot be renamed onto it): the next version is past every such name.
  following = max(names) + 1 if names else 1
  if version is None:
    if following > MAX_VERSION:
      raise errors.ServingError(
          f"{export_dir} already holds version {MAX_VERSION}, the largest "
          "TF Serving loads; pass --version with a free number")
    return following
  version = int(version)
  if not 1 <= version <= MAX_VERSION:
    raise errors.ServingError(
        f"--version must be between 1 and {MAX_VERSION} (TF "
        f"Serving reads it as int64), got {version}")
  if version in names and not names[version]:
    raise errors.ServingError(
        f"{os.path.join(export_dir, str(version))} is a file, not a version "
        f"directory; remove it, or pass another --version (the next free is "
        f"{following})")
  if version in versions and not overwrite:
    raise errors.ServingError(
        f"version {version} already exists in {export_dir}; pass --overwrite "
        f"or omit --version (the next is {following})")
  return version


def stale_temporary_dirs(export_dir):
  """Hidden directories left in EXPORT_DIR by exports that were killed."""
  if not os.path.isdir(export_dir):
    return []
  return sorted(os.path.join(export_dir, name)
                for name in os.listdir(export_dir)
                if name.startswith((_TEMPORARY_PREFIX, _REPLACED_PREFIX)))


# ---------------------------------------------------------------------------
# The serving module.

def _first_index(bad):
  """The first index at which boolean vector BAD is True (int64 max if none)."""
  indices = tf.range(tf.size(bad, out_type=tf.int64))
  return tf.reduce_min(tf.where(bad, indices, tf.int64.max))


def _check_element(bad, message):
  """An assertion that no element is BAD; MESSAGE has {} for the first index.

  The failure is an InvalidArgumentError of this one request ("assertion
  failed: [images[3] ...]"): a server answers it with an error and goes on.
  """
  text = tf.strings.format(message, _first_index(bad))
  return tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [text])


def _first_values(bad, values):
  """(first index at which vector BAD is True, the row of matrix VALUES
  there) for an assertion's message; a row of zeros when none is (the
  message is then not shown), also for no rows at all."""
  index = _first_index(bad)
  columns = values.shape[1]
  padded = tf.concat([values, tf.zeros([1, columns], values.dtype)], 0)
  row = tf.gather(padded, tf.minimum(index, tf.shape(values, tf.int64)[0]))
  return index, tf.unstack(row, num=columns)


# The formats `predict_images` decodes, by their leading bytes.
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_START = b"\xff\xd8\xff"
_GIF_SIGNATURES = (b"GIF87a", b"GIF89a")
_BMP_SIGNATURE = b"BM"


def _gif_table_bytes(flags):
  """The bytes of the colour table after a GIF descriptor whose packed
  field is FLAGS (GIF89a, Sections 18 and 20: there if bit 7 is set,
  3 x 2^(1 + the low three bits) long)."""
  return tf.where(flags >= 128,
                  3 * tf.bitwise.left_shift(tf.constant(2, tf.int64),
                                            flags % 8),
                  tf.constant(0, tf.int64))


def gif_extent(encoded):
  """(height and width int64 [2], pixels int64, complete bool) of the GIF
  file ENCODED (a scalar string), read from its blocks without decoding
  any (GIF89a, Sections 17-27: the logical screen and its colour table,
  then images and extensions, each followed by data sub-blocks, then the
  trailer).

  TensorFlow decodes a GIF with giflib's DGifSlurp, which decodes every
  frame at the size its image descriptor declares, and returns frames as
  large as the largest, the first frame alone included: the logical
  screen bounds none of it. HEIGHT and WIDTH bound the screen and every
  frame, PIXELS counts all frames' pixels, and COMPLETE is false if the
  file goes on past `contract.MAX_GIF_BLOCKS` images and extensions. The
  walk stops where the file ends or stops being a GIF, as giflib does.
  """
  raw = tf.io.decode_raw(encoded, tf.uint8)
  length = tf.shape(raw, out_type=tf.int64)[0]
  data = tf.concat([tf.cast(raw, tf.int64), tf.zeros([16], tf.int64)], 0)

  def byte(at):  # 0 past the end.
    return tf.gather(data, tf.minimum(tf.cast(at, tf.int64), length + 15))

  def u16(at):
    return byte(at) + 256 * byte(at + 1)

  # A chain of data sub-blocks: each its size byte and that many bytes, a
  # size of 0 ending it. From every position at once, where a chain started
  # there ends: leads[i] is where a sub-block at i leads, a terminator and
  # the end of the file lead to themselves, and each round of pointer
  # doubling looks twice as far ahead, so that log2(the longest chain)
  # rounds reach every chain's terminator (a file of 1-byte sub-blocks
  # takes one loop step per block below, not one per sub-block).
  ends = tf.cast(length, tf.int32)
  index = tf.range(ends)
  sizes = tf.cast(raw, tf.int32)
  leads = tf.concat([tf.where(sizes > 0, tf.minimum(index + 1 + sizes, ends),
                              index), ends[tf.newaxis]], 0)

  def double(leads, unused_changed):
    further = tf.gather(leads, leads)
    return further, tf.reduce_any(tf.not_equal(further, leads))

  leads, _ = tf.while_loop(lambda unused_leads, changed: changed, double,
                           (leads, tf.constant(True)))

  def after_data(at):  # The position after the chain of sub-blocks at AT.
    terminator = tf.gather(leads, tf.cast(tf.minimum(at, length), tf.int32))
    return tf.cast(terminator, tf.int64) + 1

  def walk(position, height, width, pixels, unused_done):
    value = byte(position)
    image = tf.equal(value, 0x2C)
    # An image descriptor: 0x2C, left, top, width, height, packed field;
    # then its local colour table and LZW code size, before its data. An
    # extension: its introducer and label, then its data.
    height = tf.where(image, tf.maximum(height, u16(position + 3) +
                                        u16(position + 7)), height)
    width = tf.where(image, tf.maximum(width, u16(position + 1) +
                                       u16(position + 5)), width)
    pixels += tf.where(image, u16(position + 5) * u16(position + 7), 0)
    data_start = tf.where(
        image, position + 11 + _gif_table_bytes(byte(position + 9)),
        position + 2)
    done = (position >= length) | tf.logical_not(
        image | tf.equal(value, 0x21))
    return after_data(data_start), height, width, pixels, done

  start = (13 + _gif_table_bytes(byte(10)), u16(8), u16(6),
           tf.constant(0, tf.int64), tf.constant(False))
  _, height, width, pixels, done = tf.while_loop(
      lambda *state: tf.logical_not(state[-1]), walk, start,
      maximum_iterations=contract.MAX_GIF_BLOCKS)
  return tf.stack([height, width]), pixels, done


def declared_size(encoded):
  """(height and width int64 [2], whether known) that the encoded image
  ENCODED (a scalar string) declares in its headers, nothing decoded:
  PNG's IHDR, BMP's info header, for JPEG its frame header
  (`tf.image.extract_jpeg_shape`, which fails on a JPEG it cannot read),
  for GIF the bound of its screen and frames (`gif_extent`). Known only
  for JPEG, PNG, GIF and BMP (what the signature decodes), with both sizes
  positive, and for a GIF read to its end whose frames together hold at
  most `contract.MAX_IMAGE_PIXELS` pixels (or one of which alone holds
  more: refused by its size)."""
  padded = tf.strings.join([encoded, tf.constant(bytes(32))])
  head = tf.cast(tf.io.decode_raw(tf.strings.substr(padded, 0, 32),
                                  tf.uint8), tf.int64)

  def starts_with(magic, at=0):
    return tf.equal(tf.strings.substr(padded, at, len(magic)), magic)

  def number(start, size, big_endian):
    places = range(size) if not big_endian else reversed(range(size))
    return sum(head[start + i] * (1 << (8 * k))
               for k, i in zip(range(size), places))

  # BMP's height is negative for rows stored top down; TensorFlow reads
  # both as 32-bit integers.
  bmp_height = number(22, 4, False)
  bmp_height = tf.abs(tf.where(bmp_height >= 1 << 31, bmp_height - (1 << 32),
                               bmp_height))
  bmp_width = number(18, 4, False)
  bmp_width = tf.where(bmp_width >= 1 << 31, bmp_width - (1 << 32), bmp_width)
  png = starts_with(_PNG_SIGNATURE) & starts_with(b"IHDR", 12)
  gif = starts_with(_GIF_SIGNATURES[0]) | starts_with(_GIF_SIGNATURES[1])
  jpeg = starts_with(_JPEG_START)
  bmp = starts_with(_BMP_SIGNATURE)
  # The walk through a GIF's blocks runs for GIFs alone.
  gif_size, gif_pixels, gif_complete = tf.cond(
      gif, lambda: gif_extent(encoded),
      lambda: (tf.zeros([2], tf.int64), tf.constant(0, tf.int64),
               tf.constant(True)))
  other = tf.where(png, tf.stack([number(20, 4, True), number(16, 4, True)]),
                   tf.where(gif, gif_size, tf.stack([bmp_height, bmp_width])))
  size = tf.cond(
      jpeg, lambda: tf.cast(tf.image.extract_jpeg_shape(encoded)[:2],
                            tf.int64),
      lambda: other)
  # A GIF's frames together beyond the limit, each within it (an animation
  # of many frames): not decodable here. One larger than the limit is
  # refused by its size, as any image is.
  too_large = tf.reduce_any(size > contract.MAX_IMAGE_PIXELS) | (
      size[0] * size[1] > contract.MAX_IMAGE_PIXELS)
  gif_fits = gif_complete & (
      (gif_pixels <= contract.MAX_IMAGE_PIXELS) | too_large)
  known = (jpeg | png | gif | bmp) & tf.reduce_all(size > 0) & (
      tf.logical_not(gif) | gif_fits)
  return size, known


class ServingModule:
  """MODEL plus its preprocessing as the two serving functions."""

  def __init__(self, model, preprocessing):
    datasets.check_preprocessing(preprocessing)
    self.model = model
    self._preprocessing = preprocessing
    self._size = preprocessing.image_size
    # The raw images the model was trained on: [H, W, C] for CIFAR-style
    # models (zero-padded in the graph), [None, None, C] for ImageNet-style
    # ones (resized and cropped in the graph).
    self._input_shape = preprocessing.input_shape
    self._fixed_size = preprocessing.kind == "cifar"

  def input_signatures(self):
    """{signature name: (function, input signature)}."""
    return {
        contract.DEFAULT_SIGNATURE: (self._serve_pixels, [
            tf.TensorSpec([None, *self._input_shape], tf.float32,
                          name=contract.INPUT_KEY)]),
        contract.IMAGES_SIGNATURE: (self._serve_encoded, [
            tf.TensorSpec([None], tf.string,
                          name=contract.INPUT_KEY)]),
    }

  def save(self, path):
    """Writes the SavedModel to PATH.

    Keras's ExportArchive tracks the model's variables so that the
    SavedModel also loads in TF1-style sessions, which is how TF Serving
    and `saved_model_cli run` load it (a plain tf.Module holding the Keras
    model loads in TF2 but not there: "Could not find variable").
    """
    archive = keras.export.ExportArchive()
    archive.track(self.model)
    for name, (function, signature) in self.input_signatures().items():
      archive.add_endpoint(name, function, input_signature=signature)
    archive.write_out(path, verbose=False)

  def _outputs(self, pixels):
    """{probabilities, classes} of preprocessed PIXELS [batch, S, S, 3]."""
    logits = tf.cast(self.model(pixels, training=False), tf.float32)
    return {
        contract.PROBABILITIES_KEY: tf.nn.softmax(logits, axis=-1),
        contract.CLASSES_KEY: tf.argmax(logits, axis=-1,
                                              output_type=tf.int64),
    }

  def _check_batch(self, images):
    return tf.debugging.Assert(
        tf.size(images) > 0,
        ["images is empty: send at least one image with at least one pixel"])

  def _serve_pixels(self, images):
    """serving_default: raw 0-255 float32 pixels [batch, H, W, 3]."""
    # The input spec already says this; a server feeding the graph directly
    # (TF Serving's C++ session) gets the check at run time too.
    images = tf.ensure_shape(images, [None, *self._input_shape])
    out_of_range = tf.reduce_any(
        tf.logical_not(tf.logical_and(images >= 0.0, images <= 255.0)),
        axis=[1, 2, 3])  # NaN compares false: caught too.
    checks = [
        self._check_batch(images),
        _check_element(
            out_of_range,
            "images[{}] has values outside 0-255: send raw pixel values; the "
            "model standardises them itself"),
    ]
    with tf.control_dependencies(checks):
      images = tf.identity(images)
    return self._outputs(prep.preprocess_for_eval(
        images, self._preprocessing))

  def _decode_element(self, index, encoded):
    """(index, pixels, [height, width], refused) of one encoded file.

    A file that cannot be decoded raises, which drops its element from the
    request's pipeline (so that `_serve_encoded` names it rather than
    failing the request anonymously). A file is decoded only once its
    header declares a size the model takes (`declared_size`): a small file
    may declare a huge image (a decompression bomb), and a file of another
    size is refused anyway.
    """
    size = self._size
    height, width, channels = self._input_shape
    declared, known = declared_size(encoded)
    if self._fixed_size:
      fits = tf.reduce_all(tf.equal(declared, [height, width]))
    else:
      fits = tf.reduce_all(declared <= contract.MAX_IMAGE_PIXELS) & (
          declared[0] * declared[1] <= contract.MAX_IMAGE_PIXELS)
    # Not a JPEG, PNG, GIF or BMP: an error, which drops the element.
    with tf.control_dependencies([tf.debugging.Assert(known, [index])]):
      fits = tf.identity(fits)

    def decoded():
      # Decoding to the model's channels turns colour into grey (or grey
      # into colour) as the training data was.
      image = tf.io.decode_image(encoded, channels=channels,
                                 expand_animations=False)
      if self._fixed_size:  # Checked below; any shape may pass here.
        image = tf.image.resize_with_crop_or_pad(image, height, width)
      pixels = prep.preprocess_for_eval(
          image[tf.newaxis], self._preprocessing)[0]
      return pixels, tf.shape(image, out_type=tf.int64)[:2]

    def refused():
      return tf.zeros([size, size, 3]), declared

    pixels, height_width = tf.cond(fits, decoded, refused)
    return index, pixels, height_width, tf.logical_not(fits)

  def _serve_encoded(self, images):
    """predict_images: encoded JPEG/PNG files [batch]."""
    size = self._size
    height, width, _ = self._input_shape
    count = tf.shape(images, out_type=tf.int64)[0]

    # One tf.data element per file (`_decode_element`); its decoding errors
    # are dropped (`ignore_errors`) and the indices missing afterwards name
    # the bad files in the assertions below.
    elements = tf.data.Dataset.from_tensor_slices(
        (tf.range(count), images)).map(
            self._decode_element, num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True).ignore_errors()
    empty = (tf.zeros([0], tf.int64), tf.zeros([0, size, size, 3]),
             tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.bool))
    indices, pixels, sizes, refused = elements.batch(1024).reduce(
        empty, lambda seen, batch: tuple(
            tf.concat([a, b], 0) for a, b in zip(seen, batch)))
    decoded = tf.scatter_nd(indices[:, tf.newaxis],
                            tf.ones_like(indices, tf.bool), [count])
    checks = [
        tf.debugging.Assert(count > 0,
                            ["images is empty: send at least one image"]),
        _check_element(
            tf.logical_not(decoded),
            "images[{}] is not a decodable JPEG, PNG, GIF or BMP image "
            f"(a GIF: at most {contract.MAX_IMAGE_PIXELS} pixels in all its "
            "frames)"),
    ]
    if self._fixed_size:
      with tf.control_dependencies(checks):
        wrong_size = tf.reduce_any(
            tf.not_equal(sizes, tf.constant([height, width], tf.int64)),
            axis=1)
        checks.append(_check_element(
            wrong_size,
            f"images[{{}}] is not {height}x{width} pixels, the size this "
            f"model takes: resize it first"))
    else:
      with tf.control_dependencies(checks):
        # The first refused element (the elements come in order): its
        # index in the request and its size as its header declares it.
        _, (index, rows, columns) = _first_values(
            refused, tf.concat([indices[:, tf.newaxis], sizes], 1))
        checks.append(tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(refused)),
            [tf.strings.format(
                "images[{}] is {}x{} pixels, more than the "
                f"{contract.MAX_IMAGE_PIXELS} this model decodes: resize it "
                "first", (index, columns, rows))]))
    with tf.control_dependencies(checks):
      pixels = tf.ensure_shape(tf.identity(pixels), [None, size, size, 3])
    return self._outputs(pixels)


# ---------------------------------------------------------------------------
# model_info.json.

def model_info(run, step, *, version, checkpoint=None, num_classes=None):
  """The human-readable facts of an export of RUN (a `run.Run`) at STEP
  (written as model_info.json)."""
  dataset = run.dataset
  preprocessing = run.preprocessing
  num_classes = num_classes or (dataset.num_classes if dataset else None)
  # The label names as the dataset gives them (TFDS's ClassLabel), recorded
  # by training in config.json.
  names = list(dataset.class_names) if dataset else None
  if names is not None and len(names) != num_classes:
    raise errors.ServingError(
        f"the model has {num_classes} classes but {dataset.name} has "
        f"{len(names)} label names; is config.json from this run?")
  size = preprocessing.image_size
  fixed = preprocessing.kind == "cifar"
  height, width, channels = preprocessing.input_shape
  pixel_shape = [-1, height or -1, width or -1, channels]
  colour = "grayscale" if channels == 1 else "RGB"
  return {
      "version": version,
      "model": {"name": run.model_name,
                "options": run.model_options.to_dict()},
      "preset": run.config.preset,
      # What the graph computes in: float32 in and out under every
      # precision, 16-bit convolutions under mixed_* (docs/serving.md).
      "precision": run.config.precision,
      "step": int(step),
      "checkpoint": checkpoint,
      "dataset": dataset.name if dataset else run.config.dataset,
      "classes": {"count": num_classes, "names": names},
      "input": {
          "image_size": size,
          "accepts": (f"{height}x{width} {colour} images"
                      + (f" (zero-padded to {size}x{size})"
                         if (height, width) != (size, size) else "")
                      if fixed else
                      f"{colour} images of any size (resized so the shorter "
                      f"side is {preprocessing.resize}, centre-cropped "
                      f"to {size}x{size})"),
      },
      "preprocessing": preprocessing.to_dict(),
      "signatures": {
          contract.DEFAULT_SIGNATURE: {
              "inputs": {contract.INPUT_KEY: {
                  "dtype": "float32", "shape": pixel_shape,
                  "values": f"raw {colour} pixels, 0-255"}},
              "outputs": _outputs_info(num_classes)},
          contract.IMAGES_SIGNATURE: {
              "inputs": {contract.INPUT_KEY: {
                  "dtype": "string", "shape": [-1],
                  "values": "encoded JPEG or PNG files (REST: {\"b64\": ...})"
              }},
              "outputs": _outputs_info(num_classes)},
      },
      "exported_at": datetime.datetime.now(datetime.timezone.utc).strftime(
          "%Y-%m-%dT%H:%M:%SZ"),
      "tensorflow_version": tf.__version__,
  }


def _outputs_info(num_classes):
  return {
      contract.PROBABILITIES_KEY: {
          "dtype": "float32", "shape": [-1, num_classes],
          "values": "softmax of the logits"},
      contract.CLASSES_KEY: {
          "dtype": "int64", "shape": [-1],
          "values": "the most probable class"},
  }


# ---------------------------------------------------------------------------
# Writing a version.

def export_model(model, run, step, export_dir, *, version=None,
                 overwrite=False, checkpoint=None):
  """Writes MODEL as version VERSION (default: the next) of EXPORT_DIR.

  Args:
    model: the Keras model (images -> logits), e.g. from
      `checkpoints.restore_model`.
    run: its `run.Run` (e.g. `run.read(model_dir)`): the preprocessing the
      signatures carry, and what model_info.json says.
    step: the checkpoint's global step.
    export_dir: TF Serving's model base path; created if missing.
    version: an integer; None for one more than the highest existing.
    overwrite: replace VERSION if it exists.
    checkpoint: the checkpoint path, recorded in model_info.json.

  Returns:
    (version, path of the version directory).

  Raises:
    ValueError: VERSION exists (and not OVERWRITE), or a bad argument.
  """
  export_dir = os.path.abspath(export_dir) if _is_local(export_dir) else (
      export_dir)
  version = choose_version(export_dir, version, overwrite)
  num_classes = int(model.output_shape[-1])
  info = model_info(run, step, version=version, checkpoint=checkpoint,
                    num_classes=num_classes)
  module = ServingModule(model, run.preprocessing)
  temporary = os.path.join(
      export_dir, f"{_TEMPORARY_PREFIX}{version}-{uuid.uuid4().hex[:8]}")
  try:
    os.makedirs(export_dir, exist_ok=True)
    os.mkdir(temporary)
    module.save(temporary)
    with open(os.path.join(temporary, MODEL_INFO_FILE), "w") as f:
      f.write(json.dumps(info, indent=2) + "\n")
    _move_into_place(temporary, export_dir, version, overwrite)
  except (OSError, tf.errors.OpError) as e:
    shutil.rmtree(temporary, ignore_errors=True)
    reason = (getattr(e, "strerror", None) or
              (str(e).strip().splitlines() or [type(e).__name__])[0][:200])
    raise errors.OutputError(
        f"cannot write version {version} into --export_dir={export_dir} "
        f"({type(e).__name__}: {reason}); free space, fix the directory or "
        "its permissions, or pick another --export_dir; nothing was "
        "exported") from None
  except BaseException:
    shutil.rmtree(temporary, ignore_errors=True)
    raise
  return version, os.path.join(export_dir, str(version))


def _move_into_place(temporary, export_dir, version, overwrite):
  """Renames TEMPORARY to EXPORT_DIR/VERSION: one atomic step on POSIX."""
  final = os.path.join(export_dir, str(version))
  replaced = None
  if overwrite and os.path.exists(final):
    replaced = os.path.join(
        export_dir, f"{_REPLACED_PREFIX}{version}-{uuid.uuid4().hex[:8]}")
    os.rename(final, replaced)
  try:
    # rename(2) refuses to replace a non-empty directory: if another export
    # took this version meanwhile, we fail rather than mix the two.
    os.rename(temporary, final)
  except OSError:
    if replaced is not None:
      os.rename(replaced, final)
    if os.path.exists(final):
      raise errors.ServingError(
          f"version {version} appeared in {export_dir} while exporting "
          f"(another export?); run again for the next version") from None
    raise
  if replaced is not None:
    shutil.rmtree(replaced, ignore_errors=True)


def export_run(model_dir, export_dir, *, checkpoint=None, version=None,
               overwrite=False, echo=None):
  """Exports MODEL_DIR's CHECKPOINT (default: the newest intact one; ECHO
  hears of damaged newer ones); see export_model.

  Returns (version, path, model_info dict).
  """
  from identity_tf.training import checkpoints  # pylint: disable=g-import-not-at-top
  choose_version(export_dir, version, overwrite)  # Fail before restoring.
  if not tf.io.gfile.isdir(model_dir):
    raise errors.ServingError(
        f"--model_dir={model_dir} does not exist; pass the directory of a "
        "training run (", errors.Command("train"), ")")
  from identity_tf.training import shipped  # pylint: disable=g-import-not-at-top
  if shipped.is_shipped(model_dir):
    shipped.verify(model_dir)  # What is exported is what was shipped.
  path = checkpoints.find_checkpoint(model_dir, checkpoint, echo)
  model, run, step = checkpoints.restore_checkpoint(model_dir, path)
  version, version_dir = export_model(
      model, run, step, export_dir, version=version, overwrite=overwrite,
      checkpoint=path)
  with open(os.path.join(version_dir, MODEL_INFO_FILE)) as f:
    info = json.load(f)
  return version, version_dir, info
