"""Prints the parity summary table (one row per family and device) at the end of the run."""

from __future__ import annotations

from parity_harness import HEADER, LOGITS_RESULTS, RESULTS, WITH_LOGITS, format_row


def pytest_terminal_summary(terminalreporter) -> None:
    write = terminalreporter.write_line
    if LOGITS_RESULTS:
        write("")
        write(f"with-logits parity: patched {WITH_LOGITS} vs unpatched, max over the training steps")
        for result, verdict in LOGITS_RESULTS:
            write(result.row(verdict))
    if not RESULTS:
        return
    write("")
    write("convergence parity: patched vs unpatched (relative loss/logits diffs, max abs weight diff)")
    write(HEADER)
    write("-" * len(HEADER))
    for result, verdict in RESULTS:
        write(format_row(result, verdict))
