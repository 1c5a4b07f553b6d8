"""Tests of identity_tf/training/train.py, configs.py, bin/train.py and bin/evaluate.py.

The binaries run as a user runs them (subprocesses, testing.run_binary). All
networks here are tiny members of the paper's family so that the whole file
takes a few minutes on two CPU cores.
"""

import dataclasses
import json
import os
import re
import signal
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

import identity_tf
from identity_tf import configs
from identity_tf import errors
from identity_tf import model as model_lib
from identity_tf.data import datasets
from identity_tf.data import synthetic
from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import config_file
from identity_tf.training import diagnostics
from identity_tf.training import evaluation
from identity_tf.training import metrics
from identity_tf.training import optimization
from identity_tf.training import preemption
from identity_tf.training import run as run_lib
from identity_tf.training import step as step_lib
from identity_tf.training import trainer
import testing

SYNTHETIC = tfds_data.dataset_info("synthetic")

# A tiny, deterministic run on the synthetic dataset, as binary flags.
TINY = dict(preset="smoke", width=0.0625, units=1, batch_size=16,
            learning_rate=0.01, log_steps=10, checkpoint_steps=10,
            steps_per_loop=5, eval_at_end=False)
KILL_RUN_STEPS = 150  # Long enough that a signal at step 10 lands mid-run.

def _describe(config, info):
  """config.json's content for CONFIG on dataset INFO."""
  return run_lib.prepare(config, info, None).description()



def _flags(**values):
  return [f"--{name}={str(v).lower() if isinstance(v, bool) else v}"
          for name, v in values.items()]


def _wait_for_line(stream, prefix, timeout=300):
  """Reads STREAM (a process's pipe) until a line starting with PREFIX."""
  deadline = time.time() + timeout
  for line in stream:
    if line.startswith(prefix):
      return line
    if time.time() > deadline:
      break
  raise AssertionError(f"no line starting with {prefix!r} from the process")


def _checkpoint_tensors(path):
  """{name: array} of every variable of checkpoint PATH except bookkeeping."""
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if not name.startswith(("iterator", "save_counter", "_CHECKPOINT"))}


