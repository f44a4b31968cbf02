"""Benchmark issue 42: is `pretrain ablate` an instrument whose verdicts can be trusted?

Three checks, each through the real pipeline (ingest and the corpus stages in Spark ``local[2]``, the shared
tokenizer, torchrun trainings of the default proxy ``pipeline.ablate.spec.PROXY``, per-document evaluation,
the paired test of ``pipeline.ablate.stats``):

1. **Calibration on a known-quality ladder** (``tests.ablate.corpus.ladder``): the same page slots with 0%,
   25%, 50% and 75% of the prose replaced by junk, trained at equal tokens. The instrument is right when the
   rungs come out in that order on the held-out reference with every adjacent pair at p < 0.05.
2. **The recipe at several corpus sizes** (``tests.ablate.corpus.build``, at least 4x apart, the budget about
   one epoch of what the recipe keeps): ``rules+dedup`` against ``none``, effect in bits per byte with its
   interval and p-value at each size; in the full run also ``rules+dedup+classifier`` (the recipe plus a
   fastText quality classifier trained by the train_classifier stage on pool prose against generated junk),
   judged against ``rules+dedup`` by the same paired test, with the data's reasons where it does not win.
   With the classifier the corpus also holds word salad (shuffled prose: junk the rules keep), for it to find.
3. **A/A controls**: the base trained again with each seed's initial weights and another data order. In the
   full run a pool of 8 seeds x 2 orders of the smallest size's base gives the repetitions (every 3-seed subset
   of the pool is one A/A comparison, the two arms disjoint trainings); the false-finding rate is the share
   called better or worse at p < 0.05.

``--old-proxy`` runs the ladder with the proxy the project used before (tied embeddings, lr 5e-3, a 10% floor)
beside the default, so the decision accuracy of both is in one run.

    .venv/bin/python benchmarks/ablate.py --quick    # ladder 0%/50%, the recipe at one size: < 10 min
    .venv/bin/python benchmarks/ablate.py            # the whole ladder, three sizes, A/A pool, classifier
    .venv/bin/python benchmarks/ablate.py --checks recipe    # the three sizes only (no A/A controls)
    .venv/bin/python benchmarks/ablate.py --smoke    # ladder 0%/50% and the recipe, tiny: a test runs it

``--smoke`` (tests/benchmarks/test_smoke.py) is the same code path on the smallest input: the ladder's two
rungs and the recipe at 40 pages, two seeds (the fewest the paired test takes), no A/A control or classifier
unless asked, 2,048 tokens (4 steps, 2 checkpoints scored) per training; its figures mean nothing. What a run
costs is its processes and Spark jobs, not its tokens: every variant's corpus stages (a chain of small Spark
jobs each; with ``SPARK_REMOTE`` set they attach to a warm Spark Connect server instead of starting a JVM)
and every training (a torchrun process: 8 in all). So a smoke run starts a check's 4 trainings side by side
(``--parallel 4``) and leaves out their MLflow runs and TensorBoard events (``tracking.stage_runs=false``,
``tracking.tensorboard=false``), records it never reads; the comparison is still recorded in MLflow.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]: the repository root replaces it, for the corpus builders in
# tests/ablate/corpus.py (not installed).
sys.path[0] = str(ROOT)

from benchmarks.smoke import add_smoke_flag  # noqa: E402

REFERENCE_DOCUMENTS = 120  # held-out documents: more of them shrink the document share of the noise
SMOKE_REFERENCE_DOCUMENTS = 20
SMOKE_TOKENS = 2_048
SMOKE_PARALLEL = 4  # every training of a check side by side: each is mostly its processes' start
# What a smoke run's trainings leave out: their MLflow runs and TensorBoard events (and so the sample
# generations), records no smoke figure reads; tests/train and tests/tracking cover them. The comparison
# is still recorded in MLflow (pipeline.ablate.compare.track).
SMOKE_OVERRIDES = ["tracking.stage_runs=false", "tracking.tensorboard=false"]
CLASSIFIER = "rules+dedup+classifier"
CLASSIFIER_MODEL = "quality"  # the train_classifier snapshot the variant scores with
CALIBRATION_KEEP = 0.95  # the classifier's threshold keeps this share of unseen prose
CALIBRATION_DOCUMENTS = 300
CALIBRATION_SEED = 99
OLD_PROXY = [
    "model.preset=tiny",
    "train.nproc_per_node=1",
    "train.batch_size=8",
    "train.seq_len=64",
    "train.lr=5e-3",
    "train.warmup_steps=2",
    "train.min_lr_ratio=0.1",
]


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def ingest(folder: Path, source: Path, snapshot: str, common: list[str]) -> None:
    from pipeline.config import load_config
    from pipeline.core.storage import DatasetRef
    from pipeline.ingest import job as ingest_job

    config = load_config(None, [*common, f"ingest.sources=[{source}]"])
    ref = DatasetRef.of(config, "ingest", snapshot)
    if not ref.is_complete():
        ingest_job.run(config, [], ref)


def evaluations(spec, common: list[str]) -> dict[str, dict[int, dict[str, Any]]]:
    """Every training's kept evaluation, by arm and seed (the runner wrote them)."""
    from pipeline.ablate.plan import make_plan
    from pipeline.ablate.runner import evaluation_path
    from pipeline.config import load_config

    plan = make_plan(spec, None, common)
    config = load_config(None, common)
    found: dict[str, dict[int, dict[str, Any]]] = {}
    for training in plan.trainings:
        found.setdefault(training.variant, {})[training.seed] = json.loads(
            evaluation_path(config, plan, training).read_text()
        )
    return found


