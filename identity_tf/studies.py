"""Studies as code: grids of training configurations x seeds.

A `Study` names arms -- each a preset of `configs.PRESETS` with overrides,
run for its seeds -- that //bin:study trains on one dataset for a budget in
epochs (`training.study` runs them and writes the report). Every study of
docs/results.md is here, each with the question it answers. Pure Python:
importing it loads neither TensorFlow nor anything heavy.

The comparison of the paper's network with batch norm (docs/results.md,
"The answer") is made in three steps, each a study:

* `rates` -- both networks of the pair (`cifar10_ws` and its batch-norm
  twin `cifar10_ws_bn`, which differ in the network only) at five learning
  rates, scored on VALIDATION_EXAMPLES training images held out of
  training (`configs.Config.validation_examples`); the test split is not
  read. Each network's best rate by final validation top-1 is
  `TUNED_RATES`.
* `tuned` -- the pair, each at its own tuned rate, for five seeds, on the
  same training images, evaluated on the test split once, at the end; the
  difference is tested for equivalence within MARGIN (two one-sided t
  tests, `training.statistics.equivalence`), a margin fixed before the runs.
* `depth` and `batch` -- what batch norm still buys at depth and at large
  batches (the linear scaling rule with a warm-up: Goyal et al., 2017).
"""

import dataclasses

from identity_tf import configs


@dataclasses.dataclass(frozen=True)
class Arm:
  """One configuration of a study: a preset with overrides, run per seed.

  WARMUP_FRACTION: a linear warm-up over this share of the run's steps,
  whatever the budget (Goyal et al., 2017: 5 epochs of 90); None keeps the
  preset's warm-up, scaled to the budget as its schedule is.
  """
  name: str
  preset: str
  overrides: tuple = ()        # (Config field, value) pairs.
  seeds: tuple = (0,)
  description: str = ""
  warmup_fraction: float = None


@dataclasses.dataclass(frozen=True)
class Study:
  """A grid of configurations x seeds that //bin:study runs on one dataset.

  The study's budget (epochs), dataset and width are the binary's flags;
  the presets' learning-rate boundaries are scaled to the budget. Every
  arm's test top-1 is compared, seed by seed, with the arm named
  `reference` (if any): the mean difference and its 95 % interval, and
  with a MARGIN (a fraction of top-1) the equivalence test's verdict.

  VALIDATION_EXAMPLES > 0: every run holds out that many training images
  (the same for every run) and is evaluated on them every epoch; with
  TEST_AT_END the test split is read once, at the end, else never.
  SELECTS: the report names each preset's best arm by final validation
  top-1. DETERMINISTIC: every run with `Config.deterministic` (the binary's
  --deterministic overrides it), so that seeds pair bit for bit.
  UNAVAILABLE: why the study cannot run yet (a choice it needs has not
  been made); None when it can. REESTIMATE_BATCH_NORM > 0: every finished
  batch-norm run is also scored on the held-out images with its statistics
  re-estimated on that many training images (precise batch norm,
  `evaluation.reestimate_batch_norm_statistics`), beside its moving
  averages.
  """
  name: str
  description: str
  arms: tuple
  reference: str = None
  margin: float = None
  validation_examples: int = 0
  test_at_end: bool = True
  selects: bool = False
  deterministic: bool = False
  unavailable: str = None
  reestimate_batch_norm: int = 0



