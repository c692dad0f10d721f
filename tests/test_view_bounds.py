"""Views made from user numbers stay inside their storage, and writes through views that repeat an element
are refused, with torch's messages:
- as_strided checks sizes, strides and offset against the storage (torch's setStorage check): before, a view
  past the end wrote into the neighbouring allocation, and a huge offset or a negative stride crashed;
- an empty slice's storage offset is where it starts, as in torch;
- in-place ops, out=, copy_ and item assignment into a view where several elements share one memory location
  (a stride 0 over a size above 1: expand, broadcast_to) are refused; fill_ and zero_ are allowed, as in torch.
"""
import re

import numpy as np
import pytest

import minitensor as mt

OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
           "location. Please clone() the tensor before performing the operation.")


def values(t):
    return t.cpu().numpy()


# ==============================================================================================
# as_strided
# ==============================================================================================
@pytest.mark.parametrize("dtype, itemsize", [(mt.float32, 4), (mt.int64, 8)])
def test_as_strided_past_the_storage_is_refused_with_torchs_message(device, dtype, itemsize):
    t = mt.arange(10, dtype=dtype, device=device)
    message = (f"setStorage: sizes [4], strides [1], storage offset 8, and itemsize {itemsize} requiring a storage "
               f"size of {12 * itemsize} are out of bounds for storage of size {10 * itemsize}")
    with pytest.raises(RuntimeError, match=re.escape(message)):
        t.as_strided((4,), (1,), 8)
    with pytest.raises(RuntimeError, match=re.escape("storage offset 2, and itemsize")):
        t[2:].as_strided((5,), (2,))  # the view's own offset counts: 2 + 8 + 1 elements > 10
    assert values(t).tolist() == list(range(10))


def test_as_strided_past_the_storage_leaves_the_neighbour_intact(device):
    """Before: the view reached into the next allocation and fill_ wrote there."""
    a, neighbour = mt.zeros(128, device=device), mt.zeros(128, device=device)
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 512"):
        a.as_strided((4096,), (1,)).fill_(7)
    mt.cuda.synchronize()
    assert not values(neighbour).any() and not values(a).any()


@pytest.mark.parametrize("args, error, message", [
    (((4,), (-1,), 3), RuntimeError, "as_strided: Negative strides are not supported at the moment, got strides: "
                                     "[-1]"),
    (((1,), (-1,), 0), RuntimeError, "Negative strides are not supported"),
    (((4,), (1,), 2**40), RuntimeError, "storage offset 1099511627776, and itemsize 4 requiring a storage size of "
                                        "4398046511120 are out of bounds for storage of size 40"),
    (((4,), (2**59,), 0), RuntimeError, "requiring a storage size of 6917529027641081860 are out of bounds for "
                                        "storage of size 40"),
    (((4,), (2**61,), 0), RuntimeError, "Storage size calculation overflowed with sizes=[4] and strides=["),
    (((4,), (1,), -1), RuntimeError, "Tensor: invalid storage offset -1"),
    (((-1,), (1,), 0), RuntimeError, "Trying to create tensor with negative dimension -1: [-1]"),
    (((-1, 0), (1, 1), 0), RuntimeError, "Trying to create tensor with negative dimension -1: [-1, 0]"),
    (((2, 2**62), (1, 2**62), 0), RuntimeError, "Storage size calculation overflowed with sizes=[2, "
                                                "4611686018427387904] and strides=[1, 4611686018427387904]"),
    (((2,), (1,), 2**63 - 1), RuntimeError, "Storage size calculation overflowed with sizes=[2] and strides=[1]"),
    (((2**62, 2**62), (0, 0), 0), RuntimeError, "numel: integer multiplication overflow"),
    (((2, 3), (1,), 0), RuntimeError, "mismatch in length of strides and shape"),
    (((True,), (1,), 0), TypeError, "as_strided(): argument 'size' (position 1) must be tuple of ints, but found "
                                    "element of type bool at pos 0"),
    (((1.5,), (1,), 0), TypeError, "argument 'size' (position 1) must be tuple of ints, but found element of type "
                                   "float at pos 0"),
    (((2,), (1.0,), 0), TypeError, "argument 'stride' (position 2) must be tuple of ints"),
    (((2,), (1,), 1.5), TypeError, "as_strided(): argument 'storage_offset' (position 3) must be int, not float"),
    ((3, (1,), 0), TypeError, "argument 'size' (position 1) must be tuple of ints, not int"),
], ids=lambda x: str(x)[:40])
def test_as_strided_bad_arguments(device, args, error, message):
    t = mt.arange(10.0, device=device)
    with pytest.raises(error, match=re.escape(message)):
        t.as_strided(*args)


