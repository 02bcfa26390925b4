"""A stand-in for the small part of pytest that this test suite uses.

The built-in runner (:mod:`dlpack.tests._runner`) puts this module into ``sys.modules["pytest"]``
while it imports and runs the test modules, when pytest itself is not installed (or not wanted).
It covers: ``raises`` (with ``match``), ``warns``, ``skip``, ``fail``, ``xfail``,
``importorskip`` (with ``minversion``), ``approx``, ``param``, ``fixture`` and
``mark.parametrize`` / ``mark.skip`` / ``mark.skipif`` / ``mark.xfail`` (any other mark is
recorded and otherwise ignored). Nothing here imports pytest.
"""

from __future__ import annotations

import importlib
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

__version__ = "0+dlpack.tests.shim"
IS_DLPACK_SHIM = True

# ---------------------------------------------------------------------------
# outcomes
# ---------------------------------------------------------------------------


class OutcomeException(BaseException):
    """Base of the outcome exceptions; BaseException, as in pytest, so ``except Exception``
    in a test does not swallow a skip."""

    def __init__(self, msg: str = "") -> None:
        super().__init__(msg)
        self.msg = msg

    def __str__(self) -> str:
        return self.msg


class Skipped(OutcomeException):
    pass


class Failed(OutcomeException):
    pass


class XFailed(OutcomeException):
    pass


def skip(reason: str = "", *, allow_module_level: bool = False, msg: str | None = None):
    """Skip the running test (or, at import time, the whole module)."""
    raise Skipped(reason or msg or "")


skip.Exception = Skipped  # type: ignore[attr-defined]


def fail(reason: str = "", pytrace: bool = True, msg: str | None = None):
    raise Failed(reason or msg or "")


fail.Exception = Failed  # type: ignore[attr-defined]


def xfail(reason: str = ""):
    raise XFailed(reason)


xfail.Exception = XFailed  # type: ignore[attr-defined]


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in re.split(r"[.+-]", str(text)):
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


