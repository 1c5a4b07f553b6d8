"""The network of Theorem 3.2 as a Keras model, from the library's layers.

`build_keras_model(weights)` turns `construction.construct`'s weights into a
`ResidualConstruction`: the sphere projection, the `layers.DenseResidualUnit`s
and the ReLU readout. Importing this module registers the layers, so
`model.keras` files written from it load with `keras.models.load_model`
after `import identity_tf.theory.construction_model`.
"""

import keras
import numpy as np
from keras import ops

from identity_tf import layers

PACKAGE = layers.PACKAGE


@keras.saving.register_keras_serializable(package=PACKAGE)
class SphereProjection(keras.layers.Layer):
  """x -> A0 z with z = concat((x - mu)/s, [t]) / norm (Assumption 3.1 + JL).

  mu, s, t and A0 (units x (d + 1)) are non-trainable weights: fixed by the
  construction, or drawn once and kept fixed when the architecture is
  trained (the paper's random projection is not trained either).
  """

  def __init__(self, units, **kwargs):
    super().__init__(trainable=False, **kwargs)
    self.units = int(units)

  def build(self, input_shape):
    d = input_shape[-1]
    self.mu = self.add_weight(name="mu", shape=(d,), initializer="zeros",
                              trainable=False)
    self.scale = self.add_weight(name="s", shape=(), initializer="ones",
                                 trainable=False)
    self.offset = self.add_weight(name="t", shape=(), initializer="ones",
                                  trainable=False)
    self.projection = self.add_weight(
        name="A0", shape=(self.units, d + 1), initializer="zeros",
        trainable=False)

  def call(self, x):
    centred = (x - self.mu) / self.scale
    column = ops.ones_like(centred[..., :1]) * self.offset
    z = ops.concatenate([centred, column], axis=-1)
    z = z / ops.sqrt(ops.sum(z * z, axis=-1, keepdims=True))
    return ops.matmul(z, ops.transpose(self.projection))

  def set_values(self, mu, s, t, a0):
    self.mu.assign(mu)
    self.scale.assign(s)
    self.offset.assign(t)
    self.projection.assign(a0)

  def compute_output_shape(self, input_shape):
    return (*input_shape[:-1], self.units)

  def get_config(self):
    return {**super().get_config(), "units": self.units}

  @classmethod
  def from_config(cls, config):
    config = {key: value for key, value in config.items()
              if key != "trainable"}
    return cls(**config)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ReluReadout(keras.layers.Layer):
  """The final map of Theorem 3.2: logits = V_out relu(U_out h + b_out).

  `hidden` ReLUs (m), `units` classes (r). Kernels are stored transposed
  (Keras's row vectors); `set_matrices` takes the paper's column-vector
  U_out (m, k), b_out (m,), V_out (r, m).
  """

  def __init__(self, hidden, units, kernel_initializer="zeros", **kwargs):
    super().__init__(**kwargs)
    self.hidden = int(hidden)
    self.units = int(units)
    self.kernel_initializer = kernel_initializer

  def _initializer(self, seed):
    if self.kernel_initializer in layers.ResidualInitializer.SCHEMES:
      return layers.ResidualInitializer(self.kernel_initializer, seed=seed)
    return self.kernel_initializer

  def build(self, input_shape):
    k = input_shape[-1]
    self.u_kernel = self.add_weight(
        name="u_kernel", shape=(k, self.hidden), initializer=self._initializer(1))
    self.bias = self.add_weight(name="bias", shape=(self.hidden,),
                                initializer="zeros")
    self.v_kernel = self.add_weight(
        name="v_kernel", shape=(self.hidden, self.units),
        initializer=self._initializer(2))

  def call(self, h):
    return ops.matmul(ops.relu(ops.matmul(h, self.u_kernel) + self.bias),
                      self.v_kernel)

  def set_matrices(self, u_out, b_out, v_out):
    self.u_kernel.assign(np.transpose(u_out))
    self.bias.assign(b_out)
    self.v_kernel.assign(np.transpose(v_out))

  def compute_output_shape(self, input_shape):
    return (*input_shape[:-1], self.units)

  def get_config(self):
    return {**super().get_config(), "hidden": self.hidden,
            "units": self.units,
            "kernel_initializer": self.kernel_initializer}


