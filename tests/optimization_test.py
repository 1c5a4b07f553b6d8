"""Tests of identity_tf/training/optimization.py and the training loss:
schedules, clipping, AGC, warm-up, weight averaging, label smoothing, mixup.

Every stabiliser is checked against the formula of its paper computed here
in NumPy, and clipping under two replicas (two logical CPUs) against one.
"""

import dataclasses
import math

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import model as model_lib
from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import evaluation
from identity_tf.training import optimization
from identity_tf.training import run as run_lib
from identity_tf.training import step as step_lib
from identity_tf.training import trainer
import testing

# Two logical CPUs for MirroredStrategy, set before TensorFlow starts.
_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _CPU, [tf.config.LogicalDeviceConfiguration()] * 2)


def _numpy_unit_norms(array):
  """NFNets' unit-wise norm written out: a kernel's per output unit (its
  last axis), a vector's or a scalar's as a whole."""
  array = np.asarray(array, np.float64)
  if array.ndim <= 1:
    return np.sqrt(np.sum(array ** 2))
  return np.sqrt(np.sum(np.square(array), axis=tuple(range(array.ndim - 1)),
                        keepdims=True))


class ClippingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    shapes = [(3, 3, 2, 4), (5, 3), (4,), ()]
    self.weights = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    # Units at zero, where AGC's epsilon floor sets the limit: a kernel's
    # output channel and a scalar.
    self.weights[0][..., 1] = 0.0
    self.weights[3] = np.zeros((), np.float32)
    self.gradients = [10 * rng.standard_normal(s).astype(np.float32)
                      for s in shapes]

  def _clipped(self, **options):
    factors, norm = optimization.clip_factors(
        [tf.constant(g) for g in self.gradients],
        [tf.constant(w) for w in self.weights], **options)
    return [g if f is None else (g * f).numpy()
            for g, f in zip(self.gradients, factors)], float(norm)

  def test_global_norm_clipping_is_pascanus(self):
    norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                         for g in self.gradients))
    for limit in (1.0, 1e6):
      clipped, reported = self._clipped(grad_clip_norm=limit)
      self.assertAlmostEqual(reported, norm, places=3)
      for g, c in zip(self.gradients, clipped):
        np.testing.assert_allclose(c, g * min(1.0, limit / norm), rtol=1e-5)
    clipped, _ = self._clipped(grad_clip_norm=1.0)
    self.assertAlmostEqual(
        math.sqrt(sum(float(np.sum(c ** 2)) for c in clipped)), 1.0, places=4)

  def test_adaptive_clipping_is_brock_et_als(self):
    lam = 0.05
    clipped, _ = self._clipped(agc_clip=lam)
    for w, g, c in zip(self.weights, self.gradients, clipped):
      # Equation 3 of Brock et al. (2021), unit by unit.
      limit = lam * np.maximum(_numpy_unit_norms(w), 1e-3)
      g_norm = _numpy_unit_norms(g)
      expected = np.where(g_norm > limit, g * limit / g_norm, g)
      np.testing.assert_allclose(c, expected, rtol=1e-5, atol=1e-8)
    # No clipping asked for: no factors.
    factors, _ = optimization.clip_factors(
        [tf.constant(g) for g in self.gradients],
        [tf.constant(w) for w in self.weights])
    self.assertEqual(factors, [None] * 4)

  def test_adaptive_clipping_engages_unit_by_unit_and_spares_the_classifier(
      self):
    lam = 0.1
    kernel = np.ones((3, 3, 2, 2), np.float32)  # Unit norms 3 sqrt(2).
    limit = lam * 3 * math.sqrt(2)
    # Unit 0's gradient norm is 10 times its limit, unit 1's a tenth.
    gradient = np.ones_like(kernel) * (limit / (3 * math.sqrt(2)))
    gradient[..., 0] *= 10
    gradient[..., 1] *= 0.1
    head = np.full((4, 3), 0.01, np.float32)
    head_gradient = np.full((4, 3), 100.0, np.float32)
    with keras.name_scope("stage1_unit1"):
      conv = keras.Variable(kernel, name="kernel")
    with keras.name_scope(optimization.CLASSIFIER):
      classifier = keras.Variable(head, name="kernel")
    self.assertTrue(optimization.is_classifier(classifier))
    self.assertFalse(optimization.is_classifier(conv))
    factors, _ = optimization.clip_factors(
        [tf.constant(gradient), tf.constant(head_gradient)],
        [conv, classifier], agc_clip=lam)
    clipped = gradient * factors[0].numpy()
    norms = _numpy_unit_norms(clipped).ravel()
    self.assertAlmostEqual(norms[0], limit, places=5)  # Engaged...
    np.testing.assert_array_equal(clipped[..., 1], gradient[..., 1])  # not.
    # The classifier's gradient, 1e4 times its AGC limit, is not clipped.
    self.assertIsNone(factors[1])

  def test_both_apply_the_global_limit_to_the_adaptively_clipped_gradient(self):
    agc_only, _ = self._clipped(agc_clip=0.05)
    both, _ = self._clipped(agc_clip=0.05, grad_clip_norm=0.01)
    norm = math.sqrt(sum(float(np.sum(c.astype(np.float64) ** 2))
                         for c in agc_only))
    for a, b in zip(agc_only, both):
      np.testing.assert_allclose(b, a * min(1.0, 0.01 / norm), rtol=1e-5)


