"""Shared test helpers: run a binary as a user would; small real datasets."""

import atexit
import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import io
import gzip
import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import numpy as np


def source_root():
  """The directory holding identity_tf/ and bin/, under Bazel or not."""
  srcdir = os.environ.get("TEST_SRCDIR")
  workspace = os.environ.get("TEST_WORKSPACE")
  if srcdir and workspace:
    return os.path.join(srcdir, workspace)
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def binary_command(name, *args):
  """The command line of bin/NAME.py with ARGS, run by this interpreter."""
  return [sys.executable, os.path.join(source_root(), "bin", name + ".py"),
          *map(str, args)]


def binary_env(env=None):
  """ENV (default: ours) in which `identity_tf` imports from this source
  tree, exactly like `bazel run //bin:NAME`."""
  child_env = dict(os.environ if env is None else env)
  child_env["PYTHONPATH"] = (source_root() + os.pathsep +
                             child_env.get("PYTHONPATH", ""))
  child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return child_env


# The environment variables a forked binary may differ in from this
# process's: read when a command runs, not when TensorFlow is imported.
_FORKABLE_ENV = ("TF_CONFIG", "BUILD_WORKING_DIRECTORY")


def _forkable(env):
  """Whether a binary run in ENV (None: ours) can be forked from a
  `_ForkServer` -- whose interpreter imported TensorFlow in our
  environment -- and behave as a fresh process would."""
  if os.environ.get("IDENTITY_TF_TEST_FRESH_PROCESSES"):
    return False
  if env is None:
    return True
  keys = set(env) | set(os.environ)
  return all(env.get(k) == os.environ.get(k) for k in keys
             if k not in _FORKABLE_ENV)


