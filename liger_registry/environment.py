"""The environment report (`liger-registry env`): versions, the GPU, the env vars read and each op's backend."""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata

from liger_registry.kernels.backend import ENV_VAR as BACKEND_VARIABLE
from liger_registry.registry.loader import PATH_VARIABLE

PACKAGES = ("liger-registry", "torch", "triton", "transformers", "pydantic", "pyyaml", "rich")
OPTIONAL = ("peft", "trl", "accelerate", "datasets", "kernels")  # the integrations, reported when installed
# the MoE kernels' tile cache and search (kernels/moe/tune_cache.py, tuning.py)
TUNING_VARIABLES = ("LIGER_REGISTRY_CACHE_DIR", "LIGER_REGISTRY_AUTOTUNE_CACHE", "LIGER_REGISTRY_AUTOTUNE")
VARIABLES = (BACKEND_VARIABLE, PATH_VARIABLE, "TRITON_INTERPRET", *TUNING_VARIABLES)


@dataclass
class EnvironmentReport:
    """What decides how a patched model runs here: versions, the device, the env vars and each op's backend."""

    python: str
    platform: str
    packages: dict[str, str]
    device: str  # the device the backends are decided for: cuda:0 when a GPU is visible, else cpu
    dtype: str
    gpus: list[str] = field(default_factory=list)
    variables: dict[str, str | None] = field(default_factory=dict)
    backends: dict[str, dict[str, object]] = field(default_factory=dict)  # op -> backend and reasons

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        from liger_registry.registry.report import table

        versions = [["python", self.python], *self.packages.items(), ["platform", self.platform]]
        lines = [table(["package", "version"], [list(row) for row in versions])]
        lines.append("gpus: " + (", ".join(self.gpus) if self.gpus else "none (CUDA not available)"))
        lines += [
            f"{name}={value}" if value is not None else f"{name} unset"
            for name, value in self.variables.items()
        ]
        rows = [
            [op, str(choice["backend"]), "; ".join(choice["reasons"]) or "-"]  # type: ignore[arg-type]
            for op, choice in self.backends.items()
        ]
        lines.append(f"backends on {self.device} / {self.dtype}:")
        lines.append(table(["op", "backend", "why not triton"], rows))
        return "\n".join(lines)


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    names = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        names.append(
            f"cuda:{index} {props.name} ({props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor})"
        )
    return names


def op_backends(device: str, dtype) -> dict[str, dict[str, object]]:
    """`decide_backend` for every registered op; a forced backend that cannot run is reported, not raised."""
    import liger_registry.kernels  # noqa: F401 - registers the ops
    from liger_registry.kernels.backend import OPS, BackendError, decide_backend

    backends = {}
    for name in sorted(OPS):
        try:
            backend, reasons = decide_backend(name, device, dtype)
        except (BackendError, ValueError) as exc:  # forced triton that cannot run; a bad env value
            backend, reasons = "error", [str(exc)]
        backends[name] = {"backend": backend, "reasons": list(reasons)}
    return backends


def missing_device(device: str) -> str | None:
    """Why `device` is not here (a CUDA device this machine lacks), or None: the report says what runs here."""
    import torch

    from liger_registry.registry.explain import parse_device

    parsed = parse_device(device)
    if parsed.type != "cuda":
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        return f"no CUDA device here ({device}); torch.cuda.is_available() is False"
    if parsed.index is not None and parsed.index >= count:
        return f"no CUDA device here ({device}); this machine has {count}: cuda:0 to cuda:{count - 1}"
    return None


def environment_report(device: str | None = None, dtype: str | None = None) -> EnvironmentReport:
    """The report for `device` (default: cuda:0 when CUDA is available, else cpu) and `dtype` (default:
    bfloat16 on CUDA, float32 on CPU); a ValueError for a device this machine does not have."""
    import torch

    if device is not None and (problem := missing_device(device)):
        raise ValueError(problem)
    gpus = _gpus()
    device = device or ("cuda:0" if gpus else "cpu")
    dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    installed = {name: package_version(name) for name in PACKAGES}
    installed |= {name: v for name in OPTIONAL if (v := package_version(name)) != "not installed"}
    installed["torch"] = f"{installed['torch']} (CUDA {torch.version.cuda or 'none'})"
    return EnvironmentReport(
        python=sys.version.split()[0],
        platform=platform.platform(),
        packages=installed,
        device=device,
        dtype=dtype,
        gpus=gpus,
        variables={name: os.environ.get(name) for name in VARIABLES},
        backends=op_backends(device, getattr(torch, dtype)),
    )
