from hypothesis import given
from hypothesis import strategies as st

from pipeline.clean.normalize import normalize_text


def test_keeps_punctuation_and_symbols():
    text = "Hello, world! It's 5 p.m. — time for tea (and cake?) #1 @home: 50% off; “quoted”."
    assert normalize_text(text) == text


def test_nfkc_controls_and_whitespace():
    assert normalize_text("ｆｕｌｌ\u00a0width") == "full width"
    assert normalize_text("zero\u200bwidth\x07 bell\ufeff") == "zerowidth bell"
    assert normalize_text("a \t  b\r\n\r\n\r\n\r\nc  \n") == "a b\n\nc"
    assert normalize_text("line one\nline two") == "line one\nline two", "single newlines survive"


@given(st.text())
def test_idempotent_and_free_of_controls(text):
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert not any(ord(c) < 32 and c != "\n" for c in once)
    assert "\n\n\n" not in once
