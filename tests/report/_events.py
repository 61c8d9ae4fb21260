"""Seeded allocation traces for the report tests, with an independent live-bytes recomputation."""

from __future__ import annotations

import random

import numpy as np

from tensorarena.trace import Event


def random_events(count: int, *, seed: int = 0, times: bool = True,
                  tags: tuple[str, ...] = ("attn", "mlp", "kv")) -> list[Event]:
    """``count`` events: sizes from 64 B to 1 MiB, random victims freed, some live at the end."""
    rng = random.Random(seed)
    events: list[Event] = []
    live: list[tuple[int, int]] = []
    next_id = 0
    for step in range(count):
        if live and rng.random() < 0.48:
            ident, nbytes = live.pop(rng.randrange(len(live)))
            events.append(Event("f", ident, nbytes, 0, 10 * step if times else None, ""))
        else:
            nbytes = rng.choice([64, 1000, 4096, 100_000, 1 << 20])
            events.append(Event("a", next_id, nbytes, 0, 10 * step if times else None,
                                rng.choice(tags)))
            live.append((next_id, nbytes))
            next_id += 1
    return events


def live_bytes(events: list[Event]) -> np.ndarray:
    """Live bytes after every event, recomputed by a plain running sum."""
    sizes: dict[int, int] = {}
    level, out = 0, []
    for event in events:
        if event.op == "a":
            sizes[event.id] = event.nbytes
            level += event.nbytes
        else:
            level -= sizes.pop(event.id)
        out.append(level)
    return np.array(out, dtype=np.int64)
