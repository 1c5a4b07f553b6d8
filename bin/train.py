"""Trains one of the paper's networks; re-running the command resumes it.

    bazel run //bin:train -- --preset=smoke
    bazel run //bin:train -- --preset=cifar10_paper \
        --data_dir=~/tensorflow_datasets
    bazel run //bin:train -- --preset=cifar10_paper --strategy=mirrored \
        --model_dir=runs/c10 --learning_rate=0.1

A preset (identity_tf/configs.py) gives every hyper-parameter; each flag
that is set overrides the preset's value. The resolved configuration and the
progress lines go to stderr and MODEL_DIR/config.json; what the run reached
and where its files are go to stdout. See docs/training.md.
"""

import dataclasses
import json
import os
import sys

from absl import app
from absl import flags

from identity_tf import architectures
from identity_tf import configs
from identity_tf import cli
from identity_tf import paths

FLAGS = flags.FLAGS

flags.DEFINE_string(
    "preset", None,
    f"One of {', '.join(configs.PRESETS)}. Default: the configuration stored "
    "in --model_dir if it holds a run, else smoke.")
flags.DEFINE_string(
    "model_dir", None,
    "Where config.json, checkpoints and TensorBoard logs go; re-running with "
    "the same directory resumes. Default: runs/<preset> under the directory "
    "you run from.")
flags.DEFINE_string("data_dir", None,
                    "TFDS data directory (default: TFDS's, "
                    "~/tensorflow_datasets).")
flags.DEFINE_string("tpu", None,
                    "--strategy=tpu: TPU name or grpc:// address (default: "
                    "the local TPU).")
flags.DEFINE_float("cluster_timeout", 600.0,
                   "multi_worker_mirrored: seconds the workers of TF_CONFIG "
                   "may take to join before the run stops.", lower_bound=1.0)
flags.DEFINE_boolean("dry_run", False,
                     "Resolve, print and write config.json, then exit.")

# One override flag per configs.Config field; unset flags keep the preset's.
_HELP = {
    "model": f"Network: {', '.join(configs.MODELS)}.",
    "dataset": "Dataset: synthetic (built in) or any TFDS image-"
               "classification dataset, e.g. cifar10, fashion_mnist.",
    "width": "Multiplier of every layer width (1.0 = the paper's).",
    "units": "Residual units per stage: one integer, or one per stage.",
    "init": f"Initialisation: {', '.join(architectures.INIT_SCHEMES)} (default: the "
            "model's).",
    "head": f"Final projection: {', '.join(architectures.HEADS)} (default: the "
            "model's).",
    "norm": "Batch-norm pre-activation units (default: the model's).",
    "use_bias": "Biases in the convolutions.",
    "seed": "Seeds the initial weights, the projection and the data order.",
    "residual": f"Residual branch: {', '.join(architectures.RESIDUALS)} "
                "(SkipInit's zero gain, Fixup; default plain).",
    "projection_scale": "Variance of the random projection's entries: "
                        "classes (1/classes, the default) or features (1/d).",
    "num_train_examples": "Train on the first N examples of the split only.",
    "num_eval_examples": "Evaluate on the first N examples only.",
    "flip": "Random horizontal flips (default: on, except for digit and "
            "character datasets).",
    "batch_size": "Global batch size (all replicas together).",
    "train_steps": "Total SGD steps (the run stops at this global step).",
    "learning_rate": "Initial learning rate.",
    "lr_schedule": f"Learning-rate schedule: {', '.join(configs.SCHEDULES)}.",
    "lr_boundaries": "piecewise: steps at which the rate is multiplied by "
                     "--lr_decay_factor, comma-separated.",
    "lr_decay_factor": "Factor per boundary (piecewise) or per period "
                       "(exponential).",
    "lr_decay_epochs": "exponential: decay period in epochs.",
    "momentum": "SGD momentum.",
    "weight_decay": "L2 weight decay of the convolution kernels.",
    "warmup_steps": "Linear learning-rate warm-up over the first N steps "
                    "(0: off).",
    "grad_clip_norm": "Clip the global gradient norm to this (0: off).",
    "agc_clip": "Adaptive gradient clipping threshold lambda (NFNets; "
                "0: off).",
    "checkpoint_steps": "Write a checkpoint every N steps.",
    "keep_checkpoints": "Keep the last N checkpoints.",
    "log_steps": "Progress line and TensorBoard scalars every N steps.",
    "steps_per_loop": "Steps per tf.function call.",
    "eval_steps": "Evaluate on the evaluation split every N steps (0: only "
                  "at the end).",
    "eval_at_end": "Evaluate on the evaluation split when training ends.",
    "eval_batch_size": "Batch size of the evaluation at the end.",
    "strategy": f"tf.distribute strategy: {', '.join(configs.STRATEGIES)}.",
    "deterministic": "Deterministic ops and input: bit-identical reruns and "
                     "resumes on CPU.",
}
for _field in dataclasses.fields(configs.Config):
  if _field.name == "preset":
    continue
  _kind = configs.Config.__annotations__[_field.name]
  _help = _HELP[_field.name]
  if _field.name in ("units", "lr_boundaries"):
    flags.DEFINE_list(_field.name, None, _help)
  elif _kind is bool:
    flags.DEFINE_boolean(_field.name, None, _help)
  elif _kind is int:
    flags.DEFINE_integer(_field.name, None, _help)
  elif _kind is float:
    flags.DEFINE_float(_field.name, None, _help)
  else:
    flags.DEFINE_string(_field.name, None, _help)


