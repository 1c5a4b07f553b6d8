"""Files written before the move into subpackages still work.

The fixtures in tests/testdata were written by the code at commit 5d502b4,
when the modules sat flat in identity_tf/ (identity_tf/train.py,
identity_tf/run_dir.py, ...):

* network_5d502b4.keras: `identity_tf.build_model` (cifar10, width 0.125,
  one unit per stage, skipinit, seed 3) saved with model.save, and
  network_5d502b4_io.npz its logits on four images;
* run_5d502b4/: a 20-step smoke run on the synthetic dataset (config.json,
  the step-20 checkpoint with its digest and TensorFlow's state file,
  written by that code's //bin:train);
  run_5d502b4_eval.json is what that code's //bin:evaluate printed for it.

Keras finds the layers by their registered package name ("identity_tf"),
not by module path; config.json and the checkpoint keep their formats. The
construction's .keras file is tested in construct_test.
"""

import json
import os
import shutil

from absl.testing import absltest
import keras
import numpy as np
import tensorflow as tf

# Importing the layers registers them under the package name for
# keras.models.load_model (`import identity_tf` alone does not).
from identity_tf import layers
from identity_tf.data import preprocessing
from identity_tf.data import synthetic
from identity_tf.training import checkpoints
from identity_tf.training import metrics
import testing

TESTDATA = os.path.join(testing.source_root(), "tests", "testdata")
# Scores of the same float32 weights on the same examples, computed by
# another build of the same graph: only the order of reductions may differ.
SCORE_TOLERANCE = 1e-5


class SavedNetworkTest(absltest.TestCase):

  def test_a_network_saved_before_the_move_loads_and_computes_its_logits(self):
    model = keras.models.load_model(os.path.join(TESTDATA,
                                                 "network_5d502b4.keras"))
    with np.load(os.path.join(TESTDATA, "network_5d502b4_io.npz")) as data:
      images, logits = data["images"], data["logits"]
    self.assertTrue(any(isinstance(layer, layers.ConvResidualUnit)
                        for layer in model._flatten_layers()))  # pylint: disable=protected-access
    np.testing.assert_allclose(model(images, training=False).numpy(), logits,
                               rtol=1e-5, atol=1e-5)


class SavedRunTest(testing.SharedRootTestCase):

  def _copy(self, name):
    """A fresh copy of the old run (commands below write into it)."""
    path = os.path.join(self.root, name)
    shutil.copytree(os.path.join(TESTDATA, "run_5d502b4"), path)
    return path

  def test_evaluate_scores_an_old_run_as_the_old_code_did(self):
    model_dir = self._copy("evaluate")
    # The recorded scores are of the first 200 test examples.
    result = testing.run_binary("evaluate", f"--model_dir={model_dir}",
                                "--num_examples=200", check=True)
    scores = json.loads(result.stdout.strip().splitlines()[-1])
    with open(os.path.join(TESTDATA, "run_5d502b4_eval.json")) as f:
      expected = json.load(f)
    self.assertEqual(scores["global_step"], 20)
    self.assertEqual(scores["examples"], expected["examples"])
    for key in ("loss", "top1", "top5"):
      self.assertAlmostEqual(scores[key], expected[key],
                             delta=SCORE_TOLERANCE, msg=key)
    # The evaluation is recorded in the new metrics file beside the old run.
    records = metrics.read(model_dir)
    self.assertEqual(records[-1]["step"], 20)

  def test_export_of_an_old_run_serves_the_checkpoints_model(self):
    model_dir = self._copy("export")
    export_dir = os.path.join(self.root, "exported")
    testing.run_binary("export", f"--model_dir={model_dir}",
                       f"--export_dir={export_dir}", check=True)
    model, run, step = checkpoints.restore_model(model_dir)
    self.assertEqual(step, 20)
    images, _ = synthetic.arrays("test")
    pixels = images[:5].astype(np.float32)
    expected = tf.nn.softmax(model(preprocessing.preprocess_for_eval(
        pixels, run.preprocessing), training=False)).numpy()
    loaded = tf.saved_model.load(os.path.join(export_dir, "1"))
    served = loaded.signatures["serving_default"](images=tf.constant(pixels))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected,
                               atol=SCORE_TOLERANCE)

  def test_an_old_run_resumes_from_its_checkpoint(self):
    model_dir = self._copy("resume")
    testing.run_binary("train", f"--model_dir={model_dir}",
                       "--train_steps=30", check=True)
    self.assertEqual(
        [checkpoints.checkpoint_step(p)
         for p in checkpoints.checkpoint_prefixes(model_dir)], [30, 20])
    # Trained from step 20, not from scratch: the first record of the new
    # session is a start at step 20, and no step at or below 20 was logged.
    records = metrics.read(model_dir)
    self.assertEqual((records[0]["step"], records[0].get("start")), (20, True))
    # config.json's history holds the one change made, not the fields this
    # version added since (they take their defaults, as the old run did).
    with open(os.path.join(model_dir, "config.json")) as f:
      self.assertEqual(json.load(f)["history"],
                       [{"step": 20, "changed": {"train_steps": [20, 30]}}])
    self.assertTrue(all(r["step"] > 20 for r in records[1:]))


if __name__ == "__main__":
  absltest.main()
