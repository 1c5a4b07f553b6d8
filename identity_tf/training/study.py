"""Studies: a grid of training configurations x seeds, run and compared.

A study (`studies.STUDIES`) names arms: a preset plus overrides, each run
for its seeds. `run_study` trains every run of the grid on one dataset for a
budget in epochs, one after the other, each in its own model_dir
(OUTPUT_DIR/<arm>/seed<k>), so that re-running the same command resumes an
interrupted run and skips finished ones. A run that diverges is recorded
with the step of its first NaN, not retried. `collect` reads what every
run started in OUTPUT_DIR wrote, whichever command started it -- each
run's metrics.jsonl, its one record: how it ended, its wall time and its
curves -- and `write_report` turns it into results.json,
results.md (a markdown table) and curves.png (training loss and test top-1
against the step, one line per arm), given the settings it ran with
(`report`); `published` makes it a result file of docs/results. A
finished run's record -- config.json and metrics.jsonl, what a report reads
of it -- can be kept apart (`keep_records`) and restored into another
output directory, on another machine (`restore_records`), where it counts
as the finished run it was.
//bin:study's orchestration is `commands.study`.

A study that holds out training images (`studies.Study.validation_examples`)
evaluates every run on them once per epoch and reads the test split once,
at the end, or never (`Study.test_at_end`); its report names each
preset's best arm by final validation top-1 where the study selects, and
with a margin the equivalence test of every arm against the reference.
Every number in results.json names its split (`SPLITS`).

The budget scales the presets' schedules: with T = epochs x steps per epoch
and T0 the preset's train_steps, every learning-rate boundary b becomes
round(b T / T0), so the schedule keeps its shape (the paper's 30k and 50k of
70k steps become 3/7 and 5/7 of the budget). Every run evaluates on the
test split once per epoch.
"""

import dataclasses
import json
import math
import os
import re
import shutil

import numpy as np

from identity_tf import configs
from identity_tf import errors
from identity_tf import files
from identity_tf.data import datasets
from identity_tf.training import results_tables
from identity_tf.training import run as run_lib
from identity_tf.training import statistics

# Where studies before metrics.jsonl recorded how it ended kept a run's
# status, NaN step and wall time: read (`run_status`), never written.
LEGACY_RUN_FILE = "study.json"
RESULTS_JSON = "results.json"
RESULTS_MARKDOWN = "results.md"
CURVES_PNG = "curves.png"
# A study that selects: the validation top-1 of each rate (`plot_rates`).
RATES_PNG = "rates.png"
# Test top-1 levels whose time to reach every run reports (time-to-accuracy),
# unless the report is asked for others (`collect`'s top1_levels).
TOP1_LEVELS = (0.85, 0.90, 0.92)
# What a report's header says every run trained with.
SETTINGS = ("dataset", "epochs", "width", "precision")
# The "source" of a result file `published` writes.
PUBLISHED_BY = ("written by //bin:study --publish (identity_tf/training/"
                "study.py, published)")


def model_dir_of(output_dir, arm, seed):
  """The model_dir of ARM's run with SEED ("/" in arm names becomes "_")."""
  return os.path.join(output_dir, arm.name.replace("/", "_"), f"seed{seed}")


def run_config(arm, seed, *, dataset, epochs, num_train_examples,
               width=None, precision=None, validation_examples=0,
               test_at_end=True, deterministic=False):
  """The `configs.Config` of ARM's run with SEED on DATASET for EPOCHS.

  The learning-rate boundaries (the preset's, or the arm's where it sets
  them, both steps of the preset's train_steps) and the preset's warm-up are
  scaled to the budget; the run evaluates and checkpoints once per epoch,
  and on the whole training split at the end (of NUM_TRAIN_EXAMPLES, the
  dataset's, as `run.steps_per_epoch` counts it for the run, held-out
  images apart). WIDTH and
  PRECISION None keep the preset's. The arm's other overrides come last:
  they win (the `precision` study's arms keep their precisions; a warm-up
  an arm sets is in steps of the run, its warmup_fraction a share of
  them). VALIDATION_EXAMPLES training images are held out and evaluated
  every epoch, the test split at the end only with TEST_AT_END (without
  held-out images, every epoch as before); DETERMINISTIC: op-deterministic
  and in a fixed order.
  """
  base = configs.PRESETS[arm.preset]
  arm_overrides = dict(arm.overrides)
  config = configs.override(base, **{
      "dataset": dataset, "seed": seed, "width": width,
      "precision": precision, "validation_examples": validation_examples,
      "deterministic": deterministic, **arm_overrides})
  # The arm's recipe at the preset's budget, whose schedule is scaled.
  recipe = dataclasses.replace(base, lr_boundaries=config.lr_boundaries)
  steps_per_epoch = run_lib.steps_per_epoch(config, num_train_examples)
  steps = max(1, math.ceil(epochs * steps_per_epoch))
  boundaries = _scaled_boundaries(recipe, steps)
  if len(set(boundaries)) < len(boundaries):
    # Rounded to whole steps, drops a few steps apart land on one step:
    # name the budget the user chose, not a flag they did not set.
    enough = next(n for n in range(steps, base.train_steps + 1)
                  if len(set(_scaled_boundaries(recipe, n)))
                  == len(boundaries))
    raise errors.ConfigError(
        f"--epochs={epochs:g} is {steps} steps of {arm.name}, too few to keep "
        f"its learning-rate drops (steps {list(recipe.lr_boundaries)}"
        f" of {base.train_steps}) apart: give --epochs="
        f"{math.ceil(100 * enough / steps_per_epoch) / 100:g} or more")
  epoch = max(1, round(steps_per_epoch))
  # A preset's warm-up keeps its share of the budget, as its boundaries do.
  warmup = (max(1, round(base.warmup_steps * steps / base.train_steps))
            if base.warmup_steps else 0)
  if arm.warmup_fraction:
    warmup = max(1, round(arm.warmup_fraction * steps))
  arm_overrides.pop("lr_boundaries", None)
  return configs.override(config, **{
      "train_steps": steps, "lr_boundaries": boundaries,
      "warmup_steps": warmup, "eval_train_at_end": True, "eval_steps": epoch,
      "checkpoint_steps": epoch, "log_steps": min(base.log_steps, epoch),
      "steps_per_loop": min(base.steps_per_loop, epoch),
      "eval_at_end": test_at_end or not validation_examples,
      **arm_overrides})


