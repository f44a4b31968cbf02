"""The FineWeb recipe's quality filters, in its order: Gopher repetition, Gopher quality, C4, FineWeb.

Each filter module defines ``SIGNALS`` (an Arrow struct), a function computing them and ``rules(config,
languages)``. ``DocumentSignals`` computes every signal of one document in one pass over its words;
``recipe_rules`` lists every rule in the order the recipe applies them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import pyarrow as pa

from pipeline.clean.filters import c4, fineweb, gopher_quality, gopher_repetition
from pipeline.clean.words import SEGMENTED_LANGUAGES, shared_tokenizers
from pipeline.documents.rules import Rule, first_failing

FILTERS = (gopher_repetition, gopher_quality, c4, fineweb)
SIGNALS = pa.struct([(module.NAME, module.SIGNALS) for module in FILTERS])

__all__ = ["FILTERS", "SIGNALS", "DocumentSignals", "Rule", "first_failing", "recipe_rules"]


def recipe_rules(config, languages: Sequence[str]) -> list[Rule]:
    """Every filter rule in recipe order; ``config`` is a CleanConfig, ``languages`` those with overrides."""
    return [rule for module in FILTERS for rule in module.rules(config, languages)]


class TokenTable:
    """Word -> small integer id, with each word's length and Gopher properties, for numpy counting.

    Lives for one Spark partition and is cleared when it grows past ``max_words``, so memory stays
    bounded by the partition, not the corpus. Ids only need to agree within one document.
    """

    def __init__(self, max_words: int = 500_000):
        self._ids: dict[str, int] = {}
        self._max_words = max_words
        self.length = np.zeros(1024, dtype=np.int64)
        self.symbol = np.zeros(1024, dtype=bool)
        self.alpha = np.zeros(1024, dtype=bool)
        self.hash = np.zeros(1024, dtype=np.uint64)

    def encode(self, words: list[str]) -> np.ndarray:
        ids = self._ids
        try:
            encoded = [ids[word] for word in words]
        except KeyError:
            if len(ids) + len(words) > self._max_words:
                ids.clear()
            for word in words:
                if word not in ids:
                    self._add(word)
            encoded = [ids[word] for word in words]
        return np.array(encoded, dtype=np.int64)

    def _add(self, word: str) -> None:
        index = len(self._ids)
        if index == self.length.size:
            self.length = np.resize(self.length, index * 2)
            self.symbol = np.resize(self.symbol, index * 2)
            self.alpha = np.resize(self.alpha, index * 2)
            self.hash = np.resize(self.hash, index * 2)
        self._ids[word] = index
        self.length[index] = len(word)
        self.symbol[index] = gopher_quality.is_symbol_word(word)
        self.alpha[index] = gopher_quality.has_alpha(word)
        self.hash[index] = gopher_repetition.word_hash(word)


@cache
def shared_token_table() -> TokenTable:
    return TokenTable()


class DocumentSignals:
    """All filter signals of a document, and the text C4 leaves. One per Spark partition; the word
    caches behind it are per process and bounded."""

    def __init__(self, config):
        self.config = config  # CleanConfig
        self.tokenizers = shared_tokenizers()
        self.table = shared_token_table()
        self._by_language: dict[str | None, object] = {}

    def _language_config(self, lang: str | None):
        section = self._by_language.get(lang)
        if section is None:
            section = self._by_language[lang] = self.config.for_language(lang)
        return section

    def compute(self, text: str, lang: str | None) -> tuple[dict, str | None]:
        """(signals by filter, text after C4's line removals or None when C4 is off)."""
        config = self._language_config(lang)
        tokenizer = self.tokenizers.for_language(lang)
        words = tokenizer.words(text)
        ids = self.table.encode(words)
        lengths = self.table.length[ids]
        non_symbol = ~self.table.symbol[ids]
        lines = text.splitlines()
        stop_words = config.gopher_quality.stop_words
        signals: dict[str, dict[str, float | None] | None] = {
            gopher_repetition.NAME: gopher_repetition.signals(text, self.table.hash[ids], lengths),
            gopher_quality.NAME: gopher_quality.signals(
                text,
                lines,
                # jieba returns punctuation as tokens; for those languages the word rules count words only,
                # or "，" and "。" made half the "words" non-alphabetic (FineWeb2 counts words too).
                n_words=int(non_symbol.sum()) if lang in SEGMENTED_LANGUAGES else len(words),
                non_symbol_lengths=lengths[non_symbol].tolist(),
                n_alpha_words=int(self.table.alpha[ids].sum()),
                n_stop_words=len(set(stop_words).intersection(words)) if stop_words else None,
            ),
        }
        filtered_text = None
        if config.c4.enabled:
            segmented = lang in SEGMENTED_LANGUAGES
            result = c4.apply(
                text,
                config.c4,
                line_words=tokenizer.words if segmented else str.split,
                sentences_and_words=tokenizer.sentences_and_words,
            )
            signals[c4.NAME] = result.signals
            filtered_text = result.text
        else:
            signals[c4.NAME] = None
        fineweb_text = text if filtered_text is None else filtered_text
        fineweb_words = len(words) if filtered_text is None else result.words
        signals[fineweb.NAME] = fineweb.signals(fineweb_text, fineweb_words, config.fineweb.short_line_length)
        return signals, filtered_text
