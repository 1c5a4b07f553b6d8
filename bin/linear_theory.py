"""Section 2 (linear residual networks) of Hardt & Ma (2017), runnable.

  bazel run //bin:linear_theory -- construct --R=R.npy --layers=L --output=A.npz
  bazel run //bin:linear_theory -- check --d=D --layers=L --seed=S
  bazel run //bin:linear_theory -- descend --d=D --layers=L --steps=N --plot=F.png
  bazel run //bin:linear_theory -- benchmark --d=D --layers=250,500,1000 --what=gradient

construct: Theorem 2.1 for the d x d float64 matrix in R.npy; writes key `A`
  (shape (L, d, d), float64) to the .npz and prints one JSON object
  {"layers", "d", "gamma", "max_norm", "bound", "residual"} (plus
  "bound_additive", the (4 pi + 3 gamma)/l form of the bound).
check: every statement of Section 2 on a random instance; JSON with pass/fail
  per statement; exits 1 if any fails. --bound_power=2 checks (2.3) with
  sigma_min(Sigma)^2, the squared form (it fails: see docs).
descend: gradient descent from A = 0 beside the plain parametrisation;
  JSON summary, and a PNG of f - f_opt and |||A||| per step with --plot.
benchmark: wall-clock seconds of construct or of the gradient for each l.

JSON goes to stdout alone; progress and errors go to stderr. Relative paths
resolve against the directory `bazel run` was started from.
"""

import json
import os
import sys
import time

from absl import app
from absl import flags

from identity_tf import paths

SUBCOMMANDS = ("construct", "check", "descend", "benchmark")

flags.DEFINE_string("R", None, "construct: .npy file holding a d x d float64 R.")
flags.DEFINE_integer("layers", None, "Number of layers l (construct: required; "
                     "check: default 20; descend: default 50).")
flags.DEFINE_string("output", None, "construct: .npz file to write (key A).")
flags.DEFINE_integer("d", 8, "check/descend/benchmark: dimension d.")
flags.DEFINE_integer("seed", 0, "check/descend: random seed.")
flags.DEFINE_integer("bound_power", 1, "check: power of sigma_min(Sigma) in "
                     "(2.3): 1 (what the argument gives) or 2 (the squared "
                     "form).")
flags.DEFINE_integer("samples", 200_000, "check: Monte-Carlo samples.")
flags.DEFINE_integer("steps", 500, "descend: gradient steps.")
flags.DEFINE_float("step_size", None, "descend: step size (default "
                   "1 / (2 l sigma_max(Sigma) max(1, ||R||)^2)).")
flags.DEFINE_string("plot", None, "descend: PNG file for the plots.")
flags.DEFINE_list("sizes", ["250", "500", "1000", "2000"],
                  "benchmark: the values of l to time.")
flags.DEFINE_enum("what", "gradient", ["gradient", "construct"],
                  "benchmark: what to time.")
flags.DEFINE_integer("repeats", 3, "benchmark: runs per size; the minimum is "
                     "reported (the machine is shared).")

FLAGS = flags.FLAGS


def log(message):
  print(message, file=sys.stderr, flush=True)


def emit(result):
  print(json.dumps(result, indent=1, default=float))


def construct_command(lt, np):
  if not FLAGS.R or FLAGS.layers is None or not FLAGS.output:
    raise SystemExit("error: construct needs --R=R.npy --layers=L "
                     "--output=A.npz")
  path = paths.resolve_path(FLAGS.R)
  output = paths.resolve_path(FLAGS.output)
  if not output.endswith(".npz") or os.path.isdir(output):
    raise SystemExit(f"error: --output={FLAGS.output} must be a file path "
                     "ending in .npz (np.savez adds the suffix otherwise)")
  try:
    r = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise SystemExit(f"error: cannot read --R={FLAGS.R} as a .npy array: {e}")
  if not isinstance(r, np.ndarray):  # An .npz archive.
    r.close()
    raise SystemExit(f"error: --R={FLAGS.R} is an .npz archive, not an .npy "
                     "array; save R with np.save(path, R)")
  if r.dtype.kind not in "fiu":
    raise SystemExit(f"error: --R={FLAGS.R} holds {r.dtype} data; give a real "
                     f"d x d float64 matrix")
  start = time.perf_counter()
  try:
    a = lt.construct(r.astype(np.float64), FLAGS.layers)
  except ValueError as e:
    raise SystemExit(f"error: --R={FLAGS.R}: {e}")
  seconds = time.perf_counter() - start
  log(f"constructed {FLAGS.layers} layers for d = {r.shape[0]} in "
      f"{seconds:.2f} s; checking the product")
  report = lt.construction_report(r, a)
  try:
    np.savez(output, A=a.numpy())
  except OSError as e:
    raise SystemExit(f"error: cannot write --output={FLAGS.output}: {e}")
  log(f"wrote {output}")
  emit(report)


def check_command(lt):
  layers = 20 if FLAGS.layers is None else FLAGS.layers
  if FLAGS.d < 1 or layers < 1 or FLAGS.seed < 0 or FLAGS.samples < 2:
    raise SystemExit("error: check needs --d >= 1, --layers >= 1, --seed >= 0 "
                     "and --samples >= 2")
  if FLAGS.bound_power not in (1, 2):
    raise SystemExit("error: --bound_power must be 1 or 2")
  results = lt.run_checks(FLAGS.d, layers, FLAGS.seed, FLAGS.bound_power,
                          FLAGS.samples, progress=log)
  failed = [name for name, entry in results.items() if not entry["pass"]]
  emit({"d": FLAGS.d, "layers": layers, "seed": FLAGS.seed,
        "all_pass": not failed, "statements": results})
  if failed:
    raise SystemExit(f"error: failed: {', '.join(failed)}")


