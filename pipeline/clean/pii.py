"""PII redaction: e-mail addresses, IPv4/IPv6 addresses and phone numbers become placeholders.

The patterns are written in the common subset of Java and Python regex syntax: the Spark job runs them
with the built-in ``regexp_count``/``regexp_replace`` (in the JVM, no Python), and ``redact`` runs the
same patterns in Python for tests and small jobs. They are applied in this order, each to the output of
the previous one, so an address is redacted once.

Phone numbers are matched only in unambiguous shapes (international ``+``, ``(area)``, ``555-123-4567``
or ``555.123.4567``, and national numbers starting with 0 in spaced groups), so that years, prices and
identifiers in running text survive.
"""

from __future__ import annotations

import re

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_HEX = r"[0-9A-Fa-f]{1,4}"

PATTERNS: dict[str, str] = {
    "email": (
        r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@"
        r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![A-Za-z0-9-])"
    ),
    "ip": (
        rf"(?<![0-9A-Za-z.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\.?[0-9A-Za-z])"
        # IPv6, full or "::"-compressed; a digit is required so that C++ scopes like a::b survive.
        r"|(?<![0-9A-Za-z:.])(?=[0-9A-Fa-f:]*[0-9])(?:"
        rf"(?:{_HEX}:){{7}}{_HEX}"
        rf"|(?:{_HEX}:){{1,6}}:{_HEX}(?::{_HEX}){{0,5}}"
        rf"|(?:{_HEX}:){{1,7}}:"
        rf"|::(?:{_HEX}(?::{_HEX}){{0,6}})"
        r")(?![0-9A-Za-z:.])"
    ),
    "phone": (
        r"(?<![0-9A-Za-z+])(?:"
        r"\+[1-9][0-9]{0,2}[ .-]?(?:\([0-9]{1,4}\)[ .-]?)?[0-9]{1,4}(?:[ .-]?[0-9]{2,4}){2,4}"
        r"|\([0-9]{3}\) ?[0-9]{3}[ .-][0-9]{4}"
        r"|[0-9]{3}-[0-9]{3}-[0-9]{4}"
        r"|[0-9]{3}\.[0-9]{3}\.[0-9]{4}"
        r"|0[0-9]{2,4} [0-9]{3,4} [0-9]{3,4}"
        r")(?![0-9A-Za-z])"
    ),
}
KINDS = tuple(PATTERNS)
_COMPILED = {kind: re.compile(pattern) for kind, pattern in PATTERNS.items()}


def placeholders(config) -> dict[str, str]:
    """Placeholder per kind from a PiiConfig."""
    return {"email": config.email_placeholder, "ip": config.ip_placeholder, "phone": config.phone_placeholder}


def redact(text: str, replacements: dict[str, str]) -> tuple[str, dict[str, int]]:
    """(redacted text, matches per kind) in Python, with the patterns the Spark job uses."""
    counts = {}
    for kind in KINDS:
        text, counts[kind] = _COMPILED[kind].subn(replacements[kind].replace("\\", "\\\\"), text)
    return text, counts


def redact_column(text_col, replacements: dict[str, str]):
    """(redacted text column, struct of matches per kind) with Spark's built-in regex functions."""
    from pyspark.sql import functions as F

    counts = {}
    for kind in KINDS:
        pattern = F.lit(PATTERNS[kind])
        counts[kind] = F.coalesce(F.regexp_count(text_col, pattern), F.lit(0)).cast("int")
        # Java replacement strings treat $ and \ specially; the placeholder is literal.
        literal = replacements[kind].replace("\\", "\\\\").replace("$", "\\$")
        text_col = F.regexp_replace(text_col, pattern, F.lit(literal))
    return text_col, counts
