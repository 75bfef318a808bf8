"""Argument types of the command line: numbers with a bound, each refused in one line that
names the value (argparse prints it as the usage error)."""

from __future__ import annotations

import argparse


def _bounded(cast, noun: str, ok, rule: str):
    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {noun}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{value} {rule}")
        return value
    return parse


positive_int = _bounded(int, "an integer", lambda v: v >= 1, "must be at least 1")
non_negative_int = _bounded(int, "an integer", lambda v: v >= 0, "must be 0 or more")
positive_float = _bounded(float, "a number", lambda v: v > 0, "must be positive")
non_negative = _bounded(float, "a number", lambda v: v >= 0, "must be 0 or more")
fraction_below_one = _bounded(float, "a number", lambda v: 0 <= v < 1, "must be 0 or more and below 1")


def int_between(low: int, high: int, what: str):
    """An integer from ``low`` to ``high``; ``what`` says why those (e.g. 'opsets npuforge reads')."""
    return _bounded(int, "an integer", lambda v: low <= v <= high, f"is not one of the {what} ({low} to {high})")


def numbers(count: int, noun: str, ok=lambda values: True, rule: str = ""):
    """``count`` comma-separated finite numbers (``--mean 0.485,0.456,0.406``); ``ok`` checks them."""
    import math

    def parse(text: str) -> list[float]:
        try:
            values = [float(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {noun}") from None
        if len(values) != count or not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"'{text}' is not {noun}")
        if not ok(values):
            raise argparse.ArgumentTypeError(f"'{text}' {rule}")
        return values
    return parse


def image_size(text: str) -> list[int]:
    """``H`` or ``H,W``, each 1 to 8192 pixels."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size H or H,W") from None
    if len(values) not in (1, 2) or not all(1 <= v <= 8192 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size H or H,W of 1 to 8192 pixels")
    return values * (3 - len(values))
