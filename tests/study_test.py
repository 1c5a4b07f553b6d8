"""Tests of identity_tf/training/study.py and bin/study.py: grid, resume, report.

The report writer is checked on results made up here (its numbers computed
independently with `statistics`); the runner on a tiny study of the
synthetic dataset, one arm of which diverges.
"""

import functools
import json
import math
import os
import shutil
import statistics
from unittest import mock
import warnings

from absl.testing import absltest
import numpy as np

from identity_tf import configs
from identity_tf import errors
from identity_tf import studies
from identity_tf.data import datasets
from identity_tf.data import synthetic
from identity_tf.training import checkpoints
from identity_tf.training import evaluation
from identity_tf.training import metrics
from identity_tf.training import results_tables
from identity_tf.training import study
import testing

_TINY = (("width", 0.0625), ("batch_size", 32), ("num_eval_examples", 64))
TINY_STUDY = studies.Study(
    "tiny", "two arms of the smoke preset",
    arms=(
        studies.Arm("smoke", "smoke", _TINY, description="as it is"),
        # A rate that diverges at once: exp(5) times the smoke preset's.
        studies.Arm("huge/lr", "smoke", _TINY + (("learning_rate", 1.5),),
                    description="diverges"),
    ))


def _run(seed, status, top1, nan_step=None, minutes=2.0, rate=None,
         machines=None, train_set=None):
  steps = [100 * (i + 1) for i in range(len(top1))]
  # Reached at the first evaluation at or above the level, 1 s per step
  # undisturbed, 1.5 s as it ran.
  reached = {str(level): next(
      ({"step": s, "wall_seconds": 1.5 * s, "estimated_seconds": float(s)}
       for s, t in zip(steps, top1) if t >= level), None)
             for level in study.TOP1_LEVELS}
  return {"seed": seed, "status": status, "nan_step": nan_step,
          "wall_seconds": 60 * minutes, "model_dir": "x",
          "images_per_second": rate, "time_to_top1": reached,
          "machines": dict(machines or {}),
          "final_top1": top1[-1] if status == "done" else None,
          "best_top1": max(top1) if top1 else None,
          "train_set": train_set,
          "curves": {"train_loss": [[s, 2.0 / s] for s in steps],
                     "test_top1": [[s, t] for s, t in zip(steps, top1)]}}


MADE_UP = {
    "study": "made_up", "description": "for the writer",
    "arms": [
        {"name": "literal", "description": "as written", "runs": [
            _run(0, "diverged", [], nan_step=160, minutes=0.5)]},
        {"name": "clip", "description": "clipped", "runs": [
            _run(0, "done", [0.80, 0.9120], rate=100.0,
                 machines={"A": 100.0},
                 train_set={"loss": 0.20, "top1": 0.93}),
            _run(1, "done", [0.82, 0.9050], rate=110.0,
                 machines={"B": 110.0},
                 train_set={"loss": 0.22, "top1": 0.92}),
            # Resumed on another machine, slower there.
            _run(2, "done", [0.86, 0.9180], rate=120.0,
                 machines={"A": 140.0, "B": 61.4},
                 train_set={"loss": 0.30, "top1": 0.91})]},
        {"name": "half", "description": "one seed left", "runs": [
            _run(0, "done", [0.7, 0.85],
                 train_set={"loss": 0.5, "top1": 0.8}),
            _run(1, "running", [0.6], minutes=0.5)]},
    ]}


def _without_model_dirs(results):
  """Each arm's runs in RESULTS without their model_dir: what two reports
  of the same runs from different directories share."""
  return [[{k: v for k, v in run.items() if k != "model_dir"}
           for run in arm["runs"]] for arm in results["arms"]]


