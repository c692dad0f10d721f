"""Arguments that are not what a function takes raise a clear error naming the argument, as torch 2.13 does,
instead of an AttributeError from deep inside or a silent guess: dtypes, sizes, devices, streams and events."""
import re

import numpy as np
import pytest

import minitensor as mt

# ---------------------------------------------------------------------------------------------- dtypes
FACTORIES = {  # name -> call with dtype=d
    "tensor": lambda d: mt.tensor([1], dtype=d), "as_tensor": lambda d: mt.as_tensor([1], dtype=d),
    "empty": lambda d: mt.empty(3, dtype=d), "zeros": lambda d: mt.zeros(3, dtype=d),
    "ones": lambda d: mt.ones(3, dtype=d), "full": lambda d: mt.full((3,), 1, dtype=d),
    "arange": lambda d: mt.arange(3, dtype=d), "rand": lambda d: mt.rand(3, dtype=d),
    "randn": lambda d: mt.randn(3, dtype=d), "randint": lambda d: mt.randint(3, (3,), dtype=d),
    "empty_like": lambda d: mt.empty_like(mt.ones(3), dtype=d),
    "zeros_like": lambda d: mt.zeros_like(mt.ones(3), dtype=d),
    "ones_like": lambda d: mt.ones_like(mt.ones(3), dtype=d),
    "full_like": lambda d: mt.full_like(mt.ones(3), 1, dtype=d),
    "rand_like": lambda d: mt.rand_like(mt.ones(3), dtype=d),
    "randn_like": lambda d: mt.randn_like(mt.ones(3), dtype=d),
    "randint_like": lambda d: mt.randint_like(mt.ones(3), 3, dtype=d), "to": lambda d: mt.ones(3).to(dtype=d),
    "sum": lambda d: mt.ones(3).sum(dtype=d), "mean": lambda d: mt.ones(3).mean(dtype=d),
}


@pytest.mark.parametrize("function", sorted(FACTORIES))
@pytest.mark.parametrize("bad", ["float32", np.float32, np.dtype("float32"), 3, 0, "", mt.float32.name, [mt.float32]])
def test_a_dtype_that_is_no_dtype_raises_type_error(function, bad):
    """torch: "zeros(): argument 'dtype' must be torch.dtype, not str"; here the message also lists the dtypes."""
    with pytest.raises(TypeError, match=f"^{function}\\(\\): argument 'dtype' must be minitensor.dtype, not "
                                        f"{type(bad).__name__}: one of mt.bool, mt.uint8, .*mt.complex128, or "
                                        f"Python's bool, int, float or complex$"):
        FACTORIES[function](bad)


@pytest.mark.parametrize("function", sorted(set(FACTORIES) - {"arange", "rand", "randn", "rand_like", "randn_like",
                                                                "randint", "randint_like", "mean"}))
@pytest.mark.parametrize("python_type, expected", [(int, "int64"), (float, "float64"), (bool, "bool")])
def test_python_types_stand_for_dtypes_as_in_torch(function, python_type, expected):
    assert FACTORIES[function](python_type).dtype is getattr(mt, expected)


def test_python_types_in_the_random_factories():
    assert mt.rand(3, dtype=float).dtype is mt.float64 and mt.randn(2, dtype=float).dtype is mt.float64
    assert mt.randint(3, (3,), dtype=int).dtype is mt.int64 and mt.arange(3, dtype=float).dtype is mt.float64
    with pytest.raises(NotImplementedError, match="\"check_uniform_bounds\" not implemented for 'Long'"):
        mt.rand(3, dtype=int)  # as torch


# ---------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize("size, kind", [((1.5,), "float"), (("3",), "str"), ((None,), "NoneType"),
                                        ((2, 1.5), "float"), (([2, "3"],), "str"), (((2, [3]),), "list")])
def test_a_size_that_is_no_int_raises_type_error(device, size, kind):
    pos = 0 if len(size) == 1 and not isinstance(size[0], (list, tuple)) else 1
    message = f"^size must be tuple of ints, but found element of type {kind} at pos {pos}$"
    for factory in (mt.empty, mt.zeros, mt.ones, mt.rand, mt.randn):
        with pytest.raises(TypeError, match=message):
            factory(*size, device=device)
    with pytest.raises(TypeError, match=message):
        mt.full(size if len(size) > 1 else size[0], 1.0, device=device)
    with pytest.raises(TypeError, match=message):
        mt.ones(6, device=device).reshape(*size)
    with pytest.raises(TypeError, match=message):
        mt.ones(1, device=device).expand(*size)


