"""minitensor.distributed over MPI: every collective against numpy on 2 and 4 ranks through the launcher and on
2 ranks under mpiexec (tests/distributed_scripts/collectives_checks.py, one result line per rank), a rank that
raises or skips a collective (the others get an error, no hang), and in this process a one-rank group for the
arguments each call refuses, with torch's errors. Every launch has a hard timeout."""
import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import minitensor as mt
import minitensor.distributed as dist
from helpers import run_python

pytest.importorskip("mpi4py")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "distributed_scripts")
CHECKS = os.path.join(SCRIPTS, "collectives_checks.py")
LAUNCHER = [sys.executable, "-m", "minitensor.distributed.run"]
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
# the tests of several ranks start them with MPICH's mpiexec (the mpich wheel, beside the interpreter, as the test
# extra installs it); an mpi4py over another MPI (a GPU image's Open MPI) runs only the one-rank tests here
several_ranks = pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="MPICH's mpiexec is not beside the interpreter")


def launch(command, timeout=120):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("MINITENSOR_BACKEND", mt.cuda.backend())
    began = time.monotonic()
    done = subprocess.run([*map(str, command)], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - began


def results(done):
    """Each rank's RESULT line; a line another rank's output cut into is left out (the rank then is missing)."""
    found = []
    for line in done.stdout.splitlines():
        try:
            found.append(json.loads(line[7:]) if line.startswith("RESULT ") else None)
        except json.JSONDecodeError:
            pass
    return sorted(filter(None, found), key=lambda result: int(result["rank"]))


def assert_all_passed(done, size):
    found = results(done)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["rank"] for r in found] == list(range(size)), done.stdout[-3000:] + done.stderr[-3000:]
    for r in found:
        assert r["failures"] == [] and r["size"] == size and r["backend"] == "mpi"
        assert r["checks"] > 300


@pytest.mark.parametrize("nproc", [2, 4])
@several_ranks
def test_every_collective_through_the_launcher(tmp_path, nproc):
    """The launcher starts each rank under `mpiexec -n 1` (mpi4py is installed), so MPICH can connect them."""
    done, _ = launch([*LAUNCHER, "--nproc-per-node", nproc, CHECKS, "checks", "mpi",
                      tmp_path / "store"])
    assert_all_passed(done, nproc)


@pytest.mark.parametrize("backend, nproc", [("mpi", 2), ("mpi", 4), ("mpi-staged", 2)])
@several_ranks
def test_every_collective_under_mpiexec(tmp_path, backend, nproc):
    """mpi-staged: the engine's host staging, which it uses on a GPU (its driver runs no host work on streams)."""
    done, _ = launch([MPIEXEC, "-n", nproc, sys.executable, CHECKS, "checks", backend, tmp_path / "store"])
    assert_all_passed(done, nproc)


@several_ranks
def test_ranks_no_process_manager_started_are_refused_with_how_to_start_them(tmp_path):
    done, took = launch([*LAUNCHER, "--nproc-per-node", 2, "--mpiexec", "never", CHECKS, "checks", "mpi",
                         tmp_path / "store"])
    assert done.returncode == 0
    failures = [f for r in results(done) for f in r["failures"]]
    assert len(failures) == 2 and all("start them with `mpiexec -n N python script.py`" in f for f in failures)


@several_ranks
def test_a_rank_that_raises_through_the_launcher_stops_the_others():
    done, took = launch([*LAUNCHER, "--nproc-per-node", 2, CHECKS, "raises"], timeout=60)
    assert done.returncode == 1 and took < 30
    assert "rank      : 1 (local_rank: 1)" in done.stderr and "rank 1 fails on purpose" in done.stderr


@several_ranks
def test_a_rank_that_raises_under_mpiexec_makes_the_others_time_out():
    """mpiexec leaves rank 0 running: its next collective raises after the group's 2 s timeout."""
    done, took = launch([MPIEXEC, "-n", 2, sys.executable, CHECKS, "raises"], timeout=60)
    assert done.returncode != 0 and took < 30
    (rank0,) = results(done)
    assert rank0["outcome"].startswith("DistBackendError: all_reduce #2 on rank 0 of a group of 2 timed out after "
                                       "2 s") and 1.9 < rank0["seconds"] < 10


@several_ranks
def test_a_rank_that_skips_a_collective_makes_the_others_raise_after_the_timeout():
    done, _ = launch([*LAUNCHER, "--nproc-per-node", 2, CHECKS, "skips"], timeout=60)
    assert done.returncode == 0, done.stderr
    rank0, rank1 = results(done)
    assert rank1 == {"rank": 1, "skipped": True}
    assert "timed out after 2 s: a rank did not take part" in rank0["outcome"] and 1.9 < rank0["seconds"] < 10
    assert "the group cannot be used after an earlier collective failed" in rank0["after"]


# ---------------------------------------------------------------- one rank in this process: the arguments

