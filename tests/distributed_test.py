"""Distributed training: multi_worker_mirrored, mirrored, parameter_server.

Multi-process tests start bin/train.py as a user would, each process with
its own TF_CONFIG naming 127.0.0.1 ports picked free at run time; all
processes are killed in tearDown whatever happens. The mirrored test runs in
this process on two logical CPUs.
"""

import json
import os
import re
import signal
import subprocess
import time

from absl.testing import absltest
import numpy as np
import tensorflow as tf

from identity_tf import configs
from identity_tf import model as model_lib
from identity_tf.data import tfds_data
from identity_tf.training import checkpoints
from identity_tf.training import distribute
from identity_tf.training import optimization
from identity_tf.training import preemption
from identity_tf.training import run as run_lib
from identity_tf.training import trainer
import testing

# Two logical CPUs in this process, for the in-process mirrored test; must
# happen before TensorFlow initialises its runtime.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)

# A tiny deterministic run; 2 workers x 8 = 1 worker x 16 examples per step.
TINY = ["--preset=smoke", "--width=0.0625", "--units=1", "--batch_size=16",
        "--learning_rate=0.01", "--train_steps=20", "--checkpoint_steps=10",
        "--log_steps=10", "--steps_per_loop=5", "--eval_at_end=false",
        "--deterministic"]
TIMEOUT = 300  # Seconds any one process may take.
# Two workers average their gradients by all-reduce; one worker sums the
# same 16 examples in one batch. Float32 summation order differs, so the
# weights agree to rounding, amplified a little by 20 momentum steps.
RTOL, ATOL = 1e-4, 1e-6


def _read(process):
  process.log.flush()
  with open(process.log.name) as f:
    return f.read()


