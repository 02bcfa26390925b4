"""What a segment is: a sealed memory file of this machine whose trailer holds its generation,
and the errors for handles that name it wrongly or too late."""

from __future__ import annotations

import fcntl
import os
import sys

# Sealed this way, the file's size is fixed for good: a mapping of it can never fault.
_SEALS = (
    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL if sys.platform == "linux" else 0
)


_host_id: str | None = None


def require_linux() -> None:
    if sys.platform != "linux" or not hasattr(os, "memfd_create"):
        raise BufferError(f"sharing host memory needs Linux (memfd_create); this is {sys.platform}")


def host_id() -> str:
    """This machine's identity in handles: the kernel's boot id, new at every boot and
    different on every machine, so a handle opened elsewhere is recognised as foreign."""
    global _host_id
    if _host_id is None:
        require_linux()
        with open("/proc/sys/kernel/random/boot_id") as f:
            _host_id = f.read().strip()
    return _host_id


# Every segment ends in this many bytes holding its generation: a random number, new each time
# the segment is reused for other data, which a handle carries, so that a handle to the
# segment's earlier contents can't open the new ones.
TRAILER = 8


def file_size(nbytes: int) -> int:
    """The length of a segment for ``nbytes`` bytes of elements: rounded up to whole 8-byte
    words (so the generation is aligned), then the trailer."""
    return -(-nbytes // TRAILER) * TRAILER + TRAILER


def size_mismatch(named: int, actual: int) -> ValueError:
    return ValueError(
        f"the handle says its segment holds {named} bytes, but it holds {actual} (a forged or "
        "corrupted handle)"
    )


class StaleHandle(BufferError):
    """A handle to contents its segment no longer holds."""


def stale() -> StaleHandle:
    return StaleHandle(
        "this handle was already opened from its pickle, and its memory has been reused since "
        "(each pickle opens while its memory is still shared)"
    )
