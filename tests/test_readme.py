"""The README's Python quick start runs verbatim, and its commands exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _quick_start() -> str:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.integration
def test_quick_start_runs_verbatim(capsys) -> None:
    exec(compile(_quick_start(), "README.md quick start", "exec"), {})
    out = capsys.readouterr().out
    assert "expected epoch 2, actual 1" in out
    assert "'jm-1' writes for an old term; the leader is 'jm-2'" in out
    assert "JobSubmitted ACCEPTED" in out


def test_first_screen_has_exactly_two_commands() -> None:
    first = README.read_text().split("---", 1)[0]
    block = re.search(r"```sh\n(.*?)```", first, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    ci = (README.parent / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci


def test_documented_cli_commands_exist() -> None:
    documented = re.findall(r"^\| `jobreg ([a-z][a-z ]*?)(?: \[|`)", README.read_text(), re.M)
    assert documented, "the README lists CLI commands"
    for command in documented:
        args = [sys.executable, "-m", "registry.cli", *command.split(), "--help"]
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"`jobreg {command}` is documented but fails: {result.stderr}"