@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("mpi", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def cuda(values, dtype=None):
    return mt.tensor(values, dtype=dtype, device="cuda")


def test_one_rank_group(one_rank):
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "mpi" and dist.group.WORLD is not None
    t = cuda([1.5, -2.0, 3.0])
    dist.all_reduce(t, op=dist.ReduceOp(dist.ReduceOp.AVG))
    out = mt.empty(3, device="cuda")
    work = dist.all_gather_into_tensor(out, t, async_op=True)
    assert isinstance(work, dist.Work) and work.wait(timeout=datetime.timedelta(seconds=10))
    assert work.is_completed() and work.is_success() and work.exception() is None
    np.testing.assert_array_equal(out.cpu().numpy(), [1.5, -2.0, 3.0])
    assert dist.get_process_group_ranks(dist.group.WORLD) == [0] and dist.get_group_rank(None, 0) == 0


def test_work_waits_up_to_timedelta_max(one_rank):
    """torch's "forever": every wait caps it, none overflows a lock's timeout."""
    t = cuda([1.0, 2.0])
    work = dist.all_reduce(t, async_op=True)
    assert work.wait(timeout=datetime.timedelta.max) and work.is_success()


def error_cases():
    t, c = cuda([1.0, 2.0]), cuda([1 + 1j])
    return [
        (lambda: dist.all_reduce([1, 2]), TypeError, "Expected parameter `tensor` of type minitensor.Tensor"),
        (lambda: dist.all_reduce(mt.ones(2)), ValueError, "Tensors must be CUDA and dense"),
        (lambda: dist.all_reduce(cuda(np.ones((3, 4), np.float32)).t()), ValueError, "Tensors must be contiguous"),
        (lambda: dist.all_reduce(t, op="sum"), TypeError, "op must be a minitensor.distributed.ReduceOp"),
        (lambda: dist.all_reduce(cuda([1, 2]), op=dist.ReduceOp.AVG), RuntimeError,
         "result type Float can't be cast to the desired output type Long"),
        (lambda: dist.all_reduce(cuda([True]), op=dist.ReduceOp.AVG), TypeError,
         "Cannot use ReduceOp.AVG with boolean inputs"),
        (lambda: dist.all_reduce(c, op=dist.ReduceOp.MAX), ValueError,
         "all_reduce does not support RedOpType.MAX on complex tensors"),
        (lambda: dist.reduce_scatter_tensor(c, c, op=dist.ReduceOp.PRODUCT), ValueError,
         "reduce_scatter_tensor does not support RedOpType.PRODUCT on complex tensors"),
        (lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND), RuntimeError,
         "Cannot use ReduceOp.BAND with non-integral dtype"),
        (lambda: dist.broadcast(t, src=5), RuntimeError, "broadcast: invalid root rank: 5"),
        (lambda: dist.broadcast(t), ValueError, "Must specify global_rank or group_rank"),
        (lambda: dist.broadcast(t, src=0, group_src=0), ValueError, "Can't specify both group_rank and global rank"),
        (lambda: dist.reduce(t, dst=-1), RuntimeError, "reduce: invalid root rank: -1"),
        (lambda: dist.send(t, dst=0), ValueError, "Invalid destination rank: destination rank should not be the same"),
        (lambda: dist.recv(t, src=0), ValueError, "Invalid source rank: source rank should not be the same"),
        (lambda: dist.recv(t), ValueError, "receiving from any source is not supported"),
        (lambda: dist.send(t, dst=0, tag=-1), TypeError, "tag must be a non-negative int"),
        (lambda: dist.all_gather_into_tensor(mt.empty(3, device="cuda"), t), ValueError,
         "output tensor size must be equal to world_size times input tensor size"),
        (lambda: dist.all_gather_into_tensor(mt.empty(2, dtype=mt.float64, device="cuda"), t), TypeError,
         "output tensor must have the same type as input tensor"),
        (lambda: dist.reduce_scatter_tensor(mt.empty(1, device="cuda"), t), ValueError,
         "input tensor must be the same size as output size times world size"),
        (lambda: dist.reduce_scatter_tensor(mt.empty(2, dtype=mt.int32, device="cuda"), t), TypeError,
         "input tensor must be the same type as the output tensor."),
        (lambda: dist.all_gather([t, t], t), RuntimeError, "all_gather: invalid output tensor list size 2, must be "
         "world size 1"),
        (lambda: dist.all_gather([mt.empty(3, device="cuda")], t), RuntimeError,
         "all_gather: invalid tensor size at index 0 (expected (2,), got (3,))"),
        (lambda: dist.all_gather([mt.empty(2, dtype=mt.int64, device="cuda")], t), ValueError,
         "Invalid usage of tensors with different dtypes"),
        (lambda: dist.reduce_scatter(t, [t, t]), RuntimeError, "reduce_scatter: invalid input tensor list size 2"),
        (lambda: dist.all_reduce(t, group=5), ValueError, "is not initialized in the world group map"),
        (lambda: dist.init_process_group("mpi"), ValueError, "trying to initialize the default process group twice!"),
        (lambda: dist.new_group([0, 0]), ValueError, "ranks list must not contain duplicate entries, got [0, 0]"),
        (lambda: dist.new_group([0, 3]), ValueError, "the new group's world size should be less or equal"),
        (lambda: dist.new_group([2]), ValueError, "The new group's rank should be within the world_size"),
        (lambda: dist.get_group_rank(None, 3), ValueError, "Global rank 3 is not part of group"),
        (lambda: dist.destroy_process_group(object()), ValueError, "Invalid process group specified"),
    ]


