"""`pretrain card`: a Hugging Face dataset card (``README.md``) beside a published documents output.

The card is what FineWeb, FineWeb2 and DCLM publish with each corpus: YAML metadata the Hub reads
(``language``, ``size_categories``, ``license``, ``configs`` pointing at ``documents/*.parquet``, ...), then
how the documents were made and what was removed and why. Every figure comes from what the pipeline already
recorded: the output's manifest, the manifests it was made from (the drop funnel, ``funnel``), the tokenize
output that read it; only the languages are counted, from the documents' ``lang`` column, and their total must
equal the manifest's document count.

The card sits outside the output's checksummed set (a manifest lists the files published with it, and
README.md is not one of them), so writing it changes nothing a reader verifies. It is written to a temporary
name and renamed into place, under the output's lock. Re-running the stage replaces the whole folder, card
included: run `pretrain card` again then.
"""

from __future__ import annotations

import argparse
import os
import re
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from pipeline.config import PipelineConfig
from pipeline.core.cli import run_cli
from pipeline.core.locks import OutputLock
from pipeline.core.manifest import DamagedInputError, Manifest
from pipeline.core.storage import DatasetRef, MissingInputError
from pipeline.entrypoint import resolve, stage_parser
from pipeline.quality.funnel import Step, filtering_details, funnel, lineage
from pipeline.stages import STAGES, Stage, group, training_input

CARD_NAME = "README.md"
DOCUMENTS = "documents"  # the folder of a documents output that the card's `configs` points at
PLACEHOLDER_LICENSE = "other"
# The Hub's license ids are lowercase SPDX-like names (apache-2.0, cc-by-4.0, odc-by, other).
LICENSE_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
# A language code the Hub's `language` field takes (ISO 639-1/2/3, BCP-47-like), as py3langid's labels are.
# Clean's "und" (no language identified) names none, so it stays out of the field; the card's table counts
# every value.
LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
UNDETERMINED = "und"
# The Hub's size_categories, by number of rows: (upper bound, label).
SIZE_CATEGORIES = (
    (1_000, "n<1K"),
    (10_000, "1K<n<10K"),
    (100_000, "10K<n<100K"),
    (1_000_000, "100K<n<1M"),
    (10_000_000, "1M<n<10M"),
    (100_000_000, "10M<n<100M"),
    (1_000_000_000, "100M<n<1B"),
    (10_000_000_000, "1B<n<10B"),
    (100_000_000_000, "10B<n<100B"),
    (1_000_000_000_000, "100B<n<1T"),
)


def size_category(rows: int) -> str:
    for bound, label in SIZE_CATEGORIES:
        if rows < bound:
            return label
    return "n>1T"


def card_stages() -> list[Stage]:
    """The corpus stages an output of which may hold documents, in the registry's order."""
    return group("corpus", reports=False)


def has_documents(ref: DatasetRef) -> bool:
    """A complete output with a ``documents/`` folder whose manifest counts its documents."""
    return ref.is_complete() and (ref.path / DOCUMENTS).is_dir() and DOCUMENTS in ref.manifest().rows


def documents_output(config: PipelineConfig, snapshot: str, stage: str | None = None) -> DatasetRef:
    """``stage``'s output of ``snapshot``, or (no stage) the latest one in pipeline order that holds documents;
    MissingInputError when there is none, DamagedInputError when it is not as published."""
    if stage is not None:
        ref = DatasetRef.of(config, stage, snapshot).require()
        if not has_documents(ref):
            raise MissingInputError(
                f"the {stage} output of snapshot {snapshot!r} at {ref.path} holds no {DOCUMENTS}/ "
                f"(its rows: {sorted(ref.manifest().rows)}); a card describes a documents output"
            )
        return ref
    candidates = [DatasetRef.of(config, entry.name, snapshot) for entry in reversed(card_stages())]
    for ref in candidates:
        if has_documents(ref):
            return ref.require()
    raise MissingInputError(
        f"no complete documents output for snapshot {snapshot!r} under "
        f"{config.project.data_root}/{config.project.corpus} (looked for {', '.join(r.stage for r in candidates)})"
    )


def document_files(manifest: Manifest) -> list[str]:
    """The Parquet files of ``documents/`` the manifest lists (the published set, not whatever is there)."""
    return sorted(
        name for name in manifest.files if name.startswith(f"{DOCUMENTS}/") and name.endswith(".parquet")
    )


