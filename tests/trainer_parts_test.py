"""The parts of the training loop that a whole training cannot reach
cheaply: the merge of the step's named outputs (over steps and
parameter-server closures), the progress line a person reads, a progress
line's speed around an evaluation, the save that fails half-way (a full
disk), and the evaluation's loss, top-1 and top-5 against NumPy."""

import errno
import math
import os
import time
from unittest import mock

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import errors
from identity_tf import model as model_lib
from identity_tf.data import datasets
from identity_tf.data import pipeline
from identity_tf.data import synthetic
from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import diagnostics
from identity_tf.training import evaluation
from identity_tf.training import metrics
from identity_tf.training import optimization
from identity_tf.training import run as run_lib
from identity_tf.training import step as step_lib
from identity_tf.training import trainer
import testing


WATCHED = ["stage1", "logits"]


def _output(sums, peaks, first_nonfinite=(-1, -1)):
  """A step output from SUMS [loss sum, correct, examples] and PEAKS
  [gradient norm, update ratio, RMS of stage1, RMS of logits]."""
  return {"loss_sum": np.float64(sums[0]), "correct": np.float64(sums[1]),
          "examples": np.float64(sums[2]), "grad_norm": np.float64(peaks[0]),
          "update_ratio": np.float64(peaks[1]),
          "activation_rms": {name: np.float64(value)
                             for name, value in zip(WATCHED, peaks[2:])},
          "first_nonfinite": np.array(first_nonfinite)}


def _as_vectors(output):
  """OUTPUT's (sums, peaks) in _output's order."""
  return ([output["loss_sum"], output["correct"], output["examples"]],
          [output["grad_norm"], output["update_ratio"],
           *(output["activation_rms"][name] for name in WATCHED)])


class MergeOutputsTest(absltest.TestCase):
  """Under parameter_server each scheduled closure runs some of the steps;
  the merged dict must be the one a single closure running all of them
  would have returned: the counts summed, the diagnostics their largest."""

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(7)
    # Six steps: [loss, correct, examples] and [gradient norm, update
    # ratio, two activation RMS].
    self.sums = np.column_stack([rng.uniform(0.5, 2.5, 6),
                                 rng.integers(0, 64, 6),
                                 np.full(6, 64)])
    self.peaks = rng.uniform(0.0, 5.0, (6, 4))
    # Three closures of two steps each, combined here with NumPy alone.
    self.closures = [_output(self.sums[i:i + 2].sum(axis=0),
                             self.peaks[i:i + 2].max(axis=0))
                     for i in range(0, 6, 2)]

  def test_sums_add_and_peaks_take_the_largest(self):
    merged = trainer.merge_outputs(self.closures)
    sums, peaks = _as_vectors(merged)
    np.testing.assert_allclose(sums, self.sums.sum(axis=0))
    np.testing.assert_allclose(peaks, self.peaks.max(axis=0))
    np.testing.assert_array_equal(merged["first_nonfinite"], [-1, -1])

  def test_the_merge_of_tensors_is_the_merge_of_arrays(self):
    # The training step merges its steps with TensorFlow, the loop its
    # calls with NumPy: one table, the same results.
    tensors = [tf.nest.map_structure(tf.constant, c) for c in self.closures]
    merged = tensors[0]
    for closure in tensors[1:]:
      merged = step_lib.merge(merged, closure)
    sums, peaks = _as_vectors(tf.nest.map_structure(np.asarray, merged))
    np.testing.assert_allclose(sums, self.sums.sum(axis=0))
    np.testing.assert_allclose(peaks, self.peaks.max(axis=0))

  def test_the_table_sums_the_counts_and_keeps_the_peaks(self):
    self.assertEqual(
        {name for name, r in step_lib.VALUES.items() if r is step_lib.SUM},
        {"loss_sum", "correct", "examples"})
    self.assertEqual(
        {name for name, r in step_lib.VALUES.items() if r is step_lib.PEAK},
        {"grad_norm", "update_ratio", "activation_rms"})

  def test_the_earliest_non_finite_step_wins_whatever_the_closure_order(self):
    # Closures may finish out of order: the report is the earliest step.
    merged = trainer.merge_outputs([
        _output([1, 1, 1], [1, 1, np.nan, 1], (17, 0)),
        _output([1, 1, 1], [1, 1, 1, 1]),
        _output([1, 1, 1], [np.inf, 1, 1, 1], (12, 2)),
    ])
    np.testing.assert_array_equal(merged["first_nonfinite"], [12, 2])
    # A NaN peak stays NaN: the progress line shows it.
    self.assertTrue(np.isnan(merged["activation_rms"]["stage1"]))
    self.assertEqual(merged["grad_norm"], np.inf)

  def test_a_non_finite_value_is_named_in_forward_order(self):
    # Index 2 of [stage1, logits, gradient] is the gradient.
    out = _output([np.nan, 1, 1], [np.inf, 1, 1, 1], (12, 2))
    message = diagnostics.nonfinite_message(out, 15, WATCHED, None, "kept")
    self.assertIn("at step 12: the gradient became NaN", message)
    out = _output([np.nan, 1, 1], [1, 1, 1, np.nan], (12, 1))
    message = diagnostics.nonfinite_message(out, 15, WATCHED, None, "kept")
    self.assertIn("the activations of logits became NaN", message)

  def test_a_huge_finite_loss_is_not_called_nan(self):
    # The loss summed over 256 examples is 256 x 1.07e29: finite. The
    # gradient overflowed first; the line says so and gives the mean.
    out = _output([256 * 1.07e29, 20, 256], [np.inf, 1, 1, 1], (40, 2))
    message = diagnostics.nonfinite_message(out, 50, WATCHED, None, "kept")
    self.assertNotIn("loss became", message)
    self.assertIn("the gradient became NaN or infinite at step 40 while the "
                  "training loss was still finite (1.07e+29 per example",
                  message)
    out = _output([np.nan, 20, 256], [np.inf, 1, 1, 1], (40, 2))
    message = diagnostics.nonfinite_message(out, 50, WATCHED, None, "kept")
    self.assertIn("the training loss became nan at step 40: the gradient",
                  message)


