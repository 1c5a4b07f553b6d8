"""The command layer: what turns the library into processes.

`cli` holds what every binary shares (flags, first steps, errors as one
line and an exit status, the command lines messages suggest); one module
per binary whose orchestration is more than a few lines (`train`, `study`,
`export`, `serve_client`, `benchmark`, `linear_theory`) prints its results
and decides its exit status. bin/*.py import from here; nothing under
identity_tf/ outside this package does (tests/layering_test.py).
"""
