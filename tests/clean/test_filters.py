"""Every recipe rule on hand-made documents at, above and below its threshold, and the vectorised signals
against a literal re-statement of datatrove's arithmetic (tests/clean/reference.py)."""

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.clean.filters import DocumentSignals, first_failing, recipe_rules
from pipeline.clean.filters import c4 as c4_filter
from pipeline.clean.filters import fineweb as fineweb_filter
from pipeline.config import load_config
from pipeline.documents.normalize import normalize_text
from tests.clean import reference

ROOT = Path(__file__).resolve().parents[2]
CONFIG = load_config(environ={}).clean
RULES = {rule.name: rule for rule in recipe_rules(CONFIG, sorted(CONFIG.language_overrides))}
DOCUMENTS = DocumentSignals(CONFIG)


def signals_of(text: str, lang: str = "en") -> dict:
    return DOCUMENTS.compute(text, lang)[0]


def drops(rule: str, text: str, lang: str = "en") -> bool:
    return RULES[rule].drops(signals_of(text, lang), lang)


def pad_to(text: str, length: int) -> str:
    """Append distinct filler words (q, r, ..., qq, qr, ...) until the text is exactly ``length`` long."""
    used: dict[int, int] = {}

    def filler(size: int) -> str:
        index = used[size] = used.get(size, -1) + 1
        letters = []
        for _ in range(size):
            index, digit = divmod(index, 10)
            letters.append("qrstuvwxyz"[digit])
        assert index == 0, "ran out of fillers"
        return "".join(letters)

    while len(text) < length:
        remaining = length - len(text) - 1  # one space before the word
        text += " " + filler(min(remaining, 3)) if remaining > 0 else " "
    assert len(text) == length
    return text


# --- a threshold is inclusive: a document exactly at it stays -----------------------------------------


@pytest.mark.parametrize("name", sorted(name for name, rule in RULES.items() if rule.op != "=="))
def test_every_rule_keeps_at_threshold_and_drops_beyond(name):
    rule = RULES[name]
    threshold = rule.threshold("en")
    filter_name, signal = rule.signal.split(".")
    at = {filter_name: {signal: threshold}}
    step = 1 if isinstance(threshold, int) else 1e-9
    beyond = {filter_name: {signal: threshold + (step if rule.op == ">" else -step)}}
    inside = {filter_name: {signal: threshold - (step if rule.op == ">" else -step)}}
    assert not rule.drops(at, "en")
    assert rule.drops(beyond, "en")
    assert not rule.drops(inside, "en")
    assert not rule.drops({filter_name: {signal: None}}, "en"), "a missing signal never drops"


# --- Gopher quality ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("words", "dropped"), [(49, True), (50, False), (51, False)])
def test_min_doc_words(words, dropped):
    assert drops("gopher_quality.min_doc_words", " ".join(["alpha"] * words)) is dropped


@pytest.mark.parametrize(("words", "dropped"), [(99_999, False), (100_000, False), (100_001, True)])
def test_max_doc_words(words, dropped):
    assert drops("gopher_quality.max_doc_words", " ".join(["ab"] * words)) is dropped


@pytest.mark.parametrize(
    ("rule", "odd_length", "dropped"),
    [
        ("gopher_quality.min_avg_word_length", 2, True),  # mean 2.98
        ("gopher_quality.min_avg_word_length", 3, False),  # mean 3
        ("gopher_quality.min_avg_word_length", 4, False),  # mean 3.02
        ("gopher_quality.max_avg_word_length", 9, False),
        ("gopher_quality.max_avg_word_length", 10, False),
        ("gopher_quality.max_avg_word_length", 11, True),
    ],
)
def test_avg_word_length(rule, odd_length, dropped):
    base = 3 if rule.endswith("min_avg_word_length") else 10
    text = " ".join(["x" * base] * 49 + ["y" * odd_length])
    assert drops(rule, text) is dropped


@pytest.mark.parametrize(
    ("symbol", "rule"), [("#", "max_hash_word_ratio"), ("...", "max_ellipsis_word_ratio")]
)
@pytest.mark.parametrize(("count", "dropped"), [(9, False), (10, False), (11, True)])
def test_symbol_word_ratio(symbol, rule, count, dropped):
    tokens = ["word"] * (100 - count) + [symbol] * count  # 100 tokens
    random.Random(count).shuffle(tokens)
    assert signals_of(" ".join(tokens))["gopher_quality"]["n_words"] == 100
    assert drops(f"gopher_quality.{rule}", " ".join(tokens)) is dropped


