"""What the binaries share: their first steps, their common flags, the paths
a user types, errors as one line and an exit status, and how a user runs a
binary (for the commands that messages suggest). Pure Python and absl: no
binary loads TensorFlow before its flags are checked (`begin` then starts
it, quietly). The command layer: nothing under identity_tf/ outside
identity_tf/commands/ imports it."""

import contextlib
import dataclasses
import logging as python_logging
import math
import os
import re
import signal
import sys
import tempfile
import textwrap

from absl import app
from absl import flags
from absl import logging

from identity_tf import configs
from identity_tf import errors


def begin(argv, example="--help", takes_arguments=False,
          start_tensorflow=True):
  """The start of a binary's main(ARGV).

  TensorFlow and absl log every checkpoint write and more at INFO: the
  terminal is kept for progress lines unless --verbosity asks for more, and
  TensorFlow starts without its C++ start-up lines (once the flags are
  checked: `start_tensorflow_quietly`; START_TENSORFLOW False leaves that
  to the binary, which calls it once it knows it needs TensorFlow). No
  binary takes positional arguments (but those that say so,
  TAKES_ARGUMENTS): one line naming them and how flags look (EXAMPLE),
  exit status 1.
  """
  stop_on_signals()
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
    # Keras imports Matplotlib, which warns twice when it cannot write a
    # cache under HOME (a read-only or missing home) and notes each font
    # cache it builds: nothing a run needs.
    python_logging.getLogger("matplotlib").setLevel(python_logging.ERROR)
  check_finite_flags()
  check_integer_flags()
  if len(argv) > 1 and not takes_arguments:
    raise SystemExit(f"error: unexpected arguments {' '.join(argv[1:])}; "
                     f"flags look like {example}")
  if start_tensorflow:
    start_tensorflow_quietly()


# TensorFlow's C++ start-up lines on a machine without a GPU: oneDNN's and
# the CUDA stubs' notes, the cuInit failure, cpu_feature_guard's, and the
# notice that absl's C++ log is not initialised yet. The first two are
# logged before that initialisation, where TF_CPP_MIN_LOG_LEVEL does not
# reach them (TensorFlow 2.21).
_START_UP_LINES = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog|"
    r"[IWE]\d{4} [\d:. ]+\d+ (port|cudart_stub|cuda_platform|"
    r"cpu_feature_guard)\.cc:\d+\]|To enable the following instructions)")


# The terminal's stderr while `start_tensorflow_quietly` captures fd 2: a
# signal meanwhile must still reach the user (`stop_on_signals`).
_terminal_fd = None


def start_tensorflow_quietly():
  """Imports TensorFlow and lists its devices with its C++ start-up lines
  left out (every other line it writes meanwhile is passed on), unless
  TF_CPP_MIN_LOG_LEVEL is below 2 (every binary sets it to 2 unless the
  user set it: bin/*.py): the terminal is for the run's own lines."""
  if "tensorflow" in sys.modules or os.environ.get(
      "TF_CPP_MIN_LOG_LEVEL", "0") < "2":
    return
  global _terminal_fd
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile("w+") as captured:
    _terminal_fd = saved
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.config.list_physical_devices()
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      _terminal_fd = None
      os.close(saved)
      captured.seek(0)
      for line in captured:
        if not _START_UP_LINES.match(line):
          sys.stderr.write(line)
      sys.stderr.flush()


def stop_on_signals():
  """From here on SIGTERM and SIGINT stop the binary with one line and the
  shell's status for the signal (143, 130), instead of a traceback from
  wherever Python was (often inside `import tensorflow`) or no word at all.
  Training replaces this with its own handling once it can save a
  checkpoint (`training.preemption`). What a stop here leaves is what
  kill -9 would: every binary writes its files so that it is whole."""
  def stop(signum, _):
    name = signal.Signals(signum).name
    os.write(2 if _terminal_fd is None else _terminal_fd,
             f"error: stopped by {name}; run the same command to start "
             f"again\n".encode())
    remove_scratch_home()
    os._exit(128 + signum)  # pylint: disable=protected-access
  try:
    # SIGTERM last: once it is caught, both are (what a test waits for).
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, stop)
  except ValueError:  # Not the main thread: the caller's handlers stay.
    pass


