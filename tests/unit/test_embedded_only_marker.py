"""The ``embedded_only`` marker says why (tests/conftest.py): a test marked without a reason
stops the run at collection on every broker, and on Apache Kafka each marked test is skipped
with its own reason. Each case is a pytest run of a small test file with this suite's
conftest loaded as a plugin (``-p conftest``); no broker is started."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

REASONLESS = """
import pytest

pytestmark = pytest.mark.embedded_only

@pytest.mark.embedded_only("a reason here does not excuse the module's marker")
def test_module_marker_without_reason():
    pass
"""

BARE_AND_EMPTY = """
import pytest

@pytest.mark.embedded_only
def test_bare():
    pass

@pytest.mark.embedded_only("  ")
def test_blank():
    pass

@pytest.mark.embedded_only(reason="")
def test_empty_keyword():
    pass

@pytest.mark.embedded_only("one", "two")
def test_two_reasons():
    pass

def test_unmarked():
    pass
"""

EXPLAINED = """
import pytest

pytestmark = pytest.mark.embedded_only("the module proxies a broker of its own")

def test_module_reason():
    pass

@pytest.mark.embedded_only(reason="freezes the broker with SIGSTOP")
def test_own_reason():
    pass
"""

PLAIN = """
def test_runs_anywhere():
    pass
"""


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, kind: str,
         *args: str) -> pytest.RunResult:
    monkeypatch.delenv("JOBREG_TEST_BOOTSTRAP", raising=False)
    monkeypatch.setenv("JOBREG_TEST_BROKER", kind)
    pytester.makeini("[pytest]\nmarkers =\n    embedded_only(reason): needs the embedded broker\n")
    return pytester.runpytest("-p", "conftest", "-rs", *args)


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_a_marker_without_a_reason_stops_collection_on_every_broker(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    pytester.makepyfile(test_bare_and_empty=BARE_AND_EMPTY, test_reasonless=REASONLESS)
    # -k keeps none of the offenders: the rule holds for tests a run deselects too
    result = _run(pytester, monkeypatch, kind, "-k", "test_unmarked")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    said = result.stderr.str()
    for test in ("test_bare_and_empty.py::test_bare", "test_bare_and_empty.py::test_blank",
                 "test_bare_and_empty.py::test_empty_keyword",
                 "test_bare_and_empty.py::test_two_reasons",
                 "test_reasonless.py::test_module_marker_without_reason"):
        assert test in said, said
    assert "test_unmarked" not in said
    assert "the embedded_only marker needs one reason" in said
    assert said.count("\n") == 1, said  # one line
    result.assert_outcomes()  # nothing ran


def test_on_kafka_each_marked_test_is_skipped_with_its_reason(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_explained=EXPLAINED, test_plain=PLAIN)
    result = _run(pytester, monkeypatch, "kafka")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines_random([
        "SKIPPED [[]1[]] test_explained.py*: needs the embedded broker: "
        "the module proxies a broker of its own",
        "SKIPPED [[]1[]] test_explained.py*: needs the embedded broker: "
        "freezes the broker with SIGSTOP",
    ])


def test_on_the_embedded_broker_marked_tests_run(pytester: pytest.Pytester,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_explained=EXPLAINED, test_plain=PLAIN)
    _run(pytester, monkeypatch, "embedded").assert_outcomes(passed=3)
