"""The `liger-registry scaffold` subcommand: one type printed or written, or every type reported."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from liger_registry.registry.loader import Registry, load_registry
from liger_registry.scaffold.report import CAP_SECONDS, format_line, format_report, scaffold_all
from liger_registry.scaffold.scaffold import scaffold
from liger_registry.usage import UsageError

ONE_TYPE = ("family", "write", "settings")  # the options of `scaffold MODEL_TYPE`
_FIELD = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)$")


def parse_setting(text: str) -> tuple[str, Any]:
    """`field=value` of `--set`: the value as an int, float, bool, null or JSON list/object where it reads as
    one, else the string itself; ValueError for a malformed field or JSON."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not _FIELD.match(name):
        raise ValueError(f"expected FIELD=VALUE (a config field name, or a dotted path), got {text!r}")
    raw = raw.strip()
    if raw.lower() in ("true", "false"):
        return name, raw.lower() == "true"
    if raw.lower() in ("null", "none"):
        return name, None
    if re.fullmatch(r"[+-]?\d+", raw):
        return name, int(raw)
    if _NUMBER.match(raw):
        return name, float(raw)
    if raw[:1] in "[{":
        try:
            return name, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name}: {raw!r} looks like JSON but does not parse ({exc.msg})") from None
    return name, raw


EVERY_TYPE = ("report", "cap")  # the options of `scaffold --all`
OPTION_FLAGS = {"settings": "set"}  # an option whose flag is not its attribute name


def _check_mode(args) -> None:
    """One MODEL_TYPE or --all, each with its own options: an option of the other mode would be ignored."""
    if args.all == bool(args.model_type):
        raise UsageError("give a MODEL_TYPE or --all")
    stray = [
        name for name in (ONE_TYPE if args.all else EVERY_TYPE) if getattr(args, name) not in (None, False)
    ]
    if stray:
        mode = "a MODEL_TYPE, not with --all" if args.all else "--all, not with a MODEL_TYPE"
        flags = ", ".join("--" + OPTION_FLAGS.get(name, name) for name in stray)
        raise UsageError(f"{flags} goes with {mode}")


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
    result = scaffold(args.model_type, args.family, dict(args.settings or []))
    if result.entry is None:
        print(f"liger-registry scaffold: refused {args.model_type!r}:", file=sys.stderr)
        print("\n".join(f"  - {r}" for r in result.reasons), file=sys.stderr)
        return 1
    for correction in result.corrections:
        print(f"# corrected by the proof: {correction}", file=sys.stderr)
    if not result.ok:
        print(
            f"# NOT proven (lint --deep and parity pass; {result.proof.perturbation_summary()}):",
            file=sys.stderr,
        )
        print("\n".join(f"#   - {r}" for r in result.reasons), file=sys.stderr)
        if args.write:
            print("not written: the draft is not proven (it is printed below)", file=sys.stderr)
        print(result.yaml(), end="")
        return 1
    parity = result.proof.parity
    summary = ", ".join(f"{k} {v:.1e}" for k, v in parity.values().items())
    print(
        f"# proven: lint --deep clean; 3-step fp32 parity max rel diffs: {summary}; perturbation check: "
        f"{result.proof.perturbation_summary()} ({result.seconds:.1f} s)",
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
