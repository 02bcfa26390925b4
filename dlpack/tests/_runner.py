"""The runner behind ``dlpack.tests.run()`` and ``python -m dlpack.tests``.

With pytest installed it is pytest (``pytest.main(["--pyargs", "dlpack.tests", *args])``).
Without it, a small built-in runner runs the same test functions: it puts
:mod:`dlpack.tests._pytest_shim` into ``sys.modules["pytest"]`` while it imports and runs the test
modules, expands ``pytest.mark.parametrize`` (stacked, with ``ids=`` and ``pytest.param``),
honours ``skip`` / ``skipif`` / ``xfail`` marks (on functions, classes and ``pytestmark``),
resolves fixtures (conftest, module and class fixtures, ``autouse``, yield fixtures, and the
built-in ``tmp_path``, ``tmp_path_factory``, ``monkeypatch``, ``capsys`` and ``recwarn``), and
prints pytest-like progress and the summary line ``N passed, N failed, N skipped``.

A test that needs a pytest fixture the built-in runner lacks is skipped with that reason. A test
module that fails to import counts as one failed test; one that skips at import time
(``pytest.importorskip`` at module level) as one skipped test, as in pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import itertools
import os
import pkgutil
import re
import shutil
import sys
import tempfile
import time
import traceback
import types
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

DEFAULT_PACKAGE = "dlpack.tests"

# pytest's exit codes, which the built-in runner uses too
EXIT_OK = 0
EXIT_TESTSFAILED = 1
EXIT_INTERRUPTED = 2
EXIT_INTERNALERROR = 3
EXIT_USAGEERROR = 4
EXIT_NOTESTSCOLLECTED = 5

# pytest fixtures the built-in runner does not provide: a test that needs one is skipped
PYTEST_ONLY_FIXTURES = frozenset(
    {
        "request",
        "pytestconfig",
        "cache",
        "capfd",
        "capfdbinary",
        "capsysbinary",
        "caplog",
        "doctest_namespace",
        "record_property",
        "record_testsuite_property",
        "record_xml_attribute",
        "testdir",
        "pytester",
        "tmpdir",
        "tmpdir_factory",
        "subtests",
    }
)


# ---------------------------------------------------------------------------
# choosing pytest or the built-in runner
# ---------------------------------------------------------------------------


def pytest_installed() -> bool:
    """True when pytest could be imported, even while the shim stands in ``sys.modules``."""
    mod = sys.modules.get("pytest")
    if mod is not None and not getattr(mod, "IS_DLPACK_SHIM", False):
        return True
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is None:
            continue
        try:
            if find_spec("pytest", None) is not None:
                return True
        except ImportError:
            return False
    return False


def pytest_available() -> bool:
    """True when the real pytest can be imported here (the built-in shim doesn't count)."""
    mod = sys.modules.get("pytest")
    if mod is not None:
        return not getattr(mod, "IS_DLPACK_SHIM", False)
    try:
        import pytest  # noqa: F401
    except Exception:  # noqa: BLE001 - missing or broken: either way, not usable
        return False
    return True


def run(args, *, use_pytest: bool | None = None, package: str = DEFAULT_PACKAGE) -> int:
    """See :func:`dlpack.tests.run`; returns an exit status (0 on success)."""
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = args[0]
    args = [os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in args]
    if use_pytest is None:
        use_pytest = pytest_available()
    elif use_pytest and not pytest_available():
        raise ModuleNotFoundError(
            "use_pytest=True, but pytest is not installed; "
            "leave use_pytest=None to use the built-in runner",
            name="pytest",
        )
    if use_pytest:
        return run_pytest(args, package)
    reason = "pytest is not installed" if not pytest_available() else "use_pytest=False"
    return run_builtin(args, package, why=reason)


# ---------------------------------------------------------------------------
# the pytest path
# ---------------------------------------------------------------------------

# pytest options whose value is the next argument (so it isn't taken for a test module name)
_VALUE_OPTIONS = frozenset(
    {
        "-k",
        "-m",
        "-p",
        "-o",
        "-W",
        "-c",
        "-n",
        "-r",
        "--tb",
        "--maxfail",
        "--basetemp",
        "--rootdir",
        "--deselect",
        "--ignore",
        "--ignore-glob",
        "--durations",
        "--junitxml",
        "--junit-xml",
        "--log-level",
        "--confcutdir",
        "--override-ini",
        "--capture",
        "--import-mode",
        "--color",
        "--hypothesis-seed",
        "--hypothesis-profile",
    }
)


def _test_modules(package: str) -> list[str]:
    pkg = importlib.import_module(package)
    return sorted(
        m.name
        for m in pkgutil.iter_modules(getattr(pkg, "__path__", []))
        if m.name.startswith("test_") and not m.ispkg
    )


def _resolve_target(arg: str, package: str, modules: list[str]) -> tuple[str, str] | None:
    """``test_x.py[::rest]``, ``test_x``, ``a/b/test_x.py``, ``pkg.test_x`` or ``pkg`` ->
    (module name or "" for the whole package, rest); None when ``arg`` names none of ours."""
    head, sep, rest = arg.partition("::")
    if head in (package, package.replace(".", "/"), package.replace(".", "/") + "/"):
        return "", rest
    if head.startswith(package + "."):
        head = head[len(package) + 1 :]
    base = os.path.basename(head.rstrip("/\\"))
    if base.endswith(".py"):
        base = base[:-3]
    if base in modules:
        return base, rest
    return None


def pytest_argv(args: list[str], package: str) -> list[str]:
    """The argument list for ``pytest.main``: our test modules named by module name (or
    ``test_x.py``, with ``::`` parts) become ``--pyargs`` targets; the rest passes through."""
    modules = _test_modules(package)
    options: list[str] = []
    targets: list[str] = []
    value_next = False
    for arg in args:
        if value_next:
            options.append(arg)
            value_next = False
            continue
        if arg.startswith("-"):
            options.append(arg)
            value_next = arg in _VALUE_OPTIONS
            continue
        resolved = None
        if not os.path.exists(arg.partition("::")[0]):  # a real path is pytest's to resolve
            resolved = _resolve_target(arg, package, modules)
        if resolved is None:
            targets.append(arg)
            continue
        mod, rest = resolved
        targets.append(package + (f".{mod}" if mod else "") + (f"::{rest}" if rest else ""))
    argv = []
    if "--pyargs" not in options:
        argv.append("--pyargs")
    if not any(a.startswith("--rootdir") for a in options):
        # node ids relative to the directory holding the package: dlpack/tests/test_x.py::...
        top = importlib.import_module(package.split(".")[0])
        argv.append(f"--rootdir={os.path.dirname(list(top.__path__)[0])}")
    if not any("cacheprovider" in a for a in options):
        argv += ["-p", "no:cacheprovider"]  # don't leave a .pytest_cache wherever this runs
    return argv + options + (targets or [package])


def run_pytest(args: list[str], package: str = DEFAULT_PACKAGE) -> int:
    import pytest

    return int(pytest.main(pytest_argv(args, package)))


# ---------------------------------------------------------------------------
# -k / -m expressions
# ---------------------------------------------------------------------------

_IDENT = r"[\w:+\-.\[\]\\/]+"
_TOKENS = re.compile(rf"\s*(\(|\)|{_IDENT})")


def compile_expression(expr: str):
    """Compile a pytest ``-k``-style expression (``and``, ``or``, ``not``, parentheses) into a
    function ``f(matches) -> bool``, where ``matches(ident) -> bool`` answers one identifier."""
    tokens: list[str] = []
    pos = 0
    expr = expr or ""
    while pos < len(expr):
        m = _TOKENS.match(expr, pos)
        if not m:
            if expr[pos:].strip():
                raise ValueError(f"invalid expression {expr!r} at column {pos + 1}")
            break
        tokens.append(m.group(1))
        pos = m.end()

    def parse_or(i):
        node, i = parse_and(i)
        while i < len(tokens) and tokens[i] == "or":
            right, i = parse_and(i + 1)
            node = ("or", node, right)
        return node, i

    def parse_and(i):
        node, i = parse_not(i)
        while i < len(tokens) and tokens[i] == "and":
            right, i = parse_not(i + 1)
            node = ("and", node, right)
        return node, i

    def parse_not(i):
        if i >= len(tokens):
            raise ValueError(f"invalid expression {expr!r}: unexpected end")
        tok = tokens[i]
        if tok == "not":
            node, i = parse_not(i + 1)
            return ("not", node), i
        if tok == "(":
            node, i = parse_or(i + 1)
            if i >= len(tokens) or tokens[i] != ")":
                raise ValueError(f"invalid expression {expr!r}: missing ')'")
            return node, i + 1
        if tok in (")", "and", "or"):
            raise ValueError(f"invalid expression {expr!r}: unexpected {tok!r}")
        return ("id", tok), i + 1

    if not tokens:
        return lambda matches: True
    tree, end = parse_or(0)
    if end != len(tokens):
        raise ValueError(f"invalid expression {expr!r}: unexpected {tokens[end]!r}")

    def evaluate(node, matches):
        op = node[0]
        if op == "id":
            return matches(node[1])
        if op == "not":
            return not evaluate(node[1], matches)
        if op == "and":
            return evaluate(node[1], matches) and evaluate(node[2], matches)
        return evaluate(node[1], matches) or evaluate(node[2], matches)

    return lambda matches: evaluate(tree, matches)


# ---------------------------------------------------------------------------
# collection
# ---------------------------------------------------------------------------


def _mark_list(obj) -> list:
    """The marks on a function, class or module, as objects with .name/.args/.kwargs."""
    if obj is None:
        return []
    if isinstance(obj, types.ModuleType):
        raw = getattr(obj, "pytestmark", [])
    elif isinstance(obj, type):
        raw = []
        for klass in reversed(obj.__mro__):
            raw += list(klass.__dict__.get("pytestmark", []))
    else:
        raw = getattr(obj, "pytestmark", [])
    if not isinstance(raw, (list, tuple)):
        raw = [raw]
    return [getattr(m, "mark", m) for m in raw]


def _ascii_escaped(value) -> str:
    if isinstance(value, bytes):
        return value.decode("ascii", "backslashreplace")
    return value.encode("unicode_escape").decode("ascii")


def _idval(value, argname: str, index: int) -> str:
    """The id pytest gives one parameter value."""
    import enum

    if isinstance(value, (str, bytes)):
        return _ascii_escaped(value)
    if value is None or isinstance(value, (int, float, complex, bool)):
        return str(value)
    if isinstance(value, re.Pattern):
        return _ascii_escaped(value.pattern)
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(value, type) or inspect.isfunction(value) or inspect.isbuiltin(value):
        name = getattr(value, "__name__", None)
        if isinstance(name, str):
            return name
    return f"{argname}{index}"


def _unique_ids(ids: list[str]) -> list[str]:
    counts = Counter(ids)
    seen: Counter = Counter()
    out = []
    for i in ids:
        if counts[i] > 1:
            suffix = "_" if i and i[-1].isdigit() else ""
            out.append(f"{i}{suffix}{seen[i]}")
            seen[i] += 1
        else:
            out.append(i)
    return out


@dataclass
class _ParamSet:
    values: dict
    id: str
    marks: list


def _expand_parametrize(mark) -> tuple[list[str], list[_ParamSet]]:
    """One ``parametrize`` mark -> (argnames, parameter sets)."""
    from . import _pytest_shim as shim

    args = list(mark.args)
    kwargs = dict(mark.kwargs)
    argnames = args.pop(0) if args else kwargs.pop("argnames")
    argvalues = args.pop(0) if args else kwargs.pop("argvalues")
    if args:
        kwargs.setdefault("indirect", args.pop(0))
    if args:
        kwargs.setdefault("ids", args.pop(0))
    if kwargs.get("indirect"):
        raise _Unsupported("parametrize(indirect=...) needs pytest")
    if isinstance(argnames, str):
        names = [n.strip() for n in argnames.split(",") if n.strip()]
    else:
        names = list(argnames)
    single = isinstance(argnames, str) and "," not in argnames and len(names) == 1
    ids_arg = kwargs.get("ids")
    sets: list[_ParamSet] = []
    raw_ids: list[str] = []
    for index, value in enumerate(list(argvalues)):
        if isinstance(value, shim.ParameterSet):
            values, marks, explicit = tuple(value.values), list(value.marks), value.id
        else:
            values = (value,) if single else tuple(value)
            marks, explicit = [], None
        if len(values) != len(names):
            raise ValueError(
                f"parametrize {argnames!r}: {len(values)} values for {len(names)} names"
            )
        marks = [getattr(m, "mark", m) for m in marks]
        ident = explicit
        if ident is None and ids_arg is not None:
            if callable(ids_arg):
                parts = []
                for n, v in zip(names, values, strict=True):
                    got = ids_arg(v)
                    parts.append(_idval(v, n, index) if got is None else str(got))
                ident = "-".join(parts)
            elif index < len(ids_arg) and ids_arg[index] is not None:
                ident = str(ids_arg[index])
        if ident is None:
            ident = "-".join(_idval(v, n, index) for n, v in zip(names, values, strict=True))
        raw_ids.append(ident)
        sets.append(_ParamSet(dict(zip(names, values, strict=True)), ident, marks))
    for s, ident in zip(sets, _unique_ids(raw_ids), strict=True):
        s.id = ident
    return names, sets


class _Unsupported(Exception):
    """Something only pytest can do: the test is skipped with this reason."""


@dataclass
class Item:
    nodeid: str
    module: types.ModuleType
    modfile: str
    cls: type | None
    funcname: str
    name: str
    func: Any
    params: dict
    marks: list
    argnames: list[str]
    skip_reason: str | None = None
    unsupported: bool = False

    def keywords(self) -> set[str]:
        words = {self.name, self.funcname, self.modfile, self.modfile[:-3]}
        if self.cls is not None:
            words.add(self.cls.__name__)
        words.add(self.module.__name__.rpartition(".")[0].rpartition(".")[2])
        words.update(m.name for m in self.marks)
        return {w for w in words if w}


@dataclass
class Report:
    nodeid: str
    modfile: str
    outcome: str  # "passed", "failed", "skipped"
    reason: str = ""
    longrepr: str = ""
    captured: str = ""
    duration: float = 0.0
    unsupported: bool = False
    xfail: bool = False


def _argnames(func, *, is_method: bool) -> list[str]:
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return []
    names = []
    for i, p in enumerate(sig.parameters.values()):
        if is_method and i == 0:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        names.append(p.name)
    return names


def _is_test_class(name: str, obj) -> bool:
    if not (isinstance(obj, type) and name.startswith("Test")):
        return False
    return all("__init__" not in k.__dict__ for k in obj.__mro__ if k is not object)


def _collect_function(module, modfile, cls, funcname, func) -> list[Item]:
    marks = _mark_list(func) + _mark_list(cls) + _mark_list(module)
    argnames = _argnames(func, is_method=cls is not None)
    prefix = f"{modfile}::" + (f"{cls.__name__}::" if cls is not None else "")
    param_marks = [m for m in marks if m.name == "parametrize"]
    base = dict(
        module=module, modfile=modfile, cls=cls, funcname=funcname, func=func, argnames=argnames
    )
    if not param_marks:
        return [Item(nodeid=prefix + funcname, name=funcname, params={}, marks=marks, **base)]
    try:
        expanded = [_expand_parametrize(m) for m in param_marks]
    except _Unsupported as exc:
        return [
            Item(
                nodeid=prefix + funcname,
                name=funcname,
                params={},
                marks=marks,
                skip_reason=str(exc),
                unsupported=True,
                **base,
            )
        ]
    empty = [names for names, sets in expanded if not sets]
    if empty:
        name = f"{funcname}[NOTSET]"
        return [
            Item(
                nodeid=prefix + name,
                name=name,
                params={},
                marks=marks,
                skip_reason=f"got empty parameter set for ({', '.join(empty[0])})",
                **base,
            )
        ]
    items = []
    # the innermost decorator comes first in the id, the outermost varies fastest (as pytest)
    for combo in itertools.product(*(sets for _, sets in expanded)):
        params: dict = {}
        extra_marks: list = []
        for s in combo:
            params.update(s.values)
            extra_marks += s.marks
        name = f"{funcname}[{'-'.join(s.id for s in combo)}]"
        items.append(
            Item(
                nodeid=prefix + name,
                name=name,
                params=params,
                marks=extra_marks + marks,
                **base,
            )
        )
    return items


def collect_module(module, modfile: str) -> list[Item]:
    items: list[Item] = []
    for name, obj in list(vars(module).items()):
        if name.startswith("test") and inspect.isfunction(obj):
            items += _collect_function(module, modfile, None, name, obj)
        elif _is_test_class(name, obj):
            for attr, member in list(vars(obj).items()):
                if attr.startswith("test") and inspect.isfunction(member):
                    items += _collect_function(module, modfile, obj, attr, member)
    return items


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------


@dataclass
class FixtureDef:
    name: str
    func: Any
    scope: str = "function"
    autouse: bool = False
    attr: str | None = None  # for class fixtures: the method name
    params: Any = None


def _fixtures_in(namespace: dict) -> dict[str, FixtureDef]:
    out = {}
    for attr, obj in namespace.items():
        info = getattr(obj, "_dlpack_shim_fixture", None)
        if info is not None and callable(obj):
            out[info.name] = FixtureDef(
                info.name, obj, info.scope, info.autouse, attr=attr, params=info.params
            )
    return out


class MonkeyPatch:
    """The part of pytest's ``monkeypatch`` fixture that most tests use."""

    _NOTSET = object()

    def __init__(self) -> None:
        self._undo: list = []

    def setattr(self, target, name, value=_NOTSET, raising=True):
        if value is self._NOTSET:
            if not isinstance(target, str):
                raise TypeError("use setattr(target, name, value) or setattr('mod.attr', value)")
            value = name
            modpath, _, name = target.rpartition(".")
            target = importlib.import_module(modpath)
        old = getattr(target, name, self._NOTSET)
        if raising and old is self._NOTSET:
            raise AttributeError(f"{target!r} has no attribute {name!r}")
        if inspect.isclass(target):
            old = target.__dict__.get(name, self._NOTSET)
        self._undo.append(lambda: self._restore_attr(target, name, old))
        setattr(target, name, value)

    def _restore_attr(self, target, name, old):
        if old is self._NOTSET:
            with contextlib.suppress(AttributeError):
                delattr(target, name)
        else:
            setattr(target, name, old)

    def delattr(self, target, name, raising=True):
        old = getattr(target, name, self._NOTSET)
        if old is self._NOTSET:
            if raising:
                raise AttributeError(name)
            return
        self._undo.append(lambda: setattr(target, name, old))
        delattr(target, name)

    def setitem(self, mapping, key, value):
        old = mapping.get(key, self._NOTSET)
        self._undo.append(lambda: self._restore_item(mapping, key, old))
        mapping[key] = value

    def delitem(self, mapping, key, raising=True):
        if key not in mapping:
            if raising:
                raise KeyError(key)
            return
        old = mapping[key]
        self._undo.append(lambda: mapping.__setitem__(key, old))
        del mapping[key]

    def _restore_item(self, mapping, key, old):
        if old is self._NOTSET:
            mapping.pop(key, None)
        else:
            mapping[key] = old

    def setenv(self, name, value, prepend=None):
        value = str(value)
        if prepend and name in os.environ:
            value = value + prepend + os.environ[name]
        self.setitem(os.environ, name, value)

    def delenv(self, name, raising=True):
        self.delitem(os.environ, name, raising=raising)

    def syspath_prepend(self, path):
        old = list(sys.path)
        self._undo.append(lambda: sys.path.__setitem__(slice(None), old))
        sys.path.insert(0, str(path))
        importlib.invalidate_caches()

    def chdir(self, path):
        old = os.getcwd()
        self._undo.append(lambda: os.chdir(old))
        os.chdir(path)

    def undo(self):
        while self._undo:
            self._undo.pop()()


class CaptureFixture:
    """``capsys``: ``readouterr()`` returns (and clears) what the test wrote so far."""

    def __init__(self) -> None:
        self._out, self._err = io.StringIO(), io.StringIO()
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = self._out, self._err

    def readouterr(self):
        from collections import namedtuple

        result = namedtuple("CaptureResult", "out err")(self._out.getvalue(), self._err.getvalue())
        for buf in (self._out, self._err):
            buf.seek(0)
            buf.truncate()
        return result

    def close(self):
        sys.stdout, sys.stderr = self._saved


class TmpPathFactory:
    def __init__(self, base: str) -> None:
        self._base = base
        self._count = Counter()

    def getbasetemp(self):
        import pathlib

        return pathlib.Path(self._base)

    def mktemp(self, basename: str, numbered: bool = True):
        import pathlib

        basename = re.sub(r"[\W]", "_", basename)[:30] or "tmp"
        if numbered:
            n = self._count[basename]
            self._count[basename] += 1
            basename = f"{basename}{n}"
        path = pathlib.Path(self._base) / basename
        path.mkdir()
        return path


class Session:
    def __init__(self, out, verbosity: int, capture: bool, tb: str) -> None:
        self.out = out
        self.verbosity = verbosity
        self.capture = capture
        self.tb = tb
        self.tmpdir = tempfile.mkdtemp(prefix="dlpack-tests-")
        self.factory = TmpPathFactory(self.tmpdir)
        self.cache: dict = {}
        self.scoped_teardowns: dict[str, list] = {"module": [], "session": []}
        self.builtins = {
            "tmp_path": FixtureDef("tmp_path", self._tmp_path),
            "tmp_path_factory": FixtureDef("tmp_path_factory", self._factory, scope="session"),
            "monkeypatch": FixtureDef("monkeypatch", self._monkeypatch),
            "capsys": FixtureDef("capsys", self._capsys),
            "recwarn": FixtureDef("recwarn", self._recwarn),
        }
        self.current_item: Item | None = None

    def _tmp_path(self):
        name = self.current_item.name if self.current_item else "tmp"
        return self.factory.mktemp(name)

    def _factory(self):
        return self.factory

    def _monkeypatch(self):
        mp = MonkeyPatch()
        yield mp
        mp.undo()

    def _capsys(self):
        cap = CaptureFixture()
        try:
            yield cap
        finally:
            cap.close()

    def _recwarn(self):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            yield rec

    def end_scope(self, scope: str):
        errors = []
        for td in reversed(self.scoped_teardowns[scope]):
            try:
                td()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        self.scoped_teardowns[scope].clear()
        scopes = ("module", "class") if scope == "module" else (scope,)
        for key in [k for k in self.cache if k[0] in scopes]:
            del self.cache[key]
        return errors

    def close(self):
        self.end_scope("module")
        self.end_scope("session")
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _call_fixture(func, kwargs, teardowns: list):
    if inspect.isgeneratorfunction(func):
        gen = func(**kwargs)
        value = next(gen)

        def finish():
            try:
                next(gen)
            except StopIteration:
                return
            raise RuntimeError(f"fixture {func.__name__} yielded more than once")

        teardowns.append(finish)
        return value
    return func(**kwargs)


def _setup_fixtures(item: Item, instance, session: Session, conftest_fx, module_fx, teardowns):
    available: dict[str, FixtureDef] = {}
    available.update(session.builtins)
    available.update(conftest_fx)
    available.update(module_fx)
    if item.cls is not None:
        for klass in reversed(item.cls.__mro__):
            available.update(_fixtures_in(vars(klass)))
    values: dict[str, Any] = dict(item.params)

    def get(name: str, stack: tuple):
        if name in values:
            return values[name]
        if name in stack:
            raise RuntimeError(f"recursive fixture dependency: {' -> '.join(stack + (name,))}")
        fd = available.get(name)
        if fd is None:
            if name in PYTEST_ONLY_FIXTURES:
                raise _UnsupportedSkip(
                    f"needs pytest's {name!r} fixture, which the built-in runner lacks"
                )
            raise LookupError(f"fixture {name!r} not found")
        if fd.params is not None:
            raise _UnsupportedSkip(f"needs the parametrized fixture {name!r} (pytest only)")
        is_class_fx = (
            item.cls is not None
            and fd.attr is not None
            and any(fd.attr in vars(k) and vars(k)[fd.attr] is fd.func for k in item.cls.__mro__)
        )
        func = getattr(instance, fd.attr) if is_class_fx else fd.func
        deps = {n: get(n, stack + (name,)) for n in _argnames(func, is_method=False)}
        if fd.scope == "function":
            value = _call_fixture(func, deps, teardowns)
        else:
            scope = "session" if fd.scope in ("session", "package") else "module"
            key = (fd.scope, name, item.module.__name__ if scope == "module" else None)
            if fd.scope == "class":
                key = ("class", name, item.cls)
            if key not in session.cache:
                session.cache[key] = _call_fixture(func, deps, session.scoped_teardowns[scope])
            value = session.cache[key]
        values[name] = value
        return value

    autouse = [fd.name for fd in available.values() if fd.autouse]
    for name in autouse:
        get(name, ())
    return {n: get(n, ()) for n in item.argnames}


class _UnsupportedSkip(Exception):
    pass


# ---------------------------------------------------------------------------
# running one item
# ---------------------------------------------------------------------------


def _eval_condition(cond, item: Item):
    if isinstance(cond, str):
        namespace = {"os": os, "sys": sys, "platform": __import__("platform"), "config": None}
        namespace.update(vars(item.module))
        return eval(cond, namespace)  # noqa: S307 - pytest evaluates string conditions too
    return cond


def _static_skip(item: Item) -> str | None:
    if item.skip_reason is not None:
        return item.skip_reason
    for m in item.marks:
        if m.name == "skip":
            return m.kwargs.get("reason", m.args[0] if m.args else "unconditional skip")
        if m.name == "skipif":
            conds = m.args or (m.kwargs.get("condition"),)
            for cond in conds:
                if _eval_condition(cond, item):
                    reason = m.kwargs.get("reason")
                    if reason is None:
                        reason = f"condition: {cond}" if isinstance(cond, str) else ""
                    return reason
    return None


def _xfail(item: Item):
    for m in item.marks:
        if m.name == "xfail":
            conds = m.args or (m.kwargs.get("condition", True),)
            if any(_eval_condition(c, item) for c in conds):
                return m
    return None


def _format_exception(exc: BaseException, tb_style: str) -> str:
    tb = exc.__traceback__
    here = os.path.normcase(os.path.abspath(__file__))
    while tb is not None and os.path.normcase(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    if tb_style == "no":
        return ""
    lines = traceback.format_exception(type(exc), exc, tb)
    if tb_style == "line":
        return lines[-1].rstrip()
    if tb_style == "short":
        te = traceback.TracebackException(type(exc), exc, tb)
        frames = list(te.stack)[-1:]
        text = "".join(traceback.format_list(frames))
        return text + "".join(te.format_exception_only()).rstrip()
    return "".join(lines).rstrip()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run_item(item: Item, session: Session, conftest_fx, module_fx) -> Report:
    from . import _pytest_shim as shim

    report = Report(item.nodeid, item.modfile, "passed")
    reason = _static_skip(item)
    if reason is not None:
        report.outcome, report.reason, report.unsupported = "skipped", reason, item.unsupported
        return report
    xfail_mark = _xfail(item)
    if xfail_mark is not None and xfail_mark.kwargs.get("run", True) is False:
        report.outcome, report.xfail = "skipped", True
        report.reason = "xfail (not run): " + str(xfail_mark.kwargs.get("reason", ""))
        return report
    session.current_item = item
    teardowns: list = []
    buf = io.StringIO()
    failure: BaseException | None = None
    start = time.perf_counter()
    redirect = (
        (contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf))
        if session.capture
        else (contextlib.nullcontext(), contextlib.nullcontext())
    )
    with redirect[0], redirect[1]:
        try:
            instance = item.cls() if item.cls is not None else None
            kwargs = _setup_fixtures(item, instance, session, conftest_fx, module_fx, teardowns)
            if instance is not None:
                func = getattr(instance, item.funcname)
                setup = getattr(instance, "setup_method", None)
                if setup is not None:
                    setup(func)
                    teardown = getattr(instance, "teardown_method", None)
                    if teardown is not None:
                        teardowns.append(lambda: teardown(func))
            else:
                func = item.func
            func(**kwargs)
        except shim.Skipped as exc:
            report.outcome, report.reason = "skipped", str(exc) or "skipped"
        except _UnsupportedSkip as exc:
            report.outcome, report.reason, report.unsupported = "skipped", str(exc), True
        except shim.XFailed as exc:
            report.outcome, report.xfail = "skipped", True
            report.reason = f"xfail: {exc}"
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - every other exception fails the test
            failure = exc
        finally:
            for td in reversed(teardowns):
                try:
                    td()
                except KeyboardInterrupt:
                    raise
                except BaseException as exc:  # noqa: BLE001
                    if failure is None:
                        failure = exc
    session.current_item = None
    report.duration = time.perf_counter() - start
    report.captured = buf.getvalue()
    if xfail_mark is not None and report.outcome != "skipped":
        raises = xfail_mark.kwargs.get("raises")
        if failure is not None and (raises is None or isinstance(failure, raises)):
            report.outcome, report.xfail = "skipped", True
            report.reason = "xfail: " + str(xfail_mark.kwargs.get("reason", "") or _short(failure))
            return report
        if failure is None and xfail_mark.kwargs.get("strict", False):
            report.outcome = "failed"
            report.reason = "XPASS(strict) " + str(xfail_mark.kwargs.get("reason", ""))
            report.longrepr = report.reason
            return report
    if failure is not None:
        if isinstance(failure, shim.Failed) and not str(failure):
            failure = shim.Failed("pytest.fail() called")
        report.outcome = "failed"
        report.reason = _short(failure)
        report.longrepr = _format_exception(failure, session.tb)
    return report


# ---------------------------------------------------------------------------
# the built-in runner
# ---------------------------------------------------------------------------


class _ArgumentParser(argparse.ArgumentParser):
    why = ""

    def error(self, message):
        self.exit(
            EXIT_USAGEERROR,
            f"{self.prog}: error: {message}\n(the built-in runner is in use: {self.why}; "
            "it knows -k, -m, -x, --maxfail, -v, -q, -s, --tb, --co and test module names; "
            "see -h)\n",
        )


def _parser(why: str = "") -> argparse.ArgumentParser:
    p = _ArgumentParser(
        prog="python -m dlpack.tests",
        description="dlpack's test suite, run by the built-in runner (pytest is not in use). "
        "These pytest options are understood; other pytest options are accepted and ignored "
        "where they only change pytest's own behaviour.",
        allow_abbrev=False,
    )
    p.why = why or "pytest is not in use"
    p.add_argument("targets", nargs="*", help="test modules: test_x.py[::Class::test_name]")
    p.add_argument("-k", dest="keyword", default="", help="only tests matching the expression")
    p.add_argument("-m", dest="markexpr", default="", help="only tests whose marks match")
    p.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failure")
    p.add_argument("--maxfail", type=int, default=0, help="stop after this many failures")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="count", default=0)
    p.add_argument("-s", dest="nocapture", action="store_true", help="don't capture output")
    p.add_argument("--capture", default="sys", help="'no' is -s; other values capture")
    p.add_argument(
        "--tb", default="auto", choices=["auto", "long", "short", "line", "native", "no"]
    )
    p.add_argument("--co", "--collect-only", dest="collect_only", action="store_true")
    # pytest options that only tune pytest itself: accepted so the same command line works
    p.add_argument("-r", dest="report_chars", default="")
    p.add_argument("-p", dest="plugins", action="append", default=[])
    p.add_argument("-o", "--override-ini", dest="ini", action="append", default=[])
    p.add_argument("-W", dest="warning_filters", action="append", default=[])
    p.add_argument("--durations", type=int, default=None)
    p.add_argument("--color", default=None)
    p.add_argument("--import-mode", default=None)
    p.add_argument("--basetemp", default=None)
    for flag in (
        "--pyargs",
        "--strict-markers",
        "--strict",
        "-l",
        "--showlocals",
        "--disable-warnings",
        "--disable-pytest-warnings",
        "--no-header",
        "--no-summary",
        "--continue-on-collection-errors",
    ):
        p.add_argument(
            flag, action="store_true", dest="ignored_" + flag.strip("-").replace("-", "_")
        )
    return p


