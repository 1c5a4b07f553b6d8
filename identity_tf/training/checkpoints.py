"""A run's checkpoints: found, verified, quarantined, saved and restored.

Checkpoints `ckpt-<step>` are written by a `tf.train.CheckpointManager`
over the model, the optimizer and, where tf.data allows, the input
iterator (`trainer`), each with a `ckpt-<step>.sha256` of its files
(`write_digest`). They are found from the files on disk, not from
TensorFlow's `checkpoint` state file, and checked before use (`damage`,
`intact_checkpoints`), so that a damaged or half-written checkpoint is never
restored and never hides the intact ones before it: damaged ones are moved
to MODEL_DIR/damaged/ (`quarantine`) and the state file is rewritten to list
the intact ones (`record_checkpoints`), which is what the manager resumes
and rotates. One training at a time holds a model_dir (`lock`).
"""

import contextlib
import fcntl
import hashlib
import json
import os
import time

from google.protobuf import text_format
import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2

from identity_tf import errors
from identity_tf import files
from identity_tf import model as model_lib
from identity_tf.training import config_file
from identity_tf.training import optimization
from identity_tf.training import run as run_lib

CHECKPOINT_PREFIX = "ckpt"
# Where training moves checkpoints it found damaged (kept, never deleted).
DAMAGED_DIR = "damaged"
LOCK_FILE = ".train.lock"


# ---------------------------------------------------------------------------
# The directory.

class DamagedCheckpointError(errors.CheckpointError):
  """Checkpoint PREFIX turned out damaged while it was restored (REASON)."""

  def __init__(self, prefix, reason):
    super().__init__(f"{os.path.basename(prefix)} is damaged: {reason}")
    self.prefix, self.reason = prefix, reason


