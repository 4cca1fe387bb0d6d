/* The compiled launcher: binds a kernel's arguments and calls a driver's launch function, in C.
 *
 * One module serves every kernel. tilecore/runtime/clauncher.py builds a *plan* from a kernel's signature
 * (which arguments are tensors, their dtypes, static dims and shape symbols, which are int or float
 * scalars, which outputs to allocate, where every value goes in the launch's parameter array) and makes a
 * Launcher from it; a call walks that plan. The checks are those of the generated Python binder
 * (tilecore.compiler.binding.compile_binder): a tensor must be exactly the tensor type, of the plan's dtype
 * object, on the plan's device (a boolean attribute such as ``is_cpu``), of the plan's shape, contiguous. Those
 * facts are read through torch's C shim where clauncher.py found and checked it (Shim below, D57), else through
 * torch's getters and methods (D23).
 *
 * On anything else the call returns NotImplemented, having launched nothing, and the caller runs the
 * general Python path, which raises the errors users see. So this file never composes an error message.
 *
 * The launch function has the driver-API shape shared by the vendors' driver libraries:
 *   int launch(void *function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
 *              unsigned block_y, unsigned block_z, unsigned shared_bytes, void *stream, void **params,
 *              void **extra)
 * Its address comes from Python, so this module links nothing but Python.
 *
 * The parameter array matches what the Python launch writes: one 8-byte slot per buffer address and per
 * integer (int64), one double per float scalar, then the status word's address (int64). It lives on the
 * C stack of each call, so a call that lets another thread run (a Python callable below) cannot have its
 * values overwritten.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAX_SLOTS 128 /* buffers + ints + floats + 1; larger signatures get no Launcher (clauncher.py) */
#define MAX_ARGS 64
#define MAX_DIMS 8
#define MAX_SYMS 64
#define MAX_ALLOCS 16
#define MAX_DESCRIPTORS 8

typedef int (*launch_fn_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **);

enum { ARG_TENSOR = 0, ARG_INT = 1, ARG_FLOAT = 2 };

typedef struct {
    int kind;
    PyObject *dtype;          /* tensors: the dtype object (compared by identity) */
    int32_t code;             /* tensors: the dtype's code in torch's C shim (read through Shim) */
    int rank;
    long long dims[MAX_DIMS]; /* >= 0: a static size; -(k + 1): shape symbol k */
} ArgPlan;

typedef struct {
    PyObject *fn;             /* torch.empty or torch.zeros */
    PyObject *dtype;
    int rank;
    long long dims[MAX_DIMS];
    int returned;             /* an output (returned) rather than a workspace */
} AllocPlan;

/* How to read one attribute of the tensor type: its C getter, found once on the type (a getset descriptor:
 * what attribute access would call, without the lookup), or its method descriptor (called without making a
 * bound method); else the attribute by name. */
typedef struct {
    getter get;
    void *closure;
    PyObject *method; /* a method descriptor, owned */
    PyObject *name;   /* interned, owned */
} Reader;

/* torch's C shim (torch/csrc/inductor/aoti_torch/c/shim.h, exported by libtorch, AOTInductor's stable C ABI):
 * a tensor's metadata read by plain C calls on its TensorImpl, instead of five Python getters and methods. A
 * handle is the address of an at::Tensor, whose one member is its TensorImpl's address (the ``_cdata`` getter's
 * value), so a word holding that address is one. Each returns 0 when it succeeded. clauncher.py finds the
 * functions and checks them against torch's getters on probe tensors before passing their addresses here. */
