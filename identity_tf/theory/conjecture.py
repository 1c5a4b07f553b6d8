"""Section 5's conjecture of Hardt & Ma (2017), probed on small instances.

Section 5 conjectures "that a result analogous to Theorem 2.2 is true for the
general non-linear case": near the identity, a residual network's risk has
no critical points other than global minima. A proof is not what this module
offers; it trains small networks and reports what gradient descent does.

Setting (teacher-student, realizable): the dense unit of Section 3,
h -> h + V ReLU(U h + b) (`identity_tf.layers.DenseResidualUnit` for
hidden width m = d), with U in R^{m x d}, b in R^m, V in R^{d x m}. A random
teacher of depth L labels n points x ~ N(0, I_d); a student of the same
family starts from small unit norms ||U|| = ||V|| = s (spectral), b = 0, and
takes full-batch gradient descent on the squared loss. The same starts train
the plain family h -> V ReLU(U h + b) (the identity removed) on a plain
teacher. A zero loss is reachable in both families (the teacher's weights),
so a run that stops above it stopped at a non-global critical point, at a
kink of the ReLU loss, or ran out of steps; `classify` says which.

Losses are relative: the mean squared error divided by that of the family's
zero-weight network (V = 0: the identity for residual, the zero map for
plain), so every run starts near 1 and the two families are comparable.
Float64 throughout.
"""

import json

import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import errors
from identity_tf import files

DTYPE = tf.float64
FAMILIES = ("residual", "plain")
# A loss that fell by less than this fraction over the last quarter of the
# steps has stopped: with ReLU's kinks the gradient need not vanish there.
PLATEAU_DECREASE = 0.01
# Teachers whose targets barely move off the zero-weight network's output
# (e.g. every ReLU dead on every sample) are redrawn, at most this often.
TEACHER_DRAWS = 20
# //bin:conjecture's defaults: about a minute on 2 shared cores
# (docs/conjecture.md).
DEFAULTS = {"depths": (2, 4), "widths": (4, 8), "init_norms": (0.01, 0.1),
            "seeds": 3, "samples": 128, "steps": 5000, "learning_rate": 0.05,
            "teacher_norm": 0.5, "tolerance": 1e-3, "stall_gradient": 1e-6}


# ----------------------------------------------------------------------------
# Weights and the forward pass.

def _spectral(rng, shape, norm):
  """Gaussian matrices (batched over leading axes) of spectral norm NORM."""
  w = rng.standard_normal(shape)
  return w * (norm / np.linalg.norm(w, ord=2, axis=(-2, -1), keepdims=True))


def student_start(rng, depth, width, hidden, norm):
  """(U, b, V) with ||U_i|| = ||V_i|| = NORM for every unit i, b = 0.

  Shapes (L, m, d), (L, m), (L, d, m). NORM = 0 gives V = 0 exactly.
  """
  if norm == 0:
    return (np.zeros((depth, hidden, width)), np.zeros((depth, hidden)),
            np.zeros((depth, width, hidden)))
  return (_spectral(rng, (depth, hidden, width), norm),
          np.zeros((depth, hidden)),
          _spectral(rng, (depth, width, hidden), norm))


def residual_teacher(rng, depth, width, hidden, norm):
  """A residual teacher: ||U_i|| = ||V_i|| = ||b_i|| = NORM, b_i Gaussian."""
  b = rng.standard_normal((depth, hidden))
  b *= norm / np.linalg.norm(b, axis=-1, keepdims=True)
  return (_spectral(rng, (depth, hidden, width), norm), b,
          _spectral(rng, (depth, width, hidden), norm))


def plain_teacher(rng, depth, width, hidden):
  """A plain teacher: U entries N(0, 2/d), V entries N(0, 1/m), b = 0.

  This scale keeps E||h||^2 through each unit (ReLU halves it). Small unit
  norms, as for the residual teacher, would make a plain teacher nearly a
  constant map: each unit multiplies the signal by at most ||V|| ||U||.
  """
  return (rng.standard_normal((depth, hidden, width)) * np.sqrt(2.0 / width),
          np.zeros((depth, hidden)),
          rng.standard_normal((depth, width, hidden)) / np.sqrt(hidden))


