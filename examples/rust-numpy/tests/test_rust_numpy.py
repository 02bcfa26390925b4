"""An extension on both dlpack-adapter and rust-numpy, handed the same numpy memory through each:
a borrow that conflicts with one the other crate holds is refused, whichever borrowed first, and
every borrow ends with its view.

Which extension installed rust-numpy's borrow flags in the process decides how the views meet
them (the runtime's, which records rust-numpy's borrows in its registry, or rust-numpy's own,
where a view takes a borrow too): the module runs under the runtime's, and again in a child
under rust-numpy's (``test_the_same_under_flags_rust_numpy_installed``)."""

import os
import subprocess
import sys
import textwrap

import dlpack_rust_numpy as ex
import numpy as np
import pytest

import dlpack

OURS_REFUSED = "(?s)expected an array of float64: .*borrowed mutably through rust-numpy"
OURS_MUT_REFUSED = "borrowed through rust-numpy .*a mutable view .* needs it alone"
THEIRS_REFUSED = "already borrowed"

# Who installs rust-numpy's borrow flags in this process: the first to borrow, at import.
FIRST = os.environ.get("DLPACK_TEST_FLAGS_FIRST", "dlpack")
if FIRST == "dlpack":
    ex.while_viewed(np.zeros(1), False, lambda: None)
else:
    ex.numpy_borrow(np.zeros(1), False)


def _nothing():
    return None


def test_the_same_under_flags_rust_numpy_installed():
    if FIRST != "dlpack":
        pytest.skip("this is that run")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["DLPACK_TEST_FLAGS_FIRST"] = "rust-numpy"
    out = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert " passed" in out.stdout


def test_f_x_x_is_refused_whichever_crate_borrows_mutably_first():
    x = np.arange(4.0)
    # rust-numpy's mutable borrow of y, then dlpack-adapter's shared view of x.
    with pytest.raises(TypeError, match=OURS_REFUSED) as info:
        ex.axpy_numpy_first(x, 2.0, x)
    assert isinstance(info.value.__cause__, BufferError)
    # dlpack-adapter's mutable view of y, then rust-numpy's shared borrow of x.
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.axpy_ours_first(x, 2.0, x)
    np.testing.assert_array_equal(x, [0.0, 1.0, 2.0, 3.0])


def test_shared_borrows_and_disjoint_memory_are_allowed():
    x = np.arange(4.0)
    assert ex.dot(x, x) == 14.0
    y = np.arange(8.0)
    ex.axpy_numpy_first(y[:4], 10.0, y[4:])
    ex.axpy_ours_first(y[4:], 1.0, y[:4])
    np.testing.assert_array_equal(y, [40.0, 51.0, 62.0, 73.0, 44.0, 56.0, 68.0, 80.0])


def test_borrows_end_with_the_view_whichever_refused():
    x = np.arange(4.0)
    for _ in range(3):
        with pytest.raises(TypeError, match=OURS_REFUSED):
            ex.axpy_numpy_first(x, 2.0, x)
        with pytest.raises(TypeError, match=THEIRS_REFUSED):
            ex.axpy_ours_first(x, 2.0, x)
    # Nothing is left borrowed, in either crate: each lends x mutably again.
    assert ex.numpy_borrow(x, True) == 4
    assert ex.while_viewed(x, True, lambda: ex.numpy_borrow(x[:0], True)) == 0
    assert ex.while_viewed(x, True, _nothing) is None
    # A view rust-numpy refused gave its registry borrow back too.
    with pytest.raises(BufferError, match=OURS_MUT_REFUSED):
        ex.while_borrowed(x, False, lambda: ex.while_viewed(x, True, _nothing))
    assert ex.while_viewed(x, True, lambda: dlpack.copyto(np.zeros(4), x)) is None
    assert ex.numpy_borrow(x, True) == 4


def test_each_crate_refuses_the_other_crates_held_borrow():
    x = np.arange(6.0)
    # Ours held, rust-numpy asks.
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.while_viewed(x, False, lambda: ex.numpy_borrow(x, True))
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.while_viewed(x, True, lambda: ex.numpy_borrow(x, False))
    assert ex.while_viewed(x, False, lambda: ex.numpy_borrow(x, False)) == 6
    # rust-numpy's held, ours asks.
    with pytest.raises(BufferError, match=OURS_MUT_REFUSED):
        ex.while_borrowed(x, False, lambda: ex.while_viewed(x, True, _nothing))
    with pytest.raises(BufferError, match="borrowed mutably through rust-numpy"):
        ex.while_borrowed(x, True, lambda: ex.while_viewed(x, False, _nothing))
    assert ex.while_borrowed(x, False, lambda: ex.while_viewed(x, False, lambda: 7)) == 7


