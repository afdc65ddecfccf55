"""The Axolotl plugin: Axolotl's liger_* keys to liger_registry, through the hooks Axolotl calls. Axolotl is not
installed in the test environment; its config is a mapping with attribute access (Axolotl's DictDefault), and
where Axolotl imports, its own plugin loader and manager run the plugin too."""

from __future__ import annotations

import importlib

import pytest

import liger_registry as L
from liger_registry.integrations.axolotl import LigerRegistryArgs, LigerRegistryPlugin, overrides_from_axolotl
from liger_registry.testing import tiny_batch, tiny_model

PLUGIN = "liger_registry.integrations.axolotl.LigerRegistryPlugin"
ALL_ON = {
    "liger_rope": True,
    "liger_rms_norm": True,
    "liger_glu_activation": True,
    "liger_fused_linear_cross_entropy": True,
}


class Cfg(dict):
    """Axolotl's DictDefault: keys as attributes, None for a missing one."""

    def __getattr__(self, name):
        return self.get(name)


def _kernels(model) -> set[str]:
    return {r.kernel for r in L.patch_handle(model).report.patched}


def _run_hooks(plugin, cfg, model):
    plugin.pre_model_load(cfg)
    plugin.post_model_build(cfg, model)
    plugin.post_model_load(cfg, model)  # a second hook leaves the first patch as it is


def test_keys_switch_the_kernels():
    model = tiny_model("llama")
    plugin = LigerRegistryPlugin()
    _run_hooks(plugin, Cfg(ALL_ON, model_config_type="llama"), model)
    assert len(plugin.handles) == 1
    assert {"rms_norm", "rope", "swiglu", "forward"} <= _kernels(model)
    assert L.patch_handle(model).report.config.entry.flce.enabled
    plugin.handles[0].revert()


def test_unset_or_false_keys_keep_the_models_code():
    model = tiny_model("llama")
    plugin = LigerRegistryPlugin()
    _run_hooks(plugin, Cfg(liger_rms_norm=True, liger_rope=False, model_config_type="llama"), model)
    entry = L.patch_handle(model).report.config.entry
    assert _kernels(model) >= {"rms_norm"} and not _kernels(model) & {"rope", "swiglu"}
    assert not entry.flce.enabled
    plugin.handles[0].revert()
    untouched = tiny_model("llama")
    LigerRegistryPlugin().post_model_build(Cfg(model_config_type="llama"), untouched)
    assert L.patch_handle(untouched) is None  # no key true: the plugin does nothing


def test_token_scaling_reaches_the_loss():
    cfg = Cfg(ALL_ON, liger_use_token_scaling=True)
    assert overrides_from_axolotl(cfg, "llama") == {"cross_entropy": False, "use_token_scaling": True}
    model, plain = tiny_model("llama"), tiny_model("llama")
    plugin = LigerRegistryPlugin()
    plugin.post_model_build(cfg, model)
    L.apply(plain)
    assert L.patch_handle(model).report.config.entry.flce.use_token_scaling
    batch = tiny_batch(model)
    model.train(), plain.train()
    assert model(**batch).loss < plain(**batch).loss  # each token's loss times its probability < 1
    L.revert(model), L.revert(plain)


def test_glu_key_picks_the_familys_gated_mlp():
    assert overrides_from_axolotl(Cfg(liger_glu_activation=True), "gemma") == {
        "rms_norm": False,
        "add_rms_norm": False,  # rms_norm is the reference switch: every RMSNorm
        "rope": False,
        "fused_linear_cross_entropy": False,
        "cross_entropy": False,
    }  # gemma's geglu stays on, and no warning about a swiglu it does not have


def test_a_key_for_a_kernel_the_family_lacks_is_not_passed_on_as_axolotl_does():
    with pytest.warns(UserWarning, match="Axolotl asks for layer_norm, but family 'llama' has no layer_norm"):
        overrides = overrides_from_axolotl(Cfg(liger_layer_norm=True, liger_rope=True), "llama")
    assert "layer_norm" not in overrides and "geglu" not in overrides


@pytest.mark.parametrize(
    "cfg,match",
    [
        ({"liger_use_token_scaling": True}, "requires liger_fused_linear_cross_entropy"),
        ({"liger_cross_entropy": True, "liger_fused_linear_cross_entropy": True}, "not both"),
        ({"liger_rope": "yes"}, "expected true or false"),
    ],
)
def test_inconsistent_keys_fail_before_the_model_loads(cfg, match):
    with pytest.raises(L.RegistryError, match=match):
        LigerRegistryPlugin().pre_model_load(Cfg(cfg, model_config_type="llama"))
    with pytest.raises(ValueError, match=match):
        LigerRegistryArgs.model_validate(cfg)


def test_unsupported_model_type_fails_before_the_model_loads():
    with pytest.raises(L.UnsupportedModelError):
        LigerRegistryPlugin().pre_model_load(Cfg(ALL_ON, model_config_type="not_a_model"))


def test_input_args_name_an_importable_pydantic_model():
    module, _, name = LigerRegistryPlugin().get_input_args().rpartition(".")
    args = getattr(importlib.import_module(module), name)
    assert args is LigerRegistryArgs
    assert set(args.model_fields) == {
        *ALL_ON,
        "liger_layer_norm",
        "liger_cross_entropy",
        "liger_use_token_scaling",
    }


def test_through_axolotls_own_plugin_manager():
    base = pytest.importorskip("axolotl.integrations.base", reason="axolotl is not installed here")
    from axolotl.utils.dict import DictDefault

    plugin = base.load_plugin(PLUGIN)
    assert isinstance(plugin, base.BasePlugin)
    manager = base.PluginManager.get_instance()
    manager.plugins[PLUGIN] = plugin
    try:
        cfg = DictDefault({**ALL_ON, "model_config_type": "llama"})
        model = tiny_model("llama")
        manager.pre_model_load(cfg)
        manager.post_model_build(cfg, model)
        assert {"rms_norm", "rope", "swiglu", "forward"} <= _kernels(model)
        assert PLUGIN.rpartition(".")[0] + ".LigerRegistryArgs" in manager.get_input_args()
        L.revert(model)
    finally:
        manager.plugins.pop(PLUGIN)
