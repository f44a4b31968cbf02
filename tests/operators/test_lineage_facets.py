"""The operators' OpenLineage methods, as the Airflow provider's extractor calls them, after real stage runs.

The outputs are published through the real ``stage_main`` (small Parquet stage bodies, as in
tests/core/test_lineage_events.py); the operators are the DAGs' own classes, not run: what is checked is what
they tell the provider before and after a run, which must be the manifests' datasets.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from airflow.providers.openlineage.extractors.base import DefaultExtractor

from operators.spark import PipelineSparkSubmitOperator
from operators.stage import PipelineStageOperator
from operators.train_operator import TrainOperator
from pipeline.core.manifest import Manifest
from pipeline.entrypoint import stage_main
from tests.core.test_lineage_events import AIRFLOW_ENV, OL_ENV, argv, publish_parquet, random_table


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    for name in (*OL_ENV, *AIRFLOW_ENV):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "data"


def overrides(root: Path) -> list[str]:
    return [f"project.data_root={root}", "logging.console=false", "tracking.stage_runs=false"]


def names(datasets) -> list[tuple[str, str]]:
    return [(dataset.namespace, dataset.name) for dataset in datasets]


def test_stage_operators_report_the_manifests_datasets(root):
    rng = random.Random(4747)
    upstream, documents = random_table(rng), random_table(rng)
    for stage, table in (("crawl", upstream), ("clean", documents)):
        assert stage_main(argv(root, "s1"), stage=stage, description="", run=publish_parquet(table)) == 0
    crawl = Manifest.read(root / "sample" / "crawl" / "s1" / "manifest.json")
    clean = Manifest.read(root / "sample" / "clean" / "s1" / "manifest.json")
    crawl_dataset = ("file", str((root / "sample" / "crawl").absolute()))
    clean_dataset = ("file", str((root / "sample" / "clean").absolute()))

    spark = PipelineSparkSubmitOperator(
        stage="clean", input_stage="crawl", snapshot="s1", config_path="", overrides=overrides(root)
    )
    extractor = DefaultExtractor(spark)
    start = extractor.extract()
    assert start is not None, "the provider's extractor swallowed an error (see the log)"
    assert (names(start.inputs), names(start.outputs)) == ([crawl_dataset], [clean_dataset])
    assert start.outputs[0].facets == {}  # not published yet, as far as the task start knows
    assert start.run_facets["pretrain_run"].config_hash == clean.config_hash

    complete = extractor.extract_on_complete(None)
    assert complete is not None
    assert (names(complete.inputs), names(complete.outputs)) == ([crawl_dataset], [clean_dataset])
    (output,) = complete.outputs
    assert output.facets["version"].datasetVersion == clean.digest
    assert output.outputFacets["outputStatistics"].rowCount == clean.rows["documents"] == documents.num_rows
    assert [(f.name, f.type) for f in output.facets["schema"].fields] == [
        (field.name, str(field.type)) for field in documents.schema
    ]
    assert complete.inputs[0].inputFacets["inputStatistics"].rowCount == upstream.num_rows
    assert complete.inputs[0].facets["version"].datasetVersion == crawl.digest

    failure = extractor.extract_on_failure(None)
    assert failure is not None and names(failure.outputs) == [clean_dataset]

    # The python-runner operator (a stage as a child process), on the source stage: no inputs.
    process = PipelineStageOperator(stage="crawl", snapshot="s1", config_path="", overrides=overrides(root))
    crawled = DefaultExtractor(process).extract_on_complete(None)
    assert crawled is not None
    assert (names(crawled.inputs), names(crawled.outputs)) == ([], [crawl_dataset])
    assert crawled.outputs[0].outputFacets["outputStatistics"].rowCount == upstream.num_rows


def test_train_operator_reports_its_token_shards(root):
    rng = random.Random(11)
    shards = random_table(rng)
    assert stage_main(argv(root, "s1"), stage="crawl", description="", run=publish_parquet(shards)) == 0
    tokenize = [*argv(root, "s1"), "--input-stage", "crawl"]
    assert stage_main(tokenize, stage="tokenize", description="", run=publish_parquet(shards)) == 0
    train = TrainOperator(snapshot="s1", config_path="", overrides=overrides(root))
    start = DefaultExtractor(train).extract()
    assert start is not None
    assert names(start.inputs) == [("file", str((root / "sample" / "tokenize").absolute()))]
    assert names(start.outputs) == [("file", str((root / "sample" / "train").absolute()))]
    assert start.inputs[0].inputFacets["inputStatistics"].rowCount == shards.num_rows
    assert start.run_facets["pretrain_run"].stage == "train"
