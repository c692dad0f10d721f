"""The benchmark cases. Adding one is one `Case(...)` entry in CASES.

An op is `op(module, x) -> fn`: given the framework's module (minitensor or torch, whose APIs
match) and the inputs `x.a`, `x.b` (uniform random) and `x.c` (uninitialised), all float32 of the
case's shape on the GPU, it returns the zero-argument callable that is timed. `cupy_op` is the
same for CuPy where its spelling differs; without one CuPy runs `op` too.
"""

from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace
from typing import Callable, Optional

from bench.allocator import alloc_pair, cupy_alloc_pair, cupy_empty_del, empty_del
from bench.copies import cupy_pinned_empty_del, pinned_empty_del

HOST = "host"  # host time per call of a small op, in us
DEVICE = "device"  # device bandwidth of a large op, in GB/s

ONE_K = (1024,)


@dataclass(frozen=True)
class Case:
    key: str  # stable id, used in the JSON, by --only and by the targets
    kind: str  # HOST or DEVICE
    name: str
    gpu_shape: tuple
    sim_shape: tuple  # scaled down: the simulated device runs kernels in Triton's interpreter
    op: Callable
    cupy_op: Optional[Callable] = None
    bytes_per_element: int = 0  # DEVICE: bytes read + written per element of the shape

    def shape(self, sim):
        return self.sim_shape if sim else self.gpu_shape

    def build(self, fw, sim):
        """The timed callable for framework `fw`, with freshly made inputs."""
        shape = self.shape(sim)
        x = SimpleNamespace(a=fw.rand(shape), b=fw.rand(shape), c=fw.empty(shape))
        op = self.cupy_op if fw.name == "cupy" and self.cupy_op else self.op
        return op(fw.module, x)


def _add_out(m, x):
    return partial(m.add, x.a, x.b, out=x.c)


def _fill(m, x):
    return partial(x.c.fill_, 3.0)


def _cupy_fill(cp, x):
    return partial(x.c.fill, 3.0)


def _uniform(m, x):
    return x.c.uniform_


def _normal(m, x):
    return x.c.normal_


def _cupy_uniform(cp, x):  # CuPy's default Generator, in place through out=
    return partial(cp.random.default_rng(0).random, dtype=cp.float32, out=x.c)


def _cupy_normal(cp, x):
    return partial(cp.random.default_rng(0).standard_normal, dtype=cp.float32, out=x.c)


def _where(m, x):
    condition = x.a > 0.5
    return partial(m.where, condition, x.a, x.b)


def _broadcast_add(m, x):
    column, row = x.a[:, :1], x.b[:1, :]
    return lambda: column + row


def _gather(m, x):
    """a.gather(0, index), the index uniform over a: every read lands on a random sector."""
    index = m.randint(0, x.a.numel(), tuple(x.a.shape), device="cuda")
    return partial(m.gather, x.a, 0, index)


def _cupy_gather(cp, x):
    return partial(cp.take_along_axis, x.a, cp.random.randint(0, x.a.size, x.a.shape), 0)


CASES = [
    Case("host.add", HOST, "a + b (allocates)", ONE_K, ONE_K, lambda m, x: lambda: x.a + x.b),
    Case("host.add_out", HOST, "add(a, b, out=c)", ONE_K, ONE_K, _add_out),
    Case("host.fill_", HOST, "c.fill_(3.0)", ONE_K, ONE_K, _fill, _cupy_fill),
    Case("host.add_", HOST, "a.add_(1.0)", ONE_K, ONE_K,
         lambda m, x: partial(x.a.add_, 1.0),
         lambda cp, x: partial(cp.add, x.a, 1.0, out=x.a)),
    Case("host.exp", HOST, "exp(a) (allocates)", ONE_K, ONE_K, lambda m, x: partial(m.exp, x.a)),
    Case("host.lt", HOST, "a < b (allocates)", ONE_K, ONE_K, lambda m, x: lambda: x.a < x.b),
    Case("host.where", HOST, "where(cond, a, b)", ONE_K, ONE_K, _where),
    Case("host.alloc_pair", HOST, "caching_allocator_alloc+delete 4 KiB", ONE_K, ONE_K, alloc_pair,
         cupy_alloc_pair),
    Case("host.empty_del", HOST, "empty(4096) + del", ONE_K, ONE_K, empty_del, cupy_empty_del),
    Case("host.pinned_empty_del", HOST, "empty(1 MiB, pin_memory=True) + del", ONE_K, ONE_K, pinned_empty_del,
         cupy_pinned_empty_del),
    Case("host.uniform_", HOST, "c.uniform_()", ONE_K, ONE_K, _uniform, _cupy_uniform),
    Case("host.sum", HOST, "a.sum()", ONE_K, ONE_K, lambda m, x: x.a.sum),
    Case("host.gather", HOST, "gather(a, 0, index)", ONE_K, ONE_K, _gather, _cupy_gather),
    Case("device.add_out", DEVICE, "add(a, b, out=c)", (2**28,), (2**20,), _add_out,
         bytes_per_element=12),
    Case("device.exp_out", DEVICE, "exp(a, out=c)", (2**28,), (2**20,), lambda m, x: partial(m.exp, x.a, out=x.c),
         bytes_per_element=8),
    Case("device.broadcast_add", DEVICE, "a[:, :1] + b[:1, :]", (16384, 16384), (1024, 1024), _broadcast_add,
         bytes_per_element=4),
    Case("device.copy_", DEVICE, "dst.copy_(src) D2D", (2**28,), (2**20,),
         lambda m, x: partial(x.c.copy_, x.a),
         lambda cp, x: partial(cp.copyto, x.c, x.a),
         bytes_per_element=8),
    Case("device.fill_", DEVICE, "c.fill_(3.0)", (2**28,), (2**20,), _fill, _cupy_fill,
         bytes_per_element=4),
    Case("device.uniform_", DEVICE, "c.uniform_()", (2**28,), (2**20,), _uniform, _cupy_uniform,
         bytes_per_element=4),
    Case("device.normal_", DEVICE, "c.normal_()", (2**28,), (2**20,), _normal, _cupy_normal,
         bytes_per_element=4),
    Case("device.sum", DEVICE, "a.sum()", (2**28,), (2**20,), lambda m, x: x.a.sum, bytes_per_element=4),
    Case("device.sum_rows", DEVICE, "a.sum(1)", (16384, 16384), (1024, 1024), lambda m, x: partial(x.a.sum, 1),
         bytes_per_element=4),
    Case("device.sum_cols", DEVICE, "a.sum(0)", (16384, 16384), (1024, 1024), lambda m, x: partial(x.a.sum, 0),
         bytes_per_element=4),
    Case("device.gather", DEVICE, "gather(a, 0, random index)", (2**28,), (2**20,), _gather, _cupy_gather,
         bytes_per_element=16),
    Case("device.transpose", DEVICE, "a.t().contiguous()", (8192, 8192), (1024, 1024),
         lambda m, x: lambda: x.a.t().contiguous(),
         lambda cp, x: lambda: cp.ascontiguousarray(x.a.T),
         bytes_per_element=8),
]
