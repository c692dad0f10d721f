/* The launch path of compiled kernels: one `Launcher` object per kernel signature, called as
 * `launcher(grid_x, grid_y, grid_z, stream, *args)` with plain ints and floats.
 *
 * Why not Triton's own launcher: it takes ~13 arguments per call, looks up pointers through
 * `data_ptr()` and checks them with the driver, and costs 4-6 us a launch. This one converts each
 * argument by a kind code fixed at construction and calls cuLaunchKernel: well under a microsecond
 * on top of the driver's own cost.
 *
 * Kind codes, one per kernel parameter: 'p' pointer (u64), 'i' int32, 'u' uint32, 'l' int64,
 * 'f' float32, 'd' float64, 'n' a null pointer that takes no Python argument (Triton's scratch
 * parameters). The kernel runs in its module's context; when another context is current (another
 * device's), the launch switches to it and back, so the caller's current device is unchanged.
 *
 * Built on first use by minitensor/kernels/native.py with the system C compiler, as Triton builds its own
 * launcher; libcuda is found with dlopen, so nothing but Python's headers is needed to build it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef void *CUfunction, *CUstream, *CUcontext;
typedef CUresult (*launch_kernel_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, CUstream, void **, void **);
typedef CUresult (*ctx_get_t)(CUcontext *);
typedef CUresult (*ctx_set_t)(CUcontext);

static launch_kernel_t cu_launch_kernel;
static ctx_get_t cu_ctx_get_current;
static ctx_set_t cu_ctx_set_current;
static PyObject *raise_launch_error; /* Python callable(code, kernel_name): raises the CudaError */

#define MAX_PARAMS 64

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    CUfunction function;
    CUcontext context;
    unsigned block_x, shared;
    int nparams;
    Py_ssize_t nargs; /* Python arguments after the grid and the stream */
    char kinds[MAX_PARAMS];
    PyObject *name;
} Launcher;

typedef union {
    uint64_t u64;
    int64_t i64;
    int32_t i32;
    uint32_t u32;
    float f32;
    double f64;
} Param;

