"""Launch plans of the matrix product (kernels/matmul.py; matmul_tma.py's persistent kernel where Hopper's TMA
can read the operands; matmul_fma.py's for large float32 products in IEEE arithmetic on the GPU): the tile
configuration per shape and dtype, split-K for tall, skinny products, and the float32 precision that
mt.backends.cuda.matmul's flags choose.

A configuration is (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages), from `_CONFIGS` by dtype and
size class: the table bench/matmul_tune.py measures on the GPU. Split-K is used when the output tiles would leave
most SMs idle and K is long (at least _SPLIT_K_MIN): its programs add float32 partial tiles (float64 for float64)
into a workspace with atomics, which a cast then copies out; every flag setting permits that, since the reduction is never in a
precision lower than the inputs'. Nothing here imports Triton.
"""
import functools

from minitensor.backends import active_driver, cuda as flags

from . import launcher

_INTERPRETED = active_driver().interprets_kernels

# (dtype class, size class) -> (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)
_CONFIGS = {  # bench/matmul_tune.py on an H100 (2026-11-26): the fastest of its candidates per class
    ("half", "large"): (128, 256, 64, 8, 8, 4),
    ("half", "medium"): (64, 128, 64, 8, 4, 4),
    ("half", "small"): (64, 64, 64, 8, 4, 4),
    ("tf32", "large"): (128, 256, 32, 8, 8, 3),
    ("tf32", "medium"): (128, 64, 32, 8, 4, 4),
    ("tf32", "small"): (128, 64, 32, 8, 4, 4),
    ("ieee", "large"): (64, 64, 32, 8, 4, 3),
    ("ieee", "medium"): (64, 64, 32, 8, 4, 3),
    ("ieee", "small"): (32, 32, 32, 8, 4, 2),
    ("double", "large"): (64, 64, 16, 8, 4, 3),
    ("double", "medium"): (64, 64, 32, 8, 4, 3),
    ("double", "small"): (32, 32, 32, 8, 4, 3),
}
_INTERPRETED_CONFIG = (64, 64, 64, 8, 4, 1)  # few, large programs: the interpreter's cost is per program
# the persistent TMA kernel (matmul_tma.py) for large products: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps,
# num_stages, SUBTILE), also measured by bench/matmul_tune.py; in the interpreter, small tiles and few programs,
# so that small test products still walk several tiles per program and store in halves
_TMA_CONFIGS = {  # bench/matmul_tune.py on an H100 (2026-11-26): where the best TMA candidate beat _CONFIGS' best
    ("half", "large"): (128, 256, 64, 8, 8, 3, 1),
    ("half", "medium"): (128, 128, 64, 8, 4, 4, 2),
    ("tf32", "large"): (128, 256, 32, 8, 8, 3, 2),
}
_INTERPRETED_TMA = (32, 32, 32, 8, 4, 1, 2), 3
# matmul_fma.py's Gluon kernel (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, STAGES) for float32 in IEEE arithmetic,
# where it beat matmul.py's kernel; it needs cp.async (Ampere or later) and the GPU: the interpreter cannot run Gluon
_FMA_CONFIGS = {  # bench/matmul_tune.py on an H100 (2026-11-26)
    ("ieee", "large"): (256, 128, 32, 8, 8, 3),
    ("ieee", "medium"): (128, 64, 64, 8, 8, 3),
}
_FMA_CAPABILITY = 80
_TMA_CAPABILITY = 90  # Hopper's tensor memory accelerator
_MAX_SPLIT_K = 16
_SPLIT_K_MIN = 4096  # shorter products are over in microseconds: a workspace, two more launches cost more


def precision_class(dtype_name):
    """How a product of `dtype_name` operands computes now: "half", "tf32", "ieee" (float32 by the flags) or
    "double"."""
    if dtype_name in ("float16", "bfloat16"):
        return "half"
    if dtype_name == "float64":
        return "double"
    return "tf32" if flags.use_tf32() else "ieee"


