"""Import layers: the schemas, the YAML checks, `schema` and `explain` run without torch; explain never loads the
applier."""

import subprocess
import sys

import pytest

import liger_registry

SCRIPTS = {
    "schemas": "import liger_registry.schemas",
    "yaml validation": "from liger_registry.registry.loader import load_registry; load_registry()",
    "schema command": "from liger_registry import cli; cli.main(['schema'])",
    "explain": "import liger_registry; print(liger_registry.explain('llama'))",
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_runs_without_torch(name):
    check = (
        "; import sys; assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:5]"
    )
    code = SCRIPTS[name] + check + "; assert 'liger_registry.registry.applier' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_public_wrapper_helpers():
    from liger_registry.testing import tiny_model

    model = tiny_model("llama")

    class DistributedDataParallel(type(model).__mro__[-2]):  # torch.nn.Module, named as DDP's wrapper is
        def __init__(self, module):
            super().__init__()
            self.module = module

    wrapped = DistributedDataParallel(model)
    assert liger_registry.unwrap_model(wrapped) is model
    assert liger_registry.model_type_of(wrapped) == "llama"
    with pytest.raises(liger_registry.PatchError, match="no config.model_type"):
        liger_registry.model_type_of(object())
