// An external JSONL program (the `program` reward's scorer, the tools of multi-turn rollout): its process,
// its protocol, timeouts and restarts. rl/reward.c starts one per program reward and rollout/tools.c a few
// per tool; tests read the counters.
//
// The program is started once with /bin/sh -c in its own process group and speaks JSONL: one request line
// on its stdin, one reply line on its stdout, a JSON object (blank lines are skipped; stderr is
// inherited). A crash, a timeout, a reply that is not a JSON object (or one its caller rejects), or a reply
// line over 1 MiB fails the call, is counted, and the program is killed (its whole process group) and
// started afresh on the next call; the run goes on. Its stdin is one end of a socketpair written with
// send(MSG_NOSIGNAL), so a dead reader gives EPIPE instead of a SIGPIPE that would kill us, without
// touching the process-wide signal disposition. Exactly one stdout line per request: anything else
// printed there (logging belongs on stderr) is read as a reply and shows up as failures. Its process
// group is separate, so a Ctrl-C reaches only us; the program then sees EOF on stdin.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

typedef struct Program {
    char *command;
    double timeout_s, grace_s;
    double memory_mb;     // RLIMIT_DATA of the program (0: none)
    pid_t pid;            // 0 when not running
    int fd_request;       // our end of the child's stdin (socket)
    int fd_reply;         // read end of the child's stdout (pipe)
    char *pending;        // bytes read past the last reply line
    size_t n_pending, cap_pending;
    int64_t calls;        // requests sent
    int64_t failures;     // calls that failed (timeouts included)
    int64_t timeouts;     // calls that ran past timeout_s
    int64_t restarts;     // starts after the first
    int64_t starts;
    char last_error[200]; // why the last failure happened ("" if none yet)
    char mark[64];        // "GRPO_PROGRAM=<our pid>.<this Program>": in the environment of the program
    char **envp;          // and so of whatever it starts; what carries it is killed with it
} Program;

// Starts the program; a start that fails is reported by the first call, not here. This process becomes a
// child subreaper (prctl): whatever the program leaves running when it is killed or exits (a background
// job, a daemon, a child in a session of its own via setsid) is reparented to us and killed with it: the
// processes that carry this Program's mark in their environment, so several programs (a reward, tools)
// never kill each other's. A leftover that clears its environment, or exits and stays a zombie, is left
// alone (the zombie is reaped when grpo exits). The
// program itself gets SIGKILL when we die (PR_SET_PDEATHSIG), so an error exit of grpo leaves no scorer
// behind; only what it moved out of its process group can outlive such an exit.
void program_init(Program *p, const char *command, double timeout_s, double grace_s, double memory_mb);
// Sends one request line (request[0..n), newline-terminated, valid JSON) and reads the reply: returns it
// parsed (a JSON object the caller cJSON_Deletes), or NULL on any failure (counted in failures, and in
// timeouts when it ran past timeout_s; last_error set; the program killed, restarted by the next call).
cJSON *program_call(Program *p, const char *request, size_t n);
// A reply program_call returned that the caller cannot use (a key missing): a failure like the others.
// fmt takes one %s, detail.
void program_reject(Program *p, const char *fmt, const char *detail);
// Clean shutdown: closes the program's stdin, waits up to grace_s for it to exit, then SIGKILLs its
// process group (whatever is left: the program itself past the grace period, or processes it left
// behind) and reaps it.
void program_free(Program *p);
