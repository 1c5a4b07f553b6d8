"""Library code of bin/benchmark: FLOP counts, peaks, timing and references.

* `conv_shapes` / `train_flops_per_image`: the analytic FLOP count of one
  training step of a Table-1 network, derived from the architecture (not by
  profiling), so it can be checked against the model's kernels.
* `sgemm_peak`: the float32 matrix-multiply rate this machine reaches with
  TensorFlow, NumPy's BLAS and (if installed) PyTorch, measured in-process.
* `make_train_step`: identity_tf's distributed training step exactly as
  `trainer.train` runs it, fed from a fixed in-memory batch.
* `torch_reference`: the same network in plain PyTorch (CPU), with its own
  training step. PyTorch is an optional benchmark requirement
  (requirements-benchmark.txt): it is imported lazily inside the functions
  that need it, never by importing this module.
* `summarize`, `machine_info`: what every reported figure carries.
"""

import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

from identity_tf import architectures
from identity_tf import machine
from identity_tf import model as model_lib

# Sizes that make a float32 matrix product compute-bound on a CPU.
SGEMM_SIZE = 4096
# CPU flags that matter for the kernels measured here.
_INTERESTING_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl",
                      "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile",
                      "amx_int8")


# ---------------------------------------------------------------------------
# Where and when.

def cpu_model_and_flags():
  """(CPU model name, the relevant flags it has) from /proc/cpuinfo."""
  name, flags = machine.cpu_model_and_flags()
  return (name or platform.processor() or platform.machine(),
          [flag for flag in _INTERESTING_FLAGS if flag in flags])


def machine_info():
  """Date, machine and versions, for the JSON and BENCHMARKS.md."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  name, flags = cpu_model_and_flags()
  torch, _ = import_torch()
  return {
      "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
          "%Y-%m-%d %H:%M:%S"),
      "cpu": name,
      "cores": machine.available_cores(),
      "cpu_flags": flags,
      "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
      "python": sys.version.split()[0],
      "tensorflow": tf.__version__,
      "keras": keras.__version__,
      "numpy": np.__version__,
      "torch": torch.__version__ if torch else None,
      "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
      # 0 means TensorFlow's default: one thread per core for each.
      "tf_threads": {
          "intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
          "inter_op": tf.config.threading.get_inter_op_parallelism_threads()},
      "load_average": machine.load_average(),
  }


def import_torch():
  """(torch module, None) or (None, why it cannot be used)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return None, (f"PyTorch not installed ({e}); pip install -r "
                  f"requirements-benchmark.txt for the side-by-side figures")
  return torch, None


# ---------------------------------------------------------------------------
# Timing.

def summarize(values):
  """{"median", "min", "max", "n", "values"} of a list of numbers."""
  values = [float(v) for v in values]
  return {"median": statistics.median(values), "min": min(values),
          "max": max(values), "n": len(values),
          "values": [round(v, 6) for v in values]}


def timed(function):
  """(seconds, result) of one call of FUNCTION()."""
  start = time.perf_counter()
  result = function()
  return time.perf_counter() - start, result


# ---------------------------------------------------------------------------
# FLOPs.

