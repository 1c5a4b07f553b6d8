"""SkipInit (De & Smith, "Batch normalization biases residual blocks
towards the identity function in deep networks", NeurIPS 2020, Section 4).

Batch norm's effect at initialisation is to downscale every residual
branch, so that the network starts close to the identity. SkipInit removes
the normalisation and puts one trainable scalar, initialised to 0, at the
end of every branch: each unit then starts exactly as its shortcut. The
network is the batch-norm baseline's (`layers.PreActivationUnit`, the
pre-activation unit of He et al., 2016) with the batch norms removed, He
et al.'s initialisation, a final ReLU, and a trained classifier.
"""

import keras
from keras import ops

from identity_tf import architectures
from identity_tf import layers

PACKAGE = "identity_tf"


@keras.saving.register_keras_serializable(package=PACKAGE)
class SkipInitUnit(layers.StridedUnit):
  """x -> S(x) + a C2(ReLU(C1(ReLU(x)))), a = 0 at initialisation.

  C1 (with the stride) and C2: 3x3 convolutions without bias, drawn from
  He et al.'s N(0, 2 / fan_in). S: `layers.shortcut` (the baseline's).
  """

  def build(self, input_shape):
    self._check_input(input_shape)
    def conv(strides, offset, name):
      seed = None if self.seed is None else self.seed + offset
      return keras.layers.Conv2D(
          self.filters, 3, strides=strides, padding="same", use_bias=False,
          kernel_initializer=keras.initializers.HeNormal(seed=seed),
          name=name, dtype=self.dtype_policy)
    self.conv1 = conv(self.strides, 0, "conv1")
    self.conv2 = conv(1, 1, "conv2")
    self.skip_gain = self.add_weight(name="skip_gain", shape=(),
                                     initializer="zeros")
    self.conv1.build(input_shape)
    self.conv2.build(self.conv1.compute_output_shape(input_shape))

  def call(self, x):
    branch = self.conv2(ops.relu(self.conv1(ops.relu(x))))
    branch = branch * ops.cast(self.skip_gain, branch.dtype)
    return (layers.shortcut(x, self.filters, self.strides)
            + ops.cast(branch, x.dtype))


def build(arch, opts, inputs, head):
  """SkipInit's network on INPUTS, finished by HEAD (`model.build_model`)."""
  seed = opts.seed * 1000
  x = inputs
  for i, (name, kernel, channels, stride) in enumerate(
      architectures.stem_plan(arch, opts)):
    x = keras.layers.Conv2D(
        channels, kernel, strides=stride, padding="same", use_bias=False,
        name=name,
        kernel_initializer=keras.initializers.HeNormal(seed=seed + i))(x)
  for number, (name, channels, stride, _) in enumerate(
      architectures.unit_plan(arch, opts)):
    x = SkipInitUnit(channels, strides=stride, seed=seed + 10 + 2 * number,
                     name=name)(x)
  # The baseline's final batch norm and ReLU, without the batch norm.
  return head(keras.layers.ReLU(name="final_relu")(x))