class ReportTest(absltest.TestCase):

  def test_markdown_table(self):
    rows = study.markdown_table(MADE_UP).splitlines()
    self.assertLen(rows, 2 + 3)
    # Columns: name, what, seeds, final, best, training-set loss and top-1,
    # NaN step, wall time, images/s, minutes to 85 / 90 / 92 % as run and
    # undisturbed.
    literal, clip, half = (row.strip("| ").split(" | ") for row in rows[2:])
    self.assertEqual(literal[3:5], ["--", "--"])   # No evaluation before NaN.
    self.assertEqual(literal[5:], ["--", "--", "160", "0.5 min", "--",
                                   "-- / -- / --", "-- / -- / --"])
    finals = [0.9120, 0.9050, 0.9180]
    self.assertEqual(
        clip[3], f"{100 * statistics.mean(finals):.2f} ± "
        f"{100 * statistics.stdev(finals):.2f} (91.20, 90.50, 91.80)")
    losses, fitted = [0.20, 0.22, 0.30], [93, 92, 91]
    # Sample standard deviations (n - 1), Python's statistics.stdev.
    self.assertEqual(clip[5], f"{statistics.mean(losses):.4f} ± "
                     f"{statistics.stdev(losses):.4f}")
    self.assertEqual(clip[6], f"{statistics.mean(fitted):.2f} ± "
                     f"{statistics.stdev(fitted):.2f}")
    self.assertEqual(clip[7:9], ["none", "2.0 min per seed"])
    self.assertEqual(clip[9], "110")
    # 85 %: steps 200, 200, 100 at 1 s each; 92 %: none reached it.
    self.assertEqual(clip[10],
                     f"{1.5 * 500 / 3 / 60:.1f} / {1.5 * 200 / 60:.1f} / --")
    self.assertEqual(clip[11], f"{500 / 3 / 60:.1f} / {200 / 60:.1f} / --")
    self.assertEqual(half[3], "85.00, --")  # No mean over a missing value.
    self.assertEqual(half[5:7], ["0.5000 (1/2)", "80.00 (1/2)"])
    self.assertEqual(half[7], "1 unfinished")
    self.assertEqual(half[8], "2.0 min per seed")  # Finished runs only.
    self.assertEqual(half[11], f"{200 / 60:.1f} (1/2) / -- / --")

  def test_report_files(self):
    output_dir = self.create_tempdir().full_path
    paths = study.write_report(dict(MADE_UP, dataset="fashion_mnist"),
                               output_dir)
    with open(paths[study.RESULTS_JSON]) as f:
      self.assertEqual(json.load(f)["arms"][1]["runs"][2]["final_top1"],
                       0.9180)
    with open(paths[study.RESULTS_MARKDOWN]) as f:
      text = f.read()
    self.assertIn("- dataset: fashion_mnist", text)
    self.assertIn(study.markdown_table(MADE_UP), text)
    # Each run under the machines it trained on, with its speed there; runs
    # from before the machine was recorded say so.
    self.assertIn("images/s and minutes measured on:\n\n"
                  "- not recorded: literal seed 0, half seed 0, half seed 1\n"
                  "- A: clip seed 0 (100 images/s), clip seed 2 (140 images/s)\n"
                  "- B: clip seed 1 (110 images/s), clip seed 2 (61 images/s)\n",
                  text)
    self.assertEqual(study.machines_note({"arms": [MADE_UP["arms"][0]]}), "")
    # A run not started trained nowhere: not under "not recorded"; one
    # stopped half-way did train (and is pending as well); one that ended
    # before its first progress line trained there at no measured speed.
    not_started = {"name": "later", "runs": [
        _run(0, "done", [0.5], machines={"A": 90.0}),
        _run(1, "pending", []),
        _run(2, "pending", [0.6], machines={"B": 80.0}),
        _run(3, "diverged", [], machines={"B": None})]}
    self.assertEqual(study.machines_note({"arms": [not_started]}),
                     "images/s and minutes measured on:\n\n"
                     "- A: later seed 0 (90 images/s)\n"
                     "- B: later seed 2 (80 images/s), later seed 3 "
                     "(no speed measured)\n")
    with open(paths[study.CURVES_PNG], "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertGreater(os.path.getsize(paths[study.CURVES_PNG]), 10_000)


class Top1RangeTest(absltest.TestCase):
  """The figure's top-1 axis shows the end of the runs, in %."""

  def test_the_range_holds_every_late_point_and_not_the_first_epochs(self):
    results = {"arms": [
        {"name": "a", "runs": [_run(0, "done", [0.10, 0.85, 0.920, 0.930]),
                               _run(1, "done", [0.20, 0.87, 0.924, 0.934])]},
        {"name": "b", "runs": [_run(0, "done", [0.50, 0.90, 0.915, 0.928])]},
        {"name": "diverged", "runs": [_run(0, "diverged", [])]}]}
    low, high = study.top1_range(results)
    # Steps 200-400 are the second half of 400: a's means (86.0, 92.2,
    # 93.2) and b's points (90.0, 91.5, 92.8), in %; step 100 is not.
    late = [86.0, 92.2, 93.2, 90.0, 91.5, 92.8]
    self.assertLess(low, min(late))
    self.assertGreater(high, max(late))
    self.assertGreater(low, 50.0)  # b's first point, 50 %, is cut off.
    self.assertAlmostEqual(high - low, 1.5 * (93.2 - 86.0))
    self.assertIsNone(study.top1_range({"arms": [
        {"name": "diverged", "runs": [_run(0, "diverged", [])]}]}))
    # Near 100 % the axis stops at 100.
    self.assertEqual(study.top1_range({"arms": [
        {"name": "c", "runs": [_run(0, "done", [0.999, 0.9995])]}]})[1],
                     100.0)


class CurvesFigureTest(absltest.TestCase):
  """The curves figure shows each seed, and the held-out images' top-1
  where a study holds them out."""

  def _drawn(self, results):
    """[(panel's y label, ys, linewidth)] of every line plot_curves draws."""
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import axes as axes_lib  # pylint: disable=g-import-not-at-top
    drawn = []
    original = axes_lib.Axes.plot

    def plot(axes, xs, ys, *args, **kwargs):
      lines = original(axes, xs, ys, *args, **kwargs)
      drawn.append((axes, list(ys), lines[0].get_linewidth()))
      return lines

    with mock.patch.object(axes_lib.Axes, "plot", plot):
      study.plot_curves(results, os.path.join(
          self.create_tempdir().full_path, "curves.png"))
    return [(axes.get_ylabel(), ys, width) for axes, ys, width in drawn]

  def test_each_seed_is_a_thin_line_under_the_mean(self):
    runs = [_run(0, "done", [0.80, 0.90]), _run(1, "done", [0.70, 0.94])]
    drawn = self._drawn({"study": "s", "arms": [{"name": "a", "runs": runs}]})
    top1 = [(ys, width) for label, ys, width in drawn
            if label == "test top-1 (%)"]
    # Each seed's own points, thinner than the mean's line.
    self.assertEqual(sorted(ys for ys, _ in top1),
                     sorted([[70.0, 94.0], [75.0, 92.0], [80.0, 90.0]]))
    mean_width = dict((tuple(ys), w) for ys, w in top1)[(75.0, 92.0)]
    self.assertLess(dict((tuple(ys), w) for ys, w in top1)[(80.0, 90.0)],
                    mean_width)
    # One seed: its line alone.
    drawn = self._drawn({"study": "s", "arms": [{"name": "a",
                                                  "runs": runs[:1]}]})
    self.assertEqual([ys for label, ys, _ in drawn if "top-1" in label],
                     [[80.0, 90.0]])

  def test_a_run_that_diverged_before_any_point_is_named(self):
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import axes as axes_lib  # pylint: disable=g-import-not-at-top
    early = _run(0, "diverged", [], nan_step=18)
    early["curves"]["train_loss"] = []
    texts = []
    original = axes_lib.Axes.text
    def text(axes, x, y, words, *args, **kwargs):
      texts.append((axes.get_ylabel(), words))
      return original(axes, x, y, words, *args, **kwargs)
    with mock.patch.object(axes_lib.Axes, "text", text), \
        warnings.catch_warnings():
      warnings.simplefilter("error")  # No empty legend.
      study.plot_curves(
          {"study": "s", "arms": [{"name": "big", "runs": [early]}]},
          os.path.join(self.create_tempdir().full_path, "curves.png"))
    self.assertEqual(texts, [("training loss", "diverged before its first "
                              "progress line:\nbig seed 0 (step 18)")])

  def test_a_study_holding_images_out_draws_their_top1(self):
    runs = [_run(0, "done", [0.80, 0.90]), _run(1, "done", [0.70, 0.94])]
    for run, held_out in zip(runs, ([0.5, 0.6], [0.7, 0.8])):
      run["curves"]["validation_top1"] = [[100, held_out[0]],
                                          [200, held_out[1]]]
      run["curves"]["test_top1"] = [[200, run["final_top1"]]]
    results = {"study": "s", "arms": [{"name": "a", "runs": runs}]}
    self.assertEqual(study.top1_key(results), "validation_top1")
    drawn = self._drawn(results)
    self.assertFalse([1 for label, _, _ in drawn if "test" in label])
    self.assertIn([60.0, 70.0], [ys for label, ys, _ in drawn
                                 if label == "held-out top-1 (%)"])
    self.assertLess(study.top1_range(results, "validation_top1")[0], 60.0)


class PairedDifferenceTest(absltest.TestCase):
  """identity_tf.training.statistics against hand computations."""

  def test_t_quantiles_are_the_closed_forms_and_the_integral(self):
    t_stat = study.statistics
    for p in (0.975, 0.9, 0.6):
      # df = 1 (Cauchy): tan(pi (p - 1/2)); df = 2: F(t) = 1/2 +
      # t / (2 sqrt(2 + t^2)), so t = a sqrt(2 / (1 - a^2)), a = 2p - 1.
      self.assertAlmostEqual(t_stat.t_quantile(p, 1),
                             math.tan(math.pi * (p - 0.5)), places=8)
      a = 2 * p - 1
      self.assertAlmostEqual(t_stat.t_quantile(p, 2),
                             a * math.sqrt(2 / (1 - a * a)), places=8)
      self.assertAlmostEqual(t_stat.t_quantile(1 - p, 2),
                             -a * math.sqrt(2 / (1 - a * a)), places=8)
    # df = 3, 4, 7: the density integrated numerically (Simpson) up to the
    # quantile gives p.
    for df in (3, 4, 7):
      t = t_stat.t_quantile(0.975, df)
      constant = math.gamma((df + 1) / 2) / (
          math.sqrt(df * math.pi) * math.gamma(df / 2))
      density = lambda x: constant * (1 + x * x / df) ** (-(df + 1) / 2)  # pylint: disable=cell-var-from-loop
      n = 20_000
      h = t / n
      integral = h / 3 * sum(
          (1 if i in (0, n) else 4 if i % 2 else 2) * density(i * h)
          for i in range(n + 1))
      self.assertAlmostEqual(0.5 + integral, 0.975, places=8)
    # Many degrees of freedom: the normal's 1.95996.
    self.assertAlmostEqual(t_stat.t_quantile(0.975, 100_000), 1.959964,
                           places=4)

  def test_paired_difference_of_three_seeds_by_hand(self):
    ours = {0: 0.9352, 1: 0.9300, 2: 0.9400, 5: 0.5}
    theirs = {0: 0.9366, 1: 0.9317, 2: 0.9372, 3: 0.9}
    result = study.statistics.paired_difference(ours, theirs)
    differences = [0.9352 - 0.9366, 0.9300 - 0.9317, 0.9400 - 0.9372]
    self.assertEqual(result["seeds"], [0, 1, 2])  # Only the shared ones.
    np_mean = sum(differences) / 3
    sd = statistics.stdev(differences)
    # t(0.975, 2) = 0.95 sqrt(2 / (1 - 0.95^2)) = 4.3027.
    half = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2)) * sd / math.sqrt(3)
    self.assertAlmostEqual(result["mean"], np_mean, places=12)
    self.assertAlmostEqual(result["std"], sd, places=12)
    self.assertAlmostEqual(result["half_width"], half, places=9)
    self.assertEqual(
        study.statistics.wording(result),
        f"level with (difference {100 * np_mean:+.2f} point, 95 % interval "
        f"{100 * (np_mean - half):+.2f} to {100 * (np_mean + half):+.2f}, "
        "3 seeds)")
    ahead = study.statistics.paired_difference(
        {0: 0.95, 1: 0.951, 2: 0.949}, {0: 0.94, 1: 0.94, 2: 0.94})
    self.assertTrue(study.statistics.wording(ahead).startswith(
        "ahead by 1.00 point (95 % interval +0.75 to +1.25"))
    behind = study.statistics.paired_difference(
        {0: 0.93, 1: 0.931}, {0: 0.94, 1: 0.94})
    self.assertTrue(study.statistics.wording(behind).startswith(
        "behind by 0.95 point"))
    one = study.statistics.paired_difference({0: 0.94}, {0: 0.9424})
    self.assertIsNone(one["interval"])
    self.assertEqual(study.statistics.wording(one), "-0.24 points (one seed)")
    self.assertIsNone(study.statistics.paired_difference({1: 0.9}, {0: 0.9}))

  def test_the_report_compares_every_arm_with_the_reference(self):
    results = dict(MADE_UP, reference="clip")
    results["arms"] = [dict(arm) for arm in MADE_UP["arms"]]
    for arm in results["arms"]:
      arm["against_reference"] = study.compare(results, "clip").get(
          arm["name"])
    rows = study.markdown_table(results).splitlines()
    self.assertIn("| against clip (paired by seed) |", rows[0])
    literal, clip, half = (row.strip("| ").split(" | ") for row in rows[2:])
    self.assertEqual(clip[4], "(reference)")
    # literal diverged at the one seed clip finished: said, not "no seed".
    self.assertEqual(literal[4], "not compared: diverged at seed 0 (NaN at "
                     "step 160), where the reference finished")
    # half's seed 0: 85.00 against clip's 91.20.
    self.assertEqual(half[4], f"{85.00 - 91.20:+.2f} points (one seed)")


