/* The recording side of a memory history (allocator/history.py): Recorder, whose alloc and free the allocator
 * calls for every block it hands out and takes back, and the interned Python stacks they keep. history.py's
 * PythonRecorder is the same in Python, where no C compiler builds this file.
 *
 * A stack is (codes, positions): the calling Python frames, innermost first, from the first one whose file is not
 * in the set `own` (the allocator's own modules). `codes` is a tuple of code objects; `positions` packs one
 * native int32 per frame: the byte offset of its last instruction (Python 3.11 on), or on 3.10 its line negated.
 * history.py turns both into lines when a snapshot is taken, once per distinct frame. A trace entry is FIELDS
 * slots of one flat list (history.py says which), appended with no Python code running between them.
 *
 * Why C, internal frames and interning (each measured on an allocation loop, where recording in Python cost
 * more than the allocation): the public walk (PyEval_GetFrame, PyFrame_GetBack) makes a frame object for every
 * frame it passes, and the frames between the user and the allocator are new on every call; on 3.11 to 3.13 the
 * walk reads the interpreter's frames as PyFrame_GetBack itself does (skipping incomplete ones) and makes
 * nothing, other versions take the public walk. Keeping a new stack per entry cost more than walking it: the
 * same call site gives the same stack, so the history's `stacks` dict maps a hash of the frames' code addresses
 * and positions to the one stack object made for them, checked frame by frame when found (its codes are held,
 * so an equal address is the same code). Past `max_interned` stacks the table starts over (stacks already taken
 * stay valid; later ones are just not shared with them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
#define INTERNAL_FRAMES 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif

#define MAX_FRAMES 1024 /* deeper stacks (past the default recursion limit) keep their innermost frames */

typedef struct {
    PyCodeObject *codes[MAX_FRAMES]; /* borrowed: each executing frame holds its code */
    int32_t positions[MAX_FRAMES];
    Py_ssize_t n;
    int skipping; /* still inside the allocator's own frames */
} Walk;

/* Adds one frame: 1 when the walk is full, -1 with an exception set on failure. */
static int add(Walk *walk, PyObject *own, PyCodeObject *code, int32_t position) {
    if (walk->skipping) {
        int mine = PySet_Contains(own, code->co_filename);
        if (mine != 0) return mine < 0 ? -1 : 0; /* failed, or one of the allocator's own frames */
        walk->skipping = 0;
    }
    walk->codes[walk->n] = code;
    walk->positions[walk->n] = position;
    return ++walk->n == MAX_FRAMES;
}

