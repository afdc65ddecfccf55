"""pytest plugin for GPU runs: every liger_registry.apply / patched of the test run forces one FLCE strategy.

Runs the parity suite once per strategy without a package-level switch (the strategy is a knob of the FLCE
spec, given here as the `flce_strategy=` override of apply). Usage, from the repository root:

    FORCE_FLCE_STRATEGY=vocab PYTHONPATH=$PWD:$PWD/tests/convergence python -m pytest -p force_flce_strategy -m gpu tests/convergence

Each forced apply checks that the resolved FLCE spec carries the strategy (a clear error when the installed
liger_registry has no such knob); the summary says how many models were forced.
"""

from __future__ import annotations

import functools
import os

STRATEGY = os.environ.get("FORCE_FLCE_STRATEGY", "")
FORCED: list[str] = []


def _forced_apply(apply):
    @functools.wraps(apply)
    def wrapper(model, *args, **kwargs):
        kwargs.setdefault("flce_strategy", STRATEGY)
        try:
            handle = apply(model, *args, **kwargs)
        except Exception as exc:
            if "flce_strategy" in str(exc):
                raise RuntimeError(
                    f"force_flce_strategy: this liger_registry does not take the flce_strategy override ({exc})"
                ) from exc
            raise
        flce = handle.report.config.entry.flce
        got = getattr(flce, "strategy", None)
        got = getattr(got, "value", got)  # a str enum or a plain str
        if flce.enabled and got != kwargs["flce_strategy"]:
            handle.revert()
            raise RuntimeError(
                f"force_flce_strategy: asked for strategy {kwargs['flce_strategy']!r}, resolved {got!r}"
            )
        FORCED.append(handle.report.family)
        return handle

    return wrapper


def pytest_configure(config) -> None:
    if STRATEGY not in ("tokens", "vocab", "auto"):
        raise ValueError(f"FORCE_FLCE_STRATEGY must be tokens, vocab or auto; got {STRATEGY!r}")
    import liger_registry  # here, not at import: the test suite's conftest configures Triton first
    import liger_registry.registry.applier as applier

    forced = _forced_apply(applier.apply)
    # patched() calls the applier module's apply; the package re-exports both names
    applier.apply = liger_registry.apply = liger_registry.registry.apply = forced


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(
        f"force_flce_strategy: {len(FORCED)} apply() calls forced to strategy={STRATEGY} "
        f"({len(set(FORCED))} families)"
    )
