// Apache Parquet reader (parquet.h). The format: https://parquet.apache.org/docs/file-format/ and
// parquet.thrift; the footer and page headers are Thrift's compact protocol, read here by a small
// cursor (Th) that only ever reads inside its bounds.
#define _POSIX_C_SOURCE 200809L  // fseeko
#include "io/parquet.h"

#include <brotli/decode.h>
#include <errno.h>
#include <lz4.h>
#include <math.h>
#include <snappy-c.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "base/util.h"

// Caps on sizes read from a file, checked before allocating.
#define PQ_MAX_FOOTER ((uint64_t)64 << 20)    // the footer (file metadata)
#define PQ_MAX_PAGE ((uint64_t)256 << 20)     // one page, decompressed
// Level entries of the chunks of a row group read at once (~20 bytes each in memory: a few bytes of RLE can
// claim millions), and the bytes of its pages decompressed, in all. The fuzz build's are smaller, to stay
// within the fuzzer's memory limit, and it caps the JSON nodes the whole file's rows can make, as the footer counts
// them (the harness fails an input that holds over a million allocations at once): a node per value, and per row
// one per schema node (a row's groups, nulls included).
#ifdef GRPO_FUZZ
#define PQ_MAX_VALUES ((int64_t)1 << 22)
#define PQ_MAX_GROUP_BYTES ((int64_t)1 << 28)
#define PQ_MAX_FILE_NODES ((int64_t)1 << 15)
#else
#define PQ_MAX_VALUES ((int64_t)1 << 26)
#define PQ_MAX_GROUP_BYTES ((int64_t)1 << 31)
#define PQ_MAX_FILE_NODES INT64_MAX
#endif
#define PQ_MAX_DEPTH 32                       // nesting of the schema
#define PQ_MAX_THRIFT_DEPTH 64

enum { T_BOOLEAN, T_INT32, T_INT64, T_INT96, T_FLOAT, T_DOUBLE, T_BYTE_ARRAY, T_FIXED, T_GROUP = -1 };
enum { R_REQUIRED, R_OPTIONAL, R_REPEATED };
enum { E_PLAIN = 0, E_PLAIN_DICT = 2, E_RLE = 3, E_BIT_PACKED = 4, E_DELTA = 5, E_DELTA_LENGTH = 6,
       E_DELTA_BYTES = 7, E_RLE_DICT = 8, E_SPLIT = 9 };
enum { C_NONE, C_SNAPPY, C_GZIP, C_LZO, C_BROTLI, C_LZ4, C_ZSTD, C_LZ4_RAW };
enum { P_DATA, P_INDEX, P_DICT, P_DATA_V2 };
// What a leaf's values mean (from ConvertedType or LogicalType).
enum { A_NONE, A_STRING, A_LIST, A_MAP, A_DECIMAL, A_UNSIGNED, A_FLOAT16, A_UUID };

typedef struct {
    char *name;
    char *path;       // dotted path from the root, for messages
    int type;         // T_* (T_GROUP for a group)
    int type_len;     // FIXED_LEN_BYTE_ARRAY's width
    int repetition;   // R_*
    int annotation;   // A_*
    int scale;        // DECIMAL
    int n_children;
    int *children;    // node indices
    int def;          // definition level when this node is present
    int rep;          // repetition level of this node's instances (repeated ancestors and itself)
    int leaf;         // leaf column index, or -1 for a group
    int leaf_lo, leaf_hi;  // the leaf columns under it: [leaf_lo, leaf_hi)
} Node;

typedef struct {
    int codec;
    int type;
    int64_t num_values;
    int64_t start, size;  // the column chunk's bytes in the file (dictionary page first)
    int64_t unpacked;     // total_uncompressed_size: its pages decompressed
} ChunkMeta;

typedef struct {
    int64_t num_rows;
    ChunkMeta *chunks;  // one per leaf
} RowGroup;

typedef struct {
    const uint8_t *p;
    uint32_t n;
} Bytes;

typedef union {
    int64_t i;  // BOOLEAN, INT32, INT64 (and the dictionary index while decoding)
    double d;   // FLOAT, DOUBLE
    Bytes b;    // BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY
} Value;

// One leaf column of the current row group, decoded.
typedef struct {
    uint16_t *rep, *def;  // n level entries (NULL when the column's maximum level is 0)
    int64_t n, cap;
    Value *val;           // nv values (the entries whose def is the maximum)
    int64_t nv, cap_v;
    Value *dict;          // the dictionary page's values
    int64_t n_dict;
    int64_t pos, vpos;    // assembly cursors
} Column;

struct ParquetReader {
    char *path;
    FILE *f;
    int64_t file_size;
    Node *nodes;
    int n_nodes;
    int *leaves;        // node index of each leaf column
    int n_leaves;
    RowGroup *groups;
    int n_groups;
    int64_t num_rows;
    char *selected;     // per top-level child of the root: read it
    Column *cols;       // per leaf, for the current row group
    void **bufs;        // buffers the current row group's values point into
    int n_bufs, cap_bufs;
    int group;          // the current row group (-1 before the first)
    int64_t group_row;  // rows of it returned
    int64_t row;        // rows returned in all
    int64_t group_bytes;  // pages decompressed for the current row group
    int64_t group_values;  // level entries of its chunks read so far
    uint32_t nul;       // the current row group's U+0000 sentinel (parquet_nul_sentinel), 0 when it needs none
    const char *where;  // what is being read, for messages ("footer", a column's path)
};

GRPO_PRINTF(2, 3) GRPO_NORETURN static void bad(const ParquetReader *r, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (r->group >= 0) die("%s: row group %d, column %s: %s", r->path, r->group, r->where, msg);
    die("%s: %s: %s", r->path, r->where, msg);
}

static void *keep(ParquetReader *r, void *buf) {
    if (r->n_bufs == r->cap_bufs) {
        r->cap_bufs = r->cap_bufs ? 2 * r->cap_bufs : 16;
        r->bufs = xrealloc(r->bufs, (size_t)r->cap_bufs * sizeof *r->bufs);
    }
    r->bufs[r->n_bufs++] = buf;
    return buf;
}

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// ---------------------------------------------------------------- Thrift compact protocol
enum { TT_STOP, TT_TRUE, TT_FALSE, TT_BYTE, TT_I16, TT_I32, TT_I64, TT_DOUBLE, TT_BINARY, TT_LIST, TT_SET,
       TT_MAP, TT_STRUCT };

typedef struct {
    const uint8_t *p, *end;
    const ParquetReader *r;
    int depth;
    int bool_value;  // a boolean field's value is its type
} Th;

static uint64_t th_varint(Th *t) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (t->p >= t->end) bad(t->r, "truncated metadata");
        uint8_t b = *t->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    bad(t->r, "corrupt metadata (an over-long varint)");
}

