"""Theorem 2.2 of Hardt & Ma (2017) as an experiment: descent from B_tau.

Theorem 2.2: for tau < 1, every critical point A of the population risk f
with |||A||| <= tau is a global minimum, because (2.3)
||grad f(A)||_F^2 >= mu (f(A) - f_opt), mu = 4 l (1 - tau)^(2l-2)
sigma_min(Sigma) (`linear.pl_constant`). A proof says nothing about what
gradient descent does, so this module runs it: from random starts with
|||A||| = tau, on the excess risk f - f_opt = tr(E Sigma E^T) of Claim 2.3
with the gradient of Lemma 2.4 (`linear._excess_risk_and_gradient`, the
graph behind `linear.risk_and_gradient`), and records whether each run
reaches f - f_opt <= epsilon, how far from the identity it went, and the
smallest ||grad f||_F^2 / (f - f_opt) it met. Two contrasts from the same
starts:

* plain: W_l ... W_1 with W_i = A_i, i.e. started next to W = 0, where
  every gradient is a product of l - 1 near-zero matrices (a saddle for
  l >= 2, where the gradient is exactly zero);
* det R < 0: R with its first row negated. For ||A_i|| < 1,
  det(I + A_i) > 0 (det(I + t A_i) never vanishes on t in [0, 1]), so no
  product (I + A_l)...(I + A_1) inside B_1 has det < 0, and inside B_1
  f - f_opt >= sigma_min(Sigma) sigma_min(R)^2 (`negative_det_floor`); a
  run reaches the optimum only by leaving B_1, and `crossings` says where:
  the step, the layer whose norm crossed 1, and f - f_opt there.

Float64 and tf.linalg throughout; NumPy draws the random instances and does
the bookkeeping on the recorded per-step scalars.
"""

import math

import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf.theory import linear

DTYPE = linear.DTYPE
# ||grad f||^2 / (f - f_opt) is read only where f - f_opt is at least this.
# E = (I + A_l)...(I + A_1) - R carries the product's rounding, of order
# l d eps ||R||; at f - f_opt >= 1e-9, ||E|| >= 3e-5 / sqrt(sigma_max(Sigma))
# is orders of magnitude above it, so the ratio is E's, not round-off's.
RATIO_FLOOR = 1e-9
# How a start is drawn (the report repeats it).
START_RULE = ("A_1 with ||A_1|| = tau exactly, A_i (i > 1) with ||A_i|| = "
              "tau u_i, u_i uniform in [0, 1), directions Gaussian: "
              "|||A||| = tau, a point on the boundary of B_tau")


# ----------------------------------------------------------------------------
# Instances.

def random_target(d, rng, condition=2.0, rotation=1.0):
  """R = expm(K) V diag(s) V^T with det R > 0 and condition number CONDITION.

  log s uniform in [-log(CONDITION)/2, log(CONDITION)/2] with both ends hit,
  so sigma_max(R) / sigma_min(R) = CONDITION; K is a random skew matrix with
  ||K|| = ROTATION (<= pi): expm(K) is a rotation whose largest angle is
  ROTATION. det R = det expm(K) prod(s) = e^{trace K} prod(s) > 0. (A random
  orthogonal polar factor would have angles near pi, which no product of
  near-identity layers reaches in few layers: Theorem 2.1 needs l of order
  pi / |||A|||.)
  """
  if not condition >= 1 or not 0 <= rotation <= math.pi:
    raise errors.ConfigError(
        f"need condition >= 1 and 0 <= rotation <= pi; got "
        f"condition = {condition}, rotation = {rotation}")
  half = math.log(condition) / 2.0
  log_s = rng.uniform(-half, half, d)
  log_s[0] = half
  if d > 1:
    log_s[-1] = -half
  v = linear.random_orthogonal(d, rng)
  positive = (v * np.exp(log_s)) @ v.T
  k = rng.standard_normal((d, d))
  k = k - k.T
  k_norm = np.linalg.norm(k, ord=2)
  k = k * (rotation / k_norm) if k_norm > 0 else k
  return tf.linalg.expm(tf.constant(k)).numpy() @ positive


def flip_determinant(r):
  """R with its first row negated: det changes sign, singular values do not."""
  flipped = np.array(r, dtype=np.float64)
  flipped[0] = -flipped[0]
  return flipped


