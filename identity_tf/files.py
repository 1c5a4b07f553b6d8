"""Files a user names: checked before the work, written whole.

An output path is checked before the work whose result it will hold
(`check_output_file`, `prepare_output_dir`), written through a temporary
file renamed onto it (`write_atomically`: the project's one atomic writer,
used by config.json, checkpoint digests and state, study reports and every
user-named output; `write_whole` adds the one-line error), and an input array file is checked
against what it claims before numpy allocates (`check_array_file`). Each
refusal is one line (`errors.OutputError`, `errors.DataError`). Pure Python
(numpy is imported when an array file is checked).
"""

import math
import os
import uuid

from identity_tf import errors
from identity_tf import machine


def check_output_file(path, flag):
  """OutputError naming FLAG (as typed) unless PATH can become a file: run
  before the work whose result it will hold. Its name must fit the
  filesystem, and its directory must take a new file (`write_atomically`
  writes one beside it, then renames it): tried with an empty file of the
  temporary name's form, removed at once."""
  if os.path.isdir(path):
    raise errors.OutputError(f"{flag} is a directory; give a file path")
  parent = os.path.dirname(path) or "."
  if not os.path.isdir(parent):
    raise errors.OutputError(f"{flag}: directory {parent} does not exist; "
                             "create it or give another path")
  name = os.path.basename(path)
  longest = _longest_name(parent)
  if len(os.fsencode(name)) > longest:
    raise errors.OutputError(
        f"{flag}: the file name is {len(os.fsencode(name))} bytes long, "
        f"more than the {longest} its filesystem takes; give a shorter name")
  try:
    _probe(path)
  except OSError as e:
    raise errors.OutputError(
        f"{flag}: cannot write into {parent} ({e.strerror}); make it "
        "writable or give another path") from None


def _probe(path):
  """Creates and removes an empty file of the temporary name's form beside
  PATH: OSError where a write there would fail (permissions, a read-only
  or special filesystem, which `os.access` does not always know of)."""
  probe = _temporary_path(path)
  with open(probe, "x"):
    pass
  os.remove(probe)


