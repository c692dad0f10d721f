"""minitensor.distributed over NCCL (nccl4py).

Everywhere: the engine's mapping onto nccl4py's binding layer, checked against a recording stand-in (the
pointers, counts, NCCL types and ops, and that the stream named is the current one or the group's side
stream, never the legacy stream by default), its init timeout and its error handling.
On a GPU with nccl4py: every collective, every dtype, async ops and stream ordering against numpy through the
launcher with one rank (NCCL refuses two ranks on one GPU), and with two ranks where there are two GPUs
(tests/distributed_scripts/collectives_checks.py); in this process, NCCL's refusals, a collective captured in a
CUDA graph, and the host overhead of a 4 KiB all_reduce against nccl4py called directly.
"""
import datetime
import enum
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import minitensor as mt
import minitensor.distributed as dist
from minitensor.distributed import engine_nccl
from minitensor.distributed.reduce_op import RedOpType

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = os.path.join(REPO, "tests", "distributed_scripts", "collectives_checks.py")
ON_GPU = mt.cuda.backend() == "nvidia"
needs_nccl = pytest.mark.skipif(not (ON_GPU and dist.is_nccl_available()), reason="needs a GPU and nccl4py")


class Recorder:
    """nccl.bindings.nccl's names the engine uses, recording each call; NCCL's type and op numbers."""

    DataType = enum.IntEnum("DataType", {"Int8": 0, "Uint8": 1, "Int32": 2, "Uint32": 3, "Int64": 4, "Uint64": 5,
                                         "Float16": 6, "Float32": 7, "Float64": 8, "Bfloat16": 9})
    RedOp = enum.IntEnum("RedOp", {"Sum": 0, "Prod": 1, "Max": 2, "Min": 3, "Avg": 4})

    def __init__(self):
        self.calls = []
        self.state = 0  # what comm_get_async_error answers

    def Comm(self, ptr):
        return ("comm", ptr)

    def __getattr__(self, name):
        if name not in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv"):
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, *args))

    def comm_get_async_error(self, comm):
        return self.state

    def get_error_string(self, result):
        return f"error {result}"


class FakeCommunicator:
    ptr = 0x1234

    def __init__(self, recorder, states=()):
        self.recorder, self.states, self.ended = recorder, list(states), []

    def get_async_error(self):
        return self.states.pop(0) if self.states else self.recorder.state

    def get_last_error(self):
        return "last error"

    def finalize(self):
        self.ended.append("finalize")

    def destroy(self):
        self.ended.append("destroy")

    def abort(self):
        self.ended.append("abort")


@pytest.fixture
def recorded():
    recorder = Recorder()
    return recorder, engine_nccl.NcclEngine(FakeCommunicator(recorder), recorder, 1, 2, 0, 5.0)


def ended(engine):
    communicator = engine._communicator
    engine.destroy()
    return communicator.ended


def cuda(values, dtype):
    return mt.tensor(np.asarray(values, dtype.np), device="cuda")


@pytest.mark.parametrize("dtype, op, kind, factor, nccl_op", [
    (mt.float32, RedOpType.SUM, "Float32", 1, "Sum"), (mt.float16, RedOpType.MAX, "Float16", 1, "Max"),
    (mt.bfloat16, RedOpType.MIN, "Bfloat16", 1, "Min"), (mt.float64, RedOpType.AVG, "Float64", 1, "Avg"),
    (mt.int8, RedOpType.PRODUCT, "Int8", 1, "Prod"), (mt.uint8, RedOpType.SUM, "Uint8", 1, "Sum"),
    (mt.int32, RedOpType.MIN, "Int32", 1, "Min"), (mt.int64, RedOpType.SUM, "Int64", 1, "Sum"),
    (mt.uint32, RedOpType.MAX, "Uint32", 1, "Max"), (mt.uint64, RedOpType.SUM, "Uint64", 1, "Sum"),
    (mt.bool, RedOpType.SUM, "Uint8", 1, "Max"), (mt.bool, RedOpType.PRODUCT, "Uint8", 1, "Min"),
    (mt.bool, RedOpType.MAX, "Uint8", 1, "Max"), (mt.complex64, RedOpType.SUM, "Float32", 2, "Sum"),
    (mt.complex128, RedOpType.AVG, "Float64", 2, "Avg"),
])
def test_reductions_map_onto_nccls_types_and_ops(recorded, dtype, op, kind, factor, nccl_op):
    recorder, engine = recorded
    t = mt.empty(5, dtype=dtype, device="cuda")
    side = mt.cuda.Stream()
    assert engine.all_reduce(t, op, False) is None
    with mt.cuda.stream(side):
        engine.reduce(t, op, 1, False)
    comm = ("comm", FakeCommunicator.ptr)
    ptr, n, code, nccl_code = t.data_ptr(), 5 * factor, Recorder.DataType[kind], Recorder.RedOp[nccl_op]
    assert recorder.calls == [("all_reduce", ptr, ptr, n, code, nccl_code, comm, mt.cuda.current_stream().cuda_stream),
                              ("reduce", ptr, ptr, n, code, nccl_code, 1, comm, side.cuda_stream)]
    assert side.cuda_stream != 0


