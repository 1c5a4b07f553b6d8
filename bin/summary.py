"""Prints a network's layer table and its totals.

  bazel run //bin:summary -- --model=cifar10
  bazel run //bin:summary -- --model=imagenet --width=0.5

The table is Keras's (layer, output shape, parameters); the totals below it
count the convolutions and the trainable and non-trainable weights (the frozen
random projection, plus batch-norm statistics in `resnet_bn`).
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from identity_tf import architectures
from identity_tf.commands import cli
from identity_tf import configs

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "cifar10", sorted(architectures.MODELS),
                  cli.config_help("model"))
flags.DEFINE_integer("classes", None,
                     "Number of classes (default: the network's).")
flags.DEFINE_float("width", None, cli.config_help("width"))
flags.DEFINE_list("units", None, cli.config_help("units"))
flags.DEFINE_integer("stem_channels", None, cli.config_help("stem_channels"))
flags.DEFINE_bool("norm", None, cli.config_help("norm"))
flags.DEFINE_enum("head", None, list(architectures.HEADS),
                  cli.config_help("head"))
flags.DEFINE_enum("init", None, list(architectures.INIT_SCHEMES),
                  cli.config_help("init"))
flags.DEFINE_integer("image_size", None, "Input height and width.")
flags.DEFINE_enum("residual", None, list(architectures.RESIDUALS),
                  cli.config_help("residual"))
flags.DEFINE_enum("branch_gain", None, list(architectures.BRANCH_GAINS),
                  cli.config_help("branch_gain"))
flags.DEFINE_bool("weight_standardization", None,
                  cli.config_help("weight_standardization"))
flags.DEFINE_enum("ws_gain", None, list(architectures.WS_GAINS),
                  cli.config_help("ws_gain"))
flags.DEFINE_enum("branch_init", None, list(architectures.BRANCH_INITS),
                  cli.config_help("branch_init"))
flags.DEFINE_float("branch_init_scale", None,
                   cli.config_help("branch_init_scale"))
flags.DEFINE_float("logit_scale", None, cli.config_help("logit_scale"))
flags.DEFINE_enum("projection_scale", None,
                  list(architectures.PROJECTION_SCALES),
                  cli.config_help("projection_scale"))


def model_options_from_flags():
  """The build_model options the user set on the command line."""
  units = FLAGS.units
  if units is not None:
    units = configs.parse_integers("units", units)
  return dict(classes=FLAGS.classes, width=FLAGS.width, units=units,
              stem_channels=FLAGS.stem_channels, norm=FLAGS.norm,
              head=FLAGS.head, init=FLAGS.init,
              image_size=FLAGS.image_size,
              projection_scale=FLAGS.projection_scale,
              logit_scale=FLAGS.logit_scale,
              **{name: getattr(FLAGS, name)
                 for name in architectures.BRANCH_FIELDS})


def main(argv):
  cli.begin(argv, "--model=cifar10")
  # Checked before TensorFlow loads, with the one validator of the options.
  with cli.errors_as_exit():
    options = model_options_from_flags()
    architectures.complete_options(FLAGS.model, **options)
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  print("\n".join(model_lib.layer_table(
      model_lib.build_model(FLAGS.model, **options))))


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
