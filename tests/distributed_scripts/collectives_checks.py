"""Run in every rank by tests/test_distributed_collectives.py (through the launcher or mpiexec): checks each
collective against numpy on this rank, for every dtype and reduction, async ops, stream ordering, a subgroup
and destroy-then-init, and prints one line: RESULT {json} with the failures it found.

Every rank makes every rank's input from (rank, check number), so each can compute the expected result
alone. Values are small integers where a reduction would otherwise round differently in MPI's order.

    collectives_checks.py checks BACKEND STORE_PATH  the full set; BACKEND is mpi, nccl or auto, or
                                                     mpi-staged: MPI through host copies, as on a GPU
    collectives_checks.py raises                     rank 1 raises after the first collective (MPI)
    collectives_checks.py skips                      rank 1 skips the second collective: the others time out
"""
import datetime
import json
import os
import sys
import time
import traceback
import warnings

import numpy as np

import minitensor as mt
import minitensor.distributed as dist
from minitensor.base import dtypes
from minitensor.distributed import engine_mpi, mpi_runners

RedOp = dist.ReduceOp
DTYPES = [mt.bool, mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, mt.uint16, mt.uint32, mt.uint64, mt.float16,
          mt.bfloat16, mt.float32, mt.float64, mt.complex64, mt.complex128]
SIZE = 7  # odd, small: every check moves a few elements
# NCCL, and MPI on the simulator, only order the current stream after an op; MPI on a GPU stages on the host
HOST_DOES_NOT_WAIT = sys.argv[2:3] == ["nccl"] or (sys.argv[2:3] == ["mpi"] and mt.cuda.backend() == "sim")


def ops_for(dtype, backend):
    """The reductions `backend` takes for `dtype` (NCCL: no 16-bit integers, no bitwise ops)."""
    if dtype.is_complex:
        return [RedOp.SUM, RedOp.AVG]
    if dtype.is_floating_point:
        return [RedOp.SUM, RedOp.PRODUCT, RedOp.MIN, RedOp.MAX, RedOp.AVG]
    if backend == "nccl":
        return [] if dtype in (mt.int16, mt.uint16) else [RedOp.SUM, RedOp.PRODUCT, RedOp.MIN, RedOp.MAX]
    return [RedOp.SUM, RedOp.PRODUCT, RedOp.MIN, RedOp.MAX, RedOp.BAND, RedOp.BOR, RedOp.BXOR]


def values(dtype, rank, key, n=SIZE):
    """Rank `rank`'s input for check `key`, as a numpy array of the dtype's values (float32 for bfloat16)."""
    rng = np.random.default_rng([rank, key])
    if dtype is mt.bool:
        return rng.random(n) < 0.5
    if dtype in (mt.float32, mt.float64):
        return rng.standard_normal(n).astype(dtype.np)
    if dtype.is_complex:
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype.np)
    low = 0 if dtype in (mt.uint8, mt.uint16, mt.uint32, mt.uint64) else -3
    small = rng.integers(low, 4, n)
    return small.astype(np.float32) if dtype is mt.bfloat16 else small.astype(dtype.np)


def to_device(array, dtype):
    if dtype is mt.bfloat16:
        return mt.tensor(dtypes.f32_to_bf16_bits(array), device="cuda").view(mt.bfloat16)
    return mt.tensor(array, device="cuda")


def to_host(t):
    if t.dtype is mt.bfloat16:
        return dtypes.bf16_bits_to_f32(t.view(mt.uint16).cpu().numpy())
    return t.cpu().numpy()


def reduced(arrays, op, dtype):
    stack = np.stack(arrays)
    if dtype is mt.bool:
        logic = {RedOp.SUM: np.any, RedOp.MAX: np.any, RedOp.BOR: np.any, RedOp.PRODUCT: np.all,
                 RedOp.MIN: np.all, RedOp.BAND: np.all}
        return np.logical_xor.reduce(stack) if op == RedOp.BXOR else logic[op](stack, axis=0)
    ufuncs = {RedOp.SUM: np.add, RedOp.PRODUCT: np.multiply, RedOp.MIN: np.minimum, RedOp.MAX: np.maximum,
              RedOp.BAND: np.bitwise_and, RedOp.BOR: np.bitwise_or, RedOp.BXOR: np.bitwise_xor}
    if op == RedOp.AVG:
        return (stack.sum(axis=0) / len(arrays)).astype(stack.dtype)
    return ufuncs[op].reduce(stack, axis=0).astype(stack.dtype)