class StepAccumulationTest(absltest.TestCase):
  """One call of the training step over several steps returns what the
  calls of one step each return, combined: counts summed, peaks the
  largest."""

  def test_three_steps_in_one_call_are_three_single_steps_combined(self):
    config = configs.from_preset("smoke", width=0.0625, units=(1,), batch_size=8,
                             weight_decay=0.0, learning_rate=0.05)
    run = run_lib.prepare(config, tfds_data.dataset_info("synthetic"), None)
    rng = np.random.default_rng(3)
    images = rng.standard_normal((3, 8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, (3, 8)).astype(np.int32)
    strategy = tf.distribute.get_strategy()

    def fresh():
      model = model_lib.build_model(**run.model_arguments())
      optimizer = optimization.build_optimizer(run)
      optimizer.build(model.trainable_variables)
      iterator = iter(strategy.distribute_datasets_from_function(
          lambda _: tf.data.Dataset.from_tensor_slices((images, labels))))
      return model, step_lib.make_train_step(strategy, model, optimizer,
                                             config), iterator

    model, steps, iterator = fresh()
    weights = model.get_weights()
    together = tf.nest.map_structure(np.asarray,
                                     steps(iterator, tf.constant(3)))
    twin, step, twin_iterator = fresh()
    twin.set_weights(weights)
    singles = [tf.nest.map_structure(np.asarray,
                                     step(twin_iterator, tf.constant(1)))
               for _ in range(3)]
    watched = list(together["activation_rms"])

    def vectors(out):
      return ([out["loss_sum"], out["correct"], out["examples"]],
              [out["grad_norm"], out["update_ratio"],
               *(out["activation_rms"][name] for name in watched)])

    sums, peaks = zip(*(vectors(s) for s in singles))
    together_sums, together_peaks = vectors(together)
    np.testing.assert_allclose(together_sums, np.sum(sums, axis=0),
                               rtol=1e-6)
    self.assertEqual(together["examples"], 24)
    np.testing.assert_allclose(together_peaks, np.max(peaks, axis=0),
                               rtol=1e-6)
    np.testing.assert_array_equal(together["first_nonfinite"], [-1, -1])


class WindowTest(absltest.TestCase):
  """A progress line's speed and ETA count the time spent in steps, not an
  evaluation or a checkpoint between two lines."""

  def test_speed_is_images_over_step_time_whatever_came_between(self):
    window = diagnostics.Window(WATCHED)
    # 69 steps of 128 images in 20.7 s, then an evaluation (whatever it
    # takes), then 31 steps in 9.3 s: 12 800 images in 30 s.
    window.add(_output([69.0, 60, 69 * 128], [1.0, 0.1, 2.0, 3.0]), 20.7)
    time.sleep(0.2)  # An evaluation: not training time.
    window.add(_output([31.0, 30, 31 * 128], [1.0, 0.1, 2.0, 3.0]), 9.3)
    record = window.record(step=500, train_steps=4500, learning_rate=0.1,
                           batch_size=128)
    self.assertAlmostEqual(record["images_per_second"], 12800 / 30.0,
                           places=1)
    # 4000 steps left at 100 steps per 30 s: 1200 s.
    self.assertEqual(record["eta"], "0:20:00")
    self.assertAlmostEqual(record["loss"], 100 / 12800, places=5)
    # A new window starts empty.
    self.assertEqual(window.seconds, 0.0)


def _record(step=500, grad_norm=1.5, rms=2.0, **extra):
  """A progress record as `diagnostics.Window.record` makes them."""
  return {"step": step, "train_steps": 4500, "loss": 0.1234, "top1": 0.9666,
          "lr": 0.1, "images_per_second": 1234.4, "eta": "0:20:00",
          "grad_norm": grad_norm, "update_ratio": 0.0012,
          "activation_rms": {"stage1": rms, "logits": 3.5}, **extra}


class ProgressLineTest(absltest.TestCase):
  """The terminal's line: compact, with the divergence diagnostics only
  when they are abnormal or asked for; metrics.jsonl keeps every field."""

  def test_a_progress_line_is_one_line_with_its_fields(self):
    line = metrics.progress_line(_record())
    self.assertEqual(line, "step 500/4500: loss 0.1234, top-1 96.66 %, "
                           "lr 0.1, 1234 images/s, ETA 0:20:00")
    verbose = metrics.progress_line(_record(loss_scale=32768.0), True)
    self.assertNotIn("\n", verbose)
    self.assertTrue(verbose.startswith(line + "; "))
    for part in ("grad norm 1.5", "update ratio 0.0012",
                 "activation RMS stage1 2, logits 3.5", "loss scale 32768"):
      self.assertIn(part, verbose)

  def test_an_evaluation_line(self):
    record = {"step": 500, "eval": {"loss": 0.0404, "top1": 0.9855,
                                    "top5": 1.0, "examples": 2000}}
    self.assertEqual(metrics.progress_line(record),
                     "step 500 eval: top-1 98.55 %, top-5 100.00 %, "
                     "loss 0.0404 (2000 examples)")

  def test_diagnostics_are_shown_when_abnormal_or_verbose(self):
    model_dir = self.create_tempdir().full_path
    records = [_record(step=s, grad_norm=g, rms=r) for s, g, r in (
        (10, 1.0, 2.0), (20, 3.0, 2.0), (30, 2.0, 2.0),
        # Above 1000 times the median so far (2.0); then an activation RMS
        # above 100; then NaN; then normal again.
        (40, 2500.0, 2.0), (50, 2.0, 150.0), (60, float("nan"), 2.0),
        (70, 2.5, 2.0))]
    for verbose in (False, True):
      lines = []
      signs = diagnostics.AbnormalSigns()
      with metrics.MetricsWriter(model_dir, lines.append,
                                 verbose=verbose) as writer:
        for record in records:
          writer.train(dict(record), {}, abnormal=signs.check(record))
      shown = [r["step"] for r, line in zip(records, lines)
               if "grad norm" in line]
      self.assertEqual(shown, [10, 20, 30, 40, 50, 60, 70] if verbose
                       else [40, 50, 60])
    # metrics.jsonl has every field of every record, each time.
    written = metrics.read(model_dir)
    self.assertLen(written, 2 * len(records))
    for record, line in zip(records + records, written):
      self.assertEqual({k: v for k, v in line.items() if k != "time"}.keys(),
                       record.keys())


def _standardized_per_image(images):
  """CIFAR's evaluation input in NumPy: each raw image minus its mean over
  H, W and channels, divided by max(its standard deviation, 1/sqrt(#values))
  (tf.image.per_image_standardization's definition, written out)."""
  x = images.astype(np.float64)
  axes = (1, 2, 3)
  mean = x.mean(axis=axes, keepdims=True)
  std = np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True))
  floor = 1.0 / np.sqrt(np.prod(x.shape[1:]))
  return ((x - mean) / np.maximum(std, floor)).astype(np.float32)


