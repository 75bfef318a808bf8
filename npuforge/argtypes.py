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
