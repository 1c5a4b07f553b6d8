"""Tests for identity_tf.theory.conjecture and bin/conjecture.py (the probe of
Section 5's conjecture)."""

import os
import tempfile

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

from identity_tf import layers
from identity_tf.theory import conjecture
import testing


def numpy_forward(weights, x, residual=True):
  """h <- h + V ReLU(U h + b) per unit (or without h), rows of X as h."""
  u, b, v = weights
  h = np.asarray(x, np.float64)
  for i in range(u.shape[0]):
    branch = np.maximum(h @ u[i].T + b[i], 0.0) @ v[i].T
    h = h + branch if residual else branch
  return h


def numpy_loss(weights, x, y, residual, baseline):
  return float(np.mean(np.square(numpy_forward(weights, x, residual) - y))
               / baseline)


def batch(weights_list, x, y, identity, baselines):
  """Tensors for `conjecture.loss_and_gradient` from per-network lists."""
  stacked = [tf.constant(np.stack([w[k] for w in weights_list]))
             for k in range(3)]
  count = len(weights_list)
  return (*stacked, tf.constant(np.repeat(x[None], count, 0)),
          tf.constant(np.stack(y)), tf.constant(identity, tf.float64),
          tf.constant(baselines, tf.float64))


class NetworkTest(absltest.TestCase):

  def test_forward_is_the_dense_residual_unit(self):
    rng = np.random.default_rng(0)
    d, depth = 5, 3
    weights = conjecture.residual_teacher(rng, depth, d, d, 0.8)
    x = rng.standard_normal((7, d))
    model = keras.Sequential(
        [keras.Input((d,), dtype="float64")]
        + [layers.DenseResidualUnit(dtype="float64") for _ in range(depth)])
    for i, unit in enumerate(model.layers):
      unit.set_matrices(weights[0][i], weights[2][i], weights[1][i])
    np.testing.assert_allclose(conjecture.network(weights, x).numpy(),
                               model(x).numpy(), rtol=1e-12, atol=1e-12)

  def test_removing_the_identity_changes_the_function(self):
    rng = np.random.default_rng(1)
    d = 4
    x = rng.standard_normal((9, d))
    one = conjecture.residual_teacher(rng, 1, d, 6, 0.5)
    # One unit: the residual output is the plain one plus h.
    np.testing.assert_allclose(
        conjecture.network(one, x).numpy()
        - conjecture.network(one, x, residual=False).numpy(), x, atol=1e-14)
    deep = conjecture.residual_teacher(rng, 3, d, 6, 0.5)
    residual = conjecture.network(deep, x).numpy()
    plain = conjecture.network(deep, x, residual=False).numpy()
    np.testing.assert_allclose(residual, numpy_forward(deep, x), atol=1e-13)
    np.testing.assert_allclose(plain, numpy_forward(deep, x, False),
                               atol=1e-13)
    self.assertGreater(np.abs(residual - plain).max(), 0.5)

  def test_the_teacher_is_reproduced_by_its_own_weights(self):
    task = conjecture.make_task(2, 3, 4, [0.1], range(2), 20, 0.7)
    self.assertLen(task["labels"], 4)  # 2 seeds x 1 norm x 2 families
    losses = []
    for j, label in enumerate(task["labels"]):
      residual = label["family"] == "residual"
      teacher = task["teachers"][j]
      # The targets are the teacher's outputs (computed independently) ...
      np.testing.assert_allclose(
          task["y"][j], numpy_forward(teacher, task["x"][j], residual),
          atol=1e-13)
      baseline = np.mean(np.square(task["y"][j] - (task["x"][j] if residual
                                                    else 0.0)))
      self.assertAlmostEqual(task["baseline"][j], baseline, places=14)
      self.assertGreater(baseline, 1e-6)
      losses.append(conjecture.relative_loss(
          *batch([teacher], task["x"][j], [task["y"][j]], [1.0 * residual],
                 [baseline])))
    # ... so a student set to the teacher's weights has loss zero.
    np.testing.assert_array_equal(np.concatenate(losses), 0.0)


