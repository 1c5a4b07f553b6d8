"""Training: one tf.distribute loop for the paper's networks.

`train(config, model_dir)` prepares the run once (`run.prepare`), takes the
model_dir (`checkpoints.lock`), restores the newest intact checkpoint and
runs `_loop`, which reads top to bottom: run steps, report, save, evaluate.
What the loop does with the model, the optimizer, the input and the
checkpoints is `Trainer`'s: one custom loop serves every strategy
(`default`, `mirrored`, `multi_worker_mirrored`, `tpu`, `parameter_server`;
`distribute`), a `tf.function` of up to `steps_per_loop` SGD steps
(`step.make_train_step`; fewer when they would take over
`preemption.CALL_SECONDS`), scheduled through a `ClusterCoordinator` under
`parameter_server` (Keras 3's `fit` does not support that strategy). Every
record goes through one `metrics.MetricsWriter`; SIGTERM and Ctrl-C write a
checkpoint and stop (`preemption`); a NaN stops the run naming where it
began (`diagnostics`).
"""

import contextlib
import datetime
import functools
import json
import os
import re
import time

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf import machine
from identity_tf import model as model_lib
from identity_tf.data import pipeline
from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import config_file
from identity_tf.training import diagnostics
from identity_tf.training import distribute
from identity_tf.training import evaluation
from identity_tf.training import metrics
from identity_tf.training import optimization
from identity_tf.training import preemption
from identity_tf.training import run as run_lib
from identity_tf.training import step as step_lib

# The checkpoint's name of `Trainer.last_evaluated_step`.
LAST_EVALUATED = "last_evaluated_step"



