"""The paper's networks, built from identity_tf.layers.

`build_model(name, **options)` returns an uncompiled `keras.Model` mapping
images to logits. Names:

* `cifar10`, `cifar100` -- Table 1 of Hardt & Ma (2017): one 3x3 convolution
  to 16 channels, then three stages of 9 `ConvResidualUnit`s at 64/128/256
  channels with first strides 1/2/2, global average pooling over the final
  8x8 map, and a frozen `RandomProjection` to the classes. 55 convolutions.
* `imagenet` -- the paper's all-convolutional variant of the 34-layer ResNet
  of He et al. (2016): 7x7/2 convolution to 64 channels, a 3x3/2 convolution
  where He et al. max-pool, stages of 3/4/6/3 units at 64/128/256/512
  channels, global average pooling, frozen projection to 1000 classes.
* `resnet_bn` -- the baseline the paper compares against: the CIFAR widths and
  depth with batch norm and the pre-activation unit of the 2016 resnet, the
  standard initialisation and a trained linear head.
* `fixup`, `skipinit`, `nf_resnet` -- the normalisation-free methods that
  came after the paper, each as its authors build it, at Table 1's widths
  and depths (`identity_tf.peers`).

No network here normalises anything unless `norm=True` (`resnet_bn`).
"""

import contextlib
import functools
import math

import keras

from identity_tf import architectures
from identity_tf import layers
from identity_tf.peers import fixup
from identity_tf.peers import nf_resnet
from identity_tf.peers import skipinit

# The architectures and their options: TF-free, so that configurations and
# flags are checked before TensorFlow loads.
MODELS = architectures.MODELS
complete_options = architectures.complete_options
# The normalisation-free methods' own networks (`identity_tf.peers`).
PEER_NETWORKS = {"fixup": fixup.build, "skipinit": skipinit.build,
                 "nf_resnet": nf_resnet.build}


_scaled = architectures.scaled_channels


@contextlib.contextmanager
def precision_policy(precision):
  """Keras's global dtype policy set to PRECISION ("float32",
  "mixed_bfloat16", "mixed_float16"; None: unchanged) inside the block."""
  if precision is None:
    yield
    return
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(precision)
  try:
    yield
  finally:
    keras.config.set_dtype_policy(previous)


def build_model(name, precision=None, float32_stream=False, **options):
  """Builds network NAME (see module docstring) with OPTIONS.

  PRECISION: the Keras dtype policy its layers compute in ("float32",
  "mixed_bfloat16", "mixed_float16"; None: the global policy). The weights
  are float32 in all of them, and so are the frozen projection and the
  logits. FLOAT32_STREAM: under a mixed PRECISION, the residual units add
  their branch (computed in 16 bits) to a float32 stream, so that a branch
  far smaller than its input is not rounded away in the sum.

  Options: classes (int), width (float multiplier of every width), units (int
  or one int per stage), stem_channels (int: every stem convolution's
  channels at width 1; default the architecture's), norm (bool: batch-norm
  pre-activation units), head (`architectures.HEADS`: the "frozen" random
  projection, "trainable", or a trained dense classifier drawn at "zero" or
  "normal"), init ("paper" or "standard", see `layers.ResidualInitializer`),
  seed (int: all initial weights and the projection), image_size (int),
  use_bias (bool); the residual branch's residual, branch_gain,
  weight_standardization, ws_gain, branch_init and branch_init_scale
  (`architectures`, `layers.ConvResidualUnit`);
  projection_scale ("classes" or "features") and logit_scale (float:
  `layers.RandomProjection`).
  Unset options (or None) take the network's defaults. Raises ValueError
  naming the valid values.
  """
  with precision_policy(precision):
    policy = keras.config.dtype_policy()
    mixed = policy.compute_dtype != policy.variable_dtype
    stream = ({"dtype": policy.variable_dtype, "branch_dtype": policy.name}
              if float32_stream and mixed else {})
    return _build_model(name, stream, **options)


def _build_model(name, stream, **options):
  arch, opts = complete_options(name, **options)
  size = opts.image_size
  inputs = keras.Input((size, size, 3), name="images")
  head = functools.partial(_head, opts)
  if name in PEER_NETWORKS:
    logits = PEER_NETWORKS[name](arch, opts, inputs, head)
  else:
    logits = _paper_network(arch, opts, inputs, stream, head)
  model = keras.Model(inputs, logits, name=name)
  model.build_options = {"name": name, **opts.to_dict()}
  return model


def _paper_network(arch, opts, inputs, stream, head):
  """Table 1's network (and its batch-norm baseline) on INPUTS."""
  seed, init = opts.seed, opts.init
  x = inputs
  for i, (name, kernel, channels, stride) in enumerate(
      architectures.stem_plan(arch, opts)):
    x = keras.layers.Conv2D(
        channels, kernel, strides=stride, padding="same",
        use_bias=opts.use_bias,
        kernel_initializer=layers.ResidualInitializer(
            "paper" if init == "fixup" else init, seed=seed * 1000 + i),
        name=name)(x)
  if opts.norm:
    unit_class, unit_options = layers.PreActivationUnit, {}
  else:
    # Fixup scales its initialisation by the number of residual branches.
    unit_class = layers.ConvResidualUnit
    unit_options = dict(residual=opts.residual,
                        num_branches=sum(opts.units),
                        branch_gain=opts.branch_gain,
                        weight_standardization=opts.weight_standardization,
                        ws_gain=opts.ws_gain,
                        init_scale=opts.branch_init_scale)
  for number, (name, channels, stride, _) in enumerate(
      architectures.unit_plan(arch, opts)):
    x = unit_class(
        channels, strides=stride, use_bias=opts.use_bias,
        kernel_initializer=opts.branch_init or init,
        seed=seed * 1000 + 10 + 2 * number,
        name=name, **unit_options, **stream)(x)
  if opts.norm:
    x = keras.layers.BatchNormalization(name="final_bn")(x)
    x = keras.layers.ReLU(name="final_relu")(x)
  return head(x)