typedef int32_t (*shim_i32_t)(void *, int32_t *);
typedef int32_t (*shim_i64_t)(void *, int64_t *);
typedef int32_t (*shim_sizes_t)(void *, int64_t **);
typedef int32_t (*shim_bool_t)(void *, bool *);
typedef int32_t (*shim_ptr_t)(void *, void **);
typedef struct {
    shim_i32_t dtype, device_type;
    shim_i64_t dim;
    shim_sizes_t sizes;
    shim_bool_t contiguous;
    shim_ptr_t data_ptr;
    int32_t device;           /* the device type code of the runtime's tensors */
} Shim;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int nargs, nsyms, nallocs, nb, ni, nf, naligned, ndesc;
    ArgPlan args[MAX_ARGS];
    AllocPlan allocs[MAX_ALLOCS];
    int buf_src[MAX_SLOTS];   /* >= 0: argument j's address; -(m + 1): allocation m's */
    int int_src[MAX_SLOTS];   /* >= 0: symbol k; -(j + 1): argument j's value */
    int float_src[MAX_SLOTS]; /* argument j */
    int aligned[MAX_SLOTS];   /* buffer slots that must be 16-byte aligned */
    PyObject *tensor_type, *device_attr, *grid_fn, *get_device, *get_stream, *after, *fail, *alloc_kwnames;
    PyObject *descriptors; /* descriptors(buffers, ints) -> ndesc buffer objects, passed by address; or NULL */
    Reader read_dtype, read_shape, read_flag, read_device, call_contiguous, call_data_ptr, read_cdata;
    int has_shim;             /* tensors read through shim (else through the getters above) */
    Shim shim;
    unsigned grid[3], block[3], shared;
    launch_fn_t launch;
    long long cur_dev;        /* the device whose function and status word are set; -1: none yet */
    void *function;
    int64_t status;
} Launcher;

/* An int from a Python object that must be one; -1 with no exception set means "not an int". */
static int as_ll(PyObject *o, long long *out) {
    if (!PyLong_Check(o))
        return -1;
    *out = PyLong_AsLongLong(o);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

static int reader_init(Reader *r, PyObject *type, const char *name) {
    r->name = PyUnicode_InternFromString(name);
    if (!r->name)
        return -1;
    PyObject *d = PyObject_GetAttr(type, r->name);
    if (!d) {
        PyErr_Clear();
        return 0;
    }
    if (Py_IS_TYPE(d, &PyGetSetDescr_Type) && ((PyGetSetDescrObject *)d)->d_getset->get) {
        r->get = ((PyGetSetDescrObject *)d)->d_getset->get;
        r->closure = ((PyGetSetDescrObject *)d)->d_getset->closure;
    } else if (Py_IS_TYPE(d, &PyMethodDescr_Type)) {
        r->method = Py_NewRef(d);
    }
    Py_DECREF(d);
    return 0;
}

static void reader_clear(Reader *r) {
    Py_CLEAR(r->method);
    Py_CLEAR(r->name);
}

/* The attribute's value (a getter or attribute), or the method's result (``call``); NULL with an exception. */
static inline PyObject *read_attr(Reader *r, PyObject *t) {
    if (r->get)
        return r->get(t, r->closure);
    return PyObject_GetAttr(t, r->name);
}

static inline PyObject *call_method(Reader *r, PyObject *t) {
    if (r->method)
        return PyObject_Vectorcall(r->method, &t, 1, NULL);
    return PyObject_CallMethodNoArgs(t, r->name);
}

static int parse_dims(PyObject *t, long long *dims, int *rank) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > MAX_DIMS) {
        PyErr_SetString(PyExc_ValueError, "dims must be a tuple of at most 8 ints");
        return -1;
    }
    *rank = (int)PyTuple_GET_SIZE(t);
    for (int d = 0; d < *rank; d++)
        if (as_ll(PyTuple_GET_ITEM(t, d), &dims[d]) < 0) {
            PyErr_SetString(PyExc_ValueError, "dims must be ints");
            return -1;
        }
    return 0;
}

static int parse_int_tuple(PyObject *t, int *out, int *n, const char *what) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) > MAX_SLOTS) {
        PyErr_Format(PyExc_ValueError, "%s must be a tuple of at most %d ints", what, MAX_SLOTS);
        return -1;
    }
    *n = (int)PyTuple_GET_SIZE(t);
    for (int i = 0; i < *n; i++) {
        long long v;
        if (as_ll(PyTuple_GET_ITEM(t, i), &v) < 0) {
            PyErr_Format(PyExc_ValueError, "%s must be ints", what);
            return -1;
        }
        out[i] = (int)v;
    }
    return 0;
}