class Trainer:
  """A run's model, optimizer, input and checkpoints, and what the loop
  does with them: `restore`, `run_steps`, `save`, `evaluate`.

  Built under STRATEGY's scope from RUN (`run.Run`). DATASET_FN replaces
  the input pipeline (`train`). COORDINATOR: the ClusterCoordinator of a
  parameter_server run, else None.
  """

  def __init__(self, run, strategy, *, chief=True, coordinator=None,
               dataset_fn=None, peer_wait=checkpoints.CHIEF_CHECKPOINT_WAIT):
    self.run = run
    # How long a worker that is not the chief waits for the chief's last
    # checkpoint (`finish`).
    self._peer_wait = peer_wait
    self.config = run.config
    self.chief = chief
    self.strategy = strategy
    self._coordinator = coordinator
    self._dataset_fn = dataset_fn
    with strategy.scope():
      self.model = model_lib.build_model(**run.model_arguments())
      self.optimizer = optimization.build_optimizer(run)
      self.optimizer.build(self.model.trainable_variables)
      # What evaluations and exports use with --ema_decay (None: off).
      self.average = (optimization.WeightAverage(
          optimization.averaged_variables(self.model), run.config.ema_decay)
                      if run.config.ema_decay else None)
    self.watched = diagnostics.watched_activations(self.model)
    self._train_steps = step_lib.make_train_step(
        strategy, self.model, self.optimizer, run.config, self.average)
    # Every worker writes checkpoints (MultiWorkerMirroredStrategy wants all
    # of them to save), but only the chief's go to model_dir.
    task_type, task_id = distribute.cluster_task(run.config.strategy)
    self.checkpoint_dir = run.model_dir if chief else os.path.join(
        run.model_dir, f".{task_type}{task_id}_tmp")
    # The step of the last evaluation made before a checkpoint was written,
    # saved in it: on resuming, whether the checkpoint's step still needs
    # its evaluation (`_loop`). -1: none (or a checkpoint from before it was
    # saved).
    self.last_evaluated_step = tf.Variable(-1, dtype=tf.int64,
                                           trainable=False)
    self.iterator = self.manager = self._evaluator = self._validator = None

  @property
  def step(self):
    """The global step: the optimizer's iterations."""
    return int(self.optimizer.iterations.numpy())

  @property
  def loss_scale(self):
    """mixed_float16's dynamic loss scale; None without loss scaling."""
    if not isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer):
      return None
    return float(keras.ops.convert_to_numpy(self.optimizer.dynamic_scale))

  @property
  def learning_rate(self):
    return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))

  # -------------------------------------------------------------------------
  # Input and checkpoints.

  def _input_fn(self, seed, start_step=0):
    """The training dataset_fn, starting START_STEP global steps in.

    The pipeline's stream is a deterministic function of (seed, position),
    so starting it at a step replays exactly what an uninterrupted run reads
    from there on (free for in-memory datasets).
    """
    run, config = self.run, self.config

    def dataset_fn(input_context):
      batch = input_context.get_per_replica_batch_size(config.batch_size)
      return pipeline.build_dataset(
          config.dataset, run.dataset.train_split, batch, training=True,
          data_dir=run.data_dir, seed=seed,
          deterministic=config.deterministic, input_context=input_context,
          num_examples=config.num_train_examples,
          preprocessing=run.preprocessing, start_step=start_step,
          validation_examples=config.validation_examples)
    return dataset_fn

  def _make_iterator(self, skip_steps):
    """The distributed input iterator, SKIP_STEPS global steps in."""
    strategy, seed = self.strategy, self.config.seed
    fn = self._dataset_fn
    if self._coordinator is not None:
      # No replay under parameter_server: after a restart the workers start
      # a fresh stream (seeded by the step) instead.
      if fn is None:
        fn = self._input_fn(seed + skip_steps)
      return iter(self._coordinator.create_per_worker_dataset(
          lambda: strategy.distribute_datasets_from_function(fn)))
    if fn is None:
      fn = self._input_fn(seed, start_step=skip_steps)
    return iter(strategy.distribute_datasets_from_function(fn))

  def _optional_trackables(self):
    """What a checkpoint may lack and a run then starts afresh: the step of
    the last evaluation (-1), the weight average (from the resumed
    weights)."""
    trackables = {LAST_EVALUATED: self.last_evaluated_step}
    if self.average is not None:
      trackables[optimization.WEIGHT_AVERAGE] = self.average
    return trackables

  def _checkpoint(self, optional=True):
    """The run's checkpoint: model, optimizer, with OPTIONAL
    `_optional_trackables` and, where tf.data can save it (one replica per
    process), the input iterator."""
    trackables = dict(model=self.model, optimizer=self.optimizer)
    if optional:
      trackables.update(self._optional_trackables())
    if isinstance(self.iterator, tf.data.Iterator):
      trackables["iterator"] = self.iterator
    return tf.train.Checkpoint(**trackables)

  def restore(self, path):
    """Restores checkpoint PATH (None: a new run) and positions the input.

    The input position is restored from the checkpoint where it holds one
    that fits this pipeline. Otherwise -- several replicas, or an iterator
    that no longer fits -- the pipeline is started at the restored step
    (`build_dataset(start_step=...)`), which yields exactly what the
    uninterrupted stream would.
    """
    self.iterator = self._make_iterator(0)
    if path is not None:  # One line, nothing restored, if it does not fit.
      checkpoints.check_network(self.model, path, self.run)
    if path is not None and not self._restore_with_iterator(path):
      self.iterator = self._make_iterator(checkpoints.checkpoint_step(path))
      tf.train.Checkpoint(model=self.model, optimizer=self.optimizer).restore(
          path).expect_partial().assert_existing_objects_matched()
    if path is not None:
      # Apart, and without the assertion: a checkpoint written before the
      # step was saved has none, and the variable keeps -1 (`_loop` then
      # evaluates the step if it is an evaluation step); one written
      # without --ema_decay has no average, which then starts here.
      tf.train.Checkpoint(**self._optional_trackables()).read(
          path).expect_partial()
    if path is not None and not isinstance(
        self.optimizer._learning_rate,  # pylint: disable=protected-access
        keras.optimizers.schedules.LearningRateSchedule):
      # A constant rate is a variable of the optimizer, so the checkpoint
      # holds the old one: the configuration's takes effect (schedules are
      # computed from the step and take effect anyway).
      self.optimizer.learning_rate = self.config.learning_rate
    self.manager = tf.train.CheckpointManager(
        self._checkpoint(), self.checkpoint_dir,
        max_to_keep=self.config.keep_checkpoints,
        checkpoint_name=checkpoints.CHECKPOINT_PREFIX)

  def _restore_with_iterator(self, path):
    """Whether PATH's model, optimizer and input position were restored."""
    saved_iterator = any(name.startswith("iterator/")
                         for name, _ in tf.train.list_variables(path))
    if not (saved_iterator and isinstance(self.iterator, tf.data.Iterator)):
      return False
    try:
      # expect_partial: when the iterator does not fit, the values left
      # unrestored are not worth TensorFlow's warning -- the fallback below
      # restores model and optimizer again and says why.
      self._checkpoint(optional=False).restore(path).expect_partial(
      ).assert_existing_objects_matched()
      return True
    except tf.errors.DataLossError as e:
      # Bytes that fail their checksum: a damaged checkpoint (with its
      # .sha256 record it would have been caught before), not a pipeline
      # that changed.
      raise checkpoints.DamagedCheckpointError(
          path, f"its saved input position fails its checksum "
          f"({str(e).splitlines()[0][-80:]})") from None
    except tf.errors.OpError as e:
      logging.warning(
          "the input position in %s does not fit this input pipeline (%s); "
          "replaying the input instead", path, str(e).splitlines()[0])
      return False

  def save(self, step):
    """Writes the checkpoint of STEP; its path. NonFiniteLossError if the
    weights are not finite (they would replace a good checkpoint)."""
    if not diagnostics.all_finite(self.model.trainable_weights):
      raise diagnostics.NonFiniteLossError(
          f"the weights became NaN or infinite by step {step}; "
          f"{checkpoints.last_written(self.manager)}", step=step)
    return checkpoints.save(self.manager, step, self.checkpoint_dir)

  def finish(self):
    """A worker's own checkpoints (not the chief's) are scratch once the
    chief's of the same step is in model_dir (`discard_worker_copy`)."""
    if not self.chief:
      checkpoints.discard_worker_copy(self.checkpoint_dir, self.run.model_dir,
                                      wait=self._peer_wait)

  # -------------------------------------------------------------------------
  # Steps, evaluation and what a progress line reports.

  def run_steps(self, num_steps):
    """Runs NUM_STEPS steps; returns `step.make_train_step`'s dict as NumPy."""
    if self._coordinator is None:
      return tf.nest.map_structure(lambda value: value.numpy(),
                                   self._train_steps(self.iterator,
                                                     tf.constant(num_steps)))
    # Asynchronous: closures of at most steps_per_loop steps on whichever
    # worker is free; each step updates the parameter servers on its own.
    results, remaining = [], num_steps
    while remaining:
      n = min(remaining, self.config.steps_per_loop)
      results.append(self._coordinator.schedule(
          self._train_steps, args=(self.iterator, tf.constant(n))))
      remaining -= n
    self._coordinator.join()
    return merge_outputs([r.fetch() for r in results])

  def _evaluated_weights(self):
    """A block in which the model holds what is evaluated and exported:
    the weight average with --ema_decay, else the weights."""
    if self.average is None:
      return contextlib.nullcontext()
    return self.average.swapped_into(
        optimization.averaged_variables(self.model))

  def evaluate(self):
    """Loss and top-1/top-5 of the current weights (their average with
    --ema_decay) on the evaluation split (`evaluation.make_evaluator`; its
    pipeline is built once)."""
    if self._evaluator is None:
      config = self.config
      self._evaluator = evaluation.make_evaluator(
          self.model, config.dataset, self.run.dataset,
          self.run.preprocessing, data_dir=self.run.data_dir,
          batch_size=config.eval_batch_size,
          num_examples=config.num_eval_examples)
    with self._evaluated_weights():
      return self._evaluator()

  def evaluate_validation(self):
    """Loss and top-1/top-5 of the current weights (their average with
    --ema_decay) on the --validation_examples held out of the training
    split (their pipeline is built once)."""
    if self._validator is None:
      config = self.config
      self._validator = evaluation.make_evaluator(
          self.model, config.dataset, self.run.dataset,
          self.run.preprocessing, data_dir=self.run.data_dir,
          batch_size=config.eval_batch_size,
          split=self.run.dataset.train_split,
          validation_examples=config.validation_examples, held_out=True)
    with self._evaluated_weights():
      return self._validator()

  def evaluate_training_set(self):
    """Loss and top-1/top-5 of the current weights (their average with
    --ema_decay) on the whole training split (the run's
    --num_train_examples of it, less the --validation_examples), each
    image once, without augmentation: what training has fitted, beside the
    held-out scores."""
    config = self.config
    evaluate = evaluation.make_evaluator(
        self.model, config.dataset, self.run.dataset, self.run.preprocessing,
        data_dir=self.run.data_dir, batch_size=config.eval_batch_size,
        num_examples=config.num_train_examples,
        split=self.run.dataset.train_split,
        validation_examples=config.validation_examples)
    with self._evaluated_weights():
      return evaluate()

  def scalars(self, record):
    """The TensorBoard scalars of progress record RECORD."""
    return {
        "loss": record["loss"], "top1": record["top1"],
        "learning_rate": record["lr"],
        "images_per_second": record["images_per_second"],
        "weight_decay_loss": float(optimization.l2_penalty(
            self.model, self.config.weight_decay,
            self.config.weight_decay_scope)),
        "grad_norm": record["grad_norm"],
        "update_ratio": record["update_ratio"],
        **({"loss_scale": record["loss_scale"]} if "loss_scale" in record
           else {}),
        **{f"activation_rms/{name}": value for name, value in
           record["activation_rms"].items()},
        **{f"residual_branch_norm/stage{stage}": norm for stage, norm in
           sorted(diagnostics.residual_branch_norms(self.model).items())}}


