"""Matrix products (ops/matmul.py, kernels/matmul.py) against numpy in float64, and torch's matmul flags
(mt.backends.cuda) with the seed's get/set tests in minitensor's names."""
import warnings

import numpy as np
import pytest

import minitensor as mt
from minitensor.kernels import matmul_plans
from minitensor.ops import matmul as products

FLOATS = [mt.float16, mt.bfloat16, mt.float32, mt.float64]
# bound on |error| / (|A| @ |B|), elementwise: the inputs are exact in their dtype, so only the sums round
TOLERANCE = {mt.float16: 2e-3, mt.bfloat16: 1e-2, mt.float32: 1e-5, mt.float64: 1e-12}


def random(shape, dtype, device, seed):
    values = np.random.default_rng(seed).standard_normal(shape)
    return mt.tensor(values, dtype=dtype, device=device)


def as_f64(t):
    return t.cpu().to(mt.float64).numpy()


def check(result, a, b, dtype, bias=None, alpha=1, beta=1):
    """result == alpha * a @ b + beta * bias within the dtype's tolerance, relative to |a| @ |b|."""
    exact = alpha * np.matmul(as_f64(a), as_f64(b))
    scale = abs(alpha) * np.matmul(np.abs(as_f64(a)), np.abs(as_f64(b))) + 1e-30
    if bias is not None:
        exact = exact + beta * np.broadcast_to(as_f64(bias), exact.shape)
        scale = scale + abs(beta) * np.abs(np.broadcast_to(as_f64(bias), exact.shape))
    got = as_f64(result)
    assert got.shape == exact.shape
    # the output's own rounding to its dtype adds up to half an ulp of the result
    ulp = {mt.float16: 2**-11, mt.bfloat16: 2**-8, mt.float32: 2**-24, mt.float64: 2**-53}[dtype]
    assert np.all(np.abs(got - exact) <= TOLERANCE[dtype] * scale + ulp * np.abs(exact)), \
        np.max(np.abs(got - exact) / scale)


SHAPES = [((7,), (7,)), ((5, 7), (7,)), ((7,), (7, 3)), ((37, 53), (53, 29)), ((1, 1), (1, 1)),
          ((2, 1, 5, 9), (3, 9, 6)), ((4, 5, 9), (9,)), ((9,), (2, 9, 4)), ((3, 70, 65), (3, 65, 66))]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
