// The `program` reward's external scoring program: its process, its protocol, timeouts and restarts.
// reward.c's RewardSet starts one per program spec (reward.c itself holds only the rule rewards);
// tests read the counters.
//
// The program is started once with /bin/sh -c in its own process group and speaks JSONL: one request line
// {"prompt": ..., "response": ..., "answer": ...} on its stdin, one reply line {"reward": x} on its
// stdout (blank lines are skipped, other keys ignored; stderr is inherited). A crash, a timeout, a
// reply that is not a JSON object with a finite number "reward", or a reply line over 1 MiB scores
// 0, is counted, and the program is killed (its whole process group) and started afresh on the next
// call; training goes on. Its stdin is one end of a socketpair written with send(MSG_NOSIGNAL), so a
// dead reader gives EPIPE instead of a SIGPIPE that would kill us, without touching the process-wide
// signal disposition. Invalid UTF-8 in the strings is sent as U+FFFD so every request is valid JSON.
// Exactly one stdout line per request: anything else printed there (logging belongs on stderr) is
// read as a reply and shows up as failures. Its process group is separate, so a Ctrl-C reaches only
// us; the program then sees EOF on stdin.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct RewardProgram {
    char *command;
    double timeout_s, grace_s;
    double memory_mb;     // RLIMIT_DATA of the program (0: none)
    pid_t pid;            // 0 when not running
    int fd_request;       // our end of the child's stdin (socket)
    int fd_reply;         // read end of the child's stdout (pipe)
    char *pending;        // bytes read past the last reply line
    size_t n_pending, cap_pending;
    int64_t calls;        // requests scored
    int64_t failures;     // calls that scored 0 because of the program (timeouts included)
    int64_t timeouts;     // calls that ran past timeout_s
    int64_t restarts;     // starts after the first
    int64_t starts;
    char last_error[200]; // why the last failure happened ("" if none yet)
    pid_t known[64];      // our children before the program's first start (not its leftovers)
    int n_known;          // -1: too many to list (strays are then not killed)
} RewardProgram;

// Starts the program; a start that fails is reported by the first call, not here. This process becomes a
// child subreaper (prctl): whatever the program leaves running when it is killed or exits (a background
// job, a daemon, a child in a session of its own via setsid) is reparented to us and killed with it. The
// program itself gets SIGKILL when we die (PR_SET_PDEATHSIG), so an error exit of grpo leaves no scorer
// behind; only what it moved out of its process group can outlive such an exit.
void reward_program_init(RewardProgram *p, const char *command, double timeout_s, double grace_s,
                         double memory_mb);
// The program's reward, or 0 on any failure (*ok = 0; counters updated). ok may be NULL.
double reward_program_call(RewardProgram *p, const char *prompt, const char *response, const char *answer,
                           int *ok);
// Clean shutdown: closes the program's stdin, waits up to grace_s for it to exit, then SIGKILLs its
// process group (whatever is left: the program itself past the grace period, or processes it left
// behind) and reaps it.
void reward_program_free(RewardProgram *p);