def run_binary(name, *args, timeout=600, env=None, check=False,
               fresh=False):
  """Runs bin/NAME.py with ARGS as a process of its own; returns
  CompletedProcess.

  The process is forked from an interpreter that has imported TensorFlow
  and the library already (`_ForkServer`), so it starts in milliseconds,
  not seconds: it is still a process of its own -- its own argv, exit
  status, signals, stdout and stderr, files and TensorFlow runtime -- whose
  binary parses its flags and runs its main() from the start. Where the
  test checks what happens as the interpreter starts (its environment, the
  start-up lines, HOME), FRESH (or an ENV beyond `_FORKABLE_ENV`) runs a
  new interpreter instead; IDENTITY_TF_TEST_FRESH_PROCESSES=1 does for
  every run."""
  if not fresh and _forkable(env):
    result = _fork_server().run(binary_command(name, *args),
                                binary_env(env), timeout)
  else:
    result = subprocess.run(
        binary_command(name, *args), capture_output=True, text=True,
        timeout=timeout, env=binary_env(env), check=False)
  if check and result.returncode != 0:
    raise AssertionError(
        f"bin/{name}.py {' '.join(map(str, args))} exited {result.returncode}:\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
  return result


def run_binaries(name, runs, workers, env=None):
  """{key: `run_binary(NAME, *args)`} for each key: args of RUNS, WORKERS
  processes at a time (each mostly waits for TensorFlow's import)."""
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    futures = {key: pool.submit(run_binary, name, *args, env=env)
               for key, args in runs.items()}
    return {key: future.result() for key, future in futures.items()}


# The interpreter of `_ForkServer`: it imports TensorFlow, Keras and the
# library and lists the devices (and runs no op, so that no runtime thread
# exists to be copied half-way; absl's flags of TensorFlow's modules are
# defined in it, so --helpfull lists more than a fresh binary's), then for
# each request on stdin -- {"id", "argv", "env", "cwd", "stdout",
# "stderr"} as JSON, each stream a path and how to open it ("w", "a", or
# "open" for a FIFO or a device) -- forks a
# child that becomes the binary: its environment, directory, argv and
# standard streams (opened before the fork, so that a FIFO's reader never
# sees an end before its writer), the binary run as __main__ from its first
# line, its exit status that of SystemExit as the interpreter makes it.
# Children run side by side. The server answers on the file descriptor it
# was given: {"id", "pid"} once forked, {"id", "status"} (negative: the
# signal that ended the child) once reaped.
_FORK_SERVER = """
import json, os, runpy, select, shutil, signal, sys, tempfile, traceback
answer = os.fdopen(int(sys.argv[1]), "w", buffering=1)
sys.stdout = sys.stderr
# Keras and Matplotlib write under their homes as they are imported: a
# scratch directory of the server's, as a binary's own (cli).
scratch = tempfile.mkdtemp(prefix="identity_tf_fork_server_")
os.environ.setdefault("KERAS_HOME", os.path.join(scratch, "keras_home"))
os.environ.setdefault("MPLCONFIGDIR", os.path.join(scratch, "mplconfigdir"))
import importlib
import tensorflow, keras
# What the test's binaries import, where the test's runfiles hold it (a
# binary imports the rest itself, as a fresh one would).
for module in ("identity_tf.commands.cli", "identity_tf.training.trainer",
               "identity_tf.training.evaluation", "identity_tf.serving.export",
               "identity_tf.data.tfds_data"):
  try:
    importlib.import_module(module)
  except ImportError:
    pass
# The built-in dataset's arrays (NumPy from a fixed seed, cached per
# process, read-only): made once here, not again by every binary that
# trains on them (about 1.5 s each).
try:
  from identity_tf.data import synthetic
  info = synthetic.datasets.synthetic_info()
  for split in (info.train_split, info.eval_split):
    synthetic.arrays(split)
except ImportError:
  pass
# The devices listed here, where a fresh binary lists them with its
# start-up lines captured (`cli.start_tensorflow_quietly`): no thread yet.
tensorflow.config.list_physical_devices()

def become(request, fds):
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update(request["env"])
  for target, fd in zip((1, 2), fds):
    os.dup2(fd, target)
  os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
  sys.stdin = open(0, closefd=False)
  sys.stdout = open(1, "w", closefd=False)
  sys.stderr = open(2, "w", buffering=1, closefd=False)
  for number in (signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD):
    signal.signal(number, signal.SIG_DFL)
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.set_wakeup_fd(-1)
  script = request["argv"][1]
  sys.argv = request["argv"][1:]
  sys.path[0] = os.path.dirname(script)
  status = 0
  try:
    runpy.run_path(script, run_name="__main__")
  except SystemExit as e:
    if isinstance(e.code, int) or e.code is None:
      status = e.code or 0
    else:
      print(e.code, file=sys.stderr)
      status = 1
  except BaseException:
    traceback.print_exc()
    status = 1
  import atexit
  atexit._run_exitfuncs()
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:
      pass
  return status

def open_streams(request):
  fds = []
  for name in ("stdout", "stderr"):
    if request[name] is None:  # stderr=STDOUT
      fds.append(fds[0])
      continue
    path, mode = request[name]
    flags = {"w": os.O_CREAT | os.O_TRUNC, "a": os.O_CREAT | os.O_APPEND,
             "open": 0}[mode]
    fds.append(os.open(path, os.O_WRONLY | flags, 0o644))
  return fds

wake_read, wake_write = os.pipe()
os.set_blocking(wake_write, False)
signal.set_wakeup_fd(wake_write)
signal.signal(signal.SIGCHLD, lambda *_: None)
children, pending, open_stdin = {}, b"", True
while open_stdin or children:
  ready, _, _ = select.select([0, wake_read] if open_stdin else [wake_read],
                              [], [])
  if wake_read in ready:
    os.read(wake_read, 4096)
  while children:
    pid, code = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
      break
    status = (-os.WTERMSIG(code) if os.WIFSIGNALED(code)
              else os.WEXITSTATUS(code))
    answer.write(json.dumps({"id": children.pop(pid), "status": status})
                 + "\\n")
  if open_stdin and 0 in ready:
    data = os.read(0, 1 << 16)
    if not data:
      open_stdin = False
    pending += data
    while b"\\n" in pending:
      line, pending = pending.split(b"\\n", 1)
      request = json.loads(line)
      fds = open_streams(request)
      pid = os.fork()
      if pid == 0:
        try:
          os._exit(become(request, fds))
        except BaseException:
          os._exit(70)
      for fd in set(fds):
        os.close(fd)
      children[pid] = request["id"]
      answer.write(json.dumps({"id": request["id"], "pid": pid}) + "\\n")
shutil.rmtree(scratch, ignore_errors=True)
"""


class ForkedProcess:
  """A binary forked by a `_ForkServer`, with the part of subprocess.Popen's
  interface the tests use: pid, returncode, args, stdout and stderr (text
  streams for PIPE), poll, wait, communicate, send_signal, terminate and
  kill."""

  def __init__(self, server, args, streams):
    self.args, self._server = args, server
    self.pid, self.returncode = None, None
    self.stdout, self.stderr = streams
    import threading  # pylint: disable=g-import-not-at-top
    self._started, self._ended = threading.Event(), threading.Event()

  def poll(self):
    return self.returncode

  def wait(self, timeout=None):
    if not self._ended.wait(timeout):
      raise subprocess.TimeoutExpired(self.args, timeout)
    return self.returncode

  def communicate(self, timeout=None):
    # Both pipes at once, as Popen does: a child that fills one while the
    # other is read would wait for ever.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      reads = [pool.submit(stream.read) if stream is not None else None
               for stream in (self.stdout, self.stderr)]
      outputs = tuple(None if read is None else read.result(timeout)
                      for read in reads)
    self.wait(timeout)
    return outputs

  def send_signal(self, number):
    if self.returncode is None:
      os.kill(self.pid, number)

  def terminate(self):
    self.send_signal(15)

  def kill(self):
    self.send_signal(9)


