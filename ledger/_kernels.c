/*
 * Shale's hot loops in C: CRC32C over many ranges of one buffer, gathering many ranges
 * of one buffer into one, and "the latest record of every 128-bit key hash" (or under
 * event-time order the one with the greatest event time).
 *
 * Each of them is a loop NumPy can only express with a Python-level step per element
 * (a memoryview per frame, a slice per survivor) or with random gathers over the whole
 * input.  All three take and return plain buffers (no NumPy C API, so nothing but a C
 * compiler and Python's headers is needed to build them) and run without the
 * interpreter lock.  `ledger/kernels.py` wraps them and falls back to NumPy when this
 * module was not built; both give the same results, which the tests check.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#endif

/* Frame headers and the outputs are read and written as host-order integers. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the kernels assume a little-endian CPU (ledger/kernels.py falls back to NumPy elsewhere)"
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SHALE_X86_CRC 1
#include <nmmintrin.h>
#endif

/* An entry frame's header: payload length, CRC32C of the payload, record count (u32 each). */
#define FRAME_HEADER_BYTES 12

/* Footer columns are views of an object's bytes and need not be 8-byte aligned. */
static inline uint64_t ld64(const uint64_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t ld32(const uint32_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ------------------------------------------------------------------------------------ */
/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78)                                  */
/*
 * Why our own although the crc32c package is a dependency: check_frames and
 * crc32c_ranges checksum thousands of frames per call in one loop without the
 * interpreter lock, where the package takes one buffer per Python call (a memoryview and
 * a call per frame).  tests/test_kernels.py checks it against the package.
 */

#define POLY 0x82F63B78u
#define SHORT_BLOCK 256
#define LONG_BLOCK 8192

static uint32_t crc_table[8][256];  /* slice-by-8 software tables */
/* shift_*[k][b]: the register after running it through SHORT/LONG zero bytes, for the
 * register holding byte b in position k (the operation is linear, so four lookups give
 * the shift of any register). */
static uint32_t shift_short[4][256];
static uint32_t shift_long[4][256];
static int have_hw_crc = 0;

static uint32_t crc_sw(uint32_t reg, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        reg = crc_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= reg;
        reg = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
              crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) reg = crc_table[0][(reg ^ *p++) & 0xff] ^ (reg >> 8);
    return reg;
}

static uint32_t shift_reg(uint32_t t[4][256], uint32_t reg) {
    return t[0][reg & 0xff] ^ t[1][(reg >> 8) & 0xff] ^ t[2][(reg >> 16) & 0xff] ^ t[3][reg >> 24];
}

static void init_shift(uint32_t t[4][256], size_t zeros) {
    static const uint8_t zero[LONG_BLOCK];
    uint32_t basis[32];
    for (int b = 0; b < 32; b++) basis[b] = crc_sw(1u << b, zero, zeros);
    for (int k = 0; k < 4; k++)
        for (int v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1 << b)) r ^= basis[8 * k + b];
            t[k][v] = r;
        }
}

static void init_crc(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++) crc_table[k][n] = crc_table[0][crc_table[k - 1][n] & 0xff] ^ (crc_table[k - 1][n] >> 8);
    init_shift(shift_short, SHORT_BLOCK);
    init_shift(shift_long, LONG_BLOCK);
#ifdef SHALE_X86_CRC
    __builtin_cpu_init();
    have_hw_crc = __builtin_cpu_supports("sse4.2");
#endif
}

#ifdef SHALE_X86_CRC
/* Runs of three blocks of `block` bytes, each block a stream of its own; the streams'
 * registers are joined by shifting over the blocks that follow (`shift`: that shift for
 * `block` zero bytes).  Advances *p and *n past the runs done. */
__attribute__((target("sse4.2"))) static inline uint64_t crc_hw_streams(uint64_t c0, const uint8_t **p, size_t *n,
                                                                        size_t block, uint32_t shift[4][256]) {
    const uint8_t *q = *p;
    while (*n >= 3 * block) {
        uint64_t c1 = 0, c2 = 0, w0, w1, w2;
        const uint8_t *end = q + block;
        do {
            memcpy(&w0, q, 8);
            memcpy(&w1, q + block, 8);
            memcpy(&w2, q + 2 * block, 8);
            c0 = _mm_crc32_u64(c0, w0);
            c1 = _mm_crc32_u64(c1, w1);
            c2 = _mm_crc32_u64(c2, w2);
            q += 8;
        } while (q < end);
        c0 = shift_reg(shift, (uint32_t)c0) ^ (uint32_t)c1;
        c0 = shift_reg(shift, (uint32_t)c0) ^ (uint32_t)c2;
        q += 2 * block;
        *n -= 3 * block;
    }
    *p = q;
    return c0;
}

/* Three independent streams hide the instruction's latency (three cycles, one per cycle
 * issued); their registers are joined by shifting over the blocks that follow. */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t reg, const uint8_t *p, size_t n) {
    uint64_t c0 = reg;
    while (n && ((uintptr_t)p & 7)) {
        c0 = _mm_crc32_u8((uint32_t)c0, *p++);
        n--;
    }
    c0 = crc_hw_streams(c0, &p, &n, LONG_BLOCK, shift_long);
    c0 = crc_hw_streams(c0, &p, &n, SHORT_BLOCK, shift_short);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = _mm_crc32_u64(c0, w);
        p += 8;
        n -= 8;
    }
    while (n--) c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    return (uint32_t)c0;
}
#endif

static uint32_t crc32c(uint32_t value, const uint8_t *p, size_t n) {
    uint32_t reg = ~value;
#ifdef SHALE_X86_CRC
    if (have_hw_crc) return ~crc_hw(reg, p, n);
#endif
    return ~crc_sw(reg, p, n);
}

/* ------------------------------------------------------------------------------------ */
/* Buffer helpers                                                                        */

/* Whether a buffer holds 64-bit integers in native order: itemsize 8 and a struct format
 * of one integer code (signed 'q'/'l' or unsigned 'Q'/'L'), so that float64 or
 * big-endian arrays are refused rather than reinterpreted. */
static int is_int64(const Py_buffer *v, int want_signed) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    if (v->itemsize != 8 || f[0] == '\0' || f[1] != '\0') return 0;
    return want_signed ? (f[0] == 'q' || f[0] == 'l') : (f[0] == 'q' || f[0] == 'l' || f[0] == 'Q' || f[0] == 'L');
}

/* The 64-bit integers of a buffer, copied into fresh memory (read at any alignment):
 * the values checked are then the values used, whatever another thread does to the
 * caller's array while the interpreter lock is released.  NULL with an exception set
 * on error; free() the result. */
static int64_t *copy_int64(PyObject *obj, const char *what, int want_signed, Py_ssize_t *n) {
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    int64_t *out = NULL;
    if (!is_int64(&v, want_signed)) {
        PyErr_Format(PyExc_ValueError, "%s must be a buffer of %s 64-bit integers", what,
                     want_signed ? "signed" : "");
    } else if (!(out = malloc(v.len ? (size_t)v.len : 1))) {
        PyErr_NoMemory();
    } else {
        memcpy(out, v.buf, (size_t)v.len);
        *n = v.len / 8;
    }
    PyBuffer_Release(&v);
    return out;
}

typedef struct {
    int64_t *s, *e; /* private copies */
    Py_ssize_t n;
} ranges_t;

static void free_ranges(ranges_t *r) {
    free(r->s);
    free(r->e);
    r->s = r->e = NULL;
}

static int get_ranges(PyObject *starts_obj, PyObject *ends_obj, ranges_t *r) {
    Py_ssize_t ns = 0, ne = 0;
    r->s = r->e = NULL;
    if (!(r->s = copy_int64(starts_obj, "starts", 1, &ns)) || !(r->e = copy_int64(ends_obj, "ends", 1, &ne))) {
        free_ranges(r);
        return -1;
    }
    if (ns != ne) {
        PyErr_SetString(PyExc_ValueError, "starts and ends must have one length");
        free_ranges(r);
        return -1;
    }
    r->n = ns;
    return 0;
}

/* Every range must lie inside the buffer (a bad footer must raise, never read astray)
 * and their total must be representable. */
static int check_ranges(const ranges_t *r, Py_ssize_t size, int64_t *total) {
    int64_t sum = 0;
    for (Py_ssize_t i = 0; i < r->n; i++) {
        int64_t s = r->s[i], e = r->e[i];
        if (s < 0 || e < s || e > size) {
            PyErr_Format(PyExc_ValueError, "range %zd (%lld..%lld) lies outside the buffer of %zd bytes", i,
                         (long long)s, (long long)e, size);
            return -1;
        }
        if (e - s > INT64_MAX - sum) {
            PyErr_SetString(PyExc_ValueError, "the ranges add up to more bytes than can be held");
            return -1;
        }
        sum += e - s;
    }
    *total = sum;
    return 0;
}

PyDoc_STRVAR(crc32c_doc, "crc32c(data, value=0) -> int\n\nCRC32C of data, continuing from value.");

static PyObject *py_crc32c(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &value)) return NULL;
    uint32_t crc;
    if (data.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc32c(value, data.buf, (size_t)data.len);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc32c(value, data.buf, (size_t)data.len);
    }
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32c_ranges_doc,
             "crc32c_ranges(data, starts, ends) -> bytearray\n\n"
             "The CRC32C of data[starts[i]:ends[i]] for every i, as little-endian uint32 values.");

static PyObject *py_crc32c_ranges(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *data_obj, *starts_obj, *ends_obj;
    if (!PyArg_ParseTuple(args, "OOO", &data_obj, &starts_obj, &ends_obj)) return NULL;
    Py_buffer data;
    ranges_t r;
    int64_t total;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_ranges(starts_obj, ends_obj, &r) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *out = NULL;
    if (check_ranges(&r, data.len, &total) == 0 && (out = PyByteArray_FromStringAndSize(NULL, r.n * 4))) {
        uint8_t *crcs = (uint8_t *)PyByteArray_AS_STRING(out);
        const uint8_t *base = data.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < r.n; i++) {
            uint32_t c = crc32c(0, base + r.s[i], (size_t)(r.e[i] - r.s[i]));
            memcpy(crcs + 4 * i, &c, 4);
        }
        Py_END_ALLOW_THREADS
    }
    free_ranges(&r);
    PyBuffer_Release(&data);
    return out;
}

PyDoc_STRVAR(check_frames_doc,
             "check_frames(data, offsets, lengths, counts) -> int\n\n"
             "Check the frames at data[offsets[i]:offsets[i] + lengths[i]]: a 12-byte header of\n"
             "little-endian uint32 payload length, CRC32C of the payload and record count, then the\n"
             "payload.  Returns the index of the first frame whose header disagrees with lengths[i]\n"
             "or counts[i] or whose checksum does not match, or -1 when all are sound.");

static PyObject *py_check_frames(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *data_obj, *offs_obj, *lens_obj, *counts_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &data_obj, &offs_obj, &lens_obj, &counts_obj)) return NULL;
    Py_buffer data;
    ranges_t r; /* offsets and lengths for now; ends below */
    Py_ssize_t nc = 0;
    int64_t total, *counts = NULL;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_ranges(offs_obj, lens_obj, &r) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (!(counts = copy_int64(counts_obj, "counts", 1, &nc))) goto done;
    if (nc != r.n) {
        PyErr_SetString(PyExc_ValueError, "counts must be as long as offsets");
        goto done;
    }
    for (Py_ssize_t i = 0; i < r.n; i++) {
        int64_t o = r.s[i], l = r.e[i];
        if (l < FRAME_HEADER_BYTES || o < 0 || o > INT64_MAX - l) {
            PyErr_Format(PyExc_ValueError, "frame %zd (%lld bytes at %lld) cannot hold its header", i, (long long)l,
                         (long long)o);
            goto done;
        }
        r.e[i] = o + l;
    }
    if (check_ranges(&r, data.len, &total) == 0) {
        Py_ssize_t bad = -1;
        const uint8_t *base = data.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < r.n && bad < 0; i++) {
            uint32_t head[3];
            int64_t len = r.e[i] - r.s[i];
            memcpy(head, base + r.s[i], FRAME_HEADER_BYTES);
            if ((int64_t)head[0] != len - FRAME_HEADER_BYTES || (int64_t)head[2] != counts[i] ||
                crc32c(0, base + r.s[i] + FRAME_HEADER_BYTES, (size_t)(len - FRAME_HEADER_BYTES)) != head[1])
                bad = i;
        }
        Py_END_ALLOW_THREADS
        result = PyLong_FromSsize_t(bad);
    }
done:
    free(counts);
    free_ranges(&r);
    PyBuffer_Release(&data);
    return result;
}

static int is_uint32(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    return v->itemsize == 4 && f[0] != '\0' && f[1] == '\0' && (f[0] == 'I' || f[0] == 'L');
}

PyDoc_STRVAR(tiling_error_doc,
             "tiling_error(offsets, sizes, entry_starts, lengths) -> int\n\n"
             "Whether the records tile their entries' payloads: offsets and sizes (uint32, per\n"
             "record), entry_starts (int64, one more than there are entries: the first record of\n"
             "each) and lengths (uint32, each entry's frame with its 12-byte header).  0 when each\n"
             "entry's first record starts at 0, each next one where the one before it ends (no\n"
             "wrapping past 2**32) and the last one where the payload does; 1 when offsets do not\n"
             "follow sizes; 2 when they do but the sizes do not add up to some entry; 3 when\n"
             "entry_starts do not rise through the records.");

/* tiling_error's answers.  ledger/format.py turns them into messages by these values
 * (an index into _TILING_ERRORS) and the NumPy fallback in ledger/kernels.py returns the
 * same ones: keep them. */
enum {
    TILING_OK = 0,
    TILING_OFFSETS_DO_NOT_FOLLOW = 1, /* a record does not start where the one before it ends */
    TILING_SIZES_DO_NOT_ADD_UP = 2,   /* an entry's last record does not end where its payload does */
    TILING_BAD_ENTRY_STARTS = 3,      /* entry_starts do not rise through the records */
};