def conv_shapes(name="cifar10", **options):
  """Every convolution of build_model(NAME, **OPTIONS) in the model's order.

  Derived from the architecture (model.MODELS), not from a built model: one
  dict per convolution with its kernel size k, input and output channels,
  stride, input and output spatial sizes ("same" padding: out = ceil(in /
  stride)) and MACs per image = out_h * out_w * k * k * c_in * c_out.
  """
  arch, opts = model_lib.complete_options(name, **options)
  scaled = model_lib._scaled  # pylint: disable=protected-access
  size, channels, shapes = opts.image_size, 3, []

  def add(label, k, c_out, stride):
    nonlocal size, channels
    out = -(-size // stride)
    shapes.append({"name": label, "k": k, "c_in": channels, "c_out": c_out,
                   "stride": stride, "in_size": size, "out_size": out,
                   "macs": out * out * k * k * channels * c_out})
    size, channels = out, c_out

  for label, k, c, stride in architectures.stem_plan(arch, opts):
    add(label, k, c, stride)
  for stage, (width, units, stride) in enumerate(
      zip(arch.widths, opts.units, arch.strides)):
    c = scaled(width, opts.width)
    for unit in range(units):
      label = f"stage{stage + 1}_unit{unit + 1}"
      add(label + "/conv1", 3, c, stride if unit == 0 else 1)
      add(label + "/conv2", 3, c, 1)
  return shapes


def train_flops_per_image(shapes):
  """FLOPs of one training step per image, convolutions only.

  Counted: forward 2 * MACs for every convolution (one multiply and one add
  per MAC); backward 2 * MACs for the kernel gradient of every convolution
  and 2 * MACs for the input gradient of every convolution except the first
  (its input, the images, needs no gradient; neither framework computes it).
  Not counted: ReLU, shortcut pooling and padding, additions, global pooling,
  the projection (d * classes MACs), the loss, weight decay and the SGD
  update -- each O(activations) or O(weights), together well under 1 % of
  the convolutions (`other_flops_estimate` bounds them).
  """
  forward_macs = sum(s["macs"] for s in shapes)
  first = shapes[0]["macs"]
  forward = 2 * forward_macs
  backward = 2 * forward_macs + 2 * (forward_macs - first)
  # Elementwise work per image, generously: ~10 FLOPs per activation element
  # (ReLU, add, shortcut, their gradients) plus the SGD update's ~6 FLOPs per
  # weight amortised over a batch of 1 (the worst case).
  activations = sum(s["out_size"] ** 2 * s["c_out"] for s in shapes)
  weights = sum(s["k"] ** 2 * s["c_in"] * s["c_out"] for s in shapes)
  return {"forward_macs": forward_macs, "forward_flops": forward,
          "backward_flops": backward, "train_flops": forward + backward,
          "first_conv_macs": first, "convolutions": len(shapes),
          "conv_weights": weights,
          "other_flops_estimate": 10 * activations + 6 * weights}


# ---------------------------------------------------------------------------
# The machine's SGEMM peak.

def sgemm_peak(size=SGEMM_SIZE, repeats=3, use_torch=True, log=None):
  """Best float32 matmul FLOP/s of SIZE x SIZE products, per library.

  Returns {"tensorflow": ..., "numpy": ..., "torch": ... (if installed and
  USE_TORCH), "best": the maximum, "size", "repeats"}; each library's figure
  is the best of REPEATS products after one warm-up (2 size^3 FLOPs each).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  log = log or (lambda message: None)
  flops = 2.0 * size ** 3
  rng = np.random.default_rng(0)
  a = rng.standard_normal((size, size), dtype=np.float32)
  b = rng.standard_normal((size, size), dtype=np.float32)
  result = {"size": size, "repeats": repeats}

  def best(function):
    function()
    return max(flops / timed(function)[0] for _ in range(repeats))

  ta, tb = tf.constant(a), tf.constant(b)
  # One element back to Python: the whole product is computed, nothing else.
  matmul = tf.function(lambda x, y: tf.matmul(x, y)[0, 0])
  result["tensorflow"] = best(lambda: matmul(ta, tb).numpy())
  log(f"sgemm tensorflow: {result['tensorflow'] / 1e9:.1f} GFLOP/s")
  result["numpy"] = best(lambda: a @ b)
  log(f"sgemm numpy: {result['numpy'] / 1e9:.1f} GFLOP/s")
  torch, _ = import_torch()
  if torch is not None and use_torch:
    xa, xb = torch.from_numpy(a), torch.from_numpy(b)
    result["torch"] = best(lambda: xa @ xb)
    log(f"sgemm torch: {result['torch'] / 1e9:.1f} GFLOP/s")
  result["best"] = max(v for k, v in result.items()
                       if k in ("tensorflow", "numpy", "torch"))
  result["load_average"] = machine.load_average()
  return result


def bf16_matmul_peak(size=SGEMM_SIZE, repeats=3, log=None):
  """Best bfloat16 `tf.matmul` FLOP/s of SIZE x SIZE products (float32
  accumulation, as mixed_bfloat16's convolutions use): the peak a
  mixed_bfloat16 step is measured against."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  a, b = (tf.constant(rng.standard_normal((size, size), dtype=np.float32),
                      dtype=tf.bfloat16) for _ in range(2))
  matmul = tf.function(lambda x, y: tf.matmul(x, y)[0, 0])
  matmul(a, b).numpy()
  flops = 2.0 * size ** 3
  best = max(flops / timed(lambda: matmul(a, b).numpy())[0]
             for _ in range(repeats))
  if log:
    log(f"bfloat16 matmul tensorflow: {best / 1e9:.1f} GFLOP/s")
  return {"size": size, "repeats": repeats, "tensorflow": best,
          "load_average": machine.load_average()}


