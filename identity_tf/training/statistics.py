"""What a few seeds say: sample standard deviations and paired differences.

A study runs each configuration for a few seeds (usually 3). Two arms run
with the same seeds share their data order and, where their networks
match, their initial draw, so they are compared by the per-seed
differences: their mean with a 95 % Student's t interval (Student, 1908),
and the words the interval allows ("ahead by", "behind by", "level with").
Whether two arms are the same within a margin stated in advance is an
equivalence test: two one-sided t tests at 5 % (Schuirmann, 1987), i.e. the
90 % interval of the paired difference inside (-margin, +margin)
(`equivalence`). Pure Python: the t quantile is computed here, from the closed form of the
t distribution's CDF for an integer number of degrees of freedom
(Abramowitz & Stegun, 1964, 26.7.3-26.7.4), not taken from a table.
"""

import math

# Two-sided: the interval that holds the true mean difference with this
# probability under the t model.
CONFIDENCE = 0.95
# The level of each one-sided test of `equivalence`: together, the 90 %
# interval (1 - 2 alpha) inside the margin.
EQUIVALENCE_ALPHA = 0.05


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


def equivalence(difference, margin, alpha=EQUIVALENCE_ALPHA):
  """Two one-sided t tests (TOST: Schuirmann, 1987) of whether the mean of
  a `paired_difference` lies within (-MARGIN, +MARGIN).

  With mean m, sample std s of the n differences and se = s / sqrt(n), the
  tests of H0: mu <= -margin and H0: mu >= +margin have t statistics
  (m + margin) / se and (m - margin) / se on n - 1 degrees of freedom;
  both rejected at level ALPHA is the same as the (1 - 2 ALPHA) interval
  m -+ t(1 - ALPHA, n - 1) se lying inside the margin. Returns {"margin",
  "alpha", "interval" (that interval), "p_value" (the larger one-sided
  p), "equivalent"}; None for fewer than two seeds (no test) or no
  difference.
  """
  if difference is None or difference["std"] is None:
    return None
  n, centre = len(difference["seeds"]), difference["mean"]
  se = difference["std"] / math.sqrt(n)
  half = t_quantile(1 - alpha, n - 1) * se
  if se == 0:  # Every seed the same difference: no spread to test.
    p_value = 0.0 if abs(centre) < margin else 1.0
  else:
    p_value = max(1 - t_cdf((centre + margin) / se, n - 1),
                  t_cdf((centre - margin) / se, n - 1))
  return {"margin": margin, "alpha": alpha,
          "interval": [centre - half, centre + half], "p_value": p_value,
          "equivalent": p_value < alpha}


def equivalence_wording(difference, margin, scale=100, unit="point"):
  """"equivalent within 0.5 point (90 % interval -0.21 to +0.30, 5
  seeds)" where `equivalence` finds it, else what `wording` (the 95 %
  interval) allows, with the margin it was not shown within."""
  test = equivalence(difference, margin)
  if test is None or not test["equivalent"]:
    text = wording(difference, scale, unit)
    return (text if test is None else
            f"{text}; not shown equivalent within {scale * margin:g} {unit}")
  low, high = (scale * v for v in test["interval"])
  return (f"equivalent within {scale * margin:g} {unit} (90 % interval "
          f"{low:+.2f} to {high:+.2f}, {len(difference['seeds'])} seeds)")


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
