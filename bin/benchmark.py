"""Benchmarks, side by side: identity_tf against PyTorch and the machine's peak.

    bazel run //bin:benchmark -- --suite=train_step [--json=FILE]
    bazel run //bin:benchmark -- --suite=bf16
    bazel run //bin:benchmark -- --suite=input_pipeline
    bazel run //bin:benchmark -- --suite=linear   [--plot=linear.png]
    bazel run //bin:benchmark -- --suite=construct [--plot=construct.png]

train_step: images/s of identity_tf's training step (the one //bin:train
  runs, tf.distribute strategy included) on Table 1's CIFAR network against
  the same network in plain PyTorch, alternating in one process, and the
  step's FLOP/s against the float32 SGEMM peak measured in the same run.
bf16: the same step under Keras's mixed_bfloat16 policy against float32, and
  the accuracy of the smoke preset trained both ways.
input_pipeline: the CIFAR training pipeline (augmentation included) against
  the step's consumption.
linear / construct: time of the Section 2 and Section 3 code against the
  number of layers l, the dimension d and the number of points n, with a PNG.

The human summary (stdout) prints the ratios first; progress goes to stderr;
--json=FILE writes every figure with the load average at which it was taken.
PyTorch is optional (pip install -r requirements-benchmark.txt); without it
the suites say so and report identity_tf's figures alone. BENCHMARKS.md has
the measured figures.
"""

import json
import os
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

from identity_tf import paths

SUITES = ("train_step", "bf16", "input_pipeline", "linear", "construct")
# What the train_step and bf16 suites time (recorded in the JSON).
STEP = "identity_tf.train.make_train_step (the step train.train runs)"
FLAGS = flags.FLAGS

flags.DEFINE_string("suite", None, f"What to measure: {', '.join(SUITES)}.")
flags.DEFINE_string("json", None, "Write every figure to this JSON file.")
# The training step.
flags.DEFINE_string("model", "cifar10", "train_step/bf16/input_pipeline: "
                    "the network (cifar10 or cifar100: Table 1).")
flags.DEFINE_float("width", 1.0, "Width multiplier (1.0 = the paper's).")
flags.DEFINE_integer("units", None, "Residual units per stage (default: "
                     "Table 1's 9).")
flags.DEFINE_integer("batch_size", 128, "Global batch size of the step.")
flags.DEFINE_integer("steps", 1, "Training steps per timed repeat.")
flags.DEFINE_integer("repeats", 5, "Timed repeats of each contender, "
                     "alternating, after one warm-up repeat.")
flags.DEFINE_string("strategy", "default", "identity_tf's tf.distribute "
                    "strategy for the step (as --strategy of //bin:train).")
flags.DEFINE_string("tpu", None, "--strategy=tpu: TPU name or grpc:// "
                    "address (default: the local TPU).")
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
flags.DEFINE_integer("smoke_steps", 500, "bf16: steps of the smoke-preset "
                     "runs whose accuracy is compared (0: skip them).")
# Input pipeline.
flags.DEFINE_string("dataset", "synthetic", "input_pipeline: synthetic, "
                    "cifar10 or cifar100 (prepared in --data_dir).")
flags.DEFINE_string("data_dir", None, "TFDS data directory.")
flags.DEFINE_integer("batches", 100, "input_pipeline: batches per timed "
                     "repeat.")
# Theory.
flags.DEFINE_list("layers", ["100", "200", "400", "800", "1600"],
                  "linear: values of l (at --d).")
flags.DEFINE_list("dims", ["32", "64", "128", "256"],
                  "linear: values of d (at --l); construct: values of d (at "
                  "--n).")
flags.DEFINE_integer("d", 64, "linear: d while l varies; construct: d while "
                     "n varies.")
flags.DEFINE_integer("l", 100, "linear: l while d varies.")
flags.DEFINE_list("points", ["1000", "2000", "4000", "8000", "16000"],
                  "construct: values of n (at --d).")
flags.DEFINE_integer("n", 4000, "construct: n while d varies.")
flags.DEFINE_string("plot", None, "linear/construct: the PNG of time against "
                    "size (default: benchmark_<suite>.png; '' for none).")


def log(message):
  print(message, file=sys.stderr, flush=True)