class EvaluationTest(absltest.TestCase):
  """evaluation.make_evaluator and evaluate against NumPy: on the first 37
  test images of the synthetic dataset (two batches of 16 and one of 5),
  the mean cross-entropy, top-1 and top-5 of a tiny network whose logits
  are scaled so that they are far from uniform (an evaluator that returned
  log(10), or chance, would be told apart)."""

  EXAMPLES, BATCH = 37, 16

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.info = datasets.synthetic_info()
    cls.preprocessing = datasets.preprocessing_config(cls.info)
    images, labels = synthetic.arrays(cls.info.eval_split)
    cls.labels = labels[:cls.EXAMPLES].astype(np.int64)
    inputs = _standardized_per_image(images[:cls.EXAMPLES])
    base = model_lib.build_model("cifar10", width=0.125, units=1, seed=3)
    raw = base(inputs, training=False).numpy().astype(np.float64)
    # Logits of standard deviation 3: probabilities far from 1/10.
    scale = 3.0 / raw.std()
    image = keras.Input((32, 32, 3))
    cls.model = keras.Model(image, keras.layers.Rescaling(scale)(base(image)))
    cls.logits = cls.model(inputs, training=False).numpy().astype(np.float64)

  def _reference(self):
    """(loss, top1, top5) of self.logits and self.labels in NumPy."""
    logits, labels = self.logits, self.labels
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1,
                                                             keepdims=True))
    rows = np.arange(len(labels))
    loss = -log_probabilities[rows, labels].mean()
    # The label's rank: how many classes have a larger logit.
    label_logit = logits[rows, labels][:, None]
    rank = (logits > label_logit).sum(axis=1)
    # No near-ties with the label's logit: the float32 pipeline (logits
    # within about 1e-5 of these) ranks every label the same.
    gaps = np.abs(logits - label_logit)
    gaps[rows, labels] = np.inf
    self.assertGreater(gaps.min(), 1e-4)
    return loss, np.mean(rank < 1), np.mean(rank < 5)

  def test_loss_top1_top5_are_numpys(self):
    loss, top1, top5 = self._reference()
    # The reference is not degenerate: a constant or uniform answer fails.
    self.assertGreater(abs(loss - np.log(10)), 0.3)
    self.assertTrue(0 < top1 < top5 < 1, (top1, top5))
    evaluator = evaluation.make_evaluator(
        self.model, "synthetic", self.info, self.preprocessing,
        batch_size=self.BATCH, num_examples=self.EXAMPLES)
    for scores in (evaluator(), evaluator(),  # The pipeline is reused.
                   evaluation.evaluate(
                       self.model, "synthetic", self.info, self.preprocessing,
                       batch_size=self.BATCH, num_examples=self.EXAMPLES)):
      self.assertEqual(scores["examples"], self.EXAMPLES)
      self.assertAlmostEqual(scores["loss"], loss, delta=1e-5 * loss)
      # Exact fractions of 37: one example more or less is 0.027.
      self.assertAlmostEqual(scores["top1"], top1, places=9)
      self.assertAlmostEqual(scores["top5"], top5, places=9)


  def test_top_k_counts_the_labels_rank_with_a_label_at_every_rank(self):
    # A linear model whose logits are chosen: example i's label has rank
    # i mod 10 (that many classes above it, the others below, gaps of 1),
    # fitted exactly by least squares on the 40 standardised images
    # (3072 features, full row rank). Top-k is then k/10 of the examples
    # for every k: top-1, top-4 and top-5 all differ.
    count = 40
    images, labels = synthetic.arrays(self.info.eval_split)
    labels = labels[:count].astype(np.int64)
    inputs = _standardized_per_image(images[:count]).reshape(count, -1)
    wanted = np.zeros((count, 10))
    for i, label in enumerate(labels):
      others = [c for c in range(10) if c != label]
      rank = i % 10
      wanted[i, others[:rank]] = np.arange(1, rank + 1)
      wanted[i, others[rank:]] = -np.arange(1, 10 - rank)
    kernel = np.linalg.pinv(inputs.astype(np.float64)) @ wanted
    model = _dense_net(10)
    model.layers[-1].set_weights([kernel.astype(np.float32),
                                  np.zeros(10, np.float32)])
    logits = model(inputs.reshape(count, 32, 32, 3)).numpy()
    rows = np.arange(count)
    rank = (logits > logits[rows, labels][:, None]).sum(axis=1)
    np.testing.assert_array_equal(rank, rows % 10)  # The fixture holds.
    scores = evaluation.evaluate(model, "synthetic", self.info,
                                 self.preprocessing, batch_size=self.BATCH,
                                 num_examples=count)
    self.assertEqual(scores["examples"], count)
    self.assertAlmostEqual(scores["top1"], np.mean(rank < 1), places=9)
    self.assertAlmostEqual(scores["top5"], np.mean(rank < 5), places=9)
    self.assertEqual((scores["top1"], scores["top5"]), (0.1, 0.5))

  def test_batch_norm_is_evaluated_with_its_moving_statistics(self):
    # Batch norm's network with moving statistics far from any batch's:
    # evaluation must normalise with them (inference), not with the
    # evaluation batch's own (training).
    model = model_lib.build_model("resnet_bn", width=0.125, units=1, seed=2)
    rng = np.random.default_rng(8)
    for norm in testing.normalization_layers(model):
      channels = norm.moving_mean.shape
      norm.moving_mean.assign(rng.normal(0.5, 0.5, channels))
      norm.moving_variance.assign(rng.uniform(0.2, 3.0, channels))
    images, labels = synthetic.arrays(self.info.eval_split)
    inputs = _standardized_per_image(images[:self.EXAMPLES])
    labels = labels[:self.EXAMPLES].astype(np.int64)

    def mean_cross_entropy(logits):
      logits = logits.astype(np.float64)
      shifted = logits - logits.max(axis=1, keepdims=True)
      log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
      return -log_p[np.arange(len(labels)), labels].mean()
    inference = mean_cross_entropy(model(inputs, training=False).numpy())
    scores = evaluation.evaluate(model, "synthetic", self.info,
                                 self.preprocessing, batch_size=self.BATCH,
                                 num_examples=self.EXAMPLES)
    # (A call in training mode moves the moving statistics: made last.)
    batch_statistics = mean_cross_entropy(model(inputs, training=True).numpy())
    self.assertAlmostEqual(scores["loss"], inference, delta=1e-5 * inference)
    self.assertGreater(abs(inference - batch_statistics), 0.05 * inference)


  def test_reestimated_statistics_are_the_batches_own(self):
    # Precise batch norm against Keras's training mode: re-estimated on one
    # batch, inference on that batch must normalise as training does (with
    # the batch's own mean and variance in every layer); on two batches,
    # each layer's statistics are the mean of the two batches' alone.
    model = model_lib.build_model("resnet_bn", width=0.125, units=1, seed=4)
    norms = testing.normalization_layers(model)
    rng = np.random.default_rng(9)
    for norm in norms:  # Moving statistics far from any batch's.
      channels = norm.moving_mean.shape
      norm.moving_mean.assign(rng.normal(0.5, 0.5, channels))
      norm.moving_variance.assign(rng.uniform(0.2, 3.0, channels))
    images, _ = synthetic.arrays(self.info.eval_split)
    first, second = (_standardized_per_image(images[i:i + self.BATCH])
                     for i in (0, self.BATCH))
    before = model(first, training=False).numpy()

    def statistics_of(batches):
      self.assertEqual(
          evaluation.reestimate_batch_norm_statistics(model, batches),
          self.BATCH * len(batches))
      return [(n.moving_mean.numpy(), n.moving_variance.numpy())
              for n in norms]
    of_first = statistics_of([first])
    inference = model(first, training=False).numpy()
    training = model(first, training=True).numpy()  # Moves them: last.
    np.testing.assert_allclose(inference, training, rtol=1e-4, atol=1e-4)
    self.assertGreater(np.abs(before - training).max(), 0.1)
    self.assertEqual({n.momentum for n in norms}, {0.99})  # Restored.
    of_second = statistics_of([tf.constant(second)])
    both = statistics_of(tf.data.Dataset.from_tensor_slices(
        np.stack([first, second])))
    for (mean_1, var_1), (mean_2, var_2), (mean, var) in zip(
        of_first, of_second, both):
      np.testing.assert_allclose(mean, (mean_1 + mean_2) / 2, rtol=1e-5,
                                 atol=1e-6)
      np.testing.assert_allclose(var, (var_1 + var_2) / 2, rtol=1e-5,
                                 atol=1e-6)
    # No batch: an error, and the statistics as they were.
    with self.assertRaisesRegex(errors.DataError, "no batch of images"):
      evaluation.reestimate_batch_norm_statistics(model, [])
    for norm, (mean, var) in zip(norms, both):
      np.testing.assert_array_equal(norm.moving_mean.numpy(), mean)
      np.testing.assert_array_equal(norm.moving_variance.numpy(), var)
    plain = model_lib.build_model("cifar10", width=0.125, units=1, seed=4)
    with self.assertRaisesRegex(errors.ConfigError, "has no batch norm"):
      evaluation.reestimate_batch_norm_statistics(plain, [first])


