"""What //bin:construct does: build the network of Theorem 3.2 for a data set,
check it, and write weights.npz, model.keras, report.json (and sgd.json).

`run(x, y, output_dir)` builds the network (`construction.construct`),
verifies the framework-free weights.npz on every training point, builds and
checks the Keras model (`construction_model`), measures its top-1 accuracy on
held-out points, optionally trains the same architecture by SGD for contrast
(`construction_sgd`), and returns the report it writes. `read_npz` and
`load_dataset` read the two kinds of input; `construct_command` is what
the binary runs: read, `run` (or `capacity.run_sweep` for --sweep_n), emit
the summary.
"""

import json
import os
import time

import numpy as np

from identity_tf import errors
from identity_tf import files
from identity_tf.theory import capacity
from identity_tf.theory import construction


def read_npz(path):
  """(x, y) of an .npz with `x` (n, d) and `y` (n,); ValueError if not."""
  if not os.path.exists(path):
    raise errors.ConfigError(f"--data={path} does not exist")
  with open(path, "rb") as f:
    if f.read(2) != b"PK":  # Every .npz is a zip archive.
      raise errors.ConfigError(
          f"--data={path} is not an .npz archive (a text "
          "file?); save it with numpy.savez(path, x=x, y=y)")
  files.check_array_file(path, f"--data={path}")  # Before numpy allocates.
  try:
    with np.load(path, allow_pickle=False) as data:
      missing = [key for key in ("x", "y") if key not in data.files]
      if not missing:
        return data["x"], data["y"]
  except Exception as error:  # pylint: disable=broad-except
    raise errors.ConfigError(f"--data={path} is not a readable .npz file "
                             f"({type(error).__name__}: {error})") from None
  raise errors.ConfigError(
      f"--data={path} has no key(s) {', '.join(missing)}; it needs x (n, d) "
      f"float and y (n,) integer labels (np.savez(path, x=x, y=y))")


def read_npz_held_out(path):
  """(x_test, y_test) of an .npz that has them (points to measure the
  network's test accuracy on), else (None, None)."""
  with np.load(path, allow_pickle=False) as data:
    if "x_test" in data.files and "y_test" in data.files:
      return data["x_test"], data["y_test"]
  return None, None


def load_dataset(name, num_examples, data_dir=None, test=False):
  """The first NUM_EXAMPLES training images of dataset NAME, flattened.

  NAME is any TFDS image-classification dataset (or `synthetic`), read by
  `tfds_data.load_arrays`: never downloads, and a dataset that is not
  prepared in DATA_DIR raises ValueError saying how to prepare it. The raw
  pixels are used as they are stored (grayscale stays one channel per
  pixel). TEST: the held-out split instead (all of it for NUM_EXAMPLES
  None).

  Returns (x float64 (n, pixels), y int64, number of classes).
  """
  from identity_tf.data import tfds_data  # pylint: disable=g-import-not-at-top
  if num_examples is not None and num_examples < 1:
    raise errors.ConfigError(f"--num_examples must be >= 1, got {num_examples}")
  info = tfds_data.dataset_info(name, data_dir)
  split = info.eval_split if test else info.train_split
  if split is None:
    raise errors.ConfigError(
        f"dataset {name!r} has no held-out split to measure "
        f"test accuracy on; pass --test_examples=0")
  images, labels, info = tfds_data.load_arrays(
      name, split, data_dir, num_examples)
  if not len(labels):
    raise errors.ConfigError(f"dataset {name!r} has no {split} examples")
  x = images.reshape(len(images), -1).astype(np.float64)
  return x, labels.astype(np.int64), info.num_classes


def _ignore(_):
  pass


# The report's figures //bin:construct prints on stdout, as one JSON line
# (those present: the test and SGD figures only when measured).
SUMMARY_KEYS = ("n", "d", "r", "k", "L", "projection", "parameters",
                "n_log_n_plus_r2", "ratio", "rho", "rho_prime",
                "training_accuracy", "keras_accuracy", "test_accuracy",
                "sgd_final_training_accuracy", "sgd_test_accuracy", "seconds")


