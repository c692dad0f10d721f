"""Elementwise kernels: fill, strided copy with dtype cast, binary arithmetic (their launches: plans.py).

Each comes in two forms. `*_contiguous` takes flat unit-stride operands (few arguments, vector loads);
`*_strided` takes up to four dims, right-aligned, and computes each operand's offset from the linear index
by div/mod. Indices are 32-bit unless some extent needs 64 bits (INDEX64). COMPUTE names the Triton type the
arithmetic runs in.
"""
import triton.language as tl

from .compat import dtype, jit, libdevice, narrow, widen


@jit
def _linear_offsets(INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    return pid * BLOCK + tl.arange(0, BLOCK)


@jit
def _strided_offset(i, s1, s2, s3, t0, t1, t2, t3, RANK: tl.constexpr):
    """Offset of linear index i in a right-aligned (s0, s1, s2, s3) layout with strides t0..t3."""
    if RANK == 1:
        off = i * t3
    elif RANK == 2:
        off = (i % s3) * t3 + (i // s3) * t2
    elif RANK == 3:
        off = (i % s3) * t3
        i = i // s3
        off += (i % s2) * t2 + (i // s2) * t1
    else:
        off = (i % s3) * t3
        i = i // s3
        off += (i % s2) * t2
        i = i // s2
        off += (i % s1) * t1 + (i // s1) * t0
    return off


@jit
def _cast(x, OUT_BOOL: tl.constexpr, out_ty):
    """Convert to the output's element type as torch does: half types through float32 (the only bfloat16
    conversions Triton's interpreter has; `widen` and `narrow` make them exact there), then to bool by `!= 0`
    (-0.0 is False, nan True), and from a float to uint8 through int64, as c10's cast does (the GPU's own
    conversion would clamp -2.0 to 0, not 254)."""
    x = widen(x)
    if OUT_BOOL:
        return x != 0
    if tl.constexpr(out_ty.is_fp16() or out_ty.is_bf16()):
        x = x.to(tl.float32)
    if tl.constexpr(out_ty == tl.uint8 and x.dtype.is_floating()):
        x = x.to(tl.int64)
    return narrow(x, out_ty)


@jit
def _int_pow(x, y, BITS: tl.constexpr):
    """x ** y for integers by squaring, over every bit of the exponent; negative exponents give what torch
    gives: 1 for a base of 1, +-1 for -1, else 0."""
    base = x + y * 0
    e = y + x * 0
    r = base * 0 + 1
    for _ in tl.static_range(BITS):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    if tl.constexpr(x.dtype.is_int_unsigned()):
        return r  # no negative exponent, no base of -1 (and Triton 3.9 refuses comparing one with -1)
    else:
        odd = (y & 1) != 0
        unit = tl.where(x == 1, 1, tl.where(x == -1, tl.where(odd, -1, 1), 0))
        return tl.where(y < 0, unit.to(r.dtype), r)


@jit
def _div(x, y):
    """Correctly rounded, as torch's: float32's `/` compiles to an approximate division on the GPU."""
    if tl.constexpr(x.dtype == tl.float32):
        return tl.math.div_rn(x, y)
    else:
        return x / y


@jit
def _fmod(x, y):
    """C's fmod, exact: the GPU's own float `%` is x - y * trunc(x / y) in the operands' precision, off by up to
    about |x| times its epsilon once the quotient outgrows the mantissa (float32 3e22 % 7 gave 8.4e14, not 3)."""
    if tl.constexpr(x.dtype.is_floating()):
        return libdevice.fmod(x, y)
    else:
        return x % y  # integers: C's remainder, the sign of x


@jit
def _floor_divide(x, y):
    """Python's floor division. For floats, torch's exact form: (x - fmod(x, y)) / y, corrected to the
    floor; a zero divisor gives x / y (inf or nan)."""
    if tl.constexpr(x.dtype.is_floating()):
        mod = _fmod(x, y)
        div = _div(x - mod, y)
        div = tl.where((mod != 0) & ((y < 0) != (mod < 0)), div - 1, div)
        floored = tl.math.floor(div)
        floored = tl.where(div - floored > 0.5, floored + 1, floored)
        zero = _div(x, y) * 0  # a zero quotient keeps the sign of x / y
        r = tl.where(div != 0, floored, zero)
        return tl.where(y == 0, _div(x, y), r)
    else:
        q = x // y  # truncates toward zero
        return tl.where(((x % y) != 0) & ((x < 0) != (y < 0)), q - 1, q)


@jit
def _remainder(x, y):
    """Python's modulo, as torch's kernels compute it: fmod, then the divisor added where the signs differ (the
    result takes the divisor's sign; a zero keeps fmod's, the dividend's). Half-type operands (remainder computes
    in its result type, ops/pointwise.py) in float32."""
    x = widen(x)
    y = widen(y)
    r = _fmod(x, y)
    return tl.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)


@jit
def _binary_op(x, y, OP: tl.constexpr):
    """Binary op codes, as kernels/plans.py names them."""
    if OP == 0:
        r = x + y
    elif OP == 1:
        r = x - y
    elif OP == 2:
        r = x * y
    elif OP == 3:
        r = _div(x, y)
    elif OP == 4:
        r = x | y
    elif OP == 5:
        r = x & y
    elif OP == 6:
        r = x ^ y
    elif OP == 7:
        r = _floor_divide(x, y)
    elif OP == 8:
        r = _remainder(x, y)
    elif OP == 9:
        if tl.constexpr(x.dtype.is_floating()):
            r = libdevice.pow(x, y)
        else:
            r = _int_pow(x, y, x.dtype.primitive_bitwidth)
    elif OP == 10:
        if tl.constexpr(x.dtype.is_floating()):
            r = tl.maximum(x, y, propagate_nan=tl.PropagateNan.ALL)
        else:
            r = tl.maximum(x, y)
    elif OP == 11:
        if tl.constexpr(x.dtype.is_floating()):
            r = tl.minimum(x, y, propagate_nan=tl.PropagateNan.ALL)
        else:
            r = tl.minimum(x, y)
    elif OP == 12:
        r = x == y
    elif OP == 13:
        r = x != y
    elif OP == 14:
        r = x < y
    elif OP == 15:
        r = x <= y
    elif OP == 16:
        r = x > y
    elif OP == 17:
        r = x >= y
    elif OP == 18:  # logical and, or, xor: as where and != (the interpreter's & fails on a scalar operand)
        r = tl.where(x != 0, y != 0, False)
    elif OP == 19:
        r = tl.where(x != 0, True, y != 0)
    else:
        r = (x != 0) != (y != 0)
    return r


@jit
def _sqrt(x):
    """Correctly rounded, as torch's: float32's sqrt is approximate unless asked for _rn."""
    if tl.constexpr(x.dtype == tl.float32):
        return tl.math.sqrt_rn(x)
    else:
        return tl.sqrt(x)


@jit
def _unary_op(x, OP: tl.constexpr):
    """Unary op codes, as kernels/plans.py names them. Math functions get float inputs."""
    if OP == 0:
        r = -x
    elif OP == 1:
        r = tl.abs(x)
    elif OP == 2:
        r = tl.exp(x)
    elif OP == 3:
        r = tl.log(x)
    elif OP == 4:
        r = _sqrt(x)
    elif OP == 5:
        r = 1 / _sqrt(x)
    elif OP == 6:
        r = tl.sin(x)
    elif OP == 7:
        r = tl.cos(x)
    elif OP == 8:
        r = libdevice.tanh(x)
    elif OP == 9:
        r = 1 / (1 + tl.exp(-x))
    elif OP == 10:
        r = tl.where(x < 0, 0, x).to(x.dtype)  # nan stays nan, as torch's relu
    elif OP == 11:
        r = tl.math.floor(x) if tl.constexpr(x.dtype.is_floating()) else x
    elif OP == 12:
        r = tl.math.ceil(x) if tl.constexpr(x.dtype.is_floating()) else x
    elif OP == 13:
        r = libdevice.rint(x) if tl.constexpr(x.dtype.is_floating()) else x  # half to even, as torch
    elif OP == 14:
        r = x ^ (x * 0 - 1)  # ~x, in a form the interpreter also gets right for unsigned types
    else:
        r = x == 0
    return r


@jit
def _ternary_op(x, y, z, OP: tl.constexpr, Y_ABSENT: tl.constexpr, Z_ABSENT: tl.constexpr):
    """0: where(x, y, z); 1: clamp(x, min=y, max=z), either bound absent; nan in any operand gives nan."""
    if OP == 0:
        r = tl.where(x, y, z)
    else:
        r = x
        if not Y_ABSENT:
            r = _binary_op(r, y, 10)
        if not Z_ABSENT:
            r = _binary_op(r, z, 11)
    return r


@jit
def _operand(ptr, scalar, offs, mask, KIND: tl.constexpr, COMPUTE: tl.constexpr):
    """An operand in the compute type: loaded at `offs` (KIND 0), a kernel scalar (1) or absent (2, a dummy)."""
    if KIND == 0:
        v = _cast(tl.load(ptr + offs, mask=mask), False, dtype(COMPUTE))
    else:
        v = _cast(scalar, False, dtype(COMPUTE))
    return v


@jit
def fill_contiguous(dst_ptr, value, n, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    v = _cast(value, OUT_BOOL, dst_ptr.dtype.element_ty)
    tl.store(dst_ptr + offs, tl.full([BLOCK], 0, dst_ptr.dtype.element_ty) + v, mask=offs < n)


@jit
def fill_strided(dst_ptr, value, n, s1, s2, s3, o0, o1, o2, o3, OUT_BOOL: tl.constexpr, RANK: tl.constexpr,
                 INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    v = _cast(value, OUT_BOOL, dst_ptr.dtype.element_ty)
    dst = dst_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, tl.full([BLOCK], 0, dst_ptr.dtype.element_ty) + v, mask=offs < n)


@jit
def copy_contiguous(src_ptr, dst_ptr, n, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask)
    tl.store(dst_ptr + offs, _cast(x, OUT_BOOL, dst_ptr.dtype.element_ty), mask=mask)


@jit
def copy_strided(src_ptr, dst_ptr, n, s1, s2, s3, i0, i1, i2, i3, o0, o1, o2, o3, OUT_BOOL: tl.constexpr,
                 RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + _strided_offset(offs, s1, s2, s3, i0, i1, i2, i3, RANK), mask=mask)
    dst = dst_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, _cast(x, OUT_BOOL, dst_ptr.dtype.element_ty), mask=mask)


@jit
def copy_transposed(src_ptr, dst_ptr, R, C, s_b, s_c, d_b, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[b, r, c] = src[b, r, c], dst row-major and src unit-strided along r (a transposed view), in tiles: the
    loads run along r and the stores along c, both coalesced, the compiler transposing through shared memory
    (copy_strided's element order would leave the reads scattered)."""
    batch = tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if INDEX64:
        batch = batch.to(tl.int64)
        rows = rows.to(tl.int64)
        cols = cols.to(tl.int64)
    mask = (rows[:, None] < R) & (cols[None, :] < C)
    x = tl.load(src_ptr + batch * s_b + rows[:, None] + cols[None, :] * s_c, mask=mask)
    dst = dst_ptr + batch * d_b + rows[:, None] * C + cols[None, :]
    tl.store(dst, _cast(x, OUT_BOOL, dst_ptr.dtype.element_ty), mask=mask)


@jit
def unary_contiguous(x_ptr, out_ptr, n, OP: tl.constexpr, COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr,
                     INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = _cast(tl.load(x_ptr + offs, mask=mask), False, dtype(COMPUTE))
    tl.store(out_ptr + offs, _cast(_unary_op(x, OP), OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


@jit
def unary_strided(x_ptr, out_ptr, n, s1, s2, s3, x0, x1, x2, x3, o0, o1, o2, o3, OP: tl.constexpr,
                  COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr, RANK: tl.constexpr, INDEX64: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + _strided_offset(offs, s1, s2, s3, x0, x1, x2, x3, RANK), mask=mask)
    r = _unary_op(_cast(x, False, dtype(COMPUTE)), OP)
    dst = out_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, _cast(r, OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


@jit
def binary_contiguous(a_ptr, b_ptr, out_ptr, a_scalar, b_scalar, n, OP: tl.constexpr, A_KIND: tl.constexpr,
                      B_KIND: tl.constexpr, COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr,
                      INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = _operand(a_ptr, a_scalar, offs, mask, A_KIND, COMPUTE)
    y = _operand(b_ptr, b_scalar, offs, mask, B_KIND, COMPUTE)
    tl.store(out_ptr + offs, _cast(_binary_op(x, y, OP), OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


@jit
def binary_strided(a_ptr, b_ptr, out_ptr, a_scalar, b_scalar, n, s1, s2, s3, a0, a1, a2, a3, b0, b1, b2, b3,
                   o0, o1, o2, o3, OP: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr,
                   COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr, RANK: tl.constexpr, INDEX64: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = _operand(a_ptr, a_scalar, _strided_offset(offs, s1, s2, s3, a0, a1, a2, a3, RANK), mask, A_KIND, COMPUTE)
    y = _operand(b_ptr, b_scalar, _strided_offset(offs, s1, s2, s3, b0, b1, b2, b3, RANK), mask, B_KIND, COMPUTE)
    dst = out_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, _cast(_binary_op(x, y, OP), OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


@jit
def ternary_contiguous(a_ptr, b_ptr, c_ptr, out_ptr, a_scalar, b_scalar, c_scalar, n, OP: tl.constexpr,
                       A_KIND: tl.constexpr, B_KIND: tl.constexpr, C_KIND: tl.constexpr, A_COMPUTE: tl.constexpr,
                       COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = _operand(a_ptr, a_scalar, offs, mask, A_KIND, A_COMPUTE)
    y = _operand(b_ptr, b_scalar, offs, mask, B_KIND, COMPUTE)
    z = _operand(c_ptr, c_scalar, offs, mask, C_KIND, COMPUTE)
    r = _ternary_op(x, y, z, OP, B_KIND == 2, C_KIND == 2)
    tl.store(out_ptr + offs, _cast(r, OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


@jit
def ternary_strided(a_ptr, b_ptr, c_ptr, out_ptr, a_scalar, b_scalar, c_scalar, n, s1, s2, s3, a0, a1, a2, a3,
                    b0, b1, b2, b3, c0, c1, c2, c3, o0, o1, o2, o3, OP: tl.constexpr, A_KIND: tl.constexpr,
                    B_KIND: tl.constexpr, C_KIND: tl.constexpr, A_COMPUTE: tl.constexpr, COMPUTE: tl.constexpr,
                    OUT_BOOL: tl.constexpr, RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = _operand(a_ptr, a_scalar, _strided_offset(offs, s1, s2, s3, a0, a1, a2, a3, RANK), mask, A_KIND, A_COMPUTE)
    y = _operand(b_ptr, b_scalar, _strided_offset(offs, s1, s2, s3, b0, b1, b2, b3, RANK), mask, B_KIND, COMPUTE)
    z = _operand(c_ptr, c_scalar, _strided_offset(offs, s1, s2, s3, c0, c1, c2, c3, RANK), mask, C_KIND, COMPUTE)
    r = _ternary_op(x, y, z, OP, B_KIND == 2, C_KIND == 2)
    dst = out_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, _cast(r, OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)
