"""Evaluation: loss and top-1/top-5 accuracy on a dataset's held-out split.

`make_evaluator` is what training evaluates with; `evaluate_run` is what
//bin:evaluate does: a run's checkpoint (or, with `watch`, each new one as
it appears) on its own dataset or another one with the same classes.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from identity_tf import errors
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


def evaluate_run(model_dir, *, checkpoint=None, dataset=None, data_dir=None,
                 batch_size=500, num_examples=None, write_summaries=True,
                 watch=False, watch_timeout=600.0, watch_interval=5.0,
                 emit, note):
  """Evaluates MODEL_DIR's CHECKPOINT (default: the newest intact one).

  DATASET (default: the run's own) may be another dataset with the same
  classes: it is read with its own preprocessing at the model's input
  size (normalised with the model's per-channel statistics if it was
  trained with them, `_other_datasets_preprocessing`). EMIT receives one
  dict per evaluation (global_step, dataset, loss, top1, top5, examples),
  NOTE one line per checkpoint skipped as damaged.
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
      run, dataset, batch_size, num_examples, write_summaries, emit, note)
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


def _checkpoint_evaluator(run, dataset, batch_size, num_examples,
                          write_summaries, emit, note):
  """A function (checkpoint path, already verified) -> its global step,
  which evaluates the checkpoint and EMITs the result, then records it in
  the run (WRITE_SUMMARIES): a run it cannot write to (read-only, a full
  disk) still gets its result, and NOTE one line saying it was not
  recorded."""
  trained = run.dataset.name if run.dataset else run.config.dataset
  dataset = dataset or trained
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

  def evaluate_checkpoint(path):
    model, _, step = checkpoints.restore_checkpoint(run.model_dir, path)
    scores = evaluate(model, dataset, info, preprocessing,
                      data_dir=run.data_dir, batch_size=batch_size,
                      num_examples=num_examples)
    emit({"global_step": step, "dataset": dataset, **scores})
    if write_summaries:
      try:
        with metrics.MetricsWriter(run.model_dir) as writer:
          writer.evaluation(step, scores, source=metrics.EVALUATE_SOURCE,
                            dataset=dataset)
      except (OSError, tf.errors.OpError) as e:
        reason = (getattr(e, "strerror", None) or
                  (str(e).splitlines() or [type(e).__name__])[0])
        note(f"note: the result above is not recorded in --model_dir="
             f"{run.model_dir} (metrics.jsonl, eval/): {reason}; make it "
             "writable and evaluate again to record it, or pass "
             "--nowrite_summaries")
    return step
  return evaluate_checkpoint