def count_languages(folder: Path, files: Iterable[str]) -> Counter[str | None]:
    """Documents per value of the ``lang`` column (None: no language), one batch at a time; without a
    ``lang`` column (an ingest output) every document counts as None."""
    counts: Counter[str | None] = Counter()
    for name in files:
        parquet = pq.ParquetFile(folder / name)
        if "lang" not in parquet.schema_arrow.names:
            counts[None] += parquet.metadata.num_rows
            continue
        for batch in parquet.iter_batches(columns=["lang"], batch_size=65_536):
            for entry in pc.value_counts(batch.column(0)).to_pylist():
                counts[entry["values"]] += entry["counts"]
    return counts


def uncompressed_bytes(path: Path) -> int:
    """The data's size before compression, from the Parquet footer (the Hub's ``num_bytes``)."""
    footer = pq.ParquetFile(path).metadata
    return sum(footer.row_group(index).total_byte_size for index in range(footer.num_row_groups))


@dataclass(frozen=True)
class Tokens:
    """One tokenize output of the same documents: its tokenizer and what it made of them."""

    tokenizer: str
    kind: str
    digest: str
    vocab_size: int | None
    documents: dict[str, int]  # per split
    tokens: dict[str, int]  # per split


def tokens_of(config: PipelineConfig, documents: Manifest) -> list[Tokens]:
    """The token counts of the snapshot's tokenize output, when it read exactly these documents (the same
    manifest digest); an output made from another stage or an earlier version describes other documents."""
    ref = DatasetRef.of(config, training_input().name, documents.snapshot)
    if not ref.is_complete():
        return []
    manifest = ref.manifest()
    if not any(
        item.get("path") == documents.path and item.get("digest") == documents.digest
        for item in manifest.inputs
    ):
        return []
    tokenizer = manifest.extra.get("tokenizer") or {}
    splits = manifest.counters.get("tokens") or {}
    return [
        Tokens(
            tokenizer=tokenizer.get("name") or f"{ref.corpus}/{ref.snapshot} (its own BPE)",
            kind=str(tokenizer.get("kind", "")),
            digest=str(tokenizer.get("digest", "")),
            vocab_size=manifest.extra.get("vocab_size"),
            documents={split: int(manifest.rows.get(f"{split}_documents", 0)) for split in splits},
            tokens={split: int(count) for split, count in splits.items()},
        )
    ]


def report_links(config: PipelineConfig, documents: Manifest) -> list[tuple[str, str]]:
    """(stage, path relative to the card) of each report made from exactly these documents."""
    links = []
    for entry in STAGES:
        if not entry.report:
            continue
        ref = DatasetRef.of(config, entry.name, documents.snapshot)
        if not ref.is_complete():
            continue
        manifest = ref.manifest()
        pages = [name for name in entry.artifacts if name.endswith(".html") and name in manifest.files]
        if pages and any(item.get("digest") == documents.digest for item in manifest.inputs):
            links.append((entry.name, os.path.relpath(ref.path / pages[0], documents.path)))
    return links


def card_link(documents: DatasetRef, page_folder: Path) -> str | None:
    """The card of ``documents`` as a link from a page published in ``page_folder`` (relative, so the data
    root can move), or None when the output has no card."""
    card = documents.path / CARD_NAME
    return os.path.relpath(card, page_folder) if card.is_file() else None


# --- the card -----------------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, int):
        return f"{value:,}"
    # A pipe would end the Markdown table's cell.
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def metadata(
    manifest: Manifest,
    languages: Counter[str | None],
    files: Sequence[str],
    uncompressed: int,
    license_id: str,
) -> dict[str, Any]:
    """The YAML front matter, in the Hub's DatasetCardData fields."""
    documents = int(manifest.rows[DOCUMENTS])
    codes = sorted(
        code
        for code in languages
        if code is not None and code != UNDETERMINED and LANGUAGE_CODE.fullmatch(code)
    )
    data: dict[str, Any] = {
        "pretty_name": f"{manifest.corpus} {manifest.snapshot}",
        "language": codes,
        "license": license_id,
        "multilinguality": "multilingual" if len(codes) > 1 else "monolingual",
        "size_categories": [size_category(documents)],
        "source_datasets": ["original"],
        "annotations_creators": ["no-annotation"],
        "language_creators": ["found"],
        "task_categories": ["text-generation"],
        "task_ids": ["language-modeling"],
        "tags": ["pretraining", "web"],
        "configs": [
            {"config_name": "default", "data_files": [{"split": "train", "path": f"{DOCUMENTS}/*.parquet"}]}
        ],
        "dataset_info": {
            "splits": [{"name": "train", "num_bytes": uncompressed, "num_examples": documents}],
            "download_size": sum(manifest.files[name].bytes for name in files),
            "dataset_size": uncompressed,
        },
    }
    if not codes:
        del data["language"], data["multilinguality"]
    return data


