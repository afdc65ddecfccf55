"""torch.library.opcheck of every ``liger_registry`` custom op x backend x the layouts models pass.

Each op's fake must give the real output's shape, dtype and strides (inductor asserts them), its autograd
registration must hold and its AOT-dispatched result and gradients must match eager. The layouts are those the
patched models pass: transposed views (attention's q/k, a seq-first batch), rows with a stride larger than the
row (a half of a fused projection, a slice of a wider buffer), broadcast and per-batch cos/sin, 3-D and 2-D.

Backends: ``torch`` (the PyTorch formulas) and ``triton`` (on CPU through the interpreter, on a GPU compiled).
Ops without a backend argument (in-place scales, the Triton-only variants) run once. The number of cases
(ops x backends x layouts) is printed by ``test_every_custom_op_is_checked`` (``-s``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from liger_registry.kernels import triton_utils
from liger_registry.kernels.flce.options import FlceOptions, FlceRun

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TRITON_RUNS = DEVICE == "cuda" or triton_utils.INTERPRET_AT_IMPORT
OPS = torch.ops.liger_registry
BOTH = ("torch", "triton")
ONE = ("-",)  # no backend argument: the op runs one implementation


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rand(*shape, seed=0, dtype=torch.float32, grad=False):
    t = torch.randn(*shape, generator=_g(seed)).to(device=DEVICE, dtype=dtype)
    return t.requires_grad_(grad)


# ---------------------------------------------------------------- layouts of a [..., n] activation
def contiguous(shape, seed=0, grad=False, dtype=torch.float32):
    return rand(*shape, seed=seed, grad=grad, dtype=dtype)


def transposed(shape, seed=0, grad=False, dtype=torch.float32):
    """A dense view with the first two dims swapped in memory (seq-first [S, B, H] seen as [B, S, H])."""
    base = rand(shape[1], shape[0], *shape[2:], seed=seed, dtype=dtype)
    return base.transpose(0, 1).detach().requires_grad_(grad)


def strided_rows(shape, seed=0, grad=False, dtype=torch.float32):
    """Rows whose stride is twice their length (one half of a fused projection)."""
    base = rand(*shape[:-1], 2 * shape[-1], seed=seed, dtype=dtype)
    return base[..., : shape[-1]].detach().requires_grad_(grad)


ROW_LAYOUTS: dict[str, Callable] = {
    "2d": lambda shape, **kw: contiguous((shape[0] * shape[1], shape[2]), **kw),
    "3d": contiguous,
    "3d-transposed": transposed,
    "3d-strided-rows": strided_rows,
    "2d-strided-rows": lambda shape, **kw: strided_rows((shape[0] * shape[1], shape[2]), **kw),
}
ROW_SHAPE = (2, 3, 24)


# ---------------------------------------------------------------- layouts of attention's q / k [B, H, S, D]
B, HQ, HK, S, D = 2, 4, 2, 5, 8


def _qk(layout: str, grad: bool, head_dim: int = D):
    d = head_dim
    if layout == "contiguous":
        return rand(B, HQ, S, d, seed=1, grad=grad), rand(B, HK, S, d, seed=2, grad=grad)
    if layout == "transposed":  # [B, S, H, D] projections viewed heads-first: every attention layer
        return (
            rand(B, S, HQ, d, seed=1).transpose(1, 2).detach().requires_grad_(grad),
            rand(B, S, HK, d, seed=2).transpose(1, 2).detach().requires_grad_(grad),
        )
    if layout == "fused-qkv":  # q and k sliced from one [B, S, (HQ + 2 HK) * D] projection: non-dense
        qkv = rand(B, S, (HQ + 2 * HK) * d, seed=3)
        q = qkv[..., : HQ * d].view(B, S, HQ, d).transpose(1, 2)
        k = qkv[..., HQ * d : (HQ + HK) * d].view(B, S, HK, d).transpose(1, 2)
        return q.detach().requires_grad_(grad), k.detach().requires_grad_(grad)
    raise ValueError(layout)


def _cos_sin(kind: str, width: int = D):
    if kind == "broadcast":
        return rand(1, S, width, seed=4), rand(1, S, width, seed=5)
    if kind == "per-batch":
        return rand(B, S, width, seed=4), rand(B, S, width, seed=5)
    if kind == "expanded":  # one row of positions expanded over the batch: batch stride 0
        return rand(1, S, width, seed=4).expand(B, S, width), rand(1, S, width, seed=5).expand(B, S, width)
    raise ValueError(kind)


QK_LAYOUTS = ("contiguous", "transposed", "fused-qkv")
COS_LAYOUTS = ("broadcast", "per-batch", "expanded")
# q/k strides and cos/sin strides are separate kernel arguments with no branch on their combination: every q/k
# layout with broadcast tables, and every table layout with transposed q/k, reach each layout's path.
QK_COS_PAIRS = tuple((qk, "broadcast") for qk in QK_LAYOUTS) + tuple(
    ("transposed", cs) for cs in COS_LAYOUTS if cs != "broadcast"
)
# the 2-D and odd-width tables are read through the same stride arguments: the non-dense q/k layouts alternate
TABLE_QK_LAYOUTS = ("transposed", "fused-qkv")


# ---------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    op: str
    layout: str
    backends: tuple[str, ...]
    make: Callable[[str], tuple]  # backend -> the op's arguments
    test_utils: tuple[str, ...] | None = None  # opcheck's checks (None: all of them)

    @property
    def id(self) -> str:
        return f"{self.op}-{self.layout}"


def _norm_cases() -> list[Case]:
    cases = []
    for name, layout in ROW_LAYOUTS.items():

        def rms(backend, layout=layout, mode="llama"):
            return (
                layout(ROW_SHAPE, grad=True),
                rand(ROW_SHAPE[-1], seed=1, grad=True),
                1e-6,
                0.0,
                mode,
                backend,
            )

        def rms_bwd(backend, layout=layout):
            x = layout(ROW_SHAPE)
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6).reshape(-1)
            dy = layout(ROW_SHAPE, seed=2)
            return (dy, x, rand(ROW_SHAPE[-1], seed=1), rstd, 1e-6, 0.0, "llama", True, backend)

        def rms_bwd_inplace(_backend, layout=layout):
            x = layout(ROW_SHAPE)
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6).reshape(-1)
            return (contiguous(x.shape, seed=2), x, rand(ROW_SHAPE[-1], seed=1), rstd, 0.0, "llama", True)

        def ln(backend, layout=layout):
            h = ROW_SHAPE[-1]
            return (
                layout(ROW_SHAPE, grad=True),
                rand(h, seed=1, grad=True),
                rand(h, seed=2, grad=True),
                1e-5,
                backend,
            )

        def ln_bwd(backend, layout=layout):
            x = layout(ROW_SHAPE)
            xf = x.float().reshape(-1, x.shape[-1])
            var, mean = torch.var_mean(xf, -1, unbiased=False)
            h = ROW_SHAPE[-1]
            dy = layout(ROW_SHAPE, seed=3)
            w, b = rand(h, seed=1), rand(h, seed=2)
            return (dy, x, w, b, mean, torch.rsqrt(var + 1e-5), 1e-5, True, True, backend)

        cases += [
            Case("rms_norm_fwd", name, BOTH, rms),
            Case("rms_norm_bwd", name, BOTH, rms_bwd),
            Case("rms_norm_bwd_", name, ("triton",), rms_bwd_inplace),
            Case("layer_norm_fwd", name, BOTH, ln),
            Case("layer_norm_bwd", name, BOTH, ln_bwd),
        ]

    def rms_bf16_gemma(backend):
        x = contiguous(ROW_SHAPE, grad=True, dtype=torch.bfloat16)
        return (x, rand(ROW_SHAPE[-1], seed=1, grad=True), 1e-6, 1.0, "gemma", backend)

    def rms_bf16_llama(backend):  # a bf16 activation times an fp32 weight: the result is promoted
        x = transposed(ROW_SHAPE, grad=True, dtype=torch.bfloat16)
        return (x, rand(ROW_SHAPE[-1], seed=1, grad=True), 1e-6, 0.0, "llama", backend)

    cases += [
        Case("rms_norm_fwd", "3d-bf16-gemma", BOTH, rms_bf16_gemma),
        Case("rms_norm_fwd", "3d-transposed-bf16-fp32-weight", BOTH, rms_bf16_llama),
    ]
    return cases + _weightless_norm_cases()


def _weightless_norm_cases() -> list[Case]:
    """``weight=None`` (no elementwise affine): the schema's optional weight, an empty weight gradient."""
    cases = []
    for name in ("3d-transposed", "2d-strided-rows"):
        layout = ROW_LAYOUTS[name]
        for mode in ("llama", "gemma", "none"):

            def rms(backend, layout=layout, mode=mode):
                return (layout(ROW_SHAPE, grad=True), None, 1e-6, 0.0, mode, backend)

            cases.append(Case("rms_norm_fwd", f"{name}-no-weight-{mode}", BOTH, rms))

        def rms_bwd(backend, layout=layout):
            x = layout(ROW_SHAPE)
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6).reshape(-1)
            return (layout(ROW_SHAPE, seed=2), x, None, rstd, 1e-6, 0.0, "llama", True, backend)

        def rms_bwd_inplace(_backend, layout=layout):
            x = layout(ROW_SHAPE)
            rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6).reshape(-1)
            return (contiguous(x.shape, seed=2), x, None, rstd, 0.0, "gemma", True)

        def add_rms(_backend, layout=layout):
            return (layout(ROW_SHAPE), layout(ROW_SHAPE, seed=1), None, 1e-6, 0.0, "llama")

        def add_rms_bwd(_backend, layout=layout):
            s = layout(ROW_SHAPE)
            rstd = torch.rsqrt(s.float().pow(2).mean(-1) + 1e-6).reshape(-1)
            return (layout(ROW_SHAPE, seed=1), layout(ROW_SHAPE, seed=2), s, None, rstd, 0.0, "gemma", True)

        cases += [
            Case("rms_norm_bwd", f"{name}-no-weight", BOTH, rms_bwd),
            Case("rms_norm_bwd_", f"{name}-no-weight", ("triton",), rms_bwd_inplace),
            Case("add_rms_norm_fwd", f"{name}-no-weight", TRITON, add_rms),
            Case("add_rms_norm_bwd", f"{name}-no-weight", TRITON, add_rms_bwd),
        ]

    def rms_bf16(backend):  # no weight to promote with: the output keeps x's dtype
        return (transposed(ROW_SHAPE, grad=True, dtype=torch.bfloat16), None, 1e-6, 0.0, "llama", backend)

    cases.append(Case("rms_norm_fwd", "3d-transposed-bf16-no-weight", BOTH, rms_bf16))
    return cases + _weightless_layer_norm_cases()


