"""Random-number kernels: Philox4x32-10 counters turned into uniform, normal, bernoulli and integer draws
(their launches: random_plans.py).

Element i of a call is drawn from the Philox block of counter `offset + i // PER`, lane i % PER, keyed by the
generator's 64-bit seed. PER is 4 when an element needs one 32-bit word (float32 and half types, bernoulli,
integer spans below 2^32) and 2 when it needs 64 bits (float64, wider spans); the host advances the
generator's offset by ceil(n / PER) per call. The numbers depend only on (seed, offset, i): never on BLOCK,
the grid or the GPU.

The counter is the 128-bit word (lo32(c), hi32(c), 0, 0) and the key (lo32(seed), hi32(seed)), through
standard Philox4x32-10 (Random123's and curand's; `tl.philox` computes the same). `_philox` is written out
here because Triton's own random helpers are plain @triton.jit functions, which an interpreted kernel cannot
call. The interpreter does the 32-bit multiplies exactly in 64-bit numpy, so the simulated device draws the
GPU's words bit for bit, and uniform_ (float32 and half types, and float64 on [0, 1)), bernoulli and random_
give the GPU's values bit for bit too. Where they can differ, in the last bits: float64 uniform_ on other
bounds (the GPU fuses u * span + low into one rounding, the interpreter rounds twice) and normal_ (numpy's
log, cos and sin against the GPU's).
"""
import triton.language as tl

from .compat import jit, narrow, widen
from .elementwise import _linear_offsets

_TWO_PI = tl.constexpr(6.283185307179586)


@jit
def _philox(seed, offset, PER: tl.constexpr, BLOCK: tl.constexpr):
    """The four uint32 words of each of this program's BLOCK // PER counters: Philox4x32-10. In a CUDA graph,
    `seed` points to the generator's [seed, offset] that each replay sets (set_state), and `offset` counts from
    that offset, so every replay draws new numbers."""
    if seed.dtype.is_ptr():
        offset = tl.load(seed + 1) + offset
        seed = tl.load(seed)
    COUNT: tl.constexpr = BLOCK // PER
    c = offset + tl.program_id(0).to(tl.int64) * COUNT + tl.arange(0, COUNT)
    c0 = c.to(tl.uint32)
    c1 = (c >> 32).to(tl.uint32)
    c2 = c0 * 0
    c3 = c2
    k0 = seed.to(tl.uint32)
    k1 = (seed >> 32).to(tl.uint32)
    for _ in tl.static_range(10):
        a0, a2 = c0, c2
        c0 = tl.umulhi(a2, 0xCD9E8D57) ^ c1 ^ k0
        c2 = tl.umulhi(a0, 0xD2511F53) ^ c3 ^ k1
        c1 = a2 * 0xCD9E8D57
        c3 = a0 * 0xD2511F53
        k0 = k0 + 0x9E3779B9
        k1 = k1 + 0xBB67AE85
    return c0, c1, c2, c3


@jit
def _in_order(a, b, c, d, BLOCK: tl.constexpr):
    """One block of a0 b0 c0 d0 a1 b1 ...: lane j of counter k is element 4k + j."""
    return tl.reshape(tl.join(tl.join(a, c), tl.join(b, d)), [BLOCK])


@jit
def _pairs(a, b, BLOCK: tl.constexpr):
    """One block of a0 b0 a1 b1 ...: lane j of counter k is element 2k + j."""
    return tl.reshape(tl.join(a, b), [BLOCK])


@jit
def _unit24(r):
    """A uint32 word to a float32 in [0, 1) from its top 24 bits (exact)."""
    return (r >> 8).to(tl.int32).to(tl.float32) * 5.9604644775390625e-08


@jit
def _unit53(hi, lo):
    """Two uint32 words to a float64 in [0, 1) from the top 53 of their 64 bits (exact)."""
    bits = (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)
    return (bits >> 11).to(tl.int64).to(tl.float64) * 1.1102230246251565e-16


@jit
def _bits64(hi, lo):
    return (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)


@jit
def _box_muller(u1, u2):
    """Two independent standard normals from two uniforms in [0, 1) (u1 flipped to (0, 1] for the log)."""
    radius = tl.sqrt(-2.0 * tl.log(1.0 - u1))
    theta = _TWO_PI * u2
    return radius * tl.cos(theta), radius * tl.sin(theta)


@jit
def _store(out_ptr, offs, mask, v):
    """Store values computed in float32/float64/int64/bool as the output's type."""
    ty = out_ptr.dtype.element_ty
    if ty == tl.int1:
        v = v != 0
    elif tl.constexpr(ty.is_fp16() or ty.is_bf16()):
        v = narrow(v.to(tl.float32), ty)
    else:
        v = v.to(ty)
    tl.store(out_ptr + offs, v, mask=mask)


