"""Inductor compile of every bundled family's patched tiny model (one process): loss and gradients vs eager.

Each family's tiny model (fp32 by default: the comparison then shows what compiling changes, not bf16 rounding) is
patched, stepped eagerly and through ``torch.compile(model)``; the table gives, per family, whether it matched,
the relative differences ||compiled - eager|| / ||eager|| of the loss and of the worst parameter's gradient, and
the first compiled step's time (compiling forward and backward). A family whose compiled step strays from eager
is compared with its unpatched model compiled the same way: it passes when the two compiled steps agree
(inductor changes the unpatched model alike). Exit status 1 when any family failed.

    python -m benchmarks compile                      # every family, on CUDA when there is one
    python -m benchmarks compile --families llama gemma2 --device cpu
    python -m benchmarks compile --workers 8            # compiling is host-bound: 8 processes
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError, as_completed

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from benchmarks import harness
from liger_registry.registry.loader import load_registry
from liger_registry.testing import CompileCheck, compile_check

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# fp32: inductor reorders and fuses the same arithmetic; bf16 rounds each fused intermediate differently
TOLERANCES = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 5e-2)}


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", help="family names (default: every bundled family)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument(
        "--budget-s", type=float, default=280.0, help="report no family after this many seconds"
    )
    parser.add_argument("--workers", type=int, default=1, help="processes compiling families side by side")
    parser.add_argument("--json", default=None, help="also write the JSON here (it always goes to --out)")
    harness.add_out_arg(parser)
    return parser.parse_args(argv)


def _line(check: CompileCheck, ok: bool) -> str:
    """One family's progress line, printed as it finishes."""
    if check.error is not None:
        return f"  {check.family}: NO, {check.error[:120]}"
    return f"  {check.family}: {'yes' if ok else 'NO'}, compiled step {check.compile_s:.1f} s"


COLUMNS = [
    ("family", ""),
    ("ok", ""),
    ("loss rel", ".1e"),
    ("grad rel", ".1e"),
    ("compile s", ".1f"),
    ("as unpatched: loss", ".1e"),
    ("grads", ".1e"),
    ("error", ""),
]


def _table_row(row: dict) -> list:
    return [row["family"], row["ok"], row.get("loss_rel"), row.get("grad_rel"), row.get("compile_s")] + [
        row.get("vs_unpatched_loss_rel") if row.get("as_unpatched") else None,
        row.get("vs_unpatched_grad_rel") if row.get("as_unpatched") else None,
        (row.get("error") or "")[:90],
    ]


def _check(family: str, device: str, dtype: torch.dtype) -> CompileCheck:
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    registry = load_registry()
    return compile_check(
        registry.family(family).entry.model_types[0],
        device=device,
        dtype=dtype,
        registry=registry,
        tolerances=TOLERANCES[dtype],
    )


def _installed(registry, family: str) -> bool:
    """Whether the installed transformers has the family's first model type (the one compiled)."""
    return registry.family(family).entry.model_types[0] in CONFIG_MAPPING


def _run(families: list[str], args: argparse.Namespace, dtype: torch.dtype):
    """(family, CompileCheck) as each finishes; none started after the budget. With ``--workers N`` the families
    are spread over N processes (compiling is host-bound), each taking one family after another."""
    deadline = time.perf_counter() + args.budget_s
    if args.workers == 1:
        for family in families:
            if time.perf_counter() > deadline:
                return
            yield family, _check(family, args.device, dtype)
        return
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        futures = {pool.submit(_check, f, args.device, dtype): f for f in families}
        try:
            for future in as_completed(futures, timeout=max(deadline - time.perf_counter(), 1)):
                family = futures[future]
                try:
                    yield family, future.result()
                except Exception as exc:  # the worker died (compile_check records the family's own errors)
                    yield family, CompileCheck(family, error=f"worker: {type(exc).__name__}: {exc}")
        except TimeoutError:
            pool.shutdown(wait=False, cancel_futures=True)


def main(argv=None) -> int:
    args = parse(argv)
    dtype = DTYPES[args.dtype]
    loss_tol, grad_tol = TOLERANCES[dtype]
    registry = load_registry()
    families = args.families or sorted(registry.families)
    if absent := [f for f in families if not _installed(registry, f)]:
        print(f"not in transformers {transformers.__version__}, not run: {', '.join(absent)}")
        families = [f for f in families if f not in absent]
    start, rows = time.perf_counter(), {}
    for family, check in _run(families, args, dtype):
        ok = check.ok(loss_tol, grad_tol)
        rows[family] = {**vars(check), "ok": ok}
        print(_line(check, ok), flush=True)
    if missing := [f for f in families if f not in rows]:
        print(f"budget of {args.budget_s:.0f} s spent; not run: {', '.join(missing)}")
    passed = sum(r["ok"] for r in rows.values())
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    results = harness.Results("compile", args.out, env=harness.capture_env(device))
    for row in rows.values():
        for key in ("loss_rel", "grad_rel", "compile_s"):
            results.add(row["family"], "ours_compile", key, row.get(key))
    payload = {"device": args.device, "dtype": args.dtype, "rows": list(rows.values())}
    path = results.write(payload)
    if args.json:
        harness.write_json(args.json, {"env": results.env, **payload}, ".")
    harness.print_table(COLUMNS, [_table_row(r) for r in rows.values()], f"compile vs eager; json: {path}")
    print(
        f"compile: {passed}/{len(families)} families match eager ({len(rows)} run; {args.device}, {args.dtype}, "
        f"{args.workers} process(es); bounds loss {loss_tol:g}, grads {grad_tol:g}) in "
        f"{time.perf_counter() - start:.0f} s"
    )
    return 0 if passed == len(families) else 1


if __name__ == "__main__":
    sys.exit(main())
