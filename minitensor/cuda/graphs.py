"""CUDA graphs, as torch.cuda.graphs: capture eager work on a stream once, replay it with one launch.

`CUDAGraph.capture_begin` routes the allocations of the capturing stream (and of the streams that join it) to
a private pool of the device's allocator (allocator/private_pools.py), then begins the driver's capture;
`capture_end` ends it and instantiates the graph; `replay` launches it. The pool's memory stays reserved for
the graph until `reset()` (or the graph's deletion) and until the blocks handed out during the capture (its
static outputs) are freed. A capture that fails (an illegal call, an exception inside `with graph(g)`) ends,
and gives its pool up as `reset()` would.

A kernel used for the first time inside a capture is compiled and loaded there: loading a module is not a
stream operation, and the launch is captured like any other.

Random ops in a capture read their generator's seed and offset from a small state block (`GraphRng`) that
each replay sets first, advancing the generator by the counters the graph draws, so every replay draws new
numbers and `manual_seed` before replays reproduces them.
"""
import itertools
import threading
import warnings

from ..backends import active_driver
from . import capturing, memory
from .capturing import MODES
from .devices import current_device, device as device_context, synchronize
from .random import Philox
from .streams import Stream, current_stream_handle, stream as stream_context

__all__ = ["CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]

_ids = itertools.count(1)  # pool ids: graph_pool_handle's (0, n), a capture's own (n, 0), as torch's


def _next_id():
    return next(_ids)  # atomic: count's next() holds the GIL throughout, as streams.py's event ids rely on


def graph_pool_handle():
    """An id of a private pool several graphs can share: pass it as `pool=` to each capture."""
    return 0, _next_id()


def is_current_stream_capturing():
    """Whether the current stream of the current device captures a graph (False, touching no device, when no
    capture is underway)."""
    return bool(capturing.by_stream) and current_stream_handle(current_device()) in capturing.by_stream


class GraphRng:
    """A captured graph's use of one generator: the device block holding the [seed, offset] its random kernels
    read, and how many Philox counters one replay draws. `prologue` sets the block before a replay."""

    __slots__ = ("generator", "block", "counters", "set_state", "device", "streams")

    def __init__(self, generator, device):
        self.generator = generator
        self.device = device
        # from the general cache (stream 0), not the graph's pool: the pool holds only the graph's tensors
        self.block = memory.allocator(device).alloc(16, 0)
        self.counters = 0
        self.set_state = _kernels().state_setter(device)
        self.streams = set()  # the streams replays ran on, recorded on the block (its free waits for them)

    def prologue(self, stream):
        if stream not in self.streams:
            memory.allocator(self.device).record_stream(self.block, stream)
            self.streams.add(stream)
        g = self.generator
        with g.lock:
            offset = g.offset
            g.offset = offset + self.counters
        self.set_state(stream, self.block.ptr, g.key, offset)

    def release(self):
        memory.allocator(self.device).free(self.block)


def rng_counters(capture, generator, counters):
    """For a random op captured in `capture`: (address of the generator's state block, the op's first counter
    relative to each replay's offset), reserving `counters` more per replay."""
    rng = capture.rng.get(generator)
    if rng is None:
        rng = capture.rng[generator] = GraphRng(generator, capture.device)
    first = rng.counters
    rng.counters = first + counters
    return rng.block.ptr, first


def _kernels():
    from minitensor.kernels import random_plans  # lazy: import cost (Triton's launch path, the driver's start)
    return random_plans


def _check_thread(capture):
    """CUDA ends a global or thread-local capture only on the thread that began it."""
    if capture.mode != "relaxed" and capture.thread != threading.get_ident():
        raise RuntimeError(f"a {capture.mode!r} capture must end on the thread that began it")


def _pool_id(pool):
    """The id a `pool=` argument names: a MemPool's `id`, or an id pair of ints."""
    pool = getattr(pool, "id", pool)
    if not (isinstance(pool, tuple) and len(pool) == 2 and all(isinstance(x, int) for x in pool)):
        raise TypeError(f"pool must be graph_pool_handle(), another graph's pool(), or a MemPool; got {pool!r}")
    return pool


class CUDAGraph:
    """One captured graph. Capture with `capture_begin`/`capture_end` (or `with mt.cuda.graph(g)`), on a
    stream other than the default one; replay on any stream of its device. `keep_graph` is accepted for torch's
    signature: the graph is always instantiated by `capture_end`, its template dropped."""

    def __init__(self, keep_graph=False):
        self._capture = None  # the capture underway
        self._exec = None  # the executable graph once captured
        self._pool = None  # the id of the private pool the graph holds a use of
        self._device = None
        self._rng = ()  # its GraphRngs

    def capture_begin(self, pool=None, capture_error_mode="global"):
        if capture_error_mode not in MODES:
            raise ValueError(f"capture_error_mode must be one of {', '.join(map(repr, MODES))}, got "
                             f"{capture_error_mode!r}")
        if self._capture is not None:
            raise RuntimeError("This CUDAGraph instance is already capturing a graph (end or abort that capture "
                               "first)")
        if self._exec is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture a new graph, "
                               "create a new instance or call reset() first.")
        pool_id = (_next_id(), 0) if pool is None else _pool_id(pool)
        device = current_device()
        stream = current_stream_handle(device)
        if stream == 0:
            raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, "
                               "it's ok to replay them on the default stream.)")
        if stream in capturing.by_stream:
            raise RuntimeError(f"stream {stream:#x} is already capturing a CUDA graph")
        allocator = memory.pool_allocator(device, "a CUDA graph capture")
        capture = capturing.Capture(stream, device, capture_error_mode, pool_id)
        allocator.begin_allocate_to_pool(pool_id, capture.streams.__contains__, True)
        try:
            active_driver().stream_begin_capture(stream, capture_error_mode)
        except BaseException:
            allocator.end_allocate_to_pool(pool_id, capture.streams.__contains__)
            allocator.release_pool(pool_id)
            raise
        capturing.begin(capture)
        self._capture, self._pool, self._device = capture, pool_id, device

    def capture_end(self):
        capture = self._capture
        if capture is None:
            raise RuntimeError("capture_end() called without a capture underway (call capture_begin() first)")
        if current_stream_handle(capture.device) != capture.stream:
            raise RuntimeError("Capture must end on the same stream it began on.")
        _check_thread(capture)
        driver = active_driver()
        try:
            template = driver.stream_end_capture(capture.stream)
        except BaseException:
            self._abandon(capture)
            raise
        self._end(capture)
        try:
            nodes = driver.graph_node_count(template)
            self._exec = driver.graph_instantiate(template)
        except BaseException:
            self._release()
            raise
        finally:
            driver.graph_destroy(template)
        if nodes == 0:
            warnings.warn("The CUDA Graph is empty. This usually means that the graph was attempted to be "
                          "captured on wrong device or stream.", UserWarning, stacklevel=2)

    def abort_capture(self):
        """End a capture that failed: discard what it recorded and give its pool up, as `reset()` would."""
        capture = self._capture
        if capture is None:
            return
        _check_thread(capture)
        try:
            driver = active_driver()
            template = driver.stream_end_capture(capture.stream)
            driver.graph_destroy(template)
        except Exception:  # the capture was invalidated: it ended with nothing to discard
            pass
        finally:
            self._abandon(capture)

    def replay(self):
        """Launch the graph on the current stream (its device's)."""
        if self._exec is None:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        with device_context(self._device):
            stream = current_stream_handle(self._device)
            for rng in self._rng:
                rng.prologue(stream)
            active_driver().graph_launch(self._exec, stream)

    def reset(self):
        """Drop the graph and give up its private pool (freed by empty_cache once its outputs are gone); the
        instance can then capture again, as torch's."""
        if self._capture is not None:
            raise RuntimeError("reset() called while the graph's capture is underway; end it first")
        if self._exec is not None:
            exec_, self._exec = self._exec, None
            active_driver().graph_exec_destroy(exec_)
        self._release()

    def pool(self):
        """The id of the graph's private pool, to share with another capture (`pool=g.pool()`)."""
        if self._pool is None:
            raise RuntimeError("the graph has no pool: capture it first")
        return self._pool

    def register_generator_state(self, generator):
        """Let the capture underway draw from `generator` (a device's, from mt.cuda.default_generators) with
        new numbers on each replay. A capture registers the generators its ops use by itself."""
        if not isinstance(generator, Philox):
            raise TypeError(f"register_generator_state() expects a generator of mt.cuda.default_generators, not "
                            f"{type(generator).__name__}")
        if self._capture is None:
            raise RuntimeError("register_generator_state() needs a capture underway")
        rng_counters(self._capture, generator, 0)

    def _end(self, capture):
        capturing.end(capture)
        memory.allocator(capture.device).end_allocate_to_pool(capture.pool, capture.streams.__contains__)
        self._capture = None
        self._rng = tuple(capture.rng.values())

    def _abandon(self, capture):
        self._end(capture)
        self._release()

    def _release(self):
        for rng in self._rng:
            rng.release()
        self._rng = ()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            memory.allocator(self._device).release_pool(pool)

    def __del__(self):
        try:
            if self._capture is not None:
                self.abort_capture()
            self.reset()
        except Exception:  # interpreter shutdown: the driver may be gone
            pass


