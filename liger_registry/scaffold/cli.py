"""The `liger-registry scaffold` subcommand: one type printed or written, or every type reported."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from liger_registry.scaffold.report import format_line, format_report, scaffold_all
from liger_registry.scaffold.scaffold import scaffold


def _one(args) -> int:
    result = scaffold(args.model_type, args.family)
    if not result.ok:
        print(f"liger-registry scaffold: refused {args.model_type!r}:", file=sys.stderr)
        print("\n".join(f"  - {r}" for r in result.reasons), file=sys.stderr)
        return 1
    parity = result.proof.parity
    summary = ", ".join(f"{k} {v:.1e}" for k, v in parity.values().items())
    for correction in result.corrections:
        print(f"# corrected by the proof: {correction}", file=sys.stderr)
    print(
        f"# proven: lint --deep clean; 3-step fp32 parity max rel diffs: {summary} ({result.seconds:.1f} s)",
        file=sys.stderr,
    )
    if args.write:
        path = Path(args.write) / f"{result.entry.family}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.yaml(), encoding="utf-8")
        print(f"wrote {path}")
    else:
        print(result.yaml(), end="")
    return 0


def scaffold_command(args) -> int:
    if args.all == bool(args.model_type):
        print("liger-registry scaffold: give a MODEL_TYPE or --all", file=sys.stderr)
        return 2
    if not args.all:
        return _one(args)
    start = time.perf_counter()
    progress = (lambda r: print(format_line(r), flush=True)) if args.report else None
    results = scaffold_all(cap=args.cap, progress=progress)
    print(format_report(results, time.perf_counter() - start))
    return 0