class LoopCadenceTest(absltest.TestCase):
  """What the loop does when, against the configuration's numbers: a
  progress record every log_steps, an evaluation every eval_steps (and at
  the end) of num_eval_examples, a checkpoint every checkpoint_steps of
  which keep_checkpoints stay; and where each call of steps ends."""

  def _config(self, **overrides):
    return configs.from_preset("smoke", **{
        "width": 0.0625, "units": (1,), "batch_size": 8, "train_steps": 7,
        "log_steps": 3, "checkpoint_steps": 2, "keep_checkpoints": 2,
        "eval_steps": 4, "num_eval_examples": 20, "eval_batch_size": 8,
        "steps_per_loop": 5, **overrides})

  def test_records_evaluations_and_checkpoints_come_at_their_steps(self):
    model_dir = self.create_tempdir().full_path
    # eval_at_end off: evaluations every eval_steps evaluate the end too.
    result = trainer.train(self._config(eval_train_at_end=True,
                                        num_train_examples=24,
                                        eval_at_end=False),
                           model_dir, echo=lambda line: None)
    records = metrics.read(model_dir)
    # The training set's evaluation at the end: its 24 examples, in
    # metrics.jsonl (what a study reads) and TensorBoard's train_set/.
    train_eval = metrics.training_set_evaluation(records)
    self.assertEqual((train_eval["step"], train_eval["examples"]), (7, 24))
    self.assertEqual(result["train_eval"]["examples"], 24)
    for name in ("loss", "top1", "top5"):
      self.assertAlmostEqual(train_eval[name], result["train_eval"][name],
                             delta=1e-3 * abs(result["train_eval"][name]))
      self.assertAlmostEqual(metrics.read_scalars(os.path.join(
          model_dir, metrics.TRAIN_DIR))[f"train_set/{name}"][-1][1],
                             result["train_eval"][name], places=5)
    # Every 3 steps, and the run's last (shorter) window; TensorBoard has
    # each record's values, the rate and the L2 term of the weights then.
    progress = [r for r in records if "train_steps" in r]
    self.assertEqual([r["step"] for r in progress], [3, 6, 7])
    scalars = metrics.read_scalars(os.path.join(model_dir,
                                                metrics.TRAIN_DIR))
    for name, key in (("loss", "loss"), ("top1", "top1"),
                      ("learning_rate", "lr"), ("grad_norm", "grad_norm")):
      np.testing.assert_allclose([v for _, v in scalars[name]],
                                 [r[key] for r in progress], rtol=1e-5,
                                 err_msg=name)
    np.testing.assert_allclose([v for _, v in scalars["learning_rate"]],
                               0.01, rtol=1e-6)  # The smoke preset's rate.
    final, _, _ = checkpoints.restore_model(model_dir)
    penalty = 1e-4 * sum(float(np.sum(np.square(w.numpy().astype(
        np.float64)))) for w in final.trainable_weights
                         if len(w.shape) == 4) / 2
    self.assertAlmostEqual(scalars["weight_decay_loss"][-1][1], penalty,
                           delta=1e-5 * penalty)
    self.assertEqual(result["train_window"], 1)
    evaluations = [r for r in records if "eval" in r]
    self.assertEqual([r["step"] for r in evaluations], [4, 7])
    self.assertEqual({r["eval"]["examples"] for r in evaluations}, {20})
    self.assertEqual(result["eval"]["examples"], 20)
    # Checkpoints at 2, 4, 6 and 7: the newest two are kept.
    self.assertEqual(sorted(checkpoints.checkpoint_step(p) for p in
                            checkpoints.checkpoint_prefixes(model_dir)),
                     [6, 7])
    # Neither eval_steps nor eval_at_end: no evaluation at all.
    quiet_dir = self.create_tempdir().full_path
    quiet = trainer.train(self._config(eval_steps=0, eval_at_end=False,
                                       train_steps=3),
                          quiet_dir, echo=lambda line: None)
    self.assertEqual([r for r in metrics.read(quiet_dir) if "eval" in r],
                     [])
    self.assertIsNone(quiet["eval"])

  def test_held_out_images_are_evaluated_every_eval_steps_and_test_once(self):
    model_dir = self.create_tempdir().full_path
    result = trainer.train(self._config(
        validation_examples=40, eval_train_at_end=True,
        num_train_examples=24), model_dir, echo=lambda line: None)
    records = metrics.read(model_dir)
    validation = [r for r in records if metrics.VALIDATION in r]
    self.assertEqual([(r["step"], r[metrics.VALIDATION]["examples"])
                      for r in validation], [(4, 40), (7, 40)])
    self.assertEqual(result["validation"]["examples"], 40)
    # The evaluation split once, at the end, after the last validation.
    tests = [r for r in records if "eval" in r]
    self.assertEqual([(r["step"], r["eval"]["examples"]) for r in tests],
                     [(7, 20)])
    self.assertGreater(records.index(tests[0]), records.index(validation[-1]))
    self.assertEqual(metrics.training_set_evaluation(records)["examples"], 24)
    self.assertEqual(
        [s for s, _ in metrics.read_scalars(os.path.join(
            model_dir, metrics.VALIDATION))["top1"]], [4, 7])
    # Without --eval_at_end the evaluation split is never read.
    quiet_dir = self.create_tempdir().full_path
    trainer.train(self._config(validation_examples=40, eval_at_end=False),
                  quiet_dir, echo=lambda line: None)
    quiet = metrics.read(quiet_dir)
    self.assertEqual([r for r in quiet if "eval" in r], [])
    self.assertEqual([r["step"] for r in quiet if metrics.VALIDATION in r],
                     [4, 7])

  def test_a_call_runs_to_the_next_step_with_something_to_do(self):
    config = self._config(train_steps=100, log_steps=10,
                          checkpoint_steps=25, eval_steps=0)
    # By hand: the next multiple of 10 or 25, at most MOST steps on, never
    # past the run's end.
    for step, most, expected in ((0, 100, 10), (10, 100, 20), (20, 100, 25),
                                 (25, 100, 30), (0, 3, 3), (93, 100, 100),
                                 (98, 1, 99)):
      self.assertEqual(trainer._next_stop(config, step, most), expected,
                       (step, most))
    with_eval = self._config(train_steps=100, log_steps=10,
                             checkpoint_steps=25, eval_steps=7)
    self.assertEqual(trainer._next_stop(with_eval, 0, 100), 7)
    self.assertEqual(trainer._next_stop(with_eval, 14, 100), 20)


