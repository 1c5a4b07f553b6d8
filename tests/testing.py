"""Shared test helpers: run a binary as a user would; small real datasets."""

import gzip
import os
import subprocess
import sys
from unittest import mock

import numpy as np


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


# Fashion-MNIST's files as its publisher (and Debian's package) name them.
FASHION_FILES = {"train": ("train-images-idx3-ubyte.gz",
                           "train-labels-idx1-ubyte.gz"),
                 "test": ("t10k-images-idx3-ubyte.gz",
                          "t10k-labels-idx1-ubyte.gz")}


def write_fashion_mnist_files(directory, rng, counts):
  """Fashion-MNIST's four gzipped idx files with random records.

  COUNTS: {"train": n, "test": m}. The idx format (yann.lecun.com/exdb/mnist):
  a big-endian header -- magic 2051, count, 28, 28 for images; magic 2049,
  count for labels -- then one byte per pixel or label. Returns {split:
  (images uint8 [n, 28, 28, 1], labels uint8 [n])}.
  """
  os.makedirs(directory)
  records = {}
  for split, (image_file, label_file) in FASHION_FILES.items():
    n = counts[split]
    images = rng.integers(0, 256, (n, 28, 28)).astype(np.uint8)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    header = np.array([2051, n, 28, 28], ">u4").tobytes()
    with gzip.open(os.path.join(directory, image_file), "wb") as f:
      f.write(header + images.tobytes())
    with gzip.open(os.path.join(directory, label_file), "wb") as f:
      f.write(np.array([2049, n], ">u4").tobytes() + labels.tobytes())
    records[split] = (images[..., None], labels)
  return records


def fewer_mnist_examples(counts):
  """TFDS's MNIST builders read exactly 60,000 + 10,000 records: patched to
  COUNTS for the small files of `write_fashion_mnist_files`."""
  from tensorflow_datasets.image_classification import mnist  # pylint: disable=g-import-not-at-top
  return mock.patch.multiple(mnist, _TRAIN_EXAMPLES=counts["train"],
                             _TEST_EXAMPLES=counts["test"])
