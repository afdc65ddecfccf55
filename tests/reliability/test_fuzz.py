"""Property-based hardening (hypothesis): mutated bundled family files load or raise RegistryError (never another
exception, never a hang), and FLCE / cross_entropy on fuzzed labels and ignore_index either match plain PyTorch
(valid labels) or raise ValueError (invalid ones). Example counts are sized to keep tests/reliability ~60 s."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from timeouts import within

import liger_registry as L
from liger_registry import kernels as K
from liger_registry.kernels import triton_utils
from liger_registry.kernels.flce import plan as flce_plan
from liger_registry.registry import loader
from liger_registry.registry.errors import RegistryError, UnsupportedModelError

FAMILY_FILES = sorted(loader.BUNDLED_FAMILIES.glob("*.yaml"))
FUZZ = settings(
    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
YAML_PIECES = [
    "",
    " ",
    "\n",
    ":",
    "- ",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    "!!python/object:os.system ",
    "~",
    "null",
    "'",
    '"',
    "#",
    "|",
    ">",
    "<<: *a",
    "\t",
    "\x00",
    "\u202e",
    "1e999",
    "-1",
    "0x10",
    "true",
    "yes",
    "@",
    "%",
    "`",
    "kernels:",
    "flce:",
    "head:",
    "tiny_config:",
    "family: x",
    "chunk_mem_const: 99999999999999999999",
]


@st.composite
def mutated(draw) -> tuple[str, str]:
    path = draw(st.sampled_from(FAMILY_FILES))
    lines = path.read_text().splitlines()
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["insert", "delete", "duplicate", "swap", "splice", "indent", "truncate"]))
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if op == "insert" or not lines:
            lines.insert(i, draw(st.sampled_from(YAML_PIECES)) + draw(st.text(max_size=12)))
        elif op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "splice":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(st.sampled_from(YAML_PIECES)) + lines[i][at:]
        elif op == "indent":
            lines[i] = draw(st.sampled_from(["  ", "    ", " "])) + lines[i]
        else:
            lines = lines[:i]
    return path.name, "\n".join(lines) + "\n"


@pytest.fixture
def only_this_directory(monkeypatch, tmp_path):
    """load_registry reads only the directory it is given (no bundled files, so no name clashes)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(loader, "BUNDLED_FAMILIES", empty)
    monkeypatch.setattr(loader, "BUNDLED_POLICIES", empty)
    monkeypatch.delenv(loader.PATH_VARIABLE, raising=False)


@pytest.mark.reliability("raw_exception")
@settings(FUZZ, max_examples=80)
@given(case=mutated())
def test_mutated_family_file_loads_or_is_a_registry_error(case, only_this_directory, cases) -> None:
    name, text = case
    cases.tried()
    with tempfile.TemporaryDirectory() as directory, within(10):
        (Path(directory) / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        try:
            registry = loader.load_registry(directory)
        except RegistryError as exc:
            assert len(str(exc)) < 20_000
            return
        for family in registry.families:
            try:
                L.explain(family, registry=registry)
            except (RegistryError, UnsupportedModelError):
                pass


# on a CUDA machine (the H200 run) the label cases run on the GPU: Triton compiled, labels checked on the device
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["torch"] + (["triton"] if triton_utils.INTERPRET_AT_IMPORT or torch.cuda.is_available() else [])


@st.composite
def labelled(draw):
    n, v = draw(st.integers(1, 9)), draw(st.integers(2, 33))
    ignore_index = draw(st.sampled_from([-100, -1, 0, v - 1, v, v + 7, -(2**40)]))
    valid = st.integers(0, v - 1)
    invalid = st.one_of(
        st.integers(v, v + 100), st.integers(-300, -1), st.sampled_from([2**40, -(2**40) + 1])
    )
    pick = st.one_of(valid, st.just(ignore_index)) if draw(st.booleans()) else st.one_of(valid, invalid)
    labels = draw(st.lists(pick, min_size=n, max_size=n))
    extra = {
        "reduction": draw(st.sampled_from(["mean", "sum", "none"])),
        "label_smoothing": draw(st.sampled_from([0.0, 0.1])),
    }
    return v, labels, ignore_index, extra


def _reference(logits, target, ignore_index, extra):
    """Plain PyTorch; an all-ignored mean is 0 here (liger_registry's documented choice), NaN there."""
    valid = target != ignore_index
    if extra["reduction"] == "mean" and not valid.any():
        return torch.zeros((), device=logits.device)
    safe = torch.where(valid, target, torch.full_like(target, -100))
    return F.cross_entropy(logits, safe, ignore_index=-100, **extra)


LABEL_CASES = {
    "case": labelled(),
    "strategy": st.sampled_from(["tokens", "vocab"]),
    "seed": st.integers(0, 2**16),
}


@pytest.mark.reliability("silent_wrong")
@settings(FUZZ, max_examples=40)
@given(**LABEL_CASES)
def test_fuzzed_labels_match_pytorch_or_raise(case, strategy, seed, monkeypatch, cases) -> None:
    check_labels_case("torch", case, strategy, seed, monkeypatch, cases)


@pytest.mark.reliability("silent_wrong")
@pytest.mark.skipif("triton" not in BACKENDS, reason="Triton on CPU tensors needs the interpreter")
@settings(FUZZ, max_examples=15)  # the interpreter is slow: fewer examples, the same property
@given(**LABEL_CASES)
def test_fuzzed_labels_match_pytorch_or_raise_triton(case, strategy, seed, monkeypatch, cases) -> None:
    check_labels_case("triton", case, strategy, seed, monkeypatch, cases)


def check_labels_case(backend, case, strategy, seed, monkeypatch, cases) -> None:
    v, labels, ignore_index, extra = case
    monkeypatch.setenv(K.ENV_VAR, backend)
    monkeypatch.setattr(triton_utils, "MAX_BLOCK", 16)
    monkeypatch.setattr(flce_plan, "VOCAB_ALIGN", 8)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(len(labels), 8, generator=g).to(DEVICE)
    weight = torch.randn(v, 8, generator=g).to(DEVICE)
    target = torch.tensor(labels, dtype=torch.int64, device=DEVICE)
    logits = hidden @ weight.t()
    ok = all(0 <= t < v or t == ignore_index for t in labels)
    cases.tried(2)
    opts = {"ignore_index": ignore_index, **extra}
    if not ok:
        with pytest.raises(ValueError, match="out of range"):
            K.fused_linear_cross_entropy(hidden, weight, target, strategy=strategy, **opts)
        with pytest.raises(ValueError, match="out of range"):
            K.cross_entropy(logits, target, **opts)
        return
    ref = _reference(logits, target, ignore_index, extra)
    got = K.fused_linear_cross_entropy(hidden, weight, target, strategy=strategy, **opts)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(K.cross_entropy(logits, target, **opts), ref, rtol=1e-4, atol=1e-4)
