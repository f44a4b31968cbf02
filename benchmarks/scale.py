"""How each corpus stage's cost grows with the corpus: ingest -> clean -> dedup -> classify -> decontaminate ->
tokenize on generated corpora of 10,000, 100,000 and 1,000,000 documents, on ``local[2]``.

    .venv/bin/python benchmarks/scale.py --quick                 # 10k and 100k
    .venv/bin/python benchmarks/scale.py                         # 10k, 100k and 1M
    .venv/bin/python benchmarks/scale.py --sizes 2000,20000      # any sizes (the last two give the exponents)
    .venv/bin/python benchmarks/scale.py --quick --cluster       # also the 100k run on a standalone cluster
    .venv/bin/python benchmarks/scale.py --smoke                 # 60 documents in a temporary folder

``--smoke`` (tests/benchmarks/test_smoke.py) is the same code path on the smallest input: one size of 60
documents (its exponents are null and its growths 1: a slope needs two sizes), fewer classifier examples and
a smaller model, no stage's MLflow run (``tracking.stage_runs=false``), its corpora, plot and figures in a
temporary folder (never ``docs/img`` or ``scale_figures.json``); its figures mean nothing. What a run costs
is its processes, not its documents: 8 at one size (six stages, the classifier, the tokenizer), 14 at two (a
draft with two sizes took 7.7 minutes at load 10). With ``SPARK_REMOTE`` set to a warm Spark Connect server each stage attaches instead of starting
a JVM, and then the event-log figures (shuffle, JVM heap) are 0, since the server's JVM keeps its own log.

Each stage runs as its own process (``pretrain <stage>``), as Airflow runs it, with Spark's event log on.
Recorded per stage and size: wall time; CPU seconds of the whole process tree (driver, JVM, Python workers),
which unlike wall time hardly depend on what else the machine runs; the peak resident memory of the Python
driver, of the JVM (driver and, in local mode, executor) and of any Python worker; the JVM heap peak the event
log reports for the driver; shuffle bytes written; output bytes. The cost exponent of a stage is the slope
of log(time) against log(documents) between the two largest sizes: 1.0 is linear.

The corpus (seeded, cached under ``--work``) is English prose made of random draws from ~20,000 sentences
(Python's own documentation and the bundled sample site's articles: each draw is a new document), a quarter
of documents of the kinds the clean rules drop (``benchmarks/clean.py``'s generator: boilerplate, repeated
lines, short pages, code, junk, other languages), and planted duplicates: 8% exact copies and 7% near copies
(one sentence changed and a boilerplate line added, Jaccard well above dedup's 0.8) of earlier documents.
Dedup's precision and recall are measured against the planted families at every size.

``--cluster`` starts a standalone master and two 1-core workers (``pipeline.core.spark_cluster``), runs the
same stages at the second-largest size against it, and checks that every output file is byte-identical to
the local run's. The whole run needs about 5 GB of disk under ``--work`` and two hours of an idle 2-core machine.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder is sys.path[0]: the repository root replaces it, for benchmarks/clean.py's
# document generator.
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or os.curdir).resolve() != ROOT / "benchmarks"]

from benchmarks.measure import run_measured  # noqa: E402
from benchmarks.smoke import add_smoke_flag  # noqa: E402

CORPUS_VERSION = 3
CORPUS = "scale"
STAGES = ("ingest", "clean", "dedup", "classify", "decontaminate", "tokenize")
INPUT_STAGE = {"clean": "ingest"}  # clean reads crawl by default
TOKENIZER = "scale-bpe"
EXACT_SHARE, NEAR_SHARE, DROPPED_KINDS_SHARE = 0.08, 0.07, 0.25
CONTAMINATED_SHARE = 0.005  # of the prose documents: one evaluation item appended
CLASSIFIER = "quality"
DEDUP_THRESHOLD = 0.8  # dedup.threshold's default
DOCS_PER_FILE = 50_000
SMOKE_SIZES = [60]
# Classifier examples per class: the full run's, and --smoke's (train_classifier refuses fewer than
# classifier_training.min_examples_per_class, 100 by default, and holds out 10%).
REFERENCE_TEXTS, SMOKE_REFERENCE_TEXTS = 1000, 200


# ----------------------------------------------------------------------------------------------- corpus


# A sentence of plain words: capitalised first, lower-case after, commas allowed, a full stop at the end.
PLAIN_SENTENCE = re.compile(r"[A-Z][a-z]*(?:,? [A-Za-z][a-z]*[,;]?){6,33} [a-z]+")


class Prose:
    """Plain English sentences from Python's documentation topics, package READMEs and the sample site's
    articles (~1,400). A document draws 8-40 of them without replacement: a new text every time (two share
    a sentence or two at most), and one the clean rules keep."""

    def __init__(self, sources) -> None:
        sentences: set[str] = set()
        for paragraph in sources.paragraphs:
            for sentence in " ".join(paragraph.split()).split(". "):
                if PLAIN_SENTENCE.fullmatch(sentence.rstrip(".")):
                    sentences.add(sentence.rstrip(".") + ".")
        sentences.update(sources.article_sentences)
        self.sentences = sorted(sentences)

    def document(self, rng: random.Random) -> str:
        sentences = rng.sample(self.sentences, rng.randint(8, 40))
        paragraphs = [" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4)]
        return "\n\n".join(paragraphs)


def junk_document(rng: random.Random, prose: Prose, boilerplate: list[str]) -> str:
    """A page of a kind the clean rules drop (or, for boilerplate, cut down): each one new, so whatever
    survives clean is no accidental duplicate."""
    from benchmarks.clean import CHINESE, EUROPEAN

    kind = rng.choice(
        ["repeated_lines", "short", "keyword_spam", "symbols", "numbers", "foreign", "boilerplate"]
    )
    if kind == "repeated_lines":
        line = rng.choice(prose.sentences)
        return prose.document(rng) + "\n" + "\n".join([line] * rng.randint(10, 40))
    if kind == "short":
        return " ".join(rng.sample(prose.sentences, rng.randint(1, 3)))
    if kind == "keyword_spam":
        words = rng.sample(rng.choice(prose.sentences).split(), 3)
        return " ".join(rng.choice(words) for _ in range(rng.randint(100, 400)))
    if kind == "symbols":
        return "".join(rng.choice("#*=-_|/\\<>{}[]!@$%^&") for _ in range(rng.randint(100, 2000)))
    if kind == "numbers":
        rows = rng.randint(5, 60)
        return "\n".join(" ".join(str(rng.randint(0, 99999)) for _ in range(8)) for _ in range(rows))
    if kind == "foreign":
        pool = [*EUROPEAN[rng.choice(sorted(EUROPEAN))], *CHINESE] if rng.random() < 0.2 else EUROPEAN["de"]
        return "\n".join(" ".join(rng.choices(pool, k=rng.randint(2, 6))) for _ in range(rng.randint(2, 8)))
    lines = prose.document(rng).split("\n")
    for _ in range(rng.randint(5, 20)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(boilerplate))
    return "\n".join(lines)


def near_copy(text: str, rng: random.Random, prose: Prose, boilerplate: list[str]) -> str:
    """One sentence replaced and a boilerplate line added: a near duplicate for any text of 8+ sentences."""
    sentences = text.split(". ")
    sentences[rng.randrange(len(sentences))] = rng.choice(prose.sentences).rstrip(".")
    lines = ". ".join(sentences).split("\n")
    lines.insert(rng.randrange(len(lines) + 1), rng.choice(boilerplate))
    return "\n".join(lines)


def evaluation_items(seed: int) -> list[str]:
    """What decontaminate looks for: 500 texts of 20 words, none of them in the prose."""
    from tests.dedup.synthetic import WordSource

    words = WordSource(random.Random(seed + 99))
    return [" ".join(words.draw(20)) + "." for _ in range(500)]


def write_references(work: Path, seed: int, count: int = REFERENCE_TEXTS) -> None:
    """The classifier's training text (``count`` prose documents against as many junk ones) and the evaluation
    items, as JSONL files."""
    from benchmarks.clean import BOILERPLATE, Sources

    rng = random.Random(seed + 1)
    prose = Prose(Sources())
    texts = {
        "positives": [prose.document(rng) for _ in range(count)],
        "negatives": [junk_document(rng, prose, BOILERPLATE) for _ in range(count)],
        "items": evaluation_items(seed),
    }
    for name, lines in texts.items():
        (work / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))


def build_corpus(count: int, seed: int, work: Path) -> tuple[Path, dict]:
    """Parquet files of (id, url, text) and the planted families {copy id: source id}; cached."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.clean import BOILERPLATE, Sources

    folder = work / f"corpus-v{CORPUS_VERSION}-{count}-{seed}"
    truth_path = folder / "planted.json"
    if truth_path.exists():
        return folder / "files", json.loads(truth_path.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "files").mkdir(parents=True)
    rng = random.Random(seed)
    items = evaluation_items(seed)
    sources = Sources()
    prose = Prose(sources)
    planted: dict[str, str] = {}
    copyable: list[int] = []  # prose documents
    long_prose: list[int] = []  # of 16+ sentences: one sentence changed keeps a copy well above Jaccard 0.8
    texts: list[str] = []
    started = time.monotonic()
    for index in range(count):
        roll = rng.random()
        if copyable and roll < EXACT_SHARE:
            parent = rng.choice(copyable)
            text = texts[parent]
            planted[f"d{index:08d}"] = f"d{parent:08d}"
        elif long_prose and roll < EXACT_SHARE + NEAR_SHARE:
            parent = rng.choice(long_prose)
            text = near_copy(texts[parent], rng, prose, BOILERPLATE)
            planted[f"d{index:08d}"] = f"d{parent:08d}"
        elif roll < EXACT_SHARE + NEAR_SHARE + DROPPED_KINDS_SHARE:
            text = junk_document(rng, prose, BOILERPLATE)
        else:
            text = prose.document(rng)
            if rng.random() < CONTAMINATED_SHARE:
                text += "\n\n" + rng.choice(items)
            copyable.append(index)
            if text.count(". ") >= 15:
                long_prose.append(index)
        texts.append(text)
        if (index + 1) % 100_000 == 0:
            print(
                f"  corpus: {index + 1:,} of {count:,} documents ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
    for part, start in enumerate(range(0, count, DOCS_PER_FILE)):
        ids = [f"d{i:08d}" for i in range(start, min(count, start + DOCS_PER_FILE))]
        table = pa.table(
            {
                "id": ids,
                "url": [f"https://site{int(i[1:]) % 997}.example/{i}" for i in ids],
                "text": texts[start : start + DOCS_PER_FILE],
            }
        )
        pq.write_table(table, folder / "files" / f"part-{part:04d}.parquet")
    truth_path.write_text(json.dumps(planted))
    return folder / "files", planted


# ----------------------------------------------------------------------------------------------- measuring


def event_log_figures(folder: Path) -> dict:
    """Shuffle bytes written, and the driver's JVM heap peak, from the Spark event logs in ``folder``."""
    shuffle = 0
    heap = 0
    for path in folder.rglob("events_*"):  # Spark 4 writes each application's log as a folder of parts
        with path.open() as handle:
            for line in handle:
                event = json.loads(line)
                kind = event.get("Event")
                if kind == "SparkListenerTaskEnd":
                    metrics = event.get("Task Metrics") or {}
                    shuffle += (metrics.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0)
                elif kind in ("SparkListenerStageExecutorMetrics", "SparkListenerExecutorMetricsUpdate"):
                    peaks = event.get("Executor Metrics") or {}
                    for update in event.get("Executor Metrics Updated") or []:
                        peaks = {**peaks, **(update.get("Executor Metrics") or {})}
                    heap = max(heap, int(peaks.get("JVMHeapMemory", 0)))
    return {"shuffle_mb": round(shuffle / 2**20, 2), "jvm_heap_peak_mb": round(heap / 2**20, 1)}


def folder_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 2)


