"""Tests of identity_tf.data.pipeline: TFDS paths, augmentation, determinism.

The TFDS paths run for real: setUpClass writes tiny raw CIFAR-10/100 files and
fake ImageNet archives and lets TFDS's own cifar10, cifar100 and imagenet2012
builders prepare them (only the network fetch of the CIFAR archives is
replaced by the local directory), then the pipeline reads them back through
`tfds.builder(...).as_dataset`. `tfds.testing.mock_data` covers the same three
datasets with TFDS's random mock examples. `PreprocessingContractTest` reads
no data: the preprocessing as config.json stores it.
"""

import dataclasses
import importlib.resources
import importlib.resources.abc
import io
import gzip
import json
import os
import shutil
import sys
import tarfile
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from identity_tf import configs
from identity_tf import errors
from identity_tf.data import datasets
from identity_tf.data import pipeline as ip
from identity_tf.data import preprocessing
from identity_tf.data import synthetic
from identity_tf.data import tfds_data
from identity_tf.training import evaluation
from identity_tf.training import run as run_lib
import testing

# TFDS 4.9.10's download_and_prepare needs the `importlib_resources` backport,
# which pip does not install on Python >= 3.9; the standard library's
# importlib.resources provides what it uses (`abc.Traversable`).
sys.modules.setdefault("importlib_resources", importlib.resources)

CIFAR_PREFIXES = {"cifar10": "cifar-10-batches-bin",
                  "cifar100": "cifar-100-binary"}
FASHION_COUNTS = {"train": 24, "test": 12}


def _numpy_standardized(images):
  """Per-image standardisation written out: (x - mean) / max(std, 1/sqrt(N))."""
  images = images.astype(np.float64)
  axes = tuple(range(1, images.ndim))
  count = np.prod(images.shape[1:])
  mean = images.mean(axis=axes, keepdims=True)
  std = np.maximum(images.std(axis=axes, keepdims=True), 1 / np.sqrt(count))
  return (images - mean) / std
IMAGENET_TRAIN_SYNSETS = ("n01440764", "n01443537")  # Labels 0 and 1.


def _write_raw_cifar(directory, name, rng):
  """Writes CIFAR's binary files with random records; returns them by split.

  The format of cs.toronto.edu's archives: per record 1 label byte (CIFAR-10)
  or coarse + fine label bytes (CIFAR-100), then 3072 bytes of R, G, B planes.
  """
  prefix = os.path.join(directory, CIFAR_PREFIXES[name])
  os.makedirs(prefix)
  if name == "cifar10":
    files = {"train": [f"data_batch_{i}.bin" for i in range(1, 6)],
             "test": ["test_batch.bin"]}
    per_file = {"train": 8, "test": 12}
    label_files = {"batches.meta.txt": 10}
    classes = [10]
  else:
    files = {"train": ["train.bin"], "test": ["test.bin"]}
    per_file = {"train": 40, "test": 12}
    label_files = {"coarse_label_names.txt": 20, "fine_label_names.txt": 100}
    classes = [20, 100]
  for label_file, count in label_files.items():
    with open(os.path.join(prefix, label_file), "w") as f:
      f.write("".join(f"class{i}\n" for i in range(count)))
  records = {}
  for split, names in files.items():
    images, labels = [], []
    for file_name in names:
      n = per_file[split]
      file_labels = np.stack(
          [rng.integers(0, c, n) for c in classes], axis=1).astype(np.uint8)
      planes = rng.integers(0, 256, (n, 3, 32, 32)).astype(np.uint8)
      with open(os.path.join(prefix, file_name), "wb") as f:
        f.write(np.concatenate(
            [file_labels, planes.reshape(n, -1)], axis=1).tobytes())
      images.append(planes.transpose(0, 2, 3, 1))
      labels.append(file_labels[:, -1])  # The fine label is the last byte.
    records[split] = (np.concatenate(images), np.concatenate(labels))
  return records


def _jpeg(rng, height, width):
  return tf.io.encode_jpeg(
      rng.integers(0, 256, (height, width, 3)).astype(np.uint8)).numpy()


def _add_to_tar(tar, name, data):
  info = tarfile.TarInfo(name)
  info.size = len(data)
  tar.addfile(info, io.BytesIO(data))


def _write_imagenet_archives(manual_dir, rng):
  """ILSVRC2012_img_{train,val}.tar as image-net.org ships them, tiny."""
  os.makedirs(manual_dir)
  with tarfile.open(os.path.join(manual_dir, "ILSVRC2012_img_train.tar"),
                    "w") as train:
    for synset in IMAGENET_TRAIN_SYNSETS:
      inner_bytes = io.BytesIO()
      with tarfile.open(fileobj=inner_bytes, mode="w") as inner:
        for k in range(3):
          _add_to_tar(inner, f"{synset}_{k}.JPEG", _jpeg(rng, 40 + 10 * k, 60))
      _add_to_tar(train, synset + ".tar", inner_bytes.getvalue())
  with tarfile.open(os.path.join(manual_dir, "ILSVRC2012_img_val.tar"),
                    "w") as val:
    for k in range(1, 5):
      _add_to_tar(val, f"ILSVRC2012_val_{k:08d}.JPEG", _jpeg(rng, 50, 30 + k))


def _config(name):
  """The preprocessing of dataset NAME at its native size (224 for ImageNet);
  the features TFDS knows without the data are all it needs."""
  return datasets.preprocessing_config(tfds_data.dataset_info(name))


def _batches(ds, count=None):
  """The first COUNT (all if None) batches of DS as NumPy (images, labels)."""
  if count is not None:
    ds = ds.take(count)
  return [(x.numpy(), y.numpy()) for x, y in ds]


def _standardized(images):
  return tf.image.per_image_standardization(
      tf.constant(images, tf.float32)).numpy()


def _info(name, shape):
  """A `datasets.DatasetInfo` of NAME's images of SHAPE, written out."""
  return datasets.DatasetInfo(name, 10, shape, tuple("abcdefghij"), "train",
                              "test")


