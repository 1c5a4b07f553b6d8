"""The tables of docs/results.md, from the committed result files.

Each file (docs/results/*.json: per-seed results, the commands that
produced them and the CPU; docs/results/README.md says what each holds)
becomes a markdown table, one row per arm: its seeds, its final test top-1
(the mean ± the sample standard deviation, n - 1, and the value of every
seed) and its training-set loss; then one row per comparison the file
names: the per-seed differences to the reference arm ("ARM" of the same
file or "FILE:ARM" of another), their mean, the 95 % Student's t interval
and the words that interval allows (naming the seeds the arm diverged at,
which no difference can pair), and the same difference of the
training-set loss where both arms have it (`statistics`). A study's own
results.json (`study.collect`) reads the same way. Pure Python.

`curves_of` picks the runs whose training curves a file carries, for
`study.plot_curves` to draw a figure of docs/results.md from the committed
file alone.
"""

import json
import math
import os

from identity_tf import errors
from identity_tf.training import statistics


# The largest result file read: the committed ones are a few hundred kB
# (curves included).
MAX_FILE_BYTES = 64 << 20
# How a run of a result file ended (`study.collect` writes the first four).
STATUSES = ("done", "diverged", "pending", "running", "started", "stopped")


def load(results_dir, names=None):
  """({name: the JSON of results_dir/NAME.json}, {name: why it is not a
  result file, one line}) for NAMES (default: all). Every file is checked
  (`check`), so that a damaged one is named and the tables of the others
  still print; ConfigError only for a directory or a name that is not
  there."""
  if not os.path.isdir(results_dir):
    raise errors.ConfigError(f"--results_dir {results_dir} is not a directory; run "
                     "from the repository's root or pass --results_dir")
  found = sorted(name[:-len(".json")] for name in os.listdir(results_dir)
                 if name.endswith(".json"))
  missing = sorted(set(names or ()) - set(found))
  if missing:
    raise errors.ConfigError(f"no {', '.join(missing)} in {results_dir} (it holds "
                     f"{', '.join(found) or 'no .json file'}); fix --files")
  files, damaged = {}, {}
  for name in found:
    path = os.path.join(results_dir, name + ".json")
    try:
      files[name] = check(_read(path), path)
    except errors.ConfigError as e:
      damaged[name] = str(e)
  return files, damaged


def _read(path):
  """The JSON of PATH; ConfigError (one line naming it) if it cannot be
  read, is too large, or is not JSON."""
  try:
    if os.path.getsize(path) > MAX_FILE_BYTES:
      raise errors.ConfigError(
          f"{path} is over {MAX_FILE_BYTES >> 20} MB, not a result file; "
          "fix or remove it")
    with open(path, "rb") as f:
      return json.load(f)
  except errors.ConfigError:
    raise
  except RecursionError:
    raise errors.ConfigError(f"{path} is JSON nested too deeply to be a "
                             "result file; fix or remove it") from None
  except (OSError, ValueError) as e:  # UnicodeDecodeError, JSONDecodeError.
    reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:160]
    raise errors.ConfigError(f"cannot read {path} ({reason}); fix or "
                             "remove it") from None


def _kind(value):
  if value is None:
    return "null"
  if isinstance(value, bool):
    return f"{str(value).lower()} (a boolean)"
  if isinstance(value, (int, float)):
    return f"{value!r}"
  if isinstance(value, str):
    return f"the string {value[:40]!r}"
  return {dict: "an object", list: "a list"}.get(type(value), "unknown")