def prepare_output_dir(path, flag="--output_dir"):
  """PATH, created; OutputError naming FLAG before any work if it cannot be
  (a file there, no permission)."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as error:
    raise errors.OutputError(f"{flag}={path} cannot be created "
                             f"({error.strerror}); give a directory") from None
  try:
    _probe(os.path.join(path, "probe"))
  except OSError as error:
    raise errors.OutputError(f"{flag}={path} is not writable "
                             f"({error.strerror})") from None
  return path


def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def write_atomically(path, write, suffix=""):
  """PATH whole or not at all: WRITE(a temporary path ending in SUFFIX, e.g.
  ".png" for a writer that picks its format by name), then the temporary
  file renamed onto PATH. A crash leaves the old file or the new one, never
  a mix or an empty file. The temporary file is this write's alone (two
  writers never share one) and in PATH's directory (a rename within one
  filesystem is atomic); on a local disk the directory is synced so that
  the rename survives a power cut. PATH may be a URL (gs://...): TensorFlow's
  file system then writes and renames."""
  directory = os.path.dirname(path)
  temporary = _temporary_path(path, suffix)
  url = "://" in path
  try:
    write(temporary)
    if url:
      _gfile().rename(temporary, path, overwrite=True)
    else:
      os.replace(temporary, path)
      _sync_directory(directory or ".")
  finally:
    if (_gfile().exists(temporary) if url else os.path.exists(temporary)):
      (_gfile().remove if url else os.remove)(temporary)


# What a temporary name adds to the destination's: ".<pid>.<12 hex>.tmp"
# and the writer's suffix.
_TEMPORARY_ID_HEX = 12


def _longest_name(directory):
  """The longest file name, in bytes, DIRECTORY's filesystem takes."""
  try:
    return os.pathconf(directory, "PC_NAME_MAX")
  except (OSError, ValueError):
    return 255


def _temporary_path(path, suffix=""):
  """A temporary file's path beside PATH, unique to this write: PATH's name
  (its end cut off where a legal name would otherwise become too long for
  the filesystem), the process id, a random id, ".tmp" and SUFFIX. It
  starts with PATH's name, so that a kill's leftover is recognisably its
  (`checkpoints` reads "ckpt-40.sha256.<pid>.<id>.tmp" as step 40's)."""
  directory, name = os.path.split(path)
  ending = f".{os.getpid()}.{uuid.uuid4().hex[:_TEMPORARY_ID_HEX]}.tmp{suffix}"
  room = (255 if "://" in path else _longest_name(directory or ".")) - len(
      os.fsencode(ending))
  kept = os.fsencode(name)[:max(room, 0)]
  return os.path.join(directory, os.fsdecode(kept) + ending)


def write_text_atomically(path, text):
  """TEXT as the whole of PATH (`write_atomically`), on the disk before its
  name moves."""
  def write(temporary):
    if "://" in temporary:
      with _gfile().GFile(temporary, "w") as f:
        f.write(text)
      return
    with open(temporary, "x") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
  write_atomically(path, write)


def _sync_directory(directory):
  # A filesystem that cannot sync a directory still has the whole file
  # under its name.
  try:
    handle = os.open(directory, os.O_RDONLY)
    try:
      os.fsync(handle)
    finally:
      os.close(handle)
  except OSError:
    pass


def write_whole(path, write, flag, suffix=""):
  """`write_atomically` of a file the user named with FLAG: OutputError
  naming FLAG if it cannot be written."""
  try:
    write_atomically(path, write, suffix)
  except OSError as e:
    raise errors.OutputError(f"cannot write {flag}: {e}") from None


def _npy_claim(f, available):
  """(shape, dtype, bytes claimed, bytes of data present) of the .npy
  stream F (at its start), whose data may take AVAILABLE bytes from there
  on; ValueError if its header is not numpy's."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  start = f.tell()
  version = np.lib.format.read_magic(f)
  reader = {(1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0}.get(version)
  if reader is None:
    raise ValueError(f"unsupported .npy format version {version}")
  shape, _, dtype = reader(f)
  claimed = math.prod(shape) * dtype.itemsize
  return shape, dtype, claimed, available - (f.tell() - start)


def check_array_file(path, name):
  """DataError (one line starting with NAME, how the user named PATH)
  unless every array of the .npy or .npz file PATH holds the data its
  header claims and fits in this machine's memory: refused before numpy
  allocates what a 193-byte file may claim (terabytes). Files that are not
  .npy/.npz are left to the caller."""
  import zipfile  # pylint: disable=g-import-not-at-top
  with open(path, "rb") as f:
    magic = f.read(6)
  arrays = []
  try:
    if magic == b"\x93NUMPY":
      with open(path, "rb") as f:
        arrays.append(("", *_npy_claim(f, os.path.getsize(path))))
    elif magic[:2] == b"PK":
      with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
          if info.filename.endswith(".npy"):
            with archive.open(info) as f:
              arrays.append((info.filename[:-4],
                             *_npy_claim(f, info.file_size)))
  except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
    raise errors.DataError(
        f"{name} is not a readable .npy/.npz file ("
        f"{str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  memory = machine.memory_bytes()
  for key, shape, dtype, claimed, present in arrays:
    what = (f"{name}{f'[{key!r}]' if key else ''} claims a {dtype} array of "
            f"shape {list(shape)} ({claimed} bytes)")
    if dtype.hasobject:
      continue  # Pickled objects: numpy refuses them (allow_pickle=False).
    if memory is not None and claimed > memory:
      raise errors.DataError(f"{what}, more than this machine's {memory} "
                             "bytes of memory; pass a smaller array")
    if claimed > present:
      raise errors.DataError(f"{what} but holds {max(present, 0)} bytes of "
                             "data: it is cut short or not what it says; save "
                             "it again with numpy")