static int64_t th_i64(Th *t) {
    uint64_t v = th_varint(t);
    return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

static int32_t th_i32(Th *t) {
    int64_t v = th_i64(t);
    if (v < INT32_MIN || v > INT32_MAX) bad(t->r, "corrupt metadata (an i32 out of range)");
    return (int32_t)v;
}

// A field header: 0 at the struct's end, else 1 with *id and *type.
static int th_field(Th *t, int *id, int *type) {
    if (t->p >= t->end) bad(t->r, "truncated metadata");
    uint8_t b = *t->p++;
    if (b == 0) return 0;
    *type = b & 0x0F;
    int delta = b >> 4;
    *id = delta ? *id + delta : (int)(int16_t)th_i32(t);
    if (*type == TT_TRUE || *type == TT_FALSE) t->bool_value = *type == TT_TRUE;
    return 1;
}

static int64_t th_list(Th *t, int *elem_type) {
    if (t->p >= t->end) bad(t->r, "truncated metadata");
    uint8_t b = *t->p++;
    *elem_type = b & 0x0F;
    uint64_t n = b >> 4;
    if (n == 15) n = th_varint(t);
    if (n > (uint64_t)(t->end - t->p)) bad(t->r, "corrupt metadata (a list longer than the bytes left)");
    return (int64_t)n;
}

static void th_binary(Th *t, const uint8_t **p, size_t *n) {
    uint64_t len = th_varint(t);
    if (len > (uint64_t)(t->end - t->p)) bad(t->r, "truncated metadata (a string past the end)");
    *p = t->p;
    *n = (size_t)len;
    t->p += len;
}

static char *th_string(Th *t) {
    const uint8_t *p;
    size_t n;
    th_binary(t, &p, &n);
    if (memchr(p, 0, n)) bad(t->r, "a name holds a NUL byte");
    char *s = xmalloc(n + 1);
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static void th_skip(Th *t, int type);

static void th_skip_struct(Th *t) {
    if (++t->depth > PQ_MAX_THRIFT_DEPTH) bad(t->r, "corrupt metadata (nested too deep)");
    int id = 0, type;
    while (th_field(t, &id, &type)) th_skip(t, type);
    t->depth--;
}

static void th_skip(Th *t, int type) {
    const uint8_t *p;
    size_t n;
    switch (type) {
        case TT_TRUE: case TT_FALSE: return;
        case TT_BYTE:
            if (t->p >= t->end) bad(t->r, "truncated metadata");
            t->p++;
            return;
        case TT_I16: case TT_I32: case TT_I64: th_varint(t); return;
        case TT_DOUBLE:
            if (t->end - t->p < 8) bad(t->r, "truncated metadata");
            t->p += 8;
            return;
        case TT_BINARY: th_binary(t, &p, &n); return;
        case TT_LIST: case TT_SET: {
            if (++t->depth > PQ_MAX_THRIFT_DEPTH) bad(t->r, "corrupt metadata (nested too deep)");
            int et;
            int64_t count = th_list(t, &et);
            for (int64_t i = 0; i < count; i++) {
                if (et == TT_TRUE || et == TT_FALSE) th_skip(t, TT_BYTE);  // list elements: one byte each
                else th_skip(t, et);
            }
            t->depth--;
            return;
        }
        case TT_MAP: {
            if (++t->depth > PQ_MAX_THRIFT_DEPTH) bad(t->r, "corrupt metadata (nested too deep)");
            uint64_t count = th_varint(t);
            if (count > (uint64_t)(t->end - t->p))
                bad(t->r, "corrupt metadata (a map longer than the bytes left)");
            if (count) {
                if (t->p >= t->end) bad(t->r, "truncated metadata");
                uint8_t kv = *t->p++;
                for (uint64_t i = 0; i < count; i++) {
                    th_skip(t, kv >> 4);
                    th_skip(t, kv & 0x0F);
                }
            }
            t->depth--;
            return;
        }
        case TT_STRUCT: th_skip_struct(t); return;
        default: bad(t->r, "corrupt metadata (unknown field type %d)", type);
    }
}

static void th_expect(const Th *t, int type, int want) {
    if (type != want) bad(t->r, "corrupt metadata (a field of the wrong type)");
}

// ---------------------------------------------------------------- footer
static int annotation_of_converted(int c) {
    switch (c) {
        case 0: case 4: case 19: return A_STRING;  // UTF8, ENUM, JSON
        case 1: case 2: return A_MAP;              // MAP, MAP_KEY_VALUE
        case 3: return A_LIST;
        case 5: return A_DECIMAL;
        case 11: case 12: case 13: case 14: return A_UNSIGNED;  // UINT_8..UINT_64
        default: return A_NONE;
    }
}

// LogicalType (a union): sets the annotation it implies, if any.
static void read_logical(Th *t, Node *nd) {
    int id = 0, type;
    while (th_field(t, &id, &type)) {
        if (type != TT_STRUCT) {
            th_skip(t, type);
            continue;
        }
        if (id == 1 || id == 4 || id == 12) nd->annotation = A_STRING;  // STRING, ENUM, JSON
        else if (id == 14) nd->annotation = A_UUID;
        else if (id == 2) nd->annotation = A_MAP;
        else if (id == 3) nd->annotation = A_LIST;
        else if (id == 15) nd->annotation = A_FLOAT16;
        if (id == 10) {  // INTEGER {1: bitWidth, 2: isSigned}
            int fid = 0, ft;
            while (th_field(t, &fid, &ft)) {
                if (fid == 2 && (ft == TT_TRUE || ft == TT_FALSE)) {
                    if (!t->bool_value) nd->annotation = A_UNSIGNED;
                } else {
                    th_skip(t, ft);
                }
            }
        } else if (id == 5) {  // DECIMAL {1: scale, 2: precision}
            nd->annotation = A_DECIMAL;
            int fid = 0, ft;
            while (th_field(t, &fid, &ft)) {
                if (fid == 1 && ft == TT_I32) nd->scale = th_i32(t);
                else th_skip(t, ft);
            }
        } else {
            th_skip_struct(t);
        }
    }
}

static void read_schema_element(Th *t, Node *nd) {
    int id = 0, type, converted = -1;
    nd->type = T_GROUP;
    nd->repetition = R_REQUIRED;
    while (th_field(t, &id, &type)) {
        switch (id) {
            case 1:
                th_expect(t, type, TT_I32);
                nd->type = th_i32(t);
                break;
            case 2:
                th_expect(t, type, TT_I32);
                nd->type_len = th_i32(t);
                break;
            case 3:
                th_expect(t, type, TT_I32);
                nd->repetition = th_i32(t);
                break;
            case 4:
                th_expect(t, type, TT_BINARY);
                free(nd->name);
                nd->name = th_string(t);
                break;
            case 5:
                th_expect(t, type, TT_I32);
                nd->n_children = th_i32(t);
                break;
            case 6:
                th_expect(t, type, TT_I32);
                converted = th_i32(t);
                break;
            case 7:
                th_expect(t, type, TT_I32);
                nd->scale = th_i32(t);
                break;
            case 10:
                th_expect(t, type, TT_STRUCT);
                read_logical(t, nd);
                break;
            default: th_skip(t, type);
        }
    }
    if (!nd->name) bad(t->r, "a schema element has no name");
    if (converted >= 0 && nd->annotation == A_NONE) nd->annotation = annotation_of_converted(converted);
    if (nd->type < T_GROUP || nd->type > T_FIXED)
        bad(t->r, "schema element %s has unknown type %d", nd->name, nd->type);
    if (nd->repetition < R_REQUIRED || nd->repetition > R_REPEATED)
        bad(t->r, "schema element %s has unknown repetition %d", nd->name, nd->repetition);
    if (nd->n_children < 0) bad(t->r, "schema element %s has %d children", nd->name, nd->n_children);
    if (nd->type == T_FIXED && (nd->type_len <= 0 || nd->type_len > (1 << 20)))
        bad(t->r, "schema element %s has FIXED_LEN_BYTE_ARRAY length %d", nd->name, nd->type_len);
    if (nd->scale < 0 || nd->scale > 76)
        bad(t->r, "schema element %s has decimal scale %d", nd->name, nd->scale);
}

static void read_column_meta(Th *t, ChunkMeta *cm) {
    int id = 0, type;
    int64_t data_off = -1, dict_off = -1;
    cm->type = -1;
    cm->codec = -1;
    cm->size = -1;
    cm->num_values = -1;
    while (th_field(t, &id, &type)) {
        switch (id) {
            case 1:
                th_expect(t, type, TT_I32);
                cm->type = th_i32(t);
                break;
            case 4:
                th_expect(t, type, TT_I32);
                cm->codec = th_i32(t);
                break;
            case 5:
                th_expect(t, type, TT_I64);
                cm->num_values = th_i64(t);
                break;
            case 6:
                th_expect(t, type, TT_I64);
                cm->unpacked = th_i64(t);
                break;
            case 7:
                th_expect(t, type, TT_I64);
                cm->size = th_i64(t);
                break;
            case 9:
                th_expect(t, type, TT_I64);
                data_off = th_i64(t);
                break;
            case 11:
                th_expect(t, type, TT_I64);
                dict_off = th_i64(t);
                break;
            default: th_skip(t, type);
        }
    }
    if (cm->type < 0 || cm->codec < 0 || cm->size < 0 || cm->num_values < 0 || data_off < 0)
        bad(t->r, "a column chunk lacks its type, codec, sizes or offset");
    // Some writers set dictionary_page_offset to 0 when there is none: the chunk starts at the first page.
    cm->start = dict_off > 0 && dict_off < data_off ? dict_off : data_off;
}

static void read_column_chunk(Th *t, ChunkMeta *cm) {
    int id = 0, type, have_meta = 0;
    while (th_field(t, &id, &type)) {
        if (id == 1 && type == TT_BINARY)
            bad(t->r, "column chunks in other files (file_path) are not supported");
        if (id == 3 && type == TT_STRUCT) {
            read_column_meta(t, cm);
            have_meta = 1;
        } else {
            th_skip(t, type);
        }
    }
    if (!have_meta) bad(t->r, "a column chunk has no metadata");
}

static void read_row_group(Th *t, ParquetReader *r, RowGroup *g) {
    int id = 0, type, n_cols = -1;
    g->num_rows = -1;
    while (th_field(t, &id, &type)) {
        if (id == 1 && type == TT_LIST) {
            int et;
            int64_t n = th_list(t, &et);
            if (et != TT_STRUCT || n != r->n_leaves)
                bad(r, "a row group has %lld columns, the schema %d", (long long)n, r->n_leaves);
            free(g->chunks);
            g->chunks = xcalloc((size_t)r->n_leaves, sizeof *g->chunks);
            for (int64_t i = 0; i < n; i++) read_column_chunk(t, &g->chunks[i]);
            n_cols = (int)n;
        } else if (id == 3 && type == TT_I64) {
            g->num_rows = th_i64(t);
        } else {
            th_skip(t, type);
        }
    }
    if (n_cols < 0 || g->num_rows < 0) bad(r, "a row group lacks its columns or row count");
}

// Builds the tree from the flattened schema (depth first; each group gives its child count).
static int build_node(ParquetReader *r, int *next, int depth, int parent_def, int parent_rep,
                      const char *prefix) {
    if (*next >= r->n_nodes) bad(r, "the schema ends inside a group");
    if (depth > PQ_MAX_DEPTH) bad(r, "the schema nests deeper than %d", PQ_MAX_DEPTH);
    int i = (*next)++;
    Node *nd = &r->nodes[i];
    nd->def = parent_def + (depth > 0 && nd->repetition != R_REQUIRED);
    nd->rep = parent_rep + (depth > 0 && nd->repetition == R_REPEATED);
    nd->path = depth <= 1 ? xstrdup(nd->name) : xprintf("%s.%s", prefix, nd->name);
    nd->leaf_lo = r->n_leaves;
    if (depth > 0 && nd->n_children == 0) {
        if (nd->type == T_GROUP) bad(r, "schema element %s is a group without children", nd->path);
        nd->leaf = r->n_leaves++;
        r->leaves = xrealloc(r->leaves, (size_t)r->n_leaves * sizeof *r->leaves);
        r->leaves[nd->leaf] = i;
    } else {
        nd->leaf = -1;
        nd->type = T_GROUP;
        if (nd->n_children > r->n_nodes) bad(r, "schema element %s has %d children", nd->path, nd->n_children);
        nd->children = xmalloc((size_t)nd->n_children * sizeof *nd->children + 1);
        for (int c = 0; c < nd->n_children; c++)
            nd->children[c] = build_node(r, next, depth + 1, nd->def, nd->rep, nd->path);
    }
    nd->leaf_hi = r->n_leaves;
    return i;
}

static void read_footer(ParquetReader *r, const uint8_t *p, size_t n) {
    Th t = {p, p + n, r, 0, 0};
    int id = 0, type;
    int have_schema = 0, have_groups = 0;
    r->num_rows = -1;
    while (th_field(&t, &id, &type)) {
        if (id == 2 && type == TT_LIST) {
            if (have_schema) bad(r, "two schemas");
            int et;
            int64_t count = th_list(&t, &et);
            if (et != TT_STRUCT || count < 1) bad(r, "the schema is empty");
            r->nodes = xcalloc((size_t)count, sizeof *r->nodes);
            r->n_nodes = (int)count;
            for (int64_t i = 0; i < count; i++) read_schema_element(&t, &r->nodes[i]);
            have_schema = 1;
        } else if (id == 3 && type == TT_I64) {
            r->num_rows = th_i64(&t);
        } else if (id == 4 && type == TT_LIST) {
            if (!have_schema || have_groups) bad(r, "the row groups come before the schema, or twice");
            int next = 0;
            build_node(r, &next, 0, 0, 0, "");
            if (next != r->n_nodes)
                bad(r, "the schema has %d elements after its root's tree", r->n_nodes - next);
            int et;
            int64_t count = th_list(&t, &et);
            if (et != TT_STRUCT) bad(r, "corrupt row group list");
            r->groups = xcalloc((size_t)count + 1, sizeof *r->groups);
            r->n_groups = (int)count;
            for (int64_t i = 0; i < count; i++) read_row_group(&t, r, &r->groups[i]);
            have_groups = 1;
        } else {
            th_skip(&t, type);
        }
    }
    if (!have_schema || !have_groups || r->num_rows < 0)
        bad(r, "the footer lacks the schema, row groups or row count");
    if (r->n_leaves == 0 && r->num_rows > 0) bad(r, "rows without columns");
    int64_t sum = 0, bytes = 0, values = 0;
    for (int g = 0; g < r->n_groups; g++) {
        if (r->groups[g].num_rows > r->num_rows - sum) break;
        sum += r->groups[g].num_rows;
        for (int c = 0; c < r->n_leaves; c++) {  // chunks do not overlap: together they fit in the file
            const ChunkMeta *cm = &r->groups[g].chunks[c];
            if (cm->num_values < r->groups[g].num_rows)
                bad(r, "row group %d: a column has %lld values for %lld rows", g, (long long)cm->num_values,
                    (long long)r->groups[g].num_rows);
            if (cm->size > r->file_size - bytes) bad(r, "the column chunks add up to more than the file");
            bytes += cm->size;
        }
        for (int c = 0; c < r->n_leaves; c++) {
            const ChunkMeta *cm = &r->groups[g].chunks[c];
            const Node *leaf = &r->nodes[r->leaves[c]];
            if (cm->type != leaf->type)
                bad(r, "row group %d: column %s has type %d, the schema says %d",
                    g, leaf->path, cm->type, leaf->type);
            if (cm->start > r->file_size || cm->size > r->file_size - cm->start)
                bad(r, "row group %d: column %s lies past the end of the file", g, leaf->path);
            if (cm->num_values > PQ_MAX_VALUES)
                bad(r, "row group %d: column %s has %lld values, more than the %lld this reader takes per "
                    "column chunk (write smaller row groups)", g, leaf->path, (long long)cm->num_values,
                    (long long)PQ_MAX_VALUES);
            values += cm->num_values;  // each under 2^26, and fewer chunks than footer bytes: no overflow
        }
    }
    if ((double)values + (double)r->num_rows * r->n_nodes > (double)PQ_MAX_FILE_NODES)
        bad(r, "the file's rows would make over %lld JSON nodes, this build's cap", (long long)PQ_MAX_FILE_NODES);
    if (sum != r->num_rows) bad(r, "the row groups hold %lld rows, the footer says %lld", (long long)sum,
                                (long long)r->num_rows);
}

int parquet_sniff(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[4];
    int yes = fread(magic, 1, 4, f) == 4 && memcmp(magic, "PAR1", 4) == 0;
    fclose(f);
    return yes;
}

static void read_at(ParquetReader *r, void *dst, int64_t off, int64_t n) {
    if (fseeko(r->f, off, SEEK_SET) != 0 || fread(dst, 1, (size_t)n, r->f) != (size_t)n)
        die("%s: cannot read %lld bytes at offset %lld: %s", r->path, (long long)n, (long long)off,
            ferror(r->f) ? strerror(errno) : "the file is shorter than its footer says");
}

ParquetReader *parquet_open(const char *path, const char *key) {
    ParquetReader *r = xcalloc(1, sizeof *r);
    r->path = xstrdup(path);
    r->group = -1;
    r->where = "footer";
    r->f = fopen(path, "rb");
    if (!r->f) die("%s: cannot open %s: %s", key, path, strerror(errno));
    struct stat st;
    if (fstat(fileno(r->f), &st) != 0) die("%s: cannot stat %s: %s", key, path, strerror(errno));
    r->file_size = st.st_size;
    if (r->file_size < 12) die("%s: not a Parquet file (%lld bytes)", path, (long long)r->file_size);
    uint8_t head[4], tail[8];
    read_at(r, head, 0, 4);
    read_at(r, tail, r->file_size - 8, 8);
    if (memcmp(head, "PAR1", 4) != 0) die("%s: not a Parquet file (no PAR1 magic at the start)", path);
    if (memcmp(tail + 4, "PAR1", 4) != 0)
        die("%s: not a complete Parquet file (no PAR1 magic at the end: truncated, or encrypted)", path);
    uint64_t len = le32(tail);
    if (len > (uint64_t)r->file_size - 12) die("%s: the footer length %llu exceeds the file", path,
                                               (unsigned long long)len);
    if (len > PQ_MAX_FOOTER) die("%s: the footer is %llu bytes, over this reader's cap of %llu", path,
                                 (unsigned long long)len, (unsigned long long)PQ_MAX_FOOTER);
    uint8_t *footer = xmalloc((size_t)len + 1);
    read_at(r, footer, r->file_size - 8 - (int64_t)len, (int64_t)len);
    read_footer(r, footer, (size_t)len);
    free(footer);
    const Node *root = &r->nodes[0];
    r->selected = xmalloc((size_t)root->n_children + 1);
    memset(r->selected, 1, (size_t)root->n_children + 1);
    r->cols = xcalloc((size_t)r->n_leaves + 1, sizeof *r->cols);
    return r;
}

void parquet_select(ParquetReader *r, const char *const *names, int n) {
    const Node *root = &r->nodes[0];
    for (int c = 0; c < root->n_children; c++) {
        r->selected[c] = 0;
        for (int i = 0; i < n; i++) r->selected[c] |= strcmp(r->nodes[root->children[c]].name, names[i]) == 0;
    }
}

int64_t parquet_num_rows(const ParquetReader *r) { return r->num_rows; }

uint32_t parquet_nul_sentinel(const ParquetReader *r) { return r->nul; }

// ---------------------------------------------------------------- pages
// A buffer of n bytes that values point into, kept until the row group is done and counted against its cap.
static uint8_t *new_values(ParquetReader *r, uint64_t n) {
    r->group_bytes += (int64_t)n;
    if (n > PQ_MAX_PAGE || r->group_bytes > PQ_MAX_GROUP_BYTES)
        bad(r, "the row group's values take over %lld bytes (write smaller row groups)",
            (long long)PQ_MAX_GROUP_BYTES);
    return keep(r, xmalloc((size_t)n + 1));
}

// Hadoop's LZ4 framing (parquet-mr's old LZ4): blocks of big-endian (decompressed size, compressed size, data);
// some writers wrote one raw block instead. 1 when src held exactly out_n bytes that way.
static int lz4_hadoop(const uint8_t *src, size_t n, uint8_t *dst, size_t out_n) {
    size_t in = 0, out = 0;
    while (n - in >= 8) {
        uint32_t want = be32(src + in), size = be32(src + in + 4);
        in += 8;
        if (size > n - in || want > out_n - out || size > INT32_MAX || want > INT32_MAX) break;
        int got = LZ4_decompress_safe((const char *)src + in, (char *)dst + out, (int)size, (int)want);
        if (got < 0 || (uint32_t)got != want) break;
        in += size;
        out += want;
    }
    if (in == n && out == out_n) return 1;
    if (n > INT32_MAX || out_n > INT32_MAX) return 0;
    int got = LZ4_decompress_safe((const char *)src, (char *)dst, (int)n, (int)out_n);
    return got >= 0 && (size_t)got == out_n;
}

// A page's out_n decompressed bytes (malloc'd: the caller keeps or frees them).
static uint8_t *decompress(ParquetReader *r, int codec, const uint8_t *src, size_t n, size_t out_n) {
    if (out_n > PQ_MAX_PAGE) bad(r, "a page of %zu bytes, over this reader's cap of %llu", out_n,
                                 (unsigned long long)PQ_MAX_PAGE);
    r->group_bytes += (int64_t)out_n;
    if (r->group_bytes > PQ_MAX_GROUP_BYTES)
        bad(r, "the row group decompresses to over %lld bytes (write smaller row groups)",
            (long long)PQ_MAX_GROUP_BYTES);
    uint8_t *dst = xmalloc(out_n + 1);
    int ok = 0;
    switch (codec) {
        case C_SNAPPY: {
            size_t len;
            ok = snappy_uncompressed_length((const char *)src, n, &len) == SNAPPY_OK && len == out_n;
            ok = ok && snappy_uncompress((const char *)src, n, (char *)dst, &len) == SNAPPY_OK && len == out_n;
            break;
        }
        case C_ZSTD: {
            size_t got = ZSTD_decompress(dst, out_n, src, n);
            ok = !ZSTD_isError(got) && got == out_n;
            break;
        }
        case C_GZIP: {
            z_stream z = {0};
            if (inflateInit2(&z, 15 + 32) != Z_OK) die("out of memory (zlib)");
            z.next_in = (Bytef *)src;
            z.avail_in = (uInt)n;
            z.next_out = dst;
            z.avail_out = (uInt)out_n;
            int rc = inflate(&z, Z_FINISH);
            ok = rc == Z_STREAM_END && z.total_out == out_n;
            inflateEnd(&z);
            break;
        }
        case C_BROTLI: {
            size_t len = out_n;
            ok = BrotliDecoderDecompress(n, src, &len, dst) == BROTLI_DECODER_RESULT_SUCCESS && len == out_n;
            break;
        }
        case C_LZ4_RAW: {
            if (n > INT32_MAX || out_n > INT32_MAX) break;
            int got = LZ4_decompress_safe((const char *)src, (char *)dst, (int)n, (int)out_n);
            ok = got >= 0 && (size_t)got == out_n;
            break;
        }
        case C_LZ4: ok = lz4_hadoop(src, n, dst, out_n); break;
        case C_LZO: bad(r, "LZO compression is not supported");
        default: bad(r, "unknown compression codec %d", codec);
    }
    if (!ok) {
        free(dst);
        bad(r, "a page does not decompress to its stated %zu bytes (corrupt)", out_n);
    }
    return dst;
}

typedef struct {
    const uint8_t *p, *end;
} Cur;

static uint64_t uleb(ParquetReader *r, Cur *c) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (c->p >= c->end) bad(r, "truncated page");
        uint8_t b = *c->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    bad(r, "corrupt page (an over-long varint)");
}


// The bits [bit, bit + w) of p, least significant first (w <= 64); p holds at least (bit + w + 7) / 8 bytes.
static uint64_t get_bits(const uint8_t *p, uint64_t bit, int w) {
    uint64_t v = 0;
    int got = 0;
    p += bit >> 3;
    int skip = (int)(bit & 7);
    while (got < w) {
        uint64_t byte = *p++ >> skip;
        int take = 8 - skip;
        v |= byte << got;
        got += take;
        skip = 0;
    }
    return w == 64 ? v : v & ((UINT64_C(1) << w) - 1);
}

// n values of the RLE / bit-packed hybrid with bit width w from c (to its end), into out.
static void rle_hybrid(ParquetReader *r, Cur *c, int w, uint32_t *out, int64_t n) {
    if (w < 0 || w > 32) bad(r, "corrupt page (bit width %d)", w);
    int64_t done = 0;
    size_t wb = (size_t)(w + 7) / 8;
    while (done < n) {
        uint64_t h = uleb(r, c);
        if (h & 1) {  // bit-packed: (h >> 1) groups of 8 values
            uint64_t groups = h >> 1;
            if (groups == 0 || groups > (uint64_t)(n - done + 7) / 8 + 1)
                bad(r, "corrupt page (a bit-packed run)");
            int64_t vals = (int64_t)groups * 8, use = vals < n - done ? vals : n - done;
            size_t bytes = (size_t)groups * (size_t)w, need = ((size_t)use * (size_t)w + 7) / 8;
            size_t left = (size_t)(c->end - c->p);
            if (left < need) bad(r, "truncated page (a bit-packed run)");
            for (int64_t i = 0; i < use; i++)
                out[done + i] = (uint32_t)get_bits(c->p, (uint64_t)i * (uint64_t)w, w);
            c->p += bytes < left ? bytes : left;
            done += use;
        } else {  // a run of one value repeated (h >> 1) times
            uint64_t run = h >> 1;
            if (run == 0 || run > (uint64_t)(n - done)) bad(r, "corrupt page (an RLE run of %llu)",
                                                             (unsigned long long)run);
            if ((size_t)(c->end - c->p) < wb) bad(r, "truncated page (an RLE run)");
            uint32_t v = 0;
            for (size_t i = 0; i < wb; i++) v |= (uint32_t)c->p[i] << (8 * i);
            c->p += wb;
            for (uint64_t i = 0; i < run; i++) out[done++] = v;
        }
    }
}

static int bit_width(int max) {
    int w = 0;
    while (max >> w) w++;
    return w;
}

// n levels (each <= max) into out; v1 pages prefix them with their byte length (len_prefixed).
static void read_levels(ParquetReader *r, Cur *c, int max, int64_t n, uint16_t *out, int len_prefixed,
                        int encoding) {
    if (encoding == E_BIT_PACKED && len_prefixed) {  // deprecated: most significant bit first, no length prefix
        int w = bit_width(max);
        uint64_t bytes = ((uint64_t)n * (uint64_t)w + 7) / 8;
        if ((uint64_t)(c->end - c->p) < bytes) bad(r, "truncated page (levels)");
        for (int64_t i = 0; i < n; i++) {
            uint32_t v = 0;
            for (int b = 0; b < w; b++) {
                uint64_t bit = (uint64_t)i * (uint64_t)w + (uint64_t)b;
                v = v << 1 | ((c->p[bit >> 3] >> (7 - (bit & 7))) & 1);
            }
            if (v > (uint32_t)max) bad(r, "a level of %u exceeds the maximum %d (corrupt)", v, max);
            out[i] = (uint16_t)v;
        }
        c->p += bytes;
        return;
    }
    if (encoding != E_RLE) bad(r, "level encoding %d is not supported (RLE and BIT_PACKED are)", encoding);
    Cur sub = *c;
    if (len_prefixed) {
        if (c->end - c->p < 4) bad(r, "truncated page (levels)");
        uint32_t len = le32(c->p);
        if (len > (uint64_t)(c->end - c->p - 4)) bad(r, "truncated page (levels of %u bytes)", len);
        sub = (Cur){c->p + 4, c->p + 4 + len};
        c->p = sub.end;
    }
    uint32_t *tmp = xmalloc((size_t)n * sizeof *tmp + 1);
    rle_hybrid(r, &sub, bit_width(max), tmp, n);
    for (int64_t i = 0; i < n; i++) {
        if (tmp[i] > (uint32_t)max) bad(r, "a level of %u exceeds the maximum %d (corrupt)", tmp[i], max);
        out[i] = (uint16_t)tmp[i];
    }
    free(tmp);
}

// DELTA_BINARY_PACKED: its values (a fresh array, *n_out of them), c advanced past them.
static int64_t *delta_ints(ParquetReader *r, Cur *c, int64_t max_n, int64_t *n_out) {
    uint64_t block = uleb(r, c), minis = uleb(r, c), total = uleb(r, c);
    uint64_t zz = uleb(r, c);
    if (block == 0 || block % 128 || minis == 0 || block % minis || (block / minis) % 32 || block > (1u << 20))
        bad(r, "corrupt DELTA_BINARY_PACKED header (block %llu, miniblocks %llu)", (unsigned long long)block,
            (unsigned long long)minis);
    if (total > (uint64_t)max_n)
        bad(r, "corrupt DELTA_BINARY_PACKED header (%llu values)", (unsigned long long)total);
    int64_t *v = xmalloc((size_t)total * sizeof *v + 1);
    uint64_t per = block / minis, i = 0;
    uint64_t prev = (zz >> 1) ^ -(zz & 1);
    if (total) v[i++] = (int64_t)prev;
    while (i < total) {
        uint64_t md = uleb(r, c);
        uint64_t min_delta = (md >> 1) ^ -(md & 1);
        if ((uint64_t)(c->end - c->p) < minis) bad(r, "truncated DELTA_BINARY_PACKED block");
        const uint8_t *widths = c->p;
        c->p += minis;
        for (uint64_t m = 0; m < minis && i < total; m++) {
            int w = widths[m];
            if (w > 64) bad(r, "corrupt DELTA_BINARY_PACKED bit width %d", w);
            uint64_t use = total - i < per ? total - i : per;
            size_t bytes = (size_t)(per * (uint64_t)w / 8), need = (size_t)((use * (uint64_t)w + 7) / 8);
            size_t left = (size_t)(c->end - c->p);
            if (left < need) bad(r, "truncated DELTA_BINARY_PACKED miniblock");
            for (uint64_t j = 0; j < use; j++) {
                prev += min_delta + get_bits(c->p, j * (uint64_t)w, w);
                v[i++] = (int64_t)prev;
            }
            c->p += bytes < left ? bytes : left;
        }
    }
    *n_out = (int64_t)total;
    return v;
}

static void need(ParquetReader *r, const Cur *c, uint64_t bytes) {
    if ((uint64_t)(c->end - c->p) < bytes) bad(r, "truncated page (values)");
}

static int value_width(const Node *leaf) {
    switch (leaf->type) {
        case T_INT32: case T_FLOAT: return 4;
        case T_INT64: case T_DOUBLE: return 8;
        case T_INT96: return 12;
        case T_FIXED: return leaf->type_len;
        default: return 0;
    }
}

// One fixed-width value at p (little endian) into v.
static void fixed_value(const Node *leaf, const uint8_t *p, Value *v) {
    switch (leaf->type) {
        case T_INT32: {
            int32_t x;
            memcpy(&x, p, 4);
            v->i = leaf->annotation == A_UNSIGNED ? (int64_t)(uint32_t)x : x;
            break;
        }
        case T_INT64: memcpy(&v->i, p, 8); break;
        case T_FLOAT: {
            float x;
            memcpy(&x, p, 4);
            v->d = x;
            break;
        }
        case T_DOUBLE: memcpy(&v->d, p, 8); break;
        default: v->b = (Bytes){p, (uint32_t)leaf->type_len};
    }
}

// n values in `encoding` (not a dictionary's indices) from c into out.
static void read_values(ParquetReader *r, const Node *leaf, Cur *c, int encoding, int64_t n, Value *out) {
    int w = value_width(leaf);
    switch (encoding) {
        case E_PLAIN:
            if (leaf->type == T_BOOLEAN) {
                need(r, c, ((uint64_t)n + 7) / 8);
                for (int64_t i = 0; i < n; i++) out[i].i = (c->p[i >> 3] >> (i & 7)) & 1;
                c->p += (n + 7) / 8;
            } else if (leaf->type == T_BYTE_ARRAY) {
                for (int64_t i = 0; i < n; i++) {
                    need(r, c, 4);
                    uint32_t len = le32(c->p);
                    c->p += 4;
                    need(r, c, len);
                    out[i].b = (Bytes){c->p, len};
                    c->p += len;
                }
            } else {
                need(r, c, (uint64_t)n * (uint64_t)w);
                for (int64_t i = 0; i < n; i++) fixed_value(leaf, c->p + i * w, &out[i]);
                c->p += n * w;
            }
            return;
        case E_RLE: {
            if (leaf->type != T_BOOLEAN) bad(r, "RLE encoding of a non-boolean column");
            need(r, c, 4);
            uint32_t len = le32(c->p);
            need(r, c, 4 + (uint64_t)len);
            Cur sub = {c->p + 4, c->p + 4 + len};
            uint32_t *tmp = xmalloc((size_t)n * sizeof *tmp + 1);
            rle_hybrid(r, &sub, 1, tmp, n);
            for (int64_t i = 0; i < n; i++) out[i].i = tmp[i];
            free(tmp);
            c->p = sub.end;
            return;
        }
        case E_SPLIT: {
            if (w == 0 || leaf->type == T_INT96) bad(r, "BYTE_STREAM_SPLIT of a variable-width column");
            need(r, c, (uint64_t)n * (uint64_t)w);
            uint8_t tmp[8];  // one value of a number column; FIXED_LEN_BYTE_ARRAY values get a buffer
            uint8_t *buf = leaf->type == T_FIXED ? new_values(r, (uint64_t)(n * w)) : NULL;
            for (int64_t i = 0; i < n; i++) {
                uint8_t *dst = buf ? buf + i * w : tmp;
                for (int b = 0; b < w; b++) dst[b] = c->p[(int64_t)b * n + i];
                fixed_value(leaf, dst, &out[i]);
            }
            c->p += n * w;
            return;
        }
        case E_DELTA: {
            if (leaf->type != T_INT32 && leaf->type != T_INT64)
                bad(r, "DELTA_BINARY_PACKED of a non-integer column");
            int64_t got;
            int64_t *v = delta_ints(r, c, n, &got);
            if (got != n)
                bad(r, "DELTA_BINARY_PACKED holds %lld values, the page %lld", (long long)got, (long long)n);
            for (int64_t i = 0; i < n; i++) {
                if (leaf->type == T_INT32) out[i].i = leaf->annotation == A_UNSIGNED ? (int64_t)(uint32_t)v[i]
                                                                                       : (int64_t)(int32_t)v[i];
                else out[i].i = v[i];
            }
            free(v);
            return;
        }
        case E_DELTA_LENGTH: case E_DELTA_BYTES: {
            if (leaf->type != T_BYTE_ARRAY && leaf->type != T_FIXED)
                bad(r, "a byte-array encoding of another type");
            int64_t np = 0, ns;
            int64_t *prefix = encoding == E_DELTA_BYTES ? delta_ints(r, c, n, &np) : NULL;
            int64_t *len = delta_ints(r, c, n, &ns);
            if (ns != n || (prefix && np != n))
                bad(r, "a byte-array encoding holds the wrong number of values");
            uint64_t total = 0;
            for (int64_t i = 0; i < n; i++) {
                if (len[i] < 0 || (prefix && prefix[i] < 0)) bad(r, "a negative length (corrupt)");
                if (len[i] > (int64_t)PQ_MAX_PAGE || (prefix && prefix[i] > (int64_t)PQ_MAX_PAGE))
                    bad(r, "a value longer than a page (corrupt)");
                total += (uint64_t)len[i] + (prefix ? (uint64_t)prefix[i] : 0);
                if (total > PQ_MAX_PAGE)
                    bad(r, "values of over %llu bytes in one page", (unsigned long long)PQ_MAX_PAGE);
            }
            uint8_t *buf = prefix ? new_values(r, total) : NULL;
            uint64_t at = 0;
            for (int64_t i = 0; i < n; i++) {
                need(r, c, (uint64_t)len[i]);
                if (!prefix) {
                    out[i].b = (Bytes){c->p, (uint32_t)len[i]};
                } else {
                    if (prefix[i] > (i ? (int64_t)out[i - 1].b.n : 0))
                        bad(r, "a prefix longer than the value before");
                    if (prefix[i]) memcpy(buf + at, out[i - 1].b.p, (size_t)prefix[i]);
                    memcpy(buf + at + prefix[i], c->p, (size_t)len[i]);
                    out[i].b = (Bytes){buf + at, (uint32_t)(prefix[i] + len[i])};
                    at += (uint64_t)(prefix[i] + len[i]);
                }
                if (leaf->type == T_FIXED && out[i].b.n != (uint32_t)leaf->type_len)
                    bad(r, "a value of %u bytes in a FIXED_LEN_BYTE_ARRAY(%d) column",
                        out[i].b.n, leaf->type_len);
                c->p += len[i];
            }
            free(prefix);
            free(len);
            return;
        }
        default: bad(r, "encoding %d is not supported", encoding);
    }
}

// Room for n_levels more level entries and n_values more values (the arrays exist even when empty).
static void grow(Column *col, int64_t n_levels, int64_t n_values, int has_rep, int has_def) {
    if (col->n + n_levels > col->cap || !col->cap) {
        col->cap = col->n + n_levels > 2 * col->cap ? col->n + n_levels + 1 : 2 * col->cap;
        if (has_rep) col->rep = xrealloc(col->rep, (size_t)col->cap * sizeof *col->rep);
        if (has_def) col->def = xrealloc(col->def, (size_t)col->cap * sizeof *col->def);
    }
    if (col->nv + n_values > col->cap_v || !col->cap_v) {
        col->cap_v = col->nv + n_values > 2 * col->cap_v ? col->nv + n_values + 1 : 2 * col->cap_v;
        col->val = xrealloc(col->val, (size_t)col->cap_v * sizeof *col->val);
    }
}

typedef struct {
    int type;
    int32_t uncompressed, compressed;
    int32_t num_values, encoding, def_encoding, rep_encoding;  // data page (v1 and v2) and dictionary page
    int32_t def_len, rep_len;                                  // v2
    int is_compressed;                                         // v2
} PageHeader;

static void read_page_header(ParquetReader *r, Cur *c, PageHeader *h) {
    Th t = {c->p, c->end, r, 0, 0};
    memset(h, 0, sizeof *h);
    h->type = -1;
    h->uncompressed = h->compressed = h->num_values = -1;
    h->is_compressed = 1;
    h->def_encoding = h->rep_encoding = E_RLE;
    int id = 0, type;
    while (th_field(&t, &id, &type)) {
        if (id == 1 && type == TT_I32) h->type = th_i32(&t);
        else if (id == 2 && type == TT_I32) h->uncompressed = th_i32(&t);
        else if (id == 3 && type == TT_I32) h->compressed = th_i32(&t);
        else if ((id == 5 || id == 7 || id == 8) && type == TT_STRUCT) {
            int fid = 0, ft;
            while (th_field(&t, &fid, &ft)) {
                int32_t *slot = NULL;
                if (fid == 1) slot = &h->num_values;
                else if (id == 5 && fid == 2) slot = &h->encoding;
                else if (id == 5 && fid == 3) slot = &h->def_encoding;
                else if (id == 5 && fid == 4) slot = &h->rep_encoding;
                else if (id == 7 && fid == 2) slot = &h->encoding;
                else if (id == 8 && fid == 4) slot = &h->encoding;
                else if (id == 8 && fid == 5) slot = &h->def_len;
                else if (id == 8 && fid == 6) slot = &h->rep_len;
                if (id == 8 && fid == 7 && (ft == TT_TRUE || ft == TT_FALSE)) h->is_compressed = t.bool_value;
                else if (slot && ft == TT_I32) *slot = th_i32(&t);
                else th_skip(&t, ft);
            }
        } else {
            th_skip(&t, type);
        }
    }
    if (h->type < 0 || h->uncompressed < 0 || h->compressed < 0)
        bad(r, "a page header lacks its type or sizes");
    c->p = t.p;
}

// Decodes the column chunk of leaf `li` in the current row group into r->cols[li].
static void read_chunk(ParquetReader *r, int li) {
    const Node *leaf = &r->nodes[r->leaves[li]];
    const ChunkMeta *cm = &r->groups[r->group].chunks[li];
    Column *col = &r->cols[li];
    r->where = leaf->path;
    if (leaf->type == T_INT96) bad(r, "INT96 (legacy timestamps) is not supported");
    r->group_values += cm->num_values;
    if (r->group_values > PQ_MAX_VALUES)
        bad(r, "the row group's columns read hold over %lld values (write smaller row groups)",
            (long long)PQ_MAX_VALUES);
    // byte-array values point into the pages: those stay until the row group is done; other pages go at once
    int points = leaf->type == T_BYTE_ARRAY || leaf->type == T_FIXED;
    uint8_t *chunk = xmalloc((size_t)cm->size + 1);
    if (points) keep(r, chunk);
    if (fseeko(r->f, cm->start, SEEK_SET) != 0 || fread(chunk, 1, (size_t)cm->size, r->f) != (size_t)cm->size)
        bad(r, "cannot read the column chunk's %lld bytes at offset %lld", (long long)cm->size,
            (long long)cm->start);
    Cur c = {chunk, chunk + cm->size};
    int64_t seen = 0;
    while (seen < cm->num_values) {
        if (c.p >= c.end) bad(r, "the chunk ends after %lld of its %lld values", (long long)seen,
                              (long long)cm->num_values);
        PageHeader h;
        read_page_header(r, &c, &h);
        if ((uint64_t)h.compressed > (uint64_t)(c.end - c.p)) bad(r, "a page runs past the column chunk");
        const uint8_t *page = c.p;
        c.p += h.compressed;
        if (h.type == P_INDEX) continue;
        if (h.type != P_DATA && h.type != P_DATA_V2 && h.type != P_DICT) bad(r, "unknown page type %d", h.type);
        if (h.num_values < 0) bad(r, "a page header lacks its value count");
        uint8_t *owned = NULL;  // the page decompressed
        if (h.type == P_DICT) {
            if (col->dict || seen) bad(r, "a second dictionary page, or one after data pages");
            const uint8_t *data = page;
            if (cm->codec != C_NONE) {
                data = owned = decompress(r, cm->codec, page, (size_t)h.compressed, (size_t)h.uncompressed);
            } else if (h.uncompressed != h.compressed) {
                bad(r, "an uncompressed page's sizes differ");
            }
            if (h.encoding != E_PLAIN && h.encoding != E_PLAIN_DICT)
                bad(r, "dictionary encoding %d", h.encoding);
            int64_t most = (int64_t)h.uncompressed + 1;  // a value takes a byte at least, a boolean a bit
            if (leaf->type == T_BOOLEAN) most = 8 * most;
            if (h.num_values > most)
                bad(r, "a dictionary of %d values in %d bytes", h.num_values, h.uncompressed);
            col->dict = xmalloc((size_t)h.num_values * sizeof *col->dict + 1);
            col->n_dict = h.num_values;
            Cur dc = {data, data + h.uncompressed};
            read_values(r, leaf, &dc, E_PLAIN, h.num_values, col->dict);
            if (owned && points) keep(r, owned);
            else free(owned);
            continue;
        }
        int64_t n = h.num_values;
        if (n > cm->num_values - seen)
            bad(r, "pages hold more values than the chunk's %lld", (long long)cm->num_values);
        if (n == 0) continue;  // nothing to decode (parquet-mr writes such pages)
        const uint8_t *data = page;
        size_t size = (size_t)h.compressed;
        Cur lv;  // the levels
        if (h.type == P_DATA) {
            if (cm->codec != C_NONE)
                data = owned = decompress(r, cm->codec, page, size, (size_t)h.uncompressed);
            else if (h.uncompressed != h.compressed) bad(r, "an uncompressed page's sizes differ");
            size = (size_t)h.uncompressed;
            lv = (Cur){data, data + size};
        } else {
            if (h.def_len < 0 || h.rep_len < 0 || (int64_t)h.def_len + h.rep_len > h.compressed ||
                (int64_t)h.def_len + h.rep_len > h.uncompressed)
                bad(r, "a v2 page's level lengths exceed the page");
            lv = (Cur){page, page + h.rep_len + h.def_len};
            size_t levels = (size_t)h.rep_len + (size_t)h.def_len;
            data = page + levels;
            size = (size_t)h.compressed - levels;
            // all-null pages of parquet-mr have no value bytes at all, "compressed" or not
            if (cm->codec != C_NONE && h.is_compressed && (size_t)h.uncompressed > levels) {
                data = owned = decompress(r, cm->codec, data, size, (size_t)h.uncompressed - levels);
                size = (size_t)h.uncompressed - levels;
            } else if (h.uncompressed != h.compressed) {
                bad(r, "an uncompressed page's sizes differ");
            }
        }
        grow(col, n, 0, leaf->rep > 0, leaf->def > 0);
        // v1: each level run is prefixed by its length; v2: the header gives the lengths
        int v1 = h.type == P_DATA;
        if (leaf->rep > 0) {
            Cur rc = v1 ? lv : (Cur){lv.p, lv.p + h.rep_len};
            read_levels(r, &rc, leaf->rep, n, col->rep + col->n, v1, h.rep_encoding);
            lv.p = v1 ? rc.p : lv.p + h.rep_len;
            if (col->n == 0 && col->rep[0] != 0) bad(r, "the first repetition level is not 0 (corrupt)");
        } else if (!v1) {
            lv.p += h.rep_len;
        }
        if (leaf->def > 0) {
            Cur dc = v1 ? lv : (Cur){lv.p, lv.end};
            read_levels(r, &dc, leaf->def, n, col->def + col->n, v1, h.def_encoding);
            lv.p = v1 ? dc.p : lv.end;
        }
        int64_t present = n;
        if (leaf->def > 0) {
            present = 0;
            for (int64_t i = 0; i < n; i++) present += col->def[col->n + i] == leaf->def;
        }
        Cur vc = v1 ? (Cur){lv.p, data + size} : (Cur){data, data + size};
        grow(col, 0, present, 0, 0);
        Value *out = col->val + col->nv;
        if (h.encoding == E_PLAIN_DICT || h.encoding == E_RLE_DICT) {
            if (!col->dict) bad(r, "dictionary-encoded values without a dictionary page");
            if (present) {
                if (vc.p >= vc.end) bad(r, "truncated page (dictionary indices)");
                int w = *vc.p++;
                uint32_t *idx = xmalloc((size_t)present * sizeof *idx);
                rle_hybrid(r, &vc, w, idx, present);
                for (int64_t i = 0; i < present; i++) {
                    if (idx[i] >= (uint64_t)col->n_dict) bad(r, "a dictionary index %u of %lld entries", idx[i],
                                                              (long long)col->n_dict);
                    out[i] = col->dict[idx[i]];
                }
                free(idx);
            }
        } else {
            read_values(r, leaf, &vc, h.encoding, present, out);
        }
        if (owned && points) keep(r, owned);
        else free(owned);
        col->n += n;
        col->nv += present;
        seen += n;
    }
    if (!points) free(chunk);
    int64_t rows = 0;
    for (int64_t i = 0; i < col->n; i++) rows += leaf->rep == 0 || col->rep[i] == 0;
    if (rows != r->groups[r->group].num_rows)
        bad(r, "%lld rows, the row group has %lld (corrupt)",
            (long long)rows, (long long)r->groups[r->group].num_rows);
}

static void free_group(ParquetReader *r) {
    for (int i = 0; i < r->n_leaves; i++) {
        Column *col = &r->cols[i];
        free(col->rep);
        free(col->def);
        free(col->val);
        free(col->dict);
        memset(col, 0, sizeof *col);
    }
    for (int i = 0; i < r->n_bufs; i++) free(r->bufs[i]);
    r->n_bufs = 0;
}

// U+0000 in a string: cJSON's strings end at NUL, so as json_parse_line does for "\u0000" in JSONL, NUL
// bytes become a noncharacter of U+FDD0..U+FDEF that no string of the row group holds.
static void choose_sentinel(ParquetReader *r) {
    r->nul = 0;
    int any = 0;
    uint32_t used = 0;  // bit k: U+FDD0 + k appears somewhere (UTF-8 EF B7 90..AF)
    for (int pass = 0; pass < 2 && (pass == 0 || any); pass++)
        for (int li = 0; li < r->n_leaves; li++) {
            const Node *leaf = &r->nodes[r->leaves[li]];
            if (leaf->type != T_BYTE_ARRAY && leaf->type != T_FIXED) continue;
            const Column *col = &r->cols[li];
            for (int64_t i = 0; i < col->nv; i++) {
                const Bytes *b = &col->val[i].b;
                if (pass == 0) {
                    any |= b->n && memchr(b->p, 0, b->n) != NULL;
                    continue;
                }
                for (uint32_t j = 0; j + 2 < b->n; j++)
                    if (b->p[j] == 0xEF && b->p[j + 1] == 0xB7 && b->p[j + 2] >= 0x90 && b->p[j + 2] <= 0xAF)
                        used |= UINT32_C(1) << (b->p[j + 2] - 0x90);
            }
        }
    if (!any) return;
    for (int k = 0; k < 32 && !r->nul; k++)
        if (!(used >> k & 1)) r->nul = 0xFDD0 + (uint32_t)k;
    if (!r->nul) bad(r, "strings hold NUL bytes and every noncharacter U+FDD0..U+FDEF: they cannot be read");
}

static void load_group(ParquetReader *r) {
    free_group(r);
    r->group_values = 0;
    r->group_bytes = 0;
    const Node *root = &r->nodes[0];
    for (int c = 0; c < root->n_children; c++) {
        if (!r->selected[c]) continue;
        const Node *top = &r->nodes[root->children[c]];
        for (int li = top->leaf_lo; li < top->leaf_hi; li++) read_chunk(r, li);
    }
    choose_sentinel(r);
    r->group_row = 0;
}

// ---------------------------------------------------------------- rows
GRPO_NORETURN static void bad_row(const ParquetReader *r, const char *what) {
    die("%s: row %lld: %s (corrupt file)", r->path, (long long)r->row + 1, what);
}

static int def_at(const ParquetReader *r, int li) {
    const Column *col = &r->cols[li];
    if (col->pos >= col->n) bad_row(r, "a column ends early");
    return col->def ? col->def[col->pos] : 0;
}

// The entry of every leaf under nd is an absent (null or empty) one: step past it.
static void skip(ParquetReader *r, const Node *nd) {
    for (int li = nd->leaf_lo; li < nd->leaf_hi; li++) {
        if (r->cols[li].pos >= r->cols[li].n) bad_row(r, "a column ends early");
        r->cols[li].pos++;
    }
}

static double decimal_of(const Bytes *b, int scale) {
    double v = 0;
    for (uint32_t i = 0; i < b->n; i++) v = v * 256 + b->p[i];
    if (b->n && (b->p[0] & 0x80)) v -= ldexp(1.0, 8 * (int)b->n);  // two's complement
    return v / pow(10, scale);
}

static double half_of(const Bytes *b) {
    if (b->n != 2) return NAN;
    int h = b->p[0] | b->p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) v = ldexp(m, -24);  // subnormal
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexp(m + 1024, e - 25);
    return h & 0x8000 ? -v : v;
}

