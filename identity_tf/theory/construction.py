"""The expressivity construction of Section 3 (Theorem 3.2, Lemma B.1).

Hardt & Ma prove that a residual network of dense units h + V ReLU(U h + b)
with O(n log n + r^2) parameters fits any n labelled points with r classes.
`construct(x, y)` builds that network explicitly, in float64:

1. Inputs go onto the unit sphere (Assumption 3.1):
   z = concat((x - mu) / s, [t]) / ||concat((x - mu) / s, [t])||.
   With t > 0 the map is injective, so distinct inputs stay distinct even when
   they lie on one ray from mu (x and 2x would otherwise collide).
2. A0 maps z to R^k, losslessly by default: an exact isometry, onto R^(d+1)
   (k = d + 1) when n >= d + 1, else onto the span of the n points (k = n).
   The Johnson-Lindenstrauss step of the proof -- a Gaussian A0 to
   k = O(log n / rho^2) -- is an option (`johnson_lindenstrauss=True`): it
   saves parameters on well-separated data but can lose the separation the
   lemma needs on clustered data; then the lossless A0 is used, and said.
3. Random unit surrogates q_1..q_r in R^k stand for the labels.
4. L = ceil(n/k) residual units; unit j owns k points alpha_1..alpha_k and
   (Lemma B.1) has U = [alpha_1 ... alpha_k]^T, b = -(1 - 2 rho') 1 and
   V e_i = (beta_i - alpha_i) / (||alpha_i||^2 - (1 - 2 rho')),
   beta_i = q_{y_i}: it moves each owned point exactly onto its surrogate and
   leaves every other current point (other inputs, surrogates) bitwise
   unchanged, because their pre-activations are all negative.
5. A final ReLU layer maps q_j to the one-hot logit vector of class j.

Everything the lemma needs is measured rather than assumed: the separation rho
on the sphere, the lemma margin after the projection (a draw that spoils it is
retried with a new seed, then with a wider k), and float64 rounding bounds.
Inputs closer than `smallest_separation(k)` on the sphere are rejected.

This module is the construction in NumPy; `construction_model` is the same
network as a Keras model, `construction_sgd` the contrast of training that
architecture by SGD, and `construction_run` what //bin:construct does with
them (build, verify, write the files).
"""

import dataclasses
import math
import threading
import time

import numpy as np

from identity_tf import errors
from identity_tf.theory import parallel

# Unit roundoff of float64.
UNIT_ROUNDOFF = np.finfo(np.float64).eps / 2
UNIT_ROUNDOFF_32 = float(np.finfo(np.float32).eps) / 2
# The lemma margin must exceed the worst-case rounding error of a
# pre-activation by this factor; owned points then land within
# 2 sqrt(k) / SAFETY of their surrogate in the worst case (~1e-14 typically).
SAFETY = 1e3
# Projection draws: this many seeds per k before k grows, at most MAX_DRAWS.
DRAWS_PER_WIDTH = 3
MAX_DRAWS = 12
# The Johnson-Lindenstrauss option's width k = ceil(JL_CONSTANT ln n / rho^2):
# the Gaussian projection of n points keeps every distance within a factor
# 1 +- eps once k >= 8 ln n / eps^2 (eps = rho / 2 here), the paper's
# k = O(log n / rho^2). Lemma B.1's single threshold needs the inner products
# within ~rho^2 / 4, i.e. k of order ln n / rho^4: so on well-separated data
# (rho ~ 1.4) the width suffices, on clustered data it may not, and the draw
# is checked.
JL_CONSTANT = 32.0
# Classes (surrogate vectors) a construction may hold: r x k floats.
MAX_CLASSES = 1_000_000
# Gram matrices are formed in blocks of this many rows: memory O(BLOCK^2).
BLOCK = 2048
# Points are pushed through the network in chunks of this many: O(k CHUNK).
CHUNK = 4096


def _check(condition, message):
  if not condition:
    raise errors.ConfigError(message)


# ---------------------------------------------------------------- input


