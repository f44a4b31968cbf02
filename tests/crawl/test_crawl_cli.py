"""`pretrain crawl` options: sharding flags, and clear errors before any work starts."""

import pytest

from pipeline.cli import main


def test_help_explains_sharding(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["crawl", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--shard I", "--merge", "--num-shards N", "--snapshot"):
        assert flag in out
    assert "resume" in out


def test_bad_shard_arguments_fail_with_one_line(tmp_path, capsys):
    common = ["crawl", "--snapshot", "x", "--set", f"project.data_root={tmp_path}"]
    assert main([*common, "--shard", "1"]) == 2
    assert "--shard 1 is out of range for 1 shard(s)" in capsys.readouterr().err
    assert main([*common, "--shard", "0", "--num-shards", "0"]) == 2
    assert "crawl.num_shards" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([*common, "--shard", "0", "--merge"])
    assert exit_info.value.code == 2
    assert not (tmp_path / "sample").exists(), "nothing was written"


@pytest.mark.slow
def test_a_crawl_that_stores_no_page_fails_with_its_reasons_unless_allowed(tmp_path, capsys):
    """It used to exit 0 and publish an empty snapshot, which clean then read without complaint."""
    common = [
        "crawl",
        "--snapshot",
        "empty",
        "--set",
        f"project.data_root={tmp_path}",
        "--set",
        "crawl.seeds=['http://127.0.0.1:9/nothing-here']",  # refused: a loopback address, not allow-listed
        "--set",
        "logging.console=false",
    ]
    assert main(common) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: the crawl of snapshot 'empty' stored no page: 1 URL(s) tried")
    assert "refused_private_address 1" in error
    # The setting that fixes it, not the one that publishes an empty crawl.
    assert error.endswith("allow-listed: --set crawl.allowed_private_hosts='[127.0.0.1]'"), error
    assert not (tmp_path / "sample" / "crawl" / "empty").exists()

    assert main([*common, "--set", "crawl.allow_empty=true"]) == 0
    published = capsys.readouterr().out.strip().splitlines()[-1]
    assert published.endswith("crawl/empty")


@pytest.mark.slow
def test_a_crawls_console_output_is_one_line_per_event(tmp_path):
    """No Scrapy version dump, one timestamp per line, and a refusal named once, not twice."""
    import re
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "crawl",
            "--snapshot",
            "quiet",
            "--set",
            f"project.data_root={tmp_path}",
            "--set",
            "crawl.seeds=['http://127.0.0.1:9/refused']",
            "--set",
            "crawl.allow_empty=true",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert not any("Versions:" in line or "'lxml'" in line for line in lines), result.stderr
    assert not [line for line in lines if len(re.findall(r"\d\d:\d\d:\d\d", line)) > 1], result.stderr
    (refusal,) = [line for line in lines if "refused_private_address: http://127.0.0.1:9/refused" in line]
    assert refusal.count("refused_private_address") == 1, refusal
    assert "Traceback" not in result.stderr
