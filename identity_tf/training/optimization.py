"""The optimisation of a training run: schedule, SGD, weight decay, clipping.

Section 4 of Hardt & Ma (2017) trains with SGD and momentum 0.9, weight decay
on the convolution weights and a step (CIFAR) or exponential (ImageNet)
learning-rate schedule. Three stabilisers that the paper does not use can be
added, each off (0) unless a configuration asks for it:

* `warmup_steps`: the learning rate rises linearly over the first steps
  (Goyal et al., 2017, Section 2.2).
* `grad_clip_norm`: the gradient g of the whole (global) batch is scaled
  to norm at most c, g <- g min(1, c / ||g||) (Pascanu et al., 2013).
* `agc_clip`: adaptive gradient clipping (Brock et al., 2021, "High-
  performance large-scale image recognition without normalization",
  Section 4, equation 3): every unit i of a weight W (an output channel of a
  convolution or dense kernel; a whole vector or scalar) has its gradient
  G_i scaled to ||G_i|| <= lambda max(||W_i||, 1e-3). The classifier (the
  final layer) is not clipped, as in NFNets.
* `grad_clip_steps`: global-norm clipping for the first steps only (a
  warm-up of the optimisation), then none.

`ema_decay` keeps an exponential moving average of the trained weights
(`WeightAverage`), which evaluation and export use in their place.

Two settings make the optimiser follow a normalisation-free method's own
recipe: `bias_lr_factor` (Fixup trains its scalar biases and multipliers at
1/10 of the rate) and `weight_decay_scope` (which weights are decayed).

The clipping factors are computed from the gradient of the global batch and
applied to each replica's part of it, so that, summed over the replicas by
the optimizer, the update is exactly the clipped global gradient.
"""

import contextlib

import keras
import tensorflow as tf

from identity_tf import errors

# AGC's floor on a unit's weight norm (Brock et al., 2021: epsilon = 1e-3),
# so that units initialised at zero can still move.
AGC_EPSILON = 1e-3
# The floor on a unit's gradient norm in AGC's division (as in NFNets).
AGC_GRADIENT_FLOOR = 1e-6
# The name under which a checkpoint holds the `WeightAverage`.
WEIGHT_AVERAGE = "weight_average"
# The name of every network's final layer (`model.build_model`): AGC leaves
# it unclipped.
CLASSIFIER = "projection"


@keras.saving.register_keras_serializable(package="identity_tf")
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
  """AFTER (a schedule or a rate) scaled by min(1, (step + 1) / WARMUP_STEPS).

  The first step (step 0) takes 1/warmup_steps of the rate, step
  warmup_steps - 1 and later the full rate of AFTER. Boundaries of AFTER
  are not shifted.
  """

  def __init__(self, after, warmup_steps):
    super().__init__()
    self.after = after
    self.warmup_steps = int(warmup_steps)

  def __call__(self, step):
    rate = self.after(step) if callable(self.after) else self.after
    fraction = tf.minimum(
        1.0, tf.cast(step + 1, tf.float32) / float(self.warmup_steps))
    return tf.cast(rate, tf.float32) * fraction

  def get_config(self):
    after = self.after
    if isinstance(after, keras.optimizers.schedules.LearningRateSchedule):
      after = keras.optimizers.schedules.serialize(after)
    return {"after": after, "warmup_steps": self.warmup_steps}

  @classmethod
  def from_config(cls, config):
    after = config["after"]
    if isinstance(after, dict):
      after = keras.optimizers.schedules.deserialize(after)
    return cls(after, config["warmup_steps"])


def learning_rate_schedule(schedule):
  """The learning rate against the step, as Keras computes it: SCHEDULE
  (a `run.Schedule`) as a Keras schedule, or a float for a constant rate.

  piecewise: values[i] from boundaries[i-1] on (Section 4.1: 0.05, /10 at
    30k and 50k steps).
  exponential: initial * decay_rate ** floor(step / decay_steps) (Section
    4.2: 0.1 * 0.94 every 2 epochs).
  cosine: initial (1 + cos(pi min(step, T) / T)) / 2 over the run's T
    steps (NF-ResNets' schedule).
  constant: initial.
  Then `LinearWarmup` over schedule.warmup_steps, if any.
  """
  rate = schedule.initial
  if schedule.kind == "piecewise":
    rate = keras.optimizers.schedules.PiecewiseConstantDecay(
        list(schedule.boundaries), list(schedule.values))
  elif schedule.kind == "exponential":
    if not schedule.decay_steps:
      raise errors.ConfigError(
          "the exponential schedule decays per epoch, and the "
          "number of training examples is not known: prepare "
          "the dataset or set --num_train_examples")
    rate = keras.optimizers.schedules.ExponentialDecay(
        schedule.initial, decay_steps=schedule.decay_steps,
        decay_rate=schedule.decay_rate, staircase=True)
  elif schedule.kind == "cosine":
    rate = keras.optimizers.schedules.CosineDecay(
        schedule.initial, decay_steps=schedule.decay_steps, alpha=0.0)
  if schedule.warmup_steps:
    rate = LinearWarmup(rate, schedule.warmup_steps)
  return rate