class TimeToLevelsTest(absltest.TestCase):

  def test_wall_time_is_summed_over_sessions_up_to_the_evaluation(self):
    records = [
        {"step": 0, "start": True, "time": 1000.0, "machine": "X"},
        {"step": 100, "loss": 1.0, "images_per_second": 50.0, "time": 1010.0},
        {"step": 100, "eval": {"top1": 0.86}, "time": 1012.0},
        {"step": 200, "loss": 0.9, "images_per_second": 70.0, "time": 1030.0},
        # Killed; resumed from step 100 an hour later.
        {"step": 100, "start": True, "time": 5000.0, "machine": "Y"},
        {"step": 200, "loss": 0.9, "images_per_second": 90.0, "time": 5020.0},
        {"step": 200, "eval": {"top1": 0.91}, "time": 5025.0},
        # //bin:evaluate's records do not count.
        {"step": 200, "eval": {"top1": 0.95}, "source": "evaluate",
         "time": 6000.0},
    ]
    reached = metrics.time_to_levels(records, (0.85, 0.9, 0.92))
    self.assertEqual(reached[0.85], {"step": 100, "wall_seconds": 12.0})
    # 30 s in the first session, 25 s in the second.
    self.assertEqual(reached[0.9], {"step": 200, "wall_seconds": 55.0})
    self.assertIsNone(reached[0.92])
    self.assertEqual(metrics.images_per_second(records), 70.0)
    # The training time of the run: //bin:evaluate's later record adds none.
    self.assertEqual(metrics.wall_seconds(records), 55.0)
    # Each machine's speed from its own windows: X's 50 and 70, Y's 90.
    self.assertEqual(metrics.machines(records + records),
                     {"X": 60.0, "Y": 90.0})
    self.assertEqual(list(metrics.machines(records[4:] + records)),
                     ["Y", "X"])
    # A run that holds images out: the levels of its held-out evaluations,
    # not of the test split's one evaluation at the end.
    held_out = [dict(r) for r in records[:7]]
    held_out[2] = {"step": 100, "validation": {"top1": 0.93},
                   "time": 1012.0}
    held_out[6] = {"step": 200, "eval": {"top1": 0.99}, "time": 5025.0}
    self.assertEqual(metrics.time_to_levels(held_out, (0.92,), "validation"),
                     {0.92: {"step": 100, "wall_seconds": 12.0}})
    self.assertEqual(metrics.time_to_levels(held_out, (0.92,)),
                     {0.92: {"step": 200, "wall_seconds": 55.0}})


class MetricsFileTest(absltest.TestCase):

  def test_a_line_cut_short_by_a_kill_costs_only_itself(self):
    model_dir = self.create_tempdir().full_path
    path = os.path.join(model_dir, metrics.METRICS_FILE)
    first = {"step": 0, "start": True, "time": 1000.0}
    window = {"step": 100, "loss": 1.0, "images_per_second": 50.0,
              "time": 1010.0}
    with open(path, "w") as f:
      f.write(json.dumps(first) + "\n" + json.dumps(window) + "\n"
              + '{"step": 200, "loss": 0.')  # Killed mid-write.
    with metrics.MetricsWriter(model_dir) as writer:
      writer.start(100, machine="Y")
      writer.train({"step": 150, "loss": 0.5}, {})
    records = metrics.read(model_dir)
    self.assertEqual(records[:2], [first, window])
    self.assertEqual([(r["step"], r.get("start")) for r in records[2:]],
                     [(100, True), (150, None)])
    # The writer does not mend a file that ends whole.
    with open(path) as f:
      self.assertEqual(f.read().count("\n"), 5)


class TimeToTop1Test(absltest.TestCase):

  def test_time_to_each_level_comes_from_metrics_jsonl(self):
    # Two sessions: 40 s to step 100, then resumed at 100 for 45 s more.
    records = [{"step": 0, "start": True, "time": 0.0},
               {"step": 100, "loss": 0.5, "images_per_second": 64.0,
                "train_steps": 300, "time": 35.0},
               {"step": 100, "eval": {"top1": 0.86}, "time": 40.0},
               {"step": 100, "start": True, "time": 1000.0},
               {"step": 300, "loss": 0.3, "images_per_second": 64.0,
                "train_steps": 300, "time": 1040.0},
               {"step": 300, "eval": {"top1": 0.91}, "time": 1045.0}]
    reached = study._time_to_top1(records, 64.0, {"batch_size": 32})
    # Undisturbed: step x 32 images / 64 images/s.
    self.assertEqual(reached["0.85"], {"step": 100, "wall_seconds": 40.0,
                                       "estimated_seconds": 50.0})
    self.assertEqual(reached["0.9"], {"step": 300, "wall_seconds": 85.0,
                                      "estimated_seconds": 150.0})
    self.assertIsNone(reached["0.92"])
    # A run that holds images out: its held-out evaluations, where the test
    # split's one evaluation at the end would say step 300 for every level.
    held_out = records[:2] + [{"step": 100, "validation": {"top1": 0.93},
                               "time": 40.0}] + records[3:5] + [
                                   {"step": 300, "validation": {"top1": 0.94},
                                    "eval": {"top1": 0.99}, "time": 1045.0}]
    reached = study._time_to_top1(held_out, 64.0, {"batch_size": 32})
    self.assertEqual(reached["0.92"], {"step": 100, "wall_seconds": 40.0,
                                       "estimated_seconds": 50.0})


