/* The hot path of the sdpa Python package: reads arrays' addresses, shapes and strides, fills
 * an sdpa_mha_desc and makes the call with the GIL released. ctypes alone measured about 50 us
 * a call at a tiny shape (2 us just to read a NumPy array's address through
 * __array_interface__); this keeps a call's Python overhead to a few microseconds.
 *
 * The module does not link libsdpa: the package loads the library with ctypes, checks its
 * sdpa_get_api table and hands the table's address to init(). NumPy arrays arrive through the
 * buffer protocol (no NumPy headers are needed to build this); torch tensors as tuples
 * (data_ptr, shape, strides in elements, sdpa_dtype). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sdpa.h"

static const sdpa_api *api;

typedef struct view {
    Py_buffer buf;
    int has_buf;
    char *ptr;
    int ndim;
    Py_ssize_t shape[4];
    Py_ssize_t strides[4]; /* in elements */
    int type;
} view;

static void release(view *v) {
    if (v->has_buf) PyBuffer_Release(&v->buf);
    v->has_buf = 0;
}

static int type_of_format(const char *format, Py_ssize_t itemsize) {
    if (format == NULL) return -1;
    if (*format == '@' || *format == '=' || *format == '<') format++;
    if (strcmp(format, "f") == 0 && itemsize == 4) return SDPA_F32;
    if (strcmp(format, "e") == 0 && itemsize == 2) return SDPA_F16;
    return -1;
}

/* Fills *v from a buffer-protocol object or a (data_ptr, shape, strides, type) tuple; 0 on
 * success, -1 with an exception set. */
static int get_view(PyObject *o, const char *name, int writable, view *v) {
    memset(v, 0, sizeof *v);
    if (PyTuple_Check(o)) {
        PyObject *shape, *strides;
        unsigned long long ptr;
        if (!PyArg_ParseTuple(o, "KOOi", &ptr, &shape, &strides, &v->type)) return -1;
        Py_ssize_t n = PySequence_Size(shape);
        if (n < 0 || n > 4 || PySequence_Size(strides) != n) {
            PyErr_Format(PyExc_ValueError, "%s: at most 4 axes, with as many strides", name);
            return -1;
        }
        v->ndim = (int)n;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *a = PySequence_GetItem(shape, i), *b = PySequence_GetItem(strides, i);
            v->shape[i] = a ? PyLong_AsSsize_t(a) : -1;
            v->strides[i] = b ? PyLong_AsSsize_t(b) : -1;
            Py_XDECREF(a);
            Py_XDECREF(b);
            if (PyErr_Occurred()) return -1;
        }
        v->ptr = (char *)(uintptr_t)ptr;
    } else {
        int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(o, &v->buf, flags) < 0) return -1;
        v->has_buf = 1;
        v->type = type_of_format(v->buf.format, v->buf.itemsize);
        if (v->type < 0) {
            PyErr_Format(PyExc_TypeError, "%s: element format '%s' is not float32 or float16", name,
                         v->buf.format ? v->buf.format : "?");
            return -1;
        }
        if (v->buf.ndim > 4) {
            PyErr_Format(PyExc_ValueError, "%s: at most 4 axes", name);
            return -1;
        }
        v->ndim = v->buf.ndim;
        v->ptr = v->buf.buf;
        for (int i = 0; i < v->ndim; i++) {
            Py_ssize_t s = v->buf.strides[i];
            v->shape[i] = v->buf.shape[i];
            if (s < 0 || s % v->buf.itemsize) {
                PyErr_Format(PyExc_ValueError,
                             "%s: stride %zd bytes on axis %d is negative or not a whole number "
                             "of elements",
                             name, s, i);
                return -1;
            }
            v->strides[i] = s / v->buf.itemsize;
        }
    }
    if (v->type < SDPA_F32 || v->type > SDPA_BF16) {
        PyErr_Format(PyExc_TypeError, "%s: unknown element type %d", name, v->type);
        return -1;
    }
    for (int i = 0; i < v->ndim; i++) {
        if (v->shape[i] < 0 || v->strides[i] < 0) {
            PyErr_Format(PyExc_ValueError, "%s: negative extent or stride", name);
            return -1;
        }
    }
    int empty = 0; /* no element: nothing is read or written, whatever the strides */
    for (int i = 0; i < v->ndim; i++) empty |= v->shape[i] == 0;
    if (!empty && v->ndim > 0 && v->shape[v->ndim - 1] > 1 && v->strides[v->ndim - 1] != 1) {
        PyErr_Format(PyExc_ValueError, "%s: the last axis is not contiguous", name);
        return -1;
    }
    return 0;
}

