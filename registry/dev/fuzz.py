"""The fuzz campaign: damaged input, mutated by hypothesis, through jobreg's real entry points.

Three targets, each seeded with real input made here (a log written by the client API on an
embedded broker, or the one given, then dumped):

* ``dump``: the dump with bit flips, truncations, insertions, overwrites and splices (a
  piece of the file copied elsewhere), bent towards its data blocks (the header, which holds
  the schema catalog, is most of a small dump's bytes), then ``jobreg --from-file CASE``
  with one read command, ``dump``, ``report`` or ``audit check`` (on a database that does
  not exist);
* ``record``: a record (key and wire frame) of that log, mutated the same way, through the
  codec's ``decode`` and the fold's ``replay``;
* ``properties``: a ``--command-config`` properties file (secrets by ``${env:...}`` and
  ``${file:...}``), mutated, then ``jobreg --command-config CASE --from-file DUMP jobs``.

What must hold, for every case (:func:`check_cli` and :func:`check_record`): the command
exits with a documented status (0, 1, 2, 3 or 4: ``jobreg --help``), never with a Python
exception; on failure stderr is one line (``Error: ...``) with no traceback; no file is
written but the command's own output, and only when it succeeds (no temporary file left); no
secret shows. The codec raises only ``CodecError`` with one line in words (no Python
exception name), and the fold never raises.

Run it with ``jobreg fuzz --cases N`` (the long campaign) or through
``tests/fuzz/test_fuzz.py`` (a short fixed-seed run in ``make test``). The CLI's entry point
is passed in (``registry.dev`` sits below ``registry.cli``). hypothesis is needed (the
``test`` extra).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.errors import CodecError
from registry.events import new_event_id
from registry.fold import replay
from registry.image import Image, LogRecord

__all__ = ["EXIT_STATUSES", "TARGETS", "Finding", "FuzzResult", "Seeds", "check_cli",
           "check_record", "make_seeds", "mutate", "run_campaign"]

TARGETS = ("dump", "record", "properties")
EXIT_STATUSES = frozenset({0, 1, 2, 3, 4})
"""The exit statuses ``jobreg --help`` documents."""
SECRET = "fuzz-secret-never-shown"
_SECRET_ENV = "JOBREG_FUZZ_SECRET"
_PYTHON_ERROR = re.compile(r"\b[A-Z][A-Za-z]*(Error|Exception)\b|Traceback")
_DUMP_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("jobs", "--all"), ("terms",), ("quarantine",), ("rejected",), ("leader",),
    ("state", "--offset", "{offset}"), ("timeline", "job-0003"), ("explain", "job-0001"),
    ("--json", "jobs"), ("dump", "out.avro"), ("report", "--out", "out.html"),
    ("audit", "check", "--db", "sqlite:///nonexist.db"))


@dataclass
class Seeds:
    """The real inputs the mutations start from."""

    dump: bytes
    header_size: int
    records: list[LogRecord]
    namespace: str
    properties: str
    secret_file: Path


@dataclass
class Finding:
    """A case that broke a rule: which target, which rule, and what came out."""

    target: str
    rule: str
    detail: str

    @property
    def signature(self) -> str:
        """What makes two findings the same defect (numbers and paths left out)."""
        return f"{self.target}: {self.rule}: " + re.sub(r"\d+|'[^']*'|/\S+", "#",
                                                        self.detail)[:160]


@dataclass
class FuzzResult:
    """Cases tried per target, the distinct findings (first case of each) and the time."""

    cases: Counter[str] = field(default_factory=Counter)
    exits: Counter[tuple[str, int | None]] = field(default_factory=Counter)
    findings: dict[str, Finding] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, found: Finding | None) -> bool:
        """Keep ``found`` if it is a new defect; whether it was."""
        if found is None or found.signature in self.findings:
            return False
        self.findings[found.signature] = found
        return True


def _header_size(dump: bytes) -> int:
    import io

    import fastavro

    f = io.BytesIO(dump)
    fastavro.block_reader(f)
    return f.tell()


def make_seeds(workdir: Path, bootstrap: str | None = None) -> Seeds:
    """Write a varied log (claims, 120 submits, a refused stale write, checkpoints, a
    cancel, an undecodable record, a second term) on ``bootstrap`` (default: an embedded
    broker started and stopped here), dump it, and return the seeds."""
    from registry.client import Registry
    from registry.codec import encode
    from registry.dev.broker import EmbeddedBroker
    from registry.dumpfile import DumpReader
    from registry.events import JobLockReleased
    from registry.keys import lock_key
    from registry.log import write_raw

    workdir.mkdir(parents=True, exist_ok=True)
    namespace, topic = "fuzz", f"jobreg-fuzz-{new_event_id()[:8]}"
    path = workdir / "seed.avro"

    def write(where: str) -> None:
        regs = []
        try:
            first = Registry.connect(where, namespace, topic=topic,
                                     blob_store=workdir / "blobs")
            regs.append(first)
            t1 = first.claim_leadership("jm-1")
            t1.submit_many([(f"job-{i:04d}", f"graph-{i}".encode()) for i in range(120)])
            t1.checkpoint_triggered("job-0001", 1)
            t1.checkpoint_completed("job-0001", 1, "s3://cp/1")
            t1.checkpoint_failed("job-0002", 1, "declined")
            second = Registry.connect(where, namespace, topic=topic,
                                      blob_store=workdir / "blobs")
            regs.append(second)
            t2 = second.claim_leadership("jm-2")
            write_raw(where, topic, first.partition, lock_key(namespace, "job-0003"),
                      encode(JobLockReleased(event_id=new_event_id(), namespace=namespace,
                                             epoch=1, writer="jm-1", created_at=0,
                                             job_id="job-0003")))
            write_raw(where, topic, first.partition, f"{namespace}/job/job-z",
                      b"\x00\x00\x00\x00\x07 not avro")
            t2.adopt("job-0003")
            t2.cancel("job-0001", "fuzz")
            second.dump(path, force=True)
        finally:
            for r in regs:
                r.close()

    if bootstrap is None:
        with EmbeddedBroker() as broker:
            write(broker.bootstrap)
    else:
        write(bootstrap)
    dump = path.read_bytes()
    records = list(DumpReader(path).records())
    secret_file = workdir / "secret.txt"
    secret_file.write_text(SECRET + "\n")
    properties = ("# a client's settings, as Kafka's tools take them\n"
                  "security.protocol=SASL_SSL\n"
                  "sasl.mechanism=SCRAM-SHA-512\n"
                  "sasl.username=jobreg\n"
                  f"sasl.password=${{env:{_SECRET_ENV}}}\n"
                  f"ssl.key.password=${{file:{secret_file}}}\n"
                  "ssl.ca.location=/etc/ssl/certs/ca-certificates.crt\n"
                  "client.id: jobreg-fuzz\n"
                  "socket.keepalive.enable true\n"
                  "! a comment, then a continued line\n"
                  "request.timeout.ms=30\\\n"
                  "   000\n")
    return Seeds(dump, _header_size(dump), records, namespace, properties, secret_file)


# --------------------------------------------------------------------------- mutations


def _mutations(st: Any) -> Any:
    """A hypothesis strategy of mutation lists; positions are fractions, placed on the
    input by :func:`mutate` (so one strategy serves inputs of any size)."""
    where = st.tuples(st.sampled_from(["any", "data", "tail"]),
                      st.floats(0, 1, allow_nan=False))
    one = st.one_of(
        st.tuples(st.just("flip"), where, st.integers(0, 7)),
        st.tuples(st.just("truncate"), where),
        st.tuples(st.just("insert"), where, st.binary(min_size=1, max_size=24)),
        st.tuples(st.just("overwrite"), where, st.binary(min_size=1, max_size=8)),
        st.tuples(st.just("splice"), where, where, st.integers(1, 4096)),
        st.tuples(st.just("delete"), where, st.integers(1, 64)),
    )
    return st.lists(one, min_size=1, max_size=3)


def _place(where: tuple[str, float], size: int, data_start: int) -> int:
    region, fraction = where
    lo = {"any": 0, "data": min(data_start, size), "tail": max(0, size - 200)}[region]
    return lo + int(fraction * (size - lo))


Mutation = tuple[Any, ...]
"""One mutation: (kind, where, ...) as :func:`_mutations` draws it."""


def mutate(data: bytes, mutations: list[Mutation], data_start: int = 0) -> bytes:
    """``data`` with each mutation applied in turn (see :func:`_mutations`); ``data_start``
    is where the "data" region begins (a dump's first data block)."""
    out = bytearray(data)
    for m in mutations:
        kind, size = m[0], len(out)
        if kind == "flip" and size:
            pos = min(_place(m[1], size, data_start), size - 1)
            out[pos] ^= 1 << m[2]
        elif kind == "truncate":
            del out[_place(m[1], size, data_start):]
        elif kind == "insert":
            pos = _place(m[1], size, data_start)
            out[pos:pos] = m[2]
        elif kind == "overwrite":
            pos = _place(m[1], size, data_start)
            out[pos:pos + len(m[2])] = m[2]
        elif kind == "splice" and size:
            src, dst = _place(m[1], size, data_start), _place(m[2], size, data_start)
            out[dst:dst] = out[src:src + m[3]]
        elif kind == "delete":
            pos = _place(m[1], size, data_start)
            del out[pos:pos + m[2]]
    return bytes(out)


# --------------------------------------------------------------------------- checks


def _listing(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


def check_cli(entry: Any, args: list[str], directory: Path, target: str,
              outputs: tuple[str, ...] = (), env: dict[str, str] | None = None
              ) -> tuple[int | None, Finding | None]:
    """Run ``jobreg ARGS`` in-process (click's runner) in ``directory`` and check the rules
    (module docstring); ``outputs``: the files the command writes when it succeeds.
    Returns the exit status and the first rule broken (``None``: none)."""
    from click.testing import CliRunner

    before = _listing(directory)
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        result = CliRunner().invoke(entry, args, env=env, catch_exceptions=True)
    finally:
        os.chdir(cwd)
    code, err, out = result.exit_code, result.stderr, result.stdout
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        e = result.exception
        return code, Finding(target, "raised", f"{type(e).__name__}: {e}"[:300])
    if code not in EXIT_STATUSES:
        return code, Finding(target, "undocumented exit status", f"{code}: {err.strip()[:200]}")
    if SECRET in err or SECRET in out:
        return code, Finding(target, "secret shown", err.strip()[:200])
    if "Traceback" in err or "Traceback" in out:
        return code, Finding(target, "traceback", err.strip()[-300:])
    if code != 0 and (err.count("\n") > 1 or not err.startswith("Error:")) and code != 2:
        return code, Finding(target, "not one line", err.strip()[:300])
    if code == 2 and not err.rstrip().splitlines()[-1:][0].startswith("Error:"):
        return code, Finding(target, "usage error without its line", err.strip()[:300])
    if code != 0 and _PYTHON_ERROR.search(err):
        return code, Finding(target, "a Python exception name in the message", err.strip()[:300])
    after = _listing(directory)
    made = after - before
    allowed = set(outputs) if code == 0 else set()
    if made - allowed:
        return code, Finding(target, "file written", f"{sorted(made - allowed)} (exit {code}, "
                                                     f"{args[-2:]})")
    for name in outputs:  # the next case starts without it
        (directory / name).unlink(missing_ok=True)
    return code, None


def check_record(record: LogRecord, namespace: str) -> Finding | None:
    """Decode ``record``'s value (the codec) and fold it (``replay``): the codec raises
    only ``CodecError`` with one line in words, the fold never raises and quarantines what
    it cannot decode with a one-line detail."""
    from registry.codec import default_codec

    if record.value is not None:
        try:
            default_codec().decode(record.value)
        except CodecError as e:
            text = str(e)
            if "\n" in text or _PYTHON_ERROR.search(text):
                return Finding("record", "codec message", text[:300])
        except Exception as e:
            return Finding("record", "codec raised", f"{type(e).__name__}: {e}"[:300])
    try:
        image = replay(Image.empty(namespace), record)
    except Exception as e:
        return Finding("record", "fold raised", f"{type(e).__name__}: {e}"[:300])
    for d in image.quarantined:
        detail = d.detail or ""
        if "\n" in detail or _PYTHON_ERROR.search(detail):
            return Finding("record", "quarantine detail", detail[:300])
    return None


# --------------------------------------------------------------------------- the campaign


class _OutOfTime(Exception):
    """The campaign's time is up (``seconds``): the target stops where it is."""


def run_campaign(entry: Any, cases: int, *, seed: int = 0, targets: tuple[str, ...] = TARGETS,
                 seeds: Seeds | None = None, workdir: Path | None = None,
                 seconds: float | None = None,
                 progress: Callable[[str], None] | None = None) -> FuzzResult:
    """``cases`` cases per target, mutations drawn by hypothesis from ``seed`` (the same
    seed draws the same cases), through ``entry`` (``registry.cli.main``); with ``seconds``,
    each target stops when its share of the time is up (the result counts the cases tried).
    Findings are collected, not raised: a campaign reports every distinct one, and
    ``progress`` hears of each when it is found."""
    from registry.extras import needs

    with needs("test", "jobreg fuzz"):
        from hypothesis import HealthCheck, Phase, Verbosity, given, settings
        from hypothesis import seed as hseed
        from hypothesis import strategies as st
    result = FuzzResult()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobreg-fuzz-") as tmp:
        base = Path(workdir or tmp)
        if seeds is None:
            if progress:
                progress("writing the seed log on an embedded broker and dumping it")
            seeds = make_seeds(base / "seeds")
        good = base / "good.avro"
        good.write_bytes(seeds.dump)
        run_dir = base / "run"
        run_dir.mkdir(exist_ok=True)
        env = {_SECRET_ENV: SECRET}
        last = seeds.records[-1].offset if seeds.records else 0
        config = settings(max_examples=cases, database=None, deadline=None,
                          derandomize=False, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck),
                          verbosity=Verbosity.quiet, report_multiple_bugs=False)
        share = None if seconds is None else seconds / max(1, len(targets))
        stop_at = [float("inf")]

        def note(target: str) -> None:
            if time.monotonic() > stop_at[0]:
                raise _OutOfTime
            result.cases[target] += 1
            n = result.cases[target]
            if progress and n % 500 == 0:
                progress(f"{target}: {n:,} cases, {len(result.findings)} distinct finding(s)")

        def told(found: Finding | None) -> None:
            if result.add(found) and progress and found is not None:
                progress(f"FINDING {found.target}: {found.rule}: {found.detail}")

        @config
        @hseed(seed)
        @given(_mutations(st), st.integers(0, len(_DUMP_COMMANDS) - 1),
               st.integers(-1, last + 1))
        def dump_case(mutations: list[Mutation], which: int, offset: int) -> None:
            note("dump")
            case = run_dir / "case.avro"
            case.write_bytes(mutate(seeds.dump, mutations, seeds.header_size))
            command = [a.replace("{offset}", str(offset)) for a in _DUMP_COMMANDS[which]]
            outputs = tuple(a for a in command if a.startswith("out."))
            code, found = check_cli(entry, ["--from-file", str(case), *command], run_dir,
                                    "dump", outputs)
            case.unlink(missing_ok=True)
            result.exits[("dump", code)] += 1
            told(found)

        @config
        @hseed(seed + 1)
        @given(st.integers(0, max(0, len(seeds.records) - 1)), _mutations(st), st.booleans())
        def record_case(index: int, mutations: list[Mutation], key_too: bool) -> None:
            note("record")
            r = seeds.records[index]
            value = mutate(r.value or b"", mutations, 5)
            key = mutate(r.key or b"", mutations[:1]) if key_too else r.key
            told(check_record(LogRecord(r.offset, key, value, r.timestamp, r.partition),
                              seeds.namespace))

        @config
        @hseed(seed + 2)
        @given(_mutations(st))
        def properties_case(mutations: list[Mutation]) -> None:
            note("properties")
            case = run_dir / "client.properties"
            case.write_bytes(mutate(seeds.properties.encode(), mutations))
            code, found = check_cli(entry, ["--command-config", str(case), "--from-file",
                                            str(good), "jobs"], run_dir, "properties",
                                    env=env)
            case.unlink(missing_ok=True)
            result.exits[("properties", code)] += 1
            told(found)

        runs = {"dump": dump_case, "record": record_case, "properties": properties_case}
        for target in targets:
            stop_at[0] = float("inf") if share is None else time.monotonic() + share
            try:
                runs[target]()
            except _OutOfTime:
                if progress:
                    progress(f"{target}: time is up after {result.cases[target]:,} cases")
    result.seconds = time.monotonic() - started
    return result


def format_result(result: FuzzResult) -> str:
    """The campaign's figures for people: cases and exit statuses per target, findings."""
    from registry.render import table

    rows = []
    for target, n in sorted(result.cases.items()):
        exits = ", ".join(f"{code}: {count:,}" for (t, code), count in
                          sorted(result.exits.items(), key=lambda kv: str(kv[0]))
                          if t == target)
        found = sum(1 for f in result.findings.values() if f.target == target)
        rows.append([target, f"{n:,}", exits or "-", found])
    lines = [table(["target", "cases", "exit statuses", "distinct findings"], rows),
             f"{sum(result.cases.values()):,} cases in {result.seconds:.0f} s"]
    for f in result.findings.values():
        lines.append(f"FINDING {f.target}: {f.rule}: {f.detail}")
    return "\n".join(lines)
