"""The suites of //bin:benchmark: what each measures and how.

`SUITES[name](options)` runs one suite and returns (results, summary
lines); OPTIONS carries the binary's flags as attributes (model, width,
units, batch_size, steps, repeats, strategy, ...; bin/benchmark.py lists
them) and `log`, the function that receives the progress lines. The
network a suite times, and its input, come from one `run.Run`
(`_run`), as //bin:train's do. The suites time identity_tf's own code --
`step.make_train_step`, the input pipeline, Sections 2 and 3 -- against
PyTorch and the machine's SGEMM peak where there is something to compare
with; `tools` holds the measuring tools they share.
"""

import tempfile

from identity_tf import errors
from identity_tf import machine

STEP = ("identity_tf.training.step.make_train_step (the step "
        "trainer.train runs)")


def _config(options, **overrides):
  """The `configs.Config` of the network and step OPTIONS name: --model at
  --width and --units with 10 (synthetic) or 100 (cifar100) classes,
  trained with the paper's step as written -- the PyTorch twin implements
  exactly that (the presets' gradient clipping adds one norm over the
  weights). OVERRIDES come last."""
  from identity_tf import configs  # pylint: disable=g-import-not-at-top
  return configs.from_preset("cifar10_paper_literal", **{
      "model": options.model,
      "dataset": "synthetic" if options.model == "cifar10" else "cifar100",
      "width": options.width,
      "units": None if options.units is None else (options.units,),
      "batch_size": options.batch_size, "strategy": options.strategy,
      "precision": options.precision, "jit_compile": options.jit_compile,
      **overrides})


def _run(options, **overrides):
  """The `run.Run` of `_config(OPTIONS, **OVERRIDES)`: the network's
  complete options and the input's preprocessing, as training derives
  them (its dataset's metadata only; nothing is read or written)."""
  # pylint: disable=g-import-not-at-top
  from identity_tf.data import tfds_data
  from identity_tf.training import run as run_lib
  # pylint: enable=g-import-not-at-top
  config = _config(options, **overrides)
  return run_lib.prepare(
      config, tfds_data.dataset_info(config.dataset, options.data_dir), None,
      options.data_dir)


def _network(options):
  """The network as the flags name it, for the JSON."""
  units = {} if options.units is None else {"units": options.units}
  return {"model": options.model, "width": options.width, **units}


def _flops(run):
  """`tools.train_flops_per_image` of RUN's network."""
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  return tools.train_flops_per_image(
      tools.conv_shapes(run.model_name, **run.model_options.to_dict()))


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
    from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
    seconds, _ = tools.timed(lambda: self.run_steps(steps))
    self.seconds_per_step.append(seconds / steps)
    self.load.append(machine.load_average())
    return self.batch_size * steps / seconds

  def figures(self):
    from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
    rates = [self.batch_size / s for s in self.seconds_per_step]
    return {"images_per_second": tools.summarize(rates),
            "seconds_per_step": tools.summarize(self.seconds_per_step),
            "load_average": self.load}


def alternate(contenders, steps, repeats, log):
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
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  ratios = [(faster.batch_size / fast) / (slower.batch_size / slow)
            for fast, slow in zip(faster.seconds_per_step,
                                  slower.seconds_per_step)]
  return tools.summarize(ratios)


def tf_contender(options, name, config, images, labels):
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  run, model = tools.make_train_step(config, images, labels,
                                     tpu=options.tpu)
  return Contender(name, run, config.batch_size), model


def torch_contenders(options, keras_model, config, images, labels):
  # pylint: disable=g-import-not-at-top
  from identity_tf.bench import tools
  # pylint: enable=g-import-not-at-top
  contenders = []
  for memory_format in options.torch_memory_formats:
    channels_last = memory_format == "channels_last"
    _, step, _ = tools.torch_reference(
        keras_model, learning_rate=config.learning_rate,
        momentum=config.momentum, weight_decay=config.weight_decay,
        channels_last=channels_last,
        threads=options.torch_threads or machine.available_cores())
    x, y = tools.torch_batch(images, labels, channels_last)

    def run(steps, step=step, x=x, y=y):
      for _ in range(steps):
        step(x, y)
    contenders.append(Contender(f"pytorch ({memory_format})", run,
                                config.batch_size))
  return contenders


