"""What //bin:train does with a resolved configuration: train and report.

`train_command` trains (`trainer.train`), or for a dry run resolves the
run (`run.prepare`), shows it and writes nothing. It turns
every way a run can stop into one line and an exit status -- 143/130 for
SIGTERM/Ctrl-C after a checkpoint, 1 for errors -- and ends with what the
run reached and where its files are.
"""

import json
import os
import shlex
import sys

import tensorflow as tf

from identity_tf import errors
from identity_tf.commands import cli
from identity_tf.data import tfds_data
from identity_tf.training import config_file
from identity_tf.training import distribute
from identity_tf.training import preemption
from identity_tf.training import run as run_lib
from identity_tf.training import trainer


def train_command(config, model_dir, *, data_dir=None, tpu=None,
                  cluster_timeout=600.0, dry_run=False, verbose=False,
                  progress=cli.print_stderr, result=print):
  """Trains CONFIG in MODEL_DIR as //bin:train does.

  PROGRESS receives where the configuration is (the whole of it when
  VERBOSE, `trainer.train`) and the progress lines (stderr by default),
  RESULT the lines that say what the run reached
  (stdout by default). Exits (SystemExit) with one line on stderr when the
  run stops before its end.
  """
  try:
    # Under parameter_server, workers and parameter servers only serve.
    if (config.strategy == "parameter_server" and
        distribute.run_parameter_server_task()):
      return
    if dry_run:
      _dry_run(config, model_dir, data_dir, progress, result)
      return
    outcome = trainer.train(config, model_dir, data_dir=data_dir, tpu=tpu,
                            cluster_timeout=cluster_timeout, echo=progress,
                            verbose=verbose)
  except preemption.PreemptedError as e:
    cli.exit_with(str(e), e.exit_code)
  except KeyboardInterrupt:  # Ctrl-C before the loop could save anything.
    cli.exit_with("interrupted before training started; nothing was written",
                  130)
  except ValueError as e:  # DatasetNotReadyError and NaN stops too.
    cli.exit_with(f"error: {cli.message(e)}", 1)
  except tf.errors.OpError as e:
    damaged = tfds_data.input_failure(e, config.dataset, data_dir)
    if damaged is not None:
      cli.exit_with(f"error: {cli.message(damaged)}", 1)
    cluster = config.strategy in distribute.CLUSTER_STRATEGIES
    cli.exit_with(
        f"error: {distribute.describe_failure(e, cluster=cluster)}", 1)
  if distribute.is_chief(config.strategy):
    for line in summary(outcome, config, model_dir):
      result(line)
  else:
    task_type, task_id = distribute.cluster_task(config.strategy)
    result(f"done: {task_type} {task_id} of the cluster stopped at step "
           f"{outcome['step']}; the chief wrote the run to {model_dir}")


def _dry_run(config, model_dir, data_dir, progress, result):
  """Resolves and checks CONFIG and MODEL_DIR as `trainer.train` would and
  shows the run, writing nothing: config.json records what runs, not what
  was tried. It contacts no TPU or cluster (only a real run creates its
  strategy), so the batch is checked against one replica only; the dataset
  need not be prepared yet (its metadata is TFDS's), unless
  --standardize=per_channel asks for the statistics of its training images
  (`run.prepare` reads them, or the model_dir's config.json has them)."""
  run = run_lib.prepare(config, tfds_data.dataset_info(config.dataset,
                                                       data_dir),
                        model_dir, data_dir)
  if os.path.isfile(model_dir):
    raise errors.ConfigError(f"--model_dir={model_dir} is a file, not a "
                             "directory; pick another --model_dir")
  config_file.check_resumable(model_dir, config)
  distribute.check_tf_config(config.strategy, progress)
  changed = config_file.changes(model_dir, config)
  if changed:
    progress(f"would change in {config_file.path(model_dir)}:")
    for line in changed:
      progress(line)
  progress(json.dumps(run.description(model_dir=model_dir), indent=2,
                      sort_keys=True))
  result(f"dry run: the configuration above is valid; nothing was "
         f"written to {model_dir}")


def summary(outcome, config, model_dir):
  """The lines that end a run: what it reached and where things are."""
  text = f"done: step {outcome['step']}"
  if not outcome.get("trained", True):
    text += ", nothing trained"
  if outcome["train_top1"] is not None:
    steps = outcome["train_window"]  # Set with train_top1 (trainer._loop).
    text += (f", training top-1 {outcome['train_top1']:.4f} over the last "
             + ("step" if steps == 1 else f"{steps} steps"))
  evaluation = outcome["eval"]
  if evaluation:
    text += (f", evaluation top-1 {evaluation['top1']:.4f} (top-5 "
             f"{evaluation['top5']:.4f}, loss {evaluation['loss']:.4f}) on "
             f"{evaluation['examples']} {config.dataset} examples")
  # The tensorboard next to this interpreter (.venv's under ./bazelw) is the
  # one that is installed; a bare `tensorboard` may not be on PATH.
  tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
  if not os.path.exists(tensorboard):
    tensorboard = "tensorboard"
  # Commands to copy and paste: each word quoted as a shell needs it (a
  # path with a space or a $ stays one word, and inert).
  return [text, f"checkpoints: {model_dir}",
          f"TensorBoard: {shlex.quote(tensorboard)} --logdir "
          f"{shlex.quote(model_dir)}",
          "evaluate:    " + cli.command(
              "evaluate", shlex.quote(f"--model_dir={model_dir}"))]
