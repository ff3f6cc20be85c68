"""Write tensors of every dtype with smdebug 1.0.34's low-level writer; record the expected values.

Usage (inside the smdebug venv, see tests/interop/smdebug_env.py):
    python write_raw_smdebug_events.py OUT_DIR [EXPECTED.json]     (default: OUT_DIR.expected.json)

Uses smdebug.core.writer.FileWriter (one writer per global step; its index writer emits
index/<I9>/<S12>_worker_0.json on close), CollectionManager.export and training_has_ended, the
same path smdebug's own tests take (tests/analysis/utils.py generate_data). So OUT_DIR holds
bytes produced by smdebug's own serializer, for dtypes the hook never produces from a float
model, at several modes and steps (step 1500 lands in index/000000001/).

EXPECTED.json:
  "steps":   [{"global_step", "mode", "mode_step"}, ...] in write order
  "worker":  "worker_0"
  "tensors": {name: {"dtype": numpy dtype written ("str" for strings),
                     "steps": {"<global step>": {"value": nested list, "shape": [...]}}}}
             -- the ground truth a correct reader returns (values as in read_with_smdebug.py:
                complex -> [real, imag] pairs; NaN/Infinity as Python's json writes them)
  "smdebug_read": the run as smdebug's own create_trial reads it (read_with_smdebug.dump_trial),
             including its failures: int8 comes back as uint8; int16, uint16/32/64 and complex64
             raise KeyError; empty tensors raise or give None.
"""

import json
import os
import sys

import numpy as np
from read_with_smdebug import dump_trial, jsonable  # same directory: sys.path[0]
from smdebug.core.access_layer.utils import training_has_ended
from smdebug.core.collection_manager import CollectionManager
from smdebug.core.config_constants import DEFAULT_COLLECTIONS_FILE_NAME
from smdebug.core.modes import ModeKeys
from smdebug.core.writer import FileWriter

WORKER = "worker_0"

# (global step, mode, mode step). Mode steps are independent of global steps; 1500 crosses the
# 1000-files-per-index-directory boundary; GLOBAL and PREDICT are modes too.
STEPS = [
    (0, ModeKeys.TRAIN, 0),
    (1, ModeKeys.TRAIN, 1),
    (2, ModeKeys.EVAL, 0),
    (10, ModeKeys.TRAIN, 2),
    (1500, ModeKeys.EVAL, 1),
    (1501, ModeKeys.PREDICT, 0),
    (1502, ModeKeys.GLOBAL, 1502),
]

# One base value per dtype smdebug's writer accepts (core/tfevent/util.py). Edge values on
# purpose: int8 negatives (smdebug's reader decodes DT_INT8 as uint8), extremes of each integer
# type, NaN/inf/-0.0/subnormals. The structured quantized dtypes (qint8, ...) are left out: no
# framework hook produces them and smdebug cannot read them back either.
BASE = {
    "float16": np.array([[0.5, -1.25, 65504.0], [-0.0, 6.0e-8, 1.0 / 3.0]], dtype=np.float16),
    "float32": np.arange(24, dtype=np.float32).reshape(2, 3, 4) * np.float32(0.1),
    "float32_special": np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], dtype=np.float32),
    "float64": np.array([np.pi, -np.e, 1e300, 5e-324], dtype=np.float64),
    "int8": np.array([-128, -1, 0, 1, 127], dtype=np.int8),
    "int16": np.array([-32768, -1, 0, 32767], dtype=np.int16),
    "int32": np.array([[-(2**31), -1], [0, 2**31 - 1]], dtype=np.int32),
    "int64": np.array([-(2**63), -1, 0, 2**62, 2**63 - 1], dtype=np.int64),
    "uint8": np.array([0, 1, 128, 255], dtype=np.uint8),
    "uint16": np.array([0, 1, 65535], dtype=np.uint16),
    "uint32": np.array([0, 1, 2**32 - 1], dtype=np.uint32),
    "uint64": np.array([0, 1, 2**64 - 1], dtype=np.uint64),
    "bool": np.array([[True, False, True], [False, False, True]]),
    "complex64": np.array([1 + 2j, -0.5j, 3], dtype=np.complex64),
    "complex128": np.array([1 + 2j, -0.5j, 3], dtype=np.complex128),
    "string": np.array(["alpha", "béta", ""]),  # strings: 1-D only, stored as string_val
    "scalar_0d": np.array(3.5, dtype=np.float32),  # 0-d, as a torch loss is saved: shape ()
    "empty_float32": np.zeros((0, 3), dtype=np.float32),  # zero elements: tensor_content empty
    "empty_int64": np.zeros((0,), dtype=np.int64),
}


def value_at(name, base, step):
    """Make values differ per step (so a reader mixing up steps fails), same dtype and range."""
    if base.ndim == 0:  # keep a 0-d ndarray: a numpy scalar would be stored with shape (1,)
        return np.array(base + base.dtype.type(step))
    return np.roll(base, step)  # permutes elements: no overflow, NaNs stay NaNs


def main(out_dir, expected_path):
    os.environ.pop("TRAINING_JOB_NAME", None)  # set = "SageMaker job": no end marker written
    tensors = {
        name: {"dtype": "str" if base.dtype.kind == "U" else str(base.dtype), "steps": {}}
        for name, base in BASE.items()
    }
    # A Python float goes through smdebug's make_numpy_array: stored as float64, shape (1,).
    tensors["python_float"] = {"dtype": "float64", "steps": {}}
    # A tensor present at some steps only.
    tensors["train_only"] = {"dtype": "float32", "steps": {}}

    for step, mode, mode_step in STEPS:
        with FileWriter(trial_dir=out_dir, step=step, worker=WORKER) as fw:
            to_write = {name: value_at(name, base, step) for name, base in BASE.items()}
            to_write["python_float"] = 0.25 + step
            if mode == ModeKeys.TRAIN:
                to_write["train_only"] = np.full((2,), step, dtype=np.float32)
            for name, value in to_write.items():
                fw.write_tensor(tdata=value, tname=name, mode=mode, mode_step=mode_step)
                arr = np.asarray(value) if isinstance(value, np.ndarray) else np.array([value])
                tensors[name]["steps"][str(step)] = {
                    "value": jsonable(arr),
                    "shape": list(arr.shape),
                }

    cm = CollectionManager()
    cm.add("default")
    cm.get("default").tensor_names = sorted(tensors)
    cm.add("floats")  # a regex-only collection
    cm.get("floats").include("^float")
    cm.export(out_dir, DEFAULT_COLLECTIONS_FILE_NAME)
    training_has_ended(out_dir)

    expected = {
        "steps": [{"global_step": s, "mode": m.name, "mode_step": ms} for s, m, ms in STEPS],
        "worker": WORKER,
        "tensors": tensors,
        "smdebug_read": dump_trial(out_dir),
    }
    with open(expected_path, "w") as fh:
        json.dump(expected, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    out = sys.argv[1]
    main(out, sys.argv[2] if len(sys.argv) == 3 else out.rstrip("/") + ".expected.json")