class _ForkServer:
  """A long-lived interpreter that forks the binaries the tests run
  (`_FORK_SERVER`), side by side; one per test process."""

  def __init__(self):
    import threading  # pylint: disable=g-import-not-at-top
    read, write = os.pipe()
    # The server's own output: what it says if it stops.
    self._log = tempfile.TemporaryFile("w+")
    self._process = subprocess.Popen(
        [sys.executable, "-c", _FORK_SERVER, str(write)], pass_fds=(write,),
        stdin=subprocess.PIPE, stdout=self._log, stderr=self._log,
        text=True, env=binary_env())
    os.close(write)
    self._answers = os.fdopen(read)
    self._lock = threading.Lock()
    self._running, self._next_id = {}, 0
    self._reader = threading.Thread(target=self._read_answers, daemon=True)
    self._reader.start()
    atexit.register(self.close)

  def _read_answers(self):
    for line in self._answers:
      answer = json.loads(line)
      with self._lock:
        process = self._running.get(answer["id"])
      if "pid" in answer:
        process.pid = answer["pid"]
        process._started.set()  # pylint: disable=protected-access
      else:
        process.returncode = answer["status"]
        process._ended.set()  # pylint: disable=protected-access
        with self._lock:
          del self._running[answer["id"]]
    # The server stopped: whoever waits is told why.
    self._log.seek(0)
    self.failure = self._log.read()[-3000:]
    with self._lock:
      for process in self._running.values():
        process.returncode = 70
        process._started.set()  # pylint: disable=protected-access
        process._ended.set()  # pylint: disable=protected-access

  def start(self, command, env, stdout, stderr, streams=(None, None)):
    """A `ForkedProcess` of COMMAND ([python, script, args...]) in ENV,
    its stdout and stderr written to the paths STDOUT and STDERR (each a
    (path, "w", "a" or "open") pair; STDERR None: into STDOUT's); STREAMS,
    what the
    process object offers as its stdout and stderr."""
    process = ForkedProcess(self, command, streams)
    with self._lock:
      self._next_id += 1
      self._running[self._next_id] = process
      request = {"id": self._next_id, "argv": command, "env": env,
                 "cwd": os.getcwd(), "stdout": stdout, "stderr": stderr}
      self._process.stdin.write(json.dumps(request) + "\n")
      self._process.stdin.flush()
    if not process._started.wait(120) or process.pid is None:  # pylint: disable=protected-access
      raise AssertionError("the test's fork server stopped:\n"
                           + getattr(self, "failure", ""))
    return process

  def run(self, command, env, timeout):
    """CompletedProcess of COMMAND in ENV, as subprocess.run gives it."""
    with tempfile.TemporaryDirectory() as scratch:
      paths = [os.path.join(scratch, name) for name in ("stdout", "stderr")]
      process = self.start(command, env, (paths[0], "w"), (paths[1], "w"))
      try:
        process.wait(timeout)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait(60)
        raise
      outputs = []
      for path in paths:
        with open(path, errors="replace") as f:
          outputs.append(f.read())
    return subprocess.CompletedProcess(command, process.returncode, *outputs)

  def close(self):
    """Ends the server (its stdin closed, it leaves its loop once its
    children have ended)."""
    if self._process.poll() is None:
      self._process.stdin.close()
      try:
        self._process.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._process.kill()
        self._process.wait()
    self._reader.join(timeout=10)
    self._log.close()


