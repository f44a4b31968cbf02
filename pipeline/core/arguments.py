"""The one argument parser of every command: a bad argument is one line and exit status 2.

argparse's own ``error()`` prints the whole usage block, then the error, and each command's own checks
(``pretrain generate --top-p 1.5``) used to surface later as tracebacks. Every ``pretrain`` command builds
its parser from this class, and checks a value's range where it parses it (``type=`` functions below), so
all bad arguments take the one path run_cli takes for a bad config: ``error: ...`` and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

EXIT_USAGE = 2


class ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line on stderr, the way run_cli reports every other refusal, and exit status 2."""
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def number_in(
    kind: type,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
):
    """A ``type=`` for argparse: ``kind`` (int or float), finite, within [low, high] (or open ends)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            left = "(" if low_open else "["
            right = ")" if high_open else "]"
            span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
            raise argparse.ArgumentTypeError(f"{text} is outside {span}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def text(value: str) -> str:
    """A ``type=`` for free text: valid Unicode that can be written as UTF-8 (a command line's invalid bytes
    reach Python as lone surrogates, which tokenizers and files refuse later with a TypeError)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{value.encode('utf-8', 'backslashreplace').decode()[:80]!r} is not valid UTF-8 text "
            f"(at character {exc.start})"
        ) from None
    return value