def validate(x, y, num_classes=None):
  """Checks points X (n, d) and labels Y (n,); returns (x, y, r) as float64/int64.

  Raises ValueError with one line for: empty input, wrong ranks, mismatched
  lengths, NaN/Inf, non-integer labels, labels outside [0, r).
  """
  x = np.asarray(x)
  y = np.asarray(y)
  _check(x.ndim == 2, f"x must be a 2-D array (n, d), got shape {x.shape}")
  _check(y.ndim == 1, f"y must be a 1-D array of labels (n,), got shape "
         f"{y.shape}")
  _check(x.shape[0] > 0 and x.shape[1] > 0,
         f"empty input: x has shape {x.shape}; need at least one point with "
         f"at least one coordinate")
  _check(len(x) == len(y), f"mismatched lengths: x has {len(x)} points but y "
         f"has {len(y)} labels")
  _check(np.issubdtype(x.dtype, np.number) and not np.iscomplexobj(x),
         f"x must hold real numbers, got dtype {x.dtype}")
  x = x.astype(np.float64)
  bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
  _check(bad.size == 0, f"x[{bad[0] if bad.size else 0}] contains NaN or Inf; "
         f"every coordinate must be finite")
  _check(np.issubdtype(y.dtype, np.number) and not np.iscomplexobj(y),
         f"y must hold integer labels, got dtype {y.dtype}")
  if not np.issubdtype(y.dtype, np.integer):
    bad = np.flatnonzero(~np.isfinite(y) | (y != np.round(y)))
    _check(bad.size == 0, f"y[{bad[0] if bad.size else 0}] = "
           f"{y[bad[0]] if bad.size else ''} is not an integer label")
  _check(np.all(np.abs(y) < MAX_CLASSES),
         f"y[{int(np.argmax(np.abs(y) >= MAX_CLASSES))}] = "
         f"{y[np.argmax(np.abs(y) >= MAX_CLASSES)]} is not a label below "
         f"{MAX_CLASSES:,}: the construction holds one surrogate vector per "
         "class 0..r-1; number the classes densely (np.unique(y, "
         "return_inverse=True))")
  y = y.astype(np.int64)
  r = int(y.max()) + 1 if num_classes is None else int(num_classes)
  _check(1 <= r <= MAX_CLASSES, f"the number of classes must be in "
         f"[1, {MAX_CLASSES:,}], got {r}")
  bad = np.flatnonzero((y < 0) | (y >= r))
  _check(bad.size == 0, f"y[{bad[0] if bad.size else 0}] = "
         f"{y[bad[0]] if bad.size else ''} is outside [0, {r}); labels must be "
         f"integers in [0, r)")
  return x, y, r


def deduplicate(x, y):
  """Merges identical inputs; returns (first index of each distinct input, inverse).

  Identical inputs with the same label become one point. Raises ValueError
  naming two indices when identical inputs carry different labels: no
  function can fit them.
  """
  # -0.0 + 0.0 == +0.0, so both zeros get the same bytes.
  rows = np.ascontiguousarray(x + 0.0)
  keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1])))
  _, first, inverse = np.unique(keys.ravel(), return_index=True,
                                return_inverse=True)
  conflict = np.flatnonzero(y != y[first[inverse]])
  if conflict.size:
    i = int(conflict[0])
    j = int(first[inverse[i]])
    raise errors.ConfigError(
        f"inputs {min(i, j)} and {max(i, j)} are identical but labelled "
        f"{y[min(i, j)]} and {y[max(i, j)]}; no function fits both: remove "
        f"or relabel one of them")
  return first, inverse


def normalization(x):
  """(mu, s, t) mapping X onto the unit sphere (Assumption 3.1).

  Inputs already on the unit sphere keep the theorem's setting exactly
  (mu = 0, s = 1, t = 0). Otherwise mu is the mean, s the root-mean-square
  distance to it, and t = 1: the extra coordinate makes the map injective.
  """
  norms = np.linalg.norm(x, axis=1)
  if np.all(np.abs(norms - 1.0) <= 1e-12):
    return np.zeros(x.shape[1]), 1.0, 0.0
  mu = x.mean(axis=0)
  s = float(np.sqrt(np.mean(np.sum((x - mu) ** 2, axis=1))))
  return mu, (s if s > 0 else 1.0), 1.0


def to_sphere(x, mu, s, t):
  """z = concat((x - mu)/s, [t]) scaled to unit length (Assumption 3.1)."""
  z = np.concatenate([(x - mu) / s, np.full((len(x), 1), float(t))], axis=1)
  norms = np.linalg.norm(z, axis=1, keepdims=True)
  return z / np.maximum(norms, np.finfo(np.float64).tiny)


