"""Issue 51: runs that cannot be lost or silently wrong. Each test makes one
mistake a user (or an attacker) makes as a user would, with the binaries,
and checks the exit status, the one line a person sees and the files before
and after: a stray TF_CONFIG, a checkpoint of another network, stored
settings a command changes, hostile archives, arrays and servers.

Where a mistake comes in several variants, each binary runs once, for one
of them (its line, exit status 1, no traceback, nothing on stdout), and the
other variants go through the library call that binary's main() makes, in
this process (`testing.library_line`, `testing.train_in_process`): the
same line, the same files before and after, without a TensorFlow import
per variant."""

import atexit
import fcntl
import glob
import gzip
import io
import json
import math
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tarfile
import tempfile
import threading
import time
from unittest import mock
import zipfile
import zlib

from absl.testing import absltest
import numpy as np

import testing

# A tiny run: seconds per command on two cores.
TINY = ["--preset=smoke", "--width=0.0625", "--units=1", "--batch_size=16",
        "--log_steps=10", "--steps_per_loop=10", "--checkpoint_steps=10",
        "--num_eval_examples=100", "--keep_checkpoints=10"]


def _env(tf_config=None):
  """Our environment with TF_CONFIG set to TF_CONFIG (a str: as given; else
  as JSON) or removed (None)."""
  env = dict(os.environ)
  env.pop("TF_CONFIG", None)
  if tf_config is not None:
    env["TF_CONFIG"] = (tf_config if isinstance(tf_config, str)
                        else json.dumps(tf_config))
  return env


class _Zeros(io.RawIOBase):
  """A readable stream of SIZE zero bytes, never all in memory."""

  def __init__(self, size):
    super().__init__()
    self.left = size

  def readable(self):
    return True

  def readinto(self, buffer):
    n = min(len(buffer), self.left)
    buffer[:n] = bytes(n)
    self.left -= n
    return n


# The tiny run of 10 steps (TINY, --train_steps=10) that tests copy, trained
# once in this process: [its model_dir].
_TRAINED = []


def _trained_copy(model_dir):
  """MODEL_DIR, made a copy of `_TRAINED`'s run (trained with TF_CONFIG
  unset; with its evaluation at the end)."""
  if not _TRAINED:
    scratch = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    trained = os.path.join(scratch, "run")
    testing.run_binary("train", *TINY, "--train_steps=10",
                       f"--model_dir={trained}", env=_env(), check=True)
    _TRAINED.append(trained)
  shutil.copytree(_TRAINED[0], model_dir)
  return model_dir


def _checkpoint_steps(directory):
  """The steps of the ckpt-<step>.index files in DIRECTORY, read off the
  names (not through the code under test)."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(m.group(1)) for m in (
      re.fullmatch(r"ckpt-(\d+)\.index", name)
      for name in os.listdir(directory)) if m)


def _metrics_steps(model_dir):
  """The steps of metrics.jsonl's training records."""
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r["step"] for r in records if "loss" in r and "eval" not in r]


class TfConfigTest(testing.ProcessTestCase):
  """Item 1: TF_CONFIG matters to the cluster strategies alone."""

  # A worker that is not the chief of a cluster that does not exist.
  LEFTOVER = {"cluster": {"worker": ["127.0.0.1:29001", "127.0.0.1:29002"]},
              "task": {"type": "worker", "index": 1}}

  def test_a_leftover_tf_config_is_ignored_by_one_process_strategies(self):
    for strategy in ("default", "mirrored"):
      model_dir = os.path.join(self.create_tempdir().full_path, "run")
      first = testing.run_binary(
          "train", *TINY, "--train_steps=20", f"--strategy={strategy}",
          f"--model_dir={model_dir}", env=_env(self.LEFTOVER))
      self.assertEqual(first.returncode, 0, first.stderr)
      notes = [line for line in first.stderr.splitlines()
               if "TF_CONFIG" in line]
      self.assertLen(notes, 1, first.stderr)
      self.assertStartsWith(notes[0], "note: TF_CONFIG is set but ignored: "
                            f"--strategy={strategy} trains in this one "
                            "process")
      self.assertStartsWith(first.stdout, "done: step 20")
      # The run is in model_dir, nowhere else, and nothing was deleted.
      self.assertEqual(_checkpoint_steps(model_dir), [10, 20])
      self.assertTrue(os.path.exists(os.path.join(model_dir, "config.json")))
      self.assertEqual([n for n in os.listdir(model_dir) if "tmp" in n], [])
      self.assertEqual(_metrics_steps(model_dir), [10, 20])
      # Resumed the same way: from step 20 to 40, in model_dir.
      second = testing.run_binary(
          "train", *TINY, "--train_steps=40", f"--strategy={strategy}",
          f"--model_dir={model_dir}", env=_env(self.LEFTOVER))
      self.assertEqual(second.returncode, 0, second.stderr)
      self.assertIn(f"resumed from {model_dir}/ckpt-20 at step 20",
                    second.stderr)
      self.assertStartsWith(second.stdout, "done: step 40")
      self.assertEqual(_checkpoint_steps(model_dir), [10, 20, 30, 40])
      self.assertEqual(_metrics_steps(model_dir), [10, 20, 30, 40])

  def test_an_invalid_tf_config_is_named_and_changes_nothing(self):
    model_dir = _trained_copy(os.path.join(self.create_tempdir().full_path,
                                           "run"))
    before = testing.snapshot(model_dir)
    cases = [('{"cluster": {"worker": [', "default",
              "error: TF_CONFIG is not valid JSON ("),
             ("[1, 2]", "mirrored", "error: TF_CONFIG must be a JSON object, "
              "got list;"),
             ('{"cluster": [], "task": {}}', "multi_worker_mirrored",
              "error: TF_CONFIG's \"cluster\" must be a JSON object, got "
              "list;"),
             ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": '
              '"worker", "index": "one"}}', "multi_worker_mirrored",
              "error: TF_CONFIG's task \"index\" must be a whole number >= 0,"
              " got 'one';")]
    # The binary for the last (a cluster strategy, TF_CONFIG read to its
    # task): its line, exit status 1, nothing else. The others through the
    # same code in this process (TF_CONFIG is read as training starts,
    # `distribute.create_strategy`, not at the interpreter's start).
    for number, (tf_config, strategy, line) in enumerate(cases):
      with self.subTest(tf_config=tf_config, strategy=strategy):
        flags = [*TINY, "--train_steps=20", f"--strategy={strategy}",
                 f"--model_dir={model_dir}"]
        if number == len(cases) - 1:
          result = testing.run_binary("train", *flags, env=_env(tf_config))
          status, stderr, stdout = (result.returncode, result.stderr,
                                    result.stdout)
          self.assertNotIn("Traceback", stderr)
        else:
          with mock.patch.dict(os.environ, {"TF_CONFIG": tf_config}):
            status, stderr, stdout = testing.train_in_process(*flags)
        self.assertEqual(status, 1, stderr)
        last = [line for line in stderr.splitlines() if line.strip()][-1]
        self.assertStartsWith(last, line)
        self.assertIn("unset it", last)
        self.assertEqual(stdout, "")
        self.assertEqual(testing.snapshot(model_dir), before)

  def test_a_worker_whose_chief_copy_is_missing_keeps_its_own(self):
    # Two workers of a real cluster, each given its own model_dir, as on two
    # machines without a shared filesystem: worker 1's checkpoints are the
    # only copy it can see, so it must not delete them and call it done.
    root = self.create_tempdir().full_path
    dirs = [os.path.join(root, f"worker{i}") for i in range(2)]
    cluster = {"worker": [f"127.0.0.1:{p}" for p in testing.free_ports(2)]}
    workers = [self.start_binary(
        "train", *TINY, "--train_steps=10", "--eval_at_end=false",
        "--strategy=multi_worker_mirrored", f"--model_dir={dirs[i]}",
        # Its wait for the chief's checkpoint: at most the cluster's.
        "--cluster_timeout=8",
        env=_env({"cluster": cluster, "task": {"type": "worker", "index": i}}))
               for i in range(2)]
    outputs = [w.communicate(timeout=300) for w in workers]
    self.assertEqual(workers[0].returncode, 0, outputs[0][1])
    self.assertEqual(_checkpoint_steps(dirs[0]), [10])
    self.assertEqual(workers[1].returncode, 1, outputs[1][1])
    scratch = os.path.join(dirs[1], ".worker1_tmp")
    last = [line for line in outputs[1][1].splitlines() if line.strip()][-1]
    self.assertEqual(
        last, f"error: the chief's checkpoint of step 10 is not in "
        f"--model_dir={dirs[1]} (waited 8 s), so this worker kept its own "
        f"copy in {scratch}: --model_dir must be a directory every worker of "
        "the cluster sees (docs/training.md, Strategies)")
    self.assertEqual(_checkpoint_steps(scratch), [10])
    self.assertEqual(outputs[1][0], "")


