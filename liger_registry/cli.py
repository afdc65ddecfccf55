"""The `liger-registry` command: lint, list, show, explain, schema, env, demo, scaffold, tune, kernel-repo."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import warnings
from pathlib import Path

import yaml

from liger_registry import __version__
from liger_registry.console import print_table
from liger_registry.registry import (
    RegistryError,
    RegistryWarning,
    UnsupportedModelError,
    explain,
    load_registry,
)
from liger_registry.registry.errors import suggest
from liger_registry.registry.explain import DTYPES, gpu_name, parse_device
from liger_registry.schemas import FamilyEntry, PolicyFile
from liger_registry.usage import UsageError

REGISTRY_HELP = "a directory of family/policy YAML files read after the bundled ones (repeatable)"
BROKEN_PIPE = 141  # what a shell reports for a command killed by SIGPIPE (the reader of `| head` went away)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _setting(text: str) -> tuple[str, object]:
    from liger_registry.scaffold.cli import parse_setting

    try:
        return parse_setting(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _device(text: str) -> str:
    try:
        parse_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _gpu(text: str) -> str:
    try:
        return gpu_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _Parser(argparse.ArgumentParser):
    """A usage error in one line (argparse's own prints the whole usage first)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _registry_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registry", action="append", default=[], metavar="DIR", help=REGISTRY_HELP)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="liger-registry", description=__doc__)
    parser.add_argument("--version", action="version", version=f"liger-registry {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    lint = sub.add_parser("lint", help="check forwards, YAML files and targets")
    lint.add_argument(
        "--deep",
        action="store_true",
        help="also run each family's tiny model: skip_logits, and logits, gradients and loss against the "
        "unpatched model (fp32, CPU)",
    )
    lint.add_argument(
        "--format", choices=["text", "json"], default="text", help="json: findings with file and line"
    )
    lint.add_argument(
        "--family",
        action="append",
        default=[],
        metavar="NAME",
        help="check only this family (repeatable; forwards and YAML files are always checked)",
    )
    _registry_option(lint)
    _registry_option(sub.add_parser("list", help="families, their kernels and tested transformers versions"))
    show = sub.add_parser("show", help="one family entry, resolved")
    show.add_argument("family", metavar="FAMILY|MODEL_TYPE", help="a family name or a model type it serves")
    _registry_option(show)
    exp = sub.add_parser(
        "explain", help="resolved configuration of a model type, with provenance, backends and the FLCE plan"
    )
    exp.add_argument("model_type", help="a model type (config.model_type), e.g. llama")
    exp.add_argument(
        "--policy", action="append", metavar="FILE|NAME", help="policy file or registry policy name"
    )
    exp.add_argument(
        "--device", default="cpu", type=_device, help="device the backends are decided for (default cpu)"
    )
    exp.add_argument(
        "--dtype",
        choices=DTYPES,
        help="dtype of the backends (default float32) and of the plan (default bfloat16)",
    )
    exp.add_argument(
        "--tokens", type=_positive, metavar="N", help="print the FLCE plan for N tokens per step"
    )
    exp.add_argument(
        "--hidden", type=_positive, metavar="H", help="hidden size for the plan (default: the config's)"
    )
    exp.add_argument(
        "--vocab", type=_positive, metavar="V", help="vocabulary size for the plan (default: the config's)"
    )
    exp.add_argument(
        "--gpu",
        type=_gpu,
        metavar="NAME",
        help="cost the plan for this GPU (e.g. H200, H100, A100; default: this machine's CUDA device, else a "
        "generic GPU)",
    )
    _registry_option(exp)
    schema = sub.add_parser("schema", help="JSON Schema of the YAML files")
    schema.add_argument(
        "--kind", choices=["family", "policy", "all"], default="all", help="which file's schema"
    )
    env = sub.add_parser("env", help="versions, GPU, environment variables and the backend of each op")
    env.add_argument(
        "--device",
        type=_device,
        help="device the backends are decided for, one of this machine's (default: cuda:0 if any, else cpu)",
    )
    env.add_argument(
        "--dtype",
        choices=DTYPES,
        help="dtype the backends are decided for (default: bfloat16 on CUDA, float32 on CPU)",
    )
    env.add_argument("--format", choices=["text", "json"], default="text", help="output format")
    demo = sub.add_parser("demo", help="train a tiny Llama unpatched and patched")
    demo.add_argument("--steps", type=_positive, default=5, help="training steps of each run (at least 1)")
    scaffold = sub.add_parser("scaffold", help="draft and prove a family entry")
    scaffold.add_argument("model_type", nargs="?", help="a causal-LM model type transformers registers")
    scaffold.add_argument("--family", help="family name of the entry (default: the model type)")
    scaffold.add_argument("--write", metavar="DIR", help="write <family>.yaml into DIR")
    scaffold.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=_setting,
        metavar="FIELD=VALUE",
        help="a config value of the tiny model over the scaffold's (a field the default config leaves unset); "
        "repeatable; VALUE as an int, float, true/false, null or a JSON list/object where it reads as one, "
        "else a string; FIELD may be a dotted path into a nested config",
    )
    scaffold.add_argument("--all", action="store_true", help="every causal-LM model type")
    scaffold.add_argument("--report", action="store_true", help="with --all: a line per type")
    scaffold.add_argument(
        "--cap",
        type=_positive,
        metavar="S",
        help="with --all: the seconds each type may take before it is reported as over the cap",
    )
    repo = sub.add_parser(
        "kernel-repo", help="write the kernels repository of our layers for transformers' KernelConfig"
    )
    repo.add_argument("directory", metavar="DIR", help="where to write it (created if needed)")
    _tune_parser(sub)
    return parser


def _tokens(text: str) -> list[int]:
    return [_positive(t) for t in text.split(",") if t.strip()] or [_positive(text)]


# the presets of kernels/moe/pretune.py, named here so that building the parser imports no torch
TUNE_FAMILIES = {
    "qwen3_moe": "Qwen3-30B-A3B",
    "gpt_oss": "GPT-OSS-20B",
    "mixtral": "Mixtral-8x7B",
    "dbrx": "DBRX-132B",
}


def _tune_parser(sub) -> None:
    tune = sub.add_parser(
        "tune",
        help="run the kernels' tile searches for a model's shapes ahead of training, into the autotune cache",
        description="Search the tile configs of a model's MoE experts on this GPU and store them in the "
        "autotune cache ($LIGER_REGISTRY_CACHE_DIR, default ~/.cache/liger_registry/autotune), so that "
        "training's first step reads them instead of searching. LIGER_REGISTRY_AUTOTUNE_CACHE=0 turns the "
        "cache off; LIGER_REGISTRY_AUTOTUNE=0 skips every search (the heuristic's first config).",
    )
    tune.add_argument("op", choices=["moe"], help="the kernels to tune")
    which = tune.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--family",
        choices=sorted(TUNE_FAMILIES),
        help="a preset shape: " + ", ".join(f"{k} ({v})" for k, v in TUNE_FAMILIES.items()),
    )
    which.add_argument("--config", metavar="PATH", help="a model's config.json (or its directory)")
    tune.add_argument(
        "--tokens",
        type=_tokens,
        default=[4096, 16384],
        metavar="N,N",
        help="tokens per experts call (micro-batch x sequence length; default 4096,16384)",
    )
    tune.add_argument(
        "--dtype",
        choices=["bfloat16", "float16"],
        default="bfloat16",
        help="the activations and weights (default bfloat16)",
    )


