"""Clean stage vs datatrove's FineWeb filter chain, side by side on the same documents and the same 2 cores.

    make bench-venv
    .venv-bench/bin/python benchmarks/clean.py            # 100,000 documents
    .venv-bench/bin/python benchmarks/clean.py --quick    # 5,000 documents, under 3 minutes

The corpus is generated from text that ships with Python and the pinned packages (pydoc topics, package
READMEs, stdlib code, the bundled sample site, jieba's dictionary): good prose, boilerplate-heavy pages,
repetitive pages, short pages, bullet lists, code, mojibake, PII, junk, German/French/Spanish and Chinese.

* ours: the clean stage's Spark job (``clean_documents`` + writing ``documents/`` and ``excluded/``) on
  ``local[2]``, from the raw texts: normalisation, language id, all signals, decisions, PII redaction.
* datatrove 0.10.1: ``LocalPipelineExecutor`` with 2 workers running ParquetReader -> language filter ->
  GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter -> FineWebQualityFilter -> ParquetWriter,
  configured as datatrove's ``examples/fineweb.py`` configures them (``fineweb_filters``), each with an
  exclusion writer, on the texts our normaliser produced (so both decide on the same characters). Ours
  runs its default config (recipe ``fineweb``). The language filter runs py3langid like ours: datatrove's
  own LanguageFilter downloads a fastText model, and this machine has no internet.

Reported: documents per second (wall clock) for each and their ratio; CPU seconds of each process tree and
documents per CPU second (which, unlike wall clock, do not depend on what else the machine is running);
and the share of documents on which both make the same keep/drop decision, with every disagreement listed by
(our rule, datatrove's reason).

``--unicode-form NFKC`` runs ours with ``clean.unicode_form=NFKC`` (default: NFC), and ``--datatrove-text
ftfy`` gives datatrove the text as FineWeb keeps it (datatrove's ``FTFYFormatter``: ftfy's encoding repairs,
no width folding, no normal form: "fix_character_width enforces the WRONG punctuation for chinese") instead of
ours: together they measure what our normal form changes against FineWeb's (docs/clean.md). The result then
also says how many Chinese documents the form changed. Ours runs once untimed on 500 other documents first (JIT and Python worker
start-up, reported); datatrove's worker start-up is inside its time. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import base64
import collections
import datetime
import functools
import glob
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS_VERSION = 3  # bump when make_document or the file layout changes, so a cached corpus is rebuilt
WARM_UP_DOCS = 500
SMOKE_DOCS = 60
# Run as a script, this folder is sys.path[0]: the repository root replaces it, for tests.conftest (not
# installed).
sys.path[:] = [str(ROOT)] + [e for e in sys.path if Path(e or os.curdir).resolve() != ROOT / "benchmarks"]

from benchmarks.smoke import add_smoke_flag, baseline_skipped  # noqa: E402

BOILERPLATE = [
    "Home | About | Contact | Blog",
    "Skip to main content",
    "Sign in",
    "Share on Facebook",
    "Tweet",
    "Read more »",
    "Subscribe to our newsletter",
    "This website uses cookies to improve your experience.",
    "By continuing you agree to our Terms of Use and Privacy Policy.",
    "Copyright © 2024 Example Media. All rights reserved.",
    "Posted by admin on March 3, 2021",
    "Tags: news, updates, misc",
    "Previous post",
    "Next post",
    "Please enable JavaScript to view the comments.",
    "Related articles",
    "Advertisement",
    "Leave a comment",
]
EUROPEAN = {
    "de": [
        "Die Stadt liegt an einem breiten Fluss, der seit Jahrhunderten die Mühlen antreibt.",
        "Im Sommer kommen viele Besucher, um die alte Brücke und den Markt zu sehen.",
        "Die Bäcker und Brauer haben sich in der Nähe des Wassers niedergelassen.",
        "Wer heute durch die Gassen geht, findet noch viele Spuren dieser Geschichte.",
        "Der Gemeinderat hat beschlossen, das historische Mühlrad zu restaurieren.",
        "Am Abend treffen sich die Nachbarn auf dem Platz vor der Kirche.",
    ],
    "fr": [
        "La ville s'est développée le long de la rivière, là où le courant était le plus fort.",
        "Les boulangers et les brasseurs se sont installés près du moulin.",
        "Chaque samedi, le marché attire des habitants de tous les villages voisins.",
        "Les règles sur la hauteur des barrages ont survécu pendant des siècles.",
        "On peut encore voir l'ancien canal qui menait l'eau jusqu'à la roue.",
        "Le soir, les familles se promènent au bord de l'eau.",
    ],
    "es": [
        "El pueblo creció a lo largo del río, donde la corriente era fuerte pero tranquila.",
        "Los panaderos y los cerveceros se instalaron cerca del molino.",
        "Cada sábado el mercado reúne a vecinos de todos los pueblos cercanos.",
        "Las normas sobre la altura de las presas sobrevivieron durante siglos.",
        "Todavía se puede ver el antiguo canal que llevaba el agua hasta la rueda.",
        "Por la tarde, las familias pasean junto al agua.",
    ],
}
CHINESE = [
    "茶起源于中国，已有数千年的历史。",
    "最初，人们把茶叶当作药材，用来提神和解渴。",
    "后来，喝茶逐渐成为日常生活的一部分，并传播到世界各地。",
    "不同地区的茶有不同的风味，绿茶清新，红茶浓郁。",
    "泡茶时，水温和时间都很重要，过热的水会让绿茶变苦。",
    "今天，很多人仍然喜欢在安静的午后泡一壶茶，和朋友聊天。",
    "这座城市沿着河流发展，河水推动着磨坊的水轮。",
    "每到周末，市场上都挤满了来自附近村庄的人。",
]


# --- corpus ------------------------------------------------------------------------------------------


class Sources:
    def __init__(self):
        import pydoc_data.topics

        import trafilatura

        self.paragraphs = []  # real English documentation prose
        for text in pydoc_data.topics.topics.values():
            self.paragraphs += [p.strip() for p in text.split("\n\n") if p.strip()]
        for path in sorted(glob.glob(f"{sys.prefix}/lib/python3*/site-packages/*.dist-info/METADATA")):
            body = Path(path).read_text(encoding="utf-8", errors="replace").split("\n\n", 1)[-1]
            self.paragraphs += [p.strip() for p in body.split("\n\n") if p.strip()]
        self.articles = [
            trafilatura.extract(path.read_text(), favor_precision=True)
            for path in sorted((ROOT / "pipeline/crawl/sample_site/articles").glob("*.html"))
        ]
        self.article_sentences = [
            s.strip() + "." for a in self.articles if a for s in a.split(". ") if s.strip()
        ]
        self.code_files = sorted(glob.glob(f"{os.path.dirname(os.__file__)}/*.py"))
        import jieba

        dictionary = Path(jieba.__file__).with_name("dict.txt").read_text(encoding="utf-8").splitlines()
        self.chinese_words = [line.split()[0] for line in dictionary[:40000:7]]
        self._code_cache: dict[str, list[str]] = {}

    def code_lines(self, path: str) -> list[str]:
        if path not in self._code_cache:
            self._code_cache[path] = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        return self._code_cache[path]


def _prose(rng: random.Random, src: Sources, paragraphs: int) -> str:
    start = rng.randrange(len(src.paragraphs))
    chunk = src.paragraphs[start : start + paragraphs]
    return rng.choice(["\n", "\n\n"]).join(chunk)


def _sentences(rng, pool, count):
    return " ".join(rng.choice(pool) for _ in range(count))


def make_document(rng: random.Random, src: Sources) -> str:
    kind = rng.choices(
        ["prose", "article", "boilerplate", "repetitive", "short", "bullets", "code", "european", "chinese",
         "mojibake", "pii", "junk"],
        weights=[30, 12, 10, 7, 8, 6, 7, 5, 5, 3, 5, 2],
    )[0]  # fmt: skip
    if kind == "prose":
        return _prose(rng, src, rng.randint(2, 30))
    if kind == "article":
        sentences = rng.sample(src.article_sentences, rng.randint(5, 60))
        paragraphs = [" ".join(sentences[i : i + 4]) for i in range(0, len(sentences), 4)]
        return "How river mills shaped small towns\n" * rng.randint(0, 1) + "\n".join(paragraphs)
    if kind == "boilerplate":
        lines = _prose(rng, src, rng.randint(2, 12)).split("\n")
        for _ in range(rng.randint(2, 14)):
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(BOILERPLATE))
        return "\n".join(lines)
    if kind == "repetitive":
        base = _prose(rng, src, rng.randint(1, 5))
        style = rng.randrange(3)
        if style == 0:
            line = rng.choice(base.split("\n"))
            return "\n".join([base] + [line] * rng.randint(1, 12))
        if style == 1:
            return "\n\n".join([base] * rng.randint(2, 4))
        phrase = " ".join(rng.sample(base.split(), min(4, len(base.split()))))
        return base + "\n" + " ".join([phrase] * rng.randint(3, 40))
    if kind == "short":
        return _sentences(rng, src.article_sentences, rng.randint(1, 5))
    if kind == "bullets":
        items = [
            f"{rng.choice(['-', '•', '*'])} {_sentences(rng, src.article_sentences, 1)}"
            for _ in range(rng.randint(3, 25))
        ]
        intro = [_prose(rng, src, 1)] if rng.random() < 0.5 else []
        return "\n".join(intro + items)
    if kind == "code":
        lines = src.code_lines(rng.choice(src.code_files))
        start = rng.randrange(max(1, len(lines) - 20))
        return "\n".join(lines[start : start + rng.randint(20, 150)])
    if kind == "european":
        pool = EUROPEAN[rng.choice(sorted(EUROPEAN))]
        return "\n".join(_sentences(rng, pool, rng.randint(2, 6)) for _ in range(rng.randint(2, 8)))
    if kind == "chinese":
        if rng.random() < 0.5:
            return "\n".join(
                "".join(rng.sample(CHINESE, rng.randint(2, 5))) for _ in range(rng.randint(2, 8))
            )
        words = [rng.choice(src.chinese_words) for _ in range(rng.randint(50, 400))]
        return "".join(
            w + ("。" if rng.random() < 0.1 else "，" if rng.random() < 0.1 else "") for w in words
        )
    if kind == "mojibake":
        text = _prose(rng, src, rng.randint(3, 15)).replace("'", "’").replace(" - ", " — ")
        return text.encode("utf-8").decode("cp1252", errors="replace")
    if kind == "pii":
        lines = _prose(rng, src, rng.randint(3, 15)).split("\n")
        contacts = [
            f"Write to {rng.choice(['anna', 'bob.smith', 'info'])}@{rng.choice(['example.com', 'mail.example.org'])}.",
            f"Call us at +1 415 555 {rng.randint(1000, 9999)} for details.",
            f"The server at 192.168.{rng.randint(0, 255)}.{rng.randint(1, 254)} answered quickly.",
            f"Its IPv6 address is 2001:db8::{rng.randint(1, 9999):x} today.",
        ]
        for contact in contacts:
            lines.insert(rng.randrange(len(lines) + 1), contact)
        return "\n".join(lines)
    # junk: base64 blobs, symbol soup, number tables
    style = rng.randrange(3)
    if style == 0:
        return base64.b64encode(rng.randbytes(rng.randint(200, 3000))).decode()
    if style == 1:
        return "".join(rng.choice("#*=-_|/\\<>{}[]!@$%^&") for _ in range(rng.randint(100, 2000)))
    return "\n".join(
        " ".join(str(rng.randint(0, 99999)) for _ in range(8)) for _ in range(rng.randint(5, 60))
    )


def datatrove_text(text: str, form: str, source: str) -> str:
    """What datatrove reads: our normalised text (``ours``), or the text as FineWeb keeps it (``ftfy``)."""
    from pipeline.documents.normalize import normalize_text

    if source == "ftfy":
        return _ftfy_formatter().format(text)
    return normalize_text(text, form)


@functools.cache
def _ftfy_formatter():
    """datatrove's FTFYFormatter with its defaults: encoding repairs only, no width folding, no normal form."""
    from datatrove.pipeline.formatters import FTFYFormatter

    return FTFYFormatter()