def forward(u, b, v, x, identity):
  """Batched networks: h <- IDENTITY h + V_i ReLU(U_i h + b_i), i = 1..L.

  U (B, L, m, d), b (B, L, m), V (B, L, d, m), X (B, n, d), IDENTITY (B,):
  1 for the residual unit, 0 for the plain one (the identity removed).
  """
  h = x
  keep = identity[:, None, None]
  for i in range(u.shape[1]):
    hidden = tf.nn.relu(tf.einsum("bnd,bmd->bnm", h, u[:, i])
                        + b[:, i, None, :])
    h = keep * h + tf.einsum("bnm,bdm->bnd", hidden, v[:, i])
  return h


def preactivations(u, b, v, x, identity):
  """Per unit i, U_i h + b_i at every sample: (B, n, m) tensors, one a unit,
  on the forward pass of `forward`."""
  h = x
  keep = identity[:, None, None]
  found = []
  for i in range(u.shape[1]):
    found.append(tf.einsum("bnd,bmd->bnm", h, u[:, i]) + b[:, i, None, :])
    h = keep * h + tf.einsum("bnm,bdm->bnd", tf.nn.relu(found[-1]), v[:, i])
  return found


def dead_hidden(u, b, v, x, identity):
  """Per network, the hidden ReLUs (over all units) off on every sample.

  Such a ReLU gets no gradient and never turns back on: a network with one
  has fewer usable hidden units than the teacher.
  """
  return sum(tf.reduce_sum(tf.cast(tf.reduce_all(before <= 0, axis=1),
                                   tf.int32), axis=1)
             for before in preactivations(u, b, v, x, identity))


def kink_distance(u, b, v, x, identity):
  """Per network, min |U_i h + b_i| over units, samples and hidden ReLUs:
  how close the weights are to a kink of the loss, where a ReLU switches at
  a training point and the gradient jumps. Descent that converges onto a
  kink drives it to round-off; at a random point it is about the
  pre-activations' scale over n m L, the number of them."""
  return tf.reduce_min(tf.stack([
      tf.reduce_min(tf.abs(before), axis=[1, 2])
      for before in preactivations(u, b, v, x, identity)]), axis=0)


def network(weights, x, residual=True):
  """One network's output on X (n, d); WEIGHTS: (U, b, V), no batch axis."""
  u, b, v = (tf.constant(np.asarray(w, np.float64))[None] for w in weights)
  x = tf.constant(np.asarray(x, np.float64))[None]
  identity = tf.constant([1.0 if residual else 0.0], dtype=DTYPE)
  return forward(u, b, v, x, identity)[0]


def relative_loss(u, b, v, x, y, identity, baseline):
  """Per network: mean((f(x) - y)^2) / BASELINE, shape (B,)."""
  error = forward(u, b, v, x, identity) - y
  return tf.reduce_mean(tf.square(error), axis=[1, 2]) / baseline


def loss_and_gradient(u, b, v, x, y, identity, baseline):
  """(relative losses (B,), [dU, db, dV]) by tf.GradientTape.

  The networks are independent, so the gradient of the summed losses is
  each network's own gradient.
  """
  with tf.GradientTape() as tape:
    tape.watch([u, b, v])
    losses = relative_loss(u, b, v, x, y, identity, baseline)
    total = tf.reduce_sum(losses)
  return losses, tape.gradient(total, [u, b, v])


# ----------------------------------------------------------------------------
# Full-batch gradient descent on a batch of independent networks.

def _unit_norm(u, v):
  """max over units of max(||U_i||, ||V_i||) per network, shape (B,)."""
  def largest(w):
    return tf.reduce_max(tf.linalg.svd(w, compute_uv=False)[..., 0], axis=-1)
  return tf.maximum(largest(u), largest(v))


