"""The scatter kernels behind `index_put_` (their launches: index_put_plans.py).

The op is an R x C problem: R index rows (the index tensors broadcast together, made contiguous) and, under
each, C columns (the dims of self that no index covers). Two steps, each one launch:

1. `row_offsets`, once per index tensor (self's dim d, of size `size` and stride `stride`):
   offsets[r] (+)= wrap(index[r]) * stride, negative indices wrapping as in torch. An index outside
   [-size, size) is recorded in ERR as gather's are (cuda/device_errors.py) and turns its row's offset into -1,
   which stays -1 through the later dims (valid offsets are >= 0: strides are never negative).
2. `scatter` over the R * C elements: self[offsets[r] + col(c)] = values[r * value_row_stride + vcol(c)],
   where col and vcol walk up to four column dims (`_two_offsets`). A row whose offset is -1 is skipped: a bad
   index is never dereferenced. MODE says how an element lands:
   - STORE: a plain store, elements moved as raw bits (one binary per element size). With duplicate indices
     one of the values wins, as in torch (which leaves it undefined).
   - ADD: `tl.atomic_add`, for the dtypes Triton's atomics take and its interpreter runs (int32, int64,
     float16, float32, float64, and uint32/uint64); duplicates are all summed, floats in whatever order the
     atomics land.
   - ADD_IN_WORDS: bool, uint8, int8, int16 (and uint16), which no atomic instruction adds, and bfloat16, which
     Triton's interpreter cannot add atomically: a compare-and-swap loop on the aligned 32-bit word around each
     element (`_add_in_words`); integers add exactly (wrapping at their width), bool as "or", bfloat16 in
     float32 rounded to nearest even after each add, as the GPU's bfloat16 atomics do. Chosen over a sort or a
     gather-side sum because it is one pass, in place, and needs no scratch memory; contention on one word
     only costs retries. The same code runs compiled and interpreted, so the simulator tests what the GPU
     runs.
"""
import triton.language as tl

from .compat import jit
from .elementwise import _linear_offsets
from .index import _two_offsets

STORE, ADD, ADD_IN_WORDS = 0, 1, 2


@jit
def row_offsets(index_ptr, offsets_ptr, err_ptr, rows, size, stride, info, FIRST: tl.constexpr,
                INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    r = _linear_offsets(INDEX64, BLOCK)
    mask = r < rows
    idx = tl.load(index_ptr + r, mask=mask, other=0).to(tl.int64)
    good = (idx >= -size) & (idx < size)
    bad = mask & (good == 0)
    record = err_ptr + tl.full(idx.shape, 0, tl.int32)
    tl.store(record, idx, mask=bad)
    tl.store(record + 1, tl.full(idx.shape, 0, tl.int64) + info, mask=bad)
    offset = tl.where(idx < 0, idx + size, idx) * stride
    if not FIRST:
        before = tl.load(offsets_ptr + r, mask=mask, other=0)
        offset = tl.where(before < 0, -1, before + offset)
    tl.store(offsets_ptr + r, tl.where(good, offset, -1), mask=mask)


@jit
def _bf16_sum(a, b):
    """The bfloat16 bits of a + b (bfloat16 bits in int32 lanes), added in float32 and rounded to nearest even
    on the bits, as the GPU's bfloat16 atomics round; NaN stays a quiet NaN."""
    total = (a << 16).to(tl.float32, bitcast=True) + (b << 16).to(tl.float32, bitcast=True)
    word = total.to(tl.int32, bitcast=True)
    rounded = ((word + 0x7FFF + ((word >> 16) & 1)) >> 16) & 0xFFFF
    return tl.where(total != total, 0x7FC0, rounded)


@jit
def _add_in_words(words_ptr, byte, x, ok, ITEMSIZE: tl.constexpr, KIND: tl.constexpr):
    """Add the ITEMSIZE-byte elements `x` (raw bits) into the elements at byte offsets `byte` from `words_ptr`
    (4-byte aligned), for the lanes in `ok`: each lane swaps in the aligned 32-bit word holding its element with
    that element's bits changed, and retries from the word it found until the swap succeeds. KIND: 0 integers
    (wrapping at their width), 1 bool ("or"), 2 bfloat16. Lanes not in `ok` (their byte offset is 0, a real
    element of self) swap a word for itself, a no-op, since atomic_cas takes no mask."""
    word_ptr = words_ptr + (byte >> 2)
    shift = ((byte & 3) * 8).to(tl.int32)
    field: tl.constexpr = (1 << (8 * ITEMSIZE)) - 1
    bits = x.to(tl.int32) & field
    keep = (tl.full(shift.shape, field, tl.int32) << shift) ^ -1  # the word's other bytes
    pending = ok
    old = tl.load(word_ptr, mask=ok, other=0)
    while tl.reduce(pending.to(tl.int32), 0, tl.standard._elementwise_max) > 0:
        current = (old >> shift) & field
        if KIND == 1:
            updated = current | bits
        elif KIND == 2:
            updated = _bf16_sum(current, bits)
        else:
            updated = (current + bits) & field
        new = tl.where(pending, (old & keep) | (updated << shift), old)
        seen = tl.atomic_cas(word_ptr, old, new)
        pending = pending & (seen != old)
        old = seen


@jit
def scatter(out_ptr, words_ptr, values_ptr, offsets_ptr, n, cols, word_lead, value_row_stride, s1, s2, s3,
            o0, o1, o2, o3, v0, v1, v2, v3, MODE: tl.constexpr, ITEMSIZE: tl.constexpr, KIND: tl.constexpr,
            RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    """out[offsets[r] + col(c)] (=, +=) values[r * value_row_stride + vcol(c)] for element i = r * cols + c.
    `words_ptr` and `word_lead` are out_ptr as a 4-byte aligned word pointer and the bytes before it
    (ADD_IN_WORDS only)."""
    i = _linear_offsets(INDEX64, BLOCK)
    mask = i < n
    r = i // cols
    c = i % cols
    row = tl.load(offsets_ptr + r, mask=mask, other=-1)
    ok = mask & (row >= 0)
    col, value_col = _two_offsets(c, s1, s2, s3, o0, o1, o2, o3, v0, v1, v2, v3, RANK)
    target = tl.where(ok, row + col, 0)
    x = tl.load(values_ptr + (r * value_row_stride + value_col), mask=ok, other=0)
    if MODE == 0:
        tl.store(out_ptr + target, x, mask=ok)
    elif MODE == 1:
        tl.atomic_add(out_ptr + target, x, mask=ok)
    else:
        _add_in_words(words_ptr, word_lead + target * ITEMSIZE, x, ok, ITEMSIZE, KIND)
