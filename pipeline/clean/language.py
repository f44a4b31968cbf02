"""Language identification with py3langid, whose model ships inside its PyPI package (works offline)."""

from __future__ import annotations

from functools import cache

# py3langid 0.4's labels, listed here so config validation does not load the 4.5 MB model
# (tests/clean/test_language.py checks the list against the model).
LANGID_LABELS = frozenset(
    """
ace af am an ar ary arz as az ba bcl be bg bn br bs ca crh cs cy da de dz el en eo es et eu ext fa
fi fo fr fuv fy ga gcf gcr gd gl gom grc gu gug guw ha hbo he hi hr ht hu hy id ig is it ja jv ka
kab kik kk km kn ko ku ky la lb lg lij ln lo lt ltg lv mg mk ml mn mr ms mt my ne nl nn no nso oc om
or pa pcm pl ps pt qu ro ru rw sa sdh se si sk sl sn so sq sr st sv sw ta te tg th tk tl tr tt ug uk
ur uz uzs vec vi vo wa wuu xh yo yue zh zu zxx
""".split()  # noqa: SIM905
)


@cache
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify_language(text: str, max_chars: int) -> tuple[str, float]:
    """(language, probability) from the first ``max_chars`` characters; newlines read as spaces."""
    lang, score = _identifier().classify(text[:max_chars].replace("\n", " "))
    return lang, float(score)
