"""Trains one of the paper's networks; re-running the command resumes it.

    bazel run //bin:train -- --preset=smoke
    bazel run //bin:train -- --preset=cifar10_paper \\
        --data_dir=~/tensorflow_datasets
    bazel run //bin:train -- --preset=cifar10_paper --strategy=mirrored \\
        --model_dir=runs/c10 --learning_rate=0.1

A preset (identity_tf/configs.py) gives every hyper-parameter; each flag
that is set overrides the preset's value. The resolved configuration goes to
MODEL_DIR/config.json (to stderr too with --verbose), one progress line per
--log_steps to stderr; what the run reached and where its files are go to
stdout. See docs/training.md.
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from identity_tf.commands import cli
from identity_tf import configs

FLAGS = flags.FLAGS

flags.DEFINE_string(
    "preset", None,
    f"One of {', '.join(configs.PRESETS)}. Default: the configuration stored "
    "in --model_dir if it holds a run, else smoke.")
cli.define_model_dir(default="runs/<preset> under the directory you run "
                     "from. Re-running with the same directory resumes.")
cli.define_data_dir()
cli.define_tpu()
flags.DEFINE_float("cluster_timeout", 600.0,
                   "multi_worker_mirrored: seconds the workers of TF_CONFIG "
                   "may take to join before the run stops.", lower_bound=1.0)
flags.DEFINE_boolean("dry_run", False,
                     "Resolve, check and print the configuration, then exit "
                     "(nothing is written).")
flags.DEFINE_boolean("verbose", False,
                     "Print the whole configuration, and the divergence "
                     "diagnostics on every progress line (not only when "
                     "abnormal); metrics.jsonl has them all anyway.")
# One override flag per configs.Config field; unset flags keep the preset's
# (--help shows those of the --preset given, grouped: configs.FLAG_GROUPS).
cli.define_config_flags(configs.Config)
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--train_steps=100")
  # Pure Python (but for gs:// model_dirs): bad flags are reported before
  # TensorFlow loads.
  from identity_tf.training import run as run_lib  # pylint: disable=g-import-not-at-top
  model_dir = cli.path(FLAGS.model_dir)
  with cli.errors_as_exit():
    config = run_lib.choose_config(FLAGS.preset, model_dir,
                                   cli.config_overrides(configs.Config))
  model_dir = model_dir or cli.default_model_dir(config.preset)
  from identity_tf.commands import train  # pylint: disable=g-import-not-at-top
  train.train_command(config, model_dir, data_dir=cli.path(FLAGS.data_dir),
                      tpu=FLAGS.tpu, cluster_timeout=FLAGS.cluster_timeout,
                      dry_run=FLAGS.dry_run, verbose=FLAGS.verbose)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__, configs.FLAG_GROUPS, cli.preset_values)


if __name__ == "__main__":
  run()
