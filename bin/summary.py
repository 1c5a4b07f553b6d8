"""Prints a network's layer table and its totals.

  bazel run //bin:summary -- --model=cifar10
  bazel run //bin:summary -- --model=imagenet --width=0.5

The table is Keras's (layer, output shape, parameters); the totals below it
count the convolutions and the trainable and non-trainable weights (the frozen
random projection, plus batch-norm statistics in `resnet_bn`).
"""

import math

from absl import app
from absl import flags

from identity_tf import architectures
from identity_tf import cli
from identity_tf import configs

FLAGS = flags.FLAGS
flags.DEFINE_enum("model", "cifar10", sorted(architectures.MODELS),
                  "Network.")
flags.DEFINE_integer("classes", None,
                     "Number of classes (default: the network's).")
flags.DEFINE_float("width", None,
                   "Width multiplier (1.0 = the paper's widths).")
flags.DEFINE_list("units", None, "Residual units per stage: one number for "
                  "all, or one per stage.")
flags.DEFINE_bool("norm", None,
                  "Batch-norm pre-activation units (resnet_bn's).")
flags.DEFINE_enum("head", None, list(architectures.HEADS),
                  "frozen random projection or trainable linear head.")
flags.DEFINE_enum("init", None, list(architectures.INIT_SCHEMES),
                  "Initialisation scheme.")
flags.DEFINE_integer("image_size", None, "Input height and width.")
flags.DEFINE_enum("residual", None, list(architectures.RESIDUALS),
                  "Residual branch: the paper's plain one, SkipInit's zero "
                  "gain or Fixup.")
flags.DEFINE_enum("projection_scale", None,
                  list(architectures.PROJECTION_SCALES),
                  "Variance of the projection's entries: 1/classes or 1/d.")


def model_options_from_flags():
  """The build_model options the user set on the command line."""
  units = FLAGS.units
  if units is not None:
    units = configs.parse_integers("units", units)
  return dict(classes=FLAGS.classes, width=FLAGS.width, units=units,
              norm=FLAGS.norm, head=FLAGS.head, init=FLAGS.init,
              image_size=FLAGS.image_size, residual=FLAGS.residual,
              projection_scale=FLAGS.projection_scale)


def _count(weights):
  return sum(math.prod(w.shape) for w in weights)


def layer_options(layer):
  """The options that change what a layer computes, as short text."""
  from identity_tf import layers  # pylint: disable=g-import-not-at-top
  if isinstance(layer, layers.ConvResidualUnit):
    return f"residual={layer.residual}"
  if isinstance(layer, layers.RandomProjection):
    return (f"scale={layer.scale}, "
            f"{'trained' if layer.trainable else 'frozen'}")
  return ""


def print_layer_table(model):
  """One row per layer and per layer inside a residual unit (plain text, so
  it survives pipes and logs)."""
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  row = "{:<30} {:<22} {:<16} {:>12} {:>14}  {}"
  print(row.format("layer", "type", "output shape", "trainable",
                   "non-trainable", "options"))
  print("-" * 120)
  for layer in model.layers[1:]:
    shape = "x".join(str(n) for n in layer.output.shape[1:])
    print(row.format(layer.name, type(layer).__name__, shape,
                     f"{_count(layer.trainable_weights):,}",
                     f"{_count(layer.non_trainable_weights):,}",
                     layer_options(layer)))
    for sub in model_lib.sublayers(layer):
      print(row.format("  " + sub.name, type(sub).__name__, "",
                       f"{_count(sub.trainable_weights):,}",
                       f"{_count(sub.non_trainable_weights):,}", ""))
  print("-" * 120)


def main(argv):
  cli.begin(argv, "--model=cifar10")
  # Checked before TensorFlow loads, with the one validator of the options.
  try:
    options = model_options_from_flags()
    architectures.resolve_options(FLAGS.model, **options)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  model = model_lib.build_model(FLAGS.model, **options)
  print_layer_table(model)
  totals = model_lib.describe(model)
  print(f"Convolutions:          {totals['convolutions']:>12,}")
  print(f"Trainable weights:     {totals['trainable_weights']:>12,}")
  print(f"Non-trainable weights: {totals['non_trainable_weights']:>12,}"
        "  (frozen projection, batch-norm statistics)")


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
