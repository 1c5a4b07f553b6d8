"""Runs a named study -- configurations x seeds -- and writes its report.

    bazel run //bin:study -- --study=stabilisers --dataset=fashion_mnist \\
        --data_dir=DIR --epochs=10 --width=0.25 --output_dir=runs/stabilisers
    bazel run //bin:study -- --study=smoke --dataset=synthetic --epochs=2

Each run of the grid trains in OUTPUT_DIR/<arm>/seed<k> (a model_dir of
//bin:train): re-running the command resumes an interrupted run and skips
finished ones, so a study can span sessions (run it with nohup). A run that
diverges is recorded with the step of its first NaN. At the end (and with
--report_only at any time) OUTPUT_DIR gets results.json, results.md (final
and best test top-1, NaN steps, wall time per configuration) and curves.png.
Progress goes to stderr; the paths of the report to stdout. The studies are
in identity_tf/configs.py (STUDIES); docs/results.md has the published one.
"""

import sys

from absl import app
from absl import flags

from identity_tf import configs
from identity_tf import cli

FLAGS = flags.FLAGS
flags.DEFINE_enum("study", None, sorted(configs.STUDIES), "The study to run.")
flags.DEFINE_string("dataset", "fashion_mnist",
                    "Dataset of every run: synthetic or a TFDS image-"
                    "classification dataset, prepared in --data_dir.")
cli.define_data_dir()
flags.DEFINE_float("epochs", 10.0, "Budget of every run, in epochs.",
                   lower_bound=1e-6)
flags.DEFINE_float("width", None, "Width multiplier of every run (default: "
                   "each preset's).", lower_bound=1e-6)
flags.DEFINE_list("arms", None, "Only these arms of the study (default: "
                  "all).")
flags.DEFINE_multi_integer("seeds", None, "These seeds for every arm "
                           "(default: each arm's); repeat the flag for more.")
flags.DEFINE_string("output_dir", None, "Where the runs and the report go "
                    "(default: runs/study_<study>_<dataset>).")
flags.DEFINE_boolean("report_only", False, "Write the report from the runs "
                     "there are; train nothing.")
flags.mark_flag_as_required("study")


def _echo(line):
  print(line, file=sys.stderr, flush=True)


def main(argv):
  cli.begin(argv, "--study=NAME")
  seeds = FLAGS.seeds or None
  study_config = configs.STUDIES[FLAGS.study]
  output_dir = cli.resolve_path(
      FLAGS.output_dir or f"runs/study_{FLAGS.study}_{FLAGS.dataset}")
  data_dir = cli.path(FLAGS.data_dir)
  # pylint: disable=g-import-not-at-top
  from identity_tf.training import preemption
  from identity_tf.training import study
  # pylint: enable=g-import-not-at-top
  try:
    if FLAGS.report_only:
      results = study.collect(study_config, output_dir, arms=FLAGS.arms,
                              seeds=seeds)
    else:
      results = study.run_study(
          study_config, output_dir, dataset=FLAGS.dataset, epochs=FLAGS.epochs,
          data_dir=data_dir, width=FLAGS.width, arms=FLAGS.arms, seeds=seeds,
          echo=_echo)
  except preemption.PreemptedError as e:
    _echo(f"study stopped: {e}")
    sys.exit(e.exit_code)
  except ValueError as e:  # DatasetNotReadyError too.
    raise SystemExit(f"error: {e}") from None
  results.update(dataset=FLAGS.dataset, epochs=FLAGS.epochs,
                 width=FLAGS.width)
  for path in study.write_report(results, output_dir).values():
    print(path)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
