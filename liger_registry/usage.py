"""A usage error of the `liger-registry` command: one line on stderr, exit status 2, as argparse's own."""

from __future__ import annotations


class UsageError(ValueError):
    """A command's arguments that cannot be honoured (a flag of another mode, a device this machine lacks)."""
