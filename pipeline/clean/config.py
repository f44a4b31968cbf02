"""The `clean` config section: length and language limits, the FineWeb recipe's filters, PII (docs/clean.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from pipeline.clean.url_filter import UrlFilterConfig
from pipeline.core.config import Section, UnicodeForm


class GopherRepetitionConfig(Section):
    """Gopher (Rae et al. 2021, table A1) repetition limits; datatrove's GopherRepetitionFilter. null disables."""

    enabled: bool = True
    max_dup_para_frac: float | None = Field(0.3, ge=0)
    max_dup_para_char_frac: float | None = Field(0.2, ge=0)
    max_dup_line_frac: float | None = Field(0.3, ge=0)
    max_dup_line_char_frac: float | None = Field(0.2, ge=0)
    max_top_2_gram_char_frac: float | None = Field(0.20, ge=0)
    max_top_3_gram_char_frac: float | None = Field(0.18, ge=0)
    max_top_4_gram_char_frac: float | None = Field(0.16, ge=0)
    max_dup_5_gram_char_frac: float | None = Field(0.15, ge=0)
    max_dup_6_gram_char_frac: float | None = Field(0.14, ge=0)
    max_dup_7_gram_char_frac: float | None = Field(0.13, ge=0)
    max_dup_8_gram_char_frac: float | None = Field(0.12, ge=0)
    max_dup_9_gram_char_frac: float | None = Field(0.11, ge=0)
    max_dup_10_gram_char_frac: float | None = Field(0.10, ge=0)


class GopherQualityConfig(Section):
    """Gopher quality heuristics; datatrove's GopherQualityFilter. null disables a rule."""

    enabled: bool = True
    min_doc_words: int | None = Field(50, ge=0)
    max_doc_words: int | None = Field(100_000, gt=0)
    min_avg_word_length: float | None = Field(3, ge=0)
    max_avg_word_length: float | None = Field(10, gt=0)
    max_symbol_word_ratio: float | None = Field(0.1, ge=0, description="for '#' and for ellipses")
    max_bullet_lines_ratio: float | None = Field(0.9, ge=0)
    max_ellipsis_lines_ratio: float | None = Field(0.3, ge=0)
    min_alpha_words_ratio: float | None = Field(0.8, ge=0, le=1)
    min_stop_words: int | None = Field(2, ge=0)
    stop_words: list[str] | None = Field(
        ["the", "be", "to", "of", "and", "that", "have", "with"],
        description="distinct ones a document must hold; null: no stop-word rule for the language",
    )


class C4Config(Section):
    """C4 line and document rules (Raffel et al. 2020); datatrove's C4QualityFilter.

    filter_no_terminal_punct defaults to FineWeb's run (false); the C4 paper's true is the fineweb_strict recipe.
    """

    enabled: bool = True
    remove_citations: bool = True
    filter_no_terminal_punct: bool = False
    end_punctuation: list[str] = Field([".", "?", "!", '"', "'"], min_length=1)
    min_num_sentences: int | None = Field(5, ge=0)
    min_words_per_line: int | None = Field(3, ge=0)
    max_word_length: int | None = Field(1000, gt=0)
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True


class FineWebConfig(Section):
    """FineWeb's own rules (Penedo et al. 2024); datatrove's FineWebQualityFilter."""

    enabled: bool = True
    min_line_punct_ratio: float | None = Field(0.12, ge=0, le=1)
    line_punct_exclude_zero: bool = False
    max_short_line_ratio: float | None = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    max_char_dup_ratio: float | None = Field(0.01, ge=0)
    max_newline_word_ratio: float | None = Field(0.3, ge=0)


class PiiConfig(Section):
    enabled: bool = True
    email_placeholder: str = "<EMAIL>"
    ip_placeholder: str = "<IP_ADDRESS>"
    phone_placeholder: str = "<PHONE_NUMBER>"


FILTER_SECTIONS = ("gopher_repetition", "gopher_quality", "c4", "fineweb")


def _chinese_overrides() -> dict[str, dict[str, Any]]:
    # jieba words average under two characters; Chinese has no Gopher stop-word list and ends
    # sentences with full-width punctuation.
    return {
        "zh": {
            "gopher_quality": {"min_avg_word_length": 1, "max_avg_word_length": 5, "stop_words": None},
            "c4": {"end_punctuation": [".", "?", "!", '"', "'", "。", "！", "？", "”", "」"]},
        }
    }


# Named recipes: section values they set, under anything the config gives explicitly.
RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    # FineWeb exactly as its run was made: datatrove's examples/fineweb.py (see docs/clean.md).
    "fineweb": {},
    # The same plus C4's rule that drops every line without terminal punctuation (the C4 paper's default,
    # and this project's default until 2026-12): keeps fewer, more prose-like lines.
    "fineweb_strict": {"c4": {"filter_no_terminal_punct": True}},
}