def test_unicode_ellipsis_counts_too():
    text = " ".join(["word"] * 89 + ["…"] * 11)
    assert drops("gopher_quality.max_ellipsis_word_ratio", text)


@pytest.mark.parametrize(("bullets", "dropped"), [(8, False), (9, False), (10, True)])
def test_bullet_lines(bullets, dropped):
    lines = [("- " if i < bullets // 2 else "• ") + f"item number {i}." for i in range(bullets)]
    lines += [f"Plain line number {i}." for i in range(10 - bullets)]
    assert drops("gopher_quality.max_bullet_lines_ratio", "\n".join(lines)) is dropped


@pytest.mark.parametrize(("ellipsis_lines", "dropped"), [(2, False), (3, False), (4, True)])
def test_ellipsis_lines(ellipsis_lines, dropped):
    lines = [f"A line that trails off {i}..." for i in range(ellipsis_lines)]
    lines += [f"A line that ends well {i}." for i in range(10 - ellipsis_lines)]
    assert drops("gopher_quality.max_ellipsis_lines_ratio", "\n".join(lines)) is dropped


@pytest.mark.parametrize(("alpha", "dropped"), [(79, True), (80, False), (81, False)])
def test_alpha_words_ratio(alpha, dropped):
    tokens = ["word"] * alpha + ["1234"] * (100 - alpha)
    assert drops("gopher_quality.min_alpha_words_ratio", " ".join(tokens)) is dropped


@pytest.mark.parametrize(
    ("stop_words", "dropped"), [(["of"], True), (["the", "of"], False), (["the", "of", "and"], False)]
)
def test_stop_words_are_distinct_and_case_sensitive(stop_words, dropped):
    text = " ".join(["The", "The", "Of", *stop_words, *stop_words, "river", "mill"])
    assert drops("gopher_quality.min_stop_words", text) is dropped


def test_chinese_is_never_dropped_for_stop_words():
    text = "茶起源于中国，已有数千年的历史。" * 3
    signals = signals_of(text, "zh")
    assert signals["gopher_quality"]["n_stop_words"] is None
    assert not RULES["gopher_quality.min_stop_words"].drops(signals, "zh")
    assert not RULES["gopher_quality.min_stop_words"].drops({"gopher_quality": {"n_stop_words": 0}}, "zh")
    assert RULES["gopher_quality.min_stop_words"].drops({"gopher_quality": {"n_stop_words": 0}}, "en")


# --- Gopher repetition -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("unit", "rule"), [("\n\n", "dup_para_frac"), ("\n", "dup_line_frac")])
@pytest.mark.parametrize(("duplicates", "dropped"), [(2, False), (3, False), (4, True)])
def test_duplicate_paragraph_and_line_fraction(unit, rule, duplicates, dropped):
    blocks = [f"Block number {i} says something new." for i in range(10 - duplicates)]
    blocks += [blocks[0]] * duplicates  # 10 blocks, `duplicates` of them repeats
    assert drops(f"gopher_repetition.{rule}", unit.join(blocks)) is dropped


@pytest.mark.parametrize(("unit", "rule"), [("\n\n", "dup_para_char_frac"), ("\n", "dup_line_char_frac")])
@pytest.mark.parametrize(("extra", "dropped"), [(-1, False), (0, False), (1, True)])
def test_duplicate_paragraph_and_line_characters(unit, rule, extra, dropped):
    # Repeated block of 20 (+extra) characters in a 100-character text: exactly 0.2 at extra=0.
    repeated = "r" * (20 + extra)
    first = "a" * 10
    middle_length = 100 - len(first) - 2 * len(repeated) - 3 * len(unit)
    text = unit.join([first, repeated, "m" * middle_length, repeated])
    assert len(text) == 100
    assert drops(f"gopher_repetition.{rule}", text) is dropped


TOP_GRAMS = {2: ["ab", "cd"], 3: ["abc", "de", "fg"], 4: ["ab", "c", "d", "e"]}  # 5, 9, 8 chars joined


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize(("grow", "dropped"), [(-1, False), (0, False), (1, True)])
def test_top_ngram_character_fraction(n, grow, dropped):
    threshold = RULES[f"gopher_repetition.top_{n}_gram_char_frac"].threshold("en")
    gram = list(TOP_GRAMS[n])
    count = round(threshold * 100) // (len(" ".join(gram)))
    gram[0] = gram[0][0] * (len(gram[0]) + grow)
    pieces = []
    for index in range(count):
        pieces += [*gram, f"z{'z' * index}"]
    text = pad_to(" ".join(pieces), 100)
    assert drops(f"gopher_repetition.top_{n}_gram_char_frac", text) is dropped


@pytest.mark.parametrize("n", [5, 6, 7, 8, 9, 10])
@pytest.mark.parametrize(("grow", "dropped"), [(-1, False), (0, False), (1, True)])
def test_duplicated_ngram_character_fraction(n, grow, dropped):
    threshold = RULES[f"gopher_repetition.dup_{n}_gram_char_frac"].threshold("en")
    target = round(threshold * 100) + grow  # repeated characters in a 100-character text
    lengths = [target // n + (1 if i < target % n else 0) for i in range(n)]
    gram = [chr(ord("a") + i) * length for i, length in enumerate(lengths)]
    text = pad_to(" ".join([*gram, "zz", *gram]), 100)
    assert drops(f"gopher_repetition.dup_{n}_gram_char_frac", text) is dropped


# --- C4 ---------------------------------------------------------------------------------------------------

GOOD_LINES = [
    "The river turned the wheel all day long.",
    "Millers built weirs to raise the water level.",
    "Towns grew along the banks of the river.",
    "Bakers and brewers settled close to the mill.",
    "Roads followed the river and bridges followed the roads.",
    "Markets appeared wherever the bridges crossed.",
]


@pytest.mark.parametrize(("sentences", "dropped"), [(4, True), (5, False), (6, False)])
def test_min_num_sentences(sentences, dropped):
    assert drops("c4.min_num_sentences", "\n".join(GOOD_LINES[:sentences])) is dropped


LINE_REMOVAL_TEXT = "\n".join(
    [
        "A heading without a full stop",
        "Too short.",
        "Enable JavaScript to see this page properly.",
        "This site uses cookies to improve your experience.",
        "Read our privacy policy and terms of use.",
        "It trails off into nothing...",
        "A word " + "w" * 1001 + " is far too long.",
        "A word " + "w" * 1000 + " is just short enough.",
        "Mills shaped towns for centuries.[1] They still matter.[citation needed]",
        *GOOD_LINES[:3],
    ]
)


def test_line_removals_and_citations_of_the_strict_recipe():
    """fineweb_strict: C4's terminal-punctuation line rule too (the C4 paper's default)."""
    strict = load_config(overrides=["clean.recipe=fineweb_strict"], environ={}).clean
    result = c4_filter.apply(
        LINE_REMOVAL_TEXT, strict.c4, str.split, DOCUMENTS.tokenizers.for_language("en").sentences_and_words
    )
    assert result.text.split("\n") == [
        "A word " + "w" * 1000 + " is just short enough.",
        "Mills shaped towns for centuries. They still matter.",
        *GOOD_LINES[:3],
    ]
    assert result.signals == {
        "lines": 12,
        "lines_kept": 5,
        "lines_too_long_word": 1,
        "lines_no_terminal_punct": 2,
        "lines_too_few_words": 1,
        "lines_javascript": 1,
        "lines_policy": 2,
        "citations_removed": 2,
        "sentences": 6,
        "doc_drop": None,
    }


def test_the_default_recipe_is_fineweb_runs_c4_without_the_terminal_punctuation_rule():
    """datatrove's examples/fineweb.py runs C4QualityFilter(filter_no_terminal_punct=False)."""
    assert CONFIG.recipe == "fineweb" and CONFIG.c4.filter_no_terminal_punct is False
    result = c4_filter.apply(
        LINE_REMOVAL_TEXT, CONFIG.c4, str.split, DOCUMENTS.tokenizers.for_language("en").sentences_and_words
    )
    assert result.text.split("\n") == [
        "A heading without a full stop",
        "It trails off into nothing...",
        "A word " + "w" * 1000 + " is just short enough.",
        "Mills shaped towns for centuries. They still matter.",
        *GOOD_LINES[:3],
    ]
    assert result.signals["lines_no_terminal_punct"] == 0 and result.signals["lines_kept"] == 7


def test_explicit_keys_win_over_the_recipe():
    config = load_config(
        overrides=["clean.recipe=fineweb_strict", "clean.c4.filter_no_terminal_punct=false"], environ={}
    )
    assert config.clean.c4.filter_no_terminal_punct is False


def test_document_drops_follow_line_order():
    javascript_brace = "\n".join([*GOOD_LINES, "Use javascript like function() { return 1; }."])
    assert not drops("c4.curly_bracket", javascript_brace), "the javascript line is removed first"
    assert drops("c4.curly_bracket", "\n".join([*GOOD_LINES, "A set looks like {1, 2, 3} here."]))
    assert not drops("c4.curly_bracket", "\n".join([*GOOD_LINES, "{"])), "a one-word line is removed first"
    lorem = "\n".join([*GOOD_LINES, "Lorem ipsum dolor sit amet, consectetur."])
    assert drops("c4.lorem_ipsum", lorem)
    assert signals_of(lorem)["c4"]["sentences"] == 7, "later lines still count"


def test_kept_document_text_is_c4_output():
    text = "Please enable JavaScript to read this page.\n" + "\n".join(GOOD_LINES)  # C4 removes it
    signals, filtered = DOCUMENTS.compute(text, "en")
    assert filtered == "\n".join(GOOD_LINES)
    assert signals["fineweb"]["lines"] == len(GOOD_LINES), "FineWeb reads C4's output, as in the recipe"


# --- FineWeb ----------------------------------------------------------------------------------------------


def fineweb_drops(rule: str, text: str) -> bool:
    words = DOCUMENTS.tokenizers.for_language("en").words(text)
    return RULES[rule].drops({"fineweb": fineweb_filter.signals(text, len(words), 30)}, "en")


@pytest.mark.parametrize(("ending", "dropped"), [(2, True), (3, False), (4, False)])
def test_line_punct_ratio(ending, dropped):
    lines = [f"line {i} ends well." for i in range(ending)] + [
        f"line {i} has no end" for i in range(25 - ending)
    ]
    assert fineweb_drops("fineweb.min_line_punct_ratio", "\n".join(lines)) is dropped  # 0.08 / 0.12 / 0.16


@pytest.mark.parametrize(("short", "dropped"), [(66, False), (67, False), (68, True)])
def test_short_line_ratio(short, dropped):
    lines = [f"short {i:03d}." for i in range(short)]
    lines += [f"a much longer line that is over thirty characters {i}." for i in range(100 - short)]
    assert fineweb_drops("fineweb.max_short_line_ratio", "\n".join(lines)) is dropped


@pytest.mark.parametrize(("extra", "dropped"), [(-1, False), (0, False), (1, True)])
def test_char_dup_ratio(extra, dropped):
    repeated = "r" * (10 + extra)  # 10 of 1000 characters without newlines is exactly 0.01
    text = "\n".join(["a" * (990 - 2 * len(repeated) + 10 - 10), repeated, "b" * 10, repeated])
    text = text.replace("b" * 10, "b" * (1000 - len(text.replace("\n", "")) + 10))
    assert len(text.replace("\n", "")) == 1000
    assert fineweb_drops("fineweb.max_char_dup_ratio", text) is dropped


@pytest.mark.parametrize(("newlines", "dropped"), [(2, False), (3, False), (4, True)])
def test_newline_word_ratio(newlines, dropped):
    words = [f"w{i}" for i in range(10)]
    text = " ".join(words[: 10 - newlines]) + "\n" + "\n".join(words[10 - newlines :])
    assert text.count("\n") == newlines
    assert fineweb_drops("fineweb.max_newline_word_ratio", text) is dropped


def test_nothing_left_after_c4_is_empty_for_fineweb():
    config = load_config(overrides=["clean.c4.min_num_sentences=null"], environ={}).clean
    # Both lines are under C4's three words, so C4 removes them whatever the recipe.
    signals, filtered = DocumentSignals(config).compute("Too short\nnor this", "en")
    assert filtered == "" and signals["fineweb"]["lines"] == 0
    (rule,) = [r for r in recipe_rules(config, []) if r.name == "fineweb.empty"]
    assert rule.drops(signals, "en")
    assert not rule.drops(signals_of("\n".join(GOOD_LINES)), "en")


def test_line_punct_exclude_zero():
    config = load_config(overrides=["clean.fineweb.line_punct_exclude_zero=true"], environ={}).clean
    (rule,) = [r for r in recipe_rules(config, []) if r.name == "fineweb.min_line_punct_ratio"]
    assert not rule.drops({"fineweb": {"line_punct_ratio": 0.0}}, "en")
    assert rule.drops({"fineweb": {"line_punct_ratio": 0.05}}, "en")


# --- order, overrides, and the vectorised signals against the reference ---------------------------------


def test_first_failing_rule_follows_recipe_order():
    text = "\n".join(["same line again and again."] * 10)
    rule = first_failing(list(RULES.values()), signals_of(text), "en")
    assert rule.name == "gopher_repetition.dup_line_frac" or rule.name == "gopher_repetition.dup_para_frac"
    assert first_failing(list(RULES.values()), signals_of(sample_article("river-mills")), "en") is None


def sample_article(name: str) -> str:
    import trafilatura

    html = (ROOT / "pipeline" / "crawl" / "sample_site" / "articles" / f"{name}.html").read_text()
    return normalize_text(trafilatura.extract(html, favor_precision=True))


def test_disabled_filter_has_no_rules_in_force():
    config = load_config(overrides=["clean.gopher_quality.enabled=false"], environ={}).clean
    rules = [r for r in recipe_rules(config, []) if r.name.startswith("gopher_quality.")]
    assert rules and all(rule.threshold("en") is None for rule in rules)


VOCABULARY = ["mill", "weir", "leat", "town", "bank", "road", "flow", "wind", "corn", "salt"]
TOKENS = st.sampled_from([*VOCABULARY, "the", "of", ",", ".", "#", "...", "1990"])
LINE = st.lists(TOKENS, min_size=1, max_size=12).map(" ".join)
PREFIX = st.sampled_from(["", "", "- ", "• "])


def joined_ngrams_collide(words: list[str]) -> bool:
    for n in range(5, 11):
        seen: dict[str, tuple[str, ...]] = {}
        for index in range(len(words) - n + 1):
            gram = tuple(words[index : index + n])
            if seen.setdefault("".join(gram), gram) != gram:
                return True
    return False


def test_joined_ngram_collision_is_the_only_divergence_from_datatrove():
    text = "... . . . . ..."
    words = DOCUMENTS.tokenizers.for_language("en").words(text)
    assert joined_ngrams_collide(words)
    ours = signals_of(text)["gopher_repetition"]["dup_5_gram_char_frac"]
    assert ours == reference.gopher_repetition(text, words, "\x00")["dup_5_gram_char_frac"] == 0.0
    assert reference.gopher_repetition(text, words)["dup_5_gram_char_frac"] > 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(PREFIX, LINE, st.sampled_from(["\n", "\n", "\n\n"])), min_size=1, max_size=30))
def test_signals_match_the_literal_reference(lines):
    text = "".join(prefix + line + end for prefix, line, end in lines).strip()
    words = DOCUMENTS.tokenizers.for_language("en").words(text)
    signals = signals_of(text)
    # Our n-grams are word sequences; datatrove's are the words joined with "", which equates different
    # splits of the same characters. Where the text has such a pair, compare with the word-sequence reading.
    separator = "\x00" if joined_ngrams_collide(words) else ""
    assert signals["gopher_repetition"] == reference.gopher_repetition(text, words, separator)
    assert signals["gopher_quality"] == reference.gopher_quality(
        text, words, CONFIG.gopher_quality.stop_words
    )
    c4_text = DOCUMENTS.compute(text, "en")[1]
    if c4_text:
        c4_words = DOCUMENTS.tokenizers.for_language("en").words(c4_text)
        assert signals["fineweb"] == reference.fineweb(c4_text, c4_words)
