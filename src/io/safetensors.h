// safetensors files: read through mmap with every header field validated, written atomically.
// Format: u64 little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    char dtype_name[12];
    DType dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const void *data;  // points into the mapping
    size_t nbytes;
} StTensor;

typedef struct {
    char *path;
    void *map;
    size_t map_size;
    int n_tensors;
    StTensor *tensors;
} SafeTensors;

// Opens and validates `path`; dies with a one-line error naming the file (and tensor) otherwise.
void safetensors_open(SafeTensors *st, const char *path);
void safetensors_close(SafeTensors *st);
const StTensor *safetensors_find(const SafeTensors *st, const char *name);
// Drops the pages of t's first `bytes` bytes of data from this process's memory once they have been
// copied out (a later read maps them from the file again), so a loader holds one copy of the weights, not
// two; pages that hold later bytes too stay.
void safetensors_release(const StTensor *t, size_t bytes);

// A tensor to write: fp32 data, stored as `dtype` (F32 or BF16).
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data;
} StWriteTensor;
void safetensors_write(const char *path, const StWriteTensor *tensors, int n, DType dtype);
