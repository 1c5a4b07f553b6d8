"""Prints the tables of docs/results.md from the committed result files.

    bazel run //bin:results_tables                         # every file
    bazel run //bin:results_tables -- --files=normfree_w025,precision

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


def main(argv):
  cli.begin(argv, "--files=precision", start_tensorflow=False)
  with cli.errors_as_exit():
    files = results_tables.load(cli.resolve_path(FLAGS.results_dir),
                                FLAGS.files)
    tables = []
    for name in FLAGS.files or sorted(files):
      try:
        tables.append(results_tables.file_tables(files, name))
      except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{name}.json is not a result file ({e!r} missing "
                         "or malformed); docs/results/README.md has the "
                         "format") from None
    print("\n".join(tables), end="")


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
