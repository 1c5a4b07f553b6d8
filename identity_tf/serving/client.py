"""A client of TF Serving's Predict API (REST and gRPC) for exported models.

`identity_tf.serving.export` writes SavedModels with two signatures, both taking one
input named "images" and returning "probabilities" [batch, classes] float32
and "classes" [batch] int64:

* `serving_default`: float32 raw 0-255 pixels [batch, H, W, 3];
* `predict_images`: a batch of encoded JPEG or PNG files (strings).

This module builds the requests a TF Serving server understands and parses
its answers:

* REST, TF Serving's documented `POST /v1/models/NAME[/versions/N]:predict`
  with a JSON body in the "row" format: {"signature_name": ..., "instances":
  [...]}, where each instance is one image -- nested lists of pixel values,
  or {"b64": "<base64 of the file>"} for `predict_images` (TF Serving decodes
  "b64" objects into the bytes of a string tensor). The answer is
  {"predictions": [{"probabilities": [...], "classes": k}, ...]} or
  {"error": "..."}.
* gRPC, `tensorflow.serving.PredictionService/Predict` with a
  `PredictRequest` from the tensorflow-serving-api protos, its TensorProtos
  made and read by `tf.make_tensor_proto` and `tf.make_ndarray`.

Every failure a user can cause -- a file that is neither an image nor a
.npy array, an unreachable server, an unknown model, a request the model
rejects -- raises `errors.ServingError` (a ValueError) with one line naming the
problem and the fix. Nothing here runs TensorFlow ops.
"""

import base64
import http.client
import json
import re
import socket
import threading
import urllib.parse

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from identity_tf import errors
from identity_tf import files
from identity_tf.serving.contract import CLASSES_KEY
from identity_tf.serving.contract import DEFAULT_SIGNATURE
from identity_tf.serving.contract import IMAGES_SIGNATURE
from identity_tf.serving.contract import INPUT_KEY
from identity_tf.serving.contract import MAX_GIF_BLOCKS
from identity_tf.serving.contract import MAX_IMAGE_PIXELS
from identity_tf.serving.contract import PROBABILITIES_KEY
from identity_tf.serving.contract import SIGNATURES

PROTOCOLS = ("rest", "grpc")

# Leading bytes of the encoded formats `predict_images` decodes
# (tf.io.decode_image: JPEG, PNG, GIF, BMP).
_IMAGE_MAGIC = {
    b"\xff\xd8\xff": "JPEG",
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
}
_NPY_MAGIC = b"\x93NUMPY"

# An element index in the model's error messages ("images[3] is ...").
_ELEMENT = re.compile(r"images\[(\d+)\]")
# The text of a failed tf.debugging.Assert in a TensorFlow error message.
_ASSERTION = re.compile(r"assertion failed: \[(.*)\]\s*$", re.MULTILINE)
# Lines of TensorFlow error messages that only locate the failing op.
_LOCATION_LINES = ("[[", "Detected at node", "<stack traces",
                   "Graph execution error")


# ---------------------------------------------------------------------------
# Inputs.

class Input:
  """One argument of the client: an encoded image file or a .npy batch.

  Attributes:
    path: the file as the user named it.
    kind: "image" or "array".
    data: the file's bytes (image) or float32 [batch, H, W, 3] (array).
    names: one display name per image ("cat.png", "batch.npy[3]").
  """

  def __init__(self, path, kind, data, names):
    self.path = path
    self.kind = kind
    self.data = data
    self.names = names


def image_format(data):
  """"JPEG", "PNG", "GIF" or "BMP" if DATA starts like one, else None."""
  for magic, name in _IMAGE_MAGIC.items():
    if data.startswith(magic):
      return name
  return None


def _jpeg_size(data):
  """(height, width) of JPEG DATA's first frame header (SOFn), or None if
  its markers end before one."""
  position = 2
  while position + 4 <= len(data):
    if data[position] != 0xFF:
      return None
    marker = data[position + 1]
    if marker == 0xFF:  # Fill byte.
      position += 1
      continue
    if marker in (0x01, *range(0xD0, 0xD9)):  # No length follows.
      position += 2
      continue
    length = int.from_bytes(data[position + 2:position + 4], "big")
    if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB,
                  0xCD, 0xCE, 0xCF):
      frame = data[position + 5:position + 9]
      if len(frame) < 4:
        return None
      return (int.from_bytes(frame[:2], "big"),
              int.from_bytes(frame[2:], "big"))
    if marker == 0xDA or length < 2:  # Scan data: no frame header before.
      return None
    position += 2 + length
  return None