class CleanConfig(Section):
    recipe: Literal["fineweb", "fineweb_strict"] = Field(
        "fineweb", description="named filter settings (RECIPES); explicit clean.* keys override them"
    )
    unicode_form: UnicodeForm = Field(
        "NFC",
        description="Unicode normal form of the kept text: NFC keeps it as written (as FineWeb does); NFKC also "
        "folds full-width punctuation, ligatures and the like into ASCII (docs/clean.md)",
    )
    min_chars: int = Field(100, ge=0, description="shorter (normalised) texts are dropped before the filters")
    max_chars: int = Field(1_000_000, gt=0, description="longer raw texts are quarantined before any work")
    languages: list[str] = Field(["en"], min_length=1, description="language codes kept (py3langid labels)")
    min_language_score: float = Field(0.65, ge=0, le=1, description="FineWeb's threshold, for every language")
    language_min_scores: dict[str, float] = Field(
        default_factory=dict,
        description="per language, a threshold that replaces min_language_score: {zh: 0.5}",
    )
    language_groups: dict[str, list[str]] = Field(
        default_factory=lambda: {"zh": ["zh", "wuu", "yue"]},
        description="labels identified as one language, their probabilities summed: classical Chinese is "
        "often labelled wuu or yue with its probability split between them and zh; {} keeps them apart",
    )
    langid_max_chars: int = Field(10_000, gt=0, description="language id reads this many leading characters")
    gopher_repetition: GopherRepetitionConfig = Field(default_factory=GopherRepetitionConfig)
    gopher_quality: GopherQualityConfig = Field(default_factory=GopherQualityConfig)
    c4: C4Config = Field(default_factory=C4Config)
    fineweb: FineWebConfig = Field(default_factory=FineWebConfig)
    language_overrides: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=_chinese_overrides,
        description="per language, filter fields that replace the defaults above: {zh: {c4: {...}}}",
    )
    pii: PiiConfig = Field(default_factory=PiiConfig)
    url_filter: UrlFilterConfig = Field(
        default_factory=UrlFilterConfig,
        description="URL blocklists (UT1 layout or plain), banned and soft-banned URL words, allow-lists; "
        "checked before a page is extracted (none ship: name your lists)",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_recipe(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for section, fields in RECIPES.get(data.get("recipe", "fineweb"), {}).items():
            given = data.get(section, {})
            if isinstance(given, dict):
                data = {**data, section: {**fields, **given}}
        return data

    @field_validator("language_overrides", mode="before")
    @classmethod
    def _keep_default_overrides(cls, value: Any) -> Any:
        """Setting clean.language_overrides.de.* must not silently drop the Chinese defaults."""
        if not isinstance(value, dict):
            return value
        merged = _chinese_overrides()
        for lang, sections in value.items():
            if not isinstance(sections, dict):
                merged[lang] = sections
                continue
            target = merged.setdefault(lang, {})
            for section, fields in sections.items():
                if isinstance(fields, dict) and isinstance(target.get(section), dict):
                    target[section] = {**target[section], **fields}
                else:
                    target[section] = fields
        return merged

    @model_validator(mode="after")
    def _bounds(self) -> CleanConfig:
        if self.min_chars >= self.max_chars:
            raise ValueError("min_chars must be below max_chars")
        from pipeline.clean.language import LANGID_LABELS

        unknown = sorted(set(self.languages) - LANGID_LABELS)
        if unknown:
            raise ValueError(f"languages {unknown} are not py3langid labels; known: {sorted(LANGID_LABELS)}")
        for name, members in self.language_groups.items():
            bad = sorted({name, *members} - LANGID_LABELS)
            if bad:
                raise ValueError(f"language_groups.{name}: {bad} are not py3langid labels")
        for lang, score in self.language_min_scores.items():
            if not 0 <= score <= 1:
                raise ValueError(f"language_min_scores.{lang} must lie in [0, 1], got {score}")
        for lang in self.language_overrides:
            self.for_language(lang)  # fails here, naming the language, if an override is invalid
        return self

    def min_score_for(self, lang: str | None) -> float:
        return self.language_min_scores.get(lang or "", self.min_language_score)

    def for_language(self, lang: str | None) -> CleanConfig:
        """This config with ``language_overrides[lang]`` applied to the filter sections."""
        overrides = self.language_overrides.get(lang or "", {})
        if not overrides:
            return self
        unknown = sorted(set(overrides) - set(FILTER_SECTIONS))
        if unknown:
            raise ValueError(
                f"language_overrides.{lang}: unknown section(s) {unknown}; known: {FILTER_SECTIONS}"
            )
        update = {}
        for section, fields in overrides.items():
            current = getattr(self, section)
            try:
                update[section] = type(current).model_validate({**current.model_dump(), **fields})
            except ValidationError as exc:
                raise ValueError(f"language_overrides.{lang}.{section}: {exc.errors()[0]['msg']}") from None
        return self.model_copy(update=update)
