"""Evaluation: loss and top-1/top-5 accuracy on a dataset's held-out split.

`make_evaluator` is what training evaluates with; `evaluate_run` is what
//bin:evaluate does: a run's checkpoint (or, with `watch`, each new one as
it appears) on its own dataset or another one with the same classes, or on
the training images the run held out; for a batch-norm network, optionally
with its statistics re-estimated on the final weights
(`reestimate_batch_norm_statistics`).
"""

import os

import keras
import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf import model as model_lib
from identity_tf.data import datasets
from identity_tf.data import pipeline
from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import metrics
from identity_tf.training import run as run_lib
from identity_tf.training import shipped


def make_evaluator(model, dataset, info, preprocessing, *, data_dir=None,
                   batch_size=500, num_examples=None, split=None,
                   validation_examples=0, held_out=False):
  """A function () -> `evaluate`'s result for MODEL's current weights.

  Evaluates on the held-out split of DATASET (as --dataset names it), which
  INFO describes (its `datasets.DatasetInfo`), with PREPROCESSING: a run's
  (`run.Run.preprocessing`), or `datasets.preprocessing_config` of another
  dataset for the run's input size. SPLIT (e.g. info.train_split) replaces
  the held-out split: every example once, without augmentation, as the
  evaluation reads its own; VALIDATION_EXAMPLES and HELD_OUT choose the
  examples of it held out for validation or the rest, as
  `pipeline.build_dataset` does. The pipeline is built once (for an in-memory
  dataset: read once), so a training run can evaluate every few steps
  cheaply.
  """
  split = split or info.eval_split
  if split is None:
    raise errors.DataError(f"{dataset} has neither a 'validation' nor a 'test' "
                           "split to evaluate on")
  ds = pipeline.build_dataset(
      dataset, split, batch_size, training=False, data_dir=data_dir,
      num_examples=num_examples, preprocessing=preprocessing,
      validation_examples=validation_examples, held_out=held_out)
  top_k = min(5, info.num_classes)

  @tf.function(autograph=False)  # As `step.make_train_step`'s.
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
      raise errors.DataError(f"the {split} split of {dataset} is empty")
    return {"loss": sums[0] / count, "top1": sums[1] / count,
            "top5": sums[2] / count, "examples": count}
  return run


def evaluate(model, dataset, info, preprocessing, **options):
  """Loss and accuracy of MODEL on DATASET's evaluation split, one pass.

  Returns {"loss": mean cross-entropy (no weight decay), "top1", "top5":
  fractions, "examples": count}. Runs on one device. The arguments are
  `make_evaluator`'s.
  """
  return make_evaluator(model, dataset, info, preprocessing, **options)()


def batch_norm_layers(model):
  """Every `keras.layers.BatchNormalization` in MODEL, units' included."""
  found, stack = [], list(model.layers)
  while stack:
    layer = stack.pop()
    if isinstance(layer, keras.layers.BatchNormalization):
      found.append(layer)
    stack += model_lib.sublayers(layer)
  return found


def reestimate_batch_norm_statistics(model, batches):
  """Precise batch norm (Wu & Johnson, 2021, "Rethinking 'Batch' in
  BatchNorm", Sec. 3.1): sets every batch-norm layer's moving mean and
  variance to the mean over BATCHES (image tensors) of the batch statistics
  it normalises with in training mode, every layer at once on MODEL's
  current weights. Inference then normalises with statistics of the final
  weights, not with exponential averages that lag weights which moved fast
  (large rates, few steps). The variance is the biased batch variance
  Keras's layer keeps in training. Returns how many images were used.

  Raises `errors.ConfigError` if MODEL has no batch norm, `errors.DataError`
  if BATCHES is empty (the statistics are then left as they were).
  """
  norms = batch_norm_layers(model)
  if not norms:
    raise errors.ConfigError(
        "the network has no batch norm: it has no statistics to "
        "re-estimate; leave out --reestimate_batch_norm")
  before = [(n.moving_mean.numpy(), n.moving_variance.numpy()) for n in norms]
  momenta = [n.momentum for n in norms]
  sums = [[np.zeros(n.moving_mean.shape, np.float64),
           np.zeros(n.moving_variance.shape, np.float64)] for n in norms]
  count = images_used = 0
  try:
    # With momentum 0 a training-mode call leaves each layer's moving
    # statistics equal to that batch's: read after every batch and summed.
    for norm in norms:
      norm.momentum = 0.0
    forward = tf.function(lambda images: model(images, training=True),
                          autograph=False)
    for images in batches:
      forward(images)
      for total, norm in zip(sums, norms):
        total[0] += norm.moving_mean.numpy()
        total[1] += norm.moving_variance.numpy()
      count += 1
      images_used += int(tf.shape(images)[0])
  finally:
    for norm, momentum in zip(norms, momenta):
      norm.momentum = momentum
  if not count:
    for norm, (mean, variance) in zip(norms, before):
      norm.moving_mean.assign(mean)
      norm.moving_variance.assign(variance)
    raise errors.DataError("no batch of images to re-estimate batch norm's "
                           "statistics on")
  for norm, (mean, variance) in zip(norms, sums):
    norm.moving_mean.assign(mean / count)
    norm.moving_variance.assign(variance / count)
  return images_used


