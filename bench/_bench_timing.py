"""Timing for the benchmarks, with :mod:`timeit`: ``Timer.autorange()`` picks each statement's
loop count, ``Timer.repeat()`` times it, and the repeats of the statements compared in one row are
interleaved so that all of them see the same machine noise.

The benchmarks load this file by its path (``runpy.run_path``), as they keep bench/ off
``sys.path``.
"""

from __future__ import annotations

import timeit


def loop_count(timer: timeit.Timer, seconds_per_repeat: float) -> int:
    """Loops for a repeat of about ``seconds_per_repeat``: the count ``autorange`` settles on
    (its run takes at least 0.2 s), scaled to that time."""
    number, elapsed = timer.autorange()
    return max(1, round(number * seconds_per_repeat / max(elapsed, 1e-9)))


def interleaved(
    timers: dict[str, timeit.Timer], repeats: int, seconds_per_repeat: float
) -> tuple[dict[str, int], dict[str, list[float]]]:
    """(loop count, seconds per call of every repeat) for each timer; the repeats take turns."""
    numbers = {key: loop_count(timer, seconds_per_repeat) for key, timer in timers.items()}
    per_call: dict[str, list[float]] = {key: [] for key in timers}
    for _ in range(repeats):
        for key, timer in timers.items():
            [total] = timer.repeat(repeat=1, number=numbers[key])
            per_call[key].append(total / numbers[key])
    return numbers, per_call
