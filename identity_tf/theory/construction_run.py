"""What //bin:construct does: build the network of Theorem 3.2 for a data set,
check it, and write weights.npz, model.keras, report.json (and sgd.json).

`run(x, y, output_dir)` builds the network (`construction.construct`),
verifies the framework-free weights.npz on every training point, builds and
checks the Keras model (`construction_model`), optionally trains the same
architecture by SGD for contrast (`construction_sgd`), and returns the
report it writes. `read_npz` and `load_dataset` read the two kinds of input;
`construct_command` is the binary: read, `run`, print the summary.
"""

import json
import math
import os
import time

import numpy as np

from identity_tf.theory import construction


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
  from identity_tf.data import tfds_data  # pylint: disable=g-import-not-at-top
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


# The report's figures //bin:construct prints on stdout, as one JSON line.
SUMMARY_KEYS = ("n", "d", "r", "k", "L", "parameters", "rho", "rho_prime",
                "ratio", "training_accuracy", "keras_accuracy", "seconds")


def construct_command(output_dir, *, data=None, data_as_typed=None,
                      dataset=None, num_examples=1000, data_dir=None,
                      num_classes=None, log=print, emit=print, **options):
  """//bin:construct: fits the points of DATA or of DATASET, writes the network.

  DATA: an .npz with x and y (`read_npz`), recorded in report.json as
  DATA_AS_TYPED (how the user wrote it); DATASET: the first NUM_EXAMPLES
  training images of a TFDS dataset in DATA_DIR (`load_dataset`), whose class
  count is r unless NUM_CLASSES is given. OPTIONS go to `run`. Emits the
  SUMMARY_KEYS of the report and returns it; raises ValueError (one line)
  for bad input, and for a network that does not fit every checked training
  point (a bug).
  """
  if (data is None) == (dataset is None):
    raise ValueError("give exactly one of --data=points.npz or "
                     "--dataset=NAME --num_examples=N")
  if data is not None:
    x, y = read_npz(data)
    source = data if data_as_typed is None else data_as_typed
  else:
    log(f"reading {num_examples} examples of {dataset}")
    x, y, classes = load_dataset(dataset, num_examples, data_dir)
    num_classes = num_classes or classes
    source = f"tfds:{dataset}[:{len(x)}]"
  report = run(x, y, output_dir, num_classes=num_classes, source=source,
               log=log, **options)
  emit({key: report[key] for key in SUMMARY_KEYS})
  if report["training_accuracy"] < 1.0 or report["keras_accuracy"] not in (
      None, 1.0):
    raise ValueError(
        f"the constructed network fits only "
        f"{report['training_accuracy']:.6f} of the training points "
        f"(model.keras: {report['keras_accuracy']}); this is a bug")
  return report


