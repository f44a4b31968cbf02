"""How text is prepared for a fastText model, at training and at scoring alike.

fastText reads one line per example and splits it on whitespace only, so a document must become one line.

* ``dclm``: ``" ".join(text.strip().splitlines())``, nothing else: exactly what DCLM's enricher
  (``classify_fasttext_hq_prob``) and dolma's ``dclm-oh-eli5`` tagger feed DCLM's OH2.5+ELI5 model. No lower
  case, punctuation stays attached to its word (so "end." and "end" are different features). The default.
* ``lowercase``: ``dclm``, then lower case (for models trained on lower-cased text).
* ``fasttext_tutorial``: fastText's supervised tutorial: lower case, and the characters ``. ! ? , ' / ( )``
  set apart by spaces, then every run of whitespace one space.

A model trained here records its preprocessing, and the classify stage applies the same one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_TUTORIAL_PUNCTUATION = re.compile(r"([.!?,'/()])")
_WHITESPACE = re.compile(r"\s+")


def dclm(text: str) -> str:
    return " ".join(text.strip().splitlines())


def lowercase(text: str) -> str:
    return dclm(text).lower()


def fasttext_tutorial(text: str) -> str:
    spaced = _TUTORIAL_PUNCTUATION.sub(r" \1 ", text.lower())
    return _WHITESPACE.sub(" ", spaced).strip()


PREPROCESSORS: dict[str, Callable[[str], str]] = {
    "dclm": dclm,
    "lowercase": lowercase,
    "fasttext_tutorial": fasttext_tutorial,
}


def preprocessor(name: str) -> Callable[[str], str]:
    try:
        return PREPROCESSORS[name]
    except KeyError:
        raise ValueError(f"unknown preprocessing {name!r}; known: {sorted(PREPROCESSORS)}") from None