def _size_class(m, n, k):
    if m * n >= 2048 * 2048 and k >= 512:
        return "large"
    return "medium" if m * n >= 512 * 512 else "small"


def _split_k(tiles, k, block_k, device):
    """How many K ranges to split into: enough programs for the SMs when the tiles alone leave them idle."""
    if _INTERPRETED:
        return 1
    sms = active_driver().properties(device).multi_processor_count
    if tiles * 2 >= sms or k < max(_SPLIT_K_MIN, 8 * block_k):
        return 1
    return max(1, min(_MAX_SPLIT_K, sms // tiles, k // (4 * block_k)))


def _config(precision, m, n, k):
    return _INTERPRETED_CONFIG if _INTERPRETED else _CONFIGS[(precision, _size_class(m, n, k))]


def split_k(precision, batch, m, n, k, device):
    """How many K ranges a product of this shape splits into (1: none); with more, C is a float32 workspace."""
    block_m, block_n, block_k = _config(precision, m, n, k)[:3]
    return _split_k(-(-m // block_m) * -(-n // block_n) * batch, k, block_k, device)


class MatmulPlan:
    """A product's launch for one signature: `run(stream, a_ptr, b_ptr, c_ptr, bias_ptr, strides, alpha, beta,
    scratch_ptr)`, where `strides` holds the (batch, row, col) strides of A, B, C and bias, and `scratch_ptr` the
    address of `scratch_bytes` of device memory on that stream (0 when it needs none)."""
    __slots__ = ("run", "scratch_bytes")

    def __init__(self, run, scratch_bytes=0):
        self.run, self.scratch_bytes = run, scratch_bytes


@functools.lru_cache(maxsize=1024)
def matmul_plan(in_type, c_type, precision, accumulate_fp16, batch, m, n, k, bias_type, scaled, index64, aligned,
                unit_strides, tma_layout, device):
    """The MatmulPlan of one signature. `aligned`: the parameters (matmul.matmul's order) known to be multiples of
    16 (pointers: 16-byte aligned); `unit_strides`: whether A's row and column strides and B's are 1;
    `tma_layout`: C's column stride is 1 and no batch stride of a batched product is 0. With split-K (`split_k`), C
    is the workspace, set first to beta * bias."""
    acc = "fp64" if in_type == "fp64" else ("fp16" if accumulate_fp16 and in_type == "fp16" else "fp32")
    scalar = "fp64" if in_type == "fp64" else "fp32"
    if tma_layout and _tma_readable(precision, batch, m, n, k, index64, aligned, unit_strides, device):
        return _tma_plan(in_type, c_type, precision, acc, batch, m, n, k, bias_type, scaled, aligned, unit_strides,
                         device)
    if _fma_readable(precision, batch, m, n, k, index64, aligned, unit_strides, device):
        return _fma_plan(c_type, batch, m, n, k, bias_type, scaled, aligned, unit_strides, tma_layout, device)
    block_m, block_n, block_k, group_m, num_warps, num_stages = _config(precision, m, n, k)
    tiles = -(-m // block_m) * -(-n // block_n)
    splits = _split_k(tiles * batch, k, block_k, device)
    int_type = "i64" if index64 else "i32"
    types = ("*" + in_type, "*" + in_type, "*" + c_type, "*" + (bias_type or in_type), int_type, int_type,
             int_type) + (int_type,) * 12 + (scalar, scalar)
    constexprs = (block_m, block_n, block_k, group_m, splits, acc, "tf32" if precision == "tf32" else "ieee",
                  _INTERPRETED, bias_type is not None, scaled, index64) + unit_strides + (
                  m % block_m == 0 and n % block_n == 0 and k % (block_k * splits) == 0,)
    launch = launcher.get("matmul.matmul", device, types, constexprs, aligned, num_warps, num_stages)
    prepare = _bias_plan(c_type, bias_type, int_type, scalar, device) if splits > 1 else None

    def run(stream, a_ptr, b_ptr, c_ptr, bias_ptr, strides, alpha, beta, scratch_ptr):
        if prepare is not None:
            prepare(stream, c_ptr, bias_ptr, batch, m, n, strides[6:], beta)
        launch(tiles, batch, splits, stream, a_ptr, b_ptr, c_ptr, bias_ptr, m, n, k, *strides, alpha, beta)
    return MatmulPlan(run)


def _tma_readable(precision, batch, m, n, k, index64, aligned, unit_strides, device):
    """Whether the persistent TMA kernel takes this product: one of a precision and size class in _TMA_CONFIGS
    (any size in the interpreter) on Hopper or later, with 32-bit indices, each operand unit-strided along one
    matrix dim, and the pointers and other strides multiples of 16 (batch strides only matter for a batch of more
    than one)."""
    if index64:
        return False
    if _INTERPRETED:
        if precision not in ("half", "tf32"):
            return False
    else:
        props = active_driver().properties(device)
        if props.major * 10 + props.minor < _TMA_CAPABILITY or (precision, _size_class(m, n, k)) not in _TMA_CONFIGS:
            return False
    a_m1, a_k1, b_k1, b_n1 = unit_strides
    if not (a_m1 or a_k1) or not (b_k1 or b_n1):
        return False
    # parameter indices in matmul.matmul: pointers 0-3, M N K 4-6, then A's, B's, C's (batch, row, col) strides
    needed = {0, 1, 2, 8 if a_k1 else 9, 11 if b_n1 else 12, 14} | ({7, 10, 13} if batch > 1 else set())
    return needed <= set(aligned)


def _tma_plan(in_type, c_type, precision, acc, batch, m, n, k, bias_type, scaled, aligned, unit_strides, device):
    """The persistent kernel's plan: one program per SM (a few in the interpreter), each with a scratch slot."""
    if _INTERPRETED:
        (block_m, block_n, block_k, group_m, num_warps, num_stages, subtile), programs = _INTERPRETED_TMA
    else:
        block_m, block_n, block_k, group_m, num_warps, num_stages, subtile = _TMA_CONFIGS[
            (precision, _size_class(m, n, k))]
        programs = active_driver().properties(device).multi_processor_count
    a_kmajor, b_kmajor = unit_strides[1], not unit_strides[3]
    types = ("*" + in_type, "*" + in_type, "*" + c_type, "*" + (bias_type or in_type)) + ("i32",) * 13 + (
        "fp32", "fp32")
    constexprs = (block_m, block_n, block_k, group_m, programs, acc, "tf32" if precision == "tf32" else "ieee",
                  _INTERPRETED, bias_type is not None, scaled, a_kmajor, b_kmajor, subtile)
    launch, scratch = launcher.get_with_scratch("matmul_tma.matmul_tma", device, types, constexprs,
                                                tuple(i for i in aligned if i < 4), num_warps, num_stages)
    grid = min(programs, batch * -(-m // block_m) * -(-n // block_n))

    def run(stream, a_ptr, b_ptr, c_ptr, bias_ptr, strides, alpha, beta, scratch_ptr):
        a_sb, a_sm, a_sk, b_sb, b_sk, b_sn, c_sb, c_sm = strides[:8]
        if batch == 1:  # a descriptor's strides must be multiples of 16 bytes, even that of a dim of size 1
            a_sb = b_sb = c_sb = 16
        launch(grid, 1, 1, stream, a_ptr, b_ptr, c_ptr, bias_ptr, batch, m, n, k, a_sb, a_sm if a_kmajor else a_sk,
               b_sb, b_sn if b_kmajor else b_sk, c_sb, c_sm, *strides[9:], alpha, beta,
               *((scratch_ptr,) if scratch else ()))
    return MatmulPlan(run, grid * scratch)


def _fma_readable(precision, batch, m, n, k, index64, aligned, unit_strides, device):
    """Whether matmul_fma.py's kernel takes this product: a precision and size class in _FMA_CONFIGS, on a GPU that
    has cp.async and shared memory for the configuration's stages (an A100's or an H100's; not a GeForce's), with
    32-bit indices, each operand unit-strided along one matrix dim, and the pointers and the operands' other
    strides multiples of 16 (its copies move 16-byte pieces)."""
    config = _FMA_CONFIGS.get((precision, _size_class(m, n, k)))
    if _INTERPRETED or index64 or config is None:
        return False
    props = active_driver().properties(device)
    capability = props.major * 10 + props.minor
    if capability < _FMA_CAPABILITY or props.shared_memory_per_block_optin < fma_shared_bytes(config):
        return False
    a_m1, a_k1, b_k1, b_n1 = unit_strides
    if not (a_m1 or a_k1) or not (b_k1 or b_n1):
        return False
    # parameter indices as in _tma_readable
    needed = {0, 1, 8 if a_k1 else 9, 12 if b_k1 else 11} | ({7, 10} if batch > 1 else set())
    return needed <= set(aligned)


def fma_shared_bytes(config):
    """The shared memory matmul_fma.py's kernel takes with this configuration: STAGES float32 tiles of A and B."""
    block_m, block_n, block_k, _, _, stages = config
    return stages * (block_m + block_n) * block_k * 4


def _fma_plan(c_type, batch, m, n, k, bias_type, scaled, aligned, unit_strides, tma_layout, device):
    """matmul_fma.py's plan: one program per output tile, in grouped order, the batch on grid axis 1. A single
    product's batch strides are passed as 0: any other value would hide from the compiler that its row pointers
    stay 16-byte aligned, and its copies would move 4 bytes at a time. (`tma_layout` implies C's unit column
    stride.)"""
    block_m, block_n, block_k, group_m, num_warps, stages = _FMA_CONFIGS[("ieee", _size_class(m, n, k))]
    types = ("*fp32", "*fp32", "*" + c_type, "*" + (bias_type or "fp32")) + ("i32",) * 15 + ("fp32", "fp32")
    even = m % block_m == 0 and n % block_n == 0 and k % block_k == 0
    constexprs = (block_m, block_n, block_k, group_m, stages, bias_type is not None, scaled, unit_strides[1],
                  unit_strides[2], tma_layout, even)
    if batch == 1:
        aligned = tuple(sorted(set(aligned) | {7, 10, 13, 16}))
    launch = launcher.get("matmul_fma.matmul_fma", device, types, constexprs, aligned, num_warps, stages)
    tiles = -(-m // block_m) * -(-n // block_n)

    def run(stream, a_ptr, b_ptr, c_ptr, bias_ptr, strides, alpha, beta, scratch_ptr):
        if batch == 1:
            strides = (0,) + strides[1:3] + (0,) + strides[4:6] + (0,) + strides[7:9] + (0,) + strides[10:]
        launch(tiles, batch, 1, stream, a_ptr, b_ptr, c_ptr, bias_ptr, m, n, k, *strides, alpha, beta)
    return MatmulPlan(run)


def _bias_plan(c_type, bias_type, int_type, scalar, device):
    """prepare(stream, c_ptr, bias_ptr, batch, m, n, c_and_bias_strides, beta): C = beta * bias, or zeros."""
    block = 64
    types = ("*" + c_type, "*" + (bias_type or c_type)) + (int_type,) * 8 + (scalar,)
    launch = launcher.get("matmul.scaled_bias", device, types, (block, block, bias_type is not None), (), 4, 1)

    def prepare(stream, c_ptr, bias_ptr, batch, m, n, strides, beta):
        launch(-(-m // block), -(-n // block), batch, stream, c_ptr, bias_ptr, m, n, *strides, beta)
    return prepare
