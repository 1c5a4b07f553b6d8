"""Section 2 of Hardt & Ma (2017), linear residual networks, in tf.linalg.

Setting (Section 2): y = R x + xi with xi ~ N(0, I_d) independent of x,
Sigma = E[x x^T], and the model y_hat = (I + A_l) ... (I + A_1) x. Layers are
stored as one float64 tensor A of shape (l, d, d) with A[0] = A_1, the layer
applied first. |||A||| = max_i ||A_i|| (spectral norm).

* `risk`, `monte_carlo_risk`      -- Claim 2.3 (closed form) and a sample check.
* `risk_gradient`, `tape_gradient` -- Lemma 2.4 with prefix/suffix products,
                                     O(l d^3), and the autodiff reference.
* `factorize`                     -- Theorem 2.1: A with product R and small
                                     |||A|||; `orthogonal_log` is its real
                                     Schur step (not in tf.linalg).
* `gradient_bound`, `pl_constant` -- Theorem 2.2 / inequality (2.3).
* `gradient_descent`              -- descent from A = 0, and the plain
                                     parametrisation W_l ... W_1;
                                     `descent_rate_bound`, the rate (2.3)
                                     implies for it.
* `run_checks`                    -- every statement above on one instance.

(Section 3's network that fits n points is `construction.construct`; this
module's Theorem 2.1 map is a factorization of R, hence `factorize`.)

Everything is float64 and goes through tf.linalg. NumPy appears only for
host-side bookkeeping on a few scalars (a split point among d eigenvalues, the
O(l) search for the layer split, run lengths), for random instances, and I/O.
"""

import dataclasses
import math
import time

import numpy as np
import tensorflow as tf

from identity_tf import errors

DTYPE = tf.float64
NOISE_VARIANCE = 1.0  # xi ~ N(0, I_d): E||xi||^2 = d, the constant C of Claim 2.3.


# ----------------------------------------------------------------------------
# Input handling.

def _tensor(x):
  if isinstance(x, (tf.Tensor, tf.Variable)):
    return tf.cast(x, DTYPE)
  return tf.constant(np.asarray(x, dtype=np.float64))


def check_matrix(matrix, name="R"):
  """MATRIX as a float64 d x d tensor; ValueError if not square or not finite."""
  try:
    matrix = _tensor(matrix)
  except (TypeError, ValueError) as e:
    raise errors.ConfigError(
        f"{name} must be a real d x d matrix: {e}") from None
  if matrix.shape.rank != 2 or matrix.shape[0] != matrix.shape[1]:
    raise errors.ConfigError(f"{name} must be a square d x d matrix, got shape "
                             f"{tuple(matrix.shape)}")
  if matrix.shape[0] == 0:
    raise errors.ConfigError(f"{name} must be at least 1 x 1, got shape (0, 0)")
  if not bool(tf.reduce_all(tf.math.is_finite(matrix))):
    raise errors.ConfigError(
        f"{name} has non-finite entries (NaN or inf); give a "
        f"matrix of finite numbers")
  return matrix


def check_layers(a):
  """A as a float64 (l, d, d) tensor with l >= 1; ValueError otherwise."""
  a = _tensor(a)
  if a.shape.rank != 3 or a.shape[1] != a.shape[2] or a.shape[0] == 0:
    raise errors.ConfigError(
        f"layers A must have shape (l, d, d) with l >= 1, got "
        f"{tuple(a.shape)}")
  if not bool(tf.reduce_all(tf.math.is_finite(a))):
    raise errors.ConfigError("layers A have non-finite entries (NaN or inf)")
  return a


def check_covariance(sigma, d):
  sigma = check_matrix(sigma, "Sigma")
  if sigma.shape[0] != d:
    raise errors.ConfigError(
        f"Sigma must be {d} x {d} like R, got {tuple(sigma.shape)}")
  if float(tf.reduce_max(tf.abs(sigma - tf.transpose(sigma)))) > 1e-10 * (
      1.0 + float(tf.reduce_max(tf.abs(sigma)))):
    raise errors.ConfigError("Sigma must be symmetric (it is E[x x^T])")
  if float(tf.reduce_min(tf.linalg.eigvalsh(sigma))) < 0:
    raise errors.ConfigError(
        "Sigma must be positive semi-definite (it is E[x x^T])")
  return sigma


# ----------------------------------------------------------------------------
# Products, norms and the risk (Claim 2.3).

def symmetric_sqrt(sigma):
  """Sigma^{1/2} of a symmetric positive semi-definite matrix (via eigh)."""
  values, vectors = tf.linalg.eigh(sigma)
  roots = tf.sqrt(tf.maximum(values, 0.0))
  return tf.matmul(vectors * roots, vectors, transpose_b=True)


def _runs(a):
  """(start, length) of each run of identical consecutive layers of A."""
  if a.shape[0] == 1:
    return [(0, 1)]
  same = tf.reduce_all(tf.equal(a[1:], a[:-1]), axis=[1, 2]).numpy()
  starts = [0] + [i + 1 for i in np.flatnonzero(~same)]
  ends = starts[1:] + [a.shape[0]]
  return [(s, e - s) for s, e in zip(starts, ends)]


def _power(matrix, exponent):
  """MATRIX^EXPONENT (exponent >= 1) by repeated squaring."""
  result = None
  base = matrix
  while exponent:
    if exponent & 1:
      result = base if result is None else tf.matmul(base, result)
    exponent >>= 1
    if exponent:
      base = tf.matmul(base, base)
  return result


