"""What //bin:export does: export a run's checkpoint and say how to serve it.

The export itself is `serving.export`; this module prints what was
exported where, the facts a client needs and the commands that serve and
inspect it (each word quoted as a shell needs it).
"""

import json
import os
import shlex

from identity_tf.commands import cli
from identity_tf.serving import export


def export_command(model_dir, export_dir, *, checkpoint=None, version=None,
                   overwrite=False, note=cli.print_stderr, result=print):
  """What //bin:export does: `export.export_run`, then RESULT receives what was
  exported where, the facts a client needs (JSON) and the commands that
  serve and inspect it; NOTE the checkpoints skipped as damaged."""
  version, path, info = export.export_run(
      model_dir, export_dir, checkpoint=checkpoint, version=version,
      overwrite=overwrite, echo=lambda line: note(f"note: {line}; skipped"))
  result(f"exported step {info['step']} of {model_dir} as version {version}: "
         f"{path}")
  result(json.dumps({"classes": info["classes"]["count"],
                     "input": info["input"], "preset": info["preset"]}))
  stale = export.stale_temporary_dirs(export_dir)
  if stale:
    result(f"note: {len(stale)} unfinished export(s) left by killed runs "
           f"(ignored by TF Serving; safe to delete): {', '.join(stale)}")
  name = os.path.basename(os.path.normpath(export_dir))
  result(f"serve:   tensorflow_model_server --port=8500 --rest_api_port=8501 "
         f"{shlex.quote(f'--model_name={name}')} "
         f"{shlex.quote(f'--model_base_path={export_dir}')}")
  result(f"inspect: saved_model_cli show --dir {shlex.quote(path)} --all")