# The held-out training images of the studies that select
# (`configs.Config.validation_examples`): a twelfth of Fashion-MNIST's
# 60 000, as many as CIFAR-10's 50 000 leave 45 000 in the field's usual
# split.
VALIDATION_EXAMPLES = 5000
# The pair the answer compares: the paper's network with its changes, and
# its batch-norm twin in the same recipe (they differ in the network only).
PAIR = ("cifar10_ws", "cifar10_ws_bn")
# The `rates` study's learning rates: the presets' 0.05 halved once and
# doubled three times.
SWEEP_RATES = (0.025, 0.05, 0.1, 0.2, 0.4)
# The rule that makes a tuned rate a peak, not a boundary: where a
# network's best rate is the grid's largest (smallest), its grid goes on
# doubling (halving) until it is not. Batch norm was best at 0.4: 0.8 is
# its next rate (tests/comparison_test checks the rule on the results).
EDGE_RATES = {"cifar10_ws_bn": (0.8,)}
# The equivalence margin of the `tuned` study, stated before its runs: half
# a point of test top-1.
MARGIN = 0.005
# Each network's learning rate as the `rates` study chose it: the arm with
# the best final validation top-1 (width 0.125, float32, 10 epochs, seed
# 0; docs/results/rates.json, whose "selected" says it; tests/comparison_test
# checks the two agree). batch norm's is the grid's largest rate. None for a
# network not yet chosen: `tuned` and `batch` wait for it.
TUNED_RATES = {"cifar10_ws": 0.1, "cifar10_ws_bn": 0.4}
# Units per stage of the `depth` study: Table 1's 9, and 3 and 9 times it.
DEPTHS = (9, 27, 81)
# The `batch` study's global batches; the rate scales linearly with the
# batch from each network's tuned rate at 128, after a warm-up over 5 % of
# the run (Goyal et al., 2017).
BATCHES = (128, 512, 2048)
BATCH_WARMUP = 0.05
# NFNets' adaptive clipping at the largest batch, in place of the plain
# clip (Brock et al., 2021: lambda 0.01 at 4096, larger for smaller
# batches).
BATCH_AGC = 0.02
# The training images the `batch` study re-estimates batch norm's statistics
# on: ten batches of its largest, 160 of its smallest. Batch norm's moving
# averages (momentum 0.99) span about 100 steps, a third of a 10-epoch run
# at 2048 while its rate is 6.4: they lag the weights they normalise.
BATCH_NORM_IMAGES = 20480


def _waiting_for_rates():
  """Why a study of the tuned pair cannot run yet, or None."""
  missing = [preset for preset in PAIR if TUNED_RATES[preset] is None]
  if not missing:
    return None
  return (f"it needs the rate the rates study chooses for "
          f"{', '.join(missing)}: run --study=rates, then set "
          "studies.TUNED_RATES to its report's \"selected\" rates")


def _tuned_study():
  """The pair at its tuned rates, five seeds, compared on test."""
  waiting = _waiting_for_rates()
  return Study(
      "tuned",
      "cifar10_ws and its batch-norm twin, each at the rate the rates "
      "study chose on held-out images, evaluated on the test split once.",
      arms=() if waiting else tuple(
          Arm(preset, preset, (("learning_rate", TUNED_RATES[preset]),),
              seeds=(0, 1, 2, 3, 4),
              description=f"{preset} at its tuned rate "
                          f"{TUNED_RATES[preset]:g}")
          for preset in PAIR),
      reference="cifar10_ws_bn", margin=MARGIN,
      validation_examples=VALIDATION_EXAMPLES, test_at_end=True,
      deterministic=True, unavailable=waiting)


def _batch_study():
  """The pair at batches of 128, 512 and 2048, the rate scaled linearly."""
  waiting = _waiting_for_rates()
  arms = []
  for preset in () if waiting else PAIR:
    for batch in BATCHES:
      rate = TUNED_RATES[preset] * batch / 128
      arms.append(Arm(
          f"{preset}_batch{batch}", preset,
          (("batch_size", batch), ("learning_rate", rate)),
          warmup_fraction=BATCH_WARMUP,
          description=f"{preset}, batch {batch} at rate {rate:g}, warmed "
                      "up over 5 % of the run"))
  if not waiting:
    batch = BATCHES[-1]
    rate = TUNED_RATES["cifar10_ws"] * batch / 128
    arms.append(Arm(
        f"cifar10_ws_batch{batch}_agc", "cifar10_ws",
        (("batch_size", batch), ("learning_rate", rate),
         ("grad_clip_norm", 0.0), ("agc_clip", BATCH_AGC)),
        warmup_fraction=BATCH_WARMUP,
        description=f"cifar10_ws, batch {batch}, adaptive clipping "
                    f"(lambda {BATCH_AGC:g}) in place of the plain clip"))
  return Study(
      "batch",
      "cifar10_ws and its batch-norm twin at batches of 128, 512 and 2048 "
      "with the rate scaled linearly and a 5 % warm-up, scored on held-out "
      "training images.",
      arms=tuple(arms), validation_examples=VALIDATION_EXAMPLES,
      test_at_end=False, deterministic=True, unavailable=waiting,
      reestimate_batch_norm=BATCH_NORM_IMAGES)