def smallest_separation(k):
  """The smallest distance on the sphere between distinct inputs handled at width K.

  Two inputs rho apart leave the lemma a margin of about rho^2 / 4 between a
  point's own pre-activation and every other one; it must exceed, twice
  over, SAFETY times the worst-case float64 error of a pre-activation,
  1.01 (k + 2) u (||alpha||^2 + |b|) ~ 2.02 (k + 2) u (Higham's gamma_k):
  rho_min = sqrt(16.16 SAFETY (k + 2) u), e.g. 3.0e-6 at k = 3, 1.1e-5 at
  k = 65, 3.8e-5 at k = 785, 7.4e-5 at k = 3073.
  """
  return math.sqrt(16.16 * SAFETY * (k + 2) * UNIT_ROUNDOFF)


def _float32_error(terms):
  """Bound on |float32 dot product - exact| per unit of sum |a_l| |x_l|.

  Rounding both operands to float32 (2 u32) plus a TERMS-term float32 dot
  product (Higham's gamma_terms), with 1 % slack.
  """
  return 1.01 * ((terms + 3) * UNIT_ROUNDOFF_32 + 2 * UNIT_ROUNDOFF_32)


def max_inner_product(points, log=None):
  """max over i != j of <p_i, p_j> (exact in float64) and the pair attaining it.

  Blocked over BLOCK rows (memory O(BLOCK^2) per core), the blocks spread
  over every core (`parallel`). Each block is screened with a float32
  product whose error is bounded by `_float32_error`: only entries that could
  be its float64 maximum are recomputed in float64, so the result is the
  float64 maximum. A block whose float32 maximum is below the largest value
  found so far by more than the error is skipped: it cannot hold the
  maximum. Of equal maxima the first block (in the order of `tasks`) and in
  it the first entry wins, on any number of cores. -inf for a single point.
  """
  points = np.ascontiguousarray(points, np.float64)
  n, dim = points.shape
  single = points.astype(np.float32)
  sq_norms = np.einsum("ij,ij->i", points, points)
  error = _float32_error(dim) * float(sq_norms.max(initial=0.0))
  tasks = [(start, other) for start in range(0, n, BLOCK)
           for other in range(start, n, BLOCK)]
  found = {"best": -math.inf}  # The largest value of any finished block.
  lock = threading.Lock()

  def run(task):
    block = _block_maximum(points, single, error, *task, floor=found["best"])
    with lock:
      found["best"] = max(found["best"], block[0])
    return block

  best, pair = -math.inf, (0, 0)
  for value, where in parallel.map_with_progress(
      run, tasks, log, lambda done, total: f"  gram blocks {done}/{total}"):
    if value > best:
      best, pair = value, where
  return best, pair


def _block_maximum(points, single, error, start, other, floor):
  """(max, (i, j)) of <p_i, p_j> over rows i of block START and j != i of block
  OTHER; (-inf, (0, 0)) if no entry can reach FLOOR.

  The float32 products SINGLE are within ERROR of the float64 ones: every
  entry within 2 ERROR of the float32 maximum may be the float64 maximum and
  is recomputed in float64 (by einsum, the same for each pair wherever it is
  computed).
  """
  gram = single[start:start + BLOCK] @ single[other:other + BLOCK].T
  if other == start:
    np.fill_diagonal(gram, -np.inf)
  top = float(gram.max()) if gram.size else -math.inf
  if top == -math.inf or top + error < floor:
    return -math.inf, (0, 0)
  rows, cols = np.nonzero(gram >= top - 2 * error)
  if len(rows) > 4 * BLOCK:  # degenerate data: redo the block in float64
    exact = points[start:start + BLOCK] @ points[other:other + BLOCK].T
    if other == start:
      np.fill_diagonal(exact, -np.inf)
    rows, cols = np.unravel_index(np.argmax(exact), exact.shape)
    rows, cols = np.atleast_1d(rows), np.atleast_1d(cols)
  values = np.einsum("ij,ij->i", points[start + rows], points[other + cols])
  at = int(np.argmax(values))
  return float(values[at]), (start + int(rows[at]), other + int(cols[at]))


# ---------------------------------------------------------- construction


