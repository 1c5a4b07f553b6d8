"""A training run, resolved once: everything downstream reads it from here.

`prepare(config, dataset, model_dir)` turns a validated `configs.Config`,
the dataset's `datasets.DatasetInfo` and where the run's files go into a
`Run`: the network's complete options, the input preprocessing, the steps
per epoch and the learning-rate schedule, each derived here and nowhere
else. The trainer, evaluation, export, the study and the benchmark take
what they need from a `Run`; config.json is `Run.description()`, and
`from_description` rebuilds the `Run` of a finished run from it, so that
evaluation and export need nothing but the directory.

`choose_config` is the first step of //bin:train: the configuration of a
command line, from a preset or from the run a model_dir already holds.

Pure Python (no TensorFlow): flags and configurations are checked, and the
stored configuration of a model_dir is read, before TensorFlow loads. The
one exception is --standardize=per_channel on CIFAR-sized images, whose
statistics `prepare` computes from the training images (TFDS's, through
`tfds_data`).
"""

import dataclasses
import re

from identity_tf import architectures
from identity_tf import configs
from identity_tf import errors
from identity_tf.data import datasets
from identity_tf.training import config_file


@dataclasses.dataclass(frozen=True)
class Schedule:
  """The learning rate against the step, as data (`optimization` builds it).

  kind "piecewise": VALUES[i] from BOUNDARIES[i-1] on (Section 4.1);
  "exponential": INITIAL * DECAY_RATE ** floor(step / DECAY_STEPS)
  (Section 4.2, DECAY_STEPS = the decay period in steps); "cosine":
  INITIAL (1 + cos(pi step / DECAY_STEPS)) / 2, DECAY_STEPS the run's
  length (Loshchilov & Hutter, 2017, without restarts); "constant":
  INITIAL. Then a linear warm-up over WARMUP_STEPS, if any.
  """
  kind: str
  initial: float
  boundaries: tuple = ()
  values: tuple = ()
  decay_steps: int = None
  decay_rate: float = None
  warmup_steps: int = 0


@dataclasses.dataclass(frozen=True)
class Run:
  """A run's configuration and everything derived from it.

  Attributes:
    config: the validated `configs.Config`.
    dataset: the dataset's `datasets.DatasetInfo` (classes, image shape,
      splits and their sizes); None for a recorded run from before it was
      recorded.
    model_dir: where config.json, checkpoints and summaries go.
    data_dir: the TFDS data directory (None: TFDS's default).
    model_options: the complete `model.build_model` options of
      config.model for this dataset (`architectures.ModelOptions`: every
      default named, so that config.json rebuilds the same network if
      defaults change).
    preprocessing: the input preprocessing (`datasets.Preprocessing`;
      with --standardize=per_channel on CIFAR-sized images, the training
      images' statistics, `_preprocessing`).
    steps_per_epoch: steps per pass over the training examples; None if
      their count is not known.
    schedule: the learning rate (`Schedule`).
  """
  config: configs.Config
  dataset: datasets.DatasetInfo
  model_dir: str
  data_dir: str
  model_options: architectures.ModelOptions
  preprocessing: datasets.Preprocessing
  steps_per_epoch: float
  schedule: Schedule

  @property
  def numerics(self):
    """The `model.build_model` options that say what the network computes
    in (not what it is): the run's precision and residual stream."""
    return {"precision": self.config.precision,
            "float32_stream": self.config.float32_stream}

  @property
  def model_name(self):
    return self.config.model

  def model_arguments(self, precision=None):
    """`model.build_model`'s arguments for this run's network, computing in
    PRECISION (default: the run's): what training trains and what its
    checkpoints restore into."""
    numerics = dict(self.numerics, **({"precision": precision} if precision
                                      else {}))
    return {"name": self.model_name, **numerics,
            **self.model_options.to_dict()}

  def description(self, **extra):
    """config.json's content: the configuration and what rebuilding the
    model and its input needs."""
    description = {
        "config": configs.to_dict(self.config),
        "model": {"name": self.config.model,
                  "options": self.model_options.to_dict()},
        "dataset": self.dataset.to_dict() if self.dataset else None,
        "preprocessing": self.preprocessing.to_dict(),
        "steps_per_epoch": self.steps_per_epoch,
        **extra,
    }
    return {k: v for k, v in description.items() if v is not None or
            k == "steps_per_epoch"}


