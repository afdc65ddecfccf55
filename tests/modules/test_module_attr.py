"""Attributes read by one name or by alternatives: the first the module has, a clear error when it has none."""

import pytest
from torch import nn

from liger_registry.modules.module_attr import attr_reader, has_attr


class Norm(nn.Module):
    def __init__(self, **attrs):
        super().__init__()
        for name, value in attrs.items():
            setattr(self, name, value)


def test_one_name_and_alternatives_read_the_first_present():
    old, new = Norm(eps=1e-5), Norm(variance_epsilon=1e-6)
    assert attr_reader("eps")(old) == 1e-5 and attr_reader(["eps"])(old) == 1e-5
    both = attr_reader(["eps", "variance_epsilon"])
    assert both(old) == 1e-5 and both(new) == 1e-6
    assert both(Norm(eps=1e-5, variance_epsilon=1e-6)) == 1e-5  # the list's order decides
    assert has_attr(new, ["eps", "variance_epsilon"]) and has_attr(old, "eps") and not has_attr(new, "eps")


def test_none_present_is_an_attribute_error_naming_them():
    with pytest.raises(AttributeError, match="Norm has none of the attributes eps, epsilon"):
        attr_reader(["eps", "epsilon"])(Norm(variance_epsilon=1e-6))


def test_readers_trace_without_a_graph_break():
    """torch.compile(fullgraph=True) through both readers (operator.attrgetter would break the graph)."""
    import torch

    norm = Norm(variance_epsilon=1e-6)
    for reader in (attr_reader("variance_epsilon"), attr_reader(["eps", "variance_epsilon"])):
        scaled = torch.compile(lambda x, read=reader: x * read(norm), fullgraph=True, backend="eager")
        torch.testing.assert_close(scaled(torch.ones(2)), torch.full((2,), 1e-6))