def evaluate_run(model_dir, *, checkpoint=None, dataset=None, data_dir=None,
                 batch_size=500, num_examples=None, held_out=False,
                 reestimate_batch_norm=0, write_summaries=True,
                 watch=False, watch_timeout=600.0, watch_interval=5.0,
                 emit, note):
  """Evaluates MODEL_DIR's CHECKPOINT (default: the newest intact one).

  DATASET (default: the run's own) may be another dataset with the same
  classes: it is read with its own preprocessing at the model's input
  size (normalised with the model's per-channel statistics if it was
  trained with them, `_other_datasets_preprocessing`). HELD_OUT: the
  training images the run held out (its --validation_examples) instead of
  the evaluation split. REESTIMATE_BATCH_NORM (a number of images): first
  re-estimate the batch-norm statistics (`reestimate_batch_norm_statistics`)
  on that many of the run's training images, the held-out ones left out,
  without augmentation, in batches of the run's --batch_size (rounded down
  to whole batches, at least one); the checkpoint is not changed. EMIT
  receives one dict per evaluation (global_step, dataset, loss, top1, top5,
  examples; with HELD_OUT "split": "validation", with REESTIMATE_BATCH_NORM
  "batch_norm_images": the images it used), NOTE one line per checkpoint
  skipped as damaged.
  WRITE_SUMMARIES records each evaluation in MODEL_DIR (`metrics`). WATCH:
  evaluates every new checkpoint as it appears until training's last step
  is evaluated or none arrives for WATCH_TIMEOUT seconds.
  """
  run = run_lib.read(model_dir, data_dir)  # A clear error if it is no run.
  if shipped.is_shipped(model_dir):
    # A network shipped with the repository: checked against its manifest,
    # and left as it is (its scores are the manifest's to state).
    shipped.verify(model_dir)
    if write_summaries:
      note(f"note: {model_dir} is a shipped model: the result is not "
           "recorded in it")
    write_summaries = False
  evaluate_checkpoint = _checkpoint_evaluator(
      run, dataset, batch_size, num_examples, write_summaries, emit, note,
      held_out=held_out, reestimate_batch_norm=reestimate_batch_norm)
  if not watch:
    evaluate_checkpoint(checkpoints.find_checkpoint(
        model_dir, checkpoint,
        echo=lambda line: note(f"note: {line}; skipped")))
    return
  for path in tf.train.checkpoints_iterator(
      model_dir, min_interval_secs=watch_interval, timeout=watch_timeout):
    reason = checkpoints.damage(path)
    if reason:  # Rotated away by training meanwhile, or damaged.
      note(f"note: {os.path.basename(path)}: {reason}; skipped")
      continue
    if evaluate_checkpoint(path) >= run.config.train_steps:
      break


def _other_datasets_preprocessing(info, trained):
  """The preprocessing of dataset INFO's images for a model trained with
  preprocessing TRAINED: INFO's own at the model's input size, but with
  the per-channel mean and std the model was trained with where both are
  CIFAR-sized (--standardize=per_channel: those numbers are part of the
  model's input, as its export applies them to any image)."""
  size = trained.image_size
  if (trained.kind == "cifar" and trained.standardize == "per_channel" and
      datasets.preprocessing_kind(info, size) == "cifar"):
    return datasets.preprocessing_config(
        info, size, standardize="per_channel",
        statistics=(trained.mean, trained.std))
  return datasets.preprocessing_config(info, size)