def gif_extent(data):
  """(height, width, pixels, complete) of GIF DATA as the model's
  `predict_images` reads it (`serving.export.gif_extent`, which says why):
  the bound of its screen and frames, the pixels of all its frames, and
  whether its blocks end within `MAX_GIF_BLOCKS`."""
  def u16(at):
    return int.from_bytes(data[at:at + 2].ljust(2, b"\0"), "little")

  def table(flags):  # The colour table after a descriptor, in bytes.
    return 3 << ((flags & 7) + 1) if flags & 0x80 else 0

  def byte(at):
    return data[at] if at < len(data) else 0

  height, width, pixels = u16(8), u16(6), 0
  position = 13 + table(byte(10))
  for _ in range(MAX_GIF_BLOCKS):
    value = byte(position)
    if position >= len(data) or value not in (0x21, 0x2C):
      return height, width, pixels, True
    if value == 0x2C:  # An image descriptor, its colour table, its data.
      height = max(height, u16(position + 3) + u16(position + 7))
      width = max(width, u16(position + 1) + u16(position + 5))
      pixels += u16(position + 5) * u16(position + 7)
      position += 11 + table(byte(position + 9))
    else:  # An extension's introducer and label, then its data.
      position += 2
    # Data sub-blocks: each its size, then that many bytes; 0 ends them.
    while position < len(data) and data[position]:
      position += 1 + data[position]
    position += 1
  return height, width, pixels, False


def declared_size(data):
  """(height, width) the image file DATA declares in its headers (JPEG's
  frame header, PNG's IHDR, the bound of a GIF's screen and frames, BMP's
  info header), as the model's `predict_images` reads it; None if it
  declares none."""
  kind = image_format(data)
  head = data[:32].ljust(32, b"\0")
  if kind == "PNG" and head[12:16] == b"IHDR":
    return (int.from_bytes(head[20:24], "big"),
            int.from_bytes(head[16:20], "big"))
  if kind == "GIF":
    return gif_extent(data)[:2]
  if kind == "BMP":
    return (abs(int.from_bytes(head[22:26], "little", signed=True)),
            abs(int.from_bytes(head[18:22], "little", signed=True)))
  if kind == "JPEG":
    return _jpeg_size(data)
  return None


def read_input(path, display_name=None):
  """The `Input` of file PATH; ServingError if it is neither image nor .npy."""
  name = display_name or path
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise errors.ServingError(f"cannot read {name}: {e.strerror}") from None
  if data.startswith(_NPY_MAGIC):
    try:
      files.check_array_file(path, name)  # Before numpy allocates anything.
    except ValueError as e:
      raise errors.ServingError(str(e)) from None
    try:
      array = np.load(path, allow_pickle=False)
    except ValueError as e:
      raise errors.ServingError(
          f"{name} is not a readable .npy array ({e})") from None
    if array.ndim not in (3, 4) or array.shape[-1] != 3 or not (
        np.issubdtype(array.dtype, np.number)):
      raise errors.ServingError(
          f"{name} holds a {array.dtype} array of shape {list(array.shape)}; "
          f"expected raw 0-255 RGB pixels [H, W, 3] or [batch, H, W, 3]")
    if array.ndim == 3:
      array = array[np.newaxis]
    if array.shape[0] == 0:
      raise errors.ServingError(
          f"{name} holds an empty batch; pass at least one "
          f"image")
    names = [f"{name}[{i}]" for i in range(array.shape[0])]
    return Input(name, "array", array.astype(np.float32), names)
  kind = image_format(data)
  if kind is None:
    raise errors.ServingError(
        f"{name} is neither a JPEG/PNG image nor a .npy array; pass image "
        f"files or .npy arrays of raw 0-255 pixels")
  # A GIF's blocks are walked once, for its size and its frames' pixels.
  extent = gif_extent(data) if kind == "GIF" else None
  size = extent[:2] if extent else declared_size(data)
  if size is not None and (max(size) > MAX_IMAGE_PIXELS or
                           size[0] * size[1] > MAX_IMAGE_PIXELS):
    # The model refuses it too, before decoding; not sent at all.
    raise errors.ServingError(
        f"{name} is {size[1]}x{size[0]} pixels (its header says so), more "
        f"than the {MAX_IMAGE_PIXELS} the served model decodes: resize it "
        "first")
  if extent:
    _, _, pixels, complete = extent
    if not complete or pixels > MAX_IMAGE_PIXELS:
      raise errors.ServingError(
          f"{name} is a GIF of more than {MAX_GIF_BLOCKS} blocks or "
          f"{MAX_IMAGE_PIXELS} pixels in all its frames, more than the "
          "served model decodes: send its first frame alone")
  return Input(name, "image", data, [name])