@dataclasses.dataclass
class Construction:
  """The constructed network (`weights`) and what was measured to build it.

  weights: dict with mu, s, t, A0, U, V, b, U_out, b_out, V_out (see
    `evaluate` for the function they encode).
  distinct: index of the first occurrence of each distinct input.
  inverse: for every input, the index of its distinct point.
  owner: for every distinct point, the residual unit that moves it.
  rho: minimum distance between distinct inputs on the unit sphere.
  closest: the pair of input indices at distance rho.
  rho_prime: the lemma's rho' after the projection (b = -(1 - 2 rho')).
  margin: the lemma margin: every pre-activation is at least this far from 0.
  mode: "isometry" (onto R^k, k >= d + 1), "span" (an isometry onto the span
    of the points, k < d + 1) or "johnson-lindenstrauss" (Gaussian A0).
  draws: projection draws tried; seed: the numpy seed of the one kept.
  k_formula: the Johnson-Lindenstrauss width `jl_width(n, rho)` (-1 when the
    points coincide), whether or not the option was taken.
  jl_fallback: why the Johnson-Lindenstrauss option was not kept (one line),
    or None (not asked for, or kept).
  """
  weights: dict
  distinct: np.ndarray
  inverse: np.ndarray
  owner: np.ndarray
  rho: float
  closest: tuple
  rho_prime: float
  margin: float
  output_margin: float
  mode: str
  draws: int
  seed: tuple
  k_formula: int
  seconds: float
  jl_fallback: str = None

  @property
  def n(self):
    return len(self.inverse)

  @property
  def k(self):
    return self.weights["A0"].shape[0]

  @property
  def num_units(self):
    return self.weights["U"].shape[0]


def count_parameters(weights):
  """Every number stored in WEIGHTS (normalisation, A0, units, final layer)."""
  return int(sum(np.size(value) for value in weights.values()))


def residual_parameters(weights):
  """The parameters of the L residual units alone: L (2 k^2 + k)."""
  return int(np.size(weights["U"]) + np.size(weights["V"]) +
             np.size(weights["b"]))


def parameter_ratio(weights, n, r):
  """parameters / (n ln n + r^2): Theorem 3.2 says this stays bounded."""
  return count_parameters(weights) / (n * math.log(max(n, 2)) + r * r)


def jl_width(n, rho):
  """The paper's k = O(log n / rho^2) of the Johnson-Lindenstrauss step.

  ceil(JL_CONSTANT ln n / rho^2): the width at which a Gaussian projection
  keeps every distance between n points within a factor 1 +- rho / 2. Lemma
  B.1 needs more on clustered data (see JL_CONSTANT); the draw is checked.
  """
  if rho <= 0:
    return math.inf
  return max(2, min(10**9, math.ceil(
      JL_CONSTANT * math.log(max(n, 2)) / rho ** 2)))


def lossless_width(n, dim):
  """k of the default A0, an isometry on the n points in R^DIM: DIM (= d + 1)
  when n >= DIM, else n (their span has at most n dimensions)."""
  return min(n, dim)


def draw_projection(rng, k, dim, r):
  """A0 (k, dim) and unit surrogates Q (r, k) for one projection draw."""
  gaussian = rng.standard_normal((k, dim))
  if k >= dim:
    a0, _ = np.linalg.qr(gaussian)  # orthonormal columns: an isometry
    mode = "isometry"
  else:
    a0 = gaussian / math.sqrt(k)
    mode = "johnson-lindenstrauss"
  return a0, _surrogates(rng, r, k), mode


def span_isometry(z, k):
  """A0 (K, dim) with A0 z_i = the coordinates of z_i in an orthonormal basis
  of span(Z), padded with zero rows: an isometry on the rows of Z (n <= K <
  dim), so inner products and the separation are kept exactly."""
  basis, _ = np.linalg.qr(z.T)  # (dim, n), orthonormal columns
  a0 = np.zeros((k, z.shape[1]))
  a0[:basis.shape[1]] = basis.T
  return a0


def _surrogates(rng, r, k):
  q = rng.standard_normal((r, k))
  return q / np.linalg.norm(q, axis=1, keepdims=True)


