// Data rows from JSONL or Parquet files, as JSON objects: what the SFT and GRPO data loaders read.
// A file is Parquet when it starts with Parquet's magic (any name), else JSONL (one object a line).
#pragma once
#include <cjson/cJSON.h>
#include <stdint.h>

#include "base/json.h"
#include "io/parquet.h"

typedef struct {
    const char *path;   // borrowed
    int64_t line;       // JSONL: the 1-based line of the row records_next returned last; Parquet: its row
    uint32_t nul;       // that row's U+0000 sentinel (json_parse_line; parquet_nul_sentinel), for json_string_bytes
    JsonlReader jsonl;
    ParquetReader *parquet;  // NULL for JSONL
    char where[512];    // "PATH:LINE" or "PATH: row N", for messages
} RecordReader;

// Dies with "KEY: cannot open PATH: why". columns: the top-level keys the caller reads (n of them; for
// Parquet only those columns are decoded), or NULL for all.
void records_open(RecordReader *r, const char *path, const char *key, const char *const *columns, int n);
// The next row (the caller cJSON_Deletes it), or NULL at the end; updates line, nul and where.
cJSON *records_next(RecordReader *r);
void records_close(RecordReader *r);
// The item at a dotted path ("reward_model.ground_truth"): a key holding the whole path wins, else each
// part descends into an object. NULL when absent.
const cJSON *records_get(const cJSON *row, const char *dotted);
