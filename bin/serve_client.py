"""Asks a TF Serving server for the top-k classes of images or pixel arrays.

    bazel run //bin:serve_client -- --server=localhost:8501 \\
        --model_name=smoke cat.png dog.jpg
    bazel run //bin:serve_client -- --server=localhost:8500 --protocol=grpc \\
        --model_name=smoke --model_info=serving/smoke/1/model_info.json \\
        batch.npy

Image files (JPEG, PNG) go to the `predict_images` signature as encoded
bytes; .npy arrays of raw 0-255 pixels ([H, W, 3] or [batch, H, W, 3]) to
`serving_default`. Prints one line per image: its top-k classes with their
probabilities. See docs/serving.md.
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from identity_tf.commands import cli
from identity_tf.serving import contract

FLAGS = flags.FLAGS

flags.DEFINE_string("server", "localhost:8501",
                    "HOST:PORT of TF Serving: its REST port (8501 by "
                    "convention) or, with --protocol=grpc, its gRPC port "
                    "(8500).")
flags.DEFINE_string("model_name", None,
                    "The served model's name (tensorflow_model_server "
                    "--model_name).")
flags.DEFINE_enum("protocol", "rest", ["rest", "grpc"],
                  "rest: POST /v1/models/NAME:predict JSON; grpc: "
                  "PredictionService/Predict.")
flags.DEFINE_enum("signature", None, list(contract.SIGNATURES),
                  f"One of {', '.join(contract.SIGNATURES)}. Default: "
                  f"{contract.IMAGES_SIGNATURE} for image files, "
                  f"{contract.DEFAULT_SIGNATURE} for .npy arrays.")
flags.DEFINE_integer("model_version", None,
                     "Ask for this version. Default: the server's choice "
                     "(the latest).")
flags.DEFINE_integer("top_k", 5, "Classes printed per image.",
                     lower_bound=1)
flags.DEFINE_string("model_info", None,
                    "model_info.json of the export, to print class names.")
flags.DEFINE_float("timeout", 30.0, "Seconds the whole request may take.",
                   lower_bound=1e-3)
flags.mark_flag_as_required("model_name")


def main(argv):
  cli.stop_on_signals()
  cli.check_finite_flags()
  cli.check_integer_flags()
  if len(argv) < 2:
    raise SystemExit("error: no inputs; pass image files (JPEG/PNG) or .npy "
                     "arrays after the flags")
  # The client loads TensorFlow (its protos); --help and bad flags do not.
  cli.begin(argv, takes_arguments=True)
  from identity_tf.commands import serve_client  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():  # errors.ServingError is a ValueError.
    serve_client.predict_command(
        FLAGS.server, FLAGS.model_name, argv[1:], protocol=FLAGS.protocol,
        signature=FLAGS.signature, version=FLAGS.model_version,
        timeout=FLAGS.timeout, top_k=FLAGS.top_k, model_info=FLAGS.model_info)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
