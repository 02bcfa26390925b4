"""Lending the segments that handles name to the processes that receive them.

Pickling a handle pins its segment in this process's lender under a fresh random token, so the
memory outlives the handle until a receiver has it (a pickle never opened keeps its segment
until this process exits, as ``multiprocessing``'s own descriptor passing does). The lender is a
daemon thread serving an abstract Unix socket (SOCK_SEQPACKET; named after the process and a
random suffix, so it vanishes with the process and a later process with the same pid can't
answer for it); only processes of the same user may connect. A receiver keeps one connection to
each producer and, on it:

- releases a token without waiting for a reply, once it has the segment: mapped already, or
  opened straight from this process's descriptor table through /proc (the handle names the
  descriptor lent), so that only the handle's few bytes crossed and nothing waited for the lender;
- or, where /proc won't serve, claims the token first, and gets the segment's descriptor
  (SCM_RIGHTS, as ``multiprocessing`` passes descriptors), then releases it.

The pin lasts until the release, which comes after the receiver holds its lock on the segment
(see ``host``): until then, the segment must be neither freed nor reused.

``multiprocessing.reduction.DupFd`` would pass the descriptor too, but over a new authenticated
connection per handle: about 290 us a handle on a 2-core machine, more than a whole round trip
here (about 200 us).
"""

from __future__ import annotations

import os
import selectors
import socket
import threading

from .._dlpack import _peer_uid

_CLAIM = b"C"
_RELEASE = b"R"
_GRANTED = b"K"
_REFUSED = b"E"
TOKEN_BYTES = 16
# How long a receiver waits for a producer's answer: a producer holding the GIL in a long
# computation delays its lender, but one that never answers must not hang the receiver.
CLAIM_TIMEOUT_S = 60.0
# Receivers keep connections to at most this many producers (a connection holds nothing: it is
# only kept to save a connect per handle).
_MAX_CONNECTIONS = 32


class Pin:
    """What a token lends: ``fd`` (the descriptor to send) and ``keep`` (what keeps the memory
    alive in this process until the receiver has it)."""

    __slots__ = ("fd", "keep")

    def __init__(self, fd: int, keep: object):
        self.fd = fd
        self.keep = keep


