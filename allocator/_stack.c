/* The Python stack of a memory-history entry (allocator/history.py), walked in C: a code object and an int32
 * per frame, two objects per stack, where a walk in Python makes a tuple and an int per frame as well.
 *
 * stack(own) -> (codes, positions): the calling Python frames, innermost first, from the first one whose file is
 * not in the set `own` (the allocator's own modules). `codes` is a tuple of code objects; `positions` packs one
 * native int32 per frame: the byte offset of its last instruction (Python 3.11 on), or on 3.10 its line negated.
 * history.py turns both into lines when a snapshot is taken, once per distinct frame.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>

static PyObject *stack(PyObject *module, PyObject *own) {
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(frame);
    PyObject *codes = PyList_New(0);
    Py_ssize_t n = 0, capacity = 64;
    int32_t *positions = PyMem_Malloc(capacity * sizeof(int32_t));
    int skipping = 1, failed = codes == NULL || positions == NULL;
    while (frame != NULL && !failed) {
        PyCodeObject *code = PyFrame_GetCode(frame); /* new reference */
        if (skipping && PySet_Contains(own, code->co_filename) == 1) {
            Py_DECREF(code);
        } else {
            skipping = 0;
            if (n == capacity) {
                int32_t *grown = PyMem_Realloc(positions, 2 * capacity * sizeof(int32_t));
                if (grown == NULL) {
                    failed = 1;
                } else {
                    positions = grown;
                    capacity *= 2;
                }
            }
            if (!failed && PyList_Append(codes, (PyObject *)code) == 0) {
#if PY_VERSION_HEX >= 0x030B0000
                positions[n++] = (int32_t)PyFrame_GetLasti(frame);
#else
                positions[n++] = -(int32_t)PyFrame_GetLineNumber(frame);
#endif
            } else {
                failed = 1;
            }
            Py_DECREF(code);
        }
        PyFrameObject *back = PyFrame_GetBack(frame); /* new reference */
        Py_DECREF(frame);
        frame = back;
    }
    Py_XDECREF(frame);
    PyObject *result = NULL;
    if (!failed) {
        PyObject *code_tuple = PyList_AsTuple(codes);
        if (code_tuple != NULL) {
            result = Py_BuildValue("(Ny#)", code_tuple, (const char *)positions, n * (Py_ssize_t)sizeof(int32_t));
        }
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    Py_XDECREF(codes);
    PyMem_Free(positions);
    return result;
}

static PyMethodDef methods[] = {
    {"stack", stack, METH_O, "The calling Python frames, innermost first: (codes, packed int32 positions)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_minitensor_stack", NULL, -1, methods};

PyMODINIT_FUNC PyInit__minitensor_stack(void) { return PyModule_Create(&module_def); }
