"""What //bin:linear_theory's subcommands do, one function each.

`commands.linear_theory.main` picks the subcommand and hands it the
binary's flags. Each command is one function: `factorize_command` reads R from an .npy file, factorizes
it by Theorem 2.1 (`linear.factorize`) and writes A to an .npz file;
`check_command` runs every statement of Section 2 (`linear.run_checks`);
`descend_command` compares gradient descent on the residual and the plain
parametrisation, with the rate (2.3) guarantees; `landscape_command` runs
Theorem 2.2 as an experiment (`landscape.run_landscape`): descent from random
starts in B_tau over a grid of depths and radii, with the plain and the
det R < 0 contrasts. Each takes the values of the binary's flags (paths
already resolved; `*_as_typed` is how the user wrote a path, for messages and
the JSON), gives its JSON result to EMIT and its progress lines to LOG, and
raises an `errors.IdentityTfError` (a ValueError) with one line for
anything the user can fix.

`linear` and `landscape` import TensorFlow, which takes seconds: each command
imports them when it runs, so that a wrong subcommand or flag is answered
before that (DEVELOPERS.md: binaries import TensorFlow only after the flags
are checked).
"""

# pylint: disable=g-import-not-at-top

import json
import os
import time

import numpy as np

from identity_tf import configs
from identity_tf import errors
from identity_tf import files

# --d and --layers when not given (factorize requires --layers).
CHECK_D = 8
CHECK_LAYERS = 20
DESCEND = {"d": 8, "layers": 50, "steps": 500}
# landscape's defaults: seconds on 2 cores (docs/linear_theory.md).
LANDSCAPE = {"d": 8, "condition": 2.0, "rotation": 1.0, "depths": (2, 4, 8),
             "taus": (0.1, 0.3, 0.5), "starts": 10, "steps": 300,
             "epsilon": 1e-6}


def _ignore(_):
  pass


def read_matrix(path, as_typed=None, name="R"):
  """The matrix NAME of the .npy file PATH, as float64; ValueError naming
  --NAME=AS_TYPED if it is not one."""
  flag = f"--{name}={path if as_typed is None else as_typed}"
  if not os.path.isfile(path):
    raise errors.ConfigError(f"{flag}: no such file")
  with open(path, "rb") as f:
    magic = f.read(6)
  if magic[:2] != b"PK" and magic != b"\x93NUMPY":
    raise errors.ConfigError(f"{flag} is not a .npy file (a text file?); save "
                             f"{name} with numpy.save(path, {name})")
  files.check_array_file(path, flag)  # Before numpy allocates anything.
  try:
    r = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise errors.ConfigError(f"cannot read {flag} as a .npy array: "
                             f"{str(e).splitlines()[0]}") from None
  if not isinstance(r, np.ndarray):  # An .npz archive.
    r.close()
    raise errors.ConfigError(
        f"{flag} is an .npz archive, not an .npy array; save "
        f"{name} with np.save(path, {name})")
  if r.dtype.kind not in "fiu":
    raise errors.ConfigError(
        f"{flag} holds {r.dtype} data; give a real d x d float64 "
        "matrix")
  return r.astype(np.float64)


def factorize_command(r_path=None, layers=None, output_path=None, *,
                      r_as_typed=None, output_as_typed=None, log=_ignore,
                      emit=_ignore):
  """Theorem 2.1 for the R in R_PATH (.npy): writes A (key `A`) to OUTPUT_PATH.

  The output path is checked before any work. Emits and returns
  `linear.factorization_report` of the result.
  """
  if not r_path or layers is None or not output_path:
    raise errors.ConfigError(
        "factorize needs --R=R.npy --layers=L --output=A.npz")
  r_flag = f"--R={r_path if r_as_typed is None else r_as_typed}"
  output_flag = (f"--output="
                 f"{output_path if output_as_typed is None else output_as_typed}")
  if not output_path.endswith(".npz") or os.path.isdir(output_path):
    raise errors.ConfigError(
        f"{output_flag} must be a file path ending in .npz "
        "(np.savez adds the suffix otherwise)")
  r = read_matrix(r_path, r_as_typed)
  from identity_tf.theory import linear
  start = time.perf_counter()
  try:
    a = linear.factorize(r, layers)
  except ValueError as e:
    raise errors.ConfigError(f"{r_flag}: {e}") from None
  log(f"factorized R (d = {r.shape[0]}) into {layers} layers in "
      f"{time.perf_counter() - start:.2f} s; checking the product")
  report = linear.factorization_report(r, a)
  try:
    np.savez(output_path, A=a.numpy())
  except OSError as e:
    raise errors.OutputError(f"cannot write {output_flag}: {e}") from None
  log(f"wrote {output_path}")
  emit(report)
  return report


