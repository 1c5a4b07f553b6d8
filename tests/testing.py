"""Shared test helpers: locate the source tree and run a binary as a user would."""

import os
import subprocess
import sys


def source_root():
  """The directory holding identity_tf/ and bin/, under Bazel or not."""
  srcdir = os.environ.get("TEST_SRCDIR")
  workspace = os.environ.get("TEST_WORKSPACE")
  if srcdir and workspace:
    return os.path.join(srcdir, workspace)
  return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_binary(name, *args, timeout=600, env=None, check=False):
  """Runs bin/NAME.py with ARGS in a fresh interpreter; returns CompletedProcess.

  The child gets the same python and an environment in which `identity_tf`
  imports from this source tree, exactly like `bazel run //bin:NAME`.
  """
  root = source_root()
  child_env = dict(os.environ if env is None else env)
  child_env["PYTHONPATH"] = root + os.pathsep + child_env.get("PYTHONPATH", "")
  child_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  result = subprocess.run(
      [sys.executable, os.path.join(root, "bin", name + ".py"), *map(str, args)],
      capture_output=True, text=True, timeout=timeout, env=child_env,
      check=False)
  if check and result.returncode != 0:
    raise AssertionError(
        f"bin/{name}.py {' '.join(map(str, args))} exited {result.returncode}:\n"
        f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
  return result


def last_stderr_line(result):
  """The last non-empty line of a process's stderr (where errors are reported)."""
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  return lines[-1] if lines else ""
