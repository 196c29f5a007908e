// Apache Parquet files read row by row as JSON objects (the data sets of verl, TRL and Hugging Face).
//
// Our own reader: Debian 12 packages no Parquet library for C (Apache Arrow's C++/GLib libraries are
// not in bookworm). What it reads:
//   - physical types BOOLEAN, INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY, FIXED_LEN_BYTE_ARRAY (decimal,
//     float16, other bytes); INT96 is refused naming the column;
//   - nesting of any depth: optional values, structs, lists (the LIST annotation's three-level form and
//     the legacy two-level forms), maps (MAP), bare repeated fields;
//   - encodings PLAIN, PLAIN_DICTIONARY / RLE_DICTIONARY, RLE (booleans and levels, with bit-packed runs),
//     DELTA_BINARY_PACKED, DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY, BYTE_STREAM_SPLIT;
//   - data pages v1 and v2, dictionary pages; compression none, Snappy, gzip, Zstandard, Brotli, LZ4_RAW.
// A row becomes a cJSON object: strings, numbers (64-bit integers as doubles, as cJSON holds JSON's
// numbers), booleans, null, objects for structs and maps (string keys), arrays for lists.
//
// Streaming: the footer is read whole (capped), then one row group at a time, and of it only the selected
// top-level columns. Every size read from the file is checked against the file and a cap before anything
// is allocated; a bad file dies with one line naming the file, and the row group and column or the row.
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

typedef struct ParquetReader ParquetReader;

// 1 when the file starts with Parquet's magic "PAR1" (0 for JSONL and unreadable files).
int parquet_sniff(const char *path);
// Opens path and reads its footer; dies with "KEY: cannot open PATH: why" or "PATH: why".
ParquetReader *parquet_open(const char *path, const char *key);
// Reads only these top-level columns (n names; names the file lacks are ignored: a row simply has no
// such key). Call before the first parquet_next; without it every column is read.
void parquet_select(ParquetReader *r, const char *const *names, int n);
// Rows in the file (the footer's count).
int64_t parquet_num_rows(const ParquetReader *r);
// The next row as a JSON object (the caller cJSON_Deletes it), NULL after the last.
cJSON *parquet_next(ParquetReader *r);
void parquet_close(ParquetReader *r);
// The last row's U+0000 sentinel (0 when its strings hold no NUL): NUL bytes of its strings were replaced by
// this noncharacter, as json_parse_line does for JSONL; json_string_bytes restores them.
uint32_t parquet_nul_sentinel(const ParquetReader *r);
