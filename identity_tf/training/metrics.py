"""A run's metrics: one writer, and what reads them back.

Every record of a run -- a window of training steps, an evaluation -- is
written once, by `MetricsWriter`, and goes three ways: one line of
MODEL_DIR/metrics.jsonl (the record with the wall-clock time), a progress
line a person reads (to the run's echo: bin/train's stderr), and
TensorBoard scalars in MODEL_DIR/train and MODEL_DIR/eval, through writers
that stay open for the run. metrics.jsonl is the run's one record: how
each session started and ended ("start", "stopped", "diverged", "done"),
every progress and evaluation record; programs read it (`read`, and the
readers below), never the progress text or the event files
(`read_scalars` is for a person checking what TensorBoard shows).
"""

import json
import os
import time

import numpy as np
import tensorflow as tf
from tensorflow.core.util import event_pb2

from identity_tf import errors

METRICS_FILE = "metrics.jsonl"
TRAIN_DIR = "train"
EVAL_DIR = "eval"
# The evaluation's scores that go to TensorBoard.
EVAL_SCALARS = ("loss", "top1", "top5")
# The record of the evaluation on the whole training split at a run's end.
TRAIN_EVAL = "train_eval"
# The record of an evaluation on the training examples held out for
# validation (--validation_examples), and its TensorBoard directory.
VALIDATION = "validation"
# The "source" of the records //bin:evaluate adds to a run's metrics.jsonl:
# not the run's own evaluations, and no training time.
EVALUATE_SOURCE = "evaluate"


