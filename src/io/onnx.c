#include "io/onnx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Protobuf's wire types and the field numbers of onnx.proto's messages that grpo writes.
enum { VARINT = 0, FIXED32 = 5, LEN = 2 };
enum { MODEL_IR = 1, MODEL_PRODUCER = 2, MODEL_GRAPH = 7, MODEL_OPSET = 8, OPSET_VERSION = 2 };
enum { GRAPH_NODE = 1, GRAPH_NAME = 2, GRAPH_INIT = 5, GRAPH_INPUT = 11, GRAPH_OUTPUT = 12 };
enum { NODE_INPUT = 1, NODE_OUTPUT = 2, NODE_OP = 4, NODE_ATTR = 5 };
enum { ATTR_NAME = 1, ATTR_F = 2, ATTR_I = 3, ATTR_INTS = 8, ATTR_TYPE = 20 };
enum { ATTR_FLOAT = 1, ATTR_INT = 2, ATTR_INTS_TYPE = 7 };  // AttributeProto.AttributeType
enum { TENSOR_DIMS = 1, TENSOR_TYPE = 2, TENSOR_NAME = 8, TENSOR_RAW = 9 };
enum { TENSOR_EXTERNAL = 13, TENSOR_LOCATION = 14 };
enum { VALUE_NAME = 1, VALUE_TYPE = 2, TYPE_TENSOR = 1, TENSOR_ELEM = 1, TENSOR_SHAPE = 2 };
enum { SHAPE_DIM = 1, DIM_VALUE = 1, DIM_PARAM = 2, ENTRY_KEY = 1, ENTRY_VALUE = 2 };

#define IR_VERSION 8          // what opset 17 needs
#define EXTERNAL_MIN 1024     // initializers from this many bytes go to the external data file
#define EXTERNAL_ALIGN 4096   // where each starts in it (onnxruntime can map them)
#define CHUNK ((size_t)1 << 20)
#define F16_MAX 65504.0f      // the largest finite half-precision value (larger ones would round to inf)

