"""Decoded bytes are capped while decoding: a compression bomb in a source file is quarantined as
``too_large`` and a reader's memory stays bounded by ``ingest.max_record_bytes``, not by what the input
decodes to. Peak memory is measured in a fresh Python process per file (``ru_maxrss``)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

MiB = 1 << 20
LIMIT = 1 * MiB  # ingest.max_record_bytes in these tests
# What reading may add to a worker's peak RSS above reading a small file: a few times the limit
# (the record, its decoded text), never the decoded size of the bomb.
ALLOWED_GROWTH = 48 * MiB


def compressed_zeros(decoded_bytes: int, encoding: str) -> bytes:
    """``decoded_bytes`` zero bytes, compressed piece by piece (never held decoded)."""
    if encoding == "br":
        import brotli

        compressor = brotli.Compressor(quality=5)
        out = [compressor.process(bytes(MiB)) for _ in range(decoded_bytes // MiB)]
        return b"".join(out) + compressor.finish()
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}[encoding]
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    out = [compressor.compress(bytes(MiB)) for _ in range(decoded_bytes // MiB)]
    return b"".join(out) + compressor.flush()


def write_bomb_warc(path: Path, decoded_bytes: int, encoding: str) -> int:
    """A gzipped WARC: a small page, then a response whose body is a Content-Encoding bomb, then a page."""
    body = compressed_zeros(decoded_bytes, encoding)
    with open(path, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        for name, payload, extra in (
            ("before", b"<html><body><p>A page before the bomb, with some text.</p></body></html>", []),
            ("bomb", body, [("Content-Encoding", encoding)]),
            ("after", b"<html><body><p>A page after the bomb, with some text.</p></body></html>", []),
        ):
            headers = StatusAndHeaders(
                "200 OK",
                [("Content-Type", "text/html"), ("Content-Length", str(len(payload))), *extra],
                "HTTP/1.1",
            )
            record = writer.create_warc_record(
                f"https://bomb.example/{name}", "response", payload=io.BytesIO(payload), http_headers=headers
            )
            writer.write_record(record)
    return path.stat().st_size


READ_AND_MEASURE = """
import json, resource, sys
from pipeline.ingest.config import IngestConfig
from pipeline.ingest.readers import READERS
path, fmt, small = sys.argv[1], sys.argv[2], sys.argv[3]
config = IngestConfig(sources=[path], max_record_bytes=int(sys.argv[4]))
list(READERS[fmt](small, fmt, 0, config, None))  # everything imported and warmed up: the baseline
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
import os
rows = list(READERS[fmt](path, fmt, os.path.getsize(path), config, None))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"baseline_kb": baseline, "peak_kb": peak, "reasons": [r["drop_reason"] for r in rows]}))
"""


def read_in_fresh_process(path: Path, fmt: str, small: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", READ_AND_MEASURE, str(path), fmt, str(small), str(LIMIT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("encoding", "decoded"), [("gzip", 512 * MiB), ("deflate", 256 * MiB), ("br", 512 * MiB)]
)
def test_a_content_encoding_bomb_in_a_warc_record_is_too_large_and_memory_stays_bounded(
    tmp_path, encoding, decoded
):
    """1.8 kB on disk, 512 MB decoded: a worker reached 1,005 MB RSS (baseline 266 MB) and the record was
    quarantined as binary_content."""
    small = tmp_path / "small.warc.gz"
    write_bomb_warc(small, MiB // 2, "gzip")  # the same shape, decoding to half the limit
    bomb = tmp_path / f"bomb-{encoding}.warc.gz"
    on_disk = write_bomb_warc(bomb, decoded, encoding)
    measured = read_in_fresh_process(bomb, "warc", small)
    growth = (measured["peak_kb"] - measured["baseline_kb"]) * 1024
    print(
        f"\n{encoding}: {on_disk} bytes on disk, {decoded >> 20} MiB decoded; peak RSS {measured['peak_kb'] >> 10} MiB, "
        f"{growth / MiB:.1f} MiB above the baseline {measured['baseline_kb'] >> 10} MiB"
    )
    assert measured["reasons"][0] is None and measured["reasons"][2] is None  # the pages around it
    assert measured["reasons"][1] == f"too_large: decodes to more than {LIMIT} bytes"
    assert growth < ALLOWED_GROWTH, measured


def test_a_gzipped_jsonl_line_that_decodes_to_half_a_gigabyte_is_too_large(tmp_path):
    small = tmp_path / "small.jsonl.gz"
    small.write_bytes(zlib.compress(b'{"text": "small"}\n', wbits=16 + zlib.MAX_WBITS))
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    parts = [compressor.compress(b'{"text": "before"}\n{"text": "')]
    parts += [compressor.compress(b"a" * MiB) for _ in range(512)]
    parts += [compressor.compress(b'"}\n{"text": "after"}\n'), compressor.flush()]
    bomb = tmp_path / "bomb.jsonl.gz"
    bomb.write_bytes(b"".join(parts))
    measured = read_in_fresh_process(bomb, "jsonl", small)
    growth = (measured["peak_kb"] - measured["baseline_kb"]) * 1024
    print(f"\njsonl.gz: {bomb.stat().st_size} bytes, 512 MiB line; {growth / MiB:.1f} MiB above the baseline")
    assert [reason and reason.split(":")[0] for reason in measured["reasons"]] == [None, "too_large", None]
    assert growth < ALLOWED_GROWTH, measured