class TrainerInputTest(absltest.TestCase):
  """The trainer's training stream is the configured one: the first
  num_train_examples examples, each once per epoch, in the seed's order."""

  def _labels(self, **overrides):
    config = configs.from_preset("smoke", width=0.0625, units=(1,),
                                 batch_size=8, num_train_examples=16,
                                 deterministic=True, **overrides)
    run = run_lib.prepare(config, tfds_data.dataset_info("synthetic"),
                          self.create_tempdir().full_path)
    trainer_ = trainer.Trainer(run, tf.distribute.get_strategy())
    trainer_.restore(None)
    return np.concatenate([next(trainer_.iterator)[1].numpy()
                           for _ in range(4)])

  def test_the_first_examples_in_the_seeds_order(self):
    first = synthetic.arrays("train")[1][:16]
    seed0 = self._labels()
    for epoch in (seed0[:16], seed0[16:]):
      self.assertCountEqual(epoch, first)
    np.testing.assert_array_equal(self._labels(), seed0)
    self.assertFalse(np.array_equal(self._labels(seed=1), seed0))

  def test_held_out_images_are_never_trained_on(self):
    # The training stream reads the images the held-out ones leave, and the
    # validation pipeline exactly those held out, whatever the seed.
    images, labels = synthetic.arrays("train")
    validation, training = datasets.held_out(len(labels), 300)
    for seed in (0, 1):
      stream = self._labels(validation_examples=300, seed=seed)
      self.assertCountEqual(stream[:16], labels[training[:16]])
    for held_out, chosen in ((True, validation), (False, training)):
      source = pipeline._read_split("synthetic", "train", None, None, None,
                                    300, held_out)
      np.testing.assert_array_equal(source.images, images[chosen])
      np.testing.assert_array_equal(source.labels, labels[chosen])


