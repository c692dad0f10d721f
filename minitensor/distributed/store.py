"""The key-value store ranks meet through: torch's `Store` base class and `PrefixStore`.

`Store` checks every argument once (keys are str, values str or bytes, amounts int64, timeouts non-negative
timedeltas) and hands the concrete store (TCPStore, FileStore) plain str keys, bytes values and seconds, so each
of them only moves bytes. Values come back as bytes, as torch returns them. A timeout as long as
`timedelta.max` (torch's way to say "forever") reaches them as MAX_TIMEOUT_S, which every wait of the system
can take.
"""
import abc
import datetime
import operator

from .errors import DistStoreError

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
MAX_TIMEOUT_S = 1e9  # about 31 years; longer ones overflow socket and lock timeouts (threading.TIMEOUT_MAX)


def check_timeout(timeout):
    """A timeout as a timedelta (torch's type for every store and process-group timeout), never negative."""
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout < datetime.timedelta(0):
        raise ValueError(f"timeout must not be negative, got {timeout}")
    return timeout


def timeout_seconds(timeout: datetime.timedelta) -> float:
    """A checked timeout in seconds, at most MAX_TIMEOUT_S: `timedelta.max` waits (practically) forever."""
    return min(check_timeout(timeout).total_seconds(), MAX_TIMEOUT_S)


def as_bytes(value, what):
    """A store value as bytes: str is UTF-8 encoded, bytes-like objects are copied."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{what} must be str or bytes, got {type(value).__name__}")


def added(current, key, amount):
    """The value `add` stores: the integer `current` holds (None: the key is unset, 0) plus `amount`, as the
    decimal digits torch stores, so `get` after `add` reads b"7"."""
    if current is None:
        return str(amount).encode()
    try:
        return str(int(current) + amount).encode()
    except ValueError:
        shown = repr(current) if len(current) <= 64 else f"{current[:64]!r}... ({len(current)} bytes)"
        raise DistStoreError(f"add(): key '{key}' holds {shown}, not an integer") from None


def compare_set_outcome(current, expected, desired):
    """(the value to store, None to leave the key as it is; the value compare_set returns), torch's rules:
    an unset key is set only when `expected` is empty, and then answers `desired`, else `expected`."""
    if current is None:
        return (desired, desired) if expected == b"" else (None, expected)
    return (desired, desired) if current == expected else (None, current)


def _key(key, method):
    if not isinstance(key, str):
        raise TypeError(f"{method}(): key must be a str, got {type(key).__name__}")
    return key


def _keys(keys, method):
    """A list of keys; a lone str is refused, as torch refuses it, rather than read as its characters."""
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise TypeError(f"{method}(): keys must be a list of str, got {type(keys).__name__}")
    return [_key(key, method) for key in keys]


class Store(abc.ABC):
    """torch.distributed.Store: a key-value store shared by processes, with blocking `get` and `wait`.

    Subclasses implement the abstract underscore methods on checked arguments; timeouts reach them in seconds."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        self._timeout = check_timeout(timeout)

    @property
    def timeout(self):
        """How long `get` and `wait` without a timeout of their own block before raising DistStoreError."""
        return self._timeout

    def set_timeout(self, timeout):
        self._timeout = check_timeout(timeout)

    def set(self, key, value):
        self._set(_key(key, "set"), as_bytes(value, "set(): value"))

    def get(self, key):
        """The value of `key` as bytes, waiting up to the store's timeout for another process to set it."""
        return self._get(_key(key, "get"), timeout_seconds(self.timeout))

    def add(self, key, amount):
        """Adds `amount` to the integer stored at `key` (0 when unset) and returns the sum, atomically."""
        amount = operator.index(amount)
        if not -2**63 <= amount < 2**63:
            raise OverflowError(f"add(): amount must fit in a 64-bit integer (torch's int64_t), got {amount}")
        return self._add(_key(key, "add"), amount)

    def compare_set(self, key, expected_value, desired_value):
        """Sets `key` to `desired_value` if it holds `expected_value` (or is unset and `expected_value` is
        empty); returns the value the key holds afterwards, or `expected_value` when the key is unset."""
        return self._compare_set(_key(key, "compare_set"), as_bytes(expected_value, "compare_set(): expected_value"),
                                 as_bytes(desired_value, "compare_set(): desired_value"))

    def wait(self, keys, timeout=None):
        """Blocks until every key is set; DistStoreError naming the missing ones after `timeout` (default: the
        store's)."""
        self._wait(_keys(keys, "wait"), timeout_seconds(self.timeout if timeout is None else timeout))

    def check(self, keys):
        """Whether every key is set, without waiting."""
        return self._check(_keys(keys, "check"))

    def delete_key(self, key):
        """Removes `key`; whether it was there."""
        return self._delete_key(_key(key, "delete_key"))

    def num_keys(self):
        """How many keys are set. Unlike torch's TCPStore and FileStore, the count has no internal key in it."""
        return self._num_keys()

    @abc.abstractmethod
    def _set(self, key, value):
        """Stores bytes `value` at str `key`."""

    @abc.abstractmethod
    def _get(self, key, timeout_s):
        """The bytes at `key`, waiting up to `timeout_s` seconds, then DistStoreError."""

    @abc.abstractmethod
    def _add(self, key, amount):
        """Adds int `amount` to the integer at `key` (0 when unset) and returns the sum."""

    @abc.abstractmethod
    def _compare_set(self, key, expected, desired):
        """`compare_set` on bytes."""

    @abc.abstractmethod
    def _wait(self, keys, timeout_s):
        """Waits up to `timeout_s` seconds for every key, then DistStoreError naming the missing ones."""

    @abc.abstractmethod
    def _check(self, keys):
        """Whether every key is set."""

    @abc.abstractmethod
    def _delete_key(self, key):
        """Removes `key`; whether it was there."""

    @abc.abstractmethod
    def _num_keys(self):
        """How many keys are set."""


class PrefixStore(Store):
    """torch.distributed.PrefixStore: the keys of `store` that start with "prefix/", seen without it, so two
    groups (or two uses) sharing one store never read each other's keys. Timeouts are the underlying store's."""

    def __init__(self, prefix, store):
        if not isinstance(prefix, str):
            raise TypeError(f"PrefixStore(): prefix must be a str, got {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore(): store must be a minitensor.distributed.Store, got {type(store).__name__}")
        self._prefix = prefix + "/"
        self._store = store

    @property
    def underlying_store(self):
        return self._store

    @property
    def timeout(self):
        return self._store.timeout

    def set_timeout(self, timeout):
        self._store.set_timeout(timeout)

    def _set(self, key, value):
        self._store.set(self._prefix + key, value)

    def _get(self, key, timeout_s):  # timeout_s is the underlying store's timeout: get waits that long
        return self._store.get(self._prefix + key)

    def _add(self, key, amount):
        return self._store.add(self._prefix + key, amount)

    def _compare_set(self, key, expected, desired):
        return self._store.compare_set(self._prefix + key, expected, desired)

    def _wait(self, keys, timeout_s):
        self._store.wait([self._prefix + key for key in keys], datetime.timedelta(seconds=timeout_s))

    def _check(self, keys):
        return self._store.check([self._prefix + key for key in keys])

    def _delete_key(self, key):
        return self._store.delete_key(self._prefix + key)

    def _num_keys(self):
        """All keys of the underlying store, as torch counts them: the store cannot list keys by prefix."""
        return self._store.num_keys()
