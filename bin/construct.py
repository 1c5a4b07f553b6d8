"""Builds the residual network of Theorem 3.2 that fits a labelled data set.

    bazel run //bin:construct -- --data=points.npz --output_dir=out
    bazel run //bin:construct -- --dataset=mnist --num_examples=1000 \\
        --data_dir=DIR --output_dir=out

--data is an .npz with `x` (n, d) float and `y` (n,) integer labels in
[0, r). The network is built by the construction of Section 3 (Lemma B.1,
identity_tf/construction.py), checked on every training point, and written
to --output_dir as weights.npz (framework-free), model.keras (the library's
layers; load after `import identity_tf.construction`) and report.json.
--sgd_steps=N also trains the same architecture by SGD from the paper's init
on the same labels and writes sgd.json: the contrast.
"""

import os

# One BLAS thread per worker: the construction splits its work over two
# threads itself, and a multi-threaded BLAS on a shared machine spins for
# cores other processes hold (10x slower small products, measured).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import math
import sys
import time

from absl import app
from absl import flags
import numpy as np

from identity_tf import paths

FLAGS = flags.FLAGS
flags.DEFINE_string("data", None, ".npz file with x (n, d) and y (n,)")
flags.DEFINE_string("dataset", None, "TFDS dataset to fit instead of --data "
                    "(training images, flattened), e.g. mnist")
flags.DEFINE_integer("num_examples", 1000, "examples of --dataset to fit")
flags.DEFINE_string("data_dir", None, "TFDS data directory for --dataset "
                    "(default ~/tensorflow_datasets); never downloads")
flags.DEFINE_integer("num_classes", None, "r; default: max label + 1 (the "
                     "dataset's classes for --dataset)")
flags.DEFINE_integer("seed", 0, "seed of the projection and surrogates")
flags.DEFINE_string("output_dir", None, "where to write weights.npz, "
                    "model.keras and report.json")
flags.DEFINE_integer("keras_check_examples", 2000, "check model.keras (loaded "
                     "back from disk) on this many training points; -1 = all")
flags.DEFINE_integer("sgd_steps", 0, "if > 0: also train the same "
                     "architecture by SGD for this many steps (the contrast)")
flags.DEFINE_integer("sgd_batch_size", 128, "batch size of --sgd_steps")
flags.DEFINE_float("sgd_learning_rate", 0.1, "learning rate of --sgd_steps")


def log(message):
  print(message, flush=True)