# ------------------------------------------------------------------------------------------------ stages


def pretrain(*arguments: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from pipeline.cli import main; sys.exit(main())", *arguments]


def write_config(work: Path, master: str, bucket: int = 200_000, tracked: bool = True) -> Path:
    """One config for every run (spark.master aside): the data root, the corpus, the event log; ``bucket``:
    the classifier's fastText hash buckets; ``tracked``: each stage records an MLflow run (as by default)."""
    import yaml

    local = master.startswith("local")
    # A standalone cluster's executors call back to the driver; on one machine, over the loopback.
    loopback = {} if local else {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    config = {
        "project": {"data_root": str(work / "data"), "corpus": CORPUS},
        "spark": {
            "master": master,
            "extra_conf": {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": (work / "events" / "current").as_uri(),
                "spark.eventLog.logStageExecutorMetrics": "true",
                "spark.eventLog.compress": "false",
                **loopback,
            },
        },
        "logging": {"console": False},
        "ingest": {"id_column": "id"},
        "classifier_training": {
            "positives": [{"path": str(work / "positives.jsonl")}],
            "negatives": [{"path": str(work / "negatives.jsonl")}],
            # 200,000: an 80 MB model; DCLM's 2M buckets cost the same per document.
            "fasttext": {"bucket": bucket},
        },
        "classify": {"models": [{"name": CLASSIFIER, "trained": CLASSIFIER, "threshold": 0.5}]},
        "decontaminate": {"sets": [{"name": "bench", "kind": "file", "path": str(work / "items.jsonl")}]},
        "tokenize": {"tokenizer": TOKENIZER},
        **({} if tracked else {"tracking": {"stage_runs": False}}),
    }
    path = work / f"config-{'local' if local else 'cluster'}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_stage(stage: str, snapshot: str, config: Path, work: Path, extra: tuple[str, ...] = ()) -> dict:
    events = work / "events" / "current"
    shutil.rmtree(events, ignore_errors=True)
    events.mkdir(parents=True)
    arguments = ["--snapshot", snapshot, "--config", str(config), *extra]
    if stage in INPUT_STAGE:
        arguments += ["--input-stage", INPUT_STAGE[stage]]
    measured = run_measured(pretrain(stage, *arguments), work / "logs" / f"{stage}-{snapshot}.log")
    measured.update(event_log_figures(events))
    output = work / "data" / CORPUS / stage / snapshot
    measured["output_mb"] = folder_mb(output)
    return measured


def ensure_classifier(config: Path, work: Path) -> None:
    """The quality classifier classify scores with, trained once (untimed) from the reference files."""
    if (work / "data" / CORPUS / "train_classifier" / CLASSIFIER).exists():
        return
    command = pretrain("train_classifier", "--snapshot", CLASSIFIER, "--config", str(config))
    run_measured(command, work / "logs" / "train_classifier.log")


def ensure_tokenizer(snapshot: str, config: Path, work: Path) -> None:
    """The shared tokenizer, trained once on the first size's finished documents (untimed: every later
    snapshot's tokenize reuses it, as daily snapshots do)."""
    if (work / "data" / CORPUS / "tokenizer" / TOKENIZER).exists():
        return
    command = pretrain("tokenizer", "train", "--name", TOKENIZER, "--source", f"{CORPUS}:{snapshot}",
                       "--config", str(config))  # fmt: skip
    run_measured(command, work / "logs" / "tokenizer.log")


def run_size(size: int, files: Path, config: Path, work: Path, snapshot: str) -> dict[str, dict]:
    figures: dict[str, dict] = {}
    for stage in STAGES:
        if stage == "classify":
            ensure_classifier(config, work)
        if stage == "tokenize":
            ensure_tokenizer(snapshot, config, work)
        extra = ("--source", str(files)) if stage == "ingest" else ()
        figures[stage] = run_stage(stage, snapshot, config, work, extra)
        shown = figures[stage]
        print(
            f"  {size:>9,} {stage:<14} {shown['wall_s']:8.1f} s wall {shown['cpu_s']:8.1f} s CPU  "
            f"driver {shown['peak_mb'].get('driver', 0):7.0f} MB  JVM heap {shown['jvm_heap_peak_mb']:7.0f} MB  "
            f"shuffle {shown['shuffle_mb']:8.1f} MB  out {shown['output_mb']:8.1f} MB",
            flush=True,
        )
    return figures


def dedup_quality(work: Path, snapshot: str, planted: dict[str, str]) -> dict:
    """Precision and recall of dedup's removals against the planted duplicates, among the documents that
    reached dedup (clean's output, whose rules may have changed a copy, e.g. cut its boilerplate line). A
    planted pair is a duplicate when its exact 5-gram Jaccard there (Python sets: ``plain_jaccard``) is at
    least dedup's threshold; the true clusters are the connected components of those pairs. Each cluster
    must lose all but one member (recall); a removal is right when its document is in a true cluster."""
    import pyarrow.parquet as pq

    from tests.dedup.synthetic import plain_jaccard

    data = work / "data" / CORPUS
    wanted = sorted({*planted, *planted.values()})
    texts = pq.read_table(
        data / "clean" / snapshot / "documents", columns=["id", "text"], filters=[("id", "in", wanted)]
    ).to_pydict()
    text_of = dict(zip(texts["id"], texts["text"], strict=True))
    removed = set(
        pq.read_table(data / "dedup" / snapshot / "excluded", columns=["id"]).column("id").to_pylist()
    )
    parent_of: dict[str, str] = {}  # union-find over the true duplicate pairs
    below = 0

    def root(doc: str) -> str:
        while parent_of.get(doc, doc) != doc:
            doc = parent_of[doc]
        return doc

    for copy, source in planted.items():
        if copy in text_of and source in text_of:
            if plain_jaccard(text_of[copy], text_of[source]) >= DEDUP_THRESHOLD:
                parent_of[root(copy)] = root(source)
            else:
                below += 1
    members: dict[str, list[str]] = {}
    for doc in text_of:
        members.setdefault(root(doc), []).append(doc)
    should_go = sum(len(group) - 1 for group in members.values())
    in_family = {doc for group in members.values() if len(group) > 1 for doc in group}
    right = len(removed & in_family)
    return {
        "precision": round(right / len(removed), 4) if removed else 1.0,
        "recall": round(right / should_go, 4) if should_go else 1.0,
        "removed": len(removed),
        "planted_to_remove": should_go,
        "planted_pairs_below_threshold": below,
    }


def exponent(small: int, large: int, small_cost: float, large_cost: float) -> float | None:
    if small == large:
        return None
    return round(math.log(large_cost / small_cost) / math.log(large / small), 3)


def same_outputs(work: Path, local: str, cluster: str) -> dict[str, bool]:
    """Per stage: every file the local run's manifest lists has the same bytes in the cluster run, except
    where a file records its snapshot's name (dedup's keys: the two runs' snapshots are named apart), which
    must hold the same rows in the same order once that column is left out."""
    import pyarrow.parquet as pq

    from pipeline.core.manifest import MANIFEST_NAME, Manifest

    data = work / "data" / CORPUS
    result = {}
    for stage in STAGES:
        manifest = Manifest.read(data / stage / local / MANIFEST_NAME)
        other = Manifest.read(data / stage / cluster / MANIFEST_NAME)
        same = bool(manifest.files) and manifest.files.keys() == other.files.keys()
        for name, entry in manifest.files.items() if same else ():
            if entry.sha256 == other.files[name].sha256:
                continue
            if not name.endswith(".parquet"):
                same = False
                break
            ours, theirs = (pq.read_table(data / stage / run / name) for run in (local, cluster))
            named = "snapshot" in ours.column_names and set(ours.column("snapshot").to_pylist()) == {local}
            same = named and ours.drop(["snapshot"]).equals(theirs.drop(["snapshot"]))
            if not same:
                break
        result[stage] = same
    return result


def plot(sizes: list[int], results: dict[int, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for stage in STAGES:
        for axis, key in zip(axes, ("wall_s", "cpu_s"), strict=True):
            axis.plot(sizes, [results[s][stage][key] for s in sizes], marker="o", label=stage)
    titles = {"wall_s": "wall time, s", "cpu_s": "CPU time (driver, JVM, workers), s"}
    for axis, (key, title) in zip(axes, titles.items(), strict=True):
        reference = [sizes[0], sizes[-1]]
        start = min(results[sizes[0]][stage][key] for stage in STAGES)
        axis.plot(reference, [start, start * sizes[-1] / sizes[0]], "k:", label="linear")
        axis.set(xscale="log", yscale="log", xlabel="documents", title=title)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k documents only")
    add_smoke_flag(parser)
    parser.add_argument("--sizes", help="comma-separated corpus sizes (default 10000,100000,1000000)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="corpora and data root (default benchmarks/out/scale; --smoke: a temporary folder)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also run the second-largest size on a "
        "standalone cluster (2 workers x 1 core) and compare the outputs byte for byte",
    )
    parser.add_argument(
        "--plot", type=Path, default=None, help="default docs/img/scale.png (--smoke: in the work folder)"
    )
    parser.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="where to write the result scripts/capacity.py reads (default benchmarks/scale_figures.json; "
        "--smoke: in the work folder)",
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.sizes:
        sizes = sorted(int(s) for s in args.sizes.split(","))
    elif args.smoke:
        sizes = SMOKE_SIZES
    else:
        sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    if len(sizes) < 2 and not args.smoke:
        parser.error("give at least two sizes: the exponents need two points")
    if args.work is None:  # a smoke run's figures mean nothing: they never replace the recorded ones
        args.work = (
            Path(tempfile.mkdtemp(prefix="bench-scale-")) if args.smoke else ROOT / "benchmarks/out/scale"
        )
    work = args.work
    args.plot = args.plot or (work / "scale.png" if args.smoke else ROOT / "docs/img/scale.png")
    args.figures = args.figures or (
        work / "scale_figures.json" if args.smoke else ROOT / "benchmarks/scale_figures.json"
    )
    shutil.rmtree(work / "data", ignore_errors=True)  # each run measures from scratch; corpora are kept
    (work / "logs").mkdir(parents=True, exist_ok=True)
    write_references(work, args.seed, SMOKE_REFERENCE_TEXTS if args.smoke else REFERENCE_TEXTS)
    # --smoke: no stage's MLflow run (importing MLflow and opening its store is a few CPU seconds of each
    # of the 8 processes; tests/tracking covers it): what a smoke run checks is this script's code.
    config = write_config(work, "local[2]", 20_000 if args.smoke else 200_000, tracked=not args.smoke)
    load_before = os.getloadavg()
    results: dict[int, dict[str, dict]] = {}
    quality: dict[int, dict] = {}
    for size in sizes:
        print(f"{size:,} documents: generating (cached after the first run)", flush=True)
        files, planted = build_corpus(size, args.seed, work)
        results[size] = run_size(size, files, config, work, f"s{size}")
        quality[size] = dedup_quality(work, f"s{size}", planted)
        print(f"  dedup against the planted families: {quality[size]}", flush=True)
    # One size (--smoke): the same code, with null exponents (no slope from one point) and growths of 1.
    small, large = (sizes[-2], sizes[-1]) if len(sizes) > 1 else (sizes[0], sizes[0])
    summary: dict = {"sizes": sizes, "stages": list(STAGES)}
    for stage in STAGES:
        summary[f"cost_exponent_{stage}"] = exponent(
            small, large, results[small][stage]["wall_s"], results[large][stage]["wall_s"]
        )
        summary[f"cpu_exponent_{stage}"] = exponent(
            small, large, results[small][stage]["cpu_s"], results[large][stage]["cpu_s"]
        )
    driver_growth = {
        stage: round(
            results[large][stage]["peak_mb"]["driver"] / results[small][stage]["peak_mb"]["driver"], 3
        )
        for stage in STAGES
    }
    summary["driver_peak_mb_growth_by_stage"] = driver_growth
    summary[f"driver_peak_mb_growth_{small // 1000}k_to_{large // 1000}k"] = max(driver_growth.values())
    if (small, large) == (100_000, 1_000_000):
        summary["driver_peak_mb_growth_100k_to_1m"] = max(driver_growth.values())
    summary["dedup_precision"] = {size: quality[size]["precision"] for size in sizes}
    summary["dedup_recall"] = {size: quality[size]["recall"] for size in sizes}
    summary["per_size"] = results
    if args.cluster:
        from pipeline.core.spark_cluster import standalone_cluster

        size = small
        files, _ = build_corpus(size, args.seed, work)
        with standalone_cluster(work / "cluster", workers=2, cores=1, memory="2g") as cluster:
            cluster_config = write_config(work, cluster.master_url)
            print(f"{size:,} documents on the standalone cluster {cluster.master_url}", flush=True)
            on_cluster = run_size(size, files, cluster_config, work, f"c{size}")
        summary["cluster"] = {
            "size": size,
            "wall_s": {stage: on_cluster[stage]["wall_s"] for stage in STAGES},
            "local_wall_s": {stage: results[size][stage]["wall_s"] for stage in STAGES},
            "byte_identical": same_outputs(work, f"s{size}", f"c{size}"),
        }
    summary["load_avg_1m"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    plot(sizes, results, args.plot)
    args.figures.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"plot: {args.plot}; figures: {args.figures}", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
