"""Keras layers for identity-parametrized residual networks (Hardt & Ma, 2017).

Every residual unit here computes x + F(x) and is *exactly* the identity (or,
where the shape changes, the parameter-free shortcut) when its last weight
matrix is zero: the "identity parametrization" the paper studies. No layer
normalises its input except `PreActivationUnit`, the batch-norm baseline.

All layers are registered under the package name "identity_tf", so models
containing them load with plain `keras.models.load_model`.
"""

import math

import keras
import numpy as np
from keras import ops

from identity_tf import architectures

PACKAGE = "identity_tf"
# The options' values are data (architectures.py); the layers use them.
INIT_SCHEMES = architectures.INIT_SCHEMES
RESIDUALS = architectures.RESIDUALS
PROJECTION_SCALES = architectures.PROJECTION_SCALES
# The floor on var(W) * fan_in in `ScaledWSConv2D` (NF-ResNets' code).
WS_EPSILON = 1e-4


@keras.saving.register_keras_serializable(package=PACKAGE)
class ResidualInitializer(keras.initializers.Initializer):
  """Zero-mean Gaussian weights scaled by the fan-out k^2 c.

  For a k x k convolution kernel with c output channels (shape
  [k, k, c_in, c]) or a dense kernel with c outputs (k = 1):

  * "paper":    std = 1 / (k^2 c)        (Section 4 -- much smaller than
                                          usual, so every unit starts near
                                          the identity);
  * "standard": std = 1 / (k sqrt(c))    (the usual fan-out variance
                                          1/(k^2 c), He et al. without the 2).

  `scale` multiplies either std (a standardised kernel's draw,
  `ConvResidualUnit`'s `init_scale`).
  """

  SCHEMES = ("paper", "standard")

  def __init__(self, scheme="paper", seed=None, scale=1.0):
    if scheme not in self.SCHEMES:
      raise ValueError(
          f"unknown init scheme {scheme!r}; valid: {', '.join(self.SCHEMES)}")
    self.scheme = scheme
    self.seed = seed
    self.scale = float(scale)

  def stddev(self, shape):
    fan_out = math.prod(shape[:-2]) * shape[-1] if len(shape) > 2 else shape[-1]
    std = 1.0 / fan_out if self.scheme == "paper" else 1.0 / math.sqrt(fan_out)
    return self.scale * std

  def __call__(self, shape, dtype=None):
    return keras.random.normal(
        shape, stddev=self.stddev(shape), dtype=dtype, seed=self.seed)

  def get_config(self):
    return {"scheme": self.scheme, "seed": self.seed, "scale": self.scale}


def shortcut(x, channels, strides):
  """The parameter-free shortcut of a unit whose output has CHANNELS channels.

  Identity when the shape is kept. Otherwise average pooling with the stride
  and zero channels split evenly on both sides (the extra one, if odd, after),
  as the 2016 tensorflow/models resnet does.
  """
  in_channels = x.shape[-1]
  if strides > 1:
    x = ops.average_pool(x, pool_size=strides, strides=strides, padding="same")
  if channels != in_channels:
    extra = channels - in_channels
    x = ops.pad(x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])
  return x


