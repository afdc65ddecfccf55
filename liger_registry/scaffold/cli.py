"""The `liger-registry scaffold` subcommand: one type printed or written, or every type reported."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from liger_registry.registry.loader import Registry, load_registry
from liger_registry.scaffold.report import CAP_SECONDS, format_line, format_report, scaffold_all
from liger_registry.scaffold.scaffold import scaffold
from liger_registry.usage import UsageError

ONE_TYPE = ("family", "write")  # the options of `scaffold MODEL_TYPE`
EVERY_TYPE = ("report", "cap")  # the options of `scaffold --all`


def _check_mode(args) -> None:
    """One MODEL_TYPE or --all, each with its own options: an option of the other mode would be ignored."""
    if args.all == bool(args.model_type):
        raise UsageError("give a MODEL_TYPE or --all")
    stray = [
        name for name in (ONE_TYPE if args.all else EVERY_TYPE) if getattr(args, name) not in (None, False)
    ]
    if stray:
        mode = "a MODEL_TYPE, not with --all" if args.all else "--all, not with a MODEL_TYPE"
        raise UsageError(f"{', '.join('--' + name for name in stray)} goes with {mode}")


def _taken(registry: Registry, family: str, model_types: list[str], path: Path) -> str | None:
    """Why an entry written to `path` would be refused on load: another file has its family or a model type."""
    for model_type in model_types:
        name = registry.by_model_type.get(model_type)
        if name is not None and registry.families[name].path.resolve() != path.resolve():
            return (
                f"model type {model_type!r} is already served by family {name!r} ({registry.families[name].path})"
                "; a second entry for it would be refused on load"
            )
    if family in registry.families and registry.families[family].path.resolve() != path.resolve():
        return f"family {family!r} is already defined in {registry.families[family].path}"
    return None


def _one(args) -> int:
    family = args.family or args.model_type
    if args.write and (problem := _taken(load_registry(), family, [args.model_type], _target(args, family))):
        raise UsageError(f"refused to write: {problem}")
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
        entry = result.entry
        path = _target(args, entry.family)
        if problem := _taken(load_registry(), entry.family, entry.model_types, path):
            raise UsageError(f"refused to write: {problem}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(result.yaml(), encoding="utf-8")
        print(f"wrote {path}")
    else:
        print(result.yaml(), end="")
    return 0


def _target(args, family: str) -> Path:
    return Path(args.write) / f"{family}.yaml"


def scaffold_command(args) -> int:
    _check_mode(args)
    if not args.all:
        return _one(args)
    start = time.perf_counter()
    progress = (lambda r: print(format_line(r), flush=True)) if args.report else None
    results = scaffold_all(cap=args.cap or CAP_SECONDS, progress=progress)
    print(format_report(results, time.perf_counter() - start))
    return 0
