"""The live rule runner on real runs (written with the hook's own writer), local and on S3.

The rules used here are defined in this module so the runner's behaviour is tested
independently of the built-in rules; the runner loads them by ``module:Class`` path, as users'
custom rules are loaded.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.rules.synthetic import write_run
from tests.s3_server import s3_bucket, s3_client, s3_endpoint  # noqa: F401 - pytest fixtures
from trainguard.errors import ConfigError
from trainguard.rules import Param, Rule, RuleSpec, RuleStatus
from trainguard.rules.runner import RuleRunner, StatusUpdate

HERE = "tests.rules.test_runner"


def _log(path: str | None, text: str) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(text + "\n")
            file.flush()


class ValueAbove(Rule):
    """Fires when the largest value of tensor ``w`` exceeds ``threshold``."""

    rule_name = "ValueAbove"
    fix_hint = "make w smaller"
    collections = ("weights",)
    threshold = Param(float, 1.0, "limit for max(w)")
    tensor = Param(str, "w", "tensor to read")
    log = Param(str, None, "file to append each evaluated step to", optional=True)
    delay = Param(float, 0.0, "seconds to sleep per step (to kill the runner mid-run)")
    certain = Param(bool, True, "whether a finding is certain (only certain ones stop training)")

    def check(self, step: int):
        _log(self.log, f"check {step}")
        if self.delay:
            time.sleep(self.delay)
        value = float(np.max(self.base_trial.tensor(self.tensor).value(step)))
        if value > self.threshold:
            return self.issue(step, f"max(w) = {value:g} > {self.threshold:g}", certain=self.certain, value=value)
        return self.no_issue(step, value=value)

    def check_idle(self, now: float):
        _log(self.log, "idle")
        return None

    def finish(self):
        _log(self.log, "finish")
        return None


class Boom(Rule):
    """Raises at step ``at``."""

    rule_name = "Boom"
    at = Param(int, 2)

    def check(self, step: int):
        if step == self.at:
            raise ValueError(f"boom at {step}")
        return self.no_issue(step)


class WholeRun(Rule):
    """A profiler-like rule without ``check``: fires in ``finish`` if it was polled idle."""

    rule_name = "WholeRun"
    kind = "profiler"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.idle_calls = 0

    def check_idle(self, now: float):
        self.idle_calls += 1
        return None

    def finish(self):
        return self.issue(-1, f"whole-run finding after {self.idle_calls} idle polls")


class Curious(Rule):
    """Asks the trial many questions per step, as built-in rules do (names, presence, state)."""

    rule_name = "Curious"
    questions = Param(int, 50)

    def check(self, step: int):
        trial = self.base_trial
        for _ in range(self.questions):
            trial.tensor_names()
            trial.has_tensor("w")
            trial.training_ended
        return self.no_issue(step)


def _values(fire_at: set[int], steps: range = range(10)) -> dict[int, dict[str, np.ndarray]]:
    return {s: {"w": np.full(3, 5.0 if s in fire_at else 0.5, dtype=np.float32)} for s in steps}


def _spec(rule: str, name: str = "", actions: tuple = (), **parameters) -> RuleSpec:
    return RuleSpec(f"{HERE}:{rule}", {k: str(v) for k, v in parameters.items()}, name, actions)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_subclass_sees_every_result_through_record(tmp_path: Path) -> None:
    """services/rule_runner counts each evaluated step by overriding ``RuleRunner._record``: every
    result of every step passes there before the statuses record it."""
    run = write_run(tmp_path / "run", _values({3, 6}))
    seen: list[tuple[int, bool]] = []

    class Watching(RuleRunner):
        def _record(self, name, result):  # type: ignore[no-untyped-def]
            if result is not None:
                seen.append((result.step, result.fired))
            super()._record(name, result)

    runner = Watching(run, [_spec("ValueAbove", "r")], poll_interval=0.05)
    final = runner.run()
    assert seen == [(step, step in (3, 6)) for step in range(10)]
    assert final["r"].status == RuleStatus.ISSUES_FOUND and runner.latest["r"] is final["r"]
    assert [f["step"] for f in runner.progress["r"].findings if f["fired"]] == [3, 6]


def test_finished_run_statuses_wording_and_output_file(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({3, 6}))
    updates: list[StatusUpdate] = []
    final = RuleRunner(run, [_spec("ValueAbove", "big-w")], on_update=updates.append, poll_interval=0.05).run()

    update = final["big-w"]
    assert update.status == RuleStatus.ISSUES_FOUND
    assert update.status_details == (
        "RuleEvaluationConditionMet: Evaluation of the rule ValueAbove at step 3 resulted in the condition being met\n"
    )
    assert update.last_evaluated_step == 9
    # transitions and every finding reach on_update: the rule keeps running after it fired
    assert [u.status for u in updates][0] == RuleStatus.IN_PROGRESS
    fired = [u for u in updates if u.result is not None and u.result.fired]
    assert [u.result.step for u in fired] == [3, 6]
    assert fired[1].status_details.endswith("at step 6 resulted in the condition being met\n")
    assert fired[0].result.fix_hint == "make w smaller"

    document = json.loads((tmp_path / "run" / "rule-output" / "big-w.json").read_text())
    assert set(document) >= {"configuration_name", "rule", "status", "status_details", "last_evaluated_step",
                             "findings", "missing", "updated_at"}  # fmt: skip
    assert document["configuration_name"] == "big-w" and document["rule"] == "ValueAbove"
    assert document["status"] == "IssuesFound" and document["last_evaluated_step"] == 9
    assert [f["step"] for f in document["findings"]] == [3, 6]
    assert document["findings"][0]["details"]["value"] == 5.0


def test_no_issues_found(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values(set()))
    final = RuleRunner(run, [_spec("ValueAbove")], output_dir=str(tmp_path / "out")).run()
    assert final[f"{HERE}:ValueAbove"].status == RuleStatus.NO_ISSUES_FOUND
    # output_dir overrides the run dir; the configuration name becomes the file name
    assert not (tmp_path / "run" / "rule-output").exists()
    assert (
        json.loads((tmp_path / "out" / "rule-output" / f"{HERE}:ValueAbove.json").read_text())["status"]
        == "NoIssuesFound"
    )


def test_missing_tensor_is_reported_not_raised(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values(set()))
    updates: list[StatusUpdate] = []
    final = RuleRunner(run, [_spec("ValueAbove", "absent", tensor="absent_tensor")], on_update=updates.append).run()
    update = final["absent"]
    # missing at every step: the rule never evaluated, which is not "no issues"
    assert update.status == RuleStatus.ERROR
    assert update.status_details.startswith("RuleNotEvaluated: missing data:")
    assert "absent_tensor" in update.status_details and "'weights'" in update.status_details
    live = [u for u in updates if u.status == RuleStatus.IN_PROGRESS and "Missing data" in u.status_details]
    assert len(live) == 1, "the same missing collection is reported once, not once per step"
    document = json.loads((tmp_path / "run" / "rule-output" / "absent.json").read_text())
    assert document["missing"][0]["collection"] == "weights"


def test_a_raising_rule_is_isolated(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({8}))
    final = RuleRunner(run, [_spec("Boom", at=2), _spec("ValueAbove")]).run()
    boom = final[f"{HERE}:Boom"]
    assert boom.status == RuleStatus.ERROR
    assert "ValueError: boom at 2" in boom.status_details and "step 2" in boom.status_details
    other = final[f"{HERE}:ValueAbove"]
    assert other.status == RuleStatus.ISSUES_FOUND and other.last_evaluated_step == 9


def test_stop_action_ends_the_rule_after_it_fires(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({3, 6}))
    log = tmp_path / "log"
    stop = ({"name": "StopTraining"},)
    final = RuleRunner(run, [_spec("ValueAbove", "stopper", stop, log=log)]).run()
    assert final["stopper"].status == RuleStatus.ISSUES_FOUND
    assert [line for line in _lines(log) if line.startswith("check")] == [f"check {s}" for s in range(4)]
    assert "finish" not in _lines(log)
    # SageMaker's escaped action_json form says the same
    escaped = '[{\\"name\\": \\"stoptraining\\", \\"training_job_prefix\\": \\"job\\"}]'
    log2 = tmp_path / "log2"
    RuleRunner(run, [_spec("ValueAbove", "escaped", log=log2, action_json=escaped)], output_dir=str(tmp_path)).run()
    assert _lines(log2)[-1] == "check 3"


def test_an_uncertain_finding_never_stops_the_rule(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({3, 6}))
    log = tmp_path / "log"
    stop = ({"name": "StopTraining"},)
    final = RuleRunner(run, [_spec("ValueAbove", "unsure", stop, log=log, certain=False)]).run()
    assert final["unsure"].status == RuleStatus.ISSUES_FOUND
    # reported, but evaluation (and training, for trainguard run) goes on to the end
    assert [line for line in _lines(log) if line.startswith("check")] == [f"check {s}" for s in range(10)]
    assert "finish" in _lines(log)
    document = json.loads((tmp_path / "run" / "rule-output" / "unsure.json").read_text())
    assert [(f["step"], f["certain"]) for f in document["findings"]] == [(3, False), (6, False)]


def test_start_and_end_step(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({1, 7}))
    log = tmp_path / "log"
    final = RuleRunner(run, [_spec("ValueAbove", "r", log=log)], start_step=2, end_step=5).run()
    assert [line for line in _lines(log) if line.startswith("check")] == ["check 2", "check 3", "check 4"]
    assert final["r"].status == RuleStatus.NO_ISSUES_FOUND
    with pytest.raises(ConfigError, match="end_step"):
        RuleRunner(run, [_spec("ValueAbove")], start_step=5, end_step=5)


def test_follows_a_live_run_that_appears_later(tmp_path: Path) -> None:
    path = tmp_path / "run"
    log = tmp_path / "log"
    updates: list[StatusUpdate] = []
    runner = RuleRunner(str(path), [_spec("ValueAbove", "live", log=log)], poll_interval=0.05, on_update=updates.append)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(runner.run()))
    thread.start()
    time.sleep(0.3)  # the run does not exist yet: the runner waits for it
    assert thread.is_alive() and not _lines(log)
    write_run(path, _values({2}, range(0, 5)), finished=False)
    deadline = time.monotonic() + 20
    while "check 4" not in _lines(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert "idle" in _lines(log), "polls without a new step call check_idle"
    assert thread.is_alive(), "a live run without its end marker keeps the runner going"
    assert any(u.result is not None and u.result.step == 2 for u in updates), "findings arrive while training runs"
    write_run(path, _values({7}, range(5, 10)), finished=True)
    thread.join(timeout=30)
    assert not thread.is_alive()
    checks = [line for line in _lines(log) if line.startswith("check")]
    assert checks == [f"check {s}" for s in range(10)], "each step evaluated exactly once, in order"
    assert _lines(log).count("finish") == 1
    assert result["live"].status == RuleStatus.ISSUES_FOUND
    assert [u.result.step for u in updates if u.result is not None and u.result.fired] == [2, 7]


def test_a_live_run_is_listed_once_per_poll_not_per_question(tmp_path: Path, monkeypatch) -> None:
    """Each question a rule asks a live trial used to list the run's index files again (~90 per
    evaluated step with the default rules, most of a live runner's CPU): once per poll now."""
    from trainguard.storage.local import LocalStore

    listings = []
    original = LocalStore.list
    def counting(self, prefix="", start_after=None):
        listings.append(prefix)
        return original(self, prefix, start_after)

    monkeypatch.setattr(LocalStore, "list", counting)
    path = write_run(tmp_path / "run", _values(set(), range(10)), finished=False)
    stop = threading.Event()
    runner = RuleRunner(path, [_spec("Curious", "c", questions=50)], poll_interval=0.2, stop_event=stop)
    thread = threading.Thread(target=runner.run)
    began = time.monotonic()
    thread.start()
    deadline = time.monotonic() + 20
    while runner.progress.get("c") is None or runner.progress["c"].last_evaluated_step != 9:
        assert time.monotonic() < deadline, "the runner did not evaluate the 10 steps"
        time.sleep(0.02)
    stop.set()
    thread.join(timeout=10)
    polls = (time.monotonic() - began) / 0.2 + 2
    index_listings = [prefix for prefix in listings if prefix.startswith("index")]
    # 10 steps x 50 questions x 3 asked; one listing per poll answers them
    assert len(index_listings) <= 2 * polls + 5, (len(index_listings), polls)


