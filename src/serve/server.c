// grpo serve's HTTP side, engine thread and metrics (see server.h).
//
// A job is one HTTP request. Its connection's handler (one of MHD's pool threads) checks the headers (the key,
// the size: refused before any body byte is kept), reads and parses the body, puts the job on the queue and
// suspends the connection (or starts its event stream); the engine thread admits queued jobs while KV slots are
// free, steps the engine, formats the stream chunks of the step (outside the lock) and publishes them, and
// resumes a finished job's connection, whose pool thread formats the whole response. One mutex guards what the
// threads share (the queue, a job's flags and output, the metrics); the tokenizer has its own (api_parse). A
// job is freed by whichever side lets go of it last: the engine when it is done with it, MHD when the request
// ends (on_completed, which writes the access log line).
//
// A client that closes its sending side only (a FIN: nc, some proxies) may still read: its answer is committed
// (the status and headers go out, and a space, JSON's whitespace), so that a client that is gone shows as a
// reset of the socket, which cancels the request. A cancelled request is never answered as if complete.
// A die() on the engine thread (a CUDA error, memory) is caught there: every accepted request is answered with
// the error, and the server stops.
#define _GNU_SOURCE  // POLLRDHUP
#include "serve/server.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <omp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/hash.h"
#include "base/json.h"
#include "base/util.h"
#include "rollout/rollout.h"
#include "serve/api.h"

#define N_BUCKETS 14
static const double buckets[N_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,  5,     10,   30,  60,   120};
// A histogram of a count per engine step (sequences, rows) over fixed bounds.
#define MAX_COUNT_BUCKETS 16
typedef struct {
    const int *le;  // n ascending bounds
    int n;
    int64_t count[MAX_COUNT_BUCKETS + 1];  // the last: above every bound
} Counts;
static const int batch_buckets[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
static const int row_buckets[] = {1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};
_Static_assert(sizeof batch_buckets / sizeof *batch_buckets <= MAX_COUNT_BUCKETS, "batch_buckets");
_Static_assert(sizeof row_buckets / sizeof *row_buckets <= MAX_COUNT_BUCKETS, "row_buckets");
static const int statuses[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_STATUSES ((int)(sizeof statuses / sizeof statuses[0]))

typedef struct {
    int64_t count[N_BUCKETS + 1];  // the last: +Inf
    double sum;
    int64_t n;
} Histogram;

static void hist_add(Histogram *h, double x) {
    int i = 0;
    while (i < N_BUCKETS && x > buckets[i]) i++;
    h->count[i]++;
    h->sum += x;
    h->n++;
}

typedef struct Job Job;
typedef struct Server Server;

struct Job {
    Server *srv;
    ApiJob api;
    struct MHD_Connection *conn;
    int fd;  // the connection's socket, to notice a client that left while suspended
    Buf body;
    int done;        // finished: answered on the headers, or its answer (or the stream's end) is ready
    int failed;      // ended without its answer (client gone): a committed body ends with an error
    int in_engine;   // queued or running: the engine thread holds it
    int conn_gone;   // MHD ended the request (sent, or the client left)
    int suspended;   // its connection is suspended by us and not yet resumed
    int committed;   // answered 200 with the body through out (a stream; a job whose client half-closed)
    int probe;       // the client half-closed: the engine asks the HTTP side to commit
    int formatted;   // a committed non-stream job: its response is in out
    int status;      // the status sent (0: none yet)
    int error_status;  // the engine failed: error (its body) is the answer of a job not yet committed
    int images_due;    // queued, its images wait for the vision thread's tower (admitted only after)
    char *error;
    Buf out;         // committed: the body bytes so far
    Buf pend;        // stream: the chunks of the engine's last step, formatted outside the lock
    size_t out_sent;
    double t_arrive, t_first;
    int64_t counted;  // tokens counted in the metrics
    char what[128];   // "METHOD URL", for the access log
    Job *next;        // in the queue or the running list
};

struct Server {
    const ServeOptions *o;
    const Decoder *m;
    Tokenizer *tok;
    ApiLimits lim;
    struct MHD_Daemon *d;
    RolloutEngine *e;
    pthread_mutex_t mu;
    pthread_mutex_t tok_mu;  // the tokenizer (its word cache and match data) for one parse at a time
    pthread_mutex_t log_mu;  // the access log's lines, whole (a slow log stalls no engine step)
    pthread_cond_t cv;
    pthread_t main_thread;  // woken (SIGTERM) to stop the server when the engine fails
    FILE *log;              // --log: the access log, or NULL
    jmp_buf engine_jump;    // the engine thread's way back from a die() in a step
    char engine_error[512];  // die()'s message, kept by the engine thread as it jumps back
    char failure[512];      // the engine's error, once it failed (under the lock)
    Job *queue, *queue_tail, *running;
    Job *in_tower;  // the queued job whose images the vision thread has out of the queue
    int n_queued, n_jobs, draining;
    uint64_t seed_state;  // seeds of requests without one
    int64_t created_ids;
    // metrics
    int64_t by_status[N_STATUSES + 1];  // the last: any other status
    int64_t prompt_tokens, generation_tokens, steps;
    int64_t cached_tokens;  // prompt tokens whose keys and values came from the prefix cache
    int batch;  // sequences in the last step
    int64_t kv_promised;  // KV positions the running sequences may fill (of lim.kv_positions)
    Counts step_batch, step_rows;  // sequences a step; rows (prompt and decode) a step forwarded
    Histogram ttft, latency;
};

// Under the lock: j is answered with this status, counted in the metrics and kept for the access log.
static void answered(Job *j, int status) {
    int i = 0;
    while (i < N_STATUSES && statuses[i] != status) i++;
    j->srv->by_status[i]++;
    j->status = status;
}

static void job_free(Job *j) {
    api_job_free(&j->api);
    buf_free(&j->body);
    buf_free(&j->out);
    buf_free(&j->pend);
    free(j->error);
    free(j);
}

// Under the lock: the request is over for MHD, or the engine let go; the last of the two frees it.
static void job_release(Server *s, Job *j) {
    if (j->in_engine || !j->conn_gone) return;
    s->n_jobs--;
    job_free(j);
    pthread_cond_broadcast(&s->cv);
}

// ---------------------------------------------------------------------------------------------
// HTTP responses

static enum MHD_Result respond(Job *j, int status, const char *body, size_t n, const char *type) {
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(j->conn, (unsigned)status, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&j->srv->mu);
    answered(j, status);
    pthread_mutex_unlock(&j->srv->mu);
    return rc;
}

static enum MHD_Result respond_json(Job *j, int status, const char *body) {
    return respond(j, status, body, strlen(body), "application/json");
}

// An OpenAI error object; takes message (malloc'd).
static enum MHD_Result respond_error(Job *j, int status, const char *param, char *message) {
    ApiError err = {.status = status, .param = param, .message = message};
    char *body = api_error_body(&err);
    enum MHD_Result rc = respond_json(j, status, body);
    free(body);
    free(message);
    return rc;
}

// A committed body's reader: what is in out, else the connection waits (suspended) for more. A non-stream
// job's response is formatted here once the engine is done with it (its samples no longer change).
static ssize_t body_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Job *j = cls;
    Server *s = j->srv;
    (void)pos;
    pthread_mutex_lock(&s->mu);
    int format = j->done && !j->failed && !j->api.stream && !j->formatted;
    j->formatted |= format;
    pthread_mutex_unlock(&s->mu);
    if (format) {
        char *response = api_response(&j->api, s->tok, s->lim.model_name);
        pthread_mutex_lock(&s->mu);
        buf_append(&j->out, response, strlen(response));
        pthread_mutex_unlock(&s->mu);
        free(response);
    }
    pthread_mutex_lock(&s->mu);
    size_t n = j->out.len - j->out_sent;
    ssize_t rc = 0;
    if (n > 0) {
        n = n < max ? n : max;
        memcpy(buf, j->out.data + j->out_sent, n);
        j->out_sent += n;
        rc = (ssize_t)n;
    } else if (j->done) {
        rc = j->failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        j->suspended = 1;
        MHD_suspend_connection(j->conn);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

// 200 now, the body as it comes through out: an event stream, or (a client that half-closed) JSON.
static enum MHD_Result respond_committed(Job *j, const char *type) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, body_read, j, NULL);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(j->conn, 200, r);
    MHD_destroy_response(r);
    pthread_mutex_lock(&j->srv->mu);
    answered(j, 200);
    j->committed = 1;
    pthread_mutex_unlock(&j->srv->mu);
    return rc;
}

// Under the lock: the engine has news for j's suspended connection.
static void wake(Job *j) {
    if (!j->suspended) return;
    j->suspended = 0;
    MHD_resume_connection(j->conn);
}

// ---------------------------------------------------------------------------------------------
// endpoints

static void counts_add(Counts *c, int64_t v) {
    int b = 0;
    while (b < c->n && v > c->le[b]) b++;
    c->count[b]++;
}

static void counts_print(FILE *f, const char *name, const char *help, const Counts *c) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i < c->n; i++) {
        cum += c->count[i];
        fprintf(f, "%s_bucket{le=\"%d\"} %lld\n", name, c->le[i], (long long)cum);
    }
    cum += c->count[c->n];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %lld\n%s_count %lld\n", name, (long long)cum, name, (long long)cum);
}