class ScheduleTest(absltest.TestCase):

  def test_warmup_is_linear_then_the_schedule(self):
    config = dataclasses.replace(
        configs.PRESETS["cifar10_paper_literal"], warmup_steps=100,
        lr_boundaries=(200, 300))
    schedule = optimization.learning_rate_schedule(
        run_lib.make_schedule(config, None))
    for step, expected in ((0, 0.05 / 100), (49, 0.05 * 50 / 100),
                           (99, 0.05), (150, 0.05), (250, 0.005),
                           (350, 0.0005)):
      self.assertAlmostEqual(float(schedule(step)), expected, places=7)
    # Serialisable like Keras's own schedules.
    restored = optimization.LinearWarmup.from_config(schedule.get_config())
    self.assertAlmostEqual(float(restored(49)), 0.05 * 50 / 100, places=7)

  def test_cosine_is_its_closed_form_over_the_run_with_and_without_warmup(
      self):
    # Loshchilov & Hutter's decay without restarts over the run's T steps,
    # lr0 (1 + cos(pi min(t, T) / T)) / 2, times the warm-up's
    # min(1, (t + 1) / W): every preset that decays so (NF-ResNet's, with
    # a warm-up of 5 epochs of 90; the paper's network and its batch-norm
    # twin in NF-ResNet's schedule, without one), and a short run of each
    # kind.
    def closed_form(step, lr0, steps, warmup):
      rate = lr0 * (1 + math.cos(math.pi * min(step, steps) / steps)) / 2
      return rate * (min(1.0, (step + 1) / warmup) if warmup else 1.0)
    presets = [c for c in configs.PRESETS.values()
               if c.lr_schedule == "cosine"]
    self.assertGreaterEqual(len(presets), 2)
    self.assertTrue(any(c.warmup_steps for c in presets))
    short = configs.override(configs.PRESETS["cifar10_paper"],
                             lr_schedule="cosine", lr_boundaries=(),
                             train_steps=1000, learning_rate=0.3)
    arm_config = configs.override(short, train_steps=70000,
                                  learning_rate=0.05)
    for config in presets + [short, configs.override(short,
                                                     warmup_steps=100)]:
      steps, warmup = config.train_steps, config.warmup_steps
      self.assertEqual(config.lr_schedule, "cosine")
      schedule = optimization.learning_rate_schedule(
          run_lib.make_schedule(config, 391.0))
      for step in sorted({0, 1, warmup // 2, max(warmup - 1, 0), warmup,
                          steps // 4, steps // 2, 3 * steps // 4,
                          steps - 1, steps, steps + 100}):
        with self.subTest(preset=config.preset, step=step):
          self.assertAlmostEqual(
              float(schedule(step)),
              closed_form(step, config.learning_rate, steps, warmup),
              delta=1e-6 * config.learning_rate)
    # Half-way through a run without warm-up the rate is half the initial.
    schedule = optimization.learning_rate_schedule(
        run_lib.make_schedule(arm_config, None))
    self.assertAlmostEqual(float(schedule(arm_config.train_steps // 2)),
                           arm_config.learning_rate / 2, places=6)

  def test_constant_and_boundary_free_piecewise_rates_never_change(self):
    for config in (configs.PRESETS["smoke"],
                   configs.override(configs.PRESETS["cifar10_paper"],
                                    lr_boundaries=())):
      rate = optimization.learning_rate_schedule(
          run_lib.make_schedule(config, None))
      values = [float(rate(step)) if callable(rate) else float(rate)
                for step in (0, 1, 1000, 10**6)]
      np.testing.assert_allclose(values, config.learning_rate, rtol=1e-7)

  def test_exponential_schedule_needs_the_epoch_length(self):
    config = configs.PRESETS["imagenet_paper_literal"]
    with self.assertRaisesRegex(ValueError, "number of training examples"):
      optimization.learning_rate_schedule(run_lib.make_schedule(config, None))
    schedule = optimization.learning_rate_schedule(
        run_lib.make_schedule(config, 1000.0))
    self.assertAlmostEqual(float(schedule(2000)), 0.1 * 0.94, places=6)


class ReplicasTest(absltest.TestCase):
  """Clipping acts on the gradient of the global batch, not per replica."""

  def _trained(self, strategy, **clipping):
    config = configs.override(
        configs.PRESETS["smoke"], width=0.0625, units=(1,), batch_size=8,
        learning_rate=0.5, **{"weight_decay": 0.0, **clipping})
    info = tfds_data.dataset_info("synthetic")
    rng = np.random.default_rng(3)
    images = rng.standard_normal((8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    keras.utils.set_random_seed(0)
    with strategy.scope():
      run = run_lib.prepare(config, info, None)
      model = model_lib.build_model(**run.model_arguments())
      optimizer = optimization.build_optimizer(run)
      optimizer.build(model.trainable_variables)

    def dataset_fn(context):
      # One pipeline serves the replicas one element each, in order: the
      # global batch split into per-replica parts.
      per_replica = context.get_per_replica_batch_size(8)
      parts = 8 // per_replica
      return tf.data.Dataset.from_tensor_slices(
          (images.reshape(parts, per_replica, 32, 32, 3),
           labels.reshape(parts, per_replica))).repeat()
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    out = step_lib.make_train_step(strategy, model, optimizer, config)(
        iterator, tf.constant(3))
    return [v.numpy() for v in optimization.averaged_variables(model)], out

  def test_two_replicas_clip_like_one(self):
    two = testing.two_replicas()
    self.assertEqual(two.num_replicas_in_sync, 2)
    for clipping in ({"grad_clip_norm": 0.01}, {"agc_clip": 0.001}):
      one_weights, one = self._trained(tf.distribute.get_strategy(),
                                       **clipping)
      two_weights, two_out = self._trained(two, **clipping)
      for a, b in zip(one_weights, two_weights):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
      # The reported gradient norm is the global batch's in both.
      np.testing.assert_allclose(one["grad_norm"].numpy(),
                                 two_out["grad_norm"].numpy(), rtol=1e-4)
      # And clipping was active: without it the weights differ.
      unclipped, _ = self._trained(tf.distribute.get_strategy())
      self.assertGreater(
          max(float(np.max(np.abs(a - b)))
              for a, b in zip(one_weights, unclipped)), 1e-4)

  def test_two_replicas_decay_like_one(self):
    # The L2 term is the global batch's once, not once per replica.
    one_weights, _ = self._trained(tf.distribute.get_strategy(),
                                   weight_decay=0.2)
    two_weights, _ = self._trained(testing.two_replicas(), weight_decay=0.2)
    for a, b in zip(one_weights, two_weights):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-6)
    undecayed, _ = self._trained(tf.distribute.get_strategy())
    self.assertGreater(max(float(np.max(np.abs(a - b)))
                           for a, b in zip(one_weights, undecayed)), 1e-4)


def _numpy_cross_entropy(logits, targets):
  """-sum_k t_k log softmax(logits)_k per row, in float64."""
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=1, keepdims=True)
  log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
  return -(targets * log_softmax).sum(axis=1)


class TrainingLossTest(absltest.TestCase):
  """`step.training_loss` against the cross-entropy written out: label
  smoothing's target (Szegedy et al., 2016) and mixup's (Zhang et al.,
  2018)."""

  def test_smoothed_and_mixed_losses_are_numpys(self):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 10)).astype(np.float32) * 3
    labels = np.array([0, 3, 9, 3, 5, 1], np.int32)
    partners = np.array([2, 3, 0, 7, 5, 8], np.int32)
    eye = np.eye(10)
    for smoothing in (0.0, 0.1):
      def target(y):
        return (1 - smoothing) * eye[y] + smoothing / 10
      np.testing.assert_allclose(
          step_lib.training_loss(labels, logits, smoothing),
          _numpy_cross_entropy(logits, target(labels)), rtol=1e-5)
      np.testing.assert_allclose(
          step_lib.training_loss(labels, logits, smoothing,
                                 mixed_with=(partners, 0.3)),
          _numpy_cross_entropy(logits, 0.3 * target(labels)
                               + 0.7 * target(partners)), rtol=1e-5)


