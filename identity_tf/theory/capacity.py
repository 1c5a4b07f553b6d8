"""Theorem 3.2 on real data: what the construction costs as n and d grow.

Theorem 3.2 bounds the parameters of a network that fits n points by
O(n log n + r^2) for a fixed separation rho. On real data rho is measured,
not fixed, and it decides the width k: the lossless A0 has k = d + 1 once
n > d, the Johnson-Lindenstrauss option k = `construction.jl_width(n, rho)`,
which is below d + 1 only when rho > sqrt(JL_CONSTANT ln n / (d + 1)).

`sweep` builds the construction for the first n points, for several n and
input dimensions d (the raw inputs, or a PCA fitted on the n points, or a
seeded Gaussian random projection: `reduction`), and records the count
against the bound; `plot_sweep` draws it; `held_out` is the constructed
network's top-1 accuracy on points it was not built from (and, with a
schedule, the same architecture trained by SGD at the smallest n, beside
it). `run_sweep` is what //bin:construct --sweep_n does with them.
"""

import json
import math
import os
import time

import numpy as np

from identity_tf import errors
from identity_tf.theory import construction
from identity_tf.theory import parallel

# --reduce: how inputs go from d to fewer coordinates.
REDUCTIONS = ("pca", "random")
# Rows of X^T X summed per thread when fitting a PCA.
GRAM_ROWS = 8192


class Reduction:
  """x -> (x - mean) @ matrix: the map both training and test points go
  through before the construction (fitted on the training points only)."""

  def __init__(self, method, mean, matrix):
    self.method = method
    self.mean = np.asarray(mean, np.float64)
    self.matrix = np.asarray(matrix, np.float64)

  @property
  def dim(self):
    return self.matrix.shape[1]

  def apply(self, x):
    return (np.asarray(x, np.float64) - self.mean) @ self.matrix

  def save(self, path):
    np.savez(path, method=self.method, mean=self.mean, matrix=self.matrix)


def principal_axes(x):
  """(mean, axes): the mean of the rows of X and the eigenvectors of their
  scatter matrix as columns, by decreasing variance. The scatter matrix is
  summed over blocks of GRAM_ROWS rows on every core."""
  x = np.asarray(x, np.float64)
  mean = x.mean(axis=0)
  blocks = parallel.map_with_progress(
      lambda start: (x[start:start + GRAM_ROWS] - mean).T @ (
          x[start:start + GRAM_ROWS] - mean),
      range(0, len(x), GRAM_ROWS))
  _, vectors = np.linalg.eigh(sum(blocks))
  return mean, vectors[:, ::-1]


def reduction(x, dim, method, seed=0, axes=None):
  """The map of X's rows to DIM coordinates, or None when DIM is d (raw).

  METHOD "pca": the top DIM principal axes of X (AXES: `principal_axes(x)`,
  if already computed); "random": a Gaussian (d, DIM) / sqrt(DIM) drawn with
  numpy seed (SEED, DIM), the same for every X of that d.
  """
  d = x.shape[1]
  if dim == d:
    return None
  if not 1 <= dim < d:
    raise errors.ConfigError(
        f"cannot reduce d = {d} inputs to {dim} coordinates; "
        f"give a dimension in [1, {d}]")
  if method == "pca":
    mean, vectors = principal_axes(x) if axes is None else axes
    return Reduction("pca", mean, vectors[:, :dim])
  if method == "random":
    gaussian = np.random.default_rng((int(seed), dim)).standard_normal(
        (d, dim))
    return Reduction("random", np.zeros(d), gaussian / math.sqrt(dim))
  raise errors.ConfigError(
      f"--reduce={method} is not one of {', '.join(REDUCTIONS)}")


