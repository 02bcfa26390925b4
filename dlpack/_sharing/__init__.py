"""The machinery behind :mod:`dlpack.sharing`: host segments and their registry (``host``), the
per-process lender that hands segment descriptors to receivers (``lender``) and the handles
themselves (``handles``). Nothing here is public API."""