def run(spec_data: dict[str, Any], common: list[str]) -> tuple[Any, dict[str, Any]]:
    from pipeline.ablate.runner import run_ablation
    from pipeline.ablate.spec import parse_spec

    spec = parse_spec(spec_data)
    manifest = run_ablation(spec, None, common)
    return spec, json.loads((Path(manifest.path) / "comparison.json").read_text())


def ladder_check(
    folder: Path,
    common: list[str],
    rungs: list[str],
    seeds: list[int],
    tokens: int,
    slots: int,
    proxy: list[str] | None,
    name: str,
    parallel: int,
    reference_documents: int = REFERENCE_DOCUMENTS,
) -> dict[str, Any]:
    from pipeline.ablate.compare import REFERENCE, paired
    from tests.ablate.corpus import ladder, rung_overrides

    built = ladder(folder / "ladder-source", slots=slots, reference_documents=reference_documents)
    ingest(folder, built.corpus, "ladder", common)
    spec_data: dict[str, Any] = {
        "name": name,
        "source": {"snapshot": "ladder"},
        "variants": {rung: rung_overrides(built.blocklists[rung]) for rung in rungs},
        "base": rungs[0],
        "reference": str(built.reference),
        "tokens": tokens,
        "seeds": seeds,
        "control": False,
        "eval_points": 2,
        "parallel": parallel,
        "tokenizer": None,
    }
    if proxy is not None:
        spec_data["proxy"] = proxy
    spec, comparison = run(spec_data, common)
    found = evaluations(spec, common)
    documents = found[rungs[0]][seeds[0]]["documents"][REFERENCE]
    steps = []
    for better, worse in itertools.pairwise(rungs):
        tested = paired(found[worse], found[better], REFERENCE, documents)
        assert tested is not None
        steps.append({"from": worse, "to": better, **tested.to_dict()})
    losses = {rung: comparison["variants"][rung]["eval"][REFERENCE]["bpb"]["mean"] for rung in rungs}
    order_correct = all(step["verdict"] == "better" for step in steps)
    for step in steps:
        say(
            f"ladder ({name}) {step['to']} vs {step['from']}: {step['effect_bpb']:+.4f} bpb "
            f"[{step['low_bpb']:+.4f}, {step['high_bpb']:+.4f}] p={step['p_value']:.3g} {step['verdict']}"
        )
    return {
        "rungs": rungs,
        "reference_bpb": losses,
        "steps": steps,
        "order_correct": order_correct,
        "p_value_max": max(step["p_value"] for step in steps),
        "smallest_step_resolved": min(
            (
                int(step["from"].removeprefix("junk")) - int(step["to"].removeprefix("junk"))
                for step in steps
                if step["verdict"] == "better"
            ),
            default=None,
        ),
        "documents": {rung: comparison["variants"][rung]["documents"] for rung in rungs},
        "epochs": {rung: comparison["variants"][rung]["epochs"] for rung in rungs},
        "report": str(Path(comparison_path(common, name)) / "report.html"),
    }


def comparison_path(common: list[str], name: str) -> str:
    from pipeline.ablate.plan import ABLATE_FOLDER
    from pipeline.config import load_config

    config = load_config(None, common)
    return str(Path(config.project.data_root) / config.project.corpus / ABLATE_FOLDER / name)