class MetricsWriter:
  """Writes a run's records: progress line, metrics.jsonl, TensorBoard.

  ENABLED False (a worker that is not the chief) writes nothing but the
  progress lines (`progress_line`; VERBOSE: each with its divergence
  diagnostics). Use as a context manager, or call `close`.
  """

  def __init__(self, model_dir, echo=None, enabled=True, verbose=False):
    self._echo = echo
    self._enabled = enabled
    self._verbose = verbose
    self._path = os.path.join(model_dir, METRICS_FILE)
    self._writers = {}
    self._model_dir = model_dir
    self._appended = False

  def _writer(self, kind):
    if kind not in self._writers:
      self._writers[kind] = tf.summary.create_file_writer(
          os.path.join(self._model_dir, kind))
    return self._writers[kind]

  def _write(self, record, kind, scalars, step, abnormal=False):
    if self._echo:
      self._echo(progress_line(record, self._verbose or abnormal))
    if not self._enabled:
      return
    self._append(record)
    writer = self._writer(kind)
    with writer.as_default():
      for name, value in scalars.items():
        tf.summary.scalar(name, value, step=step)
    writer.flush()

  def start(self, step, machine=None):
    """Marks the start of a session of training at STEP in metrics.jsonl
    (not a metric: no progress line, no TensorBoard), so that a run's wall
    time can be summed over its sessions (`wall_seconds`) and its speed
    read against the hardware it ran on (MACHINE: `machine.describe`'s
    line; `machines`)."""
    if self._enabled:
      self._append({"step": step, "start": True,
                    **({"machine": machine} if machine else {})})

  def diverged(self, step, nan_step):
    """Marks the end of a session stopped at STEP because the loss became
    NaN or infinite (first at NAN_STEP) in metrics.jsonl: the run is
    finished, and how (`status`)."""
    if self._enabled:
      self._append({"step": step, "diverged": True, "nan_step": nan_step})

  def done(self, step):
    """Marks the end of a session that reached the run's last step, STEP,
    and made its final evaluations, in metrics.jsonl (`status`)."""
    if self._enabled:
      self._append({"step": step, "done": True})

  def stopped(self, step, signal_name):
    """Marks the end of a session stopped by SIGNAL_NAME (SIGTERM, SIGINT)
    at STEP, after its checkpoint, in metrics.jsonl (not a metric either).
    The next session resumes from that step: without this record the time
    since the session's last progress line -- steps kept, never redone --
    would be missing from the run's wall time."""
    if self._enabled:
      self._append({"step": step, "stopped": signal_name})

  def _append(self, record):
    line = json.dumps({**record, "time": round(time.time(), 3)}) + "\n"
    if not self._appended and _cut_short(self._path):
      # A kill cut the last line short: this one starts on a line of its
      # own, or `read` would drop it with the piece before it (and a lost
      # "start" record would count the time between sessions as training).
      line = "\n" + line
    self._appended = True
    with tf.io.gfile.GFile(self._path, "a") as f:
      f.write(line)

  def train(self, record, scalars, abnormal=False):
    """RECORD (`diagnostics.Window.record`'s, with "step") of a window of
    training steps, and its TensorBoard SCALARS ({name: number}); its
    progress line shows the divergence diagnostics when ABNORMAL
    (`diagnostics.AbnormalSigns`) or verbose."""
    self._write(record, TRAIN_DIR, scalars, record["step"], abnormal)

  def evaluation(self, step, metrics, kind=EVAL_DIR, **extra):
    """METRICS (`evaluation.make_evaluator`'s dict) of the model at STEP,
    TensorBoard's in MODEL_DIR/KIND; EXTRA keys (e.g. the dataset) go to
    the record only."""
    record = {"step": step, "eval": {
        name: value if isinstance(value, int) else round_value(value)
        for name, value in metrics.items()}, **extra}
    self._write(record, kind,
                {name: metrics[name] for name in EVAL_SCALARS}, step)

  def validation(self, step, metrics):
    """METRICS of the model at STEP on the training examples held out for
    validation: a "validation" record, and TensorBoard scalars in
    MODEL_DIR/validation (beside eval/, the evaluation split's)."""
    record = {"step": step, VALIDATION: {
        name: value if isinstance(value, int) else round_value(value)
        for name, value in metrics.items()}}
    self._write(record, VALIDATION,
                {name: metrics[name] for name in EVAL_SCALARS}, step)

  def training_set_evaluation(self, step, metrics):
    """METRICS of the model at STEP on the whole training split
    (`trainer.Trainer.evaluate_training_set`): a "train_eval" record, and
    TensorBoard's train_set/ scalars."""
    record = {"step": step, TRAIN_EVAL: {
        name: value if isinstance(value, int) else round_value(value)
        for name, value in metrics.items()}}
    self._write(record, TRAIN_DIR,
                {f"train_set/{name}": metrics[name] for name in EVAL_SCALARS},
                step)

  def close(self):
    for writer in self._writers.values():
      writer.close()
    self._writers = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def progress_line(record, diagnostics=False):
  """The one line a person reads for RECORD (a training window's, an
  evaluation's or the training set's; metrics.jsonl keeps every field):

    step 500/4500: loss 0.1234, top-1 96.66 %, lr 0.1, 1234 images/s, ETA 0:20:00
    step 500 eval: top-1 98.55 %, top-5 100.00 %, loss 0.0404 (2000 examples)

  A training window's line ends with its divergence diagnostics (the peak
  gradient norm and update ratio, each watched activation's RMS and the
  loss scale) when DIAGNOSTICS.
  """
  for key, name in (("eval", "eval"), (VALIDATION, "validation"),
                    (TRAIN_EVAL, "training-set eval")):
    if key in record:
      scores = record[key]
      return (f"step {record['step']} {name}: top-1 "
              f"{100 * scores['top1']:.2f} %, top-5 "
              f"{100 * scores['top5']:.2f} %, loss {scores['loss']:.4g} "
              f"({scores['examples']} examples)")
  line = (f"step {record['step']}/{record['train_steps']}: loss "
          f"{record['loss']:.4g}, top-1 {100 * record['top1']:.2f} %, lr "
          f"{record['lr']:.4g}, {record['images_per_second']:.0f} images/s, "
          f"ETA {record['eta']}")
  if diagnostics:
    rms = ", ".join(f"{name} {value:.3g}"
                    for name, value in record["activation_rms"].items())
    line += (f"; grad norm {record['grad_norm']:.3g}, update ratio "
             f"{record['update_ratio']:.3g}, activation RMS {rms}")
    if "loss_scale" in record:
      line += f", loss scale {record['loss_scale']:g}"
  return line


def _cut_short(path):
  """Whether PATH exists and does not end with a newline."""
  if not tf.io.gfile.exists(path):
    return False
  size = tf.io.gfile.stat(path).length
  if not size:
    return False
  with tf.io.gfile.GFile(path, "rb") as f:
    f.seek(size - 1)
    return f.read(1) != b"\n"


