"""`pretrain config`: print the resolved config (YAML) and its hash, or a clear error."""

from __future__ import annotations

from pipeline.core.cli import run_cli
from pipeline.entrypoint import resolve, stage_parser


def main(argv: list[str] | None = None) -> int:
    parser = stage_parser("pretrain config", __doc__)
    config, snapshot = resolve(parser.parse_args(argv))
    print(config.to_yaml(), end="")
    print(f"# config hash: {config.hash}   snapshot: {snapshot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
