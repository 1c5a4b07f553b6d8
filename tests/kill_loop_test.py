"""Kill a training at random moments around its saves; it always comes back.

A tiny --deterministic run (a checkpoint every 20 steps) is killed with
SIGKILL again and again, each time at a random moment just after a progress
line or a save, and resumed by running the same command. After every kill
the newest intact checkpoint is at most one checkpoint interval behind the
last step the run reported, and the next session starts from it: it says
so, its "start" record in metrics.jsonl is at that step, and its first
progress line one --log_steps after it. At the end the weights are
bit-identical to an uninterrupted run's (which alone would not show that
any checkpoint was used: a run trained again from step 0 ends with the
same weights).
KILL_LOOP_ITERATIONS (default 5) sets how many kills; docs/training.md
records a run of 50.
"""

import os
import random
import re
import signal
import threading
import time

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf.training import checkpoints
import testing

ITERATIONS = int(os.environ.get("KILL_LOOP_ITERATIONS", "5"))
CHECKPOINT_STEPS = 20
# A run advances about 16 steps per kill on average (a kill comes after 1-12
# progress lines or saves, and up to one interval is redone), so 30 steps a
# kill leaves room for every one of them before the run finishes. The floor
# is for a loaded machine: this network runs about 130 steps a second, and
# with other tests on both cores the test has seen its last kill's lines
# late enough for a resumed run to finish 320 steps first (CI, measured).
TRAIN_STEPS = max(2000, 30 * ITERATIONS)
FLAGS = ["--preset=smoke", "--width=0.0625", "--units=1", "--batch_size=16",
         f"--train_steps={TRAIN_STEPS}", f"--checkpoint_steps={CHECKPOINT_STEPS}",
         "--log_steps=5", "--steps_per_loop=5", "--keep_checkpoints=3",
         "--noeval_at_end", "--deterministic"]
# The run that finishes after the kills stops FINAL_MARGIN steps past the
# newest checkpoint (the smoke preset's rate is constant: the budget
# changes no step), and the uninterrupted reference trains to the same
# step in this process; both save and log once. How often a run saves does
# not change its steps (the same steps_per_loop chunks, the same input
# stream).
FINAL_MARGIN = 40


def _quiet(steps):
  return [f"--train_steps={steps}", f"--checkpoint_steps={steps}",
          f"--log_steps={steps}"]


def _tensors(model_dir):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name)
          for name, dtype in reader.get_variable_to_dtype_map().items()
          if dtype != tf.variant and not name.startswith(
              ("save_counter", "_CHECKPOINT"))}


class KillLoopTest(testing.ProcessTestCase):

  def _reference(self, steps):
    """The weights of an uninterrupted run of FLAGS to STEPS, trained in
    this process (`testing.train_in_process`: what bin/train's main does)."""
    reference = os.path.join(self.create_tempdir().full_path, "reference")
    status, stderr, _ = testing.train_in_process(
        f"--model_dir={reference}", *FLAGS, *_quiet(steps))
    self.assertEqual(status, 0, stderr)
    return _tensors(reference)

  def _run_until_killed(self, model_dir, rng):
    """Starts the training, kills it at a random moment; returns (its
    stderr lines, the steps of its progress lines, None or, if it ended
    before the kill, its exit status and last line)."""
    process = self.start_binary("train", f"--model_dir={model_dir}", *FLAGS)
    lines = []
    reader = threading.Thread(
        target=lambda: lines.extend(iter(process.stderr.readline, "")),
        daemon=True)
    reader.start()
    # A random number of progress lines or saves, then a random fraction of
    # a step: most kills land in or right next to a checkpoint write.
    events = rng.randint(1, 12)
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
      seen = [l for l in list(lines)
              if re.match(r"step \d+/|saved checkpoint", l)]
      if len(seen) >= events:
        break
      time.sleep(0.01)
    time.sleep(rng.uniform(0, 0.05))
    finished = process.poll() is not None
    if not finished:
      process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    reader.join(timeout=10)
    if finished:
      last = [l.strip() for l in lines if l.strip()][-1:]
      finished = f"exit status {process.returncode}, last line {last}"
    # The steps the terminal showed: the promise is about what the user saw,
    # and a line echoed just before the kill may not be in metrics.jsonl.
    steps = [int(m.group(1)) for m in
             (re.match(r"step (\d+)/", l) for l in lines) if m]
    return lines, steps, finished or None

  def test_never_loses_more_than_one_interval(self):
    rng = random.Random(2017)
    model_dir = os.path.join(self.create_tempdir().full_path, "run")
    kills = 0
    resumed_from = [0]  # The step each session must start from.
    newest_path = None  # And the checkpoint it must say it resumed from.
    while kills < ITERATIONS:
      lines, steps, finished = self._run_until_killed(model_dir, rng)
      self.assertIsNone(finished, f"the run ended by itself after {kills} of "
                        f"{ITERATIONS} kills ({finished}); if it finished "
                        "training, raise TRAIN_STEPS")
      # Its first progress line is the first --log_steps (5) after the
      # checkpoint it resumed from.
      self.assertEqual(steps[:1], [resumed_from[-1] + 5],
                       f"session {kills + 1} should have resumed from step "
                       f"{resumed_from[-1]}")
      if newest_path:
        self.assertIn(f"resumed from {newest_path} at step "
                      f"{resumed_from[-1]}\n", "".join(lines))
      reported = max(steps)
      kills += 1
      intact, damaged = checkpoints.intact_checkpoints(model_dir)
      newest = checkpoints.checkpoint_step(intact[0]) if intact else 0
      newest_path = intact[0] if intact else None
      resumed_from.append(newest)
      self.assertGreaterEqual(newest, reported - CHECKPOINT_STEPS,
                              f"kill {kills}: reported step {reported}, "
                              f"newest intact checkpoint {newest}, damaged "
                              f"{sorted(damaged)}")
      print(f"kill {kills}: reported {reported}, resumes from {newest}"
            + (f", damaged {sorted(map(os.path.basename, damaged))}"
               if damaged else ""))
    final_step = resumed_from[-1] + FINAL_MARGIN
    testing.run_binary("train", f"--model_dir={model_dir}", *FLAGS,
                       *_quiet(final_step), check=True)
    # Each session's "start" record in metrics.jsonl is the newest intact
    # checkpoint after the kill before it; its first progress record (if it
    # wrote one before its kill) is one --log_steps (5) on, the last
    # session's (saving and logging once) at its end.
    sessions = testing.sessions(model_dir)
    self.assertEqual([start for start, _ in sessions], resumed_from)
    expected_first = [start + 5 for start in resumed_from[:-1]] + [final_step]
    for (_, first), expected in zip(sessions, expected_first):
      self.assertIn(first, (None, expected), sessions)
    self.assertEqual(sessions[-1][1], final_step)
    final, reference = _tensors(model_dir), self._reference(final_step)
    self.assertEqual(sorted(final), sorted(reference))
    for name, value in reference.items():
      self.assertTrue(np.array_equal(final[name], value),
                      f"{name} differs from the uninterrupted run")


if __name__ == "__main__":
  absltest.main()
