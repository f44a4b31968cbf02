"""Terminal control sequences (ANSI colours and the like) leave pages and texts whole.

On real material (5,671 Chinese poems with colour codes) `[32m...[m` survived the crawl path in 5,548
texts: the HTML parser dropped the ESC control and the normaliser no longer saw a sequence.
"""

import io
from datetime import UTC, datetime

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from pipeline.documents.extract import extract_batches
from pipeline.documents.normalize import normalize_text, strip_terminal_escapes

SEQUENCES = [
    "\x1b[32m",
    "\x1b[m",
    "\x1b[1;31m",
    "\x1b[0K",
    "\x9b33m",
    "\x1b]0;a title\x07",
    "\x1b]2;t\x1b\\",
    "\x1bM",
]
PLAIN = st.text(st.characters(blacklist_characters="\x1b\x9b", blacklist_categories=("Cs",)), max_size=60)


@given(st.lists(st.tuples(PLAIN, st.sampled_from(SEQUENCES)), max_size=8), PLAIN)
def test_every_sequence_goes_whole_and_nothing_else_does(pieces, tail):
    text = "".join(plain for plain, _ in pieces) + tail
    with_escapes = "".join(plain + escape for plain, escape in pieces) + tail
    assert strip_terminal_escapes(with_escapes) == text
    assert normalize_text(with_escapes) == normalize_text(text)


POEM = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
PROSE = "The lighthouse keeper climbed the stairs each evening to light the lamp for the ships at sea."


def page_with_colour_codes() -> bytes:
    paragraphs = "".join(f"<p>\x1b[32m{POEM}\x1b[m \x1b[1;31m{PROSE}\x1b[0m</p>" for _ in range(4))
    return f"<html><head><title>\x1b]0;poems\x07</title></head><body><article>{paragraphs}</article></body></html>".encode()


def test_a_crawled_page_with_colour_codes_extracts_without_them(tmp_path):
    warc = tmp_path / "page.warc.gz"
    with open(warc, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        headers = StatusAndHeaders(
            "200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1"
        )
        record = writer.create_warc_record(
            "https://poems.example/1",
            "response",
            payload=io.BytesIO(page_with_colour_codes()),
            http_headers=headers,
        )
        writer.write_record(record)
    row = {
        "id": "p1",
        "url": "https://poems.example/1",
        "domain": "poems.example",
        "fetch_time": datetime(2026, 11, 1, tzinfo=UTC),
        "warc_file": warc.name,
        "warc_offset": 0,
        "content_type": "text/html; charset=utf-8",
    }
    (out,) = list(extract_batches(iter([pa.RecordBatch.from_pylist([row])]), str(tmp_path)))
    (text,) = out.column("text").to_pylist()
    assert POEM in text and PROSE in text
    assert "[32m" not in text and "[m" not in text and "\x1b" not in text and "[0m" not in text