def construct_command(output_dir, *, data=None, data_as_typed=None,
                      dataset=None, num_examples=1000, data_dir=None,
                      num_classes=None, test_examples=-1, sweep_n=None,
                      sweep_dims=None, reduce="pca", reduced_dim=None,
                      log, emit, **options):
  """//bin:construct: fits the points of DATA or of DATASET, writes the network.

  DATA: an .npz with x and y (and optionally x_test, y_test), recorded in
  report.json as DATA_AS_TYPED (how the user wrote it); DATASET: the first
  NUM_EXAMPLES training images of a TFDS dataset in DATA_DIR
  (`load_dataset`), whose class count is r unless NUM_CLASSES is given, and
  the first TEST_EXAMPLES of its held-out split (-1: all, 0: none).
  REDUCED_DIM: the inputs reduced to that many coordinates by REDUCE
  (`capacity.reduction`, fitted on the training points). SWEEP_N (and
  SWEEP_DIMS): `capacity.run_sweep` over the first n points instead of one
  construction (with the sgd_* OPTIONS, SGD at its smallest n). OPTIONS go
  to `run`. Emits the summary and returns the
  report; raises ValueError (one line) for bad flags or input, and for a
  network that does not fit every checked training point (a bug). LOG
  receives the progress lines, EMIT the summary (//bin:construct: stderr,
  and one JSON line on stdout).
  """
  if (data is None) == (dataset is None):
    raise errors.ConfigError("give exactly one of --data=points.npz or "
                             "--dataset=NAME --num_examples=N")
  sizes, dims = _check_sweep_flags(sweep_n, sweep_dims, reduced_dim)
  if sizes:
    num_examples = sizes[-1]
  x, y, x_test, y_test, num_classes, source = _read_points(
      data, data_as_typed, dataset, num_examples, data_dir, num_classes,
      test_examples, log)
  if sizes:
    x, y, r = construction.validate(x, y, num_classes)
    dims = dims or [x.shape[1]]
    capacity.check_sweep(sizes, dims, len(x), x.shape[1], source)
    files.prepare_output_dir(output_dir)
    summary = capacity.run_sweep(
        x, y, r, output_dir, sizes, dims, method=reduce,
        seed=options.get("seed", 0), x_test=x_test, y_test=y_test,
        johnson_lindenstrauss=options.get("johnson_lindenstrauss", False),
        sgd=_sgd_schedule(options), source=source, log=log)
    emit(summary)
    return summary
  mapping = None
  if reduced_dim is not None:
    x, y, _ = construction.validate(x, y, num_classes)
    if reduced_dim > x.shape[1]:
      raise errors.ConfigError(
          f"--reduced_dim={reduced_dim} exceeds the inputs' "
          f"d = {x.shape[1]}; give at most {x.shape[1]}")
    mapping = capacity.reduction(x, reduced_dim, reduce,
                                 options.get("seed", 0))
  report = run(x, y, output_dir, num_classes=num_classes, source=source,
               x_test=x_test, y_test=y_test, reduction=mapping, log=log,
               **options)
  emit({key: report[key] for key in SUMMARY_KEYS if key in report})
  if report["training_accuracy"] < 1.0 or report["keras_accuracy"] not in (
      None, 1.0):
    raise errors.ConfigError(
        f"the constructed network fits only "
        f"{report['training_accuracy']:.6f} of the training points "
        f"(model.keras: {report['keras_accuracy']}); this is a bug")
  return report


def _sgd_schedule(options):
  """(steps, batch size, learning rate) of the --sgd_* OPTIONS, or None
  without --sgd_steps."""
  if not options.get("sgd_steps"):
    return None
  return (options["sgd_steps"], options.get("sgd_batch_size", 128),
          options.get("sgd_learning_rate", 0.1))


def _check_sweep_flags(sweep_n, sweep_dims, reduced_dim):
  """(sizes, dims) of --sweep_n and --sweep_dims (None when not given);
  ValueError (one line) for flags that do not go together."""
  if sweep_n is None:
    if sweep_dims is not None:
      raise errors.ConfigError(
          "--sweep_dims needs --sweep_n (the sizes n to sweep); "
          "for one construction use --reduced_dim")
    return None, None
  if reduced_dim is not None:
    raise errors.ConfigError(
        "--reduced_dim is for one construction; with --sweep_n "
        "give the dimensions as --sweep_dims")
  # --sgd_steps is allowed: the sweep trains SGD at its smallest n
  # (`capacity.sweep`).
  sizes = capacity.parse_positive_list(sweep_n, "sweep_n")
  dims = (None if sweep_dims is None
          else capacity.parse_positive_list(sweep_dims, "sweep_dims"))
  return sizes, dims


def _read_points(data, data_as_typed, dataset, num_examples, data_dir,
                 num_classes, test_examples, log):
  """(x, y, x_test, y_test, num_classes, source) of --data or --dataset;
  x_test, y_test are None when there are none (or TEST_EXAMPLES is 0)."""
  x_test = y_test = None
  if data is not None:
    x, y = read_npz(data)
    source = data if data_as_typed is None else data_as_typed
    if test_examples:
      x_test, y_test = read_npz_held_out(data)
      _check_held_out(x, x_test, y_test, source)
  else:
    log(f"reading {num_examples} examples of {dataset}")
    x, y, classes = load_dataset(dataset, num_examples, data_dir)
    if test_examples:
      x_test, y_test, _ = load_dataset(
          dataset, None if test_examples < 0 else test_examples, data_dir,
          test=True)
    num_classes = num_classes or classes
    source = f"tfds:{dataset}[:{len(x)}]"
  if x_test is not None and 0 < test_examples < len(x_test):
    x_test, y_test = x_test[:test_examples], y_test[:test_examples]
  return x, y, x_test, y_test, num_classes, source


