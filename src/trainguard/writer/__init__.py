"""The step writer: how a hook's tensors become event files and indexes, as its own layer under
the hooks (it imports nothing from ``trainguard.hooks``).

- ``thread``: the writer thread in the training process (:class:`~trainguard.writer.thread.StepWriter`)
  and the base both writers share;
- ``process``: the writer process fed through shared memory (training side), ``spawn``: starting
  it and its ring, possibly ahead of the first save; ``child``: the writer process itself;
- ``opening``: which writer a hook gets, and the writer process started ahead for it;
- ``ring``: the shared-memory ring's layout, the one place both sides read it from;
- ``step_file``: one worker's steps as event files and indexes (used by both writers);
- ``kinds``: the writer names a configuration may give, checked without loading the writers.

Nothing is imported here: the writer process and a configuration check import only the modules
they need (numpy and protobuf load with ``step_file``).
"""

__all__: list[str] = []
