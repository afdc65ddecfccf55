"""Convergence parity harness: one family's tiny model trained unpatched and patched, with every difference measured."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers
from packaging.version import Version

import liger_registry as L
from liger_registry.kernels.backend import backend_for
from liger_registry.registry import load_registry
from liger_registry.registry.loader import Registry
from liger_registry.testing import tiny_batch, tiny_model

REGISTRY = load_registry()
# transformers releases whose original forward of these families cannot compute the router loss (the base model
# does not collect router logits, so `aux_loss` stays the int 0 and `.to()` fails): parity runs without it there.
ROUTER_LOSS_BROKEN = {
    family: Version(transformers.__version__) < Version("5.24")
    for family in ("granitemoe", "granitemoeshared", "granitemoehybrid", "dbrx")
}
RESULTS: list[tuple[Result, str]] = []  # filled by the tests, printed by conftest's terminal summary
LOGITS_RESULTS: list[tuple[LogitsResult, str]] = []  # likewise, for the with-logits runs
STEPS = 3
LR = 1e-3


@dataclass(frozen=True)
class Tolerance:
    loss: float  # per-step training loss and eval losses: |a - b| <= loss * (1 + |b|)
    weight: float  # final weights: max |a - b|
    logits: float  # eval-mode logits (skip_logits=False): max |a - b| <= logits * (1 + max |b|)


FP32 = Tolerance(loss=1e-5, weight=1e-5, logits=1e-5)
BF16 = Tolerance(loss=2e-2, weight=1e-2, logits=5e-2)
NOISE_FACTOR = 1.5  # patched vs fp32 may exceed unpatched vs fp32 by this factor (both are bf16 runs)


@dataclass
class Result:
    """Differences between the unpatched and the patched run (max absolute unless said otherwise)."""

    family: str
    device: str
    dtype: str
    chunk_mem_const: int | None
    backend: str = ""  # what kernel dispatch chose for this device
    loss: float = 0.0  # over the training steps, relative as Tolerance.loss
    weight: float = 0.0
    logits: float = 0.0  # relative as Tolerance.logits
    eval_loss_train: float = 0.0
    eval_loss_eval: float = 0.0
    # 16-bit runs: the patched and the unpatched logits against an fp32 run of the same model and data (the
    # truth both approximate); a logits gap over the tolerance passes when the patched run is no further from
    # the truth than the unpatched one is (bf16 noise amplified by training, not a wrong kernel)
    logits_vs_fp32: float | None = None
    unpatched_vs_fp32: float | None = None
    patched: list[str] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def failures(self, tol: Tolerance) -> list[str]:
        checks = {
            "loss": (self.loss, tol.loss),
            "weight": (self.weight, tol.weight),
            "logits": (self.logits, tol.logits),
            "eval_loss_train": (self.eval_loss_train, tol.loss),
            "eval_loss_eval": (self.eval_loss_eval, tol.loss),
        }
        problems = [
            f"{name}: {value:.3g} > {limit:.3g}"
            for name, (value, limit) in checks.items()
            if not value <= limit
        ]
        if self.logits > tol.logits and self.closer_to_fp32_than_unpatched():
            problems = [p for p in problems if not p.startswith("logits:")]
        return problems

    def closer_to_fp32_than_unpatched(self) -> bool:
        if self.logits_vs_fp32 is None or self.unpatched_vs_fp32 is None:
            return False
        return self.logits_vs_fp32 <= NOISE_FACTOR * self.unpatched_vs_fp32


HEADER = (
    f"{'device':<6} {'dtype':<8} {'family':<18} {'C':>3} {'backend':>7} {'loss':>9} {'weight':>9} {'logits':>9} "
    f"{'ev_train':>9} {'ev_eval':>9}  result"
)


def format_row(r: Result, verdict: str) -> str:
    c = "-" if r.chunk_mem_const is None else str(r.chunk_mem_const)
    return (
        f"{r.device:<6} {r.dtype:<8} {r.family:<18} {c:>3} {r.backend:>7} {r.loss:>9.2e} {r.weight:>9.2e} "
        f"{r.logits:>9.2e} {r.eval_loss_train:>9.2e} {r.eval_loss_eval:>9.2e}  {verdict}{_vs_fp32(r)}"
    )


def _vs_fp32(r: Result) -> str:
    if r.logits_vs_fp32 is None or r.unpatched_vs_fp32 is None:
        return ""
    return f"  (logits vs fp32: patched {r.logits_vs_fp32:.2e}, unpatched {r.unpatched_vs_fp32:.2e})"


def record(result: Result, verdict: str) -> None:
    """Keep the row for the summary; with PARITY_ROWS set, also append it to that file as the run goes."""
    RESULTS.append((result, verdict))
    path = os.environ.get("PARITY_ROWS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(format_row(result, verdict) + "\n")


def record_with_logits(result: LogitsResult, verdict: str) -> None:
    LOGITS_RESULTS.append((result, verdict))
    path = os.environ.get("PARITY_ROWS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(result.row(verdict) + "\n")


def _fused(family: str) -> bool:
    entry = REGISTRY.families[family].entry
    return entry.head is not None and entry.flce.enabled


def _has_head(family: str) -> bool:
    """Whether the family has a causal-LM head (`head: null` entries are bare decoders: kernels only)."""
    return REGISTRY.families[family].entry.head is not None


def _moe(family: str) -> bool:
    return REGISTRY.families[family].entry.forward == "causal_lm_moe"


def _loss(family: str, out) -> torch.Tensor:
    """The model's loss, or for a decoder without a head (kernel-only entries) a loss on its hidden states."""
    if _has_head(family):
        return out.loss
    # A fixed random linear read-out: unlike mean(h^2) it does not drive the final norm towards zero, where
    # bf16 rounding of the normalised output is amplified.
    hidden = out.last_hidden_state.float()
    probe = torch.randn(hidden.shape, generator=torch.Generator().manual_seed(0)).to(hidden.device)
    return (hidden * probe).mean()