class PresetTest(absltest.TestCase):

  def _written(self, preset, **overrides):
    model_dir = self.create_tempdir().full_path
    config = configs.from_preset(preset, **overrides)
    # The dataset's classes and image shape come from TFDS's code; it is not
    # prepared here, so its size is unknown.
    info = tfds_data.dataset_info(config.dataset)
    config_file.write(model_dir, _describe(config, info))
    with open(os.path.join(model_dir, config_file.CONFIG_FILE)) as f:
      return json.load(f)

  def test_cifar_presets_are_the_papers_numbers(self):
    for preset, classes in (("cifar10_paper", 10), ("cifar100_paper", 100),
                            ("cifar10_paper_literal", 10),
                            ("cifar100_paper_literal", 100)):
      run = self._written(preset)
      config = run["config"]
      # Section 4.1 of Hardt & Ma (2017).
      self.assertEqual(config["batch_size"], 128)
      self.assertEqual(config["learning_rate"], 0.05)
      self.assertEqual(config["lr_schedule"], "piecewise")
      self.assertEqual(config["lr_boundaries"], [30000, 50000])
      self.assertEqual(config["lr_decay_factor"], 0.1)
      self.assertEqual(config["momentum"], 0.9)
      self.assertEqual(config["weight_decay"], 1e-4)
      self.assertEqual(run["model"]["name"], preset.split("_")[0])
      options = run["model"]["options"]
      self.assertEqual(options["classes"], classes)
      self.assertEqual(options["init"], "paper")
      self.assertEqual(options["head"], "frozen")
      self.assertFalse(options["norm"])
      self.assertEqual(options["residual"], "plain")
      self.assertEqual(options["projection_scale"], "classes")
      self.assertEqual(options["width"], 1.0)
      self.assertEqual(options["units"], [9, 9, 9])  # Table 1.
      self.assertEqual(run["preprocessing"]["kind"], "cifar")
      self.assertEqual(run["preprocessing"]["pad"], 4)
      # The one deviation from the text: the stabiliser, off in *_literal.
      self.assertEqual(config["grad_clip_norm"],
                       0.0 if preset.endswith("_literal") else 1.0)
      self.assertEqual((config["agc_clip"], config["warmup_steps"]), (0, 0))
      # The schedule really is 0.05, /10 at 30k, /10 again at 50k.
      schedule = optimization.learning_rate_schedule(run_lib.make_schedule(
          configs.from_dict(run["config"]), None))
      rates = [float(schedule(step)) for step in (0, 29999, 30001, 50001)]
      np.testing.assert_allclose(rates, [0.05, 0.05, 0.005, 0.0005],
                                 rtol=1e-6)

  def test_imagenet_preset_is_the_papers_numbers(self):
    run = self._written("imagenet_paper")
    config = run["config"]
    # Section 4.2.
    self.assertEqual(config["batch_size"], 256)
    self.assertEqual(config["learning_rate"], 0.1)
    self.assertEqual(config["lr_schedule"], "exponential")
    self.assertEqual(config["lr_decay_factor"], 0.94)
    self.assertEqual(config["lr_decay_epochs"], 2.0)
    self.assertEqual(config["momentum"], 0.9)
    self.assertEqual(run["model"]["name"], "imagenet")
    self.assertEqual(run["model"]["options"]["classes"], 1000)
    self.assertEqual(run["preprocessing"]["kind"], "imagenet")
    # ImageNet-2012's 1,281,167 training images, in batches of 256.
    schedule = optimization.learning_rate_schedule(run_lib.make_schedule(
        configs.from_dict(config), 1281167 / 256))
    two_epochs = round(2 * 1281167 / 256)
    rates = [float(schedule(step))
             for step in (0, two_epochs - 1, two_epochs, 2 * two_epochs)]
    np.testing.assert_allclose(rates, [0.1, 0.1, 0.094, 0.1 * 0.94 ** 2],
                               rtol=1e-6)

  def test_resnet_bn_is_the_baseline_under_any_preset(self):
    # Batch norm, a trained linear head, the standard initialisation
    # (model.py's description of the baseline) -- not the preset's.
    for preset in ("cifar10_paper", "cifar10_paper_literal", "smoke"):
      options = self._written(preset, model="resnet_bn")["model"]["options"]
      self.assertEqual((options["norm"], options["head"], options["init"]),
                       (True, "trainable", "standard"), preset)
      model = model_lib.build_model("resnet_bn", **{**options, "width": 0.125,
                                                    "units": 1})
      self.assertNotEmpty(testing.normalization_layers(model))

  def test_config_json_reads_back_as_the_run_that_wrote_it(self):
    for preset, overrides in (("smoke", {}),
                              ("cifar10_paper", {"model": "resnet_bn"}),
                              ("fixup_cifar", {"width": 0.5, "units": (2,)}),
                              ("imagenet_paper", {})):
      config = configs.from_preset(preset, **overrides)
      written = run_lib.prepare(config, tfds_data.dataset_info(
          config.dataset), None)
      model_dir = self.create_tempdir().full_path
      config_file.write(model_dir, written.description())
      read = run_lib.read(model_dir)
      self.assertEqual((read.model_options, read.preprocessing),
                       (written.model_options, written.preprocessing), preset)
      self.assertEqual(read.description(), written.description(), preset)

  def test_every_network_and_data_field_reaches_the_run(self):
    # A run's network is its model options (what config.json records and
    # its checkpoints restore into), its input the preprocessing and the
    # epoch's length: every such field, set away from its default, must
    # arrive there as set.
    cases = (
        ("cifar10_ws", dict(width=0.5, units=(2,), init="standard",
                            head="trainable", use_bias=True, seed=5,
                            projection_scale="features", logit_scale=3.0,
                            branch_init_scale=1.5)),
        ("cifar10_paper", dict(norm=True, seed=2)),
        ("cifar10_paper", dict(residual="fixup", units=(1, 2, 3))),
        ("fixup_cifar", dict(stem_channels=64, standardize="per_channel")),
    )
    for preset, fields in cases:
      with self.subTest(preset=preset, **{k: str(v) for k, v in
                                          fields.items()}):
        config = configs.from_preset(preset, dataset="synthetic",
                                     num_train_examples=640, batch_size=64,
                                     flip=False, **fields)
        run = run_lib.prepare(config, SYNTHETIC, None)
        checked = set()
        for field in configs.MODEL_FIELDS:
          value = getattr(config, field)
          if field == "standardize" and value is not None:
            # The input's, not the network's.
            self.assertEqual(run.preprocessing.standardize, value)
            checked.add(field)
          if field in ("model", "dataset", "standardize") or value is None:
            continue
          if field == "units" and len(value) == 1:
            value = value * 3  # One number for every stage.
          self.assertEqual(getattr(run.model_options, field), value, field)
          checked.add(field)
        self.assertContainsSubset(set(fields), checked)
        self.assertEqual(run.model_name, config.model)
        self.assertEqual(run.model_arguments()["name"], config.model)
        self.assertFalse(run.preprocessing.flip)
        self.assertEqual(run.steps_per_epoch, 10.0)  # 640 / 64.
    # And the network built from the run has them: a bias in the stem, a
    # trained head at the logit scale, batch norm where asked.
    network = model_lib.build_model(**{**run_lib.prepare(
        configs.from_preset("cifar10_ws", dataset="synthetic", width=0.125,
                            units=(1,), head="trainable", use_bias=True),
        SYNTHETIC, None).model_arguments()})
    self.assertTrue(network.get_layer("stem1").use_bias)
    self.assertTrue(network.get_layer("projection").trainable)
    self.assertNotEmpty(testing.normalization_layers(model_lib.build_model(
        **run_lib.prepare(configs.from_preset(
            "cifar10_paper", dataset="synthetic", width=0.125, units=(1,),
            norm=True), SYNTHETIC, None).model_arguments())))
    # A stem as wide as stage 1: 64 x 0.125 channels.
    network = model_lib.build_model(**run_lib.prepare(configs.from_preset(
        "fixup_cifar", dataset="synthetic", width=0.125, units=(1,),
        stem_channels=64), SYNTHETIC, None).model_arguments())
    self.assertEqual(network.get_layer("stem1").kernel.shape[-1], 8)

  def test_per_channel_statistics_reach_config_json_and_are_kept(self):
    # --standardize=per_channel: the training examples' statistics, in
    # config.json; a run read back, or resumed in its model_dir, keeps them
    # without a pass over the data.
    config = configs.from_preset("smoke", standardize="per_channel",
                                 num_train_examples=96, batch_size=16)
    train = synthetic.arrays("train")[0][:96].astype(np.float64)
    written = run_lib.prepare(config, SYNTHETIC, None)
    model_dir = self.create_tempdir().full_path
    config_file.write(model_dir, written.description())
    with open(config_file.path(model_dir)) as f:
      stored = json.load(f)["preprocessing"]
    self.assertEqual(stored["standardize"], "per_channel")
    np.testing.assert_allclose(stored["mean"], train.mean(axis=(0, 1, 2)),
                               rtol=1e-12)
    np.testing.assert_allclose(stored["std"], train.std(axis=(0, 1, 2)),
                               rtol=1e-12)
    # Another count of training examples would give other numbers ...
    other = configs.override(config, num_train_examples=64)
    self.assertNotEqual(run_lib.prepare(other, SYNTHETIC, None)
                        .preprocessing.mean, written.preprocessing.mean)
    # ... but the run in MODEL_DIR keeps its own, read back or resumed.
    with mock.patch.object(datasets, "rgb_statistics",
                           side_effect=AssertionError("recomputed")), \
         mock.patch.object(synthetic, "arrays",
                           side_effect=AssertionError("data read")):
      self.assertEqual(run_lib.read(model_dir).preprocessing,
                       written.preprocessing)
      for resumed in (config, other):
        self.assertEqual(
            run_lib.prepare(resumed, SYNTHETIC, model_dir).preprocessing,
            written.preprocessing)
      # Without the option nothing is read either, as before it existed.
      for standardize in (None, "per_image"):
        run = run_lib.prepare(configs.override(
            configs.from_preset("smoke"), standardize=standardize),
                              SYNTHETIC, None)
        self.assertEqual(run.preprocessing.standardize, "per_image")
        self.assertIsNone(run.preprocessing.mean)

  def test_tests_readme_names_a_guard_for_every_field(self):
    # tests/README.md's table: one row per field of //bin:train's flag
    # groups, each naming at least one test (file::Class[.method]).
    with open(os.path.join(testing.source_root(), "tests",
                           "README.md")) as f:
      rows = dict(re.findall(r"^\| `(\w+)` \|(.*)$", f.read(),
                             re.MULTILINE))
    for _, names in configs.FLAG_GROUPS:
      for name in names:
        self.assertIn(name, rows)
        self.assertRegex(rows[name], r"`\w+\.py(::\w+(\.\w+)?)?`", name)

  def test_dry_run_prints_the_resolved_configuration_with_overrides(self):
    model_dir = self.create_tempdir().full_path
    result = testing.run_binary(
        "train", "--preset=cifar10_paper", f"--model_dir={model_dir}",
        "--learning_rate=0.1", "--lr_boundaries=100,200", "--dry_run",
        check=True)
    config = json.loads(result.stderr[result.stderr.index("{"):])["config"]
    self.assertEqual(config["learning_rate"], 0.1)       # Overridden.
    self.assertEqual(config["lr_boundaries"], [100, 200])  # Overridden.
    self.assertEqual(config["batch_size"], 128)            # The preset's.
    self.assertEqual(config["weight_decay"], 1e-4)
    self.assertIn("nothing was written", result.stdout)
    self.assertEqual(os.listdir(model_dir), [])