class graph:
    """`with mt.cuda.graph(g):` captures the block into `g`, on `stream` or else a side stream kept for
    captures, after synchronizing the device and emptying the cache, as torch does (which no longer runs
    gc.collect() there by default: it costs milliseconds per capture).

    `with ... as ctx` gives the context (torch gives None), for its `capture_stream`. Once the block ends it
    holds neither the graph nor the pool: a `ctx` kept after the caller deleted the graph would otherwise keep
    the graph's pool in use, its memory reserved for good."""

    default_capture_streams = {}  # device index -> the side stream captures use by default

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        index = current_device()
        if stream is None:
            stream = graph.default_capture_streams.get(index)
            if stream is None:
                stream = graph.default_capture_streams[index] = Stream(index)
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream = stream_context(stream)

    def __enter__(self):
        if self.cuda_graph is None:
            raise RuntimeError("this mt.cuda.graph context has captured its block already; make a new one for "
                               "another capture")
        synchronize()
        memory.empty_cache()
        self._stream.__enter__()
        try:
            self.cuda_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, exc_type, exc, traceback):
        cuda_graph, self.cuda_graph, self.pool = self.cuda_graph, None, None  # the caller's to keep, not ours
        try:
            if exc_type is None:
                cuda_graph.capture_end()
            else:
                cuda_graph.abort_capture()
        finally:
            self._stream.__exit__(None, None, None)
        return False