_server = []


def _fork_server():
  if not _server:
    _server.append(_ForkServer())
  return _server[0]


# The interpreter of `flag_checks`: it loads bin/NAME.py (argv[1]) once as a
# module, then for each command line of the JSON list on stdin calls its
# entry point, `run()` (cli.run: absl's parse with the binary's validators,
# then main()), its flags unparsed before each as absl does on a re-run;
# [exit status, stdout, stderr] of each go to the file argv[2] as JSON.
_FLAG_CHECKS = """
import contextlib, importlib.util, io, json, sys
from absl import flags
path, out = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("flag_checks_binary", path)
binary = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = binary
spec.loader.exec_module(binary)
results = []
for argv in json.load(sys.stdin):
  flags.FLAGS.unparse_flags()
  sys.argv = [path, *argv]
  stdout, stderr = io.StringIO(), io.StringIO()
  status = 0
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    try:
      binary.run()
    except SystemExit as e:
      if e.code is None or isinstance(e.code, int):
        status = e.code or 0
      else:  # What the interpreter does with SystemExit(MESSAGE).
        print(e.code, file=sys.stderr)
        status = 1
  results.append([status, stdout.getvalue(), stderr.getvalue()])
with open(out, "w") as f:
  json.dump(results, f)
"""


def flag_checks(name, runs, timeout=600):
  """[CompletedProcess] of bin/NAME.py with each of RUNS (lists of args),
  all run by one interpreter that loads the binary once and calls its
  entry point once per run (`_FLAG_CHECKS`): for the many command lines a
  binary refuses as it parses its flags (absl's validators,
  `cli.check_finite_flags`), before its main() starts TensorFlow. Exit
  status and output as the binary's own process gives them for a refusal;
  the test still runs the binary itself once (`run_binary`) to prove that
  part."""
  runs = [list(map(str, args)) for args in runs]
  if not runs:
    return []
  with tempfile.TemporaryDirectory() as scratch:
    out = os.path.join(scratch, "results.json")
    process = subprocess.run(
        [sys.executable, "-c", _FLAG_CHECKS,
         os.path.join(source_root(), "bin", name + ".py"), out],
        input=json.dumps(runs), capture_output=True, text=True,
        timeout=timeout, env=binary_env(), check=False)
    if process.returncode != 0 or not os.path.exists(out):
      raise AssertionError(f"flag checks of bin/{name}.py exited "
                           f"{process.returncode}:\n{process.stderr}")
    with open(out) as f:
      results = json.load(f)
  return [subprocess.CompletedProcess([name, *args], status, stdout, stderr)
          for args, (status, stdout, stderr) in zip(runs, results)]


def library_line(test, call, *args, **kwargs):
  """The line a binary prints for the one-line library error (a ValueError,
  `errors.IdentityTfError` mostly) that CALL(*ARGS, **KWARGS) raises, as
  `cli.errors_as_exit` prints it before exit status 1: "error: MESSAGE".
  For the variants of a mistake checked in this process rather than by a
  binary each (one launch proves the binary's part: the line, the status,
  no traceback). TEST (an absltest.TestCase) fails if CALL raises none."""
  from identity_tf.commands import cli  # pylint: disable=g-import-not-at-top
  with test.assertRaises(ValueError) as caught:
    call(*args, **kwargs)
  return f"error: {cli.message(caught.exception)}"


