"""--deterministic: bit-identical reruns and resumes on the same machine.

Two runs of one configuration, and a run stopped and resumed against one
that was not, are compared tensor by tensor (every variable of the last
checkpoint: weights, optimizer slots, the step, the weight average) and
record by record (metrics.jsonl without its clock times and speeds). An op
TensorFlow cannot run deterministically stops the run with one line.
"""

import json
import os
from unittest import mock

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import errors
from identity_tf.data import tfds_data
from identity_tf.training import config_file
from identity_tf.training import metrics
from identity_tf.training import run as run_lib
from identity_tf.training import trainer

# What a record holds that depends on the clock, not on the computation.
_CLOCK = ("time", "images_per_second", "eta", "machine")


def _config(**overrides):
  return configs.from_preset("smoke", **{
      "width": 0.0625, "units": (1,), "batch_size": 16, "train_steps": 20,
      "checkpoint_steps": 10, "log_steps": 5, "steps_per_loop": 5,
      "eval_steps": 10, "num_eval_examples": 64, "ema_decay": 0.9,
      "deterministic": True, **overrides})


def _tensors(model_dir):
  """{name: array} of every tensor of MODEL_DIR's latest checkpoint but
  the input iterator's state (a variant, compared through what the resumed
  run computes) and the object graph (metadata that names the optimizer
  as Keras numbered it in this process: "sgd_2")."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name)
          for name, dtype in reader.get_variable_to_dtype_map().items()
          if dtype != tf.variant and name != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def _records(model_dir, after=0):
  """metrics.jsonl's training and evaluation records after step AFTER,
  without what depends on the clock, by step."""
  found = {}
  for record in metrics.read(model_dir):
    if record["step"] <= after or not ("train_steps" in record or
                                       "eval" in record):
      continue
    kind = "train" if "train_steps" in record else "eval"
    found[(kind, record["step"])] = {k: v for k, v in record.items()
                                     if k not in _CLOCK}
  return found


class DeterminismTest(absltest.TestCase):

  def _train(self, config, model_dir=None):
    model_dir = model_dir or self.create_tempdir().full_path
    trainer.train(config, model_dir)
    return model_dir

  def assert_same_tensors(self, first, second):
    self.assertCountEqual(first, second)
    self.assertGreater(len(first), 10)
    for name, value in first.items():
      value, other = np.asarray(value), np.asarray(second[name])
      self.assertEqual((value.dtype, value.shape), (other.dtype, other.shape),
                       name)
      # Bit for bit: NaN-safe and exact.
      self.assertEqual(value.tobytes(), other.tobytes(), name)

  def test_two_runs_and_a_resumed_one_are_bit_identical(self):
    config = _config()
    first, second = self._train(config), self._train(config)
    self.assert_same_tensors(_tensors(first), _tensors(second))
    self.assertEqual(_records(first), _records(second))
    self.assertLen(_records(first), 6)  # Four windows, two evaluations.
    # The weights moved: identity is not that of untouched weights.
    start, end = _tensors(self._train(_config(train_steps=1))), _tensors(first)
    moved = [name for name, value in start.items()
             if name.startswith("optimizer/_trainable_variables/") and
             not np.array_equal(value, end[name])]
    self.assertGreater(len(moved), 3)
    # Stopped at step 10 and resumed: the same tensors at step 20 and the
    # same records after the stop as the run that went through.
    resumed = self._train(_config(train_steps=10))
    self._train(config, resumed)
    # (The checkpoint manager's count of the saves aside: it counts what
    # each session wrote, not what the run computed.)
    def computed(tensors):
      return {k: v for k, v in tensors.items() if not k.startswith(
          "save_counter/")}
    self.assert_same_tensors(computed(_tensors(first)),
                             computed(_tensors(resumed)))
    self.assertEqual(_records(first, after=10), _records(resumed, after=10))
    # What makes it so: op determinism on, Grappler off
    # (`trainer.make_deterministic` says why; the networks here are too
    # small to show its drift), and the input pipeline keeping its order
    # (`tf.data.Options.deterministic`), for this run's stream.
    from tensorflow.python.framework import config as tf_config  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
    self.assertTrue(tf_config.is_op_determinism_enabled())
    self.assertIs(tf.config.optimizer.get_experimental_options().get(
        "disable_meta_optimizer"), True)
    for deterministic in (True, False):
      stream = trainer.Trainer(
          run_lib.prepare(configs.override(config,
                                           deterministic=deterministic),
                          tfds_data.dataset_info("synthetic"), first),
          tf.distribute.get_strategy())._input_fn(0)(
              tf.distribute.InputContext())
      self.assertEqual(stream.options().deterministic, deterministic)
    # config.json says the run was deterministic.
    with open(config_file.path(first)) as f:
      self.assertTrue(json.load(f)["config"]["deterministic"])

  def test_an_op_without_a_deterministic_kernel_is_one_line(self):
    # Every op of the CPU path has a deterministic kernel; on a GPU some do
    # not, and TensorFlow raises as a step runs. That error (its text as
    # TensorFlow 2.21 gives it for a segment reduction) stops the run with
    # one line naming the op and the flag; without the flag it is not ours
    # to reword.
    text = ("Deterministic GPU implementation of unsorted segment "
            "reduction op not available.\n\t [[{{node "
            "model/stage1/UnsortedSegmentSum}}]]")
    def refuse(self, num_steps):
      del self, num_steps
      raise tf.errors.UnimplementedError(None, None, text)
    for deterministic in (True, False):
      model_dir = self.create_tempdir().full_path
      with mock.patch.object(trainer.Trainer, "run_steps", refuse):
        with self.assertRaises(ValueError if deterministic else
                               tf.errors.UnimplementedError) as caught:
          trainer.train(_config(deterministic=deterministic), model_dir)
      if deterministic:
        self.assertEqual(
            str(caught.exception),
            "--deterministic: op model/stage1/UnsortedSegmentSum has no "
            "deterministic implementation here (Deterministic GPU "
            "implementation of unsorted segment reduction op not "
            "available.); run without --deterministic, or replace the op")


if __name__ == "__main__":
  absltest.main()
