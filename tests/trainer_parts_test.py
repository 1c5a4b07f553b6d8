"""The parts of the training loop that a whole training cannot reach
cheaply: the parameter-server merge of the step's outputs, a progress
line's speed around an evaluation, and the save that fails half-way (a full
disk)."""

import errno
import os
import time
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf.training import checkpoints
from identity_tf.training import diagnostics
from identity_tf.training import trainer


def _output(sums, peaks, first_nonfinite=(-1, -1)):
  return {"sums": np.array(sums, np.float64), "peaks": np.array(peaks),
          "first_nonfinite": np.array(first_nonfinite)}


class MergeOutputsTest(absltest.TestCase):
  """Under parameter_server each scheduled closure runs some of the steps;
  the merged dict must be the one a single closure running all of them
  would have returned."""

  def test_sums_add_and_peaks_take_the_largest(self):
    # Three closures of two steps; per step [loss, correct, examples] and
    # peaks [gradient norm, update ratio, one activation RMS].
    steps = [([2.0, 10, 64], [1.5, 0.01, 3.0]), ([1.8, 12, 64], [1.1, 0.02, 2.0]),
             ([1.6, 20, 64], [0.9, 0.05, 2.5]), ([1.2, 30, 64], [2.5, 0.01, 1.0]),
             ([1.0, 31, 64], [0.7, 0.03, 4.0]), ([0.9, 40, 64], [0.8, 0.01, 1.5])]
    closures = [_output(np.sum([s for s, _ in steps[i:i + 2]], axis=0),
                        np.max([p for _, p in steps[i:i + 2]], axis=0))
                for i in range(0, 6, 2)]
    merged = trainer.merge_outputs(closures)
    np.testing.assert_allclose(merged["sums"], [8.5, 143, 384])
    np.testing.assert_allclose(merged["peaks"], [2.5, 0.05, 4.0])
    np.testing.assert_array_equal(merged["first_nonfinite"], [-1, -1])

  def test_the_earliest_non_finite_step_wins_whatever_the_closure_order(self):
    # Closures may finish out of order: the report is the earliest step.
    merged = trainer.merge_outputs([
        _output([1, 1, 1], [1, 1, np.nan], (17, 0)),
        _output([1, 1, 1], [1, 1, 1]),
        _output([1, 1, 1], [np.inf, 1, 1], (12, 1)),
    ])
    np.testing.assert_array_equal(merged["first_nonfinite"], [12, 1])
    # A NaN peak stays NaN: the progress line shows it.
    self.assertTrue(np.isnan(merged["peaks"][2]))


class WindowTest(absltest.TestCase):
  """A progress line's speed and ETA count the time spent in steps, not an
  evaluation or a checkpoint between two lines."""

  def test_speed_is_images_over_step_time_whatever_came_between(self):
    window = diagnostics.Window(["stage1"])
    # 69 steps of 128 images in 20.7 s, then an evaluation (whatever it
    # takes), then 31 steps in 9.3 s: 12 800 images in 30 s.
    window.add(_output([69.0, 60, 69 * 128], [1.0, 0.1, 2.0]), 20.7)
    time.sleep(0.2)  # An evaluation: not training time.
    window.add(_output([31.0, 30, 31 * 128], [1.0, 0.1, 2.0]), 9.3)
    record = window.record(step=500, train_steps=4500, learning_rate=0.1,
                           batch_size=128)
    self.assertAlmostEqual(record["images_per_second"], 12800 / 30.0,
                           places=1)
    # 4000 steps left at 100 steps per 30 s: 1200 s.
    self.assertEqual(record["eta"], "0:20:00")
    self.assertAlmostEqual(record["loss"], 100 / 12800, places=5)
    # A new window starts empty.
    self.assertEqual(window.seconds, 0.0)


class FailedSaveTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.directory = self.create_tempdir().full_path
    self.variable = tf.Variable(np.arange(1000, dtype=np.float32))
    self.manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=self.variable), self.directory,
        max_to_keep=3)
    checkpoints.save(self.manager, 1, self.directory)
    self.before = self._files()

  def _files(self):
    contents = {}
    for name in sorted(os.listdir(self.directory)):
      with open(os.path.join(self.directory, name), "rb") as f:
        contents[name] = f.read()
    return contents

  def _check_failed_save(self, error):
    message = str(error)
    self.assertNotIn("\n", message)
    self.assertIn("checkpoint of step 2", message)
    self.assertIn("No space left on device", message)
    self.assertIn(os.path.join(self.directory, "ckpt-1"), message)
    # Nothing of step 2 is left and step 1 is byte for byte as it was (the
    # state file aside, which a resume rewrites from the files).
    after = self._files()
    self.assertEqual([n for n in after if n.startswith("ckpt-")],
                     [n for n in self.before if n.startswith("ckpt-")])
    for name in after:
      if name.startswith("ckpt-"):
        self.assertEqual(after[name], self.before[name], name)
    self.assertEqual(checkpoints.find_checkpoint(self.directory),
                     os.path.join(self.directory, "ckpt-1"))

  def test_a_save_that_fails_while_writing_leaves_the_previous_one(self):
    def disk_full(checkpoint_number):
      # Half a checkpoint: the index is written, the data is not.
      with open(os.path.join(self.directory,
                             f"ckpt-{checkpoint_number}.index"), "wb") as f:
        f.write(b"partial")
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    self.variable.assign(self.variable * 2)
    with mock.patch.object(self.manager, "save", disk_full):
      with self.assertRaises(ValueError) as raised:
        checkpoints.save(self.manager, 2, self.directory)
    self._check_failed_save(raised.exception)

  def test_a_save_that_fails_on_its_digest_removes_the_whole_checkpoint(self):
    # The manager has written (and listed) step 2; its digest cannot be.
    self.variable.assign(self.variable * 2)
    with mock.patch.object(
        checkpoints, "write_digest",
        side_effect=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
      with self.assertRaises(ValueError) as raised:
        checkpoints.save(self.manager, 2, self.directory)
    self._check_failed_save(raised.exception)
    # And the weights a resume reads are step 1's.
    restored = tf.Variable(np.zeros(1000, np.float32))
    tf.train.Checkpoint(weights=restored).read(
        checkpoints.find_checkpoint(self.directory)).expect_partial()
    np.testing.assert_array_equal(restored.numpy(),
                                  np.arange(1000, dtype=np.float32))


if __name__ == "__main__":
  absltest.main()
