"""Mistakes a user makes, and what is on disk after them: non-finite float
flags, config.json's history, dry runs and commands that train nothing."""

import json
import os
import re
import signal
import subprocess
import time

from absl.testing import absltest
import numpy as np

import testing

# What each binary needs besides the flag under test to reach its main().
REQUIRED = {
    "benchmark": ["--suite=linear"],
    "conjecture": [],
    "construct": ["--output_dir=/nonexistent/out", "--dataset=synthetic",
                  "--num_examples=10"],
    "evaluate": ["--model_dir=/nonexistent/run"],
    "export": ["--model_dir=/nonexistent/run", "--export_dir=/nonexistent/e"],
    "linear_theory": ["descend"],
    "prepare_data": ["--dataset=synthetic"],
    "serve_client": ["--model_name=m", "image.png"],
    "sharpness": ["--model_dir=/nonexistent/run"],
    "study": ["--study=smoke"],
    "summary": [],
    "train": ["--model_dir=/nonexistent/run"],
}
SMOKE = ["--preset=smoke", "--width=0.0625", "--units=1", "--batch_size=16",
         "--log_steps=10", "--steps_per_loop=10", "--checkpoint_steps=10",
         "--num_eval_examples=100"]


def _float_flags(binary):
  """The float flags BINARY defines: absl's --helpfull says "(a number)",
  or "(number >= 0.001)" and the like for one with bounds."""
  result = testing.run_binary(binary, "--helpfull")
  text = result.stdout + result.stderr
  names = set()
  for block in re.split(r"\n\s*(?=--)", text):
    match = re.match(r"--(?:\[no\])?(\w+):", block.strip())
    if match and re.search(
        r"\((a (non-negative |positive )?number|number [<>]=? )", block):
      names.add(match.group(1))
  return sorted(names)


class FiniteFlagsTest(absltest.TestCase):

  def test_every_float_flag_of_every_binary_refuses_nan_and_infinity(self):
    binaries = sorted(name[:-3] for name in os.listdir(
        os.path.join(testing.source_root(), "bin")) if name.endswith(".py"))
    self.assertEqual(binaries, sorted(REQUIRED))
    checked = []
    for binary in binaries:
      names = _float_flags(binary)
      for name in names:
        for value in ("inf", "nan", "-inf"):
          result = testing.run_binary(binary, *REQUIRED[binary],
                                      f"--{name}={value}")
          self.assertEqual(result.returncode, 1, (binary, name, value))
          # Ours, or absl's own validator's when the flag has one that NaN
          # fails first ("FATAL Flags parsing error: ... --width must be
          # positive"): either way one refusal naming the flag.
          self.assertRegex(result.stderr,
                           rf"(^|\n)(error|FATAL Flags parsing error): .*"
                           rf"--{name}\b", (binary, name, value))
        checked.append(f"{binary} --{name}")
    # The parse found the float flags (e.g. train's Config fields).
    self.assertIn("train --learning_rate", checked)
    self.assertIn("train --weight_decay", checked)
    for flag in ("evaluate --watch_timeout", "study --epochs",
                 "serve_client --timeout", "construct --sgd_learning_rate",
                 "train --cluster_timeout", "linear_theory --step_size"):
      self.assertIn(flag, checked)


class EarlySignalTest(testing.SharedRootTestCase):

  def test_a_signal_in_the_first_seconds_is_one_line(self):
    # From the moment main() starts, through `import tensorflow`, to the
    # loop (which then saves a checkpoint first: kill_loop_test).
    for number, (signum, code) in enumerate(
        [(signal.SIGINT, 130), (signal.SIGTERM, 143)] * 3):
      delay = (0.6, 1.0, 2.0)[number // 2]
      model_dir = os.path.join(self.root, f"early{number}")
      process = subprocess.Popen(
          testing.binary_command("train", f"--model_dir={model_dir}",
                                 *SMOKE),
          env=testing.binary_env(), stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True)
      time.sleep(delay)
      process.send_signal(signum)
      _, stderr = process.communicate(timeout=120)
      what = (signal.Signals(signum).name, delay, stderr[-2000:])
      self.assertEqual(process.returncode, code, what)
      self.assertNotIn("Traceback", stderr, what)
      last = stderr.strip().splitlines()[-1]
      self.assertRegex(last, rf"stopped by {signal.Signals(signum).name}",
                       what)


def _model_weights(prefix):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith("model/")}