def prepare(config, dataset, model_dir, data_dir=None, replicas=1):
  """The `Run` of CONFIG on DATASET (a `datasets.DatasetInfo`) in MODEL_DIR.

  REPLICAS: the strategy's replicas in sync, which must divide the global
  batch. Raises ValueError (one line) for what the configuration alone
  cannot know is wrong: a batch that does not split over the replicas, an
  exponential schedule without the epoch's length, images the network
  cannot take.

  Reads no data, but for --standardize=per_channel on CIFAR-sized images
  (`_preprocessing`): then the statistics of the training images, which
  MODEL_DIR's config.json holds if it records them, or one pass over the
  images computes (the dataset must be prepared in DATA_DIR:
  DatasetNotReadyError otherwise).
  """
  if config.batch_size % replicas:
    raise errors.ConfigError(
        f"--batch_size={config.batch_size} must be a multiple "
        f"of the {replicas} replicas of --strategy="
        f"{config.strategy}")
  # The input pipeline refuses these too, but only once the data is read:
  # checked here, a dry run says it as the real run would.
  _check_validation_examples(config, dataset)
  examples = training_examples(config, dataset.num_train_examples)
  if examples and examples < config.batch_size:
    raise errors.ConfigError(
        f"--batch_size={config.batch_size} is more than the {examples} "
        f"training examples of {config.dataset}: lower --batch_size")
  steps = steps_per_epoch(config, dataset.num_train_examples)
  return Run(config=config, dataset=dataset, model_dir=model_dir,
             data_dir=data_dir,
             model_options=_model_options(config, dataset.num_classes),
             preprocessing=_preprocessing(config, dataset, model_dir,
                                          data_dir),
             steps_per_epoch=steps,
             schedule=make_schedule(config, steps))


def _preprocessing(config, dataset, model_dir, data_dir):
  """The `datasets.Preprocessing` of CONFIG's network on DATASET.

  --standardize=per_channel on CIFAR-sized images normalises with the
  mean and std of the run's training images (its first
  --num_train_examples, if set): those MODEL_DIR's config.json recorded
  for this dataset and input if it holds a run (resumed, the network keeps
  the input it was trained on, without a pass over the data), else
  computed once here (`datasets.rgb_statistics`). Any other choice reads
  nothing.
  """
  size = architectures.input_size(config.model)
  statistics = None
  if (config.standardize == "per_channel" and
      datasets.preprocessing_kind(dataset, size) == "cifar"):
    statistics = (_recorded_statistics(config, dataset, model_dir, size)
                  or _training_statistics(config, dataset, data_dir))
  return datasets.preprocessing_config(
      dataset, size, flip=config.flip, standardize=config.standardize,
      statistics=statistics)


def _recorded_statistics(config, dataset, model_dir, size):
  """(mean, std) of the per-channel "cifar" preprocessing MODEL_DIR's
  config.json records for CONFIG's dataset, images of DATASET's shape and
  input SIZE; None if it holds none (or cannot be read: then
  `config_file.check_resumable` says why, as without the option)."""
  if model_dir is None:
    return None
  try:
    if not config_file.exists(model_dir):
      return None
    description = config_file.read(model_dir)
    stored = configs.from_dict(description["config"])
    recorded = datasets.Preprocessing.from_dict(description["preprocessing"])
  except (errors.IdentityTfError, ValueError, TypeError, KeyError,
          AttributeError):
    return None
  height, width, channels = dataset.image_shape
  if (stored.dataset != config.dataset or recorded.kind != "cifar" or
      recorded.standardize != "per_channel" or recorded.image_size != size
      or recorded.input_shape != [height, width, channels]):
    return None
  return recorded.mean, recorded.std


def _training_statistics(config, dataset, data_dir):
  """`datasets.rgb_statistics` of CONFIG's training images: the first
  --num_train_examples (all if unset) of DATASET's training split, of
  those --validation_examples leaves (`datasets.held_out`)."""
  held_out = config.validation_examples
  first = None if held_out else config.num_train_examples
  # pylint: disable=g-import-not-at-top
  if config.dataset == datasets.SYNTHETIC:  # NumPy's: no TensorFlow.
    from identity_tf.data import synthetic
    images = synthetic.arrays(dataset.train_split)[0][:first]
  else:  # Reading a TFDS split takes TensorFlow: imported only here.
    from identity_tf.data import tfds_data
    images, _, _ = tfds_data.load_arrays(config.dataset, dataset.train_split,
                                         data_dir, first)
  # pylint: enable=g-import-not-at-top
  if held_out:
    _, training = datasets.held_out(len(images), held_out)
    images = images[training[:config.num_train_examples]]
  return datasets.rgb_statistics(images)


def training_examples(config, num_train_examples):
  """How many examples CONFIG trains on: its --num_train_examples if set,
  else NUM_TRAIN_EXAMPLES (the dataset's training split); with
  --validation_examples, of the split less those held out. None if
  unknown."""
  if not config.validation_examples:
    return config.num_train_examples or num_train_examples
  if num_train_examples is None:
    return None
  left = num_train_examples - config.validation_examples
  return min(left, config.num_train_examples or left)


def _check_validation_examples(config, dataset):
  """ConfigError if --validation_examples cannot be held out of DATASET:
  as many as its training split, or images that are streamed."""
  count = config.validation_examples
  if not count:
    return
  size = dataset.num_train_examples
  if size is not None and count >= size:
    raise errors.ConfigError(
        f"--validation_examples={count} leaves nothing to train on: "
        f"{config.dataset}'s training split has {size} examples; lower it")
  if datasets.preprocessing_kind(
      dataset, architectures.input_size(config.model)) != "cifar":
    raise errors.ConfigError(
        f"--validation_examples holds out images of datasets held in "
        f"memory (fixed-size images up to the network's input); "
        f"{config.dataset}'s are streamed: leave it at 0")


