#define _DEFAULT_SOURCE  // madvise (with POSIX.1-2008)
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "base/util.h"

// The format allows 100 MB of header; ours is lower because a header's parse takes up to about 28 times its
// size. Real checkpoints need far less (a 7B model: 30 kB; 100,000 tensors: about 10 MB).
#define ST_MAX_HEADER (16u << 20)

static int cmp_by_offset(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    const char *px = x->data, *py = y->data;
    if (px != py) return (px > py) - (px < py);
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);  // empty tensors before one at the same offset
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const StTensor *const *)a)->name, (*(const StTensor *const *)b)->name);
}

// Fills t from one header entry; dies naming file and tensor on any inconsistency.
static void parse_entry(StTensor *t, const cJSON *e, const char *path, const char *data, size_t data_size) {
    const char *name = t->name;
    if (!cJSON_IsObject(e)) die("%s: tensor \"%s\": header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) die("%s: tensor \"%s\": missing dtype", path, name);
    size_t esize = dtype_size_of_name(dt->valuestring, &t->dtype);
    if (!esize) die("%s: tensor \"%s\": unknown dtype \"%.20s\"", path, name, dt->valuestring);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt->valuestring);
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > ST_MAX_DIMS)
        die("%s: tensor \"%s\": shape must be an array of at most %d sizes", path, name, ST_MAX_DIMS);
    t->ndim = cJSON_GetArraySize(shape);
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t s;
        if (!json_as_int(cJSON_GetArrayItem(shape, d), 0, INT64_C(1) << 40, &s))
            die("%s: tensor \"%s\": invalid shape entry %d", path, name, d);
        t->shape[d] = s;
        if (s && t->numel > (INT64_C(1) << 50) / s) die("%s: tensor \"%s\": shape too large", path, name);
        t->numel *= s;
    }
    int64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !json_as_int(cJSON_GetArrayItem(offs, 0), 0, INT64_MAX / 2, &begin) ||
        !json_as_int(cJSON_GetArrayItem(offs, 1), 0, INT64_MAX / 2, &end))
        die("%s: tensor \"%s\": data_offsets must be two non-negative integers", path, name);
    if (begin > end) die("%s: tensor \"%s\": data_offsets end %lld is before begin %lld", path, name, (long long)end, (long long)begin);
    if ((uint64_t)end > data_size)
        die("%s: tensor \"%s\": data_offsets [%lld, %lld] out of range (data is %zu bytes; file truncated?)", path,
            name, (long long)begin, (long long)end, data_size);
    t->nbytes = (size_t)(end - begin);
    if (t->nbytes != (size_t)t->numel * esize)
        die("%s: tensor \"%s\": %zu bytes of data but shape x dtype needs %lld", path, name, t->nbytes,
            (long long)(t->numel * (int64_t)esize));
    t->data = data + begin;
}

void safetensors_open(SafeTensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    st->path = xstrdup(path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) die("cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) die("%s: not a regular file", path);
    size_t size = (size_t)sb.st_size;
    if (size < 8) die("%s: truncated safetensors file (%zu bytes, no header)", path, size);
    st->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (st->map == MAP_FAILED) die("cannot mmap %s: %s", path, strerror(errno));
    st->map_size = size;

    uint64_t hlen = 0;
    const unsigned char *p = st->map;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > size - 8) die("%s: header length %llu is larger than the file (%zu bytes)", path, (unsigned long long)hlen, size);
    if (hlen > ST_MAX_HEADER)
        die("%s: header length %llu exceeds this loader's %u MiB limit", path, (unsigned long long)hlen,
            ST_MAX_HEADER >> 20);
    const char *hdr = (const char *)p + 8;
    cJSON *root = json_parse_exact(hdr, (size_t)hlen, NULL);
    if (!root || !cJSON_IsObject(root)) die("%s: header is not a valid JSON object", path);
    const char *data = hdr + hlen;
    size_t data_size = size - 8 - (size_t)hlen;

    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
    st->tensors = xcalloc((size_t)n, sizeof(StTensor));
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        StTensor *t = &st->tensors[st->n_tensors++];
        t->name = xstrdup(e->string);
        parse_entry(t, e, path, data, data_size);
    }
    cJSON_Delete(root);

    // Duplicate names make a file ambiguous: sorted by name, duplicates are neighbours (n log n: a header
    // may list 100,000s of entries).
    StTensor **order = xmalloc((size_t)(n ? n : 1) * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = &st->tensors[i];
    qsort(order, (size_t)n, sizeof *order, cmp_by_name);
    for (int i = 1; i < n; i++)
        if (strcmp(order[i - 1]->name, order[i]->name) == 0)
            die("%s: tensor \"%s\" appears twice in the header", path, order[i]->name);
    // As the format requires, the tensors tile the data exactly: each starts where the one before it
    // ends, from 0 to the end of the file. A gap, an overlap or trailing bytes mean a corrupt file
    // (a header length off by one shifts every tensor and shows up here).
    qsort(order, (size_t)n, sizeof *order, cmp_by_offset);
    size_t end = 0;
    for (int i = 0; i < n; i++) {
        size_t begin = (size_t)((const char *)order[i]->data - data);
        if (begin < end)
            die("%s: tensors \"%s\" and \"%s\" have overlapping data_offsets", path, order[i - 1]->name,
                order[i]->name);
        if (begin > end)
            die("%s: tensor \"%s\" starts at byte %zu of the data, leaving a gap after byte %zu (the tensors "
                "must tile the data)", path, order[i]->name, begin, end);
        end = begin + order[i]->nbytes;
    }
    if (end != data_size)
        die("%s: %zu bytes after the last tensor's data (the data is %zu bytes, the tensors cover %zu)", path,
            data_size - end, data_size, end);
    free(order);
}

