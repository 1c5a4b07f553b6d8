"""The contrast to the construction: the same architecture trained by SGD."""

import time

import keras
import numpy as np

from identity_tf.theory import construction
from identity_tf.theory import construction_model


def train_by_sgd(x, y, num_classes, k, num_units, steps, batch_size=128,
                 learning_rate=0.1, seed=0, log=None):
  """The contrast: the same architecture trained by SGD from the paper's init.

  Same normalisation and a fixed Gaussian A0 (as in the construction), L
  DenseResidualUnits of width k and a ReLU readout with r hidden units,
  initialised with the paper's Gaussian (std 1/k), trained on the
  cross-entropy with SGD + momentum 0.9, float32 for speed. Stops at 100 %
  training accuracy. Returns (history, model): (step, training accuracy)
  every `steps // 20` steps, and the trained Keras model (its logits on
  held-out points: `model(x.astype(np.float32))`).
  """
  log = log or (lambda message: None)
  x, y, r = construction.validate(x, y, num_classes)
  mu, s, t = construction.normalization(x)
  dim = x.shape[1] + 1
  a0, _, _ = construction.draw_projection(np.random.default_rng((seed, 0)),
                                          k, dim, r)
  keras.utils.set_random_seed(seed)
  model = construction_model.build_architecture(
      x.shape[1], k, num_units, r, r, init="paper", dtype="float32",
      seed=seed)
  model.projection.set_values(mu, s, t, a0)
  model.compile(
      optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  x32 = x.astype(np.float32)
  rng = np.random.default_rng(seed)
  history = []
  every = max(1, steps // 20)
  for step in range(1, steps + 1):
    batch = rng.integers(0, len(x), size=min(batch_size, len(x)))
    model.train_on_batch(x32[batch], y[batch])
    if step % every == 0 or step == steps:
      logits = np.asarray(model(x32))
      fit = float(np.mean(np.argmax(logits, axis=1) == y))
      history.append((step, fit))
      log(f"  sgd step {step}: training accuracy {fit:.4f}")
      if fit == 1.0:
        break
  return history, model


def contrast(x, y, num_classes, k, num_units, schedule, seed=0, x_test=None,
             y_test=None, log=None):
  """`train_by_sgd` with SCHEDULE (steps, batch size, learning rate) on the
  architecture of a construction (width K, NUM_UNITS units), measured.

  Returns (figures, record): figures for a report --
  sgd_final_training_accuracy, sgd_steps_run and, with X_TEST, Y_TEST,
  sgd_test_accuracy (top-1 of the trained model on them) -- and the record
  of the run (its schedule, history and seconds; sgd.json).
  """
  log = log or (lambda message: None)
  steps, batch_size, learning_rate = schedule
  log(f"SGD contrast: the same architecture (k = {k}, L = {num_units}) from "
      f"the paper's init, {steps} steps")
  started = time.time()
  history, model = train_by_sgd(
      x, y, num_classes, k, num_units, steps, batch_size=batch_size,
      learning_rate=learning_rate, seed=seed, log=log)
  figures = {"sgd_final_training_accuracy": history[-1][1],
             "sgd_steps_run": history[-1][0]}
  if x_test is not None:
    # In chunks: a whole test split at width k at once is k floats per point
    # per unit.
    logits = np.concatenate([
        np.asarray(model(np.asarray(x_test[start:start + 4096], np.float32)))
        for start in range(0, len(x_test), 4096)])
    figures["sgd_test_accuracy"] = float(
        np.mean(np.argmax(logits, axis=1) == y_test))
    log(f"SGD test accuracy: {figures['sgd_test_accuracy']:.4f}")
  record = {"steps": steps, "batch_size": batch_size,
            "learning_rate": learning_rate,
            "history": [{"step": s, "training_accuracy": a}
                        for s, a in history],
            "final_training_accuracy": history[-1][1],
            "test_accuracy": figures.get("sgd_test_accuracy"),
            "seconds": time.time() - started}
  return figures, record
