"""Tests of the TF Serving export (bin/export) and client (bin/serve_client).

One tiny run is trained once (train.py's library function) and exported
once with the binary; the client is checked against `TfServingTestDouble`,
a loopback stand-in for TF Serving's REST and gRPC Predict API defined here.
It is NOT TF Serving: it loads the exported SavedModel with
tf.saved_model.load and imitates the API's request and error formats.
"""

import base64
import concurrent.futures
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest
import grpc
import keras
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import prediction_service_pb2_grpc

from identity_tf import configs
from identity_tf import errors
from identity_tf import model as model_lib
from identity_tf.data import synthetic
from identity_tf.data import tfds_data
from identity_tf.serving import client
from identity_tf.serving import contract
from identity_tf.serving import export
from identity_tf.training import checkpoints
from identity_tf.training import run as run_lib
from identity_tf.training import trainer

import testing
import tf_serving_double

MODEL_NAME = "smoke"
# Exported vs Keras outputs: the same float32 ops in a different graph; only
# the order of floating-point reductions may differ.
PROBABILITY_TOLERANCE = 1e-5

def _position_pixels(height, width):
  """A raw RGB image whose pixels encode their position (row r, column c):
  red r, green c (ramps, which ImageNet's fixed normalisation keeps), blue
  (7 r + 13 c) mod 256; each within 0-255 for images up to 256 pixels."""
  rows, cols = np.meshgrid(np.arange(height), np.arange(width),
                           indexing="ij")
  return np.stack([rows % 256, cols % 256, (7 * rows + 13 * cols) % 256],
                  -1).astype(np.float32)


def _bilinear_resize(image, height, width):
  """IMAGE [H, W, C] resized to HEIGHT x WIDTH in NumPy: bilinear with half-
  pixel centres and no antialiasing (TensorFlow 2's tf.image.resize), each
  output pixel at source coordinate (i + 0.5) * in / out - 0.5, clamped to
  the image."""
  def taps(out_size, in_size):
    x = (np.arange(out_size) + 0.5) * (in_size / out_size) - 0.5
    low = np.floor(x)
    weight = x - low
    low = low.astype(int)
    return (np.clip(low, 0, in_size - 1), np.clip(low + 1, 0, in_size - 1),
            weight)
  image = np.asarray(image, np.float64)
  top, bottom, wy = taps(height, image.shape[0])
  left, right, wx = taps(width, image.shape[1])
  rows = (image[top] * (1 - wy)[:, None, None] +
          image[bottom] * wy[:, None, None])
  return (rows[:, left] * (1 - wx)[None, :, None] +
          rows[:, right] * wx[None, :, None])


# ImageNet's evaluation normalisation (torchvision's constants, 0-255).
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406]) * 255
IMAGENET_STD = np.array([0.229, 0.224, 0.225]) * 255


def _imagenet_input(image, resized, top, left, size=224):
  """What the ImageNet export must feed its network for raw IMAGE, in
  NumPy: resized to RESIZED (height, width), the SIZE x SIZE crop at (TOP,
  LEFT), normalised per channel."""
  crop = _bilinear_resize(image, *resized)[top:top + size, left:left + size]
  assert crop.shape == (size, size, 3), crop.shape
  return ((crop - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32)


def _softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)


def _run(config, info):
  """The `run.Run` of CONFIG on dataset INFO."""
  return run_lib.prepare(config, info, None)



def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _read(path):
  with open(path, "rb") as f:
    return f.read()


def _png(pixels):
  return tf.io.encode_png(tf.cast(pixels, tf.uint8)).numpy()


