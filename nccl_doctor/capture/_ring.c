/* The capture ring's hot path in C: the optional accelerator of nccl_doctor.capture.ring.
 *
 * Ring(buffer, offset, capacity[, counter_offset]) writes event records into a writable buffer (the capture's mmap)
 * exactly as ring.PyRing does in Python: same layout (capture/format.py), same Adler-32 check on
 * the enter part, same exit check word. Python keeps the fallback; the tests run both and compare
 * their bytes. Built when a C compiler is present (setup.py marks the extension optional).
 *
 * Calls hold the GIL throughout, so the record counter needs no lock, as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define RECORD_SIZE 128
#define ENTER_SIZE 104
#define EXIT_OFFSET 112
#define N_ENTER_ARGS 21 /* ENTER's fields after idx */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    int has_view;
    unsigned char *ring;
    unsigned char *counter; /* where ``count`` is published (the header), or NULL */
    uint64_t capacity;
    uint64_t count; /* index of the latest record started; indices start at 1 */
} Ring;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns()'s clock */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t adler32(const unsigned char *p, size_t n) { /* zlib.adler32(data), n <= 5552 */
    uint32_t a = 1, b = 0; /* no overflow before the final modulo for n <= 5552 (zlib's NMAX) */
    for (size_t i = 0; i < n; i++) {
        a += p[i];
        b += a;
    }
    return ((b % 65521u) << 16) | (a % 65521u);
}

static inline void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }

/* Fields of ENTER ("<QQQqQQIIIIIIIIIIiiIBBH"): byte offset and size of each. */
static const unsigned char FIELD_OFF[22] = {0,  8,  16, 24, 32, 40, 48, 52, 56, 60, 64,
                                            68, 72, 76, 80, 84, 88, 92, 96, 100, 101, 102};
static const unsigned char FIELD_SIZE[22] = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4,
                                             4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 2};

static const unsigned char FIELD_SIGNED[22] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                               0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0};

static int put_field(unsigned char *rec, int i, PyObject *obj) {
    /* Range-checked like struct.pack: a value that does not fit its field raises OverflowError. */
    int size = FIELD_SIZE[i];
    uint64_t bits;
    if (FIELD_SIGNED[i]) {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (size < 8 && (v < -(1LL << (8 * size - 1)) || v >= (1LL << (8 * size - 1))))
            goto overflow;
        bits = (uint64_t)v;
    } else {
        unsigned long long v = PyLong_AsUnsignedLongLong(obj);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (size < 8 && v >= (1ULL << (8 * size)))
            goto overflow;
        bits = v;
    }
    unsigned char *p = rec + FIELD_OFF[i];
    switch (size) {
    case 8: put_u64(p, bits); break;
    case 4: put_u32(p, (uint32_t)bits); break;
    case 2: put_u16(p, (uint16_t)bits); break;
    default: *p = (unsigned char)bits;
    }
    return 0;
overflow:
    PyErr_Format(PyExc_OverflowError, "record field %d out of range", i);
    return -1;
}

/* begin(parent, t_enter, seq, nbytes, thread, op, group, inp, out, ufile, uline, ufunc, afile,
 *       aline, extra, peer, group_size, seq_offset, kind, flags, pad) -> idx
 * t_enter == 0 stamps the current time. */
static PyObject *Ring_begin(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != N_ENTER_ARGS) {
        PyErr_Format(PyExc_TypeError, "begin() takes %d arguments (%zd given)", N_ENTER_ARGS,
                     nargs);
        return NULL;
    }
    unsigned char rec[RECORD_SIZE];
    memset(rec, 0, sizeof rec);
    uint64_t idx = self->count + 1;
    put_u64(rec, idx);
    for (int i = 0; i < N_ENTER_ARGS; i++) {
        if (put_field(rec, i + 1, args[i]) < 0)
            return NULL;
    }
    uint64_t t_enter;
    memcpy(&t_enter, rec + 16, 8);
    if (t_enter == 0)
        put_u64(rec + 16, now_ns());
    put_u32(rec + ENTER_SIZE, adler32(rec, ENTER_SIZE));
    self->count = idx;
    memcpy(self->ring + ((idx - 1) % self->capacity) * RECORD_SIZE, rec, RECORD_SIZE);
    if (self->counter != NULL)
        put_u64(self->counter, idx);
    return PyLong_FromUnsignedLongLong(idx);
}

