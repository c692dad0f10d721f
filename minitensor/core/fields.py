"""The fields of `Tensor` and `UntypedStorage`, in base classes those two extend with their methods.

Every op that allocates makes a tensor and a storage and later drops both; as plain Python classes that was
about a third of the Python time around a kernel launch. So the fields live in C (_fields.c, built like the
kernel launcher), as torch keeps its tensor's data in the C class `torch._C.TensorBase`:
- `TensorFields(storage, shape, stride, offset, dtype, layout=None)`: the device is the storage's; `layout`
  is the layout number when the caller has it (layout.py);
- `StorageFields`: device, _nbytes, _array, _block, _allocator, _owner; when `_allocator` is set, the
  storage hands `_block` back to it (`_allocator.free(_block)`) as it goes;
- `tensor(storage, shape, stride, offset, dtype, layout)`: a new Tensor in one call;
- `allocate(nbytes, device, allocator, stream)`: a new device UntypedStorage over
  `allocator.alloc(nbytes, stream)`;
- `storage(device, nbytes, array, block, allocator, owner)`: a new UntypedStorage with these fields;
- `register(Tensor, UntypedStorage)`: the classes that `tensor`, `allocate` and `storage` make. The Tensor class
  sits above the ops that make tensors (minitensor/tensor.py calls down into them), so they recognise and build
  tensors through `fields.Tensor`, which is that class once registered.

Without a C compiler the same classes and functions come from this module, in Python. Fields behave as
__slots__ do in both: one never set raises AttributeError.
"""
import os

from ..base import cext

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fields.c")


class _TensorFields:
    __slots__ = ("_storage", "_shape", "_stride", "_offset", "dtype", "device", "_layout", "__weakref__")

    def __init__(self, storage, shape, stride, offset, dtype, layout=None):
        self._storage = storage
        self._shape = shape
        self._stride = stride
        self._offset = offset
        self.dtype = dtype
        self.device = storage.device
        self._layout = layout


class _StorageFields:
    __slots__ = ("device", "_nbytes", "_array", "_block", "_allocator", "_owner", "__weakref__")

    def __del__(self):
        allocator = getattr(self, "_allocator", None)
        if allocator is not None:
            try:
                allocator.free(self._block)
            except Exception:  # interpreter shutdown: the driver may already be gone
                pass


class _PythonFields:
    """What _fields.c gives, in Python."""

    TensorFields, StorageFields = _TensorFields, _StorageFields

    def __init__(self):
        self._tensor_class = self._storage_class = None

    def register(self, tensor_class, storage_class):
        self._tensor_class, self._storage_class = tensor_class, storage_class

    def tensor(self, *args):
        return self._tensor_class(*args)

    def allocate(self, nbytes, device, allocator, stream):
        block = allocator.alloc(nbytes, stream)  # first: a failed allocation leaves no half-built storage
        return self.storage(device, nbytes, None, block, allocator, None)

    def storage(self, device, nbytes, array, block, allocator, owner):
        storage = object.__new__(self._storage_class)  # not UntypedStorage.__new__, which comes here
        storage.device = device
        storage._nbytes = nbytes
        storage._array = array
        storage._block = block
        storage._allocator = allocator
        storage._owner = owner
        return storage


def _load():
    try:
        return cext.load(_SOURCE, "_minitensor_fields")
    except RuntimeError:  # no C compiler
        return _PythonFields()


_fields = _load()
TensorFields, StorageFields = _fields.TensorFields, _fields.StorageFields
tensor, allocate, storage = _fields.tensor, _fields.allocate, _fields.storage
NATIVE = not isinstance(_fields, _PythonFields)  # for tests: which implementation this process uses
Tensor = None  # the Tensor class, once registered


def register(tensor_class, storage_class):
    """Make `tensor()` build `tensor_class` and `allocate()`/`storage()` build `storage_class`."""
    global Tensor
    _fields.register(tensor_class, storage_class)
    Tensor = tensor_class
