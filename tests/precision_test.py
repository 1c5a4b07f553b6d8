"""--precision and --jit_compile: what each computes in, checked against
float32 computations of the same weights."""

import dataclasses
import json
import os

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import machine
from identity_tf import model as model_lib
from identity_tf.bench import rounding
from identity_tf.data import tfds_data
from identity_tf.serving import export as export_lib
from identity_tf.training import checkpoints
from identity_tf.training import distribute
from identity_tf.training import run as run_lib
from identity_tf.training import trainer as trainer_lib
import testing

TINY = dict(width=0.125, units=1, seed=5)
# bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4 %), float16 11;
# a tiny network's probabilities move by a few such steps.
BF16_PROBABILITY_TOLERANCE = 2e-2
# An export's probabilities against NumPy's softmax of a float32 restore of
# the same weights, per precision: float32 differs in the order of its
# reductions only; the 16-bit ones by a few rounding steps of their logits
# (measured in RunTest, logits of standard deviation 3: 7.5e-7, 1.9e-3 for
# float16, 2.0e-2 for bfloat16).
EXPORT_TOLERANCE = {"float32": 1e-5, "mixed_float16": 5e-3,
                    "mixed_bfloat16": 4e-2}


def _tiny_config(**overrides):
  return dataclasses.replace(
      configs.PRESETS["smoke"], **{
          **dict(batch_size=16, width=0.125, units=(1,), grad_clip_norm=1.0,
                 weight_decay=1e-4, learning_rate=0.05,
                 lr_schedule="constant"),
          **overrides})


def _trainer(config, model_dir, images, labels):
  """A Trainer of CONFIG fed the one batch (IMAGES, LABELS), restored new."""
  strategy = tf.distribute.get_strategy()
  run = run_lib.prepare(config, tfds_data.dataset_info(config.dataset),
                        model_dir)

  def dataset_fn(_):
    return tf.data.Dataset.from_tensors((images, labels)).repeat()

  trainer = trainer_lib.Trainer(run, strategy, dataset_fn=dataset_fn)
  trainer.restore(None)
  return trainer


def _batch(n=16, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.standard_normal((n, 32, 32, 3)).astype(np.float32),
          rng.integers(0, 10, n).astype(np.int32))


def _position_pixels(count, shift=0):
  """COUNT raw 32x32 RGB images whose pixels encode their position (row r,
  column c): red 8 r, green 8 c, blue (37 r + 11 c) mod 256, each image
  offset a little. SHIFT moves the rows by that many pixels: what a crop one
  pixel off would show (a different red at every pixel)."""
  rows, cols = np.meshgrid(np.arange(32) + shift, np.arange(32),
                           indexing="ij")
  return np.array([np.stack([(8 * rows + 3 * i) % 256,
                             (8 * cols + 5 * i) % 256,
                             (37 * rows + 11 * cols + 50 * i) % 256], -1)
                   for i in range(count)], np.float32)


def _per_image_standardized(pixels):
  """CIFAR's evaluation input in NumPy (no padding: the images are 32x32):
  each image minus its mean over H, W and channels, divided by max(its
  standard deviation, 1/sqrt(#values))."""
  x = pixels.astype(np.float64)
  mean = x.mean(axis=(1, 2, 3), keepdims=True)
  std = np.sqrt(((x - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True))
  return ((x - mean) / np.maximum(std, 1 / np.sqrt(x[0].size))).astype(
      np.float32)


def _softmax(logits):
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)


def _scaled(model, scale):
  """MODEL with its logits multiplied by SCALE: an untrained or briefly
  trained tiny network answers about 1/10 for every class, which any
  near-constant output would match."""
  image = keras.Input(model.input_shape[1:])
  return keras.Model(image, keras.layers.Rescaling(scale)(
      keras.ops.cast(model(image), "float32")))


