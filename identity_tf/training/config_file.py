"""config.json: what a run is, read and written by this module alone.

A training run writes `run.Run.description()` to MODEL_DIR/config.json --
its `configs.Config`, the network's complete options, the dataset as TFDS
describes it, the input preprocessing -- so that evaluation, export, the
study and a plain re-run of //bin:train need nothing but the directory.

Pure Python for local directories (//bin:train reads the stored
configuration before TensorFlow loads); directories on filesystems only
TensorFlow reads (gs://...) go through `tf.io.gfile`.
"""

import dataclasses
import json
import os

from identity_tf import architectures
from identity_tf import configs
from identity_tf import errors
from identity_tf import files

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
    raise errors.ConfigError(no_run_message(model_dir))
  if not _is_url(file) and os.path.isdir(file):
    raise errors.ConfigError(
        f"{file} is a directory, not a run's description; move it away and "
        "restore config.json from a copy, or use a new --model_dir")
  try:
    with _open(file) as f:
      description = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.ConfigError(
        f"{file} is not valid JSON ({e}); restore it from a "
        "copy, or use a new --model_dir") from None
  except RecursionError:
    # Python's parser recurses once per level: a file nested thousands
    # deep is no description, whatever else it holds.
    raise errors.ConfigError(
        f"{file} is not a run's description (JSON nested too deeply to "
        "read); restore it from a copy, or use a new --model_dir") from None
  except OSError as e:
    raise errors.ConfigError(
        f"cannot read {file} ({e.strerror or e}); make it readable, or "
        "use a new --model_dir") from None
  missing = [key for key in ("config", "model", "preprocessing")
             if not isinstance(description, dict) or key not in description]
  if missing:
    raise errors.ConfigError(
        f"{file} is not the description of a training run (no "
        f"{', '.join(missing)}); restore it from a copy, or use "
        "a new --model_dir")
  model = description["model"]
  wrong = [f'"{key}" is {_kind(description[key])}, not an object'
           for key in ("config", "preprocessing")
           if not isinstance(description[key], dict)]
  if not isinstance(model, dict):
    wrong.append(f'"model" is {_kind(model)}, not an object')
  elif not isinstance(model.get("name"), str) or not isinstance(
      model.get("options"), dict):
    wrong.append('"model" lacks its "name" and "options"')
  if description.get("dataset") is not None and not isinstance(
      description["dataset"], dict):
    wrong.append(f'"dataset" is {_kind(description["dataset"])}, not an '
                 "object")
  if wrong:
    raise errors.ConfigError(
        f"{file} is not the description of a training run "
        f"({'; '.join(wrong)}); restore it from a copy, or use "
        "a new --model_dir")
  _check_known(file, description)
  _history(model_dir, description)
  # An earlier version's name beside today's that contradicts it, where
  # either reader looks (the configuration, the network's options): every
  # command refuses the file, none rewrites it under one reading.
  for values in (description["config"], model["options"]):
    try:
      architectures.translate_legacy(values)
    except errors.ContradictionError as e:
      raise errors.ContradictionError(f"{file}: {e}") from None
  return description


# The keys of config.json (`run.Run.description` and `record`'s "history").
DESCRIPTION_KEYS = ("config", "model", "dataset", "preprocessing",
                    "steps_per_epoch", "history")


def known_config_keys():
  """The keys "config" may hold: every field of `configs.Config` and the
  earlier versions' names it translates (`configs.LEGACY_FIELDS`)."""
  return ({field.name for field in dataclasses.fields(configs.Config)} |
          set(getattr(configs, "LEGACY_FIELDS", ())))


def unknown_keys(description):
  """The keys of DESCRIPTION (config.json's dict) this version does not
  know, at its top level and in its "config", as "config.NAME" there."""
  unknown = sorted(set(description) - set(DESCRIPTION_KEYS))
  config = description.get("config")
  if isinstance(config, dict):
    unknown += [f"config.{name}"
                for name in sorted(set(config) - known_config_keys())]
  return unknown


