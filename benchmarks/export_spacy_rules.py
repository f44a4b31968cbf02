"""Export spaCy's English tokenizer rules to pipeline/clean/data/spacy_en_tokenizer.json.

datatrove's Gopher/C4/FineWeb filters count words and sentences with spaCy's blank English pipeline
(tokenizer + sentencizer). spaCy must not enter the main environment, so `pipeline.clean.words` runs the
same algorithm on these exported rules. Re-run after changing the spaCy pin in benchmarks/requirements.lock:

    .venv-bench/bin/python benchmarks/export_spacy_rules.py
"""

from __future__ import annotations

import json
from pathlib import Path

import spacy
from spacy.attrs import ORTH
from spacy.pipeline import Sentencizer

TARGET = Path(__file__).resolve().parents[1] / "pipeline" / "clean" / "data" / "spacy_en_tokenizer.json"


def main() -> None:
    nlp = spacy.blank("en")
    tokenizer = nlp.tokenizer
    assert tokenizer.token_match is None, "the exported algorithm assumes English has no token_match"
    rules = {chunk: [spec[ORTH] for spec in specs] for chunk, specs in sorted(tokenizer.rules.items())}
    # faster_heuristics: only special cases that affixes would split go through spaCy's PhraseMatcher pass.
    matched = sorted(
        chunk
        for chunk in rules
        if tokenizer.find_prefix(chunk)
        or tokenizer.find_infix(chunk)
        or tokenizer.find_suffix(chunk)
        or " " in chunk
    )
    exported = {
        "source": f"spaCy {spacy.__version__} spacy.blank('en') tokenizer + Sentencizer defaults (MIT licence)",
        "prefix": tokenizer.prefix_search.__self__.pattern,
        "suffix": tokenizer.suffix_search.__self__.pattern,
        "infix": tokenizer.infix_finditer.__self__.pattern,
        "url": tokenizer.url_match.__self__.pattern,
        "special_cases": rules,
        "matcher_special_cases": matched,
        "sentence_punct_chars": sorted(Sentencizer.default_punct_chars),
    }
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(json.dumps(exported, ensure_ascii=False, indent=0, sort_keys=True) + "\n")
    print(f"wrote {TARGET} ({len(rules)} special cases, {len(matched)} through the matcher)")


if __name__ == "__main__":
    main()