static cJSON *checked(cJSON *item) {
    if (!item) die("out of memory");
    return item;
}

static cJSON *leaf_value(ParquetReader *r, const Node *nd) {
    Column *col = &r->cols[nd->leaf];
    if (col->vpos >= col->nv) bad_row(r, "a column ends early");
    if (col->def && col->def[col->pos] != nd->def) bad_row(r, "the columns disagree");
    const Value *v = &col->val[col->vpos++];
    col->pos++;
    switch (nd->type) {
        case T_BOOLEAN: return cJSON_CreateBool(v->i != 0);
        case T_INT32: case T_INT64:
            if (nd->annotation == A_DECIMAL) return cJSON_CreateNumber((double)v->i / pow(10, nd->scale));
            if (nd->annotation == A_UNSIGNED && nd->type == T_INT64)
                return cJSON_CreateNumber((double)(uint64_t)v->i);
            return cJSON_CreateNumber((double)v->i);
        case T_FLOAT: case T_DOUBLE: return cJSON_CreateNumber(v->d);
        default: break;
    }
    if (nd->annotation == A_DECIMAL) return cJSON_CreateNumber(decimal_of(&v->b, nd->scale));
    if (nd->annotation == A_FLOAT16) return cJSON_CreateNumber(half_of(&v->b));
    if (nd->annotation == A_UUID && v->b.n == 16) {  // 8-4-4-4-12 hex digits
        char u[37];
        int at = 0;
        for (int i = 0; i < 16; i++) {
            if (i == 4 || i == 6 || i == 8 || i == 10) u[at++] = '-';
            at += snprintf(u + at, sizeof u - (size_t)at, "%02x", v->b.p[i]);
        }
        return cJSON_CreateString(u);
    }
    if (r->nul && memchr(v->b.p, 0, v->b.n)) {  // NUL bytes become the sentinel (3 bytes each)
        Buf b = {0};
        unsigned char sent[3] = {0xEF, (unsigned char)(0x80 | ((r->nul >> 6) & 0x3F)),
                                 (unsigned char)(0x80 | (r->nul & 0x3F))};
        for (uint32_t i = 0; i < v->b.n; i++) {
            if (v->b.p[i]) buf_append(&b, v->b.p + i, 1);
            else buf_append(&b, sent, 3);
        }
        cJSON *item = checked(cJSON_CreateString(""));
        free(item->valuestring);
        item->valuestring = b.data;
        return item;
    }
    // cJSON_CreateString would need a NUL-terminated copy first; build the item around one copy instead
    // (cJSON's allocator is malloc: the hooks are never changed).
    cJSON *item = checked(cJSON_CreateString(""));
    free(item->valuestring);
    item->valuestring = xmalloc((size_t)v->b.n + 1);
    memcpy(item->valuestring, v->b.p, v->b.n);
    item->valuestring[v->b.n] = '\0';
    return item;
}

