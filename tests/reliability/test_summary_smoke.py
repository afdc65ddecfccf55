"""The reliability summary counts the cases a test reports (a self-check of tests/reliability/conftest.py)."""

import pytest


@pytest.mark.reliability("raw_exception")
def test_cases_are_counted(cases) -> None:
    before = cases.total
    cases.tried(3)
    assert cases.total == before + 3