class RunStatusTest(absltest.TestCase):
  """How a run ended comes from its metrics.jsonl; a run of a study from
  before that, from its study.json."""

  def test_the_last_session_says_how_the_run_stands(self):
    start = {"step": 0, "start": True, "time": 0.0}
    window = {"step": 10, "loss": 1.0, "train_steps": 20, "time": 5.0}
    self.assertIsNone(metrics.status([]))
    self.assertEqual(metrics.status([start, window])["status"], "started")
    self.assertEqual(
        metrics.status([start, {"step": 10, "stopped": "SIGTERM"}])["status"],
        "stopped")
    diverged = {"step": 15, "diverged": True, "nan_step": 13, "time": 6.0}
    self.assertEqual(metrics.status([start, window, diverged]),
                     {"status": "diverged", "nan_step": 13})
    done = {"step": 20, "done": True, "time": 9.0}
    self.assertEqual(metrics.status([start, window, done]),
                     {"status": "done", "nan_step": None})
    # Resumed by hand after it had finished: running again.
    self.assertEqual(metrics.status([start, done, dict(start, step=20)]
                                    )["status"], "started")

  def _legacy_run(self, state):
    """A study's run directory as the code before metrics.jsonl's end
    records left it: a session's records, no "done" or "diverged", and the
    study.json that said how it ended."""
    model_dir = self.create_tempdir().full_path
    with open(os.path.join(model_dir, metrics.METRICS_FILE), "w") as f:
      for record in [{"step": 0, "start": True, "time": 100.0},
                     {"step": 10, "loss": 1.5, "train_steps": 20,
                      "images_per_second": 10.0, "time": 110.0},
                     {"step": 20, "loss": 1.25, "train_steps": 20,
                      "images_per_second": 10.0, "time": 120.0},
                     {"step": 20, "eval": {"top1": 0.5}, "time": 125.0}]:
        f.write(json.dumps(record) + "\n")
    with open(os.path.join(model_dir, "study.json"), "w") as f:
      json.dump(state, f)
    return model_dir

  def test_a_run_finished_before_the_end_records_is_reported_and_skipped(self):
    for state in ({"status": "done", "nan_step": None, "wall_seconds": 30.0},
                  {"status": "diverged", "nan_step": 17,
                   "wall_seconds": 30.0}):
      with self.subTest(state["status"]):
        model_dir = self._legacy_run(state)
        # The wall time is metrics.jsonl's: 125 s - 100 s.
        self.assertEqual(
            study.run_status(model_dir, metrics.read(model_dir)),
            {"status": state["status"], "nan_step": state["nan_step"],
             "wall_seconds": 25.0})
        lines = []
        study._train_run(None, model_dir, "[1/1] old", None, lines.append)
        self.assertEqual(lines, [f"[1/1] old: {state['status']} earlier, "
                                 "skipped"])
        run, _ = study._run_results(model_dir, 0)
        self.assertEqual(run["curves"], {"train_loss": [[10, 1.5],
                                                        [20, 1.25]],
                                         "test_top1": [[20, 0.5]],
                                         "validation_top1": []})

  def test_a_run_without_an_end_is_pending(self):
    model_dir = self.create_tempdir().full_path
    self.assertEqual(study.run_status(model_dir, []),
                     {"status": "pending", "nan_step": None,
                      "wall_seconds": 0.0})


class SettingsTest(absltest.TestCase):

  def test_the_header_is_what_the_runs_trained_with(self):
    def arm(*settings):
      return {"runs": [{"settings": x} for x in settings]}
    self.assertIsNone(study._settings({"arms": [arm(None, None)]}))
    a = {"dataset": "fashion_mnist", "epochs": 10.0, "width": 0.25,
         "precision": "float32"}
    b = dict(a, width=0.125)
    c = dict(a, precision="mixed_bfloat16")
    self.assertEqual(study._settings({"arms": [arm(None, a), arm(a)]}), a)
    self.assertEqual(study._settings({"arms": [arm(a), arm(b, a)]}),
                     dict(a, width="0.25, 0.125"))
    self.assertEqual(study._settings({"arms": [arm(a), arm(c)]}),
                     dict(a, precision="float32, mixed_bfloat16"))


