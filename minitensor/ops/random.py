"""Seeding and random numbers: a Philox generator per cuda device (cuda/random.py), numpy's Philox for the CPU.

cuda: each device's generator is (seed, offset). A call reserves the Philox counters it needs from the
offset (ceil(n / 4), or ceil(n / 2) for 64-bit draws; kernels/random.py maps elements onto counters), so the
same seed and the same sequence of calls give the same numbers on every run, whatever the block size or the
GPU, and the simulated device gives the GPU's numbers. A tensor of any layout gets the numbers a contiguous
tensor of its shape would get, in row-major order.
CPU: a numpy Generator over numpy's Philox bit generator keyed by the seed. Its stream differs from the cuda
devices' (as torch's CPU and CUDA streams differ); the same seed gives the same CPU numbers.

`manual_seed` seeds the CPU and every cuda device and restarts their offsets at 0.

Each op is checked and planned once per signature (dtype, shape, strides, device): `_runs` keeps a closure
that a repeated call runs straight away (argument checks, counter reservation, one launch), and `_factories`
does the same for rand/randn/randint. The closures are built from a `Like` (the layout alone), never from a
tensor: a cache entry holds no device memory. Both caches are keyed by user sizes, so each starts over once
it holds CACHE_LIMIT signatures.
"""
import math
import numbers
import operator
import threading
import warnings
from typing import NamedTuple

import numpy as np

from ..base import dtypes
from ..base.device import CPU, device as Device
from ..core import fields
from ..core.alloc import empty
from ..core.fields import allocate
from ..core.host_arrays import numpy_values, numpy_view, to_storage_values
from ..core.layout import device_key, layout_number, layout_of
from ..core.shapes import OVERLAP, contiguous_strides, is_contiguous, new_shape, overlaps_itself, size_key
from ..cuda import capturing, graphs, memory
from ..cuda.devices import as_device, current_device
from ..cuda.random import DEFAULT_SEED, check_seed, generator as cuda_generator, manual_seed_all
from ..cuda.streams import current_stream_handle
from .complex_views import view_as_real
from .copy import copy_
from .runs import kernels
from .typing import refuse_registered

_INT64_MIN = -(2**63)
_FLOAT_DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
_FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
              "float64": 1.7976931348623157e308}
_CPP_NAMES = {"bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short", "int32": "int",
              "int64": "long", "float16": "c10::Half", "bfloat16": "c10::BFloat16", "float32": "float",
              "float64": "double", "uint16": "short unsigned int", "uint32": "unsigned int",
              "uint64": "long unsigned int"}  # the C++ types torch's bounds messages name


# ---------------------------------------------------------------------------------------------- the CPU's generator
_cpu_seed = DEFAULT_SEED
_cpu = None
_cpu_lock = threading.Lock()  # two threads' first draws share one generator, not two with the same seed


def manual_seed(seed):
    """Seed the CPU's generator and every cuda device's."""
    seed = check_seed(seed)
    manual_seed_all(seed)  # first, as torch: refused during a capture, it leaves the CPU's seed as it was
    global _cpu_seed, _cpu
    _cpu_seed, _cpu = seed, None


def initial_seed():
    """The CPU generator's seed."""
    return _cpu_seed


def cpu_generator():
    global _cpu
    g = _cpu
    if g is None:
        with _cpu_lock:
            if _cpu is None:
                _cpu = np.random.Generator(np.random.Philox(key=_cpu_seed))
            g = _cpu
    return g


# ---------------------------------------------------------------------------------------------- plumbing
CACHE_LIMIT = 1024  # signatures per cache (the plans behind them: kernels/random_plans.py keeps 1024 too)
_runs = {}  # (op, layout number) -> run(t, *args) for that layout, checked once
_factories = {}  # (op, size, dtype, device argument[, current device]) -> make(*args) -> new tensor


class Like(NamedTuple):
    """The layout of the tensors a run serves: what its builder may keep (a tensor would keep its memory)."""
    shape: tuple
    stride: tuple
    dtype: object
    device: object
    contiguous: bool


