"""The fields of Tensor and UntypedStorage (minitensor/core/fields.py): C base classes (_fields.c) where a C compiler
is at hand, the same classes in Python where none is. Both must behave as the __slots__ classes they stand for,
and a storage must give its block back however it goes."""
import gc
import os
import shutil
import subprocess
import sys
import threading
import weakref

import pytest

import minitensor as mt
from minitensor.core import fields
from minitensor.core.storage import UntypedStorage
from minitensor.cuda import streams
from minitensor.tensor import Tensor

DEV = "cuda"


def test_a_machine_with_a_compiler_uses_the_c_fields():
    if shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip("no C compiler here: the Python fields are the ones in use")
    assert fields.NATIVE


def test_fields_behave_as_slots():
    storage = mt.empty(3).untyped_storage()
    t = Tensor(storage, (3,), (1,), 0, mt.float32)
    assert (t._storage, t._shape, t._stride, t._offset, t.dtype) == (storage, (3,), (1,), 0, mt.float32)
    assert t.device == storage.device and t._layout is None
    assert Tensor(storage, (3,), (1,), 0, mt.float32, 7)._layout == 7
    with pytest.raises(AttributeError):
        t.anything = 1  # no __dict__, as with __slots__
    with pytest.raises(AttributeError):
        Tensor.__new__(Tensor)._shape  # a field never set
    with pytest.raises(TypeError):
        Tensor(storage, (3,))
    with pytest.raises(AttributeError):
        Tensor(object(), (3,), (1,), 0, mt.float32)  # a storage has a device
    r = weakref.ref(t)
    del t
    assert r() is None


def test_a_storage_gives_its_block_back_when_its_last_reference_goes():
    before = mt.cuda.memory_allocated()
    t = mt.empty(1000, device=DEV)
    view = t[10:]
    del t
    assert mt.cuda.memory_allocated() == before + 4096  # the view still holds the storage
    del view
    assert mt.cuda.memory_allocated() == before
    storage = UntypedStorage(5000, DEV)  # the other way a cuda storage is made
    assert mt.cuda.memory_allocated() == before + 5120
    r = weakref.ref(storage)
    del storage
    assert r() is None and mt.cuda.memory_allocated() == before


def test_a_storage_in_a_reference_cycle_gives_its_block_back_when_collected():
    gc.collect()
    before = mt.cuda.memory_allocated()
    t = mt.empty(1000, device=DEV)
    holder = [t]
    t.untyped_storage()._owner = holder  # storage -> holder -> tensor -> storage
    del t, holder
    gc.collect()
    assert mt.cuda.memory_allocated() == before


def test_the_fields_the_fast_paths_read():
    """The hot path's field contract (docs/architecture.md): ops read these fields of tensors, storages, blocks
    and the stream state directly, so each must mean what the contract says."""
    t = mt.arange(12, dtype=mt.float32, device=DEV).view(3, 4)[1:, 1:]
    assert (t._shape, t._stride, t._offset, t.dtype, t.device) == ((2, 3), (4, 1), 5, mt.float32, t._storage.device)
    assert t._storage._block.ptr + t._offset * t.dtype.itemsize == t.data_ptr()
    assert t._storage._allocator is mt.cuda.memory.allocator(t.device.index)
    out = t + 1  # an op's output is born with its layout number
    assert isinstance(out._layout, int) and out._storage._block.ptr == out.data_ptr()
    in_new_thread = []
    thread = threading.Thread(target=lambda: in_new_thread.append(streams._tls.handles))
    thread.start()
    thread.join()
    assert in_new_thread == [None]  # every device on its default stream (handle 0)
    side = mt.cuda.Stream()
    with side:
        assert streams._tls.handles[t.device.index] == side.cuda_stream == mt.cuda.current_stream().cuda_stream
    assert streams._tls.handles[t.device.index] == 0


def test_without_a_compiler_the_python_fields_do_the_same(tmp_path):
    """A fresh process with a compiler that always fails and nothing built yet: the Python fields are used,
    and tensors, views, storages and pinned memory behave as with the C ones (no kernel is needed: on the
    GPU the launcher needs a compiler too)."""
    script = """
import weakref
import numpy as np
import minitensor as mt
from minitensor.core import fields
assert not fields.NATIVE
before = mt.cuda.memory_allocated()
t = mt.empty(1000, device="cuda")
view = t[10:]
del t
assert mt.cuda.memory_allocated() == before + 4096
del view
assert mt.cuda.memory_allocated() == before
pinned = mt.empty(256, pin_memory=True)
assert pinned.is_pinned() and pinned.device.type == "cpu"
c = mt.from_numpy(np.arange(6.0)).view(2, 3).t()
assert c.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]] and c.stride() == (1, 3)
r = weakref.ref(c)
del c
assert r() is None
print("ok")
"""
    env = dict(os.environ, CC="false", MINITENSOR_CACHE_DIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
