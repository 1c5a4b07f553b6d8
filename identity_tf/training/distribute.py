"""Distribution: the tf.distribute strategy of a run and this process's role.

`create_strategy(name)` makes one of `configs.STRATEGIES`; the cluster
(`multi_worker_mirrored`, `parameter_server`) comes from TF_CONFIG, read by
TensorFlow's own `TFConfigClusterResolver`. `is_chief` says whether this
process writes the run directory, and `run_parameter_server_task` is what
worker and parameter-server processes of a `parameter_server` cluster do.
"""

import functools
import json
import os
import re
import signal
import socket
import time

from absl import logging
import tensorflow as tf

from identity_tf import configs
from identity_tf import errors
from identity_tf import machine


# The strategies whose cluster comes from TF_CONFIG. The others train in
# this one process, whatever TF_CONFIG says.
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")


def tf_config():
  """TF_CONFIG as a dict ({} when it is unset or blank); ValueError (one line
  naming TF_CONFIG) if it is not a JSON object whose "cluster" and "task"
  are objects."""
  text = os.environ.get("TF_CONFIG", "")
  if not text.strip():
    return {}
  fix = ('set it to {"cluster": {...}, "task": {"type": ..., "index": ...}} '
         "or unset it (docs/training.md, Strategies)")
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise errors.ConfigError(
        f"TF_CONFIG is not valid JSON ({e}); {fix}") from None
  except RecursionError:
    # Python's parser recurses once per level: nested thousands deep it is
    # no cluster description, whatever else it holds.
    raise errors.ConfigError(
        f"TF_CONFIG is JSON nested too deeply to read; {fix}") from None
  if not isinstance(value, dict):
    raise errors.ConfigError(f"TF_CONFIG must be a JSON object, got "
                             f"{type(value).__name__}; {fix}")
  for key in ("cluster", "task"):
    if not isinstance(value.get(key, {}), dict):
      raise errors.ConfigError(
          f'TF_CONFIG\'s "{key}" must be a JSON object, got '
          f"{type(value[key]).__name__}; {fix}")
  task = value.get("task", {})
  index = task.get("index", 0)
  if not isinstance(index, int) or isinstance(index, bool) or index < 0:
    raise errors.ConfigError(
        f'TF_CONFIG\'s task "index" must be a whole number >= 0, '
        f"got {index!r}; {fix}")
  return value


def check_tf_config(strategy, echo):
  """Checks TF_CONFIG for --strategy=STRATEGY (ValueError naming it if it
  is malformed, whatever the strategy). Strategies outside
  CLUSTER_STRATEGIES train in this one process: ECHO hears, in one line,
  that a TF_CONFIG that is set is ignored (a leftover of another run,
  most likely -- it must not make this process a worker whose checkpoints
  are scratch)."""
  config = tf_config()
  if config and strategy not in CLUSTER_STRATEGIES:
    echo(f"note: TF_CONFIG is set but ignored: --strategy={strategy} trains "
         f"in this one process (only {' and '.join(CLUSTER_STRATEGIES)} read "
         "TF_CONFIG); unset it to silence this note")


def _resolver():
  """TF_CONFIG's cluster resolver; ValueError (one line naming TF_CONFIG) if
  TF_CONFIG is not valid."""
  tf_config()
  try:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    # The resolver reads TF_CONFIG lazily: read it now, where a bad value
    # can be named.
    _ = resolver.task_type, resolver.task_id, resolver.cluster_spec()
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise errors.ConfigError(
        f"TF_CONFIG does not describe a cluster ({type(e).__name__}: {e}); "
        'set it to {"cluster": {...}, "task": {"type": ..., "index": ...}} '
        "or unset it (docs/training.md, Strategies)") from None
  return resolver


def cluster_task(strategy):
  """(task type, task index) of this process under --strategy=STRATEGY:
  TF_CONFIG's for CLUSTER_STRATEGIES, else (None, 0) -- TF_CONFIG is
  ignored."""
  if strategy not in CLUSTER_STRATEGIES:
    return None, 0
  resolver = _resolver()
  return resolver.task_type, resolver.task_id or 0


def is_chief(strategy):
  """Whether this process writes model_dir under --strategy=STRATEGY: the
  chief, or worker 0 if none; always outside CLUSTER_STRATEGIES."""
  if strategy not in CLUSTER_STRATEGIES:
    return True
  resolver = _resolver()
  task_type, task_id = resolver.task_type, resolver.task_id or 0
  if task_type is None or task_type == "chief":
    return True
  return (task_type == "worker" and task_id == 0 and
          "chief" not in resolver.cluster_spec().as_dict())


