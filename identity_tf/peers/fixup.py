"""Fixup (Zhang, Dauphin & Ma, "Fixup initialization: residual learning
without normalization", ICLR 2019), as the authors' CIFAR code builds it.

Section 3's three rules: (1) the classification layer and the last layer of
every residual branch start at zero; (2) the branch's other layer is drawn
from He et al.'s normal distribution scaled by L^(-1/(2m-2)) = L^(-1/2) for
L branches of m = 2 layers; (3) a scalar multiplier (from 1) in every branch
and a scalar bias (from 0) before each convolution, linear layer and
activation. The network around the units is that of the authors' CIFAR
ResNets: a ReLU after each unit's sum and after the stem, a scalar bias
before the classifier, and a shortcut that subsamples and appends zero
channels where the shape changes.
"""

import keras
from keras import ops

from identity_tf import architectures
from identity_tf import layers

PACKAGE = "identity_tf"


@keras.saving.register_keras_serializable(package=PACKAGE)
class ScalarBias(keras.layers.Layer):
  """x + b with one trainable scalar b, 0 at initialisation (rule 3)."""

  def build(self, input_shape):
    self.bias = self.add_weight(name="bias", shape=(), initializer="zeros")

  def call(self, x):
    return x + ops.cast(self.bias, x.dtype)

  def compute_output_shape(self, input_shape):
    return input_shape


def subsample_shortcut(x, channels, strides):
  """The authors' shortcut: every STRIDES-th pixel (a 1x1 average pool with
  that stride), then zero channels appended up to CHANNELS."""
  if strides > 1:
    x = x[:, ::strides, ::strides, :]
  extra = channels - x.shape[-1]
  if extra:
    x = ops.pad(x, [[0, 0], [0, 0], [0, 0], [0, extra]])
  return x


@keras.saving.register_keras_serializable(package=PACKAGE)
class FixupUnit(layers.StridedUnit):
  """ReLU(S(x + b1) + s C2(ReLU(C1(x + b1) + b2) + b3) + b4).

  C1, C2: 3x3 convolutions without bias (C1 with the stride). C2 = 0 and
  C1 ~ N(0, 2 / (9 c_out)) / L, He et al.'s fan-out variance as the
  authors' code draws it, scaled by 1/L for L = NUM_BRANCHES (rule 2; the
  standard deviation by L^(-1/2)). b1..b4 = 0 and s = 1 are trainable
  scalars. S is the identity where the shape is kept, else
  `subsample_shortcut` of x + b1. With C2 = 0 the unit computes ReLU(x):
  exactly the identity on the non-negative input the previous ReLU gives.
  """

  def __init__(self, filters, strides=1, num_branches=1, seed=None,
               **kwargs):
    super().__init__(filters, strides, seed, **kwargs)
    if num_branches < 1:
      raise ValueError(f"FixupUnit needs num_branches >= 1; got "
                       f"{num_branches}")
    self.num_branches = int(num_branches)

  def build(self, input_shape):
    self._check_input(input_shape)
    self.conv1 = keras.layers.Conv2D(
        self.filters, 3, strides=self.strides, padding="same",
        use_bias=False, name="conv1", dtype=self.dtype_policy,
        kernel_initializer=keras.initializers.VarianceScaling(
            2.0 / self.num_branches, mode="fan_out",
            distribution="untruncated_normal", seed=self.seed))
    self.conv2 = keras.layers.Conv2D(
        self.filters, 3, padding="same", use_bias=False, name="conv2",
        kernel_initializer="zeros", dtype=self.dtype_policy)
    for name in ("bias1a", "bias1b", "bias2a", "bias2b"):
      setattr(self, name, self.add_weight(name=name, shape=(),
                                          initializer="zeros"))
    self.scale = self.add_weight(name="scale", shape=(), initializer="ones")
    self.conv1.build(input_shape)
    self.conv2.build(self.conv1.compute_output_shape(input_shape))

  def call(self, x):
    def plus(t, weight):
      return t + ops.cast(weight, t.dtype)
    shifted = plus(x, self.bias1a)
    hidden = ops.relu(plus(self.conv1(shifted), self.bias1b))
    branch = self.conv2(plus(hidden, self.bias2a))
    branch = plus(branch * ops.cast(self.scale, branch.dtype), self.bias2b)
    keeps_shape = self.strides == 1 and x.shape[-1] == self.filters
    skip = x if keeps_shape else subsample_shortcut(shifted, self.filters,
                                                     self.strides)
    return ops.relu(skip + ops.cast(branch, skip.dtype))

  def get_config(self):
    return {**super().get_config(), "num_branches": self.num_branches}


def build(arch, opts, inputs, head):
  """Fixup's network on INPUTS: features before the classifier, built by
  HEAD(features) (`model.build_model`'s final layer)."""
  seed = opts.seed * 1000
  x = inputs
  for i, (name, kernel, channels, stride) in enumerate(
      architectures.stem_plan(arch, opts)):
    # PyTorch's default, which the authors' code keeps for the stem:
    # U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    x = keras.layers.Conv2D(
        channels, kernel, strides=stride, padding="same", use_bias=False,
        name=name,
        kernel_initializer=keras.initializers.VarianceScaling(
            1 / 3, mode="fan_in", distribution="uniform", seed=seed + i))(x)
    x = ScalarBias(name=f"{name}_bias")(x)
    x = keras.layers.ReLU(name=f"{name}_relu")(x)
  plan = architectures.unit_plan(arch, opts)
  for number, (name, channels, stride, _) in enumerate(plan):
    x = FixupUnit(channels, strides=stride, num_branches=len(plan),
                  seed=seed + 10 + number, name=name)(x)
  return head(x, before_classifier=lambda h: ScalarBias(
      name="classifier_bias", dtype=h.dtype)(h))
