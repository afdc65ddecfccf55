"""Distributed training benchmark: patched vs unpatched Llama- and GPT-OSS-shaped models under FSDP2 and DDP.

One command for any world size (it starts torchrun itself, one process per GPU):

    python -m benchmarks distributed --nproc 2            # all GPUs: --nproc $(nvidia-smi -L | wc -l)
    python -m benchmarks distributed --smoke              # CPU, gloo, 2 processes: checks the script

Random init, bf16, a few layers at realistic width, vocabulary 128256; the same seed and batches for the patched
and the unpatched run. Per step: the loss on every rank; per run: peak memory per GPU and tokens/s (steps after
the warm-up). NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1), also in the environment of the processes torchrun starts. The table is printed last;
the JSON goes to --out.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys

from benchmarks import harness

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
VOCAB = 128256

SHAPES = {
    # Llama-3-8B widths, cut to a few layers
    "llama": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
    # GPT-OSS-20B widths (32 experts, top-4), cut to a few layers
    "gpt_oss": dict(
        hidden_size=2880,
        intermediate_size=2880,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=32,
        num_experts_per_tok=4,
        sliding_window=128,
        tie_word_embeddings=False,
    ),
}
# --smoke: the same code path on CPU (gloo) with tiny widths, to check the script without a GPU
SMOKE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_local_experts=4,
    num_experts_per_tok=2,
)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--nproc", type=int, default=None, help="processes (one per GPU); default: every visible GPU"
    )
    p.add_argument("--models", default="llama,gpt_oss")
    p.add_argument("--wrappers", default="fsdp2,ddp")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    p.add_argument("--batch", type=int, default=1, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-4)
    harness.add_out_arg(p)
    p.add_argument(
        "--smoke", action="store_true", help="CPU, gloo, tiny widths: checks the script, measures nothing"
    )
    return p.parse_args(argv)


def launch(args: argparse.Namespace, argv: list[str]) -> int:
    """Re-run this module under torchrun with multicast off in every child's environment."""
    import torch

    nproc = args.nproc or (2 if args.smoke else max(torch.cuda.device_count(), 1))
    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
    forwarded, skip = (
        [],
        False,
    )  # --nproc is for this launcher only (torchrun would take it for its own option)
    for arg in argv:
        if skip or arg.startswith("--nproc="):
            skip = False
            continue
        skip = arg == "--nproc"
        if not skip:
            forwarded.append(arg)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "benchmarks.distributed",
    ]
    command += forwarded
    print("+", " ".join(command), flush=True)
    return subprocess.call(command, env=env, cwd=harness.ROOT)


def build(name: str, layers: int, device, smoke: bool = False):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {**SHAPES[name], **({k: v for k, v in SMOKE.items() if k in SHAPES[name]} if smoke else {})}
    config = AutoConfig.for_model(name, vocab_size=VOCAB, num_hidden_layers=layers, **shape)
    if name == "gpt_oss":
        config.layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    config._attn_implementation = "sdpa" if name == "llama" else "eager"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model


def wrap(model, wrapper: str, local_rank: int):
    import torch

    if wrapper == "ddp":
        return torch.nn.parallel.DistributedDataParallel(
            model, device_ids=None if local_rank is None else [local_rank]
        )
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    return fully_shard(model)


def training_step(wrapped, optimizer, batches, device):
    """Step i: forward and backward on batch i, the optimizer's step; returns the loss."""

    def one(step: int) -> float:
        ids = batches[step].to(device, non_blocking=True)
        loss = wrapped(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().float().item()

    return one


def run_one(name: str, wrapper: str, patched: bool, args, rank: int, world: int, local_rank: int) -> dict:
    import torch

    import liger_registry as L

    cuda = not args.smoke
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.empty_cache()
    model = build(name, args.layers, device, args.smoke)
    handle = L.apply(model) if patched else None
    model.train()
    wrapped = wrap(model, wrapper, local_rank if cuda else None)
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, foreach=True)
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)  # each rank its own data, same for both runs
    batches = [torch.randint(0, VOCAB, (args.batch, args.seq), generator=gen) for _ in range(args.steps)]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = harness.time_steps(training_step(wrapped, optimizer, batches, device), args.steps, cuda)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0
    if handle is not None:
        handle.revert()
    del wrapped, model, optimizer
    median = harness.steady_median(times, args.warmup)
    return {
        "losses": losses,
        "peak_gib": peak,
        "tokens_per_s": args.batch * args.seq / median,
        "median_step_s": median,
    }


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    if args.smoke:
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = []
    for name in args.models.split(","):
        for wrapper in args.wrappers.split(","):
            for patched in (False, True):
                try:
                    mine = run_one(name, wrapper, patched, args, rank, world, local_rank)
                except torch.cuda.OutOfMemoryError as exc:
                    mine = {"error": f"OOM: {exc}"[:300]}
                every = [None] * world
                dist.all_gather_object(every, mine)
                results.append({"model": name, "wrapper": wrapper, "patched": patched, "ranks": every})
                if rank == 0:
                    print(f"done {name} {wrapper} {'patched' if patched else 'unpatched'}", flush=True)
    if rank == 0:
        report(results, args, world)
    gc.collect()  # FSDP's reference cycles hold gloo work; freed at interpreter shutdown they abort the rank
    dist.destroy_process_group()


