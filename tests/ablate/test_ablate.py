"""`pretrain ablate` end to end on the seeded constructed corpus (tests/ablate/corpus.py): real Spark stages
in-process, real torchrun trainings of tiny proxies (two side by side), real MLflow (SQLite). One ablation
(3 variants and the A/A control x 2 seeds) is shared by the module's tests; reruns against it check reuse,
resume, re-scoring on a changed reference and the overlap refusal. Whether the verdicts are right is the
calibration's business (benchmarks/ablate.py): here, that they are what the paired test says."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.ablate.heldout import ReferenceOverlapError
from pipeline.ablate.plan import make_plan
from pipeline.ablate.runner import Progress, prepare, run_ablation
from pipeline.ablate.spec import corpus_chain, parse_spec
from pipeline.core.manifest import MANIFEST_NAME, Manifest
from pipeline.core.storage import DatasetRef
from tests.ablate.corpus import PROXY, TOKENS, build
from tests.conftest import make_config
from tests.export.lm_eval_tasks import LOCAL_ITEMS, LOCAL_TASK, write_local_task

pytestmark = pytest.mark.slow
SNAPSHOT = "crawl-1"


SEEDS = [0, 1]
TRAININGS = 4 * len(SEEDS)  # three variants and the A/A control


def spec_for(reference: Path, name: str = "recipe", tasks: Path | None = None, **changes):
    return parse_spec(
        {
            **({"tasks": [LOCAL_TASK], "task_folder": str(tasks)} if tasks else {}),
            "name": name,
            "source": {"snapshot": SNAPSHOT, "stage": "ingest"},
            "base": "none",
            "variants": ["none", "rules", "rules+dedup"],
            "reference": str(reference),
            "tokens": TOKENS,
            "seeds": SEEDS,
            "eval_points": 3,
            "parallel": 2,
            **changes,
        }
    )


@pytest.fixture(scope="module")
def ablation(tmp_path_factory):
    from pipeline.ingest import job as ingest_job

    folder = tmp_path_factory.mktemp("ablate")
    corpus = build(folder / "source", pages=300)
    data = folder / "data"
    overrides = [
        f"project.data_root={data}",
        "spark.master=local[2]",
        "logging.console=false",
        f"ingest.sources=[{corpus.corpus}]",
        *PROXY,
    ]
    config = make_config(data, *overrides)
    ingest_job.run(config, [], DatasetRef.of(config, "ingest", SNAPSHOT))
    spec = spec_for(corpus.reference, tasks=write_local_task(folder / "tasks", random.Random(3)))
    progress = Progress()
    manifest = run_ablation(spec, None, overrides, progress)
    comparison = json.loads((Path(manifest.path) / "comparison.json").read_text())
    return {
        "config": config,
        "overrides": overrides,
        "spec": spec,
        "corpus": corpus,
        "manifest": manifest,
        "progress": progress,
        "comparison": comparison,
    }


def test_variants_differing_only_in_dedup_share_one_clean_output(ablation):
    plan = make_plan(ablation["spec"], None, ablation["overrides"])
    snapshot = {(s.variant, s.stage): s.output.snapshot for s in plan.steps}
    assert snapshot["rules", "clean"] == snapshot["rules+dedup", "clean"]
    assert snapshot["rules", "dedup"] != snapshot["rules+dedup", "dedup"]
    assert snapshot["none", "clean"] != snapshot["rules", "clean"]
    ran = ablation["progress"].stages_run
    # Counted runs: clean ran once per distinct identity (none, rules), every later stage once per variant.
    assert [variant for variant, stage in ran if stage == "clean"] == ["none", "rules"]
    assert [variant for variant, stage in ran if stage == "dedup"] == ["none", "rules", "rules+dedup"]
    # Apart from the source: no variant wrote under the source snapshot's own name.
    config = ablation["config"]
    for stage in ("clean", "dedup", "tokenize"):
        assert not DatasetRef.of(config, stage, SNAPSHOT).path.exists()
        assert all(s.output.snapshot.startswith(f"{SNAPSHOT}.ab-") for s in plan.steps if s.variant == "none")


def test_every_variant_trains_on_the_same_tokens_and_reports_its_epochs(ablation):
    comparison = ablation["comparison"]
    tokens = comparison["tokens"]
    assert tokens >= TOKENS and tokens == comparison["train_steps"] * comparison["tokens_per_step"]
    for name, entry in comparison["variants"].items():
        assert set(entry["tokens_seen"].values()) == {tokens}, name
        tokenize = DatasetRef.of(ablation["config"], "tokenize", entry["snapshot"]).manifest()
        available = tokenize.counters["tokens"]["train"]
        assert entry["train_tokens_available"] == available
        assert entry["epochs"] == pytest.approx(tokens / available)
    variants = comparison["variants"]
    # The filtered variants have fewer tokens, so repeat more: the recipe had to repeat its data.
    assert (
        variants["none"]["documents"] > variants["rules"]["documents"] > variants["rules+dedup"]["documents"]
    )
    assert variants["none"]["epochs"] < 1 < variants["rules+dedup"]["epochs"]


def test_every_verdict_is_the_paired_test_on_the_stored_per_document_losses(ablation):
    """Each arm against the base: the effect, interval and p-value in comparison.json are the paired test
    recomputed here from the kept evaluations (per document and seed), in bits per byte; the verdict is better
    or worse exactly when p < 0.05, on the reference only."""
    import numpy as np

    from pipeline.ablate.plan import work_folder
    from pipeline.ablate.stats import paired_comparison

    comparison = ablation["comparison"]
    folder = work_folder(ablation["config"], ablation["spec"]) / "evaluations"
    kept = {}
    for path in folder.glob("*.json"):
        result = json.loads(path.read_text())
        kept[result["variant"], result["seed"]] = result
    assert len(kept) == TRAININGS
    assert comparison["judged_sets"] == ["reference"] and "base_validation" in comparison["eval_sets"]
    for name, entry in comparison["variants"].items():
        if name == "none":
            assert entry["vs_base"] is None
            continue
        for eval_set, row in entry["vs_base"].items():
            documents = kept["none", 0]["documents"][eval_set]
            nats = {
                arm: np.array(
                    [kept[arm, s]["points"][-1]["losses"][eval_set]["document_nats"] for s in SEEDS]
                )
                for arm in ("none", name)
            }
            again = paired_comparison(nats["none"], nats[name], documents["bytes"], documents["tokens"])
            assert row["effect_bpb"] == pytest.approx(again.effect_bpb)
            assert row["p_value"] == pytest.approx(again.p_value)
            assert row["low_bpb"] <= row["effect_bpb"] <= row["high_bpb"]
            if eval_set == "reference":
                expected = (
                    "within noise"
                    if row["p_value"] >= 0.05
                    else ("better" if row["effect_bpb"] > 0 else "worse")
                )
                assert row["verdict"] == expected
            else:
                assert row["verdict"] == "not judged"
        # Bits per byte beside the loss: the same nats over the documents' bytes.
        final = kept[name, 0]["points"][-1]["losses"]["reference"]
        documents = kept[name, 0]["documents"]["reference"]
        assert final["bpb"] == pytest.approx(
            sum(final["document_nats"]) / np.log(2) / sum(documents["bytes"])
        )
        assert entry["unigram"]["reference"]["loss"] > 0
    control = comparison["variants"]["none.aa"]
    assert control["control"] and control["snapshot"] == comparison["variants"]["none"]["snapshot"]
    assert comparison["noise_check"]["arm"] == "none.aa"
    assert comparison["noise_check"]["held"] == (control["vs_base"]["reference"]["verdict"] == "within noise")
    # Eval loss at several points: one per kept checkpoint, over increasing tokens.
    curve = comparison["variants"]["rules+dedup"]["curves"]["reference"]
    assert len(curve) >= 3 and [p["tokens"] for p in curve] == sorted(p["tokens"] for p in curve)


def test_the_control_trains_the_bases_data_with_the_same_weights_and_another_order(ablation):
    from pipeline.ablate.plan import CONTROL_ORDER_OFFSET, train_output

    plan = make_plan(ablation["spec"], None, ablation["overrides"])
    by_key = {t.key: t for t in plan.trainings}
    for seed in SEEDS:
        base, control = by_key[f"none@{seed}"], by_key[f"none.aa@{seed}"]
        assert control.tokens == base.tokens and control.run_id != base.run_id
        frozen = {
            t.key: json.loads((train_output(plan, t).path / "run.json").read_text()) for t in (base, control)
        }
        assert control.order_seed == seed + CONTROL_ORDER_OFFSET and base.order_seed is None
        first_losses = [
            json.loads((train_output(plan, t).path / "metrics.jsonl").read_text().splitlines()[0])["loss"]
            for t in (base, control)
        ]
        assert first_losses[0] != first_losses[1], frozen  # another data order from the first step


def test_a_changed_reference_scores_every_kept_training_again(ablation, tmp_path):
    """A kept evaluation is reused only for the very sets it was scored on: editing the reference (here:
    dropping its last documents) rescores the trainings instead of mixing old and new losses in one table;
    the original reference again gives back the original scores."""
    from pipeline.ablate.heldout import read_reference
    from pipeline.ablate.runner import evaluation_path, train_and_evaluate

    spec, overrides = ablation["spec"], ablation["overrides"]
    plan = make_plan(spec, None, overrides)
    training = plan.trainings[0]
    path = evaluation_path(ablation["config"], plan, training)
    before = json.loads(path.read_text())
    shorter = tmp_path / "shorter.jsonl"
    lines = ablation["corpus"].reference.read_text().splitlines()
    shorter.write_text("\n".join(lines[:-10]) + "\n")
    changed = spec_for(shorter)
    prepare(changed, None, overrides)
    rescored = train_and_evaluate(make_plan(changed, None, overrides), training, None, overrides)
    assert (
        rescored["documents"]["reference"]["documents"]
        == len(read_reference(shorter, 200))
        == len(lines) - 10
    )
    assert (
        rescored["evaluation"] != before["evaluation"] and rescored["train_digest"] == before["train_digest"]
    )
    prepare(spec, None, overrides)
    again = train_and_evaluate(plan, training, None, overrides)
    assert again["evaluation"] == before["evaluation"]
    assert again["points"][-1]["losses"] == before["points"][-1]["losses"]


def test_every_checkpoint_is_scored_on_the_continuation_task_and_the_local_lm_eval_task(ablation):
    from pipeline.ablate.heldout import CHOICES, read_reference
    from pipeline.evaluate.harness import TASK, continuation_items

    spec, comparison = ablation["spec"], ablation["comparison"]
    items = continuation_items(read_reference(spec.reference, spec.max_eval_documents), CHOICES)
    assert len(items) >= 20 and TASK in comparison["tasks"]
    for name, entry in comparison["variants"].items():
        assert 0 <= entry["accuracy"][TASK]["mean"] <= 1 and entry["accuracy"][TASK]["spread"] >= 0, name
        curve = entry["curves"][f"{TASK} accuracy"]
        assert [p["tokens"] for p in curve] == [p["tokens"] for p in entry["curves"]["reference"]]
    from pipeline.ablate.plan import work_folder

    evaluations = sorted((work_folder(ablation["config"], spec) / "evaluations").glob("*.json"))
    assert len(evaluations) == TRAININGS
    for path in evaluations:
        for point in json.loads(path.read_text())["points"]:
            scored = point["accuracy"][TASK]
            assert scored["items"] == len(items) and scored["choices"] == CHOICES
            for value in (scored["acc"], scored["acc_norm"]):  # a share of the items
                assert abs(value * len(items) - round(value * len(items))) < 1e-9
            local = point["accuracy"][LOCAL_TASK]  # the spec's local lm-eval task, scored the same way
            assert local["items"] == LOCAL_ITEMS and 0 <= local["acc"] <= 1
    assert LOCAL_TASK in comparison["tasks"] and "lm-eval" in comparison["tasks"][LOCAL_TASK]


def test_a_rerun_runs_only_the_training_that_did_not_finish(ablation):
    """As a killed ablation leaves it: one training never published its output (a training publishes its
    folder only when it finishes) and was not evaluated. The rerun runs that training alone, and no stage."""
    import shutil

    from pipeline.ablate.runner import evaluation_path

    config = ablation["config"]
    plan = make_plan(ablation["spec"], None, ablation["overrides"])
    unfinished = plan.trainings[-1]
    shutil.rmtree(DatasetRef.of(config, "train", unfinished.snapshot, unfinished.run_id).path)
    evaluation_path(config, plan, unfinished).unlink()
    progress = Progress()
    run_ablation(ablation["spec"], None, ablation["overrides"], progress)
    assert progress.stages_run == [] and progress.trainings_run == [unfinished.key]
    assert sorted(progress.trainings_skipped) == sorted(t.key for t in plan.trainings[:-1])
    assert {step.action for step in plan.steps} == {"reuse", "shared"}


def test_a_mixture_source_trains_each_variant_on_the_weighted_mixture_of_its_own_outputs(ablation, tmp_path):
    """A mixture of the module's snapshot (weight 3) and a second corpus's small snapshot (weight 1): every
    part goes through each variant's stages in its own corpus (the first part's outputs, made by the module's
    ablation, are reused), and each variant trains on both of its token outputs with those weights."""
    from pipeline.ablate.plan import train_output
    from pipeline.ingest import job as ingest_job

    config, overrides = ablation["config"], ablation["overrides"]
    home = config.project.corpus
    pages = ablation["corpus"].corpus.read_text().splitlines()[::7]  # a sample of every kind of page
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "pages.jsonl").write_text("\n".join(pages) + "\n")
    sources = f"ingest.sources=[{tmp_path / 'extra'}]"
    extra = make_config(config.project.data_root, *overrides, "project.corpus=extra", sources)
    ingest_job.run(extra, [], DatasetRef.of(extra, "ingest", "e1"))
    spec = parse_spec(
        {
            "name": "mix",
            "source": {
                "mixture": [{"corpus": home, "snapshots": [SNAPSHOT], "weight": 3}, {"corpus": "extra"}]
            },
            "variants": ["rules", "rules+dedup"],
            "seeds": [0, 1],
            "control": False,
            "reference": str(ablation["corpus"].reference),
            "tokens": TOKENS // 5,
            "eval_points": 2,
            "tokenizer": ablation["comparison"]["tokenizer"],
        }
    )
    progress = Progress()
    manifest = run_ablation(spec, None, overrides, progress)
    plan = make_plan(spec, None, overrides)

    # Only the new corpus's part ran: clean once (shared by the two variants), every later stage per variant.
    assert sorted(progress.stages_run) == sorted(
        [("rules", "clean")] + [(v, s) for v in ("rules", "rules+dedup") for s in corpus_chain()[1:]]
    )
    assert {s.output.corpus for s in plan.steps if s.action == "run"} <= {"extra"}
    comparison = json.loads((Path(manifest.path) / "comparison.json").read_text())
    assert comparison["source"]["kind"] == "mixture" and "extra:all (0.25)" in comparison["source_described"]
    assert {f"base_validation.{home}", "reference"} <= set(comparison["eval_sets"])
    for training in plan.trainings:
        trained = train_output(plan, training).manifest()
        read = {entry["path"] for entry in trained.inputs}
        assert read == {str(ref.path) for ref in plan.final_tokens(training.variant)}
        assert {ref.corpus for ref in training.tokens} == {home, "extra"}
        assert int(trained.counters["tokens_seen"]) == plan.tokens
        entry = comparison["variants"][training.variant]
        assert entry["train_tokens_available"] == sum(
            int(ref.manifest().counters["tokens"]["train"]) for ref in training.tokens
        )


def test_the_ablate_dag_runs_the_same_ablation_through_airflow(ablation, airflow_db):
    """The `ablate` DAG through Airflow's dag.test() with the form's values of the module's ablation:
    prepare, the six mapped trainings and compare run as Airflow tasks. Everything was made already, so no
    training or evaluation runs again (their outputs and files are untouched) and compare publishes the same
    verdicts."""
    from airflow.dag_processing.dagbag import DagBag

    from pipeline.ablate.plan import train_output, work_folder
    from tests.dags.test_dagbag import DAGS_FOLDER

    spec, overrides = ablation["spec"], ablation["overrides"]
    plan = make_plan(spec, None, overrides)
    trained = {t.key: train_output(plan, t).manifest().digest for t in plan.trainings}
    evaluations = {
        p: p.stat().st_mtime_ns for p in (work_folder(ablation["config"], spec) / "evaluations").glob("*")
    }
    dag = DagBag(str(DAGS_FOLDER / "ablate.py")).dags["ablate"]
    run = dag.test(
        run_conf={
            "snapshot": SNAPSHOT,
            "name": spec.name,
            "variants": {variant.name: "preset" for variant in spec.variants},
            "seeds": list(spec.seeds),
            "tokens": spec.tokens,
            "eval_points": spec.eval_points,
            "reference": str(spec.reference),
            "tasks": list(spec.tasks),
            "task_folder": str(spec.task_folder),
            "overrides": overrides,
        }
    )
    assert run.state == "success"
    instances = run.get_task_instances()
    mapped = [ti for ti in instances if ti.task_id == "train_variant"]
    assert len(mapped) == len(plan.trainings) == TRAININGS and {ti.state for ti in instances} == {"success"}
    assert {t.key: train_output(plan, t).manifest().digest for t in plan.trainings} == trained
    assert {p: p.stat().st_mtime_ns for p in evaluations} == evaluations
    published = json.loads((Path(ablation["manifest"].path) / "comparison.json").read_text())
    assert published["variants"].keys() == ablation["comparison"]["variants"].keys()
    assert published["tokens"] == ablation["comparison"]["tokens"]
    assert (
        ablation["manifest"].extra["verdicts"]
        == Manifest.read(Path(ablation["manifest"].path) / MANIFEST_NAME).extra["verdicts"]
    )


def test_a_reference_that_overlaps_training_data_is_refused_naming_both(ablation, tmp_path):
    rows = [json.loads(line) for line in ablation["corpus"].corpus.read_text().splitlines()]
    leaked = next(row for row in rows if row["kind"] == "clean")
    reference = tmp_path / "leaky.jsonl"
    original = ablation["corpus"].reference.read_text()
    reference.write_text(original + json.dumps({"text": leaked["text"]}) + "\n")
    with pytest.raises(ReferenceOverlapError) as refused:
        prepare(spec_for(reference, name="leaky"), None, ablation["overrides"])
    message = str(refused.value)
    index = len(original.splitlines())
    assert f"reference document {index}" in message and str(reference) in message
    assert "variant none" in message and leaked["url"] in message


def test_dry_run_prints_the_plan(ablation, capsys):
    from pipeline.ablate.__main__ import main

    corpus = ablation["corpus"]
    args = ["--snapshot", SNAPSHOT, "--name", "recipe", "--reference", str(corpus.reference)]
    args += ["--tokens", str(TOKENS), "--eval-points", "3", "--base", "none", "--seeds", "0,1"]
    args += ["--variant", "none", "--variant", "rules", "--variant", "rules+dedup"]
    args += [arg for override in ablation["overrides"] for arg in ("--set", override)]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "0 to run" in out and f"trainings: {TRAININGS}" in out
    assert out.count("(done)") == TRAININGS


def test_mlflow_has_a_parent_run_with_a_child_per_variant_and_seed(ablation):
    from pipeline.tracking.mlflow_runs import mlflow_client

    client = mlflow_client(ablation["config"])
    parent = ablation["manifest"].extra["mlflow_run_id"]
    assert parent
    children = client.search_runs(
        [client.get_run(parent).info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
    )
    assert sorted((c.data.params["variant"], c.data.params["seed"]) for c in children) == [
        (variant, str(seed)) for variant in ("none", "none.aa", "rules", "rules+dedup") for seed in SEEDS
    ]
    history = client.get_metric_history(children[0].info.run_id, "eval_loss_reference")
    assert len(history) >= 3
    accuracy = client.get_metric_history(children[0].info.run_id, "eval_acc_pretrain_heldout_continuation")
    assert [m.step for m in accuracy] == [m.step for m in history]


def test_the_report_opens_in_a_browser_with_every_plot_loaded(ablation):
    from scripts.fetch_chromium import ChromiumUnavailable, environment, fetch
    from tests.headless_chromium import HeadlessChromium

    try:
        chromium = fetch()
    except ChromiumUnavailable as error:
        pytest.skip(f"no headless Chromium: {error}")
    report = Path(ablation["manifest"].path) / "report.html"
    with HeadlessChromium(chromium, environment(chromium)) as browser:
        page = browser.open(report.as_uri())
        images = page.evaluate(
            "[...document.images].map(i => ({alt: i.alt, complete: i.complete, width: i.naturalWidth}))"
        )
        headings = page.evaluate("[...document.querySelectorAll('h1, h2')].map(h => h.innerText)")
        text = page.evaluate("document.body.innerText")
    assert len(images) == report.read_text().count("<img") == 2
    assert all(image["complete"] and image["width"] > 0 for image in images), images
    assert headings[0] == "Ablation: recipe" and {"Comparison", "Curves", "Variants"} <= set(headings)
    assert "Documents that moved most" in headings
    assert "rules+dedup" in text and "A/A control" in text and "p = " in text and "bpb" in text