class PreprocessingContractTest(absltest.TestCase):
  """`datasets.Preprocessing` and the dict of config.json: no data read."""

  def test_fashion_mnist_at_32_is_written_as_config_json_holds_it(self):
    written = datasets.preprocessing_config(
        _info("fashion_mnist", (28, 28, 1)), 32).to_dict()
    # By hand: 28x28 grey images into the CIFAR network's 32x32 input,
    # translated by 32/8 pixels, flipped (clothes are not digits).
    self.assertEqual(json.dumps(written),
                     '{"channels": 1, "flip": true, "image_size": 32, '
                     '"input_size": [28, 28], "kind": "cifar", "pad": 4, '
                     '"standardize": "per_image"}')
    imagenet = datasets.preprocessing_config(
        _info("imagenet2012", (None, None, 3)))
    self.assertEqual(imagenet.to_dict(), {
        "kind": "imagenet", "image_size": 224, "channels": 3, "resize": 256,
        "crop_area_range": [0.08, 1.0],
        "crop_aspect_ratio_range": [0.75, 1.3333333333333333], "flip": True,
        "standardize": "per_channel", "mean": [123.675, 116.28, 103.53],
        "std": [58.395, 57.12, 57.375]})

  def test_every_kind_round_trips_through_json(self):
    for info, size, kind in (
        (_info("fashion_mnist", (28, 28, 1)), 32, "cifar"),
        (_info("mnist", (28, 28, 1)), 28, "cifar"),
        (datasets.synthetic_info(), 32, "cifar"),
        (_info("cifar10", (32, 32, 3)), 24, "imagenet"),
        (_info("imagenet2012", (None, None, 3)), 224, "imagenet"),
        (_info("grey", (None, None, 1)), 64, "imagenet")):
      config = datasets.preprocessing_config(info, size)
      self.assertEqual(config.kind, kind, info.name)
      stored = json.loads(json.dumps(config.to_dict()))
      self.assertEqual(datasets.Preprocessing.from_dict(stored), config)
      self.assertEqual(datasets.Preprocessing.from_dict(stored).to_dict(),
                       stored)
      self.assertIsInstance(config.input_shape, list)

  def test_dicts_of_older_versions_read_as_what_they_did(self):
    # The first config.json files had neither "channels" nor "input_size"
    # (RGB images of the input's size).
    cifar = {"kind": "cifar", "image_size": 32, "pad": 4, "flip": True,
             "standardize": "per_image"}
    self.assertEqual(datasets.Preprocessing.from_dict(cifar),
                     datasets.preprocessing_config(
                         _info("cifar10", (32, 32, 3)), 32))
    imagenet = datasets.preprocessing_config(
        _info("imagenet2012", (None, None, 3))).to_dict()
    del imagenet["channels"]
    self.assertEqual(datasets.Preprocessing.from_dict(imagenet).channels, 3)
    with open(os.path.join(testing.source_root(), "tests", "testdata",
                           "run_5d502b4", "config.json")) as f:
      stored = json.load(f)["preprocessing"]
    self.assertEqual(datasets.Preprocessing.from_dict(stored).to_dict(),
                     stored)

  def test_a_dict_that_is_no_preprocessing_is_one_data_error(self):
    good = datasets.preprocessing_config(_info("cifar10", (32, 32, 3)))
    for change, message in (
        ({"kind": "mnist"}, "unknown preprocessing kind 'mnist'"),
        ({"standardize": "none"}, "unknown standardize 'none'"),
        ({"channels": 2}, "channels must be 1 or 3"),
        ({"image_size": "big"}, "image_size is 'big', not an integer"),
        ({"resize": 36}, "with per_image standardisation has no resize"),
        ({"mean": [1, 2, 3]}, "has no mean"),
        ({"scale": 2}, "with unknown scale")):
      with self.assertRaisesRegex(errors.DataError, message, msg=change):
        datasets.Preprocessing.from_dict({**good.to_dict(), **change})
    without_pad = good.to_dict()
    del without_pad["pad"]
    with self.assertRaisesRegex(errors.DataError, "needs pad"):
      datasets.Preprocessing.from_dict(without_pad)
    with self.assertRaisesRegex(errors.DataError, "got list"):
      datasets.Preprocessing.from_dict([good.to_dict()])


def _numpy_statistics(images):
  """Each channel's mean and population std over all of IMAGES' pixels,
  in float64, as NumPy computes them."""
  images = np.asarray(images, np.float64)
  return images.mean(axis=(0, 1, 2)), images.std(axis=(0, 1, 2))


