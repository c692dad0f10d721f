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
 * same call site gives the same stack, so the recorder's table (Table, `max_interned` slots) keeps the one stack
 * object made for a hash of the frames' code addresses and positions, checked frame by frame when found (its
 * codes are held, so an equal address is the same code). A completed free is one entry, "free", that history.py
 * reads back as torch's two.
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

#define OWN_VERDICTS 16

/* Which frames are the allocator's own: its files, and the verdicts on the code objects asked about last (a set
 * lookup per frame cost a tenth of recording). The cache holds its code objects, so no address is reused. */
typedef struct {
    PyObject *files; /* frozenset of file names */
    PyCodeObject *codes[OWN_VERDICTS];
    char mine[OWN_VERDICTS];
    int next;
} Own;

static int is_own(Own *own, PyCodeObject *code) {
    for (int i = 0; i < OWN_VERDICTS; i++) {
        if (own->codes[i] == code) return own->mine[i];
    }
    int mine = PySet_Contains(own->files, code->co_filename);
    if (mine < 0) return -1;
    Py_INCREF(code);
    Py_XDECREF(own->codes[own->next]);
    own->codes[own->next] = code;
    own->mine[own->next] = (char)mine;
    own->next = (own->next + 1) % OWN_VERDICTS;
    return mine;
}

typedef struct {
    PyCodeObject *codes[MAX_FRAMES]; /* borrowed: each executing frame holds its code */
    int32_t positions[MAX_FRAMES];
    Py_ssize_t n;
    int skipping; /* still inside the allocator's own frames */
} Walk;

/* Adds one frame: 1 when the walk is full, -1 with an exception set on failure. */
static int add(Walk *walk, Own *own, PyCodeObject *code, int32_t position) {
    if (walk->skipping) {
        int mine = is_own(own, code);
        if (mine != 0) return mine < 0 ? -1 : 0; /* failed, or one of the allocator's own frames */
        walk->skipping = 0;
    }
    walk->codes[walk->n] = code;
    walk->positions[walk->n] = position;
    return ++walk->n == MAX_FRAMES;
}