def _scaled_boundaries(base, steps):
  """BASE's learning-rate boundaries scaled from its train_steps to STEPS."""
  return tuple(max(1, round(b * steps / base.train_steps))
               for b in base.lr_boundaries)


def run_status(model_dir, records):
  """{"status", "nan_step", "wall_seconds"} of the run in MODEL_DIR whose
  metrics.jsonl holds RECORDS: "done" or "diverged" as its last session
  ended (`metrics.status`), else "pending" (not started, or not finished).

  Backward compatibility: a run of a study from before metrics.jsonl said
  how a run ended has no "done" or "diverged" record; its study.json
  (LEGACY_RUN_FILE) says it, and its wall time where metrics.jsonl is
  missing.
  """
  from identity_tf.training import metrics  # pylint: disable=g-import-not-at-top
  state = {"status": "pending", "nan_step": None,
           "wall_seconds": metrics.wall_seconds(records)}
  ended = metrics.status(records)
  if ended and ended["status"] in ("done", "diverged"):
    return {**state, **ended}

  def _legacy_record(path):
    # The study.json at PATH, checked: one line naming it unless it is what
    # studies wrote there, {"status": "done", "diverged" or "pending",
    # "nan_step": a step or null, "wall_seconds": seconds}.
    def damaged(what):
      return errors.CheckpointError(
          f"{path} is {what}, not a study's record of how the run ended; "
          "restore it from a copy, or remove it (the run is then reported "
          "from its metrics.jsonl alone)")
    try:
      with open(path, "rb") as f:
        old = json.load(f)
    except IsADirectoryError:
      raise damaged("a directory") from None
    except (ValueError, RecursionError):
      raise damaged("not JSON") from None
    except OSError as e:
      raise errors.CheckpointError(
          f"cannot read {path} ({e.strerror or e}); make it readable, or "
          "remove it") from None
    if not isinstance(old, dict):
      raise damaged("a JSON " + {list: "list", str: "string", bool: "boolean",
                                 type(None): "null"}.get(type(old), "number"))
    nan_step, wall = old.get("nan_step"), old.get("wall_seconds", 0.0)
    if (old.get("status") not in ("done", "diverged", "pending") or
        not (nan_step is None or (isinstance(nan_step, int) and
                                  not isinstance(nan_step, bool))) or
        isinstance(wall, bool) or not isinstance(wall, (int, float)) or
        not math.isfinite(wall)):
      raise damaged('damaged (its "status", "nan_step" or "wall_seconds" '
                    "is not what a study wrote)")
    return old

  legacy = os.path.join(model_dir, LEGACY_RUN_FILE)
  if os.path.exists(legacy):
    old = _legacy_record(legacy)
    state.update(status=old["status"], nan_step=old.get("nan_step"))
    if not records:
      state["wall_seconds"] = old.get("wall_seconds", 0.0)
  return state


def check_available(study):
  """`errors.ConfigError` if STUDY cannot run yet (`Study.unavailable`)."""
  if study.unavailable:
    raise errors.ConfigError(f"study {study.name} cannot run yet: "
                             f"{study.unavailable}")


def arms_named(study, names=None):
  """The arms of STUDY named in NAMES (all if None), in the study's order;
  `errors.ConfigError` naming the study's arms if a name is not one."""
  unknown = sorted(set(names or ()) - {arm.name for arm in study.arms})
  if unknown:
    raise errors.ConfigError(
        f"study {study.name} has no arm {', '.join(unknown)}; "
        f"its arms: {', '.join(a.name for a in study.arms)}")
  return [arm for arm in study.arms if names is None or arm.name in names]


def runs_of(study, arms=None, seeds=None):
  """[(arm, seed)] of STUDY, restricted to the arm names ARMS and SEEDS."""
  return [(arm, seed) for arm in arms_named(study, arms)
          for seed in (arm.seeds if seeds is None else seeds)]


def run_study(study, output_dir, *, dataset, epochs, data_dir=None,
              width=None, precision=None, arms=None, seeds=None,
              deterministic=None, top1_levels=TOP1_LEVELS,
              records_dir=None, echo=lambda line: None):
  """Trains every run of STUDY that has not finished; returns `collect`'s
  (with TOP1_LEVELS) of every run in OUTPUT_DIR, this call's and earlier
  ones' with other ARMS or SEEDS.

  RECORDS_DIR, if given, holds the records of finished runs
  (`keep_records`): the runs recorded there and not started in OUTPUT_DIR
  are restored (`restore_records`) and skipped, and each run's record is
  kept there as soon as it ends.

  ARMS (names) and SEEDS restrict the grid; DETERMINISTIC (None: the
  study's) makes every run op-deterministic. ECHO receives one progress line
  per event (a run starting or ending, and the training's own progress
  lines prefixed with the run's name). On SIGTERM the current run writes a
  checkpoint and `preemption.PreemptedError` is raised: the same call
  resumes.
  """
  # pylint: disable=g-import-not-at-top
  from identity_tf.data import tfds_data
  import keras
  # pylint: enable=g-import-not-at-top
  check_available(study)
  info = tfds_data.prepared_info(dataset, data_dir)
  grid = runs_of(study, arms, seeds)
  runs = [(run_config(arm, seed, dataset=dataset, epochs=epochs, width=width,
                      precision=precision,
                      num_train_examples=info.num_train_examples,
                      validation_examples=study.validation_examples,
                      test_at_end=study.test_at_end,
                      deterministic=(study.deterministic
                                     if deterministic is None
                                     else deterministic)),
           model_dir_of(output_dir, arm, seed),
           f"[{number}/{len(grid)}] {arm.name} seed {seed}")
          for number, (arm, seed) in enumerate(grid, 1)]
  if records_dir:
    for arm, seed in restore_records(study, records_dir, output_dir, arms,
                                     seeds):
      echo(f"{arm.name} seed {seed}: restored from {records_dir}")
  for config, model_dir, name in runs:
    _check_same_run(config, model_dir, name)  # Before any training.
  for (arm, seed), (config, model_dir, name) in zip(grid, runs):
    _train_run(config, model_dir, name, data_dir, echo)
    if study.reestimate_batch_norm:
      _reestimate_batch_norm(study.reestimate_batch_norm, model_dir, name,
                             data_dir, echo)
    keras.backend.clear_session()  # Each run builds its own model.
    if records_dir:
      keep_records(study, output_dir, records_dir, [arm.name], [seed])
  return collect(study, output_dir, top1_levels=top1_levels)


