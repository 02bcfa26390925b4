"""The operating-system calls sharing makes through the extension (Linux): open file description
locks, faulting pages in, and a socket peer's user."""

import mmap
import os
import socket
import sys

import pytest

if sys.platform != "linux":
    pytest.skip("sharing host memory is Linux-only", allow_module_level=True)

from dlpack._dlpack import _lock_file, _peer_uid, _populate_write  # noqa: E402


def test_locks_belong_to_open_file_descriptions():
    fd = os.memfd_create("dlpack-test", os.MFD_CLOEXEC)
    other = os.open(f"/proc/self/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        assert _lock_file(fd, "read") and _lock_file(other, "read")
        assert not _lock_file(other, "write")  # another description holds a read lock
        assert _lock_file(fd, "unlock")
        assert _lock_file(other, "write")
        assert not _lock_file(fd, "read")
    finally:
        os.close(other)  # its lock goes with it
    try:
        assert _lock_file(fd, "write")
    finally:
        os.close(fd)


def test_lock_refuses_bad_arguments():
    with pytest.raises(ValueError, match="lock kind"):
        _lock_file(0, "exclusive")
    with pytest.raises(ValueError, match="not a file descriptor"):
        _lock_file(-1, "read")
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError):
        _lock_file(r, "read")


def test_populate_write_keeps_contents():
    mapping = mmap.mmap(-1, 8 << 20)
    mapping[:4] = b"abcd"
    _populate_write(mapping, 8 << 20)
    _populate_write(mapping, 5)
    assert mapping[:4] == b"abcd" and mapping[-1] == 0


def test_populate_write_refuses_what_is_not_its_to_write():
    with pytest.raises(ValueError, match="read-only"):
        _populate_write(b"abc", 3)
    with pytest.raises(ValueError, match="asked for 9 of 8"):
        _populate_write(bytearray(8), 9)
    with pytest.raises(TypeError):
        _populate_write(object(), 1)


def test_peer_uid():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert _peer_uid(a.fileno()) == os.getuid()
