"""The Asset that links corpus ingestion to training, and what its events carry.

`corpus_crawl` emits an event on TOKEN_SHARDS each time it publishes a snapshot's token shards; `pretrain`
is scheduled on it. The event's ``extra`` names the snapshot and the config it was built with (paths and
ids only), so the training run reads exactly those shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Asset

TOKEN_SHARDS = Asset(name="token_shards", uri="pretrain://corpus/token-shards", group="pretrain")


def token_shards_extra(
    *, path: str, snapshot: str, digest: str, config_path: str | None, overrides: Sequence[str]
) -> dict[str, Any]:
    return {
        "path": path,
        "snapshot": snapshot,
        "digest": digest,
        "config_path": config_path or "",
        "overrides": list(overrides),
    }


def latest_token_shards_extra(triggering_asset_events: Mapping | None) -> dict[str, Any]:
    """The newest TOKEN_SHARDS event's extra for an asset-triggered run; {} for a manual one."""
    if not triggering_asset_events:
        return {}
    events = list(triggering_asset_events.get(TOKEN_SHARDS, []) or [])
    if not events:
        return {}
    latest = max(events, key=lambda event: event.timestamp)
    return dict(latest.extra or {})


def announce_token_shards(
    outlet_events,
    *,
    path: str,
    snapshot: str,
    params: Mapping[str, Any],
    report_paths: Sequence[str] = (),
) -> str:
    """Set the TOKEN_SHARDS event of a publishing task: this event schedules `pretrain` on ``snapshot``.

    Unless a report on the snapshot (``report_paths``, the quality stage's output) failed its gate in mode
    "fail": then the task is skipped with the gate's reasons, and a skipped task emits no event, so no
    training starts on the snapshot.
    """
    from airflow.sdk.exceptions import AirflowSkipException

    from pipeline.core.manifest import MANIFEST_NAME, Manifest
    from pipeline.quality.gate import blocks_training

    for report in report_paths:
        verdict = Manifest.read(f"{report}/{MANIFEST_NAME}").extra.get("gate")
        if verdict is not None and blocks_training(verdict):
            raise AirflowSkipException(
                f"quality gate failed for snapshot {snapshot!r} ({report}/report.html): "
                + "; ".join(verdict["failures"])
                + ". Its token shards are not announced, so pretrain does not train on it"
            )
    manifest = Manifest.read(f"{path}/{MANIFEST_NAME}")
    outlet_events[TOKEN_SHARDS].extra = token_shards_extra(
        path=path,
        snapshot=snapshot,
        digest=manifest.digest,
        config_path=params["config_path"],
        overrides=params["overrides"] or [],
    )
    return path