def check_command(d=None, layers=None, seed=0, bound_power=1,
                  samples=200_000, *, log=_ignore, emit=_ignore):
  """Every statement of Section 2 (`linear.run_checks`) on a random instance.

  Emits {"d", "layers", "seed", "all_pass", "statements"}; then, if a
  statement failed, raises ValueError naming the failed ones. D and LAYERS
  default to CHECK_D and CHECK_LAYERS.
  """
  from identity_tf.theory import linear
  d = CHECK_D if d is None else d
  layers = CHECK_LAYERS if layers is None else layers
  if d < 1 or layers < 1 or seed < 0 or samples < 2:
    raise errors.ConfigError(
        "check needs --d >= 1, --layers >= 1, --seed >= 0 and "
        "--samples >= 2")
  if bound_power not in (1, 2):
    raise errors.ConfigError("--bound_power must be 1 or 2")
  results = linear.run_checks(d, layers, seed, bound_power, samples,
                              progress=log)
  failed = [name for name, entry in results.items() if not entry["pass"]]
  summary = {"d": d, "layers": layers, "seed": seed, "all_pass": not failed,
             "statements": results}
  emit(summary)
  if failed:
    raise errors.ConfigError(f"failed: {', '.join(failed)}")
  return summary


def descend_command(d=None, layers=None, steps=None, step_size=None, seed=0,
                    plot_path=None, *, plot_as_typed=None, log=_ignore,
                    emit=_ignore):
  """Gradient descent from A = 0 beside the plain W_l ... W_1 (Section 2).

  R = expm(B) with ||B|| = 1 and Sigma with eigenvalues in [0.5, 2], drawn
  from SEED; both runs take STEP_SIZE (default `linear.default_step_size`)
  for STEPS steps. Emits the summary (with the measured rate and the one
  (2.3) guarantees), writes the PNG of `linear.plot_descent` to PLOT_PATH if
  given, then raises ValueError if the residual run diverged. D, LAYERS and
  STEPS default to DESCEND's.
  """
  from identity_tf.theory import linear
  d = DESCEND["d"] if d is None else d
  layers = DESCEND["layers"] if layers is None else layers
  steps = DESCEND["steps"] if steps is None else steps
  if d < 1 or layers < 1 or steps < 1 or seed < 0:
    raise errors.ConfigError("descend needs --d, --layers and --steps >= 1 and "
                             "--seed >= 0")
  if step_size is not None and step_size <= 0:
    raise errors.ConfigError("--step_size must be positive")
  rng = np.random.default_rng(seed)
  r = linear.near_identity_target(d, rng, 1.0)
  sigma = linear.random_covariance(d, rng, 0.5, 2.0)
  residual = linear.gradient_descent(r, sigma, layers, steps, step_size,
                                     progress=log)
  plain = linear.gradient_descent(r, sigma, layers, steps,
                                  residual["step_size"], plain=True, seed=seed,
                                  progress=log)
  summary = _descent_summary(d, layers, steps, sigma, residual, plain)
  if plot_path:
    as_typed = plot_path if plot_as_typed is None else plot_as_typed
    try:
      linear.plot_descent(residual, plain, plot_path,
                          f"d = {d}, l = {layers}, step "
                          f"{residual['step_size']:.3g}")
    except OSError as e:
      raise errors.OutputError(f"cannot write --plot={as_typed}: {e}") from None
    log(f"wrote {plot_path}")
    summary["plot"] = as_typed
  emit(summary)
  _check_converged(residual)
  return summary


def _descent_summary(d, layers, steps, sigma, residual, plain):
  """The figures docs/linear_theory.md tabulates for one `descend_command`."""
  from identity_tf.theory import linear
  tau = float(np.max(residual["max_norm"]))
  return {
      "d": d, "layers": layers, "steps": steps,
      "step_size": residual["step_size"],
      "target": "R = expm(B), ||B|| = 1; Sigma eigenvalues in [0.5, 2]",
      "residual_initial_gap": float(residual["gap"][0]),
      "residual_final_gap": float(residual["gap"][-1]),
      "residual_rate_per_step": linear.linear_rate(residual["gap"]),
      "residual_max_norm_over_run": tau,
      "residual_final_max_norm": float(residual["max_norm"][-1]),
      "rate_bound_from_2_3": linear.descent_rate_bound(
          residual["step_size"], layers, tau, sigma),
      "plain_initial_gap": float(plain["gap"][0]),
      "plain_final_gap": float(plain["gap"][-1]),
  }


