"""What every binary does first (quiet logs, no stray arguments), and how
the user runs a binary, for the commands that messages suggest."""

import os
import sys

from absl import flags
from absl import logging


def begin(argv, example="--help"):
  """The start of a binary's main(ARGV).

  TensorFlow and absl log every checkpoint write and more at INFO: the
  terminal is kept for progress lines unless --verbosity asks for more. No
  binary takes positional arguments (but those that say so and do not call
  this): one line naming them and how flags look (EXAMPLE), exit status 1.
  """
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    raise SystemExit(f"error: unexpected arguments {' '.join(argv[1:])}; "
                     f"flags look like {example}")


def command(binary, args=""):
  """The command line that runs bin/BINARY.py with ARGS the way this process
  was run: `identity-tf-NAME ARGS` from a pip-installed console script
  (pyproject.toml), else `bazel run //bin:BINARY -- ARGS`."""
  if os.path.basename(sys.argv[0] if sys.argv else "").startswith(
      "identity-tf-"):
    line = f"identity-tf-{binary.replace('_', '-')}"
    return f"{line} {args}" if args else line
  line = f"bazel run //bin:{binary}"
  return f"{line} -- {args}" if args else line
