"""What //bin:serve_client does: ask a model server, print its answers.

The client itself is `serving.client`; this module resolves the paths the
user typed against their directory and prints one line per image.
"""

from identity_tf.commands import cli
from identity_tf.serving import client


def predict_command(server, model_name, paths, *, protocol="rest",
                    signature=None, version=None, timeout=30.0, top_k=5,
                    model_info=None, result=print):
  """Sends the files PATHS (as the user typed them) to MODEL_NAME on SERVER
  (`client.predict`) and gives RESULT one line per
  image: its TOP_K classes with their probabilities, named from the export's
  MODEL_INFO (model_info.json) if given. errors.ServingError on any
  failure."""
  inputs = [client.read_input(cli.resolve_path(path), display_name=path)
            for path in paths]
  names = (client.read_class_names(cli.resolve_path(model_info)) if model_info
           else None)
  for name, probabilities in client.predict(
      server, model_name, inputs, protocol=protocol, signature=signature,
      version=version, timeout=timeout):
    result(client.format_prediction(name, probabilities, top_k, names))