class PerChannelStatisticsTest(tf.test.TestCase):
  """--standardize=per_channel on CIFAR-sized images: the training
  examples' statistics, on `synthetic` and generated arrays (no TFDS)."""

  COUNT = 160

  def _run(self, **overrides):
    return run_lib.prepare(configs.from_preset(
        "smoke", standardize="per_channel", num_train_examples=self.COUNT,
        batch_size=16, **overrides), datasets.synthetic_info(), None)

  def test_the_run_records_numpys_statistics_of_its_training_examples(self):
    config = self._run().preprocessing
    self.assertEqual((config.kind, config.standardize),
                     ("cifar", "per_channel"))
    train = synthetic.arrays("train")[0][:self.COUNT]
    mean, std = _numpy_statistics(train)
    np.testing.assert_allclose(config.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(config.std, std, rtol=1e-12)
    # Not the test split's (a few tenths of a level apart here).
    test_mean, test_std = _numpy_statistics(
        synthetic.arrays("test")[0][:self.COUNT])
    self.assertGreater(np.abs(np.array(config.mean) - test_mean).max(), 0.05)
    self.assertGreater(np.abs(np.array(config.std) - test_std).max(), 0.05)
    # Random pixels at every level, in blocks of uneven size.
    pixels = np.random.default_rng(3).integers(
        0, 256, (2500, 5, 4, 3)).astype(np.uint8)
    for got, expected in zip(datasets.rgb_statistics(pixels),
                             _numpy_statistics(pixels)):
      np.testing.assert_allclose(got, expected, rtol=1e-12)

  def test_the_training_split_comes_out_at_zero_mean_and_unit_std(self):
    config = self._run().preprocessing
    # Evaluation preprocessing of the whole training split ...
    batches = _batches(ip.build_dataset(
        "synthetic", "train", 64, training=False, num_examples=self.COUNT,
        preprocessing=config))
    images = np.concatenate([x for x, _ in batches]).astype(np.float64)
    self.assertLen(images, self.COUNT)
    self.assertAllClose(images.mean(axis=(0, 1, 2)), np.zeros(3), atol=1e-5)
    self.assertAllClose(images.std(axis=(0, 1, 2)), np.ones(3), atol=1e-5)
    # ... and training's, before its augmentation pads: the same numbers
    # after the crop and flip (NumPy's division here).
    raw = tf.constant(synthetic.arrays("train")[0][:4])
    for i in range(4):
      seeds = preprocessing.example_seeds(5, i, 0, 2)
      moved = preprocessing.random_pad_crop_flip(raw[i], config,
                                                 seeds).numpy()
      self.assertAllClose(
          preprocessing.augment_cifar(raw[i], config, seeds).numpy(),
          (moved - np.array(config.mean)) / np.array(config.std), atol=1e-5)

  def test_grayscale_takes_its_one_channels_statistics_three_times(self):
    grey = np.random.default_rng(5).integers(0, 200, (40, 28, 28, 1)).astype(
        np.uint8)
    mean, std = datasets.rgb_statistics(grey)
    (one_mean,), (one_std,) = _numpy_statistics(grey)
    self.assertLen(set(mean), 1)
    self.assertLen(set(std), 1)
    np.testing.assert_allclose(mean, [one_mean] * 3, rtol=1e-12)
    np.testing.assert_allclose(std, [one_std] * 3, rtol=1e-12)
    # The images, replicated into R, G and B and padded to 32x32 by the
    # preprocessing, normalised in every channel by those numbers.
    config = datasets.preprocessing_config(
        _info("fashion_mnist", (28, 28, 1)), 32, standardize="per_channel",
        statistics=(mean, std))
    out = preprocessing.preprocess_for_eval(grey, config).numpy()
    expected = (np.repeat(np.pad(grey.astype(np.float64),
                                 [(0, 0), (2, 2), (2, 2), (0, 0)]), 3, axis=3)
                - one_mean) / one_std
    self.assertAllClose(out, expected, atol=1e-5)
    self.assertAllClose(out[:, 2:30, 2:30].mean(axis=(0, 1, 2)),
                        np.zeros(3), atol=1e-5)

  def test_another_dataset_is_evaluated_with_the_models_statistics(self):
    # //bin:evaluate --dataset=OTHER: OTHER's images (here 28x28 grey) at
    # the model's input, normalised with the numbers the model trained on.
    trained = self._run().preprocessing
    other = evaluation._other_datasets_preprocessing(  # pylint: disable=protected-access
        _info("fashion_mnist", (28, 28, 1)), trained)
    self.assertEqual((other.kind, other.input_size, other.channels,
                      other.standardize, other.mean, other.std),
                     ("cifar", (28, 28), 1, "per_channel", trained.mean,
                      trained.std))
    plain = evaluation._other_datasets_preprocessing(  # pylint: disable=protected-access
        _info("fashion_mnist", (28, 28, 1)),
        datasets.preprocessing_config(datasets.synthetic_info()))
    self.assertEqual((plain.standardize, plain.mean), ("per_image", None))

  def test_statistics_that_cannot_normalise_are_one_data_error(self):
    for images, message in (
        (np.zeros((0, 4, 4, 3), np.uint8), "N > 0"),
        (np.zeros((2, 4, 4, 2), np.uint8), "1 or 3"),
        (np.zeros((2, 4, 4, 3), np.float32), "uint8"),
        (np.full((2, 4, 4, 1), 7, np.uint8), "constant"),
    ):
      with self.assertRaisesRegex(errors.DataError, message):
        datasets.rgb_statistics(images)
    with self.assertRaisesRegex(errors.DataError, "needs the mean and std"):
      datasets.preprocessing_config(datasets.synthetic_info(),
                                    standardize="per_channel")

  def test_larger_images_take_imagenets_or_per_image_standardisation(self):
    # --standardize on ImageNet-sized images: per_channel is their default,
    # ImageNet's constants; per_image standardises each crop. Neither reads
    # any data.
    imagenet = tfds_data.dataset_info("imagenet2012")
    for standardize in ("per_channel", "per_image"):
      config = run_lib.prepare(configs.from_preset(
          "imagenet_paper", standardize=standardize), imagenet,
                               None).preprocessing
      self.assertEqual((config.kind, config.standardize),
                       ("imagenet", standardize))
      if standardize == "per_channel":
        self.assertEqual((config.mean, config.std),
                         (datasets.IMAGENET_MEAN, datasets.IMAGENET_STD))
      else:
        self.assertIsNone(config.mean)
    # The shorter side is 256 already: the central 224x224, standardised.
    images = np.random.default_rng(6).integers(0, 256, (2, 256, 300, 3))
    out = preprocessing.preprocess_for_eval(images.astype(np.uint8),
                                            config).numpy()
    self.assertAllClose(out, _numpy_standardized(images[:, 16:240, 38:262]),
                        atol=1e-4)
    augmented = preprocessing.augment_imagenet(
        tf.constant(images[0], tf.uint8), config,
        tf.constant([[1, 2], [3, 4]])).numpy()
    self.assertAllClose((augmented.mean(), augmented.std()), (0.0, 1.0),
                        atol=1e-4)


class InputPipelineTest(testing.SharedRoot, tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    tfds.disable_progress_bar()
    cls.data_dir = os.path.join(cls.root, "data")
    rng = np.random.default_rng(0)
    cls.raw = {}
    for name in ("cifar10", "cifar100"):
      raw_dir = os.path.join(cls.root, name + "_raw")
      cls.raw[name] = _write_raw_cifar(raw_dir, name, rng)
      builder = tfds.builder(name, data_dir=cls.data_dir)
      # The only step that would use the network: fetching the archive.
      with mock.patch.object(tfds.download.DownloadManager,
                             "download_and_extract", return_value=raw_dir):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(
                try_download_gcs=False))
    manual_dir = os.path.join(cls.root, "manual")
    _write_imagenet_archives(manual_dir, rng)
    tfds.builder("imagenet2012", data_dir=cls.data_dir).download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            manual_dir=manual_dir, try_download_gcs=False))
    # Fashion-MNIST the way bin/prepare_data prepares it offline: TFDS's own
    # builder, its files from a local directory.
    cls.fashion_raw = os.path.join(cls.root, "fashion_raw")
    cls.raw["fashion_mnist"] = testing.write_fashion_mnist_files(
        cls.fashion_raw, rng, FASHION_COUNTS)
    with testing.fewer_mnist_examples(FASHION_COUNTS):
      tfds_data.prepare("fashion_mnist", cls.data_dir, source_dir=cls.fashion_raw,
                 echo=lambda line: None)

  # --- contract -----------------------------------------------------------

  def test_dataset_info_is_read_from_tfds(self):
    # Prepared: the sizes and label names of the files setUpClass wrote.
    cifar10 = tfds_data.dataset_info("cifar10", self.data_dir)
    self.assertEqual(
        (cifar10.num_classes, cifar10.image_shape, cifar10.train_split,
         cifar10.eval_split, cifar10.num_train_examples,
         cifar10.num_eval_examples),
        (10, (32, 32, 3), "train", "test", 5 * 8, 12))
    self.assertEqual(cifar10.class_names, tuple(f"class{i}" for i in range(10)))
    cifar100 = tfds_data.dataset_info("cifar100", self.data_dir)
    self.assertEqual((cifar100.num_classes, cifar100.num_train_examples),
                     (100, 40))  # The fine labels.
    imagenet = tfds_data.dataset_info("imagenet2012", self.data_dir)
    self.assertEqual((imagenet.image_shape, imagenet.eval_split,
                      imagenet.num_train_examples, imagenet.num_eval_examples,
                      imagenet.jpeg), ((None, None, 3), "validation", 6, 4,
                                       True))
    fashion = tfds_data.dataset_info("fashion_mnist", self.data_dir)
    self.assertEqual((fashion.image_shape, fashion.num_train_examples,
                      fashion.num_eval_examples),
                     ((28, 28, 1), FASHION_COUNTS["train"],
                      FASHION_COUNTS["test"]))
    self.assertEqual(fashion.class_names[:2], ("T-shirt/top", "Trouser"))
    # Not prepared: what TFDS's code says, without sizes.
    svhn = tfds_data.dataset_info("svhn_cropped", self.create_tempdir().full_path)
    self.assertEqual((svhn.num_classes, svhn.image_shape,
                      svhn.num_train_examples), (10, (32, 32, 3), None))
    synthetic = tfds_data.dataset_info("synthetic")
    self.assertEqual((synthetic.num_train_examples, synthetic.eval_split),
                     (10_000, "test"))
    self.assertEqual(json.loads(json.dumps(fashion.to_dict()))["image_shape"],
                     [28, 28, 1])
    with self.assertRaisesRegex(ValueError, "unknown dataset 'no_such'"):
      tfds_data.dataset_info("no_such")
    with self.assertRaisesRegex(ValueError,
                                "not an image-classification dataset"):
      tfds_data.dataset_info("imdb_reviews")

  def test_preprocessing_follows_the_image_size(self):
    fashion = tfds_data.dataset_info("fashion_mnist", self.data_dir)
    small = datasets.preprocessing_config(fashion, 32)
    self.assertEqual(
        (small.kind, small.image_size, small.input_size, small.channels,
         small.pad, small.flip),
        ("cifar", 32, (28, 28), 1, 4, True))
    self.assertEqual(small.input_shape, [28, 28, 1])
    self.assertEqual(datasets.preprocessing_config(fashion).image_size, 28)
    mnist = tfds_data.dataset_info("mnist", self.data_dir)
    self.assertFalse(datasets.preprocessing_config(mnist, 32).flip)  # Digits.
    self.assertTrue(datasets.preprocessing_config(mnist, 32, flip=True).flip)
    imagenet = datasets.preprocessing_config(
        tfds_data.dataset_info("imagenet2012", self.data_dir), 224)
    self.assertEqual((imagenet.kind, imagenet.resize), ("imagenet", 256))
    # Larger than the network's input: cropped and resized like ImageNet.
    self.assertEqual(datasets.preprocessing_config(
        tfds_data.dataset_info("cifar10", self.data_dir), 24).kind, "imagenet")
    for config in (small, imagenet):
      self.assertEqual(datasets.Preprocessing.from_dict(
          json.loads(json.dumps(config.to_dict()))), config)
    with self.assertRaisesRegex(ValueError, "less than half"):
      datasets.preprocessing_config(fashion, 224)
    with self.assertRaisesRegex(ValueError, "unknown split 'validation'"):
      ip.build_dataset("synthetic", "validation", 8, training=False)
    with self.assertRaisesRegex(ValueError, "batch_size must be a positive"):
      ip.build_dataset("synthetic", "train", 0, training=True)
    with self.assertRaisesRegex(ValueError, "does not fit synthetic's"):
      ip.build_dataset("synthetic", "train", 8, training=True,
                       preprocessing=small)
    with self.assertRaisesRegex(ValueError, "start_step must be"):
      ip.build_dataset("synthetic", "test", 8, training=False, start_step=3)
    with self.assertRaisesRegex(ValueError, "unknown preprocessing kind"):
      datasets.Preprocessing.from_dict({"kind": "mnist"})
    # The ops take the typed preprocessing, not config.json's dict.
    with self.assertRaisesRegex(ValueError, "must be a datasets.Preprocessing"):
      preprocessing.preprocess_for_eval(tf.zeros([1, 32, 32, 3]),
                                        small.to_dict())

  # --- missing datasets ---------------------------------------------------

  def test_prepare_refuses_what_it_cannot_do(self):
    empty = self.create_tempdir().full_path
    with self.assertRaisesRegex(ValueError, "generated in process"):
      tfds_data.prepare("synthetic", empty)
    with self.assertRaisesRegex(
        ValueError, "imagenet2012 needs ILSVRC2012_img_train.tar and "
        "ILSVRC2012_img_val.tar in " + os.path.join(empty, "downloads", "manual")):
      tfds_data.prepare("imagenet2012", empty)
    # An unknown name is refused from what TFDS ships, offline, without
    # touching the home directory (the suite runs with an unwritable HOME and
    # no network: tests/fresh_machine_test.py).
    with self.assertRaisesRegex(ValueError,
                                "^unknown dataset 'no_such_dataset': "):
      tfds_data.prepare("no_such_dataset", empty)
    self.assertEqual(os.listdir(empty), [])

  def test_missing_dataset_is_one_clear_error(self):
    empty = self.create_tempdir().full_path
    cases = [
        ("cifar10", empty, ["--data_dir=" + empty,
                            "bazel run //bin:prepare_data -- --dataset=cifar10 "
                            f"--data_dir={empty}"]),
        ("cifar100", os.path.join(empty, "absent"),
         ["no such directory", "--dataset=cifar100"]),
        ("imagenet2012", empty,
         [os.path.join(empty, "downloads", "manual"), "ILSVRC2012_img_train",
          "--dataset=imagenet2012"]),
        ("fashion_mnist", empty,
         ["apt-get install dataset-fashion-mnist",
          "--dataset=fashion_mnist", "no internet needed"]),
    ]
    for name, data_dir, expected in cases:
      split = tfds_data.dataset_info(name).train_split
      with self.assertRaises(tfds_data.DatasetNotReadyError) as caught:
        ip.build_dataset(name, split, 4, training=True, data_dir=data_dir)
      message = str(caught.exception)
      self.assertIsInstance(caught.exception, ValueError)
      self.assertNotIn("\n", message)
      self.assertIn("--data_dir", message)
      for text in expected:
        self.assertIn(text, message)
    # Without --data_dir: TFDS's default directory, named as such.
    with mock.patch.object(tfds.core.constants, "DATA_DIR", empty):
      with self.assertRaisesRegex(tfds_data.DatasetNotReadyError,
                                  f"{empty} \\(TFDS's default; --data_dir not"):
        ip.build_dataset("cifar10", "test", 4, training=False)
    self.assertEqual(os.listdir(empty), [])  # Nothing was downloaded.

  # --- the real TFDS path -------------------------------------------------

  def test_prepared_cifar_reads_back_exactly(self):
    for name in ("cifar10", "cifar100"):
      raw_images, raw_labels = self.raw[name]["test"]
      batches = _batches(ip.build_dataset(
          name, "test", 5, training=False, data_dir=self.data_dir))
      self.assertEqual([len(y) for _, y in batches], [5, 5, 2])
      images = np.concatenate([x for x, _ in batches])
      labels = np.concatenate([y for _, y in batches])
      self.assertEqual(images.dtype, np.float32)
      self.assertEqual(labels.dtype, np.int32)
      # TFDS shuffles records when preparing: match each example to its raw
      # record. CIFAR-100's labels must be the fine ones (last label byte).
      expected = _standardized(raw_images)
      matched = []
      for image, label in zip(images, labels):
        distance = np.abs(expected - image).max(axis=(1, 2, 3))
        matched.append(int(np.argmin(distance)))
        self.assertLess(distance[matched[-1]], 1e-4)
        self.assertEqual(label, raw_labels[matched[-1]])
      self.assertCountEqual(matched, range(len(raw_labels)))
      if name == "cifar100":
        self.assertGreater(labels.max(), 19)  # Fine, not coarse, labels.

      train = _batches(ip.build_dataset(name, "train", 8, training=True,
                                        data_dir=self.data_dir), 6)
      self.assertEqual(train[0][0].shape, (8, 32, 32, 3))
      self.assertContainsSubset(set(np.concatenate([y for _, y in train])),
                                set(self.raw[name]["train"][1]))

  def test_prepared_imagenet(self):
    labels_txt = (tfds.core.tfds_path("datasets/imagenet2012/labels.txt")
                  .read_text().split())
    validation_txt = (tfds.core.tfds_path(
        "datasets/imagenet2012/validation_labels.txt").read_text().split())
    batches = _batches(ip.build_dataset(
        "imagenet2012", "validation", 3, training=False,
        data_dir=self.data_dir))
    self.assertEqual([x.shape for x, _ in batches],
                     [(3, 224, 224, 3), (1, 224, 224, 3)])
    labels = np.concatenate([y for _, y in batches])
    self.assertCountEqual(
        labels, [labels_txt.index(s) for s in validation_txt[:4]])
    train = ip.build_dataset("imagenet2012", "train", 4, training=True,
                             data_dir=self.data_dir, deterministic=True)
    first = _batches(train, 3)
    for images, labels in first:
      self.assertEqual(images.shape, (4, 224, 224, 3))
      self.assertTrue(np.all(np.isfinite(images)))
      self.assertContainsSubset(set(labels), {0, 1})
    again = _batches(ip.build_dataset(
        "imagenet2012", "train", 4, training=True, data_dir=self.data_dir,
        deterministic=True), 3)
    for (x1, y1), (x2, y2) in zip(first, again):
      self.assertAllEqual(y1, y2)
      self.assertAllEqual(x1, x2)
    # The streaming pipeline's iterator checkpoints too (shuffle buffer and
    # all), across the end of an epoch (6 examples = 1.5 batches).
    iterator = iter(train)
    next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(
        os.path.join(self.create_tempdir().full_path, "ckpt"))
    after = [next(iterator) for _ in range(3)]
    checkpoint.restore(path)
    for (x1, y1), (x2, y2) in zip(after, [next(iterator) for _ in range(3)]):
      self.assertAllEqual(y1, y2)
      self.assertAllEqual(x1, x2)

  def test_fashion_mnist_prepared_from_local_files_reads_back_exactly(self):
    for split in ("train", "test"):
      raw_images, raw_labels = self.raw["fashion_mnist"][split]
      images, labels, info = tfds_data.load_arrays("fashion_mnist", split,
                                            self.data_dir)
      self.assertEqual(images.shape, raw_images.shape)
      self.assertEqual(info.image_shape, (28, 28, 1))
      # TFDS may reorder records when preparing: match them up.
      order = [int(np.argmin(np.abs(raw_images.astype(int) - image).sum(
          axis=(1, 2, 3)))) for image in images]
      self.assertCountEqual(order, range(len(raw_labels)))
      np.testing.assert_array_equal(images, raw_images[order])
      np.testing.assert_array_equal(labels, raw_labels[order])
    # For the CIFAR network: 28x28 grey -> 32x32 RGB, zero-padded.
    config = datasets.preprocessing_config(
        tfds_data.dataset_info("fashion_mnist", self.data_dir), 32)
    (batch, _), = _batches(ip.build_dataset(
        "fashion_mnist", "train", 8, training=True, data_dir=self.data_dir,
        preprocessing=config), 1)
    self.assertEqual(batch.shape, (8, 32, 32, 3))
    np.testing.assert_array_equal(batch[..., 0], batch[..., 2])

  def test_prepare_finds_debians_files_and_names_missing_ones(self):
    data_dir = self.create_tempdir().full_path
    lines = []
    with testing.fewer_mnist_examples(FASHION_COUNTS), mock.patch.dict(
        datasets.DEBIAN_SOURCES,
        {"fashion_mnist": ("dataset-fashion-mnist", self.fashion_raw)}):
      tfds_data.prepare("fashion_mnist", data_dir, echo=lines.append)
    self.assertIn(f"from the files in {self.fashion_raw} (no download)",
                  lines[0])
    self.assertEqual(
        tfds_data.dataset_info("fashion_mnist", data_dir).num_train_examples,
        FASHION_COUNTS["train"])
    incomplete = self.create_tempdir().full_path
    shutil.copy(os.path.join(self.fashion_raw,
                             testing.FASHION_FILES["train"][0]), incomplete)
    with self.assertRaises(ValueError) as caught:
      tfds_data.prepare("fashion_mnist", self.create_tempdir().full_path,
                 source_dir=incomplete, echo=lambda line: None)
    message = str(caught.exception)
    self.assertNotIn("\n", message)
    # One of the three files that are not there, named with its address.
    self.assertRegex(message, f"^{incomplete} has no (t10k|train)-[a-z]+-"
                     "idx[13]-ubyte.gz, which fashion_mnist downloads from "
                     "http://fashion-mnist")
    self.assertNotIn(testing.FASHION_FILES["train"][0] + ",", message)
    with self.assertRaisesRegex(ValueError, "is not a directory"):
      tfds_data.prepare("fashion_mnist", data_dir, source_dir=incomplete + "/absent")

  def test_a_failed_preparation_does_not_poison_the_data_dir(self):
    # A file cut short inside a valid gzip: its idx header (magic, count,
    # rows, columns: 16 bytes) promises count x 28 x 28 pixels.
    truncated = os.path.join(self.create_tempdir().full_path, "raw")
    shutil.copytree(self.fashion_raw, truncated)
    name = testing.FASHION_FILES["test"][0]
    with gzip.open(os.path.join(self.fashion_raw, name)) as f:
      content = f.read()
    kept = len(content) // 2
    with gzip.open(os.path.join(truncated, name), "wb") as f:
      f.write(content[:kept])
    data_dir = self.create_tempdir().full_path
    with testing.fewer_mnist_examples(FASHION_COUNTS):
      with self.assertRaises(ValueError) as caught:
        tfds_data.prepare("fashion_mnist", data_dir, source_dir=truncated,
                          echo=lambda line: None)
      message = str(caught.exception)
      self.assertNotIn("\n", message)
      pixels = FASHION_COUNTS["test"] * 28 * 28
      self.assertTrue(message.startswith(
          f"{os.path.join(truncated, name)} is cut short: its header "
          f"describes {FASHION_COUNTS['test']} x 28 x 28 values ({pixels} "
          f"bytes after the header), but only {kept - 16} follow it; "
          "replace it with an intact copy (fashion_mnist downloads it "
          "from http"), message)
      # Nothing of the attempt is left, not even an empty directory...
      self.assertEqual(os.listdir(data_dir), [])
      # ...so the good files prepare in the same data_dir.
      tfds_data.prepare("fashion_mnist", data_dir, source_dir=self.fashion_raw,
                        echo=lambda line: None)
    self.assertEqual(
        tfds_data.dataset_info("fashion_mnist", data_dir).num_eval_examples,
        FASHION_COUNTS["test"])

  def test_idx_files_are_checked_against_their_header(self):
    directory = self.create_tempdir().full_path
    name = testing.FASHION_FILES["train"][1]  # Labels: magic 2049, count.
    with gzip.open(os.path.join(self.fashion_raw, name)) as f:
      content = f.read()
    count = FASHION_COUNTS["train"]
    cases = {
        "whole": (content, None),
        "one label more": (content + b"\x01", rf"^is longer than its header "
                           rf"says: its header describes {count} values "
                           rf"\({count} bytes after the header\), but "
                           rf"{count + 1} follow it$"),
        "header cut": (content[:6], "^is cut short inside its idx header$"),
        "not idx": (b"<html>", "^is not an idx file: "),
    }
    for case, (data, expected) in cases.items():
      path = os.path.join(directory, case.replace(" ", "_") + "-idx1-ubyte.gz")
      with gzip.open(path, "wb") as f:
        f.write(data)
      problem = tfds_data.idx_problem(path)
      if expected is None:
        self.assertIsNone(problem, case)
      else:
        self.assertRegex(problem, expected, case)
    # The gzip stream itself cut short.
    with open(os.path.join(self.fashion_raw, name), "rb") as f:
      compressed = f.read()
    path = os.path.join(directory, "cut-idx1-ubyte.gz")
    with open(path, "wb") as f:
      f.write(compressed[:len(compressed) // 2])
    self.assertRegex(tfds_data.idx_problem(path),
                     r"^is not a complete gzip file \(")
    # A data_dir that is a file is named as one; nothing is written.
    a_file = os.path.join(directory, "a_file")
    with open(a_file, "w") as f:
      f.write("x")
    with self.assertRaisesRegex(ValueError, f"^--data_dir={a_file} is a file, "
                                "not a directory: pass --data_dir=DIR"):
      tfds_data.prepare("fashion_mnist", a_file, source_dir=self.fashion_raw)
    with open(a_file) as f:
      self.assertEqual(f.read(), "x")

  def test_grayscale_is_padded_and_replicated_like_numpy_does(self):
    fashion = datasets.preprocessing_config(
        tfds_data.dataset_info("fashion_mnist", self.data_dir), 32)
    images = np.random.default_rng(7).integers(0, 256, (3, 28, 28, 1))
    # Evaluation: centred zero-padding 28 -> 32, grey into R, G and B, then
    # per-image standardisation.
    padded = np.repeat(np.pad(images, [(0, 0), (2, 2), (2, 2), (0, 0)]), 3,
                       axis=3)
    self.assertAllClose(preprocessing.preprocess_for_eval(images.astype(np.uint8),
                                               fashion),
                        _numpy_standardized(padded), atol=1e-5)
    # Training: a 32x32 window of the padded image, moved by up to 4 pixels.
    seeds = tf.constant([[1, 2], [3, 4]], tf.int32)
    crop = preprocessing.random_pad_crop_flip(images[0].astype(np.uint8), fashion,
                                   seeds).numpy()
    frame = np.pad(padded[0], [(4, 4), (4, 4), (0, 0)])
    windows = [frame[y:y + 32, x:x + 32] for y in range(9) for x in range(9)]
    self.assertTrue(any(np.array_equal(crop, w) or
                        np.array_equal(crop, w[:, ::-1]) for w in windows))

  def test_per_channel_statistics_of_a_prepared_grayscale_dataset(self):
    # TFDS's files (Fashion-MNIST's, written by setUpClass) read for the
    # statistics: its one channel's, three times, of the training split.
    info = tfds_data.dataset_info("fashion_mnist", self.data_dir)
    config = run_lib.prepare(configs.from_preset(
        "smoke", dataset="fashion_mnist", standardize="per_channel",
        batch_size=8), info, None, self.data_dir).preprocessing
    (mean,), (std,) = _numpy_statistics(
        self.raw["fashion_mnist"]["train"][0])
    self.assertEqual((config.channels, config.input_size), (1, (28, 28)))
    np.testing.assert_allclose(config.mean, [mean] * 3, rtol=1e-12)
    np.testing.assert_allclose(config.std, [std] * 3, rtol=1e-12)
    (test_mean,), _ = _numpy_statistics(self.raw["fashion_mnist"]["test"][0])
    self.assertNotAlmostEqual(mean, test_mean, places=2)

  def test_tfds_mock_data(self):
    # TFDS's mock examples (random images, encoded as the dataset's features
    # encode them), with the prepared directory's metadata.
    for name in ("cifar10", "cifar100", "imagenet2012"):
      info = tfds_data.dataset_info(name, self.data_dir)
      size = 224 if name == "imagenet2012" else 32
      with tfds.testing.mock_data(num_examples=6, data_dir=self.data_dir):
        (images, labels), = _batches(ip.build_dataset(
            name, info.train_split, 6, training=True, data_dir=self.data_dir),
                                     1)
        evaluated = _batches(ip.build_dataset(
            name, info.eval_split, 4, training=False, data_dir=self.data_dir))
      self.assertEqual(images.shape, (6, size, size, 3))
      self.assertTrue(np.all(np.isfinite(images)))
      self.assertTrue(np.all((labels >= 0) & (labels < info.num_classes)))
      self.assertEqual(evaluated[0][0].shape, (4, size, size, 3))

  # --- augmentation -------------------------------------------------------

  def test_cifar_crop_stays_in_padded_image_and_flips_half_the_time(self):
    config = _config("cifar10")
    # Every pixel tells where it came from; padding is 0.
    position = np.arange(1, 32 * 32 + 1, dtype=np.float32).reshape(32, 32)
    image = np.repeat(position[:, :, None], 3, axis=2)
    padded = np.pad(image, [(4, 4), (4, 4), (0, 0)])
    samples = 300
    crops = tf.data.Dataset.range(samples).map(
        lambda i: preprocessing.random_pad_crop_flip(
            image, config, preprocessing.example_seeds(7, i, 0, 2)))
    crops = next(iter(crops.batch(samples))).numpy()
    offsets, flips = [], 0
    for crop in crops:
      found = [(dy, dx, flip) for dy in range(9) for dx in range(9)
               for flip in (False, True)
               if np.array_equal(
                   crop, (padded[dy:dy + 32, dx:dx + 32, :][:, ::-1]
                          if flip else padded[dy:dy + 32, dx:dx + 32, :]))]
      self.assertLen(found, 1)
      dy, dx, flip = found[0]
      offsets.append((dy, dx))
      flips += flip
    offsets = np.array(offsets)
    # All shifts from -4 to +4 occur, in both directions.
    self.assertEqual(set(offsets[:, 0]), set(range(9)))
    self.assertEqual(set(offsets[:, 1]), set(range(9)))
    self.assertBetween(flips / samples, 0.4, 0.6)

  def test_per_image_standardisation(self):
    images = tf.constant(synthetic.arrays("train")[0][:16])
    config = _config("synthetic")
    augmented = tf.data.Dataset.range(16).map(
        lambda i: preprocessing.augment_cifar(tf.gather(images, i), config,
                                   preprocessing.example_seeds(0, i, 0, 2)))
    for batch in (next(iter(augmented.batch(16))).numpy(),
                  preprocessing.preprocess_for_eval(images[:16], config).numpy()):
      self.assertAllClose(batch.mean(axis=(1, 2, 3)), np.zeros(16), atol=1e-4)
      self.assertAllClose(batch.std(axis=(1, 2, 3)), np.ones(16), atol=1e-3)

  def test_imagenet_random_resized_crop_window(self):
    config = _config("imagenet2012")
    shape = tf.constant([300, 400, 3])
    windows = [preprocessing.random_resized_crop_window(shape, config,
                                             tf.constant([3, i]))
               for i in range(100)]
    areas = []
    for begin, size in windows:
      top, left, _ = begin.numpy()
      height, width, _ = size.numpy()
      self.assertTrue(0 <= top and top + height <= 300)
      self.assertTrue(0 <= left and left + width <= 400)
      areas.append(height * width / (300 * 400))
      if (height, width) != (300, 400):  # Not the whole-image fallback.
        self.assertBetween(width / height, 3 / 4 * 0.95, 4 / 3 * 1.05)
        self.assertBetween(areas[-1], 0.08 * 0.95, 1.0)
    self.assertLess(min(areas), 0.3)  # Really random, not a fixed crop.
    self.assertGreater(max(areas), 0.6)
    # JPEG bytes and decoded pixels give the same augmented image.
    pixels = np.random.default_rng(1).integers(0, 256, (300, 400, 3))
    jpeg = tf.io.encode_jpeg(pixels.astype(np.uint8), quality=100)
    seeds = tf.constant([[1, 2], [3, 4]])
    from_jpeg = preprocessing.augment_imagenet(jpeg, config, seeds)
    decoded = preprocessing.augment_imagenet(tf.io.decode_jpeg(jpeg), config, seeds)
    self.assertEqual(from_jpeg.shape, (224, 224, 3))
    self.assertAllClose(from_jpeg, decoded, atol=1e-3)

  def test_preprocess_for_eval(self):
    # ImageNet: 256x320 has its shorter side at 256 already, so the result
    # is exactly the central 224x224, normalised per channel.
    config = _config("imagenet2012")
    images = np.random.default_rng(2).integers(0, 256, (2, 256, 320, 3))
    out = preprocessing.preprocess_for_eval(images.astype(np.uint8), config).numpy()
    expected = ((images[:, 16:240, 48:272, :] - np.array(datasets.IMAGENET_MEAN)) /
                np.array(datasets.IMAGENET_STD))
    self.assertAllClose(out, expected, atol=1e-4)
    # Any size, uint8 or float, inside a SavedModel-style signature.
    signature = tf.function(
        lambda x: preprocessing.preprocess_for_eval(x, config),
        input_signature=[tf.TensorSpec([None, None, None, 3], tf.uint8)])
    big = np.random.default_rng(3).integers(0, 256, (1, 500, 375, 3))
    from_uint8 = signature(tf.constant(big, tf.uint8))
    self.assertEqual(from_uint8.shape, (1, 224, 224, 3))
    self.assertAllClose(from_uint8,
                        preprocessing.preprocess_for_eval(big.astype(np.float32), config))
    # CIFAR: per-image standardisation, nothing else.
    cifar = _config("cifar10")
    small = np.random.default_rng(4).integers(0, 256, (3, 32, 32, 3))
    self.assertAllClose(preprocessing.preprocess_for_eval(small.astype(np.uint8), cifar),
                        _standardized(small), atol=1e-5)

  # --- synthetic ----------------------------------------------------------

  def test_synthetic_is_deterministic_learnable_and_not_one_pixel(self):
    images, labels = synthetic.arrays("train")
    test_images, test_labels = synthetic.arrays("test")
    self.assertEqual(images.shape, (10_000, 32, 32, 3))
    self.assertEqual(test_images.shape, (2_000, 32, 32, 3))
    self.assertEqual(images.dtype, np.uint8)
    again, again_labels = synthetic.arrays.__wrapped__("train")
    self.assertAllEqual(images, again)
    self.assertAllEqual(labels, again_labels)
    self.assertGreater(np.bincount(labels, minlength=10).min(), 800)

    def accuracy(features, test_features):
      # Nearest class mean, features standardised on the training set.
      mean, std = features.mean(0), features.std(0) + 1e-6
      features, test_features = (features - mean) / std, (
          test_features - mean) / std
      centroids = np.stack([features[labels == c].mean(0) for c in range(10)])
      distances = ((test_features[:, None, :] - centroids[None]) ** 2).sum(-1)
      return np.mean(distances.argmin(1) == test_labels)

    # Translation-invariant texture features (the power spectrum) separate
    # the classes well ...
    def spectrum(x):
      grey = x.astype(np.float32).mean(-1)
      grey -= grey.mean((1, 2), keepdims=True)
      power = np.abs(np.fft.rfft2(grey)) ** 2
      return np.log1p(power).reshape(len(x), -1)

    self.assertGreater(accuracy(spectrum(images), spectrum(test_images)), 0.6)
    # ... while the best single pixel is barely better than chance (10%).
    best_pixel = max(
        accuracy(images[:, y, x, :].astype(np.float32),
                 test_images[:, y, x, :].astype(np.float32))
        for y, x in [(0, 0), (16, 16), (5, 27), (31, 31)])
    self.assertLess(best_pixel, 0.2)

  # --- tf.data: epochs, determinism, checkpoints, sharding ---------------

  def test_training_epochs_are_permutations(self):
    # No augmentation but standardisation: each training image identifies
    # its example.
    config = dataclasses.replace(_config("synthetic"), pad=0, flip=False)
    reference = np.concatenate([x for x, _ in _batches(ip.build_dataset(
        "synthetic", "train", 16, training=False, num_examples=48))])
    self.assertEqual(len(reference), 48)
    train = np.concatenate([x for x, _ in _batches(ip.build_dataset(
        "synthetic", "train", 16, training=True, num_examples=48,
        preprocessing=config, deterministic=True), 6)])

    def indices(images):
      return [int(np.argmin(np.abs(reference - x).max(axis=(1, 2, 3))))
              for x in images]

    first, second = indices(train[:48]), indices(train[48:])
    self.assertCountEqual(first, range(48))
    self.assertCountEqual(second, range(48))
    self.assertNotEqual(first, second)  # Reshuffled every epoch.
    self.assertNotEqual(first, list(range(48)))

  def test_deterministic_batches_and_iterator_checkpoint(self):
    def dataset(seed=0):
      return ip.build_dataset("synthetic", "train", 16, training=True,
                              seed=seed, deterministic=True)
    first = _batches(dataset(), 5)
    second = _batches(dataset(), 5)
    for (x1, y1), (x2, y2) in zip(first, second):
      self.assertAllEqual(x1, x2)
      self.assertAllEqual(y1, y2)
    other_seed = _batches(dataset(seed=1), 1)
    self.assertNotAllClose(first[0][0], other_seed[0][0])

    iterator = iter(dataset())
    for _ in range(3):
      next(iterator)
    checkpoint = tf.train.Checkpoint(iterator=iterator)
    path = checkpoint.save(
        os.path.join(self.create_tempdir().full_path, "ckpt"))
    after = [next(iterator) for _ in range(4)]
    checkpoint.restore(path)
    replayed = [next(iterator) for _ in range(4)]
    fresh = iter(dataset())
    tf.train.Checkpoint(iterator=fresh).restore(path)
    resumed = [next(fresh) for _ in range(4)]
    # Resuming by step number instead of an iterator checkpoint.
    skipped = _batches(ip.build_dataset(
        "synthetic", "train", 16, training=True, deterministic=True,
        start_step=3), 4)
    for (x1, y1), (x2, y2), (x3, y3), (x4, y4) in zip(
        after, replayed, resumed, skipped):
      self.assertAllEqual(x1, x2)
      self.assertAllEqual(x1, x3)
      self.assertAllEqual(x1, x4)
      self.assertAllEqual(y1, y3)
      self.assertAllEqual(y1, y4)
    # The iterator state is a position and a few buffered batches, not a
    # copy of the 30 MB of images.
    size = sum(os.path.getsize(os.path.join(os.path.dirname(path), f))
               for f in os.listdir(os.path.dirname(path)))
    self.assertLess(size, 5_000_000)

  def test_sharding_by_input_context(self):
    def shard(per_replica, context=None, training=True, start_step=0):
      return _batches(ip.build_dataset(
          "synthetic", "train", per_replica, training=training,
          num_examples=100, input_context=context, deterministic=True,
          start_step=start_step), None if not training else 8)

    # One pipeline, global batch 8 == two pipelines of one replica each, or
    # two pipelines of two replicas each: the same examples with the same
    # augmentation in every step, split between the replicas.
    single = shard(8)
    for pipelines, replicas in ((2, 2), (2, 4)):
      per_replica = 8 // replicas
      shards = [shard(per_replica, tf.distribute.InputContext(
          pipelines, i, replicas)) for i in range(pipelines)]
      per_pipeline = replicas // pipelines
      for step in range(8 // per_pipeline):
        parts = [shards[p][step * per_pipeline + r]
                 for p in range(pipelines) for r in range(per_pipeline)]
        self.assertAllEqual(np.concatenate([x for x, _ in parts]),
                            single[step][0])
        self.assertAllEqual(np.concatenate([y for _, y in parts]),
                            single[step][1])
      resumed = shard(per_replica, tf.distribute.InputContext(
          pipelines, 1, replicas), start_step=2)
      self.assertAllEqual(resumed[0][0], shards[1][2 * per_pipeline][0])
    # Evaluation: disjoint contiguous shards covering every example once.
    whole = np.concatenate([x for x, _ in shard(16, training=False)])
    parts = [np.concatenate([x for x, _ in shard(
        16, tf.distribute.InputContext(2, i, 2), training=False)])
             for i in range(2)]
    self.assertEqual([len(p) for p in parts], [50, 50])
    self.assertAllEqual(np.concatenate(parts), whole)

  def test_distribute_datasets_from_function(self):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = strategy.distribute_datasets_from_function(
        lambda context: ip.build_dataset(
            "synthetic", "train", 8, training=True, input_context=context,
            deterministic=True))
    images, labels = next(iter(distributed))
    self.assertEqual(images.shape, (8, 32, 32, 3))
    self.assertAllEqual(labels, _batches(ip.build_dataset(
        "synthetic", "train", 8, training=True, deterministic=True), 1)[0][1])
    # Parameter-server training builds per-worker datasets while tracing.
    traced = tf.function(lambda: ip.build_dataset(
        "synthetic", "train", 8, training=True)._variant_tensor)()
    self.assertEqual(traced.dtype, tf.variant)

  def test_evaluation_is_one_deterministic_pass(self):
    config = _config("synthetic")
    images, labels = synthetic.arrays("test")
    ds = ip.build_dataset("synthetic", "test", 64, training=False,
                          num_examples=150)
    first, second = _batches(ds), _batches(ds)
    self.assertEqual([len(y) for _, y in first], [64, 64, 22])
    for (x1, y1), (x2, y2) in zip(first, second):
      self.assertAllEqual(x1, x2)
      self.assertAllEqual(y1, y2)
    self.assertAllClose(np.concatenate([x for x, _ in first]),
                        preprocessing.preprocess_for_eval(images[:150], config),
                        atol=1e-5)
    self.assertAllEqual(np.concatenate([y for _, y in first]), labels[:150])


class DataOrderTest(tf.test.TestCase):
  """The training stream's order and augmentation on `synthetic` (no TFDS):
  the order is a permutation per epoch that the seed and the epoch decide,
  told apart with augmentation off (each standardised image then names its
  example); every example's crop and flip change with the epoch and with
  the seed, and each stays a window of the example's zero-padded image."""

  COUNT, BATCH = 32, 16

  def _stream(self, seed, epochs, preprocessing=None):
    """The first EPOCHS epochs of training images of the first COUNT
    examples, in the order the pipeline yields them."""
    batches = _batches(ip.build_dataset(
        "synthetic", "train", self.BATCH, training=True, seed=seed,
        num_examples=self.COUNT, preprocessing=preprocessing,
        deterministic=True), epochs * self.COUNT // self.BATCH)
    return np.concatenate([x for x, _ in batches])

  def _order(self, seed, epochs=2):
    """[epoch][position] -> example index, read with augmentation off."""
    plain = dataclasses.replace(_config("synthetic"), pad=0, flip=False)
    reference = _numpy_standardized(
        synthetic.arrays("train")[0][:self.COUNT])
    stream = self._stream(seed, epochs, plain)
    indices = [int(np.argmin(np.abs(reference - x).max(axis=(1, 2, 3))))
               for x in stream]
    for x, i in zip(stream, indices):
      self.assertLess(np.abs(reference[i] - x).max(), 1e-4)
    return [indices[e * self.COUNT:(e + 1) * self.COUNT]
            for e in range(epochs)]

  def test_the_seed_and_the_epoch_decide_the_order(self):
    orders = {seed: self._order(seed) for seed in (0, 1, 2)}
    for seed, (first, second) in orders.items():
      self.assertCountEqual(first, range(self.COUNT))  # Each epoch once.
      self.assertCountEqual(second, range(self.COUNT))
      self.assertNotEqual(first, second, seed)  # Reshuffled every epoch.
    for a, b in ((0, 1), (0, 2), (1, 2)):
      for epoch in (0, 1):
        self.assertNotEqual(orders[a][epoch], orders[b][epoch], (a, b))
    self.assertEqual(self._order(1), orders[1])  # The seed's own order.

  def test_each_examples_augmentation_changes_with_the_epoch_and_seed(self):
    raw = synthetic.arrays("train")[0][:self.COUNT].astype(np.float64)
    padded = np.pad(raw, [(0, 0), (4, 4), (4, 4), (0, 0)])
    # Every 32x32 window of each padded image, and its mirror image,
    # standardised: what a crop and a flip can make of the example.
    windows = np.stack([padded[:, y:y + 32, x:x + 32]
                        for y in range(9) for x in range(9)], axis=1)
    windows = np.concatenate([windows, windows[:, :, :, ::-1]], axis=1)
    windows = _numpy_standardized(windows.reshape(-1, 32, 32, 3)).reshape(
        self.COUNT, 162, 32, 32, 3)

    def augmentations(seed):
      """[epoch][example] -> (its image, which of its 162 windows)."""
      stream = self._stream(seed, 2)
      found = []
      for epoch, order in enumerate(self._order(seed)):
        images = {}
        for position, index in enumerate(order):
          image = stream[epoch * self.COUNT + position]
          distances = np.abs(windows[index] - image).max(axis=(1, 2, 3))
          self.assertLess(distances.min(), 1e-3)  # A crop of its example.
          images[index] = (image, int(np.argmin(distances)))
        found.append(images)
      return found
    seed0, seed1 = augmentations(0), augmentations(1)

    def changed(a, b):
      return sum(a[i][1] != b[i][1] for i in range(self.COUNT))
    # 162 crops and flips: equal by chance for 1 example in 162.
    self.assertGreater(changed(seed0[0], seed0[1]), self.COUNT - 4)
    self.assertGreater(changed(seed0[0], seed1[0]), self.COUNT - 4)
    # Within an epoch the examples are not all cropped alike.
    self.assertGreater(len({seed0[0][i][1] for i in range(self.COUNT)}), 8)

  def test_imagenet_crops_are_flipped_half_the_time_if_flip(self):
    # A left-to-right ramp: whatever window is cropped and resized, its
    # right edge is brighter than its left unless it was flipped.
    ramp = np.tile(np.linspace(0, 255, 300)[None, :, None], (200, 1, 3))
    image = tf.constant(ramp.astype(np.uint8))
    config = datasets.preprocessing_config(_info("imagenet2012",
                                                 (None, None, 3)))
    for flip, low, high in ((True, 0.3, 0.7), (False, 0.0, 0.0)):
      chosen = dataclasses.replace(config, flip=flip)
      flipped = []
      for i in range(60):
        out = preprocessing.augment_imagenet(
            image, chosen, preprocessing.example_seeds(3, i, 0, 2)).numpy()
        self.assertEqual(out.shape, (224, 224, 3))
        flipped.append(out[:, 0].mean() > out[:, -1].mean())
      self.assertBetween(np.mean(flipped), low, high, flip)

  def test_example_seeds_depend_on_seed_index_and_epoch(self):
    def seeds(seed, index, epoch):
      return tuple(preprocessing.example_seeds(seed, index, epoch, 2)
                   .numpy().ravel())
    base = seeds(0, 5, 1)
    self.assertEqual(seeds(0, 5, 1), base)
    others = [seeds(1, 5, 1), seeds(0, 6, 1), seeds(0, 5, 2)]
    self.assertLen(set(others + [base]), 4)


if __name__ == "__main__":
  absltest.main()