class ConfigErrorTest(absltest.TestCase):

  def test_bad_values_name_the_flag(self):
    cases = {
        "--train_steps must be positive, got -3": dict(train_steps=-3),
        "--batch_size must be positive": dict(batch_size=0),
        "--learning_rate must be positive": dict(learning_rate=-0.1),
        "--momentum must be in [0, 1)": dict(momentum=1.5),
        "--weight_decay must be >= 0": dict(weight_decay=-1.0),
        "--strategy must be one of default, mirrored": dict(strategy="gpu"),
        "--dataset must be synthetic or a TFDS dataset name":
            dict(dataset="my data"),
        "--learning_rate must be a finite number, got nan":
            dict(learning_rate=float("nan")),
        "--weight_decay must be a finite number, got nan":
            dict(weight_decay=float("nan")),
        "--grad_clip_norm must be >= 0 (0: off), got -1.0":
            dict(grad_clip_norm=-1.0),
        "--agc_clip must be a finite number": dict(agc_clip=float("nan")),
        # The network's options: the architecture table's one validator.
        "unknown residual 'rezero'; valid: plain, fixup":
            dict(residual="rezero"),
        "residual: an option of the normalisation-free identity unit":
            dict(residual="fixup", norm=True),
        "ws_gain is the gain of the standardised convolutions":
            dict(ws_gain="frozen"),
        "units must be one positive integer or 3 (one per stage of "
        "cifar10), got 1,2": dict(units="1,2"),
        "--width must be a finite number": dict(width=float("nan")),
        "--lr_boundaries must be increasing": dict(lr_boundaries="50,10"),
        "--lr_boundaries must be comma-separated integers":
            dict(lr_boundaries="a,b"),
        "--standardize must be one of per_image, per_channel; got 'mean'":
            dict(standardize="mean"),
        "stem_channels must be a positive integer (the stem's channels at "
        "width 1), got -16": dict(stem_channels=-16),
    }
    for message, overrides in cases.items():
      with self.assertRaisesRegex(ValueError, re.escape(message)):
        configs.from_preset("smoke", **overrides)
    with self.assertRaisesRegex(ValueError, "unknown --preset 'cifar'"):
      configs.from_preset("cifar")

  def test_resuming_a_different_network_is_refused(self):
    model_dir = self.create_tempdir().full_path
    config = configs.from_preset("smoke")
    config_file.write(model_dir, _describe(config, SYNTHETIC))
    config_file.check_resumable(model_dir, configs.override(config, train_steps=9))
    with self.assertRaisesRegex(
        ValueError,
        r"cannot continue with width \(0.25 -> 0.5\); use a new --model_dir"):
      config_file.check_resumable(model_dir, configs.override(config, width=0.5))

  def test_a_study_accepts_only_bookkeeping_changes(self):
    model_dir = self.create_tempdir().full_path
    config = configs.from_preset("smoke")
    self.assertEqual(config_file.run_changes(model_dir, config), [])
    config_file.write(model_dir, _describe(config, SYNTHETIC))
    # Every bookkeeping field is a field, and changing them is accepted.
    fields = {f.name for f in dataclasses.fields(config)}
    self.assertContainsSubset(configs.BOOKKEEPING_FIELDS, fields)
    self.assertEqual(config_file.run_changes(model_dir, configs.override(
        config, preset="other", checkpoint_steps=7, log_steps=3,
        eval_train_at_end=not config.eval_train_at_end,
        deterministic=not config.deterministic)), [])
    # The budget, the schedule and the precision are not bookkeeping.
    self.assertEqual(
        config_file.run_changes(model_dir, configs.override(
            config, train_steps=config.train_steps + 1, nesterov=True,
            precision="mixed_bfloat16")),
        [f"train_steps ({config.train_steps} -> {config.train_steps + 1})",
         "nesterov (False -> True)",
         "precision ('float32' -> 'mixed_bfloat16')"])

  def test_binary_reports_bad_flags_in_one_line(self):
    model_dir = self.create_tempdir().full_path
    result = testing.run_binary("train", f"--model_dir={model_dir}",
                                "--train_steps=-3")
    self.assertEqual(result.returncode, 1)
    self.assertNotIn("Traceback", result.stderr)
    self.assertEqual(testing.last_stderr_line(result),
                     "error: --train_steps must be positive, got -3")

  def test_missing_dataset_is_one_clear_error(self):
    model_dir = self.create_tempdir().full_path
    data_dir = self.create_tempdir().full_path
    result = testing.run_binary(
        "train", "--preset=cifar10_paper", f"--model_dir={model_dir}",
        f"--data_dir={data_dir}", "--width=0.0625", "--units=1")
    self.assertEqual(result.returncode, 1)
    self.assertNotIn("Traceback", result.stderr)
    line = testing.last_stderr_line(result)
    self.assertStartsWith(line, "error: dataset cifar10 is not prepared")
    self.assertIn(f"--data_dir={data_dir}", line)
    self.assertRegex(line, r"run '[^']*cifar10[^']*'")  # How to prepare it.


