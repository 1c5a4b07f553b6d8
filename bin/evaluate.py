"""Evaluates a training run's checkpoint; prints one JSON object on stdout.

    bazel run //bin:evaluate -- --model_dir=runs/smoke
    bazel run //bin:evaluate -- --model_dir=runs/c10 --checkpoint=30000
    bazel run //bin:evaluate -- --model_dir=runs/c10 --watch
    bazel run //bin:evaluate -- --model_dir=runs/bn --held_out \
        --reestimate_batch_norm=20480

The object has global_step, dataset, loss (mean cross-entropy, without
weight decay), top1, top5 (fractions) and examples. With --watch, every new
checkpoint is evaluated as it appears (one JSON object per line) until
training's last step is evaluated or no new checkpoint arrives for
--watch_timeout seconds, like the eval mode of the 2016 tensorflow/models
resnet. --held_out scores the training images the run held out
(--validation_examples) instead of the test split; --reestimate_batch_norm
first sets a batch-norm network's statistics from that many training images
on the checkpoint's weights (precise batch norm), the checkpoint unchanged. Scores also go to MODEL_DIR/eval (TensorBoard) and
MODEL_DIR/metrics.jsonl. Logs go to stderr.
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

import json

from absl import flags

from identity_tf.commands import cli

FLAGS = flags.FLAGS

cli.define_model_dir(required=True)
cli.define_data_dir()
cli.define_checkpoint()
cli.define_dataset(use="The one to evaluate on (default: the run's); "
                   "another needs the run's classes.")
flags.DEFINE_integer("batch_size", 500, cli.config_help("eval_batch_size"),
                     lower_bound=1)
flags.DEFINE_integer("num_examples", None,
                     cli.config_help("num_eval_examples"), lower_bound=1)
flags.DEFINE_boolean("held_out", False,
                     "Evaluate on the training images the run held out "
                     "(its --validation_examples), not the test split.")
flags.DEFINE_integer("reestimate_batch_norm", 0,
                     "Batch-norm networks: first re-estimate the statistics "
                     "on this many training images (held-out ones left "
                     "out; whole batches of the run's --batch_size), on the "
                     "evaluated weights, not the moving averages. 0: the "
                     "moving averages.", lower_bound=0)
flags.DEFINE_boolean("watch", False,
                     "Evaluate every new checkpoint as it appears.")
flags.DEFINE_float("watch_timeout", 600.0,
                   "--watch: stop after this many seconds without a new "
                   "checkpoint.", lower_bound=1e-3)
flags.DEFINE_float("watch_interval", 5.0,
                   "--watch: seconds between looks for a new checkpoint.",
                   lower_bound=1e-3)
flags.DEFINE_boolean("write_summaries", True,
                     "Record the scores in MODEL_DIR (TensorBoard, "
                     "metrics.jsonl).")
flags.register_multi_flags_validator(
    ["watch", "checkpoint"], lambda values: not (values["watch"] and
                                                 values["checkpoint"]),
    message="--watch evaluates new checkpoints as they appear; it cannot be "
    "combined with --checkpoint")
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--model_dir=DIR")
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from identity_tf.data import tfds_data
  from identity_tf.training import config_file
  from identity_tf.training import evaluation
  # pylint: enable=g-import-not-at-top
  model_dir, data_dir = cli.path(FLAGS.model_dir), cli.path(FLAGS.data_dir)
  with cli.errors_as_exit():
    try:
      evaluation.evaluate_run(
          model_dir, checkpoint=FLAGS.checkpoint,
          dataset=FLAGS.dataset, data_dir=data_dir,
          batch_size=FLAGS.batch_size, num_examples=FLAGS.num_examples,
          held_out=FLAGS.held_out,
          reestimate_batch_norm=FLAGS.reestimate_batch_norm,
          write_summaries=FLAGS.write_summaries, watch=FLAGS.watch,
          watch_timeout=FLAGS.watch_timeout,
          watch_interval=FLAGS.watch_interval,
          emit=lambda scores: cli.print_result(json.dumps(
              scores, sort_keys=True)),
          note=cli.print_stderr)
    except tf.errors.OpError as e:
      # A record of the dataset that cannot be read: the file and the fix.
      stored = None if FLAGS.dataset else config_file.stored_config(
          model_dir)
      dataset = FLAGS.dataset or (stored.dataset if stored else None)
      damaged = dataset and tfds_data.input_failure(e, dataset, data_dir)
      if not damaged:
        raise
      raise damaged from None


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
