"""The run directory: what a training run leaves in its model_dir.

* config.json (`describe_run`, `read_run`, `write_run`): the resolved
  `configs.Config` and what it implies -- the complete network options, the
  dataset as TFDS describes it, the input preprocessing -- so that
  evaluation and export need nothing but the directory;
* the checkpoints `ckpt-<step>` (`find_checkpoint`, `restore_model`), each
  with a `ckpt-<step>.sha256` of its files; found from the files on disk,
  not from TensorFlow's `checkpoint` state file, and checked before use
  (`intact_checkpoints`), so that a damaged or half-written checkpoint is
  never restored and never hides the intact ones before it;
* TensorBoard event files in `train/` and `eval/` (`write_scalars`).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time

import tensorflow as tf
from tensorflow.core.util import event_pb2

from identity_tf import architectures
from identity_tf import configs
from identity_tf import datasets

CONFIG_FILE = "config.json"
CHECKPOINT_PREFIX = "ckpt"
# Where training moves checkpoints it found damaged (kept, never deleted).
DAMAGED_DIR = "damaged"
LOCK_FILE = ".train.lock"


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
  """config.json of MODEL_DIR as a dict.

  ValueError (one line naming the file) if there is none, or it is not a
  run description (not JSON, or without "config", "model", "preprocessing").
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"no {CONFIG_FILE} in --model_dir={model_dir}: is it the "
                     f"model_dir of a training run?")
  try:
    with tf.io.gfile.GFile(path) as f:
      description = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); restore it from a "
                     "copy, or use a new --model_dir") from None
  missing = [key for key in ("config", "model", "preprocessing")
             if not isinstance(description, dict) or key not in description]
  if missing:
    raise ValueError(f"{path} is not the description of a training run (no "
                     f"{', '.join(missing)}); restore it from a copy, or use "
                     "a new --model_dir")
  return description


def write_run(model_dir, description):
  """Writes config.json atomically (a temporary file renamed into place)."""
  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, CONFIG_FILE)
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write(json.dumps(description, indent=2, sort_keys=True) + "\n")
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def check_resumable(model_dir, config):
  """ValueError if MODEL_DIR already holds a run CONFIG cannot continue.

  A different network (`configs.MODEL_FIELDS`) or batch size (the input
  position is counted in batches) is refused; the optimisation may change
  (learning rate, schedule, train steps: they take effect on resume).
  """
  path = os.path.join(model_dir, CONFIG_FILE)
  if not tf.io.gfile.exists(path):
    return
  try:
    old = configs.from_dict(read_run(model_dir)["config"])
  except TypeError as e:  # Unknown or missing fields.
    raise ValueError(f"{path} does not hold a configuration this version "
                     f"reads ({e}); use a new --model_dir") from None
  fixed = configs.MODEL_FIELDS + ("batch_size",)
  changed = [f"{name} ({getattr(old, name)!r} -> {getattr(config, name)!r})"
             for name in fixed if getattr(old, name) != getattr(config, name)]
  if changed:
    raise ValueError(
        f"--model_dir={model_dir} holds a run that cannot continue with "
        f"{', '.join(changed)}; use a new --model_dir, or the same settings "
        f"to resume it")


def check_writable(model_dir):
  """MODEL_DIR, created if need be; ValueError (one line) if it cannot hold
  a run: a file, or a directory this process cannot write."""
  if "://" in model_dir:
    return model_dir
  if os.path.exists(model_dir) and not os.path.isdir(model_dir):
    raise ValueError(f"--model_dir={model_dir} is a file, not a directory; "
                     "pick another --model_dir")
  try:
    os.makedirs(model_dir, exist_ok=True)
    probe = os.path.join(model_dir, f".write-test-{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"--model_dir={model_dir} is not writable "
                     f"({e.strerror}); pick another --model_dir or fix its "
                     "permissions") from None
  return model_dir


