"""`pretrain ship-logs`: send the ECS JSON log lines under ``<data_root>/_runs/*/logs/`` to Elasticsearch.

The shipper tails every ``*.ecs.json`` file from a persisted byte offset, so a restart never re-reads
what was handled. Each complete line becomes a document whose id hashes (file, byte offset, line), and
is bulk-created in a data stream. Lines that Elasticsearch does not confirm (unreachable, 429, 5xx, a
server that is not Elasticsearch) are spooled to disk and replayed, oldest first, before any newer line
is sent; a replayed line that had in fact arrived answers 409 and counts as delivered. So no line is
lost and none is indexed twice. A line Elasticsearch refuses for good (a mapping error) goes to
``rejected.ndjson`` with the reason, and the command exits non-zero.

State lives in ``<data_root>/_ship/<data stream>/``: ``offsets.json``, ``spool/``, ``rejected.ndjson``
and a lock, so one-shot runs, ``--follow`` and in-process shippers can share it.

Exit status: 0 when every line read so far is in Elasticsearch; 1 when lines are waiting in the spool
or were rejected; 2 on a usage or config error.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig, load_config
from pipeline.core.arguments import ArgumentParser
from pipeline.core.config import ConfigError, redact_url
from pipeline.core.jsonsafe import MAX_JSON_DEPTH, loads_bounded
from pipeline.core.logs import quiet_libraries
from pipeline.core.storage import local_path

log = logging.getLogger(__name__)
# The Elasticsearch client logs every request at INFO; in-process those lines would be shipped in turn.
logging.getLogger("elastic_transport").setLevel(logging.WARNING)
STATE_FOLDER = "_ship"
LOG_GLOB = "_runs/*/logs/*.ecs.json"


def document_id(relpath: str, offset: int, line: bytes) -> str:
    """Stable per line: the same line at the same place always gets the same id, a rewritten one does not."""
    digest = hashlib.sha1(f"{relpath}\0{offset}\0".encode())
    digest.update(line)
    return digest.hexdigest()


MAX_LINE_BYTES = 1 << 20  # a longer line is shipped cut to this, tagged, never held whole
SHOWN_ERROR_CHARS = 500


def _without_lone_surrogates(value: Any) -> tuple[Any, bool]:
    """``value`` with every lone surrogate (valid JSON escapes such as "\\ud800", but not encodable as UTF-8)
    replaced by U+FFFD; and whether there was one. ``value``'s nesting is bounded (MAX_JSON_DEPTH)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value, False
        except UnicodeEncodeError:
            return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), True
    if isinstance(value, dict):
        pairs = [(_without_lone_surrogates(k), _without_lone_surrogates(v)) for k, v in value.items()]
        return {k: v for (k, _), (v, _) in pairs}, any(kc or vc for (_, kc), (_, vc) in pairs)
    if isinstance(value, list):
        items = [_without_lone_surrogates(item) for item in value]
        return [item for item, _ in items], any(changed for _, changed in items)
    return value, False


def _tag(doc: dict[str, Any], tag: str, error_type: str, message: str) -> None:
    tags = doc.get("tags")
    tags = tags if isinstance(tags, list) else [] if tags is None else [tags]
    doc["tags"] = [*tags, tag]
    if error_type:
        doc["error"] = {"type": error_type, "message": message[:SHOWN_ERROR_CHARS]}


