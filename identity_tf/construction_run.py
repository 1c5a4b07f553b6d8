"""What //bin:construct does: build the network of Theorem 3.2 for a data set,
check it, and write weights.npz, model.keras, report.json (and sgd.json).

`run(x, y, output_dir)` builds the network (`construction.construct`),
verifies the framework-free weights.npz on every training point, builds and
checks the Keras model (`construction_model`), optionally trains the same
architecture by SGD for contrast (`construction_sgd`), and returns the
report it writes. `read_npz` and `load_dataset` read the two kinds of input.
"""

import json
import math
import os
import time

import numpy as np

from identity_tf import construction


def read_npz(path):
  """(x, y) of an .npz with `x` (n, d) and `y` (n,); ValueError if not."""
  if not os.path.exists(path):
    raise ValueError(f"--data={path} does not exist")
  try:
    with np.load(path, allow_pickle=False) as data:
      missing = [key for key in ("x", "y") if key not in data.files]
      if not missing:
        return data["x"], data["y"]
  except Exception as error:  # pylint: disable=broad-except
    raise ValueError(f"--data={path} is not a readable .npz file "
                     f"({type(error).__name__}: {error})") from None
  raise ValueError(
      f"--data={path} has no key(s) {', '.join(missing)}; it needs x (n, d) "
      f"float and y (n,) integer labels (np.savez(path, x=x, y=y))")


def load_dataset(name, num_examples, data_dir=None):
  """The first NUM_EXAMPLES training images of dataset NAME, flattened.

  NAME is any TFDS image-classification dataset (or `synthetic`), read by
  `tfds_data.load_arrays`: never downloads, and a dataset that is not
  prepared in DATA_DIR raises ValueError saying how to prepare it. The raw
  pixels are used as they are stored (grayscale stays one channel per
  pixel).

  Returns (x float64 (n, pixels), y int64, number of classes).
  """
  from identity_tf import tfds_data  # pylint: disable=g-import-not-at-top
  if num_examples < 1:
    raise ValueError(f"--num_examples must be >= 1, got {num_examples}")
  info = tfds_data.dataset_info(name, data_dir)
  images, labels, info = tfds_data.load_arrays(
      name, info.train_split, data_dir, num_examples)
  if not len(labels):
    raise ValueError(f"dataset {name!r} has no training examples")
  x = images.reshape(len(images), -1).astype(np.float64)
  return x, labels.astype(np.int64), info.num_classes


def _prepare_output_dir(output_dir):
  """OUTPUT_DIR, created; ValueError before any work if it cannot be."""
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as error:
    raise ValueError(f"--output_dir={output_dir} cannot be created "
                     f"({error.strerror}); give a directory") from None
  if not os.access(output_dir, os.W_OK):
    raise ValueError(f"--output_dir={output_dir} is not writable")
  return output_dir


def run(x, y, output_dir, *, num_classes=None, seed=0, source=None,
        keras_check_examples=2000, sgd_steps=0, sgd_batch_size=128,
        sgd_learning_rate=0.1, log=print):
  """Builds, checks and writes the network that fits (X, Y); returns the report.

  KERAS_CHECK_EXAMPLES training points (all if < 0) are checked with
  model.keras loaded back from disk. With SGD_STEPS > 0 the same
  architecture is also trained by SGD from the paper's initialisation
  (sgd.json). Raises ValueError for bad data (one line).
  """
  from identity_tf import construction_model  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  _prepare_output_dir(output_dir)
  started, cpu_started = time.time(), time.process_time()
  result = construction.construct(x, y, num_classes=num_classes, seed=seed,
                                  log=log)
  built, built_cpu = time.time() - started, time.process_time() - cpu_started
  x, y, r = construction.validate(x, y, num_classes)
  weights = result.weights
  weights_path = os.path.join(output_dir, "weights.npz")
  construction.save_weights(weights, weights_path)

  # Verify what was written: the framework-free file, on every point.
  log(f"verifying weights.npz on all {len(x)} training points")
  verify_started, verify_cpu = time.time(), time.process_time()
  fit = construction.accuracy(construction.load_weights(weights_path), x, y,
                              log=log)
  verified = time.time() - verify_started
  verified_cpu = time.process_time() - verify_cpu
  log(f"training accuracy from weights.npz: {fit:.6f} ({verified:.1f} s)")

  log(f"building model.keras ({result.num_units} residual units)")
  keras_started = time.time()
  model_path = os.path.join(output_dir, "model.keras")
  construction_model.build_keras_model(weights).save(model_path)
  loaded = keras.models.load_model(model_path)
  count = len(x) if keras_check_examples < 0 else min(len(x),
                                                      keras_check_examples)
  keras_fit = None
  if count:
    check = np.random.default_rng(seed).permutation(len(x))[:count]
    logits = construction_model.keras_logits(loaded, x[check])
    keras_fit = float(np.mean(np.argmax(logits, axis=1) == y[check]))
  keras_seconds = time.time() - keras_started
  log(f"training accuracy from model.keras on {count} points: "
      f"{keras_fit} ({keras_seconds:.1f} s)")

  n, d, k = len(x), x.shape[1], result.k
  report = {
      "source": source,
      "n": n,
      "n_distinct": int(len(result.distinct)),
      "d": d,
      "r": r,
      "k": k,
      "k_formula": result.k_formula,
      "L": result.num_units,
      "projection": result.mode,
      "draws": result.draws,
      "seed": list(result.seed),
      "parameters": construction.count_parameters(weights),
      "residual_parameters": construction.residual_parameters(weights),
      "n_log_n_plus_r2": n * math.log(max(n, 2)) + r * r,
      "ratio": construction.parameter_ratio(weights, n, r),
      "rho": result.rho,
      "closest_pair": list(result.closest),
      "smallest_separation_handled": construction.smallest_separation(k),
      "rho_prime": result.rho_prime,
      "lemma_margin": result.margin,
      "output_margin": result.output_margin,
      "training_accuracy": fit,
      # null when --keras_check_examples=0: nothing was checked.
      "keras_accuracy": keras_fit,
      "keras_checked": count,
      "seconds": time.time() - started,
      "seconds_construct": result.seconds,
      "seconds_build_and_verify": built + verified,
      # CPU seconds of all threads: on a shared machine, wall time / 2 cores
      # understates what an idle 2-core machine does.
      "cpu_seconds_build_and_verify": built_cpu + verified_cpu,
      "seconds_keras": keras_seconds,
  }
  if sgd_steps > 0:
    from identity_tf import construction_sgd  # pylint: disable=g-import-not-at-top
    log(f"SGD contrast: the same architecture (k = {k}, L = "
        f"{result.num_units}) from the paper's init, {sgd_steps} steps")
    sgd_started = time.time()
    history = construction_sgd.train_by_sgd(
        x, y, r, k, result.num_units, sgd_steps, batch_size=sgd_batch_size,
        learning_rate=sgd_learning_rate, seed=seed, log=log)
    sgd = {"steps": sgd_steps, "batch_size": sgd_batch_size,
           "learning_rate": sgd_learning_rate,
           "history": [{"step": s, "training_accuracy": a}
                       for s, a in history],
           "final_training_accuracy": history[-1][1],
           "seconds": time.time() - sgd_started}
    with open(os.path.join(output_dir, "sgd.json"), "w") as f:
      json.dump(sgd, f, indent=2)
    report["sgd_final_training_accuracy"] = history[-1][1]
    report["sgd_steps_run"] = history[-1][0]
  with open(os.path.join(output_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report
