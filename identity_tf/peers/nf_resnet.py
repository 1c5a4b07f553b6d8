"""NF-ResNets (Brock, De & Smith, "Characterizing signal propagation to
close the performance gap in unnormalized ResNets", ICLR 2021).

Section 4's residual rule h_{i+1} = h_i + alpha f_i(h_i / beta_i): beta_i =
sqrt(Var(h_i)) is the expected standard deviation of the unit's input,
which grows as Var(h_{i+1}) = Var(h_i) + alpha^2 and is reset at the first
unit of every stage, whose shortcut (a convolution) takes the downscaled
input, so that Var = 1 + alpha^2 after it. Every convolution uses Scaled
Weight Standardisation (Section 4.2): W_hat = g (W - mean(W)) /
(std(W) sqrt(N)) per output channel, with N the fan-in and a trained gain
g; every ReLU is multiplied by gamma = sqrt(2 / (1 - 1/pi)), which makes it
variance-preserving for unit Gaussian inputs. As in the authors' code each
branch ends in a trainable scalar from 0 (SkipInit's), the network in a
ReLU, and the classifier is drawn from N(0, 0.01^2). The unit is the
pre-activation basic unit of Table 1's network.
"""

import math

import keras
from keras import ops

from identity_tf import architectures
from identity_tf import layers

PACKAGE = "identity_tf"
# gamma for ReLU: E[ReLU(z)^2] - E[ReLU(z)]^2 = (1 - 1/pi) / 2 for z ~
# N(0, 1); its inverse square root (Brock et al., 2021, Appendix D).
RELU_GAIN = math.sqrt(2 / (1 - 1 / math.pi))
ALPHA = 0.2


def scaled_relu(x):
  return ops.relu(x) * ops.cast(RELU_GAIN, x.dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ScaledReLU(keras.layers.Layer):
  """gamma ReLU(x), the network's last activation."""

  def call(self, x):
    return scaled_relu(x)

  def compute_output_shape(self, input_shape):
    return input_shape


@keras.saving.register_keras_serializable(package=PACKAGE)
class NFUnit(layers.StridedUnit):
  """h -> S(h) + alpha a C2(gamma ReLU(C1(x))), x = gamma ReLU(h) beta.

  C1 (with the stride) and C2: 3x3 `layers.ScaledWSConv2D`s with biases.
  S is the identity where the shape is kept, else a 1x1
  `layers.ScaledWSConv2D` with the stride applied to x (the downscaled
  input). a: a trained scalar, 0 at initialisation. BETA = 1 / the
  expected standard deviation of h.
  """

  def __init__(self, filters, strides=1, alpha=ALPHA, beta=1.0, seed=None,
               **kwargs):
    super().__init__(filters, strides, seed, **kwargs)
    if beta <= 0:
      raise ValueError(f"NFUnit needs a positive beta; got {beta}")
    self.alpha, self.beta = float(alpha), float(beta)

  def _conv(self, kernel, strides, offset, name):
    seed = None if self.seed is None else self.seed + offset
    return layers.ScaledWSConv2D(
        self.filters, kernel, strides=strides, padding="same", name=name,
        kernel_initializer=layers.unit_fan_in(seed), dtype=self.dtype_policy)

  def build(self, input_shape):
    self.conv1 = self._conv(3, self.strides, 0, "conv1")
    self.conv2 = self._conv(3, 1, 1, "conv2")
    self.projects = self.strides > 1 or input_shape[-1] != self.filters
    self.conv_shortcut = (self._conv(1, self.strides, 2, "conv_shortcut")
                          if self.projects else None)
    self.skip_gain = self.add_weight(name="skip_gain", shape=(),
                                     initializer="zeros")
    self.conv1.build(input_shape)
    hidden = self.conv1.compute_output_shape(input_shape)
    self.conv2.build(hidden)
    if self.projects:
      self.conv_shortcut.build(input_shape)

  def call(self, h):
    x = scaled_relu(h) * ops.cast(self.beta, h.dtype)
    shortcut = self.conv_shortcut(x) if self.projects else h
    branch = self.conv2(scaled_relu(self.conv1(x)))
    branch = branch * ops.cast(self.skip_gain * self.alpha, branch.dtype)
    return shortcut + ops.cast(branch, shortcut.dtype)

  def get_config(self):
    return {**super().get_config(), "alpha": self.alpha, "beta": self.beta}


def expected_stds(plan, alpha=ALPHA):
  """The expected standard deviation of each unit's input under Section
  4's rule, for PLAN (`architectures.unit_plan`): 1 after the stem, then
  Var += alpha^2 per unit, reset to 1 + alpha^2 after a stage's first."""
  stds, std = [], 1.0
  for _, _, _, index in plan:
    stds.append(std)
    if index == 0:
      std = 1.0
    std = math.sqrt(std ** 2 + alpha ** 2)
  return stds


def build(arch, opts, inputs, head):
  """The NF-ResNet on INPUTS, finished by HEAD (`model.build_model`)."""
  seed = opts.seed * 1000
  x = inputs
  for i, (name, kernel, channels, stride) in enumerate(
      architectures.stem_plan(arch, opts)):
    x = layers.ScaledWSConv2D(
        channels, kernel, strides=stride, padding="same", use_bias=False,
        name=name,
        kernel_initializer=layers.unit_fan_in(seed + i))(x)
  plan = architectures.unit_plan(arch, opts)
  for number, ((name, channels, stride, _), std) in enumerate(
      zip(plan, expected_stds(plan))):
    x = NFUnit(channels, strides=stride, beta=1.0 / std,
               seed=seed + 10 + 3 * number, name=name)(x)
  return head(ScaledReLU(name="final_relu")(x))
