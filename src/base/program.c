// An external JSONL program (base/program.h: the reward program, the tools): fork + exec of /bin/sh -c in a
// process group of its own under an RLIMIT_DATA cap, this process a child subreaper so what the program
// leaves running (marked by its environment) is killed with it; one JSONL request and reply per call under
// one deadline. Programs may be called from several threads at once, each Program from one at a time.
#define _GNU_SOURCE  // pipe2, MSG_NOSIGNAL
#include "base/program.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/json.h"
#include "base/util.h"

static int is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static void program_fail(Program *p, const char *fmt, const char *detail) {
    snprintf(p->last_error, sizeof p->last_error, fmt, detail);
}

// This process's children, from /proc (a process reparented to us has no other record). At most max.
static int children_of_self(pid_t *out, int max) {
    DIR *d = opendir("/proc");
    if (!d) return 0;
    pid_t self = getpid();
    int n = 0;
    for (struct dirent *e; n < max && (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;  // gone meanwhile
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        const char *name_end = strrchr(buf, ')');  // the command name may hold spaces and parentheses
        char state;
        int ppid;
        if (name_end && sscanf(name_end + 1, " %c %d", &state, &ppid) == 2 && ppid == self)
            out[n++] = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return n;
}

// Whether child pid carries p's mark in its environment: the program and whatever it started (the
// environment is inherited), never another program's processes or children we had before.
static int marked_child(const Program *p, pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;  // gone meanwhile, or a zombie (its environment is no longer readable)
    char *entry = NULL;
    size_t cap = 0;
    int found = 0;
    while (!found && getdelim(&entry, &cap, '\0', f) > 0) found = strcmp(entry, p->mark) == 0;  // NUL-separated
    free(entry);
    fclose(f);
    return found;
}

// Kills and reaps what the program left behind: our marked children. Each killed one's own children are
// reparented to us in turn, so repeat until a scan finds none.
static void program_kill_strays(Program *p) {
    for (int round = 0; round < 1000; round++) {
        pid_t kids[256];
        int n = children_of_self(kids, 256), found = 0;
        for (int i = 0; i < n; i++) {
            if (!marked_child(p, kids[i])) continue;
            kill(kids[i], SIGKILL);
            while (waitpid(kids[i], NULL, 0) < 0 && errno == EINTR) {
            }
            found++;
        }
        if (!found) return;
    }
}

// Kills the program's process group and reaps it, then whatever it left behind.
static void program_kill(Program *p) {
    if (p->pid <= 0) return;
    if (p->fd_request >= 0) close(p->fd_request);
    if (p->fd_reply >= 0) close(p->fd_reply);
    p->fd_request = p->fd_reply = -1;
    kill(-p->pid, SIGKILL);  // the group: sh and whatever it started
    kill(p->pid, SIGKILL);   // in case it had not reached setpgid yet
    while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    p->pid = 0;
    p->n_pending = 0;
    program_kill_strays(p);
}

static int program_start(Program *p) {
    int sv[2], pfd[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        program_fail(p, "socketpair failed: %s", strerror(errno));
        return 0;
    }
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        program_fail(p, "pipe failed: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return 0;
    }
    rlim_t mem = (rlim_t)(p->memory_mb * 1048576.0);
    struct rlimit data = {mem, mem};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        // Only async-signal-safe calls between fork and exec (the parent may run OpenMP threads).
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);  // we died before the line above
        if (mem > 0 && setrlimit(RLIMIT_DATA, &data) != 0) _exit(126);  // plain system calls
        if (dup2(sv[1], 0) < 0 || dup2(pfd[1], 1) < 0) _exit(127);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &dfl, NULL);  // an ignored signal would stay ignored across exec
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execle("/bin/sh", "sh", "-c", p->command, (char *)NULL, p->envp);
        _exit(127);
    }
    close(sv[1]);
    close(pfd[1]);
    if (pid < 0) {
        program_fail(p, "fork failed: %s", strerror(errno));
        close(sv[0]);
        close(pfd[0]);
        return 0;
    }
    setpgid(pid, pid);  // also here, so a kill right after start reaches the group (EACCES after exec: fine)
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(pfd[0], F_SETFL, fcntl(pfd[0], F_GETFL) | O_NONBLOCK);
    p->pid = pid;
    p->fd_request = sv[0];
    p->fd_reply = pfd[0];
    p->n_pending = 0;
    if (p->starts++ > 0) p->restarts++;
    return 1;
}

void program_init(Program *p, const char *command, double timeout_s, double grace_s, double memory_mb) {
    memset(p, 0, sizeof *p);
    p->command = xstrdup(command);
    p->timeout_s = timeout_s;
    p->grace_s = grace_s;
    p->memory_mb = memory_mb;
    p->fd_request = p->fd_reply = -1;
    prctl(PR_SET_CHILD_SUBREAPER, 1);  // if refused (not Linux 3.4+), leftovers go to init as before
    // The mark: this process and this Program, unique while both live.
    snprintf(p->mark, sizeof p->mark, "GRPO_PROGRAM=%d.%p", (int)getpid(), (void *)p);
    int n = 0;
    while (environ[n]) n++;
    p->envp = xmalloc(((size_t)n + 2) * sizeof *p->envp);
    for (int i = 0, j = 0; i <= n; i++)  // environ without an inherited mark, then ours
        if (!environ[i] || strncmp(environ[i], "GRPO_PROGRAM=", 13) != 0) p->envp[j++] = environ[i];
    for (n = 0; p->envp[n];) n++;
    p->envp[n] = xstrdup(p->mark);  // not p->mark itself: the struct may be copied
    p->envp[n + 1] = NULL;
    program_start(p);
}