class MetricsReadersTest(absltest.TestCase):
  """metrics.jsonl's readers, on records written out by hand."""

  RECORDS = [
      {"step": 0, "start": True, "time": 0.0},
      {"step": 10, "train_steps": 30, "loss": 2.0, "time": 1.0},
      {"step": 10, "eval": {"top1": 0.2, "loss": 2.1}, "time": 1.5},
      {"step": 20, "train_steps": 30, "loss": 1.5, "time": 2.0},
      # A resumed session repeats step 20 (the later record counts), and
      # //bin:evaluate's records (another dataset, perhaps) do not count.
      {"step": 10, "start": True, "time": 5.0},
      {"step": 20, "train_steps": 30, "loss": 1.25, "time": 6.0},
      {"step": 20, "eval": {"top1": 0.9}, "source": "evaluate", "time": 6.5},
      {"step": 30, "train_steps": 30, "loss": 1.0, "time": 7.0},
      {"step": 30, "eval": {"top1": 0.5, "loss": 1.1}, "time": 7.5},
      {"step": 30, "train_eval": {"loss": 0.9, "top1": 0.6, "top5": 0.9,
                                  "examples": 48}, "time": 8.0},
  ]

  def test_curves_take_each_steps_last_record_of_training(self):
    self.assertEqual(metrics.training_loss_curve(self.RECORDS),
                     [[10, 2.0], [20, 1.25], [30, 1.0]])
    self.assertEqual(metrics.evaluation_curve(self.RECORDS),
                     [[10, 0.2], [30, 0.5]])
    self.assertEqual(metrics.evaluation_curve(self.RECORDS, "loss"),
                     [[10, 2.1], [30, 1.1]])
    self.assertEqual(metrics.training_set_evaluation(self.RECORDS),
                     {"loss": 0.9, "top1": 0.6, "top5": 0.9, "examples": 48,
                      "step": 30})
    self.assertIsNone(metrics.training_set_evaluation(self.RECORDS[:-1]))
    # (2 - 0) + (8 - 5): each session up to its last record of training.
    self.assertAlmostEqual(metrics.wall_seconds(self.RECORDS), 5.0)

  def test_values_keep_four_significant_digits(self):
    for value, expected in ((0.123456, 0.1235), (98765.4, 98770.0),
                            (-2.000049, -2.0), (1.23456e-7, 1.235e-7),
                            (0.0, 0.0)):
      self.assertEqual(metrics.round_value(value), expected)
    self.assertTrue(math.isnan(metrics.round_value(float("nan"))))
    self.assertEqual(metrics.round_value(float("inf")), float("inf"))
    self.assertEqual(metrics.round_value(1.23456, digits=2), 1.2)


