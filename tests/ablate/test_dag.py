"""The ablate DAG: prepare, then one mapped training per variant and seed, then compare; its form builds a
valid ablation spec."""

from __future__ import annotations

import pytest

from tests.dags.test_dagbag import DAGS_FOLDER


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS_FOLDER / "ablate.py"))
    assert bag.import_errors == {}
    return bag.dags["ablate"]


def test_trainings_are_mapped_between_prepare_and_compare(dag):
    assert set(dag.task_ids) == {"prepare", "train_variant", "compare"}
    train = dag.get_task("train_variant")
    assert getattr(train, "is_mapped", False) or "Mapped" in type(train).__name__, type(train)
    assert (
        "prepare" in train.upstream_task_ids and "train_variant" in dag.get_task("compare").upstream_task_ids
    )


def test_the_form_makes_a_spec(dag):
    from operators.ablate import spec_of

    params = {name: dag.params[name] for name in dag.params}
    spec = spec_of({**params, "source": "2026-11-29", "reference": "/data/ref.jsonl"})
    assert [v.name for v in spec.variants] == ["none", "rules", "rules+dedup"]
    assert spec.source.snapshot == "2026-11-29" and spec.source.stage == "ingest"
    assert spec.seeds == (0, 1, 2) and spec.control and spec.base == "none" and spec.tasks == ()
    with_tasks = spec_of(
        {**params, "source": "s", "reference": "/r.jsonl", "tasks": ["mine"], "task_folder": "/t"}
    )
    assert with_tasks.tasks == ("mine",) and str(with_tasks.task_folder) == "/t"


def test_a_mixture_in_the_form_is_the_source(dag):
    from operators.ablate import spec_of

    params = {name: dag.params[name] for name in dag.params}
    mixture = [{"corpus": "web", "snapshots": "last:2", "weight": 3}, {"corpus": "books"}]
    spec = spec_of({**params, "source": "ignored", "reference": "/r.jsonl", "mixture": mixture})
    assert spec.source.kind == "mixture" and spec.source.stage == "ingest"
    assert [(s.corpus, s.weight) for s in spec.source.mixture] == [("web", 3.0), ("books", 1.0)]


def test_every_form_field_is_a_spec_key_or_the_runs_own(dag):
    """The form's fields are the spec's keys (under the form's names) plus the run's own (config, overrides,
    source stage, mixture); a spec key the form lacks is one only a spec file or the CLI sets."""
    from pipeline.ablate.spec import SPEC_KEYS

    form = set(dag.params)
    spec_fields = form & set(SPEC_KEYS)
    assert spec_fields == set(SPEC_KEYS) - {"source", "max_eval_documents", "parallel"}
    assert {"snapshot", "mixture", "source_stage"} <= form
    assert dag.params["control"] is True and dag.params["seeds"] == [0, 1, 2]
