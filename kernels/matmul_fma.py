"""The float32 matrix product in IEEE arithmetic on the CUDA cores, for large products on the GPU: C[b] = alpha *
A[b] @ B[b] + beta * bias[b] (its launch: matmul_plans.py, which picks it where `_FMA_CONFIGS` lists the size).

Written in Gluon, Triton's language with explicit layouts, because the layout is what decides the speed of an FMA
product: Triton lowers an ieee `tl.dot` on a layout it picks itself (a thread owns a 4x4 block of C and loads
its A and B values apart), which peaked at 45 TFLOP/s on an H100 against cuBLAS's 50 to 52. Here each thread
owns 4x4 blocks of C repeated a whole CTA's width apart (so a warp's shared memory reads stay contiguous), 16x8
values in the large configuration, reading each of its A and B values once per k, 16 bytes at a time; A and B go
from global to shared memory by cp.async, STAGES - 1 tiles ahead, zero-filled past the edges by the masks. A
shared tile read along K is swizzled so the threads of a warp, which read rows (or columns) 4 apart, hit
different banks.

A_KMAJOR: A's K stride is 1 (else its M stride is); B_KMAJOR: B's K stride is 1 (else its N stride is); C_N1:
C's column stride is 1. The simulator's interpreter cannot run Gluon: there matmul.py's kernel computes every
product.
"""
from triton import constexpr_function
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from . import compat

_async_load = compat.async_load()
_K_SLICE = gl.constexpr(16)  # the K of one dot_fma: operands go from shared memory to registers a slice at a time


