"""JSON from untrusted lines (log files, JSONL corpora), parsed with its nesting bounded.

``json.loads`` recurses once per level: a line holding an array nested 200,000 deep raises RecursionError
(not ValueError), and whatever walks the result afterwards (a repair, ``json.dumps``, a client's
serializer) recurses too. ``loads_bounded`` measures the nesting first, in one pass over the brackets
outside strings, and refuses a line deeper than its limit with ``JsonTooDeep``, a ValueError like every
other malformed line, so callers handle both with one ``except ValueError``.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_DEPTH = 64  # deeper than any log line or document record needs

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class JsonTooDeep(ValueError):
    """A JSON text nested deeper than the limit."""


def json_depth_exceeds(text: str | bytes, limit: int) -> int | None:
    """The nesting depth at which ``text`` first goes past ``limit`` (limit + 1), or None if it never does.

    Brackets inside strings do not count. Cheap for ordinary lines: unless the line holds more than
    ``limit`` opening brackets in all, nothing is scanned.
    """
    if isinstance(text, bytes):
        if text.count(b"[") + text.count(b"{") <= limit:
            return None
        # UTF-8 puts no ASCII byte inside a multi-byte character: brackets, quotes and backslashes keep their places.
        text = text.decode("latin-1")
    elif text.count("[") + text.count("{") <= limit:
        return None
    depth = 0
    for match in _BRACKET.finditer(_STRING.sub("", text)):
        if match.group(0) in "[{":
            depth += 1
            if depth > limit:
                return depth
        else:
            depth -= 1
    return None


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH, **options: Any) -> Any:
    """``json.loads(text, **options)``, refusing (JsonTooDeep) a text nested more than ``max_depth`` deep."""
    if json_depth_exceeds(text, max_depth) is not None:
        raise JsonTooDeep(f"JSON nested more than {max_depth} levels deep")
    return json.loads(text, **options)
