"""The DAG files parse, and each DAG has the shape, schedule, params and task defaults it promises."""

import copy
import itertools
from pathlib import Path

import pendulum
import pytest

DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"
DAG_IDS = {
    "corpus_crawl",
    "corpus_from_files",
    "pretrain",
    "pretrain_every_snapshot",
    "reprocess_corpus",
    "pretrain_pipeline",
    "train_classifier",
    "ablate",
}


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(str(DAGS_FOLDER))


def assert_chain(dag, order):
    for before, after in itertools.pairwise(order):
        assert before in dag.get_task(after).upstream_task_ids, f"{before} -> {after}"


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == DAG_IDS


def test_every_task_retries_with_exponential_backoff_and_has_a_timeout(dagbag):
    for dag in dagbag.dags.values():
        for task in dag.tasks:
            where = f"{dag.dag_id}.{task.task_id}"
            assert task.execution_timeout is not None, where
            if task.task_id != "stored_source":  # a missing crawl or ingest does not appear by retrying
                assert task.retries >= 1 and task.retry_exponential_backoff >= 2, where


def test_form_fields_left_empty_are_accepted(dagbag):
    """The UI sends null for an empty field; optional fields must accept it or the form cannot be submitted."""
    for dag in dagbag.dags.values():
        for name in list(dag.params):
            if not dag.params.get_param(name).value:
                params = copy.deepcopy(dag.params)
                params[name] = None
                assert params.validate()[name] is None, f"{dag.dag_id}.{name}"


def test_corpus_crawl_maps_crawl_shards_then_runs_spark_stages_and_publishes_tokens(dagbag):
    from airflow.sdk.definitions.mappedoperator import MappedOperator

    from operators.assets import TOKEN_SHARDS

    dag = dagbag.dags["corpus_crawl"]
    assert dag.timetable.expression == "0 0 * * *" and not dag.catchup  # @daily: one snapshot a day
    assert_chain(
        dag,
        [
            "crawl_shards",
            "crawl_shard",
            "crawl",
            "clean",
            "dedup",
            "classify",
            "decontaminate",
            "tokenize",
            "publish_token_shards",
        ],
    )
    shard = dag.get_task("crawl_shard")
    assert isinstance(shard, MappedOperator) and shard.operator_class.__name__ == "CrawlOperator"
    assert dag.get_task("crawl").merge
    for stage in ("clean", "dedup", "classify", "decontaminate", "quality", "tokenize"):
        assert type(dag.get_task(stage)).__name__ == "PipelineSparkSubmitOperator"
    assert dag.get_task("clean").input_stage == "crawl"
    assert dag.get_task("classify").input_stage == "dedup"
    assert dag.get_task("tokenize").input_stage == "decontaminate"
    assert dag.get_task("quality").upstream_task_ids == {"decontaminate"}  # beside tokenize, not before
    assert dag.get_task("quality").input_stage == "decontaminate"
    assert "train_classifier" not in dag.task_ids  # trained by hand (its own DAG), not every day
    # It waits for the quality report too: a report that fails its gate in mode fail holds the snapshot back.
    assert dag.get_task("publish_token_shards").upstream_task_ids == {"tokenize", "quality"}
    assert dag.get_task("publish_token_shards").outlets == [TOKEN_SHARDS]
    assert set(dag.params) == {"snapshot", "config_path", "overrides"}


def test_crawl_tasks_pass_the_shard_arguments(tmp_path):
    from operators.crawl import CrawlOperator
    from tests.conftest import make_config

    config = make_config(tmp_path, "crawl.num_shards=3")
    shard = CrawlOperator(task_id="s", shard=2, snapshot="2026-03-01")
    assert shard.stage_arguments(config) == ["--shard", "2", "--num-shards", "3"]
    assert (
        shard.output_ref(config).path
        == tmp_path / "sample" / "crawl-shards" / "2026-03-01.shard-00002-of-00003"
    )
    merge = CrawlOperator(task_id="m", merge=True, snapshot="2026-03-01")
    assert merge.stage_arguments(config) == ["--merge", "--num-shards", "3"]
    assert merge.output_ref(config).path == tmp_path / "sample" / "crawl" / "2026-03-01"
    assert CrawlOperator(task_id="w", snapshot="s").stage_arguments(config) == []
    with pytest.raises(ValueError, match="not both"):
        CrawlOperator(task_id="x", shard=0, merge=True)


