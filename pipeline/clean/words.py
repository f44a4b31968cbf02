"""Word and sentence splitting that counts the way datatrove's filters count.

datatrove's Gopher, C4 and FineWeb filters split English with spaCy's blank English tokenizer and count
sentences with spaCy's sentencizer. spaCy may not enter this environment, so ``SpacyRulesTokenizer`` runs
spaCy's tokenizer algorithm (whitespace split, special cases, prefix/suffix/infix rules, URL match, the
special-case matcher pass) on the rules exported from spaCy into ``data/spacy_en_tokenizer.json``
(``benchmarks/export_spacy_rules.py``). Chinese has no spaces between words: it is segmented with jieba,
as spaCy's Chinese pipeline does for datatrove.

Results are cached per whitespace-separated chunk: web text is Zipfian, so after a few documents almost
every chunk is a cache hit and splitting a document costs one dict lookup per chunk. The cache is bounded.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable
from functools import cache
from importlib import resources

RULES_FILE = resources.files("pipeline.clean") / "data" / "spacy_en_tokenizer.json"  # package data
_WHITESPACE_RUNS = re.compile(r"(\s+)")
# Languages written without spaces between words, segmented with jieba.
SEGMENTED_LANGUAGES = frozenset({"zh"})


class SpacyRulesTokenizer:
    """spaCy's ``Tokenizer.__call__`` for a language without ``token_match`` (English), in Python."""

    def __init__(self, rules: dict, cache_size: int = 200_000):
        self._prefix = re.compile(rules["prefix"]).search
        self._suffix = re.compile(rules["suffix"]).search
        self._infixes = re.compile(rules["infix"]).finditer
        self._url = re.compile(rules["url"]).match
        self._specials: dict[str, tuple[str, ...]] = {
            chunk: tuple(orths) for chunk, orths in rules["special_cases"].items()
        }
        # spaCy re-merges special cases that affix splitting would break apart (":)" in "word:)").
        # The matcher looks for their affix-only tokenisation; all English ones live inside one chunk.
        self._matcher: dict[str, list[tuple[tuple[str, ...], str]]] = {}
        for chunk in rules["matcher_special_cases"]:
            if chunk.isspace():
                continue
            pattern = tuple(self._split(chunk, with_special_cases=False))
            self._matcher.setdefault(pattern[0], []).append((pattern, chunk))
        self._cache: dict[str, tuple[str, ...]] = {}
        self._cache_size = cache_size
        self._sentence_cache: dict[str, tuple[tuple[tuple[int, bool], tuple[int, bool]], int]] = {}

    def chunk_tokens(self, chunk: str) -> tuple[str, ...]:
        """Tokens of one whitespace-free chunk."""
        tokens = self._cache.get(chunk)
        if tokens is None:
            special = self._specials.get(chunk)
            if special is None and chunk.isascii() and chunk.isalpha():
                tokens = (chunk,)  # no English prefix, suffix, infix or URL rule matches plain letters
            else:
                split = list(special) if special is not None else self._split(chunk, with_special_cases=True)
                tokens = self._apply_matcher(split)
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
                self._sentence_cache.clear()
            self._cache[chunk] = tokens
        return tokens

    def words(self, text: str) -> list[str]:
        """datatrove's ``split_into_words``: spaCy tokens without the whitespace ones."""
        words: list[str] = []
        extend, get = words.extend, self._cache.get
        for chunk in text.split():
            tokens = get(chunk)
            extend(tokens if tokens is not None else self.chunk_tokens(chunk))
        return words

    def tokens_with_spaces(self, text: str) -> list[str]:
        """All spaCy tokens, whitespace ones included: a whitespace run is a token, minus one leading
        ' ' when it follows a word."""
        tokens: list[str] = []
        for piece in _WHITESPACE_RUNS.split(text):
            if not piece:
                continue
            if piece[0].isspace():
                rest = piece[1:] if piece[0] == " " and tokens else piece
                if rest:
                    tokens.append(rest)
            else:
                tokens.extend(self.chunk_tokens(piece))
        return tokens

    def count_sentences(self, text: str) -> int:
        """Sentences by spaCy's sentencizer, as datatrove's ``split_into_sentences`` counts them."""
        return self.sentences_and_words(text)[0]

    def sentences_and_words(self, text: str) -> tuple[int, int]:
        """(sentences, words) of one line, from cached per-chunk sentencizer transitions."""
        chunks = text.split()
        spaces = text.count(" ")
        if not chunks or len(chunks) != spaces + 1 or len(text) - spaces != sum(map(len, chunks)):
            # Other whitespace than single spaces between words makes whitespace tokens: the slow way.
            return count_sentences(self.tokens_with_spaces(text)), len(self.words(text))
        boundaries, words, seen_period = 0, 0, False
        cache = self._sentence_cache
        for chunk in chunks:
            entry = cache.get(chunk)
            if entry is None:
                tokens = self.chunk_tokens(chunk)
                entry = cache[chunk] = (_sentence_transitions(tokens), len(tokens))
            transitions, size = entry
            found, seen_period = transitions[seen_period]
            boundaries += found
            words += size
        return 1 + boundaries, words

    def _split(self, string: str, with_special_cases: bool) -> list[str]:
        specials = self._specials if with_special_cases else {}
        prefixes: list[str] = []
        suffixes: list[str] = []
        last_size = 0
        while string and len(string) != last_size:
            if string in specials:
                break
            last_size = len(string)
            match = self._prefix(string)
            pre_len = match.end() - match.start() if match else 0
            if pre_len:
                prefix, minus_pre = string[:pre_len], string[pre_len:]
                if minus_pre and minus_pre in specials:
                    string = minus_pre
                    prefixes.append(prefix)
                    break
            match = self._suffix(string[pre_len:])
            suf_len = match.end() - match.start() if match else 0
            if suf_len:
                suffix, minus_suf = string[-suf_len:], string[:-suf_len]
                if minus_suf and minus_suf in specials:
                    string = minus_suf
                    suffixes.append(suffix)
                    break
            if pre_len and suf_len and pre_len + suf_len <= len(string):
                string = string[pre_len:-suf_len]
                prefixes.append(prefix)
                suffixes.append(suffix)
            elif pre_len:
                string = minus_pre
                prefixes.append(prefix)
            elif suf_len:
                string = minus_suf
                suffixes.append(suffix)
        tokens = prefixes
        if string:
            if string in specials:
                tokens.extend(specials[string])
            elif self._url(string):
                tokens.append(string)
            else:
                start = 0
                for match in self._infixes(string):
                    infix_start, infix_end = match.start(), match.end()
                    if infix_start == 0:
                        continue
                    if infix_start != start:
                        tokens.append(string[start:infix_start])
                    if infix_start != infix_end:
                        tokens.append(string[infix_start:infix_end])
                    start = infix_end
                if string[start:]:
                    tokens.append(string[start:])
        tokens.extend(reversed(suffixes))
        return tokens

    def _apply_matcher(self, tokens: list[str]) -> tuple[str, ...]:
        if len(tokens) < 2 or not any(token in self._matcher for token in tokens):
            return tuple(tokens)
        spans = []  # (start, end, special)
        for start, token in enumerate(tokens):
            for pattern, special in self._matcher.get(token, ()):
                end = start + len(pattern)
                if tuple(tokens[start:end]) == pattern:
                    spans.append((start, end, special))
        if not spans:
            return tuple(tokens)
        # spaCy keeps the longest spans first, earlier start on ties, never overlapping.
        spans.sort(key=lambda span: (-(span[1] - span[0]), span[0]))
        taken: set[int] = set()
        kept = []
        for start, end, special in spans:
            if start not in taken and end - 1 not in taken:
                kept.append((start, end, special))
            taken.update(range(start, end))
        by_start = {start: (end, special) for start, end, special in kept}
        merged: list[str] = []
        index = 0
        while index < len(tokens):
            if index in by_start:
                end, special = by_start[index]
                merged.extend(self._specials[special])
                index = end
            else:
                merged.append(tokens[index])
                index += 1
        return tuple(merged)


