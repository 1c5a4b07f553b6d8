"""Runs that survive damage and mistakes: the damage, the fallback, the line.

A tiny --deterministic run with checkpoints at steps 40, 80 and 120 is
trained once; every test damages a copy of it the way a crash, a full disk or
a careless hand would, resumes it, and checks which checkpoint the run came
back from, that the intact ones survive, the message, and, where the run is
refused, that nothing in the directory changed. tests/kill_loop_test.py kills
a training at random moments.
"""

import errno
import glob
import os
import re
import shutil
import subprocess
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import errors
from identity_tf.training import checkpoints
from identity_tf.training import config_file
from identity_tf.commands import train as train_lib
from identity_tf.data import tfds_data
from identity_tf.training import metrics
from identity_tf.training import trainer
import testing

CONFIG = configs.from_preset(
    "smoke", width=0.0625, units="1", batch_size=16, train_steps=120,
    checkpoint_steps=40, log_steps=40, steps_per_loop=20, keep_checkpoints=5,
    eval_at_end=False, deterministic=True)


def _flip(path, offset):
  with open(path, "r+b") as f:
    f.seek(offset)
    byte = f.read(1)
    f.seek(offset)
    f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _iterator_offset(prefix):
  """An offset inside the input iterator's saved state in PREFIX's data."""
  with open(prefix + ".data-00000-of-00001", "rb") as f:
    data = f.read()
  # The iterator's state names its pipeline's stages.
  offset = data.find(b"Iterator::Root")
  assert offset > 0, "no iterator state found"
  return offset