def train_quality_classifier(folder: Path, common: list[str]) -> tuple[list[str], dict[str, Any]]:
    """A fastText quality classifier through the train_classifier stage, on pool prose (never the reference)
    against generated junk (``tests.ablate.corpus.classifier_examples``); every size's corpus draws from that
    pool. Its threshold is calibrated as a user without labels for the corpus would: the score that keeps
    ``CALIBRATION_KEEP`` of prose the classifier was not trained on. Returns the variant's overrides (the
    recipe plus the classifier at that threshold) and its held-out metrics with the threshold."""
    import random

    import numpy as np

    from pipeline.classify.config import ScoringModel
    from pipeline.classify.models import resolve, score_texts
    from pipeline.classify.training import job as training_job
    from pipeline.config import load_config
    from pipeline.core.storage import DatasetRef
    from tests.ablate.corpus import classifier_examples, split_reference

    positives, negatives = classifier_examples(folder / "classifier", reference_documents=REFERENCE_DOCUMENTS)
    config = load_config(
        None,
        [
            *common,
            f"classifier_training.positives=[{{path: '{positives}'}}]",
            f"classifier_training.negatives=[{{path: '{negatives}'}}]",
            "classifier_training.fasttext.bucket=200000",  # 80 MB instead of DCLM's 800 MB of bigram buckets
            # At fastText's 5 epochs on 1,200 short examples its bigrams had not learned word order: word
            # salad scored like prose (ROC AUC 0.62 between the two on a 2,400-page corpus); at 25, 0.998.
            "classifier_training.fasttext.epoch=25",
        ],
    )
    ref = DatasetRef.of(config, "train_classifier", CLASSIFIER_MODEL)
    if not ref.is_complete():
        training_job.run(config, [], ref)
    metrics = dict(ref.manifest().extra["metrics"])
    trained = {json.loads(line)["text"] for line in positives.read_text(encoding="utf-8").splitlines()}
    _, pool = split_reference(random.Random(7), REFERENCE_DOCUMENTS)  # the pool classifier_examples drew from
    unseen = [text for text in pool if text not in trained]
    calibration = random.Random(CALIBRATION_SEED).sample(unseen, min(CALIBRATION_DOCUMENTS, len(unseen)))
    model = resolve(ScoringModel(name="quality", trained=CLASSIFIER_MODEL), config)
    scores = np.array(score_texts(model, calibration))
    threshold = round(float(np.quantile(scores, 1 - CALIBRATION_KEEP)), 4)
    metrics.update(
        threshold=threshold, calibration_documents=len(calibration), calibration_keep=CALIBRATION_KEEP
    )
    say(
        f"quality classifier: held-out ROC AUC {metrics.get('roc_auc')}, precision {metrics.get('precision')}; "
        f"threshold {threshold} keeps {CALIBRATION_KEEP:.0%} of {len(calibration)} unseen prose extracts"
    )
    overrides = [f"classify.models=[{{name: quality, trained: {CLASSIFIER_MODEL}, threshold: {threshold}}}]"]
    return overrides, metrics


