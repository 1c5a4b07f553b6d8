"""Tests of the residual layers and the paper's networks (issue: foundation)."""

import dataclasses
import json
import math
import os
import tempfile

from absl.testing import absltest
import keras
import numpy as np

import identity_tf
from identity_tf import architectures
from identity_tf import errors
from identity_tf import layers
from identity_tf import model as model_lib
import testing

# Table 1 of the paper, written out independently of model.py: per stage
# (input channels, width, first stride, units).
TABLE_1 = [(16, 64, 1, 9), (64, 128, 2, 9), (128, 256, 2, 9)]
RESNET34_STAGES = [(64, 64, 1, 3), (64, 128, 2, 4), (128, 256, 2, 6),
                   (256, 512, 2, 3)]


def conv_weights(stages, k=3):
  """k x k kernels of the residual units: C1 c_in->c, C2 c->c, then c->c."""
  total = 0
  for c_in, c, _, units in stages:
    total += k * k * c_in * c + k * k * c * c
    total += (units - 1) * 2 * k * k * c * c
  return total


def numpy_shortcut(x, channels, stride):
  """Average pooling by STRIDE and even zero-padding of channels, in NumPy."""
  if stride > 1:
    n, h, w, c = x.shape
    x = x.reshape(n, h // stride, stride, w // stride, stride, c).mean(axis=(2, 4))
  extra = channels - x.shape[-1]
  return np.pad(x, [(0, 0)] * 3 + [(extra // 2, extra - extra // 2)])


def zero_last_convolutions(model):
  for layer in model.layers:
    if isinstance(layer, layers.ConvResidualUnit):
      layer.conv2.kernel.assign(np.zeros(layer.conv2.kernel.shape, "float32"))


def tiny(name="cifar10", **options):
  return identity_tf.build_model(
      name, **{"width": 0.125, "units": 1, "image_size": 16, **options})


class ResidualUnitTest(absltest.TestCase):

  def test_unit_with_zero_branch_is_identity_when_shape_is_kept(self):
    unit = layers.ConvResidualUnit(8, seed=1)
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 8)).astype("float32")
    unit(x)
    self.assertGreater(np.abs(unit(x) - x).max(), 0)  # a live branch moves x
    unit.conv2.kernel.assign(np.zeros(unit.conv2.kernel.shape, "float32"))
    np.testing.assert_array_equal(unit(x), x)

  def test_unit_with_zero_branch_is_pool_and_pad_shortcut(self):
    for c_in, c_out, stride in [(4, 8, 2), (3, 8, 2), (16, 64, 1)]:
      unit = layers.ConvResidualUnit(c_out, strides=stride, seed=2)
      x = np.random.default_rng(1).normal(size=(2, 8, 8, c_in)).astype("float32")
      unit(x)
      unit.conv2.kernel.assign(np.zeros(unit.conv2.kernel.shape, "float32"))
      np.testing.assert_allclose(
          unit(x), numpy_shortcut(x, c_out, stride), rtol=1e-6, atol=1e-6)

  def test_unit_refuses_to_shrink_channels(self):
    with self.assertRaisesRegex(ValueError, "cannot shrink 8 channels to 4"):
      layers.ConvResidualUnit(4)(np.zeros((1, 4, 4, 8), "float32"))

  def test_dense_unit_matches_paper_formula(self):
    rng = np.random.default_rng(3)
    k = 5
    u, v = rng.normal(size=(k, k)), rng.normal(size=(k, k))
    b = rng.normal(size=k)
    h = rng.normal(size=(7, k))
    unit = layers.DenseResidualUnit()
    unit(h.astype("float32"))
    unit.set_matrices(u, v, b)
    expected = np.stack([x + v @ np.maximum(u @ x + b, 0) for x in h])
    np.testing.assert_allclose(unit(h.astype("float32")), expected,
                               rtol=1e-5, atol=1e-5)
    unit.set_matrices(u, np.zeros((k, k)), b)
    np.testing.assert_allclose(unit(h.astype("float32")), h, rtol=1e-6)

  def test_initializer_scales(self):
    shape = (3, 3, 64, 64)
    for scheme, expected in [("paper", 1 / (9 * 64)),
                             ("standard", 1 / (3 * math.sqrt(64)))]:
      sample = np.asarray(layers.ResidualInitializer(scheme, seed=5)(shape))
      self.assertAlmostEqual(sample.std() / expected, 1.0, delta=0.02)
      self.assertAlmostEqual(sample.mean() / expected, 0.0, delta=0.02)
    with self.assertRaisesRegex(ValueError, "valid: paper, standard"):
      layers.ResidualInitializer("he")


def numpy_standardised(layer):
  """LAYER's kernel scaled-weight-standardised (Brock et al., 2021, Section
  4.2) in NumPy: gain * (W - mean) / (std sqrt(fan_in)) per output channel."""
  w = np.asarray(layer.kernel, np.float64)
  fan_in = np.prod(w.shape[:-1])
  return ((w - w.mean(axis=(0, 1, 2))) / (w.std(axis=(0, 1, 2))
          * math.sqrt(fan_in)) * np.asarray(layer.gain)).astype("float32")


def reference_branch(x, unit, kernel=lambda layer: np.asarray(layer.kernel)):
  """C2(ReLU(C1 x)) of a unit with tf.nn.conv2d, not Keras's Conv2D; KERNEL
  gives the kernel a convolution layer computes with."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def conv(inputs, layer, strides):
    out = tf.nn.conv2d(inputs, kernel(layer), strides, "SAME")
    return out + np.asarray(layer.bias) if layer.use_bias else out
  return conv(tf.nn.relu(conv(x, unit.conv1, unit.strides)), unit.conv2, 1)


class StabiliserTest(absltest.TestCase):
  """SkipInit, Fixup and the projection's scale against their formulas."""

  def test_skipinit_starts_at_the_identity_and_scales_the_branch(self):
    rng = np.random.default_rng(10)
    x = rng.normal(size=(2, 8, 8, 4)).astype("float32")
    for c_out, stride in [(4, 1), (8, 2)]:
      unit = layers.ConvResidualUnit(c_out, strides=stride, seed=3,
                                     branch_gain="zero")
      np.testing.assert_allclose(unit(x), numpy_shortcut(x, c_out, stride),
                                 rtol=1e-6, atol=1e-6)  # De & Smith: a = 0.
      unit.branch_gain.assign(0.7)
      np.testing.assert_allclose(
          unit(x), numpy_shortcut(x, c_out, stride) +
          0.7 * np.asarray(reference_branch(x, unit)), rtol=1e-4, atol=1e-5)

  def test_standardised_units_start_at_identity_and_standardise(self):
    rng = np.random.default_rng(14)
    x = rng.normal(size=(2, 8, 8, 4)).astype("float32")
    # (draw, use_bias, init_scale, ws_gain, C2's kernel std for c
    # channels, its tolerance): NF-ResNet's unit fan-in variance (Keras's
    # truncated normal keeps it), or the paper's std 1/(k^2 c) (Section 4),
    # or twice it; the per-channel gain trained or frozen at 1.
    cases = (("fan_in", False, 1, "trained",
              lambda c: 1 / math.sqrt(9 * c), 0.15),
             ("fan_in", True, 1, "trained",
              lambda c: 1 / math.sqrt(9 * c), 0.15),
             ("paper", False, 1, "trained", lambda c: 1 / (9 * c), 0.2),
             ("paper", False, 2, "trained", lambda c: 2 / (9 * c), 0.2),
             ("paper", False, 2, "frozen", lambda c: 2 / (9 * c), 0.2),
             ("fan_in", False, 3, "trained",
              lambda c: 3 / math.sqrt(9 * c), 0.15))
    for draw, use_bias, scale, ws_gain, std, delta in cases:
      for c_out, stride in [(4, 1), (8, 2)]:
        unit = layers.ConvResidualUnit(
            c_out, strides=stride, seed=6, branch_gain="zero",
            weight_standardization=True, ws_gain=ws_gain,
            kernel_initializer=draw, use_bias=use_bias, init_scale=scale)
        np.testing.assert_allclose(unit(x), numpy_shortcut(x, c_out, stride),
                                   rtol=1e-6, atol=1e-6)  # a = 0, b = 0.
        self.assertAlmostEqual(
            np.asarray(unit.conv2.kernel).std() / std(c_out), 1.0,
            delta=delta)
        trainable = {id(w) for w in unit.trainable_weights}
        for conv in (unit.conv1, unit.conv2):
          np.testing.assert_array_equal(np.asarray(conv.gain), 1.0)
          self.assertEqual(id(conv.gain) in trainable, ws_gain == "trained")
        unit.branch_gain.assign(0.7)
        unit.conv1.gain.assign(rng.uniform(0.5, 2, size=c_out))
        # The branch does not depend on the kernels' scale.
        unit.conv2.kernel.assign(np.asarray(unit.conv2.kernel) * 5 + 0.3)
        if use_bias:  # C2(ReLU(C1 x + b1)) + b2.
          for conv in (unit.conv1, unit.conv2):
            conv.bias.assign(rng.normal(size=c_out).astype("float32"))
        reference = reference_branch(x, unit, kernel=numpy_standardised)
        np.testing.assert_allclose(
            unit(x), numpy_shortcut(x, c_out, stride) +
            0.7 * np.asarray(reference), rtol=1e-4, atol=1e-5)

  def test_branch_draw_scale_multiplies_the_plain_kernels(self):
    # Without standardisation init_scale changes the function: C1 and C2 at
    # s times the paper's std 1/(k^2 c), the branch s^2 times larger.
    x = np.random.default_rng(15).normal(size=(2, 8, 8, 4)).astype("float32")
    base = layers.ConvResidualUnit(8, strides=2, seed=7)
    scaled = layers.ConvResidualUnit(8, strides=2, seed=7, init_scale=3.0)
    shortcut = numpy_shortcut(x, 8, 2)
    base(x), scaled(x)
    for a, b in ((base.conv1, scaled.conv1), (base.conv2, scaled.conv2)):
      np.testing.assert_allclose(np.asarray(b.kernel),
                                 3.0 * np.asarray(a.kernel), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(scaled(x)) - shortcut,
                               9.0 * (np.asarray(base(x)) - shortcut),
                               rtol=1e-4, atol=1e-6)

  def test_fixup_initialisation_is_zhang_et_als(self):
    # Rule 2: C1 ~ N(0, 2 / fan_in) scaled by L^(-1/2); C2 = 0; scalars 0/1.
    branches, c = 16, 64
    unit = layers.ConvResidualUnit(c, seed=4, residual="fixup",
                                   num_branches=branches)
    x = np.ones((1, 4, 4, c), "float32")
    np.testing.assert_array_equal(unit(x), x)  # The identity at the start.
    kernel = np.asarray(unit.conv1.kernel)
    expected_std = math.sqrt(2.0 / (3 * 3 * c)) / math.sqrt(branches)
    self.assertAlmostEqual(kernel.std() / expected_std, 1.0, delta=0.02)
    np.testing.assert_array_equal(np.asarray(unit.conv2.kernel), 0.0)
    self.assertEqual([float(unit.scale)], [1.0])
    for bias in (unit.bias1a, unit.bias1b, unit.bias2a, unit.bias2b):
      self.assertEqual(float(bias), 0.0)

  def test_fixup_forward_is_its_formula(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    rng = np.random.default_rng(11)
    x = rng.normal(size=(2, 8, 8, 4)).astype("float32")
    for c_out, stride in [(4, 1), (8, 2)]:
      unit = layers.ConvResidualUnit(c_out, strides=stride, seed=5,
                                     residual="fixup", num_branches=3)
      unit(x)
      unit.conv2.kernel.assign(
          rng.normal(size=unit.conv2.kernel.shape).astype("float32") * 0.1)
      b1a, b1b, b2a, s, b2b = 0.3, -0.2, 0.1, 1.5, 0.05
      for weight, value in zip((unit.bias1a, unit.bias1b, unit.bias2a,
                                unit.scale, unit.bias2b),
                               (b1a, b1b, b2a, s, b2b)):
        weight.assign(value)
      # Figure 1 (right) of Zhang et al. (2019) on the paper's unit.
      k1 = np.asarray(unit.conv1.kernel)
      k2 = np.asarray(unit.conv2.kernel)
      hidden = tf.nn.relu(tf.nn.conv2d(x + b1a, k1, stride, "SAME") + b1b)
      branch = tf.nn.conv2d(hidden + b2a, k2, 1, "SAME") * s + b2b
      identity = x if stride == 1 and c_out == 4 else x + b1a
      np.testing.assert_allclose(
          unit(x), numpy_shortcut(np.asarray(identity), c_out, stride) +
          np.asarray(branch), rtol=1e-4, atol=1e-5)

  def test_projection_scales(self):
    for scale, fan in (("classes", 10), ("features", 256)):
      projection = layers.RandomProjection(10, seed=9, scale=scale)
      projection.build((None, 256))
      expected = np.random.default_rng(9).standard_normal((256, 10))
      np.testing.assert_allclose(np.asarray(projection.kernel),
                                 expected / math.sqrt(fan), rtol=1e-6)

  def test_options_survive_a_keras_file(self):
    images = np.random.default_rng(12).normal(size=(2, 16, 16, 3)).astype(
        "float32")
    for options in (dict(branch_gain="zero"), dict(residual="fixup"),
                    dict(branch_gain="one"),
                    dict(branch_gain="zero", weight_standardization=True,
                         branch_init="fan_in"),
                    dict(branch_gain="zero", weight_standardization=True,
                         branch_init="fan_in", use_bias=True),
                    dict(branch_gain="zero", weight_standardization=True,
                         ws_gain="frozen", branch_init_scale=2.0),
                    dict(projection_scale="features")):
      model = tiny(units=2, **options)
      for weight in model.weights:  # Off the initial values.
        weight.assign(weight + 0.01)
      with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
      np.testing.assert_array_equal(model(images), loaded(images))
      unit = loaded.get_layer("stage1_unit1")
      self.assertEqual(unit.residual, options.get("residual", "plain"))
      self.assertEqual(unit.branch_gain_init,
                       options.get("branch_gain", "none"))
      self.assertEqual(unit.weight_standardization,
                       options.get("weight_standardization", False))
      self.assertEqual(len(loaded.trainable_weights),
                       len(model.trainable_weights))
      self.assertEqual(loaded.get_layer("projection").scale,
                       options.get("projection_scale", "classes"))
      if options.get("residual") == "fixup":
        self.assertEqual(unit.num_branches, 6)  # 3 stages x 2 units.

  def test_stabilisers_refuse_batch_norm_and_bad_combinations(self):
    with self.assertRaisesRegex(ValueError, "does not combine with norm"):
      tiny("resnet_bn", branch_gain="zero")
    with self.assertRaisesRegex(ValueError, "valid: plain, fixup"):
      tiny(residual="rezero")
    with self.assertRaisesRegex(ValueError, "valid: none, zero, one"):
      tiny(branch_gain="two")
    with self.assertRaisesRegex(ValueError, "use init paper or standard"):
      tiny(weight_standardization=True, init="fixup")
    with self.assertRaisesRegex(ValueError, "set weight_standardization"):
      tiny(ws_gain="frozen")
    with self.assertRaisesRegex(ValueError, "set weight_standardization"):
      tiny(branch_init="fan_in")
    with self.assertRaisesRegex(ValueError, "own trained multiplier"):
      tiny(residual="fixup", branch_gain="zero")
    with self.assertRaisesRegex(ValueError, "branch_init_scale must be"):
      tiny(branch_init_scale=0.0)
    with self.assertRaisesRegex(ValueError, "needs num_branches"):
      layers.ConvResidualUnit(4, residual="fixup")

  def test_probe_sees_every_stage_in_forward_order(self):
    model = tiny()
    probe = model_lib.activation_probe(model)
    images = np.random.default_rng(13).normal(size=(2, 16, 16, 3)).astype(
        "float32")
    outputs = probe(images)
    self.assertEqual(list(outputs),
                     ["stem", "stage1", "stage2", "stage3", "logits"])
    np.testing.assert_allclose(outputs["logits"], model(images), rtol=1e-6)
    reference = keras.Model(model.input,
                            model.get_layer("stage2_unit1").output)
    np.testing.assert_allclose(outputs["stage2"], reference(images),
                               rtol=1e-6)


class NetworkTest(absltest.TestCase):

  def test_table_1_counts(self):
    model = identity_tf.build_model("cifar10")
    totals = identity_tf.describe(model)
    self.assertEqual(totals["convolutions"], 1 + 2 * 27)
    self.assertEqual(totals["trainable_weights"],
                     3 * 3 * 3 * 16 + conv_weights(TABLE_1))
    self.assertEqual(round(totals["trainable_weights"] / 1e6, 2), 13.54)
    self.assertEqual(totals["non_trainable_weights"], 256 * 10)
    self.assertEqual(
        identity_tf.describe(identity_tf.build_model("cifar100"))[
            "non_trainable_weights"], 256 * 100)

  def test_shapes_through_every_stage(self):
    model = identity_tf.build_model("cifar10")
    expected = {"stem1": (32, 32, 16), "stage1_unit9": (32, 32, 64),
                "stage2_unit1": (16, 16, 128), "stage3_unit1": (8, 8, 256),
                "stage3_unit9": (8, 8, 256), "pool": (256,),
                "projection": (10,)}
    for name, shape in expected.items():
      self.assertEqual(tuple(model.get_layer(name).output.shape[1:]), shape,
                       name)

  def test_imagenet_counts_and_shapes(self):
    model = identity_tf.build_model("imagenet")
    totals = identity_tf.describe(model)
    self.assertEqual(totals["convolutions"], 2 + 2 * (3 + 4 + 6 + 3))
    self.assertEqual(
        totals["trainable_weights"],
        7 * 7 * 3 * 64 + 3 * 3 * 64 * 64 + conv_weights(RESNET34_STAGES))
    self.assertEqual(totals["non_trainable_weights"], 512 * 1000)
    self.assertEqual(tuple(model.get_layer("stem2").output.shape[1:]),
                     (56, 56, 64))
    self.assertEqual(tuple(model.get_layer("stage4_unit3").output.shape[1:]),
                     (7, 7, 512))

  def test_zero_branches_make_the_network_its_shortcuts(self):
    # Table 1's stem (16 x 0.125 = 2 channels, padded to stage 1's 8) and
    # one as wide as stage 1 (64 x 0.125 = 8: stage 1's first unit keeps
    # the shape, its shortcut the identity).
    for stem_channels, channels in ((None, 2), (64, 8)):
      with self.subTest(stem_channels=stem_channels):
        model = tiny(units=2, stem_channels=stem_channels)
        zero_last_convolutions(model)
        probe = keras.Model(model.input, [model.get_layer("stem1").output,
                                          model.get_layer("pool").output])
        images = np.random.default_rng(4).normal(
            size=(3, 16, 16, 3)).astype("float32")
        stem, pooled = (np.asarray(t) for t in probe(images))
        self.assertEqual(stem.shape[-1], channels)
        x = stem
        for (_, width, stride, _) in TABLE_1:
          x = numpy_shortcut(x, round(width * 0.125), stride)
        np.testing.assert_allclose(pooled, x.mean(axis=(1, 2)), rtol=1e-5,
                                   atol=1e-6)

  def test_normalisation_only_in_resnet_bn(self):
    for name in ("cifar10", "cifar100", "imagenet"):
      self.assertEmpty(testing.normalization_layers(
          identity_tf.build_model(name, units=1, width=0.125)), name)
    self.assertLen(testing.normalization_layers(tiny("resnet_bn")),
                   2 * 3 + 1)

  def test_fit_trains_convolutions_and_leaves_projection_alone(self):
    model = tiny()
    model.trainable = True  # must not unfreeze the projection
    projection = model.get_layer("projection").kernel
    self.assertNotIn(id(projection), [id(w) for w in model.trainable_weights])
    before = {w.path: np.array(w) for w in model.weights}
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    rng = np.random.default_rng(5)
    model.fit(rng.normal(size=(16, 16, 16, 3)).astype("float32"),
              rng.integers(0, 10, size=16), batch_size=8, epochs=1, verbose=0)
    after = {w.path: np.array(w) for w in model.weights}
    conv_paths = [p for p in before if before[p].ndim == 4]
    self.assertLen(conv_paths, 7)
    for path in conv_paths:
      self.assertFalse(np.array_equal(before[path], after[path]), path)
    np.testing.assert_array_equal(before[projection.path],
                                  after[projection.path])

  def test_trainable_head_is_trained(self):
    model = tiny(head="trainable")
    self.assertIn(model.get_layer("projection").kernel.path,
                  [w.path for w in model.trainable_weights])

  def test_keras_round_trip_and_projection_seed(self):
    model = tiny(seed=7)
    images = np.random.default_rng(6).normal(size=(2, 16, 16, 3)).astype("float32")
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "model.keras")
      model.save(path)
      loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(model(images), loaded(images))
    self.assertFalse(loaded.get_layer("projection").kernel.trainable)
    kernel = np.array(model.get_layer("projection").kernel)
    again = np.array(tiny(seed=7).get_layer("projection").kernel)
    other = np.array(tiny(seed=8).get_layer("projection").kernel)
    np.testing.assert_array_equal(kernel, again)
    self.assertFalse(np.array_equal(kernel, other))
    # Documented scale: N(0, 1/classes) entries.
    big = layers.RandomProjection(1000, seed=0)
    big.build((None, 512))
    self.assertAlmostEqual(float(np.std(big.kernel)) * math.sqrt(1000), 1.0,
                           delta=0.01)

  def test_same_seed_same_network(self):
    a, b = tiny(seed=3), tiny(seed=3)
    for wa, wb in zip(a.weights, b.weights):
      np.testing.assert_array_equal(wa, wb, wa.path)
    c = tiny(seed=4)
    self.assertFalse(np.array_equal(a.get_layer("stage1_unit1").conv1.kernel,
                                    c.get_layer("stage1_unit1").conv1.kernel))

  def test_bad_options_name_the_valid_values(self):
    cases = [
        (dict(name="cifar11"), "valid: cifar10, cifar100, fixup, imagenet, "
                               "nf_resnet, resnet_bn, skipinit"),
        (dict(name="cifar10", units=0), "units must be one positive integer"),
        (dict(name="cifar10", units=[9, 9]), "or 3 \\(one per stage of "
         "cifar10\\), got 9,9"),
        (dict(name="cifar10", width=-1.0), "width must be a positive"),
        (dict(name="cifar10", head="linear"), "valid: frozen, trainable"),
        (dict(name="cifar10", init="he"), "valid: paper, standard"),
        (dict(name="cifar10", branch_init="he"),
         "valid: paper, standard, fan_in"),
        (dict(name="cifar10", ws_gain="on", weight_standardization=True),
         "valid: trained, frozen"),
        (dict(name="cifar10", depth=3),
         "unknown option.*valid: branch_gain, .*classes"),
        (dict(name="cifar10", classes=1), "classes must be an integer >= 2"),
        (dict(name="cifar10", projection_scale="d"),
         "valid: classes, features"),
        (dict(name="cifar10", stem_channels=0),
         "^stem_channels must be a positive integer .*, got 0$"),
        (dict(name="fixup", stem_channels=2.5),
         "^stem_channels must be a positive integer .*, got 2.5$"),
        (dict(name="cifar10", stem_channels=True),
         "^stem_channels must be a positive integer .*, got True$"),
        (dict(name="cifar10", stem_channels="64"),
         "^stem_channels must be a positive integer .*, got '64'$"),
        (dict(name="nf_resnet", stem_channels=65),
         "^stem_channels=65 is wider than stage 1's 64 channels, .*; use at "
         "most 64$"),
    ]
    for kwargs, message in cases:
      with self.assertRaisesRegex(ValueError, message):
        identity_tf.build_model(**kwargs)


class StemChannelsTest(absltest.TestCase):
  """`stem_channels`: every builder's stem at that many channels times the
  width, and the units after it taking whatever the stem gives them."""

  def test_every_builder_scales_the_stem_and_feeds_stage_1(self):
    images = np.random.default_rng(0).normal(size=(2, 16, 16, 3)).astype(
        "float32")
    for name in ("cifar10", "resnet_bn", "fixup", "skipinit", "nf_resnet"):
      # Table 1's (16 x 0.125), narrower than stage 1 (24 x 0.125 = 3) and
      # as wide as it (64 x 0.125 = 8, the Fixup authors' layout).
      for stem_channels, channels in ((None, 2), (24, 3), (64, 8)):
        with self.subTest(name, stem_channels=stem_channels):
          model = tiny(name, stem_channels=stem_channels)
          self.assertEqual(model.build_options["stem_channels"],
                           stem_channels or 16)
          self.assertEqual(model.get_layer("stem1").kernel.shape,
                           (3, 3, 3, channels))
          first = model.get_layer("stage1_unit1")
          self.assertEqual((first.input.shape[-1], first.output.shape[-1]),
                           (channels, 8))
          self.assertEqual(model(images).shape, (2, 10))
    # The ImageNet network's two stem convolutions alike (32 / 16 = 2).
    model = identity_tf.build_model("imagenet", width=1 / 16, units=1,
                                    image_size=32, stem_channels=32)
    for layer in ("stem1", "stem2"):
      self.assertEqual(model.get_layer(layer).kernel.shape[-1], 2, layer)


class ModelOptionsTest(absltest.TestCase):
  """`architectures.ModelOptions` and config.json's "model" "options"."""

  def test_the_options_are_complete_and_round_trip_through_json(self):
    self.assertEqual([f.name for f in dataclasses.fields(
        architectures.ModelOptions)], list(architectures.DEFAULTS))
    for name in architectures.MODELS:
      _, options = architectures.complete_options(name, width=0.5, units=2)
      self.assertIsInstance(options, architectures.ModelOptions)
      stored = json.loads(json.dumps(options.to_dict()))
      self.assertEqual(list(stored), sorted(stored))  # As config.json.
      self.assertEqual(architectures.ModelOptions.from_dict(name, stored),
                       options)
    # By hand: Table 1's network for ten classes.
    self.assertEqual(architectures.complete_options("cifar10")[1].to_dict(), {
        "branch_gain": "none", "branch_init": None,
        "branch_init_scale": 1.0, "classes": 10, "head": "frozen",
        "image_size": 32, "init": "paper", "logit_scale": 1.0, "norm": False,
        "projection_scale": "classes", "residual": "plain", "seed": 0,
        "stem_channels": 16, "units": [9, 9, 9], "use_bias": False,
        "weight_standardization": False, "width": 1.0, "ws_gain": "trained"})

  def test_the_combined_residual_names_of_earlier_versions_read_as_today(self):
    # Each earlier `residual` value (with its ws_init_scale) -> the options
    # that build the same network, written out by hand.
    def today(**changes):
      return architectures.complete_options("cifar10", **changes)[1]
    cases = {
        ("skipinit", 1.0): today(branch_gain="zero"),
        ("gain", 1.0): today(branch_gain="one"),
        ("fixup", 1.0): today(residual="fixup"),
        ("plain", 1.0): today(),
        ("skipinit_ws", 1.0): today(branch_gain="zero",
                                    weight_standardization=True,
                                    branch_init="fan_in"),
        ("skipinit_ws_small", 2.0): today(branch_gain="zero",
                                          weight_standardization=True,
                                          branch_init="paper",
                                          branch_init_scale=2.0),
    }
    for (residual, scale), expected in cases.items():
      stored = {**today().to_dict(), "residual": residual,
                "ws_init_scale": scale}
      for name in ("branch_gain", "weight_standardization", "ws_gain",
                   "branch_init", "branch_init_scale"):
        del stored[name]  # An earlier version wrote none of them.
      self.assertEqual(
          architectures.ModelOptions.from_dict("cifar10", stored), expected,
          residual)

  def test_options_of_an_older_run_take_the_defaults_it_built_with(self):
    with open(os.path.join(testing.source_root(), "tests", "testdata",
                           "run_5d502b4", "config.json")) as f:
      stored = json.load(f)["model"]
    options = architectures.ModelOptions.from_dict(stored["name"],
                                                   stored["options"])
    self.assertNotIn("logit_scale", stored["options"])  # Added since.
    self.assertNotIn("stem_channels", stored["options"])
    self.assertEqual((options.units, options.width, options.logit_scale,
                      options.stem_channels), ((1, 1, 1), 0.125, 1.0, 16))
    # Built from those options, the stem is Table 1's: 16 x 0.125 channels.
    network = identity_tf.build_model(stored["name"], **options.to_dict())
    self.assertEqual(network.get_layer("stem1").kernel.shape, (3, 3, 3, 2))
    with self.assertRaisesRegex(errors.ConfigError, "unknown option"):
      architectures.ModelOptions.from_dict("cifar10", {"depth": 3})
    with self.assertRaisesRegex(errors.ConfigError, "must be a dict"):
      architectures.ModelOptions.from_dict("cifar10", [])

  def test_build_model_takes_the_stored_options_as_keywords(self):
    _, options = architectures.complete_options(
        "cifar10", width=0.125, units=1, image_size=16)
    model = identity_tf.build_model("cifar10", **options.to_dict())
    self.assertEqual(model.build_options,
                     {"name": "cifar10", **options.to_dict()})


class SummaryBinaryTest(absltest.TestCase):

  def test_summary_prints_table_and_totals(self):
    result = testing.run_binary("summary", "--model=cifar10", check=True)
    self.assertIn("stage3_unit9", result.stdout)
    self.assertRegex(result.stdout, r"Convolutions:\s+55\n")
    self.assertRegex(result.stdout, r"Trainable weights:\s+13,538,736\n")

  def test_summary_shows_the_stabilisers(self):
    result = testing.run_binary("summary", "--model=cifar10", "--units=1",
                                "--width=0.125", "--branch_gain=zero",
                                "--projection_scale=features",
                                "--stem_channels=64", check=True)
    self.assertRegex(result.stdout, r"stem1 +Conv2D +32x32x8 ")
    self.assertRegex(result.stdout,
                     r"stage1_unit1 +ConvResidualUnit .*branch_gain=zero")
    self.assertRegex(result.stdout,
                     r"projection +RandomProjection .*scale=features, frozen")

  def test_summary_bad_option_is_one_line_error(self):
    result = testing.run_binary("summary", "--model=cifar10", "--units=0")
    self.assertEqual(result.returncode, 1)
    self.assertEqual(testing.last_stderr_line(result),
                     "error: units must be one positive integer or 3 (one "
                     "per stage of cifar10), got 0")
    self.assertNotIn("Traceback", result.stderr)


if __name__ == "__main__":
  absltest.main()
