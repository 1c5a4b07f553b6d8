"""Paths given by a user on the command line."""

import os


def resolve_path(path):
  """PATH made absolute against the directory the user ran the command from.

  Under `bazel run` the working directory is the runfiles tree; Bazel puts
  the user's directory in BUILD_WORKING_DIRECTORY. `~` is expanded; URLs of
  other filesystems (gs://...) are returned unchanged.
  """
  path = os.path.expanduser(os.fspath(path))
  if os.path.isabs(path) or "://" in path:
    return path
  base = os.environ.get("BUILD_WORKING_DIRECTORY") or os.getcwd()
  return os.path.normpath(os.path.join(base, path))
