"""Loads family entries and policies from the bundled YAML, user directories and plugins."""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from liger_registry.forwards.registry import forward_names
from liger_registry.registry.errors import RegistryError, RegistryWarning, UnsupportedModelError, suggest
from liger_registry.registry.yaml_source import load_model, parse_yaml, shorten, validate_model
from liger_registry.schemas import KINDS, FamilyEntry, PolicyFile

BUNDLED_FAMILIES = Path(__file__).parent / "families"
BUNDLED_POLICIES = Path(__file__).parent.parent / "policies"
PATH_VARIABLE = "LIGER_REGISTRY_PATH"
ENTRY_POINT_GROUP = "liger_registry.families"


@dataclass(frozen=True)
class LoadedFamily:
    entry: FamilyEntry
    path: Path


@dataclass(frozen=True)
class LoadedPolicy:
    policy: PolicyFile
    path: Path
    origin: str = "user file"  # bundled | plugin <name> | LIGER_REGISTRY_PATH | directory | user file


@dataclass
class Registry:
    """Every family and registry-level policy, indexed by family name and by model type."""

    families: dict[str, LoadedFamily] = field(default_factory=dict)
    by_model_type: dict[str, str] = field(default_factory=dict)
    policies: list[LoadedPolicy] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # files of LIGER_REGISTRY_PATH not loaded, and why

    def family_for(self, model_type: str) -> LoadedFamily:
        name = self.by_model_type.get(model_type)
        if name is None:
            raise UnsupportedModelError(model_type, self.by_model_type)
        return self.families[name]

    def family(self, name: str) -> LoadedFamily:
        if name not in self.families:
            raise UnsupportedModelError(name, self.families)
        return self.families[name]

    def policies_for(self, family: str) -> list[LoadedPolicy]:
        """The registry policies applied by default to a family (opt-in ones only when named)."""
        return [p for p in self.policies if p.policy.applies(family) and not p.policy.opt_in]

    def named_policy(self, name: str) -> LoadedPolicy | None:
        return next((p for p in self.policies if p.policy.policy == name), None)


def _yaml_files(directory: Path) -> list[Path]:
    return sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])


def _kind(data: object) -> str:
    """'family' or 'policy', by the file's identifying top-level key."""
    return "policy" if isinstance(data, dict) and "policy" in data and "family" not in data else "family"


def _plugin_directory(point: metadata.EntryPoint) -> Path:
    """The directory a plugin's entry point names; a RegistryError naming the plugin when it cannot give one."""
    where = f"plugin {point.name!r} ({point.value})"
    try:
        value = point.load()
        value = value() if callable(value) else value
    except Exception as exc:  # third-party code: whatever it raises is reported under its name
        raise RegistryError(
            f"{where}: its entry point failed: {type(exc).__name__}: {shorten(str(exc))}"
        ) from None
    if not isinstance(value, (str, os.PathLike)):
        raise RegistryError(f"{where}: its entry point gave a {type(value).__name__}, not a directory path")
    return Path(value)


def plugin_directories() -> list[tuple[Path, str]]:
    """(directory, 'plugin <name>') for each installed plugin's `liger_registry.families` entry point.

    An entry point names a directory path (a string), or a callable returning one; importing it is also
    how a plugin registers its forwards with `liger_registry.forwards.register_forward`. A plugin whose entry
    point fails to import, raises, or gives something else than a path is skipped with a RegistryWarning naming
    it (warn-and-skip: one broken third-party package must not take down the bundled families).
    """
    directories = []
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            directories.append((_plugin_directory(point), f"plugin {point.name}"))
        except RegistryError as exc:
            warnings.warn(f"liger_registry: {exc}; its families are skipped", RegistryWarning, stacklevel=3)
    return directories


