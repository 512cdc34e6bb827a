"""A store that answers, but slowly: answers slower than half the time an answer may take,
several in a row, open the breaker as a failure does; a fast answer between them starts the
count again (the policy alone, with answers made to have taken what a test says)."""

from __future__ import annotations

from kernelcache.remote.policy import SLOW_IN_A_ROW, FailurePolicy


def _policy() -> FailurePolicy:
    return FailurePolicy(
        "redis://x", "redis://x", stats_root=None, breaker=60, read_only=False, bound=2, answer=1
    )


def _answer(policy: FailurePolicy, took: float, shard: str = "") -> None:
    ticket = policy.admit(shard)
    assert ticket is not None
    ticket.started -= took
    policy.settle(ticket, True)


def test_slow_answers_in_a_row_open_the_breaker():
    policy = _policy()
    assert policy.slow_after == 0.5
    for _ in range(SLOW_IN_A_ROW - 1):
        _answer(policy, 0.6)
    assert policy.usable()
    _answer(policy, 0.6)
    assert not policy.usable()
    assert policy.counters["breaker_trips"] == 1


def test_a_fast_answer_starts_the_count_again_and_failures_do_not_count_as_slow():
    policy = _policy()
    for _ in range(3):
        for _ in range(SLOW_IN_A_ROW - 1):
            _answer(policy, 0.6)
        _answer(policy, 0.01)
    ticket = policy.admit()
    assert ticket is not None
    ticket.started -= 0.9
    policy.settle(ticket, False)  # (failed: the failure's own accounting, not a slow answer)
    assert policy.usable() and policy.counters.get("breaker_trips", 0) == 0


def test_a_slow_shard_opens_its_own_breaker_only():
    policy = _policy()
    for _ in range(SLOW_IN_A_ROW):
        _answer(policy, 0.6, shard="10.0.0.1:6379")
        _answer(policy, 0.01, shard="10.0.0.2:6379")
    assert not policy.usable("10.0.0.1:6379")
    assert policy.usable("10.0.0.2:6379") and policy.usable()
