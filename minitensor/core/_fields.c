/* The fields of Tensor and UntypedStorage, in C: the base classes `TensorFields` and `StorageFields`, as torch
 * puts its Tensor's data in the C class `torch._C.TensorBase` and its methods in Python.
 *
 * Why: every op that allocates makes one tensor and one storage and later drops both. As Python classes with
 * __slots__ that cost about 0.6 us of the ~1.7 us of Python around a launch (H100 host): the __init__ frame,
 * a store per field, and on release a __del__ frame that gives the block back. Here a tensor is built by one
 * C call, a device storage together with its allocation by another, and the storage gives its block back
 * from C (tp_finalize), calling the allocator's `free` with no frame of its own.
 *
 * The fields behave exactly as the __slots__ they replace (a field never set raises AttributeError), and
 * minitensor/fields.py holds the same classes in Python for machines without a C compiler.
 * Built on first use by minitensor/kernels/native.py, like the kernel launcher.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <structmember.h>

/* ------------------------------------------------------------------------------------------- TensorFields */
typedef struct {
    PyObject_HEAD
    PyObject *storage, *shape, *stride, *offset, *dtype, *device, *layout;
    PyObject *weakrefs;
} TensorFields;

static PyObject *str_device, *str_alloc, *str_free;
static PyTypeObject *tensor_class, *storage_class; /* the Python classes made by tensor(), allocate() */

static int tensor_traverse(TensorFields *self, visitproc visit, void *arg) {
    Py_VISIT(self->storage);
    Py_VISIT(self->shape);
    Py_VISIT(self->stride);
    Py_VISIT(self->offset);
    Py_VISIT(self->dtype);
    Py_VISIT(self->device);
    Py_VISIT(self->layout);
    return 0; /* a heap subclass's own traverse visits its type (static base: CPython's subtype_traverse) */
}

static int tensor_clear(TensorFields *self) {
    Py_CLEAR(self->storage);
    Py_CLEAR(self->shape);
    Py_CLEAR(self->stride);
    Py_CLEAR(self->offset);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->device);
    Py_CLEAR(self->layout);
    return 0;
}

/* For a heap subclass's instance this runs from CPython's subtype_dealloc, which drops the reference to the
 * type itself (the base is static), so neither dealloc here touches the type's refcount. */
static void tensor_dealloc(TensorFields *self) {
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    tensor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Fill a new tensor: storage, shape, stride, offset, dtype[, layout]; the device is the storage's. */
static int tensor_fill(TensorFields *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 5 || nargs > 6) {
        PyErr_Format(PyExc_TypeError,
                     "Tensor(storage, shape, stride, offset, dtype, layout=None) takes 5 or 6 arguments, got %zd",
                     nargs);
        return -1;
    }
    PyObject *device = PyObject_GetAttr(args[0], str_device);
    if (device == NULL) return -1;
    Py_XSETREF(self->device, device);
    Py_XSETREF(self->storage, Py_NewRef(args[0]));
    Py_XSETREF(self->shape, Py_NewRef(args[1]));
    Py_XSETREF(self->stride, Py_NewRef(args[2]));
    Py_XSETREF(self->offset, Py_NewRef(args[3]));
    Py_XSETREF(self->dtype, Py_NewRef(args[4]));
    Py_XSETREF(self->layout, Py_NewRef(nargs == 6 ? args[5] : Py_None));
    return 0;
}

static int tensor_init(TensorFields *self, PyObject *args, PyObject *kwargs) {
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs)) {
        PyErr_SetString(PyExc_TypeError, "Tensor(storage, shape, stride, offset, dtype, layout=None) takes no "
                                         "keyword arguments");
        return -1;
    }
    return tensor_fill(self, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
}

static PyMemberDef tensor_members[] = {
    {"_storage", T_OBJECT_EX, offsetof(TensorFields, storage), 0, NULL},
    {"_shape", T_OBJECT_EX, offsetof(TensorFields, shape), 0, NULL},
    {"_stride", T_OBJECT_EX, offsetof(TensorFields, stride), 0, NULL},
    {"_offset", T_OBJECT_EX, offsetof(TensorFields, offset), 0, NULL},
    {"dtype", T_OBJECT_EX, offsetof(TensorFields, dtype), 0, NULL},
    {"device", T_OBJECT_EX, offsetof(TensorFields, device), 0, NULL},
    {"_layout", T_OBJECT_EX, offsetof(TensorFields, layout), 0, NULL},
    {NULL},
};

