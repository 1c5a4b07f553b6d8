"""Tests of bin/benchmark and identity_tf/benchmarks (issue 7).

Figures are never asserted (they depend on the machine and its load): the
tests check what the figures are made of -- the FLOP count, the PyTorch
reference being the same network, the JSON -- and that every suite runs at
tiny sizes, with and without PyTorch. The PyTorch-dependent cases run only
where torch imports, and fail without it under CI=true (.ci/run installs
requirements-benchmark.txt); the "PyTorch not installed" path is simulated
and tested everywhere.
"""

import functools
import importlib.util
import json
import math
import os
import sys
import tempfile

from absl.testing import absltest
import numpy as np

import identity_tf
from identity_tf.bench import tools
import testing

# Found, not imported: importing torch takes seconds and the tests that do
# not need it must not depend on it.
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def needs_torch(test_method):
  """TEST_METHOD runs where torch imports; elsewhere it is skipped, or fails
  under CI=true (`testing.require_optional_package`)."""
  @functools.wraps(test_method)
  def wrapper(self, *args, **kwargs):
    testing.require_optional_package(
        self, "torch", "pip install -r requirements-benchmark.txt (optional)")
    return test_method(self, *args, **kwargs)
  return wrapper


# Table 1, written out here independently of model.py and tools.py:
# per stage (input channels, width, output size, units).
TABLE_1 = [(16, 64, 32, 9), (64, 128, 16, 9), (128, 256, 8, 9)]
TINY = ("--width=0.125", "--units=1", "--batch_size=8", "--repeats=1",
        "--sgemm_size=64", "--sgemm_repeats=1")


def table_1_forward_macs():
  stem = 32 * 32 * 9 * 3 * 16
  total = stem
  for c_in, c, size, units in TABLE_1:
    total += size * size * 9 * (c_in * c + c * c)       # First unit.
    total += (units - 1) * size * size * 9 * 2 * c * c  # The other eight.
  return stem, total


def hide_torch_env(directory):
  """An environment whose Python finds a `torch` that fails to import."""
  package = os.path.join(directory, "torch")
  os.makedirs(package, exist_ok=True)
  with open(os.path.join(package, "__init__.py"), "w") as f:
    f.write("raise ImportError('No module named torch (simulated)')\n")
  env = dict(os.environ)
  env["PYTHONPATH"] = directory + os.pathsep + env.get("PYTHONPATH", "")
  return env


class FlopCountTest(absltest.TestCase):

  def test_table_1_forward_macs_and_train_flops(self):
    stem, forward = table_1_forward_macs()
    flops = tools.train_flops_per_image(tools.conv_shapes("cifar10"))
    self.assertEqual(flops["convolutions"], 55)
    self.assertEqual(flops["forward_macs"], forward)
    self.assertEqual(flops["first_conv_macs"], stem)
    self.assertEqual(flops["forward_flops"], 2 * forward)
    # Backward: kernel gradients of all 55, input gradients of all but the
    # first convolution (the images need none).
    self.assertEqual(flops["backward_flops"],
                     2 * forward + 2 * (forward - stem))
    self.assertEqual(flops["train_flops"], 6 * forward - 2 * stem)
    self.assertEqual(flops["conv_weights"], 13_538_736)
    # About 11.84 GFLOPs per image; elementwise work is under 1 % of it.
    self.assertAlmostEqual(flops["train_flops"] / 1e9, 11.836, places=3)
    self.assertLess(flops["other_flops_estimate"], 0.01 * flops["train_flops"])

  def test_shapes_match_the_models_kernels(self):
    for options in ({}, {"width": 0.25, "units": 2}, {"units": (1, 2, 1)},
                    {"width": 0.125, "units": 1, "stem_channels": 64}):
      model = identity_tf.build_model("cifar10", **options)
      kernels = [tuple(w.shape) for w in model.trainable_weights]
      shapes = tools.conv_shapes("cifar10", **options)
      self.assertEqual(
          kernels, [(s["k"], s["k"], s["c_in"], s["c_out"]) for s in shapes],
          options)
      self.assertEqual([s["out_size"] for s in shapes][-1], 8)

  def test_summarize(self):
    summary = tools.summarize([3.0, 1.0, 2.0, 10.0])
    self.assertEqual((summary["median"], summary["min"], summary["max"],
                      summary["n"]), (2.5, 1.0, 10.0, 4))