def _select_modules(targets: list[str], package: str, modules: list[str]):
    """targets -> {module: [selector rest parts]} (an empty list selects the whole module)."""
    if not targets:
        return {m: [] for m in modules}, []
    chosen: dict[str, list] = {}
    unknown = []
    for t in targets:
        resolved = _resolve_target(t, package, modules)
        if resolved is None:
            unknown.append(t)
            continue
        mod, rest = resolved
        for m in [mod] if mod else modules:
            if not rest:
                chosen[m] = []
            elif m not in chosen or chosen[m]:
                chosen.setdefault(m, []).append(rest.split("::"))
    return {m: chosen[m] for m in modules if m in chosen}, unknown


def _matches_selector(item: Item, selectors: list) -> bool:
    if not selectors:
        return True
    parts = ([item.cls.__name__] if item.cls is not None else []) + [item.name]
    for sel in selectors:
        if len(sel) > len(parts):
            continue
        ok = all(s == p for s, p in zip(sel[:-1], parts, strict=False))
        last, have = sel[-1], parts[len(sel) - 1]
        if ok and (last == have or (len(sel) == len(parts) and have.split("[")[0] == last)):
            return True
    return False


@contextlib.contextmanager
def _shim_installed(package: str):
    """Put the shim in sys.modules["pytest"] and make the package's test modules import afresh
    (bound to it); put everything back afterwards."""
    from . import _pytest_shim

    def ours(name: str) -> bool:
        if not name.startswith(package + "."):
            return False
        leaf = name[len(package) + 1 :].split(".")[0]
        return leaf.startswith("test_") or leaf == "conftest"

    saved = {k: v for k, v in sys.modules.items() if k == "pytest" or ours(k)}
    for k in saved:
        del sys.modules[k]
    sys.modules["pytest"] = _pytest_shim
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == "pytest" or ours(k)]:
            del sys.modules[k]
        sys.modules.update(saved)


