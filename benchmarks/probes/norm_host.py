"""Question: Where does a LayerNorm / RMSNorm forward + backward call spend its host time?
Answer recorded in docs/design/norm-host-overhead.md.

Where a LayerNorm / RMSNorm fwd+bwd call spends its host time (GPU only; < 60 s on an H200).

For LayerNorm and RMSNorm 16384 x 4096 bf16, forward + backward (ours; the peer and eager torch where
available for the wall): (a) wall median, (b) host issue time per call with the GPU held behind
``torch.cuda._sleep`` (pure host work; a call that syncs shows up as the sleep's length), for the forward alone
and forward + backward, (c) cProfile top 25 by tottime of 50 host-issued calls, (d) each Triton kernel launched:
grid, num_warps, num_stages, shared memory, registers, spills (from the compiled kernel; "?" where triton does
not say), (e) torch.profiler CPU + CUDA table, top 15, (f) (a) and (b) again once a profiler has run in the process,
(g) the backward kernels at 8 and 16 warps (BWD_WARP_FACTOR 1 and 2).
Usage: python -m benchmarks.probes.norm_host [--no-cprofile]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch
import torch.nn.functional as F

from liger_registry import kernels as K
from liger_registry.kernels.norm import triton_kernels

N, H = 16384, 4096
BF = torch.bfloat16
CALLS = 50
SLEEP_CYCLES = 1_000_000_000  # ~0.5 s at H200 clocks: longer than 50 calls (~10 ms each if they sync)
KERNELS = ("_ln_fwd_kernel", "_ln_bwd_kernel", "_rms_fwd_kernel", "_rms_bwd_kernel", "_sum_parts_kernel")


def _rand(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(BF).requires_grad_()


def cases() -> dict:
    x, w, b = _rand(N, H), _rand(H, scale=0.1), _rand(H)
    dy = torch.randn(N, H, device="cuda").to(BF)
    grads = (x, w, b)

    def clear():
        for t in grads:
            t.grad = None

    def step(fwd):
        def run():
            clear()
            fwd().backward(dy)

        return run

    out = {
        "LayerNorm ours": (lambda: K.layer_norm(x, w, b, 1e-5), step(lambda: K.layer_norm(x, w, b, 1e-5))),
        "RMSNorm ours": (lambda: K.rms_norm(x, w, 1e-6), step(lambda: K.rms_norm(x, w, 1e-6))),
        "LayerNorm eager": (
            lambda: F.layer_norm(x, (H,), w, b, 1e-5),
            step(lambda: F.layer_norm(x, (H,), w, b, 1e-5)),
        ),
    }
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        out["LayerNorm peer"] = (
            lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5),
            step(lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5)),
        )
        out["RMSNorm peer"] = (
            lambda: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True),
            step(lambda: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", True)),
        )
    except Exception as e:  # noqa: BLE001
        print(f"peer unavailable: {e!r}")
    return out


def wall_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


def host_us(fn, calls: int = CALLS, profiler: cProfile.Profile | None = None) -> float:
    """Host microseconds per call with the GPU busy sleeping: no waiting on kernels unless the call syncs."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    if profiler is not None:
        profiler.enable()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    if profiler is not None:
        profiler.disable()
    torch.cuda.synchronize()
    return us


def _field(obj, *names):
    for name in names:
        try:
            value = getattr(obj, name)
        except Exception:  # noqa: BLE001
            continue
        if value is not None:
            return value
    return "?"


def _compiled_kernels(jit_fn):
    """Every compiled specialisation of a triton.jit function (layout differs between triton versions)."""
    caches = getattr(jit_fn, "device_caches", None) or getattr(jit_fn, "cache", None) or {}
    if not isinstance(caches, dict):
        return
    for entry in caches.values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for k in getattr(cache, "values", lambda: [])():
            yield k.result() if hasattr(k, "result") else k


def kernel_table(grids: dict) -> None:
    print(
        f"\n(d) Triton kernels: {'name':<20}{'grid':>16}{'warps':>7}{'stages':>8}{'shared B':>10}{'regs':>6}{'spills':>8}"
    )
    for name in KERNELS:
        for k in _compiled_kernels(getattr(triton_kernels, name, None)):
            try:
                k._init_handles()
            except Exception:  # noqa: BLE001
                pass
            md = getattr(k, "metadata", None)
            print(
                f"{'':<22}{name:<20}{' '.join(map(str, sorted(grids.get(name, ['?'])))):>16}{str(_field(md, 'num_warps')):>7}"
                f"{str(_field(md, 'num_stages')):>8}{str(_field(md, 'shared')):>10}{str(_field(k, 'n_regs')):>6}"
                f"{str(_field(k, 'n_spills')):>8}"
            )


