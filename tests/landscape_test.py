"""Tests for identity_tf.theory.landscape and `linear_theory landscape`
(Theorem 2.2 as an experiment)."""

import json
import math
import os
import tempfile

from absl.testing import absltest
import numpy as np

from identity_tf.theory import landscape
from identity_tf.theory import linear
from identity_tf.theory import linear_run
import testing


def numpy_gap(a, r, sigma):
  """f - f_opt = trace(E Sigma E^T), E = (I + A_l)...(I + A_1) - R: Claim 2.3
  written out with a sequential NumPy product."""
  d = r.shape[0]
  product = np.eye(d)
  for layer in a:
    product = (np.eye(d) + layer) @ product
  error = product - r
  return float(np.trace(error @ sigma @ error.T))


def spectral_norms(a):
  return np.linalg.norm(a, ord=2, axis=(-2, -1))


def numpy_descent(a, r, sigma, steps, step_size):
  """Gradient descent on Claim 2.3's excess risk in NumPy, the gradient of
  Lemma 2.4 written out: 2 (I + A_l)^T...(I + A_{i+1})^T E Sigma
  (I + A_{i-1})^T...(I + A_1)^T. Returns per step (gaps, layer norms)."""
  a = np.array(a, np.float64)
  d = r.shape[0]
  gaps, norms = [], []
  for _ in range(steps + 1):
    factors = [np.eye(d) + layer for layer in a]
    before = [np.eye(d)]
    for factor in factors[:-1]:
      before.append(factor @ before[-1])
    error = factors[-1] @ before[-1] - r
    gaps.append(float(np.trace(error @ sigma @ error.T)))
    norms.append(spectral_norms(a))
    after = np.eye(d)
    gradient = np.empty_like(a)
    for i in reversed(range(len(a))):
      gradient[i] = 2 * after.T @ error @ sigma @ before[i].T
      after = after @ factors[i]
    a = a - step_size * gradient
  return np.array(gaps), np.array(norms)


class GradientTest(absltest.TestCase):

  def test_descent_gradient_matches_finite_differences(self):
    rng = np.random.default_rng(0)
    d, layers = 3, 3
    sigma = linear.random_covariance(d, rng, 0.5, 2.0)
    targets = np.stack([landscape.random_target(d, rng, 2.0, 1.0),
                        landscape.flip_determinant(np.eye(d))])
    a = np.stack([linear.random_layers(layers, d, rng, 0.4)
                  for _ in range(2)])
    gaps, gradients = landscape.batched_risk_and_gradient(a, targets, sigma)
    step = 1e-6
    for k in range(2):
      self.assertAlmostEqual(float(gaps[k]),
                             numpy_gap(a[k], targets[k], sigma), places=10)
      numeric = np.zeros_like(a[k])
      for index in np.ndindex(*a[k].shape):
        plus, minus = a[k].copy(), a[k].copy()
        plus[index] += step
        minus[index] -= step
        numeric[index] = (numpy_gap(plus, targets[k], sigma)
                          - numpy_gap(minus, targets[k], sigma)) / (2 * step)
      np.testing.assert_allclose(gradients[k].numpy(), numeric, rtol=1e-6,
                                 atol=1e-8)

  def test_random_target_has_the_asked_condition_and_positive_det(self):
    rng = np.random.default_rng(1)
    for condition, rotation in ((1.0, 0.0), (5.0, 1.0), (100.0, 3.0)):
      r = landscape.random_target(6, rng, condition, rotation)
      singular = np.linalg.svd(r, compute_uv=False)
      self.assertAlmostEqual(singular[0] / singular[-1], condition, places=8)
      self.assertGreater(np.linalg.det(r), 0)
      # The orthogonal polar factor turns by at most ROTATION.
      u, _, vt = np.linalg.svd(r)
      angles = np.abs(np.angle(np.linalg.eigvals(u @ vt)))
      self.assertLessEqual(angles.max(), rotation + 1e-9)


