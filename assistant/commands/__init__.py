"""One module per subcommand (register(subparsers) + run(args)); argument types they share live here."""
from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (0 and negatives are refused with a one-line usage error)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n