def _agc_factors(grads, weights, agc_clip, epsilon=1e-3):
  """Adaptive gradient clipping (Brock et al., 2021, eq. 3), per unit -- an
  output channel, the last axis of a kernel; a whole vector or scalar --:
  min(1, lambda * max(||W_i||, eps) / ||G_i||), in NumPy."""
  def unit_norms(x):
    if x.ndim <= 1:
      return np.sqrt(np.sum(x * x))
    return np.sqrt(np.sum(x * x, axis=tuple(range(x.ndim - 1)),
                          keepdims=True))
  factors = []
  for g, w in zip(grads, weights):
    limit = agc_clip * np.maximum(unit_norms(w), epsilon)
    norm = unit_norms(g)
    factors.append(np.where(norm > limit, limit / np.maximum(norm, 1e-30),
                            1.0))
  return factors


def _clipped_sgd_update(model, images, labels, config):
  """One step of SGD with momentum from zero slots, in float64 NumPy from a
  float32 tape: the update -lr * clip(g) that //bin:train should apply, and
  whether the clipping changed the gradient (else the test proves nothing).
  """
  with tf.GradientTape() as tape:
    logits = model(images, training=True)
    loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True))
    loss += config.weight_decay * 0.5 * tf.add_n([
        tf.reduce_sum(tf.square(v)) for v in model.trainable_variables
        if len(v.shape) == 4])
  grads = [g.numpy().astype(np.float64)
           for g in tape.gradient(loss, model.trainable_variables)]
  clipped = False
  if config.agc_clip:
    factors = _agc_factors(grads, [v.numpy().astype(np.float64) for v in
                                   model.trainable_variables], config.agc_clip)
    clipped = any(np.any(f < 1) for f in factors)
    grads = [f * g for f, g in zip(factors, grads)]
  if config.grad_clip_norm:
    norm = np.sqrt(sum(np.sum(g * g) for g in grads))
    clipped = clipped or norm > config.grad_clip_norm
    grads = [min(1.0, config.grad_clip_norm / norm) * g for g in grads]
  return [-config.learning_rate * g for g in grads], clipped


