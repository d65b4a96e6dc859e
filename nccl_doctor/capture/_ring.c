/* The capture ring's hot path in C: the optional accelerator of nccl_doctor.capture.ring.
 *
 * Ring(buffer, offset, capacity[, counter_offset]) writes event records into a writable buffer
 * (the capture's mmap) exactly as ring.PyRing does in Python: same layout (capture/format.py),
 * same Adler-32 check on the enter part, same exit check word. Python keeps the fallback; the
 * tests run both and compare their bytes. Built when a C compiler is present (setup.py marks the
 * extension optional).
 *
 * Recording and Call (the second half of this file) are the recorder's fast path over a Ring;
 * their fallback is the recorder's Python path (nccl_doctor/rank/recorder/wrappers.py). The C API
 * at its end (the capsule ``_C_API``) lends a Recorded's enter and leave, and a WAIT record, to
 * the functional collectives' C++ kernel (nccl_doctor/rank/recorder/_functional_kernel.cpp).
 *
 * Calls hold the GIL throughout, so the record counter needs no lock, as in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <structmember.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>
#include <time.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the capture format is little-endian: this machine uses the pure-Python ring"
#endif

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
    uint64_t slot;  /* (count - 1) % capacity, kept without dividing */
} Ring;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns()'s clock */
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#if defined(__SSE2__) && !defined(NCCL_DOCTOR_PORTABLE) /* tests build it with this too */
#include <emmintrin.h>
/* ENTER_SIZE - i for byte i of the enter part: the weights of b's sum, eight 16-bit lanes a row */
static int16_t ENTER_WEIGHTS[ENTER_SIZE] __attribute__((aligned(16)));

/* adler32(p, ENTER_SIZE) with SSE2: the byte sum by _mm_sad_epu8, the weighted sum by
 * _mm_madd_epi16 of the bytes widened to 16 bits and the weights (each product <= 255 * 104 and
 * each lane's total < 2^31, so no lane overflows). */
static uint32_t adler32_enter(const unsigned char *p) {
    const __m128i zero = _mm_setzero_si128();
    const __m128i *weights = (const __m128i *)ENTER_WEIGHTS;
    __m128i sums = zero, weighted = zero;
    int i = 0;
    for (; i + 16 <= ENTER_SIZE; i += 16, weights += 2) {
        __m128i v = _mm_loadu_si128((const __m128i *)(p + i));
        sums = _mm_add_epi64(sums, _mm_sad_epu8(v, zero));
        __m128i lo = _mm_madd_epi16(_mm_unpacklo_epi8(v, zero), _mm_load_si128(weights));
        __m128i hi = _mm_madd_epi16(_mm_unpackhi_epi8(v, zero), _mm_load_si128(weights + 1));
        weighted = _mm_add_epi32(weighted, _mm_add_epi32(lo, hi));
    }
    _Static_assert(ENTER_SIZE % 8 == 0, "the enter part is read 16 and then 8 bytes at a time");
    if (i < ENTER_SIZE) { /* 104 = 6 * 16 + 8 */
        __m128i v = _mm_loadl_epi64((const __m128i *)(p + i));
        sums = _mm_add_epi64(sums, _mm_sad_epu8(v, zero));
        __m128i lo = _mm_madd_epi16(_mm_unpacklo_epi8(v, zero), _mm_load_si128(weights));
        weighted = _mm_add_epi32(weighted, lo);
    }
    sums = _mm_add_epi64(sums, _mm_unpackhi_epi64(sums, sums));
    weighted = _mm_add_epi32(weighted, _mm_shuffle_epi32(weighted, _MM_SHUFFLE(1, 0, 3, 2)));
    weighted = _mm_add_epi32(weighted, _mm_shuffle_epi32(weighted, _MM_SHUFFLE(2, 3, 0, 1)));
    uint32_t s = (uint32_t)_mm_cvtsi128_si32(sums), w = (uint32_t)_mm_cvtsi128_si32(weighted);
    uint32_t a = 1 + s, b = (uint32_t)ENTER_SIZE + w;
    return ((b % 65521u) << 16) | (a % 65521u);
}

static void adler32_init(void) {
    for (int i = 0; i < ENTER_SIZE; i++)
        ENTER_WEIGHTS[i] = (int16_t)(ENTER_SIZE - i);
}
#define ADLER32_KIND "sse2"
#else
static uint32_t adler32_enter(const unsigned char *p) { /* zlib.adler32(p[:ENTER_SIZE]) */
    const size_t n = ENTER_SIZE;
    /* a = 1 + sum p[i], b = n + sum (n - i) p[i]: the same sums as zlib's running ones, without
     * its chain of dependent additions; no overflow before the modulo for n <= 5552 (NMAX) */
    uint32_t s = 0, w = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { /* eight bytes at a time: independent sums */
        const unsigned char *q = p + i;
        uint32_t sum = (uint32_t)q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
        uint32_t tilt = (uint32_t)q[1] + 2u * q[2] + 3u * q[3] + 4u * q[4] + 5u * q[5] +
                        6u * q[6] + 7u * q[7];
        s += sum;
        w += (uint32_t)(n - i) * sum - tilt;
    }
    for (; i < n; i++) {
        s += p[i];
        w += (uint32_t)(n - i) * p[i];
    }
    uint32_t a = 1 + s, b = (uint32_t)n + w;
    return ((b % 65521u) << 16) | (a % 65521u);
}

static void adler32_init(void) {}
#define ADLER32_KIND "portable"
#endif

static inline void put_u64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline void put_u32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u16(unsigned char *p, uint16_t v) { memcpy(p, &v, 2); }

/* Fields of ENTER ("<QQQqQQIIIIIIIIIIiiIBBH"): the size of each. */
static const unsigned char FIELD_SIZE[22] = {8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4,
                                             4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 2};

static const unsigned char FIELD_SIGNED[22] = {0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                               0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0};

/* The bits of field ``i`` for the Python int ``obj``, range-checked like struct.pack: a value that
 * does not fit its field raises OverflowError (a non-int raises TypeError). */
static int field_bits(int i, PyObject *obj, uint64_t *bits) {
    int size = FIELD_SIZE[i];
    if (FIELD_SIGNED[i]) {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (size < 8 && (v < -(1LL << (8 * size - 1)) || v >= (1LL << (8 * size - 1))))
            goto overflow;
        *bits = (uint64_t)v;
    } else {
        unsigned long long v = PyLong_AsUnsignedLongLong(obj);
        if (v == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (size < 8 && v >= (1ULL << (8 * size)))
            goto overflow;
        *bits = v;
    }
    return 0;
overflow:
    PyErr_Format(PyExc_OverflowError, "record field %d out of range", i);
    return -1;
}

/* ENTER's fields at their offsets: six 8-byte (0-47), thirteen 4-byte (48-99), two bytes (100,
 * 101) and a 2-byte one (102); little-endian (the put_* copy native order: see the check above). */
static void store_fields(unsigned char *rec, const uint64_t *bits) {
    for (int i = 0; i < 6; i++)
        put_u64(rec + 8 * i, bits[i]);
    for (int i = 6; i < 19; i++)
        put_u32(rec + 48 + 4 * (i - 6), (uint32_t)bits[i]);
    rec[100] = (unsigned char)bits[19];
    rec[101] = (unsigned char)bits[20];
    put_u16(rec + 102, (uint16_t)bits[21]);
}

/* Write the next record from the bits of ENTER's fields (bits[0], idx, is assigned here). */
static uint64_t ring_commit(Ring *self, uint64_t *bits) {
    unsigned char rec[RECORD_SIZE];
    memset(rec + ENTER_SIZE, 0, RECORD_SIZE - ENTER_SIZE); /* the fields fill the rest */
    uint64_t idx = self->count + 1;
    uint64_t slot = self->count == 0 || self->slot + 1 == self->capacity ? 0 : self->slot + 1;
    bits[0] = idx;
    if (bits[2] == 0) /* t_enter 0: now */
        bits[2] = now_ns();
    store_fields(rec, bits);
    put_u32(rec + ENTER_SIZE, adler32_enter(rec));
    self->count = idx;
    self->slot = slot;
    memcpy(self->ring + slot * RECORD_SIZE, rec, RECORD_SIZE);
    if (self->counter != NULL)
        put_u64(self->counter, idx);
    return idx;
}

/* Write record idx's exit part, unless the ring has lapped it (t_exit 0: now). */
static void ring_finish(Ring *self, uint64_t idx, long state, long delta, uint64_t t_exit) {
    if (idx < 1 || idx > self->count || self->count - idx >= self->capacity)
        return;
    uint64_t back = self->count - idx; /* records since idx's; its slot, without dividing */
    uint64_t slot = self->slot >= back ? self->slot - back : self->slot + self->capacity - back;
    if (t_exit == 0)
        t_exit = now_ns();
    uint32_t check = (uint32_t)(((uint64_t)idx * 0x9E3779B1ull) ^ t_exit ^
                                ((uint64_t)state << 20) ^ (uint64_t)(delta & 0xFFFF));
    unsigned char part[16];
    put_u64(part, t_exit);
    put_u16(part + 8, (uint16_t)(int16_t)delta);
    put_u16(part + 10, (uint16_t)state);
    put_u32(part + 12, check);
    memcpy(self->ring + slot * RECORD_SIZE + EXIT_OFFSET, part, 16);
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
    uint64_t bits[N_ENTER_ARGS + 1];
    for (int i = 0; i < N_ENTER_ARGS; i++) {
        if (field_bits(i + 1, args[i], &bits[i + 1]) < 0)
            return NULL;
    }
    return PyLong_FromUnsignedLongLong(ring_commit(self, bits));
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
    ring_finish(self, idx, state, delta, t_exit);
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
    self->slot = 0;
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

/* ---- the recorder's fast path -------------------------------------------------------------
 *
 * Recording: what the recorder writes to, shared by all its Calls (the recorder sets ``ring`` to
 * None while it has no capture, is disabled or uses the Python ring). Call: what one wrapped
 * torch.distributed function needs to record a call; its enter (enter_call) writes the ENTER
 * record exactly as the Python path of nccl_doctor/rank/recorder/wrappers.py does, reading the
 * recorder's own caches, and its leave (leave_impl) writes the exit in the common case. A
 * Recorded (below) calls both around the real function.
 *
 * enter handles only what is cached already: on a miss (a new group, shape or callsite) or on
 * anything unusual it declines and the Python path records the call (and fills the caches).
 * It writes nothing before it knows it can finish, and an Exception in it is never raised (it
 * declines; the Python path then meets the same error and disables the recorder).
 */

typedef struct {
    PyObject_HEAD
    PyObject *ring;       /* a Ring, or None: the fast path is off */
    PyObject *default_pg;
    PyObject *groups;     /* pg -> GroupRecord */
    PyObject *stacks;     /* thread id -> list of the indices of its calls in progress */
    PyObject *tensors;    /* Describer.tensors: (dtype, shape), (n, dtype, shape) or a string
                             -> (string id, bytes) */
    PyObject *positions;  /* Describer.positions: (id(code), lasti) -> (wrapper, internal, file,
                             line, function, code) */
    PyObject *paths;      /* Describer.paths: the positions' keys of a call path's frames (a
                             tuple) -> the path's string id */
    uint64_t epoch;       /* bumped by every assignment above: the Calls' memos of what they
                             read last hold only within one epoch (the recorder reassigns them
                             whenever a capture, group or cache it may remember goes away) */
} Recording;

/* An attribute read as PyObject_GetAttr reads a data descriptor of the object's type - a getset
 * (tensor.shape, tensor.dtype) or a member (a __slots__ field) - with the descriptor looked up
 * once per type and type version instead of on every call: the generic look-up's code is a good
 * part of what a call costs when it runs with cold caches, between two collectives. A type that
 * is not plain (its own __getattribute__/__getattr__) or has no such descriptor is read by name.
 * Data descriptors win over an instance __dict__, so skipping the generic path changes nothing. */
#if defined(Py_AUDIT_READ)
#define ATTR_AUDITED Py_AUDIT_READ
#elif defined(PY_AUDIT_READ)
#define ATTR_AUDITED PY_AUDIT_READ
#else
#define ATTR_AUDITED READ_RESTRICTED
#endif

typedef struct {
    PyTypeObject *type; /* a reference, or NULL */
    unsigned int tag;   /* type->tp_version_tag when learnt */
    PyObject *descr;    /* a reference: the getset or member descriptor, or NULL: by name */
} Attr;

static void attr_clear(Attr *m) {
    Py_CLEAR(m->type);
    Py_CLEAR(m->descr);
}

static int attr_traverse(Attr *m, visitproc visit, void *arg) {
    Py_VISIT(m->type);
    Py_VISIT(m->descr);
    return 0;
}

/* The descriptor of ``name`` that reads obj.<name> for objects of type ``tp``, or NULL: by name. */
static PyObject *attr_descriptor(PyTypeObject *tp, PyObject *name) {
#if defined(Py_TPFLAGS_VALID_VERSION_TAG) && PY_VERSION_HEX < 0x030E0000
    if (tp->tp_getattro != PyObject_GenericGetAttr)
        return NULL;
    PyObject *descr = _PyType_Lookup(tp, name); /* borrowed; gives the type a version tag */
    if (descr == NULL || !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) || tp->tp_version_tag == 0)
        return NULL;
    if (Py_IS_TYPE(descr, &PyGetSetDescr_Type)) {
        if (((PyGetSetDescrObject *)descr)->d_getset->get == NULL)
            return NULL;
    } else if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        if (((PyMemberDescrObject *)descr)->d_member->flags & ATTR_AUDITED)
            return NULL; /* read by name: the audit hook sees it */
    } else {
        return NULL;
    }
    /* a descriptor borrowed by an unrelated class (``shape = torch.Tensor.shape``) would be
     * handed an object of the wrong layout: getattr checks this, and so does this */
    if (!PyType_IsSubtype(tp, PyDescr_TYPE(descr)))
        return NULL;
    return descr;
#else
    (void)tp, (void)name;
    return NULL;
#endif
}