class JiebaTokenizer:
    """spaCy's Chinese tokenizer with the jieba segmenter, as datatrove uses for ``zh``."""

    def __init__(self):
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)
        self._cut = jieba.cut

    def words(self, text: str) -> list[str]:
        return [word for word in (piece.strip() for piece in self._cut(text, cut_all=False)) if word]

    def tokens_with_spaces(self, text: str) -> list[str]:
        return [piece for piece in self._cut(text, cut_all=False) if piece]

    def count_sentences(self, text: str) -> int:
        return count_sentences(self.tokens_with_spaces(text))

    def sentences_and_words(self, text: str) -> tuple[int, int]:
        tokens = self.tokens_with_spaces(text)
        return count_sentences(tokens), sum(1 for token in tokens if token.strip())


@cache
def spacy_rules() -> dict:
    return json.loads(RULES_FILE.read_text(encoding="utf-8"))


@cache
def sentence_punct_chars() -> frozenset[str]:
    return frozenset(spacy_rules()["sentence_punct_chars"])


@cache
def _is_punct(token: str) -> bool:
    """spaCy's ``is_punct`` lexeme flag: every character is Unicode punctuation."""
    return all(unicodedata.category(char).startswith("P") for char in token)


def count_sentences(tokens: list[str]) -> int:
    """spaCy's rule-based Sentencizer: a new sentence starts at the first non-punctuation token after
    a sentence-final character."""
    if not tokens:
        return 0
    punct_chars = sentence_punct_chars()
    sentences, seen_period = 1, False
    for token in tokens:
        in_punct_chars = token in punct_chars
        if seen_period and not in_punct_chars and not _is_punct(token):
            sentences += 1
            seen_period = False
        elif in_punct_chars:
            seen_period = True
    return sentences


def _sentence_transitions(tokens: tuple[str, ...]) -> tuple[tuple[int, bool], tuple[int, bool]]:
    """For a chunk's tokens: (new sentences, seen_period after) entering without and with a period seen."""
    punct_chars = sentence_punct_chars()
    transitions = []
    for seen_period in (False, True):
        found = 0
        for token in tokens:
            in_punct_chars = token in punct_chars
            if seen_period and not in_punct_chars and not _is_punct(token):
                found += 1
                seen_period = False
            elif in_punct_chars:
                seen_period = True
        transitions.append((found, seen_period))
    return transitions[0], transitions[1]


class Tokenizers:
    """One tokenizer per language, made on first use: spaCy rules, or jieba for unsegmented scripts.

    ``shared_tokenizers()`` is the one a process uses, so its bounded caches stay warm across the
    partitions a Spark Python worker processes.
    """

    def __init__(self):
        self._by_kind: dict[str, SpacyRulesTokenizer | JiebaTokenizer] = {}

    def for_language(self, lang: str | None) -> SpacyRulesTokenizer | JiebaTokenizer:
        kind = "jieba" if lang in SEGMENTED_LANGUAGES else "spacy"
        tokenizer = self._by_kind.get(kind)
        if tokenizer is None:
            factory: Callable[[], SpacyRulesTokenizer | JiebaTokenizer] = (
                JiebaTokenizer if kind == "jieba" else lambda: SpacyRulesTokenizer(spacy_rules())
            )
            tokenizer = self._by_kind[kind] = factory()
        return tokenizer


@cache
def shared_tokenizers() -> Tokenizers:
    return Tokenizers()