static PyObject *py_tiling_error(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    Py_buffer v[4];
    int got = 0;
    PyObject *result = NULL;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(objs[got], &v[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (!is_uint32(&v[0]) || !is_uint32(&v[1]) || !is_uint32(&v[3]) || !is_int64(&v[2], 1)) {
        PyErr_SetString(PyExc_ValueError, "offsets, sizes and lengths must be uint32 buffers, entry_starts int64");
        goto done;
    }
    Py_ssize_t n = v[0].len / 4, entries = v[3].len / 4;
    if (v[1].len / 4 != n || v[2].len / 8 != entries + 1) {
        PyErr_SetString(PyExc_ValueError, "sizes must be as long as offsets, entry_starts one longer than lengths");
        goto done;
    }
    const uint32_t *off = v[0].buf, *size = v[1].buf, *len = v[3].buf;
    const int64_t *starts = v[2].buf; /* int64 buffers: read through ld64 like the hashes */
    int follows_bad = 0, sums_bad = 0, index_bad = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t a = (int64_t)ld64((const uint64_t *)starts);
    for (Py_ssize_t j = 0; j < entries && !index_bad; j++) {
        int64_t b = (int64_t)ld64((const uint64_t *)(starts + j + 1)); /* read once: checked, then used */
        if (a < 0 || b <= a || b > n) {
            index_bad = 1;
            break;
        }
        uint32_t o = ld32(off + a), z = ld32(size + a);
        follows_bad |= o != 0;
        for (int64_t k = a + 1; k < b; k++) {
            uint32_t next = ld32(off + k);
            follows_bad |= next != (uint32_t)(o + z) || next < o;
            o = next;
            z = ld32(size + k);
        }
        sums_bad |= (int64_t)o + (int64_t)z != (int64_t)ld32(len + j) - FRAME_HEADER_BYTES;
        a = b;
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromLong(index_bad     ? TILING_BAD_ENTRY_STARTS
                             : follows_bad ? TILING_OFFSETS_DO_NOT_FOLLOW
                             : sums_bad    ? TILING_SIZES_DO_NOT_ADD_UP
                                           : TILING_OK);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

PyDoc_STRVAR(copy_plan_doc,
             "copy_plan(keep, entry_starts, sel, e_off, e_len, offsets, sizes)\n"
             "    -> (rec, in_entry, new_off, kept, whole, lengths, starts, ends)\n\n"
             "How pass two copies the kept records of entries sel (int64, rising) of one ledger:\n"
             "keep (1 byte per record of the ledger), entry_starts (int64, the first record of\n"
             "each entry, then the record count), e_off and e_len (int64 per entry of sel: where\n"
             "its frame lies in the buffer read, and its length), offsets and sizes (uint32 per\n"
             "record: where it lies in its entry's payload).  Returns buffers: the kept records\n"
             "(int64), each one's place in its entry (uint32) and its offset in its output\n"
             "frame's payload (uint32); per entry of sel the records kept (int64), whether all\n"
             "were (1 byte) and the output frame's length (int64); and the byte ranges (int64\n"
             "starts and ends) that make the output frames when joined: a whole frame, or the old\n"
             "header (to be rewritten) followed by one range per run of adjacent kept records.");

static int is_byte(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    return v->itemsize == 1 && (!strcmp(f, "?") || !strcmp(f, "B") || !strcmp(f, "b") || !strcmp(f, "c"));
}

/* copy_plan's arguments, in order, and its outputs, in order. */
enum { PLAN_KEEP, PLAN_STARTS, PLAN_SEL, PLAN_EOFF, PLAN_ELEN, PLAN_OFFS, PLAN_SIZES, PLAN_ARGS };
enum { OUT_REC, OUT_IN_ENTRY, OUT_NEW_OFF, OUT_KEPT, OUT_WHOLE, OUT_LENGTHS, OUT_STARTS, OUT_ENDS, PLAN_OUTPUTS };

/* Why copy_plan's first pass refused its input. */
enum {
    PLAN_OK = 0,
    PLAN_BAD_SEL = 1,         /* an entry of sel is not an entry of the ledger */
    PLAN_RECORDS_OUTSIDE = 2, /* entry_starts put an entry's records outside the ledger */
};

/* What copy_plan works on: the caller's buffers, not copies (each value is read once,
 * checked, then used, as in tiling_error). */
typedef struct {
    const uint8_t *keep;                          /* per record of the ledger */
    const uint64_t *starts, *sel, *e_off, *e_len; /* int64 values, at any alignment */
    const uint32_t *offs, *sizes;                 /* per record of the ledger */
    Py_ssize_t n_rec, n_entries, n;               /* records and entries of the ledger, entries of sel */
} plan_job_t;

/* Where copy_plan writes: its outputs' memory (see copy_plan_doc). */
typedef struct {
    int64_t *rec;
    uint32_t *in_entry, *new_off;
    int64_t *kept;
    uint8_t *whole;
    int64_t *lengths;
    int64_t *rs, *re; /* room for n + m ranges */
} plan_out_t;

/* The job for copy_plan's buffers, or -1 with an exception set. */
static int get_plan_job(const Py_buffer v[PLAN_ARGS], plan_job_t *j) {
    if (!is_byte(&v[PLAN_KEEP]) || !is_int64(&v[PLAN_STARTS], 1) || !is_int64(&v[PLAN_SEL], 1) ||
        !is_int64(&v[PLAN_EOFF], 1) || !is_int64(&v[PLAN_ELEN], 1) || !is_uint32(&v[PLAN_OFFS]) ||
        !is_uint32(&v[PLAN_SIZES])) {
        PyErr_SetString(PyExc_ValueError,
                        "keep must be a 1-byte buffer, offsets and sizes uint32, the others int64");
        return -1;
    }
    j->n_rec = v[PLAN_KEEP].len, j->n_entries = v[PLAN_STARTS].len / 8 - 1, j->n = v[PLAN_SEL].len / 8;
    if (v[PLAN_OFFS].len / 4 != j->n_rec || v[PLAN_SIZES].len / 4 != j->n_rec || j->n_entries < 0 ||
        v[PLAN_EOFF].len / 8 != j->n || v[PLAN_ELEN].len / 8 != j->n) {
        PyErr_SetString(PyExc_ValueError, "keep, offsets and sizes must have one length (the records), "
                                          "entry_starts one more than the entries, sel, e_off and e_len one length");
        return -1;
    }
    j->keep = v[PLAN_KEEP].buf;
    j->starts = v[PLAN_STARTS].buf, j->sel = v[PLAN_SEL].buf, j->e_off = v[PLAN_EOFF].buf, j->e_len = v[PLAN_ELEN].buf;
    j->offs = v[PLAN_OFFS].buf, j->sizes = v[PLAN_SIZES].buf;
    return 0;
}

/* Pass one: checks that every entry of sel is one of the ledger's with its records inside
 * the ledger, and counts the kept ones, so that every output is allocated at its size.
 * span gets, per entry of sel, its first record, its end record and the records kept
 * (read once: pass two uses these), *m the records kept in all.  PLAN_OK or why not. */
static int plan_count_kept(const plan_job_t *j, int64_t *span, int64_t *m) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t e = (int64_t)ld64(j->sel + i);
        if (e < 0 || e >= j->n_entries) return PLAN_BAD_SEL;
        int64_t a = (int64_t)ld64(j->starts + e), b = (int64_t)ld64(j->starts + e + 1);
        if (a < 0 || b < a || b > j->n_rec) return PLAN_RECORDS_OUTSIDE;
        int64_t k = 0;
        for (int64_t r = a; r < b; r++) k += j->keep[r] != 0;
        span[3 * i] = a, span[3 * i + 1] = b, span[3 * i + 2] = k;
        total += k;
    }
    *m = total;
    return PLAN_OK;
}

/* The outputs for n entries of sel and m kept records (the byte ranges at their most,
 * n + m, cut to those used at the end), and o pointing into them; -1 with an exception
 * set (out holds what was made, for the caller to release). */
static int new_plan_outputs(PyObject *out[PLAN_OUTPUTS], plan_out_t *o, Py_ssize_t n, int64_t m) {
    const Py_ssize_t sizes_of[PLAN_OUTPUTS] = {8 * m, 4 * m, 4 * m, 8 * n, n, 8 * n, 8 * (n + m), 8 * (n + m)};
    for (int i = 0; i < PLAN_OUTPUTS; i++)
        if (!(out[i] = PyByteArray_FromStringAndSize(NULL, sizes_of[i]))) return -1;
    o->rec = (int64_t *)PyByteArray_AS_STRING(out[OUT_REC]);
    o->in_entry = (uint32_t *)PyByteArray_AS_STRING(out[OUT_IN_ENTRY]);
    o->new_off = (uint32_t *)PyByteArray_AS_STRING(out[OUT_NEW_OFF]);
    o->kept = (int64_t *)PyByteArray_AS_STRING(out[OUT_KEPT]);
    o->whole = (uint8_t *)PyByteArray_AS_STRING(out[OUT_WHOLE]);
    o->lengths = (int64_t *)PyByteArray_AS_STRING(out[OUT_LENGTHS]);
    o->rs = (int64_t *)PyByteArray_AS_STRING(out[OUT_STARTS]);
    o->re = (int64_t *)PyByteArray_AS_STRING(out[OUT_ENDS]);
    return 0;
}

/* Entry i of sel, records [a, b), all kept: the frame as it was read (header, checksum
 * and payload) and its records at their old offsets.  *mi and *ranges count the records
 * and ranges planned so far; no more than m records are planned, whatever another thread
 * does to keep meanwhile (the caller then finds the counts differ). */
static inline void plan_whole_entry(const plan_job_t *j, const plan_out_t *o, Py_ssize_t i, int64_t a, int64_t b,
                                    int64_t m, int64_t *mi, int64_t *ranges) {
    int64_t eo = (int64_t)ld64(j->e_off + i), el = (int64_t)ld64(j->e_len + i);
    o->rs[*ranges] = eo, o->re[*ranges] = eo + el, (*ranges)++;
    for (int64_t r = a; r < b && *mi < m; r++, (*mi)++) {
        o->rec[*mi] = r, o->in_entry[*mi] = (uint32_t)(r - a), o->new_off[*mi] = ld32(j->offs + r);
        o->kept[i]++;
    }
    o->lengths[i] = el;
}

/* Entry i of sel, records [a, b), some kept: the old header stands in for the new one,
 * then one range per run of adjacent kept records, each record at its new offset.  The
 * counts as for plan_whole_entry; at most n + m ranges (n: the entries of sel). */
static inline void plan_kept_runs(const plan_job_t *j, const plan_out_t *o, Py_ssize_t i, int64_t a, int64_t b,
                                  int64_t m, int64_t *mi, int64_t *ranges) {
    int64_t eo = (int64_t)ld64(j->e_off + i);
    o->rs[*ranges] = eo, o->re[*ranges] = eo + FRAME_HEADER_BYTES, (*ranges)++;
    int64_t payload = 0, prev_end = -1;
    for (int64_t r = a; r < b && *mi < m; r++) {
        if (!j->keep[r]) continue;
        int64_t s = eo + FRAME_HEADER_BYTES + (int64_t)ld32(j->offs + r), z = (int64_t)ld32(j->sizes + r);
        if (s == prev_end) {
            o->re[*ranges - 1] += z;
        } else if (*ranges < j->n + m) {
            o->rs[*ranges] = s, o->re[*ranges] = s + z, (*ranges)++;
        }
        prev_end = s + z;
        o->rec[*mi] = r, o->in_entry[*mi] = (uint32_t)(r - a), o->new_off[*mi] = (uint32_t)payload;
        payload += z, (*mi)++;
        o->kept[i]++;
    }
    o->lengths[i] = FRAME_HEADER_BYTES + payload;
}

/* Pass two: fills the outputs from the spans of pass one (m records kept in all).
 * Returns how many byte ranges were planned. */
static int64_t plan_fill(const plan_job_t *j, const int64_t *span, int64_t m, const plan_out_t *out) {
    const plan_out_t o = *out; /* a local copy: the byte stores below cannot alias it */
    int64_t ranges = 0, mi = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t a = span[3 * i], b = span[3 * i + 1], k = span[3 * i + 2];
        o.kept[i] = 0;
        o.whole[i] = k == b - a;
        if (o.whole[i])
            plan_whole_entry(j, &o, i, a, b, m, &mi, &ranges);
        else
            plan_kept_runs(j, &o, i, a, b, m, &mi, &ranges);
    }
    return ranges;
}

static PyObject *py_copy_plan(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[PLAN_ARGS];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6]))
        return NULL;
    Py_buffer v[PLAN_ARGS];
    int got = 0, bad;
    PyObject *out[PLAN_OUTPUTS] = {NULL};
    PyObject *result = NULL;
    int64_t *span = NULL; /* per entry of sel: first record, end record, records kept (read once) */
    int64_t m = 0, ranges;
    plan_job_t j;
    plan_out_t o;
    for (; got < PLAN_ARGS; got++)
        if (PyObject_GetBuffer(objs[got], &v[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (get_plan_job(v, &j) < 0) goto done;
    if (!(span = malloc(3 * (size_t)(j.n ? j.n : 1) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    bad = plan_count_kept(&j, span, &m);
    Py_END_ALLOW_THREADS
    if (bad != PLAN_OK) {
        PyErr_SetString(PyExc_ValueError, bad == PLAN_BAD_SEL ? "an entry of sel is not an entry of the ledger"
                                                              : "entry_starts put an entry's records outside the ledger");
        goto done;
    }
    if (new_plan_outputs(out, &o, j.n, m) < 0) goto done;
    Py_BEGIN_ALLOW_THREADS
    ranges = plan_fill(&j, span, m, &o);
    Py_END_ALLOW_THREADS
    /* Every entry must have kept what the first pass counted; otherwise keep changed
     * under us (another thread) and the plan would not match the counts. */
    int consistent = 1;
    for (Py_ssize_t i = 0; i < j.n && consistent; i++) consistent = o.kept[i] == span[3 * i + 2];
    if (!consistent) {
        PyErr_SetString(PyExc_RuntimeError, "keep changed while the copy was planned");
        goto done;
    }
    if (PyByteArray_Resize(out[OUT_STARTS], 8 * ranges) < 0 || PyByteArray_Resize(out[OUT_ENDS], 8 * ranges) < 0)
        goto done;
    result = PyTuple_New(PLAN_OUTPUTS);
    if (result)
        for (int i = 0; i < PLAN_OUTPUTS; i++) PyTuple_SET_ITEM(result, i, out[i]), out[i] = NULL;
done:
    for (int i = 0; i < PLAN_OUTPUTS; i++) Py_XDECREF(out[i]);
    free(span);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

PyDoc_STRVAR(gather_ranges_doc,
             "gather_ranges(data, starts, ends, out=None) -> bytearray | int\n\n"
             "data[starts[0]:ends[0]] + data[starts[1]:ends[1]] + ... in one new buffer, or\n"
             "written to the start of the writable buffer out, which must not overlap data\n"
             "(then the byte count is returned).");

#define SMALL_COPY 16

/* The ranges of base, back to back from dst (which ends at end).  A short range is copied
 * as SMALL_COPY bytes when both sides have the room (the bytes past it are overwritten
 * by the next range, or lie past what the caller uses): one fixed-size move instead of a
 * call, which is what keys and small values cost most. */
static void copy_ranges(uint8_t *dst, const uint8_t *end, const uint8_t *base, Py_ssize_t len, const ranges_t *r) {
    for (Py_ssize_t i = 0; i < r->n; i++) {
        size_t n = (size_t)(r->e[i] - r->s[i]);
        if (n <= SMALL_COPY && r->s[i] <= len - SMALL_COPY && end - dst >= SMALL_COPY)
            memcpy(dst, base + r->s[i], SMALL_COPY);
        else
            memcpy(dst, base + r->s[i], n);
        dst += n;
    }
}

static PyObject *py_gather_ranges(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *data_obj, *starts_obj, *ends_obj, *out_obj = Py_None;
    if (!PyArg_ParseTuple(args, "OOO|O", &data_obj, &starts_obj, &ends_obj, &out_obj)) return NULL;
    Py_buffer data, out_view = {0};
    ranges_t r;
    int64_t total;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (get_ranges(starts_obj, ends_obj, &r) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *dst = NULL;
    if (check_ranges(&r, data.len, &total) < 0) goto done;
    if (out_obj != Py_None) {
        if (PyObject_GetBuffer(out_obj, &out_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
        if (out_view.len < total) {
            PyErr_Format(PyExc_ValueError, "out holds %zd bytes, the ranges %lld", out_view.len, (long long)total);
            goto done;
        }
        const uint8_t *o0 = out_view.buf, *d0 = data.buf;
        if (total && data.len && o0 < d0 + data.len && d0 < o0 + total) {
            PyErr_SetString(PyExc_ValueError, "out overlaps data");
            goto done;
        }
        dst = out_view.buf;
        result = PyLong_FromLongLong(total);
    } else if ((result = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)total))) {
        dst = (uint8_t *)PyByteArray_AS_STRING(result);
    }
    if (result) {
        const uint8_t *base = data.buf;
        Py_BEGIN_ALLOW_THREADS
        copy_ranges(dst, dst + total, base, data.len, &r);
        Py_END_ALLOW_THREADS
    }
done:
    if (out_view.obj) PyBuffer_Release(&out_view);
    free_ranges(&r);
    PyBuffer_Release(&data);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* Record validation                                                                     */
/*
 * Pass two copies records by the offsets and sizes the footer claims, without decoding
 * them.  A footer can move a boundary between two records (one size down a byte, the
 * next up a byte) and still tile its entry, so each record copied is checked to be
 * exactly one well-formed record,
 *     [key: bin | nil, value: bin | nil, properties: map<str, str> | nil,
 *      publish_time: int64, event_time: int64 | nil],
 * filling its claimed size, with the footer's flags for it true.  A straight-line parser
 * that reads only the type bytes and lengths (and a property's text, to check its
 * UTF-8); every read is checked against the record's end.
 */

/* msgpack type bytes (github.com/msgpack/msgpack/blob/master/spec.md) */
#define MP_POSFIXINT_MAX 0x7f
#define MP_FIXMAP 0x80 /* 0x80-0x8f: the low four bits are the pair count */
#define MP_FIXMAP_MASK 0xf0
#define MP_FIXMAP_COUNT 0x0f
#define MP_FIXARRAY 0x90 /* 0x90-0x9f: the low four bits are the element count */
#define MP_FIXSTR 0xa0   /* 0xa0-0xbf: the low five bits are the length */
#define MP_FIXSTR_MASK 0xe0
#define MP_FIXSTR_LEN 0x1f
#define MP_NIL 0xc0
#define MP_BIN8 0xc4 /* bin8, bin16, bin32: a 1-, 2- or 4-byte length follows */
#define MP_BIN32 0xc6
#define MP_UINT8 0xcc /* uint8..uint64, then int8..int64: 1, 2, 4, 8 bytes follow */
#define MP_UINT64 0xcf
#define MP_INT64 0xd3
#define MP_INT_WIDTH_BITS 0x03 /* the low two bits of those give the width's log2 */
#define MP_STR8 0xd9           /* str8, str16, str32 */
#define MP_STR32 0xdb
#define MP_ARRAY16 0xdc
#define MP_ARRAY32 0xdd
#define MP_MAP16 0xde
#define MP_MAP32 0xdf
#define MP_WIDTH16 2 /* bytes of the count after array16 and map16 */
#define MP_WIDTH32 4
#define MP_NEGFIXINT_MIN 0xe0
#define MP_SIGN_BIT 0x80 /* of a uint64's first byte: too large for an int64 */

#define RECORD_FIELDS 5
#define RECORD_HAS_KEY 0x01
#define RECORD_TOMBSTONE 0x02

/* Well-formed UTF-8 (The Unicode Standard, table 3-7), as Python's strict decoder takes
 * it: for each range of lead bytes the sequence's length and the range of its second
 * byte (which rules out overlong forms, surrogates and code points past U+10FFFF); every
 * later byte is a plain continuation byte.  Bytes below 0x80 stand alone. */
#define UTF8_ASCII_END 0x80
#define UTF8_CONT_MASK 0xc0
#define UTF8_CONT 0x80
#define ASCII_WORD_HIGH_BITS 0x8080808080808080ull
static const struct {
    uint8_t lead_lo, lead_hi, len, second_lo, second_hi;
} utf8_rows[] = {
    {0xc2, 0xdf, 2, 0x80, 0xbf}, {0xe0, 0xe0, 3, 0xa0, 0xbf}, {0xe1, 0xec, 3, 0x80, 0xbf},
    {0xed, 0xed, 3, 0x80, 0x9f}, {0xee, 0xef, 3, 0x80, 0xbf}, {0xf0, 0xf0, 4, 0x90, 0xbf},
    {0xf1, 0xf3, 4, 0x80, 0xbf}, {0xf4, 0xf4, 4, 0x80, 0x8f},
};

/* The length of the well-formed multi-byte sequence at s (left bytes available), or 0. */
static size_t utf8_sequence(const uint8_t *s, size_t left) {
    for (size_t r = 0; r < sizeof(utf8_rows) / sizeof(utf8_rows[0]); r++) {
        if (s[0] < utf8_rows[r].lead_lo || s[0] > utf8_rows[r].lead_hi) continue;
        size_t n = utf8_rows[r].len;
        if (left < n || s[1] < utf8_rows[r].second_lo || s[1] > utf8_rows[r].second_hi) return 0;
        for (size_t k = 2; k < n; k++)
            if ((s[k] & UTF8_CONT_MASK) != UTF8_CONT) return 0;
        return n;
    }
    return 0;
}

static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint64_t w;
        if (n - i >= sizeof(w) && (memcpy(&w, s + i, sizeof(w)), !(w & ASCII_WORD_HIGH_BITS))) {
            i += sizeof(w); /* eight ASCII bytes at once: property text is mostly ASCII */
        } else if (s[i] < UTF8_ASCII_END) {
            i++;
        } else {
            size_t len = utf8_sequence(s + i, n - i);
            if (!len) return 0;
            i += len;
        }
    }
    return 1;
}

/* A big-endian unsigned integer of width 1, 2, 4 or 8 bytes. */
static inline uint64_t load_be(const uint8_t *p, unsigned width) {
    uint16_t h;
    uint32_t w;
    uint64_t d;
    switch (width) {
    case 1:
        return p[0];
    case 2:
        memcpy(&h, p, 2);
        return __builtin_bswap16(h);
    case 4:
        memcpy(&w, p, 4);
        return __builtin_bswap32(w);
    default:
        memcpy(&d, p, 8);
        return __builtin_bswap64(d);
    }
}

/* The length that follows a type byte (width bytes), at *p, moved past it; 0 when it
 * does not fit before end. */
static inline int read_length(const uint8_t **p, const uint8_t *end, unsigned width, uint64_t *len) {
    if ((size_t)(end - *p) < width) return 0;
    *len = load_be(*p, width);
    *p += width;
    return 1;
}

/* The parsers below each take the element at p and return the position after it, or
 * NULL when it is not of the kind wanted or does not end by end. */

static inline const uint8_t *skip_record_head(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    uint64_t n;
    if (t == MP_FIXARRAY + RECORD_FIELDS) return p;
    if (t != MP_ARRAY16 && t != MP_ARRAY32) return NULL;
    if (!read_length(&p, end, t == MP_ARRAY16 ? MP_WIDTH16 : MP_WIDTH32, &n) || n != RECORD_FIELDS) return NULL;
    return p;
}

/* nil or bin; *len is its length, -1 for nil */
static inline const uint8_t *skip_bin(const uint8_t *p, const uint8_t *end, int64_t *len) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    uint64_t n;
    if (t == MP_NIL) {
        *len = -1;
        return p;
    }
    if (t == MP_BIN8 && p < end) /* keys and most values: a one-byte length */
        n = *p++;
    else if (t < MP_BIN8 || t > MP_BIN32 || !read_length(&p, end, 1u << (t - MP_BIN8), &n))
        return NULL;
    if ((uint64_t)(end - p) < n) return NULL;
    *len = (int64_t)n;
    return p + n;
}

static const uint8_t *skip_str(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    uint64_t n;
    if ((t & MP_FIXSTR_MASK) == MP_FIXSTR)
        n = t & MP_FIXSTR_LEN;
    else if (t < MP_STR8 || t > MP_STR32 || !read_length(&p, end, 1u << (t - MP_STR8), &n))
        return NULL;
    if ((uint64_t)(end - p) < n || !utf8_valid(p, (size_t)n)) return NULL;
    return p + n;
}

/* nil or a map of str to str */
static inline const uint8_t *skip_properties(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    uint64_t pairs;
    if (t == MP_NIL) return p;
    if ((t & MP_FIXMAP_MASK) == MP_FIXMAP)
        pairs = t & MP_FIXMAP_COUNT;
    else if ((t != MP_MAP16 && t != MP_MAP32) || !read_length(&p, end, t == MP_MAP16 ? MP_WIDTH16 : MP_WIDTH32, &pairs))
        return NULL;
    /* a crafted count ends the loop at the record's end: each string takes a byte */
    for (; pairs && p; pairs--)
        if ((p = skip_str(p, end))) p = skip_str(p, end);
    return p;
}

/* an integer that fits an int64 */
static inline const uint8_t *skip_int(const uint8_t *p, const uint8_t *end) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    if (t <= MP_POSFIXINT_MAX || t >= MP_NEGFIXINT_MIN) return p;
    if (t < MP_UINT8 || t > MP_INT64) return NULL;
    size_t width = (size_t)1 << (t & MP_INT_WIDTH_BITS);
    if ((size_t)(end - p) < width || (t == MP_UINT64 && (p[0] & MP_SIGN_BIT))) return NULL;
    return p + width;
}

/* Whether [p, end) is exactly one record and flags are its flags. */
static inline int record_ok(const uint8_t *p, const uint8_t *end, uint8_t flags) {
    int64_t key_len = -1, value_len = -1;
    if (!(p = skip_record_head(p, end)) || !(p = skip_bin(p, end, &key_len)) ||
        !(p = skip_bin(p, end, &value_len)) || !(p = skip_properties(p, end)) || !(p = skip_int(p, end)))
        return 0;
    if (p < end && *p == MP_NIL)
        p++;
    else if (!(p = skip_int(p, end)))
        return 0;
    /* as the writer sets them: a key when there is one; "tombstone" whenever the value is
       nil or empty (a keyless record's too: only with a key does it delete anything) */
    uint8_t want = (uint8_t)((key_len < 0 ? 0 : RECORD_HAS_KEY) | (value_len <= 0 ? RECORD_TOMBSTONE : 0));
    return p == end && flags == want;
}

PyDoc_STRVAR(check_records_doc,
             "check_records(data, starts, sizes, flags) -> int\n\n"
             "Check that data[starts[i]:starts[i] + sizes[i]] (int64 buffers) is exactly one record,\n"
             "[key: bin | nil, value: bin | nil, properties: map<str, str> | nil, publish_time: int64,\n"
             "event_time: int64 | nil], and that flags[i] (uint8) is its footer flags: bit 0 when it\n"
             "has a key, bit 1 when its value is nil or empty, no other bit.\n"
             "Returns the index of the first record that is not, or -1.");

/* What check_records works on.  starts and sizes are the caller's buffers, not copies
 * (copying two 16 MB columns into fresh memory costs more than checking the records):
 * like tiling_error, each value is read once into a local, checked, and then used. */
typedef struct {
    const uint8_t *base;
    Py_ssize_t len;
    const uint64_t *starts, *sizes; /* int64 values, at any alignment */
    const uint8_t *flags;
    Py_ssize_t n;
} record_job_t;

static inline int range_inside(int64_t s, int64_t z, Py_ssize_t len) { return s >= 0 && z >= 0 && s <= len - z; }

/* The first record whose range leaves the buffer (its start and size in *s and *z), or -1. */
static Py_ssize_t first_outside(const record_job_t *j, int64_t *s, int64_t *z) {
    for (Py_ssize_t i = 0; i < j->n; i++) {
        *s = (int64_t)ld64(j->starts + i), *z = (int64_t)ld64(j->sizes + i);
        if (!range_inside(*s, *z, j->len)) return i;
    }
    return -1;
}

#define RECORDS_CHANGED (-2)

/* The first record that is not exactly one record with its flags, or -1; RECORDS_CHANGED
 * when a range that first_outside passed has left the buffer since (another thread
 * writing to starts or sizes). */
static Py_ssize_t first_bad_record(const record_job_t *j) {
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t s = (int64_t)ld64(j->starts + i), z = (int64_t)ld64(j->sizes + i);
        if (!range_inside(s, z, j->len)) return RECORDS_CHANGED;
        if (!record_ok(j->base + s, j->base + s + z, j->flags[i])) return i;
    }
    return -1;
}

/* The job for check_records' buffers, or -1 with an exception set. */
static int get_record_job(Py_buffer v[4], record_job_t *j) {
    if (!is_int64(&v[1], 1) || !is_int64(&v[2], 1) || !is_byte(&v[3])) {
        PyErr_SetString(PyExc_ValueError, "starts and sizes must be buffers of signed 64-bit integers, flags of bytes");
        return -1;
    }
    j->n = v[1].len / 8;
    if (v[2].len / 8 != j->n || v[3].len != j->n) {
        PyErr_SetString(PyExc_ValueError, "starts, sizes and flags must have one length");
        return -1;
    }
    j->base = v[0].buf, j->len = v[0].len;
    j->starts = v[1].buf, j->sizes = v[2].buf, j->flags = v[3].buf;
    return 0;
}

static PyObject *py_check_records(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[4];
    if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    Py_buffer v[4];
    int got = 0;
    PyObject *result = NULL;
    record_job_t j;
    for (; got < 4; got++)
        if (PyObject_GetBuffer(objs[got], &v[got], PyBUF_C_CONTIGUOUS | (got ? PyBUF_FORMAT : 0)) < 0) goto done;
    if (get_record_job(v, &j) < 0) goto done;
    Py_ssize_t outside, bad = -1;
    int64_t s = 0, z = 0;
    Py_BEGIN_ALLOW_THREADS
    outside = first_outside(&j, &s, &z);
    if (outside < 0) bad = first_bad_record(&j);
    Py_END_ALLOW_THREADS
    if (outside >= 0)
        PyErr_Format(PyExc_ValueError, "record %zd (%lld bytes at %lld) lies outside the buffer of %zd bytes", outside,
                     (long long)z, (long long)s, j.len);
    else if (bad == RECORDS_CHANGED)
        PyErr_SetString(PyExc_RuntimeError, "starts or sizes changed while the records were checked");
    else
        result = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

PyDoc_STRVAR(check_kept_doc,
             "check_kept(data, frames, kept, rec, offsets, sizes, flags) -> int\n\n"
             "check_records for the records compaction copies, without building their ranges first:\n"
             "entry i of a batch has its frame at data[frames[i]:] and kept[i] of its records copied,\n"
             "taken in order from rec (indexes into the ledger's footer columns offsets and sizes,\n"
             "uint32, and flags, uint8); each is checked at frames[i] + 12 + offsets[r], sizes[r]\n"
             "bytes long.  Returns the index into rec of the first bad record, or -1.");

typedef struct {
    const uint8_t *base;
    Py_ssize_t len;
    const uint64_t *frames, *kept, *rec; /* int64 values, at any alignment */
    Py_ssize_t entries, n_rec;
    const uint32_t *offsets, *sizes;
    const uint8_t *flags;
    Py_ssize_t records; /* rows of offsets, sizes and flags */
} kept_job_t;

#define KEPT_BAD_INPUT (-2)

/* The first bad record of the job (an index into rec), -1, or KEPT_BAD_INPUT when an
 * index, a count or a range does not fit (values are read once and checked before use). */
static Py_ssize_t first_bad_kept(const kept_job_t *j) {
    Py_ssize_t at = 0;
    for (Py_ssize_t e = 0; e < j->entries; e++) {
        int64_t frame = (int64_t)ld64(j->frames + e), count = (int64_t)ld64(j->kept + e);
        if (frame < 0 || count < 0 || count > j->n_rec - at) return KEPT_BAD_INPUT;
        for (int64_t k = 0; k < count; k++, at++) {
            int64_t r = (int64_t)ld64(j->rec + at);
            if (r < 0 || r >= j->records) return KEPT_BAD_INPUT;
            int64_t s = frame + FRAME_HEADER_BYTES + (int64_t)ld32(j->offsets + r), z = (int64_t)ld32(j->sizes + r);
            if (!range_inside(s, z, j->len)) return KEPT_BAD_INPUT;
            if (!record_ok(j->base + s, j->base + s + z, j->flags[r])) return at;
        }
    }
    return at == j->n_rec ? -1 : KEPT_BAD_INPUT;
}

/* The job for check_kept's buffers, or -1 with an exception set. */
static int get_kept_job(Py_buffer v[7], kept_job_t *j) {
    if (!is_int64(&v[1], 1) || !is_int64(&v[2], 1) || !is_int64(&v[3], 1) || !is_uint32(&v[4]) ||
        !is_uint32(&v[5]) || !is_byte(&v[6])) {
        PyErr_SetString(PyExc_ValueError, "frames, kept and rec must be int64 buffers, offsets and sizes uint32, "
                                          "flags bytes");
        return -1;
    }
    j->entries = v[1].len / 8, j->n_rec = v[3].len / 8, j->records = v[4].len / 4;
    if (v[2].len / 8 != j->entries || v[5].len / 4 != j->records || v[6].len != j->records) {
        PyErr_SetString(PyExc_ValueError, "frames and kept must have one length, offsets, sizes and flags another");
        return -1;
    }
    j->base = v[0].buf, j->len = v[0].len;
    j->frames = v[1].buf, j->kept = v[2].buf, j->rec = v[3].buf;
    j->offsets = v[4].buf, j->sizes = v[5].buf, j->flags = v[6].buf;
    return 0;
}

static PyObject *py_check_kept(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[7];
    if (!PyArg_ParseTuple(args, "OOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6]))
        return NULL;
    Py_buffer v[7];
    int got = 0;
    PyObject *result = NULL;
    kept_job_t j;
    for (; got < 7; got++)
        if (PyObject_GetBuffer(objs[got], &v[got], PyBUF_C_CONTIGUOUS | (got ? PyBUF_FORMAT : 0)) < 0) goto done;
    if (get_kept_job(v, &j) < 0) goto done;
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = first_bad_kept(&j);
    Py_END_ALLOW_THREADS
    if (bad == KEPT_BAD_INPUT)
        PyErr_SetString(PyExc_ValueError, "an index, a count or a record's range does not fit the buffers given");
    else
        result = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* Records as columns                                                                   */

#define MP_INT8 0xd0 /* int8..int64 are signed: sign-extended from their width */

/* str: where its bytes begin and how many; NULL when not valid UTF-8 text ending by end */
static inline const uint8_t *read_str(const uint8_t *p, const uint8_t *end, const uint8_t **at, int64_t *len) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    uint64_t n;
    if ((t & MP_FIXSTR_MASK) == MP_FIXSTR)
        n = t & MP_FIXSTR_LEN;
    else if (t < MP_STR8 || t > MP_STR32 || !read_length(&p, end, 1u << (t - MP_STR8), &n))
        return NULL;
    if ((uint64_t)(end - p) < n || !utf8_valid(p, (size_t)n)) return NULL;
    *at = p, *len = (int64_t)n;
    return p + n;
}

/* an integer that fits an int64, and its value */
static inline const uint8_t *read_int(const uint8_t *p, const uint8_t *end, int64_t *v) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    if (t <= MP_POSFIXINT_MAX || t >= MP_NEGFIXINT_MIN) {
        *v = (int8_t)t; /* (a positive fixint's top bit is clear) */
        return p;
    }
    if (t < MP_UINT8 || t > MP_INT64) return NULL;
    unsigned width = 1u << (t & MP_INT_WIDTH_BITS);
    if ((size_t)(end - p) < width || (t == MP_UINT64 && (p[0] & MP_SIGN_BIT))) return NULL;
    uint64_t u = load_be(p, width);
    if (t < MP_INT8 || width == 8)
        *v = (int64_t)u;
    else if (width == 4)
        *v = (int32_t)(uint32_t)u;
    else if (width == 2)
        *v = (int16_t)(uint16_t)u;
    else
        *v = (int8_t)(uint8_t)u;
    return p + width;
}

/* One record's fields: byte offsets from the buffer's start, -1 lengths for nil. */
typedef struct {
    int64_t key_at, key_len, value_at, value_len, publish, event, pairs;
    uint8_t has_event;
    const uint8_t *props; /* the first property, after the map's header */
} fields_t;

/* The properties at p (nil or a map of str to str): their count; NULL when malformed. */
static const uint8_t *read_properties(const uint8_t *p, const uint8_t *end, fields_t *f) {
    if (p >= end) return NULL;
    uint8_t t = *p++;
    uint64_t pairs = 0;
    const uint8_t *s;
    int64_t n;
    if (t != MP_NIL) {
        if ((t & MP_FIXMAP_MASK) == MP_FIXMAP)
            pairs = t & MP_FIXMAP_COUNT;
        else if ((t != MP_MAP16 && t != MP_MAP32) ||
                 !read_length(&p, end, t == MP_MAP16 ? MP_WIDTH16 : MP_WIDTH32, &pairs))
            return NULL;
    }
    f->props = p, f->pairs = (int64_t)pairs;
    for (; pairs && p; pairs--) /* a crafted count ends at the record's end: each string takes a byte */
        if ((p = read_str(p, end, &s, &n))) p = read_str(p, end, &s, &n);
    return p;
}

/* Whether [p, end) is exactly one record; its fields in *f (offsets from base). */
static int read_record(const uint8_t *base, const uint8_t *p, const uint8_t *end, fields_t *f) {
    if (!(p = skip_record_head(p, end))) return 0;
    if (!(p = skip_bin(p, end, &f->key_len))) return 0;
    f->key_at = (p - base) - (f->key_len > 0 ? f->key_len : 0);
    if (!(p = skip_bin(p, end, &f->value_len))) return 0;
    f->value_at = (p - base) - (f->value_len > 0 ? f->value_len : 0);
    if (!(p = read_properties(p, end, f)) || !(p = read_int(p, end, &f->publish))) return 0;
    f->has_event = !(p < end && *p == MP_NIL);
    f->event = 0;
    if (!f->has_event)
        p++;
    else if (!(p = read_int(p, end, &f->event)))
        return 0;
    return p == end;
}

enum { COL_KEY_AT, COL_KEY_LEN, COL_VALUE_AT, COL_VALUE_LEN, COL_PUBLISH, COL_EVENT, COL_HAS_EVENT, COL_PAIRS,
       COL_NAME_AT, COL_NAME_LEN, COL_PVAL_AT, COL_PVAL_LEN, COLS };

/* The columns' rows: one per record, or (the last four) one per property. */
static int new_columns(PyObject *out[COLS], Py_ssize_t n, int64_t pairs) {
    for (int c = 0; c < COLS; c++) {
        Py_ssize_t rows = c >= COL_NAME_AT ? (Py_ssize_t)pairs : n;
        if (!(out[c] = PyByteArray_FromStringAndSize(NULL, c == COL_HAS_EVENT ? rows : rows * 8))) return -1;
    }
    return 0;
}

/* Fill the columns of records the first pass read (every record valid, ``pairs`` properties
 * in all); RECORDS_CHANGED if the data no longer says what it said then. */
static Py_ssize_t fill_columns(const record_job_t *j, PyObject *out[COLS], int64_t pairs) {
    int64_t *col[COLS];
    for (int c = 0; c < COLS; c++) col[c] = (int64_t *)(void *)PyByteArray_AS_STRING(out[c]);
    uint8_t *has_event = (uint8_t *)PyByteArray_AS_STRING(out[COL_HAS_EVENT]);
    int64_t pair = 0, len = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t s = (int64_t)ld64(j->starts + i), z = (int64_t)ld64(j->sizes + i);
        fields_t f;
        if (!read_record(j->base, j->base + s, j->base + s + z, &f) || f.pairs > pairs - pair) return RECORDS_CHANGED;
        col[COL_KEY_AT][i] = f.key_at, col[COL_KEY_LEN][i] = f.key_len;
        col[COL_VALUE_AT][i] = f.value_at, col[COL_VALUE_LEN][i] = f.value_len;
        col[COL_PUBLISH][i] = f.publish, col[COL_EVENT][i] = f.event, col[COL_PAIRS][i] = f.pairs;
        has_event[i] = f.has_event;
        const uint8_t *p = f.props, *end = j->base + s + z, *at = NULL;
        for (int64_t k = 0; k < f.pairs; k++, pair++) {
            if (!(p = read_str(p, end, &at, &len))) return RECORDS_CHANGED;
            col[COL_NAME_AT][pair] = at - j->base, col[COL_NAME_LEN][pair] = len;
            if (!(p = read_str(p, end, &at, &len))) return RECORDS_CHANGED;
            col[COL_PVAL_AT][pair] = at - j->base, col[COL_PVAL_LEN][pair] = len;
        }
    }
    return -1;
}

/* First pass: every record valid (ranges checked already, on copies nobody else holds),
 * and the properties they hold; the first bad record, or -1. */
static Py_ssize_t count_properties(const record_job_t *j, int64_t *pairs) {
    *pairs = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        int64_t s = (int64_t)ld64(j->starts + i), z = (int64_t)ld64(j->sizes + i);
        fields_t f;
        if (!read_record(j->base, j->base + s, j->base + s + z, &f)) return i;
        *pairs += f.pairs;
    }
    return -1;
}

PyDoc_STRVAR(record_columns_doc,
             "record_columns(data, starts, sizes) -> (bad, columns)\n\n"
             "Decode the records data[starts[i]:starts[i] + sizes[i]] (int64 buffers) into columns: bad is\n"
             "-1 and columns a tuple of bytearrays, int64 unless said: key offset and length (-1: nil),\n"
             "value offset and length, publish time, event time, has event time (uint8), properties per\n"
             "record; then per property, in order, name offset and length, value offset and length.\n"
             "Offsets are into data. A record that is not exactly one well-formed record: bad is its\n"
             "index and columns None.");

static PyObject *py_record_columns(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *data_obj, *starts_obj, *sizes_obj, *out[COLS] = {NULL}, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &data_obj, &starts_obj, &sizes_obj)) return NULL;
    /* copies: the first pass's values are the second pass's, whatever another thread does */
    Py_ssize_t n = 0, n_sizes = 0;
    int64_t *starts = copy_int64(starts_obj, "starts", 1, &n), *sizes = NULL;
    if (!starts || !(sizes = copy_int64(sizes_obj, "sizes", 1, &n_sizes))) goto free;
    if (n != n_sizes) {
        PyErr_SetString(PyExc_ValueError, "starts and sizes must have one length");
        goto free;
    }
    Py_buffer data;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_C_CONTIGUOUS) < 0) goto free;
    record_job_t j = {.base = data.buf, .len = data.len, .starts = (const uint64_t *)starts,
                      .sizes = (const uint64_t *)sizes, .n = n};
    int64_t s = 0, z = 0, pairs = 0;
    Py_ssize_t bad = first_outside(&j, &s, &z);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "record %zd (%lld bytes at %lld) lies outside the buffer of %zd bytes", bad,
                     (long long)z, (long long)s, j.len);
    } else {
        Py_BEGIN_ALLOW_THREADS
        bad = count_properties(&j, &pairs);
        Py_END_ALLOW_THREADS
        if (bad >= 0)
            result = Py_BuildValue("(nO)", bad, Py_None);
        else if (new_columns(out, j.n, pairs) == 0) {
            Py_ssize_t filled;
            Py_BEGIN_ALLOW_THREADS /* (the columns are new: nobody else holds them yet) */
            filled = fill_columns(&j, out, pairs);
            Py_END_ALLOW_THREADS
            if (filled == RECORDS_CHANGED)
                PyErr_SetString(PyExc_RuntimeError, "the records changed while they were read");
            else
                result = Py_BuildValue("(n(OOOOOOOOOOOO))", (Py_ssize_t)-1, out[0], out[1], out[2], out[3], out[4],
                                       out[5], out[6], out[7], out[8], out[9], out[10], out[11]);
        }
    }
    PyBuffer_Release(&data);