def choose_signature(inputs, signature=None):
  """SIGNATURE, or the one the INPUTS need; ServingError if they do not fit.

  Image files go to `predict_images` (the server decodes them), arrays to
  `serving_default`.
  """
  kinds = {item.kind for item in inputs}
  if signature is None:
    if kinds == {"image", "array"}:
      raise errors.ServingError(
          "image files and .npy arrays need different signatures; pass them "
          "in separate commands (or convert the images to .npy)")
    return IMAGES_SIGNATURE if kinds == {"image"} else DEFAULT_SIGNATURE
  if signature not in SIGNATURES:
    raise errors.ServingError(f"unknown --signature={signature}; valid: "
                              f"{', '.join(SIGNATURES)}")
  wanted = "image" if signature == IMAGES_SIGNATURE else "array"
  for item in inputs:
    if item.kind != wanted:
      what = ("encoded JPEG/PNG files" if wanted == "image"
              else ".npy arrays of raw 0-255 pixels")
      raise errors.ServingError(
          f"{item.path}: --signature={signature} takes {what}; omit "
          f"--signature to pick the one that fits")
  return signature


def request_batches(inputs, signature):
  """The batches to send: [(inputs, batch)], batch an array or a list of bytes.

  All images go in one `predict_images` request; each .npy array is its own
  `serving_default` request (arrays of different sizes cannot share one).
  """
  if signature == IMAGES_SIGNATURE:
    return [(list(inputs), [item.data for item in inputs])]
  return [([item], item.data) for item in inputs]


# ---------------------------------------------------------------------------
# REST.

def rest_url(server, model_name, version=None):
  """http://SERVER/v1/models/NAME[/versions/N]:predict, TF Serving's URL."""
  path = f"/v1/models/{urllib.parse.quote(model_name, safe='')}"
  if version is not None:
    path += f"/versions/{int(version)}"
  return f"http://{server}{path}:predict"


def rest_body(signature, batch):
  """The JSON request (row format) of BATCH: an array or encoded files."""
  if signature == IMAGES_SIGNATURE:
    instances = [{"b64": base64.b64encode(data).decode("ascii")}
                 for data in batch]
  else:
    instances = np.asarray(batch, np.float32).tolist()
  return {"signature_name": signature, "instances": instances}


def parse_rest_response(body):
  """(probabilities [n, classes] float32, classes [n] int64) of an answer."""
  predictions = body.get("predictions") if isinstance(body, dict) else None
  if not isinstance(predictions, list):
    raise errors.ServingError(f"the server's answer has no 'predictions' list: "
                              f"{str(body)[:200]}")
  try:
    probabilities = np.array([row[PROBABILITIES_KEY] for row in predictions],
                             np.float32)
    classes = np.array([row[CLASSES_KEY] for row in predictions], np.int64)
  except (KeyError, TypeError, ValueError):
    raise errors.ServingError(
        f"the server's predictions lack '{PROBABILITIES_KEY}' and "
        f"'{CLASSES_KEY}': is the model an identity_tf export?") from None
  return probabilities.reshape(len(predictions), -1), classes


