"""docker/observability: the dashboards are valid and show the panels they claim, and every query names a
series or field that really exists — Prometheus series scraped from a live exporter, Kibana fields from
the index template the shipper installs. Compose, Prometheus and Elasticsearch setup files are checked
for consistency with the code. (Nothing here starts Docker: there is no Docker engine on our machines.)"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pipeline.logshipping.es_index import ILM_POLICY, INDEX_TEMPLATE, ilm_policy, index_template
from pipeline.tracking.prometheus import SERIES, TrainingExporter

STACK = Path(__file__).resolve().parents[2] / "docker" / "observability"
GRAFANA_PANELS = {
    "Step",
    "Tokens trained",
    "Throughput now",
    "GPUs reporting",
    "Training loss",
    "Throughput (tokens/s)",
    "Step time",
    "Learning rate and gradient norm",
    "GPU utilisation",
    "GPU memory",
    "Process memory (RSS)",
}
KIBANA_PANELS = {
    "Errors by stage",
    "Errors by stage and task",
    "Training progress: loss by step",
    "Training progress: tokens/s",
    "Training progress: latest step",
    "Log lines by level",
    "Recent errors",
}


@pytest.fixture(scope="module")
def exposed_series() -> set[str]:
    """Sample names a real exporter serves (GPU ones only where NVML sees a GPU, so added from SERIES)."""
    exporter = TrainingExporter(port=0, rank=0).start()
    try:
        exporter.update(
            step=1, loss=2.0, tokens_per_s=10.0, step_time_s=0.5, tokens=64, lr=1e-3, grad_norm=1.0
        )
        text = urllib.request.urlopen(exporter.url, timeout=30).read().decode()
    finally:
        exporter.close()
    names = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    return names | {name for name in SERIES if name.startswith("pretrain_gpu_")}


def test_grafana_dashboard_has_its_panels_and_queries_only_exposed_series(exposed_series):
    dashboard = json.loads((STACK / "grafana" / "dashboards" / "pretrain-training.json").read_text())
    panels = dashboard["panels"]
    assert {panel["title"] for panel in panels} == GRAFANA_PANELS
    assert len({panel["id"] for panel in panels}) == len(panels)
    datasource = yaml.safe_load(
        (STACK / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = datasource["datasources"][0]["uid"]
    queries = [target["expr"] for panel in panels for target in panel["targets"]]
    queries += [variable["query"] for variable in dashboard["templating"]["list"]]
    for panel in panels:
        assert panel["datasource"]["uid"] == uid and panel["targets"], panel["title"]
    for query in queries:
        assert query.count("(") == query.count(")") and query.count("{") == query.count("}"), query
        metrics = set(re.findall(r"\bpretrain_[a-z_]+\b", query))
        assert metrics, query
        assert metrics <= exposed_series, f"{query} names series the exporter does not expose"
    # Every series the exporter documents appears on the dashboard.
    shown = {name for query in queries for name in re.findall(r"\bpretrain_[a-z_]+\b", query)}
    bases = {re.sub(r"_(bucket|count|sum)$", "", name) for name in shown}
    assert set(SERIES) <= bases | shown


def test_grafana_panels_do_not_overlap():
    panels = json.loads((STACK / "grafana" / "dashboards" / "pretrain-training.json").read_text())["panels"]
    cells = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, panel["title"]
                cells.add((x, y))


def mapped_fields(properties: dict, prefix: str = "") -> set[str]:
    fields = set()
    for name, spec in properties.items():
        if "properties" in spec:
            fields |= mapped_fields(spec["properties"], f"{prefix}{name}.")
        else:
            fields.add(prefix + name)
    return fields


def kibana_objects() -> list[dict]:
    lines = (STACK / "kibana" / "pretrain-dashboard.ndjson").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_kibana_saved_objects_have_their_panels_and_use_mapped_fields():
    objects = kibana_objects()
    by_id = {obj["id"]: obj for obj in objects}
    assert len(by_id) == len(objects)
    template = index_template()
    known = mapped_fields(template["template"]["mappings"]["properties"])

    def field_ok(field: str) -> bool:
        return field in known or field.startswith("labels.")  # labels.* are keywords by dynamic template

    (data_view,) = [obj for obj in objects if obj["type"] == "index-pattern"]
    assert data_view["attributes"]["title"] in template["index_patterns"]
    assert data_view["attributes"]["timeFieldName"] == "@timestamp"

    (dashboard,) = [obj for obj in objects if obj["type"] == "dashboard"]
    panels = json.loads(dashboard["attributes"]["panelsJSON"])
    references = {ref["name"]: ref for ref in dashboard["references"]}
    titles = set()
    for panel in panels:
        ref = references[panel["panelRefName"]]
        target = by_id[ref["id"]]
        assert target["type"] == ref["type"] == panel["type"]
        titles.add(target["attributes"]["title"])
    assert titles == KIBANA_PANELS

    for obj in objects:
        for ref in obj["references"]:
            assert ref["id"] in by_id, f"{obj['id']} refers to missing {ref['id']}"
        if obj["type"] not in ("visualization", "search"):
            continue
        source = json.loads(obj["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])
        assert source["indexRefName"] in {ref["name"] for ref in obj["references"]}
        for field in re.findall(r"([a-z@][\w.]*) :", source["query"]["query"]):
            assert field_ok(field), f"{obj['id']} queries unmapped {field}"
        if obj["type"] == "visualization":
            state = json.loads(obj["attributes"]["visState"])
            assert state["title"] == obj["attributes"]["title"]
            for agg in state["aggs"]:
                if "field" in agg["params"]:
                    assert field_ok(agg["params"]["field"]), (
                        f"{obj['id']} aggregates unmapped {agg['params']}"
                    )
        else:
            assert all(field_ok(column) for column in obj["attributes"]["columns"])


def test_errors_by_stage_and_training_progress_query_what_processes_log():
    objects = {obj["id"]: obj for obj in kibana_objects()}
    errors = json.loads(objects["pretrain-errors-by-stage"]["attributes"]["visState"])
    assert [agg["params"].get("field") for agg in errors["aggs"]] == [None, "@timestamp", "labels.component"]
    query = json.loads(
        objects["pretrain-errors-by-stage"]["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"]
    )
    assert "error" in query["query"]["query"]
    loss = json.loads(objects["pretrain-training-loss"]["attributes"]["visState"])
    assert {agg["params"].get("field") for agg in loss["aggs"]} == {"pretrain.loss", "pretrain.step"}


def test_prometheus_scrapes_the_documented_trainer_ports():
    config = yaml.safe_load((STACK / "prometheus" / "prometheus.yml").read_text())
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "pretrain-trainer"]
    assert job["metrics_path"] == "/metrics"
    targets = job["static_configs"][0]["targets"]
    assert [int(target.rsplit(":", 1)[1]) for target in targets] == [
        9400,
        9401,
    ]  # prometheus_port + local rank


def test_compose_mounts_files_that_exist_and_elasticsearch_setup_matches_the_shipper():
    compose = yaml.safe_load((STACK / "compose.yaml").read_text())
    services = compose["services"]
    assert {"elasticsearch", "kibana", "setup", "logstash", "filebeat", "prometheus", "grafana"} <= set(
        services
    )
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (STACK / source).exists(), f"{name} mounts missing {source}"
    setup = services["setup"]["command"][0]
    assert f"_ilm/policy/{ILM_POLICY}" in setup and f"_index_template/{INDEX_TEMPLATE}" in setup
    stored_policy = json.loads((STACK / "elasticsearch" / "ilm-policy.json").read_text())
    stored_template = json.loads((STACK / "elasticsearch" / "index-template.json").read_text())
    regenerate = "regenerate with: python -m pipeline.logshipping.es_index"
    assert stored_policy == {"policy": ilm_policy("30d")}, regenerate
    assert stored_template == index_template(), regenerate


def test_logstash_builds_the_shipper_document_id():
    conf = (STACK / "logstash" / "pipeline" / "pretrain.conf").read_text()
    assert 'action => "create"' in conf and 'document_id => "%{[@metadata][doc_id]}"' in conf
    # Same formula as log_shipper.document_id: sha1(path NUL offset NUL line), path relative to the data root.
    assert 'Digest::SHA1.hexdigest(path + "\\0" + offset.to_s + "\\0" + event.get("message").to_s)' in conf
    filebeat = yaml.safe_load((STACK / "filebeat" / "filebeat.yml").read_text())
    (source,) = filebeat["filebeat.inputs"]
    assert source["paths"] == ["/data/_runs/*/logs/*.ecs.json"] and "parsers" not in source