def merge_outputs(outputs):
  """One `make_train_step` dict of the closures of a parameter-server call
  (NumPy): each value combined as `step.VALUES` says, the first non-finite
  step the earliest (`step.merge`)."""
  return functools.reduce(lambda a, b: step_lib.merge(a, b, np), outputs)



def train(config, model_dir, *, data_dir=None, strategy=None, tpu=None,
          cluster_timeout=600.0, echo=lambda line: None, dataset_fn=None,
          verbose=False):
  """Trains CONFIG in MODEL_DIR, resuming from its latest checkpoint.

  Args:
    config: a validated `configs.Config`.
    model_dir: where config.json, checkpoints and summaries go.
    data_dir: TFDS data directory.
    strategy: a tf.distribute strategy (default: `distribute.create_strategy`
      of config.strategy, TPU, and CLUSTER_TIMEOUT: the seconds a
      multi-worker cluster may take to form).
    echo: receives the progress lines (print by default).
    verbose: ECHO receives the whole configuration, and every progress line
      its divergence diagnostics (otherwise only abnormal ones:
      `diagnostics.AbnormalSigns`).
    dataset_fn: replaces the input pipeline (experiments on data of your
      own): input_context -> tf.data.Dataset of per-replica (images, labels)
      batches, repeated forever; it must be deterministic in its position
      for exact resumes under several replicas.

  Progress: every config.log_steps steps one record: step, loss and top-1
  over the last steps, learning rate, images/s, and what shows a
  divergence coming -- the largest global gradient norm, the largest
  update/weight ratio and the largest RMS of each stage's activations over
  those steps (`step.make_train_step`); every config.eval_steps steps, and
  at the end, one with the evaluation (with --validation_examples: of the
  held-out training examples, and of the evaluation split once, at the
  end). Each goes to MODEL_DIR/metrics.jsonl
  whole, to TensorBoard, and to ECHO as one line a person reads
  (`metrics.progress_line`).

  Returns:
    {"step", "train_loss", "train_top1" (last logged window), "train_window"
    (its steps), "eval": the last evaluation (of the evaluation split) or
    None, "validation": the last of the held-out training examples (with
    --validation_examples), "model_dir"}.

  The run resumes from the newest intact checkpoint in MODEL_DIR, found
  from the files (`checkpoints.resume_point`): damaged newer ones are moved
  to MODEL_DIR/damaged/ and named, and a directory whose checkpoints are all
  damaged is refused rather than trained from step 0. One training at a
  time holds MODEL_DIR (`checkpoints.lock`); config.json is written once
  the run has been restored and can start.

  Raises:
    diagnostics.NonFiniteLossError: the loss became NaN/Inf; the latest
      checkpoint was written before it.
    preemption.PreemptedError: SIGTERM or SIGINT; a checkpoint of the
      current step was written.
    ValueError / tfds_data.DatasetNotReadyError: bad configuration, or a
      model_dir that cannot hold the run (one line saying why).
  """
  # Multi-worker strategies must exist before TensorFlow starts its runtime.
  if strategy is None:
    strategy = distribute.create_strategy(config.strategy, tpu,
                                          timeout=cluster_timeout, echo=echo)
  if config.deterministic:
    make_deterministic()
  keras.utils.set_random_seed(config.seed)
  coordinator = None
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
        strategy)
  # DATASET_FN replaces the data: only the dataset's metadata is needed; a
  # dataset that is not prepared stops the run here, before anything is
  # written to MODEL_DIR.
  info = (tfds_data.dataset_info(config.dataset, data_dir) if dataset_fn
          else tfds_data.prepared_info(config.dataset, data_dir))
  run = run_lib.prepare(config, info, model_dir, data_dir,
                        replicas=strategy.num_replicas_in_sync)
  # A worker waits for its peers as long as the cluster may take to form,
  # and for the chief's last checkpoint at most CHIEF_CHECKPOINT_WAIT.
  options = dict(coordinator=coordinator, dataset_fn=dataset_fn,
                 peer_wait=min(checkpoints.CHIEF_CHECKPOINT_WAIT,
                               cluster_timeout))
  with _determinism_errors(config):
    if not distribute.is_chief(config.strategy):
      return _train(Trainer(run, strategy, chief=False, **options), echo,
                    verbose)
    checkpoints.check_writable(model_dir)
    with checkpoints.lock(model_dir):
      config_file.check_resumable(model_dir, config)
      return _train(Trainer(run, strategy, **options), echo, verbose)