def test_pretrain_is_scheduled_on_token_shards_with_a_typed_form(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    from operators.assets import TOKEN_SHARDS
    from operators.defaults import TRAINING_TIMEOUT

    dag = dagbag.dags["pretrain"]
    assert list(dag.timetable.asset_condition.objects) == [TOKEN_SHARDS]
    assert_chain(dag, ["training_run", "train", "export", "report"])
    assert_chain(dag, ["train", "evaluate", "report"])
    train = dag.get_task("train")
    assert type(train).__name__ == "TrainOperator" and train.execution_timeout == TRAINING_TIMEOUT
    form = {
        "preset",
        "steps",
        "nodes",
        "processes_per_node",
        "launcher",
        "precision",
        "data_parallel",
        "dp_replicate",
        "checkpoint_format",
        "checkpoint_async",
        "pp_degree",
        "pp_microbatches",
        "pp_schedule",
        "pp_virtual_stages",
        "mlflow_experiment",
        "mixture",
        "snapshot",
        "config_path",
        "overrides",
    }
    assert set(dag.params) == form
    assert dag.params.get_param("launcher").schema["enum"] == ["local", "kubernetes"]
    assert "tiny" in dag.params.get_param("preset").schema["enum"]
    dag.params.validate()  # the defaults are a valid form
    for name, value in [
        ("steps", 0),
        ("launcher", "slurm"),
        ("precision", "fp8"),
        ("pp_schedule", "zero_bubble"),
        ("pp_degree", 0),
        ("dp_replicate", 0),
        ("checkpoint_format", "safetensors"),
        ("nodes", "two"),
        ("preset", "huge"),
    ]:
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError):
            params[name] = value
    params = copy.deepcopy(dag.params)
    params.update({"steps": 5, "launcher": "kubernetes", "preset": "tiny", "nodes": 2, "precision": "bf16"})
    assert params.validate()["steps"] == 5


def test_the_pretrain_form_takes_a_mixture_checked_by_the_configs_own_schema(dagbag):
    from airflow.sdk.definitions.param import ParamValidationError

    from operators.training import MIXTURE_EXAMPLE
    from pipeline.data.config import MixtureSource

    dag = dagbag.dags["pretrain"]
    field = dag.params.get_param("mixture")
    assert field.value is None  # an asset-triggered run takes the defaults: the event's snapshot alone
    assert field.schema["items"] == MixtureSource.model_json_schema()  # declared once, in the config
    assert field.schema["examples"] == [MIXTURE_EXAMPLE]
    params = copy.deepcopy(dag.params)
    params["mixture"] = MIXTURE_EXAMPLE
    assert params.validate()["mixture"] == MIXTURE_EXAMPLE
    for bad in (
        [],
        [{"snapshots": "all"}],  # no corpus
        [{"corpus": "web", "weight": 0}],
        [{"corpus": "web", "weigth": 2}],  # a misspelt key is not ignored
        [{"corpus": "../etc"}],
        [{"corpus": "web", "snapshots": 3}],
    ):
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError):
            params["mixture"] = bad


def test_pretrain_every_snapshot_is_the_scheduled_variant_on_token_shards(dagbag):
    from operators.assets import TOKEN_SHARDS

    dag = dagbag.dags["pretrain_every_snapshot"]
    assert list(dag.timetable.asset_condition.objects) == [TOKEN_SHARDS]
    assert dag.is_paused_upon_creation  # one of the two asset-scheduled trainings, chosen by unpausing it
    assert_chain(dag, ["training_run", "train", "export", "report"])
    assert_chain(dag, ["train", "evaluate", "report"])
    assert set(dag.params) == {"corpus", *dagbag.dags["pretrain"].params}


def test_reprocess_corpus_reads_stored_crawls_for_backfills(dagbag):
    dag = dagbag.dags["reprocess_corpus"]
    assert "quality" not in dag.task_ids  # backfills re-make the data, not the reports
    assert dag.timetable.expression == "0 0 * * *" and not dag.catchup  # backfills need a schedule
    assert dag.start_date <= pendulum.datetime(2021, 1, 1, tz="UTC")  # years of snapshots can be backfilled
    assert "crawl" not in dag.task_ids
    assert_chain(dag, ["stored_source", "ingest", "clean", "dedup", "classify", "decontaminate", "tokenize"])
    assert "stored_source" in dag.get_task("clean").upstream_task_ids  # a crawl skips the ingest
    assert dag.get_task("clean").trigger_rule == "none_failed_min_one_success"
    assert "stored_source" in dag.get_task("clean").input_stage  # the stored source, at run time
    assert dag.get_task("dedup").input_stage == "clean"
    assert all(not task.outlets for task in dag.tasks)  # a backfill does not start trainings


def test_corpus_from_files_ingests_then_runs_the_corpus_stages_and_publishes_tokens(dagbag):
    from operators.assets import TOKEN_SHARDS

    dag = dagbag.dags["corpus_from_files"]
    assert type(dag.timetable).__name__ == "NullTimetable"  # triggered by hand, with its sources
    assert_chain(
        dag,
        [
            "run_overrides",
            "ingest",
            "clean",
            "dedup",
            "classify",
            "decontaminate",
            "tokenize",
            "publish_token_shards",
        ],
    )
    assert type(dag.get_task("ingest")).__name__ == "PipelineSparkSubmitOperator"
    assert dag.get_task("clean").input_stage == "ingest"
    assert dag.get_task("quality").upstream_task_ids == {"decontaminate", "run_overrides"}  # beside tokenize
    assert dag.get_task("publish_token_shards").outlets == [TOKEN_SHARDS]
    assert set(dag.params) == {"snapshot", "config_path", "overrides", "sources"}