def negative_det_floor(r, sigma):
  """sigma_min(Sigma) sigma_min(R)^2: f - f_opt inside B_1 when det R < 0.

  Inside B_1 the product P has det P > 0. On the segment from R (det < 0)
  to P the determinant changes sign, so some R + t (P - R), t in (0, 1], is
  singular: sigma_min(R) <= ||P - R||. By Claim 2.3,
  f - f_opt = ||(P - R) Sigma^{1/2}||_F^2 >= sigma_min(Sigma) ||P - R||^2.
  """
  r_min = float(tf.linalg.svd(linear.check_matrix(r), compute_uv=False)[-1])
  return linear.smallest_eigenvalue(sigma) * r_min ** 2


def factorization_norm(r, layers):
  """|||A||| of Theorem 2.1's factorization of R into LAYERS layers, or None.

  The yardstick for how far a descent path goes: a global minimum this
  close to A = 0 exists. None when l < 3 gamma (the theorem does not apply).
  """
  try:
    return linear.max_layer_norm(linear.factorize(r, layers))
  except ValueError:
    return None


def draw_starts(count, layers, d, tau, seed):
  """COUNT starts (count, l, d, d) by `linear.random_layers`: see START_RULE.

  Seeded by (SEED, LAYERS, TAU), so a cell's starts do not depend on the
  rest of the grid.
  """
  rng = np.random.default_rng([seed, layers, int(round(tau * 1e9))])
  return np.stack([linear.random_layers(layers, d, rng, tau)
                   for _ in range(count)])


# ----------------------------------------------------------------------------
# Descent on a batch of starts, each with its own target.

@tf.function(reduce_retracing=True)
def batched_risk_and_gradient(a, targets, sigma):
  """(f - f_opt, grad f) for a batch of layer stacks, each with its own R.

  A (batch, l, d, d), TARGETS (batch, d, d). f - f_opt = tr(E Sigma E^T) is
  Claim 2.3's excess risk, summed from E (so gaps far below d eps are
  representable), and grad f Lemma 2.4's, both from
  `linear._excess_risk_and_gradient` (the traced core of
  `linear.risk_and_gradient`; its public wrapper checks its inputs on the
  host, which a traced loop cannot), vectorized over the batch.
  """
  def one(args):
    # pylint: disable-next=protected-access
    return linear._excess_risk_and_gradient(args[0], args[1], sigma)
  return tf.vectorized_map(one, (a, targets))


@tf.function(reduce_retracing=True)
def _batched_step(a, targets, sigma, step_size):
  """One step for every start: (next A, f - f_opt, ||A_i|| per layer,
  ||grad f||_F^2, finite).

  A run whose next iterate is not finite keeps its A (and `finite` says so),
  so that the SVD never sees a NaN.
  """
  gaps, gradients = batched_risk_and_gradient(a, targets, sigma)
  layer_norms = tf.linalg.svd(a, compute_uv=False)[..., 0]
  squares = tf.reduce_sum(tf.square(gradients), axis=[1, 2, 3])
  candidate = a - step_size * gradients
  finite = tf.reduce_all(tf.math.is_finite(candidate), axis=[1, 2, 3])
  following = tf.where(finite[:, None, None, None], candidate, a)
  return following, gaps, layer_norms, squares, finite