def round_value(value, digits=4):
  """VALUE with DIGITS significant digits, for progress lines (NaN kept)."""
  value = float(value)
  if value != value or value in (float("inf"), float("-inf")) or value == 0:
    return value
  return float(f"{value:.{digits}g}")


def read(model_dir):
  """The records of MODEL_DIR's metrics.jsonl, in the order written ([] if
  there are none). A resumed run writes the steps after its checkpoint
  again, later in the file. A line that is not one of `MetricsWriter`'s
  records (`well_formed`: cut short by a kill, or damaged) is left out, as
  the training that appends to the file leaves it be; OutputError (one
  line) if metrics.jsonl is not a file that can be read."""
  path = os.path.join(model_dir, METRICS_FILE)
  if not tf.io.gfile.exists(path):
    return []
  if tf.io.gfile.isdir(path):
    raise errors.OutputError(
        f"{path} is a directory, not a run's metrics; move it away (the "
        "run's records are then gone) or use a new --model_dir")
  records = []
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      for line in f:
        try:
          record = json.loads(line)
        except (ValueError, RecursionError):
          continue  # A line cut short by a kill, or not JSON.
        if well_formed(record):
          records.append(record)
  except tf.errors.OpError as e:
    reason = (e.message or type(e).__name__).splitlines()[0]
    raise errors.OutputError(f"cannot read {path} ({reason}); make it "
                             "readable, or use a new --model_dir") from None
  return records


def _number(value):
  # NaN too: a diverging run's last losses are written as NaN.
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value):
  return isinstance(value, int) and not isinstance(value, bool)


def _scores(value):
  return isinstance(value, dict) and all(
      isinstance(name, str) and (_number(score) or score is None)
      for name, score in value.items())


# The fields the readers below take from a record, and what each must be.
_FIELD_KINDS = {
    "time": lambda v: _number(v) and np.isfinite(v), "loss": _number, "top1": _number, "lr": _number,
    "images_per_second": _number, "train_steps": _integer,
    "nan_step": lambda v: v is None or _integer(v),
    "eval": _scores, TRAIN_EVAL: _scores, VALIDATION: _scores,
    "start": lambda v: isinstance(v, bool),
    "done": lambda v: isinstance(v, bool),
    "diverged": lambda v: isinstance(v, bool),
    "stopped": lambda v: isinstance(v, str),
    "machine": lambda v: v is None or isinstance(v, str),
    "source": lambda v: isinstance(v, str),
    "split": lambda v: isinstance(v, str), "batch_norm_images": _integer,
}


def well_formed(record):
  """Whether RECORD (a line of metrics.jsonl, parsed) is a record as
  `MetricsWriter` writes them: an object with an integer "step" and a
  finite "time", each field the readers use of its kind."""
  return (isinstance(record, dict) and _integer(record.get("step")) and
          "time" in record and
          # A training window's: the loss curve reads it.
          ("train_steps" not in record or "loss" in record) and
          all(check(record[name]) for name, check in _FIELD_KINDS.items()
              if name in record))


def _from_evaluate(record):
  return record.get("source") == EVALUATE_SOURCE


def _training_time(records):
  """Yields (record, seconds of training up to it) for RECORDS (`read`'s):
  over each session of training (from a "start" record) the time from its
  start, added to the sessions before; None before the first session.
  //bin:evaluate's records (written whenever it ran) count no time."""
  total, start, last = 0.0, None, None
  for record in records:
    if _from_evaluate(record):
      yield record, None
      continue
    if record.get("start"):
      if start is not None:
        total += last - start
      start = record["time"]
    last = record["time"]
    yield record, None if start is None else total + last - start


def wall_seconds(records):
  """The wall time of training RECORDS span: each session up to its last
  record (a stop on SIGTERM writes one; a session cut short by a kill counts
  up to its last progress line or evaluation), summed."""
  elapsed = [t for _, t in _training_time(records) if t is not None]
  return max(elapsed) if elapsed else 0.0


# The records that begin or end a session of training, and their status.
_SESSION_MARKS = {"start": "started", "stopped": "stopped",
                  "diverged": "diverged", "done": "done"}


def status(records):
  """How the run of RECORDS (`read`'s) stands: {"status", "nan_step"}.

  "done" or "diverged" (with its "nan_step", the first step whose loss was
  not finite) when its last session ended so; "stopped" when a signal
  stopped it; "started" when it began and has not ended (running, or
  killed); None without any session.
  """
  found = None
  for record in records:
    for key, name in _SESSION_MARKS.items():
      if record.get(key):
        found = {"status": name, "nan_step": record.get("nan_step")}
  return found