class Checks:
    def __init__(self, rank):
        self.rank, self.count, self.failures = rank, 0, []

    def run(self, label, fn, *args):
        self.count += 1
        try:
            fn(*args)
        except Exception as e:
            self.failures.append(f"{label}: {type(e).__name__}: {e}"[:400])

    def equal(self, label, got, want, dtype):
        self.count += 1
        exact = not (dtype.is_complex or dtype in (mt.float32, mt.float64))
        ok = np.array_equal(got, want) if exact else np.allclose(got, want, rtol=1e-5, atol=1e-5)
        if not ok:
            self.failures.append(f"{label}: got {got!r}, want {want!r}"[:400])


def check_reductions(checks, rank, size):
    key = 0
    for dtype in DTYPES:
        for op in ops_for(dtype, dist.get_backend()):
            key += 1
            inputs = [values(dtype, r, key) for r in range(size)]
            want = reduced(inputs, op, dtype)
            t = to_device(inputs[rank], dtype)
            dist.all_reduce(t, op=op)
            checks.equal(f"all_reduce {dtype} {op}", to_host(t), want, dtype)
            dst = (key % size)
            t = to_device(inputs[rank], dtype)
            dist.reduce(t, dst=dst, op=op)
            checks.equal(f"reduce {dtype} {op} dst={dst}", to_host(t), want if rank == dst else inputs[rank], dtype)
            chunks = [values(dtype, r, 1000 + key, SIZE * size) for r in range(size)]
            out = to_device(np.zeros(SIZE, chunks[0].dtype), dtype)
            dist.reduce_scatter_tensor(out, to_device(chunks[rank], dtype), op=op)
            want_chunk = reduced([c[rank * SIZE:(rank + 1) * SIZE] for c in chunks], op, dtype)
            checks.equal(f"reduce_scatter_tensor {dtype} {op}", to_host(out), want_chunk, dtype)


def check_movement(checks, rank, size):
    for key, dtype in enumerate(DTYPES, 5000):
        inputs = [values(dtype, r, key) for r in range(size)]
        t = to_device(inputs[rank], dtype)
        dist.broadcast(t, src=size - 1)
        checks.equal(f"broadcast {dtype}", to_host(t), inputs[size - 1], dtype)
        out = to_device(np.zeros(SIZE * size, inputs[0].dtype), dtype).view(size, SIZE)
        dist.all_gather_into_tensor(out, to_device(inputs[rank], dtype))
        checks.equal(f"all_gather_into_tensor {dtype}", to_host(out), np.stack(inputs), dtype)
        outs = [to_device(np.zeros(SIZE, inputs[0].dtype), dtype) for _ in range(size)]
        dist.all_gather(outs, to_device(inputs[rank], dtype))
        checks.equal(f"all_gather {dtype}", np.stack([to_host(o) for o in outs]), np.stack(inputs), dtype)
        op = ops_for(dtype, dist.get_backend())[:1]
        if not op:
            continue
        op = op[0]
        parts = [values(dtype, r, key + 100, SIZE * size).reshape(size, SIZE) for r in range(size)]
        out = to_device(np.zeros(SIZE, inputs[0].dtype), dtype)
        dist.reduce_scatter(out, [to_device(p, dtype) for p in parts[rank]], op=op)
        checks.equal(f"reduce_scatter {dtype}", to_host(out), reduced([p[rank] for p in parts], op, dtype), dtype)


