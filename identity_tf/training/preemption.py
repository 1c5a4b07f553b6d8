"""Stopping on SIGTERM or Ctrl-C with a checkpoint, on one worker or many."""

import signal

import tensorflow as tf

# Exit status of a run stopped by SIGTERM after writing its checkpoint: the
# shell's convention for "terminated by signal 15", so supervisors see an
# interrupted (not a finished, not a failed) run.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


class PreemptedError(Exception):
  """SIGTERM (or SIGINT) arrived; a checkpoint was written, the run stopped.

  `exit_code` is the shell's for that signal: 143 for SIGTERM, 130 for
  SIGINT, so that supervisors see an interrupted run.
  """

  def __init__(self, message, exit_code=None):
    super().__init__(message)
    self.exit_code = exit_code or PREEMPTED_EXIT_CODE


class Preemption:
  """SIGTERM: a checkpoint at the end of the current call, then a stop.

  On one worker, a signal handler records SIGTERM and `check` saves. Under
  `multi_worker_mirrored` with a cluster, TensorFlow's
  `PreemptionCheckpointHandler` does it: when any worker gets SIGTERM, every
  worker saves at the same step (a peer stopping alone would leave the
  others waiting in the all-reduce) and stops.
  """

  def __init__(self, strategy, manager):
    self.requested = False
    self.signal = "SIGTERM"
    self._previous = {}
    self._handler = None
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.cluster_resolver.cluster_spec().as_dict()):
      self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
          strategy.cluster_resolver, manager,
          termination_config=tf.distribute.experimental.TerminationConfig(
              exit_fn=self._saved))
    self._manager = manager

  def _saved(self):
    # The handler saved (SIGTERM here or at a peer); `check` stops.
    self.requested = "saved"

  def __enter__(self):
    # SIGINT (Ctrl-C) as SIGTERM; under the handler, SIGTERM is its own.
    signals = (signal.SIGINT,) if self._handler else (signal.SIGTERM,
                                                      signal.SIGINT)
    self._previous = {}
    try:
      for signum in signals:
        self._previous[signum] = signal.signal(signum, self._handle)
    except ValueError:  # Not the main thread: no signal handling.
      pass
    return self

  def _handle(self, signum, frame):
    del frame
    self.requested = True
    self.signal = signal.Signals(signum).name

  def check(self, step, save):
    """Raises PreemptedError after SAVE(STEP) if SIGTERM came (here or, with
    several workers, at a peer)."""
    if self._handler is not None and not self.requested:
      self._handler.save_checkpoint_if_preempted(checkpoint_number=step)
      path = self._manager.latest_checkpoint
    elif self.requested:
      path = save(step)
    if self.requested:
      raise PreemptedError(
          f"stopped by {self.signal} at step {step}; wrote checkpoint "
          f"{path}; run the same command again to resume",
          exit_code=128 + signal.Signals[self.signal].value)

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