static void attr_learn(Attr *m, PyTypeObject *tp, PyObject *name) {
    PyObject *descr = attr_descriptor(tp, name);
    PyObject *old_type = (PyObject *)m->type, *old_descr = m->descr;
    m->type = (PyTypeObject *)Py_NewRef(tp);
    m->descr = Py_XNewRef(descr);
    m->tag = descr != NULL ? tp->tp_version_tag : 0;
    Py_XDECREF(old_type); /* last: freeing them may run Python code, which may learn anew */
    Py_XDECREF(old_descr);
}

/* obj.<name>: a new reference, or NULL with an error set (AttributeError as by name). With no
 * ``m`` (nothing to remember it in) it is read by name. */
static PyObject *attr_get(Attr *m, PyObject *obj, PyObject *name) {
    if (m == NULL)
        return PyObject_GetAttr(obj, name);
#if defined(Py_TPFLAGS_VALID_VERSION_TAG) && PY_VERSION_HEX < 0x030E0000
    PyTypeObject *tp = Py_TYPE(obj);
    if (tp != m->type || m->descr == NULL || !(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) ||
        tp->tp_version_tag != m->tag) {
        if (tp != m->type || m->descr != NULL) /* another type, or the type changed since */
            attr_learn(m, tp, name);
        if (m->descr == NULL)
            return PyObject_GetAttr(obj, name);
    }
    if (Py_IS_TYPE(m->descr, &PyGetSetDescr_Type)) {
        PyGetSetDef *g = ((PyGetSetDescrObject *)m->descr)->d_getset;
        return g->get(obj, g->closure);
    }
    return PyMember_GetOne((const char *)obj, ((PyMemberDescrObject *)m->descr)->d_member);
#else
    (void)m;
    return PyObject_GetAttr(obj, name);
#endif
}

typedef struct {
    PyObject_HEAD
    Recording *rec;
    PyObject *group_name, *inp_name, *out_name, *async_name; /* NULL: no such parameter */
    Py_ssize_t group_pos, inp_pos, out_pos, async_pos;
    PyObject *roots; /* tuple of (pos, name, relative) */
    unsigned int op;
    int kind, flags, measure, async_flag, returned;
    /* What the last call read, valid while rec->epoch is memo_epoch (see Recording.epoch). */
    uint64_t memo_epoch;
    PyObject *memo_grec;       /* not a reference: it lives in rec->groups for the epoch */
    PyObject *memo_seq;        /* the group's seq (borrowed from memo_grec) */
    uint64_t memo_group[2];    /* name_id and size bits */
    PyObject *memo_code;       /* the direct caller's code (a reference: its id stays its own) */
    int memo_lasti;
    uint64_t memo_site[6];
    PyObject *memo_dtype, *memo_shape; /* references; the input's description */
    uint64_t memo_desc[2];
    unsigned long memo_tid;    /* the thread of the last call, and its stack (a reference) */
    PyObject *memo_stack;
    Attr shape, dtype, p2p_bumps; /* how the input's type and the group record are read */
} Call;

static PyObject *str_seq, *str_name_id, *str_size, *str_ranks, *str_p2p_bumps, *str_shape,
    *str_dtype, *str_empty_list, *str_object;

static PyObject *Recording_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Recording *self = (Recording *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->ring = Py_NewRef(Py_None);
    self->default_pg = Py_NewRef(Py_None);
    self->groups = Py_NewRef(Py_None);
    self->stacks = Py_NewRef(Py_None);
    self->tensors = Py_NewRef(Py_None);
    self->positions = Py_NewRef(Py_None);
    self->paths = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static int Recording_traverse(Recording *self, visitproc visit, void *arg) {
    Py_VISIT(self->ring);
    Py_VISIT(self->default_pg);
    Py_VISIT(self->groups);
    Py_VISIT(self->stacks);
    Py_VISIT(self->tensors);
    Py_VISIT(self->positions);
    Py_VISIT(self->paths);
    return 0;
}

static int Recording_clear(Recording *self) {
    Py_CLEAR(self->ring);
    Py_CLEAR(self->default_pg);
    Py_CLEAR(self->groups);
    Py_CLEAR(self->stacks);
    Py_CLEAR(self->tensors);
    Py_CLEAR(self->positions);
    Py_CLEAR(self->paths);
    return 0;
}

static void Recording_dealloc(Recording *self) {
    PyObject_GC_UnTrack(self);
    Recording_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Recording_get(Recording *self, void *offset) {
    return Py_NewRef(*(PyObject **)((char *)self + (size_t)offset));
}

static int Recording_set(Recording *self, PyObject *value, void *offset) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete a Recording attribute");
        return -1;
    }
    Py_SETREF(*(PyObject **)((char *)self + (size_t)offset), Py_NewRef(value));
    self->epoch++;
    return 0;
}

static PyObject *Recording_get_epoch(Recording *self, void *closure) {
    return PyLong_FromUnsignedLongLong(self->epoch);
}

#define RECORDING_FIELD(name, doc) \
    {#name, (getter)Recording_get, (setter)Recording_set, doc, \
     (void *)offsetof(Recording, name)}

static PyGetSetDef Recording_getset[] = {
    RECORDING_FIELD(ring, "the Ring written to, or None"),
    RECORDING_FIELD(default_pg, "the default process group"),
    RECORDING_FIELD(groups, "pg -> GroupRecord"),
    RECORDING_FIELD(stacks, "thread id -> calls in progress"),
    RECORDING_FIELD(tensors, "Describer.tensors"),
    RECORDING_FIELD(positions, "Describer.positions"),
    RECORDING_FIELD(paths, "Describer.paths"),
    {"epoch", (getter)Recording_get_epoch, NULL, "changes counted so far", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};



static PyTypeObject RecordingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nccl_doctor.capture._ring.Recording",
    .tp_basicsize = sizeof(Recording),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "What a recorder's Calls write to and read from (see Call).",
    .tp_new = Recording_new,
    .tp_traverse = (traverseproc)Recording_traverse,
    .tp_clear = (inquiry)Recording_clear,
    .tp_dealloc = (destructor)Recording_dealloc,
    .tp_getset = Recording_getset,
};

/* A call's arguments as vectorcall passes them: the positional ones, then the values of the
 * keywords named in ``kwnames``. */
typedef struct {
    PyObject *const *items;
    Py_ssize_t n;       /* positional */
    PyObject *kwnames;  /* a tuple of str, or NULL */
} Args;

/* Python's ``args[pos] if pos < len(args) else kwargs.get(name)``: a borrowed reference, or NULL
 * (with no error set) when the argument was not given. */
