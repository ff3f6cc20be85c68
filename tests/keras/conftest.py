"""Keras tests: each training job runs in a subprocess per backend (Keras picks its backend
once, at import). In-process tests use the torch backend unless KERAS_BACKEND says otherwise.
Each test module skips itself when keras is not installed."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")