static int ms_left(double deadline) {
    double left = deadline - time_now();
    return left <= 0 ? 0 : (int)ceil(left * 1000);
}

// 1 sent, 0 failed (last_error set), -1 timed out.
static int program_send(Program *p, const char *data, size_t n, double deadline) {
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(p->fd_request, data + off, n - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int left = ms_left(deadline);
            if (left == 0) return -1;
            struct pollfd pf = {.fd = p->fd_request, .events = POLLOUT};
            if (poll(&pf, 1, left) < 0 && errno != EINTR) {
                program_fail(p, "poll failed: %s", strerror(errno));
                return 0;
            }
            continue;
        }
        program_fail(p, "writing the request failed: %s (the program exited?)", strerror(w < 0 ? errno : EPIPE));
        return 0;
    }
    return 1;
}

#define REPLY_MAX (1 << 20)

// Reads up to the next non-blank line into *line (NUL-terminated, inside p->pending). 1 got a line,
// 0 failed (last_error set), -1 timed out.
static int program_read_line(Program *p, double deadline, char **line, size_t *line_len) {
    size_t scanned = 0;
    for (;;) {
        char *nl = p->n_pending > scanned ? memchr(p->pending + scanned, '\n', p->n_pending - scanned) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - p->pending);
            int blank = 1;
            for (size_t i = 0; i < n && blank; i++) blank = is_ascii_space(p->pending[i]);
            if (blank) {  // skip it
                memmove(p->pending, nl + 1, p->n_pending - n - 1);
                p->n_pending -= n + 1;
                scanned = 0;
                continue;
            }
            *nl = '\0';
            *line = p->pending;
            *line_len = n;
            return 1;
        }
        scanned = p->n_pending;
        if (p->n_pending > REPLY_MAX) {
            program_fail(p, "reply line longer than %s", "1 MiB");
            return 0;
        }
        if (p->cap_pending - p->n_pending < 65536) {
            p->cap_pending = p->cap_pending * 2 + 65536;
            p->pending = xrealloc(p->pending, p->cap_pending);
        }
        ssize_t r = read(p->fd_reply, p->pending + p->n_pending, p->cap_pending - p->n_pending - 1);
        if (r > 0) {
            p->n_pending += (size_t)r;
            continue;
        }
        if (r == 0) {
            program_fail(p, "the program closed its stdout or exited%s", "");
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            program_fail(p, "reading the reply failed: %s", strerror(errno));
            return 0;
        }
        int left = ms_left(deadline);
        if (left == 0) return -1;
        // Waits in slices: a program that died while something it started holds its stdout gives no EOF,
        // so look whether it is still there (without reaping it) between slices.
        struct pollfd pf = {.fd = p->fd_reply, .events = POLLIN};
        int got = poll(&pf, 1, left < 100 ? left : 100);
        if (got < 0 && errno != EINTR) {
            program_fail(p, "poll failed: %s", strerror(errno));
            return 0;
        }
        siginfo_t info;
        memset(&info, 0, sizeof info);
        int exited = got == 0 && waitid(P_PID, (id_t)p->pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                     info.si_pid == p->pid;
        if (exited) {
            program_fail(p, "the program exited%s (something it started still holds its stdout)", "");
            return 0;
        }
    }
}

void program_reject(Program *p, const char *fmt, const char *detail) {
    program_fail(p, fmt, detail);
    p->failures++;
    program_kill(p);  // restarted by the next call
}

cJSON *program_call(Program *p, const char *request, size_t n) {
    p->calls++;
    double deadline = time_now() + p->timeout_s;
    if (p->pid <= 0 && !program_start(p)) {
        p->failures++;
        return NULL;
    }
    int rc = program_send(p, request, n, deadline);
    char *line = NULL;
    size_t line_len = 0;
    if (rc == 1) rc = program_read_line(p, deadline, &line, &line_len);
    if (rc == -1) {
        snprintf(p->last_error, sizeof p->last_error, "no reply within %g s", p->timeout_s);
        p->timeouts++;
    }
    if (rc != 1) {
        p->failures++;
        program_kill(p);  // restarted by the next call
        return NULL;
    }
    cJSON *reply = json_parse_exact(line, line_len, NULL);
    if (!cJSON_IsObject(reply)) {
        char shown[64];
        snprintf(shown, sizeof shown, "%.40s%s", line, line_len > 40 ? "..." : "");
        cJSON_Delete(reply);
        program_reject(p, "reply is not a JSON object: %s", shown);
        return NULL;
    }
    size_t used = line_len + 1;  // consume the line
    memmove(p->pending, p->pending + used, p->n_pending - used);
    p->n_pending -= used;
    return reply;
}

void program_free(Program *p) {
    if (p->pid > 0) {
        close(p->fd_request);  // EOF on its stdin: a well-behaved program exits
        p->fd_request = -1;
        // Wait without reaping (WNOWAIT): until it is reaped its pid cannot be reused, so the group
        // kill in program_kill can only reach its own leftovers (say, a background child of sh).
        double deadline = time_now() + p->grace_s;
        for (;;) {
            siginfo_t info;
            memset(&info, 0, sizeof info);
            if (waitid(P_PID, (id_t)p->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 && errno != EINTR) break;
            if (info.si_pid == p->pid || time_now() >= deadline) break;
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        program_kill(p);
    }
    free(p->pending);
    free(p->command);
    if (p->envp) {
        int n = 0;
        while (p->envp[n]) n++;
        free(p->envp[n - 1]);  // the mark, the last entry
        free(p->envp);
    }
    memset(p, 0, sizeof *p);
    p->fd_request = p->fd_reply = -1;
}
