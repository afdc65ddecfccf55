"""The `liger-registry` command: lint, list, show, explain, schema, demo, scaffold."""

from __future__ import annotations

import argparse
import json
import os
import sys

import yaml

from liger_registry.console import print_table
from liger_registry.registry import RegistryError, UnsupportedModelError, explain, load_registry
from liger_registry.schemas import FamilyEntry, PolicyFile


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="liger-registry", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    lint = sub.add_parser("lint", help="check forwards, YAML files and targets")
    lint.add_argument(
        "--deep", action="store_true", help="also run each family's tiny model through skip_logits"
    )
    lint.add_argument("--format", choices=["text", "json"], default="text")
    lint.add_argument("--registry", action="append", default=[], metavar="DIR", help="extra YAML directory")
    sub.add_parser("list", help="families, their kernels and tested transformers versions").add_argument(
        "--registry", action="append", default=[], metavar="DIR"
    )
    show = sub.add_parser("show", help="one family entry, resolved")
    show.add_argument("family")
    show.add_argument("--registry", action="append", default=[], metavar="DIR")
    exp = sub.add_parser(
        "explain", help="resolved configuration of a model type, with provenance, backends and the FLCE plan"
    )
    exp.add_argument("model_type")
    exp.add_argument(
        "--policy", action="append", metavar="FILE|NAME", help="policy file or registry policy name"
    )
    exp.add_argument("--device", default="cpu", help="device the backends are decided for (default cpu)")
    exp.add_argument(
        "--dtype", default=None, help="dtype of the backends (float32) and of the plan (bfloat16)"
    )
    exp.add_argument("--tokens", type=int, metavar="N", help="print the FLCE plan for N tokens per step")
    exp.add_argument(
        "--hidden", type=int, metavar="H", help="hidden size for the plan (default: the config's)"
    )
    exp.add_argument(
        "--vocab", type=int, metavar="V", help="vocabulary size for the plan (default: the config's)"
    )
    schema = sub.add_parser("schema", help="JSON Schema of the YAML files")
    schema.add_argument("--kind", choices=["family", "policy", "all"], default="all")
    demo = sub.add_parser("demo", help="train a tiny Llama unpatched and patched")
    demo.add_argument("--steps", type=int, default=5)
    scaffold = sub.add_parser("scaffold", help="draft and prove a family entry")
    scaffold.add_argument("model_type", nargs="?", help="a causal-LM model type transformers registers")
    scaffold.add_argument("--family", help="family name of the entry (default: the model type)")
    scaffold.add_argument("--write", metavar="DIR", help="write <family>.yaml into DIR")
    scaffold.add_argument("--all", action="store_true", help="every causal-LM model type")
    scaffold.add_argument("--report", action="store_true", help="with --all: a line per type")
    scaffold.add_argument("--cap", type=int, default=60, metavar="S", help="seconds per type")
    return parser


def _lint(args) -> int:
    from liger_registry.lint import lint

    results = lint(deep=args.deep, registry_dirs=tuple(args.registry))
    findings = [f for f in results if f.severity == "error"]
    notes = [f for f in results if f.severity != "error"]
    if args.format == "json":
        print(
            json.dumps(
                {
                    "ok": not findings,
                    "findings": [f.as_dict() for f in findings],
                    "notes": [n.as_dict() for n in notes],
                },
                indent=2,
            )
        )
        return 1 if findings else 0
    print("\n".join(map(str, notes + findings)))
    if findings:
        print(f"{len(findings)} finding(s)")
    else:
        families = len(load_registry(*args.registry).families)
        print(f"well-formed: {families} families, all checks pass" + (" (deep)" if args.deep else ""))
    return 1 if findings else 0


def _kernels(entry: FamilyEntry) -> tuple[str, str]:
    on = [k for k, s in entry.kernels if s is not None and s.enabled]
    off = [k for k, s in entry.kernels if s is not None and not s.enabled]
    if entry.head is not None:  # a bare decoder (head: null) has no head to fuse
        (on if entry.flce.enabled else off).append("flce")
    return ", ".join(on), ", ".join(off) or "-"


def _list(args) -> int:
    registry = load_registry(*args.registry)
    rows = []
    for name, loaded in sorted(registry.families.items()):
        on, off = _kernels(loaded.entry)
        rows.append(
            [name, ", ".join(loaded.entry.model_types), on, off, ", ".join(loaded.entry.tested) or "-"]
        )
    print_table(["family", "model types", "kernels", "off", "transformers tested"], rows)
    return 0


def _show(args) -> int:
    loaded = load_registry(*args.registry).family(args.family)
    print(f"# {loaded.path}")
    print(yaml.safe_dump(loaded.entry.model_dump(exclude_none=True), sort_keys=False).rstrip())
    return 0


def _explain(args) -> int:
    explanation = explain(
        args.model_type,
        policy=args.policy,
        device=args.device,
        dtype=args.dtype,
        tokens=args.tokens,
        hidden=args.hidden,
        vocab=args.vocab,
    )
    if args.tokens is None:
        print(explanation)
        return 0
    try:
        print(explanation)
    except ValueError as exc:  # the planner's check of the tokens / hidden / vocab given
        print(f"liger-registry: {exc}", file=sys.stderr)
        return 1
    return 0


def _schema(args) -> int:
    schemas = {"family": FamilyEntry.model_json_schema(), "policy": PolicyFile.model_json_schema()}
    print(json.dumps(schemas if args.kind == "all" else schemas[args.kind], indent=2))
    return 0


def _demo(args) -> int:
    from liger_registry.demo import run_demo

    run_demo(steps=args.steps)
    return 0


def _scaffold(args) -> int:
    from liger_registry.scaffold.cli import scaffold_command

    return scaffold_command(args)


COMMANDS = {
    "lint": _lint,
    "list": _list,
    "show": _show,
    "explain": _explain,
    "schema": _schema,
    "demo": _demo,
    "scaffold": _scaffold,
}


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and 2
    try:
        return COMMANDS[args.command](args)
    except (RegistryError, UnsupportedModelError) as exc:
        print(f"liger-registry: {exc}", file=sys.stderr)
        return 1
    except (
        BrokenPipeError
    ):  # `liger-registry schema | head`: the reader left early, which is no error of ours
        os.dup2(
            os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno()
        )  # so the exit flush does not fail again
        return 0


if __name__ == "__main__":
    sys.exit(main())