def _funnel_section(steps: Sequence[Step], chain: Sequence[Manifest]) -> str:
    notes = [
        f"- The {upstream.stage} output was re-run after {downstream.stage} read it (digest "
        f"{downstream.inputs[0].get('digest')} then, {upstream.digest} now): its rows describe the new one."
        for upstream, downstream in pairwise(chain)
        if downstream.inputs and downstream.inputs[0].get("digest") != upstream.digest
    ]
    rows = [[step.stage, step.reason, step.documents, step.characters] for step in steps]
    return "\n\n".join(
        [
            "## What was removed, and why\n\nEach stage counts the documents it drops by reason; read from the "
            "manifests along the chain, oldest first. The first row is what went in; it equals the drops plus "
            "the documents kept.",
            _table(["stage", "reason", "documents", "characters"], rows),
            *(["\n".join(notes)] if notes else []),
        ]
    )


def _recipe_section(chain: Sequence[Manifest], manifest: Manifest) -> str:
    rows = [
        [
            m.stage,
            m.snapshot,
            m.rows.get(DOCUMENTS, m.rows.get("pages")),
            m.config_hash,
            m.code_version,
            m.created_at,
        ]
        for m in chain
    ]
    details = filtering_details(manifest)
    parts = [
        "## How it was made\n\nThe stages that made these documents (pretrain-pipeline; each stage's manifest "
        "records its config hash and code version; the same config and input give the same bytes):",
        _table(["stage", "snapshot", "documents out", "config hash", "code version", "written"], rows),
    ]
    classifiers = details["classifiers"]
    if classifiers:
        parts.append(
            _table(
                ["quality classifier", "kind", "sha256", "cut", "dropped"],
                [
                    [
                        name,
                        r.get("kind"),
                        (r.get("sha256") or "")[:12],
                        (r.get("cut") or {}).get("mode"),
                        r.get("dropped"),
                    ]
                    for name, r in classifiers.items()
                ],
            )
        )
    contamination = details["decontamination"]
    if contamination.get("sets"):
        parts.append(
            f"Decontamination: documents sharing a {contamination.get('ngram_size')}-gram with an evaluation set "
            f"({contamination.get('mode')}):\n\n"
            + _table(
                ["evaluation set", "kind", "items", "documents dropped"],
                [
                    [
                        name,
                        s.get("kind"),
                        s.get("items"),
                        contamination.get("dropped", {}).get(f"contaminated:{name}", 0),
                    ]
                    for name, s in contamination["sets"].items()
                ],
            )
        )
    return "\n\n".join(parts)


def _tokens_section(tokens: Sequence[Tokens]) -> str:
    if not tokens:
        return ""
    rows = [
        [t.tokenizer, t.kind, t.digest, t.vocab_size, split, t.documents.get(split), count]
        for t in tokens
        for split, count in t.tokens.items()
    ]
    return "## Tokens\n\nWhat the snapshot's tokenize output made of exactly these documents:\n\n" + _table(
        ["tokenizer", "kind", "digest", "vocabulary", "split", "documents", "tokens"], rows
    )


def _license_section(license_id: str) -> str:
    if license_id != PLACEHOLDER_LICENSE:
        return f"## Licence\n\n`{license_id}` (set by `pretrain card --license {license_id}`)."
    return (
        "## Licence\n\n**TODO (licence):** the pipeline cannot know the terms these documents may be shared under: "
        "each page's text belongs to its publisher, and the crawl's or source corpus's own terms apply. Fill in "
        "the `license:` field above (`license: other` is a placeholder) and this section before handing the "
        "corpus on, or write the card again with `pretrain card --snapshot S --license ID` (a Hub licence id "
        "such as `odc-by` or `cc-by-4.0`)."
    )


