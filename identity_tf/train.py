"""Training and evaluation of the paper's networks with tf.distribute.

One custom loop serves every strategy (`default`, `mirrored`,
`multi_worker_mirrored`, `tpu`, `parameter_server`): a `tf.function` that
runs `steps_per_loop` SGD steps through `strategy.run`, scheduled through a
`ClusterCoordinator` under `parameter_server` (Keras 3's `fit` does not
support that strategy). Around it: a `tf.train.CheckpointManager` over the
model, the optimizer (its momentum slots and its `iterations`, which is the
global step) and, where tf.data allows, the input iterator; TensorBoard
scalars; a stop on non-finite losses; and a checkpoint on SIGTERM.

`model_dir` holds config.json (the resolved `configs.Config` plus what it
implies: model options, classes, preprocessing), the checkpoints
(`ckpt-<step>`), and TensorBoard event files in `train/` and `eval/`.
`restore_model(model_dir)` rebuilds the trained network from them.
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

from tensorflow.core.framework import summary_pb2
from tensorflow.core.util import event_pb2

from identity_tf import configs
from identity_tf import input_pipeline
from identity_tf import model as model_lib
from identity_tf import optimization

CONFIG_FILE = "config.json"
CHECKPOINT_PREFIX = "ckpt"
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
  """SIGTERM arrived; a checkpoint was written and the run stopped."""


default_model_dir = configs.default_model_dir


# ---------------------------------------------------------------------------
# Strategies.

def cluster_task():
  """(task type, task index) of this process from TF_CONFIG, or (None, 0)."""
  tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
  task = tf_config.get("task") or {}
  return task.get("type"), int(task.get("index", 0))


def _cluster_spec():
  return (json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster")
          or {})


def is_chief():
  """Whether this process writes model_dir: the chief, or worker 0 if none."""
  task_type, task_id = cluster_task()
  if task_type is None or task_type == "chief":
    return True
  return task_type == "worker" and task_id == 0 and "chief" not in (
      _cluster_spec())


def run_parameter_server_task():
  """Under `parameter_server`, serves this process's TF_CONFIG task forever.

  Workers and parameter servers only run a `tf.distribute.Server`; the chief
  (the coordinator) runs the training loop and sends them work. Returns
  False (without serving) on the chief.
  """
  task_type, task_id = cluster_task()
  if task_type not in ("worker", "ps"):
    return False
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(
      resolver.cluster_spec(), job_name=task_type, task_index=task_id,
      protocol=resolver.rpc_layer or "grpc", start=True)
  logging.info("parameter_server: %s %d serving at %s", task_type, task_id,
               server.target)
  server.join()
  return True


def create_strategy(name, tpu=None):
  """The tf.distribute strategy NAME (see configs.STRATEGIES).

  `multi_worker_mirrored` and `parameter_server` read the cluster from
  TF_CONFIG; `tpu` connects to TPU (a name or grpc:// address; None or ""
  means the local TPU or the one in the environment). Raises ValueError
  with the fix when the environment does not fit.
  """
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy()
  if name == "multi_worker_mirrored":
    return tf.distribute.MultiWorkerMirroredStrategy()
  if name == "tpu":
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
          tpu=tpu or "")
      tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
      raise ValueError(
          f"--strategy=tpu found no TPU ({str(e).splitlines()[0]}); pass "
          f"--tpu=NAME_OR_GRPC_ADDRESS or run on a TPU VM") from None
    return tf.distribute.TPUStrategy(resolver)
  if name == "parameter_server":
    cluster = _cluster_spec()
    if not cluster.get("ps") or not cluster.get("worker"):
      raise ValueError(
          "--strategy=parameter_server needs TF_CONFIG with a cluster of "
          "'chief', 'worker' and 'ps' tasks (see docs/training.md); got "
          f"TF_CONFIG={os.environ.get('TF_CONFIG')!r}")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.experimental.ParameterServerStrategy(resolver)
  raise ValueError(f"--strategy must be one of "
                   f"{', '.join(configs.STRATEGIES)}; got {name!r}")


# ---------------------------------------------------------------------------
# The run's description, model and optimizer.

def model_options(config, info):
  """`identity_tf.build_model` options of CONFIG for dataset INFO, complete.

  The classes come from the dataset; every option the configuration leaves
  None takes the model's default, and the result names them all, so that
  config.json rebuilds the same network even if defaults change.
  """
  units = config.units
  if units is not None:  # --units=2 means 2 in every stage.
    units = units[0] if len(units) == 1 else list(units)
  _, options = model_lib.resolve_options(
      config.model, classes=info.num_classes, width=config.width,
      units=units, norm=config.norm, head=config.head, init=config.init,
      seed=config.seed, image_size=model_lib.input_size(config.model),
      use_bias=config.use_bias, residual=config.residual,
      projection_scale=config.projection_scale)
  return {**options, "units": list(options["units"])}


def preprocessing(config, info):
  """The input preprocessing of CONFIG's network for dataset INFO."""
  return input_pipeline.preprocessing_config(
      info, model_lib.input_size(config.model), flip=config.flip)


