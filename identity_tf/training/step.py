"""The training step: SGD on the global batch, clipped, with its diagnostics.

`make_train_step` is the one step of every strategy: //bin:train runs it
(`trainer`) and //bin:benchmark times it. It returns named values; `VALUES`
says how each combines over replicas, steps and parameter-server closures,
and `merge` combines two outputs so.
"""

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from identity_tf import model as model_lib
from identity_tf.training import optimization


@dataclasses.dataclass(frozen=True)
class Reduction:
  """How a value of the step combines: over the replicas of one step
  (`replicas`, a tf.distribute.ReduceOp) and over the steps of a call and
  the closures of a parameter-server call (`steps`: "add" or "maximum",
  the function of that name in NumPy and TensorFlow)."""
  name: str
  replicas: tf.distribute.ReduceOp
  steps: str


# Counts: summed over replicas, steps and closures.
SUM = Reduction("sum", tf.distribute.ReduceOp.SUM, "add")
# A step's value for the global batch, or each replica's for its part (the
# mean over replicas); over steps and closures the largest: what a progress
# line reports as a divergence coming. NaN stays NaN (both maximums keep it).
PEAK = Reduction("peak", tf.distribute.ReduceOp.MEAN, "maximum")

# The values of `make_train_step`'s output, each with its reduction: the one
# table that the step, `merge` and every reader of the output follow.
VALUES = {
    "loss_sum": SUM,      # The per-example cross-entropy, summed.
    "correct": SUM,       # Correct top-1 predictions.
    "examples": SUM,
    "grad_norm": PEAK,    # The global gradient norm, before clipping.
    "update_ratio": PEAK,  # The largest ||update|| / ||weight|| of a kernel.
    "activation_rms": PEAK,  # {watched activation: its RMS}.
}
# Beside them, [global step, index into `nonfinite_order`] of the first step
# at which an activation or the gradient was NaN or infinite, or [-1, -1]:
# of two outputs, the earliest.
FIRST_NONFINITE = "first_nonfinite"
# The name `nonfinite_order` gives the gradient.
GRADIENT = "grad_norm"


def nonfinite_order(watched):
  """What FIRST_NONFINITE's index counts: the WATCHED activations in forward
  order, then the gradient (GRADIENT)."""
  return [*watched, GRADIENT]


def initial_output(watched, dtype=np.float32):
  """The output of no steps for WATCHED activations: sums 0, peaks -inf,
  no non-finite step (NumPy values of DTYPE; `merge` with it changes
  nothing)."""
  start = {SUM: 0.0, PEAK: -np.inf}
  output = {name: start[reduction] for name, reduction in VALUES.items()}
  output["activation_rms"] = {name: start[VALUES["activation_rms"]]
                              for name in watched}
  output = tf.nest.map_structure(dtype, output)
  output[FIRST_NONFINITE] = np.array([-1, -1], np.int64)
  return output


def merge(first, second, ops=tf):
  """The output of the steps of FIRST and then SECOND (or of two closures in
  any order): each value combined as `VALUES` says, the first non-finite
  step the earliest. OPS: `tf` for tensors (in a tf.function too), `np` for
  NumPy arrays."""
  merged = {name: tf.nest.map_structure(getattr(ops, reduction.steps),
                                        first[name], second[name])
            for name, reduction in VALUES.items()}
  a, b = first[FIRST_NONFINITE], second[FIRST_NONFINITE]
  a_first = (a[0] >= 0) & ((b[0] < 0) | (a[0] <= b[0]))
  merged[FIRST_NONFINITE] = ops.where(a_first, a, b)
  return merged


def _pack(values):
  """{reduction name: one vector of VALUES' values of that reduction}: one
  all-reduce per reduction rather than one per value."""
  return {reduction.name: tf.stack(tf.nest.flatten(
              [values[n] for n, r in VALUES.items() if r is reduction]))
          for reduction in (SUM, PEAK)}


