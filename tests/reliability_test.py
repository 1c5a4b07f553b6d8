"""Mistakes a user makes, and what is on disk after them: non-finite float
flags, a truncated dataset file, refusals before training starts, damaged
checkpoints and input positions, config.json's history, dry runs and
commands that train nothing.

Where a mistake comes in several variants, each binary runs once for one of
them and the others go through the call its main() makes, in this process
(`testing.library_line`, `testing.train_in_process`); the many flags
refused as they are parsed, by one interpreter per binary
(`testing.flag_checks`)."""

import fcntl
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
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
    "results_tables": ["--results_dir=/nonexistent/results"],
    "serve_client": ["--model_name=m", "image.png"],
    "sharpness": ["--model_dir=/nonexistent/run"],
    "ship_model": ["--model_dir=/nonexistent/run", "--output_dir=/nonexistent/o",
                   "--command=x", "--test_top1=0.5"],
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
  # A fresh interpreter: a forked one has TensorFlow's flags defined too.
  result = testing.run_binary(binary, "--helpfull", fresh=True)
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
      cases = [(name, value) for name in names
               for value in ("inf", "nan", "-inf")]
      runs = [[*REQUIRED[binary], f"--{name}={value}"]
              for name, value in cases]
      # The binary itself for the first, as a user runs it; the others (all
      # refused as the flags are parsed, before main() does anything) by
      # one interpreter calling the binary's entry point for each.
      results = ([testing.run_binary(binary, *runs[0])] +
                 testing.flag_checks(binary, runs[1:]) if runs else [])
      for (name, value), result in zip(cases, results, strict=True):
        self.assertEqual(result.returncode, 1, (binary, name, value))
        # Ours, or absl's own validator's when the flag has one that NaN
        # fails first ("FATAL Flags parsing error: ... --width must be
        # positive"): either way one refusal naming the flag.
        self.assertRegex(result.stderr,
                         rf"(^|\n)(error|FATAL Flags parsing error): .*"
                         rf"--{name}\b", (binary, name, value))
      checked += [f"{binary} --{name}" for name in names]
    # The parse found the float flags (e.g. train's Config fields).
    self.assertIn("train --learning_rate", checked)
    self.assertIn("train --weight_decay", checked)
    for flag in ("evaluate --watch_timeout", "study --epochs",
                 "serve_client --timeout", "construct --sgd_learning_rate",
                 "train --cluster_timeout", "linear_theory --step_size"):
      self.assertIn(flag, checked)

  def test_the_list_flags_of_numbers_refuse_nan_and_infinity(self):
    # Comma-separated floats are parsed by the binaries, not by absl; small
    # grids, so that a value let through would not run for long.
    small = {"linear_theory": ["landscape", "--depths=2", "--starts=1",
                               "--steps=1", "--d=2"],
             "conjecture": ["--depths=2", "--widths=2", "--seeds=1",
                            "--samples=8", "--steps=1"]}
    flag_of = {"linear_theory": "taus", "conjecture": "init_norms"}
    for binary, flag in flag_of.items():
      # conjecture loads TensorFlow before it reads its lists: its second
      # value through what its main() calls, in this process.
      values = ("nan",) if binary == "conjecture" else ("nan", "0.1,inf")
      results = testing.run_binaries(
          binary, {value: [*small[binary], f"--{flag}={value}"]
                   for value in values}, workers=2)
      for value, result in results.items():
        what = (binary, value, result.stderr[-1000:])
        self.assertEqual(result.returncode, 1, what)
        self.assertRegex(testing.last_stderr_line(result),
                         rf"^error: --{flag} ", what)
        self.assertNotIn("Traceback", result.stderr, what)
    from identity_tf.theory import conjecture  # pylint: disable=g-import-not-at-top
    printed = []
    # bin/conjecture.py's settings: its flags' values (lists as absl's list
    # flags give them), None where unset.
    settings = {"depths": ["2"], "widths": ["2"], "hidden": None,
                "init_norms": ["0.1", "inf"], "seeds": 1, "samples": 8,
                "steps": 1, "learning_rate": None, "teacher_norm": None,
                "tolerance": None, "stall_gradient": None}
    self.assertRegex(
        testing.library_line(self, conjecture.probe_command, settings,
                             log=printed.append, emit=printed.append),
        r"^error: --init_norms ")
    self.assertEqual(printed, [])


def _helpfull_flags(binary):
  """The flags absl's --helpfull lists under BINARY's module and the
  command layer's (those a binary adopts), read off its sections."""
  text = testing.run_binary(binary, "--helpfull").stdout  # absl exits 1.
  parts = re.split(r"^(\S.*):$", text, flags=re.M)
  names = set()
  for header, body in zip(parts[1::2], parts[2::2]):
    if header.endswith(f"bin/{binary}.py") or header.endswith(".cli"):
      names.update(re.findall(r"^  --(?:\[no\])?(\w+):", body, re.M))
  return names


def _help_flags(text):
  """{flag: the value shown beside it, None if none} of a --help TEXT."""
  return {name: value or None for name, value in re.findall(
      r"^  --(?:\[no\])?(\w+)(?:=(.*))?$", text, re.M)}


