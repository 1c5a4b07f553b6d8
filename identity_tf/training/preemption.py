"""Stopping on SIGTERM or Ctrl-C with a checkpoint, on one worker or many."""

import signal

import tensorflow as tf

# Exit status of a run stopped by SIGTERM after writing its checkpoint: the
# shell's convention for "terminated by signal 15", so supervisors see an
# interrupted (not a finished, not a failed) run.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM

# A signal is seen between the training loop's tf.function calls only, and
# schedulers send SIGKILL about 30 s after SIGTERM (Kubernetes' default
# terminationGracePeriodSeconds, Compute Engine's preemption notice): a
# call is kept to about this many seconds, leaving the rest for the
# checkpoint.
CALL_SECONDS = 10.0


def steps_per_call(seconds_per_step, most):
  """The steps of a call that ends within CALL_SECONDS at SECONDS_PER_STEP
  (the last call's pace): at least 1, at most MOST (--steps_per_loop)."""
  if seconds_per_step <= 0:
    return most
  return max(1, min(most, int(CALL_SECONDS / seconds_per_step)))


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

  `paced`: whether the loop keeps its calls short (`steps_per_call`), so
  that the stop comes within CALL_SECONDS of the signal, or within one step
  where a step takes longer. Workers of a cluster run calls of
  --steps_per_loop steps: theirs must be equally long (the steps all-reduce
  together), and parameter-server closures run on other machines.

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
    self.paced = self._handler is None and not isinstance(
        strategy, tf.distribute.experimental.ParameterServerStrategy)

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