def _reduce_replicas(strategy, packed, watched):
  """`_pack`ed per-replica values, reduced over STRATEGY's replicas as
  VALUES says and named again."""
  structure = initial_output(watched)
  values = {}
  for reduction in (SUM, PEAK):
    names = [n for n, r in VALUES.items() if r is reduction]
    vector = strategy.reduce(reduction.replicas, packed[reduction.name],
                             axis=None)
    values.update(zip(names, tf.nest.pack_sequence_as(
        [structure[n] for n in names], tf.unstack(vector))))
  return values


def _first_nonfinite(values, watched, step):
  """FIRST_NONFINITE of one step's VALUES at global STEP."""
  forward = [values["activation_rms"][name] for name in watched]
  bad = tf.logical_not(tf.math.is_finite(tf.stack(
      forward + [values[GRADIENT]])))
  return tf.where(tf.reduce_any(bad), tf.stack(
      [step, tf.argmax(tf.cast(bad, tf.int64), output_type=tf.int64)]),
                  tf.constant([-1, -1], tf.int64))


def training_loss(labels, logits, label_smoothing=0.0, mixed_with=None):
  """The per-example cross-entropy that training minimises: with
  LABEL_SMOOTHING e > 0, against the target (1 - e) onehot(y) + e / K
  (Szegedy et al., 2016, Section 7); without it, the plain one. With
  MIXED_WITH = (partner labels y', lam) from `mixup`, lam loss(y) +
  (1 - lam) loss(y'): the loss against the mixed target lam y + (1 - lam) y'
  (Zhang et al., 2018, Eq. 1), the cross-entropy being linear in it."""
  def loss(targets):
    if not label_smoothing:
      return keras.losses.sparse_categorical_crossentropy(
          targets, logits, from_logits=True)
    return keras.losses.categorical_crossentropy(
        tf.one_hot(targets, logits.shape[-1]), logits, from_logits=True,
        label_smoothing=label_smoothing)
  if mixed_with is None:
    return loss(labels)
  partners, lam = mixed_with
  return lam * loss(labels) + (1 - lam) * loss(partners)


def mixup(images, labels, alpha, seed):
  """mixup (Zhang, Cisse, Dauphin & Lopez-Paz, 2018, Eq. 1) as Fixup's CIFAR
  code applies it: one lam ~ Beta(ALPHA, ALPHA) for the batch, and every
  image mixed with the one a random permutation of the batch pairs it with,
  lam x + (1 - lam) x'. Returns (mixed images, the partners' labels y',
  lam); `training_loss(..., mixed_with=(y', lam))` is the mixed loss.

  SEED (two integers) decides lam and the permutation: the same seed, the
  same mix, so a resumed run mixes its batches as the uninterrupted one.
  """
  lam_seed, order_seed = tf.unstack(
      tf.random.experimental.stateless_split(seed, 2))
  # Beta(a, a) as G1 / (G1 + G2) for independent Gamma(a, 1) draws.
  gammas = tf.random.stateless_gamma([2], lam_seed, alpha=alpha)
  lam = gammas[0] / (gammas[0] + gammas[1])
  order = tf.argsort(tf.random.stateless_uniform(tf.shape(labels)[:1],
                                                 order_seed))
  weight = tf.cast(lam, images.dtype)
  mixed = weight * images + (1 - weight) * tf.gather(images, order)
  return mixed, tf.gather(labels, order), lam


def _forward_backward(model, probe, optimizer, config, loss_scaled):
  """The per-replica forward and backward pass: (images, labels) ->
  (PROBE's activations, float32 logits, per-example loss, gradients of
  MODEL's trainable variables), the loss scaled by OPTIMIZER's loss scale
  when LOSS_SCALED; XLA-compiled with config.jit_compile."""
  global_batch = config.batch_size
  variables = model.trainable_variables

  def forward_backward(images, labels, mixed_with=None):
    with tf.GradientTape() as tape:
      activations = probe(images, training=True)
      # float32 under every precision (the model's head): so is the loss.
      logits = tf.cast(activations["logits"], tf.float32)
      per_example = training_loss(labels, logits, config.label_smoothing,
                                  mixed_with)
      # Mean over the global batch: the optimizer sums the replicas'
      # gradients.
      loss = tf.nn.compute_average_loss(per_example,
                                        global_batch_size=global_batch)
      total = loss + tf.nn.scale_regularization_loss(
          optimization.l2_penalty(model, config.weight_decay,
                                  config.weight_decay_scope))
      if loss_scaled:
        total = optimizer.scale_loss(total)
    return activations, logits, per_example, tape.gradient(total, variables)

  if config.jit_compile:
    # XLA compiles the forward and backward pass only: the all-reduce, the
    # clipping and the optimizer stay as they are under every strategy.
    forward_backward = tf.function(forward_backward, jit_compile=True,
                                   autograph=False)
  return forward_backward


