"""A rule compares one signal with one threshold. The same rule runs in Python and as a Spark column.

Filters compute signals (numbers per document); rules decide. Keeping the two apart means every document
carries every signal, the decision is one Spark SQL expression over them (built-in functions only), and
each rule can be tested at, above and below its threshold without Spark.
"""

from __future__ import annotations

import math
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

    def sql_condition(self, signals_col: str = "signals", lang_col: str = "lang") -> str:
        """The drop condition as Spark SQL. A null signal or threshold makes it null: not a drop."""
        value = _signal_column(signals_col, self.signal)
        threshold = per_language_sql(lang_col, self.thresholds, sql_literal)
        compare = f"({value} {'=' if self.op == '==' else self.op} {threshold})"
        return f"({compare} AND {value} != 0)" if self.unless_zero else compare

    def sql_reason(self, signals_col: str = "signals", lang_col: str = "lang") -> str:
        """Why it dropped, as Spark SQL: "<rule>: <signal>=<value> <op> <threshold>"."""
        value = _signal_column(signals_col, self.signal)
        threshold = per_language_sql(
            lang_col, self.thresholds, lambda v: sql_literal(None if v is None else repr(v))
        )
        prefix = sql_literal(f"{self.name}: {self.signal.split('.')[1]}=")
        return (
            f"concat({prefix}, coalesce(CAST({value} AS STRING), 'null'), {sql_literal(f' {self.op} ')}, "
            f"coalesce({threshold}, 'null'))"
        )


def sql_literal(value: Any) -> str:
    """A Spark SQL literal of the type ``F.lit`` gives the value: NULL, BOOLEAN, INT/BIGINT, DOUBLE, STRING.

    Decisions are written as SQL text, not built as Column trees: a Column costs several Py4J calls per
    node, and the recipe's ~30 rules made that most of a clean run's driver time.
    """
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value!r}D" if math.isfinite(value) else f"CAST('{value!r}' AS DOUBLE)"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise TypeError(f"no Spark SQL literal for {value!r} ({type(value).__name__})")


def _signal_column(signals_col: str, signal: str) -> str:
    return ".".join(f"`{part}`" for part in (signals_col, *signal.split(".")))


def per_language_sql(lang_col: str, values: Mapping[str | None, Any], literal) -> str:
    """``values[lang]`` for the row's language, ``values[None]`` for any other, as a SQL CASE."""
    specific = [lang for lang in values if lang is not None]
    if not specific:
        return literal(values.get(None))
    cases = " ".join(
        f"WHEN `{lang_col}` = {sql_literal(lang)} THEN {literal(values[lang])}" for lang in specific
    )
    return f"CASE {cases} ELSE {literal(values.get(None))} END"


def first_failing(
    rules: Sequence[Rule], signals: Mapping[str, Mapping[str, Any]], lang: str | None
) -> Rule | None:
    """The first rule, in recipe order, that drops the document (datatrove stops at the first one)."""
    return next((rule for rule in rules if rule.drops(signals, lang)), None)


def per_language(default: Any, overrides: Mapping[str, Any]) -> dict[str | None, Any]:
    thresholds: dict[str | None, Any] = {None: default}
    thresholds.update({lang: value for lang, value in overrides.items() if value != default})
    return thresholds