def test_stop_event_and_training_done(tmp_path: Path) -> None:
    path = write_run(tmp_path / "run", _values(set(), range(3)), finished=False)
    stop = threading.Event()
    runner = RuleRunner(path, [_spec("ValueAbove", "r")], poll_interval=0.05, stop_event=stop)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(runner.run()))
    thread.start()
    time.sleep(0.5)
    stop.set()
    thread.join(timeout=10)
    assert result["r"].status == RuleStatus.STOPPED and "last evaluated step: 2" in result["r"].status_details

    # training_done: the process is gone without an end marker; evaluate what is there, finish
    log = tmp_path / "log"
    done = threading.Event()
    done.set()
    final = RuleRunner(path, [_spec("ValueAbove", "r", log=log)], training_done=done, output_dir=str(tmp_path)).run()
    assert final["r"].status == RuleStatus.NO_ISSUES_FOUND and _lines(log)[-1] == "finish"


def test_run_that_never_appears_is_a_clear_error(tmp_path: Path) -> None:
    started = time.monotonic()
    final = RuleRunner(str(tmp_path / "nothing"), [_spec("ValueAbove", "r")], wait_timeout=0.5, poll_interval=0.1).run()
    assert time.monotonic() - started < 10
    assert final["r"].status == RuleStatus.ERROR
    assert (
        "did not appear within 0 s" in final["r"].status_details
        or "did not appear within 1 s" in final["r"].status_details
    )
    assert str(tmp_path / "nothing") in final["r"].status_details


