"""The commands' shared arguments: argparse number types, the model defaults the options start from, the
data source (``--dataset`` or ``--csv`` with ``--target``)."""

from __future__ import annotations

import argparse
import dataclasses
import math


def _number(kind, low: float, strict: bool, words: str):
    """An argparse ``type`` accepting a finite ``kind`` ≥ low (> low when ``strict``)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
        if not (math.isfinite(value) and (value > low if strict else value >= low)):
            raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}")
        return value

    return parse


positive_int = _number(int, 1, False, "a positive integer")
non_negative_int = _number(int, 0, False, "an integer ≥ 0")
positive_float = _number(float, 0.0, True, "a positive number")
non_negative_float = _number(float, 0.0, False, "a number ≥ 0")


def model_defaults() -> dict:
    """ModelConfig's field defaults, the single source of the CLI's model defaults."""
    from iolstream.core.model import ModelConfig

    return {
        f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING
    }


def add_data_source(parser):
    """The "data" argument group: ``--dataset NAME`` or ``--csv PATH`` with ``--target COLUMN``; returns the group."""
    from iolstream.tools.builtin_datasets import DATASETS

    src = parser.add_argument_group("data")
    which = src.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataset", metavar="NAME", help=f"built-in stream: {', '.join(DATASETS)}")
    which.add_argument("--csv", metavar="PATH", help="a CSV file with a header row (needs --target)")
    src.add_argument("--target", metavar="COLUMN", help="the target column of --csv")
    return src
