"""Rule results written by the real rule runner, as the report shows them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainguard.report import build_page, gather_report


def _in_page(text: str, page: str) -> bool:
    """``text`` as the page's inlined JSON carries it."""
    return json.dumps(text)[1:-1].replace("<", "\\u003c") in page


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
    page = build_page(str(run))
    document = json.loads(
        page.html.split('<script type="application/json" id="tg-data">', 1)[1].split("</script>", 1)[0]
    )
    detail = next(value for key, value in document.items() if key.startswith("api/runs/") and key.count("/") == 2)
    table = {row["configuration_name"]: row for row in detail["rules_table"]}
    for outcome in data.rule_outcomes:
        written = json.loads((run / "rule-output" / f"{outcome.configuration_name}.json").read_text())
        fired = [finding for finding in written["findings"] if finding["fired"]]
        assert table[outcome.configuration_name]["findings"] == len(fired)
        if fired:  # the earliest finding of each rule is in the diagnosis, with its fix
            first = min(fired, key=lambda f: f["step"])
            assert _in_page(first["message"], page.html) and _in_page(first["fix_hint"], page.html)
            assert table[outcome.configuration_name]["first_step"] == first["step"]
    ranked = [item["rule"] for section in ("primary", "consequences", "other") for item in detail["diagnosis"][section]]
    assert sorted(ranked) == ["DeadRelu", "VanishingGradient"]
    # the rule that could not evaluate is shown as such, with why
    assert (
        table["LossNotDecreasing"]["not_evaluated"]
        == final["LossNotDecreasing"].status_details.removeprefix("RuleNotEvaluated: ").strip()
    )
    assert page.findings == sum(row["findings"] for row in table.values())