def _finished(model_dir):
  """Whether the run in MODEL_DIR has ended ("done" or "diverged")."""
  from identity_tf.training import metrics  # pylint: disable=g-import-not-at-top
  return run_status(model_dir, metrics.read(model_dir))["status"] in (
      "done", "diverged")


def _record_files():
  """What a study reads of a run (`_run_results`, `run_status`,
  `_check_same_run`): its config.json and metrics.jsonl."""
  # pylint: disable=g-import-not-at-top
  from identity_tf.training import config_file
  from identity_tf.training import metrics
  # pylint: enable=g-import-not-at-top
  return (config_file.CONFIG_FILE, metrics.METRICS_FILE)


def _copy_record(source_dir, target_dir, flag):
  """SOURCE_DIR's run record (`_record_files`) into TARGET_DIR, each file
  whole (`files.write_atomically`)."""
  files.prepare_output_dir(target_dir, flag)
  for name in _record_files():
    files.write_atomically(
        os.path.join(target_dir, name),
        lambda temporary, name=name: shutil.copyfile(
            os.path.join(source_dir, name), temporary))


def keep_records(study, output_dir, records_dir, arms=None, seeds=None):
  """Copies the record of every finished run of STUDY in OUTPUT_DIR -- its
  config.json and metrics.jsonl, everything a report reads of it and no
  checkpoint, tens of kB -- to RECORDS_DIR/<arm>/seed<k>, replacing
  what is there; returns [(arm, seed)] copied. A run that has not ended is
  left out: without its checkpoints it could not go on elsewhere."""
  kept = []
  for arm, seed in runs_started(study, output_dir, arms, seeds):
    model_dir = model_dir_of(output_dir, arm, seed)
    if _finished(model_dir):
      _copy_record(model_dir, model_dir_of(records_dir, arm, seed),
                   "--records")
      kept.append((arm, seed))
  return kept


def restore_records(study, records_dir, output_dir, arms=None, seeds=None):
  """Copies every finished run recorded in RECORDS_DIR (`keep_records`)
  into OUTPUT_DIR where it has no run of that arm and seed; returns
  [(arm, seed)] restored. `run_study` then skips them as finished and
  `collect` reports them as they ran, on whichever machine: a study can
  span machines that share only the records. A run started in OUTPUT_DIR
  is left to go on."""
  restored = []
  for arm, seed in runs_started(study, records_dir, arms, seeds):
    record, model_dir = (model_dir_of(records_dir, arm, seed),
                         model_dir_of(output_dir, arm, seed))
    if not os.path.exists(model_dir) and _finished(record):
      _copy_record(record, model_dir, "--output_dir")
      restored.append((arm, seed))
  return restored


def _check_same_run(config, model_dir, name):
  """`errors.ConfigError` if MODEL_DIR holds a run of other settings than
  CONFIG's (`config_file.run_changes`): a finished one would be skipped and
  reported as the arm's, an unfinished one continued under two recipes.
  It was started with another --epochs or --precision, or its arm has been
  redefined since."""
  from identity_tf.training import config_file  # pylint: disable=g-import-not-at-top
  changed = config_file.run_changes(model_dir, config)
  if changed:
    raise errors.ConfigError(
        f"{name}: {model_dir} holds a run of other settings than the "
        f"arm's ({', '.join(changed)}); give the study the flags that run "
        "was started with, a new --output_dir, or move that run away")


def _train_run(config, model_dir, name, data_dir, echo):
  """Trains CONFIG in MODEL_DIR unless it finished; records how it ended."""
  # pylint: disable=g-import-not-at-top
  from identity_tf.training import diagnostics
  from identity_tf.training import metrics
  from identity_tf.training import preemption
  from identity_tf.training import trainer
  # pylint: enable=g-import-not-at-top
  state = run_status(model_dir, metrics.read(model_dir))
  if state["status"] in ("done", "diverged"):
    echo(f"{name}: {state['status']} earlier, skipped")
    return
  echo(f"{name}: training {config.train_steps} steps into {model_dir}")
  try:
    # The trainer's metrics.jsonl records how the run ends ("done" or
    # "diverged"): nothing is written here.
    outcome = trainer.train(config, model_dir, data_dir=data_dir,
                            echo=lambda line: echo(f"{name}: {line}"))
  except diagnostics.NonFiniteLossError as e:
    echo(f"{name}: diverged: {e}")
  except preemption.PreemptedError:
    raise  # The run wrote a checkpoint; the same command resumes it.
  else:
    if not outcome["trained"]:
      # At its last step already (a kill came after its last checkpoint and
      # before its "done" record): finished, and now recorded so.
      with metrics.MetricsWriter(model_dir) as writer:
        writer.done(outcome["step"])
  state = run_status(model_dir, metrics.read(model_dir))
  echo(f"{name}: {state['status']} after {state['wall_seconds']:.0f} s")


