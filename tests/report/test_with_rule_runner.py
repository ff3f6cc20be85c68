"""The report of a run checked by the real rule runner shows what the runner wrote."""

from __future__ import annotations

import json
import shutil
from html import escape
from pathlib import Path

from trainguard.report import gather_report, render_html
from trainguard.report.html import MAX_FINDINGS_PER_RULE


def test_findings_written_by_the_rule_runner_appear_with_their_hints(plain_run: Path, tmp_path: Path) -> None:
    from trainguard.rules.runner import RuleRunner
    from trainguard.rules.spec import RuleSpec

    run = tmp_path / "run"
    shutil.copytree(plain_run, run)
    specs = [
        RuleSpec.parse("DeadRelu:threshold_layer=0.5,threshold_inactivity=0.8"),
        RuleSpec.parse("LossNotDecreasing"),
        RuleSpec.parse("VanishingGradient:threshold=0.05,semantics=sagemaker"),  # single-step: fires here
    ]
    final = RuleRunner(str(run), specs).run()
    statuses = {name: update.status.value for name, update in final.items()}
    # the run is too short for LossNotDecreasing's windows: it says so (Error, RuleNotEvaluated)
    assert statuses == {
        "DeadRelu": "IssuesFound",
        "LossNotDecreasing": "Error",
        "VanishingGradient": "IssuesFound",
    }
    assert final["LossNotDecreasing"].status_details.startswith("RuleNotEvaluated: ")

    data = gather_report(run)
    assert {o.configuration_name: o.status for o in data.rule_outcomes} == statuses
    page = render_html(data)
    for outcome in data.rule_outcomes:
        written = json.loads((run / "rule-output" / f"{outcome.configuration_name}.json").read_text())
        fired = [finding for finding in written["findings"] if finding["fired"]]
        assert [f["step"] for f in outcome.fired] == sorted(f["step"] for f in fired)
        for finding in fired[:MAX_FINDINGS_PER_RULE]:
            assert escape(finding["fix_hint"]) in page and escape(finding["message"]) in page
        hidden = len(fired) - MAX_FINDINGS_PER_RULE
        if hidden > 0:
            assert f"{outcome.configuration_name}: {hidden} more finding(s) not listed" in page
    # the page leads with the diagnosis, and shows the rule that could not evaluate as such
    assert page.index('class="diagnosis"') < page.index('<table class="overview"')
    assert '<span class="status status-NotEvaluated">not evaluated</span>' in page
    assert "Not evaluated (these rules could not check this run)" in page
