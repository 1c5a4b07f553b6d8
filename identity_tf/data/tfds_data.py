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

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from identity_tf import cli
from identity_tf.data import datasets
from identity_tf.data import synthetic

class DatasetNotReadyError(ValueError):
  """A TFDS dataset that is not prepared in the data directory.

  The message is one line naming --data_dir and how to prepare the dataset.
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
    raise ValueError(
        f"unknown dataset {name!r}: not {datasets.SYNTHETIC} and not a dataset of "
        f"tensorflow-datasets {tfds.__version__} (see "
        "https://www.tensorflow.org/datasets/catalog)") from None


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
  if name == "imagenet2012":
    return (f"put ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from "
            f"image-net.org into {manual_dir(data_dir)} and run '"
            + cli.command("prepare_data", f"--dataset=imagenet2012 "
                          f"--data_dir={data_dir}")
            + "' (no internet needed)")
  command = ("'" + cli.command("prepare_data", f"--dataset={name} "
                               f"--data_dir={data_dir}") + "'")
  if name in datasets.DEBIAN_SOURCES:
    return (f"run 'apt-get install {datasets.DEBIAN_SOURCES[name][0]}', then "
            f"{command} (no internet needed)")
  return (f"run {command} on a machine with internet access and copy that "
          "directory here")


def _not_ready_message(name, data_dir, given, problem):
  """One line: what is missing where, and how to prepare it."""
  where = (f"--data_dir={data_dir}" if given else
           f"{data_dir} (TFDS's default; --data_dir not set)")
  return (f"dataset {name} is not prepared in {where} ({problem}): "
          f"{_how_to_prepare(name, data_dir)}, or pass --data_dir pointing "
          f"to a prepared copy (or use --dataset={datasets.SYNTHETIC})")


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
    raise DatasetNotReadyError(_not_ready_message(
        name, data_dir, given, "a file, not a directory"
        if tf.io.gfile.exists(data_dir) else "no such directory"))
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
  tfds = tfds_module()

  class LocalFiles(tfds.download.DownloadManager):

    missing = None  # The one-line error, once a file was not found.
    used = []  # The files of SOURCE_DIR it was given, for error messages.

    def download(self, url_or_urls):
      def local(url):
        url = getattr(url, "url", url)  # A str or a tfds.download.Resource.
        path = os.path.join(source_dir, os.path.basename(url.split("?")[0]))
        self.used = self.used + [os.path.basename(path)]
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
  of the Debian package that installs them (`datasets.DEBIAN_SOURCES`: Fashion-MNIST
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
  if name == datasets.SYNTHETIC:
    raise ValueError(f"dataset {datasets.SYNTHETIC} is generated in process; there is "
                     "nothing to prepare")
  tfds = tfds_module()
  data_dir = os.fspath(data_dir) if data_dir else tfds.core.constants.DATA_DIR
  builder = _builder(name, data_dir)
  if source_dir is not None and not os.path.isdir(source_dir):
    raise ValueError(f"--source_dir={source_dir} is not a directory")
  if source_dir is None and name in datasets.DEBIAN_SOURCES and os.path.isdir(
      datasets.DEBIAN_SOURCES[name][1]):
    source_dir = datasets.DEBIAN_SOURCES[name][1]
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
    # Extracted into a directory of this attempt alone, removed after it:
    # what a failed attempt extracted (from a truncated file, say) is never
    # taken for the files of the next one.
    os.makedirs(os.path.join(data_dir, "downloads"), exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".local-", dir=os.path.join(
        data_dir, "downloads"))
    local = _local_download_manager(source_dir, scratch, name)
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
    advice = (f"check the files it read from {source_dir} ("
              f"{', '.join(sorted(set(local.used)))}: one may be cut short "
              "or not the dataset's); nothing was kept from this attempt"
              if local is not None else
              "on a machine without internet access prepare it elsewhere and "
              "copy the directory here, or pass --source_dir with the files "
              "it downloads")
    raise ValueError(
        f"could not prepare {name} in {data_dir} ({type(e).__name__}: "
        f"{problem}); {advice}") from e
  finally:
    if local is not None:
      shutil.rmtree(scratch, ignore_errors=True)
  return builder.data_dir


def tfds_arrays(builder, split, stop, image_shape):
  """Split SPLIT[:STOP] of a small TFDS dataset, decoded, in memory.

  Returns (images uint8 [n, *IMAGE_SHAPE], labels int32 [n]).
  """
  tfds = tfds_module()
  ds = builder.as_dataset(split=f"{split}[:{stop}]", shuffle_files=False,
                          read_config=tfds.ReadConfig(
                              interleave_cycle_length=1))
  ds = ds.map(lambda ex: (ex[IMAGE], tf.cast(ex[LABEL], tf.int32)),
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
    raise ValueError(f"{name} has images of varying size; they are streamed, "
                     "not loaded into memory")
  size = builder.info.splits[split].num_examples
  stop = size if num_examples is None else min(num_examples, size)
  images, labels = tfds_arrays(builder, split, stop, info.image_shape)
  return images, labels, info


