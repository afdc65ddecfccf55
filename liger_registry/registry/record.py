"""The record of what is patched (the package's only global state) and the lock that guards it."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

# Every apply, revert and look-up holds this lock: two threads patching at once would otherwise interleave their
# reads and writes of the record and of the attributes it describes (a lost original, a KeyError on revert).
LOCK = threading.RLock()


@dataclass
class Shared:
    """A module-wide replacement that several handles may hold at once."""

    original: Any
    replacement: Any
    holders: int = 0


@dataclass
class PatchRecord:
    """What is patched now: per model (weakly: a dropped model is collected), per family, and module-wide."""

    models: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    families: dict[str, Any] = field(default_factory=dict)
    shared: dict[tuple[int, str], Shared] = field(default_factory=dict)

    def handles(self) -> list[Any]:
        return [*self.models.values(), *self.families.values()]

    def family_handle(self, name: str) -> Any:
        """The class-wide handle of a family, found by its family name or one of its model types."""
        if name in self.families:
            return self.families[name]
        return next((h for h in self.families.values() if name in h.report.config.entry.model_types), None)

    def class_wide_handle(self, model: Any) -> Any:
        """The class-wide handle whose patched classes the model's modules are (or subclass), None when none is:
        by class, not model type, since a family of another name may patch these classes."""
        if not self.families or not callable(getattr(model, "modules", None)):
            return None
        types = {type(module) for module in model.modules()}
        for handle in self.families.values():
            for applied in handle._applied:
                owner = applied.owner()
                if isinstance(owner, type) and applied.replacement.scope == "class":
                    if any(issubclass(t, owner) for t in types):
                        return handle
        return None


RECORD = PatchRecord()
