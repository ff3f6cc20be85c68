"""The runner's per-step read cache: one decode per tensor, copies only for rules it cannot vouch for."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rules.synthetic import open_trial, write_run
from trainguard.modes import ModeKeys
from trainguard.rules.read_cache import StepReadCache


def test_builtin_callers_share_read_only_views_others_get_copies(tmp_path):
    write_run(tmp_path / "run", {0: {"w": np.arange(6.0)}}, finished=True)
    trial = open_trial(tmp_path / "run")
    cache = StepReadCache(trial)
    first = trial._read_values(["w"], 0, ModeKeys.GLOBAL, None)["w"]
    first[:] = -1  # a custom rule scribbling on its copy ...
    cache.share_read_only = True
    shared = trial._read_values(["w"], 0, ModeKeys.GLOBAL, None)["w"]
    np.testing.assert_array_equal(shared, np.arange(6.0))  # ... changes nothing for the others
    with pytest.raises(ValueError):
        shared[0] = 5.0
    again = trial._read_values(["w"], 0, ModeKeys.GLOBAL, None)["w"]
    assert np.shares_memory(shared, again) and cache.misses == 1 and cache.hits == 2
