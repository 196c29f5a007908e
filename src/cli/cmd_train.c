// grpo train: GRPO from a YAML config plus dotted key=value overrides (verl's convention).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "cli/commands.h"
#include "cli/demo.h"
#include "cli/demo_tools.h"
#include "cli/demo_vl.h"
#include "train/grpo/grpo.h"

static void usage(FILE *f) {
    fprintf(f, "usage: grpo train [--config FILE.yaml] [section.key=value ...] [--print-config]\n\n"
               "GRPO, fully colocated: rollout on the policy's own weights, rule or program rewards, group\n"
               "advantages, clipped-ratio update with KL, AdamW. Every key, its default and meaning: the\n"
               "configuration table in README.md (grpo train --print-config shows the resolved values).\n\n"
               "With no arguments, or --demo: the built-in demo in runs/demo (--demo-smoke: shortened to\n"
               "seconds; --demo-qwen3, --demo-llama: its model Qwen3- or Llama-shaped). --demo-tools: the\n"
               "tool-use demo in runs/demo-tools (multi-turn rollout; --demo-tools-smoke: shortened).\n"
               "--demo-vl: the vision-language demo in runs/demo-vl (a tiny Qwen2.5-VL counts red squares;\n"
               "--demo-vl-smoke: shortened).\n");
}

// A word that names a config file (FILE.yaml, .yml or .json) rather than a key=value override.
static int config_like(const char *word) {
    static const char *const ext[] = {".yaml", ".yml", ".json"};
    size_t n = strlen(word);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t e = strlen(ext[i]);
        if (n > e && strcmp(word + n - e, ext[i]) == 0) return 1;
    }
    return 0;
}

int cmd_train(int argc, char **argv) {
    const char *config = NULL;
    char **overrides = xmalloc((size_t)argc * sizeof *overrides);
    // no arguments: the built-in demo
    int n = 0, print = 0, demo = argc == 1, smoke = 0, tools = 0, vl = 0;
    DecoderFamily family = ARCH_QWEN2;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            free(overrides);
            return 0;
        } else if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) die("option --config needs a file");
            config = argv[++i];
        } else if (strcmp(argv[i], "--demo") == 0 || strcmp(argv[i], "--demo-smoke") == 0) {
            demo = 1, smoke = argv[i][6] != '\0';
        } else if (strcmp(argv[i], "--demo-qwen3") == 0) {
            demo = 1, family = ARCH_QWEN3;
        } else if (strcmp(argv[i], "--demo-llama") == 0) {
            demo = 1, family = ARCH_LLAMA;
        } else if (strcmp(argv[i], "--demo-tools") == 0 || strcmp(argv[i], "--demo-tools-smoke") == 0) {
            demo = 1, tools = 1, smoke = argv[i][12] != '\0';
        } else if (strcmp(argv[i], "--demo-vl") == 0 || strcmp(argv[i], "--demo-vl-smoke") == 0) {
            demo = 1, vl = 1, smoke = argv[i][9] != '\0';
        } else if (strcmp(argv[i], "--print-config") == 0) {
            print = 1;
        } else if (strncmp(argv[i], "--", 2) == 0) {
            die("unknown option \"%s\" (see grpo train --help)", argv[i]);
        } else if (!strchr(argv[i], '=') && config_like(argv[i])) {
            die("\"%s\" is a configuration file%s: pass it as --config %s", argv[i],
                file_exists(argv[i]) ? "" : " name (and does not exist)", argv[i]);
        } else {
            overrides[n++] = argv[i];
        }
    }
    if (demo) {
        if (config || print) die("--demo runs the built-in demo; it takes no --config or --print-config");
        if (tools) demo_tools_run("runs/demo-tools", 0, smoke, overrides, n, NULL);
        else if (vl) demo_vl_run("runs/demo-vl", 0, smoke, overrides, n, NULL);
        else demo_run("runs/demo", 0, smoke, family, overrides, n, NULL);
        free(overrides);
        return 0;
    }
    GrpoConfig c;
    grpo_config_defaults(&c);
    grpo_config_load(&c, config, overrides, n);
    if (print) {
        grpo_config_print_json(&c, stdout);
        printf("\n");
    } else {
        GrpoSettings s;
        grpo_settings_resolve(&s, &c);
        grpo_run(&s);
    }
    grpo_config_free(&c);
    free(overrides);
    return 0;
}