def _tune(args) -> int:
    import torch

    from liger_registry.kernels.moe import pretune

    try:
        shape = pretune.PRESETS[args.family] if args.family else pretune.shape_from_config(args.config)
        pretune.device_or_refusal()
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"{shape.label}: {shape.experts} experts, top-{shape.top_k}, hidden {shape.hidden}, intermediate "
        f"{shape.inter}, {shape.act}"
    )
    rows = pretune.pretune(shape, args.tokens, getattr(torch, args.dtype))
    cells = [
        [
            str(r["tokens"]),
            r["kernel"],
            r["source"],
            f"{r['s']:.1f}" if "s" in r else "-",
            r["config"],
            r["bucket"],
        ]
        for r in rows
    ]
    print_table(["tokens", "kernel", "config from", "search s", "config", "bucket"], cells)
    print(pretune.describe_cache())
    return 0


def _lint(args) -> int:
    from liger_registry.lint import lint

    results = lint(deep=args.deep, registry_dirs=tuple(args.registry), families=tuple(args.family))
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
        families = len(args.family) or len(load_registry(*args.registry).families)
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
    every_kernel_on = sum(row[3] == "-" for row in rows)
    print(
        f"{len(registry.families)} families, {len(registry.by_model_type)} model types, "
        f"{every_kernel_on} families with every kernel on"
    )
    return 0