static PyObject *arg_at(const Args *a, Py_ssize_t pos, PyObject *name) {
    if (pos < a->n)
        return a->items[pos];
    if (a->kwnames == NULL)
        return NULL;
    Py_ssize_t k = PyTuple_GET_SIZE(a->kwnames);
    for (Py_ssize_t i = 0; i < k; i++) /* names are interned: identity, nearly always */
        if (PyTuple_GET_ITEM(a->kwnames, i) == name)
            return a->items[a->n + i];
    for (Py_ssize_t i = 0; i < k; i++)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(a->kwnames, i), name) == 0)
            return a->items[a->n + i];
    return NULL;
}

/* An int of the recorder's caches as the bits of field i; -1 (maybe with an error) otherwise. */
static int int_bits(int i, PyObject *obj, uint64_t *bits) {
    if (!PyLong_CheckExact(obj) && !PyBool_Check(obj))
        return -1;
    return field_bits(i, obj, bits);
}

/* (string id, bytes) of a cached description ``key`` of Describer.tensors; -1 on a miss. */
static int cached(Recording *rec, PyObject *key, uint64_t *id, uint64_t *nbytes) {
    if (key == NULL)
        return -1;
    PyObject *found = PyDict_GetItemWithError(rec->tensors, key);
    Py_DECREF(key);
    if (found == NULL || !PyTuple_CheckExact(found) || PyTuple_GET_SIZE(found) != 2)
        return -1;
    if (int_bits(8, PyTuple_GET_ITEM(found, 0), id) < 0)
        return -1;
    return int_bits(4, PyTuple_GET_ITEM(found, 1), nbytes);
}

static PyObject *pair(PyObject *a, PyObject *b) { /* steals both; NULL-safe */
    if (a == NULL || b == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return NULL;
    }
    PyObject *t = PyTuple_New(2);
    if (t == NULL) {
        Py_DECREF(a);
        Py_DECREF(b);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, b);
    return t;
}

/* Python's ``getattr(x, "shape", None)``: a new reference (None when x has no shape), or NULL
 * with an error set; read through ``m`` when there is one (see attr_get). */
static PyObject *get_shape(Attr *m, PyObject *x) {
    PyObject *shape = attr_get(m, x, str_shape);
    if (shape == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    return shape;
}

/* Describer.tensor(x) when its answer is cached: 0, or -1 (the Python path decides). */
static int describe(Recording *rec, PyObject *x, uint64_t *id, uint64_t *nbytes) {
    PyObject *shape = get_shape(NULL, x);
    if (shape != NULL && shape != Py_None)
        return cached(rec, pair(PyObject_GetAttr(x, str_dtype), shape), id, nbytes);
    if (shape == NULL)
        return -1;
    Py_DECREF(shape);
    if (!PyList_CheckExact(x) && !PyTuple_CheckExact(x)) {
        if (PyList_Check(x) || PyTuple_Check(x))
            return -1; /* a subclass may index differently: the Python path describes it */
        Py_INCREF(str_object);
        return cached(rec, str_object, id, nbytes);
    }
    PyObject *items = Py_NewRef(x);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    int ok = -1;
    PyObject *key = NULL, *first_shape = NULL, *dtype = NULL;
    if (n == 0) {
        Py_INCREF(str_empty_list);
        ok = cached(rec, str_empty_list, id, nbytes);
        goto done;
    }
    PyObject *first = PySequence_Fast_GET_ITEM(items, 0);
    first_shape = get_shape(NULL, first);
    if (first_shape == NULL)
        goto done;
    if (first_shape == Py_None) {
        const char *what = PyList_Check(first) || PyTuple_Check(first) ? "list" : "object";
        ok = cached(rec, PyUnicode_FromFormat("%zd*%s", n, what), id, nbytes);
        goto done;
    }
    dtype = PyObject_GetAttr(first, str_dtype);
    if (dtype == NULL)
        goto done;
    if (n <= 16) { /* _UNIFORM_CHECK_LIMIT: a list that is not uniform is described in Python */
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *other = PySequence_Fast_GET_ITEM(items, i);
            PyObject *s = PyObject_GetAttr(other, str_shape);
            if (s == NULL)
                goto done;
            int same = PyObject_RichCompareBool(s, first_shape, Py_EQ);
            Py_DECREF(s);
            if (same != 1)
                goto done;
            PyObject *d = PyObject_GetAttr(other, str_dtype);
            if (d == NULL)
                goto done;
            same = PyObject_RichCompareBool(d, dtype, Py_EQ);
            Py_DECREF(d);
            if (same != 1)
                goto done;
        }
    }
    key = PyTuple_New(3);
    if (key == NULL)
        goto done;
    PyObject *count = PyLong_FromSsize_t(n);
    if (count == NULL)
        goto done;
    PyTuple_SET_ITEM(key, 0, count);
    PyTuple_SET_ITEM(key, 1, Py_NewRef(dtype));
    PyTuple_SET_ITEM(key, 2, Py_NewRef(first_shape));
    ok = cached(rec, key, id, nbytes);
    key = NULL; /* cached() took it */
done:
    Py_XDECREF(key);
    Py_XDECREF(first_shape);
    Py_XDECREF(dtype);
    Py_DECREF(items);
    return ok;
}

/* ``a == b`` for two shapes: 1, 0, or -1 with an error set. Two tuples of one type whose ``==`` is
 * tuple's (torch.Size) are compared item by item, an item identical to the other (a small int)
 * without a call; anything else by ``==``. */
static int same_shape(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (Py_TYPE(a) != Py_TYPE(b) || !PyTuple_Check(a) ||
        Py_TYPE(a)->tp_richcompare != PyTuple_Type.tp_richcompare)
        return PyObject_RichCompareBool(a, b, Py_EQ);
    Py_ssize_t n = PyTuple_GET_SIZE(a);
    if (n != PyTuple_GET_SIZE(b))
        return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyTuple_GET_ITEM(a, i), *y = PyTuple_GET_ITEM(b, i);
        if (x == y)
            continue;
        int same = PyObject_RichCompareBool(x, y, Py_EQ);
        if (same != 1)
            return same;
    }
    return 1;
}

/* describe() for the input of a Call, which remembers the dtype and shape it saw last. */
static int describe_input(Call *call, PyObject *x, uint64_t *id, uint64_t *nbytes) {
    PyObject *shape = get_shape(&call->shape, x);
    if (shape == NULL)
        return -1;
    if (shape == Py_None) {
        Py_DECREF(shape);
        return describe(call->rec, x, id, nbytes);
    }
    PyObject *dtype = attr_get(&call->dtype, x, str_dtype);
    if (dtype == NULL) {
        Py_DECREF(shape);
        return -1;
    }
    int r = 0, same = 0;
    if (dtype == call->memo_dtype && call->memo_shape != NULL) {
        uint64_t desc[2] = {call->memo_desc[0], call->memo_desc[1]};
        PyObject *memo = Py_NewRef(call->memo_shape); /* another thread may replace it */
        same = same_shape(shape, memo);
        Py_DECREF(memo);
        if (same < 0) { /* an item's __eq__ raised: an Exception is the look-up's to make */
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                Py_DECREF(dtype); /* KeyboardInterrupt and the like: the caller's */
                Py_DECREF(shape);
                return -1;
            }
            PyErr_Clear();
            same = 0;
        }
        if (same)
            *id = desc[0], *nbytes = desc[1];
    }
    if (!same) {
        r = cached(call->rec, pair(Py_NewRef(dtype), Py_NewRef(shape)), id, nbytes);
        if (r == 0) {
            Py_XSETREF(call->memo_dtype, Py_NewRef(dtype));
            Py_XSETREF(call->memo_shape, Py_NewRef(shape));
            call->memo_desc[0] = *id, call->memo_desc[1] = *nbytes;
        }
    }
    Py_DECREF(dtype);
    Py_DECREF(shape);
    return r;
}

static int frame_lasti(PyFrameObject *f) {
#if PY_VERSION_HEX >= 0x030B0000
    return PyFrame_GetLasti(f);
#else
    PyObject *v = PyObject_GetAttrString((PyObject *)f, "f_lasti");
    if (v == NULL)
        return -2;
    long lasti = PyLong_AsLong(v);
    Py_DECREF(v);
    return lasti == -1 && PyErr_Occurred() ? -2 : (int)lasti;
#endif
}

#define PATH_FRAMES 16 /* rank/recorder/arguments.PATH_FRAMES: the frames a call path keeps */

/* Describer.callsites(caller of the API function) from Describer.positions and Describer.paths:
 * the user file, line and function, the API file and line and the call path's id (fields
 * 10..15), or -1 when a frame or the path is not cached yet (the Python path records the call
 * and caches them). The path is looked up by its frames' position keys, which the walk makes
 * anyway: one tuple and one dict look-up more than the frames' own, and none at all for a
 * caller the Call remembers. */
static int callsite(Call *call, uint64_t *site) {
    Recording *rec = call->rec;
    /* the current frame: the caller's (a Recorded, in C, has none of its own) */
    PyFrameObject *f = PyEval_GetFrame();
    if (f == NULL)
        return -1;
    f = (PyFrameObject *)Py_NewRef(f);
    PyFrameObject *first = f;
    uint64_t api_file = 0, api_line = 0;
    PyObject *keys[PATH_FRAMES];
    int n = 0, found = 0, r = -1;
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        int lasti = frame_lasti(f);
        if (f == first && (PyObject *)code == call->memo_code && lasti == call->memo_lasti) {
            memcpy(site, call->memo_site, sizeof call->memo_site); /* the caller of last time */
            Py_DECREF(code);
            Py_DECREF(f);
            return 0;
        }
        PyObject *key = lasti == -2 ? NULL
                                    : pair(PyLong_FromVoidPtr(code), PyLong_FromLong(lasti));
        Py_DECREF(code);
        PyObject *info = key == NULL ? NULL : PyDict_GetItemWithError(rec->positions, key);
        if (info == NULL || !PyTuple_CheckExact(info) || PyTuple_GET_SIZE(info) != 6) {
            Py_XDECREF(key);
            goto out;
        }
        int wrapper = PyObject_IsTrue(PyTuple_GET_ITEM(info, 0));
        int internal = PyObject_IsTrue(PyTuple_GET_ITEM(info, 1));
        if (wrapper < 0 || internal < 0) {
            Py_DECREF(key);
            goto out;
        }
        if (!internal) {
            uint64_t file, line;
            if (int_bits(10, PyTuple_GET_ITEM(info, 2), &file) < 0 ||
                int_bits(11, PyTuple_GET_ITEM(info, 3), &line) < 0) {
                Py_DECREF(key);
                goto out;
            }
            if (!api_file) {
                api_file = file;
                api_line = line;
            }
            if (n < PATH_FRAMES)
                keys[n++] = key; /* the path's frames, innermost first */
            else
                Py_DECREF(key);
            if (!wrapper) {
                if (int_bits(12, PyTuple_GET_ITEM(info, 4), &site[2]) < 0)
                    goto out;
                site[0] = file, site[1] = line;
                found = 1;
                break; /* f: the user's frame */
            }
        } else {
            Py_DECREF(key);
        }
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    if (!found)
        site[0] = site[1] = site[2] = 0;
    site[3] = api_file, site[4] = api_line;
    PyObject *path = PyTuple_New(n);
    if (path == NULL)
        goto out;
    for (int i = 0; i < n; i++)
        PyTuple_SET_ITEM(path, i, keys[i]);
    n = 0; /* the tuple holds them now */
    PyObject *id = PyDict_GetItemWithError(rec->paths, path);
    Py_DECREF(path);
    if (id == NULL || int_bits(15, id, &site[5]) < 0)
        goto out;
    r = 0;
    if (found && f == first) { /* depends on this frame alone: remember it */
        Py_XSETREF(call->memo_code, (PyObject *)PyFrame_GetCode(f));
        call->memo_lasti = frame_lasti(f);
        memcpy(call->memo_site, site, sizeof call->memo_site);
    }
out:
    for (int i = 0; i < n; i++)
        Py_DECREF(keys[i]);
    Py_XDECREF(f);
    return r;
}

