"""Whether a patched model called without positions gets transformers' packed-sequence mask, eager and compiled.

Usage: python benchmarks/probe_positions.py   (CUDA if present, else CPU; prints the SDPA calls of the compiled
forward of a small llama, unpatched then patched, with use_cache=False as in training)
"""

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

import liger_registry


def sdpa_masks(model, ids) -> list[bool]:
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=capture)(input_ids=ids, labels=ids)
    return [
        node.kwargs.get("attn_mask") is not None
        for gm in graphs
        for node in gm.graph.nodes
        if "scaled_dot_product" in str(node.target)
    ]


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        use_cache=False,
    )
    model = LlamaForCausalLM(config).to(device)
    ids = torch.randint(0, 512, (2, 64), device=device)
    print(f"{device}, torch {torch.__version__}, transformers {transformers.__version__}")
    print("unpatched: SDPA with an explicit mask per layer:", sdpa_masks(model, ids))
    liger_registry.apply(model)
    print("patched:   SDPA with an explicit mask per layer:", sdpa_masks(model, ids))


if __name__ == "__main__":
    main()