def build_optimizer(run):
  """RUN's optimizer (a `run.Run`): SGD with the configuration's momentum
  (Nesterov's if set) at the run's schedule, with Keras's dynamic loss
  scaling under mixed_float16 (float16 gradients underflow). Weight decay
  is not the optimizer's: `l2_penalty`.

  Nor is clipping: Keras's `global_clipnorm` clips each replica's part of
  the gradient separately; `clip_factors` clips the global one.
  """
  optimizer = keras.optimizers.SGD(
      learning_rate=learning_rate_schedule(run.schedule),
      momentum=run.config.momentum, nesterov=run.config.nesterov)
  if run.config.precision == "mixed_float16":
    optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
  return optimizer


def is_classifier(variable):
  """Whether VARIABLE belongs to the network's final layer."""
  return getattr(variable, "path", "").split("/")[0] == CLASSIFIER


def convolution_kernels(model):
  """The trainable convolution kernels (rank 4), which weight decay decays."""
  return [w for w in model.trainable_weights if len(w.shape) == 4]


def decayed_weights(model, scope="convolutions"):
  """The trainable weights that weight decay decays, by SCOPE:

  "convolutions": the convolution kernels (Hardt & Ma, Section 4.1);
  "kernels": every kernel of rank >= 2, the classifier's included, but no
    bias, gain or scalar (NFNets' "no weight decay on gains and biases");
  "all": every trainable weight (the PyTorch SGD `weight_decay` of Fixup's
    CIFAR code, which decays its scalars and the classifier's bias too).
  """
  if scope == "convolutions":
    return convolution_kernels(model)
  if scope == "kernels":
    return [w for w in model.trainable_weights if len(w.shape) >= 2]
  if scope == "all":
    return list(model.trainable_weights)
  raise errors.ConfigError(f"unknown weight-decay scope {scope!r}; valid: "
                           "convolutions, kernels, all")


def bias_like(variable):
  """Whether `bias_lr_factor` applies to VARIABLE: a scalar or a vector
  (Fixup's scalar biases and multipliers, a classifier's bias)."""
  return len(variable.shape) <= 1


def l2_penalty(model, weight_decay, scope="convolutions"):
  """weight_decay * sum over the decayed weights W of ||W||_F^2 / 2.

  Weight decay as an L2 term added to the loss, as the 2016 tensorflow/models
  resnet (which the paper's code derives from) does with tf.nn.l2_loss: its
  gradient weight_decay * W goes through the momentum like the data gradient.
  By default only convolution kernels are decayed (Section 4.1: "All
  convolutional weights are trained with weight decay"); biases and the
  scalars of SkipInit and Fixup, if any, are not, and the frozen projection
  is not trained at all (SCOPE: `decayed_weights`). We do not use the optimizer's decoupled `weight_decay`
  (AdamW-style w -= lr * wd * w outside the momentum): with momentum 0.9 it
  is a different, roughly 10x weaker, regulariser than the paper's.
  """
  weights = decayed_weights(model, scope)
  if not weight_decay or not weights:
    return tf.constant(0.0)
  return weight_decay * tf.add_n([tf.nn.l2_loss(w) for w in weights])


def unit_norms(tensor):
  """The Frobenius norm of each unit of TENSOR, broadcastable to it.

  A unit is an output: the last axis of a kernel ([k, k, c_in, c_out] or
  [d_in, d_out]), so the norm is taken over all other axes; a vector or a
  scalar is one unit (its whole norm), as NFNets' `unitwise_norm` defines
  it (Brock et al., 2021, Section 4).
  """
  if len(tensor.shape) <= 1:
    return tf.norm(tensor)
  axes = list(range(len(tensor.shape) - 1))
  return tf.sqrt(tf.reduce_sum(tf.square(tensor), axis=axes, keepdims=True))