def _ordered_product(factors):
  """F_n ... F_1 for factors (n, d, d) with F_1 = factors[0], as a tree."""
  while factors.shape[0] > 1:
    n = factors.shape[0]
    half = n // 2
    paired = tf.matmul(factors[1:2 * half:2], factors[0:2 * half:2])
    factors = tf.concat([paired, factors[2 * half:]], axis=0)
  return factors[0]


def product(a):
  """(I + A_l) ... (I + A_1): the end-to-end map of the linear residual net.

  A balanced tree of batched matmuls; a run of k identical consecutive layers
  (the form `factorize` returns) is raised to the k-th power by squaring, so
  the product of a factorization costs O(d^3 log l).
  """
  a = check_layers(a)
  eye = tf.eye(a.shape[-1], dtype=DTYPE)
  powers = [_power(eye + a[start], length) for start, length in _runs(a)]
  return _ordered_product(tf.stack(powers))


def layer_norms(a):
  """||A_i|| (spectral) for every layer; one SVD per run of equal layers."""
  a = check_layers(a)
  runs = _runs(a)
  distinct = tf.stack([a[start] for start, _ in runs])
  norms = tf.linalg.svd(distinct, compute_uv=False)[:, 0]
  lengths = tf.constant([length for _, length in runs])
  return tf.repeat(norms, lengths)


def max_layer_norm(a):
  """|||A||| = max_i ||A_i||."""
  return float(tf.reduce_max(layer_norms(a)))


def optimal_risk(d):
  """f_opt = E||xi||^2 = d: the risk of the exact fit (I + A_l)...(I + A_1) = R."""
  return NOISE_VARIANCE * d


def risk(a, r, sigma):
  """Population risk f(A) = E||y - y_hat||^2 in closed form (Claim 2.3).

  f(A) = ||((I + A_l)...(I + A_1) - R) Sigma^{1/2}||_F^2 + C with C = E||xi||^2
  = d for xi ~ N(0, I_d); so f_opt = d.
  """
  r = check_matrix(r)
  sigma = check_covariance(sigma, r.shape[0])
  error = product(a) - r
  return float(tf.reduce_sum(tf.square(tf.matmul(error, symmetric_sqrt(sigma))))
               + optimal_risk(r.shape[0]))


def monte_carlo_risk(a, r, sigma, samples=100_000, seed=0):
  """Sample estimate of E||y - y_hat||^2 with x ~ N(0, Sigma), xi ~ N(0, I).

  The sample check of Claim 2.3. Returns (mean, standard error of the mean).
  """
  r = check_matrix(r)
  d = r.shape[0]
  sigma = check_covariance(sigma, d)
  model = product(a)
  z = tf.random.stateless_normal([samples, d], seed=[seed, 0], dtype=DTYPE)
  noise = tf.random.stateless_normal([samples, d], seed=[seed, 1], dtype=DTYPE)
  x = tf.matmul(z, symmetric_sqrt(sigma))
  y = tf.matmul(x, r, transpose_b=True) + noise
  y_hat = tf.matmul(x, model, transpose_b=True)
  losses = tf.reduce_sum(tf.square(y - y_hat), axis=1)
  mean = float(tf.reduce_mean(losses))
  stderr = float(tf.math.reduce_std(losses)) / math.sqrt(samples)
  return mean, stderr


# ----------------------------------------------------------------------------
# The gradient (Lemma 2.4).

@tf.function(reduce_retracing=True)
def _excess_risk_and_gradient(a, r, sigma):
  """(f(A) - f_opt, grad f(A)): Claim 2.3's excess risk and Lemma 2.4.

  f - f_opt = ||E Sigma^{1/2}||_F^2 = tr(E Sigma E^T) with E = (I + A_l)...
  (I + A_1) - R is summed from E itself, not taken as f - d: a difference
  with d rounds every gap below ~d eps to 0, and descent goes far below it.
  """
  eye = tf.eye(tf.shape(a)[-1], dtype=DTYPE)
  factors = eye + a
  # prefix[j] = M_{j+1} ... M_1 and suffix[j] = M_l ... M_{j+1} (1-based M).
  prefix = tf.scan(lambda acc, m: tf.matmul(m, acc), factors, initializer=eye)
  suffix = tf.scan(lambda acc, m: tf.matmul(acc, m), factors, initializer=eye,
                   reverse=True)
  before = tf.concat([eye[None], prefix[:-1]], axis=0)  # (I+A_{i-1})...(I+A_1)
  after = tf.concat([suffix[1:], eye[None]], axis=0)    # (I+A_l)...(I+A_{i+1})
  error = prefix[-1] - r
  error_sigma = tf.matmul(error, sigma)
  gradient = 2.0 * tf.matmul(tf.matmul(after, error_sigma, transpose_a=True),
                             before, transpose_b=True)
  return tf.reduce_sum(error_sigma * error), gradient