def _ints(name, minimum=1):
  try:
    values = [int(v) for v in FLAGS[name].value]
  except ValueError:
    raise SystemExit(f"error: --{name} must be comma-separated integers, got "
                     f"{','.join(FLAGS[name].value)}") from None
  if not values or min(values) < minimum:
    raise SystemExit(f"error: --{name} needs integers >= {minimum}, got "
                     f"{','.join(map(str, values))}")
  return values


def _check_flags():
  """Every bad flag as one line, before TensorFlow loads."""
  if FLAGS.suite not in SUITES:
    given = "is required" if FLAGS.suite is None else (
        f"got {FLAGS.suite!r}")
    raise SystemExit(f"error: --suite {given}; pass one of "
                     f"{', '.join(SUITES)} (e.g. --suite=train_step)")
  for name in ("batch_size", "steps", "repeats", "sgemm_size",
               "sgemm_repeats", "batches"):
    if FLAGS[name].value < 1:
      raise SystemExit(f"error: --{name} must be >= 1, got "
                       f"{FLAGS[name].value}")
  if FLAGS.width <= 0:
    raise SystemExit(f"error: --width must be positive, got {FLAGS.width}")
  if FLAGS.model not in ("cifar10", "cifar100"):
    raise SystemExit(f"error: --model must be cifar10 or cifar100 (Table 1), "
                     f"got {FLAGS.model}")
  if FLAGS.strategy == "parameter_server":
    raise SystemExit("error: --strategy=parameter_server is not supported "
                     "here (its steps run on remote workers, scheduled by a "
                     "coordinator); use default, mirrored, "
                     "multi_worker_mirrored or tpu")
  if FLAGS.smoke_steps < 0:
    raise SystemExit(f"error: --smoke_steps must be >= 0, got "
                     f"{FLAGS.smoke_steps}")
  bad = [f for f in FLAGS.torch_memory_formats
         if f not in ("contiguous", "channels_last")]
  if bad or not FLAGS.torch_memory_formats:
    raise SystemExit(f"error: --torch_memory_formats takes contiguous and/or "
                     f"channels_last, got "
                     f"{','.join(FLAGS.torch_memory_formats)}")
  if FLAGS.json:
    directory = os.path.dirname(paths.resolve_path(FLAGS.json))
    if not os.path.isdir(directory):
      raise SystemExit(f"error: --json={FLAGS.json}: directory {directory} "
                       f"does not exist; create it or pick another path")


def _config(**overrides):
  from identity_tf import configs  # pylint: disable=g-import-not-at-top
  dataset = "synthetic" if FLAGS.model == "cifar10" else "cifar100"
  units = None if FLAGS.units is None else (FLAGS.units,)
  try:
    return configs.resolve(
        "cifar10_paper", model=FLAGS.model, dataset=dataset, width=FLAGS.width,
        units=units, batch_size=FLAGS.batch_size, strategy=FLAGS.strategy,
        **overrides)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None


def _model_options():
  options = {"width": FLAGS.width}
  if FLAGS.units is not None:
    options["units"] = FLAGS.units
  return options


# ---------------------------------------------------------------------------
# train_step and bf16: contenders timed in turn.

class Contender:
  """One way of running training steps, timed in alternation with others."""

  def __init__(self, name, run_steps, batch_size):
    self.name = name
    self.run_steps = run_steps      # run_steps(n) runs n steps.
    self.batch_size = batch_size
    self.seconds_per_step = []
    self.load = []

  def time_repeat(self, steps):
    from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
    seconds, _ = benchmarks.timed(lambda: self.run_steps(steps))
    self.seconds_per_step.append(seconds / steps)
    self.load.append(benchmarks.load_average())
    return self.batch_size * steps / seconds

  def figures(self):
    from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
    rates = [self.batch_size / s for s in self.seconds_per_step]
    return {"images_per_second": benchmarks.summarize(rates),
            "seconds_per_step": benchmarks.summarize(self.seconds_per_step),
            "load_average": self.load}


def alternate(contenders, steps, repeats):
  """Warm-up, then REPEATS rounds in which every contender runs STEPS."""
  for contender in contenders:
    log(f"warm-up: {contender.name} (tracing, first steps)")
    contender.run_steps(1)
  for repeat in range(repeats):
    for contender in contenders:
      rate = contender.time_repeat(steps)
      log(f"repeat {repeat + 1}/{repeats}: {contender.name} {rate:.2f} "
          f"images/s (load {contender.load[-1]})")


