"""The run directory: what a training run leaves in its model_dir.

* config.json (`describe_run`, `read_run`, `write_run`): the resolved
  `configs.Config` and what it implies -- the complete network options, the
  dataset as TFDS describes it, the input preprocessing -- so that
  evaluation and export need nothing but the directory;
* the checkpoints `ckpt-<step>` (`find_checkpoint`, `restore_model`);
* TensorBoard event files in `train/` and `eval/` (`write_scalars`).
"""

import json
import os

import tensorflow as tf

from identity_tf import architectures
from identity_tf import configs
from identity_tf import datasets

CONFIG_FILE = "config.json"
CHECKPOINT_PREFIX = "ckpt"


# ---------------------------------------------------------------------------
# config.json.

def model_options(config, info):
  """`identity_tf.build_model` options of CONFIG for dataset INFO, complete.

  The classes come from the dataset; every option the configuration leaves
  None takes the model's default, and the result names them all, so that
  config.json rebuilds the same network even if defaults change.
  """
  _, options = architectures.resolve_options(
      config.model, classes=info.num_classes, width=config.width,
      units=config.units, norm=config.norm, head=config.head,
      init=config.init, seed=config.seed,
      image_size=architectures.input_size(config.model),
      use_bias=config.use_bias, residual=config.residual,
      projection_scale=config.projection_scale)
  return {**options, "units": list(options["units"])}


def preprocessing(config, info):
  """The input preprocessing of CONFIG's network for dataset INFO."""
  return datasets.preprocessing_config(
      info, architectures.input_size(config.model), flip=config.flip)


def steps_per_epoch(config, info):
  """Steps per pass over the training examples; None if their count is not
  known (a dataset that is not prepared)."""
  examples = config.num_train_examples or info.num_train_examples
  return examples / config.batch_size if examples else None


def describe_run(config, info, **extra):
  """config.json's content: CONFIG and what rebuilding the model needs.

  INFO is the dataset's `datasets.DatasetInfo` (classes and their names,
  image shape, splits and sizes), recorded so that evaluation and export
  need nothing but the run directory.
  """
  return {
      "config": configs.to_dict(config),
      "model": {"name": config.model, "options": model_options(config, info)},
      "dataset": info.to_dict(),
      "preprocessing": preprocessing(config, info),
      "steps_per_epoch": steps_per_epoch(config, info),
      **extra,
  }


def read_run(model_dir):
  """config.json of MODEL_DIR as a dict; ValueError if there is none."""
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"no {CONFIG_FILE} in --model_dir={model_dir}: is it the "
                     f"model_dir of a training run?")
  with tf.io.gfile.GFile(path) as f:
    return json.load(f)


def write_run(model_dir, description):
  """Writes config.json atomically (a temporary file renamed into place)."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, CONFIG_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(json.dumps(description, indent=2, sort_keys=True) + "\n")
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def check_resumable(model_dir, config):
  """ValueError if MODEL_DIR already holds a run of a different network."""
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    return
  old = configs.from_dict(read_run(model_dir)["config"])
  changed = [f"{name} ({getattr(old, name)!r} -> {getattr(config, name)!r})"
             for name in configs.MODEL_FIELDS
             if getattr(old, name) != getattr(config, name)]
  if changed:
    raise ValueError(
        f"--model_dir={model_dir} holds a run of a different network: "
        f"{', '.join(changed)}; use a new --model_dir, or the same settings "
        f"to resume it")


# ---------------------------------------------------------------------------
# Checkpoints.

def checkpoint_step(path):
  """The global step of checkpoint PATH (named ckpt-<step>)."""
  return int(os.path.basename(path).rsplit("-", 1)[1])


def find_checkpoint(model_dir, checkpoint=None):
  """Path prefix of CHECKPOINT (a prefix, a file or a step), or the latest."""
  if checkpoint is None:
    path = tf.train.latest_checkpoint(model_dir)
    if path is None:
      raise ValueError(f"no checkpoint in --model_dir={model_dir} yet; train "
                       f"first (bin/train) or wait for one")
    return path
  checkpoint = str(checkpoint)
  if checkpoint.isdigit():
    checkpoint = os.path.join(model_dir, f"{CHECKPOINT_PREFIX}-{checkpoint}")
  elif not os.path.isabs(checkpoint) and "://" not in checkpoint and not (
      tf.io.gfile.exists(checkpoint + ".index")):
    checkpoint = os.path.join(model_dir, checkpoint)
  for suffix in (".index", ".data-00000-of-00001"):
    if checkpoint.endswith(suffix):
      checkpoint = checkpoint[:-len(suffix)]
  if not tf.io.gfile.exists(checkpoint + ".index"):
    raise ValueError(f"no checkpoint {checkpoint} (--checkpoint takes a step "
                     f"number, ckpt-<step> or a path prefix)")
  return checkpoint


def restore_model(model_dir, checkpoint=None):
  """(model, run description, global step) of MODEL_DIR's CHECKPOINT.

  CHECKPOINT: None (the latest), a step, `ckpt-<step>` or a path prefix. The
  model is rebuilt from config.json; only its weights are read (not the
  optimizer or the input position).
  """
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  description = read_run(model_dir)
  path = find_checkpoint(model_dir, checkpoint)
  model = model_lib.build_model(description["model"]["name"],
                                **description["model"]["options"])
  tf.train.Checkpoint(model=model).read(path).expect_partial()
  return model, description, checkpoint_step(path)


# ---------------------------------------------------------------------------
# TensorBoard summaries.

def write_scalars(log_dir, step, values):
  """VALUES ({name: number}) as TensorBoard scalars at STEP in LOG_DIR."""
  writer = tf.summary.create_file_writer(log_dir)
  with writer.as_default():
    for name, value in values.items():
      tf.summary.scalar(name, value, step=step)
  writer.close()


def write_eval_summaries(model_dir, step, metrics):
  """METRICS' loss, top1 and top5 as TensorBoard scalars in MODEL_DIR/eval."""
  write_scalars(os.path.join(model_dir, "eval"), step,
                {name: metrics[name] for name in ("loss", "top1", "top5")})


def read_scalars(log_dir):
  """{name: [(step, value), ...]} of the scalars in LOG_DIR's event files.

  In file order: a resumed run logs the steps after its checkpoint again,
  in a newer file.
  """
  scalars = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(log_dir, "events.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = float(tf.make_ndarray(value.tensor))
        scalars.setdefault(value.tag, []).append((event.step, number))
  return scalars
