// What the architecture table makes of a config, for arch_test.py (one line of JSON):
//   arch_tool DIR        DIR/config.json as the loader reads it
//   arch_tool --preset NAME
// {"architecture", "params" (the layout's parameter count), "head_dim", "attn_bias", "qk_norm", "sliding_window",
//  "inv_freq" (RoPE's per-pair angle a position, rope_inv_freq), "config" (what grpo writes back)}
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "base/util.h"
#include "model/decoder.h"

int main(int argc, char **argv) {
    if (argc < 2) die("usage: arch_tool DIR | arch_tool --preset NAME");
    DecoderConfig c;
    if (!strcmp(argv[1], "--preset")) {
        if (argc < 3 || !decoder_config_preset(&c, argv[2])) die("arch_tool: unknown preset");
    } else {
        decoder_config_read(&c, argv[1]);
    }
    DecoderLayout w;
    cJSON *out = cJSON_CreateObject(), *inv = cJSON_CreateArray();
    if (!out || !inv) die("out of memory");
    cJSON_AddStringToObject(out, "architecture", decoder_arch_name(&c));
    cJSON_AddNumberToObject(out, "params", (double)decoder_layout(&c, &w));
    cJSON_AddNumberToObject(out, "head_dim", (double)c.head_dim);
    cJSON_AddBoolToObject(out, "attn_bias", c.attn_bias);
    cJSON_AddBoolToObject(out, "qk_norm", c.qk_norm);
    cJSON_AddNumberToObject(out, "sliding_window", (double)c.sliding_window);
    for (int j = 0; j < c.head_dim / 2; j++)
        cJSON_AddItemToArray(inv, cJSON_CreateNumber(rope_inv_freq(c.rope, j, (int)c.head_dim)));
    cJSON_AddItemToObject(out, "inv_freq", inv);
    cJSON_AddItemToObject(out, "config", decoder_config_json(&c, DTYPE_BF16));
    char *s = cJSON_PrintUnformatted(out);
    if (!s) die("out of memory");
    puts(s);
    cJSON_free(s);
    cJSON_Delete(out);
    return 0;
}
