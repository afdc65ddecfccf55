"""Prints the parity summary table (one row per family and device) at the end of the run."""

from __future__ import annotations

from parity_harness import HEADER, RESULTS, format_row


def pytest_terminal_summary(terminalreporter) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    write("")
    write("convergence parity: patched vs unpatched (relative loss/logits diffs, max abs weight diff)")
    write(HEADER)
    write("-" * len(HEADER))
    for result, verdict in RESULTS:
        write(format_row(result, verdict))
