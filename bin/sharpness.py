"""Measures the sharpness of a training run's loss at each of its checkpoints.

    bazel run //bin:sharpness -- --model_dir=runs/literal --num_examples=512

For every checkpoint in --model_dir (or those of --checkpoints) prints one
JSON object on stdout: the global step, the top eigenvalue of the Hessian of
the training loss (mean cross-entropy plus weight decay) on the first
--num_examples training images with evaluation preprocessing, the
learning rate at that step, and the largest curvature SGD with the run's
momentum is stable on, 2 (1 + momentum) / learning rate
(identity_tf/training/sharpness.py). A ratio above 1 means the step overshoots along
the sharpest direction. Progress goes to stderr.
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
flags.DEFINE_list("checkpoints", None, "Steps to measure (default: every "
                  "checkpoint in --model_dir).")
flags.DEFINE_integer("num_examples", 512, "Training images in the batch.",
                     lower_bound=1)
flags.DEFINE_integer("iterations", 20, "Power iterations per checkpoint.",
                     lower_bound=1)
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--model_dir=DIR")
  from identity_tf import configs  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():
    steps = (configs.parse_integers("checkpoints", FLAGS.checkpoints)
             if FLAGS.checkpoints else None)
    from identity_tf.training import sharpness  # pylint: disable=g-import-not-at-top
    sharpness.measure_run(
        cli.path(FLAGS.model_dir), steps=steps,
        data_dir=cli.path(FLAGS.data_dir), num_examples=FLAGS.num_examples,
        iterations=FLAGS.iterations,
        emit=lambda values: cli.print_result(json.dumps(values)),
        log=cli.print_stderr)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