def encode_json(value: Any) -> bytes:
    """The one encoding of a document or action, for the spool and (the same rules) Elasticsearch's bulk
    body: UTF-8 JSON without NaN or Infinity. ValueError when ``value`` cannot be written so."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _unparsed(text: str, error_type: str, message: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"message": text}
    _tag(doc, "pretrain_unparsed", error_type, message)
    return doc


def to_document(line: bytes, relpath: str, offset: int, cut_from: int | None = None) -> dict[str, Any]:
    """The ECS line as a document, plus where it came from. Whatever the line holds, the document can be
    encoded (``encode_json``) and so spooled and sent: a line that is not JSON, or nested deeper than
    MAX_JSON_DEPTH, is kept as text; invalid UTF-8 and lone surrogate escapes are replaced by U+FFFD, and
    NaN or Infinity leave the line as text; each repair is tagged. ``cut_from``: the line was that many
    bytes, cut to ``line``."""
    try:
        text = line.decode("utf-8")
        invalid_utf8 = None
    except UnicodeDecodeError as exc:
        text = line.decode("utf-8", "replace")
        invalid_utf8 = f"invalid UTF-8 at byte {exc.start} replaced by U+FFFD"
    try:
        doc = loads_bounded(text, MAX_JSON_DEPTH, parse_constant=_refuse_constant)
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    except ValueError as exc:
        doc = _unparsed(text, "unparsed_line", str(exc))
    doc, repaired = _without_lone_surrogates(doc)
    if repaired:  # otherwise the spool cannot be written and shipping stalls on this line for ever
        _tag(doc, "pretrain_invalid_unicode", "invalid_unicode", "lone surrogate escapes replaced by U+FFFD")
    if invalid_utf8:
        _tag(doc, "pretrain_invalid_unicode", "invalid_unicode", invalid_utf8)
    if cut_from is not None:
        _tag(doc, "pretrain_truncated", "truncated_line", f"a line of {cut_from} bytes, cut to {len(line)}")
    if "@timestamp" not in doc:  # data streams require it
        doc["@timestamp"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        _tag(doc, "pretrain_ingest_timestamp", "", "")
    if not isinstance(doc.get("log", {}), dict):
        doc["log_value"] = doc.pop("log")
    source = doc.setdefault("log", {})
    if not isinstance(source.get("file", {}), dict):
        source["file_value"] = source.pop("file")
    source["file"] = {**source.get("file", {}), "path": relpath}
    source["offset"] = offset
    try:
        encode_json(doc)
    except ValueError as exc:  # anything left that JSON cannot carry: ship the line as text
        return to_document(
            json.dumps(_unparsed(text, "unencodable_line", str(exc))).encode(), relpath, offset, cut_from
        )
    return doc


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (Elasticsearch refuses the whole bulk request that holds it)")


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class Spool:
    """Undelivered actions on disk, in order: numbered segment files of JSON lines, oldest first."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)

    def segments(self) -> list[Path]:
        return sorted(self.folder.glob("segment-*.ndjson"))

    def append(self, actions: list[dict[str, Any]]) -> None:
        segments = self.segments()
        number = int(segments[-1].stem.split("-")[1]) + 1 if segments else 1
        self._write(self.folder / f"segment-{number:012d}.ndjson", actions)

    def read(self, segment: Path) -> tuple[list[dict[str, Any]], list[tuple[bytes, str]]]:
        """(actions, unreadable lines with the reason): a damaged segment costs its damaged lines only."""
        actions, unreadable = [], []
        # Split on "\n" only: str.splitlines() also breaks at U+0085 and U+2028, which JSON leaves unescaped.
        for line in segment.read_bytes().split(b"\n"):
            if not line:
                continue
            try:
                action = loads_bounded(line, MAX_JSON_DEPTH + 8)
                if not isinstance(action, dict) or "_id" not in action or "_source" not in action:
                    raise ValueError("not a spooled action")
                actions.append(action)
            except ValueError as exc:
                unreadable.append((line, f"unreadable spool line: {exc}"[:SHOWN_ERROR_CHARS]))
        return actions, unreadable

    def replace(self, segment: Path, remaining: list[dict[str, Any]]) -> None:
        if remaining:
            self._write(segment, remaining)
        else:
            segment.unlink()

    def _write(self, path: Path, actions: list[dict[str, Any]]) -> None:
        _write_atomically(path, b"".join(encode_json(action) + b"\n" for action in actions))

    def size_bytes(self) -> int:
        return sum(segment.stat().st_size for segment in self.segments())

    def count(self) -> int:
        return sum(segment.read_bytes().count(b"\n") for segment in self.segments())


@dataclass
class ShipStats:
    read: int = 0
    """Lines read from the log files in this run."""
    delivered: int = 0
    """Lines confirmed in Elasticsearch in this run (new or replayed), including already_present."""
    already_present: int = 0
    """Of those, lines Elasticsearch already held (409 on create): re-sends after an uncertain outcome."""
    replayed: int = 0
    """Of those, lines that came out of the spool."""
    spooled: int = 0
    """Lines put into the spool in this run."""
    rejected: int = 0
    """Lines Elasticsearch refused for good (see rejected.ndjson)."""
    pending: int = 0
    """Lines waiting in the spool after this run."""
    skipped: bool = False
    """Another shipper held the lock; nothing was done."""
    errors: list[str] = field(default_factory=list)

    def add_error(self, message: str | None) -> None:
        if message and message not in self.errors:
            self.errors.append(message)

    def summary(self, target: str) -> str:
        text = (
            f"{target}: read {self.read} line(s), delivered {self.delivered} "
            f"({self.replayed} from the spool, {self.already_present} already present), "
            f"spooled {self.spooled}, rejected {self.rejected}, pending {self.pending}"
        )
        return text + "".join(f"\n  error: {error}" for error in self.errors)


