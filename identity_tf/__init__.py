"""identity_tf: Hardt & Ma, "Identity Matters in Deep Learning" (ICLR 2017).

    import identity_tf
    model = identity_tf.build_model("cifar10")

Layers live in `identity_tf.layers`, the networks in `identity_tf.model`.
The names below are imported on first use, so that `import identity_tf`
(and every binary's flag checking) does not load TensorFlow; importing
`identity_tf.layers` registers the layers for `keras.models.load_model`.
"""

import importlib

_LAZY = {
    "ConvResidualUnit": "identity_tf.layers",
    "DenseResidualUnit": "identity_tf.layers",
    "PreActivationUnit": "identity_tf.layers",
    "RandomProjection": "identity_tf.layers",
    "ResidualInitializer": "identity_tf.layers",
    "build_model": "identity_tf.model",
    "describe": "identity_tf.model",
    "MODELS": "identity_tf.architectures",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
  if name not in _LAZY:
    raise AttributeError(f"module 'identity_tf' has no attribute {name!r}")
  return getattr(importlib.import_module(_LAZY[name]), name)
