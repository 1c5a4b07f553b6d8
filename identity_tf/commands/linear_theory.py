"""What //bin:linear_theory does: pick the subcommand, hand it the flags.

Each subcommand is one function of `theory.linear_run`
(`factorize_command`, `check_command`, `descend_command`,
`landscape_command`); this module checks that the flags given are the
subcommand's, resolves the paths against the user's directory and prints
the JSON result on stdout, alone there. Pure Python until a subcommand
runs: a wrong subcommand or flag is answered before TensorFlow loads.
"""

import json

from identity_tf import errors
from identity_tf.commands import cli
from identity_tf.theory import linear_run

# Per subcommand, the flags it takes.
SUBCOMMANDS = {
    "factorize": ("R", "layers", "output"),
    "check": ("d", "layers", "seed", "bound_power", "samples"),
    "descend": ("d", "layers", "steps", "step_size", "seed", "plot"),
    "landscape": ("R", "sigma", "d", "condition", "rotation", "depths",
                  "taus", "starts", "steps", "epsilon", "step_size", "seed",
                  "output", "plot"),
}
FLAG_NAMES = tuple(sorted({name for names in SUBCOMMANDS.values()
                           for name in names}))
# The former subcommands, each with one line saying what it became.
FORMER_SUBCOMMANDS = {
    # "construct" is Section 3's (//bin:construct); Theorem 2.1 factorizes R.
    "construct": ("the subcommand construct is now factorize (same flags): ",
                  errors.Command("linear_theory", "factorize --R=R.npy "
                                 "--layers=L --output=A.npz")),
    "benchmark": ("the subcommand benchmark is now ",
                  errors.Command("benchmark", "--suite=linear")),
}
# Path flags and the prefix of their two parameters: PREFIX_path (resolved
# against the user's directory) and PREFIX_as_typed.
PATH_FLAGS = {"R": "r", "sigma": "sigma", "output": "output", "plot": "plot"}


def print_json(result):
  """The binary's EMIT: RESULT as JSON on stdout, alone there."""
  cli.print_result(json.dumps(result, indent=1, default=float))


def _subcommand(arguments):
  """The subcommand ARGUMENTS name; ConfigError (one line) if none or not
  one."""
  command = arguments[0] if arguments else None
  if command in FORMER_SUBCOMMANDS:
    raise errors.ConfigError(*FORMER_SUBCOMMANDS[command])
  if command not in SUBCOMMANDS:
    given = (f"unknown subcommand {command!r}" if command is not None
             else "missing subcommand")
    raise errors.ConfigError(f"{given}; valid: {', '.join(SUBCOMMANDS)} (e.g. "
                             f"linear_theory factorize --R=R.npy --layers=10 "
                             f"--output=A.npz)")
  if len(arguments) > 1:
    raise errors.ConfigError(
        f"unexpected arguments {' '.join(arguments[1:])}; give "
        f"options as --flag=value")
  return command


def main(arguments, flags, *, log=cli.print_stderr, emit=print_json):
  """//bin:linear_theory: the subcommand ARGUMENTS[0] with FLAGS ({flag name:
  the value the user gave, None if not given}); returns its result.

  ConfigError (one line) for a missing or unknown subcommand or a flag the
  subcommand does not take; whatever the subcommand refuses.
  """
  command = _subcommand(arguments)
  given = {name: value for name, value in flags.items() if value is not None}
  unknown = sorted(set(given) - set(SUBCOMMANDS[command]))
  if command == "landscape" and "layers" in unknown:
    raise errors.ConfigError("landscape takes --depths=2,4,8, not --layers")
  if unknown:
    raise errors.ConfigError(
        f"{command} does not take --{unknown[0]}; it takes "
        f"--{', --'.join(SUBCOMMANDS[command])}")
  arguments = {}
  for name, value in given.items():
    if name in PATH_FLAGS:
      arguments[f"{PATH_FLAGS[name]}_path"] = cli.path(value)
      arguments[f"{PATH_FLAGS[name]}_as_typed"] = value
    else:
      arguments[name] = value
  # Every subcommand computes with TensorFlow: started now, without its
  # C++ start-up lines (the terminal is for the JSON and progress).
  cli.start_tensorflow_quietly()
  commands = {"factorize": linear_run.factorize_command,
              "check": linear_run.check_command,
              "descend": linear_run.descend_command,
              "landscape": linear_run.landscape_command}
  return commands[command](**arguments, log=log, emit=emit)
