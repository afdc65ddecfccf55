"""The suite's own rule: a test skipped for want of CUDA carries the gpu marker, or the GPU runner never runs it."""

from pathlib import Path

import pytest


class _Item:
    def __init__(self, nodeid: str, *marks: pytest.Mark):
        self.nodeid, self.marks = nodeid, marks

    def get_closest_marker(self, name: str):
        return next((m for m in self.marks if m.name == name), None)

    def iter_markers(self, name: str):
        return (m for m in self.marks if m.name == name)


CUDA_SKIP = pytest.mark.skipif(True, reason="CUDA is not available").mark


@pytest.fixture
def hook(request):
    """The suite's conftest hook, as pytest loaded it."""
    conftest = request.config.pluginmanager.get_plugin(str(Path(__file__).with_name("conftest.py")))
    return conftest.pytest_collection_modifyitems


def test_a_cuda_only_test_without_the_gpu_marker_stops_the_collection(hook):
    items = [_Item("t.py::unmarked", CUDA_SKIP), _Item("t.py::marked", pytest.mark.gpu.mark, CUDA_SKIP)]
    with pytest.raises(pytest.UsageError, match=r"t\.py::unmarked$"):
        hook(None, items)


def test_other_skips_and_marked_tests_pass(hook):
    other = pytest.mark.skipif(True, reason="needs trl").mark
    items = [_Item("t.py::a", other), _Item("t.py::b", pytest.mark.gpu.mark, CUDA_SKIP), _Item("t.py::c")]
    hook(None, items)
