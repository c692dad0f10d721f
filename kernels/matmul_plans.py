"""Launch plans of the matrix product (kernels/matmul.py): the tile configuration per shape and dtype, split-K for
tall, skinny products, and the float32 precision that mt.backends.cuda.matmul's flags choose.

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


@functools.lru_cache(maxsize=1024)
def matmul_plan(in_type, c_type, precision, accumulate_fp16, batch, m, n, k, bias_type, scaled, index64, aligned,
                unit_strides, device):
    """The product's launch for one signature: run(stream, a_ptr, b_ptr, c_ptr, bias_ptr, strides, alpha,
    beta), where `strides` holds the (batch, row, col) strides of A, B, C and bias. `aligned`: the parameters
    (kernel order) known to be multiples of 16 (pointers: 16-byte aligned); `unit_strides`: whether A's row and
    column strides and B's are 1. With split-K (`split_k`), C is the workspace, set first to beta * bias."""
    block_m, block_n, block_k, group_m, num_warps, num_stages = _config(precision, m, n, k)
    tiles = -(-m // block_m) * -(-n // block_n)
    splits = _split_k(tiles * batch, k, block_k, device)
    acc = "fp64" if in_type == "fp64" else ("fp16" if accumulate_fp16 and in_type == "fp16" else "fp32")
    int_type = "i64" if index64 else "i32"
    scalar = "fp64" if in_type == "fp64" else "fp32"
    types = ("*" + in_type, "*" + in_type, "*" + c_type, "*" + (bias_type or in_type), int_type, int_type,
             int_type) + (int_type,) * 12 + (scalar, scalar)
    constexprs = (block_m, block_n, block_k, group_m, splits, acc, "tf32" if precision == "tf32" else "ieee",
                  _INTERPRETED, bias_type is not None, scaled, index64) + unit_strides + (
                  m % block_m == 0 and n % block_n == 0 and k % (block_k * splits) == 0,)
    launch = launcher.get("matmul.matmul", device, types, constexprs, aligned, num_warps, num_stages)
    prepare = _bias_plan(c_type, bias_type, int_type, scalar, device) if splits > 1 else None

    def run(stream, a_ptr, b_ptr, c_ptr, bias_ptr, strides, alpha, beta):
        if prepare is not None:
            prepare(stream, c_ptr, bias_ptr, batch, m, n, strides[6:], beta)
        launch(tiles, batch, splits, stream, a_ptr, b_ptr, c_ptr, bias_ptr, m, n, k, *strides, alpha, beta)
    return run


def _bias_plan(c_type, bias_type, int_type, scalar, device):
    """prepare(stream, c_ptr, bias_ptr, batch, m, n, c_and_bias_strides, beta): C = beta * bias, or zeros."""
    block = 64
    types = ("*" + c_type, "*" + (bias_type or c_type)) + (int_type,) * 8 + (scalar,)
    launch = launcher.get("matmul.scaled_bias", device, types, (block, block, bias_type is not None), (), 4, 1)

    def prepare(stream, c_ptr, bias_ptr, batch, m, n, strides, beta):
        launch(-(-m // block), -(-n // block), batch, stream, c_ptr, bias_ptr, m, n, *strides, beta)
    return prepare
