"""A rule compares one signal with one threshold. The same rule runs in Python and as a Spark column.

Filters compute signals (numbers per document); rules decide. Keeping the two apart means every document
carries every signal, the decision is one Spark SQL expression over them (built-in functions only), and
each rule can be tested at, above and below its threshold without Spark.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_OPS = {"<": operator.lt, ">": operator.gt, "==": operator.eq}


@dataclass(frozen=True)
class Rule:
    """Drop a document when ``signals[filter][signal] <op> threshold``.

    ``thresholds`` maps a language to its threshold; ``None`` is the default for all other languages.
    A threshold of ``None`` switches the rule off (for that language). A missing signal never drops.
    """

    name: str  # "<filter>.<rule>", e.g. "gopher_quality.min_doc_words"
    signal: str  # "<filter>.<signal>", a field of the signals struct
    op: str
    thresholds: Mapping[str | None, Any]
    unless_zero: bool = False  # FineWeb's line_punct_exclude_zero: a ratio of exactly 0 is let through

    def threshold(self, lang: str | None) -> Any:
        return self.thresholds.get(lang, self.thresholds.get(None))

    def drops(self, signals: Mapping[str, Mapping[str, Any]], lang: str | None) -> bool:
        threshold = self.threshold(lang)
        filter_name, signal_name = self.signal.split(".")
        value = (signals.get(filter_name) or {}).get(signal_name)
        if threshold is None or value is None:
            return False
        if self.unless_zero and value == 0:
            return False
        return _OPS[self.op](value, threshold)

    def spark_condition(self, signals_col: str = "signals", lang_col: str = "lang"):
        from pyspark.sql import functions as F

        value = F.col(f"{signals_col}.{self.signal}")
        languages = [lang for lang in self.thresholds if lang is not None]
        threshold = F.lit(self.thresholds.get(None))
        for lang in languages:
            threshold = F.when(F.col(lang_col) == lang, F.lit(self.thresholds[lang])).otherwise(threshold)
        compare = {"<": value < threshold, ">": value > threshold, "==": value == threshold}[self.op]
        if self.unless_zero:
            compare = compare & (value != 0)
        # A null signal or threshold makes the comparison null, which `when` treats as false.
        return compare

    def spark_reason(self, signals_col: str = "signals", lang_col: str = "lang"):
        from pyspark.sql import functions as F

        value = F.col(f"{signals_col}.{self.signal}").cast("string")
        threshold = F.lit(None).cast("string")
        default = self.thresholds.get(None)
        if default is not None:
            threshold = F.lit(repr(default))
        for lang in (lang for lang in self.thresholds if lang is not None):
            specific = self.thresholds[lang]
            threshold = F.when(
                F.col(lang_col) == lang, F.lit(repr(specific) if specific is not None else None)
            ).otherwise(threshold)
        prefix = F.lit(f"{self.name}: {self.signal.split('.')[1]}=")
        return F.concat(
            prefix,
            F.coalesce(value, F.lit("null")),
            F.lit(f" {self.op} "),
            F.coalesce(threshold, F.lit("null")),
        )


def first_failing(
    rules: Sequence[Rule], signals: Mapping[str, Mapping[str, Any]], lang: str | None
) -> Rule | None:
    """The first rule, in recipe order, that drops the document (datatrove stops at the first one)."""
    return next((rule for rule in rules if rule.drops(signals, lang)), None)


def per_language(default: Any, overrides: Mapping[str, Any]) -> dict[str | None, Any]:
    thresholds: dict[str | None, Any] = {None: default}
    thresholds.update({lang: value for lang, value in overrides.items() if value != default})
    return thresholds
