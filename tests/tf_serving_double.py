"""A test double of TF Serving's Predict API, for the export and client tests.

No `tensorflow_model_server` binary is obtainable here; `TfServingTestDouble`
answers the same REST and gRPC requests from the exported SavedModels on
127.0.0.1 so that the client's requests and the exports' signatures can be
checked end to end. It is a double, named as such: docs/serving.md has the
commands for the real server.
"""

import base64
import concurrent.futures
import http.server
import json
import os
import re
import threading

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc


class _Status(Exception):
  """A failed request: a gRPC status code name and TF Serving-like message."""

  def __init__(self, code, message):
    super().__init__(message)
    self.code = code
    self.message = message


_HTTP_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400,
                "RESOURCE_EXHAUSTED": 503}


class TfServingTestDouble:
  """A TEST DOUBLE of TF Serving's Predict API -- not TF Serving.

  Serves BASE_DIR's integer-named versions (loaded with tf.saved_model.load,
  hidden directories ignored, as TF Serving does) under MODEL_NAME on
  127.0.0.1:
  * REST: POST /v1/models/NAME[/versions/N]:predict with a row-format JSON
    body ({"signature_name", "instances"}, {"b64": ...} for string inputs);
    answers {"predictions": [{output: value}, ...]} or {"error": ...} with
    HTTP 404 (unknown model/version) or 400 (bad request);
  * gRPC: tensorflow.serving.PredictionService/Predict.
  Inputs are checked against the signature's names, dtypes and shapes, then
  the signature runs; its InvalidArgumentErrors become INVALID_ARGUMENT.
  Every request and body is recorded. At most MAX_REQUESTS are answered.
  """

  MAX_REQUESTS = 100
  TIMEOUT = 60

  def __init__(self, base_dir, model_name):
    self.model_name = model_name
    self.versions = {
        int(name): tf.saved_model.load(os.path.join(base_dir, name))
        for name in os.listdir(base_dir) if name.isdigit()}
    self.rest_requests = []  # (path, parsed JSON body)
    self.grpc_requests = []  # PredictRequest
    self._count = 0
    self._lock = threading.Lock()

    double = self

    class RestHandler(http.server.BaseHTTPRequestHandler):
      timeout = self.TIMEOUT

      def do_POST(self):  # pylint: disable=invalid-name
        length = int(self.headers.get("Content-Length", 0))
        status, body = double.handle_rest(self.path, self.rfile.read(length))
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def log_message(self, *args):
        del args

    self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RestHandler)
    self._http.daemon_threads = True
    self.rest_address = f"127.0.0.1:{self._http.server_address[1]}"
    self._http_thread = threading.Thread(target=self._http.serve_forever,
                                         daemon=True)
    self._http_thread.start()

    class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):

      def Predict(self, request, context):  # pylint: disable=invalid-name
        return double.handle_grpc(request, context)

    self._grpc = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=2),
        maximum_concurrent_rpcs=4)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        Servicer(), self._grpc)
    port = self._grpc.add_insecure_port("127.0.0.1:0")
    self.grpc_address = f"127.0.0.1:{port}"
    self._grpc.start()

  def close(self):
    self._http.shutdown()
    self._http.server_close()
    self._grpc.stop(grace=None).wait(10)

  def predict(self, model_name, version, signature_name, inputs):
    """{output: array} of the request, or raises _Status."""
    with self._lock:
      self._count += 1
      if self._count > self.MAX_REQUESTS:
        raise _Status("RESOURCE_EXHAUSTED", "test double request limit")
    if model_name != self.model_name or (
        version is not None and version not in self.versions):
      spec = (f"Specific({model_name}, {version})" if version is not None
              else f"Latest({model_name})")
      raise _Status("NOT_FOUND", f"Servable not found for request: {spec}")
    loaded = self.versions[version or max(self.versions)]
    if signature_name not in loaded.signatures:
      raise _Status("INVALID_ARGUMENT",
                    f"Serving signature key \"{signature_name}\" not found.")
    function = loaded.signatures[signature_name]
    specs = function.structured_input_signature[1]
    if set(inputs) != set(specs):
      raise _Status("INVALID_ARGUMENT",
                    f"inputs {sorted(inputs)} != signature's {sorted(specs)}")
    for name, value in inputs.items():
      spec = specs[name]
      if value.dtype != spec.dtype:
        raise _Status("INVALID_ARGUMENT",
                      f"Expects arg {name} to be {spec.dtype.name} but "
                      f"{value.dtype.name} is provided")
      if not spec.shape.is_compatible_with(value.shape):
        raise _Status("INVALID_ARGUMENT",
                      f"{name}: shape {value.shape} is not compatible with "
                      f"the signature's {spec.shape}")
    try:
      outputs = function(**inputs)
    except tf.errors.InvalidArgumentError as e:
      raise _Status("INVALID_ARGUMENT", e.message) from None
    return {name: tensor.numpy() for name, tensor in outputs.items()}

  def _spec(self, model_name, version, signature_name):
    loaded = self.versions.get(version or max(self.versions))
    if model_name != self.model_name or loaded is None or (
        signature_name not in loaded.signatures):
      return None
    return loaded.signatures[signature_name].structured_input_signature[1]

  def handle_rest(self, path, raw):
    """(HTTP status, JSON body) of a REST request."""
    try:
      match = re.fullmatch(
          r"/v1/models/([^/:]+)(?:/versions/(\d+))?:predict", path)
      if not match:
        raise _Status("NOT_FOUND", f"Malformed request: POST {path}")
      model_name = match.group(1)
      version = int(match.group(2)) if match.group(2) else None
      try:
        body = json.loads(raw)
      except ValueError as e:
        raise _Status("INVALID_ARGUMENT", f"JSON Parse error: {e}") from None
      self.rest_requests.append((path, body))
      signature_name = body.get("signature_name", "serving_default")
      if "instances" not in body:
        raise _Status("INVALID_ARGUMENT",
                      "Missing 'instances' key")
      specs = self._spec(model_name, version, signature_name)
      if specs is None:  # predict() reports which part is unknown.
        self.predict(model_name, version, signature_name, {})
      (name, spec), = specs.items()  # One input: rows are its values.
      rows = body["instances"]
      if spec.dtype == tf.string:
        if not all(isinstance(row, dict) and set(row) == {"b64"}
                   for row in rows):
          raise _Status("INVALID_ARGUMENT",
                        "string tensors must be sent as {\"b64\": ...}")
        value = tf.constant([base64.b64decode(row["b64"]) for row in rows],
                            tf.string)
      else:
        try:
          value = tf.constant(np.array(rows, spec.dtype.as_numpy_dtype))
        except (ValueError, TypeError) as e:
          raise _Status("INVALID_ARGUMENT", f"bad instances: {e}") from None
      outputs = self.predict(model_name, version, signature_name,
                             {name: value})
      count = len(next(iter(outputs.values())))
      predictions = [{key: array[i].tolist() for key, array in outputs.items()}
                     for i in range(count)]
      return 200, {"predictions": predictions}
    except _Status as e:
      return _HTTP_STATUS.get(e.code, 500), {"error": e.message}

  def handle_grpc(self, request, context):
    self.grpc_requests.append(predict_pb2.PredictRequest.FromString(
        request.SerializeToString()))
    version = (request.model_spec.version.value
               if request.model_spec.HasField("version") else None)
    try:
      inputs = {name: tf.constant(tf.make_ndarray(proto)) for name, proto in
                request.inputs.items()}
      outputs = self.predict(request.model_spec.name, version,
                             request.model_spec.signature_name or
                             "serving_default", inputs)
    except _Status as e:
      context.abort(getattr(grpc.StatusCode, e.code), e.message)
    response = predict_pb2.PredictResponse()
    response.model_spec.CopyFrom(request.model_spec)
    for name, array in outputs.items():
      if not request.output_filter or name in request.output_filter:
        response.outputs[name].CopyFrom(tf.make_tensor_proto(array))
    return response
