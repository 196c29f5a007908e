// Minimal "--name value" option parsing shared by the subcommands.
#pragma once
#include <stdint.h>

typedef struct {
    const char *name;     // "--model"
    const char *metavar;  // "DIR"; NULL for a flag
    const char *help;
    const char *value;    // default (NULL: none); after parsing, the given value ("1" for a given flag)
    int required;
} CliOpt;

typedef struct {
    const char *usage;  // first line of --help, e.g. "grpo score --model DIR < in.jsonl > out.jsonl"
    const char *about;  // one paragraph
    CliOpt *opts;
    int n;
} CliSpec;

// Parses argv[1..argc); prints help and exits 0 on --help/-h; dies on unknown options,
// missing values and missing required options.
void cli_parse(CliSpec *spec, int argc, char **argv);
const char *cli_str(const CliSpec *spec, const char *name);
// Value of an integer / real option; dies naming the option when malformed or outside [lo, hi].
int64_t cli_int(const CliSpec *spec, const char *name, int64_t lo, int64_t hi);
