"""The exceptions the registry raises; all are ValueErrors so callers can catch bad input in one place."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RegistryError(ValueError):
    """A registry file, a policy or an override is malformed; lists every problem found."""

    def __init__(self, message: str, problems: Iterable[str] = ()):
        self.problems = list(problems)
        text = message if not self.problems else message + "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)


class RegistryWarning(UserWarning):
    """A plugin that cannot load is skipped with this warning; the other families still load."""


class UnsupportedModelError(ValueError):
    """No family entry serves this model type."""

    def __init__(self, model_type: str, supported: Iterable[str]):
        self.model_type = model_type
        self.supported = sorted(supported)
        close = difflib.get_close_matches(model_type, self.supported, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        super().__init__(
            f"no liger_registry family serves model_type {model_type!r}.{hint} "
            f"Supported: {', '.join(self.supported)}. Draft a YAML entry with "
            f"`liger-registry scaffold {model_type}` (see `liger-registry schema`) in a directory passed to "
            "load_registry() or LIGER_REGISTRY_PATH."
        )


class PatchError(ValueError):
    """A patch could not be applied; the model was rolled back to how it was."""


def suggest(word: str, choices: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