def _reestimate_batch_norm(images, model_dir, name, data_dir, echo):
  """Scores the finished batch-norm run in MODEL_DIR once on its held-out
  images with its statistics re-estimated on IMAGES training images
  (`evaluation.evaluate_run`), which records it in metrics.jsonl for the
  report (`metrics.reestimated_validation`). A run without batch norm, or
  recorded without checkpoints (`restore_records`), is left as it is."""
  # pylint: disable=g-import-not-at-top
  from identity_tf.training import checkpoints
  from identity_tf.training import evaluation
  from identity_tf.training import metrics
  from identity_tf.training import run as run_lib
  # pylint: enable=g-import-not-at-top
  records = metrics.read(model_dir)
  if (run_status(model_dir, records)["status"] != "done" or
      metrics.reestimated_validation(records) or
      not run_lib.read(model_dir, data_dir).model_options.norm):
    return
  if not checkpoints.checkpoint_prefixes(model_dir):
    echo(f"{name}: no checkpoint to re-estimate batch norm's statistics "
         "of (a recorded run): the report leaves them out")
    return
  echo(f"{name}: re-estimating batch norm's statistics on {images} "
       "training images")
  evaluation.evaluate_run(
      model_dir, data_dir=data_dir, held_out=True,
      reestimate_batch_norm=images,
      emit=lambda scores: echo(
          f"{name}: held-out top-1 {100 * scores['top1']:.2f} % with the "
          f"statistics re-estimated on {scores['batch_norm_images']} "
          "training images"),
      note=lambda line: echo(f"{name}: {line}"))


def _run_results(model_dir, seed, top1_levels=TOP1_LEVELS):
  """What one run of a study wrote (see `collect`), and its config."""
  # pylint: disable=g-import-not-at-top
  from identity_tf.training import config_file
  from identity_tf.training import metrics
  # pylint: enable=g-import-not-at-top
  # Every record and value taken from the files is checked (metrics.read
  # leaves out a line that is not a record; config_file.read refuses a
  # config.json that is not a run's in one line naming it): a damaged
  # file costs what it held, never the report.
  records = metrics.read(model_dir)
  state = run_status(model_dir, records)
  top1 = metrics.evaluation_curve(records)
  description = (config_file.read(model_dir)
                 if config_file.exists(model_dir) else None)
  config = description["config"] if description else None

  def number(value):
    return (value if isinstance(value, (int, float)) and
            not isinstance(value, bool) and math.isfinite(value) and
            value > 0 else None)

  settings = None
  if description:
    steps, per_epoch = (number(config.get("train_steps")),
                        number(description.get("steps_per_epoch")))
    settings = {"dataset": config.get("dataset"),
                "width": config.get("width"),
                "precision": config.get("precision", "float32"),
                "epochs": round(steps / per_epoch, 2) if steps and per_epoch
                          else None}
  batch_size = number(config.get("batch_size")) if config else None
  rate = metrics.images_per_second(records)
  validation = metrics.validation_curve(records)
  validation_loss = metrics.validation_curve(records, "loss")
  done = state["status"] == "done"
  return {
      "seed": seed, "model_dir": model_dir, **state,
      "deterministic": _deterministic(description),
      # What the run trains with, for the report's header.
      "settings": settings,
      "images_per_second": rate, "machines": metrics.machines(records),
      "time_to_top1": _time_to_top1(
          records, rate, {"batch_size": batch_size} if batch_size else None,
          top1_levels),
      "final_top1": top1[-1][1] if top1 and done else None,
      # The held-out training images' (--validation_examples), where the
      # study holds them out: what a study selects on.
      "final_validation_top1": validation[-1][1] if validation and done
                               else None,
      "final_validation_loss": (validation_loss[-1][1]
                                if validation_loss and done else None),
      # The whole training set evaluated once at the end: what the run
      # fitted, beside what it generalised to.
      "train_set": metrics.training_set_evaluation(records),
      # Batch norm's held-out scores with its statistics re-estimated on
      # the final weights (`Study.reestimate_batch_norm`).
      "batch_norm_reestimated": (metrics.reestimated_validation(records)
                                 if done else None),
      "best_top1": max(v for _, v in top1) if top1 else None,
      "curves": {"train_loss": metrics.training_loss_curve(records),
                 "test_top1": top1, "validation_top1": validation},
  }, config


def _deterministic(description):
  """Whether the run config.json DESCRIBES trained with --deterministic
  throughout: True, False, "from step N" (switched on there) or "until
  step N" (switched off); None without config.json."""
  if not description:
    return None
  now = bool(description["config"].get("deterministic"))
  for entry in description.get("history", []):
    change = entry["changed"].get("deterministic")
    if change is not None:
      return f"{'from' if now else 'until'} step {entry['step']}"
  return now


def _time_to_top1(records, rate, config, levels=TOP1_LEVELS):
  """{"0.9": {"step", "wall_seconds", "estimated_seconds"} or None} per
  top-1 level of LEVELS: of the held-out images where the run holds some
  out (its test split is read once, at the end), else of the test split.
  wall_seconds is the training time it took (None where metrics.jsonl does
  not cover it); estimated_seconds, the examples to that evaluation at the
  run's median speed: what it takes undisturbed."""
  from identity_tf.training import metrics  # pylint: disable=g-import-not-at-top
  split = ("validation" if metrics.validation_curve(records) else "eval")
  reached = metrics.time_to_levels(records, levels, split)
  for point in reached.values():
    if point is not None:
      point["estimated_seconds"] = (
          round(point["step"] * config["batch_size"] / rate, 1)
          if rate and config else None)
  return {str(level): point for level, point in reached.items()}