class ForeignCheckpointTest(testing.SharedRootTestCase):
  """Item 2: a checkpoint of another network is refused in one line naming
  both networks, whoever restores it, and nothing is written."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Three tiny runs that differ in one network option each: skipinit adds
    # a scalar per residual block, width changes every kernel's shape.
    cls.runs = {name: os.path.join(cls.root, name) for name in
                ("plain", "skipinit", "wide")}
    _trained_copy(cls.runs["plain"])
    testing.run_binaries("train", {
        "skipinit": [*TINY, "--train_steps=10", "--branch_gain=zero",
                     f"--model_dir={cls.runs['skipinit']}"],
        "wide": [*TINY[:1], "--width=0.125", *TINY[2:], "--train_steps=10",
                 f"--model_dir={cls.runs['wide']}"]}, workers=2)
    for name, model_dir in cls.runs.items():
      assert _checkpoint_steps(model_dir) == [10], (name, model_dir)

  def _refused(self, result, run, checkpoint_run, theirs, ours):
    """RESULT refused CHECKPOINT_RUN's checkpoint for RUN in one line that
    names the option where they differ, with both values."""
    self.assertEqual(result.returncode, 1, result.stderr)
    self.assertNotIn("Traceback", result.stderr)
    self.assertNotIn("could not be found", result.stderr)  # TF's warnings.
    self._refusal_line(testing.last_stderr_line(result), run, checkpoint_run,
                       theirs, ours)

  def _refusal_line(self, line, run, checkpoint_run, theirs, ours):
    checkpoint = os.path.join(self.runs[checkpoint_run], "ckpt-10")
    self.assertStartsWith(
        line, f"error: checkpoint {checkpoint} holds another network than the "
        f"cifar10 network of --model_dir={self.runs[run]}'s config.json: ")
    self.assertIn(f"its run's {self.runs[checkpoint_run]}/config.json "
                  f"describes {theirs} where this run has {ours}; nothing "
                  "was restored", line)

  def test_evaluate_and_export_refuse_another_network(self):
    from identity_tf.commands import export  # pylint: disable=g-import-not-at-top
    from identity_tf.training import evaluation  # pylint: disable=g-import-not-at-top
    cases = [("skipinit", "plain", "branch_gain='none'",
              "branch_gain='zero'", "3 of the network's"),
             ("plain", "skipinit", "branch_gain='zero'", "branch_gain='none'",
              "3 of its variables are not in the network"),
             ("plain", "wide", "width=0.125", "width=0.0625",
              "differ in shape")]
    before = {name: testing.snapshot(d) for name, d in self.runs.items()}
    for run, other, theirs, ours, problem in cases:
      checkpoint = os.path.join(self.runs[other], "ckpt-10")
      export_dir = os.path.join(self.root, f"export-{run}-{other}")
      if other == "skipinit":
        # The binaries for a checkpoint with variables the network lacks
        # (what TensorFlow warns of when one is restored): the line, exit
        # status 1, nothing else.
        results = {
            "evaluate": testing.run_binary(
                "evaluate", f"--model_dir={self.runs[run]}",
                f"--checkpoint={checkpoint}"),
            "export": testing.run_binary(
                "export", f"--model_dir={self.runs[run]}",
                f"--checkpoint={checkpoint}", f"--export_dir={export_dir}")}
        for binary, result in results.items():
          with self.subTest(binary=binary, run=run, checkpoint=other):
            self._refused(result, run, other, theirs, ours)
            self.assertIn(problem, testing.last_stderr_line(result))
            self.assertEqual(result.stdout, "")
      else:
        # The others: what each binary's main() calls, in this process.
        printed = []
        lines = {
            "evaluate": testing.library_line(
                self, evaluation.evaluate_run, self.runs[run],
                checkpoint=checkpoint, emit=printed.append,
                note=printed.append),
            "export": testing.library_line(
                self, export.export_command, self.runs[run], export_dir,
                checkpoint=checkpoint, note=printed.append,
                result=printed.append)}
        for binary, line in lines.items():
          with self.subTest(binary=binary, run=run, checkpoint=other):
            self._refusal_line(line, run, other, theirs, ours)
            self.assertIn(problem, line)
        self.assertEqual(printed, [])
      self.assertEqual(testing.snapshot(export_dir), {})
      self.assertEqual({n: testing.snapshot(d) for n, d in self.runs.items()},
                       before)
    # A checkpoint of its own network still evaluates.
    scores, notes = [], []
    evaluation.evaluate_run(self.runs["plain"], write_summaries=False,
                            emit=scores.append, note=notes.append)
    self.assertEqual([s["global_step"] for s in scores], [10])

  def test_training_refuses_to_resume_another_network(self):
    # skipinit's checkpoint put in place of plain's own (a copy gone wrong).
    model_dir = os.path.join(self.root, "mixed")
    shutil.copytree(self.runs["plain"], model_dir)
    for name in os.listdir(model_dir):
      if name.startswith("ckpt-10."):
        shutil.copy(os.path.join(self.runs["skipinit"], name),
                    os.path.join(model_dir, name))
    before = testing.snapshot(model_dir)
    result = testing.run_binary("train", *TINY, "--train_steps=20",
                                f"--model_dir={model_dir}")
    self.assertEqual(result.returncode, 1, result.stderr)
    self.assertNotIn("Traceback", result.stderr)
    self.assertStartsWith(
        testing.last_stderr_line(result),
        f"error: checkpoint {model_dir}/ckpt-10 holds another network than "
        f"the cifar10 network of --model_dir={model_dir}'s config.json: 3 of "
        "its variables are not in the network (e.g. ")
    self.assertIn("although " + os.path.join(model_dir, "config.json") +
                  " describes the same network",
                  testing.last_stderr_line(result))
    # Nothing trained, nothing written (the checkpoint state file may be
    # rewritten to list the same checkpoint; the lock names its holder).
    after = testing.snapshot(model_dir)
    for files in (before, after):
      files.pop("checkpoint", None)
      files.pop(".train.lock", None)
    self.assertEqual(after, before)


def _show(value):
  return value if isinstance(value, str) else json.dumps(value)


class StoredSettingsTest(testing.SharedRootTestCase):
  """Item 3: a command that changes stored settings says which, one line
  each, "name: from \u2192 to"."""

  def test_every_stored_setting_a_preset_changes_is_printed(self):
    model_dir = os.path.join(self.root, "run")
    testing.run_binary("train", *TINY, "--train_steps=10",
                       "--learning_rate=0.002", "--checkpoint_steps=5",
                       f"--model_dir={model_dir}", check=True)
    config_path = os.path.join(model_dir, "config.json")
    with open(config_path) as f:
      stored = json.load(f)["config"]
    # A dry run shows what the command would change, and writes nothing
    # (what bin/train.py's main() does with --dry_run, in this process: the
    # binary's part is the training below).
    before = testing.snapshot(model_dir)
    status, dry_stderr, _ = testing.train_in_process(
        *TINY, "--train_steps=20", f"--model_dir={model_dir}", "--dry_run")
    self.assertEqual(status, 0, dry_stderr)
    self.assertEqual(testing.snapshot(model_dir), before)
    self.assertIn(f"would change in {config_path}:\n", dry_stderr)
    # The preset's values replace the stored ones: the command trains.
    result = testing.run_binary("train", *TINY, "--train_steps=20",
                                f"--model_dir={model_dir}", check=True)
    with open(config_path) as f:
      applied = json.load(f)["config"]
    # The lines expected, from the files before and after.
    expected = [f"{name}: {_show(stored[name])} \u2192 {_show(value)}"
                for name, value in applied.items() if stored[name] != value]
    self.assertCountEqual(expected, [
        "train_steps: 10 \u2192 20", "learning_rate: 0.002 \u2192 0.01",
        "checkpoint_steps: 5 \u2192 10"])
    for output in (dry_stderr, result.stderr):
      lines = output.splitlines()
      self.assertCountEqual([line for line in lines if "\u2192" in line],
                            expected)
    self.assertIn(f"changed in {config_path} from step 10:", result.stderr)
    self.assertStartsWith(result.stdout, "done: step 20")
    # A command that changes nothing says nothing of changes.
    status, stderr, stdout = testing.train_in_process(
        *TINY, "--train_steps=20", f"--model_dir={model_dir}", "--dry_run")
    self.assertEqual(status, 0, stderr)
    self.assertIn("nothing was written", stdout)
    self.assertNotIn("\u2192", stderr)
    self.assertNotIn("would change", stderr)


class HostileArchiveTest(testing.SharedRootTestCase):
  """Item 4: an archive that extracts to more than the dataset can hold is
  refused as it is extracted, streamed, and nothing is left behind."""

  def _prepare(self, dataset, source_dir, in_process=False):
    """The line prepare_data refuses SOURCE_DIR's files of DATASET with
    (IN_PROCESS: the library call its main() makes, in this process), after
    checking that the refusal leaves its data_dir as it was."""
    data_dir = os.path.join(self.root, f"data-{dataset}")
    os.makedirs(data_dir, exist_ok=True)
    with open(os.path.join(data_dir, "notes.txt"), "w") as f:
      f.write("what the user keeps here\n")
    before = testing.snapshot(data_dir)
    if in_process:
      from identity_tf.data import tfds_data  # pylint: disable=g-import-not-at-top
      printed = []
      line = testing.library_line(self, tfds_data.prepare, dataset, data_dir,
                                  source_dir, echo=printed.append)
      self.assertNotIn("is ready", "\n".join(printed))
    else:
      result = testing.run_binary("prepare_data", f"--dataset={dataset}",
                                  f"--data_dir={data_dir}",
                                  f"--source_dir={source_dir}")
      self.assertEqual(result.returncode, 1, result.stderr[-2000:])
      self.assertNotIn("Traceback", result.stderr)
      self.assertNotIn("is ready", result.stdout)
      line = testing.last_stderr_line(result)
    # The data_dir is as it was: no dataset, no download, no scratch.
    self.assertEqual(testing.snapshot(data_dir), before)
    return line

  def test_a_tar_bomb_is_refused_at_a_hundred_times_its_size(self):
    # cifar-10-binary.tar.gz whose first batch is 64 MiB of zeros: a 64 kB
    # archive, a thousandfold expansion.
    source = os.path.join(self.root, "bomb")
    os.makedirs(source)
    archive = os.path.join(source, "cifar-10-binary.tar.gz")
    member = "cifar-10-batches-bin/data_batch_1.bin"
    with tarfile.open(archive, "w:gz") as tar:
      info = tarfile.TarInfo(member)
      info.size = 64 << 20
      tar.addfile(info, _Zeros(info.size))
    size = os.path.getsize(archive)
    self.assertLess(size, (64 << 20) // 100)
    self.assertEqual(
        self._prepare("cifar10", source),
        f"error: {archive} extracts to more than {100 * size} bytes (100 "
        f"times the archive's {size} bytes; {member} passes it): not the "
        "dataset's file (a decompression bomb?); replace it with the "
        "publisher's file and run this again; nothing was kept from this "
        "attempt")
    # The same data_dir takes a real archive of the same layout, extracted
    # in full: two random records per batch file.
    good = os.path.join(self.root, "good")
    os.makedirs(good)
    records = {}
    rng = np.random.default_rng(0)
    with tarfile.open(os.path.join(good, "cifar-10-binary.tar.gz"),
                      "w:gz") as tar:
      files = {"batches.meta.txt": "".join(f"c{i}\n" for i in range(10))
                                   .encode()}
      for batch in [f"data_batch_{i}.bin" for i in range(1, 6)] + [
          "test_batch.bin"]:
        files[batch] = records[batch] = rng.integers(
            0, 256, (2, 3073)).astype(np.uint8)
        files[batch][:, 0] %= 10
        files[batch] = files[batch].tobytes()
      for name, data in files.items():
        info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    data_dir = os.path.join(self.root, "data-cifar10")
    result = testing.run_binary("prepare_data", "--dataset=cifar10",
                                f"--data_dir={data_dir}",
                                f"--source_dir={good}")
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])
    self.assertStartsWith(result.stdout.splitlines()[-1],
                          "cifar10 is ready in ")
    with open(next(os.path.join(root, "dataset_info.json") for root, _, names
                   in os.walk(os.path.join(data_dir, "cifar10"))
                   if "dataset_info.json" in names)) as f:
      splits = json.load(f)["splits"]
    self.assertEqual({s["name"]: sum(map(int, s["shardLengths"]))
                      for s in splits}, {"train": 10, "test": 2})
    self.assertEqual(os.listdir(os.path.join(data_dir, "downloads")), [])

  def test_a_file_larger_than_the_dataset_holds_is_refused(self):
    # Fashion-MNIST whose test labels file holds 400,000 labels (the real
    # one 10,000): random digits compress only about 2:1, but the file is
    # far beyond 16 times the size TFDS registers for it.
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    registered = {os.path.basename(url): int(info.size) for url, info in
                  tfds.builder("fashion_mnist", data_dir=self.root
                               ).url_infos.items()}
    source = os.path.join(self.root, "large")
    testing.write_fashion_mnist_files(source, np.random.default_rng(0),
                                      {"train": 20, "test": 10})
    name = testing.FASHION_FILES["test"][1]
    count = 400_000
    with gzip.open(os.path.join(source, name), "wb") as f:
      f.write(np.array([2049, count], ">u4").tobytes() + np.random.default_rng(
          1).integers(0, 10, count).astype(np.uint8).tobytes())
    limit = 16 * registered[name]
    self.assertLess(limit, count)
    path = os.path.join(source, name)
    self.assertLess(100 * os.path.getsize(path), count * 1000)
    # In this process: the tar bomb's test above runs the binary.
    self.assertEqual(
        self._prepare("fashion_mnist", source, in_process=True),
        f"error: {path} extracts to more than {limit} bytes (16 times the "
        f"{registered[name]} bytes TFDS registers for it; its content passes "
        "it): not the dataset's file (a decompression bomb?); replace it "
        "with the publisher's file and run this again; nothing was kept "
        "from this attempt")


class _HostileServer:
  """A server on loopback that reads a request and answers as MODE says:
  "drip" -- a valid HTTP answer, one byte every 0.2 s; "huge" -- announces
  3 GB and sends zeros as fast as it can; "endless" -- no length, zeros
  until the client hangs up. Records when each connection ends and the
  bytes it sent."""

  def __init__(self, mode):
    self.mode = mode
    self.listener = socket.create_server(("127.0.0.1", 0))
    self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
    self.sent = []
    self.ended = []
    self.thread = threading.Thread(target=self._serve, daemon=True)
    self.thread.start()

  def _serve(self):
    connection, _ = self.listener.accept()
    sent = 0
    with connection:
      connection.settimeout(5)
      request = b""
      while b"\r\n\r\n" not in request:
        request += connection.recv(65536)
      head, body = request.split(b"\r\n\r\n", 1)
      length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
      while len(body) < length:
        body += connection.recv(65536)
      try:
        if isinstance(self.mode, bytes):  # A complete answer, as given.
          connection.sendall(
              b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" %
              len(self.mode) + self.mode)
          sent = len(self.mode)
        elif self.mode == "drip":
          answer = (b"HTTP/1.0 200 OK\r\nContent-Length: 60\r\n\r\n" +
                    b'{"predictions": [{"probabilities": [1.0], "classes": 0}]}'
                    .ljust(60))
          for byte in answer:
            connection.sendall(bytes([byte]))
            sent += 1
            time.sleep(0.2)
        else:
          connection.sendall(
              b"HTTP/1.0 200 OK\r\n" + (b"Content-Length: 3000000000\r\n"
                                        if self.mode == "huge" else b"") +
              b"\r\n")
          chunk = bytes(1 << 16)
          while sent < 3_000_000_000:
            connection.sendall(chunk)
            sent += len(chunk)
      except OSError:  # The client hung up.
        pass
    self.sent.append(sent)
    self.ended.append(time.monotonic())

  def close(self):
    self.listener.close()


class ServeClientLimitsTest(absltest.TestCase):
  """Item 5: one deadline for the whole request, a cap on the answer."""

  def setUp(self):
    super().setUp()
    self.png = os.path.join(self.create_tempdir().full_path, "img.png")
    with open(self.png, "wb") as f:  # Only its signature is looked at.
      f.write(b"\x89PNG\r\n\x1a\n" + bytes(100))

  def _ask(self, mode, *flags):
    server = _HostileServer(mode)
    self.addCleanup(server.close)
    started = time.monotonic()
    result = testing.run_binary("serve_client", f"--server={server.address}",
                                "--model_name=m", *flags, self.png,
                                timeout=120)
    server.thread.join(timeout=60)
    return server, result, started

  def test_a_server_that_drips_is_stopped_at_the_deadline(self):
    server, result, _ = self._ask("drip", "--timeout=3")
    self.assertEqual(result.returncode, 1, result.stderr)
    self.assertEqual(
        testing.last_stderr_line(result),
        f"error: no complete answer from {server.address} within 3 s "
        "(--timeout bounds the whole request); is the server overloaded? "
        "(raise --timeout)")
    self.assertEqual(result.stdout, "")
    # The answer takes 12 s; the connection ended at the deadline (3 s of
    # 0.2 s bytes: about 15 of its 75 bytes).
    self.assertLess(server.sent[0], 30)

  def _ask_in_process(self, mode, **options):
    """`_ask` through what serve_client's main() calls, in this process:
    the server and the line the binary would print (nothing printed
    before it)."""
    from identity_tf.commands import serve_client  # pylint: disable=g-import-not-at-top
    server = _HostileServer(mode)
    self.addCleanup(server.close)
    printed = []
    line = testing.library_line(self, serve_client.predict_command,
                                server.address, "m", [self.png],
                                result=printed.append, **options)
    server.thread.join(timeout=60)
    self.assertEqual(printed, [])
    return server, line

  def test_an_answer_beyond_the_cap_is_not_read(self):
    limit = 1 << 20  # The cap for one image: 1 MiB.
    for mode, what in (("huge", "it announces 3000000000"),
                       ("endless", "it kept coming")):
      with self.subTest(mode=mode):
        if mode == "huge":  # The binary: its line and exit status.
          server, result, _ = self._ask(mode, "--timeout=60")
          self.assertEqual(result.returncode, 1, result.stderr)
          self.assertEqual(result.stdout, "")
          line = testing.last_stderr_line(result)
        else:  # In this process.
          server, line = self._ask_in_process(mode, timeout=60.0)
        self.assertEqual(
            line,
            f"error: {server.address}'s answer is larger than {limit} bytes "
            f"({what}), far more than the probabilities of the images sent; "
            "is --server TF Serving serving an identity_tf export?")
        # The client hung up long before the 3 GB (socket buffers aside).
        self.assertLess(server.sent[0], 64 * limit)


class AnswersThatAreNotAnswersTest(absltest.TestCase):
  """Item 13: serve_client does not print an empty or non-finite answer as
  if it were one."""

  def test_empty_and_non_finite_probabilities_are_refused(self):
    png = os.path.join(self.create_tempdir().full_path, "img.png")
    with open(png, "wb") as f:
      f.write(b"\x89PNG\r\n\x1a\n" + bytes(100))
    cases = {
        "empty": (b'{"predictions": [{"probabilities": [], "classes": 0}]}',
                  "answered no class probabilities for {png}; is the served "
                  "model an identity_tf export?"),
        "nan": (b'{"predictions": [{"probabilities": [NaN, 0.5], '
                b'"classes": 1}]}',
                "answered NaN or infinite probabilities for {png}: the "
                "served model's weights are not finite (a diverged run?); "
                "export a finite checkpoint"),
        "huge": (b'{"predictions": [{"probabilities": [1e30, 0.5], '
                 b'"classes": 0}]}',
                 "answered values for {png} that are not probabilities "
                 "(they sum to 1e+30); is the served model an identity_tf "
                 "export?"),
    }
    from identity_tf.commands import serve_client  # pylint: disable=g-import-not-at-top
    for name, (answer, line) in cases.items():
      with self.subTest(name):
        server = _HostileServer(answer)
        self.addCleanup(server.close)
        if name == "nan":  # The binary: its line, exit status 1.
          result = testing.run_binary("serve_client",
                                      f"--server={server.address}",
                                      "--model_name=m", png)
          self.assertEqual(result.returncode, 1, result.stderr[-2000:])
          self.assertNotIn("Traceback", result.stderr)
          self.assertEqual(result.stdout, "")
          printed = testing.last_stderr_line(result)
        else:  # What its main() calls, in this process.
          answers = []
          printed = testing.library_line(
              self, serve_client.predict_command, server.address, "m", [png],
              result=answers.append)
          self.assertEqual(answers, [])
        self.assertEqual(printed,
                         f"error: {server.address} " + line.format(png=png))
    # A distribution is printed.
    server = _HostileServer(
        b'{"predictions": [{"probabilities": [0.25, 0.75], "classes": 1}]}')
    self.addCleanup(server.close)
    result = testing.run_binary("serve_client", f"--server={server.address}",
                                "--model_name=m", png, check=True)
    self.assertEqual(result.stdout, f"{png}: 1 0.7500, 0 0.2500\n")


class FollowUpCommandsTest(testing.SharedRootTestCase):
  """Item 13: the commands a binary prints to copy and paste are quoted."""

  def test_paths_with_spaces_and_dollars_are_quoted(self):
    model_dir = os.path.join(self.root, "a run $(touch pwned)")
    result = testing.run_binary("train", *TINY, "--train_steps=10",
                                "--eval_at_end=false",
                                f"--model_dir={model_dir}", check=True)
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines()
                 if line.startswith(("TensorBoard:", "evaluate:")))
    for name, line in lines.items():
      words = shlex.split(line)
      with self.subTest(name):
        # The shell reads the path back as one word, unexpanded.
        self.assertTrue(model_dir in words or
                        f"--model_dir={model_dir}" in words, words)
    self.assertLen(lines, 2)
    export_dir = os.path.join(self.root, "exports; rm -rf x")
    export = testing.run_binary("export", f"--model_dir={model_dir}",
                                f"--export_dir={export_dir}", check=True)
    serve = [line for line in export.stdout.splitlines()
             if line.startswith("serve:")]
    self.assertLen(serve, 1)
    self.assertIn(f"--model_base_path={export_dir}",
                  shlex.split(serve[0].split(":", 1)[1]))
    self.assertFalse(os.path.exists(os.path.join(os.getcwd(), "pwned")))


class ExportEdgesTest(testing.SharedRootTestCase):
  """Items 8 and 12: an export that cannot be written is one line and
  leaves nothing; version directories are what TF Serving loads."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = _trained_copy(os.path.join(cls.root, "run"))

  def _export(self, export_dir, *flags):
    return testing.run_binary("export", f"--model_dir={self.model_dir}",
                              f"--export_dir={export_dir}", *flags)

  def _export_in_process(self, export_dir, **options):
    """The lines //bin:export prints on stdout, from what its main() calls
    (`commands.export.export_command`) in this process."""
    from identity_tf.commands import export  # pylint: disable=g-import-not-at-top
    printed = []
    export.export_command(self.model_dir, export_dir, note=printed.append,
                          result=printed.append, **options)
    return printed

  def _export_refusal(self, export_dir, **options):
    """The line //bin:export prints for the error its main() meets, from
    the same call in this process (nothing printed before it)."""
    from identity_tf.commands import export  # pylint: disable=g-import-not-at-top
    printed = []
    line = testing.library_line(self, export.export_command, self.model_dir,
                                export_dir, note=printed.append,
                                result=printed.append, **options)
    self.assertEqual(printed, [])
    return line

  def test_an_export_that_cannot_be_written_is_one_line(self):
    blocker = os.path.join(self.root, "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory\n")
    too_long = os.path.join(self.root, "x" * 300)
    cases = {
        "under a file": (os.path.join(blocker, "exports"),
                         "NotADirectoryError: Not a directory"),
        "name too long": (too_long, "OSError: File name too long"),
    }
    if os.geteuid() != 0:
      read_only = os.path.join(self.root, "read_only")
      os.makedirs(read_only, mode=0o555)
      cases["read-only"] = (read_only, "PermissionError: Permission denied")
    before = testing.snapshot(self.root)
    # What the binary's main() calls, in this process (how it prints an
    # export's refusal: test_version_names_are_what_tf_serving_loads).
    for name, (export_dir, reason) in cases.items():
      with self.subTest(name):
        self.assertEqual(
            self._export_refusal(export_dir),
            f"error: cannot write version 1 into --export_dir={export_dir} "
            f"({reason}); free space, fix the directory or its permissions, "
            "or pick another --export_dir; nothing was exported")
        self.assertEqual(testing.snapshot(self.root), before)

  def test_version_names_are_what_tf_serving_loads(self):
    export_dir = os.path.join(self.root, "exports")
    os.makedirs(os.path.join(export_dir, "\u00b2"))  # A digit, no number.
    os.makedirs(os.path.join(export_dir, str(2**63)))  # Beyond int64.
    with open(os.path.join(export_dir, "1"), "w") as f:  # A file, not a dir.
      f.write("notes\n")
    # The next version is past every name TF Serving reads as a number:
    # the binary's export, then the same call in this process.
    for expected in (2, 3):
      if expected == 2:
        result = self._export(export_dir)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        printed = result.stdout
      else:
        printed = "\n".join(self._export_in_process(export_dir))
      self.assertStartsWith(
          printed, f"exported step 10 of {self.model_dir} as version "
          f"{expected}: {os.path.join(export_dir, str(expected))}")
    self.assertEqual(sorted(os.listdir(export_dir)),
                     sorted(["\u00b2", str(2**63), "1", "2", "3"]))
    with open(os.path.join(export_dir, "1")) as f:
      self.assertEqual(f.read(), "notes\n")
    before = testing.snapshot(export_dir)
    for version, line in (
        (1, f"error: {os.path.join(export_dir, '1')} is a file, "
         "not a version directory; remove it, or pass another --version (the "
         "next free is 4)"),
        (2**63, f"error: --version must be between 1 and "
         f"{2**63 - 1} (TF Serving reads it as int64), got {2**63}")):
      with self.subTest(version=version):
        if version == 2**63:
          # The binary: a flag past int64 reaches the export's own check
          # (not the binaries' bound on integer flags, cli.py).
          result = self._export(export_dir, f"--version={version}")
          self.assertEqual(result.returncode, 1, result.stderr[-2000:])
          self.assertNotIn("Traceback", result.stderr)
          self.assertEqual(result.stdout, "")
          printed = testing.last_stderr_line(result)
        else:  # In this process.
          printed = self._export_refusal(export_dir, version=version)
        self.assertEqual(printed, line)
        self.assertEqual(testing.snapshot(export_dir), before)


