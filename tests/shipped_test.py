"""The trained networks shipped under models/, and //bin:ship_model.

Every folder of models/ is checked against its manifest (each file's
SHA-256 recomputed here) and its config.json against the preset it names
and the command that trained it; README's "Trained networks" table lists
each with the manifest's test top-1. A tiny run packed here shows that
evaluate and export take a shipped folder and write nothing into it, and
that a changed file is refused in one line.
"""

import hashlib
import json
import os
import re
import shlex
import shutil

from absl.testing import absltest
import tensorflow as tf

from identity_tf import configs
from identity_tf.training import checkpoints
from identity_tf.training import config_file
from identity_tf.training import shipped
import testing

MODELS = os.path.join(testing.source_root(), "models")


def _digest(path):
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def _flags(command):
  """{flag: value} of a //bin:train command line ("--name=value")."""
  words = shlex.split(command)
  return dict(word[2:].split("=", 1) for word in words
              if word.startswith("--") and "=" in word)


class CommittedModelsTest(absltest.TestCase):

  def _models(self):
    if not os.path.isdir(MODELS):  # None shipped yet.
      return []
    return sorted(name for name in os.listdir(MODELS)
                  if os.path.isdir(os.path.join(MODELS, name)))

  def test_each_file_is_the_one_its_manifest_names(self):
    for name in self._models():
      with self.subTest(name):
        folder = os.path.join(MODELS, name)
        with open(os.path.join(folder, shipped.MANIFEST)) as f:
          manifest = json.load(f)
        self.assertEqual(sorted(manifest["files"]), sorted(
            entry for entry in os.listdir(folder)
            if entry != shipped.MANIFEST))
        for entry, digest in manifest["files"].items():
          self.assertEqual(_digest(os.path.join(folder, entry)), digest,
                           entry)
        shipped.verify(folder)
        # A few MB: the network's checkpoint, not a run directory.
        size = sum(os.path.getsize(os.path.join(folder, entry))
                   for entry in os.listdir(folder))
        self.assertLess(size, 20 << 20)

  def test_each_checkpoint_is_the_finished_network_its_config_builds(self):
    for name in self._models():
      with self.subTest(name):
        folder = os.path.join(MODELS, name)
        # Every weight of the network config.json describes, none missing
        # or left over (`check_network`), from the run's last step.
        _, run, step = checkpoints.restore_checkpoint(
            folder, checkpoints.find_checkpoint(folder))
        self.assertEqual(step, run.config.train_steps)

  def test_each_config_is_its_preset_and_command(self):
    with open(os.path.join(testing.source_root(), "README.md")) as f:
      readme = f.read()
    for name in self._models():
      with self.subTest(name):
        folder = os.path.join(MODELS, name)
        manifest = shipped.read_manifest(folder)
        stored = config_file.stored_config(folder)
        flags = _flags(manifest["command"])
        self.assertEqual(stored.preset, flags["preset"])
        self.assertEqual(stored.preset, name)
        # The preset with the command's flags, and nothing else.
        expected = configs.from_preset(flags.pop("preset"), **{
            key: type(getattr(configs.PRESETS[stored.preset], key))(value)
            if not isinstance(getattr(configs.PRESETS[stored.preset], key),
                              bool) else value in ("true", "True", "1")
            for key, value in flags.items()
            if key in configs.Config.__dataclass_fields__})
        for field in configs.Config.__dataclass_fields__:
          if field not in configs.BOOKKEEPING_FIELDS:
            self.assertEqual(getattr(stored, field), getattr(expected, field),
                             field)
        # README's table row: name, width, the manifest's test top-1.
        row = re.search(rf"^\| `models/{name}` \| ([\d.]+) \| "
                        rf"([\d.]+) % \|", readme, re.MULTILINE)
        self.assertIsNotNone(row, f"README names no models/{name}")
        self.assertEqual(float(row.group(1)), stored.width)
        self.assertEqual(row.group(2), f"{100 * manifest['test_top1']:.2f}")


class ShipModelTest(testing.SharedRootTestCase):

  def test_a_shipped_folder_is_read_never_written(self):
    run = os.path.join(self.root, "run")
    # With a weight average: what is shipped is what the run evaluates.
    testing.run_binary("train", "--preset=smoke", "--width=0.0625",
                       "--units=1", "--train_steps=20", "--ema_decay=0.9",
                       "--checkpoint_steps=10", "--num_eval_examples=100",
                       f"--model_dir={run}", check=True)
    folder = os.path.join(self.root, "models", "smoke")
    result = testing.run_binary(
        "ship_model", f"--model_dir={run}", f"--output_dir={folder}",
        "--command=./bazelw run //bin:train -- --preset=smoke",
        "--test_top1=0.5", check=True)
    self.assertEqual(result.stdout.strip(),
                     os.path.join(folder, shipped.MANIFEST))
    # The newest checkpoint and config.json, named in the manifest.
    self.assertEqual(sorted(os.listdir(folder)), [
        "checkpoint", "ckpt-20.data-00000-of-00001", "ckpt-20.index",
        "ckpt-20.sha256", "config.json", "manifest.json"])
    # The network's weights alone: no optimizer slot, no input position.
    stored = [name for name, _ in tf.train.list_variables(
        os.path.join(folder, "ckpt-20"))]
    self.assertTrue(stored)
    self.assertEqual([n for n in stored if not n.startswith("model/")],
                     ["_CHECKPOINTABLE_OBJECT_GRAPH"])
    before = testing.snapshot(folder)
    evaluated = testing.run_binary("evaluate", f"--model_dir={folder}",
                                   check=True)
    scores = json.loads(evaluated.stdout.strip().splitlines()[-1])
    self.assertEqual(scores["global_step"], 20)
    # Scored as the run itself scores its checkpoint (the average's
    # weights), to the last digit.
    original = json.loads(testing.run_binary(
        "evaluate", f"--model_dir={run}",
        check=True).stdout.strip().splitlines()[-1])
    for key in ("top1", "top5", "loss"):
      self.assertEqual(scores[key], original[key], key)
    self.assertIn("is a shipped model: the result is not recorded",
                  evaluated.stderr)
    testing.run_binary("export", f"--model_dir={folder}",
                       f"--export_dir={self.root}/export", check=True)
    self.assertEqual(testing.snapshot(folder), before)
    # A file changed after shipping: refused in one line, nothing written.
    changed = os.path.join(self.root, "changed")
    shutil.copytree(folder, changed)
    with open(os.path.join(changed, "config.json"), "a") as f:
      f.write(" ")
    before = testing.snapshot(changed)
    for binary, args in (("evaluate", []),
                         ("export", [f"--export_dir={self.root}/e2"])):
      with self.subTest(binary):
        result = testing.run_binary(binary, f"--model_dir={changed}", *args)
        self.assertEqual(result.returncode, 1)
        self.assertEqual(
            testing.last_stderr_line(result),
            f"error: {changed}/config.json does not match its SHA-256 in "
            f"manifest.json; restore the folder from the repository (git "
            f"checkout -- {changed})")
        self.assertEqual(testing.snapshot(changed), before)
    # Into a folder that holds something: refused.
    result = testing.run_binary(
        "ship_model", f"--model_dir={run}", f"--output_dir={folder}",
        "--command=x", "--test_top1=0.5")
    self.assertEqual(result.returncode, 1)
    self.assertIn("is not empty", testing.last_stderr_line(result))


if __name__ == "__main__":
  absltest.main()