static PyObject *launcher_vectorcall(PyObject *callable, PyObject *const *argv, size_t nargsf, PyObject *kwnames);

/* Launcher(args, allocs, buf_src, int_src, float_src, aligned, nsyms, tensor_type, device_attr,
 *          launch_address, grid, block, shared, get_device, get_stream, after, fail, ndesc, descriptors)
 * args: one tuple per argument: (0, dtype, dims) a tensor, (1,) an int, (2,) a float.
 * allocs: (fn, dtype, dims, returned) each. grid: three ints, or a callable of the list of ints.
 * descriptors: None, or a callable of (tuple of buffer addresses, list of ints) returning ndesc objects with
 * the buffer protocol (a driver's descriptors, e.g. ctypes arrays), each passed by address after the floats. */
static PyObject *launcher_new(PyTypeObject *type, PyObject *a, PyObject *kw) {
    PyObject *args, *allocs, *buf_src, *int_src, *float_src, *aligned, *tensor_type, *device_attr, *grid;
    PyObject *get_device, *get_stream, *after, *fail, *descriptors, *shim = Py_None;
    int nsyms, ndesc;
    unsigned long long address;
    unsigned bx, by, bz, shared;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Launcher takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(a, "O!O!O!O!O!O!iOUKO(III)IOOOOiO|O", &PyTuple_Type, &args, &PyTuple_Type, &allocs,
                          &PyTuple_Type, &buf_src, &PyTuple_Type, &int_src, &PyTuple_Type, &float_src, &PyTuple_Type,
                          &aligned, &nsyms, &tensor_type, &device_attr, &address, &grid, &bx, &by, &bz, &shared,
                          &get_device, &get_stream, &after, &fail, &ndesc, &descriptors, &shim))
        return NULL;
    Launcher *self = (Launcher *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->vectorcall = launcher_vectorcall;
    self->cur_dev = -1;
    if (PyTuple_GET_SIZE(args) > MAX_ARGS || PyTuple_GET_SIZE(allocs) > MAX_ALLOCS || nsyms < 0 || nsyms > MAX_SYMS) {
        PyErr_SetString(PyExc_ValueError, "signature too large for the compiled launcher");
        goto fail;
    }
    self->nargs = (int)PyTuple_GET_SIZE(args);
    self->nsyms = nsyms;
    for (int j = 0; j < self->nargs; j++) {
        PyObject *e = PyTuple_GET_ITEM(args, j);
        long long kind;
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 1 || as_ll(PyTuple_GET_ITEM(e, 0), &kind) < 0) {
            PyErr_SetString(PyExc_ValueError, "an argument's plan must be a tuple starting with its kind");
            goto fail;
        }
        ArgPlan *p = &self->args[j];
        p->kind = (int)kind;
        if (kind == ARG_TENSOR) {
            long long code = -1;
            if ((PyTuple_GET_SIZE(e) != 3 && PyTuple_GET_SIZE(e) != 4) ||
                parse_dims(PyTuple_GET_ITEM(e, 2), p->dims, &p->rank) < 0)
                goto fail;
            if (PyTuple_GET_SIZE(e) == 4 && as_ll(PyTuple_GET_ITEM(e, 3), &code) < 0) {
                PyErr_SetString(PyExc_ValueError, "a tensor's dtype code must be an int");
                goto fail;
            }
            p->code = (int32_t)code;
            p->dtype = Py_NewRef(PyTuple_GET_ITEM(e, 1));
        } else if (kind != ARG_INT && kind != ARG_FLOAT) {
            PyErr_SetString(PyExc_ValueError, "unknown argument kind");
            goto fail;
        }
    }
    self->nallocs = (int)PyTuple_GET_SIZE(allocs);
    for (int m = 0; m < self->nallocs; m++) {
        PyObject *e = PyTuple_GET_ITEM(allocs, m);
        AllocPlan *p = &self->allocs[m];
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 4 || parse_dims(PyTuple_GET_ITEM(e, 2), p->dims, &p->rank) < 0)
            goto fail;
        p->fn = Py_NewRef(PyTuple_GET_ITEM(e, 0));
        p->dtype = Py_NewRef(PyTuple_GET_ITEM(e, 1));
        p->returned = PyObject_IsTrue(PyTuple_GET_ITEM(e, 3));
    }
    if (parse_int_tuple(buf_src, self->buf_src, &self->nb, "buf_src") < 0 ||
        parse_int_tuple(int_src, self->int_src, &self->ni, "int_src") < 0 ||
        parse_int_tuple(float_src, self->float_src, &self->nf, "float_src") < 0 ||
        parse_int_tuple(aligned, self->aligned, &self->naligned, "aligned") < 0)
        goto fail;
    if (ndesc < 0 || ndesc > MAX_DESCRIPTORS || (ndesc > 0) != (descriptors != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "descriptors: a callable for 1 to 8 of them, or None for none");
        goto fail;
    }
    self->ndesc = ndesc;
    self->descriptors = ndesc ? Py_NewRef(descriptors) : NULL;
    if (self->nb + self->ni + self->nf + ndesc + 1 > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "signature too large for the compiled launcher");
        goto fail;
    }
    if (!PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "tensor_type must be a type");
        goto fail;
    }
    self->tensor_type = Py_NewRef(tensor_type);
    self->device_attr = Py_NewRef(device_attr);
    PyUnicode_InternInPlace(&self->device_attr);
    if (reader_init(&self->read_dtype, tensor_type, "dtype") < 0 ||
        reader_init(&self->read_shape, tensor_type, "shape") < 0 ||
        reader_init(&self->read_flag, tensor_type, PyUnicode_AsUTF8(self->device_attr)) < 0 ||
        reader_init(&self->read_device, tensor_type, "device") < 0 ||
        reader_init(&self->call_contiguous, tensor_type, "is_contiguous") < 0 ||
        reader_init(&self->call_data_ptr, tensor_type, "data_ptr") < 0 ||
        reader_init(&self->read_cdata, tensor_type, "_cdata") < 0)
        goto fail;
    if (shim != Py_None) { /* (dtype, device_type, dim, sizes, is_contiguous, data_ptr addresses, device code) */
        unsigned long long f[6];
        int device;
        if (!PyArg_ParseTuple(shim, "KKKKKKi", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &device))
            goto fail;
        for (int j = 0; j < self->nargs; j++)
            if (self->args[j].kind == ARG_TENSOR && self->args[j].code < 0) {
                PyErr_SetString(PyExc_ValueError, "reading tensors through the shim needs every tensor's dtype code");
                goto fail;
            }
        self->shim.dtype = (shim_i32_t)(uintptr_t)f[0];
        self->shim.device_type = (shim_i32_t)(uintptr_t)f[1];
        self->shim.dim = (shim_i64_t)(uintptr_t)f[2];
        self->shim.sizes = (shim_sizes_t)(uintptr_t)f[3];
        self->shim.contiguous = (shim_bool_t)(uintptr_t)f[4];
        self->shim.data_ptr = (shim_ptr_t)(uintptr_t)f[5];
        self->shim.device = device;
        self->has_shim = 1;
    }
    self->launch = (launch_fn_t)(uintptr_t)address;
    if (PyCallable_Check(grid)) {
        self->grid_fn = Py_NewRef(grid);
    } else if (!PyArg_ParseTuple(grid, "III", &self->grid[0], &self->grid[1], &self->grid[2])) {
        goto fail;
    }
    self->block[0] = bx, self->block[1] = by, self->block[2] = bz, self->shared = shared;
    self->get_device = Py_NewRef(get_device);
    self->get_stream = Py_NewRef(get_stream);
    self->after = after == Py_None ? NULL : Py_NewRef(after);
    self->fail = Py_NewRef(fail);
    self->alloc_kwnames = Py_BuildValue("(ss)", "dtype", "device");
    if (!self->alloc_kwnames)
        goto fail;
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static void launcher_dealloc(Launcher *self) {
    for (int j = 0; j < self->nargs; j++)
        Py_XDECREF(self->args[j].dtype);
    for (int m = 0; m < self->nallocs; m++) {
        Py_XDECREF(self->allocs[m].fn);
        Py_XDECREF(self->allocs[m].dtype);
    }
    Py_XDECREF(self->tensor_type);
    Py_XDECREF(self->device_attr);
    Py_XDECREF(self->grid_fn);
    Py_XDECREF(self->get_device);
    Py_XDECREF(self->get_stream);
    Py_XDECREF(self->after);
    Py_XDECREF(self->fail);
    Py_XDECREF(self->descriptors);
    Py_XDECREF(self->alloc_kwnames);
    reader_clear(&self->read_dtype);
    reader_clear(&self->read_shape);
    reader_clear(&self->read_flag);
    reader_clear(&self->read_device);
    reader_clear(&self->call_contiguous);
    reader_clear(&self->call_data_ptr);
    reader_clear(&self->read_cdata);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* set_device(device, function, status_address): the device later calls must be on (its current device),
 * and the function handle and status word to launch with there. Until it is called every call returns
 * NotImplemented. */
static PyObject *launcher_set_device(Launcher *self, PyObject *a) {
    long long dev;
    unsigned long long function, status;
    if (!PyArg_ParseTuple(a, "LKK", &dev, &function, &status))
        return NULL;
    self->cur_dev = dev;
    self->function = (void *)(uintptr_t)function;
    self->status = (int64_t)status;
    Py_RETURN_NONE;
}

/* A tensor argument's checks; its address into *ptr. 0: it fits the plan; 1: it does not (no exception). */
static int bind_tensor(Launcher *self, ArgPlan *p, PyObject *t, long long *syms, int64_t *ptr) {
    if (Py_TYPE(t) != (PyTypeObject *)self->tensor_type)
        return 1;
    PyObject *o = read_attr(&self->read_dtype, t);
    if (!o)
        goto error;
    int ok = o == p->dtype;
    Py_DECREF(o);
    if (!ok)
        return 1;
    o = read_attr(&self->read_flag, t);
    if (!o)
        goto error;
    ok = o == Py_True;
    Py_DECREF(o);
    if (!ok)
        return 1;
    o = read_attr(&self->read_shape, t);
    if (!o)
        goto error;
    ok = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == p->rank;
    for (int d = 0; ok && d < p->rank; d++) {
        long long have;
        if (as_ll(PyTuple_GET_ITEM(o, d), &have) < 0) {
            ok = 0;
        } else if (p->dims[d] >= 0) {
            ok = have == p->dims[d];
        } else {
            long long *s = &syms[-p->dims[d] - 1];
            if (*s < 0)
                *s = have; /* the first tensor with this symbol binds it */
            else
                ok = *s == have;
        }
    }
    Py_DECREF(o);
    if (!ok)
        return 1;
    o = call_method(&self->call_contiguous, t);
    if (!o)
        goto error;
    ok = o == Py_True;
    Py_DECREF(o);
    if (!ok)
        return 1;
    o = call_method(&self->call_data_ptr, t);
    if (!o)
        goto error;
    long long v;
    ok = as_ll(o, &v) == 0;
    Py_DECREF(o);
    *ptr = (int64_t)v;
    return ok ? 0 : 1;
error:
    PyErr_Clear(); /* whatever went wrong, the Python path meets it again and reports it */
    return 1;
}

/* bind_tensor's checks through torch's C shim: the same facts (dtype, device type, rank and sizes, contiguity),
 * and the address, read from the tensor's TensorImpl with one Python getter (``_cdata``) instead of five. */
static int bind_tensor_shim(Launcher *self, ArgPlan *p, PyObject *t, long long *syms, int64_t *ptr) {
    if (Py_TYPE(t) != (PyTypeObject *)self->tensor_type)
        return 1;
    PyObject *o = read_attr(&self->read_cdata, t);
    if (!o)
        goto error;
    void *impl = PyLong_AsVoidPtr(o);
    Py_DECREF(o);
    if (!impl)
        goto error;
    void *h = &impl; /* an at::Tensor: one word, its TensorImpl's address */
    const Shim *f = &self->shim;
    int32_t v;
    int64_t rank, *sizes = NULL;
    bool contiguous;
    void *data;
    if (f->dtype(h, &v) || v != p->code || f->device_type(h, &v) || v != f->device || f->dim(h, &rank) ||
        rank != p->rank || (rank && (f->sizes(h, &sizes) || !sizes)))
        return 1;
    for (int d = 0; d < p->rank; d++) {
        long long have = sizes[d];
        if (p->dims[d] >= 0) {
            if (have != p->dims[d])
                return 1;
        } else {
            long long *s = &syms[-p->dims[d] - 1];
            if (*s < 0)
                *s = have; /* the first tensor with this symbol binds it */
            else if (*s != have)
                return 1;
        }
    }
    if (f->contiguous(h, &contiguous) || !contiguous || f->data_ptr(h, &data))
        return 1;
    *ptr = (int64_t)(intptr_t)data;
    return 0;
error:
    PyErr_Clear();
    return 1;
}

/* One call: the kernel's arguments are the n objects at items (a tuple's items, or a vectorcall's array). */
static PyObject *launcher_run(Launcher *self, PyObject *const *items, Py_ssize_t n) {
    if (n != self->nargs)
        Py_RETURN_NOTIMPLEMENTED;

    long long syms[MAX_SYMS];
    for (int k = 0; k < self->nsyms; k++)
        syms[k] = -1;
    int64_t argval[MAX_ARGS]; /* tensors: the address; ints: the value */
    double argf[MAX_ARGS];
    PyObject *last_tensor = NULL;
    for (int j = 0; j < self->nargs; j++) {
        ArgPlan *p = &self->args[j];
        PyObject *a = items[j];
        if (p->kind == ARG_TENSOR) {
            if (self->has_shim ? bind_tensor_shim(self, p, a, syms, &argval[j]) : bind_tensor(self, p, a, syms, &argval[j]))
                Py_RETURN_NOTIMPLEMENTED;
            last_tensor = a;
        } else if (p->kind == ARG_INT) {
            long long v;
            if (!PyLong_CheckExact(a) || as_ll(a, &v) < 0)
                Py_RETURN_NOTIMPLEMENTED;
            argval[j] = v;
        } else if (PyFloat_CheckExact(a)) {
            argf[j] = PyFloat_AS_DOUBLE(a);
        } else if (PyLong_CheckExact(a)) {
            argf[j] = PyLong_AsDouble(a);
            if (argf[j] == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                Py_RETURN_NOTIMPLEMENTED;
            }
        } else {
            Py_RETURN_NOTIMPLEMENTED;
        }
    }

    PyObject *dev_obj = PyObject_CallNoArgs(self->get_device);
    long long dev;
    if (!dev_obj)
        return NULL; /* the device query itself failed: the Python path would raise the same */
    int same = as_ll(dev_obj, &dev) == 0 && dev == self->cur_dev;
    if (!same) { /* another device (or the first call): the Python path loads the function there */
        Py_DECREF(dev_obj);
        Py_RETURN_NOTIMPLEMENTED;
    }

    int64_t store[MAX_SLOTS];
    double dbl[MAX_SLOTS];
    void *params[MAX_SLOTS];
    PyObject *made[MAX_ALLOCS];
    int nmade = 0;
    PyObject *result = NULL, *device = NULL, *stream_obj = NULL, *ints = NULL, *desc = NULL;
    Py_buffer views[MAX_DESCRIPTORS];
    int nviews = 0;
    int nb = self->nb, ni = self->ni, nf = self->nf;

    if (self->nallocs) {
        device = read_attr(&self->read_device, last_tensor);
        if (!device)
            goto miss;
    }
    for (int m = 0; m < self->nallocs; m++) {
        AllocPlan *p = &self->allocs[m];
        PyObject *shape = PyTuple_New(p->rank);
        if (!shape)
            goto miss;
        for (int d = 0; d < p->rank; d++) {
            long long v = p->dims[d] >= 0 ? p->dims[d] : syms[-p->dims[d] - 1];
            PyObject *n = PyLong_FromLongLong(v);
            if (!n) {
                Py_DECREF(shape);
                goto miss;
            }
            PyTuple_SET_ITEM(shape, d, n);
        }
        PyObject *call[3] = {shape, p->dtype, device};
        made[nmade] = PyObject_Vectorcall(p->fn, call, 1, self->alloc_kwnames);
        Py_DECREF(shape);
        if (!made[nmade])
            goto miss;
        nmade++;
    }
    for (int b = 0; b < nb; b++) {
        int src = self->buf_src[b];
        if (src >= 0) {
            store[b] = argval[src];
        } else {
            PyObject *o = PyObject_CallMethodNoArgs(made[-src - 1], self->call_data_ptr.name);
            long long v;
            if (!o)
                goto miss;
            int ok = as_ll(o, &v) == 0;
            Py_DECREF(o);
            if (!ok)
                goto miss;
            store[b] = (int64_t)v;
        }
    }
    for (int i = 0; i < self->naligned; i++)
        if (store[self->aligned[i]] % 16)
            goto miss; /* the Python path raises its alignment error */
    for (int i = 0; i < ni; i++) {
        int src = self->int_src[i];
        store[nb + i] = src >= 0 ? (int64_t)syms[src] : argval[-src - 1];
    }
    for (int i = 0; i < nf; i++)
        dbl[i] = argf[self->float_src[i]];
    store[nb + ni] = self->status;
    for (int k = 0; k < nb + ni; k++)
        params[k] = &store[k];
    for (int k = 0; k < nf; k++)
        params[nb + ni + k] = &dbl[k];
    params[nb + ni + nf + self->ndesc] = &store[nb + ni];

    if (self->grid_fn || self->ndesc) { /* the integers as the Python launch has them */
        ints = PyList_New(ni);
        if (!ints)
            goto miss;
        for (int i = 0; i < ni; i++) {
            PyObject *n = PyLong_FromLongLong(store[nb + i]);
            if (!n)
                goto miss;
            PyList_SET_ITEM(ints, i, n);
        }
    }
    unsigned grid[3] = {self->grid[0], self->grid[1], self->grid[2]};
    if (self->grid_fn) {
        PyObject *g = PyObject_CallOneArg(self->grid_fn, ints);
        long long gv[3];
        int ok = g && PyTuple_Check(g) && PyTuple_GET_SIZE(g) == 3 && as_ll(PyTuple_GET_ITEM(g, 0), &gv[0]) == 0 &&
                 as_ll(PyTuple_GET_ITEM(g, 1), &gv[1]) == 0 && as_ll(PyTuple_GET_ITEM(g, 2), &gv[2]) == 0 &&
                 gv[0] <= 0xFFFFFFFFLL && gv[1] <= 0xFFFFFFFFLL && gv[2] <= 0xFFFFFFFFLL;
        Py_XDECREF(g);
        if (!ok)
            goto miss;
        if (gv[0] <= 0 || gv[1] <= 0 || gv[2] <= 0)
            goto done; /* nothing to run: the outputs are returned as the Python launch returns them */
        grid[0] = (unsigned)gv[0], grid[1] = (unsigned)gv[1], grid[2] = (unsigned)gv[2];
    }
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
        goto done;
    if (self->ndesc) { /* after the grid check, as in the Python launch (its errors are the Python path's) */
        PyObject *bufs = PyTuple_New(nb);
        if (!bufs)
            goto miss;
        for (int b = 0; b < nb; b++) {
            PyObject *n = PyLong_FromLongLong(store[b]);
            if (!n) {
                Py_DECREF(bufs);
                goto miss;
            }
            PyTuple_SET_ITEM(bufs, b, n);
        }
        desc = PyObject_CallFunctionObjArgs(self->descriptors, bufs, ints, NULL);
        Py_DECREF(bufs);
        if (!desc || !PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != self->ndesc)
            goto miss;
        for (; nviews < self->ndesc; nviews++) { /* held (and the tuple with them) until after the launch */
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(desc, nviews), &views[nviews], PyBUF_SIMPLE) < 0)
                goto miss;
            params[nb + ni + nf + nviews] = views[nviews].buf;
        }
    }

    stream_obj = PyObject_CallOneArg(self->get_stream, dev_obj);
    if (!stream_obj)
        goto miss;
    void *stream = PyLong_AsVoidPtr(stream_obj);
    if (!stream && PyErr_Occurred())
        goto miss;
    int rc = self->launch(self->function, grid[0], grid[1], grid[2], self->block[0], self->block[1], self->block[2],
                          self->shared, stream, params, NULL);
    if (rc != 0) {
        PyObject *r = PyObject_CallFunction(self->fail, "i(III)", rc, grid[0], grid[1], grid[2]);
        if (r) { /* fail() must raise; one that returns leaves a plain error */
            Py_DECREF(r);
            PyErr_Format(PyExc_RuntimeError, "kernel launch failed with code %d", rc);
        }
        goto error;
    }
    if (self->after) {
        PyObject *r = PyObject_CallNoArgs(self->after);
        if (!r)
            goto error;
        Py_DECREF(r);
    }