# The largest magnitude of an integer flag, unless `INTEGER_FLAG_LIMITS`
# says otherwise: TensorFlow takes sizes and counts as int32 (and a value
# past it would only fail, or overflow, once the work is under way).
LARGEST_INTEGER = 2**31 - 1
# Integer flags that mean more than int32 holds: their largest magnitude,
# or None where the binary itself checks the range (//bin:export's
# --version, whose line says what TF Serving reads).
INTEGER_FLAG_LIMITS = {"seed": 2**32 - 1, "seeds": 2**32 - 1,
                       "model_version": 2**63 - 1, "version": None}
# The flags of `configs.Config` fields (`define_config_flags`): checked by
# `configs.validate`, with the run's own bounds and lines.
_CONFIG_FLAGS = set()


def check_integer_flags():
  """One line and exit status 1 if an integer flag, a repeated one or a
  comma-separated list of integers was given a value past
  `LARGEST_INTEGER` (or the flag's `INTEGER_FLAG_LIMITS`) either way: absl
  bounds only the flags that say so, and Python's integers have none."""
  for name in flags.FLAGS:
    flag = flags.FLAGS[name]
    if not flag.present or flag.value is None or name in _CONFIG_FLAGS:
      continue
    limit = INTEGER_FLAG_LIMITS.get(name, LARGEST_INTEGER)
    if limit is None:
      continue
    values = flag.value if isinstance(flag.value, list) else [flag.value]
    if isinstance(flag.parser, flags.IntegerParser):
      numbers = values
    elif isinstance(flag.parser, flags.ListParser):
      numbers = [int(v) for v in values
                 if isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v)]
    else:
      continue
    for number in numbers:
      if abs(number) > limit:
        raise SystemExit(f"error: --{name}={number} is beyond {limit}, the "
                         "largest it takes; lower it")


def check_finite_flags():
  """One line and exit status 1 if a float flag was given NaN or an
  infinity (absl's bounds let both through: NaN compares false, and inf
  is above any lower bound); a repeated float flag, each of its values."""
  for name in flags.FLAGS:
    flag = flags.FLAGS[name]
    if not (isinstance(flag.parser, flags.FloatParser) and flag.present and
            flag.value is not None):
      continue
    for value in flag.value if isinstance(flag.value, list) else [flag.value]:
      if not math.isfinite(value):
        raise SystemExit(f"error: --{name} must be a finite number, got "
                         f"{value}")


@contextlib.contextmanager
def errors_as_exit():
  """A ValueError (the library's one-line errors: `errors.IdentityTfError`
  and the few that are plain ValueErrors) becomes "error: ..." on stderr
  and exit status 1, without a traceback."""
  try:
    yield
  except ValueError as e:
    raise SystemExit(f"error: {message(e)}") from None


def message(error):
  """ERROR's one line, the commands it suggests written the way this
  process was run (`command`)."""
  if isinstance(error, errors.IdentityTfError):
    return error.render(lambda part: command(part.binary, part.args))
  return str(error)


def print_stderr(line):
  """LINE on stderr at once: a binary's progress and notes (its results go
  to stdout, where a program may read them)."""
  print(line, file=sys.stderr, flush=True)


def exit_with(line, status):
  """LINE on stderr, then exit with STATUS (e.g. 143 after SIGTERM)."""
  print_stderr(line)
  sys.exit(status)


# ---------------------------------------------------------------------------
# The flags several binaries take, each defined (and explained) here once.