class TrainingTest(absltest.TestCase):

  def test_smoke_command_learns_and_says_where_things_are(self):
    # The README's command, shortened, run from a "user's directory" without
    # --model_dir: it must default to runs/smoke there.
    user_dir = self.create_tempdir().full_path
    env = dict(os.environ, BUILD_WORKING_DIRECTORY=user_dir)
    # As a user starts it: importing TensorFlow in this process set
    # TF_CPP_MIN_LOG_LEVEL=1 where jax is installed (CI), and the binary
    # takes a level that is set as the user's choice.
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    result = testing.run_binary("train", "--preset=smoke", "--train_steps=200",
                                "--checkpoint_steps=100",
                                "--num_eval_examples=500", env=env, check=True)
    model_dir = os.path.join(user_dir, "runs", "smoke")
    lines = result.stdout.splitlines()
    self.assertEqual(lines[-3], f"checkpoints: {model_dir}")
    # The tensorboard installed next to the interpreter, runnable as printed.
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    self.assertTrue(os.access(tensorboard, os.X_OK), tensorboard)
    self.assertEqual(lines[-2],
                     f"TensorBoard: {tensorboard} --logdir {model_dir}")
    done = [line for line in lines if line.startswith("done: step 200")]
    self.assertLen(done, 1)
    # Clearly above chance (10 classes) on the held-out split.
    eval_top1 = float(done[0].split("evaluation top-1 ")[1].split()[0])
    self.assertGreater(eval_top1, 0.3)
    self.assertEqual(checkpoints.checkpoint_step(tf.train.latest_checkpoint(
        model_dir)), 200)
    # Progress lines (stderr: results alone go to stdout) are one compact
    # line each; metrics.jsonl has the records whole, with what shows a
    # divergence coming.
    self.assertEqual(lines[0], done[0])
    errors = result.stderr.splitlines()
    progress = [r for r in metrics.read(model_dir) if "train_steps" in r]
    self.assertEqual([p["step"] for p in progress], list(range(50, 201, 50)))
    shown = [line for line in errors if re.match(r"step \d+/200: ", line)]
    self.assertEqual(shown, [
        f"step {p['step']}/200: loss {p['loss']:.4g}, top-1 "
        f"{100 * p['top1']:.2f} %, lr {p['lr']:.4g}, "
        f"{p['images_per_second']:.0f} images/s, ETA {p['eta']}"
        for p in progress])  # A healthy run: no diagnostics shown.
    self.assertEqual(list(progress[-1]["activation_rms"]),
                     ["stem", "stage1", "stage2", "stage3", "logits"])
    self.assertGreater(progress[-1]["grad_norm"], 0)
    self.assertGreater(progress[-1]["update_ratio"], 0)
    # Where the configuration is, not the configuration; and none of
    # TensorFlow's C++ start-up lines.
    self.assertIn(f"configuration: {model_dir}/config.json", errors)
    self.assertFalse([line for line in errors if line.startswith("{")])
    for noise in ("oneDNN", "cuInit", "cpu_feature_guard", "cudart_stub",
                  "absl::InitializeLog"):
      self.assertNotIn(noise, result.stderr)
    scalars = metrics.read_scalars(os.path.join(model_dir, "train"))
    for name in ("loss", "top1", "learning_rate", "images_per_second",
                 "residual_branch_norm/stage1", "residual_branch_norm/stage2",
                 "residual_branch_norm/stage3", "grad_norm", "update_ratio",
                 "activation_rms/stem", "activation_rms/stage3",
                 "activation_rms/logits"):
      self.assertIn(name, scalars)
    losses = [value for _, value in sorted(scalars["loss"])]
    self.assertLess(losses[-1], losses[0] - 0.5)  # ln 10 = 2.30 at the start.
    self.assertGreater(scalars["residual_branch_norm/stage1"][-1][1], 0.0)
    eval_scalars = metrics.read_scalars(os.path.join(model_dir, "eval"))
    self.assertAlmostEqual(eval_scalars["top1"][-1][1], eval_top1, places=3)

  def test_memorises_random_labels(self):
    # Section 3: residual networks of this family can fit any labelling of n
    # examples. 256 random images with random labels; the CIFAR architecture
    # at 1 unit per stage on 8x8 images, the paper's initialisation and
    # frozen projection, SGD with momentum as in training.
    rng = np.random.default_rng(0)
    images = rng.standard_normal((256, 8, 8, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 256).astype(np.int32)
    model = identity_tf.build_model("cifar10", width=1.0, units=1,
                                    image_size=8)
    config = configs.from_preset("smoke", learning_rate=0.05,
                             lr_schedule="constant")
    model.compile(optimization.build_optimizer(
        run_lib.prepare(config, SYNTHETIC, None)),
                  keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True))
    accuracy = 0.0
    for epochs in range(10, 201, 10):
      model.fit(images, labels, batch_size=64, epochs=epochs,
                initial_epoch=epochs - 10, verbose=0)
      predictions = np.argmax(model.predict(images, verbose=0), -1)
      accuracy = np.mean(predictions == labels)
      if accuracy == 1.0:
        break
    self.assertEqual(accuracy, 1.0)

  def test_resume_restores_the_optimizer_state(self):
    config = configs.from_preset(
        "smoke", width=0.0625, batch_size=16, train_steps=10,
        checkpoint_steps=10, log_steps=10, steps_per_loop=10,
        eval_at_end=False, deterministic=True)
    model_dir = self.create_tempdir().full_path
    trainer.train(config, model_dir, echo=lambda line: None)
    path = tf.train.latest_checkpoint(model_dir)
    saved = _checkpoint_tensors(path)
    # A fresh Trainer, restored by the trainer's own restore from the
    # checkpoint training resumes from.
    fresh = trainer.Trainer(run_lib.prepare(config, SYNTHETIC, model_dir),
                            tf.distribute.get_strategy())
    self.assertEqual(fresh.step, 0)
    self.assertEqual(checkpoints.resume_point(model_dir), path)
    fresh.restore(checkpoints.resume_point(model_dir))
    model, optimizer = fresh.model, fresh.optimizer
    self.assertEqual(fresh.step, 10)
    self.assertEqual(int(optimizer.iterations.numpy()), 10)
    slots = [v for v in optimizer.variables
             if v is not optimizer.iterations and "momentum" in v.path]
    self.assertLen(slots, len(model.trainable_variables))
    saved_slots = [saved[name] for name in sorted(saved)
                   if name.startswith("optimizer/_variables/")]
    self.assertTrue(any(np.any(s != 0) for s in saved_slots))
    restored = sorted(np.asarray(s.numpy()).tobytes() for s in slots)
    on_disk = sorted(np.asarray(s).tobytes() for s in saved_slots
                     if np.ndim(s) > 0)
    self.assertEqual(restored, on_disk)
    # The weights too: the trainer's, and checkpoints.restore_model's
    # (what evaluate and export restore), are the checkpoint's, and not a
    # fresh network's.
    weights = sorted(np.asarray(v.numpy()).tobytes()
                     for v in model.trainable_variables)
    saved_weights = sorted(
        np.asarray(value).tobytes() for name, value in saved.items()
        if name.startswith("optimizer/_trainable_variables/"))
    self.assertLen(saved_weights, len(weights))
    self.assertEqual(weights, saved_weights)
    restored_model, _, step = checkpoints.restore_model(model_dir)
    self.assertEqual(step, 10)
    self.assertEqual(sorted(np.asarray(v.numpy()).tobytes()
                            for v in restored_model.trainable_variables),
                     saved_weights)
    untrained = trainer.Trainer(run_lib.prepare(config, SYNTHETIC, model_dir),
                                tf.distribute.get_strategy())
    self.assertNotEqual(sorted(np.asarray(v.numpy()).tobytes() for v in
                               untrained.model.trainable_variables),
                        saved_weights)

  def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(self):
    model_dir = self.create_tempdir().full_path
    config = configs.from_preset(
        "smoke", width=0.0625, batch_size=16, train_steps=10,
        checkpoint_steps=10, log_steps=10, steps_per_loop=10,
        eval_at_end=False)
    trainer.train(config, model_dir, echo=lambda line: None)

    def corrupted_after_step_12(input_context):
      # Clean batches for 2 more steps, then an infinite pixel: the loss
      # of every later step is NaN (inf - inf in the standardised logits).
      del input_context
      images = np.zeros((16, 32, 32, 3), np.float32)
      labels = np.zeros((16,), np.int32)
      clean = tf.data.Dataset.from_tensors((images, labels)).repeat(2)
      images[0, 0, 0, 0] = np.inf
      bad = tf.data.Dataset.from_tensors((images, labels)).repeat()
      return clean.concatenate(bad)

    # The step and the stage are named: the first bad batch is step 13's,
    # and the infinite pixel overflows the first convolution.
    with self.assertRaisesRegex(
        diagnostics.NonFiniteLossError,
        r"became (nan|inf) at step 13: the activations of stem became NaN or "
        r"infinite first; .*stopped; the latest checkpoint, written before it "
        r"with finite weights, is "
        r".*ckpt-10 \(step 10\)") as caught:
      trainer.train(configs.override(config, train_steps=30), model_dir,
                  echo=lambda line: None, dataset_fn=corrupted_after_step_12)
    self.assertEqual(caught.exception.step, 13)
    # metrics.jsonl says how the run ended: each session's end, and where.
    ends = [{k: r[k] for k in r if k != "time"} for r in metrics.read(model_dir)
            if "done" in r or "diverged" in r]
    self.assertEqual(ends[0], {"step": 10, "done": True})
    self.assertEqual((ends[1]["diverged"], ends[1]["nan_step"]), (True, 13))
    # The stop comes at the end of the call that met it.
    self.assertBetween(ends[1]["step"], 13, 30)
    self.assertLen(ends, 2)
    latest = tf.train.latest_checkpoint(model_dir)
    self.assertEqual(checkpoints.checkpoint_step(latest), 10)
    for value in _checkpoint_tensors(latest).values():
      if np.issubdtype(np.asarray(value).dtype, np.floating):
        self.assertTrue(np.all(np.isfinite(value)))