def runs_started(study, output_dir, arms=None, seeds=None):
  """[(arm, seed)] of STUDY whose model_dir exists in OUTPUT_DIR, in the
  study's order of arms and by seed: every run any command started there,
  whatever its --arms and --seeds. ARMS (names) and SEEDS restrict them."""
  started = []
  for arm in arms_named(study, arms):
    arm_dir = os.path.dirname(model_dir_of(output_dir, arm, 0))
    try:
      entries = os.listdir(arm_dir) if os.path.isdir(arm_dir) else ()
    except OSError as e:
      raise errors.CheckpointError(
          f"cannot list the runs in {arm_dir} ({e.strerror}); make it "
          "readable, or pass --arms without it") from None
    found = sorted(int(entry[len("seed"):]) for entry in entries
                   if re.fullmatch(r"seed\d+", entry)
                   and os.path.isdir(os.path.join(arm_dir, entry)))
    started += [(arm, seed) for seed in found
                if seeds is None or seed in seeds]
  return started


def collect(study, output_dir, arms=None, seeds=None,
            top1_levels=TOP1_LEVELS):
  """What the runs of STUDY in OUTPUT_DIR wrote, as a JSON-ready dict:
  every run started there (`runs_started`, restricted to ARMS and SEEDS),
  so that a report is of the whole directory, not of the last command.

  Per arm: its description and, per seed, status ("done", "diverged" or
  "pending"; `run_status`), nan_step, wall_seconds, final_top1 (the last
  evaluation), best_top1, time_to_top1 (the time to each test top-1 level
  of TOP1_LEVELS, also in the results, ascending) and the curves
  train_loss and test_top1 as [[step, value], ...]; plus the config of
  the first run found; where the study names a reference arm,
  "against_reference": the `statistics.paired_difference` of the arm's
  final top-1 minus the reference's, by seed. Raises
  `errors.CheckpointError` if no run has started: there is nothing to
  report.
  """
  top1_levels = sorted(set(top1_levels))
  results = {"study": study.name, "description": study.description,
             "top1_levels": top1_levels, "arms": []}
  started = runs_started(study, output_dir, arms, seeds)
  if not started:
    raise errors.CheckpointError(
        f"no run of study {study.name} has started in {output_dir}"
        + (" with those --arms and --seeds" if arms or seeds else "")
        + ": train them first (the same command without --report_only)")
  for arm in study.arms:
    runs, config = [], None
    for seed in [s for a, s in started if a is arm]:
      run, run_config_dict = _run_results(
          model_dir_of(output_dir, arm, seed), seed, top1_levels)
      runs.append(run)
      config = config or run_config_dict
    if runs:
      results["arms"].append({"name": arm.name, "preset": arm.preset,
                              "overrides": dict(arm.overrides),
                              "description": arm.description,
                              "config": config, "runs": runs})
  results["splits"] = splits(study)
  if study.reference:
    results["reference"] = study.reference
    differences = compare(results, study.reference)
    for arm in results["arms"]:
      arm["against_reference"] = differences.get(arm["name"])
      if study.margin:
        arm["equivalence"] = statistics.equivalence(
            arm["against_reference"], study.margin)
    if study.margin:
      results["margin"] = study.margin
  if study.selects:
    results["selected"] = select(results)
  return results


def splits(study):
  """Which examples each number of STUDY's results is of: {"final_top1",
  "final_validation_top1", "train_set"[, "batch_norm_reestimated"]} -> a
  phrase (results.json says it, so that no number's split is left to
  guess)."""
  held = study.validation_examples
  test = ("the evaluation split (test), read once, at the end"
          if study.test_at_end or not held else "not read")
  reestimated = ({"batch_norm_reestimated": (
      f"the {held} held-out training images, batch norm's statistics "
      f"re-estimated on {study.reestimate_batch_norm} of the training "
      "images on the final weights (batch-norm arms)")}
                 if study.reestimate_batch_norm and held else {})
  return {
      "final_top1": test,
      "final_validation_top1": (
          f"{held} training images held out of training "
          f"(datasets.held_out, seed {datasets.VALIDATION_SEED})"
          if held else "none held out"),
      "train_set": "the training images trained on, without augmentation",
      **reestimated,
  }


def select(results):
  """{preset: {"arm", "final_validation_top1", "learning_rate"}}: each
  preset's arm with the best mean final validation top-1 over its
  finished seeds -- the selection rule of a study that selects. Arms
  with a diverged or unfinished seed are not chosen."""
  best = {}
  for arm in results["arms"]:
    values = [r["final_validation_top1"] for r in arm["runs"]]
    if not values or None in values:
      continue
    score = float(np.mean(values))
    preset = arm["preset"]
    if preset not in best or score > best[preset]["final_validation_top1"]:
      best[preset] = {"arm": arm["name"], "final_validation_top1": score,
                      "learning_rate": (arm["config"] or {}).get(
                          "learning_rate")}
  return best


def _minutes_to(runs, level, key):
  """'12.3': the mean over the runs that reached LEVEL of their KEY
  ("wall_seconds": the training time it took; "estimated_seconds": what it
  takes undisturbed) in minutes, with how many when not all; '--' if
  none."""
  times = [r["time_to_top1"][str(level)] for r in runs]
  minutes = [t[key] / 60 for t in times if t and t.get(key) is not None]
  if not minutes:
    return "--"
  text = f"{np.mean(minutes):.1f}"
  return text if len(minutes) == len(runs) else (
      f"{text} ({len(minutes)}/{len(runs)})")


def _percent(value):
  return "--" if value is None else f"{100 * value:.2f}"


def _summary(values):
  """'91.20' for one value; 'mean ± sd (a, b, c)' for several."""
  present = [v for v in values if v is not None]
  if len(values) == 1:
    return _percent(values[0])
  if not present:
    return "--"
  text = ", ".join(_percent(v) for v in values)
  if len(present) < len(values):
    return text
  return (f"{100 * np.mean(present):.2f} ± "
          f"{100 * statistics.sample_std(present):.2f} ({text})")