static cJSON *read_node(ParquetReader *r, int i);

// The instances of repeated node `i` at this point of its parent, as an array: of the instances themselves,
// or (element) of each instance's only child (a LIST's three-level form).
static cJSON *read_repeated(ParquetReader *r, int i, int element) {
    const Node *nd = &r->nodes[i];
    cJSON *arr = checked(cJSON_CreateArray());
    if (def_at(r, nd->leaf_lo) < nd->def) {  // empty: one entry below says so
        skip(r, nd);
        return arr;
    }
    const Column *first = &r->cols[nd->leaf_lo];
    for (;;) {
        cJSON *item = element ? read_node(r, nd->children[0]) : read_node(r, i);
        cJSON_AddItemToArray(arr, item);
        if (first->pos >= first->n || !first->rep || first->rep[first->pos] != nd->rep) break;
    }
    return arr;
}

// A LIST-annotated group's element form: a repeated child that is a group of one field, not named
// "array" or "<list>_tuple" (the legacy two-level forms), is a wrapper; anything else is the element.
static int list_wraps(const ParquetReader *r, const Node *list, const Node *rep) {
    if (rep->type != T_GROUP || rep->n_children != 1 || strcmp(rep->name, "array") == 0) return 0;
    char *tuple = xprintf("%s_tuple", list->name);
    int wraps = strcmp(rep->name, tuple) != 0;
    free(tuple);
    (void)r;
    return wraps;
}

