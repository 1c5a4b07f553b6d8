"""Measures the sharpness of a training run's loss at each of its checkpoints.

    bazel run //bin:sharpness -- --model_dir=runs/literal --num_examples=512

For every checkpoint in --model_dir (or those of --checkpoints) prints one
JSON object on stdout: the global step, the top eigenvalue of the Hessian of
the training loss (mean cross-entropy plus weight decay) on the first
--num_examples training images with evaluation preprocessing, the
learning rate at that step, and the largest curvature SGD with the run's
momentum is stable on, 2 (1 + momentum) / learning rate
(identity_tf/sharpness.py). A ratio above 1 means the step overshoots along
the sharpest direction. Progress goes to stderr.
"""

import json
import os
import sys

from absl import app
from absl import flags

from identity_tf import cli
from identity_tf import paths

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", None, "A training run's directory.")
flags.DEFINE_string("data_dir", None, "TFDS data directory of its dataset.")
flags.DEFINE_list("checkpoints", None, "Steps to measure (default: every "
                  "checkpoint in --model_dir).")
flags.DEFINE_integer("num_examples", 512, "Training images in the batch.",
                     lower_bound=1)
flags.DEFINE_integer("iterations", 20, "Power iterations per checkpoint.",
                     lower_bound=1)
flags.mark_flag_as_required("model_dir")


def main(argv):
  cli.begin(argv, "--model_dir=DIR")
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from identity_tf import configs
  from identity_tf import input_pipeline
  from identity_tf import optimization
  from identity_tf import run_dir
  from identity_tf import sharpness
  # pylint: enable=g-import-not-at-top
  model_dir = paths.resolve_path(FLAGS.model_dir)
  data_dir = paths.resolve_path(FLAGS.data_dir) if FLAGS.data_dir else None
  try:
    run = run_dir.read_run(model_dir)
    if FLAGS.checkpoints:
      steps = [int(s) for s in FLAGS.checkpoints]
    else:
      steps = sorted(run_dir.checkpoint_step(p[:-len(".index")]) for p in
                     tf.io.gfile.glob(os.path.join(model_dir, "ckpt-*.index")))
    if not steps:
      raise ValueError(f"no checkpoint in --model_dir={model_dir}")
    config = configs.from_dict(run["config"])
    dataset = run["dataset"]
    images, labels = next(iter(input_pipeline.build_dataset(
        dataset["name"], dataset["train_split"], FLAGS.num_examples,
        training=False, data_dir=data_dir, num_examples=FLAGS.num_examples,
        preprocessing=run["preprocessing"])))
    schedule = optimization.learning_rate_schedule(config,
                                                   run["steps_per_epoch"])
    model = None
    for step in steps:
      if model is None:
        model, _, _ = run_dir.restore_model(model_dir, step)
        loss = sharpness.loss_function(model, images, labels,
                                       config.weight_decay)
      else:
        tf.train.Checkpoint(model=model).read(
            run_dir.find_checkpoint(model_dir, step)).expect_partial()
      print(f"step {step}: {FLAGS.iterations} power iterations",
            file=sys.stderr, flush=True)
      value, estimates = sharpness.top_eigenvalue(
          loss, model.trainable_variables, FLAGS.iterations)
      rate = float(schedule(step) if callable(schedule) else schedule)
      threshold = sharpness.stability_threshold(rate, config.momentum)
      print(json.dumps({
          "step": step, "sharpness": round(value, 4),
          "learning_rate": rate, "threshold": round(threshold, 4),
          "ratio": round(value / threshold, 4),
          "last_change": round(abs(estimates[-1] - estimates[-2]) /
                               max(abs(value), 1e-12), 4)
                         if len(estimates) > 1 else None}), flush=True)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