class GradientTest(absltest.TestCase):

  def test_gradient_matches_finite_differences(self):
    rng = np.random.default_rng(2)
    d, m, depth, n = 3, 4, 2, 6
    x = rng.standard_normal((n, d))
    networks, targets, baselines = [], [], []
    for residual in (True, False):
      teacher = conjecture.residual_teacher(rng, depth, d, m, 0.9)
      y = numpy_forward(teacher, x, residual)
      baselines.append(float(np.mean(np.square(y - (x if residual else 0)))))
      targets.append(y)
      networks.append(conjecture.residual_teacher(rng, depth, d, m, 0.6))
    identity = [1.0, 0.0]
    losses, gradients = conjecture.loss_and_gradient(
        *batch(networks, x, targets, identity, baselines))
    step = 1e-6
    for j in range(2):
      self.assertAlmostEqual(
          float(losses[j]), numpy_loss(networks[j], x, targets[j],
                                       identity[j], baselines[j]), places=12)
      for k in range(3):
        numeric = np.zeros_like(networks[j][k])
        for index in np.ndindex(*numeric.shape):
          moved = []
          for sign in (1, -1):
            weights = [w.copy() for w in networks[j]]
            weights[k][index] += sign * step
            moved.append(numpy_loss(weights, x, targets[j], identity[j],
                                    baselines[j]))
          numeric[index] = (moved[0] - moved[1]) / (2 * step)
        np.testing.assert_allclose(gradients[k][j].numpy(), numeric,
                                   rtol=1e-5, atol=1e-8)

  def test_zero_weights_are_a_critical_point_of_both_families(self):
    # Every gradient of the branch V ReLU(U h + b) carries a factor V or
    # ReLU(U h + b) = 0: the identity (and, plain, the zero map) is a critical
    # point whose loss is not zero ...
    rng = np.random.default_rng(3)
    d, m = 3, 3
    x = rng.standard_normal((10, d))
    teacher = conjecture.residual_teacher(rng, 2, d, m, 0.8)
    zero = conjecture.student_start(rng, 2, d, m, 0.0)
    targets = [numpy_forward(teacher, x, True),
               numpy_forward(teacher, x, False)]
    losses, gradients = conjecture.loss_and_gradient(
        *batch([zero, zero], x, targets, [1.0, 0.0], [1.0, 1.0]))
    self.assertTrue(np.all(losses.numpy() > 1e-3))
    for gradient in gradients:
      np.testing.assert_array_equal(gradient.numpy(), 0.0)
    # ... but not a minimum: along U = s U', V = s V' with V' matched to the
    # residual error of the last unit the loss falls at second order.
    u_dir = rng.standard_normal((2, m, d))
    hidden = np.maximum(x @ u_dir[1].T, 0.0)
    v_dir = np.zeros((2, d, m))
    v_dir[1] = (targets[0] - x).T @ hidden
    s = 1e-2
    moved = (s * u_dir, np.zeros((2, m)), s * s * v_dir / np.abs(v_dir).max())
    self.assertLess(numpy_loss(moved, x, targets[0], True, 1.0),
                    numpy_loss(zero, x, targets[0], True, 1.0))


class TrainTest(absltest.TestCase):

  def test_rows_are_states_and_zero_starts_do_not_move(self):
    task = conjecture.make_task(2, 3, 3, [0.0, 0.2], range(1), 12, 0.6)
    steps = 30
    run = conjecture.train_batch(task, steps, 0.05, chunk=7)
    self.assertEqual(run["loss"].shape, (steps + 1, 4))
    for j, label in enumerate(task["labels"]):
      residual = label["family"] == "residual"
      start = (task["u"][j], task["b"][j], task["v"][j])
      self.assertAlmostEqual(
          run["loss"][0, j], numpy_loss(start, task["x"][j], task["y"][j],
                                        residual, task["baseline"][j]),
          places=12)
      if label["init_norm"] == 0:  # V = 0 (the identity or the zero map).
        self.assertAlmostEqual(run["loss"][0, j], 1.0, places=12)
        np.testing.assert_array_equal(run["loss"][:, j], run["loss"][0, j])
        np.testing.assert_array_equal(run["gradient"][:, j], 0.0)
      else:
        self.assertLess(run["loss"][-1, j], run["loss"][0, j])
    outcomes = conjecture.classify(run, 1e-3, 1e-6)
    self.assertEqual([o for o, label in zip(outcomes, task["labels"])
                      if label["init_norm"] == 0], ["stalled_critical"] * 2)

  def test_dead_hidden_counts_relus_off_on_every_sample(self):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, 3))
    u, b, v = conjecture.residual_teacher(rng, 2, 3, 4, 0.5)
    u[0, 1], b[0, 1] = 0.0, -1.0    # unit 1, ReLU 2: always off
    u[1, 3], b[1, 3] = 0.0, -1e-3   # unit 2, ReLU 4: always off
    u[1, 0], b[1, 0] = 0.0, 0.5     # unit 2, ReLU 1: always on
    expected = 0
    h = x
    for i in range(2):  # the same count, by NumPy
      before = h @ u[i].T + b[i]
      expected += int(np.sum(np.all(before <= 0, axis=0)))
      h = h + np.maximum(before, 0) @ v[i].T
    self.assertGreaterEqual(expected, 2)
    arguments = (*(tf.constant(w[None]) for w in (u, b, v)),
                 tf.constant(x[None]), tf.constant([1.0], tf.float64))
    self.assertEqual(int(conjecture.dead_hidden(*arguments)[0]), expected)

  def test_kink_distance_is_the_smallest_preactivation(self):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((10, 3))
    u, b, v = conjecture.residual_teacher(rng, 2, 3, 4, 0.5)
    # Unit 2's ReLU 3 switches 1e-9 from sample 6.
    h = x + np.maximum(x @ u[0].T + b[0], 0) @ v[0].T
    b[1, 2] = 1e-9 - h[6] @ u[1, 2]
    smallest, h = np.inf, x
    for i in range(2):  # min |U_i h + b_i| over units, samples, ReLUs
      before = h @ u[i].T + b[i]
      smallest = min(smallest, np.abs(before).min())
      h = h + np.maximum(before, 0) @ v[i].T
    self.assertLess(smallest, 1e-8)
    found = conjecture.kink_distance(
        *(tf.constant(w[None]) for w in (u, b, v)), tf.constant(x[None]),
        tf.constant([1.0], tf.float64))
    self.assertAlmostEqual(float(found[0]), smallest, delta=1e-15)