def _remember(cache, key, value):
    """cache[key] = value; a full cache starts over, so user sizes cannot grow it without bound."""
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _real(x, name):
    """A Python float from a real number argument."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, complex) or not isinstance(x, numbers.Number):
        raise TypeError(f"{name} must be a real number, not {type(x).__name__}")
    return float(x)


def _plan_of(name, *leading):
    """plan_of(n, index, captured) for _filler: kernels/random_plans.<name>(*leading, n, index, captured)."""
    return lambda n, index, captured=False: getattr(kernels().random_plans, name)(*leading, n, index, captured)


def _filler(like, plan_of, cpu_values):
    """fill(t, s0, s1) for tensors laid out as `like`: a kernel launch (`plan_of(n, device_index, captured)`) on cuda,
    `cpu_values(generator, n, s0, s1)` (host values in row-major order) on the CPU. Layouts other than
    contiguous go through a contiguous temporary, so they get the numbers a contiguous tensor would."""
    shape, dtype, device = like.shape, like.dtype, like.device
    refuse_registered(device, "a random fill")
    if overlaps_itself(shape, like.stride):
        raise RuntimeError(OVERLAP)
    n = math.prod(shape)
    if n == 0:
        return lambda t, s0, s1: None
    if device.type == "cpu":
        def fill_cpu(t, s0, s1):
            numpy_view(t)[...] = cpu_values(cpu_generator(), n, s0, s1).reshape(shape)
        return fill_cpu
    index, itemsize = device.index, dtype.itemsize
    plan = plan_of(n, index)
    counters, launch, g = plan.counters, plan.run, cuda_generator(index)
    acquire, release = g.lock.acquire, g.lock.release
    by_stream = capturing.by_stream

    def fill(t, s0, s1):
        stream = current_stream_handle(index)
        if by_stream and stream in by_stream:  # in a CUDA graph: counters from the graph's state, per replay
            state, offset = graphs.rng_counters(by_stream[stream], g, counters)
            return plan_of(n, index, True).run(stream, t._storage._block.ptr + t._offset * itemsize, state, offset,
                                               s0, s1)
        acquire()
        offset = g.offset
        g.offset = offset + counters
        release()
        launch(stream, t._storage._block.ptr + t._offset * itemsize, g.key, offset, s0, s1)
    if like.contiguous:
        return fill

    def fill_strided(t, s0, s1):
        tmp = empty(shape, dtype, device)
        fill(tmp, s0, s1)
        copy_(t, tmp)
    return fill_strided


def _float_view_run(like, build):
    """The run of a complex tensor's uniform_ or normal_ as torch's: `build`'s run for its float view
    (ops/complex_views.py), so each element's real and imaginary parts are two draws in a row."""
    view = Like(like.shape + (2,), tuple(2 * s for s in like.stride) + (1,), like.dtype.component, like.device,
                like.contiguous)
    run = build(view)

    def complex_run(t, a, b):
        run(view_as_real(t), a, b)
        return t
    return complex_run


def _run(op, t):
    """The checked-once closure of `op` for tensors laid out as t."""
    key = (op, t._layout or layout_of(t))
    run = _runs.get(key)
    if run is None:
        like = Like(t._shape, t._stride, t.dtype, t.device, is_contiguous(t._shape, t._stride))
        run = _remember(_runs, key, _BUILDERS[op](like))
    return run


def new(op, size, dtype, device, a, b):
    """rand/randn/randint: a new contiguous tensor filled by `op` (a: b: its two arguments), with the shape,
    dtype, device and the op's closure worked out once per call signature."""
    if (type(device) is str and device == "cuda") or (type(device) is Device and device.type == "cuda"
                                                       and device.index is None):
        key = (op, size_key(size), dtype, device, current_device())  # the current device is part of "cuda"
    else:
        key = (op, size_key(size), dtype, device)
    try:
        make = _factories.get(key)
    except TypeError:  # a list size: unhashable, no memo
        return _factory(op, size, dtype, device)(a, b)
    if make is None:
        make = _remember(_factories, key, _factory(op, size, dtype, device))
    return make(a, b)