def test_profiler_kind_rule_without_check(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_run(path, _values(set(), range(2)), finished=False)
    runner = RuleRunner(str(path), [_spec("WholeRun", "w")], poll_interval=0.05)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(runner.run()))
    thread.start()
    time.sleep(0.5)
    write_run(path, _values(set(), range(2, 4)), finished=True)
    thread.join(timeout=20)
    update = result["w"]
    assert update.status == RuleStatus.ISSUES_FOUND, update.status_details
    finding = json.loads((path / "rule-output" / "w.json").read_text())["findings"][0]
    assert finding["step"] == -1 and int(finding["message"].split(" after ")[1].split()[0]) >= 2


def test_progress_file_resumes_without_repeating(tmp_path: Path) -> None:
    path = tmp_path / "run"
    write_run(path, _values({1}, range(5)), finished=False)
    log, progress = tmp_path / "log", tmp_path / "progress.json"
    stop = threading.Event()
    runner = RuleRunner(str(path), [_spec("ValueAbove", "r", log=log)], progress_file=str(progress), stop_event=stop,
                        poll_interval=0.05)  # fmt: skip
    thread = threading.Thread(target=runner.run)
    thread.start()
    deadline = time.monotonic() + 20
    while "check 4" not in _lines(log) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=10)
    saved = json.loads(progress.read_text())
    assert saved["rules"]["r"]["last_evaluated_step"] == 4
    write_run(path, _values({6}, range(5, 8)), finished=True)
    final = RuleRunner(str(path), [_spec("ValueAbove", "r", log=log)], progress_file=str(progress)).run()
    checks = [line for line in _lines(log) if line.startswith("check")]
    assert checks == [f"check {s}" for s in range(8)]
    assert final["r"].status_details.startswith(
        "RuleEvaluationConditionMet: Evaluation of the rule ValueAbove at step 1 "
    )
    document = json.loads((path / "rule-output" / "r.json").read_text())
    assert [f["step"] for f in document["findings"]] == [1, 6]
    # a progress file of another run is refused instead of silently skipping steps
    other = write_run(tmp_path / "other", _values(set(), range(2)))
    with pytest.raises(ConfigError, match="belongs to the run"):
        RuleRunner(other, [_spec("ValueAbove", "r")], progress_file=str(progress)).run()


