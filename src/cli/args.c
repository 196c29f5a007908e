#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static CliOpt *find(const CliSpec *spec, const char *name) {
    for (int i = 0; i < spec->n; i++)
        if (strcmp(spec->opts[i].name, name) == 0) return &spec->opts[i];
    die("internal: option %s is not declared", name);
}

static void print_help(const CliSpec *spec) {
    printf("usage: %s\n\n%s\n\noptions:\n", spec->usage, spec->about);
    for (int i = 0; i < spec->n; i++) {
        const CliOpt *o = &spec->opts[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
        printf("  %-24s %s", left, o->help);
        if (o->required) printf(" (required)");
        else if (o->value && o->metavar) printf(" (default: %s)", o->value);
        printf("\n");
    }
    printf("  %-24s %s\n", "--help", "show this help");
}

void cli_parse(CliSpec *spec, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_help(spec);
            exit(0);
        }
        CliOpt *o = NULL;
        for (int j = 0; j < spec->n; j++)
            if (strcmp(spec->opts[j].name, argv[i]) == 0) o = &spec->opts[j];
        if (!o) die("unknown option \"%s\" (see --help)", argv[i]);
        if (!o->metavar) {
            o->value = "1";
        } else {
            if (i + 1 >= argc) die("option %s needs a value %s", o->name, o->metavar);
            o->value = argv[++i];
        }
    }
    for (int j = 0; j < spec->n; j++)
        if (spec->opts[j].required && !spec->opts[j].value) die("missing required option %s (see --help)", spec->opts[j].name);
}

const char *cli_str(const CliSpec *spec, const char *name) { return find(spec, name)->value; }

int64_t cli_int(const CliSpec *spec, const char *name, int64_t lo, int64_t hi) {
    const char *s = find(spec, name)->value;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        die("option %s: \"%s\" is not an integer in [%lld, %lld]", name, s, (long long)lo, (long long)hi);
    return v;
}
