"""The on-disk record of autotuning results, shared by every process of one machine.

* One JSON file per (kernel, kernel source hash, GPU, Triton version): ``<kernel>-<source>-<gpu>-<triton>.json``
  under :func:`cache_dir` (``$LIGER_REGISTRY_CACHE_DIR``, else ``~/.cache/liger_registry/autotune``). The file holds ``entries``: shape bucket -> the picked config and the
  timings that picked it. A kernel whose source changed, another GPU or another Triton reads another file: a pick
  is never reused where it was not measured.
* Written atomically (a temporary file in the same directory, then ``os.replace``): a reader sees the old file or
  the new one, never half of one. Writers merge under an advisory lock (``fcntl.flock`` on a ``.lock`` file
  beside it), so two processes that tune different shapes at once both keep their entries.
* A file that does not parse or does not have the expected form is ignored with one warning (the next write
  replaces it); an unwritable directory is a warning too. Neither is ever an error: the cache only saves time.
* ``LIGER_REGISTRY_AUTOTUNE_CACHE=0`` turns reading and writing off (:func:`enabled`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

try:  # POSIX: writers of one file take turns; elsewhere the last writer's merge wins (still a whole file)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

CACHE_DIR_ENV = "LIGER_REGISTRY_CACHE_DIR"
SWITCH_ENV = "LIGER_REGISTRY_AUTOTUNE_CACHE"
FORMAT = 1
OFF = ("0", "false", "off", "no")


class TuneCacheWarning(UserWarning):
    """A cache file that could not be read or written (the cache is skipped, the kernels still run)."""


def enabled() -> bool:
    """Whether picks are read from and written to disk (``LIGER_REGISTRY_AUTOTUNE_CACHE=0`` says no)."""
    return os.environ.get(SWITCH_ENV, "1").strip().lower() not in OFF


def cache_dir() -> Path:
    """The directory of the cache files, read from the environment at every call (a bench or a test may move it
    between calls)."""
    if explicit := os.environ.get(CACHE_DIR_ENV):
        return Path(explicit).expanduser()
    return Path.home() / ".cache" / "liger_registry" / "autotune"


def source_hash(*texts: str) -> str:
    """A short hash of the kernels' source text (any edit gives another file)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-") or "unknown"


def file_name(kernel: str, source: str, device: str, triton_version: str) -> str:
    return f"{_slug(kernel)}-{source}-{_slug(device)}-triton{_slug(triton_version)}.json"


def _header(kernel: str, source: str, device: str, triton_version: str) -> dict:
    return {"format": FORMAT, "kernel": kernel, "source": source, "device": device, "triton": triton_version}


class TuneCache:
    """The cache file of one kernel on one GPU and Triton; ``device`` names the GPU (its name and capability,
    e.g. ``NVIDIA H100 80GB HBM3 sm90``)."""

    def __init__(self, kernel: str, source: str, device: str, triton_version: str):
        self.header = _header(kernel, source, device, triton_version)
        self.name = file_name(kernel, source, device, triton_version)

    @property
    def path(self) -> Path:
        return cache_dir() / self.name

    def read(self) -> dict[str, dict]:
        """Every entry of the file (empty when it is absent, unreadable, malformed, or the cache is off)."""
        if not enabled():
            return {}
        return self._entries(self.path)

    def get(self, bucket: str) -> dict | None:
        return self.read().get(bucket)

    def put(self, bucket: str, entry: dict) -> Path | None:
        """Merge one entry into the file; the path written, or None when the cache is off or not writable."""
        if not enabled():
            return None
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(path):
                entries = self._entries(path)
                entries[bucket] = entry
                _write_atomic(path, {**self.header, "entries": entries})
        except OSError as exc:
            warnings.warn(f"autotune cache {path} not written: {exc}", TuneCacheWarning, stacklevel=2)
            return None
        return path

    def _entries(self, path: Path) -> dict[str, dict]:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            warnings.warn(f"autotune cache {path} not read: {exc}", TuneCacheWarning, stacklevel=3)
            return {}
        try:
            data = json.loads(text)
        except ValueError as exc:
            warnings.warn(f"autotune cache {path} ignored: not JSON ({exc})", TuneCacheWarning, stacklevel=3)
            return {}
        problem = self._problem(data)
        if problem:
            warnings.warn(f"autotune cache {path} ignored: {problem}", TuneCacheWarning, stacklevel=3)
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict)}

    def _problem(self, data) -> str | None:
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            return "no 'entries' object"
        for key, want in self.header.items():
            if data.get(key) != want:
                return f"{key} is {data.get(key)!r}, expected {want!r}"
        return None


@contextlib.contextmanager
def _locked(path: Path):
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomic(path: Path, payload: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
