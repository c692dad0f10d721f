"""The persistent matrix product for Hopper's tensor memory accelerator (TMA): C[b] = alpha * A[b] @ B[b] +
beta * bias[b] (its launch: matmul_plans.py, which picks it over matmul.py's kernel for large products whose
operands TMA can read).

PROGRAMS programs (one per SM) walk the output tiles of every batch in turn, in matmul.py's grouped order, so
no SM idles on the last partial wave of tiles and each program's next tile loads while it stores the last one.
A, B and C are read and written through tensor descriptors made in the kernel (each needs a slot of global
scratch memory, which the caller provides per program): the hardware copies whole tiles between global and
shared memory, zero-fills reads past the edges and clips writes there, so no masks are computed. A descriptor
needs a unit innermost stride: A is (batch, M, K) when K-contiguous (A_KMAJOR) or (batch, K, M) transposed,
B is (batch, N, K) when K-contiguous (B_KMAJOR) or (batch, K, N); C is (batch, M, N) row-major. Other strides
must be multiples of 16 bytes. The bias is read with plain masked loads: it may be broadcast (stride 0).
"""
import triton.language as tl

from .compat import dtype, jit
from .matmul import dot, tile


@jit
def matmul_tma(a_ptr, b_ptr, c_ptr, bias_ptr, BATCH, M, N, K, a_sb, a_s, b_sb, b_s, c_sb, c_sm,
               bias_sb, bias_sm, bias_sn, alpha, beta,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               PROGRAMS: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
               HAS_BIAS: tl.constexpr, SCALED: tl.constexpr, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr,
               SUBTILE: tl.constexpr):
    if A_KMAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr, [BATCH, M, K], [a_sb, a_s, 1], [1, BLOCK_M, BLOCK_K])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, [BATCH, K, M], [a_sb, a_s, 1], [1, BLOCK_K, BLOCK_M])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, [BATCH, N, K], [b_sb, b_s, 1], [1, BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, [BATCH, K, N], [b_sb, b_s, 1], [1, BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, [BATCH, M, N], [c_sb, c_sm, 1], [1, BLOCK_M, BLOCK_N // SUBTILE])
    tiles = BATCH * ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
    if INTERPRETED:  # Triton 3.6's interpreter cannot range() over a runtime int (see matmul.py)
        t = tl.program_id(0)
        while t < tiles:
            _output_tile(a_desc, b_desc, c_desc, c_ptr, bias_ptr, t, M, N, K, bias_sb, bias_sm, bias_sn, alpha,
                         beta, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, ACC, PRECISION, INTERPRETED, HAS_BIAS, SCALED,
                         A_KMAJOR, B_KMAJOR, SUBTILE)
            t += PROGRAMS
    else:
        for t in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
            _output_tile(a_desc, b_desc, c_desc, c_ptr, bias_ptr, t, M, N, K, bias_sb, bias_sm, bias_sn, alpha,
                         beta, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, ACC, PRECISION, INTERPRETED, HAS_BIAS, SCALED,
                         A_KMAJOR, B_KMAJOR, SUBTILE)


@jit
def _output_tile(a_desc, b_desc, c_desc, c_ptr, bias_ptr, t, M, N, K, bias_sb, bias_sm, bias_sn, alpha, beta,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 ACC: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr, HAS_BIAS: tl.constexpr,
                 SCALED: tl.constexpr, A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, SUBTILE: tl.constexpr):
    """Tile `t` of C: the batch, then the grouped (row, column) tile within it."""
    per_batch = ((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N)
    batch = t // per_batch
    pid_m, pid_n = tile(t % per_batch, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row = pid_m * BLOCK_M
    col = pid_n * BLOCK_N
    acc = tl.full((BLOCK_M, BLOCK_N), 0, dtype(ACC))
    steps = (K + BLOCK_K - 1) // BLOCK_K
    if INTERPRETED:
        k = 0
        while k < steps:
            acc = _step(acc, a_desc, b_desc, batch, row, col, k * BLOCK_K, BLOCK_M, BLOCK_N, BLOCK_K, ACC,
                        PRECISION, INTERPRETED, A_KMAJOR, B_KMAJOR)
            k += 1
    else:
        for k in range(steps):
            acc = _step(acc, a_desc, b_desc, batch, row, col, k * BLOCK_K, BLOCK_M, BLOCK_N, BLOCK_K, ACC,
                        PRECISION, INTERPRETED, A_KMAJOR, B_KMAJOR)
    if SCALED:
        acc = acc * alpha
    if HAS_BIAS:
        rows = row + tl.arange(0, BLOCK_M)
        cols = col + tl.arange(0, BLOCK_N)
        bias = tl.load(bias_ptr + batch * bias_sb + rows[:, None] * bias_sm + cols[None, :] * bias_sn,
                       mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
        acc += bias.to(dtype(ACC)) * beta
    out = acc.to(c_ptr.dtype.element_ty)
    if SUBTILE == 2:  # two half-width stores: the second half converts while the first one's copy runs
        left, right = tl.split(tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
        c_desc.store([batch, row, col], tl.reshape(left, (1, BLOCK_M, BLOCK_N // 2)))
        c_desc.store([batch, row, col + BLOCK_N // 2], tl.reshape(right, (1, BLOCK_M, BLOCK_N // 2)))
    else:
        c_desc.store([batch, row, col], tl.reshape(out, (1, BLOCK_M, BLOCK_N)))


@jit
def _step(acc, a_desc, b_desc, batch, row, col, k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
          BLOCK_K: tl.constexpr, ACC: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
          A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr):
    """acc + the BLOCK_K slice at `k` of A's tile rows times B's tile columns."""
    if A_KMAJOR:
        a = tl.reshape(a_desc.load([batch, row, k]), (BLOCK_M, BLOCK_K))
    else:
        a = tl.reshape(a_desc.load([batch, k, row]), (BLOCK_K, BLOCK_M)).T
    if B_KMAJOR:
        b = tl.reshape(b_desc.load([batch, col, k]), (BLOCK_N, BLOCK_K)).T
    else:
        b = tl.reshape(b_desc.load([batch, k, col]), (BLOCK_K, BLOCK_N))
    return dot(acc, a, b, ACC, PRECISION, INTERPRETED)