free:
    for (int c = 0; c < COLS; c++) Py_XDECREF(out[c]);
    free(starts);
    free(sizes);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* The latest record of every key                                                        */
/*
 * An open-addressing table whose home slot is the top bits of the high hash, probed
 * linearly and never wrapped (an overflow area follows the last slot).  Hashes are
 * uniform, so the table holds the keys almost in hash order: reading it out in slot
 * order and finishing with an insertion sort gives them sorted, at a cost that grows
 * with how far keys sit from their home slot (a slot or two at half load).  Records
 * are visited in index order, so the index a key ends with is its last occurrence.
 *
 * An event table (KeyTable(with_events=True)) keeps each key's record with the greatest
 * (event time, position) instead: its slots are a slot_t followed by that record's event
 * time, 32 bytes.  The functions a record or a lookup runs through are written once for
 * both slot sizes, and inlined with the size a constant.
 */

typedef struct {
    uint64_t hi, lo;
    int64_t idx; /* -1: empty; positions are never negative */
} slot_t;

/* Bytes of an event table's slot: the slot_t, then the event time (an int64_t). */
#define EVENT_SLOT_BYTES (sizeof(slot_t) + sizeof(int64_t))
#define ALWAYS_INLINE inline __attribute__((always_inline))

static ALWAYS_INLINE slot_t *slot_at(const slot_t *slots, size_t s, size_t stride) {
    return (slot_t *)((const char *)slots + s * stride);
}

/* The event time of an event table's slot (read and written as an int64_t only; the
 * const is the slot's, not its event's, so that readers and writers share one helper). */
static ALWAYS_INLINE int64_t *event_of(const slot_t *x) {
    return (int64_t *)(void *)((const char *)x + sizeof(slot_t));
}

typedef struct {
    slot_t *slots;  /* `size` slots of `stride` bytes */
    size_t stride;  /* sizeof(slot_t), or EVENT_SLOT_BYTES in an event table */
    size_t cap;     /* home slots (any number: the table is sized to what it will hold) */
    size_t size;    /* cap plus the overflow area */
    int skip;       /* top bits every key shares (one thread's part of the hash range) */
    size_t count;   /* keys held */
    size_t records; /* records put, for the probe budget */
    size_t probes;  /* slots probed past the home slot, summed over those records */
    uint64_t *filter; /* one bit per value of the low hash's low bits, set for each key held
                       * (NULL: none; only a table kept for lookups has one) */
    uint64_t fmask;   /* the filter's bits - 1 */
} table_t;

