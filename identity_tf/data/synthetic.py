"""The built-in `synthetic` dataset: learnable textures, made with NumPy.

CIFAR-shaped (32x32x3, 10 classes, 10,000 training and 2,000 test images)
and deterministic, so that everything runs without a download; see
`synthetic_arrays` and docs/data.md.
"""

import functools

import numpy as np

from identity_tf import errors
from identity_tf.data import datasets

SYNTHETIC_SEED = 2017
_SYNTHETIC_GRATINGS = 3  # Per class.


@functools.lru_cache(maxsize=None)
def arrays(split):
  """The synthetic dataset's (images uint8 [N, 32, 32, 3], labels int32 [N]).

  Deterministic (NumPy, fixed seed) and learnable but not trivially: every
  class is a texture, a sum of 3 colour gratings with class-specific spatial
  frequencies, orientations and colours, plus a faint class-specific tint.
  Each image is its class texture with a random phase per grating (so no
  single pixel is informative), random contrast and brightness, and strong
  Gaussian pixel noise. A small convnet with global pooling picks up the
  textures within a few hundred steps. The arrays are cached per process and
  read-only.
  """
  info = datasets.synthetic_info()
  if split not in (info.train_split, info.eval_split):
    raise errors.DataError(
        f"synthetic has splits {info.train_split!r} and {info.eval_split!r}, "
        f"not {split!r}")
  classes, size = info.num_classes, info.image_shape[0]
  class_rng = np.random.default_rng(SYNTHETIC_SEED)
  # Distinct integer frequency vectors (fy, fx), |f| <= 5 cycles per image.
  candidates = [(fy, fx) for fy in range(-5, 6) for fx in range(0, 6)
                if (fx > 0 or fy > 0) and fy * fy + fx * fx <= 25]
  picks = class_rng.permutation(len(candidates))[:classes * _SYNTHETIC_GRATINGS]
  freqs = np.array(candidates, np.float32)[picks].reshape(
      classes, _SYNTHETIC_GRATINGS, 2)
  colours = class_rng.standard_normal((classes, _SYNTHETIC_GRATINGS, 3))
  colours /= np.linalg.norm(colours, axis=-1, keepdims=True)
  tints = class_rng.standard_normal((classes, 3))

  is_train = split == info.train_split
  count = info.num_train_examples if is_train else info.num_eval_examples
  rng = np.random.default_rng([SYNTHETIC_SEED, 0 if is_train else 1])
  labels = rng.integers(0, classes, count).astype(np.int32)
  phases = rng.uniform(0, 2 * np.pi, (count, _SYNTHETIC_GRATINGS))
  contrast = rng.uniform(0.6, 1.4, (count, 1, 1, 1)).astype(np.float32)
  brightness = rng.uniform(-20, 20, (count, 1, 1, 1)).astype(np.float32)

  coords = np.arange(size, dtype=np.float32)
  images = np.empty((count, size, size, 3), np.uint8)
  chunk = 1000
  for start in range(0, count, chunk):
    sl = slice(start, min(count, start + chunk))
    f = freqs[labels[sl]]                                    # [n, g, 2]
    # angle[n, g, y, x] = 2 pi (fy y + fx x) / S + phase[n, g]: a random
    # phase per grating, so the texture sits at a random position.
    angle = (2 * np.pi / size) * (
        f[:, :, 0, None, None] * coords[None, None, :, None] +
        f[:, :, 1, None, None] * coords[None, None, None, :])
    angle = angle + phases[sl, :, None, None].astype(np.float32)
    texture = np.einsum("ngyx,ngc->nyxc", np.cos(angle).astype(np.float32),
                        colours[labels[sl]].astype(np.float32))
    noise = rng.standard_normal(texture.shape, dtype=np.float32)
    pixels = (128.0 + brightness[sl] +
              contrast[sl] * (28.0 * texture +
                              8.0 * tints[labels[sl], None, None, :]) +
              48.0 * noise)
    images[sl] = np.clip(np.round(pixels), 0, 255).astype(np.uint8)
  images.setflags(write=False)
  labels.setflags(write=False)
  return images, labels


