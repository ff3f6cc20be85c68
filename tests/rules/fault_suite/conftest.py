"""Session-wide cache of the fault-suite runs: each real training run happens once per session."""

from __future__ import annotations

import pytest

from tests.rules.fault_suite.evaluate import Outcome, evaluate_rules
from tests.rules.fault_suite.runs import Case, train


class SuiteRuns:
    def __init__(self, root) -> None:  # type: ignore[no-untyped-def]
        self.root = root
        self._paths: dict[str, str] = {}
        self._outcomes: dict[tuple[str, tuple[str, ...] | None], dict[str, Outcome]] = {}

    def path(self, case: Case) -> str:
        if case.name not in self._paths:
            self._paths[case.name] = train(str(self.root / case.name), case.config)
        return self._paths[case.name]

    def outcomes(self, case: Case, rules: list[str] | None = None) -> dict[str, Outcome]:
        key = (case.name, tuple(rules) if rules else None)
        if key not in self._outcomes:
            self._outcomes[key] = evaluate_rules(self.path(case), rules)
        return self._outcomes[key]


@pytest.fixture(scope="session")
def suite_runs(tmp_path_factory) -> SuiteRuns:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    return SuiteRuns(tmp_path_factory.mktemp("fault-suite"))