def _check_known(file, description):
  """ConfigError naming them if DESCRIPTION has keys this version does not
  know: settings of a newer version, which this one would neither apply nor
  keep (it rewrites config.json from what it knows)."""
  unknown = unknown_keys(description)
  if unknown:
    raise errors.ConfigError(
        f"{file} holds settings this version of identity_tf does not know "
        f"({', '.join(unknown)}), which it would neither apply nor keep: "
        "run the newer version that wrote it, or use a new --model_dir")


def _kind(value):
  """What a JSON value is, in a few words."""
  if value is None:
    return "null"
  return {dict: "an object", list: "a list", str: "a string",
          bool: "a boolean"}.get(type(value), "a number")


def write(model_dir, description):
  """Writes config.json whole or not at all (`files.write_text_atomically`):
  a crash leaves the old file or the new one, never a mix or an empty
  file."""
  unknown = unknown_keys(description)
  if unknown:  # A key added to the description must be added to those read.
    raise errors.ConfigError(
        f"config.json would hold keys this version does not read back "
        f"({', '.join(unknown)}): add them to config_file.DESCRIPTION_KEYS")
  if _is_url(model_dir):
    _gfile().makedirs(model_dir)
  else:
    os.makedirs(model_dir, exist_ok=True)
  files.write_text_atomically(
      path(model_dir), json.dumps(description, indent=2, sort_keys=True)
      + "\n")


def record(model_dir, description, step):
  """Writes DESCRIPTION (`run.Run.description`) as MODEL_DIR's config.json,
  keeping the run's history: each accepted change of the configuration,
  with the global STEP from which it applies, is appended to "history" as
  {"step": STEP, "changed": {field: [old, new]}}. "config" is what applies
  now; the first configuration applied from step 0 up to the first entry.

  Changes at the step of the last entry (a run stopped before its next
  checkpoint, resumed with other flags) are merged into that entry: a field
  set back to the value it had before the entry leaves it, and an entry
  with no change left is dropped.
  """
  description = dict(description)
  history, changed = [], {}
  if exists(model_dir):
    stored = read(model_dir)
    history = _history(model_dir, stored)
    changed = _changed(model_dir, stored, description["config"])
    if changed:
      history = _add_change(history, step, changed)
  if history:
    description["history"] = history
  write(model_dir, description)
  return change_lines(changed)


def _changed(model_dir, stored, new):
  """{field: [stored value, NEW's]} of each field of config dict NEW that
  differs from STORED (config.json's dict)."""
  # Read through Config, so that a field a newer version added (with its
  # default) is not taken for a change.
  old = configs.to_dict(_config(model_dir, stored))
  return {name: [old.get(name), value] for name, value in new.items()
          if old.get(name) != value}


def changes(model_dir, config):
  """`change_lines` of what CONFIG (a `configs.Config`) would change in
  MODEL_DIR's config.json ([] if there is none)."""
  if not exists(model_dir):
    return []
  return change_lines(_changed(model_dir, read(model_dir),
                               configs.to_dict(config)))


def _show(value):
  """A setting's value as a flag would take it (lists as JSON)."""
  return value if isinstance(value, str) else json.dumps(value)


def change_lines(changed):
  """One line per stored setting a command changes, "name: from → to"
  (CHANGED: {name: [from, to]}), in the order of the fields."""
  return [f"{name}: {_show(old)} \u2192 {_show(new)}"
          for name, (old, new) in changed.items()]


def _history(model_dir, stored):
  """STORED's "history" (config.json's dict), checked: ValueError (one line
  naming the file) unless it is a list of {"step": int, "changed": {name:
  [old, new]}}."""
  history = stored.get("history", [])
  well_formed = isinstance(history, list) and all(
      isinstance(entry, dict) and isinstance(entry.get("step"), int) and
      isinstance(entry.get("changed"), dict) and all(
          isinstance(change, list) and len(change) == 2
          for change in entry["changed"].values())
      for entry in history)
  if not well_formed:
    raise errors.ConfigError(
        f'{path(model_dir)} has a malformed "history" (a list '
        'of {"step": STEP, "changed": {NAME: [OLD, NEW]}} '
        "expected); fix or remove it, or use a new --model_dir")
  return list(history)


