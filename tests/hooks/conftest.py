"""Fixtures for the hook tests.

Every hook a test creates goes through ``make_hook`` so that it is closed at teardown even when
the test fails: an open TorchHook keeps a *global* optimizer-step hook registered, which would
leak into later tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import trainguard.pytorch as tg


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def make_hook(run_dir: Path):
    created: list[tg.Hook] = []

    def make(cls=tg.Hook, **kwargs):
        kwargs.setdefault("out_dir", str(run_dir))
        hook = cls(**kwargs)
        created.append(hook)
        return hook

    yield make
    for hook in created:
        hook.close()


@pytest.fixture(autouse=True)
def root_call_shims(monkeypatch):
    """Roots driven by call shims (torch_root_call.py) in every hook test, as in a process that
    compiled nothing before its hook existed: in this test process an earlier test's compile has
    imported Dynamo, which alone would give every later hook pre-hooks."""
    from trainguard.hooks import torch_root_call

    monkeypatch.setattr(torch_root_call, "shims_safe", lambda: True)