class DiagnosticsTest(absltest.TestCase):
  """What the training step reports, against an independent computation."""

  def test_step_reports_gradient_norm_update_ratio_and_activations(self):
    config = configs.from_preset("smoke", width=0.125, batch_size=8,
                             momentum=0.0, weight_decay=0.0,
                             learning_rate=0.1)
    rng = np.random.default_rng(5)
    images = rng.standard_normal((8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)
    strategy = tf.distribute.get_strategy()
    run = run_lib.prepare(config, SYNTHETIC, None)
    model = model_lib.build_model(**run.model_arguments())
    optimizer = optimization.build_optimizer(run)
    optimizer.build(model.trainable_variables)
    # The same network and the step's quantities, computed here: the
    # gradient of the mean cross-entropy, plain SGD's update -lr g, the RMS
    # of each stage's last unit's output.
    twin = model_lib.build_model(**run.model_arguments())
    twin.set_weights(model.get_weights())
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
          labels, twin(images), from_logits=True))
    gradients = tape.gradient(loss, twin.trainable_variables)
    norm = np.sqrt(sum(np.sum(np.square(g.numpy())) for g in gradients))
    ratio = max(0.1 * np.linalg.norm(g.numpy()) / np.linalg.norm(w.numpy())
                for g, w in zip(gradients, twin.trainable_variables)
                if np.linalg.norm(w.numpy()) > 0)
    outputs = {"stem": "stem1", "stage1": "stage1_unit1",
               "stage2": "stage2_unit1", "stage3": "stage3_unit1",
               "logits": "projection"}
    rms = [np.sqrt(np.mean(np.square(keras.Model(
        twin.input, twin.get_layer(layer).output)(images).numpy())))
           for layer in outputs.values()]

    iterator = iter(strategy.distribute_datasets_from_function(
        lambda _: tf.data.Dataset.from_tensors((images, labels)).repeat()))
    out = step_lib.make_train_step(strategy, model, optimizer, config)(
        iterator, tf.constant(1))
    self.assertEqual(diagnostics.watched_activations(model), list(outputs))
    np.testing.assert_allclose(
        [out["grad_norm"].numpy(),
         *(out["activation_rms"][name].numpy() for name in outputs)],
        [norm, *rms], rtol=1e-4)
    # ||w_new - w_old|| loses digits to cancellation in float32.
    np.testing.assert_allclose(out["update_ratio"].numpy(), ratio, rtol=2e-3)
    np.testing.assert_array_equal(out["first_nonfinite"].numpy(), [-1, -1])

  def test_evaluates_every_eval_steps(self):
    model_dir = self.create_tempdir().full_path
    lines = []
    config = configs.from_preset(
        "smoke", width=0.0625, batch_size=16, train_steps=10, eval_steps=4,
        checkpoint_steps=10, log_steps=5, steps_per_loop=5,
        num_eval_examples=64)
    result = trainer.train(config, model_dir, echo=lines.append)
    evaluations = [line for line in lines if " eval: " in line]
    self.assertEqual([int(e.split()[1]) for e in evaluations], [4, 8, 10])
    scalars = metrics.read_scalars(os.path.join(model_dir, "eval"))
    self.assertEqual([step for step, _ in scalars["top1"]], [4, 8, 10])
    self.assertEqual(result["eval"]["examples"], 64)
    self.assertAlmostEqual(result["eval"]["top1"], scalars["top1"][-1][1],
                           places=5)


