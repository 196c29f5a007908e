// grpo serve: an OpenAI-compatible HTTP server for a model (src/serve/).
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/lora.h"
#include "model/vl.h"
#include "rollout/rollout.h"
#include "serve/server.h"
#include "text/tokenizer.h"

// The bearer key of --api-key-file: its first line, without the line end; dies when empty.
static char *read_key(const char *path) {
    size_t n;
    file_check_readable("option --api-key-file", path);
    char *key = file_read_all(path, 4096, &n);
    key[strcspn(key, "\r\n")] = '\0';
    if (!key[0]) die("option --api-key-file: %s holds no key on its first line", path);
    return key;
}

int cmd_serve(int argc, char **argv) {
    CliOpt opts[] = {
        {"--model", "DIR", "Hugging Face model directory (tokenizer.json there for text and chat)", NULL, 1},
        {"--adapter", "DIR", "apply this PEFT LoRA adapter to the model (CPU)", NULL, 0},
        {"--host", "ADDR", "address to bind (0.0.0.0 or :: to serve other machines)", "127.0.0.1", 0},
        {"--port", "N", "TCP port (0: any free one, printed on stderr)", "8000", 0},
        {"--served-model-name", "NAME", "the model's name in the API (default: --model as given)", NULL, 0},
        {"--device", "cpu|cuda[:N]|emu", "where the model runs (a GPU, or the emulated one, computes in bf16)",
         "cpu", 0},
        {"--dtype", "f32|bf16|int8",
         "weights and products in fp32, or bf16, or bf16 with int8 copies for decode (default: the checkpoint's)",
         NULL, 0},
        {"--max-batch", "N", "sequences decoded together (KV cache slots)", "16", 0},
        {"--max-len", "N", "prompt + max_tokens at most (default: max_position_embeddings, at most 4096)",
         NULL, 0},
        {"--max-queue", "N", "requests waiting for a slot; beyond it: 429 with Retry-After", "256", 0},
        {"--max-n", "N", "\"n\" (choices per prompt) at most", "16", 0},
        {"--prefill-tokens", "N", "tokens per prefill forward pass", "2048", 0},
        {"--api-key-file", "F", "require \"Authorization: Bearer KEY\" with the key on F's first line", NULL,
         0},
        {"--max-body-mb", "MB", "request body size at most (413)", "8", 0},
        {"--max-header-kb", "KB", "a connection's memory for the request line and headers (431 beyond)", "64",
         0},
        {"--timeout", "S", "close a connection idle (or sending nothing) this long", "60", 0},
        {"--max-connections", "N", "open connections at most", "4096", 0},
        {"--http-threads", "N", "threads reading, parsing and answering requests (the engine has its own)", "4",
         0},
        {"--reasoning-parser", "qwen3|none",
         "chat: the text of an answer that opens with <think> up to </think> is its reasoning_content (vLLM's)",
         "none", 0},
        {"--prefill-chunk", "N",
         "while requests decode, a step prefills at most N prompt tokens, in the same forward (0: whole prompts)",
         "0", 0},
        {"--kv-cache-mb", "MB",
         "KV cache budget: the running requests' prompts and max_tokens, and the prefix cache, fit in MB MiB; a "
         "request waits until its sequences fit (0: --max-batch x --max-len, on the CPU at most half the memory "
         "available)",
         "0", 0},
        {"--kv-cache-dtype", "auto|fp32|bf16",
         "the KV cache's elements: bf16 halves it (keys and values rounded as written; auto: fp32)", "auto", 0},
        {"--no-prefix-cache", NULL,
         "prefill every prompt whole (default: a prompt's start that a running or recent sequence's cache holds is "
         "copied from it)",
         NULL, 0},
        {"--log", "FILE", "append a line per request (time, client, request, status, seconds, tokens); - for stderr",
         NULL, 0},
    };
    CliSpec spec = {
        "grpo serve --model DIR [options]",
        "OpenAI-compatible endpoints: POST /v1/completions, POST /v1/chat/completions (stream: true\n"
        "for server-sent events), GET /v1/models[/ID], POST /tokenize and /detokenize (vLLM's),\n"
        "GET /health, GET /metrics (Prometheus). Unknown request fields are refused (400), not ignored.\n"
        "Requests join the running decode batch between steps (continuous batching). Log-probs are\n"
        "grpo generate's: log p under softmax(logits / T) (T = 1 when greedy), and a prompt's (echo)\n"
        "grpo score's. SIGINT/SIGTERM: stop accepting, finish the accepted requests, exit 0.",
        opts, sizeof opts / sizeof opts[0]};
    cli_parse(&spec, argc, argv);
    const char *dir = cli_str(&spec, "--model");
    ServeOptions o = {.host = cli_str(&spec, "--host"),
                      .port = (int)cli_int(&spec, "--port", 0, 65535),
                      .max_batch = (int)cli_int(&spec, "--max-batch", 1, 4096),
                      .max_queue = (int)cli_int(&spec, "--max-queue", 1, 1 << 20),
                      .max_n = (int)cli_int(&spec, "--max-n", 1, 4096),
                      .prefill_tokens = cli_int(&spec, "--prefill-tokens", 1, INT64_C(1) << 24),
                      .max_body = (size_t)cli_int(&spec, "--max-body-mb", 1, 4096) << 20,
                      .max_header = (size_t)cli_int(&spec, "--max-header-kb", 4, 1 << 20) << 10,
                      .timeout_s = (unsigned)cli_int(&spec, "--timeout", 1, 86400),
                      .max_connections = (unsigned)cli_int(&spec, "--max-connections", 1, 1 << 20),
                      .http_threads = (unsigned)cli_int(&spec, "--http-threads", 1, 256),
                      .log = cli_str(&spec, "--log"),
                      .prefix_cache = !cli_str(&spec, "--no-prefix-cache"),
                      .prefill_chunk = cli_int(&spec, "--prefill-chunk", 0, INT64_C(1) << 24),
                      .kv_cache_mb = cli_int(&spec, "--kv-cache-mb", 0, INT64_C(1) << 30)};
    const char *parser = cli_str(&spec, "--reasoning-parser");
    if (strcmp(parser, "qwen3") && strcmp(parser, "none"))
        die("option --reasoning-parser: \"%s\" is not qwen3 or none", parser);
    o.reasoning = !strcmp(parser, "qwen3");
    o.model_name = cli_str(&spec, "--served-model-name") ? cli_str(&spec, "--served-model-name") : dir;
    char *key = cli_str(&spec, "--api-key-file") ? read_key(cli_str(&spec, "--api-key-file")) : NULL;
    o.api_key = key;
    int local = !strcmp(o.host, "127.0.0.1") || !strcmp(o.host, "::1") || !strcmp(o.host, "localhost");
    if (!local && !key)
        fprintf(stderr, "grpo: warning: --host %s without --api-key-file: anyone who reaches this port can use "
                "the model\n", o.host);

    Decoder m;
    Lora lora;
    DecoderQ8 q8;
    const Backend *be = cli_load_model(&spec, dir, &m, &lora, &q8, CLI_MODEL_VL);
    m.cfg.kv_dtype = cli_kv_dtype(&spec);
    VlModel vl;
    if (m.cfg.vl) vl_model_load(&vl, dir, &m.cfg);
    o.vl = m.cfg.vl ? &vl : NULL;
    o.max_len = m.cfg.max_pos < 4096 ? m.cfg.max_pos : 4096;
    if (cli_str(&spec, "--max-len")) o.max_len = cli_int(&spec, "--max-len", 2, m.cfg.max_pos);
    Tokenizer tok;
    char *tok_path = path_join(dir, "tokenizer.json");
    int has_tok = file_exists(tok_path);
    free(tok_path);
    if (has_tok) tokenizer_load(&tok, dir);
    if (has_tok && m.cfg.vl) tok.chat.image_text = VL_IMAGE_TEXT;  // an image part in joined text
    int32_t stop_ids[16];
    int n_stop = rollout_stop_ids(dir, has_tok ? &tok : NULL, stop_ids);
    int rc = serve_run(&m, has_tok ? &tok : NULL, stop_ids, n_stop, &o);
    if (has_tok) tokenizer_free(&tok);
    free(key);
    free(spec.args);
    if (m.cfg.vl) vl_model_free(&vl);
    decoder_free(&m);
    decoder_q8_free(&q8);
    lora_free(&lora);
    backend_close(be);
    return rc;
}