def run_builtin(args: list[str], package: str = DEFAULT_PACKAGE, *, why: str = "") -> int:
    out = sys.stdout
    try:
        opts = _parser(why).parse_args(args)
    except SystemExit as exc:  # -h, or a usage error (argparse has printed it)
        return EXIT_OK if exc.code == 0 else EXIT_USAGEERROR
    try:
        keyword = compile_expression(opts.keyword)
        markexpr = compile_expression(opts.markexpr)
    except ValueError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return EXIT_USAGEERROR
    modules = _test_modules(package)
    selected, unknown = _select_modules(opts.targets, package, modules)
    if unknown:
        print(
            f"ERROR: not a test module of {package}: {', '.join(unknown)} "
            f"(have: {', '.join(modules)})",
            file=sys.stderr,
        )
        return EXIT_USAGEERROR
    verbosity = opts.verbose - opts.quiet
    maxfail = 1 if opts.exitfirst else opts.maxfail
    capture = not (opts.nocapture or opts.capture == "no")
    tb = {"auto": "long", "native": "long"}.get(opts.tb, opts.tb)
    start = time.perf_counter()

    with _shim_installed(package):
        session = Session(out, verbosity, capture, tb)
        try:
            return _run_session(
                session, package, selected, keyword, markexpr, maxfail, opts, why, start
            )
        finally:
            session.close()