#ifdef INTERNAL_FRAMES
static int walk_frames(Walk *walk, PyObject *own) {
    PyThreadState *thread = PyThreadState_Get();
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *frame = thread->current_frame;
#else
    _PyInterpreterFrame *frame = thread->cframe->current_frame;
#endif
    int status = 0;
    for (; frame != NULL && status == 0; frame = frame->previous) {
        if (_PyFrame_IsIncomplete(frame)) continue;
#if PY_VERSION_HEX >= 0x030D0000
        PyCodeObject *code = _PyFrame_GetCode(frame);
#else
        PyCodeObject *code = frame->f_code;
#endif
        status = add(walk, own, code, (int32_t)(_PyInterpreterFrame_LASTI(frame) * sizeof(_Py_CODEUNIT)));
    }
    return status < 0 ? -1 : 0;
}
#else
static int walk_frames(Walk *walk, PyObject *own) {
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(frame);
    int status = 0;
    while (frame != NULL && status == 0) {
        PyCodeObject *code = PyFrame_GetCode(frame); /* new reference; the executing frame keeps one */
        Py_DECREF(code);
#if PY_VERSION_HEX >= 0x030B0000
        status = add(walk, own, code, (int32_t)PyFrame_GetLasti(frame));
#else
        status = add(walk, own, code, -(int32_t)PyFrame_GetLineNumber(frame));
#endif
        PyFrameObject *back = PyFrame_GetBack(frame); /* new reference */
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    return status < 0 ? -1 : 0;
}
#endif

/* The stack `walk` found as (codes, positions), a new object. */
static PyObject *stack_object(Walk *walk) {
    PyObject *codes = PyTuple_New(walk->n);
    if (codes == NULL) return NULL;
    for (Py_ssize_t i = 0; i < walk->n; i++) {
        Py_INCREF(walk->codes[i]);
        PyTuple_SET_ITEM(codes, i, (PyObject *)walk->codes[i]);
    }
    return Py_BuildValue("(Ny#)", codes, (const char *)walk->positions, walk->n * (Py_ssize_t)sizeof(int32_t));
}

/* Whether `stack` (a (codes, positions) tuple) holds the frames `walk` found. */
static int same_frames(PyObject *stack, Walk *walk) {
    PyObject *codes = PyTuple_GET_ITEM(stack, 0), *positions = PyTuple_GET_ITEM(stack, 1);
    if (PyTuple_GET_SIZE(codes) != walk->n) return 0;
    if (memcmp(PyBytes_AS_STRING(positions), walk->positions, walk->n * sizeof(int32_t)) != 0) return 0;
    for (Py_ssize_t i = 0; i < walk->n; i++) {
        if (PyTuple_GET_ITEM(codes, i) != (PyObject *)walk->codes[i]) return 0;
    }
    return 1;
}

/* The caller's stack, interned in `table` under a hash of its code addresses and positions (a stack found there
 * is compared frame by frame; one whose hash collides replaces it): a new reference, or NULL with an exception
 * set. */
static PyObject *interned_stack(PyObject *own, PyObject *table, Py_ssize_t max_interned) {
    Walk walk; /* 12 KiB of the C stack */
    walk.n = 0;
    walk.skipping = 1;
    if (walk_frames(&walk, own) < 0) return NULL;
    uint64_t hash = 14695981039346656037ULL; /* FNV-1a over the frames */
    for (Py_ssize_t i = 0; i < walk.n; i++) {
        hash = (hash ^ (uint64_t)(uintptr_t)walk.codes[i]) * 1099511628211ULL;
        hash = (hash ^ (uint64_t)(uint32_t)walk.positions[i]) * 1099511628211ULL;
    }
    PyObject *key = PyLong_FromUnsignedLongLong(hash);
    if (key == NULL) return NULL;
    PyObject *found = PyDict_GetItemWithError(table, key); /* borrowed */
    if (found != NULL && same_frames(found, &walk)) {
        Py_DECREF(key);
        return Py_NewRef(found);
    }
    PyObject *made = PyErr_Occurred() ? NULL : stack_object(&walk);
    if (made != NULL && PyDict_GET_SIZE(table) >= max_interned) PyDict_Clear(table);
    if (made != NULL && PyDict_SetItem(table, key, made) < 0) Py_CLEAR(made);
    Py_DECREF(key);
    return made;
}

/* ------------------------------------------------------------------------------------------------ Recorder */
typedef struct {
    PyObject_HEAD
    PyObject *trace;  /* list of FIELDS slots per entry, or None (enabled="state") */
    PyObject *live;   /* dict: address -> stack of each allocated block, or None (context=None) */
    PyObject *stacks; /* dict: the intern table */
    PyObject *own;    /* frozenset of the allocator's own file names */
    int alloc_stacks, free_stacks;
    Py_ssize_t keep; /* slots kept when the trace passes twice as many */
    Py_ssize_t max_interned; /* stacks in `stacks` before it starts over */
} Recorder;

static PyObject *ALLOC, *FREE_REQUESTED, *FREE_COMPLETED, *NO_FRAMES;

static int recorder_init(Recorder *self, PyObject *args, PyObject *kwargs) {
    PyObject *trace, *live, *stacks, *own;
    if (!PyArg_ParseTuple(args, "OOO!O!ppnn:Recorder", &trace, &live, &PyDict_Type, &stacks, &PyFrozenSet_Type,
                          &own, &self->alloc_stacks, &self->free_stacks, &self->keep, &self->max_interned)) {
        return -1;
    }
    if ((trace != Py_None && !PyList_Check(trace)) || (live != Py_None && !PyDict_Check(live)) || self->keep < 1) {
        PyErr_SetString(PyExc_TypeError, "Recorder(trace list or None, live dict or None, stacks, own, ...)");
        return -1;
    }
    if (trace != Py_None && PyObject_GC_IsTracked(trace)) {
        /* Its slots are strings, ints, None, stacks and pool ids: nothing that could lead back to a container, so
         * the collector need not walk millions of them at every full collection (measured: a fifth of what
         * recording cost) */
        PyObject_GC_UnTrack(trace);
    }
    Py_INCREF(trace);
    Py_INCREF(live);
    Py_INCREF(stacks);
    Py_INCREF(own);
    Py_XSETREF(self->trace, trace);
    Py_XSETREF(self->live, live);
    Py_XSETREF(self->stacks, stacks);
    Py_XSETREF(self->own, own);
    return 0;
}

/* Its referents hold strings, ints, tuples of code objects and bytes: no cycle can come back to it. */
static void recorder_dealloc(Recorder *self) {
    Py_XDECREF(self->trace);
    Py_XDECREF(self->live);
    Py_XDECREF(self->stacks);
    Py_XDECREF(self->own);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Appends `n` slots (whole entries) to the trace and trims it to `keep` slots once it holds twice that. */
static int append(Recorder *self, PyObject **slots, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_Append(self->trace, slots[i]) < 0) return -1;
    }
    Py_ssize_t size = PyList_GET_SIZE(self->trace);
    return size / 2 > self->keep ? PyList_SetSlice(self->trace, 0, size - self->keep, NULL) : 0;
}