def build_corpus(
    count: int, seed: int, folder: Path, files: int = 16, form: str = "NFC", source: str = "ours"
) -> tuple[Path, Path]:
    """Write raw texts (ours) and the texts datatrove reads as Parquet; reused when present."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline.documents.extract import EXTRACTED_SCHEMA

    name = f"corpus-v{CORPUS_VERSION}-{count}-{seed}" + (
        "" if (form, source) == ("NFC", "ours") else f"-{form}-{source}"
    )
    raw_dir, normalized_dir = folder / name / "raw", folder / name / "normalized"
    done = folder / name / "_DONE"
    if done.exists():
        return raw_dir, normalized_dir
    shutil.rmtree(folder / name, ignore_errors=True)
    raw_dir.mkdir(parents=True)
    normalized_dir.mkdir(parents=True)
    sources = Sources()
    fetched = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    indices = range(count) if tqdm is None else tqdm(range(count), desc="generating corpus", unit="doc")
    rows = []
    for index in indices:
        text = make_document(random.Random(seed * 1_000_003 + index), sources)
        rows.append({"id": f"{index:08d}", "url": f"https://bench.example/{index}", "domain": "bench.example",
                     "fetch_time": fetched, "text": text, "drop_reason": None})  # fmt: skip
    for part in range(files):
        chunk = rows[part::files]
        pq.write_table(
            pa.Table.from_pylist(chunk, schema=EXTRACTED_SCHEMA), raw_dir / f"part-{part:03d}.parquet"
        )
        normalized = [{**row, "text": datatrove_text(row["text"], form, source)} for row in chunk]
        normalized = [row for row in normalized if row["text"]]  # datatrove skips empty texts anyway
        pq.write_table(
            pa.Table.from_pylist(normalized, schema=EXTRACTED_SCHEMA),
            normalized_dir / f"part-{part:03d}.parquet",
        )
    done.touch()
    return raw_dir, normalized_dir


def process_cpu() -> dict[int, float]:
    """CPU seconds used so far by this process and by each live descendant (Spark's JVM and Python
    workers, datatrove's forkserver and pool), each with its reaped children. Unlike wall time this does
    not depend on what else the machine runs."""
    import psutil

    me = psutil.Process()
    used = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        used[process.pid] = times.user + times.system + times.children_user + times.children_system
    return used


def cpu_seconds_since(start: dict[int, float]) -> float:
    """CPU seconds the process tree used since ``start`` (a process_cpu()), process by process. Not the
    difference of two totals: Spark's Python daemon ignores SIGCHLD, so a worker it retires (idle for a
    minute, e.g. while datatrove ran) takes its CPU seconds out of every total; per process, a retired
    worker simply stops counting, having used nothing in the meantime."""
    return sum(seconds - start.get(pid, 0.0) for pid, seconds in process_cpu().items())


# --- ours ----------------------------------------------------------------------------------------------


def run_ours(raw_dir: Path, out: Path, config) -> dict:
    from pipeline.clean.job import clean_counters, clean_documents, write_outputs
    from pipeline.core.spark import spark_schema, spark_session
    from pipeline.documents.extract import EXTRACTED_SCHEMA

    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    spark = spark_session(config, "bench-clean")
    session_seconds = time.perf_counter() - started
    begin, cpu_begin = time.perf_counter(), process_cpu()
    extracted = spark.read.schema(spark_schema(EXTRACTED_SCHEMA)).parquet(str(raw_dir))
    decided = clean_documents(extracted, config).cache()
    write_outputs(decided, out, config.spark.output_files)
    counters = clean_counters(decided)
    decided.unpersist()
    seconds, cpu_seconds = time.perf_counter() - begin, cpu_seconds_since(cpu_begin)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "session_seconds": session_seconds,
        "decisions": our_decisions(out),
        "counters": counters,
    }


def our_decisions(out: Path, key: str = "id") -> dict[str, str | None]:
    """key -> None (kept) or the drop rule, from a clean output's documents/ and excluded/."""
    import pyarrow.parquet as pq

    decisions = {}
    for dataset in ("documents", "excluded"):
        table = pq.read_table(out / dataset, columns=[key] + (["drop_rule"] if dataset == "excluded" else []))
        rules = table.column("drop_rule").to_pylist() if dataset == "excluded" else [None] * table.num_rows
        decisions.update(zip(table.column(key).to_pylist(), rules, strict=True))
    return decisions