def _weightless_layer_norm_cases() -> list[Case]:
    """LayerNorm with ``weight=None`` and ``bias=None`` (OlmoLayerNorm), and with a weight but no bias
    (CohereLayerNorm): the schema's optional weight, empty weight and bias gradients."""
    cases = []
    for name in ("3d-transposed", "2d-strided-rows"):
        layout = ROW_LAYOUTS[name]
        for label, with_weight in (("no-weight", False), ("no-bias", True)):

            def ln(backend, layout=layout, with_weight=with_weight):
                w = rand(ROW_SHAPE[-1], seed=1, grad=True) if with_weight else None
                return (layout(ROW_SHAPE, grad=True), w, None, 1e-5, backend)

            def ln_bwd(backend, layout=layout, with_weight=with_weight):
                x = layout(ROW_SHAPE)
                var, mean = torch.var_mean(x.float().reshape(-1, x.shape[-1]), -1, unbiased=False)
                w = rand(ROW_SHAPE[-1], seed=1) if with_weight else None
                rstd = torch.rsqrt(var + 1e-5)
                return (layout(ROW_SHAPE, seed=3), x, w, None, mean, rstd, 1e-5, with_weight, False, backend)

            cases += [
                Case("layer_norm_fwd", f"{name}-{label}", BOTH, ln),
                Case("layer_norm_bwd", f"{name}-{label}", BOTH, ln_bwd),
            ]
    return cases