class MixupTest(absltest.TestCase):
  """`step.mixup`: each image mixed with one partner by one weight per
  batch, the partners a permutation, the weight Beta(alpha, alpha)."""

  def test_each_image_is_mixed_with_one_partner_by_the_batchs_weight(self):
    rng = np.random.default_rng(2)
    images = rng.standard_normal((8, 4, 4, 3)).astype(np.float32)
    labels = np.arange(8, dtype=np.int32) + 10
    mixed, partner_labels, lam = step_lib.mixup(images, labels, 1.0,
                                                tf.constant([3, 7]))
    mixed, lam = mixed.numpy().reshape(8, -1), float(lam)
    flat = images.reshape(8, -1).astype(np.float64)
    partners, weights = [], []
    for i in range(8):
      # The partner j and weight w that best explain mixed_i as
      # w x_i + (1 - w) x_j, by least squares over every candidate j.
      fits = []
      for j in range(8):
        direction = flat[i] - flat[j]
        w = (1.0 if j == i else
             float(np.dot(mixed[i] - flat[j], direction)
                   / np.dot(direction, direction)))
        fits.append((np.abs(mixed[i] - (w * flat[i] + (1 - w) * flat[j]))
                     .max(), j, w))
      residual, j, w = min(fits)
      self.assertLess(residual, 1e-5)
      partners.append(j)
      if j != i:
        weights.append(w)
    self.assertCountEqual(partners, range(8))  # A permutation.
    self.assertNotEqual(partners, list(range(8)))
    np.testing.assert_array_equal(partner_labels, labels[partners])
    np.testing.assert_allclose(weights, lam, atol=1e-5)
    self.assertTrue(0 < lam < 1)
    # The same seed mixes alike; the next step's seed does not.
    again, _, lam_again = step_lib.mixup(images, labels, 1.0,
                                         tf.constant([3, 7]))
    np.testing.assert_array_equal(again.numpy().reshape(8, -1), mixed)
    self.assertEqual(float(lam_again), lam)
    self.assertNotEqual(float(step_lib.mixup(images, labels, 1.0,
                                             tf.constant([3, 8]))[2]), lam)

  def test_the_weight_has_the_beta_distributions_moments(self):
    images, labels = np.zeros((2, 1), np.float32), np.zeros(2, np.int32)
    draw = tf.function(lambda alpha, step: step_lib.mixup(
        images, labels, alpha, tf.stack([tf.constant(0, tf.int64), step]))[2])
    for alpha in (1.0, 0.2):
      lams = np.array([float(draw(alpha, tf.constant(k, tf.int64)))
                       for k in range(2000)])
      # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
      self.assertAlmostEqual(lams.mean(), 0.5, delta=0.03)
      self.assertAlmostEqual(lams.var() * 4 * (2 * alpha + 1), 1.0,
                             delta=0.1)

  def test_a_resumed_run_mixes_as_the_uninterrupted_one(self):
    config = configs.override(
        configs.PRESETS["smoke"], width=0.0625, units=(1,), batch_size=8,
        train_steps=4, checkpoint_steps=2, log_steps=1, steps_per_loop=1,
        eval_at_end=False, eval_train_at_end=False, deterministic=True,
        mixup_alpha=1.0)
    def weights(model_dir):
      model, _, _ = checkpoints.restore_model(model_dir)
      return [v.numpy() for v in model.trainable_variables]
    whole, halves, plain = (self.create_tempdir().full_path
                            for _ in range(3))
    lines = []
    trainer.train(config, whole, echo=lines.append)
    trainer.train(configs.override(config, train_steps=2), halves)
    trainer.train(config, halves)
    for a, b in zip(weights(whole), weights(halves)):
      np.testing.assert_array_equal(a, b)
    trainer.train(configs.override(config, mixup_alpha=0.0), plain)
    self.assertTrue(any(np.any(a != b) for a, b in
                        zip(weights(whole), weights(plain))))  # It mixes.
    with self.assertRaisesRegex(ValueError, "--mixup_alpha must be >= 0"):
      configs.override(config, mixup_alpha=-1.0)