def test_each_refused_argument_raises_torchs_error_and_leaves_the_group_usable(one_rank):
    for call, kind, message in error_cases():
        with pytest.raises(kind) as caught:
            call()
        assert message in str(caught.value), (message, str(caught.value))
    t = cuda([1.0, 2.0])
    dist.all_reduce(t)
    np.testing.assert_array_equal(t.cpu().numpy(), [1.0, 2.0])


def test_mpi_collectives_are_refused_in_a_graph_capture(one_rank):
    t = cuda([1.0, 2.0])
    side = mt.cuda.Stream()
    with mt.cuda.stream(side):
        graph = mt.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="MPI collectives cannot be captured in a CUDA graph"):
            with mt.cuda.graph(graph):
                dist.all_reduce(t)
    dist.all_reduce(t)
    np.testing.assert_array_equal(t.cpu().numpy(), [1.0, 2.0])


def test_a_subgroup_and_every_dtype_on_one_rank(one_rank):
    sub = dist.new_group([0])
    assert dist.get_rank(sub) == 0 and dist.get_world_size(sub) == 1
    for dtype in (mt.bool, mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, mt.uint16, mt.uint32, mt.uint64,
                  mt.float16, mt.float32, mt.float64, mt.complex64, mt.complex128):
        values = np.arange(5) % 2 if dtype is mt.bool else np.arange(5) - 2
        t = cuda(values.astype(dtype.np))
        dist.all_reduce(t, group=sub)
        np.testing.assert_array_equal(t.cpu().numpy(), values.astype(dtype.np))
    dist.destroy_process_group(sub)
    with pytest.raises(ValueError, match="is not initialized in the world group map"):
        dist.all_reduce(cuda([1.0]), group=sub)


def test_without_a_default_group(tmp_path):
    message = "Default process group has not been initialized, please make sure to call init_process_group."
    assert not dist.is_initialized() and dist.is_available()
    for call in (dist.get_rank, dist.get_world_size, dist.get_backend, dist.barrier, dist.new_group,
                 lambda: dist.all_reduce(cuda([1.0])), lambda: dist.broadcast(cuda([1.0]), src=0)):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value) == message
    with pytest.raises(AssertionError, match="Process group cannot be None"):
        dist.destroy_process_group()
    with pytest.raises(AssertionError, match="Unknown backend type foo"):
        dist.init_process_group("foo")
    with pytest.raises(RuntimeError, match="Distributed package doesn't have GLOO built in"):
        dist.init_process_group("gloo")
    with pytest.raises(ValueError, match="Cannot specify both init_method and store."):
        dist.init_process_group("mpi", init_method="env://", store=dist.FileStore(str(tmp_path / "s"), 1))
    with pytest.raises(ValueError, match="world_size must be positive if using store"):
        dist.init_process_group("mpi", store=dist.FileStore(str(tmp_path / "s"), 1))
    if mt.cuda.backend() == "sim":
        with pytest.raises(RuntimeError, match="backend 'nccl' needs NVIDIA GPUs"):
            dist.init_process_group("nccl")
    assert not dist.is_initialized()


def test_reduce_op_prints_and_compares_as_torchs():
    op = dist.ReduceOp
    assert str(op.SUM) == f"{op.MAX!s}".replace("MAX", "SUM") == "RedOpType.SUM" and int(op.AVG) == 1
    assert op(op.MIN) == op.MIN and op.MIN == op(op.MIN) and op() == op.SUM and op(op.MAX) != op.MIN
    assert hash(op(op.PRODUCT)) == hash(op.PRODUCT) and op.RedOpType.BXOR == op.BXOR
    with pytest.raises(TypeError):
        op("sum")
    torch = pytest.importorskip("torch")
    theirs = torch.distributed.ReduceOp
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        assert int(getattr(op, name)) == int(getattr(theirs, name)) and str(getattr(op, name)) == str(
            getattr(theirs, name))


def test_errors_match_torchs_without_a_group():
    torch = pytest.importorskip("torch")
    for name in ("get_rank", "get_world_size", "get_backend"):
        with pytest.raises(ValueError) as ours:
            getattr(dist, name)()
        with pytest.raises(ValueError) as theirs:
            getattr(torch.distributed, name)()
        assert str(ours.value) == str(theirs.value)


def test_importing_loads_neither_mpi4py_nor_nccl_and_mt_distributed_is_the_package():
    out = run_python("""
        import sys
        import minitensor as mt
        import minitensor.distributed as dist
        assert mt.distributed is dist
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("mpi4py", "nccl")))
    """)
    assert out.strip() == "[]"