def describe_run(config, info, **extra):
  """config.json's content: CONFIG and what rebuilding the model needs.

  INFO is the dataset's `input_pipeline.DatasetInfo` (classes and their
  names, image shape, splits and sizes), recorded so that evaluation and
  export need nothing but the run directory.
  """
  return {
      "config": configs.to_dict(config),
      "model": {"name": config.model, "options": model_options(config, info)},
      "dataset": info.to_dict(),
      "preprocessing": preprocessing(config, info),
      "steps_per_epoch": steps_per_epoch(config, info),
      **extra,
  }


def build_model(config, info):
  return model_lib.build_model(config.model, **model_options(config, info))


def steps_per_epoch(config, info):
  """Steps per pass over the training examples; None if their count is not
  known (a dataset that is not prepared)."""
  examples = config.num_train_examples or info.num_train_examples
  return examples / config.batch_size if examples else None


def build_optimizer(config, info):
  return optimization.build_optimizer(config, steps_per_epoch(config, info))


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


def write_scalar(name, value, step):
  """A TensorBoard scalar NAME = VALUE at STEP in the default summary writer.

  `tf.summary.scalar` lives in the tensorboard package, which TensorFlow no
  longer installs; this writes the same record (a float32 tensor tagged for
  TensorBoard's "scalars" plugin) with TensorFlow's own `tf.summary.write`,
  so viewing the logs is the only thing that needs tensorboard.
  """
  tf.summary.write(name, tf.constant(value, tf.float32), step=step,
                   metadata=_SCALAR_METADATA)


_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(
        plugin_name="scalars")).SerializeToString()


def read_scalars(log_dir):
  """{name: [(step, value), ...]} of the scalars in LOG_DIR's event files."""
  scalars = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(log_dir, "events.*"))):
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        number = float(tf.make_ndarray(value.tensor))
        scalars.setdefault(value.tag, []).append((event.step, number))
  return scalars


def _all_finite(variables):
  return all(bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))))
             for v in variables)


# ---------------------------------------------------------------------------
# config.json and restoring.

def read_run(model_dir):
  """config.json of MODEL_DIR as a dict; ValueError if there is none."""
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"no {CONFIG_FILE} in --model_dir={model_dir}: is it the "
                     f"model_dir of a training run?")
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def write_run(model_dir, description):
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, CONFIG_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(json.dumps(description, indent=2, sort_keys=True) + "\n")
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def check_resumable(model_dir, config):
  """ValueError if MODEL_DIR already holds a run of a different network."""
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    return
  old = configs.from_dict(read_run(model_dir)["config"])
  changed = [f"{name} ({getattr(old, name)!r} -> {getattr(config, name)!r})"
             for name in configs.MODEL_FIELDS
             if getattr(old, name) != getattr(config, name)]
  if changed:
    raise ValueError(
        f"--model_dir={model_dir} holds a run of a different network: "
        f"{', '.join(changed)}; use a new --model_dir, or the same settings "
        f"to resume it")


