"""The parity summary tables (one row per family and device), printed at the end of the run by tests/conftest.py
from the rows each test's report carries."""

from __future__ import annotations

import pytest
from parity_harness import HEADER, LOGITS_RESULTS, RESULTS, WITH_LOGITS, format_row

LOGITS_TITLE = (f"with-logits parity: patched {WITH_LOGITS} vs unpatched, max over the training steps",)
TITLE = (
    "convergence parity: patched vs unpatched (relative loss/logits diffs, max abs weight diff)",
    HEADER,
    "-" * len(HEADER),
)
_REPORTED = {"parity": 0, "logits": 0}  # rows of RESULTS and LOGITS_RESULTS carried by earlier reports


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.when == "call":
        logits = [result.row(verdict) for result, verdict in LOGITS_RESULTS[_REPORTED["logits"] :]]
        rows = [format_row(result, verdict) for result, verdict in RESULTS[_REPORTED["parity"] :]]
        _REPORTED.update(parity=len(RESULTS), logits=len(LOGITS_RESULTS))
        if logits:
            report.user_properties.append(("summary_lines", (LOGITS_TITLE, logits)))
        if rows:
            report.user_properties.append(("summary_lines", (TITLE, rows)))
    return report