/* (batch, heads, len, d) and the (batch, head, row) strides of a 2-d or 4-d view. */
static void dims(const view *v, int bshd, size_t d[4], size_t s[3]) {
    if (v->ndim == 2) {
        d[0] = d[1] = 1;
        d[2] = (size_t)v->shape[0];
        d[3] = (size_t)v->shape[1];
        s[0] = s[1] = 0;
        s[2] = (size_t)v->strides[0];
        return;
    }
    int h = bshd ? 2 : 1, r = bshd ? 1 : 2;
    d[0] = (size_t)v->shape[0];
    d[1] = (size_t)v->shape[h];
    d[2] = (size_t)v->shape[r];
    d[3] = (size_t)v->shape[3];
    s[0] = (size_t)v->strides[0];
    s[1] = (size_t)v->strides[h];
    s[2] = (size_t)v->strides[r];
}

/* ValueError with the status string and, from a library that has it, the detail of the failure
 * (read on the thread that made the call: the detail is thread-local) */
static int status_error(const char *what, sdpa_status st) {
    const char *detail = SDPA_API_HAS(api, last_error_detail) ? api->last_error_detail() : "";
    PyErr_Format(PyExc_ValueError, "%s: %s (status %d)%s%s", what, api->status_string(st), (int)st,
                 *detail ? ": " : "", detail);
    return -1;
}