def _replica_step(model, probe, optimizer, config, replicas, average):
  """One SGD step on one replica's part of the global batch: (images,
  labels) -> its `VALUES`, `_pack`ed."""
  names = list(probe.output.keys())
  variables = model.trainable_variables
  averaged = optimization.averaged_variables(model)
  # mixed_float16: Keras's dynamic loss scaling. The loss is multiplied by
  # a power of two before the backward pass; the optimizer divides it out,
  # and skips the step (halving the scale) when a gradient overflowed.
  loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
  forward_backward = _forward_backward(model, probe, optimizer, config,
                                       loss_scaled)

  def replica_step(images, labels):
    mixed_with = None
    if config.mixup_alpha:
      # A seed per run, step and replica: each replica mixes its own part.
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      images, partners, lam = mixup(
          images, labels, config.mixup_alpha,
          tf.stack([tf.cast(config.seed, tf.int64) * 1024 + tf.cast(
              replica, tf.int64), tf.cast(optimizer.iterations, tf.int64)]))
      mixed_with = (partners, lam)
    activations, logits, per_example, gradients = forward_backward(
        images, labels, mixed_with)
    gradients, grad_norm = _clipped_gradients(
        gradients, variables, optimizer, config, replicas, loss_scaled)
    kernels = [v for v in variables if len(v.shape) >= 2]
    before = [tf.identity(v) for v in kernels]
    optimizer.apply_gradients(zip(gradients, variables))
    if average is not None:
      average.update(averaged)
    # Kernels only: the relative change of a scalar near zero (SkipInit's
    # gain, Fixup's biases) says nothing about stability. Kernels that are
    # exactly zero (Fixup's C2 at the start) have no ratio; they count as 0.
    update_ratio = tf.reduce_max(tf.stack([
        tf.math.divide_no_nan(tf.norm(v - b), tf.norm(b))
        for v, b in zip(kernels, before)]))
    return _pack({
        **_batch_metrics(activations, names, logits, per_example, labels,
                         mixed_with),
        "grad_norm": grad_norm, "update_ratio": update_ratio})
  return replica_step


def _clipped_gradients(gradients, variables, optimizer, config, replicas,
                       loss_scaled):
  """GRADIENTS (one replica's) times the clipping factors of the whole
  batch's gradient (global clip and AGC, `optimization.clip_factors`) and
  the biases' rate factor; with the whole gradient's norm."""
  unscaled = gradients
  if loss_scaled:
    # Clipping, AGC and the diagnostics see the true gradient (dividing
    # by a power of two is exact); the optimizer gets the scaled one.
    inverse = 1.0 / optimizer.dynamic_scale
    unscaled = [g * inverse for g in gradients]
  # With several replicas in sync each one holds a part of the gradient;
  # the clipping factors and the reported norm are those of the whole.
  whole = unscaled
  if replicas > 1:
    whole = tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, unscaled)
  clip_now = (optimizer.iterations < config.grad_clip_steps
              if config.grad_clip_steps else tf.constant(True))
  factors, grad_norm = optimization.clip_factors(
      whole, variables, config.grad_clip_norm, config.agc_clip, clip_now)
  if config.bias_lr_factor != 1:
    # A factor on a gradient is that factor on its learning rate under
    # SGD with momentum (the momentum is linear in the gradients).
    factors = [
        (config.bias_lr_factor if f is None else f * config.bias_lr_factor)
        if optimization.bias_like(v) else f
        for f, v in zip(factors, variables)]
  gradients = [g if f is None else g * f
               for g, f in zip(gradients, factors)]
  if loss_scaled:
    gradients = _skip_together(gradients, grad_norm)
    # A step the loss scaler skips is not a divergence: its overflowed
    # norm is left out of the peaks (the scale is in the progress line).
    grad_norm = tf.where(tf.math.is_finite(grad_norm), grad_norm, 0.0)
  return gradients, grad_norm


