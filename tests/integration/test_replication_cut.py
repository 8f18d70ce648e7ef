"""The network between a SYNC_MASTER and its slave cut and healed (issue 7), with real processes.

The slave dials its master through a TCP proxy the test controls
(tests/integration/workers/tcp_proxy.py, ``haMasterAddress`` = the proxy), which cannot reach
the master's data socket, so the data stays on the stream (ha_wire's fallback). The master waits
``syncFlushTimeout`` = 1 s for a slave's ack and drops a slave silent for
``haHousekeepingInterval`` = 4 s. Two kinds of cut, as the design (issue7 design, HaWaiter) says:

1. A partition (``blackhole``: connections stay open, no byte moves). The master still counts
   the slave as connected and in sync, so a send waits its 1 s and is stored with
   FLUSH_SLAVE_TIMEOUT (never SEND_OK: no ack can arrive) while the master's stats show the
   slave's lag in bytes and seconds. Once the slave has been silent for the housekeeping
   interval it leaves the in-sync set and sends get SLAVE_NOT_AVAILABLE at once.
2. The peer gone (``cut``: every connection reset, new ones refused). The master sees the stream
   end, so sends get SLAVE_NOT_AVAILABLE at once, well before the housekeeping interval.

After each heal the slave reconnects (backoff at most 5 s), is in sync again, sends are SEND_OK,
and it catches up with everything stored meanwhile: at the end both commitlogs are
byte-identical.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rocketq._api.rocketq.v1 import messaging_pb2_grpc
from tests.integration.cluster import start_nameserver
from tests.integration.replication_support import (
    assert_same_commitlogs,
    create_group,
    create_topics,
    runtime_stats,
    send_batch,
    start_ha_slave,
    start_master,
    status_name,
    wait_in_sync,
    wait_replicated,
)
from tests.integration.workers.tcp_proxy import start_proxy
from tests.support.raw_client import RawClient
from tests.support.until import until

pytestmark = pytest.mark.integration

TOPIC = "HaCut"
QUEUES = 2
SYNC_FLUSH_TIMEOUT_MS = 1000
HOUSEKEEPING_MS = 4000
PROXY_HOST = "127.0.0.2"


class Sender:
    """Sends one message at a time to the master; records (status, seconds taken)."""

    def __init__(self, stub: messaging_pb2_grpc.MessagingStub) -> None:
        self.stub = stub
        self.n = 0

    async def send(self) -> tuple[str, float]:
        self.n += 1
        t0 = time.monotonic()
        (res,) = await send_batch(self.stub, TOPIC, self.n % QUEUES, [f"cut-{self.n}".encode()])
        return status_name(res.status), time.monotonic() - t0

    async def until_status(self, want: str, within_s: float) -> list[tuple[str, float, float]]:
        """Send until a send returns ``want``; every (status, took, at) seen, ``at`` counted
        from this call. Fails if ``want`` does not come within ``within_s``."""
        start = time.monotonic()
        seen: list[tuple[str, float, float]] = []

        async def got_want() -> bool:
            status, took = await self.send()
            seen.append((status, took, time.monotonic() - start))
            return status == want

        try:
            await until(got_want, f"a {want} send", within_s, interval_s=0)
        except AssertionError:
            raise AssertionError(f"no {want} within {within_s}s: {seen}") from None
        return seen


async def test_cut_gives_flush_slave_timeout_then_slave_not_available_and_heals(
    tmp_path: Path,
) -> None:
    ns = start_nameserver(tmp_path)
    master = start_master(
        tmp_path,
        [ns.addr],
        brokerRole="SYNC_MASTER",
        syncFlushTimeout=SYNC_FLUSH_TIMEOUT_MS,
        haHousekeepingInterval=HOUSEKEEPING_MS,
    )
    # The proxy listens on another loopback address than the master (127.0.0.1), so the
    # master's data socket is not reachable at the proxy's host: the slave falls back to
    # replicating on the stream, and every replicated byte crosses the proxy.
    proxy, ctl = start_proxy(tmp_path, master.addr, listen=f"{PROXY_HOST}:0")
    slave = start_ha_slave(tmp_path, [ns.addr], haMasterAddress=proxy.addr)

    async def healed(sender: Sender) -> None:
        ctl.heal()
        await wait_in_sync(master.addr, timeout_s=20)
        status, _ = await sender.send()
        assert status == "SEND_OK", status

    try:
        await create_topics(master.addr, "broker-a", [TOPIC], QUEUES)
        await create_group(master.addr, "broker-a", "ha-cut")
        await wait_in_sync(master.addr)
        async with RawClient(master.addr) as raw:
            sender = Sender(raw.messaging)
            for _ in range(10):
                assert (await sender.send())[0] == "SEND_OK"

            # 1. Partition: the slave looks connected, acks stop.
            ctl.blackhole()
            (status, took) = await sender.send()
            assert status == "FLUSH_SLAVE_TIMEOUT", status
            assert SYNC_FLUSH_TIMEOUT_MS / 1000 * 0.9 <= took < SYNC_FLUSH_TIMEOUT_MS / 1000 + 1.5
            stats = await runtime_stats(master.addr)
            assert len(stats.slaves) == 1, stats.slaves
            lag = stats.slaves[0]
            assert lag.lag_bytes > 0 and lag.lag_seconds >= 0.5, lag
            seen = await sender.until_status("SLAVE_NOT_AVAILABLE", HOUSEKEEPING_MS / 1000 + 6)
            statuses = {s for s, _, _ in seen[:-1]}
            assert statuses <= {"FLUSH_SLAVE_TIMEOUT"}, seen
            assert seen[-1][2] >= HOUSEKEEPING_MS / 1000 - 1.5 - 1.0, f"dropped too soon: {seen}"
            for _ in range(3):  # no slave in sync: answered at once, not after the timeout
                status, took = await sender.send()
                assert status == "SLAVE_NOT_AVAILABLE" and took < 0.5, (status, took)
            stats = await runtime_stats(master.addr)
            assert not any(s.in_sync for s in stats.slaves), stats.slaves
            await healed(sender)

            # 2. The slave's end goes away: the master notices at once.
            await wait_replicated(master.addr, slave.addr, [TOPIC], QUEUES)
            ctl.cut()
            t_cut = time.monotonic()
            seen = await sender.until_status("SLAVE_NOT_AVAILABLE", HOUSEKEEPING_MS / 1000)
            assert time.monotonic() - t_cut < HOUSEKEEPING_MS / 1000 - 1, seen
            for _ in range(5):  # stored all the same, for the slave to fetch after the heal
                assert (await sender.send())[0] == "SLAVE_NOT_AVAILABLE"
            await healed(sender)
        end = await wait_replicated(master.addr, slave.addr, [TOPIC], QUEUES)
        assert slave.stop() == 0
        assert master.stop() == 0
        assert_same_commitlogs(master.workdir / "store", slave.workdir / "store", end)
    finally:
        for sp in (slave, proxy, master, ns):
            sp.kill()
