"""The calibration corpus for trainguard's rules and its scorer: ``python -m bench.detection``.

:func:`all_cases` lists every case (healthy and faulty, PyTorch and XGBoost); see
docs/rules-calibration.md for what the corpus holds and the current figures.
"""

from __future__ import annotations

from bench.detection.registry import FAULTY, HEALTHY, Case, verify

__all__ = ["FAULTY", "HEALTHY", "Case", "all_cases", "cases_by_name", "verify"]


def all_cases() -> list[Case]:
    from bench.detection.faulty import faulty_cases
    from bench.detection.framework_cases import framework_cases
    from bench.detection.healthy import healthy_cases

    from bench.detection.keras_cases import keras_cases
    from bench.detection.others_cases import others_cases

    cases = healthy_cases() + faulty_cases() + framework_cases() + keras_cases() + others_cases()
    try:
        from bench.detection.xgboost_cases import xgboost_cases
    except ImportError:  # not written, or xgboost not installed
        return cases
    return cases + xgboost_cases()


def cases_by_name() -> dict[str, Case]:
    return {case.name: case for case in all_cases()}