class TrainStepTest(absltest.TestCase):
  """The optimiser and one training step against SGD written out here:
  momentum and Nesterov's momentum (Keras's SGD, whose recursion the
  configuration's `momentum` means), the global clip only during the first
  grad_clip_steps, the smoothed loss, batch norm's batch statistics."""

  def test_momentum_and_nesterov_are_sgds_recursions(self):
    # m <- mu m - lr_t g_t; plain: w <- w + m; Nesterov: w <- w + mu m -
    # lr_t g_t. The rate drops tenfold after step 1 (a piecewise schedule
    # with one boundary), so the schedule is followed step by step.
    rng = np.random.default_rng(4)
    gradients = [rng.standard_normal(3).astype(np.float32) for _ in range(4)]
    start = rng.standard_normal(3).astype(np.float32)
    for nesterov in (False, True):
      config = configs.override(
          configs.PRESETS["cifar10_paper_literal"], learning_rate=0.1,
          momentum=0.7, nesterov=nesterov, lr_boundaries=(1,))
      optimizer = optimization.build_optimizer(
          run_lib.prepare(config, tfds_data.dataset_info("synthetic"), None))
      variable = tf.Variable(start)
      optimizer.build([variable])
      w, m = start.astype(np.float64), np.zeros(3)
      for step, g in enumerate(gradients):
        rate = 0.1 if step <= 1 else 0.01
        optimizer.apply_gradients([(tf.constant(g), variable)])
        m = 0.7 * m - rate * g
        w = w + (0.7 * m - rate * g if nesterov else m)
        np.testing.assert_allclose(variable.numpy(), w, rtol=1e-5,
                                   atol=1e-7, err_msg=f"nesterov={nesterov}")

  def _net(self, **overrides):
    """(config, model, optimizer, one batch) of a tiny smoke run with plain
    SGD (no momentum, no weight decay) unless OVERRIDES say otherwise."""
    config = configs.override(
        configs.PRESETS["smoke"], **{
            "width": 0.0625, "units": (1,), "batch_size": 8,
            "learning_rate": 0.1, "momentum": 0.0, "weight_decay": 0.0,
            **overrides})
    run = run_lib.prepare(config, tfds_data.dataset_info("synthetic"), None)
    keras.utils.set_random_seed(0)
    model = model_lib.build_model(**run.model_arguments())
    optimizer = optimization.build_optimizer(run)
    optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(6)
    images = rng.standard_normal((8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    return config, model, optimizer, (images, labels)

  def _stepper(self, config, model, optimizer, batch):
    """() -> one step of `make_train_step` on BATCH, its output as NumPy."""
    strategy = tf.distribute.get_strategy()
    steps = step_lib.make_train_step(strategy, model, optimizer, config)
    iterator = iter(strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors(batch).repeat()))
    return lambda: tf.nest.map_structure(
        np.asarray, steps(iterator, tf.constant(1)))

  def _gradient(self, model, batch):
    """The gradient of the batch's mean cross-entropy, by a tape here."""
    images, labels = batch
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          labels, model(images, training=True), from_logits=True))
    return [g.numpy() for g in tape.gradient(loss,
                                             model.trainable_variables)]

  def test_the_global_clip_acts_only_during_the_first_grad_clip_steps(self):
    limit = 1e-3
    for clip_steps in (0, 1):
      config, model, optimizer, batch = self._net(grad_clip_norm=limit,
                                                  grad_clip_steps=clip_steps)
      step = self._stepper(config, model, optimizer, batch)
      for index in range(2):
        gradient = self._gradient(model, batch)
        norm = math.sqrt(sum(float(np.sum(np.square(g.astype(np.float64))))
                             for g in gradient))
        self.assertGreater(norm, 10 * limit)  # The clip changes the step.
        # 0: clipped throughout; N: steps 0..N-1 (iterations < N) only.
        clipped = clip_steps == 0 or index < clip_steps
        factor = limit / norm if clipped else 1.0
        before = [w.numpy() for w in model.trainable_variables]
        out = step()
        self.assertAlmostEqual(float(out["grad_norm"]), norm,
                               delta=1e-4 * norm)
        for w, b, g in zip(model.trainable_variables, before, gradient):
          expected = -0.1 * factor * g
          np.testing.assert_allclose(
              w.numpy() - b, expected, rtol=1e-3,
              atol=1e-3 * float(np.max(np.abs(expected))) + 1e-12,
              err_msg=f"grad_clip_steps={clip_steps}, step {index}")

  def test_weight_decay_adds_its_gradient_to_the_scopes_weights_only(self):
    # Section 4.1's L2 term wd ||W||^2 / 2: its gradient wd W joins the
    # data gradient of the decayed weights -- rank-4 kernels
    # ("convolutions"), every kernel ("kernels"), every trained weight
    # ("all") -- and no other. Fixup's network has all three kinds.
    decay = 0.5
    # (The default scope's weights: RecipeTest in normfree_test.py.)
    chosen = {"kernels": lambda w: len(w.shape) >= 2,
              "all": lambda w: True}
    for scope, decayed in chosen.items():
      config, model, optimizer, batch = self._net(
          model="fixup", weight_decay=decay, weight_decay_scope=scope)
      rng = np.random.default_rng(2)
      for w in model.trainable_variables:
        w.assign(0.1 * rng.standard_normal(w.shape).astype(np.float32))
      gradient = self._gradient(model, batch)
      images, labels = batch
      plain = _numpy_cross_entropy(model(images).numpy(),
                                   np.eye(10)[labels]).sum()
      before = [w.numpy() for w in model.trainable_variables]
      out = self._stepper(config, model, optimizer, batch)()
      # The reported loss is the data's alone.
      self.assertAlmostEqual(float(out["loss_sum"]), plain,
                             delta=1e-5 * plain)
      for w, b, g in zip(model.trainable_variables, before, gradient):
        expected = -0.1 * (g + (decay * b if decayed(w) else 0.0))
        np.testing.assert_allclose(
            w.numpy() - b, expected, rtol=1e-3,
            atol=1e-3 * float(np.max(np.abs(expected))) + 1e-12,
            err_msg=f"{scope}: {w.path}")
      self.assertTrue(any(not decayed(w) for w in model.trainable_variables)
                      or scope == "all")

  def test_the_step_minimises_the_smoothed_loss_it_reports(self):
    # Batch norm's network: a trained head, logits far from uniform.
    smoothing = 0.2
    config, model, optimizer, batch = self._net(model="resnet_bn",
                                                label_smoothing=smoothing)
    images, labels = batch
    logits = model(images, training=True).numpy()
    target = (1 - smoothing) * np.eye(10)[labels] + smoothing / 10
    expected = _numpy_cross_entropy(logits, target).sum()
    out = self._stepper(config, model, optimizer, batch)()
    self.assertAlmostEqual(float(out["loss_sum"]), expected,
                           delta=1e-5 * expected)
    # Smoothing changes the loss of these logits measurably.
    self.assertGreater(abs(expected - _numpy_cross_entropy(
        logits, np.eye(10)[labels]).sum()), 1e-3 * expected)
    # Top-1 of the same logits, over the batch's examples.
    self.assertEqual(float(out["correct"]),
                     np.sum(np.argmax(logits, axis=1) == labels))
    self.assertEqual(float(out["examples"]), 8)

  def test_mixup_mixes_each_step_with_the_runs_seed_and_the_step(self):
    # Step t mixes its batch as `step.mixup` with seed [1024 seed +
    # replica, t] (the same mix on resuming): the reported loss is the
    # mixed loss of that mix, a new one every step.
    config, model, optimizer, batch = self._net(model="resnet_bn",
                                                mixup_alpha=1.0, seed=3)
    images, labels = batch
    step = self._stepper(config, model, optimizer, batch)
    lams = []
    for index in range(2):
      mixed, partners, lam = step_lib.mixup(
          images, labels, 1.0, tf.constant([3 * 1024, index], tf.int64))
      lam = float(lam)
      lams.append(lam)
      logits = model(mixed, training=True).numpy()
      eye = np.eye(10)
      expected = _numpy_cross_entropy(
          logits, lam * eye[labels] + (1 - lam) * eye[partners.numpy()])
      out = step()
      self.assertAlmostEqual(float(out["loss_sum"]), expected.sum(),
                             delta=1e-5 * expected.sum(), msg=index)
    self.assertNotAlmostEqual(lams[0], lams[1], places=3)

  def test_batch_norm_trains_on_the_batchs_statistics(self):
    config, model, optimizer, batch = self._net(model="resnet_bn")
    images, labels = batch
    norms = testing.normalization_layers(model)
    self.assertNotEmpty(norms)
    # The two forward passes a step could take, before it takes one (the
    # first moves the moving statistics: read after it).
    batch_logits = model(images, training=True).numpy()
    moving_logits = model(images, training=False).numpy()
    stats = [(n.moving_mean.numpy(), n.moving_variance.numpy()) for n in norms]
    onehot = np.eye(10)[labels]
    with_batch = _numpy_cross_entropy(batch_logits, onehot).sum()
    with_moving = _numpy_cross_entropy(moving_logits, onehot).sum()
    self.assertGreater(abs(with_batch - with_moving), 1e-2 * with_batch)
    out = self._stepper(config, model, optimizer, batch)()
    self.assertAlmostEqual(float(out["loss_sum"]), with_batch,
                           delta=1e-5 * with_batch)
    # And the step moves the moving statistics towards the batch's.
    for norm, (mean, variance) in zip(norms, stats):
      self.assertGreater(np.max(np.abs(norm.moving_mean.numpy() - mean))
                         + np.max(np.abs(norm.moving_variance.numpy()
                                         - variance)), 1e-6, norm.name)