class CallLengthTest(absltest.TestCase):
  """How many steps a tf.function call runs: SIGTERM waits for its end."""

  def test_a_call_ends_within_call_seconds_of_steps(self):
    # By hand, 10 s of steps: the full-width network on an AVX2 CPU (15 s a
    # step) runs one step a call, bfloat16 on AMX (1.28 s) seven, and a
    # fast network (5 ms) 2000, as many as --steps_per_loop allows.
    with mock.patch.object(preemption, "CALL_SECONDS", 10.0):
      self.assertEqual(preemption.steps_per_call(15.0, 100), 1)
      self.assertEqual(preemption.steps_per_call(1.28, 100), 7)
      self.assertEqual(preemption.steps_per_call(0.005, 100), 100)
      self.assertEqual(preemption.steps_per_call(0.005, 5000), 2000)

  def test_a_slow_run_says_when_its_next_progress_line_comes(self):
    config = configs.from_preset(**{**TINY, "units": "1", "log_steps": 100},
                             train_steps=4688)
    lines = []
    # By hand: 98 steps of 15.1 s are 1479.8 s, 24 min 40 s.
    trainer._announce_slow_progress(config, 2, 15.1, lines.append)
    self.assertEqual(lines, ["15.1 s per step: the next progress line, at "
                             "step 100, in about 0:24:40"])
    # 98 steps of 0.6 s are under a minute: nothing to say.
    trainer._announce_slow_progress(config, 2, 0.6, lines.append)
    self.assertLen(lines, 1)
    # Near the end, the next line is the last step's.
    trainer._announce_slow_progress(config, 4601, 15.1, lines.append)
    self.assertEqual(lines[-1], "15.1 s per step: the next progress line, at "
                     "step 4688, in about 0:21:54")


