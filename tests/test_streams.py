"""mt.cuda device API, streams, events and the sleep()/Gate() test helpers, on the "cuda" device
(the simulated backend on a machine without a GPU, where streams are real asynchronous queues).

Timing checks are one-sided (at least as long as the sleep they bracket), with sleeps of 100-200 ms
so that they hold on a loaded machine.
"""
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest

import minitensor as mt
from minitensor.backends.sim import SimDriver

DEV = "cuda"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def values(t):
    return np.asarray(t.cpu().numpy())


def full(n, v, dtype=None):
    return mt.full((n,), v, dtype=dtype or mt.float32, device=DEV)


@pytest.fixture(autouse=True)
def _restore_cuda_state():
    """Each test starts and ends with an idle device, device 0 and the default stream current."""
    mt.cuda.synchronize()
    yield
    try:
        mt.cuda.set_device(0)
        mt.cuda.set_stream(mt.cuda.default_stream())
    finally:
        mt.cuda.synchronize()


def run_python(code, extra_env=None, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MINITENSOR_BACKEND", mt.cuda.backend())
    env.update(extra_env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"subprocess failed (rc={p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


# ==============================================================================================
# device API
# ==============================================================================================
def test_is_available_and_backend():
    assert mt.cuda.is_available() is True
    b = mt.cuda.backend()
    assert b in ("nvidia", "sim")
    env = os.environ.get("MINITENSOR_BACKEND")
    if env:
        assert b == env


def test_device_count():
    n = mt.cuda.device_count()
    assert isinstance(n, int) and n >= 1
    if mt.cuda.backend() == "sim":
        assert n == int(os.environ.get("MINITENSOR_SIM_DEVICES", "1"))


def test_current_and_set_device():
    assert mt.cuda.current_device() == 0
    assert isinstance(mt.cuda.current_device(), int)
    mt.cuda.set_device(0)
    assert mt.cuda.current_device() == 0
    mt.cuda.set_device("cuda:0")
    assert mt.cuda.current_device() == 0
    mt.cuda.set_device(mt.device("cuda:0"))
    assert mt.cuda.current_device() == 0


def test_device_context_manager():
    prev = mt.cuda.current_device()
    with mt.cuda.device(None):
        assert mt.cuda.current_device() == prev
    assert mt.cuda.current_device() == prev
    with mt.cuda.device(0):
        assert mt.cuda.current_device() == 0
    with mt.cuda.device("cuda:0"):
        assert mt.cuda.current_device() == 0
    assert mt.cuda.current_device() == prev


OUT_OF_RANGE_CALLS = {
    "set_device": lambda n: mt.cuda.set_device(n),
    "device_ctx": lambda n: mt.cuda.device(n).__enter__(),
    "get_device_name": lambda n: mt.cuda.get_device_name(n),
    "get_device_capability": lambda n: mt.cuda.get_device_capability(n),
    "get_device_properties": lambda n: mt.cuda.get_device_properties(n),
    "mem_get_info": lambda n: mt.cuda.mem_get_info(n),
    "current_stream": lambda n: mt.cuda.current_stream(n),
    "default_stream": lambda n: mt.cuda.default_stream(n),
    "synchronize": lambda n: mt.cuda.synchronize(n),
    "Stream": lambda n: mt.cuda.Stream(device=n),
    "tensor": lambda n: mt.zeros(3, device=f"cuda:{n}"),
}


@pytest.mark.parametrize("call", sorted(OUT_OF_RANGE_CALLS))
def test_device_index_out_of_range(call):
    n = mt.cuda.device_count()
    with pytest.raises(RuntimeError):
        OUT_OF_RANGE_CALLS[call](n)
    with pytest.raises(RuntimeError):
        OUT_OF_RANGE_CALLS[call](n + 7)
    assert mt.cuda.current_device() == 0


def test_synchronize_waits_for_all_streams():
    s = mt.cuda.Stream()
    t0 = time.perf_counter()
    with mt.cuda.stream(s):
        mt.cuda.sleep(150)
    mt.cuda.sleep(100)
    mt.cuda.synchronize()
    assert time.perf_counter() - t0 >= 0.14
    assert s.query() and mt.cuda.current_stream().query()
    mt.cuda.synchronize(0)
    mt.cuda.synchronize("cuda:0")


def test_device_name_capability_properties():
    name = mt.cuda.get_device_name()
    assert isinstance(name, str) and name
    assert name == mt.cuda.get_device_name(None) == mt.cuda.get_device_name(0)
    assert name == mt.cuda.get_device_name(mt.device("cuda:0"))

    cap = mt.cuda.get_device_capability()
    assert isinstance(cap, tuple) and len(cap) == 2 and all(isinstance(c, int) for c in cap)
    assert cap == mt.cuda.get_device_capability(None) == mt.cuda.get_device_capability(0)

    p = mt.cuda.get_device_properties()
    for q in (mt.cuda.get_device_properties(None), mt.cuda.get_device_properties(0)):
        assert (q.name, q.total_memory, q.multi_processor_count, q.major, q.minor, q.uuid) == \
               (p.name, p.total_memory, p.multi_processor_count, p.major, p.minor, p.uuid)
    assert p.name == name
    assert (p.major, p.minor) == cap
    assert isinstance(p.total_memory, int) and p.total_memory > 0
    assert isinstance(p.multi_processor_count, int) and p.multi_processor_count > 0
    assert isinstance(p.shared_memory_per_block_optin, int) and p.shared_memory_per_block_optin >= 48 * 1024
    if mt.cuda.backend() == "sim" and os.environ.get("MINITENSOR_SIM_MEMORY"):
        assert p.total_memory == int(os.environ["MINITENSOR_SIM_MEMORY"])


def test_uuid():
    u = mt.cuda.get_device_properties(0).uuid
    assert isinstance(u, uuid.UUID)
    assert len(str(u)) == 36
    assert len(u.bytes) == 16


def test_mem_get_info():
    free, total = mt.cuda.mem_get_info()
    assert isinstance(free, int) and isinstance(total, int)
    assert 0 <= free <= total
    assert total > 0
    props_total = mt.cuda.get_device_properties().total_memory
    assert abs(total - props_total) <= 0.01 * props_total
    f0, t0 = mt.cuda.mem_get_info(0)
    assert t0 == total and 0 <= f0 <= t0


# ==============================================================================================
# streams
# ==============================================================================================
def test_streams():
    default_stream = mt.cuda.current_stream()
    user_stream = mt.cuda.Stream()
    assert mt.cuda.current_stream() == default_stream
    assert default_stream != user_stream
    assert default_stream.cuda_stream == 0
    assert user_stream.cuda_stream != 0
    with mt.cuda.stream(user_stream):
        assert mt.cuda.current_stream() == user_stream
    assert mt.cuda.current_stream() == default_stream
    assert user_stream.query()
    default_stream.synchronize()
    assert default_stream.query()


def test_stream_ids_and_device():
    d = mt.cuda.default_stream()
    assert d == mt.cuda.current_stream()
    assert d.stream_id == 0 and d.cuda_stream == 0
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    assert s1.stream_id != 0 and s2.stream_id != 0
    assert s1.stream_id != s2.stream_id
    assert s1.cuda_stream != s2.cuda_stream
    for s in (d, s1):
        assert s.device.type == "cuda" and s.device.index == 0
    assert mt.cuda.Stream(priority=-1).query()


def test_stream_eq_hash():
    a, b = mt.cuda.current_stream(), mt.cuda.current_stream()
    assert a == b and hash(a) == hash(b)
    assert mt.cuda.default_stream() == mt.cuda.default_stream(0) == mt.cuda.current_stream(0)
    assert mt.cuda.current_stream(mt.device("cuda:0")) == a
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    assert s1 == s1 and s1 != s2 and not (s1 == s2)
    with mt.cuda.stream(s1):
        again = mt.cuda.current_stream()
    assert again == s1 and hash(again) == hash(s1)
    assert len({a, b, s1, s2, again}) == 3


def test_stream_event_repr():
    s = mt.cuda.current_stream()
    assert "minitensor.cuda.Stream" in repr(s)
    assert "minitensor.cuda.Stream" in repr(mt.cuda.Stream())
    e = mt.cuda.Event()
    assert "minitensor.cuda.Event" in repr(e)
    s.record_event(e)
    assert "minitensor.cuda.Event" in repr(e)


def test_cuda_stream_protocol():
    stream = mt.cuda.Stream()
    result = stream.__cuda_stream__()
    assert isinstance(result, tuple) and len(result) == 2
    assert result[0] == 0
    assert result[1] == stream.cuda_stream
    assert mt.cuda.default_stream().__cuda_stream__() == (0, 0)
    ext = mt.cuda.ExternalStream(stream.cuda_stream)
    assert ext.__cuda_stream__() == (0, stream.cuda_stream)
    assert ext.cuda_stream == stream.cuda_stream


def test_external_stream_is_the_same_queue():
    s = mt.cuda.Stream()
    ext = mt.cuda.ExternalStream(s.cuda_stream)
    assert "minitensor.cuda" in repr(ext)
    with mt.cuda.stream(ext):
        assert mt.cuda.current_stream().cuda_stream == s.cuda_stream
        mt.cuda.sleep(150)
    assert not s.query(), "work queued on the ExternalStream must occupy the stream it wraps"
    s.synchronize()
    assert ext.query()
    x = mt.zeros(33, device=DEV)
    mt.cuda.synchronize()
    with mt.cuda.stream(ext):
        x.fill_(2.5)
    ext.synchronize()
    assert np.all(values(x) == 2.5)


def test_stream_context_manager():
    prev = mt.cuda.current_stream()
    with mt.cuda.Stream() as stream:
        assert stream == mt.cuda.current_stream()
        with mt.cuda.Stream() as inner:
            assert mt.cuda.current_stream() == inner != stream
        assert mt.cuda.current_stream() == stream
    assert mt.cuda.current_stream() == prev


def test_stream_contexts_nest_on_one_stream():
    prev = mt.cuda.current_stream()
    s, t = mt.cuda.Stream(), mt.cuda.Stream()
    with mt.cuda.stream(s):
        with mt.cuda.stream(t), mt.cuda.stream(s):
            assert mt.cuda.current_stream() == s
        assert mt.cuda.current_stream() == s
        with s:
            with s:
                assert mt.cuda.current_stream() == s
            with t:
                assert mt.cuda.current_stream() == t
            assert mt.cuda.current_stream() == s
    assert mt.cuda.current_stream() == prev


def test_stream_context_restores_on_exception():
    prev = mt.cuda.current_stream()
    s = mt.cuda.Stream()
    with pytest.raises(KeyError):
        with mt.cuda.stream(s):
            raise KeyError("x")
    assert mt.cuda.current_stream() == prev


def test_stream_ctx_none_is_noop():
    prev = mt.cuda.current_stream()
    with mt.cuda.stream(None):
        assert mt.cuda.current_stream() == prev
    assert mt.cuda.current_stream() == prev


def test_set_stream():
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    mt.cuda.set_stream(s1)
    assert mt.cuda.current_stream() == s1
    assert mt.cuda.current_stream().stream_id == s1.stream_id
    mt.cuda.set_stream(s2)
    assert mt.cuda.current_stream() == s2
    # kernels go to the current stream
    mt.cuda.sleep(150)
    assert not s2.query()
    assert s1.query()
    mt.cuda.set_stream(mt.cuda.default_stream())
    assert mt.cuda.current_stream() == mt.cuda.default_stream()
    s2.synchronize()
    assert s2.query()


def test_current_stream_is_per_thread():
    s = mt.cuda.Stream()
    seen = []
    with mt.cuda.stream(s):
        th = threading.Thread(target=lambda: seen.append(mt.cuda.current_stream()))
        th.start()
        th.join(30)
    assert seen == [mt.cuda.default_stream()]


def test_sleep_keeps_stream_busy():
    stream = mt.cuda.current_stream()
    assert stream.query()
    t0 = time.perf_counter()
    mt.cuda.sleep(200)
    assert not stream.query()
    stream.synchronize()
    assert time.perf_counter() - t0 >= 0.19
    assert stream.query()


def test_sleep_on_side_stream_leaves_default_idle():
    s = mt.cuda.Stream()
    full(101, 1.0).add_(1.0)       # warm-up: a first launch may compile (slow on a GPU)
    mt.cuda.synchronize()
    with mt.cuda.stream(s):
        mt.cuda.sleep(200)
    assert not s.query()
    x = full(101, 1.0)
    x.add_(1.0)
    mt.cuda.current_stream().synchronize()
    assert np.all(values(x) == 2.0)
    assert mt.cuda.default_stream().query()
    assert not s.query(), "default-stream work must not wait for a non-default stream"
    s.synchronize()
    assert s.query()


def _ordered_by(kind):
    """s2 runs a copy of x after s1 has slept 150 ms and then filled x: the copy must see the fill
    only because s2 was made to wait for s1 (by event, stream or Event.wait)."""
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    x = full(1001, -1.0)
    y = full(1001, -2.0)
    x.fill_(7.0)                   # warm-up: a first launch may compile (slow on a GPU)
    y.copy_(x)
    x.fill_(-1.0)
    y.fill_(-2.0)
    mt.cuda.synchronize()
    t0 = time.perf_counter()
    with mt.cuda.stream(s1):
        mt.cuda.sleep(200)
        x.fill_(7.0)
        e = s1.record_event()
    if kind == "wait_event":
        s2.wait_event(e)
    elif kind == "wait_stream":
        s2.wait_stream(s1)
    else:
        e.wait(s2)
    with mt.cuda.stream(s2):
        y.copy_(x)
    assert not s2.query()
    s2.synchronize()
    assert time.perf_counter() - t0 >= 0.19
    assert e.query() and s1.query()
    assert np.all(values(y) == 7.0)


@pytest.mark.parametrize("kind", ["wait_event", "wait_stream", "event_wait"])
def test_cross_stream_ordering(kind):
    _ordered_by(kind)


def test_event_wait_defaults_to_current_stream():
    s1 = mt.cuda.Stream()
    x = full(77, 0.0)
    y = full(77, 1.0)
    y.copy_(x)                     # warm-up: a first launch may compile (slow on a GPU)
    x.fill_(0.0)
    y.fill_(1.0)
    mt.cuda.synchronize()
    with mt.cuda.stream(s1):
        mt.cuda.sleep(150)
        x.fill_(3.0)
    e = mt.cuda.Event()
    e.record(s1)
    e.wait()                      # current (default) stream waits for s1
    y.copy_(x)                    # on the default stream
    mt.cuda.current_stream().synchronize()
    assert np.all(values(y) == 3.0)


def test_cross_stream_timing():
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    start = mt.cuda.Event(enable_timing=True)
    end = mt.cuda.Event(enable_timing=True)
    start.record(s1)
    with mt.cuda.stream(s1):
        mt.cuda.sleep(120)
    e = s1.record_event()
    s2.wait_event(e)
    end.record(s2)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.95 * 120


# ==============================================================================================
# Gate
# ==============================================================================================
def test_gate_blocks_stream_until_opened():
    s = mt.cuda.Stream()
    x = full(257, 0.0)
    mt.cuda.synchronize()
    gate = mt.cuda.Gate()
    try:
        with mt.cuda.stream(s):
            gate.wait()
            x.fill_(4.5)
            after = mt.cuda.Event()
            after.record()
        time.sleep(0.1)
        assert not s.query()
        assert not after.query()
        time.sleep(0.1)
        assert not after.query(), "work queued behind a closed gate must not run"
    finally:
        gate.open()
    s.synchronize()
    assert after.query() and s.query()
    assert np.all(values(x) == 4.5)


def test_gate_blocks_only_its_stream():
    s = mt.cuda.Stream()
    gate = mt.cuda.Gate()
    y = full(65, 1.0)
    full(65, 0.0).add_(1.0)  # loads the kernel: none can be loaded while a gate is closed
    mt.cuda.synchronize()
    done = threading.Event()
    errors = []

    def other():
        try:
            mt.cuda.default_stream().synchronize()
            done.set()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    try:
        with mt.cuda.stream(s):
            gate.wait()
        y.add_(1.0)               # default stream: not behind the gate
        th = threading.Thread(target=other, daemon=True)
        th.start()
        th.join(30)
        assert not errors, errors
        assert done.is_set(), "the default stream was blocked by a gate waited on another stream"
        assert not s.query()
    finally:
        gate.open()
    s.synchronize()
    assert np.all(values(y) == 2.0)


def test_gate_orders_other_stream_through_event():
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    x = full(129, 0.0)
    y = full(129, -1.0)
    full(129, 0.0).copy_(x)  # loads the kernel: none can be loaded while a gate is closed
    mt.cuda.synchronize()
    gate = mt.cuda.Gate()
    try:
        with mt.cuda.stream(s1):
            gate.wait()
            x.fill_(5.0)
            e = mt.cuda.Event()
            e.record()
        s2.wait_event(e)
        with mt.cuda.stream(s2):
            y.copy_(x)
            e2 = s2.record_event()
        time.sleep(0.15)
        assert not e.query() and not e2.query()
        assert not s1.query() and not s2.query()
    finally:
        gate.open()
    s2.synchronize()
    assert e.query() and e2.query()
    assert np.all(values(y) == 5.0)


def _exit_time(code, timeout=60):
    """(seconds, stdout) of a script that must print "end of script" and exit, cleanly, within `timeout`."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("MINITENSOR_BACKEND", mt.cuda.backend())
    start = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process did not exit within {timeout} s:\n{e.stdout}\n{e.stderr}")
    assert p.returncode == 0 and "end of script" in p.stdout, f"rc={p.returncode}\n{p.stderr}"
    assert "Exception ignored" not in p.stderr and "terminate called" not in p.stderr, p.stderr
    return time.perf_counter() - start, p.stdout


def test_exit_with_a_stream_waiting_on_a_closed_gate():
    """A gate still referenced (a global) and never opened, with work behind it on its stream and on another
    stream through an event: the process exits (the gates open at exit)."""
    _, out = _exit_time("""
        import atexit, ctypes, time

        @atexit.register  # registered first, so it runs last
        def gate_state():
            from minitensor.backends import active_driver
            driver = active_driver()
            opened = GATE._gate.is_set() if driver.name == "sim" else ctypes.c_int32.from_address(GATE._gate[0]).value
            print("gate open at exit:", bool(opened))

        import minitensor as mt
        x = mt.ones(3, device="cuda") + 1  # loads the kernel before the gate closes
        s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
        GATE = mt.cuda.Gate()
        with mt.cuda.stream(s1):
            GATE.wait()
            y = x + 1
            e = s1.record_event()
        s2.wait_event(e)
        with mt.cuda.stream(s2):
            z = x + 1
        time.sleep(0.3)  # the streams are waiting now
        assert not s1.query() and not s2.query()
        print("end of script")
    """)
    assert "gate open at exit: True" in out


@pytest.mark.skipif(mt.cuda.backend() != "sim", reason="on a GPU a sleep is a kernel that runs to its end: "
                    "the process waits for it, as for any kernel")
def test_exit_does_not_wait_for_sleeps_or_work_left_queued():
    """Simulator: exit stops every stream after the kernel it is running; a stream sleeping for an hour, or
    waiting on another stream's event, does not keep the process, and a synchronising call made after the
    streams stopped (an atexit hook registered before the first cuda call) raises instead of waiting."""
    took, out = _exit_time("""
        import atexit
        import minitensor as mt
        from minitensor.base.errors import CudaError

        def late_sync():
            try:
                mt.cuda.synchronize()
            except CudaError as e:
                print("late synchronize:", e)
        atexit.register(late_sync)  # runs after minitensor's own exit hooks
        x = mt.ones(3, device="cuda") + 1
        s = mt.cuda.Stream()
        with mt.cuda.stream(s):
            mt.cuda.sleep(3_600_000)
            e = s.record_event()
        mt.cuda.current_stream().wait_event(e)
        y = x + 1
        print("end of script")
    """)
    assert took < 60 and "late synchronize: CUDA error 4: driver shutting down" in out


# ==============================================================================================
# events
# ==============================================================================================
def test_events():
    stream = mt.cuda.current_stream()
    event = mt.cuda.Event(enable_timing=True)
    assert event.query()           # never recorded: complete
    start_event = mt.cuda.Event(enable_timing=True)
    stream.record_event(start_event)
    mt.cuda.sleep(100)
    stream.record_event(event)
    assert not event.query()
    event.synchronize()
    assert event.query()
    ms = start_event.elapsed_time(event)
    assert isinstance(ms, float)
    assert ms >= 0.95 * 100


def test_event_id():
    e1 = mt.cuda.Event(enable_timing=True)
    e2 = mt.cuda.Event()
    assert e1.event_id == 0 and e2.event_id == 0
    e1.record()
    e2.record()
    assert e1.event_id != 0 and e2.event_id != 0
    assert e1.event_id != e2.event_id
    first = e1.event_id
    e1.record()
    assert e1.event_id == first


def test_event_rerecord_tracks_latest_work():
    e = mt.cuda.Event()
    e.record()
    e.synchronize()
    assert e.query()
    mt.cuda.sleep(150)
    e.record()
    assert not e.query()
    e.synchronize()
    assert e.query()


def test_record_event_returns_event():
    s = mt.cuda.Stream()
    e = s.record_event()
    assert isinstance(e, mt.cuda.Event)
    e2 = mt.cuda.Event()
    assert s.record_event(e2) is e2
    e2.synchronize()
    assert e2.query()


def test_event_record_on_given_stream():
    s = mt.cuda.Stream()
    with mt.cuda.stream(s):
        mt.cuda.sleep(150)
    e_side = mt.cuda.Event()
    e_side.record(s)
    e_cur = mt.cuda.Event()
    e_cur.record()                 # current (default) stream: idle
    e_cur.synchronize()
    assert e_cur.query()
    assert not e_side.query()
    e_side.synchronize()
    assert e_side.query()


def test_event_synchronize_blocks_host():
    for blocking in (False, True):
        e = mt.cuda.Event(blocking=blocking)
        t0 = time.perf_counter()
        mt.cuda.sleep(120)
        e.record()
        e.synchronize()
        assert time.perf_counter() - t0 >= 0.11
        assert e.query()


def test_stream_synchronize_blocks_host():
    s = mt.cuda.Stream()
    t0 = time.perf_counter()
    with mt.cuda.stream(s):
        mt.cuda.sleep(120)
    s.synchronize()
    assert time.perf_counter() - t0 >= 0.11
    assert s.query()


MSG_TIMING = "Both events must be created with argument 'enable_timing=True'"
MSG_RECORDED = "Both events must be recorded before calculating elapsed time"


def _exact(msg):
    return "^" + re.escape(msg) + "$"


def test_events_elapsedtime_errors():
    e1, e2 = mt.cuda.Event(enable_timing=False), mt.cuda.Event(enable_timing=False)
    with pytest.raises(ValueError, match=_exact(MSG_TIMING)):
        e1.elapsed_time(e2)

    e1, e2 = mt.cuda.Event(enable_timing=True), mt.cuda.Event(enable_timing=True)
    with pytest.raises(ValueError, match=_exact(MSG_RECORDED)):
        e1.elapsed_time(e2)
    e1.record()
    with pytest.raises(ValueError, match=_exact(MSG_RECORDED)):
        e1.elapsed_time(e2)
    with pytest.raises(ValueError, match=_exact(MSG_RECORDED)):
        e2.elapsed_time(e1)

    e1, e2 = mt.cuda.Event(), mt.cuda.Event()
    e1.record()
    e2.record()
    with pytest.raises(ValueError, match=_exact(MSG_TIMING)):
        e1.elapsed_time(e2)

    e1, e2 = mt.cuda.Event(enable_timing=True), mt.cuda.Event()
    e1.record()
    e2.record()
    with pytest.raises(ValueError, match=_exact(MSG_TIMING)):
        e1.elapsed_time(e2)
    mt.cuda.synchronize()


def test_elapsed_time_on_side_stream():
    s = mt.cuda.Stream()
    a, b = mt.cuda.Event(enable_timing=True), mt.cuda.Event(enable_timing=True)
    with mt.cuda.stream(s):
        a.record()
        mt.cuda.sleep(80)
        mt.cuda.sleep(80)
        b.record()
    b.synchronize()
    assert a.elapsed_time(b) >= 0.95 * 160
    assert b.elapsed_time(a) <= -0.95 * 160      # reversed order: negative, as cudaEventElapsedTime


# ==============================================================================================
# errors from queued work, torch-free import, several devices (in subprocesses)
# ==============================================================================================
@pytest.mark.skipif(mt.cuda.backend() != "sim", reason="a failing kernel on a real GPU poisons the CUDA "
                    "context of the whole test process; the GPU side is covered by gather's index checks")
def test_failed_work_surfaces_at_next_synchronizing_call():
    """Work that raises on the simulator's engine is raised by the next synchronising call, once."""
    from minitensor.backends import active_driver

    class EngineFailure(Exception):
        pass

    def fail():
        raise EngineFailure("queued work failed")
    s = mt.cuda.Stream()
    with s:
        mt.cuda.sleep(50)
        active_driver().enqueue(s.cuda_stream, fail)
        t = mt.ones(5, device="cuda") * 3     # work queued after the failure still runs
    s.query()                                  # querying does not raise the pending error
    with pytest.raises(EngineFailure, match="queued work failed"):
        s.synchronize()
    s.synchronize()                            # reported once, then cleared
    np.testing.assert_array_equal(t.cpu().numpy(), np.full(5, 3, np.float32))


@pytest.mark.skipif(mt.cuda.backend() != "sim", reason="a failing kernel on a real GPU poisons the CUDA "
                    "context of the whole test process")
def test_failed_work_belongs_to_its_stream():
    """A failure on one simulated stream is raised by the calls that wait for that stream (its synchronize, an
    event recorded on it, the device's synchronize), not by another stream's."""
    from minitensor.backends import active_driver

    def fail():
        raise ValueError("work on s1 failed")
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    for raise_it in (lambda: s1.synchronize(), lambda: s1.record_event().synchronize(), mt.cuda.synchronize):
        active_driver().enqueue(s1.cuda_stream, fail)
        with mt.cuda.stream(s2):
            t = mt.ones(5, device="cuda") * 2
        s2.synchronize()
        s2.record_event().synchronize()
        np.testing.assert_array_equal(t.cpu().numpy(), np.full(5, 2, np.float32))
        with pytest.raises(ValueError, match="work on s1 failed"):
            raise_it()
        mt.cuda.synchronize()  # raised once


def test_multiple_sim_devices():
    out = run_python("""
        import numpy as np
        import minitensor as mt
        assert mt.cuda.backend() == "sim"
        assert mt.cuda.device_count() == 2
        assert mt.cuda.current_device() == 0
        p0, p1 = mt.cuda.get_device_properties(0), mt.cuda.get_device_properties(1)
        assert p0.uuid != p1.uuid
        for bad in (2, 5):
            try:
                mt.cuda.set_device(bad)
            except RuntimeError:
                pass
            else:
                raise AssertionError("set_device(%d) did not raise" % bad)
        assert mt.cuda.current_device() == 0

        with mt.cuda.device(1):
            assert mt.cuda.current_device() == 1
            with mt.cuda.device(None):
                assert mt.cuda.current_device() == 1
        assert mt.cuda.current_device() == 0

        src_prev = mt.cuda.current_stream(0)
        dst_prev = mt.cuda.current_stream(1)
        assert src_prev != dst_prev
        with mt.cuda.Stream(1) as dst_stream:
            assert mt.cuda.current_device() == 1
            assert dst_stream == mt.cuda.current_stream()
            assert dst_stream.device == mt.device("cuda:1")
            assert src_prev == mt.cuda.current_stream(0)
        assert mt.cuda.current_device() == 0
        assert mt.cuda.current_stream() == src_prev
        assert mt.cuda.current_stream(1) == dst_prev

        a = mt.tensor(np.arange(5, dtype=np.float32), device="cuda:1")
        assert str(a.device) == "cuda:1"
        b = (a + 1).cpu().numpy()
        assert np.array_equal(b, np.arange(5, dtype=np.float32) + 1), b

        # a sleep on device 1 does not make device 0's stream busy
        mt.cuda.set_device(1)
        mt.cuda.sleep(150)
        assert not mt.cuda.current_stream(1).query()
        assert mt.cuda.current_stream(0).query()
        mt.cuda.synchronize(1)
        assert mt.cuda.current_stream(1).query()
        mt.cuda.set_device(0)
        print("OK")
    """, extra_env={"MINITENSOR_BACKEND": "sim", "MINITENSOR_SIM_DEVICES": "2"})
    assert out.strip().splitlines()[-1] == "OK", out


def test_uncaught_exception_exits_cleanly():
    """A script that dies of an ordinary exception while device work is still queued exits with
    status 1 and a Python traceback, not an abort from an engine thread at interpreter shutdown.
    (The race, when present, does not hit every run: three runs.)"""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("MINITENSOR_BACKEND", mt.cuda.backend())
    code = textwrap.dedent("""
        import sys
        import minitensor as mt
        t = mt.tensor([1.0, 2.0, 3.0], device="cuda")
        for _ in range(int(sys.argv[1])):
            t.add_(1.0)
        raise ValueError("boom from the test")
    """)
    for n in (3, 5, 20):
        p = subprocess.run([sys.executable, "-c", code, str(n)], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 1, f"rc={p.returncode}\n{p.stderr[-2000:]}"
        assert "ValueError: boom from the test" in p.stderr
        assert "terminate called" not in p.stderr


def test_an_event_destroyed_inside_a_locked_simulator_section_does_not_deadlock():
    """An Event's __del__ runs whenever the garbage collector does, even inside a section of the simulator that
    holds its lock on the same thread (here: the lock held, then the destroy)."""
    driver = SimDriver()  # a simulator of its own: a deadlock would stall only it
    handle = driver.event_create(0, False, False)

    def destroy_while_locked():
        with driver._lock:
            driver.event_destroy(handle)
    worker = threading.Thread(target=destroy_while_locked, daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "event_destroy waited for a lock its own thread holds"


def test_an_event_recorded_on_an_idle_stream_leaves_it_idle():
    """Recording an event on a stream with nothing pending completes the event at once, and waiting for a
    completed event is no work: both streams still report idle (the simulator queued both and said busy until
    their workers ran them)."""
    side, other = mt.cuda.Stream(), mt.cuda.Stream()
    mt.cuda.synchronize()
    event = side.record_event()
    assert side.query() and event.query()
    other.wait_event(event)
    assert other.query()
    mt.cuda.current_stream().wait_stream(side)
    assert mt.cuda.current_stream().query()


def test_a_second_simulator_does_not_hang_the_exit():
    """Each simulator takes the interpreter's lock for good at exit; a second one (the test above makes one)
    must not then wait for it for ever."""
    out = run_python("""
        import minitensor as mt
        from minitensor.backends.sim import SimDriver
        assert (mt.ones(3, device="cuda") + 1).tolist() == [2.0, 2.0, 2.0]
        SimDriver()
        print("OK")
        """, extra_env={"MINITENSOR_BACKEND": "sim"}, timeout=60)
    assert out.strip().splitlines()[-1] == "OK"