def check_point_to_point(checks, rank, size):
    """MPI: a ring of isend/irecv of 1 MiB (past MPI's eager limit: both must be posted before either is waited
    for). Both: isend/irecv and send/recv between pairs of ranks, in the order NCCL needs (one sends first)."""
    n = 1 << 18
    if dist.get_backend() == "mpi" and size > 1:
        inbox = mt.empty(n, device="cuda")
        sent = dist.isend(mt.tensor(np.arange(n, dtype=np.float32) + rank, device="cuda"), dst=(rank + 1) % size)
        received = dist.irecv(inbox, src=(rank - 1) % size)
        received.wait()
        sent.wait()
        checks.equal("isend/irecv ring", to_host(inbox), np.arange(n, dtype=np.float32) + (rank - 1) % size,
                     mt.float32)
        checks.equal("isend/irecv completed", [sent.is_completed(), received.is_completed()], [True, True],
                     mt.bool)
    peer = rank ^ 1
    if peer < size:
        inbox = mt.empty(n, device="cuda")
        outgoing = mt.tensor(np.arange(n, dtype=np.float32) * (rank + 1), device="cuda")
        if rank % 2 == 0:  # NCCL runs a group's async ops one after the other: a send must meet a recv
            works = [dist.isend(outgoing, dst=peer), dist.irecv(inbox, src=peer)]
        else:
            works = [dist.irecv(inbox, src=peer), dist.isend(outgoing, dst=peer)]
        for work in works:
            work.wait()
        checks.equal("isend/irecv pair", to_host(inbox), np.arange(n, dtype=np.float32) * (peer + 1), mt.float32)
        for dtype in (mt.int64, mt.bfloat16, mt.complex64, mt.bool):
            box = to_device(values(dtype, peer, 7000), dtype)
            if rank % 2 == 0:
                dist.send(to_device(values(dtype, rank, 7000), dtype), dst=peer, tag=3)
                source = dist.recv(box, src=peer, tag=3)
            else:
                source = dist.recv(box, src=peer, tag=3)
                dist.send(to_device(values(dtype, rank, 7000), dtype), dst=peer, tag=3)
            checks.equal(f"send/recv {dtype}", to_host(box), values(dtype, peer, 7000), dtype)
            checks.equal(f"recv's source {dtype}", source, peer, mt.int64)


def check_async_and_streams(checks, rank, size):
    expected = sum(values(mt.float32, r, 9000) for r in range(size))
    # async: the op's tensor is kept alive by the Work; wait() orders the current stream after it
    t = to_device(values(mt.float32, rank, 9000), mt.float32)
    work = dist.all_reduce(t, async_op=True)
    checks.equal("async is_success before wait is a bool", type(work.is_success()), bool, mt.bool)
    checks.equal("async wait", work.wait(), True, mt.bool)
    checks.equal("async all_reduce", to_host(t), expected, mt.float32)
    outs = [mt.empty(SIZE, device="cuda") for _ in range(size)]
    work = dist.all_gather(outs, to_device(values(mt.float32, rank, 9001), mt.float32), async_op=True)
    work.wait()
    checks.equal("async all_gather", np.stack([to_host(o) for o in outs]),
                 np.stack([values(mt.float32, r, 9001) for r in range(size)]), mt.float32)
    # the input is written on a side stream behind a sleep; the current stream waits for it, then all_reduce
    # must see the written values, without the host waiting for the sleep
    side = mt.cuda.Stream()
    x = mt.empty(SIZE, device="cuda")
    written = mt.tensor(values(mt.float32, rank, 9000)).pin_memory()
    with mt.cuda.stream(side):
        mt.cuda.sleep(400)
        x.copy_(written, non_blocking=True)
    mt.cuda.current_stream().wait_stream(side)
    began = time.monotonic()
    dist.all_reduce(x)
    host_s = time.monotonic() - began
    checks.equal("all_reduce after a side stream's write", to_host(x), expected, mt.float32)
    if HOST_DOES_NOT_WAIT:
        checks.equal(f"all_reduce does not block the host ({host_s:.3f} s)", host_s < 0.3, True, mt.bool)
    # an op issued on a side stream, read on the default stream after waiting for it
    y = to_device(values(mt.float32, rank, 9000), mt.float32)
    with mt.cuda.stream(side):
        dist.all_reduce(y)
    mt.cuda.current_stream().wait_stream(side)
    checks.equal("all_reduce on a side stream", to_host(y), expected, mt.float32)
    dist.barrier()
    checks.equal("barrier then async barrier", dist.barrier(async_op=True).wait(), True, mt.bool)


