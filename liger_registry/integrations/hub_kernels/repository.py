"""Writes the local kernels repository whose layers are liger_registry's: the layout the `kernels` package loads
from a path (`build/torch-universal/` with `metadata.json` and `__init__.py`), the module a two-line import of
:mod:`liger_registry.integrations.hub_kernels.layers`, so the code that runs is the installed package's."""

from __future__ import annotations

import atexit
import base64
import hashlib
import json
import shutil
import tempfile
import threading
from pathlib import Path

from liger_registry import __version__

# kernels resolves a local repository's variant under `build/`; `torch-universal` is accepted on every backend
# (CUDA, ROCm, CPU, ...): our layers pick Triton or PyTorch per call, by the tensors' device.
VARIANT = "torch-universal"
KERNEL_NAME = "liger-registry"  # kernels' rule: lowercase letters, digits and dashes
INIT = (
    '"""liger_registry\'s layers for transformers\' kernel mapping; the code is the installed liger_registry\'s."""\n'
    "\n"
    "from liger_registry.integrations.hub_kernels import layers  # noqa: F401\n"
)

_DEFAULT: Path | None = None
_LOCK = threading.Lock()


def _digest(data: bytes) -> str:
    """A file's entry in the metadata's digest, as kernels computes it: base64 of its SHA-256."""
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def metadata() -> dict:
    """The variant's `metadata.json`. Its id names the module kernels imports (`sys.modules[id]`), so it carries
    the version and the module's digest: two different builds never share one, and the same build written twice
    (another directory, another process) is recognised as the same. The digest lets kernels check the file."""
    init_digest = _digest(INIT.encode())
    build = hashlib.sha256(f"{__version__}\n{INIT}".encode()).hexdigest()[:12]
    return {
        "id": f"_liger_registry_layers_{build}",
        "name": KERNEL_NAME,
        "version": 1,
        "license": "Apache-2.0",
        "python-depends": [],
        "backend": {"type": "cpu"},
        "digest": {"algorithm": "sha256", "files": {"__init__.py": init_digest}},
    }


def write_repository(directory: str | Path) -> Path:
    """Write the repository into `directory` (created if needed; our two files replaced, nothing else touched)
    and return its absolute path, the `/abs/path` of a `"/abs/path:LayerName"` kernel mapping."""
    root = Path(directory).expanduser().resolve()
    variant = root / "build" / VARIANT
    variant.mkdir(parents=True, exist_ok=True)
    (variant / "__init__.py").write_text(INIT, encoding="utf-8")
    (variant / "metadata.json").write_text(json.dumps(metadata(), indent=2) + "\n", encoding="utf-8")
    return root


def repository_path() -> Path:
    """This process's repository: written once into a private temporary directory (mode 0700, removed at exit;
    kernels has imported the module by then), so no other user can put code on the import path it names."""
    global _DEFAULT
    with _LOCK:
        if _DEFAULT is None or not (_DEFAULT / "build" / VARIANT / "metadata.json").is_file():
            directory = tempfile.mkdtemp(prefix="liger_registry_kernels_")
            atexit.register(shutil.rmtree, directory, ignore_errors=True)
            _DEFAULT = write_repository(directory)
        return _DEFAULT
