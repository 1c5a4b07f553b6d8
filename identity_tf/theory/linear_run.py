"""What //bin:linear_theory does: one function per subcommand.

`factorize_command` reads R from an .npy file, factorizes it by Theorem 2.1
(`linear.factorize`) and writes A to an .npz file; `check_command` runs every
statement of Section 2 (`linear.run_checks`); `descend_command` compares
gradient descent on the residual and the plain parametrisation, with the rate
(2.3) guarantees. Each takes the values of the binary's flags (paths already
resolved; `*_as_typed` is how the user wrote a path, for messages and the
JSON), gives its JSON result to EMIT and its progress lines to LOG, and
raises ValueError with one line for anything the user can fix.
"""

import os
import time

import numpy as np

from identity_tf.theory import linear

# --layers when not given (factorize requires it).
CHECK_LAYERS = 20
DESCEND_LAYERS = 50


def _ignore(_):
  pass


def read_matrix(path, as_typed=None):
  """R of the .npy file PATH, as float64; ValueError naming --R=AS_TYPED if not."""
  flag = f"--R={path if as_typed is None else as_typed}"
  try:
    r = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise ValueError(f"cannot read {flag} as a .npy array: {e}") from None
  if not isinstance(r, np.ndarray):  # An .npz archive.
    r.close()
    raise ValueError(f"{flag} is an .npz archive, not an .npy array; save R "
                     "with np.save(path, R)")
  if r.dtype.kind not in "fiu":
    raise ValueError(f"{flag} holds {r.dtype} data; give a real d x d float64 "
                     "matrix")
  return r.astype(np.float64)


def factorize_command(r_path, layers, output_path, *, r_as_typed=None,
                      output_as_typed=None, log=_ignore, emit=_ignore):
  """Theorem 2.1 for the R in R_PATH (.npy): writes A (key `A`) to OUTPUT_PATH.

  The output path is checked before any work. Emits and returns
  `linear.factorization_report` of the result.
  """
  if not r_path or layers is None or not output_path:
    raise ValueError("factorize needs --R=R.npy --layers=L --output=A.npz")
  r_flag = f"--R={r_path if r_as_typed is None else r_as_typed}"
  output_flag = (f"--output="
                 f"{output_path if output_as_typed is None else output_as_typed}")
  if not output_path.endswith(".npz") or os.path.isdir(output_path):
    raise ValueError(f"{output_flag} must be a file path ending in .npz "
                     "(np.savez adds the suffix otherwise)")
  r = read_matrix(r_path, r_as_typed)
  start = time.perf_counter()
  try:
    a = linear.factorize(r, layers)
  except ValueError as e:
    raise ValueError(f"{r_flag}: {e}") from None
  log(f"factorized R (d = {r.shape[0]}) into {layers} layers in "
      f"{time.perf_counter() - start:.2f} s; checking the product")
  report = linear.factorization_report(r, a)
  try:
    np.savez(output_path, A=a.numpy())
  except OSError as e:
    raise ValueError(f"cannot write {output_flag}: {e}") from None
  log(f"wrote {output_path}")
  emit(report)
  return report


def check_command(d=8, layers=None, seed=0, bound_power=1, samples=200_000, *,
                  log=_ignore, emit=_ignore):
  """Every statement of Section 2 (`linear.run_checks`) on a random instance.

  Emits {"d", "layers", "seed", "all_pass", "statements"}; then, if a
  statement failed, raises ValueError naming the failed ones. LAYERS
  defaults to CHECK_LAYERS.
  """
  layers = CHECK_LAYERS if layers is None else layers
  if d < 1 or layers < 1 or seed < 0 or samples < 2:
    raise ValueError("check needs --d >= 1, --layers >= 1, --seed >= 0 and "
                     "--samples >= 2")
  if bound_power not in (1, 2):
    raise ValueError("--bound_power must be 1 or 2")
  results = linear.run_checks(d, layers, seed, bound_power, samples,
                              progress=log)
  failed = [name for name, entry in results.items() if not entry["pass"]]
  summary = {"d": d, "layers": layers, "seed": seed, "all_pass": not failed,
             "statements": results}
  emit(summary)
  if failed:
    raise ValueError(f"failed: {', '.join(failed)}")
  return summary


def descend_command(d=8, layers=None, steps=500, step_size=None, seed=0,
                    plot_path=None, *, plot_as_typed=None, log=_ignore,
                    emit=_ignore):
  """Gradient descent from A = 0 beside the plain W_l ... W_1 (Section 2).

  R = expm(B) with ||B|| = 1 and Sigma with eigenvalues in [0.5, 2], drawn
  from SEED; both runs take STEP_SIZE (default `linear.default_step_size`)
  for STEPS steps. Emits the summary (with the measured rate and the one
  (2.3) guarantees), writes the PNG of `linear.plot_descent` to PLOT_PATH if
  given, then raises ValueError if the residual run diverged. LAYERS
  defaults to DESCEND_LAYERS.
  """
  layers = DESCEND_LAYERS if layers is None else layers
  if d < 1 or layers < 1 or steps < 1 or seed < 0:
    raise ValueError("descend needs --d, --layers and --steps >= 1 and "
                     "--seed >= 0")
  if step_size is not None and step_size <= 0:
    raise ValueError("--step_size must be positive")
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
      raise ValueError(f"cannot write --plot={as_typed}: {e}") from None
    log(f"wrote {plot_path}")
    summary["plot"] = as_typed
  emit(summary)
  _check_converged(residual)
  return summary


def _descent_summary(d, layers, steps, sigma, residual, plain):
  """The figures docs/linear_theory.md tabulates for one `descend_command`."""
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
    raise ValueError(f"gradient descent diverged: f - f_opt became "
                     f"{gaps[first]} at step {first}; lower --step_size "
                     f"(it was {run['step_size']:.3g})")
