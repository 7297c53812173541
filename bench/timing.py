"""Interleaved timing, shared by the bench scripts: every candidate runs once per round, so a slow
moment of the machine costs every candidate alike rather than the one that happened to run then."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from tqdm import tqdm


def interleaved_seconds(
    calls: Mapping[str, Callable[[], object]],
    rounds: int,
    alternate: bool = False,
    desc: str = "timing rounds",
) -> dict[str, list[float]]:
    """Wall-clock seconds of each call, one per round. ``alternate`` reverses the order every other
    round (two candidates: neither always runs right after the other)."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_ in tqdm(range(rounds), desc=desc, unit="round"):
        for name in reversed(names) if alternate and round_ % 2 else names:
            start = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds
