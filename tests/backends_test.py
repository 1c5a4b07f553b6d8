"""The layers and networks on Keras 3's JAX and PyTorch backends.

`identity_tf.layers` and `identity_tf.model.build_model` use only `keras.ops`:
for each backend whose package is installed, a child process with
KERAS_BACKEND set builds the CIFAR network at a small width, runs a forward
pass and one `fit` step, and saves a `.keras` file; this process (TensorFlow)
loads it and must compute the same logits. A backend whose package is
missing is skipped, saying how to install it -- except under CI=true, where
it fails (`testing.require_optional_package`). Training, export and serving
stay TensorFlow's (README.md).
"""

import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import keras
import numpy as np

from identity_tf import layers  # Importing registers them with Keras.
import testing

_INSTALL = {"jax": "pip install 'jax[cpu]'",
            "torch": "pip install torch==2.13.0 (the CPU build: "
                     "requirements-benchmark.txt)"}

# Run under KERAS_BACKEND=<backend>; prints the module of the logits' type.
_CHILD = r"""
import sys
import keras
import numpy as np
from identity_tf import model
assert keras.backend.backend() == sys.argv[1], keras.backend.backend()
net = model.build_model("cifar10", width=0.125, units=1, seed=3)
images = np.load(sys.argv[2])
before = keras.ops.convert_to_numpy(net(images))
net.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
net.fit(images, np.arange(len(images)) % 10, batch_size=len(images), epochs=1,
        verbose=0)
after = keras.ops.convert_to_numpy(net(images))
assert np.all(np.isfinite(after)) and not np.array_equal(before, after)
net.save(sys.argv[3])
np.save(sys.argv[4], after)
print(type(net(images)).__module__)
"""


class BackendsTest(parameterized.TestCase):

  @parameterized.parameters("jax", "torch")
  def test_layers_train_and_load_under_tensorflow(self, backend):
    testing.require_optional_package(self, backend, _INSTALL[backend])
    directory = self.create_tempdir().full_path
    images = np.random.default_rng(0).standard_normal(
        (4, 32, 32, 3)).astype(np.float32)
    paths = [os.path.join(directory, name)
             for name in ("images.npy", "model.keras", "logits.npy")]
    np.save(paths[0], images)
    env = testing.binary_env(dict(os.environ, KERAS_BACKEND=backend))
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, backend, *paths], capture_output=True,
        text=True, env=env, timeout=600, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    # The backend's own tensors (jaxlib..., torch), not TensorFlow's.
    self.assertTrue(result.stdout.split()[-1].startswith(backend),
                    result.stdout)
    loaded = keras.models.load_model(paths[1])
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(images)),
                               np.load(paths[2]), rtol=1e-4, atol=1e-6)
    unit = loaded.get_layer("stage1_unit1")
    self.assertIsInstance(unit, layers.ConvResidualUnit)
    self.assertEqual(unit.residual, "plain")


if __name__ == "__main__":
  absltest.main()
