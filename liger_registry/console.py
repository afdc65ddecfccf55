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
    if console is None:  # plain text is never cut: each column is as wide as its longest cell
        if title:
            print(title)
        print(table(headers, rows))
        return
    console.print(rich_table(headers, rows, title))


def rich_table(headers: list[str], rows: list[list[str]], title: str | None = None):
    """A rich table whose cells fold onto more lines when the terminal is narrow: names are never cut."""
    from rich.table import Column, Table

    columns = [Column(header, overflow="fold") for header in headers]
    result = Table(*columns, title=title)
    for row in rows:
        result.add_row(*map(str, row))
    return result


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