def _rope_cases() -> list[Case]:
    cases = []
    for qk, cs in QK_COS_PAIRS:
        for backward in (False, True):

            def make(backend, qk=qk, cs=cs, backward=backward):
                q, k = _qk(qk, grad=not backward)
                return (q, k, *_cos_sin(cs), backward, backend)

            cases.append(Case("rope", f"{qk}-{cs}-{'bwd' if backward else 'fwd'}", BOTH, make))
    return cases + _rope_table_cases()


def _rope_table_cases() -> list[Case]:
    """The tables and head dims the reference library's rope accepts: 2-D [seq, C] (the vision towers'), an odd
    head_dim, a table wider than the head (liger-kernel's layout: one cos per pair from the first columns)."""
    tables = {
        "2d-table": (D, lambda: (rand(S, D, seed=4), rand(S, D, seed=5))),
        "2d-wide-table": (D, lambda: (rand(S, 2 * D, seed=4), rand(S, 2 * D, seed=5))),
        "odd-head-dim": (D + 1, lambda: _cos_sin("broadcast", D + 1)),
        "odd-head-dim-2d-half-table": (D + 1, lambda: (rand(S, D // 2, seed=4), rand(S, D // 2, seed=5))),
        "wide-per-batch-table": (D, lambda: _cos_sin("per-batch", D + 6)),
    }
    cases = []
    for i, (name, (d, table)) in enumerate(tables.items()):
        for backward in (False, True):  # each table under both q/k layouts, each direction under both too
            qk = TABLE_QK_LAYOUTS[(i + backward) % 2]

            def make(backend, qk=qk, d=d, table=table, backward=backward):
                q, k = _qk(qk, grad=not backward, head_dim=d)
                return (q, k, *table(), backward, backend)

            cases.append(Case("rope", f"{qk}-{name}-{'bwd' if backward else 'fwd'}", BOTH, make))
    return cases


def _glu_cases() -> list[Case]:
    cases = []
    for name, layout in ROW_LAYOUTS.items():
        for kind in (0, 1):
            for scales in ((1.0, 1.0), (0.7, 1.3)):  # Falcon-H1's (gate, down) multipliers, or none

                def fwd(backend, layout=layout, kind=kind, scales=scales):
                    gate, up = layout(ROW_SHAPE, grad=True), layout(ROW_SHAPE, seed=1, grad=True)
                    return (gate, up, kind, *scales, backend)

                def bwd(backend, layout=layout, kind=kind, scales=scales):
                    dc, gate, up = (layout(ROW_SHAPE, seed=seed) for seed in (2, 0, 1))
                    return (dc, gate, up, kind, *scales, backend)

                act = "swiglu" if kind == 0 else "geglu"
                tag = f"{name}-{act}-multipliers" if scales[0] != 1.0 else f"{name}-{act}"
                cases += [Case("glu_fwd", tag, BOTH, fwd), Case("glu_bwd", tag, BOTH, bwd)]

    def chunked(backend):  # gate and up: the two halves of one fused gate_up projection
        gate, up = rand(2, 3, 48, grad=True).chunk(2, -1)
        return (gate, up, 0, 1.0, 1.0, backend)

    def chunked_bf16_multipliers(backend):
        gate, up = rand(2, 3, 48, dtype=torch.bfloat16, grad=True).chunk(2, -1)
        return (gate, up, 0, 0.5, 2.0, backend)

    cases.append(Case("glu_fwd", "3d-chunked-gate-up", BOTH, chunked))
    cases.append(Case("glu_fwd", "3d-chunked-gate-up-bf16-multipliers", BOTH, chunked_bf16_multipliers))
    return cases


N, V, H = 6, 20, 16


def _target(ignore=(1, 4)):
    t = torch.randint(0, V, (N,), generator=_g(7)).to(DEVICE)
    t[list(ignore)] = -100
    return t


LOGITS_LAYOUTS = {
    "contiguous": lambda grad: rand(N, V, grad=grad),
    "strided-rows": lambda grad: rand(N, 2 * V)[:, :V].detach().requires_grad_(grad),
    "transposed": lambda grad: rand(V, N).t().detach().requires_grad_(grad),
}


NO_AOT_OUTPUT_MUTATION = ("test_schema", "test_autograd_registration", "test_faketensor")


def _loss_cases() -> list[Case]:
    cases = []
    for name, logits in LOGITS_LAYOUTS.items():
        for reduction in ("mean", "none"):

            def ce(backend, logits=logits, reduction=reduction):
                return (logits(True), _target(), None, -100, 0.1, None, 0.0, reduction, True, 0, backend)

            # Its backward scales the saved gradient output in place: AOT dispatch cannot return an output that
            # the backward mutates, which opcheck does (the op's callers keep only the loss);
            # test_compiled_cross_entropy_matches_eager compiles what they do.
            cases.append(Case("cross_entropy_fwd", f"{name}-{reduction}", BOTH, ce, NO_AOT_OUTPUT_MUTATION))

    def ce_no_grad(backend):
        weights = rand(V, seed=3).abs() + 0.5
        return (rand(N, V), _target(), weights, -100, 0.0, 30.0, 1e-4, "sum", False, 0, backend)

    def ce_argmax(backend):
        return (rand(N, 2 * V)[:, :V], _target(), None, -100, 0.0, None, 0.0, "mean", False, 1, backend)

    cases.append(Case("cross_entropy_fwd", "contiguous-weighted-softcap-no-grad", BOTH, ce_no_grad))
    cases.append(Case("cross_entropy_fwd", "strided-rows-predicted-tokens", BOTH, ce_argmax))
    cases += [
        Case("scale_rows_", "scalar", ONE, lambda _: (rand(N, V), torch.tensor(0.5, device=DEVICE))),
        Case("scale_rows_", "per-row", ONE, lambda _: (rand(N, V), rand(N, seed=1))),
    ]
    hiddens = {"contiguous": lambda: rand(N, H), "strided-rows": lambda: rand(N, 2 * H)[:, :H]}
    for name, hidden in hiddens.items():
        for strategy, chunk in (("tokens", 4), ("vocab", 8)):

            def flce(backend, hidden=hidden, strategy=strategy, chunk=chunk):
                run = FlceRun(
                    FlceOptions(label_smoothing=0.1, lse_square_scale=1e-4), strategy, chunk, backend, 1
                )
                return (
                    hidden(),
                    rand(V, H, seed=1),
                    _target(),
                    rand(V, seed=2),
                    None,
                    None,
                    True,
                    True,
                    True,
                    *run.flat(),
                )

            cases.append(Case("flce_forward", f"{name}-{strategy}", BOTH, flce))

        def jsd(backend, hidden=hidden):
            return (
                hidden(),
                rand(V, H, seed=1),
                rand(N, H, seed=2),
                rand(V, H, seed=3),
                _target(),
                0.5,
                1.0,
                -100,
                1,
                True,
                True,
                backend,
            )

        cases.append(Case("fljsd_forward", name, BOTH, jsd))
    cases.append(
        Case(
            "flce_scale_grads_",
            "dh-dw-db",
            ONE,
            lambda _: (rand(N, H), rand(V, H, seed=1), rand(V, seed=2), torch.tensor(2.0, device=DEVICE)),
        )
    )
    return cases


TRITON = ("triton",)  # the variants' ops wrap their Triton launchers; their torch path is plain torch code


def _variant_cases() -> list[Case]:
    cases = []
    variants = {
        "partial": (D // 2, False, False),
        "interleaved-per-pair": (D, True, True),
        "half-split": (D, False, True),
    }
    for i, (qk, cs) in enumerate(QK_COS_PAIRS):
        # the variant is a constexpr branch apart from the strides: every variant on attention's transposed q/k
        # with broadcast tables, the other layouts one variant each in turn
        chosen = list(variants) if (qk, cs) == ("transposed", "broadcast") else [list(variants)[i % 3]]
        for name in chosen:
            rot, interleaved, per_pair = variants[name]

            def rope(_backend, qk=qk, cs=cs, rot=rot, interleaved=interleaved, per_pair=per_pair):
                q, k = _qk(qk, grad=True)
                cos, sin = _cos_sin(cs, rot // 2 if per_pair else rot)
                return (q, k, cos, sin, rot, interleaved, per_pair, q.dtype, k.dtype, False)

            cases.append(Case("rope_variant", f"{qk}-{cs}-{name}", TRITON, rope))
    for i, (name, (rot, interleaved, per_pair, width)) in enumerate(
        {
            "2d-table-partial": (D // 2, False, False, D // 2),
            "2d-wide-table-partial": (D // 2, False, False, D + 4),
            "2d-wide-table-interleaved-per-pair": (D, True, True, D),
            "odd-head-dim-half-split": (D, False, True, D // 2),
        }.items()
    ):
        qk = TABLE_QK_LAYOUTS[i % 2]
        d = D + 1 if name.startswith("odd") else D

        def table_rope(_backend, qk=qk, layout=(rot, interleaved, per_pair), w=width, d=d):
            q, k = _qk(qk, grad=True, head_dim=d)
            cos, sin = rand(S, w, seed=4), rand(S, w, seed=5)
            return (q, k, cos, sin, *layout, q.dtype, k.dtype, False)

        cases.append(Case("rope_variant", f"{qk}-{name}", TRITON, table_rope))
    for name, layout in ROW_LAYOUTS.items():
        shape = (*ROW_SHAPE[:-1], 2 * ROW_SHAPE[-1])
        for kind in ("swiglu", "geglu", "clamped_swiglu"):

            def gu_fwd(_backend, layout=layout, kind=kind, shape=shape):
                return (layout(shape), kind, 1.0, 1.702)

            def gu_bwd(_backend, layout=layout, kind=kind, shape=shape):
                return (layout((*shape[:-1], shape[-1] // 2), seed=1), layout(shape), kind, 1.0, 1.702)

            cases += [Case("gate_up_fwd", f"{name}-{kind}", TRITON, gu_fwd)]
            cases += [Case("gate_up_bwd", f"{name}-{kind}", TRITON, gu_bwd)]

        def relu2(_backend, layout=layout):
            return (layout(ROW_SHAPE), None)

        def relu2_bwd(_backend, layout=layout):
            return (layout(ROW_SHAPE), layout(ROW_SHAPE, seed=1))

        def add_rms(_backend, layout=layout):
            return (
                layout(ROW_SHAPE),
                layout(ROW_SHAPE, seed=1),
                rand(ROW_SHAPE[-1], seed=2),
                1e-6,
                0.0,
                "llama",
            )

        def add_rms_bwd(_backend, layout=layout):
            s = layout(ROW_SHAPE)
            rstd = torch.rsqrt(s.float().pow(2).mean(-1) + 1e-6).reshape(-1)
            dy, ds = layout(ROW_SHAPE, seed=1), layout(ROW_SHAPE, seed=2)
            return (dy, ds, s, rand(ROW_SHAPE[-1], seed=3), rstd, 1.0, "gemma", True)

        cases += [
            Case("relu_squared", f"{name}-fwd", TRITON, relu2),
            Case("relu_squared", f"{name}-bwd", TRITON, relu2_bwd),
            Case("add_rms_norm_fwd", name, TRITON, add_rms),
            Case("add_rms_norm_bwd", name, TRITON, add_rms_bwd),
        ]

    def add_rms_bf16(_backend):  # bf16 sum and fp32 weight: the normalised output is promoted (llama)
        x = contiguous(ROW_SHAPE, dtype=torch.bfloat16)
        return (
            x,
            contiguous(ROW_SHAPE, seed=1, dtype=torch.bfloat16),
            rand(ROW_SHAPE[-1]),
            1e-6,
            0.0,
            "llama",
        )

    def add_rms_bwd_only_ds(_backend):  # only the sum's gradient reaches the op: no dw
        s = contiguous(ROW_SHAPE)
        rstd = torch.rsqrt(s.float().pow(2).mean(-1) + 1e-6).reshape(-1)
        return (None, contiguous(ROW_SHAPE, seed=2), s, rand(ROW_SHAPE[-1], seed=3), rstd, 0.0, "llama", True)

    cases += [
        Case("add_rms_norm_fwd", "3d-bf16-fp32-weight", TRITON, add_rms_bf16),
        Case("add_rms_norm_bwd", "3d-only-ds", TRITON, add_rms_bwd_only_ds),
    ]
    return cases


def _moe_cases() -> list[Case]:
    """The experts op and its backward: stacked weights in both layouts (transposed: GPT-OSS, with biases and
    the clamped gate), hidden rows contiguous or a slice of a wider buffer, an expert without tokens; separate
    gate and up weights (DBRX: its down weight a transposed view of [E, I, H]; transposed with biases)."""
    from liger_registry.kernels.moe.routing import route

    t, h, inter, e, k = 7, 24, 20, 4, 2
    idx = torch.tensor(
        [[0, 1], [1, 0], [0, 3], [3, 1], [1, 0], [0, 3], [3, 1]], device=DEVICE
    )  # expert 2 idle

    def weights(transposed, split, grad):
        rows = inter if split else 2 * inter
        gu_shape = (e, h, rows) if transposed else (e, rows, h)
        w_gu = rand(*gu_shape, seed=3, grad=grad)
        w_up = rand(*gu_shape, seed=8, grad=grad) if split else None
        if split and not transposed:  # DBRX's w2: [E, I, H] stored, [E, H, I] seen
            w_d = rand(e, inter, h, seed=4).transpose(1, 2).detach().requires_grad_(grad)
        else:
            w_d = rand(*((e, inter, h) if transposed else (e, h, inter)), seed=4, grad=grad)
        return w_gu, w_d, w_up

    def args(layout, transposed, split, backend, grad=True):
        x = (
            rand(t, h, seed=1, grad=grad)
            if layout == "contiguous"
            else strided_rows((t, h), seed=1, grad=grad)
        )
        table = route(idx, e, block_m=4)
        w = rand(t * k, seed=2, grad=grad)
        w_gu, w_d, w_up = weights(transposed, split, grad)
        b_gu = rand(e, 2 * inter, seed=5, grad=grad) if transposed else None
        b_d = rand(e, h, seed=6, grad=grad) if transposed else None
        act = "clamped_swiglu" if transposed and not split else "swiglu"
        routing = (table.src, table.dest, table.offsets, table.blocks, table.block_m, k)
        return (x, w, w_gu, w_d, b_gu, b_d, w_up, *routing, act, 7.0, 1.702, not transposed, backend)

    def fwd(backend, layout, transposed, split):
        return args(layout, transposed, split, backend)

    def bwd(backend, layout, transposed, split):
        fwd_args = args(layout, transposed, split, backend, grad=False)
        x, w, w_gu, w_d, b_gu, b_d, w_up, *rest = fwd_args
        _, gate_up, act = OPS.moe_experts(*fwd_args)
        return (rand(t, h, seed=7), x, w, w_gu, w_d, b_gu, b_d, w_up, gate_up, act, *rest)

    # the hidden rows' stride is read by the gather alone, apart from the weight layouts: every weight layout on
    # contiguous rows, and strided rows with the plain stacked layout
    combos = [("contiguous", tr, sp) for tr in (False, True) for sp in (False, True)]
    combos.append(("strided-rows", False, False))
    # the backward op's own AOT-dispatch check is left out: the forward op's traces the joint graph, which calls the
    # backward op on the same layouts under fake tensors with dynamic shapes and runs it against eager
    bwd_utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    cases = []
    for layout, transposed, split in combos:
        kind = ("transposed-bias-" if transposed else "") + (
            "split" if split else "clamped" if transposed else "swiglu"
        )
        for op, make, utils in (("moe_experts", fwd, None), ("moe_experts_bwd", bwd, bwd_utils)):
            make_args = functools.partial(make, layout=layout, transposed=transposed, split=split)
            cases.append(Case(op, f"{layout}-{kind}", BOTH, make_args, utils))
    return cases


def _rl_head_cases() -> list[Case]:
    """The RL head's ops on the layouts its callers pass: gathered (contiguous) or strided hidden rows, a tied or
    transposed weight view, with and without bias and softcap; tiles that split tokens and vocabulary."""
    hiddens = {
        "contiguous": lambda g: rand(N, H, grad=g),
        "strided-rows": lambda g: strided_rows((N, H), grad=g),
    }
    weights = {"weight": lambda g: rand(V, H, seed=1, grad=g), "transposed-weight": lambda g: transposed_w(g)}

    def transposed_w(grad):
        return rand(H, V, seed=1).t().detach().requires_grad_(grad)

    def target():
        return torch.randint(0, V, (N,), generator=_g(7)).to(DEVICE)

    cases = []
    for (hn, hidden), (wn, weight) in ((h, w) for h in hiddens.items() for w in weights.items()):
        for extras, tiles in (("plain", (N, V)), ("bias-softcap-tiled", (4, 8))):
            with_extras = extras != "plain"

            def fwd(backend, hidden=hidden, weight=weight, on=with_extras, tiles=tiles, grad=True):
                bias = rand(V, seed=2, grad=grad) if on else None
                cap = 3.0 if on else None
                return (hidden(grad), weight(grad), bias, target(), cap, 0.7, 15, *tiles, backend)

            def bwd(backend, fwd=fwd):
                args = fwd(backend, grad=False)
                h, w, b, t, cap, scale, flags, tt, vt, _ = args
                _, ent, _, _, _, log_z, _ = OPS.rl_head_fwd(*args)
                return (rand(N, seed=3), rand(N, seed=4), h, w, b, t, log_z, ent, cap, scale, tt, vt,
                        True, True, b is not None, backend)  # fmt: skip

            tag = f"{hn}-{wn}-{extras}"
            cases += [Case("rl_head_fwd", tag, BOTH, fwd), Case("rl_head_bwd", tag, BOTH, bwd)]

    def log_probs_only(backend):
        return (
            rand(N, H, grad=True),
            rand(V, H, seed=1, grad=True),
            None,
            target(),
            None,
            1.0,
            0,
            N,
            V,
            backend,
        )

    def fp16(backend):  # the exact target logit and the tile's entropy for the backward (a 7th output)
        h, w = rand(N, H, grad=True, dtype=torch.float16), rand(V, H, seed=1, grad=True, dtype=torch.float16)
        return (h, w, None, target(), 3.0, 0.7, 1, N, V, backend)

    cases.append(Case("rl_head_fwd", "log-probs-only", BOTH, log_probs_only))
    cases.append(Case("rl_head_fwd", "fp16-exact-target", BOTH, fp16))
    return cases


CASES = (
    _norm_cases()
    + _rope_cases()
    + _glu_cases()
    + _loss_cases()
    + _variant_cases()
    + _moe_cases()
    + _rl_head_cases()
)
PARAMS = [pytest.param(c, b, id=f"{c.id}-{b}") for c in CASES for b in c.backends]


def _registered_ops() -> set[str]:
    """The package's custom ops (test_define.py's toy ops, named ``test_*``, are not the package's)."""
    return {
        s.name.split("::", 1)[1]
        for s in torch._C._jit_get_all_schemas()
        if s.name.startswith("liger_registry::") and not s.name.startswith("liger_registry::test_")
    }


def test_every_custom_op_is_checked():
    import liger_registry.kernels  # noqa: F401  (every op module registers on import)

    covered = {c.op for c in CASES}
    assert _registered_ops() == covered, f"missing: {_registered_ops() - covered}"
    layouts = len({(c.op, c.layout) for c in CASES})
    print(
        f"\nopcheck: {len(covered)} ops, {layouts} op x layout cases, {len(PARAMS)} op x layout x backend runs"
    )


@pytest.mark.parametrize("case,backend", PARAMS)
def test_opcheck(case: Case, backend: str):
    if backend in ("triton", "-") and not TRITON_RUNS:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 at import")
    args = case.make(backend)
    utils = case.test_utils or torch.library._OPCHECK_DEFAULT_UTILS
    torch.library.opcheck(getattr(OPS, case.op).default, args, test_utils=utils)


@pytest.mark.parametrize(
    "case_id",
    [
        "contiguous-transposed-bias-clamped",
        "contiguous-split",
        "contiguous-transposed-bias-split",
        "strided-rows-swiglu",
    ],
)
def test_opcheck_moe_backward_with_grouped_mm_weight_gradients(case_id, monkeypatch):
    """The weight and bias gradients as torch._grouped_mm (what CUDA runs), forced on the CPU's grouped GEMM: the
    bias gradients must come back in the fake's contiguous layout (a strided view broke inductor on CUDA), the
    weight gradients in their weights' layouts (split: the down weight a transposed view)."""
    if not TRITON_RUNS:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 at import")
    from liger_registry.kernels.moe import op as moe_ops

    monkeypatch.setattr(moe_ops, "wgrad_by_grouped_mm", lambda x, h: True)
    case = next(c for c in CASES if c.op == "moe_experts_bwd" and c.layout == case_id)
    torch.library.opcheck(OPS.moe_experts_bwd.default, case.make("triton"))


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("layout", ["transposed"])
def test_compiled_cross_entropy_matches_eager(backend, layout, monkeypatch):
    """What the callers of cross_entropy_fwd do (keep the loss, backward through the in-place scale), compiled
    with inductor and dynamic shapes, against eager."""
    from liger_registry import kernels as K

    if backend == "triton" and not TRITON_RUNS:
        pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 at import")
    monkeypatch.setenv(K.ENV_VAR, backend)
    logits, target = LOGITS_LAYOUTS[layout](True), _target()

    def loss(logits, target):
        return K.cross_entropy(logits * 2.0, target, label_smoothing=0.1) * 3.0

    eager = loss(logits, target)
    (g_eager,) = torch.autograd.grad(eager, logits)
    torch._dynamo.reset()
    got = torch.compile(loss, dynamic=True, fullgraph=True)(logits, target)
    (g_got,) = torch.autograd.grad(got, logits)
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(g_got, g_eager)