def _weights(model_dir):
  """The latest checkpoint's weights and weight average (floats only)."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(model_dir))
  return {name: reader.get_tensor(name)
          for name, dtype in reader.get_variable_to_dtype_map().items()
          if dtype.is_floating and name.startswith(
              ("optimizer/_trainable_variables/", "model/",
               optimization.WEIGHT_AVERAGE + "/"))}


class DistributedTest(testing.ProcessTestCase):

  def _start(self, args, tf_config=None):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
      env["TF_CONFIG"] = json.dumps(tf_config)
    log = open(os.path.join(self.create_tempdir().full_path, "log"), "w+")
    self.addCleanup(log.close)
    process = self.start_binary("train", *args, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    process.log = log
    return process

  def _wait(self, process):
    try:
      code = process.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
      code = None
    process.log.seek(0)
    output = process.log.read()
    self.assertEqual(code, 0, f"exit {code}:\n{output[-3000:]}")
    return output

  def test_two_workers_match_one_worker_with_the_same_global_batch(self):
    root = self.create_tempdir().full_path
    single_dir = os.path.join(root, "single")
    multi_dir = os.path.join(root, "multi")
    cluster = {"worker": [f"127.0.0.1:{p}" for p in testing.free_ports(2)]}
    workers = [
        self._start([*TINY, "--strategy=multi_worker_mirrored",
                     f"--model_dir={multi_dir}"],
                    {"cluster": cluster, "task": {"type": "worker",
                                                  "index": i}})
        for i in range(2)]
    single = self._start([*TINY, f"--model_dir={single_dir}"])
    outputs = [self._wait(worker) for worker in workers]
    self.assertIn("2 replica(s) (multi_worker_mirrored)", outputs[0])
    self._wait(single)

    multi, one = _weights(multi_dir), _weights(single_dir)
    self.assertEqual(sorted(multi), sorted(one))
    self.assertGreater(len(one), 5)
    start = _weights_at_init()
    largest = max(np.max(np.abs(multi[name] - one[name])) for name in one)
    print(f"largest weight difference, 2 workers vs 1: {largest:.3g}")
    for name in one:
      np.testing.assert_allclose(multi[name], one[name], rtol=RTOL, atol=ATOL,
                                 err_msg=name)
    # The runs really trained: the weights moved far beyond the tolerance.
    moved = max(np.max(np.abs(one[name] - start[name])) for name in start)
    self.assertGreater(moved, 100 * ATOL)
    # Only the chief wrote model_dir; the other worker cleaned up after itself.
    self.assertEqual(sorted(os.listdir(multi_dir)),
                     [".train.lock", "checkpoint",
                      "ckpt-10.data-00000-of-00001", "ckpt-10.index",
                      "ckpt-10.sha256", "ckpt-20.data-00000-of-00001",
                      "ckpt-20.index", "ckpt-20.sha256", "config.json",
                      "metrics.jsonl", "train"])

  def test_sigterm_to_one_worker_stops_both_at_one_checkpoint(self):
    # Preemption reaches one machine; TensorFlow's PreemptionCheckpointHandler
    # makes every worker save at the same step and stop, instead of leaving
    # the peer waiting in the all-reduce. Re-running resumes them.
    model_dir = self.create_tempdir().full_path
    cluster = {"worker": [f"127.0.0.1:{p}" for p in testing.free_ports(2)]}
    args = [*TINY, "--strategy=multi_worker_mirrored", "--train_steps=2000",
            "--checkpoint_steps=1000", "--steps_per_loop=1", "--log_steps=5",
            f"--model_dir={model_dir}"]

    def start_workers():
      return [self._start(args, {"cluster": cluster,
                                 "task": {"type": "worker", "index": i}})
              for i in range(2)]

    workers = start_workers()
    deadline = time.time() + TIMEOUT
    while time.time() < deadline and "step 10/" not in _read(workers[0]):
      time.sleep(0.5)
    self.assertIn("step 10/", _read(workers[0]))
    workers[1].send_signal(signal.SIGTERM)
    codes = [worker.wait(timeout=TIMEOUT) for worker in workers]
    self.assertEqual(codes, [preemption.PREEMPTED_EXIT_CODE] * 2,
                     _read(workers[0])[-2000:] + _read(workers[1])[-2000:])
    stopped = [re.search(r"stopped by SIGTERM at step (\d+)", _read(w))
               for w in workers]
    self.assertTrue(all(stopped), [_read(w)[-500:] for w in workers])
    steps = {int(match.group(1)) for match in stopped}
    self.assertLen(steps, 1)  # Both at one step.
    (step,) = steps
    self.assertEqual(
        checkpoints.checkpoint_step(tf.train.latest_checkpoint(model_dir)), step)
    # Resumed by running the same command.
    args[args.index("--train_steps=2000")] = f"--train_steps={step + 5}"
    for worker in start_workers():
      self._wait(worker)
    self.assertEqual(checkpoints.checkpoint_step(
        tf.train.latest_checkpoint(model_dir)), step + 5)

  def test_a_cluster_that_never_forms_stops_with_one_line(self):
    # One worker of two: it waits for its peer -- for --cluster_timeout
    # seconds, and SIGTERM or Ctrl-C stops the wait at once.
    cluster = {"worker": [f"127.0.0.1:{p}" for p in testing.free_ports(2)]}
    task = {"cluster": cluster, "task": {"type": "worker", "index": 0}}
    model_dir = self.create_tempdir().full_path
    args = [*TINY, "--strategy=multi_worker_mirrored", "--cluster_timeout=5",
            f"--model_dir={model_dir}"]
    alone = self._start(args, task)
    self.assertEqual(alone.wait(timeout=TIMEOUT), 1)
    last = _read(alone).strip().splitlines()[-1]
    self.assertRegex(last, r"^error: the multi_worker_mirrored cluster did "
                     r"not form within 5 s \(--cluster_timeout\): start the "
                     r"same command on every task of TF_CONFIG, each with its "
                     r"own task index; no answer from worker 1 \(127.0.0.1:")
    self.assertNotIn("Traceback", _read(alone))
    self.assertEqual(os.listdir(model_dir), [])
    for signum, codes in ((signal.SIGTERM, (143,)), (signal.SIGINT, (130,))):
      waiting = self._start(args[:-2] + ["--cluster_timeout=600", args[-1]],
                            task)
      deadline = time.time() + TIMEOUT
      while "waiting up to 600 s" not in _read(waiting) and (
          time.time() < deadline and waiting.poll() is None):
        time.sleep(0.5)
      self.assertIn("for 1 other task(s) of TF_CONFIG to start",
                    _read(waiting))
      waiting.send_signal(signum)
      self.assertIn(waiting.wait(timeout=60), codes, _read(waiting))
      self.assertNotIn("Traceback", _read(waiting))
      self.assertIn(f"stopped by {signal.Signals(signum).name}",
                    _read(waiting).strip().splitlines()[-1])
      self.assertEqual(os.listdir(model_dir), [])

  def test_a_peer_that_died_is_named_in_one_line(self):
    # The text TensorFlow 2.21 gave worker 0 of two when worker 1 was killed
    # with SIGKILL during training (stack lines shortened).
    text = (
        "Graph execution error:\n\nDetected at node while/CollectiveReduceV2"
        " defined at (most recent call last):\n  File \"bin/train.py\", "
        "line 246, in <module>\n\nCollective ops is aborted by: recvmsg:"
        "Connection reset by peer\nAdditional GRPC error information from "
        "remote target /job:worker/replica:0/task:1 while calling /tensorflow"
        ".WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer  "
        "{grpc_status:14, grpc_message:\"recvmsg:Connection reset by peer\"}"
        "\nThe error could be from a previous operation.\n\t "
        "[[{{node while/CollectiveReduceV2}}]]")
    line = distribute.describe_failure(
        tf.errors.UnavailableError(None, None, text))
    self.assertEqual(
        line, "training stopped: UnavailableError: recvmsg:Connection reset "
        "by peer (from worker 1); if a worker of the cluster stopped, run the "
        "same command on every worker to resume from the latest checkpoint")
    # Anything else: its first line, never the stack.
    self.assertStartsWith(
        distribute.describe_failure(tf.errors.InternalError(
            None, None, "something broke\n  File x")),
        "training stopped: InternalError: something broke; ")
    # A long first line keeps its start and its end, where a path names the
    # file and the message says what went wrong.
    path = "/tmp/" + "deep/" * 60 + "run/ckpt-40.index"
    line = distribute.describe_failure(tf.errors.NotFoundError(
        None, None, f"{path}; No such file or directory"))
    self.assertStartsWith(line, "training stopped: NotFoundError: /tmp/deep/")
    self.assertIn("/run/ckpt-40.index; No such file or directory; ", line)
    self.assertLess(len(line), 400)

  def test_tf_config_nested_too_deeply_is_one_line(self):
    # Python's JSON parser recurses once per level; the binaries print a
    # ConfigError as one line, a RecursionError as a traceback.
    deep = '{"cluster": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with absltest.mock.patch.dict(os.environ, {"TF_CONFIG": deep}):
      with self.assertRaisesRegex(
          ValueError, r"^TF_CONFIG is JSON nested too deeply to read; set it "
          r"to \{\"cluster\""):
        distribute.tf_config()

  def test_mirrored_resume_replays_the_input_exactly(self):
    # With 2 replicas tf.distribute's iterator cannot be checkpointed; the
    # resumed run skips the batches already used. Resumed == uninterrupted.
    config = configs.from_preset(
        "smoke", width=0.0625, units="1", batch_size=16, train_steps=20,
        checkpoint_steps=10, log_steps=10, steps_per_loop=5,
        eval_at_end=False, deterministic=True, strategy="mirrored")
    strategy = testing.two_replicas()
    lines = []
    whole = self.create_tempdir().full_path
    trainer.train(config, whole, strategy=strategy, echo=lines.append)
    self.assertIn("2 replica(s) (mirrored)", "\n".join(lines))
    halves = self.create_tempdir().full_path
    trainer.train(configs.override(config, train_steps=10), halves,
                strategy=strategy, echo=lines.append)
    trainer.train(config, halves, strategy=strategy, echo=lines.append)
    self.assertIn("resumed from", " ".join(lines))
    self.assertFalse(any(name.startswith("iterator") for name, _ in
                         tf.train.list_variables(tf.train.latest_checkpoint(
                             halves))))
    resumed, uninterrupted = _weights(halves), _weights(whole)
    self.assertGreater(len(resumed), 5)
    for name, value in uninterrupted.items():
      self.assertTrue(np.array_equal(resumed[name], value), name)

  def test_runs_in_one_process_share_one_mirrored_strategy(self):
    # Two MirroredStrategy objects over the same devices number their
    # collectives alike: a second run of another network on a second one
    # aborts ("Shape mismatch in the collective instance"), on one both
    # train (testing.two_replicas). create_strategy hands every run of a
    # process the same one.
    self.assertIs(distribute.create_strategy("mirrored"),
                  distribute.create_strategy("mirrored"))
    strategy = testing.two_replicas()
    for model in ("cifar10", "resnet_bn"):
      config = configs.from_preset(
          "smoke", model=model, width=0.0625, units="1", batch_size=16,
          train_steps=2, checkpoint_steps=2, log_steps=1, steps_per_loop=1,
          eval_at_end=False, strategy="mirrored")
      result = trainer.train(config, self.create_tempdir().full_path,
                             strategy=strategy)
      self.assertEqual(result["step"], 2)

  def test_mirrored_mixed_precision_matches_one_replica(self):
    # Two replicas share the global batch: the same steps as one replica,
    # to 16-bit round-off (the replicas' gradients are summed in another
    # order). Under mixed_float16 the loss scale is one for both replicas.
    # Round-off of unit u = 2^-(mantissa bits) per operation, accumulated
    # over 10 steps, stays far below 25 u of how far each variable moved
    # (measured on two CPUs: at most 0.05 in bfloat16 and 0.005 in float16,
    # as large as one replica's own distance from float32); a replica that
    # drops or doubles its share would differ by about 1.
    for precision, unit in (("mixed_bfloat16", 2.0**-8),
                            ("mixed_float16", 2.0**-11)):
      config = configs.from_preset(
          "smoke", width=0.0625, units="1", batch_size=16, train_steps=10,
          checkpoint_steps=10, log_steps=10, steps_per_loop=5,
          eval_at_end=False, deterministic=True, precision=precision)
      mirrored = testing.two_replicas()
      two, one = (self.create_tempdir().full_path for _ in range(2))
      lines = []
      trainer.train(configs.override(config, strategy="mirrored"), two,
                    strategy=mirrored, echo=lines.append)
      self.assertIn("2 replica(s) (mirrored)", "\n".join(lines))
      trainer.train(config, one, echo=lines.append)
      start = _weights_at_init()
      two, one = _weights(two), _weights(one)
      for name in start:
        moved = np.linalg.norm(one[name] - start[name])
        self.assertLessEqual(np.linalg.norm(two[name] - one[name]),
                             25 * unit * moved + 1e-6, f"{precision} {name}")

  def test_mirrored_float16_skips_a_step_only_one_replica_overflowed(self):
    # Replica 1's images are 1000 times larger: its loss-scaled float16
    # gradient overflows while its activations (RMS taken in float32) and
    # replica 0's gradient stay finite. The whole step must be skipped --
    # weights untouched, scale halved -- not applied with replica 1's
    # 0 * inf = NaN (the clip factor of an infinite norm is 0), and not
    # reported as a divergence.
    config = configs.override(configs.from_preset(
        "smoke", width=0.0625, units="1", batch_size=16,
        precision="mixed_float16", grad_clip_norm=1.0,
        lr_schedule="constant"), strategy="mirrored")
    mirrored = testing.two_replicas()
    run = run_lib.prepare(config, tfds_data.dataset_info(config.dataset),
                          self.create_tempdir().full_path, replicas=2)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 32, 32, 3)).astype(np.float32)
    labels = rng.integers(0, 10, 8).astype(np.int32)

    def dataset_fn(_):
      # One per-replica batch per element: replica 0 takes the first.
      return tf.data.Dataset.from_tensor_slices(
          (np.stack([images, 1000 * images]), np.stack([labels, labels]))
      ).repeat()

    replicas = trainer.Trainer(run, mirrored, dataset_fn=dataset_fn)
    replicas.restore(None)
    before = [v.numpy() for v in replicas.model.trainable_variables]
    scale = replicas.loss_scale
    out = replicas.run_steps(1)
    self.assertEqual(replicas.step, 0)
    self.assertEqual(replicas.loss_scale, scale / 2)
    for b, v in zip(before, replicas.model.trainable_variables):
      np.testing.assert_array_equal(v.numpy(), b)
    np.testing.assert_array_equal(out["first_nonfinite"], [-1, -1])
    self.assertTrue(all(np.isfinite(out[name]).all() for name in (
        "grad_norm", "update_ratio")) and all(
            np.isfinite(list(out["activation_rms"].values()))))

  def test_parameter_server_trains_and_checkpoints(self):
    model_dir = self.create_tempdir().full_path
    chief, ps, worker0, worker1 = testing.free_ports(4)
    cluster = {"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps}"],
               "worker": [f"127.0.0.1:{worker0}", f"127.0.0.1:{worker1}"]}
    args = [*TINY[:-1], "--strategy=parameter_server",
            f"--model_dir={model_dir}"]
    servers = [self._start(args, {"cluster": cluster,
                                  "task": {"type": kind, "index": index}})
               for kind, index in (("ps", 0), ("worker", 0), ("worker", 1))]
    coordinator = self._start(args, {"cluster": cluster,
                                     "task": {"type": "chief", "index": 0}})
    output = self._wait(coordinator)
    for server in servers:  # Servers serve until killed.
      self.assertIsNone(server.poll())
    self.assertIn("step 20/20: ", output)
    self.assertEqual(checkpoints.checkpoint_step(
        tf.train.latest_checkpoint(model_dir)), 20)
    model, _, step = checkpoints.restore_model(model_dir)
    self.assertEqual(step, 20)
    self.assertTrue(all(np.all(np.isfinite(w)) for w in model.get_weights()))
    # The workers' steps reached the weights (the parameter servers').
    trained, start = _weights(model_dir), _weights_at_init()
    self.assertGreater(max(np.max(np.abs(trained[name] - start[name]))
                           for name in start), 100 * ATOL)

  def test_parameter_server_with_one_worker_matches_one_process(self):
    # One worker runs the coordinator's closures in order, on the input
    # stream a one-process run reads: the same 20 steps, so the same
    # weights, weight average and loss to float32 rounding, far from the
    # initial weights.
    root = self.create_tempdir().full_path
    ps_dir, single_dir = (os.path.join(root, name)
                          for name in ("parameter_server", "single"))
    chief, ps, worker = testing.free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{chief}"], "ps": [f"127.0.0.1:{ps}"],
               "worker": [f"127.0.0.1:{worker}"]}
    args = [*TINY[:-1], "--ema_decay=0.5", "--strategy=parameter_server",
            f"--model_dir={ps_dir}"]
    servers = [self._start(args, {"cluster": cluster,
                                  "task": {"type": kind, "index": 0}})
               for kind in ("ps", "worker")]
    coordinator = self._start(args, {"cluster": cluster,
                                     "task": {"type": "chief", "index": 0}})
    single = self._start([*TINY[:-1], "--ema_decay=0.5",
                          f"--model_dir={single_dir}"])
    output, single_output = self._wait(coordinator), self._wait(single)
    for server in servers:
      self.assertIsNone(server.poll())
    self.assertIn("(parameter_server)", output)
    distributed, one = _weights(ps_dir), _weights(single_dir)
    self.assertEqual(sorted(distributed), sorted(one))
    self.assertGreater(len(one), 5)
    self.assertTrue(any(name.startswith(optimization.WEIGHT_AVERAGE)
                        for name in one))
    largest = max(np.max(np.abs(distributed[name] - one[name]))
                  for name in one)
    print(f"largest weight difference, parameter server vs 1: {largest:.3g}")
    for name in one:
      np.testing.assert_allclose(distributed[name], one[name], rtol=RTOL,
                                 atol=ATOL, err_msg=name)
    self.assertAlmostEqual(_last_loss(output), _last_loss(single_output),
                           delta=2e-3 * _last_loss(single_output))
    start = _weights_at_init()
    moved = max(np.max(np.abs(one[name] - start[name])) for name in start)
    self.assertGreater(moved, 100 * ATOL)


def _last_loss(output):
  """The training loss of the last progress line in OUTPUT."""
  return float(re.findall(r"^step \d+/\d+: loss ([-+.\de]+),", output,
                          re.MULTILINE)[-1])


def _weights_at_init():
  """The tiny network's initial weights, named as in the checkpoints."""
  config = configs.from_preset("smoke", width=0.0625, units="1")
  info = tfds_data.dataset_info("synthetic")
  run = run_lib.prepare(config, info, None)
  model = model_lib.build_model(**run.model_arguments())
  optimizer = optimization.build_optimizer(run)
  optimizer.build(model.trainable_variables)
  root = os.path.join(absltest.get_default_test_tmpdir(), "init")
  path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(root)
  reader = tf.train.load_checkpoint(path)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith(("optimizer/_trainable_variables/", "model/"))}


if __name__ == "__main__":
  absltest.main()
