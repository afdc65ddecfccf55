"""The backend of every kernel op: what it supports and the one rule that picks Triton or PyTorch per call.

Backend choice, read at call time from ``LIGER_REGISTRY_BACKEND``:

* ``auto`` (default): CUDA tensors run Triton, CPU tensors run the PyTorch implementation.
  A CUDA call the Triton path cannot serve (e.g. float64) runs PyTorch; the reasons say why.
* ``triton``: always Triton. On CPU tensors the kernels run through Triton's interpreter
  (``TRITON_INTERPRET=1`` must be set before triton is imported). Anything the Triton path
  cannot run raises :class:`BackendError` listing every reason; there is no silent fallback.
* ``torch``: always the PyTorch implementation.

:meth:`Op.decide` is the one rule. What it reads of the tensors (devices and dtypes) and of the environment is
decided once per (op, ``LIGER_REGISTRY_BACKEND`` value, devices and dtypes of the call's tensors) and cached: a
hot call pays one dictionary look-up and the op's own shape check (``extra_check``), not the walk over the
reasons (docs/design/norm-host-overhead.md). The reasons are walked lazily on a miss, and the full list is
built only when Triton is refused. Strides are not part of the key: no rule reads them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

ENV_VAR = "LIGER_REGISTRY_BACKEND"
BACKENDS = ("auto", "triton", "torch")
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

try:
    from .triton_utils import INTERPRET_AT_IMPORT as _INTERPRETED

    _TRITON_OK = True
except ImportError:  # pragma: no cover - triton is a dependency on Linux
    _INTERPRETED = False
    _TRITON_OK = False


class BackendError(RuntimeError):
    """The requested backend cannot run this call; the message lists every reason."""


def requested_backend() -> str:
    """The value of ``LIGER_REGISTRY_BACKEND`` (default ``auto``), validated; read on every call."""
    return _validated(os.environ.get(ENV_VAR, "auto"))


def _validated(raw: str) -> str:
    value = raw.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={raw!r} is not a valid backend; expected one of {', '.join(BACKENDS)}")
    return value


class TensorSpec(NamedTuple):
    """What the backend rule reads of a tensor: its device and dtype (for a decision without tensors)."""

    device: torch.device
    dtype: torch.dtype


def tensor_reasons(
    tensors: Iterable[torch.Tensor | TensorSpec], dtypes: tuple[torch.dtype, ...], backend: str
) -> Iterator[str]:
    """Reasons shared by every op why its Triton path cannot run on these tensors, lazily."""
    devices = {t.device for t in tensors}
    if not devices and backend == "auto":
        yield "no tensor argument and backend is auto"
    if len(devices) > 1:
        yield f"tensors on several devices: {sorted(str(d) for d in devices)}"
    for t in tensors:
        if t.dtype.is_floating_point and t.dtype not in dtypes:
            yield f"dtype {str(t.dtype).replace('torch.', '')} not supported"
            break
    kinds = {d.type for d in devices}
    if kinds - {"cpu", "cuda"}:
        yield f"device {sorted(str(d) for d in devices)} not supported by the Triton kernels"
    if "cpu" in kinds:
        if backend == "auto":
            yield "tensor on cpu and backend is auto"
        elif not _INTERPRETED:
            yield (
                "tensor on cpu and the Triton kernels were not loaded in interpreter mode "
                "(set TRITON_INTERPRET=1 before triton and liger_registry are imported)"
            )


@dataclass(frozen=True)
class Op:
    """One kernel op: a PyTorch implementation, an optional Triton one, and the rule choosing between them.

    ``extra_check(*args, **kwargs)`` adds op-specific reasons (e.g. a shape limit of a kernel).
    """

    name: str
    torch_impl: Callable
    triton_impl: Callable | None = None
    dtypes: tuple[torch.dtype, ...] = TRITON_DTYPES
    extra_check: Callable[..., list[str]] | None = None

    def _static_reasons(self, backend: str, tensors: list) -> Iterator[str]:
        """Reasons read from the op, the installation and the tensors' devices and dtypes (what the cache keys)."""
        if self.triton_impl is None:
            yield f"op {self.name} has no Triton implementation"
        if not _TRITON_OK:  # pragma: no cover
            yield "triton is not installed"
        yield from tensor_reasons(tensors, self.dtypes, backend)

    def _why_not(self, backend: str, tensors: list, args: tuple, kwargs: dict) -> Iterator[str]:
        yield from self._static_reasons(backend, tensors)
        if self.extra_check is not None and args:
            yield from self.extra_check(*args, **kwargs)

    def _static_decision(self, raw: str, tensors: list) -> tuple[str, tuple[str, ...], str]:
        """``(requested backend, static reasons, backend when no shape check objects)``, cached per key; under
        torch.compile computed afresh (dynamo folds it to constants and guards on what it read, not on a cache)."""
        if torch.compiler.is_compiling():
            return self._fresh_decision(raw, tensors)
        key = (id(self), raw, *[(t.device, t.dtype) for t in tensors])
        hit = _DECISIONS.get(key)
        if hit is None or hit[0] is not self:
            hit = (self, *self._fresh_decision(raw, tensors))
            _DECISIONS[key] = hit
        return hit[1:]

    def _fresh_decision(self, raw: str, tensors: list) -> tuple[str, tuple[str, ...], str]:
        backend = _validated(raw)
        if backend == "torch":
            return backend, (f"{ENV_VAR}=torch",), "torch"
        reasons = tuple(self._static_reasons(backend, tensors))
        return backend, reasons, "torch" if reasons else "triton"

    def _decide(self, tensors: list, args: tuple, kwargs: dict) -> tuple[str, list[str]]:
        backend, reasons, chosen = self._static_decision(os.environ.get(ENV_VAR, "auto"), tensors)
        if backend == "torch":
            return "torch", list(reasons)
        extra = self.extra_check(*args, **kwargs) if self.extra_check is not None and args else ()
        if chosen == "triton" and not extra:
            return "triton", []
        every = [*reasons, *extra]
        if backend == "auto":
            return "torch", every
        raise BackendError(f"{ENV_VAR}=triton but op {self.name} cannot run on Triton: " + "; ".join(every))

    def decide(self, *args: object, **kwargs: object) -> tuple[str, list[str]]:
        """``(backend, reasons)`` for this call: ``"triton"`` with no reasons, or ``"torch"`` with the reasons
        why not Triton. A forced Triton (``LIGER_REGISTRY_BACKEND=triton``) that cannot run raises
        :class:`BackendError` with every reason."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return self._decide(tensors, args, kwargs)

    def why_not(self, *args: object, backend: str | None = None, **kwargs: object) -> list[str]:
        """Every reason the Triton path cannot run this call under ``backend`` (default: the current setting);
        never raises."""
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return list(self._why_not(backend or requested_backend(), tensors, args, kwargs))

    def __call__(self, *args: object, **kwargs: object):
        backend, _ = self.decide(*args, **kwargs)
        return (self.triton_impl if backend == "triton" else self.torch_impl)(*args, **kwargs)


OPS: dict[str, Op] = {}
# (id of the op, LIGER_REGISTRY_BACKEND's raw value, (device, dtype) of each tensor) -> (the op, which the entry
# keeps alive so that its id is not reused, and Op._static_decision's answer)
_DECISIONS: dict[tuple, tuple] = {}


def clear_decisions() -> None:
    """Forget the cached backend decisions (after changing what a rule reads other than the environment variable
    and the tensors, e.g. a test that patches whether triton loaded in interpreter mode)."""
    _DECISIONS.clear()


def register(op: Op) -> Op:
    OPS[op.name] = op
    return op


def decide_backend(op_name: str, device: str | torch.device, dtype: torch.dtype) -> tuple[str, list[str]]:
    """The backend ``op_name`` would use now for tensors of this device and dtype, and why not Triton.

    No tensor is needed; checks that depend on a shape (e.g. a row kernel's column limit) are not applied.
    Forced Triton that cannot run raises :class:`BackendError`, as a call would.
    """
    if op_name not in OPS:
        raise KeyError(f"unknown op {op_name!r}; known: {', '.join(sorted(OPS))}")
    return OPS[op_name]._decide([TensorSpec(torch.device(device), dtype)], (), {})


def backend_for(*tensors: torch.Tensor, op: str | None = None) -> str:
    """The backend a call on these tensors would use now (``"triton"`` or ``"torch"``).

    Without ``op`` only the device rule and the environment variable are applied; with ``op`` that op's
    whole rule is (and a forced, impossible Triton raises :class:`BackendError`).
    """
    if op is not None:
        return OPS[op].decide(*tensors)[0]
    backend = requested_backend()
    if backend != "auto":
        return backend
    return "triton" if any(t.device.type == "cuda" for t in tensors) else "torch"


def why_not_triton(op: str, *args: object, **kwargs: object) -> list[str]:
    """Reasons the Triton path of ``op`` cannot run these arguments under the current backend setting."""
    return OPS[op].why_not(*args, **kwargs)
