"""Benchmarks, side by side: identity_tf against PyTorch and the machine's peak.

    bazel run //bin:benchmark -- --suite=train_step [--json=FILE]
    bazel run //bin:benchmark -- --suite=linear [--plot=linear.png]

train_step: images/s of identity_tf's training step (the one //bin:train
  runs, tf.distribute strategy included) on Table 1's CIFAR network against
  the same network in plain PyTorch, alternating in one process, and the
  step's FLOP/s against the float32 SGEMM peak measured in the same run.
bf16: that step in mixed_bfloat16 against float32, its share of the
  bfloat16 matmul peak, and the smoke preset's accuracy trained both ways.
bf16_identity: how much of each residual branch survives x + branch in
  bfloat16, at initialisation or at each checkpoint of --model_dir.
input_pipeline: the training pipeline (augmentation included) against the
  step's consumption.
linear / construct: time of the Section 2 and Section 3 code against the
  number of layers l, the dimension d and the number of points n (--plot).

The summary (stdout) prints the ratios first; progress goes to stderr;
--json=FILE writes every figure with the load average it was taken at.
PyTorch is optional (pip install -r requirements-benchmark.txt): without it
the suites say so and report identity_tf's figures alone. BENCHMARKS.md has
the measured figures.
"""

import os

# TensorFlow's C++ log keeps to errors unless the user chose a level; set
# before anything imports TensorFlow (`cli.begin` also leaves out its
# start-up lines).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position

import sys

from absl import flags

from identity_tf.commands import cli
from identity_tf import configs
from identity_tf.bench import suites

FLAGS = flags.FLAGS
_ABSL_FLAGS = set(FLAGS)  # absl's own; the rest are what the suites read.

flags.DEFINE_enum("suite", None, list(suites.SUITES), "What to measure.")
flags.DEFINE_string("json", None, "Write every figure to this JSON file.")
_STEP = "train_step/bf16/input_pipeline: "  # Then //bin:train's help.
flags.DEFINE_enum("model", "cifar10", ["cifar10", "cifar100"],
                  _STEP + cli.config_help("model") + " Here Table 1's.")
flags.DEFINE_float("width", 1.0, _STEP + cli.config_help("width"))
flags.DEFINE_integer("units", None, _STEP + cli.config_help("units")
                     + " Here one for every stage.")
flags.DEFINE_integer("batch_size", 128, _STEP + cli.config_help("batch_size"))
flags.DEFINE_enum("precision", "float32", list(configs.PRECISIONS), "train_step"
                  " (bf16 times both): " + cli.config_help("precision"))
flags.DEFINE_boolean("jit_compile", False,
                     "train_step/bf16: " + cli.config_help("jit_compile"))
flags.DEFINE_integer("steps", 1, "Training steps per timed repeat.")
flags.DEFINE_integer("repeats", 5, "Timed repeats of each contender, "
                     "alternating, after one warm-up repeat.")
flags.DEFINE_enum("strategy", "default",
                  ["default", "mirrored", "multi_worker_mirrored", "tpu"],
                  _STEP + cli.config_help("strategy") + " Here synchronous.")
cli.define_tpu()
flags.DEFINE_list("torch_memory_formats", ["contiguous", "channels_last"],
                  "PyTorch layouts to time: contiguous (NCHW) and/or "
                  "channels_last (NHWC); the best one is the reference.")
flags.DEFINE_integer("torch_threads", None, "torch.set_num_threads (default: "
                     "all cores, as TensorFlow uses).")
flags.DEFINE_boolean("torch", True, "Include PyTorch if it is installed.")
flags.DEFINE_integer("sgemm_size", 4096, "Size of the square float32 "
                     "products that measure the SGEMM peak.")
flags.DEFINE_integer("sgemm_repeats", 3, "Products per library per "
                     "measurement (the best counts).")
# bf16.
flags.DEFINE_integer("loop_steps", 40, "bf16: steps of //bin:train's loop "
                     "(input pipeline included) timed in each precision, "
                     "after 10 of warm-up (0: skip).")
flags.DEFINE_integer("smoke_steps", 500, "bf16: steps of the smoke-preset "
                     "runs whose accuracy is compared (0: skip them).")
# Input pipeline.
cli.define_dataset("synthetic", "input_pipeline: the one read (synthetic, "
                   "cifar10 or cifar100), prepared in --data_dir.")
cli.define_data_dir()
cli.define_model_dir("bf16_identity: a freshly initialised --model; given, "
                     "every checkpoint of that run.")
flags.DEFINE_integer("batches", 100, "input_pipeline: batches per timed "
                     "repeat.")
# Theory.
flags.DEFINE_list("layers", ["100", "200", "400", "800", "1600"],
                  "linear: values of l (at --d).")
flags.DEFINE_list("dims", ["32", "64", "128", "256"], "linear: values of d (at "
                  "--l); construct: values of d (at --n).")
flags.DEFINE_integer("d", 64, "linear: d while l varies; construct: d while "
                     "n varies.")
flags.DEFINE_integer("l", 100, "linear: l while d varies.")
flags.DEFINE_list("points", ["1000", "2000", "4000", "8000", "16000"],
                  "construct: values of n (at --d).")
flags.DEFINE_integer("n", 4000, "construct: n while d varies.")
flags.DEFINE_string("plot", None, "linear/construct: the PNG of time against "
                    "size (default: benchmark_<suite>.png; '' for none).")
cli.check_at_least(1, "batch_size", "steps", "repeats", "sgemm_size",
                   "sgemm_repeats", "batches")
cli.check_at_least(0, "smoke_steps", "loop_steps")
flags.register_validator("width", lambda value: value > 0,
                         message="--width must be positive")
flags.register_validator(
    "torch_memory_formats",
    lambda value: value and set(value) <= {"contiguous", "channels_last"},
    message="--torch_memory_formats takes contiguous and/or channels_last")
flags.mark_flag_as_required("suite")
_OWN = set(FLAGS) - _ABSL_FLAGS
# --help lists the flags this binary takes from cli with its own.
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--suite=train_step")
  from identity_tf.commands import benchmark  # pylint: disable=g-import-not-at-top
  with cli.errors_as_exit():
    benchmark.benchmark_command({n: FLAGS[n].value for n in _OWN}, sys.argv[1:])


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