/* What the table operations that can fail report (table_init, table_grow, latest_keys
 * and table_add_records, which KeyTable.add runs). */
enum {
    TABLE_OK = 0,
    TABLE_NO_MEMORY = -1,         /* an allocation failed: the caller raises MemoryError */
    TABLE_CROWDED = -2,           /* keys crafted to share their top hash bits crowd the table even at
                                   * the largest size allowed, or the probes went over budget: the
                                   * caller sorts instead (KeyTable.add stops taking records) */
    TABLE_NEGATIVE_POSITION = -3, /* KeyTable.add was given a negative position: ValueError */
};

/* The high 64 bits of a 64 x 64-bit product. */
static inline uint64_t mul_high(uint64_t a, uint64_t b) {
#if defined(__SIZEOF_INT128__)
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
    uint64_t a0 = (uint32_t)a, a1 = a >> 32, b0 = (uint32_t)b, b1 = b >> 32;
    uint64_t mid = a1 * b0 + ((a0 * b0) >> 32), mid2 = a0 * b1 + (uint32_t)mid;
    return a1 * b1 + (mid >> 32) + (mid2 >> 32);
#endif
}

/* The home slot: the hash bits right after those every key of the table shares, scaled
 * to the table (multiply-shift), so that slot order is hash order, the whole table is
 * used, and the table can have any size. */
static inline size_t home(const table_t *t, uint64_t hi) { return (size_t)mul_high(hi << t->skip, t->cap); }

/* The table grows when more than this share of its home slots hold a key. */
#define LOAD_PERCENT 60
static inline int too_full(const table_t *t) { return t->count * 100 > t->cap * LOAD_PERCENT; }
/* Home slots for `keys` keys at that load. */
static inline size_t cap_for(size_t keys) {
    size_t cap = keys * 100 / LOAD_PERCENT + 1;
    return cap < 1024 ? 1024 : cap;
}

#define PREFETCH_AHEAD 16

/* Probes one key may take, and probes per record on average (beyond a start), before
 * the table is declared crowded.  Uniform hashes at half load need a couple and leave
 * no run of occupied slots near this long; only keys crafted to share their top hash
 * bits get here, and the caller then sorts, at a cost that does not depend on the
 * keys.  The limit also bounds a lookup. */
#define MAX_PROBES 256
#define PROBES_PER_RECORD 16
#define PROBES_FREE ((size_t)1 << 20)

static inline int over_budget(const table_t *t) {
    return t->probes > PROBES_FREE + PROBES_PER_RECORD * t->records;
}

#define HUGE_PAGE ((size_t)2 << 20)

/* Big tables ask for huge pages: every insert lands on a random slot, and with 4 KiB
 * pages nearly each one would also miss the TLB. */
static void *table_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes < 4 * HUGE_PAGE) return malloc(bytes);
    if (posix_memalign(&p, HUGE_PAGE, bytes) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}

/* An empty table of slots of `stride` bytes: TABLE_OK or TABLE_NO_MEMORY. */
static int table_init(table_t *t, size_t cap, int skip, size_t stride) {
    memset(t, 0, sizeof(table_t));
    t->skip = skip;
    t->cap = cap;
    t->stride = stride;
    t->size = t->cap + t->cap / 8 + 64;
    t->slots = table_alloc(t->size * stride);
    if (!t->slots) return TABLE_NO_MEMORY;
    for (size_t i = 0; i < t->size; i++) slot_at(t->slots, i, stride)->idx = -1;
    return TABLE_OK;
}

/* What table_put did with a key. */
enum {
    PUT_CROWDED = -1,    /* the MAX_PROBES slots from its home slot on hold other keys */
    PUT_OFF_THE_END = 0, /* it ran off the end of the overflow area: the caller grows the table */
    PUT_DONE = 1,        /* placed, or its position raised (or kept) */
};

/* Puts a key (or raises its position: in an event table, its (event, position)) into a
 * table of slots of `stride` bytes; PUT_DONE, PUT_OFF_THE_END or PUT_CROWDED. */
static ALWAYS_INLINE int table_put_as(table_t *t, uint64_t hi, uint64_t lo, int64_t idx, int64_t event,
                                      const size_t stride) {
    const int events = stride != sizeof(slot_t);
    size_t s = home(t, hi), first = s;
    size_t stop = s + MAX_PROBES < t->size ? s + MAX_PROBES : t->size;
    slot_t *slots = t->slots;
    for (; s < stop; s++) {
        slot_t *x = slot_at(slots, s, stride);
        if (x->idx < 0) {
            x->hi = hi;
            x->lo = lo;
            x->idx = idx;
            if (events) *event_of(x) = event;
            t->count++;
            t->probes += s - first;
            return PUT_DONE;
        }
        if (x->hi == hi && x->lo == lo) {
            if (!events) {
                if (idx > x->idx) x->idx = idx;
            } else {
                int64_t *e = event_of(x);
                if (event > *e || (event == *e && idx > x->idx)) {
                    *e = event;
                    x->idx = idx;
                }
            }
            t->probes += s - first;
            return PUT_DONE;
        }
    }
    t->probes += s - first;
    return stop == t->size ? PUT_OFF_THE_END : PUT_CROWDED;
}

static inline int table_put(table_t *t, uint64_t hi, uint64_t lo, int64_t idx) {
    return table_put_as(t, hi, lo, idx, 0, sizeof(slot_t));
}

static inline int table_put_event(table_t *t, uint64_t hi, uint64_t lo, int64_t idx, int64_t event) {
    return table_put_as(t, hi, lo, idx, event, EVENT_SLOT_BYTES);
}

/* Re-insert everything into a table of the next size that takes it: TABLE_OK,
 * TABLE_NO_MEMORY, or TABLE_CROWDED when none up to max_cap slots does. */
static int table_grow(table_t *t, size_t max_cap) {
    const size_t stride = t->stride;
    for (size_t cap = t->cap * 2; cap <= max_cap && cap < ((size_t)1 << 58); cap *= 2) {
        table_t bigger;
        if (table_init(&bigger, cap, t->skip, stride) != TABLE_OK) return TABLE_NO_MEMORY;
        int put = PUT_DONE;
        for (size_t i = 0; i < t->size && put == PUT_DONE; i++) {
            const slot_t *x = slot_at(t->slots, i, stride);
            if (x->idx < 0) continue;
            put = stride == sizeof(slot_t) ? table_put(&bigger, x->hi, x->lo, x->idx)
                                           : table_put_event(&bigger, x->hi, x->lo, x->idx, *event_of(x));
        }
        if (put == PUT_DONE) {
            bigger.records = t->records; /* re-inserting costs no budget */
            bigger.probes = t->probes;
            free(t->slots);
            *t = bigger;
            return TABLE_OK;
        }
        free(bigger.slots);
    }
    return TABLE_CROWDED;
}

static inline int slot_less(const slot_t *a, const slot_t *b) {
    return a->hi < b->hi || (a->hi == b->hi && a->lo < b->lo);
}

static int slot_cmp(const void *a, const void *b) {
    const slot_t *x = a, *y = b;
    return slot_less(x, y) ? -1 : slot_less(y, x) ? 1 : 0;
}

/* Copies the occupied slots (of `stride` bytes) of src[0 .. size) to dst in slot order
 * (dst may be src) and sorts them: an insertion sort moves the few keys that sit past a
 * bigger one (qsort if crafted keys make that long).  Returns how many there are. */
static ALWAYS_INLINE size_t sort_occupied_as(const slot_t *src, size_t size, slot_t *dst, const size_t stride) {
    size_t m = 0;
    for (size_t i = 0; i < size; i++) {
        const slot_t *x = slot_at(src, i, stride);
        if (x->idx >= 0) memmove(slot_at(dst, m++, stride), x, stride);
    }
    size_t moves = 0, budget = 64 * m + 1024;
    union {
        slot_t key;
        unsigned char bytes[EVENT_SLOT_BYTES];
    } held;
    for (size_t i = 1; i < m && moves <= budget; i++) {
        memcpy(held.bytes, slot_at(dst, i, stride), stride);
        size_t j = i;
        while (j > 0 && slot_less(&held.key, slot_at(dst, j - 1, stride))) {
            memcpy(slot_at(dst, j, stride), slot_at(dst, j - 1, stride), stride);
            j--;
            moves++;
        }
        memcpy(slot_at(dst, j, stride), held.bytes, stride);
    }
    if (moves > budget) qsort(dst, m, stride, slot_cmp);
    return m;
}

static size_t sort_occupied(const table_t *t, slot_t *dst) {
    return t->stride == sizeof(slot_t) ? sort_occupied_as(t->slots, t->size, dst, sizeof(slot_t))
                                       : sort_occupied_as(t->slots, t->size, dst, EVENT_SLOT_BYTES);
}

/* The lookup filter: most keys looked up in a kept table are not in it (an incremental
 * run looks every key of the previous compacted ledger up among the few new ones), and
 * a table miss is a trip to memory.  One bit per value of the low hash's low bits, 16
 * to 32 bits per key, answers most misses from the CPU's cache (about one in 16 passes
 * it for nothing); the low hash is independent of the high one the home slot is taken
 * from.  Built only while it fits in a cache, where it pays. */
#define FILTER_BITS_PER_KEY 16
#define FILTER_MAX_BYTES ((size_t)8 << 20)

static void table_drop_filter(table_t *t) {
    free(t->filter);
    t->filter = NULL;
    t->fmask = 0;
}

static void table_build_filter(table_t *t) {
    table_drop_filter(t);
    if (!t->slots || !t->count || t->count > FILTER_MAX_BYTES * 8 / FILTER_BITS_PER_KEY) return;
    size_t bits = (size_t)1 << 12;
    while (bits < t->count * FILTER_BITS_PER_KEY) bits <<= 1;
    uint64_t *f = calloc(bits / 64, sizeof(uint64_t));
    if (!f) return; /* lookups work without it */
    uint64_t mask = (uint64_t)bits - 1;
    for (size_t i = 0; i < t->size; i++) {
        const slot_t *x = slot_at(t->slots, i, t->stride);
        if (x->idx >= 0) {
            uint64_t b = x->lo & mask;
            f[b >> 6] |= (uint64_t)1 << (b & 63);
        }
    }
    t->filter = f;
    t->fmask = mask;
}

static inline int filter_may_hold(const uint64_t *f, uint64_t fmask, uint64_t lo) {
    uint64_t b = lo & fmask;
    return (int)((f[b >> 6] >> (b & 63)) & 1);
}

/* Fills t with the distinct keys: TABLE_OK, or TABLE_NO_MEMORY or TABLE_CROWDED with
 * nothing left to free. */
static int latest_keys(const uint64_t *hi, const uint64_t *lo, Py_ssize_t n, table_t *t) {
    /* small to begin with (a key map is often far smaller than its records), then doubled:
     * growing re-inserts keys that are nearly in order, which costs little */
    size_t cap0 = cap_for((size_t)n < ((size_t)1 << 15) ? (size_t)n : ((size_t)1 << 15));
    if (table_init(t, cap0, 0, sizeof(slot_t)) != TABLE_OK) return TABLE_NO_MEMORY;
    /* A crowded stretch of the table usually means sorted keys (a finished map merged
     * with new records): doubling spreads them out.  Only once the table has room for
     * every record as its own key is a crowd taken for crafted keys. */
    size_t max_cap = cap_for((size_t)n) * 2 > cap0 ? cap_for((size_t)n) * 2 : cap0;
    int rc = TABLE_OK;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) __builtin_prefetch(t->slots + home(t, ld64(hi + i + PREFETCH_AHEAD)), 1, 3);
        t->records++;
        while (table_put(t, ld64(hi + i), ld64(lo + i), i) != PUT_DONE)
            if ((rc = table_grow(t, max_cap)) != TABLE_OK) goto fail;
        if (too_full(t) && (rc = table_grow(t, max_cap)) != TABLE_OK) goto fail;
        if (over_budget(t)) {
            rc = TABLE_CROWDED;
            goto fail;
        }
    }
    return TABLE_OK;
fail:
    free(t->slots);
    t->slots = NULL;
    return rc;
}

/* A buffer of 64-bit integers (hashes: any integer code; positions: signed). */
static int get_int64_view(PyObject *obj, Py_buffer *view, const char *what, int want_signed) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (!is_int64(view, want_signed)) {
        PyErr_Format(PyExc_ValueError, "%s must be a buffer of %s64-bit integers", what,
                     want_signed ? "signed " : "");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* The two halves of the hashes (hi, lo), as views of one length; -1 with an exception
 * set and nothing held on error. */
static int get_hash_views(PyObject *hi_obj, PyObject *lo_obj, Py_buffer *hi, Py_buffer *lo) {
    if (get_int64_view(hi_obj, hi, "hi", 0) < 0) return -1;
    if (get_int64_view(lo_obj, lo, "lo", 0) < 0) {
        PyBuffer_Release(hi);
        return -1;
    }
    if (hi->len != lo->len) {
        PyErr_SetString(PyExc_ValueError, "hi and lo must have one length");
        PyBuffer_Release(hi);
        PyBuffer_Release(lo);
        return -1;
    }
    return 0;
}

/* The sorted keys of a table as bytearrays (hi, lo, pos), and with `event` not NULL
 * (an event table's) their event times, from `sorted`, which holds m slots of `stride`
 * bytes. */
static PyObject *keys_tuple(const slot_t *sorted, size_t m, size_t stride, PyObject *hi, PyObject *lo, PyObject *pos,
                            PyObject *event) {
    uint64_t *h = (uint64_t *)PyByteArray_AS_STRING(hi), *l = (uint64_t *)PyByteArray_AS_STRING(lo);
    int64_t *p = (int64_t *)PyByteArray_AS_STRING(pos);
    int64_t *e = event ? (int64_t *)PyByteArray_AS_STRING(event) : NULL;
    for (size_t i = 0; i < m; i++) {
        const slot_t *x = slot_at(sorted, i, stride);
        h[i] = x->hi;
        l[i] = x->lo;
        p[i] = x->idx;
        if (e) e[i] = *event_of(x);
    }
    return event ? PyTuple_Pack(4, hi, lo, pos, event) : PyTuple_Pack(3, hi, lo, pos);
}

PyDoc_STRVAR(latest_of_each_key_doc,
             "latest_of_each_key(hi, lo) -> bytearray\n\n"
             "For uint64 buffers hi and lo (one 128-bit hash per record), the index of the last\n"
             "occurrence of every distinct hash, ordered by (hi, lo), as native int64 values;\n"
             "None when many keys share their top hash bits (crafted keys), for the caller to\n"
             "sort instead.");

static PyObject *py_latest_of_each_key(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *hi_obj, *lo_obj;
    if (!PyArg_ParseTuple(args, "OO", &hi_obj, &lo_obj)) return NULL;
    Py_buffer hi, lo;
    if (get_hash_views(hi_obj, lo_obj, &hi, &lo) < 0) return NULL;
    PyObject *result = NULL;
    table_t t;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = latest_keys(hi.buf, lo.buf, hi.len / 8, &t);
    if (rc == TABLE_OK) t.count = sort_occupied(&t, t.slots);
    Py_END_ALLOW_THREADS
    if (rc == TABLE_CROWDED) {
        result = Py_NewRef(Py_None); /* the caller sorts instead */
        goto done;
    }
    if (rc != TABLE_OK) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)t.count * 8);
    if (result) {
        int64_t *out = (int64_t *)PyByteArray_AS_STRING(result);
        for (size_t i = 0; i < t.count; i++) out[i] = t.slots[i].idx;
    }
    free(t.slots);
done:
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return result;
}

PyDoc_STRVAR(distinct_estimate_doc,
             "distinct_estimate(his) -> int\n\n"
             "About how many distinct values the uint64 buffers in the sequence his hold together\n"
             "(HyperLogLog, 16,384 registers: within a few per cent), for sizing a table before\n"
             "filling it.");

#define HLL_BITS 14

static PyObject *py_distinct_estimate(PyObject *Py_UNUSED(self), PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "his must be a sequence of buffers");
    if (!seq) return NULL;
    uint8_t *reg = calloc((size_t)1 << HLL_BITS, 1);
    if (!reg) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_buffer v;
        if (get_int64_view(PySequence_Fast_GET_ITEM(seq, j), &v, "hi", 0) < 0) goto done;
        const uint64_t *h = v.buf;
        Py_ssize_t n = v.len / 8;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t x = ld64(h + i);
            /* register: the top bits; rank: leading zeros of the rest, plus one */
            uint64_t w = (x << HLL_BITS) | ((uint64_t)1 << (HLL_BITS - 1));
            uint8_t r = (uint8_t)(__builtin_clzll(w) + 1);
            size_t at = (size_t)(x >> (64 - HLL_BITS));
            if (r > reg[at]) reg[at] = r;
        }
        Py_END_ALLOW_THREADS
        PyBuffer_Release(&v);
    }
    double m = (double)((size_t)1 << HLL_BITS), sum = 0;
    size_t zeros = 0;
    for (size_t i = 0; i < ((size_t)1 << HLL_BITS); i++) {
        sum += ldexp(1.0, -reg[i]);
        zeros += reg[i] == 0;
    }
    double e = 0.7213 / (1 + 1.079 / m) * m * m / sum;
    if (e <= 2.5 * m && zeros) e = m * log(m / (double)zeros); /* few values: linear counting */
    result = PyLong_FromDouble(e + 0.5);
done:
    free(reg);
    Py_DECREF(seq);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* KeyTable: the same table, kept between calls                                          */
/*
 * Pass one adds the records of many ledgers, in position order, to one table and reads
 * it out once, instead of merging sorted runs.  A record's position is given (or is
 * `first` plus its index); the table keeps the greatest position of each key, or in an
 * event table (event-time order) the greatest (event time, position).  Lookups may run
 * in several threads at once; a call that changes the table (add, finish) made while
 * any other call runs on it (they run without the interpreter lock) raises instead of
 * racing it.
 */

typedef struct {
    PyObject_HEAD
    table_t t;     /* t.slots is NULL until the first record arrives and after finish() */
    size_t cap0;   /* the size asked for at creation, used by the first add */
    size_t stride; /* bytes a slot: sizeof(slot_t), or EVENT_SLOT_BYTES in an event table */
    int busy;      /* an add or finish is running (they change the table) */
    int readers;   /* lookups running (they may run side by side) */
} KeyTableObject;

static void keytable_dealloc(KeyTableObject *self) {
    free(self->t.slots);
    free(self->t.filter);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *keytable_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"expected", "with_events", NULL};
    Py_ssize_t expected = 0;
    int with_events = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|np", kwlist, &expected, &with_events)) return NULL;
    KeyTableObject *self = (KeyTableObject *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    memset(&self->t, 0, sizeof(table_t));
    /* room for `expected` keys from the first add: no growing, and sorted keys (a
     * finished map) spread over the whole table instead of crowding its start */
    self->cap0 = cap_for(expected > 0 ? (size_t)expected : ((size_t)1 << 15));
    self->stride = with_events ? EVENT_SLOT_BYTES : sizeof(slot_t);
    self->busy = 0;
    self->readers = 0;
    return (PyObject *)self;
}

/* Both run under the interpreter lock, so the flags need no atomics. */
static int keytable_enter(KeyTableObject *self, int reading) {
    if (self->busy || (!reading && self->readers)) {
        PyErr_SetString(PyExc_RuntimeError, "KeyTable changed by one thread while another uses it");
        return -1;
    }
    if (reading)
        self->readers++;
    else
        self->busy = 1;
    return 0;
}

/* Crowding in a stateful table can only come from keys crafted to share their top hash
 * bits (records arrive in position order, hashes at random): the table may grow past
 * half load to spread them, up to this many slots per key, then gives up. */
#define CROWD_SLOTS_PER_KEY 8
#define PICK_BLOCK 4096

PyDoc_STRVAR(keytable_add_doc,
             "add(hi, lo, pos=None, first=0, part_shift=64, part=0, event=None) -> int\n\n"
             "Add records: uint64 hashes hi and lo, int64 positions pos >= 0 (or first, first + 1,\n"
             "... when pos is None), and for an event table (and only for one) their int64 event\n"
             "times.  With part_shift < 64 only records whose hi >> part_shift equals part are\n"
             "added (every add to one table uses one part_shift).  Returns how many records were\n"
             "taken: all of them, or fewer when crafted keys crowd the table (the rest are for the\n"
             "caller to handle).");

