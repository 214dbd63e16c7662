/*
 * JSON lines into record columns: the scanner behind `shale produce` of JSON lines.
 *
 * scan(data, event_min, event_max) reads every line of data (lines end at '\n'; the last
 * may lack it) holding the usual record shape, {"key", "value", "properties",
 * "event_time"}, into columns that ledger/_encoder.c takes (int64 offsets into one data
 * buffer, a validity byte per row), and says which lines it did not take.
 *
 * It never decides that a line is wrong: a line it is not sure of (anything but strict
 * RFC 8259 JSON in valid UTF-8, an escape it does not decode, "key_b64"/"value_b64", a
 * name given twice, a value nested deeper than MAX_DEPTH, a number it does not check
 * (long ones), an event time outside [event_min, event_max], a line of whitespace that is
 * not all JSON whitespace) is handed back, by line number and byte span, to the Python
 * parser (shale/producer/jsonlines.py), which decides as it always has.  A line of ASCII
 * whitespace only is skipped, as the Python path skips it.
 *
 * What a taken line stores is what the Python parser would: a string's UTF-8 after
 * unescaping, an object's or array's exact text from the line, null or absent as no key
 * or no value.  Runs without the interpreter lock; shale/producer/jsonl_ingest.py wraps it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Deeper values go to the Python parser, which allows up to 512 levels. */
#define MAX_DEPTH 64
/* Numbers (in values) longer than this go to the Python parser. */
#define MAX_NUMBER 40
/* Property maps with more names than this go to the Python parser (names are compared pairwise). */
#define MAX_PAIRS 16

typedef struct {
    uint8_t *p;
    size_t len, cap;
    int failed;
} buf_t;

