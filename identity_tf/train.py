"""Training: one tf.distribute loop for the paper's networks.

One custom loop serves every strategy (`default`, `mirrored`,
`multi_worker_mirrored`, `tpu`, `parameter_server`; `distribute.py`): a
`tf.function` that runs `steps_per_loop` SGD steps through `strategy.run`
(`make_train_step`), scheduled through a `ClusterCoordinator` under
`parameter_server` (Keras 3's `fit` does not support that strategy). Around
it (`train`): a `tf.train.CheckpointManager` over the model, the optimizer
(its momentum slots and its `iterations`, which is the global step) and,
where tf.data allows, the input iterator; progress lines and TensorBoard
scalars that show a divergence coming; evaluation every `eval_steps`; a
stop on non-finite losses naming where it began; and a checkpoint on
SIGTERM. What the run leaves in model_dir is `run_dir.py`'s.
"""

import json
import math
import os
import signal
import time

from absl import logging
import keras
import numpy as np
import tensorflow as tf

from identity_tf import distribute
from identity_tf import evaluation
from identity_tf import input_pipeline
from identity_tf import model as model_lib
from identity_tf import optimization
from identity_tf import run_dir
from identity_tf import tfds_data

# Exit status of a run stopped by SIGTERM after writing its checkpoint: the
# shell's convention for "terminated by signal 15", so supervisors see an
# interrupted (not a finished, not a failed) run.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


class NonFiniteLossError(ValueError):
  """The training loss became NaN or infinite; the run was stopped.

  `step` is the global step at which it first happened.
  """

  def __init__(self, message, step=None):
    super().__init__(message)
    self.step = step


class PreemptedError(Exception):
  """SIGTERM (or SIGINT) arrived; a checkpoint was written, the run stopped.

  `exit_code` is the shell's for that signal: 143 for SIGTERM, 130 for
  SIGINT, so that supervisors see an interrupted run.
  """

  def __init__(self, message, exit_code=None):
    super().__init__(message)
    self.exit_code = exit_code or PREEMPTED_EXIT_CODE


def build_model(config, info):
  """CONFIG's network for dataset INFO (`run_dir.model_options`)."""
  return model_lib.build_model(config.model,
                               **run_dir.model_options(config, info))


def build_optimizer(config, info):
  return optimization.build_optimizer(config,
                                      run_dir.steps_per_epoch(config, info))


def residual_branch_norms(model):
  """{stage number: max over the stage's units of ||C2||_2}.

  (Times the branch's scalar multiplier under SkipInit and Fixup.)

  For residual unit x -> x + C2(ReLU(C1 x)) we take C2's kernel [k, k, c, c]
  reshaped to a (k k c) x c matrix and its spectral norm (largest singular
  value). This is the convolutional analogue of the paper's |||A||| =
  max_i ||A_i|| (Section 2: the largest spectral norm of the residual
  layers), whose smallness Theorems 2.1-2.2 are about: a residual network
  near the identity. C2 is the weight that is zero when the unit is exactly
  the identity (Section 4). Per stage, so depth- and width-changing stages
  are not mixed.
  """
  stages = {}
  for layer in model.layers:
    name = layer.name
    if not (name.startswith("stage") and "_unit" in name and
            hasattr(layer, "conv2")):
      continue
    stage = int(name[len("stage"):name.index("_unit")])
    kernel = tf.convert_to_tensor(layer.conv2.kernel)
    matrix = tf.reshape(kernel, [-1, kernel.shape[-1]])
    norm = float(tf.linalg.svd(matrix, compute_uv=False)[0])
    # SkipInit's and Fixup's scalar multipliers are part of the branch's C2.
    for gain in ("branch_gain", "scale"):
      if hasattr(layer, gain):
        norm *= abs(float(keras.ops.convert_to_numpy(getattr(layer, gain))))
    stages[stage] = max(stages.get(stage, 0.0), norm)
  return stages


def _all_finite(variables):
  return all(bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))))
             for v in variables)


# ---------------------------------------------------------------------------
# The step.

def watched_activations(model):
  """Names of the activations a training step watches, in forward order."""
  return list(model_lib.activation_probe(model).output.keys())


