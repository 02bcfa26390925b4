#!/usr/bin/env python
"""CUDA copy throughput of ``dlpack`` against a plain memcpy (torch's ``copy_``), on a GPU.

    python -P bench/bench_cuda.py [--mib 256] [--repeats 20]

Rows: device-to-device ``__dlpack__(copy=True)`` of a CUDA tensor vs ``dst.copy_(src)`` (a
cudaMemcpy of the same bytes); host-to-device ``__dlpack__(dl_device=(2, 0))`` of a pinned CPU
tensor vs ``dst.copy_(pinned)``; device-to-host ``dl_device=(1, 0)`` vs ``pinned.copy_(src)``.
Then ``dlpack.copyto`` into preallocated arrays against ``dst.copy_(src)``: device to device,
pinned host to device, a column slice (one 2-D pitched copy), a 3-D slice (one 3-D pitched copy)
and a transpose (staged through the host: there is no device kernel yet).
Goals: D2D and pinned H2D at >= 0.9x of the plain copy. Exits 0 with a message when no
GPU is present.

Each timed call ends with a device synchronisation, so it is timed until the copy is done; timeit
times the calls (``bench/_bench_timing.py``: ``Timer.autorange`` picks the loop count for repeats
of about 50 ms, ``Timer.repeat`` times them, ours and the plain copy in turns).
"""

import argparse
import os
import runpy
import sys
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
interleaved = runpy.run_path(os.path.join(HERE, "_bench_timing.py"))["interleaved"]
SECONDS_PER_REPEAT = 0.05


def best_times(ours, plain, sync, repeats: int) -> tuple[float, float]:
    """Best seconds per call of ``ours`` and ``plain``, each call followed by ``sync()``."""

    def synced(fn):
        return timeit.Timer(lambda: (fn(), sync()))

    sync()  # the setup's work is not the first call's
    _, per_call = interleaved(
        {"ours": synced(ours), "plain": synced(plain)}, repeats, SECONDS_PER_REPEAT
    )
    return min(per_call["ours"]), min(per_call["plain"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing to measure")
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure")
        return 0
    from dlpack import asdlpack, copyto

    n = args.mib * 2**20 // 4
    sync = torch.cuda.synchronize
    src = torch.rand(n, device="cuda")
    dst = torch.empty_like(src)
    pinned = torch.rand(n).pin_memory()
    host_dst = torch.empty(n).pin_memory()
    keep = []

    def ours_d2d():
        keep.append(torch.from_dlpack(asdlpack(src).__dlpack__(max_version=(1, 3), copy=True)))
        keep.clear()

    def ours_h2d():
        obj = asdlpack(pinned)
        keep.append(torch.from_dlpack(obj.__dlpack__(max_version=(1, 3), dl_device=(2, 0))))
        keep.clear()

    def ours_d2h():
        obj = asdlpack(src)
        keep.append(torch.from_dlpack(obj.__dlpack__(max_version=(1, 3), dl_device=(1, 0))))
        keep.clear()

    rows = [
        ("device to device", ours_d2d, lambda: dst.copy_(src)),
        ("host (pinned) to device", ours_h2d, lambda: dst.copy_(pinned, non_blocking=True)),
        ("device to host", ours_d2h, lambda: host_dst.copy_(src, non_blocking=True)),
    ]
    side = int((n // 2) ** 0.5)
    square = torch.rand(side, side * 2, device="cuda")
    column_dst = torch.empty(side, side, device="cuda")
    cube = torch.rand(64, side // 4, side // 2, device="cuda")
    cube_dst = torch.empty(64, side // 8, side // 4, device="cuda")
    transposed_dst = torch.empty(side * 2, side, device="cuda")
    rows += [
        ("copyto device to device", lambda: copyto(dst, src), lambda: dst.copy_(src)),
        ("copyto pinned host to device", lambda: copyto(dst, pinned), lambda: dst.copy_(pinned)),
        (
            "copyto column slice x[:, :k] (2-D pitched)",
            lambda: copyto(column_dst, square[:, :side]),
            lambda: column_dst.copy_(square[:, :side]),
        ),
        (
            "copyto 3-D slice (3-D pitched)",
            lambda: copyto(cube_dst, cube[:, : side // 8, : side // 4]),
            lambda: cube_dst.copy_(cube[:, : side // 8, : side // 4]),
        ),
        (
            "copyto transpose (staged via host)",
            lambda: copyto(transposed_dst, square.T),
            lambda: transposed_dst.copy_(square.T),
        ),
    ]
    gb = n * 4 / 1e9
    print(f"{torch.cuda.get_device_name()}, {args.mib} MiB float32, best of {args.repeats}\n")
    print("| copy | dlpack | plain copy_ | plain / ours |\n|---|---:|---:|---:|")
    for name, ours, plain in rows:
        gb = plain().numel() * 4 / 1e9 if name.startswith("copyto") else n * 4 / 1e9
        t_ours, t_plain = best_times(ours, plain, sync, args.repeats)
        print(
            f"| {name} | {t_ours * 1e3:.2f} ms ({gb / t_ours:.1f} GB/s) | "
            f"{t_plain * 1e3:.2f} ms ({gb / t_plain:.1f} GB/s) | {t_plain / t_ours:.2f}x |"
        )
    print("\nours includes allocating the destination (cuMemAlloc) and, for device to host, a")
    print("pageable 64-byte aligned host buffer; plain copy_ writes into preallocated memory.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