class TorchMissingTest(absltest.TestCase):

  def test_import_torch_reports_missing(self):
    saved = sys.modules.get("torch")
    sys.modules["torch"] = None  # `import torch` now raises ImportError.
    try:
      module, why = tools.import_torch()
    finally:
      if saved is None:
        del sys.modules["torch"]
      else:
        sys.modules["torch"] = saved
    self.assertIsNone(module)
    self.assertIn("PyTorch not installed", why)
    self.assertIn("requirements-benchmark.txt", why)

  def test_train_step_suite_without_torch(self):
    # Also shows that nothing imports torch at module level: the simulated
    # torch raises on import, which would stop the binary.
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "out.json")
      result = testing.run_binary(
          "benchmark", "--suite=train_step", *TINY, f"--json={path}",
          env=hide_torch_env(directory), check=True)
      with open(path) as f:
        report = json.load(f)
    lines = result.stdout.splitlines()
    self.assertIn("identity_tf / PyTorch: not measured: PyTorch not "
                  "installed", lines[1])
    self.assertIn("SGEMM peak", lines[2])
    results = report["results"]
    self.assertIn("PyTorch not installed", results["pytorch"])
    self.assertEqual(list(results["contenders"]), ["identity_tf"])
    self.assertNotIn("ratio_vs_pytorch", results)
    self.assertIsNone(report["machine"]["torch"])
    self.assertNotIn("torch", results["sgemm"]["measurements"][0])
    self.assertGreater(results["identity_tf_flops"]["median"], 0)


class TrainStepSuiteTest(absltest.TestCase):

  def test_json_structure(self):
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "out.json")
      result = testing.run_binary("benchmark", "--suite=train_step", *TINY,
                                  f"--json={path}", check=True)
      with open(path) as f:
        report = json.load(f)
    self.assertEqual(report["suite"], "train_step")
    self.assertIn("--suite=train_step", report["command"])
    machine = report["machine"]
    for key in ("date_utc", "cpu", "cores", "cpu_flags", "tensorflow",
                "keras", "numpy", "torch", "load_average",
                "load_average_end"):
      self.assertIn(key, machine)
    results = report["results"]
    ours = results["contenders"]["identity_tf"]
    for key in ("median", "min", "max", "n", "values"):
      self.assertIn(key, ours["images_per_second"])
    self.assertEqual(ours["images_per_second"]["n"], 1)
    self.assertLen(ours["load_average"], 1)
    flops = results["flops_per_image"]
    self.assertEqual(flops["convolutions"], 7)
    self.assertEqual(flops["train_flops"], tools.train_flops_per_image(
        tools.conv_shapes("cifar10", width=0.125, units=1))[
            "train_flops"])
    sgemm = results["sgemm"]
    self.assertLen(sgemm["measurements"], 2)
    self.assertEqual(sgemm["peak_flops"],
                     max(m["best"] for m in sgemm["measurements"]))
    self.assertAlmostEqual(
        results["identity_tf_flops"]["fraction_of_sgemm_peak"],
        results["identity_tf_flops"]["median"] / sgemm["peak_flops"])
    # Ratios come first in the human summary.
    lines = result.stdout.splitlines()
    self.assertTrue(lines[1].startswith("identity_tf / PyTorch"), lines)
    self.assertTrue(lines[2].startswith("identity_tf FLOP/s / SGEMM peak"))
    self.assertEqual(report["summary"], lines[1:])
    if HAVE_TORCH:
      self.assertIn("pytorch (channels_last)", results["contenders"])
      self.assertIn("against", results["ratio_vs_pytorch"])
      self.assertIn("torch", sgemm["measurements"][0])

  def test_bad_flags_are_one_line(self):
    # absl checks most flags (its "FATAL Flags parsing error: ..." line);
    # the binary the rest ("error: ...").
    for args, words in ((("--suite=bogus",), "--suite=bogus"),
                        ((), "--suite must have a value"),
                        (("--suite=train_step", "--repeats=0"),
                         "--repeats must be >= 1"),
                        (("--suite=train_step",
                          "--torch_memory_formats=nhwc"),
                         "--torch_memory_formats takes"),
                        (("--suite=linear", "--layers=a"),
                         "--layers must be comma-separated integers"),
                        (("--suite=train_step",
                          "--strategy=parameter_server"),
                         "--strategy=parameter_server")):
      result = testing.run_binary("benchmark", *args)
      self.assertNotEqual(result.returncode, 0, args)
      self.assertNotIn("Traceback", result.stderr)
      message = (testing.flag_error(result) or
                 testing.last_stderr_line(result))
      self.assertIn(words, message, result.stderr)


