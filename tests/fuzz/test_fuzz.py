"""The fuzz campaign's short, fixed-seed run (`make test`): real dumps, records and
--command-config files, mutated by hypothesis, through jobreg's entry points
(registry/dev/fuzz.py says what must hold). The long run: `jobreg fuzz --cases N`."""

from __future__ import annotations

import click
import pytest

from registry.cli import main
from registry.dev.fuzz import check_cli, make_seeds, run_campaign

pytestmark = pytest.mark.integration

CASES = 150  # per target: 450 cases (about a minute here, with the seed log)


@pytest.fixture(scope="module")
def seeds(broker, tmp_path_factory):
    return make_seeds(tmp_path_factory.mktemp("fuzz-seeds"), bootstrap=broker.bootstrap)


@pytest.mark.parametrize("target", ["dump", "record", "properties"])
def test_a_short_fixed_seed_campaign_finds_nothing(seeds, target) -> None:
    result = run_campaign(main, CASES, seed=26, targets=(target,), seeds=seeds)
    assert result.cases[target] == CASES
    assert not result.findings, "\n".join(f"{f.rule}: {f.detail}"
                                          for f in result.findings.values())


def test_the_checker_catches_what_it_must(tmp_path) -> None:
    """Planted: a traceback, a second line, a file left behind, an undocumented status."""
    @click.command()
    @click.argument("what")
    def entry(what: str) -> None:
        if what == "raise":
            raise ValueError("boom")
        if what == "lines":
            raise click.ClickException("one\nand two")
        if what == "file":
            (tmp_path / "left.tmp").write_text("x")
            raise click.ClickException("a file is left behind")
        click.echo("Error: an exit status no one documented", err=True)
        raise SystemExit(9)

    rules = {what: check_cli(entry, [what], tmp_path, "selftest")[1].rule
             for what in ("raise", "lines", "file", "status")}
    assert rules == {"raise": "raised", "lines": "not one line", "file": "file written",
                     "status": "undocumented exit status"}
