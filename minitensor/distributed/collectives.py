"""The collectives and point-to-point calls, with torch.distributed's signatures and errors: each checks its
arguments here, then hands the group's engine contiguous cuda tensors on the group's device.

Ranks: `src`/`dst` are world ranks and `group_src`/`group_dst` ranks within `group` (torch's pair; give one).
Reductions: complex tensors take SUM and AVG only; AVG takes floating and complex tensors (torch's gloo refuses
it for integers and bool); BAND, BOR and BXOR take integers and bool. bool reduces as logic: SUM and MAX are
or, PRODUCT and MIN are and.
With `async_op=True` a call returns a Work (work.py); otherwise the current stream is ordered after the op
and the host does not wait (barrier() does, and recv() returns the source's world rank).
"""
from ..base import dtypes
from ..creation import empty
from ..tensor import Tensor
from .groups import get_global_rank, resolve
from .reduce_op import RedOpType, op_type

_valid_reductions = {}  # (RedOpType, dtype) that passed the checks: the hot path's one lookup
_BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


def _tensor(t, pg, name="tensor"):
    """`t` if it can take part in a collective of `pg`, else torch's error."""
    if not isinstance(t, Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{name}` of type minitensor.Tensor\n"
                        f"             but got {type(t)} instead.")
    device = t.device
    if device.type != "cuda":
        raise ValueError("Tensors must be CUDA and dense")
    if device.index != pg._device:
        raise ValueError(f"Tensor found on device {device} but the process group uses cuda:{pg._device} (the "
                         "device chosen at init_process_group)")
    if not t.is_contiguous():
        raise ValueError("Tensors must be contiguous")
    return t


def _reduction(op, dtype, name):
    """The RedOpType of `op` if it may reduce `dtype`, else torch's error."""
    found = _valid_reductions.get((op, dtype)) if type(op) is RedOpType else None
    if found is not None:
        return found
    op = op_type(op)
    if dtype.is_complex and op not in (RedOpType.SUM, RedOpType.AVG):
        raise ValueError(f"{name} does not support {op} on complex tensors")
    if op is RedOpType.AVG and dtype is dtypes.bool_:
        raise TypeError("Cannot use ReduceOp.AVG with boolean inputs")
    if op is RedOpType.AVG and dtype.category == dtypes.INT:
        raise RuntimeError(f"result type Float can't be cast to the desired output type "
                           f"{dtypes.TORCH_NAMES[dtype.name]}")
    if op in _BITWISE and dtype.category not in (dtypes.BOOL, dtypes.INT):
        raise RuntimeError(f"Cannot use ReduceOp.{op.name} with non-integral dtype")
    _valid_reductions[op, dtype] = op
    return op


def _group_rank(pg, rank, group_rank, name, role):
    """The rank within `pg` named by a world rank or a group rank (exactly one of them), checked."""
    if rank is not None and group_rank is not None:
        raise ValueError("Can't specify both group_rank and global rank")
    if rank is None and group_rank is None:
        raise ValueError("Must specify global_rank or group_rank")
    if group_rank is None:
        if rank not in pg._ranks:
            if pg._ranks == list(range(len(pg._ranks))):  # the default group: what its backend says
                raise RuntimeError(f"{name}: invalid {role} rank: {rank}")
            raise ValueError(f"Global rank {rank} is not part of group {pg}")
        return pg._ranks.index(rank)
    get_global_rank(pg, group_rank)  # checks it
    return group_rank


def all_reduce(tensor, op=RedOpType.SUM, group=None, async_op=False):
    """Every rank's `tensor` becomes the reduction of all of them."""
    pg = resolve(group, "all_reduce")
    if pg is None:
        return None
    _tensor(tensor, pg)
    return pg._engine.all_reduce(tensor, _reduction(op, tensor.dtype, "all_reduce"), async_op)


def reduce(tensor, dst=None, op=RedOpType.SUM, group=None, async_op=False, group_dst=None):
    """The reduction of every rank's `tensor` lands in the tensor of rank `dst`; the others keep theirs."""
    pg = resolve(group, "reduce")
    if pg is None:
        return None
    _tensor(tensor, pg)
    root = _group_rank(pg, dst, group_dst, "reduce", "root")
    return pg._engine.reduce(tensor, _reduction(op, tensor.dtype, "reduce"), root, async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """Every rank's `tensor` becomes rank `src`'s."""
    pg = resolve(group, "broadcast")
    if pg is None:
        return None
    _tensor(tensor, pg)
    return pg._engine.broadcast(tensor, _group_rank(pg, src, group_src, "broadcast", "root"), async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """`output_tensor` (world_size times `input_tensor`'s elements) becomes every rank's input, in rank order."""
    pg = resolve(group, "all_gather_into_tensor")
    if pg is None:
        return None
    _tensor(output_tensor, pg, "output_tensor")
    _tensor(input_tensor, pg, "input_tensor")
    _world_sized(output_tensor, input_tensor, pg, "output tensor must have the same type as input tensor",
                 "output tensor size must be equal to world_size times input tensor size")
    return pg._engine.all_gather(output_tensor, input_tensor, async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """`tensor_list[i]` becomes rank i's `tensor` (gathered into one buffer, then copied out; with async_op the
    copies are made by `wait()`)."""
    pg = resolve(group, "all_gather")
    if pg is None:
        return None
    _tensor(tensor, pg)
    _same_tensors(tensor_list, tensor, pg, "all_gather", "output")
    n = tensor.numel()
    gathered = empty(pg.size() * n, dtype=tensor.dtype, device=tensor.device)
    work = pg._engine.all_gather(gathered, tensor, async_op)

    def copy_out():
        for i, out in enumerate(tensor_list):
            out.copy_(gathered[i * n:(i + 1) * n].view(tensor.shape))
    return _then(work, copy_out)


def reduce_scatter_tensor(output, input, op=RedOpType.SUM, group=None, async_op=False):
    """`output` becomes the reduction, over the ranks, of this rank's slice of `input` (world_size slices)."""
    pg = resolve(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    _tensor(output, pg, "output")
    _tensor(input, pg, "input")
    _world_sized(input, output, pg, "input tensor must be the same type as the output tensor.",
                 "input tensor must be the same size as output size times world size")
    return pg._engine.reduce_scatter(output, input, _reduction(op, input.dtype, "reduce_scatter_tensor"), async_op)


def reduce_scatter(output, input_list, op=RedOpType.SUM, group=None, async_op=False):
    """`output` becomes the reduction, over the ranks, of their `input_list[rank]` (copied into one buffer
    first)."""
    pg = resolve(group, "reduce_scatter")
    if pg is None:
        return None
    _tensor(output, pg, "output")
    _same_tensors(input_list, output, pg, "reduce_scatter", "input")
    op = _reduction(op, output.dtype, "reduce_scatter")
    n = output.numel()
    joined = empty(pg.size() * n, dtype=output.dtype, device=output.device)
    for i, part in enumerate(input_list):
        joined[i * n:(i + 1) * n].copy_(part.reshape(-1))
    return pg._engine.reduce_scatter(output, joined, op, async_op)


def _world_sized(whole, part, pg, type_message, size_message):
    """`whole` holds world_size times `part`'s elements, of its dtype, else torch's errors (whose wording differs
    per collective)."""
    if whole.dtype != part.dtype:
        raise TypeError(type_message)
    if whole.numel() != part.numel() * pg.size():
        raise ValueError(size_message)


def _same_tensors(tensors, like, pg, name, role):
    """`tensors` is a list of world_size cuda tensors of `like`'s dtype and shape, else torch's error."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"Invalid function argument: {role} tensor list must be a list of minitensor.Tensor, got "
                        f"{type(tensors).__name__}")
    if len(tensors) != pg.size():
        raise RuntimeError(f"{name}: invalid {role} tensor list size {len(tensors)}, must be world size "
                           f"{pg.size()}")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor) or t.device.type != "cuda":
            raise ValueError(f"{name}: {role} tensor {i} is not a cuda minitensor.Tensor: Tensors must be CUDA "
                             "and dense")
        if t.dtype != like.dtype:
            raise ValueError(f"Invalid usage of tensors with different dtypes: found {t.dtype} and {like.dtype}")
        if t.shape != like.shape:
            raise RuntimeError(f"{name}: invalid tensor size at index {i} (expected {tuple(like.shape)}, got "
                               f"{tuple(t.shape)})")


def _then(work, after):
    """A synchronous op's `after()` now (the current stream is already ordered after the op); an async op's
    at its wait()."""
    if work is None:
        after()
        return None
    work._chain(after)
    return work


def barrier(group=None, async_op=False, device_ids=None):
    """Returns once every rank of the group has reached it (with async_op, a Work)."""
    pg = resolve(group, "barrier")
    if pg is None:
        return None
    return pg._engine.barrier(async_op)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Sends `tensor` to rank `dst` (ordered on the current stream)."""
    _send(tensor, dst, group, tag, group_dst, False)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    return _send(tensor, dst, group, tag, group_dst, True)


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receives `tensor` from rank `src`; returns `src` (a world rank)."""
    return _recv(tensor, src, group, tag, group_src, False)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    return _recv(tensor, src, group, tag, group_src, True)


def _send(tensor, dst, group, tag, group_dst, async_op):
    pg = resolve(group, "send")
    if pg is None:
        return None
    _tensor(tensor, pg)
    tag = _tag(tag)
    peer = _group_rank(pg, dst, group_dst, "send", "destination")
    if peer == pg.rank():
        raise ValueError("Invalid destination rank: destination rank should not be the same as the rank of the "
                         "current process.")
    return pg._engine.send(tensor, peer, tag, async_op)


def _recv(tensor, src, group, tag, group_src, async_op):
    """The Work of an irecv; for recv the source's world rank (None outside the group)."""
    pg = resolve(group, "recv")
    if pg is None:
        return None
    _tensor(tensor, pg)
    tag = _tag(tag)
    if src is None and group_src is None:
        raise ValueError("recv(): name the source rank (src or group_src); receiving from any source is not "
                         "supported by minitensor")
    peer = _group_rank(pg, src, group_src, "recv", "source")
    if peer == pg.rank():
        raise ValueError("Invalid source rank: source rank should not be the same as the rank of the current "
                         "process.")
    work = pg._engine.recv(tensor, peer, tag, async_op)
    return work if async_op else pg._ranks[peer]


def _tag(tag):
    if not isinstance(tag, int) or isinstance(tag, bool) or tag < 0:
        raise TypeError(f"tag must be a non-negative int, got {tag!r}")
    return tag