def _factory(op, size, dtype, device):
    shape = new_shape(size)
    dtype = dtype or (dtypes.int64 if op == "random" else dtypes.default_float)
    device = CPU if device is None else as_device(device)
    strides = contiguous_strides(shape)
    layout = layout_number(dtype, shape, strides, device_key(device))
    run = _runs.get((op, layout))
    if run is None:
        run = _remember(_runs, (op, layout), _BUILDERS[op](Like(shape, strides, dtype, device, True)))
    n = math.prod(shape)
    if device.type == "cpu" or n == 0:
        return lambda a, b: run(empty(shape, dtype, device), a, b)
    index, nbytes = device.index, n * dtype.itemsize
    allocator, new_storage, new_tensor = memory.allocator(index), allocate, fields.tensor

    def make(a, b):
        storage = new_storage(nbytes, device, allocator, current_stream_handle(index))
        return run(new_tensor(storage, shape, strides, 0, dtype, layout), a, b)
    return make


# ---------------------------------------------------------------------------------------------- uniform_
def uniform_(t, a=0.0, b=1.0):
    """t = U[a, b), as torch: bounds rounded to t's dtype, a value that rounds up to b becomes a."""
    return _run("uniform", t)(t, a, b)


def _uniform_run(like):
    dtype = like.dtype
    if dtype.is_complex:  # real and imaginary parts each uniform in [a, b)
        return _float_view_run(like, _uniform_run)
    if not dtype.is_floating_point:
        raise NotImplementedError(f"\"check_uniform_bounds\" not implemented for '{dtypes.TORCH_NAMES[dtype.name]}'")
    limit = _FLOAT_MAX[dtype.name]
    np_type = np.float64 if dtype is dtypes.float64 else np.float32

    def values(g, n, low, high):
        low, high = _rounded(np.array([low, high], np_type), dtype)
        v = _rounded((g.random(n, dtype=np_type) * (high - low) + low).astype(np_type), dtype)
        v[v == high] = low
        return to_storage_values(v, dtype)
    fill = _filler(like, _plan_of("uniform_plan", dtype), values)

    def run(t, a=0.0, b=1.0):
        low = a if type(a) is float else _real(a, "from")
        high = b if type(b) is float else _real(b, "to")
        if not -limit <= low <= high <= limit or high - low > limit:
            _uniform_error(dtype, low, high)
        fill(t, low, high)
        return t
    return run


def _uniform_error(dtype, low, high):
    limit, cpp = _FLOAT_MAX[dtype.name], _CPP_NAMES[dtype.name]
    if not -limit <= low <= limit:
        raise RuntimeError(f"from is out of bounds for {cpp}")
    if not -limit <= high <= limit:
        raise RuntimeError(f"to is out of bounds for {cpp}")
    if low > high:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={low:g} > to={high:g}")
    raise RuntimeError(f"uniform_ expects to-from <= std::numeric_limits<{dtypes.TORCH_NAMES[dtype.name]}>::max(), but "
                       f"found to={high:g} and from={low:g} which result in to-from to exceed the limit")


def _rounded(values, dtype):
    """float32 values rounded to a half type and back (identity for float32 and float64)."""
    if dtype is dtypes.float16:
        return values.astype(np.float16).astype(np.float32)
    if dtype is dtypes.bfloat16:
        return dtypes.bf16_bits_to_f32(dtypes.f32_to_bf16_bits(values))
    return values


# ---------------------------------------------------------------------------------------------- normal_
def normal_(t, mean=0.0, std=1.0):
    """t = mean + std * N(0, 1); for a complex t each part is mean + std / sqrt(2) * N(0, 1), as in torch."""
    return _run("normal", t)(t, mean, std)