def checkpoint_step(path):
  """The global step of checkpoint PATH (named ckpt-<step>)."""
  return int(os.path.basename(path).rsplit("-", 1)[1])


def find_checkpoint(model_dir, checkpoint=None):
  """Path prefix of CHECKPOINT (a prefix, a file or a step), or the latest."""
  if checkpoint is None:
    path = tf.train.latest_checkpoint(model_dir)
    if path is None:
      raise ValueError(f"no checkpoint in --model_dir={model_dir} yet; train "
                       f"first (bin/train) or wait for one")
    return path
  checkpoint = str(checkpoint)
  if checkpoint.isdigit():
    checkpoint = os.path.join(model_dir, f"{CHECKPOINT_PREFIX}-{checkpoint}")
  elif not os.path.isabs(checkpoint) and "://" not in checkpoint and not (
      tf.io.gfile.exists(checkpoint + ".index")):
    checkpoint = os.path.join(model_dir, checkpoint)
  for suffix in (".index", ".data-00000-of-00001"):
    if checkpoint.endswith(suffix):
      checkpoint = checkpoint[:-len(suffix)]
  if not tf.io.gfile.exists(checkpoint + ".index"):
    raise ValueError(f"no checkpoint {checkpoint} (--checkpoint takes a step "
                     f"number, ckpt-<step> or a path prefix)")
  return checkpoint


def restore_model(model_dir, checkpoint=None):
  """(model, run description, global step) of MODEL_DIR's CHECKPOINT.

  CHECKPOINT: None (the latest), a step, `ckpt-<step>` or a path prefix. The
  model is rebuilt from config.json; only its weights are read (not the
  optimizer or the input position).
  """
  description = read_run(model_dir)
  path = find_checkpoint(model_dir, checkpoint)
  model = model_lib.build_model(description["model"]["name"],
                                **description["model"]["options"])
  tf.train.Checkpoint(model=model).read(path).expect_partial()
  return model, description, checkpoint_step(path)


# ---------------------------------------------------------------------------
# Evaluation.

def make_evaluator(model, dataset, *, data_dir=None, batch_size=500,
                   num_examples=None, preprocessing=None, info=None):
  """A function () -> `evaluate`'s result for MODEL's current weights.

  The evaluation pipeline is built once (for an in-memory dataset: read
  once), so a training run can evaluate every few steps cheaply. INFO is
  DATASET's `input_pipeline.DatasetInfo` if the caller has it.
  """
  info = info or input_pipeline.dataset_info(dataset, data_dir)
  if info.eval_split is None:
    raise ValueError(f"{dataset} has neither a 'validation' nor a 'test' "
                     "split to evaluate on")
  ds = input_pipeline.build_dataset(
      dataset, info.eval_split, batch_size, training=False, data_dir=data_dir,
      num_examples=num_examples, preprocessing=preprocessing)
  top_k = min(5, info.num_classes)

  @tf.function
  def batch_sums(images, labels):
    logits = model(images, training=False)
    loss = keras.losses.sparse_categorical_crossentropy(
        labels, logits, from_logits=True)
    top1 = tf.math.in_top_k(labels, logits, 1)
    top5 = tf.math.in_top_k(labels, logits, top_k)
    return tf.stack([tf.reduce_sum(loss),
                     tf.reduce_sum(tf.cast(top1, tf.float32)),
                     tf.reduce_sum(tf.cast(top5, tf.float32)),
                     tf.cast(tf.size(labels), tf.float32)])

  def run():
    sums = np.zeros(4, np.float64)
    for images, labels in ds:
      sums += batch_sums(images, labels).numpy()
    count = int(sums[3])
    if count == 0:
      raise ValueError(f"the {info.eval_split} split of {dataset} is empty")
    return {"loss": sums[0] / count, "top1": sums[1] / count,
            "top5": sums[2] / count, "examples": count}
  return run