def _show(args) -> int:
    registry = load_registry(*args.registry)
    name = args.family
    if name in registry.families:
        loaded = registry.families[name]
    elif name in registry.by_model_type:
        loaded = registry.family_for(name)
    else:
        close = difflib.get_close_matches(name, [*registry.families, *registry.by_model_type], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UsageError(
            f"unknown family {name!r}{hint} (`liger-registry list` shows the families and their model types)"
        )
    print(f"# {loaded.path}" + (f" (serves model type {name})" if loaded.entry.family != name else ""))
    print(yaml.safe_dump(loaded.entry.model_dump(exclude_none=True), sort_keys=False).rstrip())
    return 0


def _check_policies(names: list[str], registry) -> None:
    """Each --policy names a file or a registry policy, else a usage error (as an unknown model type is)."""
    known = sorted(p.policy.policy for p in registry.policies)
    for name in names:
        if not Path(name).is_file() and registry.named_policy(name) is None:
            raise UsageError(
                f"argument --policy: no policy file or registry policy named {name!r}{suggest(name, known)}; "
                f"named: {', '.join(known)}"
            )


def _explain(args) -> int:
    registry = load_registry(*args.registry)
    _check_policies(args.policy or [], registry)
    explanation = explain(
        args.model_type,
        policy=args.policy,
        device=args.device,
        dtype=args.dtype,
        tokens=args.tokens,
        hidden=args.hidden,
        vocab=args.vocab,
        gpu=args.gpu,
        registry=registry,
    )
    print(explanation)
    return 0


def _schema(args) -> int:
    schemas = {"family": FamilyEntry.model_json_schema(), "policy": PolicyFile.model_json_schema()}
    print(json.dumps(schemas if args.kind == "all" else schemas[args.kind], indent=2))
    return 0


def _env(args) -> int:
    from liger_registry.environment import environment_report, missing_device

    if args.device is not None and (problem := missing_device(args.device)):
        raise UsageError(f"argument --device: {problem}")
    report = environment_report(args.device, args.dtype)
    print(json.dumps(report.as_dict(), indent=2) if args.format == "json" else report)
    return 0


def _demo(args) -> int:
    from liger_registry.demo import run_demo

    run_demo(steps=args.steps)
    return 0


def _scaffold(args) -> int:
    from liger_registry.scaffold.cli import scaffold_command

    return scaffold_command(args)


def _kernel_repo(args) -> int:
    from liger_registry.integrations.hub_kernels import write_repository

    print(write_repository(args.directory))  # the /abs/path of "/abs/path:RMSNorm" mappings
    return 0


COMMANDS = {
    "lint": _lint,
    "list": _list,
    "show": _show,
    "explain": _explain,
    "schema": _schema,
    "env": _env,
    "demo": _demo,
    "scaffold": _scaffold,
    "kernel-repo": _kernel_repo,
    "tune": _tune,
}


def _quiet_stdout() -> None:
    """The reader of our stdout went away: send what is still buffered to /dev/null, so that Python's final
    flush at exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _one_line_registry_warnings(show):
    """warnings.showwarning that prints a RegistryWarning as the command's own warning (not the source line that
    warned), and passes any other warning to `show`."""

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, RegistryWarning):
            return show(message, category, filename, lineno, file, line)
        print(f"liger-registry: warning: {str(message).removeprefix('liger_registry: ')}", file=sys.stderr)

    return showwarning


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0) and 2
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_registry_warnings(warnings.showwarning)
        return _run(args)


def _run(args) -> int:
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return BROKEN_PIPE
    except (UsageError, UnsupportedModelError) as exc:
        # an unknown family or model type can only come from the command line: a usage error like `show`'s
        print(f"liger-registry {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RegistryError as exc:
        print(f"liger-registry: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
