"""Table and progress output: rich on a terminal, plain text otherwise."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from liger_registry.registry.report import table

T = TypeVar("T")


def _rich_console():
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console()


def print_table(headers: list[str], rows: list[list[str]], title: str | None = None) -> None:
    console = _rich_console()
    if console is None:
        if title:
            print(title)
        print(table(headers, rows))
        return
    from rich.table import Table

    rich_table = Table(*headers, title=title)
    for row in rows:
        rich_table.add_row(*map(str, row))
    console.print(rich_table)


def progress(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    """A progress bar on a terminal; a line per item otherwise."""
    console = _rich_console()
    if console is None:
        for i, item in enumerate(items, 1):
            print(f"{description}: {i}/{total}", flush=True)
            yield item
        return
    from rich.progress import track

    yield from track(items, total=total, description=description, console=console)