def _number(value, low, high=None):
  """Whether VALUE is a finite number in [LOW, HIGH] (no bound: None)."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and value >= low and
          (high is None or value <= high))


# A run's numbers: (field, low, high, what it is), None allowed for each.
_RUN_NUMBERS = (
    ("final_top1", 0, 1, "a test top-1 from 0 to 1"),
    ("best_top1", 0, 1, "a test top-1 from 0 to 1"),
    ("final_validation_top1", 0, 1, "a validation top-1 from 0 to 1"),
    ("final_validation_loss", 0, None, "a finite loss >= 0"),
    ("final_training_loss", 0, None, "a finite loss >= 0"),
    ("test_top5", 0, 1, "a top-5 from 0 to 1"),
    ("test_loss", 0, None, "a finite loss >= 0"),
    ("wall_minutes", 0, None, "minutes >= 0"),
    ("wall_seconds", 0, None, "seconds >= 0"),
)
# An evaluation's scores (`train_set`, `batch_norm_reestimated`).
_TRAIN_SET = (("loss", 0, None, "a finite loss >= 0"),
              ("top1", 0, 1, "a top-1 from 0 to 1"),
              ("top5", 0, 1, "a top-5 from 0 to 1"))


def check(data, path):
  """DATA (the JSON of result file PATH) if its values are a result
  file's, else ConfigError, one line naming the file, the arm, the seed and
  the field with what was expected: every number a table or a comparison
  takes typed and in range (a top-1 in [0, 1], a loss finite and >= 0),
  each seed once per arm, and a finished run with its final top-1 -- a
  value that is wrong there is a wrong published number."""
  def bad(where, message):
    raise errors.ConfigError(f"{path}: {where}{message}; fix it "
                             "(docs/results/README.md has the format)")
  if not isinstance(data, dict):
    bad("", f"the file is {_kind(data)}, expected an object")
  if not isinstance(data.get("arms"), list):
    bad("", f'"arms" is {_kind(data.get("arms"))}, expected a list')
  for key in ("margin",):
    if key in data and not _number(data[key], 0, 1):
      bad("", f'"{key}" is {_kind(data[key])}, expected a number from 0 '
          "to 1")
  for number, arm in enumerate(data["arms"]):
    if not isinstance(arm, dict) or not isinstance(arm.get("name"), str):
      bad(f"arm {number}: ", "expected an object with a \"name\" string")
    name = arm["name"]
    runs = arm.get("runs")
    if not isinstance(runs, list):
      bad(f"arm {name}: ", f'"runs" is {_kind(runs)}, expected a list')
    seen = set()
    for run in runs:
      if not isinstance(run, dict):
        bad(f"arm {name}: ", f"a run is {_kind(run)}, expected an object")
      seed = run.get("seed")
      if not (isinstance(seed, int) and not isinstance(seed, bool)
              and seed >= 0):
        bad(f"arm {name}: ", f'a run\'s "seed" is {_kind(seed)}, expected '
            "a whole number >= 0")
      where = f"arm {name}, seed {seed}: "
      if seed in seen:
        bad(where, "the seed is listed twice, expected each seed once")
      seen.add(seed)
      _check_run(run, where, bad)
  return data


def _check_run(run, where, bad):
  """`check`'s checks of one RUN (WHERE names it; BAD raises)."""
  status = run.get("status")
  if status is not None and status not in STATUSES:
    bad(where, f'"status" is {_kind(status)}, expected one of '
        + ", ".join(STATUSES))
  for field, low, high, what in _RUN_NUMBERS:
    value = run.get(field)
    if value is not None and not _number(value, low, high):
      bad(where, f'"{field}" is {_kind(value)}, expected {what}')
  if status == "done" and run.get("final_top1") is None and (
      run.get("final_validation_top1") is None):
    bad(where, 'the run is "done" but its "final_top1" is '
        f'{_kind(run.get("final_top1"))}, expected its test top-1')
  nan_step = run.get("nan_step")
  if nan_step is not None and not (isinstance(nan_step, int) and
                                   not isinstance(nan_step, bool)):
    bad(where, f'"nan_step" is {_kind(nan_step)}, expected a step or null')
  if status == "diverged" and run.get("final_top1") is not None:
    bad(where, 'the run "diverged" but has a "final_top1", expected null')
  # The scores of one evaluation: the training set's, and the held-out
  # images' with batch norm's statistics re-estimated.
  for key in ("train_set", "batch_norm_reestimated"):
    scores = run.get(key)
    if scores is None:
      continue
    if not isinstance(scores, dict):
      bad(where, f'"{key}" is {_kind(scores)}, expected an object')
    for field, low, high, what in _TRAIN_SET:
      value = scores.get(field)
      if value is not None and not _number(value, low, high):
        bad(where, f'"{key}.{field}" is {_kind(value)}, expected {what}')


def curves_of(data, name, arm_names):
  """A `study.plot_curves` input: the arms ARM_NAMES of result file NAME
  (its JSON DATA), in that order, each with only its runs that carry
  `curves`; an arm that is not there, or has no run with curves, is an
  error naming the arms that have them."""
  with_curves = {arm["name"]: [r for r in arm["runs"] if r.get("curves")]
                 for arm in data["arms"]}
  with_curves = {arm: runs for arm, runs in with_curves.items() if runs}
  missing = [arm for arm in arm_names if arm not in with_curves]
  if missing:
    raise errors.ConfigError(
        f"{name}.json has no curves of {', '.join(missing)} (runs with "
        f"curves: {', '.join(with_curves) or 'none'}); fix --arms")
  return {"study": name,
          "arms": [{"name": arm, "runs": with_curves[arm]}
                   for arm in arm_names]}