#ifdef INTERNAL_FRAMES
static int walk_frames(Walk *walk, Own *own) {
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
static int walk_frames(Walk *walk, Own *own) {
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

/* The intern table: `slots` entries, each a stack and the hash of its frames, found by hash modulo slots and the
 * next PROBES slots; a new stack takes a free one of them, else its first (the stack there stays valid for whoever
 * holds it, just no longer shared). */
#define PROBES 4

typedef struct {
    uint64_t hash;
    PyObject *stack; /* a (codes, positions) tuple, or NULL */
} Interned;

typedef struct {
    Interned *entries;
    Py_ssize_t slots, count;
} Table;

/* The caller's stack, interned in `table`: a new reference, or NULL with an exception set. */
static PyObject *interned_stack(Own *own, Table *table) {
    Walk walk; /* 12 KiB of the C stack */
    walk.n = 0;
    walk.skipping = 1;
    if (walk_frames(&walk, own) < 0) return NULL;
    uint64_t hash = 14695981039346656037ULL; /* FNV-1a over the frames */
    for (Py_ssize_t i = 0; i < walk.n; i++) {
        hash = (hash ^ (uint64_t)(uintptr_t)walk.codes[i]) * 1099511628211ULL;
        hash = (hash ^ (uint64_t)(uint32_t)walk.positions[i]) * 1099511628211ULL;
    }
    Py_ssize_t first = (Py_ssize_t)(hash % (uint64_t)table->slots), free_slot = -1;
    for (Py_ssize_t probe = 0; probe < PROBES && probe < table->slots; probe++) {
        Interned *entry = &table->entries[(first + probe) % table->slots];
        if (entry->stack == NULL) {
            if (free_slot < 0) free_slot = (first + probe) % table->slots;
        } else if (entry->hash == hash && same_frames(entry->stack, &walk)) {
            return Py_NewRef(entry->stack);
        }
    }
    PyObject *made = stack_object(&walk);
    if (made == NULL) return NULL;
    Interned *entry = &table->entries[free_slot < 0 ? first : free_slot];
    if (entry->stack == NULL) table->count++;
    Py_XSETREF(entry->stack, Py_NewRef(made));
    entry->hash = hash;
    return made;
}

/* ------------------------------------------------------------------------------------------------ Recorder */
typedef struct {
    PyObject_HEAD
    PyObject *trace;  /* list of FIELDS slots per entry, or None (enabled="state") */
    PyObject *live;   /* dict: address -> stack of each allocated block, or None (context=None) */
    Table stacks;     /* the interned stacks */
    Own own;          /* the allocator's own frames */
    int alloc_stacks, free_stacks;
    Py_ssize_t keep; /* slots kept when the trace passes twice as many */
} Recorder;

static PyObject *ALLOC, *FREE_REQUESTED, *FREED, *NO_FRAMES;

static int recorder_init(Recorder *self, PyObject *args, PyObject *kwargs) {
    PyObject *trace, *live, *own;
    if (self->trace != NULL) {
        PyErr_SetString(PyExc_TypeError, "a Recorder is initialized once");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOO!ppnn:Recorder", &trace, &live, &PyFrozenSet_Type, &own, &self->alloc_stacks,
                          &self->free_stacks, &self->keep, &self->stacks.slots)) {
        return -1;
    }
    if ((trace != Py_None && !PyList_Check(trace)) || (live != Py_None && !PyDict_Check(live)) || self->keep < 1 ||
        self->stacks.slots < 1) {
        PyErr_SetString(PyExc_TypeError, "Recorder(trace list or None, live dict or None, own, ...)");
        return -1;
    }
    self->stacks.entries = PyMem_Calloc(self->stacks.slots, sizeof(Interned));
    if (self->stacks.entries == NULL) {
        PyErr_NoMemory();
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
    Py_INCREF(own);
    self->trace = trace;
    self->live = live;
    self->own.files = own;
    return 0;
}

/* Its referents hold strings, ints, tuples of code objects and bytes: no cycle can come back to it. */
static void recorder_dealloc(Recorder *self) {
    Py_XDECREF(self->trace);
    Py_XDECREF(self->live);
    for (Py_ssize_t i = 0; self->stacks.entries != NULL && i < self->stacks.slots; i++) {
        Py_XDECREF(self->stacks.entries[i].stack);
    }
    PyMem_Free(self->stacks.entries);
    Py_XDECREF(self->own.files);
    for (int i = 0; i < OWN_VERDICTS; i++) Py_XDECREF(self->own.codes[i]);
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
        stack = interned_stack(&self->own, &self->stacks);
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
    PyObject *stack = self->free_stacks ? interned_stack(&self->own, &self->stacks) : Py_NewRef(NO_FRAMES);
    int status = -1;
    if (stack != NULL) {
        PyObject *slots[] = {completed ? FREED : FREE_REQUESTED, args[0], args[1], args[2], time, stack, args[3],
                             Py_None};
        status = append(self, slots, 8);
    }
    Py_XDECREF(stack);
    Py_DECREF(time);
    if (status < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *recorder_interned(Recorder *self, PyObject *unused) {
    return PyLong_FromSsize_t(self->stacks.count);
}

static PyMethodDef recorder_methods[] = {
    {"interned", (PyCFunction)recorder_interned, METH_NOARGS, "interned(): how many stacks the table holds"},
    {"alloc", (PyCFunction)(void (*)(void))recorder_alloc, METH_FASTCALL, "alloc(ptr, size, stream, pool_id)"},
    {"free", (PyCFunction)(void (*)(void))recorder_free, METH_FASTCALL,
     "free(ptr, size, stream, pool_id, completed)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_minitensor_recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Recorder(trace, live, own, alloc_stacks, free_stacks, keep, max_interned): see _recorder.c",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)recorder_init,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_recorder", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__minitensor_recorder(void) {
    ALLOC = PyUnicode_InternFromString("alloc");
    FREE_REQUESTED = PyUnicode_InternFromString("free_requested");
    FREED = PyUnicode_InternFromString("free");
    NO_FRAMES = PyTuple_New(0);
    if (!ALLOC || !FREE_REQUESTED || !FREED || !NO_FRAMES) return NULL;
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
