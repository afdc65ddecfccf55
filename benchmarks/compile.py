"""Inductor compile of every bundled family's patched tiny model (one process): loss and gradients vs eager.

Each family's tiny model (fp32 by default: the comparison then shows what compiling changes, not bf16 rounding) is
patched, stepped eagerly and through ``torch.compile(model)``; the table gives, per family, whether it matched,
the relative differences ||compiled - eager|| / ||eager|| of the loss and of the worst parameter's gradient, and
the first compiled step's time (compiling forward and backward). A family whose compiled step strays from eager
is compared with its unpatched model compiled the same way: it passes when the two compiled steps agree
(inductor changes the unpatched model alike). Exit status 1 when any family failed.

    python benchmarks/compile_families.py                      # every family, on CUDA when there is one
    python benchmarks/compile_families.py --families llama gemma2 --device cpu
    python benchmarks/compile_families.py --workers 8            # compiling is host-bound: 8 processes
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, TimeoutError, as_completed

import torch
import transformers
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from liger_registry.registry.loader import load_registry
from liger_registry.testing import CompileCheck, compile_check

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# fp32: inductor reorders and fuses the same arithmetic; bf16 rounds each fused intermediate differently
TOLERANCES = {torch.float32: (1e-5, 1e-4), torch.bfloat16: (2e-2, 5e-2)}


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", help="family names (default: every bundled family)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument(
        "--budget-s", type=float, default=280.0, help="report no family after this many seconds"
    )
    parser.add_argument("--workers", type=int, default=1, help="processes compiling families side by side")
    parser.add_argument(
        "--json", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "compile.json")
    )
    return parser.parse_args()


def _row(check: CompileCheck, ok: bool) -> str:
    if check.error is not None:
        return f"{check.family:<24} {'NO':<3} {'-':>9} {'-':>9} {'-':>8}  {check.error[:90]}"
    return (
        f"{check.family:<24} {'yes' if ok else 'NO':<3} {check.loss_rel:>9.1e} {check.grad_rel:>9.1e} "
        f"{check.compile_s:>8.1f}"
        + (
            f"  as unpatched compiled: loss {check.vs_unpatched_loss_rel:.1e}, grads {check.vs_unpatched_grad_rel:.1e}"
            if check.as_unpatched
            else ""
        )
    )


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


def main() -> int:
    args = _args()
    dtype = DTYPES[args.dtype]
    loss_tol, grad_tol = TOLERANCES[dtype]
    registry = load_registry()
    families = args.families or sorted(registry.families)
    if absent := [f for f in families if not _installed(registry, f)]:
        print(f"not in transformers {transformers.__version__}, not run: {', '.join(absent)}")
        families = [f for f in families if f not in absent]
    print(f"{'family':<24} {'ok':<3} {'loss rel':>9} {'grad rel':>9} {'compile s':>8}", flush=True)
    start, rows = time.perf_counter(), {}
    for family, check in _run(families, args, dtype):
        ok = check.ok(loss_tol, grad_tol)
        rows[family] = {**vars(check), "ok": ok}
        print(_row(check, ok), flush=True)
    if missing := [f for f in families if f not in rows]:
        print(f"budget of {args.budget_s:.0f} s spent; not run: {', '.join(missing)}")
    passed = sum(r["ok"] for r in rows.values())
    print(
        f"compile: {passed}/{len(families)} families match eager ({len(rows)} run; {args.device}, {args.dtype}, "
        f"{args.workers} process(es); bounds loss {loss_tol:g}, grads {grad_tol:g}) in "
        f"{time.perf_counter() - start:.0f} s"
    )
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"device": args.device, "dtype": args.dtype, "rows": list(rows.values())}, f, indent=1)
    return 0 if passed == len(families) else 1


if __name__ == "__main__":
    sys.exit(main())