def test_specs_are_validated_up_front(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown rule 'NoSuchRule'.*Built-in rules"):
        RuleRunner(str(tmp_path), [RuleSpec("NoSuchRule")])
    with pytest.raises(ConfigError, match="unknown parameter.*nope.*valid parameters: certain, delay, log, tensor, threshold"):
        RuleRunner(str(tmp_path), [_spec("ValueAbove", nope=1)])
    with pytest.raises(ConfigError, match="threshold='high' is not a valid float"):
        RuleRunner(str(tmp_path), [_spec("ValueAbove", threshold="high")])
    with pytest.raises(ConfigError, match="two rule configurations are named 'x'"):
        RuleRunner(str(tmp_path), [_spec("ValueAbove", "x"), _spec("Boom", "x")])
    with pytest.raises(ConfigError, match="no rules"):
        RuleRunner(str(tmp_path), [])


def test_status_update_round_trips_through_json(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", _values({0}, range(1)))
    updates: list[StatusUpdate] = []
    RuleRunner(run, [_spec("ValueAbove", "r")], on_update=updates.append).run()
    for update in updates:
        again = StatusUpdate.from_dict(json.loads(json.dumps(update.to_dict())))
        assert again == update


def test_s3_run_with_endpoint(tmp_path: Path, s3_endpoint: str, s3_bucket: str) -> None:  # noqa: F811
    local = Path(write_run(tmp_path / "run", _values({4})))
    client = s3_client(s3_endpoint)
    # upload like the uploader does: event files and indexes, the end marker last
    files = sorted(p for p in local.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == "training_job_end.ts")
    for file in files:
        client.upload_file(str(file), s3_bucket, f"job/debug-output/{file.relative_to(local).as_posix()}")
    final = RuleRunner(f"s3://{s3_bucket}/job/debug-output", [_spec("ValueAbove", "r")], endpoint_url=s3_endpoint,
                       poll_interval=0.1).run()  # fmt: skip
    assert final["r"].status == RuleStatus.ISSUES_FOUND
    assert "at step 4 resulted" in final["r"].status_details
    # the rule output goes next to debug-output, as SageMaker lays a job out: where reports look
    document = json.loads(client.get_object(Bucket=s3_bucket, Key="job/rule-output/r.json")["Body"].read())
    assert document["status"] == "IssuesFound" and document["findings"][0]["step"] == 4
    from trainguard.report import gather_report

    report = gather_report(f"s3://{s3_bucket}/job/debug-output", endpoint_url=s3_endpoint)
    assert [outcome.configuration_name for outcome in report.rule_outcomes] == ["r"]


def test_unwritable_s3_output_is_logged_and_evaluation_goes_on(tmp_path: Path, s3_endpoint: str, s3_bucket: str,  # noqa: F811
                                                               caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    run = write_run(tmp_path / "run", _values({2}))
    final = RuleRunner(run, [_spec("ValueAbove", "r")], output_dir="s3://no-such-bucket-here/job",
                       endpoint_url=s3_endpoint, poll_interval=0.1).run()  # fmt: skip
    assert final["r"].status == RuleStatus.ISSUES_FOUND
    assert "cannot save rule progress or output" in caplog.text