def make_train_step(strategy, model, optimizer, config):
  """The training step of `train`: a tf.function (iterator, num_steps) -> dict.

  Each of NUM_STEPS steps takes next(ITERATOR) (a distributed iterator of
  STRATEGY's per-replica (images, labels) batches) and, on every replica,
  applies OPTIMIZER to MODEL's gradient of the cross-entropy averaged over
  the global batch (config.batch_size) plus `optimization.l2_penalty`,
  clipped as config.grad_clip_norm and config.agc_clip say
  (`optimization.clip_factors`, computed from the global batch's gradient).

  Returns a dict of tensors over the NUM_STEPS steps:
    "sums": the sums over steps and replicas of [per-example loss, correct
      top-1 predictions, examples];
    "peaks": the largest per-step value of [global gradient norm (before
      clipping), largest ||update|| / ||weight|| over the kernels, then the
      RMS of each activation of `watched_activations`] (NaN if any was);
    "first_nonfinite": [global step, index] of the first step at which one
      of them was NaN or infinite -- index i < len(watched) is the first
      such activation in forward order, len(watched) the gradient -- or
      [-1, -1].
  `train` runs this function (scheduled through a ClusterCoordinator under
  parameter_server); bin/benchmark times it.
  """
  global_batch = config.batch_size
  probe = model_lib.activation_probe(model)
  names = list(probe.output.keys())
  variables = model.trainable_variables
  # With several replicas in sync each one holds a part of the gradient; the
  # clipping factors and the reported norm are those of the whole.
  replicas = strategy.num_replicas_in_sync

  def replica_step(images, labels):
    with tf.GradientTape() as tape:
      activations = probe(images, training=True)
      logits = activations["logits"]
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True)
      # Mean over the global batch: the optimizer sums the replicas'
      # gradients.
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=global_batch)
      total = loss + tf.nn.scale_regularization_loss(
          optimization.l2_penalty(model, config.weight_decay))
    gradients = tape.gradient(total, variables)
    whole = gradients
    if replicas > 1:
      whole = tf.distribute.get_replica_context().all_reduce(
          tf.distribute.ReduceOp.SUM, gradients)
    factors, grad_norm = optimization.clip_factors(
        whole, variables, config.grad_clip_norm, config.agc_clip)
    gradients = [g if f is None else g * f
                 for g, f in zip(gradients, factors)]
    kernels = [v for v in variables if len(v.shape) >= 2]
    before = [tf.identity(v) for v in kernels]
    optimizer.apply_gradients(zip(gradients, variables))
    # Kernels only: the relative change of a scalar near zero (SkipInit's
    # gain, Fixup's biases) says nothing about stability. Kernels that are
    # exactly zero (Fixup's C2 at the start) have no ratio; they count as 0.
    update_ratio = tf.reduce_max(tf.stack([
        tf.math.divide_no_nan(tf.norm(v - b), tf.norm(b))
        for v, b in zip(kernels, before)]))
    rms = [tf.sqrt(tf.reduce_mean(tf.square(tf.cast(activations[name],
                                                    tf.float32))))
           for name in names]
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               labels), tf.float32)
    sums = tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(correct),
                     tf.cast(tf.size(labels), tf.float32)])
    return sums, tf.stack([grad_norm, update_ratio, *rms])

  @tf.function
  def train_steps(iterator, num_steps):
    sums = tf.zeros([3])
    peaks = tf.fill([2 + len(names)], -np.inf)
    first = tf.constant([-1, -1], tf.int64)
    for _ in tf.range(num_steps):
      step = tf.cast(optimizer.iterations, tf.int64) + 1
      step_sums, step_values = strategy.run(replica_step, args=next(iterator))
      sums += strategy.reduce(tf.distribute.ReduceOp.SUM, step_sums,
                              axis=None)
      values = strategy.reduce(tf.distribute.ReduceOp.MEAN, step_values,
                               axis=None)
      peaks = tf.maximum(peaks, values)  # NaN stays NaN.
      # Forward order: the activations, then the gradient.
      bad = tf.logical_not(tf.math.is_finite(
          tf.concat([values[2:], values[:1]], axis=0)))
      first = tf.where(
          tf.logical_and(first[0] < 0, tf.reduce_any(bad)),
          tf.stack([step, tf.argmax(tf.cast(bad, tf.int64),
                                    output_type=tf.int64)]), first)
    return {"sums": sums, "peaks": peaks, "first_nonfinite": first}
  return train_steps


# ---------------------------------------------------------------------------
# The loop.

class _Preemption:
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