/* end(idx, state, seq_delta[, t_exit]) -> None; nothing once the ring has lapped the record */
static PyObject *Ring_end(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 && nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "end() takes 3 or 4 arguments");
        return NULL;
    }
    unsigned long long idx = PyLong_AsUnsignedLongLong(args[0]);
    long state = PyLong_AsLong(args[1]);
    long delta = PyLong_AsLong(args[2]);
    uint64_t t_exit = nargs == 4 ? PyLong_AsUnsignedLongLong(args[3]) : 0;
    if (PyErr_Occurred())
        return NULL;
    if (idx < 1 || self->count - idx >= self->capacity)
        Py_RETURN_NONE;
    if (t_exit == 0)
        t_exit = now_ns();
    uint32_t check = (uint32_t)(((uint64_t)idx * 0x9E3779B1ull) ^ t_exit ^
                                ((uint64_t)state << 20) ^ (uint64_t)(delta & 0xFFFF));
    unsigned char part[16];
    put_u64(part, t_exit);
    put_u16(part + 8, (uint16_t)(int16_t)delta);
    put_u16(part + 10, (uint16_t)state);
    put_u32(part + 12, check);
    memcpy(self->ring + ((idx - 1) % self->capacity) * RECORD_SIZE + EXIT_OFFSET, part, 16);
    Py_RETURN_NONE;
}

static int Ring_init(Ring *self, PyObject *args, PyObject *kwds) {
    PyObject *buffer;
    Py_ssize_t offset, counter_offset = -1;
    unsigned long long capacity;
    static char *kwlist[] = {"buffer", "offset", "capacity", "counter_offset", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnK|n", kwlist, &buffer, &offset, &capacity,
                                     &counter_offset))
        return -1;
    if (self->has_view) {
        PyErr_SetString(PyExc_RuntimeError, "Ring is already initialised");
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->has_view = 1;
    if (capacity < 1 || offset < 0 ||
        (unsigned long long)self->view.len < (unsigned long long)offset + capacity * RECORD_SIZE) {
        PyErr_SetString(PyExc_ValueError, "the ring does not fit in the buffer");
        return -1;
    }
    if (counter_offset >= 0 && counter_offset + 8 > self->view.len) {
        PyErr_SetString(PyExc_ValueError, "the counter does not fit in the buffer");
        return -1;
    }
    self->counter = counter_offset >= 0 ? (unsigned char *)self->view.buf + counter_offset : NULL;
    self->ring = (unsigned char *)self->view.buf + offset;
    self->capacity = capacity;
    self->count = 0;
    return 0;
}

static void Ring_dealloc(Ring *self) {
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Ring_get_count(Ring *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->count);
}

static PyObject *Ring_get_capacity(Ring *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->capacity);
}

static PyMethodDef Ring_methods[] = {
    {"begin", (PyCFunction)(void (*)(void))Ring_begin, METH_FASTCALL,
     "Write the enter part of the next record; returns its index."},
    {"end", (PyCFunction)(void (*)(void))Ring_end, METH_FASTCALL,
     "Write the exit part of record idx, unless the ring has lapped it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Ring_getset[] = {
    {"count", (getter)Ring_get_count, NULL, "index of the latest record started", NULL},
    {"capacity", (getter)Ring_get_capacity, NULL, "records in the ring", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nccl_doctor.capture._ring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The capture ring's hot path (see nccl_doctor/capture/ring.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_methods = Ring_methods,
    .tp_getset = Ring_getset,
};

static struct PyModuleDef ringmodule = {
    PyModuleDef_HEAD_INIT, "_ring", "The capture ring's hot path in C.", -1, NULL,
};

PyMODINIT_FUNC PyInit__ring(void) {
    if (PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&ringmodule);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