class _GridRecorder:
    """Stands in for a triton.jit function in triton_kernels while the first calls run: records each launch's grid."""

    def __init__(self, fn, name: str, grids: dict):
        self.fn, self.name, self.grids = fn, name, grids

    def __getitem__(self, grid):
        self.grids.setdefault(self.name, set()).add(tuple(grid))
        return self.fn[grid]


def record_grids() -> tuple[dict, object]:
    """Wrap our norm kernels to record their grids; returns (grids, undo)."""
    grids: dict = {}
    originals = {name: getattr(triton_kernels, name) for name in KERNELS if hasattr(triton_kernels, name)}
    for name, fn in originals.items():
        setattr(triton_kernels, name, _GridRecorder(fn, name, grids))

    def undo():
        for name, fn in originals.items():
            setattr(triton_kernels, name, fn)

    return grids, undo


def warp_sweep(all_cases: dict) -> None:
    """(g) The backward kernels alone (GPU-bound) and the fwd+bwd walls at BWD_WARP_FACTOR 1 and 2."""
    x = torch.randn(N, H, device="cuda").to(BF)
    w, b = torch.randn(H, device="cuda").to(BF), torch.randn(H, device="cuda").to(BF)
    dy = torch.randn(N, H, device="cuda").to(BF)
    _, mean, rstd = triton_kernels.layer_norm_fwd(x, w, b, 1e-5)
    _, rrstd = triton_kernels.rms_norm_fwd(x, w, 1e-6, 0.0, "llama")
    print(
        f"\n(g) backward warps: {'factor':>7}{'warps':>7}{'ln bwd ms':>11}{'rms bwd ms':>12}{'LN step ms':>12}{'RMS step ms':>13}"
    )
    default = triton_kernels.BWD_WARP_FACTOR
    try:
        for factor in (1, 2):
            triton_kernels.BWD_WARP_FACTOR = factor
            ln = wall_ms(lambda: triton_kernels.layer_norm_bwd(dy, x, w, mean, rstd, True, True))
            rms = wall_ms(lambda: triton_kernels.rms_norm_bwd(dy, x, w, rrstd, 0.0, "llama", True))
            ln_step, rms_step = wall_ms(all_cases["LayerNorm ours"][1]), wall_ms(all_cases["RMSNorm ours"][1])
            warps = triton_kernels._row_launch(H, factor)[1]
            print(f"{'':<20}{factor:>7}{warps:>7}{ln:11.3f}{rms:12.3f}{ln_step:12.3f}{rms_step:13.3f}")
    finally:
        triton_kernels.BWD_WARP_FACTOR = default


def main() -> None:
    use_cprofile = "--no-cprofile" not in sys.argv
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  N x H = {N} x {H} bf16")
    grids, undo = record_grids()
    all_cases = cases()
    for _fwd, step in all_cases.values():
        step()  # compile, and record the grids
    torch.cuda.synchronize()
    undo()
    print(
        f"\n{'(a) wall / (b) host':<18}{'case':<18}{'wall ms':>9}{'host fwd us':>13}{'host fwd+bwd us':>17}"
    )
    for name, (fwd, step) in all_cases.items():
        wall = wall_ms(step)
        h_fwd = host_us(fwd)
        h_step = host_us(step)
        sync = "  <- waits for the GPU (a sync)" if max(h_fwd, h_step) > 5_000 else ""
        print(f"{'':<18}{name:<18}{wall:9.3f}{h_fwd:13.1f}{h_step:17.1f}{sync}")
    if use_cprofile:
        for name in ("LayerNorm ours", "RMSNorm ours"):
            prof = cProfile.Profile()
            host_us(all_cases[name][1], profiler=prof)
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print(f"\n(c) cProfile, {CALLS} host-issued fwd+bwd calls of {name} (tottime):")
            print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[:6000])
    kernel_table(grids)
    warp_sweep(all_cases)
    from torch.profiler import ProfilerActivity, profile

    for name in ("LayerNorm ours", "RMSNorm ours", "LayerNorm peer"):
        if name not in all_cases:
            continue
        step = all_cases[name][1]
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            torch.cuda.synchronize()
        print(f"\n(e) torch.profiler, 10 fwd+bwd calls of {name}:")
        try:
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        except Exception as e:  # noqa: BLE001
            print("profiler table unavailable:", repr(e))
    # Kineto may leave CUPTI attached after a profiler run (a known torch.profiler behaviour): if these differ from (a)/(b),
    # every timing taken after a profiler in the same process (bench_ops before this change) was inflated.
    print(f"\n(f) after torch.profiler ran: {'case':<18}{'wall ms':>9}{'host fwd+bwd us':>17}")
    for name, (_fwd, step) in all_cases.items():
        print(f"{'':<30}{name:<18}{wall_ms(step):9.3f}{host_us(step):17.1f}")


if __name__ == "__main__":
    main()
