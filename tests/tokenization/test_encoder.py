import itertools
import json
import unicodedata

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from pipeline.tokenization.bpe import train_tokenizer
from pipeline.tokenization.config import TokenizerConfig
from pipeline.tokenization.encoder import (
    DocumentEncoder,
    repair_text,
    split_long_text,
    texts_from_arrow,
)

EOS = "<|endoftext|>"
TEXTS = [
    "The mill ground flour for the valley.",
    "茶起源于中国。",
    "for i in range(10):\n    print(i)\n",
    "🚲🐝 emoji",
]


@pytest.fixture(scope="module")
def encoder():
    tokenizer = train_tokenizer(TEXTS * 20, TokenizerConfig(vocab_size=400, min_frequency=1))
    return DocumentEncoder.for_tokenizer(tokenizer, EOS, chunk_chars=1000)


def decode_documents(encoder, tokens, lengths):
    documents = np.split(tokens, np.cumsum(lengths)[:-1])
    assert all(document[-1] == encoder.eos_id for document in documents)
    assert all(encoder.eos_id not in document[:-1] for document in documents)
    return [encoder.tokenizer.decode(document[:-1].tolist()) for document in documents]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=" \n\tab\u0301\u200dc茶é", max_size=400), st.integers(4, 50))
def test_long_text_pieces_concatenate_to_the_text_and_respect_the_limit(text, chunk_chars):
    pieces = split_long_text(text, chunk_chars)
    assert "".join(pieces) == text
    assert all(0 < len(piece) <= chunk_chars for piece in pieces) or text == ""
    is_mark = lambda char: unicodedata.combining(char) or char == "\u200d"  # noqa: E731
    offset = 0
    for before, piece in itertools.pairwise(pieces):
        offset += len(before)
        if is_mark(piece[0]):
            # Only when marks fill the rest of the window (Zalgo text) may a cut land among them.
            assert len(before) == chunk_chars // 2
            assert all(map(is_mark, text[offset : offset - len(before) + chunk_chars + 1]))


def test_documents_end_in_eos_and_decode_to_their_nfkc_text(encoder):
    texts = [*TEXTS, "ｆｕｌｌ ﬁ", ""]
    tokens, lengths = encoder.encode(texts)
    assert tokens.dtype == np.uint16 and lengths.sum() == len(tokens)
    assert decode_documents(encoder, tokens, lengths) == [unicodedata.normalize("NFC", t) for t in texts]


def test_long_documents_are_encoded_in_chunks_and_counted(encoder):
    rng = np.random.default_rng(0)
    words = ["mill", "river", "茶", "flour", "\n", "🐝", "wheel"]
    long_text = " ".join(rng.choice(words, size=3000))
    no_spaces = "茶中国" * 700
    before = encoder.counters.chunked_documents
    texts = ["short one", long_text, "another", no_spaces]
    tokens, lengths = encoder.encode(texts)
    assert encoder.counters.chunked_documents - before == 2
    assert decode_documents(encoder, tokens, lengths) == texts


def test_special_token_text_stays_plain_text(encoder):
    text = f"a page that quotes {EOS} and <|pad|> literally"
    tokens, lengths = encoder.encode([text, "next"])
    assert decode_documents(encoder, tokens, lengths) == [text, "next"]
    assert list(tokens).count(encoder.eos_id) == 2


def brought_tokenizer(tokenizer: Tokenizer, *unmarked: str) -> Tokenizer:
    """``tokenizer`` as a brought tokenizer.json may have it: ``unmarked`` added as plain (not special)
    tokens, which tokenizers matches in the input even with encode_special_tokens."""
    described = json.loads(tokenizer.to_str())
    for token in described["added_tokens"]:
        if token["content"] in unmarked:
            token["special"] = False
    return Tokenizer.from_str(json.dumps(described))


