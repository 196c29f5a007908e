// YAML configuration files (libyaml) read as a flat list of dotted keys: nested mappings become
// "actor.lr", so a config can be checked key by key against one table, with the file:line of each.
//
//   actor:            ->  "actor.lr"   = "1e-6"        (scalar, line 2)
//     lr: 1e-6            "rollout.stop" = ["</answer>"] (list, line 3)
//   rollout: {stop: ["</answer>"]}
//
// Scalars keep their text: the caller types them by key (a key that wants a number accepts "1e-6",
// which YAML 1.1's own resolver would leave a string). Anchors, aliases and "<<" merge keys work;
// tags are ignored. Malformed YAML, duplicate keys and other misuse die with the position.
#pragma once
#include <stddef.h>
#include <stdio.h>

typedef struct {
    char *text;
    int is_null;  // an unquoted ~, null, Null, NULL or nothing at all
} YamlScalar;

typedef enum {
    YAML_ENTRY_SCALAR,
    YAML_ENTRY_LIST,       // a sequence of scalars
    YAML_ENTRY_EMPTY_MAP,  // {} (a section given no keys)
} YamlEntryKind;

typedef struct {
    char *key;  // dotted path
    YamlEntryKind kind;
    YamlScalar scalar;  // YAML_ENTRY_SCALAR
    YamlScalar *items;  // YAML_ENTRY_LIST
    int n_items;
    int line;  // 1-based line of the key in the file; 0 for a value given on the command line
} YamlEntry;

typedef struct {
    YamlEntry *entries;
    int n, cap;
} YamlDoc;

// Loads a file whose top level is a mapping (an empty file gives no entries). Dies with
// "PATH:LINE:COL: <libyaml's problem>" for malformed YAML and "PATH:LINE: duplicate key ..." for a
// key given twice, naming both lines.
void yaml_doc_load_file(YamlDoc *d, const char *path);
// Appends the flattened entries of one value written in YAML, e.g. the "[a, b]" of an override
// "rollout.stop=[a, b]", under the dotted key `prefix`: a scalar, a flow sequence or a flow mapping.
// Errors start with `where` (e.g. `override "rollout.stop=[a, b"`); `col_offset` is added to the
// column libyaml reports, so it counts from the start of the text the user typed.
void yaml_doc_load_value(YamlDoc *d, const char *prefix, const char *text, const char *where, int col_offset);
void yaml_doc_free(YamlDoc *d);
// Writes s[0..n) as a YAML double-quoted scalar that libyaml and PyYAML read back as the same string:
// '"', '\\' and the characters YAML forbids or folds (controls, DEL, C1 controls with NEL, U+2028,
// U+2029, U+FEFF, U+FFFE, U+FFFF) as escapes, the rest as UTF-8. Bytes that are not UTF-8 (libyaml
// never gives such strings) become U+FFFD.
void yaml_write_string(FILE *f, const char *s, size_t n);