static int group_field(int i, PyObject *grec, PyObject *name, Attr *m, uint64_t *bits) {
    PyObject *v = attr_get(m, grec, name);
    if (v == NULL)
        return -1;
    int r = int_bits(i, v, bits);
    Py_DECREF(v);
    return r;
}

/* What enter() wrote for a call: references, which entered_clear() releases. */
typedef struct {
    PyObject *idx, *grec, *stack, *ring;
    long long seq; /* -1 without one */
    uint64_t flags;
} Entered;

static void entered_clear(Entered *e) {
    Py_CLEAR(e->idx);
    Py_CLEAR(e->grec);
    Py_CLEAR(e->stack);
    Py_CLEAR(e->ring);
}

/* A thread's call stack (a list of record indices) grows and shrinks at its end on every call:
 * list.append and list.pop without their calls. Only an append past the list's room goes through
 * PyList_Append (which grows it); a pop leaves the room for the next push, as list.pop mostly
 * does. The GIL is held. */
static int stack_push(PyObject *stack, PyObject *item) {
    PyListObject *list = (PyListObject *)stack;
    Py_ssize_t n = Py_SIZE(list);
    if (n >= list->allocated)
        return PyList_Append(stack, item);
    list->ob_item[n] = Py_NewRef(item);
    Py_SET_SIZE(list, n + 1);
    return 0;
}

static void stack_pop(PyObject *stack) { /* the list is not empty */
    PyListObject *list = (PyListObject *)stack;
    Py_ssize_t n = Py_SIZE(list) - 1;
    PyObject *top = list->ob_item[n];
    list->ob_item[n] = NULL;
    Py_SET_SIZE(list, n);
    Py_DECREF(top); /* after: its deallocation cannot see it in the list */
}

/* Write the ENTER record of a call: 1 (``out`` filled), or 0: not recorded (maybe with an error
 * set): the Python path decides. ``site``: NULL, or the callsite fields (10..15) the C API's
 * caller knows already for this call's frames (see RingAPI.enter). */
static int enter_impl(Call *self, const Args *a, Entered *out, const uint64_t *site) {
    Recording *rec = self->rec;
    PyObject *ring = rec->ring, *pg = NULL, *grec = NULL, *stack = NULL;
    PyObject *v, *tid_obj = NULL;
    long long seq = -1;
    int entered = 0;
    uint64_t bits[N_ENTER_ARGS + 1];
    memset(bits, 0, sizeof bits);
    if (!PyDict_CheckExact(rec->groups) || !PyDict_CheckExact(rec->stacks) ||
        !PyDict_CheckExact(rec->tensors) || !PyDict_CheckExact(rec->positions) ||
        !PyDict_CheckExact(rec->paths))
        return 0;
    if (self->group_name != NULL) {
        pg = arg_at(a, self->group_pos, self->group_name);
        if (pg == NULL && PyErr_Occurred())
            return 0;
    }
    if (pg == NULL || pg == Py_None)
        pg = rec->default_pg;
    Py_INCREF(ring);
    Py_INCREF(pg);
    grec = PyDict_GetItemWithError(rec->groups, pg);
    if (grec == NULL)
        goto done;
    Py_INCREF(grec);
    uint64_t epoch = rec->epoch; /* what this call's memos hold for (re-checked after Python ran) */
    if (self->memo_epoch != epoch) { /* a new capture, group set or cache: forget it all */
        self->memo_grec = self->memo_seq = NULL;
        Py_CLEAR(self->memo_code);
        Py_CLEAR(self->memo_dtype);
        Py_CLEAR(self->memo_shape);
        Py_CLEAR(self->memo_stack);
        self->memo_epoch = epoch;
    }
    if (grec != self->memo_grec) {
        PyObject *seq_fn = PyObject_GetAttr(grec, str_seq);
        if (seq_fn == NULL)
            goto done;
        Py_DECREF(seq_fn); /* grec holds it */
        self->memo_grec = NULL;
        if (group_field(7, grec, str_name_id, NULL, &self->memo_group[0]) < 0 ||
            group_field(17, grec, str_size, NULL, &self->memo_group[1]) < 0)
            goto done;
        self->memo_grec = grec, self->memo_seq = seq_fn;
    }
    bits[7] = self->memo_group[0], bits[17] = self->memo_group[1];
    /* seq: grec.seq() + 1, or -1 without one */
    v = Py_NewRef(self->memo_seq);
    if (v == Py_None) {
        Py_DECREF(v);
        bits[3] = (uint64_t)-1LL;
    } else {
        PyObject *now = PyObject_CallNoArgs(v); /* torch lets other threads run meanwhile */
        Py_DECREF(v);
        if (now == NULL || rec->epoch != epoch || rec->ring != ring) {
            Py_XDECREF(now); /* the recorder changed meanwhile: the Python path decides */
            goto done;
        }
        seq = PyLong_CheckExact(now) ? PyLong_AsLongLong(now) : LLONG_MAX;
        Py_DECREF(now);
        if (seq == LLONG_MAX || (seq == -1 && PyErr_Occurred()))
            goto done; /* the Python path adds the one */
        seq += 1;
        bits[3] = (uint64_t)seq;
    }
    if (self->inp_name != NULL) {
        PyObject *x = arg_at(a, self->inp_pos, self->inp_name);
        if (x == NULL && PyErr_Occurred())
            goto done;
        if (x != NULL && x != Py_None && describe_input(self, x, &bits[8], &bits[4]) < 0)
            goto done;
    }
    if (self->out_name != NULL) {
        PyObject *x = arg_at(a, self->out_pos, self->out_name);
        uint64_t unused;
        if (x == NULL && PyErr_Occurred())
            goto done;
        if (x != NULL && x != Py_None && describe(rec, x, &bits[9], &unused) < 0)
            goto done;
    }
    /* peer: the first root given; group_src/group_dst are group ranks, turned global */
    bits[16] = (uint64_t)-1LL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->roots); i++) {
        PyObject *root = PyTuple_GET_ITEM(self->roots, i);
        Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(root, 0));
        PyObject *r = arg_at(a, pos, PyTuple_GET_ITEM(root, 1));
        if (r == NULL && PyErr_Occurred())
            goto done;
        if (r == NULL || r == Py_None)
            continue;
        if (!PyLong_CheckExact(r))
            goto done;
        PyObject *peer = r;
        Py_INCREF(peer);
        if (PyTuple_GET_ITEM(root, 2) == Py_True) {
            Py_ssize_t at = PyLong_AsSsize_t(r);
            PyObject *ranks = PyObject_GetAttr(grec, str_ranks);
            if (ranks == NULL || (at == -1 && PyErr_Occurred())) {
                Py_XDECREF(ranks);
                Py_DECREF(peer);
                goto done;
            }
            if (!PyTuple_CheckExact(ranks)) {
                Py_DECREF(ranks);
                Py_DECREF(peer);
                goto done;
            }
            if (0 <= at && at < PyTuple_GET_SIZE(ranks))
                Py_SETREF(peer, Py_NewRef(PyTuple_GET_ITEM(ranks, at)));
            Py_DECREF(ranks);
        }
        int bad = int_bits(16, peer, &bits[16]);
        Py_DECREF(peer);
        if (bad < 0)
            goto done;
        break;
    }
    bits[20] = (uint64_t)self->flags;
    if (self->async_name != NULL) {
        PyObject *x = arg_at(a, self->async_pos, self->async_name);
        if (x == NULL && PyErr_Occurred())
            goto done;
        if (x != NULL) {
            int yes = PyObject_IsTrue(x);
            if (yes < 0)
                goto done;
            if (yes)
                bits[20] |= (uint64_t)self->async_flag;
        }
    }
    if (site != NULL)
        memcpy(&bits[10], site, 6 * sizeof(uint64_t));
    else if (callsite(self, &bits[10]) < 0)
        goto done;
    /* it changes: read every time */
    if (group_field(18, grec, str_p2p_bumps, &self->p2p_bumps, &bits[18]) < 0)
        goto done;
    unsigned long tid = PyThread_get_thread_ident();
    bits[5] = (uint64_t)tid;
    if (rec->epoch != epoch) /* Python code run since (a getter's __torch_function__) changed it */
        goto done;
    if (self->memo_stack != NULL && tid == self->memo_tid) { /* the thread of the last call */
        stack = Py_NewRef(self->memo_stack);
    } else {
        tid_obj = PyLong_FromUnsignedLong(tid);
        if (tid_obj == NULL)
            goto done;
        stack = PyDict_GetItemWithError(rec->stacks, tid_obj);
        if (stack == NULL) {
            if (PyErr_Occurred())
                goto done;
            stack = PyList_New(0);
            if (stack == NULL || PyDict_SetItem(rec->stacks, tid_obj, stack) < 0)
                goto done;
        } else {
            if (!PyList_CheckExact(stack))
                goto done;
            Py_INCREF(stack);
        }
        /* the dict keeps its lists for the epoch (cleared only with a bump: a fork, a forget) */
        Py_XSETREF(self->memo_stack, Py_NewRef(stack));
        self->memo_tid = tid;
    }
    Py_ssize_t depth = PyList_GET_SIZE(stack);
    if (depth > 0 && int_bits(1, PyList_GET_ITEM(stack, depth - 1), &bits[1]) < 0)
        goto done;
    bits[6] = self->op;
    bits[19] = (uint64_t)self->kind;
    /* everything is known: from here on nothing can fall back */
    PyObject *idx_obj = PyLong_FromUnsignedLongLong(((Ring *)ring)->count + 1);
    if (idx_obj == NULL)
        goto done;
    ring_commit((Ring *)ring, bits);
    if (stack_push(stack, idx_obj) < 0)
        PyErr_Clear(); /* out of memory: the call goes on, its children lose their parent */
    out->idx = idx_obj;
    out->grec = Py_NewRef(grec);
    out->seq = seq;
    out->stack = Py_NewRef(stack);
    out->ring = Py_NewRef(ring);
    out->flags = bits[20];
    entered = 1;
