"""Pickles of ``DLPackObject`` that name this module's reconstructor load through the
extension's (``DLPackObject.__reduce_ex__`` and ``_rebuild`` live in ``src/object/pickle.rs``)."""

from .._dlpack import _rebuild

__all__ = ["_rebuild"]
