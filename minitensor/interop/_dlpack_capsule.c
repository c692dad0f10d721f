/* The destructor of minitensor's DLPack capsules (dlpack.py), in C because of when it runs.
 *
 * A capsule nobody consumed still owns its DLManagedTensor[Versioned]: its destructor calls the tensor's
 * deleter. A C consumer may drop the capsule with its own exception pending (numpy refusing a cuda tensor
 * with "Unsupported device in DLTensor"). Python code cannot run with an exception pending, so a destructor
 * written in Python (a ctypes callback) would lose that exception and the consumer would fail with a
 * SystemError. Here the exception is set aside around the deleter and put back, as torch's destructor does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef void (*deleter_t)(void *);

typedef struct {
    void *data;
    int32_t device_type, device_id;
    int32_t ndim;
    uint8_t code, bits;
    uint16_t lanes;
    int64_t *shape, *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct {
    DLTensor dl_tensor;
    void *manager_ctx;
    deleter_t deleter;
} DLManagedTensor;

typedef struct {
    uint32_t major, minor;
    void *manager_ctx;
    deleter_t deleter;
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

static void destroy_capsule(PyObject *capsule) {
    const char *name = PyCapsule_GetName(capsule);
    int versioned = name != NULL && strcmp(name, "dltensor_versioned") == 0;
    if (!versioned && (name == NULL || strcmp(name, "dltensor") != 0))
        return; /* consumed ("used_..."): the consumer calls the deleter */
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *pending = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
#endif
    void *managed = PyCapsule_GetPointer(capsule, name);
    if (managed != NULL) {
        deleter_t deleter = versioned ? ((DLManagedTensorVersioned *)managed)->deleter
                                      : ((DLManagedTensor *)managed)->deleter;
        if (deleter != NULL) deleter(managed);
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(capsule);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(pending);
#else
    PyErr_Restore(type, value, traceback);
#endif
}

static PyObject *destructor_address(PyObject *module, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)destroy_capsule);
}

static PyMethodDef methods[] = {
    {"destructor_address", destructor_address, METH_NOARGS, "The address of the capsule destructor."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_dlpack_capsule", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minitensor_dlpack_capsule(void) { return PyModule_Create(&module_def); }
