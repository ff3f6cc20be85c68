"""The writers a hook can use (``writer=`` or ``TRAINGUARD_WRITER``); here rather than in the
writers' own modules so that a configuration is checked without loading them (numpy, protobuf).

- ``process``: a writer process fed through shared memory; serialising, reducing and writing
  run off the training process's interpreter;
- ``thread``: a writer thread in the training process (kept where the process cannot run, and
  for tensors on a device, whose copies are waited for off the training thread);
- ``auto``: ``process`` where it can run, ``thread`` otherwise.
"""

from __future__ import annotations

WRITER_KINDS = ("auto", "thread", "process")