done:
    Py_XDECREF(tid_obj);
    Py_XDECREF(stack);
    Py_XDECREF(grec);
    Py_DECREF(pg);
    Py_DECREF(ring);
    return entered;
}

/* enter_impl() with its errors sorted: 1 recorded, 0 not (no error set), -1: an error to raise
 * (KeyboardInterrupt and the like are the user's; an Exception is the recorder's, dropped). */
static int enter_call(Call *self, const Args *a, Entered *out, const uint64_t *site) {
    memset(out, 0, sizeof *out);
    if (Py_TYPE(self->rec->ring) != &RingType)
        return 0;
    if (enter_impl(self, a, out, site))
        return 1;
    if (PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
    }
    return 0;
}

/* Pop the call stack's top when it is this record's own: the number object pushed
   (``idx_obj``), or the same number ``idx`` pushed by the Python path. */
static void pop_own(PyObject *stack, PyObject *idx_obj, uint64_t idx) {
    Py_ssize_t n = PyList_GET_SIZE(stack);
    if (n == 0)
        return;
    PyObject *top = PyList_GET_ITEM(stack, n - 1);
    int mine = top == idx_obj;
    if (!mine && PyLong_CheckExact(top)) {
        mine = PyLong_AsUnsignedLongLong(top) == idx;
        if (PyErr_Occurred()) {
            PyErr_Clear();
            mine = 0;
        }
    }
    if (mine)
        stack_pop(stack);
}

/* Write the exit of a plain call that returned ``result``: 1, or 0 when the recorder's
 * ``finish`` has to (measured calls, async works). Never leaves an error set. */
static int leave_impl(Call *self, PyObject *idx_obj, PyObject *stack, uint64_t flags,
                      PyObject *ring, PyObject *result) {
    if (self->measure)
        return 0;
    uint64_t idx = PyLong_AsUnsignedLongLong(idx_obj);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if ((flags & (uint64_t)self->async_flag && result != Py_None) || !PyList_CheckExact(stack) ||
        Py_TYPE(ring) != &RingType)
        return 0;
    pop_own(stack, idx_obj, idx);
    ring_finish((Ring *)ring, idx, self->returned, 1, 0);
    return 1;
}

/* where: None, or (pos, name) */
static int parse_where(PyObject *where, Py_ssize_t *pos, PyObject **name) {
    *pos = 0;
    *name = NULL;
    if (where == Py_None)
        return 0;
    if (!PyTuple_Check(where) || PyTuple_GET_SIZE(where) != 2 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(where, 1))) {
        PyErr_SetString(PyExc_TypeError, "a parameter is None or (position, name)");
        return -1;
    }
    *pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(where, 0));
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    *name = Py_NewRef(PyTuple_GET_ITEM(where, 1));
    return 0;
}

/* Call(recording, group, inp, out, async_, roots, kind, flags, measure, async_flag, returned):
 * group/inp/out/async_ None or (position, name); roots a tuple of ((position, name), relative). */
static int Call_init(Call *self, PyObject *args, PyObject *kwds) {
    PyObject *rec, *group, *inp, *out, *async_, *roots;
    int kind, flags, measure, async_flag, returned;
    if (!PyArg_ParseTuple(args, "O!OOOOO!iipii", &RecordingType, &rec, &group, &inp, &out,
                          &async_, &PyTuple_Type, &roots, &kind, &flags, &measure, &async_flag,
                          &returned))
        return -1;
    if (self->rec != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Call is already initialised");
        return -1;
    }
    if (parse_where(group, &self->group_pos, &self->group_name) < 0 ||
        parse_where(inp, &self->inp_pos, &self->inp_name) < 0 ||
        parse_where(out, &self->out_pos, &self->out_name) < 0 ||
        parse_where(async_, &self->async_pos, &self->async_name) < 0)
        return -1;
    PyObject *flat = PyTuple_New(PyTuple_GET_SIZE(roots));
    if (flat == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(roots); i++) {
        PyObject *root = PyTuple_GET_ITEM(roots, i), *where, *relative;
        Py_ssize_t pos;
        PyObject *name;
        if (!PyArg_ParseTuple(root, "OO", &where, &relative) ||
            parse_where(where, &pos, &name) < 0 || name == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "a root is ((position, name), relative)");
            Py_DECREF(flat);
            return -1;
        }
        PyObject *item = Py_BuildValue("(nNO)", pos, name, PyObject_IsTrue(relative) ? Py_True
                                                                                      : Py_False);
        if (item == NULL) {
            Py_DECREF(flat);
            return -1;
        }
        PyTuple_SET_ITEM(flat, i, item);
    }
    self->roots = flat;
    self->rec = (Recording *)Py_NewRef(rec);
    self->kind = kind, self->flags = flags, self->measure = measure;
    self->async_flag = async_flag, self->returned = returned;
    return 0;
}

static int Call_traverse(Call *self, visitproc visit, void *arg) {
    Py_VISIT(self->rec);
    Py_VISIT(self->memo_stack);
    Attr *attrs[] = {&self->shape, &self->dtype, &self->p2p_bumps};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
        int r = attr_traverse(attrs[i], visit, arg);
        if (r)
            return r;
    }
    return 0;
}

static int Call_clear(Call *self) {
    Py_CLEAR(self->rec);
    Py_CLEAR(self->memo_stack);
    attr_clear(&self->shape);
    attr_clear(&self->dtype);
    attr_clear(&self->p2p_bumps);
    return 0;
}

static void Call_dealloc(Call *self) {
    PyObject_GC_UnTrack(self);
    Call_clear(self);
    Py_XDECREF(self->group_name);
    Py_XDECREF(self->inp_name);
    Py_XDECREF(self->out_name);
    Py_XDECREF(self->async_name);
    Py_XDECREF(self->roots);
    Py_XDECREF(self->memo_code);
    Py_XDECREF(self->memo_dtype);
    Py_XDECREF(self->memo_shape);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Call_members[] = {
    {"op_id", T_UINT, offsetof(Call, op), 0, "string id of the function's name"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nccl_doctor.capture._ring.Call",
    .tp_basicsize = sizeof(Call),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One wrapped torch.distributed function's recording fast path.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Call_init,
    .tp_traverse = (traverseproc)Call_traverse,
    .tp_clear = (inquiry)Call_clear,
    .tp_dealloc = (destructor)Call_dealloc,
    .tp_members = Call_members,
};

/* ---- Recorded: the function that replaces a torch.distributed one --------------------------
 *
 * Recorded(call, fn, python, finish, fail, is_p2p, failed, returned): the call's enter, ``fn``,
 * its leave, with the recorder's ``finish`` for what leave does not do and the Python path when
 * enter declines - without a Python frame, an argument tuple or a token: the arguments go on to
 * ``fn`` as they came (vectorcall). ``python`` makes the Python path (called with no argument,
 * the first time enter declines: a process whose calls all take the fast path never builds its
 * closures, ~30 objects per function). It has a __dict__ (functools.update_wrapper fills it:
 * __wrapped__, __name__, ...) and binds like a function. An exception of ``fn`` reaches the
 * caller unchanged.
 */

typedef struct {
    PyObject_HEAD
    Call *call;
    PyObject *fn, *python, *finish, *fail, *dict;
    PyObject *is_p2p, *failed, *returned; /* finish()'s constant arguments */
    vectorcallfunc vectorcall;
    int python_made; /* python is the Python path itself, no longer its maker */
} Recorded;

/* finish(idx, grec, seq, stack, flags, measure, is_p2p, state, result) */
static PyObject *call_finish(Recorded *self, Entered *e, PyObject *state, PyObject *result) {
    PyObject *flags = PyLong_FromUnsignedLongLong(e->flags);
    PyObject *seq = PyLong_FromLongLong(e->seq);
    if (flags == NULL || seq == NULL) {
        Py_XDECREF(flags);
        Py_XDECREF(seq);
        return NULL;
    }
    PyObject *argv[9] = {e->idx, e->grec, seq, e->stack, flags,
                         self->call->measure ? Py_True : Py_False, self->is_p2p, state, result};
    PyObject *out = PyObject_Vectorcall(self->finish, argv, 9, NULL);
    Py_DECREF(flags);
    Py_DECREF(seq);
    return out;
}

/* The recorder's own error (an Exception, set) from finishing a record: handed to its
   ``fail`` (which disables it) and cleared, never raised into the user's call. */
static void recorder_failed(Recorded *self) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *ok = value == NULL ? NULL : PyObject_CallOneArg(self->fail, value);
    Py_XDECREF(ok);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

/* The Python path, made by its maker the first time it is needed (then kept): 0, or -1 with
   the maker's error handed to ``fail`` (a KeyboardInterrupt and the like stay set: -2). */
static int python_path(Recorded *self) {
    PyObject *made = PyObject_CallNoArgs(self->python);
    if (made == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception))
            return -2;
        recorder_failed(self);
        return -1;
    }
    if (self->python_made) { /* another thread made it while this one did (the maker ran
                                Python code): theirs is kept */
        Py_DECREF(made);
        return 0;
    }
    Py_SETREF(self->python, made);
    self->python_made = 1;
    return 0;
}