class ExcessRiskTest(absltest.TestCase):

  def test_gaps_far_below_d_eps_are_representable(self):
    # Near an exact factorisation f - f_opt is ~1e-18, far below the
    # ulp(d) ~ 1e-15 that f - d can resolve; tr(E Sigma E^T) from E keeps
    # it. (Both sides carry the products' rounding, ~1e-15 in E against
    # ||E|| ~ 1e-9: a relative 1e-3 is E's precision, not a slack.)
    rng = np.random.default_rng(8)
    d, layers = 4, 6
    r = landscape.random_target(d, rng, 2.0, 1.0)
    sigma = linear.random_covariance(d, rng, 0.5, 2.0)
    exact = linear.factorize(r, layers).numpy()
    a = np.stack([exact + 1e-10 * rng.standard_normal(exact.shape),
                  exact + 1e-6 * rng.standard_normal(exact.shape)])
    gaps, _ = landscape.batched_risk_and_gradient(a, np.stack([r, r]), sigma)
    expected = [numpy_gap(a[k], r, sigma) for k in range(2)]
    self.assertLess(expected[0], 1e-16)
    for k in range(2):
      self.assertAlmostEqual(float(gaps[k]) / expected[k], 1.0, delta=1e-3)


class ExperimentTest(absltest.TestCase):

  def test_trivial_target_is_always_reached_inside_b_1(self):
    rng = np.random.default_rng(2)
    d = 4
    sigma = linear.random_covariance(d, rng, 0.5, 2.0)
    report, _ = landscape.run_landscape(np.eye(d), sigma, [2, 3], [0.05, 0.2],
                                        starts=4, steps=300, epsilon=1e-8)
    self.assertLen(report["cells"], 4)
    for cell in report["cells"]:
      residual = cell["residual"]
      self.assertEqual(residual["reached_fraction"], 1.0, cell)
      self.assertEqual(residual["stayed_in_B_1_fraction"], 1.0, cell)
      # (2.3) along each path, which stays in B_tau' with tau' < 1, its
      # own largest |||A|||.
      self.assertGreaterEqual(residual["min_ratio_over_pl_constant"], 1.0)
      for quotient in residual["min_ratio_over_pl_constant_by_start"]:
        self.assertGreaterEqual(quotient, 1.0)

  def test_negative_determinant_is_not_reached_inside_b_1(self):
    rng = np.random.default_rng(3)
    d, layers = 3, 2
    sigma = linear.random_covariance(d, rng, 0.5, 2.0)
    flipped = landscape.flip_determinant(
        landscape.random_target(d, rng, 2.0, 0.5))
    self.assertLess(np.linalg.det(flipped), 0)
    starts = landscape.draw_starts(6, layers, d, 0.3, seed=4)
    # No product of near-identity layers has det < 0 ...
    for a in starts:
      product = np.linalg.multi_dot([np.eye(d) + layer for layer in a[::-1]])
      self.assertGreater(np.linalg.det(product), 0)
    run = landscape.descend_batch(starts, np.repeat(flipped[None], 6, 0),
                                  sigma, steps=300, step_size=0.05)
    # ... so inside B_1 the gap stays above the distance to det < 0.
    floor = (np.linalg.eigvalsh(sigma).min()
             * np.linalg.svd(flipped, compute_uv=False).min() ** 2)
    self.assertAlmostEqual(landscape.negative_det_floor(flipped, sigma),
                           floor, places=12)
    inside = run["norm"] < 1.0
    self.assertTrue(np.all(run["gap"][inside] >= floor * (1 - 1e-9)))
    epsilon = 1e-6
    for k in range(6):
      below = np.flatnonzero(run["gap"][:, k] <= epsilon)
      if below.size:  # Reached: only after |||A||| reached 1.
        self.assertTrue(np.any(run["norm"][:below[0] + 1, k] >= 1.0))
    summary = landscape.negative_det_summary(run, epsilon, floor)
    self.assertEqual(summary["reached_without_crossing_1"], 0)
    self.assertTrue(summary["floor_holds"])
    # Where each path leaves B_1, against the same descent in NumPy.
    self.assertLen(summary["crossings_by_start"], 6)
    self.assertGreater(summary["crossed_1_fraction"], 0)  # Not vacuous.
    for k, crossing in enumerate(summary["crossings_by_start"]):
      gaps, norms = numpy_descent(starts[k], flipped, sigma, 300, 0.05)
      outside = np.flatnonzero(norms.max(axis=1) >= 1.0)
      np.testing.assert_allclose(summary["path_max_norm_by_start"][k],
                                 norms.max(), rtol=1e-9)
      if not outside.size:
        self.assertIsNone(crossing)
        continue
      step = outside[0]
      self.assertEqual(crossing["step"], step)
      self.assertEqual(crossing["layer"], int(np.argmax(norms[step])) + 1)
      self.assertAlmostEqual(crossing["layer_norm"], norms[step].max(),
                             places=9)
      self.assertAlmostEqual(crossing["gap"] / gaps[step], 1.0, places=7)
      self.assertGreaterEqual(crossing["gap_before"], floor * (1 - 1e-9))
    self.assertEqual(sum(summary["crossing_layer_counts"].values()),
                     sum(c is not None for c in summary["crossings_by_start"]))
    # A budget too short to leave B_1: never reached, and reported so.
    short = landscape.descend_batch(starts, np.repeat(flipped[None], 6, 0),
                                    sigma, steps=3, step_size=0.05)
    self.assertTrue(np.all(short["norm"] < 1.0))
    short_summary = landscape.negative_det_summary(short, epsilon, floor)
    self.assertEqual(short_summary["reached_fraction"], 0.0)
    self.assertEqual(short_summary["crossed_1_fraction"], 0.0)

  def test_plain_parametrisation_does_not_move_from_zero(self):
    rng = np.random.default_rng(5)
    d = 3
    r = landscape.random_target(d, rng, 2.0, 1.0)
    sigma = linear.random_covariance(d, rng, 0.5, 2.0)
    # W = 0 is A = -I; the gradient of W_l...W_1 there is a product with a
    # zero factor for every layer (l >= 2).
    a = -np.repeat(np.eye(d)[None, None], 3, 1)
    run = landscape.descend_batch(a, r[None], sigma, steps=50,
                                  step_size=0.1)
    np.testing.assert_array_equal(run["grad_sq"], 0.0)
    np.testing.assert_allclose(run["gap"][:, 0],
                               numpy_gap(np.zeros((1, d, d)) - np.eye(d),
                                         r, sigma), rtol=1e-12)
    # tau = 0 starts every run at A = 0, so the plain contrast at W = 0.
    report, _ = landscape.run_landscape(r, sigma, [2], [0.0], starts=2,
                                        steps=20, epsilon=1e-6)
    plain = report["cells"][0]["plain"]
    self.assertEqual(plain["reached_fraction"], 0.0)
    self.assertEqual(plain["never_halved"], 2)
    self.assertEqual(plain["final_gap_median"], plain["initial_gap_median"])

  def test_summary_reads_the_paths(self):
    # Two hand-made paths: one reaches epsilon at step 2 inside B_0.5, one
    # never does and leaves B_1.
    run = {"gap": np.array([[4.0, 4.0], [1.0, 3.0], [1e-9, 2.5],
                            [0.0, 2.0]]),
           "norm": np.array([[0.3, 0.3], [0.4, 0.9], [0.45, 1.2],
                             [0.9, 1.3]]),
           "grad_sq": np.array([[8.0, 8.0], [3.0, 6.0], [1.0, 5.0],
                                [0.0, 4.0]]),
           "diverged": np.array([-1, -1])}
    summary = landscape.residual_summary(run, 1e-6, 0.5, 2, 0.5)
    self.assertEqual(summary["reached_fraction"], 0.5)
    self.assertEqual(summary["steps_to_epsilon"], {"median": 2.0, "max": 2})
    self.assertEqual(summary["path_max_norm"]["max"], 1.3)
    self.assertEqual(summary["path_max_norm_by_start"], [0.45, 1.3])
    self.assertEqual(summary["stayed_in_B_1_fraction"], 0.5)
    self.assertEqual(summary["stayed_in_B_tau_fraction"], 0.5)
    self.assertEqual(summary["min_ratio"], 2.0)  # 8 / 4, 3 / 1, 6 / 3, ...
    # Path 1 stays in B_0.45: its smallest ratio, 2 (8 / 4; 3 / 1), against
    # mu = 4 l (1 - 0.45)^(2l - 2) sigma_min at its own tau. Path 2 leaves
    # B_1, where (2.3) says nothing.
    mu = 4 * 2 * (1 - 0.45) ** 2 * 0.5
    quotients = summary["min_ratio_over_pl_constant_by_start"]
    self.assertAlmostEqual(quotients[0], 2.0 / mu, places=12)
    self.assertIsNone(quotients[1])
    self.assertAlmostEqual(summary["min_ratio_over_pl_constant"], 2.0 / mu,
                           places=12)

  def test_every_summary_of_hand_made_paths(self):
    # Path 1 halves its gap by step 1 and reaches 1e-6 at step 2; path 2
    # halves it at step 3 (2.0 <= 4 / 2), never reaches 1e-6 and leaves
    # B_1 at step 2 through its second layer; a third path diverged at
    # step 1 (its later rows repeat its last state) and counts as failed.
    run = {"gap": np.array([[4.0, 4.0, 4.0], [1.0, 3.0, 9.0],
                            [1e-9, 2.5, 9.0], [0.0, 2.0, 9.0]]),
           "layer_norms": np.array([
               [[0.3, 0.1], [0.2, 0.3], [0.3, 0.3]],
               [[0.4, 0.1], [0.9, 0.5], [0.5, 0.3]],
               [[0.45, 0.2], [0.8, 1.2], [0.5, 0.3]],
               [[0.9, 0.2], [1.3, 1.1], [0.5, 0.3]]]),
           "grad_sq": np.ones((4, 3)),
           "diverged": np.array([-1, -1, 1])}
    run["norm"] = run["layer_norms"].max(axis=-1)
    residual = landscape.residual_summary(run, 1e-6, 0.5, 2, 0.5)
    self.assertEqual(residual["steps_to_half"], {"median": 2.0, "max": 3})
    self.assertEqual(residual["final_gap"], {"median": 2.0, "max": 9.0})
    self.assertEqual((residual["diverged"], residual["starts"]), (1, 3))
    self.assertAlmostEqual(residual["reached_fraction"], 1 / 3)
    plain = landscape.plain_summary(run, 1e-6)
    self.assertEqual(plain, {
        "reached_fraction": 1 / 3, "failed_within_budget": 2,
        "steps_to_half": {"median": 2.0, "max": 3}, "never_halved": 1,
        "initial_gap_median": 4.0, "final_gap_median": 2.0, "diverged": 1})
    crossings = landscape.crossings(run)
    self.assertIsNone(crossings[0])
    self.assertIsNone(crossings[2])
    self.assertEqual(crossings[1], {"step": 2, "layer": 2, "layer_norm": 1.2,
                                    "gap": 2.5, "gap_before": 3.0})
    negative = landscape.negative_det_summary(run, 1e-6, floor=0.5)
    self.assertAlmostEqual(negative["crossed_1_fraction"], 1 / 3)
    self.assertEqual(negative["crossing_layer_counts"], {"2": 1})
    self.assertEqual(negative["reached_without_crossing_1"], 1)  # Path 1.
    self.assertEqual(negative["min_gap_inside_B_1"], 0.0)
    self.assertFalse(negative["floor_holds"])  # 1e-9 < 0.5 inside B_1.
    self.assertEqual(negative["final_gap"], {"median": 2.0, "min": 0.0})

  def test_starts_lie_on_the_boundary_of_b_tau_and_are_the_cells_own(self):
    for layers, tau in ((1, 0.3), (4, 0.05), (3, 0.0)):
      starts = landscape.draw_starts(5, layers, 3, tau, seed=2)
      self.assertEqual(starts.shape, (5, layers, 3, 3))
      norms = spectral_norms(starts)
      np.testing.assert_allclose(norms.max(axis=1), tau, atol=1e-12)
      np.testing.assert_allclose(norms[:, 0], tau, atol=1e-12)  # ||A_1||.
      np.testing.assert_array_equal(
          landscape.draw_starts(5, layers, 3, tau, seed=2), starts)
    self.assertFalse(np.array_equal(
        landscape.draw_starts(2, 2, 3, 0.3, seed=2),
        landscape.draw_starts(2, 2, 3, 0.3, seed=3)))
    # Theorem 2.1's yardstick: the factorization's |||A|||, None below
    # 3 gamma layers.
    r = np.diag([math.e ** 2, 1.0, 1.0])
    self.assertIsNone(landscape.factorization_norm(r, 5))
    self.assertAlmostEqual(landscape.factorization_norm(r, 6),
                           math.expm1(2 / 6), places=9)
    with self.assertRaisesRegex(ValueError, "not positive definite"):
      landscape.check_positive_definite(np.diag([1.0, 0.0]))
    landscape.check_positive_definite(np.diag([1.0, 1e-3]))