# --- datatrove ---------------------------------------------------------------------------------------


def fineweb_filters(excluded, langid_max_chars: int) -> list:
    """datatrove's FineWeb filter chain as its ``examples/fineweb.py`` runs it: each filter with datatrove's
    own defaults, C4 with ``filter_no_terminal_punct=False``, ``excluded(name)`` as each exclusion writer.
    So the agreement measures our default recipe against FineWeb's run, not against our own thresholds.

    Left out: URLFilter (its blocklists; our clean stage has no URL filter) and Trafilatura (the inputs
    are text). py3langid stands in for LanguageFilter's fastText model (this machine is offline), with
    LanguageFilter's defaults: English, score >= 0.65.
    """
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.filters.base_filter import BaseFilter

    class Py3LangidFilter(BaseFilter):
        name = "py3langid language"

        def __init__(self, languages, threshold, max_chars, exclusion_writer=None):
            super().__init__(exclusion_writer)
            self.languages, self.threshold, self.max_chars = set(languages), threshold, max_chars

        def filter(self, doc):
            from pipeline.clean.language import identify_language

            lang, score = identify_language(doc.text, self.max_chars)
            doc.metadata["language"], doc.metadata["language_score"] = lang, score
            if lang not in self.languages:
                return False, "language.not_kept"
            return score >= self.threshold or (False, "language.min_score")

    return [
        Py3LangidFilter(["en"], 0.65, langid_max_chars, excluded("language")),
        GopherRepetitionFilter(exclusion_writer=excluded("gopher_repetition")),
        GopherQualityFilter(exclusion_writer=excluded("gopher_quality")),
        C4QualityFilter(filter_no_terminal_punct=False, exclusion_writer=excluded("c4")),
        FineWebQualityFilter(exclusion_writer=excluded("fineweb")),
    ]


