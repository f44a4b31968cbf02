"""Small source files of every kind the ingest stage reads, each with hostile records, and what to expect.

The WARC and WET files follow Common Crawl's layout (warcinfo first; request, response and metadata records
per page in a WARC; one conversion record per page in a WET), written with warcio.
"""

from __future__ import annotations

import gzip
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import trafilatura
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from tests.conftest import PROJECT_ROOT

ARTICLES = sorted((PROJECT_ROOT / "pipeline" / "crawl" / "sample_site" / "articles").glob("*.html"))
MAX_RECORD_BYTES = 200_000
HUGE = "x" * (MAX_RECORD_BYTES + 10)
NO_MAIN_TEXT = b"<html><head><title>t</title></head><body><script>var x = 1;</script></body></html>"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def html(index: int) -> bytes:
    return ARTICLES[index].read_bytes()


def text(index: int) -> str:
    return trafilatura.extract(html(index).decode("utf-8"), favor_precision=True)


def url(index: int) -> str:
    return f"https://articles.example.org/{ARTICLES[index].stem}"


def _response(writer: WARCWriter, target: str, body: bytes, status: str = "200 OK", ctype: str = "text/html"):
    headers = StatusAndHeaders(
        status, [("Content-Type", ctype), ("Content-Length", str(len(body)))], "HTTP/1.1"
    )
    date = {"WARC-Date": "2026-11-20T10:00:00Z"}
    request = writer.create_warc_record(
        target,
        "request",
        payload=io.BytesIO(b""),
        http_headers=StatusAndHeaders(
            "GET / HTTP/1.1", [("Host", "articles.example.org")], is_http_request=True
        ),
        warc_headers_dict=date,
    )
    response = writer.create_warc_record(
        target, "response", payload=io.BytesIO(body), http_headers=headers, warc_headers_dict=date
    )
    metadata = writer.create_warc_record(
        target,
        "metadata",
        payload=io.BytesIO(b"fetchTimeMs: 12\n"),
        warc_content_type="application/warc-fields",
    )
    for record in (request, response, metadata):
        writer.write_record(record)