def _normal_run(like, std_divisor=1.0):
    """`std_divisor`: sqrt(2) for the float view of a complex tensor, whose parts each get half the variance."""
    dtype = like.dtype
    if dtype.is_complex:
        return _float_view_run(like, lambda view: _normal_run(view, math.sqrt(2)))
    if not dtype.is_floating_point:
        kernel = "normal_kernel_cpu" if like.device.type == "cpu" else "normal_kernel_cuda"
        raise NotImplementedError(f"\"{kernel}\" not implemented for '{dtypes.TORCH_NAMES[dtype.name]}'")
    np_type = np.float64 if dtype is dtypes.float64 else np.float32

    def values(g, n, mean, std):
        return to_storage_values(g.standard_normal(n, dtype=np_type) * np_type(std) + np_type(mean), dtype)
    fill = _filler(like, _plan_of("normal_plan", dtype), values)

    def run(t, mean=0.0, std=1.0):
        mean = mean if type(mean) is float else _real(mean, "mean")
        std = std if type(std) is float else _real(std, "std")
        if not std >= 0.0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
        fill(t, mean, std / std_divisor)
        return t
    return run


# ---------------------------------------------------------------------------------------------- bernoulli
def bernoulli(input, p=None):
    """A tensor like `input` of 0s and 1s, 1 with probability `input` (a float tensor), or `p` when given."""
    if p is None:
        return new("bernoulli_p", input._shape, input.dtype, input.device, input, None)
    return new("bernoulli", input._shape, input.dtype, input.device, p, None)


def bernoulli_(t, p=0.5):
    """t = 1 with probability p (a number, or a float tensor broadcast to t's shape), else 0."""
    return _run("bernoulli_p" if isinstance(p, fields.TensorFields) else "bernoulli", t)(t, p)


def _refuse_bernoulli(dtype, device, kernel):
    """torch has no bernoulli kernel for complex and uint16/32/64 tensors."""
    if dtype.is_complex or dtype in dtypes.SHELL_UINTS:
        raise NotImplementedError(f'"{kernel.format(device.type)}" not implemented for '
                                  f"'{dtypes.TORCH_NAMES[dtype.name]}'")


def _bernoulli_run(like):
    dtype = like.dtype
    _refuse_bernoulli(dtype, like.device, "bernoulli_scalar_{}_")
    fill = _filler(like, _plan_of("bernoulli_plan", None, dtype),
                   lambda g, n, p, _: to_storage_values(g.random(n) < p, dtype))

    def run(t, p=0.5, _=None):
        p = p if type(p) is float else _real(p, "p")
        if not 0.0 <= p <= 1.0:
            raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
        fill(t, p, 0)
        return t
    return run