@tf.function
def _train_chunk(u, b, v, x, y, identity, baseline, learning_rate, count):
  """COUNT steps; per step and network: loss, ||grad||, unit norm, finite."""
  losses = tf.TensorArray(DTYPE, size=count)
  gradients = tf.TensorArray(DTYPE, size=count)
  norms = tf.TensorArray(DTYPE, size=count)
  finite = tf.TensorArray(tf.bool, size=count)
  for t in tf.range(count):
    loss, (du, db, dv) = loss_and_gradient(u, b, v, x, y, identity, baseline)
    squares = (tf.reduce_sum(tf.square(du), axis=[1, 2, 3])
               + tf.reduce_sum(tf.square(db), axis=[1, 2])
               + tf.reduce_sum(tf.square(dv), axis=[1, 2, 3]))
    losses = losses.write(t, loss)
    gradients = gradients.write(t, tf.sqrt(squares))
    norms = norms.write(t, _unit_norm(u, v))
    step = [u - learning_rate * du, b - learning_rate * db,
            v - learning_rate * dv]
    # A network whose step is not finite keeps its weights (and is marked),
    # so that the SVD never sees a NaN.
    ok = tf.math.is_finite(loss) & tf.reduce_all(
        tf.math.is_finite(step[0]), axis=[1, 2, 3]) & tf.reduce_all(
            tf.math.is_finite(step[2]), axis=[1, 2, 3]) & tf.reduce_all(
                tf.math.is_finite(step[1]), axis=[1, 2])
    finite = finite.write(t, ok)
    u = tf.where(ok[:, None, None, None], step[0], u)
    b = tf.where(ok[:, None, None], step[1], b)
    v = tf.where(ok[:, None, None, None], step[2], v)
  return (u, b, v, losses.stack(), gradients.stack(), norms.stack(),
          finite.stack())


def train_batch(task, steps, learning_rate, chunk=500, progress=None):
  """STEPS full-batch gradient steps for every network of TASK (`make_task`).

  Returns arrays with one row per step t = 0..STEPS (the state after t
  steps) and one column per network: "loss" (relative), "gradient"
  (||grad||, all of U, b, V), "unit_norm"; and per network (B,), at the
  end: "dead_hidden" (`dead_hidden`) and "kink_distance"
  (`kink_distance`); "diverged", the first step whose update was not
  finite, -1 if none.
  """
  u, b, v = (tf.constant(task[name]) for name in ("u", "b", "v"))
  fixed = [tf.constant(task[name]) for name in ("x", "y", "identity",
                                                "baseline")]
  rate = tf.constant(learning_rate, dtype=DTYPE)
  parts = {"loss": [], "gradient": [], "unit_norm": [], "finite": []}
  done = 0
  while done < steps:
    count = min(chunk, steps - done)
    u, b, v, *records = _train_chunk(u, b, v, *fixed, rate,
                                     tf.constant(count))
    for name, record in zip(parts, records):
      parts[name].append(record.numpy())
    done += count
    if progress:
      loss = parts["loss"][-1][-1]
      progress(f"  step {done}/{steps}: relative loss from "
               f"{np.nanmin(loss):.2e} to {np.nanmax(loss):.2e}")
  # The state after the last step, in the same columns.
  loss, gradient = loss_and_gradient(u, b, v, *fixed)
  parts["loss"].append(loss.numpy()[None])
  parts["gradient"].append(tf.sqrt(sum(
      tf.reduce_sum(tf.square(g), axis=tf.range(1, tf.rank(g)))
      for g in gradient)).numpy()[None])
  parts["unit_norm"].append(_unit_norm(u, v).numpy()[None])
  parts["finite"].append(np.ones((1, loss.shape[0]), bool))
  result = {name: np.concatenate(value) for name, value in parts.items()}
  finite = result.pop("finite")
  result["diverged"] = np.where(finite.all(axis=0), -1,
                                (~finite).argmax(axis=0))
  x, identity = fixed[0], fixed[2]
  result["dead_hidden"] = dead_hidden(u, b, v, x, identity).numpy()
  result["kink_distance"] = kink_distance(u, b, v, x, identity).numpy()
  return result


