/*
 * Records from columns: the producer's bulk path (TopicWriter.append_batch).
 *
 * Encodes n records given as Arrow-style columns (offsets into one data buffer, and a
 * validity byte per row) into the msgpack records of ledger/record.py, back to back, with
 * each record's offset, size, 128-bit XXH3 key hash and flags: the footer columns of
 * ledger/writer.py's encode_entry, byte for byte the same, without a Python object per
 * record.  Hashing is xxHash's own XXH3-128 (ledger/vendor/xxhash.h, the same function the
 * xxhash package computes), so footers written here and by encode_entry agree.
 *
 * Arguments are plain buffers (no NumPy C API).  Everything runs without the interpreter
 * lock; ledger/encoder.py wraps it and falls back to encode_entry when it was not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "vendor/xxhash.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the encoder assumes a little-endian CPU (ledger/encoder.py falls back to Python elsewhere)"
#endif

#define FLAG_HAS_KEY 0x01
#define FLAG_TOMBSTONE 0x02

/* One variable-length column: row i is data[off[i]:off[i+1]], absent where valid[i] == 0. */
typedef struct {
    const int64_t *off;
    const uint8_t *data;
    const uint8_t *valid; /* NULL: every row present */
    Py_ssize_t data_len;
} varcol_t;

typedef struct {
    Py_ssize_t n;
    varcol_t key, value;
    const int64_t *map_off;   /* NULL: no properties */
    const uint8_t *map_valid;
    varcol_t pkey, pvalue;    /* the maps' entries, all rows' back to back */
    Py_ssize_t n_pairs;
    const int64_t *event;     /* NULL: no event times */
    const uint8_t *event_valid;
    int64_t publish;
} job_t;

static inline int present(const varcol_t *c, Py_ssize_t i) { return c->valid == NULL || c->valid[i]; }

static inline int64_t vlen(const varcol_t *c, Py_ssize_t i) { return c->off[i + 1] - c->off[i]; }

/* msgpack sizes, as msgpack-python's Packer chooses them (smallest form). */
static inline int64_t bin_size(int64_t n) { return n + (n < 256 ? 2 : n < 65536 ? 3 : 5); }

static inline int64_t str_size(int64_t n) { return n + (n < 32 ? 1 : n < 256 ? 2 : n < 65536 ? 3 : 5); }

static inline int64_t int_size(int64_t v) {
    if (v >= 0) return v < 128 ? 1 : v < 256 ? 2 : v < 65536 ? 3 : v <= 0xFFFFFFFFLL ? 5 : 9;
    return v >= -32 ? 1 : v >= -128 ? 2 : v >= -32768 ? 3 : v >= -2147483648LL ? 5 : 9;
}

static inline uint8_t *put_be(uint8_t *p, uint64_t v, int width) {
    for (int k = width - 1; k >= 0; k--) *p++ = (uint8_t)(v >> (8 * k));
    return p;
}

static inline uint8_t *put_bin(uint8_t *p, const uint8_t *s, int64_t n) {
    if (n < 256) { *p++ = 0xc4; p = put_be(p, (uint64_t)n, 1); }
    else if (n < 65536) { *p++ = 0xc5; p = put_be(p, (uint64_t)n, 2); }
    else { *p++ = 0xc6; p = put_be(p, (uint64_t)n, 4); }
    if (n) memcpy(p, s, (size_t)n);
    return p + n;
}

static inline uint8_t *put_str(uint8_t *p, const uint8_t *s, int64_t n) {
    if (n < 32) *p++ = (uint8_t)(0xa0 | n);
    else if (n < 256) { *p++ = 0xd9; p = put_be(p, (uint64_t)n, 1); }
    else if (n < 65536) { *p++ = 0xda; p = put_be(p, (uint64_t)n, 2); }
    else { *p++ = 0xdb; p = put_be(p, (uint64_t)n, 4); }
    if (n) memcpy(p, s, (size_t)n);
    return p + n;
}

