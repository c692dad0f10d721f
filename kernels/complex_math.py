"""Complex math on (real, imag) pairs for kernels/complex.py: exp, log, sqrt, rsqrt, sin, cos, tanh, sigmoid and
pow, with the formulas, branch cuts and special values (C99 Annex G) of the C library functions torch's CPU kernels
call (glibc's cexp, clog, csqrt, csin, ccos, ctanh, cpow), which numpy's agree with.

Each takes and returns the two parts in the compute type (float32 for complex64, float64 for complex128); a part
may be a kernel scalar (0-d) as well as a block. Branch cuts lie along the negative real axis (log, sqrt, pow),
and the sign of a zero imaginary part picks the side: sqrt(-4 - 0j) = -2j. `y - y` is a NaN exactly when y is
infinite or NaN, which is how the special cases find non-finite parts without float constants.
"""
import triton.language as tl

from .compat import jit, libdevice
from .elementwise import _div, _sqrt


@jit
def _nonfinite(x):
    return (x - x) != 0


@jit
def _zeros(x):
    """Zeros shaped and typed as x (tl.zeros_like is a plain @triton.jit, which the interpreter cannot call)."""
    return tl.full(x.shape, 0, x.dtype)


@jit
def _infinite(x):
    return _nonfinite(x) & (x == x)


@jit
def mul(ar, ai, br, bi):
    """(a + bi)(c + di), the plain formula torch's and numpy's kernels use."""
    return ar * br - ai * bi, ar * bi + ai * br


@jit
def div(a, b, c, d):
    """(a + bi) / (c + di) as torch's c10::complex and numpy divide: scaled by the larger part of the divisor
    (Smith's method), so no square overflows; 0 / 0 gives a complex nan or inf."""
    big_c = tl.abs(c) >= tl.abs(d)
    rat = tl.where(big_c, _div(d, c), _div(c, d))
    den = tl.where(big_c, c + d * rat, d + c * rat)
    scl = _div(_zeros(den) + 1, den)
    re = tl.where(big_c, (a + b * rat) * scl, (a * rat + b) * scl)
    im = tl.where(big_c, (b - a * rat) * scl, (b * rat - a) * scl)
    zero = (c == 0) & (d == 0)
    return tl.where(zero, _div(a, tl.abs(c)), re), tl.where(zero, _div(b, tl.abs(d)), im)


@jit
def exp(x, y):
    """e^x (cos y + i sin y). A zero imaginary part stays exact (exp(inf + 0j) = inf + 0j); an infinite real part
    with a non-finite imaginary one gives 0 + 0j (x = -inf) or inf + nanj (x = +inf)."""
    e = libdevice.exp(x)
    re = tl.where(y == 0, e, e * tl.cos(y))
    im = tl.where(y == 0, y, e * tl.sin(y))
    special = _nonfinite(y) & _infinite(x)
    re = tl.where(special, tl.where(x > 0, x, 0.0), re)
    im = tl.where(special, tl.where(x > 0, y - y, 0.0), im)
    return re, im


@jit
def log(x, y):
    """log|z| + i arg(z), arg in (-pi, pi]. Near |z| = 1, log|z| is 0.5 log1p(big^2 - 1 + small^2) with the squares'
    rounding errors (fma) added back, which keeps the digits that log(hypot) would lose."""
    h = libdevice.hypot(x, y)
    big = tl.maximum(tl.abs(x), tl.abs(y))
    small = tl.minimum(tl.abs(x), tl.abs(y))
    big_sq = big * big
    small_sq = small * small
    errors = tl.fma(big, big, -big_sq) + tl.fma(small, small, -small_sq)
    near_one = (h > 0.5) & (h < 2)
    re = tl.where(near_one, 0.5 * libdevice.log1p((big_sq - 1) + small_sq + errors), tl.log(h))
    return re, libdevice.atan2(y, x)


@jit
def sqrt(x, y):
    """The principal square root (real part >= 0), Kahan's way: t = sqrt((|x| + |z|) / 2) is the larger part and
    y / 2t the other, so neither cancels. sqrt(0) = 0 (imaginary sign kept); an infinite y gives inf + yj."""
    h = libdevice.hypot(x, y)
    t = _sqrt(0.5 * tl.abs(x) + 0.5 * h)
    other = _div(y, t + t)
    re = tl.where(x >= 0, t, tl.abs(other))
    im = tl.where(x >= 0, other, libdevice.copysign(t, y))
    re = tl.where(t == 0, t, re)
    im = tl.where(t == 0, y, im)
    infinite_y = _infinite(y)
    return tl.where(infinite_y, tl.abs(y), re), tl.where(infinite_y, y, im)


