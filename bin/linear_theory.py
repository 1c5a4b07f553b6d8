"""Section 2 (linear residual networks) of Hardt & Ma (2017), runnable.

  bazel run //bin:linear_theory -- factorize --R=R.npy --layers=L --output=A.npz
  bazel run //bin:linear_theory -- check --d=D --layers=L --seed=S
  bazel run //bin:linear_theory -- descend --d=D --layers=L --steps=N --plot=F.png
  bazel run //bin:linear_theory -- landscape --depths=2,4,8 --taus=0.1,0.3,0.5 \
      --starts=10 --steps=300 --output=report.json --plot=F.png

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

The times of factorize and of the gradient against l and d are measured by
`bazel run //bin:benchmark -- --suite=linear`. Each subcommand is one
function of identity_tf/theory/linear_run.py. JSON goes to stdout alone;
progress and errors go to stderr. Relative paths resolve against the
directory `bazel run` was started from.
"""

import json
import os
import sys

from absl import app
from absl import flags

from identity_tf import cli

SUBCOMMANDS = ("factorize", "check", "descend", "landscape")
# The former subcommands, each with one line saying what it became.
FORMER_SUBCOMMANDS = {
    # "construct" is Section 3's (//bin:construct); Theorem 2.1 factorizes R.
    "construct": "the subcommand construct is now factorize (same flags): "
                 + cli.command("linear_theory", "factorize --R=R.npy "
                               "--layers=L --output=A.npz"),
    "benchmark": "the subcommand benchmark is now "
                 + cli.command("benchmark", "--suite=linear"),
}

flags.DEFINE_string("R", None, "factorize, landscape: .npy file holding a "
                    "d x d float64 R (landscape: det R > 0; default random).")
flags.DEFINE_integer("layers", None, "Number of layers l (factorize: required; "
                     "check: default 20; descend: default 50).")
flags.DEFINE_string("output", None, "factorize: .npz file to write (key A); "
                    "landscape: JSON file for the report.")
flags.DEFINE_integer("d", 8, "check/descend/landscape: dimension d.")
flags.DEFINE_integer("seed", 0, "check/descend/landscape: random seed.",
                     lower_bound=0)
flags.DEFINE_integer("bound_power", 1, "check: power of sigma_min(Sigma) in "
                     "(2.3): 1 (what the argument gives) or 2 (the squared "
                     "form).")
flags.DEFINE_integer("samples", 200_000, "check: Monte-Carlo samples.")
flags.DEFINE_integer("steps", 500, "descend: gradient steps; landscape: "
                     "steps per descent (default 300).")
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


def log(message):
  print(message, file=sys.stderr, flush=True)


def emit(result):
  print(json.dumps(result, indent=1, default=float))


def _given(name):
  """The flag's value if the user gave it, else None (the command's default)."""
  return FLAGS[name].value if FLAGS[name].present else None


def main(argv):
  cli.stop_on_signals()
  cli.check_finite_flags()
  command = argv[1] if len(argv) >= 2 else None
  if command in FORMER_SUBCOMMANDS:
    raise SystemExit(f"error: {FORMER_SUBCOMMANDS[command]}")
  if command not in SUBCOMMANDS:
    given = (f"unknown subcommand {command!r}" if command is not None
             else "missing subcommand")
    raise SystemExit(f"error: {given}; valid: {', '.join(SUBCOMMANDS)} "
                     f"(e.g. linear_theory factorize --R=R.npy --layers=10 "
                     f"--output=A.npz)")
  if len(argv) > 2:
    raise SystemExit(f"error: unexpected arguments {' '.join(argv[2:])}; "
                     f"give options as --flag=value")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from identity_tf.theory import linear_run  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():
    if command == "factorize":
      linear_run.factorize_command(
          cli.path(FLAGS.R), FLAGS.layers, cli.path(FLAGS.output),
          r_as_typed=FLAGS.R, output_as_typed=FLAGS.output, log=log,
          emit=emit)
    elif command == "check":
      linear_run.check_command(FLAGS.d, FLAGS.layers, FLAGS.seed,
                               FLAGS.bound_power, FLAGS.samples, log=log,
                               emit=emit)
    elif command == "landscape":
      if FLAGS["layers"].present:
        raise ValueError("landscape takes --depths=2,4,8, not --layers")
      linear_run.landscape_command(
          _given("d"), cli.path(FLAGS.R), FLAGS.condition, FLAGS.rotation,
          FLAGS.depths, FLAGS.taus, FLAGS.starts, _given("steps"),
          FLAGS.epsilon, FLAGS.step_size, FLAGS.seed, cli.path(FLAGS.output),
          cli.path(FLAGS.plot), r_as_typed=FLAGS.R,
          output_as_typed=FLAGS.output, plot_as_typed=FLAGS.plot, log=log,
          emit=emit)
    else:
      linear_run.descend_command(
          FLAGS.d, FLAGS.layers, FLAGS.steps, FLAGS.step_size, FLAGS.seed,
          cli.path(FLAGS.plot), plot_as_typed=FLAGS.plot, log=log, emit=emit)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