class BinaryTest(absltest.TestCase):
  """Runs `linear_theory landscape` as a user does, all runs at once."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    tmp = cls.tmp.name
    rng = np.random.default_rng(6)
    np.save(os.path.join(tmp, "R.npy"), landscape.random_target(
        3, rng, 2.0, 0.5))
    np.save(os.path.join(tmp, "flipped.npy"), np.diag([1.0, -1.0, 1.0]))
    cls.sigma = linear.random_covariance(3, rng, 0.2, 5.0)
    np.save(os.path.join(tmp, "S.npy"), cls.sigma)
    np.save(os.path.join(tmp, "rank2.npy"), np.diag([1.0, 0.0, 2.0]))
    env = dict(os.environ, BUILD_WORKING_DIRECTORY=tmp)
    small = ("--depths=2,3", "--taus=0.1,0.3", "--starts=3", "--steps=60")
    runs = {
        "random": ("landscape", "--d=3", *small, "--output=report.json",
                   "--plot=landscape.png"),
        "sigma": ("landscape", "--R=R.npy", "--sigma=S.npy", "--depths=2",
                  "--taus=0.2", "--starts=2", "--steps=40"),
        "sigma_singular": ("landscape", "--sigma=rank2.npy"),
        # Plain mistakes: one line each, exit 1, nothing on stdout. (The
        # rest of the checks are in CommandErrorsTest, in this process.)
        "tau_one": ("landscape", "--taus=0.5,1"),
        "det_negative": ("landscape", "--R=flipped.npy"),
        "layers": ("landscape", "--layers=4"),
    }
    cls.results = testing.run_binaries("linear_theory", runs, 4, env=env)

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def test_writes_json_and_png(self):
    report = testing.report_written(
        self, self.results["random"],
        os.path.join(self.tmp.name, "report.json"),
        os.path.join(self.tmp.name, "landscape.png"))
    self.assertEqual(report["plot"], "landscape.png")
    self.assertEqual([(c["layers"], c["tau"]) for c in report["cells"]],
                     [(2, 0.1), (2, 0.3), (3, 0.1), (3, 0.3)])
    self.assertEqual(report["d"], 3)
    self.assertGreater(report["R"]["det"], 0)
    for cell in report["cells"]:
      residual = cell["residual"]
      self.assertEqual(residual["starts"], 3)
      self.assertLen(residual["path_max_norm_by_start"], 3)
      self.assertEqual(max(residual["path_max_norm_by_start"]),
                       residual["path_max_norm"]["max"])
      for norm, quotient in zip(
          residual["path_max_norm_by_start"],
          residual["min_ratio_over_pl_constant_by_start"]):
        if norm < 1 and quotient is not None:  # (2.3) on a path in B_1.
          self.assertGreaterEqual(quotient, 1.0)
      self.assertLen(cell["negative_det"]["crossings_by_start"], 3)

  def test_sigma_from_a_file(self):
    result = self.results["sigma"]
    self.assertEqual(result.returncode, 0, result.stderr)
    report = json.loads(result.stdout)
    self.assertEqual(report["Sigma_source"], {"file": "S.npy"})
    eigenvalues = np.linalg.eigvalsh(self.sigma)
    np.testing.assert_allclose(report["Sigma_eigenvalues"],
                               [eigenvalues[0], eigenvalues[-1]], rtol=1e-12)
    # The det R < 0 floor sigma_min(Sigma) sigma_min(R)^2 with this Sigma.
    r = np.load(os.path.join(self.tmp.name, "R.npy"))
    floor = eigenvalues[0] * np.linalg.svd(r, compute_uv=False)[-1] ** 2
    self.assertAlmostEqual(
        report["cells"][0]["negative_det"]["gap_floor_inside_B_1"], floor,
        places=12)

  def test_bad_flags_are_one_line(self):
    expected = {
        "tau_one": r"--taus must be in \[0, 1\)",
        "det_negative": r"--R=flipped.npy has det R <= 0",
        "layers": r"landscape takes --depths=2,4,8, not --layers",
        "sigma_singular": r"--sigma=rank2.npy: Sigma is not positive "
                          r"definite: its smallest eigenvalue is 0",
    }
    for name, pattern in expected.items():
      with self.subTest(name):
        result = self.results[name]
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertRegex(testing.last_stderr_line(result),
                         "^error: .*" + pattern)


class CommandTest(absltest.TestCase):
  """`linear_run.landscape_command`, what the binary calls, in this process:
  its one-line errors (the binary prints them as `error: ...`, exit status
  1: BinaryTest) come before any descent."""

  def test_reads_r_from_a_file(self):
    with tempfile.TemporaryDirectory() as tmp:
      r_path = os.path.join(tmp, "R.npy")
      target = landscape.random_target(3, np.random.default_rng(7), 2.0, 0.5)
      np.save(r_path, target)
      emitted = []
      report = linear_run.landscape_command(
          r_path=r_path, r_as_typed="R.npy", depths=["2"], taus=["0.2"],
          starts=2, steps=30, emit=emitted.append)
    self.assertEqual(emitted, [report])
    self.assertAlmostEqual(report["R"]["det"], np.linalg.det(target),
                           places=10)
    self.assertEqual(report["R"]["source"], {"file": "R.npy"})
    self.assertEqual(report["d"], 3)

  def test_each_mistake_names_its_flag(self):
    with tempfile.TemporaryDirectory() as tmp:
      r_path = os.path.join(tmp, "R.npy")
      np.save(r_path, np.eye(3))
      files = {"asymmetric": [[1.0, 0.5], [0.0, 1.0]],
               "negative": [[1.0, 0.0], [0.0, -1e-3]],
               "two": np.eye(2), "text": None,
               # Rank 1, with rounding in every entry.
               "rank_one": np.outer([0.3, 0.7], [1.1, -0.9])}
      for name, matrix in files.items():
        if matrix is None:
          with open(os.path.join(tmp, name + ".npy"), "w") as f:
            f.write("1 0\n0 1\n")
        else:
          np.save(os.path.join(tmp, name + ".npy"), matrix)
      sigma = {name: os.path.join(tmp, name + ".npy") for name in files}
      cases = {
          r"--sigma=.*asymmetric.npy: Sigma = E\[x x\^T\] must be "
          r"symmetric": {"sigma_path": sigma["asymmetric"]},
          r"--sigma=.*negative.npy: Sigma is not positive definite: its "
          r"smallest eigenvalue is -0.001": {"sigma_path": sigma["negative"]},
          r"--sigma=.*two.npy is 2 x 2 but --R=.*R.npy is 3 x 3": {
              "sigma_path": sigma["two"], "r_path": r_path},
          r"--sigma=.*two.npy is 2 x 2 but --d=4 is 4 x 4": {
              "sigma_path": sigma["two"], "d": 4},
          r"--sigma=.*text.npy is not a .npy file .*save sigma with "
          r"numpy.save": {"sigma_path": sigma["text"]},
          r"--R=.*rank_one.npy: R is singular to working precision": {
              "r_path": sigma["rank_one"]},
          r"--depths must be >= 1": {"depths": ["0", "2"]},
          r"--depths must be a comma-separated list of integers, e.g. "
          r"--depths=2,4,8; got two": {"depths": ["two"]},
          r"--taus must be a comma-separated list": {"taus": ["x"]},
          r"--taus must be in \[0, 1\)": {"taus": ["nan"]},
          r"--epsilon > 0": {"epsilon": 0.0},
          r"--step_size must be positive": {"step_size": -1.0},
          r"give --R=R.npy or --condition/--rotation": {
              "r_path": r_path, "condition": 3.0},
          r"--d=5 but --R=.*R.npy is 3 x 3": {"r_path": r_path, "d": 5},
          r"--condition >= 1": {"condition": 0.5},
          r"0 <= --rotation <= pi": {"rotation": 4.0},
          r"--plot=.*: directory .* does not exist": {
              "plot_path": os.path.join(tmp, "missing", "p.png")},
          r"--output=.* is a directory": {"output_path": tmp},
      }
      for pattern, arguments in cases.items():
        with self.subTest(pattern):
          with self.assertRaisesRegex(ValueError, "^" + ".*" + pattern):
            linear_run.landscape_command(**arguments)
      self.assertEqual(sorted(os.listdir(tmp)),
                       sorted(["R.npy"] + [f"{n}.npy" for n in files]))


if __name__ == "__main__":
  absltest.main()
