"""Trained networks shipped with the repository (models/NAME).

A shipped model is a run directory cut to what evaluation and export read
-- config.json and one checkpoint of the network's weights alone (its
index, data and .sha256 record, TensorFlow's state file naming it; no
optimizer slots, no input position: a third of a training checkpoint's
size) -- with manifest.json: the SHA-256 of every file, the command that
trained it, the CPU it ran on and the test top-1 it reached. `package` makes one from a finished run; `verify` checks
a directory against its manifest. //bin:evaluate and //bin:export take the
directory as any --model_dir and write nothing into it (`is_shipped`).
"""

import json
import os
import shutil

from identity_tf import errors
from identity_tf import files
from identity_tf.training import config_file

MANIFEST = "manifest.json"
# The largest manifest read: a few hundred bytes per file.
_MAX_MANIFEST_BYTES = 1 << 20


def is_shipped(model_dir):
  """Whether MODEL_DIR is a shipped model (it holds a manifest)."""
  return os.path.isfile(os.path.join(model_dir, MANIFEST))


def _sha256(path):
  # Checkpoints' own digest (`checkpoints.write_digest` records the same).
  from identity_tf.training import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.sha256_of(path)


def package(model_dir, output_dir, *, command, machine, test_top1):
  """Writes the weights MODEL_DIR's newest intact checkpoint evaluates
  with (their average with --ema_decay: `checkpoints.restore_checkpoint`)
  and its config.json into OUTPUT_DIR (new or empty), with a manifest of
  their SHA-256, COMMAND (the training command), MACHINE (its CPU) and
  TEST_TOP1 (its final test top-1, as //bin:evaluate prints it). Returns
  the manifest."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from identity_tf.training import checkpoints
  # pylint: enable=g-import-not-at-top
  files.prepare_output_dir(output_dir)
  if os.listdir(output_dir):
    raise errors.OutputError(
        f"--output_dir={output_dir} is not empty; give a new directory")
  config_file.read(model_dir)  # A run's description, or one line.
  source = checkpoints.find_checkpoint(model_dir)
  model, _, _ = checkpoints.restore_checkpoint(model_dir, source)
  name = os.path.basename(source)
  # What `restore_checkpoint` reads back: the network under "model". Run
  # with --ema_decay, the folder's config.json still says so, and finding
  # no average in the checkpoint, evaluation keeps these weights, which
  # are it.
  prefix = tf.train.Checkpoint(model=model).write(
      os.path.join(output_dir, name))
  checkpoints.write_digest(prefix)
  shutil.copyfile(config_file.path(model_dir),
                  os.path.join(output_dir, config_file.CONFIG_FILE))
  # TensorFlow's state file, naming the one checkpoint (relative: the
  # folder moves with the repository).
  files.write_text_atomically(
      os.path.join(output_dir, "checkpoint"),
      f'model_checkpoint_path: "{name}"\nall_model_checkpoint_paths: '
      f'"{name}"\n')
  manifest = {
      "checkpoint": name, "command": command, "machine": machine,
      "test_top1": test_top1,
      "files": {entry: _sha256(os.path.join(output_dir, entry))
                for entry in sorted(os.listdir(output_dir))},
  }
  files.write_text_atomically(os.path.join(output_dir, MANIFEST),
                              json.dumps(manifest, indent=2) + "\n")
  return manifest


def read_manifest(model_dir):
  """MODEL_DIR's manifest; CheckpointError (one line) if it is not one."""
  path = os.path.join(model_dir, MANIFEST)
  try:
    with open(path, "rb") as f:
      text = f.read(_MAX_MANIFEST_BYTES + 1)
    manifest = (json.loads(text) if len(text) <= _MAX_MANIFEST_BYTES
                else None)
  except (OSError, ValueError, RecursionError):
    manifest = None
  if not (isinstance(manifest, dict) and
          isinstance(manifest.get("files"), dict) and all(
              isinstance(k, str) and isinstance(v, str)
              for k, v in manifest["files"].items())):
    raise errors.CheckpointError(
        f"{path} is not a shipped model's manifest; restore the folder "
        "from the repository (git checkout -- " + model_dir + ")")
  return manifest


def verify(model_dir):
  """CheckpointError (one line) unless every file MODEL_DIR's manifest
  names is there with its recorded SHA-256."""
  manifest = read_manifest(model_dir)
  for entry, digest in sorted(manifest["files"].items()):
    path = os.path.join(model_dir, entry)
    if os.path.basename(entry) != entry or not os.path.isfile(path):
      raise errors.CheckpointError(
          f"{path}, which {MANIFEST} lists, is missing; restore the folder "
          f"from the repository (git checkout -- {model_dir})")
    if _sha256(path) != digest:
      raise errors.CheckpointError(
          f"{path} does not match its SHA-256 in {MANIFEST}; restore the "
          f"folder from the repository (git checkout -- {model_dir})")
  return manifest