def _head(opts, x, before_classifier=None):
  """Global average pooling of X, then the final layer opts.head names
  (`architectures.HEADS`), always named "projection"; BEFORE_CLASSIFIER,
  if given, maps the pooled features first (Fixup's scalar bias)."""
  # Under a mixed-precision policy (e.g. keras.mixed_precision
  # .set_global_policy("mixed_bfloat16")) the head -- the pooling and the
  # projection -- computes in the variable dtype, float32: a float32 residual
  # stream reaches the logits unrounded, logits, loss and the float32
  # weight-decay term add up without casts, and the softmax is not taken in
  # bfloat16. A no-op otherwise.
  policy = keras.config.dtype_policy()
  head_dtype = (policy.variable_dtype
                if policy.compute_dtype != policy.variable_dtype else None)
  x = keras.layers.GlobalAveragePooling2D(dtype=head_dtype, name="pool")(x)
  if before_classifier is not None:
    x = before_classifier(x)
  if opts.head in ("frozen", "trainable"):
    return layers.RandomProjection(
        opts.classes, seed=opts.seed,
        trainable=opts.head == "trainable",
        scale=opts.projection_scale, logit_scale=opts.logit_scale,
        dtype=head_dtype,
        name="projection")(x)
  kernel = ("zeros" if opts.head == "zero" else
            keras.initializers.RandomNormal(stddev=0.01, seed=opts.seed))
  return keras.layers.Dense(opts.classes, kernel_initializer=kernel,
                            bias_initializer="zeros", dtype=head_dtype,
                            name="projection")(x)


def activation_probe(model):
  """MODEL's layers as a model returning its activations stage by stage.

  The returned `keras.Model` shares MODEL's weights and maps images to a
  dict: "stem" (the last stem convolution's output), "stage1", ... (each
  stage's last unit's output) and "logits" (MODEL's output), in the order
  the forward pass computes them. Training watches their sizes to see which
  stage blows up before a loss becomes NaN.
  """
  outputs = {}
  for layer in model.layers:
    if layer.name.startswith("stem"):
      outputs["stem"] = layer.output
    elif layer.name.startswith("stage") and "_unit" in layer.name:
      outputs[layer.name.split("_unit")[0]] = layer.output
  outputs["logits"] = model.output
  return keras.Model(model.input, outputs, name=f"{model.name}_probe")


def describe(model):
  """Counts for a model: convolutions, trainable and non-trainable weights."""
  def count(weights):
    return sum(math.prod(w.shape) for w in weights)
  return {
      "convolutions": sum(1 for w in model.weights if len(w.shape) == 4),
      "trainable_weights": count(model.trainable_weights),
      # The frozen projection, plus batch-norm statistics in `resnet_bn`.
      "non_trainable_weights": count(model.non_trainable_weights),
  }


def sublayers(layer):
  """The layers LAYER holds as attributes (a unit's convolutions, ...)."""
  return [value for value in vars(layer).values()
          if isinstance(value, keras.layers.Layer)]


def _layer_options(layer):
  """The options that change what LAYER computes, as short text."""
  if isinstance(layer, layers.ConvResidualUnit):
    options = [f"residual={layer.residual}"]
    if layer.branch_gain_init != "none":
      options.append(f"branch_gain={layer.branch_gain_init}")
    if layer.weight_standardization:
      options.append(f"ws (gain {layer.ws_gain})")
    return ", ".join(options)
  if isinstance(layer, keras.layers.Dense):
    return "trained"
  if isinstance(layer, layers.RandomProjection):
    return (f"scale={layer.scale}, "
            f"{'trained' if layer.trainable else 'frozen'}")
  return ""


def layer_table(model):
  """MODEL's layers as plain-text lines (they survive pipes and logs): one
  row per layer and per layer inside a residual unit -- type, output shape,
  trainable and non-trainable weights, the options that change what it
  computes -- then the totals of `describe`."""
  def count(weights):
    return f"{sum(math.prod(w.shape) for w in weights):,}"
  row = "{:<30} {:<22} {:<16} {:>12} {:>14}  {}"
  rule = "-" * 120
  lines = [row.format("layer", "type", "output shape", "trainable",
                      "non-trainable", "options"), rule]
  for layer in model.layers[1:]:
    shape = "x".join(str(n) for n in layer.output.shape[1:])
    lines.append(row.format(layer.name, type(layer).__name__, shape,
                            count(layer.trainable_weights),
                            count(layer.non_trainable_weights),
                            _layer_options(layer)))
    lines += [row.format("  " + sub.name, type(sub).__name__, "",
                         count(sub.trainable_weights),
                         count(sub.non_trainable_weights), "")
              for sub in sublayers(layer)]
  totals = describe(model)
  return lines + [
      rule,
      f"Convolutions:          {totals['convolutions']:>12,}",
      f"Trainable weights:     {totals['trainable_weights']:>12,}",
      f"Non-trainable weights: {totals['non_trainable_weights']:>12,}"
      "  (frozen projection, batch-norm statistics)"]
