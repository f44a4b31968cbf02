"""A local stand-in for Elasticsearch at the HTTP boundary, and a fault-injecting proxy.

No Elasticsearch server can run on our machines, so ``FakeElasticsearch`` answers the REST APIs the
shipper uses as Elasticsearch documents them: ``_bulk`` (NDJSON; per-item results; 409
``version_conflict_engine_exception`` on a create of an existing id; ``op_type: create`` required for
data streams; ``@timestamp`` required; mapping type errors as 400 ``document_parsing_exception``),
``_ilm/policy``, ``_index_template``, ``_data_stream`` (auto-created from a matching template), plus
``_refresh``, ``_count`` and ``_search`` for the tests to read back. Every response carries
``X-Elastic-Product: Elasticsearch``, which the Python client insists on.

``FaultProxy`` sits between the shipper and either that fake or a real cluster (``make es-test``), and
injects outages (connections closed without a reply), whole-request 429/502/503 answers, partial bulk
failures (some items answered 429 and not forwarded) and responses without the product header.
"""

from __future__ import annotations

import fnmatch
import json
import random
import threading
from collections import deque
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import urllib3

PRODUCT_HEADERS = {"X-Elastic-Product": "Elasticsearch"}
CONTENT_TYPE = "application/vnd.elasticsearch+json;compatible-with=9"
NUMERIC_TYPES = {"long", "integer", "short", "byte", "float", "double", "half_float", "scaled_float"}


