"""Tests of the Section 3 construction (Theorem 3.2, Lemma B.1) and bin/construct."""

import json
import math
import os
import tempfile

from absl.testing import absltest
import keras
import numpy as np

from identity_tf.theory import capacity
from identity_tf.theory import construction
from identity_tf.theory import construction_model
from identity_tf.theory import construction_run
from identity_tf.theory import construction_sgd
from identity_tf.theory import parallel
from identity_tf import layers
from identity_tf import machine
from identity_tf.data import synthetic
import testing


def dense_forward(weights, x):
  """The function weights.npz encodes, written out from its spec in plain numpy.

  Deliberately independent of identity_tf.theory.construction: no chunks, no
  float32 screening, every unit applied densely to every point.
  """
  z = np.concatenate([(x - weights["mu"]) / weights["s"],
                      np.full((len(x), 1), weights["t"])], axis=1)
  z = z / np.linalg.norm(z, axis=1, keepdims=True)
  h = z @ weights["A0"].T
  for u, v, b in zip(weights["U"], weights["V"], weights["b"]):
    h = h + np.maximum(h @ u.T + b, 0) @ v.T
  return np.maximum(h @ weights["U_out"].T + weights["b_out"], 0) @ (
      weights["V_out"].T)


def random_data(rng, n, d, r):
  return rng.standard_normal((n, d)), rng.integers(0, r, n)


def pca_by_svd(x, dim):
  """X's rows in the coordinates of their top DIM principal axes, by SVD."""
  centred = x - x.mean(axis=0)
  _, _, axes = np.linalg.svd(centred, full_matrices=False)
  return centred @ axes[:dim].T


def dense_separation(x):
  """rho: the smallest distance between X's rows on the sphere of
  Assumption 3.1 (centred, scaled to unit RMS, t = 1), by a dense Gram."""
  centred = x - x.mean(axis=0)
  scale = np.sqrt(np.mean(np.sum(centred**2, axis=1)))
  z = np.concatenate([centred / scale, np.ones((len(x), 1))], axis=1)
  z /= np.linalg.norm(z, axis=1, keepdims=True)
  gram = z @ z.T - 3 * np.eye(len(x))
  return np.sqrt(max(0.0, 2 - 2 * gram.max()))


def pca_projector(x, dim):
  """The orthogonal projector onto the top DIM principal axes of X's rows."""
  axes = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)[2][:dim]
  return axes.T @ axes


def parameters_by_formula(n, d, k, r):
  """mu, s, t, A0, L units of U, V, b, and U_out, b_out, V_out."""
  units = int(np.ceil(n / k))
  return d + 2 + k * (d + 1) + units * (2 * k * k + k) + r * k + r + r * r


def clustered_points(rng, n=600, d=1000, clusters=5, spread=0.8):
  """Points around a few centres: rho ~ 0.6 on the sphere, far below the
  ~1.4 of independent Gaussian points."""
  centres = rng.standard_normal((clusters, d))
  return (centres[rng.integers(0, clusters, n)] +
          spread * rng.standard_normal((n, d)))


