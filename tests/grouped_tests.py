"""Runs several test files in one process: one TensorFlow import for all.

A test process pays TensorFlow's import, and its fork server
(`testing._ForkServer`) another, seconds each on two cores: more than
many small test files take to run. tests/BUILD's groups (`*_group`) run
the small files together in the suite, through this runner:

    grouped_tests.py --group=model_test,shipped_test [absltest flags]

Every file still runs alone, as a user runs one: `bazel test
//tests:model_test` (tagged manual: `//...` runs it in its group) or
`python tests/model_test.py`.
"""

import importlib
import unittest

from absl import flags
from absl.testing import absltest

_GROUP = flags.DEFINE_list("group", None, "The test modules to run "
                           "(file names without .py), in this order.")


def load_tests(loader, tests, pattern):  # pylint: disable=unused-argument
  """unittest's hook: every TestCase of each --group module, in order."""
  suite = unittest.TestSuite()
  for name in _GROUP.value:
    suite.addTests(loader.loadTestsFromModule(importlib.import_module(name)))
  return suite


if __name__ == "__main__":
  flags.mark_flag_as_required("group")
  absltest.main()
