"""Read a run with smdebug 1.0.34's own trial API and dump everything it sees as JSON.

Usage (inside the smdebug venv, see tests/interop/smdebug_env.py):
    python read_with_smdebug.py RUN_DIR RESULT.json

This is the reference answer for "does smdebug read what trainguard wrote": a test compares
RESULT.json with what trainguard meant to write. write_with_smdebug.py imports dump_trial() from
here so that both directions describe a run in the same JSON shape:

{"smdebug_version", "tensor_names", "modes", "workers", "collections",
 "collection_tensor_names": {collection: [names the trial matches]},
 "steps": {"TRAIN"|"EVAL"|"PREDICT"|"GLOBAL": [steps of that mode]},
 "step_modes": {"<global step>": ["TRAIN", mode_step]},
 "tensors": {name: {
     "steps": {mode: [mode steps]},
     "values": {"<global step>": {"value": nested list or null, "dtype": str, "shape": [...]}
                                | {"error": "ExceptionName: message"}},
     "reductions": {"<global step>": {"l2": x, "abs_mean": y, ...}}}}}   (only where any exist)

Values are nested lists (numpy .tolist()); complex numbers become [real, imag] pairs; NaN and
infinities stay as Python's json writes them (NaN, Infinity), which json.load reads back.
"""

import json
import os
import signal
import sys

# Reader knobs (smdebug reads them from the environment when the trial is created):
# - the end marker is already there, so don't wait 1 s for a "final refresh";
# - a missing event file is retried every 2 s, 100 times by default: fail fast instead.
os.environ.setdefault("SMDEBUG_TRAINING_END_DELAY_REFRESH", "0")
os.environ.setdefault("SMDEBUG_MISSING_EVENT_FILE_RETRY_LIMIT", "2")

import numpy as np  # noqa: E402
import smdebug  # noqa: E402
from smdebug.core.modes import ModeKeys  # noqa: E402
from smdebug.trials import create_trial  # noqa: E402

MODES = [ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.GLOBAL]


def jsonable(x):
    """numpy value -> JSON-friendly nested lists."""
    if isinstance(x, np.ndarray):
        if np.iscomplexobj(x):
            return np.stack([x.real, x.imag], axis=-1).tolist()
        return x.tolist()
    if isinstance(x, (np.generic, complex)):
        return jsonable(np.asarray(x))
    return x


def describe(value):
    if value is None:  # smdebug returns None for some unreadable tensors (empty int32/int64)
        return {"value": None, "dtype": None, "shape": None}
    arr = np.asarray(value)
    return {"value": jsonable(arr), "dtype": str(arr.dtype), "shape": list(arr.shape)}


def error_text(exc):
    return f"{type(exc).__name__}: {exc}"


def dump_tensor(trial, name):
    tensor = trial.tensor(name)
    out = {
        "steps": {m.name: tensor.steps(mode=m) for m in MODES},
        "values": {},
        "reductions": {},
    }
    for step in tensor.steps():  # global steps
        try:
            out["values"][str(step)] = describe(tensor.value(step))
        except Exception as exc:  # e.g. reductions-only tensors, dtypes smdebug cannot decode
            out["values"][str(step)] = {"error": error_text(exc)}
        try:
            reds = tensor.reduction_values(step)
        except Exception as exc:
            reds = {}
            out["reductions"][str(step)] = {"error": error_text(exc)}
        if reds:
            # (name, abs) -> value, via reduction_value() as a rule would call it.
            out["reductions"][str(step)] = {
                ("abs_" if is_abs else "") + red: jsonable(tensor.reduction_value(step, red, abs=is_abs))
                for (red, is_abs) in sorted(reds)
            }
    if not out["reductions"]:
        del out["reductions"]
    return out


def dump_trial(run_dir):
    trial = create_trial(run_dir)
    names = trial.tensor_names()
    collections = sorted(trial.collections())
    return {
        "smdebug_version": smdebug.__version__,
        "tensor_names": names,
        "modes": sorted(m.name for m in trial.modes()),
        "workers": sorted(trial.workers()),
        "collections": collections,
        "collection_tensor_names": {c: trial.tensor_names(collection=c) for c in collections},
        "steps": {m.name: trial.steps(mode=m) for m in MODES},
        "step_modes": {str(s): [trial.mode(s).name, trial.mode_step(s)] for s in trial.steps()},
        "tensors": {name: dump_tensor(trial, name) for name in names},
    }


def main(run_dir, result_path):
    # smdebug polls forever for a run that never ends; the caller's run must be finished.
    if not os.path.exists(os.path.join(run_dir, "training_job_end.ts")):
        sys.exit(f"{run_dir} has no training_job_end.ts: smdebug would poll forever")
    signal.alarm(240)  # belt and braces: die rather than hang a test session
    result = dump_trial(run_dir)
    with open(result_path, "w") as fh:
        json.dump(result, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