def test_views_of_slices_of_one_base_meet_in_both_crates():
    base = np.arange(12.0)
    x = base[2:10]
    # Overlapping slices (and a slice of a slice) conflict across the crates.
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.while_viewed(x[:4], True, lambda: ex.numpy_borrow(base[5:], False))
    with pytest.raises(BufferError, match=OURS_MUT_REFUSED):
        ex.while_borrowed(x[3:5], False, lambda: ex.while_viewed(base[:6], True, _nothing))
    with pytest.raises(BufferError, match="borrowed mutably through rust-numpy"):
        ex.while_borrowed(base[::-1], True, lambda: ex.while_viewed(x[1:2], False, _nothing))
    # Disjoint ones don't.
    assert ex.while_viewed(x[:4], True, lambda: ex.numpy_borrow(base[6:], True)) == 6
    assert ex.while_borrowed(base[:2], True, lambda: ex.while_viewed(x, True, lambda: 1)) == 1
    # Interleaved ones are compared by the range their elements span, as dlpack-adapter's own
    # views are (rust-numpy alone would let these two be).
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.while_viewed(base[::2], True, lambda: ex.numpy_borrow(base[1::2], True))
    with pytest.raises(BufferError, match=OURS_MUT_REFUSED):
        ex.while_borrowed(base[1::2], True, lambda: ex.while_viewed(base[::2], True, _nothing))


def test_memory_a_numpy_array_holds_is_borrowed_as_the_arrays():
    x = np.arange(5.0)

    class Sub(np.ndarray):
        pass

    # A DLPackObject over a numpy array's memory, a subclass's view of it.
    held = dlpack.asdlpack(x)
    with pytest.raises(BufferError, match=OURS_MUT_REFUSED):
        ex.while_borrowed(x, False, lambda: ex.while_viewed(held, True, _nothing))
    sub = x.view(Sub)
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.while_viewed(sub, True, lambda: ex.numpy_borrow(x, False))
    with pytest.raises(TypeError, match=THEIRS_REFUSED):
        ex.while_viewed(x[1:], True, lambda: ex.numpy_borrow(sub, False))


def test_under_the_runtimes_flags_any_object_over_the_memory_meets_rust_numpy():
    if FIRST != "dlpack":
        pytest.skip("under rust-numpy's own flags, only numpy arrays' views meet its borrows")
    x = np.arange(4.0)
    for other in (memoryview(x), memoryview(x)[1:], np.frombuffer(memoryview(x))):
        with pytest.raises(BufferError, match="borrowed mutably through rust-numpy"):
            ex.while_borrowed(x, True, lambda o=other: ex.while_viewed(o, False, _nothing))
        with pytest.raises(TypeError, match=THEIRS_REFUSED):
            ex.while_viewed(other, True, lambda: ex.numpy_borrow(x[2:], False))
    # rust-numpy's borrows among themselves keep rust-numpy's rules: disjoint interleaved
    # elements are two borrows.
    assert ex.while_borrowed(x[::2], True, lambda: ex.numpy_borrow(x[1::2], True)) == 2


def _run(*parts):
    code = "\n".join(textwrap.dedent(part) for part in parts)
    return subprocess.run(
        [sys.executable, "-P", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
    )


# Whether rust-numpy's borrow flags exist in numpy's module yet.
_INSTALLED = """
def installed():
    import numpy as np

    core = np._core if np.__version__ >= "2" else np.core
    return hasattr(core.multiarray, "_RUST_NUMPY_BORROW_CHECKING_API")
"""


def test_a_view_taken_before_any_rust_numpy_borrow_is_seen_by_the_first():
    # A fresh process: no extension has installed rust-numpy's borrow flags yet. The view
    # installs them (through rust-numpy's own code), so rust-numpy's first borrow sees it.
    out = _run(
        _INSTALLED,
        """
        import numpy as np
        import dlpack_rust_numpy as ex

        x = np.arange(3.0)
        assert not installed()

        def first_borrow():
            assert installed()
            try:
                ex.numpy_borrow(x, False)
            except TypeError as e:
                return str(e)

        print(ex.while_viewed(x, True, first_borrow))
        print(ex.numpy_borrow(x, True))
        """,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["The given array is already borrowed", "3"]


def test_flags_rust_numpy_installed_first_are_the_ones_used():
    out = _run(
        _INSTALLED,
        """
        import numpy as np
        import dlpack_rust_numpy as ex

        x = np.arange(3.0)
        assert ex.numpy_borrow(x, False) == 3 and installed()
        try:
            ex.while_borrowed(x, True, lambda: ex.while_viewed(x, False, lambda: None))
        except BufferError as e:
            print(e)
        """,
    )
    assert out.returncode == 0, out.stderr
    assert "borrowed mutably through rust-numpy" in out.stdout


def test_an_array_reshaped_in_place_during_a_view_gives_its_borrow_back():
    # Under rust-numpy's own flags, which find a borrow again from the array they are given:
    # the view's borrow is kept under an array of its own, which no reshape of the viewed one
    # changes. In a child: a key rust-numpy no longer finds aborts the process.
    out = _run(
        """
        import numpy as np
        import dlpack_rust_numpy as ex

        ex.numpy_borrow(np.zeros(1), False)
        for mutable in (True, False):
            x = np.arange(6.0)

            def reshape():
                x.shape = (2, 3)

            ex.while_viewed(x, mutable, reshape)
            print(x.shape, ex.numpy_borrow(x, True))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["(2, 3) 6", "(2, 3) 6"]
