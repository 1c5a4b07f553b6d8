"""Exports a trained run as the next version of a TF Serving model.

    bazel run //bin:export -- --model_dir=runs/smoke --export_dir=serving/smoke
    bazel run //bin:export -- --model_dir=runs/c10 --checkpoint=50000 \\
        --export_dir=serving/c10 --version=7 --overwrite

Writes EXPORT_DIR/<version>/ (a SavedModel with the signatures
serving_default and predict_images, plus model_info.json), atomically: a
version directory either is complete or does not exist. Serve EXPORT_DIR
with `tensorflow_model_server --model_base_path=EXPORT_DIR`; see
docs/serving.md.
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from identity_tf.commands import cli

FLAGS = flags.FLAGS

cli.define_model_dir(required=True)
cli.define_checkpoint()
flags.DEFINE_string("export_dir", None,
                    "TF Serving's model base path: versions are written to "
                    "EXPORT_DIR/<version>/.")
flags.DEFINE_integer("version", None,
                     "Version number. Default: one more than the highest in "
                     "--export_dir (1 if none).", lower_bound=1)
flags.DEFINE_boolean("overwrite", False,
                     "Replace --version if it exists (TF Serving does not "
                     "reload a version it has loaded: roll out new versions "
                     "instead).")
flags.mark_flag_as_required("export_dir")
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--export_dir=BASE")
  checkpoint = FLAGS.checkpoint
  if checkpoint and not checkpoint.isdigit() and os.sep in checkpoint:
    checkpoint = cli.resolve_path(checkpoint)
  # Imported here so that --help and flag errors do not wait for TensorFlow.
  from identity_tf.commands import export  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():
    export.export_command(
        cli.path(FLAGS.model_dir), cli.path(FLAGS.export_dir),
        checkpoint=checkpoint, version=FLAGS.version,
        overwrite=FLAGS.overwrite)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