/* KeyTable.add's records: the caller's buffers (each value read once, checked, then used). */
typedef struct {
    const uint64_t *hi, *lo; /* at any alignment */
    const int64_t *pos;      /* at any alignment; NULL: positions first, first + 1, ... */
    const int64_t *event;    /* at any alignment; an event table's only */
    int64_t first;
    Py_ssize_t n;
    int part_shift; /* 64: every record; otherwise those whose hi >> part_shift is part */
    uint64_t part;
} add_job_t;

/* The indexes (from b) of the records of [b, end) in this table's part, picked without
 * a branch: a branch on a random hash bit would be mispredicted every other record, and
 * each miss would cancel the table reads already under way.  Returns how many. */
static inline Py_ssize_t pick_mine(const add_job_t *j, Py_ssize_t b, Py_ssize_t end, uint32_t *mine) {
    Py_ssize_t m = 0;
    if (j->part_shift < 64) {
        const uint64_t *h = j->hi;
        const int part_shift = j->part_shift;
        const uint64_t part = j->part;
        for (Py_ssize_t i = b; i < end; i++) {
            mine[m] = (uint32_t)(i - b);
            m += (ld64(h + i) >> part_shift) == part;
        }
    } else {
        for (Py_ssize_t i = b; i < end; i++) mine[m++] = (uint32_t)(i - b);
    }
    return m;
}

/* Puts one record (key hi, lo at position at, of this event time in an event table) into
 * t, growing t when it runs out of room: TABLE_OK; TABLE_CROWDED when crafted keys crowd
 * it (or the probes went over budget) and no more records are to be taken, with *in set
 * when this one went in before that was found; TABLE_NO_MEMORY. */
static ALWAYS_INLINE int table_add_one(table_t *t, uint64_t hi, uint64_t lo, int64_t at, int64_t event, int *in,
                                       const size_t stride) {
    int rc = TABLE_OK, put;
    *in = 0;
    t->records++;
    while ((put = table_put_as(t, hi, lo, at, event, stride)) != PUT_DONE) {
        size_t max_cap = (t->count + 1) * CROWD_SLOTS_PER_KEY + ((size_t)1 << 16);
        if (put == PUT_CROWDED && t->cap >= max_cap) break;
        if ((rc = table_grow(t, put == PUT_CROWDED ? max_cap * 2 : (size_t)1 << 58)) != TABLE_OK) break;
    }
    if (put != PUT_DONE) {
        t->records--;
        return rc != TABLE_OK ? rc : TABLE_CROWDED; /* not taken */
    }
    if (too_full(t) && (rc = table_grow(t, (size_t)1 << 58)) != TABLE_OK) return rc;
    if (over_budget(t)) {
        *in = 1;
        return TABLE_CROWDED;
    }
    return TABLE_OK;
}

/* Adds the job's records to t (of slots of `stride` bytes), block by block: first the
 * indexes of the block's records that are in this table's part are picked, then those
 * are put, reading ahead of the one at hand.  TABLE_OK with *taken = n; otherwise why
 * not, with *taken the records taken before (TABLE_CROWDED), or the index of the
 * negative position (TABLE_NEGATIVE_POSITION). */
static ALWAYS_INLINE int table_add_records_as(table_t *t, const add_job_t *j, Py_ssize_t *taken,
                                              const size_t stride) {
    const int events = stride != sizeof(slot_t);
    const uint64_t *h = j->hi, *l = j->lo;
    const int64_t *ps = j->pos, *ev = j->event;
    const int64_t first = j->first;
    const Py_ssize_t n = j->n;
    uint32_t mine[PICK_BLOCK];
    int rc = TABLE_OK;
    Py_ssize_t i = 0;
    for (Py_ssize_t b = 0; b < n && rc == TABLE_OK; b += PICK_BLOCK) {
        Py_ssize_t end = b + PICK_BLOCK < n ? b + PICK_BLOCK : n, m = pick_mine(j, b, end, mine);
        for (Py_ssize_t k = 0; k < m; k++) {
            i = b + mine[k];
            if (k + PREFETCH_AHEAD < m)
                __builtin_prefetch(slot_at(t->slots, home(t, ld64(h + b + mine[k + PREFETCH_AHEAD])), stride), 1, 3);
            int64_t at = ps ? (int64_t)ld64((const uint64_t *)(ps + i)) : first + i;
            if (at < 0) {
                rc = TABLE_NEGATIVE_POSITION;
                break;
            }
            int64_t event = events ? (int64_t)ld64((const uint64_t *)(ev + i)) : 0;
            int in;
            if ((rc = table_add_one(t, ld64(h + i), ld64(l + i), at, event, &in, stride)) != TABLE_OK) {
                i += in;
                break;
            }
        }
        if (rc == TABLE_OK) i = end;
    }
    *taken = i;
    return rc;
}

static int table_add_records(table_t *t, const add_job_t *j, Py_ssize_t *taken) {
    return t->stride == sizeof(slot_t) ? table_add_records_as(t, j, taken, sizeof(slot_t))
                                       : table_add_records_as(t, j, taken, EVENT_SLOT_BYTES);
}

/* Readies the table for records of this part_shift (skip: 64 - part_shift) when there are
 * n; -1 with an exception set. */
static int keytable_prepare_add(KeyTableObject *self, int skip, Py_ssize_t n) {
    table_t *t = &self->t;
    table_drop_filter(t); /* the keys change; lookups after this add work without it */
    if (t->slots && t->skip != skip) {
        if (t->count) {
            PyErr_SetString(PyExc_ValueError, "every add to one table must use the same part_shift");
            return -1;
        }
        free(t->slots); /* nothing in it yet: start again with this part_shift */
        t->slots = NULL;
    }
    if (!t->slots && n && table_init(t, self->cap0, skip, self->stride) != TABLE_OK) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The event times of KeyTable.add into `event` (NULL obj: none given), checked against the
 * kind of table and the records' count: 0, or -1 with an exception set and nothing held. */
static int get_add_events(const KeyTableObject *self, PyObject *obj, Py_buffer *event, Py_ssize_t n) {
    int events = self->stride != sizeof(slot_t);
    if ((obj != NULL) != events) {
        PyErr_SetString(PyExc_ValueError, events ? "an event table needs the records' event times (event=)"
                                                 : "this table keeps no event times (event= is for an event table)");
        return -1;
    }
    if (!events) return 0;
    if (get_int64_view(obj, event, "event", 1) < 0) return -1;
    if (event->len / 8 != n) {
        PyErr_SetString(PyExc_ValueError, "hi, lo and event must have one length");
        PyBuffer_Release(event);
        return -1;
    }
    return 0;
}

static PyObject *keytable_add(KeyTableObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"hi", "lo", "pos", "first", "part_shift", "part", "event", NULL};
    PyObject *hi_obj, *lo_obj, *pos_obj = Py_None, *event_obj = Py_None;
    long long first = 0;
    int part_shift = 64;
    unsigned long long part = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|OLiKO", kwlist, &hi_obj, &lo_obj, &pos_obj, &first, &part_shift,
                                     &part, &event_obj))
        return NULL;
    if (part_shift < 1 || part_shift > 64) {
        PyErr_SetString(PyExc_ValueError, "part_shift must be between 1 and 64");
        return NULL;
    }
    Py_buffer hi, lo, pos = {0}, event = {0};
    if (get_hash_views(hi_obj, lo_obj, &hi, &lo) < 0) return NULL;
    PyObject *result = NULL;
    int have_pos = pos_obj != Py_None, entered = 0;
    Py_ssize_t n = hi.len / 8, taken;
    if (get_add_events(self, event_obj != Py_None ? event_obj : NULL, &event, n) < 0) goto done;
    if (have_pos && get_int64_view(pos_obj, &pos, "pos", 1) < 0) goto done;
    if (have_pos && pos.len != hi.len) {
        PyErr_SetString(PyExc_ValueError, "hi, lo and pos must have one length");
        goto done;
    }
    if (!have_pos && (first < 0 || first > INT64_MAX - n)) {
        PyErr_SetString(PyExc_ValueError, "positions must lie between 0 and 2**63 - 1");
        goto done;
    }
    if (keytable_enter(self, 0) < 0) goto done;
    entered = 1;
    if (keytable_prepare_add(self, 64 - part_shift, n) < 0) goto done;
    const add_job_t job = {.hi = hi.buf, .lo = lo.buf, .pos = have_pos ? pos.buf : NULL, .event = event.buf,
                           .first = (int64_t)first, .n = n, .part_shift = part_shift, .part = (uint64_t)part};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = table_add_records(&self->t, &job, &taken);
    Py_END_ALLOW_THREADS
    if (rc == TABLE_NO_MEMORY)
        PyErr_NoMemory();
    else if (rc == TABLE_NEGATIVE_POSITION)
        PyErr_Format(PyExc_ValueError, "position %zd is negative", taken);
    else
        result = PyLong_FromSsize_t(taken); /* all of them (TABLE_OK), or those before (TABLE_CROWDED) */
done:
    if (entered) self->busy = 0;
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    if (pos.obj) PyBuffer_Release(&pos);
    if (event.obj) PyBuffer_Release(&event);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* Records partitioned by hash, then put stretch by stretch                              */
/*
 * A table of a million keys spans tens of megabytes, and records put in position order
 * land anywhere in it: most puts wait on memory, the more so with a thread per part of
 * the hash range sharing the caches.  partition_keys groups a chunk of records by the top
 * bits of their hash (one pass that reads and writes each record once), and
 * KeyTable.add_grouped puts a part's groups in one after the other: a key's home slot
 * grows with its hash, so each group lands in one stretch of the table, a fraction of a
 * core's L2 cache, which stays cached while it goes in.  The table keeps each key's
 * greatest position whatever order its records arrive in, so it ends as add() would
 * leave it.
 */

#define GROUP_MAX_BITS 16

/* One run of partition_keys: (hi, lo, pos, first) with add()'s meanings. */
static int get_plain_run(PyObject *run, add_job_t *j, Py_buffer v[3]) {
    PyObject *hi_obj, *lo_obj, *pos_obj;
    long long first;
    if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 4) {
        PyErr_SetString(PyExc_TypeError, "each run must be a tuple (hi, lo, pos, first)");
        return -1;
    }
    if (!PyArg_ParseTuple(run, "OOOL", &hi_obj, &lo_obj, &pos_obj, &first)) return -1;
    if (get_hash_views(hi_obj, lo_obj, &v[0], &v[1]) < 0) return -1;
    Py_ssize_t n = v[0].len / 8;
    if (pos_obj != Py_None) {
        if (get_int64_view(pos_obj, &v[2], "pos", 1) < 0) return -1;
        if (v[2].len != v[0].len) {
            PyErr_SetString(PyExc_ValueError, "hi, lo and pos must have one length");
            return -1;
        }
    } else if (first < 0 || first > INT64_MAX - n) {
        PyErr_SetString(PyExc_ValueError, "positions must lie between 0 and 2**63 - 1");
        return -1;
    }
    *j = (add_job_t){.hi = v[0].buf, .lo = v[1].buf, .pos = v[2].obj ? v[2].buf : NULL, .first = (int64_t)first,
                     .n = n, .part_shift = 64};
    return 0;
}

/* Counts each group's records and checks the positions: the index (through the runs) of
 * the first negative one, or -1. */
static Py_ssize_t group_count(const add_job_t *jobs, Py_ssize_t k, int bits, int64_t *ends) {
    Py_ssize_t seen = 0;
    for (Py_ssize_t r = 0; r < k; r++) {
        const add_job_t *j = jobs + r;
        for (Py_ssize_t i = 0; i < j->n; i++) ends[ld64(j->hi + i) >> (64 - bits)]++;
        if (j->pos)
            for (Py_ssize_t i = 0; i < j->n; i++)
                if ((int64_t)ld64((const uint64_t *)(j->pos + i)) < 0) return seen + i;
        seen += j->n;
    }
    return -1;
}

/* Slots ahead of a group's next record that are made ready for writing: a record goes to
 * any of up to a few hundred groups, too many streams for the hardware to see coming. */
#define GROUP_WRITE_AHEAD 16

/* Writes the runs' records as slots, grouped (ends[g]: group g's records counted, then
 * where they end; at: room for one cursor a group). */
static void group_scatter(const add_job_t *jobs, Py_ssize_t k, int bits, int64_t *ends, int64_t *at, slot_t *out) {
    const size_t groups = (size_t)1 << bits;
    int64_t sum = 0;
    for (size_t g = 0; g < groups; g++) {
        at[g] = sum;
        sum += ends[g];
        ends[g] = sum;
    }
    for (Py_ssize_t r = 0; r < k; r++) {
        const add_job_t *j = jobs + r;
        for (Py_ssize_t i = 0; i < j->n; i++) {
            uint64_t hi = ld64(j->hi + i);
            slot_t *x = out + at[hi >> (64 - bits)]++;
            __builtin_prefetch((const void *)((uintptr_t)x + GROUP_WRITE_AHEAD * sizeof(slot_t)), 1, 3);
            x->hi = hi;
            x->lo = ld64(j->lo + i);
            x->idx = j->pos ? (int64_t)ld64((const uint64_t *)(j->pos + i)) : j->first + i;
        }
    }
}

PyDoc_STRVAR(partition_keys_doc,
             "partition_keys(runs, bits, out=None) -> (records, ends)\n\n"
             "The records of runs (tuples (hi, lo, pos, first) with KeyTable.add's meanings; pos\n"
             "may be None) grouped by the top `bits` bits of hi (1 to 16), in their order within\n"
             "each group: records holds (hi, lo, position) as native 64-bit values, 24 bytes a\n"
             "record (in out, a bytearray, when it is big enough: its first bytes); ends the int64\n"
             "index where each group's records end.  For KeyTable.add_grouped.");

static PyObject *py_partition_keys(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *runs_obj, *out = Py_None;
    int bits;
    if (!PyArg_ParseTuple(args, "Oi|O", &runs_obj, &bits, &out)) return NULL;
    if (out != Py_None && !PyByteArray_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "out must be a bytearray");
        return NULL;
    }
    if (bits < 1 || bits > GROUP_MAX_BITS) {
        PyErr_Format(PyExc_ValueError, "bits must be between 1 and %d", GROUP_MAX_BITS);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(runs_obj, "runs must be a sequence of tuples");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), got = 0, n = 0, bad = -1;
    add_job_t *jobs = calloc((size_t)(k ? k : 1), sizeof(add_job_t));
    Py_buffer *v = calloc((size_t)(k ? k : 1) * 3, sizeof(Py_buffer));
    PyObject *records = NULL, *ends = NULL, *result = NULL;
    int64_t *at = NULL;
    if (!jobs || !v) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < k; got++) {
        if (get_plain_run(PySequence_Fast_GET_ITEM(seq, got), jobs + got, v + 3 * got) < 0) {
            got++;
            goto done;
        }
        n += jobs[got].n;
    }
    /* a bytearray handed back from the chunk before: its pages are already there, where a
     * fresh one's would each cost a fault */
    if (out != Py_None && PyByteArray_GET_SIZE(out) >= n * (Py_ssize_t)sizeof(slot_t))
        records = Py_NewRef(out);
    else
        records = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(slot_t));
    ends = PyByteArray_FromStringAndSize(NULL, ((Py_ssize_t)1 << bits) * 8);
    if (!records || !ends) goto done;
    if (!(at = malloc(((size_t)1 << bits) * sizeof(int64_t)))) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *e = (int64_t *)PyByteArray_AS_STRING(ends);
    memset(e, 0, ((size_t)1 << bits) * 8);
    Py_BEGIN_ALLOW_THREADS
    bad = group_count(jobs, k, bits, e);
    if (bad < 0) group_scatter(jobs, k, bits, e, at, (slot_t *)PyByteArray_AS_STRING(records));
    Py_END_ALLOW_THREADS
    if (bad >= 0)
        PyErr_Format(PyExc_ValueError, "position %zd is negative", bad);
    else
        result = PyTuple_Pack(2, records, ends);
done:
    for (Py_ssize_t i = 0; i < 3 * got; i++)
        if (v && v[i].obj) PyBuffer_Release(&v[i]);
    free(at);
    free(v);
    free(jobs);
    Py_XDECREF(records);
    Py_XDECREF(ends);
    Py_DECREF(seq);
    return result;
}

/* One source of add_grouped: its records and where each group ends. */
typedef struct {
    const slot_t *rec;
    const int64_t *ends;
    Py_ssize_t n;
} grouped_t;

/* Puts groups [g0, g1) of every source into t (plain slots), group by group: TABLE_OK,
 * TABLE_CROWDED, TABLE_NO_MEMORY, or TABLE_NEGATIVE_POSITION / -4 (a record outside its
 * table's part) for records that partition_keys would not have written. */
#define TABLE_FOREIGN_RECORD (-4)

static int table_add_grouped(table_t *t, const grouped_t *src, Py_ssize_t k, size_t g0, size_t g1, int part_shift,
                             uint64_t part) {
    for (size_t g = g0; g < g1; g++) {
        for (Py_ssize_t s = 0; s < k; s++) {
            const slot_t *rec = src[s].rec;
            size_t a = g ? (size_t)src[s].ends[g - 1] : 0, b = (size_t)src[s].ends[g];
            for (size_t i = a; i < b; i++) {
                if (i + PREFETCH_AHEAD < b)
                    __builtin_prefetch(t->slots + home(t, rec[i + PREFETCH_AHEAD].hi), 1, 3);
                const slot_t *x = rec + i;
                if (x->idx < 0) return TABLE_NEGATIVE_POSITION;
                if (part_shift < 64 && (x->hi >> part_shift) != part) return TABLE_FOREIGN_RECORD;
                int in, rc = table_add_one(t, x->hi, x->lo, x->idx, 0, &in, sizeof(slot_t));
                if (rc != TABLE_OK) return rc;
            }
        }
    }
    return TABLE_OK;
}

/* The sources of add_grouped into src (buffers held in v): the number of groups, or -1
 * with an exception set. */
static Py_ssize_t get_grouped(PyObject *seq, grouped_t *src, Py_buffer *v, Py_ssize_t *held) {
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), groups = -1;
    for (Py_ssize_t s = 0; s < k; s++) {
        PyObject *pair = PySequence_Fast_GET_ITEM(seq, s), *rec_obj, *ends_obj;
        if (!PyTuple_Check(pair) || !PyArg_ParseTuple(pair, "OO", &rec_obj, &ends_obj)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "each group source must be a pair (records, ends)");
            return -1;
        }
        if (PyObject_GetBuffer(rec_obj, &v[2 * s], PyBUF_C_CONTIGUOUS) < 0) return -1;
        (*held)++;
        if (get_int64_view(ends_obj, &v[2 * s + 1], "ends", 1) < 0) return -1;
        (*held)++;
        Py_ssize_t m = v[2 * s + 1].len / 8, n = v[2 * s].len / (Py_ssize_t)sizeof(slot_t);
        const int64_t *e = v[2 * s + 1].buf;
        int ok = v[2 * s].len % (Py_ssize_t)sizeof(slot_t) == 0 && m > 0 && (m & (m - 1)) == 0 &&
                 (groups < 0 || m == groups) && ((uintptr_t)v[2 * s].buf % 8) == 0 && ((uintptr_t)e % 8) == 0;
        for (Py_ssize_t g = 0; ok && g < m; g++) ok = e[g] >= (g ? e[g - 1] : 0) && e[g] <= n;
        if (!ok) {
            PyErr_SetString(PyExc_ValueError, "group sources must be partition_keys() results of one bits");
            return -1;
        }
        groups = m;
        src[s] = (grouped_t){.rec = v[2 * s].buf, .ends = e, .n = n};
    }
    return groups;
}

PyDoc_STRVAR(keytable_add_grouped_doc,
             "add_grouped(sources, part_shift=64, part=0) -> bool\n\n"
             "Put the records of partition_keys() results (pairs (records, ends), one bits for\n"
             "all) whose group lies in this table's part (hi >> part_shift == part; the groups'\n"
             "bits must cover those of the part), group after group.  The table ends as add()\n"
             "of the same records would leave it.  False when crafted keys crowd the table: some\n"
             "of the records may then be in it (each at its own position), the others not.");