class ConstructionTest(absltest.TestCase):

  def assert_fits(self, x, y, **options):
    """Constructs, then checks 100 % from numpy weights and a reloaded model.keras."""
    result = construction.construct(x, y, **options)
    weights = result.weights
    with tempfile.TemporaryDirectory() as tmp:
      construction.save_weights(weights, os.path.join(tmp, "weights.npz"))
      saved = construction.load_weights(os.path.join(tmp, "weights.npz"))
      construction_model.build_keras_model(weights).save(
          os.path.join(tmp, "model.keras"))
      model = keras.models.load_model(os.path.join(tmp, "model.keras"))
    numpy_logits = dense_forward(saved, x)
    np.testing.assert_array_equal(np.argmax(numpy_logits, axis=1), y)
    np.testing.assert_array_equal(
        np.argmax(construction_model.keras_logits(model, x), axis=1), y)
    # The library's chunked, screened evaluation is the same function, to
    # float64 round-off: on badly separated data V_j grows like 1/rho^2 and
    # scales each unit's rounding (which BLAS kernel sums in which order
    # differs between CPUs), so the tolerance is eps * |V| per unit input.
    k = weights["U"].shape[1]
    atol = 1e-9 + 16 * (k + 1) * np.finfo(np.float64).eps * np.max(
        np.abs(saved["V"]), initial=0.0)
    np.testing.assert_allclose(construction.evaluate(saved, x), numpy_logits,
                               rtol=0, atol=atol)
    self.assertEqual(model.num_units, weights["U"].shape[0])
    self.assertEqual(
        sum(isinstance(layer, layers.DenseResidualUnit)
            for layer in model._flatten_layers(include_self=False)),
        weights["U"].shape[0])
    return result

  def test_random_data_of_several_shapes(self):
    rng = np.random.default_rng(1)
    for n, d, r in [(1, 3, 1), (2, 1, 2), (60, 2, 7), (150, 9, 3),
                    (80, 40, 10)]:
      with self.subTest(n=n, d=d, r=r):
        x, y = random_data(rng, n, d, r)
        result = self.assert_fits(x, y, num_classes=r)
        weights = result.weights
        k, num_units = result.k, result.num_units
        self.assertEqual(num_units, -(-n // k))
        self.assertEqual(weights["A0"].shape, (k, d + 1))
        self.assertEqual(weights["U"].shape, (num_units, k, k))
        self.assertEqual(weights["V"].shape, (num_units, k, k))
        self.assertEqual(weights["b"].shape, (num_units, k))
        self.assertEqual(weights["V_out"].shape[0], r)
        self.assertGreater(float(weights["s"]), 0)
        self.assertGreaterEqual(float(weights["t"]), 0)

  def test_johnson_lindenstrauss_regime(self):
    # Unit vectors in high dimension: the theorem's own setting (t = 0) and
    # well separated, so a Gaussian A0 to k = 32 ln n / rho^2 < n keeps the
    # lemma valid.
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 3000))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, 5, 300)
    result = self.assert_fits(x, y, johnson_lindenstrauss=True)
    self.assertEqual(result.mode, "johnson-lindenstrauss")
    self.assertIsNone(result.jl_fallback)
    rho = np.sqrt(2 - 2 * np.max(x @ x.T - 2 * np.eye(300)))
    self.assertAlmostEqual(result.rho, rho, delta=1e-9)
    self.assertEqual(result.k, int(np.ceil(32 * np.log(300) / rho**2)))
    self.assertLess(result.k, 300)
    self.assertEqual(float(result.weights["t"]), 0.0)
    np.testing.assert_array_equal(result.weights["mu"], 0)

  def test_johnson_lindenstrauss_projection_keeps_distances_within_rho_2(self):
    # The claim behind k = ceil(32 ln n / rho^2) (Theorem 3.2's
    # k = O(log n / rho^2)): the Gaussian A0 keeps every distance between
    # the n points within a factor 1 +- rho / 2. Unit vectors are on the
    # sphere already (mu = 0, s = 1, t = 0), so the points A0 projects are
    # the inputs themselves; distances by NumPy, pair by pair.
    rng = np.random.default_rng(30)
    n = 120
    x = rng.standard_normal((n, 1500))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, 3, n)
    upper = np.triu_indices(n, 1)

    def distances(points):
      return np.linalg.norm(points[:, None] - points[None], axis=-1)[upper]

    original = distances(x)
    rho = original.min()
    k = int(np.ceil(32 * np.log(n) / rho**2))
    self.assertLess(k, n)  # Narrower than the lossless span: JL is taken.
    for seed in range(3):
      with self.subTest(seed=seed):
        result = construction.construct(x, y, seed=seed,
                                        johnson_lindenstrauss=True)
        self.assertEqual((result.mode, result.k), ("johnson-lindenstrauss",
                                                   k))
        weights = result.weights
        self.assertEqual((float(weights["s"]), float(weights["t"])),
                         (1.0, 0.0))
        np.testing.assert_array_equal(weights["mu"], 0)
        ratio = distances(x @ weights["A0"][:, :-1].T) / original
        self.assertBetween(ratio.min(), 1 - rho / 2, 1.0)
        self.assertBetween(ratio.max(), 1.0, 1 + rho / 2)
    # The bound has teeth: a Gaussian to a tenth of that width breaks it.
    narrow = rng.standard_normal((k // 10, 1500)) / np.sqrt(k // 10)
    ratio = distances(x @ narrow.T) / original
    self.assertGreater(np.abs(ratio - 1).max(), rho / 2)

  def test_clustered_data_with_labels_independent_of_clusters(self):
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((4, 6)) * 10
    x = (centres[rng.integers(0, 4, 240)] +
         1e-2 * rng.standard_normal((240, 6)))
    y = rng.integers(0, 3, 240)
    result = self.assert_fits(x, y)
    self.assertLess(result.rho, 0.05)

  def test_points_on_one_ray(self):
    # Without the extra coordinate t these all map to one point of the sphere.
    direction = np.random.default_rng(4).standard_normal(5)
    scales = np.concatenate([np.arange(1, 151), [1e3, 1e4]])
    x = scales[:, None] * direction
    y = np.arange(len(x)) % 3
    result = self.assert_fits(x, y)
    self.assertGreater(float(result.weights["t"]), 0)

  def test_close_pair_just_above_the_smallest_separation(self):
    # On the unit sphere already (t = 0): a pair 3 rho_min apart with
    # different labels is fitted, in float64, by both networks.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((20, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    rho_min = construction.smallest_separation(4)
    normal = np.cross(x[0], x[5])
    normal /= np.linalg.norm(normal)
    angle = 3 * rho_min
    x[1] = np.cos(angle) * x[0] + np.sin(angle) * np.cross(normal, x[0])
    y = np.arange(20) % 2
    result = self.assert_fits(x, y)
    self.assertEqual(result.k, 4)
    self.assertAlmostEqual(result.rho, angle, delta=1e-3 * angle)
    x[1] = np.cos(angle / 6) * x[0] + np.sin(angle / 6) * np.cross(normal, x[0])
    with self.assertRaisesRegex(ValueError, r"inputs 0 and 1 .* below the "
                                r"smallest separation"):
      construction.construct(x, y)

  def test_pair_below_the_smallest_separation_is_an_error(self):
    x = np.random.default_rng(6).standard_normal((10, 3))
    x[7] = x[2] * (1 + 1e-9)
    y = np.arange(10) % 2
    with self.assertRaisesRegex(ValueError,
                                r"inputs 2 and 7 .*smallest separation"):
      construction.construct(x, y)

  def test_every_unit_moves_its_own_points_and_leaves_the_rest(self):
    # Lemma B.1, per unit: owned points land on their surrogate, every other
    # current point (not yet moved, or already on a surrogate) is unchanged
    # bit for bit.
    rng = np.random.default_rng(7)
    x, y = random_data(rng, 90, 4, 4)
    result = construction.construct(x, y)
    weights = result.weights
    surrogates = weights["U_out"]
    labels = y[result.distinct]
    h = construction.embed(weights, x[result.distinct])
    self.assertGreater(result.num_units, 10)
    for unit in range(result.num_units):
      after = h + np.maximum(h @ weights["U"][unit].T + weights["b"][unit],
                             0) @ weights["V"][unit].T
      own = result.owner == unit
      self.assertTrue(own.any())
      np.testing.assert_array_equal(after[~own], h[~own])
      np.testing.assert_allclose(after[own], surrogates[labels[own]],
                                 atol=1e-12)
      h = after
    np.testing.assert_allclose(h, surrogates[labels], atol=1e-12)

  def test_duplicates(self):
    x = np.random.default_rng(8).standard_normal((12, 2))
    y = np.arange(12) % 3
    same = np.concatenate([x, x[[4, 4, 9]]])
    result = self.assert_fits(same, np.concatenate([y, y[[4, 4, 9]]]))
    self.assertLen(result.distinct, 12)
    with self.assertRaisesRegex(ValueError, r"^inputs 5 and 12 are identical"):
      construction.construct(np.concatenate([x, x[[5]]]),
                             np.concatenate([y, [y[5] + 1]]))

  def test_invalid_input(self):
    x = np.zeros((3, 2))
    for bad_x, bad_y, message in [
        (np.zeros((0, 2)), np.zeros(0, int), "empty input"),
        (x, np.zeros(2, int), "mismatched lengths"),
        (np.array([[0, 1], [np.nan, 0]]), [0, 1], r"x\[1\] contains NaN"),
        (np.array([[0, 1], [np.inf, 0]]), [0, 1], r"x\[1\] contains NaN or Inf"),
        (np.eye(2), [0, -1], r"y\[1\] = -1 is outside"),
        (np.eye(2), [0.5, 1], r"y\[0\] = 0.5 is not an integer"),
        # A label of 10^12 would need 10^12 surrogate vectors.
        (np.eye(2), [0, 10**12], r"y\[1\] = 1000000000000 is not a label "
         r"below 1,000,000.*np.unique"),
    ]:
      with self.subTest(message=message):
        with self.assertRaisesRegex(ValueError, message):
          construction.construct(bad_x, bad_y)
    with self.assertRaisesRegex(ValueError, r"outside \[0, 2\)"):
      construction.construct(np.eye(3), [0, 1, 2], num_classes=2)

  def test_blocked_computations_match_direct_ones(self):
    # Memory O(n k): Gram maxima and the forward pass work in blocks and
    # chunks; with tiny blocks they must still be exact.
    rng = np.random.default_rng(9)
    points = rng.standard_normal((333, 7))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    gram = points @ points.T
    np.fill_diagonal(gram, -np.inf)
    x, y = random_data(rng, 333, 6, 5)
    old = construction.BLOCK, construction.CHUNK
    try:
      construction.BLOCK, construction.CHUNK = 50, 37
      best, (i, j) = construction.max_inner_product(points)
      result = construction.construct(x, y)
      logits = construction.evaluate(result.weights, x)
    finally:
      construction.BLOCK, construction.CHUNK = old
    self.assertAlmostEqual(best, gram.max(), delta=1e-14)
    self.assertAlmostEqual(points[i] @ points[j], gram.max(), delta=1e-14)
    self.assertNotEqual(i, j)
    np.testing.assert_allclose(logits, dense_forward(result.weights, x),
                               atol=1e-9)
    np.testing.assert_array_equal(np.argmax(logits, axis=1), y)

  def test_parameters_grow_like_n_log_n(self):
    # Well-separated points (unit vectors in d = 2000) and the
    # Johnson-Lindenstrauss option: k = O(log n), so the residual units'
    # parameters / (n log n) stay bounded while n grows 8x (the lossless
    # k = n would make them grow like n / log n).
    rng = np.random.default_rng(10)
    ratios = []
    for n in (200, 1600):
      x = rng.standard_normal((n, 2000))
      x /= np.linalg.norm(x, axis=1, keepdims=True)
      result = construction.construct(x, rng.integers(0, 2, n),
                                      johnson_lindenstrauss=True)
      self.assertEqual(result.mode, "johnson-lindenstrauss")
      ratios.append(construction.residual_parameters(result.weights) /
                    (n * np.log(n)))
    self.assertLess(ratios[1], 1.5 * ratios[0])

  def test_images_of_a_dataset(self):
    # The input pipeline's loader (tests/any_dataset_test.py runs the binary
    # on a TFDS dataset prepared from files).
    x, y, classes = construction_run.load_dataset("synthetic", 30)
    images, labels = synthetic.arrays("train")
    np.testing.assert_array_equal(x, images[:30].reshape(30, -1))
    np.testing.assert_array_equal(y, labels[:30])
    self.assertEqual(classes, 10)
    self.assert_fits(x, y, num_classes=classes)

  def test_sgd_contrast_runs(self):
    rng = np.random.default_rng(11)
    x, y = random_data(rng, 24, 3, 2)
    history, _ = construction_sgd.train_by_sgd(x, y, 2, 4, 6, steps=4,
                                               batch_size=8)
    self.assertEqual(history[-1][0], 4)
    for _, fit in history:
      self.assertBetween(fit, 0.0, 1.0)


class FormulaTest(absltest.TestCase):
  """Section 3's closed forms and Assumption 3.1's map onto the sphere,
  against the numbers the docstrings and the paper state."""

  def test_widths_separation_and_parameter_counts(self):
    u = np.finfo(np.float64).eps / 2
    for k, stated in ((3, 3.0e-6), (65, 1.1e-5), (785, 3.8e-5),
                      (3073, 7.4e-5)):
      rho = construction.smallest_separation(k)
      self.assertAlmostEqual(rho, math.sqrt(16.16e3 * (k + 2) * u),
                             delta=1e-12 * rho)
      self.assertAlmostEqual(rho / stated, 1.0, delta=0.05)
    # ceil(32 ln n / rho^2), at least 2; no width separates coincident
    # points.
    self.assertEqual(construction.jl_width(300, 0.5),
                     math.ceil(32 * math.log(300) / 0.25))
    self.assertEqual(construction.jl_width(1, 10.0), 2)
    self.assertEqual(construction.jl_width(5, 0.0), math.inf)
    self.assertEqual(construction.lossless_width(100, 11), 11)
    self.assertEqual(construction.lossless_width(4, 11), 4)
    rng = np.random.default_rng(40)
    x, y = random_data(rng, 30, 4, 3)
    result = construction.construct(x, y, num_classes=3)
    k, units = result.k, result.num_units
    self.assertEqual(construction.residual_parameters(result.weights),
                     units * (2 * k * k + k))
    self.assertEqual(construction.count_parameters(result.weights),
                     capacity.formula_parameters(30, 4, k, 3))
    self.assertEqual(capacity.formula_parameters(30, 4, k, 3),
                     4 + 2 + k * 5 + units * (2 * k * k + k) + 3 * k + 3 + 9)
    self.assertAlmostEqual(capacity.bound(30, 3), 30 * math.log(30) + 9)
    self.assertAlmostEqual(capacity.bound(1, 2), math.log(2) + 4)
    self.assertAlmostEqual(
        construction.parameter_ratio(result.weights, 30, 3),
        construction.count_parameters(result.weights)
        / (30 * math.log(30) + 9))

  def test_inputs_map_onto_the_unit_sphere(self):
    rng = np.random.default_rng(41)
    x = 3.0 + 2.0 * rng.standard_normal((50, 4))
    mu, s, t = construction.normalization(x)
    np.testing.assert_allclose(mu, x.mean(axis=0))
    self.assertAlmostEqual(
        s, math.sqrt(np.mean(np.sum((x - x.mean(axis=0)) ** 2, axis=1))))
    self.assertEqual(t, 1.0)
    z = construction.to_sphere(x, mu, s, t)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), 1.0, rtol=1e-12)
    expected = np.concatenate([(x - mu) / s, np.ones((50, 1))], axis=1)
    np.testing.assert_allclose(
        z, expected / np.linalg.norm(expected, axis=1, keepdims=True),
        rtol=1e-12)
    # Already on the sphere: kept as they are (mu = 0, s = 1, t = 0).
    on_sphere = x / np.linalg.norm(x, axis=1, keepdims=True)
    mu, s, t = construction.normalization(on_sphere)
    self.assertEqual((s, t), (1.0, 0.0))
    np.testing.assert_array_equal(mu, 0.0)
    np.testing.assert_allclose(
        construction.to_sphere(on_sphere, mu, s, t)[:, :4], on_sphere,
        rtol=1e-12)