class PrepareInterruptedTest(testing.ProcessTestCase):
  """Item 11: prepare_data stopped by SIGTERM or Ctrl-C removes what it
  wrote; a re-run removes what a killed one left; two at once are told."""

  def setUp(self):
    super().setUp()
    self.root = self.create_tempdir().full_path
    self.data_dir = os.path.join(self.root, "data")
    os.makedirs(self.data_dir)
    with open(os.path.join(self.data_dir, "notes.txt"), "w") as f:
      f.write("what the user keeps here\n")

  def _start(self, counts, source):
    process = subprocess.Popen(
        testing.prepare_data_command_with_records(counts, "--dataset=fashion_mnist",
                                 f"--data_dir={self.data_dir}",
                                 f"--source_dir={source}"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=testing.binary_env())
    self._processes.append(process)
    return process

  def test_a_signal_mid_way_removes_what_the_attempt_wrote(self):
    counts = {"train": 30000, "test": 100}  # Seconds of TFDS's encoding.
    source = os.path.join(self.root, "files")
    testing.write_fashion_mnist_files(source, np.random.default_rng(0),
                                      counts)
    before = testing.snapshot(self.data_dir)
    for signum, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
      with self.subTest(signal.Signals(signum).name):
        process = self._start(counts, source)
        # Mid-way: once TFDS writes the dataset (the files are extracted).
        deadline = time.monotonic() + 300
        while not glob.glob(os.path.join(self.data_dir, "fashion_mnist",
                                         "incomplete.*")):
          self.assertLess(time.monotonic(), deadline)
          if process.poll() is not None:
            self.fail(f"finished before the signal: {process.communicate()}")
          time.sleep(0.05)
        process.send_signal(signum)
        out, err = process.communicate(timeout=300)
        self.assertEqual(process.returncode, status, err[-2000:])
        self.assertNotIn("Traceback", err)
        lines = [line for line in err.splitlines() if line.strip()]
        self.assertEqual(
            lines[-1], f"error: stopped by {signal.Signals(signum).name}; "
            "what this attempt wrote was removed: run the same command to "
            "start again")
        self.assertNotIn("is ready", out)
        self.assertEqual(testing.snapshot(self.data_dir), before)

  def test_a_rerun_removes_what_a_killed_run_left(self):
    counts = {"train": 20, "test": 10}
    source = os.path.join(self.root, "files")
    testing.write_fashion_mnist_files(source, np.random.default_rng(0),
                                      counts)
    # What SIGKILL leaves: a scratch directory with extracted files, and
    # TFDS's incomplete directory of the dataset.
    scratch = os.path.join(self.data_dir, "downloads", ".local-killed")
    os.makedirs(os.path.join(scratch, "extracted"))
    with open(os.path.join(scratch, "extracted", "part"), "wb") as f:
      f.write(bytes(1000))
    incomplete = os.path.join(self.data_dir, "fashion_mnist",
                              "incomplete.0123abcd_3.0.1")
    os.makedirs(incomplete)
    process = self._start(counts, source)
    out, err = process.communicate(timeout=300)
    self.assertEqual(process.returncode, 0, err[-2000:])
    for leftover in (incomplete, scratch):
      self.assertIn(f"removed {leftover}, left by a preparation that was "
                    "stopped", out.splitlines())
      self.assertFalse(os.path.exists(leftover))
    self.assertStartsWith(out.splitlines()[-1], "fashion_mnist is ready in ")
    self.assertEqual(os.listdir(os.path.join(self.data_dir, "downloads")), [])
    self.assertEqual([n for n in os.listdir(os.path.join(
        self.data_dir, "fashion_mnist")) if "incomplete" in n], [])

  def test_a_second_preparation_at_once_is_told_to_wait(self):
    counts = {"train": 20, "test": 10}
    source = os.path.join(self.root, "files")
    testing.write_fashion_mnist_files(source, np.random.default_rng(0),
                                      counts)
    before = testing.snapshot(self.data_dir)
    # The first preparation, as this process holds the directory.
    descriptor = os.open(self.data_dir, os.O_RDONLY)
    self.addCleanup(os.close, descriptor)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    process = self._start(counts, source)
    out, err = process.communicate(timeout=300)
    self.assertEqual(process.returncode, 1, err[-2000:])
    self.assertEqual(
        [line for line in err.splitlines() if line.strip()][-1],
        f"error: another prepare_data is preparing a dataset in --data_dir="
        f"{self.data_dir}; wait for it to finish, then run this again (a "
        "dataset it prepared is then left as it is)")
    self.assertEqual(testing.snapshot(self.data_dir), before)


def _write_npy_header(path, shape, data=bytes(20)):
  """A .npy file of float32 SHAPE per its header, followed by DATA only."""
  header = np.lib.format.header_data_from_array_1_0(np.zeros(1, "<f4"))
  header["shape"] = tuple(shape)
  with open(path, "wb") as f:
    np.lib.format.write_array_header_1_0(f, header)
    f.write(data)


class ArrayHeaderTest(testing.SharedRootTestCase):
  """Item 6: an array whose header claims more than the machine holds, or
  than its file holds, is refused before numpy allocates it, by every
  binary that reads .npy/.npz files."""

  def test_every_reader_refuses_a_lying_header_in_one_line(self):
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    huge = os.path.join(self.root, "huge.npy")  # 12 TiB in 148 bytes.
    _write_npy_header(huge, (1 << 20, 1 << 20, 3))
    self.assertLess(os.path.getsize(huge), 200)
    self.assertGreater(12 << 40, memory)
    short = os.path.join(self.root, "short.npy")  # 1.2 MB claimed, 20 held.
    _write_npy_header(short, (100, 32, 32, 3))
    archive = os.path.join(self.root, "huge.npz")
    with zipfile.ZipFile(archive, "w") as z:
      z.write(huge, "x.npy")
      labels = io.BytesIO()
      np.save(labels, np.zeros(4, np.int64))
      z.writestr("y.npy", labels.getvalue())
    huge_claim = (f"claims a float32 array of shape [1048576, 1048576, 3] "
                  f"({(1 << 40) * 12} bytes), more than this machine's "
                  f"{memory} bytes of memory; pass a smaller array")
    short_claim = ("claims a float32 array of shape [100, 32, 32, 3] "
                   "(1228800 bytes) but holds 20 bytes of data: it is cut "
                   "short or not what it says; save it again with numpy")
    closed = f"127.0.0.1:{testing.free_ports(1)[0]}"
    out = os.path.join(self.root, "out")
    # serve_client's other file through what its main() calls, in this
    # process (the binary's part: its launch below, of the huge one).
    from identity_tf.commands import serve_client  # pylint: disable=g-import-not-at-top
    printed = []
    self.assertEqual(
        testing.library_line(self, serve_client.predict_command, closed, "m",
                             [short], result=printed.append),
        f"error: {short} {short_claim}")
    self.assertEqual(printed, [])
    cases = {
        "serve_client huge": (
            "serve_client", [f"--server={closed}", "--model_name=m", huge],
            f"error: {huge} {huge_claim}"),
        "linear_theory": (
            "linear_theory", ["factorize", f"--R={huge}", "--layers=2",
                              f"--output={out}.npz"],
            f"error: --R={huge} {huge_claim}"),
        "construct": (
            "construct", [f"--data={archive}", f"--output_dir={out}"],
            f"error: --data={archive}['x'] {huge_claim}"),
    }
    results = {key: testing.run_binary(binary, *args)
               for key, (binary, args, _) in cases.items()}
    for key, (_, _, line) in cases.items():
      with self.subTest(key):
        result = results[key]
        self.assertEqual(result.returncode, 1, result.stderr[-2000:])
        self.assertNotIn("Traceback", result.stderr)
        self.assertNotIn("MemoryError", result.stderr)
        self.assertEqual(testing.last_stderr_line(result), line)
        self.assertEqual(result.stdout, "")
    self.assertFalse(os.path.exists(out))
    self.assertFalse(os.path.exists(out + ".npz"))


class UnwritableRunTest(testing.SharedRootTestCase):
  """Item 7: evaluate on a run it cannot write to prints its result and
  says in one line that it was not recorded."""

  def test_evaluate_prints_what_it_cannot_record(self):
    model_dir = _trained_copy(os.path.join(self.root, "run"))
    # Where metrics.jsonl and eval/ go, a directory and a file: unwritable
    # for any user, root included (for whom permissions are no obstacle).
    os.remove(os.path.join(model_dir, "metrics.jsonl"))
    os.makedirs(os.path.join(model_dir, "metrics.jsonl"))
    shutil.rmtree(os.path.join(model_dir, "eval"))  # Its evaluation at the end.
    with open(os.path.join(model_dir, "eval"), "w") as f:
      f.write("not a directory\n")
    variants = [("blocked", None)]
    if os.geteuid() != 0:
      variants.append(("read-only", 0o555))
    for name, mode in variants:
      with self.subTest(name):
        if mode is not None:
          shutil.rmtree(os.path.join(model_dir, "metrics.jsonl"))
          os.remove(os.path.join(model_dir, "eval"))
          os.chmod(model_dir, mode)
          self.addCleanup(os.chmod, model_dir, 0o755)
        before = testing.snapshot(model_dir)
        result = testing.run_binary("evaluate", f"--model_dir={model_dir}",
                                    "--num_examples=100")
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertNotIn("Traceback", result.stderr)
        scores = json.loads(result.stdout)
        self.assertEqual(scores["global_step"],
                         _checkpoint_steps(model_dir)[-1])
        self.assertEqual(scores["examples"], 100)
        self.assertStartsWith(
            testing.last_stderr_line(result),
            f"note: the result above is not recorded in --model_dir="
            f"{model_dir} (metrics.jsonl, eval/): ")
        self.assertTrue(testing.last_stderr_line(result).endswith(
            "; make it writable and evaluate again to record it, or pass "
            "--nowrite_summaries"))
        self.assertEqual(testing.snapshot(model_dir), before)


class MalformedFilesTest(testing.SharedRootTestCase):
  """Item 9: a config.json or model_info.json of the wrong shape is one line
  naming the file, and nothing changes."""

  def _copy_of_trained(self, name):
    """(model_dir, its config.json's path, the description in it) of a copy
    in ROOT/NAME of one run of 10 steps trained for every test that asks
    (with an evaluation at the end, which a study's report reads)."""
    model_dir = _trained_copy(os.path.join(self.root, name))
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
      return model_dir, path, json.load(f)

  def _refused(self, result, starts, model_dir, before):
    """RESULT (a binary's) is one line starting with STARTS, and nothing in
    MODEL_DIR changed from BEFORE."""
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertNotIn("Traceback", result.stderr)
    self.assertStartsWith(testing.last_stderr_line(result), starts)
    self.assertEqual(testing.snapshot(model_dir), before)

  def _line_in_process(self, binary, model_dir, export_dir=None):
    """The line BINARY (train, evaluate or export) prints for MODEL_DIR's
    config.json, from what its main() calls, in this process: train
    resolves its configuration (`testing.train_config`; --train_steps=20),
    evaluate `evaluation.evaluate_run`, export
    `commands.export.export_command` (into EXPORT_DIR); nothing is printed
    before the line."""
    # pylint: disable=g-import-not-at-top
    from identity_tf.commands import export
    from identity_tf.training import evaluation
    # pylint: enable=g-import-not-at-top
    printed = []
    if binary == "train":
      line = testing.library_line(self, testing.train_config,
                                  f"--model_dir={model_dir}",
                                  "--train_steps=20")
    elif binary == "evaluate":
      line = testing.library_line(self, evaluation.evaluate_run, model_dir,
                                  emit=printed.append, note=printed.append)
    else:
      line = testing.library_line(self, export.export_command, model_dir,
                                  export_dir, note=printed.append,
                                  result=printed.append)
    self.assertEqual(printed, [])
    return line

  def test_settings_a_newer_version_wrote_are_never_erased(self):
    # Issue 75, item 2: unknown keys at the top level and in "config".
    model_dir, path, good = self._copy_of_trained("newer")
    variants = {
        "top level": (dict(good, augmentation={"kind": "autoaugment"}),
                      ["augmentation"]),
        "config": (dict(good, config=dict(good["config"], stochastic_depth=0.1,
                                          cutout=16)),
                   ["config.cutout", "config.stochastic_depth"]),
    }
    starts = (f"error: {path} holds settings this version of identity_tf "
              "does not know (")
    for name, (description, unknown) in variants.items():
      with open(path, "w") as f:
        json.dump(description, f, indent=2)
      before = testing.snapshot(model_dir)
      commands = ["train", "evaluate"] if name == "config" else ["train"]
      # What each binary's main() calls, in this process: how the binaries
      # print what config_file.read refuses is
      # test_a_malformed_config_json_is_named's.
      for binary in commands:
        with self.subTest(variant=name, binary=binary):
          line = self._line_in_process(binary, model_dir)
          self.assertStartsWith(line, starts)
          self.assertEqual(testing.snapshot(model_dir), before)
          for key in unknown:
            self.assertIn(key, line)
          self.assertIn("use a new --model_dir", line)
    # What this version writes and reads is known: every field of Config
    # and the earlier names it translates.
    import dataclasses  # pylint: disable=g-import-not-at-top
    from identity_tf import configs  # pylint: disable=g-import-not-at-top
    from identity_tf.training import config_file  # pylint: disable=g-import-not-at-top
    every = {f.name: None for f in dataclasses.fields(configs.Config)}
    every.update({name: None for name in getattr(configs, "LEGACY_FIELDS",
                                                 ())})
    self.assertEqual(config_file.unknown_keys(dict(good, config=every,
                                                   history=[])), [])

  def test_a_config_json_nested_deep_or_a_directory_is_named(self):
    # Issue 75, items 6 and 7.
    model_dir, path, good = self._copy_of_trained("deep")
    text = json.dumps(good)
    variants = {
        "nested 200000 deep": "[" * 200_000 + "]" * 200_000,
        "nested inside config": text.replace(
            '"config": {', '"config": {"width": ' + "[" * 50_000 +
            "]" * 50_000 + ", ", 1),
        "a directory": None,
    }
    for name, content in variants.items():
      os.remove(path) if os.path.isfile(path) else shutil.rmtree(path)
      if content is None:
        os.makedirs(path)
      else:
        with open(path, "w") as f:
          f.write(content)
      before = testing.snapshot(model_dir)
      commands = ["train"]
      if name == "a directory":  # Every binary reads it the same way.
        commands.append("evaluate")
      # What each binary's main() calls, in this process (the binaries'
      # part: test_a_malformed_config_json_is_named).
      for binary in commands:
        with self.subTest(variant=name, binary=binary):
          self.assertStartsWith(self._line_in_process(binary, model_dir),
                                f"error: {path} ")
          self.assertEqual(testing.snapshot(model_dir), before)

  def test_a_report_over_damaged_run_records(self):
    # Issue 75, item 5: the records a training appends past are left out;
    # what the run recorded is reported as from an intact copy.
    output_dir = os.path.join(self.root, "study")
    damaged, _, _ = self._copy_of_trained("study/smoke/seed0")
    intact, _, _ = self._copy_of_trained("study/smoke/seed1")
    metrics_file = os.path.join(damaged, "metrics.jsonl")
    with open(metrics_file) as f:
      lines = f.readlines()
    bad = ['[1, 2]', '{"eval": 3}', '{"step": 5, "eval": 3, "time": 1.0}',
           '{"step": "x", "loss": 1.0, "time": 2.0}', 'null', '"text"', '7',
           '{"step": 3, "train_steps": 10, "time": 1.0}',
           '{"step": 7, "start": true}', '{"step": 8, "train_steps": 10, '
           '"loss": 0.5, "images_per_second": "fast", "time": 3.0}',
           '{"step": 9, "train_eval": [1], "time": 4.0}',
           '{"step": 2, "start": true, "machine": 5, "time": 5.0}',
           '{"step": 4, "eval": {"top1": "high"}, "time": 6.0}',
           "[" * 100_000 + "]" * 100_000]
    with open(metrics_file, "wb") as f:
      middle = len(lines) // 2
      f.writelines([line.encode() for line in lines[:middle]] +
                   [line.encode() + b"\n" for line in bad] +
                   [b"\xff\xfe not UTF-8\n"] +
                   [line.encode() for line in lines[middle:]])
    # What //bin:study --study=smoke --report_only calls, with the binary's
    # defaults, in this process (the binary runs below).
    from identity_tf.commands import study as study_command  # pylint: disable=g-import-not-at-top
    printed = []
    study_command.study_command("smoke", output_dir, dataset="fashion_mnist",
                                epochs=10.0, report_only=True,
                                echo=printed.append, result=printed.append)
    self.assertIn(os.path.join(output_dir, "results.json"), printed)
    with open(os.path.join(output_dir, "results.json")) as f:
      runs = json.load(f)["arms"][0]["runs"]
    self.assertEqual([run["seed"] for run in runs], [0, 1])
    kept = ("status", "final_top1", "best_top1", "curves", "train_set",
            "images_per_second", "wall_seconds", "machines", "settings",
            "time_to_top1")
    self.assertEqual({k: runs[0][k] for k in kept},
                     {k: runs[1][k] for k in kept})
    self.assertIsNotNone(runs[0]["final_top1"])
    self._check_unreadable_study_json(intact, output_dir)

  def _check_unreadable_study_json(self, intact, output_dir):
    # A study.json (how runs ended before metrics.jsonl said it) that is not
    # one: one line naming it, whichever way it is not.
    from identity_tf import errors  # pylint: disable=g-import-not-at-top
    from identity_tf.training import study  # pylint: disable=g-import-not-at-top
    legacy = os.path.join(intact, "study.json")
    for name, content in (("a list", "[1]"), ("not JSON", "{"),
                          ("a number", "3"),
                          ("no status", '{"nan_step": null}'),
                          ("status not a word", '{"status": 5}'),
                          ("wall time not a number",
                           '{"status": "done", "wall_seconds": "x"}'),
                          ("nested", "[" * 100_000 + "]" * 100_000),
                          ("a directory", None)):
      with self.subTest(study_json=name):
        if os.path.isdir(legacy):
          os.rmdir(legacy)
        elif os.path.exists(legacy):
          os.remove(legacy)
        if content is None:
          os.makedirs(legacy)
        else:
          with open(legacy, "w") as f:
            f.write(content)
        with self.assertRaises(errors.CheckpointError) as caught:
          study.run_status(intact, [])
        self.assertStartsWith(str(caught.exception), legacy)
    os.rmdir(legacy)
    # And the binary says so in its line.
    with open(legacy, "w") as f:
      f.write("[1]")
    with open(os.path.join(intact, "metrics.jsonl")) as f:
      records = [line for line in f if '"done"' not in line]
    with open(os.path.join(intact, "metrics.jsonl"), "w") as f:
      f.writelines(records)
    before = testing.snapshot(output_dir)
    result = testing.run_binary("study", "--study=smoke", "--report_only",
                                f"--output_dir={output_dir}")
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertNotIn("Traceback", result.stderr)
    self.assertStartsWith(testing.last_stderr_line(result),
                          f"error: {legacy} is a JSON list, not a study's "
                          "record of how the run ended")
    self.assertEqual(testing.snapshot(output_dir), before)

  def test_json_nested_deep_from_a_server_or_a_model_info_is_one_line(self):
    # Issue 75, item 6, for serve_client's two JSON inputs.
    from identity_tf import errors  # pylint: disable=g-import-not-at-top
    from identity_tf.serving import client  # pylint: disable=g-import-not-at-top
    nested = b"[" * 200_000 + b"]" * 200_000
    info = os.path.join(self.root, "nested_model_info.json")
    with open(info, "wb") as f:
      f.write(nested)
    with self.assertRaisesRegex(errors.ServingError,
                                f"^--model_info={re.escape(info)} is not an "
                                "export's model_info.json"):
      client.read_class_names(info)
    server = _HostileServer(nested)
    self.addCleanup(server.close)
    with self.assertRaisesRegex(errors.ServingError,
                                f"^{server.address} answered JSON nested too "
                                "deeply to read"):
      client.rest_predict(server.address, "m", "predict_images",
                          [testing.PNG_SIGNATURE + bytes(100)])

  def test_a_malformed_config_json_is_named(self):
    model_dir, path, good = self._copy_of_trained("run")
    not_a_run = f"error: {path} is not the description of a training run ("
    variants = {
        "config null": (dict(good, config=None),
                        not_a_run + '"config" is null, not an object)'),
        "config list": (dict(good, config=[1, 2]),
                        not_a_run + '"config" is a list, not an object)'),
        "model without options": (
            dict(good, model={"name": "cifar10"}),
            not_a_run + '"model" lacks its "name" and "options")'),
        "history not a list": (
            dict(good, history={"step": 3}),
            f'error: {path} has a malformed "history" (a list of '),
        "history entry without step": (
            dict(good, history=[{"changed": {"learning_rate": [1, 2]}}]),
            f'error: {path} has a malformed "history" (a list of '),
        "units not numbers": (
            dict(good, config=dict(good["config"], units=["x"])),
            f"error: {path} does not describe a run this version reads ("),
    }
    for name, (description, line) in variants.items():
      with open(path, "w") as f:
        json.dump(description, f)
      before = testing.snapshot(model_dir)
      commands = {"evaluate": ("evaluate", [f"--model_dir={model_dir}"]),
                  "export": ("export", [f"--model_dir={model_dir}",
                                        f"--export_dir={self.root}/e"])}
      if name != "units not numbers":  # train reads the config alone.
        commands["train"] = ("train", [f"--model_dir={model_dir}",
                                       "--train_steps=20"])
      for command, (binary, args) in commands.items():
        with self.subTest(variant=name, command=command):
          if name == "config null":
            # Each binary once: its line, exit status 1, nothing on stdout
            # (for this class's other tests of config.json too).
            result = testing.run_binary(binary, *args)
            self.assertEqual(result.returncode, 1, result.stderr[-2000:])
            self.assertNotIn("Traceback", result.stderr)
            self.assertStartsWith(testing.last_stderr_line(result), line)
            self.assertEqual(result.stdout, "")
          else:  # The other variants through the same calls, in process.
            self.assertStartsWith(self._line_in_process(
                binary, model_dir, f"{self.root}/e"), line)
          self.assertEqual(testing.snapshot(model_dir), before)
    self.assertFalse(os.path.exists(f"{self.root}/e"))

  def test_a_bad_stored_value_names_config_json_not_a_flag(self):
    # Item 10: the user passed no --batch_size; the line names the file.
    model_dir, path, good = self._copy_of_trained("stored")
    cases = {
        # A network's field or the batch cannot change on resume.
        "batch_size": (-5, "use a new --model_dir"),
        "learning_rate": (-1, "pass --learning_rate to replace it"),
    }
    for name, (value, fix) in cases.items():
      with open(path, "w") as f:
        json.dump(dict(good, config=dict(good["config"], **{name: value})),
                  f)
      before = testing.snapshot(model_dir)
      for dry in ([], ["--dry_run"]):
        with self.subTest(field=name, dry_run=bool(dry)):
          args = [f"--model_dir={model_dir}", "--train_steps=20", *dry]
          # The binary for one field with --dry_run and the other without;
          # the other two the same way in this process.
          if (name == "batch_size") != bool(dry):
            result = testing.run_binary("train", *args)
            status, stderr = result.returncode, result.stderr
          else:
            status, stderr, _ = testing.train_in_process(*args)
          self.assertEqual(status, 1, stderr[-2000:])
          self.assertEqual(
              [line for line in stderr.splitlines() if line.strip()][-1],
              f"error: {path} holds an invalid {name}: {name} must be "
              f"positive, got {value}; {fix}")
          self.assertNotIn(f"--{name} must", stderr)
          self.assertEqual(testing.snapshot(model_dir), before)
    # The fix it names works: the flag replaces the stored value.
    testing.run_binary("train", f"--model_dir={model_dir}",
                       "--train_steps=20", "--learning_rate=0.01",
                       "--eval_at_end=false", check=True)
    with open(path) as f:
      self.assertEqual(json.load(f)["config"]["learning_rate"], 0.01)

  def test_a_dry_run_refuses_a_batch_larger_than_the_data(self):
    # Item 10: the dry run says what the real run would, before any data
    # is read; the synthetic training split's size from its own module.
    from identity_tf.data import datasets  # pylint: disable=g-import-not-at-top
    examples = datasets.synthetic_info().num_train_examples
    for dry in (["--dry_run"], []):
      model_dir = os.path.join(self.root, f"huge_batch{len(dry)}")
      with self.subTest(dry_run=bool(dry)):
        args = ["--preset=smoke", f"--batch_size={examples + 1}",
                f"--model_dir={model_dir}", *dry]
        if dry:  # train_command's dry run, in this process.
          status, stderr, stdout = testing.train_in_process(*args)
        else:  # The binary's training.
          result = testing.run_binary("train", *args)
          status, stderr, stdout = (result.returncode, result.stderr,
                                    result.stdout)
        self.assertEqual(status, 1, stderr[-2000:])
        self.assertEqual(
            [line for line in stderr.splitlines() if line.strip()][-1],
            f"error: --batch_size={examples + 1} is more than the "
            f"{examples} training examples of synthetic: lower --batch_size")
        self.assertNotIn("dry run", stdout)
        self.assertFalse(os.path.exists(os.path.join(model_dir,
                                                     "config.json")))

  def test_a_model_info_that_is_not_an_object_is_named(self):
    png = os.path.join(self.root, "img.png")
    with open(png, "wb") as f:
      f.write(b"\x89PNG\r\n\x1a\n" + bytes(100))
    closed = f"127.0.0.1:{testing.free_ports(1)[0]}"
    for name, content in (("list", [1, 2]), ("names", {"classes": {
        "names": 3}})):
      info = os.path.join(self.root, f"{name}.json")
      with open(info, "w") as f:
        json.dump(content, f)
      with self.subTest(name):
        if name == "list":  # The binary: its line and exit status.
          result = testing.run_binary(
              "serve_client", f"--server={closed}", "--model_name=m",
              f"--model_info={info}", png)
          self.assertEqual(result.returncode, 1, result.stderr[-2000:])
          self.assertNotIn("Traceback", result.stderr)
          line = testing.last_stderr_line(result)
        else:  # What its main() calls, in this process.
          from identity_tf.commands import serve_client  # pylint: disable=g-import-not-at-top
          printed = []
          line = testing.library_line(self, serve_client.predict_command,
                                      closed, "m", [png], model_info=info,
                                      result=printed.append)
          self.assertEqual(printed, [])
        self.assertEqual(
            line,
            f"error: --model_info={info} is not an export's model_info.json "
            '(an object whose "classes" has a list of "names"); pass the '
            "model_info.json of the served version, or omit --model_info")


class FailureAdviceTest(absltest.TestCase):
  """Item 10: a run in one process that runs out of memory is not told to
  restart the workers of a cluster."""

  def test_out_of_memory_advice_fits_the_strategy(self):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from identity_tf.training import distribute  # pylint: disable=g-import-not-at-top
    error = tf.errors.ResourceExhaustedError(
        None, None, "OOM when allocating tensor with shape[4096,4096,3,3]")
    alone = distribute.describe_failure(error, cluster=False)
    self.assertEqual(
        alone, "training stopped: ResourceExhaustedError: OOM when "
        "allocating tensor with shape[4096,4096,3,3]; the run needs more "
        "memory than this machine has: lower --batch_size or --width (a new "
        "--model_dir for --width)")
    self.assertNotIn("worker", alone)
    other = distribute.describe_failure(
        tf.errors.InternalError(None, None, "something broke"),
        cluster=False)
    self.assertEqual(other, "training stopped: InternalError: something "
                     "broke; run the same command to resume from the latest "
                     "checkpoint")
    self.assertIn("every worker", distribute.describe_failure(error))


def _png_chunk(kind, data):
  return (struct.pack(">I", len(data)) + kind + data +
          struct.pack(">I", zlib.crc32(kind + data)))


def _png_header(width, height, colour=2):
  """A PNG's signature and IHDR chunk declaring WIDTH x HEIGHT pixels (8
  bits, colour type COLOUR), as the PNG specification lays them out."""
  return testing.PNG_SIGNATURE + _png_chunk(
      b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))


