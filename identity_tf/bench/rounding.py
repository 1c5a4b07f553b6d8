"""What of each residual branch survives the addition in 16 bits.

The paper's unit is x + C2(ReLU(C1 x)) with C1, C2 drawn at std 1/(k^2 c)
(Section 4.1), so at the start every branch is far smaller than the x it is
added to. bfloat16 keeps 8 significant bits: wherever |branch| is below
about 2^-9 |x| the sum rounds back to x and the branch is lost, and its
gradient cannot tell (the backward pass of an add is exact). This module
measures that on real weights, unit by unit, against the float32 sum.
"""

import keras
import numpy as np
import tensorflow as tf

from identity_tf import errors
from identity_tf import layers


def _units(model):
  return [layer for layer in model.layers
          if isinstance(layer, layers.ConvResidualUnit)]


def branch_survival(model, images, dtype=tf.bfloat16):
  """Per `ConvResidualUnit` of MODEL (computing in float32) on IMAGES.

  For a unit's input x, shortcut s = S(x) and branch b = unit(x) - s, all
  in float32, the DTYPE sum keeps d = fl(fl(s) + fl(b)) - fl(s) of the
  branch (fl: rounding to DTYPE). Returns one dict per unit, in forward
  order: "unit", "branch_to_stream" (||b|| / ||s||), "lost" (||d - b|| /
  ||b||: 1 when nothing of the branch arrives; its floor, when the sum is
  exact, is the rounding of b itself to DTYPE, about 2^-9 in bfloat16, 0.2 %
  -- against the float32 b, because the float32 network is what mixed
  precision approximates), "rounded_away" (the fraction of the entries with
  b != 0 for which d = 0).
  """
  units = _units(model)
  if not units:
    raise errors.ConfigError(
        f"{model.name} has no ConvResidualUnit (the batch-norm "
        "baseline's units are PreActivationUnits): nothing to "
        "measure")
  probe = keras.Model(model.input, [unit.input for unit in units])
  inputs = probe(images, training=False)
  if len(units) == 1:
    inputs = [inputs]
  results = []
  for unit, x in zip(units, inputs):
    x = tf.cast(x, tf.float32)
    s = layers.shortcut(x, unit.filters, unit.strides)
    b = tf.cast(unit(x, training=False), tf.float32) - s
    rounded_s = tf.cast(s, dtype)
    kept = tf.cast(rounded_s + tf.cast(b, dtype), tf.float32) - tf.cast(
        rounded_s, tf.float32)
    b, kept, s = (np.asarray(t, np.float64) for t in (b, kept, s))
    branch = np.linalg.norm(b)
    nonzero = b != 0
    results.append({
        "unit": unit.name,
        "branch_to_stream": float(branch / max(np.linalg.norm(s), 1e-30)),
        "lost": float(np.linalg.norm(kept - b) / max(branch, 1e-30)),
        "rounded_away": float(np.mean(kept[nonzero] == 0))
                        if nonzero.any() else 0.0,
    })
  return results


def by_stage(results):
  """{stage name: the mean "lost" and "rounded_away" over its units}."""
  stages = {}
  for row in results:
    stages.setdefault(row["unit"].split("_unit")[0], []).append(row)
  return {stage: {key: float(np.mean([r[key] for r in rows]))
                  for key in ("branch_to_stream", "lost", "rounded_away")}
          for stage, rows in stages.items()}