def test_a_float_size_is_refused_after_an_equal_int_size(device):
    """3.0 == 3 and (2, 3.0) == (2, 3) as dict keys: what a factory keeps for a valid size must not let them in,
    nor pin_memory=1 after pin_memory=True."""
    for factory in (mt.empty, mt.zeros, mt.ones, mt.rand, mt.randn):
        factory(3, device=device), factory((2, 3), device=device)
        for size, pos in (((3.0,), 0), (((2, 3.0),), 1)):
            with pytest.raises(TypeError, match=f"^size must be tuple of ints, but found element of type float at "
                                                f"pos {pos}$"):
                factory(*size, device=device)
    mt.empty(2, pin_memory=False)
    with pytest.raises(TypeError, match="^argument 'pin_memory' must be bool, not int$"):
        mt.empty(2, pin_memory=0)


def test_sizes_take_numpy_ints_and_int_tensors(device):
    assert mt.zeros(np.int64(2), mt.tensor(3), device=device).shape == (2, 3)
    assert mt.ones(6, device=device).view(np.int32(2), -1).shape == (2, 3)


@pytest.mark.parametrize("size", [(-1,), (2, -1), (-2, 0), (0, -1)])
def test_a_negative_size_raises(device, size):
    message = "^" + re.escape(f"Trying to create tensor with negative dimension {min(size)}: {list(size)}") + "$"
    before = mt.cuda.memory_allocated()
    for factory in (mt.empty, mt.zeros, mt.ones, mt.rand, mt.randn, lambda *s, **k: mt.randint(3, s, **k),
                    lambda *s, **k: mt.full(s, 1.0, **k)):
        with pytest.raises(RuntimeError, match=message):
            factory(*size, device=device)
    assert mt.cuda.memory_allocated() == before


def test_a_size_whose_product_overflows_raises(device):
    for factory in (mt.empty, mt.zeros, mt.rand):
        with pytest.raises(RuntimeError, match=r"^Storage size calculation overflowed with sizes=\[1099511627776, "
                                               r"1099511627776\]$"):
            factory(2**40, 2**40, device=device)


# ---------------------------------------------------------------------------------------------- devices
@pytest.mark.parametrize("bad", ["cuda:0\n", "cuda\n", "cpu\n", "cuda:0 ", " cuda", "cuda:00", "cuda:01",
                                 "cuda:\u0663", "cuda:+1", "cuda:1e3", "CUDA"])
def test_device_strings_match_whole(bad):
    with pytest.raises(RuntimeError, match="^Invalid device string: "):
        mt.device(bad)
    with pytest.raises(RuntimeError, match="^Invalid device string: "):
        mt.zeros(1, device=bad)
    assert mt.device("cuda") != bad


@pytest.mark.parametrize("index, kind", [(1.5, "float"), (True, "bool"), ("1", "str"), (None, None)])
def test_device_index_must_be_an_int(index, kind):
    if kind is None:
        assert mt.device("cuda", index).index is None
        return
    for make in (lambda: mt.device("cuda", index), lambda: mt.device(("cuda", index))):
        with pytest.raises(TypeError, match=f"^device\\(\\): argument 'index' must be int, not {kind}$"):
            make()


def test_device_index_forms():
    assert mt.device("cuda", np.int64(1)).index == 1 and type(mt.device("cuda", np.int64(1)).index) is int
    assert mt.device("cuda:10").index == 10 and mt.device("cuda:0").index == 0
    with pytest.raises(RuntimeError, match="^type \\(string\\) must not include an index because index was passed "
                                           "explicitly: cuda:1$"):
        mt.device("cuda:1", 1)
    with pytest.raises(RuntimeError, match="Device index must not be negative, got -1"):
        mt.device("cuda", -1)


# ---------------------------------------------------------------------------------------------- streams, events
def test_set_stream_none_does_nothing_as_in_torch():
    s = mt.cuda.Stream()
    with mt.cuda.stream(s):
        mt.cuda.set_stream(None)
        assert mt.cuda.current_stream() == s
    assert mt.cuda.current_stream() == mt.cuda.default_stream()