def config_help(name):
  """The help text of `configs.Config` field NAME: what //bin:train's flag
  of that name says, for another binary's flag of the same meaning."""
  (field,) = [f for f in dataclasses.fields(configs.Config) if f.name == name]
  return field.metadata["help"]


def define_model_dir(default=None, required=False):
  """--model_dir; DEFAULT says what the binary does when it is not given."""
  text = ("A training run's directory: its config.json, checkpoints and "
          "TensorBoard logs.")
  holder = flags.DEFINE_string("model_dir", None,
                               text + (f" Default: {default}" if default
                                       else ""))
  if required:
    flags.mark_flag_as_required("model_dir")
  return holder


def define_data_dir():
  """--data_dir, where TFDS datasets are prepared and read."""
  return flags.DEFINE_string(
      "data_dir", None,
      "TFDS data directory (default: TFDS's, ~/tensorflow_datasets or "
      "$TFDS_DATA_DIR); //bin:prepare_data prepares datasets there. Nothing "
      "is downloaded but by //bin:prepare_data.")


def define_dataset(default=None, use="", required=False):
  """--dataset: `configs.Config.dataset`'s help, then USE: what this binary
  does with it (and, for DEFAULT None, what not giving it means)."""
  holder = flags.DEFINE_string("dataset", default,
                               f"{config_help('dataset')} {use}".strip())
  if required:
    flags.mark_flag_as_required("dataset")
  return holder


def define_tpu():
  """--tpu, for --strategy=tpu."""
  return flags.DEFINE_string("tpu", None, "--strategy=tpu: TPU name or "
                             "grpc:// address (default: the local TPU).")


def define_checkpoint():
  """--checkpoint of a run's --model_dir."""
  return flags.DEFINE_string(
      "checkpoint", None,
      "A step, ckpt-<step> or a checkpoint path prefix (default: the newest "
      "intact checkpoint in --model_dir).")


def define_config_flags(config_class, exclude=("preset",)):
  """One flag per field of CONFIG_CLASS (a dataclass such as
  `configs.Config`), default None (unset: the preset's value, which --help
  shows, `preset_values`), with the field's help text.
  `config_overrides` reads back the ones that were set."""
  for field in dataclasses.fields(config_class):
    if field.name in exclude:
      continue
    kind, text = field.type, field.metadata["help"]
    _CONFIG_FLAGS.add(field.name)
    if kind is tuple:
      flags.DEFINE_list(field.name, None, text)
    elif kind is bool:
      flags.DEFINE_boolean(field.name, None, text)
    elif kind is int:
      flags.DEFINE_integer(field.name, None, text)
    elif kind is float:
      flags.DEFINE_float(field.name, None, text)
    else:
      flags.DEFINE_string(field.name, None, text)


# What asks a binary for its help (absl's spellings).
HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--help=true")


def run(main, doc, groups=(), shown=None):
  """absl's `app.run(MAIN)`, but --help (-h, -?, --helpshort) prints
  `usage(DOC, ...)` on stdout and exits 0. SHOWN(argv) gives the values to
  show beside the flags (default: their defaults): //bin:train shows the
  preset named on the command line."""
  keep_home_untouched()
  argv = sys.argv[1:]

  def checked_main(argv):
    # Before anything else the binary does: every binary's flags, bounded.
    check_finite_flags()
    check_integer_flags()
    return main(argv)

  try:
    try:
      if any(arg in HELP_FLAGS for arg in argv):
        sys.stdout.write(usage(doc, sys.modules[main.__module__], groups,
                               shown(argv) if shown else None))
        sys.exit(0)
      app.run(checked_main)
    finally:
      # What is still buffered goes now, where a closed stdout is caught,
      # not at the interpreter's exit.
      sys.stdout.flush()
  except BrokenPipeError:
    if not _stdout_closed():
      raise
    _output_was_closed()
  except SystemExit as e:
    if _OUTPUT_CLOSED and e.code in (None, 0):
      _output_was_closed()
    raise


