"""Evaluates a training run's checkpoint; prints one JSON object on stdout.

    bazel run //bin:evaluate -- --model_dir=runs/smoke
    bazel run //bin:evaluate -- --model_dir=runs/c10 --checkpoint=30000
    bazel run //bin:evaluate -- --model_dir=runs/c10 --watch

The object has global_step, loss (mean cross-entropy, without weight decay),
top1, top5 (fractions) and examples. With --watch, every new checkpoint is
evaluated as it appears (one JSON object per line) until training's last
step is evaluated or no new checkpoint arrives for --watch_timeout seconds,
like the eval mode of the 2016 tensorflow/models resnet. Scores also go to
MODEL_DIR/eval as TensorBoard scalars. Logs go to stderr.
"""

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging

from identity_tf import cli
from identity_tf import paths

FLAGS = flags.FLAGS

flags.DEFINE_string("model_dir", None,
                    "The training run's directory (holds config.json).")
flags.DEFINE_string("dataset", None,
                    "Dataset to evaluate on (default: the run's).")
flags.DEFINE_string("data_dir", None, "TFDS data directory.")
flags.DEFINE_string("checkpoint", None,
                    "A step, ckpt-<step> or a checkpoint path prefix "
                    "(default: the latest).")
flags.DEFINE_integer("batch_size", 500, "Evaluation batch size.",
                     lower_bound=1)
flags.DEFINE_integer("num_examples", None,
                     "Evaluate on the first N examples only (default: all).",
                     lower_bound=1)
flags.DEFINE_boolean("watch", False,
                     "Evaluate every new checkpoint as it appears.")
flags.DEFINE_float("watch_timeout", 600.0,
                   "--watch: stop after this many seconds without a new "
                   "checkpoint.", lower_bound=1e-3)
flags.DEFINE_float("watch_interval", 5.0,
                   "--watch: seconds between looks for a new checkpoint.",
                   lower_bound=1e-3)
flags.DEFINE_boolean("write_summaries", True,
                     "Write the scores to MODEL_DIR/eval for TensorBoard.")
flags.mark_flag_as_required("model_dir")
flags.register_multi_flags_validator(
    ["watch", "checkpoint"], lambda values: not (values["watch"] and
                                                 values["checkpoint"]),
    message="--watch evaluates new checkpoints as they appear; it cannot be "
    "combined with --checkpoint")


def main(argv):
  cli.begin(argv, "--model_dir=DIR")
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from identity_tf import datasets
  from identity_tf import evaluation
  from identity_tf import run_dir
  from identity_tf import tfds_data
  # pylint: enable=g-import-not-at-top

  def evaluate(path):
    """Evaluates checkpoint PATH, already found and verified."""
    model, description, step = run_dir.restore_checkpoint(model_dir, path)
    trained = description["dataset"]
    dataset = FLAGS.dataset or trained["name"]
    # The model's own preprocessing on its own dataset; on another one, that
    # dataset's preprocessing for the model's input size.
    preprocessing = description["preprocessing"]
    if dataset != trained["name"]:
      info = tfds_data.dataset_info(dataset, data_dir)
      if info.num_classes != trained["num_classes"]:
        raise ValueError(
            f"--dataset={dataset} has {info.num_classes} classes; the model "
            f"was trained for the {trained['num_classes']} of "
            f"{trained['name']}")
      preprocessing = datasets.preprocessing_config(
          info, preprocessing["image_size"])
    logging.info("evaluating %s at step %d on %s", model_dir, step, dataset)
    metrics = evaluation.evaluate(
        model, dataset, data_dir=data_dir, batch_size=FLAGS.batch_size,
        num_examples=FLAGS.num_examples, preprocessing=preprocessing)
    if FLAGS.write_summaries:
      run_dir.write_eval_summaries(model_dir, step, metrics)
    print(json.dumps({"global_step": step, "dataset": dataset, **metrics},
                     sort_keys=True), flush=True)
    return step

  try:
    model_dir = paths.resolve_path(FLAGS.model_dir)
    data_dir = paths.resolve_path(FLAGS.data_dir) if FLAGS.data_dir else None
    run_dir.read_run(model_dir)  # A clear error if this is no run at all.
    if not FLAGS.watch:
      evaluate(run_dir.find_checkpoint(
          model_dir, FLAGS.checkpoint,
          echo=lambda line: print(f"note: {line}; skipped", file=sys.stderr)))
      return
    train_steps = run_dir.read_run(model_dir)["config"]["train_steps"]
    for path in tf.train.checkpoints_iterator(
        model_dir, min_interval_secs=FLAGS.watch_interval,
        timeout=FLAGS.watch_timeout):
      reason = run_dir.damage(path)
      if reason:  # Rotated away by training meanwhile, or damaged.
        print(f"note: {os.path.basename(path)}: {reason}; skipped",
              file=sys.stderr)
        continue
      step = evaluate(path)
      if step >= train_steps:
        break
  except ValueError as e:  # DatasetNotReadyError too.
    raise SystemExit(f"error: {e}") from None


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