class ParallelTest(absltest.TestCase):

  def test_uses_the_cores_of_the_process(self):
    try:
      expected = len(os.sched_getaffinity(0))
    except AttributeError:
      expected = os.cpu_count()
    self.assertEqual(machine.available_cores(), expected)

  def test_results_in_order_and_progress_counted_by_size(self):
    lines = []
    old = parallel.PROGRESS_SECONDS
    try:
      parallel.PROGRESS_SECONDS = -1.0  # A line after every item.
      results = parallel.map_with_progress(
          lambda item: item * item, [3, 1, 4, 1, 5], lines.append,
          lambda done, total: f"{done}/{total}", size=lambda item: item)
    finally:
      parallel.PROGRESS_SECONDS = old
    self.assertEqual(results, [9, 1, 16, 1, 25])
    self.assertLen(lines, 5)
    self.assertEqual(lines[-1], "14/14")

  def test_results_do_not_depend_on_the_number_of_cores(self):
    # Many blocks and chunks, one core or more than there are: the same bits.
    rng = np.random.default_rng(16)
    x, y = random_data(rng, 400, 5, 3)
    points = construction.to_sphere(x, *construction.normalization(x))
    runs = []
    old = (construction.BLOCK, construction.CHUNK, machine.available_cores)
    try:
      construction.BLOCK, construction.CHUNK = 40, 23
      for cores in (1, 3, 64):
        machine.available_cores = lambda cores=cores: cores
        result = construction.construct(x, y)
        runs.append((construction.max_inner_product(points), result.weights,
                     construction.evaluate(result.weights, x)))
    finally:
      construction.BLOCK, construction.CHUNK, machine.available_cores = old
    for maximum, weights, logits in runs[1:]:
      self.assertEqual(maximum, runs[0][0])
      for key in weights:
        np.testing.assert_array_equal(weights[key], runs[0][1][key])
      np.testing.assert_array_equal(logits, runs[0][2])
    np.testing.assert_allclose(runs[0][2], dense_forward(runs[0][1], x),
                               atol=1e-9)


