"""TFDS datasets: what they are, reading them, and preparing them.

`dataset_info` reads a dataset's description from TFDS (classes and their
names, image shape, and, once prepared, the splits and their sizes);
`load_arrays` and `prepared_builder` read prepared data and, when it is not
there, raise `DatasetNotReadyError` with the one message every binary gives:
where it looked and how to prepare it. `prepare` is the one step that may
download, or prepares a dataset from local files (Debian's Fashion-MNIST).
Nothing here reads or writes the home directory's caches or goes online
except `prepare`'s download.
"""

import contextlib
import errno
import fcntl
import glob
import gzip
import math
import os
import re
import shutil
import struct
import tempfile
import threading
import uuid
import zlib

import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf.data import datasets
from identity_tf.data import synthetic

class DatasetNotReadyError(errors.DataError):
  """A TFDS dataset that is not prepared in the data directory.

  The message is one line naming --data_dir and how to prepare the dataset
  (an `errors.Command` of //bin:prepare_data).
  The pipeline never downloads anything.
  """


# The features every image-classification dataset of TFDS has (for cifar100
# "label" is the 100 fine classes; the paper does not use "coarse_label").
IMAGE = "image"
LABEL = "label"


def _builder(name, data_dir):
  """TFDS's builder of NAME (reads only what is on disk; never downloads).

  Raises ValueError for a name TFDS does not know, from the builders TFDS
  ships (not `tfds.list_builders()`, which writes ~/.cache and goes online
  for the community datasets).
  """
  tfds = tfds_module()
  try:
    return tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise errors.DataError(
        f"unknown dataset {name!r}: not {datasets.SYNTHETIC} and not a dataset of "
        f"tensorflow-datasets {tfds.__version__} (see "
        "https://www.tensorflow.org/datasets/catalog)") from None


def _is_prepared(builder):
  """`builder.is_prepared()`, without the warning TFDS logs for every
  directory that holds no prepared copy: an unprepared dataset gets one
  line, ours (`DatasetNotReadyError`), and no TFDS line before it."""
  info_file = (builder.data_path /
               tfds_module().core.constants.DATASET_INFO_FILENAME)
  return info_file.exists() and builder.is_prepared()


