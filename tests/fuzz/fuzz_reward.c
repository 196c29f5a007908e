// The rule rewards on arbitrary response text: the input is the response, then the ground-truth answer
// after a separator line (fuzz.h). Every rule kind scores it: gsm8k strict and flexible (clipped, after
// </think>), boxed, the default format regex and exact match.
#include <stdlib.h>

#include "fuzz.h"
#include "rl/reward.h"

static RewardSet set;

typedef struct {
    char *response, *answer;
} Input;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size;
    Input *in = ctx;
    RewardDetail d;
    double r = reward_score(&set, "", in->response, in->answer, NULL, &d);
    if (r != r) fuzz_fail("reward is NaN");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    RewardSpec specs[6];
    reward_spec_defaults(&specs[0], REWARD_GSM8K);
    reward_spec_defaults(&specs[1], REWARD_GSM8K);
    specs[1].flexible = 1;
    specs[1].clip_chars = 300;
    specs[1].strip_think = 1;
    reward_spec_defaults(&specs[2], REWARD_BOXED);
    reward_spec_defaults(&specs[3], REWARD_BOXED);
    specs[3].strip_think = 1;
    reward_spec_defaults(&specs[4], REWARD_FORMAT);
    reward_spec_defaults(&specs[5], REWARD_EXACT);
    reward_set_init(&set, specs, 6);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *parts[2];
    size_t lens[2];
    fuzz_split(data, size, parts, lens, 2);
    Input in = {parts[0], parts[1]};
    fuzz_run(body, data, size, &in);
    fuzz_parts_free(parts, 2);
    return 0;
}
