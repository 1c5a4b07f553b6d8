"""What every binary does first: quiet logs and no stray arguments."""

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
