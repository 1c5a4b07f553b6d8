"""Tests of the normalisation-free methods' own networks and recipes.

Each method is checked against the properties its paper states at
initialisation, computed independently here (NumPy, or the formula written
out), then trained a few steps on `synthetic` through the trainer,
resumed, restored and exported. The `normfree` study's diagnosis -- the
whole training set evaluated at the end -- is checked to count every
training image once.
"""

import dataclasses
import math
import os
import re
from unittest import mock

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import layers
from identity_tf import studies
from identity_tf import model as model_lib
from identity_tf.peers import fixup
from identity_tf.data import datasets
from identity_tf.data import synthetic
from identity_tf.data import tfds_data
from identity_tf.peers import nf_resnet
from identity_tf.peers import skipinit
from identity_tf.serving import contract
from identity_tf.serving import export
from identity_tf.training import checkpoints
from identity_tf.training import metrics
from identity_tf.training import optimization
from identity_tf.training import run as run_lib
from identity_tf.training import step as step_lib
from identity_tf.training import study
from identity_tf.training import trainer

TINY = dict(width=0.125, units=2, classes=10, seed=3)


def _images(n=8, seed=0, size=32, channels=3, non_negative=False):
  x = np.random.default_rng(seed).standard_normal(
      (n, size, size, channels)).astype(np.float32)
  return np.abs(x) if non_negative else x


def _units(model):
  return [l for l in model.layers if l.name.startswith("stage")]