def condense_error(message):
  """One line of a server's (often multi-line) TensorFlow error MESSAGE.

  The text of a failed assertion if there is one (the model's own message,
  e.g. "images[2] is not a decodable JPEG, PNG, GIF or BMP image ..."),
  else the lines that are not just the location of the failing op.
  """
  match = _ASSERTION.search(message)
  if match:
    return match.group(1)
  lines = [line.strip() for line in message.splitlines()]
  kept = [line for line in lines
          if line and not line.startswith(_LOCATION_LINES)]
  return " ".join(kept)[:500]


def _error_text(raw):
  try:
    text = str(json.loads(raw)["error"])
  except (ValueError, KeyError, TypeError, RecursionError):
    text = raw.decode("utf-8", "replace")
  return condense_error(text)


# The most bytes an answer may have: what the probabilities of a batch of
# images can take (a float written out in JSON takes about 25 bytes; 256 KiB
# per image are 10,000 classes), and at least 1 MiB. A larger answer is not
# one of an identity_tf export, and is not read into memory.
ANSWER_BYTES_PER_IMAGE = 1 << 18
MIN_ANSWER_BYTES = 1 << 20
_CHUNK = 1 << 16


def answer_limit(num_images):
  """The most bytes the answer for NUM_IMAGES images may take."""
  return max(MIN_ANSWER_BYTES, ANSWER_BYTES_PER_IMAGE * max(num_images, 1))


def _too_large(server, limit, what):
  return errors.ServingError(
      f"{server}'s answer is larger than {limit} bytes ({what}), far more "
      "than the probabilities of the images sent; is --server TF Serving "
      "serving an identity_tf export?")


def _read_capped(response, server, limit):
  """RESPONSE's body (an http.client.HTTPResponse), at most LIMIT bytes,
  read a chunk at a time; ServingError past LIMIT."""
  declared = response.getheader("Content-Length")
  if declared and declared.isdigit() and int(declared) > limit:
    raise _too_large(server, limit, f"it announces {declared}")
  chunks, size = [], 0
  while chunk := response.read1(_CHUNK):
    size += len(chunk)
    if size > limit:
      raise _too_large(server, limit, "it kept coming")
    chunks.append(chunk)
  return b"".join(chunks)


