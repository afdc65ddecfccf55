"""Hostile registry files and plugins: every one is a RegistryError naming the file (or a RegistryWarning naming
the plugin, whose families are skipped), in bounded time and with bounded error text; never a raw exception."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
from timeouts import within

from liger_registry import cli
from liger_registry.registry.errors import RegistryError, RegistryWarning
from liger_registry.registry.loader import BUNDLED_FAMILIES, ENTRY_POINT_GROUP, PATH_VARIABLE, load_registry

HEAD = "family: {name}\nmodel_types: [{name}]\nmodule: transformers.models.llama.modeling_llama\n"
FAMILY = HEAD + "causal_lm: LlamaForCausalLM\n"
LAUGHS = "".join(
    f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n" for p, k in zip("abcdefghi", "bcdefghij", strict=True)
)
BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + LAUGHS


def _error(directory) -> RegistryError:
    with within(20), pytest.raises(RegistryError) as info:
        load_registry(directory)
    assert len(str(info.value)) < 5000, "error text must be bounded"
    return info.value


BAD_FILES = {
    "duplicate key": FAMILY.format(name="dup") + "kernels: {swiglu: {targets: [LlamaMLP]}}\nkernels: {}\n",
    "duplicate nested key": FAMILY.format(name="dup2")
    + "flce:\n  chunk_mem_const: 2\n  chunk_mem_const: 8\n",
    "alias bomb in a field": BOMB + FAMILY.format(name="lol") + "tested: *j\n",
    "alias bomb in tiny_config": BOMB + FAMILY.format(name="lol") + "tiny_config: {layer_types: *j}\n",
    "recursive alias": FAMILY.format(name="rec") + "tiny_config: &r {x: *r}\n",
    "deep nesting": FAMILY.format(name="deep") + "tiny_config: " + "[" * 50_000 + "]" * 50_000 + "\n",
    "deep mapping": FAMILY.format(name="deep") + "tiny_config: " + "{a: " * 100 + "1" + "}" * 100 + "\n",
    "huge file": FAMILY.format(name="huge") + "reason: '" + "x" * (2 << 20) + "'\n",
    "long line error": FAMILY.format(name="long") + "skip_logits: " + "x" * 100_000 + "\n",
    "block scalar module": "family: blk\nmodel_types: [blk]\nmodule: |\n  transformers.models.llama.modeling_llama\n"
    "causal_lm: LlamaForCausalLM\n",
    "block scalar causal_lm": HEAD.format(name="blk2") + "causal_lm: |\n  LlamaForCausalLM\n",
    "not a mapping": "- a\n- b\n",
    "syntax error": "family: [unclosed\n",
}


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_family_file_is_a_registry_error_naming_it(name, tmp_path, cases) -> None:
    cases.tried()
    (tmp_path / "bad.yaml").write_text(BAD_FILES[name])
    assert "bad.yaml" in str(_error(tmp_path))


@pytest.mark.reliability("raw_exception")
def test_nesting_past_the_limit_is_refused_before_the_parser_recurses(tmp_path, cases) -> None:
    cases.tried()
    (tmp_path / "bad.yaml").write_text(BAD_FILES["deep nesting"])
    line = BAD_FILES["deep nesting"].count("\n")  # the tiny_config line
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)  # too shallow for a parser that recurses level by level through 50,000
    try:
        message = str(_error(tmp_path))
    finally:
        sys.setrecursionlimit(limit)
    assert f"bad.yaml:{line}: nested deeper than 64 levels" in message


@pytest.mark.reliability("silent_wrong")
def test_duplicate_key_names_file_and_line(tmp_path, cases) -> None:
    cases.tried(2)
    (tmp_path / "dup.yaml").write_text(BAD_FILES["duplicate key"])
    assert f"{tmp_path / 'dup.yaml'}:6: key 'kernels' written twice" in str(_error(tmp_path))
    policy = (
        "policy: p\napplies_to: [llama]\nreason: r\nflce: {chunk_mem_const: 2}\nflce: {chunk_mem_const: 8}\n"
    )
    (tmp_path / "dup.yaml").write_text(policy)
    assert "dup.yaml:5: key 'flce' written twice" in str(_error(tmp_path))


@pytest.mark.reliability("silent_wrong")
def test_duplicate_key_through_the_path_variable(tmp_path, monkeypatch, cases) -> None:
    cases.tried()
    (tmp_path / "dup.yaml").write_text(BAD_FILES["duplicate nested key"])
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path))
    with pytest.raises(RegistryError, match=r"dup\.yaml:7: key 'chunk_mem_const' written twice"):
        load_registry()


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize("kind", ["bad encoding", "directory", "dangling symlink"])
def test_unreadable_entries_of_a_directory(kind, tmp_path, cases) -> None:
    cases.tried()
    path = tmp_path / "x.yaml"
    if kind == "bad encoding":
        path.write_bytes(b"family: \xff\xfe\x00bad\n")
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "nowhere.yaml")
    assert "x.yaml" in str(_error(tmp_path))


@pytest.mark.reliability("raw_exception")
def test_missing_path_directory_names_the_variable(tmp_path, monkeypatch, cases) -> None:
    cases.tried()
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path / "absent"))
    with pytest.raises(RegistryError, match=f"absent: registry directory does not exist .*{PATH_VARIABLE}"):
        load_registry()


@pytest.mark.reliability("raw_exception")
def test_same_directory_twice_is_read_once(tmp_path, monkeypatch, cases) -> None:
    cases.tried(2)
    (tmp_path / "mine.yaml").write_text(FAMILY.format(name="mine"))
    monkeypatch.setenv(PATH_VARIABLE, f"{tmp_path}:{tmp_path}/.")
    assert "mine" in load_registry(tmp_path).families
    assert "llama" in load_registry(BUNDLED_FAMILIES).families


PLUGINS = {
    "raises": "def families():\n    raise RuntimeError('plugin exploded')\n",
    "wrong type": "def families():\n    return 42\n",
    "import fails": "import module_that_is_not_installed_anywhere\ndef families():\n    return '.'\n",
    "bad yaml": "from pathlib import Path\ndef families():\n    return str(Path(__file__).with_name('fam'))\n",
    "missing dir": "def families():\n    return '/nonexistent/liger/plugin/dir'\n",
}


def _install(root, monkeypatch, name, source):
    package = root / name
    package.mkdir()
    (package / "__init__.py").write_text(source)
    (package / "fam").mkdir()
    (package / "fam" / "x.yaml").write_text(FAMILY.format(name="plug") + "kernels: {}\nkernels: {}\n")
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nbroken = {name}:families\n")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize("kind", list(PLUGINS))
def test_a_broken_plugin_is_skipped_with_its_name(kind, tmp_path, monkeypatch, capsys, cases) -> None:
    cases.tried(2)
    _install(tmp_path, monkeypatch, "liger_broken_plugin", PLUGINS[kind])
    with pytest.warns(RegistryWarning, match="plugin 'broken'|plugin broken"):
        registry = load_registry()
    assert "llama" in registry.families and "plug" not in registry.families
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RegistryWarning)
        code = cli.main(["lint", "--format", "json"])
    assert json.loads(capsys.readouterr().out)["ok"] is True and code == 0


@pytest.mark.reliability("raw_exception")
@pytest.mark.parametrize("command", [["explain", "llama"], ["show", "llama"], ["lint", "--format", "json"]])
def test_cli_with_a_bomb_on_the_path_ends_with_a_bounded_error(command, tmp_path, monkeypatch, capsys, cases):
    cases.tried()
    (tmp_path / "bomb.yaml").write_text(BAD_FILES["alias bomb in tiny_config"])
    monkeypatch.setenv(PATH_VARIABLE, str(tmp_path))
    with within(30):
        code = cli.main(command)
    out, err = capsys.readouterr()
    assert code == 1 and len(out) + len(err) < 20_000
    assert "bomb.yaml" in out + err
    if "json" in command:
        assert json.loads(out)["ok"] is False


@pytest.mark.reliability("raw_exception")
def test_schema_into_a_closed_pipe_is_quiet(cases) -> None:
    import os
    import subprocess

    cases.tried()
    path = [os.getcwd(), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    # `true` exits at once without reading, so the write meets a closed pipe (deterministically, unlike `head`)
    command = f"{sys.executable} -m liger_registry.cli schema | true; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=120)
    # 141 (128 + SIGPIPE, what `cli.BROKEN_PIPE` returns) when the write met the closed pipe, 0 if it fit first
    assert done.returncode in (0, 141) and "Traceback" not in done.stderr, done.stderr
