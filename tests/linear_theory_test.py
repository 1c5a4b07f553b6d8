"""Tests for identity_tf.theory.linear, linear_run and bin/linear_theory.py (Section 2)."""

import json
import math
import os
import tempfile
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf.theory import linear as lt
import testing


def rotation(angle):
  return np.array([[math.cos(angle), -math.sin(angle)],
                   [math.sin(angle), math.cos(angle)]])


def block_diagonal(*blocks):
  size = sum(b.shape[0] for b in blocks)
  matrix = np.zeros((size, size))
  i = 0
  for b in blocks:
    matrix[i:i + b.shape[0], i:i + b.shape[0]] = b
    i += b.shape[0]
  return matrix


def sequential_product(a):
  d = a.shape[-1]
  result = np.eye(d)
  for layer in np.asarray(a):
    result = (np.eye(d) + layer) @ result
  return result


def theorem_2_1_bound(gamma, layers):
  """Theorem 2.1 of Hardt & Ma, "Identity Matters in Deep Learning" (ICLR
  2017), written out from the paper, not from linear.py: for R with
  gamma = max(|log sigma_max(R)|, |log sigma_min(R)|) and l >= 3 gamma there
  is a global optimum A of the population risk, R = (I + A_l)...(I + A_1),
  with |||A||| = max_i ||A_i|| <= 2 (sqrt(pi) + sqrt(3 gamma))^2 / l."""
  assert layers >= 3 * gamma - 1e-12, (layers, gamma)  # The hypothesis.
  return 2 * (math.sqrt(math.pi) + math.sqrt(3 * gamma)) ** 2 / layers


def theorem_2_1_gamma(r):
  """Theorem 2.1's gamma of R, from NumPy's singular values."""
  singular = np.linalg.svd(r, compute_uv=False)
  return max(abs(math.log(singular[0])), abs(math.log(singular[-1])))


def largest_layer_norm(a):
  """|||A||| = max_i ||A_i||, spectral norms by NumPy."""
  return float(np.max(np.linalg.norm(np.asarray(a), ord=2, axis=(1, 2))))


def rank_deficient(d, rank, sign):
  """A d x d product of (d x RANK) (RANK x d) Gaussians whose rounding
  leaves det of sign SIGN (slogdet, NumPy): singular in exact arithmetic,
  not in float64, with sigma_min / sigma_max below d eps."""
  for seed in range(100):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((d, rank)) @ rng.standard_normal((rank, d))
    singular = np.linalg.svd(r, compute_uv=False)
    if (np.linalg.slogdet(r)[0] == sign
        and 0 < singular[-1] <= d * np.finfo(float).eps * singular[0]):
      return r
  raise AssertionError(f"no seed gave det of sign {sign}")


class ProductAndRiskTest(absltest.TestCase):

  def test_product_matches_sequential_for_distinct_and_repeated_layers(self):
    rng = np.random.default_rng(0)
    distinct = rng.standard_normal((7, 4, 4)) * 0.3
    repeated = np.concatenate([np.repeat(distinct[:1], 5, 0), distinct[1:3],
                               np.repeat(distinct[3:4], 4, 0)])
    for a in (distinct, repeated, distinct[:1]):
      np.testing.assert_allclose(lt.product(a).numpy(), sequential_product(a),
                                 rtol=1e-12, atol=1e-12)

  def test_layer_norms_per_layer(self):
    rng = np.random.default_rng(1)
    a = np.concatenate([np.repeat(rng.standard_normal((1, 3, 3)), 3, 0),
                        rng.standard_normal((2, 3, 3))])
    np.testing.assert_allclose(lt.layer_norms(a).numpy(),
                               np.linalg.norm(a, ord=2, axis=(1, 2)),
                               rtol=1e-12)

  def test_closed_form_risk_agrees_with_monte_carlo(self):
    rng = np.random.default_rng(2)
    d = 5
    r = lt.random_target(d, rng, 0.5)
    sigma = lt.random_covariance(d, rng, 0.3, 3.0)
    a = lt.random_layers(6, d, rng, 0.1)
    closed = lt.risk(a, r, sigma)
    mean, stderr = lt.monte_carlo_risk(a, r, sigma, samples=100_000, seed=3)
    self.assertLess(abs(closed - mean), 5 * stderr)
    # At an exact factorisation only the noise is left: f_opt = d.
    self.assertAlmostEqual(lt.risk(lt.factorize(r, 6), r, sigma), d, places=10)
    self.assertGreater(closed, d + 0.1)

  def test_risk_rejects_bad_covariance(self):
    with self.assertRaisesRegex(ValueError, "symmetric"):
      lt.risk(np.zeros((1, 2, 2)), np.eye(2), [[1.0, 0.5], [0.0, 1.0]])
    with self.assertRaisesRegex(ValueError, "semi-definite"):
      lt.risk(np.zeros((1, 2, 2)), np.eye(2), np.diag([1.0, -1.0]))
    with self.assertRaisesRegex(ValueError, "shape"):
      lt.risk(np.zeros((2, 2)), np.eye(2), np.eye(2))


