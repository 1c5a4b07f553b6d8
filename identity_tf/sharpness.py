"""Sharpness: the largest eigenvalue of the training loss's Hessian.

Gradient descent with step size eta and heavy-ball momentum beta on a
quadratic with curvature lambda is stable if and only if
lambda < 2 (1 + beta) / eta (Polyak, 1964; Goh, 2017, "Why momentum really
works"): beyond that threshold every step overshoots more than the last.
Near a point of a network's loss the same holds for the top eigenvalue of
the Hessian, the sharpness. For the paper's recipe (eta = 0.05, beta = 0.9)
the threshold is 76. `top_eigenvalue` measures the sharpness of a model's
loss on a fixed batch, so that a run's checkpoints show whether its
divergence is the sharpness crossing the threshold (docs/results.md).
"""

import keras
import numpy as np
import tensorflow as tf

from identity_tf import optimization


def stability_threshold(learning_rate, momentum):
  """2 (1 + momentum) / learning_rate: the largest stable curvature."""
  return 2.0 * (1.0 + momentum) / learning_rate


def loss_function(model, images, labels, weight_decay):
  """() -> the training loss on the batch: mean cross-entropy plus the L2
  term (`optimization.l2_penalty`), as training minimises it."""
  def loss():
    logits = model(images, training=False)
    cross_entropy = tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                     from_logits=True))
    return cross_entropy + optimization.l2_penalty(model, weight_decay)
  return loss


def top_eigenvalue(loss, variables, iterations=20, seed=0):
  """The eigenvalue of largest magnitude of LOSS's Hessian in VARIABLES.

  Power iteration on Hessian-vector products (double backpropagation), from
  a random unit vector; returns (eigenvalue, [estimate after each
  iteration]) -- the Rayleigh quotient v'Hv for the current v.
  """
  rng = np.random.default_rng(seed)
  vector = [tf.constant(rng.standard_normal(v.shape), tf.float32)
            for v in variables]

  @tf.function
  def hessian_vector(vector):
    with tf.GradientTape() as outer:
      with tf.GradientTape() as inner:
        value = loss()
      gradients = inner.gradient(value, variables)
      projection = tf.add_n([tf.reduce_sum(g * v)
                             for g, v in zip(gradients, vector)])
    return outer.gradient(projection, variables)

  estimates = []
  for _ in range(iterations):
    norm = tf.linalg.global_norm(vector)
    vector = [v / norm for v in vector]
    product = hessian_vector(vector)
    estimates.append(float(tf.add_n([tf.reduce_sum(p * v) for p, v in
                                      zip(product, vector)])))
    vector = product
  return estimates[-1], estimates