def _check_held_out(x, x_test, y_test, source):
  """ValueError (one line) unless X_TEST, Y_TEST are valid points and labels
  in X's dimension."""
  if x_test is None:
    return
  try:
    x_test, _, _ = construction.validate(x_test, y_test)
  except ValueError as error:
    raise errors.ConfigError(
        f"--data={source}: x_test, y_test: {error}") from None
  if x_test.shape[1] != np.shape(x)[1]:
    raise errors.ConfigError(
        f"--data={source}: x_test has {x_test.shape[1]} "
        f"coordinates but x has {np.shape(x)[1]}; the test "
        f"points must be in the training points' space")


def run(x, y, output_dir, *, num_classes=None, seed=0, source=None,
        x_test=None, y_test=None, reduction=None, johnson_lindenstrauss=False,
        keras_check_examples=2000, sgd_steps=0, sgd_batch_size=128,
        sgd_learning_rate=0.1, log=_ignore):
  """Builds, checks and writes the network that fits (X, Y); returns the report.

  REDUCTION (a `capacity.Reduction`, or None): the map applied to X and
  X_TEST first (saved as reduction.npz: the network takes its outputs).
  JOHNSON_LINDENSTRAUSS: `construction.construct`'s option. KERAS_CHECK_EXAMPLES
  training points (all if < 0) are checked with model.keras loaded back from
  disk. With X_TEST, Y_TEST the network's top-1 accuracy on them
  (`capacity.held_out`). With SGD_STEPS > 0 the same architecture is also
  trained by SGD from the paper's initialisation (sgd.json; its test
  accuracy too). Raises ValueError for bad data (one line).
  """
  # Imported before the clock starts: TensorFlow's import is not the
  # construction's time.
  from identity_tf.theory import construction_model  # pylint: disable=g-import-not-at-top,unused-import
  files.prepare_output_dir(output_dir)
  x, x_test, reduced = _reduce(reduction, x, x_test, output_dir, log)
  started, cpu_started = time.time(), time.process_time()
  result = construction.construct(
      x, y, num_classes=num_classes, seed=seed,
      johnson_lindenstrauss=johnson_lindenstrauss, log=log)
  built, built_cpu = time.time() - started, time.process_time() - cpu_started
  x, y, r = construction.validate(x, y, num_classes)
  weights_path = os.path.join(output_dir, "weights.npz")
  construction.save_weights(result.weights, weights_path)
  fit, verified, verified_cpu = _verify_weights(weights_path, x, y, log)
  keras_fit, count, keras_seconds = _check_keras(
      result, x, y, os.path.join(output_dir, "model.keras"),
      keras_check_examples, seed, log)
  report = {
      "source": source, **reduced, **_construction_figures(result, x, r),
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
  if x_test is not None:
    log(f"test accuracy on {len(x_test)} held-out points")
    report.update(capacity.held_out(result.weights, x_test, y_test, log))
  if sgd_steps > 0:
    report.update(_sgd_contrast(
        x, y, r, result, output_dir, (sgd_steps, sgd_batch_size,
                                      sgd_learning_rate), seed, x_test,
        y_test, log))
  with open(os.path.join(output_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  return report


def _reduce(reduction, x, x_test, output_dir, log):
  """(x, x_test) through REDUCTION (unchanged if None), saved as
  OUTPUT_DIR/reduction.npz, and what the report says about it."""
  if reduction is None:
    return x, x_test, {"reduce": "none"}
  log(f"reducing d = {x.shape[1]} to {reduction.dim} coordinates "
      f"({reduction.method}, fitted on the {len(x)} training points)")
  reduction.save(os.path.join(output_dir, "reduction.npz"))
  return (reduction.apply(x),
          None if x_test is None else reduction.apply(x_test),
          {"reduce": reduction.method, "d_raw": int(x.shape[1])})


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
  k = result.k
  return {
      **capacity.network_figures(result, len(x), x.shape[1], r),
      "draws": result.draws,
      "seed": list(result.seed),
      "closest_pair": list(result.closest),
      "smallest_separation_handled": construction.smallest_separation(k),
      "rho_prime": result.rho_prime,
      "lemma_margin": result.margin,
      "output_margin": result.output_margin,
  }


def _sgd_contrast(x, y, r, result, output_dir, schedule, seed, x_test, y_test,
                  log):
  """Trains the same architecture by SGD (SCHEDULE: steps, batch size,
  learning rate; `construction_sgd.contrast`), writes sgd.json; the
  report's figures of it, with its top-1 accuracy on X_TEST when given."""
  from identity_tf.theory import construction_sgd  # pylint: disable=g-import-not-at-top
  figures, record = construction_sgd.contrast(
      x, y, r, result.k, result.num_units, schedule, seed, x_test, y_test,
      log)
  with open(os.path.join(output_dir, "sgd.json"), "w") as f:
    json.dump(record, f, indent=2)
  return figures