class HelpTest(absltest.TestCase):
  """--help lists what a user can set: every flag of the binary, grouped
  for //bin:train, with the chosen preset's value beside each."""

  def test_train_help_shows_every_setting_of_the_chosen_preset(self):
    result = testing.run_binary("train", "--preset=cifar10_paper", "--help",
                                check=True)
    text = result.stdout
    shown = _help_flags(text)
    self.assertEqual(set(shown), _helpfull_flags("train"))
    self.assertLen(re.findall(r"^  --", text, re.M), len(shown))
    # Section 4.1 of the paper, and the clip the preset adds.
    for name, value in {"learning_rate": "0.05", "momentum": "0.9",
                        "batch_size": "128", "weight_decay": "0.0001",
                        "lr_boundaries": "30000,50000", "lr_decay_factor":
                        "0.1", "grad_clip_norm": "1.0",
                        "preset": "cifar10_paper"}.items():
      self.assertEqual(shown[name], value, name)
    self.assertEqual(re.findall(r"^(\w[\w ,]*):$", text, re.M), [
        "the command", "the network", "the data", "the optimiser",
        "stabilisers", "checkpoints, progress and evaluation",
        "distribution, precision and speed"])
    # absl's own flags and file headers are --helpfull's, not --help's; no
    # line continuation collapsed into a run of spaces.
    self.assertNotIn("verbosity", shown)
    self.assertNotIn(".py:", text)
    for line in text.splitlines():
      self.assertNotRegex(line.strip(), r"\S {3,}\S", line)
    # Another preset, another column of values (NF-ResNet's recipe).
    other = _help_flags(testing.run_binary(
        "train", "--preset", "nf_resnet_cifar", "-h", check=True).stdout)
    self.assertEqual((other["nesterov"], other["lr_schedule"]),
                     ("true", "cosine"))

  def test_every_binary_lists_its_own_flags(self):
    binaries = sorted(name[:-3] for name in os.listdir(
        os.path.join(testing.source_root(), "bin")) if name.endswith(".py"))
    for binary in binaries:
      result = testing.run_binary(binary, "--help")
      with self.subTest(binary=binary):
        self.assertEqual(result.returncode, 0, result.stderr[-1000:])
        self.assertEqual(set(_help_flags(result.stdout)),
                         _helpfull_flags(binary))


def _wait_for_handler(pid, signum, timeout=120):
  """Returns once process PID catches SIGNUM (the SigCgt mask of
  /proc/PID/status): the binary's main() has begun (`cli.begin`)."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    with open(f"/proc/{pid}/status") as f:
      caught = [int(line.split()[1], 16) for line in f
                if line.startswith("SigCgt:")]
    if caught and caught[0] >> (signum - 1) & 1:
      return
    time.sleep(0.01)
  raise AssertionError(f"process {pid} never caught signal {signum}")


class EarlySignalTest(testing.SharedRootTestCase):

  def test_a_signal_in_the_first_seconds_is_one_line(self):
    # From the moment main() starts, through `import tensorflow`, to the
    # loop (which then saves a checkpoint first: kill_loop_test). The
    # delays count from main()'s start (SIGTERM caught: Python itself
    # catches SIGINT from its own start), so that a loaded machine's slower
    # interpreter start-up does not send the signal before it.
    for number, (signum, code) in enumerate(
        [(signal.SIGINT, 130), (signal.SIGTERM, 143)] * 3):
      delay = (0.0, 0.4, 1.4)[number // 2]
      model_dir = os.path.join(self.root, f"early{number}")
      process = subprocess.Popen(
          testing.binary_command("train", f"--model_dir={model_dir}",
                                 *SMOKE),
          env=testing.binary_env(), stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True)
      _wait_for_handler(process.pid, signal.SIGTERM)
      time.sleep(delay)
      process.send_signal(signum)
      _, stderr = process.communicate(timeout=120)
      what = (signal.Signals(signum).name, delay, stderr[-2000:])
      self.assertEqual(process.returncode, code, what)
      self.assertNotIn("Traceback", stderr, what)
      last = stderr.strip().splitlines()[-1]
      self.assertRegex(last, rf"stopped by {signal.Signals(signum).name}",
                       what)


def _run_with_fewer_mnist_records(counts, *args):
  """bin/prepare_data.py with ARGS in a fresh interpreter, as `run_binary`
  runs it, but with TFDS's MNIST builders reading COUNTS records
  (`testing.fewer_mnist_examples`): the real ones read 60,000 + 10,000."""
  return subprocess.run(testing.prepare_data_command_with_records(counts,
                                                                 *args),
                        capture_output=True, text=True, timeout=600,
                        env=testing.binary_env(), check=False)


class PrepareDataTest(testing.SharedRootTestCase):

  def test_a_file_cut_short_is_named_and_the_data_dir_left_as_it_was(self):
    counts = {"train": 24, "test": 12}
    good = os.path.join(self.root, "good")
    testing.write_fashion_mnist_files(good, np.random.default_rng(0), counts)
    # Cut short inside a valid gzip: only the idx header can tell.
    truncated = os.path.join(self.root, "truncated")
    shutil.copytree(good, truncated)
    name = testing.FASHION_FILES["test"][0]
    with gzip.open(os.path.join(good, name)) as f:
      content = f.read()
    kept = len(content) // 2
    with gzip.open(os.path.join(truncated, name), "wb") as f:
      f.write(content[:kept])
    data_dir = os.path.join(self.root, "data")
    os.makedirs(data_dir)
    with open(os.path.join(data_dir, "notes.txt"), "w") as f:
      f.write("what the user keeps here\n")
    before = testing.snapshot(data_dir)
    result = testing.run_binary("prepare_data", "--dataset=fashion_mnist",
                                f"--data_dir={data_dir}",
                                f"--source_dir={truncated}")
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    # The header (magic, count, rows, columns: 16 bytes) promises count x
    # 28 x 28 pixels; what is left of the file follows it.
    path = os.path.join(truncated, name)
    named = [line for line in (result.stdout + result.stderr).splitlines()
             if name in line]
    self.assertEqual(named, [testing.last_stderr_line(result)])
    self.assertTrue(named[0].startswith(
        f"error: {path} is cut short: its header describes {counts['test']} "
        f"x 28 x 28 values ({counts['test'] * 28 * 28} bytes after the "
        f"header), but only {kept - 16} follow it; replace it with an "
        "intact copy"), named[0])
    self.assertNotIn("reshape", result.stderr)
    self.assertEqual(testing.snapshot(data_dir), before)
    # The same data_dir takes the good files.
    result = _run_with_fewer_mnist_records(
        counts, "--dataset=fashion_mnist", f"--data_dir={data_dir}",
        f"--source_dir={good}")
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    after = testing.snapshot(data_dir)
    self.assertEqual({k: after[k] for k in before}, before)
    infos = [k for k in after
             if re.fullmatch(r"fashion_mnist/[\d.]+/dataset_info\.json", k)]
    self.assertLen(infos, 1)
    with open(os.path.join(data_dir, infos[0])) as f:
      splits = json.load(f)["splits"]
    self.assertEqual({s["name"]: sum(map(int, s["shardLengths"]))
                      for s in splits}, counts)
    # Nothing else: the dataset, and the (empty) downloads directory.
    self.assertEqual({k.split(os.sep)[0] for k in set(after) - set(before)},
                     {"fashion_mnist", "downloads"})
    self.assertEqual(os.listdir(os.path.join(data_dir, "downloads")), [])


def _model_weights(prefix):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith("model/")}


# Where a checkpoint of one replica keeps its input position.
ITERATOR_STATE = "iterator/.ATTRIBUTES/ITERATOR_STATE"


def _give_another_input_position(prefix):
  """Rewrites checkpoint PREFIX with the input position of another pipeline
  (a range dataset's iterator) instead of its own, every other tensor as it
  was: the bytes pass TensorFlow's checksums, the position fits no
  pipeline of ours."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  reader = tf.train.load_checkpoint(prefix)
  names = sorted(name for name in reader.get_variable_to_shape_map()
                 if name != ITERATOR_STATE)
  other = iter(tf.data.Dataset.range(3))
  next(other)
  state = tf.raw_ops.SerializeIterator(
      resource_handle=other._iterator_resource)  # pylint: disable=protected-access
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names + [ITERATOR_STATE],
                    shape_and_slices=[""] * (len(names) + 1),
                    tensors=[reader.get_tensor(n) for n in names] + [state])