def steps_per_epoch(config, num_train_examples):
  """Steps per pass over CONFIG's training examples (`training_examples`
  of NUM_TRAIN_EXAMPLES, the dataset's training split) over the global
  batch; None if their count is not known."""
  examples = training_examples(config, num_train_examples)
  return examples / config.batch_size if examples else None


def from_description(description, model_dir, data_dir=None):
  """The `Run` that wrote DESCRIPTION (a config.json dict) into MODEL_DIR.

  The network's options and the preprocessing are taken as recorded, not
  derived again: they are what the checkpoints were trained with (an
  option or a preprocessing field an older version did not record takes
  the value that version used: `ModelOptions.from_dict`,
  `Preprocessing.from_dict`).
  """
  config = configs.from_dict(description["config"])
  # Runs from before the dataset was recorded have none.
  dataset = description.get("dataset")
  info = datasets.DatasetInfo.from_dict(dataset) if dataset else None
  steps_per_epoch = description.get("steps_per_epoch")
  return Run(config=config, dataset=info, model_dir=model_dir,
             data_dir=data_dir,
             model_options=architectures.ModelOptions.from_dict(
                 config.model, description["model"]["options"]),
             preprocessing=datasets.Preprocessing.from_dict(
                 description["preprocessing"]),
             steps_per_epoch=steps_per_epoch,
             schedule=make_schedule(config, steps_per_epoch))


def read(model_dir, data_dir=None):
  """The `Run` recorded in MODEL_DIR's config.json (`config_file.read`);
  ValueError (one line naming the file) if its values do not make one."""
  description = config_file.read(model_dir)
  try:
    return from_description(description, model_dir, data_dir)
  except (KeyError, TypeError, AttributeError, ValueError) as e:
    raise errors.ConfigError(
        f"{config_file.path(model_dir)} does not describe a run this version "
        f"reads ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        "); restore it from a copy, or use a new --model_dir") from None


def _model_options(config, num_classes):
  """The complete `architectures.ModelOptions` of CONFIG's network."""
  _, options = architectures.complete_options(
      config.model, classes=num_classes, width=config.width,
      units=config.units, stem_channels=config.stem_channels,
      norm=config.norm, head=config.head,
      init=config.init, seed=config.seed,
      image_size=architectures.input_size(config.model),
      use_bias=config.use_bias, **configs.branch_options(config),
      projection_scale=config.projection_scale,
      logit_scale=config.logit_scale)
  return options


def make_schedule(config, steps_per_epoch):
  """CONFIG's `Schedule`. The exponential one decays per epoch: without
  STEPS_PER_EPOCH (a dataset whose size is not known) it has no decay_steps,
  and `optimization.learning_rate_schedule` refuses it."""
  rate = config.learning_rate
  kind = config.lr_schedule
  if kind == "piecewise" and not config.lr_boundaries:
    kind = "constant"
  schedule = Schedule(kind, rate, warmup_steps=config.warmup_steps)
  if kind == "piecewise":
    boundaries = tuple(config.lr_boundaries)
    return dataclasses.replace(
        schedule, boundaries=boundaries,
        values=tuple(rate * config.lr_decay_factor ** i
                     for i in range(len(boundaries) + 1)))
  if kind == "cosine":
    return dataclasses.replace(schedule, decay_steps=config.train_steps)
  if kind == "exponential" and steps_per_epoch:
    return dataclasses.replace(
        schedule, decay_rate=config.lr_decay_factor,
        decay_steps=max(1, round(config.lr_decay_epochs * steps_per_epoch)))
  return schedule


def choose_config(preset, model_dir, overrides):
  """The config of a //bin:train command line.

  PRESET None means: the configuration stored in MODEL_DIR's config.json
  if it holds a run (MODEL_DIR None: none does), else the smoke preset.
  OVERRIDES ({field: value or None}) are the flags that were set. Raises
  ConfigError (one line) for bad values.
  """
  stored = (config_file.stored_config(model_dir)
            if preset is None and model_dir else None)
  if stored is None:
    return configs.from_preset(preset or "smoke", **overrides)
  try:
    return configs.override(stored, **overrides)
  except errors.ConfigError as e:
    raise _stored_value_error(e, model_dir, overrides) from None


def _stored_value_error(error, model_dir, overrides):
  """ERROR (a `configs.validate` line, "--NAME ...") said of the value
  config.json holds when no flag set NAME: the user passed no --NAME."""
  message = str(error)
  name = re.match(r"--(\w+)", message)
  name = name and name.group(1)
  if (name is None or name not in configs.Config.__dataclass_fields__
      or overrides.get(name) is not None):
    return error
  fix = ("use a new --model_dir" if name in configs.MODEL_FIELDS +
         ("batch_size",) else f"pass --{name} to replace it")
  return errors.ConfigError(
      f"{config_file.path(model_dir)} holds an invalid {name}: "
      f"{message[2:]}; {fix}")