def _input_fn(config, info, data_dir, seed, start_step=0):
  """The training dataset_fn, starting START_STEP global steps in.

  The pipeline's stream is a deterministic function of (seed, position), so
  starting it at a step replays exactly what an uninterrupted run reads
  from there on (free for in-memory datasets).
  """
  prep = run_dir.preprocessing(config, info)

  def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(config.batch_size)
    return input_pipeline.build_dataset(
        config.dataset, info.train_split, batch, training=True,
        data_dir=data_dir, seed=seed, deterministic=config.deterministic,
        input_context=input_context, num_examples=config.num_train_examples,
        preprocessing=prep, start_step=start_step)
  return dataset_fn


def _checkpoint(model, optimizer, iterator):
  """The run's checkpoint: model, optimizer and, where tf.data can save it
  (one replica per process), the input iterator."""
  trackables = dict(model=model, optimizer=optimizer)
  if isinstance(iterator, tf.data.Iterator):
    trackables["iterator"] = iterator
  return tf.train.Checkpoint(**trackables)


def _restore(path, model, optimizer, make_iterator):
  """(iterator, checkpoint) of a run restored from checkpoint PATH (or None).

  The input position is restored from the checkpoint where it holds one that
  fits this pipeline. Otherwise -- several replicas, or an iterator that no
  longer fits -- the pipeline is started at the restored step
  (`make_iterator(step)`, `build_dataset(start_step=...)`), which yields
  exactly what the uninterrupted stream would.
  """
  iterator = make_iterator(0)
  if path is None:
    return iterator, _checkpoint(model, optimizer, iterator)
  saved_iterator = any(name.startswith("iterator/")
                       for name, _ in tf.train.list_variables(path))
  if saved_iterator and isinstance(iterator, tf.data.Iterator):
    checkpoint = _checkpoint(model, optimizer, iterator)
    try:
      checkpoint.restore(path).assert_existing_objects_matched()
      return iterator, checkpoint
    except tf.errors.OpError as e:
      logging.warning("the input position in %s does not fit this input "
                      "pipeline (%s); replaying the input instead", path,
                      str(e).splitlines()[0])
  iterator = make_iterator(run_dir.checkpoint_step(path))
  tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
      path).expect_partial().assert_existing_objects_matched()
  return iterator, _checkpoint(model, optimizer, iterator)


class _Window:
  """The steps since the last progress line: what the line reports."""

  def __init__(self, watched):
    self.watched = watched
    self.last = None  # The last line's record: what preceded a NaN.
    self.reset()

  def reset(self):
    self.sums = np.zeros(3)
    self.peaks = np.full(2 + len(self.watched), -np.inf)
    self.start = time.time()

  def add(self, out):
    self.sums += out["sums"]
    self.peaks = np.maximum(self.peaks, out["peaks"])

  def record(self, step, train_steps, learning_rate):
    """The progress line's JSON object; starts a new window."""
    loss, top1 = self.sums[0] / self.sums[2], self.sums[1] / self.sums[2]
    rate = self.sums[2] / max(time.time() - self.start, 1e-9)
    self.last = {
        "step": step, "train_steps": train_steps, "loss": _round(loss),
        "top1": _round(top1), "lr": _round(learning_rate),
        "images_per_second": round(rate, 1),
        "grad_norm": _round(self.peaks[0]),
        "update_ratio": _round(self.peaks[1]),
        "activation_rms": {name: _round(value) for name, value in
                           zip(self.watched, self.peaks[2:])}}
    self.reset()
    return self.last