def _damage(path):
  """Overwrites bytes in the middle of PATH (its digest no longer fits)."""
  with open(path, "r+b") as f:
    f.seek(1000)
    f.write(b"\0" * 100)


class OneRunTest(testing.SharedRootTestCase):
  """What a mistake does to a run: each test takes a copy of one tiny
  deterministic run of 20 steps (checkpoints at 10 and 20)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.run_dir = os.path.join(cls.root, "run")
    testing.run_binary("train", f"--model_dir={cls.run_dir}", *SMOKE,
                       "--deterministic", "--noeval_at_end",
                       "--train_steps=20", check=True)

  def _copy(self, name):
    model_dir = os.path.join(self.root, name)
    shutil.copytree(self.run_dir, model_dir)
    return model_dir

  def test_a_damaged_input_position_without_digest_falls_back(self):
    model_dir = self._copy("position")
    prefix = os.path.join(model_dir, "ckpt-20")
    expected = _model_weights(prefix)
    # The digest gone, bytes of the saved input position (the first entry
    # of the data file) overwritten: only TensorFlow's checksum sees it.
    os.remove(prefix + ".sha256")
    _damage(prefix + ".data-00000-of-00001")
    result = testing.run_binary("train", f"--model_dir={model_dir}",
                                "--train_steps=20", check=True)
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

  def test_an_input_position_that_does_not_fit_is_replayed(self):
    model_dir = self._copy("replayed")
    expected = _model_weights(os.path.join(model_dir, "ckpt-20"))
    # Stopped before its checkpoint of step 20, ckpt-10 holding a position
    # this pipeline cannot restore (as one of an older version may); no
    # digest, as checkpoints written before digests existed.
    for name in os.listdir(model_dir):
      if name.startswith("ckpt-20."):
        os.remove(os.path.join(model_dir, name))
    prefix = os.path.join(model_dir, "ckpt-10")
    _give_another_input_position(prefix)
    os.remove(prefix + ".sha256")
    result = testing.run_binary("train", f"--model_dir={model_dir}",
                                "--train_steps=20", check=True)
    self.assertRegex(result.stderr, rf"the input position in "
                     rf"{re.escape(prefix)} does not fit this input pipeline "
                     r"\(.*\); replaying the input instead")
    self.assertIn(f"resumed from {prefix} at step 10", result.stderr)
    self.assertNotIn("damaged", result.stderr)
    # Started at step 10, the input yields what the uninterrupted run's did:
    # the same weights at step 20.
    again = _model_weights(os.path.join(model_dir, "ckpt-20"))
    self.assertEqual(sorted(again), sorted(expected))
    for name, value in expected.items():
      np.testing.assert_array_equal(again[name], value, err_msg=name)

  def test_a_refusal_before_training_is_its_one_line_alone(self):
    no_data = os.path.join(self.root, "no_data")
    os.makedirs(no_data)
    where = re.escape(no_data)
    missing = (rf"^error: dataset fashion_mnist is not prepared in "
               rf"--data_dir={where} \(no fashion_mnist/[\d.]+ in it\): "
               rf".*--dataset=fashion_mnist --data_dir={where}\b")
    locked = self._copy("locked")
    tpu = self._copy("tpu")
    # A run of a dataset that is not prepared where it resumes (say, moved
    # to another machine).
    moved = self._copy("moved")
    with open(os.path.join(moved, "config.json")) as f:
      description = json.load(f)
    description["config"]["dataset"] = "fashion_mnist"
    with open(os.path.join(moved, "config.json"), "w") as f:
      json.dump(description, f)
    holder = f"pid {os.getpid()} on the test"
    cases = {
        # Another training holds the model_dir (this process, here).
        "lock": ([f"--model_dir={locked}", "--train_steps=30"], locked,
                 rf"^error: --model_dir={re.escape(locked)} is in use by "
                 rf"another training \({holder}\); .*use another "
                 "--model_dir$"),
        "tpu": ([f"--model_dir={tpu}", "--train_steps=30",
                 "--strategy=tpu"], tpu,
                r"^error: --strategy=tpu found no TPU .*--tpu="),
        "new run, no data": (
            [f"--model_dir={self.root}/fresh", *SMOKE,
             "--dataset=fashion_mnist", f"--data_dir={no_data}"],
            f"{self.root}/fresh", missing),
        "resumed run, no data": (
            [f"--model_dir={moved}", "--train_steps=30",
             f"--data_dir={no_data}"], moved, missing),
    }
    with open(os.path.join(locked, ".train.lock"), "a+") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      lock.seek(0)
      lock.truncate()
      lock.write(holder + "\n")
      lock.flush()
      before = {key: testing.snapshot(model_dir)
                for key, (_, model_dir, _) in cases.items()}
      results = testing.run_binaries(
          "train", {key: args for key, (args, _, _) in cases.items()},
          workers=2)
    for key, (_, model_dir, pattern) in cases.items():
      result = results[key]
      what = (key, result.stderr[-2000:])
      self.assertEqual(result.returncode, 1, what)
      # The error alone: no configuration before it, no TFDS warning.
      lines = testing.own_stderr_lines(result)
      self.assertLen(lines, 1, what)
      self.assertRegex(lines[0], pattern, what)
      self.assertEqual(result.stdout, "", what)
      self.assertEqual(testing.snapshot(model_dir), before[key], key)
    self.assertFalse(os.path.exists(os.path.join(self.root, "fresh")))
    self.assertEqual(os.listdir(no_data), [])

  def test_an_export_with_every_checkpoint_damaged_exports_nothing(self):
    model_dir = self._copy("all_damaged")
    for step in (10, 20):
      _damage(os.path.join(model_dir, f"ckpt-{step}.data-00000-of-00001"))
    before = testing.snapshot(model_dir)
    export_dir = os.path.join(self.root, "exported")
    result = testing.run_binary("export", f"--model_dir={model_dir}",
                                f"--export_dir={export_dir}")
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    lines = testing.own_stderr_lines(result)
    self.assertLen(lines, 1, result.stderr[-2000:])
    self.assertRegex(lines[0], rf"^error: no intact checkpoint in "
                     rf"--model_dir={re.escape(model_dir)}: ckpt-20: .*; "
                     "ckpt-10: ")
    self.assertEqual(result.stdout, "")
    self.assertFalse(os.path.exists(export_dir))
    self.assertEqual(testing.snapshot(model_dir), before)


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
         rf"^error: --R={singular}: R is singular.*; give a full-rank R"),
        (["construct", f"--data={text}", f"--output_dir={root}/c"],
         rf"^error: --data={text} is not an \.npz archive .*numpy\.savez"),
        (["construct", "--dataset=synthetic", "--num_examples=10",
          "--seed=-1", f"--output_dir={root}/c"], r"--seed=-1"),
        # Not "prepare it into that path": a file cannot hold a dataset.
        (["train", *SMOKE, "--dataset=fashion_mnist", f"--data_dir={a_file}",
          f"--model_dir={root}/t"],
         rf"^error: --data_dir={a_file} is a file, not a directory: pass "
         rf"--data_dir=DIR (?!.*{a_file}).*prepare_data.* "
         r"--dataset=fashion_mnist --data_dir=DIR"),
        # NumPy's generator takes 32-bit seeds; said before TensorFlow loads.
        (["train", "--seed=-1", f"--model_dir={root}/s"],
         r"^error: --seed=-1: must be between 0 and 2\*\*32 - 1$"),
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
      if binary == "train":  # The line alone, nothing (of TFDS's) before it.
        self.assertEqual(testing.own_stderr_lines(result), [line], args)
        if any(arg.startswith("--seed=") for arg in args):
          self.assertEqual(result.stderr.strip(), line)  # Not even TF's log.
    # linear_theory's other mistake through what its main() calls, in this
    # process (TensorFlow loads before it reads --R): the flags it was given,
    # None for the others.
    from identity_tf.commands import linear_theory  # pylint: disable=g-import-not-at-top
    printed = []
    given = {"R": text, "layers": 3, "output": f"{root}/a.npz"}
    line = testing.library_line(
        self, linear_theory.main, ["factorize"],
        {name: given.get(name) for name in linear_theory.FLAG_NAMES},
        log=printed.append, emit=printed.append)
    self.assertRegex(line, rf"^error: --R={text} is not a \.npy file "
                     r".*numpy\.save")
    self.assertNotIn("allow_pickle", line)
    self.assertEqual(printed, [])
    # train's other seed the same way: the binary refused --seed=-1 above.
    self.assertRegex(
        testing.library_line(self, testing.train_config, f"--seed={2**32}",
                             f"--model_dir={root}/s"),
        rf"^error: --seed={2**32}: must be between 0 and 2\*\*32 - 1$")
    for name in ("a.npz", "c", "t", "e", "s"):
      self.assertFalse(os.path.exists(os.path.join(root, name)), name)
    self.assertEqual(os.listdir(empty), [])


def _history(applied):
  """config.json's history as the configurations that applied from each
  step (APPLIED: {step: config}) make it: for each step after the first, the
  fields whose value differs from the configuration before, as [before,
  after]; none for a step where nothing differs."""
  steps = sorted(applied)
  history = []
  for before, step in zip(steps, steps[1:]):
    changed = {name: [applied[before][name], value]
               for name, value in applied[step].items()
               if applied[before][name] != value}
    if changed:
      history.append({"step": step, "changed": changed})
  return history


class ConfigHistoryTest(testing.SharedRootTestCase):

  # The new run every test starts from: 10 steps at a constant rate.
  FIRST = ("--train_steps=10", "--lr_schedule=constant",
           "--learning_rate=0.01", "--noeval_at_end")

  def _copy_of_trained(self, name):
    """A copy in ROOT/NAME of the smoke run `_train` starts with FIRST,
    trained once for every test that asks."""
    base = os.path.join(self.root, "trained_once")
    if not os.path.isdir(base):
      self._train(base, *self.FIRST)
    model_dir = os.path.join(self.root, name)
    shutil.copytree(base, model_dir)
    return model_dir

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

  def test_history_has_each_change_from_its_step_and_undone_ones_vanish(self):
    model_dir = self._copy_of_trained("history")  # Trained with FIRST.
    first = json.loads(self._config_json(model_dir))
    self.assertNotIn("history", first)
    applied = {0: first["config"]}  # The configuration from each step on.
    decay = first["config"]["weight_decay"]
    # From step 10 the run goes to 30, then is killed before its checkpoint
    # of step 30 (no checkpoint on the way out) and resumes at step 20,
    # again and again with other flags.
    for step, flags, changes in [
        (10, ["--train_steps=30", "--learning_rate=0.02"],
         {"train_steps": 30, "learning_rate": 0.02}),
        # Back to the first rate, but from another step: an entry of its own.
        (20, ["--learning_rate=0.01", "--weight_decay=0.001"],
         {"learning_rate": 0.01, "weight_decay": 0.001}),
        (20, ["--learning_rate=0.02"], {"learning_rate": 0.02}),  # Undone.
        (20, [f"--weight_decay={decay}"], {"weight_decay": decay}),  # All.
    ]:
      self._train(model_dir, *flags)
      for name in os.listdir(model_dir):
        if name.startswith("ckpt-30."):
          os.remove(os.path.join(model_dir, name))
      applied[step] = {**applied[max(applied)], **changes}
      stored = json.loads(self._config_json(model_dir))
      self.assertEqual(stored["config"], applied[step], flags)
      self.assertEqual(stored["history"], _history(applied), flags)
    self.assertEqual(stored["history"], [
        {"step": 10, "changed": {"learning_rate": [0.01, 0.02],
                                 "train_steps": [10, 30]}}])

  def test_a_command_that_trains_nothing_changes_nothing(self):
    model_dir = self._copy_of_trained("nothing")  # 10 steps trained.
    before = self._config_json(model_dir)
    files = sorted(os.listdir(model_dir))
    result = self._train(model_dir, "--train_steps=5")
    self.assertIn("nothing to train", result.stderr)
    self.assertNotIn("training cifar10", result.stderr)
    self.assertNotIn(" eval: ", result.stderr)  # No evaluation either.
    self.assertIn("done: step 10, nothing trained", result.stdout)
    self.assertEqual(self._config_json(model_dir), before)
    self.assertEqual(sorted(os.listdir(model_dir)), files)

  def test_a_dry_run_writes_nothing(self):
    model_dir = self._copy_of_trained("dry")
    before = self._config_json(model_dir)
    result = self._train(model_dir, "--dry_run", "--learning_rate=0.5",
                         "--train_steps=160")
    self.assertIn("nothing was written", result.stdout)
    self.assertIn('"learning_rate": 0.5', result.stderr)
    self.assertEqual(self._config_json(model_dir), before)
    # A new run's dry run, as the binary runs it once its flags are checked
    # (in this process; the binary's part is the dry run above).
    new_dir = os.path.join(self.root, "dry_new")
    status, stderr, stdout = testing.train_in_process(
        f"--model_dir={new_dir}", *SMOKE, "--dry_run")
    self.assertEqual(status, 0, stderr[-2000:])
    self.assertIn("nothing was written", stdout)
    self.assertFalse(os.path.exists(new_dir))

  def test_a_refusal_is_one_line_without_the_configuration(self):
    model_dir = self._copy_of_trained("refused")
    before = self._config_json(model_dir)
    result = self._train(model_dir, "--width=0.125", check=False)
    self.assertEqual(result.returncode, 1)
    self.assertRegex(testing.last_stderr_line(result),
                     r"^error: --model_dir=.* cannot continue with width")
    self.assertNotIn('"preprocessing"', result.stderr)
    self.assertEqual(self._config_json(model_dir), before)

  def test_an_infinite_value_stored_before_is_named_and_can_be_fixed(self):
    model_dir = self._copy_of_trained("stored_inf")
    path = os.path.join(model_dir, "config.json")
    text = self._config_json(model_dir)
    with open(path, "w") as f:  # As the code before this fix could write.
      f.write(re.sub(r'"weight_decay": [^,\n]+', '"weight_decay": Infinity',
                     text))
    result = self._train(model_dir, "--train_steps=20", check=False)
    self.assertEqual(testing.last_stderr_line(result),
                     f"error: {path} holds an invalid weight_decay: "
                     "weight_decay must be a finite number, got inf; pass "
                     "--weight_decay to replace it")
    self._train(model_dir, "--train_steps=20", "--weight_decay=1e-4")
    stored = json.loads(self._config_json(model_dir))
    self.assertEqual(stored["config"]["weight_decay"], 1e-4)


# Issue 75. TensorFlow's C++ start-up lines (the CUDA stubs, cuInit,
# oneDNN, cpu_feature_guard, absl's notice before its log is initialised):
# none of a binary's own.
_START_UP_LINES = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog"
    r"|[IWEF]\d{4} [\d:.]+\s+\d+ \w+\.cc:\d+\]"
    r"|To enable the following instructions)")
# Where Keras and Matplotlib would write if the environment did not say.
_HOME_VARIABLES = ("KERAS_HOME", "MPLCONFIGDIR", "XDG_CACHE_HOME",
                   "XDG_CONFIG_HOME")


def _home_env(home):
  """Our environment with HOME=HOME (a writable, empty directory, where a
  write would show) and nothing else pointing Keras or Matplotlib away."""
  env = {k: v for k, v in os.environ.items() if k not in _HOME_VARIABLES}
  env["HOME"] = home
  return env


def _everything_under(directory):
  return sorted(os.path.relpath(os.path.join(root, name), directory)
                for root, dirs, names in os.walk(directory)
                for name in dirs + names)


def _closed_stdout(binary, *args, env=None):
  """(exit status, stderr) of bin/BINARY.py with ARGS whose stdout's reader
  is gone from the start, as in `BINARY ... | true`."""
  process = subprocess.Popen(testing.binary_command(binary, *args),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=testing.binary_env(env))
  process.stdout.close()
  stderr = process.stderr.read()
  process.stderr.close()
  return process.wait(timeout=600), stderr


_CLOSED_LINE = ("error: the output was closed before the command could write "
                "all of it (a pipe's reader such as head exited); what it "
                "wrote to files is whole: run it again without closing its "
                "output to see the rest")


class ClosedOutputTest(testing.SharedRootTestCase):
  """Items 3 and 9: a closed stdout is one line after the work, whose files
  are whole; no binary writes into the home directory."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.home = os.path.join(cls.root, "home")
    os.makedirs(cls.home)
    cls.model_dir = os.path.join(cls.root, "run")
    cls.train = _closed_stdout("train", *SMOKE, "--train_steps=10",
                               f"--model_dir={cls.model_dir}",
                               env=_home_env(cls.home))

  def _assert_closed(self, status, stderr):
    self.assertEqual(status, 1, stderr[-2000:])
    self.assertNotIn("Traceback", stderr)
    self.assertNotIn("Exception ignored", stderr)
    self.assertEqual(stderr.strip().splitlines()[-1], _CLOSED_LINE)

  def test_a_closed_stdout_is_one_line_and_the_files_are_whole(self):
    self._assert_closed(*self.train)
    with open(os.path.join(self.model_dir, "checkpoint")) as f:
      self.assertIn("ckpt-10", f.read())
    status, stderr = _closed_stdout("evaluate", f"--model_dir={self.model_dir}",
                                    "--num_examples=100",
                                    env=_home_env(self.home))
    self._assert_closed(status, stderr)
    with open(os.path.join(self.model_dir, "metrics.jsonl")) as f:
      records = [json.loads(line) for line in f]
    self.assertEqual([r["eval"]["examples"] for r in records
                      if r.get("source") == "evaluate"], [100])
    # A study's report over the run, as the first run of the smoke study.
    output_dir = os.path.join(self.root, "study")
    shutil.copytree(self.model_dir, os.path.join(output_dir, "smoke",
                                                 "seed0"))
    status, stderr = _closed_stdout("study", "--study=smoke", "--report_only",
                                    f"--output_dir={output_dir}",
                                    env=_home_env(self.home))
    self._assert_closed(status, stderr)
    with open(os.path.join(output_dir, "results.json")) as f:
      self.assertEqual(json.load(f)["arms"][0]["runs"][0]["model_dir"],
                       os.path.join(output_dir, "smoke", "seed0"))
    self.assertEqual(_everything_under(self.home), [])

  def test_no_binary_writes_into_home_or_prints_start_up_lines(self):
    # Item 10 too: a report named with 250 characters, a legal name.
    home = os.path.join(self.root, "home2")
    os.makedirs(home)
    report = os.path.join(self.root, "r" * 245 + ".json")
    plot = os.path.join(self.root, "landscape.png")
    png = os.path.join(self.root, "img.png")
    with open(png, "wb") as f:
      f.write(testing.PNG_SIGNATURE + bytes(100))
    # What a binary killed with SIGKILL leaves in the temporary directory
    # (its Keras and Matplotlib directory): the next binary removes it.
    finished = subprocess.Popen(["true"])
    finished.wait()
    leftover = os.path.join(tempfile.gettempdir(),
                            f"identity_tf-home-{finished.pid}-killed")
    os.makedirs(os.path.join(leftover, "keras_home"))
    results = {
        "linear_theory": testing.run_binary(
            "linear_theory", "landscape", "--d=2", "--depths=2",
            "--taus=0.1", "--starts=1", "--steps=5", f"--output={report}",
            f"--plot={plot}", env=_home_env(home)),
        "serve_client": testing.run_binary(
            "serve_client", f"--server=127.0.0.1:{testing.free_ports(1)[0]}",
            "--model_name=m", png, env=_home_env(home)),
    }
    for name, result in results.items():
      with self.subTest(name):
        self.assertEqual(result.returncode,
                         1 if name == "serve_client" else 0,
                         result.stderr[-2000:])
        self.assertEqual([line for line in result.stderr.splitlines()
                          if _START_UP_LINES.match(line)], [])
    self.assertIn("cannot reach TF Serving's REST API",
                  testing.last_stderr_line(results["serve_client"]))
    with open(plot, "rb") as f:
      self.assertEqual(f.read(8), testing.PNG_SIGNATURE)
    with open(report) as f:
      self.assertEqual(json.load(f)["output"], report)
    self.assertEqual(sorted(name for name in os.listdir(self.root)
                            if ".tmp" in name), [])
    self.assertEqual(_everything_under(home), [])
    self.assertEqual(_everything_under(self.home), [])
    self.assertFalse(os.path.exists(leftover))