def datatrove_chain(reader, out: Path, clean) -> list:
    """reader -> the FineWeb filters -> a writer of the kept documents, every step writing Parquet."""
    from datatrove.pipeline.writers import ParquetWriter

    def excluded(name):
        return ParquetWriter(str(out / "excluded" / name), compression="zstd", expand_metadata=True)

    return [
        reader,
        *fineweb_filters(excluded, clean.langid_max_chars),
        ParquetWriter(str(out / "kept"), compression="zstd", expand_metadata=True),
    ]


def datatrove_decisions(out: Path, key: str = "id") -> dict[str, str | None]:
    """key -> None (kept) or the dropping step and reason, from datatrove_chain's writers."""
    import pyarrow.parquet as pq

    decisions = {}
    for path in sorted(out.glob("kept/*.parquet")):
        decisions.update(dict.fromkeys(pq.read_table(path, columns=[key]).column(key).to_pylist()))
    for path in sorted(out.glob("excluded/*/*.parquet")):
        step = path.parent.name
        table = pq.read_table(path, columns=[key, "filter_reason"])
        for doc_id, reason in zip(
            table.column(key).to_pylist(), table.column("filter_reason").to_pylist(), strict=True
        ):
            decisions[doc_id] = reason if step == "language" else f"{step}:{reason}"
    return decisions