class TorchReferenceTest(absltest.TestCase):

  @needs_torch
  def test_same_parameters_as_ours(self):
    model = identity_tf.build_model("cifar10")
    network, _, _ = tools.torch_reference(model)
    ours = [tuple(w.shape) for w in model.trainable_weights]
    theirs = [(name, tuple(p.shape)) for name, p in network.named_parameters()
              if p.requires_grad]
    # PyTorch kernels are (c_out, c_in, k, k); ours (k, k, c_in, c_out).
    self.assertEqual([(s[2], s[3], s[1], s[0]) for _, s in theirs], ours)
    self.assertEqual(sum(math.prod(s) for _, s in theirs), 13_538_736)
    self.assertLen(theirs, 55)
    # The projection is a buffer: saved with the module, never trained.
    self.assertEqual(tuple(network.projection.shape), (256, 10))
    self.assertFalse(network.projection.requires_grad)
    self.assertFalse(any("bias" in name for name, _ in theirs))

  @needs_torch
  def test_same_function_and_same_step(self):
    import torch  # pylint: disable=g-import-not-at-top
    from identity_tf import configs  # pylint: disable=g-import-not-at-top
    config = configs.from_preset("cifar10_paper_literal", width=0.125, units=(1,),
                             batch_size=8, dataset="synthetic",
                             weight_decay=0.01, learning_rate=0.5)
    images, labels = tools.fixed_batch(8)
    run, model = tools.make_train_step(config, images, labels)
    network, step, _ = tools.torch_reference(
        model, learning_rate=0.5, momentum=0.9, weight_decay=0.01)
    for channels_last in (False, True):
      x, _ = tools.torch_batch(images, labels, channels_last)
      with torch.no_grad():
        theirs = network(x).numpy()
      np.testing.assert_allclose(theirs, model(images).numpy(), rtol=1e-4,
                                 atol=1e-7)
    x, y = tools.torch_batch(images, labels)
    for _ in range(2):  # The second step uses the momentum.
      sums = run(1)
      loss, correct = step(x, y)
      self.assertAlmostEqual(sums[0] / 8, loss, places=4)
      self.assertEqual(int(sums[1]), correct)
    # The stride-2 convolution of stage 2 (TensorFlow's asymmetric "same").
    ours = model.get_layer("stage2_unit1").conv1.kernel.numpy()
    theirs = network.units[1].conv1.weight.detach().numpy()
    np.testing.assert_allclose(theirs.transpose(2, 3, 1, 0), ours, rtol=1e-3,
                               atol=1e-6)


