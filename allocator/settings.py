"""Allocator settings: torch's `PYTORCH_CUDA_ALLOC_CONF` syntax, read from `MINITENSOR_ALLOC_CONF` and
`mt.cuda.memory.set_allocator_settings`.

`key:value,key:value`, lists as `roundup_power2_divisions:[256:1,512:2,>:8]`, with torch's key names
(`pinned_use_cuda_host_register`; minitensor's older `pinned_use_host_register` too). A bad key or value raises
RuntimeError naming it, as torch's checks do. As in torch, each new string resets the device-allocator options it leaves out
(max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold) and keeps the others.
"""
import dataclasses
import os
import re
from typing import Optional

from .sizes import INTERVALS

ENV = "MINITENSOR_ALLOC_CONF"
_MB = 1 << 20
_MIN_MAX_SPLIT_MB = 20  # max_split_size_mb must be above the large segment size


@dataclasses.dataclass(frozen=True)
class Settings:
    max_split_size: Optional[int] = None  # bytes; blocks this big are never split. None: no limit
    roundup_power2_divisions: Optional[tuple] = None  # one count per power-of-two interval from 1 MiB
    garbage_collection_threshold: float = 0.0  # 0: off
    expandable_segments: bool = False
    pinned_use_host_register: bool = False
    pinned_num_register_threads: int = 1
    pinned_use_background_threads: bool = False


_DEVICE_OPTIONS = ("max_split_size", "roundup_power2_divisions", "garbage_collection_threshold")


def parse(text, previous=Settings()):
    """The settings `text` gives, starting from `previous` with its device-allocator options reset."""
    values = {f.name: getattr(previous, f.name) for f in dataclasses.fields(Settings)}
    for name in _DEVICE_OPTIONS:
        values[name] = getattr(Settings, name)
    tokens = _tokens(text)
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if key not in _PARSERS:
            raise RuntimeError(f"Unrecognized key {key!r} in allocator settings {text!r}; expected one of "
                             f"{', '.join(sorted(_PARSERS))}")
        _expect(tokens, i + 1, ":", key)
        field, value, i = _PARSERS[key](tokens, i + 2, key)
        values[field] = value
        if i < len(tokens):
            _expect(tokens, i, ",", key)
            i += 1
    return Settings(**values)


def _tokens(text):
    """Words and the separators , : [ ] as separate tokens, blanks dropped."""
    if not isinstance(text, str):
        raise TypeError(f"allocator settings must be a str, got {type(text).__name__}")
    return [t for t in re.split(r"\s*([,:\[\]])\s*", text.strip()) if t]


def _expect(tokens, i, token, key):
    if i >= len(tokens) or tokens[i] != token:
        found = tokens[i] if i < len(tokens) else "the end"
        raise RuntimeError(f"Allocator settings: expected {token!r} after {key!r}, found {found!r}")


def _word(tokens, i, key):
    if i >= len(tokens) or tokens[i] in ",:[]":
        raise RuntimeError(f"Allocator settings: missing value for {key!r}")
    return tokens[i]


def _int(word, key):
    try:
        return int(word)
    except ValueError:
        raise RuntimeError(f"Allocator settings: {key} expects an integer, got {word!r}") from None


def _power_of_two(n):
    return n > 0 and n & (n - 1) == 0


def _bool(tokens, i, key):
    word = _word(tokens, i, key)
    if word not in ("True", "False"):
        raise RuntimeError(f"Allocator settings: {key} expects True or False, got {word!r}")
    return word == "True"


def _max_split_size(tokens, i, key):
    mb = _int(_word(tokens, i, key), key)
    if mb <= _MIN_MAX_SPLIT_MB:
        raise RuntimeError(f"Allocator settings: max_split_size_mb must be > {_MIN_MAX_SPLIT_MB}, got {mb}")
    return "max_split_size", mb * _MB, i + 1


def _gc_threshold(tokens, i, key):
    word = _word(tokens, i, key)
    try:
        value = float(word)
    except ValueError:
        raise RuntimeError(f"Allocator settings: {key} expects a number, got {word!r}") from None
    if not 0.0 < value < 1.0:
        raise RuntimeError(f"Allocator settings: garbage_collection_threshold must be in (0, 1), got {word}")
    return "garbage_collection_threshold", value, i + 1


def _divisions(tokens, i, key):
    """A power of two for every size, or `[mb:n,...,>:n]`: from the interval [mb MiB, 2*mb MiB) up to the
    next entry, n divisions (0 or 1: plain 512-byte rounding); the first entry also covers smaller sizes."""
    if i < len(tokens) and tokens[i] == "[":
        table = [0] * INTERVALS
        first, last, i = True, 0, i + 1
        while i < len(tokens) and tokens[i] != "]":
            bound = tokens[i]
            _expect(tokens, i + 1, ":", f"{key} entry {bound!r}")
            n = _int(_word(tokens, i + 2, key), key)
            if n != 0 and not _power_of_two(n):
                raise RuntimeError(f"Allocator settings: {key} divisions must be a power of two or 0, got {n}")
            if bound == ">":
                table[last + 1:] = [n] * (INTERVALS - last - 1)
            else:
                mb = _int(bound, key)
                if not _power_of_two(mb):
                    raise RuntimeError(f"Allocator settings: {key} interval bounds must be powers of two (MiB), "
                                     f"got {mb}")
                index = min(mb.bit_length() - 1, INTERVALS - 1)
                if first:
                    table[:index] = [n] * index
                    first = False
                table[index] = n
                last = index
            i += 3
            if i < len(tokens) and tokens[i] == ",":
                i += 1
        if i >= len(tokens):
            raise RuntimeError(f"Allocator settings: {key} list is missing its closing ']'")
        return "roundup_power2_divisions", (tuple(table) if any(n > 1 for n in table) else None), i + 1
    n = _int(_word(tokens, i, key), key)
    if not _power_of_two(n):
        raise RuntimeError(f"Allocator settings: {key} must be a power of two, got {n}")
    return "roundup_power2_divisions", ((n,) * INTERVALS if n > 1 else None), i + 1


def _register_threads(tokens, i, key):
    n = _int(_word(tokens, i, key), key)
    if not _power_of_two(n) or n > 128:
        raise RuntimeError(f"Allocator settings: {key} must be a power of two <= 128, got {n}")
    return "pinned_num_register_threads", n, i + 1


def _flag(field):
    return lambda tokens, i, key: (field, _bool(tokens, i, key), i + 1)


_PARSERS = {
    "max_split_size_mb": _max_split_size,
    "roundup_power2_divisions": _divisions,
    "garbage_collection_threshold": _gc_threshold,
    "expandable_segments": _flag("expandable_segments"),
    "pinned_use_cuda_host_register": _flag("pinned_use_host_register"),  # torch's name
    "pinned_use_host_register": _flag("pinned_use_host_register"),
    "pinned_num_register_threads": _register_threads,
    "pinned_use_background_threads": _flag("pinned_use_background_threads"),
}

_current = None


def current():
    """The settings in force: `MINITENSOR_ALLOC_CONF` until `update` is called."""
    global _current
    if _current is None:
        try:
            _current = parse(os.environ.get(ENV, ""))
        except RuntimeError as e:
            raise RuntimeError(f"{ENV}: {e}") from None
    return _current


def update(text):
    """Parse `text` over the current settings and make the result current; returns it."""
    global _current
    _current = parse(text, current())
    return _current