def _add_change(history, step, changed):
  """HISTORY with CHANGED ({field: [old, new]}) applied from STEP."""
  if not history or history[-1]["step"] != step:
    return history + [{"step": step, "changed": changed}]
  merged = dict(history[-1]["changed"])
  for name, (old, new) in changed.items():
    # The value before the entry stays the entry's "old" value.
    before = merged[name][0] if name in merged else old
    if before == new:
      merged.pop(name, None)
    else:
      merged[name] = [before, new]
  if not merged:
    return history[:-1]
  return history[:-1] + [{"step": step, "changed": merged}]


def no_run_message(model_dir):
  """What evaluate, export and sharpness say of a directory that holds no
  training run (the same line from each)."""
  return (f"--model_dir={model_dir} holds no training run (no {CONFIG_FILE}, "
          f"no checkpoint): give the --model_dir a training wrote, or train "
          f"into it first")


def stored_config(model_dir):
  """The `configs.Config` in MODEL_DIR's config.json, or None if there is
  no config.json; ValueError if it cannot be read as one."""
  if not exists(model_dir):
    return None
  return _config(model_dir, read(model_dir))


def _config(model_dir, description):
  try:
    return configs.from_dict(description["config"])
  except (TypeError, ValueError, AttributeError) as e:  # Fields, values.
    raise errors.ConfigError(
        f"{path(model_dir)} does not hold a configuration this "
        f"version reads ({e}); use a new --model_dir") from None


def network_changes(model_dir, config):
  """["name (old -> new)"] of each setting CONFIG changes that the run in
  MODEL_DIR cannot continue with ([] if there is no run there).

  A different network (`configs.MODEL_FIELDS`), batch size (the input
  position is counted in batches) or set of held-out examples
  (--validation_examples: the examples trained on) cannot continue; the optimisation may
  change (learning rate, schedule, train steps: they take effect on resume).
  """
  old = stored_config(model_dir)
  if old is None:
    return []
  changed = _differences(old, config, configs.MODEL_FIELDS +
                         ("batch_size", "validation_examples"))
  # Loss scaling adds the scale to the optimizer's checkpoint: a run goes
  # in or out of mixed_float16 only from a new model_dir (float32 and
  # mixed_bfloat16 hold the same variables and may be switched).
  if "mixed_float16" in (old.precision, config.precision):
    changed += _differences(old, config, ("precision",))
  return changed


def run_changes(model_dir, config):
  """["name (old -> new)"] of each setting, bookkeeping apart
  (`configs.BOOKKEEPING_FIELDS`), in which CONFIG differs from the run in
  MODEL_DIR ([] if there is no run there): that run, finished or not, is
  not CONFIG's run. (The trainer continues a run with another schedule or
  budget, `network_changes`; a study refuses it.)"""
  old = stored_config(model_dir)
  if old is None:
    return []
  return _differences(old, config,
                      [f.name for f in dataclasses.fields(config)
                       if f.name not in configs.BOOKKEEPING_FIELDS])


def _differences(old, new, names):
  """["name (old -> new)"] of each of NAMES in which two Configs differ."""
  return [f"{name} ({getattr(old, name)!r} -> {getattr(new, name)!r})"
          for name in names if getattr(old, name) != getattr(new, name)]


def check_resumable(model_dir, config):
  """ValueError (one line) if MODEL_DIR already holds a run CONFIG cannot
  continue (`network_changes`)."""
  changed = network_changes(model_dir, config)
  if changed:
    raise errors.ConfigError(
        f"--model_dir={model_dir} holds a run that cannot continue with "
        f"{', '.join(changed)}; use a new --model_dir, or the same settings "
        f"to resume it")