class WeightAverageTest(absltest.TestCase):
  """--ema_decay against its recursion written out: a_1 = w_1, then
  a_t = d a_(t-1) + (1 - d) w_t over the weights w_t after each step."""

  def test_the_average_follows_its_recursion(self):
    variables = [tf.Variable(np.ones((2, 3), np.float32)), tf.Variable(2.0)]
    average = optimization.WeightAverage(variables, 0.75)
    with average.swapped_into(variables):  # No step averaged: their own.
      np.testing.assert_array_equal(variables[0].numpy(), np.ones((2, 3)))
    rng = np.random.default_rng(0)
    expected = None
    for _ in range(4):
      values = [rng.standard_normal(v.shape).astype(np.float32)
                for v in variables]
      for variable, value in zip(variables, values):
        variable.assign(value)
      average.update(variables)
      expected = values if expected is None else [
          0.75 * e + 0.25 * x for e, x in zip(expected, values)]
    with average.swapped_into(variables):
      for variable, value in zip(variables, expected):
        np.testing.assert_allclose(variable.numpy(), value, rtol=1e-6)
    for variable, value in zip(variables, values):  # Their own again.
      np.testing.assert_array_equal(variable.numpy(), value)
    for decay in (0.0, 1.0):
      with self.assertRaisesRegex(ValueError, "--ema_decay must be in"):
        optimization.WeightAverage(variables, decay)

  def _config(self, **overrides):
    return configs.override(
        configs.PRESETS["smoke"], width=0.0625, units=(1,), batch_size=8,
        learning_rate=0.2, checkpoint_steps=1, keep_checkpoints=10,
        log_steps=1, steps_per_loop=1, num_eval_examples=16,
        eval_batch_size=8, **overrides)

  def _weights(self, model_dir, step, averaged):
    model, _, _ = checkpoints.restore_checkpoint(
        model_dir, checkpoints.find_checkpoint(model_dir, step),
        averaged=averaged)
    return [v.numpy() for v in optimization.averaged_variables(model)]

  def _assert_recursion(self, model_dir, first, last, decay):
    """The averaged weights of checkpoints FIRST..LAST follow the
    recursion from a_FIRST = w_FIRST over their raw weights."""
    expected = self._weights(model_dir, first, averaged=False)
    for step in range(first, last + 1):
      raw = self._weights(model_dir, step, averaged=False)
      if step > first:
        expected = [decay * e + (1 - decay) * w
                    for e, w in zip(expected, raw)]
      for got, want in zip(self._weights(model_dir, step, averaged=True),
                           expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    self.assertGreater(max(float(np.max(np.abs(a - b))) for a, b in
                           zip(expected, raw)), 1e-4)  # It averages.

  def test_two_replicas_average_evaluate_and_resume(self):
    model_dir = self.create_tempdir().full_path
    two = testing.two_replicas()
    # Batch norm's network: its moving statistics are averaged too.
    config = self._config(model="resnet_bn", ema_decay=0.5)
    trainer.train(configs.override(config, train_steps=3), model_dir,
                  strategy=two)
    result = trainer.train(configs.override(config, train_steps=5),
                           model_dir, strategy=two)
    model, _, _ = checkpoints.restore_model(model_dir)
    norms = testing.normalization_layers(model)
    self.assertNotEmpty(norms)
    self.assertLen([v for v in optimization.averaged_variables(model)
                    if "moving_" in v.path], 2 * len(norms))
    # Steps 1-5, across the resume at step 3.
    self._assert_recursion(model_dir, 1, 5, 0.5)
    # The run's last evaluation is of the average, and the checkpoint
    # after it holds the weights themselves (swapped back).
    model, run, _ = checkpoints.restore_model(model_dir)
    scores = evaluation.evaluate(model, "synthetic", run.dataset,
                                 run.preprocessing, batch_size=8,
                                 num_examples=16)
    self.assertAlmostEqual(result["eval"]["loss"], scores["loss"], places=5)

  def test_an_average_turned_on_when_resuming_starts_there(self):
    model_dir = self.create_tempdir().full_path
    trainer.train(self._config(train_steps=2), model_dir)
    trainer.train(self._config(train_steps=4, ema_decay=0.5), model_dir)
    # Step 2's checkpoint has no average: its weights are what is used.
    for a, b in zip(self._weights(model_dir, 2, averaged=True),
                    self._weights(model_dir, 2, averaged=False)):
      np.testing.assert_array_equal(a, b)
    self._assert_recursion(model_dir, 3, 4, 0.5)


if __name__ == "__main__":
  absltest.main()
