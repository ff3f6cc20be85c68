"""Started by ``trainguard run`` through PYTHONPATH: arm the zero-code hook in this process.

Torch is not imported here (a script may never use it, and importing it costs seconds); the
hook is installed the moment the script itself imports torch. Any failure is logged and the
script runs untouched: trainguard must never stop a training job from starting.
"""

from __future__ import annotations


def _arm() -> None:
    try:
        from trainguard.zero_code import arm_from_environment

        arm_from_environment()
    except Exception as error:  # noqa: BLE001 - fail open
        import sys

        print(f"trainguard: zero-code capture not armed ({type(error).__name__}: {error})", file=sys.stderr)


def _chain_to_next_sitecustomize() -> None:
    # Python imports only the first sitecustomize on sys.path; ours shadows any the
    # environment already had, so run that one too.
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_trainguard_chained_sitecustomize", candidate)
            if spec and spec.loader:
                try:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                except Exception as error:  # noqa: BLE001
                    print(f"trainguard: the environment's sitecustomize failed: {error}", file=sys.stderr)
            return


_chain_to_next_sitecustomize()
_arm()