static void varint(Buf *b, uint64_t v) {
    uint8_t p[10];
    int n = 0;
    do {
        p[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    buf_append(b, p, (size_t)n);
}

static void tag(Buf *b, int field, int wire) { varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void field_int(Buf *b, int field, int64_t v) {
    tag(b, field, VARINT);
    varint(b, (uint64_t)v);
}

static void field_bytes(Buf *b, int field, const void *p, size_t n) {
    tag(b, field, LEN);
    varint(b, n);
    buf_append(b, p, n);
}

static void field_str(Buf *b, int field, const char *s) { field_bytes(b, field, s, strlen(s)); }

// A sub-message: its encoded bytes as field `field` of b; frees them.
static void field_msg(Buf *b, int field, Buf *msg) {
    field_bytes(b, field, msg->data, msg->len);
    buf_free(msg);
}

static const char *keep(Onnx *g, char *name) {
    if (g->n_names == g->cap_names) {
        g->cap_names = g->cap_names ? 2 * g->cap_names : 256;
        g->names = xrealloc(g->names, (size_t)g->cap_names * sizeof *g->names);
    }
    g->names[g->n_names++] = name;
    return name;
}

// One attribute "name=value" of a node's spec into b.
static void attribute(Buf *b, const char *spec, size_t n) {
    const char *eq = memchr(spec, '=', n);
    if (!eq) die("internal: ONNX attribute \"%.*s\"", (int)n, spec);
    char *value = xprintf("%.*s", (int)(spec + n - eq - 1), eq + 1);
    Buf a = {0};
    tag(&a, ATTR_NAME, LEN);
    varint(&a, (uint64_t)(eq - spec));
    buf_append(&a, spec, (size_t)(eq - spec));
    if (strchr(value, ',')) {
        for (char *p = value; *p; p += *p == ',') {
            char *end;
            long long v = strtoll(p, &end, 10);
            if (end == p) die("internal: ONNX attribute \"%.*s\"", (int)n, spec);
            field_int(&a, ATTR_INTS, v);
            p = end;
        }
        field_int(&a, ATTR_TYPE, ATTR_INTS_TYPE);
    } else if (strpbrk(value, ".e")) {
        float f = strtof(value, NULL);
        tag(&a, ATTR_F, FIXED32);
        buf_append(&a, &f, 4);
        field_int(&a, ATTR_TYPE, ATTR_FLOAT);
    } else {
        field_int(&a, ATTR_I, strtoll(value, NULL, 10));
        field_int(&a, ATTR_TYPE, ATTR_INT);
    }
    field_msg(b, NODE_ATTR, &a);
    free(value);
}

const char *onnx_node(Onnx *g, const char *out, const char *op, const char *attrs, ...) {
    Buf n = {0};
    va_list ap;
    va_start(ap, attrs);
    for (const char *in = va_arg(ap, const char *); in; in = va_arg(ap, const char *))
        field_str(&n, NODE_INPUT, in);
    va_end(ap);
    out = out ? out : keep(g, xprintf("t%d", g->n_names));
    field_str(&n, NODE_OUTPUT, out);
    field_str(&n, NODE_OP, op);
    for (const char *a = attrs; a && *a;) {
        size_t len = strcspn(a, " ");
        attribute(&n, a, len);
        a += len + (a[len] == ' ');
    }
    field_msg(&g->nodes, GRAPH_NODE, &n);
    return out;
}

static size_t type_size(OnnxType t) { return t == ONNX_FLOAT16 ? 2 : t == ONNX_FLOAT ? 4 : 8; }  // INT64, DOUBLE

static OnnxInit *init(Onnx *g, char *name, OnnxType type, int ndim, const int64_t *dims) {
    if (ndim > ONNX_MAX_DIMS) die("internal: an ONNX initializer of %d dims", ndim);
    if (g->n_inits == g->cap_inits) {
        g->cap_inits = g->cap_inits ? 2 * g->cap_inits : 256;
        g->inits = xrealloc(g->inits, (size_t)g->cap_inits * sizeof *g->inits);
    }
    OnnxInit *t = &g->inits[g->n_inits++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->type = type;
    t->ndim = ndim;
    t->n = 1;
    for (int i = 0; i < ndim; i++) {
        t->dims[i] = dims[i];
        t->n *= (size_t)dims[i];
    }
    return t;
}

const char *onnx_ints(Onnx *g, int n, const int64_t *v) {
    int64_t dims[1] = {n};
    OnnxInit *t = init(g, xprintf("c%d", g->n_inits), ONNX_INT64, 1, dims);
    buf_append(&t->raw, v, (size_t)n * sizeof *v);
    return t->name;
}

const char *onnx_int(Onnx *g, int64_t v) {
    OnnxInit *t = init(g, xprintf("c%d", g->n_inits), ONNX_INT64, 0, NULL);
    buf_append(&t->raw, &v, sizeof v);
    return t->name;
}

const char *onnx_scalar(Onnx *g, float v) {
    OnnxInit *t = init(g, xprintf("c%d", g->n_inits), ONNX_FLOAT, 0, NULL);
    buf_append(&t->raw, &v, sizeof v);
    return t->name;
}

const char *onnx_floats(Onnx *g, const char *name, const float *v, int64_t n) {
    OnnxInit *t = init(g, name ? xstrdup(name) : xprintf("c%d", g->n_inits), ONNX_FLOAT, 1, &n);
    buf_append(&t->raw, v, (size_t)n * sizeof *v);
    return t->name;
}

const char *onnx_doubles(Onnx *g, const double *v, int64_t n) {
    OnnxInit *t = init(g, xprintf("c%d", g->n_inits), ONNX_DOUBLE, 1, &n);
    buf_append(&t->raw, v, (size_t)n * sizeof *v);
    return t->name;
}

const char *onnx_weight(Onnx *g, const char *name, const void *src, DType src_dtype, OnnxType type, int ndim,
                        const int64_t *dims) {
    OnnxInit *t = init(g, xstrdup(name), type, ndim, dims);
    t->src = src;
    t->src_dtype = src_dtype;
    return t->name;
}

void onnx_io(Onnx *g, int output, const char *name, OnnxType type, const char *shape) {
    Buf dims = {0};
    for (const char *s = shape; *s;) {
        size_t len = strcspn(s, ",");
        Buf d = {0};
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s + len)
            field_int(&d, DIM_VALUE, v);
        else
            field_bytes(&d, DIM_PARAM, s, len);
        field_msg(&dims, SHAPE_DIM, &d);
        s += len + (s[len] == ',');
    }
    Buf tensor = {0}, type_msg = {0}, value = {0};
    field_int(&tensor, TENSOR_ELEM, type);
    field_msg(&tensor, TENSOR_SHAPE, &dims);
    field_msg(&type_msg, TYPE_TENSOR, &tensor);
    field_str(&value, VALUE_NAME, name);
    field_msg(&value, VALUE_TYPE, &type_msg);
    field_msg(&g->io, output ? GRAPH_OUTPUT : GRAPH_INPUT, &value);
}

static size_t data_bytes(const OnnxInit *t) { return t->n * type_size(t->type); }

size_t onnx_weight_bytes(const Onnx *g) {
    size_t n = 0;
    for (int i = 0; i < g->n_inits; i++) n += data_bytes(&g->inits[i]);
    return n;
}

static int is_external(const OnnxInit *t, const char *data_name) {
    return data_name && data_bytes(t) >= EXTERNAL_MIN;
}

static size_t aligned(size_t n) { return (n + EXTERNAL_ALIGN - 1) / EXTERNAL_ALIGN * EXTERNAL_ALIGN; }

static void entry(Buf *b, const char *key, const char *value) {
    Buf e = {0};
    field_str(&e, ENTRY_KEY, key);
    field_str(&e, ENTRY_VALUE, value);
    field_msg(b, TENSOR_EXTERNAL, &e);
}

// An initializer's TensorProto up to its data (inline: raw_data's tag and length, the bytes to follow; external:
// where they are); *total: the message's length with its data.
static void tensor_head(Buf *b, const OnnxInit *t, const char *data_name, size_t offset, size_t *total) {
    for (int i = 0; i < t->ndim; i++) field_int(b, TENSOR_DIMS, t->dims[i]);
    field_int(b, TENSOR_TYPE, t->type);
    field_str(b, TENSOR_NAME, t->name);
    size_t bytes = data_bytes(t);
    if (is_external(t, data_name)) {
        char num[32];
        entry(b, "location", data_name);
        snprintf(num, sizeof num, "%zu", offset);
        entry(b, "offset", num);
        snprintf(num, sizeof num, "%zu", bytes);
        entry(b, "length", num);
        field_int(b, TENSOR_LOCATION, 1);
        *total = b->len;
        return;
    }
    tag(b, TENSOR_RAW, LEN);
    varint(b, bytes);
    *total = b->len + bytes;
}

// An initializer's data in its type to f: a constant's bytes, or its source converted a chunk at a time.
static void write_data(AtomicFile *f, const OnnxInit *t, float *rows, void *out) {
    if (!t->src) {
        atomic_file_write(f, t->raw.data, t->raw.len);
        return;
    }
    size_t in = dtype_size(t->src_dtype);
    for (size_t i = 0; i < t->n; i += CHUNK) {
        size_t n = t->n - i < CHUNK ? t->n - i : CHUNK;
        dtype_to_f32(t->src_dtype, (const char *)t->src + i * in, rows, n);
        if (t->type == ONNX_FLOAT) {
            atomic_file_write(f, rows, n * sizeof *rows);
            continue;
        }
        if (t->type != ONNX_FLOAT16) die("internal: an ONNX weight of type %d", t->type);
        dtype_from_f32(DTYPE_F16, rows, out, n);
        atomic_file_write(f, out, n * 2);
    }
}

void onnx_check_range(const Onnx *g) {
    float *rows = xmalloc(CHUNK * sizeof *rows);
    for (int k = 0; k < g->n_inits; k++) {
        const OnnxInit *t = &g->inits[k];
        if (!t->src || t->type != ONNX_FLOAT16) continue;
        for (size_t i = 0; i < t->n; i += CHUNK) {
            size_t n = t->n - i < CHUNK ? t->n - i : CHUNK;
            dtype_to_f32(t->src_dtype, (const char *)t->src + i * dtype_size(t->src_dtype), rows, n);
            for (size_t j = 0; j < n; j++)
                if (!(fabsf(rows[j]) <= F16_MAX))
                    die("%s: element %zu is %g, beyond f16's range (the file would hold inf): export it with "
                        "--dtype f32", t->name, i + j, (double)rows[j]);
        }
    }
    free(rows);
}

void onnx_write(const Onnx *g, const char *path, const char *data_name, int progress) {
    Buf head = {0}, opset = {0}, graph = {0};
    field_int(&head, MODEL_IR, IR_VERSION);
    field_str(&head, MODEL_PRODUCER, "grpo");
    field_int(&opset, OPSET_VERSION, ONNX_OPSET);
    field_msg(&head, MODEL_OPSET, &opset);
    field_str(&graph, GRAPH_NAME, "main_graph");
    // each initializer's field up to its data: its tag and length, then tensor_head's bytes
    Buf *heads = xcalloc((size_t)g->n_inits + 1, sizeof *heads);
    size_t graph_len = graph.len + g->nodes.len + g->io.len, offset = 0;
    for (int i = 0; i < g->n_inits; i++) {
        size_t total;
        Buf msg = {0};
        tensor_head(&msg, &g->inits[i], data_name, offset, &total);
        if (is_external(&g->inits[i], data_name)) offset = aligned(offset + data_bytes(&g->inits[i]));
        tag(&heads[i], GRAPH_INIT, LEN);
        varint(&heads[i], total);
        graph_len += heads[i].len + total;
        buf_append(&heads[i], msg.data, msg.len);
        buf_free(&msg);
    }
    tag(&head, MODEL_GRAPH, LEN);
    varint(&head, graph_len);
    float *rows = xmalloc(CHUNK * sizeof *rows);
    void *out = xmalloc(CHUNK * sizeof(float));
    AtomicFile f, data;
    char *data_path = NULL;
    if (data_name) {
        char *slash = strrchr(path, '/');
        data_path = slash ? xprintf("%.*s/%s", (int)(slash - path), path, data_name) : xstrdup(data_name);
        atomic_file_open(&data, data_path);
    }
    atomic_file_open(&f, path);
    atomic_file_write(&f, head.data, head.len);
    atomic_file_write(&f, graph.data, graph.len);
    atomic_file_write(&f, g->nodes.data, g->nodes.len);
    atomic_file_write(&f, g->io.data, g->io.len);
    size_t done = 0, total = onnx_weight_bytes(g);
    double shown = time_now();
    static const char zeros[EXTERNAL_ALIGN];
    offset = 0;
    for (int i = 0; i < g->n_inits; i++) {
        const OnnxInit *t = &g->inits[i];
        atomic_file_write(&f, heads[i].data, heads[i].len);
        if (is_external(t, data_name)) {
            write_data(&data, t, rows, out);
            size_t end = offset + data_bytes(t);
            offset = aligned(end);
            atomic_file_write(&data, zeros, offset - end);
        } else {
            write_data(&f, t, rows, out);
        }
        done += data_bytes(t);
        if (progress && time_now() - shown > 5) {
            shown = time_now();
            fprintf(stderr, "grpo export: %.0f%% (%s)\n", 100.0 * (double)done / (double)total, t->name);
        }
    }
    if (data_name) atomic_file_commit(&data);  // the data first: a model file never names missing data
    atomic_file_commit(&f);
    for (int i = 0; i < g->n_inits; i++) buf_free(&heads[i]);
    free(heads);
    free(rows);
    free(out);
    free(data_path);
    buf_free(&head);
    buf_free(&graph);
}

void onnx_free(Onnx *g) {
    buf_free(&g->nodes);
    buf_free(&g->io);
    for (int i = 0; i < g->n_inits; i++) {
        free(g->inits[i].name);
        buf_free(&g->inits[i].raw);
    }
    for (int i = 0; i < g->n_names; i++) free(g->names[i]);
    free(g->inits);
    free(g->names);
    memset(g, 0, sizeof *g);
}