static int to_unsigned(PyObject *arg, unsigned *out, const char *what) {
    unsigned long long v = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return -1;
    if (v > 0xffffffffULL) {
        PyErr_Format(PyExc_OverflowError, "%s %llu does not fit in 32 bits", what, v);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static int convert(char kind, PyObject *arg, Param *p) {
    long long v;
    switch (kind) {
    case 'p': p->u64 = PyLong_AsUnsignedLongLong(arg); break;
    case 'l': p->i64 = PyLong_AsLongLong(arg); break;
    case 'i':
        v = PyLong_AsLongLong(arg);
        if (!PyErr_Occurred() && (v < INT32_MIN || v > INT32_MAX)) {
            PyErr_Format(PyExc_OverflowError, "kernel argument %lld does not fit in int32", v);
            return -1;
        }
        p->i32 = (int32_t)v;
        break;
    case 'u':
        v = PyLong_AsLongLong(arg);
        if (!PyErr_Occurred() && (v < 0 || v > UINT32_MAX)) {
            PyErr_Format(PyExc_OverflowError, "kernel argument %lld does not fit in uint32", v);
            return -1;
        }
        p->u32 = (uint32_t)v;
        break;
    case 'f': p->f32 = (float)PyFloat_AsDouble(arg); break;
    case 'd': p->f64 = PyFloat_AsDouble(arg); break;
    }
    return PyErr_Occurred() ? -1 : 0;
}

static PyObject *launcher_call(PyObject *obj, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Launcher *self = (Launcher *)obj;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs != 4 + self->nargs) {
        PyErr_Format(PyExc_TypeError, "launcher of %U takes grid_x, grid_y, grid_z, stream and %zd kernel "
                     "arguments by position, got %zd arguments", self->name, self->nargs, nargs);
        return NULL;
    }
    unsigned gx, gy, gz;
    if (to_unsigned(args[0], &gx, "grid_x") || to_unsigned(args[1], &gy, "grid_y") ||
        to_unsigned(args[2], &gz, "grid_z"))
        return NULL;
    CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;

    Param values[MAX_PARAMS];
    void *params[MAX_PARAMS];
    Py_ssize_t a = 4;
    for (int i = 0; i < self->nparams; i++) {
        params[i] = &values[i];
        if (self->kinds[i] == 'n') {
            values[i].u64 = 0;
        } else if (convert(self->kinds[i], args[a++], &values[i])) {
            return NULL;
        }
    }
    if ((uint64_t)gx * gy * gz == 0) Py_RETURN_NONE;

    CUcontext current = NULL;
    cu_ctx_get_current(&current);
    int switched = current != self->context;
    if (switched) cu_ctx_set_current(self->context);
    CUresult err = cu_launch_kernel(self->function, gx, gy, gz, self->block_x, 1, 1, self->shared, stream,
                                    params, NULL);
    if (switched) cu_ctx_set_current(current);
    if (err != 0) {
        PyObject *r = PyObject_CallFunction(raise_launch_error, "iO", err, self->name);
        Py_XDECREF(r);
        if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "CUDA error %d launching %U", err, self->name);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *launcher_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long function, context;
    unsigned block_x, shared;
    const char *kinds;
    Py_ssize_t nkinds;
    PyObject *name;
    if (!PyArg_ParseTuple(args, "KKIIy#U", &function, &context, &block_x, &shared, &kinds, &nkinds, &name))
        return NULL;
    if (nkinds > MAX_PARAMS) {
        PyErr_Format(PyExc_ValueError, "a kernel may have at most %d parameters, got %zd", MAX_PARAMS, nkinds);
        return NULL;
    }
    Launcher *self = (Launcher *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = launcher_call;
    self->function = (CUfunction)(uintptr_t)function;
    self->context = (CUcontext)(uintptr_t)context;
    self->block_x = block_x;
    self->shared = shared;
    self->nparams = (int)nkinds;
    self->nargs = 0;
    for (Py_ssize_t i = 0; i < nkinds; i++) {
        if (!strchr("piulfdn", kinds[i])) {
            Py_DECREF(self);
            PyErr_Format(PyExc_ValueError, "unknown parameter kind '%c'", kinds[i]);
            return NULL;
        }
        self->kinds[i] = kinds[i];
        self->nargs += kinds[i] != 'n';
    }
    Py_INCREF(name);
    self->name = name;
    return (PyObject *)self;
}

static void launcher_dealloc(Launcher *self) {
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *launcher_repr(Launcher *self) {
    return PyUnicode_FromFormat("<Launcher %U>", self->name);
}

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_minitensor_launch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = launcher_new,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_repr = (reprfunc)launcher_repr,
    .tp_doc = "Launcher(function, context, block_x, shared, kinds, name): launch(gx, gy, gz, stream, *args)",
};

/* init(raise_launch_error): find libcuda's entry points (already loaded by cuda-bindings). */
static PyObject *init(PyObject *module, PyObject *callback) {
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL);
    if (lib == NULL) return PyErr_Format(PyExc_RuntimeError, "cannot open libcuda.so.1: %s", dlerror());
    cu_launch_kernel = (launch_kernel_t)dlsym(lib, "cuLaunchKernel");
    cu_ctx_get_current = (ctx_get_t)dlsym(lib, "cuCtxGetCurrent");
    cu_ctx_set_current = (ctx_set_t)dlsym(lib, "cuCtxSetCurrent");
    if (!cu_launch_kernel || !cu_ctx_get_current || !cu_ctx_set_current)
        return PyErr_Format(PyExc_RuntimeError, "libcuda.so.1 lacks cuLaunchKernel or cuCtxGet/SetCurrent");
    Py_INCREF(callback);
    Py_XSETREF(raise_launch_error, callback);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_O, "init(raise_launch_error): bind libcuda's launch entry points."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minitensor_launch(void) {
    if (PyType_Ready(&LauncherType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&LauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(&LauncherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