def run_parameter_server_task():
  """Under `parameter_server`, serves this process's TF_CONFIG task forever.

  Workers and parameter servers only run a `tf.distribute.Server`; the chief
  (the coordinator) runs the training loop and sends them work. Returns
  False (without serving) on the chief.
  """
  resolver = _resolver()
  if resolver.task_type not in ("worker", "ps"):
    return False
  server = tf.distribute.Server(
      resolver.cluster_spec(), job_name=resolver.task_type,
      task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc",
      start=True)
  logging.info("parameter_server: %s %d serving at %s", resolver.task_type,
               resolver.task_id, server.target)
  server.join()
  return True


# How often a waiting task looks for its peers, in seconds.
_POLL_SECONDS = 0.5


def _listen(port):
  """A socket listening on PORT on every interface, as TensorFlow's server
  will; ValueError (one line) if PORT is taken."""
  try:
    if socket.has_dualstack_ipv6():
      return socket.create_server(("", port), family=socket.AF_INET6,
                                  dualstack_ipv6=True, reuse_port=False)
    return socket.create_server(("", port))
  except OSError as e:
    raise errors.ConfigError(
        f"port {port} of this task in TF_CONFIG is in use ({e.strerror}); "
        "stop what holds it or give the task another port") from None


def _answers(address):
  """Whether something accepts connections at ADDRESS ("host:port")."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
      return True
  except OSError:
    return False


def _wait_for_peers(timeout, echo):
  """Returns once every other chief/worker task of TF_CONFIG is up.

  MultiWorkerMirroredStrategy waits for its peers inside one TensorFlow
  call that holds the interpreter lock: no timeout, no signal handler runs
  until every task has joined. So the tasks meet first here, in Python: each
  listens on its own TF_CONFIG port (closed again before TensorFlow binds
  it) and waits until every peer's port answers -- the peer's listener or,
  once it got here first, its TensorFlow server. Raises ValueError (one
  line naming the missing tasks) after TIMEOUT seconds; SIGTERM and Ctrl-C
  work as everywhere else.
  """
  resolver = _resolver()
  cluster = resolver.cluster_spec().as_dict()
  tasks = [(job, index, address) for job in ("chief", "worker")
           for index, address in enumerate(cluster.get(job, []))]
  me = (resolver.task_type, resolver.task_id or 0)
  peers = [t for t in tasks if t[:2] != me]
  mine = [address for job, index, address in tasks if (job, index) == me]
  if not peers or not mine:
    return
  listener = _listen(int(mine[0].rpartition(":")[2]))
  try:
    deadline = time.monotonic() + timeout
    echo(f"waiting up to {timeout:g} s (--cluster_timeout) for "
         f"{len(peers)} other task(s) of TF_CONFIG to start")
    while True:
      missing = [t for t in peers if not _answers(t[2])]
      if not missing:
        return
      if time.monotonic() > deadline:
        names = ", ".join(f"{job} {index} ({address})"
                          for job, index, address in missing)
        raise errors.ConfigError(
            f"the multi_worker_mirrored cluster did not form within "
            f"{timeout:g} s (--cluster_timeout): start the same command on "
            f"every task of TF_CONFIG, each with its own task index; no "
            f"answer from {names}")
      time.sleep(_POLL_SECONDS)
  finally:
    listener.close()


def _multi_worker_mirrored(timeout, echo):
  """MultiWorkerMirroredStrategy once its peers are up (`_wait_for_peers`).

  A peer that stops between the meeting and TensorFlow's own would leave
  TensorFlow waiting forever, deaf to Python's signal handlers: during that
  call SIGTERM and SIGINT take their default action and end the process
  (nothing has been written yet).
  """
  _wait_for_peers(timeout, echo)
  signals = (signal.SIGTERM, signal.SIGINT)
  previous = {s: signal.signal(s, signal.SIG_DFL) for s in signals}
  try:
    return tf.distribute.MultiWorkerMirroredStrategy()
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


@functools.cache
def _mirrored():
  """The process's one MirroredStrategy over its local devices. Two of them
  number their collectives alike, so a second run in the same process (a
  study's next arm, a notebook's next cell) on a second strategy aborts with
  "Shape mismatch in the collective instance"; one reused trains both."""
  return tf.distribute.MirroredStrategy()


def create_strategy(name, tpu=None, timeout=600.0, echo=logging.info):
  """The tf.distribute strategy NAME (see configs.STRATEGIES).

  `multi_worker_mirrored` and `parameter_server` read the cluster from
  TF_CONFIG (a multi-worker cluster must form within TIMEOUT seconds; ECHO
  says that it is waiting);
  `tpu` connects to TPU (a name or grpc:// address; None or "" means the
  local TPU or the one in the environment). Raises ValueError with the fix
  when the environment does not fit.
  """
  check_tf_config(name, echo)
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return _mirrored()
  if name == "multi_worker_mirrored":
    return _multi_worker_mirrored(timeout, echo)
  if name == "tpu":
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
          tpu=tpu or "")
      tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
      raise errors.ConfigError(
          f"--strategy=tpu found no TPU ({str(e).splitlines()[0]}); pass "
          f"--tpu=NAME_OR_GRPC_ADDRESS or run on a TPU VM") from None
    return tf.distribute.TPUStrategy(resolver)
  if name == "parameter_server":
    resolver = _resolver()
    cluster = resolver.cluster_spec().as_dict()
    if not cluster.get("ps") or not cluster.get("worker"):
      raise errors.ConfigError(
          "--strategy=parameter_server needs TF_CONFIG with a cluster of "
          "'chief', 'worker' and 'ps' tasks (see docs/training.md); got "
          f"TF_CONFIG={os.environ.get('TF_CONFIG')!r}")
    return tf.distribute.experimental.ParameterServerStrategy(resolver)
  raise errors.ConfigError(f"--strategy must be one of "
                           f"{', '.join(configs.STRATEGIES)}; got {name!r}")


def describe_failure(error, cluster=True):
  """One line for a tf.errors.OpError that ends training, mostly a peer of a
  multi-worker run that stopped: TF's text starts with "Graph execution
  error:" and a stack, the cause and the peer are further down. CLUSTER:
  whether the run has workers to restart (its strategy is one of
  CLUSTER_STRATEGIES); a run in one process is told what fits it (for
  memory it ran out of: a smaller batch or network)."""
  text = str(error)
  cause = re.search(r"(?:aborted by|Cancelled|UNAVAILABLE): *([^\n]+)", text)
  peer = re.search(r"remote target /job:(\w+)/replica:\d+/task:(\d+)", text)
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  what = cause.group(1) if cause else (lines[0] if lines else "")
  where = f" (from {peer.group(1)} {peer.group(2)})" if peer else ""
  if len(what) > 200:
    # The middle goes: a path's end names the file, a message's end often
    # says what was wrong with it.
    what = f"{what[:90]} ... {what[-105:]}"
  if cluster:
    advice = ("if a worker of the cluster stopped, run the same command on "
              "every worker to resume from the latest checkpoint")
  elif isinstance(error, tf.errors.ResourceExhaustedError):
    advice = ("the run needs more memory than this machine has: lower "
              "--batch_size or --width (a new --model_dir for --width)")
  else:
    advice = "run the same command to resume from the latest checkpoint"
  return f"training stopped: {type(error).__name__}: {what}{where}; {advice}"


# -----------------------------------------------------------------------------
# The hardware a precision is meant for.

def precision_note(precision, device_types=None, cpu_flags=None):
  """A line warning that PRECISION is slow on this machine, or None.

  DEVICE_TYPES: of this process's logical devices (default: TensorFlow's
  list); with a GPU or TPU among them the 16-bit precisions are what they
  are for. On CPUs only, mixed_bfloat16 is emulated where none of
  BF16_CPU_FLAGS is among CPU_FLAGS (default: this machine's) -- measured
  8x slower than float32 on an AVX2-only EPYC, BENCHMARKS.md -- and
  mixed_float16 has no fast path on any CPU. Neither is refused: the
  result is the same, only slower.
  """
  if precision == "float32":
    return None
  if device_types is None:
    device_types = machine.logical_device_types()
  if set(device_types) & {"GPU", "TPU"}:
    return None
  if precision == "mixed_float16":
    return ("note: --precision=mixed_float16 is for GPUs: on a CPU it runs "
            "slower than float32 (BENCHMARKS.md)")
  if cpu_flags is None:
    cpu_flags = machine.cpu_model_and_flags()[1]
  if set(machine.BF16_CPU_FLAGS) & set(cpu_flags):
    return None
  return (f"note: this CPU has no bfloat16 instructions (none of "
          f"{', '.join(machine.BF16_CPU_FLAGS)} in /proc/cpuinfo): "
          f"--precision=mixed_bfloat16 is emulated, several times slower "
          f"than float32 here (BENCHMARKS.md); --precision=float32 is faster "
          f"on this machine")