def _header(package: str, why: str, conftest) -> list[str]:
    lines = [f"{package}: built-in test runner ({why or 'pytest not in use'})"]
    try:
        import dlpack

        lines.append(
            f"dlpack-adapter {dlpack.__version__} (DLPack {dlpack.DLPACK_VERSION[0]}."
            f"{dlpack.DLPACK_VERSION[1]}) at {os.path.dirname(dlpack.__file__)}"
        )
    except Exception as exc:  # noqa: BLE001 - the tests will show what's wrong
        lines.append(f"dlpack: import failed: {_short(exc)}")
    lines.append(f"python {sys.version.split()[0]} ({sys.executable})")
    hook = getattr(conftest, "pytest_report_header", None)
    if hook is not None:
        with contextlib.suppress(Exception):
            extra = hook(None)
            if isinstance(extra, str):
                extra = [extra]
            lines += [x for x in extra or [] if not x.startswith(("dlpack:", "python:"))]
    return lines


def _run_session(session, package, selected, keyword, markexpr, maxfail, opts, why, start):
    from . import _pytest_shim as shim

    out = session.out
    reports: list[Report] = []
    conftest = None
    conftest_fx: dict = {}
    try:
        conftest = importlib.import_module(f"{package}.conftest")
        conftest_fx = _fixtures_in(vars(conftest))
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.conftest":
            reports.append(_error_report("conftest.py", exc, session.tb))
    except shim.Skipped as exc:
        reports.append(Report("conftest.py", "conftest.py", "skipped", reason=str(exc)))
    except Exception as exc:  # noqa: BLE001
        reports.append(_error_report("conftest.py", exc, session.tb))

    # collect every selected module first (as pytest), then run
    collected: list[tuple[str, types.ModuleType | None, list[Item], dict]] = []
    deselected = 0
    for modname in selected:
        modfile = f"{modname}.py"
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module = importlib.import_module(f"{package}.{modname}")
        except shim.Skipped as exc:
            reports.append(Report(modfile, modfile, "skipped", reason=str(exc) or "skipped"))
            continue
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a broken module is one failure
            reports.append(_error_report(modfile, exc, session.tb))
            continue
        try:
            items = collect_module(module, modfile)
        except Exception as exc:  # noqa: BLE001
            reports.append(_error_report(modfile, exc, session.tb))
            continue
        kept = []
        for item in items:
            words = [w.lower() for w in item.keywords()]
            marknames = {m.name for m in item.marks}
            if (
                _matches_selector(item, selected[modname])
                and keyword(lambda ident, words=words: any(ident.lower() in w for w in words))
                and markexpr(lambda ident, marknames=marknames: ident in marknames)
            ):
                kept.append(item)
            else:
                deselected += 1
        collected.append((modfile, module, kept, _fixtures_in(vars(module))))

    total = sum(len(items) for _, _, items, _ in collected)
    if session.verbosity >= 0:
        for line in _header(package, why, conftest):
            print(line, file=out)
        extra = f" / {deselected} deselected" if deselected else ""
        print(f"collected {total + deselected} items{extra}\n", file=out)
    for r in reports:
        _progress_line(out, session, r, first=True)

    if opts.collect_only:
        for _, _, items, _ in collected:
            for item in items:
                print(item.nodeid, file=out)
        print(f"\n{total} tests collected in {time.perf_counter() - start:.2f}s", file=out)
        return EXIT_OK if total or reports else EXIT_NOTESTSCOLLECTED

    failures = sum(r.outcome == "failed" for r in reports)
    stopped = False
    done = 0
    for modfile, _module, items, module_fx in collected:
        if not items:
            continue
        if session.verbosity <= 0:
            out.write(modfile + " ")
            width = len(modfile) + 1
        for item in items:
            r = run_item(item, session, conftest_fx, module_fx)
            reports.append(r)
            done += 1
            if session.verbosity > 0:
                _progress_line(out, session, r, first=False)
            else:
                out.write(_letter(r))
                width += 1
                if width >= 72:
                    out.write(f" [{100 * done // max(total, 1):3d}%]\n")
                    width = 0
            out.flush()
            if r.outcome == "failed":
                failures += 1
                if maxfail and failures >= maxfail:
                    stopped = True
                    break
        for exc in session.end_scope("module"):
            reports.append(_error_report(f"{modfile} (module fixture teardown)", exc, session.tb))
        if session.verbosity <= 0:
            pad = " " * max(0, 72 - width)
            out.write(f"{pad} [{100 * done // max(total, 1):3d}%]\n")
        if stopped:
            break
    return _summary(session, reports, stopped, maxfail, time.perf_counter() - start, why)


