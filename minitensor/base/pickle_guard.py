"""The budgets of every pickle minitensor reads (`mt.load`'s restricted reader, the memory viewer): any pickle,
however hostile, is read in time and memory bounded by its size, or refused with a `pickle.UnpicklingError`
naming the limit it passed. `Guard` keeps one reading's accounts; pickle_reader.py charges it for every opcode,
and a caller walking what was read (the viewer's model) charges the same budget for its own work.

Three ways a small pickle could do unbounded harm, and the limit on each:
- Nesting: Python hashes a tuple by recursing in C with no depth check, so a dict key nested 200,000 tuples
  deep crashes the process. Every container records its height (1 + the height of what it holds) as it is
  built or filled; past `MAX_DEPTH` the pickle is refused. Python's own pickler cannot write deeper than its
  recursion limit (1000), so no file Python wrote comes near it.
- Amplification: memo GET pushes an existing object for two bytes, so a pickle can make the allowed callables
  copy one memoized object (`set(list)`, `torch.Size(list)`, `bytearray(bytes)`, `_codecs.encode(str)`) or hash
  it (a big tuple as a dict key), or make BUILD copy one dict, or make a caller walk one list, over and over.
  Every such copy, hash or walk is charged its element count against a budget of `WORK_PER_BYTE` elements per
  byte of the pickle plus `WORK_FLOOR`; a tuple that unfolds (shared tuples counted at each use) past the
  budget is refused as it is built. A pickle torch wrote charges at most a few elements per byte.
- Hash flooding: ints, floats, complexes and tuples hash predictably, so a pickle can fill a dict or set with
  keys of one hash, each insert then comparing with all before it (60,000 keys: a minute). More than
  `MAX_EQUAL_HASHES` keys of one hash in one container are refused (ints within int64 share a hash at most 6
  ways, and are not counted); str and bytes hash with Python's random key and are not counted.
"""
from collections import Counter
from itertools import repeat
from pickle import UnpicklingError

MAX_DEPTH = 1000
WORK_PER_BYTE = 4
WORK_FLOOR = 1 << 20
SET_WEIGHT = 4  # elements charged per item a set or frozenset copies: its table takes ~100 bytes an item, a list 8
MAX_EQUAL_HASHES = 16

_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1  # ints in this range share a hash at most 6 ways
_PREDICTABLE = (int, float, complex, tuple, frozenset)  # hashes a file can choose, save for bools and int64s