def speedup(faster, slower):
  """Per-repeat ratios of FASTER's images/s to SLOWER's: median and range."""
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  ratios = [(faster.batch_size / fast) / (slower.batch_size / slow)
            for fast, slow in zip(faster.seconds_per_step,
                                  slower.seconds_per_step)]
  return benchmarks.summarize(ratios)


def tf_contender(name, config, images, labels):
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  try:
    run, model = benchmarks.make_train_step(config, images, labels,
                                            tpu=FLAGS.tpu)
  except ValueError as e:  # E.g. --strategy=tpu without a TPU.
    raise SystemExit(f"error: {e}") from None
  return Contender(name, run, config.batch_size), model


def torch_contenders(keras_model, config, images, labels):
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  contenders = []
  for memory_format in FLAGS.torch_memory_formats:
    channels_last = memory_format == "channels_last"
    _, step, _ = benchmarks.torch_reference(
        keras_model, learning_rate=config.learning_rate,
        momentum=config.momentum, weight_decay=config.weight_decay,
        channels_last=channels_last,
        threads=FLAGS.torch_threads or os.cpu_count())
    x, y = benchmarks.torch_batch(images, labels, channels_last)

    def run(steps, step=step, x=x, y=y):
      for _ in range(steps):
        step(x, y)
    contenders.append(Contender(f"pytorch ({memory_format})", run,
                                config.batch_size))
  return contenders


def train_step_suite():
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  config = _config()
  shapes = benchmarks.conv_shapes(FLAGS.model, **_model_options())
  flops = benchmarks.train_flops_per_image(shapes)
  torch, why_not = benchmarks.import_torch()
  if not FLAGS.torch:
    torch, why_not = None, "PyTorch left out (--notorch)"
  if torch is None:
    log(why_not)
  log("SGEMM peak (before)")
  peaks = [benchmarks.sgemm_peak(FLAGS.sgemm_size, FLAGS.sgemm_repeats,
                                 use_torch=torch is not None, log=log)]
  images, labels = benchmarks.fixed_batch(config.batch_size)
  ours, keras_model = tf_contender("identity_tf", config, images, labels)
  contenders = [ours]
  if torch is not None:
    contenders += torch_contenders(keras_model, config, images, labels)
  alternate(contenders, FLAGS.steps, FLAGS.repeats)
  log("SGEMM peak (after)")
  peaks.append(benchmarks.sgemm_peak(FLAGS.sgemm_size, FLAGS.sgemm_repeats,
                                     use_torch=torch is not None, log=log))
  peak = max(p["best"] for p in peaks)
  results = {
      "network": {"model": FLAGS.model, **_model_options(),
                  "batch_size": config.batch_size,
                  "strategy": config.strategy},
      "step": STEP,
      "flops_per_image": flops,
      "sgemm": {"measurements": peaks, "peak_flops": peak},
      "contenders": {c.name: c.figures() for c in contenders},
      "pytorch": None if torch is not None else why_not,
  }
  ours_rate = results["contenders"]["identity_tf"]["images_per_second"]
  achieved = ours_rate["median"] * flops["train_flops"]
  results["identity_tf_flops"] = {
      "median": achieved,
      "min": ours_rate["min"] * flops["train_flops"],
      "max": ours_rate["max"] * flops["train_flops"],
      "fraction_of_sgemm_peak": achieved / peak,
      # Like for like with the SGEMM figure, itself the best of its runs.
      "best_repeat_fraction_of_sgemm_peak":
          ours_rate["max"] * flops["train_flops"] / peak}
  lines = []
  if torch is not None:
    best = max(contenders[1:], key=lambda c: c.figures()[
        "images_per_second"]["median"])
    versus = speedup(ours, best)
    results["ratio_vs_pytorch"] = {"against": best.name, **versus}
    results["ratios_vs_each_pytorch"] = {c.name: speedup(ours, c)
                                         for c in contenders[1:]}
    lines.append(f"identity_tf / PyTorch ({best.name}): {versus['median']:.2f}x"
                 f" images/s (per-repeat range {versus['min']:.2f}-"
                 f"{versus['max']:.2f}; target >= 1.0)")
  else:
    lines.append(f"identity_tf / PyTorch: not measured: {why_not}")
  ours_flops = results["identity_tf_flops"]
  lines.append(
      f"identity_tf FLOP/s / SGEMM peak: "
      f"{ours_flops['fraction_of_sgemm_peak']:.0%} at the median repeat, "
      f"{ours_flops['best_repeat_fraction_of_sgemm_peak']:.0%} at the best "
      f"({achieved / 1e9:.1f} and {ours_flops['max'] / 1e9:.1f} of "
      f"{peak / 1e9:.1f} GFLOP/s, the best SGEMM; target >= 85%)")
  lines.append("")
  for contender in contenders:
    figure = contender.figures()["images_per_second"]
    lines.append(f"{contender.name}: {figure['median']:.2f} images/s median "
                 f"(min {figure['min']:.2f}, max {figure['max']:.2f}, "
                 f"{figure['n']} repeats of {FLAGS.steps} step(s))")
  for p in peaks:
    by_library = ", ".join(f"{k} {p[k] / 1e9:.1f}" for k in
                           ("tensorflow", "numpy", "torch") if k in p)
    lines.append(f"SGEMM {p['size']}x{p['size']} GFLOP/s: {by_library} "
                 f"(load {p['load_average']})")
  lines.append(
      f"FLOPs per image: {flops['train_flops'] / 1e9:.3f} G = forward "
      f"{flops['forward_flops'] / 1e9:.3f} G (2 x {flops['forward_macs']:,} "
      f"MACs of {flops['convolutions']} convolutions) + backward "
      f"{flops['backward_flops'] / 1e9:.3f} G (kernel and input gradients, "
      f"no input gradient for the first convolution); elementwise work not "
      f"counted (<= {flops['other_flops_estimate'] / 1e9:.3f} G)")
  return results, lines


