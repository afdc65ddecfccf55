"""Question: Does a patched model called without positions get transformers' packed-sequence mask under torch.compile?
Answer recorded in docs/design/compile.md.

Whether a patched model called without positions gets transformers' packed-sequence mask under torch.compile.

Usage: python -m benchmarks.probes.positions   (CUDA if present, else CPU; the SDPA calls of the compiled forward of
the tiny llama, unpatched then patched, with use_cache=False as in training)
"""

import torch
import transformers

import liger_registry
from liger_registry.testing import compiled_sdpa_masks, tiny_model


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = tiny_model("llama", use_cache=False).to(device)
    ids = torch.randint(0, model.config.vocab_size, (2, 64), device=device)
    batch = {"input_ids": ids, "labels": ids}
    print(f"{device}, torch {torch.__version__}, transformers {transformers.__version__}")
    print("unpatched: SDPA with an explicit mask per layer:", compiled_sdpa_masks(model, batch))
    liger_registry.apply(model)
    print("patched:   SDPA with an explicit mask per layer:", compiled_sdpa_masks(model, batch))


if __name__ == "__main__":
    main()
