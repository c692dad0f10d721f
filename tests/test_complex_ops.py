"""The ops on complex64/complex128 beyond arithmetic: the float functions (exp, log, sqrt, rsqrt, sin, cos, tanh,
sigmoid), pow, isclose/allclose, and rand/randn/uniform_/normal_. Differential against numpy's complex functions
(random data, values at and near the branch cuts, zeros, infinities and NaNs), and against torch where installed."""
import math
import warnings

import numpy as np
import pytest

import minitensor as mt

COMPLEX = [mt.complex64, mt.complex128]
rng = np.random.default_rng(5)
INF, NAN = math.inf, math.nan
SPECIAL_PARTS = [0.0, -0.0, 1.5, -1.5, INF, -INF, NAN]
SPECIALS = [complex(a, b) for a in SPECIAL_PARTS for b in SPECIAL_PARTS]  # torch and numpy agree on all of these

FUNCTIONS = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda z: 1 / np.sqrt(z), "sin": np.sin,
             "cos": np.cos, "tanh": np.tanh, "sigmoid": lambda z: 1 / (1 + np.exp(-z))}


def host(t):
    return t.cpu().numpy()


def random_complex(shape, np_dtype):
    """Parts of magnitudes from about 0.05 to 30, signs mixed."""
    scale = np.exp(rng.uniform(-3, 3.4, shape))
    return ((rng.standard_normal(shape) + 1j * rng.standard_normal(shape)) * scale).astype(np_dtype)


def near_cuts(np_dtype):
    """Points on and beside the negative real axis (log, sqrt, pow's branch cut), the imaginary axis, and |z| = 1."""
    r = np.array([0.25, 1.0, 3.0])
    tiny = np.finfo(np_dtype).tiny * 4
    points = [-r + 0j, -r - 0j, -r + 1j * tiny, -r - 1j * tiny, -r + 1e-6j, -r - 1e-6j, 1j * r, -1j * r,
              np.exp(1j * np.array([0.1, 2.0, -3.0])), r * 1e-30 + 0j]
    return np.concatenate(points).astype(np_dtype)