def run_datatrove_pipeline(pipeline: list, out: Path, tasks: int, workers: int) -> dict:
    """Run a datatrove pipeline with LocalPipelineExecutor; wall and process-tree CPU seconds."""
    from datatrove.executor import LocalPipelineExecutor

    executor = LocalPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=str(out / "logs"))
    begin, cpu_begin = time.perf_counter(), process_cpu()
    executor.run()
    return {"seconds": time.perf_counter() - begin, "cpu_seconds": cpu_seconds_since(cpu_begin)}


def run_datatrove(normalized_dir: Path, out: Path, clean, workers: int) -> dict:
    from datatrove.pipeline.readers import ParquetReader

    shutil.rmtree(out, ignore_errors=True)
    reader = ParquetReader(
        str(normalized_dir), text_key="text", id_key="id", read_metadata=False, glob_pattern="*.parquet"
    )
    files = len(list(normalized_dir.glob("*.parquet")))
    timing = run_datatrove_pipeline(datatrove_chain(reader, out, clean), out, files, workers)
    return {**timing, "decisions": datatrove_decisions(out)}


# --- comparison --------------------------------------------------------------------------------------


def compare(
    ours: dict[str, str | None], theirs: dict[str, str | None], unseen: str = "empty"
) -> tuple[float, collections.Counter]:
    """Agreement over every document; a document datatrove never saw (here: empty after normalising)
    counts as dropped by it, for the reason ``unseen``."""
    agree = 0
    disagreements: collections.Counter = collections.Counter()
    for doc_id, our_rule in ours.items():
        their_reason = theirs.get(doc_id, unseen)
        if (our_rule is None) == (their_reason is None):
            agree += 1
        else:
            disagreements[(our_rule or "kept", their_reason or "kept")] += 1
    return agree / max(len(ours), 1), disagreements