def risk_and_gradient(a, r, sigma):
  """(f(A), grad f(A)) with the gradient of Lemma 2.4 for every layer at once.

  d f / d A_i = 2 (I + A_l^T)...(I + A_{i+1}^T) E Sigma (I + A_{i-1}^T)...(I + A_1^T)
  with E = (I + A_l)...(I + A_1) - R. The left and right products for all i
  come from one forward and one backward scan: O(l d^3) time, O(l d^2) memory.
  """
  a = check_layers(a)
  r = check_matrix(r)
  sigma = check_covariance(sigma, r.shape[0])
  if a.shape[-1] != r.shape[0]:
    raise errors.ConfigError(
        f"layers are {a.shape[-1]} x {a.shape[-1]} but R is "
        f"{r.shape[0]} x {r.shape[0]}")
  excess, gradient = _excess_risk_and_gradient(a, r, sigma)
  return float(excess) + optimal_risk(r.shape[0]), gradient


def risk_gradient(a, r, sigma):
  """grad f(A) of Lemma 2.4, shape (l, d, d); see `risk_and_gradient`."""
  return risk_and_gradient(a, r, sigma)[1]


def tape_gradient(a, r, sigma):
  """grad f(A) by tf.GradientTape through a sequential product (the reference)."""
  a = check_layers(a)
  r = check_matrix(r)
  root = symmetric_sqrt(check_covariance(sigma, r.shape[0]))
  eye = tf.eye(r.shape[0], dtype=DTYPE)
  with tf.GradientTape() as tape:
    tape.watch(a)
    model = tf.foldl(lambda acc, layer: tf.matmul(eye + layer, acc), a,
                     initializer=eye)
    value = tf.reduce_sum(tf.square(tf.matmul(model - r, root)))
  return tape.gradient(value, a)


# ----------------------------------------------------------------------------
# Theorem 2.1: the factorization.

def gamma(r):
  """gamma = max(|log sigma_max(R)|, |log sigma_min(R)|) (Theorem 2.1)."""
  singular = tf.linalg.svd(check_matrix(r), compute_uv=False)
  if float(singular[-1]) <= 0:
    return math.inf
  return max(abs(math.log(float(singular[0]))),
             abs(math.log(float(singular[-1]))))


def smallest_admissible_layers(gamma_value):
  """The least l >= 1 with l >= 3 gamma (Theorem 2.1's hypothesis)."""
  return max(1, math.ceil(3.0 * gamma_value - 1e-12))


def iclr_bound(gamma_value, layers):
  """|||A||| <= 2 (sqrt(pi) + sqrt(3 gamma))^2 / l: Theorem 2.1, ICLR text."""
  return 2.0 * (math.sqrt(math.pi) + math.sqrt(3.0 * gamma_value)) ** 2 / layers


def additive_bound(gamma_value, layers):
  """|||A||| <= (4 pi + 3 gamma) / l: the additive form of Theorem 2.1's bound.

  Neither it nor `iclr_bound`'s form implies the other (docs/linear_theory.md);
  `factorize` meets both.
  """
  return (4.0 * math.pi + 3.0 * gamma_value) / layers


def _theta_over_sin(c):
  """g(c) = arccos(c) / sqrt(1 - c^2) for c in (-1, 1], with g(1) = 1.

  On a rotation plane with angle theta, Sym = cos(theta) and Skew = sin(theta)
  J, so g(Sym) Skew = theta J is the logarithm. Accurate wherever c is not
  near -1 (callers keep c >= -0.9).
  """
  c = tf.clip_by_value(c, -1.0, 1.0)
  u = 1.0 - c
  safe_u = tf.maximum(u, 1e-300)
  direct = tf.acos(c) / tf.sqrt(safe_u * (1.0 + c))
  series = 1.0 + u / 3.0 + 2.0 * u * u / 15.0  # error O(u^3)
  return tf.where(u < 1e-6, series, direct)


def _log_away_from_minus_one(o):
  """Real logarithm of an orthogonal O whose rotation angles are all < ~2.7.

  log O = g((O + O^T)/2) (O - O^T)/2 with g(cos t) = t / sin t: a function of
  the symmetric part by eigh, so repeated and clustered angles need no
  eigenvector bookkeeping.
  """
  symmetric = 0.5 * (o + tf.transpose(o))
  skew = 0.5 * (o - tf.transpose(o))
  c, q = tf.linalg.eigh(symmetric)
  g_of_sym = tf.matmul(q * _theta_over_sin(c), q, transpose_b=True)
  log = tf.matmul(g_of_sym, skew)
  return 0.5 * (log - tf.transpose(log))


def _complex_structure(log_w):
  """A real J, J^T = -J, J^2 = -I, commuting with the skew matrix LOG_W.

  On LOG_W's range J = -(polar factor of LOG_W), so that on each plane where
  LOG_W rotates by +phi, pi J + LOG_W rotates by -(pi - phi): the principal
  angle. On the (numerical) kernel any complex structure commutes with
  LOG_W ~ 0; we pair up an orthonormal basis. A few Newton steps
  J <- (J - J^{-1}) / 2 make J exactly a complex structure again.
  """
  n = log_w.shape[0]
  singular, u, v = tf.linalg.svd(log_w)
  rank = int(tf.reduce_sum(tf.cast(singular > 1e-14, tf.int32)))
  rank -= rank % 2  # singular values of a skew matrix come in pairs
  j = -tf.matmul(u[:, :rank], v[:, :rank], transpose_b=True)
  kernel = u[:, rank:]
  if n - rank:
    first, second = kernel[:, 0::2], kernel[:, 1::2]
    j += (tf.matmul(second, first, transpose_b=True)
          - tf.matmul(first, second, transpose_b=True))
  j = 0.5 * (j - tf.transpose(j))
  for _ in range(3):
    j = 0.5 * (j - tf.linalg.inv(j))
    j = 0.5 * (j - tf.transpose(j))
  return j