def run(x, y, output_dir, *, num_classes=None, seed=0, source=None,
        keras_check_examples=2000, sgd_steps=0, sgd_batch_size=128,
        sgd_learning_rate=0.1, log=print):
  """Builds, checks and writes the network that fits (X, Y); returns the report.

  KERAS_CHECK_EXAMPLES training points (all if < 0) are checked with
  model.keras loaded back from disk. With SGD_STEPS > 0 the same
  architecture is also trained by SGD from the paper's initialisation
  (sgd.json). Raises ValueError for bad data (one line).
  """
  # Imported before the clock starts: TensorFlow's import is not the
  # construction's time.
  from identity_tf.theory import construction_model  # pylint: disable=g-import-not-at-top,unused-import
  _prepare_output_dir(output_dir)
  started, cpu_started = time.time(), time.process_time()
  result = construction.construct(x, y, num_classes=num_classes, seed=seed,
                                  log=log)
  built, built_cpu = time.time() - started, time.process_time() - cpu_started
  x, y, r = construction.validate(x, y, num_classes)
  weights_path = os.path.join(output_dir, "weights.npz")
  construction.save_weights(result.weights, weights_path)
  fit, verified, verified_cpu = _verify_weights(weights_path, x, y, log)
  keras_fit, count, keras_seconds = _check_keras(
      result, x, y, os.path.join(output_dir, "model.keras"),
      keras_check_examples, seed, log)
  report = {
      "source": source,
      **_construction_figures(result, x, r),
      "training_accuracy": fit,
      # null when --keras_check_examples=0: nothing was checked.
      "keras_accuracy": keras_fit,
      "keras_checked": count,
      "seconds": time.time() - started,
      "seconds_construct": result.seconds,
      "seconds_build_and_verify": built + verified,
      # CPU seconds of all threads: on a shared machine, wall time / cores
      # understates what an idle machine does.
      "cpu_seconds_build_and_verify": built_cpu + verified_cpu,
      "seconds_keras": keras_seconds,
  }
  if sgd_steps > 0:
    report.update(_sgd_contrast(
        x, y, r, result, output_dir, sgd_steps, sgd_batch_size,
        sgd_learning_rate, seed, log))
  with open(os.path.join(output_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def _verify_weights(weights_path, x, y, log):
  """The training accuracy of weights.npz read back from disk, on every point,
  with its wall and CPU seconds."""
  log(f"verifying weights.npz on all {len(x)} training points")
  started, cpu_started = time.time(), time.process_time()
  fit = construction.accuracy(construction.load_weights(weights_path), x, y,
                              log=log)
  seconds = time.time() - started
  cpu_seconds = time.process_time() - cpu_started
  log(f"training accuracy from weights.npz: {fit:.6f} ({seconds:.1f} s)")
  return fit, seconds, cpu_seconds


def _check_keras(result, x, y, model_path, check_examples, seed, log):
  """Writes model.keras, loads it back and checks it on CHECK_EXAMPLES random
  training points (all if < 0); (accuracy or None, points checked, seconds)."""
  from identity_tf.theory import construction_model  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  log(f"building model.keras ({result.num_units} residual units)")
  started = time.time()
  construction_model.build_keras_model(result.weights).save(model_path)
  loaded = keras.models.load_model(model_path)
  count = len(x) if check_examples < 0 else min(len(x), check_examples)
  keras_fit = None
  if count:
    check = np.random.default_rng(seed).permutation(len(x))[:count]
    logits = construction_model.keras_logits(loaded, x[check])
    keras_fit = float(np.mean(np.argmax(logits, axis=1) == y[check]))
  seconds = time.time() - started
  log(f"training accuracy from model.keras on {count} points: "
      f"{keras_fit} ({seconds:.1f} s)")
  return keras_fit, count, seconds


def _construction_figures(result, x, r):
  """What report.json says about the network built for X (r classes)."""
  weights = result.weights
  n, d, k = len(x), x.shape[1], result.k
  return {
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
  }


def _sgd_contrast(x, y, r, result, output_dir, steps, batch_size,
                  learning_rate, seed, log):
  """Trains the same architecture by SGD, writes sgd.json; the report's
  figures of it."""
  from identity_tf.theory import construction_sgd  # pylint: disable=g-import-not-at-top
  log(f"SGD contrast: the same architecture (k = {result.k}, L = "
      f"{result.num_units}) from the paper's init, {steps} steps")
  started = time.time()
  history = construction_sgd.train_by_sgd(
      x, y, r, result.k, result.num_units, steps, batch_size=batch_size,
      learning_rate=learning_rate, seed=seed, log=log)
  sgd = {"steps": steps, "batch_size": batch_size,
         "learning_rate": learning_rate,
         "history": [{"step": s, "training_accuracy": a} for s, a in history],
         "final_training_accuracy": history[-1][1],
         "seconds": time.time() - started}
  with open(os.path.join(output_dir, "sgd.json"), "w") as f:
    json.dump(sgd, f, indent=2)
  return {"sgd_final_training_accuracy": history[-1][1],
          "sgd_steps_run": history[-1][0]}
