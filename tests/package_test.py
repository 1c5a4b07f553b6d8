"""`pip install .`: the wheel, `import identity_tf`, and a console script.

Builds the wheel from a copy of the source tree with the project venv's own
setuptools (no download), installs it with --no-deps into a throw-away venv
that sees the project venv's packages (TensorFlow etc.) through a .pth file,
and runs `identity-tf-train` from another directory, as a user would after
`pip install .`.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

from absl.testing import absltest

import testing

# What the wheel is built from (pyproject.toml names them).
_SOURCES = ("pyproject.toml", "README.md", "identity_tf", "bin")


def _run(command, **kwargs):
  result = subprocess.run(command, capture_output=True, text=True,
                          timeout=600, check=False, **kwargs)
  if result.returncode != 0:
    raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n"
                         f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
  return result


class PackageTest(testing.SharedRootTestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # A copy: setuptools writes build/ and *.egg-info next to pyproject.toml.
    source = os.path.join(cls.root, "source")
    for name in _SOURCES:
      path = os.path.join(testing.source_root(), name)
      target = os.path.join(source, name)
      if os.path.isdir(path):
        shutil.copytree(path, target, ignore=shutil.ignore_patterns(
            "BUILD", "__pycache__"))
      else:
        os.makedirs(source, exist_ok=True)
        shutil.copy(path, target)
    wheels = os.path.join(cls.root, "wheels")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps",
          "--no-build-isolation", "--disable-pip-version-check", "-q", "-w",
          wheels, source])
    (cls.wheel,) = [os.path.join(wheels, name) for name in os.listdir(wheels)]
    cls.venv = os.path.join(cls.root, "venv")
    _run([sys.executable, "-m", "venv", "--without-pip", cls.venv])
    purelib = sysconfig.get_paths(vars={"base": cls.venv,
                                        "platbase": cls.venv})["purelib"]
    # The project venv's packages (TensorFlow, ...): installed offline.
    with open(os.path.join(purelib, "project_venv.pth"), "w") as f:
      f.write(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python",
          os.path.join(cls.venv, "bin", "python"), "install", "--no-deps",
          "--no-index", "--disable-pip-version-check", "-q", cls.wheel])
    # Not this tree's identity_tf: the installed one.
    cls.env = {k: v for k, v in os.environ.items() if k not in (
        "PYTHONPATH", "BUILD_WORKING_DIRECTORY")}
    cls.env["TF_CPP_MIN_LOG_LEVEL"] = "2"

  def test_wheel_holds_the_library_and_the_binaries(self):
    python = os.path.join(self.venv, "bin", "python")
    result = _run([python, "-c", (
        "import identity_tf, identity_tf.bin.train, sys; "
        "print(identity_tf.__file__); "
        "print('tensorflow' in sys.modules)")], env=self.env, cwd=self.root)
    location, tensorflow_loaded = result.stdout.split()
    self.assertTrue(location.startswith(self.venv), location)
    self.assertEqual(tensorflow_loaded, "False")  # A lazy package.
    scripts = sorted(name for name in os.listdir(
        os.path.join(self.venv, "bin")) if name.startswith("identity-tf-"))
    binaries = sorted(
        "identity-tf-" + name[:-3].replace("_", "-")
        for name in os.listdir(os.path.join(testing.source_root(), "bin"))
        if name.endswith(".py"))
    self.assertEqual(scripts, binaries)

  def test_console_script_trains_like_its_bazel_twin(self):
    user_dir = os.path.join(self.root, "user")
    os.makedirs(user_dir)
    result = _run([os.path.join(self.venv, "bin", "identity-tf-train"),
                   "--preset=smoke", "--train_steps=10", "--log_steps=5",
                   "--steps_per_loop=5", "--checkpoint_steps=10",
                   "--num_eval_examples=100", "--model_dir=runs/pip"],
                  env=self.env, cwd=user_dir)
    # Paths are the caller's: runs/pip under the directory it ran in.
    model_dir = os.path.join(user_dir, "runs", "pip")
    self.assertTrue(os.path.exists(os.path.join(model_dir, "ckpt-10.index")))
    self.assertEqual(result.stdout.splitlines()[1],
                     f"checkpoints: {model_dir}")
    self.assertTrue(result.stdout.startswith("done: step 10"))
    # The commands it suggests are console scripts too.
    self.assertIn(f"evaluate:    identity-tf-evaluate --model_dir={model_dir}",
                  result.stdout.splitlines())
    with open(os.path.join(model_dir, "config.json")) as f:
      self.assertEqual(json.load(f)["config"]["preset"], "smoke")
    bad = subprocess.run(
        [os.path.join(self.venv, "bin", "identity-tf-train"),
         "--train_steps=-3"], capture_output=True, text=True, env=self.env,
        cwd=user_dir, timeout=120, check=False)
    self.assertEqual(bad.returncode, 1)
    self.assertEqual(testing.last_stderr_line(bad),
                     "error: --train_steps must be positive, got -3")


if __name__ == "__main__":
  absltest.main()