class DamagedInputPositionTest(testing.SharedRootTestCase):

  def test_a_damaged_input_position_without_digest_falls_back(self):
    model_dir = os.path.join(self.root, "position")
    run = [f"--model_dir={model_dir}", *SMOKE, "--deterministic",
           "--noeval_at_end"]
    testing.run_binary("train", *run, "--train_steps=20", check=True)
    prefix = os.path.join(model_dir, "ckpt-20")
    expected = _model_weights(prefix)
    # The digest gone, bytes of the saved input position (the first entry
    # of the data file) overwritten: only TensorFlow's checksum sees it.
    os.remove(prefix + ".sha256")
    with open(prefix + ".data-00000-of-00001", "r+b") as f:
      f.seek(1000)
      f.write(b"\0" * 100)
    result = testing.run_binary("train", *run, "--train_steps=20",
                                check=True)
    self.assertIn("ckpt-20 is damaged: its saved input position fails its "
                  "checksum", result.stderr)
    self.assertIn("resumed from " + os.path.join(model_dir, "ckpt-10"),
                  result.stderr)
    self.assertTrue(os.listdir(os.path.join(model_dir, "damaged")))
    # Trained again from step 10 on the same input: the same weights.
    again = _model_weights(prefix)
    self.assertEqual(sorted(again), sorted(expected))
    for name, value in expected.items():
      np.testing.assert_array_equal(again[name], value, err_msg=name)


class OneRightLineTest(testing.SharedRootTestCase):

  def test_each_mistake_gets_the_line_that_names_it(self):
    root = self.root
    text = os.path.join(root, "matrix.txt")
    with open(text, "w") as f:
      f.write("1 0\n0 1\n")
    singular = os.path.join(root, "singular.npy")
    np.save(singular, np.zeros((3, 3)))
    a_file = os.path.join(root, "a_file")
    with open(a_file, "w") as f:
      f.write("x")
    empty = os.path.join(root, "empty_run")
    os.makedirs(empty)
    no_run = (rf"^error: --model_dir={empty} holds no training run \(no "
              r"config.json, no checkpoint\)")
    cases = [
        (["linear_theory", "factorize", f"--R={singular}", "--layers=3",
          f"--output={root}/a.npz"],
         r"^error: .*R is singular \(det R = 0\).*give an invertible R"),
        (["linear_theory", "factorize", f"--R={text}", "--layers=3",
          f"--output={root}/a.npz"],
         rf"^error: --R={text} is not a \.npy file .*numpy\.save"),
        (["construct", f"--data={text}", f"--output_dir={root}/c"],
         rf"^error: --data={text} is not an \.npz archive .*numpy\.savez"),
        (["construct", "--dataset=synthetic", "--num_examples=10",
          "--seed=-1", f"--output_dir={root}/c"], r"--seed=-1"),
        (["train", *SMOKE, "--dataset=fashion_mnist", f"--data_dir={a_file}",
          f"--model_dir={root}/t"],
         rf"^error: .*--data_dir={a_file} \(a file, not a directory\)"),
        (["evaluate", f"--model_dir={empty}"], no_run),
        (["export", f"--model_dir={empty}", f"--export_dir={root}/e"], no_run),
        (["sharpness", f"--model_dir={empty}"], no_run),
    ]
    for (binary, *args), pattern in cases:
      result = testing.run_binary(binary, *args)
      self.assertEqual(result.returncode, 1, (binary, args, result.stderr))
      self.assertNotIn("Traceback", result.stderr, binary)
      self.assertNotIn("allow_pickle", result.stderr, binary)
      # absl's own flag errors end with a "Pass --helpshort" line.
      line = next(l for l in result.stderr.strip().splitlines()[::-1]
                  if not l.startswith("Pass --help"))
      self.assertRegex(line, pattern, (binary, args))
    for name in ("a.npz", "c", "t", "e"):
      self.assertFalse(os.path.exists(os.path.join(root, name)), name)
    self.assertEqual(os.listdir(empty), [])