def _split_point(cosines, low=-0.9, high=-0.1):
  """A threshold in [LOW, HIGH] as far as possible from every cosine.

  Host-side bookkeeping on d numbers. Conjugate rotation pairs share their
  cosine, so a threshold in a gap never separates a pair.
  """
  inside = sorted(c for c in cosines if low < c < high)
  points = [low] + inside + [high]
  gaps = [(b - a, 0.5 * (a + b)) for a, b in zip(points[:-1], points[1:])]
  return max(gaps)[1]


def orthogonal_log(o):
  """Real skew L with expm(L) = O and ||L|| <= pi, for orthogonal O, det O > 0.

  The real Schur form O = Q diag(rotations by theta_j) Q^T written as a
  logarithm L = Q diag(theta_j J_2) Q^T (real Schur is not in tf.linalg). The
  symmetric part (O + O^T)/2 = Q diag(cos theta_j) Q^T (eigh) splits R^d into
  E+ (angles below ~2.7) and E- (angles near pi: cos theta < t, t in a gap of
  the spectrum in [-0.9, -0.1]). On E+, `_log_away_from_minus_one`. On E-,
  W = -O|E- has small angles, log O|E- = pi J + log W with J a complex
  structure commuting with log W (`_complex_structure`): this handles angles
  of exactly pi (eigenvalue -1 of any even multiplicity), near pi, and
  repeated angles. Conjugate pairs never need matching: only functions of
  symmetric matrices are taken.
  """
  o = check_matrix(o, "O")
  d = o.shape[0]
  defect = float(tf.reduce_max(tf.abs(
      tf.matmul(o, o, transpose_a=True) - tf.eye(d, dtype=DTYPE))))
  if defect > 1e-8:
    raise errors.ConfigError(
        f"O is not orthogonal: max|O^T O - I| = {defect:.3g}")
  if float(tf.linalg.det(o)) <= 0:
    raise errors.ConfigError(
        "O has det -1: it has no real logarithm (det expm(L) = "
        "exp(trace L) = 1 for skew L)")
  cosines, q = tf.linalg.eigh(0.5 * (o + tf.transpose(o)))
  threshold = _split_point(cosines.numpy().tolist())
  near_pi = int(tf.reduce_sum(tf.cast(cosines < threshold, tf.int32)))
  log = tf.zeros([d, d], dtype=DTYPE)
  if near_pi < d:
    basis = q[:, near_pi:]
    part = _log_away_from_minus_one(tf.matmul(basis, tf.matmul(o, basis),
                                              transpose_a=True))
    log += tf.matmul(basis, tf.matmul(part, basis, transpose_b=True))
  if near_pi:
    if near_pi % 2:
      raise errors.ConfigError(
          "O has an odd number of rotation angles near pi; it is "
          "not orthogonal with det +1 to working precision")
    basis = q[:, :near_pi]
    w = -tf.matmul(basis, tf.matmul(o, basis), transpose_a=True)
    log_w = _log_away_from_minus_one(w)
    part = math.pi * _complex_structure(log_w) + log_w
    log += tf.matmul(basis, tf.matmul(part, basis, transpose_b=True))
  return 0.5 * (log - tf.transpose(log))


def _split_layers(layers, angle, singular):
  """(rotation layers, scaling layers) minimising the larger layer norm.

  A rotation by ANGLE split into k equal parts gives ||G - I|| = 2 sin(angle /
  2k); singular values s split into k-th roots give max|s^(1/k) - 1|. We try
  every split of LAYERS (O(l) scalar work) and keep the best.
  """
  rotation_needed = angle > 1e-15
  log_s = np.log(singular)
  scaling_needed = np.max(np.abs(log_s)) > 1e-15
  best = None
  for k_rot in range(layers + 1):
    k_scale = layers - k_rot
    if (rotation_needed and k_rot == 0) or (scaling_needed and k_scale == 0):
      continue
    rot = 2.0 * math.sin(min(angle / (2 * k_rot), math.pi / 2)) if k_rot else 0.0
    scale = float(np.max(np.abs(np.expm1(log_s / k_scale)))) if k_scale else 0.0
    candidate = (max(rot, scale), k_rot, k_scale)
    if best is None or candidate < best:
      best = candidate
  return best[1], best[2]


def _check_layer_count(layers):
  """LAYERS as an int; ValueError unless it is an integer >= 1."""
  try:
    valid = (not isinstance(layers, bool) and int(layers) == layers
             and layers >= 1)
  except (TypeError, ValueError, OverflowError):
    valid = False
  if not valid:
    raise errors.ConfigError(
        f"the number of layers must be an integer >= 1, got "
        f"{layers!r}")
  return int(layers)


def check_invertible(singular):
  """ValueError unless R, with singular values SINGULAR (decreasing), is
  invertible to working precision.

  sigma_min(R) <= d eps sigma_max(R) is the usual numerical-rank test: such
  an R is within rounding of a singular matrix, so its determinant's sign and
  gamma = |log sigma_min| are round-off. Every product (I + A_l)...(I + A_1)
  with ||A_i|| < 1 is invertible with det > 0 (Theorem 2.1's hypotheses), so
  none equals a singular R and factorizing it means nothing.
  """
  singular = np.asarray(singular, np.float64)
  tolerance = singular.size * np.finfo(np.float64).eps * singular[0]
  if singular[-1] <= tolerance:
    raise errors.ConfigError(
        f"R is singular to working precision: sigma_min(R) = "
        f"{singular[-1]:.3g} <= d eps sigma_max(R) = {tolerance:.3g} (its "
        f"rank is below d = {singular.size} up to rounding), and a product "
        f"(I + A_l)...(I + A_1) with every ||A_i|| < 1 is invertible; give "
        f"a full-rank R with det R > 0")


