"""Built-in lease election on the registry log (the shape of kazoo's ``Election``).

::

    with registry.elect("jm-1", lease=5.0, on_revoked=stop_work) as term:
        term.recover(...)            # this contender leads; the lease is renewed for it
        ...                          # leaving the block revokes the term

How it decides, with no clock shared between machines:

* A contender reads the log every ``lease / 4`` (and once more when the lease
  it waits out runs out). It notes, on its *own*
  monotonic clock, when it last saw the leadership make progress (a grant, a
  renewal, a revoke). It claims the next epoch (a compare-and-set grant, so
  of several contenders one wins) when no term is active, or when it has seen
  no progress for a full lease of the current term. The grant says what the
  contender saw of the term (``saw_renewal``: the highest renewal ordinal in the
  image of the round that decided to claim), and the fold refuses it
  (``renewed_since``, fold rule 3) if the leader renewed after that read: a
  leader that renews keeps its term, however late a contender's claim arrives.
  The contender counts such a refusal as progress (its lease clock starts again)
  and goes on waiting.
* A waiting contender is a hot standby: each read folds the namespace's log
  into its registry's image, every job included, so its claim and its
  ``recover`` read only the tail of the log written since its last round, not
  the whole; and it makes its producers while it waits
  (:meth:`~registry.client.Registry.prepare_claim`: they write nothing, and
  fence nobody, until its claim and its term do).
* The leader renews (``LeaseRenewed``) every ``lease / 4``, and retries a
  failed renewal after 0.1 s. Each renewal carries its ordinal (one more than
  the highest the renewer folded or sent) and its ``attempts`` (the refused grant
  attempts it had folded, plus the renewals it sent and did not see confirmed),
  which choose its key (:func:`registry.keys.lease_key`); the write path never
  re-sends a renewal (the renewer plans a new one after reading the log). Its lease runs
  from the moment it *sent* its last successful renewal (or its grant), which
  is before any contender can have seen it; it writes nothing once
  ``0.9 x lease`` has passed since then (:class:`~registry.errors.LeaseExpired`),
  so it stops before its lease can have run out on anyone else's clock.
* A broker disconnect costs nothing while the leader can renew before any
  contender's lease clock runs out: renewals fail and are retried, the leader
  keeps its term, and a renewal after the disconnect restarts the lease
  (incident 001: Flink's leader gave up on the first SUSPENDED). A contender
  last saw a renewal at most ``lease / 4`` before the disconnect began, and
  the client needs up to a reconnect (librdkafka backs off at most 250 ms
  here) plus one renewal round trip (and one read of the log before it, if
  the leader's own lease ran out meanwhile) after it ends; so a disconnect of up to
  about ``0.75 x lease - 0.5 s`` never causes a failover, and a longer one may. If the lease runs out, the leader stops writing but keeps
  trying to renew: if nobody took over, it simply continues.
* When the leader learns its term is over (a newer grant, or a revoke), it
  stops renewing and calls ``on_revoked(term)`` once; from then on its writes
  raise :class:`~registry.errors.Fenced` (nothing sent).
* The leader learns that from the log, read by the renewer itself: a round
  whose lease has run out reads the log *before* sending anything, and a
  round whose renewal failed in any way (refused, broker unreachable, outcome
  unknown, or an error that is not a ``RegistryError`` at all) reads it at
  once. It never relies on the write path having read the log
  (after a failure it may not have) nor on what the write path raised: the
  fold's fencing rule is asked of the image just read. A read that fails is
  retried after 0.1 s, for as long as it takes; the renewer never stops on an
  error, only on a lost term or :meth:`Election.cancel`.

What happens when the process is paused (GC, SIGSTOP) for longer than the
lease: a contender takes over; when the old leader resumes, its lease has
expired, so its writes raise ``LeaseExpired`` (nothing sent) and its renewer's
next round reads the log before renewing; it sees the newer grant (or the
revoke) and calls ``on_revoked``, without having sent anything, so it never
fences the new leader's producer. **Liveness bound:** a resumed leader whose
term is over learns it, and calls ``on_revoked``, within the registry's
``timeout`` + 0.1 s (at most ``lease / 2 + 0.1 s``) of reaching the broker,
plus one read of the log: the renewer's wait has run out during the pause, so
it reads at once; a read that was under way while the broker was unreachable
fails within ``timeout``, and the next starts 0.1 s later. (If the pause
caught a renewal in flight, that renewal first ends as the write path ends
it; its failure is followed by a read, its refusal is the verdict.)
Safety never rests on these timings: every write is fenced by the fold.

**A leader on behalf of another process** (``keep_alive``): a contender that leads for
someone else (the Flink bridge leads for its JVM, :mod:`registry.flink_bridge`) passes
``keep_alive``, asked before every claim and every renewal. While it says no, the contender
does not claim and the leader does not renew; a leader whose lease runs out so gives the
term up (``on_revoked``, reason ``not_alive``; nothing is written: its lease has run out, so
a contender takes over after a silent lease), so a paused owner loses the term although the
contender itself runs. ``on_renewed(term)`` is called after each successful renewal
(:meth:`Election.valid_for` says for how long the term is then certainly valid).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import stalls
from .errors import (
    ClaimRejected,
    ConfigError,
    ElectionCancelled,
    ElectionTimeout,
    Fenced,
    LeaseExpired,
    RegistryError,
)

if TYPE_CHECKING:
    from .client import Registry, Term
    from .image import Image

__all__ = ["Election", "lease_clock", "next_look"]

_log = logging.getLogger("registry")

_SAFETY = 0.9  # the leader stops writing at 90% of its lease (clock rate drift, scheduling)

_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def lease_clock() -> float:
    """The clock leases run on, in seconds: ``CLOCK_BOOTTIME`` where the system has one
    (Linux), which counts the time the host was suspended (``CLOCK_MONOTONIC``, Python's
    :func:`time.monotonic`, stops then: a leader resumed from a suspend longer than its
    lease would still say it certainly leads while a standby does), else
    :func:`time.monotonic`. Both run through a SIGSTOP and ignore steps of the wall clock."""
    if _BOOTTIME is None:
        return time.monotonic()
    return time.clock_gettime(_BOOTTIME)


def next_look(lease: float, lease_ms: int | None, silent: float) -> float:
    """How long a contender of ``lease`` seconds waits before it reads the log again, when
    the current term's lease is ``lease_ms`` (``None``: not said) and it has seen no progress
    of the leadership for ``silent`` seconds: ``lease / 4``, or less when the term's lease
    runs out sooner (so it claims when it runs out, not up to ``lease / 4`` later)."""
    if lease_ms is None:
        return lease / 4
    return max(0.0, min(lease / 4, lease_ms / 1000 - silent))


class Election:
    """Wait to lead a namespace, keep the lease while leading, and say when it is lost.

    Use :meth:`registry.client.Registry.elect`. ``clock`` is injectable for tests.
    """

    def __init__(self, registry: Registry, contender: str, lease: float, *,
                 on_revoked: Callable[[Term], object] | None = None,
                 on_renewed: Callable[[Term], object] | None = None,
                 keep_alive: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = lease_clock) -> None:
        if lease <= 0:
            raise ConfigError(f"a lease must be positive, not {lease}")
        if registry.timeout > lease / 2:
            raise ConfigError(f"the registry's timeout ({registry.timeout:g} s) must be at most "
                              f"half the lease ({lease:g} s), so a renewal can fail and be "
                              "retried within one lease")
        self.registry = registry
        self.contender = contender
        self.lease = lease
        self.on_revoked = on_revoked
        self.on_renewed = on_renewed
        self.keep_alive = keep_alive
        """Asked before every claim and renewal (``None``: always yes); see the module
        docstring."""
        self._clock = clock
        self._cancelled = threading.Event()
        self._lost = threading.Event()
        self._renewer: threading.Thread | None = None
        self._valid_until = 0.0
        self._due = 0.0  # when the next renewal is due (jobreg_lease_renewal_lateness_seconds)
        self._fenced: Fenced | None = None  # why the term is over, once the renewer learnt it
        self._renewed_since = False  # the last claim was refused: the leader renewed since
        self._warned = False  # the renewer reported an unexpected error in this run of failures
        self.term: Term | None = None
        self.claim_started: float | None = None
        """When (on the election's clock) the claim that won began: the wait for the lease
        ends there, and the takeover starts (``None`` until this contender leads)."""

    # -- kazoo-shaped API --------------------------------------------------------

    def __enter__(self) -> Term:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.cancel(revoke=True)

    def acquire(self, timeout: float | None = None) -> Term:
        """Block until this contender leads; return its :class:`~registry.client.Term`.

        Raises :class:`~registry.errors.ElectionTimeout` (a ``TimeoutError``) after
        ``timeout`` seconds (``None``: wait for ever) and
        :class:`~registry.errors.ElectionCancelled` (a ``RuntimeError``) if :meth:`cancel`
        was called meanwhile; a claim refused by configuration (a
        :class:`~registry.errors.ConfigError`, such as
        :class:`~registry.errors.NamespaceMoved`) is raised as is, not retried.
        """
        deadline = None if timeout is None else self._clock() + timeout
        seen: tuple[int, int, bool] | None = None
        changed_at = self._clock()
        while not self._cancelled.is_set():
            wait = self.lease / 4
            try:
                image = self.registry.sync()
            except RegistryError:
                image = None  # broker unreachable: keep the clock, try again
            if image is not None:
                stalls.point("election.read", contender=self.contender, epoch=image.epoch)
                info = image.term
                progress = (image.epoch, info.renewals if info else 0, image.revoked)
                if progress != seen:
                    seen, changed_at = progress, self._clock()
                lease_ms = info.lease_ms if info is not None else None
                silent = self._clock() - changed_at
                if not self._owner_alive():
                    self._prepare()  # a hot standby still, but it claims for nobody
                elif image.active_leader is None or (
                        lease_ms is not None and silent >= lease_ms / 1000):
                    term = self._claim(image)
                    if term is not None:
                        return term
                    if self._renewed_since:
                        # Fold rule 3: the leader renewed after this round's read. That is
                        # progress: wait a full lease from now before claiming again.
                        changed_at = self._clock()
                else:
                    self._prepare()
                    wait = next_look(self.lease, lease_ms, silent)
            if deadline is not None and self._clock() >= deadline:
                raise ElectionTimeout(f"{self.contender!r} did not become leader within "
                                      f"{timeout} s")
            self._cancelled.wait(wait)
        raise ElectionCancelled("the election was cancelled")

    def cancel(self, revoke: bool = False) -> None:
        """Stop contending (or leading). With ``revoke``, a leader gives its term up first."""
        if revoke and self.term is not None and not self._lost.is_set():
            try:
                if self.lease_valid():
                    self.term.revoke("election left")
            except RegistryError:
                pass  # the term ends anyway when the lease runs out
        self._cancelled.set()
        if self._renewer is not None:
            self._renewer.join(self.lease + self.registry.timeout)

    @property
    def is_leader(self) -> bool:
        """True while this contender holds an unexpired, unrevoked term (one it has not
        begun to give up: :attr:`Term.resigned`)."""
        return self.valid_for() > 0

    def lease_valid(self) -> bool:
        """True until ``0.9 x lease`` after the last successful renewal was sent."""
        return self._clock() < self._valid_until

    def valid_for(self) -> float:
        """Seconds for which the lease is certainly still valid from now (0: not leading):
        ``0.9 x lease`` from when the last successful renewal (or the grant) was sent; 0 from
        the moment the term's own :meth:`~registry.client.Term.revoke` is called (once the
        revoke lands, a contender may be granted without waiting for the lease)."""
        if self.term is None or self._lost.is_set() or self.term.resigned:
            return 0.0
        return max(0.0, self._valid_until - self._clock())

    def _owner_alive(self) -> bool:
        return self.keep_alive is None or bool(self.keep_alive())

    # -- internals ---------------------------------------------------------------------

    def _prepare(self) -> None:
        # A standby makes its producers while it waits (Registry.prepare_claim: they fence
        # nobody until its claim), so that its claim does not wait for them to start.
        try:
            self.registry.prepare_claim()
        except RegistryError as e:  # the claim makes them if they are not made by then
            _log.debug("%r could not prepare its claim (%s); trying again next round",
                       self.contender, e)

    def _claim(self, image: Image) -> Term | None:
        self._renewed_since = False
        info = image.term
        # What this round saw of the current term: the grant is a compare-and-set on it
        # (fold rule 3: refused if the leader renewed after this read).
        saw = info.renewal if info is not None and info.epoch == image.epoch else 0
        stalls.point("election.claiming", contender=self.contender, epoch=image.epoch,
                     saw_renewal=saw)
        started = self._clock()  # the lease runs from before the grant was sent
        try:
            # From the image this round has just read: the compare-and-set decides anyway.
            term = self.registry._claim_leadership(self.contender, round(self.lease * 1000),
                                                   image, saw_renewal=saw)
        except ClaimRejected as e:
            # Another contender won the compare-and-set, or the leader renewed since.
            self._renewed_since = e.reason == "renewed_since"
            return None
        except ConfigError:
            raise  # no retry mends it (the namespace moved: registry.placement)
        except RegistryError:
            return None  # unreachable or unknown outcome: look again
        self._valid_until = started + _SAFETY * self.lease
        self._due = started + self.lease / 4
        self.claim_started = started
        term.guard_writes(self._guard)
        self.term = term
        self._renewer = threading.Thread(target=self._renew_loop, args=(term,),
                                         name=f"jobreg-lease-{self.contender}", daemon=True)
        self._renewer.start()
        return term

    def _guard(self) -> None:
        fenced = self._fenced
        if fenced is not None:  # the term is over: say so, and send nothing
            raise Fenced(fenced.reason, fenced.detail, expected_epoch=fenced.expected_epoch,
                         actual_epoch=fenced.actual_epoch, leader=fenced.leader)
        if not self.lease_valid():
            raise LeaseExpired(f"the lease of term {self.term.epoch if self.term else '?'} "
                               f"of {self.contender!r} has not been renewed in time; not "
                               "writing until it is")

    def _renew_loop(self, term: Term) -> None:
        period, retry = self.lease / 4, min(0.1, self.lease / 20)
        wait, failures = period, 0
        while not self._cancelled.wait(wait):
            wait = retry  # until this round renews
            if term.resigned:
                # The term is being given up (Term.revoke() was called), whether or not the
                # revoke landed: it is never renewed again, so a revoke that failed (a
                # lapsed lease, an unknown outcome) still hands the leadership on after a
                # silent lease, as a dead leader's does.
                if not self.lease_valid():
                    self._lose(term, Fenced(
                        "resigned", f"term {term.epoch} of {self.contender!r} was given up "
                        "(Term.revoke()); its lease ran out unrenewed", actual_epoch=term.epoch))
                    return
                continue
            if not self._owner_alive():
                # The process this contender leads for is not alive: no renewal. Once the
                # lease has run out the term is given up (a contender takes over after a
                # silent lease); nothing is written, the lease may have run out elsewhere.
                if not self.lease_valid():
                    self._lose(term, Fenced(
                        "not_alive", f"the lease of term {term.epoch} of {self.contender!r} "
                        "ran out while its owner was not alive", actual_epoch=term.epoch))
                    return
                continue
            if not self.lease_valid():
                # It may have been replaced (a pause, a long disconnect): it reads the
                # log before it sends anything.
                verdict = self._read_log(term, failures)
                if verdict == "lost":
                    return
                if verdict == "unreadable":
                    failures += 1
                    continue
            # Planned from the image as read so far (fold rule 3): the ordinal, and the
            # refused grant attempts folded plus the term's renewals whose call raised,
            # choose the renewal's key (Term.renew_lease counts those).
            renewal, attempts = term.plan_renewal()
            stalls.point("election.renewing", contender=self.contender, epoch=term.epoch,
                         renewal=renewal)
            sent = self._clock()
            metrics = self.registry.metrics
            try:
                term.renew_lease(renewal, attempts)
            except Fenced as e:
                metrics.renewal("fenced")
                self._lose(term, e)
                return
            except Exception as e:  # noqa: BLE001 - the renewer must outlive any failure
                metrics.renewal("failed")
                # The broker unreachable, the outcome unknown, a refusal, or an error of a
                # library: the write path may not have read the log, so read it here and
                # decide from that. The term is kept unless the log shows it is over.
                self._note_failure(term, e, failures)
                failures += 1
                if self._read_log(term, failures) == "lost":
                    return
                continue
            failures, self._warned = 0, False
            self._valid_until = sent + _SAFETY * self.lease
            metrics.renewal("renewed", sent - self._due)
            self._due = sent + period
            wait = period
            if self.on_renewed is not None:
                self.on_renewed(term)

    def _read_log(self, term: Term, failures: int) -> str:
        """Read the log and ask the fold's fencing rule whether ``term`` is over (then lose
        it): ``"lost"``, ``"current"``, or ``"unreadable"`` (the caller tries again)."""
        try:
            self.registry.sync()
        except Exception as e:  # noqa: BLE001 - unreadable now, whatever the reason
            self._note_failure(term, e, failures)
            return "unreadable"
        fenced = term.fenced()
        if fenced is None:
            return "current"
        self._lose(term, fenced)
        return "lost"

    def _note_failure(self, term: Term, error: Exception, failures: int) -> None:
        # A RegistryError is the expected way to fail (the broker is away); anything else
        # is a defect below us: a warning with its traceback, once per run of failures.
        expected = isinstance(error, RegistryError)
        warn = not expected and not self._warned
        self._warned = self._warned or warn
        _log.log(logging.WARNING if warn else logging.DEBUG,
                 "lease renewal of term %d of %r failed (%d in a row; %s: %s); reading the "
                 "log and retrying", term.epoch, self.contender, failures + 1,
                 type(error).__name__, error, exc_info=error if warn else None)

    def _lose(self, term: Term, fenced: Fenced) -> None:
        if self._lost.is_set():
            return
        self._fenced = fenced
        self._lost.set()
        self._valid_until = 0.0
        if self.on_revoked is not None:
            self.on_revoked(term)
