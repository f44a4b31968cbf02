"""Word and sentence splitting: the spaCy-rules tokenizer against outputs recorded from spaCy 3.8 itself."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.clean.words import (
    JiebaTokenizer,
    SpacyRulesTokenizer,
    Tokenizers,
    count_sentences,
    spacy_rules,
)

ROOT = Path(__file__).resolve().parents[2]

# (text, spaCy blank("en") tokens without whitespace, sentences by spaCy's sentencizer), recorded in
# .venv-bench with spaCy 3.8.18.
SPACY_RECORDED = [
    ("#tag and # alone", ["#", "tag", "and", "#", "alone"], 1),
    ("Wait... what?! Yes.", ["Wait", "...", "what", "?", "!", "Yes", "."], 2),
    ("Hello world. This is fine.", ["Hello", "world", ".", "This", "is", "fine", "."], 2),
    ("e.g. this is one. And U.S. law applies!", ["e.g.", "this", "is", "one", ".", "And", "U.S.", "law", "applies", "!"], 2),
    ('He said "stop." Then left.', ["He", "said", '"', "stop", ".", '"', "Then", "left", "."], 2),
    ("x … y", ["x", "…", "y"], 1),
    (
        "I'm here, aren't you? Its 3.5kg (approx.) — well-known.",
        ["I", "'m", "here", ",", "are", "n't", "you", "?", "Its", "3.5", "kg", "(", "approx", ".", ")", "—",
         "well", "-", "known", "."],
        3,
    ),
    (
        "Visit https://example.com/a.b?c=1. Or www.example.org!",
        ["Visit", "https://example.com/a.b?c=1", ".", "Or", "www.example.org", "!"],
        2,
    ),
    ("Prices: $5, 10% off; 3-4 days.", ["Prices", ":", "$", "5", ",", "10", "%", "off", ";", "3", "-", "4", "days", "."], 1),
    ("word:) dont cannot 10a.m.", ["word", ":)", "do", "nt", "can", "not", "10", "a.m."], 1),
]  # fmt: skip


@pytest.fixture(scope="module")
def english() -> SpacyRulesTokenizer:
    return SpacyRulesTokenizer(spacy_rules())


@pytest.mark.parametrize(("text", "tokens", "sentences"), SPACY_RECORDED)
def test_matches_recorded_spacy_output(english, text, tokens, sentences):
    assert english.words(text) == tokens
    assert english.count_sentences(text) == sentences
    assert count_sentences(english.tokens_with_spaces(text)) == sentences


def test_whitespace_tokens_count_as_sentence_starts(english):
    # spaCy makes "\n" a token; after a full stop it opens a sentence even with nothing after it.
    assert english.count_sentences("One.\n") == 2
    assert english.count_sentences("One. Two.") == 2
    assert english.count_sentences("") == 0


def test_rules_file_comes_from_the_pinned_spacy():
    pinned = next(
        line.split("==")[1].strip()
        for line in (ROOT / "benchmarks" / "requirements.lock").read_text().splitlines()
        if line.startswith("spacy==")
    )
    source = json.loads((ROOT / "pipeline" / "clean" / "data" / "spacy_en_tokenizer.json").read_text())[
        "source"
    ]
    assert f"spaCy {pinned} " in source, (
        "re-run benchmarks/export_spacy_rules.py after changing the spaCy pin"
    )


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=60))
def test_tokens_partition_each_chunk(text):
    english = SpacyRulesTokenizer(spacy_rules())
    for chunk in text.split():
        assert "".join(english.chunk_tokens(chunk)) == chunk
    assert english.words(text) == [token for chunk in text.split() for token in english.chunk_tokens(chunk)]
    assert english.count_sentences(text) == count_sentences(english.tokens_with_spaces(text))
    assert english.sentences_and_words(text)[1] == len(english.words(text))


def test_chinese_is_segmented_with_jieba():
    chinese = JiebaTokenizer()
    words = chinese.words("茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材。")
    assert "中国" in words and "历史" in words and "，" in words
    assert "".join(words) == "茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材。"
    assert chinese.count_sentences("今天天气很好。我们去公园散步吧！好的。") == 3
    line = "今天天气很好。 我们去公园散步吧！"
    assert chinese.sentences_and_words(line) == (2, len(chinese.words(line)))
    assert isinstance(Tokenizers().for_language("zh"), JiebaTokenizer)
    assert isinstance(Tokenizers().for_language("de"), SpacyRulesTokenizer)
