"""Counts of the hardening suite: cases tried per category and the failures in each, printed at the end."""

from __future__ import annotations

from collections import Counter

import pytest

CATEGORIES = {
    "silent_wrong": "silent wrong results",
    "lost_state": "lost-state cases",
    "raw_exception": "raw exceptions escaping the public API",
}
TRIED: Counter = Counter()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reliability(category): a hardening case of one category (" + ", ".join(CATEGORIES) + ")"
    )


def _category(item: pytest.Item) -> str:
    marker = item.get_closest_marker("reliability")
    if marker is None or not marker.args or marker.args[0] not in CATEGORIES:
        raise pytest.UsageError(
            f"{item.nodeid}: mark it @pytest.mark.reliability(<category>), one of {', '.join(CATEGORIES)}"
        )
    return marker.args[0]


class Cases:
    """What a test tells the summary: how many cases (inputs, threads, mutations) it tried."""

    def __init__(self, category: str) -> None:
        self.category = category

    def tried(self, n: int = 1) -> None:
        TRIED[self.category] += n

    @property
    def total(self) -> int:
        return TRIED[self.category]


@pytest.fixture
def cases(request: pytest.FixtureRequest) -> Cases:
    return Cases(_category(request.node))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reliability/" in item.nodeid.replace("\\", "/") or item.nodeid.startswith("reliability/"):
            _category(item)


TITLE = ("reliability summary", f"{'category':<40} {'tests':>6} {'cases tried':>12} {'failing':>8}")
_REPORTED: Counter = Counter()  # the cases tried already counted in an earlier report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """The test's counts as a user property of its report; tests/conftest.py sums and prints them."""
    report = yield
    if report.when == "call" and item.get_closest_marker("reliability") is not None:
        category = _category(item)
        counts = {
            key: [int(key == category), TRIED[key] - _REPORTED[key], int(key == category and report.failed)]
            for key in CATEGORIES
        }
        _REPORTED.update({key: c[1] for key, c in counts.items()})
        rows = {f"{name:<40} {{0:>6}} {{1:>12}} {{2:>8}}": counts[key] for key, name in CATEGORIES.items()}
        rows |= {f"{name}: {{2}}": counts[key] for key, name in CATEGORIES.items()}
        report.user_properties.append(("summary_counts", (TITLE, rows)))
    return report