def test_text_spelling_any_special_token_never_yields_its_id(encoder):
    """A brought tokenizer whose end-of-text and padding tokens are plain added tokens: a document spelling
    them (and the other special tokens) got the end-of-text id mid-document. Their text is now plain text;
    every other text encodes to the same ids as before."""
    specials = {
        token.content: token_id for token_id, token in encoder.tokenizer.get_added_tokens_decoder().items()
    }
    tokenizer = brought_tokenizer(Tokenizer.from_str(encoder.tokenizer.to_str()), EOS, "<|pad|>")
    brought = DocumentEncoder.for_tokenizer(tokenizer, EOS, 1000, pad_token="<|pad|>")
    assert brought.eos_id == encoder.eos_id
    spelled = f"{EOS}a page quoting {EOS} and " + " ".join(specials) + f" literally{EOS}"
    texts = [spelled, *TEXTS, f"{EOS}<|pad|>"]
    tokens, lengths = brought.encode(texts)
    assert decode_documents(brought, tokens, lengths) == texts  # the end-of-text id only at each end
    inside = np.concatenate([document[:-1] for document in np.split(tokens, np.cumsum(lengths)[:-1])])
    assert not set(inside.tolist()) & set(specials.values())
    # Text that spells no special token: the ids it had before, and those of the tokenizer as brought.
    ordinary, _ = brought.encode(TEXTS)
    expected = [[*encoding.ids, encoder.eos_id] for encoding in encoder.tokenizer.encode_batch_fast(TEXTS)]
    assert ordinary.tolist() == [token for document in expected for token in document]
    plain = brought_tokenizer(Tokenizer.from_str(encoder.tokenizer.to_str()), EOS, "<|pad|>")
    assert [e.ids for e in plain.encode_batch_fast(TEXTS, add_special_tokens=False)] == [
        d[:-1] for d in expected
    ]


def test_lone_surrogates_are_replaced_and_counted(encoder):
    before = encoder.counters.repaired_unicode
    tokens, lengths = encoder.encode(["fine", "bad \ud800 half", "also \udfff", "pair \ud83d\udc1d"])
    assert encoder.counters.repaired_unicode - before == 3
    assert decode_documents(encoder, tokens, lengths) == ["fine", "bad \ufffd half", "also \ufffd", "pair 🐝"]
    assert repair_text("ok") == ("ok", False)


def test_invalid_utf8_from_arrow_is_replaced_and_counted():
    raw = pa.array([b"ok", b"\xed\xa0\x80 surrogate", b"bad \xff byte", None], pa.binary())
    texts, repaired = texts_from_arrow(raw.view(pa.string()))
    assert texts == ["ok", "\ufffd\ufffd\ufffd surrogate", "bad \ufffd byte", None]
    assert repaired == 2
    assert texts_from_arrow(pa.array(["a", "茶"])) == (["a", "茶"], 0)


def test_large_vocabularies_encode_to_int32():
    tokenizer = train_tokenizer(TEXTS, TokenizerConfig(vocab_size=400, min_frequency=1))
    encoder = DocumentEncoder(tokenizer, 0, np.dtype(np.int32))
    tokens, _ = encoder.encode(TEXTS)
    assert tokens.dtype == np.int32
    with pytest.raises(ValueError, match="no end-of-text token"):
        DocumentEncoder.for_tokenizer(tokenizer, "<|missing|>", 1000)


def test_chars_per_token_is_measured_not_clamped():
    """It was clamped to at least 1.0, though Chinese text measured about 0.99."""
    from types import SimpleNamespace

    from pipeline.tokenization.job import estimate_chars_per_token

    class ThreeTokensPerCharacter:  # a byte-level BPE that merged nothing: one token per UTF-8 byte
        def encode_batch_fast(self, texts):
            return [SimpleNamespace(ids=list(text.encode())) for text in texts]

    assert estimate_chars_per_token(ThreeTokensPerCharacter(), ["茶起源于中国"]) == 1 / 3
    assert estimate_chars_per_token(ThreeTokensPerCharacter(), ["ab", "c"]) == 1.0
    assert estimate_chars_per_token(ThreeTokensPerCharacter(), [""]) == 1.0  # nothing to measure