def _png_of_zeros(width, height):
  """A valid greyscale PNG of WIDTH x HEIGHT black pixels: each row its
  filter byte and WIDTH zeros, deflated (a thousandfold: 140 kB for
  12000 x 12000)."""
  compressor = zlib.compressobj(9)
  row = bytes(width + 1)
  data = b"".join(compressor.compress(row) for _ in range(height))
  return (_png_header(width, height, colour=0) +
          _png_chunk(b"IDAT", data + compressor.flush()) +
          _png_chunk(b"IEND", b""))


def _gif_header(width, height):
  return b"GIF89a" + struct.pack("<HH", width, height) + bytes(20)


def _gif_of(width, height, frames=1, screen=None):
  """A GIF of FRAMES grey frames of WIDTH x HEIGHT pixels, written by
  Pillow; its logical screen then set to SCREEN (width, height) if given."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  images = [Image.new("L", (width, height), 40 * i) for i in range(frames)]
  out = io.BytesIO()
  images[0].save(out, "GIF", save_all=frames > 1, append_images=images[1:])
  data = out.getvalue()
  if screen:
    data = data[:6] + struct.pack("<HH", *screen) + data[10:]
  return data


def _gif_frame_headers(screen, frames):
  """A GIF of a SCREEN (width, height) logical screen, no colour table,
  then one image descriptor per (width, height) in FRAMES, each followed by
  an LZW code size and no data (GIF89a, Sections 18, 20 and 22)."""
  return (b"GIF89a" + struct.pack("<HHBBB", *screen, 0, 0, 0) +
          b"".join(b"\x2c" + struct.pack("<HHHHB", 0, 0, *frame, 0) +
                   b"\x08\x00" for frame in frames) + b"\x3b")


def _bmp_header(width, height):
  # BITMAPFILEHEADER (14 bytes), then BITMAPINFOHEADER's size and size.
  return (b"BM" + bytes(12) + struct.pack("<Iii", 40, width, height) +
          bytes(40))


def _jpeg_declaring(encoded, width, height):
  """ENCODED (a JPEG from TensorFlow's encoder) with its baseline frame
  header (SOF0: marker, length, precision, height, width) declaring
  WIDTH x HEIGHT instead."""
  at = encoded.index(b"\xff\xc0")
  return (encoded[:at + 5] + struct.pack(">HH", height, width) +
          encoded[at + 9:])


class DecompressionBombTest(testing.SharedRootTestCase):
  """Issue 75, item 1: an image file declaring more pixels than the model
  takes is refused from its header, before decoding, by the exported
  `predict_images` signature, and not sent by serve_client."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    import keras  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    from identity_tf.data import datasets  # pylint: disable=g-import-not-at-top
    from identity_tf.data import tfds_data  # pylint: disable=g-import-not-at-top
    from identity_tf.serving import contract  # pylint: disable=g-import-not-at-top
    from identity_tf.serving import export  # pylint: disable=g-import-not-at-top

    def signature(info, size, classes):
      image = keras.Input((size, size, 3))
      model = keras.Model(image, keras.layers.Dense(classes)(
          keras.layers.GlobalAveragePooling2D()(image)))
      module = export.ServingModule(
          model, datasets.preprocessing_config(info, size))
      function, spec = module.input_signatures()[contract.IMAGES_SIGNATURE]
      return tf.function(lambda images: function(images),  # pylint: disable=unnecessary-lambda
                         input_signature=spec)

    # A CIFAR-shaped model (32 x 32 files only), an ImageNet-shaped one
    # (any size, resized in the graph).
    # (In a dict: a tf.function as a class attribute binds to the test.)
    cls.signatures = {
        "fixed": signature(datasets.synthetic_info(), 32, 10),
        "any size": signature(tfds_data.dataset_info("imagenet2012"), 224,
                              1000)}
    cls.tf = tf
    cls.max_pixels = getattr(contract, "MAX_IMAGE_PIXELS", 1 << 26)
    cls.good = tf.io.encode_png(tf.zeros([32, 32, 3], tf.uint8)).numpy()
    cls.undecodable = (
        "images[{}] is not a decodable JPEG, PNG, GIF or BMP image (a GIF: "
        f"at most {cls.max_pixels} pixels in all its frames)")
    cls.jpeg = tf.io.encode_jpeg(tf.zeros([32, 32, 3], tf.uint8)).numpy()

  def _refusal(self, signature, files):
    with self.assertRaises(self.tf.errors.InvalidArgumentError) as caught:
      signature(self.tf.constant(files))
    found = re.search(r"assertion failed: \[(.*)\]\s*$",
                      str(caught.exception), re.MULTILINE)
    return found.group(1) if found else str(caught.exception)[:300]

  def test_the_signature_reads_the_header_before_decoding(self):
    self.assertEqual(self.signatures["fixed"](self.tf.constant([self.good]))[
        "probabilities"].shape, (1, 10))
    not_32 = ("images[1] is not 32x32 pixels, the size this model takes: "
              "resize it first")
    # Headers alone, each declaring another size and followed by nothing
    # decodable: what is refused is what the header says.
    for name, data in (
        ("PNG 20000x20000", _png_header(20_000, 20_000) + b"more"),
        ("PNG 33x32", _png_header(33, 32)),
        ("PNG 2**32-1 wide", _png_header(2**32 - 1, 1)),
        ("JPEG 48x40", _jpeg_declaring(self.jpeg, 48, 40)),
        ("JPEG 65500x65500", _jpeg_declaring(self.jpeg, 65500, 65500)),
        ("GIF 65535x65535", _gif_header(65535, 65535)),
        ("GIF of a 32x32 screen, a 65535x65535 frame",
         _gif_frame_headers((32, 32), [(65535, 65535)])),
        ("GIF of a 32x32 screen, a 32x32 frame, a 33x32 one",
         _gif_frame_headers((32, 32), [(32, 32), (33, 32)])),
        ("BMP 100000x-100000", _bmp_header(100_000, -100_000)),
        ("BMP 32x33", _bmp_header(32, 33))):
      with self.subTest(name):
        self.assertEqual(self._refusal(self.signatures["fixed"], [self.good, data]),
                         not_32)
    self.assertEqual(
        self._refusal(self.signatures["fixed"], [self.good, testing.PNG_SIGNATURE + b"x"]),
        self.undecodable.format(1))
    # A valid PNG of 12000 x 12000 pixels (140 kB; 432 MB decoded as RGB):
    # refused without the memory a decoding takes.
    bomb = _png_of_zeros(12_000, 12_000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    self.assertEqual(self._refusal(self.signatures["fixed"], [bomb]),
                     not_32.replace("images[1]", "images[0]"))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    self.assertLess(grown * 1024, 100 << 20)

  def test_a_gif_is_bounded_by_its_frames_not_its_screen(self):
    # TensorFlow decodes a GIF's frame at the size its descriptor declares:
    # a 32x32 screen says nothing of it.
    bomb = _gif_of(2000, 2000, screen=(32, 32))
    self.assertEqual(
        self.tf.io.decode_image(bomb, expand_animations=False).shape,
        (2000, 2000, 3))
    self.assertEqual(self._refusal(self.signatures["fixed"], [self.good, bomb]),
                     "images[1] is not 32x32 pixels, the size this model "
                     "takes: resize it first")
    # An animation of frames of the model's size is served (its first
    # frame).
    animation = _gif_of(32, 32, frames=3)
    self.assertEqual(self.signatures["fixed"](self.tf.constant(
        [animation]))["classes"].shape, (1,))
    # Frames each within the limit, together beyond it; and a file whose
    # blocks go on past the limit on blocks read (empty comments): neither
    # is decoded.
    side = math.isqrt(self.max_pixels)
    many = _gif_frame_headers((50, 60), [(side, side)] * 2)
    endless = _gif_frame_headers((50, 60), []).replace(
        b"\x3b", b"\x21\xfe\x00" * 5000 + b"\x3b")
    small = self.tf.io.encode_png(self.tf.zeros([50, 60, 3],
                                                self.tf.uint8)).numpy()
    for name, data in (("two frames", many), ("70000 blocks", endless)):
      with self.subTest(name):
        self.assertEqual(
            self._refusal(self.signatures["any size"], [small, data]),
            self.undecodable.format(1))

  def test_the_client_and_the_model_read_a_gif_alike(self):
    from identity_tf.serving import client  # pylint: disable=g-import-not-at-top
    from identity_tf.serving import export  # pylint: disable=g-import-not-at-top
    extent = self.tf.function(export.gif_extent)
    side = math.isqrt(self.max_pixels)
    for name, data, expected in (
        ("32x32", _gif_of(32, 32), (32, 32, 1024, True)),
        ("3 frames 40x30", _gif_of(40, 30, frames=3), (30, 40, 3600, True)),
        ("a 200x100 frame, 32x32 screen", _gif_of(200, 100, screen=(32, 32)),
         (100, 200, 20000, True)),
        ("descriptors", _gif_frame_headers((50, 60), [(side, side)] * 2),
         (side, side, 2 * side * side, True)),
        ("a header alone", _gif_header(640, 480), (480, 640, 0, True)),
        # A comment of 70000 one-byte sub-blocks before the trailer.
        ("a long comment", _gif_of(32, 32)[:-1] + b"\x21\xfe" +
         b"\x01x" * 70_000 + b"\x00\x3b", (32, 32, 1024, True)),
        ("5000 comments", _gif_frame_headers((50, 60), []).replace(
            b"\x3b", b"\x21\xfe\x00" * 5000 + b"\x3b"), (60, 50, 0, False))):
      with self.subTest(name):
        self.assertEqual(client.gif_extent(data), expected)
        size, pixels, complete = extent(self.tf.constant(data))
        self.assertEqual(
            (*size.numpy().tolist(), int(pixels), bool(complete)), expected)
    # One frame over the limit by its area alone (each side far below it)
    # is a GIF of a known size -- refused by that size, as a PNG of it is
    # -- not an unknown file; one at the limit exactly fits.
    declared = self.tf.function(export.declared_size)
    for width, height in ((side + 1, side), (side, side + 1), (side, side)):
      with self.subTest(width=width, height=height):
        size, known = declared(self.tf.constant(_gif_frame_headers(
            (50, 60), [(width, height)])))
        self.assertEqual((size.numpy().tolist(), bool(known)),
                         ([height, width], True))

  def test_a_model_of_any_size_decodes_at_most_its_limit(self):
    side = math.isqrt(self.max_pixels)
    small = self.tf.io.encode_png(self.tf.zeros([50, 60, 3],
                                                self.tf.uint8)).numpy()
    self.assertEqual(self.signatures["any size"](self.tf.constant([small]))[
        "probabilities"].shape, (1, 1000))
    for width, height in ((side + 1, side), (20_000, 20_000),
                          (self.max_pixels + 1, 1), (2**32 - 1, 2**32 - 1)):
      with self.subTest(width=width, height=height):
        self.assertEqual(
            self._refusal(self.signatures["any size"],
                          [small, small, _png_header(width, height)]),
            f"images[2] is {width}x{height} pixels, more than the "
            f"{self.max_pixels} this model decodes: resize it first")
    # At the limit it is decoded (here: found not to be a PNG after all).
    self.assertEqual(
        self._refusal(self.signatures["any size"], [small, _png_header(side, side)]),
        self.undecodable.format(1))

  def test_serve_client_does_not_send_a_file_declaring_too_many_pixels(self):
    from identity_tf import errors  # pylint: disable=g-import-not-at-top
    from identity_tf.serving import client  # pylint: disable=g-import-not-at-top
    bombs = {"png": _png_header(20_000, 20_000) + bytes(100),
             "jpg": _jpeg_declaring(self.jpeg, 30_000, 30_000),
             "gif": _gif_header(65535, 65535),
             "bmp": _bmp_header(100_000, 100_000)}
    paths = {}
    for extension, data in bombs.items():
      paths[extension] = os.path.join(self.root, f"bomb.{extension}")
      with open(paths[extension], "wb") as f:
        f.write(data)
    sizes = {"png": (20_000, 20_000), "jpg": (30_000, 30_000),
             "gif": (65535, 65535), "bmp": (100_000, 100_000)}
    for extension, path in paths.items():
      with self.subTest(extension):
        width, height = sizes[extension]
        with self.assertRaisesRegex(
            errors.ServingError,
            f"^{re.escape(path)} is {width}x{height} pixels \\(its header "
            f"says so\\), more than the {self.max_pixels} the served model "
            "decodes: resize it first$"):
          client.read_input(path)
    # A GIF's frames count, not its screen.
    from identity_tf.serving import contract  # pylint: disable=g-import-not-at-top
    path = os.path.join(self.root, "frames.gif")
    side = math.isqrt(self.max_pixels)
    for frames, message in (
        ([(40_000, 30_000)], "is 40000x30000 pixels (its header says so)"),
        ([(side, side)] * 2,
         f"is a GIF of more than {contract.MAX_GIF_BLOCKS} blocks or "
         f"{self.max_pixels} pixels in all its frames, more than the served "
         "model decodes: send its first frame alone")):
      with self.subTest(frames=frames):
        with open(path, "wb") as f:
          f.write(_gif_frame_headers((50, 60), frames))
        with self.assertRaisesRegex(errors.ServingError,
                                    f"^{re.escape(f'{path} {message}')}"):
          client.read_input(path)
    # Files whose header declares a size within it, or none, go as before.
    for data in (self.good, self.jpeg, testing.PNG_SIGNATURE + bytes(100)):
      path = os.path.join(self.root, "fine.png")
      with open(path, "wb") as f:
        f.write(data)
      self.assertEqual(client.read_input(path).data, data)
    # At the limit itself: an area of exactly MAX_IMAGE_PIXELS goes, one
    # pixel row more (each side far below the limit) does not, nor one
    # side longer than it.
    limit = self.max_pixels
    side = math.isqrt(limit)
    self.assertEqual(side * side, limit)
    for (width, height), refused in (
        ((side, side), False), ((side + 1, side), True),
        ((side, side + 1), True), ((limit, 1), False),
        ((limit + 1, 1), True), ((1, limit + 1), True)):
      with self.subTest(width=width, height=height):
        path = os.path.join(self.root, "edge.png")
        data = _png_header(width, height) + bytes(100)
        with open(path, "wb") as f:
          f.write(data)
        if refused:
          with self.assertRaisesRegex(
              errors.ServingError, f"is {width}x{height} pixels \\(its "
              "header says so\\), more than"):
            client.read_input(path)
        else:
          self.assertEqual(client.read_input(path).data, data)
    # The binary: one line, and the server never hears of it.
    listener = socket.create_server(("127.0.0.1", 0))
    self.addCleanup(listener.close)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    result = testing.run_binary("serve_client", f"--server={address}",
                                "--model_name=m", paths["png"])
    self.assertEqual(result.returncode, 1, result.stderr[-2000:])
    self.assertNotIn("Traceback", result.stderr)
    self.assertStartsWith(testing.last_stderr_line(result),
                          f"error: {paths['png']} is 20000x20000 pixels")
    listener.settimeout(0.1)
    with self.assertRaises(socket.timeout):
      listener.accept()


class ReadOnlyDataDirTest(testing.SharedRootTestCase):
  """Issue 75, item 4: prepare_data into a --data_dir it cannot write is
  one line, and nothing is written anywhere."""

  def test_a_data_dir_that_cannot_be_written_is_one_line(self):
    source = os.path.join(self.root, "source")
    testing.write_fashion_mnist_files(source, np.random.default_rng(0),
                                      {"train": 8, "test": 4})
    blocker = os.path.join(self.root, "a_file")
    with open(blocker, "w") as f:
      f.write("not a directory\n")
    cases = {
        # For every user, root included (to whom permissions are no
        # obstacle): a path under a file; sysfs, which takes no directory.
        "under a file": os.path.join(blocker, "data"),
        "sysfs": "/sys/identity_tf_test_data",
    }
    if os.geteuid() != 0:
      read_only = os.path.join(self.root, "read_only")
      os.makedirs(os.path.join(read_only, "inside"))
      os.chmod(os.path.join(read_only, "inside"), 0o555)
      os.chmod(read_only, 0o555)
      self.addCleanup(os.chmod, read_only, 0o755)
      self.addCleanup(os.chmod, os.path.join(read_only, "inside"), 0o755)
      cases["read-only"] = os.path.join(read_only, "inside")
      cases["in a read-only directory"] = os.path.join(read_only, "new")
    before = testing.snapshot(self.root)
    from identity_tf.data import tfds_data  # pylint: disable=g-import-not-at-top
    for name, data_dir in cases.items():
      with self.subTest(name):
        if name == "under a file":  # The binary: line, exit status.
          result = testing.run_binary("prepare_data",
                                      "--dataset=fashion_mnist",
                                      f"--data_dir={data_dir}",
                                      f"--source_dir={source}")
          self.assertEqual(result.returncode, 1, result.stderr[-2000:])
          self.assertNotIn("Traceback", result.stderr)
          self.assertNotIn("is ready", result.stdout)
          line = testing.last_stderr_line(result)
        else:  # What its main() calls, in this process.
          line = testing.library_line(self, tfds_data.prepare,
                                      "fashion_mnist", data_dir, source)
        self.assertStartsWith(line, "error: could not prepare fashion_mnist "
                              f"in --data_dir={data_dir}: ")
        self.assertTrue(line.endswith(
            "; give a --data_dir you can write to (or make it writable); "
            "nothing was kept from this attempt"), line)
        self.assertEqual(testing.snapshot(self.root), before)
        if name != "read-only":
          self.assertFalse(os.path.exists(data_dir))


if __name__ == "__main__":
  absltest.main()