def make_deterministic():
  """What --deterministic asks of TensorFlow, for the whole process and
  before any step is traced: every op a deterministic kernel or an error
  (`tf.config.experimental.enable_op_determinism`), and Grappler off.

  Op determinism alone does not give bit-identical reruns. With Grappler
  rewriting the training step's graph, two processes running one command
  drift apart in the last bits of the weights: `cifar10_ws` at width 0.25
  within 100 steps (from some saved states on, almost every repeat of one
  step differed; the arithmetic optimizer was that one's cause), and
  `cifar10_ws_bn` at width 0.125 from the first steps with the arithmetic
  optimizer off -- and with every pass that can be named switched off, but
  not with the meta-optimizer disabled (Zen 4; threads and oneDNN ruled
  out). Its rewrites are for speed only: without them the step of
  `cifar10_ws` at width 0.125 costs about 3 % more (BENCHMARKS.md).
  """
  tf.config.experimental.enable_op_determinism()
  tf.config.optimizer.set_experimental_options(
      {"disable_meta_optimizer": True})


# What TensorFlow says when, under op determinism, an op has no
# deterministic kernel on the device, or a random op no seed.
_DETERMINISM_MESSAGE = ("determinism", "deterministic")


@contextlib.contextmanager
def _determinism_errors(config):
  """Under --deterministic, TensorFlow's error for an op it cannot run
  deterministically (tf.errors.UnimplementedError, or the RuntimeError of
  an unseeded random op) as one ConfigError naming the op: the run stops
  at once, as it would without a checkpoint to lose."""
  try:
    yield
  except (tf.errors.OpError, RuntimeError) as e:
    text = getattr(e, "message", None) or str(e)
    if not config.deterministic or not any(
        word in text.lower() for word in _DETERMINISM_MESSAGE):
      raise
    raise errors.ConfigError(determinism_line(text)) from None