static cJSON *read_map(ParquetReader *r, const Node *nd) {
    const Node *kv = &r->nodes[nd->children[0]];
    if (kv->repetition != R_REPEATED || kv->type != T_GROUP || kv->n_children < 1 || kv->n_children > 2)
        die("%s: column %s: a MAP whose child is not a repeated key-value group", r->path, nd->path);
    cJSON *obj = checked(cJSON_CreateObject());
    if (def_at(r, kv->leaf_lo) < kv->def) {
        skip(r, kv);
        return obj;
    }
    const Column *first = &r->cols[kv->leaf_lo];
    for (;;) {
        cJSON *key = read_node(r, kv->children[0]);
        cJSON *value = kv->n_children == 2 ? read_node(r, kv->children[1]) : checked(cJSON_CreateNull());
        char *name = cJSON_IsString(key) ? xstrdup(key->valuestring) : cJSON_PrintUnformatted(key);
        if (!name) die("out of memory");
        cJSON_AddItemToObject(obj, name, value);  // keys are unique in a valid map: no search for repeats
        free(name);
        cJSON_Delete(key);
        if (first->pos >= first->n || !first->rep || first->rep[first->pos] != kv->rep) break;
    }
    return obj;
}

// One instance of node i (its own repetition is the caller's business).
static cJSON *read_node(ParquetReader *r, int i) {
    const Node *nd = &r->nodes[i];
    if (nd->repetition == R_OPTIONAL && def_at(r, nd->leaf_lo) < nd->def) {
        skip(r, nd);
        return checked(cJSON_CreateNull());
    }
    if (nd->leaf >= 0) return checked(leaf_value(r, nd));
    if (nd->annotation == A_LIST && nd->n_children == 1 && r->nodes[nd->children[0]].repetition == R_REPEATED) {
        const Node *rep = &r->nodes[nd->children[0]];
        return read_repeated(r, nd->children[0], list_wraps(r, nd, rep));
    }
    if (nd->annotation == A_MAP && nd->n_children == 1) return read_map(r, nd);
    cJSON *obj = checked(cJSON_CreateObject());
    for (int c = 0; c < nd->n_children; c++) {
        int ci = nd->children[c];
        const Node *child = &r->nodes[ci];
        cJSON *item = child->repetition == R_REPEATED ? read_repeated(r, ci, 0) : read_node(r, ci);
        cJSON_AddItemToObject(obj, child->name, item);
    }
    return obj;
}