static PyTypeObject TensorFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minitensor.core.fields.TensorFields",
    .tp_basicsize = sizeof(TensorFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A tensor's fields: storage, shape, stride, offset, dtype, device and layout number.",
    .tp_traverse = (traverseproc)tensor_traverse,
    .tp_clear = (inquiry)tensor_clear,
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_weaklistoffset = offsetof(TensorFields, weakrefs),
    .tp_members = tensor_members,
    .tp_init = (initproc)tensor_init,
    .tp_new = PyType_GenericNew,
};

/* tensor(storage, shape, stride, offset, dtype[, layout]): Tensor(...) in one call, without type.__call__. */
static PyObject *new_tensor(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (tensor_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "minitensor.core.fields: no Tensor class registered");
        return NULL;
    }
    PyObject *self = tensor_class->tp_alloc(tensor_class, 0);
    if (self == NULL) return NULL;
    if (tensor_fill((TensorFields *)self, args, nargs) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return self;
}

/* ------------------------------------------------------------------------------------------ StorageFields */
typedef struct {
    PyObject_HEAD
    PyObject *device, *nbytes, *array, *block, *allocator, *owner;
    PyObject *weakrefs;
} StorageFields;

static int storage_traverse(StorageFields *self, visitproc visit, void *arg) {
    Py_VISIT(self->device);
    Py_VISIT(self->nbytes);
    Py_VISIT(self->array);
    Py_VISIT(self->block);
    Py_VISIT(self->allocator);
    Py_VISIT(self->owner);
    return 0;
}

static int storage_clear(StorageFields *self) {
    Py_CLEAR(self->device);
    Py_CLEAR(self->nbytes);
    Py_CLEAR(self->array);
    Py_CLEAR(self->block);
    Py_CLEAR(self->allocator);
    Py_CLEAR(self->owner);
    return 0;
}

/* The storage's last reference is gone: its allocator, if it has one, takes the block back. An error is
 * dropped, as the __del__ it replaces did (at interpreter shutdown the driver may already be gone). */
static void storage_finalize(StorageFields *self) {
    if (self->allocator == NULL || self->allocator == Py_None || self->block == NULL) return;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *pending = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
#endif
    PyObject *args[2] = {self->allocator, self->block};
    PyObject *result = PyObject_VectorcallMethod(str_free, args, 2, NULL);
    if (result == NULL) PyErr_Clear();
    Py_XDECREF(result);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(pending);
#else
    PyErr_Restore(type, value, traceback);
#endif
}

static void storage_dealloc(StorageFields *self) {
    /* a subclass's instance is finalized already (subtype_dealloc): this call then does nothing */
    if (PyObject_CallFinalizerFromDealloc((PyObject *)self) < 0) return; /* resurrected */
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    storage_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef storage_members[] = {
    {"device", T_OBJECT_EX, offsetof(StorageFields, device), 0, NULL},
    {"_nbytes", T_OBJECT_EX, offsetof(StorageFields, nbytes), 0, NULL},
    {"_array", T_OBJECT_EX, offsetof(StorageFields, array), 0, NULL},
    {"_block", T_OBJECT_EX, offsetof(StorageFields, block), 0, NULL},
    {"_allocator", T_OBJECT_EX, offsetof(StorageFields, allocator), 0, NULL},
    {"_owner", T_OBJECT_EX, offsetof(StorageFields, owner), 0, NULL},
    {NULL},
};

static PyTypeObject StorageFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "minitensor.core.fields.StorageFields",
    .tp_basicsize = sizeof(StorageFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A storage's fields; the allocator, when set, takes the block back when the storage goes.",
    .tp_traverse = (traverseproc)storage_traverse,
    .tp_clear = (inquiry)storage_clear,
    .tp_dealloc = (destructor)storage_dealloc,
    .tp_finalize = (destructor)storage_finalize,
    .tp_weaklistoffset = offsetof(StorageFields, weakrefs),
    .tp_members = storage_members,
    .tp_new = PyType_GenericNew,
};

/* A new storage of the registered class with fields device, nbytes, array, block, allocator, owner. */
static PyObject *make_storage(PyObject *const *fields) {
    if (storage_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "minitensor.core.fields: no storage class registered");
        return NULL;
    }
    StorageFields *self = (StorageFields *)storage_class->tp_alloc(storage_class, 0);
    if (self == NULL) return NULL;
    self->device = Py_NewRef(fields[0]);
    self->nbytes = Py_NewRef(fields[1]);
    self->array = Py_NewRef(fields[2]);
    self->block = Py_NewRef(fields[3]);
    self->allocator = Py_NewRef(fields[4]);
    self->owner = Py_NewRef(fields[5]);
    return (PyObject *)self;
}

