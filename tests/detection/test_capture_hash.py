"""``--capture-hash``: rule changes re-judged on the captures an earlier hook made, never trained
under that hook's key with the current one."""

from __future__ import annotations

import pytest

from bench.detection import all_cases
from bench.detection import score


def test_a_chosen_capture_hash_keys_the_cache_and_a_missing_capture_is_not_trained(tmp_path, monkeypatch):
    case = all_cases()[0]
    score.capture_source_hash.cache_clear()
    own = score.spec_key(case)
    monkeypatch.setenv(score.CAPTURE_HASH_VARIABLE, "0123456789")
    score.capture_source_hash.cache_clear()
    try:
        assert score.capture_source_hash() == "0123456789" and score.spec_key(case) != own
        with pytest.raises(FileNotFoundError, match="no capture"):
            score.ensure_run(case, tmp_path)
        assert not any(tmp_path.iterdir())  # nothing trained, nothing cached
    finally:
        score.capture_source_hash.cache_clear()