class SavedModelTest(absltest.TestCase):

  def test_a_model_keras_written_before_the_move_loads(self):
    # Written by identity_tf/construction_model.py at commit 5d502b4, before
    # the module moved to identity_tf/theory/: the layers are registered
    # under the package name "identity_tf", not the module path, so the file
    # loads once the construction's layers are registered (the import at
    # the top of this file), and computes the logits it computed then.
    testdata = os.path.join(testing.source_root(), "tests", "testdata")
    model = keras.models.load_model(
        os.path.join(testdata, "construction_5d502b4.keras"))
    with np.load(os.path.join(testdata,
                              "construction_5d502b4_io.npz")) as data:
      x, y, logits = data["x"], data["y"], data["logits"]
    self.assertIsInstance(model, construction_model.ResidualConstruction)
    self.assertEqual(x.shape, (40, 5))
    np.testing.assert_allclose(construction_model.keras_logits(model, x),
                               logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.argmax(logits, axis=1), y)


class CapacityTest(absltest.TestCase):
  """Theorem 3.2 read on data: the sweep, the reductions, the
  Johnson-Lindenstrauss option and the held-out accuracy."""

  def test_sweep_counts_match_independent_constructions(self):
    rng = np.random.default_rng(20)
    x, y = random_data(rng, 300, 12, 4)
    x_test, y_test = random_data(rng, 25, 12, 4)
    rows = capacity.sweep(x, y, 4, [8, 40, 300], [12, 5], method="pca",
                          x_test=x_test, y_test=y_test)
    self.assertEqual([(row["n"], row["d"]) for row in rows],
                     [(8, 12), (8, 5), (40, 12), (40, 5), (300, 12),
                      (300, 5)])
    for row in rows:
      with self.subTest(n=row["n"], d=row["d"]):
        n, dim = row["n"], row["d"]
        points = x[:n] if dim == 12 else pca_by_svd(x[:n], dim)
        built = construction.construct(points, y[:n], num_classes=4)
        k = min(n, dim + 1)  # lossless: the span, or all of R^(d+1)
        self.assertEqual((row["k"], built.k), (k, k))
        self.assertEqual(row["L"], int(np.ceil(n / k)))
        self.assertEqual(row["parameters"],
                         construction.count_parameters(built.weights))
        self.assertEqual(row["parameters"],
                         parameters_by_formula(n, dim, k, 4))
        self.assertAlmostEqual(row["n_log_n_plus_r2"], n * np.log(n) + 16)
        self.assertAlmostEqual(row["ratio"],
                               row["parameters"] / row["n_log_n_plus_r2"])
        self.assertAlmostEqual(row["rho"], dense_separation(points),
                               delta=1e-9)
        self.assertTrue(row["fitted"])
        self.assertEqual(row["test_examples"], 25)
        self.assertBetween(row["test_accuracy"], 0.0, 1.0)

  def test_reductions_give_points_of_that_dimension_fitted_exactly(self):
    rng = np.random.default_rng(21)
    x, y = random_data(rng, 200, 30, 3)
    for method in capacity.REDUCTIONS:
      with self.subTest(method=method):
        mapping = capacity.reduction(x, 6, method, seed=4)
        points = mapping.apply(x)
        self.assertEqual(points.shape, (200, 6))
        if method == "pca":  # The same subspace: the same distances.
          reference = pca_by_svd(x, 6)
          np.testing.assert_allclose(points @ points.T,
                                     reference @ reference.T, atol=1e-9)
        else:  # Seeded: the same map for any points of that d.
          np.testing.assert_array_equal(
              capacity.reduction(x[:7], 6, method, seed=4).matrix,
              mapping.matrix)
        result = construction.construct(points, y)
        np.testing.assert_array_equal(
            np.argmax(dense_forward(result.weights, points), axis=1), y)
    self.assertIsNone(capacity.reduction(x, 30, "pca"))
    with self.assertRaisesRegex(ValueError, r"cannot reduce d = 30 inputs "
                                r"to 31 coordinates"):
      capacity.reduction(x, 31, "random")

  def test_johnson_lindenstrauss_on_clustered_data_falls_back(self):
    rng = np.random.default_rng(22)
    x = clustered_points(rng)
    y = rng.integers(0, 3, len(x))
    lines = []
    result = construction.construct(x, y, johnson_lindenstrauss=True,
                                    log=lines.append)
    rho = dense_separation(x)
    k = int(np.ceil(32 * np.log(600) / rho**2))
    self.assertLess(k, 600)  # It was worth trying: narrower than lossless.
    self.assertRegex(result.jl_fallback, rf"^Johnson-Lindenstrauss: the "
                     rf"projection to k = {k} lost the separation in 3 "
                     rf"draws .*falling back to the unprojected "
                     rf"construction \(k = 600\)$")
    self.assertNotIn("\n", result.jl_fallback)
    self.assertIn(result.jl_fallback, lines)
    self.assertEqual((result.mode, result.k), ("span", 600))
    np.testing.assert_array_equal(
        np.argmax(dense_forward(result.weights, x), axis=1), y)
    # Without the option nothing is tried and nothing is said.
    plain = construction.construct(x, y)
    self.assertIsNone(plain.jl_fallback)
    self.assertEqual(plain.k, 600)

  def test_more_dimensions_than_points(self):
    # d = 500, n = 100: the lossless A0 maps onto the points' span (k = n),
    # which the Johnson-Lindenstrauss width (190) does not beat.
    rng = np.random.default_rng(0)
    x, y = random_data(rng, 100, 500, 5)
    result = construction.construct(x, y, num_classes=5,
                                    johnson_lindenstrauss=True)
    self.assertEqual((result.mode, result.k, result.num_units),
                     ("span", 100, 1))
    self.assertRegex(result.jl_fallback, r"k = \d+ .* is no narrower than "
                     r"the lossless k = 100")
    self.assertEqual(construction.count_parameters(result.weights),
                     parameters_by_formula(100, 500, 100, 5))
    a0 = result.weights["A0"]
    z = construction.to_sphere(x, *construction.normalization(x))
    np.testing.assert_allclose((z @ a0.T) @ (z @ a0.T).T, z @ z.T,
                               atol=1e-12)  # An isometry on the points.
    np.testing.assert_array_equal(
        np.argmax(dense_forward(result.weights, x), axis=1), y)

  def test_held_out_accuracy_matches_a_numpy_forward_pass(self):
    rng = np.random.default_rng(23)
    x, y = random_data(rng, 150, 8, 3)
    # Training points, points very near them, and fresh points, all in the
    # PCA coordinates of the training points (computed here by SVD).
    x_test = np.concatenate([x[:30], x[30:60] + 1e-9,
                             rng.standard_normal((40, 8))])
    y_test = np.concatenate([y[:60], rng.integers(0, 3, 40)])
    centred = x - x.mean(axis=0)
    axes = np.linalg.svd(centred, full_matrices=False)[2][:5]
    points, test_points = centred @ axes.T, (x_test - x.mean(axis=0)) @ axes.T
    result = construction.construct(points, y)
    figures = capacity.held_out(result.weights, test_points, y_test)
    logits = dense_forward(result.weights, test_points)
    self.assertEqual(figures["test_accuracy"],
                     np.mean(np.argmax(logits, axis=1) == y_test))
    self.assertEqual(figures["test_zero_logits"],
                     np.mean(np.all(logits == 0, axis=1)))
    self.assertEqual(figures["test_examples"], 100)


