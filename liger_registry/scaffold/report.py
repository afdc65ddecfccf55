"""Scaffolds every causal-LM model type transformers registers and reports the counts and grouped reasons."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator

from liger_registry.scaffold.inspect import causal_lm_types
from liger_registry.scaffold.scaffold import ScaffoldResult, scaffold

CAP_SECONDS = 60


class _OverCap(BaseException):  # not an Exception: the scaffold's own handlers must not swallow it
    pass


@contextlib.contextmanager
def _capped(seconds: int) -> Iterator[None]:
    """Raise _OverCap after `seconds` of wall time (main thread with SIGALRM only; elsewhere uncapped)."""

    def expire(signum, frame):
        raise _OverCap

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except (ValueError, AttributeError):  # not the main thread, or no SIGALRM on this platform
        yield
        return
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def scaffold_capped(model_type: str, cap: int = CAP_SECONDS) -> ScaffoldResult:
    start = time.perf_counter()
    try:
        with _capped(cap):
            return scaffold(model_type)
    except _OverCap:
        return ScaffoldResult(
            model_type, reasons=[f"over the {cap} s cap per type"], seconds=time.perf_counter() - start
        )
    except Exception as exc:  # the report goes on: a crash of the scaffold on one type is that type's reason
        reason = f"the scaffold crashed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        return ScaffoldResult(model_type, reasons=[reason], seconds=time.perf_counter() - start)


def scaffold_all(
    model_types: list[str] | None = None, cap: int = CAP_SECONDS, progress=None
) -> list[ScaffoldResult]:
    results = []
    for model_type in model_types or sorted(causal_lm_types()):
        results.append(scaffold_capped(model_type, cap))
        if progress is not None:
            progress(results[-1])
    return results


_DETAIL = re.compile(r"\(.*?\)|(?<!\w)'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\b\d[\d.e+-]*[kMG]?\b")
_NESTED = ("proof failed", "cannot build a tiny model", "cannot make the config tiny", "the scaffold crashed")


def reason_group(reason: str) -> str:
    """A refusal reason without its specifics (names, numbers), so that alike reasons count together: the
    stage, and for a raised error its type."""
    parts = reason.split(": ")
    kept = ": ".join(parts[:2] if parts[0] in _NESTED else parts[:1])
    return _DETAIL.sub("…", kept)[:110]


def format_line(result: ScaffoldResult) -> str:
    head = f"{result.model_type:<28} {result.status:<10} {result.seconds:6.1f}s"
    if result.ok:
        corrected = "; ".join(c.split(":")[0] for c in result.corrections)
        return head + (f" (corrected: {corrected})" if corrected else "")
    return f"{head}  {result.reasons[0][:150]}"


def format_report(results: list[ScaffoldResult], seconds: float) -> str:
    proven = [r for r in results if r.ok]
    unproven = [r for r in results if r.unproven]
    refused = [r for r in results if r.entry is None]
    corrected = [r for r in proven if r.corrections]
    groups = Counter(reason_group(r.reasons[0]) for r in refused)
    lines = [
        f"scaffold report: {len(results)} causal-LM model types, {len(proven)} drafted and proven "
        f"({len(corrected)} with a kernel turned off by the proof), {len(unproven)} drafted but not proven, "
        f"{len(refused)} refused; {seconds:.0f} s",
    ]
    if unproven:
        lines.append("not proven (an attribute the perturbation check could not pin down):")
        lines += [f"  {r.model_type}: {r.reasons[0][:200]}" for r in unproven]
    lines.append("refused, by reason:")
    lines += [f"  {count:4d}  {group}" for group, count in groups.most_common()]
    slowest = max(results, key=lambda r: r.seconds, default=None)
    if slowest is not None:
        lines.append(f"slowest type: {slowest.model_type} {slowest.seconds:.1f} s")
    return "\n".join(lines)