class AtomicWriterTest(absltest.TestCase):
  """Item 10: every legal name is written whole; a name or a directory that
  cannot take the file is refused before the work."""

  def test_the_longest_legal_names_are_written_and_others_refused(self):
    from identity_tf import errors  # pylint: disable=g-import-not-at-top
    from identity_tf import files  # pylint: disable=g-import-not-at-top
    directory = self.create_tempdir().full_path
    # 255 bytes each, the most a Linux filesystem takes; one of two-byte
    # characters.
    names = ["a" * 255, "\u00e9" * 127 + "x", "b" * 251 + ".png"]
    for name in names:
      with self.subTest(name=name[:8]):
        path = os.path.join(directory, name)
        self.assertLen(os.fsencode(name), 255)
        files.check_output_file(path, "--output")
        files.write_text_atomically(path, "whole\n")
        files.write_atomically(path, lambda temporary: shutil.copy(
            os.path.join(directory, names[0]), temporary), suffix=".png")
        with open(path) as f:
          self.assertEqual(f.read(), "whole\n")
    self.assertEqual(sorted(os.listdir(directory)), sorted(names))
    longer = os.path.join(directory, "c" * 256)
    with self.assertRaises(errors.OutputError) as caught:
      files.check_output_file(longer, "--output=LONG")
    self.assertEqual(str(caught.exception),
                     "--output=LONG: the file name is 256 bytes long, more "
                     "than the 255 its filesystem takes; give a shorter name")
    # A directory that takes no new file, for any user (root included).
    with self.assertRaises(errors.OutputError) as caught:
      files.check_output_file("/proc/report.json", "--output=/proc/r")
    self.assertStartsWith(str(caught.exception),
                          "--output=/proc/r: cannot write into /proc (")
    self.assertEqual(sorted(os.listdir(directory)), sorted(names))