def rest_predict(server, model_name, signature, batch, version=None,
                 timeout=30.0):
  """Sends BATCH to SERVER over REST; returns (probabilities, classes).

  TIMEOUT (seconds) bounds the whole request, from connecting to the last
  byte of the answer: a server that answers a byte at a time is stopped
  there too (a timer shuts the connection down). The answer is read in
  chunks up to `answer_limit` bytes.
  """
  url = urllib.parse.urlsplit(rest_url(server, model_name, version))
  data = json.dumps(rest_body(signature, batch)).encode("utf-8")
  limit = answer_limit(len(batch))
  connection = http.client.HTTPConnection(url.hostname, url.port or 80,
                                          timeout=timeout)
  expired = threading.Event()

  def expire():
    expired.set()
    if connection.sock is not None:
      try:
        connection.sock.shutdown(socket.SHUT_RDWR)
      except OSError:
        pass

  timer = threading.Timer(timeout, expire)
  timer.daemon = True
  timer.start()
  try:
    connection.request("POST", url.path, body=data,
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    raw = _read_capped(response, server, limit)
    status = response.status
  except (http.client.HTTPException, OSError) as e:
    if expired.is_set() or isinstance(e, (socket.timeout, TimeoutError)):
      raise errors.ServingError(
          f"no complete answer from {server} within {timeout:g} s (--timeout "
          f"bounds the whole request); is the server overloaded? (raise "
          f"--timeout)") from None
    raise errors.ServingError(
        f"cannot reach TF Serving's REST API at {server} ({e}); start "
        f"tensorflow_model_server with --rest_api_port, or check --server"
    ) from None
  finally:
    timer.cancel()
    connection.close()
  if expired.is_set():  # The timer fired as the last byte came.
    raise errors.ServingError(
        f"no complete answer from {server} within {timeout:g} s (--timeout "
        f"bounds the whole request); is the server overloaded? (raise "
        f"--timeout)")
  if status != 200:
    message = _error_text(raw)
    if status == 404:
      raise _unknown_model(server, model_name, version, message)
    raise errors.ServingError(
        f"the server refused the request (HTTP {status}): "
        f"{message}")
  try:
    body = json.loads(raw)
  except ValueError:
    raise errors.ServingError(f"{server} did not answer with JSON: is it TF "
                              f"Serving's REST port?") from None
  except RecursionError:  # Nested thousands deep: no answer of TF Serving.
    raise errors.ServingError(
        f"{server} answered JSON nested too deeply to read: is it TF "
        "Serving's REST port, serving an identity_tf export?") from None
  return parse_rest_response(body)


def _unknown_model(server, model_name, version, message):
  what = f"model {model_name!r}" + (
      f" version {version}" if version is not None else "")
  return errors.ServingError(
      f"{server} does not serve {what} ({message}); check --model_name "
      f"(tensorflow_model_server's --model_name) and --model_version")


# ---------------------------------------------------------------------------
# gRPC.

def tensor_proto(batch):
  """A TensorProto of BATCH: array -> DT_FLOAT, list of bytes -> DT_STRING."""
  if isinstance(batch, np.ndarray):
    return tf.make_tensor_proto(batch.astype(np.float32))
  return tf.make_tensor_proto(list(batch), dtype=tf.string)


def tensor_value(proto):
  """The numpy array of a numeric TensorProto."""
  if proto.dtype not in (tf.float32.as_datatype_enum,
                         tf.float64.as_datatype_enum,
                         tf.int32.as_datatype_enum,
                         tf.int64.as_datatype_enum):
    raise errors.ServingError(
        f"unexpected tensor dtype {proto.dtype} in the answer")
  return tf.make_ndarray(proto)


def grpc_request(model_name, signature, batch, version=None):
  """The `PredictRequest` of BATCH for SIGNATURE of MODEL_NAME [VERSION]."""
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model_name
  request.model_spec.signature_name = signature
  if version is not None:
    request.model_spec.version.value = int(version)
  request.inputs[INPUT_KEY].CopyFrom(tensor_proto(batch))
  request.output_filter.extend([PROBABILITIES_KEY, CLASSES_KEY])
  return request


def parse_grpc_response(response):
  """(probabilities, classes) of a `PredictResponse`."""
  for key in (PROBABILITIES_KEY, CLASSES_KEY):
    if key not in response.outputs:
      raise errors.ServingError(
          f"the server's answer lacks '{key}' (it has "
          f"{', '.join(sorted(response.outputs)) or 'no outputs'}): is the "
          f"model an identity_tf export?")
  probabilities = tensor_value(response.outputs[PROBABILITIES_KEY])
  classes = tensor_value(response.outputs[CLASSES_KEY]).astype(np.int64)
  return probabilities.astype(np.float32), classes


def grpc_predict(server, model_name, signature, batch, version=None,
                 timeout=30.0):
  """Sends BATCH to SERVER over gRPC; returns (probabilities, classes)."""
  request = grpc_request(model_name, signature, batch, version)
  # Requests of big images exceed gRPC's default 4 MiB limit; the answer
  # is bounded as REST's is (`answer_limit`). TIMEOUT is gRPC's deadline:
  # it bounds the whole call.
  limit = answer_limit(len(batch))
  options = [("grpc.max_send_message_length", -1),
             ("grpc.max_receive_message_length", limit)]
  with grpc.insecure_channel(server, options=options) as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
      response = stub.Predict(request, timeout=timeout)
    except grpc.RpcError as e:
      code, details = e.code(), condense_error(e.details() or "")
      if code == grpc.StatusCode.UNAVAILABLE:
        raise errors.ServingError(
            f"cannot reach TF Serving's gRPC API at {server} "
            f"({details or code.name}); start "
            f"tensorflow_model_server with --port, or check --server"
        ) from None
      if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        raise errors.ServingError(
            f"no answer from {server} within {timeout:g} s; is it a gRPC "
            f"port, and not overloaded? (raise --timeout)") from None
      if code == grpc.StatusCode.NOT_FOUND:
        raise _unknown_model(server, model_name, version, details) from None
      if (code == grpc.StatusCode.RESOURCE_EXHAUSTED and
          "larger than max" in details):
        raise _too_large(server, limit, details) from None
      raise errors.ServingError(
          f"the server refused the request ({code.name}): "
          f"{details}") from None
  return parse_grpc_response(response)


# ---------------------------------------------------------------------------
# Putting it together.

def name_element(message, names):
  """MESSAGE with "(images[i] is FILE)" appended where it names an element."""
  match = _ELEMENT.search(message)
  if match and int(match.group(1)) < len(names):
    index = int(match.group(1))
    return f"{message} (images[{index}] is {names[index]})"
  return message


def predict(server, model_name, inputs, *, protocol="rest", signature=None,
            version=None, timeout=30.0):
  """Sends INPUTS; returns [(display name, probabilities [classes])].

  ServingError on any failure; when the model rejects one element, the
  message names its file.
  """
  if protocol not in PROTOCOLS:
    raise errors.ServingError(f"unknown --protocol={protocol}; valid: "
                              f"{', '.join(PROTOCOLS)}")
  if not inputs:
    raise errors.ServingError("no inputs: pass image files or .npy arrays")
  signature = choose_signature(inputs, signature)
  send = rest_predict if protocol == "rest" else grpc_predict
  results = []
  for items, batch in request_batches(inputs, signature):
    names = [name for item in items for name in item.names]
    try:
      probabilities, classes = send(server, model_name, signature, batch,
                                    version=version, timeout=timeout)
    except errors.ServingError as e:
      raise errors.ServingError(name_element(str(e), names)) from None
    if len(probabilities) != len(names):
      raise errors.ServingError(f"sent {len(names)} images but got "
                                f"{len(probabilities)} predictions back")
    _check_probabilities(server, probabilities, names)
    del classes  # The top-k below starts with it.
    results.extend(zip(names, probabilities))
  return results


def _check_probabilities(server, probabilities, names):
  """ServingError (one line naming the image) unless each row of
  PROBABILITIES is a distribution: at least one class, every value finite
  and in [0, 1], summing to 1 within float32 rounding. A server that
  answers otherwise is not serving an identity_tf export as exported (or
  the model diverged), and its numbers are no answer."""
  probabilities = np.asarray(probabilities, np.float64)
  if probabilities.ndim != 2 or probabilities.shape[1] == 0:
    raise errors.ServingError(
        f"{server} answered no class probabilities for {names[0]}; is the "
        "served model an identity_tf export?")
  for name, row in zip(names, probabilities):
    if not np.all(np.isfinite(row)):
      raise errors.ServingError(
          f"{server} answered NaN or infinite probabilities for {name}: the "
          "served model's weights are not finite (a diverged run?); export a "
          "finite checkpoint")
    if np.any(row < 0) or np.any(row > 1) or abs(row.sum() - 1) > 2e-2:
      raise errors.ServingError(
          f"{server} answered values for {name} that are not probabilities "
          f"(they sum to {row.sum():.6g}); is the served model an "
          "identity_tf export?")


def top_k(probabilities, k):
  """[(class, probability)] of the K most probable classes, best first."""
  order = np.argsort(-probabilities, kind="stable")[:k]
  return [(int(c), float(probabilities[c])) for c in order]


def read_class_names(model_info_path):
  """The class names in a model_info.json, or None if it has none."""
  try:
    with open(model_info_path, "rb") as f:
      info = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.ServingError(f"cannot read --model_info={model_info_path}: "
                              f"{e}") from None
  except RecursionError:
    info = None  # Nested too deeply: not an export's, said below.
  classes = info.get("classes", {}) if isinstance(info, dict) else None
  names = classes.get("names") if isinstance(classes, dict) else None
  if not isinstance(classes, dict) or not (
      names is None or (isinstance(names, list) and
                        all(isinstance(n, str) for n in names))):
    raise errors.ServingError(
        f"--model_info={model_info_path} is not an export's model_info.json "
        '(an object whose "classes" has a list of "names"); pass the '
        "model_info.json of the served version, or omit --model_info")
  return names


def format_prediction(name, probabilities, k, class_names=None):
  """One line: NAME: the top-K classes with their probabilities."""
  parts = []
  for label, p in top_k(probabilities, k):
    text = f"{label}"
    if class_names and label < len(class_names):
      text += f" ({class_names[label]})"
    parts.append(f"{text} {p:.4f}")
  return f"{name}: " + ", ".join(parts)
