"""Evaluation: loss and top-1/top-5 accuracy on a dataset's held-out split."""

import keras
import numpy as np
import tensorflow as tf

from identity_tf import input_pipeline
from identity_tf import tfds_data


def make_evaluator(model, dataset, *, data_dir=None, batch_size=500,
                   num_examples=None, preprocessing=None, info=None):
  """A function () -> `evaluate`'s result for MODEL's current weights.

  The evaluation pipeline is built once (for an in-memory dataset: read
  once), so a training run can evaluate every few steps cheaply. INFO is
  DATASET's `datasets.DatasetInfo` if the caller has it.
  """
  info = info or tfds_data.dataset_info(dataset, data_dir)
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
