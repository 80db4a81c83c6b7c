"""When a silence counts (``corral.core.hearing``), and the rules that use it: a lease
(``lifecycle.lease_expired``), a worker going offline or flagged dead (``core.workers``). Time is
a fake clock the tests move; the server's side (``StoreHealth``) is in test_store_health.py."""

from __future__ import annotations

from corral.core import lifecycle
from corral.core.hearing import ALWAYS, Hearing, silence_cutoff, silent
from corral.core.workers import flagged_dead, goes_offline
from corral.domain.records import Job, JobSpec, Worker, WorkerContact
from corral.domain.resources import Resources
from corral.domain.status import Status, WorkerStatus
from corral.testing.clock import FakeClock

LEASE_S = 30.0
HOLDING = WorkerContact(leased_jobs=1, last_job_heartbeat_at=None)


def worker(last_heartbeat_at: float) -> Worker:
    return Worker(
        id="w1",
        address="http://w1",
        resources=Resources(gpus=8),
        gpu_model=None,
        labels={},
        status=WorkerStatus.ACTIVE,
        registered_at=last_heartbeat_at,
        last_heartbeat_at=last_heartbeat_at,
    )


def running(last_heartbeat_at: float) -> Job:
    return Job(
        "j-1",
        JobSpec(command="true"),
        Status.RUNNING,
        last_heartbeat_at - 100,
        worker_id="w1",
        attempts=1,
        started_at=last_heartbeat_at - 100,
        last_heartbeat_at=last_heartbeat_at,
    )


def test_a_server_that_always_heard_counts_from_the_last_contact():
    clock = FakeClock()
    heard = clock.now()
    clock.advance(LEASE_S)
    assert not silent(heard, clock.now(), LEASE_S, ALWAYS)  # a contact at the cutoff is contact
    clock.advance(0.5)
    assert silent(heard, clock.now(), LEASE_S, ALWAYS)
    assert silence_cutoff(clock.now(), LEASE_S, ALWAYS) == clock.now() - LEASE_S


def test_after_a_start_a_silence_counts_from_the_start():
    """A party last heard long before the server started is silent a whole lease after the start,
    not at once."""
    clock = FakeClock()
    heard = clock.now()
    clock.advance(600)  # the server was down
    hearing = Hearing(started_at=clock.now())
    clock.advance(LEASE_S - 1)
    assert silence_cutoff(clock.now(), LEASE_S, hearing) is None
    assert not silent(heard, clock.now(), LEASE_S, hearing)
    clock.advance(2)
    assert silent(heard, clock.now(), LEASE_S, hearing)


def test_a_party_first_heard_after_the_start_is_judged_from_its_own_contact():
    """The start holds back only silences that began before it: a worker that registered after the
    start and then went silent is flagged ``after_s`` after its last contact, within the first
    lease (issue 24: the whole first lease after a start used to suspend every flag)."""
    clock = FakeClock()
    hearing = Hearing(started_at=clock.now())
    registered = clock.advance(1)
    dead_after_s = 5.0
    clock.advance(dead_after_s + 0.5)
    assert clock.now() < hearing.started_at + LEASE_S
    flagged = flagged_dead(
        worker(registered), HOLDING, now=clock.now(), after_s=dead_after_s, hearing=hearing
    )
    assert flagged is not None and flagged.flagged_dead_at == clock.now()


def test_while_the_store_fails_nothing_is_silent():
    clock = FakeClock()
    heard = clock.now()
    clock.advance(LEASE_S * 5)
    failing = Hearing(started_at=heard - 1000, store_failing_since=heard + 1)
    assert failing.since is None
    assert silence_cutoff(clock.now(), LEASE_S, failing) is None
    assert not silent(heard, clock.now(), LEASE_S, failing)
    assert lifecycle.lease_expired(running(heard), (), clock.now(), LEASE_S, failing).outcome is None
    assert goes_offline(worker(heard), HOLDING, now=clock.now(), after_s=LEASE_S, hearing=failing) is None
    assert flagged_dead(worker(heard), HOLDING, now=clock.now(), after_s=LEASE_S, hearing=failing) is None


def test_after_the_store_recovers_every_lease_gets_a_whole_lease():
    """A store stall longer than the lease: once the store takes writes again, a lease lapses only a
    whole lease after the recovery (the workers renew meanwhile); a worker that is really gone is
    reaped then."""
    clock = FakeClock()
    started = clock.now()
    heard = clock.advance(100)
    clock.advance(LEASE_S * 2)  # the store could take no write
    hearing = Hearing(started_at=started, store_recovered_at=clock.now())
    assert hearing.since == clock.now()
    clock.advance(LEASE_S - 1)
    assert lifecycle.lease_expired(running(heard), (), clock.now(), LEASE_S, hearing).outcome is None
    clock.advance(2)
    lost = lifecycle.lease_expired(running(heard), (), clock.now(), LEASE_S, hearing).outcome
    assert lost is not None and lost.job.status == Status.PENDING


def test_the_later_of_the_start_and_the_recovery_counts():
    assert Hearing(started_at=50.0, store_recovered_at=20.0).since == 50.0
    assert Hearing(started_at=50.0, store_recovered_at=80.0).since == 80.0
    assert ALWAYS.since == float("-inf")


def test_a_worker_goes_offline_only_a_whole_window_after_the_recovery():
    clock = FakeClock()
    heard = clock.now()
    recovered = clock.advance(500)
    hearing = Hearing(started_at=heard - 10, store_recovered_at=recovered)
    clock.advance(59)
    assert goes_offline(worker(heard), HOLDING, now=clock.now(), after_s=60, hearing=hearing) is None
    clock.advance(2)
    offline = goes_offline(worker(heard), HOLDING, now=clock.now(), after_s=60, hearing=hearing)
    assert offline is not None and offline.status == WorkerStatus.OFFLINE