def check_subgroup(checks, rank, size):
    members = {1: [0], 2: [1], 4: [1, 3]}[size]
    sub = dist.new_group(members)
    t = to_device(values(mt.int32, rank, 9500), mt.int32)
    if rank in members:
        dist.all_reduce(t, group=sub)
        want = sum(values(mt.int32, r, 9500) for r in members).astype(np.int32)
        checks.equal("subgroup all_reduce", to_host(t), want, mt.int32)
        checks.equal("subgroup rank", dist.get_rank(sub), members.index(rank), mt.int64)
        b = to_device(values(mt.int64, rank, 9501), mt.int64)
        dist.broadcast(b, src=members[-1], group=sub)
        checks.equal("subgroup broadcast from a world rank", to_host(b), values(mt.int64, members[-1], 9501),
                     mt.int64)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            checks.equal("non-member all_reduce returns None", dist.all_reduce(t, group=sub), None, mt.bool)
        checks.equal("non-member warning", "does not belong to the given group" in str(caught[0].message), True,
                     mt.bool)
        checks.equal("non-member rank", dist.get_rank(sub), -1, mt.int64)
    checks.equal("subgroup ranks", dist.get_process_group_ranks(sub), members, mt.int64)
    dist.destroy_process_group(sub)


def check_reinit(checks, rank, size, store_path):
    backend = dist.get_backend()
    dist.destroy_process_group()
    checks.equal("destroyed", dist.is_initialized(), False, mt.bool)
    store = dist.FileStore(store_path, size)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    t = to_device(values(mt.float64, rank, 9900), mt.float64)
    dist.all_reduce(t, op=RedOp.AVG)
    checks.equal("all_reduce after init again", to_host(t), sum(values(mt.float64, r, 9900) for r in range(size)) /
                 size, mt.float64)


def checks_mode(backend, store_path):
    if backend == "mpi-staged":  # the engine's choice on a GPU, whose driver runs no host work on streams
        engine_mpi.StreamRunner = lambda engine, driver: mpi_runners.HostRunner(engine)
        backend = "mpi"
    dist.init_process_group(None if backend == "auto" else backend, timeout=datetime.timedelta(seconds=60))
    rank, size, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    checks = Checks(rank)
    for family in (check_reductions, check_movement, check_point_to_point, check_async_and_streams,
                   check_subgroup):
        checks.run(family.__name__, family, checks, rank, size)
    checks.run("reinit", check_reinit, checks, rank, size, store_path)
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "size": size, "backend": backend, "checks": checks.count, "failures": checks.failures}


def failure_mode(mode):
    """`raises`: rank 1 raises after the first collective; `skips`: rank 1 skips the second one. The others
    report how their second collective ended and how long it took."""
    dist.init_process_group("mpi", timeout=datetime.timedelta(seconds=2))
    rank = dist.get_rank()
    t = mt.tensor(np.ones(SIZE, np.float32), device="cuda")
    dist.all_reduce(t)
    t.cpu()
    if rank == 1:
        if mode == "raises":
            raise RuntimeError("rank 1 fails on purpose")
        time.sleep(4)  # past the others' timeout: they must not wait for this rank's exit
        return {"rank": rank, "skipped": True}
    began = time.monotonic()
    try:
        dist.all_reduce(t)
        t.cpu()
        outcome = "no error"
    except dist.DistBackendError as e:
        outcome = f"DistBackendError: {e}"
    took = time.monotonic() - began
    try:
        dist.all_reduce(t)
        after = "no error"
    except dist.DistBackendError as e:
        after = f"DistBackendError: {e}"
    return {"rank": rank, "outcome": outcome, "seconds": took, "after": after}


def main():
    mode = sys.argv[1]
    try:
        result = checks_mode(*sys.argv[2:4]) if mode == "checks" else failure_mode(mode)
    except Exception:
        if mode != "checks":
            raise
        result = {"rank": os.environ.get("RANK"), "failures": [traceback.format_exc()[-1500:]]}
    sys.stdout.flush()
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())  # one write: ranks sharing a pipe don't interleave


if __name__ == "__main__":
    main()