def assert_complex_close(got, expected):
    """Parts that are NaN or infinite in `expected` are so in `got` (infinities with their sign); finite values
    agree to a few units in the last place, relative to the value's magnitude."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    for part in (np.real, np.imag):
        g, e = part(got), part(expected)
        assert np.array_equal(np.isnan(g), np.isnan(e)), (got, expected)
        assert np.array_equal(g[np.isinf(e)], e[np.isinf(e)]) and np.array_equal(np.isinf(g), np.isinf(e))
    finite = np.isfinite(expected)
    tol = 1e-5 if expected.dtype == np.complex64 else 1e-12
    error = np.abs(got[finite] - expected[finite])
    bound = tol * np.abs(expected[finite]) + np.finfo(expected.real.dtype).tiny
    assert (error <= bound).all(), (got[finite][error > bound], expected[finite][error > bound])


def numpy_of(function, z):
    with np.errstate(all="ignore"):
        return function(z).astype(z.dtype)


# ---------------------------------------------------------------------------------------------- float functions
@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_float_functions_match_numpy(device, dtype, name):
    function = FUNCTIONS[name]
    values = np.concatenate([random_complex(40, dtype.np), near_cuts(dtype.np), np.array(SPECIALS, dtype.np)])
    t = mt.tensor(values, device=device)
    assert getattr(mt, name)(t).dtype is dtype
    assert_complex_close(host(getattr(mt, name)(t)), numpy_of(function, values))
    grid = values[:40].reshape(5, 8)
    strided = mt.tensor(grid, device=device).t()[::2]  # non-contiguous
    assert_complex_close(host(getattr(strided, name)()), numpy_of(function, grid.T[::2]))
    row = mt.tensor(values[:3], device=device)
    assert_complex_close(host(getattr(mt, name)(row.expand(2, 3))), numpy_of(function, np.broadcast_to(values[:3],
                                                                                                      (2, 3))))
    out = mt.empty(3, dtype=dtype, device=device)
    assert getattr(mt, name)(row, out=out) is out
    getattr(row, name + "_")()  # in place
    assert_complex_close(host(row), numpy_of(function, values[:3]))
    assert_complex_close(host(out), numpy_of(function, values[:3]))
    assert getattr(mt, name)(mt.zeros(0, 3, dtype=dtype, device=device)).shape == (0, 3)


def test_float_functions_out_dtype_is_checked(device):
    t = mt.tensor([1 + 1j], device=device)
    with pytest.raises(RuntimeError, match="Found dtype Float but expected ComplexFloat"):
        mt.exp(t, out=mt.empty(1, device=device))


def test_float_functions_match_torch(device):
    torch = pytest.importorskip("torch")
    values = np.concatenate([random_complex(20, np.complex64), near_cuts(np.complex64), np.array(SPECIALS,
                                                                                                 np.complex64)])
    for dtype in COMPLEX:
        data = values.astype(dtype.np)
        for name in FUNCTIONS:
            got = host(getattr(mt, name)(mt.tensor(data, device=device)))
            assert_complex_close(got, getattr(torch, name)(torch.from_numpy(data)).numpy())


# ---------------------------------------------------------------------------------------------- pow
def cpow(a, b):
    """exp(b log a): the C library's cpow, which torch's CPU kernels call."""
    with np.errstate(all="ignore"):
        return np.exp(b * np.log(a))


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_pow_of_tensors_matches_cpow(device, dtype):
    a = random_complex((3, 5), dtype.np) / 4
    b = random_complex((5,), dtype.np) / 8
    a[0, 0], a[0, 1], b[1] = 0, -2 - 0j, 0  # zero base, the branch cut's lower side, a zero exponent
    b[2] = 2.5
    ta, tb = mt.tensor(a, device=device), mt.tensor(b, device=device)
    assert_complex_close(host(ta ** tb), cpow(a, b))  # broadcast
    assert_complex_close(host(mt.pow(ta.t(), tb[:3])), cpow(a.T, b[:3]))  # non-contiguous
    real = rng.uniform(-2, 2, 5).astype(np.float32)
    assert_complex_close(host(mt.tensor(real, device=device) ** ta), cpow(real.astype(dtype.np), a))
    assert_complex_close(host(ta ** mt.tensor([1, 2, 3, -1, 0], device=device)),
                         cpow(a, np.array([1, 2, 3, -1, 0], dtype.np)))
    assert (ta[:0] ** tb).shape == (0, 5)


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_pow_with_number_operands_as_torch(device, dtype):
    """torch's number exponents 0, 1, 2, 3, -2, 0.5, -0.5 and -1 are the ops they stand for (0 gives 1 even for NaN);
    others, and number bases, are cpow, except that a base of 1 gives 1."""
    a = np.concatenate([random_complex(12, dtype.np), near_cuts(dtype.np), [0j, complex(NAN, 1), complex(INF, 0)]])
    t = mt.tensor(a.astype(dtype.np), device=device)
    a = a.astype(dtype.np)
    with np.errstate(all="ignore"):
        special = {0: np.ones_like(a), 1: a, 2: a * a, 3: a * a * a, -2: 1 / (a * a), 0.5: np.sqrt(a),
                   -0.5: 1 / np.sqrt(a), -1: 1 / a, True: a, 0.5 + 0j: np.sqrt(a)}
    for exponent, expected in special.items():
        assert_complex_close(host(t ** exponent), expected.astype(dtype.np))
    finite = a[np.isfinite(a)]
    tf = mt.tensor(finite, device=device)
    for exponent in (2.5, -3, 1j, 0.5 - 0.25j):
        assert_complex_close(host(tf ** exponent), cpow(finite, dtype.np.type(exponent)))
    for base in (2, -1.5, 1j):
        assert_complex_close(host(base ** tf), cpow(dtype.np.type(base), finite))
    assert host(1 ** mt.tensor([complex(NAN, NAN), 2j], dtype=dtype, device=device)).tolist() == [1, 1]
    u = mt.tensor(finite, device=device)
    u **= 2
    u.pow_(0.5 + 0j)
    assert_complex_close(host(u), np.sqrt(finite * finite))
    out = mt.empty(len(finite), dtype=dtype, device=device)
    assert mt.pow(tf, 3, out=out) is out
    assert_complex_close(host(out), finite * finite * finite)


def test_pow_typing(device):
    t = mt.tensor([1 + 1j, 2 - 1j], device=device)
    assert (t ** -1).dtype is mt.complex64  # negative integer exponents are fine for complex types
    assert (mt.tensor([2.0], dtype=mt.float64, device=device) ** 1j).dtype is mt.complex128
    assert (mt.tensor([2, 3], device=device) ** (0.5 + 0j)).dtype is mt.complex64
    with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed."):
        mt.tensor([2, 3], device=device) ** -1
    with pytest.raises(RuntimeError, match="result type ComplexFloat can't be cast to the desired output type Float"):
        mt.tensor([2.0], device=device).pow_(1j)


def test_pow_matches_torch(device):
    torch = pytest.importorskip("torch")
    a = random_complex((4, 6), np.complex64) / 4
    b = random_complex((6,), np.complex64) / 8
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    ma, mb = mt.tensor(a, device=device), mt.tensor(b, device=device)
    assert_complex_close(host(ma ** mb), (ta ** tb).numpy())
    for exponent in (0, 1, 2, 3, -2, 0.5, -0.5, -1, 2.5, 1j, -3):
        assert_complex_close(host(ma ** exponent), (ta ** exponent).numpy())
    for base in (1, 2, 1j):
        assert_complex_close(host(base ** mb), (base ** tb).numpy())


# ---------------------------------------------------------------------------------------------- isclose
def numpy_isclose(a, b, rtol, atol, equal_nan):
    """torch's complex rule: equal, or both NaN with equal_nan, or |a - b| finite and <= atol + |rtol * b|."""
    with np.errstate(all="ignore"):
        error = np.abs(a - b)
        close = (a == b) | (np.isfinite(error) & (error <= atol + np.abs(rtol * b)))
    return close | (equal_nan & np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_isclose_matches_torchs_rule(device, dtype):
    a = random_complex((3, 6), dtype.np)
    b = (a * (1 + rng.choice([0, 1e-9, 1e-6, 1e-4, 1e-2], a.shape) * np.exp(2j * np.pi * rng.random(a.shape))))
    b = b.astype(dtype.np)
    a[0, :4] = [complex(NAN, 1), complex(INF, 1), complex(INF, 0), 1e-9j]
    b[0, :4] = [complex(1, NAN), complex(INF, 2), complex(INF, 0), 0j]
    ta, tb = mt.tensor(a, device=device), mt.tensor(b, device=device)
    for rtol, atol, equal_nan in ((1e-5, 1e-8, False), (1e-5, 1e-8, True), (0, 0, False), (1e-3, 0, False),
                                  (0, 1e-5, True)):
        got = host(mt.isclose(ta, tb, rtol=rtol, atol=atol, equal_nan=equal_nan))
        assert got.tolist() == numpy_isclose(a, b, rtol, atol, equal_nan).tolist()
    assert host(ta.t().isclose(tb.t())).tolist() == numpy_isclose(a.T, b.T, 1e-5, 1e-8, False).tolist()
    assert host(mt.isclose(ta, tb[1])).tolist() == numpy_isclose(a, b[1], 1e-5, 1e-8, False).tolist()  # broadcast
    assert mt.allclose(ta[1:], ta[1:] * (1 + 1e-7)) and not mt.allclose(ta, tb)
    assert mt.equal(ta[1:], ta[1:].clone()) and not mt.equal(ta, ta)  # NaN is not equal to itself
    assert mt.isclose(ta[:0], tb[:0]).shape == (0, 6)
    names = ("ComplexFloat", "Float") if dtype is mt.complex64 else ("ComplexDouble", "Double")
    with pytest.raises(RuntimeError, match="{} did not match {}".format(*names)):
        mt.isclose(ta, ta.real)


def test_isclose_matches_torch(device):
    torch = pytest.importorskip("torch")
    a = random_complex(40, np.complex128)
    b = a * (1 + rng.choice([0, 1e-9, 1e-6, 1e-4], 40) * np.exp(2j * np.pi * rng.random(40)))
    a[:3], b[:3] = [complex(NAN, 0), complex(INF, 1), 0j], [complex(0, NAN), complex(INF, 1), 1e-9]
    for dtype in COMPLEX:
        x, y = a.astype(dtype.np), b.astype(dtype.np)
        for kwargs in ({}, {"equal_nan": True}, {"rtol": 1e-3, "atol": 0.0}):
            got = host(mt.isclose(mt.tensor(x, device=device), mt.tensor(y, device=device), **kwargs))
            assert got.tolist() == torch.isclose(torch.from_numpy(x), torch.from_numpy(y), **kwargs).tolist()


# ---------------------------------------------------------------------------------------------- random
@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_random_complex_tensors(device, dtype):
    """rand/uniform_ draw each part uniformly; randn/normal_ give each part half the variance; the parts are the
    float view's draws, so a complex draw is the real draw of twice the elements (randn scaled by 1/sqrt(2))."""
    mt.manual_seed(3)
    z = mt.randn(4000, dtype=dtype, device=device)
    mt.manual_seed(3)
    x = mt.randn(8000, dtype=dtype.to_real(), device=device)
    assert z.dtype is dtype and z.shape == (4000,)
    np.testing.assert_allclose(host(mt.view_as_real(z)).reshape(-1), host(x) / math.sqrt(2), rtol=1e-6)
    parts = host(mt.view_as_real(z))
    assert abs(parts.mean()) < 0.05 and abs(parts.var(0) - 0.5).max() < 0.05
    mt.manual_seed(3)
    u = mt.rand(5, 7, dtype=dtype, device=device)
    mt.manual_seed(3)
    np.testing.assert_array_equal(host(mt.view_as_real(u)), host(mt.rand(5, 7, 2, dtype=dtype.to_real(),
                                                                          device=device)))
    t = mt.empty(6, 5, dtype=dtype, device=device).t()  # non-contiguous: the numbers of a contiguous tensor
    mt.manual_seed(4)
    t.uniform_(-2, 5)
    mt.manual_seed(4)
    np.testing.assert_array_equal(host(t), host(mt.empty(5, 6, dtype=dtype, device=device).uniform_(-2, 5)))
    parts = host(mt.view_as_real(t))
    assert parts.min() >= -2 and parts.max() < 5 and parts[..., 1].std() > 1
    n = mt.empty(3000, dtype=dtype, device=device).normal_(2, 3)
    parts = host(mt.view_as_real(n))
    assert abs(parts.mean(0) - 2).max() < 0.2 and abs(parts.std(0) - 3 / math.sqrt(2)).max() < 0.2
    assert mt.randn(0, 3, dtype=dtype, device=device).shape == (0, 3)
    assert mt.randn_like(z[:3]).dtype is dtype and mt.rand_like(u).dtype is dtype


def test_random_complex_errors_as_torch(device):
    t = mt.zeros(3, dtype=mt.complex64, device=device)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0, but found std -1"):
        t.normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range, but found from=2 > to=1"):
        t.uniform_(2, 1)
    with pytest.raises(RuntimeError, match="to is out of bounds for float"):
        t.uniform_(0, 1e39)
    assert host(t).tolist() == [0, 0, 0]  # a refused fill leaves the tensor as it was


# ---------------------------------------------------------------------------------------------- item
@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_item_of_complex(device, dtype):
    t = mt.tensor([[1.5 - 2j]], dtype=dtype, device=device)
    assert t.item() == 1.5 - 2j and type(t.item()) is complex
    assert mt.tensor(3j, dtype=dtype, device=device).item() == 3j
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no cast warning: item() keeps the imaginary part
        assert complex(t) == 1.5 - 2j
