"""Question: How many host microseconds of Python does an RMSNorm call spend around its kernel launch?
Answer recorded in docs/design/norm-host-overhead.md.

CPU host time per call (no GPU): the Triton backend forced (``LIGER_REGISTRY_BACKEND=triton``, the kernels loaded
in interpreter mode so the rule admits CPU tensors) and the launchers stubbed by functions that only allocate the
outputs the real launchers allocate, so what is timed is everything a CUDA call does on the host except the
launch itself: the module forward, the argument checks, the backend decision, the autograd Function (or the custom
op) and the backward. Tiny tensors (8 x 64 fp32); the process's CPU time per call (``time.process_time``: time
other processes take from this one's core is not counted), the least of ``--rounds`` rounds of ``--calls`` calls.
Rows: the stubbed launch alone, ``x * w`` forward + backward (what ``backward(dy)`` and one autograd node cost
whatever the op), ``kernels.rms_norm`` forward and forward + backward, the patched
``LlamaRMSNorm`` module forward and forward + backward, the custom op called directly (the dispatcher's cost),
and the same with ``add_rms_norm``.
Usage: python -m benchmarks.probes.norm_host_cpu [--calls 10000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time

# before triton and the package are imported: the rule admits CPU tensors only for interpreter-loaded kernels
os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

ROWS, COLS = 8, 64


def _stub_launchers():
    """The norm launchers replaced by allocation-only stubs (the real ones allocate the same outputs)."""
    from liger_registry.kernels.norm import triton_kernels as tk

    def rms_fwd(x, weight, eps, offset, casting_mode):
        n = x.numel() // x.shape[-1]
        y = torch.empty(x.shape, dtype=tk.norm_out_dtype(x.dtype, weight, casting_mode))
        return y, torch.empty(n, dtype=torch.float32)

    def rms_bwd(dy, x, weight, rstd, offset, casting_mode, need_dw, in_place=False):
        dw = torch.empty_like(weight) if need_dw and weight is not None else None
        return torch.empty_like(x), dw

    def add_fwd(x, residual, weight, eps, offset, casting_mode):
        n = x.numel() // x.shape[-1]
        return torch.empty_like(x), torch.empty_like(x), torch.empty(n, dtype=torch.float32)

    def add_bwd(dy, ds, s, weight, rstd, offset, casting_mode, need_dw):
        dw = torch.empty_like(weight) if need_dw and weight is not None and dy is not None else None
        return torch.empty_like(s), dw

    saved = {
        name: getattr(tk, name)
        for name in (
            "launch_rms_norm_fwd",
            "launch_rms_norm_bwd",
            "launch_add_rms_norm_fwd",
            "launch_add_rms_norm_bwd",
        )
    }
    tk.launch_rms_norm_fwd, tk.launch_rms_norm_bwd = rms_fwd, rms_bwd
    tk.launch_add_rms_norm_fwd, tk.launch_add_rms_norm_bwd = add_fwd, add_bwd
    return saved, rms_fwd


def _module():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from liger_registry.modules.norm import rms_norm_forward
    from liger_registry.schemas import RmsNormSpec

    module = LlamaRMSNorm(COLS, 1e-6)
    forward = rms_norm_forward(RmsNormSpec(targets=["LlamaRMSNorm"], casting_mode="llama", offset=0.0))
    module.forward = forward.__get__(module)
    return module


def cases(stub_fwd) -> dict:
    from liger_registry import kernels as K

    x = torch.randn(ROWS, COLS, requires_grad=True)
    r = torch.randn(ROWS, COLS, requires_grad=True)
    w = torch.randn(COLS, requires_grad=True)
    dy = torch.randn(ROWS, COLS)
    xd, wd = x.detach(), w.detach()
    module = _module()
    custom = torch.ops.liger_registry.rms_norm_fwd

    def step(fwd, grads):
        def run():
            for t in grads:
                t.grad = None
            fwd().backward(dy)

        return run

    def add_step():
        x.grad = r.grad = w.grad = None
        s, y = K.add_rms_norm(x, r, w, 1e-6)
        torch.autograd.backward((s, y), (dy, dy))

    return {
        "stubbed launch alone": lambda: stub_fwd(xd, wd, 1e-6, 0.0, "llama"),
        "torch x * w fwd+bwd (floor)": step(lambda: x * w, (x, w)),
        "rms_norm fwd (no grad)": lambda: K.rms_norm(xd, wd, 1e-6),
        "rms_norm fwd": lambda: K.rms_norm(x, w, 1e-6),
        "rms_norm fwd+bwd": step(lambda: K.rms_norm(x, w, 1e-6), (x, w)),
        "LlamaRMSNorm patched fwd": lambda: module(x),
        "LlamaRMSNorm patched fwd+bwd": step(lambda: module(x), (x, module.weight)),
        "custom op fwd (dispatcher)": lambda: custom(x, w, 1e-6, 0.0, "llama", "triton"),
        "custom op fwd+bwd (dispatcher)": step(lambda: custom(x, w, 1e-6, 0.0, "llama", "triton")[0], (x, w)),
        "add_rms_norm fwd+bwd": add_step,
    }


def host_us(fn, calls: int, rounds: int) -> float:
    for _ in range(min(calls, 200)):
        fn()
    per_round = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        per_round.append((time.process_time() - t0) / calls * 1e6)
    return min(per_round)


def measure(calls: int = 10000, rounds: int = 5) -> dict[str, float]:
    """``{case: host us per call}`` with the launchers stubbed and the Triton backend forced; restores both."""
    from liger_registry.kernels.backend import ENV_VAR
    from liger_registry.kernels.norm import triton_kernels as tk

    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = "triton"
    saved, stub_fwd = _stub_launchers()
    try:
        return {name: host_us(fn, calls, rounds) for name, fn in cases(stub_fwd).items()}
    finally:
        for name, fn in saved.items():
            setattr(tk, name, fn)
        if before is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = before


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    print(f"CPU host us per call, launch stubbed, {ROWS}x{COLS} fp32, torch {torch.__version__}")
    for name, us in measure(args.calls, args.rounds).items():
        print(f"  {name:<32} {us:8.2f} us", flush=True)


if __name__ == "__main__":
    main()