def _training_set(runs, key):
  """The runs' training-set KEY ("loss": mean cross-entropy, "top1": as a
  percentage), mean ± sd over the seeds that have one; '--' if none."""
  values = [r["train_set"][key] for r in runs if r.get("train_set")]
  if not values:
    return "--"
  scale, digits = (100, 2) if key == "top1" else (1, 4)
  text = f"{scale * np.mean(values):.{digits}f}"
  if len(values) > 1:
    text += f" ± {scale * statistics.sample_std(values):.{digits}f}"
  return text if len(values) == len(runs) else (
      f"{text} ({len(values)}/{len(runs)})")


def compare(results, reference):
  """{arm name: `statistics.paired_difference`} of every arm's final test
  top-1 against the arm named REFERENCE, by seed; {} if REFERENCE has no
  finished run."""
  arms = {arm["name"]: arm for arm in results["arms"]}
  if reference not in arms:
    return {}
  base = results_tables.final_top1_by_seed(arms[reference])
  return {name: statistics.paired_difference(
              results_tables.final_top1_by_seed(arm), base)
          for name, arm in arms.items() if name != reference}


def _against(arm, reference, arms, margin=None):
  """The table's cell: ARM's final top-1 minus REFERENCE's, in words (with
  MARGIN: the equivalence test's), and the seeds at which ARM diverged
  where REFERENCE (of ARMS, by name) finished."""
  if arm["name"] == reference:
    return "(reference)"
  diverged = (results_tables.diverged_note(arm, arms[reference])
              if reference in arms else "")
  return results_tables.in_words(arm.get("against_reference"), diverged,
                                 margin)


def markdown_table(results):
  """One row per arm: test top-1 (final, best), the training set's loss
  and top-1 at the end, NaN steps, wall time, minutes to each of the
  results' top1_levels."""
  top1_levels = results.get("top1_levels", TOP1_LEVELS)
  levels = " / ".join(f"{100 * level:g}" for level in top1_levels)
  reference = results.get("reference")
  validation = any(r.get("final_validation_top1") is not None
                   for arm in results["arms"] for r in arm["runs"])
  reestimated = any(r.get("batch_norm_reestimated")
                    for arm in results["arms"] for r in arm["runs"])
  lines = [
      "| configuration | what | seeds | final test top-1 (%) | "
      + (f"against {reference} (paired by seed) | " if reference else "")
      + ("final validation top-1 (%) | " if validation else "")
      + ("validation top-1, batch norm's statistics re-estimated (%) | "
         if reestimated else "")
      + "best test top-1 (%) | training-set loss | training-set top-1 (%) | "
      f"NaN at step | wall time | images/s | minutes to {levels} % "
      f"({'validation' if validation else 'test'}): wall | undisturbed |",
      "|---|---|---|---|" + ("---|" if reference else "")
      + ("---|" if validation else "") + ("---|" if reestimated else "")
      + "---|---|---|---|---|---|---|---|",
  ]
  arms = {arm["name"]: arm for arm in results["arms"]}
  for arm in results["arms"]:
    runs = arm["runs"]
    nan = [str(r["nan_step"]) for r in runs if r["status"] == "diverged"]
    unfinished = [r["status"] for r in runs
                  if r["status"] in ("running", "pending")]
    if unfinished:
      nan.append(f"{len(unfinished)} unfinished")
    # Only finished runs: a run still going has spent part of its time.
    minutes = [r["wall_seconds"] / 60 for r in runs
               if r["status"] in ("done", "diverged")]
    wall = ("--" if not minutes else f"{minutes[0]:.1f} min"
            if len(runs) == 1 else f"{np.mean(minutes):.1f} min per seed")
    speeds = [r["images_per_second"] for r in runs
              if r.get("images_per_second")]
    rates = f"{np.mean(speeds):.0f}" if speeds else "--"
    lines.append(
        f"| {arm['name']} | {arm['description']} | "
        f"{', '.join(str(r['seed']) for r in runs)} | "
        f"{_summary([r['final_top1'] for r in runs])} | "
        + (f"{_against(arm, reference, arms, results.get('margin'))} | "
           if reference else "")
        + (f"{_summary([r.get('final_validation_top1') for r in runs])} | "
           if validation else "")
        + (f"{_summary([_reestimated_top1(r) for r in runs])} | "
           if reestimated else "")
        + f"{_summary([r['best_top1'] for r in runs])} | "
        f"{_training_set(runs, 'loss')} | {_training_set(runs, 'top1')} | "
        f"{', '.join(nan) or 'none'} | {wall} | {rates} | " + " | ".join(
            " / ".join(_minutes_to(runs, level, key) for level in top1_levels)
            for key in ("wall_seconds", "estimated_seconds")) + " |")
  return "\n".join(lines) + "\n"


def _reestimated_top1(run):
  """RUN's held-out top-1 with batch norm's statistics re-estimated, or
  None."""
  scores = run.get("batch_norm_reestimated")
  return scores["top1"] if scores else None


def machines_note(results):
  """Which hardware each run trained on, for the table's images/s and
  minutes: one line per machine (`machine.describe`'s) with its runs and
  their images/s there (none for a run that ended before its first
  progress line), a run resumed elsewhere under each (the table's
  images/s is the median over all its machines); runs that have not
  started are left out; '' if no run recorded it."""
  runs_on = {}
  for arm in results["arms"]:
    for run in arm["runs"]:
      machines = run.get("machines")
      if run["status"] == "pending" and not (machines or
                                             run["curves"]["train_loss"]):
        continue  # Not started: it trained nowhere.
      for machine, rate in (machines or {"not recorded": None}).items():
        if rate:
          speed = f" ({rate:.0f} images/s)"
        else:  # Ended before its first progress line, or from before speeds.
          speed = " (no speed measured)" if machines else ""
        runs_on.setdefault(machine, []).append(
            f"{arm['name']} seed {run['seed']}{speed}")
  if list(runs_on) in ([], ["not recorded"]):
    return ""
  return "images/s and minutes measured on:\n\n" + "".join(
      f"- {machine}: {', '.join(runs)}\n"
      for machine, runs in runs_on.items())


