from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.documents.normalize import decode_utf8, normalize_text


def test_keeps_punctuation_and_symbols():
    text = "Hello, world! It's 5 p.m. — time for tea (and cake?) #1 @home: 50% off; “quoted”."
    assert normalize_text(text) == text


def test_the_normal_form_controls_and_whitespace():
    assert normalize_text("ｆｕｌｌ\u00a0width", "NFKC") == "full width"
    assert normalize_text("ｆｕｌｌ\u00a0width") == "ｆｕｌｌ width"  # NFC: text as written, the NBSP a space
    assert normalize_text("花园，很美。", "NFKC") == "花园,很美。"
    assert normalize_text("花园，很美。") == "花园，很美。"
    assert normalize_text("zero\u200bwidth\x07 bell\ufeff") == "zerowidth bell"
    assert normalize_text("a \t  b\r\n\r\n\r\n\r\nc  \n") == "a b\n\nc"
    assert normalize_text("line one\nline two") == "line one\nline two", "single newlines survive"


@given(st.text(), st.sampled_from(["NFC", "NFKC"]))
def test_idempotent_and_free_of_controls(text, form):
    once = normalize_text(text, form)
    assert normalize_text(once, form) == once
    assert not any(ord(c) < 32 and c != "\n" for c in once)
    assert "\n\n\n" not in once


def test_mojibake_is_repaired():
    original = "The Mona Lisa doesn’t have eyebrows — café, schön."
    assert normalize_text(original.encode("utf-8").decode("cp1252")) == original  # "doesnâ€™t"
    with_cjk = original + " 東京."
    assert normalize_text(with_cjk.encode("utf-8").decode("latin-1")) == with_cjk


def test_curly_quotes_and_entities_are_content():
    text = "He said “stop” &amp; left…"
    assert normalize_text(text) == text
    assert normalize_text(text, "NFKC") == "He said “stop” &amp; left..."  # … into ..., quotes stay


def test_invalid_bytes_and_surrogates_become_replacement_characters():
    raw = "caf\xc3\xa9 \xed\xa0\x80 \xff end".encode("latin-1")
    assert decode_utf8(raw) == "café \ufffd\ufffd\ufffd \ufffd end"
    assert "\ud800" not in normalize_text("lone \ud800 surrogate")


PIECES = [
    *"aeiou AEIOU.,;'\"\n",
    *(chr(c) for c in range(0x80, 0x180)),
    *"€‚ƒ„…†‡ˆ‰Š‹ŒŽ‘’“”•–—˜™š›œžŸ",
    "\x1b[0m",
    "\ufffd",
    "\u2019",
    "\u00e2\u20ac\u2122",
    "\u00c3\u00a9",
    "\ud83d",
    "\ude00",
    "中文",
    *"ГўВЂВвЂβ€ΒΓΞΟ‚Ä√≈×Œœ│░āØ",
]
MOJIBAKE_PRONE = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@settings(max_examples=1000, deadline=None)
@given(MOJIBAKE_PRONE)
def test_skipping_ftfy_never_changes_the_result(text):
    import ftfy

    from pipeline.documents.normalize import _ftfy_config, repair_mojibake

    assert repair_mojibake(text) == ftfy.fix_text(text, _ftfy_config())
