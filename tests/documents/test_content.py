"""Binary bodies served as text are recognised; text in any common charset is not."""

import gzip
import io
import random
import zipfile

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.documents.content import looks_binary
from tests.crawl.testsite import PNG_BYTES

ENCODINGS = ["utf-8", "cp1252", "cp1251", "shift_jis", "gb18030", "iso-8859-7", "utf-16", "utf-8-sig"]


@settings(deadline=None)
@given(st.text(min_size=1, max_size=400), st.sampled_from(ENCODINGS))
def test_text_in_any_common_charset_is_not_binary(text, encoding):
    text = "".join(char for char in text if char.isprintable() or char in "\n\t")
    try:
        body = f"<html><body><p>{text}</p></body></html>".encode(encoding)
    except UnicodeEncodeError:
        return
    assert not looks_binary(body)


def test_binary_formats_are_recognised():
    rng = random.Random(5)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("a.txt", "hello" * 100)
    samples = [
        PNG_BYTES,
        b"\xff\xd8\xff\xe0" + bytes(rng.getrandbits(8) for _ in range(500)),
        b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj",
        gzip.compress(b"<html>compressed twice</html>"),
        archive.getvalue(),
        bytes(rng.getrandbits(8) for _ in range(2000)),  # e.g. encrypted or compressed data
        b"\x00\x00\x01\x00" + bytes(300),
    ]
    for sample in samples:
        assert looks_binary(sample), sample[:12]
    assert not looks_binary(b"")