def es_error(status: int, error_type: str, reason: str) -> dict[str, Any]:
    cause = {"type": error_type, "reason": reason}
    return {"error": {"root_cause": [cause], **cause}, "status": status}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # keep test output clean
        pass

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        for key, value in {**PRODUCT_HEADERS, **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_GET(self) -> None:
        self.server.app.handle(self)

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET


class _LocalServer:
    """An HTTP server on a free 127.0.0.1 port, serving in a thread while used as a context manager."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.app = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()


class FakeElasticsearch(_LocalServer):
    """In-memory Elasticsearch 9 subset. ``url`` once started; use as a context manager."""

    def __init__(self) -> None:
        self.policies: dict[str, dict] = {}
        self.templates: dict[str, dict] = {}
        self.data_streams: dict[str, dict] = {}
        self.indices: dict[str, dict[str, dict]] = {}  # target name -> id -> source
        self.bulk_requests = 0
        self.lock = threading.Lock()
        super().__init__(_Handler)

    # routing

    def handle(self, request: _Handler) -> None:
        path = urlsplit(request.path).path.strip("/")
        parts = path.split("/") if path else []
        body = request._body()
        method = request.command
        with self.lock:
            status, payload = self.route(method, parts, body)
        request._reply(status, payload)

    def route(self, method: str, parts: list[str], body: bytes) -> tuple[int, Any]:
        if not parts:
            return 200, {"name": "fake", "version": {"number": "9.1.0"}, "tagline": "You Know, for Search"}
        if parts[:2] == ["_ilm", "policy"] and len(parts) == 3:
            return self.named(self.policies, parts[2], method, body, "policy", self.policy_view)
        if parts[0] == "_index_template" and len(parts) == 2:
            return self.named(self.templates, parts[1], method, body, "index template", self.template_view)
        if parts[0] == "_data_stream" and len(parts) == 2:
            return self.data_stream(method, parts[1])
        if parts[-1] == "_bulk" and method in ("POST", "PUT"):
            return 200, self.bulk(body, parts[0] if len(parts) == 2 else None)
        if len(parts) == 2 and parts[1] in ("_refresh", "_count", "_search"):
            return self.read(parts[0], parts[1], body)
        return 400, es_error(400, "illegal_argument_exception", f"no handler for {method} /{'/'.join(parts)}")

    def named(self, store, name, method, body, what, view) -> tuple[int, Any]:
        if method == "PUT":
            store[name] = json.loads(body)
            return 200, {"acknowledged": True}
        if name not in store:
            return 404, es_error(404, "resource_not_found_exception", f"{what} matching [{name}] not found")
        if method == "DELETE":
            del store[name]
            return 200, {"acknowledged": True}
        return 200, view(name)

    def policy_view(self, name: str) -> dict:
        return {name: {"version": 1, "modified_date": "2026-11-29T00:00:00.000Z", **self.policies[name]}}

    def template_view(self, name: str) -> dict:
        return {"index_templates": [{"name": name, "index_template": self.templates[name]}]}

    def matching_template(self, name: str) -> dict | None:
        candidates = [
            t for t in self.templates.values() if any(fnmatch.fnmatch(name, p) for p in t["index_patterns"])
        ]
        return max(candidates, key=lambda t: t.get("priority", 0)) if candidates else None

    def data_stream(self, method: str, name: str) -> tuple[int, Any]:
        if method == "PUT":
            if name in self.data_streams:
                return 400, es_error(
                    400, "resource_already_exists_exception", f"data_stream [{name}] already exists"
                )
            template = self.matching_template(name)
            if template is None or "data_stream" not in template:
                return 400, es_error(
                    400,
                    "illegal_argument_exception",
                    f"no matching index template found for data stream [{name}]",
                )
            self.create_stream(name, template)
            return 200, {"acknowledged": True}
        if name not in self.data_streams:
            return 404, es_error(404, "index_not_found_exception", f"no such index [{name}]")
        if method == "DELETE":
            del self.data_streams[name]
            del self.indices[name]
            return 200, {"acknowledged": True}
        return 200, {"data_streams": [self.data_streams[name]]}

    def create_stream(self, name: str, template: dict) -> None:
        backing = f".ds-{name}-{datetime.now(UTC):%Y.%m.%d}-000001"
        self.data_streams[name] = {
            "name": name,
            "timestamp_field": {"name": "@timestamp"},
            "indices": [{"index_name": backing}],
            "generation": 1,
            "status": "GREEN",
            "template": next(n for n, t in self.templates.items() if t is template),
            "ilm_policy": template.get("template", {}).get("settings", {}).get("index.lifecycle.name"),
        }
        self.indices[name] = {}

    # documents

    def bulk(self, body: bytes, default_index: str | None) -> dict[str, Any]:
        self.bulk_requests += 1
        lines = [line for line in body.split(b"\n") if line.strip()]
        items, position = [], 0
        while position < len(lines):
            header = json.loads(lines[position])
            op, meta = next(iter(header.items()))
            source = json.loads(lines[position + 1]) if op != "delete" else None
            position += 1 if op == "delete" else 2
            items.append({op: self.write(op, meta.get("_index", default_index), meta.get("_id"), source)})
        return {"errors": any("error" in next(iter(i.values())) for i in items), "took": 1, "items": items}

    def write(self, op: str, target: str, doc_id: str | None, source: dict | None) -> dict[str, Any]:
        def fail(status, error_type, reason):
            return {
                "_index": target,
                "_id": doc_id,
                "status": status,
                "error": {"type": error_type, "reason": reason},
            }

        if target not in self.indices:
            template = self.matching_template(target)
            if template is not None and "data_stream" in template:
                self.create_stream(target, template)
            else:
                self.indices[target] = {}
        stream = self.data_streams.get(target)
        mapping = (self.matching_template(target) or {}).get("template", {}).get("mappings", {})
        if stream is not None:
            if op != "create":
                return fail(
                    400,
                    "illegal_argument_exception",
                    "only write ops with an op_type of create are allowed in data streams",
                )
            if "@timestamp" not in source:
                return fail(
                    400, "document_parsing_exception", "data stream timestamp field [@timestamp] is missing"
                )
        problem = mapping_problem(mapping.get("properties", {}), source or {})
        if problem:
            return fail(400, "document_parsing_exception", problem)
        docs = self.indices[target]
        index_name = stream["indices"][-1]["index_name"] if stream else target
        if doc_id is None:
            doc_id = f"auto-{len(docs)}"
        if op == "create" and doc_id in docs:
            return {
                "_index": index_name,
                "_id": doc_id,
                "status": 409,
                "error": {
                    "type": "version_conflict_engine_exception",
                    "reason": f"[{doc_id}]: version conflict, document already exists (current version [1])",
                    "index": index_name,
                },
            }
        docs[doc_id] = source
        return {"_index": index_name, "_id": doc_id, "_version": 1, "result": "created", "status": 201}

    def read(self, target: str, action: str, body: bytes) -> tuple[int, Any]:
        if target not in self.indices:
            return 404, es_error(404, "index_not_found_exception", f"no such index [{target}]")
        docs = self.indices[target]
        if action == "_refresh":
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if action == "_count":
            return 200, {"count": len(docs)}
        size = (json.loads(body) if body else {}).get("size", 10)
        hits = [{"_index": target, "_id": key, "_source": value} for key, value in list(docs.items())[:size]]
        return 200, {"hits": {"total": {"value": len(docs), "relation": "eq"}, "hits": hits}}


def mapping_problem(properties: dict, source: dict, prefix: str = "") -> str | None:
    """The first value that cannot be indexed under the explicit mapping (numbers only, as ES parses them)."""
    for key, value in source.items():
        spec = properties.get(key)
        if spec is None:
            continue
        if "properties" in spec and isinstance(value, dict):
            problem = mapping_problem(spec["properties"], value, f"{prefix}{key}.")
            if problem:
                return problem
        elif spec.get("type") in NUMERIC_TYPES:
            try:
                float(value)
            except (TypeError, ValueError):
                return f"failed to parse field [{prefix}{key}] of type [{spec['type']}]"
    return None


class FaultProxy(_LocalServer):
    """Forwards to ``upstream``; each request takes the next action of ``plan`` (then "ok").

    Actions: "ok"; "down" (close the connection without answering); "429", "502", "503" (answer that
    status for the whole request); "partial" (for _bulk: a random subset of items answered 429 and not
    forwarded); "noproduct" (forward, strip X-Elastic-Product).
    """

    def __init__(self, upstream: str, seed: int = 0) -> None:
        self.upstream = upstream.rstrip("/")
        self.plan: deque[str] = deque()
        self.rng = random.Random(seed)
        self.seen: list[str] = []
        self.bulk_log: list[tuple[str, str, int]] = []  # (id, log.file.path, log.offset) of every bulk item
        self.lock = threading.Lock()
        # make es-test may point at a cluster with a self-signed certificate; the shipper checks its own.
        self.pool = urllib3.PoolManager(
            **({"cert_reqs": "CERT_NONE"} if upstream.startswith("https") else {})
        )
        super().__init__(_ProxyHandler)

    def set_plan(self, actions: list[str]) -> None:
        with self.lock:
            self.plan = deque(actions)

    def next_action(self) -> str:
        with self.lock:
            action = self.plan.popleft() if self.plan else "ok"
            self.seen.append(action)
            return action

    def forward(self, method: str, path: str, headers: dict[str, str], body: bytes):
        keep = {k: v for k, v in headers.items() if k.lower() not in ("host", "content-length", "connection")}
        return self.pool.request(method, self.upstream + path, body=body or None, headers=keep, retries=False)

    def handle(self, request: _ProxyHandler) -> None:
        body = request._body()
        is_bulk = urlsplit(request.path).path.rstrip("/").endswith("_bulk")
        if is_bulk:
            self.record_bulk(body)
        action = self.next_action()
        if action == "down":
            request.close_connection = True
            request.connection.close()
            return
        if action in ("429", "502", "503"):
            status = int(action)
            kind = "es_rejected_execution_exception" if status == 429 else "unavailable"
            request._reply(status, es_error(status, kind, f"injected {status}"))
            return
        if action == "partial" and is_bulk:
            request._reply(200, self.partial_bulk(request, body))
            return
        response = self.forward(request.command, request.path, dict(request.headers), body)
        headers = {
            k: v
            for k, v in response.headers.items()
            if k.lower() not in ("content-length", "connection", "transfer-encoding")
        }
        if action == "noproduct":
            headers = {k: v for k, v in headers.items() if k.lower() != "x-elastic-product"}
        request._raw_reply(response.status, response.data, headers)

    def record_bulk(self, body: bytes) -> None:
        lines = [line for line in body.split(b"\n") if line.strip()]
        with self.lock:
            for header, source in zip(lines[::2], lines[1::2], strict=True):
                meta = next(iter(json.loads(header).values()))
                where = json.loads(source).get("log", {})
                self.bulk_log.append(
                    (meta.get("_id"), where.get("file", {}).get("path"), where.get("offset"))
                )

    def partial_bulk(self, request: _ProxyHandler, body: bytes) -> dict[str, Any]:
        """Reject a random subset of the items with 429 and forward the rest, answering in request order."""
        lines = [line for line in body.split(b"\n") if line.strip()]
        pairs = [(lines[i], lines[i + 1]) for i in range(0, len(lines), 2)]  # the shipper only sends create
        rejected = {i for i in range(len(pairs)) if self.rng.random() < 0.5}
        forwarded = [pair for i, pair in enumerate(pairs) if i not in rejected]
        upstream_items: list[dict] = []
        if forwarded:
            payload = b"".join(header + b"\n" + source + b"\n" for header, source in forwarded)
            response = self.forward("POST", request.path, dict(request.headers), payload)
            upstream_items = json.loads(response.data)["items"]
        items, upstream = [], iter(upstream_items)
        for i, (header, _) in enumerate(pairs):
            if i in rejected:
                op, meta = next(iter(json.loads(header).items()))
                reason = "rejected execution of coordinating operation (injected)"
                items.append(
                    {
                        op: {
                            "_index": meta.get("_index"),
                            "_id": meta.get("_id"),
                            "status": 429,
                            "error": {"type": "es_rejected_execution_exception", "reason": reason},
                        }
                    }
                )
            else:
                items.append(next(upstream))
        return {"errors": True, "took": 1, "items": items}


class _ProxyHandler(_Handler):
    def do_GET(self) -> None:
        self.server.app.handle(self)

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _raw_reply(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
