"""Complex elementwise kernels: fill, copy with cast, unary (neg, conj, abs, and the float functions of
complex_math.py), binary arithmetic (pow too) and comparisons, and `where` (their launches: plans.py).

Triton has no complex type. A complex tensor is its component floats interleaved, (real, imag): pointers are
typed as the component (`*fp32` for complex64) and offsets count complex elements, so element `o` is the
floats at 2*o and 2*o + 1. The doubling runs in 64 bits: an offset that fits 32 bits may not once doubled.
Operand kinds (plans.py names them): 0 a complex tensor, 1 a (real, imag) pair of kernel scalars, 3 a real
tensor (imaginary part 0). OUT_KIND 0 stores (real, imag) pairs, 1 one real value per element. As
elementwise.py, each kernel has a `*_contiguous` and a `*_strided` (up to four right-aligned dims) form.
"""
import triton.language as tl

from . import complex_math
from .compat import dtype, jit, libdevice, widen
from .elementwise import _cast, _linear_offsets, _strided_offset


@jit
def _load(ptr, re_scalar, im_scalar, offs, mask, KIND: tl.constexpr, COMPUTE: tl.constexpr):
    """(real, imag) of an operand in the component type COMPUTE."""
    ty = dtype(COMPUTE)
    if KIND == 0:
        pair = offs.to(tl.int64) * 2
        re = tl.load(ptr + pair, mask=mask).to(ty)
        im = tl.load(ptr + pair + 1, mask=mask).to(ty)
    elif KIND == 3:
        x = tl.load(ptr + offs, mask=mask)
        x = widen(x)  # half types to float32 first: the interpreter widens halves only to float32
        re = x.to(ty)
        im = tl.full(re.shape, 0, ty)
    else:
        re = re_scalar.to(ty)
        im = im_scalar.to(ty)
    return re, im


@jit
def _store(out_ptr, offs, mask, re, im, OUT_KIND: tl.constexpr, OUT_BOOL: tl.constexpr):
    """A complex output gets both parts; a real one the real part (a bool one: whether either part is
    nonzero), cast as copies cast."""
    if OUT_KIND == 0:
        pair = offs.to(tl.int64) * 2
        ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + pair, re.to(ty), mask=mask)
        tl.store(out_ptr + pair + 1, im.to(ty), mask=mask)
    else:
        if OUT_BOOL:
            re = (re != 0) | (im != 0)
        tl.store(out_ptr + offs, _cast(re, False, out_ptr.dtype.element_ty), mask=mask)


@jit
def _binary(ar, ai, br, bi, OP: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr):
    """Binary op codes, as elementwise.py's `_binary_op` numbers them. Comparisons give their bool twice. pow
    (9) treats number operands (KIND 1) as torch does (complex_math.pow)."""
    if OP == 0:
        re, im = ar + br, ai + bi
    elif OP == 1:
        re, im = ar - br, ai - bi
    elif OP == 2:
        re, im = complex_math.mul(ar, ai, br, bi)
    elif OP == 3:
        re, im = complex_math.div(ar, ai, br, bi)
    elif OP == 9:
        re, im = complex_math.pow(ar, ai, br, bi, A_KIND, B_KIND)
    elif OP == 12:
        re = (ar == br) & (ai == bi)
        im = re
    elif OP == 13:
        re = (ar != br) | (ai != bi)
        im = re
    else:
        a = (ar != 0) | (ai != 0)
        b = (br != 0) | (bi != 0)
        if OP == 18:
            re = a & b
        elif OP == 19:
            re = a | b
        else:
            re = a != b
        im = re
    return re, im


@jit
def _unary(re, im, OP: tl.constexpr):
    """0: -z; 1: |z| (its real part; hypot, so no square overflows); 2-9: exp log sqrt rsqrt sin cos tanh
    sigmoid (complex_math.py); 16: conj(z); 17: z (a copy, with a cast)."""
    if OP == 0:
        re, im = -re, -im
    elif OP == 1:
        re = libdevice.hypot(re, im)
    elif OP == 2:
        re, im = complex_math.exp(re, im)
    elif OP == 3:
        re, im = complex_math.log(re, im)
    elif OP == 4:
        re, im = complex_math.sqrt(re, im)
    elif OP == 5:
        re, im = complex_math.rsqrt(re, im)
    elif OP == 6:
        re, im = complex_math.sin(re, im)
    elif OP == 7:
        re, im = complex_math.cos(re, im)
    elif OP == 8:
        re, im = complex_math.tanh(re, im)
    elif OP == 9:
        re, im = complex_math.sigmoid(re, im)
    elif OP == 16:
        im = -im
    return re, im


