"""The library's errors: one line naming the problem and the fix.

Every error the library raises for something a user can correct is an
`IdentityTfError`, and so a `ValueError` (what callers and tests caught
before these types existed). The command layer (`identity_tf.commands`)
turns one into `error: <message>` on stderr and exit status 1; the library
itself never prints or exits. Pure Python.

A message may suggest a command of this project (`Command`): the library
names the binary and its arguments, and the command layer writes them the
way the user runs the binaries (`commands.cli.command`).
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Command:
  """bin/BINARY.py with ARGS, as a message suggests running it.

  `str()` gives the README's form, `bazel run //bin:BINARY -- ARGS`; the
  command layer renders it as a console script when that is how the user
  runs the binaries (`IdentityTfError.render`).
  """
  binary: str
  args: str = ""

  def __str__(self):
    line = f"bazel run //bin:{self.binary}"
    return f"{line} -- {self.args}" if self.args else line


class IdentityTfError(ValueError):
  """A one-line error a user can correct. PARTS are strings and `Command`s,
  joined into the message."""

  def __init__(self, *parts):
    super().__init__(*parts)

  def render(self, command_line=str):
    """The message, each `Command` of it written by COMMAND_LINE."""
    return "".join(command_line(part) if isinstance(part, Command)
                   else str(part) for part in self.args)

  def __str__(self):
    return self.render()


class ConfigError(IdentityTfError):
  """A setting -- a flag, a preset's field, config.json -- that is invalid,
  or that conflicts with another or with the run in the directory."""


class ContradictionError(ConfigError):
  """Two names of one setting -- an earlier version's and today's -- set
  to different values: the readers name the file and refuse it rather than
  choose one."""


class DataError(IdentityTfError):
  """A dataset that is not prepared, or a data file that is missing,
  malformed or larger than the machine can hold."""


class CheckpointError(IdentityTfError):
  """A run directory or checkpoint that is missing, damaged or in use."""


class ServingError(IdentityTfError):
  """An export that cannot be written, or a model server's refusal or
  malformed answer."""


class OutputError(IdentityTfError):
  """A file or directory a command is to write that cannot be written."""


class TrainingError(IdentityTfError):
  """A training that cannot go on (its loss became NaN or infinite)."""
