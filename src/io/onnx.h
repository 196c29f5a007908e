// ONNX, the graph format onnxruntime (and TensorRT, DirectML, transformers.js, vendor compilers) runs: a
// ModelProto (protobuf) of one graph, its nodes in topological order, its weights as initializers, inline or in
// an external data file beside it. A builder collects the nodes and the inputs'/outputs' types as encoded
// protobuf; the initializers' data is streamed when the file is written (a weight is converted from the slab a
// chunk at a time, so a model is never held twice).
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/util.h"

// onnx.proto's TensorProto.DataType values grpo writes.
typedef enum { ONNX_FLOAT = 1, ONNX_INT64 = 7, ONNX_FLOAT16 = 10, ONNX_DOUBLE = 11 } OnnxType;

#define ONNX_OPSET 17
#define ONNX_MAX_DIMS 4

typedef struct {
    char *name;
    OnnxType type;
    int ndim;
    int64_t dims[ONNX_MAX_DIMS];
    size_t n;                // elements
    Buf raw;                 // a constant's bytes in `type`; or else
    const void *src;         // n elements of src_dtype, converted to `type` as they are written
    DType src_dtype;
} OnnxInit;

typedef struct {
    Buf nodes, io;           // the encoded nodes, and the graph's inputs and outputs
    OnnxInit *inits;
    int n_inits, cap_inits;
    char **names;            // the value names the builder made (freed with it)
    int n_names, cap_names;
} Onnx;

// A node `op` of inputs in... (NULL-terminated; "" leaves an optional input out) and attributes from a spec of
// space-separated name=value: a value with a comma is a list of ints ("perm=0,2,1,3", "axes=-1,"), with '.' or
// 'e' a float ("alpha=0.5"), else an int. Its output is `out`, or a fresh name (NULL); returns it.
const char *onnx_node(Onnx *g, const char *out, const char *op, const char *attrs, ...);
// Initializers, returned by name: an int64 vector, an int64 and a float scalar (shape []), n floats (doubles)
// as a vector, and a weight of dims[0..ndim) elements read from src (src_dtype) and stored as `type`.
const char *onnx_ints(Onnx *g, int n, const int64_t *v);
const char *onnx_int(Onnx *g, int64_t v);
const char *onnx_scalar(Onnx *g, float v);
const char *onnx_floats(Onnx *g, const char *name, const float *v, int64_t n);
const char *onnx_doubles(Onnx *g, const double *v, int64_t n);
const char *onnx_weight(Onnx *g, const char *name, const void *src, DType src_dtype, OnnxType type, int ndim,
                        const int64_t *dims);
// A graph input (output 0) or output (1): its element type and shape, comma-separated dims, each a number or a
// symbolic name ("batch_size,sequence_length").
void onnx_io(Onnx *g, int output, const char *name, OnnxType type, const char *shape);
// Dies naming the first f16 weight whose source holds a value beyond half precision's range (or a NaN).
void onnx_check_range(const Onnx *g);
// The initializers' bytes.
size_t onnx_weight_bytes(const Onnx *g);
// Writes the model to `path` (atomically); with data_name, every initializer of 1 KiB or more goes to the file
// data_name beside it (ONNX's external data: needed past protobuf's 2 GB). `progress`: print as it goes.
void onnx_write(const Onnx *g, const char *path, const char *data_name, int progress);
void onnx_free(Onnx *g);
