"""The slave's frame reader on the replication data socket (services/broker/ha_wire.py): frames
cut anywhere by the transport's reads come out whole and in order; a bad frame ends it."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

import pytest

from services.broker import ha_wire

Frame = tuple[int, int, bytes, int, int, int]


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def _encode(frame: Frame) -> bytes:
    kind, offset, data, pace_ms, confirm, version = frame
    return ha_wire.FRAME.pack(kind, offset, len(data), pace_ms, confirm, version) + data


def _feed(
    reader: ha_wire.FrameReader, wire: bytes, rng: random.Random, ends: list[int] | None = None
) -> None:
    """What a transport does: ask for a buffer, read some bytes into it, say how many. Reads
    of random sizes, some stopping a byte short of a frame's end (``ends``) or right at it."""
    pos = 0
    ends = ends or [len(wire)]
    while pos < len(wire):
        buf = reader.get_buffer(-1)
        assert len(buf) > 0
        to_end = next(e for e in ends if e > pos) - pos
        sizes = [1, 7, 37, 4096, 65536, 1 << 20, to_end, max(1, to_end - 1)]
        n = min(len(buf), len(wire) - pos, rng.choice(sizes))
        buf[:n] = wire[pos : pos + n]
        reader.buffer_updated(n)
        pos += n


def _frames(rng: random.Random, count: int) -> list[Frame]:
    out: list[Frame] = []
    offset = 0
    for _ in range(count):
        if rng.random() < 0.2:
            out.append((ha_wire.CONFIRM, offset, b"", 0, rng.randrange(offset + 1), 3))
            continue
        size = rng.choice([1, 100, 4096, 300_000, ha_wire.CHUNK_BYTES_MAX])
        data = rng.randbytes(size)
        confirm = ha_wire.NO_CONFIRM if rng.random() < 0.5 else offset
        out.append((ha_wire.CHUNK, offset, data, rng.choice([0, 3]), confirm, 3))
        offset += size
    return out


def _collect(got: list[Any]) -> ha_wire.FrameHandler:
    """A handler that keeps each frame, its data copied (the reader hands a view of its buffer,
    which the next read overwrites)."""

    def keep(kind: int, offset: int, data: memoryview, *rest: int) -> None:
        got.append((kind, offset, bytes(data), *rest))

    return keep


@pytest.mark.parametrize("seed", range(6))
async def test_frames_cut_anywhere_by_reads_come_out_whole_and_in_order(seed: int) -> None:
    rng = random.Random(seed)
    sent = _frames(rng, 40)
    got: list[Frame] = []
    reader = ha_wire.FrameReader(_collect(got))
    reader.connection_made(_Transport())
    encoded = [_encode(f) for f in sent]
    ends = list(itertools.accumulate(len(e) for e in encoded))
    _feed(reader, b"".join(encoded), rng, ends)
    assert got == sent
    assert not reader.ended.done()
    reader.connection_lost(None)
    assert reader.ended.result() is None


@pytest.mark.parametrize(
    ("head", "why"),
    [
        ((ha_wire.CHUNK, 0, ha_wire.CHUNK_BYTES_MAX + 1, 0, -1, 0), "bytes"),
        ((ha_wire.CONFIRM, 0, 5, 0, 7, 0), "kind 2, 5 bytes"),
    ],
)
async def test_a_frame_that_breaks_the_layout_ends_the_reader(
    head: tuple[int, ...], why: str
) -> None:
    got: list[Any] = []
    reader = ha_wire.FrameReader(_collect(got))
    transport = _Transport()
    reader.connection_made(transport)
    good = _encode((ha_wire.CHUNK, 0, b"abc", 0, -1, 0))
    _feed(reader, good + ha_wire.FRAME.pack(*head), random.Random(0))
    assert len(got) == 1  # the good frame before it was taken
    with pytest.raises(ha_wire.FrameError, match=why):
        reader.ended.result()
    assert transport.aborted


async def test_an_error_of_the_frame_handler_ends_the_reader() -> None:
    def refuse(*_frame: object) -> None:
        raise ValueError("replicated bytes rejected")

    reader = ha_wire.FrameReader(refuse)
    transport = _Transport()
    reader.connection_made(transport)
    _feed(reader, _encode((ha_wire.CHUNK, 0, b"x" * 10, 0, -1, 0)), random.Random(0))
    with pytest.raises(ValueError, match="rejected"):
        reader.ended.result()
    assert transport.aborted