def test_what_nccl_cannot_reduce_is_refused_with_torchs_errors(recorded):
    recorder, engine = recorded
    for dtype, name in ((mt.int16, "Short"), (mt.uint16, "UInt16")):
        with pytest.raises(TypeError, match=f"Input tensor data type is not supported for NCCL process group: {name}"):
            engine.all_reduce(mt.empty(3, dtype=dtype, device="cuda"), RedOpType.SUM, False)
    for op in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR):
        with pytest.raises(ValueError, match=f"Cannot use ReduceOp.{op.name} with NCCL"):
            engine.all_reduce(mt.empty(3, dtype=mt.int32, device="cuda"), op, False)
    assert recorder.calls == []


def test_data_movement_goes_as_bytes_and_async_ops_run_on_the_side_stream(recorded):
    recorder, engine = recorded
    t = mt.empty(3, dtype=mt.int16, device="cuda")  # no NCCL type: moved as bytes all the same
    out = mt.empty(6, dtype=mt.int16, device="cuda")
    part, whole = mt.empty(2, device="cuda"), mt.empty(4, device="cuda")
    current = mt.cuda.current_stream().cuda_stream
    engine.broadcast(t, 0, False)
    engine.all_gather(out, t, False)
    engine.reduce_scatter(part, whole, RedOpType.AVG, False)
    engine.send(t, 0, 0, False)
    work = engine.recv(t, 0, 0, True)
    comm = ("comm", FakeCommunicator.ptr)
    assert recorder.calls[:4] == [
        ("broadcast", t.data_ptr(), t.data_ptr(), 6, 1, 0, comm, current),
        ("all_gather", t.data_ptr(), out.data_ptr(), 6, 1, comm, current),
        ("reduce_scatter", whole.data_ptr(), part.data_ptr(), 2, 7, 4, comm, current),
        ("send", t.data_ptr(), 6, 1, 0, comm, current)]
    name, ptr, n, kind, peer, _, stream = recorder.calls[4]
    assert (name, ptr, n, kind, peer) == ("recv", t.data_ptr(), 6, 1, 0) and stream not in (0, current)
    assert isinstance(work, dist.Work) and work.wait()
    mt.cuda.synchronize()  # wait() ordered the current stream after the op, without the host waiting
    assert work.is_completed() and work.is_success()


def test_an_nccl_error_raises_and_the_group_stays_failed(recorded):
    recorder, engine = recorded
    recorder.state = 6  # ncclRemoteError
    with pytest.raises(dist.DistBackendError, match="all_reduce failed on rank 1: error 6 \\(last error\\)"):
        engine.all_reduce(mt.empty(2, device="cuda"), RedOpType.SUM, False)
    recorder.state = 0
    with pytest.raises(dist.DistBackendError):
        engine.all_reduce(mt.empty(2, device="cuda"), RedOpType.SUM, True)
    assert ended(engine) == ["abort"]


def test_destroy_finalizes_then_destroys(recorded):
    assert ended(recorded[1]) == ["finalize", "destroy"]


def test_communicator_init_times_out_and_aborts(tmp_path, monkeypatch):
    """A rank that never joins leaves NCCL's nonblocking init "in progress": after the timeout, abort."""
    recorder = Recorder()
    made = []

    class Core:
        class UniqueId:
            from_bytes = staticmethod(lambda data: data)

        @staticmethod
        def get_unique_id():
            return b"\x01" * 128

        @staticmethod
        def NCCLConfig(blocking):
            assert blocking is False
            return "nonblocking"

        class Communicator:
            @staticmethod
            def init(size, rank, unique_id, config):
                assert (size, rank, unique_id, config) == (2, 0, b"\x01" * 128, "nonblocking")
                made.append(FakeCommunicator(recorder, states=[7] * 10**6))
                return made[-1]

    monkeypatch.setattr(engine_nccl, "_MODULES", [Core, recorder])
    store = dist.FileStore(str(tmp_path / "store"), 1)
    began = time.monotonic()
    with pytest.raises(dist.DistBackendError, match="NCCL communicator init on rank 0 of a group of 2 timed out "
                                                     "after 0.3 s"):
        engine_nccl.create(store, 0, 2, 0, 0.3)
    assert 0.3 < time.monotonic() - began < 5 and made[0].ended == ["abort"]