class GradientTest(absltest.TestCase):

  def test_lemma_2_4_matches_gradient_tape(self):
    rng = np.random.default_rng(4)
    for layers, d in ((1, 3), (2, 1), (30, 6)):
      r = lt.random_target(d, rng, 0.5)
      sigma = lt.random_covariance(d, rng, 0.5, 2.0)
      a = tf.constant(rng.standard_normal((layers, d, d)) * 0.5 / layers)
      mine = lt.risk_gradient(a, r, sigma)
      tape = lt.tape_gradient(a, r, sigma)
      self.assertLess(float(tf.norm(mine - tape) / tf.norm(tape)), 1e-10)

  def test_risk_and_gradient_value_is_the_closed_form(self):
    rng = np.random.default_rng(5)
    r = lt.random_target(4, rng)
    sigma = lt.random_covariance(4, rng, 0.5, 2.0)
    a = lt.random_layers(5, 4, rng, 0.2)
    value, _ = lt.risk_and_gradient(a, r, sigma)
    self.assertAlmostEqual(value, lt.risk(a, r, sigma), places=10)

  def test_gradient_is_zero_at_the_factorized_optimum(self):
    rng = np.random.default_rng(6)
    r = lt.random_target(5, rng, 1.0)
    a = lt.factorize(r, 12)
    gradient = lt.risk_gradient(a, r, np.eye(5))
    self.assertLess(float(tf.norm(gradient)), 1e-10)


class OrthogonalLogTest(absltest.TestCase):

  def assert_is_log(self, o):
    log = lt.orthogonal_log(o).numpy()
    np.testing.assert_allclose(log, -log.T, atol=1e-15)
    np.testing.assert_allclose(tf.linalg.expm(log).numpy(), o, atol=1e-12)
    self.assertLessEqual(np.linalg.norm(log, 2), math.pi + 1e-9)
    return log

  def test_hard_spectra(self):
    rng = np.random.default_rng(7)
    cases = {
        "minus_identity": -np.eye(4),
        "pi_three_times_odd_d": block_diagonal(rotation(math.pi),
                                               rotation(math.pi),
                                               rotation(math.pi), np.eye(1)),
        "near_pi_and_repeated": block_diagonal(
            rotation(math.pi - 1e-7), rotation(math.pi - 1e-3),
            rotation(math.pi - 1e-12), rotation(0.5), rotation(0.5),
            rotation(-0.5), np.eye(1)),
        "identity": np.eye(3),
        "random": lt.random_orthogonal(9, rng),
    }
    for name, core in cases.items():
      with self.subTest(name):
        q = lt.random_orthogonal(core.shape[0], rng)
        self.assert_is_log(q @ core @ q.T)

  def test_angles_are_recovered(self):
    rng = np.random.default_rng(8)
    angles = [math.pi, math.pi - 1e-6, 2.0, 2.0, 0.3]
    core = block_diagonal(*[rotation(t) for t in angles], np.eye(1))
    q = lt.random_orthogonal(core.shape[0], rng)
    log = self.assert_is_log(q @ core @ q.T)
    singular = np.linalg.svd(log, compute_uv=False)
    np.testing.assert_allclose(singular[0::2][:len(angles)],
                               sorted(angles, reverse=True), atol=1e-9)
    np.testing.assert_allclose(singular[1::2][:len(angles)],
                               sorted(angles, reverse=True), atol=1e-9)

  def test_rejects_reflections_and_non_orthogonal(self):
    with self.assertRaisesRegex(ValueError, "det -1"):
      lt.orthogonal_log(np.diag([1.0, 1.0, -1.0]))
    with self.assertRaisesRegex(ValueError, "not orthogonal"):
      lt.orthogonal_log(2 * np.eye(2))