def _curve(records, value):
  """[[step, VALUE(record)], ...] by step of RECORDS where it is not None,
  the last record of a step kept (a resumed run writes again the steps
  after its checkpoint)."""
  points = {}
  for record in records:
    number = value(record)
    if number is not None:
      points[record["step"]] = number
  return [[step, points[step]] for step in sorted(points)]


def training_loss_curve(records):
  """The training loss of each progress record of RECORDS, by step."""
  return _curve(records, lambda r: r["loss"] if "train_steps" in r else None)


def evaluation_curve(records, name="top1"):
  """Score NAME of each of training's evaluations in RECORDS, by step
  (//bin:evaluate's records do not count: they may be of another
  dataset)."""
  return _curve(records, lambda r: None if _from_evaluate(r)
                else r.get("eval", {}).get(name))


def validation_curve(records, name="top1"):
  """Score NAME of each evaluation on the held-out training examples in
  RECORDS (--validation_examples), by step."""
  return _curve(records, lambda r: r.get(VALIDATION, {}).get(name))


def time_to_levels(records, levels, split="eval"):
  """{level: {"step", "wall_seconds"} or None} for each top-1 LEVEL of
  SPLIT ("eval", the evaluation split, or VALIDATION, the held-out training
  images): the first evaluation of training in RECORDS (`read`'s) at or
  above it, and the training time up to it (`_training_time`; None where
  that evaluation came before the first session recorded)."""
  reached = {level: None for level in levels}
  for record, elapsed in _training_time(records):
    top1 = record.get(split, {}).get("top1")
    if top1 is None or _from_evaluate(record):
      continue
    for level in levels:
      if reached[level] is None and top1 >= level:
        reached[level] = {"step": record["step"], "wall_seconds": (
            None if elapsed is None else round(elapsed, 1))}
  return reached


def machines(records):
  """{machine: images/s there} for the hardware RECORDS' sessions of
  training ran on (the start records' "machine" lines), in order of first
  use, each with the median images/s (`images_per_second`) of the training
  windows it ran, None if none: a run resumed on another CPU has a speed
  for each. {} if not recorded (runs from before it was)."""
  windows, machine = {}, None
  for record in records:
    if record.get("start"):
      machine = record.get("machine")
      if machine:
        windows.setdefault(machine, [])
    elif machine and "images_per_second" in record:
      windows[machine].append(record)
  return {machine: images_per_second(on) for machine, on in windows.items()}


def images_per_second(records):
  """The median images/s of RECORDS' training windows (None if none): the
  speed of the run undisturbed by its first window or a busy moment."""
  rates = [r["images_per_second"] for r in records
           if "images_per_second" in r]
  return float(np.median(rates)) if rates else None


def read_scalars(log_dir):
  """{name: [(step, value), ...]} of the scalars in LOG_DIR's event files.

  In file order: a resumed run logs the steps after its checkpoint again,
  in a newer file.
  """
  scalars = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(log_dir, "events.*"))):
    # tf.data rather than tf.compat.v1.train.summary_iterator, which warns
    # that it is deprecated on every call.
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for value in event.summary.value:
        number = float(tf.make_ndarray(value.tensor))
        scalars.setdefault(value.tag, []).append((event.step, number))
  return scalars


def reestimated_validation(records):
  """The last //bin:evaluate record in RECORDS of the held-out training
  images with batch norm's statistics re-estimated (`evaluate_run`'s
  held_out and reestimate_batch_norm): {"loss", "top1", "top5",
  "examples", "step", "batch_norm_images"}; None if there is none."""
  found = [r for r in records if _from_evaluate(r) and "eval" in r and
           r.get("split") == VALIDATION and "batch_norm_images" in r]
  return ({**found[-1]["eval"], "step": found[-1]["step"],
           "batch_norm_images": found[-1]["batch_norm_images"]}
          if found else None)


def training_set_evaluation(records):
  """The last "train_eval" record's scores ({"loss", "top1", "top5",
  "examples"} and its "step"), None if the run has none."""
  found = [r for r in records if TRAIN_EVAL in r]
  return {**found[-1][TRAIN_EVAL], "step": found[-1]["step"]} if found else None