def _torch(options):
  """(torch, None), or (None, why PyTorch is left out)."""
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  torch, why_not = tools.import_torch()
  if not options.torch:
    torch, why_not = None, "PyTorch left out (--notorch)"
  if torch is None:
    options.log(why_not)
  return torch, why_not


def _sgemm_peak(options, use_torch, when):
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  options.log(f"SGEMM peak ({when})")
  return tools.sgemm_peak(options.sgemm_size, options.sgemm_repeats,
                          use_torch=use_torch, log=options.log)


def train_step_suite(options):
  """identity_tf's step against PyTorch's twin and the SGEMM peak, measured
  before and after the contenders."""
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  run = _run(options)
  flops = _flops(run)
  torch, why_not = _torch(options)
  peaks = [_sgemm_peak(options, torch is not None, "before")]
  images, labels = tools.fixed_batch(run.config.batch_size)
  ours, keras_model = tf_contender(options, "identity_tf", run.config, images,
                                   labels)
  contenders = [ours]
  if torch is not None:
    contenders += torch_contenders(options, keras_model, run.config, images,
                                   labels)
  alternate(contenders, options.steps, options.repeats, options.log)
  peaks.append(_sgemm_peak(options, torch is not None, "after"))
  results = _train_step_results(options, run.config, flops, peaks,
                                contenders, why_not)
  return results, _train_step_lines(options, results, contenders)


def _train_step_results(options, config, flops, peaks, contenders, why_not):
  """The JSON of the train_step suite: the figures of CONTENDERS (ours
  first), identity_tf's FLOP/s against the best SGEMM of PEAKS and, if
  PyTorch ran, the ratios to its contenders."""
  peak = max(p["best"] for p in peaks)
  ours, theirs = contenders[0], contenders[1:]
  results = {
      "network": {**_network(options), "batch_size": config.batch_size,
                  "strategy": config.strategy},
      "step": STEP,
      "flops_per_image": flops,
      "sgemm": {"measurements": peaks, "peak_flops": peak},
      "contenders": {c.name: c.figures() for c in contenders},
      "pytorch": why_not,
  }
  ours_rate = results["contenders"][ours.name]["images_per_second"]
  achieved = ours_rate["median"] * flops["train_flops"]
  results["identity_tf_flops"] = {
      "median": achieved,
      "min": ours_rate["min"] * flops["train_flops"],
      "max": ours_rate["max"] * flops["train_flops"],
      "fraction_of_sgemm_peak": achieved / peak,
      # Like for like with the SGEMM figure, itself the best of its runs.
      "best_repeat_fraction_of_sgemm_peak":
          ours_rate["max"] * flops["train_flops"] / peak}
  if theirs:
    best = max(theirs, key=lambda c: c.figures()[
        "images_per_second"]["median"])
    results["ratio_vs_pytorch"] = {"against": best.name,
                                   **speedup(ours, best)}
    results["ratios_vs_each_pytorch"] = {c.name: speedup(ours, c)
                                         for c in theirs}
  return results


def _train_step_lines(options, results, contenders):
  """The train_step suite's summary: the ratios first, then the figures."""
  lines = []
  versus = results.get("ratio_vs_pytorch")
  if versus:
    lines.append(f"identity_tf / PyTorch ({versus['against']}): "
                 f"{versus['median']:.2f}x images/s (per-repeat range "
                 f"{versus['min']:.2f}-{versus['max']:.2f}; target >= 1.0)")
  else:
    lines.append(f"identity_tf / PyTorch: not measured: "
                 f"{results['pytorch']}")
  ours_flops, flops = results["identity_tf_flops"], results["flops_per_image"]
  peak = results["sgemm"]["peak_flops"]
  lines.append(
      f"identity_tf FLOP/s / SGEMM peak: "
      f"{ours_flops['fraction_of_sgemm_peak']:.0%} at the median repeat, "
      f"{ours_flops['best_repeat_fraction_of_sgemm_peak']:.0%} at the best "
      f"({ours_flops['median'] / 1e9:.1f} and {ours_flops['max'] / 1e9:.1f} "
      f"of {peak / 1e9:.1f} GFLOP/s, the best SGEMM; target >= 85%)")
  lines.append("")
  lines += _throughput_lines(contenders, f"{options.steps} step(s)")
  for p in results["sgemm"]["measurements"]:
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
  return lines