def formula_parameters(n_distinct, d, k, r):
  """The numbers in weights.npz, from the shapes alone: mu (d), s and t (2),
  A0 (k (d + 1)), L = ceil(n / k) units of U, V, b (L (2 k^2 + k)), and the
  readout U_out, b_out, V_out (r k + r + r^2)."""
  units = -(-n_distinct // k)
  return d + 2 + k * (d + 1) + units * (2 * k * k + k) + r * k + r + r * r


def bound(n, r):
  """Theorem 3.2's n ln n + r^2 (ln 2 for n = 1, as `parameter_ratio`)."""
  return n * math.log(max(n, 2)) + r * r


def network_figures(result, n, d, r):
  """What a report says about the network RESULT built for n points in R^d."""
  weights = result.weights
  return {
      "n": n, "n_distinct": int(len(result.distinct)), "d": d, "r": r,
      "k": result.k, "k_johnson_lindenstrauss": result.k_formula,
      "L": result.num_units, "projection": result.mode,
      "johnson_lindenstrauss_fallback": result.jl_fallback,
      "parameters": construction.count_parameters(weights),
      "residual_parameters": construction.residual_parameters(weights),
      "n_log_n_plus_r2": bound(n, r),
      "ratio": construction.parameter_ratio(weights, n, r),
      "rho": result.rho,
  }


def held_out(weights, x, y, log=None):
  """Top-1 accuracy of the network WEIGHTS on held-out points (X, Y).

  Also the fraction of points whose logits are all zero: no residual unit
  moved them onto a surrogate, so the readout is silent and argmax picks
  class 0 -- what a memorising network does away from its training points.
  """
  logits = construction.evaluate(weights, x, log)
  return {"test_accuracy": float(np.mean(np.argmax(logits, axis=1) == y)),
          "test_examples": int(len(y)),
          "test_zero_logits": float(np.mean(np.all(logits == 0, axis=1)))}


# ------------------------------------------------------------------ flags


def parse_positive_list(values, flag):
  """The sorted distinct positive integers of a list flag's VALUES (strings
  or ints); ValueError (one line, naming FLAG) otherwise."""
  given = ",".join(map(str, values or ()))
  numbers = []
  for value in values or ():
    text = str(value).strip()
    if not text.isdigit() or int(text) < 1:
      raise errors.ConfigError(f"--{flag}={given}: {text!r} is not a positive "
                               f"integer; give a comma-separated list such as "
                               f"--{flag}=1000,3000")
    numbers.append(int(text))
  if not numbers:
    raise errors.ConfigError(
        f"--{flag} is empty; give a comma-separated list such "
        f"as --{flag}=1000,3000")
  return sorted(set(numbers))


def check_sweep(sizes, dims, available, d, source):
  """ValueError (one line) unless every n of SIZES is at most the AVAILABLE
  training points of SOURCE and every dimension of DIMS at most their d."""
  if sizes[-1] > available:
    raise errors.ConfigError(
        f"--sweep_n asks for {sizes[-1]} points but {source} "
        f"has {available} training points; give sizes up to "
        f"{available}")
  if dims[-1] > d:
    raise errors.ConfigError(
        f"--sweep_dims asks for {dims[-1]} coordinates but the "
        f"inputs have d = {d}; give dimensions up to {d} (d: "
        f"the raw inputs)")


# ------------------------------------------------------------------ sweep


def sweep(x, y, r, sizes, dims, method="pca", seed=0, x_test=None,
          y_test=None, johnson_lindenstrauss=False, sgd=None, log=None):
  """One construction per n in SIZES (the first n rows of X, Y) and d' in
  DIMS (`reduction` of those n points by METHOD, or the raw inputs when d'
  is X's d); returns one row per pair: `network_figures`, the seconds, and
  whether every one of the n points is fitted (`construction.accuracy` on
  all of them). With X_TEST, Y_TEST also the network's `held_out` accuracy
  on them, reduced by the same map. A pair the construction refuses (points
  closer than float64 handles) gets `fitted: false` and the error.

  SGD: (steps, batch size, learning rate), or None. At the smallest n of
  SIZES (each d'), the same architecture is also trained by SGD on the same
  points (`construction_sgd.contrast`): its test accuracy goes beside the
  construction's. Only there, because SGD's cost per step grows with the
  width k and the depth L of the construction, which grow with n.
  """
  log = log or (lambda message: None)
  rows = []
  for n in sizes:
    axes = None
    if method == "pca" and min(dims) < x.shape[1]:
      log(f"n = {n}: principal axes of the {n} points")
      axes = principal_axes(x[:n])
    for dim in sorted(dims, reverse=True):
      rows.append(_sweep_row(x[:n], y[:n], r, dim, method, seed, axes,
                             x_test, y_test, johnson_lindenstrauss,
                             sgd if n == min(sizes) else None, log))
  return rows


def _sweep_row(x, y, r, dim, method, seed, axes, x_test, y_test,
               johnson_lindenstrauss, sgd, log):
  """The sweep's row for the points (X, Y) reduced to DIM coordinates (and
  the SGD contrast on them when SGD is a schedule)."""
  started = time.time()
  mapping = reduction(x, dim, method, seed, axes)
  points = x if mapping is None else mapping.apply(x)
  row = {"n": len(x), "d": dim,
         "reduce": "none" if mapping is None else method}
  log(f"n = {len(x)}, d = {dim} ({row['reduce']}): constructing")
  try:
    result = construction.construct(
        points, y, num_classes=r, seed=seed,
        johnson_lindenstrauss=johnson_lindenstrauss)
  except ValueError as error:
    log(f"  refused: {error}")
    return {**row, "fitted": False, "error": str(error),
            "seconds": time.time() - started}
  if result.jl_fallback:
    log(f"  {result.jl_fallback}")
  verify_started = time.time()
  fit = construction.accuracy(result.weights, points, y)
  row.update(network_figures(result, len(x), dim, r))
  row.update(training_accuracy=fit, fitted=fit == 1.0,
             seconds_construct=result.seconds,
             seconds_verify=time.time() - verify_started)
  test_points = (None if x_test is None else
                 x_test if mapping is None else mapping.apply(x_test))
  if x_test is not None:
    row.update(held_out(result.weights, test_points, y_test))
  row["seconds"] = time.time() - started
  log(f"  k = {row['k']}, L = {row['L']}, rho = {row['rho']:.3g}: "
      f"{row['parameters']:,} parameters = {row['ratio']:.3g} x (n ln n + "
      f"r^2); fits {fit:.6f} of the points ({row['seconds']:.1f} s)")
  if sgd is not None:
    from identity_tf.theory import construction_sgd  # pylint: disable=g-import-not-at-top
    figures, record = construction_sgd.contrast(
        points, y, r, result.k, result.num_units, sgd, seed, test_points,
        y_test, log)
    row.update(figures, sgd_seconds=record["seconds"],
               sgd_history=record["history"])
  return row


def plot_sweep(rows, path, r, title=""):
  """PNG: parameters against n (log-log) per input dimension d, with Theorem
  3.2's n ln n + r^2 and the lossless count at k = min(n, d + 1) (linear in
  n once n > d); their ratio (flat in the n log n regime, falling like
  2 (d + 1) / ln n in the linear one); and the measured rho against the rho
  above which the Johnson-Lindenstrauss width is narrower than k = min(n,
  d + 1) (where the n log n regime can start)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  fitted = [row for row in rows if "parameters" in row]
  sizes = np.geomspace(min(row["n"] for row in rows),
                       max(row["n"] for row in rows), 50)
  figure, (left, middle, right) = pyplot.subplots(1, 3, figsize=(17, 4.8))
  left.loglog(sizes, [bound(n, r) for n in sizes], "k--",
              label="n ln n + r^2 (Theorem 3.2)")
  for colour, d in enumerate(sorted({row["d"] for row in rows},
                                    reverse=True)):
    mine = sorted((row for row in fitted if row["d"] == d),
                  key=lambda row: row["n"])
    style = dict(color=f"C{colour}")
    lossless = [construction.lossless_width(math.ceil(n), d + 1)
                for n in sizes]
    left.loglog(sizes, [formula_parameters(math.ceil(n), d, k, r)
                        for n, k in zip(sizes, lossless)], ":", **style,
                label=f"k = min(n, d + 1): linear in n past {d + 1}")
    right.loglog(sizes, [math.sqrt(construction.JL_CONSTANT * math.log(n) / k)
                         for n, k in zip(sizes, lossless)], ":", **style,
                 label=f"above: JL narrower than k = min(n, {d + 1})")
    if mine:
      ns = [row["n"] for row in mine]
      left.loglog(ns, [row["parameters"] for row in mine], "o-", **style,
                  label=f"measured, d = {d}")
      middle.semilogx(ns, [row["ratio"] for row in mine], "o-", **style,
                      label=f"d = {d}")
      right.loglog(ns, [row["rho"] for row in mine], "o-", **style,
                   label=f"measured rho, d = {d}")
  left.set_xlabel("n (training points)")
  left.set_ylabel("parameters")
  left.legend(fontsize=7)
  left.grid(True, which="both", alpha=0.3)
  middle.set_xlabel("n (training points)")
  middle.set_ylabel("parameters / (n ln n + r^2)")
  middle.set_ylim(bottom=0)
  middle.legend(fontsize=7)
  middle.grid(True, which="both", alpha=0.3)
  right.set_xlabel("n (training points)")
  right.set_ylabel("rho: smallest separation on the sphere")
  right.legend(fontsize=7)
  right.grid(True, which="both", alpha=0.3)
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


# The figures of each row //bin:construct --sweep_n prints on stdout.
SUMMARY_KEYS = ("n", "d", "reduce", "k", "k_johnson_lindenstrauss", "L",
                "projection", "parameters", "n_log_n_plus_r2", "ratio", "rho",
                "fitted", "test_accuracy", "sgd_test_accuracy", "seconds")


def run_sweep(x, y, r, output_dir, sizes, dims, *, method="pca", seed=0,
              x_test=None, y_test=None, johnson_lindenstrauss=False,
              sgd=None, source=None, log=None):
  """//bin:construct --sweep_n: `sweep`, then OUTPUT_DIR/sweep.json (every
  row) and sweep.png (`plot_sweep`); returns the summary it prints. SGD:
  `sweep`'s.

  Raises ValueError after writing both if a network that was built does not
  fit all of its points (a bug).
  """
  started = time.time()
  rows = sweep(x, y, r, sizes, dims, method, seed, x_test, y_test,
               johnson_lindenstrauss, sgd, log)
  report = {"source": source, "r": r, "reduce": method, "seed": seed,
            "johnson_lindenstrauss": johnson_lindenstrauss,
            "sgd": (None if sgd is None else
                    dict(zip(("steps", "batch_size", "learning_rate"), sgd),
                         at_n=min(sizes))),
            "jl_constant": construction.JL_CONSTANT, "rows": rows,
            "seconds": time.time() - started}
  json_path = os.path.join(output_dir, "sweep.json")
  with open(json_path, "w") as f:
    json.dump(report, f, indent=2)
  png_path = os.path.join(output_dir, "sweep.png")
  plot_sweep(rows, png_path, r, f"Theorem 3.2 on {source}: parameters and "
             f"separation against n")
  unfit = [row for row in rows if "parameters" in row and not row["fitted"]]
  if unfit:
    raise errors.ConfigError(
        f"the network built for n = {unfit[0]['n']}, d = {unfit[0]['d']} "
        f"fits only {unfit[0]['training_accuracy']:.6f} of its points; this "
        f"is a bug ({json_path})")
  return {"sweep_json": json_path, "sweep_png": png_path,
          "rows": [{key: row[key] for key in SUMMARY_KEYS if key in row}
                   for row in rows]}
