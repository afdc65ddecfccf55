"""The ignore label is defined once: every public default and transformers agree on it."""

import inspect

import torch.nn.functional as F

from liger_registry import kernels
from liger_registry.compat import losses
from liger_registry.constants import IGNORE_INDEX


def test_ignore_index_is_torchs_and_every_default_uses_it():
    assert IGNORE_INDEX == inspect.signature(F.cross_entropy).parameters["ignore_index"].default
    for fn in (kernels.cross_entropy, losses.LigerCrossEntropyLoss.__init__):
        assert inspect.signature(fn).parameters["ignore_index"].default == IGNORE_INDEX, fn