def descend_batch(a, targets, sigma, steps, step_size, progress=None):
  """STEPS gradient steps on f (Claim 2.3, Lemma 2.4) for every start at once.

  A: (batch, l, d, d) layers (the residual parametrisation; the plain one is
  A = W - I); TARGETS: (batch, d, d), one R per start. Returns arrays with one
  row per step t = 0..STEPS (the state after t steps) and one column per
  start: "gap" (f - f_opt), "norm" (|||A|||), "grad_sq" (||grad f||_F^2);
  "layer_norms" (steps + 1, batch, l), ||A_i|| with A_1 first; and
  "diverged" (batch,): the first step whose update was not finite, -1 if
  none (a diverged run's later rows repeat its last finite state).
  """
  a = tf.constant(np.asarray(a, np.float64))
  targets = tf.constant(np.asarray(targets, np.float64))
  sigma = tf.constant(np.asarray(sigma, np.float64))
  step = tf.constant(step_size, dtype=DTYPE)
  rows = {"gap": [], "layer_norms": [], "grad_sq": []}
  diverged = np.full(a.shape[0], -1)
  for t in range(steps + 1):
    a, gaps, layer_norms, squares, finite = _batched_step(a, targets, sigma,
                                                          step)
    for name, value in zip(rows, (gaps, layer_norms, squares)):
      rows[name].append(value.numpy())
    newly = (diverged < 0) & ~finite.numpy()
    diverged[newly] = t
    if progress and t % max(1, steps // 4) == 0:
      progress(f"  step {t}/{steps}: f - f_opt from "
               f"{np.min(rows['gap'][-1]):.2e} to "
               f"{np.max(rows['gap'][-1]):.2e} over the batch")
  result = {name: np.stack(values) for name, values in rows.items()}
  result["norm"] = result["layer_norms"].max(axis=-1)
  result["diverged"] = diverged
  return result


# ----------------------------------------------------------------------------
# Bookkeeping: what one cell (l, tau) of the grid reports.

def first_true(mask):
  """Per column of the (steps + 1, batch) MASK, its first True row, or -1."""
  mask = np.asarray(mask, bool)
  return np.where(mask.any(axis=0), mask.argmax(axis=0), -1)


def _median_max(values):
  values = [int(v) for v in values if v >= 0]
  if not values:
    return None
  return {"median": float(np.median(values)), "max": max(values)}


def _reached(run, epsilon):
  """First step with f - f_opt <= EPSILON per start (-1: never, or diverged)."""
  reached = first_true(run["gap"] <= epsilon)
  reached[run["diverged"] >= 0] = -1
  return reached


def _steps_to_half(gap):
  """First step with f - f_opt <= half of its start, per start (-1: never)."""
  return first_true(gap <= 0.5 * gap[:1])


def _path_norms(run, reached):
  """Per start, the largest |||A||| on its path: up to the step it reached
  epsilon (REACHED >= 0), else to the end; and the (steps + 1, batch) mask
  of the path's steps."""
  steps = run["gap"].shape[0]
  ends = np.where(reached >= 0, reached, steps - 1)
  on_path = np.arange(steps)[:, None] <= ends[None, :]
  return np.where(on_path, run["norm"], 0.0).max(axis=0), on_path


def _optional(values):
  """A list for JSON: floats, with None for NaN (nothing to report)."""
  return [None if np.isnan(v) else float(v) for v in values]


def residual_summary(run, epsilon, tau, layers, sigma_min):
  """Success, steps, |||A||| along each path, and (2.3) met along each path.

  Per start, its path (up to the step it reached EPSILON, else to the end)
  lies in B_tau_path, tau_path = its largest |||A|||. Its smallest
  ||grad f||^2 / (f - f_opt), over steps with f - f_opt > max(EPSILON,
  RATIO_FLOOR), is divided by mu = `linear.pl_constant`(l, tau_path,
  sigma_min) of that path: (2.3) says the quotient is >= 1 whenever
  tau_path < 1 (Theorem 2.2); for tau_path >= 1 the bound says nothing and
  the quotient is null.
  """
  reached = _reached(run, epsilon)
  path_norm, on_path = _path_norms(run, reached)
  usable = on_path & (run["gap"] > max(epsilon, RATIO_FLOOR))
  ratios = np.where(usable, run["grad_sq"] / np.where(usable, run["gap"], 1.0),
                    np.inf).min(axis=0)
  quotients = np.array([
      ratio / linear.pl_constant(layers, norm, sigma_min)
      if norm < 1 and np.isfinite(ratio) else np.nan
      for ratio, norm in zip(ratios, path_norm)])
  finite = ratios[np.isfinite(ratios)]
  return {
      "reached_fraction": float(np.mean(reached >= 0)),
      "steps_to_epsilon": _median_max(reached),
      "steps_to_half": _median_max(_steps_to_half(run["gap"])),
      "final_gap": {"median": float(np.median(run["gap"][-1])),
                    "max": float(np.max(run["gap"][-1]))},
      "path_max_norm": {"median": float(np.median(path_norm)),
                        "max": float(path_norm.max())},
      "path_max_norm_by_start": [float(v) for v in path_norm],
      "stayed_in_B_tau_fraction": float(np.mean(
          path_norm <= tau * (1 + 1e-12) + 1e-15)),
      "stayed_in_B_1_fraction": float(np.mean(path_norm < 1.0)),
      "min_ratio": float(finite.min()) if finite.size else None,
      "min_ratio_over_pl_constant": (float(np.nanmin(quotients))
                                     if np.isfinite(quotients).any()
                                     else None),
      "min_ratio_over_pl_constant_by_start": _optional(quotients),
      "diverged": int(np.sum(run["diverged"] >= 0)),
      "starts": int(reached.size),
  }


def plain_summary(run, epsilon):
  """The plain W_l ... W_1 from W_i = A_i: stall length and failures."""
  reached = _reached(run, epsilon)
  half = _steps_to_half(run["gap"])
  return {
      "reached_fraction": float(np.mean(reached >= 0)),
      "failed_within_budget": int(np.sum(reached < 0)),
      "steps_to_half": _median_max(half),
      "never_halved": int(np.sum(half < 0)),
      "initial_gap_median": float(np.median(run["gap"][0])),
      "final_gap_median": float(np.median(run["gap"][-1])),
      "diverged": int(np.sum(run["diverged"] >= 0)),
  }


def crossings(run):
  """Per start, where its path first leaves B_1 (|||A||| >= 1), or None.

  {"step", "layer": the i of the largest ||A_i|| there (A_1 applied first),
  "layer_norm", "gap": f - f_opt there, "gap_before": f - f_opt one step
  earlier, the last state inside B_1}.
  """
  crossed = first_true(run["norm"] >= 1.0)
  found = []
  for j, step in enumerate(crossed):
    if step < 0:
      found.append(None)
      continue
    norms = run["layer_norms"][step, j]
    found.append({"step": int(step), "layer": int(np.argmax(norms)) + 1,
                  "layer_norm": float(np.max(norms)),
                  "gap": float(run["gap"][step, j]),
                  "gap_before": (float(run["gap"][step - 1, j]) if step
                                 else None)})
  return found


def negative_det_summary(run, epsilon, floor):
  """det R < 0: where each path leaves B_1, the final gap, and the floor.

  `crossings` per start; `floor_holds`: f - f_opt >= FLOOR
  (`negative_det_floor`) at every step with |||A||| < 1, as the determinant
  argument requires.
  """
  reached = _reached(run, epsilon)
  crossed = first_true(run["norm"] >= 1.0)
  where = crossings(run)
  left = [c for c in where if c is not None]
  inside = run["norm"] < 1.0
  gaps_inside = run["gap"][inside]
  min_inside = float(gaps_inside.min()) if gaps_inside.size else None
  final = run["gap"][-1]
  layers = [c["layer"] for c in left]
  return {
      "reached_fraction": float(np.mean(reached >= 0)),
      "crossed_1_fraction": float(np.mean(crossed >= 0)),
      "crossing_step": _median_max(crossed),
      "crossing_layer_counts": {str(i): layers.count(i)
                                for i in sorted(set(layers))},
      "gap_at_crossing": ({"median": float(np.median([c["gap"]
                                                      for c in left])),
                           "min": min(c["gap"] for c in left)}
                          if left else None),
      "crossings_by_start": where,
      "path_max_norm_by_start": [float(v) for v in run["norm"].max(axis=0)],
      "reached_without_crossing_1": int(np.sum(
          (reached >= 0) & ((crossed < 0) | (crossed > reached)))),
      "final_gap": {"median": float(np.median(final)),
                    "min": float(final.min())},
      "gap_floor_inside_B_1": floor,
      "min_gap_inside_B_1": min_inside,
      "floor_holds": (min_inside is None
                      or min_inside >= floor * (1 - 1e-9) - 1e-12),
      "diverged": int(np.sum(run["diverged"] >= 0)),
  }


# ----------------------------------------------------------------------------
# The grid.

KINDS = ("residual", "plain", "negative_det")


def _columns(run, columns):
  """The starts COLUMNS (a slice) of a `descend_batch` result."""
  return {name: (value[columns] if value.ndim == 1 else value[:, columns])
          for name, value in run.items()}


def _depth_batch(r, flipped, d, layers, taus, starts, seed):
  """One batch for depth LAYERS: every tau's starts, once per kind (KINDS).

  The same starts serve the residual descent on R, the plain W_i = A_i
  (as A = W - I) on R, and the residual descent on the flipped R.
  """
  begin = np.concatenate([draw_starts(starts, layers, d, tau, seed)
                          for tau in taus])
  count = begin.shape[0]
  layers_by_kind = {"residual": begin, "plain": begin - np.eye(d),
                    "negative_det": begin}
  target_by_kind = {"residual": r, "plain": r, "negative_det": flipped}
  batch = np.concatenate([layers_by_kind[kind] for kind in KINDS])
  targets = np.concatenate([np.repeat(target_by_kind[kind][None], count, 0)
                            for kind in KINDS])
  return batch, targets, count


def check_positive_definite(sigma):
  """ValueError unless the symmetric SIGMA is positive definite to working
  precision: (2.3)'s mu is proportional to sigma_min(Sigma), so with
  sigma_min(Sigma) = 0 Theorem 2.2 says nothing."""
  values = np.linalg.eigvalsh(sigma)
  tolerance = len(values) * np.finfo(np.float64).eps * max(values[-1], 0.0)
  if not values[0] > tolerance:
    raise errors.ConfigError(
        f"Sigma is not positive definite: its smallest eigenvalue is "
        f"{values[0]:.3g} (at most d eps sigma_max = {tolerance:.3g}), and "
        f"(2.3)'s mu = 4 l (1 - tau)^(2l-2) sigma_min(Sigma) needs "
        f"sigma_min(Sigma) > 0; give Sigma = E[x x^T] of full rank")


def _check_grid(depths, taus, starts, steps, epsilon, step_size):
  if not depths or any(int(l) != l or l < 1 for l in depths):
    raise errors.ConfigError(
        f"depths must be integers >= 1, got {list(depths)}")
  if not taus or any(not 0 <= t < 1 for t in taus):
    raise errors.ConfigError(
        f"taus must be in [0, 1) (Theorem 2.2's tau < 1), got "
        f"{list(taus)}")
  if starts < 1 or steps < 1 or not epsilon > 0:
    raise errors.ConfigError("need starts >= 1, steps >= 1 and epsilon > 0")
  if step_size is not None and not step_size > 0:
    raise errors.ConfigError("step_size must be positive")


def run_landscape(r, sigma, depths, taus, starts, steps, epsilon, seed=0,
                  step_size=None, progress=None):
  """Theorem 2.2's experiment on the grid DEPTHS x TAUS, STARTS starts each.

  Every descent takes STEPS steps of STEP_SIZE (default, per depth,
  `linear.default_step_size`(R, Sigma, l); the same for the three kinds).
  Returns (report, curves): report["cells"] holds, per (l, tau),
  `residual_summary`, `plain_summary` and `negative_det_summary`; curves
  {l: {kind: {"gap", "norm"}}} are medians over the depth's starts per step
  (for `plot_landscape`). Raises ValueError for an R that is singular to
  working precision or has det R <= 0, a Sigma that is not positive
  definite, or a bad grid.
  """
  r = linear.check_matrix(r).numpy()
  d = r.shape[0]
  sigma = linear.check_covariance(sigma, d).numpy()
  check_positive_definite(sigma)
  _check_grid(depths, taus, starts, steps, epsilon, step_size)
  linear.check_invertible(np.linalg.svd(r, compute_uv=False))
  sign, _ = np.linalg.slogdet(r)
  if sign <= 0:
    raise errors.ConfigError(
        "det R <= 0: no product (I + A_l)...(I + A_1) with "
        "|||A||| < 1 reaches it; give R with det R > 0 (the "
        "det R < 0 contrast is built from it)")
  say = progress or (lambda message: None)
  flipped = flip_determinant(r)
  floor = negative_det_floor(flipped, sigma)
  sigma_min = linear.smallest_eigenvalue(sigma)
  cells, curves = [], {}
  for layers in depths:
    eta = step_size or linear.default_step_size(r, sigma, layers)
    reference = factorization_norm(r, layers)
    say(f"l = {layers}: {len(taus)} taus x {starts} starts x {len(KINDS)} "
        f"kinds, {steps} steps of {eta:.4g}")
    batch, targets, count = _depth_batch(r, flipped, d, layers, taus, starts,
                                         seed)
    run = descend_batch(batch, targets, sigma, steps, eta, say)
    parts = {kind: _columns(run, slice(k * count, (k + 1) * count))
             for k, kind in enumerate(KINDS)}
    curves[layers] = {kind: {"gap": np.median(part["gap"], axis=1),
                             "norm": np.median(part["norm"], axis=1)}
                      for kind, part in parts.items()}
    for j, tau in enumerate(taus):
      cell = {kind: _columns(part, slice(j * starts, (j + 1) * starts))
              for kind, part in parts.items()}
      cells.append({
          "layers": int(layers), "tau": float(tau), "step_size": eta,
          "theorem_2_1_max_norm": reference,
          "residual": residual_summary(cell["residual"], epsilon, tau,
                                       layers, sigma_min),
          "plain": plain_summary(cell["plain"], epsilon),
          "negative_det": negative_det_summary(cell["negative_det"], epsilon,
                                               floor)})
  return _report(r, sigma, cells, steps, epsilon, seed, starts), curves


def _report(r, sigma, cells, steps, epsilon, seed, starts):
  singular = np.linalg.svd(r, compute_uv=False)
  eigenvalues = np.linalg.eigvalsh(sigma)
  return {
      "experiment": "Theorem 2.2: gradient descent on the population risk "
                    "(Claim 2.3, Lemma 2.4) from random starts in B_tau",
      "d": r.shape[0], "seed": seed, "starts_per_cell": starts,
      "steps": steps, "epsilon": epsilon,
      "f_opt": linear.optimal_risk(r.shape[0]),
      "start_rule": START_RULE,
      "plain_rule": "W_l ... W_1 with W_i = the residual run's A_i (starts "
                    "near W = 0), same step size and steps",
      "negative_det_rule": "R with its first row negated, residual "
                           "descent from the same starts",
      "R": {"condition": float(singular[0] / singular[-1]),
            "sigma_max": float(singular[0]), "sigma_min": float(singular[-1]),
            "det": float(np.linalg.det(r)),
            "norm_R_minus_I": float(np.linalg.norm(r - np.eye(r.shape[0]),
                                                   2))},
      "Sigma_eigenvalues": [float(eigenvalues[0]), float(eigenvalues[-1])],
      "cells": cells,
  }


def plot_landscape(report, curves, path):
  """PNG: success per (l, tau); median f - f_opt and |||A||| per step."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  depths = sorted({c["layers"] for c in report["cells"]})
  taus = sorted({c["tau"] for c in report["cells"]})
  success = np.full((len(depths), len(taus)), np.nan)
  figure, (grid, gaps, norms) = pyplot.subplots(1, 3, figsize=(16, 4.5))
  for c in report["cells"]:
    i, j = depths.index(c["layers"]), taus.index(c["tau"])
    success[i, j] = c["residual"]["reached_fraction"]
    grid.text(j, i, f"{success[i, j]:.2f}\nplain "
              f"{c['plain']['reached_fraction']:.2f}\ndet R < 0 "
              f"{c['negative_det']['reached_fraction']:.2f}", ha="center",
              va="center", fontsize=8,
              bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
  image = grid.imshow(success, vmin=0, vmax=1, cmap="Greens", aspect="auto")
  grid.set_xticks(range(len(taus)), [f"{t:g}" for t in taus])
  grid.set_yticks(range(len(depths)), [str(l) for l in depths])
  grid.set_xlabel("tau (start radius)")
  grid.set_ylabel("depth l")
  grid.set_title(f"fraction reaching f - f_opt <= {report['epsilon']:g} "
                 f"(colour: residual)")
  figure.colorbar(image, ax=grid)
  styles = {"residual": "-", "plain": "--", "negative_det": ":"}
  for n, layers in enumerate(depths):
    color = f"C{n}"
    for kind, style in styles.items():
      run = curves[layers][kind]
      # An exact fit (gap 0) has no place on a log axis: left out.
      gaps.semilogy(np.where(run["gap"] > 0, run["gap"], np.nan), style,
                    color=color,
                    label=f"l = {layers}, {kind}")
      if kind != "plain":
        norms.plot(run["norm"], style, color=color,
                   label=f"l = {layers}, {kind}")
  norms.axhline(1.0, color="k", linewidth=0.8)
  gaps.set_title("median over the depth's starts (all taus)")
  for axis, label in ((gaps, "f - f_opt"), (norms, "|||A||| = max_i ||A_i||")):
    axis.set_xlabel("step")
    axis.set_ylabel(label)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  pyplot.close(figure)