class DrawAndStepTest(absltest.TestCase):
  """The module docstring's draws and its full-batch gradient step."""

  def test_starts_and_teachers_have_their_stated_norms(self):
    rng = np.random.default_rng(6)
    spectral = lambda w: np.linalg.norm(w, 2, axis=(1, 2))
    u, b, v = conjecture.student_start(rng, 3, 4, 5, 0.1)
    self.assertEqual((u.shape, b.shape, v.shape), ((3, 5, 4), (3, 5),
                                                   (3, 4, 5)))
    np.testing.assert_allclose(spectral(u), 0.1, rtol=1e-12)
    np.testing.assert_allclose(spectral(v), 0.1, rtol=1e-12)
    np.testing.assert_array_equal(b, 0.0)
    u, b, v = conjecture.residual_teacher(rng, 2, 4, 6, 0.7)
    np.testing.assert_allclose(spectral(u), 0.7, rtol=1e-12)
    np.testing.assert_allclose(spectral(v), 0.7, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 0.7, rtol=1e-12)
    # The plain teacher keeps E||h||^2: U entries N(0, 2/d), V N(0, 1/m).
    u, b, v = conjecture.plain_teacher(rng, 2, 200, 300)
    np.testing.assert_array_equal(b, 0.0)
    self.assertAlmostEqual(u.var() * 200 / 2, 1.0, delta=0.02)
    self.assertAlmostEqual(v.var() * 300, 1.0, delta=0.02)

  def test_a_step_is_weights_minus_rate_times_gradient(self):
    task = conjecture.make_task(2, 3, 4, [0.3], range(1), 10, 0.6)
    rate = 0.2
    run = conjecture.train_batch(task, 1, rate)
    for j, label in enumerate(task["labels"]):
      residual = label["family"] == "residual"
      weights = [task[name][j:j + 1] for name in ("u", "b", "v")]
      fixed = [tf.constant(task[name][j:j + 1]) for name in
               ("x", "y", "identity", "baseline")]
      _, gradients = conjecture.loss_and_gradient(
          *(tf.constant(w) for w in weights), *fixed)
      moved = [(w - rate * g.numpy())[0] for w, g in zip(weights, gradients)]
      self.assertAlmostEqual(
          run["loss"][1, j], numpy_loss(moved, task["x"][j], task["y"][j],
                                        residual, task["baseline"][j]),
          places=12)
      start_norm = max(np.linalg.norm(task["u"][j], 2, axis=(1, 2)).max(),
                       np.linalg.norm(task["v"][j], 2, axis=(1, 2)).max())
      self.assertAlmostEqual(run["unit_norm"][0, j], start_norm, places=12)
      self.assertAlmostEqual(
          run["gradient"][0, j],
          np.sqrt(sum(float(np.sum(g.numpy() ** 2)) for g in gradients)),
          places=12)


