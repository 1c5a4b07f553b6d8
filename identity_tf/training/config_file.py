"""config.json: what a run is, read and written by this module alone.

A training run writes `run.Run.description()` to MODEL_DIR/config.json --
its `configs.Config`, the network's complete options, the dataset as TFDS
describes it, the input preprocessing -- so that evaluation, export, the
study and a plain re-run of //bin:train need nothing but the directory.

Pure Python for local directories (//bin:train reads the stored
configuration before TensorFlow loads); directories on filesystems only
TensorFlow reads (gs://...) go through `tf.io.gfile`.
"""

import json
import os

from identity_tf import configs

CONFIG_FILE = "config.json"


def _is_url(path):
  return "://" in path


def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def _exists(path):
  return _gfile().exists(path) if _is_url(path) else os.path.exists(path)


def _open(path, mode="r"):
  return _gfile().GFile(path, mode) if _is_url(path) else open(path, mode)


def path(model_dir):
  return os.path.join(model_dir, CONFIG_FILE)


def exists(model_dir):
  return _exists(path(model_dir))


def read(model_dir):
  """config.json of MODEL_DIR as a dict.

  ValueError (one line naming the file) if there is none, or it is not a
  run description (not JSON, or without "config", "model", "preprocessing").
  """
  file = path(model_dir)
  if not _exists(file):
    raise ValueError(f"no {CONFIG_FILE} in --model_dir={model_dir}: is it the "
                     f"model_dir of a training run?")
  try:
    with _open(file) as f:
      description = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{file} is not valid JSON ({e}); restore it from a "
                     "copy, or use a new --model_dir") from None
  missing = [key for key in ("config", "model", "preprocessing")
             if not isinstance(description, dict) or key not in description]
  if missing:
    raise ValueError(f"{file} is not the description of a training run (no "
                     f"{', '.join(missing)}); restore it from a copy, or use "
                     "a new --model_dir")
  return description


def write(model_dir, description):
  """Writes config.json atomically (a temporary file renamed into place)."""
  file = path(model_dir)
  if _is_url(file):
    _gfile().makedirs(model_dir)
  else:
    os.makedirs(model_dir, exist_ok=True)
  with _open(file + ".tmp", "w") as f:
    f.write(json.dumps(description, indent=2, sort_keys=True) + "\n")
  if _is_url(file):
    _gfile().rename(file + ".tmp", file, overwrite=True)
  else:
    os.replace(file + ".tmp", file)


def stored_config(model_dir):
  """The `configs.Config` in MODEL_DIR's config.json, or None if there is
  no config.json; ValueError if it cannot be read as one."""
  if not exists(model_dir):
    return None
  return _config(model_dir, read(model_dir))


def _config(model_dir, description):
  try:
    return configs.from_dict(description["config"])
  except TypeError as e:  # Unknown or missing fields.
    raise ValueError(f"{path(model_dir)} does not hold a configuration this "
                     f"version reads ({e}); use a new --model_dir") from None


def check_resumable(model_dir, config):
  """ValueError if MODEL_DIR already holds a run CONFIG cannot continue.

  A different network (`configs.MODEL_FIELDS`) or batch size (the input
  position is counted in batches) is refused; the optimisation may change
  (learning rate, schedule, train steps: they take effect on resume).
  """
  old = stored_config(model_dir)
  if old is None:
    return
  fixed = configs.MODEL_FIELDS + ("batch_size",)
  changed = [f"{name} ({getattr(old, name)!r} -> {getattr(config, name)!r})"
             for name in fixed if getattr(old, name) != getattr(config, name)]
  if changed:
    raise ValueError(
        f"--model_dir={model_dir} holds a run that cannot continue with "
        f"{', '.join(changed)}; use a new --model_dir, or the same settings "
        f"to resume it")