def determinism_line(text):
  """The one line of TensorFlow's determinism error TEXT: the op it names
  (its node, or the op type), what TensorFlow said, and the fix."""
  node = re.search(r"\[\[\{\{node ([^}]+)\}\}\]\]|node '?([\w/.-]+)'?",
                   text)
  op = (next(g for g in node.groups() if g) if node else None)
  said = next((line.strip() for line in text.splitlines()
               if any(w in line.lower() for w in _DETERMINISM_MESSAGE)),
              text.splitlines()[0] if text else "")
  return (f"--deterministic: {f'op {op} ' if op else 'an op '}has no "
          f"deterministic implementation here ({said[:200]}); run without "
          "--deterministic, or replace the op")


def _train(trainer, echo, verbose):
  """Restores TRAINER's run, writes config.json (the chief) and trains."""
  run = trainer.run
  latest = _restore(trainer, echo)
  step = trainer.step
  if latest:
    echo(f"resumed from {latest} at step {step}")
  if step >= run.config.train_steps:
    # config.json keeps what the run did: a command that trains nothing
    # changes nothing.
    echo(f"the run is at step {step}, at or past --train_steps="
         f"{run.config.train_steps}: nothing to train (raise --train_steps "
         "to continue it); config.json unchanged")
    trainer.finish()
    return {"step": step, "train_loss": None, "train_top1": None,
            "eval": None, "model_dir": run.model_dir, "trained": False}
  if trainer.chief:
    changed = config_file.record(run.model_dir, run.description(), step)
    if changed:  # What this command changes in the stored configuration.
      echo(f"changed in {config_file.path(run.model_dir)} from step {step}:")
      for line in changed:
        echo(line)
    # Shown once the run can start: an error before it is one line alone.
    # The whole of it is a hundred lines, config.json's.
    echo(f"configuration: {config_file.path(run.model_dir)}")
    if verbose:
      echo(json.dumps(run.description(model_dir=run.model_dir), indent=2,
                      sort_keys=True))
    note = distribute.precision_note(run.config.precision)
    if note:
      echo(note)
  with metrics.MetricsWriter(run.model_dir, echo, enabled=trainer.chief,
                             verbose=verbose) as writer:
    writer.start(trainer.step, machine=machine.describe())
    with preemption.Preemption(trainer.strategy, trainer.manager) as stop:
      try:
        result = _loop(trainer, writer, stop, echo)
      except preemption.PreemptedError:
        writer.stopped(trainer.step, stop.signal)
        raise
      except diagnostics.NonFiniteLossError as e:
        writer.diverged(trainer.step, e.step)
        raise
    writer.done(result["step"])
  trainer.finish()
  return result