def test_as_strided_within_the_storage(device):
    t = mt.arange(12.0, device=device)
    assert values(t.as_strided((3, 4), (4, 1))).tolist() == np.arange(12.0).reshape(3, 4).tolist()
    last = t.as_strided((2, 2), (0, 1), 10)  # exactly to the end, a stride 0 to read
    assert last.storage_offset() == 10 and values(last).tolist() == [[10, 11], [10, 11]]
    tail = t[4:].as_strided([2, 2], [4, 1])  # the view's own offset when none is given, as in torch
    assert tail.storage_offset() == 4 and values(tail).tolist() == [[4, 5], [8, 9]]
    assert t.as_strided(size=(2,), stride=(3,), storage_offset=np.int64(5)).tolist() == [5, 8]
    # empty views need no storage, whatever their offset (torch's computeStorageNbytes)
    assert t.as_strided((0,), (1,), 100).storage_offset() == 100
    assert t.as_strided((0, 5), (2**62, 1), 0).shape == (0, 5)
    assert t.as_strided((), (), 11).item() == 11
    with pytest.raises(RuntimeError, match="out of bounds"):
        t.as_strided((), (), 12)


# ==============================================================================================
# empty slices: their offset is where they start
# ==============================================================================================
def test_empty_slice_storage_offsets_match_torch(device):
    t = mt.arange(10.0, device=device)
    x = mt.arange(12.0, device=device).reshape(3, 4)
    # (view, torch's shape, strides, storage offset), from torch 2.13
    cases = [(t[3:1], (0,), (1,), 3), (t[20:30], (0,), (1,), 10), (t[8:3:2], (0,), (2,), 8),
             (t[-3:1], (0,), (1,), 7), (t[10:], (0,), (1,), 10), (x[2:1, 1:3], (0, 2), (4, 1), 9),
             (x[:, 3:1], (3, 0), (4, 1), 3), (x[1:1], (0, 4), (4, 1), 4), (t.narrow(0, 3, 0), (0,), (1,), 3)]
    for v, shape, stride, offset in cases:
        assert (tuple(v.shape), v.stride(), v.storage_offset()) == (shape, stride, offset)
        assert v.data_ptr() == v.untyped_storage().data_ptr() + offset * 4
        assert values(v).shape == shape and v.clone().shape == shape


# ==============================================================================================
# writes through a view whose elements share memory
# ==============================================================================================
def expanded(device, dtype=mt.float32):
    return mt.zeros(1, dtype=dtype, device=device).expand(4)


def test_in_place_ops_into_expanded_views_are_refused(device):
    ones = mt.ones(4, device=device)
    cases = {
        "add_": lambda e: e.add_(1), "add_ tensor": lambda e: e.add_(ones), "iadd": lambda e: e.__iadd__(ones),
        "mul_": lambda e: e.mul_(ones), "neg_": lambda e: e.neg_(), "pow_": lambda e: e.pow_(2),
        "clamp_": lambda e: e.clamp_(0, 1), "sub_ alpha": lambda e: e.sub_(ones, alpha=2),
        "mul out": lambda e: mt.mul(ones, 2, out=e), "exp out": lambda e: mt.exp(ones, out=e),
        "where out": lambda e: mt.where(ones > 0, ones, ones, out=e),
        "copy_": lambda e: e.copy_(ones), "copy_ broadcast": lambda e: e.copy_(mt.ones(1, device=device)),
        "copy_ cast": lambda e: e.copy_(mt.ones(4, dtype=mt.int64, device=device)),
        "setitem slice": lambda e: e.__setitem__(slice(None), 2.0),
        "setitem ellipsis": lambda e: e.__setitem__(Ellipsis, ones),
    }
    for name, op in cases.items():
        e = expanded(device)
        with pytest.raises(RuntimeError, match=re.escape(OVERLAP)):
            op(e)
        assert values(e).tolist() == [0.0] * 4, name
    with pytest.raises(RuntimeError, match=re.escape(OVERLAP)):  # comparisons into a bool out= as well
        mt.eq(ones, 1, out=expanded(device, mt.bool))
    e = mt.zeros(3, 1, device=device).expand(3, 4)
    with pytest.raises(RuntimeError, match=re.escape(OVERLAP)):
        e[0] = 1.0  # a row of the expanded view still repeats one element