def test_a_runs_sources_become_validated_ingest_overrides():
    from operators.tasks import ingest_overrides
    from pipeline.core.config import ConfigError

    params = {"config_path": None, "overrides": ["ingest.id_column=doc_id"], "sources": ["/d/*.jsonl"]}
    assert ingest_overrides(params) == ["ingest.id_column=doc_id", 'ingest.sources=["/d/*.jsonl"]']
    assert ingest_overrides({"config_path": None, "overrides": None, "sources": None}) == []
    with pytest.raises(ConfigError, match=r"ingest\.format"):
        ingest_overrides({"config_path": None, "overrides": ["ingest.format=csv"], "sources": []})


def test_pretrain_pipeline_runs_the_same_stages_in_one_dag(dagbag):
    dag = dagbag.dags["pretrain_pipeline"]
    order = ["crawl", "clean", "dedup", "classify", "decontaminate", "tokenize", "train", "export", "report"]
    assert type(dag.get_task("crawl")).__name__ == "CrawlOperator" and not dag.get_task("crawl").merge
    assert sorted(dag.task_ids) == sorted([*order, "evaluate", "quality"])
    assert_chain(dag, order)
    assert_chain(dag, ["train", "evaluate", "report"])
    assert_chain(dag, ["decontaminate", "quality"])  # the demo shows the data-quality report too
    assert not dag.get_task("train").frozen_config  # the run's config file and overrides, as every stage's
    assert set(dag.params) >= {"snapshot", "config_path", "overrides"}


RUNNER_OPERATORS = {
    "spark": "PipelineSparkSubmitOperator",
    "torchrun": "TrainOperator",
    "python": "PipelineStageOperator",
}


def test_every_dag_wires_its_stages_as_the_registry_declares(dagbag):
    """Each stage task waits for the tasks of the stages it reads, reads what the registry says by default,
    and runs with the operator for its runner; every non-report stage is in some DAG."""
    from pipeline.stages import BY_NAME, STAGES

    seen = set()
    for dag in dagbag.dags.values():
        # A DAG that ingests instead of crawling: what reads the crawl reads the ingest.
        source = {"crawl": "ingest"} if "ingest" in dag.task_ids and "crawl" not in dag.task_ids else {}
        for task in dag.tasks:
            entry = BY_NAME.get(task.task_id)
            if entry is None or task.task_id == "crawl":  # crawl: sharded by CrawlOperator
                continue
            seen.add(entry.name)
            where = f"{dag.dag_id}.{task.task_id}"
            assert type(task).__name__ == RUNNER_OPERATORS[entry.runner], where
            for read in entry.reads:
                read = source.get(read, read)
                if read in dag.task_ids:
                    assert read in task.upstream_task_ids, f"{where} must wait for {read}"
            if hasattr(task, "input_stage"):
                expected = source.get(entry.default_input, entry.default_input)
                if dag.dag_id == "reprocess_corpus" and expected == "ingest":
                    expected = "{{ ti.xcom_pull(task_ids='stored_source', key='source') }}"
                assert task.input_stage == expected, where
    assert seen == {entry.name for entry in STAGES} - {"crawl"}


def test_a_new_registry_entry_joins_the_dags(monkeypatch):
    """Adding a stage is one registry entry: a semantic-dedup stage between dedup and classify lands in
    the corpus DAGs in the right place, with classify reading it."""
    import dataclasses

    from airflow.sdk import DAG

    from operators.tasks import corpus_stages, stage_tasks
    from pipeline import stages

    semantic = stages.Stage(
        name="semantic_dedup",
        package="pipeline.dedup",
        reads=("dedup",),
        runner="spark",
        group="corpus",
        help="embedding-based near-duplicate removal",
        run="pipeline.dedup.job:run",
    )
    entries = []
    for entry in stages.STAGES:
        if entry.name == "classify":
            entry = dataclasses.replace(entry, reads=("semantic_dedup",))
        entries.append(entry)
        if entry.name == "dedup":
            entries.append(semantic)
    monkeypatch.setattr(stages, "STAGES", tuple(entries))
    monkeypatch.setattr(stages, "BY_NAME", stages._checked(tuple(entries)))

    with DAG("slot_in", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")) as dag:
        stage_tasks(corpus_stages(reports=True))
    assert_chain(dag, ["clean", "dedup", "semantic_dedup", "classify", "decontaminate", "tokenize"])
    assert dag.get_task("semantic_dedup").input_stage == "dedup"
    assert dag.get_task("classify").input_stage == "semantic_dedup"
    assert dag.get_task("quality").upstream_task_ids == {"decontaminate"}
    assert dag.get_task("tokenize").downstream_task_ids == set()
