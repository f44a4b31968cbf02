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


# Cheap necessary conditions, one per kind: every match of the kind's pattern contains a match of its gate.
# (Placeholders hold no digits, "@" or ":", so a gate on the original text also covers the later kinds.)
GATES = {
    "email": "@",  # a literal: String.contains, no regex
    "ip": r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]|:[0-9A-Fa-f]{0,4}:",  # not version numbers like 3.11.7
    # not years, ranges or counts like 1990, 2019-2020 or (1990)
    "phone": r"\+[1-9]|\([0-9]{3}\)|[0-9]{3}-[0-9]{3}-[0-9]|[0-9]{3}\.[0-9]{3}\.[0-9]|0[0-9]{2,4} [0-9]{3}",
}


def redact_dataframe(df, replacements: dict[str, str], text_col: str = "text", counts_col: str = "pii"):
    """``df`` with PII in ``text_col`` replaced and a ``counts_col`` struct of matches per kind, using only
    Spark's built-in string and regex functions.

    Each kind's full pattern runs only on texts its gate lets through, and replaces only where it counted
    a match; each step is its own column, so Spark evaluates every regex once per row.
    """
    from pyspark.sql import functions as F

    text = F.col(text_col)
    for kind in KINDS:
        gate = text.contains(GATES[kind]) if kind == "email" else text.rlike(GATES[kind])
        df = df.withColumn(f"_pii_gate_{kind}", F.coalesce(gate, F.lit(False)))
    for kind in KINDS:
        pattern = F.lit(PATTERNS[kind])
        # Java replacement strings treat $ and \ specially; the placeholder is literal.
        literal = F.lit(replacements[kind].replace("\\", "\\\\").replace("$", "\\$"))
        count = F.col(f"_pii_{kind}")
        df = df.withColumn(
            f"_pii_{kind}",
            F.when(F.col(f"_pii_gate_{kind}"), F.coalesce(F.regexp_count(text, pattern), F.lit(0))).otherwise(
                0
            ),
        ).withColumn(text_col, F.when(count > 0, F.regexp_replace(text, pattern, literal)).otherwise(text))
    counts = F.struct(*[F.col(f"_pii_{kind}").cast("int").alias(kind) for kind in KINDS])
    helpers = [f"_pii_{kind}" for kind in KINDS] + [f"_pii_gate_{kind}" for kind in KINDS]
    return df.withColumn(counts_col, counts).drop(*helpers)
