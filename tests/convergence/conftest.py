"""Prints the parity summary table (one row per family and device) at the end of the run."""

from __future__ import annotations

from parity_harness import RESULTS


def pytest_terminal_summary(terminalreporter) -> None:
    if not RESULTS:
        return
    write = terminalreporter.write_line
    header = f"{'device':<6} {'dtype':<8} {'family':<18} {'C':>3} {'loss':>9} {'weight':>9} {'logits':>9} {'ev_train':>9} {'ev_eval':>9}  result"
    write("")
    write("convergence parity: patched vs unpatched (relative loss/logits diffs, max abs weight diff)")
    write(header)
    write("-" * len(header))
    for r, verdict in RESULTS:
        c = "-" if r.chunk_mem_const is None else str(r.chunk_mem_const)
        write(
            f"{r.device:<6} {r.dtype:<8} {r.family:<18} {c:>3} {r.loss:>9.2e} {r.weight:>9.2e} {r.logits:>9.2e} "
            f"{r.eval_loss_train:>9.2e} {r.eval_loss_eval:>9.2e}  {verdict}"
        )
