"""What shows a divergence coming, and the line that stops a diverged run.

A residual network without normalisation diverges by a stage's
activations or the gradient growing over a few hundred steps
(docs/results.md). The training step (`step.make_train_step`) measures, at
every step, the global gradient norm, the largest update/weight ratio and
the RMS of each stage's activations (`watched_activations`); the loop sums
them over the steps between two progress lines (`Window`) and reports the
size of each stage's residual branches (`residual_branch_norms`). When a
loss becomes NaN, `nonfinite_message` says where it began and what came
before it. `AbnormalSigns` decides when a progress line shows them.
"""

import datetime

import keras
import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf import model as model_lib
from identity_tf.training import metrics
from identity_tf.training import step as step_lib


class NonFiniteLossError(errors.TrainingError):
  """The training loss became NaN or infinite; the run was stopped.

  `step` is the global step at which it first happened.
  """

  def __init__(self, message, step=None):
    super().__init__(message)
    self.step = step


def residual_branch_norms(model):
  """{stage number: max over the stage's units of ||C2||_2}.

  (With C2's standardised kernel where it is standardised, and times the
  branch's scalar multipliers under SkipInit, Fixup and NF-ResNet.)

  For residual unit x -> x + C2(ReLU(C1 x)) we take C2's kernel [k, k, c, c]
  reshaped to a (k k c) x c matrix and its spectral norm (largest singular
  value). This is the convolutional analogue of the paper's |||A||| =
  max_i ||A_i|| (Section 2: the largest spectral norm of the residual
  layers), whose smallness Theorems 2.1-2.2 are about: a residual network
  near the identity. C2 is the weight that is zero when the unit is exactly
  the identity (Section 4). Per stage, so depth- and width-changing stages
  are not mixed.
  """
  stages = {}
  for layer in model.layers:
    name = layer.name
    if not (name.startswith("stage") and "_unit" in name and
            hasattr(layer, "conv2")):
      continue
    stage = int(name[len("stage"):name.index("_unit")])
    conv2 = layer.conv2
    # A standardised convolution computes with its standardised kernel.
    kernel = tf.convert_to_tensor(
        conv2.standardized_kernel() if hasattr(conv2, "standardized_kernel")
        else conv2.kernel)
    matrix = tf.reshape(kernel, [-1, kernel.shape[-1]])
    norm = float(tf.linalg.svd(matrix, compute_uv=False)[0])
    # SkipInit's, Fixup's and NF-ResNet's scalar multipliers are part of
    # the branch's C2.
    for gain in ("branch_gain", "scale", "skip_gain"):
      if hasattr(layer, gain):
        norm *= abs(float(keras.ops.convert_to_numpy(getattr(layer, gain))))
    norm *= getattr(layer, "alpha", 1.0)
    stages[stage] = max(stages.get(stage, 0.0), norm)
  return stages


def all_finite(variables):
  """Whether every entry of VARIABLES is finite."""
  return all(bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))))
             for v in variables)


def watched_activations(model):
  """Names of the activations a training step watches, in forward order."""
  return list(model_lib.activation_probe(model).output.keys())


class Window:
  """The steps since the last progress line: what the line reports."""

  def __init__(self, watched):
    self.watched = watched
    self.last = None  # The last line's record: what preceded a NaN.
    self.reset()

  def reset(self):
    # Sums in float64: a window adds up many calls' float32 sums.
    self.totals = step_lib.initial_output(self.watched, np.float64)
    self.seconds = 0.0

  def add(self, out, seconds):
    """Adds the steps of OUT (`step.make_train_step`'s dict, as NumPy) that
    took SECONDS to run (input included)."""
    self.totals = step_lib.merge(self.totals, out, np)
    self.seconds += seconds

  def record(self, step, train_steps, learning_rate, batch_size):
    """The progress line's JSON object; starts a new window.

    "images_per_second" counts the time spent in steps only: an evaluation
    or a checkpoint inside the window does not slow it, and does not speed
    it up either (the steps before it are timed too). "eta" is the training
    time left at that speed (H:MM:SS; evaluations and checkpoints not
    counted).
    """
    totals = self.totals
    examples = totals["examples"]
    loss, top1 = totals["loss_sum"] / examples, totals["correct"] / examples
    rate = examples / max(self.seconds, 1e-9)
    left = max(train_steps - step, 0) * batch_size / max(rate, 1e-9)
    rounded = metrics.round_value
    self.last = {
        "step": step, "train_steps": train_steps, "loss": rounded(loss),
        "top1": rounded(top1), "lr": rounded(learning_rate),
        "images_per_second": round(rate, 1),
        "eta": str(datetime.timedelta(seconds=round(left))),
        "grad_norm": rounded(totals["grad_norm"]),
        "update_ratio": rounded(totals["update_ratio"]),
        "activation_rms": {name: rounded(totals["activation_rms"][name])
                           for name in self.watched}}
    self.reset()
    return self.last


