"""Train, evaluate, export and construct on a TFDS dataset of grey images.

Fashion-MNIST as bin/prepare_data prepares it offline (TFDS's own builder,
small idx files written here), then the binaries as a user runs them:
bin/train with --dataset=fashion_mnist, bin/evaluate, bin/export (whose
signatures take the dataset's raw 28x28 grey images) and bin/construct.
"""

import json
import os

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import config_file
import testing

COUNTS = {"train": 24, "test": 12}


def _numpy_eval_preprocessing(images):
  """28x28x1 raw pixels -> the CIFAR network's input, written out: centred
  zero-padding to 32x32, grey into R, G, B, per-image standardisation."""
  padded = np.pad(images.astype(np.float64), [(0, 0), (2, 2), (2, 2), (0, 0)])
  rgb = np.repeat(padded, 3, axis=3)
  mean = rgb.mean(axis=(1, 2, 3), keepdims=True)
  std = np.maximum(rgb.std(axis=(1, 2, 3), keepdims=True),
                   1 / np.sqrt(32 * 32 * 3))
  return ((rgb - mean) / std).astype(np.float32)


class FashionMnistTest(testing.SharedRootTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.data_dir = os.path.join(cls.root, "data")
    cls.raw = testing.write_fashion_mnist_files(
        os.path.join(cls.root, "raw"), np.random.default_rng(0), COUNTS)
    with testing.fewer_mnist_examples(COUNTS):
      tfds_data.prepare("fashion_mnist", cls.data_dir,
                             source_dir=os.path.join(cls.root, "raw"),
                             echo=lambda line: None)
    cls.model_dir = os.path.join(cls.root, "run")
    cls.trained = testing.run_binary(
        "train", "--preset=cifar10_paper", "--dataset=fashion_mnist",
        f"--data_dir={cls.data_dir}", f"--model_dir={cls.model_dir}",
        "--width=0.0625", "--units=1", "--batch_size=8", "--train_steps=6",
        "--checkpoint_steps=6", "--log_steps=3", "--steps_per_loop=3",
        check=True)

  def test_training_records_what_the_dataset_is(self):
    with open(os.path.join(self.model_dir, config_file.CONFIG_FILE)) as f:
      run = json.load(f)
    dataset = run["dataset"]
    self.assertEqual((dataset["name"], dataset["image_shape"],
                      dataset["num_train_examples"],
                      dataset["num_eval_examples"], dataset["eval_split"]),
                     ("fashion_mnist", [28, 28, 1], 24, 12, "test"))
    self.assertEqual(dataset["class_names"][-1], "Ankle boot")
    self.assertEqual(run["model"]["options"]["classes"], 10)
    self.assertEqual(
        {k: run["preprocessing"][k]
         for k in ("kind", "image_size", "input_size", "channels")},
        {"kind": "cifar", "image_size": 32, "input_size": [28, 28],
         "channels": 1})
    self.assertIn("on 12 fashion_mnist examples", self.trained.stdout)

  def test_evaluate(self):
    result = testing.run_binary("evaluate", f"--model_dir={self.model_dir}",
                                f"--data_dir={self.data_dir}", check=True)
    metrics = json.loads(result.stdout)
    self.assertEqual((metrics["dataset"], metrics["examples"],
                      metrics["global_step"]), ("fashion_mnist", 12, 6))
    # The same weights and images as the evaluation at the end of training.
    done = [line for line in self.trained.stdout.splitlines()
            if line.startswith("done:")][0]
    self.assertIn(f"evaluation top-1 {metrics['top1']:.4f}", done)

  def test_export_takes_the_raw_grey_images(self):
    export_dir = os.path.join(self.root, "serving")
    testing.run_binary("export", f"--model_dir={self.model_dir}",
                       f"--export_dir={export_dir}", check=True)
    path = os.path.join(export_dir, "1")
    with open(os.path.join(path, "model_info.json")) as f:
      info = json.load(f)
    self.assertEqual(
        info["signatures"]["serving_default"]["inputs"]["images"]["shape"],
        [-1, 28, 28, 1])
    self.assertIn("28x28 grayscale images (zero-padded to 32x32)",
                  info["input"]["accepts"])
    self.assertEqual(info["classes"]["names"][0], "T-shirt/top")
    images = self.raw["test"][0][:3]
    model, _, _ = checkpoints.restore_model(self.model_dir)
    expected = tf.nn.softmax(model(_numpy_eval_preprocessing(images))).numpy()
    loaded = tf.saved_model.load(path)
    served = loaded.signatures["serving_default"](
        images=tf.constant(images, tf.float32))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected,
                               atol=1e-5)
    files = tf.constant([tf.io.encode_png(image).numpy() for image in images])
    from_files = loaded.signatures["predict_images"](images=files)
    np.testing.assert_allclose(from_files["probabilities"].numpy(), expected,
                               atol=1e-5)

  def test_construct_fits_the_images(self):
    output_dir = os.path.join(self.root, "construct")
    testing.run_binary("construct", "--dataset=fashion_mnist",
                       f"--data_dir={self.data_dir}", "--num_examples=20",
                       f"--output_dir={output_dir}", check=True)
    with open(os.path.join(output_dir, "report.json")) as f:
      report = json.load(f)
    self.assertEqual((report["n"], report["d"]), (20, 28 * 28))
    self.assertEqual(report["training_accuracy"], 1.0)


if __name__ == "__main__":
  absltest.main()
