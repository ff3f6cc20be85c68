"""One fault per kind on the real compose stack, through bench/chaos_stack.py's own code: a short
healthy job, one fault once 10 files are on S3, then nothing lost (every file of the job's tensors
volume on S3 with the same size and MD5), the end marker on S3, every written step evaluated, and
the job Completed with its rule NoIssuesFound. Nothing is repaired by hand: a killed uploader or
rule runner must be restarted by the API's reconciler, an emptied S3 refilled by the uploader.

The whole bench (5 runs per kind, longer jobs) is `python bench/chaos_stack.py`; bench/RESULTS.md.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.e2e.stack import REPO, Stack, running_stack

pytestmark = pytest.mark.slow

# 80 steps at 0.1 s: the first 10 files reach S3 after ~5 steps, so every fault lands while
# training runs, and a run settles in about a minute (5 runs + the stack well under 6 minutes).
STEPS, STEP_SLEEP = 80, 0.1


def _chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chaos_stack", REPO / "bench" / "chaos_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


chaos = _chaos()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    yield from running_stack()


@pytest.mark.parametrize("fault", chaos.FAULTS)
def test_fault_loses_no_file_and_the_job_ends_right(stack: Stack, fault: str) -> None:
    result = chaos.one_run(stack, fault, 0, steps=STEPS, step_sleep=STEP_SLEEP, settle_timeout_s=240)
    print(result.line())
    try:
        assert result.injected_mid_run, f"the fault landed after training ended, proving little: {result.line()}"
        assert result.fault_verified, result.line()
        assert not result.lost and not result.differing, result.line()
        assert result.end_marker, result.line()
        assert (result.job_status, result.rule_status) == ("Completed", "NoIssuesFound"), result.line()
        assert result.steps_written == STEPS and result.steps_evaluated == STEPS, result.line()
        assert result.ok
    finally:
        chaos.remove_job(result.job_name)
