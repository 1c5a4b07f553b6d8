"""Prepares a TFDS dataset for training: the only step that may download.

  bazel run //bin:prepare_data -- --dataset=fashion_mnist --data_dir=DIR
  bazel run //bin:prepare_data -- --dataset=cifar10 --data_dir=DIR
  bazel run //bin:prepare_data -- --dataset=mnist --data_dir=DIR \\
      --source_dir=DIR_WITH_THE_FOUR_IDX_GZ_FILES
  bazel run //bin:prepare_data -- --dataset=imagenet2012 --data_dir=DIR

TFDS's own builder converts the dataset's files into DATA_DIR. The files
come from --source_dir if given (the files TFDS would download, under the
same names), else from Debian's package where one installs them
(Fashion-MNIST: `apt-get install dataset-fashion-mnist`, no internet needed),
else from the internet (CIFAR-10/100 and most others; prepare on another
machine and copy DIR where there is none). ImageNet is converted from
ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar, which you download from
image-net.org into DIR/downloads/manual/. See docs/data.md.
"""

import os
import shlex
import signal

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from identity_tf.commands import cli

FLAGS = flags.FLAGS
cli.define_dataset(use="The one to prepare (synthetic needs none), e.g. "
                   "mnist, svhn_cropped, imagenet2012.", required=True)
cli.define_data_dir()
flags.DEFINE_string("source_dir", None,
                    "A directory holding the files the dataset downloads "
                    "(same names); nothing is downloaded. Default: Debian's "
                    "package directory where one installs them "
                    "(fashion_mnist: /usr/share/datasets/fashion-mnist).")
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def _stop(signum, _):
  """SIGTERM or Ctrl-C during the preparation: undo it, one line, exit.

  Done here rather than by unwinding the stack from wherever the signal
  came (inside TFDS, perhaps holding a lock its cleanup needs)."""
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  from identity_tf.data import tfds_data  # pylint: disable=g-import-not-at-top
  tfds_data.stop_preparation()
  # On a line of its own: TFDS's progress bar may have left one open.
  os.write(2, f"\nerror: stopped by {signal.Signals(signum).name}; what this "
              "attempt wrote was removed: run the same command to start "
              "again\n".encode())
  cli.remove_scratch_home()
  os._exit(128 + signum)  # pylint: disable=protected-access


def main(argv):
  cli.begin(argv, "--dataset=NAME")
  # pylint: disable=g-import-not-at-top
  from identity_tf.data import tfds_data
  # pylint: enable=g-import-not-at-top
  # From here SIGTERM and Ctrl-C undo what the preparation wrote (cli's
  # handler ends the process at once, which suits the import above:
  # nothing is written before this line).
  signal.signal(signal.SIGTERM, _stop)
  signal.signal(signal.SIGINT, _stop)
  with cli.errors_as_exit():
    path = tfds_data.prepare(FLAGS.dataset, cli.path(FLAGS.data_dir),
                             cli.path(FLAGS.source_dir),
                             echo=cli.print_result)
  data_dir = os.path.dirname(os.path.dirname(path))
  print(f"{FLAGS.dataset} is ready in {path}; train with "
        f"{shlex.quote(f'--dataset={FLAGS.dataset}')} "
        f"{shlex.quote(f'--data_dir={data_dir}')}")


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