# ----------------------------------------------------------------------------
# Tasks: one batch per (depth, width) cell.

def _teacher_targets(draw, x, residual):
  """(teacher, y, baseline): redraws (DRAW()) while the targets equal the
  zero-weight network's output (baseline 0: every ReLU dead)."""
  for _ in range(TEACHER_DRAWS):
    teacher = draw()
    y = network(teacher, x, residual).numpy()
    baseline = float(np.mean(np.square(y - (x if residual else 0.0))))
    if baseline > 1e-20:
      return teacher, y, baseline
  raise errors.ConfigError(
      f"{TEACHER_DRAWS} random teachers in a row compute the "
      "zero-weight network's function; give a larger "
      "--teacher_norm or --hidden")


def make_task(depth, width, hidden, init_norms, seeds, samples, teacher_norm):
  """Every network of one cell, stacked: seeds x init norms x FAMILIES.

  Per seed: X (n, d) ~ N(0, I), a residual and a plain teacher (seeded by
  seed, depth, width, hidden); per (seed, init norm): one start
  (`student_start`) shared by both families. Returns the arrays
  `train_batch` takes plus, per network, "labels" ({"seed", "init_norm",
  "family"}), "teachers" ((U, b, V)) and "teacher_unit_norm".
  """
  columns = {name: [] for name in ("u", "b", "v", "x", "y", "identity",
                                   "baseline", "teacher_unit_norm")}
  labels, teachers = [], []
  for seed in seeds:
    rng = np.random.default_rng([seed, depth, width, hidden])
    x = rng.standard_normal((samples, width))
    targets = {
        "residual": _teacher_targets(lambda: residual_teacher(
            rng, depth, width, hidden, teacher_norm), x, True),
        "plain": _teacher_targets(lambda: plain_teacher(
            rng, depth, width, hidden), x, False)}
    for norm in init_norms:
      start = student_start(np.random.default_rng(
          [seed, depth, width, hidden, 1, int(round(norm * 1e9))]),
                            depth, width, hidden, norm)
      for family in FAMILIES:
        teacher, y, baseline = targets[family]
        for name, value in zip(("u", "b", "v"), start):
          columns[name].append(value)
        columns["x"].append(x)
        columns["y"].append(y)
        columns["identity"].append(1.0 if family == "residual" else 0.0)
        columns["baseline"].append(baseline)
        columns["teacher_unit_norm"].append(max(
            np.linalg.norm(teacher[0], 2, axis=(1, 2)).max(),
            np.linalg.norm(teacher[2], 2, axis=(1, 2)).max()))
        labels.append({"seed": seed, "init_norm": norm, "family": family})
        teachers.append(teacher)
  task = {name: np.asarray(value, np.float64)
          for name, value in columns.items()}
  task["labels"] = labels
  task["teachers"] = teachers
  return task


# ----------------------------------------------------------------------------
# Bookkeeping.

OUTCOMES = ("reached", "stalled_critical", "plateau", "descending",
            "diverged")


def smallest_gradient_on_path(run, tolerance):
  """Per network, (the smallest ||grad|| at a step whose relative loss is
  above TOLERANCE, that step), or (inf, -1) if there is none.

  `classify` reads the last step only; a path that slows down at a
  near-critical point (a saddle, a plateau) and then leaves it shows here.
  """
  above = np.where(run["loss"] > tolerance, run["gradient"], np.inf)
  steps = np.argmin(above, axis=0)
  smallest = above[steps, np.arange(above.shape[1])]
  return smallest, np.where(np.isfinite(smallest), steps, -1)