class StridedUnit(keras.layers.Layer):
  """What every residual unit of a stage shares, this package's and the
  later methods' (`identity_tf.peers`): FILTERS output channels, the
  stride of its first convolution, the SEED of its weights, and so its
  output shape."""

  def __init__(self, filters, strides=1, seed=None, **kwargs):
    super().__init__(**kwargs)
    if filters <= 0 or strides <= 0:
      raise ValueError(f"{type(self).__name__} needs positive filters and "
                       f"strides; got {filters}, {strides}")
    self.filters, self.strides, self.seed = int(filters), int(strides), seed

  def _check_input(self, input_shape):
    if input_shape[-1] > self.filters:
      raise ValueError(
          f"{self.name}: a residual unit cannot shrink {input_shape[-1]} "
          f"channels to {self.filters}; use filters >= input channels")

  def compute_output_shape(self, input_shape):
    def out(n):
      return None if n is None else -(-n // self.strides)
    return (input_shape[0], out(input_shape[1]), out(input_shape[2]),
            self.filters)

  def get_config(self):
    return {**super().get_config(), "filters": self.filters,
            "strides": self.strides, "seed": self.seed}


def unit_fan_in(seed=None, scale=1.0):
  """N(0, 1 / fan_in), truncated at 2 std with the variance kept: where the
  kernels a `ScaledWSConv2D` standardises start (NF-ResNet's code), so that
  a step of the rate's size is of their size (the gradient scales as
  1 / ||W||). SCALE multiplies the std."""
  return keras.initializers.VarianceScaling(
      scale ** 2, mode="fan_in", distribution="truncated_normal", seed=seed)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ScaledWSConv2D(keras.layers.Conv2D):
  """A convolution whose kernel is standardised per output channel before
  use: gain * (W - mean) / sqrt(max(var * fan_in, 1e-4)), the gain a
  trained vector from 1 (Scaled Weight Standardisation: Brock, De & Smith,
  2021, Section 4.2). NF-ResNet's convolutions (`peers.nf_resnet`) and the
  standardised branch of `ConvResidualUnit`. The function it computes does
  not depend on the kernel's scale; its gradient does, as 1 / ||W||.

  `gain_trainable=False` keeps the gain at 1: standardisation without the
  per-channel scale, which is batch norm's gamma in all but its place.
  The gain is a weight either way, so checkpoints hold the same variables.
  """

  def __init__(self, *args, gain_trainable=True, **kwargs):
    super().__init__(*args, **kwargs)
    self.gain_trainable = bool(gain_trainable)

  def build(self, input_shape):
    super().build(input_shape)
    self.gain = self.add_weight(name="gain", shape=(self.filters,),
                                initializer="ones",
                                trainable=self.gain_trainable)

  def get_config(self):
    return {**super().get_config(), "gain_trainable": self.gain_trainable}

  def standardized_kernel(self):
    # Under mixed precision the kernel arrives rounded to 16 bits; the
    # standardisation itself is computed in float32.
    kernel = ops.cast(self.kernel, "float32")
    mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
    var = ops.var(kernel, axis=(0, 1, 2), keepdims=True)
    fan_in = math.prod(kernel.shape[:-1])
    scale = ops.rsqrt(ops.maximum(var * fan_in, WS_EPSILON)) * self.gain
    return (kernel - mean) * scale

  # Conv2D saves its kernel and bias by position only: the gain goes last.
  def _own_variables(self):
    return [self._kernel] + ([self.bias] if self.use_bias else []) + [
        self.gain]

  def save_own_variables(self, store):
    if self.built:
      for i, variable in enumerate(self._own_variables()):
        store[str(i)] = variable

  def load_own_variables(self, store):
    if self.built:
      for i, variable in enumerate(self._own_variables()):
        variable.assign(store[str(i)])

  def convolution_op(self, inputs, kernel):
    del kernel  # The standardised one, from the float32 weights.
    return super().convolution_op(
        inputs, ops.cast(self.standardized_kernel(), inputs.dtype))


class _ConvUnitBase(StridedUnit):
  """Configuration shared by the two convolutional residual units."""

  def __init__(self, filters, strides=1, use_bias=False,
               kernel_initializer="paper", kernel_size=3, seed=None,
               branch_dtype=None, **kwargs):
    super().__init__(filters, strides, seed, **kwargs)
    # The branch's own dtype policy (e.g. "mixed_bfloat16" inside a float32
    # unit: the branch computed in 16 bits, added to a float32 stream).
    # None: the unit's.
    self.branch_dtype = branch_dtype
    if kernel_size <= 0:
      raise ValueError(f"{type(self).__name__} needs a positive kernel_size;"
                       f" got {kernel_size}")
    self.use_bias = bool(use_bias)
    self.kernel_initializer = kernel_initializer
    self.kernel_size = int(kernel_size)

  def _conv(self, strides, seed_offset, name, init=None,
            conv_class=keras.layers.Conv2D, init_scale=1.0, **kwargs):
    init = init or self.kernel_initializer
    seed = None if self.seed is None else self.seed + seed_offset
    if init in ResidualInitializer.SCHEMES:
      init = ResidualInitializer(init, seed=seed, scale=init_scale)
    elif init == "fan_in":
      init = unit_fan_in(seed, init_scale)
    elif isinstance(init, str):
      init = keras.initializers.get(init)
    # The unit's own dtype policy, not the global one at build time, so that
    # a unit computes in the precision it was created (or saved) with.
    return conv_class(
        self.filters, self.kernel_size, strides=strides, padding="same",
        use_bias=self.use_bias, kernel_initializer=init, name=name,
        dtype=self.branch_dtype or self.dtype_policy, **kwargs)

  def get_config(self):
    init = self.kernel_initializer
    if not isinstance(init, str):
      init = keras.initializers.serialize(init)
    return {**super().get_config(), "use_bias": self.use_bias,
            "kernel_initializer": init, "kernel_size": self.kernel_size,
            "branch_dtype": self.branch_dtype}

  @classmethod
  def from_config(cls, config):
    init = config.get("kernel_initializer")
    if isinstance(init, dict):
      config = {**config,
                "kernel_initializer": keras.initializers.deserialize(init)}
    return cls(**config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ConvResidualUnit(_ConvUnitBase):
  """The paper's convolutional residual unit  x -> S(x) + C2(ReLU(C1 x)).

  C1 is a k x k convolution to `filters` channels with stride `strides`, C2 a
  k x k convolution with stride 1; S is `shortcut` (identity when the shape is
  kept). No normalisation anywhere; biases only if `use_bias`. With C2 = 0 the
  unit is exactly S: the identity parametrization of Section 4.

  The options re-parametrise the branch with the normalisation-free
  stabilisers that came after the paper, each on its own (the network's
  options of the same names, `architectures`):

  * `residual="fixup"`: S(x + b1) + s C2(ReLU(C1(x + b1) + b2) + b3) + b4
    with trained scalars b1..b4 = 0 and s = 1 (Zhang, Dauphin & Ma, 2019,
    Section 3, rule 3), C2 = 0 and C1 drawn from He et al.'s N(0, 2/fan_in)
    scaled by L^(-1/(2m-2)) = L^(-1/2) for L = `num_branches` residual
    branches of m = 2 layers (rule 2). Where the shape is kept S(x + b1) is
    x, as in Fixup's ResNets.
  * `branch_gain`: S(x) + a C2(ReLU(C1 x)) with a trained scalar
    `branch_gain` a, from 0 ("zero": SkipInit, De & Smith, 2020, Section 4;
    ReZero) -- the unit starts as exactly S -- or from 1 ("one").
  * `weight_standardization`: C1 and C2 are `ScaledWSConv2D`s (NF-ResNet's
    convolutions, Brock, De & Smith, 2021, Section 4.2): the same function
    class, the branch's output independent of its kernels' scale;
    `ws_gain="frozen"` keeps their per-channel gain at 1, untrained.
  * `kernel_initializer` ("paper", "standard", "fan_in" or "fixup") and
    `init_scale` s: C1 and C2 drawn at s times the scheme's std. Under
    weight standardisation the draw does not change the function, only the
    steps: a gradient step turns a small kernel more (the gradient scales as
    1/||W||, the step's angle as 1/||W||^2), so s turns them s^2 times
    slower.

  `kernel_initializer="fixup"` draws C1 and C2 by that rule 2 for the plain
  unit too: it then starts as exactly S.
  """

  def __init__(self, filters, residual="plain", num_branches=None,
               branch_gain="none", weight_standardization=False,
               ws_gain="trained", init_scale=1.0, **kwargs):
    super().__init__(filters, **kwargs)
    for name, value, valid in (("residual", residual, RESIDUALS),
                               ("branch_gain", branch_gain,
                                architectures.BRANCH_GAINS),
                               ("ws_gain", ws_gain, architectures.WS_GAINS)):
      if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: "
                         f"{', '.join(valid)}")
    fixup = "fixup" in (residual, self.kernel_initializer)
    if fixup and not (num_branches and num_branches >= 1):
      raise ValueError("Fixup's initialisation needs num_branches >= 1, the "
                       "number of residual branches in the network")
    if fixup and (weight_standardization or init_scale != 1):
      raise ValueError("Fixup's rule draws C2 = 0: it takes neither "
                       "weight_standardization nor an init_scale")
    if residual == "fixup" and branch_gain != "none":
      raise ValueError("residual fixup has its own multiplier; leave "
                       "branch_gain at none")
    if ws_gain != "trained" and not weight_standardization:
      raise ValueError("ws_gain is the gain of standardised convolutions: "
                       "set weight_standardization")
    self.residual = residual
    self.num_branches = None if num_branches is None else int(num_branches)
    self.branch_gain_init = branch_gain
    self.weight_standardization = bool(weight_standardization)
    self.ws_gain = ws_gain
    self.init_scale = float(init_scale)

  def build(self, input_shape):
    self._check_input(input_shape)
    if "fixup" in (self.residual, self.kernel_initializer):
      # Rule 2 of Fixup: He normal scaled by L^(-1/2) is variance
      # 2 / (L fan_in); the branch's last layer starts at zero.
      self.conv1 = self._conv(
          self.strides, 0, "conv1", keras.initializers.VarianceScaling(
              2.0 / self.num_branches, mode="fan_in",
              distribution="untruncated_normal", seed=self.seed))
      self.conv2 = self._conv(1, 1, "conv2", "zeros")
    else:
      conv_class, extra = keras.layers.Conv2D, {}
      if self.weight_standardization:
        conv_class = ScaledWSConv2D
        extra = {"gain_trainable": self.ws_gain == "trained"}
      self.conv1 = self._conv(self.strides, 0, "conv1",
                              conv_class=conv_class,
                              init_scale=self.init_scale, **extra)
      self.conv2 = self._conv(1, 1, "conv2", conv_class=conv_class,
                              init_scale=self.init_scale, **extra)
    if self.residual == "fixup":
      scalar = dict(shape=(), trainable=True)
      self.bias1a = self.add_weight(name="bias1a", initializer="zeros",
                                    **scalar)
      self.bias1b = self.add_weight(name="bias1b", initializer="zeros",
                                    **scalar)
      self.bias2a = self.add_weight(name="bias2a", initializer="zeros",
                                    **scalar)
      self.scale = self.add_weight(name="scale", initializer="ones", **scalar)
      self.bias2b = self.add_weight(name="bias2b", initializer="zeros",
                                    **scalar)
    if self.branch_gain_init != "none":
      self.branch_gain = self.add_weight(
          name="branch_gain", shape=(), trainable=True,
          initializer="ones" if self.branch_gain_init == "one" else "zeros")
    self.conv1.build(input_shape)
    self.conv2.build(self.conv1.compute_output_shape(input_shape))

  def call(self, x):
    # Each scalar in the dtype of what it meets; the branch is added in the
    # stream's dtype (they differ under branch_dtype).
    def plus(t, weight):
      return t + ops.cast(weight, t.dtype)
    if self.residual == "fixup":
      shifted = plus(x, self.bias1a)
      hidden = ops.relu(plus(self.conv1(shifted), self.bias1b))
      branch = self.conv2(plus(hidden, self.bias2a))
      branch = plus(branch * ops.cast(self.scale, branch.dtype), self.bias2b)
      changes_shape = self.strides > 1 or x.shape[-1] != self.filters
      return shortcut(shifted if changes_shape else x, self.filters,
                      self.strides) + ops.cast(branch, x.dtype)
    branch = self.conv2(ops.relu(self.conv1(x)))
    if self.branch_gain_init != "none":
      branch = branch * ops.cast(self.branch_gain, branch.dtype)
    return shortcut(x, self.filters, self.strides) + ops.cast(branch, x.dtype)

  def get_config(self):
    return {**super().get_config(), "residual": self.residual,
            "num_branches": self.num_branches,
            "branch_gain": self.branch_gain_init,
            "weight_standardization": self.weight_standardization,
            "ws_gain": self.ws_gain, "init_scale": self.init_scale}

  @classmethod
  def from_config(cls, config):
    """Also reads the configuration an earlier version saved: one
    `residual` naming a combination and `ws_init_scale`
    (`architectures.translate_legacy`)."""
    config = dict(config)
    legacy = architectures.translate_legacy(
        {key: config.pop(key) for key in ("residual", "ws_init_scale")
         if key in config})
    draw = legacy.pop("branch_init", None)
    if draw is not None:
      config["kernel_initializer"] = draw
    if "branch_init_scale" in legacy:
      config["init_scale"] = legacy.pop("branch_init_scale")
    return super().from_config({**config, **legacy})


@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActivationUnit(_ConvUnitBase):
  """The batch-norm baseline: the pre-activation unit of He et al. (2016).

  x -> S(x) + C2(ReLU(BN(C1(ReLU(BN(x)))))), with the same parameter-free
  shortcut S as `ConvResidualUnit`, as in the 2016 tensorflow/models resnet.
  """

  def build(self, input_shape):
    self._check_input(input_shape)
    branch_dtype = self.branch_dtype or self.dtype_policy
    self.bn1 = keras.layers.BatchNormalization(name="bn1", dtype=branch_dtype)
    self.conv1 = self._conv(self.strides, 0, "conv1")
    self.bn2 = keras.layers.BatchNormalization(name="bn2", dtype=branch_dtype)
    self.conv2 = self._conv(1, 1, "conv2")
    self.bn1.build(input_shape)
    self.conv1.build(input_shape)
    hidden = self.conv1.compute_output_shape(input_shape)
    self.bn2.build(hidden)
    self.conv2.build(hidden)

  def call(self, x, training=None):
    branch = self.conv1(ops.relu(self.bn1(x, training=training)))
    branch = self.conv2(ops.relu(self.bn2(branch, training=training)))
    return shortcut(x, self.filters, self.strides) + ops.cast(branch, x.dtype)


@keras.saving.register_keras_serializable(package=PACKAGE)
class DenseResidualUnit(keras.layers.Layer):
  """The dense residual unit of Section 3:  h -> h + V ReLU(U h + b).

  U, V are k x k matrices (k = the input width) and b in R^k. In Keras's
  row-vector convention the kernels are stored transposed: the layer computes
  h + relu(h @ U^T + b) @ V^T, and `set_matrices(U, V, b)` takes the paper's
  U, V, b as written. With V = 0 the unit is the identity.
  """

  def __init__(self, kernel_initializer="paper", seed=None, **kwargs):
    super().__init__(**kwargs)
    self.kernel_initializer = kernel_initializer
    self.seed = seed

  def build(self, input_shape):
    k = input_shape[-1]
    init = self.kernel_initializer
    seeds = (None, None) if self.seed is None else (self.seed, self.seed + 1)
    inits = ([ResidualInitializer(init, seed=s) for s in seeds]
             if init in ResidualInitializer.SCHEMES else [init, init])
    self.u_kernel = self.add_weight(
        name="u_kernel", shape=(k, k), initializer=inits[0])
    self.bias = self.add_weight(name="bias", shape=(k,), initializer="zeros")
    self.v_kernel = self.add_weight(
        name="v_kernel", shape=(k, k), initializer=inits[1])

  def call(self, h):
    hidden = ops.relu(ops.matmul(h, self.u_kernel) + self.bias)
    return h + ops.matmul(hidden, self.v_kernel)

  def set_matrices(self, u, v, b):
    """Sets the paper's U, V (k x k, acting on column vectors) and b (k,)."""
    self.u_kernel.assign(np.transpose(u))
    self.v_kernel.assign(np.transpose(v))
    self.bias.assign(b)

  def compute_output_shape(self, input_shape):
    return input_shape

  def get_config(self):
    return {**super().get_config(),
            "kernel_initializer": self.kernel_initializer, "seed": self.seed}


@keras.saving.register_keras_serializable(package=PACKAGE)
class RandomProjection(keras.layers.Layer):
  """The final linear map to `units` classes, drawn once and never trained.

  The kernel P in R^{d x units} has i.i.d. N(0, 1/units) entries drawn with
  NumPy from `seed`, so the same seed gives the same P on any machine, and
  E ||h P||^2 = ||h||^2: the projection preserves the feature norm in
  expectation (the Johnson-Lindenstrauss scale). `scale="features"` draws
  N(0, 1/d) instead: every logit then has the variance of one feature, a
  factor d/units smaller. The paper fixes this layer
  ("random projection (not trained)") so that all learning happens in the
  residual units. It is a non-trainable weight: absent from
  `trainable_weights`, untouched by `fit`, but saved in checkpoints and
  `.keras` files like any other weight. `trainable=True` makes it an ordinary
  trainable linear head (used by the batch-norm baseline). `logit_scale`
  multiplies the drawn entries: a fixed scale of the logits.
  """

  def __init__(self, units, seed=0, trainable=False, scale="classes",
               logit_scale=1.0, **kwargs):
    super().__init__(trainable=trainable, **kwargs)
    if units <= 0:
      raise ValueError(f"RandomProjection needs units > 0, got {units}")
    if scale not in PROJECTION_SCALES:
      raise ValueError(f"unknown projection scale {scale!r}; valid: "
                       f"{', '.join(PROJECTION_SCALES)}")
    self.units = int(units)
    self.seed = int(seed)
    self.scale = scale
    self.logit_scale = float(logit_scale)

  def build(self, input_shape):
    d = input_shape[-1]
    rng = np.random.default_rng(self.seed)
    fan = self.units if self.scale == "classes" else d
    matrix = (rng.standard_normal((d, self.units)) / math.sqrt(fan)
              * self.logit_scale)
    self.kernel = self.add_weight(
        name="kernel", shape=(d, self.units),
        initializer=keras.initializers.Constant(matrix.astype("float32")),
        trainable=self.trainable)

  def call(self, h):
    return ops.matmul(h, ops.cast(self.kernel, h.dtype))

  def compute_output_shape(self, input_shape):
    return (*input_shape[:-1], self.units)

  def get_config(self):
    return {**super().get_config(), "units": self.units, "seed": self.seed,
            "scale": self.scale, "logit_scale": self.logit_scale}