def info_from_builder(builder):
  """The `DatasetInfo` of a TFDS builder, prepared or not.

  Raises ValueError if it is not an image-classification dataset (an "image"
  and a "label" ClassLabel feature) with 1 or 3 channels.
  """
  tfds = tfds_module()
  name = builder.info.name
  features = builder.info.features
  image = features[IMAGE] if IMAGE in features else None
  label = features[LABEL] if LABEL in features else None
  if not (isinstance(image, tfds.features.Image) and
          isinstance(label, tfds.features.ClassLabel)):
    raise errors.DataError(
        f"dataset {name!r} is not an image-classification dataset: training "
        f"needs an 'image' and a 'label' (ClassLabel) feature; it has "
        f"{', '.join(features.keys())}")
  shape = tuple(image.shape)
  if shape[-1] not in (1, 3):
    raise errors.DataError(
        f"dataset {name!r} has {shape[-1]}-channel images; training reads "
        "grayscale (1) or RGB (3)")
  splits = builder.info.splits if _is_prepared(builder) else {}
  # The held-out split: "validation" where a dataset has one (ImageNet's
  # "test" has no labels), else "test" (CIFAR, MNIST, SVHN).
  eval_split = next((s for s in ("validation", "test") if s in splits), None)

  def size(split):
    return splits[split].num_examples if split in splits else None

  return datasets.DatasetInfo(
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
  if name == datasets.SYNTHETIC:
    return datasets.synthetic_info()
  data_dir = os.fspath(data_dir) if data_dir else None
  return info_from_builder(_builder(name, data_dir))


def prepared_info(name, data_dir=None):
  """`dataset_info` of NAME, which must be prepared in DATA_DIR.

  Raises DatasetNotReadyError (one line saying how to prepare it) if not.
  """
  if name == datasets.SYNTHETIC:
    return datasets.synthetic_info()
  return info_from_builder(prepared_builder(name, data_dir, "train"))


def tfds_module():
  # Imported lazily: tensorflow_datasets takes seconds to import and the
  # synthetic dataset does not need it.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def _how_to_prepare(name, data_dir):
  """The parts (strings and an `errors.Command`) of the message's advice."""
  prepare = errors.Command("prepare_data",
                           f"--dataset={name} --data_dir={data_dir}")
  if name == "imagenet2012":
    return (f"put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from "
            f"image-net.org into {manual_dir(data_dir)} and run '", prepare,
            "' (no internet needed)")
  if name in datasets.DEBIAN_SOURCES:
    return (f"run 'apt-get install {datasets.DEBIAN_SOURCES[name][0]}', then "
            "'", prepare, "' (no internet needed)")
  return ("run '", prepare, "' on a machine with internet access and copy "
          "that directory here")


def _where(data_dir, given):
  return (f"--data_dir={data_dir}" if given else
          f"{data_dir} (TFDS's default; --data_dir not set)")


def _data_dir_is_a_file(name, data_dir, given):
  """The parts of one line for a data directory that is a file: preparing
  "into" it cannot work, so the fix is another path, not the usual
  prepare_data."""
  return (f"{_where(data_dir, given)} is a file, not a directory: pass "
          f"--data_dir=DIR with a directory, one where {name} is prepared "
          "or a new one to prepare it into ('",
          errors.Command("prepare_data", f"--dataset={name} --data_dir=DIR"),
          "')")


def _not_ready_message(name, data_dir, given, problem):
  """The parts of one line: what is missing where, and how to prepare it."""
  where = _where(data_dir, given)
  return (f"dataset {name} is not prepared in {where} ({problem}): ",
          *_how_to_prepare(name, data_dir),
          f", or pass --data_dir pointing to a prepared copy (or use "
          f"--dataset={datasets.SYNTHETIC})")


def prepared_builder(name, data_dir, split=None):
  """The TFDS builder of NAME in DATA_DIR, checked to hold SPLIT.

  Only reads what is on disk: never downloads, never prepares.

  Raises:
    ValueError: NAME is not a TFDS dataset.
    DatasetNotReadyError: the directory, the prepared dataset or the split
      is missing.
  """
  tfds = tfds_module()
  given = bool(data_dir)
  # TFDS's default (TFDS_DATA_DIR or ~/tensorflow_datasets), made explicit so
  # that the error message can name it.
  data_dir = os.fspath(data_dir) if given else tfds.core.constants.DATA_DIR
  builder = _builder(name, data_dir)
  if not tf.io.gfile.isdir(data_dir):
    if tf.io.gfile.exists(data_dir):
      raise DatasetNotReadyError(*_data_dir_is_a_file(name, data_dir, given))
    raise DatasetNotReadyError(*_not_ready_message(
        name, data_dir, given, "no such directory"))
  try:
    prepared = _is_prepared(builder)
  except Exception as e:  # pylint: disable=broad-except
    # Whatever TFDS raises for an unreadable directory becomes the one-line
    # error the contract promises.
    problem = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise DatasetNotReadyError(*_not_ready_message(
        name, data_dir, given, f"TFDS: {problem}")) from e
  if not prepared:
    raise DatasetNotReadyError(*_not_ready_message(
        name, data_dir, given, f"no {name}/{builder.version} in it"))
  if split is not None and split not in builder.info.splits:
    raise DatasetNotReadyError(*_not_ready_message(
        name, data_dir, given,
        f"split {split!r} missing from {name}/{builder.version}"))
  if split is not None:
    problem = _shards_problem(builder, split)
    if problem:
      raise errors.DataError(*_damaged_message(name, data_dir, given,
                                               builder, problem))
  return builder


def _damaged_message(name, data_dir, given, builder, problem):
  """The parts of one line for a prepared copy whose file is damaged
  (PROBLEM: the file and what is wrong with it): prepared again, once the
  copy is removed (a prepared copy is otherwise left as it is)."""
  return (f"dataset {name} in {_where(data_dir, given)} is damaged: "
          f"{problem}; remove {builder.data_dir}, then ",
          *_how_to_prepare(name, data_dir))


# A TFRecord: its length (uint64) and the length's CRC (uint32), the data,
# the data's CRC (uint32).
_TFRECORD_FRAMING = 8 + 4 + 4


def _shards_problem(builder, split):
  """What makes a file of BUILDER's SPLIT not whole, as a phrase naming the
  file ("PATH is missing", "PATH is cut short: ..."), or None. TFDS
  records each split's records per file and their bytes (without the
  TFRecord framing), so a file cut short, missing or grown is found by its
  size alone, before any training; which one, by walking its records'
  lengths."""
  try:
    info = builder.info.splits[split]
    tfrecord = "tfrecord" in str(builder.info.file_format).lower()
    paths = [os.fspath(p) for p in info.filepaths]
    lengths = [int(n) for n in info.shard_lengths]
    expected = int(info.num_bytes) + _TFRECORD_FRAMING * sum(lengths)
  except Exception:  # pylint: disable=broad-except
    return None  # A TFDS that records less: nothing to check against.
  if not tfrecord or not int(info.num_bytes) or len(paths) != len(lengths):
    return None
  sizes = []
  for path in paths:
    if not tf.io.gfile.exists(path):
      return f"{path} is missing"
    sizes.append(tf.io.gfile.stat(path).length)
  if sum(sizes) == expected:
    return None
  for path, records, size in zip(paths, lengths, sizes):
    problem = _tfrecord_problem(path, records, size)
    if problem:
      return f"{path} {problem}"
  # Every file holds its records whole: TFDS counted the bytes otherwise.
  return None


def _tfrecord_problem(path, records, size):
  """What makes TFRecord file PATH of SIZE bytes not hold its RECORDS
  records whole (a phrase that follows its name), or None: read from the
  records' lengths alone."""
  count, position = 0, 0
  with tf.io.gfile.GFile(path, "rb") as f:
    while position < size:
      if count == records:
        return (f"is longer than its {records} records: {size - position} "
                "more bytes follow them")
      if position + 12 > size:
        return (f"is cut short: it ends inside the header of record "
                f"{count + 1} of its {records}")
      f.seek(position)
      length = int.from_bytes(f.read(8), "little")
      position += _TFRECORD_FRAMING + length
      count += 1
      if position > size:
        return (f"is cut short: it ends inside record {count} of its "
                f"{records} ({size} bytes)")
  if count < records:
    return f"is cut short: it holds {count} of its {records} records"
  return None


def input_failure(error, name, data_dir=None):
  """The one-line error (an `errors.DataError`, unraised) naming the
  damaged file of dataset NAME in DATA_DIR and the fix, if ERROR (a
  tf.errors.OpError that stopped a training or evaluation) is the input's
  failure to read a record, or TFDS finding fewer records than a split
  holds; None otherwise (a checkpoint that fails its checksums is a
  `DamagedCheckpointError` before this). Resuming cannot help: the fix is
  preparing the dataset again."""
  text = str(error)
  if not (isinstance(error, tf.errors.DataLossError) or
          "expected to contain" in text):
    return None
  found = damaged_file(name, data_dir)
  if found is not None:
    return found
  what = re.search(r"(corrupted|truncated) record at \d+|Input dataset was "
                   r"expected to contain \d+ elements but contained only \d+",
                   text)
  return errors.DataError(
      f"a record of dataset {name} could not be read ({type(error).__name__}"
      f"{': ' + what.group(0) if what else ''}): a file of its prepared copy "
      "is damaged; remove that copy and prepare it again (",
      errors.Command("prepare_data", f"--dataset={name}"
                     + (f" --data_dir={data_dir}" if data_dir else "")), ")")


# The most bytes `damaged_file` reads to find which file fails its
# checksums: past it, the line names the dataset's directory alone.
CHECKSUM_SCAN_BYTES = 2 << 30


def damaged_file(name, data_dir=None):
  """One line (an `errors.DataError`, unraised) naming the file of
  dataset NAME prepared in DATA_DIR that is damaged and how to prepare it
  again, for a training or evaluation that stopped on a record it could
  not read (TensorFlow's DataLossError names no file); None if no file is
  found damaged. Sizes first (`_shards_problem`), then, for a dataset of at
  most CHECKSUM_SCAN_BYTES, each file read through TensorFlow's checksummed
  reader."""
  if name == datasets.SYNTHETIC:
    return None
  tfds = tfds_module()
  given = bool(data_dir)
  data_dir = os.fspath(data_dir) if given else tfds.core.constants.DATA_DIR
  try:
    builder = _builder(name, data_dir)
    splits = list(builder.info.splits)
  except Exception:  # pylint: disable=broad-except
    return None
  for split in splits:
    problem = _shards_problem(builder, split)
    if problem:
      return errors.DataError(*_damaged_message(name, data_dir, given,
                                                builder, problem))
  paths = [os.fspath(p) for split in splits
           for p in builder.info.splits[split].filepaths]
  try:
    total = sum(tf.io.gfile.stat(p).length for p in paths)
  except tf.errors.OpError:
    return None
  if total > CHECKSUM_SCAN_BYTES:
    return None
  for path in paths:
    try:
      for _ in tf.data.TFRecordDataset(path).batch(1024):
        pass
    except tf.errors.DataLossError as e:
      where = re.search(r"(corrupted|truncated) record at \d+", str(e))
      return errors.DataError(*_damaged_message(
          name, data_dir, given, builder, f"{path} fails its checksums"
          + (f" ({where.group(0)})" if where else "")))
    except tf.errors.OpError:
      return None
  return None


def manual_dir(data_dir):
  """Where TFDS looks for ImageNet's manually downloaded archives."""
  return os.path.join(data_dir, "downloads", "manual")


IMAGENET_ARCHIVES = ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar")


# Files in the idx format (yann.lecun.com/exdb/mnist): those of MNIST,
# Fashion-MNIST and KMNIST. Their header says exactly how long they are, so
# a file cut short is named before TFDS fails on it with a reshape error.
_IDX_NAME = re.compile(r"-idx\d+-ubyte(\.gz)?$")
# Bytes per element of each idx element type (the magic number's third byte).
_IDX_ELEMENT_BYTES = {0x08: 1, 0x09: 1, 0x0B: 2, 0x0C: 4, 0x0D: 4, 0x0E: 8}


def idx_problem(path):
  """What makes idx file PATH (gzipped if it ends in .gz) unusable, or None.

  An idx file is two zero bytes, the element type, the number of
  dimensions n, n big-endian uint32 sizes, then the elements: its length
  is exactly what its header says. Returns a phrase that follows the file's
  name: "is cut short: ...", "is not an idx file: ...", ...
  """
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      magic = f.read(4)
      if (len(magic) < 4 or magic[:2] != b"\0\0" or
          magic[2] not in _IDX_ELEMENT_BYTES or magic[3] == 0):
        return "is not an idx file: it does not start with an idx header"
      sizes = f.read(4 * magic[3])
      if len(sizes) < 4 * magic[3]:
        return "is cut short inside its idx header"
      shape = struct.unpack(f">{magic[3]}I", sizes)
      length = 0
      while chunk := f.read(1 << 20):
        length += len(chunk)
  except (EOFError, zlib.error, gzip.BadGzipFile) as e:
    return f"is not a complete gzip file ({e})"
  except OSError as e:
    return f"cannot be read ({e.strerror or e})"
  expected = math.prod(shape) * _IDX_ELEMENT_BYTES[magic[2]]
  described = (f"its header describes {' x '.join(map(str, shape))} values "
               f"({expected} bytes after the header)")
  if length < expected:
    return f"is cut short: {described}, but only {length} follow it"
  if length > expected:
    return (f"is longer than its header says: {described}, but {length} "
            "follow it")
  return None


# What an archive of a dataset may extract to, at most: this many times the
# archive's own bytes (a decompression bomb expands a thousandfold; the
# datasets' gzip and tar.gz files 1.1 to 5 times), and this many times the
# size TFDS registers for the dataset's file of that name (what the dataset
# can hold: CIFAR-10's 162 MiB tar.gz holds 178 MB).
MAX_EXPANSION = 100
MAX_REGISTERED_EXPANSION = 16
# Extraction copies in chunks of this many bytes: never a member whole.
_CHUNK = 1 << 20


class ArchiveTooLargeError(errors.DataError):
  """An archive that would extract to more than the dataset can hold."""


def extraction_limit(archive, registered_size=None):
  """(bytes, why): the most ARCHIVE (a path) may extract to, all its members
  together, and the phrase that says where the bound comes from.
  REGISTERED_SIZE: the bytes TFDS registers for the dataset's file of that
  name (None: not registered)."""
  size = os.path.getsize(archive)
  limits = [(MAX_EXPANSION * max(size, 1),
             f"{MAX_EXPANSION} times the archive's {size} bytes")]
  if registered_size:
    limits.append((MAX_REGISTERED_EXPANSION * int(registered_size),
                   f"{MAX_REGISTERED_EXPANSION} times the "
                   f"{int(registered_size)} bytes TFDS registers for it"))
  return min(limits)


def extract_bounded(archive, members, to_path, limit, why,
                    stopped=lambda: False):
  """Writes MEMBERS ((path inside the archive, readable file) pairs, as
  TFDS's `iter_archive` yields them: unsafe paths and links already left
  out) under TO_PATH ("" is TO_PATH itself), streamed in chunks; raises
  ArchiveTooLargeError (one line) as soon as they exceed LIMIT bytes (WHY:
  where the limit comes from). Returns the bytes written; the caller
  removes TO_PATH on failure. STOPPED() true (the preparation was stopped
  meanwhile) ends it at the next chunk."""
  written = 0
  for name, handle in members:
    name = name.decode() if isinstance(name, bytes) else name
    target = os.path.join(to_path, name) if name else to_path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
      while chunk := handle.read(_CHUNK):
        if stopped():
          raise errors.DataError("the preparation was stopped")
        written += len(chunk)
        if written > limit:
          raise ArchiveTooLargeError(
              f"{archive} extracts to more than {limit} bytes ({why}; "
              f"{name or 'its content'} passes it): not the dataset's file "
              "(a decompression bomb?); replace it with the publisher's "
              "file and run this again; nothing was kept from this attempt")
        out.write(chunk)
  return written


def _bounded_extractor(limit_of, refused, stopped):
  """A TFDS extractor that extracts as TFDS's does (the same archive
  formats and member filter, the same incomplete-then-rename directory),
  but streamed and bounded (`extract_bounded`): TFDS's reads each member
  whole into memory and has no bound. LIMIT_OF(archive path) -> (bytes,
  why); REFUSED(line) hears of an archive that passes its bound."""
  extractor = tfds_module().core.download.extractor
  incomplete = tfds_module().core.constants.INCOMPLETE_PREFIX

  class BoundedExtractor(extractor._Extractor):  # pylint: disable=protected-access

    def _extract(self, from_path, method, to_path):
      temporary = os.path.join(os.fspath(to_path.parent),
                               f"{incomplete}{uuid.uuid4().hex}_"
                               f"{to_path.name}")
      try:
        extract_bounded(os.fspath(from_path),
                        extractor.iter_archive(from_path, method),
                        temporary, *limit_of(os.fspath(from_path)),
                        stopped=stopped)
        if to_path.exists():
          shutil.rmtree(os.fspath(to_path), ignore_errors=True)
        os.replace(temporary, os.fspath(to_path))
      except BaseException as e:
        if os.path.isdir(temporary):
          shutil.rmtree(temporary, ignore_errors=True)
        elif os.path.exists(temporary):
          os.remove(temporary)
        if isinstance(e, ArchiveTooLargeError):
          refused(str(e))
        raise
      return to_path

  return BoundedExtractor(max_workers=1)


def _local_download_manager(source_dir, download_dir, dataset_name,
                            registered_sizes=None):
  """A TFDS download manager that answers every download from SOURCE_DIR.

  A URL resolves to the file of the same name in SOURCE_DIR; extracting it
  (gzip, tar, zip) is TFDS's own code, so the builder prepares exactly what
  it would from the publisher's files. TFDS's registered checksums are not
  checked: they are the publisher's archives' bytes, and a repackaged copy
  of the same content has others (Debian recompresses the .gz files). An
  idx file is checked against its header first (`idx_problem`). Archives
  are extracted streamed and bounded (`_bounded_extractor`;
  REGISTERED_SIZES: {file name: the bytes TFDS registers for it}).
  """
  tfds = tfds_module()
  registered_sizes = registered_sizes or {}

  class LocalFiles(tfds.download.DownloadManager):

    problem = None  # The one-line error, once a file was missing or bad.
    used = []  # The files of SOURCE_DIR it was given, for error messages.
    _bounded = None
    stopped = False  # Set when the preparation ends: extraction stops too.

    def finish(self, wait=None):
      """Stops extracting and waits (at most WAIT seconds; None: until
      done) for the extraction threads, which stop at their next chunk:
      none writes into the scratch directory once it is removed."""
      self.stopped = True
      if self._bounded is not None:
        waiter = threading.Thread(
            target=self._bounded._executor.shutdown, daemon=True)  # pylint: disable=protected-access
        waiter.start()
        waiter.join(wait)

    def _refuse(self, problem):
      self.problem = problem
      raise errors.DataError(problem)

    @property
    def _extractor(self):
      if self._bounded is None:
        self._bounded = _bounded_extractor(
            lambda archive: extraction_limit(
                archive, registered_sizes.get(os.path.basename(archive))),
            lambda line: setattr(self, "problem", line),
            lambda: self.stopped)
      return self._bounded

    def download(self, url_or_urls):
      def local(url):
        url = getattr(url, "url", url)  # A str or a tfds.download.Resource.
        name = os.path.basename(url.split("?")[0])
        path = os.path.join(source_dir, name)
        self.used = self.used + [name]
        if not os.path.isfile(path):
          self._refuse(f"{source_dir} has no {name}, which {dataset_name} "
                       f"downloads from {url}; put the file there (same "
                       "name) and run this again")
        problem = idx_problem(path) if _IDX_NAME.search(name) else None
        if problem:
          self._refuse(f"{path} {problem}; replace it with an intact copy "
                       f"({dataset_name} downloads it from {url}) and run "
                       "this again; nothing was kept from this attempt")
        return tfds.core.Path(path)
      return tf.nest.map_structure(local, url_or_urls)

    def download_and_extract(self, url_or_urls):
      return self.extract(self.download(url_or_urls))

  return LocalFiles(download_dir=download_dir, dataset_name=dataset_name)


def prepare(name, data_dir=None, source_dir=None, echo=lambda line: None):
  """Prepares TFDS dataset NAME in DATA_DIR; the one step that may download.

  NAME is any TFDS dataset. Its files come from SOURCE_DIR if given (the
  files TFDS would download, under the same names), else from the directory
  of the Debian package that installs them (`datasets.DEBIAN_SOURCES`:
  Fashion-MNIST from dataset-fashion-mnist) if it is installed, else from
  the internet (CIFAR-10/100: about 160 MB each). ImageNet is converted
  from the two archives the user put into `manual_dir(data_dir)` (no
  internet needed). TFDS's own builder converts the files. A dataset
  already prepared is left as it is; a failed attempt leaves DATA_DIR as it
  found it (but for partial downloads, which TFDS resumes).

  Returns:
    The directory of the prepared dataset (DATA_DIR/NAME/VERSION).

  Raises:
    ValueError: `synthetic` (nothing to prepare), an unknown name, a
      DATA_DIR that is a file, missing or truncated local files, missing
      ImageNet archives, or a failed download (one line saying what to do
      instead).
  """
  if name == datasets.SYNTHETIC:
    raise errors.DataError(
        f"dataset {datasets.SYNTHETIC} is generated in process; "
        "there is nothing to prepare")
  given = bool(data_dir)
  data_dir = (os.fspath(data_dir) if given
              else tfds_module().core.constants.DATA_DIR)
  if tf.io.gfile.exists(data_dir) and not tf.io.gfile.isdir(data_dir):
    raise errors.DataError(*_data_dir_is_a_file(name, data_dir, given))
  builder = _builder(name, data_dir)
  source_dir = _source_dir(name, source_dir)
  download_config = _download_config(name, data_dir, source_dir)
  if _is_prepared(builder):
    echo(f"{name} is already prepared in {builder.data_dir}")
    return builder.data_dir
  if source_dir is not None:
    echo(f"preparing {name} in {data_dir} with TFDS from the files in "
         f"{source_dir} (no download)")
  else:
    echo(f"preparing {name} in {data_dir} with TFDS (downloads and converts; "
         "CIFAR takes a few minutes, ImageNet hours)")
  _check_writable(name, data_dir, given)
  absent = _absent_directories(data_dir, builder)
  try:
    with _preparing(data_dir):
      for leftover in _leftovers(data_dir, builder):
        shutil.rmtree(leftover, ignore_errors=True)
        echo(f"removed {leftover}, left by a preparation that was stopped")
      _STOP_CLEANUP[:] = [lambda: _remove_attempt(data_dir, builder, absent)]
      try:
        _download_and_prepare(name, builder, data_dir, source_dir,
                              download_config)
      finally:
        _STOP_CLEANUP.clear()
  except BaseException as e:
    # What this attempt created and left empty goes too: the listing of
    # DATA_DIR is what it was (TFDS removes its own incomplete directory).
    for directory in absent:
      try:
        os.rmdir(directory)
      except OSError:  # Absent, or not empty (a partial download to resume).
        pass
    if isinstance(e, OSError) and not isinstance(e, ConnectionError):
      # Creating or holding DATA_DIR's directories (a closed output is the
      # command layer's to say).
      raise errors.DataError(*_unwritable_message(name, data_dir, given,
                                                  e)) from None
    raise
  return builder.data_dir


def _unwritable_message(name, data_dir, given, error):
  """The parts of one line for OSError ERROR met writing into DATA_DIR."""
  where = f" ({error.filename})" if error.filename else ""
  return (f"could not prepare {name} in {_where(data_dir, given)}: "
          f"{error.strerror or error}{where}; give a --data_dir you can write "
          "to (or make it writable); nothing was kept from this attempt",)


def _check_writable(name, data_dir, given):
  """DataError (one line) unless a preparation can write into DATA_DIR:
  where it exists, an empty file created and removed in it; else the
  nearest directory above it that exists must let it be created (nothing
  is written there)."""
  if "://" in data_dir:
    return
  existing = os.path.abspath(data_dir)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  try:
    if existing == os.path.abspath(data_dir):
      probe = os.path.join(existing, f".write-probe-{uuid.uuid4().hex[:12]}")
      with open(probe, "x"):
        pass
      os.remove(probe)
    elif not os.path.isdir(existing):
      raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR),
                               existing)
    elif not os.access(existing, os.W_OK | os.X_OK):
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES),
                            existing)
  except OSError as e:
    raise errors.DataError(*_unwritable_message(name, data_dir, given,
                                                e)) from None


