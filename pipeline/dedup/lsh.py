"""LSH banding: choose bands x rows for a Jaccard threshold, and draw the S-curve they give.

Two documents with Jaccard similarity s share at least one of b bands of r rows with probability
P(s) = 1 - (1 - s^r)^b. Given a threshold t, the false-positive area is the integral of P over [0, t]
and the false-negative area the integral of 1 - P over [t, 1]; ``optimal_bands_rows`` minimises their
weighted sum over all b*r <= num_perm (text-dedup and datatrove use the same criterion).

Our default weights favour recall (0.05 / 0.95): with Jaccard verification on, a false positive costs one
pair comparison, while a false negative is a duplicate that stays in the corpus.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from pipeline.core.arguments import ArgumentParser


def collision_probability(similarity, bands: int, rows: int):
    """P(two documents with this Jaccard similarity share a band)."""
    s = np.asarray(similarity, dtype=np.float64)
    return 1.0 - (1.0 - s**rows) ** bands


@lru_cache(maxsize=8)
def _gauss_legendre(points: int) -> tuple[np.ndarray, np.ndarray]:
    return np.polynomial.legendre.leggauss(points)


def _integral(bands: int, rows: int, lo: float, hi: float) -> float:
    """Integral of P over [lo, hi]; Gauss-Legendre is exact here because P is a polynomial of degree b*r."""
    nodes, weights = _gauss_legendre(bands * rows // 2 + 2)
    s = (hi - lo) / 2 * nodes + (hi + lo) / 2
    return float((hi - lo) / 2 * np.dot(weights, collision_probability(s, bands, rows)))


def error_areas(threshold: float, bands: int, rows: int) -> tuple[float, float]:
    """(false-positive area below the threshold, false-negative area above it)."""
    false_positive = _integral(bands, rows, 0.0, threshold)
    false_negative = (1.0 - threshold) - _integral(bands, rows, threshold, 1.0)
    return false_positive, false_negative


def optimal_bands_rows(
    threshold: float, num_perm: int, false_positive_weight: float = 0.05, false_negative_weight: float = 0.95
) -> tuple[int, int]:
    """The (bands, rows) with bands*rows <= num_perm that minimise the weighted error areas."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    if num_perm < 1:
        raise ValueError(f"num_perm must be positive, got {num_perm}")
    if (
        false_positive_weight < 0
        or false_negative_weight < 0
        or false_positive_weight + false_negative_weight == 0
    ):
        raise ValueError("error weights must be non-negative and not both zero")
    best: tuple[float, int, int] | None = None
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            fp, fn = error_areas(threshold, bands, rows)
            error = false_positive_weight * fp + false_negative_weight * fn
            # Strict < keeps the first (fewest bands, then fewest rows) of equal errors: deterministic.
            if best is None or error < best[0] - 1e-15:
                best = (error, bands, rows)
    assert best is not None
    return best[1], best[2]


def s_curve_table(bands: int, rows: int, points=(0.3, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 1.0)):
    """Collision probability at a few similarities, for the manifest and the log."""
    return {f"{s:.2f}": round(float(collision_probability(s, bands, rows)), 4) for s in points}


def plot_s_curve(bands: int, rows: int, threshold: float, path: Path) -> Path:
    """Write the S-curve of (bands, rows) with the threshold marked, as a PNG with stable bytes. Without
    pyplot's global state, so a stage can draw it in a thread beside its Spark work."""
    from matplotlib.figure import Figure

    s = np.linspace(0.0, 1.0, 501)
    p = collision_probability(s, bands, rows)
    fp, fn = error_areas(threshold, bands, rows)
    figure = Figure(figsize=(6, 4), dpi=100)
    axes = figure.subplots()
    axes.plot(s, p, color="tab:blue", label=f"{bands} bands x {rows} rows")
    axes.fill_between(
        s, 0, p, where=s <= threshold, color="tab:red", alpha=0.25, label=f"false-positive area {fp:.3f}"
    )
    axes.fill_between(
        s, p, 1, where=s >= threshold, color="tab:orange", alpha=0.25, label=f"false-negative area {fn:.3f}"
    )
    axes.axvline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold}")
    axes.set_xlabel("Jaccard similarity of two documents")
    axes.set_ylabel("P(candidate pair)")
    axes.set_title("MinHash LSH S-curve")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1.01)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", fontsize=8)
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path, format="png", metadata={"Software": None})
    return path


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m pipeline.dedup.lsh",
        description="Show the LSH bands x rows chosen for a Jaccard threshold and the S-curve they give.",
    )
    parser.add_argument("--threshold", type=float, default=0.8, help="Jaccard threshold (default 0.8)")
    parser.add_argument("--num-perm", type=int, default=128, help="most permutations to use (default 128)")
    parser.add_argument("--false-positive-weight", type=float, default=0.05)
    parser.add_argument("--false-negative-weight", type=float, default=0.95)
    parser.add_argument("--plot", type=Path, metavar="PNG", help="also write the S-curve to this file")
    args = parser.parse_args(argv)
    bands, rows = optimal_bands_rows(
        args.threshold, args.num_perm, args.false_positive_weight, args.false_negative_weight
    )
    fp, fn = error_areas(args.threshold, bands, rows)
    print(f"bands={bands} rows={rows} permutations={bands * rows} fp_area={fp:.4f} fn_area={fn:.4f}")
    for similarity, probability in s_curve_table(bands, rows).items():
        print(f"  P(candidate | J={similarity}) = {probability:.4f}")
    if args.plot:
        print(f"wrote {plot_s_curve(bands, rows, args.threshold, args.plot)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
