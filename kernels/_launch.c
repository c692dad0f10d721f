/* The launch path of compiled kernels: one `Launcher` object per kernel signature, called as
 * `launcher(grid_x, grid_y, grid_z, stream, *args)` with plain ints and floats.
 *
 * Why not Triton's own launcher: it takes ~13 arguments per call, looks up pointers through
 * `data_ptr()` and checks them with the driver, and costs 4-6 us a launch. This one converts each
 * argument by a kind code fixed at construction and calls cuLaunchKernel: well under a microsecond
 * on top of the driver's own cost.
 *
 * Kind codes, one per kernel parameter: 'p' pointer (u64), 'i' int32, 'u' uint32, 'l' int64,
 * 'q' uint64, 'f' float32, 'd' float64, 'n' a null pointer that takes no Python argument (Triton's scratch
 * parameters).
 *
 * `RawLauncher` launches a user's CUDA C++ kernel (mt.cuda.RawKernel) as `raw(grid, block, args, shared_mem,
 * stream)`: grid and block an int or a tuple of up to three, args a tuple. Plain ints (and floats, for float
 * parameters) convert here, and a cuda tensor by its data_ptr(); anything else (a CPU tensor, a numpy scalar)
 * goes through the Python callable given to `init`, which checks it against the parameter and returns the plain
 * value or raises. The kernel runs in its module's context; when another context is current (another
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
static PyObject *plain_argument;     /* Python callable(kind, index, arg): the plain int or float a raw arg means */
static PyObject *is_cuda_name, *data_ptr_name;  /* interned attribute names */

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
    case 'p':
    case 'q': p->u64 = PyLong_AsUnsignedLongLong(arg); break;
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

/* cuLaunchKernel in the kernel's context (switched to and back when another is current). */
static PyObject *launch(CUfunction function, CUcontext context, unsigned grid[3], unsigned block[3],
                        unsigned shared, CUstream stream, void **params, PyObject *name) {
    CUcontext current = NULL;
    cu_ctx_get_current(&current);
    int switched = current != context;
    if (switched) cu_ctx_set_current(context);
    CUresult err = cu_launch_kernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                                    stream, params, NULL);
    if (switched) cu_ctx_set_current(current);
    if (err != 0) {
        PyObject *r = PyObject_CallFunction(raise_launch_error, "iO", err, name);
        Py_XDECREF(r);
        if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "CUDA error %d launching %U", err, name);
        return NULL;
    }
    Py_RETURN_NONE;
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
    unsigned grid[3] = {gx, gy, gz}, block[3] = {self->block_x, 1, 1};
    return launch(self->function, self->context, grid, block, self->shared, stream, params, self->name);
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
        if (!strchr("piulqfdn", kinds[i])) {
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

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    CUfunction function;
    CUcontext context;
    int nparams;
    char kinds[MAX_PARAMS];
    PyObject *name;
} RawLauncher;

/* A raw argument: plain ints (and floats for float parameters) directly, a cuda tensor (is_cuda true) by its
 * data_ptr(), anything else through plain_argument. */
static int convert_raw(char kind, int index, PyObject *arg, Param *p) {
    if (PyLong_CheckExact(arg) || ((kind == 'f' || kind == 'd') && PyFloat_CheckExact(arg)))
        return convert(kind, arg, p);
    PyObject *plain = NULL;
    if (kind == 'p') {
        PyObject *is_cuda = PyObject_GetAttr(arg, is_cuda_name);
        if (is_cuda == Py_True) plain = PyObject_CallMethodNoArgs(arg, data_ptr_name);
        Py_XDECREF(is_cuda);
        PyErr_Clear();
    }
    if (plain == NULL) plain = PyObject_CallFunction(plain_argument, "CiO", kind, index, arg);
    if (plain == NULL) return -1;
    int failed = convert(kind, plain, p);
    Py_DECREF(plain);
    return failed;
}