def _smoke_accuracy(policy, steps):
  """Evaluation top-1 and loss of the smoke preset trained under POLICY."""
  import keras  # pylint: disable=g-import-not-at-top
  from identity_tf import configs  # pylint: disable=g-import-not-at-top
  from identity_tf import train  # pylint: disable=g-import-not-at-top
  config = configs.resolve("smoke", train_steps=steps,
                           checkpoint_steps=steps)
  keras.mixed_precision.set_global_policy(policy)
  try:
    with tempfile.TemporaryDirectory() as model_dir:
      result = train.train(config, model_dir,
                           echo=lambda line: log(f"smoke {policy}: {line}"))
  finally:
    keras.mixed_precision.set_global_policy("float32")
  return {"top1": result["eval"]["top1"], "loss": result["eval"]["loss"],
          "train_loss": result["train_loss"], "steps": steps,
          "examples": result["eval"]["examples"]}


def bf16_suite():
  import keras  # pylint: disable=g-import-not-at-top
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  config = _config()
  images, labels = benchmarks.fixed_batch(config.batch_size)
  contenders = []
  for policy in ("float32", "mixed_bfloat16"):
    keras.mixed_precision.set_global_policy(policy)
    try:
      contender, _ = tf_contender(policy, config, images, labels)
    finally:
      keras.mixed_precision.set_global_policy("float32")
    contenders.append(contender)
  alternate(contenders, FLAGS.steps, FLAGS.repeats)
  bf16_speedup = speedup(contenders[1], contenders[0])
  results = {"network": {"model": FLAGS.model, **_model_options(),
                         "batch_size": config.batch_size},
             "step": STEP,
             "contenders": {c.name: c.figures() for c in contenders},
             "speedup_bf16_over_float32": bf16_speedup}
  lines = [f"mixed_bfloat16 / float32: {bf16_speedup['median']:.2f}x images/s"
           f" (per-repeat range {bf16_speedup['min']:.2f}-"
           f"{bf16_speedup['max']:.2f}; "
           f"target >= 1.3)"]
  if FLAGS.smoke_steps:
    smoke = {}
    for policy in ("float32", "mixed_bfloat16"):
      log(f"smoke preset, {FLAGS.smoke_steps} steps, {policy}")
      smoke[policy] = _smoke_accuracy(policy, FLAGS.smoke_steps)
    results["smoke_accuracy"] = smoke
    cost = smoke["float32"]["top1"] - smoke["mixed_bfloat16"]["top1"]
    results["smoke_top1_cost"] = cost
    lines.append(
        f"smoke preset ({FLAGS.smoke_steps} steps) evaluation top-1: float32 "
        f"{smoke['float32']['top1']:.4f}, mixed_bfloat16 "
        f"{smoke['mixed_bfloat16']['top1']:.4f} (cost {cost:+.4f}); loss "
        f"{smoke['float32']['loss']:.4f} vs "
        f"{smoke['mixed_bfloat16']['loss']:.4f}")
  lines.append("")
  for contender in contenders:
    figure = contender.figures()["images_per_second"]
    lines.append(f"{contender.name}: {figure['median']:.2f} images/s median "
                 f"(min {figure['min']:.2f}, max {figure['max']:.2f})")
  return results, lines