static inline uint8_t *put_int(uint8_t *p, int64_t v) {
    if (v >= 0) {
        if (v < 128) { *p++ = (uint8_t)v; return p; }
        if (v < 256) { *p++ = 0xcc; return put_be(p, (uint64_t)v, 1); }
        if (v < 65536) { *p++ = 0xcd; return put_be(p, (uint64_t)v, 2); }
        if (v <= 0xFFFFFFFFLL) { *p++ = 0xce; return put_be(p, (uint64_t)v, 4); }
        *p++ = 0xcf;
        return put_be(p, (uint64_t)v, 8);
    }
    if (v >= -32) { *p++ = (uint8_t)v; return p; }
    if (v >= -128) { *p++ = 0xd0; return put_be(p, (uint64_t)v, 1); }
    if (v >= -32768) { *p++ = 0xd1; return put_be(p, (uint64_t)v, 2); }
    if (v >= -2147483648LL) { *p++ = 0xd2; return put_be(p, (uint64_t)v, 4); }
    *p++ = 0xd3;
    return put_be(p, (uint64_t)v, 8);
}

static inline int has_props(const job_t *j, Py_ssize_t i) {
    return j->map_off != NULL && (j->map_valid == NULL || j->map_valid[i]) && j->map_off[i + 1] > j->map_off[i];
}

/* Whether two property names of record i are equal (a map with the same name twice would
 * read back as either value).  Small maps compare every pair; big ones sort hashes. */
typedef struct {
    uint64_t h;
    int64_t q;
} name_hash_t;

static int cmp_name_hash(const void *a, const void *b) {
    uint64_t x = ((const name_hash_t *)a)->h, y = ((const name_hash_t *)b)->h;
    return (x > y) - (x < y);
}

static inline int same_name(const job_t *j, int64_t a, int64_t b) {
    int64_t n = vlen(&j->pkey, a);
    return n == vlen(&j->pkey, b) && (n == 0 || !memcmp(j->pkey.data + j->pkey.off[a], j->pkey.data + j->pkey.off[b],
                                                       (size_t)n));
}

/* 1: a name repeats; 0: none does; -1: out of memory. */
static int repeated_name(const job_t *j, Py_ssize_t i) {
    int64_t lo = j->map_off[i], hi = j->map_off[i + 1], pairs = hi - lo;
    if (pairs <= 32) {
        for (int64_t a = lo; a < hi; a++)
            for (int64_t b = a + 1; b < hi; b++)
                if (same_name(j, a, b)) return 1;
        return 0;
    }
    name_hash_t *t = malloc((size_t)pairs * sizeof(*t));
    if (t == NULL) return -1;
    for (int64_t q = lo; q < hi; q++) {
        t[q - lo].h = XXH3_64bits(j->pkey.data + j->pkey.off[q], (size_t)vlen(&j->pkey, q));
        t[q - lo].q = q;
    }
    qsort(t, (size_t)pairs, sizeof(*t), cmp_name_hash);
    int found = 0;
    for (int64_t a = 0; a < pairs && !found; a++)
        for (int64_t b = a + 1; b < pairs && t[b].h == t[a].h && !found; b++)
            found = same_name(j, t[a].q, t[b].q);
    free(t);
    return found;
}

static int64_t record_size(const job_t *j, Py_ssize_t i) {
    int64_t size = 1; /* fixarray of 5 */
    size += present(&j->key, i) ? bin_size(vlen(&j->key, i)) : 1;
    size += present(&j->value, i) ? bin_size(vlen(&j->value, i)) : 1;
    if (has_props(j, i)) {
        int64_t pairs = j->map_off[i + 1] - j->map_off[i];
        size += pairs < 16 ? 1 : pairs < 65536 ? 3 : 5;
        for (int64_t p = j->map_off[i]; p < j->map_off[i + 1]; p++)
            size += str_size(vlen(&j->pkey, p)) + str_size(vlen(&j->pvalue, p));
    } else {
        size += 1;
    }
    size += int_size(j->publish);
    size += (j->event != NULL && (j->event_valid == NULL || j->event_valid[i])) ? int_size(j->event[i]) : 1;
    return size;
}

static uint8_t *put_record(const job_t *j, Py_ssize_t i, uint8_t *p) {
    *p++ = 0x95;
    if (present(&j->key, i)) p = put_bin(p, j->key.data + j->key.off[i], vlen(&j->key, i));
    else *p++ = 0xc0;
    if (present(&j->value, i)) p = put_bin(p, j->value.data + j->value.off[i], vlen(&j->value, i));
    else *p++ = 0xc0;
    if (has_props(j, i)) {
        int64_t pairs = j->map_off[i + 1] - j->map_off[i];
        if (pairs < 16) *p++ = (uint8_t)(0x80 | pairs);
        else if (pairs < 65536) { *p++ = 0xde; p = put_be(p, (uint64_t)pairs, 2); }
        else { *p++ = 0xdf; p = put_be(p, (uint64_t)pairs, 4); }
        for (int64_t q = j->map_off[i]; q < j->map_off[i + 1]; q++) {
            p = put_str(p, j->pkey.data + j->pkey.off[q], vlen(&j->pkey, q));
            p = put_str(p, j->pvalue.data + j->pvalue.off[q], vlen(&j->pvalue, q));
        }
    } else {
        *p++ = 0xc0;
    }
    p = put_int(p, j->publish);
    if (j->event != NULL && (j->event_valid == NULL || j->event_valid[i])) p = put_int(p, j->event[i]);
    else *p++ = 0xc0;
    return p;
}