def test_nccl_needs_a_gpu_or_nccl4py(tmp_path):
    if not ON_GPU:
        with pytest.raises(RuntimeError, match="backend 'nccl' needs NVIDIA GPUs"):
            dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    if not dist.is_nccl_available():
        engine_nccl._MODULES.clear()
        with pytest.raises(RuntimeError, match="Distributed package doesn't have NCCL built in"):
            engine_nccl.nccl()


def test_nccl4py_binding_layer_has_what_the_engine_calls():
    bindings = pytest.importorskip("nccl.bindings.nccl")
    for name in Recorder.DataType.__members__:
        assert int(bindings.DataType[name]) == int(Recorder.DataType[name])
    for name in Recorder.RedOp.__members__:
        assert int(bindings.RedOp[name]) == int(Recorder.RedOp[name])
    for name in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "send", "recv",
                 "comm_get_async_error", "get_error_string", "Comm"):
        assert callable(getattr(bindings, name))
    assert int(bindings.Result.InProgress) == 7 and int(bindings.Result.Success) == 0


# ---------------------------------------------------------------- a GPU with nccl4py

def launch(nproc, tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), NCCL_NVLS_ENABLE="0")
    done = subprocess.run([sys.executable, "-m", "minitensor.distributed.run", "--nproc-per-node", str(nproc), CHECKS,
                           "checks", "nccl", str(tmp_path / "store")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    found = sorted((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")),
                   key=lambda result: int(result["rank"]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["rank"] for r in found] == list(range(nproc))
    for r in found:
        assert r["failures"] == [] and r["backend"] == "nccl" and r["checks"] > 200


@needs_nccl
def test_every_collective_and_dtype_on_one_rank_through_the_launcher(tmp_path):
    launch(1, tmp_path)


@needs_nccl
@pytest.mark.skipif(not ON_GPU or mt.cuda.device_count() < 2, reason="needs two GPUs")
def test_every_collective_and_dtype_on_two_ranks_through_the_launcher(tmp_path):
    launch(2, tmp_path)


@pytest.fixture
def nccl_rank(tmp_path):
    dist.init_process_group("nccl", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    yield dist.group.WORLD
    dist.destroy_process_group()


@needs_nccl
def test_nccl_refusals(nccl_rank):
    with pytest.raises(ValueError, match="Tensors must be CUDA and dense"):
        dist.all_reduce(mt.ones(3))
    with pytest.raises(TypeError, match="not supported for NCCL process group: Short"):
        dist.all_reduce(mt.ones(3, dtype=mt.int16, device="cuda"))
    with pytest.raises(ValueError, match="Cannot use ReduceOp.BAND with NCCL"):
        dist.all_reduce(mt.ones(3, dtype=mt.int32, device="cuda"), op=dist.ReduceOp.BAND)
    t = mt.tensor([1, -2, 3], dtype=mt.int16, device="cuda")
    dist.broadcast(t, src=0)  # moved as bytes
    assert t.tolist() == [1, -2, 3]


@needs_nccl
def test_a_collective_captured_in_a_cuda_graph(nccl_rank):
    """One rank reduces to the identity: this checks that capture and replay of a sync and an async op work."""
    x = mt.arange(8, dtype=mt.float32, device="cuda")
    side = mt.cuda.Stream()
    with mt.cuda.stream(side):
        dist.all_reduce(x)  # the communicator's first uses, and the async side stream, outside the capture
        dist.all_reduce(x, async_op=True).wait()
    mt.cuda.current_stream().wait_stream(side)
    graph = mt.cuda.CUDAGraph()
    with mt.cuda.graph(graph):
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        work = dist.all_reduce(x, async_op=True)
        work.wait()
    x.copy_(mt.arange(8, dtype=mt.float32, device="cuda") * 2)
    graph.replay()
    mt.cuda.synchronize()
    np.testing.assert_array_equal(x.cpu().numpy(), np.arange(8, dtype=np.float32) * 2)