/* (x, y, z) from an int or a tuple of one to three ints. */
static int to_dims(PyObject *value, unsigned dims[3], const char *what) {
    dims[0] = dims[1] = dims[2] = 1;
    if (PyLong_Check(value)) return to_unsigned(value, &dims[0], what);
    Py_ssize_t n = PyTuple_Check(value) ? PyTuple_GET_SIZE(value) : 0;
    if (n < 1 || n > 3) {
        PyErr_Format(PyExc_TypeError, "%s must be an int or a tuple of one to three ints, got %R", what, value);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (to_unsigned(PyTuple_GET_ITEM(value, i), &dims[i], what)) return -1;
    return 0;
}

static PyObject *raw_call(PyObject *obj, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    RawLauncher *self = (RawLauncher *)obj;
    if (kwnames != NULL || PyVectorcall_NARGS(nargsf) != 5) {
        PyErr_SetString(PyExc_TypeError, "a raw launch takes (grid, block, args, shared_mem, stream)");
        return NULL;
    }
    unsigned grid[3], block[3], shared;
    if (to_dims(args[0], grid, "grid") || to_dims(args[1], block, "block") ||
        to_unsigned(args[3], &shared, "shared_mem"))
        return NULL;
    PyObject *values_in = PySequence_Fast(args[2], "kernel arguments are given as a tuple");
    if (values_in == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(values_in);
    if (n != self->nparams) {
        Py_DECREF(values_in);
        return PyErr_Format(PyExc_TypeError, "kernel %U takes %d arguments, got %zd", self->name, self->nparams, n);
    }
    CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[4]);
    Param values[MAX_PARAMS];
    void *params[MAX_PARAMS];
    PyObject **items = PySequence_Fast_ITEMS(values_in);
    for (int i = 0; i < self->nparams && !PyErr_Occurred(); i++) {
        params[i] = &values[i];
        convert_raw(self->kinds[i], i, items[i], &values[i]);
    }
    Py_DECREF(values_in);
    if (PyErr_Occurred()) return NULL;
    if ((uint64_t)grid[0] * grid[1] * grid[2] == 0) Py_RETURN_NONE;
    return launch(self->function, self->context, grid, block, shared, stream, params, self->name);
}

static PyObject *raw_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    unsigned long long function, context;
    const char *kinds;
    Py_ssize_t nkinds;
    PyObject *name;
    if (!PyArg_ParseTuple(args, "KKy#U", &function, &context, &kinds, &nkinds, &name)) return NULL;
    if (nkinds > MAX_PARAMS)
        return PyErr_Format(PyExc_ValueError, "a kernel may have at most %d parameters, got %zd", MAX_PARAMS,
                            nkinds);
    for (Py_ssize_t i = 0; i < nkinds; i++)
        if (!strchr("piulqfd", kinds[i]))
            return PyErr_Format(PyExc_ValueError, "unknown parameter kind '%c'", kinds[i]);
    RawLauncher *self = (RawLauncher *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = raw_call;
    self->function = (CUfunction)(uintptr_t)function;
    self->context = (CUcontext)(uintptr_t)context;
    self->nparams = (int)nkinds;
    memcpy(self->kinds, kinds, nkinds);
    Py_INCREF(name);
    self->name = name;
    return (PyObject *)self;
}

static void raw_dealloc(RawLauncher *self) {
    Py_XDECREF(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RawLauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_minitensor_launch.RawLauncher",
    .tp_basicsize = sizeof(RawLauncher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(RawLauncher, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = raw_new,
    .tp_dealloc = (destructor)raw_dealloc,
    .tp_doc = "RawLauncher(function, context, kinds, name): raw(grid, block, args, shared_mem, stream)",
};

/* init(raise_launch_error, plain_argument): find libcuda's entry points (already loaded by cuda-bindings). */
static PyObject *init(PyObject *module, PyObject *args) {
    PyObject *callback, *plain;
    if (!PyArg_ParseTuple(args, "OO", &callback, &plain)) return NULL;
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL);
    if (lib == NULL) return PyErr_Format(PyExc_RuntimeError, "cannot open libcuda.so.1: %s", dlerror());
    cu_launch_kernel = (launch_kernel_t)dlsym(lib, "cuLaunchKernel");
    cu_ctx_get_current = (ctx_get_t)dlsym(lib, "cuCtxGetCurrent");
    cu_ctx_set_current = (ctx_set_t)dlsym(lib, "cuCtxSetCurrent");
    if (!cu_launch_kernel || !cu_ctx_get_current || !cu_ctx_set_current)
        return PyErr_Format(PyExc_RuntimeError, "libcuda.so.1 lacks cuLaunchKernel or cuCtxGet/SetCurrent");
    Py_INCREF(callback);
    Py_XSETREF(raise_launch_error, callback);
    Py_INCREF(plain);
    Py_XSETREF(plain_argument, plain);
    if (is_cuda_name == NULL) is_cuda_name = PyUnicode_InternFromString("is_cuda");
    if (data_ptr_name == NULL) data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (is_cuda_name == NULL || data_ptr_name == NULL) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(raise_launch_error, plain_argument): bind libcuda's launch entry points."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_launch", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minitensor_launch(void) {
    if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&RawLauncherType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&LauncherType);
    Py_INCREF(&RawLauncherType);
    if (PyModule_AddObject(m, "Launcher", (PyObject *)&LauncherType) < 0 ||
        PyModule_AddObject(m, "RawLauncher", (PyObject *)&RawLauncherType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