class DamageTest(testing.SharedRootTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pristine = os.path.join(cls.root, "pristine")
    trainer.train(CONFIG, cls.pristine, echo=lambda line: None)

  def _copy(self):
    model_dir = os.path.join(self.create_tempdir().full_path, "run")
    shutil.copytree(self.pristine, model_dir)
    return model_dir

  def _resume(self, model_dir, **overrides):
    """Trains on to step 160; returns (lines, the step it resumed from)."""
    lines = []
    trainer.train(configs.override(CONFIG, train_steps=160, **overrides),
                model_dir, echo=lines.append)
    resumed = [re.search(r"resumed from .*ckpt-(\d+) at step (\d+)", line)
               for line in lines]
    (match,) = [m for m in resumed if m]
    self.assertEqual(match.group(1), match.group(2))
    self.assertEqual(checkpoints.checkpoint_step(
        tf.train.latest_checkpoint(model_dir)), 160)
    return lines, int(match.group(1))

  def test_the_state_file_is_not_needed(self):
    for damage in ("delete", "garbage"):
      model_dir = self._copy()
      state = os.path.join(model_dir, "checkpoint")
      if damage == "delete":
        os.remove(state)
      else:
        with open(state, "w") as f:
          f.write("this is not a checkpoint state\n")
      _, step = self._resume(model_dir)
      self.assertEqual(step, 120, damage)
      # The intact ones survive: rotation (5 kept) lists them all.
      self.assertEqual(
          [checkpoints.checkpoint_step(p)
           for p in checkpoints.checkpoint_prefixes(model_dir)],
          [160, 120, 80, 40])

  def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(self):
    newest = "ckpt-120"
    cases = {
        "index deleted": lambda p: os.remove(p + ".index"),
        "index truncated": lambda p: _truncate(p + ".index"),
        "data deleted": lambda p: os.remove(p + ".data-00000-of-00001"),
        "data truncated": lambda p: _truncate(p + ".data-00000-of-00001"),
        "data byte flipped": lambda p: _flip(p + ".data-00000-of-00001", 100),
        "iterator state byte flipped": lambda p: _flip(
            p + ".data-00000-of-00001", _iterator_offset(p) + 3),
    }
    for name, damage in cases.items():
      with self.subTest(name):
        model_dir = self._copy()
        prefix = os.path.join(model_dir, newest)
        damage(prefix)
        lines, step = self._resume(model_dir)
        self.assertEqual(step, 80)
        self.assertTrue(any(line.startswith(f"{newest} is damaged: ")
                            for line in lines), lines)
        self.assertTrue(any("resuming from ckpt-80, the newest intact" in line
                            for line in lines), lines)
        # Kept aside, not deleted.
        (moved,) = os.listdir(os.path.join(model_dir, checkpoints.DAMAGED_DIR))
        self.assertTrue(any(f.startswith(newest + ".") for f in os.listdir(
            os.path.join(model_dir, checkpoints.DAMAGED_DIR, moved))))

  def test_a_sha256_record_that_is_no_record_is_named_as_unreadable(self):
    # What write_digest never writes: a list, a number, JSON nested past
    # Python's recursion limit, bytes that are not text.
    records = {"list": "[1, 2]", "number": "7",
               "nested": "[" * 100_000 + "]" * 100_000,
               "binary": b"\xff\xfe\x00garbage"}
    model_dir = self._copy()
    prefix = os.path.join(model_dir, "ckpt-120")
    self.assertIsNone(checkpoints.damage(prefix))
    for name, record in records.items():
      with self.subTest(name):
        with open(prefix + ".sha256", "wb") as f:
          f.write(record if isinstance(record, bytes) else record.encode())
        self.assertEqual(checkpoints.damage(prefix),
                         "its .sha256 record is unreadable")

  def test_evaluate_and_export_take_the_newest_intact_checkpoint(self):
    model_dir = self._copy()
    _flip(os.path.join(model_dir, "ckpt-120.data-00000-of-00001"), 100)
    notes = []
    _, _, step = checkpoints.restore_model(model_dir, echo=notes.append)
    self.assertEqual(step, 80)
    self.assertRegex(notes[0], r"^ckpt-120 is damaged: .*SHA-256")
    with self.assertRaisesRegex(ValueError, "checkpoint .*ckpt-120 is damaged"):
      checkpoints.find_checkpoint(model_dir, 120)
    result = testing.run_binary("export", f"--model_dir={model_dir}",
                                f"--export_dir={model_dir}/serving",
                                check=True)
    self.assertIn("note: ckpt-120 is damaged", result.stderr)
    self.assertIn("exported step 80 of", result.stdout)

  def test_all_damaged_is_refused_and_nothing_changes(self):
    model_dir = self._copy()
    for step in (40, 80, 120):
      _flip(os.path.join(model_dir, f"ckpt-{step}.data-00000-of-00001"), 100)
    before = testing.snapshot(model_dir)
    lines = []
    with self.assertRaisesRegex(
        ValueError, r"holds checkpoints but none is intact \(ckpt-120: .*; "
        r"ckpt-80: .*; ckpt-40: .*\); nothing was changed"):
      trainer.train(CONFIG, model_dir, echo=lines.append)
    self.assertEqual(testing.snapshot(model_dir), before)
    # The error names them; no note before it says the same again.
    self.assertFalse(any("is damaged" in line for line in lines), lines)
    result = testing.run_binary("evaluate", f"--model_dir={model_dir}")
    self.assertEqual(result.returncode, 1)
    self.assertNotIn("note:", result.stderr)
    self.assertRegex(testing.last_stderr_line(result),
                     r"^error: no intact checkpoint in --model_dir=.*ckpt-120")

  def test_records_without_their_checkpoints_are_refused(self):
    # Every checkpoint file gone, their .sha256 records left: what a hand,
    # not a kill, does (rotation always keeps a newer checkpoint).
    model_dir = self._copy()
    for name in os.listdir(model_dir):
      if name.startswith("ckpt-") and not name.endswith(".sha256"):
        os.remove(os.path.join(model_dir, name))
    before = testing.snapshot(model_dir)
    with self.assertRaisesRegex(
        ValueError, r"holds the SHA-256 records of checkpoints \(ckpt-120"
        r"\.sha256, ckpt-80\.sha256, ckpt-40\.sha256\) but none of their "
        r"files; nothing was changed"):
      trainer.train(CONFIG, model_dir, echo=lambda line: None)
    self.assertEqual(testing.snapshot(model_dir), before)

  def test_half_written_saves_are_cleaned_up(self):
    model_dir = self._copy()
    os.makedirs(os.path.join(model_dir, "ckpt-160_temp", "part-00000"))
    self._resume(model_dir)
    self.assertFalse(any("_temp" in name for name in os.listdir(model_dir)))

  def test_a_kill_during_rotation_leaves_nothing_that_stops_the_resume(self):
    # Rotation deletes a checkpoint's .index, then its .data, and the save
    # then removes its .sha256 (`checkpoints.prune_digests`): a kill between
    # two of those leaves the rest behind, older than the newest checkpoint.
    cases = {
        "its .sha256 left": (".index", ".data-00000-of-00001"),
        "its .data and .sha256 left": (".index",),
    }
    for name, deleted in cases.items():
      with self.subTest(name):
        model_dir = self._copy()
        # And a record a kill cut short when ckpt-40 was saved.
        with open(os.path.join(model_dir, "ckpt-40.sha256.tmp"), "w") as f:
          f.write("{")
        left = sorted(set(f for f in os.listdir(model_dir)
                          if f.startswith("ckpt-40.")) -
                      {"ckpt-40" + suffix for suffix in deleted})
        for suffix in deleted:
          os.remove(os.path.join(model_dir, "ckpt-40" + suffix))
        # A reader (evaluate, export) beside a running training sees
        # rotation mid-way: it says nothing of the checkpoints it skips.
        self.assertEqual(checkpoints.intact_checkpoints(model_dir)[1], {})
        lines, step = self._resume(model_dir)
        self.assertEqual(step, 120)
        # The state file TensorFlow's manager rotates lists only checkpoints
        # whose files are all there.
        state = tf.train.get_checkpoint_state(model_dir)
        for path in state.all_model_checkpoint_paths:
          self.assertIsNone(checkpoints.damage(path), path)
        damaged = os.path.join(model_dir, checkpoints.DAMAGED_DIR)
        kept = ([f for d in os.listdir(damaged)
                 for f in os.listdir(os.path.join(damaged, d))]
                if os.path.isdir(damaged) else [])
        if ".data-00000-of-00001" in deleted:
          # A lone record is not a checkpoint: the next save removes it.
          self.assertEqual(kept, [])
          self.assertFalse(any(line.startswith("ckpt-40") for line in lines))
        else:
          # A checkpoint missing a file is set aside, named, never deleted.
          self.assertEqual(sorted(kept), left)
          self.assertIn("ckpt-40 is damaged: its .index file is missing",
                        lines)
        self.assertFalse(any(f.startswith("ckpt-40.")
                             for f in os.listdir(model_dir)),
                         os.listdir(model_dir))

  def test_optimisation_flags_take_effect_on_resume(self):
    model_dir = self._copy()
    self._resume(model_dir, learning_rate=0.003)
    # The one window trained after the resume from step 120.
    rates = [record["lr"] for record in metrics.read(model_dir)
             if "lr" in record and record["step"] > 120]
    self.assertEqual(rates, [0.003])
    # A resume shorter than log_steps: the outcome's training figures are
    # those of the 20 steps it trained, its last progress record's.
    outcome = trainer.train(configs.override(CONFIG, train_steps=180),
                            model_dir, echo=lambda line: None)
    last = [r for r in metrics.read(model_dir) if "loss" in r][-1]
    self.assertEqual((outcome["train_window"], outcome["train_top1"]),
                     (180 - 160, last["top1"]))
    self.assertIn("training top-1 {:.4f} over the last 20 steps".format(
        last["top1"]), train_lib.summary(outcome, CONFIG, model_dir)[0])
    # A lower --train_steps than the step reached says so.
    lines = []
    trainer.train(configs.override(CONFIG, train_steps=100), model_dir,
                echo=lines.append)
    self.assertTrue(any("the run is at step 180, at or past --train_steps=100"
                        in line for line in lines), lines)

  def test_a_changed_batch_size_is_refused_before_anything_is_written(self):
    model_dir = self._copy()
    before = testing.snapshot(model_dir)
    with self.assertRaisesRegex(ValueError, r"batch_size \(16 -> 32\)"):
      trainer.train(configs.override(CONFIG, batch_size=32), model_dir,
                  echo=lambda line: None)
    self.assertEqual(testing.snapshot(model_dir), before)

  def test_one_training_per_directory(self):
    model_dir = self._copy()
    with checkpoints.lock(model_dir):
      with self.assertRaisesRegex(ValueError, r"is in use by another training "
                                  rf"\(pid {os.getpid()} on "):
        trainer.train(CONFIG, model_dir, echo=lambda line: None)
    self._resume(model_dir)  # Released: the next one runs.

  def test_a_full_disk_stops_with_one_line_and_no_half_checkpoint(self):
    model_dir = self._copy()
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with mock.patch.object(tf.train.CheckpointManager, "save",
                           side_effect=full):
      with self.assertRaisesRegex(
          ValueError, r"could not write the checkpoint of step 160 in .*"
          r"\(No space left on device\); .*run the same command to resume"):
        trainer.train(configs.override(CONFIG, train_steps=160), model_dir,
                    echo=lambda line: None)
    self.assertEqual(checkpoints.checkpoint_prefixes(model_dir)[0],
                     os.path.join(model_dir, "ckpt-120"))

  def test_plain_mistakes_are_one_line(self):
    directory = self.create_tempdir().full_path
    a_file = os.path.join(directory, "file")
    with open(a_file, "w") as f:
      f.write("x")
    with self.assertRaisesRegex(ValueError, "is a file, not a directory"):
      trainer.train(CONFIG, a_file, echo=lambda line: None)
    with self.assertRaisesRegex(ValueError, "is not writable"):
      trainer.train(CONFIG, os.path.join(a_file, "run"), echo=lambda line: None)
    model_dir = self._copy()
    with open(os.path.join(model_dir, config_file.CONFIG_FILE), "w") as f:
      f.write("{}")
    with self.assertRaisesRegex(ValueError, r"config.json is not the "
                                "description of a training run"):
      config_file.read(model_dir)
    with open(os.path.join(model_dir, config_file.CONFIG_FILE), "w") as f:
      f.write("{not json")
    with self.assertRaisesRegex(ValueError, r"config.json is not valid JSON"):
      trainer.train(CONFIG, model_dir, echo=lambda line: None)
    # A dataset that is not there stops the run before config.json exists.
    empty = os.path.join(directory, "fresh")
    with self.assertRaisesRegex(ValueError, "is not prepared"):
      trainer.train(configs.override(CONFIG, dataset="cifar10"), empty,
                  data_dir=directory, echo=lambda line: None)
    self.assertFalse(os.path.exists(os.path.join(empty, config_file.CONFIG_FILE)))


def _record_ends(path):
  """The offsets at which each record of TFRecord file PATH ends: a
  little-endian uint64 length, its CRC (4 bytes), the data, its CRC."""
  with open(path, "rb") as f:
    data = f.read()
  ends, position = [], 0
  while position < len(data):
    position += 16 + int.from_bytes(data[position:position + 8], "little")
    ends.append(position)
  return ends


class DatasetFileTest(testing.SharedRootTestCase):
  """Issue 75, item 11: a prepared dataset's file cut short, missing,
  grown or failing its checksums is named in one line with the fix --
  before any training where its size tells -- and the run is not told to
  resume from a checkpoint it never wrote."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    counts = {"train": 64, "test": 32}
    source = os.path.join(cls.root, "source")
    testing.write_fashion_mnist_files(source, np.random.default_rng(0), counts)
    cls.data_dir = os.path.join(cls.root, "data")
    subprocess.run(testing.prepare_data_command_with_records(
        counts, "--dataset=fashion_mnist", f"--data_dir={cls.data_dir}",
        f"--source_dir={source}"), capture_output=True, timeout=600,
                   env=testing.binary_env(), check=True)

  def _copy(self, name):
    """(data_dir, the train split's file, its version directory) of a copy
    of the prepared dataset."""
    data_dir = os.path.join(self.root, name)
    shutil.copytree(self.data_dir, data_dir)
    (shard,) = glob.glob(os.path.join(data_dir, "fashion_mnist", "*",
                                      "fashion_mnist-train.tfrecord-*"))
    return data_dir, shard, os.path.dirname(shard)

  def _train(self, data_dir, model_dir):
    return testing.run_binary(
        "train", "--preset=smoke", "--dataset=fashion_mnist",
        f"--data_dir={data_dir}", f"--model_dir={model_dir}",
        "--width=0.0625", "--units=1", "--batch_size=16", "--train_steps=20",
        "--log_steps=10", "--steps_per_loop=10", "--checkpoint_steps=10",
        "--num_eval_examples=16")

  def test_a_file_of_another_size_is_named_before_training(self):
    ends = _record_ends(self._copy("measured")[1])
    self.assertLen(ends, 64)
    cuts = {  # How, and what the line says of the file.
        "at a record's end": (lambda path: os.truncate(path, ends[31]),
                              "is cut short: it holds 32 of its 64 records"),
        "inside a record": (lambda path: os.truncate(path, ends[31] + 100),
                            "is cut short: it ends inside record 33 of its "
                            f"64 ({ends[31] + 100} bytes)"),
        "inside a header": (lambda path: os.truncate(path, ends[40] + 5),
                            "is cut short: it ends inside the header of "
                            "record 42 of its 64"),
        "emptied": (lambda path: os.truncate(path, 0),
                    "is cut short: it holds 0 of its 64 records"),
        "deleted": (os.remove, "is missing"),
        "grown": (lambda path: open(path, "ab").write(b"more"),
                  "is longer than its 64 records: 4 more bytes follow them"),
    }
    for name, (cut, what) in cuts.items():
      with self.subTest(name):
        data_dir, shard, version_dir = self._copy(name.replace(" ", "_"))
        self.assertEqual(
            tfds_data.prepared_builder("fashion_mnist", data_dir,
                                       "test").name, "fashion_mnist")
        cut(shard)
        with self.assertRaises(errors.DataError) as caught:
          tfds_data.prepared_builder("fashion_mnist", data_dir, "train")
        line = str(caught.exception)
        self.assertStartsWith(line, f"dataset fashion_mnist in --data_dir="
                              f"{data_dir} is damaged: {shard} {what}; ")
        self.assertIn(f"remove {version_dir}, then ", line)
        self.assertIn(f"--dataset=fashion_mnist --data_dir={data_dir}", line)
    # The binary: its line, and no run started.
    data_dir, shard, _ = self._copy("half")
    os.truncate(shard, os.path.getsize(shard) // 2)
    model_dir = os.path.join(self.root, "run_half")
    result = self._train(data_dir, model_dir)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertStartsWith(testing.last_stderr_line(result),
                          f"error: dataset fashion_mnist in --data_dir="
                          f"{data_dir} is damaged: {shard} is cut short")
    self.assertNotIn("resume", result.stderr)
    self.assertFalse(os.path.exists(model_dir))

  def test_a_file_failing_its_checksums_is_named(self):
    data_dir, shard, version_dir = self._copy("flipped")
    ends = _record_ends(shard)
    with open(shard, "r+b") as f:  # Inside the data of record 11.
      f.seek(ends[10] + 40)
      f.write(b"\xff\xfe\xfd\xfc")
    model_dir = os.path.join(self.root, "run_flipped")
    result = self._train(data_dir, model_dir)
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertNotIn("Traceback", result.stderr)
    # TensorFlow's native log may add a line about the cache of the
    # iterator it tears down after the error (W0000 ... cache_dataset_ops):
    # the binary's own last line is the error.
    line = testing.own_stderr_lines(result)[-1]
    self.assertStartsWith(line, f"error: dataset fashion_mnist in --data_dir="
                          f"{data_dir} is damaged: {shard} fails its "
                          "checksums")
    self.assertIn(f"remove {version_dir}, then ", line)
    self.assertNotIn("resume", result.stderr)
    self.assertEqual(checkpoints.checkpoint_prefixes(model_dir), [])


if __name__ == "__main__":
  absltest.main()