def test_refused_in_place_op_is_refused_every_time(device):
    """The checks run once per signature on cuda; a refused signature must not be remembered as checked."""
    for _ in range(3):
        with pytest.raises(RuntimeError, match=re.escape(OVERLAP)):
            expanded(device).add_(1)
    t = mt.zeros(4, device=device)
    t.add_(1)  # the same op on a plain tensor runs, and then again on the expanded view is refused
    with pytest.raises(RuntimeError, match=re.escape(OVERLAP)):
        expanded(device).add_(1)
    assert values(t).tolist() == [1.0] * 4


def test_writes_torch_allows_into_views_that_share_memory(device):
    e = expanded(device)
    e.fill_(2)  # fill_ and zero_ write one value: torch allows them
    assert values(e).tolist() == [2.0] * 4
    e.zero_()
    assert values(e).tolist() == [0.0] * 4
    e.copy_(e)  # the very same tensor: nothing to do
    m = mt.zeros(3, 1, device=device).expand(3, 4)
    m[0, 1] = 5.0  # one element
    m[:, 0] = 6.0  # a column: no repeated element
    assert values(m).tolist() == [[6.0] * 4] * 3
    one = mt.zeros(1, device=device).as_strided((1, 1), (0, 0))  # size-1 dims repeat nothing
    one.add_(3)
    assert values(one).tolist() == [[3.0]]
    empty = mt.zeros(1, device=device).expand(0)
    empty.add_(1)
    empty.copy_(mt.ones(0, device=device))
    base = mt.arange(4.0, device=device)
    base.add_(expanded(device))  # reading through an expanded view is fine
    assert values(base).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_pin_memory_of_an_expanded_view_keeps_its_strides():
    e = mt.arange(3.0).view(1, 3).expand(4, 3)
    pinned = e.pin_memory()
    assert pinned.is_pinned() and pinned.stride() == (0, 1) and values(pinned).tolist() == [[0.0, 1.0, 2.0]] * 4


# ==============================================================================================
# other views and storages made from user numbers
# ==============================================================================================
def test_view_arguments_must_be_ints(device):
    """Before: floats were truncated (zeros(1.5)) or became a float storage offset (narrow, select), and
    expand(-2) made a tensor of negative size."""
    t = mt.arange(10.0, device=device)
    cases = {
        "narrow start": (lambda: t.narrow(0, 2.5, 1), TypeError, "narrow(): argument 'start' (position 2) must be "
                                                                 "int, not float"),
        "narrow length": (lambda: t.narrow(0, 2, 1.5), TypeError, "argument 'length' (position 3) must be int, "
                                                                  "not float"),
        "select index": (lambda: t.select(0, 1.5), TypeError, "select(): argument 'index' (position 2) must be int, "
                                                              "not float"),
        "select bool": (lambda: t.select(0, True), TypeError, "must be int, not bool"),
        "view": (lambda: t.view(2.5, 4), TypeError, "size must be tuple of ints, but found element of type float at "
                                                    "pos 0"),
        "reshape": (lambda: t.reshape([5, 2.0]), TypeError, "found element of type float at pos 1"),
        "expand float": (lambda: t[:1].expand(2.5), TypeError, "found element of type float at pos 0"),
        "expand negative": (lambda: t[:1].expand(-2), RuntimeError, "Trying to create tensor with negative "
                                                                    "dimension -2: [-2]"),
        "expand leading": (lambda: t[:1].expand(-3, 1), RuntimeError, "expand: -1 is not allowed in a leading"),
        "zeros": (lambda: mt.zeros(1.5, device=device), TypeError, "found element of type float at pos 0"),
    }
    for name, (call, error, message) in cases.items():
        with pytest.raises(error, match=re.escape(message)):
            call()
    assert t.narrow(0, np.int64(2), mt.tensor(3)).tolist() == [2.0, 3.0, 4.0]  # integer-like numbers are ints
    assert t.select(0, np.int32(4)).item() == 4.0 and mt.zeros(np.int64(2), device=device).shape == (2,)
    assert t.view(mt.tensor(5), 2).shape == (5, 2)


def test_untyped_storage_sizes_must_be_non_negative_ints(device):
    """Before: UntypedStorage(1.5, device="cuda") made a storage of 1.5 bytes."""
    with pytest.raises(TypeError, match=re.escape("UntypedStorage(): argument 'nbytes' must be int, not float")):
        mt.UntypedStorage(1.5, device=device)
    with pytest.raises(ValueError, match=re.escape("UntypedStorage(): nbytes must be >= 0, got -1")):
        mt.UntypedStorage(-1, device=device)
    assert mt.UntypedStorage(np.int64(3), device=device).nbytes() == 3
