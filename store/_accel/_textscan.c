/* store._accel._textscan: one vectorised pass over log text.
 *
 * Ingesting a block of log text needs, besides its digest: its line count,
 * and whether it is stored as it is (store/logsplit.py's "clean" test:
 * ASCII or valid UTF-8, no "\r\n", no line that may be over 64 KiB). In
 * Python that is bytes.count(b"\n") (about 1.3 GB/s: CPython checks its
 * count limit after every match, which keeps compilers from vectorising the
 * loop), bytes.isascii() and a bytes.find per window: four passes over the
 * text and the largest CPU cost of logging after the digest
 * (bench/local_log_ingest.py). scan() makes one pass: 16 bytes at a time
 * into 16 byte-wide lane counters, emptied every 255 steps (before a lane
 * can overflow), which gcc and clang turn into SIMD compares and byte adds
 * (SSE2 is enough; about 10 GB/s here).
 *
 * Optional: built when a C compiler is at hand (setup.py marks it
 * optional); store/_accel/__init__.py falls back to the bytes methods, with the
 * same results (tests/store/test_textscan.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* 255 steps of 16 bytes: a lane counter (unsigned char) cannot overflow. */
#define CHUNK (255 * 16)

typedef struct {
    size_t newlines;   /* b"\n" bytes */
    size_t returns;    /* b"\r" bytes */
    unsigned char any; /* OR of every byte: bit 7 set when a byte is not ASCII */
} counts;

/* Add the counts of p[0:n] to *c. */
static void
scan_range(const unsigned char *p, size_t n, counts *c)
{
    while (n) {
        size_t m = n < CHUNK ? n : CHUNK;
        unsigned char nl[16] = {0}, cr[16] = {0}, any[16] = {0};
        size_t i = 0;
        for (; i + 16 <= m; i += 16) {
            for (int j = 0; j < 16; j++) {
                unsigned char b = p[i + j];
                nl[j] += (b == '\n');
                cr[j] += (b == '\r');
                any[j] |= b;
            }
        }
        for (int j = 0; j < 16; j++) {
            c->newlines += nl[j];
            c->returns += cr[j];
            c->any |= any[j];
        }
        for (; i < m; i++) {
            c->newlines += (p[i] == '\n');
            c->returns += (p[i] == '\r');
            c->any |= p[i];
        }
        p += m;
        n -= m;
    }
}

/* Below this many bytes the GIL is kept (releasing it costs more). */
#define RELEASE_GIL_BYTES (1 << 16)

static PyObject *
scan(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t window;
    counts c = {0, 0, 0};
    size_t bare = 0;
    if (!PyArg_ParseTuple(args, "y*n:scan", &view, &window)) {
        return NULL;
    }
    if (window <= 0) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "scan: window must be > 0, got %zd", window);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    size_t n = (size_t)view.len, w = (size_t)window;
    Py_BEGIN_ALLOW_THREADS  /* the view pins the buffer; nothing here touches Python */
    size_t at = 0;
    for (; at + w <= n; at += w) {  /* whole windows: each must hold a newline */
        size_t before = c.newlines;
        scan_range(p + at, w, &c);
        bare += (c.newlines == before);
    }
    scan_range(p + at, n - at, &c);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("nOOn", (Py_ssize_t)c.newlines, c.returns ? Py_True : Py_False,
                         (c.any & 0x80) ? Py_False : Py_True, (Py_ssize_t)bare);
}

static PyObject *
count_newlines(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    counts c = {0, 0, 0};
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (view.len >= RELEASE_GIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        scan_range((const unsigned char *)view.buf, (size_t)view.len, &c);
        Py_END_ALLOW_THREADS
    }
    else {
        scan_range((const unsigned char *)view.buf, (size_t)view.len, &c);
    }
    PyBuffer_Release(&view);
    return PyLong_FromSize_t(c.newlines);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, window, /) -> (newlines, has_return, ascii, bare_windows)\n--\n\n"
     "One pass over ``data`` (bytes or any C-contiguous buffer): how many\n"
     "b'\\n' bytes it holds, whether it holds a b'\\r', whether every byte is ASCII, and how\n"
     "many of its whole ``window``-byte windows (at 0, window, 2*window...)\n"
     "hold no b'\\n'. ValueError for window <= 0. Releases the GIL."},
    {"count_newlines", count_newlines, METH_O,
     "count_newlines(data, /) -> int\n--\n\n"
     "The number of b'\\n' bytes in ``data`` (any C-contiguous buffer), as\n"
     "data.count(b'\\n') for bytes. The GIL is released for 64 KiB and more."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "store._accel._textscan",
    "One vectorised pass over log text (the C accelerator of store.logsplit and store.logblocks).",
    0,
    methods,
};

PyMODINIT_FUNC
PyInit__textscan(void)
{
    return PyModule_Create(&module);
}