static int same4(const size_t a[4], const size_t b[4]) {
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

/* mha(q, k, v, out, lse, mask, flags, scale, bshd, grads, mods): the forward call, out and lse
 * (None for none) written; or, with grads = (dout, dq, dk, dv, dsinks), the backward call, out
 * and lse read, dsinks ([heads_q] float32, or None) written when mods has sinks. mods is None or
 * the address of an sdpa_score_mods the caller keeps alive, whose arrays it has checked against the
 * shapes (the library cannot see their lengths). */
static PyObject *mha(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "sdpa._ext.init was not called");
        return NULL;
    }
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "mha takes 11 arguments");
        return NULL;
    }
    PyObject *grads = args[9];
    int bwd = grads != Py_None;
    if (bwd && (!PyTuple_Check(grads) || PyTuple_GET_SIZE(grads) != 5)) {
        PyErr_SetString(PyExc_TypeError, "grads must be (dout, dq, dk, dv, dsinks)");
        return NULL;
    }
    unsigned long flags = PyLong_AsUnsignedLong(args[6]);
    double scale = PyFloat_AsDouble(args[7]);
    int bshd = PyObject_IsTrue(args[8]);
    const sdpa_score_mods *mods = NULL;
    if (args[10] != Py_None) mods = PyLong_AsVoidPtr(args[10]);
    if (PyErr_Occurred() || bshd < 0) return NULL;

    enum { Q, K, V, OUT, LSE, MASK, DOUT, DQ, DK, DV, DSINKS, N_VIEWS };
    static const char *const names[N_VIEWS] = {"q",    "k",  "v",  "out", "lse",   "mask",
                                               "dout", "dq", "dk", "dv",  "dsinks"};
    view vw[N_VIEWS];
    int given[N_VIEWS] = {0};
    memset(vw, 0, sizeof vw);
    PyObject *result = NULL;
    for (int i = 0; i < N_VIEWS; i++) {
        PyObject *o = i < DOUT ? args[i] : bwd ? PyTuple_GET_ITEM(grads, i - DOUT) : Py_None;
        int writable = bwd ? i >= DQ : i == OUT || i == LSE;
        given[i] = o != Py_None;
        if (given[i] && get_view(o, names[i], writable, &vw[i]) < 0) goto done;
    }

    int nd = vw[Q].ndim;
    if ((nd != 2 && nd != 4) || vw[K].ndim != nd || vw[V].ndim != nd || vw[OUT].ndim != nd) {
        PyErr_Format(PyExc_ValueError,
                     "q, k, v and out must all be 4-d (batch, heads, len, d) or all 2-d "
                     "(len, d); got %d-d, %d-d, %d-d and %d-d",
                     nd, vw[K].ndim, vw[V].ndim, vw[OUT].ndim);
        goto done;
    }
    size_t qd[4], kd[4], vd[4], od[4];
    sdpa_mha_desc d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    dims(&vw[Q], bshd, qd, d.q_stride);
    dims(&vw[K], bshd, kd, d.k_stride);
    dims(&vw[V], bshd, vd, d.v_stride);
    dims(&vw[OUT], bshd, od, d.out_stride);
    size_t want_out[4] = {qd[0], qd[1], qd[2], vd[3]};
    if (kd[0] != vd[0] || kd[1] != vd[1] || kd[2] != vd[2] || qd[0] != kd[0] || qd[3] != kd[3] ||
        !same4(od, want_out)) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not match: q (batch, heads, len_q, d_k) = (%zu, %zu, %zu, %zu), "
                     "k (batch, heads_kv, len_kv, d_k) = (%zu, %zu, %zu, %zu), "
                     "v (batch, heads_kv, len_kv, d_v) = (%zu, %zu, %zu, %zu)",
                     qd[0], qd[1], qd[2], qd[3], kd[0], kd[1], kd[2], kd[3], vd[0], vd[1], vd[2],
                     vd[3]);
        goto done;
    }
    if (kd[1] == 0 || qd[1] % kd[1]) {
        PyErr_Format(PyExc_ValueError,
                     "k and v have %zu heads (heads_kv), which must divide q's %zu heads "
                     "(heads_q): query head h reads key/value head h // (heads_q // heads_kv)",
                     kd[1], qd[1]);
        goto done;
    }
    if (vw[K].type != vw[V].type) {
        PyErr_SetString(PyExc_TypeError, "k and v must have one dtype");
        goto done;
    }
    d.flags = (uint32_t)flags;
    d.batch = qd[0];
    d.heads_q = qd[1];
    d.heads_kv = kd[1];
    d.len_q = qd[2];
    d.len_kv = kd[2];
    d.d_k = qd[3];
    d.d_v = vd[3];
    d.scale = (float)scale;
    d.q_type = (uint32_t)vw[Q].type;
    d.kv_type = (uint32_t)vw[K].type;
    d.out_type = (uint32_t)vw[OUT].type;
    if (given[MASK]) {
        const view *m = &vw[MASK];
        if (m->type != SDPA_F32 || m->ndim != 4 || (size_t)m->shape[0] != qd[0] ||
            (size_t)m->shape[1] != qd[1] || (size_t)m->shape[2] != qd[2] ||
            (size_t)m->shape[3] != kd[2]) {
            PyErr_SetString(PyExc_ValueError,
                            "mask must be float32 of shape (batch, heads_q, len_q, len_kv)");
            goto done;
        }
        d.mask = (const float *)m->ptr;
        for (int i = 0; i < 3; i++) d.mask_stride[i] = (size_t)m->strides[i];
    }
    if (given[LSE]) {
        const view *l = &vw[LSE];
        int ok = l->type == SDPA_F32 && l->ndim == (nd == 2 ? 1 : 3);
        if (ok && nd == 2) ok = (size_t)l->shape[0] == qd[2];
        if (ok && nd == 4)
            ok = (size_t)l->shape[0] == qd[0] && (size_t)l->shape[1] == qd[1] &&
                 (size_t)l->shape[2] == qd[2];
        if (!ok) {
            PyErr_SetString(PyExc_ValueError,
                            "lse must be float32 of shape (batch, heads_q, len_q), or (len_q,)");
            goto done;
        }
        d.lse = (float *)l->ptr;
        if (nd == 4) {
            d.lse_stride[0] = (size_t)l->strides[0];
            d.lse_stride[1] = (size_t)l->strides[1];
        }
    }
    if (mods != NULL) {
        if (!SDPA_API_HAS(api, mha_desc_set_mods)) {
            PyErr_SetString(PyExc_NotImplementedError,
                            "score modifiers need sdpa_mha_desc_set_mods, which is not in the "
                            "loaded library (ABI 1.4 or later has it)");
            goto done;
        }
        sdpa_status ms = api->mha_desc_set_mods(&d, mods);
        if (ms) {
            status_error("sdpa_mha_desc_set_mods", ms);
            goto done;
        }
    }

    sdpa_status st;
    if (!bwd) {
        if (!SDPA_API_HAS(api, mha)) {
            PyErr_SetString(PyExc_NotImplementedError, "sdpa_mha is not in the loaded library");
            goto done;
        }
        PyThreadState *ts = PyEval_SaveThread();
        st = api->mha(&d, vw[OUT].ptr, vw[Q].ptr, vw[K].ptr, vw[V].ptr);
        PyEval_RestoreThread(ts);
        if (st) {
            status_error("sdpa_mha", st);
            goto done;
        }
    } else {
        if (!SDPA_API_HAS(api, mha_backward_f32)) {
            PyErr_SetString(PyExc_NotImplementedError,
                            "sdpa_mha_backward_f32 is not in the loaded library");
            goto done;
        }
        const view *g[4] = {&vw[DOUT], &vw[DQ], &vw[DK], &vw[DV]};
        const view *like[4] = {&vw[OUT], &vw[Q], &vw[K], &vw[V]};
        sdpa_mha_grads gr;
        memset(&gr, 0, sizeof gr);
        gr.struct_size = sizeof gr;
        size_t *gs[4] = {gr.dout_stride, gr.dq_stride, gr.dk_stride, gr.dv_stride};
        for (int i = 0; i < 4; i++) {
            size_t gd[4], ld[4], ls[3];
            if (g[i]->ndim != nd || g[i]->type != SDPA_F32) {
                PyErr_Format(PyExc_ValueError, "%s must be float32 with %d axes", names[DOUT + i],
                             nd);
                goto done;
            }
            dims(g[i], bshd, gd, gs[i]);
            dims(like[i], bshd, ld, ls);
            if (!same4(gd, ld)) {
                PyErr_Format(PyExc_ValueError, "%s must have the shape of %s", names[DOUT + i],
                             names[i == 0 ? OUT : i - 1]);
                goto done;
            }
        }
        gr.dout = (const float *)vw[DOUT].ptr;
        gr.dq = (float *)vw[DQ].ptr;
        gr.dk = (float *)vw[DK].ptr;
        gr.dv = (float *)vw[DV].ptr;
        if (given[DSINKS]) {
            const view *ds = &vw[DSINKS];
            if (ds->type != SDPA_F32 || ds->ndim != 1 || (size_t)ds->shape[0] != d.heads_q) {
                PyErr_Format(PyExc_ValueError, "dsinks must be float32 of shape (%zu,) (heads_q)",
                             d.heads_q);
                goto done;
            }
            /* the field is the grads' v2 tail: a library before ABI 1.4 would reject the size */
            if (!SDPA_API_HAS(api, mha_desc_set_mods)) {
                PyErr_SetString(PyExc_NotImplementedError,
                                "dsinks needs the sdpa_mha_grads v2 tail (ABI 1.4 or later)");
                goto done;
            }
            gr.dsinks = (float *)ds->ptr;
        } else if (!SDPA_API_HAS(api, mha_desc_set_mods)) {
            gr.struct_size = (uint32_t)offsetof(sdpa_mha_grads, dsinks);
        }
        PyThreadState *ts = PyEval_SaveThread();
        st = api->mha_backward_f32(&d, &gr, (const float *)vw[Q].ptr, (const float *)vw[K].ptr,
                                   (const float *)vw[V].ptr, (const float *)vw[OUT].ptr);
        PyEval_RestoreThread(ts);
        if (st) {
            status_error("sdpa_mha_backward_f32", st);
            goto done;
        }
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < N_VIEWS; i++) release(&vw[i]);
    return result;
}