/* storage(device, nbytes, array, block, allocator, owner): a new storage with these fields (allocator None:
 * nothing to give back). */
static PyObject *new_storage(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "storage(device, nbytes, array, block, allocator, owner) takes 6 arguments, "
                                      "got %zd", nargs);
        return NULL;
    }
    return make_storage(args);
}

/* allocate(nbytes, device, allocator, stream): a device storage over allocator.alloc(nbytes, stream). The
 * allocation comes first: a failed one leaves no half-built storage. */
static PyObject *allocate(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "allocate(nbytes, device, allocator, stream) takes 4 arguments, got %zd",
                     nargs);
        return NULL;
    }
    PyObject *call[3] = {args[2], args[0], args[3]};
    PyObject *block = PyObject_VectorcallMethod(str_alloc, call, 3, NULL);
    if (block == NULL) return NULL;
    PyObject *fields[6] = {args[1], args[0], Py_None, block, args[2], Py_None};
    PyObject *storage = make_storage(fields);
    if (storage == NULL) { /* nothing holds the block: hand it back, keeping the error */
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        PyObject *back[2] = {args[2], block};
        PyObject *result = PyObject_VectorcallMethod(str_free, back, 2, NULL);
        if (result == NULL) PyErr_Clear();
        Py_XDECREF(result);
        PyErr_Restore(type, value, traceback);
    }
    Py_DECREF(block);
    return storage;
}

/* register(tensor_class, storage_class): the classes that tensor(), allocate() and storage() make. */
static PyObject *register_classes(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1]) ||
        !PyType_IsSubtype((PyTypeObject *)args[0], &TensorFieldsType) ||
        !PyType_IsSubtype((PyTypeObject *)args[1], &StorageFieldsType)) {
        PyErr_SetString(PyExc_TypeError, "register(tensor_class, storage_class) takes subclasses of TensorFields "
                                         "and StorageFields");
        return NULL;
    }
    Py_XSETREF(tensor_class, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(storage_class, (PyTypeObject *)Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"tensor", (PyCFunction)(void (*)(void))new_tensor, METH_FASTCALL, NULL},
    {"allocate", (PyCFunction)(void (*)(void))allocate, METH_FASTCALL, NULL},
    {"storage", (PyCFunction)(void (*)(void))new_storage, METH_FASTCALL, NULL},
    {"register", (PyCFunction)(void (*)(void))register_classes, METH_FASTCALL, NULL},
    {NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_fields", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minitensor_fields(void) {
    str_device = PyUnicode_InternFromString("device");
    str_alloc = PyUnicode_InternFromString("alloc");
    str_free = PyUnicode_InternFromString("free");
    if (str_device == NULL || str_alloc == NULL || str_free == NULL) return NULL;
    if (PyType_Ready(&TensorFieldsType) < 0 || PyType_Ready(&StorageFieldsType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    if (PyModule_AddObject(module, "TensorFields", Py_NewRef((PyObject *)&TensorFieldsType)) < 0 ||
        PyModule_AddObject(module, "StorageFields", Py_NewRef((PyObject *)&StorageFieldsType)) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
