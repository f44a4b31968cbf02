"""Print the requirements of this package and of the extras named on the command line, read from setup.cfg.

The Dockerfiles install these (pinned by `pip install -c requirements.lock`) before copying the sources,
so the dependency layer is rebuilt only when setup.cfg or the lock changes, and an image gets the runtime
dependencies of its extras instead of the whole development lock (no pytest, ruff, hadolint).

    python docker/extras_requirements.py setup.cfg crawl spark > requirements.txt
"""

from __future__ import annotations

import configparser
import sys


def requirements(setup_cfg: str, extras: list[str]) -> list[str]:
    config = configparser.ConfigParser(interpolation=None)
    config.read(setup_cfg)
    declared = config["options.extras_require"]
    unknown = [extra for extra in extras if extra not in declared or extra == "all"]
    if unknown:
        sys.exit(f"unknown extras {unknown}; setup.cfg declares {sorted(declared)}")
    lines = config["options"]["install_requires"].splitlines()
    for extra in extras:
        lines += declared[extra].splitlines()
    result = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and line not in result:
            result.append(line)
    return result


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    print("\n".join(requirements(sys.argv[1], sys.argv[2:])))