def _reestimation_batches(run, images):
  """The batches `evaluate_run` re-estimates RUN's batch-norm statistics
  on: IMAGES of its training images (a whole number of its --batch_size,
  at least one), the held-out ones left out, without augmentation."""
  config = run.config
  if not run.model_options.norm:
    raise errors.ConfigError(
        f"--reestimate_batch_norm: the network of {run.model_dir} has no "
        "batch norm, so no statistics to re-estimate; leave the flag out")
  batches = max(1, images // config.batch_size)
  ds = pipeline.build_dataset(
      config.dataset, run.dataset.train_split, config.batch_size,
      training=False, data_dir=run.data_dir,
      num_examples=config.num_train_examples,
      preprocessing=run.preprocessing,
      validation_examples=config.validation_examples)
  return ds.take(batches).map(lambda images, labels: images)


def _checkpoint_evaluator(run, dataset, batch_size, num_examples,
                          write_summaries, emit, note, held_out=False,
                          reestimate_batch_norm=0):
  """A function (checkpoint path, already verified) -> its global step,
  which evaluates the checkpoint and EMITs the result, then records it in
  the run (WRITE_SUMMARIES): a run it cannot write to (read-only, a full
  disk) still gets its result, and NOTE one line saying it was not
  recorded. HELD_OUT and REESTIMATE_BATCH_NORM as `evaluate_run`'s."""
  trained = run.dataset.name if run.dataset else run.config.dataset
  dataset = dataset or trained
  held = run.config.validation_examples
  if held_out and dataset != trained:
    raise errors.ConfigError(
        f"--held_out evaluates the training images {run.model_dir} held "
        f"out of {trained}: leave out --dataset={dataset}, or --held_out")
  if held_out and not held:
    raise errors.ConfigError(
        f"--held_out: {run.model_dir} held out no training images "
        "(--validation_examples=0); evaluate the evaluation split without "
        "--held_out")
  reestimation = (_reestimation_batches(run, reestimate_batch_norm)
                  if reestimate_batch_norm else None)
  # The model's own dataset and preprocessing; on another dataset, its
  # preprocessing for the model's input size.
  info, preprocessing = run.dataset, run.preprocessing
  if dataset != trained or info is None:  # None: config.json predates it.
    info = tfds_data.dataset_info(dataset, run.data_dir)
  if dataset != trained:
    classes = run.model_options.classes
    if info.num_classes != classes:
      raise errors.DataError(
          f"--dataset={dataset} has {info.num_classes} classes; the model "
          f"was trained for the {classes} of {trained}")
    preprocessing = _other_datasets_preprocessing(info, preprocessing)

  # What the scores are of, beyond the default (the evaluation split, the
  # moving statistics): said in the result and its record.
  variant = {}
  if held_out:
    variant["split"] = metrics.VALIDATION
  # Their TensorBoard directory, beside eval/: one curve per kind of score.
  board = "_".join([metrics.EVAL_DIR] + (["validation"] if held_out else [])
                   + (["bn_reestimated"] if reestimate_batch_norm else []))
  options = dict(split=info.train_split, validation_examples=held,
                 held_out=True) if held_out else {}

  def evaluate_checkpoint(path):
    model, _, step = checkpoints.restore_checkpoint(run.model_dir, path)
    if reestimation is not None:
      variant["batch_norm_images"] = reestimate_batch_norm_statistics(
          model, reestimation)
    scores = evaluate(model, dataset, info, preprocessing,
                      data_dir=run.data_dir, batch_size=batch_size,
                      num_examples=num_examples, **options)
    emit({"global_step": step, "dataset": dataset, **scores, **variant})
    if write_summaries:
      try:
        with metrics.MetricsWriter(run.model_dir) as writer:
          writer.evaluation(step, scores, kind=board,
                            source=metrics.EVALUATE_SOURCE, dataset=dataset,
                            **variant)
      except (OSError, tf.errors.OpError) as e:
        reason = (getattr(e, "strerror", None) or
                  (str(e).splitlines() or [type(e).__name__])[0])
        note(f"note: the result above is not recorded in --model_dir="
             f"{run.model_dir} (metrics.jsonl, eval/): {reason}; make it "
             "writable and evaluate again to record it, or pass "
             "--nowrite_summaries")
    return step
  return evaluate_checkpoint
