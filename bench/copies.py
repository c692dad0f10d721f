"""Host <-> device copy benchmarks, 256 MiB (4 MiB on the simulated device), each against its bound:

- from and to pinned memory: minitensor's `copy_(non_blocking=True)` against a raw `cuMemcpyHtoDAsync` /
  `cuMemcpyDtoHAsync` of the same buffers (the link's speed);
- from and to pageable memory: `.cuda()` / `.cpu()` of a pageable tensor, minitensor (staged through pinned
  chunks) against torch, and a raw driver copy from the same pageable buffer (the driver's own staging).

Each figure is the best wall time of a few runs of copy + stream synchronize, after one untimed run, the
contenders taking turns.
The cached pinned allocation (`empty(1 MiB, pin_memory=True)` + del, `pinned_empty_del` below) is a host-latency
case in cases.py.
"""
from functools import partial

import numpy as np

from bench.report import add_times
from bench.timing import best_s_in_turns

KIND = "copies"
GPU_BYTES = 256 << 20
SIM_BYTES = 4 << 20
REPEATS = 5

CASES = {
    "copy.h2d_pinned": "host to device, pinned",
    "copy.d2h_pinned": "device to host, pinned",
    "copy.h2d_pageable": "host to device, pageable (.cuda())",
    "copy.d2h_pageable": "device to host, pageable (.cpu())",
}
COLUMNS = ("minitensor", "raw", "torch")


def pinned_empty_del(m, x):
    """The host-latency case: a cached pinned allocation and its free (minitensor and torch spell it the same)."""
    return partial(m.empty, 1 << 20, dtype=m.uint8, pin_memory=True)


def cupy_pinned_empty_del(cp, x):
    return partial(cp.cuda.alloc_pinned_memory, 1 << 20)  # from CuPy's pinned memory pool


def run(fws, sim, selected, new_row):
    """One row per selected case: seconds per copy for minitensor, the raw driver copy and torch."""
    modules = {fw.name: fw.module for fw in fws}
    nbytes = SIM_BYTES if sim else GPU_BYTES
    rows = []
    for key, name in CASES.items():
        if not selected(key, name):
            continue
        row = new_row(key, KIND, name, (nbytes,))
        add_times(row, *best_s_in_turns(dict(_contenders(key, modules, nbytes)), REPEATS))
        row["bytes"] = nbytes
        row["gbps"] = {label: nbytes / t / 1e9 for label, t in row["time"].items()}
        mt = row["time"].get("minitensor")
        row["ratios"] = {f"mt_vs_{label}": t / mt for label, t in row["time"].items() if mt and label != "minitensor"}
        rows.append(row)
    return rows


def _contenders(key, modules, nbytes):
    """(label, setup) pairs; setup() makes the buffers and returns (timed callable, synchronize, None)."""
    mt, torch = modules["minitensor"], modules.get("torch")
    pinned = key.endswith("pinned")
    to_device = key.startswith("copy.h2d")
    pairs = [("minitensor", lambda: _mt_case(mt, nbytes, pinned, to_device)),
             ("raw", lambda: _raw_case(mt, nbytes, pinned, to_device))]
    if torch is not None and not pinned:
        pairs.append(("torch", lambda: _torch_case(torch, nbytes, to_device)))
    return pairs


def _host(mt, nbytes, pinned):
    host = mt.from_numpy(np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8))
    return host.pin_memory() if pinned else host


def _mt_case(mt, nbytes, pinned, to_device):
    host, device = _host(mt, nbytes, pinned), mt.empty(nbytes, dtype=mt.uint8, device="cuda")
    stream = mt.cuda.current_stream()
    if pinned:
        fn = (lambda: device.copy_(host, non_blocking=True)) if to_device else (
            lambda: host.copy_(device, non_blocking=True))
    else:
        fn = host.cuda if to_device else device.cpu
    return fn, stream.synchronize, None


def _raw_case(mt, nbytes, pinned, to_device):
    """The driver's copy of the same kind of buffers on the same stream, without minitensor in between."""
    host, device = _host(mt, nbytes, pinned), mt.empty(nbytes, dtype=mt.uint8, device="cuda")
    stream = mt.cuda.current_stream()
    h, d, s = host.data_ptr(), device.data_ptr(), stream.cuda_stream
    if mt.cuda.backend() == "nvidia":
        from cuda.bindings import driver as cu

        def checked(result):
            if result[0] != cu.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"raw copy failed: {result[0]}")
        fn = (lambda: checked(cu.cuMemcpyHtoDAsync(d, h, nbytes, s))) if to_device else (
            lambda: checked(cu.cuMemcpyDtoHAsync(h, d, nbytes, s)))
    else:
        driver = mt.backends.active_driver()
        fn = (lambda: driver.memcpy_async(d, h, nbytes, s)) if to_device else (
            lambda: driver.memcpy_async(h, d, nbytes, s))

    def run():  # keep the tensors alive with the callable
        return fn(), host, device
    return run, stream.synchronize, None


def _torch_case(torch, nbytes, to_device):
    host = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    if to_device:
        return host.cuda, torch.cuda.synchronize, None
    device = host.cuda()
    return device.cpu, torch.cuda.synchronize, None


def section(rows, verdicts):
    from bench.report import bandwidth_section
    return bandwidth_section("copies", COLUMNS, ("mt_vs_raw", "mt_vs_torch"), rows, verdicts)