@jit
def uniform(out_ptr, seed, offset, n, low, high, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    """out = low + (high - low) * U[0, 1) with the bounds rounded to the output type first (as torch, whose
    range is float32 for float32 and half types); a value that rounds up to `high` becomes `low`."""
    ty = out_ptr.dtype.element_ty
    if ty == tl.float64:
        r0, r1, r2, r3 = _philox(seed, offset, 2, BLOCK)
        u = _pairs(_unit53(r0, r1), _unit53(r2, r3), BLOCK)
        lo = low
        hi = high
        v = u * (hi - lo) + lo
    else:
        r0, r1, r2, r3 = _philox(seed, offset, 4, BLOCK)
        u = _in_order(_unit24(r0), _unit24(r1), _unit24(r2), _unit24(r3), BLOCK)
        lo = widen(narrow(low, ty))
        hi = widen(narrow(high, ty))
        # u * span is exact in float64 (24-bit by 24-bit), so the GPU's fused multiply-add and the
        # interpreter's multiply then add round the same way
        span = (hi - lo).to(tl.float64)
        v = widen(narrow((u.to(tl.float64) * span + lo.to(tl.float64)).to(tl.float32), ty))
    v = tl.where(v == hi, lo, v)
    offs = _linear_offsets(INDEX64, BLOCK)
    _store(out_ptr, offs, offs < n, v)


@jit
def normal(out_ptr, seed, offset, n, mean, std, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    """out = mean + std * N(0, 1) by Box-Muller: lanes (0, 1) and (2, 3) of a counter are a pair (float64:
    one pair from the counter's two 64-bit words)."""
    if out_ptr.dtype.element_ty == tl.float64:
        r0, r1, r2, r3 = _philox(seed, offset, 2, BLOCK)
        z0, z1 = _box_muller(_unit53(r0, r1), _unit53(r2, r3))
        z = _pairs(z0, z1, BLOCK)
    else:
        r0, r1, r2, r3 = _philox(seed, offset, 4, BLOCK)
        z0, z1 = _box_muller(_unit24(r0), _unit24(r1))
        z2, z3 = _box_muller(_unit24(r2), _unit24(r3))
        z = _in_order(z0, z1, z2, z3, BLOCK)
    offs = _linear_offsets(INDEX64, BLOCK)
    _store(out_ptr, offs, offs < n, z * std + mean)


@jit
def bernoulli(out_ptr, seed, offset, n, p_value, p_ptr, P_SCALAR: tl.constexpr, INDEX64: tl.constexpr,
              BLOCK: tl.constexpr):
    """out = U[0, 1) < p, with p the number p_value or a float tensor of out's shape at p_ptr; U has 24 bits
    (32 against a float64 p)."""
    r0, r1, r2, r3 = _philox(seed, offset, 4, BLOCK)
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    if P_SCALAR:
        p = p_value
    else:
        p = tl.load(p_ptr + offs, mask=mask)
    if p.dtype == tl.float64:
        u = _in_order(r0, r1, r2, r3, BLOCK).to(tl.float64) * 2.3283064365386963e-10
    else:
        p = p.to(tl.float32)
        u = _in_order(_unit24(r0), _unit24(r1), _unit24(r2), _unit24(r3), BLOCK)
    _store(out_ptr, offs, mask, u < p)


@jit
def integers(out_ptr, seed, offset, n, low, span, MODE: tl.constexpr, INDEX64: tl.constexpr,
             BLOCK: tl.constexpr):
    """out = low + (random word mod span), torch's random_: MODE 0 takes 32-bit words for a span below
    2^32, MODE 1 64-bit words for a wider span (passed as int64 bits), MODE 2 all 64 bits (span 2^64)."""
    if MODE == 0:
        r0, r1, r2, r3 = _philox(seed, offset, 4, BLOCK)
        s = span.to(tl.uint32)
        x = _in_order(r0 % s, r1 % s, r2 % s, r3 % s, BLOCK).to(tl.int64)
    else:
        r0, r1, r2, r3 = _philox(seed, offset, 2, BLOCK)
        x = _pairs(_bits64(r0, r1), _bits64(r2, r3), BLOCK)
        if MODE == 1:
            x = x % span.to(tl.uint64, bitcast=True)
        x = x.to(tl.int64, bitcast=True)
    offs = _linear_offsets(INDEX64, BLOCK)
    _store(out_ptr, offs, offs < n, x + low)


@jit
def set_state(state_ptr, seed, offset):
    """Before a graph's replay: the [seed, offset] its random kernels read (see _philox)."""
    tl.store(state_ptr, seed)
    tl.store(state_ptr + 1, offset)