def _saved_model_cli(*args):
  """Runs saved_model_cli (TensorFlow's) with ARGS; returns CompletedProcess."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run(
      [sys.executable, "-m", "tensorflow.python.tools.saved_model_cli", *args],
      capture_output=True, text=True, timeout=300, env=env, check=False)


class ExportTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.mkdtemp(prefix="export_test_")
    cls.model_dir = os.path.join(cls.tmp, "run")
    cls.base = os.path.join(cls.tmp, "serving", MODEL_NAME)
    # A tiny trained checkpoint, trained the way bin/train does.
    config = configs.from_preset(
        "smoke", train_steps=40, batch_size=32, num_train_examples=1024,
        num_eval_examples=64, eval_at_end=False, checkpoint_steps=40,
        log_steps=20, steps_per_loop=20)
    trainer.train(config, cls.model_dir, echo=lambda line: None)
    cls.export_result = testing.run_binary(
        "export", f"--model_dir={cls.model_dir}", f"--export_dir={cls.base}")
    cls.model, cls.trained_run, cls.step = checkpoints.restore_model(
        cls.model_dir)
    # Held-out images of the dataset the model was trained on.
    images, _ = synthetic.arrays("test")
    cls.pixels = images[:6].astype(np.float32)
    # What the export must answer, its preprocessing and softmax in NumPy:
    # the 32x32 images need no padding; each is standardised over its H, W
    # and channels, dividing by max(std, 1/sqrt(#values)).
    x = cls.pixels.astype(np.float64)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    std = np.sqrt(((x - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True))
    inputs = ((x - mean) / np.maximum(std, 1 / np.sqrt(x[0].size))).astype(
        np.float32)
    cls.keras_probabilities = _softmax(
        cls.model(inputs, training=False).numpy())
    cls.keras_classes = np.argmax(cls.keras_probabilities, axis=-1)
    cls.double = None
    if cls.export_result.returncode == 0:
      cls.double = tf_serving_double.TfServingTestDouble(cls.base, MODEL_NAME)

  @classmethod
  def tearDownClass(cls):
    if cls.double is not None:
      cls.double.close()
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    if self.double is None:
      self.fail(f"bin/export failed:\n{self.export_result.stderr[-3000:]}")

  def _signature(self, name):
    return self.double.versions[1].signatures[name]

  def _files(self, names_and_data):
    paths = []
    directory = self.create_tempdir().full_path
    for name, data in names_and_data:
      path = os.path.join(directory, name)
      with open(path, "wb") as f:
        f.write(data)
      paths.append(path)
    return paths

  def _assert_clear_top_classes(self):
    """Checks that every test image has a clear most probable class.

    Comparing classes is only meaningful where the top two probabilities
    are further apart than twice the outputs' tolerance (with a factor 5 to
    spare); the tiny run's are (about 5e-4 or more).
    """
    top2 = np.sort(self.keras_probabilities, axis=-1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    self.assertTrue(np.all(margins > 5 * 2 * PROBABILITY_TOLERANCE),
                    f"test images too close to call: top-2 margins {margins}")
    # And the probabilities are far from uniform, which a near-constant
    # output of any network would match within the tolerance.
    from_uniform = np.abs(self.keras_probabilities - 1 / 10).max(axis=-1)
    self.assertTrue(np.all(from_uniform > 100 * PROBABILITY_TOLERANCE),
                    f"answers too close to 1/10: {from_uniform}")

  # -------------------------------------------------------------------------
  # The export.

  def test_binary_writes_version_1_with_model_info(self):
    self.assertEqual(os.listdir(self.base), ["1"])
    self.assertIn(f"as version 1: {os.path.join(self.base, '1')}",
                  self.export_result.stdout)
    version_dir = os.path.join(self.base, "1")
    self.assertTrue(tf.saved_model.contains_saved_model(version_dir))
    with open(os.path.join(version_dir, export.MODEL_INFO_FILE)) as f:
      info = json.load(f)
    self.assertEqual(info["version"], 1)
    self.assertEqual(info["step"], self.step)
    self.assertEqual(info["step"], 40)
    self.assertEqual(info["preset"], "smoke")
    self.assertEqual(info["dataset"], "synthetic")
    # The names of the training run's dataset, as config.json recorded them.
    self.assertEqual(info["classes"], {
        "count": 10,
        "names": list(tfds_data.dataset_info("synthetic").class_names)})
    self.assertEqual(info["input"]["image_size"], 32)
    self.assertEqual(info["model"]["name"], "cifar10")
    self.assertEqual(info["preprocessing"],
                     self.trained_run.preprocessing.to_dict())
    self.assertEqual(info["model"]["options"],
                     self.trained_run.model_options.to_dict())
    self.assertEqual(info["checkpoint"],
                     checkpoints.find_checkpoint(self.model_dir))

  def test_saved_model_cli_shows_and_runs_both_signatures(self):
    directory = self.create_tempdir().full_path
    np.save(os.path.join(directory, "batch.npy"), self.pixels)
    outdir = os.path.join(directory, "out")
    version_dir = os.path.join(self.base, "1")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      show = pool.submit(_saved_model_cli, "show", "--dir", version_dir,
                         "--all")
      run = pool.submit(
          _saved_model_cli, "run", "--dir", version_dir, "--tag_set", "serve",
          "--signature_def", "serving_default",
          "--inputs", f"images={os.path.join(directory, 'batch.npy')}",
          "--outdir", outdir)
      show, run = show.result(), run.result()

    self.assertEqual(show.returncode, 0, show.stderr[-2000:])
    signatures = {}
    for block in show.stdout.split("signature_def['")[1:]:
      name = block[:block.index("'")]
      signatures[name] = re.findall(
          r"(inputs|outputs)\['(\w+)'\] tensor_info:\s+dtype: (\w+)\s+"
          r"shape: (\([^)]*\))", block)
    self.assertEqual(sorted(
        signatures[contract.DEFAULT_SIGNATURE]), [
            ("inputs", "images", "DT_FLOAT", "(-1, 32, 32, 3)"),
            ("outputs", "classes", "DT_INT64", "(-1)"),
            ("outputs", "probabilities", "DT_FLOAT", "(-1, 10)")])
    self.assertEqual(sorted(
        signatures[contract.IMAGES_SIGNATURE]), [
            ("inputs", "images", "DT_STRING", "(-1)"),
            ("outputs", "classes", "DT_INT64", "(-1)"),
            ("outputs", "probabilities", "DT_FLOAT", "(-1, 10)")])
    self.assertEqual(show.stdout.count(
        "Method name is: tensorflow/serving/predict"), 2)

    # `run` loads the SavedModel in a TF1 session, as TF Serving does.
    self.assertEqual(run.returncode, 0, run.stderr[-2000:])
    classes = np.load(os.path.join(outdir, "classes.npy"))
    probabilities = np.load(os.path.join(outdir, "probabilities.npy"))
    self.assertEqual(classes.dtype, np.int64)
    self._assert_clear_top_classes()
    np.testing.assert_array_equal(classes, self.keras_classes)
    np.testing.assert_allclose(probabilities, self.keras_probabilities,
                               atol=PROBABILITY_TOLERANCE)

  def test_signatures_equal_the_keras_model(self):
    outputs = self._signature("serving_default")(
        images=tf.constant(self.pixels))
    np.testing.assert_allclose(outputs["probabilities"].numpy(),
                               self.keras_probabilities,
                               atol=PROBABILITY_TOLERANCE)
    self._assert_clear_top_classes()
    np.testing.assert_array_equal(outputs["classes"].numpy(),
                                  self.keras_classes)
    # PNG is lossless: the decoded files are the same pixels.
    encoded = tf.constant([_png(image) for image in self.pixels])
    from_files = self._signature("predict_images")(images=encoded)
    np.testing.assert_allclose(from_files["probabilities"].numpy(),
                               self.keras_probabilities,
                               atol=PROBABILITY_TOLERANCE)
    self.assertEqual(from_files["classes"].dtype, tf.int64)

  def test_model_info_names_the_datasets_classes(self):
    # The names training recorded from the dataset (TFDS's ClassLabel).
    for dataset, model_name, count in (("cifar10", "cifar10", 10),
                                       ("cifar100", "cifar100", 100),
                                       ("synthetic", "cifar10", 10)):
      dataset_info = tfds_data.dataset_info(dataset)
      run = _run(configs.from_preset(
          "smoke", model=model_name, dataset=dataset), dataset_info)
      info = export.model_info(run, 7, version=3)
      self.assertEqual(info["classes"]["count"], count)
      self.assertEqual(info["classes"]["names"],
                       list(dataset_info.class_names))
      self.assertLen(set(info["classes"]["names"]), count)
      self.assertEqual(info["preset"], "smoke")
      self.assertEqual(info["step"], 7)
    imagenet = _run(
        configs.from_preset("smoke", model="imagenet", dataset="imagenet2012"),
        tfds_data.dataset_info("imagenet2012")).dataset.class_names
    self.assertLen(set(imagenet), 1000)
    self.assertTrue(all(re.fullmatch(r"n\d{8}", n) for n in imagenet))
    # A run whose dataset does not match the model is refused.
    run = _run(configs.from_preset("smoke", model="cifar100", dataset="cifar100"),
               tfds_data.dataset_info("cifar100"))
    with self.assertRaisesRegex(ValueError, "10 classes but cifar100 has 100"):
      export.export_model(self.model, run, 1,
                          self.create_tempdir().full_path)

  def test_imagenet_export_resizes_any_size_inside_the_graph(self):
    base = model_lib.build_model("imagenet", width=1 / 16, units=1, seed=3)
    run = _run(configs.from_preset(
        "smoke", model="imagenet", dataset="imagenet2012", width=1 / 16,
        units=(1, 1, 1, 1), seed=3), tfds_data.dataset_info("imagenet2012"))
    # Position-encoding images; what the graph must make of them, worked
    # out by hand: the shorter side resized to 256 (8/7 of 224), the other
    # rounded, the central 224 x 224 crop.
    wide, tall = _position_pixels(150, 260), _position_pixels(300, 200)
    wide_input = _imagenet_input(wide, (256, 444), 16, 110)  # 260*256/150
    tall_input = _imagenet_input(tall, (384, 256), 80, 16)   # = 443.7
    # The untrained network answers about 1/1000 for every class (1e-3
    # +- 1e-7); its logits scaled to a standard deviation of 3 are not.
    inputs = np.stack([wide_input, tall_input])
    scale = 3.0 / np.std(base(inputs).numpy())
    image = keras.Input((224, 224, 3))
    model = keras.Model(image, keras.layers.Rescaling(scale)(
        base(image)))
    expected = _softmax(model(inputs).numpy())
    self.assertGreater(np.abs(expected - 1e-3).max(),
                       100 * PROBABILITY_TOLERANCE)

    base_dir = self.create_tempdir().full_path
    version, path = export.export_model(model, run, 5, base_dir)
    self.assertEqual(version, 1)
    with open(os.path.join(path, export.MODEL_INFO_FILE)) as f:
      info = json.load(f)
    self.assertEqual(info["classes"]["names"][0], "n01440764")
    self.assertEqual(
        info["signatures"]["serving_default"]["inputs"]["images"]["shape"],
        [-1, -1, -1, 3])
    loaded = tf.saved_model.load(path)
    outputs = loaded.signatures["serving_default"](
        images=tf.constant(wide[np.newaxis]))
    self.assertEqual(outputs["probabilities"].shape, (1, 1000))
    np.testing.assert_allclose(outputs["probabilities"].numpy(),
                               expected[:1], atol=PROBABILITY_TOLERANCE)
    # A crop one pixel off, either way, or a resize to other sizes, gives
    # answers far outside the tolerance: the check sees such a mistake.
    for resized, top, left in (((256, 444), 17, 110), ((256, 444), 16, 111),
                               ((256, 443), 16, 110)):
      wrong = _softmax(model(_imagenet_input(wide, resized, top, left)[
          np.newaxis]).numpy())
      self.assertGreater(np.abs(wrong - expected[:1]).max(),
                         100 * PROBABILITY_TOLERANCE, (resized, top, left))
    # Files of different sizes in one batch (PNG holds integers exactly).
    files = tf.constant([_png(wide), _png(tall)])
    outputs = loaded.signatures["predict_images"](images=files)
    np.testing.assert_allclose(outputs["probabilities"].numpy(), expected,
                               atol=PROBABILITY_TOLERANCE)

  # -------------------------------------------------------------------------
  # Versions.

  def test_versions_count_up_and_are_never_overwritten(self):
    base = self.create_tempdir().full_path
    os.mkdir(os.path.join(base, "notes"))  # Not a version: ignored.
    shutil.copytree(os.path.join(self.base, "1"), os.path.join(base, "1"))
    second, path = export.export_model(self.model, self.trained_run, 40,
                                       base)
    self.assertEqual(second, 2)
    self.assertEqual(export.existing_versions(base), [1, 2])
    with self.assertRaisesRegex(ValueError,
                                "version 2 already exists.*--overwrite"):
      export.export_model(self.model, self.trained_run, 40, base,
                          version=2)
    export.export_model(self.model, self.trained_run, 41, base, version=2,
                        overwrite=True)
    with open(os.path.join(path, export.MODEL_INFO_FILE)) as f:
      self.assertEqual(json.load(f)["step"], 41)
    self.assertEqual(sorted(os.listdir(base)), ["1", "2", "notes"])

  def test_binary_refuses_an_existing_version(self):
    result = testing.run_binary(
        "export", f"--model_dir={self.model_dir}",
        f"--export_dir={self.base}", "--version=1")
    self.assertNotEqual(result.returncode, 0)
    self.assertEqual(
        testing.last_stderr_line(result),
        f"error: version 1 already exists in {self.base}; pass --overwrite "
        f"or omit --version (the next is 2)")
    self.assertNotIn("Traceback", result.stderr)
    self.assertEqual(os.listdir(self.base), ["1"])

  def test_failed_export_leaves_no_version(self):
    base = self.create_tempdir().full_path

    def save_then_fail(module, path):
      del module
      with open(os.path.join(path, "saved_model.pb"), "wb") as f:
        f.write(b"half")
      raise KeyboardInterrupt

    with mock.patch.object(export.ServingModule, "save", save_then_fail):
      with self.assertRaises(KeyboardInterrupt):
        export.export_model(self.model, self.trained_run, 40, base)
    self.assertEqual(os.listdir(base), [])

  def test_killed_export_leaves_no_visible_version(self):
    base = self.create_tempdir().full_path
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = testing.source_root() + os.pathsep + env.get(
        "PYTHONPATH", "")
    process = subprocess.Popen(
        [sys.executable, os.path.join(testing.source_root(), "bin",
                                      "export.py"),
         f"--model_dir={self.model_dir}", f"--export_dir={base}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
      deadline = time.monotonic() + 240
      # Kill it (SIGKILL: no clean-up) once it is writing.
      while not export.stale_temporary_dirs(base):
        self.assertIsNone(process.poll(), "the export ended before writing")
        self.assertLess(time.monotonic(), deadline)
        time.sleep(0.01)
      process.send_signal(signal.SIGKILL)
    finally:
      process.kill()
      process.communicate(timeout=60)
    self.assertEqual(export.existing_versions(base), [])
    self.assertTrue(all(name.startswith(".") for name in os.listdir(base)))
    self.assertLen(export.stale_temporary_dirs(base), 1)
    # What TF Serving would see: no version; the next export is version 1.
    self.assertEqual(export.choose_version(base), 1)

  def test_an_export_dir_that_is_a_file_is_refused(self):
    a_file = os.path.join(self.create_tempdir().full_path, "file")
    with open(a_file, "w") as f:
      f.write("x")
    with self.assertRaisesRegex(ValueError, r"--export_dir=.*file is a file, "
                                "not a directory: give TF Serving's model"):
      export.choose_version(a_file)
    with open(a_file) as f:
      self.assertEqual(f.read(), "x")

  # -------------------------------------------------------------------------
  # The client against the test double.

  def test_client_rest_and_grpc_requests(self):
    files = self._files([(f"img{i}.png", _png(x))
                         for i, x in enumerate(self.pixels[:3])])
    inputs = [client.read_input(path) for path in files]
    self._assert_clear_top_classes()
    for protocol, address in (("rest", self.double.rest_address),
                              ("grpc", self.double.grpc_address)):
      results = client.predict(
          address, MODEL_NAME, inputs, protocol=protocol, version=1)
      self.assertEqual([name for name, _ in results], files)
      probabilities = np.stack([p for _, p in results])
      np.testing.assert_allclose(probabilities, self.keras_probabilities[:3],
                                 atol=PROBABILITY_TOLERANCE)
      np.testing.assert_array_equal(np.argmax(probabilities, axis=-1),
                                    self.keras_classes[:3])
    path, body = self.double.rest_requests[-1]
    self.assertEqual(path, f"/v1/models/{MODEL_NAME}/versions/1:predict")
    self.assertEqual(body["signature_name"], "predict_images")
    self.assertEqual(body["instances"], [
        {"b64": base64.b64encode(_read(p)).decode()} for p in files])
    request = self.double.grpc_requests[-1]
    self.assertEqual(request.model_spec.name, MODEL_NAME)
    self.assertEqual(request.model_spec.version.value, 1)
    self.assertEqual(request.model_spec.signature_name, "predict_images")
    self.assertEqual(list(request.inputs["images"].string_val),
                     [_read(p) for p in files])
    # Arrays go to serving_default, without a version: the latest.
    array = client.Input("a.npy", "array", self.pixels[:2],
                                 ["a.npy[0]", "a.npy[1]"])
    for protocol, address in (("rest", self.double.rest_address),
                              ("grpc", self.double.grpc_address)):
      results = client.predict(address, MODEL_NAME, [array],
                                       protocol=protocol)
      np.testing.assert_allclose(np.stack([p for _, p in results]),
                                 self.keras_probabilities[:2],
                                 atol=PROBABILITY_TOLERANCE)
    path, body = self.double.rest_requests[-1]
    self.assertEqual(path, f"/v1/models/{MODEL_NAME}:predict")
    self.assertEqual(body["signature_name"], "serving_default")
    np.testing.assert_array_equal(np.array(body["instances"]),
                                  self.pixels[:2])
    proto = self.double.grpc_requests[-1].inputs["images"]
    self.assertFalse(self.double.grpc_requests[-1].model_spec.HasField(
        "version"))
    np.testing.assert_array_equal(tf.make_ndarray(proto), self.pixels[:2])

  def test_client_binary_prints_top_k_or_one_error_line(self):
    directory = self.create_tempdir().full_path
    batch = os.path.join(directory, "batch.npy")
    np.save(batch, self.pixels[:2])
    png = self._files([("first.png", _png(self.pixels[0]))])[0]
    runs = {  # Run side by side: each process spends seconds importing.
        "rest": (f"--server={self.double.rest_address}",
                 f"--model_name={MODEL_NAME}", "--top_k=3", png,
                 "--model_info=" + os.path.join(self.base, "1",
                                                export.MODEL_INFO_FILE)),
        "grpc": (f"--server={self.double.grpc_address}", "--protocol=grpc",
                 f"--model_name={MODEL_NAME}", "--top_k=3", batch),
        "unknown_model": (f"--server={self.double.rest_address}",
                          "--model_name=nope", png),
    }
    results = testing.run_binaries("serve_client", runs, len(runs))
    for key in ("rest", "grpc"):
      self.assertEqual(results[key].returncode, 0, results[key].stderr[-2000:])
    lines = results["rest"].stdout.splitlines() + (
        results["grpc"].stdout.splitlines())
    self.assertLen(lines, 3)
    self.assertTrue(lines[0].startswith(f"{png}: "))
    self.assertTrue(lines[1].startswith(f"{batch}[0]: "))
    self.assertTrue(lines[2].startswith(f"{batch}[1]: "))
    for line, i in zip(lines, (0, 0, 1)):
      # "label (name) probability", the name from model_info.json if given.
      ranked = re.findall(r"(\d+)(?: \([^)]*\))? (\d\.\d{4})",
                          line.split(": ", 1)[1])
      self.assertLen(ranked, 3)
      self.assertEqual(int(ranked[0][0]), self.keras_classes[i])
      self.assertAlmostEqual(float(ranked[0][1]),
                             self.keras_probabilities[i].max(), places=3)
    unknown = results["unknown_model"]
    self.assertNotEqual(unknown.returncode, 0)
    self.assertNotIn("Traceback", unknown.stderr)
    self.assertEqual(
        testing.last_stderr_line(unknown),
        f"error: {self.double.rest_address} does not serve model 'nope' "
        f"(Servable not found for request: Latest(nope)); check --model_name "
        f"(tensorflow_model_server's --model_name) and --model_version")

  def test_client_errors(self):
    text = self._files([("notes.txt", b"hello")])[0]
    png = self._files([("one.png", _png(self.pixels[0]))])[0]
    with self.assertRaisesWithLiteralMatch(
        errors.ServingError,
        f"{text} is neither a JPEG/PNG image nor a .npy array; pass image "
        f"files or .npy arrays of raw 0-255 pixels"):
      client.read_input(text)
    inputs = [client.read_input(png)]
    closed = f"127.0.0.1:{_free_port()}"
    with self.assertRaisesRegex(
        errors.ServingError,
        f"^cannot reach TF Serving's REST API at {closed} \\(.*refused.*\\); "
        f"start tensorflow_model_server with --rest_api_port"):
      client.predict(closed, MODEL_NAME, inputs, timeout=10)
    with self.assertRaisesRegex(
        errors.ServingError,
        f"^cannot reach TF Serving's gRPC API at {closed} .*; start "
        f"tensorflow_model_server with --port"):
      client.predict(closed, MODEL_NAME, inputs, protocol="grpc",
                             timeout=10)
    with self.assertRaisesRegex(errors.ServingError,
                                "does not serve model 'smoke' version 9"):
      client.predict(self.double.grpc_address, MODEL_NAME, inputs,
                             protocol="grpc", version=9)
    with self.assertRaisesRegex(errors.ServingError,
                                "takes encoded JPEG/PNG files"):
      client.predict(self.double.rest_address, MODEL_NAME,
                             [client.Input("a.npy", "array",
                                                   self.pixels[:1], ["a"])],
                             signature="predict_images")
    bad_array = os.path.join(self.create_tempdir().full_path, "gray.npy")
    np.save(bad_array, np.zeros([4, 32, 32]))
    with self.assertRaisesRegex(errors.ServingError,
                                r"shape \[4, 32, 32\]; expected raw 0-255"):
      client.read_input(bad_array)
    info = os.path.join(self.create_tempdir().full_path, "info.json")
    with open(info, "w") as f:
      json.dump({"classes": {"count": 3, "names": ["a", "b", "c"]}}, f)
    self.assertEqual(
        client.format_prediction(
            "x.png", np.array([0.1, 0.7, 0.2]), 2,
            client.read_class_names(info)),
        "x.png: 1 (b) 0.7000, 2 (c) 0.2000")

  # -------------------------------------------------------------------------
  # Bad requests.

  def test_bad_requests_fail_cleanly(self):
    png = _png(self.pixels[0])
    small_png = _png(self.pixels[0][:28, :28])
    bad_arrays = {
        "rank": (self.pixels[0], "not compatible"),
        "size": (self.pixels[:2, :28, :28], "not compatible"),
        "range": (np.stack([self.pixels[0], self.pixels[1] - 128.0]),
                  r"images\[1\] has values outside 0-255"),
        "nan": (np.stack([self.pixels[0], np.full_like(self.pixels[0],
                                                       np.nan)]),
                r"images\[1\] has values outside 0-255"),
        # REST cannot say "0 images of 32x32x3": [] has the wrong rank.
        "empty": (self.pixels[:0], "(images is empty|not compatible)"),
    }
    bad_files = {
        "undecodable": ([png, b"\x89PNG\r\n\x1a\n garbage", png],
                        r"images\[1\] is not a decodable JPEG, PNG, GIF "
                        "or BMP image"),
        "text": ([b"hello", png], r"images\[0\] is not a decodable"),
        "size": ([png, png, small_png],
                 r"images\[2\] is not 32x32 pixels"),
        "empty": ([], "images is empty"),
    }
    for protocol in ("rest", "grpc"):
      send = (client.rest_predict if protocol == "rest"
              else client.grpc_predict)
      address = (self.double.rest_address if protocol == "rest"
                 else self.double.grpc_address)
      for key, (batch, message) in bad_arrays.items():
        if protocol == "rest" and key == "nan":
          continue  # JSON has no NaN.
        with self.subTest(protocol=protocol, array=key):
          with self.assertRaisesRegex(errors.ServingError,
                                      "refused the request.*" + message):
            send(address, MODEL_NAME, "serving_default", batch)
      for key, (batch, message) in bad_files.items():
        with self.subTest(protocol=protocol, files=key):
          with self.assertRaisesRegex(errors.ServingError,
                                      "refused the request.*" + message):
            send(address, MODEL_NAME, "predict_images", batch)
    # Wrong dtype: a uint8 tensor for serving_default.
    request = client.grpc_request(
        MODEL_NAME, "serving_default", self.pixels[:1])
    request.inputs["images"].CopyFrom(
        tf.make_tensor_proto(self.pixels[:1].astype(np.uint8)))
    with grpc.insecure_channel(self.double.grpc_address) as channel:
      stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
      with self.assertRaises(grpc.RpcError) as caught:
        stub.Predict(request, timeout=30)
    self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
    self.assertIn("float", caught.exception.details())
    # The client names the file of the bad element.
    files = self._files([("good.png", png), ("bad.png", b"\x89PNG\r\n\x1a\n")])
    with self.assertRaisesRegex(errors.ServingError,
                                r"images\[1\] is .*bad\.png"):
      client.predict(self.double.rest_address, MODEL_NAME,
                             [client.read_input(p) for p in files])
    # The signatures themselves reject these, and the server goes on serving.
    rejected = (TypeError, ValueError, tf.errors.InvalidArgumentError)
    with self.assertRaises(rejected):
      self._signature("serving_default")(
          images=tf.constant(self.pixels[:1].astype(np.uint8)))
    with self.assertRaises(rejected):
      self._signature("serving_default")(images=tf.constant(self.pixels[0]))
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                r"images\[1\] is not a decodable"):
      self._signature("predict_images")(images=tf.constant([png, b"x"]))
    results = client.predict(
        self.double.grpc_address, MODEL_NAME,
        [client.read_input(files[0])], protocol="grpc")
    np.testing.assert_allclose(results[0][1], self.keras_probabilities[0],
                               atol=PROBABILITY_TOLERANCE)


def _standardized_per_image(pixels):
  """Raw 0-255 images [n, H, W, 3] as CIFAR's evaluation standardises
  them, in NumPy: minus each image's mean, over max(its std, 1/sqrt(N))."""
  x = np.asarray(pixels, np.float64)
  mean = x.mean(axis=(1, 2, 3), keepdims=True)
  std = np.sqrt(((x - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True))
  return ((x - mean) / np.maximum(std, 1 / np.sqrt(x[0].size))).astype(
      np.float32)


class AveragedBatchNormExportTest(absltest.TestCase):
  """An --ema_decay run of batch norm's network, exported: the server must
  answer with the weight average (the recursion a_1 = w_1, a_t = d a_(t-1)
  + (1 - d) w_t over each step's weights, computed here from the raw
  checkpoints) and with batch norm's moving statistics, not the
  request's batch statistics; and the run's own evaluations, held-out and
  of the training set, are of the average too."""

  DECAY = 0.5

  def test_the_export_and_the_evaluations_are_of_the_average(self):
    model_dir = self.create_tempdir().full_path
    config = configs.from_preset(
        "smoke", model="resnet_bn", width=0.0625, units=(1,), batch_size=8,
        train_steps=3, learning_rate=0.2, ema_decay=self.DECAY,
        checkpoint_steps=1, keep_checkpoints=10, log_steps=1,
        steps_per_loop=1, num_train_examples=32, num_eval_examples=16,
        eval_batch_size=8, eval_train_at_end=True)
    result = trainer.train(config, model_dir, echo=lambda line: None)

    def raw(step):
      model, run, _ = checkpoints.restore_checkpoint(
          model_dir, checkpoints.find_checkpoint(model_dir, step),
          averaged=False)
      return model, run
    average = None
    for step in (1, 2, 3):
      model, run = raw(step)
      values = [v.numpy() for v in model.variables
                if tf.as_dtype(v.dtype).is_floating]
      average = values if average is None else [
          self.DECAY * a + (1 - self.DECAY) * w
          for a, w in zip(average, values)]
    last, run = raw(3)
    averaged = model_lib.build_model(**run.model_arguments())
    for variable, value in zip(
        [v for v in averaged.variables if tf.as_dtype(v.dtype).is_floating],
        average):
      variable.assign(value)

    # The run's evaluations at its end: the average, on each split (the
    # mean cross-entropy of the first examples, in NumPy).
    info = run.dataset
    for split, key, count in ((info.eval_split, "eval", 16),
                              (info.train_split, "train_eval", 32)):
      with self.subTest(split):
        images, labels = synthetic.arrays(split)
        inputs = _standardized_per_image(images[:count])
        def mean_cross_entropy(model):
          logits = model(inputs, training=False).numpy().astype(np.float64)
          shifted = logits - logits.max(axis=1, keepdims=True)
          log_p = shifted - np.log(np.exp(shifted).sum(axis=1,
                                                       keepdims=True))
          return -log_p[np.arange(count), labels[:count]].mean()
        expected, own = mean_cross_entropy(averaged), mean_cross_entropy(last)
        self.assertEqual(result[key]["examples"], count)
        self.assertAlmostEqual(result[key]["loss"], expected,
                               delta=1e-5 * expected)
        self.assertGreater(abs(own - expected), 1e-3 * expected)
    _, version_dir, _ = export.export_run(model_dir,
                                          os.path.join(model_dir, "export"))
    served = tf.saved_model.load(version_dir).signatures[
        contract.DEFAULT_SIGNATURE]
    pixels = synthetic.arrays("test")[0][:6].astype(np.float32)
    probabilities = served(**{contract.INPUT_KEY: tf.constant(pixels)})[
        contract.PROBABILITIES_KEY].numpy()
    inputs = _standardized_per_image(pixels)
    expected = _softmax(averaged(inputs, training=False).numpy())
    np.testing.assert_allclose(probabilities, expected,
                               atol=PROBABILITY_TOLERANCE)
    # What a wrong export would serve is told apart: the last step's own
    # weights, or the request's batch statistics (a call in training mode
    # moves the moving statistics: made last).
    for wrong in (_softmax(last(inputs, training=False).numpy()),
                  _softmax(averaged(inputs, training=True).numpy())):
      self.assertGreater(np.abs(wrong - expected).max(),
                         100 * PROBABILITY_TOLERANCE)


if __name__ == "__main__":
  absltest.main()