class InterruptionTest(testing.ProcessTestCase):
  """SIGTERM, Ctrl-C and resuming a --deterministic run, plus bin/evaluate
  (SIGKILL: kill_loop_test)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp()
    cls.flags = _flags(**TINY, train_steps=KILL_RUN_STEPS, deterministic=True)
    cls.reference_dir = os.path.join(cls.root, "uninterrupted")
    testing.run_binary("train", f"--model_dir={cls.reference_dir}",
                       *cls.flags, check=True)
    cls.reference = _checkpoint_tensors(
        tf.train.latest_checkpoint(cls.reference_dir))

  def _start(self, name, *args):
    return self.start_binary(name, *args)

  def _assert_matches_reference(self, model_dir):
    final = _checkpoint_tensors(tf.train.latest_checkpoint(model_dir))
    self.assertEqual(sorted(final), sorted(self.reference))
    # Keras saves the trainable weights once, under the optimizer.
    weights = [name for name in final
               if name.startswith("optimizer/_trainable_variables/")]
    self.assertGreater(len(weights), 5)
    for name, value in self.reference.items():
      self.assertTrue(np.array_equal(final[name], value),
                      f"{name} differs from the uninterrupted run")

  def test_ctrl_c_writes_a_checkpoint_like_sigterm(self):
    model_dir = os.path.join(self.root, "interrupted")
    process = self._start("train", f"--model_dir={model_dir}", *self.flags)
    _wait_for_line(process.stderr, "saved checkpoint")
    process.send_signal(signal.SIGINT)
    self.assertEqual(process.wait(timeout=60), 128 + signal.SIGINT)
    rest = process.stderr.read()
    self.assertNotIn("Traceback", rest)
    stop = re.fullmatch(r"stopped by SIGINT at step (\d+); wrote checkpoint "
                        r".*ckpt-(\d+); run the same command again to resume",
                        rest.strip().splitlines()[-1])
    self.assertIsNotNone(stop, rest)
    stopped_at = int(stop.group(1))
    self.assertEqual(int(stop.group(2)), stopped_at)
    testing.run_binary("train", f"--model_dir={model_dir}", *self.flags,
                       check=True)
    # The second session starts where Ctrl-C stopped the first.
    sessions = testing.sessions(model_dir)
    self.assertEqual([start for start, _ in sessions], [0, stopped_at])
    self._assert_matches_reference(model_dir)

  def test_sigterm_stops_slow_steps_within_a_call_of_seconds(self):
    # Steps of at least 20 ms and --steps_per_loop as long as the run:
    # SIGTERM during the call that runs step 41 must stop the run at the end
    # of that call, at most 0.2 s (CALL_SECONDS here) of steps on, not at
    # the end of a 3000-step call.
    model_dir = os.path.join(self.root, "slow_steps")
    every = 3000
    config = configs.from_preset(
        **{**TINY, "units": "1", "log_steps": every, "checkpoint_steps": every,
           "steps_per_loop": every}, train_steps=every)
    calls = []
    run_steps = trainer.Trainer.run_steps

    def slow_run_steps(self, num_steps):
      calls.append(num_steps)
      time.sleep(0.02 * num_steps)
      if sum(calls[:-1]) <= 40 < sum(calls):
        os.kill(os.getpid(), signal.SIGTERM)
      return run_steps(self, num_steps)

    with mock.patch.object(preemption, "CALL_SECONDS", 0.2), \
        mock.patch.object(trainer.Trainer, "run_steps", slow_run_steps):
      with self.assertRaises(preemption.PreemptedError) as raised:
        trainer.train(config, model_dir, echo=lambda line: None)
    stopped_at = int(str(raised.exception).split("at step ")[1].split(";")[0])
    self.assertEqual(stopped_at, sum(calls))
    self.assertEqual(checkpoints.checkpoint_step(
        tf.train.latest_checkpoint(model_dir)), stopped_at)
    # The first call, its pace unknown, is one step; then up to 0.2 s / 20
    # ms = 10 steps a call, more than one (a tiny network's step is a few
    # ms), so the stop comes at most 10 steps after step 40.
    self.assertEqual(calls[0], 1)
    self.assertBetween(max(calls), 2, 10)
    self.assertBetween(stopped_at, 41, 50)
    # No progress line came (log_steps is the run's length): the session's
    # training time, at least the steps' sleeps, is counted to the stop
    # record, since the next session resumes after those steps.
    records = metrics.read(model_dir)
    self.assertEqual([(r["step"], r.get("start"), r.get("stopped"))
                      for r in records],
                     [(0, True, None), (stopped_at, None, "SIGTERM")])
    self.assertGreaterEqual(metrics.wall_seconds(records),
                            0.02 * stopped_at)

  def test_a_stop_on_an_evaluation_step_evaluates_on_resuming(self):
    # SIGTERM during the steps up to an evaluation step stops there with a
    # checkpoint and no evaluation; the resumed run must make it up, once.
    # What was evaluated is the checkpoint's to say, not metrics.jsonl's:
    # it is deleted before each resume.
    model_dir = os.path.join(self.root, "stopped_at_evaluation")
    settings = dict(TINY, units="1", log_steps=10, eval_steps=10,
                    num_eval_examples=32, eval_batch_size=16)
    path = os.path.join(model_dir, metrics.METRICS_FILE)

    def terminate_at_step_10(line):
      if line.startswith("step 10/"):
        os.kill(os.getpid(), signal.SIGTERM)

    def evaluated():
      return [r["step"] for r in metrics.read(model_dir) if "eval" in r]

    config = configs.from_preset(**settings, train_steps=20)
    with self.assertRaisesRegex(preemption.PreemptedError, "at step 10;"):
      trainer.train(config, model_dir, echo=terminate_at_step_10)
    self.assertEqual(evaluated(), [])
    os.remove(path)
    trainer.train(config, model_dir, echo=lambda line: None)
    self.assertEqual(evaluated(), [10, 20])
    # A run resumed where it had evaluated (here the end, step 20) does not
    # evaluate that step again.
    os.remove(path)
    trainer.train(configs.from_preset(**settings, train_steps=30), model_dir,
                  echo=lambda line: None)
    self.assertEqual(evaluated(), [30])
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
    self.assertEqual(reader.get_tensor(
        f"{trainer.LAST_EVALUATED}/.ATTRIBUTES/VARIABLE_VALUE"), 30)

  def test_sigterm_writes_a_checkpoint_and_evaluate_watches(self):
    # In this process, to save a TensorFlow start-up: SIGTERM arrives right
    # after the first checkpoint, as preemption would.
    model_dir = os.path.join(self.root, "terminated")
    config = configs.from_preset(**{**TINY, "units": "1"},
                             train_steps=KILL_RUN_STEPS, deterministic=True)

    def terminate_after_first_checkpoint(line):
      if line.startswith("saved checkpoint"):
        os.kill(os.getpid(), signal.SIGTERM)

    with self.assertRaises(preemption.PreemptedError) as raised:
      trainer.train(config, model_dir, echo=terminate_after_first_checkpoint)
    message = str(raised.exception)
    self.assertRegex(message, r"^stopped by SIGTERM at step \d+; wrote "
                     r"checkpoint .*ckpt-\d+; run the same command again")
    stopped_at = int(message.split("at step ")[1].split(";")[0])
    self.assertLess(stopped_at, KILL_RUN_STEPS)
    self.assertEqual(checkpoints.checkpoint_step(
        tf.train.latest_checkpoint(model_dir)), stopped_at)

    # One JSON object for the checkpoint SIGTERM wrote.
    result = testing.run_binary("evaluate", f"--model_dir={model_dir}",
                                "--num_examples=100", check=True)
    report = json.loads(result.stdout)
    self.assertEqual(set(report), {"global_step", "loss", "top1", "top5",
                                   "examples", "dataset"})
    self.assertEqual(report["global_step"], stopped_at)
    self.assertEqual(report["examples"], 100)
    self.assertBetween(report["top1"], 0.0, report["top5"])

    # --watch follows the resumed run to its last checkpoint.
    watcher = self._start("evaluate", f"--model_dir={model_dir}", "--watch",
                          "--watch_interval=0.5", "--watch_timeout=120",
                          "--num_examples=100", "--write_summaries=false")
    first = json.loads(_wait_for_line(watcher.stdout, "{"))
    self.assertEqual(first["global_step"], stopped_at)
    trainer.train(config, model_dir, echo=lambda line: None)
    self.assertEqual(watcher.wait(timeout=180), 0)
    self.assertEqual([start for start, _ in testing.sessions(model_dir)],
                     [0, stopped_at])
    steps = [first["global_step"]] + [
        json.loads(line)["global_step"] for line in watcher.stdout
        if line.startswith("{")]
    self.assertEqual(steps[-1], KILL_RUN_STEPS)
    self.assertEqual(steps, sorted(set(steps)))
    self._assert_matches_reference(model_dir)

  def test_evaluate_errors_are_one_line(self):
    empty = self.create_tempdir().full_path
    result = testing.run_binary("evaluate", f"--model_dir={empty}")
    self.assertEqual(result.returncode, 1)
    self.assertNotIn("Traceback", result.stderr)
    self.assertStartsWith(testing.last_stderr_line(result),
                          f"error: --model_dir={empty} holds no training run")
    # The held-out images of a run that held none out; the statistics of a
    # network without batch norm: named, nothing recorded.
    with open(os.path.join(self.reference_dir, "metrics.jsonl")) as f:
      before = f.read()
    result = testing.run_binary("evaluate", f"--model_dir={self.reference_dir}",
                                "--held_out")
    self.assertEqual(result.returncode, 1)
    self.assertEqual(testing.last_stderr_line(result),
                     f"error: --held_out: {self.reference_dir} held out no "
                     "training images (--validation_examples=0); evaluate "
                     "the evaluation split without --held_out")
    with self.assertRaisesRegex(errors.ConfigError,
                                "^--reestimate_batch_norm: the network of "
                                ".* has no batch norm"):
      evaluation.evaluate_run(self.reference_dir, reestimate_batch_norm=64,
                              emit=print, note=print)
    with open(os.path.join(self.reference_dir, "metrics.jsonl")) as f:
      self.assertEqual(f.read(), before)
    with self.assertRaisesRegex(ValueError, "no checkpoint .*ckpt-99999"):
      checkpoints.restore_model(self.reference_dir, 99999)
    _, _, step = checkpoints.restore_model(self.reference_dir, "ckpt-140")
    self.assertEqual(step, 140)


if __name__ == "__main__":
  absltest.main()