def train(config, model_dir, *, data_dir=None, strategy=None, tpu=None,
          cluster_timeout=600.0, echo=print, dataset_fn=None):
  """Trains CONFIG in MODEL_DIR, resuming from its latest checkpoint.

  Args:
    config: a validated `configs.Config`.
    model_dir: where config.json, checkpoints and summaries go.
    data_dir: TFDS data directory.
    strategy: a tf.distribute strategy (default: `distribute.create_strategy(
      config.strategy, tpu)`).
    tpu: --tpu for `create_strategy`.
    cluster_timeout: seconds a multi-worker cluster may take to form
      (`create_strategy`).
    echo: receives the progress lines (print by default).
    dataset_fn: replaces the input pipeline (experiments on data of your
      own): input_context -> tf.data.Dataset of per-replica (images, labels)
      batches, repeated forever; it must be deterministic in its position
      for exact resumes under several replicas.

  Progress: every config.log_steps steps ECHO receives one JSON object:
  step, loss and top-1 over the last steps, learning rate, images/s, and
  what shows a divergence coming -- the largest global gradient norm, the
  largest update/weight ratio and the largest RMS of each stage's
  activations over those steps (`make_train_step`); every config.eval_steps
  steps one with the evaluation. The same values go to TensorBoard.

  Returns:
    {"step", "train_loss", "train_top1" (last logged window), "eval": the
    last evaluation or None, "model_dir"}.

  The run resumes from the newest intact checkpoint in MODEL_DIR, found
  from the files (`run_dir.intact_checkpoints`): damaged newer ones are
  moved to MODEL_DIR/damaged/ and named, and a directory whose checkpoints
  are all damaged is refused rather than trained from step 0. One training
  at a time holds MODEL_DIR (`run_dir.lock`); config.json is written once
  the run has been restored and can start.

  Raises:
    NonFiniteLossError: the loss became NaN/Inf; the latest checkpoint was
      written before it.
    PreemptedError: SIGTERM or SIGINT; a checkpoint of the current step was
      written.
    ValueError / tfds_data.DatasetNotReadyError: bad configuration, or a
      model_dir that cannot hold the run (one line saying why).
  """
  # Multi-worker strategies must exist before TensorFlow starts its runtime.
  if strategy is None:
    strategy = distribute.create_strategy(config.strategy, tpu,
                                          timeout=cluster_timeout, echo=echo)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(config.seed)
  coordinator = None
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
        strategy)
  replicas = strategy.num_replicas_in_sync
  if config.batch_size % replicas:
    raise ValueError(f"--batch_size={config.batch_size} must be a multiple "
                     f"of the {replicas} replicas of --strategy="
                     f"{config.strategy}")
  chief = distribute.is_chief()
  # A dataset that is not prepared stops the run here, before anything is
  # written to model_dir.
  info = (tfds_data.dataset_info(config.dataset, data_dir) if dataset_fn
          else tfds_data.prepared_info(config.dataset, data_dir))
  if not chief:
    return _train(config, model_dir, info, strategy, coordinator, chief,
                  data_dir, echo, dataset_fn)
  run_dir.check_writable(model_dir)
  with run_dir.lock(model_dir):
    return _train(config, model_dir, info, strategy, coordinator, chief,
                  data_dir, echo, dataset_fn)


def _resume_point(config, model_dir, chief, echo):
  """The checkpoint to resume from (None: start), after checking the run.

  The chief checks that CONFIG can continue the run, moves damaged
  checkpoints aside and rewrites TensorFlow's state file to list the
  intact ones; ValueError (nothing changed) if there are checkpoints but
  none is intact.
  """
  if chief:
    run_dir.check_resumable(model_dir, config)
  intact, damaged = run_dir.intact_checkpoints(model_dir, echo)
  if damaged and not intact:
    raise ValueError(
        f"--model_dir={model_dir} holds checkpoints but none is intact ("
        + "; ".join(f"{os.path.basename(p)}: {r}" for p, r in damaged.items())
        + "); nothing was changed: restore them from a copy, or use a new "
        "--model_dir (training does not start again from step 0 over them)")
  if chief:
    run_dir.quarantine(model_dir, damaged)
    run_dir.record_checkpoints(model_dir, intact)
    if damaged:
      echo(f"moved {', '.join(os.path.basename(p) for p in damaged)} to "
           f"{os.path.join(model_dir, run_dir.DAMAGED_DIR)}/; resuming from "
           f"{os.path.basename(intact[0])}, the newest intact checkpoint")
  return intact[0] if intact else None