def _outputs(family: str, out) -> torch.Tensor:
    return (out.logits if _has_head(family) else out.last_hidden_state).float()


def _batches(model, device: str) -> list[dict]:
    return [
        {k: v.to(device) for k, v in tiny_batch(model, batch=2, seq=16, seed=i).items()}
        for i in range(STEPS + 1)
    ]


def _call(family: str, model, batch: dict, **kwargs):
    if not _has_head(family):
        batch = {k: v for k, v in batch.items() if k != "labels"}
    elif _moe(family) and not ROUTER_LOSS_BROKEN.get(family, False):
        kwargs.setdefault("output_router_logits", True)  # exercise the router load-balancing loss too
    return model(**batch, **kwargs)


def _train_and_eval(family: str, model, batches: list[dict], skip_check: bool) -> dict:
    optimiser = torch.optim.AdamW(model.parameters(), lr=LR, eps=1e-6)
    losses = []
    model.train()
    for step, batch in enumerate(batches[:STEPS]):
        torch.manual_seed(1000 + step)
        out = _call(family, model, batch)
        if skip_check and _fused(family) and out.logits is not None:
            raise AssertionError(
                f"{family}: patched training forward with labels returned logits (FLCE not used)"
            )
        loss = _loss(family, out)
        loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    held_out = batches[STEPS]
    with torch.no_grad():
        torch.manual_seed(2000)
        model.train()
        eval_loss_train = _loss(family, _call(family, model, held_out)).float()
        model.eval()
        eval_loss_eval = _loss(family, _call(family, model, held_out)).float()
        kwargs = {"skip_logits": False} if _fused(family) else {}
        outputs = _outputs(family, _call(family, model, held_out, **kwargs))
    weights = {name: p.detach().float().clone() for name, p in model.named_parameters()}
    return {
        "losses": torch.stack(losses),
        "eval_loss_train": eval_loss_train,
        "eval_loss_eval": eval_loss_eval,
        "outputs": outputs,
        "weights": weights,
    }


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / (1 + b.abs())).max())


