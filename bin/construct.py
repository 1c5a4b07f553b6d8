"""Builds the residual network of Theorem 3.2 that fits a labelled data set.

    bazel run //bin:construct -- --data=points.npz --output_dir=out
    bazel run //bin:construct -- --dataset=fashion_mnist --num_examples=1000 \\
        --data_dir=DIR --output_dir=out

--data is an .npz with `x` (n, d) float and `y` (n,) integer labels in
[0, r); --dataset is any TFDS image-classification dataset (flattened
training images). The network of Section 3 (Lemma B.1) is built, checked on
every training point and written to --output_dir as weights.npz
(framework-free), model.keras (load after `import
identity_tf.theory.construction_model`) and report.json, with its top-1
accuracy on the held-out split (--test_examples). --sgd_steps=N also trains
the same architecture by SGD (sgd.json): the contrast. --sweep_n=1000,3000
--sweep_dims=784,64 constructs for the first n points instead, at each input
dimension (--reduce), and writes sweep.json and sweep.png: parameters
against Theorem 3.2's n ln n + r^2 (with --sgd_steps, SGD at the smallest
n). The binary is `construct_command` of
identity_tf/theory/construction_run.py. Progress goes to stderr, the main
numbers to stdout as one JSON object.
"""

import os

# One BLAS thread per thread of the construction: it splits its products over
# every core itself (identity_tf/theory/parallel.py), so a multi-threaded BLAS
# would put several threads on each core; and on a shared machine a
# multi-threaded OpenBLAS spins for cores other processes hold (10x slower
# small products, measured).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position
import json

from absl import flags

from identity_tf.commands import cli

FLAGS = flags.FLAGS
flags.DEFINE_string("data", None, ".npz file with x (n, d) and y (n,)")
flags.DEFINE_string("dataset", None, "TFDS dataset to fit instead of --data "
                    "(training images, flattened), e.g. fashion_mnist")
flags.DEFINE_integer("num_examples", 1000, "examples of --dataset to fit",
                     lower_bound=1)
cli.define_data_dir()
flags.DEFINE_integer("num_classes", None, "r; default: max label + 1 (the "
                     "dataset's classes for --dataset)", lower_bound=1)
flags.DEFINE_integer("seed", 0, "seed of the projection and surrogates",
                     lower_bound=0)
flags.DEFINE_string("output_dir", None, "where to write weights.npz, "
                    "model.keras and report.json (sweep.json and sweep.png)")
flags.DEFINE_integer("keras_check_examples", 2000, "check model.keras (loaded "
                     "back from disk) on this many training points; -1 = all",
                     lower_bound=-1)
flags.DEFINE_integer("sgd_steps", 0, "if > 0: also train the same "
                     "architecture by SGD for this many steps (the contrast; "
                     "with --sweep_n at the smallest n)", lower_bound=0)
flags.DEFINE_integer("sgd_batch_size", 128, "batch size of --sgd_steps",
                     lower_bound=1)
flags.DEFINE_float("sgd_learning_rate", 0.1, "learning rate of --sgd_steps",
                   lower_bound=0.0)
flags.DEFINE_integer("test_examples", -1, "top-1 accuracy on this many "
                     "held-out points (--dataset's test split, or x_test, "
                     "y_test in --data); -1 = all, 0 = none", lower_bound=-1)
flags.DEFINE_bool("johnson_lindenstrauss", False, "project to the proof's k "
                  "= O(log n / rho^2) instead of the lossless k = min(n, d + "
                  "1); checked, and dropped (one line says why) when it "
                  "loses the separation")
flags.DEFINE_list("sweep_n", None, "sizes n: construct for the first n "
                  "points of each, write sweep.json and sweep.png")
flags.DEFINE_list("sweep_dims", None, "with --sweep_n: input dimensions "
                  "(the raw d, or fewer by --reduce); default: the raw d")
flags.DEFINE_enum("reduce", "pca", ["pca", "random"], "how --sweep_dims and "
                  "--reduced_dim reduce the inputs: PCA fitted on the "
                  "training points, or a seeded Gaussian projection")
flags.DEFINE_integer("reduced_dim", None, "reduce the inputs to this many "
                     "coordinates (--reduce) before constructing",
                     lower_bound=1)
flags.mark_flag_as_required("output_dir")
flags.register_multi_flags_validator(
    ["data", "dataset"],
    lambda v: (v["data"] is None) != (v["dataset"] is None),
    message="give exactly one of --data=points.npz or --dataset=NAME "
    "--num_examples=N")
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--output_dir=DIR")
  # Importing TensorFlow/Keras takes seconds: only after the flags are valid.
  from identity_tf.theory import construction_run  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():
    construction_run.construct_command(
        cli.path(FLAGS.output_dir), data=cli.path(FLAGS.data),
        data_as_typed=FLAGS.data, dataset=FLAGS.dataset,
        num_examples=FLAGS.num_examples, data_dir=cli.path(FLAGS.data_dir),
        num_classes=FLAGS.num_classes, seed=FLAGS.seed,
        test_examples=FLAGS.test_examples, sweep_n=FLAGS.sweep_n,
        sweep_dims=FLAGS.sweep_dims, reduce=FLAGS.reduce,
        reduced_dim=FLAGS.reduced_dim,
        johnson_lindenstrauss=FLAGS.johnson_lindenstrauss,
        keras_check_examples=FLAGS.keras_check_examples,
        sgd_steps=FLAGS.sgd_steps, sgd_batch_size=FLAGS.sgd_batch_size,
        sgd_learning_rate=FLAGS.sgd_learning_rate, log=cli.print_stderr,
        emit=lambda summary: cli.print_result(json.dumps(summary)))


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
