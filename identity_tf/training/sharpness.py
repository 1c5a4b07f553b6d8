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

from identity_tf import errors
from identity_tf.training import optimization


def stability_threshold(learning_rate, momentum):
  """2 (1 + momentum) / learning_rate: the largest stable curvature."""
  return 2.0 * (1.0 + momentum) / learning_rate


def loss_function(model, images, labels, weight_decay,
                  scope="convolutions"):
  """() -> the training loss on the batch: mean cross-entropy plus the L2
  term (`optimization.l2_penalty`), as training minimises it."""
  def loss():
    logits = model(images, training=False)
    cross_entropy = tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                     from_logits=True))
    return cross_entropy + optimization.l2_penalty(model, weight_decay,
                                                   scope)
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


def measure_run(model_dir, *, steps=None, data_dir=None, num_examples=512,
                iterations=20, emit, log=None):
  """The sharpness of MODEL_DIR's run at each of its checkpoints (//bin:sharpness).

  For every checkpoint (or those of STEPS), EMIT receives {step,
  sharpness: the top Hessian eigenvalue of the training loss on the first
  NUM_EXAMPLES training images with evaluation preprocessing, learning_rate
  at that step, threshold: `stability_threshold` at that rate and the run's
  momentum, ratio, last_change: the relative change of the last power
  iteration}. LOG hears of each checkpoint as it starts.
  """
  # pylint: disable=g-import-not-at-top
  from identity_tf.data import pipeline
  from identity_tf.training import checkpoints
  from identity_tf.training import run as run_lib
  # pylint: enable=g-import-not-at-top
  run = run_lib.read(model_dir, data_dir)
  steps = list(steps or reversed([checkpoints.checkpoint_step(p) for p in
                                  checkpoints.checkpoint_prefixes(model_dir)]))
  if not steps:
    raise errors.CheckpointError(f"no checkpoint in --model_dir={model_dir}")
  images, labels = next(iter(pipeline.build_dataset(
      run.config.dataset, run.dataset.train_split, num_examples,
      training=False, data_dir=data_dir, num_examples=num_examples,
      preprocessing=run.preprocessing)))
  schedule = optimization.learning_rate_schedule(run.schedule)
  model = loss = None
  for step in steps:
    path = checkpoints.find_checkpoint(model_dir, step)
    if model is None:
      # The iterate SGD steps from, not its average (--ema_decay).
      model, _, _ = checkpoints.restore_checkpoint(model_dir, path,
                                                   averaged=False)
      loss = loss_function(model, images, labels, run.config.weight_decay,
                           run.config.weight_decay_scope)
    else:
      tf.train.Checkpoint(model=model).read(path).expect_partial()
    if log:
      log(f"step {step}: {iterations} power iterations")
    value, estimates = top_eigenvalue(loss, model.trainable_variables,
                                      iterations)
    rate = float(schedule(step) if callable(schedule) else schedule)
    threshold = stability_threshold(rate, run.config.momentum)
    emit({"step": step, "sharpness": round(value, 4),
          "learning_rate": rate, "threshold": round(threshold, 4),
          "ratio": round(value / threshold, 4),
          "last_change": round(abs(estimates[-1] - estimates[-2]) /
                               max(abs(value), 1e-12), 4)
                         if len(estimates) > 1 else None})