def _dense_net(units):
  """images [n, 32, 32, 3] -> flatten -> a Dense layer of UNITS."""
  return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(),
                           keras.layers.Dense(units)])


class FailedSaveTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.directory = self.create_tempdir().full_path
    self.variable = tf.Variable(np.arange(1000, dtype=np.float32))
    self.manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=self.variable), self.directory,
        max_to_keep=3)
    checkpoints.save(self.manager, 1, self.directory)
    self.before = self._files()

  def _files(self):
    contents = {}
    for name in sorted(os.listdir(self.directory)):
      with open(os.path.join(self.directory, name), "rb") as f:
        contents[name] = f.read()
    return contents

  def _check_failed_save(self, error):
    message = str(error)
    self.assertNotIn("\n", message)
    self.assertIn("checkpoint of step 2", message)
    self.assertIn("No space left on device", message)
    self.assertIn(os.path.join(self.directory, "ckpt-1"), message)
    # Nothing of step 2 is left and step 1 is byte for byte as it was (the
    # state file aside, which a resume rewrites from the files).
    after = self._files()
    self.assertEqual([n for n in after if n.startswith("ckpt-")],
                     [n for n in self.before if n.startswith("ckpt-")])
    for name in after:
      if name.startswith("ckpt-"):
        self.assertEqual(after[name], self.before[name], name)
    self.assertEqual(checkpoints.find_checkpoint(self.directory),
                     os.path.join(self.directory, "ckpt-1"))

  def test_a_huge_digest_record_is_refused_unread(self):
    # 300 MB where a record of one checkpoint is 200 bytes: refused from a
    # bounded prefix (read whole, it took 1.5 GB before it was refused).
    prefix = os.path.join(self.directory, "ckpt-1")
    self.assertIsNone(checkpoints.damage(prefix))
    with open(prefix + ".sha256", "r+b") as f:
      f.truncate(300 << 20)  # Sparse: no disk, no time.
    read = []
    real_gfile = tf.io.gfile.GFile

    class CountingGFile(real_gfile):

      def read(self, n=-1):
        data = super().read(n)
        read.append(len(data))
        return data

    with mock.patch.object(tf.io.gfile, "GFile", CountingGFile):
      self.assertEqual(checkpoints.damage(prefix),
                       "its .sha256 record is unreadable")
    self.assertLessEqual(sum(read), checkpoints.MAX_DIGEST_BYTES + 1)

  def test_a_save_that_fails_while_writing_leaves_the_previous_one(self):
    def disk_full(checkpoint_number):
      # Half a checkpoint: the index is written, the data is not.
      with open(os.path.join(self.directory,
                             f"ckpt-{checkpoint_number}.index"), "wb") as f:
        f.write(b"partial")
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    self.variable.assign(self.variable * 2)
    with mock.patch.object(self.manager, "save", disk_full):
      with self.assertRaises(ValueError) as raised:
        checkpoints.save(self.manager, 2, self.directory)
    self._check_failed_save(raised.exception)

  def test_a_save_that_fails_on_its_digest_removes_the_whole_checkpoint(self):
    # The manager has written (and listed) step 2; its digest cannot be.
    self.variable.assign(self.variable * 2)
    with mock.patch.object(
        checkpoints, "write_digest",
        side_effect=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
      with self.assertRaises(ValueError) as raised:
        checkpoints.save(self.manager, 2, self.directory)
    self._check_failed_save(raised.exception)
    # And the weights a resume reads are step 1's.
    restored = tf.Variable(np.zeros(1000, np.float32))
    tf.train.Checkpoint(weights=restored).read(
        checkpoints.find_checkpoint(self.directory)).expect_partial()
    np.testing.assert_array_equal(restored.numpy(),
                                  np.arange(1000, dtype=np.float32))


if __name__ == "__main__":
  absltest.main()