@constexpr_function
def _accumulator_layout(num_warps):
    """C's tile across the CTA: 4x4 per thread, 4x8 threads per warp, warps two across; a tile larger than the
    CTA's 16 * num_warps / 2 x 64 repeats it, giving each thread one more 4x4 block per repeat."""
    return gl.BlockedLayout([4, 4], [4, 8], [num_warps // 2, 2], [1, 0])


@constexpr_function
def _copy_layout(rows, cols, contiguous_dim, num_warps):
    """How the threads of a CTA copy a rows x cols tile in 16-byte pieces along its contiguous dim."""
    if contiguous_dim == 1:
        across = min(32, cols // 4)
        return gl.BlockedLayout([1, 4], [32 // across, across], [num_warps, 1], [1, 0])
    across = min(32, rows // 4)
    return gl.BlockedLayout([4, 1], [across, 32 // across], [1, num_warps], [0, 1])


@constexpr_function
def _shared_layout(block_k, k_contiguous, contiguous_dim):
    """A tile in shared memory, contiguous along `contiguous_dim`; read along K (`k_contiguous`), its 16-byte
    pieces are XOR-swizzled by the row (column) / 4, so the 4 or 8 threads reading rows 4 apart hit other banks."""
    order = [contiguous_dim, 1 - contiguous_dim]
    if k_contiguous:
        return gl.SwizzledSharedLayout(4, 4, min(8, block_k // 4), order)
    return gl.SwizzledSharedLayout(1, 1, 1, order)


@gluon.jit
def _grouped_tile(pid, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(row tile, column tile) of program `pid` in matmul.py's grouped order (GROUP_M row tiles sweep the columns
    together, sharing B's columns in L2)."""
    group_size = GROUP_M * gl.cdiv(N, BLOCK_N)
    first_row = pid // group_size * GROUP_M
    rows_in_group = gl.minimum(gl.cdiv(M, BLOCK_M) - first_row, GROUP_M)
    return first_row + pid % group_size % rows_in_group, pid % group_size // rows_in_group


@gluon.jit
def _load_tile(smem, ptrs, step, k_stride, rows, row_limit, ks, K, ROW_DIM: gl.constexpr, BLOCK_K: gl.constexpr,
               EVEN: gl.constexpr):
    """Start copying K tile `step` of an operand into `smem`: `rows` index its M (N) dim, `ks` its K dim, and
    ROW_DIM is the M (N) dim of the tile (0 for A, 1 for B); past the edges the copy writes zeros."""
    offset = step * BLOCK_K * k_stride
    if EVEN:
        _async_load(smem, ptrs + offset)
    elif ROW_DIM == 0:
        mask = (rows[:, None] < row_limit) & (ks[None, :] < K - step * BLOCK_K)
        _async_load(smem, ptrs + offset, mask=mask)
    else:
        mask = (ks[:, None] < K - step * BLOCK_K) & (rows[None, :] < row_limit)
        _async_load(smem, ptrs + offset, mask=mask)


@gluon.jit
def matmul_fma(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
               a_sb, a_sm, a_sk, b_sb, b_sk, b_sn, c_sb, c_sm, c_sn, bias_sb, bias_sm, bias_sn, alpha, beta,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
               STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, SCALED: gl.constexpr, A_KMAJOR: gl.constexpr,
               B_KMAJOR: gl.constexpr, C_N1: gl.constexpr, EVEN: gl.constexpr):
    if A_KMAJOR:
        a_sk = 1
    else:
        a_sm = 1
    if B_KMAJOR:
        b_sk = 1
    else:
        b_sn = 1
    if C_N1:
        c_sn = 1
    warps: gl.constexpr = gl.num_warps()
    acc_layout: gl.constexpr = _accumulator_layout(warps)
    a_copy: gl.constexpr = _copy_layout(BLOCK_M, BLOCK_K, 1 if A_KMAJOR else 0, warps)
    b_copy: gl.constexpr = _copy_layout(BLOCK_K, BLOCK_N, 0 if B_KMAJOR else 1, warps)
    a_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M, BLOCK_K],
                                       _shared_layout(BLOCK_K, A_KMAJOR, 1 if A_KMAJOR else 0))
    b_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_K, BLOCK_N],
                                       _shared_layout(BLOCK_K, B_KMAJOR, 0 if B_KMAJOR else 1))

    pid_m, pid_n = _grouped_tile(gl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = gl.program_id(1)
    a_rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, a_copy))
    a_ks = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, a_copy))
    b_ks = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(1, b_copy))
    b_cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, b_copy))
    a_ptrs = a_ptr + batch * a_sb + a_rows[:, None] * a_sm + a_ks[None, :] * a_sk
    b_ptrs = b_ptr + batch * b_sb + b_ks[:, None] * b_sk + b_cols[None, :] * b_sn
    steps = gl.cdiv(K, BLOCK_K)
    for s in gl.static_range(STAGES - 1):
        if s < steps:
            _load_tile(a_smem.index(s), a_ptrs, s, a_sk, a_rows, M, a_ks, K, 0, BLOCK_K, EVEN)
            _load_tile(b_smem.index(s), b_ptrs, s, b_sk, b_cols, N, b_ks, K, 1, BLOCK_K, EVEN)
        async_copy.commit_group()

    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for step in range(steps):
        async_copy.wait_group(STAGES - 2)  # this step's tile has landed (each step commits one group)
        ahead = step + STAGES - 1  # into the stage the previous step read, which every thread has finished
        if ahead < steps:
            _load_tile(a_smem.index(ahead % STAGES), a_ptrs, ahead, a_sk, a_rows, M, a_ks, K, 0, BLOCK_K, EVEN)
            _load_tile(b_smem.index(ahead % STAGES), b_ptrs, ahead, b_sk, b_cols, N, b_ks, K, 1, BLOCK_K, EVEN)
        async_copy.commit_group()
        a_tile = a_smem.index(step % STAGES)
        b_tile = b_smem.index(step % STAGES)
        for k in gl.static_range(0, BLOCK_K, _K_SLICE):
            a = a_tile.slice(k, _K_SLICE, dim=1).load(gl.DotOperandLayout(0, acc_layout, 0))
            b = b_tile.slice(k, _K_SLICE, dim=0).load(gl.DotOperandLayout(1, acc_layout, 0))
            acc = gl.dot_fma(a, b, acc)
    async_copy.wait_group(0)

    if SCALED:
        acc = acc * alpha
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    cols = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if HAS_BIAS:
        bias = gl.load(bias_ptr + batch * bias_sb + rows[:, None] * bias_sm + cols[None, :] * bias_sn, mask=mask,
                       other=0.0)
        acc += bias.to(gl.float32) * beta
    c_ptrs = c_ptr + batch * c_sb + rows[:, None] * c_sm + cols[None, :] * c_sn
    gl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