static char *metrics_text(Server *s) {
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) die("open_memstream failed");
    pthread_mutex_lock(&s->mu);
    int running = 0;
    for (Job *j = s->running; j; j = j->next) running++;
    fputs(
        "# HELP grpo_requests_total HTTP requests answered, by status.\n"
        "# TYPE grpo_requests_total counter\n",
        f);
    for (int i = 0; i < N_STATUSES; i++)
        fprintf(f, "grpo_requests_total{status=\"%d\"} %lld\n", statuses[i], (long long)s->by_status[i]);
    fprintf(f, "grpo_requests_total{status=\"other\"} %lld\n", (long long)s->by_status[N_STATUSES]);
    fprintf(f,
            "# HELP grpo_prompt_tokens_total Prompt tokens of admitted requests.\n"
            "# TYPE grpo_prompt_tokens_total counter\ngrpo_prompt_tokens_total %lld\n"
            "# HELP grpo_prompt_cached_tokens_total Prompt tokens taken from the prefix cache, not prefilled.\n"
            "# TYPE grpo_prompt_cached_tokens_total counter\ngrpo_prompt_cached_tokens_total %lld\n"
            "# HELP grpo_generation_tokens_total Tokens generated.\n"
            "# TYPE grpo_generation_tokens_total counter\ngrpo_generation_tokens_total %lld\n"
            "# HELP grpo_queue_depth Requests waiting for KV slots.\n# TYPE grpo_queue_depth gauge\n"
            "grpo_queue_depth %d\n# HELP grpo_running_requests Requests being generated.\n"
            "# TYPE grpo_running_requests gauge\ngrpo_running_requests %d\n"
            "# HELP grpo_batch_size Sequences in the last engine step.\n# TYPE grpo_batch_size gauge\n"
            "grpo_batch_size %d\n# HELP grpo_kv_cache_usage_perc The KV cache budget's share the running "
            "sequences may fill (their prompts and max_tokens), 0 to 1.\n# TYPE grpo_kv_cache_usage_perc gauge\n"
            "grpo_kv_cache_usage_perc %.6f\n",
            (long long)s->prompt_tokens, (long long)s->cached_tokens, (long long)s->generation_tokens, s->n_queued,
            running, s->batch, (double)s->kv_promised / (double)s->lim.kv_positions);
    counts_print(f, "grpo_step_batch_size", "Sequences per engine step.", &s->step_batch);
    counts_print(f, "grpo_step_rows", "Rows an engine step forwarded: prompt rows (prefill) and decode rows.",
                 &s->step_rows);
    int64_t cum = 0;
    const struct {
        const char *name, *help;
        const Histogram *h;
    } hs[] = {{"grpo_time_to_first_token_seconds", "From a request's arrival to its first token.", &s->ttft},
              {"grpo_request_latency_seconds", "From a request's arrival to its last token.", &s->latency}};
    for (int k = 0; k < 2; k++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", hs[k].name, hs[k].help, hs[k].name);
        cum = 0;
        for (int i = 0; i <= N_BUCKETS; i++) {
            cum += hs[k].h->count[i];
            if (i < N_BUCKETS)
                fprintf(f, "%s_bucket{le=\"%g\"} %lld\n", hs[k].name, buckets[i], (long long)cum);
            else
                fprintf(f, "%s_bucket{le=\"+Inf\"} %lld\n", hs[k].name, (long long)cum);
        }
        fprintf(f, "%s_sum %.6f\n%s_count %lld\n", hs[k].name, hs[k].h->sum, hs[k].name,
                (long long)hs[k].h->n);
    }
    pthread_mutex_unlock(&s->mu);
    if (fclose(f) != 0) die("writing metrics failed");
    return out;
}

