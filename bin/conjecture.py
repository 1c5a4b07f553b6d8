"""Section 5's conjecture (Hardt & Ma, 2017), probed on small instances.

  bazel run //bin:conjecture -- --output=conjecture.json --plot=conjecture.png
  bazel run //bin:conjecture -- --depths=2,4,8 --widths=4,8,16 --seeds=5 \\
      --init_norms=0.001,0.01,0.1 --steps=20000

The paper conjectures that a result like Theorem 2.2 (near the identity, no
critical point but global minima) holds for non-linear residual networks.
Teacher-student: a random residual teacher of depth L, width d and hidden
width m (the unit h + V ReLU(U h + b)) labels n Gaussian points; a student of
the same family starts from small unit norms and takes full-batch gradient
descent on the squared loss. Per (L, d, initial norm), over the seeds: how
often the relative loss reaches --tolerance, the largest unit norm along the
path, and whether a run met a critical point with a loss that is not near
zero (at its end, or anywhere on its path); the same starts with the
identity removed (the plain unit V ReLU(U h + b), on a plain teacher). Evidence on small instances, not a
proof: docs/conjecture.md. The logic is identity_tf/theory/conjecture.py
(`probe_command`). JSON goes to stdout alone (and to --output); progress and
errors go to stderr. Relative paths resolve against the directory
`bazel run` was started from.
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

flags.DEFINE_list("depths", None, "Depths L, the number of units (default "
                  "2,4).")
flags.DEFINE_list("widths", None, "Widths d (default 4,8).")
flags.DEFINE_integer("hidden", None, "Hidden width m of every unit (default: "
                     "d).")
flags.DEFINE_list("init_norms", None, "The student's starting spectral norm "
                  "of every U and V (default 0.01,0.1).")
flags.DEFINE_integer("seeds", None, "Seeds per cell: teacher, data and "
                     "start (default 3).")
flags.DEFINE_integer("samples", None, "Training points n (default 128).")
flags.DEFINE_integer("steps", None, "Gradient steps per run (default 5000).")
flags.DEFINE_float("learning_rate", None, "Step size on the relative loss "
                   "(default 0.05).")
flags.DEFINE_float("teacher_norm", None, "The residual teacher's ||U||, "
                   "||V|| and ||b|| (default 0.5).")
flags.DEFINE_float("tolerance", None, "Near-zero relative loss (default "
                   "1e-3).")
flags.DEFINE_float("stall_gradient", None, "A run that ends with ||grad|| "
                   "below this and the loss above --tolerance stalled at a "
                   "critical point; one that meets it anywhere on its path "
                   "counts in near_critical_on_path (default 1e-6).")
flags.DEFINE_string("output", None, "JSON file for the report.")
flags.DEFINE_string("plot", None, "PNG file for the figure.")

FLAGS = flags.FLAGS
SETTINGS = ("depths", "widths", "hidden", "init_norms", "seeds", "samples",
            "steps", "learning_rate", "teacher_norm", "tolerance",
            "stall_gradient")


def emit(result):
  print(json.dumps(result, indent=1, default=float))


def main(argv):
  cli.begin(argv, "--depths=2,4 --plot=conjecture.png")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # TensorFlow's import takes seconds: only once the flags are finite.
  from identity_tf.theory import conjecture  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():
    conjecture.probe_command(
        {name: FLAGS[name].value for name in SETTINGS},
        output_path=cli.path(FLAGS.output), output_as_typed=FLAGS.output,
        plot_path=cli.path(FLAGS.plot), plot_as_typed=FLAGS.plot,
        log=cli.print_stderr, emit=emit)


def run():
  """The console script's entry point (pip install: identity-tf-conjecture)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
