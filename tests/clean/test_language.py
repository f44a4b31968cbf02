"""Language identification and the per-language configuration."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.clean.language import LANGID_LABELS, identify_language
from pipeline.config import load_config
from pipeline.core.config import ConfigError


def test_label_list_matches_the_shipped_model():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    assert set(LanguageIdentifier.from_model_file(MODEL_FILE).labels) == LANGID_LABELS


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("The river turned the wheel and the wheel drove the stones that ground the grain.", "en"),
        ("Die Stadt liegt an einem breiten Fluss, der seit Jahrhunderten die Mühlen antreibt.", "de"),
        ("茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材，用来提神和解渴。", "zh"),
    ],
)
def test_identifies_language_with_a_probability(text, lang):
    found, score = identify_language(text, 10_000)
    assert found == lang and 0.65 < score <= 1.0


def test_mixed_language_text_is_less_certain():
    english = "The river turned the wheel and the wheel drove the stones that ground the grain into flour."
    chinese = "茶起源于中国，已有数千年的历史。最初，人们把茶叶当作药材。"
    _, pure = identify_language(english * 2, 10_000)
    lang, mixed = identify_language(english + "\n" + chinese, 10_000)
    assert lang in {"en", "zh", "wuu"} and mixed < pure


def test_only_the_leading_characters_are_read():
    text = "The river turned the wheel and drove the stones. " * 4 + "茶起源于中国，已有数千年的历史。" * 200
    assert identify_language(text, 200)[0] == "en"
    assert identify_language(text, 100_000)[0] == "zh"


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("clean.languages=[en, xx]", "xx"),
        ("clean.min_language_score=1.5", "clean.min_language_score"),
        (
            "clean.language_overrides.zh.gopher_quality.min_avg_wordz=2",
            "language_overrides.zh.gopher_quality",
        ),
        ("clean.language_overrides.zh.nofilter.x=1", "nofilter"),
        (
            "clean.gopher_repetition.max_top_2_gram_char_frac=-1",
            "clean.gopher_repetition.max_top_2_gram_char_frac",
        ),
    ],
)
def test_bad_clean_settings_name_the_key(override, names):
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_config(overrides=[override], environ={})


def test_language_overrides_apply_to_their_language_only():
    config = load_config(
        overrides=["clean.language_overrides.de.gopher_quality.stop_words=[der, die, und]"], environ={}
    )
    assert config.clean.for_language("de").gopher_quality.stop_words == ["der", "die", "und"]
    assert config.clean.for_language("en").gopher_quality.stop_words[0] == "the"
    assert config.clean.for_language("zh").gopher_quality.stop_words is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "The river ",
                "turned the wheel. ",
                "Die Stadt ",
                "liegt am Fluss. ",
                "茶起源于中国，",
                "历史。",
                "ABC ",
                "42 ",
                "é",
                "\n",
                "  ",
                "—",
                "🙂",
            ]
        ),
        max_size=60,
    ).map("".join)
)
def test_vectorised_walk_returns_exactly_what_py3langid_returns(text):
    from pipeline.clean.language import _fast_identifier, _identifier

    assert _fast_identifier().classify(text) == _identifier().classify(text)


def test_vectorised_walk_on_longer_documents():
    import trafilatura

    from pipeline.clean.language import _fast_identifier, _identifier
    from tests.conftest import PROJECT_ROOT

    for path in sorted((PROJECT_ROOT / "pipeline" / "crawl" / "sample_site").rglob("*.html")):
        text = trafilatura.extract(path.read_text(), favor_precision=True) or path.read_text()
        assert _fast_identifier().classify(text) == _identifier().classify(text), path.name
