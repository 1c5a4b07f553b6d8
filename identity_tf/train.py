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

CONFIG_FILE = "config.json"
CHECKPOINT_PREFIX = "ckpt"
# Exit status of a run stopped by SIGTERM after writing its checkpoint: the
# shell's convention for "terminated by signal 15", so supervisors see an
# interrupted (not a finished, not a failed) run.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM


class NonFiniteLossError(ValueError):
  """The training loss became NaN or infinite; the run was stopped."""


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

def model_options(config):
  """`identity_tf.build_model` options of CONFIG (classes from the dataset)."""
  info = input_pipeline.dataset_info(config.dataset)
  units = config.units
  if units is not None:  # --units=2 means 2 in every stage.
    units = units[0] if len(units) == 1 else list(units)
  return dict(classes=info.num_classes, width=config.width, units=units,
              norm=config.norm, head=config.head, init=config.init,
              seed=config.seed, image_size=info.image_size,
              use_bias=config.use_bias)


def describe_run(config, **extra):
  """config.json's content: CONFIG and what rebuilding the model needs."""
  info = input_pipeline.dataset_info(config.dataset)
  return {
      "config": configs.to_dict(config),
      "model": {"name": config.model, "options": model_options(config)},
      "dataset": {"name": info.name, "num_classes": info.num_classes,
                  "image_size": info.image_size,
                  "train_split": info.train_split,
                  "eval_split": info.eval_split},
      "preprocessing": input_pipeline.preprocessing_config(config.dataset),
      "steps_per_epoch": steps_per_epoch(config),
      **extra,
  }


def build_model(config):
  return model_lib.build_model(config.model, **model_options(config))


def steps_per_epoch(config):
  examples = (config.num_train_examples or
              input_pipeline.dataset_info(config.dataset).num_train_examples)
  return examples / config.batch_size


def learning_rate_schedule(config):
  """The learning rate as a function of the step (Keras schedule or float).

  piecewise: learning_rate, multiplied by lr_decay_factor at each of
    lr_boundaries (Section 4.1: 0.05, /10 at 30k and 50k steps).
  exponential: learning_rate * lr_decay_factor ** floor(step / (lr_decay_epochs
    epochs)) (Section 4.2: 0.1 * 0.94 every 2 epochs).
  constant: learning_rate.
  """
  rate = config.learning_rate
  if config.lr_schedule == "piecewise" and config.lr_boundaries:
    values = [rate * config.lr_decay_factor ** i
              for i in range(len(config.lr_boundaries) + 1)]
    return keras.optimizers.schedules.PiecewiseConstantDecay(
        list(config.lr_boundaries), values)
  if config.lr_schedule == "exponential":
    return keras.optimizers.schedules.ExponentialDecay(
        rate, decay_steps=max(1, round(config.lr_decay_epochs *
                                       steps_per_epoch(config))),
        decay_rate=config.lr_decay_factor, staircase=True)
  return rate


def build_optimizer(config):
  """SGD with momentum; weight decay is not the optimizer's: `l2_penalty`."""
  return keras.optimizers.SGD(learning_rate=learning_rate_schedule(config),
                              momentum=config.momentum)


def convolution_kernels(model):
  """The trainable convolution kernels (rank 4), which weight decay decays."""
  return [w for w in model.trainable_weights if len(w.shape) == 4]


def l2_penalty(model, weight_decay):
  """weight_decay * sum over convolution kernels W of ||W||_F^2 / 2.

  Weight decay as an L2 term added to the loss, as the 2016 tensorflow/models
  resnet (which the paper's code derives from) does with tf.nn.l2_loss: its
  gradient weight_decay * W goes through the momentum like the data gradient.
  Only convolution kernels are decayed (Section 4.1: "All convolutional
  weights are trained with weight decay"); biases, if any, are not, and the
  frozen projection is not trained at all. We do not use the optimizer's
  decoupled `weight_decay` (AdamW-style w -= lr * wd * w outside the
  momentum): with momentum 0.9 it is a different, roughly 10x weaker,
  regulariser than the paper's.
  """
  kernels = convolution_kernels(model)
  if not weight_decay or not kernels:
    return tf.constant(0.0)
  return weight_decay * tf.add_n([tf.nn.l2_loss(k) for k in kernels])