def _overrides():
  return {f.name: FLAGS[f.name].value
          for f in dataclasses.fields(configs.Config)
          if f.name != "preset"}


def _progress(line):
  print(line, file=sys.stderr, flush=True)


def _result(line):
  print(line, flush=True)


def _stored_config(model_dir):
  """The Config stored in MODEL_DIR/config.json, or None if there is none."""
  if not model_dir:
    return None
  path = os.path.join(model_dir, "config.json")
  if "://" in path:  # A filesystem only TensorFlow reads (gs://...).
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from identity_tf import run_dir  # pylint: disable=g-import-not-at-top
    return (configs.from_dict(run_dir.read_run(model_dir)["config"])
            if tf.io.gfile.exists(path) else None)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return configs.from_dict(json.load(f)["config"])


def _resolve():
  """(config, model_dir) from the flags; ValueError if they are bad.

  Pure Python (but for gs:// model_dirs), so bad flags are reported before
  TensorFlow loads.
  """
  model_dir = paths.resolve_path(FLAGS.model_dir) if FLAGS.model_dir else None
  stored = _stored_config(model_dir) if FLAGS.preset is None else None
  if stored is not None:
    return configs.override(stored, **_overrides()), model_dir
  config = configs.resolve(FLAGS.preset or "smoke", **_overrides())
  return config, model_dir or configs.default_model_dir(config.preset)


def _summary(result, config, model_dir):
  """The lines that end a run: what it reached and where things are."""
  summary = f"done: step {result['step']}"
  if result["train_top1"] is not None:
    summary += (f", training top-1 {result['train_top1']:.4f} over the last "
                f"{config.log_steps} steps")
  evaluation = result["eval"]
  if evaluation:
    summary += (f", evaluation top-1 {evaluation['top1']:.4f} (top-5 "
                f"{evaluation['top5']:.4f}, loss {evaluation['loss']:.4f}) on "
                f"{evaluation['examples']} {config.dataset} examples")
  # The tensorboard next to this interpreter (.venv's under ./bazelw) is the
  # one that is installed; a bare `tensorboard` may not be on PATH.
  tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
  if not os.path.exists(tensorboard):
    tensorboard = "tensorboard"
  return [summary, f"checkpoints: {model_dir}",
          f"TensorBoard: {tensorboard} --logdir {model_dir}",
          f"evaluate:    {cli.command('evaluate', f'--model_dir={model_dir}')}"]


def main(argv):
  cli.begin(argv, "--train_steps=100")
  try:
    config, model_dir = _resolve()
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None

  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from identity_tf import distribute
  from identity_tf import run_dir
  from identity_tf import tfds_data
  from identity_tf import train
  # pylint: enable=g-import-not-at-top
  data_dir = paths.resolve_path(FLAGS.data_dir) if FLAGS.data_dir else None
  try:
    # Under parameter_server, workers and parameter servers only serve.
    if (config.strategy == "parameter_server" and
        distribute.run_parameter_server_task()):
      return
    info = tfds_data.dataset_info(config.dataset, data_dir)
    _progress(json.dumps(run_dir.describe_run(config, info,
                                              model_dir=model_dir),
                         indent=2, sort_keys=True))
    if FLAGS.dry_run:
      run_dir.check_writable(model_dir)
      run_dir.check_resumable(model_dir, config)
      run_dir.write_run(model_dir, run_dir.describe_run(config, info))
      _result(f"dry run: wrote {os.path.join(model_dir, run_dir.CONFIG_FILE)}")
      return
    result = train.train(config, model_dir, data_dir=data_dir,
                         tpu=FLAGS.tpu, cluster_timeout=FLAGS.cluster_timeout,
                         echo=_progress)
  except train.PreemptedError as e:
    _stop(str(e), e.exit_code)
  except KeyboardInterrupt:  # Ctrl-C before the loop could save anything.
    _stop("interrupted before training started; nothing was written", 130)
  except ValueError as e:  # DatasetNotReadyError and NaN stops too.
    _stop(f"error: {e}", 1)
  except tf.errors.OpError as e:
    _stop(f"error: {distribute.describe_failure(e)}", 1)
  if distribute.is_chief():
    for line in _summary(result, config, model_dir):
      _result(line)


def _stop(line, code):
  """LINE on stderr, exit with CODE."""
  print(line, file=sys.stderr, flush=True)
  sys.exit(code)


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  app.run(main)


if __name__ == "__main__":
  run()