static PyObject *Recorded_vectorcall(Recorded *self, PyObject *const *argv, size_t nargsf,
                                     PyObject *kwnames) {
    Args a = {argv, PyVectorcall_NARGS(nargsf),
              kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0 ? kwnames : NULL};
    Entered e;
    int r = enter_call(self->call, &a, &e, NULL);
    if (r < 0)
        return NULL;
    if (r == 0) {
        int made = self->python_made ? 0 : python_path(self);
        if (made == -2)
            return NULL;
        if (made < 0) /* the recorder's own failure: this call goes unrecorded */
            return PyObject_Vectorcall(self->fn, argv, nargsf, kwnames);
        return PyObject_Vectorcall(self->python, argv, nargsf, kwnames);
    }
    PyObject *result = PyObject_Vectorcall(self->fn, argv, nargsf, kwnames);
    if (result == NULL) { /* the call's exception: recorded, then the caller's, unchanged */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *out = call_finish(self, &e, self->failed, Py_None);
        Py_XDECREF(out);
        PyErr_Clear(); /* finish() keeps its own errors; this could only be out of memory */
        PyErr_Restore(type, value, tb);
        entered_clear(&e);
        return NULL;
    }
    if (!leave_impl(self->call, e.idx, e.stack, e.flags, e.ring, result)) {
        PyObject *out = call_finish(self, &e, self->returned, result);
        if (out != NULL) {
            Py_DECREF(out);
        } else if (PyErr_ExceptionMatches(PyExc_Exception)) { /* the recorder's: disable it */
            recorder_failed(self);
        } else { /* KeyboardInterrupt and the like, as from a Python wrapper */
            Py_DECREF(result);
            result = NULL;
        }
    }
    entered_clear(&e);
    return result;
}

static int Recorded_init(Recorded *self, PyObject *args, PyObject *kwds) {
    PyObject *call, *fn, *python, *finish, *fail, *failed, *returned;
    int is_p2p;
    if (!PyArg_ParseTuple(args, "O!OOOOpOO", &CallType, &call, &fn, &python, &finish, &fail,
                          &is_p2p, &failed, &returned))
        return -1;
    if (self->call != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Recorded is already initialised");
        return -1;
    }
    if (!PyCallable_Check(fn) || !PyCallable_Check(python) || !PyCallable_Check(finish) ||
        !PyCallable_Check(fail)) {
        PyErr_SetString(PyExc_TypeError, "fn, python, finish and fail must be callable");
        return -1;
    }
    self->call = (Call *)Py_NewRef(call);
    self->fn = Py_NewRef(fn);
    self->python = Py_NewRef(python);
    self->finish = Py_NewRef(finish);
    self->fail = Py_NewRef(fail);
    self->is_p2p = Py_NewRef(is_p2p ? Py_True : Py_False);
    self->failed = Py_NewRef(failed);
    self->returned = Py_NewRef(returned);
    self->vectorcall = (vectorcallfunc)Recorded_vectorcall;
    return 0;
}

static PyObject *Recorded_call(Recorded *self, PyObject *args, PyObject *kwargs) {
    if (self->call == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Recorded is not initialised");
        return NULL;
    }
    return PyVectorcall_Call((PyObject *)self, args, kwargs);
}

static int Recorded_traverse(Recorded *self, visitproc visit, void *arg) {
    Py_VISIT(self->call);
    Py_VISIT(self->fn);
    Py_VISIT(self->python);
    Py_VISIT(self->finish);
    Py_VISIT(self->fail);
    Py_VISIT(self->dict);
    Py_VISIT(self->failed);
    Py_VISIT(self->returned);
    return 0;
}

static int Recorded_clear(Recorded *self) {
    Py_CLEAR(self->call);
    Py_CLEAR(self->fn);
    Py_CLEAR(self->python);
    Py_CLEAR(self->finish);
    Py_CLEAR(self->fail);
    Py_CLEAR(self->dict);
    Py_CLEAR(self->is_p2p);
    Py_CLEAR(self->failed);
    Py_CLEAR(self->returned);
    return 0;
}