def _source_dir(name, source_dir):
  """SOURCE_DIR, checked; else Debian's directory of NAME's files where the
  package is installed; else None (download)."""
  if source_dir is not None:
    if not os.path.isdir(source_dir):
      raise errors.DataError(f"--source_dir={source_dir} is not a directory")
    return source_dir
  if name in datasets.DEBIAN_SOURCES and os.path.isdir(
      datasets.DEBIAN_SOURCES[name][1]):
    return datasets.DEBIAN_SOURCES[name][1]
  return None


def _download_config(name, data_dir, source_dir):
  """TFDS's DownloadConfig for NAME; ValueError if ImageNet's archives are
  not in place."""
  tfds = tfds_module()
  if name == "imagenet2012":
    manual = manual_dir(data_dir)
    missing = [f for f in IMAGENET_ARCHIVES
               if not tf.io.gfile.exists(os.path.join(manual, f))]
    if missing:
      raise errors.DataError(
          f"imagenet2012 needs {' and '.join(missing)} in {manual}: download "
          "them from image-net.org (registration required) and run this again")
    return tfds.download.DownloadConfig(manual_dir=manual)
  # TFDS would first look for a prepared copy on Google Cloud Storage: not
  # wanted when the files are here, and slow to fail offline.
  return tfds.download.DownloadConfig(try_download_gcs=source_dir is None)