@jit
def fill_contiguous(dst_ptr, re, im, n, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    zero = tl.full([BLOCK], 0, dst_ptr.dtype.element_ty)
    _store(dst_ptr, offs, offs < n, zero + re.to(zero.dtype), zero + im.to(zero.dtype), 0, False)


@jit
def fill_strided(dst_ptr, re, im, n, s1, s2, s3, o0, o1, o2, o3, RANK: tl.constexpr, INDEX64: tl.constexpr,
                 BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    zero = tl.full([BLOCK], 0, dst_ptr.dtype.element_ty)
    dst = _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    _store(dst_ptr, dst, offs < n, zero + re.to(zero.dtype), zero + im.to(zero.dtype), 0, False)


@jit
def unary_contiguous(x_ptr, out_ptr, n, OP: tl.constexpr, X_KIND: tl.constexpr, COMPUTE: tl.constexpr,
                     OUT_KIND: tl.constexpr, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    re, im = _load(x_ptr, 0, 0, offs, mask, X_KIND, COMPUTE)
    re, im = _unary(re, im, OP)
    _store(out_ptr, offs, mask, re, im, OUT_KIND, OUT_BOOL)


@jit
def unary_strided(x_ptr, out_ptr, n, s1, s2, s3, x0, x1, x2, x3, o0, o1, o2, o3, OP: tl.constexpr,
                  X_KIND: tl.constexpr, COMPUTE: tl.constexpr, OUT_KIND: tl.constexpr, OUT_BOOL: tl.constexpr,
                  RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    re, im = _load(x_ptr, 0, 0, _strided_offset(offs, s1, s2, s3, x0, x1, x2, x3, RANK), mask, X_KIND, COMPUTE)
    re, im = _unary(re, im, OP)
    _store(out_ptr, _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK), mask, re, im, OUT_KIND, OUT_BOOL)


@jit
def binary_contiguous(a_ptr, b_ptr, out_ptr, a_re, a_im, b_re, b_im, n, OP: tl.constexpr, A_KIND: tl.constexpr,
                      B_KIND: tl.constexpr, COMPUTE: tl.constexpr, OUT_KIND: tl.constexpr, OUT_BOOL: tl.constexpr,
                      INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    ar, ai = _load(a_ptr, a_re, a_im, offs, mask, A_KIND, COMPUTE)
    br, bi = _load(b_ptr, b_re, b_im, offs, mask, B_KIND, COMPUTE)
    re, im = _binary(ar, ai, br, bi, OP, A_KIND, B_KIND)
    _store(out_ptr, offs, mask, re, im, OUT_KIND, OUT_BOOL)


@jit
def binary_strided(a_ptr, b_ptr, out_ptr, a_re, a_im, b_re, b_im, n, s1, s2, s3, a0, a1, a2, a3, b0, b1, b2, b3,
                   o0, o1, o2, o3, OP: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr,
                   COMPUTE: tl.constexpr, OUT_KIND: tl.constexpr, OUT_BOOL: tl.constexpr, RANK: tl.constexpr,
                   INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    ar, ai = _load(a_ptr, a_re, a_im, _strided_offset(offs, s1, s2, s3, a0, a1, a2, a3, RANK), mask, A_KIND,
                   COMPUTE)
    br, bi = _load(b_ptr, b_re, b_im, _strided_offset(offs, s1, s2, s3, b0, b1, b2, b3, RANK), mask, B_KIND,
                   COMPUTE)
    re, im = _binary(ar, ai, br, bi, OP, A_KIND, B_KIND)
    _store(out_ptr, _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK), mask, re, im, OUT_KIND, OUT_BOOL)


@jit
def ternary_contiguous(c_ptr, a_ptr, b_ptr, out_ptr, c_re, c_im, a_re, a_im, b_re, b_im, n, OP: tl.constexpr,
                       C_KIND: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr, COMPUTE: tl.constexpr,
                       OUT_KIND: tl.constexpr, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    """where(c, a, b) (OP 0, the only ternary op of complex tensors): the condition a bool tensor."""
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    cond = tl.load(c_ptr + offs, mask=mask) != 0
    ar, ai = _load(a_ptr, a_re, a_im, offs, mask, A_KIND, COMPUTE)
    br, bi = _load(b_ptr, b_re, b_im, offs, mask, B_KIND, COMPUTE)
    _store(out_ptr, offs, mask, tl.where(cond, ar, br), tl.where(cond, ai, bi), OUT_KIND, OUT_BOOL)


@jit
def ternary_strided(c_ptr, a_ptr, b_ptr, out_ptr, c_re, c_im, a_re, a_im, b_re, b_im, n, s1, s2, s3, c0, c1, c2, c3,
                    a0, a1, a2, a3, b0, b1, b2, b3, o0, o1, o2, o3, OP: tl.constexpr, C_KIND: tl.constexpr,
                    A_KIND: tl.constexpr, B_KIND: tl.constexpr, COMPUTE: tl.constexpr, OUT_KIND: tl.constexpr,
                    OUT_BOOL: tl.constexpr, RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    cond = tl.load(c_ptr + _strided_offset(offs, s1, s2, s3, c0, c1, c2, c3, RANK), mask=mask) != 0
    ar, ai = _load(a_ptr, a_re, a_im, _strided_offset(offs, s1, s2, s3, a0, a1, a2, a3, RANK), mask, A_KIND,
                   COMPUTE)
    br, bi = _load(b_ptr, b_re, b_im, _strided_offset(offs, s1, s2, s3, b0, b1, b2, b3, RANK), mask, B_KIND,
                   COMPUTE)
    _store(out_ptr, _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK), mask, tl.where(cond, ar, br),
           tl.where(cond, ai, bi), OUT_KIND, OUT_BOOL)