class IntegerBoundsTest(testing.SharedRootTestCase):
  """Item 8: an integer too large for what the run can count is refused up
  front, by every binary, in one line; nothing is written."""

  def test_every_integer_setting_is_bounded(self):
    from identity_tf import configs  # pylint: disable=g-import-not-at-top
    from identity_tf import errors  # pylint: disable=g-import-not-at-top
    import dataclasses  # pylint: disable=g-import-not-at-top
    base = configs.PRESETS["smoke"]
    checked = []
    for field in dataclasses.fields(configs.Config):
      if field.type is int or (field.type is tuple and field.name in (
          "units", "lr_boundaries")):
        huge = 2**32 if field.name == "seed" else 2**31
        for value in ((huge, -huge) if field.type is int else
                      ((1, huge),)):
          with self.subTest(field=field.name, value=value):
            with self.assertRaises(errors.ConfigError) as caught:
              configs.override(base, **{field.name: value})
            self.assertStartsWith(str(caught.exception), f"--{field.name}")
            checked.append(field.name)
    self.assertContainsSubset({"train_steps", "batch_size", "units",
                               "checkpoint_steps", "num_train_examples"},
                              set(checked))

  def test_every_float_setting_is_bounded_by_what_the_run_computes_in(self):
    # Round 5: a float beyond float32's range, a fixed scale whose draws or
    # logits leave 16- and 32-bit floats, a rate whose product with its
    # factors does: each refused up front, naming the option and its range.
    from identity_tf import configs  # pylint: disable=g-import-not-at-top
    from identity_tf import errors  # pylint: disable=g-import-not-at-top
    import dataclasses  # pylint: disable=g-import-not-at-top
    base = configs.PRESETS["smoke"]
    checked = []
    for field in dataclasses.fields(configs.Config):
      if field.type is not float:
        continue
      for value in (1e300, -1e300, 3.5e38):
        with self.subTest(field=field.name, value=value):
          with self.assertRaises(errors.ConfigError) as caught:
            configs.override(base, **{field.name: value})
          self.assertStartsWith(str(caught.exception), f"--{field.name}=")
          checked.append(field.name)
    self.assertContainsSubset({"learning_rate", "logit_scale",
                               "branch_init_scale", "weight_decay",
                               "agc_clip", "bias_lr_factor"}, set(checked))
    for name in ("logit_scale", "branch_init_scale"):
      for value in (1e4, 1e30, 1e-4, 1e-300):
        with self.subTest(field=name, value=value):
          with self.assertRaisesRegex(
              errors.ConfigError, rf"^{name} must be a number from 0.001 to "
              rf"1000 \(beyond, .*\), got {re.escape(repr(value))}$"):
            configs.override(base, **{name: value})
      configs.override(base, **{name: 1000.0})  # The range's ends hold.
      configs.override(base, **{name: 0.001})
    for overrides in ({"learning_rate": 1e20, "bias_lr_factor": 1e20},
                      {"learning_rate": 1e30, "lr_schedule": "piecewise",
                       "lr_boundaries": (10, 20, 30), "lr_decay_factor":
                       1e4}):
      with self.subTest(**{k: str(v) for k, v in overrides.items()}):
        with self.assertRaisesRegex(errors.ConfigError,
                                    r"^--learning_rate=.* reaches a rate "
                                    r"beyond float32's range"):
          configs.override(base, **overrides)
    # train's line, before anything is built or written.
    model_dir = os.path.join(self.root, "scaled")
    status, stderr, stdout = testing.train_in_process(
        *SMOKE, "--logit_scale=1e300", f"--model_dir={model_dir}")
    self.assertEqual(status, 1, stderr)
    self.assertStartsWith(stderr.strip().splitlines()[-1],
                          "error: --logit_scale=1e+300 is beyond float32's")
    self.assertEqual((stdout, os.path.exists(model_dir)), ("", False))

  def test_a_huge_integer_flag_is_refused_before_anything_runs(self):
    model_dir = os.path.join(self.root, "run")
    huge = 10**20
    cases = [
        ("train", [*SMOKE, f"--train_steps={huge}",
                   f"--model_dir={model_dir}"], "train_steps"),
        ("train", [*SMOKE, f"--units=1,{2**40}",
                   f"--model_dir={model_dir}"], "units"),
        ("train", [*SMOKE, f"--checkpoint_steps={-huge}",
                   f"--model_dir={model_dir}"], "checkpoint_steps"),
        ("evaluate", [f"--model_dir={model_dir}", f"--num_examples={huge}"],
         "num_examples"),
        ("serve_client", ["--model_name=m", f"--top_k={huge}", "x.png"],
         "top_k"),
        ("linear_theory", ["descend", f"--steps={huge}"], "steps"),
        ("study", ["--study=smoke", f"--seeds={huge}",
                   f"--output_dir={self.root}/study"], "seeds"),
        ("summary", [f"--units=1,{huge}"], "units"),
    ]
    for number, (binary, args, flag) in enumerate(cases):
      with self.subTest(binary=binary, flag=flag):
        if binary == "train" and number > 0:
          # train's settings are checked as it resolves its configuration
          # (once TensorFlow is loaded): the first by the binary, the others
          # through the same code in this process.
          status, stderr, stdout = testing.train_in_process(*args)
        else:
          result = testing.run_binary(binary, *args)
          status, stderr, stdout = (result.returncode, result.stderr,
                                    result.stdout)
          self.assertNotIn("Traceback", stderr)
        self.assertEqual(status, 1, stderr[-2000:])
        line = [line for line in stderr.splitlines() if line.strip()][-1]
        self.assertRegex(line, rf"^error: --{flag}=\S*\d{{10,}} is beyond "
                         r"\d+")
        self.assertEqual(stdout, "")
        self.assertEqual(sorted(os.listdir(self.root)), [])


class BazelSymlinksTest(absltest.TestCase):
  """Item 12: Bazel's convenience symlinks go where `//...` does not look,
  whichever output base they point into."""

  def test_every_convenience_symlink_is_ignored(self):
    # The checkout itself (under Bazel, this file's runfiles link leads
    # there): .bazelrc and .bazelignore are no target's data.
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    with open(os.path.join(root, ".bazelrc")) as f:
      prefixes = re.findall(r"^build\s+--symlink_prefix=(\S+)\s*$", f.read(),
                            re.MULTILINE)
    with open(os.path.join(root, ".bazelignore")) as f:
      ignored = {line.strip().rstrip("/") for line in f
                 if line.strip() and not line.startswith("#")}
    self.assertLen(prefixes, 1, "no --symlink_prefix: the links are "
                   "bazel-<directory>, a name .bazelignore cannot know")
    # A directory of links, so that its name is fixed whatever the
    # checkout's directory is called; and bazel-out, which Bazel makes
    # whatever the prefix.
    self.assertTrue(prefixes[0].endswith("/"), prefixes[0])
    self.assertIn(prefixes[0].rstrip("/"), ignored)
    self.assertIn("bazel-out", ignored)


if __name__ == "__main__":
  absltest.main()