def _absent_directories(data_dir, builder):
  """The local directories a preparation of BUILDER in DATA_DIR may create
  that do not exist yet, deepest first."""
  if "://" in data_dir:
    return []
  data_dir = os.path.normpath(data_dir)
  candidates = [data_dir, os.path.join(data_dir, "downloads")]
  # DATA_DIR/NAME[/CONFIG]/VERSION and the directories above it in DATA_DIR.
  directory = os.path.normpath(os.fspath(builder.data_dir))
  while directory.startswith(data_dir + os.sep):
    candidates.append(directory)
    directory = os.path.dirname(directory)
  return sorted((d for d in candidates if not os.path.exists(d)), key=len,
                reverse=True)


@contextlib.contextmanager
def _preparing(data_dir):
  """Holds DATA_DIR (created if need be) for one preparation: an exclusive
  `flock` on the directory itself (no lock file in it), released by the
  system however the process ends. ValueError (one line) if another
  preparation holds it. Directories only TensorFlow reads are not held."""
  if "://" in data_dir:
    yield
    return
  os.makedirs(data_dir, exist_ok=True)
  descriptor = os.open(data_dir, os.O_RDONLY)
  try:
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise errors.DataError(
          f"another prepare_data is preparing a dataset in --data_dir="
          f"{data_dir}; wait for it to finish, then run this again (a "
          "dataset it prepared is then left as it is)") from None
    yield
  finally:
    os.close(descriptor)  # Releases the lock.


