#include "io/records.h"

#include <stdio.h>
#include <string.h>


void records_open(RecordReader *r, const char *path, const char *key, const char *const *columns, int n) {
    memset(r, 0, sizeof *r);
    r->path = path;
    if (parquet_sniff(path)) {
        r->parquet = parquet_open(path, key);
        if (columns) parquet_select(r->parquet, columns, n);
    } else {
        jsonl_open(&r->jsonl, path, key);
    }
}

cJSON *records_next(RecordReader *r) {
    cJSON *row;
    if (r->parquet) {
        row = parquet_next(r->parquet);
        if (row) r->line++;
        r->nul = parquet_nul_sentinel(r->parquet);
        snprintf(r->where, sizeof r->where, "%s: row %lld", r->path, (long long)r->line);
    } else {
        row = jsonl_next(&r->jsonl);
        r->line = r->jsonl.line;
        r->nul = r->jsonl.nul;
        snprintf(r->where, sizeof r->where, "%s:%lld", r->path, (long long)r->line);
    }
    return row;
}

void records_close(RecordReader *r) {
    if (r->parquet) parquet_close(r->parquet);
    else jsonl_close(&r->jsonl);
    memset(r, 0, sizeof *r);
}

const cJSON *records_get(const cJSON *row, const char *dotted) {
    const cJSON *whole = cJSON_GetObjectItemCaseSensitive(row, dotted);
    if (whole || !strchr(dotted, '.')) return whole;
    const cJSON *at = row;
    for (const char *p = dotted; at;) {  // each part names a member of the object reached so far
        size_t len = strcspn(p, ".");
        const cJSON *next = NULL;
        for (const cJSON *e = cJSON_IsObject(at) ? at->child : NULL; e && !next; e = e->next)
            if (e->string && strlen(e->string) == len && memcmp(e->string, p, len) == 0) next = e;
        at = next;
        if (!p[len]) break;
        p += len + 1;
    }
    return at;
}
