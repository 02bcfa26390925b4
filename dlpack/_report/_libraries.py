"""Importing array libraries without letting a broken one stop us, and finding CUDA."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import _probe

# distribution names, for versions of modules without __version__
_DISTRIBUTIONS = {
    "tvm_ffi": "apache-tvm-ffi",
    "PIL": "pillow",
    "mlx.core": "mlx",
    "paddle": "paddlepaddle",
    "array_api_strict": "array-api-strict",
    "tensorflow": "tensorflow",
    "cupy": "cupy",
}


# the libraries the report lists, in order, with what they do here
REPORTED = [
    ("numpy", "numpy"),
    ("torch", "torch"),
    ("jax", "jax"),
    ("cupy", "cupy"),
    ("numba", "numba"),
    ("tensorflow", "tensorflow"),
    ("pyarrow", "pyarrow"),
    ("polars", "polars"),
    ("pandas", "pandas"),
    ("duckdb", "duckdb"),
    ("nanoarrow", "nanoarrow"),
    ("PIL", "pillow"),
    ("mlx.core", "mlx"),
    ("paddle", "paddle"),
    ("array_api_strict", "array-api-strict"),
    ("tvm_ffi", "tvm-ffi"),
    ("ml_dtypes", "ml_dtypes"),
]
TEST_TOOLS = [("pytest", "pytest"), ("hypothesis", "hypothesis")]
# what dlpack._probe imports in child processes, first, to find libraries that crash: those the
# report lists, by the module that loads their native code, in the report's order
PROBED = [{"PIL": "PIL.Image"}.get(module, module) for module, _ in REPORTED]

# ---------------------------------------------------------------------------
# importing libraries without letting a broken one stop us
# ---------------------------------------------------------------------------


@dataclass
class Library:
    name: str  # import name
    status: str  # "ok", "missing", "broken" or "crashes"
    module: Any = None
    version: str | None = None
    error: str = ""  # why it is broken or crashes; for a missing one, the folder with its name
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def not_installed(self, what: str | None = None) -> str:
        """``"paddle is not installed"``, with the folder that has its name where one does."""
        text = f"{what or label(self.name)} is not installed"
        return f"{text} ({self.error})" if self.error else text

    def describe(self) -> str:
        if self.status == "ok":
            return self.version or "(version unknown)"
        if self.status == "missing":
            return f"not installed ({self.error})" if self.error else "not installed"
        if self.status == "crashes":  # the error names the library first
            return self.error.removeprefix(label(self.name)).lstrip()
        return f"import failed: {self.error}"


_LIBRARIES: dict[str, Library] = {}


def short_error(exc: BaseException, limit: int = 160) -> str:
    """``"TypeError: first words of the message..."``, on one line."""
    text = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit - 3)
    return text[: cut if cut > limit // 2 else limit - 3] + "..."


def _version_of(name: str, module: Any) -> str | None:
    version = getattr(module, "__version__", None)
    if isinstance(version, str):
        return version
    dist = _DISTRIBUTIONS.get(name, name.split(".")[0])
    try:
        return importlib.metadata.version(dist)
    except Exception:  # noqa: BLE001
        return None


def only_folders(module: Any) -> str:
    """``"only a folder of that name: PATH"`` where ``module`` is only folders: a namespace
    package (Python imports a folder without ``__init__.py`` by its name when no module has that
    name: an empty ``paddle/`` in the current folder, or Ray's ``/tmp/ray``); "" for a real
    module. A namespace package above the module (``mlx`` of ``mlx.core``) is no concern here."""
    if getattr(module, "__file__", None) is not None:
        return ""
    # the current folder may be on sys.path twice ("" and by name): each folder once
    found = list(dict.fromkeys(map(os.path.realpath, getattr(module, "__path__", None) or [])))
    if not found:
        return ""
    return f"only {'a folder' if len(found) == 1 else 'folders'} of that name: {', '.join(found)}"


def library(name: str) -> Library:
    """Import ``name`` once and remember how that went; never raises (except KeyboardInterrupt).

    The first call probes the libraries this module knows for crashes (in child processes); a
    library that crashes the interpreter is not imported here."""
    lib = _LIBRARIES.get(name)
    if lib is not None:
        return lib
    crash = _probe.crash_of(name, PROBED)
    if crash is not None:
        lib = _LIBRARIES[name] = Library(name, "crashes", error=crash.message(label))
        return lib
    start = time.perf_counter()
    imported_before = name in sys.modules
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            top = name.split(".")[0]
            if exc.name in (name, top):
                lib = Library(name, "missing")
            else:  # installed, but something it needs is missing
                lib = Library(name, "broken", error=short_error(exc))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken library is reported, not fatal
            lib = Library(name, "broken", error=short_error(exc))
        else:
            folders = only_folders(module)
            if folders:
                lib = Library(name, "missing", error=folders)
                if not imported_before:  # code that looks in sys.modules (interop) must not see it
                    sys.modules.pop(name, None)
            else:
                lib = Library(name, "ok", module, _version_of(name, module))
    lib.seconds = time.perf_counter() - start
    _LIBRARIES[name] = lib
    return lib


class Unavailable(Exception):
    """A library, device or feature this exchange needs is not here: a skip, with this reason."""


def label(name: str) -> str:
    """A library's common name: ``PIL`` -> ``pillow``, ``mlx.core`` -> ``mlx``."""
    return _LABELS.get(name, name.split(".")[0])


_LABELS = {
    "PIL": "pillow",
    "PIL.Image": "pillow",
    "mlx.core": "mlx",
    "tvm_ffi": "tvm-ffi",
    "array_api_strict": "array-api-strict",
}


def need(name: str, what: str | None = None) -> Any:
    what = what or label(name)
    lib = library(name)
    if lib.status == "missing":
        raise Unavailable(lib.not_installed(what))
    if lib.status == "broken":
        raise Unavailable(f"{what} fails to import ({lib.error})")
    if lib.status == "crashes":
        raise Unavailable(lib.error)
    return lib.module


def version(name: str) -> str:
    """``"torch 2.15.0"``: a library's name and installed version, for messages."""
    lib = library(name)
    return f"{label(name)} {lib.version}" if lib.version else label(name)


# ---------------------------------------------------------------------------
# devices
# ---------------------------------------------------------------------------


_T = TypeVar("_T")


def _quiet(fn: Callable[[], _T], default: _T | None = None) -> _T | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001
        return default


def torch_cuda() -> bool:
    lib = library("torch")
    if not lib.ok:
        return False
    return bool(_quiet(lambda: lib.module.cuda.is_available() and lib.module.cuda.device_count()))


def cupy_cuda() -> bool:
    lib = library("cupy")
    if not lib.ok:
        return False
    return bool(_quiet(lambda: lib.module.cuda.runtime.getDeviceCount() > 0, False))


def numba_cuda() -> bool:
    lib = library("numba")
    if not lib.ok:
        return False

    def check() -> bool:
        from numba import cuda

        return bool(cuda.is_available())

    return bool(_quiet(check, False))


def jax_gpu() -> bool:
    lib = library("jax")
    if not lib.ok:
        return False
    return bool(_quiet(lambda: len(lib.module.devices("gpu")) > 0, False))


_CUDA: tuple[bool, str] | None = None


def cuda_devices() -> tuple[bool, str]:
    """(a CUDA device is usable here, how we know / why not); found once per process."""
    global _CUDA
    if _CUDA is None:
        _CUDA = _find_cuda()
    return _CUDA


def _find_cuda() -> tuple[bool, str]:
    seen = []
    if torch_cuda():
        torch = library("torch").module
        name = _quiet(lambda: torch.cuda.get_device_name(0), "?")
        runtime = _quiet(lambda: torch.version.cuda, None)
        built = f", CUDA {runtime}" if runtime else ""
        seen.append(f"torch: {torch.cuda.device_count()} device(s), {name}{built}")
    if cupy_cuda():
        seen.append("cupy")
    if numba_cuda():
        seen.append("numba")
    if jax_gpu():
        seen.append("jax")
    if seen:
        return True, "; ".join(seen)
    why = []
    for name in ("torch", "cupy", "numba", "jax"):
        if library(name).ok:
            why.append(f"{name}: no device")
    return False, "no CUDA device found" + (f" ({', '.join(why)})" if why else "")


def require_cuda(name: str, available: Callable[[], bool]) -> None:
    if not available():
        raise Unavailable(f"{version(name)} sees no CUDA device")