def _check_converged(run):
  """ValueError naming the first step at which f - f_opt stopped being finite."""
  gaps = np.asarray(run["gap"], np.float64)
  if not np.all(np.isfinite(gaps)):
    first = int(np.argmin(np.isfinite(gaps)))
    raise errors.ConfigError(
        f"gradient descent diverged: f - f_opt became "
        f"{gaps[first]} at step {first}; lower --step_size "
        f"(it was {run['step_size']:.3g})")


def _read_target(r_path, r_as_typed, d):
  """R of --R for `landscape_command`: invertible, det R > 0, d x d if D."""
  from identity_tf.theory import linear
  r_flag = f"--R={r_path if r_as_typed is None else r_as_typed}"
  r = read_matrix(r_path, r_as_typed)
  try:
    r = linear.check_matrix(r).numpy()
    linear.check_invertible(np.linalg.svd(r, compute_uv=False))
  except ValueError as e:
    raise errors.ConfigError(f"{r_flag}: {e}") from None
  if d is not None and d != r.shape[0]:
    raise errors.ConfigError(f"--d={d} but {r_flag} is {r.shape[0]} x "
                             f"{r.shape[0]}; leave out --d")
  if np.linalg.slogdet(r)[0] <= 0:
    raise errors.ConfigError(
        f"{r_flag} has det R <= 0, which no product "
        "(I + A_l)...(I + A_1) with |||A||| < 1 reaches; give "
        "R with det R > 0 (the det R < 0 contrast is built "
        "from it)")
  return r, {"file": r_flag[len("--R="):]}


def _read_covariance(sigma_path, sigma_as_typed, size, size_flag):
  """Sigma of --sigma: symmetric positive definite, SIZE x SIZE if SIZE
  (which SIZE_FLAG, --R=... or --d=..., set)."""
  from identity_tf.theory import landscape
  from identity_tf.theory import linear
  flag = f"--sigma={sigma_path if sigma_as_typed is None else sigma_as_typed}"
  sigma = read_matrix(sigma_path, sigma_as_typed, "sigma")
  try:
    sigma = linear.check_matrix(sigma, "Sigma").numpy()
    asymmetry = float(np.max(np.abs(sigma - sigma.T)))
    if asymmetry > 1e-10 * (1.0 + float(np.max(np.abs(sigma)))):
      raise errors.ConfigError(f"Sigma = E[x x^T] must be symmetric, but max "
                               f"|Sigma - Sigma^T| = {asymmetry:.3g}; save "
                               f"(S + S.T) / 2")
    landscape.check_positive_definite(sigma)
  except ValueError as e:
    raise errors.ConfigError(f"{flag}: {e}") from None
  if size is not None and sigma.shape[0] != size:
    raise errors.ConfigError(
        f"{flag} is {sigma.shape[0]} x {sigma.shape[0]} but "
        f"{size_flag} is {size} x {size}; give them one size")
  return sigma, {"file": flag[len("--sigma="):]}


def _random_target(d, condition, rotation, rng, seed):
  """A random R by `landscape.random_target` (None: LANDSCAPE's defaults)."""
  from identity_tf.theory import landscape
  d = LANDSCAPE["d"] if d is None else d
  condition = LANDSCAPE["condition"] if condition is None else condition
  rotation = LANDSCAPE["rotation"] if rotation is None else rotation
  if d < 1 or not condition >= 1 or not 0 <= rotation <= np.pi:
    raise errors.ConfigError("landscape needs --d >= 1, --condition >= 1 and "
                             "0 <= --rotation <= pi (3.14159)")
  return landscape.random_target(d, rng, condition, rotation), {
      "random": "R = expm(K) V diag(s) V^T", "condition": condition,
      "rotation": rotation, "seed": seed}


def _landscape_instance(d, files, condition, rotation, seed):
  """(R, Sigma, how R was made, how Sigma was made) for `landscape_command`.

  FILES: {"R": (path, as typed), "sigma": (path, as typed)}, paths None for
  random ones. Random R and Sigma are drawn from SEED, R first, so a
  --sigma file leaves the random R of the same seed unchanged.
  """
  from identity_tf.theory import linear
  rng = np.random.default_rng(seed)
  r = None
  if files["R"][0]:
    if condition is not None or rotation is not None:
      raise errors.ConfigError(
          "give --R=R.npy or --condition/--rotation (a random "
          "R), not both")
    r, r_source = _read_target(*files["R"], d)
  if files["sigma"][0]:
    size_flag = (f"--R={files['R'][1] or files['R'][0]}" if r is not None
                 else f"--d={d}")
    sigma, sigma_source = _read_covariance(
        *files["sigma"], d if r is None else r.shape[0], size_flag)
    d = sigma.shape[0]
  if r is None:
    r, r_source = _random_target(d, condition, rotation, rng, seed)
  if not files["sigma"][0]:
    sigma = linear.random_covariance(r.shape[0], rng, 0.5, 2.0)
    sigma_source = {"random": "eigenvalues in [0.5, 2] (ends hit)",
                    "seed": seed}
  return r, sigma, r_source, sigma_source


