"""Copies between devices with torch's rules: to/cuda/cpu/copy_ with and without non_blocking, pinned and
pageable memory, dtype casts, broadcasting and strides, the staged paths, and every pair of cpu / cuda:N.

Pairs of cuda devices run here when there are two, and always in a subprocess on a simulator with two
devices (peer to peer, and staged through pinned memory as when devices are not peers).
"""
import gc
import itertools
import random

import numpy as np
import pytest

import minitensor as mt
from minitensor.cuda import staging
from helpers import run_python


@pytest.fixture(autouse=True)
def _idle():
    gc.collect()
    mt.cuda.synchronize()
    yield
    mt.cuda.set_stream(mt.cuda.default_stream())
    mt.cuda.synchronize()


def values(t):
    return t.cpu().numpy() if t.dtype is not mt.bfloat16 else t.float().cpu().numpy()


# ============================================================================================== torch's tests
@pytest.mark.parametrize("dst,non_blocking", list(itertools.product(("cuda", "cpu"), (True, False))))
def test_to_non_blocking(dst, non_blocking):
    """torch's test_to_non_blocking: with the stream busy, a non_blocking copy from pinned memory (or into
    the pinned tensor it returns) leaves it busy; a blocking one waits. Only to("cpu", non_blocking=True)
    gives a pinned result."""
    stream = mt.cuda.current_stream()
    src = mt.randn(random.randint(1000, 100000), device="cuda" if dst == "cpu" else "cpu",
                   pin_memory=dst == "cuda")
    mt.cuda.synchronize()
    mt.cuda.sleep(200)
    b = src.to(device=dst, non_blocking=non_blocking)
    assert stream.query() == (not non_blocking)
    stream.synchronize()
    np.testing.assert_array_equal(values(b), values(src))
    assert b.is_pinned() == (non_blocking and dst == "cpu")


def test_to_non_blocking_as_one_sequence():
    """torch's test_to_non_blocking as written there: the four cases in one loop, each source (pinned or not)
    and each result freed while the next case runs, so a freed pinned block's stream events must not leave the
    stream busy after a blocking copy."""
    stream = mt.cuda.current_stream()

    def check(a, non_blocking, dst):
        mt.cuda.synchronize()
        mt.cuda.sleep(100)
        b = a.to(device=dst, non_blocking=non_blocking)
        assert stream.query() == (not non_blocking), (dst, non_blocking)
        stream.synchronize()
        np.testing.assert_array_equal(values(b), values(a))
        assert b.is_pinned() == (non_blocking and dst == "cpu")

    for dst, try_non_blocking in itertools.product(("cuda", "cpu"), (True, False)):
        src = mt.randn(1000000, device="cuda" if dst == "cpu" else "cpu", pin_memory=dst == "cuda")
        check(src, try_non_blocking, dst)


def test_to_cpu_blocking_by_default():
    src = mt.randn(100000, device="cuda")
    mt.cuda.synchronize()
    mt.cuda.sleep(200)
    dst = src.to(device="cpu")
    assert mt.cuda.current_stream().query()
    np.testing.assert_array_equal(dst.numpy(), values(src))
    assert not dst.is_pinned()


def test_cuda_and_cpu_methods():
    data = np.random.rand(33).astype(np.float32)
    p = mt.tensor(data).pin_memory()
    mt.cuda.sleep(200)
    g = p.cuda(non_blocking=True)
    assert not mt.cuda.current_stream().query()
    assert g.cuda() is g and g.device == mt.device("cuda:0")
    np.testing.assert_array_equal(g.cpu().numpy(), data)
    assert mt.cuda.current_stream().query()  # cpu() waited


def test_copy_non_blocking():
    """torch's test_copy_non_blocking: 10 MB copies both ways, and into a pinned view with an offset."""
    def check(a, b):
        event = mt.cuda.Event()
        a.copy_(b, non_blocking=True)
        event.record()
        event.synchronize()
        np.testing.assert_array_equal(values(a), values(b))

    n = 10_000_000
    x = mt.ones(n, dtype=mt.uint8).cuda()
    y = mt.zeros(n, dtype=mt.uint8).pin_memory()
    check(x, y)
    x = mt.zeros(n, dtype=mt.uint8).pin_memory()
    y = mt.ones(n, dtype=mt.uint8).cuda()
    check(x, y)
    x_base = mt.zeros(n, dtype=mt.uint8).pin_memory()
    x = x_base[1:]
    assert x.is_pinned() and x_base.is_pinned()
    assert x_base.data_ptr() != x.data_ptr()
    assert x_base.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    y = mt.ones(n - 1, dtype=mt.uint8).cuda()
    check(x, y)


