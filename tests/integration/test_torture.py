"""The fault campaign (``jobreg torture``, issue 10).

* The checker catches every kind of violation: each rule's planting, into a synthetic
  run and into a real finished run, is named by the checker (the self-test).
* The campaign itself: ``test_campaign_fixed_seed_breaks_no_rule`` is a short fixed-seed
  run of three coordinator processes on an embedded broker under the nemesis; any broken
  rule fails it (``pytest -k campaign`` finds it; ``jobreg torture --check DIR`` re-judges
  its folder).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from registry.dev.torture.checker import RULES, check
from registry.dev.torture.runner import CampaignConfig, first_examples, run_once
from registry.dev.torture.selftest import PLANTS, plant, selftest, synthetic_run

JOBREG = [sys.executable, "-m", "registry.cli"]
SEED = 7
SECONDS = float(os.environ.get("JOBREG_TORTURE_SECONDS", "25"))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return synthetic_run(tmp_path_factory.mktemp("synthetic") / "run")


def test_a_synthetic_clean_run_breaks_no_rule(synthetic) -> None:
    report = check(synthetic)
    assert report.violations == [], [v.detail for v in report.violations]
    assert report.stats["outcomes"]["ACCEPTED"] > 10


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_checker_names_each_planted_violation(synthetic, tmp_path, rule) -> None:
    copy, what = plant(synthetic, rule, tmp_path / rule)
    found = [v for v in check(copy).violations if v.rule == rule]
    assert found, f"planted {what}; the checker did not report {rule}"


def test_every_rule_has_a_planting() -> None:
    assert set(PLANTS) == set(RULES)


def test_torture_cli_checks_a_folder_and_exits_1_on_a_violation(synthetic, tmp_path) -> None:
    clean = subprocess.run([*JOBREG, "torture", "--check", str(synthetic)],
                           capture_output=True, text=True, timeout=120)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no violations" in clean.stdout
    broken, _ = plant(synthetic, "resurrection", tmp_path / "broken")
    bad = subprocess.run([*JOBREG, "torture", "--check", str(broken)], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "resurrection" in bad.stdout and "check 1/1" in bad.stderr


def test_torture_cli_bad_arguments_exit_2(tmp_path) -> None:
    for args in (["--seconds", "0"], ["--processes", "1"], ["--bootstrap", "nope"],
                 ["--check", str(tmp_path)]):
        result = subprocess.run([*JOBREG, "torture", *args], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert "Error" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def campaign_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torture")
    return run_once(CampaignConfig(seed=SEED, seconds=SECONDS, processes=3, namespaces=2,
                                   lease=2.0, out=out), 0, SEED)


@pytest.mark.embedded_only
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_campaign_fixed_seed_breaks_no_rule(campaign_run) -> None:
    """Three coordinators, two namespaces sharing a partition, the nemesis on: every rule of
    the checker holds. On a failure, read the run folder's violations.json."""
    s = campaign_run
    assert s["ops"].get("ok", 0) > 100, s["ops"]  # the run did work
    assert sum(s["nemesis"].values()) > 5, s["nemesis"]  # and the nemesis did too
    assert s["violation_count"] == 0, "\n".join(first_examples([s], limit=3))


@pytest.mark.embedded_only
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_the_checker_names_each_violation_planted_in_a_real_run(campaign_run,
                                                                tmp_path) -> None:
    rows = selftest(Path(campaign_run["dir"]), tmp_path)
    missed = [r for r in rows if r["caught"] is False]
    assert not missed, json.dumps(missed, indent=1)
    assert sum(r["caught"] is True for r in rows) >= len(RULES) - 2, rows


def test_a_worker_refuses_to_run_other_code_than_its_run(tmp_path) -> None:
    """A campaign left running while the code changes would judge a mix of versions (an
    editable install reads the files anew in every worker): the run records a fingerprint
    of its code, a worker with other code exits 3, and the checker reports the exit."""
    from registry.dev.torture.runner import code_fingerprint
    from registry.dev.torture.worker import main

    (tmp_path / "run.json").write_text(json.dumps({"code": "0" * 16}))
    assert main([str(tmp_path), "w1", "0"]) == 3
    assert code_fingerprint() == code_fingerprint() != "0" * 16
