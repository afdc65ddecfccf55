"""Question: Does a patched model compile into one graph, or where does dynamo break it?
Answer recorded in docs/design/compile.md.

Graph breaks of a patched bench_e2e model under torch.compile (dynamo explain), on the device the run has.

Usage: python -m benchmarks.probes.graph_breaks [--model llama] [--tokens 512]
"""

from __future__ import annotations

import argparse

import torch

from benchmarks import e2e as bench_e2e


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama")
    p.add_argument("--method", default="ours")
    p.add_argument("--tokens", type=int, default=512)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    job = dict(model=args.model, layers=2, tokens=args.tokens, method=args.method, smoke=not cuda, batch=1)
    job["dtype"] = torch.bfloat16 if cuda else torch.float32
    model, _ = bench_e2e.build_model(job, "cuda" if cuda else "cpu")
    bench_e2e.patch(job, model)
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), device=model.device)
    explained = torch._dynamo.explain(model)(input_ids=ids, labels=ids)
    print(
        f"{args.method} {args.model}: {explained.graph_count} graph(s), {explained.graph_break_count} break(s)"
    )
    for reason in explained.break_reasons:
        where = reason.user_stack[-1] if reason.user_stack else "?"
        print(f"  break: {reason.reason[:240]}\n    at {where}")


if __name__ == "__main__":
    main()