class _Lender:
    def __init__(self) -> None:
        self.pins: dict[bytes, Pin] = {}
        self.lock = threading.Lock()
        self.address = f"\0dlpack-share/{os.getpid()}/{os.urandom(8).hex()}"
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.address)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._serve, name="dlpack-share-lender", daemon=True)
        self.thread.start()

    def lend(self, pin: Pin) -> bytes:
        token = os.urandom(TOKEN_BYTES)
        with self.lock:
            self.pins[token] = pin
        return token

    def take(self, token: bytes) -> Pin | None:
        with self.lock:
            return self.pins.pop(token, None)

    def _serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    self._accept()
                else:
                    self._answer(key.fileobj)

    def _accept(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        if _peer_uid(connection.fileno()) != os.getuid():
            connection.close()
            return
        self.selector.register(connection, selectors.EVENT_READ, True)

    def _answer(self, connection: socket.socket) -> None:
        try:
            message = connection.recv(1 + TOKEN_BYTES)
        except OSError:
            message = b""
        op, token = message[:1], message[1:]
        try:
            if op == _CLAIM:
                # The pin stays until the receiver releases it, once it holds its lock on the
                # segment (before then, the segment must not be reused).
                with self.lock:
                    pin = self.pins.get(token)
                if pin is None:
                    reason = (
                        "this handle was already opened from its pickle and its memory is no "
                        "longer shared, or it was not made by this process"
                    )
                    connection.send(_REFUSED + reason.encode())
                else:
                    socket.send_fds(connection, [_GRANTED], [pin.fd])
                return
            if op == _RELEASE:
                self.take(token)
                return
        except OSError:
            pass  # the receiver went away mid-answer: as at end of file
        # End of file (the receiver closed or died), or a message no receiver of ours sends.
        self.selector.unregister(connection)
        connection.close()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's lender is the parent's (its thread did not fork).
        Close our copies of its sockets; the parent's stay open."""
        self.pins.clear()
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()


class _Connection:
    __slots__ = ("lock", "sock")

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(CLAIM_TIMEOUT_S)
        try:
            self.sock.connect(address)
        except BaseException:
            self.sock.close()
            raise
        self.lock = threading.Lock()


_lender: _Lender | None = None
_lender_lock = threading.Lock()
_connections: dict[str, _Connection] = {}
_connections_lock = threading.Lock()


def lender() -> _Lender:
    """This process's lender, started on first use."""
    global _lender
    if _lender is None:
        with _lender_lock:
            if _lender is None:
                _lender = _Lender()
    return _lender


def own_address() -> str | None:
    return None if _lender is None else _lender.address


def _gone(pid: int, why: str) -> BufferError:
    return BufferError(
        f"the process that shared this memory (pid {pid}) can't be reached ({why}): it has "
        "exited, and nothing else held the memory for this handle (a producer must live until "
        "the handles it sent have been received), or it runs in another container"
    )


def _connection(address: str, pid: int) -> _Connection:
    with _connections_lock:
        connection = _connections.get(address)
        if connection is not None:
            return connection
        try:
            connection = _Connection(address)
        except OSError as exc:
            raise _gone(pid, exc.strerror or type(exc).__name__) from None
        if len(_connections) >= _MAX_CONNECTIONS:
            for old in _connections.values():
                old.sock.close()
            _connections.clear()
        _connections[address] = connection
        return connection


def _drop(address: str, connection: _Connection) -> None:
    with _connections_lock:
        if _connections.get(address) is connection:
            del _connections[address]
    connection.sock.close()


def claim(address: str, pid: int, token: bytes) -> int:
    """Claim ``token`` from the lender at ``address``: a descriptor, ours to close (then
    :func:`release` the token). BufferError when the producer is gone or refuses."""
    for attempt in range(2):
        connection = _connection(address, pid)
        with connection.lock:
            try:
                connection.sock.send(_CLAIM + token)
                message, fds, _, _ = socket.recv_fds(connection.sock, 4096, 1)
            except TimeoutError:
                # A late answer must not be read as the next claim's: this connection goes.
                _drop(address, connection)
                raise BufferError(
                    f"the process that shared this memory (pid {pid}) did not answer within "
                    f"{CLAIM_TIMEOUT_S:.0f} s"
                ) from None
            except OSError as exc:
                message, fds, why = b"", [], exc.strerror or type(exc).__name__
            else:
                why = "it closed the connection"
            if message[:1] == _GRANTED and len(fds) == 1:
                return fds[0]
        for fd in fds:
            os.close(fd)
        if message[:1] == _REFUSED:
            raise BufferError(message[1:].decode(errors="replace"))
        # The connection was to an earlier incarnation's socket or broke: one fresh try.
        _drop(address, connection)
        if attempt:
            raise _gone(pid, why)
    raise AssertionError("unreachable")


def release(address: str, token: bytes) -> None:
    """Give ``token`` back without waiting for an answer (nothing to do when the producer is
    gone: its pins went with it)."""
    with _connections_lock:
        connection = _connections.get(address)
    if connection is None:
        try:
            connection = _connection(address, 0)
        except BufferError:
            return
    with connection.lock:
        try:
            connection.sock.send(_RELEASE + token)
        except OSError:
            _drop(address, connection)


def _after_fork_in_child() -> None:
    """A forked child shares its parent's sockets: closing our copies leaves the parent's
    connections as they are. The child starts its own lender when it first lends."""
    global _lender, _lender_lock, _connections_lock
    if _lender is not None:
        _lender.forget_after_fork()
    _lender = None
    _lender_lock = threading.Lock()
    for connection in _connections.values():
        connection.sock.close()
    _connections.clear()
    _connections_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