def card_text(
    ref: DatasetRef, manifest: Manifest, config: PipelineConfig, license_id: str
) -> tuple[str, dict[str, Any]]:
    """The card's Markdown and its metadata; DamagedInputError when the documents do not add up to the
    manifest's count."""
    files = document_files(manifest)
    languages = count_languages(ref.path, files)
    documents = int(manifest.rows[DOCUMENTS])
    if sum(languages.values()) != documents:
        raise DamagedInputError(
            f"{ref.path / DOCUMENTS} holds {sum(languages.values())} documents, its manifest counts {documents}; "
            f"{ref.rerun_hint}"
        )
    uncompressed = sum(uncompressed_bytes(ref.path / name) for name in files)
    data = metadata(manifest, languages, files, uncompressed, license_id)
    chain = lineage(manifest)
    characters = manifest.counters.get("kept_chars")
    schema = pq.ParquetFile(ref.path / files[0]).schema_arrow if files else None
    language_rows = [
        [code if code is not None else "(none)", count, f"{count / documents:.2%}"]
        for code, count in sorted(languages.items(), key=lambda item: (-item[1], str(item[0])))
    ]
    links = report_links(config, manifest)
    sections = [
        f"# {data['pretty_name']}",
        f"{documents:,} documents"
        + (f" ({int(characters):,} characters)" if characters is not None else "")
        + f" in {len(files)} Parquet files ({data['dataset_info']['download_size']:,} bytes): the output of the "
        f"`{manifest.stage}` stage for snapshot `{manifest.snapshot}` of the corpus `{manifest.corpus}`, "
        f"written {manifest.created_at}."
        + "".join(f" The data-quality report: [{stage}]({path})." for stage, path in links),
        "This folder (or a copy of it) loads as it is: the card's `configs` name `documents/*.parquet`.\n\n"
        "```python\nfrom datasets import load_dataset\n\n"
        f'documents = load_dataset("{ref.path}", split="train")\n```',
        "## Languages\n\nCounted from the documents' `lang` column (clean's language identification).\n\n"
        + _table(["language", "documents", "share"], language_rows),
        _recipe_section(chain, manifest),
        _funnel_section(funnel(manifest), chain),
        _tokens_section(tokens_of(config, manifest)),
        "## Columns\n\n"
        + _table(["column", "type"], [[field.name, str(field.type)] for field in schema or []]),
        _license_section(license_id),
        "## Provenance\n\n"
        + _table(
            ["field", "value"],
            [
                ["output", str(ref.path)],
                ["manifest digest", manifest.digest],
                ["config hash", manifest.config_hash],
                ["code version", manifest.code_version],
                ["created", manifest.created_at],
            ],
        )
        + f"\n\nThis card is not one of the files `manifest.json` lists; re-running `pretrain {manifest.stage}` "
        "replaces the output without it. Written by `pretrain card`.",
    ]
    front = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return "---\n" + front + "---\n\n" + "\n\n".join(s for s in sections if s) + "\n", data


def write_card(ref: DatasetRef, config: PipelineConfig, license_id: str = PLACEHOLDER_LICENSE) -> Path:
    """``ref``'s card as ``README.md`` beside its manifest, replaced in one rename; under the output's lock,
    so no run of the stage replaces the output between the manifest read and the card's rename."""
    with OutputLock(ref.path, what=ref.what):
        manifest = ref.require().manifest()
        text, _ = card_text(ref, manifest, config, license_id)
        final = ref.path / CARD_NAME
        temporary = ref.path / f".{CARD_NAME}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, final)
        finally:
            temporary.unlink(missing_ok=True)
    return final


def license_id(value: str) -> str:
    if not LICENSE_PATTERN.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a licence id (lowercase, e.g. odc-by, cc-by-4.0, other)"
        )
    return value


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain card", __doc__ or "")
    parser.add_argument(
        "--stage",
        choices=[entry.name for entry in card_stages()],
        metavar="STAGE",
        help="the output to describe (default: the latest stage, in pipeline order, with documents for the snapshot)",
    )
    parser.add_argument(
        "--license",
        type=license_id,
        default=PLACEHOLDER_LICENSE,
        help=f"the card's licence id (default: {PLACEHOLDER_LICENSE}, with a TODO to fill in)",
    )
    args = parser.parse_args(argv)
    config, snapshot = resolve(args)
    ref = documents_output(config, snapshot, args.stage)
    print(write_card(ref, config, args.license))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