@functools.cache
def _train_binary_flags():
  """The flags bin/train.py defines (its own and those it takes from cli),
  its module loaded once into this process for their definitions."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "train_binary_flags", os.path.join(source_root(), "bin", "train.py"))
  binary = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = binary  # absl names a flag's module from it.
  spec.loader.exec_module(binary)
  return tuple(flags.FLAGS.get_key_flags_for_module(binary))


def _train_flags(args):
  """absl's parse of bin/train.py's flags ARGS, by copies of the binary's
  own flag definitions (types, bounds, defaults: None where unset)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  for flag in _train_binary_flags():
    values[flag.name] = copy.deepcopy(flag)
  values(["train", *map(str, args)])
  return values


def train_config(*args):
  """(config, model_dir) that bin/train.py's main resolves from its flags
  ARGS before it trains: `run.choose_config` of --preset, --model_dir and
  the flags of `configs.Config`'s fields (`cli.config_overrides`), ARGS
  parsed by absl as the binary's own flags are. Raises the binary's
  one-line ConfigError where it refuses them (`library_line`)."""
  from identity_tf import configs  # pylint: disable=g-import-not-at-top
  from identity_tf.training import run as run_lib  # pylint: disable=g-import-not-at-top
  values = _train_flags(args)
  overrides = {field.name: values[field.name].value
               for field in dataclasses.fields(configs.Config)
               if field.name != "preset"}
  return (run_lib.choose_config(values.preset, values.model_dir, overrides),
          values.model_dir)


def train_in_process(*args):
  """(exit status, stderr, stdout) of bin/train.py with flags ARGS run in
  this process as its main() runs them once the flags are checked:
  `train_config` (a refusal made a line by `cli.errors_as_exit`), then
  `commands.train.train_command` with --model_dir, --data_dir, --tpu,
  --cluster_timeout, --dry_run and --verbose; its progress lines and the
  line it exits with (`cli.exit_with`) go to the captured stderr, its
  result lines to stdout. For the variants of a mistake that differ in
  what the library does, one binary launch proving the binary's part (the
  printed line, exit status, no traceback)."""
  from identity_tf.commands import cli  # pylint: disable=g-import-not-at-top
  from identity_tf.commands import train  # pylint: disable=g-import-not-at-top
  values = _train_flags(args)
  stderr, stdout = io.StringIO(), []
  status = 0
  with contextlib.redirect_stderr(stderr):
    try:
      with cli.errors_as_exit():
        config, model_dir = train_config(*args)
      train.train_command(
          config, model_dir, data_dir=values.data_dir, tpu=values.tpu,
          cluster_timeout=values.cluster_timeout, dry_run=values.dry_run,
          verbose=values.verbose, result=stdout.append)
    except SystemExit as e:
      status = e.code
      if isinstance(status, str):  # What the interpreter makes of it.
        print(status, file=sys.stderr)
        status = 1
  return status, stderr.getvalue(), "".join(line + "\n" for line in stdout)