def descend_command(lt, np):
  layers = 50 if FLAGS.layers is None else FLAGS.layers
  if FLAGS.d < 1 or layers < 1 or FLAGS.steps < 1 or FLAGS.seed < 0:
    raise SystemExit("error: descend needs --d, --layers and --steps >= 1 "
                     "and --seed >= 0")
  if FLAGS.step_size is not None and FLAGS.step_size <= 0:
    raise SystemExit("error: --step_size must be positive")
  rng = np.random.default_rng(FLAGS.seed)
  r = lt.near_identity_target(FLAGS.d, rng, 1.0)
  sigma = lt.random_covariance(FLAGS.d, rng, 0.5, 2.0)
  residual = lt.gradient_descent(r, sigma, layers, FLAGS.steps,
                                 FLAGS.step_size, progress=log)
  plain = lt.gradient_descent(r, sigma, layers, FLAGS.steps,
                              residual["step_size"], plain=True,
                              seed=FLAGS.seed, progress=log)
  # (2.3) is a Polyak-Lojasiewicz inequality on B_tau with
  # mu = 4 l (1 - tau)^(2l-2) sigma_min(Sigma); for a small enough step it
  # gives f_{t+1} - f_opt <= (1 - step mu / 2)(f_t - f_opt).
  tau = float(np.max(residual["max_norm"]))
  mu = 4 * layers * (1 - tau) ** (2 * layers - 2) * float(
      np.min(np.linalg.eigvalsh(sigma)))
  summary = {
      "d": FLAGS.d, "layers": layers, "steps": FLAGS.steps,
      "step_size": residual["step_size"],
      "target": "R = expm(B), ||B|| = 1; Sigma eigenvalues in [0.5, 2]",
      "residual_initial_gap": float(residual["gap"][0]),
      "residual_final_gap": float(residual["gap"][-1]),
      "residual_rate_per_step": lt.linear_rate(residual["gap"]),
      "residual_max_norm_over_run": float(np.max(residual["max_norm"])),
      "residual_final_max_norm": float(residual["max_norm"][-1]),
      "rate_bound_from_2_3": 1 - residual["step_size"] * mu / 2,
      "plain_initial_gap": float(plain["gap"][0]),
      "plain_final_gap": float(plain["gap"][-1]),
  }
  if FLAGS.plot:
    path = paths.resolve_path(FLAGS.plot)
    try:
      lt.plot_descent(residual, plain, path,
                      f"d = {FLAGS.d}, l = {layers}, step {residual['step_size']:.3g}")
    except OSError as e:
      raise SystemExit(f"error: cannot write --plot={FLAGS.plot}: {e}")
    log(f"wrote {path}")
    summary["plot"] = FLAGS.plot
  emit(summary)
  gaps = np.asarray(residual["gap"], np.float64)
  if not np.all(np.isfinite(gaps)):
    first = int(np.argmin(np.isfinite(gaps)))
    raise SystemExit(f"error: gradient descent diverged: f - f_opt became "
                     f"{gaps[first]} at step {first}; lower --step_size "
                     f"(it was {residual['step_size']:.3g})")


def benchmark_command(lt, np, tf):
  try:
    sizes = [int(s) for s in FLAGS.sizes]
  except ValueError:
    raise SystemExit(f"error: --sizes must be integers, got {FLAGS.sizes}")
  if FLAGS.d < 1 or not sizes or min(sizes) < 1:
    raise SystemExit("error: benchmark needs --d >= 1 and --sizes >= 1")
  rng = np.random.default_rng(FLAGS.seed)
  d = FLAGS.d
  r = lt.random_target(d, rng, 1.0)
  sigma = lt.random_covariance(d, rng, 0.5, 2.0)
  if FLAGS.repeats < 1:
    raise SystemExit("error: --repeats must be >= 1")

  def run_once(layers):
    if FLAGS.what == "construct":
      start = time.perf_counter()
      _ = lt.construct(r, layers).numpy()
    else:
      a = tf.constant(lt.random_layers(layers, d, rng, 0.5 / layers))
      start = time.perf_counter()
      _ = lt.risk_gradient(a, r, sigma).numpy()
    return time.perf_counter() - start

  run_once(min(sizes))  # warms up TensorFlow (kernels, tf.function traces)
  timings, all_runs = {}, {}
  for layers in sizes:
    runs = [round(run_once(layers), 3) for _ in range(FLAGS.repeats)]
    timings[str(layers)], all_runs[str(layers)] = min(runs), runs
    log(f"{FLAGS.what}: d = {d}, l = {layers}: {runs} s")
  emit({"what": FLAGS.what, "d": d, "min_seconds": timings,
        "all_seconds": all_runs, "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg()})


def main(argv):
  if len(argv) < 2 or argv[1] not in SUBCOMMANDS:
    given = f"unknown subcommand {argv[1]!r}" if len(argv) >= 2 else (
        "missing subcommand")
    raise SystemExit(f"error: {given}; valid: {', '.join(SUBCOMMANDS)} "
                     f"(e.g. linear_theory construct --R=R.npy --layers=10 "
                     f"--output=A.npz)")
  if len(argv) > 2:
    raise SystemExit(f"error: unexpected arguments {' '.join(argv[2:])}; "
                     f"give options as --flag=value")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from identity_tf import linear_theory as lt  # pylint: disable=g-import-not-at-top
  command = argv[1]
  if command == "construct":
    construct_command(lt, np)
  elif command == "check":
    check_command(lt)
  elif command == "descend":
    descend_command(lt, np)
  else:
    benchmark_command(lt, np, tf)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