def _bernoulli_tensor_run(like):
    """p a float tensor broadcast to t's shape, on t's device (moved there, as torch does). p outside [0, 1]
    (NaN too) raises on both devices, as on torch's CPU (its GPU stops at a device-side assert instead); on cuda
    the check waits for p's values."""
    dtype, shape, device = like.dtype, like.shape, like.device
    _refuse_bernoulli(dtype, device, "bernoulli_tensor_{}_self_")
    fills = {}

    def fill_for(p_dtype):
        if p_dtype not in fills:
            if not p_dtype.is_floating_point:
                name = dtypes.TORCH_NAMES[p_dtype.name]
                if device.type == "cpu":
                    raise NotImplementedError(f"\"bernoulli_tensor_cpu_p_\" not implemented for '{name}'")
                raise RuntimeError(f"expected probabilities tensor to have floating type, got {name}")
            fills[p_dtype] = _filler(
                like, _plan_of("bernoulli_plan", p_dtype, dtype),
                lambda g, n, p, _: to_storage_values(g.random(n) < p, dtype))
        return fills[p_dtype]

    def run(t, p, _=None):
        fill = fill_for(p.dtype)
        if p.device != device:
            p = p.to(device)
        # the check waits for p's values: not in a CUDA graph, whose replays read p as it is then
        captured = device.type == "cuda" and current_stream_handle(device.index) in capturing.by_stream
        if not captured and not ((p >= 0) & (p <= 1)).all().item():
            raise RuntimeError("Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
        if p._shape != shape or not p.is_contiguous():
            p = p.expand(shape)
        if device.type == "cpu":
            fill(t, numpy_values(p).reshape(-1), None)
        else:
            fill(t, 0.0, p.contiguous().data_ptr())
        return t
    return run


# ---------------------------------------------------------------------------------------------- random_
def random_(t, *args, **kwargs):
    """torch's random_(), random_(to), random_(from, to=None): integers uniform in [from, to), with `to`
    defaulting to one past the largest integer the dtype holds exactly (2^mantissa digits for floats)."""
    if len(args) == 1 and not kwargs:
        return _run("random", t)(t, 0, args[0])  # random_(to)
    names = ("from", "to")
    if len(args) > 2 or any(k not in names for k in kwargs) or any(k in kwargs for k in names[:len(args)]):
        raise TypeError(f"random_() received an invalid combination of arguments: {args!r}, {kwargs!r}")
    bound = dict(zip(names, args), **kwargs)
    return _run("random", t)(t, bound.get("from", 0), bound.get("to"))


def _random_run(like):
    dtype = like.dtype
    if dtype.is_complex:
        raise RuntimeError("check_random_bounds handles only integral, floating-point and boolean types")
    cpp = _CPP_NAMES[dtype.name]
    if dtype is dtypes.bool_:
        lowest, highest = 0, 1
    elif dtype.is_floating_point:
        lowest, highest = -_FLOAT_MAX[dtype.name], _FLOAT_MAX[dtype.name]
    else:
        info = np.iinfo(dtype.np)
        lowest, highest = int(info.min), int(info.max)
    digits = _FLOAT_DIGITS.get(dtype.name)
    fills = {}

    def values(g, n, low, span):
        words = g.integers(0, span % 2**64 or 2**64, n, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return to_storage_values(words.view(np.int64) + np.int64(low), dtype)

    def fill(mode):
        if mode not in fills:
            fills[mode] = _filler(
                like, _plan_of("integers_plan", mode, dtype), values)
        return fills[mode]

    def check(value, what):
        if not lowest <= value <= highest:
            raise RuntimeError(f"{what} is out of bounds for {cpp}")
        if digits is not None and not -(2**digits) <= value <= 2**digits:
            warnings.warn(f"{what} is out of bounds [-(2^{digits}), 2^{digits}]. Due to precision limitations "
                          f"{cpp} can support discrete uniform distribution only within this range.", stacklevel=4)

    def run(t, low=0, high=None):
        low = operator.index(low)
        if high is not None:
            high = operator.index(high)
            if low >= high:
                raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={low} >= to={high}")
            check(low, "from")
            check(high - 1, "to - 1")
            span = high - low
        elif low == _INT64_MIN:
            if dtype not in (dtypes.int64, dtypes.float64, dtypes.float32, dtypes.bfloat16):
                raise RuntimeError(f"random_full_64_bits_range_kernel_{t.device.type} handles only int64, double, "
                                   "float and bfloat16")
            low, span = 0, 2**64
        else:
            if dtype in dtypes.SHELL_UINTS:  # torch draws them only between bounds
                raise NotImplementedError(f"\"random_kernel_{t.device.type}\" not implemented for "
                                          f"'{dtypes.TORCH_NAMES[dtype.name]}'")
            top = 2**digits if digits is not None else highest
            check(low, "from")
            check(top, "to - 1")
            span = top - low + 1
        mode = 0 if span < 2**32 else 1 if span < 2**64 else 2
        fill(mode)(t, low, span - 2**64 if span >= 2**63 else span)
        return t
    return run


_BUILDERS = {"uniform": _uniform_run, "normal": _normal_run, "bernoulli": _bernoulli_run,
             "bernoulli_p": _bernoulli_tensor_run, "random": _random_run}