def run_parity(
    family: str,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    chunk_mem_const: int | None = None,
    registry: Registry | None = None,
    switches: dict[str, bool] | None = None,
    **config: Any,
) -> Result:
    """Train the family's tiny model unpatched, then a copy of the same initial weights patched, on the same data.

    `config` overrides values of the tiny model's config (a variant of the family, e.g. another text model);
    `switches` are apply()'s kernel switches (e.g. ``{"moe_experts": True}`` for a kernel a family ships off).
    """
    registry = registry or REGISTRY
    entry = registry.families[family].entry
    reference = tiny_model(entry.model_types[0], dtype=dtype, registry=registry, **config).to(device)
    candidate = copy.deepcopy(reference)
    truth_model = copy.deepcopy(reference).float() if dtype != torch.float32 else None
    batches = _batches(reference, device)
    # The unpatched run is finished before apply(): rotary embedding is patched module-wide.
    expected = _train_and_eval(family, reference, batches, skip_check=False)
    overrides = {} if chunk_mem_const is None else {"chunk_mem_const": chunk_mem_const}
    with L.patched(candidate, registry=registry, **overrides, **(switches or {})) as handle:
        patched = [f"{r.kernel}:{r.target}" for r in handle.report.patched]
        got = _train_and_eval(family, candidate, batches, skip_check=True)
        used_c = handle.report.config.entry.flce.chunk_mem_const
    weight = max(float((got["weights"][n] - w).abs().max()) for n, w in expected["weights"].items())
    logits_scale = 1 + float(expected["outputs"].abs().max())
    truth = None
    if truth_model is not None:
        truth = _train_and_eval(family, truth_model, batches, skip_check=False)["outputs"]
    return Result(
        family=family,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        chunk_mem_const=used_c if _fused(family) else None,
        backend=backend_for(torch.empty(1, device=device)),
        loss=_rel(got["losses"], expected["losses"]),
        weight=weight,
        logits=float((got["outputs"] - expected["outputs"]).abs().max()) / logits_scale,
        eval_loss_train=_rel(got["eval_loss_train"], expected["eval_loss_train"]),
        eval_loss_eval=_rel(got["eval_loss_eval"], expected["eval_loss_eval"]),
        logits_vs_fp32=None if truth is None else float((got["outputs"] - truth).abs().max()) / logits_scale,
        unpatched_vs_fp32=(
            None if truth is None else float((expected["outputs"] - truth).abs().max()) / logits_scale
        ),
        patched=patched,
        losses=[float(x) for x in expected["losses"]],
    )


# The reference library's with-logits setting: fused head off, cross entropy on the materialised logits.
WITH_LOGITS = {"fused_linear_cross_entropy": False, "cross_entropy": True}
WITH_LOGITS_STEPS = 24
TOP_K = 5