def bf16_features(flags):
  """Which of the CPU's FLAGS (lscpu's) speed up bfloat16: AVX512-BF16's
  dot products and AMX's tile multiplies."""
  # amx_tile: the tile registers AMX's bfloat16 multiplies run on.
  return {name: name in flags
          for name in machine.BF16_CPU_FLAGS + ("amx_tile",)}


# ---------------------------------------------------------------------------
# identity_tf's training step.

def fixed_batch(batch_size, image_size=32, classes=10, seed=0):
  """A reproducible batch (float32 images, int32 labels) as NumPy arrays."""
  rng = np.random.default_rng(seed)
  images = rng.standard_normal((batch_size, image_size, image_size, 3))
  labels = rng.integers(0, classes, batch_size)
  return images.astype(np.float32), labels.astype(np.int32)


def make_train_step(config, images, labels, strategy=None, tpu=None):
  """identity_tf's training step for CONFIG, fed the batch (IMAGES, LABELS).

  The run's own `trainer.Trainer` -- the model, optimizer and step that
  `trainer.train`, and so //bin:train, runs -- with an input of the one
  batch repeated, so that no input pipeline competes for the cores (the
  `input_pipeline` suite measures it).
  Returns (run(num_steps) -> the sums over those steps of [per-example
  loss, correct predictions, examples], model).
  """
  # pylint: disable=g-import-not-at-top
  import tempfile
  import tensorflow as tf
  from identity_tf.data import tfds_data
  from identity_tf.training import distribute
  from identity_tf.training import run as run_lib
  from identity_tf.training import trainer as trainer_lib
  # pylint: enable=g-import-not-at-top
  strategy = strategy or distribute.create_strategy(config.strategy, tpu)
  # The classes of CONFIG's dataset; its data is not read. Nothing is
  # saved: the model_dir is a scratch directory.
  scratch = tempfile.TemporaryDirectory()
  run = run_lib.prepare(config, tfds_data.dataset_info(config.dataset),
                        scratch.name,
                        replicas=strategy.num_replicas_in_sync)

  def dataset_fn(input_context):
    per_replica = input_context.get_per_replica_batch_size(config.batch_size)
    return tf.data.Dataset.from_tensors(
        (images[:per_replica], labels[:per_replica])).repeat()

  trainer = trainer_lib.Trainer(run, strategy, dataset_fn=dataset_fn)
  trainer.restore(None)

  def run_steps(num_steps, scratch=scratch):  # Kept while RUN_STEPS lives.
    del scratch
    out = trainer.run_steps(num_steps)
    return np.array([out["loss_sum"], out["correct"], out["examples"]])
  return run_steps, trainer.model


# ---------------------------------------------------------------------------
# The same network in PyTorch.

def torch_reference(keras_model, learning_rate=0.05, momentum=0.9,
                    weight_decay=1e-4, channels_last=False, threads=None):
  """The Table-1 network of KERAS_MODEL in plain PyTorch, with its weights.

  Same layers in the same order: bias-free 3x3 convolutions with
  TensorFlow's "same" padding (for stride 2 on an even size: 0 before, 1
  after), units x + C2(ReLU(C1 x)) with the parameter-free shortcut (2x2
  average pooling, zero channels split evenly on both sides), global
  average pooling and the frozen projection (a buffer: never trained).
  Kernels are copied from KERAS_MODEL, so both networks compute the same
  function from the same start. The step: cross-entropy averaged over the
  batch plus weight_decay * sum ||W||^2 / 2 over the convolution kernels,
  torch.optim.SGD with MOMENTUM (the same update as Keras's SGD for a
  constant rate), and the same correct-prediction count the Keras step
  returns.

  Returns (module, step(images, labels) -> (loss, correct), optimizer).
  IMAGES are NumPy NHWC float32, converted once by `torch_batch`.
  """
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)
  network = _torch_network(keras_model)
  if channels_last:
    network = network.to(memory_format=torch.channels_last)
  network.train()
  step, optimizer = _torch_sgd_step(network, learning_rate, momentum,
                                    weight_decay)
  return network, step, optimizer