def test_matmul_shapes_against_numpy(device, dtype, shapes):
    a, b = random(shapes[0], dtype, device, 1), random(shapes[1], dtype, device, 2)
    result = a @ b
    assert result.dtype is dtype and result.device == a.device
    assert result.shape == np.matmul(np.zeros(shapes[0]), np.zeros(shapes[1])).shape
    check(result, a, b, dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_strided_and_transposed_operands(dtype):
    a = random((40, 90), dtype, "cuda", 3)
    b = random((60, 33), dtype, "cuda", 4)
    left, right = a[3:36:2, ::3], b[::2, 1:].t().t()  # steps, offsets
    check(left @ right, left, right, dtype)
    check(b.t() @ a.t()[:60, :2], b.t(), a.t()[:60, :2], dtype)
    batched = random((3, 20, 6), dtype, "cuda", 5).transpose(1, 2)  # (3, 6, 20), strides (120, 1, 6)
    other = random((20, 4), dtype, "cuda", 6).expand(3, 20, 4)  # a broadcast batch: stride 0
    check(mt.bmm(batched, other), batched, other, dtype)


@pytest.mark.parametrize("dtype", [mt.float32, mt.float64], ids=str)
def test_empty_and_degenerate_dims(device, dtype):
    assert (mt.zeros(0, 3, dtype=dtype, device=device) @ mt.ones(3, 4, dtype=dtype, device=device)).shape == (0, 4)
    zero_k = mt.ones(2, 0, dtype=dtype, device=device) @ mt.ones(0, 4, dtype=dtype, device=device)
    assert zero_k.cpu().tolist() == [[0.0] * 4] * 2
    bias = random((4,), dtype, device, 7)
    got = mt.addmm(bias, mt.ones(2, 0, dtype=dtype, device=device), mt.ones(0, 4, dtype=dtype, device=device),
                   beta=2)
    np.testing.assert_allclose(as_f64(got), np.tile(2 * as_f64(bias), (2, 1)))
    assert mt.bmm(mt.ones(0, 2, 3, device=device), mt.ones(0, 3, 4, device=device)).shape == (0, 2, 4)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_addmm_baddbmm_and_linear(device, dtype):
    m1, m2 = random((6, 11), dtype, device, 8), random((11, 5), dtype, device, 9)
    bias = random((5,), dtype, device, 10)
    check(mt.addmm(bias, m1, m2, beta=0.5, alpha=-2.0), m1, m2, dtype, bias, -2.0, 0.5)
    matrix_bias = random((6, 5), dtype, device, 34)
    check(matrix_bias.addmm(m1, m2), m1, m2, dtype, matrix_bias)  # the method: self is the input
    b1, b2 = random((3, 4, 7), dtype, device, 11), random((3, 7, 2), dtype, device, 12)
    full_bias = random((3, 4, 2), dtype, device, 13)
    check(mt.baddbmm(full_bias, b1, b2, beta=1.5, alpha=0.25), b1, b2, dtype, full_bias, 0.25, 1.5)
    weight = random((5, 11), dtype, device, 14)
    check(mt.nn.functional.linear(m1, weight, bias), m1, weight.t(), dtype, bias)
    check(mt.nn.functional.linear(m1, weight), m1, weight.t(), dtype)


def test_beta_zero_ignores_the_input(device):
    nan_bias = mt.full((2, 3), float("nan"), device=device)
    got = mt.addmm(nan_bias, mt.ones(2, 4, device=device), mt.ones(4, 3, device=device), beta=0)
    assert got.cpu().tolist() == [[4.0] * 3] * 2


def test_out_argument(device):
    a, b = random((4, 6), mt.float32, device, 15), random((6, 3), mt.float32, device, 16)
    out = mt.empty(4, 3, device=device)
    assert mt.matmul(a, b, out=out) is out
    check(out, a, b, mt.float32)
    wide = mt.zeros(4, 6, device=device)
    view = wide[:, ::2]  # a strided out
    mt.mm(a, b, out=view)
    check(view, a, b, mt.float32)
    assert wide[:, 1::2].cpu().tolist() == [[0.0] * 3] * 4
    square = random((5, 5), mt.float32, device, 17)
    expected = np.matmul(as_f64(square), as_f64(square))
    mt.mm(square, square, out=square)  # out is an operand: computed aside first
    np.testing.assert_allclose(as_f64(square), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="Expected out tensor to have dtype float, but got double instead"):
        mt.mm(a, b, out=mt.empty(4, 3, dtype=mt.float64, device=device))
    with pytest.raises(RuntimeError, match=r"Expected out tensor to have shape \[4, 3\], but got \[3, 4\]"):
        mt.mm(a, b, out=mt.empty(3, 4, device=device))


def test_shape_dtype_and_device_errors(device):
    a = mt.ones(2, 3, device=device)
    with pytest.raises(RuntimeError, match=r"^mat1 and mat2 shapes cannot be multiplied \(2x3 and 4x5\)$"):
        a @ mt.ones(4, 5, device=device)
    with pytest.raises(RuntimeError, match="inconsistent tensor size, expected tensor \\[3\\] and src \\[4\\]"):
        mt.matmul(mt.ones(3, device=device), mt.ones(4, device=device))
    with pytest.raises(RuntimeError, match="both arguments to matmul need to be at least 1D, but they are 0D and 2D"):
        mt.matmul(mt.tensor(1.0, device=device), a)
    with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype, but got: float != double"):
        mt.mm(a, mt.ones(3, 2, dtype=mt.float64, device=device))
    with pytest.raises(RuntimeError, match="self must be a matrix"):
        mt.mm(mt.ones(3, device=device), a)
    with pytest.raises(RuntimeError, match="batch1 must be a 3D tensor"):
        mt.bmm(a, mt.ones(2, 3, 4, device=device))
    with pytest.raises(RuntimeError, match=r"Expected size for first two dimensions of batch2 tensor to be: "
                                           r"\[2, 4\] but got: \[3, 4\]\."):
        mt.bmm(mt.ones(2, 3, 4, device=device), mt.ones(3, 4, 5, device=device))
    with pytest.raises(RuntimeError, match=r"size mismatch, got input \(2\), mat \(2x3\), vec \(4\)"):
        mt.mv(a, mt.ones(4, device=device))
    with pytest.raises(TypeError, match="argument 'other' must be Tensor, not list"):
        mt.matmul(a, [[1.0]])
    with pytest.raises(NotImplementedError, match="\"addmm_impl_cpu_\" not implemented for 'Bool'"
                       if device == "cpu" else "\"addmm_cuda\" not implemented for 'Bool'"):
        mt.mm(mt.ones(2, 2, dtype=mt.bool, device=device), mt.ones(2, 2, dtype=mt.bool, device=device))


def test_devices_must_match():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        mt.ones(2, 3, device="cuda") @ mt.ones(3, 2)


@pytest.mark.parametrize("dtype", [mt.int8, mt.int32, mt.int64], ids=str)
def test_integer_products_on_the_cpu_only(dtype):
    a = mt.tensor(np.random.default_rng(18).integers(-5, 6, (4, 7)), dtype=dtype)
    b = mt.tensor(np.random.default_rng(19).integers(-5, 6, (7, 3)), dtype=dtype)
    expected = np.matmul(a.numpy().astype(np.int64), b.numpy().astype(np.int64)).astype(dtype.np)
    np.testing.assert_array_equal((a @ b).numpy(), expected)
    with pytest.raises(NotImplementedError, match=f"\"addmm_cuda\" not implemented for '{mt.dtypes.TORCH_NAMES[dtype.name]}'"):
        a.cuda() @ b.cuda()


def test_tall_skinny_and_long_k():
    """Few output tiles and a long K: on a GPU the split-K path, whose partial tiles meet in float32."""
    for dtype in (mt.float32, mt.bfloat16):
        a, b = random((40, 4500), dtype, "cuda", 20), random((4500, 24), dtype, "cuda", 21)
        bias = random((24,), dtype, "cuda", 22)
        check(mt.addmm(bias, a, b, beta=0.5, alpha=2.0), a, b, dtype, bias, 2.0, 0.5)


def test_batches_past_the_grid_limit_run_in_chunks(monkeypatch):
    monkeypatch.setattr(products, "_MAX_GRID_Y", 2)
    a, b = random((5, 3, 4), mt.float32, "cuda", 23), random((5, 4, 2), mt.float32, "cuda", 24)
    bias = random((5, 3, 2), mt.float32, "cuda", 25)
    check(mt.baddbmm(bias, a, b), a, b, mt.float32, bias)


def test_tf32_follows_the_flags(flags):
    """tf32 (10-bit mantissas) shows errors ieee float32 never has; the flag switches between them."""
    a, b = random((64, 512), mt.float32, "cuda", 26), random((512, 64), mt.float32, "cuda", 27)
    scale = np.matmul(np.abs(as_f64(a)), np.abs(as_f64(b)))

    def error():
        return np.max(np.abs(as_f64(a @ b) - np.matmul(as_f64(a), as_f64(b))) / scale)

    flags.allow_tf32 = False
    assert error() < 2e-6
    flags.allow_tf32 = True
    assert 2e-5 < error() < 2e-3
    flags.fp32_precision = "ieee"
    assert error() < 2e-6
    mt.set_float32_matmul_precision("medium")
    assert 2e-5 < error() < 2e-3


# (m, k, n) that the persistent TMA kernel (kernels/matmul_tma.py) takes: large on a GPU, small in the simulator's
# interpreter; each ends in a partial tile (a partial step for K), and all are multiples of 16, as the strides of
# transposed operands must be
TMA_SHAPE = (2064, 528, 2080) if mt.cuda.backend() == "nvidia" else (48, 80, 48)
# tf32 products copy B K-contiguous first (ops/matmul._k_major), so B's layout is always 't' for float32
TMA_CASES = [(dtype, layout) for dtype in (mt.float16, mt.bfloat16, mt.float32) for layout in ("nn", "tn", "nt", "tt")
             if dtype is not mt.float32 or layout[1] == "t"]


def spied_plans(monkeypatch, builder):
    """A fixture's body: yields the arguments of each call of matmul_plans.`builder` during the test, the plan
    cache emptied before (so every product plans anew) and after."""
    built = []
    original = getattr(matmul_plans, builder)
    monkeypatch.setattr(matmul_plans, builder, lambda *args: built.append(args) or original(*args))
    matmul_plans.matmul_plan.cache_clear()
    products._fast.clear()
    yield built
    matmul_plans.matmul_plan.cache_clear()
    products._fast.clear()


@pytest.fixture
def tma_plans(monkeypatch):
    """The TMA plans built during the test."""
    yield from spied_plans(monkeypatch, "_tma_plan")


def _transposed_copy(t):
    """t's values, laid out with its last two dims swapped in memory (a transposed operand, no copy at use)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


@pytest.mark.parametrize("dtype, layout", TMA_CASES, ids=str)
def test_persistent_tma_kernel_reads_every_layout(flags, tma_plans, dtype, layout):
    flags.allow_tf32 = True
    m, k, n = TMA_SHAPE
    a, b = random((m, k), dtype, "cuda", 40), random((k, n), dtype, "cuda", 41)
    a = _transposed_copy(a) if layout[0] == "t" else a
    b = _transposed_copy(b) if layout[1] == "t" else b
    tolerance = {mt.float32: 2e-3}.get(dtype, TOLERANCE[dtype])
    exact = np.matmul(as_f64(a), as_f64(b))
    got = as_f64(a @ b)
    assert len(tma_plans) == 1
    assert np.all(np.abs(got - exact) <= tolerance * np.matmul(np.abs(as_f64(a)), np.abs(as_f64(b))))


@pytest.mark.parametrize("dtype", [mt.bfloat16, mt.float32], ids=str)
def test_persistent_tma_kernel_batches_bias_and_alpha(flags, tma_plans, dtype):
    flags.allow_tf32 = True
    m, k, n = TMA_SHAPE
    a, b = random((3, m, k), dtype, "cuda", 42), _transposed_copy(random((3, k, n), dtype, "cuda", 43))
    bias = random((n,), dtype, "cuda", 44)
    got = mt.baddbmm(bias, a, b, beta=0.5, alpha=-1.5)
    assert len(tma_plans) == 1
    exact = -1.5 * np.matmul(as_f64(a), as_f64(b)) + 0.5 * as_f64(bias)
    scale = 1.5 * np.matmul(np.abs(as_f64(a)), np.abs(as_f64(b))) + 0.5 * np.abs(as_f64(bias))
    tolerance = {mt.float32: 2e-3}.get(dtype, TOLERANCE[dtype])
    assert np.all(np.abs(as_f64(got) - exact) <= tolerance * scale + 2**-8 * np.abs(exact))


def replay_with_new_input(a_shape, b_shape, dtype, seed):
    """a @ b captured in a CUDA graph (its kernels loaded by a first product outside the capture), then A
    overwritten and the graph replayed: the captured output must hold the new product."""
    a, b = random(a_shape, dtype, "cuda", seed), random(b_shape, dtype, "cuda", seed + 1)
    out = a @ b
    graph = mt.cuda.CUDAGraph()
    with mt.cuda.graph(graph):
        out = a @ b
    a.copy_(random(a_shape, dtype, "cuda", seed + 2))
    graph.replay()
    check(out, a, b, dtype)


def test_tma_product_in_a_cuda_graph(tma_plans):
    """The persistent kernel's scratch comes from the graph's pool; a replay recomputes from new inputs."""
    m, k, n = TMA_SHAPE
    replay_with_new_input((m, k), (k, n), mt.float16, 45)
    assert tma_plans


def test_kept_tf32_path_copies_b_k_contiguous(flags):
    """A repeated tf32 product of a row-major B takes the kept path, which copies B K-contiguous each call."""
    flags.allow_tf32 = True
    products._fast.clear()
    a, b = random((3, 40, 64), mt.float32, "cuda", 51), random((3, 64, 48), mt.float32, "cuda", 52)
    first = a @ b
    assert len(products._fast) == 1
    b.copy_(random((3, 64, 48), mt.float32, "cuda", 53))
    second = a @ b
    scale = np.matmul(np.abs(as_f64(a)), np.abs(as_f64(b)))
    assert np.max(np.abs(as_f64(second) - np.matmul(as_f64(a), as_f64(b))) / scale) < 2e-3
    assert not np.array_equal(as_f64(first), as_f64(second))


def test_split_k_product_in_a_cuda_graph():
    replay_with_new_input((40, 4500), (4500, 24), mt.float32, 48)


def test_product_in_a_cuda_graph():
    replay_with_new_input((64, 48), (48, 40), mt.float32, 28)


# ------------------------------------------------------------------------------- the seed's flag tests
def test_allow_tf32_get_set(flags):
    orig = flags.allow_tf32
    flags.allow_tf32 = not orig
    assert flags.allow_tf32 == (not orig)
    flags.allow_tf32 = orig
    assert flags.allow_tf32 == orig
    with pytest.raises(RuntimeError, match="set_allow_tf32_cublas expects a bool, but got int"):
        flags.allow_tf32 = 1


def test_float32_matmul_precision_get_set(flags):
    assert not flags.allow_tf32 and mt.get_float32_matmul_precision() == "highest"
    for p in ("medium", "high"):
        mt.set_float32_matmul_precision(p)
        assert mt.get_float32_matmul_precision() == p and flags.allow_tf32
    mt.set_float32_matmul_precision("highest")
    assert mt.get_float32_matmul_precision() == "highest" and not flags.allow_tf32
    with pytest.warns(UserWarning, match="low is not one of 'highest', 'high', or 'medium'"):
        mt.set_float32_matmul_precision("low")
    assert mt.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_reduced_precision_reduction_get_set(flags, kind):
    name = f"allow_{kind}_reduced_precision_reduction"
    orig = getattr(flags, name)
    setattr(flags, name, not orig)
    assert (getattr(flags, name), getattr(flags, name + "_split_k")) == (not orig, True)
    setattr(flags, name, (False, False))
    assert (getattr(flags, name), getattr(flags, name + "_split_k")) == (False, False)
    with pytest.raises(RuntimeError, match="allow_splitk=False"):
        setattr(flags, name, (True, False))
    with pytest.raises(TypeError, match=f"{name} expects a bool for allow_splitk, but got <class 'int'>"):
        setattr(flags, name, (True, 1))
    with pytest.raises(TypeError, match=f"{name} expects at most two boolean arguments"):
        setattr(flags, name, (True, True, True))


def test_fp16_accumulation_get_set(flags):
    orig = flags.allow_fp16_accumulation
    flags.allow_fp16_accumulation = not orig
    assert flags.allow_fp16_accumulation == (not orig)
    a, b = random((32, 64), mt.float16, "cuda", 31), random((64, 16), mt.float16, "cuda", 32)
    flags.allow_fp16_accumulation = True  # sums in float16: still close, by float16's standard
    got = as_f64(a @ b)
    np.testing.assert_allclose(got, np.matmul(as_f64(a), as_f64(b)), atol=0.1, rtol=0.02)
    with pytest.raises(RuntimeError, match="set_allow_fp16_accumulation_cublas expects a bool, but got str"):
        flags.allow_fp16_accumulation = "yes"


def test_fp32_precision_with_float32_matmul_precision(flags):
    mt.set_float32_matmul_precision("highest")
    assert flags.fp32_precision == "ieee"
    mt.set_float32_matmul_precision("high")
    assert flags.fp32_precision == "tf32"
    mt.set_float32_matmul_precision("medium")
    assert flags.fp32_precision == "tf32"
    with pytest.raises(RuntimeError, match="Unknown precision: bad"):
        flags.fp32_precision = "bad"


def test_invalid_status_for_legacy_api(flags):
    mt.set_float32_matmul_precision("highest")
    flags.fp32_precision = "tf32"
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        mt.get_float32_matmul_precision()
    with pytest.raises(RuntimeError, match="mix of the legacy and new APIs"):
        flags.allow_tf32
    flags.fp32_precision = "ieee"
    assert mt.get_float32_matmul_precision() == "highest" and flags.allow_tf32 is False
    with pytest.raises(AttributeError, match="Unknown attribute nonexistent"):
        flags.nonexistent = 1


def test_preferred_blas_library_settings(flags):
    backend = mt.backends.cuda.BlasBackend
    assert mt.backends.cuda.preferred_blas_library() == backend.Cublas
    assert mt.backends.cuda.preferred_blas_library("default") != backend.Default
    assert mt.backends.cuda.preferred_blas_library() == backend.Cublas
    assert mt.backends.cuda.preferred_blas_library("cublaslt") == backend.Cublaslt
    assert mt.backends.cuda.preferred_blas_library("hipblas") == backend.Cublas
    assert mt.backends.cuda.preferred_blas_library(backend.Ck) == backend.Ck
    with pytest.raises(RuntimeError, match="Unknown input value. Choose from: default, cublas, hipblas, "
                                           "cublaslt, hipblaslt, ck."):
        mt.backends.cuda.preferred_blas_library("unknown")
    with pytest.raises(RuntimeError, match="Unknown input value type."):
        mt.backends.cuda.preferred_blas_library(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = random((7, 7), mt.float32, "cuda", 33)
        check(a @ a, a, a, mt.float32)  # whatever the preference, the product is minitensor's


def test_repeated_products_take_the_kept_path_with_any_alignment():
    """The second `a @ b` of a layout runs the kept closure: new values, and operands that start off a 16-byte
    boundary (the same layout one element further into a storage), give the right products."""
    base_a, base_b = random((3, 33, 40), mt.float32, "cuda", 35), random((41, 24), mt.float32, "cuda", 36)
    for i in range(3):
        a, b = base_a[i, :, i:i + 32], base_b[i:i + 32]  # (33, 32) and (32, 24): one layout, offsets differ
        check(a @ b, a, b, mt.float32)
        check(mt.mm(a, b), a, b, mt.float32)
    batched, other = random((2, 5, 6), mt.float16, "cuda", 37), random((2, 6, 7), mt.float16, "cuda", 38)
    for _ in range(2):
        check(batched @ other, batched, other, mt.float16)
        batched.uniform_()


@pytest.mark.parametrize("dtype", [mt.complex64, mt.complex128], ids=str)
def test_complex_products(device, dtype):
    """Complex products (on cuda: four real ones over the real and imaginary views) against numpy."""
    rng = np.random.default_rng(39)
    np_type = np.complex64 if dtype is mt.complex64 else np.complex128
    tolerance = 1e-5 if dtype is mt.complex64 else 1e-12

    def data(*shape):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np_type)

    a, b, batch_a, batch_b, bias = data(6, 9), data(9, 5), data(3, 4, 9), data(3, 9, 2), data(5)
    ta, tb = mt.tensor(a, device=device), mt.tensor(b, device=device)
    cases = [(ta @ tb, a @ b), (ta[::2] @ tb.t().t()[:, 1:], a[::2] @ b[:, 1:]),
             (mt.bmm(mt.tensor(batch_a, device=device), mt.tensor(batch_b, device=device)), batch_a @ batch_b),
             (mt.addmm(mt.tensor(bias, device=device), ta, tb, beta=0.5 - 1j, alpha=2j),
              (0.5 - 1j) * bias + 2j * (a @ b))]
    for got, expected in cases:
        assert got.dtype is dtype
        scale = np.abs(expected).max()
        assert np.abs(got.cpu().numpy() - expected).max() <= tolerance * scale * 10