class FactorizeTest(absltest.TestCase):

  def check(self, r, layers):
    a = lt.factorize(r, layers)
    self.assertEqual(a.dtype, tf.float64)
    self.assertEqual(tuple(a.shape), (layers, r.shape[0], r.shape[0]))
    report = lt.factorization_report(r, a)
    self.assertLess(report["residual"],
                    1e-11 * max(1.0, np.linalg.norm(r)) * max(1, layers / 10))
    # Theorem 2.1 as the paper states it, on |||A||| measured by NumPy; and
    # the report's gamma and bound are the paper's.
    gamma = theorem_2_1_gamma(r)
    bound = theorem_2_1_bound(gamma, layers)
    self.assertLessEqual(largest_layer_norm(a), bound * (1 + 1e-12))
    # (Each bound at its own gamma: sqrt(3 gamma) magnifies the round-off of
    # a gamma of 0.)
    self.assertAlmostEqual(report["gamma"], gamma, delta=1e-9 * max(1, gamma))
    self.assertAlmostEqual(
        report["bound"], theorem_2_1_bound(report["gamma"], layers),
        delta=1e-12 * bound)
    self.assertLessEqual(report["max_norm"], report["bound"])
    self.assertLessEqual(report["max_norm"], report["bound_additive"])
    np.testing.assert_allclose(sequential_product(a), r, atol=1e-9 * max(
        1.0, np.linalg.norm(r)))
    return report

  def test_random_targets(self):
    rng = np.random.default_rng(9)
    for d, layers, gamma in ((1, 2, 0.5), (2, 2, 0.3), (5, 7, 1.0),
                             (7, 40, 3.0), (6, 2, 0.0)):
      with self.subTest(d=d, layers=layers):
        self.check(lt.random_target(d, rng, gamma), layers)

  def test_single_layer(self):
    r = lt.random_target(3, np.random.default_rng(10), 0.3)
    np.testing.assert_allclose(lt.factorize(r, 1).numpy()[0], r - np.eye(3))

  def test_odd_d_pi_and_repeated_rotations(self):
    rng = np.random.default_rng(11)
    core = block_diagonal(rotation(math.pi), rotation(math.pi - 1e-8),
                          rotation(1.0), rotation(1.0), np.eye(1))
    q = lt.random_orthogonal(9, rng)
    scales = np.exp(rng.uniform(-0.5, 0.5, 9))
    r = q @ core @ q.T @ np.diag(scales)
    report = self.check(r, 20)
    # One rotation layer turns by at most pi / k_rot: the angle pi is used.
    self.assertGreater(report["max_norm"], 0.05)
    self.check(-np.eye(4), 3)

  def test_ill_conditioned(self):
    rng = np.random.default_rng(12)
    r = (lt.random_orthogonal(6, rng) * np.logspace(0, -7, 6)
         ) @ lt.random_orthogonal(6, rng).T
    self.assertGreater(np.linalg.cond(r), 1e6)
    report = self.check(r, lt.smallest_admissible_layers(lt.gamma(r)))
    self.assertAlmostEqual(report["gamma"], 7 * math.log(10), places=8)

  def test_split_meets_both_bounds_in_the_worst_case(self):
    # Angle pi and singular values e^{+-gamma} are the worst case for a split.
    for gamma in (0.0, 0.05, 0.2, 1.0, 3.3, 10.0, 100.0):
      smallest = lt.smallest_admissible_layers(gamma)
      for layers in sorted({max(2, smallest), smallest + 1, 2 * smallest + 3,
                            1000}):
        k_rot, k_scale = lt._split_layers(
            layers, math.pi, np.exp([gamma, -gamma]))
        self.assertEqual(k_rot + k_scale, layers)
        rot = 2 * math.sin(math.pi / (2 * k_rot)) if k_rot else 0.0
        scale = math.expm1(gamma / k_scale) if k_scale else 0.0
        worst = max(rot, scale)
        self.assertLessEqual(worst, theorem_2_1_bound(gamma, layers))
        self.assertLessEqual(worst, lt.additive_bound(gamma, layers))

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, r"det\(I \+ A\) > 0"):
      lt.factorize(np.diag([1.0, -2.0]), 5)
    for singular in (np.zeros((2, 2)), rank_deficient(4, 3, -1),
                     rank_deficient(4, 3, 1)):
      with self.assertRaisesRegex(ValueError, r"^R is singular to working "
                                  r"precision"):
        lt.factorize(singular, 50)
    r = np.diag([math.exp(2.0), 1.0])
    with self.assertRaisesRegex(ValueError, "smallest admissible is 6"):
      lt.factorize(r, 5)
    self.check(r, 6)
    with self.assertRaisesRegex(ValueError, "square"):
      lt.factorize(np.ones((2, 3)), 3)
    with self.assertRaisesRegex(ValueError, "non-finite"):
      lt.factorize(np.array([[1.0, np.inf], [0.0, 1.0]]), 3)
    for layers in (0, 2.5, None, "three"):
      with self.assertRaisesRegex(ValueError, "integer >= 1"):
        lt.factorize(np.eye(2), layers)


