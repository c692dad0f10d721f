"""Reading a memory snapshot someone sent: a pickle is read as mt.load reads a checkpoint, by minitensor.base's
pickle reader (no code from the file runs; nesting, copies and hashes are bounded by the file's size), and every
field the model uses is checked to be what torch writes, so that anything else is one line naming it.

`Tables` interns what the page shows by table (frames, stacks, pools, segment types) and charges each new one,
as the model charges every list it walks, to the pickle's budget: a small file that repeats one object through
its memo cannot make a huge page.
"""
import os
from pickle import UnpicklingError

from ..base.pickle_reader import PickleReader

GENERAL_POOL = (0, 0)
INT64_MIN, INT64_MAX, UINT64_MAX = -2**63, 2**63 - 1, 2**64 - 1
_REQUIRED = object()


class SnapshotError(ValueError):
    """The input is not a memory snapshot, or cannot be read; the message (one line) names the file."""


class Malformed(Exception):
    """A field that is not what torch writes: `what` was expected, `path` says where (`['blocks'][2]['size']`);
    each caller that knows more of the path adds its step with `within`."""

    def __init__(self, what: str, path: str = "") -> None:
        super().__init__(what)
        self.what, self.path = what, path

    def within(self, step: str) -> "Malformed":
        """The same error, `step` in front of its path."""
        return Malformed(self.what, step + self.path)


class _SnapshotReader(PickleReader):
    """Snapshots hold only dicts, lists, tuples, strings and numbers: refusing every global means that opening a
    pickle someone sent cannot run code from it; the reader's budgets are mt.load's."""

    def _find(self, module, name):
        raise UnpicklingError(f"it names {module}.{name}, and a snapshot holds plain Python values only")


def read(source: "dict | list | str | os.PathLike") -> tuple:
    """(snapshot dict, name, spend): what `load` gives, and the charge for walking it, `spend(n, what)` of the
    pickle's budget (None for a dict or list given: the caller built it). Raises SnapshotError naming the file."""
    if isinstance(source, (dict, list)):
        return _checked(source, "snapshot"), "snapshot", None
    name = os.fsdecode(source)
    try:
        with open(name, "rb") as f:
            reader = _SnapshotReader(f.read())
        obj = reader.load()
    except FileNotFoundError:
        raise SnapshotError(f"{name}: no such file") from None
    except OSError as e:
        raise SnapshotError(f"{name}: cannot read it ({e.strerror or e})") from None
    except UnpicklingError as e:
        raise SnapshotError(f"{name}: not a memory snapshot pickle ({e})") from None
    return _checked(obj, name), name, reader.guard.spend


def load(source: "dict | list | str | os.PathLike") -> "tuple[dict, str]":
    """(snapshot dict, name) from a `_snapshot()` dict, a `memory_snapshot()` list, or the path of a pickle of
    either (what `_dump_snapshot` writes). Raises SnapshotError naming the file."""
    snapshot, name, _ = read(source)
    return snapshot, name


def _checked(obj, name):
    if isinstance(obj, list):
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise SnapshotError(f"{name}: not a memory snapshot: expected a dict with a 'segments' list (torch's "
                            f"_snapshot()) or a list of segments (memory_snapshot()), got {describe(obj)}")
    traces = obj.get("device_traces") or []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError(f"{name}: not a memory snapshot: 'device_traces' must be a list of lists")
    return obj


# ------------------------------------------------------------------------------------ the fields
def describe(value: object) -> str:
    """`value` in a few words, for an error message of one line."""
    if type(value) is int and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    if type(value) in (str, bytes):
        return repr(value) if len(value) <= 60 else repr(value[:57]) + "..."
    if type(value) in (int, float, bool, type(None)):
        return repr(value)
    return f"a {type(value).__name__}"


def int_at(d: dict, key: str, default: object = _REQUIRED, lo: int = 0, hi: int = UINT64_MAX) -> int:
    """d[key], an int in [lo, hi] (a bool is not one here); `default` when missing, if given."""
    if key not in d:
        if default is _REQUIRED:
            raise Malformed(f"missing (an int in {_span(lo, hi)} expected)", f"[{key!r}]")
        return default
    value = d[key]
    if type(value) is not int or not lo <= value <= hi:
        raise Malformed(f"an int in {_span(lo, hi)} expected, got {describe(value)}", f"[{key!r}]")
    return value


def _span(lo, hi):
    name = {INT64_MIN: "-2**63", INT64_MAX: "2**63 - 1", UINT64_MAX: "2**64 - 1"}
    return f"[{name.get(lo, lo)}, {name.get(hi, hi)}]"


def time_at(d: dict) -> "int | float":
    """d["time_us"]: an int or finite float within int64 (the page subtracts them), 0 when missing."""
    value = d.get("time_us", 0)
    if type(value) not in (int, float) or not INT64_MIN <= value <= INT64_MAX:
        raise Malformed(f"a number of microseconds within int64 expected, got {describe(value)}", "['time_us']")
    return value


