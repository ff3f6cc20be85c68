"""Keras tests: each training job runs in a subprocess per backend (Keras picks its backend
once, at import). In-process tests use the torch backend unless KERAS_BACKEND says otherwise."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
pytest.importorskip("keras", reason="the Keras tests need keras>=3: pip install 'trainguard[keras]'")
