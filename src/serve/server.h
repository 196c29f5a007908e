// grpo serve's server: HTTP from libmicrohttpd (a pool of epoll threads), an engine thread that runs the
// rollout engine's steps (continuous batching: requests join and leave between steps), and the main
// thread waiting for SIGINT/SIGTERM to drain and stop.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "model/decoder.h"
#include "model/vl.h"
#include "text/tokenizer.h"

typedef struct {
    const char *host;  // an IPv4 or IPv6 address to bind
    int port;          // 0: any free port (the one chosen is printed)
    const char *model_name;
    int max_batch;    // sequences decoded together (KV cache slots)
    int max_queue;    // requests waiting for slots; one more is answered 429
    int max_n;        // "n" at most
    int64_t max_len;  // prompt + max_tokens at most (a KV slot's length)
    int64_t prefill_tokens;
    const char *api_key;  // bearer key, or NULL
    size_t max_body;      // request body bytes at most (413)
    size_t max_header;    // a connection's memory for headers (larger: 431)
    unsigned timeout_s;   // an idle or slow connection is closed after this
    unsigned max_connections;
    unsigned http_threads;  // MHD's pool: parsing, templates and formatting run on them
    const char *log;        // the access log's path ("-": stderr), or NULL
    int reasoning;          // --reasoning-parser qwen3
    int prefix_cache;       // reuse cached prompt prefixes' keys and values (rollout_engine_prefix_cache)
    int64_t prefill_chunk;  // prompt rows a step while requests decode (rollout_engine_prefill_chunk; 0: whole)
    int64_t kv_cache_mb;    // the KV cache's budget in MiB (rollout_engine_kv_budget; 0: every slot whole,
                            // on the CPU at most half the memory available at start)
    const VlModel *vl;      // a vision-language model's tower and image processor, or NULL
} ServeOptions;

// Serves until SIGINT or SIGTERM: stops accepting, finishes what was accepted, returns 0.
int serve_run(const Decoder *m, Tokenizer *tok, const int32_t *stop_ids, int n_stop_ids, const ServeOptions *o);