# While a preparation holds its data_dir: what `stop_preparation` runs.
_STOP_CLEANUP = []
# The download manager of the running preparation from local files, if any.
_LOCAL = []


def stop_preparation():
  """Undoes the running preparation (if any), for a signal handler that
  then ends the process: stops the extraction, removes the scratch and
  incomplete directories (`_leftovers`: all are this preparation's, which
  holds the data_dir) and the directories it created. Unwinding the stack
  from a signal instead could stop inside TFDS holding a lock that its
  cleanup then waits for."""
  for local in _LOCAL:
    local.finish(wait=10)
  for cleanup in list(_STOP_CLEANUP):
    cleanup()


def _remove_attempt(data_dir, builder, absent):
  for leftover in _leftovers(data_dir, builder):
    shutil.rmtree(leftover, ignore_errors=True)
  for directory in absent:
    try:
      os.rmdir(directory)
    except OSError:  # Absent, or not empty (a partial download to resume).
      pass


def _leftovers(data_dir, builder):
  """What a preparation in DATA_DIR stopped by SIGKILL (or a power cut)
  leaves, for the one that holds DATA_DIR to remove: the scratch
  directories of local files (downloads/.local-*) and TFDS's incomplete
  directories of BUILDER's dataset."""
  if "://" in data_dir:
    return []
  incomplete = tfds_module().core.constants.INCOMPLETE_PREFIX
  dataset_dir = os.path.dirname(os.path.normpath(os.fspath(builder.data_dir)))
  found = glob.glob(os.path.join(glob.escape(data_dir), "downloads",
                                 ".local-*"))
  found += glob.glob(os.path.join(glob.escape(dataset_dir),
                                  f"{incomplete}*"))
  return sorted(path for path in found if os.path.isdir(path))


