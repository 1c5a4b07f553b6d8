"""The library and the command layer above it (DEVELOPERS.md, "Code").

Everything that turns a run into a process -- flags, one-line errors on
stderr, exit statuses, the command lines messages suggest -- lives in
identity_tf/commands/ (and bin/). The library under it raises typed errors
(identity_tf/errors.py) and reports through the `echo`/`log`/`emit`
functions it is given: read with `ast`, no module outside
identity_tf/commands/ imports that package (or the former identity_tf.cli),
prints, writes to sys.stdout/sys.stderr, or ends the process.
"""

import ast
import os
import re

from absl.testing import absltest

import testing

# Names a library module must not import: the command layer.
_COMMAND_LAYER = ("identity_tf.commands", "identity_tf.cli")
# Calls that end the process or write to the terminal.
_EXITS = {("sys", "exit"), ("os", "_exit"), ("os", "abort")}
_BUILTINS = {"print", "exit", "quit", "input", "breakpoint"}


def _library_modules():
  """(path relative to the source root, source) of every .py under
  identity_tf/ but identity_tf/commands/."""
  root = testing.source_root()
  for directory, subdirectories, names in os.walk(
      os.path.join(root, "identity_tf")):
    subdirectories[:] = sorted(name for name in subdirectories
                               if name not in ("commands", "__pycache__"))
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path) as f:
          yield os.path.relpath(path, root), f.read()


def _is_command_layer(name):
  return any(name == layer or name.startswith(layer + ".")
             for layer in _COMMAND_LAYER)


def violations(source, filename="<source>"):
  """The lines of SOURCE that import the command layer, print, write to
  the terminal or end the process, as "LINE: what"."""
  found = []
  tree = ast.parse(source, filename)
  called = {id(node.func) for node in ast.walk(tree)
            if isinstance(node, ast.Call)}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                if _is_command_layer(alias.name)]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names = [f"{node.module}.{alias.name}" for alias in node.names]
      found += [f"{node.lineno}: from {node.module} import "
                f"{name.rsplit('.', 1)[1]}" for name in names
                if _is_command_layer(name)]
    elif isinstance(node, ast.Raise) and node.exc is not None:
      exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
      if isinstance(exc, ast.Name) and exc.id == "SystemExit":
        found.append(f"{node.lineno}: raise SystemExit")
    elif isinstance(node, ast.Call):
      func = node.func
      if isinstance(func, ast.Name) and func.id in _BUILTINS:
        found.append(f"{node.lineno}: {func.id}()")
      elif (isinstance(func, ast.Attribute) and
            isinstance(func.value, ast.Name) and
            (func.value.id, func.attr) in _EXITS):
        found.append(f"{node.lineno}: {func.value.id}.{func.attr}()")
    elif (isinstance(node, ast.Attribute) and
          isinstance(node.value, ast.Name) and node.value.id == "sys" and
          node.attr in ("stdout", "stderr", "__stdout__", "__stderr__")):
      found.append(f"{node.lineno}: sys.{node.attr}")
    elif (isinstance(node, ast.Name) and node.id == "print" and
          id(node) not in called):
      found.append(f"{node.lineno}: print (passed as a function)")
  return found


class LayeringTest(absltest.TestCase):

  def test_the_checker_finds_each_kind_of_violation(self):
    # Each line is one violation; the checker must see every one of them.
    lines = ["from identity_tf import commands",
             "from identity_tf.commands import train",
             "import identity_tf.cli",
             "from identity_tf import cli",
             "print('x')",
             "sys.exit(1)",
             "os._exit(3)",
             "exit()",
             "raise SystemExit('error: x')",
             "sys.stderr.write('x')",
             "f(echo=print)"]
    for line in lines:
      self.assertLen(violations(line), 1, line)
    # What the library may do: take an echo function, raise its errors.
    self.assertEqual(violations(
        "from identity_tf import errors\n"
        "def f(echo):\n  echo('x')\n  raise errors.ConfigError('x')\n"), [])

  def test_no_library_module_prints_exits_or_imports_the_command_layer(self):
    found = []
    for path, source in _library_modules():
      found += [f"{path}:{line}" for line in violations(source, path)]
    self.assertEqual(found, [], "the library reaches into the command "
                     "layer (identity_tf/commands/): move the code there, "
                     "or raise an identity_tf.errors error instead")

  def test_the_command_layer_exists(self):
    # The check above would pass vacuously on a tree without the layer.
    path = os.path.join(testing.source_root(), "identity_tf", "commands",
                        "__init__.py")
    self.assertTrue(os.path.exists(path), path)