def final_top1_by_seed(arm):
  """{seed: final test top-1} of ARM's finished runs (a result file's arm
  or `study.collect`'s)."""
  return {run["seed"]: run["final_top1"] for run in arm["runs"]
          if run.get("final_top1") is not None}


def train_loss_by_seed(arm):
  """{seed: training-set loss at the end} of ARM's runs that have one."""
  return {run["seed"]: run["train_set"]["loss"] for run in arm["runs"]
          if (run.get("train_set") or {}).get("loss") is not None}


def diverged_note(arm, reference):
  """'diverged at seed 0 (NaN at step 24), where the reference finished':
  the seeds at which ARM diverged and REFERENCE (an arm) has a final test
  top-1. A paired difference leaves those seeds out, so the words must say
  so, or a divergence reads as a missing run; '' if there are none."""
  finished = final_top1_by_seed(reference)
  lost = [f"{run['seed']} (NaN at step {run.get('nan_step')})"
          for run in arm["runs"]
          if run.get("status") == "diverged" and run["seed"] in finished]
  if not lost:
    return ""
  return (f"diverged at seed{'s' if len(lost) > 1 else ''} "
          f"{', '.join(lost)}, where the reference finished")


def in_words(difference, diverged="", margin=None):
  """`statistics.wording` of a paired DIFFERENCE (with a MARGIN, a fraction
  of top-1 stated before the runs: `statistics.equivalence_wording`), with
  DIVERGED (a `diverged_note`) after it; 'not compared: DIVERGED' when no
  seed pairs because the arm diverged at them."""
  if difference is None and diverged:
    return "not compared: " + diverged
  words = (statistics.equivalence_wording(difference, margin) if margin
           else statistics.wording(difference))
  return f"{words}; {diverged}" if diverged else words


def _arm(files, reference, name):
  """The arm REFERENCE ("ARM", or "FILE:ARM" of another file) names, seen
  from file NAME."""
  where, _, arm_name = reference.rpartition(":")
  if (where or name) not in files:
    raise errors.ConfigError(
        f"{name}.json compares with {reference}, but {where}.json is not a "
        "result file here (missing, or damaged: named on its own line); fix "
        "it or the comparisons")
  arms = {arm["name"]: arm for arm in files[where or name]["arms"]}
  if arm_name not in arms:
    raise errors.ConfigError(f"{name}.json compares with {reference}, which is not "
                     f"an arm of {where or name}.json; fix its comparisons")
  return arms[arm_name]


def _percent(value):
  return f"{100 * value:.2f}"


def top1_cell(arm):
  """'93.52 ± 0.27 (93.37, 93.37, 93.83)', one seed's value, or what
  became of runs without one (NaN, stopped, not yet measured)."""
  runs = arm["runs"]
  if not runs:
    return "not yet measured"
  texts = []
  for run in runs:
    if run.get("final_top1") is not None:
      texts.append(_percent(run["final_top1"]))
    elif run.get("final_validation_top1") is not None:
      texts.append("not read")  # A study that selects on held-out images.
    elif run.get("status") == "diverged":
      texts.append(f"NaN at step {run.get('nan_step')}")
    elif run.get("stopped_at_step") is not None:
      texts.append(f"stopped at step {run['stopped_at_step']}")
    else:  # A study's own results.json: "running", "pending".
      texts.append(str(run.get("status")))
  values = list(final_top1_by_seed(arm).values())
  if len(values) < 2:
    return ", ".join(texts)
  return (f"{_percent(statistics.mean(values))} ± "
          f"{_percent(statistics.sample_std(values))} ({', '.join(texts)})")


def validation_cell(arm):
  """The final validation top-1 (held-out training images): mean ± sample
  std with each seed's value, the one seed's, or '' if none."""
  values = [run["final_validation_top1"] for run in arm["runs"]
            if run.get("final_validation_top1") is not None]
  if len(values) > 1:
    return (f"{_percent(statistics.mean(values))} ± "
            f"{_percent(statistics.sample_std(values))} ("
            + ", ".join(_percent(v) for v in values) + ")")
  return _percent(values[0]) if values else ""


