// The resolved `grpo train` configuration, for config_test.py:
//   config_tool [--config FILE.yaml] [dotted.key=value ...]   one line of JSON
//   config_tool --yaml [--config FILE.yaml] [key=value ...]    the same as YAML (OUT/config.yaml)
//   config_tool --markdown                                    the reference table (README.md)
//   config_tool --schema                                      the key table as JSON
#include <stdio.h>
#include <string.h>

#include "train/grpo/config.h"

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "--markdown")) {
        grpo_config_print_markdown(stdout);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "--schema")) {
        grpo_config_print_schema(stdout);
        return 0;
    }
    const char *path = NULL;
    int first = 1, yaml = 0;
    if (argc >= 2 && !strcmp(argv[1], "--yaml")) yaml = 1, first = 2;
    if (argc >= first + 2 && !strcmp(argv[first], "--config")) path = argv[first + 1], first += 2;
    GrpoConfig c;
    grpo_config_defaults(&c);
    grpo_config_load(&c, path, argv + first, argc - first);
    if (yaml) {
        grpo_config_print_yaml(&c, stdout);
    } else {
        grpo_config_print_json(&c, stdout);
        fputc('\n', stdout);
    }
    grpo_config_free(&c);
    return 0;
}