def _smoke_accuracy(precision, steps, log):
  """Evaluation top-1 and loss of the smoke preset trained in PRECISION."""
  from identity_tf import configs  # pylint: disable=g-import-not-at-top
  from identity_tf.training import trainer  # pylint: disable=g-import-not-at-top
  config = configs.from_preset("smoke", train_steps=steps,
                           checkpoint_steps=steps, precision=precision)
  with tempfile.TemporaryDirectory() as model_dir:
    result = trainer.train(
        config, model_dir,
        echo=lambda line: log(f"smoke {precision}: {line}"))
  return {"top1": result["eval"]["top1"], "loss": result["eval"]["loss"],
          "train_loss": result["train_loss"], "steps": steps,
          "examples": result["eval"]["examples"]}


def _loop_rate(options, precision, steps):
  """images/s of //bin:train's own loop (`trainer.train`: the input
  pipeline, the step, the progress lines) in PRECISION: the median of its
  10-step windows after the first (warm-up), as metrics.jsonl records
  them."""
  # pylint: disable=g-import-not-at-top
  from identity_tf.training import metrics
  from identity_tf.training import trainer
  # pylint: enable=g-import-not-at-top
  config = _config(options, precision=precision, train_steps=steps + 10,
                   log_steps=10, steps_per_loop=10, checkpoint_steps=10 ** 9,
                   eval_at_end=False)
  with tempfile.TemporaryDirectory() as model_dir:
    trainer.train(config, model_dir, echo=lambda line: None)
    windows = [r for r in metrics.read(model_dir)
               if "images_per_second" in r]
  return metrics.images_per_second(windows[1:])


def bf16_suite(options):
  """mixed_bfloat16 against float32: the step, its share of the bfloat16
  matmul peak measured in the same run, and the smoke preset's accuracy."""
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  images, labels = tools.fixed_batch(options.batch_size)
  contenders = []
  for name, precision, stream in (
      ("float32", "float32", False),
      ("mixed_bfloat16", "mixed_bfloat16", False),
      ("mixed_bfloat16, float32 stream", "mixed_bfloat16", True)):
    config = _config(options, precision=precision, float32_stream=stream)
    contender, _ = tf_contender(options, name, config, images, labels)
    contenders.append(contender)
  alternate(contenders, options.steps, options.repeats, options.log)
  bf16_speedup = speedup(contenders[1], contenders[0])
  stream_speedup = speedup(contenders[2], contenders[0])
  flops = _flops(_run(options))
  options.log("bfloat16 matmul peak")
  peak = tools.bf16_matmul_peak(options.sgemm_size, options.sgemm_repeats,
                                log=options.log)
  rate = contenders[1].figures()["images_per_second"]["median"]
  share = rate * flops["train_flops"] / peak["tensorflow"]
  _, cpu_flags = tools.cpu_model_and_flags()
  results = {"network": {**_network(options),
                         "batch_size": options.batch_size},
             "step": STEP,
             "cpu_bf16_features": tools.bf16_features(cpu_flags),
             "contenders": {c.name: c.figures() for c in contenders},
             "speedup_bf16_over_float32": bf16_speedup,
             "speedup_bf16_float32_stream_over_float32": stream_speedup,
             "bf16_matmul": peak, "flops_per_image": flops,
             "bf16_step_fraction_of_matmul_peak": share}
  lines = [f"mixed_bfloat16 / float32: {bf16_speedup['median']:.2f}x images/s"
           f" (per-repeat range {bf16_speedup['min']:.2f}-"
           f"{bf16_speedup['max']:.2f}; "
           f"target >= 1.3)",
           f"mixed_bfloat16 with a float32 residual stream / float32: "
           f"{stream_speedup['median']:.2f}x images/s",
           f"mixed_bfloat16 step: {rate * flops['train_flops'] / 1e12:.3f} "
           f"TFLOP/s = {share:.0%} of the bfloat16 matmul peak "
           f"({peak['tensorflow'] / 1e12:.3f} TFLOP/s, {options.sgemm_size}^3"
           f"); CPU bfloat16 features: "
           + (", ".join(k for k, v in tools.bf16_features(cpu_flags).items()
                        if v) or "none")]
  if options.loop_steps:
    loop = {}
    for precision in ("float32", "mixed_bfloat16"):
      options.log(f"//bin:train's loop, {options.loop_steps} steps, "
                  f"{precision}")
      loop[precision] = _loop_rate(options, precision, options.loop_steps)
    results["train_loop_images_per_second"] = loop
    lines.append(
        f"//bin:train's loop (input pipeline included): float32 "
        f"{loop['float32']:.1f}, mixed_bfloat16 {loop['mixed_bfloat16']:.1f} "
        f"images/s ({loop['mixed_bfloat16'] / loop['float32']:.2f}x)")
  if options.smoke_steps:
    smoke = {}
    for precision in ("float32", "mixed_bfloat16"):
      options.log(f"smoke preset, {options.smoke_steps} steps, {precision}")
      smoke[precision] = _smoke_accuracy(precision, options.smoke_steps,
                                          options.log)
    results["smoke_accuracy"] = smoke
    cost = smoke["float32"]["top1"] - smoke["mixed_bfloat16"]["top1"]
    results["smoke_top1_cost"] = cost
    lines.append(
        f"smoke preset ({options.smoke_steps} steps) evaluation top-1: float32 "
        f"{smoke['float32']['top1']:.4f}, mixed_bfloat16 "
        f"{smoke['mixed_bfloat16']['top1']:.4f} (cost {cost:+.4f}); loss "
        f"{smoke['float32']['loss']:.4f} vs "
        f"{smoke['mixed_bfloat16']['loss']:.4f}")
  lines.append("")
  lines += _throughput_lines(contenders)
  return results, lines