def recipe_check(
    folder: Path,
    common: list[str],
    pages: int,
    seeds: list[int],
    tokens_per_page: int,
    parallel: int,
    classifier: list[str] | None,
    control: bool,
    reference_documents: int = REFERENCE_DOCUMENTS,
) -> dict[str, Any]:
    from pipeline.ablate.compare import REFERENCE, diagnosis, paired
    from tests.ablate.corpus import build

    # With a classifier variant, word salad among the junk: what the rules keep, so the classifier has
    # something left to find (and rules+dedup has that much junk left against none).
    salad = classifier is not None
    name = f"recipe-{pages}" + ("-salad" if salad else "")
    built = build(folder / name, pages=pages, reference_documents=reference_documents, salad=salad)
    snapshot = name
    ingest(folder, built.corpus, snapshot, common)
    spec, comparison = run(
        {
            "name": name,
            "source": {"snapshot": snapshot},
            "variants": {
                "none": "preset",
                "rules+dedup": "preset",
                **({CLASSIFIER: classifier} if classifier is not None else {}),
            },
            "base": "none",
            "reference": str(built.reference),
            "tokens": tokens_per_page * pages,
            "seeds": seeds,
            "control": control,
            "eval_points": 2,
            "parallel": parallel,
        },
        common,
    )
    recipe = comparison["variants"]["rules+dedup"]
    row = recipe["vs_base"]["reference"]
    say(
        f"recipe at {pages} pages: {row['effect_bpb']:+.4f} bpb [{row['low_bpb']:+.4f}, {row['high_bpb']:+.4f}] "
        f"p={row['p_value']:.3g} {row['verdict']}; A/A {comparison['noise_check']}"
    )
    against_recipe = None
    if classifier is not None:
        # Judged against the recipe, not the base: the same documents and seeds, so the same paired test.
        found = evaluations(spec, common)
        documents = found["none"][seeds[0]]["documents"][REFERENCE]
        tested = paired(found["rules+dedup"], found[CLASSIFIER], REFERENCE, documents)
        assert tested is not None
        variants = comparison["variants"]
        against_recipe = {
            **tested.to_dict(),
            "why": []
            if tested.verdict == "better"
            else diagnosis(variants[CLASSIFIER], variants["rules+dedup"], REFERENCE),
        }
        say(
            f"classifier vs rules+dedup at {pages} pages: {tested.effect_bpb:+.4f} bpb "
            f"[{tested.low_bpb:+.4f}, {tested.high_bpb:+.4f}] p={tested.p_value:.3g} {tested.verdict}"
        )
    return {
        "pages": pages,
        "word_salad": salad,
        "tokens": comparison["tokens"],
        "vs_none": row,
        "classifier_vs_recipe": against_recipe,
        "epochs": {name: entry["epochs"] for name, entry in comparison["variants"].items()},
        "documents": {name: entry["documents"] for name, entry in comparison["variants"].items()},
        "unigram_bpb": {
            name: entry["unigram"]["reference"]["bpb"] for name, entry in comparison["variants"].items()
        },
        "diagnosis": recipe["diagnosis"],
        "aa": comparison["noise_check"],
        "spec": spec,
    }