@dataclass
class LogitsResult:
    """Patched (WITH_LOGITS) vs unpatched over training steps whose logits the patched forward must return.

    Each value is the max over the steps: loss relative as Tolerance.loss; logits and the top-k log-probs (at
    the unpatched run's top-k tokens) relative to 1 + max |unpatched|. The `*_truth` pairs compare each run
    with an fp32 run of the same model and data (16-bit runs only).
    """

    family: str
    device: str
    dtype: str
    steps: int
    loss: float = 0.0
    logits: float = 0.0
    topk_logprobs: float = 0.0
    # 16-bit runs, per quantity: (patched vs fp32, unpatched vs fp32); a gap over the tolerance passes when the
    # patched run is no further from the fp32 run than the unpatched one is (bf16 noise amplified by training)
    truth: dict[str, tuple[float, float]] = field(default_factory=dict)
    patched: list[str] = field(default_factory=list)
    cross_entropy: bool = False  # the resolved config had the cross_entropy kernel on

    def failures(self, tol: Tolerance) -> list[str]:
        checks = {
            "loss": (self.loss, tol.loss, "loss"),
            "logits": (self.logits, tol.logits, "logits"),
            "topk_logprobs": (self.topk_logprobs, tol.logits, "logits"),
        }
        return [
            f"{name}: {value:.3g} > {limit:.3g}"
            for name, (value, limit, basis) in checks.items()
            if not value <= limit and not self._within_noise(basis)
        ]

    def _within_noise(self, quantity: str) -> bool:
        pair = self.truth.get(quantity)
        return pair is not None and pair[0] <= NOISE_FACTOR * pair[1]

    def row(self, verdict: str) -> str:
        truth = "".join(
            f"  {k} vs fp32: {p:.2e} patched, {u:.2e} unpatched" for k, (p, u) in self.truth.items()
        )
        return (
            f"{self.device:<6} {self.dtype:<8} {self.family:<18} steps {self.steps:>3} loss {self.loss:.2e} "
            f"logits {self.logits:.2e} top{TOP_K} logp {self.topk_logprobs:.2e}  {verdict}{truth}"
        )


def _train_with_logits(family: str, model, batches: list[dict], steps: int) -> dict:
    """Training steps with labels; every step's loss and logits (the logits must come back)."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=LR, eps=1e-6)
    losses, logits = [], []
    model.train()
    for step in range(steps):
        torch.manual_seed(1000 + step)
        out = _call(family, model, batches[step % len(batches)])
        if out.logits is None:
            raise AssertionError(f"{family}: a training forward with labels returned no logits")
        out.loss.backward()
        optimiser.step()
        optimiser.zero_grad(set_to_none=True)
        losses.append(out.loss.detach().float())
        logits.append(out.logits.detach().float())
    return {"losses": torch.stack(losses), "logits": torch.stack(logits)}


def _topk_logprob_gap(got: torch.Tensor, want: torch.Tensor) -> float:
    index = want.topk(TOP_K, dim=-1).indices
    lp_got = torch.log_softmax(got, -1).gather(-1, index)
    lp_want = torch.log_softmax(want, -1).gather(-1, index)
    return float((lp_got - lp_want).abs().max()) / (1 + float(lp_want.abs().max()))


def run_with_logits_parity(
    family: str, device: str = "cpu", dtype: torch.dtype = torch.float32, steps: int = WITH_LOGITS_STEPS
) -> LogitsResult:
    """Train unpatched, then patched with WITH_LOGITS, from the same weights on the same data."""
    entry = REGISTRY.families[family].entry
    reference = tiny_model(entry.model_types[0], dtype=dtype).to(device)
    candidate = copy.deepcopy(reference)
    truth_model = copy.deepcopy(reference).float() if dtype != torch.float32 else None
    batches = _batches(reference, device)
    expected = _train_with_logits(family, reference, batches, steps)
    with L.patched(candidate, **WITH_LOGITS) as handle:
        patched = [f"{r.kernel}:{r.target}" for r in handle.report.patched]
        got = _train_with_logits(family, candidate, batches, steps)
        cross_entropy = handle.report.config.entry.cross_entropy.enabled
    scale = 1 + float(expected["logits"].abs().max())
    gap = lambda a, b: float((a - b).abs().max()) / scale  # noqa: E731
    truth = {}
    if truth_model is not None:
        fp32 = _train_with_logits(family, truth_model, batches, steps)
        truth["loss"] = (_rel(got["losses"], fp32["losses"]), _rel(expected["losses"], fp32["losses"]))
        truth["logits"] = (gap(got["logits"], fp32["logits"]), gap(expected["logits"], fp32["logits"]))
    return LogitsResult(
        family=family,
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        steps=steps,
        loss=_rel(got["losses"], expected["losses"]),
        logits=gap(got["logits"], expected["logits"]),
        topk_logprobs=_topk_logprob_gap(got["logits"], expected["logits"]),
        truth=truth,
        patched=patched,
        cross_entropy=cross_entropy,
    )
