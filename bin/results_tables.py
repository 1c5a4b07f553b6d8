"""Prints the tables of docs/results.md from the committed result files.

    bazel run //bin:results_tables                         # every file
    bazel run //bin:results_tables -- --files=normfree_w025,precision
    bazel run //bin:results_tables -- --files=ablation \
        --plot=docs/results_ablation.png --arms=cifar10_ws,cifar10_ws_bn
    bazel run //bin:results_tables -- --files=rates \
        --plot_rates=docs/results_rates.png

What each table holds: `identity_tf.training.results_tables`.
"""

from absl import flags

from identity_tf.commands import cli
from identity_tf.training import results_tables

FLAGS = flags.FLAGS
flags.DEFINE_string("results_dir", "docs/results", "The directory of the "
                    "result files (*.json), relative to where the command "
                    "runs.")
flags.DEFINE_list("files", None, "Only these files (names without .json; "
                  "default: every file of --results_dir).")
flags.DEFINE_string("plot", None, "Also draw the training loss and test "
                    "top-1 curves of --arms of the one file --files names "
                    "into this PNG (the runs that carry curves; the mean "
                    "over their seeds).")
flags.DEFINE_list("arms", None, "With --plot: the arms to draw, in this "
                  "order.")
flags.DEFINE_string("plot_rates", None, "Also draw the final validation "
                    "top-1 against the learning rate of the one file --files "
                    "names (a study that selects, e.g. rates) into this PNG.")


def main(argv):
  cli.begin(argv, "--files=precision", start_tensorflow=False)
  with cli.errors_as_exit():
    if FLAGS.plot and (len(FLAGS.files or ()) != 1 or not FLAGS.arms):
      raise ValueError("--plot draws one file's arms: pass --files=NAME "
                       "and --arms=ARM,...")
    files, damaged = results_tables.load(
        cli.resolve_path(FLAGS.results_dir), FLAGS.files)
    # Every table that can be made is printed; each file that cannot is
    # one line on stderr, and the exit status says so.
    failed = []
    for name in FLAGS.files or sorted(set(files) | set(damaged)):
      if name in damaged:
        failed.append(damaged[name])
        continue
      try:
        print(results_tables.file_tables(files, name))
      except (KeyError, TypeError, AttributeError) as e:
        failed.append(f"{name}.json is not a result file ({e!r} missing or "
                      "malformed); docs/results/README.md has the format")
      except ValueError as e:
        failed.append(cli.message(e))
    for line in failed:
      cli.print_stderr(f"error: {line}")
    if failed:
      cli.exit_with(f"{len(failed)} file(s) not tabulated (above); the "
                    "tables of the others are printed", 1)
    if FLAGS.plot_rates and len(FLAGS.files or ()) != 1:
      raise ValueError("--plot_rates draws one file: pass --files=NAME")
    if FLAGS.plot:
      _plot(files)
    if FLAGS.plot_rates:
      from identity_tf.training import study  # pylint: disable=g-import-not-at-top
      [name] = FLAGS.files
      path = cli.resolve_path(FLAGS.plot_rates)
      files_ = dict(files[name], study=files[name].get("study", name))
      study.write_rates(files_, path)
      print(f"figure: {path}")


def _plot(files):
  # Only here: the study library starts TensorFlow, the tables need none.
  from identity_tf.training import study  # pylint: disable=g-import-not-at-top
  [name] = FLAGS.files
  path = cli.resolve_path(FLAGS.plot)
  study.write_curves(results_tables.curves_of(files[name], name, FLAGS.arms),
                     path)
  print(f"figure: {path}")


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
