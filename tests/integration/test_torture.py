"""The fault campaign (``jobreg torture``, issue 10).

* The checker catches every kind of violation: each rule's planting, into a synthetic
  run and into a real finished run, is named by the checker (the self-test).
  Calls of one process's threads overlap (issue 27): the synthetic run holds overlapping
  calls the checker must not order, and violations made of two threads' calls are caught.
* The campaign itself: ``test_campaign_fixed_seed_breaks_no_rule`` is a short fixed-seed
  run of three coordinator processes (one writer thread each) on an embedded broker under
  the nemesis; ``test_campaign_with_concurrent_writers_breaks_no_rule`` the same with three
  writer threads per process sharing its Term; any broken rule fails them (``pytest -k
  campaign`` finds them; ``jobreg torture --check DIR`` re-judges a folder).
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
from registry.dev.torture.selftest import (
    CONCURRENT_PLANTS,
    PLANTS,
    plant,
    selftest,
    synthetic_run,
)

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
    assert set(CONCURRENT_PLANTS) <= set(RULES)


def test_overlapping_calls_of_one_process_are_not_ordered(synthetic) -> None:
    """The synthetic run's three threads of w3 in flight together (one id submitted twice,
    one refused; a read showing neither) break no rule, and the statistics see them."""
    report = check(synthetic)
    assert report.violations == []
    conc = report.stats["concurrency"]
    assert conc["overlapping"] == 2 and conc["ok"] == 1 and conc["refused"] == 1, conc
    assert conc["max_in_flight"] == 2, conc


@pytest.mark.parametrize("rule", sorted(CONCURRENT_PLANTS))
def test_the_checker_names_violations_made_of_two_threads_calls(synthetic, tmp_path,
                                                                 rule) -> None:
    copy, what = plant(synthetic, rule, tmp_path / rule, concurrent=True)
    found = [v for v in check(copy).violations if v.rule == rule]
    assert found, f"planted {what}; the checker did not report {rule}"
    assert any(line.get("thread") for v in found for line in v.history), found


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
                 ["--check", str(tmp_path)], ["--writers", "0"], ["--writers", "many"]):
        result = subprocess.run([*JOBREG, "torture", *args], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert "Error" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def campaign_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torture")
    return run_once(CampaignConfig(seed=SEED, seconds=SECONDS, processes=3, writers=1,
                                   namespaces=2, lease=2.0, out=out), 0, SEED)


@pytest.fixture(scope="module")
def concurrent_run(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torture-writers")
    return run_once(CampaignConfig(seed=SEED, seconds=SECONDS, processes=3, writers=3,
                                   namespaces=2, lease=2.0, out=out), 0, SEED)


@pytest.mark.embedded_only("the fault campaign's fixed-seed run starts its own embedded broker")
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_campaign_fixed_seed_breaks_no_rule(campaign_run) -> None:
    """Three coordinators, two namespaces sharing a partition, the nemesis on: every rule of
    the checker holds. On a failure, read the run folder's violations.json."""
    s = campaign_run
    assert s["ops"].get("ok", 0) > 100, s["ops"]  # the run did work
    assert sum(s["nemesis"].values()) > 5, s["nemesis"]  # and the nemesis did too
    assert s["violation_count"] == 0, "\n".join(first_examples([s], limit=3))
    assert s["writers"] == 1 and s["concurrency"]["overlapping"] == 0, s["concurrency"]


@pytest.mark.embedded_only("the fault campaign's fixed-seed run starts its own embedded broker")
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_campaign_with_concurrent_writers_breaks_no_rule(concurrent_run) -> None:
    """Three coordinators of three writer threads each, sharing each process's Term: calls
    of one term overlap, some of them refused (paired calls conflict on purpose), and every
    rule of the checker holds."""
    s = concurrent_run
    assert s["ops"].get("ok", 0) > 100, s["ops"]
    assert sum(s["nemesis"].values()) > 5, s["nemesis"]
    assert s["writers"] == 3
    conc = s["concurrency"]
    assert conc["overlapping"] > 50 and conc["refused"] > 0, conc
    assert conc["max_in_flight"] >= 2, conc
    lines = (Path(s["dir"]) / "history" / "w1.jsonl").read_text().splitlines()
    threads = {json.loads(x).get("thread") for x in lines[:2000] if x.strip()}
    assert {"writer-1", "writer-2", "writer-3"} <= threads, threads
    assert s["violation_count"] == 0, "\n".join(first_examples([s], limit=3))


@pytest.mark.embedded_only("plants violations in the campaign's run, on its own embedded broker")
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
