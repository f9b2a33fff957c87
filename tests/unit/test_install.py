"""The install (issue 30): the base install is the client, every other part an extra that
says its name when missing, and the lock pins what pyproject.toml asks for.

The base install is checked twice: here, with the modules of every extra made unimportable
(tests/support/without_extras.py), and for real, by installing the package into a throwaway
virtualenv with nothing but its base dependencies.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from registry.errors import MissingExtra, RegistryError
from registry.extras import EXTRAS, needs, require

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_EXTRAS = ROOT / "tests" / "support" / "without_extras.py"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
LOCK = ROOT / "requirements.lock"
BASE = {"jobreg", "confluent-kafka", "fastavro", "immutables", "click", "prometheus-client"}
"""The base install: the package and its five dependencies (prometheus-client for the metrics), nothing else."""

ONE_LINE = re.compile(r"Error: .* needs the '(\w+)' extra \(no module named '[\w.]+'\): "
                      r"pip install 'jobreg\[(\w+)\]'\n")


def _without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBREG_")}
    return subprocess.run([sys.executable, str(WITHOUT_EXTRAS), *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def _dump(path: Path) -> None:
    """A dump of one namespace (a leader and a job), written without a broker."""
    from support.incidents import Records

    from registry.codec import encode
    from registry.events import InlineGraph, JobSubmitted, LeadershipGranted, new_event_id
    from registry.forensics import Forensics
    from registry.image import LogRecord
    from registry.keys import record_key

    def env() -> dict:
        return dict(event_id=new_event_id(), namespace="ns-30", epoch=1, writer="jm-1",
                    created_at=0)

    events = [LeadershipGranted(prev_epoch=0, **env()),
              JobSubmitted(job_id="job-a", graph=InlineGraph(b"g"), **env())]
    records = [LogRecord(i, record_key(e).encode(), encode(e)) for i, e in enumerate(events)]
    Forensics(Records(records), "ns-30").dump(path)


def test_the_client_imports_without_any_extra() -> None:
    """``import registry`` and the client, forensics and the CLI load with every module of
    every extra unimportable, and do not even try to import one."""
    code = ("import registry\n"
            "from registry import Registry, Term, MissingExtra\n"
            "from registry.client import Registry, Term\n"
            "import registry.forensics, registry.cli, registry.render, registry.dumpfile\n"
            "import registry.audit.queries, consumers\n"
            "print('refused:', sorted(refused))\n")
    proc = _without_extras("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "refused: []\n"


def test_the_read_commands_run_without_any_extra(tmp_path) -> None:
    """The CLI's help and its read commands (on a dump: no broker) work in a base install."""
    dump = tmp_path / "ns-30.dump"
    _dump(dump)
    for args in (["--help"], ["jobs", "--help"], ["terms", "--help"], ["dump", "--help"],
                 ["audit", "--help"], ["audit", "check", "--help"]):
        proc = _without_extras("jobreg", *args)
        assert proc.returncode == 0 and "Usage: jobreg" in proc.stdout, (args, proc.stderr)
    at = ["--namespace", "ns-30", "--from-file", str(dump)]
    for args, said in ((["jobs"], "job-a"), (["terms"], "jm-1"), (["leader"], "jm-1"),
                       (["timeline", "job-a"], "JobSubmitted"), (["explain", "job-a"], "job-a"),
                       (["--json", "state", "--offset", "1"], '"job-a"')):
        proc = _without_extras("jobreg", *at, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        assert said in proc.stdout, (args, proc.stdout)
    proc = _without_extras("jobreg", *at, "dump", str(tmp_path / "again.dump"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "again.dump").stat().st_size > 0


def test_a_command_that_needs_an_extra_names_it_in_one_line(tmp_path) -> None:
    """Each command of a part that is an extra ends in one line naming the extra to install
    (exit code 1, README "Exit codes"), never a traceback."""
    dump = tmp_path / "ns-30.dump"
    _dump(dump)
    db = f"sqlite:///{tmp_path / 'audit.db'}"
    for args, extra in ((["audit", "check", "--db", db, "--from-file", str(dump)], "audit"),
                        (["audit", "migrate", "--db", db], "audit"),
                        (["audit", "refused", "--db", db], "audit"),
                        (["--bootstrap", "127.0.0.1:1", "audit", "run", "--plain", "--db", db],
                         "audit"),
                        (["--namespace", "ns-30", "--from-file", str(dump), "report", "--out",
                          str(tmp_path / "r.html")], "report"),
                        (["fuzz", "--cases", "1"], "test")):
        proc = _without_extras("jobreg", *args)
        assert proc.returncode == 1, (args, proc.stderr)
        assert ONE_LINE.fullmatch(proc.stderr), (args, proc.stderr)
        assert ONE_LINE.fullmatch(proc.stderr).groups() == (extra, extra), args
    assert not (tmp_path / "audit.db").exists() and not (tmp_path / "r.html").exists()


def test_a_library_import_of_an_extra_raises_missing_extra() -> None:
    """For a program that imports jobreg: the part's import raises MissingExtra (a
    RegistryError and an ImportError) with the extra's name."""
    code = ("import importlib\n"
            "from registry.errors import MissingExtra\n"
            "for module, name, extra in (\n"
            "        ('registry.audit.db', None, 'audit'),\n"
            "        ('registry.audit', 'migrate', 'audit'),\n"  # the package's lazy names
            "        ('consumers.spark', None, 'spark'), ('registry.report', None, 'report'),\n"
            "        ('consumers', 'spark_session', 'spark')):\n"
            "    try:\n"
            "        m = importlib.import_module(module)\n"
            "        if name is not None:\n"
            "            getattr(m, name)\n"
            "        raise SystemExit(f'{module} {name} loaded')\n"
            "    except MissingExtra as e:\n"
            "        assert isinstance(e, ImportError) and e.extra == extra, (module, e.extra)\n"
            "        print(module, e)\n")
    proc = _without_extras("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "registry.audit.db the audit database (registry.audit) needs the 'audit' extra" \
        in proc.stdout
    assert "consumers.spark the Spark audit job (consumers.spark) needs the 'spark' extra" \
        in proc.stdout


def test_needs_names_only_the_extras_own_modules() -> None:
    """A missing module that is not the extra's stays a ModuleNotFoundError: a broken
    install is not disguised as a missing extra."""
    with pytest.raises(ModuleNotFoundError) as e, needs("audit", "x"):
        import jobreg_no_such_module  # noqa: F401
    assert not isinstance(e.value, MissingExtra)
    assert require("sqlalchemy", "audit", "x").__name__ == "sqlalchemy"
    with pytest.raises(ValueError, match="unknown extra"), needs("nosuch", "x"):
        pass


def test_every_extra_of_pyproject_is_known_to_the_code() -> None:
    """registry.extras names each extra of pyproject.toml (but ``all``), and each of its
    top-level modules belongs to a distribution that extra installs."""
    extras = set(PYPROJECT["optional-dependencies"]) - {"all"}
    assert set(EXTRAS) == extras
    assert issubclass(MissingExtra, RegistryError) and issubclass(MissingExtra, ImportError)


def _requirements(extra: str | None, seen: set[str] | None = None) -> list[Requirement]:
    """The requirements of the base install plus ``extra``, self-references expanded."""
    seen = set() if seen is None else seen
    names = [None] if extra is None else [None, extra]
    out: list[Requirement] = []
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        listed = (PYPROJECT["dependencies"] if name is None
                  else PYPROJECT["optional-dependencies"][name])
        for text in listed:
            req = Requirement(text)
            if canonicalize_name(req.name) == "jobreg":
                for inner in sorted(req.extras):
                    out += _requirements(inner, seen)
            else:
                out.append(req)
    return out


def _lock() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, pinned = line.partition("==")
            pins[canonicalize_name(Requirement(name).name)] = pinned.strip()
    return pins


def test_the_lock_pins_every_dependency_within_pyproject_ranges() -> None:
    """requirements.lock (what `make demo`, `make test` and CI install) pins every dependency
    of the base install and of the ``test`` extra (which takes in every extra but ``peers``)
    at a version in pyproject.toml's range, and the extras of each (psycopg[binary]) too.
    When this fails, pyproject.toml changed: run ``make lock``."""
    pins = _lock()
    for req in _requirements("test"):
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in {LOCK.name}: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{LOCK.name} pins {name}=={pins[name]}, outside {req}: run `make lock`"
    assert "psycopg-binary" in pins and "jobreg" not in pins
    assert LOCK.read_text().startswith("# This file was autogenerated by uv")


def test_this_environment_is_the_lock() -> None:
    """The virtualenv `make test` runs in was installed from the lock: every pin of it is
    the installed version (a stale .venv is reinstalled: .installed depends on the lock)."""
    wrong = {}
    for name, pinned in _lock().items():
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have != pinned:
            wrong[name] = (pinned, have)
    assert not wrong, f"lock pin vs installed: {wrong}"


def test_a_real_base_install_has_only_the_base_dependencies(tmp_path) -> None:
    """``pip install`` of the package into a fresh virtualenv installs jobreg and its five
    base dependencies (pip's cache makes this take seconds), and there the client imports,
    the CLI's read commands run and an extra's command names the extra."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("registry", "consumers", "schemas", "migrations"):
        shutil.copytree(ROOT / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JOBREG_", "PYTHON", "VIRTUAL_ENV"))}
    pip = subprocess.run([str(py), "-m", "pip", "install", "--quiet", str(src)],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=280)
    assert pip.returncode == 0, pip.stderr[-3000:]
    listed = subprocess.run(
        [str(py), "-c", "from importlib.metadata import distributions\n"
                        "print('\\n'.join(sorted(d.metadata['Name'] for d in distributions())))"],
        capture_output=True, text=True, check=True, env=env, cwd=tmp_path).stdout.split()
    installed = {canonicalize_name(n) for n in listed} - {"pip", "setuptools", "wheel"}
    assert installed == BASE, installed
    check = subprocess.run(
        [str(py), "-c", "import registry\nfrom registry.client import Registry, Term\n"
                        "import registry.forensics\nprint(registry.__version__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path)
    assert check.returncode == 0 and check.stdout.strip() == version("jobreg"), check.stderr
    jobreg = venv / "bin" / "jobreg"
    dump = tmp_path / "ns-30.dump"
    _dump(dump)
    proc = subprocess.run([str(jobreg), "--namespace", "ns-30", "--from-file", str(dump),
                           "timeline", "job-a"], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0 and "JobSubmitted" in proc.stdout, proc.stderr
    proc = subprocess.run([str(jobreg), "audit", "migrate", "--db", "sqlite:///a.db"],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 1 and ONE_LINE.fullmatch(proc.stderr), proc.stderr
    assert "pip install 'jobreg[audit]'" in proc.stderr