def factorize(r, layers):
  """Theorem 2.1: A_1..A_l with (I + A_l)...(I + A_1) = R and |||A||| small.

  Needs det R > 0 and l >= 3 gamma. Route of the proof: the SVD R = U K V^T,
  here grouped as the polar decomposition R = O P with O = U V^T (orthogonal,
  det O = det R / det K > 0) and P = V K V^T. O's real Schur form has 2 x 2
  rotation blocks (a 1 x 1 block of +1 for odd d); each angle is split into
  k_rot equal parts: G = expm(log(O) / k_rot), ||G - I|| = 2 sin(theta_max /
  2 k_rot) <= pi / k_rot. The positive diagonal K is split into k_scale-th
  roots: D = V K^{1/k_scale} V^T. The first k_scale layers are D - I, the
  last k_rot are G - I; k_rot + k_scale = l is chosen to minimise |||A|||
  (`_split_layers`). With a single layer, A_1 = R - I.

  Returns A of shape (l, d, d), float64. Raises ValueError for an R that is
  singular to working precision (`check_invertible`), det R < 0, l < 3 gamma,
  or a non-square or non-finite R.
  """
  r = check_matrix(r)
  d = r.shape[0]
  layers = _check_layer_count(layers)
  singular, u, v = tf.linalg.svd(r)
  check_invertible(singular.numpy())
  sign, log_abs_det = tf.linalg.slogdet(r)
  if float(sign) < 0:
    det_text = (f"{-math.exp(float(log_abs_det)):.4g}"
                if float(log_abs_det) < 700
                else f"-exp({float(log_abs_det):.4g})")
    raise errors.ConfigError(
        f"det R = {det_text} <= 0: no factorisation (I + A_l)...(I + A_1) = R "
        f"with every ||A_i|| < 1 exists, since det(I + A) > 0 whenever "
        f"||A|| < 1; give an R with det R > 0 (e.g. R with the sign of one "
        f"row flipped)")
  gamma_value = max(abs(math.log(float(singular[0]))),
                    abs(math.log(float(singular[-1]))))
  smallest = smallest_admissible_layers(gamma_value)
  if layers < smallest:
    raise errors.ConfigError(
        f"l = {layers} layers are too few for this R (gamma = "
        f"{gamma_value:.4g}; Theorem 2.1 needs l >= 3 gamma); the smallest "
        f"admissible is {smallest}")
  if layers == 1:
    return (r - tf.eye(d, dtype=DTYPE))[None]
  rotation = tf.matmul(u, v, transpose_b=True)
  rotation_log = orthogonal_log(rotation)
  angle = float(tf.linalg.svd(rotation_log, compute_uv=False)[0]) if d > 1 else 0.0
  k_rot, k_scale = _split_layers(layers, angle, singular.numpy())
  eye = tf.eye(d, dtype=DTYPE)
  distinct, counts = [], []
  if k_scale:
    root = tf.exp(tf.math.log(singular) / k_scale)
    distinct.append(tf.matmul(v * root, v, transpose_b=True) - eye)
    counts.append(k_scale)
  if k_rot:
    distinct.append(tf.linalg.expm(rotation_log / k_rot) - eye)
    counts.append(k_rot)
  # One gather writes the (l, d, d) result once (tile + concat copied twice).
  which = tf.repeat(tf.range(len(distinct)), counts)
  return tf.gather(tf.stack(distinct), which)


def factorization_report(r, a):
  """The figures `factorize` is judged by: |||A|||, both bounds, residual."""
  r = check_matrix(r)
  gamma_value = gamma(r)
  layers = a.shape[0]
  residual = float(tf.norm(product(a) - r))
  return {
      "layers": layers,
      "d": r.shape[0],
      "gamma": gamma_value,
      "max_norm": max_layer_norm(a),
      "bound": iclr_bound(gamma_value, layers),
      "bound_additive": additive_bound(gamma_value, layers),
      "residual": residual,
  }


# ----------------------------------------------------------------------------
# Theorem 2.2 and inequality (2.3).

