"""Runs a named study -- configurations x seeds -- and writes its report.

    bazel run //bin:study -- --study=stabilisers --dataset=fashion_mnist \\
        --data_dir=DIR --epochs=10 --width=0.25 --output_dir=runs/stabilisers
    bazel run //bin:study -- --study=smoke --dataset=synthetic --epochs=2

Each run of the grid trains in OUTPUT_DIR/<arm>/seed<k> (a model_dir of
//bin:train): re-running the command resumes an interrupted run and skips
finished ones, so a study can span sessions (run it with nohup); with
--records=DIR it can span machines (DIR keeps each finished run's record; a
run recorded there is restored into an --output_dir that lacks it). A run
directory in OUTPUT_DIR that holds other settings (another --epochs or
--precision, or an arm since redefined) is refused before anything trains.
A run that diverges is recorded with the step of its first NaN. At the end
(and with --report_only at any time) OUTPUT_DIR gets results.json,
results.md (final and best test top-1, NaN steps, wall time per
configuration) and curves.png, of every run started there: a command for
one more seed or arm adds it to the report.
Progress goes to stderr; the paths of the report to stdout. The studies are
in identity_tf/studies.py (STUDIES); docs/results.md has the published ones,
from their result files in docs/results, which --publish writes:

    bazel run //bin:study -- --study=depth --epochs=10 ... \\
        --output_dir=runs/depth10 --report_only \\
        --publish=docs/results/depth10.json --title="..."

A study that holds out training images scores every run on them each epoch
and reads the test split once, at the end, or not at all (the study says
which); its runs are --deterministic unless --nodeterministic.
"""

import os
import shlex

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl import flags

from identity_tf.commands import cli
from identity_tf import configs
from identity_tf import studies

FLAGS = flags.FLAGS
flags.DEFINE_enum("study", None, sorted(studies.STUDIES), "The study to run.")
cli.define_dataset("fashion_mnist", "Every run's, prepared in --data_dir.")
cli.define_data_dir()
flags.DEFINE_float("epochs", 10.0, "Budget of every run, in epochs.",
                   lower_bound=1e-6)
flags.DEFINE_float("width", None, f"Every run's: {cli.config_help('width')} "
                   "Default: each preset's.", lower_bound=1e-6)
flags.DEFINE_enum("precision", None, configs.PRECISIONS, "Every run's: "
                  f"{cli.config_help('precision')} Default: each preset's; "
                  "an arm that sets its own keeps it.")
flags.DEFINE_list("arms", None, "Train only these arms of the study "
                  "(default: all); with --report_only, report only these.")
flags.DEFINE_multi_integer("seeds", None, "These seeds for every arm "
                           "(default: each arm's); repeat the flag for more.",
                           lower_bound=0)
flags.DEFINE_string("output_dir", None, "Where the runs and the report go "
                    "(default: runs/study_<study>_<dataset>).")
flags.DEFINE_multi_float("top1_levels", None, "Test top-1 levels (0 to 1) "
                         "the report gives every run's minutes to, e.g. a "
                         "baseline's final accuracy (default: 0.85, 0.9 and "
                         "0.92); repeat the flag for more.", lower_bound=0,
                         upper_bound=1)
flags.DEFINE_boolean("deterministic", None, "Every run's: "
                     f"{cli.config_help('deterministic')} Default: the "
                     "study's (on for the studies that hold out images).")
flags.DEFINE_boolean("report_only", False, "Write the report from the runs "
                     "started in --output_dir; train nothing.")
flags.DEFINE_string("publish", None, "Also write the report as a result "
                    "file of docs/results here (docs/results/README.md has "
                    "the format): run paths relative to where the command "
                    "runs, the CPUs the runs trained on, and this command "
                    "without --publish, --title and --report_only, as the "
                    "one that makes the runs. Needs --title.")
flags.DEFINE_string("records", None, "Also keep each finished run's "
                    "record (config.json and metrics.jsonl, no checkpoint) "
                    "in DIR/<arm>/seed<k>, and first restore into "
                    "--output_dir the runs recorded there that it lacks: "
                    "they are skipped and reported as they ran, so that a "
                    "study can go on on another machine.")
flags.DEFINE_string("title", None, "With --publish: the file's title, one "
                    "line.")
flags.mark_flag_as_required("study")
flags.register_validator(
    "title", lambda title: title is None or (title.strip() and
                                             "\n" not in title),
    "--title must be one line of text")
flags.register_multi_flags_validator(
    ["publish", "title"], lambda given: not given["publish"] or
    given["title"], "--publish needs --title=\"...\": the result file's title")
# The flags that make the runs: a published file's command is these, as
# given.
_RUN_FLAGS = ("study", "dataset", "data_dir", "epochs", "width", "precision",
              "output_dir", "arms", "seeds", "deterministic", "top1_levels",
              "records")
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--study=NAME")
  from identity_tf.commands import study  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():  # DatasetNotReadyError too.
    study.study_command(
        FLAGS.study, cli.resolve_path(
            FLAGS.output_dir or f"runs/study_{FLAGS.study}_{FLAGS.dataset}"),
        dataset=FLAGS.dataset, epochs=FLAGS.epochs,
        data_dir=cli.path(FLAGS.data_dir), width=FLAGS.width,
        precision=FLAGS.precision,
        arms=FLAGS.arms, seeds=FLAGS.seeds or None,
        deterministic=FLAGS.deterministic,
        report_only=FLAGS.report_only, top1_levels=FLAGS.top1_levels,
        records=cli.path(FLAGS.records),
        publish=FLAGS.publish and (FLAGS.publish, FLAGS.title,
                                   _command_line()))


def _command_line():
  """The command that trains and reports the runs, as a reader types it:
  the run flags given here (`_RUN_FLAGS`), with $HOME for the home
  directory, so that a published file names no path of this machine."""
  home = os.path.expanduser("~").rstrip("/") + "/"
  home = None if home == "/" else home  # A home of / is not worth naming.
  words = ["./bazelw", "run", "//bin:study", "--"]
  for name in _RUN_FLAGS:
    if FLAGS[name].present:
      for word in FLAGS[name].serialize().splitlines():
        flag, is_set, value = word.partition("=")
        if is_set:
          # Quoted where the shell would split or expand it; $HOME is left
          # outside the quotes, to expand.
          word = flag + "=" + (
              "$HOME/" + shlex.quote(value[len(home):])
              if home and value.startswith(home) else shlex.quote(value))
        words.append(word)
  return " ".join(words)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
