"""Ops defined with ``triton_op=True`` (RMSNorm forward and backward): under torch.compile AOT decomposes them into
their Triton kernels, which inductor then sees; eagerly their launches take the bare kernels.

Under Triton's interpreter (the CPU test runs) such an op stays an opaque custom op, so the decomposition is
checked in a process that loads the kernels compiled (no interpreter): AOT only traces them, nothing runs on a
device. What inductor makes of them needs CUDA (the ``gpu`` test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cases import gpu, norm_kernels

from liger_registry.kernels import define

ROOT = Path(__file__).resolve().parents[2]

# Joint forward + backward graph of one compiled RMSNorm call through the op, as AOT traces it; printed as JSON:
# the custom-op nodes left, the Triton kernels of each kernel node, and which output each result is read from.
TRACE = r"""
import json
import sys
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from liger_registry.kernels.norm import op

joint = []


class Traced(Exception):
    pass


def partition(gm, inputs, **kwargs):
    joint.append(gm)
    return default_partition(gm, inputs, **kwargs)


def stop(gm, inputs):
    raise Traced


backend = aot_autograd(fw_compiler=stop, partition_fn=partition)
dynamic = sys.argv[1] == "dynamic"  # every dimension symbolic, the width included
x, w = torch.randn(3, 4, 8, requires_grad=True), torch.randn(8, requires_grad=True)
fn = lambda x, w: op.rms_norm_fwd(x, w, 1e-6, 0.0, "llama", "triton")[0].sum()
f = torch.compile(fn, backend=backend, dynamic=dynamic)
try:
    f(x, w)
except Exception:
    pass
nodes = list(joint[0].graph.nodes)
kernels = {}
for n in nodes:
    if n.op == "call_function" and "triton_kernel_wrapper" in str(n.target):
        name = kernel_side_table.get_kernel(n.kwargs["kernel_idx"]).fn.__name__
        kernels[n.name] = {"kernel": name, "read": sorted({u.args[1] for u in n.users})}
custom = sorted({str(n.target) for n in nodes if "liger_registry" in str(n.target)})
print(json.dumps({"custom": custom, "kernels": list(kernels.values())}))
"""


def test_launches_outside_a_triton_op_take_the_bare_kernel():
    """The eager twin's launches pay no wrapper: traceable() is the kernel itself unless a triton_op's impl runs."""
    assert not define.launches_traced()
    assert define.traceable(norm_kernels._rms_fwd_kernel) is norm_kernels._rms_fwd_kernel


def test_triton_op_needs_a_derived_fake_and_no_mutation():
    def impl(x: torch.Tensor, backend: str) -> torch.Tensor:
        return x.clone()

    with pytest.raises(TypeError, match="triton_op needs a derived fake"):
        define.define_op(
            "test_triton_op_fake", impl, fake=lambda x, backend: x.new_empty(x.shape), triton_op=True
        )
    with pytest.raises(TypeError, match="triton_op needs a derived fake"):
        define.define_op("test_triton_op_mutates", impl, mutates_args=("x",), triton_op=True)


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_compiled_rms_norm_decomposes_into_its_kernels(shapes):
    """Also with symbolic shapes (opcheck's dynamic AOT test, a varying sequence length): the width is
    specialised for the kernels' BLOCK, the rows stay symbolic in the grid."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", TRACE, shapes], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    graph = json.loads(done.stdout.strip().splitlines()[-1])
    assert graph["custom"] == []  # no opaque node left: forward and backward are kernel nodes
    names = [k["kernel"] for k in graph["kernels"]]
    assert names == ["_rms_fwd_kernel", "_rms_bwd_kernel", "_sum_parts_kernel"]
    fwd, bwd, sum_parts = graph["kernels"]
    assert {"Y", "RSTD"} <= set(fwd["read"]) and {"DX", "DW_PART"} <= set(bwd["read"])
    # the weight gradient is read from the output the kernel writes, not from an unwritten alias
    assert "OUT0" in sum_parts["read"] and "OUT1" not in sum_parts["read"]


@gpu
def test_inductor_sees_the_rms_norm_kernels_of_a_patched_model(monkeypatch):
    """A patched tiny Llama compiled by inductor: one graph, no break, RMSNorm's own kernels in the generated code
    (not a fallback to an opaque op), and the step's loss and gradients those of the eager step."""
    from torch._inductor.utils import run_and_get_code

    import liger_registry
    from liger_registry import kernels as K
    from liger_registry.testing import loss_and_grads, tiny_batch, tiny_model

    monkeypatch.setenv(K.ENV_VAR, "auto")
    model = tiny_model("llama").to("cuda").train()
    liger_registry.apply(model)
    # a training call without a padding mask: transformers builds no mask under dynamo for it (compile.md)
    batch = {k: v.to("cuda") for k, v in tiny_batch(model).items() if k != "attention_mask"}
    want_loss, want_grads = loss_and_grads(model, model, batch)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**batch)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(model)
    (loss, grads), code = run_and_get_code(lambda: loss_and_grads(compiled, model, batch))
    source = "\n".join(code)
    for kernel in ("_rms_fwd_kernel", "_rms_bwd_kernel"):
        assert kernel in source, f"{kernel} not in inductor's code"
    assert "liger_registry.rms_norm_fwd" not in source and "liger_registry.rms_norm_bwd" not in source
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-4)
