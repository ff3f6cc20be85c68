"""What kind of problem a finding is: its rule's name, or a kind several rules can report.

The diagnosis (which finding explains which) and the advice policy (which findings describe the
data or the initialisation rather than a learning symptom) both judge findings by kind, so the
kind is decided here, once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MISPREDICTION", "NON_FINITE", "finding_kind"]

NON_FINITE = "NonFinite"
# ClassImbalance's second finding, a class predicted wrong most of the time, is a symptom of a model
# that does not learn (shuffled labels, a wrong loss), not the data imbalance the rule is named after.
MISPREDICTION = "Misprediction"
_MISPREDICTED = re.compile(r"\bis mispredicted\b")
_NON_FINITE_WORDS = re.compile(r"(\bnan\b|[-+]?\binf\b|\binfinit|non-?finite)", re.IGNORECASE)


def finding_kind(finding: Mapping[str, Any]) -> str:
    """``NonFinite`` for a finding about NaN/inf values, else its rule's name."""
    details = finding.get("details") or {}
    flagged = isinstance(details, Mapping) and any(
        details.get(key) for key in ("non_finite", "nonfinite", "nan", "inf")
    )
    message = str(finding.get("message") or "")
    if flagged or _NON_FINITE_WORDS.search(message):
        return NON_FINITE
    if finding.get("rule") == "ClassImbalance" and _MISPREDICTED.search(message):
        return MISPREDICTION
    return str(finding.get("rule") or "")
