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


CASES = [
    Case("host.add", HOST, "a + b (allocates)", ONE_K, ONE_K, lambda m, x: lambda: x.a + x.b),
    Case("host.add_out", HOST, "add(a, b, out=c)", ONE_K, ONE_K, _add_out),
    Case("host.fill_", HOST, "c.fill_(3.0)", ONE_K, ONE_K, _fill, _cupy_fill),
    Case("host.add_", HOST, "a.add_(1.0)", ONE_K, ONE_K,
         lambda m, x: partial(x.a.add_, 1.0),
         lambda cp, x: partial(cp.add, x.a, 1.0, out=x.a)),
    Case("device.add_out", DEVICE, "add(a, b, out=c)", (2**28,), (2**20,), _add_out,
         bytes_per_element=12),
    Case("device.copy_", DEVICE, "dst.copy_(src) D2D", (2**28,), (2**20,),
         lambda m, x: partial(x.c.copy_, x.a),
         lambda cp, x: partial(cp.copyto, x.c, x.a),
         bytes_per_element=8),
    Case("device.fill_", DEVICE, "c.fill_(3.0)", (2**28,), (2**20,), _fill, _cupy_fill,
         bytes_per_element=4),
    Case("device.transpose", DEVICE, "a.t().contiguous()", (8192, 8192), (1024, 1024),
         lambda m, x: lambda: x.a.t().contiguous(),
         lambda cp, x: lambda: cp.ascontiguousarray(x.a.T),
         bytes_per_element=8),
]
