"""Charset detection and repair in pipeline.documents.extract: the declared charset is checked against the bytes."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.documents.extract import (
    DecodedHtml,
    codec_name,
    declared_charset,
    decode_html,
    decode_html_detailed,
)

FRENCH = [
    "café",
    "crème",
    "brûlée",
    "naïve",
    "façade",
    "déjà",
    "où",
    "été",
    "garçon",
    "leçon",
    "hôtel",
    "forêt",
    "élève",
    "noël",
    "cœur",
]
GERMAN = [
    "Grüße",
    "aus",
    "München",
    "schöne",
    "Straße",
    "Mädchen",
    "Bäcker",
    "Käse",
    "Brücke",
    "über",
    "fröhlich",
]
RUSSIAN = [
    "Привет",
    "мир",
    "как",
    "дела",
    "это",
    "простой",
    "тест",
    "на",
    "русском",
    "языке",
    "сегодня",
    "хорошая",
    "погода",
]
GREEK = ["Καλημέρα", "κόσμε", "αυτό", "είναι", "ένα", "απλό", "κείμενο", "για", "δοκιμή", "της", "ανίχνευσης"]
POLISH = "Zażółć gęślą jaźń to przykład polskiego tekstu, źródło z Łodzi, który ma sporo znaków."
CHINESE = ["茶起源于中国", "已有数千年的历史", "不同地区的茶有不同的风味", "今天很多人仍然喜欢泡茶"]


def sentences(words, minimum=12):
    return st.lists(st.sampled_from(words), min_size=minimum, max_size=40).map(" ".join)


def page(text: str) -> str:
    return f"<html><body><p>{text}</p></body></html>"


@settings(deadline=None, max_examples=60)
@given(st.one_of(sentences(FRENCH), sentences(GERMAN), sentences(RUSSIAN), sentences(CHINESE, 3)))
def test_utf8_bytes_declared_latin1_are_read_as_utf8(text):
    decoded = decode_html_detailed(page(text).encode("utf-8"), "text/html; charset=ISO-8859-1")
    assert decoded.text == page(text)
    assert (decoded.charset, decoded.fix) == ("utf_8", "declared_mismatch")


@settings(deadline=None, max_examples=60)
@given(
    st.one_of(sentences(FRENCH), sentences(GERMAN)),
    st.sampled_from(["text/html; charset=utf-8", "text/html"]),
)
def test_cp1252_bytes_declared_utf8_or_undeclared_are_repaired(text, content_type):
    decoded = decode_html_detailed(page(text).encode("cp1252"), content_type)
    assert decoded.text == page(text)
    assert decoded.charset == "cp1252"
    assert decoded.fix == ("declared_mismatch" if "charset" in content_type else "detected")


@settings(deadline=None, max_examples=40)
@given(st.one_of(sentences(FRENCH), sentences(RUSSIAN), sentences(GREEK), sentences(CHINESE, 3)))
def test_a_correct_declaration_is_kept(text):
    for encoding, label in (("utf-8", "utf-8"), ("utf-16", "utf-16")):
        decoded = decode_html_detailed(page(text).encode(encoding), f"text/html; charset={label}")
        assert decoded.text.lstrip("\ufeff") == page(text)
        assert decoded.fix is None


@pytest.mark.parametrize(
    ("text", "encoding", "content_type", "fix"),
    [
        (" ".join(RUSSIAN), "cp1251", "text/html; charset=cp1251", None),
        (" ".join(RUSSIAN), "cp1251", "text/html; charset=windows-1252", "declared_mismatch"),
        (" ".join(RUSSIAN), "cp1251", None, "detected"),
        (" ".join(GREEK), "cp1253", "text/html; charset=windows-1253", None),
        (" ".join(GREEK), "cp1253", None, "detected"),
        (" ".join(CHINESE), "gb18030", "text/html; charset=gb2312", None),
        (POLISH, "cp1250", None, "detected"),
        (POLISH, "cp1250", "text/html; charset=iso-8859-1", "declared_mismatch"),
        (" ".join(FRENCH), "cp1252", "text/html; charset=no-such-charset", "declared_unknown"),
    ],
)
def test_legacy_charsets(text, encoding, content_type, fix):
    decoded = decode_html_detailed(page(text).encode(encoding), content_type)
    assert decoded.text == page(text)
    assert decoded.fix == fix
    assert decoded.fix is None or decoded.fix in DecodedHtml.fixes()


def test_meta_declaration_bom_and_stray_bytes():
    body = '<meta http-equiv="Content-Type" content="text/html; charset=windows-1251"><p>Привет, мир</p>'
    assert declared_charset(None, body.encode("cp1251")) == "windows-1251"
    assert declared_charset("text/html; charset=UTF-8", b"<meta charset='latin1'>") == "utf-8", (
        "HTTP header wins"
    )
    assert decode_html(body.encode("cp1251"), None) == body
    assert (
        decode_html_detailed(b"\xef\xbb\xbf<p>\xc3\xa9</p>", "text/html; charset=latin-1").text == "<p>é</p>"
    )
    mostly_utf8 = page(" ".join(FRENCH)).encode("utf-8").replace("ô".encode(), b"\xf4")
    decoded = decode_html_detailed(mostly_utf8, "text/html; charset=utf-8")
    assert decoded.fix == "invalid_bytes_replaced"
    assert decoded.text == page(" ".join(FRENCH)).replace("ô", "\ufffd")


def test_codec_names_follow_browsers():
    assert codec_name("ISO-8859-1") == codec_name("us-ascii") == codec_name("windows-1252") == "cp1252"
    assert codec_name("UTF8") == "utf_8"
    assert codec_name("x-unknown") is None