def residual_branch_norms(model):
  """{stage number: max over the stage's units of ||C2||_2}.

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

def evaluate(model, dataset, *, data_dir=None, batch_size=500,
             num_examples=None, preprocessing=None):
  """Loss and accuracy of MODEL on DATASET's evaluation split, one pass.

  Returns {"loss": mean cross-entropy (no weight decay), "top1", "top5":
  fractions, "examples": count}. Runs on one device.
  """
  info = input_pipeline.dataset_info(dataset)
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

  sums = np.zeros(4, np.float64)
  for images, labels in ds:
    sums += batch_sums(images, labels).numpy()
  count = int(sums[3])
  if count == 0:
    raise ValueError(f"the {info.eval_split} split of {dataset} is empty")
  return {"loss": sums[0] / count, "top1": sums[1] / count,
          "top5": sums[2] / count, "examples": count}


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


def _input_fn(config, data_dir, seed, start_step=0):
  """The training dataset_fn, starting START_STEP global steps in.

  The pipeline's stream is a deterministic function of (seed, position), so
  starting it at a step replays exactly what an uninterrupted run reads
  from there on (free for CIFAR and synthetic).
  """
  info = input_pipeline.dataset_info(config.dataset)

  def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(config.batch_size)
    return input_pipeline.build_dataset(
        config.dataset, info.train_split, batch, training=True,
        data_dir=data_dir, seed=seed, deterministic=config.deterministic,
        input_context=input_context, num_examples=config.num_train_examples,
        start_step=start_step)
  return dataset_fn


def make_train_step(strategy, model, optimizer, config):
  """The training step of `train`: a tf.function (iterator, num_steps) -> sums.

  Each of NUM_STEPS steps takes next(ITERATOR) (a distributed iterator of
  STRATEGY's per-replica (images, labels) batches) and, on every replica,
  applies OPTIMIZER to MODEL's gradient of the cross-entropy averaged over
  the global batch (config.batch_size) plus `l2_penalty(model,
  config.weight_decay)`. Returns the sums over the steps and replicas of
  [per-example loss, correct top-1 predictions, examples]. `train` runs this
  function (scheduled through a ClusterCoordinator under parameter_server);
  bin/benchmark times it.
  """
  global_batch = config.batch_size

  def replica_step(images, labels):
    with tf.GradientTape() as tape:
      logits = model(images, training=True)
      per_example = keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True)
      # Mean over the global batch: the optimizer sums the replicas'
      # gradients.
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=global_batch)
      total = loss + tf.nn.scale_regularization_loss(
          l2_penalty(model, config.weight_decay))
    gradients = tape.gradient(total, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32),
                               labels), tf.float32)
    return tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(correct),
                     tf.cast(tf.size(labels), tf.float32)])

  @tf.function
  def train_steps(iterator, num_steps):
    sums = tf.zeros([3])
    for _ in tf.range(num_steps):
      per_replica = strategy.run(replica_step, args=next(iterator))
      sums += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                              axis=None)
    return sums
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
  if chief:
    check_resumable(model_dir, config)
    write_run(model_dir, describe_run(config))
  # Every worker writes checkpoints (MultiWorkerMirroredStrategy wants all of
  # them to save), but only the chief's go to model_dir.
  task_type, task_id = cluster_task()
  checkpoint_dir = model_dir if chief else os.path.join(
      model_dir, f".{task_type}{task_id}_tmp")

  with strategy.scope():
    model = build_model(config)
    optimizer = build_optimizer(config)
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
  dataset_fn = dataset_fn or _input_fn(config, data_dir, config.seed)

  def make_iterator(skip_steps):
    if coordinator is not None:
      # No replay under parameter_server: after a restart the workers start
      # a fresh stream (seeded by the step) instead.
      fn = dataset_fn
      if skip_steps and not custom_input:
        fn = _input_fn(config, data_dir, config.seed + skip_steps)
      return iter(coordinator.create_per_worker_dataset(
          lambda: strategy.distribute_datasets_from_function(fn)))
    fn = dataset_fn
    if skip_steps and not custom_input:
      fn = _input_fn(config, data_dir, config.seed, start_step=skip_steps)
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

  def run_steps(num_steps):
    """Runs NUM_STEPS steps; returns (loss sum, correct, examples)."""
    if coordinator is None:
      return train_steps(iterator, tf.constant(num_steps)).numpy()
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
    return np.sum([r.fetch() for r in results], axis=0)

  writer = (tf.summary.create_file_writer(os.path.join(model_dir, "train"))
            if chief else tf.summary.create_noop_writer())

  def save(step):
    if not _all_finite(model.trainable_weights):
      raise NonFiniteLossError(
          f"the weights became NaN or infinite by step {step}; "
          f"{_last_good(manager)}")
    path = manager.save(checkpoint_number=step)
    return path

  step = int(step_counter.numpy())
  window = np.zeros(3)
  window_start = time.time()
  last = {"train_loss": None, "train_top1": None}
  echo(f"training {config.model} on {config.dataset} for "
       f"{config.train_steps} steps, global batch {global_batch}, "
       f"{replicas} replica(s) ({config.strategy}); model_dir {model_dir}")
  with _Preemption() as preemption:
    while step < config.train_steps:
      next_stop = min(config.train_steps,
                      step + config.steps_per_loop,
                      (step // config.log_steps + 1) * config.log_steps,
                      (step // config.checkpoint_steps + 1) *
                      config.checkpoint_steps)
      sums = run_steps(next_stop - step)
      step = int(step_counter.numpy())
      if not math.isfinite(sums[0]):
        raise NonFiniteLossError(
            f"the training loss became {sums[0]} by step {step}; "
            f"{_last_good(manager)}; lower --learning_rate")
      window += sums
      if step % config.log_steps == 0 or step >= config.train_steps:
        elapsed = time.time() - window_start
        loss, top1 = window[0] / window[2], window[1] / window[2]
        rate = window[2] / max(elapsed, 1e-9)
        lr = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        norms = residual_branch_norms(model)
        echo(f"step {step}/{config.train_steps}  loss {loss:.4f}  top-1 "
             f"{top1:.4f}  lr {lr:.4g}  {rate:.1f} images/s")
        with writer.as_default():
          write_scalar("loss", loss, step)
          write_scalar("top1", top1, step)
          write_scalar("learning_rate", lr, step)
          write_scalar("images_per_second", rate, step)
          write_scalar("weight_decay_loss",
                       float(l2_penalty(model, config.weight_decay)), step)
          for stage, norm in sorted(norms.items()):
            write_scalar(f"residual_branch_norm/stage{stage}", norm, step)
        writer.flush()
        last = {"train_loss": float(loss), "train_top1": float(top1)}
        window, window_start = np.zeros(3), time.time()
      if preemption.requested:
        path = save(step)
        raise PreemptedError(
            f"stopped by SIGTERM at step {step}; wrote checkpoint {path}; "
            f"run the same command again to resume")
      if step % config.checkpoint_steps == 0 or step >= config.train_steps:
        path = save(step)
        echo(f"saved checkpoint {path}")
  if not chief:
    tf.io.gfile.rmtree(checkpoint_dir)
  result = {"step": step, **last, "eval": None, "model_dir": model_dir}
  if config.eval_at_end and chief:
    result["eval"] = evaluate(
        model, config.dataset, data_dir=data_dir,
        batch_size=config.eval_batch_size,
        num_examples=config.num_eval_examples)
    write_eval_summaries(model_dir, step, result["eval"])
  return result


def _last_good(manager):
  latest = manager.latest_checkpoint
  if latest:
    return (f"stopped; the last good checkpoint is {latest} (step "
            f"{checkpoint_step(latest)})")
  return "stopped; no checkpoint was written"