class OtherSuitesTest(absltest.TestCase):

  def test_bf16(self):
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "out.json")
      result = testing.run_binary(
          "benchmark", "--suite=bf16", "--width=0.125", "--units=1",
          "--batch_size=8", "--repeats=1", "--smoke_steps=1",
          "--loop_steps=10", "--sgemm_size=128", f"--json={path}",
          check=True)
      with open(path) as f:
        report = json.load(f)
    results = report["results"]
    self.assertTrue(result.stdout.splitlines()[1].startswith(
        "mixed_bfloat16 / float32"))
    self.assertEqual(list(results["contenders"]),
                     ["float32", "mixed_bfloat16",
                      "mixed_bfloat16, float32 stream"])
    self.assertIn("median", results["speedup_bf16_over_float32"])
    self.assertEqual(set(results["cpu_bf16_features"]),
                     {"avx512_bf16", "amx_bf16", "amx_tile"})
    self.assertGreater(results["bf16_matmul"]["tensorflow"], 0)
    self.assertGreater(results["bf16_step_fraction_of_matmul_peak"], 0)
    self.assertEqual(set(results["train_loop_images_per_second"]),
                     {"float32", "mixed_bfloat16"})
    self.assertEqual(report["flags"]["loop_steps"], 10)
    for policy in ("float32", "mixed_bfloat16"):
      smoke = results["smoke_accuracy"][policy]
      self.assertEqual(smoke["steps"], 1)
      self.assertTrue(0 <= smoke["top1"] <= 1 and math.isfinite(smoke["loss"]))

  def test_bf16_identity(self):
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "out.json")
      result = testing.run_binary(
          "benchmark", "--suite=bf16_identity", "--width=0.125", "--units=1",
          "--batch_size=4", f"--json={path}", check=True)
      with open(path) as f:
        results = json.load(f)["results"]
    self.assertEqual(list(results["units"]), ["init"])
    self.assertEqual([row["unit"] for row in results["units"]["init"]],
                     ["stage1_unit1", "stage2_unit1", "stage3_unit1"])
    self.assertEqual(set(results["stages"]["init"]),
                     {"stage1", "stage2", "stage3"})
    self.assertIn("initialisation: stage1 ", result.stdout)

  def test_input_pipeline(self):
    with tempfile.TemporaryDirectory() as directory:
      path = os.path.join(directory, "out.json")
      result = testing.run_binary(
          "benchmark", "--suite=input_pipeline", "--width=0.125", "--units=1",
          "--batch_size=8", "--repeats=1", "--batches=2", f"--json={path}",
          check=True)
      with open(path) as f:
        results = json.load(f)["results"]
    self.assertTrue(result.stdout.splitlines()[1].startswith(
        "input pipeline / step consumption"))
    self.assertEqual(set(results["pipeline_over_step"]),
                     {"pipeline deterministic=False",
                      "pipeline deterministic=True"})
    self.assertEqual(results["training_uses"], "pipeline deterministic=False")

  def test_linear_and_construct_write_plots(self):
    with tempfile.TemporaryDirectory() as directory:
      for suite, args in (("linear", ("--layers=4,8", "--dims=4,8", "--d=4",
                                      "--l=4")),
                          ("construct", ("--points=20,40", "--dims=3,6",
                                         "--d=3", "--n=20"))):
        plot = os.path.join(directory, f"{suite}.png")
        path = os.path.join(directory, f"{suite}.json")
        testing.run_binary("benchmark", f"--suite={suite}", "--repeats=1",
                           *args, f"--plot={plot}", f"--json={path}",
                           check=True)
        with open(plot, "rb") as f:
          self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        with open(path) as f:
          results = json.load(f)["results"]
        self.assertLen(results["sweeps"], 4)
        for sweep in results["sweeps"].values():
          self.assertLen(sweep["rows"], 2)
          self.assertIsInstance(sweep["exponent"], float)
          self.assertIn("load_average", sweep["rows"][0])


if __name__ == "__main__":
  absltest.main()
