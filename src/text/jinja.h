// A Jinja engine for Hugging Face chat templates, set up as transformers sets up jinja2
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols; `tojson` as json.dumps with
// ensure_ascii=False; globals raise_exception and strftime_now; the {% generation %} tag).
//
// What it runs: text, {{ }}, {% %} and {# #} with -/+ whitespace control; if/elif/else, for (loop.*,
// `if` filter, else, break/continue, tuple targets), set (names, namespace attributes, block set),
// macro/call/caller, filter blocks, with, raw; the expressions, tests, filters and str/list/dict methods
// templates use, with Python's semantics (str(), repr(), slicing by code point, floats' repr).
// Sandboxed: no I/O (include, import and extends are errors), and a render is bounded in steps, nesting,
// memory and output: a hostile template ends in an error, never a hang.
// Known differences from jinja2: integers are 64-bit (overflow is an error); upper/lower/title/capitalize use
// Unicode's simple case mappings ("ß" upper stays one character); `%` string formatting, str.format and a few
// rarely used filters (format, truncate, batch, slice, wordcount) are refused.
#pragma once
#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

typedef struct JinjaTemplate JinjaTemplate;

// Parses a template's source. name: how errors call it (a file). NULL and *err (malloc'd) on a syntax error.
JinjaTemplate *jinja_parse(const char *src, size_t n, const char *name, char **err);
void jinja_free(JinjaTemplate *t);
// Appends the rendering with the variables of vars (a JSON object; its strings' U+0000 as nul_sentinel,
// json_parse_line's). Returns NULL, or the error (malloc'd: "NAME line N: message"; raise_exception's
// message as given). out is left as it was on an error.
char *jinja_render(const JinjaTemplate *t, const cJSON *vars, uint32_t nul_sentinel, Buf *out);
// Whether the template loops over a message's content (`for x in m.content` or m['content']): it takes
// content as a list of parts (the test vLLM uses to pick its content format).
int jinja_loops_over_content(const JinjaTemplate *t);