def _lemma_check(alpha, q, labels, pp_max, k):
  """The inequalities of Lemma B.1 with float64 rounding, for one draw.

  Returns (ok, reason, numbers). With a = min ||alpha_i||^2 and g the largest
  inner product of a point with any other point or surrogate, the threshold
  1 - 2 rho' = (a + g) / 2 leaves every pre-activation at least
  margin = (a - g) / 2 away from zero (Lemma B.1). The margin must exceed
  SAFETY times the rounding error of a pre-activation; a moved point lands
  within `move_error` of its surrogate, which must not wake up a later unit
  or confuse the final layer.
  """
  u = UNIT_ROUNDOFF
  sq_norms = np.einsum("ij,ij->i", alpha, alpha)
  a = float(sq_norms.min())
  norm_max = max(1.0, float(np.sqrt(sq_norms.max())))
  pq_max = float((alpha @ q.T).max())
  g = max(pp_max, pq_max)
  threshold = (a + g) / 2
  margin = (a - g) / 2
  # Worst-case error of a k-term dot product plus the bias (Higham's gamma_k).
  pre_error = 1.01 * (k + 2) * u * (norm_max * norm_max + abs(threshold))
  distance = float(np.linalg.norm(q[labels] - alpha, axis=1).max())
  move_error = math.sqrt(k) * (
      pre_error / max(margin - pre_error, 1e-300) * distance +
      1.01 * (k + 3) * u * (norm_max + distance))
  gram_q = q @ q.T
  np.fill_diagonal(gram_q, -np.inf)
  qq_max = float(gram_q.max()) if len(q) > 1 else 0.0
  out_threshold = (1 + qq_max) / 2
  out_margin = (1 - qq_max) / 2
  out_error = 1.01 * (k + 2) * u * (1 + move_error + abs(out_threshold))
  numbers = dict(threshold=threshold, margin=margin, a=a, pp_max=pp_max,
                 pq_max=pq_max, qq_max=qq_max, out_threshold=out_threshold,
                 out_margin=out_margin, move_error=move_error)
  if not margin >= SAFETY * pre_error:
    return False, (f"lemma margin {margin:.3g} < {SAFETY:g} x rounding "
                   f"{pre_error:.3g}"), numbers
  if not threshold - pq_max >= 2 * (move_error * norm_max + pre_error):
    return False, (f"surrogate margin {threshold - pq_max:.3g} below the "
                   f"moved-point error {move_error:.3g}"), numbers
  if not out_margin >= max(SAFETY * out_error, 2 * (move_error + out_error)):
    return False, (f"surrogates too close to each other (final margin "
                   f"{out_margin:.3g})"), numbers
  return True, "", numbers


def lemma_unit(alpha, beta, threshold, k):
  """U, V, b of one residual unit (Lemma B.1), padded to k points.

  U = [alpha_1 ... alpha_m]^T, b = -threshold 1 with threshold = 1 - 2 rho',
  V e_i = (beta_i - alpha_i) / (||alpha_i||^2 - threshold). Unused rows of U
  and columns of V (the last unit may own fewer than k points) are zero.
  """
  m = len(alpha)
  u = np.zeros((k, k))
  v = np.zeros((k, k))
  u[:m] = alpha
  activation = np.einsum("ij,ij->i", alpha, alpha) - threshold
  v[:, :m] = ((beta - alpha) / activation[:, None]).T
  return u, v, np.full(k, -threshold)


def construct(x, y, num_classes=None, seed=0, johnson_lindenstrauss=False,
              log=None):
  """Builds the network of Theorem 3.2 that fits (X, Y); returns a Construction.

  X: (n, d) points, Y: (n,) integer labels in [0, r), r = NUM_CLASSES or
  max(Y) + 1. A0 is an exact isometry unless JOHNSON_LINDENSTRAUSS asks for
  the proof's Gaussian projection to k = `jl_width(n, rho)`; when that is no
  narrower, or its draws lose the separation Lemma B.1 needs, the isometry
  is used and `jl_fallback` says why (also logged, one line). Raises
  ValueError with one line when the data cannot be fitted (identical inputs
  with different labels, inputs closer than `smallest_separation(k)` on the
  sphere) or are malformed.
  """
  log = log or (lambda message: None)
  started = time.time()
  x, y, r = validate(x, y, num_classes)
  distinct, inverse = deduplicate(x, y)
  points, labels = x[distinct], y[distinct]
  log(f"{len(x)} inputs, {len(points)} distinct, d = {x.shape[1]}, r = {r}")
  # Assumption 3.1: the unit sphere, and the separation rho measured there.
  mu, s, t = normalization(points)
  z = to_sphere(points, mu, s, t)
  separation = _measure_separation(z, x, y, distinct, log)
  draw, fallback, tried = None, None, 0
  if johnson_lindenstrauss:
    draw, fallback, tried = _try_johnson_lindenstrauss(
        z, labels, r, separation, seed, log)
  if draw is None:
    draw = _draw_keeping_the_lemma(z, labels, r, separation, seed, log, tried)
  weights = _network_weights(mu, s, t, draw, labels, log)
  return Construction(
      weights=weights, distinct=distinct, inverse=inverse,
      owner=np.arange(len(points)) // draw.k, rho=separation.rho,
      closest=separation.closest,
      rho_prime=(1 - draw.numbers["threshold"]) / 2,
      margin=draw.numbers["margin"],
      output_margin=draw.numbers["out_margin"], mode=draw.mode,
      draws=draw.draws, seed=draw.seed,
      k_formula=(separation.k_jl if math.isfinite(separation.k_jl) else -1),
      seconds=time.time() - started, jl_fallback=fallback)


