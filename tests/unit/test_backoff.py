"""The retry-delay helper the SDK and the services share (rocketq.backoff): bounds, growth, cap,
reset, jitter. Seeded random; nothing sleeps."""

from __future__ import annotations

import random
import subprocess
import sys
from types import ModuleType

import pytest

from rocketq import backoff

pytestmark = pytest.mark.unit

COPIES = [pytest.param(backoff, id="rocketq.backoff")]


@pytest.mark.parametrize("mod", COPIES)
def test_without_jitter_doubles_to_the_cap_and_resets(mod: ModuleType) -> None:
    b = mod.Backoff(0.1, 5.0, jitter=mod.Jitter.NONE)
    assert [b.next_delay_ms() for _ in range(9)] == [
        100,
        200,
        400,
        800,
        1600,
        3200,
        5000,
        5000,
        5000,
    ]
    assert b.failures == 9
    b.reset()
    assert b.failures == 0
    assert b.next_delay_ms() == 100


@pytest.mark.parametrize("mod", COPIES)
@pytest.mark.parametrize("jitter", ["EQUAL", "FULL"])
def test_jittered_delays_stay_below_the_next_step_and_within_bounds(
    mod: ModuleType, jitter: str
) -> None:
    b = mod.Backoff(0.2, 5.0, jitter=mod.Jitter[jitter], rng=random.Random(7))
    base_s = 0.2
    for _ in range(40):
        step_s = min(base_s * 2, 5.0)
        low_s = 0.2 if jitter == "FULL" else max(0.2, step_s / 2)
        assert 0.2 <= low_s <= b.next_delay_s() <= step_s <= 5.0
        base_s = step_s
    assert base_s == 5.0  # reached the cap, and no delay went past it


@pytest.mark.parametrize("mod", COPIES)
def test_jitter_spreads_even_the_first_retry_and_grows(mod: ModuleType) -> None:
    rng = random.Random(42)
    first = [mod.Backoff(0.1, 2.0, rng=rng).next_delay_s() for _ in range(50)]
    assert len({round(d, 6) for d in first}) > 40, "peers must not retry in lockstep"
    assert all(0.1 <= d <= 0.2 for d in first)
    b = mod.Backoff(0.1, 2.0, rng=rng)
    delays = [b.next_delay_s() for _ in range(8)]
    assert delays[0] <= 0.2 <= delays[1] <= 0.4 <= delays[2] <= 0.8 <= delays[3]
    assert all(1.0 <= d <= 2.0 for d in delays[4:])  # at the cap: half of it at least


@pytest.mark.parametrize("mod", COPIES)
def test_reset_starts_again_from_the_floor(mod: ModuleType) -> None:
    b = mod.Backoff(0.1, 5.0, jitter=mod.Jitter.FULL, rng=random.Random(1))
    for _ in range(10):
        b.next_delay_s()
    b.reset()
    assert b.failures == 0
    assert 0.1 <= b.next_delay_s() <= 0.2


@pytest.mark.parametrize("mod", COPIES)
def test_same_seed_same_delays(mod: ModuleType) -> None:
    one = mod.Backoff(0.1, 5.0, rng=random.Random(3))
    two = mod.Backoff(0.1, 5.0, rng=random.Random(3))
    assert [one.next_delay_s() for _ in range(8)] == [two.next_delay_s() for _ in range(8)]


@pytest.mark.parametrize("mod", COPIES)
def test_multiplier_and_bad_bounds(mod: ModuleType) -> None:
    b = mod.Backoff(1.0, 10.0, multiplier=3.0, jitter=mod.Jitter.NONE)
    assert [b.next_delay_s() for _ in range(4)] == [1.0, 3.0, 9.0, 10.0]
    with pytest.raises(ValueError):
        mod.Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        mod.Backoff(2.0, 1.0)
    with pytest.raises(ValueError):
        mod.Backoff(0.1, 1.0, multiplier=0.5)


def test_the_helper_loads_without_grpc() -> None:
    """rocketq.backoff (and the lazy rocketq package) must not pull grpc in."""
    code = (
        "import sys, rocketq.backoff; "
        "bad = [m for m in ('grpc', 'google.protobuf', 'aetcd') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
