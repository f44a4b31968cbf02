"""Reading the Dockerfiles in docker/ and the lock files their pins must match (helpers for tests/docker)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
LOCK = ROOT / "requirements.lock"
SERVICES_LOCK = DOCKER / "requirements-services.lock"


def dockerfiles() -> list[Path]:
    """Every Dockerfile under docker/: `Dockerfile` and `*.Dockerfile`, in any subfolder."""
    found = {*DOCKER.rglob("Dockerfile"), *DOCKER.rglob("*.Dockerfile")}
    return sorted(found)


def normalise(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalise(name)] = version
    return pins


@dataclass
class Stage:
    base: str  # the FROM image with ARGs substituted
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)
    args: dict[str, str] = field(default_factory=dict)


@dataclass
class Dockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    def all_args(self) -> dict[str, str]:
        merged = dict(self.global_args)
        for stage in self.stages:
            merged.update(stage.args)
        return merged


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.partition(" ")
        result.append((keyword.upper(), rest.strip()))
        current = ""
    return result


def substitute(value: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), value)


def parse(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for keyword, rest in instructions(path.read_text()):
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            scope = stages[-1].args if stages else global_args
            if default:
                scope[name] = default.strip('"')
            elif stages and name in global_args:  # `ARG X` re-declares a global ARG inside a stage
                scope[name] = global_args[name]
        elif keyword == "FROM":
            words = rest.split()
            words = [word for word in words if not word.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=substitute(words[0], global_args), name=name))
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(path, global_args, stages)


def shell_commands(script: str) -> list[list[str]]:
    """The words of each simple command in a RUN line, split at `&&`, `||`, `;` and `|` outside quotes."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token and set(token) <= set(";&|<>"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    return [words for words in [*commands, words] if words]


def pip_installs(stage: Stage) -> list[list[str]]:
    """The words after each `pip install` / `pip wheel` in the stage's RUN instructions, ARGs substituted."""
    args = {**stage.args}
    commands = []
    for keyword, rest in stage.instructions:
        if keyword == "ARG":
            name, _, default = rest.partition("=")
            if default:
                args[name] = default.strip('"')
        if keyword != "RUN":
            continue
        for words in shell_commands(rest):
            for i, word in enumerate(words[:-1]):
                if word == "pip" and words[i + 1] in ("install", "wheel"):
                    commands.append([substitute(w, args) for w in words[i + 2 :]])
                    break
    return commands


def final_user(stage: Stage) -> str | None:
    users = [rest for keyword, rest in stage.instructions if keyword == "USER"]
    return users[-1] if users else None