# ---------------------------------------------------------------------------
# pipeline.

def input_pipeline_suite(options):
  """The training input pipeline of --dataset, as a run of --model reads it
  (its preprocessing), against what the step consumes."""
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  from identity_tf.data import pipeline  # pylint: disable=g-import-not-at-top
  config = _config(options)
  batch = config.batch_size
  reading = _run(options, dataset=options.dataset)
  pipelines = {}
  for deterministic in (False, True):
    dataset = pipeline.build_dataset(
        options.dataset, reading.dataset.train_split, batch, training=True,
        data_dir=options.data_dir, deterministic=deterministic,
        preprocessing=reading.preprocessing)
    iterator = iter(dataset)

    def run(batches, iterator=iterator):
      for _ in range(batches):
        next(iterator)
    pipelines[deterministic] = Contender(
        f"pipeline deterministic={deterministic}", run, batch)
    run(10)  # Fills the prefetch buffer and the parallel map.
  images, labels = tools.fixed_batch(batch)
  step, _ = tf_contender(options, "identity_tf step", config, images, labels)
  contenders = [pipelines[False], pipelines[True], step]
  for contender in contenders[:2]:
    contender.run_steps(options.batches)
  step.run_steps(1)
  for repeat in range(options.repeats):
    for contender in contenders:
      count = options.steps if contender is step else options.batches
      rate = contender.time_repeat(count)
      options.log(f"repeat {repeat + 1}/{options.repeats}: {contender.name} "
          f"{rate:.1f} images/s (load {contender.load[-1]})")
  figures = {c.name: c.figures() for c in contenders}
  step_rate = figures[step.name]["images_per_second"]["median"]
  headroom = {c.name: speedup(c, step) for c in contenders[:2]}
  # The training run's setting (configs.Config.deterministic, default off).
  used = pipelines[config.deterministic].name
  results = {"dataset": options.dataset, "batch_size": batch,
             "network": _network(options),
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
  lines.append(f"(training uses {used}; the step is {options.model} width "
               f"{options.width} at batch {batch}: {step_rate:.2f} images/s)")
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


def _sweep(options, name, label, sizes, run_once):
  """min and all times of options.repeats runs of run_once(size) per size."""
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  run_once(sizes[0])  # Warm-up: kernels, tf.function traces.
  rows = []
  for size in sizes:
    times = [run_once(size) for _ in range(options.repeats)]
    rows.append({"size": size, **tools.summarize(times),
                 "load_average": machine.load_average()})
    options.log(f"{name}: {label} = {size}: min {min(times):.4f} s")
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


def _throughput_lines(contenders, repeat=None):
  """A line per contender: median, min and max images/s (and the number of
  repeats of REPEAT, if given)."""
  lines = []
  for contender in contenders:
    figure = contender.figures()["images_per_second"]
    repeats = f", {figure['n']} repeats of {repeat}" if repeat else ""
    lines.append(f"{contender.name}: {figure['median']:.2f} images/s median "
                 f"(min {figure['min']:.2f}, max {figure['max']:.2f}"
                 f"{repeats})")
  return lines


def _plot_sweeps(path, sweeps, curves, variables, title, log):
  """Plots SWEEPS into PATH (nothing if None): a panel per (variable, what is
  held) of VARIABLES, a line per (name, label) of CURVES, from the sweep
  "<name>_vs_<variable>". Returns PATH."""
  if path:
    _plot([(f"{variable} ({held})",
            [(label, sweeps[f"{name}_vs_{variable}"])
             for name, label in curves])
           for variable, held in variables], path, title)
    log(f"wrote {path}")
  return path


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


def linear_suite(options):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from identity_tf.theory import linear as lt
  # pylint: enable=g-import-not-at-top
  layer_sizes, dims = options.layers, options.dims
  if options.d < 1 or options.l < 1:
    raise errors.ConfigError("--d and --l must be >= 1")
  rng = np.random.default_rng(0)
  problems = {}

  def problem(d):
    if d not in problems:
      problems[d] = (lt.random_target(d, rng, 1.0),
                     lt.random_covariance(d, rng, 0.5, 2.0))
    return problems[d]

  def factorize_time(layers, d):
    r, _ = problem(d)
    try:
      return tools.timed(lambda: lt.factorize(r, layers).numpy())[0]
    except ValueError as e:
      raise errors.ConfigError(f"factorize(l={layers}, d={d}): {e}; use larger "
                               f"--layers/--l") from None

  def gradient_time(layers, d):
    r, sigma = problem(d)
    a = tf.constant(lt.random_layers(layers, d, rng, 0.5 / layers))
    return tools.timed(lambda: lt.risk_gradient(a, r, sigma).numpy())[0]

  sweeps = {
      "factorize_vs_l": _sweep(options, "factorize_vs_l", "l", layer_sizes,
                               lambda l: factorize_time(l, options.d)),
      "gradient_vs_l": _sweep(options, "gradient_vs_l", "l", layer_sizes,
                              lambda l: gradient_time(l, options.d)),
      "factorize_vs_d": _sweep(options, "factorize_vs_d", "d", dims,
                               lambda d: factorize_time(options.l, d)),
      "gradient_vs_d": _sweep(options, "gradient_vs_d", "d", dims,
                              lambda d: gradient_time(options.l, d)),
  }
  path = _plot_sweeps(
      options.plot, sweeps, [("factorize", "factorize (Thm 2.1)"),
                             ("gradient", "gradient (Lemma 2.4)")],
      [("l", f"d = {options.d}"), ("d", f"l = {options.l}")],
      "Section 2: linear residual networks", options.log)
  results = {"sweeps": sweeps, "plot": path, "d": options.d, "l": options.l}
  return results, _sweep_lines(
      sweeps, "(expected: gradient O(l d^3); factorize O(d^3) + O(l d^2) "
      "output)")


def construct_suite(options):
  import numpy as np  # pylint: disable=g-import-not-at-top
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  from identity_tf.theory import construction  # pylint: disable=g-import-not-at-top
  points, dims = options.points, options.dims
  if options.d < 1 or options.n < 2:
    raise errors.ConfigError("construct needs --d >= 1 and --n >= 2")
  details = {}

  def data(n, d):
    rng = np.random.default_rng(n * 1000 + d)
    return rng.standard_normal((n, d)), rng.integers(0, 10, n)

  def build(n, d, what):
    x, y = data(n, d)
    seconds, built = tools.timed(lambda: construction.construct(
        x, y, num_classes=10))
    if what == "verify":
      seconds, accuracy = tools.timed(
          lambda: construction.accuracy(built.weights, x, y))
      details[(n, d)] = {"k": built.k, "units": built.num_units,
                         "parameters": construction.count_parameters(
                             built.weights), "accuracy": accuracy}
    return seconds

  sweeps = {
      "construct_vs_n": _sweep(options, "construct_vs_n", "n", points,
                               lambda n: build(n, options.d, "construct")),
      "verify_vs_n": _sweep(options, "verify_vs_n", "n", points,
                            lambda n: build(n, options.d, "verify")),
      "construct_vs_d": _sweep(options, "construct_vs_d", "d", dims,
                               lambda d: build(options.n, d, "construct")),
      "verify_vs_d": _sweep(options, "verify_vs_d", "d", dims,
                            lambda d: build(options.n, d, "verify")),
  }
  path = _plot_sweeps(
      options.plot, sweeps, [("construct", "construct"),
                             ("verify", "evaluate on all n points")],
      [("n", f"d = {options.d}"), ("d", f"n = {options.n}")],
      "Section 3: the expressivity construction", options.log)
  results = {"sweeps": sweeps, "plot": path, "d": options.d, "n": options.n,
             "networks": [{"n": n, "d": d, **v} for (n, d), v in
                          sorted(details.items())]}
  return results, _sweep_lines(
      sweeps, "(evaluation costs n * units * k MACs with units ~ n: ~n^2)")


def bf16_identity_suite(options):
  """How much of each residual branch the bfloat16 sum x + branch keeps:
  a freshly initialised --model, or every checkpoint of --model_dir on a
  batch of its run's evaluation images (`rounding.branch_survival`)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from identity_tf.bench import rounding  # pylint: disable=g-import-not-at-top
  from identity_tf.bench import tools  # pylint: disable=g-import-not-at-top
  from identity_tf.data import pipeline  # pylint: disable=g-import-not-at-top
  from identity_tf import model as model_lib  # pylint: disable=g-import-not-at-top
  from identity_tf.training import checkpoints  # pylint: disable=g-import-not-at-top
  measured = {}
  if options.model_dir is None:
    model = model_lib.build_model(**_run(options).model_arguments("float32"))
    images, _ = tools.fixed_batch(options.batch_size)
    measured["init"] = rounding.branch_survival(model, images)
  else:
    prefixes = checkpoints.checkpoint_prefixes(options.model_dir)[::-1]
    if not prefixes:
      raise errors.ConfigError(
          f"--model_dir={options.model_dir} holds no checkpoint")
    images = None
    for prefix in prefixes:
      model, run, step = checkpoints.restore_checkpoint(
          options.model_dir, prefix, precision="float32")
      if images is None:
        images, _ = next(iter(pipeline.build_dataset(
            run.config.dataset, run.dataset.eval_split, options.batch_size,
            training=False, data_dir=options.data_dir,
            preprocessing=run.preprocessing)))
      options.log(f"step {step}")
      measured[str(step)] = rounding.branch_survival(model, images)
  stages = {when: rounding.by_stage(rows) for when, rows in measured.items()}
  lines = ["share of each residual branch lost in the bfloat16 sum "
           "(||fl(x+b) - fl(x) - b|| / ||b||), mean over each stage's units; "
           "||b|| / ||x|| in brackets:"]
  for when, by_stage in stages.items():
    lines.append(f"{'step ' + when if when != 'init' else 'initialisation'}: "
                 + ", ".join(f"{stage} {v['lost']:.1%} "
                             f"({v['branch_to_stream']:.2g})"
                             for stage, v in by_stage.items()))
  worst = max(np.max([r["lost"] for r in rows]) for rows in measured.values())
  lines.append(f"(largest loss of one unit: {worst:.1%}; 0 % = the branch "
               "added as exactly as bfloat16 can hold it)")
  return {"units": measured, "stages": stages,
          "model_dir": options.model_dir}, lines


SUITES = {"train_step": train_step_suite, "bf16": bf16_suite,
          "bf16_identity": bf16_identity_suite,
          "input_pipeline": input_pipeline_suite, "linear": linear_suite,
          "construct": construct_suite}