/* ---------------------------------------------------------------------- arguments */

typedef struct {
    Py_buffer views[14];
    int held[14];
} views_t;

static void release_all(views_t *v) {
    for (int k = 0; k < 14; k++)
        if (v->held[k]) PyBuffer_Release(&v->views[k]);
}

/* Buffer `slot` from `obj` (None allowed when `optional`): its start, or NULL for None. */
static int get_view(views_t *v, int slot, PyObject *obj, int optional, const char *what, Py_ssize_t want_bytes,
                    const void **out, Py_ssize_t *len) {
    *out = NULL;
    if (len) *len = 0;
    if (obj == Py_None) {
        if (optional) return 0;
        PyErr_Format(PyExc_TypeError, "%s is required", what);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &v->views[slot], PyBUF_C_CONTIGUOUS) < 0) return -1;
    v->held[slot] = 1;
    if (want_bytes >= 0 && v->views[slot].len != want_bytes) {
        PyErr_Format(PyExc_ValueError, "%s has %zd bytes, expected %zd", what, v->views[slot].len, want_bytes);
        return -1;
    }
    *out = v->views[slot].buf;
    if (len) *len = v->views[slot].len;
    return 0;
}

/* Offsets must start at 0 or more, never fall, and stay inside their data. */
static int check_offsets(const varcol_t *c, Py_ssize_t n, const char *what) {
    if (n < 0) return 0;
    if (c->off[0] < 0 || c->off[n] > c->data_len) {
        PyErr_Format(PyExc_ValueError, "%s offsets lie outside their data", what);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (c->off[i + 1] < c->off[i]) {
            PyErr_Format(PyExc_ValueError, "%s offsets fall at row %zd", what, i);
            return -1;
        }
    return 0;
}

static int get_varcol(views_t *v, int slot, PyObject *off, PyObject *data, PyObject *valid, Py_ssize_t n,
                      int with_valid, const char *what, varcol_t *c) {
    const void *p;
    if (get_view(v, slot, off, 0, what, (n + 1) * 8, &p, NULL) < 0) return -1;
    c->off = p;
    if (get_view(v, slot + 1, data, 0, what, -1, &p, &c->data_len) < 0) return -1;
    c->data = p;
    c->valid = NULL;
    if (with_valid) {
        if (get_view(v, slot + 2, valid, 1, what, n, &p, NULL) < 0) return -1;
        c->valid = p;
    }
    return check_offsets(c, n, what);
}

PyDoc_STRVAR(encode_records_doc,
"encode_records(n, key_off, key_data, key_valid, value_off, value_data, value_valid,\n"
"               map_off, map_valid, pkey_off, pkey_data, pvalue_off, pvalue_data,\n"
"               event, event_valid, publish, max_record)\n"
"--\n\n"
"Encode n records from columns (int64 offsets, data, uint8 validity or None; map_off\n"
"None for no properties; event int64 or None).  Returns (payload, offsets int64,\n"
"sizes uint32, hash_hi uint64, hash_lo uint64, flags uint8), or (why, i) for the first\n"
"record i refused: why 0 when it would exceed max_record bytes, 1 when a property name\n"
"repeats in it.");

static PyObject *py_encode_records(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_ssize_t n;
    PyObject *a[15];
    long long publish, max_record;
    if (!PyArg_ParseTuple(args, "nOOOOOOOOOOOOOOLL:encode_records", &n, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5],
                          &a[6], &a[7], &a[8], &a[9], &a[10], &a[11], &a[12], &a[13], &publish, &max_record))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        return NULL;
    }
    views_t v;
    memset(&v, 0, sizeof(v));
    job_t j;
    memset(&j, 0, sizeof(j));
    j.n = n;
    j.publish = publish;
    PyObject *result = NULL, *out[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    const void *p;
    if (get_varcol(&v, 0, a[0], a[1], a[2], n, 1, "key", &j.key) < 0) goto done;
    if (get_varcol(&v, 3, a[3], a[4], a[5], n, 1, "value", &j.value) < 0) goto done;
    if (get_view(&v, 6, a[6], 1, "properties", (n + 1) * 8, &p, NULL) < 0) goto done;
    j.map_off = p;
    if (j.map_off != NULL) {
        if (get_view(&v, 7, a[7], 1, "properties validity", n, &p, NULL) < 0) goto done;
        j.map_valid = p;
        Py_ssize_t len;
        if (get_view(&v, 8, a[8], 0, "property names", -1, &p, &len) < 0) goto done;
        j.n_pairs = len / 8 - 1;
        if (j.n_pairs < 0 || len % 8 || j.map_off[0] < 0 || j.map_off[n] > j.n_pairs) {
            PyErr_SetString(PyExc_ValueError, "properties offsets lie outside their entries");
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            if (j.map_off[i + 1] < j.map_off[i]) {
                PyErr_Format(PyExc_ValueError, "properties offsets fall at row %zd", i);
                goto done;
            }
        j.pkey.off = p;
        if (get_view(&v, 9, a[9], 0, "property names", -1, &p, &j.pkey.data_len) < 0) goto done;
        j.pkey.data = p;
        if (check_offsets(&j.pkey, j.n_pairs, "property names") < 0) goto done;
        if (get_varcol(&v, 10, a[10], a[11], Py_None, j.n_pairs, 0, "property values", &j.pvalue) < 0) goto done;
    }
    if (get_view(&v, 12, a[12], 1, "event times", n * 8, &p, NULL) < 0) goto done;
    j.event = p;
    if (get_view(&v, 13, a[13], 1, "event time validity", n, &p, NULL) < 0) goto done;
    j.event_valid = p;

    for (int k = 1; k < 6; k++) {
        static const Py_ssize_t width[6] = {0, 8, 4, 8, 8, 1};
        out[k] = PyByteArray_FromStringAndSize(NULL, n * width[k]);
        if (out[k] == NULL) goto done;
    }
    int64_t *offsets = (int64_t *)PyByteArray_AS_STRING(out[1]);
    uint32_t *sizes = (uint32_t *)PyByteArray_AS_STRING(out[2]);
    uint64_t *hi = (uint64_t *)PyByteArray_AS_STRING(out[3]), *lo = (uint64_t *)PyByteArray_AS_STRING(out[4]);
    uint8_t *flags = (uint8_t *)PyByteArray_AS_STRING(out[5]);
    int64_t total = 0;
    Py_ssize_t bad = -1;
    int why = 0; /* 0: too big, 1: a property name repeats, -1: out of memory */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t size = record_size(&j, i);
        if (size > max_record || size > (int64_t)UINT32_MAX) {
            bad = i;
            break;
        }
        if (has_props(&j, i) && (why = repeated_name(&j, i)) != 0) {
            bad = i;
            break;
        }
        offsets[i] = total;
        sizes[i] = (uint32_t)size;
        total += size;
    }
    Py_END_ALLOW_THREADS
    if (why < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (bad >= 0) {
        result = Py_BuildValue("(in)", why, bad);
        goto done;
    }
    out[0] = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out[0] == NULL) goto done;
    uint8_t *payload = (uint8_t *)PyByteArray_AS_STRING(out[0]);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        put_record(&j, i, payload + offsets[i]);
        uint8_t f = 0;
        if (present(&j.key, i)) {
            XXH128_hash_t h = XXH3_128bits(j.key.data + j.key.off[i], (size_t)vlen(&j.key, i));
            hi[i] = h.high64;
            lo[i] = h.low64;
            f |= FLAG_HAS_KEY;
        } else {
            hi[i] = lo[i] = 0;
        }
        if (!present(&j.value, i) || vlen(&j.value, i) == 0) f |= FLAG_TOMBSTONE;
        flags[i] = f;
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(6, out[0], out[1], out[2], out[3], out[4], out[5]);
done:
    for (int k = 0; k < 6; k++) Py_XDECREF(out[k]);
    release_all(&v);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_records", py_encode_records, METH_VARARGS, encode_records_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_encoder", "Records encoded from columns (see ledger/encoder.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__encoder(void) { return PyModule_Create(&module); }