def _mean_curve(curves):
  """The mean over runs at the steps all of them reached."""
  if not curves or not all(curves):
    return [], []
  steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
  values = [np.mean([dict(c)[s] for c in curves]) for s in steps]
  return steps, values


def _arm_curves(arm, key):
  """(steps, values) of ARM's KEY curve: the mean over its seeds at the
  steps all reached, or its first seed's if a seed has no points."""
  runs = arm["runs"]
  curves = [r["curves"][key] for r in runs if r["curves"][key]]
  if len(curves) < len(runs):
    curves = curves[:1]
  steps, values = _mean_curve(curves)
  return steps, values, len(curves)


def top1_key(results):
  """The curve the figure's top-1 panel draws: "validation_top1" where a
  run of RESULTS holds images out (its test split is read once, at the
  end: a point, no curve), else "test_top1"."""
  held_out = any(run["curves"].get("validation_top1")
                 for arm in results["arms"] for run in arm["runs"])
  return "validation_top1" if held_out else "test_top1"


def top1_range(results, key="test_top1"):
  """The top-1 panel's y-range in %: (low, high) around what every arm
  reached in the second half of its steps (KEY: its curve), so that the
  differences at the end -- a fraction of a point -- are not flattened by
  the first epoch's (lower) evaluations. None if no arm has a point."""
  late = []
  for arm in results["arms"]:
    steps, values, _ = _arm_curves(arm, key)
    if steps:
      late += [100 * v for s, v in zip(steps, values) if s >= steps[-1] / 2]
  late = [v for v in late if np.isfinite(v)]
  if not late:
    return None
  spread = max(max(late) - min(late), 0.5)
  return min(late) - spread / 4, min(100.0, max(late) + spread / 4)


def plot_curves(results, path):
  """Training loss (log scale) and top-1 (%) against the step, one thick
  line per arm (the mean over its seeds) over a thin one per seed, so that
  the spread between seeds shows; an x marks where a run diverged. The
  top-1 panel is the held-out images' where the runs hold images out
  (`top1_key`), else the test split's, over the second half of the runs
  (`top1_range`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, (loss_axes, top1_axes) = pyplot.subplots(1, 2, figsize=(13, 5))
  top1 = top1_key(results)
  # One colour per arm in both panels: an arm that diverged has a loss
  # curve but no top-1 curve, so the default colour cycles would drift apart.
  colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
  for number, arm in enumerate(results["arms"]):
    colour = colours[number % len(colours)]
    for axes, key, scale in ((loss_axes, "train_loss", 1),
                             (top1_axes, top1, 100)):
      steps, values, seeds = _arm_curves(arm, key)
      if not steps:
        continue
      if seeds > 1:
        for run in arm["runs"]:
          points = run["curves"][key]
          axes.plot([s for s, _ in points], [scale * v for _, v in points],
                    color=colour, linewidth=0.6, alpha=0.35)
      label = arm["name"] + (f" (mean of {seeds} seeds)" if seeds > 1 else "")
      axes.plot(steps, [scale * v for v in values], label=label,
                color=colour, linestyle="-" if number < len(colours) else "--",
                marker="." if key == top1 else None)
      if key == "train_loss" and any(r["status"] == "diverged"
                                     for r in arm["runs"]):
        axes.plot(steps[-1:], values[-1:], "x", color=colour, markersize=10)
  split = "held-out" if top1 == "validation_top1" else "test"
  loss_axes.set(xlabel="step", ylabel="training loss", yscale="log",
                title="training loss (x: diverged after this point)")
  top1_axes.set(xlabel="step", ylabel=f"{split} top-1 (%)",
                title=f"{split} top-1 per evaluation (y: the second "
                      "half's range)")
  limits = top1_range(results, top1)
  if limits:
    top1_axes.set_ylim(*limits)
  for axes in (loss_axes, top1_axes):
    axes.grid(True, alpha=0.3)
  # The loss panel names every arm that logged a step, diverged ones too,
  # and says which runs diverged before their first progress line: they
  # have no point to draw.
  if loss_axes.get_legend_handles_labels()[0]:
    loss_axes.legend(fontsize=8, loc="upper right")
  unseen = [f"{arm['name']} seed {run['seed']} (step {run['nan_step']})"
            for arm in results["arms"] for run in arm["runs"]
            if run["status"] == "diverged" and not run["curves"]["train_loss"]]
  if unseen:
    loss_axes.text(0.02, 0.02, "\n".join(
        ["diverged before its first progress line:"] + unseen),
                   transform=loss_axes.transAxes, fontsize=8)
  figure.suptitle(f"study {results['study']}")
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


def plot_rates(results, path):
  """Final validation top-1 (%) against the learning rate (log axis), one
  line per preset of RESULTS (a study that sweeps the rate, `rates`), the
  mean over each arm's seeds; a run that diverged is an x at the foot of
  the axis, labelled with the step of its first NaN. Each preset's
  selected rate (`select`) is circled."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, axes = pyplot.subplots(figsize=(7, 4.5))
  lines, diverged = {}, []
  for arm in results["arms"]:
    rate = (arm.get("config") or {}).get("learning_rate") or dict(
        arm.get("overrides", {})).get("learning_rate")
    values = [r.get("final_validation_top1") for r in arm["runs"]]
    if values and None not in values:
      lines.setdefault(arm["preset"], []).append(
          (rate, 100 * float(np.mean(values))))
    for run in arm["runs"]:
      if run.get("status") == "diverged":
        diverged.append((arm["preset"], rate, run.get("nan_step")))
  finite = [v for points in lines.values() for _, v in points]
  floor = min(finite) - 1 if finite else 0
  colours = pyplot.rcParams["axes.prop_cycle"].by_key()["color"]
  for number, preset in enumerate(sorted(set(lines) | {d[0] for d in
                                                       diverged})):
    colour = colours[number % len(colours)]
    points = sorted(lines.get(preset, []))
    if points:
      axes.plot([r for r, _ in points], [v for _, v in points], "o-",
                color=colour, label=preset)
    for name, rate, step in diverged:
      if name == preset:
        axes.plot([rate], [floor], "x", color=colour, markersize=10)
        axes.annotate(f"NaN at step {step}", (rate, floor), color=colour,
                      textcoords="offset points", xytext=(4, 6), fontsize=8)
    chosen = results.get("selected", {}).get(preset)
    if chosen and chosen.get("learning_rate"):
      axes.plot([chosen["learning_rate"]],
                [100 * chosen["final_validation_top1"]], "o", markersize=14,
                markerfacecolor="none", color=colour)
  rates = sorted({r for points in lines.values() for r, _ in points} |
                 {d[1] for d in diverged})
  axes.set_xscale("log")
  axes.set_xticks(rates, [f"{r:g}" for r in rates])
  axes.minorticks_off()
  axes.set(xlabel="learning rate",
           ylabel="final validation top-1 (%)",
           title=f"study {results['study']}: each network's rate, on "
                 "held-out images (circled: chosen)")
  axes.grid(True, alpha=0.3)
  axes.legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=100)
  pyplot.close(figure)