@keras.saving.register_keras_serializable(package=PACKAGE)
class ResidualConstruction(keras.Model):
  """The network shape of Theorem 3.2 as a Keras model.

  SphereProjection (mu, s, t, A0) -> NUM_UNITS `layers.DenseResidualUnit`s of
  width WIDTH -> ReluReadout (HIDDEN ReLUs, CLASSES logits). A subclassed
  model rather than a functional one: a functional graph thousands of layers
  deep exceeds Python's recursion limit when Keras walks it. INIT is the
  residual units' and readout's initializer ("paper" for the paper's
  Gaussian, "zeros" when the construction sets the weights).
  """

  def __init__(self, input_dim, width, num_units, hidden, classes,
               init="zeros", seed=0, **kwargs):
    super().__init__(**kwargs)
    self.input_dim = int(input_dim)
    self.width = int(width)
    self.num_units = int(num_units)
    self.hidden = int(hidden)
    self.classes = int(classes)
    self.init = init
    self.seed = int(seed)
    dtype = self.dtype_policy
    self.projection = SphereProjection(self.width, dtype=dtype,
                                       name="sphere_projection")
    self.residual_units = [
        layers.DenseResidualUnit(
            kernel_initializer=init,
            seed=None if init == "zeros" else self.seed * 100003 + 2 * unit,
            dtype=dtype, name=f"unit{unit + 1}")
        for unit in range(self.num_units)]
    self.readout = ReluReadout(self.hidden, self.classes,
                               kernel_initializer=init, dtype=dtype,
                               name="readout")

  def build(self, input_shape):
    shape = (None, self.input_dim)
    self.projection.build(shape)
    shape = (None, self.width)
    for unit in self.residual_units:
      unit.build(shape)
    self.readout.build(shape)

  def call(self, x):
    h = self.projection(x)
    for unit in self.residual_units:
      h = unit(h)
    return self.readout(h)

  def compute_output_shape(self, input_shape):
    return (*input_shape[:-1], self.classes)

  def get_config(self):
    return {"input_dim": self.input_dim, "width": self.width,
            "num_units": self.num_units, "hidden": self.hidden,
            "classes": self.classes, "init": self.init, "seed": self.seed,
            "name": self.name,
            "dtype": keras.saving.serialize_keras_object(self.dtype_policy)}

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    if isinstance(config.get("dtype"), dict):
      config["dtype"] = keras.saving.deserialize_keras_object(config["dtype"])
    return cls(**config)


def build_architecture(d, k, num_units, hidden, classes, init="zeros",
                       dtype="float64", seed=0):
  """A built `ResidualConstruction` (weights initialised by INIT)."""
  model = ResidualConstruction(d, k, num_units, hidden, classes, init=init,
                               seed=seed, dtype=dtype, name="theorem_3_2")
  model.build((None, d))
  return model


def build_keras_model(weights):
  """The function encoded by WEIGHTS, built from the library's layers."""
  d = weights["mu"].shape[0]
  num_units, k = weights["U"].shape[:2]
  model = build_architecture(d, k, num_units, weights["U_out"].shape[0],
                             weights["V_out"].shape[0])
  model.projection.set_values(
      weights["mu"], weights["s"], weights["t"], weights["A0"])
  for unit, layer in enumerate(model.residual_units):
    layer.set_matrices(weights["U"][unit], weights["V"][unit],
                       weights["b"][unit])
  model.readout.set_matrices(
      weights["U_out"], weights["b_out"], weights["V_out"])
  return model


def keras_logits(model, x, batch_size=4096):
  """MODEL's logits on X in float64, batch by batch.

  Calls the model directly: `model.predict` on a NumPy float64 array casts it
  to float32 first (Keras's floatx), which moves inputs by ~1e-8 relative --
  enough to spoil inputs that are close together.
  """
  x = np.asarray(x, np.float64)
  return np.concatenate([
      np.asarray(model(x[start:start + batch_size]))
      for start in range(0, len(x), batch_size)]) if len(x) else np.zeros(
          (0, model.classes))