class SharedRoot:
  """Mixin: `cls.root`, a directory made before the class's setUpClass body
  (which calls super() first) and removed after its last test."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.root = tempfile.mkdtemp(dir=absltest.get_default_test_tmpdir())

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.root, ignore_errors=True)
    super().tearDownClass()


class SharedRootTestCase(SharedRoot, absltest.TestCase):
  """An absltest.TestCase with `cls.root`."""


class ProcessTestCase(absltest.TestCase):
  """A test case whose binaries run as child processes, killed and reaped
  (their pipes closed) after each test."""

  def setUp(self):
    super().setUp()
    self._processes = []

  def start_binary(self, name, *args, env=None, stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, fresh=False):
    """bin/NAME.py with ARGS as a child process (text pipes by default):
    forked from the fork server (`run_binary`) unless FRESH or ENV says a
    new interpreter; either has Popen's poll, wait, communicate and
    signals."""
    if fresh or not _forkable(env):
      process = subprocess.Popen(binary_command(name, *args), stdout=stdout,
                                 stderr=stderr, text=True,
                                 env=binary_env(env))
    else:
      process = self._fork(binary_command(name, *args), binary_env(env),
                           stdout, stderr)
    self._processes.append(process)
    return process

  def _fork(self, command, env, stdout, stderr):
    """A `ForkedProcess` with Popen's stream arguments: PIPE (a FIFO read
    here as text), DEVNULL, STDOUT (stderr only), None (ours) or an open
    file (appended to)."""
    scratch = self.create_tempdir().full_path
    specs, readers = [], []
    for number, target in enumerate((stdout, stderr)):
      if target == subprocess.STDOUT:
        specs.append(None)
        readers.append(None)
      elif target == subprocess.PIPE:
        fifo = os.path.join(scratch, f"fifo{number}")
        os.mkfifo(fifo)
        readers.append(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        specs.append((fifo, "open"))
      elif target == subprocess.DEVNULL:
        specs.append((os.devnull, "open"))
        readers.append(None)
      elif target is None:
        specs.append((f"/proc/{os.getpid()}/fd/{number + 1}", "open"))
        readers.append(None)
      else:
        target.flush()
        specs.append((target.name, "a"))
        readers.append(None)
    streams = []
    for fd in readers:
      streams.append(None if fd is None else fd)
    process = _fork_server().start(command, env, *specs)
    for number, fd in enumerate(readers):
      if fd is not None:
        os.set_blocking(fd, True)
        streams[number] = open(fd, errors="replace")
    process.stdout, process.stderr = streams
    return process

  def tearDown(self):
    for process in self._processes:
      if process.poll() is None:
        process.kill()
      process.wait()
      for stream in (process.stdout, process.stderr):
        if stream is not None:
          stream.close()
    super().tearDown()


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def report_written(test, result, json_path, png_path):
  """The JSON report a theory binary printed (RESULT), after checking that
  it exited 0, wrote the same report to JSON_PATH and a PNG to PNG_PATH."""
  test.assertEqual(result.returncode, 0, result.stderr)
  report = json.loads(result.stdout)
  with open(json_path) as f:
    test.assertEqual(json.load(f), report)
  with open(png_path, "rb") as f:
    test.assertEqual(f.read(8), PNG_SIGNATURE)
  return report


def snapshot(directory):
  """{relative path: SHA-256 of a file, or None for a directory} of
  everything under DIRECTORY ({} if it does not exist)."""
  entries = {}
  for root, dirs, names in os.walk(directory):
    for name in dirs:
      entries[os.path.relpath(os.path.join(root, name), directory)] = None
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        entries[os.path.relpath(path, directory)] = hashlib.sha256(
            f.read()).hexdigest()
  return entries


# What a binary logs about the machine rather than the command: TensorFlow's
# native (C++) log -- at start-up (CUDA, CPU features), printed before absl
# initialises logging, so TF_CPP_MIN_LOG_LEVEL does not silence it, and at
# teardown (an input iterator's partly read cache); and
# Matplotlib's (imported by Keras) when the home directory is not writable,
# as under the test sandbox. Python's other warnings (absl's "W1125 ...
# file.py:12] ...") are not in it.
MACHINE_LOG = re.compile(
    r"(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|[IWEF]\d{4} [\d:.]+\s+\d+ \w+\.cc:\d+\]"
    r"|To enable the following instructions:"
    r"|W\d{4} [\d:.]+\s+\d+ __init__\.py:\d+\] (mkdir -p failed for path "
    r".*/matplotlib|Matplotlib created a temporary cache directory))")


def own_stderr_lines(result):
  """The non-empty lines of a process's stderr but for `MACHINE_LOG`: what
  the command itself said."""
  return [line for line in result.stderr.splitlines()
          if line.strip() and not MACHINE_LOG.match(line)]


def last_stderr_line(result):
  """The last non-empty line of a process's stderr (where errors are reported)."""
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  return lines[-1] if lines else ""


# Fashion-MNIST's files as its publisher (and Debian's package) name them.
FASHION_FILES = {"train": ("train-images-idx3-ubyte.gz",
                           "train-labels-idx1-ubyte.gz"),
                 "test": ("t10k-images-idx3-ubyte.gz",
                          "t10k-labels-idx1-ubyte.gz")}


