// records_cat [--count] FILE [COLUMN...]: prints the rows grpo reads from a data file (Parquet or JSONL), one
// JSON object a line, for tests/io/parquet_test.py to compare with other readers. Columns: only those.
// --count: reads every row as the loaders do and prints only how many (bench/parquet.py times it).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "io/records.h"

int main(int argc, char **argv) {
    int count = argc > 1 && strcmp(argv[1], "--count") == 0;
    argv += count;
    argc -= count;
    if (argc < 2) {
        fprintf(stderr, "usage: records_cat [--count] FILE [COLUMN...]\n");
        return 2;
    }
    RecordReader r;
    records_open(&r, argv[1], "records_cat", argc > 2 ? (const char *const *)argv + 2 : NULL, argc - 2);
    long long n = 0;
    for (cJSON *row; (row = records_next(&r)); n++) {
        if (count) {
            cJSON_Delete(row);
            continue;
        }
        Buf text = {0};
        json_dump_py(&text, row, r.nul);  // U+0000 restored
        puts(text.data);
        buf_free(&text);
        cJSON_Delete(row);
    }
    records_close(&r);
    if (count) printf("%lld\n", n);
    file_flush(stdout, "stdout");
    return 0;
}