# The moves that are not writes of a file's content, so not
# `files.write_atomically`'s: a checkpoint set aside, a download moved into
# the data_dir, an export's directory moved into place (each whole-directory
# or whole-file renames of what is already written).
_OTHER_RENAMES = {"identity_tf/training/checkpoints.py",
                  "identity_tf/data/tfds_data.py",
                  "identity_tf/serving/export.py"}


def renames(source, filename="<source>"):
  """The lines of SOURCE that rename or replace a file (os.replace,
  os.rename, tf.io.gfile.rename, X.rename), as "LINE: call"."""
  found = []
  for node in ast.walk(ast.parse(source, filename)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("replace", "rename")):
      receiver = ast.unparse(node.func.value)
      # str.replace takes string arguments; a file move takes paths.
      if node.func.attr == "rename" or receiver == "os":
        found.append(f"{node.lineno}: {receiver}.{node.func.attr}()")
  return found


class OneAtomicWriterTest(absltest.TestCase):
  """Every file the project writes whole goes through one helper,
  `files.write_atomically` (issue: six hand-written atomic writers)."""

  def test_the_checker_finds_renames(self):
    for line in ("os.replace(a, b)", "os.rename(a, b)",
                 "tf.io.gfile.rename(a, b, overwrite=True)",
                 "_gfile().rename(a, b)"):
      self.assertLen(renames(line), 1, line)
    self.assertEqual(renames("'a.b'.replace('.', '_')"), [])

  def test_only_the_helper_renames_a_file_it_wrote(self):
    found = []
    for path, source in _library_modules():
      if path in _OTHER_RENAMES or path == "identity_tf/files.py":
        continue
      found += [f"{path}:{line}" for line in renames(source, path)]
    self.assertEqual(found, [], "write the file with "
                     "identity_tf.files.write_atomically instead")

  def test_a_failed_write_leaves_the_old_file_and_nothing_else(self):
    from identity_tf import files  # pylint: disable=g-import-not-at-top
    directory = self.create_tempdir().full_path
    path = os.path.join(directory, "config.json")
    files.write_text_atomically(path, "old")

    def cut_short(temporary):
      with open(temporary, "w") as f:
        f.write("ne")
      raise OSError("disk full")
    with self.assertRaises(OSError):
      files.write_atomically(path, cut_short)
    with open(path) as f:
      self.assertEqual(f.read(), "old")
    self.assertEqual(os.listdir(directory), ["config.json"])
    files.write_text_atomically(path, "new")
    with open(path) as f:
      self.assertEqual(f.read(), "new")
    self.assertEqual(os.listdir(directory), ["config.json"])


class SuiteLayoutTest(absltest.TestCase):
  """`bazel test //...` runs every test file: alone, or in a group
  (tests/BUILD's *_group targets, tests/grouped_tests.py)."""

  def test_every_test_file_runs_once_in_the_suite(self):
    tests = os.path.join(testing.source_root(), "tests")
    with open(os.path.join(tests, "BUILD")) as f:
      build = f.read()
    files = {name[:-len(".py")] for name in os.listdir(tests)
             if name.endswith("_test.py")}
    alone, manual, grouped = set(), set(), []
    for block in re.findall(r"^py_test\((.*?)^\)", build, re.S | re.M):
      name = re.search(r'name = "([^"]+)"', block).group(1)
      group = re.search(r'"--group=([^"]+)"', block)
      if group:
        grouped += group.group(1).split(",")
      elif '"manual"' in block:
        manual.add(name)
      else:
        alone.add(name)
    self.assertEqual(len(grouped), len(set(grouped)), "a file in two groups")
    # Each file runs once: alone or in a group, never both, never neither.
    self.assertEqual(alone & set(grouped), set())
    self.assertEqual(alone | set(grouped), files)
    # A file's own target is tagged manual only where a group runs it.
    self.assertEqual(manual, set(grouped))


if __name__ == "__main__":
  absltest.main()
