"""Benchmarks run in their smoke mode: the same code path on the smallest input, so a change that breaks a
benchmark (and leaves its figures in benchmarks/RESULTS.md unreproducible) fails here. The figures a smoke run
prints mean nothing; only that it runs to its JSON line.

The Spark benchmarks attach to the session's warm Spark Connect server (``SPARK_REMOTE``, as a user's shell
with a server does), so each of their Spark processes starts no JVM of its own: what a smoke run checks is
the benchmark's code, and the stages write the same bytes either way (tests/core/test_spark_connect.py);
local mode stays tested by the stage modules and the end-to-end test."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(
    script: str, *arguments: str, remote: str | None = None, tmpdir: Path | None = None
) -> dict:
    """``remote``: a Spark Connect server the benchmark's Spark sessions attach to; ``tmpdir``: where its
    temporary folders go (``TMPDIR``)."""
    env = {**os.environ, **({"SPARK_REMOTE": remote} if remote else {})}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    finished = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env=env,
    )
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(finished.stdout.strip().splitlines()[-1])


def test_train_cpu_runs_our_trainer_and_the_plain_loop_on_a_real_token_snapshot():
    """It died once the trainer resolved its data through the tokenizer a token output names, because its
    synthetic snapshot named none."""
    result = run_benchmark("train_cpu.py", "--smoke", "--no-defaults")
    assert result["timed_steps"] == 4 and result["trainer_tokens_per_s"] > 0
    assert result["plain_loop_tokens_per_s"] > 0 and result["final_loss"] > 0


# Spark, Scrapy and torchrun start processes of their own (a JVM alone takes ~8 s): those are marked slow.


def test_ablate_sweep_trains_a_candidate_on_both_arms_and_compares_them():
    result = run_benchmark("ablate_sweep.py", "--smoke", "--processes", "2")
    current = result["candidates"]["current"]
    assert result["seeds"] == 2 and current["cpu_s"] > 0 and current["base_loss"] > 0
    assert 0 <= current["p_value"] <= 1 and current["verdict"]


def test_gpu_kernels_runs_its_cpu_flow_and_its_checks_pass(tmp_path):
    """GPU-only timings: its CPU path (--smoke is --dry-run) checks the CPU kernels against the reference."""
    out = tmp_path / "gpu_kernels.json"
    result = run_benchmark("gpu_kernels.py", "--smoke", "--out", str(out))
    assert result == {
        "gemm_frac_of_cublas_4096": None,
        "gemm_frac_of_cublas_8192": None,
        "routing_speedup_t16k": None,
    }
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["checks"] and all(report["checks"].values())
    assert report["routing"] and all(row["speedup"] > 0 for row in report["routing"])


def test_train_gpu_runs_its_cpu_stand_in_of_both_presets():
    """GPU-only figures: its CPU path (--smoke: the dry run, eager only) on its own token snapshot."""
    result = run_benchmark("train_gpu.py", "--smoke")
    assert result["device"] == "cpu" and result["dry_run"]
    assert set(result["cases"]) == {"base-eager", "base-moe-eager"}
    for case in result["cases"].values():
        assert case["tokens_per_s"] > 0 and case["final_loss"] > 0


@pytest.mark.slow
def test_crawl_crawls_the_test_site_at_each_concurrency():
    result = run_benchmark("crawl.py", "--smoke")
    assert result["pages_per_s_c1"] > 0 and result["pages_per_s_c16"] > 0 and result["mb_per_s_c16"] > 0
    assert result["pages_per_cpu_s_c16"] > 0


# A baseline whose library lives only in .venv-bench runs where it imports, and says so where it does not.
def baseline_ran_or_said_why(result: dict, module: str) -> bool:
    return result["baseline"] in (module, f"skipped: {module} not installed")


@pytest.mark.slow
def test_tokenize_shards_runs_the_stage_and_the_raw_encoder(spark_connect):
    result = run_benchmark("tokenize_shards.py", "--smoke", remote=spark_connect.url)
    assert result["tokens"] > 0 and result["documents"] > 0 and result["raw_tokens"] > 0
    assert result["spark_encode_tokens_per_s"] > 0 and result["tokens_per_s_ratio_vs_raw"] > 0


@pytest.mark.slow
def test_classify_scores_and_decontaminates_like_the_plain_loops(spark_connect):
    result = run_benchmark("classify.py", "--smoke", remote=spark_connect.url)
    assert result["documents"] == 200 and result["scores_identical"]
    assert 0.5 < result["classifier_auc"] <= 1 and result["docs_per_s_ratio_vs_fasttext_loop"] > 0
    assert result["decontam_flagged"] == result["decontam_reference_flagged"]


@pytest.mark.slow
def test_clean_runs_our_stage_and_datatrove_where_it_imports(spark_connect, tmp_path):
    result = run_benchmark("clean.py", "--smoke", "--out", str(tmp_path), remote=spark_connect.url)
    assert result["docs"] == 60 and result["ours_docs_per_s"] > 0 and 0 < result["ours_kept"] < 60
    assert baseline_ran_or_said_why(result, "datatrove")


@pytest.mark.slow
def test_ingest_reads_both_formats_and_cleans_them(spark_connect, tmp_path):
    result = run_benchmark("ingest.py", "--smoke", "--out", str(tmp_path), remote=spark_connect.url)
    assert baseline_ran_or_said_why(result, "datatrove")
    for fmt in ("wet", "parquet"):
        assert result[fmt]["ours_docs_per_s"] > 0
        if "ours_documents" in result[fmt]:
            assert result[fmt]["ours_documents"] > 0 and result[fmt]["ours_kept"] > 0


@pytest.mark.slow
def test_dedup_finds_the_planted_copies(spark_connect, tmp_path):
    result = run_benchmark("dedup.py", "--smoke", "--out", str(tmp_path), remote=spark_connect.url)
    assert result["docs"] == 200 and result["docs_per_s"] > 0
    assert baseline_ran_or_said_why(result, "datatrove")
    if "precision" in result:
        assert result["precision"] > 0.9 and result["recall"] > 0.9


@pytest.mark.slow
def test_pipeline_parallel_runs_every_schedule_on_two_ranks():
    result = run_benchmark("pipeline_parallel.py", "--smoke")
    assert set(result["tokens_per_s_pp2"]) == {"gpipe-m8", "1f1b-m8", "interleaved_1f1b-m8"}
    assert all(rate > 0 for rate in result["tokens_per_s_pp2"].values()) and result["tokens_per_s_single"] > 0
    assert 0 < result["param_memory_per_rank_ratio"] < 1


@pytest.mark.slow
def test_mixture_blends_sources_and_dedups_against_stored_history(spark_connect, tmp_path):
    result = run_benchmark("mixture.py", "--smoke", "--out", str(tmp_path), remote=spark_connect.url)
    assert result["docs_per_snapshot"] == 50 and result["mixture_loader_tokens_per_s_ratio"] > 0
    assert result["earlier_duplicates_against_16"] >= result["earlier_duplicates_against_1"] > 0


@pytest.mark.slow
def test_quality_runs_the_stage_at_both_sizes(spark_connect, tmp_path):
    result = run_benchmark("quality.py", "--smoke", "--out", str(tmp_path), remote=spark_connect.url)
    assert result["docs_1x"] == 40 and result["sample_docs"] == 20
    assert result["time_growth_4x"] > 0 and result["driver_peak_mb_growth_4x"] > 0


@pytest.mark.slow
def test_ablate_runs_the_ladder_and_the_recipe_through_the_paired_test(spark_connect, tmp_path):
    """The ladder's two rungs and the recipe at one size, two seeds each (the fewest the paired test takes),
    through run_ablation: corpus stages on the warm server, trainings, evaluation, comparison."""
    result = run_benchmark("ablate.py", "--smoke", "--keep", str(tmp_path), remote=spark_connect.url)
    assert result["smoke"] and not result["quick"]
    assert result["sizes"] == [40] and result["seeds"] == 2
    assert 0 <= result["ladder_p_value_max"] <= 1 and 0 <= result["recipe_p_value_max"] <= 1
    assert isinstance(result["recipe_margin_bpb_min"], float) and math.isfinite(
        result["recipe_margin_bpb_min"]
    )
    # A rung is resolved only by a "better" verdict (p < 0.05), and so is a recipe that wins.
    assert isinstance(result["ladder_order_correct"], bool)
    assert result["ladder_smallest_step_resolved_pct"] == (50 if result["ladder_order_correct"] else None)
    if result["ladder_order_correct"]:
        assert result["ladder_p_value_max"] < 0.05
    if result["recipe_wins_everywhere"]:
        assert result["recipe_p_value_max"] < 0.05 and result["recipe_margin_bpb_min"] > 0
    # Neither asked for in --smoke: no old proxy, classifier or A/A control.
    assert result["old_proxy_ladder_order_correct"] is None and result["classifier_vs_recipe"] == []
    assert result["aa_repetitions"] == 0 and result["aa_false_finding_rate"] is None
    assert (tmp_path / "data" / "sample" / "ablate" / "recipe-40" / "report.html").is_file()


def file_digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@pytest.mark.slow
def test_scale_runs_every_stage_as_a_process_in_a_temporary_folder(spark_connect, tmp_path):
    """Every stage as its own measured process at one size, dedup scored against the planted copies; the
    plot and figures go to the temporary folder (TMPDIR here), never over the recorded ones."""
    recorded = [ROOT / "docs" / "img" / "scale.png", ROOT / "benchmarks" / "scale_figures.json"]
    before = [file_digest(path) for path in recorded]
    result = run_benchmark("scale.py", "--smoke", remote=spark_connect.url, tmpdir=tmp_path)
    assert [file_digest(path) for path in recorded] == before
    (work,) = tmp_path.glob("bench-scale-*")
    assert (work / "scale.png").is_file() and json.loads((work / "scale_figures.json").read_text()) == result
    stages = ["ingest", "clean", "dedup", "classify", "decontaminate", "tokenize"]
    assert result["sizes"] == [60] and result["stages"] == stages
    for stage in stages:  # one size: no slope (the exponents need two), no growth
        assert result[f"cost_exponent_{stage}"] is None and result[f"cpu_exponent_{stage}"] is None
        measured = result["per_size"]["60"][stage]
        assert measured["wall_s"] > 0 and measured["cpu_s"] > 0 and measured["peak_mb"]["driver"] > 0
        assert measured["output_mb"] > 0
    assert result["driver_peak_mb_growth_by_stage"] == dict.fromkeys(stages, 1.0)
    assert 0 <= result["dedup_precision"]["60"] <= 1 and 0 <= result["dedup_recall"]["60"] <= 1