def chinese_changed_by_form(raw_dir: Path, form: str) -> dict:
    """Of the documents mostly in Chinese characters, how many the normal form changes (against NFC, which
    keeps them as written): NFKC turns their full-width "，" and "：" into ASCII."""
    import re

    import pyarrow.parquet as pq

    from pipeline.documents.normalize import normalize_text

    han = re.compile(r"[\u4e00-\u9fff]")
    texts = [text for text in pq.read_table(raw_dir, columns=["text"]).column("text").to_pylist() if text]
    chinese = [text for text in texts if len(han.findall(text)) > 0.3 * len(text)]
    changed = sum(normalize_text(text, form) != normalize_text(text, "NFC") for text in chinese)
    return {"chinese_docs": len(chinese), "chinese_docs_changed_by_form": changed}


def bench_config(data_root: Path, workers: int, *overrides: str):
    """The default config on ``local[workers]``, with the tests' environment setup."""
    from tests.conftest import make_config

    return make_config(
        data_root,
        f"spark.master=local[{workers}]",
        "spark.driver_memory=4g",
        f"spark.shuffle_partitions={workers * 4}",
        # one task per corpus file, so both cores stay busy to the end
        f"spark.extra_conf={{spark.sql.files.minPartitionNum: '{workers * 8}'}}",
        *overrides,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="5,000 documents (under 3 minutes on 2 cores)")
    parser.add_argument("--docs", type=int, default=None, help="number of documents (default 100,000)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--workers", type=int, default=2, help="Spark local[N] and datatrove workers")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "clean")
    parser.add_argument("--show", type=int, default=3, help="example ids shown per disagreement kind")
    parser.add_argument(
        "--unicode-form", choices=["NFC", "NFKC"], default="NFC", help="ours: clean.unicode_form"
    )
    parser.add_argument(
        "--datatrove-text",
        choices=["ours", "ftfy"],
        default="ours",
        help="datatrove reads our normalised text (default) or the text as FineWeb keeps it (ftfy)",
    )
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    skipped = baseline_skipped("datatrove")
    if skipped and not args.smoke:
        parser.error("datatrove is missing: run `make bench-venv` and use .venv-bench/bin/python")
    count = args.docs or (SMOKE_DOCS if args.smoke else 5_000 if args.quick else 100_000)

    config = bench_config(args.out / "data", args.workers, f"clean.unicode_form={args.unicode_form}")
    raw_dir, normalized_dir = build_corpus(
        count, args.seed, args.out, form=args.unicode_form, source=args.datatrove_text
    )
    # A Spark job's first run pays for JIT compilation and Python worker start-up (model loading); pay
    # them on a separate small corpus, as a long-running cluster would have, and report them. Smoke mode
    # skips it: it only moves time out of the figures, which mean nothing there.
    warm_up = {"seconds": 0.0, "cpu_seconds": 0.0, "session_seconds": 0.0}
    if not args.smoke:
        warm_dir, _ = build_corpus(WARM_UP_DOCS, args.seed + 1, args.out)
        warm_up = run_ours(warm_dir, args.out / "warm-up", config)
        print(
            f"ours warm-up on {WARM_UP_DOCS} documents: {warm_up['seconds']:.1f} s, {warm_up['cpu_seconds']:.1f} CPU s"
        )

    ours = run_ours(raw_dir, args.out / "ours", config)
    print(f"ours: {ours['seconds']:.1f} s for {count:,} documents", flush=True)
    if skipped:
        kept = sum(rule is None for rule in ours["decisions"].values())
        print(json.dumps({"docs": count, "ours_docs_per_s": round(count / ours["seconds"], 1),
                          "ours_kept": kept, "baseline": skipped}))  # fmt: skip
        return 0
    theirs = run_datatrove(normalized_dir, args.out / "datatrove", config.clean, args.workers)
    agreement, disagreements = compare(ours["decisions"], theirs["decisions"])

    ours_rate = count / ours["seconds"]
    theirs_rate = count / theirs["seconds"]
    ratio = ours_rate / theirs_rate
    cpu_ratio = theirs["cpu_seconds"] / ours["cpu_seconds"]
    load = os.getloadavg()[0]
    kept_ours = sum(rule is None for rule in ours["decisions"].values())
    kept_theirs = sum(reason is None for reason in theirs["decisions"].values())
    print(f"\n{count:,} documents, {args.workers} cores")
    print(f"{'':24}{'seconds':>10}{'docs/s':>10}{'CPU s':>10}{'docs/CPU s':>12}{'kept':>9}")
    for name, run, rate in (("ours (Spark job)", ours, ours_rate), ("datatrove 0.10.1", theirs, theirs_rate)):
        kept = kept_ours if run is ours else kept_theirs
        print(
            f"{name:24}{run['seconds']:>10.1f}{rate:>10.1f}{run['cpu_seconds']:>10.1f}"
            f"{count / run['cpu_seconds']:>12.1f}{kept:>9}"
        )
    print(
        f"(not counted for ours: Spark session start {warm_up['session_seconds']:.1f} s, warm-up run "
        f"{warm_up['seconds']:.1f} s / {warm_up['cpu_seconds']:.1f} CPU s; 1-minute load average: {load:.1f})"
    )
    print(f"docs/s ours / datatrove: {ratio:.2f}x wall clock, {cpu_ratio:.2f}x per CPU second")
    print(f"keep/drop agreement: {agreement:.4%} ({sum(disagreements.values())} disagreements)")
    for (our_rule, their_reason), number in disagreements.most_common():
        examples = [
            doc_id
            for doc_id, rule in ours["decisions"].items()
            if (rule or "kept") == our_rule
            and (theirs["decisions"].get(doc_id, "empty") or "kept") == their_reason
        ][: args.show]
        print(f"  {number:6d}  ours={our_rule:40s} datatrove={their_reason:40s} e.g. {examples}")
    print(f"our drops by rule: {json.dumps(ours['counters']['dropped'])}")
    result = {
        "docs": count,
        "ours_docs_per_s": round(ours_rate, 1),
        "datatrove_docs_per_s": round(theirs_rate, 1),
        "docs_per_s_ratio_vs_datatrove": round(ratio, 2),
        "docs_per_cpu_s_ratio_vs_datatrove": round(cpu_ratio, 2),
        "ours_cpu_s": round(ours["cpu_seconds"], 1),
        "datatrove_cpu_s": round(theirs["cpu_seconds"], 1),
        "load_average": round(load, 1),
        "ours_warm_up_s": round(warm_up["seconds"], 1),
        "ours_warm_up_cpu_s": round(warm_up["cpu_seconds"], 1),
        "decision_agreement": round(agreement, 5),
        "unicode_form": args.unicode_form,
        "datatrove_text": args.datatrove_text,
        **chinese_changed_by_form(raw_dir, args.unicode_form),
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.smoke:
        print(json.dumps({**result, "ours_kept": kept_ours, "baseline": "datatrove"}))
        return 0
    print(json.dumps({"docs_per_s_ratio_vs_datatrove": result["docs_per_s_ratio_vs_datatrove"],
                      "decision_agreement": result["decision_agreement"]}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