@contextlib.contextmanager
def lock(model_dir):
  """Holds MODEL_DIR for one training; ValueError if another holds it.

  An exclusive `flock` on MODEL_DIR/.train.lock: released by the operating
  system when the process ends, however it ends, so a lock is never left
  stale. Filesystems that TensorFlow alone reads (gs://) are not locked.
  """
  if "://" in model_dir:
    yield
    return
  path = os.path.join(model_dir, LOCK_FILE)
  with open(path, "a+") as f:
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.seek(0)
      holder = f.read().strip() or "another process"
      raise ValueError(f"--model_dir={model_dir} is in use by another training "
                       f"({holder}); wait for it to finish or stop it, or "
                       "use another --model_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
    f.flush()
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------
# Checkpoints.

def checkpoint_step(path):
  """The global step of checkpoint PATH (named ckpt-<step>)."""
  return int(os.path.basename(path).rsplit("-", 1)[1])


def checkpoint_prefixes(model_dir):
  """The checkpoints in MODEL_DIR, newest first: every ckpt-<step> that has
  an index or a data file (one without the other is damaged)."""
  steps = {}
  pattern = os.path.join(model_dir, f"{CHECKPOINT_PREFIX}-*")
  for path in tf.io.gfile.glob(pattern):
    name = os.path.basename(path)
    stem = name.split(".", 1)[0]
    if "." not in name or not stem[len(CHECKPOINT_PREFIX) + 1:].isdigit():
      continue  # ckpt-40_temp/ and the like: not a checkpoint.
    steps[int(stem[len(CHECKPOINT_PREFIX) + 1:])] = os.path.join(model_dir,
                                                                  stem)
  return [steps[step] for step in sorted(steps, reverse=True)]


def _files(prefix):
  return sorted(tf.io.gfile.glob(prefix + ".index") +
                tf.io.gfile.glob(prefix + ".data-*"))


def _sha256(path):
  digest = hashlib.sha256()
  with tf.io.gfile.GFile(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def write_digest(prefix):
  """Records the SHA-256 of checkpoint PREFIX's files in PREFIX.sha256.

  TensorFlow's bundle checksums cover each tensor; the digest covers every
  byte, the index and the input iterator's state included.
  """
  digests = {os.path.basename(path): _sha256(path) for path in _files(prefix)}
  with tf.io.gfile.GFile(prefix + ".sha256.tmp", "w") as f:
    json.dump(digests, f, indent=1, sort_keys=True)
  tf.io.gfile.rename(prefix + ".sha256.tmp", prefix + ".sha256",
                     overwrite=True)


def damage(prefix):
  """Why checkpoint PREFIX cannot be restored (one line), or None if intact.

  Checks that the index and every data shard are there, the recorded
  SHA-256 of every file (`write_digest`) where there is one, and, with
  TensorFlow's own reader, that every tensor reads back with its checksum.
  """
  index = prefix + ".index"
  if not tf.io.gfile.exists(index):
    return "its .index file is missing"
  data = [p for p in _files(prefix) if p != index]
  if not data:
    return "its .data file is missing"
  shards = int(data[0].rsplit("-of-", 1)[1])
  if len(data) != shards:
    return f"{shards - len(data)} of its {shards} data shards are missing"
  if tf.io.gfile.exists(prefix + ".sha256"):
    try:
      with tf.io.gfile.GFile(prefix + ".sha256") as f:
        recorded = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError):
      return "its .sha256 record is unreadable"
    for path in _files(prefix):
      name = os.path.basename(path)
      if recorded.get(name) != _sha256(path):
        return f"{name} does not match its recorded SHA-256"
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name, dtype in reader.get_variable_to_dtype_map().items():
      # The input iterator's state is a variant, which the reader cannot
      # return; the SHA-256 record covers its bytes.
      if dtype != tf.variant:
        reader.get_tensor(name)
  except (tf.errors.OpError, IndexError, ValueError) as e:
    return f"TensorFlow cannot read it ({str(e).splitlines()[0][:160]})"
  return None


def intact_checkpoints(model_dir, echo=None):
  """([intact checkpoint prefixes, newest first], {damaged prefix: reason}).

  Only the newest ones are checked until one is intact (older ones are
  assumed as good as they were when training moved past them); ECHO
  receives one line per damaged checkpoint.
  """
  intact, damaged = [], {}
  for prefix in checkpoint_prefixes(model_dir):
    if not intact:
      reason = damage(prefix)
      if reason:
        damaged[prefix] = reason
        if echo:
          echo(f"{os.path.basename(prefix)} is damaged: {reason}")
        continue
    intact.append(prefix)
  return intact, damaged


def quarantine(model_dir, damaged):
  """Moves the files of DAMAGED checkpoints into MODEL_DIR/damaged/<time>/.

  Kept, not deleted: a damaged checkpoint may still be worth a look. Also
  removes the `ckpt-<step>_temp` directories of interrupted saves.
  """
  if damaged:
    target = os.path.join(model_dir, DAMAGED_DIR,
                          time.strftime("%Y%m%d-%H%M%S"))
    tf.io.gfile.makedirs(target)
    for prefix in damaged:
      for path in tf.io.gfile.glob(prefix + ".*"):
        tf.io.gfile.rename(path, os.path.join(target, os.path.basename(path)),
                           overwrite=True)
  for path in tf.io.gfile.glob(os.path.join(model_dir,
                                            f"{CHECKPOINT_PREFIX}-*_temp*")):
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)