# Set once a result could not be written: stdout's reader is gone
# (`print_result`).
_OUTPUT_CLOSED = []


def print_result(line):
  """LINE on stdout at once, for a program reading the results as they
  come (//bin:evaluate --watch). Its reader gone (`... | head -1`), the
  work goes on -- its files are written whole -- and the binary ends with
  one line saying the output was closed (`run`)."""
  if _OUTPUT_CLOSED:
    return
  try:
    print(line, flush=True)
  except BrokenPipeError:
    _discard_stdout()
    _OUTPUT_CLOSED.append(True)


def _discard_stdout():
  """Points stdout at /dev/null: nothing more can reach its reader, and the
  flush at exit would fail again."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())
  os.close(devnull)


def _output_was_closed():
  _discard_stdout()
  exit_with("error: the output was closed before the command could write "
            "all of it (a pipe's reader such as head exited); what it wrote "
            "to files is whole: run it again without closing its output "
            "to see the rest", 1)


def _stdout_closed():
  """Whether stdout is a pipe whose reader has gone (or otherwise takes no
  more): poll(2) reports an error on its write end."""
  import select  # pylint: disable=g-import-not-at-top
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP)
               for _, events in poller.poll(0))
  except (OSError, ValueError):
    return True


# Where Keras and Matplotlib write what they otherwise write into the home
# directory (~/.keras/keras.json; ~/.config/matplotlib and its font cache in
# ~/.cache/matplotlib): a directory of this process's, removed at its exit.
_SCRATCH_HOME = []


def keep_home_untouched():
  """Points Keras (KERAS_HOME) and Matplotlib (MPLCONFIGDIR) at a
  temporary directory of this process's, unless the user set them: a
  binary writes only where the user told it to, never into their home
  directory. The directory is removed when the process exits (also on
  SIGTERM and Ctrl-C, `stop_on_signals`); it is made only if one of them
  is needed, before either is imported."""
  wanted = [name for name in ("KERAS_HOME", "MPLCONFIGDIR")
            if name not in os.environ]
  if not wanted or _SCRATCH_HOME:
    return
  import atexit  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  _remove_stale_scratch_homes()
  try:
    scratch = tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-")
  except OSError:  # No temporary directory to write: theirs, as before.
    return
  _SCRATCH_HOME.append(scratch)
  atexit.register(shutil.rmtree, scratch, ignore_errors=True)
  for name in wanted:
    os.environ[name] = os.path.join(scratch, name.lower())


_SCRATCH_PREFIX = "identity_tf-home-"


def _remove_stale_scratch_homes():
  """Removes the scratch directories of this user's binaries that were
  killed (SIGKILL skips every cleanup): those whose process is gone."""
  import shutil  # pylint: disable=g-import-not-at-top
  directory = tempfile.gettempdir()
  try:
    names = os.listdir(directory)
  except OSError:
    return
  for name in names:
    match = re.fullmatch(re.escape(_SCRATCH_PREFIX) + r"(\d+)-\w+", name)
    path = os.path.join(directory, name)
    try:
      if not match or os.lstat(path).st_uid != os.getuid():
        continue
      os.kill(int(match.group(1)), 0)
    except ProcessLookupError:
      shutil.rmtree(path, ignore_errors=True)
    except (OSError, OverflowError):
      continue


def remove_scratch_home():
  """Removes `keep_home_untouched`'s directory now (before an `os._exit`,
  which skips the removal at exit)."""
  import shutil  # pylint: disable=g-import-not-at-top
  for scratch in _SCRATCH_HOME:
    shutil.rmtree(scratch, ignore_errors=True)


def usage(doc, module, groups=(), shown=None):
  """DOC, then every flag MODULE defines or adopts (its absl key flags):
  first under "the command" those GROUPS leave out, then under each of
  GROUPS' headings ((heading, flag names) pairs) its flags; each with its
  value, SHOWN[name] if SHOWN has it, else its default. (absl's --helpfull
  lists absl's own flags too.)"""
  shown = shown or {}
  own = {flag.name: flag
         for flag in flags.FLAGS.get_key_flags_for_module(module)}
  grouped = {name for _, names in groups for name in names}
  sections = [("the command" if groups else "flags",
               sorted(set(own) - grouped))]
  sections += [(heading, [name for name in names if name in own])
               for heading, names in groups]
  text = textwrap.dedent(doc).strip() + "\n"
  if "preset" in shown:
    text += (f"\nBeside each flag: its value in the {shown['preset']} "
             "preset (--preset=NAME --help shows another's); a flag that "
             "is set overrides it.\n")
  for heading, names in sections:
    if names:
      text += f"\n{heading}:\n"
      for name in names:
        value = shown[name] if name in shown else own[name].default
        text += _flag_usage(own[name], value)
  return text


def _flag_usage(flag, value):
  """FLAG's lines in `usage`: --name=VALUE, then its help, indented."""
  name = f"--[no]{flag.name}" if flag.boolean else f"--{flag.name}"
  if isinstance(value, (tuple, list)):
    value = ",".join(map(str, value))
  elif isinstance(value, bool):
    value = str(value).lower()
  line = f"  {name}" + ("" if value is None else f"={value}")
  return line + "\n" + textwrap.fill(
      flag.help, width=79, initial_indent=" " * 6,
      subsequent_indent=" " * 6) + "\n"


def check_at_least(minimum, *names):
  """Refuses a value below MINIMUM of each flag of NAMES with absl's one
  line, worded "--NAME must be >= MINIMUM"."""
  for name in names:
    flags.register_validator(name, lambda value: value >= minimum,
                             message=f"--{name} must be >= {minimum}")


def preset_values(argv):
  """{Config field: value} of the preset ARGV names with --preset (smoke if
  it names none or an unknown one), and "preset" its name: what //bin:train
  --help shows beside each flag."""
  name = "smoke"
  for i, arg in enumerate(argv):
    if arg.startswith("--preset="):
      name = arg.split("=", 1)[1]
    elif arg == "--preset" and i + 1 < len(argv):
      name = argv[i + 1]
  name = name if name in configs.PRESETS else "smoke"
  return dict(dataclasses.asdict(configs.PRESETS[name]), preset=name)


def config_overrides(config_class, exclude=("preset",)):
  """{field: the value of its flag, None if unset} (`define_config_flags`)."""
  return {field.name: flags.FLAGS[field.name].value
          for field in dataclasses.fields(config_class)
          if field.name not in exclude}


def path(value):
  """A path flag's VALUE resolved against the user's directory, or None."""
  return resolve_path(value) if value else None


def resolve_path(value):
  """VALUE made absolute against the directory the user ran the command from.

  Under `bazel run` the working directory is the runfiles tree; Bazel puts
  the user's directory in BUILD_WORKING_DIRECTORY. `~` is expanded; URLs of
  other filesystems (gs://...) are returned unchanged.
  """
  value = os.path.expanduser(os.fspath(value))
  if os.path.isabs(value) or "://" in value:
    return value
  base = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
  return os.path.normpath(os.path.join(base, value))


def default_model_dir(preset):
  """runs/<preset> under the directory the user ran the command from."""
  return resolve_path(os.path.join("runs", preset))


def command(binary, args=""):
  """The command line that runs bin/BINARY.py with ARGS the way this process
  was run: `identity-tf-NAME ARGS` from a pip-installed console script
  (pyproject.toml), else `bazel run //bin:BINARY -- ARGS` (`errors.Command`'s
  form)."""
  if os.path.basename(sys.argv[0] if sys.argv else "").startswith(
      "identity-tf-"):
    line = f"identity-tf-{binary.replace('_', '-')}"
    return f"{line} {args}" if args else line
  return str(errors.Command(binary, args))