done: {
    int nret = 0;
    for (int m = 0; m < nmade; m++)
        nret += self->allocs[m].returned;
    if (nret == 0) {
        result = Py_NewRef(Py_None);
    } else if (nret == 1) {
        for (int m = 0; m < nmade; m++)
            if (self->allocs[m].returned)
                result = Py_NewRef(made[m]);
    } else {
        result = PyList_New(nret);
        if (!result)
            goto error;
        for (int m = 0, r = 0; m < nmade; m++)
            if (self->allocs[m].returned)
                PyList_SET_ITEM(result, r++, Py_NewRef(made[m]));
    }
}
error:
    for (int v = 0; v < nviews; v++)
        PyBuffer_Release(&views[v]);
    Py_XDECREF(desc);
    Py_XDECREF(ints);
    for (int m = 0; m < nmade; m++)
        Py_DECREF(made[m]);
    Py_XDECREF(device);
    Py_XDECREF(stream_obj);
    Py_DECREF(dev_obj);
    return result;
miss:
    PyErr_Clear();
    result = Py_NewRef(Py_NotImplemented);
    goto error;
}

static PyObject *launcher_vectorcall(PyObject *callable, PyObject *const *argv, size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a Launcher takes one argument: the tuple of the kernel's arguments");
        return NULL;
    }
    PyObject *args = argv[0];
    if (!PyTuple_Check(args))
        Py_RETURN_NOTIMPLEMENTED;
    return launcher_run((Launcher *)callable, &PyTuple_GET_ITEM(args, 0), PyTuple_GET_SIZE(args));
}

static PyObject *launcher_reads(Launcher *self, void *closure) {
    return PyUnicode_FromString(self->has_shim ? "shim" : "getters");
}

static PyGetSetDef launcher_getset[] = {
    {"reads", (getter)launcher_reads, NULL, "how calls read tensors: 'shim' (torch's C shim) or 'getters'", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef launcher_methods[] = {
    {"set_device", (PyCFunction)launcher_set_device, METH_VARARGS,
     "set_device(device, function, status_address): where later calls launch"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tilecore_launch.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A kernel's compiled launcher: launcher(args) -> outputs, or NotImplemented",
    .tp_new = launcher_new,
    .tp_dealloc = (destructor)launcher_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Launcher, vectorcall),
    .tp_methods = launcher_methods,
    .tp_getset = launcher_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_tilecore_launch",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__tilecore_launch(void) {
    if (PyType_Ready(&LauncherType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "Launcher", (PyObject *)&LauncherType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