def test_copy_non_blocking_type_conversion():
    """torch's test: a sleep, then a non_blocking copy to pinned memory and back with a cast, in stream order."""
    value = random.uniform(-100, 100)
    a = mt.full((1,), value, device="cuda")
    b = mt.zeros(1, pin_memory=True)
    c = mt.empty(1, device="cuda", dtype=mt.long)
    mt.cuda.sleep(100)
    b.copy_(a, non_blocking=True)
    c.copy_(b, non_blocking=True)
    assert c.cpu().tolist() == [int(np.float32(value))]


def test_non_blocking_side_stream_and_record_stream():
    """torch's test_record_stream: a non_blocking copy on a side stream, then used on the default stream."""
    t = mt.tensor([1.0, 2.0, 3.0, 4.0]).pin_memory()
    result = mt.empty(4, device="cuda")
    mt.empty(4, device="cuda").copy_(result)  # loads the copy kernel now: loading one waits for the sleep
    stream = mt.cuda.Stream()
    with mt.cuda.stream(stream):
        tmp = t.cuda(non_blocking=True)
        ptr = tmp.data_ptr()
    mt.cuda.current_stream().wait_stream(stream)
    tmp.record_stream(mt.cuda.current_stream())
    mt.cuda.sleep(50)
    result.copy_(tmp)
    del tmp
    with mt.cuda.stream(stream):
        tmp2 = mt.empty(4, device="cuda")
        assert tmp2.data_ptr() != ptr, "allocation reused too soon"
    assert result.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


# ============================================================================================== casts and layouts
CASTS = [(mt.float32, mt.float16), (mt.float16, mt.float64), (mt.int64, mt.float32), (mt.float64, mt.int32),
         (mt.bfloat16, mt.float32), (mt.uint8, mt.int16), (mt.float32, mt.bool)]


def host_values(shape, dtype):
    data = np.random.uniform(-50, 50, shape)
    return mt.tensor(data, dtype=dtype)


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("src_dtype,dst_dtype", CASTS)
def test_host_to_device_casts(src_dtype, dst_dtype, non_blocking):
    src = host_values((random.randint(1, 300),), src_dtype).pin_memory()
    dst = mt.empty(src.shape, dtype=dst_dtype, device="cuda")
    dst.copy_(src, non_blocking=non_blocking)
    np.testing.assert_array_equal(values(dst), values(src.to(dst_dtype)))


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("src_dtype,dst_dtype", CASTS)
def test_device_to_host_casts(src_dtype, dst_dtype, non_blocking):
    expected = host_values((random.randint(1, 300),), src_dtype)
    src = expected.cuda()
    dst = mt.empty(src.shape, dtype=dst_dtype, pin_memory=True)
    # Load the kernels this very copy uses first (a blocking copy may take another path): on a GPU a kernel's
    # first load waits for the device to go idle, which would make the copy below wait for the sleep.
    dst.copy_(src, non_blocking=non_blocking)
    dst.zero_()
    mt.cuda.synchronize()
    mt.cuda.sleep(100)
    dst.copy_(src, non_blocking=non_blocking)
    assert mt.cuda.current_stream().query() == (not non_blocking)  # the cast ran on the device, queued
    mt.cuda.synchronize()
    np.testing.assert_array_equal(values(dst), values(expected.to(dst_dtype)))