def evaluate(model, dataset, **options):
  """Loss and accuracy of MODEL on DATASET's evaluation split, one pass.

  Returns {"loss": mean cross-entropy (no weight decay), "top1", "top5":
  fractions, "examples": count}. Runs on one device. OPTIONS are
  `make_evaluator`'s.
  """
  return make_evaluator(model, dataset, **options)()


def write_eval_summaries(model_dir, step, metrics):
  """METRICS' loss, top1 and top5 as TensorBoard scalars in MODEL_DIR/eval."""
  writer = tf.summary.create_file_writer(os.path.join(model_dir, "eval"))
  with writer.as_default():
    for name in ("loss", "top1", "top5"):
      write_scalar(name, metrics[name], step)
  writer.close()


# ---------------------------------------------------------------------------
# Training.

class _Preemption:
  """Records SIGTERM; the loop checkpoints at the end of the current call."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # Not the main thread: no signal handling.
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _input_fn(config, info, data_dir, seed, start_step=0):
  """The training dataset_fn, starting START_STEP global steps in.

  The pipeline's stream is a deterministic function of (seed, position), so
  starting it at a step replays exactly what an uninterrupted run reads
  from there on (free for in-memory datasets).
  """
  prep = preprocessing(config, info)

  def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(config.batch_size)
    return input_pipeline.build_dataset(
        config.dataset, info.train_split, batch, training=True,
        data_dir=data_dir, seed=seed, deterministic=config.deterministic,
        input_context=input_context, num_examples=config.num_train_examples,
        preprocessing=prep, start_step=start_step)
  return dataset_fn


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


def train(config, model_dir, *, data_dir=None, strategy=None, tpu=None,
          echo=print, dataset_fn=None):
  """Trains CONFIG in MODEL_DIR, resuming from its latest checkpoint.

  Args:
    config: a validated `configs.Config`.
    model_dir: where config.json, checkpoints and summaries go.
    data_dir: TFDS data directory.
    strategy: a tf.distribute strategy (default: `create_strategy(
      config.strategy, tpu)`).
    tpu: --tpu for `create_strategy`.
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
    `evaluate` result or None, "model_dir"}.

  Raises:
    NonFiniteLossError: the loss became NaN/Inf; the latest checkpoint is the
      last good one.
    PreemptedError: SIGTERM; a checkpoint of the current step was written.
    ValueError / input_pipeline.DatasetNotReadyError: bad configuration.
  """
  # Multi-worker strategies must exist before TensorFlow starts its runtime.
  if strategy is None:
    strategy = create_strategy(config.strategy, tpu)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(config.seed)
  asynchronous = isinstance(
      strategy, tf.distribute.experimental.ParameterServerStrategy)
  coordinator = (tf.distribute.experimental.coordinator.ClusterCoordinator(
      strategy) if asynchronous else None)
  replicas = strategy.num_replicas_in_sync
  if config.batch_size % replicas:
    raise ValueError(f"--batch_size={config.batch_size} must be a multiple "
                     f"of the {replicas} replicas of --strategy="
                     f"{config.strategy}")
  chief = is_chief()
  # A dataset that is not prepared stops the run here, before anything is
  # written to model_dir.
  info = (input_pipeline.dataset_info(config.dataset, data_dir)
          if dataset_fn else input_pipeline.prepared_info(config.dataset,
                                                          data_dir))
  if chief:
    check_resumable(model_dir, config)
    write_run(model_dir, describe_run(config, info))
  # Every worker writes checkpoints (MultiWorkerMirroredStrategy wants all of
  # them to save), but only the chief's go to model_dir.
  task_type, task_id = cluster_task()
  checkpoint_dir = model_dir if chief else os.path.join(
      model_dir, f".{task_type}{task_id}_tmp")

  with strategy.scope():
    model = build_model(config, info)
    optimizer = build_optimizer(config, info)
    optimizer.build(model.trainable_variables)
  step_counter = optimizer.iterations  # The global step.
  global_batch = config.batch_size

  # The input position is part of the checkpoint where tf.data can save it
  # (one replica per process: a tf.data iterator). Otherwise -- several
  # replicas, or a checkpoint whose iterator no longer fits the pipeline --
  # the pipeline is started at the restored step (`start_step`), which yields
  # exactly what the uninterrupted stream would. Every worker restores the
  # chief's checkpoint.
  latest = tf.train.latest_checkpoint(model_dir)
  restored_step = checkpoint_step(latest) if latest else 0
  custom_input = dataset_fn is not None
  dataset_fn = dataset_fn or _input_fn(config, info, data_dir, config.seed)

  def make_iterator(skip_steps):
    if coordinator is not None:
      # No replay under parameter_server: after a restart the workers start
      # a fresh stream (seeded by the step) instead.
      fn = dataset_fn
      if skip_steps and not custom_input:
        fn = _input_fn(config, info, data_dir, config.seed + skip_steps)
      return iter(coordinator.create_per_worker_dataset(
          lambda: strategy.distribute_datasets_from_function(fn)))
    fn = dataset_fn
    if skip_steps and not custom_input:
      fn = _input_fn(config, info, data_dir, config.seed,
                     start_step=skip_steps)
    return iter(strategy.distribute_datasets_from_function(fn))

  def make_checkpoint(iterator):
    trackables = dict(model=model, optimizer=optimizer)
    if isinstance(iterator, tf.data.Iterator):
      trackables["iterator"] = iterator
    return tf.train.Checkpoint(**trackables)

  iterator = make_iterator(0)
  checkpoint = make_checkpoint(iterator)
  if latest:
    saved_iterator = any(name.startswith("iterator/")
                         for name, _ in tf.train.list_variables(latest))
    try:
      if not (saved_iterator and isinstance(iterator, tf.data.Iterator)):
        raise LookupError("no input position to restore")
      checkpoint.restore(latest).assert_existing_objects_matched()
    except (LookupError, tf.errors.OpError) as e:
      if not isinstance(e, LookupError):
        logging.warning("the input position in %s does not fit this input "
                        "pipeline (%s); replaying the input instead", latest,
                        str(e).splitlines()[0])
      iterator = make_iterator(restored_step)
      checkpoint = make_checkpoint(iterator)
      tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
          latest).expect_partial().assert_existing_objects_matched()
    echo(f"resumed from {latest} at step {int(step_counter.numpy())}")
  manager = tf.train.CheckpointManager(
      checkpoint, checkpoint_dir, max_to_keep=config.keep_checkpoints,
      checkpoint_name=CHECKPOINT_PREFIX)

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
      evaluator = make_evaluator(
          model, config.dataset, data_dir=data_dir,
          batch_size=config.eval_batch_size,
          num_examples=config.num_eval_examples,
          preprocessing=preprocessing(config, info), info=info)
    metrics = evaluator()
    write_eval_summaries(model_dir, step, metrics)
    return metrics

  def save(step):
    if not _all_finite(model.trainable_weights):
      raise NonFiniteLossError(
          f"the weights became NaN or infinite by step {step}; "
          f"{_last_good(manager)}", step=step)
    path = manager.save(checkpoint_number=step)
    return path

  step = int(step_counter.numpy())
  window = np.zeros(3)
  peaks = np.full(2 + len(watched), -np.inf)
  last_peaks = None  # Those of the last progress line: what preceded a NaN.
  window_start = time.time()
  last = {"train_loss": None, "train_top1": None}
  result = {"step": step, **last, "eval": None, "model_dir": model_dir}
  echo(f"training {config.model} on {config.dataset} for "
       f"{config.train_steps} steps, global batch {global_batch}, "
       f"{replicas} replica(s) ({config.strategy}); model_dir {model_dir}")
  with _Preemption() as preemption:
    while step < config.train_steps:
      boundaries = [config.log_steps, config.checkpoint_steps]
      if config.eval_steps:
        boundaries.append(config.eval_steps)
      next_stop = min([config.train_steps, step + config.steps_per_loop] +
                      [(step // b + 1) * b for b in boundaries])
      out = run_steps(next_stop - step)
      step = int(step_counter.numpy())
      if out["first_nonfinite"][0] >= 0 or not math.isfinite(out["sums"][0]):
        first = int(out["first_nonfinite"][0])
        raise NonFiniteLossError(_nonfinite_message(
            out, step, watched, last_peaks, _last_good(manager)),
                                 step=first if first >= 0 else step)
      window += out["sums"]
      peaks = np.maximum(peaks, out["peaks"])
      if step % config.log_steps == 0 or step >= config.train_steps:
        elapsed = time.time() - window_start
        loss, top1 = window[0] / window[2], window[1] / window[2]
        rate = window[2] / max(elapsed, 1e-9)
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        last_peaks = dict(zip(["grad_norm", "update_ratio"], peaks[:2]))
        activation_rms = dict(zip(watched, peaks[2:]))
        echo(json.dumps({
            "step": step, "train_steps": config.train_steps,
            "loss": _round(loss), "top1": _round(top1), "lr": _round(lr),
            "images_per_second": round(rate, 1),
            "grad_norm": _round(peaks[0]), "update_ratio": _round(peaks[1]),
            "activation_rms": {k: _round(v)
                               for k, v in activation_rms.items()}}))
        last_peaks["activation_rms"] = activation_rms
        with writer.as_default():
          write_scalar("loss", loss, step)
          write_scalar("top1", top1, step)
          write_scalar("learning_rate", lr, step)
          write_scalar("images_per_second", rate, step)
          write_scalar("weight_decay_loss", float(
              optimization.l2_penalty(model, config.weight_decay)), step)
          write_scalar("grad_norm", peaks[0], step)
          write_scalar("update_ratio", peaks[1], step)
          for name, value in activation_rms.items():
            write_scalar(f"activation_rms/{name}", value, step)
          for stage, norm in sorted(residual_branch_norms(model).items()):
            write_scalar(f"residual_branch_norm/stage{stage}", norm, step)
        writer.flush()
        last = {"train_loss": float(loss), "train_top1": float(top1)}
        window, window_start = np.zeros(3), time.time()
        peaks = np.full(2 + len(watched), -np.inf)
      if preemption.requested:
        path = save(step)
        raise PreemptedError(
            f"stopped by SIGTERM at step {step}; wrote checkpoint {path}; "
            f"run the same command again to resume")
      if step % config.checkpoint_steps == 0 or step >= config.train_steps:
        path = save(step)
        echo(f"saved checkpoint {path}")
      if chief and config.eval_steps and (
          step % config.eval_steps == 0 or step >= config.train_steps):
        result["eval"] = run_evaluation(step)
        echo(json.dumps({"step": step, "eval": {
            k: v if isinstance(v, int) else _round(v)
            for k, v in result["eval"].items()}}))
        window_start = time.time()  # Images/s counts training only.
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


def _nonfinite_message(out, step, watched, last_peaks, last_good):
  """The one line that stops a diverged run: where and when, and what to do."""
  first_step, index = (int(v) for v in out["first_nonfinite"])
  if first_step < 0:  # Finite activations and gradients, infinite loss.
    where, first_step = "the loss", step
  elif index < len(watched):
    where = f"the activations of {watched[index]}"
  else:
    where = "the gradient"
  before = ""
  if last_peaks:
    rms = ", ".join(f"{k} {v:.3g}"
                    for k, v in last_peaks["activation_rms"].items())
    before = (f"; before it: gradient norm up to "
              f"{last_peaks['grad_norm']:.3g}, activation RMS {rms}")
  return (f"the training loss became {out['sums'][0]} at step {first_step}: "
          f"{where} became NaN or infinite first{before}; {last_good}; lower "
          f"--learning_rate or add a stabiliser (e.g. --grad_clip_norm=1; "
          f"docs/training.md)")


def _last_good(manager):
  latest = manager.latest_checkpoint
  if latest:
    return (f"stopped; the last good checkpoint is {latest} (step "
            f"{checkpoint_step(latest)})")
  return "stopped; no checkpoint was written"
