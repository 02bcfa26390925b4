"""What the report does to the terminal besides its output: a progress line while it works,
native libraries' log lines kept off it, and what libraries print kept off stdout.

TensorFlow, Paddle and absl log from C++ straight to file descriptor 2, past ``sys.stderr``, when
imported and when first used. While the report imports and exercises libraries, descriptor 2 is a
temporary file; afterwards, the lines in it that are such logs are dropped and the others (a
Python traceback, a warning printed by hand) are written to the real stderr. Descriptor 1 is
descriptor 2 meanwhile, so what a library prints (``print`` or a native write) goes that way too:
stdout carries the report alone (a JSON document stays one).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from typing import TextIO

# glog and absl ("W1125 14:03:07.123456  8101 file.cc:42] ...", and before absl's logging is set
# up, "I0000 00:00:1700000000.123456    8101 port.cc:153] ..."),
# TensorFlow's own ("2024-01-01 12:00:00.000000: I tensorflow/core/util/port.cc:113] ..."), and
# absl's line about them
_NATIVE_LOG = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$)"
)


def is_native_log(line: str) -> bool:
    """Whether ``line`` is a native library's log line (glog, absl, TensorFlow)."""
    return _NATIVE_LOG.match(line) is not None


def relevant_lines(text: str) -> list[str]:
    """The lines of ``text`` that are not native libraries' log lines."""
    return [line for line in text.splitlines() if line.strip() and not is_native_log(line)]


class Progress:
    """One line on the terminal saying what the report is doing; nothing where ``stream`` is not
    a terminal."""

    def __init__(self, stream: TextIO | None) -> None:
        self._out = stream
        self._stream = stream if stream is not None and _isatty(stream) else None
        self._width = shutil.get_terminal_size().columns - 1
        self._shown = ""

    def show(self, text: str) -> None:
        self._shown = text
        if self._stream is not None:
            self._stream.write("\r\x1b[K" + text[: self._width])
            self._stream.flush()

    def note(self, line: str) -> None:
        """``line`` on a line of its own, terminal or not (on a terminal, the progress line comes
        back under it)."""
        if self._out is None:
            return
        if self._stream is None:
            self._out.write(line + "\n")
        else:
            self._out.write("\r\x1b[K" + line + "\n" + self._shown[: self._width])
        self._out.flush()

    def clear(self) -> None:
        self.show("")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError):  # closed
        return False


@contextlib.contextmanager
def native_stderr_kept_aside() -> Iterator[TextIO | None]:
    """Descriptor 2 goes to a temporary file for the block; yields a stream on the real stderr
    (None where there is no descriptor 2), then writes the captured lines that are not native
    logs to it."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield None
        return
    real = os.fdopen(saved, "w", errors="replace")
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield real
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            captured.seek(0)
            for line in relevant_lines(captured.read().decode(errors="replace")):
                real.write(line + "\n")
            real.close()


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Descriptor 1 writes where descriptor 2 does for the block (inside
    :func:`native_stderr_kept_aside`: its file), so that what libraries print stays off stdout;
    what they left in Python's or C's stdout buffers is flushed there before it is restored."""
    _flush_stdout()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1: nothing to keep clean
        yield
        return
    try:
        os.dup2(2, 1)
    except OSError:  # no descriptor 2: stdout stays as it is
        os.close(saved)
        yield
        return
    try:
        yield
    finally:
        _flush_stdout()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_stdout() -> None:
    if sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
    # a library's printf, buffered in C's stdout until exit (after the report) where it's a pipe
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None).fflush(None)
