"""``python -m dlpack``: show zero-copy exchanges with the array libraries installed here."""

import importlib
import sys

from dlpack import DLPACK_VERSION, __version__, asdlpack


def main() -> int:
    print(
        f"dlpack {__version__} (DLPack {DLPACK_VERSION[0]}.{DLPACK_VERSION[1]}), "
        f"Python {sys.version.split()[0]}"
    )
    source = bytearray(b"Hello!")
    view = asdlpack(source)
    print(f"asdlpack(bytearray(b'Hello!')) -> {view!r}")
    consumers = {
        "numpy": "numpy.from_dlpack",
        "torch": "torch.from_dlpack",
        "jax": "jax.numpy.from_dlpack",
    }
    failures = 0
    for name, path in consumers.items():
        module_name, _, func_name = path.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # noqa: BLE001 - a broken library is reported, not fatal
            print(f"  {path:24} skipped ({name} not importable: {type(exc).__name__})")
            continue
        try:
            result = getattr(module, func_name)(asdlpack(source))
            text = bytes(int(x) for x in result.tolist()).decode()
            print(f"  {path:24} -> {text!r}  ({type(result).__module__}.{type(result).__name__})")
        except Exception as exc:  # noqa: BLE001
            failures += 1
            print(f"  {path:24} FAILED: {type(exc).__name__}: {exc}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
