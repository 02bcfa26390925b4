"""Handing arrays to other processes: :func:`share` makes a small picklable handle to an array's
memory, which ``asdlpack`` (or any ``from_dlpack``) opens without a copy in the process it is
sent to, through any ``multiprocessing`` channel (``Queue``, ``Pipe``, ``Pool``) and with every
start method::

    import multiprocessing as mp
    import numpy as np
    import dlpack

    def worker(queue):
        a = np.asarray(dlpack.asdlpack(queue.get()))  # the producer's memory, read-only

    if __name__ == "__main__":
        queue = mp.Queue()
        mp.Process(target=worker, args=(queue,)).start()
        queue.put(dlpack.share(np.arange(10.0)))

Host memory travels as a sealed memory file (memfd) that the receiver opens from the sender's
descriptor table, or gets from the sender's lender thread (CUDA memory can't be shared yet).
:func:`empty_shared` allocates shared memory up front, so that sharing it (or any view of it)
later copies nothing. A handle works on the machine that made it; to send arrays to other
machines, pickle the arrays themselves (a ``DLPackObject`` pickles with out-of-band buffers,
protocol 5), e.g. through Dask distributed.

:func:`share_tree` shares a whole pytree (a model's weights) as one segment behind one handle,
which its lender (or a writable holder) refreshes in place with :meth:`SharedTree.update` and
receivers read as consistent snapshots (:meth:`SharedTree.snapshot`).
"""

from ._sharing.handles import SharedHandle, empty_shared, share
from ._sharing.tree import SharedTree, TreeSnapshot, share_tree

__all__ = ["SharedHandle", "SharedTree", "TreeSnapshot", "empty_shared", "share", "share_tree"]
