"""The kernel mapping of transformers' `use_kernels=True` pointed at liger_registry's layers: a `KernelConfig`
for `from_pretrained` (and TRL's `model_init_kwargs`), and the raw mapping for `kernels.kernelize`.

transformers' own `KernelConfig(use_local_kernel=True)` does not get a local layer into a model (5.17 and
5.25 alike): `from_pretrained` first rewrites each mapping value into a `(path, metadata)` tuple, which the
config's `create_compatible_mapping` then cannot split; that method refuses a model on the CPU; it registers
the layer for the one mode the model is in when loaded (inference, after `from_pretrained`'s `eval()`), so the
re-kernelization of `model.train()` finds no layer for training and restores the original forwards; and it
replaces the mapping the caller passed, so a second model (TRL's reference model) cannot be built from the
same config. :class:`LigerRegistryKernelConfig` keeps transformers' flow and fixes those four steps.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from transformers.utils.kernel_config import KernelConfig

from liger_registry.integrations.hub_kernels import dispatch
from liger_registry.integrations.hub_kernels.repository import repository_path

# the hub name transformers declares -> our layer in the repository
LAYERS = {dispatch.NORM_NAME: "RMSNorm", dispatch.ROTARY_NAME: "RotaryPosEmb"}
# where our ops run: Triton on CUDA tensors, the PyTorch twin on CPU ones (other devices keep their forwards)
DEVICES = ("cuda", "cpu")


def require_kernels():
    """The `kernels` module, if the installed transformers accepts its version, else an ImportError that says
    which version to install (transformers ignores a `kernels` outside its range: no layer declares a name)."""
    from transformers import __version__ as transformers_version
    from transformers.utils import import_utils

    low, high = import_utils.KERNELS_MIN_VERSION, import_utils.KERNELS_MAX_VERSION
    if not import_utils.is_kernels_available():
        try:
            installed = f"kernels {importlib.metadata.version('kernels')} is installed"
        except importlib.metadata.PackageNotFoundError:
            installed = "kernels is not installed"
        raise ImportError(
            f"transformers {transformers_version} serves `use_kernels` through the `kernels` package, "
            f"{low} <= version < {high}; {installed}. Install it: pip install 'kernels>={low},<{high}'"
        )
    import kernels

    return kernels


def _modes(kernels) -> tuple:
    mode = kernels.Mode
    return (
        mode.TRAINING,
        mode.INFERENCE,
        mode.TRAINING | mode.TORCH_COMPILE,
        mode.INFERENCE | mode.TORCH_COMPILE,
    )


def kernel_mapping(path: str | Path | None = None, devices: tuple[str, ...] = DEVICES, model=None) -> dict:
    """The mapping for `kernels`' own API, ``with kernels.use_kernel_mapping(kernel_mapping(model=model),
    inherit_mapping=False): kernels.kernelize(model, mode=Mode.TRAINING, device="cuda")``; `path` defaults to
    :func:`repository_path`. With `model`, every other hub name it declares maps to no device: those layers keep
    their forwards without kernels' "no kernel mapping" warning."""
    kernels = require_kernels()
    root = Path(path).resolve() if path is not None else repository_path()
    return _mapping(kernels, {hub: (root, ours) for hub, ours in LAYERS.items()}, devices, model)


def _mapping(kernels, repos: dict[str, tuple[Path, str]], devices: tuple[str, ...], model) -> dict:
    """kernels' nested mapping of `repos` (hub name -> (repository, layer)) for every mode on each device."""
    mapping = {name: {} for name in (_declared_names(model) if model is not None else ())}
    for hub, (root, layer) in repos.items():
        repo = kernels.LocalLayerRepository(repo_path=root, layer_name=layer)
        mapping[hub] = {device: dict.fromkeys(_modes(kernels), repo) for device in devices}
    return mapping


def _repo_string(hub: str, value: Any) -> str:
    """`"/abs/path:Layer"` from a mapping value as the caller wrote it or as `from_pretrained` rewrote it."""
    text = value[0] if isinstance(value, tuple) and value else value
    if not isinstance(text, str) or ":" not in text:
        raise ValueError(
            f"kernel mapping of {hub!r}: expected '/abs/path:Layer' (or from_pretrained's ('/abs/path:Layer', "
            f"{{...}}) form), got {value!r}"
        )
    return text


class LigerRegistryKernelConfig(KernelConfig):
    """A `KernelConfig` of local layers (ours) that transformers' `from_pretrained(use_kernels=True,
    kernel_config=...)` and `set_use_kernels(True, config)` install on CUDA and CPU models, in training and
    inference mode. Only the names a model declares are used, so one config serves every model; the config
    itself is never changed by a load (TRL builds a policy and a reference model from it)."""

    def __init__(
        self,
        kernel_mapping: dict | None = None,
        use_local_kernel: bool = True,
        inherit_mapping: bool = False,
        devices: tuple[str, ...] = DEVICES,
    ):
        super().__init__(kernel_mapping, use_local_kernel=use_local_kernel, inherit_mapping=inherit_mapping)
        self.devices = tuple(devices)
        self.resolved = False  # True on the per-model copy that holds kernels' nested mapping

    def sanitize_kernel_mapping(self, model) -> None:
        """transformers' checks on the names `model` declares (a name it does not declare is left out)."""
        if self.resolved:
            return
        declared = {k: v for k, v in self.kernel_mapping.items() if k in _declared_names(model)}
        KernelConfig(declared, use_local_kernel=True).sanitize_kernel_mapping(model)
        self.store_registered_layer_names(model)

    def create_compatible_mapping(self, model, compile: bool = False) -> None:
        """Give `model` a copy of this config with kernels' nested mapping: our layers for every mode on each of
        `devices`; every other hub name the model declares mapped to no device, so it keeps its own forward
        without a "no kernel mapping" warning. Resolves the model's classes for the layers (:mod:`.dispatch`)."""
        if self.resolved:
            model.kernel_config = self
            return
        declared = _declared_names(model)
        repos = {}
        for hub, value in self.kernel_mapping.items():
            if hub in declared:
                path, _, layer = _repo_string(hub, value).rpartition(":")
                repos[hub] = (Path(path), layer)
        mapping = _mapping(require_kernels(), repos, self.devices, model)
        resolved = LigerRegistryKernelConfig(mapping, devices=self.devices)
        resolved.resolved = True
        model.kernel_config = resolved
        dispatch.prepare(model)


def _declared_names(model) -> set[str]:
    """Every hub name a layer of `model` declares (modules, and function modules kernels attaches)."""
    names = set()
    for module in model.modules():
        if (name := getattr(type(module), "kernel_layer_name", None)) is not None:
            names.add(name)
        for func in (getattr(module, "_kernel_funcs", None) or {}).values():
            names.add(getattr(func, "kernel_layer_name", None))
    return names - {None}


def kernel_config(
    path: str | Path | None = None, devices: tuple[str, ...] = DEVICES
) -> LigerRegistryKernelConfig:
    """`KernelConfig` for ``from_pretrained(..., use_kernels=True, kernel_config=kernel_config())``: the layers
    of the repository at `path` (default: :func:`repository_path`, written on first use) for "RMSNorm" and
    "rotary_pos_emb". Raises an ImportError naming the `kernels` version to install when it is missing."""
    require_kernels()
    root = Path(path).resolve() if path is not None else repository_path()
    return LigerRegistryKernelConfig({hub: f"{root}:{ours}" for hub, ours in LAYERS.items()}, devices=devices)