static char *body_too_big(const Server *s) {
    return xprintf("the body exceeds %zu bytes (--max-body-mb)", s->o->max_body);
}

// GET /v1/models (the list: one model), or /v1/models/{id} (that model, when it is this one).
static enum MHD_Result get_models(Job *j, const char *id) {
    Server *s = j->srv;
    if (id && strcmp(id, s->lim.model_name))
        return respond_error(j, 404, "model",
                             xprintf("the model \"%.100s\" does not exist (this server has \"%s\")", id,
                                     s->lim.model_name));
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f) die("open_memstream failed");
    fputs(id ? "{\"id\": " : "{\"object\": \"list\", \"data\": [{\"id\": ", f);
    json_write_string(f, s->lim.model_name, strlen(s->lim.model_name));
    fprintf(f, ", \"object\": \"model\", \"created\": %lld, \"owned_by\": \"grpo\", \"max_model_len\": %lld}%s",
            (long long)time(NULL), (long long)s->o->max_len, id ? "" : "]}");
    if (fclose(f) != 0) die("writing the model list failed");
    enum MHD_Result rc = respond_json(j, 200, body);
    free(body);
    return rc;
}

// Constant-time comparison of the Authorization header with "Bearer KEY", the scheme in any case (RFC 7235).
static int authorized(Server *s, struct MHD_Connection *c) {
    if (!s->o->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    char *want = xprintf("bearer %s", s->o->api_key);
    size_t n = strlen(want), got = h ? strlen(h) : 0, scheme = strlen("bearer ");
    unsigned diff = got != n;
    for (size_t i = 0; i < n; i++) {
        unsigned char x = (unsigned char)(i < got ? h[i] : 0);
        diff |= (unsigned char)want[i] ^ (i < scheme ? (unsigned char)tolower(x) : x);
    }
    free(want);
    return diff == 0;
}

enum { PEER_OPEN, PEER_HALF_CLOSED, PEER_GONE };

// A client's socket: open, half-closed (its FIN is in: done sending, maybe still reading), or gone (a reset
// or an error).
static int peer_state(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    if (fd < 0 || poll(&p, 1, 0) <= 0) return PEER_OPEN;
    if (p.revents & (POLLHUP | POLLERR)) return PEER_GONE;
    return p.revents & POLLRDHUP ? PEER_HALF_CLOSED : PEER_OPEN;
}

static enum MHD_Result post_generate(Job *j, int chat) {
    Server *s = j->srv;
    ApiError err;
    pthread_mutex_lock(&s->tok_mu);
    int rc = api_parse(&j->api, chat, j->body.data ? j->body.data : "", j->body.len, s->tok, &s->lim,
                       s->m->cfg.vocab, &err);
    pthread_mutex_unlock(&s->tok_mu);
    if (rc != 0 || api_job_check_images(&j->api, &s->lim, &err) != 0)
        return respond_error(j, err.status, err.param, err.message);
    pthread_mutex_lock(&s->mu);
    if (s->draining) {
        pthread_mutex_unlock(&s->mu);
        return respond_error(j, 503, NULL, xprintf("the server is shutting down"));
    }
    if (s->n_queued >= s->o->max_queue) {
        pthread_mutex_unlock(&s->mu);
        char *why = xprintf("the queue is full (%d requests); retry later", s->o->max_queue);
        return respond_error(j, 429, NULL, why);
    }
    snprintf(j->api.id, sizeof j->api.id, "%s-%llx%08llx", chat ? "chatcmpl" : "cmpl",
             (long long)++s->created_ids,
             (unsigned long long)(hash_bytes(&s->seed_state, sizeof s->seed_state) & 0xffffffffu));
    j->api.created = (int64_t)time(NULL);
    if (!j->api.has_seed) {  // a fresh seed for a request that gives none
        s->seed_state = hash_bytes(&s->seed_state, sizeof s->seed_state) ^ (uint64_t)(time_now() * 1e9);
        j->api.cfg.seed = s->seed_state >> 1;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(j->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    j->fd = ci ? ci->connect_fd : -1;
    j->in_engine = 1;
    j->images_due = j->api.n_images > 0;
    // A client that half-closed with its request (nc, a proxy) is answered through a committed body: a
    // connection suspended now could not be resumed past its FIN (client_left).
    int half_closed = !j->api.stream && peer_state(j->fd) == PEER_HALF_CLOSED;
    if (half_closed) buf_append(&j->out, " ", 1);
    j->committed = half_closed;
    if (s->queue_tail)
        s->queue_tail->next = j;
    else
        s->queue = j;
    s->queue_tail = j;
    s->n_queued++;
    pthread_cond_broadcast(&s->cv);
    int stream = j->api.stream;
    if (!stream && !half_closed) {  // until the engine resumes it with the response
        j->suspended = 1;
        MHD_suspend_connection(j->conn);
    }
    pthread_mutex_unlock(&s->mu);
    if (stream || half_closed) return respond_committed(j, stream ? "text/event-stream" : "application/json");
    return MHD_YES;
}

#define MODEL_PATH "/v1/models/"

// The endpoints behind the API key (with --api-key-file).
static int needs_key(const char *url) {
    return !strcmp(url, "/v1/models") || !strncmp(url, MODEL_PATH, strlen(MODEL_PATH)) ||
           !strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions") || !strcmp(url, "/tokenize") ||
           !strcmp(url, "/detokenize");
}

// POST /tokenize or /detokenize (vLLM's): answered at once, no engine.
static enum MHD_Result post_tokens(Job *j, int encode) {
    Server *s = j->srv;
    ApiError err;
    const char *body = j->body.data ? j->body.data : "";
    pthread_mutex_lock(&s->tok_mu);
    char *out = encode ? api_tokenize(body, j->body.len, s->tok, &s->lim, s->m->cfg.vocab, &err)
                       : api_detokenize(body, j->body.len, s->tok, &s->lim, s->m->cfg.vocab, &err);
    pthread_mutex_unlock(&s->tok_mu);
    if (!out) return respond_error(j, err.status, err.param, err.message);
    enum MHD_Result rc = respond_json(j, 200, out);
    free(out);
    return rc;
}

static enum MHD_Result route(Job *j, const char *url, const char *method) {
    Server *s = j->srv;
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    int chat = !strcmp(url, "/v1/chat/completions");
    if (!strcmp(url, "/health")) {  // 503 while draining or after an engine failure: send no more
        if (!get) return respond_error(j, 405, NULL, xprintf("use GET"));
        pthread_mutex_lock(&s->mu);
        int draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        return respond(j, draining ? 503 : 200, "", 0, "text/plain");
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return respond_error(j, 405, NULL, xprintf("use GET"));
        char *text = metrics_text(s);
        enum MHD_Result rc = respond(j, 200, text, strlen(text), "text/plain; version=0.0.4");
        free(text);
        return rc;
    }
    if (!needs_key(url)) return respond_error(j, 404, NULL, xprintf("no such endpoint: %.200s", url));
    int one = !strncmp(url, MODEL_PATH, strlen(MODEL_PATH));
    if (one || !strcmp(url, "/v1/models"))
        return get ? get_models(j, one ? url + strlen(MODEL_PATH) : NULL)
                   : respond_error(j, 405, NULL, xprintf("use GET"));
    if (!post) return respond_error(j, 405, NULL, xprintf("use POST"));
    if (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) return post_tokens(j, !strcmp(url, "/tokenize"));
    return post_generate(j, chat);
}

// A body grows past --max-body-mb: MHD (0.9.75) cannot queue an answer while a body is coming, so the 413 is
// written to the socket here (its send buffer is empty: nothing else was sent) and the connection closed. A
// client still sending may meet the reset of that close before it reads the 413 (no lingering close).
static enum MHD_Result refuse_body(Job *j) {
    ApiError err = {.status = 413, .message = body_too_big(j->srv)};
    char *body = api_error_body(&err);
    char *msg = xprintf("HTTP/1.1 413 Content Too Large\r\nContent-Type: application/json\r\n"
                        "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                        strlen(body), body);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(j->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) (void)!send(ci->connect_fd, msg, strlen(msg), MSG_NOSIGNAL | MSG_DONTWAIT);
    pthread_mutex_lock(&j->srv->mu);
    answered(j, 413);
    j->done = 1;
    pthread_mutex_unlock(&j->srv->mu);
    free(msg);
    free(body);
    free(err.message);
    return MHD_NO;
}

// The headers are in: a job for the request, refused here when it lacks the key or announces a body too big
// (MHD then reads none of the body).
static enum MHD_Result on_headers(Server *s, struct MHD_Connection *c, const char *url, const char *method,
                                  void **con_cls) {
    Job *j = xcalloc(1, sizeof *j);
    j->srv = s;
    j->conn = c;
    j->fd = -1;
    j->t_arrive = time_now();
    snprintf(j->what, sizeof j->what, "%s %s", method, url);
    *con_cls = j;
    pthread_mutex_lock(&s->mu);
    s->n_jobs++;
    pthread_mutex_unlock(&s->mu);
    if (needs_key(url) && !authorized(s, c)) {
        j->done = 1;
        return respond_error(j, 401, NULL, xprintf("a valid API key is required"));
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > s->o->max_body) {
        j->done = 1;
        return respond_error(j, 413, NULL, body_too_big(s));
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    Server *s = cls;
    Job *j = *con_cls;
    (void)version;
    if (!j) return on_headers(s, c, url, method, con_cls);
    if (*upload_size) {
        if (j->body.len + *upload_size > s->o->max_body) return refuse_body(j);
        buf_append(&j->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    // Resumed by the engine (finished, or its client half-closed), or the body is in.
    pthread_mutex_lock(&s->mu);
    int taken = j->in_engine || j->done;
    int commit = j->probe && !j->committed && !j->done;
    int finished = j->done && !j->status && !j->failed;
    int failed = j->failed;
    char *error = j->error;
    j->error = NULL;
    if (commit) buf_append(&j->out, " ", 1);
    j->committed |= commit;  // with the decision: an engine failure from here on ends the body with an error
    pthread_mutex_unlock(&s->mu);
    if (!taken) return route(j, url, method);
    if (commit) return respond_committed(j, "application/json");
    if (!finished) return failed ? MHD_NO : MHD_YES;  // a cancelled job's connection closes unanswered
    char *body = error ? error : api_response(&j->api, s->tok, s->lim.model_name);
    enum MHD_Result rc = respond_json(j, error ? j->error_status : 200, body);
    free(body);
    return rc;
}

// --log: one line a request as it ends: time, client, "METHOD URL", status (0: none sent), seconds, tokens, and
// how it ended (ok, or MHD's reason: the client left, a timeout, an error).
static void access_log(Server *s, struct MHD_Connection *c, const Job *j, enum MHD_RequestTerminationCode why) {
    char addr[INET6_ADDRSTRLEN] = "-";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, addr, sizeof addr);
    if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, addr, sizeof addr);
    static const char *ends[] = {"ok", "error", "timeout", "shutdown", "read-error", "client-left"};
    const char *end = (unsigned)why < sizeof ends / sizeof ends[0] ? ends[why] : "error";
    char when[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    int64_t prompt = 0;  // set by the parse, before the engine saw the job
    for (int p = 0; p < j->api.n_prompts && j->api.rp; p++) prompt += j->api.rp[p].n;
    Buf line = {0};
    for (const unsigned char *p = (const unsigned char *)j->what; *p; p++) {  // the URL as sent: escaped
        char esc[8];
        int n = *p < 0x20 || *p >= 0x7f || *p == '"' ? snprintf(esc, sizeof esc, "\\x%02x", *p)
                                                     : snprintf(esc, sizeof esc, "%c", *p);
        buf_append(&line, esc, (size_t)n);
    }
    pthread_mutex_lock(&s->mu);  // the tokens counted after each step
    int64_t completion = j->counted;
    int status = j->status;
    if (j->failed) end = "cancelled";
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->log_mu);
    fprintf(s->log, "%s %s \"%.*s\" %d %.3fs prompt_tokens=%lld completion_tokens=%lld %s\n", when, addr,
            (int)line.len, line.data ? line.data : "", status, time_now() - j->t_arrive, (long long)prompt,
            (long long)completion, end);
    fflush(s->log);
    pthread_mutex_unlock(&s->log_mu);
    buf_free(&line);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    Server *s = cls;
    Job *j = *con_cls;
    if (!j) return;
    *con_cls = NULL;
    if (s->log) access_log(s, c, j, why);
    pthread_mutex_lock(&s->mu);
    j->conn_gone = 1;
    j->suspended = 0;
    job_release(s, j);
    pthread_mutex_unlock(&s->mu);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    (void)cls, (void)fmt, (void)ap;  // MHD's own notes (a client that left, a timeout) are not errors of ours
}

// ---------------------------------------------------------------------------------------------
// the engine thread

// Under the lock: has j's client gone? A reset or error on its socket, or MHD ended the request. A client
// that half-closed (a FIN) may still read: a job not yet committed is committed (the engine asks its HTTP
// thread), so that the next poll tells a gone client (its socket answers the bytes with a reset) from one
// that only finished sending. (MHD 0.9.75 may instead read the FIN as it resumes the connection and close
// it: the request is then cancelled, never answered as if complete.)
static int client_left(Job *j) {
    if (j->conn_gone) return 1;
    int peer = peer_state(j->fd);
    if (peer == PEER_HALF_CLOSED && !j->committed && !j->probe) {
        j->probe = 1;
        wake(j);
    }
    return peer == PEER_GONE;
}

// Under the lock: j leaves the engine, done: its answer can go out (a stream's last chunks are in pend), or,
// failed (its client left: nothing more is sent; a committed body ends with an error).
static void job_finish(Server *s, Job *j, int failed) {
    double now = time_now();
    int answered = !failed && !s->failure[0];  // not cancelled, nor answered with the engine's error
    if (answered) hist_add(&s->latency, now - j->t_arrive);
    if (answered && j->t_first == 0) hist_add(&s->ttft, now - j->t_arrive);
    if (!failed) buf_append(&j->out, j->pend.data, j->pend.len);
    j->failed = failed;
    j->done = 1;
    j->in_engine = 0;
    wake(j);
    job_release(s, j);
}

// Under the lock: the queue's last job found again after jobs left it.
static void queue_tail(Server *s) {
    s->queue_tail = NULL;
    for (Job *j = s->queue; j; j = j->next) s->queue_tail = j;
}

// Under the lock: jobs whose clients left while queued are dropped, wherever they are in the queue (they
// would count toward --max-queue), then queued jobs move into the engine while their samples fit its free
// slots (in order).
static void admit(Server *s) {
    for (Job **link = &s->queue; *link;) {
        Job *j = *link;
        if (client_left(j)) {
            *link = j->next;
            s->n_queued--;
            job_finish(s, j, 1);
        } else {
            link = &j->next;
        }
    }
    int admitted = 0;
    for (Job **link = &s->queue; *link;) {
        Job *j = *link;
        if (j->images_due) {  // the vision thread's first; the jobs after it may go ahead
            link = &j->next;
            continue;
        }
        if (j->api.n_prompts * j->api.n > rollout_engine_free_slots(s->e) ||
            api_job_kv_positions(&j->api) > rollout_engine_kv_room(s->e))
            break;
        *link = j->next;
        s->n_queued--;
        admitted = 1;
        ApiJob *a = &j->api;
        for (int p = 0; p < a->n_prompts; p++) {
            a->rr[p] = (RolloutRequest){.cfg = &a->cfg,
                                        .prompt = &a->rp[p],
                                        .index = p,
                                        .n = a->n,
                                        .out = &a->samples[p * a->n],
                                        .user = a,
                                        .want_logits = a->logprobs >= 0,
                                        .want_prompt_logits = a->echo && a->logprobs >= 0};
            if (a->logprobs >= 0) a->rr[p].logits_fn = api_logits;
            if (rollout_engine_add(s->e, &a->rr[p]) != 0)
                die("internal: a checked request does not fit the engine");
            s->prompt_tokens += a->rp[p].n;
        }
        j->next = s->running;
        s->running = j;
    }
    queue_tail(s);
    if (admitted) pthread_cond_broadcast(&s->cv);  // the vision thread's window moved
}

static int job_running(const Job *j) {
    int running = 0;
    for (int p = 0; p < j->api.n_prompts; p++) running += j->api.rr[p].running;
    return running;
}

// After a step, outside the lock (the running list and the jobs' samples are the engine thread's): each
// stream's chunks of the step, its last ones when it has finished, into its pend.
static void format_streams(Server *s) {
    for (Job *j = s->running; j; j = j->next) {
        j->pend.len = 0;
        if (j->api.stream) api_stream(&j->api, s->tok, s->lim.model_name, !job_running(j), &j->pend);
    }
}

// Under the lock, after a step: the tokens counted, stream chunks published, finished jobs, clients that
// left (their requests cancelled).
static void publish(Server *s) {
    for (Job **at = &s->running; *at;) {
        Job *j = *at;
        ApiJob *a = &j->api;
        int64_t made = 0;
        for (int i = 0; i < a->n_prompts * a->n; i++) made += a->samples[i].n;
        s->generation_tokens += made - j->counted;
        j->counted = made;
        if (made && j->t_first == 0) {
            j->t_first = time_now();
            hist_add(&s->ttft, j->t_first - j->t_arrive);
        }
        int running = job_running(j);
        int left = client_left(j);
        if (left && running)
            for (int p = 0; p < a->n_prompts; p++) rollout_engine_cancel(s->e, &a->rr[p]);
        if (running && !left) {
            buf_append(&j->out, j->pend.data, j->pend.len);
            if (j->pend.len) wake(j);
            at = &j->next;
            continue;
        }
        *at = j->next;
        job_finish(s, j, left);
    }
}

// Under the lock: j, out of the queue or the running list, is answered with the engine's failure: 503 if it was
// queued, 500 if it ran (a stream: an error event; a committed JSON body ends with an error).
static void fail_job(Server *s, Job *j, int queued) {
    ApiError err = {.status = queued ? 503 : 500,
                    .message = xprintf(queued ? "the server is stopping: its engine failed: %s"
                                              : "the engine failed: %s",
                                       s->failure)};
    char *body = api_error_body(&err);
    j->pend.len = 0;
    if (j->api.stream) {
        buf_append(&j->out, "data: ", 6);
        buf_append(&j->out, body, strlen(body));
        buf_append(&j->out, "\n\n", 2);
        free(body);
    } else {
        j->error_status = err.status;
        j->error = body;
    }
    free(err.message);
    job_finish(s, j, j->committed && !j->api.stream);
}

// The engine failed (a die() on its thread, caught: its error line is out): under the lock, every job is
// answered with the error — a queued one 503, a running one 500 (a stream: an error event; a committed JSON
// body ends with an error) — and the main thread is woken to stop the server.
static void engine_failed(Server *s) {
    while (s->running || s->queue) {
        Job *j = s->running ? s->running : s->queue;
        int queued = !s->running;
        if (queued) {
            s->queue = j->next;
            s->n_queued--;
        } else {
            s->running = j->next;
        }
        fail_job(s, j, queued);
    }
    s->queue_tail = NULL;
    s->draining = 1;
    pthread_kill(s->main_thread, SIGTERM);
}

// die() on the engine thread during a step: back to engine_main, unless inside a parallel region (there
// die() exits, as on any other thread).
static void engine_die(void *user, const char *msg) {
    Server *s = user;
    if (omp_in_parallel()) return;
    snprintf(s->engine_error, sizeof s->engine_error, "%s", msg);  // die()'s frame goes with the jump
    longjmp(s->engine_jump, 1);
}

static void *engine_main(void *arg) {
    Server *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        admit(s);
        if (!s->running) {
            if (s->draining && !s->queue && !s->in_tower) break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        if (setjmp(s->engine_jump)) {
            pthread_mutex_lock(&s->mu);
            memcpy(s->failure, s->engine_error, sizeof s->failure);
            engine_failed(s);
            break;
        }
        int before = rollout_engine_free_slots(s->e);
        die_catch_on_thread(engine_die, s);
        rollout_engine_step(s->e);
        die_catch_on_thread(NULL, NULL);
        format_streams(s);
        pthread_mutex_lock(&s->mu);
        s->batch = s->o->max_batch - before;
        counts_add(&s->step_batch, s->batch);
        counts_add(&s->step_rows, rollout_engine_stats(s->e)->step_rows);
        s->cached_tokens = rollout_engine_stats(s->e)->cached_tokens;
        s->kv_promised = s->lim.kv_positions - rollout_engine_kv_room(s->e);
        s->steps++;
        publish(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// the vision thread (a vision-language model's)

// Under the lock: the first queued job whose images are due, among the first --max-batch (the jobs about to be
// admitted: the features wait for few of them), or NULL; *any: some job has images due.
static Job *images_next(Server *s, Job ***at, int *any) {
    int k = 0;
    *any = 0;
    for (Job **link = &s->queue; *link; link = &(*link)->next, k++) {
        if (!(*link)->images_due) continue;
        *any = 1;
        if (k >= s->o->max_batch) return NULL;
        *at = link;
        return *link;
    }
    return NULL;
}

// The queued jobs' images through the tower, one job at a time and outside the lock (the HTTP threads and the
// engine's steps go on); the job leaves the queue while its tower runs and comes back at its head.
static void *vision_main(void *arg) {
    Server *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        Job **at = NULL;
        int any;
        Job *j = images_next(s, &at, &any);
        if (!j) {
            if (s->draining && !any) break;
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        *at = j->next;  // still counted in n_queued
        queue_tail(s);
        s->in_tower = j;
        pthread_mutex_unlock(&s->mu);
        api_job_images(&j->api, &s->lim);
        pthread_mutex_lock(&s->mu);
        s->in_tower = NULL;
        j->images_due = 0;
        if (s->failure[0]) {  // the engine failed meanwhile: answered as the queued jobs were
            s->n_queued--;
            fail_job(s, j, 1);
        } else {
            j->next = s->queue;
            s->queue = j;
            queue_tail(s);
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// start, serve, drain

// Many idle clients each hold a socket: the soft limit on open files goes up to the hard one.
static void raise_file_limit(void) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        r.rlim_cur = r.rlim_max;
        setrlimit(RLIMIT_NOFILE, &r);
    }
}

static struct MHD_Daemon *start_daemon(Server *s) {
    const ServeOptions *o = s->o;
    struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o->port)};
    struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)o->port)};
    const struct sockaddr *addr = (const struct sockaddr *)&v4;
    unsigned flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (strchr(o->host, ':')) {
        if (inet_pton(AF_INET6, o->host, &v6.sin6_addr) != 1)
            die("option --host: \"%s\" is not an IP address", o->host);
        addr = (const struct sockaddr *)&v6;
        flags |= MHD_USE_IPv6;
        if (IN6_IS_ADDR_UNSPECIFIED(&v6.sin6_addr)) flags |= MHD_USE_DUAL_STACK;  // "::": IPv4 clients too
    } else if (inet_pton(AF_INET, o->host, &v4.sin_addr) != 1) {
        die("option --host: \"%s\" is not an IPv4 or IPv6 address", o->host);
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, addr,
        MHD_OPTION_CONNECTION_TIMEOUT, o->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, o->max_header,
        MHD_OPTION_CONNECTION_LIMIT, o->max_connections, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_EXTERNAL_LOGGER, on_log, s, MHD_OPTION_THREAD_POOL_SIZE, o->http_threads, MHD_OPTION_END);
    if (!d) die("cannot listen on %s port %d (in use, or not an address of this machine?)", o->host, o->port);
    return d;
}

// The KV positions the running sequences may fill: --kv-cache-mb's, else every slot whole (on the CPU, where
// memory is committed as sequences grow, at most half of what is available now); at least one --max-len sequence.
static int64_t kv_budget(const Decoder *m, const ServeOptions *o) {
    size_t per_token = decoder_kv_bytes_per_token(&m->cfg);
    int64_t slots = (int64_t)o->max_batch * o->max_len, n = slots;
    int64_t avail = mem_available(), half = avail > 0 ? avail / 2 / (int64_t)per_token : -1;
    if (o->kv_cache_mb > 0) n = (o->kv_cache_mb << 20) / (int64_t)per_token;
    else if (!m->be->on_device && half >= 0 && half < n) n = half;
    if (n < o->max_len)
        die("the KV cache holds %lld positions (%.2f GiB%s), less than one --max-len %lld sequence: lower "
            "--max-len or raise --kv-cache-mb", (long long)n, (double)n * (double)per_token / (1 << 30),
            o->kv_cache_mb > 0 ? "" : ", half the memory available", (long long)o->max_len);
    return n < slots ? n : slots;
}

int serve_run(const Decoder *m, Tokenizer *tok, const int32_t *stop_ids, int n_stop_ids,
              const ServeOptions *o) {
    Server s = {.o = o, .m = m, .tok = tok};
    s.step_batch = (Counts){.le = batch_buckets, .n = (int)(sizeof batch_buckets / sizeof *batch_buckets)};
    s.step_rows = (Counts){.le = row_buckets, .n = (int)(sizeof row_buckets / sizeof *row_buckets)};
    s.lim = (ApiLimits){.model_name = o->model_name,
                        .max_len = o->max_len,
                        .max_n = o->max_n,
                        .max_batch = o->max_batch,
                        .stop_ids = (int32_t *)stop_ids,
                        .n_stop_ids = n_stop_ids,
                        .reasoning = o->reasoning,
                        .model = m,
                        .vl = o->vl};
    s.seed_state = (uint64_t)(time_now() * 1e9) ^ (uint64_t)getpid();
    int64_t prefill = o->prefill_tokens > o->max_len ? o->prefill_tokens : o->max_len;
    s.lim.kv_positions = kv_budget(m, o);  // before the engine's reservation: a bad budget is told first
    s.e = rollout_engine_new(m, tok, o->max_batch, o->max_len, prefill, NULL);
    rollout_engine_kv_budget(s.e, s.lim.kv_positions);
    rollout_engine_prefix_cache(s.e, o->prefix_cache);
    int64_t chunk = rollout_engine_prefill_chunk(s.e, o->prefill_chunk);
    if (pthread_mutex_init(&s.mu, NULL) != 0 || pthread_mutex_init(&s.tok_mu, NULL) != 0 ||
        pthread_mutex_init(&s.log_mu, NULL) != 0 || pthread_cond_init(&s.cv, NULL) != 0)
        die("cannot create a mutex");
    s.main_thread = pthread_self();
    if (o->log) {
        s.log = strcmp(o->log, "-") ? fopen(o->log, "a") : stderr;
        if (!s.log) die("option --log: cannot open %s: %s", o->log, strerror(errno));
    }
    // SIGINT and SIGTERM go to this thread's sigwait only: the threads started below inherit the mask.
    sigset_t sig;
    sigemptyset(&sig);
    sigaddset(&sig, SIGINT);
    sigaddset(&sig, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &sig, NULL) != 0) die("cannot block signals");
    signal(SIGPIPE, SIG_IGN);
    raise_file_limit();
    pthread_t engine, vision;
    if (pthread_create(&engine, NULL, engine_main, &s) != 0) die("cannot start the engine thread");
    if (o->vl && pthread_create(&vision, NULL, vision_main, &s) != 0) die("cannot start the vision thread");
    s.d = start_daemon(&s);
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(s.d, MHD_DAEMON_INFO_BIND_PORT);
    fprintf(stderr, "grpo serve: %s on http://%s:%u (--max-batch %d, --max-len %lld, --prefill-chunk %lld, prefix "
            "cache %s; KV cache: %lld positions, %.2f GiB of %s, %s)\n", o->model_name, o->host,
            info ? info->port : (unsigned)o->port, o->max_batch, (long long)o->max_len, (long long)chunk,
            o->prefix_cache ? "on" : "off", (long long)s.lim.kv_positions,
            (double)s.lim.kv_positions * (double)decoder_kv_bytes_per_token(&m->cfg) / (1 << 30),
            m->cfg.kv_dtype == DTYPE_BF16 ? "bf16" : "fp32",
            m->be->on_device ? "held from the start" : "committed as sequences grow");
    fflush(stderr);
    int got;
    sigwait(&sig, &got);
    pthread_mutex_lock(&s.mu);
    int failed = s.failure[0] != 0;  // the engine's SIGTERM
    pthread_mutex_unlock(&s.mu);
    if (failed)
        fprintf(stderr, "grpo serve: the engine failed: answering the accepted requests with the error, stopping\n");
    else
        fprintf(stderr, "grpo serve: %s: finishing the accepted requests, accepting no more\n",
                got == SIGINT ? "SIGINT" : "SIGTERM");
    // ours to close, but only after MHD_stop_daemon: its threads may still be using it
    MHD_socket listen = MHD_quiesce_daemon(s.d);
    pthread_mutex_lock(&s.mu);
    s.draining = 1;
    pthread_cond_broadcast(&s.cv);
    pthread_mutex_unlock(&s.mu);
    if (pthread_join(engine, NULL) != 0) die("cannot join the engine thread");
    pthread_mutex_lock(&s.mu);
    pthread_cond_broadcast(&s.cv);  // the vision thread: nothing is left for it
    pthread_mutex_unlock(&s.mu);
    if (o->vl && pthread_join(vision, NULL) != 0) die("cannot join the vision thread");
    failed = s.failure[0] != 0;  // also when it failed while finishing
    // Responses still being sent get a few seconds; then every connection closes.
    double t0 = time_now();
    pthread_mutex_lock(&s.mu);
    while (s.n_jobs > 0 && time_now() - t0 < 10) {
        pthread_mutex_unlock(&s.mu);
        usleep(10000);
        pthread_mutex_lock(&s.mu);
    }
    pthread_mutex_unlock(&s.mu);
    MHD_stop_daemon(s.d);
    if (listen != MHD_INVALID_SOCKET) close(listen);
    if (s.log && s.log != stderr && fclose(s.log) != 0) die("option --log: writing %s failed", o->log);
    if (failed) {  // the engine stopped inside a step: its state is not freed (exit status 1, as die's)
        fprintf(stderr, "grpo serve: stopped after an engine failure\n");
        fflush(stderr);
        _exit(1);
    }
    rollout_engine_free(s.e);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.tok_mu);
    pthread_mutex_destroy(&s.log_mu);
    pthread_mutex_destroy(&s.mu);
    fprintf(stderr, "grpo serve: stopped\n");
    return 0;
}