class ClassifyTest(absltest.TestCase):

  def test_each_outcome(self):
    steps = 8
    falling = np.geomspace(1.0, 1e-2, steps + 1)
    loss = np.stack([np.geomspace(1.0, 1e-5, steps + 1),  # reached
                     np.full(steps + 1, 0.5),             # critical
                     np.full(steps + 1, 0.5),             # plateau
                     falling,                             # descending
                     falling], axis=1)                    # diverged
    gradient = np.ones_like(loss)
    gradient[:, 1] = 1e-9
    run = {"loss": loss, "gradient": gradient,
           "unit_norm": np.ones_like(loss),
           "diverged": np.array([-1, -1, -1, -1, 3])}
    self.assertEqual(conjecture.classify(run, 1e-3, 1e-6),
                     ["reached", "stalled_critical", "plateau", "descending",
                      "diverged"])

  def test_a_near_critical_point_mid_path_is_recorded(self):
    # Three paths whose loss stays above the tolerance, except the first's
    # last step; gradients with a dip mid-path (second), at a step with the
    # loss below the tolerance (first: not counted), or none (third).
    loss = np.array([[1.0, 1.0, 1.0], [0.5, 0.6, 0.9], [0.1, 0.5, 0.8],
                     [1e-4, 0.4, 0.7]])
    gradient = np.array([[1.0, 1.0, 1.0], [0.5, 1e-8, 0.9],
                         [0.2, 0.3, 0.8], [1e-9, 0.2, 0.7]])
    run = {"loss": loss, "gradient": gradient,
           "unit_norm": np.ones_like(loss), "diverged": np.full(3, -1),
           "dead_hidden": np.zeros(3), "kink_distance": np.ones(3)}
    smallest, steps = conjecture.smallest_gradient_on_path(run, 1e-3)
    np.testing.assert_array_equal(smallest, [0.2, 1e-8, 0.7])
    np.testing.assert_array_equal(steps, [2, 1, 3])
    outcomes = conjecture.classify(run, 1e-3, 1e-6)
    # The outcome reads the last step: the dip is not a stall there.
    self.assertEqual(outcomes[0], "reached")
    self.assertNotIn("stalled_critical", outcomes)
    task = {"teacher_unit_norm": np.ones(3)}
    summary = conjecture.summarize(run, task, [0, 1, 2], outcomes, 1e-3,
                                   1e-6)
    self.assertEqual(summary["near_critical_on_path"], 1)
    self.assertEqual(summary["min_gradient_norm_above_tolerance_by_seed"],
                     [0.2, 1e-8, 0.7])
    self.assertEqual(summary["min_gradient_step_by_seed"], [2, 1, 3])


class BinaryTest(absltest.TestCase):
  """Runs bin/conjecture.py as a user does, all runs at once."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    env = dict(os.environ, BUILD_WORKING_DIRECTORY=cls.tmp.name)
    runs = {
        "small": ("--depths=1,2", "--widths=2", "--init_norms=0.1",
                  "--seeds=2", "--samples=16", "--steps=200",
                  "--output=probe.json", "--plot=probe.png"),
        "depths_text": ("--depths=two",),
        "learning_rate": ("--learning_rate=0", "--plot=never.png"),
        "tolerance_nan": ("--tolerance=nan",),
        "positional": ("probe",),
    }
    cls.results = testing.run_binaries("conjecture", runs, 3, env=env)

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def test_writes_json_and_png(self):
    report = testing.report_written(
        self, self.results["small"], os.path.join(self.tmp.name, "probe.json"),
        os.path.join(self.tmp.name, "probe.png"))
    self.assertEqual([(c["depth"], c["width"], c["init_norm"])
                      for c in report["cells"]], [(1, 2, 0.1), (2, 2, 0.1)])
    for family in conjecture.FAMILIES:
      self.assertEqual(sum(report["totals"][family].values()), 4)
      for cell in report["cells"]:
        entry = cell[family]
        self.assertEqual(entry["runs"], 2)
        self.assertEqual(sum(entry[o] for o in conjecture.OUTCOMES), 2)
        self.assertLen(entry["final_losses_by_seed"], 2)
        self.assertLen(entry["kink_distance_by_seed"], 2)
        # A run ending at a critical point met one on its path.
        self.assertGreaterEqual(entry["near_critical_on_path"],
                                entry["stalled_critical"])
      self.assertEqual(report["near_critical_on_path"][family],
                       sum(c[family]["near_critical_on_path"]
                           for c in report["cells"]))

  def test_bad_flags_are_one_line(self):
    expected = {
        "depths_text": r"--depths must be a comma-separated list of "
                       r"integers, e.g. --depths=2,4; got two",
        "learning_rate": r"--learning_rate must be > 0",
        "tolerance_nan": r"--tolerance must be a finite number",
        "positional": r"unexpected arguments probe",
    }
    for name, pattern in expected.items():
      with self.subTest(name):
        result = self.results[name]
        self.assertEqual(result.returncode, 1, result.stderr)
        self.assertNotIn("Traceback", result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertRegex(testing.last_stderr_line(result),
                         "^error: " + pattern)
    self.assertFalse(os.path.exists(os.path.join(self.tmp.name,
                                                 "never.png")))


if __name__ == "__main__":
  absltest.main()