class BoundTest(absltest.TestCase):

  def test_power_one_holds_below_and_above_one(self):
    rng = np.random.default_rng(13)
    d, layers, tau = 4, 6, 0.08
    r = lt.random_target(d, rng, 0.5)
    for low, high in ((0.05, 0.9), (1.2, 5.0)):
      for _ in range(4):
        sigma = lt.random_covariance(d, rng, low, high)
        a = lt.random_layers(layers, d, rng, tau)
        result = lt.gradient_bound(a, r, sigma, tau)
        self.assertTrue(result["holds"], result)

  def test_equality_case_and_the_seeded_power_two(self):
    r = lt.random_target(3, np.random.default_rng(14), 0.5)
    zero = np.zeros((4, 3, 3))
    tight = lt.gradient_bound(zero, r, 2.0 * np.eye(3), 0.0)
    self.assertAlmostEqual(tight["lhs"] / tight["rhs"], 1.0, places=10)
    self.assertTrue(tight["holds"])
    # The squared form's sigma_min(Sigma)^2 is refuted once sigma_min(Sigma) > 1 ...
    seeded = lt.gradient_bound(zero, r, 2.0 * np.eye(3), 0.0, sigma_power=2)
    self.assertFalse(seeded["holds"])
    # ... and implied by power 1 (so true) when sigma_min(Sigma) <= 1.
    self.assertTrue(lt.gradient_bound(zero, r, 0.5 * np.eye(3), 0.0,
                                      sigma_power=2)["holds"])

  def test_tau_must_be_below_one_and_cover_a(self):
    a = np.zeros((2, 2, 2))
    a[0] = np.eye(2) * 0.5
    with self.assertRaisesRegex(ValueError, "tau < 1"):
      lt.gradient_bound(a, np.eye(2), np.eye(2), tau=0.1)
    with self.assertRaisesRegex(ValueError, "tau < 1"):
      lt.gradient_bound(a, np.eye(2), np.eye(2), tau=1.0)