# ---------------------------------------------------------------------------
# input_pipeline.

def input_pipeline_suite():
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  from identity_tf import input_pipeline  # pylint: disable=g-import-not-at-top
  config = _config()
  batch = config.batch_size
  try:
    info = input_pipeline.dataset_info(FLAGS.dataset, FLAGS.data_dir)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  pipelines = {}
  for deterministic in (False, True):
    try:
      dataset = input_pipeline.build_dataset(
          FLAGS.dataset, info.train_split, batch, training=True,
          data_dir=FLAGS.data_dir, deterministic=deterministic)
    except ValueError as e:
      raise SystemExit(f"error: {e}") from None
    iterator = iter(dataset)

    def run(batches, iterator=iterator):
      for _ in range(batches):
        next(iterator)
    pipelines[deterministic] = Contender(
        f"pipeline deterministic={deterministic}", run, batch)
    run(10)  # Fills the prefetch buffer and the parallel map.
  images, labels = benchmarks.fixed_batch(batch)
  step, _ = tf_contender("identity_tf step", config, images, labels)
  contenders = [pipelines[False], pipelines[True], step]
  for contender in contenders[:2]:
    contender.run_steps(FLAGS.batches)
  step.run_steps(1)
  for repeat in range(FLAGS.repeats):
    for contender in contenders:
      count = FLAGS.steps if contender is step else FLAGS.batches
      rate = contender.time_repeat(count)
      log(f"repeat {repeat + 1}/{FLAGS.repeats}: {contender.name} "
          f"{rate:.1f} images/s (load {contender.load[-1]})")
  figures = {c.name: c.figures() for c in contenders}
  step_rate = figures[step.name]["images_per_second"]["median"]
  headroom = {c.name: speedup(c, step) for c in contenders[:2]}
  # The training run's setting (configs.Config.deterministic, default off).
  used = pipelines[config.deterministic].name
  results = {"dataset": FLAGS.dataset, "batch_size": batch,
             "network": {"model": FLAGS.model, **_model_options()},
             "contenders": figures, "pipeline_over_step": headroom,
             "training_uses": used}
  lines = [f"input pipeline / step consumption ({name}): "
           f"{h['median']:.0f}x (range {h['min']:.0f}-{h['max']:.0f}; target "
           f">= 20x)" for name, h in headroom.items()]
  lines.append("")
  for contender in contenders:
    figure = figures[contender.name]["images_per_second"]
    lines.append(f"{contender.name}: {figure['median']:.1f} images/s median "
                 f"(min {figure['min']:.1f}, max {figure['max']:.1f})")
  lines.append(f"(training uses {used}; the step is {FLAGS.model} width "
               f"{FLAGS.width} at batch {batch}: {step_rate:.2f} images/s)")
  return results, lines


# ---------------------------------------------------------------------------
# linear and construct: time against size.