def importorskip(
    modname: str, minversion: str | None = None, reason: str | None = None, **_ignored: Any
):
    """Import and return ``modname``, or skip the test (module) when it can't be imported."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            mod = importlib.import_module(modname)
        except ImportError as exc:
            raise Skipped(reason or f"could not import {modname!r}: {exc}") from None
    if minversion is not None:
        have = getattr(mod, "__version__", None)
        if have is None or _version_tuple(have) < _version_tuple(minversion):
            raise Skipped(
                f"module {modname!r} has __version__ {have!r}, required is: {minversion!r}"
            )
    return mod


# ---------------------------------------------------------------------------
# raises / warns
# ---------------------------------------------------------------------------


class ExceptionInfo:
    """What ``with pytest.raises(...) as info`` gives: ``info.type``, ``info.value``."""

    def __init__(self) -> None:
        self.type: type[BaseException] | None = None
        self.value: BaseException | None = None
        self.tb = None

    @classmethod
    def from_exc_info(cls, exc_info, exprinfo=None) -> ExceptionInfo:
        info = cls()
        info.type, info.value, info.tb = exc_info
        return info

    @property
    def typename(self) -> str:
        return self.type.__name__ if self.type else ""

    def match(self, regexp) -> bool:
        text = str(self.value)
        assert re.search(regexp, text), (
            f"Regex pattern did not match.\n Regex: {regexp!r}\n Input: {text!r}"
        )
        return True

    def errisinstance(self, exc) -> bool:
        return isinstance(self.value, exc)

    def __repr__(self) -> str:
        return f"<ExceptionInfo {self.value!r}>"


def _names(expected) -> str:
    if isinstance(expected, tuple):
        return "(" + ", ".join(e.__name__ for e in expected) + ")"
    return f"<class '{expected.__name__}'>"


class RaisesContext:
    def __init__(self, expected, match=None) -> None:
        self.expected = expected
        self.match_expr = match
        self.info = ExceptionInfo()

    def __enter__(self) -> ExceptionInfo:
        return self.info

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            raise Failed(f"DID NOT RAISE {_names(self.expected)}")
        if not issubclass(exc_type, self.expected):
            return False  # a different exception propagates, as in pytest
        self.info.type, self.info.value, self.info.tb = exc_type, exc, tb
        if self.match_expr is not None:
            self.info.match(self.match_expr)
        return True


def raises(expected_exception, *args, match=None, **kwargs):
    """``with raises(E, match=regex): ...`` or ``raises(E, func, *args, **kwargs)``."""
    if isinstance(expected_exception, list):
        expected_exception = tuple(expected_exception)
    ctx = RaisesContext(expected_exception, match)
    if not args:
        if kwargs:
            raise TypeError(f"unexpected keyword arguments {sorted(kwargs)}")
        return ctx
    func, *rest = args
    with ctx as info:
        func(*rest, **kwargs)
    return info


class WarningsChecker(warnings.catch_warnings):
    def __init__(self, expected=Warning, match=None) -> None:
        super().__init__(record=True)
        self.expected = expected
        self.match_expr = match
        self.list: list[warnings.WarningMessage] = []

    def __enter__(self):
        self.list = super().__enter__()
        warnings.simplefilter("always")
        return self.list

    def __exit__(self, exc_type, exc, tb):
        super().__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return False
        for w in self.list:
            if issubclass(w.category, self.expected) and (
                self.match_expr is None or re.search(self.match_expr, str(w.message))
            ):
                return False
        raise Failed(f"DID NOT WARN. No warnings of type {self.expected!r} were emitted.")


def warns(expected_warning=Warning, *args, match=None, **kwargs):
    ctx = WarningsChecker(expected_warning, match)
    if not args:
        return ctx
    func, *rest = args
    with ctx:
        return func(*rest, **kwargs)


def deprecated_call(*args, **kwargs):
    return warns((DeprecationWarning, PendingDeprecationWarning), *args, **kwargs)


# ---------------------------------------------------------------------------
# approx
# ---------------------------------------------------------------------------


class ApproxBase:
    def __init__(self, expected, rel=None, abs=None, nan_ok=False) -> None:
        self.expected = expected
        self.rel = 1e-6 if rel is None else rel
        self.abs = 1e-12 if abs is None else abs
        self.nan_ok = nan_ok

    def _close(self, actual, expected) -> bool:
        if isinstance(expected, Mapping):
            return (
                isinstance(actual, Mapping)
                and set(actual) == set(expected)
                and all(self._close(actual[k], expected[k]) for k in expected)
            )
        if isinstance(expected, (list, tuple)) or (
            hasattr(expected, "__len__")
            and hasattr(expected, "__iter__")
            and not isinstance(expected, (str, bytes))
        ):
            try:
                a, e = list(actual), list(expected)
            except TypeError:
                return False
            return len(a) == len(e) and all(self._close(x, y) for x, y in zip(a, e, strict=True))
        if hasattr(actual, "__len__") and not isinstance(actual, (str, bytes)):
            try:
                return all(self._close(x, expected) for x in actual)
            except TypeError:
                return False
        try:
            if actual == expected:
                return True
            a, e = complex(actual), complex(expected)
        except (TypeError, ValueError):
            return False
        if any(math.isnan(v) for v in (a.real, a.imag, e.real, e.imag)):
            return self.nan_ok and (math.isnan(a.real) or math.isnan(a.imag)) == (
                math.isnan(e.real) or math.isnan(e.imag)
            )
        if math.isinf(abs(e)):
            return a == e
        return abs(a - e) <= max(self.rel * abs(e), self.abs)

    def __eq__(self, actual) -> bool:
        return self._close(actual, self.expected)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"approx({self.expected!r})"


def approx(expected, rel=None, abs=None, nan_ok=False) -> ApproxBase:
    return ApproxBase(expected, rel=rel, abs=abs, nan_ok=nan_ok)


# ---------------------------------------------------------------------------
# marks, param, fixture
# ---------------------------------------------------------------------------


class Mark(NamedTuple):
    name: str
    args: tuple
    kwargs: dict


class MarkDecorator:
    """``pytest.mark.NAME`` / ``pytest.mark.NAME(*args, **kwargs)``; decorating a function or
    class appends the mark to its ``pytestmark`` list (innermost decorator first, as pytest)."""

    def __init__(self, mark: Mark) -> None:
        self.mark = mark

    @property
    def name(self) -> str:
        return self.mark.name

    @property
    def args(self) -> tuple:
        return self.mark.args

    @property
    def kwargs(self) -> dict:
        return self.mark.kwargs

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (isinstance(args[0], type) or callable(args[0])):
            target = args[0]
            marks = list(target.__dict__.get("pytestmark", []))
            marks.append(self.mark)
            target.pytestmark = marks
            return target
        mark = Mark(self.mark.name, self.mark.args + args, {**self.mark.kwargs, **kwargs})
        return MarkDecorator(mark)

    def __repr__(self) -> str:
        return f"<MarkDecorator {self.mark!r}>"


class MarkGenerator:
    def __getattr__(self, name: str) -> MarkDecorator:
        if name.startswith("_"):
            raise AttributeError(name)
        return MarkDecorator(Mark(name, (), {}))


mark = MarkGenerator()


class ParameterSet(NamedTuple):
    values: tuple
    marks: tuple
    id: str | None


def param(*values, marks=(), id=None) -> ParameterSet:
    if isinstance(marks, (MarkDecorator, Mark)):
        marks = (marks,)
    return ParameterSet(tuple(values), tuple(marks), id)


class FixtureInfo(NamedTuple):
    name: str
    scope: str
    autouse: bool
    params: Any


def fixture(
    fixture_function=None, *, scope="function", params=None, autouse=False, ids=None, name=None
):
    """Marks a fixture function; the runner resolves fixtures by argument name."""

    def decorate(func):
        func._dlpack_shim_fixture = FixtureInfo(name or func.__name__, scope, autouse, params)
        return func

    if fixture_function is not None:
        return decorate(fixture_function)
    return decorate


def __getattr__(name: str):
    raise AttributeError(
        f"pytest.{name} is not available in the built-in test runner (pytest is not installed)"
    )
