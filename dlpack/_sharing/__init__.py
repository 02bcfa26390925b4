"""The Python side of :mod:`dlpack.sharing`: the handle, its pickling and ``share`` /
``empty_shared`` (``handles``), and this process's sharing state (``process``). The work itself
(memory files, locks, mappings, the lender thread, opening handles) is the extension's
(``src/share``). Nothing here is public API."""