class DescentTest(absltest.TestCase):

  def test_residual_converges_linearly_plain_stalls(self):
    rng = np.random.default_rng(15)
    d, layers, steps = 4, 10, 300
    r = lt.near_identity_target(d, rng, 1.0)
    sigma = lt.random_covariance(d, rng, 0.5, 2.0)
    residual = lt.gradient_descent(r, sigma, layers, steps)
    gaps = residual["gap"]
    self.assertLess(gaps[-1], 1e-9 * gaps[0])
    self.assertLess(lt.linear_rate(gaps), 0.97)
    self.assertLess(np.max(residual["max_norm"]), 1.0)
    plain = lt.gradient_descent(r, sigma, layers, steps,
                                residual["step_size"], plain=True)
    self.assertGreater(plain["gap"][-1], 0.5 * plain["gap"][0])
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "descent.png")
      lt.plot_descent(residual, plain, path)
      with open(path, "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

  def test_every_step_contracts_as_2_3_promises(self):
    # (2.3) as a Polyak-Lojasiewicz inequality in B_tau: while above
    # round-off, each step multiplies f - f_opt by at most 1 - step mu / 2.
    rng = np.random.default_rng(17)
    d, layers = 3, 8
    r = lt.near_identity_target(d, rng, 1.0)
    sigma = lt.random_covariance(d, rng, 0.5, 2.0)
    run = lt.gradient_descent(r, sigma, layers, 200)
    tau = float(np.max(run["max_norm"]))
    bound = lt.descent_rate_bound(run["step_size"], layers, tau, sigma)
    # mu of (2.3) written out, with NumPy's eigenvalues.
    mu = (4 * layers * (1 - tau) ** (2 * layers - 2)
          * np.linalg.eigvalsh(sigma).min())
    self.assertAlmostEqual(bound, 1 - run["step_size"] * mu / 2, places=13)
    self.assertLess(bound, 1.0)
    gaps = run["gap"]
    live = gaps[:-1] > 1e-8 * gaps[0]
    self.assertGreater(live.sum(), 20)
    self.assertTrue(np.all(gaps[1:][live] <= bound * gaps[:-1][live]))


class FormulaTest(absltest.TestCase):
  """The closed forms and random instances of Section 2, written out."""

  def test_bounds_layers_and_step_size(self):
    for gamma, layers in ((0.0, 1), (0.3, 2), (1.0, 3), (2.5, 40)):
      self.assertAlmostEqual(lt.additive_bound(gamma, layers),
                             (4 * math.pi + 3 * gamma) / layers, places=12)
      self.assertAlmostEqual(lt.iclr_bound(gamma, layers),
                             theorem_2_1_bound(gamma, layers), places=12)
    # The least l >= 1 with l >= 3 gamma.
    for gamma, smallest in ((0.0, 1), (0.2, 1), (1.0, 3), (1.01, 4),
                            (2.0, 6), (10 / 3, 10)):
      self.assertEqual(lt.smallest_admissible_layers(gamma), smallest, gamma)
    rng = np.random.default_rng(20)
    sigma = lt.random_covariance(3, rng, 0.5, 2.0)
    for r in (np.eye(3) * 0.5, lt.random_target(3, rng, 1.0)):
      # 1 / (2 l sigma_max(Sigma) max(1, ||R||)^2).
      expected = 1 / (2 * 7 * np.linalg.eigvalsh(sigma).max()
                      * max(1.0, np.linalg.norm(r, 2)) ** 2)
      self.assertAlmostEqual(lt.default_step_size(r, sigma, 7), expected,
                             places=14)
    # mu of (2.3): 4 l (1 - tau)^(2l - 2) sigma_min^power.
    self.assertAlmostEqual(lt.pl_constant(3, 0.1, 0.5),
                           4 * 3 * 0.9 ** 4 * 0.5, places=14)
    self.assertAlmostEqual(lt.pl_constant(3, 0.1, 0.5, sigma_power=2),
                           4 * 3 * 0.9 ** 4 * 0.25, places=14)

  def test_linear_rate_is_the_geometric_mean_contraction(self):
    gaps = 5.0 * 0.9 ** np.arange(60)
    self.assertAlmostEqual(lt.linear_rate(gaps), 0.9, places=12)
    # Below the floor (round-off) the contraction is not counted: 0.5 per
    # step until the gap reaches 1e-12 of its start, flat after.
    halving = np.concatenate([0.5 ** np.arange(30), np.full(20, 0.5 ** 30)])
    self.assertAlmostEqual(lt.linear_rate(halving, floor=1e-6), 0.5,
                           places=12)
    self.assertEqual(lt.linear_rate([1.0]), 0.0)

  def test_random_instances_have_their_stated_spectra(self):
    rng = np.random.default_rng(21)
    r = lt.random_target(6, rng, 0.7)
    singular = np.linalg.svd(r, compute_uv=False)
    np.testing.assert_allclose([singular[0], singular[-1]],
                               [math.exp(0.7), math.exp(-0.7)], rtol=1e-12)
    self.assertGreater(np.linalg.det(r), 0)
    sigma = lt.random_covariance(5, rng, 0.3, 4.0)
    np.testing.assert_allclose(sigma, sigma.T, atol=1e-14)
    values = np.linalg.eigvalsh(sigma)
    np.testing.assert_allclose([values[0], values[-1]], [0.3, 4.0],
                               rtol=1e-12)
    a = lt.random_layers(7, 4, rng, 0.2)
    norms = np.linalg.norm(a, ord=2, axis=(1, 2))
    self.assertAlmostEqual(norms.max(), 0.2, places=12)
    self.assertTrue(np.all(norms <= 0.2 + 1e-12))
    self.assertEqual(len(set(np.round(norms, 9))), 7)  # Not all equal.
    self.assertLess(np.linalg.det(lt.random_orthogonal(4, rng, det=-1.0)), 0)
    near = lt.near_identity_target(4, rng, 0.5)
    # expm(B) with ||B|| = 0.5: ||R - I|| <= e^0.5 - 1, det R = e^tr(B) > 0.
    self.assertLessEqual(np.linalg.norm(near - np.eye(4), 2),
                         math.expm1(0.5) + 1e-12)
    self.assertGreater(np.linalg.norm(near - np.eye(4), 2), 0.25)

  def test_descent_starts_where_each_parametrisation_says(self):
    rng = np.random.default_rng(22)
    d, layers = 3, 4
    r = lt.random_target(d, rng, 0.4)
    sigma = lt.random_covariance(d, rng, 0.5, 2.0)
    # Residual: A = 0, gap ||(I - R) Sigma^(1/2)||_F^2; one step moves every
    # layer by -eta 2 (I - R) Sigma (Lemma 2.4 at A = 0).
    run = lt.gradient_descent(r, sigma, layers, 1, step_size=0.01)
    error = np.eye(d) - r
    self.assertAlmostEqual(run["gap"][0], np.trace(error @ sigma @ error.T),
                           places=12)
    self.assertEqual(run["max_norm"][0], 0.0)
    np.testing.assert_allclose(
        run["layers"].numpy(),
        np.repeat((-0.01 * 2 * (np.eye(d) - r) @ sigma)[None], layers, 0),
        atol=1e-14)
    # Plain: W_i i.i.d. N(0, init_scale^2 / d) from the seed's generator.
    plain = lt.gradient_descent(r, sigma, layers, 0, plain=True,
                                init_scale=0.3, seed=5)
    w = (np.random.default_rng(5).standard_normal((layers, d, d)) * 0.3
         / math.sqrt(d))
    self.assertAlmostEqual(plain["max_norm"][0],
                           largest_layer_norm(w - np.eye(d)), places=12)
    product = np.linalg.multi_dot(list(w[::-1])) - r
    self.assertAlmostEqual(plain["gap"][0],
                           np.trace(product @ sigma @ product.T), places=12)
    # TOLERANCE stops the run at the first gap within it.
    stopped = lt.gradient_descent(r, sigma, layers, 1000, tolerance=1e-3)
    gaps = stopped["gap"]
    self.assertLess(len(gaps), 1001)
    self.assertLessEqual(gaps[-1], 1e-3 * gaps[0])
    self.assertGreater(gaps[-2], 1e-3 * gaps[0])


class ChecksDetectTest(absltest.TestCase):
  """Each statement `run_checks` checks fails when what it checks is
  wrong: each result's "pass" can be False."""

  def _fails(self, name, target, replacement):
    with mock.patch.object(lt, target, replacement):
      result = lt.run_checks(d=3, layers=4, seed=1, samples=20_000,
                             only=[name])
    self.assertFalse(result[name]["pass"], (name, result[name]))

  def test_a_wrong_result_fails_its_statement(self):
    risk_gradient, factorize = lt.risk_gradient, lt.factorize
    monte_carlo_risk = lt.monte_carlo_risk
    gradient_descent = lt.gradient_descent
    # Each just past its statement's tolerance: a gradient 1e-9 off (the
    # check allows 1e-10), a factorization whose product is 1e-7 off (1e-9),
    # a sample mean 5.2 standard errors from the closed form (5).
    self._fails("lemma_2_4_gradient", "risk_gradient",
                lambda *args: (1 + 1e-9) * risk_gradient(*args))
    self._fails("theorem_2_1_factorization", "factorize",
                lambda r, l: factorize(r, l) * (1 + 1e-7))
    risk = lt.risk
    def biased(a, r, sigma, samples, seed):
      _, stderr = monte_carlo_risk(a, r, sigma, samples, seed)
      return risk(a, r, sigma) + 5.2 * stderr, stderr
    self._fails("claim_2_3_risk_closed_form", "monte_carlo_risk", biased)
    # A factorization that accepts what it must refuse.
    self._fails("theorem_2_1_bad_input", "factorize",
                lambda r, l: tf.zeros([l, 3, 3], tf.float64))
    # A descent that stalls half-way.
    def stalled(*args, **kwargs):
      run = gradient_descent(*args, **kwargs)
      run["gap"] = np.maximum(run["gap"], 0.5 * run["gap"][0])
      return run
    self._fails("gradient_descent_linear_rate", "gradient_descent", stalled)


class ChecksTest(absltest.TestCase):

  def test_every_statement_passes_and_a_wrong_bound_is_detected(self):
    results = lt.run_checks(d=3, layers=4, seed=1, samples=20_000)
    self.assertEqual(
        set(results),
        {"claim_2_3_risk_closed_form", "lemma_2_4_gradient",
         "theorem_2_1_factorization", "theorem_2_1_bad_input",
         "theorem_2_2_bound_2_3", "gradient_descent_linear_rate"})
    for name, entry in results.items():
      self.assertTrue(entry["pass"], (name, entry))
    wrong = lt.run_checks(d=3, layers=4, seed=1, sigma_power=2,
                          only=["theorem_2_2_bound_2_3"])
    self.assertEqual(list(wrong), ["theorem_2_2_bound_2_3"])
    self.assertFalse(wrong["theorem_2_2_bound_2_3"]["pass"])


class BinaryTest(absltest.TestCase):
  """Runs bin/linear_theory.py as a user does.

  Each run imports TensorFlow (seconds of one core), so the independent runs
  start together in setUpClass and the tests inspect their results.
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    tmp = cls.tmp.name
    cls.target = lt.random_target(5, np.random.default_rng(16), 0.7)
    np.save(os.path.join(tmp, "R.npy"), cls.target)
    np.save(os.path.join(tmp, "bad.npy"), np.diag([1.0, -1.0]))
    np.savez(os.path.join(tmp, "R.npz"), R=cls.target)
    for name, sign in (("singular_negative", -1), ("singular_positive", 1)):
      np.save(os.path.join(tmp, name + ".npy"), rank_deficient(4, 3, sign))
    os.makedirs(os.path.join(tmp, "out_dir"))
    env = dict(os.environ, BUILD_WORKING_DIRECTORY=tmp)
    runs = {
        "factorize": ("factorize", "--R=R.npy", "--layers=9",
                      "--output=A.npz"),
        "bad": ("factorize", "--R=bad.npy", "--layers=3", "--output=B.npz"),
        "check": ("check", "--d=2", "--layers=3", "--samples=5000",
                  "--bound_power=2"),
        "descend": ("descend", "--d=3", "--layers=5", "--steps=150",
                    "--plot=descent.png"),
        # Plain mistakes: one line each, exit 1, nothing written.
        "npz_given_as_R": ("factorize", "--R=R.npz", "--layers=3",
                           "--output=C.npz"),
        "output_is_a_directory": ("factorize", "--R=R.npy", "--layers=3",
                                  "--output=out_dir"),
        "descent_diverges": ("descend", "--d=3", "--layers=5", "--steps=50",
                             "--step_size=1e3"),
        # Rank 3 up to rounding: det < 0 and det > 0 by round-off alone.
        "singular_negative": ("factorize", "--R=singular_negative.npy",
                              "--layers=50", "--output=E.npz"),
        "singular_positive": ("factorize", "--R=singular_positive.npy",
                              "--layers=2", "--output=F.npz"),
        "flag_of_another_subcommand": ("factorize", "--R=R.npy",
                                       "--layers=3", "--output=G.npz",
                                       "--plot=p.png"),
        # Former subcommands: one line saying what each became.
        "construct_is_now_factorize": ("construct", "--R=R.npy", "--layers=3",
                                       "--output=D.npz"),
        "benchmark_moved": ("benchmark",),
    }
    cls.results = testing.run_binaries("linear_theory", runs, 4, env=env)

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def assert_succeeded(self, result):
    self.assertEqual(result.returncode, 0, result.stderr)

  def test_factorize_writes_layers_and_json(self):
    result = self.results["factorize"]
    self.assert_succeeded(result)
    report = json.loads(result.stdout)
    self.assertEqual(report["layers"], 9)
    self.assertEqual(report["d"], 5)
    self.assertLess(report["residual"], 1e-12)
    with np.load(os.path.join(self.tmp.name, "A.npz")) as data:
      a = data["A"]
    bound = theorem_2_1_bound(theorem_2_1_gamma(self.target), 9)
    self.assertAlmostEqual(report["gamma"], theorem_2_1_gamma(self.target),
                           places=9)
    self.assertAlmostEqual(report["bound"], bound, delta=1e-9 * bound)
    self.assertLessEqual(largest_layer_norm(a), bound)
    self.assertEqual(a.shape, (9, 5, 5))
    self.assertEqual(a.dtype, np.float64)
    np.testing.assert_allclose(sequential_product(a), self.target, atol=1e-12)
    self.assertAlmostEqual(report["max_norm"], float(np.max(
        np.linalg.norm(a, ord=2, axis=(1, 2)))), places=12)

  def test_factorize_rejects_negative_determinant(self):
    bad = self.results["bad"]
    self.assertNotEqual(bad.returncode, 0)
    self.assertNotIn("Traceback", bad.stderr)
    self.assertIn("det(I + A) > 0", testing.last_stderr_line(bad))
    self.assertEqual(bad.stdout, "")
    self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "B.npz")))

  def test_check_fails_on_the_seeded_bound(self):
    result = self.results["check"]
    self.assertNotEqual(result.returncode, 0)
    report = json.loads(result.stdout)
    self.assertFalse(report["all_pass"])
    self.assertFalse(report["statements"]["theorem_2_2_bound_2_3"]["pass"])
    self.assertTrue(report["statements"]["lemma_2_4_gradient"]["pass"])
    self.assertIn("theorem_2_2_bound_2_3", testing.last_stderr_line(result))

  def test_descend_writes_plot_and_json(self):
    result = self.results["descend"]
    self.assert_succeeded(result)
    summary = json.loads(result.stdout)
    self.assertLess(summary["residual_final_gap"],
                    1e-6 * summary["residual_initial_gap"])
    self.assertLess(summary["residual_max_norm_over_run"], 1.0)
    self.assertGreater(summary["plain_final_gap"],
                       0.5 * summary["plain_initial_gap"])
    # (2.3)'s rate bounds the measured one and is a contraction.
    self.assertLessEqual(summary["residual_rate_per_step"],
                         summary["rate_bound_from_2_3"])
    self.assertLess(summary["rate_bound_from_2_3"], 1.0)
    self.assertEqual(summary["plot"], "descent.png")
    with open(os.path.join(self.tmp.name, "descent.png"), "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

  def test_plain_mistakes_are_one_line_and_write_nothing(self):
    expected = {
        "npz_given_as_R": r"^error: --R=R.npz is an .npz archive, not an "
                          r"\.npy array; save R with np.save",
        "output_is_a_directory": r"^error: --output=out_dir must be a file "
                                 r"path ending in \.npz",
        "descent_diverges": r"^error: gradient descent diverged: f - f_opt "
                            r"became (nan|inf) at step \d+; lower --step_size",
        "construct_is_now_factorize": r"^error: the subcommand construct is "
                                      r"now factorize \(same flags\): .*"
                                      r"factorize --R=R.npy",
        "benchmark_moved": r"^error: the subcommand benchmark is now .*"
                           r"//bin:benchmark -- --suite=linear$",
        # Singular up to rounding: said so, not "flip a row" (det < 0) nor
        # "too few layers" (gamma = |log sigma_min| is huge).
        "singular_negative": r"^error: --R=singular_negative.npy: R is "
                             r"singular to working precision: sigma_min\(R\)"
                             r" = \S+ <= d eps sigma_max\(R\) .*give a "
                             r"full-rank R with det R > 0$",
        "singular_positive": r"^error: --R=singular_positive.npy: R is "
                             r"singular to working precision",
        "flag_of_another_subcommand": r"^error: factorize does not take "
                                      r"--plot; it takes --R, --layers, "
                                      r"--output$",
    }
    for name, pattern in expected.items():
      with self.subTest(name):
        result = self.results[name]
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertRegex(testing.last_stderr_line(result), pattern)
    self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "C.npz")))
    for name in "DEFG":
      self.assertFalse(os.path.exists(os.path.join(self.tmp.name,
                                                   name + ".npz")))
    self.assertEqual(os.listdir(os.path.join(self.tmp.name, "out_dir")), [])
    self.assertFalse(os.path.exists(os.path.join(self.tmp.name,
                                                 "out_dir.npz")))

  def test_unknown_subcommand_is_one_line(self):
    for args in ((), ("frobnicate",)):
      result = testing.run_binary("linear_theory", *args)
      self.assertNotEqual(result.returncode, 0)
      self.assertNotIn("Traceback", result.stderr)
      line = testing.last_stderr_line(result)
      self.assertIn("valid: factorize, check, descend", line)


if __name__ == "__main__":
  absltest.main()