def _torch_modules():
  """(Unit, Network): the twin's PyTorch modules, defined once torch is
  imported (it is optional)."""
  # pylint: disable=g-import-not-at-top
  from torch import nn
  from torch.nn import functional
  # pylint: enable=g-import-not-at-top

  def same_conv(x, conv):
    # TensorFlow "same": total padding max((out-1)*s + k - in, 0), the odd
    # one after. PyTorch's symmetric `padding` would shift stride-2 windows.
    k, s = conv.kernel_size[0], conv.stride[0]
    size = x.shape[-1]
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    before = total // 2
    if total == 2 * before:
      return functional.conv2d(x, conv.weight, None, s, before)
    x = functional.pad(x, (before, total - before, before, total - before))
    return functional.conv2d(x, conv.weight, None, s, 0)

  class Unit(nn.Module):
    """x + C2(ReLU(C1 x)), the shortcut pooled and zero-padded."""

    def __init__(self, c_in, c_out, stride):
      super().__init__()
      self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, bias=False)
      self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, bias=False)
      self.c_out, self.stride = c_out, stride

    def forward(self, x):
      branch = same_conv(functional.relu(same_conv(x, self.conv1)), self.conv2)
      shortcut = x
      if self.stride > 1:
        shortcut = functional.avg_pool2d(shortcut, self.stride, self.stride)
      extra = self.c_out - x.shape[1]
      if extra:
        shortcut = functional.pad(
            shortcut, (0, 0, 0, 0, extra // 2, extra - extra // 2))
      return shortcut + branch

  class Network(nn.Module):
    """The stem, the units, global average pooling, the projection."""

    def __init__(self, stem, units, projection):
      super().__init__()
      self.stem = nn.ModuleList(stem)
      self.units = nn.ModuleList(units)
      self.register_buffer("projection", projection)

    def forward(self, x):
      for conv in self.stem:
        x = same_conv(x, conv)
      for unit in self.units:
        x = unit(x)
      return x.mean(dim=(2, 3)) @ self.projection

  return Unit, Network


def _torch_kernel(keras_kernel):
  """A Keras kernel (k, k, c_in, c_out) as PyTorch's (c_out, c_in, k, k)."""
  import torch  # pylint: disable=g-import-not-at-top
  return torch.from_numpy(keras_kernel.numpy().transpose(3, 2, 0, 1).copy())


def _torch_network(keras_model):
  """The twin of KERAS_MODEL, layer by layer, with its kernels copied."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top
  unit_class, network_class = _torch_modules()
  stem, units = [], []
  for layer in keras_model.layers:
    if layer.name.startswith("stem"):
      k, _, c_in, c_out = layer.kernel.shape
      conv = nn.Conv2d(c_in, c_out, k, layer.strides[0], bias=False)
      conv.weight.data = _torch_kernel(layer.kernel)
      stem.append(conv)
    elif hasattr(layer, "conv1") and hasattr(layer, "conv2"):
      unit = unit_class(layer.conv1.kernel.shape[2], layer.filters,
                        layer.strides)
      unit.conv1.weight.data = _torch_kernel(layer.conv1.kernel)
      unit.conv2.weight.data = _torch_kernel(layer.conv2.kernel)
      units.append(unit)
  projection = torch.from_numpy(
      keras_model.get_layer("projection").kernel.numpy().copy())
  return network_class(stem, units, projection)


def _torch_sgd_step(network, learning_rate, momentum, weight_decay):
  """(step(images, labels) -> (loss, correct), its optimizer): one SGD
  step of NETWORK on the loss of `torch_reference`."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch.nn import functional  # pylint: disable=g-import-not-at-top
  kernels = [p for p in network.parameters() if p.dim() == 4]
  optimizer = torch.optim.SGD(network.parameters(), lr=learning_rate,
                              momentum=momentum)

  def step(images, labels):
    optimizer.zero_grad(set_to_none=True)
    logits = network(images)
    loss = functional.cross_entropy(logits, labels)
    penalty = sum((w * w).sum() for w in kernels) * (weight_decay / 2)
    (loss + penalty).backward()
    optimizer.step()
    correct = (logits.argmax(-1) == labels).sum()
    return float(loss.detach()), int(correct)

  return step, optimizer


def torch_batch(images, labels, channels_last=False):
  """NHWC NumPy (IMAGES, LABELS) as PyTorch NCHW tensors (int64 labels)."""
  import torch  # pylint: disable=g-import-not-at-top
  x = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
  if channels_last:
    x = x.contiguous(memory_format=torch.channels_last)
  return x, torch.from_numpy(labels.astype(np.int64))

