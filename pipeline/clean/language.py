"""Language identification with py3langid, whose model ships inside its PyPI package (works offline).

py3langid walks its feature automaton one byte at a time in Python. The automaton is an Aho-Corasick
machine over byte n-grams, so its state after any byte depends only on the last ``depth`` bytes (the
deepest state's distance from the start): ``FastLanguageIdentifier`` computes the states of all positions
at once with numpy, in ``depth`` vectorised steps, then scores exactly as py3langid does (same feature
order, dtypes and arithmetic), so it returns the same language and probability
(tests/clean/test_language.py compares the two).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import cache

import numpy as np

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


class FastLanguageIdentifier:
    """py3langid's ``LanguageIdentifier.classify`` (norm_probs=True), with a vectorised feature walk."""

    def __init__(self, identifier):
        self._id = identifier
        width = identifier.tk_nextmove.itemsize
        self._next = np.frombuffer(
            identifier.tk_nextmove, dtype={2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
        )
        self._rowbase = np.asarray(identifier._rowbase, dtype=np.int64)
        self._output = np.asarray(identifier.tk_output, dtype=np.int64)
        # float16 -> float32 is exact; converting once saves converting the gathered rows on every call.
        self._table = identifier.nb_ptc.astype(np.float32)
        self.depth = self._max_depth()

    def _max_depth(self) -> int:
        """Breadth-first distance of the farthest state from the start state."""
        seen = np.zeros(self._rowbase.size, dtype=bool)
        seen[0] = True
        frontier, depth = np.array([0]), 0
        every_byte = np.arange(256)
        while frontier.size:
            # A mask, not np.unique: sorting 256 targets per state cost most of a worker's start.
            reached = np.zeros_like(seen)
            reached[self._next[(self._rowbase[frontier][:, None] + every_byte).ravel()]] = True
            reached &= ~seen
            frontier = np.flatnonzero(reached)
            seen |= reached
            depth += frontier.size > 0
        return depth

    def features(self, data: bytes) -> tuple[np.ndarray, np.ndarray]:
        """(feature ids in order of first occurrence, their counts): py3langid's ``visit_counts``."""
        text = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
        size = text.size
        states = np.zeros(size, dtype=np.int64)
        for back in range(min(self.depth, size) - 1, -1, -1):
            # Feed every position the byte `back` places before it (where there is one).
            states[back:] = self._next[self._rowbase[states[back:]] + text[: size - back]]
        found = self._output[states]
        found = found[found >= 0]
        if found.size == 0:
            return found, found
        order = np.argsort(found, kind="stable")
        ranked = found[order]
        starts = np.flatnonzero(np.concatenate(([True], ranked[1:] != ranked[:-1])))
        first = order[starts]  # stable sort: the first occurrence leads each run
        counts = np.diff(np.append(starts, ranked.size))
        by_first = np.argsort(first)
        return ranked[starts][by_first], counts[by_first]

    def classify(self, text: str, groups: Mapping[str, Sequence[str]] | None = None) -> tuple[str, float]:
        """The most probable language and its probability; with ``groups`` ({"zh": ["zh", "wuu", "yue"]}),
        a group's members count as one language named by its key, with their probabilities summed."""
        scores = self.probabilities(text)
        labels = self._id.nb_classes
        if groups:
            index = self._label_index()
            for name, members in groups.items():
                rows = [index[label] for label in members if label in index]
                if rows:
                    total = float(scores[rows].sum())
                    scores[rows] = 0.0
                    scores[index[name]] = total
        best = int(scores.argmax())
        return labels[best], float(scores[best])

    def _label_index(self) -> dict[str, int]:
        if not hasattr(self, "_index"):
            self._index = {label: i for i, label in enumerate(self._id.nb_classes)}
        return self._index

    def probabilities(self, text: str) -> np.ndarray:
        """py3langid's normalised probability of every label (its alias pairs merged)."""
        ident = self._id
        data = ident._encode(text)
        features, counts = self.features(data)
        if features.size:
            scores = np.log1p(counts.astype(np.float32)) @ self._table[features.astype(np.intp)] + ident.nb_pc
        else:
            scores = np.full(len(ident.nb_classes), 0.0, dtype=np.float32)
        scores *= 1.0 / math.sqrt(len(data) or 1)
        np.exp(scores - scores.max(), out=scores)
        scores /= scores.sum()
        for i, j in ident._alias_pairs:
            scores[i] += scores[j]
            scores[j] = 0.0
        return scores


@cache
def _fast_identifier() -> FastLanguageIdentifier:
    return FastLanguageIdentifier(_identifier())


def identify_language(
    text: str, max_chars: int, groups: Mapping[str, Sequence[str]] | None = None
) -> tuple[str, float]:
    """(language, probability) from the first ``max_chars`` characters; newlines read as spaces.

    ``groups`` makes several labels one language (``clean.language_groups``): classical Chinese is often
    labelled wuu or yue, with its probability split between them and zh.
    """
    return _fast_identifier().classify(text[:max_chars].replace("\n", " "), groups)