def _unique(directories: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    """The same directory named twice (LIGER_REGISTRY_PATH and load_registry(dir), say) is read once."""
    seen, out = set(), []
    for directory, source in directories:
        key = directory.resolve() if directory.exists() else directory.absolute()
        if key not in seen:
            seen.add(key)
            out.append((directory, source))
    return out


def registry_directories(extra_dirs: Iterable[str | os.PathLike]) -> list[tuple[Path, str]]:
    """Every directory the registry reads, once each, in order, each with where it came from."""
    env = [(Path(p), PATH_VARIABLE) for p in os.environ.get(PATH_VARIABLE, "").split(os.pathsep) if p]
    bundled = [(BUNDLED_FAMILIES, "bundled"), (BUNDLED_POLICIES, "bundled")]
    return _unique([*bundled, *plugin_directories(), *env, *((Path(d), "directory") for d in extra_dirs)])


def _named_by(source: str) -> str:
    if source == PATH_VARIABLE:
        return f"named in the environment variable {PATH_VARIABLE}"
    return "passed to load_registry()" if source == "directory" else f"given by {source}"


# \Z, not $: "$" also matches before a trailing newline, which a `|` block scalar ends with
_FUNCTION = re.compile(r"^(transformers(\.[A-Za-z_]\w*)+:)?[A-Za-z_]\w*\Z")


def forward_problem(path: Path, name: str) -> str | None:
    """A forward name that is not registered (checked by name: no forward is imported for it)."""
    forwards = forward_names()
    if name in forwards:
        return None
    return (
        f"{path}: forward: {name!r} is not a registered forward{suggest(name, forwards)}; "
        f"registered: {', '.join(sorted(forwards))} (forwards are registered by code, never named by path)"
    )


def code_problems(loaded: LoadedFamily) -> list[str]:
    """What a family entry names that is not registered code: YAML never makes us import anything.

    The forward must be in the forwards table (plugins fill it when their entry point loads, before any
    YAML is read); functions are names in the family's module or `transformers.<module>:<name>`.
    """
    entry = loaded.entry
    problems = [p for p in [forward_problem(loaded.path, entry.forward)] if p]
    names = {"causal_lm": entry.causal_lm}
    for name, kind in KINDS.items():
        spec = getattr(entry.kernels, name)
        if spec is not None and not kind.module_forward:
            names[f"kernels.{name}.function"] = spec.function
    for key, name in names.items():
        if not _FUNCTION.match(name):
            problems.append(
                f"{loaded.path}: {key}: {name!r} must be a name in the family's module "
                "or 'transformers.<module>:<name>' (only modules under transformers may be named)"
            )
    return problems


def duplicate_problem(registry: Registry, entry: FamilyEntry, path: Path) -> str | None:
    """A family name or model type that an earlier file of the registry already has, naming both files."""
    if entry.family in registry.families:
        return f"{path}: family {entry.family!r} is already defined in {registry.families[entry.family].path}"
    for model_type in entry.model_types:
        if model_type in registry.by_model_type:
            other = registry.families[registry.by_model_type[model_type]].path
            return f"{path}: model_type {model_type!r} is already served by {other}"
    return None


def _add_family(registry: Registry, loaded: LoadedFamily, source: str, problems: list[str]) -> None:
    """A duplicate from LIGER_REGISTRY_PATH is skipped (Registry.skipped; a warning): a variable read by every
    process must not break every apply; one passed to load_registry() is an error of that call."""
    entry = loaded.entry
    if found := code_problems(loaded):
        problems.extend(found)
        return
    if duplicate := duplicate_problem(registry, entry, loaded.path):
        (registry.skipped if source == PATH_VARIABLE else problems).append(duplicate)
        return
    registry.families[entry.family] = loaded
    registry.by_model_type.update(dict.fromkeys(entry.model_types, entry.family))


def _load_file(registry: Registry, path: Path, source: str, problems: list[str]) -> None:
    """One family or policy file into the registry, or its problems into `problems` (never another exception)."""
    try:
        parsed = parse_yaml(path)
    except RegistryError as exc:
        problems.extend(exc.problems or [str(exc)])
        return
    data, kind = parsed.data, _kind(parsed.data)
    try:
        if kind == "policy":
            registry.policies.append(LoadedPolicy(validate_model(path, PolicyFile, parsed), path, source))
        else:
            loaded = LoadedFamily(validate_model(path, FamilyEntry, parsed), path)
            _add_family(registry, loaded, source, problems)
    except RegistryError as exc:
        problems.extend(exc.problems or [str(exc)])
        # the schema failed; the forward name is still checked, so one run reports both
        if kind == "family" and isinstance(data, dict) and isinstance(data.get("forward"), str):
            problems.extend(p for p in [forward_problem(path, data["forward"])] if p)


def _load_directory(registry: Registry, directory: Path, source: str, problems: list[str]) -> None:
    if directory.exists() and not directory.is_dir():
        problems.append(
            f"{directory}: is not a directory; a registry path names directories ({_named_by(source)})"
        )
        return
    if not directory.is_dir():
        problems.append(f"{directory}: registry directory does not exist ({_named_by(source)})")
        return
    for path in _yaml_files(directory):
        _load_file(registry, path, source, problems)


def _load_plugin(registry: Registry, directory: Path, source: str) -> None:
    """A plugin's directory, all or nothing: on any problem its families are skipped with a RegistryWarning."""
    before = (dict(registry.families), dict(registry.by_model_type), list(registry.policies))
    problems: list[str] = []
    _load_directory(registry, directory, source, problems)
    if problems:
        registry.families, registry.by_model_type, registry.policies = before
        warnings.warn(
            f"liger_registry: {source} is skipped, its families are not loaded:\n"
            + "\n".join(f"  - {p}" for p in problems),
            RegistryWarning,
            stacklevel=3,
        )


def load_registry(*extra_dirs: str | os.PathLike) -> Registry:
    """Bundled families and policies, plugin and LIGER_REGISTRY_PATH directories, then `extra_dirs`.

    Every problem of every file is collected and raised at once as one RegistryError, each naming its file
    (unreadable, not UTF-8, a directory, a dangling link, an alias bomb, too deep, a duplicate key). A plugin
    is the exception: its problems skip that plugin with a RegistryWarning (see `plugin_directories`); so is a
    family of LIGER_REGISTRY_PATH that duplicates an earlier one (skipped with a RegistryWarning naming both files).
    """
    registry, problems = Registry(), []
    for directory, source in registry_directories(extra_dirs):
        if source.startswith("plugin "):
            _load_plugin(registry, directory, source)
        else:
            _load_directory(registry, directory, source, problems)
    problems += [
        p for loaded in registry.policies for p in applies_to_problems(loaded.policy, loaded.path, registry)
    ]
    if problems:
        raise RegistryError(f"the registry has {len(problems)} problem(s)", problems)
    if registry.skipped:
        warnings.warn(
            f"liger_registry: skipped, each duplicates a family loaded before it ({PATH_VARIABLE}):\n"
            + "\n".join(f"  - {p}" for p in registry.skipped),
            RegistryWarning,
            stacklevel=2,
        )
    return registry


def applies_to_problems(policy: PolicyFile, path: Path, registry: Registry) -> list[str]:
    """Names in a policy's `applies_to` that are no family of the registry (the policy would silently apply to
    nothing there); a model type served by a family gets that family suggested."""
    problems = []
    for name in policy.applies_to:
        if name == "*" or name in registry.families:
            continue
        family = registry.by_model_type.get(name)
        hint = (
            f"; it is a model type of family {family!r}: name the family"
            if family
            else suggest(name, registry.families)
        )
        problems.append(f"{path}: applies_to: {name!r} is not a family of the registry{hint}")
    return problems


def load_policy(path: str | os.PathLike) -> LoadedPolicy:
    """A user policy file (layer 4)."""
    path = Path(path)
    if not path.is_file():
        raise RegistryError(f"{path}: policy file does not exist")
    return LoadedPolicy(load_model(path, PolicyFile), path)