def write_report(results, output_dir):
  """results.json, results.md and curves.png in OUTPUT_DIR; their paths."""
  os.makedirs(output_dir, exist_ok=True)
  paths = {name: os.path.join(output_dir, name)
           for name in (RESULTS_JSON, RESULTS_MARKDOWN, CURVES_PNG)}
  # Each written whole (`files.write_atomically`): a study killed while it
  # reports leaves the previous report, not a cut one.
  files.write_text_atomically(
      paths[RESULTS_JSON], json.dumps(results, indent=2, sort_keys=True))
  text = f"# Study {results['study']}\n\n{results['description']}\n\n"
  for key in SETTINGS:
    if key in results:
      text += f"- {key}: {results[key]}\n"
  for key, split in results.get("splits", {}).items():
    text += f"- {key}: {split}\n"
  if results.get("margin"):
    text += (f"- equivalence margin (stated before the runs): "
             f"{100 * results['margin']:g} point of test top-1\n")
  for preset, chosen in results.get("selected", {}).items():
    text += (f"- selected for {preset} (best final validation top-1): "
             f"{chosen['arm']}, {100 * chosen['final_validation_top1']:.2f} "
             "%\n")
  text += "\n" + markdown_table(results)
  note = machines_note(results)
  if note:
    text += "\n" + note
  files.write_text_atomically(paths[RESULTS_MARKDOWN], text)
  write_curves(results, paths[CURVES_PNG])
  if results.get("selected"):
    paths[RATES_PNG] = os.path.join(output_dir, RATES_PNG)
    write_rates(results, paths[RATES_PNG])
  return paths


def published(results, *, title, command, base_dir):
  """RESULTS (`report`'s, settings included) as a result file of
  docs/results (docs/results/README.md has the format): TITLE; COMMAND,
  the command line that trains the runs and reports them, as "commands"
  under the study's name, which every arm names as its "command"; "cpu",
  every machine the runs trained on (each run's "machines" has its own
  images/s); and each run's model_dir relative to BASE_DIR, the directory
  the command ran from, so that the file names no path of the machine."""
  data = json.loads(json.dumps(results))  # A copy: the report stays as is.
  key, machines = data["study"], []
  for arm in data["arms"]:
    arm["command"] = key
    for run in arm["runs"]:
      if "://" not in run["model_dir"]:
        run["model_dir"] = os.path.relpath(run["model_dir"], base_dir)
      machines += [m for m in run.get("machines") or {}
                   if m not in machines]
  data.update(title=title, commands={key: command}, source=PUBLISHED_BY,
              cpu="; ".join(machines) or "not recorded")
  return data


def write_rates(results, path):
  """`plot_rates` of RESULTS into PATH, written whole."""
  files.write_atomically(
      path, lambda temporary: plot_rates(results, temporary), suffix=".png")


def write_curves(results, path):
  """`plot_curves` of RESULTS into PATH, written whole
  (`files.write_atomically`): an interrupted write leaves the previous
  figure."""
  files.write_atomically(
      path, lambda temporary: plot_curves(results, temporary), suffix=".png")


def _settings(results):
  """{"dataset", "epochs", "width", "precision"} the runs in RESULTS
  trained with (each value, or the values found joined by ", "), None if
  no run has started: the report describes the runs, whatever flags a
  --report_only command was given."""
  found = [run["settings"] for arm in results["arms"] for run in arm["runs"]
           if run.get("settings")]
  if not found:
    return None
  settings = {}
  for key in SETTINGS:
    values = list(dict.fromkeys(f.get(key) for f in found))
    settings[key] = (values[0] if len(values) == 1
                     else ", ".join(str(v) for v in values))
  return settings


def report(results, output_dir, *, dataset, epochs, width, precision=None):
  """Writes RESULTS (`collect`'s) as the report of OUTPUT_DIR
  (`write_report`), described by the runs' own settings where any run has
  started, else by DATASET, EPOCHS, WIDTH and PRECISION (what the command
  asked for); returns {kind: path}."""
  results.update(_settings(results) or
                 {"dataset": dataset, "epochs": epochs, "width": width,
                  "precision": precision})
  return write_report(results, output_dir)