static void Recorded_dealloc(Recorded *self) {
    PyObject_GC_UnTrack(self);
    Recorded_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* like a function: bound when looked up on an instance */
static PyObject *Recorded_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyObject *Recorded_repr(Recorded *self) {
    return self->fn == NULL ? PyUnicode_FromString("<Recorded (not initialised)>")
                            : PyUnicode_FromFormat("<%R, recorded by nccl-doctor>", self->fn);
}

/* pickled by reference, like the function it replaces: its __qualname__ in its __module__ */
static PyObject *Recorded_reduce(Recorded *self, PyObject *unused) {
    return PyObject_GetAttrString((PyObject *)self, "__qualname__");
}

static PyMethodDef Recorded_methods[] = {
    {"__reduce__", (PyCFunction)Recorded_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Recorded_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RecordedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "nccl_doctor.capture._ring.Recorded",
    .tp_basicsize = sizeof(Recorded),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A torch.distributed function, recorded by the C fast path (see Call).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recorded_init,
    .tp_traverse = (traverseproc)Recorded_traverse,
    .tp_clear = (inquiry)Recorded_clear,
    .tp_dealloc = (destructor)Recorded_dealloc,
    .tp_call = (ternaryfunc)Recorded_call,
    .tp_vectorcall_offset = offsetof(Recorded, vectorcall),
    .tp_descr_get = Recorded_get,
    .tp_repr = (reprfunc)Recorded_repr,
    .tp_dictoffset = offsetof(Recorded, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_methods = Recorded_methods,
    .tp_getset = Recorded_getset,
};

/* ---- the C API: the functional collectives' C++ kernel ---------------------------------------
 *
 * nccl_doctor/rank/recorder/_functional_kernel.cpp records the torch.ops._c10d_functional
 * operators at the dispatcher, in C++: it makes the call itself (the dispatcher's redispatch)
 * between a Recorded's enter and leave, taken from this table (the capsule ``_C_API``), and writes
 * a WAIT record for a recorded call's wait_tensor. Its callers hold the GIL. An Entered is kept
 * by the caller as opaque storage of ``entered_size`` bytes. The C++ side declares the same table
 * and checks ``version`` and ``size`` before it uses it: change both sides together.
 */
#define RING_API_VERSION 1

typedef struct {
    unsigned int version;
    size_t size;         /* sizeof(RingAPI) */
    size_t entered_size; /* sizeof(Entered) */
    /* 1: the recorded function's records go to a C ring now (else nothing is recorded) */
    int (*live)(PyObject *recorded);
    /* Recorded's enter with positional ``args``: 1 entered (``entered`` filled), 0 declined (no
     * error set: the Python path decides), -1 an error to raise (KeyboardInterrupt and the like).
     * ``site``: NULL (the frames are walked, as for any call), or the callsite fields 10..15 of
     * an earlier record of this Recorded made from the same frames, in this ``epoch`` (the
     * fields depend on nothing else: the caller checks the frames, code objects and offsets,
     * from the current one out to the user's, as Call's own memo does for one frame) */
    int (*enter)(PyObject *recorded, PyObject *const *args, Py_ssize_t nargs,
                 const uint64_t *site, void *entered);
    uint64_t (*index)(const void *entered); /* the record entered */
    uint64_t (*epoch)(PyObject *recorded);    /* its Recording's epoch */
    PyObject *(*positions)(PyObject *recorded); /* its Describer.positions (borrowed) */
    PyObject *(*paths)(PyObject *recorded);     /* its Describer.paths (borrowed) */
    /* the ENTER fields of record ``idx`` of its ring (bits[0] the index): 0, or -1 (lapped) */
    int (*fields)(PyObject *recorded, uint64_t idx, uint64_t *bits);
    /* Recorded's leave after the call returned (failed 0) or raised (failed 1), with the
     * recorder's ``finish`` where needed; releases ``entered``. 0, or -1 with an error to raise
     * (an Exception of the recorder's own disables it instead, as in Recorded) */
    int (*leave)(PyObject *recorded, void *entered, int failed);
    /* The WAIT record of ``recording`` for the recorded call ``parent`` (Recorder.wait_for's):
     * 1 entered, 0 declined (the Python path decides); ``functional``: EventFlag.FUNCTIONAL,
     * ``kinds``: the bits (1 << kind) of the kinds a wait completes, ``wait_kind``: WAIT. */
    int (*wait_enter)(PyObject *recording, uint64_t parent, unsigned int op,
                      unsigned int functional, unsigned int kinds, unsigned int wait_kind,
                      void *entered);
    void (*wait_leave)(void *entered, int state); /* its exit (Recorder.finish's); releases it */
} RingAPI;

static int api_live(PyObject *obj) {
    if (Py_TYPE(obj) != &RecordedType || ((Recorded *)obj)->call == NULL)
        return 0;
    return Py_TYPE(((Recorded *)obj)->call->rec->ring) == &RingType;
}

static int api_enter(PyObject *obj, PyObject *const *args, Py_ssize_t nargs,
                     const uint64_t *site, void *entered) {
    if (!api_live(obj)) {
        memset(entered, 0, sizeof(Entered));
        return 0;
    }
    Args a = {args, nargs, NULL};
    return enter_call(((Recorded *)obj)->call, &a, (Entered *)entered, site);
}

static uint64_t api_epoch(PyObject *obj) {
    if (Py_TYPE(obj) != &RecordedType || ((Recorded *)obj)->call == NULL)
        return 0;
    return ((Recorded *)obj)->call->rec->epoch;
}

static PyObject *api_positions(PyObject *obj) {
    if (Py_TYPE(obj) != &RecordedType || ((Recorded *)obj)->call == NULL)
        return Py_None;
    return ((Recorded *)obj)->call->rec->positions;
}

static PyObject *api_paths(PyObject *obj) {
    if (Py_TYPE(obj) != &RecordedType || ((Recorded *)obj)->call == NULL)
        return Py_None;
    return ((Recorded *)obj)->call->rec->paths;
}

static int ring_fields(Ring *self, uint64_t idx, uint64_t *bits);

static int api_fields(PyObject *obj, uint64_t idx, uint64_t *bits) {
    if (!api_live(obj))
        return -1;
    return ring_fields((Ring *)((Recorded *)obj)->call->rec->ring, idx, bits);
}

static uint64_t api_index(const void *entered) {
    PyObject *idx = ((const Entered *)entered)->idx;
    if (idx == NULL)
        return 0;
    uint64_t v = PyLong_AsUnsignedLongLong(idx);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return v;
}

/* Recorded_vectorcall's part after ``fn``, for a result the caller keeps (None to finish) */
static int api_leave(PyObject *obj, void *entered, int failed) {
    Recorded *self = (Recorded *)obj;
    Entered *e = (Entered *)entered;
    int r = 0;
    if (failed) {
        PyObject *out = call_finish(self, e, self->failed, Py_None);
        Py_XDECREF(out);
        PyErr_Clear(); /* finish() keeps its own errors; this could only be out of memory */
    } else if (!leave_impl(self->call, e->idx, e->stack, e->flags, e->ring, Py_None)) {
        PyObject *out = call_finish(self, e, self->returned, Py_None);
        if (out != NULL) {
            Py_DECREF(out);
        } else if (PyErr_ExceptionMatches(PyExc_Exception)) { /* the recorder's: disable it */
            recorder_failed(self);
        } else {
            r = -1;
        }
    }
    entered_clear(e);
    return r;
}

/* The enter part of record ``idx`` as field bits (bits[0] the index), or -1 once lapped */
static int ring_fields(Ring *self, uint64_t idx, uint64_t *bits) {
    if (idx < 1 || idx > self->count || self->count - idx >= self->capacity)
        return -1;
    uint64_t back = self->count - idx;
    uint64_t slot = self->slot >= back ? self->slot - back : self->slot + self->capacity - back;
    const unsigned char *rec = self->ring + slot * RECORD_SIZE;
    for (int i = 0; i < 6; i++) {
        uint64_t v;
        memcpy(&v, rec + 8 * i, 8);
        bits[i] = v;
    }
    for (int i = 6; i < 19; i++) {
        uint32_t v;
        memcpy(&v, rec + 48 + 4 * (i - 6), 4);
        bits[i] = v; /* a signed field's bits: stored back as they are */
    }
    uint16_t pad;
    memcpy(&pad, rec + 102, 2);
    bits[19] = rec[100], bits[20] = rec[101], bits[21] = pad;
    return 0;
}

static int api_wait_enter(PyObject *obj, uint64_t parent, unsigned int op, unsigned int functional,
                          unsigned int kinds, unsigned int wait_kind, void *entered) {
    Entered *out = (Entered *)entered;
    memset(out, 0, sizeof *out);
    if (Py_TYPE(obj) != &RecordingType)
        return 0;
    Recording *rec = (Recording *)obj;
    if (Py_TYPE(rec->ring) != &RingType || !PyDict_CheckExact(rec->stacks))
        return 0;
    Ring *ring = (Ring *)rec->ring;
    uint64_t f[N_ENTER_ARGS + 1];
    /* Recorder.wait_for: the parent must be a functional collective's record */
    if (ring_fields(ring, parent, f) < 0 || !(f[20] & functional) || f[19] >= 32 ||
        !((kinds >> f[19]) & 1))
        return 0;
    unsigned long tid = PyThread_get_thread_ident();
    PyObject *tid_obj = PyLong_FromUnsignedLong(tid);
    if (tid_obj == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *stack = PyDict_GetItemWithError(rec->stacks, tid_obj); /* borrowed */
    if (stack == NULL && !PyErr_Occurred()) {
        stack = PyList_New(0);
        if (stack != NULL && PyDict_SetItem(rec->stacks, tid_obj, stack) < 0)
            Py_CLEAR(stack);
        Py_XDECREF(stack); /* the dict holds it */
    }
    Py_DECREF(tid_obj);
    if (stack == NULL || !PyList_CheckExact(stack)) {
        PyErr_Clear();
        return 0;
    }
    /* Recorder._wait: the collective's group, sequence number, tensors, callsite and path */
    uint64_t bits[N_ENTER_ARGS + 1];
    memcpy(bits, f, sizeof bits);
    bits[1] = parent, bits[2] = 0, bits[5] = (uint64_t)tid, bits[6] = op;
    bits[19] = wait_kind, bits[20] = f[20] & functional, bits[21] = 0;
    PyObject *idx_obj = PyLong_FromUnsignedLongLong(ring->count + 1);
    if (idx_obj == NULL) {
        PyErr_Clear();
        return 0;
    }
    ring_commit(ring, bits);
    if (stack_push(stack, idx_obj) < 0)
        PyErr_Clear();
    out->idx = idx_obj;
    out->grec = Py_NewRef(Py_None);
    out->stack = Py_NewRef(stack);
    out->ring = Py_NewRef((PyObject *)ring);
    out->seq = -1;
    return 1;
}

static void api_wait_leave(void *entered, int state) {
    Entered *e = (Entered *)entered;
    if (e->idx != NULL && e->ring != NULL) {
        uint64_t idx = api_index(e);
        pop_own(e->stack, e->idx, idx); /* Recorder.finish: its own, when it is on top */
        ring_finish((Ring *)e->ring, idx, state, 1, 0);
    }
    entered_clear(e);
}

static RingAPI ring_api = {
    RING_API_VERSION, sizeof(RingAPI), sizeof(Entered), api_live, api_enter, api_index,
    api_epoch, api_positions, api_paths, api_fields, api_leave, api_wait_enter, api_wait_leave,
};

static struct PyModuleDef ringmodule = {
    PyModuleDef_HEAD_INIT, "_ring", "The capture ring's hot path in C.", -1, NULL,
};

static int add_type(PyObject *m, const char *name, PyTypeObject *type) {
    Py_INCREF(type);
    if (PyModule_AddObject(m, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static int add_reading(PyObject *m); /* the reading functions: the end of the file */

PyMODINIT_FUNC PyInit__ring(void) {
    adler32_init();
    if (PyType_Ready(&RingType) < 0 || PyType_Ready(&RecordingType) < 0 ||
        PyType_Ready(&CallType) < 0 || PyType_Ready(&RecordedType) < 0)
        return NULL;
    struct { PyObject **slot; const char *text; } names[] = {
        {&str_seq, "seq"}, {&str_name_id, "name_id"}, {&str_size, "size"},
        {&str_ranks, "ranks"}, {&str_p2p_bumps, "p2p_bumps"}, {&str_shape, "shape"},
        {&str_dtype, "dtype"}, {&str_empty_list, "[]"}, {&str_object, "object"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (*names[i].slot == NULL &&
            (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&ringmodule);
    if (m == NULL)
        return NULL;
    if (add_reading(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "ADLER32", ADLER32_KIND) < 0) { /* which one was built */
        Py_DECREF(m);
        return NULL;
    }
    if (add_type(m, "Ring", &RingType) < 0 || add_type(m, "Recording", &RecordingType) < 0 ||
        add_type(m, "Call", &CallType) < 0 || add_type(m, "Recorded", &RecordedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    PyObject *capsule = PyCapsule_New(&ring_api, "nccl_doctor.capture._ring._C_API", NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* ---- reading: records checked and split into columns in one pass (capture/records.py) ------
 *
 * check_records(rows, slots, capacity, kinds, states, out) gives, for each 128-byte record of
 * ``rows`` (read from ring slot ``slots[i]``), the verdict of records.py's numpy fallback in
 * ``out[i]``: 0 a blank slot (never written), 1 a damaged record (its Adler-32 fails, its index
 * does not belong in its slot, or its kind is not one of ``kinds``), 2 a trusted record whose
 * exit part is blank (the call is still inside), 3 one with a valid exit part (``t_exit`` set,
 * the check word binds it to the record, its state one of ``states``), 4 one whose exit part is
 * damaged. ``kinds``: 256 bytes, non-zero at each known kind; ``states``: the exit states as
 * little-endian u16. The codes are records.py's (BLANK ... CUT_EXIT): change both together; the
 * tests compare the two on damaged records.
 *
 * read_ring(fd, offset, first, count, capacity, kinds, states, fields, outs, exited, slots,
 * verdicts) reads ``count`` slots from ``first`` on at file offset ``offset`` (pread, a few at a
 * time into a small buffer), gives each its verdict in ``verdicts`` (a slot past the end of the
 * file reads blank) and splits every trusted record into columns: field k (``fields``: its byte
 * offset and size, 1, 2, 4 or 8, two bytes a field) into ``outs[k]``, whether its exit part is
 * valid into ``exited`` (one byte) and its slot into ``slots`` (int64), in slot order. The slots
 * are read into the function's own buffer: what is checked is what is split, whatever a rank
 * still writing does to its file meanwhile. -> (slots read, records kept). Neither function holds
 * the GIL while it reads records: captures read on several threads are checked in parallel.
 */
#include <errno.h>
#include <unistd.h>

#define READ_CHUNK 512 /* records a pread: 64 KiB */
#define MAX_FIELDS 32

static uint32_t read_exit_check(uint64_t idx, uint64_t t_exit, int16_t delta, uint16_t state) {
    /* format.exit_check: the low 32 bits of the same expression */
    return (uint32_t)((idx * 0x9E3779B1ull) ^ t_exit ^ ((uint64_t)state << 20) ^ (uint16_t)delta);
}

typedef struct {
    uint64_t capacity;
    const unsigned char *known; /* 256 bytes */
    const unsigned char *states; /* little-endian u16 */
    Py_ssize_t n_states;
} Checks;

static unsigned char verdict_of(const unsigned char *r, uint64_t slot, const Checks *c) {
    uint64_t words[RECORD_SIZE / 8];
    memcpy(words, r, RECORD_SIZE);
    uint64_t any = 0;
    for (int k = 0; k < RECORD_SIZE / 8; k++)
        any |= words[k];
    if (!any)
        return 0;
    uint64_t idx = words[0];
    uint32_t check;
    memcpy(&check, r + ENTER_SIZE, 4);
    if (idx < 1 || (idx - 1) % c->capacity != slot || !c->known[r[100]] ||
        adler32_enter(r) != check)
        return 1;
    uint64_t t_exit;
    int16_t delta;
    uint16_t state;
    uint32_t word;
    memcpy(&t_exit, r + EXIT_OFFSET, 8);
    memcpy(&delta, r + EXIT_OFFSET + 8, 2);
    memcpy(&state, r + EXIT_OFFSET + 10, 2);
    memcpy(&word, r + EXIT_OFFSET + 12, 4);
    int exit_state = 0;
    for (Py_ssize_t k = 0; k < c->n_states; k++)
        exit_state |= state == (uint16_t)(c->states[2 * k] | c->states[2 * k + 1] << 8);
    if (t_exit != 0 && exit_state && read_exit_check(idx, t_exit, delta, state) == word)
        return 3;
    return (t_exit != 0 || word != 0) ? 4 : 2;
}

static int checks_of(Checks *c, unsigned long long capacity, Py_buffer *kinds, Py_buffer *states) {
    if (kinds->len != 256 || states->len % 2 != 0 || capacity == 0) {
        PyErr_SetString(PyExc_ValueError, "the checks need 256 kinds, u16 states, a capacity");
        return -1;
    }
    c->capacity = capacity;
    c->known = kinds->buf;
    c->states = states->buf;
    c->n_states = states->len / 2;
    return 0;
}

static PyObject *check_records(PyObject *module, PyObject *args) {
    Py_buffer rows, slots, kinds, states, out;
    unsigned long long capacity;
    Checks c;
    if (!PyArg_ParseTuple(args, "y*y*Ky*y*w*", &rows, &slots, &capacity, &kinds, &states, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = out.len;
    if (checks_of(&c, capacity, &kinds, &states) < 0)
        goto done;
    if (rows.len != n * RECORD_SIZE || slots.len != n * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "check_records: rows, slots and out disagree");
        goto done;
    }
    const unsigned char *base = rows.buf;
    const int64_t *at = slots.buf;
    unsigned char *verdict = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        verdict[i] = verdict_of(base + i * RECORD_SIZE, (uint64_t)at[i], &c);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&states);
    PyBuffer_Release(&out);
    return result;
}

static PyObject *read_ring(PyObject *module, PyObject *args) {
    int fd;
    long long offset, first, count;
    unsigned long long capacity;
    Py_buffer kinds, states, fields, exited, slots, verdicts;
    PyObject *outs;
    Py_buffer out[MAX_FIELDS];
    Py_ssize_t n_out = 0;
    Checks c;
    if (!PyArg_ParseTuple(args, "iLLLKy*y*y*O!w*w*w*", &fd, &offset, &first, &count, &capacity,
                          &kinds, &states, &fields, &PyTuple_Type, &outs, &exited, &slots,
                          &verdicts))
        return NULL;
    PyObject *result = NULL;
    unsigned char *chunk = NULL;
    Py_ssize_t want = PyTuple_GET_SIZE(outs);
    if (checks_of(&c, capacity, &kinds, &states) < 0)
        goto done;
    if (count < 0 || offset < 0 || first < 0 || want > MAX_FIELDS || fields.len != 2 * want ||
        exited.len < count || slots.len < count * (Py_ssize_t)sizeof(int64_t) ||
        verdicts.len < count) {
        PyErr_SetString(PyExc_ValueError, "read_ring: the outputs do not fit the slots");
        goto done;
    }
    const unsigned char *spec = fields.buf;
    for (; n_out < want; n_out++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(outs, n_out), &out[n_out], PyBUF_WRITABLE) < 0)
            goto done;
        unsigned size = spec[2 * n_out + 1];
        if ((size != 1 && size != 2 && size != 4 && size != 8) ||
            spec[2 * n_out] + size > RECORD_SIZE || out[n_out].len < count * (Py_ssize_t)size) {
            n_out++;
            PyErr_SetString(PyExc_ValueError, "read_ring: a field does not fit");
            goto done;
        }
    }
    chunk = PyMem_RawMalloc(READ_CHUNK * RECORD_SIZE);
    if (chunk == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    unsigned char *ok = exited.buf, *verdict = verdicts.buf;
    int64_t *at = slots.buf;
    int rows[READ_CHUNK]; /* the chunk's trusted records */
    long long done_slots = 0, kept = 0, got_slots = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done_slots < count) {
        long long n = count - done_slots < READ_CHUNK ? count - done_slots : READ_CHUNK;
        size_t bytes = (size_t)n * RECORD_SIZE, got = 0;
        while (got < bytes) { /* a short read: the end of the file (or a signal) */
            ssize_t r = pread(fd, chunk + got, bytes - got,
                              (off_t)(offset + done_slots * RECORD_SIZE + (long long)got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) {
                err = errno;
                break;
            }
            if (r == 0)
                break;
            got += (size_t)r;
        }
        if (err)
            break;
        got -= got % RECORD_SIZE; /* a record cut by the end of the file is not read */
        got_slots += (long long)(got / RECORD_SIZE);
        memset(chunk + got, 0, bytes - got); /* past the end: blank, as the Python reader */
        long long kept_before = kept;
        for (long long i = 0; i < n; i++) {
            uint64_t slot = (uint64_t)(first + done_slots + i);
            unsigned char v = verdict_of(chunk + i * RECORD_SIZE, slot, &c);
            verdict[done_slots + i] = v;
            if (v < 2)
                continue;
            rows[kept - kept_before] = (int)i;
            ok[kept] = v == 3;
            at[kept] = (int64_t)slot;
            kept++;
        }
        /* each field of the chunk's trusted records: a loop of fixed-size copies */
        long long m = kept - kept_before;
        for (Py_ssize_t k = 0; k < n_out; k++) {
            unsigned char *to = (unsigned char *)out[k].buf;
            const unsigned char *from = chunk + spec[2 * k];
            switch (spec[2 * k + 1]) {
            case 1:
                for (long long j = 0; j < m; j++)
                    to[kept_before + j] = from[rows[j] * RECORD_SIZE];
                break;
            case 2:
                for (long long j = 0; j < m; j++)
                    memcpy(to + (kept_before + j) * 2, from + rows[j] * RECORD_SIZE, 2);
                break;
            case 4:
                for (long long j = 0; j < m; j++)
                    memcpy(to + (kept_before + j) * 4, from + rows[j] * RECORD_SIZE, 4);
                break;
            default:
                for (long long j = 0; j < m; j++)
                    memcpy(to + (kept_before + j) * 8, from + rows[j] * RECORD_SIZE, 8);
                break;
            }
        }
        done_slots += n;
        if (got < bytes)
            break; /* the rest of the slots are past the end of the file */
    }
    for (long long i = done_slots; i < count && !err; i++)
        verdict[i] = 0;
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = Py_BuildValue("LL", got_slots, kept);
done:
    PyMem_RawFree(chunk);
    for (Py_ssize_t k = 0; k < n_out; k++)
        PyBuffer_Release(&out[k]);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&states);
    PyBuffer_Release(&fields);
    PyBuffer_Release(&exited);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&verdicts);
    return result;
}

/* distinct_rows(cols, inverse, first) -> count: the distinct tuples of the rows of ``cols``
 * (a tuple of equally long buffers of u64), numbered in the order the rows first show them:
 * ``inverse[i]`` (int64) the number of row i's tuple, ``first[j]`` (int64) the first row of
 * tuple j. A hash table of the tuples, every candidate compared value by value: exact. (The
 * calls table's text is looked up once per distinct tuple of a rank's string ids and places:
 * data/columns.py.) */
#define MAX_COLS 16

static PyObject *distinct_rows(PyObject *module, PyObject *args) {
    PyObject *cols;
    Py_buffer inv, fst;
    if (!PyArg_ParseTuple(args, "O!w*w*", &PyTuple_Type, &cols, &inv, &fst))
        return NULL;
    Py_buffer col[MAX_COLS];
    Py_ssize_t k = 0, want = PyTuple_GET_SIZE(cols), n = inv.len / (Py_ssize_t)sizeof(int64_t);
    PyObject *result = NULL;
    int64_t *table = NULL;
    if (want < 1 || want > MAX_COLS || fst.len < inv.len) {
        PyErr_SetString(PyExc_ValueError, "distinct_rows: 1 to 16 columns, and room for them");
        goto done;
    }
    for (; k < want; k++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(cols, k), &col[k], PyBUF_SIMPLE) < 0)
            goto done;
        if (col[k].len != n * (Py_ssize_t)sizeof(uint64_t)) {
            k++;
            PyErr_SetString(PyExc_ValueError, "distinct_rows: the columns differ in length");
            goto done;
        }
    }
    size_t size = 16;
    while (size < 2 * (size_t)n)
        size <<= 1;
    table = PyMem_RawMalloc(size * sizeof(int64_t));
    if (table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint64_t *v[MAX_COLS];
    for (Py_ssize_t c = 0; c < k; c++)
        v[c] = col[c].buf;
    int64_t *inverse = inv.buf, *first = fst.buf, count = 0;
    Py_BEGIN_ALLOW_THREADS
    memset(table, 0xFF, size * sizeof(int64_t)); /* -1: empty */
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t h = 0x9E3779B97F4A7C15ull;
        for (Py_ssize_t c = 0; c < k; c++) { /* splitmix64's finaliser over each value */
            uint64_t z = (h ^ v[c][i]) * 0xBF58476D1CE4E5B9ull;
            h = z ^ (z >> 31);
        }
        size_t at = (size_t)(h ^ (h >> 29)) & (size - 1);
        for (;;) {
            int64_t j = table[at];
            if (j < 0) {
                table[at] = count;
                first[count] = i;
                inverse[i] = count++;
                break;
            }
            Py_ssize_t r = (Py_ssize_t)first[j], c = 0;
            while (c < k && v[c][r] == v[c][i])
                c++;
            if (c == k) {
                inverse[i] = j;
                break;
            }
            at = (at + 1) & (size - 1);
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromLongLong(count);
done:
    PyMem_RawFree(table);
    for (Py_ssize_t c = 0; c < k; c++)
        PyBuffer_Release(&col[c]);
    PyBuffer_Release(&inv);
    PyBuffer_Release(&fst);
    return result;
}

static PyMethodDef reading_methods[] = {
    {"distinct_rows", distinct_rows, METH_VARARGS,
     "distinct_rows(cols, inverse, first) -> count: the distinct tuples of the rows of u64 "
     "columns, numbered in the order the rows first show them"},
    {"check_records", check_records, METH_VARARGS,
     "check_records(rows, slots, capacity, kinds, states, out): each record's verdict (see "
     "capture/records.py check)"},
    {"read_ring", read_ring, METH_VARARGS,
     "read_ring(fd, offset, first, count, capacity, kinds, states, fields, outs, exited, slots, "
     "verdicts) -> (slots read, records kept): slots read, checked and split into columns (see "
     "capture/records.py read_ring)"},
    {NULL, NULL, 0, NULL},
};

static int add_reading(PyObject *m) {
    return PyModule_AddFunctions(m, reading_methods);
}