static PyObject *now_ns(void) {
    struct timespec now; /* CLOCK_REALTIME: the clock of time.time_ns, which history.py's other entries use */
    clock_gettime(CLOCK_REALTIME, &now);
    return PyLong_FromLongLong((long long)now.tv_sec * 1000000000LL + now.tv_nsec);
}

/* alloc(ptr, size, stream, pool_id): a block was handed out. */
static PyObject *recorder_alloc(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "alloc(ptr, size, stream, pool_id)");
        return NULL;
    }
    PyObject *stack = NULL, *time = NULL;
    if (self->live != Py_None) {
        stack = interned_stack(self->own, self->stacks, self->max_interned);
        if (stack == NULL || PyDict_SetItem(self->live, args[0], stack) < 0) goto failed;
    }
    if (self->trace != Py_None) {
        if ((time = now_ns()) == NULL) goto failed;
        PyObject *slots[] = {ALLOC, args[0], args[1], args[2], time, self->alloc_stacks ? stack : NO_FRAMES, args[3],
                             Py_None};
        if (append(self, slots, 8) < 0) goto failed;
        Py_DECREF(time);
    }
    Py_XDECREF(stack);
    Py_RETURN_NONE;
failed:
    Py_XDECREF(stack);
    Py_XDECREF(time);
    return NULL;
}

/* free(ptr, size, stream, pool_id, completed): the owner frees a block; `completed`: it is reusable at once. */
static PyObject *recorder_free(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "free(ptr, size, stream, pool_id, completed)");
        return NULL;
    }
    if (self->live != Py_None && PyDict_DelItem(self->live, args[0]) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return NULL;
        PyErr_Clear(); /* allocated before recording began */
    }
    if (self->trace == Py_None) Py_RETURN_NONE;
    int completed = PyObject_IsTrue(args[4]);
    if (completed < 0) return NULL;
    PyObject *time = now_ns();
    if (time == NULL) return NULL;
    PyObject *stack = self->free_stacks ? interned_stack(self->own, self->stacks, self->max_interned) : Py_NewRef(NO_FRAMES);
    int status = -1;
    if (stack != NULL) {
        PyObject *ptr = args[0], *size = args[1], *stream = args[2], *pool_id = args[3];
        PyObject *slots[] = {FREE_REQUESTED, ptr, size, stream, time, stack, pool_id, Py_None,
                             FREE_COMPLETED, ptr, size, stream, time, NO_FRAMES, pool_id, Py_None};
        status = append(self, slots, completed ? 16 : 8);
    }
    Py_XDECREF(stack);
    Py_DECREF(time);
    if (status < 0) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef recorder_methods[] = {
    {"alloc", (PyCFunction)(void (*)(void))recorder_alloc, METH_FASTCALL, "alloc(ptr, size, stream, pool_id)"},
    {"free", (PyCFunction)(void (*)(void))recorder_free, METH_FASTCALL,
     "free(ptr, size, stream, pool_id, completed)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_minitensor_recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Recorder(trace, live, stacks, own, alloc_stacks, free_stacks, keep, max_interned): see _recorder.c",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_recorder", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__minitensor_recorder(void) {
    ALLOC = PyUnicode_InternFromString("alloc");
    FREE_REQUESTED = PyUnicode_InternFromString("free_requested");
    FREE_COMPLETED = PyUnicode_InternFromString("free_completed");
    NO_FRAMES = PyTuple_New(0);
    if (!ALLOC || !FREE_REQUESTED || !FREE_COMPLETED || !NO_FRAMES) return NULL;
    if (PyType_Ready(&RecorderType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(module, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