@pytest.mark.parametrize("non_blocking", [False, True])
@pytest.mark.parametrize("pin", [False, True])
def test_broadcast_and_strides_both_ways(pin, non_blocking):
    rows, cols = random.randint(2, 40), random.randint(2, 40)
    row = np.random.rand(1, cols).astype(np.float32)
    src = mt.tensor(row)
    if pin:
        src = src.pin_memory()
    dst = mt.zeros(cols, rows, dtype=mt.float64, device="cuda").t()  # non-contiguous, another dtype
    dst.copy_(src, non_blocking=non_blocking)
    np.testing.assert_allclose(values(dst), np.broadcast_to(row, (rows, cols)))

    col = np.random.rand(rows, 1).astype(np.float32)
    host = mt.zeros(cols, rows, dtype=mt.float16, pin_memory=pin).t()
    host.copy_(mt.tensor(col, device="cuda"), non_blocking=non_blocking)
    mt.cuda.synchronize()
    np.testing.assert_allclose(host.numpy(), np.broadcast_to(col, (rows, cols)).astype(np.float16))
    scalar = mt.zeros(3, dtype=mt.int32)
    scalar.copy_(mt.tensor(7.9, device="cuda"), non_blocking=non_blocking)
    mt.cuda.synchronize()
    assert scalar.tolist() == [7, 7, 7]


def test_copy_shape_errors():
    with pytest.raises(RuntimeError, match="must match the size"):
        mt.zeros(3, device="cuda").copy_(mt.zeros(4))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        mt.zeros(3).copy_(mt.zeros(2, 3, device="cuda"))
    mt.zeros(0, device="cuda").copy_(mt.zeros(0))  # nothing to do


def test_storage_copies():
    data = np.random.randint(0, 255, random.randint(1, 5000), dtype=np.uint8)
    s = mt.tensor(data).untyped_storage()
    g = s.cuda()
    assert g.device == mt.device("cuda:0") and g.cuda() is g
    assert bytes(g.cpu()._array) == data.tobytes()
    p = s.pin_memory()
    mt.cuda.sleep(100)
    g2 = p.cuda(non_blocking=True)
    assert not mt.cuda.current_stream().query()
    assert bytes(g2.cpu()._array) == data.tobytes()


# ============================================================================================== staging
@pytest.fixture
def small_chunks(monkeypatch):
    """1 MiB chunks, so a few MiB go through more pieces than chunks (the rotation waits on events)."""
    monkeypatch.setattr(staging, "MAX_CHUNK", 1 << 20)
    monkeypatch.setattr(staging, "THRESHOLD", 1 << 20)


@pytest.mark.parametrize("non_blocking", [False, True])
def test_pageable_host_to_device_is_staged(small_chunks, non_blocking):
    n = random.randint(6 << 20, 9 << 20)  # bytes: 7 to 9 pieces through 4 chunks
    data = np.random.randint(0, 255, n, dtype=np.uint8)
    src = mt.from_numpy(data)
    mt.cuda.host_empty_cache()
    before = mt.cuda.host_memory_stats()
    mt.cuda.sleep(100)  # the first transfers wait: the host waits for the chunks they hold
    dst = src.to("cuda", non_blocking=non_blocking)
    data_copy = data.copy()
    data[:] = 0  # the source may change as soon as the call returns
    stats = mt.cuda.host_memory_stats()
    assert stats["num_host_alloc"] - before["num_host_alloc"] == staging.NUM_CHUNKS
    assert stats["allocated_bytes.current"] - before["allocated_bytes.current"] == staging.NUM_CHUNKS << 20
    mt.cuda.synchronize()
    np.testing.assert_array_equal(dst.cpu().numpy(), data_copy)  # staged the other way, reusing the chunks
    src.copy_(dst)
    np.testing.assert_array_equal(data, data_copy)
    assert mt.cuda.host_memory_stats()["num_host_alloc"] == stats["num_host_alloc"]


def test_staged_copy_with_offset_and_cast(small_chunks):
    n = random.randint(1 << 20, 2 << 20)  # float32 elements: 4 to 8 MiB
    data = np.random.rand(n + 3).astype(np.float32)
    src = mt.from_numpy(data)[3:]
    dst = mt.empty(n, dtype=mt.float64, device="cuda")
    dst.copy_(src)
    np.testing.assert_array_equal(values(dst), data[3:].astype(np.float64))
    back = mt.empty(n + 1, dtype=mt.float32)[1:]
    back.copy_(dst)
    np.testing.assert_array_equal(back.numpy(), data[3:])


