"""The README's Python quick start runs verbatim, and its commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _quick_start() -> str:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.embedded_only("the README's quick start starts an EmbeddedBroker of its own")
@pytest.mark.integration
def test_quick_start_runs_verbatim(capsys) -> None:
    """It runs, and prints what its comments say, line by line: each ``print(...)  # text``
    promises one line matching ``text`` (``...`` stands for anything, `` -- `` starts a
    remark that is not output)."""
    code = _quick_start()
    exec(compile(code, "README.md quick start", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    promised = [line.split("#", 1)[1].strip().split(" -- ")[0]
                for line in code.splitlines() if "print(" in line and "#" in line]
    assert len(printed) == len(promised), printed
    for out, comment in zip(printed, promised, strict=True):
        pattern = ".*".join(re.escape(part) for part in comment.split("..."))
        assert re.fullmatch(pattern, out), f"prints {out!r}, the comment says {comment!r}"


def test_first_screen_has_exactly_two_commands() -> None:
    first = README.read_text().split("---", 1)[0]
    block = re.search(r"```sh\n(.*?)```", first, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci


def test_first_screen_says_how_to_run_jobreg_from_the_virtualenv() -> None:
    """Issue 29 §2: after `make demo`, `jobreg` is in .venv and not on the PATH; the first
    screen says how to type it and how to activate the environment (in prose, below the two
    commands), and the example it gives runs after the demo."""
    first = " ".join(README.read_text().split("---", 1)[0].split())
    assert "`.venv/bin/jobreg`" in first and "`. .venv/bin/activate`" in first
    example = re.search(r"`(\.venv/bin/jobreg [^`]+)`", first)
    assert example is not None
    words = example.group(1).split()
    assert words[1:] == ["--from-file", "jobreg-demo/dumps/incident-000.avro", "explain",
                         "job-a"], words  # the dump and the job the demo writes and hints at


def _help(*words: str) -> str:
    args = [sys.executable, "-m", "registry.cli", *words, "--help"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"`jobreg {' '.join(words)}` is documented but fails: " \
        f"{result.stderr}"
    return result.stdout


def _documented_commands() -> dict[str, list[str]]:
    """README CLI rows: command words -> the options the row names."""
    rows = re.findall(r"^\| `jobreg ([^`]+)`", README.read_text(), re.M)
    out: dict[str, list[str]] = {}
    for row in rows:
        words = []
        for token in row.split():
            if not re.fullmatch(r"[a-z][a-z-]*", token):
                break
            words.append(token)
        out.setdefault(" ".join(words), []).extend(re.findall(r"--[a-z][a-z-]*", row))
    return out


def test_documented_cli_commands_and_options_exist() -> None:
    documented = _documented_commands()
    assert len(documented) >= 10, "the README lists CLI commands"
    for command, options in documented.items():
        text = _help(*command.split())
        for option in options:
            assert option in text, f"README documents `jobreg {command} {option}`; it has none"


def test_every_command_is_documented_and_global_options_match() -> None:
    text = _help()
    listed = re.findall(r"^  ([a-z][a-z-]*)  ", text.split("Commands:", 1)[1], re.M)
    documented = {c.split()[0] for c in _documented_commands() if c}
    assert set(listed) <= documented, f"undocumented: {set(listed) - documented}"
    from registry.cli import main

    options = {opt: p.envvar for p in main.params for opt in p.opts if opt.startswith("--")}
    table = README.read_text().split("| global option |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(--[a-z-]+)[^`]*` \|\s*`?([A-Z_]*)`?\s*\|", table, re.M)
    assert {o for o, _ in rows} == set(options) - {"--version", "--help"}
    for option, env in rows:
        assert options[option] == (env or None), f"{option} reads ${options[option]}, not ${env}"