def classify(run, tolerance, stall_gradient):
  """One outcome (OUTCOMES) per network of a `train_batch` result.

  reached: the relative loss fell to TOLERANCE. Otherwise, at the end:
  stalled_critical: ||grad|| <= STALL_GRADIENT (a critical point with a
  loss that is not near zero); plateau: the loss fell by less than
  PLATEAU_DECREASE over the last quarter of the steps although the gradient
  did not vanish (ReLU's kinks, or a very flat region); descending: still
  falling; diverged: an update was not finite.
  """
  loss, gradient = run["loss"], run["gradient"]
  last = loss.shape[0] - 1
  earlier = loss[last - last // 4]
  outcomes = []
  for j in range(loss.shape[1]):
    if run["diverged"][j] >= 0:
      outcomes.append("diverged")
    elif np.min(loss[:, j]) <= tolerance:
      outcomes.append("reached")
    elif gradient[last, j] <= stall_gradient:
      outcomes.append("stalled_critical")
    elif loss[last, j] >= (1.0 - PLATEAU_DECREASE) * earlier[j]:
      outcomes.append("plateau")
    else:
      outcomes.append("descending")
  return outcomes


def _median_max(values):
  values = [float(v) for v in values]
  if not values:
    return None
  return {"median": float(np.median(values)), "max": max(values)}


def summarize(run, task, columns, outcomes, tolerance, stall_gradient):
  """What one (cell, init norm, family) reports over its seeds (COLUMNS).

  `near_critical_on_path` counts the runs whose gradient fell to
  STALL_GRADIENT at some step with the loss above TOLERANCE (at the start,
  a saddle met on the way, or the end), whether or not they left.
  """
  loss = run["loss"][:, columns]
  reached = [int(np.argmax(loss[:, k] <= tolerance))
             for k in range(loss.shape[1]) if np.min(loss[:, k]) <= tolerance]
  above = np.where(loss > tolerance, run["gradient"][:, columns], np.inf)
  chosen = [outcomes[j] for j in columns]
  path_gradient, path_step = smallest_gradient_on_path(run, tolerance)
  return {
      "runs": len(columns),
      **{outcome: chosen.count(outcome) for outcome in OUTCOMES},
      "reached_fraction": chosen.count("reached") / len(columns),
      "steps_to_tolerance": _median_max(reached),
      "final_loss": _median_max(loss[-1]),
      "final_gradient_norm": _median_max(run["gradient"][-1, columns]),
      "min_gradient_norm_above_tolerance": (
          float(np.min(above)) if np.isfinite(np.min(above)) else None),
      # Per seed: the smallest ||grad|| on the path while the loss was above
      # the tolerance, and its step (null: the loss never was).
      "min_gradient_norm_above_tolerance_by_seed": [
          float(path_gradient[j]) if np.isfinite(path_gradient[j]) else None
          for j in columns],
      "min_gradient_step_by_seed": [int(path_step[j]) for j in columns],
      "near_critical_on_path": int(sum(
          path_gradient[j] <= stall_gradient for j in columns)),
      "path_max_unit_norm": _median_max(
          run["unit_norm"][:, columns].max(axis=0)),
      "teacher_unit_norm": _median_max(task["teacher_unit_norm"][columns]),
      "dead_hidden_by_seed": [int(run["dead_hidden"][j]) for j in columns],
      "kink_distance_by_seed": [float(run["kink_distance"][j])
                                for j in columns],
      "final_losses_by_seed": [float(value) for value in loss[-1]],
  }


# ----------------------------------------------------------------------------
# The probe.

def check_grid(depths, widths, hidden, init_norms, seeds, samples, steps,
               learning_rate, teacher_norm, tolerance, stall_gradient):
  """ValueError naming the flag of the first setting out of range."""
  checks = (
      ("--depths", depths and all(l >= 1 for l in depths), "integers >= 1"),
      ("--widths", widths and all(d >= 1 for d in widths), "integers >= 1"),
      ("--hidden", hidden is None or hidden >= 1, ">= 1"),
      ("--init_norms", init_norms and all(0 <= s < np.inf
                                          for s in init_norms),
       "finite numbers >= 0"),
      ("--seeds", seeds >= 1, ">= 1"),
      ("--samples", samples >= 1, ">= 1"),
      ("--steps", steps >= 1, ">= 1"),
      ("--learning_rate", learning_rate > 0, "> 0"),
      ("--teacher_norm", teacher_norm > 0, "> 0"),
      ("--tolerance", tolerance > 0, "> 0"),
      ("--stall_gradient", stall_gradient >= 0, ">= 0"))
  for flag, ok, wanted in checks:
    if not ok:
      raise errors.ConfigError(f"{flag} must be {wanted}")


def run_probe(depths, widths, init_norms, seeds, samples, steps,
              learning_rate, teacher_norm, tolerance, stall_gradient,
              hidden=None, progress=None):
  """The probe on the grid DEPTHS x WIDTHS x INIT_NORMS, seeds 0..SEEDS-1.

  HIDDEN: the hidden width m (default: the width d, DenseResidualUnit's).
  Returns (report, curves): report["cells"] has one entry per (L, d, s)
  with `summarize` for each family; report["totals"] counts outcomes per
  family; curves = [(label, relative loss per step)] for `plot_probe`.
  """
  check_grid(depths, widths, hidden, init_norms, seeds, samples, steps,
             learning_rate, teacher_norm, tolerance, stall_gradient)
  say = progress or (lambda message: None)
  cells, curves = [], []
  totals = {family: dict.fromkeys(OUTCOMES, 0) for family in FAMILIES}
  near_critical = dict.fromkeys(FAMILIES, 0)
  for depth in depths:
    for width in widths:
      m = width if hidden is None else hidden
      say(f"L = {depth}, d = {width}, m = {m}: {seeds} seeds x "
          f"{len(init_norms)} init norms x {len(FAMILIES)} families")
      task = make_task(depth, width, m, init_norms, range(seeds), samples,
                       teacher_norm)
      run = train_batch(task, steps, learning_rate, progress=say)
      outcomes = classify(run, tolerance, stall_gradient)
      for j, label in enumerate(task["labels"]):
        totals[label["family"]][outcomes[j]] += 1
        curves.append(({"depth": depth, "width": width, **label,
                        "outcome": outcomes[j]}, run["loss"][:, j],
                       float(run["unit_norm"][:, j].max())))
      for norm in init_norms:
        cell = {"depth": depth, "width": width, "hidden": m,
                "init_norm": norm}
        for family in FAMILIES:
          columns = [j for j, label in enumerate(task["labels"])
                     if label["init_norm"] == norm
                     and label["family"] == family]
          cell[family] = summarize(run, task, columns, outcomes, tolerance,
                                   stall_gradient)
          near_critical[family] += cell[family]["near_critical_on_path"]
        cells.append(cell)
  report = {
      "probe": "Section 5's conjecture: teacher-student, unit "
               "h + V ReLU(U h + b), full-batch gradient descent from "
               "small unit norms; the plain unit V ReLU(U h + b) from the "
               "same starts",
      "settings": _settings(depths, widths, init_norms, seeds, samples,
                            steps, learning_rate, teacher_norm, tolerance,
                            stall_gradient, hidden),
      "totals": totals,
      # Runs that met ||grad|| <= stall_gradient above the tolerance
      # anywhere on their path (`summarize`), per family.
      "near_critical_on_path": near_critical,
      "cells": cells,
  }
  return report, curves


def _settings(depths, widths, init_norms, seeds, samples, steps,
              learning_rate, teacher_norm, tolerance, stall_gradient, hidden):
  """The report's record of how the probe ran."""
  return {
      "depths": list(depths), "widths": list(widths),
      "hidden": "d" if hidden is None else hidden,
      "init_norms": list(init_norms), "seeds": seeds,
      "samples": samples, "steps": steps,
      "learning_rate": learning_rate, "teacher_norm": teacher_norm,
      "tolerance": tolerance, "stall_gradient": stall_gradient,
      "plateau_decrease": PLATEAU_DECREASE,
      "loss": "mean squared error / the family's zero-weight network's "
              "(V = 0)",
      "student_start": "||U_i|| = ||V_i|| = init_norm (spectral), b = 0; "
                       "the same start for both families",
      "residual_teacher": "||U_i|| = ||V_i|| = ||b_i|| = teacher_norm",
      "plain_teacher": "U ~ N(0, 2/d), V ~ N(0, 1/m), b = 0"}


def plot_probe(report, curves, path):
  """PNG: relative loss per step for each family, and final loss vs norm."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, axes = pyplot.subplots(1, 3, figsize=(16, 4.5))
  shapes = sorted({(c["depth"], c["width"]) for c, _, _ in curves})
  norms = sorted({c["init_norm"] for c, _, _ in curves})
  styles = ["-", "--", ":", "-."]
  for label, loss, unit_norm in curves:
    color = f"C{shapes.index((label['depth'], label['width'])) % 10}"
    axis = axes[FAMILIES.index(label["family"])]
    axis.semilogy(np.maximum(loss, 1e-16), color=color, alpha=0.7,
                  linestyle=styles[norms.index(label["init_norm"]) % 4])
    marker = "o" if label["family"] == "residual" else "x"
    axes[2].loglog(max(unit_norm, 1e-16), max(loss[-1], 1e-16), marker,
                   color=color)
  for family, axis in zip(FAMILIES, axes):
    axis.set_title(f"{family}: relative loss per step")
    axis.set_xlabel("step")
    axis.axhline(report["settings"]["tolerance"], color="k", linewidth=0.8)
  for n, (depth, width) in enumerate(shapes):
    axes[0].plot([], [], color=f"C{n % 10}", label=f"L = {depth}, d = {width}")
  for n, norm in enumerate(norms):
    axes[0].plot([], [], "k", linestyle=styles[n % 4], label=f"init {norm:g}")
  axes[0].legend(fontsize=7)
  axes[2].set_xlabel("largest unit norm along the path")
  axes[2].set_ylabel("final relative loss (o residual, x plain)")
  for axis in axes:
    axis.grid(True, which="both", alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=100, format="png")
  pyplot.close(figure)


# ----------------------------------------------------------------------------
# What //bin:conjecture does.

def _ignore(_):
  pass


def probe_command(settings, *, output_path=None, output_as_typed=None,
                  plot_path=None, plot_as_typed=None, log=_ignore,
                  emit=_ignore):
  """The probe with SETTINGS ({flag name: value or None}; None: DEFAULTS).

  List settings (depths, widths, init_norms) may be strings, as absl's list
  flags give them. Checks the output paths first; emits the report, writes
  it to OUTPUT_PATH and the figure to PLOT_PATH (each if given), then
  raises ValueError if a residual run diverged.
  """
  outputs = (("output", output_path, output_as_typed),
             ("plot", plot_path, plot_as_typed))
  for name, path, as_typed in outputs:
    if path:
      files.check_output_file(path, f"--{name}={as_typed or path}")
  values = {name: (DEFAULTS.get(name) if settings.get(name) is None
                   else settings[name])
            for name in (*DEFAULTS, "hidden")}
  for name, kind, example in (("depths", int, "2,4"), ("widths", int, "2,4"),
                              ("init_norms", float, "0.01,0.1")):
    values[name] = configs.parse_numbers(values[name], kind, name, example)
  report, curves = run_probe(
      values["depths"], values["widths"], values["init_norms"],
      values["seeds"], values["samples"], values["steps"],
      values["learning_rate"], values["teacher_norm"], values["tolerance"],
      values["stall_gradient"], hidden=values["hidden"], progress=log)

  def write_json(path):
    with open(path, "w") as f:
      json.dump(report, f, indent=1)

  writers = {"output": (write_json, ".json"),
             "plot": (lambda path: plot_probe(report, curves, path), ".png")}
  for name, path, as_typed in outputs:
    if path:
      report[name] = as_typed or path
  for name, path, as_typed in outputs:
    if path:
      write, suffix = writers[name]
      files.write_whole(path, write, f"--{name}={as_typed or path}", suffix)
      log(f"wrote {path}")
  emit(report)
  if report["totals"]["residual"]["diverged"]:
    raise errors.ConfigError(
        f"{report['totals']['residual']['diverged']} residual "
        "runs diverged; lower --learning_rate (it was "
        f"{values['learning_rate']:g})")
  return report