class PolicyTest(absltest.TestCase):

  def test_mixed_precision_computes_convolutions_in_16_bits_only(self):
    for precision, compute in (("mixed_bfloat16", "bfloat16"),
                               ("mixed_float16", "float16")):
      model = model_lib.build_model("cifar10", precision=precision, **TINY)
      convolutions = [layer for layer in model._flatten_layers()  # pylint: disable=protected-access
                      if isinstance(layer, keras.layers.Conv2D)]
      self.assertLen(convolutions, 7)
      for layer in convolutions:
        self.assertEqual(layer.compute_dtype, compute, layer.name)
        self.assertEqual(layer.variable_dtype, "float32", layer.name)
      # The head -- pooling and projection -- computes in float32.
      for name in ("pool", "projection"):
        self.assertEqual(model.get_layer(name).compute_dtype, "float32")
      logits = model(np.zeros((2, 32, 32, 3), np.float32))
      self.assertEqual(logits.dtype, "float32")
      # The global policy is untouched.
      self.assertEqual(keras.config.dtype_policy().name, "float32")

  def test_a_saved_bfloat16_model_loads_in_bfloat16(self):
    model = model_lib.build_model("cifar10", precision="mixed_bfloat16",
                                  **TINY)
    path = os.path.join(self.create_tempdir().full_path, "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    images = np.random.default_rng(1).standard_normal(
        (3, 32, 32, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded(images).numpy(),
                                  model(images).numpy())
    unit = loaded.get_layer("stage2_unit1")
    self.assertEqual(unit.conv1.compute_dtype, "bfloat16")

  def test_bfloat16_logits_are_float32_logits_to_bfloat16_accuracy(self):
    # The same weights in both precisions: an independent float32 forward.
    mixed = model_lib.build_model("cifar10", precision="mixed_bfloat16",
                                  **TINY)
    exact = model_lib.build_model("cifar10", precision="float32", **TINY)
    exact.set_weights(mixed.get_weights())
    images = np.random.default_rng(2).standard_normal(
        (8, 32, 32, 3)).astype(np.float32)
    low, high = mixed(images).numpy(), exact(images).numpy()
    scale = np.max(np.abs(high))
    self.assertGreater(np.max(np.abs(low - high)), 0)  # Really bfloat16.
    np.testing.assert_allclose(low, high, atol=0.05 * scale)


def _to_bfloat16(x):
  """float32 -> the nearest bfloat16 (ties to even), as float64: bit
  arithmetic on the float32 encoding, independent of TensorFlow's cast."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


class IdentityInBfloat16Test(absltest.TestCase):

  def test_float32_stream_adds_16_bit_branches_in_float32(self):
    options = dict(TINY, units=2)
    exact = model_lib.build_model("cifar10", precision="float32", **options)
    plain = model_lib.build_model("cifar10", precision="mixed_bfloat16",
                                  **options)
    stream = model_lib.build_model("cifar10", precision="mixed_bfloat16",
                                   float32_stream=True, **options)
    unit = stream.get_layer("stage2_unit2")
    self.assertEqual((unit.compute_dtype, unit.conv1.compute_dtype,
                      unit.output.dtype), ("float32", "bfloat16", "float32"))
    images = np.random.default_rng(3).standard_normal(
        (8, 32, 32, 3)).astype(np.float32)
    reference = exact(images).numpy()
    error = {name: np.max(np.abs(model(images).numpy() - reference))
             for name, model in (("plain", plain), ("stream", stream))}
    self.assertLess(error["stream"], error["plain"] / 2)
    # A float32 run ignores it.
    ignored = model_lib.build_model("cifar10", precision="float32",
                                    float32_stream=True, **options)
    np.testing.assert_array_equal(ignored(images).numpy(), reference)

  def test_branch_survival_is_the_rounded_sum(self):
    model = model_lib.build_model("cifar10", precision="float32",
                                  **dict(TINY, units=2))
    images = np.random.default_rng(4).standard_normal(
        (4, 32, 32, 3)).astype(np.float32)
    rows = {r["unit"]: r for r in rounding.branch_survival(model, images)}
    self.assertLen(rows, 6)
    # stage1_unit2 keeps its shape: the shortcut is x itself.
    unit = model.get_layer("stage1_unit2")
    x = keras.Model(model.input, unit.input)(images).numpy()
    b = unit(x).numpy().astype(np.float64) - x
    sum_ = _to_bfloat16(_to_bfloat16(x) + _to_bfloat16(b))
    kept = sum_ - _to_bfloat16(x)
    lost = np.linalg.norm(kept - b) / np.linalg.norm(b)
    row = rows["stage1_unit2"]
    self.assertAlmostEqual(row["lost"], lost, delta=1e-6)
    self.assertAlmostEqual(row["branch_to_stream"],
                           np.linalg.norm(b) / np.linalg.norm(x), delta=1e-6)
    self.assertAlmostEqual(row["rounded_away"],
                           np.mean(kept[b != 0] == 0), delta=1e-9)
    # The paper's initialisation: the branch is small and much of it lost.
    self.assertLess(row["branch_to_stream"], 0.05)
    self.assertGreater(row["lost"], 0.05)


class StepTest(absltest.TestCase):

  def _first_update(self, precision, jit_compile=False, **overrides):
    images, labels = _batch()
    config = _tiny_config(precision=precision, jit_compile=jit_compile,
                          **overrides)
    trainer = _trainer(config, self.create_tempdir().full_path, images,
                       labels)
    exact = model_lib.build_model(trainer.run.model_name, precision="float32",
                                  **trainer.run.model_options.to_dict())
    exact.set_weights(trainer.model.get_weights())
    before = [v.numpy() for v in trainer.model.trainable_variables]
    self.weights = before
    expected, self.clipped = _clipped_sgd_update(exact, images, labels,
                                                 config)
    out = trainer.run_steps(1)
    after = [v.numpy() for v in trainer.model.trainable_variables]
    return trainer, out, [a - b for a, b in zip(after, before)], expected

  def _assert_update_direction(self, update, expected, relative):
    """The whole update (every variable, flattened) within RELATIVE of the
    expected one in norm: single entries of 16-bit gradients may be off by
    more (an entry near zero), the step taken is not."""
    u = np.concatenate([x.ravel() for x in update])
    e = np.concatenate([x.ravel() for x in expected])
    self.assertLess(np.linalg.norm(u - e) / np.linalg.norm(e), relative)

  def _assert_updates_close(self, update, expected, relative):
    """Each variable's update within RELATIVE of its largest expected entry,
    plus the float32 rounding of the weights the update was read from."""
    for u, e, v in zip(update, expected, self.weights):
      rounding = 2 * np.spacing(np.max(np.abs(v)).astype(np.float32))
      np.testing.assert_allclose(u, e, rtol=0,
                                 atol=relative * np.max(np.abs(e)) + rounding)

  def test_float16_loss_scaling_clips_the_unscaled_gradient(self):
    # A bound below the tiny network's gradient norm (about 0.02), so that
    # the clip acts on this step.
    trainer, out, update, expected = self._first_update(
        "mixed_float16", grad_clip_norm=0.01)
    self.assertTrue(self.clipped)
    self.assertEqual(trainer.step, 1)
    self.assertGreater(trainer.loss_scale, 1)
    # The clip applied to the true gradient: were it applied to the scaled
    # one (norm times 32768), the update would be 32768 times smaller.
    total = np.sqrt(sum(np.sum(u * u) for u in update))
    want = np.sqrt(sum(np.sum(e * e) for e in expected))
    self.assertAlmostEqual(total / want, 1.0, delta=0.02)
    self._assert_update_direction(update, expected, 0.01)
    np.testing.assert_array_equal(out["first_nonfinite"], [-1, -1])

  def test_float16_loss_scaling_applies_agc_to_the_unscaled_gradient(self):
    # Adaptive gradient clipping compares each unit's gradient with its
    # weight: on the scaled gradient (32768 times larger) it would clip
    # every unit to lambda ||W_i|| -- the known trap with loss scaling.
    trainer, _, update, expected = self._first_update(
        "mixed_float16", grad_clip_norm=0.0, agc_clip=0.01)
    self.assertTrue(self.clipped)  # Some unit is clipped, not all.
    self.assertEqual(trainer.step, 1)
    self._assert_update_direction(update, expected, 0.01)

  def test_a_step_the_loss_scaler_skips_is_not_a_divergence(self):
    images, labels = _batch()
    config = _tiny_config(precision="mixed_float16")
    trainer = _trainer(config, self.create_tempdir().full_path, images,
                       labels)
    trainer.optimizer.dynamic_scale.assign(2.0 ** 60)  # float16 overflows.
    before = [v.numpy() for v in trainer.model.trainable_variables]
    out = trainer.run_steps(1)
    for b, v in zip(before, trainer.model.trainable_variables):
      np.testing.assert_array_equal(v.numpy(), b)
    self.assertEqual(trainer.step, 0)  # Skipped: no update was applied.
    self.assertEqual(trainer.loss_scale, 2.0 ** 59)
    np.testing.assert_array_equal(out["first_nonfinite"], [-1, -1])
    self.assertTrue(all(np.isfinite(out[name]).all() for name in (
        "grad_norm", "update_ratio")) and all(
            np.isfinite(list(out["activation_rms"].values()))))

  def test_bfloat16_step_is_the_float32_step_to_bfloat16_accuracy(self):
    _, _, update, expected = self._first_update("mixed_bfloat16")
    self._assert_update_direction(update, expected, 0.03)

  def test_jit_compile_gives_the_same_step(self):
    # XLA may fuse and reorder float32 reductions: equal to round-off.
    _, _, update, expected = self._first_update("float32", jit_compile=True)
    self._assert_updates_close(update, expected, 1e-4)


class PrecisionNoteTest(absltest.TestCase):
  """The 16-bit precisions are for hardware that computes in 16 bits: on
  any other a run says so once (and trains all the same)."""

  def test_which_machines_get_a_note(self):
    note = distribute.precision_note
    cpu = {"CPU"}
    self.assertIsNone(note("float32", cpu, cpu_flags={"avx2"}))
    self.assertIn("no bfloat16 instructions",
                  note("mixed_bfloat16", cpu, cpu_flags={"avx2", "avx512f"}))
    for flag in ("avx512_bf16", "amx_bf16"):
      self.assertIsNone(note("mixed_bfloat16", cpu, cpu_flags={flag}))
    self.assertIn("for GPUs", note("mixed_float16", cpu,
                                   cpu_flags={"avx512_bf16"}))
    for accelerator in ("GPU", "TPU"):
      for precision in ("mixed_bfloat16", "mixed_float16"):
        self.assertIsNone(note(precision, {"CPU", accelerator},
                               cpu_flags=set()))

  def test_this_machines_flags_are_read(self):
    with open("/proc/cpuinfo") as f:
      flags = set(next(line for line in f if line.startswith("flags"))
                  .split(":", 1)[1].split())
    self.assertEqual(machine.cpu_model_and_flags()[1], flags)

  def test_the_machine_line_names_cpu_generation_cores_and_devices(self):
    # Two processors, as /proc/cpuinfo lists them: the first one's fields.
    path = self.create_tempfile(content=(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
        "model\t\t: 17\nmodel name\t: AMD EPYC\n"
        "flags\t\t: fpu avx2 avx512f avx512_bf16\n\n"
        "processor\t: 1\ncpu family\t: 6\nmodel\t\t: 1\n"
        "model name\t: other\nflags\t\t: fpu amx_bf16\n")).full_path
    cpu = machine.cpu_model_and_flags(path)
    self.assertEqual(cpu, ("AMD EPYC (family 25 model 17)",
                           {"fpu", "avx2", "avx512f", "avx512_bf16"}))
    self.assertEqual(
        machine.describe(["CPU", "GPU", "GPU"], cpu=cpu, cores=2),
        "AMD EPYC (family 25 model 17), 2 cores, bfloat16: avx512_bf16, "
        "2 GPU")
    self.assertEqual(
        machine.describe(["CPU"], cpu=("", {"avx2"}), cores=1),
        "unknown CPU, 1 cores, bfloat16: none")
    missing = os.path.join(self.create_tempdir().full_path, "cpuinfo")
    self.assertEqual(machine.cpu_model_and_flags(missing), ("", set()))


class RunTest(testing.SharedRootTestCase):

  def test_each_precision_resumes_exactly_and_exports_float32(self):
    # A run stopped at its checkpoint and resumed ends with the weights of
    # the uninterrupted run, bit for bit (optimizer, loss scale and input
    # position are in the checkpoint); its export serves float32 and agrees
    # with a float32 restore of the same checkpoint.
    pixels = _position_pixels(8)
    for precision in configs.PRECISIONS:
      with self.subTest(precision):
        config = configs.from_preset(
            "smoke", precision=precision, width=0.125, units="1",
            batch_size=16, train_steps=20, checkpoint_steps=10, log_steps=10,
            steps_per_loop=5, eval_at_end=False, deterministic=True)
        whole, parts = (os.path.join(self.root, f"{precision}_{name}")
                        for name in ("whole", "parts"))
        trainer_lib.train(config, whole, echo=lambda _: None)
        trainer_lib.train(configs.override(config, train_steps=10), parts,
                          echo=lambda _: None)
        lines = []
        trainer_lib.train(config, parts, echo=lines.append)
        # The second session starts from ckpt-10: it says so, its "start"
        # record is at 10 and its first progress record at 20 (a run that
        # trained again from step 0 would end with the same weights).
        self.assertIn(f"resumed from {os.path.join(parts, 'ckpt-10')} at "
                      "step 10", lines)
        self.assertEqual(testing.sessions(parts), [(0, 10), (10, 20)])
        resumed, uninterrupted = (
            checkpoints.restore_model(d)[0].get_weights()
            for d in (parts, whole))
        for a, b in zip(resumed, uninterrupted):
          np.testing.assert_array_equal(a, b)
        export_dir = os.path.join(self.root, f"{precision}_export")
        with open(os.path.join(parts, "config.json")) as f:
          self.assertEqual(json.load(f)["config"]["precision"], precision)
        export_lib.export_run(parts, export_dir)
        with open(os.path.join(export_dir, "1",
                               export_lib.MODEL_INFO_FILE)) as f:
          self.assertEqual(json.load(f)["precision"], precision)
        signature = tf.saved_model.load(
            os.path.join(export_dir, "1")).signatures["serving_default"]
        self.assertEqual(
            signature.structured_input_signature[1]["images"].dtype,
            tf.float32)
        served = signature(images=tf.constant(pixels))["probabilities"]
        self.assertEqual(served.dtype, tf.float32)
        # The values: an export of the run's network in its precision, its
        # logits scaled so that its answers are far from 1/10, against
        # NumPy's preprocessing and softmax of a float32 restore of the
        # same weights, within this precision's tolerance.
        tolerance = EXPORT_TOLERANCE[precision]
        reference, run, step = checkpoints.restore_model(
            parts, precision="float32")
        inputs = _per_image_standardized(pixels)
        scale = 3.0 / np.std(reference(inputs, training=False).numpy())
        reference = _scaled(reference, scale)

        def expected(inputs):
          return _softmax(reference(inputs, training=False).numpy().astype(
              np.float64))

        model, _, _ = checkpoints.restore_model(parts)  # In PRECISION.
        _, scaled_dir = export_lib.export_model(
            _scaled(model, scale), run, step,
            os.path.join(self.root, f"{precision}_scaled"))
        served = tf.saved_model.load(scaled_dir).signatures[
            "serving_default"](images=tf.constant(pixels))["probabilities"]
        np.testing.assert_allclose(served.numpy(), expected(inputs),
                                   atol=tolerance)
        # The check has teeth: the answers are far from uniform (0.72
        # measured), and images one pixel off have answers far outside the
        # tolerance (0.25 measured).
        self.assertGreater(np.abs(served.numpy() - 0.1).max(),
                           5 * tolerance)
        shifted = expected(_per_image_standardized(_position_pixels(8, 1)))
        self.assertGreater(np.abs(expected(inputs) - shifted).max(),
                           5 * tolerance)

  def test_switching_into_float16_on_resume_is_refused(self):
    model_dir = os.path.join(self.root, "switch")
    testing.run_binary("train", "--preset=smoke", f"--model_dir={model_dir}",
                       "--train_steps=10", "--checkpoint_steps=10",
                       "--noeval_at_end", check=True)
    with open(os.path.join(model_dir, "config.json")) as f:
      before = f.read()
    result = testing.run_binary("train", "--preset=smoke",
                                f"--model_dir={model_dir}",
                                "--train_steps=20",
                                "--precision=mixed_float16")
    self.assertEqual(result.returncode, 1)
    line = testing.last_stderr_line(result)
    self.assertIn("precision ('float32' -> 'mixed_float16')", line)
    with open(os.path.join(model_dir, "config.json")) as f:
      self.assertEqual(f.read(), before)

  def test_an_unknown_precision_is_one_line(self):
    result = testing.run_binary("train", "--preset=smoke",
                                "--precision=float8", "--dry_run",
                                f"--model_dir={self.root}/bad")
    self.assertNotEqual(result.returncode, 0)
    self.assertIn("precision", testing.last_stderr_line(result))
    self.assertFalse(os.path.exists(os.path.join(self.root, "bad")))


if __name__ == "__main__":
  absltest.main()
