"""Distribution: the tf.distribute strategy of a run and this process's role.

`create_strategy(name)` makes one of `configs.STRATEGIES`; the cluster
(`multi_worker_mirrored`, `parameter_server`) comes from TF_CONFIG, read by
TensorFlow's own `TFConfigClusterResolver`. `is_chief` says whether this
process writes the run directory, and `run_parameter_server_task` is what
worker and parameter-server processes of a `parameter_server` cluster do.
"""

import json
import os

from absl import logging
import tensorflow as tf

from identity_tf import configs


def _resolver():
  """TF_CONFIG's cluster resolver; ValueError (one line) if it is not JSON."""
  try:
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()
  except json.JSONDecodeError as e:
    raise ValueError(
        f"TF_CONFIG is not valid JSON ({e}); set it to "
        '{"cluster": {...}, "task": {"type": ..., "index": ...}} or unset it '
        "(docs/training.md, Strategies)") from None


def cluster_task():
  """(task type, task index) of this process from TF_CONFIG, or (None, 0)."""
  resolver = _resolver()
  return resolver.task_type, resolver.task_id or 0


def is_chief():
  """Whether this process writes model_dir: the chief, or worker 0 if none."""
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


def create_strategy(name, tpu=None):
  """The tf.distribute strategy NAME (see configs.STRATEGIES).

  `multi_worker_mirrored` and `parameter_server` read the cluster from
  TF_CONFIG; `tpu` connects to TPU (a name or grpc:// address; None or ""
  means the local TPU or the one in the environment). Raises ValueError
  with the fix when the environment does not fit.
  """
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy()
  if name == "multi_worker_mirrored":
    return tf.distribute.MultiWorkerMirroredStrategy()
  if name == "tpu":
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
          tpu=tpu or "")
      tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, tf.errors.OpError) as e:
      raise ValueError(
          f"--strategy=tpu found no TPU ({str(e).splitlines()[0]}); pass "
          f"--tpu=NAME_OR_GRPC_ADDRESS or run on a TPU VM") from None
    return tf.distribute.TPUStrategy(resolver)
  if name == "parameter_server":
    resolver = _resolver()
    cluster = resolver.cluster_spec().as_dict()
    if not cluster.get("ps") or not cluster.get("worker"):
      raise ValueError(
          "--strategy=parameter_server needs TF_CONFIG with a cluster of "
          "'chief', 'worker' and 'ps' tasks (see docs/training.md); got "
          f"TF_CONFIG={os.environ.get('TF_CONFIG')!r}")
    return tf.distribute.experimental.ParameterServerStrategy(resolver)
  raise ValueError(f"--strategy must be one of "
                   f"{', '.join(configs.STRATEGIES)}; got {name!r}")
