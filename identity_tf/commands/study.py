"""What //bin:study does: train a study's unfinished runs, write its report.

The study itself -- its grid, the runs, the report -- is `training.study`;
this module adds what makes it a command: the output directory checked
before hours of training, progress on stderr, the report's paths on stdout,
and SIGTERM or Ctrl-C turned into one line and the signal's exit status.
"""

import json

from identity_tf import files
from identity_tf import studies
from identity_tf.commands import cli
from identity_tf.training import preemption
from identity_tf.training import results_tables
from identity_tf.training import study as study_lib


def study_command(name, output_dir, *, dataset, epochs, data_dir=None,
                  width=None, precision=None, arms=None, seeds=None,
                  deterministic=None, report_only=False, top1_levels=None,
                  publish=None, records=None, echo=cli.print_stderr,
                  result=print):
  """Trains the runs of study NAME (`studies.STUDIES`) that have not
  finished -- none with REPORT_ONLY -- and writes the report into
  OUTPUT_DIR (`study.report`, with the minutes to each test top-1 level
  of TOP1_LEVELS, None: `study.TOP1_LEVELS`), whose paths go to RESULT.
  PUBLISH, (--publish's path as typed, title, command line), also writes
  the report as a result file of docs/results there (`study.published`),
  the path checked before anything trains. RECORDS, a directory, keeps
  the record of every finished run (`study.keep_records`) and gives back
  those missing from OUTPUT_DIR (`study.restore_records`).

  ECHO receives the progress (`study.run_study`). SIGTERM or Ctrl-C stops
  the study with one line and the signal's exit status once the current run
  has written a checkpoint: the same command resumes it.
  """
  study = studies.STUDIES[name]
  top1_levels = top1_levels or study_lib.TOP1_LEVELS
  files.prepare_output_dir(output_dir)  # Before hours of training, not after.
  if records:
    files.prepare_output_dir(records, "--records")
  if publish:
    typed, title, command = publish
    publish_path = cli.resolve_path(typed)
    files.check_output_file(publish_path, f"--publish={typed}")
  try:
    if report_only:
      if records:
        study_lib.restore_records(study, records, output_dir, arms, seeds)
      results = study_lib.collect(study, output_dir, arms=arms, seeds=seeds,
                                  top1_levels=top1_levels)
    else:
      results = study_lib.run_study(
          study, output_dir, dataset=dataset, epochs=epochs,
          data_dir=data_dir, width=width, precision=precision, arms=arms,
          seeds=seeds, deterministic=deterministic, top1_levels=top1_levels,
          records_dir=records, echo=echo)
    if records:
      kept = study_lib.keep_records(study, output_dir, records, arms, seeds)
      echo(f"the records of {len(kept)} finished run(s) are in {records}")
  except preemption.PreemptedError as e:
    cli.exit_with(f"study stopped: {e}", e.exit_code)
  for path in study_lib.report(results, output_dir, dataset=dataset,
                               epochs=epochs, width=width,
                               precision=precision).values():
    result(path)
  if publish:
    data = study_lib.published(results, title=title, command=command,
                               base_dir=cli.resolve_path("."))
    # What results_tables will read back: a value it would refuse is
    # refused here, before the file lands in docs/results.
    results_tables.check(data, publish_path)
    files.write_text_atomically(
        publish_path, json.dumps(data, indent=2, sort_keys=True) + "\n")
    result(publish_path)