class Guard:
    """The accounts of one unpickling: the height of every container it built and the unfolded size of every
    tuple and big int (looked up by id, in C, as `map(dict.get, ...)`), the elements it copied or hashed, and the
    hashes of the keys of each dict and set."""

    def __init__(self, pickle_size: int) -> None:
        self.budget = WORK_PER_BYTE * pickle_size + WORK_FLOOR
        self._pickle_size = pickle_size
        self._spent = 0
        self._heights = {}  # id(container) -> height; an object missing holds no container: 0
        self._sizes = {}  # id(tuple or big int) -> elements hashing it visits; missing: 1
        self._kept = []  # every object in _heights or _sizes, alive, so that its id is not reused
        self._hashes = Counter()  # (id(container), hash) -> keys inserted

    def spend(self, n: int, what: str) -> None:
        """Charge `n` elements for `what` (a phrase: "set() copying 50000 items")."""
        self._spent += n
        if self._spent > self.budget:
            raise UnpicklingError(f"the pickle builds more than the loader's budget of {self.budget} elements "
                                  f"({WORK_PER_BYTE} per byte of its {self._pickle_size} bytes, plus {WORK_FLOOR}): "
                                  f"{what} went past it (a file that copies, hashes or walks memoized objects "
                                  "over and over: a memo amplification)")

    def new(self, container: object) -> None:
        """An empty container was made (each container the pickle builds must be announced here or below)."""
        if id(container) not in self._heights:
            self._kept.append(container)
            self._heights[id(container)] = 1

    def big_int(self, value: int) -> None:
        """An int from the pickle: one past 64 bits costs a hash one element per 64 bits (it is not cached)."""
        if value.bit_length() >= 64:
            self._kept.append(value)
            self._sizes[id(value)] = 1 + (value.bit_length() >> 6)

    def hold(self, container: object, items: "list | tuple") -> object:
        """`container` was built from, or now also holds, `items`: raise its height (one past its highest item);
        a tuple's unfolded size is its items' sizes plus one. Returns `container`. (It runs for every container
        the pickle builds.)"""
        heights, sizes = self._heights, self._sizes
        height, size = 0, 1
        if len(items) > 32:  # C loops: 3x slower for a few items, 3x faster for many
            ids = list(map(id, items))
            height = max(map(heights.get, ids, repeat(0)))
            size += sum(map(sizes.get, ids, repeat(1))) if type(container) is tuple else 0
        else:
            for x in items:
                key = id(x)
                h = heights.get(key)
                if h is not None and h > height:
                    height = h
                size += sizes.get(key, 1)
        self._record(container, height + 1, size if type(container) is tuple else 1)
        return container

    def copied(self, container: object, source: "list | tuple | set | frozenset | dict", what: str) -> None:
        """`container` (a set, frozenset, torch.Size or an OrderedDict's attributes) now holds the items of
        `source`, copied by `what`: charge the copy; the container is as high as `source`."""
        weight = SET_WEIGHT if isinstance(container, (set, frozenset)) else 1
        self.spend(weight * len(source), f"{what} copying {len(source)} items")
        size = 1 + sum(map(self._sizes.get, map(id, source), repeat(1))) if isinstance(container, tuple) else 1
        self._record(container, self._heights.get(id(source), 1), size)

    def keys(self, container: object, keys: "list | tuple") -> None:
        """Charge hashing `keys` into `container` (a dict or set being filled, or None for a new set of them) and
        count them by hash; refuse the key that makes more than MAX_EQUAL_HASHES of one hash there. str, bytes
        (hashed with Python's random key), int64s, None, bools, devices and tensors are not counted."""
        risky = [key for key in keys if isinstance(key, _PREDICTABLE) and not (type(key) is int and
                                                                            _INT64_MIN <= key <= _INT64_MAX)]
        hashes = Counter() if container is None else self._hashes
        sizes, tag = self._sizes, id(container)
        for key in risky:
            size = sizes.get(id(key), 1)
            if size > 1:  # charged before it is hashed: a tuple's hash visits its items
                self.spend(size, f"hashing a key of {size} elements")
            slot = (tag, hash(key))
            count = hashes[slot] = hashes[slot] + 1
            if count > MAX_EQUAL_HASHES:
                raise UnpicklingError(f"the pickle puts more than {MAX_EQUAL_HASHES} keys with one hash ({slot[1]}) "
                                      f"into one {'set' if container is None else type(container).__name__}: "
                                      "inserting each compares it with all the others before it (a hash-flooding "
                                      "file)")
            if count > 1:
                self.spend(size * (count - 1), "comparing keys of equal hash")

    def _record(self, container, height, size):
        key = id(container)
        old = self._heights.get(key)
        if old is None:
            self._kept.append(container)
        elif old > height:
            height = old
        if height > MAX_DEPTH:
            raise UnpicklingError(f"the pickle nests containers deeper than the loader allows: a "
                                  f"{type(container).__name__} nested more than {MAX_DEPTH} containers deep (a "
                                  "checkpoint's objects are nested a few levels; Python hashes nested tuples "
                                  "recursively, and crashes past a few hundred thousand)")
        self._heights[key] = height
        if size > 1:  # a tuple (or torch.Size), hashed through its items
            if size > self.budget:
                self.spend(size, f"a tuple unfolding to {size} elements (its shared tuples counted at each use)")
            self._sizes[key] = size