@jit
def sin(x, y):
    """sin x cosh y + i cos x sinh y, with the special values of C99's csin (-i csinh(iz)): a zero part stays exact,
    and an infinite y with a non-finite x gives nan + infj."""
    re = tl.sin(x) * libdevice.cosh(y)
    im = tl.cos(x) * libdevice.sinh(y)
    re = tl.where(x == 0, x, re)
    im = tl.where(y == 0, y, im)
    return re, tl.where(_infinite(y) & _nonfinite(x), tl.abs(y), im)


@jit
def cos(x, y):
    """cos x cosh y - i sin x sinh y, with the special values of C99's ccos (ccosh(iz)): a zero imaginary part
    when either part is zero, and an infinite y with a non-finite x gives inf + nanj."""
    re = tl.cos(x) * libdevice.cosh(y)
    im = -tl.sin(x) * libdevice.sinh(y)
    im = tl.where((x == 0) | (y == 0), 0.0, im)
    return tl.where(_infinite(y) & _nonfinite(x), tl.abs(y), re), im


@jit
def tanh(x, y):
    """glibc's ctanh: (sinh x cosh x + i sin y cos y) / (sinh^2 x + cos^2 y); for |x| > 20 the real part is +-1 and
    the imaginary 4 sin y cos y e^(-2|x|), so nothing overflows."""
    s = libdevice.sinh(x)
    sin_y = tl.sin(y)
    cos_y = tl.cos(y)
    den = s * s + cos_y * cos_y
    sign = tl.where(x < 0, -1.0, 1.0)
    large = tl.abs(x) > 20
    re = tl.where(large, sign, _div(s * libdevice.cosh(x), den))
    im = tl.where(large, 4 * sin_y * cos_y * libdevice.exp(-2 * tl.abs(x)), _div(sin_y * cos_y, den))
    infinite_x = _infinite(x)
    re = tl.where(infinite_x, sign, tl.where(x == 0, x, re))
    im = tl.where(infinite_x, 0.0, tl.where(y == 0, y, im))
    return re, im


@jit
def sigmoid(x, y):
    """1 / (1 + e^-z), as torch's kernel computes it."""
    er, ei = exp(-x, -y)
    return div(_zeros(er) + 1, _zeros(ei), 1 + er, ei)


@jit
def rsqrt(x, y):
    """1 / sqrt(z)."""
    sr, si = sqrt(x, y)
    return div(_zeros(sr) + 1, _zeros(si), sr, si)


@jit
def pow(ar, ai, br, bi, A_KIND: tl.constexpr, B_KIND: tl.constexpr):
    """z^w = exp(w log z) (cpow). As torch: a number exponent of 0 gives 1, and 1, 2, 3, -2, 0.5, -0.5 and -1 the
    copy, products, square roots or quotients they stand for; a number base of 1 gives 1 (KIND 1: a number)."""
    lr, li = log(ar, ai)
    er, ei = mul(br, bi, lr, li)
    re, im = exp(er, ei)
    if B_KIND == 1:
        real = bi == 0
        sq_r, sq_i = mul(ar, ai, ar, ai)
        cube_r, cube_i = mul(sq_r, sq_i, ar, ai)
        zero = _zeros(ar)
        one = zero + 1
        inv_sq_r, inv_sq_i = div(one, zero, sq_r, sq_i)
        root_r, root_i = sqrt(ar, ai)
        inv_root_r, inv_root_i = div(one, zero, root_r, root_i)
        inv_r, inv_i = div(one, zero, ar, ai)
        re = tl.where(real & (br == -1), inv_r, tl.where(real & (br == -0.5), inv_root_r, re))
        im = tl.where(real & (br == -1), inv_i, tl.where(real & (br == -0.5), inv_root_i, im))
        re = tl.where(real & (br == 0.5), root_r, tl.where(real & (br == -2), inv_sq_r, re))
        im = tl.where(real & (br == 0.5), root_i, tl.where(real & (br == -2), inv_sq_i, im))
        re = tl.where(real & (br == 3), cube_r, tl.where(real & (br == 2), sq_r, re))
        im = tl.where(real & (br == 3), cube_i, tl.where(real & (br == 2), sq_i, im))
        re = tl.where(real & (br == 1), ar, tl.where(real & (br == 0), one, re))
        im = tl.where(real & (br == 1), ai, tl.where(real & (br == 0), zero, im))
    if A_KIND == 1:
        unit = (ar == 1) & (ai == 0)
        re = tl.where(unit, _zeros(re) + 1, re)
        im = tl.where(unit, _zeros(im), im)
    return re, im