def read_npz(path):
  if not os.path.exists(path):
    raise SystemExit(f"error: --data={path} does not exist")
  try:
    with np.load(path, allow_pickle=False) as data:
      missing = [key for key in ("x", "y") if key not in data.files]
      if missing:
        raise SystemExit(
            f"error: --data={path} has no key(s) {', '.join(missing)}; it "
            f"needs x (n, d) float and y (n,) integer labels "
            f"(np.savez(path, x=x, y=y))")
      return data["x"], data["y"]
  except SystemExit:
    raise
  except Exception as error:  # pylint: disable=broad-except
    raise SystemExit(f"error: --data={path} is not a readable .npz file "
                     f"({type(error).__name__}: {error})") from None


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"error: unexpected arguments {' '.join(argv[1:])}; all "
                     f"options are --flags")
  if not FLAGS.output_dir:
    raise SystemExit("error: --output_dir is required (where to write "
                     "weights.npz, model.keras and report.json)")
  if (FLAGS.data is None) == (FLAGS.dataset is None):
    raise SystemExit("error: give exactly one of --data=points.npz or "
                     "--dataset=NAME --num_examples=N")
  # Importing TensorFlow/Keras takes seconds: only after the flags are valid.
  from identity_tf import construction  # pylint: disable=g-import-not-at-top

  started, cpu_started = time.time(), time.process_time()
  num_classes = FLAGS.num_classes
  if FLAGS.data is not None:
    x, y = read_npz(paths.resolve_path(FLAGS.data))
    source = FLAGS.data
  else:
    data_dir = paths.resolve_path(FLAGS.data_dir) if FLAGS.data_dir else None
    log(f"reading {FLAGS.num_examples} examples of {FLAGS.dataset}")
    try:
      x, y, classes = construction.load_tfds(
          FLAGS.dataset, FLAGS.num_examples, data_dir)
    except ValueError as error:
      raise SystemExit(f"error: {error}") from None
    num_classes = num_classes or classes
    source = f"tfds:{FLAGS.dataset}[:{len(x)}]"
  try:
    result = construction.construct(x, y, num_classes=num_classes,
                                    seed=FLAGS.seed, log=log)
  except ValueError as error:
    raise SystemExit(f"error: {error}") from None
  built, built_cpu = time.time() - started, time.process_time() - cpu_started
  x, y, r = construction.validate(x, y, num_classes)
  weights = result.weights

  output_dir = paths.resolve_path(FLAGS.output_dir)
  os.makedirs(output_dir, exist_ok=True)
  weights_path = os.path.join(output_dir, "weights.npz")
  construction.save_weights(weights, weights_path)

  # Verify what was written: the framework-free file, on every point.
  log(f"verifying weights.npz on all {len(x)} training points")
  verify_started, verify_cpu = time.time(), time.process_time()
  saved = construction.load_weights(weights_path)
  fit = construction.accuracy(saved, x, y, log=log)
  verified = time.time() - verify_started
  verified_cpu = time.process_time() - verify_cpu
  log(f"training accuracy from weights.npz: {fit:.6f} ({verified:.1f} s)")

  log(f"building model.keras ({result.num_units} residual units)")
  keras_started = time.time()
  import keras  # pylint: disable=g-import-not-at-top
  model_path = os.path.join(output_dir, "model.keras")
  construction.build_keras_model(weights).save(model_path)
  loaded = keras.models.load_model(model_path)
  count = len(x) if FLAGS.keras_check_examples < 0 else min(
      len(x), FLAGS.keras_check_examples)
  check = np.random.default_rng(FLAGS.seed).permutation(len(x))[:count]
  logits = construction.keras_logits(loaded, x[check])
  keras_fit = float(np.mean(np.argmax(logits, axis=1) == y[check]))
  keras_seconds = time.time() - keras_started
  log(f"training accuracy from model.keras on {count} points: "
      f"{keras_fit:.6f} ({keras_seconds:.1f} s)")

  n, d, k = len(x), x.shape[1], result.k
  parameters = construction.count_parameters(weights)
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
      "parameters": parameters,
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
  if FLAGS.sgd_steps > 0:
    log(f"SGD contrast: the same architecture (k = {k}, L = "
        f"{result.num_units}) from the paper's init, {FLAGS.sgd_steps} steps")
    sgd_started = time.time()
    history = construction.train_by_sgd(
        x, y, r, k, result.num_units, FLAGS.sgd_steps,
        batch_size=FLAGS.sgd_batch_size,
        learning_rate=FLAGS.sgd_learning_rate, seed=FLAGS.seed, log=log)
    sgd = {"steps": FLAGS.sgd_steps, "batch_size": FLAGS.sgd_batch_size,
           "learning_rate": FLAGS.sgd_learning_rate,
           "history": [{"step": s, "training_accuracy": a} for s, a in history],
           "final_training_accuracy": history[-1][1],
           "seconds": time.time() - sgd_started}
    with open(os.path.join(output_dir, "sgd.json"), "w") as f:
      json.dump(sgd, f, indent=2)
    report["sgd_final_training_accuracy"] = history[-1][1]
    report["sgd_steps_run"] = history[-1][0]
  with open(os.path.join(output_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  log(json.dumps({key: report[key] for key in (
      "n", "d", "r", "k", "L", "parameters", "rho", "rho_prime", "ratio",
      "training_accuracy", "keras_accuracy", "seconds")}))
  if fit < 1.0 or keras_fit < 1.0:
    print(f"error: the constructed network fits only {fit:.6f} of the "
          f"training points (model.keras: {keras_fit:.6f}); this is a bug",
          file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  app.run(main)