def _scaling(sizes, seconds):
  """The exponent p of seconds ~ size^p (least squares in log-log)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  if len(sizes) < 2:
    return None
  return float(np.polyfit(np.log(sizes), np.log(np.maximum(seconds, 1e-9)),
                          1)[0])


def _sweep(name, label, sizes, run_once):
  """min and all times of FLAGS.repeats runs of run_once(size) per size."""
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  run_once(sizes[0])  # Warm-up: kernels, tf.function traces.
  rows = []
  for size in sizes:
    times = [run_once(size) for _ in range(FLAGS.repeats)]
    rows.append({"size": size, **benchmarks.summarize(times),
                 "load_average": benchmarks.load_average()})
    log(f"{name}: {label} = {size}: min {min(times):.4f} s")
  exponent = _scaling(sizes, [r["min"] for r in rows])
  return {"variable": label, "rows": rows, "exponent": exponent}


def _plot(panels, path, title):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, axes = pyplot.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
  axes = axes if len(panels) > 1 else [axes]
  for axis, (xlabel, curves) in zip(axes, panels):
    for name, sweep in curves:
      sizes = [r["size"] for r in sweep["rows"]]
      axis.loglog(sizes, [r["min"] for r in sweep["rows"]], "o-",
                  label=f"{name} (~{sweep['variable']}^"
                        f"{sweep['exponent']:.2f})")
    axis.set_xlabel(xlabel)
    axis.set_ylabel("seconds (min of repeats)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


def _plot_path():
  path = FLAGS.plot
  if path is None:
    path = f"benchmark_{FLAGS.suite}.png"
  return paths.resolve_path(path) if path else None


def _sweep_lines(sweeps, expectation):
  """Summary of scaling sweeps: fitted exponents, EXPECTATION, then times."""
  lines = [f"{name}: time ~ {s['variable']}^{s['exponent']:.2f}"
           for name, s in sweeps.items()]
  lines += [expectation, ""]
  for name, sweep in sweeps.items():
    lines.append(f"{name}: " + ", ".join(
        f"{sweep['variable']}={r['size']}: {r['min']:.4f} s"
        for r in sweep["rows"]))
  return lines


def linear_suite():
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from identity_tf import linear_theory as lt
  # pylint: enable=g-import-not-at-top
  layer_sizes, dims = _ints("layers"), _ints("dims")
  if FLAGS.d < 1 or FLAGS.l < 1:
    raise SystemExit("error: --d and --l must be >= 1")
  rng = np.random.default_rng(0)
  problems = {}

  def problem(d):
    if d not in problems:
      problems[d] = (lt.random_target(d, rng, 1.0),
                     lt.random_covariance(d, rng, 0.5, 2.0))
    return problems[d]

  def construct_time(layers, d):
    r, _ = problem(d)
    try:
      return benchmarks.timed(lambda: lt.construct(r, layers).numpy())[0]
    except ValueError as e:
      raise SystemExit(f"error: construct(l={layers}, d={d}): {e}; use larger "
                       f"--layers/--l") from None

  def gradient_time(layers, d):
    r, sigma = problem(d)
    a = tf.constant(lt.random_layers(layers, d, rng, 0.5 / layers))
    return benchmarks.timed(lambda: lt.risk_gradient(a, r, sigma).numpy())[0]

  sweeps = {
      "construct_vs_l": _sweep("construct_vs_l", "l", layer_sizes,
                               lambda l: construct_time(l, FLAGS.d)),
      "gradient_vs_l": _sweep("gradient_vs_l", "l", layer_sizes,
                              lambda l: gradient_time(l, FLAGS.d)),
      "construct_vs_d": _sweep("construct_vs_d", "d", dims,
                               lambda d: construct_time(FLAGS.l, d)),
      "gradient_vs_d": _sweep("gradient_vs_d", "d", dims,
                              lambda d: gradient_time(FLAGS.l, d)),
  }
  path = _plot_path()
  if path:
    _plot([(f"l (d = {FLAGS.d})",
            [("construct (Thm 2.1)", sweeps["construct_vs_l"]),
             ("gradient (Lemma 2.4)", sweeps["gradient_vs_l"])]),
           (f"d (l = {FLAGS.l})",
            [("construct (Thm 2.1)", sweeps["construct_vs_d"]),
             ("gradient (Lemma 2.4)", sweeps["gradient_vs_d"])])],
          path, "Section 2: linear residual networks")
    log(f"wrote {path}")
  results = {"sweeps": sweeps, "plot": path, "d": FLAGS.d, "l": FLAGS.l}
  return results, _sweep_lines(
      sweeps, "(expected: gradient O(l d^3); construct O(d^3) + O(l d^2) "
      "output)")


def construct_suite():
  import numpy as np  # pylint: disable=g-import-not-at-top
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  from identity_tf import construction  # pylint: disable=g-import-not-at-top
  points, dims = _ints("points", 2), _ints("dims")
  if FLAGS.d < 1 or FLAGS.n < 2:
    raise SystemExit("error: construct needs --d >= 1 and --n >= 2")
  details = {}

  def data(n, d):
    rng = np.random.default_rng(n * 1000 + d)
    return rng.standard_normal((n, d)), rng.integers(0, 10, n)

  def build(n, d, what):
    x, y = data(n, d)
    seconds, built = benchmarks.timed(lambda: construction.construct(
        x, y, num_classes=10))
    if what == "verify":
      seconds, accuracy = benchmarks.timed(
          lambda: construction.accuracy(built.weights, x, y))
      details[(n, d)] = {"k": built.k, "units": built.num_units,
                         "parameters": construction.count_parameters(
                             built.weights), "accuracy": accuracy}
    return seconds

  sweeps = {
      "construct_vs_n": _sweep("construct_vs_n", "n", points,
                               lambda n: build(n, FLAGS.d, "construct")),
      "verify_vs_n": _sweep("verify_vs_n", "n", points,
                            lambda n: build(n, FLAGS.d, "verify")),
      "construct_vs_d": _sweep("construct_vs_d", "d", dims,
                               lambda d: build(FLAGS.n, d, "construct")),
      "verify_vs_d": _sweep("verify_vs_d", "d", dims,
                            lambda d: build(FLAGS.n, d, "verify")),
  }
  path = _plot_path()
  if path:
    _plot([(f"n (d = {FLAGS.d})",
            [("construct", sweeps["construct_vs_n"]),
             ("evaluate on all n points", sweeps["verify_vs_n"])]),
           (f"d (n = {FLAGS.n})",
            [("construct", sweeps["construct_vs_d"]),
             ("evaluate on all n points", sweeps["verify_vs_d"])])],
          path, "Section 3: the expressivity construction")
    log(f"wrote {path}")
  results = {"sweeps": sweeps, "plot": path, "d": FLAGS.d, "n": FLAGS.n,
             "networks": [{"n": n, "d": d, **v} for (n, d), v in
                          sorted(details.items())]}
  return results, _sweep_lines(
      sweeps, "(evaluation costs n * units * k MACs with units ~ n: ~n^2)")


SUITE_FUNCTIONS = {"train_step": train_step_suite, "bf16": bf16_suite,
                   "input_pipeline": input_pipeline_suite,
                   "linear": linear_suite, "construct": construct_suite}


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"error: unexpected arguments {' '.join(argv[1:])}; "
                     f"flags look like --suite=train_step")
  _check_flags()
  # TensorFlow logs every checkpoint write of the smoke runs at INFO.
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from identity_tf import benchmarks  # pylint: disable=g-import-not-at-top
  machine = benchmarks.machine_info()
  log(f"{FLAGS.suite} on {machine['cores']} cores ({machine['cpu']}), load "
      f"average {machine['load_average']}")
  results, lines = SUITE_FUNCTIONS[FLAGS.suite]()
  machine["load_average_end"] = benchmarks.load_average()
  report = {
      "suite": FLAGS.suite,
      "command": "bazel run //bin:benchmark -- " + " ".join(sys.argv[1:]),
      "machine": machine,
      "flags": {name: FLAGS[name].value for name in (
          "model", "width", "units", "batch_size", "steps", "repeats",
          "strategy", "torch_memory_formats", "torch_threads", "sgemm_size",
          "sgemm_repeats", "smoke_steps", "dataset", "batches", "layers",
          "dims", "d", "l", "points", "n")},
      "results": results,
      "summary": lines,
  }
  print(f"{FLAGS.suite}, {machine['date_utc']} UTC, {machine['cores']} "
        f"cores, load average {machine['load_average']} -> "
        f"{machine['load_average_end']}")
  for line in lines:
    print(line)
  if FLAGS.json:
    path = paths.resolve_path(FLAGS.json)
    with open(path, "w") as f:
      json.dump(report, f, indent=1, default=float)
      f.write("\n")
    log(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