static PyObject *keytable_add_grouped(KeyTableObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"sources", "part_shift", "part", NULL};
    PyObject *src_obj;
    int part_shift = 64;
    unsigned long long part = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|iK", kwlist, &src_obj, &part_shift, &part)) return NULL;
    if (part_shift < 1 || part_shift > 64) {
        PyErr_SetString(PyExc_ValueError, "part_shift must be between 1 and 64");
        return NULL;
    }
    if (self->stride != sizeof(slot_t)) {
        PyErr_SetString(PyExc_ValueError, "add_grouped is for a table without event times");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(src_obj, "sources must be a sequence of pairs");
    if (!seq) return NULL;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(seq), held = 0, n = 0;
    grouped_t *src = calloc((size_t)(k ? k : 1), sizeof(grouped_t));
    Py_buffer *v = calloc((size_t)(k ? k : 1) * 2, sizeof(Py_buffer));
    PyObject *result = NULL;
    int entered = 0;
    if (!src || !v) {
        PyErr_NoMemory();
        goto done;
    }
    if (!k) {
        result = Py_NewRef(Py_True);
        goto done;
    }
    Py_ssize_t groups = get_grouped(seq, src, v, &held);
    if (groups < 0) goto done;
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < groups) bits++;
    int own = 64 - part_shift; /* the bits that choose the part */
    if (bits < own || (own > 0 && part >> own)) {
        PyErr_SetString(PyExc_ValueError, "the groups must split the table's part of the hash range");
        goto done;
    }
    for (Py_ssize_t s = 0; s < k; s++) n += src[s].n;
    if (keytable_enter(self, 0) < 0) goto done;
    entered = 1;
    if (keytable_prepare_add(self, own, n) < 0) goto done;
    size_t g0 = own ? (size_t)part << (bits - own) : 0, g1 = own ? ((size_t)part + 1) << (bits - own) : (size_t)groups;
    int rc = TABLE_OK;
    Py_BEGIN_ALLOW_THREADS
    if (n) rc = table_add_grouped(&self->t, src, k, g0, g1, part_shift, (uint64_t)part);
    Py_END_ALLOW_THREADS
    if (rc == TABLE_NO_MEMORY)
        PyErr_NoMemory();
    else if (rc == TABLE_NEGATIVE_POSITION)
        PyErr_SetString(PyExc_ValueError, "a record's position is negative");
    else if (rc == TABLE_FOREIGN_RECORD)
        PyErr_SetString(PyExc_ValueError, "a record lies outside its group's part of the hash range");
    else
        result = PyBool_FromLong(rc == TABLE_OK);
done:
    if (entered) self->busy = 0;
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&v[i]);
    free(v);
    free(src);
    Py_DECREF(seq);
    return result;
}

/* What a lookup writes for each key looked up (each NULL or n long): whether the table
 * holds it; the position it holds for it (-1: none); its event time (0: none). */
typedef struct {
    uint8_t *found;
    int64_t *pos;
    int64_t *event;
} lookup_out_t;

/* The slot of key (hi, lo), or NULL: keys sit at most MAX_PROBES past their home slot,
 * and none is ever removed. */
static ALWAYS_INLINE const slot_t *table_find(const table_t *t, uint64_t hi, uint64_t lo, const size_t stride) {
    size_t s = home(t, hi);
    size_t stop = s + MAX_PROBES < t->size ? s + MAX_PROBES : t->size;
    for (; s < stop; s++) {
        const slot_t *x = slot_at(t->slots, s, stride);
        if (x->idx < 0) return NULL;
        if (x->hi == hi && x->lo == lo) return x;
    }
    return NULL;
}

/* Looks the n keys (h, l) up in t (of slots of `stride` bytes), writing what o asks for. */
static ALWAYS_INLINE void table_lookup_as(const table_t *t, const uint64_t *h, const uint64_t *l, Py_ssize_t n,
                                          const lookup_out_t *o, const size_t stride) {
    const uint64_t *f = t->filter, fmask = t->fmask;
    for (Py_ssize_t i = 0; i < n; i++) {
        const slot_t *x = NULL;
        if (f) {
            /* the filter word two strides ahead, the table slot one stride ahead only
             * when its filter word (fetched a stride ago) lets it through */
            if (i + 2 * PREFETCH_AHEAD < n)
                __builtin_prefetch(f + ((ld64(l + i + 2 * PREFETCH_AHEAD) & fmask) >> 6), 0, 3);
            if (i + PREFETCH_AHEAD < n && filter_may_hold(f, fmask, ld64(l + i + PREFETCH_AHEAD)))
                __builtin_prefetch(slot_at(t->slots, home(t, ld64(h + i + PREFETCH_AHEAD)), stride), 0, 3);
            if (filter_may_hold(f, fmask, ld64(l + i))) x = table_find(t, ld64(h + i), ld64(l + i), stride);
        } else {
            if (i + PREFETCH_AHEAD < n)
                __builtin_prefetch(slot_at(t->slots, home(t, ld64(h + i + PREFETCH_AHEAD)), stride), 0, 3);
            x = table_find(t, ld64(h + i), ld64(l + i), stride);
        }
        if (o->found) o->found[i] = x != NULL;
        if (o->pos) o->pos[i] = x ? x->idx : -1;
        if (o->event) o->event[i] = x ? *event_of(x) : 0;
    }
}

static void table_lookup(const table_t *t, const uint64_t *h, const uint64_t *l, Py_ssize_t n, const lookup_out_t *o) {
    if (!t->slots) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (o->found) o->found[i] = 0;
            if (o->pos) o->pos[i] = -1;
            if (o->event) o->event[i] = 0;
        }
    } else if (t->stride == sizeof(slot_t)) {
        table_lookup_as(t, h, l, n, o, sizeof(slot_t));
    } else {
        table_lookup_as(t, h, l, n, o, EVENT_SLOT_BYTES);
    }
}

PyDoc_STRVAR(keytable_contains_doc,
             "contains(hi, lo) -> bytearray\n\nFor each (hi, lo), 1 when the table holds that key, else 0.");

static PyObject *keytable_contains(KeyTableObject *self, PyObject *args) {
    PyObject *hi_obj, *lo_obj;
    if (!PyArg_ParseTuple(args, "OO", &hi_obj, &lo_obj)) return NULL;
    Py_buffer hi, lo;
    if (get_hash_views(hi_obj, lo_obj, &hi, &lo) < 0) return NULL;
    PyObject *out = NULL;
    if (keytable_enter(self, 1) == 0) {
        if ((out = PyByteArray_FromStringAndSize(NULL, hi.len / 8))) {
            const lookup_out_t o = {.found = (uint8_t *)PyByteArray_AS_STRING(out)};
            Py_BEGIN_ALLOW_THREADS
            table_lookup(&self->t, hi.buf, lo.buf, hi.len / 8, &o);
            Py_END_ALLOW_THREADS
        }
        self->readers--;
    }
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return out;
}

PyDoc_STRVAR(keytable_lookup_doc,
             "lookup(hi, lo) -> (pos, event)\n\n"
             "For each (hi, lo), the position the table holds for that key (-1 where it holds\n"
             "none), as a bytearray of int64 values; and for an event table the event time it\n"
             "holds (0 where none) likewise, None for another table.");

static PyObject *keytable_lookup(KeyTableObject *self, PyObject *args) {
    PyObject *hi_obj, *lo_obj;
    if (!PyArg_ParseTuple(args, "OO", &hi_obj, &lo_obj)) return NULL;
    Py_buffer hi, lo;
    if (get_hash_views(hi_obj, lo_obj, &hi, &lo) < 0) return NULL;
    PyObject *result = NULL;
    if (keytable_enter(self, 1) == 0) {
        Py_ssize_t n = hi.len / 8;
        int events = self->stride != sizeof(slot_t);
        PyObject *pos = PyByteArray_FromStringAndSize(NULL, n * 8);
        PyObject *event = events ? PyByteArray_FromStringAndSize(NULL, n * 8) : Py_NewRef(Py_None);
        if (pos && event) {
            const lookup_out_t o = {.pos = (int64_t *)PyByteArray_AS_STRING(pos),
                                    .event = events ? (int64_t *)PyByteArray_AS_STRING(event) : NULL};
            Py_BEGIN_ALLOW_THREADS
            table_lookup(&self->t, hi.buf, lo.buf, n, &o);
            Py_END_ALLOW_THREADS
            result = PyTuple_Pack(2, pos, event);
        }
        Py_XDECREF(pos);
        Py_XDECREF(event);
        self->readers--;
    }
    PyBuffer_Release(&hi);
    PyBuffer_Release(&lo);
    return result;
}

PyDoc_STRVAR(keytable_finish_doc,
             "finish(keep=False) -> (hi, lo, pos) or (hi, lo, pos, event)\n\n"
             "The keys sorted by (hi, lo) with their greatest position (in an event table: the\n"
             "position and event time of their greatest (event time, position)), as bytearrays\n"
             "of 64-bit values.  The table is left empty, or with keep=True as it was (for\n"
             "lookups).");

static PyObject *keytable_finish(KeyTableObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"keep", NULL};
    int keep = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|p", kwlist, &keep)) return NULL;
    if (keytable_enter(self, 0) < 0) return NULL;
    table_t *t = &self->t;
    size_t m = t->slots ? t->count : 0, stride = self->stride;
    int events = stride != sizeof(slot_t);
    /* everything that can fail first, so that a failure leaves the table as it was */
    PyObject *hi = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)m * 8);
    PyObject *lo = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)m * 8);
    PyObject *pos = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)m * 8);
    PyObject *event = events ? PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)m * 8) : NULL;
    slot_t *sorted = NULL;
    PyObject *result = NULL;
    if (!hi || !lo || !pos || (events && !event)) goto done;
    if (t->slots) {
        sorted = keep ? malloc((m ? m : 1) * stride) : t->slots;
        if (!sorted) {
            PyErr_NoMemory();
            goto done;
        }
        Py_BEGIN_ALLOW_THREADS
        sort_occupied(t, sorted);
        if (keep) table_build_filter(t); /* kept for lookups */
        Py_END_ALLOW_THREADS
    }
    result = keys_tuple(sorted, m, stride, hi, lo, pos, event);
    if (keep) {
        free(sorted);
    } else {
        free(t->slots);
        table_drop_filter(t);
        memset(t, 0, sizeof(table_t));
    }
done:
    self->busy = 0;
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(pos);
    Py_XDECREF(event);
    return result;
}

PyDoc_STRVAR(keytable_prepare_lookups_doc,
             "prepare_lookups() -> None\n\n"
             "Make later contains() and lookup() calls faster when most keys looked up are not in\n"
             "the table (finish(keep=True) does this too).  Any add undoes it.");

static PyObject *keytable_prepare_lookups(KeyTableObject *self, PyObject *Py_UNUSED(args)) {
    if (keytable_enter(self, 0) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    table_build_filter(&self->t);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    Py_RETURN_NONE;
}

static Py_ssize_t keytable_len(KeyTableObject *self) { return (Py_ssize_t)self->t.count; }

static PyObject *keytable_nbytes(KeyTableObject *self, void *Py_UNUSED(closure)) {
    size_t filter = self->t.filter ? ((size_t)self->t.fmask + 1) / 8 : 0;
    return PyLong_FromSize_t(self->t.slots ? self->t.size * self->stride + filter : 0);
}

static PyObject *keytable_with_events(KeyTableObject *self, void *Py_UNUSED(closure)) {
    return PyBool_FromLong(self->stride != sizeof(slot_t));
}

static PyMethodDef keytable_methods[] = {
    {"add", (PyCFunction)(void (*)(void))keytable_add, METH_VARARGS | METH_KEYWORDS, keytable_add_doc},
    {"add_grouped", (PyCFunction)(void (*)(void))keytable_add_grouped, METH_VARARGS | METH_KEYWORDS,
     keytable_add_grouped_doc},
    {"contains", (PyCFunction)keytable_contains, METH_VARARGS, keytable_contains_doc},
    {"lookup", (PyCFunction)keytable_lookup, METH_VARARGS, keytable_lookup_doc},
    {"finish", (PyCFunction)(void (*)(void))keytable_finish, METH_VARARGS | METH_KEYWORDS, keytable_finish_doc},
    {"prepare_lookups", (PyCFunction)keytable_prepare_lookups, METH_NOARGS, keytable_prepare_lookups_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef keytable_getset[] = {
    {"nbytes", (getter)keytable_nbytes, NULL, "Bytes the table takes now.", NULL},
    {"with_events", (getter)keytable_with_events, NULL, "Whether this is an event table.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods keytable_as_sequence = {.sq_length = (lenfunc)keytable_len};

static PyTypeObject KeyTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shale.ledger._kernels.KeyTable",
    .tp_basicsize = sizeof(KeyTableObject),
    .tp_dealloc = (destructor)keytable_dealloc,
    .tp_as_sequence = &keytable_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "KeyTable(expected=0, with_events=False)\n\nThe latest position of every 128-bit key hash, built\n"
              "record by record (with room for `expected` keys from the first add).  With\n"
              "with_events, the position and event time of each key's record with the greatest\n"
              "(event time, position) instead.",
    .tp_methods = keytable_methods,
    .tp_getset = keytable_getset,
    .tp_new = keytable_new,
};

/* ------------------------------------------------------------------------------------ */
/* Early writeback (a system call Python's os module does not offer)                     */

PyDoc_STRVAR(start_writeback_doc,
             "start_writeback(fd, offset, nbytes) -> bool\n\n"
             "Ask the system to start writing bytes [offset, offset + nbytes) of the open file fd\n"
             "to disk, without waiting for them (Linux sync_file_range).  A hint: False where it\n"
             "is not supported or refused; the file must still be synced to be durable.");

static PyObject *py_start_writeback(PyObject *Py_UNUSED(self), PyObject *args) {
    int fd;
    long long offset, nbytes;
    if (!PyArg_ParseTuple(args, "iLL", &fd, &offset, &nbytes)) return NULL;
    if (offset < 0 || nbytes < 0) {
        PyErr_SetString(PyExc_ValueError, "offset and nbytes must not be negative");
        return NULL;
    }
#if defined(__linux__) && defined(SYNC_FILE_RANGE_WRITE)
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sync_file_range(fd, (off_t)offset, (off_t)nbytes, SYNC_FILE_RANGE_WRITE);
    Py_END_ALLOW_THREADS
    if (rc == 0) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

/* ------------------------------------------------------------------------------------ */
/* Records as Arrow buffers                                                              */
/*
 * record_columns and then a gather per column made a dozen arrays per batch, each passed
 * over again by NumPy.  arrow_columns reads the records where check_kept finds them,
 * checks them as record_columns does (and their footer flags), and writes the buffers an
 * Arrow batch is made of: offsets and bytes of keys, values, property names and texts,
 * validity bitmaps, times and the tombstone bits.  A first pass checks every record and
 * counts what each buffer needs; the buffers are then asked of the caller's allocator
 * (pyarrow's pool, which reuses its pages from batch to batch) and filled by a second
 * pass from what the first one read, never from the caller's arrays again.  The entries
 * may lie in one buffer or each in its own (decompressed payloads, read where zstd left
 * them rather than copied side by side first).
 */

enum { AB_KEY_OFFS, AB_KEY_DATA, AB_KEY_VALID, AB_VALUE_OFFS, AB_VALUE_DATA, AB_VALUE_VALID, AB_PUBLISH, AB_EVENT,
       AB_EVENT_VALID, AB_PROP_OFFS, AB_NAME_OFFS, AB_NAME_DATA, AB_PVAL_OFFS, AB_PVAL_DATA, AB_TOMBSTONE, AB_BUFFERS };

/* One record as the first pass read it (inside its entry's buffer), -1 lengths for nil;
 * src_end: where that buffer ends. */
typedef struct {
    const uint8_t *key, *value, *props, *end, *src_end;
    int64_t key_len, value_len, publish, event, pairs;
    uint8_t has_event;
} arrow_row_t;

typedef struct {
    int64_t key_bytes, value_bytes, name_bytes, pval_bytes, pairs, key_nulls, value_nulls, event_nulls;
} arrow_totals_t;

/* check_kept's job, and where each entry's buffer lies when each has its own (NULL: all
 * in j.base). */
typedef struct {
    kept_job_t j;
    const uint8_t **bases;
    const Py_ssize_t *lens;
} arrow_job_t;

#define ARROW_TOO_BIG (-3)

/* Adds n to *sum unless that passes limit (then 0). */
static inline int add_within(int64_t *sum, int64_t n, int64_t limit) {
    if (n > limit - *sum) return 0;
    *sum += n;
    return 1;
}

/* The property names' and texts' bytes of a record read_record accepted (its map at p). */
static int count_property_bytes(const uint8_t *p, const uint8_t *end, int64_t pairs, arrow_totals_t *t) {
    const uint8_t *at;
    int64_t len;
    for (int64_t k = 0; k < pairs; k++) {
        if (!(p = read_str(p, end, &at, &len)) || !add_within(&t->name_bytes, len, INT32_MAX)) return 0;
        if (!(p = read_str(p, end, &at, &len)) || !add_within(&t->pval_bytes, len, INT32_MAX)) return 0;
    }
    return 1;
}

/* First pass: each record of the job read into rows and checked against its footer flags
 * (bit 0 exactly when it has a key, bit 1 exactly when its value is nil or empty), and
 * what the buffers need.  The index into rec of the first bad record, -1, KEPT_BAD_INPUT
 * as first_bad_kept, or ARROW_TOO_BIG when property offsets would not fit 32 bits (or
 * bytes a Py_ssize_t).  Without rows, only whether every index, count and range fits
 * (KEPT_BAD_INPUT or -1), so that one that does not is refused whatever comes before it. */
static Py_ssize_t arrow_rows(const arrow_job_t *a, arrow_row_t *rows, arrow_totals_t *t) {
    const kept_job_t *j = &a->j;
    Py_ssize_t at = 0;
    memset(t, 0, sizeof(*t));
    for (Py_ssize_t e = 0; e < j->entries; e++) {
        const uint8_t *base = a->bases ? a->bases[e] : j->base;
        Py_ssize_t len = a->bases ? a->lens[e] : j->len;
        int64_t frame = (int64_t)ld64(j->frames + e), count = (int64_t)ld64(j->kept + e);
        if (frame < -FRAME_HEADER_BYTES || count < 0 || count > j->n_rec - at) return KEPT_BAD_INPUT;
        for (int64_t k = 0; k < count; k++, at++) {
            int64_t r = (int64_t)ld64(j->rec + at);
            if (r < 0 || r >= j->records) return KEPT_BAD_INPUT;
            int64_t s = frame + FRAME_HEADER_BYTES + (int64_t)ld32(j->offsets + r), z = (int64_t)ld32(j->sizes + r);
            if (!range_inside(s, z, len)) return KEPT_BAD_INPUT;
            if (!rows) continue;
            const uint8_t *end = base + s + z;
            fields_t f;
            if (!read_record(base, base + s, end, &f)) return at;
            uint8_t flags = j->flags[r];
            if (((flags & RECORD_HAS_KEY) != 0) != (f.key_len >= 0) ||
                ((flags & RECORD_TOMBSTONE) != 0) != (f.value_len <= 0))
                return at;
            arrow_row_t *row = rows + at;
            row->key = base + f.key_at, row->key_len = f.key_len;
            row->value = base + f.value_at, row->value_len = f.value_len;
            row->publish = f.publish, row->event = f.event, row->has_event = f.has_event;
            row->props = f.props, row->end = end, row->src_end = base + len, row->pairs = f.pairs;
            t->key_nulls += f.key_len < 0, t->value_nulls += f.value_len < 0, t->event_nulls += !f.has_event;
            /* (rec may name a record many times: its bytes can add up past the buffer's) */
            if (!add_within(&t->key_bytes, f.key_len > 0 ? f.key_len : 0, PY_SSIZE_T_MAX) ||
                !add_within(&t->value_bytes, f.value_len > 0 ? f.value_len : 0, PY_SSIZE_T_MAX))
                return ARROW_TOO_BIG;
            if (f.pairs &&
                (!add_within(&t->pairs, f.pairs, INT32_MAX) || !count_property_bytes(f.props, end, f.pairs, t)))
                return ARROW_TOO_BIG;
        }
    }
    return at == j->n_rec ? -1 : KEPT_BAD_INPUT;
}

/* n bytes from src (whose buffer ends at src_end) to dst (which ends at dst_end); as
 * copy_ranges, a short run is moved as SMALL_COPY bytes where both sides have the room. */
static inline uint8_t *put_bytes(uint8_t *dst, const uint8_t *dst_end, const uint8_t *src, const uint8_t *src_end,
                                 int64_t n) {
    if (n <= SMALL_COPY && src_end - src >= SMALL_COPY && dst_end - dst >= SMALL_COPY)
        memcpy(dst, src, SMALL_COPY);
    else
        memcpy(dst, src, (size_t)n);
    return dst + n;
}

static inline void set_bit(uint8_t *bits, Py_ssize_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* Second pass: the buffers filled from rows (the records' bytes read again only for their
 * properties, every read checked); -1 when those no longer say what they said. */
static int arrow_fill(Py_ssize_t n, const arrow_row_t *rows, const arrow_totals_t *t, uint8_t *const out[AB_BUFFERS],
                      const Py_ssize_t size[AB_BUFFERS]) {
    for (int b = 0; b < AB_BUFFERS; b++)
        if (out[b] && (b == AB_KEY_VALID || b == AB_VALUE_VALID || b == AB_EVENT_VALID || b == AB_TOMBSTONE))
            memset(out[b], 0, (size_t)size[b]);
    int64_t *key_offs = (int64_t *)(void *)out[AB_KEY_OFFS], *value_offs = (int64_t *)(void *)out[AB_VALUE_OFFS];
    int64_t *publish = (int64_t *)(void *)out[AB_PUBLISH], *event = (int64_t *)(void *)out[AB_EVENT];
    int32_t *prop_offs = (int32_t *)(void *)out[AB_PROP_OFFS], *name_offs = (int32_t *)(void *)out[AB_NAME_OFFS];
    int32_t *pval_offs = (int32_t *)(void *)out[AB_PVAL_OFFS];
    uint8_t *kd = out[AB_KEY_DATA], *vd = out[AB_VALUE_DATA], *nd = out[AB_NAME_DATA], *pd = out[AB_PVAL_DATA];
    const uint8_t *kd_end = kd + size[AB_KEY_DATA], *vd_end = vd + size[AB_VALUE_DATA];
    uint8_t *kd0 = kd, *vd0 = vd;
    int64_t names = 0, texts = 0, pair = 0;
    key_offs[0] = value_offs[0] = 0;
    prop_offs[0] = name_offs[0] = pval_offs[0] = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const arrow_row_t *r = rows + i;
        if (r->key_len >= 0) {
            kd = put_bytes(kd, kd_end, r->key, r->src_end, r->key_len);
            if (out[AB_KEY_VALID]) set_bit(out[AB_KEY_VALID], i);
        }
        key_offs[i + 1] = kd - kd0;
        if (r->value_len >= 0) {
            vd = put_bytes(vd, vd_end, r->value, r->src_end, r->value_len);
            if (out[AB_VALUE_VALID]) set_bit(out[AB_VALUE_VALID], i);
        }
        value_offs[i + 1] = vd - vd0;
        publish[i] = r->publish, event[i] = r->event;
        if (r->has_event && out[AB_EVENT_VALID]) set_bit(out[AB_EVENT_VALID], i);
        if (r->key_len >= 0 && r->value_len <= 0) set_bit(out[AB_TOMBSTONE], i);
        const uint8_t *p = r->props, *at;
        int64_t len;
        for (int64_t k = 0; k < r->pairs; k++, pair++) {
            if (pair >= t->pairs || !(p = read_str(p, r->end, &at, &len)) || len > t->name_bytes - names) return -1;
            memcpy(nd + names, at, (size_t)len);
            names += len;
            if (!(p = read_str(p, r->end, &at, &len)) || len > t->pval_bytes - texts) return -1;
            memcpy(pd + texts, at, (size_t)len);
            texts += len;
            name_offs[pair + 1] = (int32_t)names, pval_offs[pair + 1] = (int32_t)texts;
        }
        prop_offs[i + 1] = (int32_t)pair;
    }
    return pair == t->pairs && names == t->name_bytes && texts == t->pval_bytes ? 0 : -1;
}

/* A writable buffer of at least size bytes from alloc(size), its view in *view; NULL with
 * an exception set when alloc fails or gives less. */
static PyObject *arrow_alloc(PyObject *alloc, Py_ssize_t size, Py_buffer *view) {
    PyObject *got = PyObject_CallFunction(alloc, "n", size);
    if (!got) return NULL;
    if (PyObject_GetBuffer(got, view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_DECREF(got);
        return NULL;
    }
    if (view->len < size) {
        PyBuffer_Release(view);
        view->obj = NULL;
        Py_DECREF(got);
        PyErr_Format(PyExc_ValueError, "alloc(%zd) gave %zd bytes", size, view->len);
        return NULL;
    }
    return got;
}

/* The entries' own buffers when data is a tuple (one per entry: frames has its length),
 * their views in *views (held until released); 0, or -1 with an exception set. */
static int arrow_entry_buffers(PyObject *data, arrow_job_t *a, Py_buffer **views, Py_ssize_t *held) {
    Py_ssize_t n = PyTuple_GET_SIZE(data);
    *held = 0;
    if (n != a->j.entries) {
        PyErr_SetString(PyExc_ValueError, "data must hold one buffer per entry of frames");
        return -1;
    }
    *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    a->bases = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*a->bases));
    Py_ssize_t *lens = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_ssize_t));
    a->lens = lens;
    if (!*views || !a->bases || !lens) {
        PyErr_NoMemory();
        return -1;
    }
    for (; *held < n; (*held)++) {
        Py_buffer *v = *views + *held;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(data, *held), v, PyBUF_C_CONTIGUOUS) < 0) return -1;
        a->bases[*held] = v->buf, lens[*held] = v->len;
    }
    return 0;
}

