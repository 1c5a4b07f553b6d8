"""Packs a finished run into a shipped model: models/NAME.

    bazel run //bin:ship_model -- --model_dir=runs/ship_cifar10_ws \\
        --output_dir=models/cifar10_ws --test_top1=0.9356 \\
        --command="./bazelw run //bin:train -- --preset=cifar10_ws ..."

Writes the weights the run's newest intact checkpoint evaluates with (no
optimizer state) and its config.json into --output_dir (new or empty), and
manifest.json: each file's SHA-256,
the command that trained the run, this machine's CPU and the test top-1
//bin:evaluate printed for it (`identity_tf.training.shipped`).
//bin:evaluate and //bin:export take the folder as a --model_dir and
write nothing into it. Prints the manifest's path.
"""

from absl import flags

from identity_tf.commands import cli

FLAGS = flags.FLAGS
cli.define_model_dir(required=True)
flags.DEFINE_string("output_dir", None, "The shipped model's folder (new or "
                    "empty), e.g. models/cifar10_ws.")
flags.DEFINE_string("command", None, "The command that trained the run, as "
                    "the README states it.")
flags.DEFINE_float("test_top1", None, "Its test top-1 (0 to 1), as "
                   "//bin:evaluate printed it.", lower_bound=0,
                   upper_bound=1)
for _name in ("output_dir", "command", "test_top1"):
  flags.mark_flag_as_required(_name)
flags.adopt_module_key_flags(cli)


def main(argv):
  cli.begin(argv, "--model_dir=DIR --output_dir=models/NAME ...",
            start_tensorflow=False)
  # pylint: disable=g-import-not-at-top
  import os
  from identity_tf import machine
  from identity_tf.training import shipped
  # pylint: enable=g-import-not-at-top
  with cli.errors_as_exit():
    output_dir = cli.resolve_path(FLAGS.output_dir)
    shipped.package(cli.path(FLAGS.model_dir), output_dir,
                    command=FLAGS.command, machine=machine.describe(),
                    test_top1=FLAGS.test_top1)
    print(os.path.join(output_dir, shipped.MANIFEST))


def run():
  """The console script's entry point (pip install: identity-tf-NAME)."""
  cli.run(main, __doc__)


if __name__ == "__main__":
  run()
