"""What a few seeds say: sample standard deviations and paired differences.

A study runs each configuration for a few seeds (usually 3). Two arms run
with the same seeds share their data order and, where their networks
match, their initial draw, so they are compared by the per-seed
differences: their mean with a 95 % Student's t interval (Student, 1908),
and the words the interval allows ("ahead by", "behind by", "level with").
Pure Python: the t quantile is computed here, from the closed form of the
t distribution's CDF for an integer number of degrees of freedom
(Abramowitz & Stegun, 1964, 26.7.3-26.7.4), not taken from a table.
"""

import math

# Two-sided: the interval that holds the true mean difference with this
# probability under the t model.
CONFIDENCE = 0.95


def mean(values):
  return sum(values) / len(values)


def sample_std(values):
  """The sample standard deviation (n - 1 in the denominator); None for
  fewer than two values."""
  if len(values) < 2:
    return None
  centre = mean(values)
  return math.sqrt(sum((v - centre) ** 2 for v in values) / (len(values) - 1))


def t_cdf(t, df):
  """P(T <= t) for Student's t with integer DF >= 1 degrees of freedom.

  With theta = atan(t / sqrt(df)), A(t) = P(|T| <= |t|) is
  sin(theta) (1 + cos^2/2 + 1.3/(2.4) cos^4 + ... ) for even df, and
  (2/pi) (theta + sin(theta) cos(theta) (1 + 2/3 cos^2 + ...)) for odd df,
  each series with (df - 1) // 2 (odd) or df / 2 (even) terms.
  """
  if df < 1 or int(df) != df:
    raise ValueError(f"degrees of freedom must be a positive integer, got "
                     f"{df}")
  theta = math.atan(abs(t) / math.sqrt(df))
  c2, s = math.cos(theta) ** 2, math.sin(theta)
  if df % 2 == 0:
    term, total = 1.0, 1.0
    for k in range(1, df // 2):
      term *= c2 * (2 * k - 1) / (2 * k)
      total += term
    two_sided = s * total
  else:
    term, total = 1.0, 1.0 if df > 1 else 0.0
    for k in range(1, (df - 1) // 2):
      term *= c2 * (2 * k) / (2 * k + 1)
      total += term
    two_sided = 2 / math.pi * (theta + s * math.cos(theta) * total)
  return 0.5 + math.copysign(two_sided / 2, t)


def t_quantile(p, df):
  """The t such that P(T <= t) = P for DF degrees of freedom (bisection on
  `t_cdf`, to 1e-12)."""
  if not 0 < p < 1:
    raise ValueError(f"p must be in (0, 1), got {p}")
  if p < 0.5:
    return -t_quantile(1 - p, df)
  low, high = 0.0, 1.0
  while t_cdf(high, df) < p:
    high *= 2
  while high - low > 1e-12 * max(1.0, high):
    middle = (low + high) / 2
    if t_cdf(middle, df) < p:
      low = middle
    else:
      high = middle
  return (low + high) / 2


def paired_difference(values, reference):
  """The per-seed differences VALUES[seed] - REFERENCE[seed] over the seeds
  both dicts ({seed: value}) hold: {"seeds", "differences", "mean", "std"
  (sample), "half_width" and "interval" (95 %, Student's t with n - 1
  degrees of freedom)}; std, half_width and interval are None for one
  seed. None if no seed is shared."""
  seeds = sorted(set(values) & set(reference))
  if not seeds:
    return None
  differences = [values[s] - reference[s] for s in seeds]
  centre, spread = mean(differences), sample_std(differences)
  half = (None if spread is None else
          t_quantile(0.5 + CONFIDENCE / 2, len(seeds) - 1) * spread
          / math.sqrt(len(seeds)))
  return {"seeds": seeds, "differences": differences, "mean": centre,
          "std": spread, "half_width": half,
          "interval": None if half is None else [centre - half,
                                                 centre + half]}


def wording(difference, scale=100, unit="point"):
  """What a `paired_difference` allows one to say, in words (values times
  SCALE, in UNITs): "ahead by 0.24 point (95 % interval 0.05 to 0.43, 3
  seeds)" when the interval lies above 0, "behind by ..." below it, "level
  with ... (difference -0.01 point, ...)" when it holds 0; with one seed,
  the difference and "one seed", no claim."""
  if difference is None:
    return "not compared (no seed in common)"
  d = difference["mean"] * scale
  n = len(difference["seeds"])
  if difference["interval"] is None:
    return f"{d:+.2f} {unit}s (one seed)"
  low, high = (scale * v for v in difference["interval"])
  interval = f"95 % interval {low:+.2f} to {high:+.2f}, {n} seeds"
  if low > 0:
    return f"ahead by {d:.2f} {unit} ({interval})"
  if high < 0:
    return f"behind by {-d:.2f} {unit} ({interval})"
  return f"level with (difference {d:+.2f} {unit}, {interval})"
