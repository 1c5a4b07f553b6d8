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

run_7353787/ (and its _eval.json) was written the same way by the code at
commit 7353787, before the residual branch's options were split: a 20-step
smoke run at width 0.125 with the one option of then,
`--residual=skipinit_ws_small --ws_init_scale=2` (today: `--branch_gain=zero
--weight_standardization --branch_init=paper --branch_init_scale=2`), and
`--logit_scale=4`.

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
  """Each old run directory evaluates, exports and resumes."""

  RUNS = ("run_5d502b4", "run_7353787")

  def _copy(self, run, name):
    """A fresh copy of the old RUN (commands below write into it)."""
    path = os.path.join(self.root, f"{run}_{name}")
    shutil.copytree(os.path.join(TESTDATA, run), path)
    return path

  def test_evaluate_scores_an_old_run_as_the_old_code_did(self):
    for run in self.RUNS:
      with self.subTest(run):
        model_dir = self._copy(run, "evaluate")
        # The recorded scores are of the first 200 test examples.
        result = testing.run_binary("evaluate", f"--model_dir={model_dir}",
                                    "--num_examples=200", check=True)
        scores = json.loads(result.stdout.strip().splitlines()[-1])
        with open(os.path.join(TESTDATA, f"{run}_eval.json")) as f:
          expected = json.load(f)
        self.assertEqual(scores["global_step"], 20)
        self.assertEqual(scores["examples"], expected["examples"])
        for key in ("loss", "top1", "top5"):
          self.assertAlmostEqual(scores[key], expected[key],
                                 delta=SCORE_TOLERANCE, msg=key)
        # The evaluation is recorded in the metrics file beside the run.
        records = metrics.read(model_dir)
        self.assertEqual(records[-1]["step"], 20)

  def test_export_of_an_old_run_serves_the_checkpoints_model(self):
    for run in self.RUNS:
      with self.subTest(run):
        model_dir = self._copy(run, "export")
        export_dir = os.path.join(self.root, f"{run}_exported")
        testing.run_binary("export", f"--model_dir={model_dir}",
                           f"--export_dir={export_dir}", check=True)
        model, prepared, step = checkpoints.restore_model(model_dir)
        self.assertEqual(step, 20)
        images, _ = synthetic.arrays("test")
        pixels = images[:5].astype(np.float32)
        expected = tf.nn.softmax(model(preprocessing.preprocess_for_eval(
            pixels, prepared.preprocessing), training=False)).numpy()
        loaded = tf.saved_model.load(os.path.join(export_dir, "1"))
        served = loaded.signatures["serving_default"](
            images=tf.constant(pixels))
        np.testing.assert_allclose(served["probabilities"].numpy(), expected,
                                   atol=SCORE_TOLERANCE)

  def test_an_old_run_resumes_from_its_checkpoint(self):
    for run in self.RUNS:
      with self.subTest(run):
        model_dir = self._copy(run, "resume")
        with open(os.path.join(model_dir, "config.json")) as f:
          old = json.load(f)["config"]
        testing.run_binary("train", f"--model_dir={model_dir}",
                           "--train_steps=30", check=True)
        self.assertEqual(
            [checkpoints.checkpoint_step(p)
             for p in checkpoints.checkpoint_prefixes(model_dir)], [30, 20])
        # Trained from step 20, not from scratch: the first record of the
        # new session is a start at step 20, and no step at or below 20 was
        # logged in it.
        records = metrics.read(model_dir)
        starts = [i for i, r in enumerate(records) if r.get("start")]
        self.assertEqual(records[starts[-1]]["step"], 20)
        self.assertTrue(all(r["step"] > 20 for r in records[starts[-1] + 1:]))
        # config.json's history holds the one change made, not the fields
        # this version added or renamed since (they take the values the old
        # run had); the file now uses today's names.
        with open(os.path.join(model_dir, "config.json")) as f:
          stored = json.load(f)
        self.assertEqual(stored["history"],
                         [{"step": 20, "changed": {"train_steps": [20, 30]}}])
        new = stored["config"]
        self.assertNotIn("ws_init_scale", new)
        self.assertNotIn("ws_init_scale", stored["model"]["options"])
        if old.get("residual") == "skipinit_ws_small":
          self.assertEqual(
              {name: new[name] for name in (
                  "residual", "branch_gain", "weight_standardization",
                  "ws_gain", "branch_init", "branch_init_scale")},
              {"residual": None, "branch_gain": "zero",
               "weight_standardization": True, "ws_gain": "trained",
               "branch_init": "paper",
               "branch_init_scale": old["ws_init_scale"]})

  def test_an_old_name_contradicting_a_new_one_is_refused(self):
    # Today's option beside the earlier name it contradicts: which the user
    # meant cannot be told, so no reading is chosen (and the file is not
    # rewritten under either). Where the pair sits decides who reads it:
    # "config" (train resumes from it) and model.options (evaluate
    # restores the network from it).
    from identity_tf.training import evaluation  # pylint: disable=g-import-not-at-top
    pairs = {
        "branch_gain": ("residual", "skipinit_ws_small", "branch_gain",
                        "none"),
        "weight_standardization": ("residual", "skipinit_ws",
                                   "weight_standardization", False),
        "branch_init_scale": ("ws_init_scale", 2.0, "branch_init_scale", 3.0),
    }
    for name, (old_key, old_value, new_key, new_value) in pairs.items():
      for place in ("options", "config"):
        with self.subTest(pair=name, place=place):
          model_dir = self._copy("run_7353787", f"{name}_{place}")
          path = os.path.join(model_dir, "config.json")
          with open(path) as f:
            description = json.load(f)
          target = (description["config"] if place == "config"
                    else description["model"]["options"])
          target.update({old_key: old_value, new_key: new_value})
          with open(path, "w") as f:
            json.dump(description, f)
          before = testing.snapshot(model_dir)
          # Whichever reads it: train, and evaluate's network.
          status, stderr, _ = testing.train_in_process(
              f"--model_dir={model_dir}", "--train_steps=30")
          self.assertEqual(status, 1, stderr)
          line = stderr.strip().splitlines()[-1]
          if place == "options":
            with self.assertRaises(ValueError) as caught:
              evaluation.evaluate_run(model_dir, emit=print, note=print)
            self.assertEqual(f"error: {caught.exception}", line)
          self.assertStartsWith(line, f"error: {path}: {old_key} "
                                f"{old_value!r} (an earlier version's name")
          self.assertIn(f"contradicts {new_key} {new_value!r}: keep one",
                        line)
          self.assertEqual(testing.snapshot(model_dir), before)
    # The binary's part, once: the line, exit status 1, no traceback.
    result = testing.run_binary("train", f"--model_dir={model_dir}",
                                "--train_steps=30")
    self.assertEqual(result.returncode, 1)
    self.assertNotIn("Traceback", result.stderr)
    self.assertIn("contradicts", testing.last_stderr_line(result))


if __name__ == "__main__":
  absltest.main()