def str_at(d: dict, key: str, default: "str | None") -> "str | None":
    """d[key], a string; `default` when missing."""
    value = d.get(key, default)
    if type(value) is not str and value is not default:
        raise Malformed(f"a string expected, got {describe(value)}", f"[{key!r}]")
    return value


def as_dict(value: object, what: str) -> dict:
    """`value`, which must be a dict (`what` names it: "a segment")."""
    if not isinstance(value, dict):
        raise Malformed(f"{what} must be a dict, got {describe(value)}")
    return value


def list_at(d: dict, key: str) -> "list | tuple":
    """d[key], a list (or tuple); empty when missing or None."""
    value = d.get(key)
    if value is None:
        return ()
    if type(value) not in (list, tuple):
        raise Malformed(f"a list expected, got {describe(value)}", f"[{key!r}]")
    return value


class Tables:
    """Frames, stacks, pool ids and segment types, checked once and interned for the whole page: a long trace
    repeats a few stacks, and recorders (minitensor's included) share one dict per distinct frame and one list per
    distinct stack, so those are keyed by identity first (the snapshot keeps them alive while the model is built).
    Each new one is charged to `spend(n, what)`. A stack is checked wherever it is (`stack`), and kept for the page
    only where the page shows it (`index`)."""

    def __init__(self, spend) -> None:
        self.spend = spend
        self.frames, self.stacks, self.pools, self.segment_types = [], [[]], [GENERAL_POOL], []
        self._texts, self._checked = {}, {}  # id(frame dict) -> its text; id(frames list) -> a tuple of texts
        self._frame_ids, self._stack_ids, self._indices = {}, {(): 0}, {}  # text, frame ids, id(tuple) -> index
        self._pool_ids, self._type_ids = {GENERAL_POOL: 0}, {}

    def _text(self, frame):
        found = self._texts.get(id(frame))
        if found is not None:
            return found
        as_dict(frame, "a frame")
        text = (f"{str_at(frame, 'filename', '?')}:{int_at(frame, 'line', '?', INT64_MIN, INT64_MAX)} "
                f"{str_at(frame, 'name', '?')}")
        self.spend(1 + len(text) // 8, "the text of a frame")
        self._texts[id(frame)] = text
        return text

    def stack(self, d: dict) -> tuple:
        """d["frames"] (a list of {"filename", "line", "name"}; missing or None: none), checked: a tuple of its
        frames' texts, innermost first."""
        frames = d.get("frames")
        if frames is None or (type(frames) in (list, tuple) and not frames):
            return ()
        found = self._checked.get(id(frames))
        if found is not None:
            return found
        list_at(d, "frames")
        self.spend(1 + len(frames), "a list of frames")
        texts = []
        for k, frame in enumerate(frames):
            try:
                texts.append(self._text(frame))
            except Malformed as e:
                raise e.within(f"['frames'][{k}]") from None
        texts = self._checked[id(frames)] = tuple(texts)
        return texts

    def index(self, stack: tuple) -> int:
        """The index in stacks of a tuple `stack` gave, its frames' texts added to frames."""
        if not stack:
            return 0
        found = self._indices.get(id(stack))
        if found is not None:
            return found
        ids = []
        for text in stack:
            frame = self._frame_ids.setdefault(text, len(self._frame_ids))
            if frame == len(self.frames):
                self.frames.append(text)
            ids.append(frame)
        ids = tuple(ids)
        index = self._indices[id(stack)] = self._stack_ids.setdefault(ids, len(self._stack_ids))
        if index == len(self.stacks):
            self.stacks.append(list(ids))
        return index

    def pool(self, d: dict, key: str) -> int:
        """The index of d[key] in pools: a pair of ints (torch's MempoolId_t); missing or None: the general cache."""
        pool_id = d.get(key)
        if pool_id is None:
            return 0
        if type(pool_id) not in (tuple, list) or len(pool_id) != 2 or not all(
                type(x) is int and INT64_MIN <= x <= UINT64_MAX for x in pool_id):
            raise Malformed(f"a pool id (a pair of ints) expected, got {describe(pool_id)}", f"[{key!r}]")
        pool_id = tuple(pool_id)
        index = self._pool_ids.setdefault(pool_id, len(self._pool_ids))
        if index == len(self.pools):
            self.pools.append(list(pool_id))
        return index

    def segment_type(self, d: dict) -> "int | None":
        """The index of d["segment_type"] ("small", "large") in segment_types; None when missing."""
        kind = str_at(d, "segment_type", None)
        if kind is None:
            return None
        index = self._type_ids.get(kind)
        if index is None:
            self.spend(1 + len(kind) // 8, f"a segment type of {len(kind)} characters")
            index = self._type_ids[kind] = len(self.segment_types)
            self.segment_types.append(kind)
        return index