def _registered_sizes(builder):
  """{file name: bytes} of the files TFDS registers for BUILDER's dataset
  ({} where it registers none)."""
  try:
    infos = builder.url_infos or {}
  except Exception:  # pylint: disable=broad-except
    return {}
  return {os.path.basename(url.split("?")[0]): int(info.size)
          for url, info in infos.items() if info.size}


def _download_and_prepare(name, builder, data_dir, source_dir,
                          download_config):
  """Runs TFDS's preparation of NAME (BUILDER), its files from SOURCE_DIR
  if not None; a failure becomes a ValueError of one line saying what to
  do."""
  local = None
  if source_dir is not None:
    # TFDS has no public way to hand a builder local files whose checksums
    # differ from the registered ones; the download manager is the one place
    # where downloading happens, so it is the one thing replaced.
    # Extracted into a directory of this attempt alone, removed after it:
    # what a failed attempt extracted (from a truncated file, say) is never
    # taken for the files of the next one.
    os.makedirs(os.path.join(data_dir, "downloads"), exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".local-", dir=os.path.join(
        data_dir, "downloads"))
    local = _local_download_manager(source_dir, scratch, name,
                                    _registered_sizes(builder))
    builder._make_download_manager = lambda **unused: local  # pylint: disable=protected-access
    _LOCAL[:] = [local]
  try:
    builder.download_and_prepare(download_config=download_config)
  except Exception as e:  # pylint: disable=broad-except
    if local is not None and local.problem:
      raise errors.DataError(local.problem) from None
    # Network failures surface as many different exception types; the user
    # needs one line and the way out, not TFDS's traceback.
    problem = (str(e).strip().splitlines() or [type(e).__name__])[0]
    cause = e
    while cause is not None and not (isinstance(cause, OSError) and
                                     cause.errno == errno.ENOSPC):
      cause = cause.__cause__ or cause.__context__
    refused = e
    while refused is not None and not (
        isinstance(refused, OSError) and
        refused.errno in (errno.EACCES, errno.EPERM, errno.EROFS)):
      refused = refused.__cause__ or refused.__context__
    if refused is not None:
      raise errors.DataError(*_unwritable_message(
          name, data_dir, True, refused)) from None
    if cause is not None or "No space left on device" in str(e):
      raise errors.DataError(
          f"could not prepare {name} in {data_dir}: no space left on its "
          "device; free space (or pick another --data_dir) and run this "
          "again; nothing was kept from this attempt") from None
    advice = (f"check the files it read from {source_dir} ("
              f"{', '.join(sorted(set(local.used)))}: one may be cut short "
              "or not the dataset's); nothing was kept from this attempt"
              if local is not None else
              "on a machine without internet access prepare it elsewhere and "
              "copy the directory here, or pass --source_dir with the files "
              "it downloads")
    raise errors.DataError(
        f"could not prepare {name} in {data_dir} ("
        f"{type(e).__name__}: {problem}); {advice}") from e
  finally:
    if local is not None:
      local.finish()
      _LOCAL.clear()
      shutil.rmtree(scratch, ignore_errors=True)


def tfds_arrays(builder, split, stop, image_shape):
  """Split SPLIT[:STOP] of a small TFDS dataset, decoded, in memory.

  Returns (images uint8 [n, *IMAGE_SHAPE], labels int32 [n]).
  """
  tfds = tfds_module()
  ds = builder.as_dataset(split=f"{split}[:{stop}]", shuffle_files=False,
                          read_config=tfds.ReadConfig(
                              interleave_cycle_length=1))
  ds = ds.map(tf.autograph.experimental.do_not_convert(
      lambda ex: (ex[IMAGE], tf.cast(ex[LABEL], tf.int32))),
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
  if name == datasets.SYNTHETIC:
    images, labels = synthetic.arrays(split)
    return images[:num_examples], labels[:num_examples], datasets.synthetic_info()
  builder = prepared_builder(name, data_dir, split)
  info = info_from_builder(builder)
  if None in info.image_shape:
    raise errors.DataError(
        f"{name} has images of varying size; they are streamed, "
        "not loaded into memory")
  size = builder.info.splits[split].num_examples
  stop = size if num_examples is None else min(num_examples, size)
  images, labels = tfds_arrays(builder, split, stop, info.image_shape)
  return images, labels, info


