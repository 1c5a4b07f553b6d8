"""Facts of the machine this process runs on: the cores it may use, the CPU
and its instruction flags, its memory and load, and its accelerators.

Read by the trainer (each session's start record in metrics.jsonl names its
hardware: `describe`), by `training.distribute` (whether a precision is
native here), by `theory.parallel` (how many threads) and by the benchmarks
(what every figure was measured on). Pure Python: TensorFlow is imported
only to list the accelerators, when they are asked for.
"""

import os

# CPU instructions that compute in bfloat16 natively: AVX512-BF16's dot
# products and AMX's tile multiplies. Without them TensorFlow converts to
# float32 and back around every operation.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def available_cores():
  """The cores this process may run on: its CPU affinity where the OS has one
  (a container or `taskset` may allow fewer than the machine has), else all
  the machine's."""
  try:
    return max(1, len(os.sched_getaffinity(0)))
  except AttributeError:  # No sched_getaffinity (macOS, Windows).
    return max(1, os.cpu_count() or 1)


def _cpuinfo(path):
  """The first processor's fields in PATH (a /proc/cpuinfo), {} if none."""
  fields = {}
  try:
    with open(path) as f:
      for line in f:
        if not line.strip():
          if fields:
            break
          continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
  except OSError:
    pass
  return fields


def cpu_model_and_flags(path="/proc/cpuinfo"):
  """(CPU model name, the set of its flags) from PATH; ("", set()) where
  there is no such file. The name carries the family and model numbers:
  "AMD EPYC" alone names a Zen 3 without AVX-512 and a Zen 4 with
  avx512_bf16, whose bfloat16 speeds differ tenfold (BENCHMARKS.md)."""
  fields = _cpuinfo(path)
  name = fields.get("model name", "")
  if name and "cpu family" in fields and "model" in fields:
    name += f" (family {fields['cpu family']} model {fields['model']})"
  return name, set(fields.get("flags", "").split())


def memory_bytes():
  """This machine's physical memory in bytes (None where unknown)."""
  try:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  except (ValueError, OSError, AttributeError):
    return None


def load_average():
  """The 1-minute load average (other work on the cores), or None."""
  try:
    return round(os.getloadavg()[0], 2)
  except OSError:
    return None


def logical_device_types():
  """The types of TensorFlow's logical devices ("CPU", "GPU", "TPU"), one
  entry per device (imports TensorFlow)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [device.device_type for device in tf.config.list_logical_devices()]


def describe(device_types=None, cpu=None, cores=None):
  """One line naming the hardware a run trains on: the CPU
  (`cpu_model_and_flags`, default this machine's), the cores this process
  may use, the CPU's bfloat16 instructions and any GPUs or TPUs
  (DEVICE_TYPES: of the logical devices, default TensorFlow's list).

  A run's images/s and time to accuracy are figures of this hardware, and a
  run that resumes elsewhere trains on two: each session's start record in
  metrics.jsonl carries this line, and //bin:study reports it per run.
  """
  name, flags = cpu if cpu is not None else cpu_model_and_flags()
  if cores is None:
    cores = available_cores()
  if device_types is None:
    device_types = logical_device_types()
  bf16 = ", ".join(flag for flag in sorted(BF16_CPU_FLAGS) if flag in flags)
  line = f"{name or 'unknown CPU'}, {cores} cores, bfloat16: {bf16 or 'none'}"
  for kind in ("GPU", "TPU"):
    count = list(device_types).count(kind)
    if count:
      line += f", {count} {kind}"
  return line
