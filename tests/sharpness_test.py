"""Tests of identity_tf/training/sharpness.py and bin/sharpness.py."""

import json
import os

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf.training import sharpness
from identity_tf.training import trainer
import testing


class SharpnessTest(absltest.TestCase):

  def test_power_iteration_finds_the_top_eigenvalue_of_a_quadratic(self):
    rng = np.random.default_rng(0)
    basis, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    eigenvalues = np.array([5.0, 3.0, 1.0, 0.5, -0.5, 0.1])
    hessian = (basis * eigenvalues) @ basis.T
    x = tf.Variable(rng.standard_normal(6), dtype=tf.float32)
    a = tf.constant(hessian, tf.float32)
    value, _ = sharpness.top_eigenvalue(
        lambda: 0.5 * tf.tensordot(x, tf.linalg.matvec(a, x), 1), [x],
        iterations=60)
    self.assertAlmostEqual(value, 5.0, places=3)

  def test_matches_the_exact_hessian_of_a_small_network(self):
    rng = np.random.default_rng(1)
    images = rng.standard_normal((16, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 16).astype(np.int32)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5,
                                                                    "tanh"),
                              keras.layers.Dense(3)])
    loss = sharpness.loss_function(model, images, labels, weight_decay=0.0)
    flat = tf.Variable(tf.concat([tf.reshape(v, [-1])
                                  for v in model.trainable_variables], 0))

    def unflattened_loss():
      offset, logits = 0, images
      weights = []
      for v in model.trainable_variables:
        size = int(np.prod(v.shape))
        weights.append(tf.reshape(flat[offset:offset + size], v.shape))
        offset += size
      hidden = tf.tanh(images @ weights[0] + weights[1])
      logits = hidden @ weights[2] + weights[3]
      return tf.reduce_mean(
          keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                       from_logits=True))

    with tf.GradientTape() as outer:
      with tf.GradientTape() as inner:
        value = unflattened_loss()
      gradient = inner.gradient(value, flat)
    exact = np.linalg.eigvalsh(outer.jacobian(gradient, flat).numpy())
    top = exact[np.argmax(np.abs(exact))]
    self.assertAlmostEqual(float(loss()), float(unflattened_loss()), places=5)
    value, _ = sharpness.top_eigenvalue(loss, model.trainable_variables,
                                        iterations=200)
    self.assertAlmostEqual(value / top, 1.0, delta=1e-3)

  def test_the_loss_is_the_inference_cross_entropy_plus_the_l2_term(self):
    # What training minimises, measured where evaluation measures it:
    # batch norm with its moving statistics, and wd ||W||^2 / 2 of the
    # weights the scope decays (here every kernel of rank >= 2).
    rng = np.random.default_rng(2)
    images = rng.standard_normal((12, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 12).astype(np.int32)
    norm = keras.layers.BatchNormalization()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), norm,
                              keras.layers.Activation("tanh"),
                              keras.layers.Dense(3)])
    norm.moving_mean.assign(rng.normal(0.5, 0.3, 5))
    norm.moving_variance.assign(rng.uniform(0.5, 2.0, 5))
    w1, b1, gamma, beta, mean, variance, w2, b2 = model.get_weights()
    hidden = np.tanh((images @ w1 + b1 - mean) / np.sqrt(variance + 1e-3)
                     * gamma + beta)
    logits = (hidden @ w2 + b2).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    cross_entropy = -log_p[np.arange(12), labels].mean()
    for decay, scope, decayed in ((0.0, "kernels", 0.0),
                                  (0.3, "kernels", (w1 ** 2).sum()
                                   + (w2 ** 2).sum()),
                                  (0.3, "convolutions", 0.0)):
      loss = sharpness.loss_function(model, images, labels, decay, scope)
      self.assertAlmostEqual(float(loss()),
                             cross_entropy + decay * decayed / 2, places=5)

  def test_the_threshold_is_where_heavy_ball_stops_converging(self):
    # Heavy ball on f(x) = lambda x^2 / 2, Keras SGD's update.
    eta, beta = 0.05, 0.9
    threshold = sharpness.stability_threshold(eta, beta)
    self.assertAlmostEqual(threshold, 76.0)
    for factor, converges in ((0.98, True), (1.02, False)):
      x, m = 1.0, 0.0
      for _ in range(5000):
        m = beta * m - eta * factor * threshold * x
        x += m
      self.assertEqual(abs(x) < 1e-3, converges, factor)

  def test_binary_measures_every_checkpoint(self):
    model_dir = self.create_tempdir().full_path
    # The rate drops tenfold after step 7: each checkpoint's threshold is
    # its own step's.
    config = configs.from_preset("smoke", width=0.0625, batch_size=16,
                             train_steps=10, checkpoint_steps=5,
                             steps_per_loop=5, log_steps=5,
                             eval_at_end=False, lr_schedule="piecewise",
                             lr_boundaries=(7,))
    trainer.train(config, model_dir, echo=lambda line: None)
    result = testing.run_binary("sharpness", f"--model_dir={model_dir}",
                                "--num_examples=32", "--iterations=5",
                                check=True)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    self.assertEqual([line["step"] for line in lines], [5, 10])
    for line, rate in zip(lines, (0.01, 0.001)):
      self.assertAlmostEqual(line["learning_rate"], rate, places=9)
      self.assertAlmostEqual(line["threshold"], 2 * 1.9 / rate, places=2)
      self.assertAlmostEqual(line["ratio"],
                             line["sharpness"] / line["threshold"], places=3)
    bad = testing.run_binary("sharpness",
                             f"--model_dir={os.path.join(model_dir, 'x')}")
    self.assertEqual(bad.returncode, 1)
    self.assertRegex(testing.last_stderr_line(bad),
                     r"^error: --model_dir=.* holds no training run")


if __name__ == "__main__":
  absltest.main()
