"""The Python side of :mod:`dlpack.sharing`: ``share`` and ``empty_shared`` (``handles``), and
this process's sharing state (``process``). The handle and the work (memory files, locks,
mappings, the lender thread, opening handles) are the extension's (``src/share``). Nothing here
is public API."""
