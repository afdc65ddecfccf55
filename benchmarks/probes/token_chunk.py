"""Question: Where does one token chunk of the FLCE token strategy spend its time, against the 3-GEMM floor?
Answer recorded in docs/design/flce-layouts.md.

Where one token chunk of the FLCE token strategy spends its time.

Per chunk size: the logits GEMM, the row kernel (loss + in-place gradient), the dX GEMM, the dW GEMM written
(first chunk) and accumulated (bf16 read-modify-write; fp32 accumulator), each timed alone (median of the harness),
plus variants of the dX GEMM (transposed output, split over the vocabulary). The 3-GEMM floor at the full BT is
timed in the same process (the row kernels' statistics pass per choice: benchmarks.probes.row_stats). JSON under $OUT (else benchmarks/results/).

Usage: python -m benchmarks.probes.token_chunk [--shape gpt_oss] [--bt 8192] [--chunks 1024,1280]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness import median_ms, write_probe
from benchmarks.probes.row_stats import ce_rows_call

SHAPES = {"llama": (4096, 128256), "gpt_oss": (2880, 201088)}


def floor_ms(x, w) -> dict:
    n, v = x.shape[0], w.shape[0]
    logits = torch.empty(n, v, dtype=x.dtype, device=x.device)
    dx = torch.empty_like(x)
    dw = torch.empty_like(w)
    return {
        "logits": median_ms(lambda: torch.mm(x, w.t(), out=logits)),
        "dx": median_ms(lambda: torch.mm(logits, w, out=dx)),
        "dw": median_ms(lambda: torch.mm(logits.t(), x, out=dw)),
    }


def chunk_ms(x, w, t, c: int) -> dict:
    v, h = w.shape
    xc, tc = x[:c], t[:c]
    buf = torch.randn(c, v, device=x.device).to(x.dtype)
    dh = torch.empty(c, h, dtype=x.dtype, device=x.device)
    dw = torch.zeros_like(w)
    dw32 = torch.zeros(w.shape, dtype=torch.float32, device=x.device)
    dh32 = torch.zeros(c, h, dtype=torch.float32, device=x.device)
    rows = ce_rows_call(buf, tc)

    half = v // 2

    def dx_split():
        torch.mm(buf[:, :half], w[:half], out_dtype=torch.float32, out=dh32)
        torch.addmm(dh32, buf[:, half:], w[half:], out_dtype=torch.float32, out=dh32)

    def dw_fp32():
        torch.addmm(dw32, buf.t(), xc, out_dtype=torch.float32, out=dw32)

    out = {
        "logits": median_ms(lambda: torch.mm(xc, w.t(), out=buf)),
        "rows": median_ms(rows),
        "dx": median_ms(lambda: torch.mm(buf, w, out=dh)),
        "dx_transposed": median_ms(lambda: torch.mm(w.t(), buf.t())),
        "dw_write": median_ms(lambda: torch.mm(buf.t(), xc, out=dw)),
        "dw_rmw_bf16": median_ms(lambda: dw.addmm_(buf.t(), xc)),
    }
    for name, fn in (("dx_split2_fp32", dx_split), ("dw_rmw_fp32", dw_fp32)):
        try:
            out[name] = median_ms(fn)
        except (TypeError, RuntimeError) as e:
            out[name] = repr(e)[:120]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="gpt_oss")
    p.add_argument("--bt", type=int, default=8192)
    p.add_argument("--chunks", default="1024,1280")
    args = p.parse_args()
    h, v = SHAPES[args.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.02).bfloat16()
    x = torch.randn(args.bt, h, device="cuda", generator=g).bfloat16()
    t = torch.randint(0, v, (args.bt,), device="cuda", generator=g)
    res = {"shape": args.shape, "bt": args.bt, "floor": floor_ms(x, w), "chunks": {}}
    fl = res["floor"]
    print(
        f"{args.shape} BT {args.bt} floor ms: " + " ".join(f"{k} {m:.3f}" for k, m in fl.items()), flush=True
    )
    for c in (int(s) for s in args.chunks.split(",")):
        r = chunk_ms(x, w, t, c)
        res["chunks"][c] = r
        k = args.bt / c
        base = r["logits"] + r["rows"] + r["dx"] + r["dw_rmw_bf16"]
        print(
            f"chunk {c} (x{k:.2f}): "
            + " ".join(f"{n} {m:.3f}" if isinstance(m, float) else f"{n} {m}" for n, m in r.items())
            + f" | per-chunk sum {base:.3f}, x{k:.2f} = {base * k:.2f} ms; floor share per chunk "
            f"{sum(fl.values()) / k:.3f}",
            flush=True,
        )
    write_probe("token_chunk", res, tag=args.shape)


if __name__ == "__main__":
    main()