def write_fashion_mnist_files(directory, rng, counts):
  """Fashion-MNIST's four gzipped idx files with random records.

  COUNTS: {"train": n, "test": m}. The idx format (yann.lecun.com/exdb/mnist):
  a big-endian header -- magic 2051, count, 28, 28 for images; magic 2049,
  count for labels -- then one byte per pixel or label. Returns {split:
  (images uint8 [n, 28, 28, 1], labels uint8 [n])}.
  """
  os.makedirs(directory)
  records = {}
  for split, (image_file, label_file) in FASHION_FILES.items():
    n = counts[split]
    images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    header = np.array([2051, n, 28, 28], ">u4").tobytes()
    with gzip.open(os.path.join(directory, image_file), "wb") as f:
      f.write(header + images.tobytes())
    with gzip.open(os.path.join(directory, label_file), "wb") as f:
      f.write(np.array([2049, n], ">u4").tobytes() + labels.tobytes())
    records[split] = (images[..., None], labels)
  return records


def fewer_mnist_examples(counts):
  """TFDS's MNIST builders read exactly 60,000 + 10,000 records: patched to
  COUNTS for the small files of `write_fashion_mnist_files`."""
  from tensorflow_datasets.image_classification import mnist  # pylint: disable=g-import-not-at-top
  return mock.patch.multiple(mnist, _TRAIN_EXAMPLES=counts["train"],
                             _TEST_EXAMPLES=counts["test"])


def prepare_data_command_with_records(counts, *args):
  """The command line of bin/prepare_data.py with ARGS, run as
  `binary_command` runs it but with TFDS's MNIST builders reading COUNTS
  records (as `fewer_mnist_examples`): the real ones read 60,000 + 10,000."""
  binary = binary_command("prepare_data")[1]
  code = ("import runpy, sys\n"
          "from tensorflow_datasets.image_classification import mnist\n"
          f"mnist._TRAIN_EXAMPLES = {counts['train']}\n"
          f"mnist._TEST_EXAMPLES = {counts['test']}\n"
          f"sys.argv[0] = {binary!r}\n"
          "runpy.run_path(sys.argv[0], run_name='__main__')\n")
  return [sys.executable, "-c", code, *args]


def free_ports(count):
  """COUNT loopback ports free a moment ago (for a test's cluster or a port
  nothing listens on)."""
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


@functools.cache
def two_replicas():
  """The one MirroredStrategy over the two logical CPUs a test module set up
  (before TensorFlow started) that every in-process test shares: two such
  strategies in one process number their collectives alike, and a second
  one's run of another network aborts ("Shape mismatch in the collective
  instance")."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def normalization_layers(model):
  """Every normalisation layer inside MODEL, nested units included."""
  import keras  # pylint: disable=g-import-not-at-top
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  norms = (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
           keras.layers.GroupNormalization, keras.layers.UnitNormalization)
  found, stack = [], list(model.layers)
  while stack:
    layer = stack.pop()
    found += [layer] if isinstance(layer, norms) else []
    stack += model_lib.sublayers(layer)
  return found


def sessions(model_dir):
  """[(start step, step of its first progress record or None)] of each
  session of training in MODEL_DIR's metrics.jsonl, in order: read here
  line by line, not through identity_tf.training.metrics (a line a kill cut
  short is skipped). A session's "start" record is the step it restored;
  its first progress record the first step it trained to and reported."""
  found = []
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if record.get("start"):
        found.append([record["step"], None])
      elif found and found[-1][1] is None and "train_steps" in record:
        found[-1][1] = record["step"]
  return [tuple(session) for session in found]


def require_optional_package(test, package, install):
  """Skips TEST (an absltest.TestCase, from inside a test method) unless the
  optional PACKAGE imports; INSTALL says how to install it.

  Under CI=true a missing package fails the test instead: .ci/run installs
  every optional package, so there a skip would only hide a broken setup
  (Bazel reports a skipped test as PASSED).
  """
  if importlib.util.find_spec(package) is not None:
    return
  message = f"{package} is not installed: {install}"
  if os.environ.get("CI") == "true":
    test.fail(f"{message}; CI=true, where every optional package must be "
              "installed (.ci/run installs them), so this is not skipped")
  test.skipTest(message)


def flag_error(result):
  """The message of absl's flag check in a process's stderr, or ""."""
  prefix = "FATAL Flags parsing error: "
  for line in result.stderr.splitlines():
    if line.startswith(prefix):
      return line[len(prefix):]
  return ""
