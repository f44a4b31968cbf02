"""The `decontaminate` section: which evaluation sets, which n-grams, drop or cut (docs/filtering.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.config import Section

SET_NAME = r"^[a-z][a-z0-9_.-]{0,39}$"


class EvalSet(Section):
    """One evaluation set whose n-grams training documents must not share; its name is the drop reason's."""

    name: str = Field(pattern=SET_NAME, description="drop reason contaminated:<name>")
    kind: Literal["heldout", "lm_eval", "file"] = Field(
        "file",
        description="heldout: this corpus's own validation documents and held-out evaluation task (of the "
        "snapshots before this one); lm_eval: lm-evaluation-harness tasks whose data is present locally; file: JSONL/Parquet/.txt",
    )
    path: str | None = Field(None, description="file: a file, folder or glob (JSONL, Parquet or .txt files)")
    fields: list[str] = Field(
        ["text"], min_length=1, description="file: the columns joined (by a space) into one item's text"
    )
    tasks: list[str] = Field(
        default_factory=list, description="lm_eval: task names, e.g. [hellaswag, arc_easy]"
    )
    include_path: str | None = Field(None, description="lm_eval: a folder of extra task YAMLs")
    snapshots: list[str] | None = Field(
        None,
        description="heldout: the snapshots to read (null: every complete one that sorts before the one "
        "decontaminated, so a rerun reads what the first run read)",
    )
    max_items: int | None = Field(None, gt=0, description="read at most this many items (a seeded sample)")

    @model_validator(mode="after")
    def _what_the_kind_needs(self) -> EvalSet:
        if self.kind == "file" and not self.path:
            raise ValueError(f"set {self.name!r}: kind file needs path")
        if self.kind == "lm_eval" and not self.tasks:
            raise ValueError(f"set {self.name!r}: kind lm_eval needs tasks")
        return self


class DecontaminateConfig(Section):
    sets: list[EvalSet] = Field(
        default_factory=lambda: [EvalSet(name="heldout", kind="heldout")],
        description="evaluation sets; the default is this corpus's own held-out documents of earlier snapshots",
    )
    ngram_size: int = Field(13, ge=3, le=50, description="words per n-gram (13, as GPT-3 and NeMo Curator)")
    min_ngram_size: int = Field(
        8,
        ge=1,
        description="an item shorter than ngram_size words but at least this long is one n-gram of its own "
        "length (GPT-3's and NeMo Curator's 8); items shorter still are skipped, counted",
    )
    mode: Literal["drop", "cut"] = Field(
        "drop",
        description="drop: a document sharing an n-gram goes to excluded/; cut: the shared spans (and "
        "cut_margin_chars around them) are cut out and the rest kept if long enough (GPT-3 style)",
    )
    cut_margin_chars: int = Field(200, ge=0, description="cut: characters removed on each side of a match")
    min_piece_chars: int = Field(200, ge=0, description="cut: pieces left shorter than this are discarded")
    max_pieces: int = Field(10, ge=1, description="cut: a document split into more pieces is dropped whole")
    max_matches: int | None = Field(
        10,
        ge=1,
        description="an n-gram found in more than this many documents is no evidence (an item sharing a licence "
        "line or a site's footer with the corpus): it drops or cuts nothing (NeMo Curator's 10); null: no cap",
    )
    broadcast_max_ngrams: int = Field(
        2_000_000,
        ge=0,
        description="an index of at most this many n-grams is broadcast to the workers; a larger one is joined",
    )

    @model_validator(mode="after")
    def _sizes(self) -> DecontaminateConfig:
        if self.min_ngram_size > self.ngram_size:
            raise ValueError("min_ngram_size must not exceed ngram_size")
        names = [s.name for s in self.sets]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"set names {repeated} appear more than once")
        return self