def _batch_metrics(activations, names, logits, per_example, labels,
                   mixed_with):
  """One replica's sums for the progress line: the loss, the correct
  predictions (a mixed batch's weighted by its two targets), the examples,
  and the RMS of each probed activation of NAMES."""
  rms = {name: tf.sqrt(tf.reduce_mean(tf.square(tf.cast(activations[name],
                                                        tf.float32))))
         for name in names}
  predicted = tf.argmax(logits, -1, output_type=tf.int32)
  correct = tf.cast(tf.equal(predicted, labels), tf.float32)
  if mixed_with is not None:
    # As Fixup's code counts a mixed batch: each target by its weight.
    partners, lam = mixed_with
    correct = lam * correct + (1 - lam) * tf.cast(
        tf.equal(predicted, partners), tf.float32)
  return {"loss_sum": tf.reduce_sum(per_example),
          "correct": tf.reduce_sum(correct),
          "examples": tf.cast(tf.size(labels), tf.float32),
          "activation_rms": rms}


def _skip_together(gradients, whole_norm):
  """GRADIENTS (one replica's), made non-finite when the whole batch's
  gradient norm WHOLE_NORM is.

  Keras's LossScaleOptimizer decides to skip a step from the gradients it
  is given, expecting them already summed over the replicas; here each
  replica hands it its own part. Without this, a step where only replica 1
  overflowed is applied when replica 0's part is finite (with clipping on,
  the sum then carries 0 * inf = NaN into the weights), and under
  strategies without merge calls the replicas would take different
  branches. The whole norm is the same on every replica.
  """
  finite = tf.math.is_finite(whole_norm)
  return [tf.where(finite, g, tf.constant(np.inf, g.dtype))
          for g in gradients]


def make_train_step(strategy, model, optimizer, config, average=None):
  """The training step of `train`: a tf.function (iterator, num_steps) -> dict.

  Each of NUM_STEPS steps takes next(ITERATOR) (a distributed iterator of
  STRATEGY's per-replica (images, labels) batches) and, on every replica,
  applies OPTIMIZER to MODEL's gradient of the cross-entropy averaged over
  the global batch (config.batch_size; `training_loss`) plus
  `optimization.l2_penalty`, clipped as config.grad_clip_norm,
  grad_clip_steps and agc_clip say (`optimization.clip_factors`, computed
  from the global batch's gradient), the biases' and scalars' gradients
  times config.bias_lr_factor; then AVERAGE (an `optimization.WeightAverage`
  of MODEL's `optimization.averaged_variables`, or None) takes its step.

  Returns the dict of tensors of `VALUES` over the NUM_STEPS steps (sums
  and peaks as `VALUES` says; `merge`), and FIRST_NONFINITE. `train` runs
  this function (scheduled through a ClusterCoordinator under
  parameter_server); bin/benchmark times it.
  """
  probe = model_lib.activation_probe(model)
  watched = list(probe.output.keys())
  replica_step = _replica_step(model, probe, optimizer, config,
                               strategy.num_replicas_in_sync, average)

  # No AutoGraph: the loop is the tf.while_loop it would have made, and
  # nothing the step calls branches on a tensor in Python. Converting the
  # step's functions (and tracing them converted) cost every run about 2 s
  # of its start on two cores: a 20-step smoke run took 5.3 s, now 3.4.
  @tf.function(autograph=False)
  def train_steps(iterator, num_steps):
    def one_step(done, output):
      step = tf.cast(optimizer.iterations, tf.int64) + 1
      values = _reduce_replicas(
          strategy, strategy.run(replica_step, args=next(iterator)), watched)
      values[FIRST_NONFINITE] = _first_nonfinite(values, watched, step)
      return done + 1, merge(output, values)

    output = tf.nest.map_structure(tf.constant, initial_output(watched))
    _, output = tf.while_loop(lambda done, _: done < num_steps, one_step,
                              (tf.zeros_like(num_steps), output))
    return output
  return train_steps