def _restore(trainer, echo):
  """Restores the newest intact checkpoint (every worker the chief's); one
  found damaged only on restoring is set aside like the others and the
  next one restored. Returns its path, None for a new run."""
  model_dir = trainer.run.model_dir
  while True:
    latest = checkpoints.resume_point(model_dir, trainer.chief, echo)
    try:
      trainer.restore(latest)
      return latest
    except checkpoints.DamagedCheckpointError as e:
      if not trainer.chief:
        raise
      echo(f"{os.path.basename(e.prefix)} is damaged: {e.reason}")
      checkpoints.quarantine(model_dir, {e.prefix: e.reason})


def _loop(trainer, writer, stop, echo):
  """Steps until config.train_steps: a progress line every log_steps, a
  checkpoint every checkpoint_steps, an evaluation every eval_steps (the
  chief) and at the end; a stop on SIGTERM (STOP) and on NaN."""
  config, run = trainer.config, trainer.run
  step = trainer.step
  window = diagnostics.Window(trainer.watched)
  signs = diagnostics.AbnormalSigns()
  result = {"step": step, "train_loss": None, "train_top1": None,
            "eval": None, "model_dir": run.model_dir, "trained": True}
  echo(f"training {config.model} on {config.dataset} for "
       f"{config.train_steps} steps, global batch {config.batch_size}, "
       f"{trainer.strategy.num_replicas_in_sync} replica(s) "
       f"({config.strategy}); model_dir {run.model_dir}")
  logged_at = step
  if (trainer.chief and config.eval_steps and step > 0
      and step % config.eval_steps == 0
      and int(trainer.last_evaluated_step.numpy()) < step):
    # The stop (SIGTERM or a kill) came on an evaluation step, after its
    # checkpoint and before its evaluation: without this one the curve and
    # the time to each accuracy would skip an epoch.
    result[_periodic(config)] = _evaluate(trainer, writer, step)
  # The length of a call: one step first (tracing included, its pace is
  # unknown), then what ends within preemption.CALL_SECONDS at the last
  # call's pace, so that SIGTERM is honoured within about that (or a step).
  most, calls = (1 if stop.paced else config.steps_per_loop), 0
  while step < config.train_steps:
    started = time.perf_counter()
    out = trainer.run_steps(_next_stop(config, step, most) - step)
    seconds = time.perf_counter() - started
    pace = seconds / (trainer.step - step)
    step, calls = trainer.step, calls + 1
    if stop.paced:
      most = preemption.steps_per_call(pace, config.steps_per_loop)
    if calls == 2 and trainer.chief:
      _announce_slow_progress(config, step, pace, echo)
    diagnostics.check_finite(out, step, trainer.watched, window,
                             checkpoints.last_written(trainer.manager))
    diagnostics.check_loss_scale(trainer.loss_scale, step,
                                 checkpoints.last_written(trainer.manager))
    window.add(out, seconds)
    last = step >= config.train_steps
    if step % config.log_steps == 0 or last:
      record = window.record(step, config.train_steps, trainer.learning_rate,
                             config.batch_size)
      if trainer.loss_scale is not None:
        record["loss_scale"] = trainer.loss_scale
      writer.train(record, trainer.scalars(record),
                   abnormal=signs.check(record))
      # The last window may be shorter than log_steps (a run's end, a short
      # run or resume): the summary names the steps it covers.
      result.update(train_loss=record["loss"], train_top1=record["top1"],
                    train_window=step - logged_at)
      logged_at = step
    stop.check(step, trainer.save)
    if last:
      break  # `_finish`: the evaluations, then the checkpoint.
    if step % config.checkpoint_steps == 0:
      echo(f"saved checkpoint {trainer.save(step)}")
    if trainer.chief and config.eval_steps and step % config.eval_steps == 0:
      result[_periodic(config)] = _evaluate(trainer, writer, step)
  result["step"] = step
  return _finish(trainer, writer, result, echo)