class LogShipper:
    """Tails the ECS files of a data root into a sink (``ElasticsearchSink``), spooling what fails."""

    def __init__(
        self,
        data_root: Path,
        sink,
        state_dir: Path | None = None,
        *,
        batch_bytes: int = 4 * 1024 * 1024,
        spool_max_bytes: int = 1 << 30,
    ) -> None:
        self.data_root = Path(data_root)
        self.sink = sink
        self.state_dir = state_dir or self.data_root / STATE_FOLDER / sink.data_stream
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.spool = Spool(self.state_dir / "spool")
        self.offsets_path = self.state_dir / "offsets.json"
        self.rejected_path = self.state_dir / "rejected.ndjson"
        self.batch_bytes = batch_bytes
        self.spool_max_bytes = spool_max_bytes

    @classmethod
    def from_config(
        cls,
        config: PipelineConfig,
        url: str | None = None,
        data_stream: str | None = None,
        **sink_options: Any,
    ) -> LogShipper:
        from pipeline.logshipping.es_index import ElasticsearchSink

        url = url or elasticsearch_url(config)
        if not url:
            raise ConfigError(
                "no Elasticsearch URL: set logging.elasticsearch_url, $ELASTICSEARCH_URL or pass --url"
            )
        sink = ElasticsearchSink.from_env(
            url,
            data_stream or config.logging.data_stream,
            retention=config.logging.retention,
            **{"setup": config.logging.elasticsearch_setup, **sink_options},
        )
        return cls(local_path(config.project.data_root), sink, spool_max_bytes=config.logging.spool_max_bytes)

    # state

    def load_offsets(self) -> dict[str, dict[str, int]]:
        if not self.offsets_path.is_file():
            return {}
        try:
            offsets = json.loads(self.offsets_path.read_bytes())
            if not isinstance(offsets, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("offset"), int) and isinstance(e.get("inode"), int)
                for e in offsets.values()
            ):
                raise ValueError("not a map of file -> offset and inode")
            return offsets
        except ValueError as exc:
            # Shipping again from the start sends no line twice: ids are stable, a re-send answers 409.
            aside = self.offsets_path.with_name(f"{self.offsets_path.name}.unreadable")
            os.replace(self.offsets_path, aside)
            log.warning(
                "%s is unreadable (%s), kept as %s; reading the logs from the start",
                self.offsets_path,
                exc,
                aside,
            )
            return {}

    def _save_offsets(self, offsets: dict[str, dict[str, int]]) -> None:
        _write_atomically(self.offsets_path, json.dumps(offsets, indent=1, sort_keys=True).encode())

    @contextlib.contextmanager
    def _lock(self, blocking: bool) -> Iterator[bool]:
        with open(self.state_dir / "lock", "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # reading

    def log_files(self) -> list[Path]:
        return sorted(self.data_root.glob(LOG_GLOB))

    def read_new_lines(
        self, offsets: dict[str, dict[str, int]]
    ) -> tuple[list[dict[str, Any]], dict[str, dict[str, int]]]:
        """Complete lines past each file's offset, up to batch_bytes; returns (actions, new offsets)."""
        offsets = {path: dict(entry) for path, entry in offsets.items()}
        actions: list[dict[str, Any]] = []
        budget = self.batch_bytes
        for path in self.log_files():
            if budget <= 0:
                break
            relpath = path.relative_to(self.data_root).as_posix()
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            entry = offsets.setdefault(relpath, {"offset": 0, "inode": stat.st_ino})
            if entry["inode"] != stat.st_ino or stat.st_size < entry["offset"]:
                log.warning("%s was replaced or truncated; shipping it again from the start", relpath)
                entry.update(offset=0, inode=stat.st_ino)
            if stat.st_size == entry["offset"]:
                continue
            with open(path, "rb") as handle:
                handle.seek(entry["offset"])
                while budget > 0:
                    start = handle.tell()
                    line = handle.readline(MAX_LINE_BYTES + 1)
                    size, cut_from = len(line), None
                    if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                        # Over-long: read on to its newline in pieces, keeping the first MAX_LINE_BYTES.
                        while (piece := handle.readline(MAX_LINE_BYTES)) and not piece.endswith(b"\n"):
                            size += len(piece)
                        size += len(piece)
                        line, cut_from = line[:MAX_LINE_BYTES] + piece[-1:], size
                    if not line.endswith(b"\n"):
                        break  # a line still being written: wait for its newline
                    entry["offset"] = start + size
                    budget -= size
                    body = line.rstrip(b"\r\n")
                    if body.strip():
                        actions.append(
                            {
                                "_id": document_id(relpath, start, body),
                                "_source": to_document(body, relpath, start, cut_from),
                            }
                        )
        return actions, offsets

    # sending

    def _record(self, result, stats: ShipStats, replay: bool) -> None:
        stats.delivered += len(result.delivered)
        stats.already_present += result.already_present
        if replay:
            stats.replayed += len(result.delivered)
        stats.add_error(result.error)
        if result.rejected:
            self._reject(
                [{**action, "status": status, "error": error} for action, status, error in result.rejected],
                stats,
            )
            log.warning(
                "Elasticsearch rejected %d log line(s) for good; kept in %s",
                len(result.rejected),
                self.rejected_path,
            )

    def _reject(self, entries: list[dict[str, Any]], stats: ShipStats) -> None:
        """Append to rejected.ndjson, each entry with its reason; counted as rejected."""
        stats.rejected += len(entries)
        with open(self.rejected_path, "a", encoding="utf-8") as handle:
            for entry in entries:
                # ASCII escapes and repr() for the rest: whatever the entry holds, the file can hold it
                handle.write(json.dumps(entry, default=repr) + "\n")

    def drain_spool(self, stats: ShipStats) -> bool:
        """Replay the spool oldest first; True when it is empty afterwards."""
        for segment in self.spool.segments():
            actions, unreadable = self.spool.read(segment)
            if unreadable:
                lines = [
                    {"spool_line": line.decode("utf-8", "replace"), "status": None, "error": reason}
                    for line, reason in unreadable
                ]
                self._reject(lines, stats)
                log.warning(
                    "%d unreadable line(s) in %s moved to %s", len(unreadable), segment, self.rejected_path
                )
            result = self.sink.send(actions)
            self._record(result, stats, replay=True)
            self.spool.replace(segment, result.retry)
            if result.retry:
                return False
        return True

    def ship_once(self, blocking: bool = True) -> ShipStats:
        """One pass: replay the spool, then send every new complete line (spooling what fails)."""
        stats = ShipStats()
        with self._lock(blocking) as acquired:
            if not acquired:
                stats.skipped = True
                return stats
            offsets = self.load_offsets()
            healthy = self.drain_spool(stats)
            while True:
                if self.spool.size_bytes() >= self.spool_max_bytes:
                    stats.add_error(
                        f"spool is full ({self.spool_max_bytes} bytes): new lines stay in the log files for now"
                    )
                    break
                actions, new_offsets = self.read_new_lines(offsets)
                if new_offsets == offsets:
                    break
                stats.read += len(actions)
                retry = actions
                if healthy and actions:
                    result = self.sink.send(actions)
                    self._record(result, stats, replay=False)
                    retry = result.retry
                    healthy = not retry
                if retry:
                    self.spool.append(retry)  # durable before the offsets move past these lines
                    stats.spooled += len(retry)
                self._save_offsets(new_offsets)
                offsets = new_offsets
            stats.pending = self.spool.count()
        return stats

    def follow(
        self, interval_s: float, stop: threading.Event, blocking: bool = True, report=None
    ) -> ShipStats:
        """Ship every interval until ``stop`` is set, then a last pass; returns that last pass's stats."""
        failing = False
        while not stop.is_set():
            stats = self._guarded_pass(blocking)
            if not stats.skipped:
                target = self.sink.data_stream
                if stats.errors and not failing:
                    log.warning(
                        "log shipping to %s is failing, lines are spooled: %s", target, stats.errors[0]
                    )
                elif failing and not stats.errors:
                    log.warning("log shipping to %s recovered; %d line(s) pending", target, stats.pending)
                failing = bool(stats.errors)
            if report and (stats.read or stats.delivered or stats.rejected):
                report(stats)
            stop.wait(interval_s)
        return self._guarded_pass(blocking)

    def _guarded_pass(self, blocking: bool) -> ShipStats:
        try:
            return self.ship_once(blocking)
        except Exception as exc:  # a disk or bug error must not kill a follower; nothing moved past the spool
            stats = ShipStats()
            stats.add_error(f"{type(exc).__name__}: {exc}")
            return stats


def elasticsearch_url(config: PipelineConfig) -> str | None:
    return config.logging.elasticsearch_url or os.environ.get("ELASTICSEARCH_URL") or None


class BackgroundShipper(threading.Thread):
    """Ships in a daemon thread of this process; a last pass runs at exit (or ``stop()``)."""

    def __init__(self, shipper: LogShipper, interval_s: float) -> None:
        super().__init__(name="pretrain-log-shipper", daemon=True)
        self.shipper = shipper
        self.interval_s = interval_s
        self.stop_event = threading.Event()
        self.last: ShipStats | None = None

    def run(self) -> None:
        # Non-blocking: when another process holds the lock it is shipping these same files.
        self.last = self.shipper.follow(self.interval_s, self.stop_event, blocking=False)

    def stop(self, timeout: float = 30.0) -> ShipStats | None:
        self.stop_event.set()
        if self.is_alive():
            self.join(timeout)
        return self.last


_background: BackgroundShipper | None = None


def start_background_shipper(config: PipelineConfig) -> BackgroundShipper | None:
    """Start this process's in-process shipper (once) when logging.ship_in_process and a URL are set."""
    global _background
    if not (config.logging.ship_in_process and elasticsearch_url(config)):
        return None
    if _background is not None and _background.is_alive():
        return _background
    _background = BackgroundShipper(LogShipper.from_config(config), config.logging.ship_interval_s)
    _background.start()
    atexit.register(_background.stop)
    return _background


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="pretrain ship-logs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="credentials: ELASTICSEARCH_API_KEY, or ELASTICSEARCH_USERNAME and ELASTICSEARCH_PASSWORD; "
        "TLS: ELASTICSEARCH_CA_CERTS, ELASTICSEARCH_VERIFY_CERTS=false\n"
        "example: pretrain ship-logs --url http://localhost:9200 --follow",
    )
    parser.add_argument("--config", "-c", metavar="YAML", help="config file (default: built-in defaults)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--url", help="Elasticsearch URL (default: logging.elasticsearch_url, $ELASTICSEARCH_URL)"
    )
    parser.add_argument("--data-stream", help="target data stream (default: logging.data_stream)")
    parser.add_argument("--follow", "-f", action="store_true", help="keep shipping until interrupted")
    parser.add_argument("--interval", type=float, help="seconds between passes with --follow")
    parser.add_argument("--json", action="store_true", help="print the final stats as one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = load_config(args.config, args.overrides)
    logging.basicConfig(
        level=config.logging.level, format="%(asctime)s %(levelname)-7s %(message)s", datefmt="%H:%M:%S"
    )
    quiet_libraries(config.logging.level)
    shipper = LogShipper.from_config(config, args.url, args.data_stream)
    target = f"{redact_url(shipper.sink.url)} {shipper.sink.data_stream}"
    if args.follow:
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        print(f"shipping {shipper.data_root / LOG_GLOB} to {target} until interrupted", file=sys.stderr)
        stats = shipper.follow(
            args.interval or config.logging.ship_interval_s,
            stop,
            report=lambda s: print(s.summary(target), file=sys.stderr, flush=True),
        )
    else:
        stats = shipper.ship_once()
    shipper.sink.close()
    print(json.dumps(asdict(stats)) if args.json else stats.summary(target))
    if stats.pending:
        print(f"{stats.pending} line(s) wait in {shipper.spool.folder}; run ship-logs again", file=sys.stderr)
    if stats.rejected:
        print(f"{stats.rejected} line(s) rejected for good: see {shipper.rejected_path}", file=sys.stderr)
    return 1 if stats.pending or stats.rejected else 0


if __name__ == "__main__":
    from pipeline.core.cli import run_cli

    raise SystemExit(run_cli(main))
