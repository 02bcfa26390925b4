"""The report's section on the CPU copy engine: what it chose for each kind of copy and size
band (threads, store kind) and why, from the facts the extension gives
(``dlpack._dlpack._copy_engine``)."""

from __future__ import annotations

from typing import Any

from ._libraries import short_error

VARIABLES = ("DLPACK_COPY_THREADS", "DLPACK_COPY_STORES")


def engine_facts() -> dict[str, Any]:
    """The extension's facts, measured now where this process hasn't yet; ``{"error": why}``
    when that fails."""
    from dlpack import _dlpack

    try:
        return _dlpack._copy_engine(measure=True)
    except Exception as exc:  # noqa: BLE001 - the report goes on, saying why
        return {"error": short_error(exc, 200)}


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n % (1 << 20) == 0 else f"{n} bytes"


def _band(low: int, high: int | None) -> str:
    return f"{_size(low)} and up" if high is None else f"{_size(low)} to {_size(high)}"


def _way(threads: int, stores: str) -> str:
    return f"{threads} thread{'s' if threads != 1 else ''}, {stores} stores"


def _why(choice: dict[str, Any], margin: float) -> str:
    state = choice["state"]
    if state == "not yet":
        return "not measured yet"
    if state == "fixed":
        return "fixed by the settings"
    rates = {
        (c["threads"], c["stores"]): c["gb_per_s"]
        for c in choice["candidates"]
        if c["gb_per_s"] is not None
    }
    first = choice["candidates"][0]
    base = rates.get((first["threads"], first["stores"]))
    mine = rates.get((choice["threads"], choice["stores"]))
    if base is None or mine is None:
        return "nothing to compare"
    if (choice["threads"], choice["stores"]) == (first["threads"], first["stores"]):
        verdict = f"nothing beat {_way(first['threads'], first['stores'])} by {margin:.0%}"
    else:
        verdict = f"{mine / base:.2f}x {_way(first['threads'], first['stores'])}"
    measured = ", ".join(
        f"{t}t {'streaming' if s == 'streaming' else 'regular'} {r:.1f}"
        for (t, s), r in rates.items()
    )
    cost, took = choice["cost_seconds"] * 1e3, choice["seconds"] * 1e3
    spent = f"measuring cost {cost:.1f} ms, its chunks and warm-up took {took:.1f}"
    return f"{verdict} ({measured} GB/s; {spent})"


def engine_lines(facts: dict[str, Any]) -> list[str]:
    """The section, as text lines."""
    if "error" in facts:
        return ["CPU copy engine:", f"  could not measure: {facts['error']}"]
    settings = facts["settings"]
    set_here = [f"{name}={value}" for name, value in settings.items() if value]
    fixed = ", ".join(set_here) if set_here else f"{' and '.join(VARIABLES)} unset"
    lines = [
        f"CPU copy engine (up to {facts['max_threads']} threads; {fixed}; threads and streaming"
        " stores chosen per kind of copy by measuring chunks of its first large copy, apart"
        " into memory written before (mapped) and into fresh memory):"
    ]
    rows = []
    cost = 0.0
    for choice in facts["choices"]:
        low, high = choice["bytes"]
        way = _way(choice["threads"], choice["stores"]) if choice["threads"] else "-"
        memory = "fresh memory" if choice["memory"] == "fresh" else "mapped memory"
        why = _why(choice, facts["margin"])
        rows.append([choice["kind"], _band(low, high), memory, way, why])
        cost += choice["cost_seconds"] or 0.0
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        cells = "  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
        lines.append(f"  {cells}  {r[4]}")
    lines.append(
        f"  (smaller copies: 1 thread, regular stores; measuring cost {cost * 1e3:.1f} ms in all:"
        " what the chunks the other ways copied took beyond the chosen ways, each at its best)"
    )
    return lines