def write_warc(folder: Path) -> dict:
    """CC-style WARC: 3 article pages; a binary body, a 404, an image, an oversized page, a page with no main
    text; and a second file of 2 pages whose gzip stream is cut inside its last (metadata) record."""
    path = folder / "CC-MAIN-test-00000.warc.gz"
    with open(path, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        writer.write_record(writer.create_warcinfo_record(path.name, {"software": "test"}))
        for index in (0, 1, 2):
            _response(writer, url(index), html(index))
        _response(writer, "https://bad.example.org/binary", PNG)
        _response(writer, "https://bad.example.org/gone", b"<html>gone</html>", status="404 Not Found")
        _response(writer, "https://bad.example.org/logo.png", PNG, ctype="image/png")
        _response(writer, "https://bad.example.org/huge", b"<html><p>" + HUGE.encode() + b"</p></html>")
        _response(writer, "https://bad.example.org/nav", NO_MAIN_TEXT)
    buffer = io.BytesIO()
    writer = WARCWriter(buffer, gzip=True)
    _response(writer, url(3), html(3))
    _response(writer, url(4), html(4))
    cut = folder / "CC-MAIN-test-00001.warc.gz"
    cut.write_bytes(buffer.getvalue()[:-200])  # inside the last (metadata) record's gzip member
    return {
        "documents": {url(i) for i in (0, 1, 2, 3, 4)},
        "records": 8 + 2 + 1,  # responses and the cut record; requests, metadata and warcinfo are skipped
        "excluded": {
            "binary_content",
            "http_status",
            "unsupported_content_type",
            "too_large",
            "no_main_text",
            "truncated_gzip",
        },
    }


def write_wet(folder: Path) -> dict:
    """CC-style WET: 3 article texts; invalid UTF-8, an oversized and an empty conversion record."""
    path = folder / "CC-MAIN-test-00000.warc.wet.gz"
    with open(path, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        writer.write_record(writer.create_warcinfo_record(path.name, {"software": "test"}))
        bodies = [(url(i), text(i).encode("utf-8")) for i in (5, 6, 7)]
        bodies += [
            ("https://bad.example.org/latin1", "Caf\xe9 cr\xe8me, d\xe9j\xe0 vu.".encode("latin-1")),
            ("https://bad.example.org/huge-text", HUGE.encode()),
            ("https://bad.example.org/empty", b"   \n"),
        ]
        for target, body in bodies:
            record = writer.create_warc_record(
                target,
                "conversion",
                payload=io.BytesIO(body),
                warc_content_type="text/plain",
                warc_headers_dict={"WARC-Date": "2026-11-20T10:00:00Z"},
            )
            writer.write_record(record)
    return {
        "documents": {url(i) for i in (5, 6, 7)},
        "records": 6,
        "excluded": {"invalid_utf8", "too_large", "empty_text"},
    }


def write_jsonl(folder: Path) -> dict:
    """One file with an id column, one gzipped without ids or URLs and cut short; hostile lines."""
    lines = [
        json.dumps({"doc_id": "jsonl-8", "text": text(8), "url": url(8), "lang_hint": "en"}).encode(),
        b"{not json",
        '{"doc_id": "x", "text": "caf\xe9"}'.encode("latin-1"),
        json.dumps({"doc_id": "no-text", "body": "where the text should be"}).encode(),
        json.dumps({"doc_id": "number", "text": 42}).encode(),
        json.dumps({"doc_id": "huge", "text": HUGE}).encode(),
        b'["an", "array"]',
        b'{"doc_id": "surrogate", "text": "lone \\ud800 surrogate"}',
        b"",
    ]
    (folder / "with_ids.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    records = [{"text": text(i), "lang_hint": "en"} for i in (9, 10)]
    records.append({"text": "filler " * 20_000})
    payload = gzip.compress(b"".join(json.dumps(record).encode() + b"\n" for record in records))
    (folder / "no_ids.jsonl.gz").write_bytes(payload[: len(payload) - 20])
    return {
        "documents": {"jsonl-8", "text:9", "text:10"},
        "excluded": {
            "invalid_json",
            "invalid_utf8",
            "missing_text_column",
            "text_not_a_string",
            "too_large",
            "not_an_object",
            "truncated_gzip",
        },
    }


def write_parquet(folder: Path) -> dict:
    """With ids (and null, invalid UTF-8 and oversized texts), without ids, without the text column, corrupt."""
    rows = [
        {"doc_id": "parquet-11", "text": text(11), "url": url(11), "lang_hint": "en"},
        {"doc_id": "null-text", "text": None, "url": None, "lang_hint": None},
        {"doc_id": "huge", "text": HUGE, "url": None, "lang_hint": None},
        {"doc_id": "broken", "text": "placeholder", "url": None, "lang_hint": None},
    ]
    table = pa.Table.from_pylist(rows)
    texts = table.column("text").to_pylist()
    texts[3] = b"stray \xff byte"
    table = table.set_column(table.schema.get_field_index("text"), "text", _strings(texts))
    pq.write_table(table, folder / "with_ids.parquet", row_group_size=2)  # two row groups: two tasks
    pq.write_table(pa.table({"text": [text(12)], "lang_hint": ["en"]}), folder / "no_ids.parquet")
    pq.write_table(pa.table({"body": ["a", "b"]}), folder / "no_text_column.parquet")
    good = io.BytesIO()
    pq.write_table(pa.table({"text": ["x" * 1000]}), good)
    (folder / "corrupt.parquet").write_bytes(good.getvalue()[:-50])
    return {
        "documents": {"parquet-11", "text:12"},
        "records": 4 + 1 + 2 + 1,
        "excluded": {"missing_text_column", "too_large", "invalid_utf8", "unreadable_file"},
    }


def mixed(first: int, second: int) -> str:
    """The first half of one article's paragraphs and the second half of another's: prose the other
    formats do not hold, so dedup keeps it."""
    head, tail = text(first).split("\n"), text(second).split("\n")
    return "\n".join(head[: len(head) // 2] + tail[len(tail) // 2 :])


def _strings(values: list[str | bytes | None]) -> pa.Array:
    """A string array holding exactly these bytes, invalid UTF-8 included (no validation)."""
    binary = pa.array([v.encode() if isinstance(v, str) else v for v in values], pa.binary())
    return pa.Array.from_buffers(pa.string(), len(values), binary.buffers())


def _hf_split(folder: Path, shards: list[pa.Table], split: str, rows_per_batch: int = 2) -> list[Path]:
    """One split as ``datasets.Dataset.save_to_disk`` lays it out: data-0000i-of-0000n.arrow shards (Arrow
    IPC streams, the features in the schema's "huggingface" metadata), dataset_info.json and state.json."""
    folder.mkdir(parents=True)
    paths = []
    for index, shard in enumerate(shards):
        features = {name: {"dtype": "string", "_type": "Value"} for name in shard.schema.names}
        schema = shard.schema.with_metadata({"huggingface": json.dumps({"info": {"features": features}})})
        path = folder / f"data-{index:05d}-of-{len(shards):05d}.arrow"
        with pa.ipc.new_stream(path, schema) as writer:
            writer.write_table(shard.replace_schema_metadata(schema.metadata), max_chunksize=rows_per_batch)
        paths.append(path)
    info = {"citation": "", "description": "", "features": features}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    state = {
        "_data_files": [{"filename": path.name} for path in paths],
        "_fingerprint": f"test-{split}",
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": split,
    }
    (folder / "state.json").write_text(json.dumps(state, indent=2))
    return paths


def write_hf_dataset(folder: Path) -> dict:
    """A DatasetDict saved to disk (train: two shards with hostile rows; test: a shard cut inside its second
    record batch; validation: no text column), and a standalone Arrow file in the random-access format."""
    root = folder / "hf_dataset"
    train = pa.table(
        {
            "doc_id": ["hf-1", None, "null-text", "huge", "broken"],
            "text": _strings([mixed(0, 1), mixed(2, 3), None, HUGE, b"stray \xff byte"]),
            "url": [None, "https://hf.example.org/mixed-2-3", None, None, None],
            "lang_hint": ["en", "en", None, None, None],
        }
    )
    second = pa.table({"doc_id": ["hf-4"], "text": [mixed(4, 5)], "url": [None], "lang_hint": ["en"]})
    _hf_split(root / "train", [train, second], "train")
    test = pa.table({"doc_id": ["hf-6", "hf-8"], "text": [mixed(6, 7), mixed(8, 9)]})
    (cut,) = _hf_split(root / "test", [test], "test", rows_per_batch=1)
    cut.write_bytes(cut.read_bytes()[:-300])  # inside the second batch: the first stands
    _hf_split(root / "validation", [pa.table({"body": ["a", "b"]})], "validation")
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test", "validation"]}))
    standalone = pa.table({"doc_id": ["hf-10"], "text": [mixed(10, 11)]})
    with pa.ipc.new_file(folder / "table.arrow", standalone.schema) as writer:
        writer.write_table(standalone)
    return {
        "documents": {"hf-1", "https://hf.example.org/mixed-2-3", "hf-4", "hf-6", "hf-10"},
        "records": 5 + 1 + 2 + 2 + 1,  # the cut shard: its first record and the cut
        "excluded": {"missing_text_column", "too_large", "invalid_utf8", "unreadable_file"},
    }


def write_all(folder: Path) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "warc": write_warc(folder),
        "wet": write_wet(folder),
        "jsonl": write_jsonl(folder),
        "parquet": write_parquet(folder),
        "arrow": write_hf_dataset(folder),
    }


FETCHED = datetime(2026, 11, 20, 10, tzinfo=UTC)
