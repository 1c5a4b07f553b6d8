"""The suite runs as on a fresh machine: no home directory, no network.

`.bazelrc` gives every test HOME=/nonexistent-home, which Bazel's sandbox
cannot create (it mounts / read-only), and a network namespace with loopback
only (--sandbox_default_allow_network=false). Every other test then fails
if the code under test reaches for a cache in the home directory (as
`tfds.list_builders()` does) or for the internet. This test checks that those
conditions really hold, so that they cannot silently stop holding -- e.g.
under a Bazel that runs tests unsandboxed. Outside Bazel it is skipped.
"""

import errno
import os
import shutil
import socket
import unittest

from absl.testing import absltest


def _under_bazel():
  return bool(os.environ.get("TEST_SRCDIR"))


@unittest.skipUnless(_under_bazel(), "checks the conditions `bazel test` "
                     "sets up (.bazelrc); run it with ./bazelw test")
class FreshMachineTest(absltest.TestCase):

  def test_home_is_absent_and_cannot_be_created(self):
    home = os.path.expanduser("~")
    self.assertEqual(home, os.environ["HOME"])
    self.assertFalse(os.path.exists(home),
                     f"HOME={home} exists; .bazelrc should point tests at a "
                     "directory that does not")
    cache = os.path.join(home, ".cache", "probe")
    try:
      os.makedirs(cache)
    except OSError:
      return  # As on a fresh machine whose home nothing may write.
    shutil.rmtree(home)  # Leave no trace of the probe.
    self.fail(f"a test could create {cache}: tests must run in Bazel's "
              "linux-sandbox, which mounts / read-only")

  def test_no_network_but_loopback(self):
    interfaces = sorted(name for _, name in socket.if_nameindex())
    self.assertEqual(interfaces, ["lo"],
                     "tests see network interfaces other than loopback: "
                     "--sandbox_default_allow_network=false is not in effect")
    # No route anywhere: connecting fails at once instead of timing out.
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.settimeout(10)
    with self.assertRaises(OSError) as caught:
      probe.connect(("192.0.2.1", 443))  # TEST-NET-1 (RFC 5737).
    probe.close()
    self.assertEqual(caught.exception.errno, errno.ENETUNREACH)

  def test_loopback_works(self):
    # The distributed and serving tests talk over 127.0.0.1.
    with socket.create_server(("127.0.0.1", 0)) as server:
      port = server.getsockname()[1]
      with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        connection, _ = server.accept()
        with connection:
          client.sendall(b"ok")
          self.assertEqual(connection.recv(2), b"ok")


if __name__ == "__main__":
  absltest.main()
