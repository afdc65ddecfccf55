"""Op interface: each kernel op declares a torch and a Triton implementation; dispatch picks one per call.

Backend choice, read at call time from ``LIGER_REGISTRY_BACKEND``:

* ``auto`` (default): CUDA tensors run Triton, CPU tensors run the PyTorch implementation.
  A CUDA call the Triton path cannot serve (e.g. float64) runs PyTorch; ``why_not_triton``
  says why.
* ``triton``: always Triton. On CPU tensors the kernels run through Triton's interpreter
  (``TRITON_INTERPRET=1`` must be set before triton is imported). Anything the Triton path
  cannot run raises :class:`BackendError` listing every reason; there is no silent fallback.
* ``torch``: always the PyTorch implementation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

ENV_VAR = "LIGER_REGISTRY_BACKEND"
BACKENDS = ("auto", "triton", "torch")


try:
    import triton as _triton  # noqa: F401

    _TRITON_OK = True
except ImportError:  # pragma: no cover
    _TRITON_OK = False


class BackendError(RuntimeError):
    """The requested backend cannot run this call; the message lists every reason."""


def requested_backend() -> str:
    """The value of ``LIGER_REGISTRY_BACKEND`` (default ``auto``), validated; read on every call."""
    raw = os.environ.get(ENV_VAR, "auto")
    value = raw.strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={raw!r} is not a valid backend; expected one of {', '.join(BACKENDS)}")
    return value


def _tensors(args: Iterable[object]) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor)]


def _interpreter_on() -> bool:
    try:
        from .triton_utils import INTERPRET_AT_IMPORT
    except ImportError:  # pragma: no cover - no triton
        return False
    return INTERPRET_AT_IMPORT


def common_reasons(
    tensors: Sequence[torch.Tensor],
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float16, torch.bfloat16),
    backend: str = "auto",
) -> list[str]:
    """Reasons shared by every op why its Triton path cannot run on these tensors."""
    reasons: list[str] = []
    if not _TRITON_OK:  # pragma: no cover - triton is a dependency on Linux
        reasons.append("triton is not installed")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        reasons.append(f"tensors on several devices: {sorted(str(d) for d in devices)}")
    for t in tensors:
        if t.is_floating_point() and t.dtype not in dtypes:
            reasons.append(f"dtype {str(t.dtype).replace('torch.', '')} not supported")
            break
    on_cpu = any(t.device.type == "cpu" for t in tensors)
    if any(t.device.type not in ("cpu", "cuda") for t in tensors):
        reasons.append(f"device {sorted(str(d) for d in devices)} not supported by the Triton kernels")
    if on_cpu:
        if backend == "auto":
            reasons.append("tensor on cpu and backend is auto")
        elif not _interpreter_on():
            reasons.append(
                "tensor on cpu and the Triton kernels were not loaded in interpreter mode "
                "(set TRITON_INTERPRET=1 before triton and liger_registry are imported)"
            )
    return reasons


@dataclass
class Op:
    """One kernel op: a PyTorch implementation, an optional Triton one, and a check of the latter.

    ``supports(*args, backend=...)`` returns the list of reasons why the Triton path cannot serve the
    call (empty when it can). ``extra_check`` adds op-specific reasons.
    """

    name: str
    torch_impl: Callable
    triton_impl: Callable | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
    extra_check: Callable[..., list[str]] | None = None
    doc: str = field(default="")

    def supports(self, *args: object, backend: str = "auto", **kwargs: object) -> list[str]:
        reasons: list[str] = []
        if self.triton_impl is None:
            reasons.append(f"op {self.name} has no Triton implementation")
        reasons += common_reasons(_tensors(list(args) + list(kwargs.values())), self.dtypes, backend)
        if self.extra_check is not None:
            reasons += self.extra_check(*args, **kwargs)
        return reasons

    def choose(self, *args: object, **kwargs: object) -> str:
        """``"triton"`` or ``"torch"`` for this call, following the rules in the module docstring."""
        backend = requested_backend()
        if backend == "torch":
            return "torch"
        tensors = _tensors(list(args) + list(kwargs.values()))
        if backend == "auto":
            if not any(t.device.type == "cuda" for t in tensors):
                return "torch"
            if self.triton_impl is not None and _TRITON_OK and all(
                t.device.type == "cuda" and (t.dtype in self.dtypes or not t.is_floating_point()) for t in tensors
            ) and len({t.device for t in tensors}) == 1 and (self.extra_check is None or not self.extra_check(*args, **kwargs)):
                return "triton"  # fast path: the checks of ``supports`` that matter, without building reasons
            return "torch" if self.supports(*args, backend=backend, **kwargs) else "triton"
        reasons = self.supports(*args, backend=backend, **kwargs)
        if reasons:
            raise BackendError(
                f"{ENV_VAR}=triton but op {self.name} cannot run on Triton: " + "; ".join(reasons)
            )
        return "triton"

    def __call__(self, *args: object, **kwargs: object):
        impl = self.triton_impl if self.choose(*args, **kwargs) == "triton" else self.torch_impl
        return impl(*args, **kwargs)


OPS: dict[str, Op] = {}


def register(op: Op) -> Op:
    OPS[op.name] = op
    return op


def backend_for(*tensors: torch.Tensor, op: str | None = None) -> str:
    """The backend a call on these tensors would use now (``"triton"`` or ``"torch"``).

    Without ``op`` only the device rule and the environment variable are applied; with ``op`` that op's
    own support check is applied too (and a forced, impossible Triton raises :class:`BackendError`).
    """
    if op is not None:
        return OPS[op].choose(*tensors)
    backend = requested_backend()
    if backend != "auto":
        return backend
    return "triton" if any(t.device.type == "cuda" for t in tensors) else "torch"


def why_not_triton(op: str, *args: object, **kwargs: object) -> list[str]:
    """Reasons the Triton path of ``op`` cannot run these arguments under the current backend setting."""
    return OPS[op].supports(*args, backend=requested_backend(), **kwargs)
