"""Section 2 (linear residual networks) of Hardt & Ma (2017), runnable.

  bazel run //bin:linear_theory -- factorize --R=R.npy --layers=L --output=A.npz
  bazel run //bin:linear_theory -- check --d=D --layers=L --seed=S
  bazel run //bin:linear_theory -- descend --d=D --layers=L --steps=N --plot=F.png
  bazel run //bin:linear_theory -- landscape --depths=2,4,8 --taus=0.1,0.3,0.5 \\
      --starts=10 --steps=300 [--R=R.npy] [--sigma=S.npy] --output=F.json \\
      --plot=F.png

factorize: Theorem 2.1 for the d x d float64 matrix in R.npy; writes key `A`
  (shape (L, d, d), float64) to the .npz and prints one JSON object
  {"layers", "d", "gamma", "max_norm", "bound", "residual"} (plus
  "bound_additive", the (4 pi + 3 gamma)/l form of the bound).
check: every statement of Section 2 on a random instance; JSON with pass/fail
  per statement; exits 1 if any fails. --bound_power=2 checks (2.3) with
  sigma_min(Sigma)^2, the squared form (it fails: see docs).
descend: gradient descent from A = 0 beside the plain parametrisation;
  JSON summary, and a PNG of f - f_opt and |||A||| per step with --plot.
landscape: Theorem 2.2 as an experiment: descent from random starts in B_tau
  per depth and tau, beside the plain W_l...W_1 and a det R < 0 target; JSON
  report (also to --output), PNG with --plot (docs/linear_theory.md).

Each subcommand is one function of identity_tf/theory/linear_run.py
(identity_tf/commands/linear_theory.py picks it). JSON goes to stdout alone; progress and errors go to stderr.
Relative paths resolve against the directory `bazel run` was started from.
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

# Pure Python until a command runs: TensorFlow comes after the flag checks.
from identity_tf.commands import cli
from identity_tf.commands import linear_theory

flags.DEFINE_string("R", None, "factorize, landscape: .npy file holding a "
                    "d x d float64 R (landscape: det R > 0; default random).")
flags.DEFINE_string("sigma", None, "landscape: .npy file holding Sigma = "
                    "E[x x^T], d x d symmetric positive definite (default "
                    "random, eigenvalues in [0.5, 2]).")
flags.DEFINE_integer("layers", None, "Number of layers l (factorize: required; "
                     "check: default 20; descend: default 50).")
flags.DEFINE_string("output", None, "factorize: .npz file to write (key A); "
                    "landscape: JSON file for the report.")
flags.DEFINE_integer("d", None, "check/descend/landscape: dimension d "
                     "(default 8).")
flags.DEFINE_integer("seed", None, "check/descend/landscape: random seed "
                     "(default 0).", lower_bound=0)
flags.DEFINE_integer("bound_power", None, "check: power of sigma_min(Sigma) "
                     "in (2.3): 1 (what the argument gives; default) or 2 "
                     "(the squared form).")
flags.DEFINE_integer("samples", None, "check: Monte-Carlo samples (default "
                     "200000).")
flags.DEFINE_integer("steps", None, "descend: gradient steps (default 500); "
                     "landscape: steps per descent (default 300).")
flags.DEFINE_float("step_size", None, "descend/landscape: step size (default "
                   "1 / (2 l sigma_max(Sigma) max(1, ||R||)^2)).")
flags.DEFINE_string("plot", None, "descend/landscape: PNG file for the plots.")
flags.DEFINE_list("depths", None, "landscape: depths l (default 2,4,8).")
flags.DEFINE_list("taus", None, "landscape: start radii tau < 1 (default "
                  "0.1,0.3,0.5).")
flags.DEFINE_integer("starts", None, "landscape: random starts per (l, tau) "
                     "(default 10).")
flags.DEFINE_float("epsilon", None, "landscape: success is f - f_opt <= "
                   "epsilon (default 1e-6).")
flags.DEFINE_float("condition", None, "landscape: condition number of the "
                   "random R (default 2).")
flags.DEFINE_float("rotation", None, "landscape: largest rotation angle of "
                   "the random R's orthogonal factor, radians (default 1).")

FLAGS = flags.FLAGS


def main(argv):
  # TensorFlow starts (quietly) once the subcommand and its flags are
  # checked: commands.linear_theory.
  cli.begin(argv, takes_arguments=True, start_tensorflow=False)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  with cli.errors_as_exit():
    linear_theory.main(argv[1:], {
        name: FLAGS[name].value if FLAGS[name].present else None
        for name in linear_theory.FLAG_NAMES})


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