def report(results: list[dict], args: argparse.Namespace, world: int) -> None:
    import torch

    import liger_registry

    meta = {
        "world_size": world,
        "layers": args.layers,
        "steps": args.steps,
        "warmup": args.warmup,
        "batch_per_rank": args.batch,
        "seq": args.seq,
        "vocab": VOCAB,
        "dtype": "bfloat16",
        "torch": torch.__version__,
        "device": "cpu (smoke)" if args.smoke else torch.cuda.get_device_name(),
        "liger_registry": liger_registry.__version__,
    }
    rows = []
    out = harness.Results(
        "distributed",
        args.out,
        env=harness.capture_env("cpu" if args.smoke else meta["device"]),
        tag=f"ws{world}",
    )
    for ref in (r for r in results if not r["patched"]):
        mine = next(
            r
            for r in results
            if r["patched"] and r["model"] == ref["model"] and r["wrapper"] == ref["wrapper"]
        )
        if any("error" in x for x in ref["ranks"] + mine["ranks"]):
            rows.append([ref["model"], ref["wrapper"]] + [None] * 6 + ["error"])
            continue
        diff = max(
            abs(a - b)
            for u, p in zip(ref["ranks"], mine["ranks"], strict=True)
            for a, b in zip(u["losses"], p["losses"], strict=True)
        )
        tps_u = sum(x["tokens_per_s"] for x in ref["ranks"])
        tps_p = sum(x["tokens_per_s"] for x in mine["ranks"])
        mem_u = max(x["peak_gib"] for x in ref["ranks"])
        mem_p = max(x["peak_gib"] for x in mine["ranks"])
        last = f"{ref['ranks'][0]['losses'][-1]:.4f} / {mine['ranks'][0]['losses'][-1]:.4f}"
        rows.append([ref["model"], ref["wrapper"], tps_u, tps_p, tps_p / tps_u, mem_u, mem_p, last, diff])
        case = f"{ref['model']} {ref['wrapper']} ws{world}"
        for method, tps, mem in (("unpatched", tps_u, mem_u), ("patched", tps_p, mem_p)):
            out.add(case, method, "tokens_per_s", tps)
            out.add(case, method, "peak_gib", mem)
    path = out.write({"meta": meta, "runs": results})
    print("\nper-step losses (rank 0):")
    for r in results:
        if "error" not in r["ranks"][0]:
            tag = "patched  " if r["patched"] else "unpatched"
            print(
                f"  {r['model']:8} {r['wrapper']:5} {tag} "
                + " ".join(f"{x:.4f}" for x in r["ranks"][0]["losses"])
            )
    columns = [
        ("model", ""),
        ("wrapper", ""),
        ("tok/s unpatched", ",.0f"),
        ("tok/s patched", ",.0f"),
        ("speedup", ".2f"),
        ("peak GiB/GPU unp.", ".2f"),
        ("peak GiB/GPU pat.", ".2f"),
        ("last loss unp. / pat.", ">"),
        ("max |dloss|", ".4f"),
    ]
    title = (
        f"world size {world}, {args.layers} layers, {args.batch}x{args.seq} tokens per rank per step, "
        f"{args.steps} steps (tokens/s: median step after {args.warmup}, summed over ranks); JSON: {path}"
    )
    harness.print_table(columns, rows, title)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    for key, value in NO_MULTICAST.items():
        os.environ[key] = value
    if "LOCAL_RANK" not in os.environ:
        return launch(args, argv)
    worker(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
