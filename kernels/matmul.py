"""Matrix products: C[b] = alpha * A[b] @ B[b] + beta * bias[b] (its launches: matmul_plans.py).

One program computes a BLOCK_M x BLOCK_N tile of C for one batch (grid axis 1) with `tl.dot` over K, in the
GROUP_M-grouped order of Triton's matmul tutorial so that neighbouring programs share A's rows in L2. Every
operand is read through its strides, so transposed and sliced inputs need no copy; a unit stride (A_K1, A_M1,
B_K1, B_N1) is a constant, so that the compiler sees contiguous addresses and loads them as vectors. With SPLIT_K > 1 (tall,
skinny products: few tiles, long K) program axis 2 takes one K range each and adds its partial tile into C with
atomics, C having been set to the epilogue's beta * bias first; otherwise one program owns its tile and writes
it once. float32 operands use PRECISION ("ieee" or "tf32", mt.backends.cuda.matmul). INTERPRETED marks the
simulator's interpreter, whose dot neither rounds float32 to tf32 (done here first) nor takes bfloat16 (widened
to float32 first, exact: the products are then summed in float32, as on the GPU).
"""
import triton.language as tl

from .compat import dtype, jit, narrow, widen


@jit
def _round_to_tf32(x):
    """float32 `x` rounded to tf32's 10-bit mantissa (to nearest, ties away, as cvt.rna.tf32 does)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, rounded)


@jit
def tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of program `pid`, grouped: GROUP_M row tiles walk the columns together."""
    tiles_m = (M + BLOCK_M - 1) // BLOCK_M
    tiles_n = (N + BLOCK_N - 1) // BLOCK_N
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    return first_m + (pid % in_group) % group_m, (pid % in_group) // group_m


@jit
def _step(acc, a_ptrs, b_ptrs, rows, cols, M, N, left, BLOCK_K: tl.constexpr, ACC: tl.constexpr,
          PRECISION: tl.constexpr, INTERPRETED: tl.constexpr, EVEN: tl.constexpr):
    """acc + one BLOCK_K slice of A's rows times B's columns (`left`: the K still to go from here)."""
    if EVEN:  # M, N and K fill whole tiles: no masks, so the loads need no predicates
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        a = tl.load(a_ptrs, mask=(rows[:, None] < M) & (tl.arange(0, BLOCK_K)[None, :] < left), other=0.0)
        b = tl.load(b_ptrs, mask=(tl.arange(0, BLOCK_K)[:, None] < left) & (cols[None, :] < N), other=0.0)
    return dot(acc, a, b, ACC, PRECISION, INTERPRETED)


@jit
def dot(acc, a, b, ACC: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """acc + a @ b on the tensor cores; in the interpreter, with their tf32 rounding and bfloat16 widened."""
    if INTERPRETED and PRECISION == "tf32":
        a = _round_to_tf32(a)
        b = _round_to_tf32(b)
    if INTERPRETED and a.dtype == tl.bfloat16:
        a = widen(a)
        b = widen(b)
    return tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=dtype(ACC))


@jit
def matmul(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
           a_sb, a_sm, a_sk, b_sb, b_sk, b_sn, c_sb, c_sm, c_sn, bias_sb, bias_sm, bias_sn, alpha, beta,
           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
           SPLIT_K: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
           HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, INDEX64: tl.constexpr, A_M1: tl.constexpr,
           A_K1: tl.constexpr, B_K1: tl.constexpr, B_N1: tl.constexpr, EVEN: tl.constexpr):
    if A_M1:
        a_sm = 1
    if A_K1:
        a_sk = 1
    if B_K1:
        b_sk = 1
    if B_N1:
        b_sn = 1
    pid_m, pid_n = tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1)
    split = tl.program_id(2)
    if INDEX64:
        batch = batch.to(tl.int64)
        pid_m = pid_m.to(tl.int64)
        pid_n = pid_n.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = split * BLOCK_K + tl.arange(0, BLOCK_K)
    # masks, not clamped offsets, keep the edges in bounds: a clamp would hide from the compiler that the offsets
    # are runs of consecutive values, and the loads would not vectorise
    a_ptrs = a_ptr + batch * a_sb + rows[:, None] * a_sm + ks[None, :] * a_sk
    b_ptrs = b_ptr + batch * b_sb + ks[:, None] * b_sk + cols[None, :] * b_sn
    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype(ACC))  # tl.zeros is a @jit the interpreter cannot call
    steps = (K + BLOCK_K * SPLIT_K - 1) // (BLOCK_K * SPLIT_K)
    if INTERPRETED:  # Triton 3.6's interpreter cannot range() over a runtime int (numpy 2 refuses int() of its
        k = 0  # one-element arrays) but can compare one: a while loop there, the pipelined for loop on a GPU
        while k < steps:
            acc = _step(acc, a_ptrs, b_ptrs, rows, cols, M, N, K - k * BLOCK_K * SPLIT_K - split * BLOCK_K,
                        BLOCK_K, ACC, PRECISION, INTERPRETED, EVEN)
            a_ptrs += BLOCK_K * SPLIT_K * a_sk
            b_ptrs += BLOCK_K * SPLIT_K * b_sk
            k += 1
    else:
        for k in range(0, steps):
            acc = _step(acc, a_ptrs, b_ptrs, rows, cols, M, N, K - k * BLOCK_K * SPLIT_K - split * BLOCK_K,
                        BLOCK_K, ACC, PRECISION, INTERPRETED, EVEN)
            a_ptrs += BLOCK_K * SPLIT_K * a_sk
            b_ptrs += BLOCK_K * SPLIT_K * b_sk
    if SCALED:
        acc = acc * alpha
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    c_ptrs = c_ptr + batch * c_sb + rows[:, None] * c_sm + cols[None, :] * c_sn
    if SPLIT_K == 1:
        if HAS_BIAS:
            bias = tl.load(bias_ptr + batch * bias_sb + rows[:, None] * bias_sm + cols[None, :] * bias_sn,
                           mask=mask, other=0.0)
            acc += widen(bias).to(dtype(ACC)) * beta
        tl.store(c_ptrs, narrow(acc, c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask, sem="relaxed")


@jit
def scaled_bias(c_ptr, bias_ptr, M, N, c_sb, c_sm, c_sn, bias_sb, bias_sm, bias_sn, beta,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr):
    """C = beta * bias (or 0): where split-K programs then add their partial products."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    batch = tl.program_id(2)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    value = tl.full((BLOCK_M, BLOCK_N), 0, tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + batch * bias_sb + rows[:, None] * bias_sm + cols[None, :] * bias_sn, mask=mask,
                       other=0.0)
        value = widen(bias).to(tl.float32) * beta
    tl.store(c_ptr + batch * c_sb + rows[:, None] * c_sm + cols[None, :] * c_sn, narrow(value, c_ptr.dtype.element_ty),
             mask=mask)
