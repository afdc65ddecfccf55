"""``python -m benchmarks <name> [args]`` runs one bench; ``python -m benchmarks --list`` names them."""

from __future__ import annotations

import importlib
import sys

# name -> (module, one line); the module's main(argv) takes the bench's own arguments
BENCHES = {
    "ops": (
        "benchmarks.ops",
        "memory-bound ops (norms, RoPE, GLU, cross entropy) against liger-kernel and eager",
    ),
    "flce": (
        "benchmarks.flce",
        "fused linear cross entropy against the dense-GEMM floor, peers and unpatched; --strategies, --plan-table",
    ),
    "moe": (
        "benchmarks.moe",
        "MoE experts (grouped GEMM) against transformers, liger-kernel and dense; --llama4",
    ),
    "e2e": ("benchmarks.e2e", "training steps of 2-4 layer cuts, one process per configuration"),
    "step": ("benchmarks.step", "training steps of real configurations at realistic depth, loss check, MFU"),
    "distributed": ("benchmarks.distributed", "FSDP2 / DDP training steps under torchrun, patched and not"),
    "compile": (
        "benchmarks.compile",
        "every family's tiny model under torch.compile (inductor) against eager",
    ),
    "rl_head": (
        "benchmarks.rl_head",
        "per-token log-probs + entropy of the head at GRPO shapes: ours, TRL's fused head, liger, full logits",
    ),
}


def usage() -> str:
    width = max(map(len, BENCHES))
    lines = ["usage: python -m benchmarks <name> [args]   (python -m benchmarks <name> --help)", ""]
    lines += [f"  {name:<{width}}  {line}" for name, (_, line) in BENCHES.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in BENCHES:
        print(f"unknown bench {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHES[name][0])
    sys.argv = [f"python -m benchmarks {name}", *rest]  # argparse's usage line names the entry point
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