def agc_factor(gradient, variable, agc_clip):
  """AGC's factor for one weight (equation 3 of Brock et al., 2021): per
  unit i, lambda max(||W_i||, 1e-3) / ||G_i|| where ||G_i|| exceeds that
  limit, else 1."""
  limit = agc_clip * tf.maximum(unit_norms(variable), AGC_EPSILON)
  grad_norm = unit_norms(gradient)
  return tf.where(grad_norm > limit,
                  limit / tf.maximum(grad_norm, AGC_GRADIENT_FLOOR), 1.0)


def clip_factors(gradients, variables, grad_clip_norm=0.0, agc_clip=0.0,
                 clip_now=True):
  """Factors f with f * g the clipped gradient, one per gradient.

  GRADIENTS is the gradient of the global batch (all replicas summed).
  Global-norm clipping gives one scalar min(1, c / ||g||) shared by all
  (only where CLIP_NOW, a boolean tensor: `grad_clip_steps`); AGC gives,
  per unit, `agc_factor` (the classifier's weights excepted), times the
  global factor when both are on. None where no clipping is asked for.
  Returns (factors, global gradient norm before clipping).
  """
  norm = tf.linalg.global_norm(gradients)
  factors = [None] * len(gradients)
  if agc_clip:
    factors = [None if is_classifier(variable) else
               agc_factor(gradient, variable, agc_clip)
               for gradient, variable in zip(gradients, variables)]
  if grad_clip_norm:
    if agc_clip:
      # The global norm of the AGC-clipped gradient decides the second step.
      norm_after = tf.linalg.global_norm(
          [g if f is None else f * g for f, g in zip(factors, gradients)])
    else:
      norm_after = norm
    scale = tf.minimum(1.0, grad_clip_norm / tf.maximum(norm_after, 1e-30))
    scale = tf.where(clip_now, scale, 1.0)
    factors = [scale if f is None else f * scale for f in factors]
  return factors, norm


def averaged_variables(model):
  """What `WeightAverage` averages of MODEL: its floating-point variables,
  in order -- the trained weights and batch norm's moving statistics (which
  must follow the averaged weights they normalise, as in the moving
  averages of TensorFlow's reference EfficientNet); the frozen projection,
  constant, averages to itself."""
  return [v for v in model.variables if tf.as_dtype(v.dtype).is_floating]


class WeightAverage(tf.Module):
  """An exponential moving average of a network's variables (`ema_decay`).

  After every step, a <- d a + (1 - d) w for each of `averaged_variables`, with
  d = DECAY; the first step averaged sets a = w (the average of the steps
  taken, none before them). This is Polyak averaging with exponential
  forgetting (Polyak & Juditsky, 1992), the moving average of weights that
  Szegedy et al. (2016, Inception-v3) evaluate. Training steps the weights
  themselves; evaluation and export use the average (`swapped_into`,
  `checkpoints.restore_checkpoint`). A run that turns it on when resuming
  starts it at the resumed weights (`started` is then not in the
  checkpoint).
  """

  def __init__(self, variables, decay):
    super().__init__(name=WEIGHT_AVERAGE)
    if not 0 < decay < 1:
      raise errors.ConfigError(f"--ema_decay must be in (0, 1) to average, "
                               f"got {decay}")
    self.decay = float(decay)
    # Every replica holds the same weights, hence the same average: each
    # may update it in replica context, and the first replica's value is
    # kept.
    only_first = tf.VariableAggregation.ONLY_FIRST_REPLICA
    self.averages = [
        tf.Variable(tf.zeros(v.shape, tf.as_dtype(v.dtype)), trainable=False,
                    aggregation=only_first, name=f"average_{i}")
        for i, v in enumerate(variables)]
    self.started = tf.Variable(False, trainable=False,
                               aggregation=only_first, name="started")

  def update(self, variables):
    """One step of the average of VARIABLES (the weights it was built for,
    in that order), after the optimizer's step."""
    decay = tf.where(self.started, self.decay, 0.0)
    for average, variable in zip(self.averages, variables):
      average.assign(decay * average +
                     (1.0 - decay) * tf.convert_to_tensor(variable))
    self.started.assign(True)

  @contextlib.contextmanager
  def swapped_into(self, variables):
    """VARIABLES hold the average inside the block and their own values
    again after it (the average of no step yet: their own throughout)."""
    if not bool(self.started.numpy()):
      yield
      return
    own = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
    self.copy_to(variables)
    try:
      yield
    finally:
      for variable, value in zip(variables, own):
        variable.assign(value)

  def copy_to(self, variables):
    """VARIABLES <- the average, for good (export, evaluation of a
    checkpoint); nothing if no step was averaged."""
    if bool(self.started.numpy()):
      for variable, average in zip(variables, self.averages):
        variable.assign(average)