def gradient_bound(a, r, sigma, tau=None, sigma_power=1):
  """Both sides of (2.3): ||grad f(A)||_F^2 >= 4 l (1 - tau)^(2l-2) s (f - f_opt).

  s = sigma_min(Sigma)^SIGMA_POWER. The argument of Theorem 2.2 gives power 1:
  ||grad_i||_F = 2 ||S_i^T E Sigma P_{i-1}^T||_F >= 2 (1 - tau)^(l-1) ||E Sigma||_F
  and ||E Sigma||_F >= sigma_min(Sigma)^{1/2} ||E Sigma^{1/2}||_F =
  sigma_min(Sigma)^{1/2} (f - f_opt)^{1/2}. The squared form, power 2, is weaker when
  sigma_min(Sigma) <= 1 and false in general when it exceeds 1 (equality case:
  A = 0, Sigma = s I, power 1). TAU defaults to |||A||| and must be < 1.

  Returns {"lhs", "rhs", "tau", "sigma_min", "holds"}.
  """
  a = check_layers(a)
  r = check_matrix(r)
  sigma = check_covariance(sigma, r.shape[0])
  norm = max_layer_norm(a)
  tau = norm if tau is None else float(tau)
  if not norm <= tau * (1 + 1e-12) + 1e-15 or not tau < 1:
    raise errors.ConfigError(
        f"Theorem 2.2 needs |||A||| <= tau < 1; got |||A||| = "
        f"{norm:.4g}, tau = {tau:.4g}")
  gap, gradient = _excess_risk_and_gradient(a, r, sigma)
  gap = float(gap)
  sigma_min = smallest_eigenvalue(sigma)
  lhs = float(tf.reduce_sum(tf.square(gradient)))
  rhs = pl_constant(a.shape[0], tau, sigma_min, sigma_power) * gap
  return {"lhs": lhs, "rhs": rhs, "tau": tau, "sigma_min": sigma_min,
          "holds": lhs >= rhs * (1.0 - 1e-9) - 1e-300}


def smallest_eigenvalue(sigma):
  """sigma_min(Sigma), the smallest eigenvalue of the symmetric SIGMA."""
  return float(tf.reduce_min(tf.linalg.eigvalsh(_tensor(sigma))))


def pl_constant(layers, tau, sigma_min, sigma_power=1):
  """mu = 4 l (1 - tau)^(2l-2) sigma_min(Sigma)^SIGMA_POWER, the constant of (2.3).

  (2.3) reads ||grad f(A)||_F^2 >= mu (f(A) - f_opt) on B_tau: a
  Polyak-Lojasiewicz inequality (Theorem 2.2). SIGMA_POWER: see
  `gradient_bound`.
  """
  return 4.0 * layers * (1.0 - tau) ** (2 * layers - 2) * sigma_min ** sigma_power


# ----------------------------------------------------------------------------
# Random instances.

def random_orthogonal(d, rng, det=1.0):
  q, upper = np.linalg.qr(rng.standard_normal((d, d)))
  q = q * np.sign(np.diag(upper))
  if np.linalg.det(q) * det < 0:
    q[:, 0] = -q[:, 0]
  return q


def random_target(d, rng, gamma_value=0.5):
  """R = U diag(s) V^T, det R > 0, log s uniform in [-gamma, gamma] (ends hit)."""
  log_s = rng.uniform(-gamma_value, gamma_value, d)
  log_s[0] = gamma_value
  if d > 1:
    log_s[-1] = -gamma_value
  return (random_orthogonal(d, rng) * np.exp(log_s)) @ random_orthogonal(d, rng).T


def random_covariance(d, rng, low, high):
  """Sigma = Q diag(lambda) Q^T with eigenvalues in [LOW, HIGH] (ends hit)."""
  values = rng.uniform(low, high, d)
  values[0] = low
  if d > 1:
    values[-1] = high
  q = random_orthogonal(d, rng)
  return (q * values) @ q.T


def random_layers(layers, d, rng, tau):
  """A_i random with ||A_i|| <= tau, and |||A||| = tau exactly."""
  a = rng.standard_normal((layers, d, d))
  norms = np.linalg.norm(a, ord=2, axis=(1, 2))
  scales = rng.uniform(0.0, tau, layers)
  scales[0] = tau
  return a * (scales / norms)[:, None, None]


def near_identity_target(d, rng, size=1.0):
  """R = expm(B) with B random, ||B|| = SIZE: reachable from A = 0 in B_tau."""
  b = rng.standard_normal((d, d))
  b *= size / np.linalg.norm(b, ord=2)
  return tf.linalg.expm(tf.constant(b)).numpy()


# ----------------------------------------------------------------------------
# Gradient descent.

@tf.function(reduce_retracing=True)
def _descent_step(a, r, sigma, step_size):
  excess, gradient = _excess_risk_and_gradient(a, r, sigma)
  norm = tf.reduce_max(tf.linalg.svd(a, compute_uv=False)[:, 0])
  return a - step_size * gradient, excess, norm


def default_step_size(r, sigma, layers):
  """1 / (2 l sigma_max(Sigma) max(1, ||R||)^2).

  Near A = 0 the risk depends on A mostly through sum_i A_i; its Hessian there
  is 2 l Sigma (x) I, so steps below 1 / (l sigma_max(Sigma)) are stable. The
  factor ||R||^2 covers the layer products along the way to the optimum.
  """
  sigma_max = float(tf.reduce_max(tf.linalg.eigvalsh(_tensor(sigma))))
  r_norm = float(tf.linalg.svd(_tensor(r), compute_uv=False)[0])
  return 1.0 / (2.0 * layers * sigma_max * max(1.0, r_norm) ** 2)


