// safetensors: the header and tensor table (safetensors_open), every tensor's data converted to fp32,
// then the whole file as a model's weights (decoder_load, against a fixed config.json of the seeds' shape).
#include <stdlib.h>

#include "fuzz.h"
#include "io/safetensors.h"
#include "model/decoder.h"

static char *model_dir, *st_path;

static void body(const uint8_t *data, size_t size, void *ctx) {
    (void)data, (void)size, (void)ctx;
    SafeTensors st;
    safetensors_open(&st, st_path);
    for (int i = 0; i < st.n_tensors; i++) {
        const StTensor *t = &st.tensors[i];
        float *x = malloc((size_t)t->numel * sizeof(float) + 1);
        if (!x) fuzz_fail("out of memory for %lld elements", (long long)t->numel);
        dtype_to_f32(t->dtype, t->data, x, (size_t)t->numel);
        free(x);
    }
    safetensors_close(&st);
    Decoder m;
    decoder_load(&m, model_dir, DTYPE_F32);
    decoder_free(&m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    // The shape of the seed models (tests/fuzz/make_seeds.py).
    static const char cfg[] =
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_act\": \"silu\", "
        "\"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, \"vocab_size\": 16, "
        "\"tie_word_embeddings\": true, \"max_position_embeddings\": 32}";
    free(fuzz_write("config.json", cfg, sizeof cfg - 1));
    model_dir = (char *)fuzz_dir();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!st_path) st_path = fuzz_write("model.safetensors", data, size);
    else free(fuzz_write("model.safetensors", data, size));
    fuzz_run(body, data, size, NULL);
    return 0;
}
