"""Question: How many host microseconds does each launch of the FLCE vocabulary loop's pass 2 cost?
Answer recorded in docs/design/flce-layouts.md.

Host microseconds per call of each step of the FLCE vocab loop's pass 2 (queued behind a GPU sleep, so no
waiting on the GPU), at GPT-OSS's 2048-token chunk shape, and of the alternatives for the fp32 dX sum."""

from __future__ import annotations

import time

import torch

from liger_registry.kernels.flce.options import FlceOptions
from liger_registry.kernels.flce.reference import RowCoefs
from liger_registry.kernels.flce.triton_kernels import grad_inplace_triton


def host_us(fn, n=100) -> float:
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return us


def main() -> None:
    bt, h, w = 2048, 2880, 3072
    x = torch.randn(bt, h, device="cuda").bfloat16()
    wt = torch.randn(w * 4, h, device="cuda").bfloat16()
    buf = torch.randn(bt, w, device="cuda").bfloat16()
    acc = torch.zeros(bt, h, device="cuda")
    tmp16 = torch.empty(bt, h, device="cuda", dtype=torch.bfloat16)
    dw = torch.empty(w * 4, h, device="cuda").bfloat16()
    target = torch.randint(0, w, (bt,), device="cuda")
    coefs = RowCoefs(*(torch.rand(bt, device="cuda") for _ in range(4)))
    opts = FlceOptions()
    wc = wt[w : 2 * w]
    calls = {
        "mm logits out=buf": lambda: torch.mm(x, wc.t(), out=buf),
        "grad kernel": lambda: grad_inplace_triton(buf, 0, target, coefs, opts=opts, class_weights=None),
        "addmm out_dtype fp32 into acc": lambda: torch.addmm(
            acc, buf, wc, beta=1.0, out_dtype=torch.float32, out=acc
        ),
        "mm bf16 tmp + acc.add_": lambda: (torch.mm(buf, wc, out=tmp16), acc.add_(tmp16)),
        "mm out_dtype fp32 (new tensor)": lambda: torch.mm(buf, wc, out_dtype=torch.float32),
        "mm dW out=slice": lambda: torch.mm(buf.t(), x, out=dw[w : 2 * w]),
        "addmm_ (bf16 acc, in place)": lambda: tmp16.addmm_(buf, wc),
        "empty(1)": lambda: torch.empty(1, device="cuda"),
    }
    for name, fn in calls.items():
        try:
            print(f"{name:<34} {host_us(fn):8.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:<34} failed: {e!r}"[:200], flush=True)


if __name__ == "__main__":
    main()