def check_writable(model_dir):
  """MODEL_DIR, created if need be; ValueError (one line) if it cannot hold
  a run: a file, or a directory this process cannot write."""
  if "://" in model_dir:
    return model_dir
  if os.path.exists(model_dir) and not os.path.isdir(model_dir):
    raise errors.CheckpointError(
        f"--model_dir={model_dir} is a file, not a directory; "
        "pick another --model_dir")
  try:
    os.makedirs(model_dir, exist_ok=True)
    probe = os.path.join(model_dir, f".write-test-{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise errors.CheckpointError(
        f"--model_dir={model_dir} is not writable "
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
      raise errors.CheckpointError(
          f"--model_dir={model_dir} is in use by another training "
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


def _files_by_step(model_dir):
  """{step: suffixes} of the `ckpt-<step>.<suffix>` files in MODEL_DIR
  (index, data-*, sha256, and the sha256.<pid>.<id>.tmp a kill may leave);
  ckpt-40_temp/ and the like are left out. The one place that reads
  checkpoint names off the directory."""
  found = {}
  for path in tf.io.gfile.glob(os.path.join(model_dir,
                                            f"{CHECKPOINT_PREFIX}-*")):
    stem, _, suffix = os.path.basename(path).partition(".")
    step = stem[len(CHECKPOINT_PREFIX) + 1:]
    if step.isdigit() and suffix:
      found.setdefault(int(step), []).append(suffix)
  return found


def _prefix(model_dir, step):
  return os.path.join(model_dir, f"{CHECKPOINT_PREFIX}-{step}")


def checkpoint_prefixes(model_dir):
  """The checkpoints in MODEL_DIR, newest first: every ckpt-<step> that has
  an index or a data file (one without the other is damaged). A lone
  `.sha256` record is not one: a kill between rotation and `prune_digests`
  leaves it, and the next save removes it."""
  files = _files_by_step(model_dir)
  return [_prefix(model_dir, step) for step in sorted(files, reverse=True)
          if any(suffix == "index" or suffix.startswith("data-")
                 for suffix in files[step])]


def _files(prefix):
  return sorted(tf.io.gfile.glob(prefix + ".index") +
                tf.io.gfile.glob(prefix + ".data-*"))


# The largest .sha256 record `damage` reads: a checkpoint of ten thousand
# shards' record is about 1 MB.
MAX_DIGEST_BYTES = 1 << 20


def sha256_of(path):
  """The SHA-256 of the file at PATH (any filesystem TensorFlow reads), as hex."""
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
  digests = {os.path.basename(path): sha256_of(path) for path in _files(prefix)}
  files.write_text_atomically(prefix + ".sha256",
                              json.dumps(digests, indent=1, sort_keys=True))


def _missing_file(prefix):
  """Which file checkpoint PREFIX lacks (one line), or None: its index and
  every data shard are there."""
  index = prefix + ".index"
  if not tf.io.gfile.exists(index):
    return "its .index file is missing"
  data = [p for p in _files(prefix) if p != index]
  if not data:
    return "its .data file is missing"
  shards = int(data[0].rsplit("-of-", 1)[1])
  if len(data) != shards:
    return f"{shards - len(data)} of its {shards} data shards are missing"
  return None


def damage(prefix):
  """Why checkpoint PREFIX cannot be restored (one line), or None if intact.

  Checks that the index and every data shard are there, the recorded
  SHA-256 of every file (`write_digest`) where there is one, and, with
  TensorFlow's own reader, that every tensor reads back with its checksum.
  """
  missing = _missing_file(prefix)
  if missing:
    return missing
  if tf.io.gfile.exists(prefix + ".sha256"):
    try:
      # A bounded prefix: a record is ~100 bytes per file of the
      # checkpoint, and a file far larger is none (read whole, 300 MB took
      # 1.5 GB before it was refused).
      with tf.io.gfile.GFile(prefix + ".sha256", "rb") as f:
        text = f.read(MAX_DIGEST_BYTES + 1)
      recorded = (None if len(text) > MAX_DIGEST_BYTES
                  else json.loads(text))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
      recorded = None
    # `write_digest` writes {file name: digest}; anything else was not
    # written by it (a hand, another program, a disk's damage).
    if not isinstance(recorded, dict):
      return "its .sha256 record is unreadable"
    for path in _files(prefix):
      name = os.path.basename(path)
      if recorded.get(name) != sha256_of(path):
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


def intact_checkpoints(model_dir, echo=None, older_files=False):
  """([intact checkpoint prefixes, newest first], {damaged prefix: reason}).

  Only the newest ones are checked (`damage`) until one is intact: older
  ones are assumed as good as they were when training moved past them.
  OLDER_FILES: also check that each older one has all its files
  (`_missing_file`), for the training that holds the directory -- rotation
  deletes a checkpoint's index before its data, and a kill in between
  leaves half of one; a reader beside a running training would see rotation
  mid-way. ECHO receives one line per damaged checkpoint.
  """
  intact, damaged = [], {}
  for prefix in checkpoint_prefixes(model_dir):
    if not intact:
      reason = damage(prefix)
    else:
      reason = _missing_file(prefix) if older_files else None
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
  prefix = _prefix(model_dir, step)
  for path in tf.io.gfile.glob(prefix + ".*") + tf.io.gfile.glob(
      prefix + "_temp*"):
    if tf.io.gfile.isdir(path):
      tf.io.gfile.rmtree(path)
    else:
      tf.io.gfile.remove(path)


def prune_digests(model_dir):
  """Removes the .sha256 records (and a kill's temporary ones) of checkpoints
  that rotation deleted."""
  for step, suffixes in _files_by_step(model_dir).items():
    if "index" not in suffixes:
      for suffix in suffixes:
        if suffix.startswith("sha256"):
          tf.io.gfile.remove(f"{_prefix(model_dir, step)}.{suffix}")


def record_checkpoints(model_dir, intact):
  """Rewrites TensorFlow's `checkpoint` state file to list INTACT (newest
  first), whatever the file held: the list the CheckpointManager resumes
  and rotates (oldest deleted first, beyond keep_checkpoints), each
  checkpoint with its index's time."""
  path = os.path.join(model_dir, "checkpoint")
  if not intact:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
    return
  oldest_first = list(reversed(intact))
  # Relative names, as the CheckpointManager itself writes them (with an
  # absolute save_dir TensorFlow keeps them as given). The proto is
  # TensorFlow's own; update_checkpoint_state, which would also write it,
  # is deprecated and says so on every resume.
  state = tf.compat.v1.train.generate_checkpoint_state_proto(
      os.path.abspath(model_dir), os.path.basename(intact[0]),
      all_model_checkpoint_paths=[os.path.basename(p) for p in oldest_first],
      all_model_checkpoint_timestamps=[
          tf.io.gfile.stat(p + ".index").mtime_nsec / 1e9
          for p in oldest_first])
  files.write_text_atomically(path, text_format.MessageToString(state))


def resume_point(model_dir, chief=True, echo=None):
  """The checkpoint a training in MODEL_DIR resumes from (None: start).

  The chief moves damaged checkpoints aside and rewrites the state file to
  list the intact ones; ValueError (nothing changed) if there are
  checkpoints but none is intact, or only their .sha256 records are left:
  training does not start again from step 0 over them.
  """
  intact, damaged = intact_checkpoints(model_dir, older_files=True)
  records = sorted((step for step, suffixes in _files_by_step(model_dir).items()
                    if "sha256" in suffixes), reverse=True)
  if records and not intact and not damaged:
    # Only rotation leaves a record without its checkpoint, and never
    # without a newer checkpoint: every file of every checkpoint is gone.
    raise errors.CheckpointError(
        f"--model_dir={model_dir} holds the SHA-256 records of checkpoints ("
        + ", ".join(f"{CHECKPOINT_PREFIX}-{step}.sha256" for step in records)
        + ") but none of their files; nothing was changed: restore them from "
        "a copy, or use a new --model_dir (training does not start again "
        "from step 0 over them)")
  if damaged and not intact:  # Named in the error, once.
    raise errors.CheckpointError(
        f"--model_dir={model_dir} holds checkpoints but none is intact ("
        + "; ".join(f"{os.path.basename(p)}: {r}" for p, r in damaged.items())
        + "); nothing was changed: restore them from a copy, or use a new "
        "--model_dir (training does not start again from step 0 over them)")
  for prefix, reason in damaged.items():
    if echo:
      echo(f"{os.path.basename(prefix)} is damaged: {reason}")
  if chief:
    quarantine(model_dir, damaged)
    record_checkpoints(model_dir, intact)
    if damaged and echo:
      echo(f"moved {', '.join(os.path.basename(p) for p in damaged)} to "
           f"{os.path.join(model_dir, DAMAGED_DIR)}/; resuming from "
           f"{os.path.basename(intact[0])}, the newest intact checkpoint")
  return intact[0] if intact else None


# Seconds a worker that is not the chief waits for the chief's checkpoint of
# the step it ended at (both save it at once) before keeping its own copy.
CHIEF_CHECKPOINT_WAIT = 30.0


def discard_worker_copy(worker_dir, model_dir, wait=CHIEF_CHECKPOINT_WAIT):
  """Removes WORKER_DIR, the checkpoints of a multi-worker worker that is not
  the chief, once the chief's checkpoint of the same step or a later one is
  whole in MODEL_DIR (with its .sha256 record, written last).

  tf.distribute has every worker save and the non-chief copies thrown away:
  that is safe only where the chief's copy exists. Where it does not appear
  within WAIT seconds -- a model_dir the workers do not share, a chief that
  failed to save -- the worker's copy is the only one: it is kept, and
  ValueError (one line) says where.
  """
  if not tf.io.gfile.exists(worker_dir):
    return
  mine = checkpoint_prefixes(worker_dir)
  if mine:
    step = checkpoint_step(mine[0])
    deadline = time.monotonic() + wait
    while not any(checkpoint_step(p) >= step and
                  tf.io.gfile.exists(p + ".sha256")
                  for p in checkpoint_prefixes(model_dir)):
      if time.monotonic() >= deadline:
        raise errors.CheckpointError(
            f"the chief's checkpoint of step {step} is not in "
            f"--model_dir={model_dir} (waited {wait:g} s), so this worker "
            f"kept its own copy in {worker_dir}: --model_dir must be a "
            "directory every worker of the cluster sees (docs/training.md, "
            "Strategies)")
      time.sleep(0.5)
  tf.io.gfile.rmtree(worker_dir)


def save(manager, step, directory):
  """MANAGER's checkpoint of STEP in DIRECTORY, with its digest; its path.

  A save that fails (a full disk, say) removes what it had written, so that
  it is not mistaken for a checkpoint, and raises ValueError (one line)
  naming the newest checkpoint that was written.
  """
  try:
    path = manager.save(checkpoint_number=step)
    write_digest(path)
    prune_digests(directory)
  except (OSError, tf.errors.OpError) as e:
    remove_checkpoint(directory, step)
    reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
    # The manager may already list the removed checkpoint (the failure came
    # after its save): name what is on disk.
    newest = checkpoint_prefixes(directory)
    raise errors.CheckpointError(
        f"could not write the checkpoint of step {step} in {directory} "
        f"({reason}); {last_written(newest[0] if newest else None)}; free "
        "space (or fix the directory) and run the same command to "
        "resume") from e
  return path


def last_written(manager_or_path):
  """What a stopped run says of its newest checkpoint (a CheckpointManager's
  latest, or a path prefix; None: there is none)."""
  latest = getattr(manager_or_path, "latest_checkpoint", manager_or_path)
  if latest:
    return (f"stopped; the latest checkpoint, written before it with finite "
            f"weights, is {latest} (step {checkpoint_step(latest)})")
  return "stopped; no checkpoint was written"


def find_checkpoint(model_dir, checkpoint=None, echo=None):
  """Path prefix of CHECKPOINT (a prefix, a file or a step), or the newest
  intact one (damaged newer ones are skipped, named to ECHO)."""
  if checkpoint is None:
    intact, damaged = intact_checkpoints(model_dir)
    if not intact:
      if damaged:  # Named here, once: no notes before the error.
        raise errors.CheckpointError(
            f"no intact checkpoint in --model_dir={model_dir}: "
            + "; ".join(f"{os.path.basename(p)}: {r}"
                        for p, r in damaged.items()))
      if not config_file.exists(model_dir):
        raise errors.CheckpointError(config_file.no_run_message(model_dir))
      raise errors.CheckpointError(
          f"no checkpoint in --model_dir={model_dir} yet; train "
          f"first (bin/train) or wait for one")
    for prefix, reason in damaged.items():
      if echo:
        echo(f"{os.path.basename(prefix)} is damaged: {reason}")
    return intact[0]
  checkpoint = str(checkpoint)
  if checkpoint.isdigit():
    checkpoint = _prefix(model_dir, checkpoint)
  elif not os.path.isabs(checkpoint) and "://" not in checkpoint and not (
      tf.io.gfile.exists(checkpoint + ".index")):
    checkpoint = os.path.join(model_dir, checkpoint)
  for suffix in (".index", ".data-00000-of-00001"):
    if checkpoint.endswith(suffix):
      checkpoint = checkpoint[:-len(suffix)]
  if not tf.io.gfile.exists(checkpoint + ".index"):
    raise errors.CheckpointError(
        f"no checkpoint {checkpoint} (--checkpoint takes a step "
        f"number, ckpt-<step> or a path prefix)")
  reason = damage(checkpoint)
  if reason:
    raise errors.CheckpointError(
        f"checkpoint {checkpoint} is damaged: {reason}")
  return checkpoint


def restore_model(model_dir, checkpoint=None, echo=None, precision=None):
  """(model, run, global step) of MODEL_DIR's CHECKPOINT.

  CHECKPOINT: None (the newest intact one; ECHO hears of damaged newer
  ones), a step, `ckpt-<step>` or a path prefix. The model is rebuilt from
  config.json (`run.read`) in PRECISION (default: the run's); only its
  weights are read (not the optimizer or the input position): those the
  run evaluates, their average if it trains with --ema_decay.
  """
  return restore_checkpoint(model_dir,
                            find_checkpoint(model_dir, checkpoint, echo),
                            precision)


def restore_checkpoint(model_dir, path, precision=None, averaged=True):
  """`restore_model` of PATH, a prefix `find_checkpoint` has already found
  and verified (verifying reads every byte: not twice). ValueError (one
  line naming both networks) if PATH holds another network than MODEL_DIR's
  config.json describes (`check_network`): nothing is restored partially.
  AVERAGED False: the trained weights themselves even with --ema_decay
  (what the next step starts from)."""
  run = run_lib.read(model_dir)
  model = model_lib.build_model(**run.model_arguments(precision))
  check_network(model, path, run)
  tf.train.Checkpoint(model=model).read(path).expect_partial(
  ).assert_existing_objects_matched()
  if averaged and run.config.ema_decay:
    averaged_variables = optimization.averaged_variables(model)
    average = optimization.WeightAverage(averaged_variables,
                                         run.config.ema_decay)
    # A checkpoint from before --ema_decay was set has no average: the
    # weights themselves, as the run evaluated them then.
    tf.train.Checkpoint(**{optimization.WEIGHT_AVERAGE: average}).read(
        path).expect_partial()
    average.copy_to(averaged_variables)
  return model, run, checkpoint_step(path)


# The tensor in which a tf.train.Checkpoint stores its object graph.
_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"


def _network_variables(reader):
  """{path from the root's "model": shape} of each variable of the network
  a checkpoint holds (READER: its CheckpointReader), found through its
  object graph: a variable is stored once, under the first path that
  reaches it (in a training checkpoint often the optimizer's), so the
  tensor names alone do not say which variables the network has."""
  graph = trackable_object_graph_pb2.TrackableObjectGraph()
  graph.ParseFromString(reader.get_tensor(_OBJECT_GRAPH))
  shapes = reader.get_variable_to_shape_map()
  roots = [child.node_id for child in graph.nodes[0].children
           if child.local_name == "model"]
  paths = {roots[0]: ""} if roots else {}
  queue = list(paths)
  while queue:  # Breadth first: each node under its shortest path.
    node = queue.pop(0)
    for child in graph.nodes[node].children:
      if child.node_id not in paths:
        paths[child.node_id] = f"{paths[node]}/{child.local_name}"
        queue.append(child.node_id)
  return {path.lstrip("/"): tuple(shapes.get(attribute.checkpoint_key, ()))
          for node, path in paths.items()
          for attribute in graph.nodes[node].attributes
          if attribute.name == "VARIABLE_VALUE"}


def _expected_variables(model):
  """`_network_variables` of MODEL as tf.train.Checkpoint(model=MODEL)
  writes it: written for real, to TensorFlow's in-memory filesystem."""
  directory = f"ram://network-{os.getpid()}-{id(model)}"
  try:
    prefix = tf.train.Checkpoint(model=model).write(f"{directory}/probe")
    return _network_variables(tf.compat.v1.train.NewCheckpointReader(prefix))
  finally:
    if tf.io.gfile.exists(directory):
      tf.io.gfile.rmtree(directory)


def _network_of(run):
  """A run's network in a few words: its model and options."""
  options = ", ".join(f"{k}={v!r}" for k, v in
                      run.model_options.to_dict().items())
  return f"{run.model_name} ({options})"


def check_network(model, path, run):
  """ValueError (one line) unless checkpoint PATH holds exactly MODEL's
  variables, with MODEL's shapes: MODEL is RUN's network (config.json of
  RUN.model_dir), and a checkpoint of another one (one more scalar per
  block, a block more or less, other widths) would otherwise be restored
  partially without a word. The line names both networks: RUN's, and the
  one config.json next to PATH describes, by the options that differ."""
  found = _network_variables(tf.train.load_checkpoint(path))
  expected = _expected_variables(model)
  missing = sorted(set(expected) - set(found))
  extra = sorted(set(found) - set(expected))
  reshaped = sorted(name for name in set(expected) & set(found)
                    if expected[name] != found[name])
  if not (missing or extra or reshaped):
    return
  problems = []
  if missing:
    problems.append(f"{len(missing)} of the network's {len(expected)} "
                    f"variables are not in it (e.g. {missing[0]})")
  if extra:
    problems.append(f"{len(extra)} of its variables are not in the network "
                    f"(e.g. {extra[0]})")
  if reshaped:
    name = reshaped[0]
    problems.append(f"{len(reshaped)} differ in shape (e.g. {name}: "
                    f"{list(found[name])} in the checkpoint, "
                    f"{list(expected[name])} in the network)")
  source = os.path.dirname(path)
  try:
    other = run_lib.read(source) if config_file.exists(source) else None
  except ValueError:
    other = None
  if other is None:
    theirs = (f"{source} has no readable {config_file.CONFIG_FILE} to say "
              f"what it is; this run's network is {_network_of(run)}")
  else:
    options = run.model_options.to_dict()
    other_options = other.model_options.to_dict()
    differ = [key for key in options if options[key] != other_options[key]]
    if other.model_name != run.model_name:
      differ = ["model"] + differ
    if differ:
      theirs = ("its run's " + config_file.path(source) + " describes " +
                ", ".join(f"{k}={_option(other, k)!r}" for k in differ) +
                " where this run has " +
                ", ".join(f"{k}={_option(run, k)!r}" for k in differ))
    else:
      theirs = (f"although {config_file.path(source)} describes the same "
                "network")
  raise errors.CheckpointError(
      f"checkpoint {path} holds another network than the {run.model_name} "
      f"network of --model_dir={run.model_dir}'s {config_file.CONFIG_FILE}: "
      f"{'; '.join(problems)}; {theirs}; nothing was restored: give a "
      f"checkpoint of this run, or the --model_dir that wrote it")


def _option(run, key):
  return (run.model_name if key == "model" else
          run.model_options.to_dict()[key])