void safetensors_close(SafeTensors *st) {
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    if (st->map) munmap(st->map, st->map_size);
    free(st->path);
    memset(st, 0, sizeof *st);
}

const StTensor *safetensors_find(const SafeTensors *st, const char *name) {
    for (int i = 0; i < st->n_tensors; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}

static int64_t numel_of(const StWriteTensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

void safetensors_write(const char *path, const StWriteTensor *tensors, int n, DType dtype) {
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16) die("internal: safetensors_write supports F32 and BF16 only");
    size_t esize = dtype_size(dtype);
    cJSON *root = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (!root || !meta || !cJSON_AddStringToObject(meta, "format", "pt")) die("out of memory building %s", path);
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        const StWriteTensor *t = &tensors[i];
        size_t nbytes = (size_t)numel_of(t) * esize;
        cJSON *e = cJSON_AddObjectToObject(root, t->name), *shape = cJSON_CreateArray();
        cJSON *offs = cJSON_CreateArray();
        if (!e || !shape || !offs || !cJSON_AddStringToObject(e, "dtype", dtype_name(dtype)))
            die("out of memory building %s", path);
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(offset + nbytes)));
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON_AddItemToObject(e, "data_offsets", offs);
        offset += nbytes;
    }
    char *hdr = cJSON_PrintUnformatted(root);
    if (!hdr) die("out of memory building %s", path);
    cJSON_Delete(root);
    size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;  // data starts 8-byte aligned

    AtomicFile af;
    atomic_file_open(&af, path);
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    atomic_file_write(&af, lenbuf, 8);
    atomic_file_write(&af, hdr, hlen);
    atomic_file_write(&af, "        ", padded - hlen);
    free(hdr);
    enum { CHUNK = 1 << 16 };
    uint16_t *buf = xmalloc(CHUNK * sizeof *buf);
    for (int i = 0; i < n; i++) {
        size_t numel = (size_t)numel_of(&tensors[i]);
        const float *src = tensors[i].data;
        if (dtype == DTYPE_F32) {
            atomic_file_write(&af, src, numel * 4);
            continue;
        }
        for (size_t j = 0; j < numel; j += CHUNK) {
            size_t m = numel - j < CHUNK ? numel - j : CHUNK;
            for (size_t k = 0; k < m; k++) buf[k] = f32_to_bf16(src[j + k]);
            atomic_file_write(&af, buf, m * 2);
        }
    }
    free(buf);
    atomic_file_commit(&af);
}

void safetensors_release(const StTensor *t, size_t bytes) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)t->data / page * page, hi = (uintptr_t)t->data + bytes;
    if (bytes < t->nbytes) hi = hi / page * page;  // the page of the next byte is still to be read
    if (hi > lo && madvise((void *)lo, hi - lo, MADV_DONTNEED) != 0)
        die("cannot release the pages of tensor \"%s\": %s", t->name, strerror(errno));
}
