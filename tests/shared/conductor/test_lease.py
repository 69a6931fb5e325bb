"""The lease's verdicts, without NATS: when a holder may place, and when it must stop."""

from __future__ import annotations

from shared.conductor.lease import SAFETY, Lease, LeaseConfig


def test_a_holder_places_only_until_the_lease_it_last_sent_would_expire() -> None:
    lease = Lease(LeaseConfig(ttl=2.0))
    assert not lease.held and not lease.active(0.0)
    lease.claimed(revision=7, sent_at=10.0)
    assert lease.epoch == 7 and lease.active(10.0)
    assert lease.active(10.0 + SAFETY * 2.0 - 0.01)
    assert not lease.active(10.0 + SAFETY * 2.0)  # no renewal landed: it stops by itself
    lease.renewed(revision=9, sent_at=11.0)
    assert lease.active(12.5) and lease.epoch == 7  # renewals keep the epoch
    lease.lost()
    assert not lease.held and not lease.active(11.0)


def test_a_standby_claims_often_and_a_holder_renews_with_room_for_lost_writes() -> None:
    config = LeaseConfig(ttl=1.0)
    lease = Lease(config)
    assert lease.next_wait() == config.claim_every < config.renew_every
    lease.claimed(1, 0.0)
    assert lease.next_wait() == config.renew_every
    assert 2 * config.renew_every < SAFETY * config.ttl  # two renewals may be lost
