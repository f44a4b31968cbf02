import json
import random
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from pipeline.tokenization.bpe import (
    CJK_RANGES,
    TOKENIZER_CONFIG_FILE,
    load_tokenizer,
    save_tokenizer,
    special_tokens,
    train_tokenizer,
)
from pipeline.tokenization.config import TokenizerConfig

ENGLISH = "The river turned the wheel, and the mill ground flour for the whole valley until the 1890s."
CHINESE = "茶起源于中国，最早被用作药物。后来人们开始把茶当作日常饮料，茶文化传遍了整个东亚。"
CODE = 'def mean(xs: list[float]) -> float:\n    """Average."""\n    return sum(xs) / len(xs)\n'
EMOJI = "Bikes 🚲, bees 🐝 and a family 👨\u200d👩\u200d👧 on a flag 🇯🇵!"
SAMPLES = [ENGLISH, CHINESE, CODE, EMOJI, "ｆｕｌｌｗｉｄｔｈ ﬁ ligature ①"]


def corpus(copies=30):
    """The samples plus seeded random words, so there are more merges to learn than any vocabulary here needs."""
    rng = random.Random(0)
    words = [" ".join("".join(rng.choices("etaoinshrdlucmfw", k=rng.randint(2, 8))) for _ in range(40))]
    return [f"{text} {i}" for i in range(copies) for text in [*SAMPLES, *words]]


@pytest.fixture(scope="module", params=[False, True], ids=["bytes", "split_cjk"])
def tokenizer(request):
    return train_tokenizer(
        corpus(), TokenizerConfig(vocab_size=600, min_frequency=1, split_cjk=request.param)
    )


@pytest.mark.parametrize("text", SAMPLES, ids=["english", "chinese", "code", "emoji", "nfkc"])
def test_round_trip_is_the_nfc_of_the_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text).ids) == unicodedata.normalize("NFC", text)


def test_the_normal_form_is_a_setting_and_nfc_keeps_chinese_punctuation():
    """NFKC folded "，" into "," and "…" into "...": a model trained on it writes Chinese with ASCII commas."""
    text = "我们的花园，很美……ｆｕｌｌ ™"
    for form in ("NFC", "NFKC"):
        config = TokenizerConfig(vocab_size=600, min_frequency=1, unicode_form=form)
        trained = train_tokenizer(corpus(), config)
        assert trained.decode(trained.encode(text).ids) == unicodedata.normalize(form, text)
    nfc = train_tokenizer(corpus(), TokenizerConfig(vocab_size=600, min_frequency=1))
    assert nfc.decode(nfc.encode(text).ids) == text


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cn")), max_size=60))
def test_round_trip_on_random_text(text):
    tokenizer = _shared_tokenizer()
    assert tokenizer.decode(tokenizer.encode(text).ids) == unicodedata.normalize("NFC", text)


_CACHE = {}


def _shared_tokenizer():
    if "t" not in _CACHE:
        _CACHE["t"] = train_tokenizer(
            corpus(5), TokenizerConfig(vocab_size=400, min_frequency=1, split_cjk=True)
        )
    return _CACHE["t"]


def is_cjk(char):
    return any(lo <= ord(char) <= hi for lo, hi in CJK_RANGES)


def test_split_cjk_keeps_every_ideograph_in_its_own_tokens():
    """With the option no token spans two ideographs; without it BPE learns multi-ideograph tokens."""
    texts = [CHINESE * 3] * 50
    for split, expect_multi in ((True, False), (False, True)):
        tokenizer = train_tokenizer(texts, TokenizerConfig(vocab_size=500, min_frequency=1, split_cjk=split))
        encoding = tokenizer.encode(CHINESE)
        spans = [CHINESE[start:end] for start, end in encoding.offsets]
        multi = [span for span in spans if sum(map(is_cjk, span)) > 1]
        assert bool(multi) == expect_multi, spans


def test_vocabulary_size_and_special_tokens_come_from_the_config(tokenizer):
    config = TokenizerConfig(vocab_size=600)
    assert tokenizer.get_vocab_size() == 600
    assert train_tokenizer(corpus(), TokenizerConfig(vocab_size=450, min_frequency=1)).get_vocab_size() == 450
    assert [tokenizer.token_to_id(token) for token in special_tokens(config)] == list(range(6))


def test_tokenizer_loads_in_transformers_with_its_special_tokens(tokenizer, tmp_path):
    config = TokenizerConfig(vocab_size=600)
    path = save_tokenizer(tokenizer, tmp_path, config)
    assert json.loads((tmp_path / TOKENIZER_CONFIG_FILE).read_text())["eos_token"] == config.eos_token
    for fast in (
        PreTrainedTokenizerFast(tokenizer_file=str(path)),
        AutoTokenizer.from_pretrained(str(tmp_path)),
    ):
        for text in SAMPLES:
            ids = fast.encode(text)
            assert ids == tokenizer.encode(text).ids
            assert fast.decode(ids) == unicodedata.normalize("NFC", text)
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto.eos_token == config.eos_token and auto.eos_token_id == tokenizer.token_to_id(config.eos_token)
    assert auto.pad_token_id == tokenizer.token_to_id(config.pad_token)
    assert load_tokenizer(tmp_path).to_str() == tokenizer.to_str()
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_tokenizer(tmp_path / "missing")
