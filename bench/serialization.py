"""Save and load benchmarks: a 1 GiB cuda tensor and a 1 GiB CPU tensor through mt.save / mt.load and
torch.save / torch.load, and, in the same run, the raw speed of writing and reading a file of that size,
which bounds them all.

Files go to a temporary folder under $MINITENSOR_BENCH_DIR (default: the system's temporary folder), which
should be on the machine's local disk. Nothing is flushed to the platter (no fsync), by neither framework
nor the raw measure, so all of them run against the page cache as a user's save and load do. Every timed
write makes a new file: the previous run's file is deleted untimed first, since dropping its unwritten pages
(torch truncates it, minitensor's atomic rename replaces it) would otherwise be timed with the save.
"""
import os
import shutil
import tempfile

import numpy as np

from bench.report import add_times, bandwidth_section
from bench.timing import best_s_in_turns

KIND = "io"
GPU_BYTES = 2**30
SIM_BYTES = {"cuda": 2**20, "cpu": 2**24}  # the simulated device copies in host memory; keep CI short

CASES = {
    "io.disk_write": "raw file write (the limit)",
    "io.disk_read": "raw file read (the limit)",
    "io.save_cuda": "save a cuda float32 tensor",
    "io.load_cuda": "load it to cuda",
    "io.save_cpu": "save a CPU float32 tensor",
    "io.load_cpu": "load it on the CPU",
}
COLUMNS = ("minitensor", "torch", "torch_mmap", "disk")


def run(fws, sim, repeats, selected, new_row):
    """One row per selected case, each framework's best time of `repeats` (after one untimed run)."""
    modules = {fw.name: fw.module for fw in fws}
    folder = tempfile.mkdtemp(prefix="minitensor-bench-", dir=os.environ.get("MINITENSOR_BENCH_DIR"))
    try:
        rows = []
        for key, name in CASES.items():
            if not selected(key, name):
                continue
            device = "cpu" if key.endswith("cpu") or key.startswith("io.disk") else "cuda"
            nbytes = SIM_BYTES[device] if sim else GPU_BYTES
            row = new_row(key, KIND, name, (nbytes // 4,))
            add_times(row, *best_s_in_turns(dict(_contenders(key, modules, os.path.join(folder, key), nbytes)),
                                            repeats))
            row["bytes"] = nbytes
            row["gbps"] = {label: nbytes / t / 1e9 for label, t in row["time"].items()}
            rows.append(row)
        return rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _contenders(key, modules, path, nbytes):
    """(label, setup) pairs; setup() prepares inputs and files and returns (timed callable, None, the untimed
    step before each timed run or None)."""
    mt, torch = modules["minitensor"], modules.get("torch")
    n = nbytes // 4
    if key == "io.disk_write":
        return [("disk", lambda: _raw_write(path, nbytes))]
    if key == "io.disk_read":
        return [("disk", lambda: _raw_read(path, nbytes))]
    device = "cpu" if key.endswith("cpu") else "cuda"
    pairs = [("minitensor", lambda: _mt_case(mt, key, device, path + ".mt.pt", n))]
    if torch is not None:
        pairs.append(("torch", lambda: _torch_case(torch, key, device, path + ".torch.pt", n, mmap=False)))
        if key == "io.load_cuda":
            pairs.append(("torch_mmap", lambda: _torch_case(torch, key, device, path + ".torch.pt", n, mmap=True)))
    return pairs


def _raw_write(path, nbytes):
    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)

    def write():
        with open(path, "wb") as f:
            f.write(memoryview(data))
    return write, None, _deleter(path)


def _raw_read(path, nbytes):
    _raw_write(path, nbytes)[0]()
    buffer = np.empty(nbytes, np.uint8)

    def read():
        with open(path, "rb") as f:
            f.readinto(memoryview(buffer))
    return read, None, None


def _deleter(path):
    """The untimed step before each timed write: the file it makes is new."""
    def delete():
        if os.path.exists(path):
            os.unlink(path)
    return delete


def _mt_case(mt, key, device, path, n):
    if key.startswith("io.save"):
        x = mt.rand(n, device=device)
        return (lambda: mt.save(x, path)), None, _deleter(path)
    mt.save(mt.rand(n, device=device), path)

    def load():
        mt.load(path, map_location=device)
        if device == "cuda":
            mt.cuda.synchronize()
    return load, None, None


def _torch_case(torch, key, device, path, n, mmap):
    if key.startswith("io.save"):
        x = torch.rand(n, device=device)
        return (lambda: torch.save(x, path)), None, _deleter(path)
    torch.save(torch.rand(n, device=device), path)

    def load():
        if mmap:  # the file's storages are tagged cuda:0: mapped, then copied to the GPU
            torch.load(path, weights_only=True, mmap=True)
        else:
            torch.load(path, weights_only=True, map_location=device)
        if device == "cuda":
            torch.cuda.synchronize()
    return load, None, None


def section(rows, verdicts):
    """The io table: GB/s for each contender, and the speed ratios the targets judge."""
    return bandwidth_section("save / load", COLUMNS, ("mt_vs_torch", "mt_vs_torch_mmap"), rows, verdicts)