class ConfigHistoryTest(testing.SharedRootTestCase):

  def _train(self, model_dir, *flags, check=True):
    """//bin:train in MODEL_DIR: a new smoke run, or (the directory holds
    one) a resume with FLAGS changing its stored configuration."""
    start = ([] if os.path.exists(os.path.join(model_dir, "config.json"))
             else SMOKE)
    return testing.run_binary("train", f"--model_dir={model_dir}", *start,
                              *flags, check=check)

  def _config_json(self, model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
      return f.read()

  def test_a_change_on_resume_is_recorded_with_its_step(self):
    model_dir = os.path.join(self.root, "history")
    self._train(model_dir, "--train_steps=20", "--lr_schedule=constant",
                "--learning_rate=0.01")
    self._train(model_dir, "--train_steps=30", "--learning_rate=0.02")
    self._train(model_dir, "--train_steps=40")
    stored = json.loads(self._config_json(model_dir))
    self.assertEqual(stored["config"]["learning_rate"], 0.02)
    self.assertEqual(stored["config"]["train_steps"], 40)
    self.assertEqual(stored["history"], [
        {"step": 20, "changed": {"learning_rate": [0.01, 0.02],
                                 "train_steps": [20, 30]}},
        {"step": 30, "changed": {"train_steps": [30, 40]}},
    ])

  def test_a_command_that_trains_nothing_changes_nothing(self):
    model_dir = os.path.join(self.root, "nothing")
    self._train(model_dir, "--train_steps=20")
    before = self._config_json(model_dir)
    files = sorted(os.listdir(model_dir))
    result = self._train(model_dir, "--train_steps=10")
    self.assertIn("nothing to train", result.stderr)
    self.assertNotIn("training cifar10", result.stderr)
    self.assertNotIn('"eval"', result.stderr)  # No evaluation either.
    self.assertIn("done: step 20, nothing trained", result.stdout)
    self.assertEqual(self._config_json(model_dir), before)
    self.assertEqual(sorted(os.listdir(model_dir)), files)

  def test_a_dry_run_writes_nothing(self):
    model_dir = os.path.join(self.root, "dry")
    self._train(model_dir, "--train_steps=20")
    before = self._config_json(model_dir)
    result = self._train(model_dir, "--dry_run", "--learning_rate=0.5",
                         "--train_steps=160")
    self.assertIn("nothing was written", result.stdout)
    self.assertIn('"learning_rate": 0.5', result.stderr)
    self.assertEqual(self._config_json(model_dir), before)
    new_dir = os.path.join(self.root, "dry_new")
    self._train(new_dir, "--dry_run")
    self.assertFalse(os.path.exists(new_dir))

  def test_a_refusal_is_one_line_without_the_configuration(self):
    model_dir = os.path.join(self.root, "refused")
    self._train(model_dir, "--train_steps=10")
    before = self._config_json(model_dir)
    result = self._train(model_dir, "--width=0.125", check=False)
    self.assertEqual(result.returncode, 1)
    self.assertRegex(testing.last_stderr_line(result),
                     r"^error: --model_dir=.* cannot continue with width")
    self.assertNotIn('"preprocessing"', result.stderr)
    self.assertEqual(self._config_json(model_dir), before)

  def test_an_infinite_value_stored_before_is_named_and_can_be_fixed(self):
    model_dir = os.path.join(self.root, "stored_inf")
    self._train(model_dir, "--train_steps=10")
    path = os.path.join(model_dir, "config.json")
    text = self._config_json(model_dir)
    with open(path, "w") as f:  # As the code before this fix could write.
      f.write(re.sub(r'"weight_decay": [^,\n]+', '"weight_decay": Infinity',
                     text))
    result = self._train(model_dir, "--train_steps=20", check=False)
    self.assertEqual(testing.last_stderr_line(result),
                     "error: --weight_decay must be a finite number, got inf")
    self._train(model_dir, "--train_steps=20", "--weight_decay=1e-4")
    stored = json.loads(self._config_json(model_dir))
    self.assertEqual(stored["config"]["weight_decay"], 1e-4)


if __name__ == "__main__":
  absltest.main()
