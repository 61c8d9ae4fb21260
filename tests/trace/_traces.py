"""Seeded traces shared by the trace tests, and the brute-force peak they are checked against."""

from __future__ import annotations

import random

from tensorarena.trace import Event, Trace


def random_events(count: int, *, seed: int = 0, streams: int = 1, max_bytes: int = 8 << 20,
                  times: bool = True, tags: bool = True) -> list[Event]:
    """``count`` events: allocations log-distributed up to ``max_bytes``, random victims freed,
    everything live at the end freed too (so a trace ends empty)."""
    rng = random.Random(seed)
    events: list[Event] = []
    live: list[tuple[int, int, int]] = []
    next_id = 0
    for step in range(count):
        if live and rng.random() < 0.48:
            ident, nbytes, stream = live.pop(rng.randrange(len(live)))
            events.append(Event("f", ident, nbytes, stream, step if times else None, ""))
        else:
            nbytes = max(1, int(2 ** (rng.random() * max_bytes.bit_length())))
            stream = rng.randrange(streams)
            tag = f"op{step % 7}" if tags else ""
            events.append(Event("a", next_id, nbytes, stream, step if times else None, tag))
            live.append((next_id, nbytes, stream))
            next_id += 1
    for ident, nbytes, stream in live:
        events.append(Event("f", ident, nbytes, stream, count if times else None, ""))
    return events


def random_trace(count: int = 600, **kwargs: object) -> Trace:
    return Trace.from_events(random_events(count, **kwargs), name="random")  # type: ignore[arg-type]


def brute_force_peak(events: list[Event]) -> int:
    """Peak live bytes, recomputed independently: the running sum after every event."""
    sizes: dict[int, int] = {}
    level = peak = 0
    for event in events:
        if event.op == "a":
            sizes[event.id] = event.nbytes
            level += event.nbytes
        else:
            level -= sizes.pop(event.id)
        peak = max(peak, level)
    return peak


def canonical(events: list[Event]) -> list[tuple[str, int, int, int]]:
    """Events with ids renumbered in allocation order (what a format without ids preserves)."""
    renamed: dict[int, int] = {}
    out = []
    for event in events:
        if event.op == "a":
            renamed[event.id] = len(renamed)
        out.append((event.op, renamed[event.id], event.nbytes, event.stream))
    return out