/* softmax(y, x, scale): every row of the last axis of the dense float32 x into y. */
static PyObject *softmax(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (api == NULL || nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "softmax(y, x, scale) after init");
        return NULL;
    }
    double scale = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return NULL;
    view y, x;
    PyObject *result = NULL;
    memset(&x, 0, sizeof x);
    if (get_view(args[0], "y", 1, &y) < 0 || get_view(args[1], "x", 0, &x) < 0) goto done;
    if (y.type != SDPA_F32 || x.type != SDPA_F32 || y.ndim != x.ndim || x.ndim == 0) {
        PyErr_SetString(PyExc_TypeError, "softmax: x and y must be float32 with one shape");
        goto done;
    }
    size_t rows = 1, n = (size_t)x.shape[x.ndim - 1];
    Py_ssize_t dense = 1;
    for (int i = x.ndim - 1; i >= 0; i--) {
        if (x.shape[i] != y.shape[i] ||
            (x.shape[i] > 1 && (x.strides[i] != dense || y.strides[i] != dense))) {
            PyErr_SetString(PyExc_ValueError, "softmax: x and y must be dense, of one shape");
            goto done;
        }
        dense *= x.shape[i];
        if (i < x.ndim - 1) rows *= (size_t)x.shape[i];
    }
    if (n == 0) rows = 0;
    sdpa_status st = SDPA_OK;
    float *yp = (float *)y.ptr;
    const float *xp = (const float *)x.ptr;
    /* every row has the same n and scale, so the first row's status stands for all */
    st = api->softmax_f32(rows ? yp : NULL, rows ? xp : NULL, rows ? n : 0, (float)scale);
    if (st) {
        status_error("sdpa_softmax_f32", st);
        goto done;
    }
    PyThreadState *ts = PyEval_SaveThread();
    for (size_t r = 1; r < rows; r++) api->softmax_f32(yp + r * n, xp + r * n, n, (float)scale);
    PyEval_RestoreThread(ts);
    result = Py_NewRef(Py_None);
done:
    release(&y);
    release(&x);
    return result;
}

/* init(table): the address of the sdpa_api table the package loaded and checked. */
static PyObject *init(PyObject *self, PyObject *arg) {
    (void)self;
    void *t = PyLong_AsVoidPtr(arg);
    if (PyErr_Occurred()) return NULL;
    api = t;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"mha", (PyCFunction)(void (*)(void))mha, METH_FASTCALL, "forward or backward attention"},
    {"softmax", (PyCFunction)(void (*)(void))softmax, METH_FASTCALL, "softmax of dense rows"},
    {"init", init, METH_O, "the library's table"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ext", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ext(void) { return PyModule_Create(&module); }
