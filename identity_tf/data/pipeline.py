"""Input pipelines: tf.data batches of any dataset, for training and evaluation.

`build_dataset(name, split, batch_size, training=...)` returns a `tf.data`
pipeline of (images float32 [batch, S, S, 3], labels int32 [batch]) batches
for the network's input size S, reading `synthetic` (in memory) or a
prepared TFDS dataset (`tfds_data`) and preprocessing it as
`datasets.preprocessing_config` says (`preprocessing`).

Determinism. Every random choice -- the order of the examples in an epoch and
every augmentation -- is computed with stateless random ops from
(seed, example index, epoch), never from a random state. With
`deterministic=True` tf.data also keeps the element order of its parallel
maps, so two runs yield identical batches and a checkpointed iterator
(`tf.train.Checkpoint(iterator=iter(ds))`) resumes exactly where it stopped.

"cifar"-style datasets are held in memory and shuffled globally: the i-th
element of epoch e is example `index_shuffle(i, seed, epoch)`, so
`start_step` resumes a pipeline at any step for free. "imagenet"-style ones
stream from TFDS's files (shuffled file order plus a shuffle buffer) and
identify each example by its TFDS id.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf.data import datasets
from identity_tf.data import preprocessing as prep
from identity_tf.data import synthetic
from identity_tf.data import tfds_data

# Shuffle buffer (in examples) of the streaming path; it holds encoded images
# (~110 kB each for ImageNet) and is saved with iterator checkpoints (~60 MB);
# TFDS already shuffled the examples when preparing and the file order is
# reshuffled every epoch.
_IMAGENET_SHUFFLE_BUFFER = 512

# Every map function as written, without AutoGraph (which tf.data applies by
# default): none branches on a tensor in Python, and converting them cost
# every run's start a fraction of a second.
_NOT_CONVERTED = tf.autograph.experimental.do_not_convert


def _shard_layout(input_context, batch_size):
  """(pipeline id, pipelines, replicas per pipeline, global batch)."""
  if input_context is None:
    return 0, 1, 1, batch_size
  pipelines = input_context.num_input_pipelines
  # Asynchronous (parameter-server) training has fewer replicas in sync than
  # pipelines; each pipeline then feeds one replica.
  per_pipeline = max(1, input_context.num_replicas_in_sync // pipelines)
  return (input_context.input_pipeline_id, pipelines, per_pipeline,
          batch_size * per_pipeline * pipelines)


def _options(deterministic):
  options = tf.data.Options()
  options.deterministic = bool(deterministic)
  options.experimental_optimization.map_parallelization = True
  # Not tf.data's symbolic checkpointing, although it would shrink iterator
  # checkpoints to a few counters: with it, `dataset.skip(n)` takes time
  # quadratic in n (TF 2.21; 50 batches of 128: 4 minutes instead of 4 s).
  # `start_step` is the fast way to skip.
  options.experimental_symbolic_checkpoint = False
  return options


def _in_memory_dataset(images, labels, batch_size, preprocessing, *, training,
                       seed, input_context, start_step):
  """Batches from arrays held in memory, globally shuffled per epoch.

  Training: an infinite stream in which global position g (over all
  pipelines; replica r of step t holds positions t*B + r*b .. t*B + r*b + b-1
  for per-replica batch b and global batch B) is example
  index_shuffle(g mod N; seed, epoch = g div N). Each pipeline computes only
  its replicas' positions, so every step of a multi-pipeline run sees
  exactly the examples and augmentations of a single-pipeline run with the
  same global batch. Evaluation: each pipeline takes a contiguous 1/P of the
  examples in order.
  """
  count = len(labels)
  images = tf.constant(images)
  labels = tf.constant(labels, tf.int32)
  pipeline, pipelines, per_pipeline, global_batch = _shard_layout(
      input_context, batch_size)

  if not training:
    start = pipeline * count // pipelines
    stop = (pipeline + 1) * count // pipelines
    ds = tf.data.Dataset.range(start, stop).batch(batch_size)
    return ds.map(
        _NOT_CONVERTED(lambda indices: (
            prep.preprocess_for_eval(tf.gather(images, indices),
                                     preprocessing),
            tf.gather(labels, indices))),
        num_parallel_calls=tf.data.AUTOTUNE)

  if count < global_batch:
    raise errors.DataError(
        f"training needs at least one global batch ({global_batch} examples)"
        f" but the dataset has {count}; lower --batch_size or raise "
        "num_examples")
  local_batch_span = batch_size * per_pipeline

  def example(local_position):
    step = local_position // local_batch_span
    within = local_position % local_batch_span  # Replica-major.
    position = (step * global_batch + pipeline * local_batch_span + within)
    epoch = position // count
    index = tf.random.experimental.index_shuffle(
        position % count,
        tf.random.experimental.stateless_fold_in(
            tf.constant([seed, 0x5EED], tf.int64), epoch),
        count - 1)
    seeds = prep.example_seeds(seed, index, epoch, 2)
    image = prep.augment_cifar(tf.gather(images, index), preprocessing,
                               seeds)
    return image, tf.gather(labels, index)

  # Resuming at START_STEP costs nothing: positions are computed, not read.
  ds = tf.data.Dataset.counter(start=start_step * local_batch_span,
                               dtype=tf.int64)
  ds = ds.map(_NOT_CONVERTED(example), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch_size, drop_remainder=True)


def _streaming_dataset(builder, split, batch_size, preprocessing, *,
                       training, seed, input_context, stop, start_step, jpeg):
  """Batches streamed from TFDS files (ImageNet and other large images).

  JPEG files stay encoded until augmentation decodes only the crop window;
  other encodings are decoded by TFDS.
  """
  tfds = tfds_data.tfds_module()
  pipeline, pipelines, per_pipeline, _ = _shard_layout(input_context,
                                                       batch_size)
  # Disjoint, contiguous example ranges per pipeline: TFDS reads only the
  # files (and records) of its own range.
  start = pipeline * stop // pipelines
  end = (pipeline + 1) * stop // pipelines
  if end <= start:
    raise errors.DataError(
        f"{split} has {stop} examples, too few for {pipelines} input "
        "pipelines; use more examples or fewer workers")
  read_config = tfds.ReadConfig(
      shuffle_seed=seed, add_tfds_id=True,
      shuffle_reshuffle_each_iteration=True)
  ds = builder.as_dataset(
      split=f"{split}[{start}:{end}]", shuffle_files=training,
      read_config=read_config,
      decoders=({tfds_data.IMAGE: tfds.decode.SkipDecoding()} if jpeg
                else None))
  length = end - start

  if not training:
    ds = ds.map(_NOT_CONVERTED(
        lambda ex: (prep.eval_one(ex[tfds_data.IMAGE], preprocessing),
                    tf.cast(ex[tfds_data.LABEL], tf.int32))),
                num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch_size, drop_remainder=False)

  # The example's identity for its augmentation seed: a hash of its TFDS id
  # ("<file>__<record>"), which does not depend on the read order.
  ds = ds.map(_NOT_CONVERTED(
      lambda ex: (ex[tfds_data.IMAGE], tf.cast(ex[tfds_data.LABEL], tf.int32),
                  tf.strings.to_hash_bucket_fast(ex["tfds_id"], 2**62))))
  ds = ds.repeat().enumerate()
  ds = ds.map(_NOT_CONVERTED(lambda position, ex: (*ex, position // length)))
  ds = ds.shuffle(_IMAGENET_SHUFFLE_BUFFER, seed=seed,
                  reshuffle_each_iteration=True)
  if start_step:
    # Skips the encoded examples before the expensive decoding: reads (and
    # shuffles) them again, but does not decode or augment them.
    ds = ds.skip(start_step * per_pipeline * batch_size)

  def example(image, label, index, epoch):
    seeds = prep.example_seeds(seed, index, epoch, 2)
    return prep.augment_imagenet(image, preprocessing, seeds), label

  ds = ds.map(_NOT_CONVERTED(example), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch_size, drop_remainder=True)


def build_dataset(name, split, batch_size, *, training, data_dir=None, seed=0,
                  deterministic=False, input_context=None,
                  num_examples=None, preprocessing=None, start_step=0,
                  validation_examples=0, held_out=False):
  """The input pipeline of dataset NAME, split SPLIT.

  Args:
    name: `synthetic` or a TFDS image-classification dataset.
    split: a split of the dataset, e.g. `dataset_info(name).train_split`.
    batch_size: examples per batch *per replica* (the pipeline serves the
      replicas of `input_context`).
    training: True: augmentation, shuffling, endless repetition, full batches
      only. False: evaluation preprocessing, one pass in order, the final
      partial batch kept.
    data_dir: TFDS data directory (None: TFDS's default). Not used by
      `synthetic`.
    seed: seeds the shuffling and every augmentation.
    deterministic: tf.data keeps the element order of parallel maps, so
      identical arguments give identical batches and a restored iterator
      replays exactly. Augmentation is always a pure function of (seed,
      example index, epoch); this flag only gives up some parallel speed.
      Evaluation pipelines are always deterministic.
    input_context: a `tf.distribute.InputContext` (from
      `distribute_datasets_from_function`); the pipeline reads only its shard.
    num_examples: use only the first NUM_EXAMPLES examples of the split
      (of its part that VALIDATION_EXAMPLES leaves, if set).
    preprocessing: a `datasets.Preprocessing`: a run's
      (`run.Run.preprocessing`, for the network's input size), which is
      what training, evaluation and the benchmark pass. None: the
      dataset's own at its native size.
    start_step: training only: start as if START_STEP steps (global batches)
      had already been taken, yielding exactly what the uninterrupted pipeline
      yields from there (with deterministic=True). A way to resume the input
      position without an iterator checkpoint, e.g. under strategies whose
      distributed iterators cannot be checkpointed. Free for in-memory
      ("cifar") datasets; streamed ones re-read (without decoding) the
      skipped examples.
    validation_examples: hold out this many examples of SPLIT
      (`datasets.held_out`: the same for every seed): the pipeline reads the
      rest, or with HELD_OUT only them. In-memory ("cifar") datasets only.
    held_out: read the held-out examples (a validation set) instead of the
      rest.

  Returns:
    A `tf.data.Dataset` of (images float32 [batch_size, S, S, 3], labels
    int32 [batch_size]) with S the preprocessing's image_size. Its iterators
    are checkpointable.

  Raises:
    DatasetNotReadyError: a TFDS dataset is not prepared in DATA_DIR.
    ValueError: any other bad argument.
  """
  _check_arguments(batch_size, num_examples, start_step, training)
  # Data loading runs eagerly even when called while tracing a tf.function
  # (as ParameterServerStrategy does with per-worker datasets).
  with tf.init_scope():
    source = _read_split(name, split, data_dir, num_examples, preprocessing,
                         validation_examples, held_out)
  if source.preprocessing.kind == "cifar":
    ds = _in_memory_dataset(source.images, source.labels, batch_size,
                            source.preprocessing, training=training,
                            seed=int(seed), input_context=input_context,
                            start_step=int(start_step))
  else:
    ds = _streaming_dataset(source.builder, split, batch_size,
                            source.preprocessing, training=training,
                            seed=int(seed), input_context=input_context,
                            stop=source.stop, start_step=int(start_step),
                            jpeg=source.jpeg)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  # Evaluation always keeps its order (and its final partial batch last);
  # only training may trade order for speed.
  return ds.with_options(_options(deterministic or not training))


def _check_arguments(batch_size, num_examples, start_step, training):
  """ValueError (one line) for `build_dataset` arguments of the wrong kind."""
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise errors.DataError(f"batch_size must be a positive integer, got "
                           f"{batch_size!r}")
  if num_examples is not None and (
      not isinstance(num_examples, (int, np.integer)) or num_examples < 1):
    raise errors.DataError(
        f"num_examples must be a positive integer or None, got "
        f"{num_examples!r}")
  if not isinstance(start_step, (int, np.integer)) or start_step < 0 or (
      start_step and not training):
    raise errors.DataError(
        f"start_step must be a non-negative integer, and 0 unless training; "
        f"got {start_step!r} with training={training}")


@dataclasses.dataclass(frozen=True)
class _Split:
  """What a pipeline reads: the first STOP examples of a split, held in
  memory (IMAGES, LABELS) for "cifar" PREPROCESSING, else streamed from
  TFDS's BUILDER (JPEG: encoded JPEG files)."""
  preprocessing: datasets.Preprocessing
  stop: int
  builder: object = None
  jpeg: bool = False
  images: np.ndarray = None
  labels: np.ndarray = None


def _read_split(name, split, data_dir, num_examples, preprocessing,
                validation_examples=0, held_out=False):
  """The `_Split` of dataset NAME: its first NUM_EXAMPLES (None: all) of
  SPLIT with PREPROCESSING (None: the dataset's own at its native size),
  checked to fit its images; with VALIDATION_EXAMPLES, of the examples
  `datasets.held_out` leaves for training (HELD_OUT: of those it holds
  out)."""
  if name == datasets.SYNTHETIC:
    info, builder = datasets.synthetic_info(), None
    if split not in (info.train_split, info.eval_split):
      raise errors.DataError(
          f"unknown split {split!r} of {name}; valid: {info.train_split}, "
          f"{info.eval_split}")
    size = len(synthetic.arrays(split)[1])
  else:
    builder = tfds_data.prepared_builder(name, data_dir, split)
    info = tfds_data.info_from_builder(builder)
    size = builder.info.splits[split].num_examples
  preprocessing = preprocessing or datasets.preprocessing_config(info)
  datasets.check_fits(preprocessing, info)
  if validation_examples:
    if preprocessing.kind != "cifar":
      raise errors.DataError(
          f"--validation_examples holds out images of datasets held in "
          f"memory (fixed-size images up to the network's input); "
          f"{name}'s are streamed: hold out a split with TFDS's split "
          "slicing instead, or leave --validation_examples at 0")
    validation, training = datasets.held_out(size, validation_examples)
    chosen = np.asarray(validation if held_out else training, np.int64)
    chosen = chosen[:num_examples]
    images, labels = _arrays(builder, split, size, info)
    return _Split(preprocessing, len(chosen), builder, info.jpeg,
                  images[chosen], labels[chosen])
  stop = size if num_examples is None else min(num_examples, size)
  if preprocessing.kind != "cifar":
    return _Split(preprocessing, stop, builder, jpeg=info.jpeg)
  images, labels = _arrays(builder, split, stop, info)
  return _Split(preprocessing, stop, builder, info.jpeg, images, labels)


def _arrays(builder, split, stop, info):
  """The first STOP images and labels of SPLIT, in memory: the synthetic
  dataset's (BUILDER None) or TFDS's."""
  if builder is None:
    return tuple(a[:stop] for a in synthetic.arrays(split))
  return tfds_data.tfds_arrays(builder, split, stop, info.image_shape)