def make_graphed_callables(callables, sample_args, num_warmup_iters=3, allow_unused_input=False, pool=None,
                           capture_error_mode="global"):
    """Graphed versions of functions of tensors (torch's forward half; minitensor has no autograd).

    Each function is warmed up `num_warmup_iters` times on a side stream, then captured with `sample_args` as
    its static inputs, every capture in one shared pool. A call copies each argument into its static input
    (unless it is that very tensor), replays, and returns the static outputs, which the next call overwrites.
    `callables` is a function or a tuple of them, `sample_args` a tuple of tensors or a tuple of such tuples."""
    single = callable(callables)
    functions = (callables,) if single else tuple(callables)
    all_args = (tuple(sample_args),) if single else tuple(map(tuple, sample_args))
    if len(functions) != len(all_args):
        raise ValueError(f"make_graphed_callables(): {len(functions)} callables but {len(all_args)} sample_args")
    for args in all_args:
        for arg in args:
            if not hasattr(arg, "data_ptr") or not hasattr(arg, "copy_"):
                raise TypeError("make_graphed_callables(): sample_args must be tensors only, got "
                                f"{type(arg).__name__}")
    synchronize()
    side = Stream()
    with stream_context(side):
        for _ in range(num_warmup_iters):
            for function, args in zip(functions, all_args):
                function(*args)
    synchronize()
    pool = graph_pool_handle() if pool is None else pool
    graphed = []
    for function, args in zip(functions, all_args):
        g = CUDAGraph()
        with graph(g, pool=pool, stream=side, capture_error_mode=capture_error_mode):
            outputs = function(*args)
        graphed.append(_graphed(function, g, args, outputs))
    return graphed[0] if single else tuple(graphed)


def _graphed(function, g, static_inputs, static_outputs):
    def run(*args):
        if len(args) != len(static_inputs):
            raise TypeError(f"graphed {getattr(function, '__name__', 'callable')}() takes {len(static_inputs)} "
                            f"tensors, got {len(args)}")
        for static, arg in zip(static_inputs, args):
            if arg.data_ptr() != static.data_ptr():
                static.copy_(arg)
        g.replay()
        return static_outputs
    run.graph = g
    return run
