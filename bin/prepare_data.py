"""Prepares a TFDS dataset for training: the only step that downloads.

  bazel run //bin:prepare_data -- --dataset=cifar10 --data_dir=~/tensorflow_datasets
  bazel run //bin:prepare_data -- --dataset=imagenet2012 --data_dir=DIR

CIFAR-10/100 are downloaded and converted (needs internet access; prepare on
another machine and copy DIR where there is none). ImageNet is converted from
ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar, which you download from
image-net.org into DIR/downloads/manual/. See docs/data.md.
"""

import os

from absl import app
from absl import flags

from identity_tf import input_pipeline
from identity_tf import paths

FLAGS = flags.FLAGS
flags.DEFINE_string("dataset", None,
                    "The TFDS dataset to prepare: cifar10, cifar100, "
                    "imagenet2012 (or any TFDS dataset, for bin/construct).")
flags.DEFINE_string("data_dir", None,
                    "TFDS data directory (default: TFDS's, "
                    "~/tensorflow_datasets or $TFDS_DATA_DIR).")
flags.mark_flag_as_required("dataset")


def main(argv):
  if len(argv) > 1:
    raise SystemExit(f"error: unexpected arguments {argv[1:]}; "
                     "all options are --flags (see --help)")
  data_dir = paths.resolve_path(FLAGS.data_dir) if FLAGS.data_dir else None
  try:
    path = input_pipeline.prepare(FLAGS.dataset, data_dir)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  print(f"{FLAGS.dataset} is ready in {path}; train with "
        f"--dataset={FLAGS.dataset} --data_dir={os.path.dirname(os.path.dirname(path))}")


if __name__ == "__main__":
  app.run(main)