def _train(config, model_dir, info, strategy, coordinator, chief, data_dir,
           echo, dataset_fn):
  """`train` once MODEL_DIR is held (by the chief)."""
  replicas = strategy.num_replicas_in_sync
  latest = _resume_point(config, model_dir, chief, echo)
  # Every worker writes checkpoints (MultiWorkerMirroredStrategy wants all of
  # them to save), but only the chief's go to model_dir.
  task_type, task_id = distribute.cluster_task()
  checkpoint_dir = model_dir if chief else os.path.join(
      model_dir, f".{task_type}{task_id}_tmp")

  with strategy.scope():
    model = build_model(config, info)
    optimizer = build_optimizer(config, info)
    optimizer.build(model.trainable_variables)

  custom_input = dataset_fn is not None
  dataset_fn = dataset_fn or _input_fn(config, info, data_dir, config.seed)

  def make_iterator(skip_steps):
    fn = dataset_fn
    if coordinator is not None:
      # No replay under parameter_server: after a restart the workers start
      # a fresh stream (seeded by the step) instead.
      if skip_steps and not custom_input:
        fn = _input_fn(config, info, data_dir, config.seed + skip_steps)
      return iter(coordinator.create_per_worker_dataset(
          lambda: strategy.distribute_datasets_from_function(fn)))
    if skip_steps and not custom_input:
      fn = _input_fn(config, info, data_dir, config.seed,
                     start_step=skip_steps)
    return iter(strategy.distribute_datasets_from_function(fn))

  # Every worker restores the chief's checkpoint.
  iterator, checkpoint = _restore(latest, model, optimizer, make_iterator)
  if latest:
    echo(f"resumed from {latest} at step {int(optimizer.iterations.numpy())}")
    # A constant rate is a variable of the optimizer, so the checkpoint holds
    # the old one: the configuration's takes effect (schedules are computed
    # from the step and take effect anyway).
    if not isinstance(optimizer._learning_rate,  # pylint: disable=protected-access
                      keras.optimizers.schedules.LearningRateSchedule):
      optimizer.learning_rate = config.learning_rate
  if chief:
    run_dir.write_run(model_dir, run_dir.describe_run(config, info))
  manager = tf.train.CheckpointManager(
      checkpoint, checkpoint_dir, max_to_keep=config.keep_checkpoints,
      checkpoint_name=run_dir.CHECKPOINT_PREFIX)

  train_steps = make_train_step(strategy, model, optimizer, config)
  watched = watched_activations(model)

  def run_steps(num_steps):
    """Runs NUM_STEPS steps; returns `make_train_step`'s dict as NumPy."""
    if coordinator is None:
      return {k: v.numpy() for k, v in
              train_steps(iterator, tf.constant(num_steps)).items()}
    # Asynchronous: closures of at most steps_per_loop steps on whichever
    # worker is free; each step updates the parameter servers on its own.
    results = []
    remaining = num_steps
    while remaining:
      n = min(remaining, config.steps_per_loop)
      results.append(coordinator.schedule(
          train_steps, args=(iterator, tf.constant(n))))
      remaining -= n
    coordinator.join()
    fetched = [r.fetch() for r in results]
    bad = [f["first_nonfinite"] for f in fetched
           if f["first_nonfinite"][0] >= 0]
    return {"sums": np.sum([f["sums"] for f in fetched], axis=0),
            "peaks": np.max([f["peaks"] for f in fetched], axis=0),
            "first_nonfinite": min(bad, key=lambda b: b[0]) if bad
                               else np.array([-1, -1])}

  writer = (tf.summary.create_file_writer(os.path.join(model_dir, "train"))
            if chief else tf.summary.create_noop_writer())
  evaluator = None

  def run_evaluation(step):
    nonlocal evaluator
    if evaluator is None:
      evaluator = evaluation.make_evaluator(
          model, config.dataset, data_dir=data_dir,
          batch_size=config.eval_batch_size,
          num_examples=config.num_eval_examples,
          preprocessing=run_dir.preprocessing(config, info), info=info)
    metrics = evaluator()
    run_dir.write_eval_summaries(model_dir, step, metrics)
    return metrics

  def save(step):
    if not _all_finite(model.trainable_weights):
      raise NonFiniteLossError(
          f"the weights became NaN or infinite by step {step}; "
          f"{_last_good(manager)}", step=step)
    try:
      path = manager.save(checkpoint_number=step)
      run_dir.write_digest(path)
      run_dir.prune_digests(checkpoint_dir)
    except (OSError, tf.errors.OpError) as e:
      # A full disk, say: the half-written checkpoint is removed, so that
      # it is not mistaken for one, and the run stops saying so.
      run_dir.remove_checkpoint(checkpoint_dir, step)
      reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
      raise ValueError(
          f"could not write the checkpoint of step {step} in "
          f"{checkpoint_dir} ({reason}); {_last_good(manager)}; free space "
          "(or fix the directory) and run the same command to resume") from e
    return path

  step = int(optimizer.iterations.numpy())
  if latest and step >= config.train_steps:
    echo(f"the run is at step {step}, at or past --train_steps="
         f"{config.train_steps}: nothing to train (raise --train_steps to "
         "continue it)")
  window = _Window(watched)
  last = {"train_loss": None, "train_top1": None}
  result = {"step": step, **last, "eval": None, "model_dir": model_dir}
  echo(f"training {config.model} on {config.dataset} for "
       f"{config.train_steps} steps, global batch {config.batch_size}, "
       f"{replicas} replica(s) ({config.strategy}); model_dir {model_dir}")
  with _Preemption(strategy, manager) as preemption:
    while step < config.train_steps:
      every = [config.log_steps, config.checkpoint_steps]
      if config.eval_steps:
        every.append(config.eval_steps)
      next_stop = min([config.train_steps, step + config.steps_per_loop] +
                      [(step // n + 1) * n for n in every])
      out = run_steps(next_stop - step)
      step = int(optimizer.iterations.numpy())
      if out["first_nonfinite"][0] >= 0 or not math.isfinite(out["sums"][0]):
        first = int(out["first_nonfinite"][0])
        raise NonFiniteLossError(_nonfinite_message(
            out, step, watched, window.last, _last_good(manager)),
                                 step=first if first >= 0 else step)
      window.add(out)
      if step % config.log_steps == 0 or step >= config.train_steps:
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        record = window.record(step, config.train_steps, lr)
        echo(json.dumps(record))
        last = {"train_loss": record["loss"], "train_top1": record["top1"]}
        with writer.as_default():
          scalars = {
              "loss": record["loss"], "top1": record["top1"],
              "learning_rate": lr,
              "images_per_second": record["images_per_second"],
              "weight_decay_loss": float(optimization.l2_penalty(
                  model, config.weight_decay)),
              "grad_norm": record["grad_norm"],
              "update_ratio": record["update_ratio"],
              **{f"activation_rms/{name}": value for name, value in
                 record["activation_rms"].items()},
              **{f"residual_branch_norm/stage{stage}": norm for stage, norm
                 in sorted(residual_branch_norms(model).items())}}
          for name, value in scalars.items():
            tf.summary.scalar(name, value, step=step)
        writer.flush()
      preemption.check(step, save)
      if step % config.checkpoint_steps == 0 or step >= config.train_steps:
        echo(f"saved checkpoint {save(step)}")
      if chief and config.eval_steps and (
          step % config.eval_steps == 0 or step >= config.train_steps):
        result["eval"] = run_evaluation(step)
        echo(json.dumps({"step": step, "eval": {
            k: v if isinstance(v, int) else _round(v)
            for k, v in result["eval"].items()}}))
        window.start = time.time()  # Images/s counts training only.
  if not chief:
    tf.io.gfile.rmtree(checkpoint_dir)
  result.update(step=step, **last)
  evaluated = config.eval_steps and result["eval"] is not None
  if config.eval_at_end and chief and not evaluated:
    result["eval"] = run_evaluation(step)
  return result


def _round(value, digits=4):
  """VALUE with DIGITS significant digits, for progress lines (NaN kept)."""
  value = float(value)
  if not math.isfinite(value) or value == 0:
    return value
  return float(f"{value:.{digits}g}")


def _nonfinite_message(out, step, watched, last_record, last_good):
  """The one line that stops a diverged run: where and when, and what to do."""
  first_step, index = (int(v) for v in out["first_nonfinite"])
  if first_step < 0:  # Finite activations and gradients, infinite loss.
    where, first_step = "the loss", step
  elif index < len(watched):
    where = f"the activations of {watched[index]}"
  else:
    where = "the gradient"
  before = ""
  if last_record:
    rms = ", ".join(f"{k} {v:.3g}"
                    for k, v in last_record["activation_rms"].items())
    before = (f"; before it: gradient norm up to "
              f"{last_record['grad_norm']:.3g}, activation RMS {rms}")
  return (f"the training loss became {out['sums'][0]} at step {first_step}: "
          f"{where} became NaN or infinite first{before}; {last_good}; lower "
          f"--learning_rate or add a stabiliser (e.g. --grad_clip_norm=1; "
          f"docs/training.md)")


def _last_good(manager):
  latest = manager.latest_checkpoint
  if latest:
    return (f"stopped; the latest checkpoint, written before it with finite "
            f"weights, is {latest} (step {run_dir.checkpoint_step(latest)})")
  return "stopped; no checkpoint was written"