@dataclasses.dataclass(frozen=True)
class _Separation:
  """The separation of the points on the sphere, and the widths it asks for."""
  zz_max: float  # max over i != j of <z_i, z_j>
  rho: float  # min over i != j of ||z_i - z_j||
  closest: tuple  # the input indices of a pair rho apart
  k_jl: float  # `jl_width` (inf when the points coincide)
  k: int  # the lossless width, `lossless_width`


def _measure_separation(z, x, y, distinct, log):
  """rho of the sphere images Z of the inputs X[DISTINCT]; ValueError if it is
  below `smallest_separation(k)` (naming the two inputs and their labels Y)."""
  n, dim = z.shape
  log("measuring the separation rho on the unit sphere")
  zz_max, (i, j) = max_inner_product(z, log)
  rho = math.sqrt(max(0.0, 2 - 2 * zz_max)) if n > 1 else 2.0
  closest = (int(distinct[i]), int(distinct[j]))
  k = lossless_width(n, dim)
  if n > 1 and rho < smallest_separation(k):
    a, b = sorted(closest)
    raise errors.ConfigError(
        f"inputs {a} and {b} (labels {y[a]} and {y[b]}) are {rho:.3g} apart "
        f"on the unit sphere (input distance "
        f"{np.linalg.norm(x[a] - x[b]):.3g}), below the smallest separation "
        f"this float64 construction handles at width k = {k} "
        f"({smallest_separation(k):.2g}); merge or remove near-duplicate "
        f"inputs")
  k_jl = jl_width(n, rho)
  log(f"rho = {rho:.4g}; lossless k = {k}; the Johnson-Lindenstrauss width "
      f"would be {k_jl}")
  return _Separation(zz_max, rho, closest, k_jl, k)


@dataclasses.dataclass(frozen=True)
class _Draw:
  """A projection draw that keeps Lemma B.1's hypothesis."""
  a0: np.ndarray  # (k, d + 1)
  q: np.ndarray  # (r, k) unit surrogates
  mode: str
  alpha: np.ndarray  # the projected points z A0^T
  numbers: dict  # `_lemma_check`'s
  draws: int  # draws tried, this one included
  seed: tuple

  @property
  def k(self):
    return self.a0.shape[0]


def _try_johnson_lindenstrauss(z, labels, r, separation, seed, log):
  """(a kept Gaussian draw to k = `jl_width`, None, draws tried), or (None,
  why not, draws tried).

  DRAWS_PER_WIDTH draws (numpy seeds (SEED, MAX_DRAWS + i)), each checked
  on the projected points themselves: their exact largest inner product and
  smallest norm (`_lemma_check`). Why not: the width is no narrower than the
  lossless one, or every draw lost the separation (clustered data).
  """
  k, lossless = separation.k_jl, separation.k
  if k >= lossless:
    why = (f"Johnson-Lindenstrauss: k = {k} for rho = {separation.rho:.3g} is "
           f"no narrower than the lossless k = {lossless}; using the "
           f"unprojected construction")
    log(why)
    return None, why, 0
  for draw in range(DRAWS_PER_WIDTH):
    draw_seed = (int(seed), MAX_DRAWS + draw)
    rng = np.random.default_rng(draw_seed)
    a0, q, mode = draw_projection(rng, k, z.shape[1], r)
    alpha = z @ a0.T
    log(f"Johnson-Lindenstrauss draw {draw + 1}: measuring the separation "
        f"after projecting to R^{k}")
    pp_max = max_inner_product(alpha, log)[0]
    ok, _, numbers = _lemma_check(alpha, q, labels, pp_max, k)
    if ok:
      return (_Draw(a0, q, mode, alpha, numbers, draw + 1, draw_seed), None,
              draw + 1)
  why = (f"Johnson-Lindenstrauss: the projection to k = {k} lost the "
         f"separation in {DRAWS_PER_WIDTH} draws (Lemma B.1 needs every "
         f"squared norm above every inner product with another point or a "
         f"surrogate; last draw: smallest squared norm {numbers['a']:.3g}, "
         f"largest inner product {pp_max:.3g}, with a surrogate "
         f"{numbers['pq_max']:.3g}; unprojected: 1 and "
         f"{separation.zz_max:.3g}); falling back to the unprojected "
         f"construction (k = {lossless})")
  log(why)
  return None, why, DRAWS_PER_WIDTH