PyDoc_STRVAR(arrow_columns_doc,
             "arrow_columns(data, frames, kept, rec, offsets, sizes, flags, alloc) -> (bad, buffers, nulls)\n\n"
             "The records check_kept would check (same arguments, but a frame may be -12: a payload\n"
             "without its header; and data may be a tuple of one buffer per entry, each entry's frame\n"
             "then in its own) decoded into the buffers of an Arrow batch, each from alloc(nbytes)\n"
             "(any object with a writable buffer): key offsets (int64, one more than the records), key\n"
             "bytes, key validity (bits; None without nulls); the same three for values; publish and\n"
             "event times (int64; event 0 where none), event validity; property offsets (int32, per\n"
             "record), name offsets (int32, per property) and bytes, text offsets and bytes; tombstone\n"
             "bits (a key and a nil or empty value).  nulls: the null keys, values and event times.\n"
             "A record that is not exactly one well-formed record, or whose flags (bits 0 and 1) do\n"
             "not say what it holds: bad is its index into rec, buffers and nulls None.");

static PyObject *py_arrow_columns(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *objs[7], *alloc, *bufs[AB_BUFFERS] = {NULL}, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &alloc))
        return NULL;
    int per_entry = PyTuple_Check(objs[0]);
    Py_buffer v[7], views[AB_BUFFERS], *entry_views = NULL;
    Py_ssize_t entry_held = 0;
    for (int b = 0; b < AB_BUFFERS; b++) views[b].obj = NULL;
    int got = per_entry; /* (v[0] is a placeholder then: the entries' own buffers are held apart) */
    arrow_job_t a = {.bases = NULL, .lens = NULL};
    arrow_row_t *rows = NULL;
    if (per_entry) {
        static const uint8_t none = 0;
        v[0].buf = (void *)&none, v[0].len = 0, v[0].obj = NULL;
    }
    for (; got < 7; got++)
        if (PyObject_GetBuffer(objs[got], &v[got], PyBUF_C_CONTIGUOUS | (got ? PyBUF_FORMAT : 0)) < 0) goto done;
    if (get_kept_job(v, &a.j) < 0) goto done;
    if (per_entry && arrow_entry_buffers(objs[0], &a, &entry_views, &entry_held) < 0) goto done;
    if (!(rows = malloc(a.j.n_rec ? (size_t)a.j.n_rec * sizeof(arrow_row_t) : 1))) {
        PyErr_NoMemory();
        goto done;
    }
    arrow_totals_t t;
    Py_ssize_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = arrow_rows(&a, NULL, &t);
    if (bad == -1) bad = arrow_rows(&a, rows, &t);
    Py_END_ALLOW_THREADS
    if (bad == KEPT_BAD_INPUT) {
        PyErr_SetString(PyExc_ValueError, "an index, a count or a record's range does not fit the buffers given");
        goto done;
    }
    if (bad == ARROW_TOO_BIG) {
        PyErr_SetString(PyExc_OverflowError, "the records' properties do not fit 32-bit Arrow offsets, or their "
                                             "bytes a buffer");
        goto done;
    }
    if (bad >= 0) {
        result = Py_BuildValue("(nOO)", bad, Py_None, Py_None);
        goto done;
    }
    Py_ssize_t n = a.j.n_rec, bits = (n + 7) / 8, size[AB_BUFFERS] = {
        [AB_KEY_OFFS] = 8 * (n + 1), [AB_KEY_DATA] = (Py_ssize_t)t.key_bytes, [AB_KEY_VALID] = t.key_nulls ? bits : -1,
        [AB_VALUE_OFFS] = 8 * (n + 1), [AB_VALUE_DATA] = (Py_ssize_t)t.value_bytes,
        [AB_VALUE_VALID] = t.value_nulls ? bits : -1, [AB_PUBLISH] = 8 * n, [AB_EVENT] = 8 * n,
        [AB_EVENT_VALID] = t.event_nulls ? bits : -1, [AB_PROP_OFFS] = 4 * (n + 1),
        [AB_NAME_OFFS] = 4 * ((Py_ssize_t)t.pairs + 1), [AB_NAME_DATA] = (Py_ssize_t)t.name_bytes,
        [AB_PVAL_OFFS] = 4 * ((Py_ssize_t)t.pairs + 1), [AB_PVAL_DATA] = (Py_ssize_t)t.pval_bytes,
        [AB_TOMBSTONE] = bits};
    uint8_t *out[AB_BUFFERS];
    for (int b = 0; b < AB_BUFFERS; b++) {
        out[b] = NULL;
        if (size[b] < 0) continue;
        if (!(bufs[b] = arrow_alloc(alloc, size[b], &views[b]))) goto done;
        out[b] = views[b].buf;
    }
    int filled;
    Py_BEGIN_ALLOW_THREADS /* (the buffers are new: nobody else holds them yet) */
    filled = arrow_fill(n, rows, &t, out, size);
    Py_END_ALLOW_THREADS
    if (filled < 0) {
        PyErr_SetString(PyExc_RuntimeError, "the records changed while they were read");
        goto done;
    }
    PyObject *tuple = PyTuple_New(AB_BUFFERS);
    if (!tuple) goto done;
    for (int b = 0; b < AB_BUFFERS; b++) {
        PyObject *item = bufs[b] ? bufs[b] : Py_None;
        Py_INCREF(item);
        PyTuple_SET_ITEM(tuple, b, item);
    }
    result = Py_BuildValue("(nN(LLL))", (Py_ssize_t)-1, tuple, (long long)t.key_nulls, (long long)t.value_nulls,
                           (long long)t.event_nulls);