class AbnormalSigns:
  """Whether a progress record's divergence diagnostics are abnormal, so
  that its line on the terminal shows them (metrics.jsonl always has them).

  Abnormal, simply: a gradient norm, update ratio or activation RMS that is
  NaN or infinite; a gradient norm above GRAD_NORM_FACTOR times the median
  of this session's earlier lines'; or an activation RMS above
  ACTIVATION_RMS_LIMIT. The factor is large because a healthy run starting
  near the identity grows its gradient norm from near zero: the smoke
  preset's went from 0.11 at step 50 to 11.9 at step 200, 86 times the
  median before it, and to 26.9 at step 250 (measured; at 10 times, half
  its lines would be flagged). Its activations' RMS stayed below 30.
  """

  GRAD_NORM_FACTOR = 1000.0
  ACTIVATION_RMS_LIMIT = 100.0

  def __init__(self):
    self._grad_norms = []

  def check(self, record):
    """Whether RECORD (`Window.record`'s) is abnormal; remembers its
    gradient norm for the lines after it."""
    grad_norm = record["grad_norm"]
    values = [grad_norm, record["update_ratio"],
              *record["activation_rms"].values()]
    abnormal = (not all(np.isfinite(values))
                or max(record["activation_rms"].values(), default=0.0)
                > self.ACTIVATION_RMS_LIMIT
                or (bool(self._grad_norms) and grad_norm >
                    self.GRAD_NORM_FACTOR * np.median(self._grad_norms)))
    if np.isfinite(grad_norm):
      self._grad_norms.append(grad_norm)
    return bool(abnormal)


def nonfinite_message(out, step, watched, last_record, last_good):
  """The one line that stops a diverged run: where and when, and what to do."""
  first_step, index = (int(v) for v in out[step_lib.FIRST_NONFINITE])
  if first_step < 0:  # Finite activations and gradients, infinite loss.
    where, first_step = "the loss", step
  elif step_lib.nonfinite_order(watched)[index] == step_lib.GRADIENT:
    where = "the gradient"
  else:
    where = f"the activations of {watched[index]}"
  before = ""
  if last_record:
    rms = ", ".join(f"{k} {v:.3g}"
                    for k, v in last_record["activation_rms"].items())
    before = (f"; before it: gradient norm up to "
              f"{last_record['grad_norm']:.3g}, activation RMS {rms}")
  loss = float(out["loss_sum"])
  if np.isfinite(loss):
    # A huge but finite loss is not NaN: say what it was, averaged over the
    # examples since the last progress line (loss_sum is their sum).
    mean = loss / max(float(out["examples"]), 1.0)
    what = (f"{where} became NaN or infinite at step {first_step} while the "
            f"training loss was still finite ({mean:.3g} per example since "
            f"the last line)")
  else:
    what = (f"the training loss became {loss} at step {first_step}: {where} "
            f"became NaN or infinite first")
  return (f"{what}{before}; {last_good}; lower --learning_rate or add a "
          f"stabiliser (e.g. --grad_clip_norm=1; docs/training.md)")


def check_loss_scale(scale, step, last_written):
  """Raises NonFiniteLossError when mixed_float16's dynamic loss scale
  (SCALE; None: no loss scaling) has fallen below 1: the gradients overflow
  float16 even unscaled, and every step is being skipped."""
  if scale is not None and scale < 1:
    raise NonFiniteLossError(
        f"the loss scale of mixed_float16 fell to {scale:g} by step {step}: "
        f"the gradients overflow float16 even unscaled; {last_written}; "
        f"resume with --precision=mixed_bfloat16 or float32, or lower "
        f"--learning_rate", step=step)


def check_finite(out, step, watched, window, last_written):
  """Raises NonFiniteLossError if the steps that gave OUT (`step`'s dict)
  met a NaN or infinity: the message says where it began and what came
  before it (WINDOW's last record); LAST_WRITTEN, what the run keeps."""
  first = int(out[step_lib.FIRST_NONFINITE][0])
  if first >= 0 or not np.isfinite(out["loss_sum"]):
    raise NonFiniteLossError(
        nonfinite_message(out, step, watched, window.last, last_written),
        step=first if first >= 0 else step)