def test_chunk_sizes():
    assert staging.chunk_size(1) == staging.MIN_CHUNK
    assert staging.chunk_size(256 << 20) == staging.MAX_CHUNK
    for _ in range(20):
        n = random.randint(staging.THRESHOLD, 1 << 30)
        size = staging.chunk_size(n)
        assert size & (size - 1) == 0 and staging.MIN_CHUNK <= size <= staging.MAX_CHUNK
        assert size * staging.NUM_CHUNKS >= min(n, staging.MAX_CHUNK * staging.NUM_CHUNKS)


# ============================================================================================== device pairs
PAIRS_SCRIPT = """
    import itertools, random
    import numpy as np
    import minitensor as mt
    from minitensor.cuda import transfer

    def values(t):
        return t.cpu().numpy()

    def check_pairs():
        data = np.random.rand(5, 7).astype(np.float32)
        devices = ["cpu"] + [f"cuda:{i}" for i in range(mt.cuda.device_count())]
        for s, d, nb, pin in itertools.product(devices, devices, (False, True), (False, True)):
            src = mt.tensor(data, device=s)
            if pin and s == "cpu":
                src = src.pin_memory()
            out = mt.zeros(7, 5, dtype=mt.float64, device=d, pin_memory=pin and d == "cpu").t()
            out.copy_(src, non_blocking=nb)
            y = src.to(d, non_blocking=nb)
            z = src[:, 1:4].to(d, dtype=mt.float16, non_blocking=nb)
            for i in range(mt.cuda.device_count()):
                mt.cuda.synchronize(i)
            assert np.allclose(values(out), data), (s, d, nb, pin)
            assert y.device == mt.device(d) and np.array_equal(values(y), data), (s, d)
            assert np.array_equal(values(z), data[:, 1:4].astype(np.float16)), (s, d)

    def check_ordering():
        # no host wait: the copy returns while the source device's stream is held, and the destination's
        # current stream waits for it
        n = 1 << 16
        data = np.random.rand(n).astype(np.float32)
        src = mt.tensor(data, device="cuda:0")
        dst = mt.zeros(n, device="cuda:1")
        mt.cuda.synchronize(0)
        gate = mt.cuda.Gate()
        gate.wait()
        dst.copy_(src)
        assert not mt.cuda.current_stream(0).query()
        gate.open()
        assert np.array_equal(values(dst), data)
        back = mt.zeros(n, device="cuda:0")
        with mt.cuda.device(1):
            side = mt.cuda.Stream()
            with mt.cuda.stream(side):
                back.copy_(dst * 2)
        assert np.array_equal(values(back), data * 2)

    check_pairs()
    check_ordering()
    driver = mt.backends.active_driver()
    driver.can_access_peer = lambda device, peer: False  # as devices that are not peers: staged
    transfer._peers.clear()
    check_pairs()
    check_ordering()
    big = np.random.randint(0, 255, (9 << 20) + 5, dtype=np.uint8)
    moved = mt.from_numpy(big).to("cuda:1").to("cuda:0")
    assert np.array_equal(values(moved), big)
    print("ok")
"""


def test_every_device_pair_on_two_simulated_devices():
    out = run_python(PAIRS_SCRIPT, {"MINITENSOR_BACKEND": "sim", "MINITENSOR_SIM_DEVICES": "2"})
    assert out.split() == ["ok"]


def test_every_device_pair_here():
    if mt.cuda.device_count() < 2:
        pytest.skip("one cuda device: the pairs of devices run on the two-device simulator")
    out = run_python(PAIRS_SCRIPT, {"MINITENSOR_BACKEND": mt.cuda.backend()})
    assert out.split() == ["ok"]


# ==============================================================================================
# copies into read-only host memory
# ==============================================================================================
def read_only(array):
    array.flags.writeable = False
    return array


