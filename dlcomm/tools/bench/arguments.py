"""argparse types shared by the ``dlcomm bench`` actions: whole numbers and byte sizes."""
from __future__ import annotations

import argparse
from collections.abc import Callable

from dlcomm.tools.bench.units import parse_size, parse_size_list


def count_arg(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def size_arg(text: str) -> int:
    """An argparse type: a byte size such as 8, 1K, 4M."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def size_list_arg(text: str) -> list[int]:
    """An argparse type: comma-separated byte sizes, e.g. 4K,64M."""
    try:
        return parse_size_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