_LITERAL = "cifar10_paper_literal"
# The arms that clip take the presets' own stabiliser, so that the `clip`
# arm stays what cifar10_paper adds to the literal recipe.
_CLIP = tuple(configs.STABILISER.items())
_WARMUP = (("warmup_steps", 1000),)
_COSINE = (("lr_schedule", "cosine"), ("lr_boundaries", ()),
           ("nesterov", True))

STUDIES = {
    # Why the paper's recipe diverges on real images and what stops it
    # (docs/results.md).
    "stabilisers": Study(
        "stabilisers",
        "The paper's CIFAR recipe as written, each stabiliser alone (the "
        "one the cifar10_paper preset adds for three seeds), a looser clip, "
        "two pairs, and the batch-norm baseline.",
        arms=(
            Arm("literal", _LITERAL,
                description="Section 4.1 as written"),
            Arm("clip", _LITERAL, _CLIP,
                seeds=(0, 1, 2),
                description="global gradient norm clipped to 1: the "
                            "cifar10_paper preset"),
            # The next three are adaptations to the paper's network and
            # recipe (its frozen projection, rate and initialisation), not
            # the methods as their authors ran them: those are the
            # `normfree` study's arms.
            Arm("literal+agc", _LITERAL, (("agc_clip", 0.01),),
                description="adaptive gradient clipping, lambda = 0.01"),
            Arm("warmup", _LITERAL, _WARMUP,
                description="linear warm-up over 1000 steps"),
            Arm("projection_1/d", _LITERAL,
                (("projection_scale", "features"),),
                description="projection entries N(0, 1/d)"),
            Arm("literal+skipinit_gain", _LITERAL,
                (("branch_gain", "zero"),),
                description="a zero-initialised gain on every branch"),
            Arm("literal+fixup_scalars", _LITERAL, (("residual", "fixup"),),
                description="Fixup's initialisation, scalar biases and "
                            "multipliers"),
            # A bound of 1 stays active after the early growth of the
            # gradient (its norm is still about 3 at the end of the rate-0.05
            # phase, docs/results.md): a looser bound tests whether that
            # costs accuracy (it does not: 90.88 % against 90.96 %).
            Arm("clip_5", _LITERAL, (("grad_clip_norm", 5.0),),
                description="global gradient norm clipped to 5"),
            Arm("clip+projection_1/d", _LITERAL,
                _CLIP + (("projection_scale", "features"),),
                description="the two together"),
            # The two stabilisers that trained best alone: whether bounding
            # the first steps harder closes clip's gap to batch norm.
            Arm("clip+warmup", _LITERAL, _CLIP + _WARMUP,
                description="clipped to 1 and warmed up over 1000 steps"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                seeds=(0, 1, 2),
                description="the batch-norm baseline, the paper's recipe"),
        )),
    # Whether 16-bit compute costs the identity parametrisation accuracy
    # (docs/results.md): the preset and the batch-norm baseline in float32
    # (the stabilisers study's arms of the same name) and in bfloat16.
    "precision": Study(
        "precision",
        "cifar10_paper (clipped) and the batch-norm baseline, each in "
        "float32 and in mixed_bfloat16.",
        arms=(
            Arm("clip", _LITERAL, _CLIP, seeds=(0, 1, 2),
                description="cifar10_paper, float32"),
            Arm("clip_bf16", _LITERAL,
                _CLIP + (("precision", "mixed_bfloat16"),), seeds=(0, 1, 2),
                description="cifar10_paper, mixed_bfloat16"),
            # The branches the paper's initialisation makes small are partly
            # rounded away in a bfloat16 sum (BENCHMARKS.md, bf16_identity):
            # whether adding them in float32 matters.
            Arm("clip_bf16_stream", _LITERAL,
                _CLIP + (("precision", "mixed_bfloat16"),
                         ("float32_stream", True)), seeds=(0,),
                description="cifar10_paper, mixed_bfloat16, float32 "
                            "residual stream"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                seeds=(0, 1, 2), description="batch norm, float32"),
            Arm("resnet_bn_bf16", _LITERAL,
                (("model", "resnet_bn"), ("precision", "mixed_bfloat16")),
                seeds=(0, 1, 2), description="batch norm, mixed_bfloat16"),
        )),
    # Whether identity-parametrised networks can do without batch norm:
    # the peers in their own recipes, the paper's network in its own and in
    # cifar10_ws's, and batch norm in both.
    "normfree": Study(
        "normfree",
        "The normalisation-free methods in their authors' recipes, the "
        "paper's network (clipped, and cifar10_ws) and batch norm, on Table "
        "1's widths and depths, under one budget and augmentation.",
        reference="resnet_bn",
        arms=(
            Arm("fixup", "fixup_cifar", seeds=(0, 1, 2),
                description="Fixup (Zhang et al., 2019), its authors' CIFAR "
                            "recipe"),
            # On Fashion-MNIST that recipe loses its units in the first
            # epoch (docs/results.md): the smallest remedy, a warm-up.
            Arm("fixup_warmup", "fixup_cifar", (("warmup_steps", 469),),
                seeds=(0, 1, 2),
                description="Fixup's recipe with the rate warmed up over "
                            "469 steps (an epoch of Fashion-MNIST)"),
            # The authors' cifar_train.py mixes every batch by default
            # (alpha 1): their recipe in full.
            Arm("fixup_mixup", "fixup_cifar", (("mixup_alpha", 1.0),),
                seeds=(0, 1, 2),
                description="Fixup's recipe with its code's default mixup "
                            "(alpha 1)"),
            Arm("skipinit", "skipinit_bn_recipe",
                description="SkipInit (De & Smith, 2020) in batch norm's "
                            "recipe (they publish none for CIFAR)"),
            Arm("skipinit_warmup", "skipinit_bn_recipe",
                (("warmup_steps", 469),), seeds=(0, 1, 2),
                description="SkipInit in batch norm's recipe, the rate "
                            "warmed up over 469 steps"),
            Arm("nf_resnet", "nf_resnet_cifar", seeds=(0, 1, 2),
                description="NF-ResNet (Brock et al., 2021), its authors' "
                            "recipe"),
            Arm("nf_resnet_agc_0.04", "nf_resnet_cifar",
                (("agc_clip", 0.04),),
                description="NF-ResNet with NFNets' adaptive gradient "
                            "clipping, lambda 0.04"),
            Arm("paper", "cifar10_paper", seeds=(0, 1, 2),
                description="the paper's network, clipped (cifar10_paper)"),
            Arm("cifar10_ws", "cifar10_ws", seeds=(0, 1, 2),
                description="the paper's unit and frozen projection, "
                            "standardised, in cifar10_ws's recipe"),
            Arm("resnet_bn", _LITERAL, (("model", "resnet_bn"),),
                seeds=(0, 1, 2),
                description="the batch-norm baseline, the paper's recipe"),
            Arm("cifar10_ws_bn", "cifar10_ws_bn", seeds=(0, 1, 2),
                description="the batch-norm baseline in cifar10_ws's "
                            "recipe (cifar10_ws_bn)"),
            # The names earlier runs of this study had, which its result
            # files' commands give (normfree_*.json), as today's options.
            Arm("paper_best", "cifar10_ws",
                description="cifar10_ws, as it ran before it was a preset"),
            Arm("resnet_bn_cosine", "cifar10_ws_bn",
                (("grad_clip_norm", 0.0),),
                description="batch norm in cifar10_ws's recipe, unclipped"),
            Arm("paper_fixup_init", "cifar10_paper", (("init", "fixup"),),
                description="cifar10_paper drawn as Fixup draws (C2 = 0)"),
            Arm("paper_lr_0.1", "cifar10_paper", (("learning_rate", 0.1),),
                description="cifar10_paper at rate 0.1"),
            Arm("paper_ws", "cifar10_paper",
                (("weight_standardization", True), ("branch_gain", "zero"),
                 ("branch_init", "fan_in")),
                description="cifar10_paper standardised at unit fan-in, a "
                            "branch gain from 0"),
        )),
    # What the paper's network needs to train like batch norm: cifar10_ws
    # with each of its changes to cifar10_paper taken away in turn, and its
    # batch-norm twin with and without the clip (docs/results.md, "What
    # each change does"). One seed screens; three for every change whose
    # removal costs more than 0.3 point.
    "ablation": Study(
        "ablation",
        "cifar10_ws, each of its changes to the paper's recipe removed in "
        "turn, and batch norm in the same recipe.",
        reference="cifar10_ws",
        arms=(
            Arm("cifar10_ws", "cifar10_ws", seeds=(0, 1, 2),
                description="the preset"),
            Arm("cifar10_ws_bn", "cifar10_ws_bn", seeds=(0, 1, 2),
                description="batch norm in the same recipe"),
            Arm("ws_gain_frozen", "cifar10_ws", (("ws_gain", "frozen"),),
                description="the standardised convolutions' per-channel "
                            "gain kept at 1"),
            Arm("no_weight_standardization", "cifar10_ws",
                (("weight_standardization", False),),
                description="C1 and C2 not standardised (still drawn at "
                            "twice the paper's std)"),
            Arm("no_branch_gain", "cifar10_ws", (("branch_gain", "none"),),
                description="no scalar gain on the branches"),
            Arm("logit_scale_1", "cifar10_ws", (("logit_scale", 1.0),),
                description="the frozen projection at the paper's scale"),
            Arm("paper_schedule", "cifar10_ws",
                (("lr_schedule", "piecewise"),
                 ("lr_boundaries", configs.PRESETS["cifar10_paper"].lr_boundaries),
                 ("nesterov", False)),
                description="the paper's schedule: momentum, the rate x0.1 "
                            "at 3/7 and 5/7 of the run"),
            Arm("no_clip", "cifar10_ws", (("grad_clip_norm", 0.0),),
                description="the gradient norm not clipped"),
            Arm("paper_draw", "cifar10_ws", (("branch_init_scale", 1.0),),
                description="C1 and C2 drawn at the paper's std"),
            Arm("cifar10_ws_bn_no_clip", "cifar10_ws_bn",
                (("grad_clip_norm", 0.0),),
                description="batch norm in the same recipe, unclipped"),
        )),
    # Fixup's and SkipInit's own recipes (and a warm-up) lose their units
    # in the first epoch on Fashion-MNIST (docs/results.md): the largest
    # rate at which each trains, as their authors would tune it.
    "peer_rates": Study(
        "peer_rates",
        "Fixup's recipe and SkipInit in batch norm's, at lower learning "
        "rates.",
        arms=tuple(
            Arm(f"{peer}_lr{rate:g}", preset,
                (("learning_rate", rate),),
                description=f"{preset} at rate {rate:g}")
            for peer, preset, rates in (
                ("fixup", "fixup_cifar", (0.05, 0.02)),
                ("skipinit", "skipinit_bn_recipe", (0.02, 0.01)))
            for rate in rates)),
    # Does Fixup in its recipe keep its units with its authors' per-channel
    # normalisation and a stem as wide as stage 1? Their CIFAR code
    # (cifar_train.py, fixup_resnet_cifar.py) normalises every image per
    # channel (with constants near CIFAR-10's; here the run's training
    # images' own mean and std) where fixup_cifar standardises each image,
    # and its stem is as wide as its first stage where Table 1's is 16
    # channels before a first stage of 64: each change alone, then both.
    "fixup_layout": Study(
        "fixup_layout",
        "Fixup's recipe with its authors' per-channel normalisation, a stem "
        "as wide as stage 1, and both.",
        reference="fixup",
        arms=(
            Arm("fixup", "fixup_cifar",
                description="fixup_cifar as it is: per-image "
                            "standardisation, Table 1's 16-channel stem"),
            Arm("fixup_per_channel", "fixup_cifar",
                (("standardize", "per_channel"),),
                description="the input normalised per channel with the "
                            "training images' mean and std"),
            Arm("fixup_wide_stem", "fixup_cifar", (("stem_channels", 64),),
                description="a 64-channel stem, as wide as stage 1"),
            Arm("fixup_authors_input", "fixup_cifar",
                (("standardize", "per_channel"), ("stem_channels", 64)),
                description="both: the authors' input normalisation and "
                            "stem layout"),
        )),
    # AGC's threshold for NF-ResNet at a batch of 128 (NFNets chose 0.01 at
    # 4096 and say smaller batches tolerate larger thresholds): none is best.
    "nf_agc": Study(
        "nf_agc",
        "NF-ResNet's recipe with AGC's lambda from 0.01 to 0.32, and "
        "without AGC.",
        arms=tuple(
            Arm(f"lambda_{value:g}", "nf_resnet_cifar",
                (("agc_clip", value),),
                description=f"AGC, lambda = {value:g}" if value else
                            "no clipping")
            for value in (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.0))),
    # One change at a time to cifar10_paper, the search that led to
    # cifar10_ws (docs/results' gap_*.json and normfree_*.json ran it):
    # each arm, under the name it ran as, the configuration those files
    # record in today's options, so that their commands run again.
    "gap": Study(
        "gap",
        "Changes to cifar10_paper one at a time and in combination, and "
        "batch norm, as the search for cifar10_ws ran them.",
        arms=tuple(
            Arm(name, preset, overrides, description=f"{preset} "
                + " ".join(f"--{k}={v}" for k, v in overrides))
            for name, preset, overrides in (
        ("agc_0.04", "cifar10_paper", (("grad_clip_norm", 0.0), ("agc_clip", 0.04))),
        ("clip_first_epoch", "cifar10_paper", (("grad_clip_steps", 469),)),
        ("ema+fixup_init", "cifar10_paper", (("init", "fixup"), ("ema_decay", 0.999))),
        ("fixup_init", "cifar10_paper", (("init", "fixup"),)),
        ("fixup_init_unclipped", "cifar10_paper", (("init", "fixup"), ("grad_clip_norm", 0.0))),
        ("gain", "cifar10_paper", (("branch_gain", "one"),)),
        ("label_smoothing+fixup_init", "cifar10_paper", (("init", "fixup"), ("label_smoothing", 0.1))),
        ("logit_scale_4", "cifar10_paper", (("logit_scale", 4.0),)),
        ("logit_scale_4+skipinit_ws", "cifar10_paper", (("logit_scale", 4.0), ("weight_standardization", True), ("branch_init", "fan_in"), ("branch_gain", "zero"))),
        ("lr_0.1", "cifar10_paper", (("learning_rate", 0.1),)),
        ("nesterov_cosine", "cifar10_paper", (("lr_schedule", "cosine"), ("nesterov", True))),
        ("nesterov_cosine+fixup_init", "cifar10_paper", (("init", "fixup"), ("lr_schedule", "cosine"), ("nesterov", True))),
        ("nesterov_cosine+logit_scale_4+skipinit_ws", "cifar10_ws", (("branch_init", "fan_in"), ("branch_init_scale", 1.0))),
        ("nesterov_cosine+logit_scale_4+skipinit_ws+bias", "cifar10_ws", (("branch_init", "fan_in"), ("branch_init_scale", 1.0), ("use_bias", True))),
        ("nesterov_cosine+logit_scale_4+skipinit_ws+standard_stem", "cifar10_ws", (("branch_init", "fan_in"), ("branch_init_scale", 1.0), ("init", "standard"))),
        ("nesterov_cosine+logit_scale_4+skipinit_ws_small", "cifar10_ws", (("branch_init_scale", 1.0),)),
        ("nesterov_cosine+logit_scale_4+skipinit_ws_small+agc_0.3", "cifar10_ws", (("branch_init_scale", 1.0), ("agc_clip", 0.3))),
        ("nesterov_cosine+logit_scale_4+skipinit_ws_small+gain_lr_0.1", "cifar10_ws", (("branch_init_scale", 1.0), ("bias_lr_factor", 0.1))),
        ("nesterov_cosine+logit_scale_4+skipinit_ws_small+ws_init_2", "cifar10_ws", ()),
        ("nesterov_cosine+skipinit_ws", "cifar10_paper", (("lr_schedule", "cosine"), ("nesterov", True), ("weight_standardization", True), ("branch_init", "fan_in"), ("branch_gain", "zero"))),
        ("no_decay+fixup_init", "cifar10_paper", (("init", "fixup"), ("weight_decay", 0.0))),
        ("paper", "cifar10_paper", ()),
        ("resnet_bn", "cifar10_paper_literal", (("model", "resnet_bn"),)),
        ("resnet_bn_cosine", "cifar10_ws_bn", (("grad_clip_norm", 0.0),)),
        ("skipinit_ws", "cifar10_paper", (("weight_standardization", True), ("branch_init", "fan_in"), ("branch_gain", "zero"))),
        ("skipinit_ws+standard_stem", "cifar10_paper", (("init", "standard"), ("weight_standardization", True), ("branch_init", "fan_in"), ("branch_gain", "zero"))),
        ("skipinit_ws_unclipped", "cifar10_paper", (("grad_clip_norm", 0.0), ("weight_standardization", True), ("branch_init", "fan_in"), ("branch_gain", "zero"))),
        ("trainable_head+fixup_init", "cifar10_paper", (("init", "fixup"), ("head", "trainable"))),
        ("warmup+fixup_init_unclipped", "cifar10_paper", (("init", "fixup"), ("grad_clip_norm", 0.0), ("warmup_steps", 1000))),
        ("warmup+nesterov_cosine+logit_scale_4+skipinit_ws_small_unclipped", "cifar10_ws", (("branch_init_scale", 1.0), ("grad_clip_norm", 0.0), ("warmup_steps", 469))),
        ("warmup+nesterov_cosine+logit_scale_4+skipinit_ws_unclipped", "cifar10_ws", (("branch_init", "fan_in"), ("branch_init_scale", 1.0), ("grad_clip_norm", 0.0), ("warmup_steps", 469))),
            ))),
    # Minutes on two cores (synthetic data): to try the binary.
    "smoke": Study(
        "smoke", "The smoke preset as it is and with its rate raised ten "
        "times, plain and clipped.",
        arms=(
            Arm("smoke", "smoke"),
            Arm("lr_x10", "smoke", (("learning_rate", 0.1),)),
            Arm("lr_x10_clip", "smoke", (("learning_rate", 0.1),
                                         ("grad_clip_norm", 1.0))),
        )),

    # ------------------------------------------------------------------
    # The comparison with batch norm, tuned alike (docstring above).
    "rates": Study(
        "rates",
        "cifar10_ws and its batch-norm twin at five learning rates (more "
        "where the best is the grid's edge: EDGE_RATES), scored on "
        f"{VALIDATION_EXAMPLES} held-out training images (the test split "
        "is not read); each network's best rate is its tuned rate.",
        arms=tuple(
            Arm(f"{preset}_lr{rate:g}", preset, (("learning_rate", rate),),
                description=f"{preset} at rate {rate:g}")
            for preset in PAIR
            for rate in SWEEP_RATES + EDGE_RATES.get(preset, ())),
        validation_examples=VALIDATION_EXAMPLES, test_at_end=False,
        selects=True, deterministic=True),
    "tuned": _tuned_study(),
    # Does each network train at depth from its initialisation? Units per
    # stage 9 (Table 1), 27 and 81, each preset as it is; one epoch screens
    # all, ten epochs follow for the pair at 27.
    "depth": Study(
        "depth",
        "The paper's network, cifar10_ws, its batch-norm twin and Fixup at "
        "9, 27 and 81 units per stage, scored on held-out training images.",
        arms=tuple(
            Arm(f"{preset}_units{units}", preset, (("units", (units,)),),
                description=f"{preset}, {units} units per stage")
            for preset in ("cifar10_paper", "cifar10_ws", "cifar10_ws_bn",
                           "fixup_cifar")
            for units in DEPTHS),
        validation_examples=VALIDATION_EXAMPLES, test_at_end=False,
        deterministic=True),
    "batch": _batch_study(),
}
