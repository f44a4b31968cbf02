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
