"""What //bin:benchmark does with its flags: run one suite and report it.

`benchmark_command` prints the human summary (ratios first) to stdout and,
with --json, writes every figure with the machine it was taken on and the
load average before and after.
"""

import json
import os
import types

from identity_tf import configs
from identity_tf import errors
from identity_tf import files
from identity_tf import machine
from identity_tf.commands import cli

# The flags recorded in the JSON beside the results.
RECORDED_FLAGS = ("model", "width", "units", "batch_size", "precision",
                  "jit_compile", "steps", "repeats",
                  "strategy", "torch_memory_formats", "torch_threads",
                  "sgemm_size", "sgemm_repeats", "loop_steps", "smoke_steps",
                  "dataset",
                  "batches", "layers", "dims", "d", "l", "points", "n")


def options_from_flags(values):
  """VALUES ({flag: value}) as the suites take them: lists of integers
  parsed, the plot's and the JSON's paths resolved against the user's
  directory. TensorFlow-free, so that a mistake is one line at once."""
  options = types.SimpleNamespace(**values)
  for name, minimum in (("layers", 1), ("dims", 1), ("points", 2)):
    numbers = configs.parse_integers(name, getattr(options, name))
    if not numbers or min(numbers) < minimum:
      raise errors.ConfigError(f"--{name} needs integers >= {minimum}, got "
                               f"{','.join(map(str, numbers))}")
    setattr(options, name, list(numbers))
  options.data_dir = cli.path(options.data_dir)
  options.model_dir = cli.path(options.model_dir)
  plot = options.plot
  if plot is None:
    plot = f"benchmark_{options.suite}.png"
  options.plot = cli.resolve_path(plot) if plot else None
  if options.json:
    given = options.json
    options.json = cli.resolve_path(options.json)
    directory = os.path.dirname(options.json)
    if not os.path.isdir(directory):
      raise errors.ConfigError(
          f"--json={given}: directory {directory} does not "
          "exist; create it or pick another path")
    # A name too long or a directory that takes no file: said now, not
    # after minutes of measuring.
    files.check_output_file(options.json, f"--json={given}")
  return options


def benchmark_command(flag_values, command_args, log=cli.print_stderr):
  """What //bin:benchmark does: runs the suite FLAG_VALUES ({flag: value}
  of the binary's own flags, `options_from_flags`) name, prints its
  summary and writes the --json file.

  COMMAND_ARGS (the command line's flags) are recorded in the JSON as the
  command that reproduces it; LOG receives progress (stderr).
  """
  options = options_from_flags(flag_values)
  options.log = log
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # pylint: disable=g-import-not-at-top
  from identity_tf.bench import suites
  from identity_tf.bench import tools
  # pylint: enable=g-import-not-at-top
  measured_on = tools.machine_info()
  log(f"{options.suite} on {measured_on['cores']} cores "
      f"({measured_on['cpu']}), load average {measured_on['load_average']}")
  results, lines = suites.SUITES[options.suite](options)
  measured_on["load_average_end"] = machine.load_average()
  report = {
      "suite": options.suite,
      "command": "bazel run //bin:benchmark -- " + " ".join(command_args),
      "machine": measured_on,
      "flags": {name: getattr(options, name) for name in RECORDED_FLAGS},
      "results": results,
      "summary": lines,
  }
  print(f"{options.suite}, {measured_on['date_utc']} UTC, "
        f"{measured_on['cores']} cores, load average "
        f"{measured_on['load_average']} -> {measured_on['load_average_end']}")
  for line in lines:
    print(line)
  if options.json:
    def write(path):
      with open(path, "w") as f:
        json.dump(report, f, indent=1, default=float)
        f.write("\n")
    files.write_whole(options.json, write, f"--json={options.json}", ".json")
    log(f"wrote {options.json}")
  return report