class RunConfigTest(absltest.TestCase):

  def test_a_budget_too_short_for_the_drops_names_epochs(self):
    arm = studies.Arm("clip", "cifar10_paper", ())
    # 10,000 examples in batches of 128: 78.125 steps an epoch. The drops at
    # 30k and 50k of 70k steps: 3/7 and 5/7 of the budget, which round to
    # the same step below 5 steps (2 steps: 0.857 and 1.43 both give 1).
    with self.assertRaisesRegex(
        ValueError, r"^--epochs=0.02 is 2 steps of clip, too few .* give "
        r"--epochs=0.04 or more$"):
      study.run_config(arm, 0, dataset="synthetic", epochs=0.02,
                       num_train_examples=10_000)
    # The budget named works: ceil(0.04 x 78.125) = 4 steps, drops at
    # 4 x 3/7 = 1.7 and 4 x 5/7 = 2.9.
    self.assertEqual(study.run_config(
        arm, 0, dataset="synthetic", epochs=0.04,
        num_train_examples=10_000).lr_boundaries, (2, 3))

  def test_the_budget_scales_the_schedule(self):
    arm = studies.Arm("clip", "cifar10_paper_literal",
                      (("grad_clip_norm", 1.0),))
    config = study.run_config(arm, 2, dataset="fashion_mnist", epochs=10,
                              num_train_examples=60_000, width=0.25)
    steps = -(-10 * 60_000 // 128)  # ceil: 4688.
    self.assertEqual(config.train_steps, steps)
    # 30k and 50k of the paper's 70k steps.
    self.assertEqual(config.lr_boundaries,
                     (round(30_000 * steps / 70_000),
                      round(50_000 * steps / 70_000)))
    self.assertEqual((config.eval_steps, config.checkpoint_steps), (469, 469))
    self.assertEqual((config.seed, config.width, config.dataset,
                      config.grad_clip_norm), (2, 0.25, "fashion_mnist", 1.0))
    self.assertEqual(config.learning_rate, 0.05)  # The preset's own.

  def test_precision_applies_to_every_arm_that_does_not_set_its_own(self):
    keeps = studies.Arm("clip", "cifar10_paper", ())
    own = studies.Arm("clip_bf16", "cifar10_paper",
                      (("precision", "mixed_float16"),))
    def precision(arm, value):
      return study.run_config(arm, 0, dataset="fashion_mnist", epochs=1,
                              num_train_examples=60_000,
                              precision=value).precision
    self.assertEqual(precision(keeps, None),
                     configs.PRESETS["cifar10_paper"].precision)
    self.assertEqual(precision(keeps, "mixed_bfloat16"), "mixed_bfloat16")
    self.assertEqual(precision(own, "mixed_bfloat16"), "mixed_float16")

  def test_every_arm_of_every_study_is_a_valid_run(self):
    # An arm is only built when its study runs: a misspelt field or a bad
    # value would otherwise surface hours into a queue of runs.
    for name, each in studies.STUDIES.items():
      names = [arm.name for arm in each.arms]
      self.assertCountEqual(names, set(names), name)
      for arm in each.arms:
        with self.subTest(study=name, arm=arm.name):
          configs.validate(study.run_config(
              arm, 0, dataset="fashion_mnist", epochs=10,
              num_train_examples=60_000))

  def test_the_runs_started_are_the_seed_directories_there_are(self):
    output_dir = self.create_tempdir().full_path
    for path in ("smoke/seed10", "smoke/seed2", "smoke/seedling",
                 "huge_lr/seed0", "other_arm/seed1"):
      os.makedirs(os.path.join(output_dir, path))
    with open(os.path.join(output_dir, "smoke", "seed3"), "w") as f:
      f.write("a file, not a run")
    by_name = {arm.name: arm for arm in TINY_STUDY.arms}
    self.assertEqual(study.runs_started(TINY_STUDY, output_dir),
                     [(by_name["smoke"], 2), (by_name["smoke"], 10),
                      (by_name["huge/lr"], 0)])
    self.assertEqual(study.runs_started(TINY_STUDY, output_dir, seeds=[10]),
                     [(by_name["smoke"], 10)])
    self.assertEqual(study.runs_started(TINY_STUDY, output_dir,
                                        arms=["huge/lr"], seeds=[2]), [])
    with self.assertRaisesRegex(errors.CheckpointError,
                                "^no run of study tiny has started in "):
      study.collect(TINY_STUDY, self.create_tempdir().full_path)

  def test_unknown_arms_are_named(self):
    for runs in (study.runs_of, functools.partial(
        study.runs_started, output_dir=self.create_tempdir().full_path)):
      with self.assertRaisesRegex(ValueError,
                                  "no arm nope; its arms: smoke"):
        runs(TINY_STUDY, arms=["nope"])
    self.assertEqual(
        [(a.name, s) for a, s in study.runs_of(TINY_STUDY, seeds=[3, 4])],
        [("smoke", 3), ("smoke", 4), ("huge/lr", 3), ("huge/lr", 4)])


class RunStudyTest(absltest.TestCase):

  def test_runs_resume_and_divergence_is_recorded(self):
    output_dir = self.create_tempdir().full_path
    lines = []
    results = study.run_study(TINY_STUDY, output_dir, dataset="synthetic",
                              epochs=0.2, echo=lines.append)
    smoke, huge = results["arms"]
    run = smoke["runs"][0]
    self.assertEqual(run["status"], "done")
    # 0.2 epochs of 10,000 examples in batches of 32: 63 steps, evaluated at
    # the epoch's end (never reached) and at the end.
    self.assertEqual(run["curves"]["test_top1"][-1][0], 63)
    self.assertEqual(run["final_top1"], run["curves"]["test_top1"][-1][1])
    self.assertGreater(run["wall_seconds"], 0)
    self.assertGreater(run["images_per_second"], 0)
    # One session, on this machine: its cores counted here independently.
    [machine] = run["machines"]
    self.assertIn(f", {len(os.sched_getaffinity(0))} cores, bfloat16: ",
                  machine)
    self.assertEqual(set(run["time_to_top1"]),
                     {str(level) for level in study.TOP1_LEVELS})
    # The report's header describes the runs: 63 steps of 10,000 / 32.
    self.assertEqual(study._settings(results),
                     {"dataset": "synthetic", "epochs": round(63 / 312.5, 2),
                      "width": 0.0625, "precision": "float32"})
    diverged = huge["runs"][0]
    self.assertEqual(diverged["status"], "diverged")
    self.assertBetween(diverged["nan_step"], 1, 63)
    self.assertTrue(os.path.isdir(os.path.join(output_dir, "huge_lr",
                                               "seed0")))
    self.assertTrue(any("diverged: " in line and
                        "became NaN or infinite" in line for line in lines))
    self._check_curves_come_from_the_records(output_dir, run)
    self._check_published(output_dir, results)
    self._check_a_second_command(output_dir, results, run)
    self._check_records(output_dir)

  def test_batch_norm_runs_are_also_scored_with_reestimated_statistics(self):
    held, images = 96, 64
    bn_study = studies.Study(
        "tiny_bn", "batch norm and not",
        # Batch norm at a rate it learns something at in a few steps.
        arms=(studies.Arm("bn", "smoke", _TINY + (("model", "resnet_bn"),
                                                  ("learning_rate", 0.1)),
                          description="batch norm"),
              studies.Arm("plain", "smoke", _TINY, description="none")),
        validation_examples=held, test_at_end=False,
        reestimate_batch_norm=images)
    output_dir = self.create_tempdir().full_path
    lines = []
    results = study.run_study(bn_study, output_dir, dataset="synthetic",
                              epochs=0.05, echo=lines.append)
    bn_run, plain_run = (arm["runs"][0] for arm in results["arms"])
    self.assertIsNone(plain_run["batch_norm_reestimated"])
    scores = bn_run["batch_norm_reestimated"]
    steps = bn_run["curves"]["validation_top1"][-1][0]
    # Two batches of the run's 32 training images, on the final weights;
    # the held-out images scored.
    self.assertEqual((scores["step"], scores["batch_norm_images"],
                      scores["examples"]), (steps, images, held))
    # By hand: the first 64 training images the held-out ones leave, in
    # the run's batches, and the held-out images, standardised per image.
    pixels, labels = synthetic.arrays(datasets.synthetic_info().train_split)
    validation, training = datasets.held_out(len(pixels), held)
    def standardized(x):
      x = x.astype(np.float64)
      mean = x.mean(axis=(1, 2, 3), keepdims=True)
      std = np.sqrt(((x - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True))
      return ((x - mean) / np.maximum(std, 1 / np.sqrt(np.prod(
          x.shape[1:])))).astype(np.float32)
    def cross_entropy(logits):
      logits = logits.astype(np.float64)
      shifted = logits - logits.max(axis=1, keepdims=True)
      log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
      return -log_p[np.arange(held), labels[validation]].mean()
    model, _, step = checkpoints.restore_model(
        study.model_dir_of(output_dir, bn_study.arms[0], 0))
    self.assertEqual(step, steps)
    inputs = standardized(pixels[validation])
    moving = cross_entropy(model(inputs, training=False).numpy())
    chosen = standardized(pixels[training[:images]])
    evaluation.reestimate_batch_norm_statistics(model, [chosen[:32],
                                                        chosen[32:]])
    logits = model(inputs, training=False).numpy()
    # The record keeps 4 significant digits.
    self.assertAlmostEqual(scores["loss"], cross_entropy(logits),
                           delta=1e-3 * scores["loss"])
    self.assertAlmostEqual(
        scores["top1"], np.mean(logits.argmax(axis=1) == labels[validation]),
        delta=1e-4)
    # ... and not the moving averages' (short of statistics after 15 steps).
    self.assertGreater(abs(moving - scores["loss"]), 0.01 * scores["loss"])
    self.assertTrue(any("held-out top-1" in line and "re-estimated on 64 "
                        in line for line in lines))
    # The table's column: the batch-norm arm's, none for the other.
    rows = study.markdown_table(results).splitlines()
    column = rows[0].strip("| ").split(" | ").index(
        "validation top-1, batch norm's statistics re-estimated (%)")
    self.assertEqual([row.strip("| ").split(" | ")[column]
                      for row in rows[2:]],
                     [f"{100 * scores['top1']:.2f}", "--"])
    self.assertIn("batch_norm_reestimated", results["splits"])
    # Once: a second command neither trains nor re-estimates.
    again = []
    study.run_study(bn_study, output_dir, dataset="synthetic", epochs=0.05,
                    echo=again.append)
    self.assertEqual(again, ["[1/2] bn seed 0: done earlier, skipped",
                             "[2/2] plain seed 0: done earlier, skipped"])

  def _check_records(self, output_dir):
    # Every finished run's config.json and metrics.jsonl, byte for byte,
    # and nothing else; a run that has not ended is left out.
    pending = study.model_dir_of(output_dir, TINY_STUDY.arms[0], 7)
    os.makedirs(pending)
    with open(os.path.join(pending, metrics.METRICS_FILE), "w") as f:
      f.write(json.dumps({"step": 0, "start": True, "time": 1.0}) + "\n")
    records = self.create_tempdir().full_path
    kept = study.keep_records(TINY_STUDY, output_dir, records)
    finished = [("smoke", "smoke", 0), ("smoke", "smoke", 1),
                ("huge/lr", "huge_lr", 0)]
    self.assertEqual([(arm.name, seed) for arm, seed in kept],
                     [(name, seed) for name, _, seed in finished])
    found = sorted(os.path.relpath(os.path.join(root, name), records)
                   for root, _, names in os.walk(records) for name in names)
    self.assertEqual(found, sorted(
        os.path.join(directory, f"seed{seed}", name)
        for _, directory, seed in finished
        for name in ("config.json", metrics.METRICS_FILE)))
    for name in found:
      with open(os.path.join(records, name), "rb") as copy, open(
          os.path.join(output_dir, name), "rb") as original:
        self.assertEqual(copy.read(), original.read(), name)
    # Restored into an empty directory, on "another machine": nothing
    # trains, and the report is the one the runs themselves give.
    elsewhere = self.create_tempdir().full_path
    lines = []
    again = study.run_study(TINY_STUDY, elsewhere, dataset="synthetic",
                            epochs=0.2, records_dir=records,
                            echo=lines.append)
    self.assertEqual(lines, [
        "smoke seed 0: restored from " + records,
        "smoke seed 1: restored from " + records,
        "huge/lr seed 0: restored from " + records,
        "[1/2] smoke seed 0: done earlier, skipped",
        "[2/2] huge/lr seed 0: diverged earlier, skipped"])
    self.assertEqual(_without_model_dirs(again), _without_model_dirs(
        study.collect(TINY_STUDY, output_dir, seeds=[0, 1])))
    # A run that ends is kept at once, before the study's end.
    collect = study.collect
    def kept_at_end(*args, **kwargs):
      self.assertTrue(os.path.exists(os.path.join(
          records, "smoke", "seed2", metrics.METRICS_FILE)))
      return collect(*args, **kwargs)
    with mock.patch.object(study, "collect", kept_at_end):
      study.run_study(TINY_STUDY, elsewhere, dataset="synthetic", epochs=0.2,
                      arms=["smoke"], seeds=[2], records_dir=records)
    for name in ("config.json", metrics.METRICS_FILE):
      with open(os.path.join(records, "smoke", "seed2", name), "rb") as copy, \
          open(os.path.join(elsewhere, "smoke", "seed2", name), "rb") as run:
        self.assertEqual(copy.read(), run.read(), name)
    # A run started in the output directory is its own: not overwritten;
    # a finished run it lacks is restored.
    with open(os.path.join(pending, metrics.METRICS_FILE)) as f:
      before = f.read()
    shutil.copytree(os.path.join(records, "smoke", "seed0"),
                    os.path.join(records, "smoke", "seed7"))
    self.assertEqual(
        [(arm.name, seed) for arm, seed in
         study.restore_records(TINY_STUDY, records, output_dir)],
        [("smoke", 2)])
    with open(os.path.join(pending, metrics.METRICS_FILE)) as f:
      self.assertEqual(f.read(), before)

  def _check_published(self, output_dir, results):
    # As a result file of docs/results: the same runs, each model_dir
    # relative to the directory given, every machine a run trained on in
    # "cpu", the command under the study's name; the report itself stays.
    before = json.dumps(results, sort_keys=True)
    parent, name = os.path.split(output_dir)
    data = study.published(results, title="Tiny", command="./bazelw run x",
                           base_dir=parent)
    self.assertEqual(json.dumps(results, sort_keys=True), before)
    self.assertEqual(
        [(arm["name"], arm["command"], [r["model_dir"] for r in arm["runs"]])
         for arm in data["arms"]],
        [("smoke", "tiny", [os.path.join(name, "smoke", "seed0")]),
         ("huge/lr", "tiny", [os.path.join(name, "huge_lr", "seed0")])])
    self.assertEqual(data["commands"], {"tiny": "./bazelw run x"})
    self.assertEqual((data["title"], data["source"]),
                     ("Tiny", study.PUBLISHED_BY))
    for arm in data["arms"]:
      for machine in arm["runs"][0]["machines"]:
        self.assertIn(machine, data["cpu"])
    self.assertIs(results_tables.check(data, "tiny.json"), data)
    self.assertEqual(_without_model_dirs(data), _without_model_dirs(results))

  def _check_curves_come_from_the_records(self, output_dir, run):
    # Everything comes from metrics.jsonl: no study.json is written, and
    # without the TensorBoard files the results are the same.
    for arm in ("smoke", "huge_lr"):
      model_dir = os.path.join(output_dir, arm, "seed0")
      self.assertFalse(os.path.exists(os.path.join(model_dir, "study.json")))
      for kind in (metrics.TRAIN_DIR, metrics.EVAL_DIR):
        shutil.rmtree(os.path.join(model_dir, kind), ignore_errors=True)
    # The curves are the progress and evaluation records, read here apart.
    with open(os.path.join(output_dir, "smoke", "seed0",
                           metrics.METRICS_FILE)) as f:
      records = [json.loads(line) for line in f]
    self.assertEqual(run["curves"]["train_loss"],
                     [[r["step"], r["loss"]] for r in records
                      if "images_per_second" in r])
    self.assertEqual(run["curves"]["test_top1"],
                     [[r["step"], r["eval"]["top1"]] for r in records
                      if "eval" in r])
    self.assertTrue(records[-1]["done"])
    # Other levels for the time to accuracy: the first evaluation at or
    # above each, found here from the records (None where none is).
    evaluations = [r for r in records if "eval" in r]
    levels = (0.5, 0.01, 1.0)
    other = study.collect(TINY_STUDY, output_dir, top1_levels=levels)
    self.assertEqual(other["top1_levels"], [0.01, 0.5, 1.0])
    reached = other["arms"][0]["runs"][0]["time_to_top1"]
    for level in levels:
      first = next((r["step"] for r in evaluations
                    if r["eval"]["top1"] >= level), None)
      self.assertEqual((reached[str(level)] or {}).get("step"), first, level)
    self.assertIn("| minutes to 1 / 50 / 100 % (test): wall |",
                  study.markdown_table(other))

  def _check_a_second_command(self, output_dir, results, run):
    # Again: nothing is trained, the results are the same.
    again = []
    self.assertEqual(study.run_study(TINY_STUDY, output_dir,
                                     dataset="synthetic", epochs=0.2,
                                     echo=again.append), results)
    self.assertEqual(again, ["[1/2] smoke seed 0: done earlier, skipped",
                             "[2/2] huge/lr seed 0: diverged earlier, "
                             "skipped"])
    # With another budget the runs there are not the arms' runs: refused,
    # before anything trains, naming the budget (0.4 epochs of 10,000
    # examples in batches of 32: 125 steps).
    with open(os.path.join(output_dir, "smoke", "seed0",
                           metrics.METRICS_FILE)) as f:
      before = f.read()
    with self.assertRaisesRegex(
        errors.ConfigError,
        r"^\[1/2\] smoke seed 0: .* holds a run of other settings than the "
        r"arm's \(.*train_steps \(63 -> 125\).*\); give the study the flags "
        r"that run was started with, a new --output_dir, or move that run "
        r"away$"):
      study.run_study(TINY_STUDY, output_dir, dataset="synthetic", epochs=0.4)
    with open(os.path.join(output_dir, "smoke", "seed0",
                           metrics.METRICS_FILE)) as f:
      self.assertEqual(f.read(), before)
    # A command for one more seed of one arm: its report is still of every
    # run in the directory; --arms and --seeds restrict a report asked for.
    results = study.run_study(TINY_STUDY, output_dir, dataset="synthetic",
                              epochs=0.2, arms=["smoke"], seeds=[1])
    self.assertEqual(
        [(arm["name"], [r["seed"] for r in arm["runs"]])
         for arm in results["arms"]], [("smoke", [0, 1]), ("huge/lr", [0])])
    self.assertEqual(results["arms"][0]["runs"][0], run)
    self.assertEqual(
        [(arm["name"], [r["seed"] for r in arm["runs"]]) for arm in
         study.collect(TINY_STUDY, output_dir, arms=["huge/lr"])["arms"]],
        [("huge/lr", [0])])

  def test_binary_reports_and_refuses_bad_flags(self):
    for bad in ("--epochs=0", "--top1_levels=92"):
      result = testing.run_binary("study", "--study=smoke", bad)
      self.assertEqual(result.returncode, 1)
      self.assertNotIn("Traceback", result.stderr)
    # A repeated float flag's values are each checked (absl's bounds let
    # NaN through).
    result = testing.run_binary("study", "--study=smoke",
                                "--top1_levels=0.5", "--top1_levels=nan")
    self.assertEqual(testing.last_stderr_line(result),
                     "error: --top1_levels must be a finite number, got nan")
    result = testing.run_binary("study", "--study=smoke", "--arms=nope",
                                "--dataset=synthetic", "--report_only",
                                "--output_dir=" +
                                self.create_tempdir().full_path)
    self.assertEqual(testing.last_stderr_line(result),
                     "error: study smoke has no arm nope; its arms: smoke, "
                     "lr_x10, lr_x10_clip")
    # An --output_dir that is a file is named as the flag typed, before
    # anything runs; a report with no run to report says so.
    a_file = self.create_tempfile().full_path
    output_dir = self.create_tempdir().full_path
    for args, line in (
        (["--epochs=0.2", f"--output_dir={a_file}"],
         f"error: --output_dir={a_file} cannot be created (File exists); "
         "give a directory"),
        (["--report_only", f"--output_dir={output_dir}"],
         f"error: no run of study smoke has started in {output_dir}: train "
         "them first (the same command without --report_only)")):
      result = testing.run_binary("study", "--study=smoke",
                                  "--dataset=synthetic", *args)
      self.assertEqual(result.returncode, 1)
      self.assertEqual(testing.last_stderr_line(result), line)
    # A run of another network where an arm's run belongs (an arm
    # redefined since it started) is refused before anything trains.
    [arm] = study.arms_named(studies.STUDIES["smoke"], ["lr_x10_clip"])
    other = configs.override(
        study.run_config(arm, 0, dataset="synthetic", epochs=0.2,
                         num_train_examples=10_000), init="fixup")
    foreign = os.path.join(output_dir, "lr_x10_clip", "seed0")
    os.makedirs(foreign)
    with open(os.path.join(foreign, "config.json"), "w") as f:
      json.dump({"config": configs.to_dict(other),
                 "model": {"name": "cifar10", "options": {}},
                 "preprocessing": {}}, f)
    result = testing.run_binary("study", "--study=smoke", "--epochs=0.2",
                                "--dataset=synthetic",
                                f"--output_dir={output_dir}")
    self.assertEqual(result.returncode, 1)
    self.assertEqual(
        testing.last_stderr_line(result),
        f"error: [3/3] lr_x10_clip seed 0: {foreign} holds a run of other "
        f"settings than the arm's (init ('fixup' -> "
        f"{configs.PRESETS[arm.preset].init!r})); give the study the flags "
        "that run was started with, a new --output_dir, or move that run "
        "away")
    self.assertEqual(os.listdir(output_dir), ["lr_x10_clip"])
    shutil.rmtree(os.path.join(output_dir, "lr_x10_clip"))
    os.makedirs(os.path.join(output_dir, "smoke", "seed0"))
    # --publish needs a title, and a directory that is there, before
    # anything runs; the flag is named as typed.
    published = os.path.join(self.create_tempdir().full_path, "smoke.json")
    for args, line in (
        ([f"--publish={published}"], '--publish needs --title="..."'),
        (["--publish=no_such_dir/x.json", "--title=T"],
         "error: --publish=no_such_dir/x.json: directory "
         f"{os.path.join(os.getcwd(), 'no_such_dir')} does not exist; "
         "create it or give another path")):
      result = testing.run_binary("study", "--study=smoke", "--report_only",
                                  f"--output_dir={output_dir}", *args)
      self.assertEqual(result.returncode, 1)
      self.assertIn(line, result.stderr)
    home = os.path.expanduser("~")
    records = os.path.join(self.create_tempdir().full_path, "records")
    result = testing.run_binary("study", "--study=smoke", "--report_only",
                                "--dataset=synthetic", "--top1_levels=0.9234",
                                "--top1_levels=0.5",
                                f"--output_dir={output_dir}",
                                f"--data_dir={home}/never read",
                                f"--publish={published}",
                                f"--records={records}",
                                "--title=One run, unfinished", check=True)
    self.assertEqual(result.stdout.split("\n")[:-1],
                     [os.path.join(output_dir, name)
                      for name in (study.RESULTS_JSON, study.RESULTS_MARKDOWN,
                                   study.CURVES_PNG)] + [published])
    # The published command trains and reports the runs: the run flags as
    # given, in the order the binary lists them, the home directory as
    # $HOME (outside the quotes of a path with a space); not --publish,
    # --title or --report_only.
    (_, data), = results_tables.load(os.path.dirname(published))[0].items()
    self.assertEqual(data["commands"], {"smoke": (
        "./bazelw run //bin:study -- --study=smoke --dataset=synthetic "
        f"--data_dir=$HOME/'never read' --output_dir={output_dir} "
        f"--top1_levels=0.9234 --top1_levels=0.5 --records={records}")})
    self.assertEqual(data["title"], "One run, unfinished")
    # The records keep finished runs only: the directory, made, is empty.
    self.assertEqual(os.listdir(records), [])
    self.assertIn(f"the records of 0 finished run(s) are in {records}",
                  result.stderr)
    with open(os.path.join(output_dir, study.RESULTS_MARKDOWN)) as f:
      text = f.read()
    # One run has started, and not finished; the arms never run are not
    # in the report.
    self.assertEqual(text.count("| 1 unfinished |"), 1)
    self.assertNotIn("lr_x10", text)
    self.assertIn("| minutes to 50 / 92.34 % (test): wall |", text)


class ResultsTablesTest(absltest.TestCase):
  """bin/results_tables.py on result files made up here, against a hand
  computation (the sample std of statistics.stdev, t(0.975, 2) in closed
  form)."""

  def test_a_table_cell_and_a_paired_difference_by_hand(self):
    results_dir = self.create_tempdir().full_path
    ours = {0: 0.9352, 1: 0.9300, 2: 0.9400}
    theirs = {0: 0.9366, 1: 0.9317, 2: 0.9372}

    def arm(name, top1, losses):
      return {"name": name, "description": name, "runs": [
          {"seed": seed, "status": "done", "final_top1": top1[seed],
           "train_set": {"loss": losses[seed]}} for seed in (0, 1, 2)]}

    files = {
        "tiny": {"title": "Tiny", "cpu": "none", "arms": [
            arm("ours", ours, {0: 0.13, 1: 0.12, 2: 0.11}),
            arm("theirs", theirs, {0: 0.12, 1: 0.125, 2: 0.115}),
            {"name": "pending", "description": "", "runs": []},
            # Diverged at seed 0 (of 0-2; and of 0 only): a paired
            # difference must not drop that seed silently.
            {"name": "broke", "description": "", "runs": [
                {"seed": 0, "status": "diverged", "nan_step": 5,
                 "final_top1": None}] + arm("b", ours, ours)["runs"][1:]},
            {"name": "lost", "description": "", "runs": [
                {"seed": 0, "status": "diverged", "nan_step": 24,
                 "final_top1": None}]}],
                 "comparisons": [["ours", "theirs"], ["broke", "theirs"],
                                 ["lost", "theirs"], ["pending", "theirs"]]},
        # Another file's arm as the reference.
        "other": {"title": "Other", "cpu": "none", "arms": [
            {"name": "diverged", "description": "", "runs": [
                {"seed": 0, "status": "diverged", "nan_step": 17,
                 "final_top1": None}]}],
                  "comparisons": [["tiny:ours", "tiny:theirs"]]},
    }
    for name, data in files.items():
      with open(os.path.join(results_dir, name + ".json"), "w") as f:
        json.dump(data, f)
    result = testing.run_binary("results_tables",
                                f"--results_dir={results_dir}", check=True)
    rows = {line.split(" | ")[0].lstrip("| "): line.strip("| ").split(" | ")
            for line in result.stdout.splitlines() if line.startswith("| ")}
    values = [ours[seed] for seed in (0, 1, 2)]
    self.assertEqual(
        rows["ours"][2],
        f"{100 * statistics.mean(values):.2f} ± "
        f"{100 * statistics.stdev(values):.2f} (93.52, 93.00, 94.00)")
    self.assertEqual(rows["pending"][2], "not yet measured")
    self.assertEqual(rows["diverged"][2], "NaN at step 17")
    differences = [ours[seed] - theirs[seed] for seed in (0, 1, 2)]
    centre = statistics.mean(differences)
    half = (0.95 * math.sqrt(2 / (1 - 0.95 ** 2))
            * statistics.stdev(differences) / math.sqrt(3))
    for row in ("ours - theirs", "tiny:ours - tiny:theirs"):
      self.assertEqual(rows[row][2], "-0.14, -0.17, +0.28")
      self.assertEqual(rows[row][4], f"{100 * (centre - half):+.2f} to "
                                     f"{100 * (centre + half):+.2f}")
      self.assertTrue(rows[row][5].startswith("level with"), rows[row])
    self.assertEqual(rows["broke - theirs"][1], "1, 2")
    self.assertEqual(rows["broke - theirs"][2], "-0.17, +0.28")
    self.assertTrue(rows["broke - theirs"][5].endswith(
        "2 seeds); diverged at seed 0 (NaN at step 5), where the reference "
        "finished"), rows["broke - theirs"])
    # Rows without a pair leave their cells empty: whole lines here.
    lines = result.stdout.splitlines()
    self.assertIn("| lost - theirs | | | | | not compared: diverged at seed 0 "
                  "(NaN at step 24), where the reference finished |  |", lines)
    self.assertIn("| pending - theirs | | | | | not compared (no seed in "
                  "common) |  |", lines)
    result = testing.run_binary("results_tables",
                                f"--results_dir={results_dir}",
                                "--files=tiny,absent")
    self.assertEqual(result.returncode, 1)
    self.assertEqual(testing.last_stderr_line(result),
                     f"error: no absent in {results_dir} (it holds other, "
                     "tiny); fix --files")

  def test_a_bad_value_is_named_and_the_other_tables_print(self):
    results_dir = self.create_tempdir().full_path
    good = {"title": "Good", "cpu": "none", "arms": [
        {"name": "ours", "description": "", "runs": [
            {"seed": 0, "status": "done", "final_top1": 0.93,
             "train_set": {"loss": 0.1}},
            {"seed": 1, "status": "done", "final_top1": 0.92}]}]}
    with open(os.path.join(results_dir, "good.json"), "w") as f:
      json.dump(good, f)

    def run(**fields):
      return {"seed": 2, "status": "done", "final_top1": 0.9, **fields}

    where = "arm ours, seed 2: "
    variants = {
        "a seed twice": ([run(seed=0)], "arm ours, seed 0: the seed is "
                         "listed twice, expected each seed once"),
        "done without a value": (
            [run(final_top1=None)], where + 'the run is "done" but its '
            '"final_top1" is null, expected its test top-1'),
        "NaN": ([run(final_top1=float("nan"))],
                where + '"final_top1" is nan, expected a test top-1 from 0 '
                "to 1"),
        "a string": ([run(best_top1="93.1")], where + '"best_top1" is the '
                     "string '93.1', expected a test top-1 from 0 to 1"),
        "1e308": ([run(final_top1=1e308)],
                  where + '"final_top1" is 1e+308, expected a test top-1'),
        "a negative loss": ([run(train_set={"loss": -0.1})], where +
                            '"train_set.loss" is -0.1, expected a finite '
                            "loss >= 0"),
        "a re-estimated top-1 in %": (
            [run(batch_norm_reestimated={"top1": 83.16})],
            where + '"batch_norm_reestimated.top1" is 83.16, expected a '
            "top-1 from 0 to 1"),
        "a boolean seed": ([run(seed=True)], 'arm ours: a run\'s "seed" is '
                           "true (a boolean), expected a whole number"),
        "an infinite wall time": ([run(wall_minutes=float("inf"))],
                                  where + '"wall_minutes" is inf'),
    }
    for name, (extra, message) in variants.items():
      with self.subTest(name):
        data = json.loads(json.dumps(good))
        data["arms"][0]["runs"] += extra
        path = os.path.join(results_dir, "bad.json")
        with open(path, "w") as f:
          json.dump(data, f)
        files, damaged = results_tables.load(results_dir)
        self.assertEqual(sorted(files), ["good"])
        self.assertStartsWith(damaged["bad"], f"{path}: {message}")
        self.assertNotIn("\n", damaged["bad"])
    # Nested too deep for Python's parser, and not JSON: one line each.
    path = os.path.join(results_dir, "bad.json")
    for text, line in (("[" * 3000 + "]" * 3000,
                        f"{path} is JSON nested too deeply"),
                       ("{", f"cannot read {path} (Expecting")):
      with open(path, "w") as f:
        f.write(text)
      self.assertStartsWith(results_tables.load(results_dir)[1]["bad"], line)
    # The binary: the good file's table, the bad one's line, exit 1; a
    # --files naming only the good one is untouched by the bad one.
    result = testing.run_binary("results_tables",
                                f"--results_dir={results_dir}")
    self.assertEqual(result.returncode, 1)
    self.assertIn("## Good (good.json)", result.stdout)
    self.assertIn(f"error: cannot read {results_dir}/bad.json",
                  result.stderr)
    self.assertNotIn("Traceback", result.stderr)
    alone = testing.run_binary("results_tables",
                               f"--results_dir={results_dir}",
                               "--files=good", check=True)
    self.assertIn("| ours | 0, 1 | 92.50 ± 0.71 (93.00, 92.00) |",
                  alone.stdout)

  def test_a_figure_from_the_curves_a_file_carries(self):
    results_dir = self.create_tempdir().full_path
    curves = {"train_loss": [[1, 2.0], [2, 1.0]],
              "test_top1": [[2, 0.5]]}
    data = {"title": "Tiny", "cpu": "none", "arms": [
        {"name": "ours", "description": "", "runs": [
            {"seed": 0, "status": "done", "final_top1": 0.5,
             "curves": curves},
            # Transcribed without curves: left out of the figure.
            {"seed": 1, "status": "done", "final_top1": 0.6}]},
        {"name": "theirs", "description": "", "runs": [
            {"seed": 0, "status": "done", "final_top1": 0.4,
             "curves": curves}]},
        {"name": "bare", "description": "", "runs": [
            {"seed": 0, "status": "done", "final_top1": 0.4}]}]}
    with open(os.path.join(results_dir, "tiny.json"), "w") as f:
      json.dump(data, f)
    picked = results_tables.curves_of(data, "tiny", ["theirs", "ours"])
    self.assertEqual([arm["name"] for arm in picked["arms"]],
                     ["theirs", "ours"])
    self.assertEqual([run["seed"] for run in picked["arms"][1]["runs"]], [0])
    with self.assertRaisesRegex(ValueError, "no curves of bare .*fix --arms"):
      results_tables.curves_of(data, "tiny", ["ours", "bare"])
    figure = os.path.join(results_dir, "figure.png")
    testing.run_binary("results_tables", f"--results_dir={results_dir}",
                       "--files=tiny", f"--plot={figure}",
                       "--arms=ours,theirs", check=True)
    with open(figure, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    result = testing.run_binary("results_tables",
                                f"--results_dir={results_dir}",
                                f"--plot={figure}", "--arms=ours")
    self.assertEqual(result.returncode, 1)
    self.assertIn("--plot draws one file's arms",
                  testing.last_stderr_line(result))

if __name__ == "__main__":
  absltest.main()
