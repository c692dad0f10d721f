"""all_reduce over NCCL: minitensor.distributed against nccl4py called directly and torch.distributed, in the
same processes and the same run.

    python -m minitensor.distributed.run --nproc-per-node N -m bench.distributed

Every rank runs the same sequence (collectives must match across ranks); rank 0 prints the table:
- host overhead: microseconds of host time per 4 KiB float32 all_reduce (timing.host_us_per_call: short bursts,
  the device drained between them, so the host's cost is what is timed), for minitensor, nccl4py's
  Communicator.allreduce (torch tensors: its fastest buffer path), nccl4py's binding layer with raw pointers,
  and torch.distributed. Target: minitensor <= nccl4py's Communicator + 10%.
- bandwidth: a 256 MiB float32 all_reduce timed with events; bus bandwidth = size * 2 (n - 1) / n / time,
  NCCL's convention (with one rank there is no bus: the algorithm bandwidth is shown). Target: >= 95% of
  nccl4py's.
Each framework gets its own communicator over the same GPUs; unique ids travel through a TCPStore on
MASTER_PORT + 1.
"""
import datetime
import os

import minitensor as mt
import minitensor.distributed as dist
from bench import frameworks
from bench.table import table
from bench.timing import device_s_per_launch, host_us_per_call

SMALL_ELEMENTS = 1024  # 4 KiB of float32
LARGE_ELEMENTS = 64 << 20  # 256 MiB of float32


def _nccl4py_communicator(store, rank, size):
    import nccl.core as nccl

    if rank == 0:
        store.set("bench_uid", bytes(nccl.get_unique_id()))
    return nccl.Communicator.init(size, rank, nccl.UniqueId.from_bytes(store.get("bench_uid")))


def _torch_group(torch, rank, size, device):
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 2, size,
                                       rank == 0, timeout=datetime.timedelta(seconds=120))
    torch.distributed.init_process_group("nccl", store=store, rank=rank, world_size=size,
                                         device_id=torch.device("cuda", device))
    return store


def _calls(torch, comm):
    """{name: (all_reduce of a tensor, that tensor's maker, synchronize)} for every framework present."""
    import nccl.core as nccl
    from nccl.bindings import nccl as bindings

    torch_stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    raw_comm = bindings.Comm(comm.ptr)
    f32, total = int(bindings.DataType.Float32), int(bindings.RedOp.Sum)
    return {
        "minitensor": (lambda t: dist.all_reduce(t), lambda n: mt.ones(n, device="cuda"), mt.cuda.synchronize),
        "nccl4py Communicator": (lambda t: comm.allreduce(t, t, nccl.SUM, stream=torch_stream()),
                                 lambda n: torch.ones(n, device="cuda"), torch.cuda.synchronize),
        "nccl4py bindings": (lambda t: bindings.all_reduce(t.data_ptr(), t.data_ptr(), t.numel(), f32, total,
                                                           raw_comm, torch_stream()),
                             lambda n: torch.ones(n, device="cuda"), torch.cuda.synchronize),
        "torch.distributed": (lambda t: torch.distributed.all_reduce(t), lambda n: torch.ones(n, device="cuda"),
                              torch.cuda.synchronize),
    }


def _bandwidth_gbs(call, make, framework, size):
    tensor = make(LARGE_ELEMENTS)
    seconds = device_s_per_launch(lambda: call(tensor), framework, 5, 3)
    factor = 2 * (size - 1) / size if size > 1 else 1.0
    return LARGE_ELEMENTS * 4 * factor / seconds / 1e9


def main():
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = int(os.environ.get("LOCAL_RANK", 0))
    dist.init_process_group("nccl", device_id=device)
    torch_fw = frameworks.torch_or_none()
    if torch_fw is None:
        raise SystemExit("bench.distributed compares with torch on a GPU: torch with CUDA is needed")
    torch = torch_fw.module
    torch.cuda.set_device(device)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1, size, rank == 0,
                          timeout=datetime.timedelta(seconds=120))
    comm = _nccl4py_communicator(store, rank, size)
    torch_store = _torch_group(torch, rank, size, device)
    calls = _calls(torch, comm)
    small = {name: (lambda call=call, make=make, sync=sync: (lambda t=make(SMALL_ELEMENTS): call(t), sync))
             for name, (call, make, sync) in calls.items()}
    host_us, errors = host_us_per_call(small, 200, 15)
    adapters = {"minitensor": frameworks.minitensor()}
    bandwidth = {name: _bandwidth_gbs(call, make, adapters.get(name, torch_fw), size)
                 for name, (call, make, _) in calls.items()}
    if rank == 0:
        _report(size, host_us, bandwidth, errors)
    dist.barrier()
    torch.distributed.destroy_process_group()
    comm.destroy()
    dist.destroy_process_group()
    del torch_store, store


def _report(size, host_us, bandwidth, errors):
    reference_us, reference_gbs = host_us["nccl4py Communicator"], bandwidth["nccl4py Communicator"]
    kind = "bus" if size > 1 else "algorithm (one rank)"
    rows = [(name, f"{host_us[name]:.2f}", f"{host_us[name] / reference_us:.2f}", f"{bandwidth[name]:.1f}",
             f"{bandwidth[name] / reference_gbs:.2f}") for name in host_us]
    print(f"all_reduce on {size} rank(s), float32 (host: 4 KiB; bandwidth: 256 MiB, {kind} GB/s)")
    print(table(("framework", "host us/call", "vs nccl4py (<= 1.10)", "GB/s", "vs nccl4py (>= 0.95)"), rows))
    for name, exc in errors.items():
        print(f"{name}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
