"""Layout numbers: one int per distinct (dtype, shape, strides, device) of tensors.

Ops cache their checked-once fast paths per signature (pointwise.py, reductions.py, indexing.py, random.py),
and the signature is looked up on every call. Hashing one int per operand instead of the tuples it stands
for is most of the lookup's cost saved. A tensor's number is worked out on first use and kept on the tensor
(its metadata never changes); op outputs are born with theirs. The table grows with the distinct layouts a
process uses, as the op caches keyed on them do.
"""
import itertools

_layouts = {}  # (dtype, shape, strides, device index) -> its layout number
_next_layout = itertools.count(1)  # next() is atomic, so two threads never get one number for two layouts;
# numbers start at 1, so `t._layout or layout_of(t)` is the inline form of layout_of(t)


def layout_number(dtype, shape, stride, index):
    """A number for a tensor's dtype, shape, strides and device index (None for the CPU). Op caches key on
    layout numbers: one int hashes in a fraction of the time of the tuples it stands for."""
    key = (dtype, shape, stride, index)
    number = _layouts.get(key)
    return _layouts.setdefault(key, next(_next_layout)) if number is None else number


def device_key(device):
    """What layout numbers know a device by: its index for cpu (None) and cuda, the device itself for a type a
    third party registered, whose indices repeat cuda's (its tensors must never meet a cuda op's fast path)."""
    return device.index if device.type == "cuda" or device.type == "cpu" else device


def layout_of(t):
    """t's layout number, worked out on first use and kept (a tensor's metadata never changes)."""
    number = t._layout
    if number is None:
        number = t._layout = layout_number(t.dtype, t._shape, t._stride, device_key(t.device))
    return number
