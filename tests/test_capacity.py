"""scripts/capacity.py: the split of measured CPU time into a fixed and a per-document part, the growth
beyond the largest size, and the cores a deadline needs, against figures made by hand from a known law."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scripts.capacity import cost_model, main, plan


def figures(law, sizes=(10_000, 100_000)) -> dict:
    """What benchmarks/scale.py writes, for two stages whose CPU seconds follow ``law(stage, documents)``."""
    stages = ["clean", "dedup"]
    return {
        "sizes": list(sizes),
        "stages": stages,
        "per_size": {
            str(size): {
                stage: {
                    "cpu_s": law(stage, size),
                    "wall_s": law(stage, size) / 2,
                    "peak_mb": {"driver": 250.0, "jvm": 1000.0, "worker": 400.0},
                    "jvm_heap_peak_mb": 600.0,
                    "shuffle_mb": size / 1000,
                    "output_mb": size / 2000,
                }
                for stage in stages
            }
            for size in sizes
        },
    }


@given(
    fixed=st.floats(1, 100),
    per_doc_ms=st.floats(0.01, 10),
    documents=st.floats(1e6, 1e10),
    hours=st.floats(1, 100),
)
def test_a_linear_stage_is_split_exactly_and_its_cores_fit_the_deadline(fixed, per_doc_ms, documents, hours):
    measured = figures(lambda stage, n: fixed + per_doc_ms / 1000 * n * (2 if stage == "dedup" else 1))
    fitted_fixed, per_document, exponent = cost_model(measured, "clean")
    assert fitted_fixed == pytest.approx(fixed, rel=1e-6, abs=1e-6)
    assert per_document == pytest.approx(per_doc_ms / 1000, rel=1e-9)
    assert exponent is None  # two sizes: linear, and said to be unmeasured
    result = plan(measured, documents, hours, skew=1.5, core_speed=1.0)
    clean, dedup = result["stages"]["clean"], result["stages"]["dedup"]
    assert clean["cpu_hours"] == pytest.approx((fixed + per_doc_ms / 1000 * documents) / 3600, rel=1e-6)
    # Each stage's share of the deadline is its share of the work; the shares fill the deadline.
    assert clean["wall_hours"] + dedup["wall_hours"] == pytest.approx(hours, abs=0.02)
    # Every stage then needs the same pool: the work over the deadline, with the skew's margin.
    needed = (clean["cpu_hours"] + dedup["cpu_hours"]) * 1.5 / hours
    for stage in (clean, dedup):
        assert needed - 1e-6 <= stage["cores"] < needed + 1 + 1e-6
        assert stage["shuffle_tb"] == pytest.approx(documents / 1000 / 2**20)


def test_a_third_size_measures_the_growth_of_the_per_document_part():
    """Per-document cost growing as n^1.2 beyond the first two sizes: the exponent is found and used."""

    def law(stage, n):
        per_doc = 1e-3 * n if n <= 100_000 else 1e-3 * 100_000 * (n / 100_000) ** 1.2
        return 40.0 + per_doc

    measured = figures(law, sizes=(10_000, 100_000, 1_000_000))
    fixed, _, exponent = cost_model(measured, "clean")
    assert fixed == pytest.approx(40.0) and exponent == pytest.approx(1.2)
    needs = plan(measured, 1e8, 10, 1.0, 1.0)["stages"]["clean"]
    assert needs["exponent_used"] == pytest.approx(1.2)
    assert needs["cpu_hours"] * 3600 == pytest.approx(40 + 1e-3 * 1e5 * 10**1.2 * 100**1.2, rel=1e-6)


def test_an_exponent_under_one_is_not_extrapolated_and_bad_arguments_are_refused(tmp_path, capsys):
    measured = figures(lambda stage, n: 40.0 + 1e-3 * n if n <= 100_000 else 40.0 + 1e-3 * n**0.9)
    path = tmp_path / "figures.json"
    path.write_text(json.dumps(figures(lambda stage, n: 40 + n / 1000, sizes=(10_000, 100_000, 1_000_000))))
    assert main(["--documents", "1e9", "--deadline-hours", "24", "--figures", str(path)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["stages"]["clean"]["exponent_used"] == 1.0
    assert plan(measured, 1e9, 24, 1.5, 1.0)["stages"]["clean"]["exponent_used"] == 1.0
    with pytest.raises(SystemExit):
        main(["--documents", "0", "--deadline-hours", "24", "--figures", str(path)])
    with pytest.raises(SystemExit):
        main(["--documents", "1e9", "--deadline-hours", "24", "--figures", str(tmp_path / "none.json")])
    assert "run benchmarks/scale.py" in capsys.readouterr().err