def _error_report(where: str, exc: BaseException, tb: str) -> Report:
    return Report(
        where,
        where.split(" ")[0],
        "failed",
        reason=f"ERROR collecting: {_short(exc)}",
        longrepr=_format_exception(exc, tb),
    )


def _letter(r: Report) -> str:
    if r.outcome == "passed":
        return "."
    if r.outcome == "failed":
        return "F"
    return "x" if r.xfail else "s"


def _progress_line(out, session, r: Report, first: bool):
    word = {"passed": "PASSED", "failed": "FAILED", "skipped": "SKIPPED"}[r.outcome]
    if r.xfail:
        word = "XFAIL"
    extra = f" ({r.reason})" if r.outcome == "skipped" and (session.verbosity > 0 or first) else ""
    print(f"{r.nodeid} {word}{extra}", file=out)


def _summary(session, reports: list[Report], stopped, maxfail, elapsed, why) -> int:
    out = session.out
    failed = [r for r in reports if r.outcome == "failed"]
    skipped = [r for r in reports if r.outcome == "skipped"]
    passed = sum(r.outcome == "passed" for r in reports)
    if failed and session.tb != "no":
        print("\n" + " FAILURES ".center(72, "="), file=out)
        for r in failed:
            print(f" {r.nodeid} ".center(72, "_"), file=out)
            if r.longrepr:
                print(r.longrepr, file=out)
            if r.captured:
                print(" captured output ".center(72, "-"), file=out)
                print(r.captured.rstrip(), file=out)
    if failed or skipped:
        print("\n" + " short test summary info ".center(72, "="), file=out)
        groups = Counter((r.modfile, r.reason) for r in skipped)
        for (modfile, reason), n in groups.items():
            print(f"SKIPPED [{n}] {modfile}: {reason}", file=out)
        for r in failed:
            print(f"FAILED {r.nodeid} - {r.reason}", file=out)
    unsupported = sum(r.unsupported for r in skipped)
    print(file=out)
    if stopped:
        print(
            f"stopped after {maxfail} failure{'s' if maxfail > 1 else ''} (-x / --maxfail)",
            file=out,
        )
    if unsupported:
        print(
            f"{unsupported} of the skipped tests need pytest features the built-in runner "
            "lacks; install pytest to run them",
            file=out,
        )
    print(f"ran in {elapsed:.2f}s with the built-in runner ({why})", file=out)
    print(f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped", file=out)
    out.flush()
    if failed:
        return EXIT_TESTSFAILED
    if not reports:
        return EXIT_NOTESTSCOLLECTED
    return EXIT_OK