def _lossless_draw(rng, z, k, r):
  """A0 (an isometry on the rows of Z) and surrogates for one draw at width K.

  k >= d + 1: the orthonormalised Gaussian, an isometry of all of R^(d+1);
  k < d + 1: `span_isometry`, whose exact inner products are measured.
  """
  dim = z.shape[1]
  if k >= dim:
    a0, q, _ = draw_projection(rng, k, dim, r)
    return a0, q, "isometry"
  return span_isometry(z, k), _surrogates(rng, r, k), "span"


def _draw_keeping_the_lemma(z, labels, r, separation, seed, log, tried=0):
  """The first lossless draw for which `_lemma_check` holds.

  Only the surrogates can spoil it (the points keep their inner products):
  draw i uses numpy seed (SEED, i); after DRAWS_PER_WIDTH spoiled draws at
  one k, k doubles (up to d + 1, then grows by d + 1), which gives the
  surrogates room away from the data. ValueError after MAX_DRAWS. TRIED:
  draws already spent (on the Johnson-Lindenstrauss option), for the count.
  """
  dim, k = z.shape[1], separation.k
  reasons = []
  for draw in range(MAX_DRAWS):
    draw_seed = (int(seed), draw)
    a0, q, mode = _lossless_draw(np.random.default_rng(draw_seed), z, k, r)
    alpha = z @ a0.T
    if mode == "isometry":
      # Inner products are preserved up to rounding.
      pp_max = separation.zz_max + 4 * (k + 2) * UNIT_ROUNDOFF
    else:
      pp_max = max_inner_product(alpha)[0]
    ok, reason, numbers = _lemma_check(alpha, q, labels, pp_max, k)
    if ok:
      return _Draw(a0, q, mode, alpha, numbers, tried + draw + 1, draw_seed)
    reasons.append(f"k={k}: {reason}")
    log(f"draw {draw + 1} (k = {k}, seed {draw_seed}) spoils the separation: "
        f"{reason}; redrawing")
    if (draw + 1) % DRAWS_PER_WIDTH == 0:
      k = min(2 * k, dim) if k < dim else k + dim
  raise errors.ConfigError(
      f"no projection out of {MAX_DRAWS} draws kept the separation "
      f"(rho = {separation.rho:.3g}; last: {reasons[-1]}); the inputs are too "
      f"close for float64")


