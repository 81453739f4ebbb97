"""Retry delays: exponential backoff with full jitter (worker/backoff.py, executor.backoff_for)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_xjobs import conf
from django_xjobs.registry import JobDefinition
from django_xjobs.worker.backoff import retry_delay
from django_xjobs.worker.executor import backoff_for


def window(attempt: int, base: float, cap: float) -> float:
    """The full-jitter window, computed without float overflow for huge attempts."""
    exponent = max(attempt - 1, 0)
    if exponent >= 1000:
        return cap
    return min(cap, base * 2.0**exponent)


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 12, 20])
def test_every_delay_lies_inside_the_full_jitter_window(attempt):
    base, cap = 2.0, 3600.0
    delays = [retry_delay(attempt, base=base, cap=cap) for _ in range(300)]
    assert all(0 <= d <= window(attempt, base, cap) for d in delays)


def test_the_delay_is_drawn_from_the_whole_window_not_just_near_its_top():
    # Full jitter spreads a herd of retries over [0, window]; "exponential plus a little noise"
    # would keep every draw near the top. 2000 draws missing either tenth: p < 1e-90.
    delays = [retry_delay(4, base=1.0, cap=100.0) for _ in range(2000)]
    assert min(delays) < 0.8
    assert max(delays) > 7.2


@pytest.mark.parametrize(
    ("rand", "expected"), [(0.0, 0.0), (0.5, 4.0), (1.0, 8.0), (0.25, 2.0)]
)
def test_an_injected_rand_makes_the_delay_deterministic(rand, expected):
    assert retry_delay(3, base=2.0, cap=3600.0, rand=lambda: rand) == pytest.approx(expected)


def test_the_window_doubles_with_each_attempt():
    top = [retry_delay(a, base=0.5, cap=1e9, rand=lambda: 1.0) for a in range(1, 8)]
    assert top == pytest.approx([0.5, 1, 2, 4, 8, 16, 32])


def test_the_cap_bounds_the_window():
    assert retry_delay(30, base=2.0, cap=60.0, rand=lambda: 1.0) == 60.0
    assert retry_delay(6, base=2.0, cap=60.0, rand=lambda: 1.0) == 60.0  # 2 * 32 = 64 > 60
    assert retry_delay(5, base=2.0, cap=60.0, rand=lambda: 1.0) == 32.0


@pytest.mark.parametrize("attempt", [63, 64, 1024, 10_000, 10**9, 2**63])
def test_huge_attempt_numbers_do_not_overflow(attempt):
    assert retry_delay(attempt, base=2.0, cap=3600.0, rand=lambda: 1.0) == 3600.0
    assert 0 <= retry_delay(attempt, base=2.0, cap=3600.0) <= 3600.0


@pytest.mark.parametrize("attempt", [0, -1, -100])
def test_an_attempt_below_one_uses_the_first_window(attempt):
    assert retry_delay(attempt, base=3.0, cap=100.0, rand=lambda: 1.0) == 3.0


@settings(max_examples=300, deadline=None)
@given(
    attempt=st.integers(min_value=1, max_value=10**12),
    base=st.floats(min_value=0.001, max_value=100.0),
    extra=st.floats(min_value=0.0, max_value=1e6),
    r=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_full_jitter_bounds_hold_for_any_policy(attempt, base, extra, r):
    cap = base + extra
    delay = retry_delay(attempt, base=base, cap=cap, rand=lambda: r)
    assert 0 <= delay <= window(attempt, base, cap)


def test_a_jobs_own_policy_overrides_the_settings():
    settings = conf.build({"RETRY_BASE": "1s", "RETRY_CAP": "2s"})
    slow = JobDefinition.build(lambda ctx: None, name="t.slow_policy", retry_base="100s",
                               retry_cap="500s")
    tops = {backoff_for(slow, 4, settings) for _ in range(200)}
    assert max(tops) <= 500.0
    assert max(tops) > 2.0  # the settings' 2 s cap would have clipped every one of these


def test_without_a_definition_the_settings_policy_applies():
    settings = conf.build({"RETRY_BASE": "1s", "RETRY_CAP": "3s"})
    delays = [backoff_for(None, attempt, settings)
              for attempt, _ in itertools.product(range(1, 10), range(50))]
    assert all(0 <= d <= 3.0 for d in delays)
    assert max(delays) > 1.0  # attempts past the first widen the window up to the cap


def test_without_jitter_the_delay_is_the_whole_window_and_base_equal_to_cap_is_fixed():
    settings = conf.build({})
    doubling = JobDefinition.build(lambda ctx: None, name="t.no_jitter", retry_base="1s",
                                   retry_cap="5s", retry_jitter=False)
    assert [backoff_for(doubling, a, settings) for a in range(1, 6)] == [1, 2, 4, 5, 5]
    fixed = JobDefinition.build(lambda ctx: None, name="t.fixed", retry_base="3s",
                                retry_cap="3s", retry_jitter=False)
    assert {backoff_for(fixed, a, settings) for a in range(1, 20)} == {3}