def landscape_command(d=None, r_path=None, condition=None, rotation=None,
                      depths=None, taus=None, starts=None, steps=None,
                      epsilon=None, step_size=None, seed=0, output_path=None,
                      plot_path=None, sigma_path=None, *, r_as_typed=None,
                      sigma_as_typed=None, output_as_typed=None,
                      plot_as_typed=None, log=_ignore, emit=_ignore):
  """Theorem 2.2 as an experiment (`landscape.run_landscape`).

  R from R_PATH (.npy, det R > 0) or random (`landscape.random_target` with
  CONDITION and ROTATION); Sigma from SIGMA_PATH (.npy, symmetric positive
  definite) or random with eigenvalues in [0.5, 2]; random ones from SEED.
  None means LANDSCAPE's default. Checks OUTPUT_PATH (JSON) and PLOT_PATH
  (PNG) before any work, emits the report and writes both; then raises
  ValueError if a residual descent diverged.
  """
  from identity_tf.theory import landscape
  outputs = {"output": (output_path, output_as_typed),
             "plot": (plot_path, plot_as_typed)}
  for name, (path, as_typed) in outputs.items():
    if path:
      files.check_output_file(path, f"--{name}={as_typed or path}")
  grid = _landscape_grid(depths, taus, starts, steps, epsilon, step_size,
                         seed)
  r, sigma, r_source, sigma_source = _landscape_instance(
      d, {"R": (r_path, r_as_typed), "sigma": (sigma_path, sigma_as_typed)},
      condition, rotation, seed)
  report, curves = landscape.run_landscape(r, sigma, *grid, seed, step_size,
                                           log)
  report["R"]["source"] = r_source
  report["Sigma_source"] = sigma_source
  _write_landscape(report, curves, outputs, log)
  emit(report)
  diverged = sum(c["residual"]["diverged"] for c in report["cells"])
  if diverged:
    raise errors.ConfigError(f"{diverged} residual descents diverged; lower "
                             f"--step_size (default 1 / (2 l sigma_max(Sigma) "
                             f"max(1, ||R||)^2))")
  return report


def _landscape_grid(depths, taus, starts, steps, epsilon, step_size, seed):
  """(depths, taus, starts, steps, epsilon) of the flags, LANDSCAPE's where
  None; ValueError naming the first flag out of range."""
  depths = configs.parse_numbers(depths or LANDSCAPE["depths"], int, "depths",
                             "2,4,8")
  taus = configs.parse_numbers(taus or LANDSCAPE["taus"], float, "taus",
                           "0.1,0.3,0.5")
  if any(l < 1 for l in depths):
    raise errors.ConfigError(f"--depths must be >= 1, got {depths}")
  if any(not 0 <= t < 1 for t in taus):
    raise errors.ConfigError(
        f"--taus must be in [0, 1) (Theorem 2.2 needs tau < 1), "
        f"got {taus}")
  starts = LANDSCAPE["starts"] if starts is None else starts
  steps = LANDSCAPE["steps"] if steps is None else steps
  epsilon = LANDSCAPE["epsilon"] if epsilon is None else epsilon
  if starts < 1 or steps < 1 or seed < 0 or not epsilon > 0:
    raise errors.ConfigError(
        "landscape needs --starts >= 1, --steps >= 1, --seed >= 0 "
        "and --epsilon > 0")
  if step_size is not None and not step_size > 0:
    raise errors.ConfigError("--step_size must be positive")
  return depths, taus, starts, steps, epsilon


def _write_landscape(report, curves, outputs, log):
  """The figure to --plot and the report to --output (each if given)."""
  from identity_tf.theory import landscape

  def write_json(path):
    with open(path, "w") as f:
      json.dump(report, f, indent=1)

  def write_png(path):
    landscape.plot_landscape(report, curves, path)

  for name, write, suffix in (("plot", write_png, ".png"),
                              ("output", write_json, ".json")):
    path, as_typed = outputs[name]
    if not path:
      continue
    report[name] = as_typed or path
    files.write_whole(path, write, f"--{name}={as_typed or path}", suffix)
    log(f"wrote {path}")
