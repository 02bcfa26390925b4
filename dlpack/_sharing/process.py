"""This process's sharing state, kept by the extension: the segments it maps, those it keeps
for reuse (``POOL_SEGMENTS`` at most: a later fresh copy of the same size is written into one
instead of new memory), the tokens its lender has pinned; and its upkeep in a forked child."""

from __future__ import annotations

import os
import sys

__all__ = ["POOL_SEGMENTS", "clear_pool", "require_linux"]

if sys.platform == "linux":
    from .._dlpack import _SHARE_POOL_SEGMENTS as POOL_SEGMENTS
    from .._dlpack import _share_after_fork, _share_clear_pool
else:
    POOL_SEGMENTS = 0


def not_linux() -> BufferError:
    """The error of sharing anywhere but on Linux."""
    return BufferError(f"sharing host memory needs Linux (memfd_create); this is {sys.platform}")


def require_linux() -> None:
    if sys.platform != "linux":
        raise not_linux()


def clear_pool() -> None:
    """Close the segments kept for reuse, returning their memory."""
    require_linux()
    _share_clear_pool()


if sys.platform == "linux":
    # A forked child starts its own lender, pool and connections, and takes locks of its own on
    # the mappings it inherited (so that its parent can't reuse them under it).
    os.register_at_fork(after_in_child=_share_after_fork)