def _finish(trainer, writer, result, echo):
  """The end of a run at RESULT["step"]: its evaluations (the chief), then
  its last checkpoint, which so records them -- a run continued from it
  with more --train_steps does not evaluate its step again, and a kill
  during them leaves the previous checkpoint, from which the run replays
  its last steps and evaluates. Returns RESULT, completed."""
  config, step = trainer.config, result["step"]
  held_out = config.validation_examples
  if trainer.chief and (config.eval_steps or
                        (config.eval_at_end and not held_out)) and (
      int(trainer.last_evaluated_step.numpy()) != step):
    result[_periodic(config)] = _evaluate(trainer, writer, step)
  if trainer.chief and held_out and config.eval_at_end:
    # The evaluation split, read once: at the end, after the validation.
    result["eval"] = trainer.evaluate()
    writer.evaluation(step, result["eval"])
  if config.eval_train_at_end and trainer.chief:
    result["train_eval"] = trainer.evaluate_training_set()
    writer.training_set_evaluation(step, result["train_eval"])
  echo(f"saved checkpoint {trainer.save(step)}")
  return result


def _periodic(config):
  """The key of the evaluations during CONFIG's training in the result:
  "validation" with --validation_examples, else "eval"."""
  return "validation" if config.validation_examples else "eval"


def _evaluate(trainer, writer, step):
  """The evaluation during training of TRAINER's current weights, recorded
  at STEP (and in the checkpoints written from now on): on the held-out
  training examples with --validation_examples, else on the evaluation
  split."""
  if trainer.config.validation_examples:
    scores = trainer.evaluate_validation()
    writer.validation(step, scores)
  else:
    scores = trainer.evaluate()
    writer.evaluation(step, scores)
  trainer.last_evaluated_step.assign(step)
  return scores


def _announce_slow_progress(config, step, pace, echo):
  """One line when the next progress line is over a minute away at PACE
  (seconds per step, measured after tracing): a slow run's first sign of
  life is otherwise that line, up to half an hour after the start."""
  following = min((step // config.log_steps + 1) * config.log_steps,
                  config.train_steps)
  left = (following - step) * pace
  if left > 60:
    echo(f"{pace:.3g} s per step: the next progress line, at step "
         f"{following}, in about {datetime.timedelta(seconds=round(left))}")


def _next_stop(config, step, most):
  """The next step at which the loop has something to do: at most MOST
  steps on."""
  every = [config.log_steps, config.checkpoint_steps]
  if config.eval_steps:
    every.append(config.eval_steps)
  return min([config.train_steps, step + most] +
             [(step // n + 1) * n for n in every])