done:
    for (int b = 0; b < AB_BUFFERS; b++) {
        if (views[b].obj) PyBuffer_Release(&views[b]);
        Py_XDECREF(bufs[b]);
    }
    free(rows);
    for (Py_ssize_t e = 0; e < entry_held; e++) PyBuffer_Release(&entry_views[e]);
    PyMem_Free(entry_views);
    PyMem_Free((void *)a.bases);
    PyMem_Free((void *)a.lens);
    for (int i = per_entry; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

/* ------------------------------------------------------------------------------------ */
/* JSON lines from Arrow batches                                                         */
/*
 * `shale read` prints each record as one JSON line (shale/jsonlines.py, message_line):
 * {"id","key"|"key_b64","value"|"value_b64","properties","publish_time","event_time"},
 * text escaped as msgspec escapes it (", \ and the control characters; nothing else),
 * keys and values that are not UTF-8 in base64.  json_lines writes those lines straight
 * from the buffers of a batch of shale.reader.arrow's columns, without the interpreter
 * lock.  Two kinds of record it hands back to the Python path instead (it stops before
 * them and says so): one whose property names repeat (a decoded record keeps the last
 * text at the first name's place) or that has more properties than it compares, and,
 * printing values as JSON, a value whose document it cannot tell for certain that
 * msgspec reads or refuses (a number near the edge of the ranges msgspec reads, a
 * surrogate escape, nesting near MAX_JSON_DEPTH).  Everything else is decided here.
 */

enum { JL_LEDGER, JL_ENTRY, JL_BATCH, JL_KEY_VALID, JL_KEY_OFFS, JL_KEY_DATA, JL_VALUE_VALID, JL_VALUE_OFFS,
       JL_VALUE_DATA, JL_PROP_OFFS, JL_NAME_OFFS, JL_NAME_DATA, JL_TEXT_OFFS, JL_TEXT_DATA, JL_PUBLISH,
       JL_EVENT_VALID, JL_EVENT, JL_BUFFERS };

/* Property names compared pairwise for repeats: a record with more goes the Python way. */
#define JL_MAX_PAIRS 64
/* What a line needs beside its text: the names, punctuation, three ids and two times. */
#define JL_LINE_FIXED 200
/* A value nested deeper than this is left to the Python path (which refuses past 512). */
#define JL_MAX_DEPTH 500
/* Numbers msgspec surely reads: an integer of at most this many digits ... */
#define JL_SURE_DIGITS 18
/* ... and a fraction or exponent that keeps the number this far from a double's range. */
#define JL_SURE_EXPONENT 300

enum { JL_DONE = 0, JL_HANDOFF = 1, JL_GROW = 2, JL_MISFIT = -1 };
enum { JSON_VALID = 0, JSON_INVALID = 1, JSON_UNSURE = 2 };

typedef struct {
    const uint8_t *buf[JL_BUFFERS];
    Py_ssize_t len[JL_BUFFERS]; /* -1: None */
    Py_ssize_t n;               /* rows */
    Py_ssize_t pairs;           /* properties in all (rows of the name and text offsets) */
    int json_values;
} jl_job_t;

static inline int64_t jl_i64(const jl_job_t *j, int b, Py_ssize_t i) { return (int64_t)ld64((const uint64_t *)(const void *)j->buf[b] + i); }
static inline int32_t jl_i32(const jl_job_t *j, int b, Py_ssize_t i) { return (int32_t)ld32((const uint32_t *)(const void *)j->buf[b] + i); }
static inline int jl_bit(const jl_job_t *j, int b, Py_ssize_t i) {
    return j->len[b] < 0 || ((j->buf[b][i >> 3] >> (i & 7)) & 1);
}

/* Whether any byte of w is below 0x20, '"', '\\' or not ASCII (each test exact for "any byte"). */
#define JL_ONES 0x0101010101010101ull
#define JL_HIGHS 0x8080808080808080ull
static inline int jl_word_special(uint64_t w) {
    uint64_t below = (w - JL_ONES * 0x20) & ~w;
    uint64_t q = w ^ (JL_ONES * '"'), b = w ^ (JL_ONES * '\\');
    uint64_t quote = (q - JL_ONES) & ~q, slash = (b - JL_ONES) & ~b;
    return ((below | quote | slash | w) & JL_HIGHS) != 0;
}

static const char jl_hex[] = "0123456789abcdef";

/* One ASCII byte as msgspec writes it inside a string. */
static inline uint8_t *jl_ascii(uint8_t *d, uint8_t c) {
    if (c >= 0x20 && c != '"' && c != '\\') {
        *d++ = c;
        return d;
    }
    *d++ = '\\';
    switch (c) {
    case '"': *d++ = '"'; break;
    case '\\': *d++ = '\\'; break;
    case '\b': *d++ = 'b'; break;
    case '\f': *d++ = 'f'; break;
    case '\n': *d++ = 'n'; break;
    case '\r': *d++ = 'r'; break;
    case '\t': *d++ = 't'; break;
    default:
        memcpy(d, "u00", 3);
        d[3] = (uint8_t)jl_hex[c >> 4], d[4] = (uint8_t)jl_hex[c & 15];
        d += 5;
    }
    return d;
}

/* s[0..n) as the inside of a JSON string, as msgspec writes it, when it is UTF-8 text
 * (checked on the way, as Python's strict decoder checks it): where the text ends in d;
 * NULL when it is not text. */
static uint8_t *jl_text(uint8_t *d, const uint8_t *s, int64_t n) {
    int64_t i = 0;
    while (i < n) {
        uint64_t w;
        if (n - i >= 8 && (memcpy(&w, s + i, 8), !jl_word_special(w))) {
            memcpy(d, &w, 8);
            d += 8, i += 8;
            continue;
        }
        int64_t stop = n - i >= 8 ? i + 8 : n;
        while (i < stop) {
            if (s[i] < UTF8_ASCII_END) {
                d = jl_ascii(d, s[i++]);
                continue;
            }
            size_t len = utf8_sequence(s + i, (size_t)(n - i));
            if (!len) return NULL;
            memcpy(d, s + i, len);
            d += len, i += (int64_t)len;
        }
    }
    return d;
}

/* Text already known to be UTF-8 (property names and texts: the record was checked). */
static uint8_t *jl_escaped(uint8_t *d, const uint8_t *s, int64_t n) {
    uint8_t *end = jl_text(d, s, n);
    return end ? end : d;
}

static const char jl_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* s[0..n) in base64 with padding (Python's base64.b64encode). */
static uint8_t *jl_base64(uint8_t *d, const uint8_t *s, int64_t n) {
    int64_t i = 0;
    for (; n - i >= 3; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        d[0] = (uint8_t)jl_b64[v >> 18], d[1] = (uint8_t)jl_b64[(v >> 12) & 63];
        d[2] = (uint8_t)jl_b64[(v >> 6) & 63], d[3] = (uint8_t)jl_b64[v & 63];
        d += 4;
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        d[0] = (uint8_t)jl_b64[v >> 18], d[1] = (uint8_t)jl_b64[(v >> 12) & 63], d[2] = '=', d[3] = '=';
        d += 4;
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        d[0] = (uint8_t)jl_b64[v >> 18], d[1] = (uint8_t)jl_b64[(v >> 12) & 63], d[2] = (uint8_t)jl_b64[(v >> 6) & 63];
        d[3] = '=';
        d += 4;
    }
    return d;
}

static inline uint8_t *jl_lit(uint8_t *d, const char *s) {
    size_t n = strlen(s);
    memcpy(d, s, n);
    return d + n;
}

static const char jl_pairs[] = "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                               "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
                               "8081828384858687888990919293949596979899";

/* v in decimal, two digits at a time. */
static uint8_t *jl_u64(uint8_t *d, uint64_t v) {
    uint8_t tmp[20];
    int k = 20;
    while (v >= 100) {
        unsigned r = (unsigned)(v % 100);
        v /= 100;
        k -= 2;
        memcpy(tmp + k, jl_pairs + 2 * r, 2);
    }
    if (v >= 10) {
        k -= 2;
        memcpy(tmp + k, jl_pairs + 2 * v, 2);
    } else {
        tmp[--k] = (uint8_t)('0' + v);
    }
    memcpy(d, tmp + k, (size_t)(20 - k));
    return d + (20 - k);
}

static uint8_t *jl_i64_text(uint8_t *d, int64_t v) {
    if (v < 0) {
        *d++ = '-';
        return jl_u64(d, (uint64_t)0 - (uint64_t)v);
    }
    return jl_u64(d, (uint64_t)v);
}

/* ---- whether msgspec reads a text as one JSON document (three answers: see above) ---- */

static inline const uint8_t *jl_ws(const uint8_t *p, const uint8_t *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

static inline int jl_hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string at p (its opening quote); *p moved past it.  (The text is valid UTF-8.) */
static int jl_json_string(const uint8_t **pp, const uint8_t *end) {
    const uint8_t *p = *pp + 1;
    int verdict = JSON_VALID;
    while (p < end) {
        uint8_t c = *p++;
        if (c == '"') {
            *pp = p;
            return verdict;
        }
        if (c < 0x20) return JSON_INVALID;
        if (c != '\\') continue;
        if (p >= end) return JSON_INVALID;
        c = *p++;
        if (c == 'u') {
            int v = 0;
            for (int k = 0; k < 4; k++) {
                int h = p < end ? jl_hexval(*p++) : -1;
                if (h < 0) return JSON_INVALID;
                v = v << 4 | h;
            }
            if (v >= 0xd800 && v <= 0xdfff) verdict = JSON_UNSURE; /* pairs and halves: msgspec's to judge */
        } else if (!memchr("\"\\/bfnrt", c, 8)) {
            return JSON_INVALID;
        }
    }
    return JSON_INVALID;
}

static inline const uint8_t *jl_digits(const uint8_t *p, const uint8_t *end, int64_t *count) {
    const uint8_t *s = p;
    while (p < end && *p >= '0' && *p <= '9') p++;
    *count = p - s;
    return p;
}

/* A number at p; *p moved past it. */
static int jl_json_number(const uint8_t **pp, const uint8_t *end) {
    const uint8_t *p = *pp;
    int64_t whole, frac = 0, exp_digits = 0, exp = 0;
    if (p < end && *p == '-') p++;
    if (p >= end || *p < '0' || *p > '9') return JSON_INVALID;
    if (*p == '0') {
        p++, whole = 1;
        if (p < end && *p >= '0' && *p <= '9') return JSON_INVALID; /* a leading zero */
    } else {
        p = jl_digits(p, end, &whole);
    }
    if (p < end && *p == '.') {
        p = jl_digits(p + 1, end, &frac);
        if (!frac) return JSON_INVALID;
    }
    int has_exp = p < end && (*p == 'e' || *p == 'E'), negative = 0;
    if (has_exp) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) negative = *p++ == '-';
        const uint8_t *s = p;
        p = jl_digits(p, end, &exp_digits);
        if (!exp_digits) return JSON_INVALID;
        for (const uint8_t *q = s; q < p && exp < 100000; q++) exp = exp * 10 + (*q - '0');
        if (negative) exp = -exp;
    }
    *pp = p;
    if (!frac && !has_exp) return whole <= JL_SURE_DIGITS ? JSON_VALID : JSON_UNSURE;
    if (whole > JL_SURE_DIGITS || frac > JL_SURE_EXPONENT || exp_digits > 5 || exp < -JL_SURE_EXPONENT ||
        whole + exp > JL_SURE_EXPONENT)
        return JSON_UNSURE;
    return JSON_VALID;
}

static int jl_json_literal(const uint8_t **pp, const uint8_t *end, const char *word, size_t n) {
    if ((size_t)(end - *pp) < n || memcmp(*pp, word, n) != 0) return JSON_INVALID;
    *pp += n;
    return JSON_VALID;
}

/* One scalar at p (not an array or object), *p moved past it. */
static int jl_json_scalar(const uint8_t **p, const uint8_t *end) {
    switch (**p) {
    case '"': return jl_json_string(p, end);
    case 't': return jl_json_literal(p, end, "true", 4);
    case 'f': return jl_json_literal(p, end, "false", 5);
    case 'n': return jl_json_literal(p, end, "null", 4);
    default: return jl_json_number(p, end);
    }
}

static inline int jl_worse(int a, int b) { return a > b ? a : b; }

/* Whether msgspec reads s[0..n) (valid UTF-8) as one JSON document: JSON_VALID,
 * JSON_INVALID, or JSON_UNSURE (for the Python path to say). */
static int jl_json_check(const uint8_t *s, int64_t n) {
    const uint8_t *p = s, *end = s + n;
    uint8_t stack[JL_MAX_DEPTH]; /* '[' or '{' of each open container */
    int depth = 0, verdict = JSON_VALID;
    p = jl_ws(p, end);
    for (;;) {
        /* a value */
        if (p >= end) return JSON_INVALID;
        if (*p == '[' || *p == '{') {
            if (depth == JL_MAX_DEPTH) return JSON_UNSURE;
            uint8_t open = *p++;
            stack[depth++] = open;
            p = jl_ws(p, end);
            if (p < end && *p == (open == '[' ? ']' : '}')) {
                p++, depth--;
            } else if (open == '{') {
                if (p >= end || *p != '"') return JSON_INVALID;
                verdict = jl_worse(verdict, jl_json_string(&p, end));
                if (verdict == JSON_INVALID) return verdict;
                p = jl_ws(p, end);
                if (p >= end || *p++ != ':') return JSON_INVALID;
                p = jl_ws(p, end);
                continue;
            } else {
                continue;
            }
        } else {
            verdict = jl_worse(verdict, jl_json_scalar(&p, end));
            if (verdict == JSON_INVALID) return verdict;
        }
        /* after a value: a comma, a closing bracket, or the end */
        for (;;) {
            p = jl_ws(p, end);
            if (!depth) return p == end ? verdict : JSON_INVALID;
            if (p >= end) return JSON_INVALID;
            uint8_t top = stack[depth - 1], c = *p++;
            if (c == (top == '[' ? ']' : '}')) {
                depth--;
                continue;
            }
            if (c != ',') return JSON_INVALID;
            p = jl_ws(p, end);
            if (top == '{') {
                if (p >= end || *p != '"') return JSON_INVALID;
                verdict = jl_worse(verdict, jl_json_string(&p, end));
                if (verdict == JSON_INVALID) return verdict;
                p = jl_ws(p, end);
                if (p >= end || *p++ != ':') return JSON_INVALID;
                p = jl_ws(p, end);
            }
            break;
        }
    }
}

/* ---- the lines ---- */

/* Row i's key or value (b: its validity buffer; offsets and data follow it): -1 when
 * null, else its length with *at its bytes; JL_MISFIT when its offsets do not fit. */
static inline int64_t jl_field(const jl_job_t *j, int b, Py_ssize_t i, const uint8_t **at) {
    if (!jl_bit(j, b, i)) return -1;
    int64_t lo = jl_i64(j, b + 1, i), hi = jl_i64(j, b + 1, i + 1);
    if (lo < 0 || hi < lo || hi > j->len[b + 2]) return JL_MISFIT - 1;
    *at = j->buf[b + 2] + lo;
    return hi - lo;
}

/* Property k's name and text, checked to fit; 0, or JL_MISFIT. */
static inline int jl_pair(const jl_job_t *j, Py_ssize_t k, const uint8_t **name, int64_t *name_len,
                          const uint8_t **text, int64_t *text_len) {
    int64_t a = jl_i32(j, JL_NAME_OFFS, k), b = jl_i32(j, JL_NAME_OFFS, k + 1);
    int64_t c = jl_i32(j, JL_TEXT_OFFS, k), d = jl_i32(j, JL_TEXT_OFFS, k + 1);
    if (a < 0 || b < a || b > j->len[JL_NAME_DATA] || c < 0 || d < c || d > j->len[JL_TEXT_DATA]) return JL_MISFIT;
    *name = j->buf[JL_NAME_DATA] + a, *name_len = b - a, *text = j->buf[JL_TEXT_DATA] + c, *text_len = d - c;
    return 0;
}

typedef struct {
    const uint8_t *key, *value;
    int64_t key_len, value_len, first_pair, pairs;
    int value_doc; /* print the value as its JSON text */
} jl_row_t;

/* Row i read and judged; the bytes its line may take at most in *need.  JL_DONE, JL_HANDOFF
 * (the Python path prints it) or JL_MISFIT. */
static int jl_read_row(const jl_job_t *j, Py_ssize_t i, jl_row_t *r, int64_t *need) {
    r->key = r->value = NULL;
    if ((r->key_len = jl_field(j, JL_KEY_VALID, i, &r->key)) < -1) return JL_MISFIT;
    if ((r->value_len = jl_field(j, JL_VALUE_VALID, i, &r->value)) < -1) return JL_MISFIT;
    r->first_pair = jl_i32(j, JL_PROP_OFFS, i);
    int64_t stop = jl_i32(j, JL_PROP_OFFS, i + 1);
    if (r->first_pair < 0 || stop < r->first_pair || stop > j->pairs) return JL_MISFIT;
    r->pairs = stop - r->first_pair;
    r->value_doc = 0;
    if (j->json_values && r->value_len > 0 && utf8_valid(r->value, (size_t)r->value_len)) {
        int verdict = jl_json_check(r->value, r->value_len);
        if (verdict == JSON_UNSURE) return JL_HANDOFF;
        r->value_doc = verdict == JSON_VALID;
    }
    /* (6 bytes a byte escaped as \u00XX; base64 takes fewer) */
    *need = JL_LINE_FIXED + 6 * ((r->key_len > 0 ? r->key_len : 0) + (r->value_len > 0 ? r->value_len : 0)) + 8;
    if (r->pairs > JL_MAX_PAIRS) return JL_HANDOFF;
    for (int64_t k = 0; k < r->pairs; k++) {
        const uint8_t *name, *text, *other, *ignored;
        int64_t name_len, text_len, other_len, ignored_len;
        if (jl_pair(j, r->first_pair + k, &name, &name_len, &text, &text_len) < 0) return JL_MISFIT;
        *need += 6 * (name_len + text_len) + 6;
        for (int64_t m = 0; m < k; m++) { /* a name given twice: a decoded record holds it once */
            if (jl_pair(j, r->first_pair + m, &other, &other_len, &ignored, &ignored_len) < 0) return JL_MISFIT;
            if (other_len == name_len && memcmp(other, name, (size_t)name_len) == 0) return JL_HANDOFF;
        }
    }
    return JL_DONE;
}

/* "name":... of a key or a value: text (base64 when it is not UTF-8), null, or (a value)
 * its JSON text. */
static uint8_t *jl_put_field(uint8_t *d, const char *name, const uint8_t *s, int64_t n, int doc) {
    uint8_t *start = d;
    *d++ = '"';
    d = jl_lit(d, name);
    if (n < 0) return jl_lit(d, "\":null");
    if (doc) { /* line breaks, only ever between its tokens, become spaces */
        d = jl_lit(d, "\":");
        for (int64_t k = 0; k < n; k++) *d++ = s[k] == '\n' || s[k] == '\r' ? ' ' : s[k];
        return d;
    }
    d = jl_lit(d, "\":\"");
    uint8_t *end = jl_text(d, s, n);
    if (!end) { /* not text: written again in base64 */
        d = start;
        *d++ = '"';
        d = jl_lit(d, name);
        d = jl_lit(d, "_b64\":\"");
        end = jl_base64(d, s, n);
    }
    *end++ = '"';
    return end;
}

static uint8_t *jl_put_row(const jl_job_t *j, Py_ssize_t i, const jl_row_t *r, uint8_t *d) {
    d = jl_lit(d, "{\"id\":\"");
    d = jl_u64(d, (uint64_t)jl_i64(j, JL_LEDGER, i));
    *d++ = ':';
    d = jl_u64(d, (uint64_t)jl_i64(j, JL_ENTRY, i));
    *d++ = ':';
    d = jl_u64(d, ld32((const uint32_t *)(const void *)j->buf[JL_BATCH] + i));
    d = jl_lit(d, "\",");
    d = jl_put_field(d, "key", r->key, r->key_len, 0);
    *d++ = ',';
    d = jl_put_field(d, "value", r->value, r->value_len, r->value_doc);
    d = jl_lit(d, ",\"properties\":{");
    for (int64_t k = 0; k < r->pairs; k++) {
        const uint8_t *name, *text;
        int64_t name_len, text_len;
        jl_pair(j, r->first_pair + k, &name, &name_len, &text, &text_len); /* (checked by jl_read_row) */
        if (k) *d++ = ',';
        *d++ = '"';
        d = jl_escaped(d, name, name_len);
        d = jl_lit(d, "\":\"");
        d = jl_escaped(d, text, text_len);
        *d++ = '"';
    }
    d = jl_lit(d, "},\"publish_time\":");
    d = jl_i64_text(d, jl_i64(j, JL_PUBLISH, i));
    d = jl_lit(d, ",\"event_time\":");
    d = jl_bit(j, JL_EVENT_VALID, i) ? jl_i64_text(d, jl_i64(j, JL_EVENT, i)) : jl_lit(d, "null");
    return jl_lit(d, "}\n");
}

/* Rows from *row up to stop written into out (cap bytes); *row moved past them, *written
 * set.  JL_DONE (at stop, or out full), JL_HANDOFF (*row goes the Python way), JL_GROW
 * (nothing written: row *row needs *need bytes) or JL_MISFIT. */
static int jl_write(const jl_job_t *j, Py_ssize_t *row, Py_ssize_t stop, uint8_t *out, Py_ssize_t cap,
                    Py_ssize_t *written, int64_t *need) {
    uint8_t *d = out;
    for (; *row < stop; (*row)++) {
        jl_row_t r;
        int got = jl_read_row(j, *row, &r, need);
        if (got != JL_DONE) {
            *written = d - out;
            return got;
        }
        if (*need > cap - (d - out)) {
            *written = d - out;
            return d == out ? JL_GROW : JL_DONE;
        }
        d = jl_put_row(j, *row, &r, d);
    }
    *written = d - out;
    return JL_DONE;
}

/* The job's buffers, checked against the rows; 0, or -1 with an exception set. */
static int jl_get_job(PyObject *cols, Py_buffer views[JL_BUFFERS], jl_job_t *j) {
    if (!PyTuple_Check(cols) || PyTuple_GET_SIZE(cols) != JL_BUFFERS) {
        PyErr_Format(PyExc_ValueError, "columns must be a tuple of %d buffers or None", JL_BUFFERS);
        return -1;
    }
    for (int b = 0; b < JL_BUFFERS; b++) {
        PyObject *o = PyTuple_GET_ITEM(cols, b);
        j->len[b] = -1, j->buf[b] = NULL;
        if (o == Py_None) {
            if (b == JL_KEY_VALID || b == JL_VALUE_VALID || b == JL_EVENT_VALID) continue;
            static const uint8_t none = 0; /* (an empty data buffer: pyarrow gives None for one) */
            if (b == JL_KEY_DATA || b == JL_VALUE_DATA || b == JL_NAME_DATA || b == JL_TEXT_DATA) {
                j->buf[b] = &none, j->len[b] = 0;
                continue;
            }
            PyErr_Format(PyExc_ValueError, "column buffer %d is missing", b);
            return -1;
        }
        if (PyObject_GetBuffer(o, &views[b], PyBUF_C_CONTIGUOUS) < 0) return -1;
        j->buf[b] = views[b].buf, j->len[b] = views[b].len;
    }
    Py_ssize_t n = j->len[JL_LEDGER] / 8, bits = (n + 7) / 8;
    j->n = n;
    j->pairs = j->len[JL_NAME_OFFS] / 4 - 1;
    int ok = j->len[JL_ENTRY] >= 8 * n && j->len[JL_BATCH] >= 4 * n && j->len[JL_KEY_OFFS] >= 8 * (n + 1) &&
             j->len[JL_VALUE_OFFS] >= 8 * (n + 1) && j->len[JL_PROP_OFFS] >= 4 * (n + 1) && j->pairs >= 0 &&
             j->len[JL_TEXT_OFFS] >= 4 * (j->pairs + 1) && j->len[JL_PUBLISH] >= 8 * n && j->len[JL_EVENT] >= 8 * n;
    for (int b = 0; b < JL_BUFFERS; b++)
        if ((b == JL_KEY_VALID || b == JL_VALUE_VALID || b == JL_EVENT_VALID) && j->len[b] >= 0 && j->len[b] < bits)
            ok = 0;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "the column buffers do not hold as many rows as the ids");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(json_lines_doc,
             "json_lines(columns, start, stop, json_values, out) -> (written, row, status, need)\n\n"
             "The JSON lines shale read prints (shale.jsonlines.message_line, each line ending in a\n"
             "newline) of rows start.. of a batch of shale.reader.arrow's columns, written into out\n"
             "(a writable buffer) from its start.  columns: the buffers of the ids (ledger and entry\n"
             "uint64, batch uint32), key validity (None: no nulls), offsets (int64) and bytes, the same\n"
             "for values, property offsets (int32, per row), name offsets (int32) and bytes, text\n"
             "offsets and bytes, publish times (int64), event validity and times.  json_values: print\n"
             "a value that is a JSON document as that document.  Returns the bytes written and the\n"
             "row reached, and status 0 (done up to stop, or out is full), 1 (that row is for the\n"
             "Python path to print: repeated property names, or a value it cannot judge) or 2 (out\n"
             "is too small for that row alone: it needs need bytes).  A ValueError when offsets do\n"
             "not fit the buffers.");

static PyObject *py_json_lines(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *cols, *out_obj;
    Py_ssize_t start, stop;
    int json_values;
    if (!PyArg_ParseTuple(args, "OnnpO", &cols, &start, &stop, &json_values, &out_obj)) return NULL;
    Py_buffer views[JL_BUFFERS], out;
    for (int b = 0; b < JL_BUFFERS; b++) views[b].obj = NULL;
    out.obj = NULL;
    PyObject *result = NULL;
    jl_job_t j;
    j.json_values = json_values;
    if (jl_get_job(cols, views, &j) < 0) goto done;
    if (start < 0 || stop < start || stop > j.n) {
        PyErr_SetString(PyExc_ValueError, "rows out of range");
        goto done;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto done;
    Py_ssize_t row = start, written = 0;
    int64_t need = 0;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = jl_write(&j, &row, stop, out.buf, out.len, &written, &need);
    Py_END_ALLOW_THREADS
    if (status == JL_MISFIT)
        PyErr_SetString(PyExc_ValueError, "offsets do not fit the column buffers");
    else
        result = Py_BuildValue("(nniL)", written, row, status, (long long)need);
done:
    for (int b = 0; b < JL_BUFFERS; b++)
        if (views[b].obj) PyBuffer_Release(&views[b]);
    if (out.obj) PyBuffer_Release(&out);
    return result;
}

PyDoc_STRVAR(json_document_doc,
             "json_document(text) -> int\n\n"
             "Whether msgspec reads text (UTF-8) as one JSON document: 0 it does, 1 it does not,\n"
             "2 not known here (json_lines hands such a value to the Python path).");

static PyObject *py_json_document(PyObject *Py_UNUSED(self), PyObject *arg) {
    Py_buffer v;
    if (PyObject_GetBuffer(arg, &v, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    int verdict;
    Py_BEGIN_ALLOW_THREADS
    verdict = jl_json_check(v.buf, v.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&v);
    return PyLong_FromLong(verdict);
}

/* ------------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS, crc32c_doc},
    {"crc32c_ranges", py_crc32c_ranges, METH_VARARGS, crc32c_ranges_doc},
    {"check_frames", py_check_frames, METH_VARARGS, check_frames_doc},
    {"check_records", py_check_records, METH_VARARGS, check_records_doc},
    {"check_kept", py_check_kept, METH_VARARGS, check_kept_doc},
    {"record_columns", py_record_columns, METH_VARARGS, record_columns_doc},
    {"gather_ranges", py_gather_ranges, METH_VARARGS, gather_ranges_doc},
    {"tiling_error", py_tiling_error, METH_VARARGS, tiling_error_doc},
    {"copy_plan", py_copy_plan, METH_VARARGS, copy_plan_doc},
    {"start_writeback", py_start_writeback, METH_VARARGS, start_writeback_doc},
    {"latest_of_each_key", py_latest_of_each_key, METH_VARARGS, latest_of_each_key_doc},
    {"distinct_estimate", py_distinct_estimate, METH_O, distinct_estimate_doc},
    {"partition_keys", py_partition_keys, METH_VARARGS, partition_keys_doc},
    {"arrow_columns", py_arrow_columns, METH_VARARGS, arrow_columns_doc},
    {"json_lines", py_json_lines, METH_VARARGS, json_lines_doc},
    {"json_document", py_json_document, METH_O, json_document_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "shale.ledger._kernels", "Shale's hot loops in C (see ledger/kernels.py).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernels(void) {
    init_crc();
    if (PyType_Ready(&KeyTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (PyModule_AddIntConstant(m, "HARDWARE_CRC", have_hw_crc != 0) < 0 ||
        PyModule_AddObjectRef(m, "KeyTable", (PyObject *)&KeyTableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