def aa_pool(spec, common: list[str], repetitions: int, seed_count: int) -> dict[str, Any]:
    """A/A repetitions from one pool: the base and its control over ``spec``'s seeds; each repetition takes a
    3-seed subset (base arm: those seeds' trainings; control arm: the same seeds' other data order)."""
    from pipeline.ablate.compare import REFERENCE, paired

    found = evaluations(spec, common)
    base, control = found[spec.base], found[spec.control_name]
    documents = base[spec.seeds[0]]["documents"][REFERENCE]
    subsets = list(itertools.combinations(sorted(base), seed_count))
    random.Random(0).shuffle(subsets)
    calls = []
    for subset in subsets[:repetitions]:
        tested = paired({s: base[s] for s in subset}, {s: control[s] for s in subset}, REFERENCE, documents)
        assert tested is not None
        calls.append({"seeds": list(subset), "p_value": tested.p_value, "verdict": tested.verdict})
    false = sum(call["verdict"] != "within noise" for call in calls)
    return {
        "repetitions": len(calls),
        "false_findings": false,
        "rate": false / len(calls) if calls else None,
        "pool_trainings": 2 * len(base),
        "calls": calls,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="ladder 0%%/50%%, the recipe at one size, under 10 min"
    )
    add_smoke_flag(parser)
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary folder)")
    parser.add_argument(
        "--parallel",
        type=int,
        default=None,
        help=f"trainings side by side (default 2; --smoke: {SMOKE_PARALLEL})",
    )
    parser.add_argument("--old-proxy", action="store_true", help="also run the ladder with the old proxy")
    parser.add_argument(
        "--checks",
        default=None,
        help="which checks, comma-separated (default all; --smoke: ladder,recipe); without aa the recipe "
        "trains no A/A control",
    )
    parser.add_argument(
        "--classifier",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a learned-classifier variant in the recipe check, judged against rules+dedup "
        "(default: in the full run, not in --quick)",
    )
    args = parser.parse_args()
    checks = set((args.checks or ("ladder,recipe" if args.smoke else "ladder,recipe,aa")).split(","))
    if not checks <= {"ladder", "recipe", "aa"}:
        parser.error(f"--checks: ladder, recipe and aa only, not {sorted(checks)}")
    with_classifier = (not (args.quick or args.smoke)) if args.classifier is None else args.classifier
    if args.parallel is None:
        args.parallel = SMOKE_PARALLEL if args.smoke else 2

    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-ablate-"))
    common = [
        f"project.data_root={folder / 'data'}",
        "spark.master=local[2]",
        "logging.console=false",
        *__import__("tests.ablate.corpus", fromlist=["PROXY"]).PROXY,
    ]
    started = time.monotonic()
    seeds = [0, 1, 2]
    tokens_per_page = 150  # about one epoch of what rules+dedup keeps of the constructed corpus
    reference_documents = REFERENCE_DOCUMENTS
    if args.smoke:
        # 2 rungs and 2 seeds: the fewest the pairwise steps and the paired test take; 4 training steps of
        # 512 tokens (2,048 tokens; 51 per page at 40 pages), so the 2 eval points are 2 checkpoints.
        rungs, sizes, slots, ladder_tokens = ["junk0", "junk50"], [40], 40, SMOKE_TOKENS
        seeds, tokens_per_page, reference_documents = [0, 1], SMOKE_TOKENS // 40, SMOKE_REFERENCE_DOCUMENTS
        common += SMOKE_OVERRIDES
    elif args.quick:
        rungs, sizes, slots, ladder_tokens = ["junk0", "junk50"], [600], 320, 160_000
    else:
        rungs, sizes, slots, ladder_tokens = (
            ["junk0", "junk25", "junk50", "junk75"],
            [600, 2400, 9600],
            800,
            240_000,
        )
    result: dict[str, Any] = {"quick": args.quick, "smoke": args.smoke, "checks": sorted(checks)}
    ladder: dict[str, Any] = {}
    if "ladder" in checks:
        ladder = ladder_check(
            folder,
            common,
            rungs,
            seeds,
            ladder_tokens,
            slots,
            None,
            "ladder",
            args.parallel,
            reference_documents,
        )
        result["ladder"] = ladder
    if args.old_proxy and "ladder" in checks:
        result["ladder_old_proxy"] = ladder_check(
            folder,
            common,
            rungs,
            seeds,
            ladder_tokens,
            slots,
            OLD_PROXY,
            "ladder-old",
            args.parallel,
            reference_documents,
        )
    classifier = None
    if with_classifier and "recipe" in checks:
        classifier, result["classifier_metrics"] = train_quality_classifier(folder, common)
    recipes = [
        recipe_check(
            folder,
            common,
            pages,
            seeds,
            tokens_per_page,
            args.parallel,
            classifier,
            "aa" in checks,
            reference_documents,
        )
        for pages in sizes
        if "recipe" in checks
    ]
    aa = {
        "repetitions": sum(r["aa"] is not None for r in recipes),
        "false_findings": sum(r["aa"] is not None and not r["aa"]["held"] for r in recipes),
    }
    if not args.quick and "aa" in checks and recipes:
        pool_spec = recipes[0]["spec"]
        pooled, _ = run(
            {
                **pool_spec.to_dict(),
                "name": "aa-pool",
                "seeds": list(range(8)),
                "reference": str(pool_spec.reference),
            },
            common,
        )
        aa = aa_pool(pooled, common, 20, 3)
    result["aa"] = aa
    result["recipes"] = [{k: v for k, v in r.items() if k != "spec"} for r in recipes]
    wall = time.monotonic() - started
    print(json.dumps(result, indent=1, default=str), file=sys.stderr)
    print(
        json.dumps(
            {
                "ladder_order_correct": ladder.get("order_correct"),
                "ladder_p_value_max": ladder.get("p_value_max"),
                "ladder_smallest_step_resolved_pct": ladder.get("smallest_step_resolved"),
                "old_proxy_ladder_order_correct": result.get("ladder_old_proxy", {}).get("order_correct"),
                "recipe_p_value_max": max((r["vs_none"]["p_value"] for r in recipes), default=None),
                "recipe_margin_bpb_min": min((r["vs_none"]["effect_bpb"] for r in recipes), default=None),
                "recipe_wins_everywhere": all(r["vs_none"]["verdict"] == "better" for r in recipes)
                if recipes
                else None,
                "classifier_vs_recipe": [
                    {
                        "pages": r["pages"],
                        **{
                            key: r["classifier_vs_recipe"][key]
                            for key in ("effect_bpb", "low_bpb", "high_bpb", "p_value", "verdict")
                        },
                    }
                    for r in recipes
                    if r["classifier_vs_recipe"] is not None
                ],
                "aa_false_finding_rate": aa["false_findings"] / aa["repetitions"]
                if aa["repetitions"]
                else None,
                "aa_repetitions": aa["repetitions"],
                "sizes": sizes,
                "seeds": len(seeds),
                "wall_s": round(wall, 1),
                "quick": args.quick,
                "smoke": args.smoke,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