cJSON *parquet_next(ParquetReader *r) {
    while (r->group < 0 || r->group_row == r->groups[r->group].num_rows) {
        for (int li = 0; r->group >= 0 && li < r->n_leaves; li++) {  // the row group's columns are used up
            const Column *col = &r->cols[li];
            if (col->pos != col->n || col->vpos != col->nv) bad_row(r, "the columns disagree");
        }
        if (r->group + 1 >= r->n_groups) {
            free_group(r);
            return NULL;
        }
        r->group++;
        load_group(r);
    }
    const Node *root = &r->nodes[0];
    cJSON *row = checked(cJSON_CreateObject());
    for (int c = 0; c < root->n_children; c++) {
        if (!r->selected[c]) continue;
        int ci = root->children[c];
        const Node *top = &r->nodes[ci];
        cJSON *item = top->repetition == R_REPEATED ? read_repeated(r, ci, 0) : read_node(r, ci);
        cJSON_AddItemToObject(row, top->name, item);
        for (int li = top->leaf_lo; li < top->leaf_hi; li++) {  // every column is at the next row's start
            const Column *col = &r->cols[li];
            if (col->pos < col->n && col->rep && col->rep[col->pos] != 0) bad_row(r, "the columns disagree");
        }
    }
    r->group_row++;
    r->row++;
    return row;
}

void parquet_close(ParquetReader *r) {
    if (!r) return;
    free_group(r);
    for (int i = 0; i < r->n_nodes; i++) {
        free(r->nodes[i].name);
        free(r->nodes[i].path);
        free(r->nodes[i].children);
    }
    for (int g = 0; g < r->n_groups; g++) free(r->groups[g].chunks);
    free(r->nodes);
    free(r->leaves);
    free(r->groups);
    free(r->selected);
    free(r->cols);
    free(r->bufs);
    if (r->f) fclose(r->f);
    free(r->path);
    free(r);
}
