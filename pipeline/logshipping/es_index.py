"""Elasticsearch side of log shipping: the ILM policy, the index template, the data stream, and bulk sends.

Documents go into a data stream (``logs-pretrain-<namespace>``) with ``op_type: create`` and an id that
the shipper derives from where the line sits in its file, so a re-send of a line already indexed answers
409 and counts as delivered: at-least-once sending, exactly-once indexing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

ILM_POLICY = "pretrain-logs"
INDEX_TEMPLATE = "logs-pretrain"
TEMPLATE_VERSION = 1
# Item statuses that mean "this document will never be accepted as it is" (mapping or parse errors).
REJECTED_ITEM_STATUSES = frozenset({400})
MANAGED_BY = {"managed_by": "pretrain-pipeline"}


def ilm_policy(retention: str) -> dict[str, Any]:
    """Roll the write index over daily or at 50 GB a primary shard; delete indices older than retention."""
    return {
        "_meta": MANAGED_BY,
        "phases": {
            "hot": {"actions": {"rollover": {"max_age": "1d", "max_primary_shard_size": "50gb"}}},
            "delete": {"min_age": retention, "actions": {"delete": {}}},
        },
    }


def _keyword(**extra: Any) -> dict[str, Any]:
    return {"type": "keyword", **extra}


def index_template(ilm: bool = True) -> dict[str, Any]:
    """A data stream template for logs-pretrain-*, above the built-in logs-*-* (priority 100); without
    ``ilm``, a plain index template (for a server without ILM and data streams)."""
    return {
        "index_patterns": ["logs-pretrain-*"],
        **({"data_stream": {}} if ilm else {}),
        "priority": 200,
        "version": TEMPLATE_VERSION,
        "_meta": {**MANAGED_BY, "description": "ECS JSON log lines from pretrain-pipeline processes"},
        "template": {
            "settings": {"index.lifecycle.name": ILM_POLICY} if ilm else {},
            "mappings": {
                # ECS: labels are keywords; other strings too unless mapped below.
                "dynamic_templates": [
                    {"labels": {"path_match": "labels.*", "mapping": _keyword()}},
                    {"strings": {"match_mapping_type": "string", "mapping": _keyword(ignore_above=1024)}},
                ],
                "properties": {
                    "@timestamp": {"type": "date"},
                    "message": {"type": "text"},
                    "tags": _keyword(),
                    "ecs": {"properties": {"version": _keyword()}},
                    "log": {
                        "properties": {
                            "level": _keyword(),
                            "logger": _keyword(),
                            "offset": {"type": "long"},
                            "file": {"properties": {"path": _keyword()}},
                        }
                    },
                    "event": {"properties": {"dataset": _keyword()}},
                    "service": {"properties": {"name": _keyword()}},
                    "error": {
                        "properties": {
                            "type": _keyword(),
                            "message": {"type": "text"},
                            "stack_trace": {"type": "text", "index": False},
                        }
                    },
                    # Training progress lines (pipeline.tracking.metric_sinks.LogLineMetrics).
                    "pretrain": {
                        "properties": {
                            "step": {"type": "long"},
                            "loss": {"type": "float"},
                            "val_loss": {"type": "float"},
                            "lr": {"type": "float"},
                            "grad_norm": {"type": "float"},
                            "tokens_per_s": {"type": "float"},
                            "step_time_s": {"type": "float"},
                        }
                    },
                },
            },
        },
    }


@dataclass
class SendResult:
    delivered: list[str] = field(default_factory=list)
    """Ids now in Elasticsearch: created, or already there (409 on create)."""
    already_present: int = 0
    retry: list[dict[str, Any]] = field(default_factory=list)
    """Actions to spool and send again later (unreachable, 429, 5xx, auth, ...)."""
    rejected: list[tuple[dict[str, Any], int, Any]] = field(default_factory=list)
    """(action, status, error) for documents Elasticsearch will never accept as they are."""
    error: str | None = None


def describe_error(exc: BaseException) -> str:
    from elasticsearch import UnsupportedProductError

    if isinstance(exc, UnsupportedProductError):
        return (
            "the server is not Elasticsearch (its responses lack the 'X-Elastic-Product: Elasticsearch' "
            "header); check logging.elasticsearch_url"
        )
    return f"{type(exc).__name__}: {exc}"


class ElasticsearchSink:
    """Bulk-creates documents in one data stream through ``elasticsearch.helpers.streaming_bulk``.

    On first use it creates the ILM policy (if absent), the index template (if absent or older) and the
    data stream. ``send`` never raises for an unreachable or refusing cluster: it sorts every action
    into delivered, retry (to spool) or rejected.
    """

    def __init__(
        self,
        url: str,
        data_stream: str,
        *,
        retention: str = "30d",
        api_key: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        ca_certs: str | None = None,
        verify_certs: bool = True,
        request_timeout: float = 30.0,
        transport_retries: int = 2,
        bulk_retries: int = 2,
        initial_backoff: float = 1.0,
        max_backoff: float = 30.0,
        chunk_size: int = 500,
        max_chunk_bytes: int = 10 * 1024 * 1024,
        setup: str = "full",
    ) -> None:
        """setup: what the sink installs on first use (logging.elasticsearch_setup): ``full`` the ILM policy,
        the index template and the data stream; ``template`` the index template only, for a server without
        ILM and data streams; ``none`` nothing (installed elsewhere, e.g. from ``write_setup_files``)."""
        from elasticsearch import Elasticsearch

        self.url = url
        self.data_stream = data_stream
        self.retention = retention
        self.bulk_retries = bulk_retries
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self.chunk_size = chunk_size
        self.max_chunk_bytes = max_chunk_bytes
        options: dict[str, Any] = {
            "request_timeout": request_timeout,
            "max_retries": transport_retries,
            "retry_on_timeout": True,
            "verify_certs": verify_certs,
        }
        if api_key:
            options["api_key"] = api_key
        if basic_auth:
            options["basic_auth"] = basic_auth
        if ca_certs:
            options["ca_certs"] = ca_certs
        self.client = Elasticsearch(url, **options)
        self.setup = setup
        self._ready = setup == "none"

    @classmethod
    def from_env(cls, url: str, data_stream: str, **kwargs: Any) -> ElasticsearchSink:
        """Credentials come from the environment, never from the config (its hash is in every manifest)."""
        env = os.environ
        basic = None
        if env.get("ELASTICSEARCH_USERNAME"):
            basic = (env["ELASTICSEARCH_USERNAME"], env.get("ELASTICSEARCH_PASSWORD", ""))
        return cls(
            url,
            data_stream,
            api_key=env.get("ELASTICSEARCH_API_KEY") or None,
            basic_auth=basic,
            ca_certs=env.get("ELASTICSEARCH_CA_CERTS") or None,
            verify_certs=env.get("ELASTICSEARCH_VERIFY_CERTS", "true").lower() not in ("0", "false", "no"),
            **kwargs,
        )

    def ensure_setup(self) -> None:
        """ILM policy, index template and data stream; once per sink, again after a 404 on bulk."""
        if self._ready:
            return
        client = self.client
        missing = client.options(ignore_status=404)
        full = self.setup == "full"
        if full and missing.ilm.get_lifecycle(name=ILM_POLICY).meta.status == 404:
            client.ilm.put_lifecycle(name=ILM_POLICY, policy=ilm_policy(self.retention))
            log.info("created ILM policy %s", ILM_POLICY)
        current = missing.indices.get_index_template(name=INDEX_TEMPLATE)
        templates = current.body.get("index_templates", []) if current.meta.status == 200 else []
        installed = templates[0]["index_template"].get("version", 0) if templates else None
        if installed is None or installed < TEMPLATE_VERSION:
            client.indices.put_index_template(name=INDEX_TEMPLATE, body=index_template(ilm=full))
            log.info("installed index template %s v%d", INDEX_TEMPLATE, TEMPLATE_VERSION)
        if full and missing.indices.get_data_stream(name=self.data_stream).meta.status == 404:
            created = client.options(ignore_status=400).indices.create_data_stream(name=self.data_stream)
            error = created.body.get("error", {}) if isinstance(created.body, dict) else {}
            if created.meta.status == 400 and error.get("type") != "resource_already_exists_exception":
                raise RuntimeError(f"cannot create data stream {self.data_stream}: {error}")
        self._ready = True

    def _bulk_action(self, action: dict[str, Any]) -> dict[str, Any]:
        return {
            "_op_type": "create",
            "_index": self.data_stream,
            "_id": action["_id"],
            "_source": action["_source"],
        }

    def send(self, actions: list[dict[str, Any]]) -> SendResult:
        """Bulk-create ``actions`` (dicts with ``_id`` and ``_source``), sorting each into the result."""
        from elastic_transport import TransportError
        from elasticsearch import ApiError
        from elasticsearch.helpers import streaming_bulk

        result = SendResult()
        if not actions:
            return result
        try:
            self.ensure_setup()
        except (ApiError, TransportError, RuntimeError) as exc:
            result.error = f"setting up {self.data_stream}: {describe_error(exc)}"
            result.retry = list(actions)
            return result

        outcomes: dict[str, tuple[bool, dict[str, Any]]] = {}
        try:
            for ok, item in streaming_bulk(
                self.client,
                (self._bulk_action(action) for action in actions),
                chunk_size=self.chunk_size,
                max_chunk_bytes=self.max_chunk_bytes,
                raise_on_error=False,
                raise_on_exception=False,
                max_retries=self.bulk_retries,
                initial_backoff=self.initial_backoff,
                max_backoff=self.max_backoff,
            ):
                _, info = next(iter(item.items()))
                outcomes[info["_id"]] = (ok, info)
        except (ApiError, TransportError) as exc:
            # Unreachable mid-stream: whatever has no outcome yet goes back to the spool.
            result.error = describe_error(exc)

        for action in actions:
            ok, info = outcomes.get(action["_id"], (False, None))
            status = info.get("status") if info else None
            if ok:
                result.delivered.append(action["_id"])
            elif status == 409:
                result.delivered.append(action["_id"])
                result.already_present += 1
            elif info is not None and status in REJECTED_ITEM_STATUSES and "exception" not in info:
                result.rejected.append((action, status, info.get("error")))
            else:
                if status == 404:
                    self._ready = self.setup == "none"  # the data stream vanished: set it up again next time
                if info is not None and result.error is None:
                    raised = info.get("exception")
                    result.error = (
                        describe_error(raised) if raised else f"status {status}: {info.get('error')}"
                    )
                result.retry.append(action)
        return result

    def close(self) -> None:
        self.client.close()


def write_setup_files(folder) -> None:
    """The policy and template as JSON files, for setups that install them without the shipper (docker/)."""
    import json
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ilm-policy.json").write_text(json.dumps({"policy": ilm_policy("30d")}, indent=2) + "\n")
    (folder / "index-template.json").write_text(json.dumps(index_template(), indent=2) + "\n")


if __name__ == "__main__":
    import sys

    write_setup_files(sys.argv[1] if len(sys.argv) > 1 else "docker/observability/elasticsearch")