def gradient_descent(r, sigma, layers, steps, step_size=None, plain=False,
                     init_scale=0.01, seed=0, progress=None, tolerance=0.0):
  """Gradient descent on the population risk f (Claim 2.3, Lemma 2.4).

  Residual (PLAIN=False): the paper's parametrisation (I + A_l)...(I + A_1)
  from A = 0. Plain (PLAIN=True): W_l ... W_1 from W_i with i.i.d.
  N(0, (INIT_SCALE)^2 / d) entries, the parametrisation the paper argues
  against (its gradient vanishes near 0). Same risk, same gradient formula
  (W_i = I + A_i), same STEP_SIZE and number of steps.

  Stops early once f - f_opt <= TOLERANCE * (its initial value).

  Returns {"gap": f - f_opt before each step and after the last (steps + 1),
  "max_norm": |||A||| likewise (for plain: |||W - I|||), "step_size"}.
  """
  r = check_matrix(r)
  d = r.shape[0]
  sigma = check_covariance(sigma, d)
  if step_size is None:
    step_size = default_step_size(r, sigma, layers)
  if plain:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((layers, d, d)) * init_scale / math.sqrt(d)
    a = tf.constant(w) - tf.eye(d, dtype=DTYPE)[None]
  else:
    a = tf.zeros([layers, d, d], dtype=DTYPE)
  step = tf.constant(step_size, dtype=DTYPE)
  gaps, norms = [], []
  for t in range(steps + 1):
    new_a, excess, norm = _descent_step(a, r, sigma, step)
    gaps.append(float(excess))
    norms.append(float(norm))
    if tolerance > 0 and gaps[-1] <= tolerance * gaps[0]:
      break
    if t < steps:
      a = new_a
    if progress and t % max(1, steps // 10) == 0:
      progress(f"{'plain' if plain else 'residual'} step {t}/{steps}: "
               f"f - f_opt = {gaps[-1]:.3e}, "
               f"{'|||W - I|||' if plain else '|||A|||'} = {norms[-1]:.4f}")
  return {"gap": np.array(gaps), "max_norm": np.array(norms),
          "step_size": step_size, "layers": a}


def linear_rate(gaps, floor=1e-11):
  """Geometric-mean contraction per step of f - f_opt while above the floor."""
  gaps = np.asarray(gaps)
  above = np.flatnonzero(gaps > floor * gaps[0])
  last = int(above[-1]) if above.size else 0
  if last == 0:
    return 0.0
  return float((gaps[last] / gaps[0]) ** (1.0 / last))


def descent_rate_bound(step_size, layers, tau, sigma):
  """1 - STEP_SIZE mu / 2: the contraction per step of f - f_opt that (2.3) gives.

  mu = `pl_constant`(l, tau, sigma_min(Sigma)) with TAU the largest |||A|||
  along the run. For a step no larger than 1 / (the smoothness of f on
  B_tau), f_{t+1} <= f_t - (step / 2) ||grad f||_F^2, and (2.3) turns that into
  f_{t+1} - f_opt <= (1 - step mu / 2)(f_t - f_opt): an upper bound on the
  measured `linear_rate`.
  """
  mu = pl_constant(layers, tau, smallest_eigenvalue(sigma))
  return 1.0 - step_size * mu / 2.0


def plot_descent(residual, plain, path, title=""):
  """PNG: f - f_opt per step for both parametrisations, and |||A||| per step."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, (left, right) = pyplot.subplots(1, 2, figsize=(11, 4))
  # An exact fit has f - f_opt = 0, which a log axis cannot show: left out.
  for run, label in ((residual, "residual (I + A_l)...(I + A_1), A = 0"),
                     (plain, "plain W_l...W_1, small random init")):
    gap = np.asarray(run["gap"], np.float64)
    left.semilogy(np.arange(len(gap)), np.where(gap > 0, gap, np.nan),
                  label=label)
  left.set_xlabel("step")
  left.set_ylabel("f(A) - f_opt")
  left.legend()
  left.grid(True, which="both", alpha=0.3)
  right.plot(np.arange(len(residual["max_norm"])), residual["max_norm"])
  right.set_xlabel("step")
  right.set_ylabel("|||A||| = max_i ||A_i||")
  right.grid(True, alpha=0.3)
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


# ----------------------------------------------------------------------------
# All statements on one random instance.

@dataclasses.dataclass(frozen=True)
class _Instance:
  """What `run_checks` draws once and every statement shares."""
  d: int
  layers: int
  seed: int
  gamma: float
  r: np.ndarray
  sigma: np.ndarray
  a_small: np.ndarray  # |||A||| = 0.5 / l


def _draw_instance(d, layers, seed):
  rng = np.random.default_rng(seed)
  gamma_value = min(0.5, layers / 3.0)
  r = random_target(d, rng, gamma_value)
  sigma = random_covariance(d, rng, 0.5, 2.0)
  a_small = random_layers(layers, d, rng, 0.5 / layers)
  return _Instance(d, layers, seed, gamma_value, r, sigma, a_small)


def _relative_difference(x, y):
  return float(tf.norm(x - y) / tf.maximum(tf.norm(y), 1e-300))


def _check_claim_2_3(instance, samples):
  """The closed-form risk within 5 standard errors of a sample mean."""
  closed = risk(instance.a_small, instance.r, instance.sigma)
  mean, stderr = monte_carlo_risk(instance.a_small, instance.r, instance.sigma,
                                  samples, instance.seed)
  return {"pass": abs(closed - mean) <= 5 * stderr, "closed_form": closed,
          "monte_carlo": mean, "standard_error": stderr}


def _check_lemma_2_4(instance):
  """Lemma 2.4's gradient against the tape's."""
  rng = np.random.default_rng([instance.seed, 2])
  a = tf.constant(random_layers(instance.layers, instance.d, rng,
                                0.9 / instance.layers))
  error = _relative_difference(risk_gradient(a, instance.r, instance.sigma),
                               tape_gradient(a, instance.r, instance.sigma))
  return {"pass": error <= 1e-10, "relative_difference_to_tape": error}


def _check_theorem_2_1(instance):
  """A factorization of a fresh R: its residual, both bounds, f and grad f."""
  rng = np.random.default_rng([instance.seed, 3])
  target = random_target(instance.d, rng, instance.gamma)
  a = factorize(target, instance.layers)
  report = factorization_report(target, a)
  value, gradient = risk_and_gradient(a, target, instance.sigma)
  report["f_minus_f_opt"] = value - optimal_risk(instance.d)
  report["gradient_norm"] = float(tf.norm(gradient))
  report["pass"] = (
      report["residual"] <= 1e-9 * max(1.0, float(np.linalg.norm(target)))
      and report["max_norm"] <= min(report["bound"], report["bound_additive"]))
  return report


def _check_theorem_2_1_errors(instance):
  """det R <= 0 and l < 3 gamma are refused, each with a message."""
  rng = np.random.default_rng([instance.seed, 4])
  messages = {}
  flipped = instance.r.copy()
  flipped[0] = -flipped[0]
  for name, matrix, count in (
      ("det_nonpositive", flipped, instance.layers),
      ("too_few_layers", random_target(instance.d, rng, 2.0), 1)):
    try:
      factorize(matrix, count)
      messages[name] = None
    except ValueError as e:
      messages[name] = str(e)
  return {"pass": all(messages.values()), **messages}


def _check_bound_2_3(instance, sigma_power):
  """(2.3) on random A in B_tau, sigma_min(Sigma) below and above 1."""
  rng = np.random.default_rng([instance.seed, 5])
  d, layers = instance.d, instance.layers
  instances = []
  tau = 0.5 / layers
  for low, high in ((0.1, 0.8), (1.5, 4.0)):
    for _ in range(3):
      sigma_i = random_covariance(d, rng, low, high)
      a = random_layers(layers, d, rng, tau)
      instances.append(gradient_bound(a, instance.r, sigma_i, tau, sigma_power))
  # The equality case of the argument: A = 0, Sigma = 2 I.
  instances.append(gradient_bound(np.zeros((layers, d, d)), instance.r,
                                  2.0 * np.eye(d), 0.0, sigma_power))

  # Power 1 and the squared form's power 2 side by side: rhs_2 = rhs_1 sigma_min.
  def ratio(entry, power):
    rhs = entry["rhs"] * entry["sigma_min"] ** (power - sigma_power)
    return entry["lhs"] / rhs if rhs > 0 else math.inf

  return {"pass": all(i["holds"] for i in instances),
          "sigma_power": sigma_power,
          "instances": [{"sigma_min": i["sigma_min"],
                         "lhs_over_rhs_power_1": ratio(i, 1),
                         "lhs_over_rhs_power_2": ratio(i, 2),
                         "holds": i["holds"]} for i in instances]}


def _check_descent(instance):
  """Gradient descent from A = 0 converges linearly and stays in B_tau."""
  rng = np.random.default_rng([instance.seed, 6])
  target = near_identity_target(instance.d, rng, 1.0)
  sigma_d = random_covariance(instance.d, rng, 0.5, 2.0)
  steps = 2000
  run = gradient_descent(target, sigma_d, instance.layers, steps,
                         tolerance=1e-10)
  gaps = run["gap"]
  # Linear rate while above round-off: every step contracts, and the
  # geometric-mean contraction is < 1; the iterates stay in B_tau, tau < 1.
  live = gaps > 1e-10 * gaps[0]
  monotone = bool(np.all(gaps[1:][live[1:]] < gaps[:-1][live[1:]]))
  rate = linear_rate(gaps)
  tau = float(np.max(run["max_norm"]))
  return {"pass": monotone and rate < 1 and gaps[-1] <= 1e-8 * gaps[0]
                  and tau < 1,
          "initial_gap": float(gaps[0]), "final_gap": float(gaps[-1]),
          "rate_per_step": rate, "max_norm_over_run": tau,
          "step_size": run["step_size"], "steps": len(gaps) - 1}


def run_checks(d=8, layers=20, seed=0, sigma_power=1, samples=200_000,
               progress=None, only=None):
  """Every statement of Section 2 on random instances; {name: {"pass", ...}}.

  ONLY: names of the statements to run (default: all).

  SIGMA_POWER is the power of sigma_min(Sigma) checked in (2.3): 1, which the
  argument gives (see `gradient_bound`), or 2, the squared form (which the
  instances with sigma_min(Sigma) > 1 refute).
  """
  say = progress or (lambda message: None)
  instance = _draw_instance(d, layers, seed)
  statements = {
      "claim_2_3_risk_closed_form": lambda: _check_claim_2_3(instance,
                                                             samples),
      "lemma_2_4_gradient": lambda: _check_lemma_2_4(instance),
      "theorem_2_1_factorization": lambda: _check_theorem_2_1(instance),
      "theorem_2_1_bad_input": lambda: _check_theorem_2_1_errors(instance),
      "theorem_2_2_bound_2_3": lambda: _check_bound_2_3(instance, sigma_power),
      "gradient_descent_linear_rate": lambda: _check_descent(instance),
  }
  results = {}
  for name, check in statements.items():
    if only is not None and name not in only:
      continue
    start = time.perf_counter()
    entry = check()
    entry["seconds"] = round(time.perf_counter() - start, 3)
    results[name] = entry
    say(f"{name}: {'pass' if entry['pass'] else 'FAIL'}")
  return results