static int grow(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (p == NULL) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(buf_t *b, const void *src, size_t n) {
    if (grow(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int put_i64(buf_t *b, int64_t v) { return put(b, &v, 8); }

static inline int put_u8(buf_t *b, uint8_t v) { return put(b, &v, 1); }

/* The columns being built. */
typedef struct {
    buf_t line, key_off, key, key_valid, value_off, value, value_valid, map_off, pk_off, pk, pv_off, pv, event,
        event_valid, flagged;
    int64_t rows, pairs;
    int64_t event_min, event_max;
} out_t;

#define N_BUFS 15

static buf_t *bufs(out_t *o, int k) {
    buf_t *all[N_BUFS] = {&o->line, &o->key_off, &o->key, &o->key_valid, &o->value_off, &o->value, &o->value_valid,
                          &o->map_off, &o->pk_off, &o->pk, &o->pv_off, &o->pv, &o->event, &o->event_valid,
                          &o->flagged};
    return all[k];
}

static inline int is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static inline const uint8_t *skip_ws(const uint8_t *p, const uint8_t *e) {
    while (p < e && is_ws(*p)) p++;
    return p;
}

/* The length of the valid UTF-8 sequence (of 2 to 4 bytes) at p, or 0. */
static inline int utf8_len(const uint8_t *p, const uint8_t *e) {
    uint8_t c = p[0];
    if (c >= 0xC2 && c <= 0xDF) return (e - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (e - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] > 0x9F) return 0; /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (e - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] > 0x8F) return 0; /* beyond U+10FFFF */
        return 4;
    }
    return 0;
}

static inline int hex4(const uint8_t *p, const uint8_t *e, uint32_t *out) {
    if (e - p < 4) return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        uint8_t c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* The string whose opening quote is at p: its UTF-8 after unescaping appended to out
 * (out NULL: only checked); the position after its closing quote, or NULL when the
 * Python parser should judge it. */
static const uint8_t *string(const uint8_t *p, const uint8_t *e, buf_t *out) {
    p++;
    for (;;) {
        const uint8_t *run = p;
        while (p < e && *p != '"' && *p != '\\' && *p >= 0x20 && *p < 0x80) p++;
        if (out != NULL && p > run && put(out, run, (size_t)(p - run)) < 0) return NULL;
        if (p >= e) return NULL;
        uint8_t c = *p;
        if (c == '"') return p + 1;
        if (c < 0x20) return NULL; /* a control character: not allowed unescaped */
        if (c >= 0x80) {
            int n = utf8_len(p, e);
            if (n == 0) return NULL;
            if (out != NULL && put(out, p, (size_t)n) < 0) return NULL;
            p += n;
            continue;
        }
        /* an escape */
        if (e - p < 2) return NULL;
        uint8_t x = p[1], ch;
        switch (x) {
        case '"': ch = '"'; break;
        case '\\': ch = '\\'; break;
        case '/': ch = '/'; break;
        case 'b': ch = '\b'; break;
        case 'f': ch = '\f'; break;
        case 'n': ch = '\n'; break;
        case 'r': ch = '\r'; break;
        case 't': ch = '\t'; break;
        case 'u': {
            uint32_t u;
            if (hex4(p + 2, e, &u) < 0) return NULL;
            p += 6;
            if (u >= 0xDC00 && u <= 0xDFFF) return NULL; /* half a pair */
            if (u >= 0xD800 && u <= 0xDBFF) {
                uint32_t lo;
                if (e - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, e, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                    return NULL;
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            uint8_t enc[4];
            size_t n;
            if (u < 0x80) {
                enc[0] = (uint8_t)u;
                n = 1;
            } else if (u < 0x800) {
                enc[0] = (uint8_t)(0xC0 | (u >> 6));
                enc[1] = (uint8_t)(0x80 | (u & 0x3F));
                n = 2;
            } else if (u < 0x10000) {
                enc[0] = (uint8_t)(0xE0 | (u >> 12));
                enc[1] = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
                enc[2] = (uint8_t)(0x80 | (u & 0x3F));
                n = 3;
            } else {
                enc[0] = (uint8_t)(0xF0 | (u >> 18));
                enc[1] = (uint8_t)(0x80 | ((u >> 12) & 0x3F));
                enc[2] = (uint8_t)(0x80 | ((u >> 6) & 0x3F));
                enc[3] = (uint8_t)(0x80 | (u & 0x3F));
                n = 4;
            }
            if (out != NULL && put(out, enc, n) < 0) return NULL;
            continue;
        }
        default: return NULL;
        }
        if (out != NULL && put_u8(out, ch) < 0) return NULL;
        p += 2;
    }
}

/* A JSON number at p (strict grammar, at most MAX_NUMBER bytes): the position after it, or NULL. */
static const uint8_t *number(const uint8_t *p, const uint8_t *e) {
    const uint8_t *start = p;
    if (p < e && *p == '-') p++;
    if (p >= e) return NULL;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < e && *p >= '0' && *p <= '9') p++;
    else return NULL;
    if (p < e && *p == '.') {
        p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return NULL;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    return p - start <= MAX_NUMBER ? p : NULL;
}

static const uint8_t *literal(const uint8_t *p, const uint8_t *e, const char *word, size_t n) {
    return ((size_t)(e - p) >= n && memcmp(p, word, n) == 0) ? p + n : NULL;
}

/* Any JSON value at p, checked: the position after it, or NULL. */
static const uint8_t *value(const uint8_t *p, const uint8_t *e, int depth) {
    if (p >= e) return NULL;
    switch (*p) {
    case '"': return string(p, e, NULL);
    case 't': return literal(p, e, "true", 4);
    case 'f': return literal(p, e, "false", 5);
    case 'n': return literal(p, e, "null", 4);
    case '{': case '[': {
        if (depth >= MAX_DEPTH) return NULL;
        uint8_t close = *p == '{' ? '}' : ']';
        int object = *p == '{';
        p = skip_ws(p + 1, e);
        if (p < e && *p == close) return p + 1;
        for (;;) {
            if (object) {
                if (p >= e || *p != '"' || (p = string(p, e, NULL)) == NULL) return NULL;
                p = skip_ws(p, e);
                if (p >= e || *p != ':') return NULL;
                p = skip_ws(p + 1, e);
            }
            if ((p = value(p, e, depth + 1)) == NULL) return NULL;
            p = skip_ws(p, e);
            if (p >= e) return NULL;
            if (*p == close) return p + 1;
            if (*p != ',') return NULL;
            p = skip_ws(p + 1, e);
        }
    }
    default: return number(p, e);
    }
}

enum { F_KEY = 1, F_VALUE = 2, F_PROPS = 4, F_EVENT = 8 };

/* The field name whose quote is at p (plain ASCII letters and '_', no escape): its flag, 0
 * for a name the scanner leaves to Python; *after is past its closing quote. */
static int field(const uint8_t *p, const uint8_t *e, const uint8_t **after) {
    const uint8_t *q = p + 1;
    while (q < e && ((*q >= 'a' && *q <= 'z') || *q == '_')) q++;
    if (q >= e || *q != '"') return 0;
    size_t n = (size_t)(q - p - 1);
    *after = q + 1;
    p++;
    if (n == 3 && memcmp(p, "key", 3) == 0) return F_KEY;
    if (n == 5 && memcmp(p, "value", 5) == 0) return F_VALUE;
    if (n == 10 && memcmp(p, "properties", 10) == 0) return F_PROPS;
    if (n == 10 && memcmp(p, "event_time", 10) == 0) return F_EVENT;
    return 0;
}

/* An event time: an integer of at most 18 digits within the range; NULL otherwise. */
static const uint8_t *event_time(const uint8_t *p, const uint8_t *e, out_t *o, int64_t *t) {
    int neg = 0;
    if (p < e && *p == '-') {
        neg = 1;
        p++;
    }
    if (p >= e || *p < '0' || *p > '9') return NULL;
    if (*p == '0' && p + 1 < e && p[1] >= '0' && p[1] <= '9') return NULL;
    int64_t v = 0;
    int digits = 0;
    while (p < e && *p >= '0' && *p <= '9') {
        if (++digits > 18) return NULL;
        v = v * 10 + (*p++ - '0');
    }
    if (p < e && (*p == '.' || *p == 'e' || *p == 'E')) return NULL;
    v = neg ? -v : v;
    if (v < o->event_min || v > o->event_max) return NULL;
    *t = v;
    return p;
}

/* A properties object at p: its pairs appended; NULL when Python should judge it. */
static const uint8_t *properties(const uint8_t *p, const uint8_t *e, out_t *o, int64_t *pairs) {
    size_t at[MAX_PAIRS + 1];
    int64_t n = 0;
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}') {
        *pairs = 0;
        return p + 1;
    }
    for (;;) {
        if (n == MAX_PAIRS || p >= e || *p != '"') return NULL;
        at[n] = o->pk.len;
        if ((p = string(p, e, &o->pk)) == NULL) return NULL;
        size_t len = o->pk.len - at[n];
        for (int64_t k = 0; k < n; k++) /* a name twice: Python keeps the last */
            if (at[k + 1] - at[k] == len && memcmp(o->pk.p + at[k], o->pk.p + at[n], len) == 0) return NULL;
        at[n + 1] = o->pk.len;
        p = skip_ws(p, e);
        if (p >= e || *p != ':') return NULL;
        p = skip_ws(p + 1, e);
        if (p >= e || *p != '"' || (p = string(p, e, &o->pv)) == NULL) return NULL;
        n++;
        if (put_i64(&o->pk_off, (int64_t)o->pk.len) < 0 || put_i64(&o->pv_off, (int64_t)o->pv.len) < 0) return NULL;
        p = skip_ws(p, e);
        if (p >= e) return NULL;
        if (*p == '}') {
            *pairs = n;
            return p + 1;
        }
        if (*p != ',') return NULL;
        p = skip_ws(p + 1, e);
    }
}

/* The marks to roll the columns back to when a line is left to Python. */
typedef struct {
    size_t len[N_BUFS];
} marks_t;

/* One line [p, e) (without its '\n'): 1 when taken as a row, 0 when left to Python. */
static int line(const uint8_t *p, const uint8_t *e, out_t *o, int64_t line_no) {
    marks_t m;
    for (int k = 0; k < N_BUFS; k++) m.len[k] = bufs(o, k)->len;
    int seen = 0;
    uint8_t key_valid = 0, value_valid = 0, event_valid = 0;
    int64_t pairs = 0, t = 0;
    p = skip_ws(p, e);
    if (p >= e || *p != '{') goto python;
    p = skip_ws(p + 1, e);
    if (p < e && *p == '}') {
        p++;
        goto end;
    }
    for (;;) {
        const uint8_t *after = NULL;
        if (p >= e || *p != '"') goto python;
        int f = field(p, e, &after);
        if (f == 0 || (seen & f)) goto python;
        seen |= f;
        p = skip_ws(after, e);
        if (p >= e || *p != ':') goto python;
        p = skip_ws(p + 1, e);
        if (p >= e) goto python;
        const uint8_t *q;
        if (*p == 'n') {
            q = literal(p, e, "null", 4);
        } else if (f == F_KEY) {
            q = *p == '"' ? string(p, e, &o->key) : NULL;
            key_valid = 1;
        } else if (f == F_VALUE) {
            if (*p == '"') {
                q = string(p, e, &o->value);
            } else if (*p == '{' || *p == '[') {
                q = value(p, e, 1);
                if (q != NULL && put(&o->value, p, (size_t)(q - p)) < 0) q = NULL;
            } else {
                q = NULL;
            }
            value_valid = 1;
        } else if (f == F_PROPS) {
            q = *p == '{' ? properties(p, e, o, &pairs) : NULL;
        } else {
            q = event_time(p, e, o, &t);
            event_valid = 1;
        }
        if (q == NULL) goto python;
        p = skip_ws(q, e);
        if (p >= e) goto python;
        if (*p == '}') {
            p++;
            break;
        }
        if (*p != ',') goto python;
        p = skip_ws(p + 1, e);
    }
end:
    if (skip_ws(p, e) != e) goto python;
    o->rows++;
    o->pairs += pairs;
    if (put_i64(&o->line, line_no) < 0 || put_i64(&o->key_off, (int64_t)o->key.len) < 0 ||
        put_u8(&o->key_valid, key_valid) < 0 || put_i64(&o->value_off, (int64_t)o->value.len) < 0 ||
        put_u8(&o->value_valid, value_valid) < 0 || put_i64(&o->map_off, o->pairs) < 0 ||
        put_i64(&o->event, event_valid ? t : 0) < 0 || put_u8(&o->event_valid, event_valid) < 0)
        return 0; /* (out of memory: reported by the caller) */
    return 1;
python:
    for (int k = 0; k < N_BUFS; k++) bufs(o, k)->len = m.len[k];
    return 0;
}

/* Bytes Python's str.strip() removes (its ASCII whitespace). */
static inline int py_space(uint8_t c) { return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F); }

static void scan_all(const uint8_t *data, Py_ssize_t len, int64_t first_line, out_t *o, int64_t *lines) {
    const uint8_t *p = data, *end = data + len;
    int64_t n = first_line;
    while (p < end) {
        const uint8_t *nl = memchr(p, '\n', (size_t)(end - p));
        const uint8_t *e = nl != NULL ? nl : end;
        const uint8_t *q = p;
        while (q < e && py_space(*q)) q++;
        if (q < e && !line(p, e, o, n)) {
            int64_t span[3] = {n, (int64_t)(p - data), (int64_t)((nl != NULL ? nl + 1 : end) - data)};
            put(&o->flagged, span, sizeof(span));
        }
        n++;
        p = nl != NULL ? nl + 1 : end;
    }
    *lines = n - first_line;
}

PyDoc_STRVAR(scan_doc,
"scan(data, first_line, event_min, event_max)\n"
"--\n\n"
"The records of the JSON lines in data (line numbers from first_line) as columns:\n"
"(lines, line int64, key_off int64, key, key_valid uint8, value_off int64, value,\n"
"value_valid uint8, map_off int64, pk_off int64, pk, pv_off int64, pv, event int64,\n"
"event_valid uint8, flagged int64) as bytes; offsets start with 0; flagged holds\n"
"(line number, start, end) for each line left to the Python parser (end past its '\\n').");

static PyObject *py_scan(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    long long first_line, event_min, event_max;
    if (!PyArg_ParseTuple(args, "y*LLL:scan", &view, &first_line, &event_min, &event_max)) return NULL;
    out_t o;
    memset(&o, 0, sizeof(o));
    o.event_min = event_min;
    o.event_max = event_max;
    int64_t lines = 0;
    PyObject *result = NULL;
    Py_BEGIN_ALLOW_THREADS
    /* every offsets column starts with 0 */
    put_i64(&o.key_off, 0);
    put_i64(&o.value_off, 0);
    put_i64(&o.map_off, 0);
    put_i64(&o.pk_off, 0);
    put_i64(&o.pv_off, 0);
    scan_all(view.buf, view.len, first_line, &o, &lines);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    int failed = 0;
    for (int k = 0; k < N_BUFS; k++) failed |= bufs(&o, k)->failed;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = PyTuple_New(N_BUFS + 1);
    if (result == NULL) goto done;
    PyTuple_SET_ITEM(result, 0, PyLong_FromLongLong(lines));
    for (int k = 0; k < N_BUFS; k++) {
        buf_t *b = bufs(&o, k);
        PyObject *item = PyBytes_FromStringAndSize((const char *)b->p, (Py_ssize_t)b->len);
        if (item == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, k + 1, item);
    }
    if (PyTuple_GET_ITEM(result, 0) == NULL) Py_CLEAR(result);
done:
    for (int k = 0; k < N_BUFS; k++) free(bufs(&o, k)->p);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", py_scan, METH_VARARGS, scan_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jsonl", "JSON lines into record columns (see shale/producer/jsonl_ingest.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsonl(void) { return PyModule_Create(&module); }
