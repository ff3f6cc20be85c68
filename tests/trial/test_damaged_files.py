"""Damaged runs are reported, never silently shortened: an event file whose index is missing
(the writer died between the two, or the index was lost) and an index whose event file is
missing are each named once, with the step, and the rest of the run stays readable."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from tests.trial.test_trial_live import write_steps
from trainguard.errors import StepUnavailable, TensorUnavailableForStep
from trainguard.format.layout import END_OF_TRAINING, event_key, index_key
from trainguard.modes import ModeKeys
from trainguard.storage import LocalStore
from trainguard.trial import create_trial
from trainguard.trial.trial import Trial

STEPS = [(0, ModeKeys.TRAIN, 0), (1, ModeKeys.TRAIN, 1), (2, ModeKeys.TRAIN, 2)]


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [record.getMessage() for record in caplog.records if text in record.getMessage()]


def test_event_file_without_index_is_reported_once_with_its_step(tmp_path, caplog) -> None:
    write_steps(LocalStore(tmp_path), STEPS)
    (tmp_path / index_key(1, "worker_0")).unlink()
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        trial = create_trial(tmp_path)
        # asked again and again (as rules and reports do): still one warning
        for _ in range(3):
            trial.refresh(force=True)
            trial.steps()
            assert trial.unreadable_files() == {
                event_key(1, "worker_0"): "event file without an index: step 1 of worker_0 is missing"
            }
    warnings = _warnings(caplog, "has no index file")
    assert len(warnings) == 1
    assert event_key(1, "worker_0") in warnings[0] and "step 1 of worker_0" in warnings[0]
    # the step is not counted as saved, and the steps around it read as before
    assert trial.steps() == [0, 2]
    with pytest.raises(StepUnavailable, match="has no index file"):
        trial.tensor("Net_fc.weight").value(1)
    np.testing.assert_array_equal(trial.tensor("Net_fc.weight").value(2), np.full((2, 3), 2.0, np.float32))


def test_an_intact_run_and_a_live_step_being_written_are_not_reported(tmp_path, caplog) -> None:
    write_steps(LocalStore(tmp_path), STEPS, end=False)
    # the live run's next step: its event file is written, its index not yet (normal order)
    (tmp_path / index_key(2, "worker_0")).unlink()
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        trial = create_trial(tmp_path)
        assert trial.steps() == [0, 1]
        assert trial.unreadable_files() == {}
        # the writer finishes the step and the run: nothing was ever damaged
        write_steps(LocalStore(tmp_path), STEPS)
        trial.refresh(force=True)
        assert trial.training_ended and trial.steps() == [0, 1, 2]
        assert trial.unreadable_files() == {}
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING] == []


def test_missing_index_found_when_the_end_marker_arrives(tmp_path, caplog) -> None:
    write_steps(LocalStore(tmp_path), STEPS, end=False)
    (tmp_path / index_key(1, "worker_0")).unlink()
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        trial = create_trial(tmp_path)
        assert trial.unreadable_files() == {}  # live: step 1 may still be being written
        (tmp_path / END_OF_TRAINING).write_bytes(b"")
        trial.refresh(force=True)
        assert list(trial.unreadable_files()) == [event_key(1, "worker_0")]
    assert len(_warnings(caplog, "has no index file")) == 1


def test_missing_index_of_one_worker_leaves_the_others_readable(tmp_path, caplog) -> None:
    store = LocalStore(tmp_path)
    write_steps(store, STEPS, worker="worker_0", num_workers=2)
    write_steps(store, STEPS, worker="worker_1", num_workers=2)
    (tmp_path / index_key(2, "worker_1")).unlink()
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        trial = create_trial(tmp_path)
        assert trial.tensor("Net_fc.weight").workers(2) == ["worker_0"]
        assert trial.unreadable_files() == {
            event_key(2, "worker_1"): "event file without an index: step 2 of worker_1 is missing"
        }
    assert len(_warnings(caplog, "has no index file")) == 1


def test_an_event_file_missing_when_read_but_there_later_is_not_damage(tmp_path) -> None:
    """A store that lost its objects and had them uploaded again (the compose stack's S3 restarted
    empty): the file came late, the run is whole, and a later read gets its values."""
    write_steps(LocalStore(tmp_path), STEPS)
    path = tmp_path / event_key(1, "worker_0")
    saved = path.read_bytes()
    path.unlink()
    trial = Trial(LocalStore(tmp_path), missing_event_wait=0.2)
    with pytest.raises(TensorUnavailableForStep, match="does not exist"):
        trial.tensor("Net_fc.weight").value(1)
    assert trial.unreadable_files() == {event_key(1, "worker_0"): "event file named by an index but missing"}
    path.write_bytes(saved)
    assert trial.unreadable_files() == {} and trial.damage() == []
    np.testing.assert_array_equal(trial.tensor("Net_fc.weight").value(1), np.full((2, 3), 1.0, np.float32))


def test_missing_event_file_is_waited_for_once_and_reported(tmp_path, caplog) -> None:
    write_steps(LocalStore(tmp_path), STEPS)
    (tmp_path / event_key(1, "worker_0")).unlink()
    trial = Trial(LocalStore(tmp_path), missing_event_wait=0.5)
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        started = time.monotonic()
        with pytest.raises(TensorUnavailableForStep, match="does not exist"):
            trial.tensor("Net_fc.weight").value(1)
        first = time.monotonic() - started
        started = time.monotonic()
        for name in ("Net_fc.weight", "CrossEntropyLoss_output_0"):
            with pytest.raises(TensorUnavailableForStep, match="does not exist"):
                trial.tensor(name).value(1)
        again = time.monotonic() - started
    assert first >= 0.5 and again < 0.5  # the wait is paid once per file, not once per read
    assert len(_warnings(caplog, "does not exist")) == 1
    assert trial.unreadable_files() == {event_key(1, "worker_0"): "event file named by an index but missing"}
    np.testing.assert_array_equal(trial.tensor("Net_fc.weight").value(2), np.full((2, 3), 2.0, np.float32))