def _pool_pad_shortcut(x, filters, strides):
  """The paper's shortcut written out: 2x2 average pooling when STRIDES is
  2, then zero channels on both sides up to FILTERS."""
  n, h, w, c = x.shape
  if strides > 1:
    x = x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))
  extra = filters - c
  return np.pad(x, [(0, 0)] * 3 + [(extra // 2, extra - extra // 2)])


class FixupTest(absltest.TestCase):

  def test_each_unit_starts_as_its_shortcut_and_the_logits_at_zero(self):
    # Table 1's stem (2 channels at this width, padded to stage 1's 8) and
    # the authors' layout, a stem as wide as stage 1 (64 x 0.125 = 8),
    # where stage 1's first unit keeps its shape and adds x itself.
    for stem_channels, channels in ((None, 2), (64, 8)):
      with self.subTest(stem_channels=stem_channels):
        model = model_lib.build_model("fixup", **TINY,
                                      stem_channels=stem_channels)
        first = model.get_layer("stage1_unit1")
        self.assertEqual((first.input.shape[-1], first.filters),
                         (channels, 8))
        # C2 = 0 and the scalars at 0 and 1: every unit is ReLU of its
        # shortcut (subsampled, zero channels appended) on any input,
        # and exactly the shortcut on the non-negative input the ReLU
        # before it gives.
        for unit in _units(model):
          for non_negative in (True, False):
            x = _images(4, channels=unit.input.shape[-1],
                        size=unit.input.shape[1], non_negative=non_negative)
            expected = x[:, ::unit.strides, ::unit.strides, :]
            expected = np.maximum(np.pad(
                expected, [(0, 0)] * 3 + [(0, unit.filters - x.shape[-1])]),
                                  0)
            np.testing.assert_array_equal(unit(x).numpy(), expected)
        np.testing.assert_array_equal(model(_images()).numpy(), 0.0)

  def test_initialisation_and_scalars_are_zhang_et_als(self):
    plan_units = 27  # Table 1: L = 3 x 9 branches.
    model = model_lib.build_model("fixup", width=0.5, classes=10)
    unit = model.get_layer("stage3_unit5")
    kernel = unit.conv1.kernel.numpy()
    # He et al.'s fan-out normal, scaled by L^(-1/2) (rule 2).
    expected = math.sqrt(2 / (9 * kernel.shape[-1])) / math.sqrt(plan_units)
    self.assertAlmostEqual(kernel.std() / expected, 1.0, delta=0.03)
    np.testing.assert_array_equal(unit.conv2.kernel.numpy(), 0.0)
    scalars = {w.path.split("/")[-1]: float(w.numpy())
               for w in unit.weights if len(w.shape) == 0}
    self.assertEqual(scalars, {"bias1a": 0.0, "bias1b": 0.0, "bias2a": 0.0,
                               "bias2b": 0.0, "scale": 1.0})
    head = model.get_layer("projection")
    self.assertTrue(head.trainable)
    np.testing.assert_array_equal(head.kernel.numpy(), 0.0)
    np.testing.assert_array_equal(head.bias.numpy(), 0.0)

  def test_forward_is_the_authors_block(self):
    unit = fixup.FixupUnit(6, strides=2, num_branches=4, seed=1)
    x = _images(2, channels=4, size=8)
    unit(x)
    rng = np.random.default_rng(5)
    for w in unit.weights:
      w.assign(rng.standard_normal(w.shape).astype(np.float32))
    b1a, b1b, b2a, s, b2b = (float(getattr(unit, n).numpy()) for n in (
        "bias1a", "bias1b", "bias2a", "scale", "bias2b"))
    conv = lambda t, c: tf.nn.conv2d(t, c.kernel, c.strides, "SAME").numpy()
    hidden = np.maximum(conv(x + b1a, unit.conv1) + b1b, 0)
    branch = conv(hidden + b2a, unit.conv2) * s + b2b
    skip = np.pad((x + b1a)[:, ::2, ::2, :], [(0, 0)] * 3 + [(0, 2)])
    np.testing.assert_allclose(unit(x).numpy(),
                               np.maximum(skip + branch, 0), rtol=1e-5,
                               atol=1e-5)


class SkipInitTest(absltest.TestCase):

  def test_each_unit_starts_as_its_shortcut(self):
    for stem_channels in (None, 64):  # 64: a stem as wide as stage 1.
      model = model_lib.build_model("skipinit", **TINY,
                                    stem_channels=stem_channels)
      for unit in _units(model):
        x = _images(4, channels=unit.input.shape[-1],
                    size=unit.input.shape[1])
        np.testing.assert_allclose(
            unit(x).numpy(),
            _pool_pad_shortcut(x, unit.filters, unit.strides), atol=1e-6)
        self.assertEqual(float(unit.skip_gain.numpy()), 0.0)

  def test_convolutions_are_he_initialised_and_the_classifier_small(self):
    model = model_lib.build_model("skipinit", width=0.5, classes=10)
    kernel = model.get_layer("stage2_unit3").conv1.kernel.numpy()
    # Keras's HeNormal is truncated at 2 standard deviations; its variance
    # is still 2 / fan_in.
    self.assertAlmostEqual(kernel.std() / math.sqrt(2 / (9 * 64)), 1.0,
                           delta=0.03)
    head = model.get_layer("projection").kernel.numpy()
    self.assertAlmostEqual(head.std() / 0.01, 1.0, delta=0.1)


class NFResNetTest(absltest.TestCase):

  def test_weight_standardisation_is_scaled_per_output_channel(self):
    conv = layers.ScaledWSConv2D(5, 3, padding="same")
    conv(_images(1, channels=4, size=6))
    conv.gain.assign(np.arange(1, 6, dtype=np.float32))
    w = conv.kernel.numpy().astype(np.float64)
    mean = w.mean(axis=(0, 1, 2))
    std = w.std(axis=(0, 1, 2))
    expected = (w - mean) / (std * math.sqrt(3 * 3 * 4)) * np.arange(1, 6)
    np.testing.assert_allclose(conv.standardized_kernel().numpy(), expected,
                               rtol=1e-4, atol=1e-6)

  def test_relu_gain_preserves_variance(self):
    z = np.random.default_rng(0).standard_normal(1_000_000)
    self.assertAlmostEqual(
        np.var(np.maximum(z, 0) * nf_resnet.RELU_GAIN), 1.0, delta=0.01)

  def test_units_start_as_their_shortcut(self):
    for stem_channels in (None, 64):
      model = model_lib.build_model("nf_resnet", **TINY,
                                    stem_channels=stem_channels)
      # A stem as wide as stage 1 leaves its first unit without a
      # projection: the identity, as every later unit of a stage.
      self.assertEqual(model.get_layer("stage1_unit1").projects,
                       stem_channels is None)
      for unit in _units(model):
        self.assertEqual(float(unit.skip_gain.numpy()), 0.0)
        if not unit.projects:
          x = _images(4, channels=unit.filters, size=unit.input.shape[1])
          np.testing.assert_array_equal(unit(x).numpy(), x)

  def test_the_stream_grows_by_alpha_squared_as_the_rule_says(self):
    # With the skip gains at 1, Var(h_{i+1}) = Var(h_i) + alpha^2, reset to
    # 1 + alpha^2 by a stage's first unit, from a unit-variance input.
    model = model_lib.build_model("nf_resnet", width=1.0, units=3,
                                  classes=10, seed=0)
    units = _units(model)
    for unit in units:
      unit.skip_gain.assign(1.0)
    plan = [(u.name, u.filters, u.strides, int(u.name[-1]) - 1)
            for u in units]
    variances = [s ** 2 for s in nf_resnet.expected_stds(plan)]
    h = tf.constant(_images(16, channels=16, size=32))
    for unit, expected in zip(units, variances):
      self.assertAlmostEqual(float(tf.math.reduce_variance(h)) / expected,
                             1.0, delta=0.25, msg=unit.name)
      h = unit(h)
    # Stage 1's units see 1, 1 + a^2, 1 + 2a^2; stage 2's first sees
    # 1 + 3a^2 and resets the stream to 1 + a^2 for the next.
    np.testing.assert_allclose(variances[:5], [1.0, 1.04, 1.08, 1.12, 1.04])

  def test_classifier_is_drawn_from_n_0_0_01(self):
    model = model_lib.build_model("nf_resnet", width=1.0, classes=100)
    head = model.get_layer("projection")
    self.assertAlmostEqual(head.kernel.numpy().std() / 0.01, 1.0, delta=0.05)
    np.testing.assert_array_equal(head.bias.numpy(), 0.0)


class PeersTest(absltest.TestCase):

  def test_keras_files_and_bfloat16_compute(self):
    # Random weights everywhere (the initial zeros would hide a weight that
    # a .keras file drops); bfloat16 within its rounding of float32.
    x = _images(2)
    for name in ("fixup", "skipinit", "nf_resnet"):
      with self.subTest(name):
        nets = [model_lib.build_model(name, width=0.125, units=1, classes=10,
                                      seed=2, precision=precision)
                for precision in ("float32", "mixed_bfloat16")]
        for net in nets:
          rng = np.random.default_rng(1)
          for w in net.trainable_weights:
            w.assign(0.1 * rng.standard_normal(w.shape).astype(np.float32))
        path = os.path.join(self.create_tempdir().full_path, "m.keras")
        nets[0].save(path)
        loaded = keras.models.load_model(path)
        np.testing.assert_array_equal(loaded(x).numpy(), nets[0](x).numpy())
        reference = nets[0](x).numpy()
        np.testing.assert_allclose(nets[1](x).numpy(), reference,
                                   atol=0.02 * np.abs(reference).max())


class GainTest(absltest.TestCase):

  def test_gain_starts_at_one_and_scales_the_branch(self):
    unit = layers.ConvResidualUnit(4, branch_gain="one", seed=0)
    x = _images(2, channels=4, size=6)
    y = unit(x).numpy()
    branch = unit.conv2(tf.nn.relu(unit.conv1(x))).numpy()
    np.testing.assert_allclose(y, x + branch, atol=1e-6)
    unit.branch_gain.assign(3.0)
    np.testing.assert_allclose(unit(x).numpy(), x + 3 * branch, atol=1e-5)


class FixupInitTest(absltest.TestCase):
  """init="fixup": the paper's unit and frozen projection, each unit's C2
  at 0 and its C1 at He's scale over sqrt(L) (Fixup's rule 2, no scalars)."""

  def test_units_are_their_shortcut_and_c1_is_he_over_sqrt_l(self):
    model = model_lib.build_model("cifar10", init="fixup", width=0.5,
                                  classes=10)
    for unit in _units(model):
      np.testing.assert_array_equal(unit.conv2.kernel.numpy(), 0.0)
      x = _images(2, channels=unit.input.shape[-1], size=unit.input.shape[1])
      np.testing.assert_allclose(
          unit(x).numpy(), _pool_pad_shortcut(x, unit.filters, unit.strides),
          atol=1e-6)
    kernel = model.get_layer("stage3_unit5").conv1.kernel.numpy()
    # He et al.'s 2 / fan_in (fan_in = 9 x 128 at width 0.5), over L = 27.
    self.assertAlmostEqual(kernel.std() / math.sqrt(2 / (9 * 128) / 27), 1.0,
                           delta=0.03)
    # The stem and the head are the paper's: std 1/(k^2 c), frozen.
    stem = model.get_layer("stem1").kernel.numpy()
    self.assertAlmostEqual(stem.std() * 9 * stem.shape[-1], 1.0, delta=0.1)
    self.assertFalse(model.get_layer("projection").trainable)

  def test_batch_norm_networks_refuse_it(self):
    with self.assertRaisesRegex(ValueError, "init fixup"):
      model_lib.build_model("resnet_bn", init="fixup", width=0.125, units=1)


class LogitScaleTest(absltest.TestCase):

  def test_the_frozen_projection_scales_the_logits(self):
    h = np.random.default_rng(0).standard_normal((3, 32)).astype(np.float32)
    plain = layers.RandomProjection(10, seed=4)
    scaled = layers.RandomProjection(10, seed=4, logit_scale=4.0)
    np.testing.assert_allclose(scaled(h).numpy(), 4 * plain(h).numpy(),
                               rtol=1e-5)
    self.assertEqual(scaled.trainable_weights, [])
    net = model_lib.build_model("cifar10", **TINY, logit_scale=4.0)
    self.assertEqual(net.get_layer("projection").logit_scale, 4.0)
    with self.assertRaisesRegex(ValueError, "logit_scale must be a number from"):
      model_lib.build_model("cifar10", **TINY, logit_scale=-1.0)


class BranchInitScaleTest(absltest.TestCase):

  def test_it_scales_every_standardised_draw_and_not_the_function(self):
    def network(scale):
      return model_lib.build_model("cifar10", **TINY, branch_gain="zero",
                                   weight_standardization=True,
                                   branch_init_scale=scale)
    small, large = network(1.0), network(2.0)
    units = _units(small)
    self.assertLen(units, 6)
    for unit in units:
      twin = large.get_layer(unit.name)
      for conv in ("conv1", "conv2"):
        np.testing.assert_allclose(
            np.asarray(getattr(twin, conv).kernel),
            2 * np.asarray(getattr(unit, conv).kernel), rtol=1e-6)
      # Open every branch: a standardised kernel's output does not depend
      # on its scale, so the two networks still compute the same function.
      unit.branch_gain.assign(0.5)
      twin.branch_gain.assign(0.5)
    x = _images(4)
    np.testing.assert_allclose(large(x), small(x), rtol=1e-4, atol=1e-5)
    with self.assertRaisesRegex(ValueError, "Fixup's rule"):
      model_lib.build_model("cifar10", **TINY, init="fixup",
                            branch_init_scale=2.0)


class RecipeTest(absltest.TestCase):

  def test_weight_decay_scopes(self):
    model = model_lib.build_model("fixup", **TINY)
    names = lambda scope: {w.path for w in
                           optimization.decayed_weights(model, scope)}
    every = {w.path for w in model.trainable_weights}
    kernels = {w.path for w in model.trainable_weights if len(w.shape) >= 2}
    self.assertEqual(names("all"), every)
    self.assertEqual(names("kernels"), kernels)
    self.assertIn("projection/kernel", kernels)
    self.assertEqual(names("convolutions"),
                     {p for p in kernels if p != "projection/kernel"})

  def test_bias_lr_factor_scales_the_scalars_steps(self):
    # One SGD step (no momentum history) from the Fixup preset's settings:
    # each scalar moves by -lr/10 times its gradient, a kernel by -lr times.
    config = configs.override(
        configs.PRESETS["fixup_cifar"], dataset="synthetic", width=0.125,
        units=(1,), batch_size=8, weight_decay=0.0, train_steps=10,
        lr_boundaries=(5, 8))
    run = run_lib.prepare(config, _synthetic_info(), None)
    strategy = tf.distribute.get_strategy()
    net = model_lib.build_model(**run.model_arguments())
    # Non-zero weights everywhere, so that every gradient is non-zero.
    rng = np.random.default_rng(0)
    for w in net.trainable_weights:
      w.assign(0.1 * rng.standard_normal(w.shape).astype(np.float32))
    optimizer = optimization.build_optimizer(run)
    optimizer.build(net.trainable_variables)
    images, labels = _images(8), np.arange(8, dtype=np.int32) % 10
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          labels, net(images), from_logits=True))
    grads = tape.gradient(loss, net.trainable_variables)
    before = [w.numpy() for w in net.trainable_variables]
    _one_step(strategy, net, optimizer, config, images, labels)
    for w, b, g in zip(net.trainable_variables, before, grads):
      factor = 0.1 if len(w.shape) <= 1 else 1.0
      np.testing.assert_allclose(w.numpy() - b, -0.1 * factor * g.numpy(),
                                 rtol=2e-3, atol=1e-7, err_msg=w.path)

  def test_presets_cite_recipes_and_scale_with_the_study(self):
    fixup_run = study.run_config(
        studies.STUDIES["normfree"].arms[0], 0, dataset="synthetic",
        epochs=10, num_train_examples=6400)
    # 500 steps; Fixup's drops at 1/2 and 3/4 of its 200 epochs.
    self.assertEqual(fixup_run.train_steps, 500)
    self.assertEqual(fixup_run.lr_boundaries, (250, 375))
    self.assertTrue(fixup_run.eval_train_at_end)
    nf = study.run_config(
        next(a for a in studies.STUDIES["normfree"].arms
             if a.name == "nf_resnet"), 0, dataset="synthetic", epochs=9,
        num_train_examples=6400)
    # A 5-epoch warm-up of 90 keeps its share: 450 * 5 / 90 = 25 steps.
    self.assertEqual(nf.warmup_steps, 25)
    self.assertEqual(nf.agc_clip, 0.0)  # NF-ResNet's paper: no clipping.
    self.assertTrue(nf.nesterov)

  def test_cifar10_ws_builds_the_network_the_results_describe(self):
    # docs/results.md's answer: the paper's unit (no batch norm) and frozen
    # projection, C1 and C2 standardised with a trained per-channel gain and
    # drawn at 2/(k^2 c), a branch gain from 0, the logits times 4,
    # cifar10_paper's rate, batch, decay and clip, Nesterov and cosine.
    config = configs.from_preset("cifar10_ws", width=0.25, units=(2,))
    run = run_lib.prepare(config, _synthetic_info(), None)
    net = model_lib.build_model(**run.model_arguments())
    paper = configs.PRESETS["cifar10_paper"]
    for name in ("learning_rate", "batch_size", "weight_decay", "momentum",
                 "grad_clip_norm", "train_steps", "model"):
      self.assertEqual(getattr(config, name), getattr(paper, name), name)
    self.assertEqual((config.lr_schedule, config.nesterov), ("cosine", True))
    projection = net.get_layer("projection")
    self.assertFalse(projection.trainable)
    self.assertEqual(projection.logit_scale, 4.0)
    x = _images(2)
    for unit in _units(net):
      self.assertIsInstance(unit, layers.ConvResidualUnit)
      for conv in (unit.conv1, unit.conv2):
        self.assertIsInstance(conv, layers.ScaledWSConv2D)
        self.assertTrue(conv.gain.trainable)
        # fan-out k^2 c with k = 3, c = the unit's channels, times 2.
        self.assertAlmostEqual(
            conv.kernel.numpy().std() * 9 * unit.filters / 2, 1.0,
            delta=0.15)
      # The branch gain starts at 0: each unit is exactly its shortcut.
      self.assertEqual(float(unit.branch_gain), 0.0)
      inputs = _images(2, channels=unit.input.shape[-1],
                       size=unit.input.shape[1])
      np.testing.assert_allclose(
          unit(inputs).numpy(),
          _pool_pad_shortcut(inputs, unit.filters, unit.strides), atol=1e-6)
    self.assertFalse(any("batch_normalization" in w.path
                         for w in net.weights))
    self.assertEqual(net(x).shape, (2, 10))

  def test_the_batch_norm_twin_differs_in_its_network_only(self):
    ws, bn = (configs.PRESETS[name] for name in ("cifar10_ws",
                                                 "cifar10_ws_bn"))
    differ = {f.name for f in dataclasses.fields(configs.Config)
              if getattr(ws, f.name) != getattr(bn, f.name)}
    self.assertEqual(differ - set(configs.MODEL_FIELDS), {"preset"})
    self.assertEqual(bn.model, "resnet_bn")
    self.assertGreater(bn.grad_clip_norm, 0)  # The clip too: one recipe.

  def test_each_ablation_arm_removes_one_change_of_the_preset(self):
    # Each arm's run differs from the preset's run in the fields its
    # description names, with the paper's value there.
    def run(arm_name):
      [arm] = study.arms_named(studies.STUDIES["ablation"], [arm_name])
      return study.run_config(arm, 0, dataset="fashion_mnist", epochs=10,
                              num_train_examples=60_000)
    preset, paper = run("cifar10_ws"), configs.PRESETS["cifar10_paper"]
    steps = math.ceil(10 * 60_000 / 128)  # 10 epochs of 128.
    removed = {
        "ws_gain_frozen": {"ws_gain": "frozen"},
        "no_weight_standardization": {"weight_standardization": False},
        "no_branch_gain": {"branch_gain": "none"},
        "logit_scale_1": {"logit_scale": 1.0},
        # The paper's drops at 30k and 50k of 70k, scaled to the budget.
        "paper_schedule": {"lr_schedule": "piecewise", "nesterov": False,
                           "lr_boundaries": (round(30000 * steps / 70000),
                                             round(50000 * steps / 70000))},
        "no_clip": {"grad_clip_norm": 0.0},
        "paper_draw": {"branch_init_scale": 1.0},
    }
    for arm_name, changes in removed.items():
      with self.subTest(arm_name):
        arm_run = run(arm_name)
        self.assertEqual(arm_run, dataclasses.replace(preset, **changes))
    self.assertEqual(preset.train_steps, steps)
    for name in ("lr_schedule", "nesterov"):
      self.assertEqual(run("paper_schedule").__getattribute__(name),
                       getattr(paper, name))
    bn, bn_unclipped = run("cifar10_ws_bn"), run("cifar10_ws_bn_no_clip")
    self.assertEqual(bn_unclipped,
                     dataclasses.replace(bn, grad_clip_norm=0.0))


def _synthetic_info():
  return tfds_data.dataset_info("synthetic")


def _one_step(strategy, net, optimizer, config, images, labels):
  train_steps = step_lib.make_train_step(strategy, net, optimizer, config)
  dataset = tf.data.Dataset.from_tensors((images, labels)).repeat()
  return train_steps(iter(strategy.experimental_distribute_dataset(dataset)),
                     tf.constant(1))


class TrainResumeExportTest(absltest.TestCase):

  def test_each_preset_trains_resumes_restores_and_exports(self):
    # The fixup_layout study's fixup_authors_input arm too: its
    # per-channel statistics must survive the resume and reach the export.
    authors = {"standardize": "per_channel", "stem_channels": 64}
    for preset, options in (("fixup_cifar", {}), ("fixup_cifar", authors),
                            ("skipinit_bn_recipe", {}),
                            ("nf_resnet_cifar", {}), ("cifar10_ws", {}),
                            ("cifar10_ws", {"ws_gain": "frozen"}),
                            ("cifar10_ws_bn", {})):
      with self.subTest(preset, **options):
        model_dir = self.create_tempdir().full_path
        config = configs.override(
            configs.PRESETS[preset], **options, dataset="synthetic",
            width=0.125,
            units=(1,), batch_size=16, train_steps=4, warmup_steps=0,
            lr_boundaries=(), checkpoint_steps=2, log_steps=2,
            steps_per_loop=2, num_train_examples=48, num_eval_examples=32,
            eval_train_at_end=True)
        lines = []
        first = trainer.train(config, model_dir, echo=lines.append)
        self.assertEqual(first["step"], 4)
        self.assertTrue(np.isfinite(first["train_loss"]))
        # The whole training set once: its 48 images, not a batch's worth.
        self.assertEqual(first["train_eval"]["examples"], 48)
        # A resumed run takes config.json's statistics: computing them
        # again fails the test.
        with mock.patch.object(datasets, "rgb_statistics",
                               side_effect=AssertionError("recomputed")):
          resumed = trainer.train(dataclasses.replace(config, train_steps=6),
                                  model_dir, echo=lines.append)
        self.assertIn("resumed from", "\n".join(lines))
        self.assertEqual(resumed["step"], 6)
        records = metrics.read(model_dir)
        starts = [r["step"] for r in records if "start" in r]
        self.assertEqual(starts, [0, 4])  # The second run began at step 4.
        model, run, step = checkpoints.restore_model(model_dir)
        self.assertEqual(run.preprocessing.image_size, 32)
        self.assertEqual((step, run.config.model), (6, config.model))
        self.assertEqual(run.config, dataclasses.replace(config,
                                                         train_steps=6))
        if options is authors:
          # NumPy's mean and population std of the 48 training images, per
          # channel, not of the test split.
          train = synthetic.arrays("train")[0][:48].astype(np.float64)
          np.testing.assert_allclose(run.preprocessing.mean,
                                     train.mean(axis=(0, 1, 2)), rtol=1e-12)
          np.testing.assert_allclose(run.preprocessing.std,
                                     train.std(axis=(0, 1, 2)), rtol=1e-12)
          self.assertEqual(model.get_layer("stem1").kernel.shape[-1], 8)
        if preset == "cifar10_ws":
          for unit in _units(model):
            # Six steps moved the branch gains off 0 (each unit's
            # gradient is its branch's); a frozen WS gain is still 1.
            self.assertNotEqual(float(unit.branch_gain), 0.0)
            gain = unit.conv1.gain.numpy()
            if options:
              np.testing.assert_array_equal(gain, 1.0)
            else:
              self.assertFalse(np.all(gain == 1.0))
        self._check_export(model_dir, model, run,
                           per_channel=options is authors)

  def _check_export(self, model_dir, model, run, per_channel):
    """The export of MODEL_DIR serves what MODEL computes on its input."""
    export_dir = os.path.join(model_dir, "export")
    _, version_dir, info = export.export_run(model_dir, export_dir)
    self.assertEqual(info["model"]["name"], run.config.model)
    self.assertEqual(info["preprocessing"], run.preprocessing.to_dict())
    served = tf.saved_model.load(version_dir)
    raw = np.random.default_rng(1).integers(
        0, 256, (2, 32, 32, 3)).astype(np.float32)
    out = served.signatures[contract.DEFAULT_SIGNATURE](
        **{contract.INPUT_KEY: tf.constant(raw)})
    # The restored network on the same pixels, standardised here.
    def probabilities(preprocessing):
      logits = model(_standardised(raw, preprocessing)).numpy()
      p = np.exp(logits - logits.max(axis=1, keepdims=True))
      return p / p.sum(axis=1, keepdims=True)
    expected = probabilities(run.preprocessing)
    np.testing.assert_allclose(out[contract.PROBABILITIES_KEY].numpy(),
                               expected, rtol=1e-4, atol=1e-6)
    if per_channel:  # Per-image input would be told apart.
      self.assertGreater(np.abs(probabilities(dataclasses.replace(
          run.preprocessing, standardize="per_image", mean=None,
          std=None)) - expected).max(), 1e-4)


def _standardised(raw, preprocessing):
  """RAW 0-255 pixels [n, H, W, 3] as evaluation standardises them, in
  NumPy: per image, or with the dataset's mean and deviation."""
  if preprocessing.standardize == "per_image":
    mean = raw.mean(axis=(1, 2, 3), keepdims=True)
    std = np.maximum(raw.std(axis=(1, 2, 3), keepdims=True),
                     1 / math.sqrt(raw[0].size))
    return ((raw - mean) / std).astype(np.float32)
  return ((raw - np.array(preprocessing.mean))
          / np.array(preprocessing.std)).astype(np.float32)


# ---------------------------------------------------------------------------
# The peers (identity_tf.peers) against their papers, each formula written
# out here, on units and draws that tell the alternatives apart.

def _conv(x, kernel, strides=1):
  """A 'same' convolution of X by KERNEL (TensorFlow's primitive)."""
  return tf.nn.conv2d(x, kernel, strides, "SAME").numpy()


def _randomise(layer, seed, scale=0.3):
  """Every weight of LAYER drawn from N(0, SCALE^2): nothing left at the
  zeros or ones of an initialisation that would hide a missing term."""
  rng = np.random.default_rng(seed)
  for w in layer.weights:
    w.assign(scale * rng.standard_normal(w.shape).astype(np.float32))


def _unit(model, stage, index=1):
  return model.get_layer(f"stage{stage}_unit{index}")


class FixupPeerTest(absltest.TestCase):
  """Fixup's network (Zhang, Dauphin & Ma, 2019) as its authors' CIFAR code
  builds it: C1 He-normal by fan-out over sqrt(L), the stem at PyTorch's
  default draw, scalar biases before the stem's ReLU and the classifier."""

  def test_c1_is_drawn_by_fan_out_where_it_differs_from_fan_in(self):
    # Stage 2's first unit at width 0.5: 32 channels in, 64 out, so the
    # fan-in (9 x 32) is half the fan-out (9 x 64); L = 3 branches.
    model = model_lib.build_model("fixup", width=0.5, units=1, classes=10)
    unit = _unit(model, 2)
    kernel = unit.conv1.kernel.numpy()
    self.assertEqual(kernel.shape, (3, 3, 32, 64))
    fan_out = 9 * 64
    expected = math.sqrt(2 / fan_out) / math.sqrt(3)
    self.assertAlmostEqual(kernel.std() / expected, 1.0, delta=0.04)
    # Untruncated, as the authors' normal_(0, std): about 1.2 % of the
    # entries lie beyond 2.5 standard deviations (none if truncated at 2).
    beyond = np.mean(np.abs(kernel) > 2.5 * expected)
    self.assertBetween(beyond, 0.006, 0.02)

  def test_the_stem_is_pytorchs_default_draw_then_bias_then_relu(self):
    model = model_lib.build_model("fixup", width=1.0, units=1, classes=10,
                                  seed=1)
    stem = model.get_layer("stem1")
    kernel = stem.kernel.numpy()
    # U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with fan_in = 3 x 3 x 3.
    bound = 1 / math.sqrt(27)
    self.assertLessEqual(np.abs(kernel).max(), bound)
    self.assertGreater(np.abs(kernel).max(), 0.9 * bound)
    self.assertAlmostEqual(kernel.std() / (bound / math.sqrt(3)), 1.0,
                           delta=0.12)
    model.get_layer("stem1_bias").bias.assign(-0.05)
    x = _images(2)
    relu = keras.Model(model.input, model.get_layer("stem1_relu").output)
    np.testing.assert_allclose(
        relu(x).numpy(), np.maximum(_conv(x, kernel) - 0.05, 0), atol=1e-5)

  def test_the_classifier_adds_its_scalar_bias_to_the_pooled_features(self):
    model = model_lib.build_model("fixup", width=0.125, units=1, classes=10,
                                  seed=2)
    for layer in _units(model):
      _randomise(layer, 3)
    head = model.get_layer("projection")
    rng = np.random.default_rng(4)
    head.kernel.assign(rng.standard_normal(head.kernel.shape))
    head.bias.assign(rng.standard_normal(head.bias.shape))
    model.get_layer("classifier_bias").bias.assign(0.7)
    x = _images(3)
    features = keras.Model(model.input,
                           model.get_layer("pool").output)(x).numpy()
    self.assertGreater(np.abs(features).max(), 1e-3)
    np.testing.assert_allclose(
        model(x).numpy(),
        (features + 0.7) @ head.kernel.numpy() + head.bias.numpy(),
        rtol=1e-4, atol=1e-5)

  def test_a_unit_that_keeps_its_shape_adds_x_itself(self):
    # The authors' identity = x: the shortcut of a unit that keeps the
    # shape is not shifted by bias1a (a downsampling one's is).
    unit = fixup.FixupUnit(4, strides=1, num_branches=4, seed=1)
    x = _images(2, channels=4, size=6)
    unit(x)
    _randomise(unit, 6, scale=1.0)
    b1a, b1b, b2a, s, b2b = (float(getattr(unit, n).numpy()) for n in (
        "bias1a", "bias1b", "bias2a", "scale", "bias2b"))
    hidden = np.maximum(_conv(x + b1a, unit.conv1.kernel) + b1b, 0)
    branch = _conv(hidden + b2a, unit.conv2.kernel) * s + b2b
    np.testing.assert_allclose(unit(x).numpy(), np.maximum(x + branch, 0),
                               rtol=1e-5, atol=1e-5)


class SkipInitPeerTest(absltest.TestCase):
  """SkipInit's unit (De & Smith, 2020, Section 4) with every weight set:
  x -> S(x) + a C2(ReLU(C1(ReLU(x))))."""

  def test_the_unit_is_its_formula_with_the_gain_open(self):
    for filters, strides, channels in ((4, 1, 4), (6, 2, 4)):
      with self.subTest(strides=strides):
        unit = skipinit.SkipInitUnit(filters, strides=strides, seed=3)
        x = _images(2, channels=channels, size=8)
        unit(x)
        _randomise(unit, 7)
        unit.skip_gain.assign(0.8)
        branch = _conv(np.maximum(_conv(np.maximum(x, 0), unit.conv1.kernel,
                                        strides), 0), unit.conv2.kernel)
        np.testing.assert_allclose(
            unit(x).numpy(),
            _pool_pad_shortcut(x, filters, strides) + 0.8 * branch,
            rtol=1e-5, atol=1e-5)

  def test_convolutions_are_drawn_from_a_normal_not_a_uniform(self):
    # Both of He et al.'s draws have variance 2 / fan_in; only the normal
    # (Keras's, truncated at 2 of its standard deviations) reaches past
    # sqrt(3) standard deviations, the uniform's edge.
    model = model_lib.build_model("skipinit", width=0.5, units=1, classes=10)
    kernel = _unit(model, 3).conv2.kernel.numpy()
    self.assertAlmostEqual(kernel.std() / math.sqrt(2 / (9 * 128)), 1.0,
                           delta=0.03)
    self.assertGreater(np.abs(kernel).max() / kernel.std(), 2.0)

  def test_the_network_ends_in_a_relu_before_its_trained_classifier(self):
    model = model_lib.build_model("skipinit", width=0.125, units=1,
                                  classes=10, seed=1)
    for layer in _units(model):
      _randomise(layer, 8)
    x = _images(2)
    last = keras.Model(model.input, _units(model)[-1].output)(x).numpy()
    self.assertLess(last.min(), 0)  # The ReLU has something to cut.
    head = model.get_layer("projection")
    self.assertTrue(head.trainable)
    np.testing.assert_allclose(
        model(x).numpy(),
        np.maximum(last, 0).mean(axis=(1, 2)) @ head.kernel.numpy()
        + head.bias.numpy(), rtol=1e-4, atol=1e-6)


def _numpy_ws(conv):
  """Scaled weight standardisation written out (Brock et al., 2021,
  Section 4.2): g (W - mean) / sqrt(max(var fan_in, 1e-4)) per output
  channel, over the kernel's other axes."""
  w = conv.kernel.numpy().astype(np.float64)
  fan_in = np.prod(w.shape[:-1])
  mean = w.mean(axis=(0, 1, 2))
  var = w.var(axis=(0, 1, 2))
  return ((w - mean) / np.sqrt(np.maximum(var * fan_in, 1e-4))
          * conv.gain.numpy()).astype(np.float32)


class NFResNetPeerTest(absltest.TestCase):
  """NF-ResNet's unit (Brock, De & Smith, 2021, Section 4): h -> S(h) +
  alpha a C2(gamma ReLU(C1(x))), x = gamma ReLU(h) / beta with beta the
  expected std of h, which grows by alpha^2 in variance per unit and is
  reset by each stage's first unit (its shortcut takes x)."""

  ALPHA = 0.2
  GAMMA = math.sqrt(2 / (1 - 1 / math.pi))

  def test_each_units_beta_is_its_inputs_expected_std(self):
    per_stage = 3
    model = model_lib.build_model("nf_resnet", width=0.125, units=per_stage,
                                  classes=10)
    units = _units(model)
    self.assertLen(units, 3 * per_stage)
    for unit in units:
      stage, index = (int(n) for n in re.match(
          r"stage(\d+)_unit(\d+)", unit.name).groups())
      # Stage 1's first unit sees the stem's unit variance; every later
      # first unit the previous stage's 1 + per_stage alpha^2; the others
      # 1 + (index - 1) alpha^2 after their stage's reset.
      if index == 1:
        variance = 1.0 if stage == 1 else 1 + per_stage * self.ALPHA ** 2
      else:
        variance = 1 + (index - 1) * self.ALPHA ** 2
      with self.subTest(unit.name):
        self.assertAlmostEqual(unit.beta, 1 / math.sqrt(variance),
                               places=12)
        self.assertAlmostEqual(unit.alpha, self.ALPHA, places=12)

  def test_the_unit_is_its_formula_with_every_weight_set(self):
    for filters, strides, channels in ((4, 1, 4), (6, 2, 4), (6, 1, 4)):
      with self.subTest(strides=strides, channels=channels):
        unit = nf_resnet.NFUnit(filters, strides=strides, beta=0.8, seed=3)
        h = _images(2, channels=channels, size=8)
        unit(h)
        _randomise(unit, 9)
        unit.skip_gain.assign(0.9)
        for conv in (unit.conv1, unit.conv2, unit.conv_shortcut):
          if conv is not None:
            conv.gain.assign(np.linspace(0.5, 1.5, conv.filters))

        def conv(t, layer, stride=1):
          return _conv(t, _numpy_ws(layer), stride) + layer.bias.numpy()
        x = self.GAMMA * np.maximum(h, 0) * 0.8
        branch = conv(self.GAMMA * np.maximum(conv(x, unit.conv1, strides),
                                              0), unit.conv2)
        shortcut = (conv(x, unit.conv_shortcut, strides)
                    if unit.projects else h)
        self.assertEqual(unit.projects, (strides, channels) != (1, filters))
        np.testing.assert_allclose(
            unit(h).numpy(), shortcut + self.ALPHA * 0.9 * branch,
            rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
  absltest.main()