def remove_checkpoint(model_dir, step):
  """Removes every file of checkpoint STEP in MODEL_DIR (a failed save)."""
  prefix = os.path.join(model_dir, f"{CHECKPOINT_PREFIX}-{step}")
  for path in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(
      prefix + "_temp*"):
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    else:
      tf.io.gfile.remove(path)


def prune_digests(model_dir):
  """Removes the .sha256 records of checkpoints that rotation deleted."""
  for path in tf.io.gfile.glob(os.path.join(model_dir,
                                            f"{CHECKPOINT_PREFIX}-*.sha256")):
    if not tf.io.gfile.exists(path[:-len(".sha256")] + ".index"):
      tf.io.gfile.remove(path)


def record_checkpoints(model_dir, intact):
  """Rewrites TensorFlow's `checkpoint` state file to list INTACT (newest
  first), whatever the file held: the list the CheckpointManager resumes
  and rotates (oldest deleted first, beyond keep_checkpoints). The file is
  TensorFlow's CheckpointState text format, each checkpoint with its
  index's time."""
  path = os.path.join(model_dir, "checkpoint")
  if not intact:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
    return
  lines = [f'model_checkpoint_path: "{os.path.basename(intact[0])}"']
  oldest_first = list(reversed(intact))
  lines += [f'all_model_checkpoint_paths: "{os.path.basename(p)}"'
            for p in oldest_first]
  lines += [f"all_model_checkpoint_timestamps: "
            f"{tf.io.gfile.stat(p + '.index').mtime_nsec / 1e9}"
            for p in oldest_first]
  with tf.io.gfile.GFile(path + ".tmp", "w") as f:
    f.write("\n".join(lines) + "\n")
  tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def find_checkpoint(model_dir, checkpoint=None, echo=None):
  """Path prefix of CHECKPOINT (a prefix, a file or a step), or the newest
  intact one (damaged newer ones are skipped, named to ECHO)."""
  if checkpoint is None:
    intact, damaged = intact_checkpoints(model_dir, echo)
    if not intact:
      if damaged:
        raise ValueError(
            f"no intact checkpoint in --model_dir={model_dir}: "
            + "; ".join(f"{os.path.basename(p)}: {r}"
                        for p, r in damaged.items()))
      raise ValueError(f"no checkpoint in --model_dir={model_dir} yet; train "
                       f"first (bin/train) or wait for one")
    return intact[0]
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
  reason = damage(checkpoint)
  if reason:
    raise ValueError(f"checkpoint {checkpoint} is damaged: {reason}")
  return checkpoint


def restore_model(model_dir, checkpoint=None, echo=None):
  """(model, run description, global step) of MODEL_DIR's CHECKPOINT.

  CHECKPOINT: None (the newest intact one; ECHO hears of damaged newer
  ones), a step, `ckpt-<step>` or a path prefix. The model is rebuilt from
  config.json; only its weights are read (not the optimizer or the input
  position).
  """
  return restore_checkpoint(model_dir,
                            find_checkpoint(model_dir, checkpoint, echo))


def restore_checkpoint(model_dir, path):
  """`restore_model` of PATH, a prefix `find_checkpoint` has already found
  and verified (verifying reads every byte: not twice)."""
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  description = read_run(model_dir)
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
    # tf.data rather than tf.compat.v1.train.summary_iterator, which warns
    # that it is deprecated on every call.
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        number = float(tf.make_ndarray(value.tensor))
        scalars.setdefault(value.tag, []).append((event.step, number))
  return scalars