class RunTest(absltest.TestCase):

  def test_an_output_dir_that_is_a_file_is_refused_before_any_work(self):
    x, y = random_data(np.random.default_rng(14), 12, 3, 2)
    with tempfile.TemporaryDirectory() as tmp:
      a_file = os.path.join(tmp, "file")
      with open(a_file, "w") as f:
        f.write("x")
      lines = []
      with self.assertRaisesRegex(ValueError, r"--output_dir=.*file cannot be "
                                  r"created \(.*\); give a directory"):
        construction_run.run(x, y, a_file, log=lines.append)
      self.assertEqual(lines, [])  # Nothing was constructed first.

  def test_report_is_strict_json_when_nothing_is_checked(self):
    x, y = random_data(np.random.default_rng(15), 12, 3, 2)
    with tempfile.TemporaryDirectory() as tmp:
      construction_run.run(x, y, tmp, keras_check_examples=0,
                           log=lambda line: None)
      with open(os.path.join(tmp, "report.json")) as f:
        text = f.read()

    def refuse(constant):
      raise ValueError(f"{constant} is not JSON")

    report = json.loads(text, parse_constant=refuse)
    self.assertIsNone(report["keras_accuracy"])
    self.assertEqual(report["keras_checked"], 0)


class BinaryTest(absltest.TestCase):

  def test_fits_npz_and_writes_the_network(self):
    rng = np.random.default_rng(12)
    x, y = random_data(rng, 120, 5, 4)
    with tempfile.TemporaryDirectory() as tmp:
      np.savez(os.path.join(tmp, "points.npz"), x=x, y=y)
      testing.run_binary("construct", f"--data={tmp}/points.npz",
                         f"--output_dir={tmp}/out", "--seed=3", check=True)
      with open(os.path.join(tmp, "out", "report.json")) as f:
        report = json.load(f)
      weights = construction.load_weights(os.path.join(tmp, "out",
                                                        "weights.npz"))
      model = keras.models.load_model(os.path.join(tmp, "out", "model.keras"))
    self.assertEqual(sorted(weights), sorted(
        ["mu", "s", "t", "A0", "U", "V", "b", "U_out", "b_out", "V_out"]))
    np.testing.assert_array_equal(
        np.argmax(dense_forward(weights, x), axis=1), y)
    np.testing.assert_array_equal(
        np.argmax(construction_model.keras_logits(model, x), axis=1), y)
    k, num_units = weights["A0"].shape[0], weights["U"].shape[0]
    self.assertEqual((report["n"], report["d"], report["r"]), (120, 5, 4))
    self.assertEqual((report["k"], report["L"]), (k, num_units))
    self.assertEqual(report["parameters"],
                     sum(np.size(v) for v in weights.values()))
    self.assertAlmostEqual(
        report["ratio"], report["parameters"] / (120 * np.log(120) + 16))
    self.assertEqual(report["training_accuracy"], 1.0)
    self.assertGreater(report["rho"], 0)
    self.assertIn("rho_prime", report)
    self.assertIn("seconds", report)

  def test_sweep_writes_json_and_png_and_prints_one_object(self):
    rng = np.random.default_rng(24)
    x, y = random_data(rng, 90, 10, 3)
    x_test, y_test = random_data(rng, 20, 10, 3)
    with tempfile.TemporaryDirectory() as tmp:
      np.savez(os.path.join(tmp, "points.npz"), x=x, y=y, x_test=x_test,
               y_test=y_test)
      result = testing.run_binary(
          "construct", f"--data={tmp}/points.npz", f"--output_dir={tmp}/out",
          "--sweep_n=30,90", "--sweep_dims=10,4", "--reduce=random",
          "--sgd_steps=3", "--sgd_batch_size=8", check=True)
      with open(os.path.join(tmp, "out", "sweep.json")) as f:
        report = json.load(f)
      with open(os.path.join(tmp, "out", "sweep.png"), "rb") as f:
        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    summary = json.loads(result.stdout)  # One JSON object, nothing else.
    self.assertLen(summary["rows"], 4)
    for row, printed in zip(report["rows"], summary["rows"]):
      with self.subTest(n=row["n"], d=row["d"]):
        n, dim = row["n"], row["d"]
        # The seeded Gaussian projection, as the docs describe it.
        matrix = np.random.default_rng((0, dim)).standard_normal((10, dim))
        points = x[:n] if dim == 10 else x[:n] @ matrix / np.sqrt(dim)
        built = construction.construct(points, y[:n])
        self.assertEqual(printed["parameters"], row["parameters"])
        self.assertEqual(row["parameters"],
                         construction.count_parameters(built.weights))
        self.assertEqual(row["reduce"], "none" if dim == 10 else "random")
        self.assertTrue(row["fitted"])
        test_points = x_test if dim == 10 else x_test @ matrix / np.sqrt(dim)
        self.assertEqual(row["test_accuracy"], np.mean(np.argmax(
            dense_forward(built.weights, test_points), axis=1) == y_test))
        # The SGD contrast at the smallest n only, on the same test points.
        if n == 30:
          self.assertEqual(row["sgd_history"][-1]["step"], 3)
          self.assertBetween(row["sgd_test_accuracy"], 0.0, 1.0)
          self.assertEqual(printed["sgd_test_accuracy"],
                           row["sgd_test_accuracy"])
        else:
          self.assertNotIn("sgd_test_accuracy", row)
    self.assertEqual(report["sgd"], {"steps": 3, "batch_size": 8,
                                     "learning_rate": 0.1, "at_n": 30})

  def test_reduced_run_reports_both_test_accuracies(self):
    rng = np.random.default_rng(25)
    x, y = random_data(rng, 60, 9, 3)
    x_test, y_test = random_data(rng, 15, 9, 3)
    with tempfile.TemporaryDirectory() as tmp:
      np.savez(os.path.join(tmp, "points.npz"), x=x, y=y, x_test=x_test,
               y_test=y_test)
      result = testing.run_binary(
          "construct", f"--data={tmp}/points.npz", f"--output_dir={tmp}/out",
          "--reduced_dim=4", "--sgd_steps=3", "--keras_check_examples=0",
          check=True)
      with open(os.path.join(tmp, "out", "report.json")) as f:
        report = json.load(f)
      weights = construction.load_weights(os.path.join(tmp, "out",
                                                        "weights.npz"))
      with np.load(os.path.join(tmp, "out", "reduction.npz")) as saved:
        mean, matrix = saved["mean"], saved["matrix"]
    summary = json.loads(result.stdout)
    np.testing.assert_allclose(mean, x.mean(axis=0))
    np.testing.assert_allclose(  # The PCA subspace of the training points.
        matrix @ matrix.T, pca_projector(x, 4), atol=1e-9)
    logits = dense_forward(weights, (x_test - mean) @ matrix)
    self.assertEqual(report["test_accuracy"],
                     np.mean(np.argmax(logits, axis=1) == y_test))
    self.assertEqual((report["d"], report["d_raw"], report["reduce"]),
                     (4, 9, "pca"))
    self.assertEqual(report["training_accuracy"], 1.0)
    self.assertBetween(report["sgd_test_accuracy"], 0.0, 1.0)
    for key in ("parameters", "n_log_n_plus_r2", "ratio", "test_accuracy",
                "sgd_test_accuracy"):
      self.assertEqual(summary[key], report[key])

  def test_bad_sweep_flags_are_one_line(self):
    x, y = random_data(np.random.default_rng(26), 40, 5, 2)
    cases = {
        ("--sweep_n=10,abc",): r"--sweep_n=10,abc: 'abc' is not a positive "
                               r"integer",
        ("--sweep_n=0",): r"--sweep_n=0: '0' is not a positive integer",
        ("--sweep_dims=3",): r"--sweep_dims needs --sweep_n",
        ("--sweep_n=10", "--reduced_dim=3"): r"--reduced_dim is for one "
                                             r"construction",
        ("--sweep_n=10,41",): r"asks for 41 points but .* has 40 training "
                              r"points",
        ("--sweep_n=10", "--sweep_dims=6"): r"asks for 6 coordinates but the "
                                            r"inputs have d = 5",
        ("--reduced_dim=6",): r"--reduced_dim=6 exceeds the inputs' d = 5",
    }
    with tempfile.TemporaryDirectory() as tmp:
      np.savez(os.path.join(tmp, "points.npz"), x=x, y=y)
      results = testing.run_binaries(
          "construct", {flags: (f"--data={tmp}/points.npz",
                                f"--output_dir={tmp}/out", *flags)
                        for flags in cases}, 4)
    for flags, result in results.items():
      with self.subTest(flags=flags):
        self.assertEqual(result.returncode, 1)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertLen(lines, 1)
        self.assertStartsWith(lines[0], "error: ")
        self.assertRegex(lines[0], cases[flags])
        self.assertEqual(result.stdout, "")

  def test_bad_input_is_one_line(self):
    # Every message is checked in-process by ConstructionTest.test_invalid_input
    # and test_duplicates; here the binary's handling of the three paths
    # (a data error, a label error, an unprepared TFDS dataset), each one
    # TensorFlow start-up, run side by side.
    x = np.random.default_rng(13).standard_normal((6, 2))
    cases = {
        "conflict": (np.concatenate([x, x[[2]]]), [0, 1, 0, 1, 0, 1, 1],
                     r"inputs 2 and 6 are identical but labelled 0 and 1"),
        "label": (x, [0, 1, 0, 1, -2, 1], r"y\[4\] = -2 is outside"),
        # The input pipeline's message: one for every binary.
        "tfds": (None, None, r"^error: dataset mnist is not prepared in "
                 r"--data_dir=(\S+) .*//bin:prepare_data -- --dataset=mnist "
                 r"--data_dir=\1'"),
    }
    with tempfile.TemporaryDirectory() as tmp:
      empty_dir = os.path.join(tmp, "no_datasets")
      os.makedirs(empty_dir)
      runs = {"tfds": ("--dataset=mnist", "--num_examples=10",
                       f"--data_dir={empty_dir}",
                       f"--output_dir={tmp}/out_tfds")}
      for name in ("conflict", "label"):
        bad_x, bad_y, _ = cases[name]
        np.savez(os.path.join(tmp, name + ".npz"), x=bad_x, y=bad_y)
        runs[name] = (f"--data={tmp}/{name}.npz",
                      f"--output_dir={tmp}/out_{name}")
      results = testing.run_binaries("construct", runs, 3)
    for name, result in results.items():
      with self.subTest(name=name):
        self.assertNotEqual(result.returncode, 0)
        self.assertNotIn("Traceback", result.stderr)
        line = testing.last_stderr_line(result)
        self.assertStartsWith(line, "error: ")
        self.assertRegex(line, cases[name][2])

  def test_flag_errors_need_no_tensorflow(self):
    result = testing.run_binary("construct", "--output_dir=out")
    self.assertEqual(result.returncode, 1)
    self.assertIn("give exactly one of --data=points.npz or "
                  "--dataset=NAME --num_examples=N", testing.flag_error(result))
    self.assertNotIn("Traceback", result.stderr)


if __name__ == "__main__":
  absltest.main()