@pytest.mark.parametrize("non_blocking", [False, True])
def test_device_to_host_copy_into_read_only_memory_is_refused(non_blocking):
    """A read-only numpy array under a CPU tensor stays unwritten, as numpy keeps it on the CPU (before: the
    transfer wrote into it)."""
    src = mt.arange(1.0, 7.0, device="cuda")
    array, doubles = read_only(np.zeros(6, np.float32)), read_only(np.zeros(6, np.float64))
    dlpacked = mt.from_dlpack(mt.from_numpy(read_only(np.zeros(6, np.float32))).__dlpack__(max_version=(1, 0)))
    cases = {"from_numpy": (mt.from_numpy(array), src), "as_tensor": (mt.as_tensor(array), src),
             "strided": (mt.from_numpy(array)[::2], src[::2]), "cast": (mt.from_numpy(doubles), src),
             "broadcast": (mt.from_numpy(array), src[:1]), "dlpack": (dlpacked, src)}
    for name, (dst, source) in cases.items():
        with pytest.raises(ValueError, match="read-only"):
            dst.copy_(source, non_blocking=non_blocking)
        mt.cuda.synchronize()
        assert not array.any() and not doubles.any() and not dst.cpu().numpy().any(), name
    with pytest.raises(ValueError, match="read-only"):
        mt.from_numpy(array).copy_(mt.ones(6))  # on the CPU numpy refuses: the same error
    writable = np.zeros(6, np.float32)
    mt.from_numpy(writable).copy_(src, non_blocking=non_blocking)
    mt.cuda.synchronize()
    assert writable.tolist() == [1, 2, 3, 4, 5, 6]


def test_device_to_host_copy_into_a_read_only_memmap_is_refused(tmp_path):
    """Before: the process died of a segmentation fault (the pages are mapped read-only)."""
    out = run_python(f"""
        import numpy as np
        import minitensor as mt

        np.arange(1024, dtype=np.float32).tofile({str(tmp_path / "data.bin")!r})
        mapped = np.memmap({str(tmp_path / "data.bin")!r}, np.float32, mode="r")
        for make in (mt.from_numpy, mt.as_tensor):
            try:
                make(mapped).copy_(mt.zeros(1024, device="cuda"))
            except ValueError as e:
                print("refused", "read-only" in str(e))
        print(float(mapped.sum()))
    """)
    assert out.split() == ["refused", "True", "refused", "True", str(float(sum(range(1024))))]


@pytest.mark.parametrize("src_dtype", [mt.float16, mt.bfloat16, mt.float32, mt.float64], ids=str)
def test_negative_floats_to_uint8_wrap_through_int64(device, src_dtype):
    """c10 casts a float to uint8 through int64, so -2.0 is 254 on both devices (a GPU's own conversion clamps
    to 0)."""
    t = mt.tensor([-2.0, -1.5, -256.0, 300.0, 7.75], dtype=src_dtype, device=device)
    assert t.to(mt.uint8).tolist() == [254, 255, 0, 44, 7]


TRANSPOSE_DTYPES = [mt.bool, mt.uint8, mt.int16, mt.int64, mt.float16, mt.bfloat16, mt.float32, mt.float64]


@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
@pytest.mark.parametrize("shape, perm", [((70, 45), (1, 0)), ((3, 33, 65), (0, 2, 1)), ((2, 3, 40, 9), (0, 1, 3, 2)),
                                         ((0, 5), (1, 0)), ((1, 17), (1, 0))])
def test_transposed_views_made_contiguous(dtype, shape, perm):
    """kernels/elementwise.copy_transposed: tiles past every edge, batches, casts, against numpy."""
    values = np.random.default_rng(len(shape)).standard_normal(shape) * 40
    x = mt.tensor(values, device="cuda").to(dtype)
    expected = x.cpu().numpy().transpose(perm) if dtype is not mt.bfloat16 else None
    y = x.permute(*perm).contiguous()
    assert y.is_contiguous() and y.shape == tuple(shape[p] for p in perm)
    if expected is None:
        np.testing.assert_array_equal(y.float().cpu().numpy(), x.float().cpu().numpy().transpose(perm))
        return
    np.testing.assert_array_equal(y.cpu().numpy(), expected)
    wide = mt.empty(y.shape, dtype=mt.float64, device="cuda").copy_(x.permute(*perm))
    np.testing.assert_array_equal(wide.cpu().numpy(), expected.astype(np.float64))