@pytest.mark.parametrize("bad", ["x", 0, mt.cuda.Event])
def test_a_stream_argument_that_is_no_stream_raises_type_error(bad):
    kind = type(bad).__name__
    t = mt.ones(3, device="cuda")
    calls = {"set_stream(): argument 'stream'": lambda: mt.cuda.set_stream(bad),
             "stream(): argument 'stream'": lambda: mt.cuda.stream(bad),
             "record_stream(): argument 'stream'": lambda: t.record_stream(bad),
             "wait_stream(): argument 'stream'": lambda: mt.cuda.current_stream().wait_stream(bad),
             "record(): argument 'stream'": lambda: mt.cuda.Event().record(bad),
             "wait(): argument 'stream'": lambda: mt.cuda.Event().wait(bad)}
    for what, call in calls.items():
        with pytest.raises(TypeError, match=f"^{re.escape(what)} must be a minitensor.cuda.Stream, not {kind}$"):
            call()
    assert mt.cuda.current_stream() == mt.cuda.default_stream()
    assert t.tolist() == [1.0] * 3


def test_record_stream_none_raises_type_error():
    with pytest.raises(TypeError, match="^record_stream\\(\\): argument 'stream' must be a minitensor.cuda.Stream, "
                                        "not NoneType$"):
        mt.ones(3, device="cuda").record_stream(None)


@pytest.mark.parametrize("bad", ["x", None, mt.cuda.default_stream])
def test_an_event_argument_that_is_no_event_raises_type_error(bad):
    kind = type(bad).__name__
    s = mt.cuda.current_stream()
    end = mt.cuda.Event(enable_timing=True)
    for what, call in {"wait_event(): argument 'event'": lambda: s.wait_event(bad),
                       "elapsed_time(): argument 'end_event'": lambda: end.elapsed_time(bad)}.items():
        with pytest.raises(TypeError, match=f"^{re.escape(what)} must be a minitensor.cuda.Event, not {kind}$"):
            call()
    if bad is not None:  # record_event(None) makes a new event
        with pytest.raises(TypeError, match=f"^record_event\\(\\): argument 'event' must be a minitensor.cuda.Event, "
                                            f"not {kind}$"):
            s.record_event(bad)


def test_stream_numbers_must_be_ints():
    for bad in ("x", 1.5, None):
        with pytest.raises(TypeError, match=f"^Stream\\(\\): argument 'priority' must be int, not "
                                            f"{type(bad).__name__}$"):
            mt.cuda.Stream(priority=bad)
        with pytest.raises(TypeError, match=f"^ExternalStream\\(\\): argument 'stream_ptr' must be int, not "
                                            f"{type(bad).__name__}$"):
            mt.cuda.ExternalStream(bad)
    with pytest.raises(ValueError, match="stream_ptr must be a stream's address"):
        mt.cuda.ExternalStream(-1)
    assert mt.cuda.Stream(priority=np.int64(-1)).priority == -1


# ---------------------------------------------------------------------------------------------- flags, dims, data
def test_bool_arguments_must_be_bools(device):
    """A string would read as True; torch refuses it. A refused random factory draws nothing."""
    for factory in (lambda: mt.zeros(2, pin_memory="x"), lambda: mt.empty(2, pin_memory="no"),
                    lambda: mt.tensor([1], pin_memory=None), lambda: mt.full((2,), 1, pin_memory=1),
                    lambda: mt.rand(2, device=device, pin_memory="x"), lambda: mt.randn(2, pin_memory=[]),
                    lambda: mt.randint(3, (2,), pin_memory="x")):
        with pytest.raises(TypeError, match="^argument 'pin_memory' must be bool, not "):
            factory()
    mt.manual_seed(3)
    with pytest.raises(TypeError):
        mt.rand(4, device=device, pin_memory="x")
    drawn = mt.rand(4, device=device).tolist()
    mt.manual_seed(3)
    assert mt.rand(4, device=device).tolist() == drawn
    a = mt.ones(2, device=device)
    with pytest.raises(TypeError, match="^isclose\\(\\): argument 'equal_nan' must be bool, not str$"):
        mt.isclose(a, a, equal_nan="x")
    assert mt.isclose(a, a, equal_nan=np.bool_(True)).tolist() == [True, True]


def test_a_bool_is_no_dim_for_gather_and_index_select(device):
    x = mt.ones(2, 3, device=device)
    index = mt.zeros(2, 3, dtype=mt.int64, device=device)
    for call in (lambda: x.gather(True, index), lambda: x.index_select(False, index[0])):
        with pytest.raises(TypeError, match="argument 'dim' \\(position 2\\) must be int, not bool"):
            call()
    assert x.gather(np.int64(1), index).shape == (2, 3)


def test_tensor_takes_ranges_as_torch_does(device):
    assert mt.tensor(range(3), device=device).tolist() == [0, 1, 2]
    assert mt.tensor([range(2), range(2, 4)], dtype=mt.int8, device=device).tolist() == [[0, 1], [2, 3]]
    with pytest.raises(TypeError, match="invalid data type 'str'"):
        mt.tensor("12")