def loss_cell(arm):
  """The training-set loss at the end: mean ± sample std (per seed), the
  one seed's, or a mean the file holds without its seeds; else the last
  training loss the runs reported, said so; '' if none."""
  losses = [run["train_set"]["loss"] for run in arm["runs"]
            if (run.get("train_set") or {}).get("loss") is not None]
  suffix = ""
  if not losses:
    losses = [run["final_training_loss"] for run in arm["runs"]
              if run.get("final_training_loss") is not None]
    suffix = " (the last training loss reported)" if losses else ""
  means = arm.get("train_set_means")
  if means and len(losses) < len(arm["runs"]):
    return f"{means['loss']:.4f} (mean; not every seed's recorded)"
  if len(losses) > 1:
    return (f"{statistics.mean(losses):.4f} ± "
            f"{statistics.sample_std(losses):.4f}{suffix}")
  return f"{losses[0]:.4f}{suffix}" if losses else ""


def _loss_difference(arm, reference):
  """The training-set loss's paired difference: '-0.0019 (-0.0064 to
  +0.0026)' (the mean and its 95 % interval), the one seed's, or ''."""
  difference = statistics.paired_difference(train_loss_by_seed(arm),
                                            train_loss_by_seed(reference))
  if difference is None:
    return ""
  text = f"{difference['mean']:+.4f}"
  if difference["interval"] is None:
    return text + " (one seed)"
  low, high = difference["interval"]
  return text + f" ({low:+.4f} to {high:+.4f})"


def comparison_row(files, name, arm_name, reference):
  """One comparison's cells: ARM_NAME - REFERENCE, seed by seed."""
  arm, base = _arm(files, arm_name, name), _arm(files, reference, name)
  difference = statistics.paired_difference(final_top1_by_seed(arm),
                                            final_top1_by_seed(base))
  loss = _loss_difference(arm, base)
  words = in_words(difference, diverged_note(arm, base),
                   files[name].get("margin"))
  if difference is None:
    return f"| {arm_name} - {reference} | | | | | {words} | {loss} |"
  seeds = ", ".join(str(seed) for seed in difference["seeds"])
  each = ", ".join(f"{100 * d:+.2f}" for d in difference["differences"])
  spread = ("" if difference["std"] is None
            else f" ± {100 * difference['std']:.2f}")
  interval = ("" if difference["interval"] is None else
              " to ".join(f"{100 * v:+.2f}" for v in difference["interval"]))
  return (f"| {arm_name} - {reference} | {seeds} | {each} | "
          f"{100 * difference['mean']:+.2f}{spread} | {interval} | "
          f"{words} | {loss} |")


def file_tables(files, name):
  """The markdown of file NAME: its conditions, arms and comparisons."""
  data = files[name]
  conditions = ", ".join(f"{key} {data[key]}" for key in
                         ("dataset", "width", "epochs", "precision")
                         if key in data)
  # A study's own results.json has no title or cpu (its runs' machines).
  title = data.get("title") or f"Study {data.get('study', name)}"
  validation = any(run.get("final_validation_top1") is not None
                   for arm in data["arms"] for run in arm["runs"])
  lines = [f"## {title} ({name}.json)", "",
           f"{conditions}; CPU: {data.get('cpu', 'per run')}.", "",
           "| arm | seeds | final test top-1 (%) | "
           + ("final validation top-1 (%) | " if validation else "")
           + "training-set loss |",
           "| --- | --- | --- | " + ("--- | " if validation else "")
           + "--- |"]
  for arm in data["arms"]:
    seeds = ", ".join(str(run["seed"]) for run in arm["runs"])
    lines.append(f"| {arm['name']} | {seeds} | {top1_cell(arm)} | "
                 + (f"{validation_cell(arm)} | " if validation else "")
                 + f"{loss_cell(arm)} |")
  for preset, chosen in sorted((data.get("selected") or {}).items()):
    lines.append(f"\nselected for {preset} (best final validation top-1): "
                 f"{chosen['arm']}")
  comparisons = data.get("comparisons") or [
      [arm["name"], data["reference"]] for arm in data["arms"]
      if data.get("reference") and arm["name"] != data["reference"]]
  if comparisons:
    lines += ["", "| comparison | seeds | test top-1, per seed (points) | "
              "mean ± sample std | 95 % interval | in words | training-set "
              "loss: mean difference (95 % interval) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    lines += [comparison_row(files, name, arm, reference)
              for arm, reference in comparisons]
  return "\n".join(lines) + "\n"