def _network_weights(mu, s, t, draw, labels, log):
  """The weights of Theorem 3.2's network for the kept DRAW (see `evaluate`).

  Unit j owns the distinct points j k .. (j + 1) k - 1 (Lemma B.1).
  """
  k, n, r = draw.k, len(labels), len(draw.q)
  threshold = draw.numbers["threshold"]
  num_units = -(-n // k)
  log(f"k = {k} ({draw.mode}), rho' = {(1 - threshold) / 2:.4g}, lemma margin "
      f"{draw.numbers['margin']:.3g}; building {num_units} residual units")
  u_all = np.empty((num_units, k, k))
  v_all = np.empty((num_units, k, k))
  b_all = np.empty((num_units, k))
  for unit in range(num_units):
    own = slice(unit * k, (unit + 1) * k)
    u_all[unit], v_all[unit], b_all[unit] = lemma_unit(
        draw.alpha[own], draw.q[labels[own]], threshold, k)
  # Final layer: relu(<q_j, h> - (1 + max_{i != j} <q_i, q_j>) / 2), scaled
  # so that h = q_j gives exactly the one-hot logits of class j.
  return dict(
      mu=mu, s=np.float64(s), t=np.float64(t), A0=draw.a0, U=u_all, V=v_all,
      b=b_all, U_out=draw.q.copy(),
      b_out=np.full(r, -draw.numbers["out_threshold"]),
      V_out=np.eye(r) / draw.numbers["out_margin"])


# ------------------------------------------------------------ evaluation


def embed(weights, x):
  """h_0 = A0 z: the first layer of the network (Assumption 3.1 + JL step)."""
  z = to_sphere(np.asarray(x, np.float64), weights["mu"], float(weights["s"]),
                float(weights["t"]))
  return z @ weights["A0"].T


def residual_stack(weights, h, log=None):
  """h -> h + V_j relu(U_j h + b_j) for j = 0..L-1, on rows of H (Lemma B.1).

  The float64 network, evaluated in chunks of CHUNK points spread over every
  core (`parallel`; memory O(k CHUNK) per core). Pre-activations are first
  formed in float32; an entry whose float32 value is below minus the float32
  and float64 error bounds is certainly negative in float64 too, so its ReLU
  is exactly 0 and the point is unchanged (h + V 0 = h). Only points with
  some entry above that bound are recomputed in float64 and updated with V_j.
  The result is the float64 dense formula for every point. Each chunk is
  computed alone, so the result does not depend on the number of cores.
  """
  u_all, v_all, b_all = weights["U"], weights["V"], weights["b"]
  k = u_all.shape[1]
  # [U_j | b_j] acting on [h; 1]: the bias inside the matrix product.
  ub = np.concatenate([u_all, b_all[:, :, None]], axis=2)
  # Per unit: the largest row norm of [U_j | b_j] times the error per unit.
  row_norms = np.sqrt(np.einsum("jik,jik->ji", ub, ub)).max(axis=1)
  bounds = row_norms * (_float32_error(k + 1) +
                        1.01 * (k + 3) * UNIT_ROUNDOFF)
  h = np.asarray(h, np.float64)
  out = np.empty_like(h)
  ub_single = ub.astype(np.float32)

  def run(start):
    out[start:start + CHUNK] = _chunk_through_units(
        h[start:start + CHUNK], ub, ub_single, v_all, bounds)

  parallel.map_with_progress(
      run, range(0, len(h), CHUNK), log,
      lambda done, total: f"  evaluated {done}/{total} points",
      size=lambda start: min(CHUNK, len(h) - start))
  return out


def _chunk_through_units(h, ub, ub_single, v_all, bounds):
  """The rows of H after every residual unit; see `residual_stack`."""
  k = h.shape[1]
  columns = np.ones((k + 1, len(h)))
  columns[:k] = h.T
  single = columns.astype(np.float32)
  # ||[h; 1]|| of the largest point in the chunk, updated as points move.
  scale = float(np.sqrt(np.einsum("ij,ij->j", columns, columns).max()))
  for unit in range(ub.shape[0]):
    pre = ub_single[unit] @ single
    flagged = np.flatnonzero(pre.max(axis=0) > -bounds[unit] * scale)
    if flagged.size:
      exact = ub[unit] @ columns[:, flagged]
      relu = np.maximum(exact, 0)
      moved = flagged[relu.max(axis=0) > 0]
      if moved.size:
        relu = relu[:, relu.max(axis=0) > 0]
        columns[:k, moved] += v_all[unit] @ relu
        single[:, moved] = columns[:, moved]
        scale = max(scale, float(np.sqrt(np.einsum(
            "ij,ij->j", columns[:, moved], columns[:, moved]).max())))
  return columns[:k].T


def readout(weights, h):
  """logits = V_out relu(U_out h + b_out), on rows of H."""
  hidden = np.maximum(h @ weights["U_out"].T + weights["b_out"], 0)
  return hidden @ weights["V_out"].T


def evaluate(weights, x, log=None):
  """The logits of the network encoded by WEIGHTS on the rows of X.

  z = concat((x - mu)/s, [t]) / norm; h = A0 z; h = h + V[j] relu(U[j] h +
  b[j]) for j = 0..L-1; logits = V_out relu(U_out h + b_out).
  """
  return readout(weights, residual_stack(weights, embed(weights, x), log))


def accuracy(weights, x, y, log=None):
  """The fraction of rows of X whose argmax logit is Y."""
  return float(np.mean(np.argmax(evaluate(weights, x, log), axis=1) == y))


def save_weights(weights, path):
  np.savez(path, **weights)


def load_weights(path):
  with np.load(path) as data:
    return {key: data[key] for key in data.files}
