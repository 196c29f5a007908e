// grpo doctor's check list (doctor_add, doctor_read, doctor_free) and its system checks: kernel settings,
// limits, CPU, threads, MPI, PCIe links and GPUs. Everything under /sys and /proc is read through
// doctor_read, so a fake root exercises every branch. cmd_doctor.c calls in here, never the reverse.
#define _GNU_SOURCE  // RLIMIT_MEMLOCK
#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/cpu.h"
#include "cli/doctor.h"
#include "nn/gemm.h"
#include "nn/skinny.h"

// ================================================================ the check list

char *doctor_gib(double bytes) { return xprintf("%.1f GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

void doctor_add(Doctor *d, const char *id, DoctorStatus st, char *observed, const char *recommended, const char *fix,
                cJSON *values) {
    d->checks = xrealloc(d->checks, (size_t)(d->n + 1) * sizeof *d->checks);
    d->checks[d->n++] = (DoctorCheck){xstrdup(id), st, observed, xstrdup(recommended), xstrdup(fix), values};
}

char *doctor_read(const Doctor *d, const char *path) {
    char *full = xprintf("%s%s", d->root, path);
    FILE *f = fopen(full, "rb");
    free(full);
    if (!f) return NULL;
    Buf b = {0};
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) buf_append(&b, chunk, n);
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        buf_free(&b);
        return NULL;
    }
    buf_append(&b, "", 1);  // an empty file still gives ""
    while (b.len > 1 && strchr(" \t\r\n", b.data[b.len - 2])) b.data[--b.len - 1] = 0;
    return b.data;
}

void doctor_free(Doctor *d) {
    for (int i = 0; i < d->n; i++) {
        DoctorCheck *k = &d->checks[i];
        free(k->id);
        free(k->observed);
        free(k->recommended);
        free(k->fix);
        cJSON_Delete(k->values);
    }
    free(d->checks);
    d->checks = NULL;
    d->n = 0;
}

// ================================================================ the system checks

#define MAX_CPUS 8192

// Parses a kernel CPU list ("0-3,8,10-11") into flags; the number of CPUs, or -1 when malformed.
static int cpulist_parse(const char *s, unsigned char *set) {
    int n = 0;
    memset(set, 0, MAX_CPUS);
    while (*s == ' ' || *s == '\t') s++;
    while (*s && *s != '\n') {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s || a < 0 || a >= MAX_CPUS) return -1;
        if (*end == '-') {
            s = end + 1;
            b = strtol(s, &end, 10);
            if (end == s || b < a || b >= MAX_CPUS) return -1;
        }
        for (long i = a; i <= b; i++) n += !set[i], set[i] = 1;
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end && *end != '\n') return -1;
    }
    return n;
}

void doctor_check_cpus(Doctor *d) {
    unsigned char *online = xmalloc(MAX_CPUS), *allowed = xmalloc(MAX_CPUS), *node = xmalloc(MAX_CPUS);
    char *on_text = doctor_read(d, "/sys/devices/system/cpu/online"), *status = doctor_read(d, "/proc/self/status");
    char *nodes_text = doctor_read(d, "/sys/devices/system/node/online");
    int n_online = on_text ? cpulist_parse(on_text, online) : -1;
    const char *al = status ? strstr(status, "Cpus_allowed_list:") : NULL;
    int n_allowed = al ? cpulist_parse(al + strlen("Cpus_allowed_list:"), allowed) : -1;
    if (n_allowed < 0) n_allowed = n_online, memcpy(allowed, online, MAX_CPUS);
    // Nodes that hold at least one CPU this process may run on: more than one means memory traffic
    // crosses the interconnect unless each rank is bound to a node.
    int n_nodes = nodes_text ? cpulist_parse(nodes_text, node) : -1, spanned = 0;
    if (n_nodes < 1) n_nodes = 1;
    for (int i = 0; nodes_text && n_nodes > 1 && i < MAX_CPUS; i++) {
        if (!node[i]) continue;
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", i);
        char *cl = doctor_read(d, path);
        unsigned char *cpus = xmalloc(MAX_CPUS);
        int hit = 0;
        if (cl && cpulist_parse(cl, cpus) >= 0)
            for (int c = 0; c < MAX_CPUS && !hit; c++) hit = cpus[c] && allowed[c];
        spanned += hit;
        free(cpus);
        free(cl);
    }
    if (n_nodes == 1) spanned = 1;
    d->cpus_allowed = n_allowed > 0 ? n_allowed : 1;
    d->numa_nodes = n_nodes;
    cJSON *v = cJSON_CreateObject();
    cJSON_AddNumberToObject(v, "cpus_online", n_online);
    cJSON_AddNumberToObject(v, "cpus_allowed", n_allowed);
    cJSON_AddNumberToObject(v, "numa_nodes", n_nodes);
    cJSON_AddNumberToObject(v, "nodes_spanned", spanned);
    if (n_online < 1)
        doctor_add(d, "cpus", DOCTOR_WARN, xprintf("cannot read %s/sys/devices/system/cpu/online", d->root),
                   "a readable sysfs", "mount sysfs (mount -t sysfs sysfs /sys)", v);
    else if (spanned > 1)
        doctor_add(d, "cpus", DOCTOR_WARN,
                   xprintf("%d CPUs online, %d allowed, spanning %d of %d NUMA nodes", n_online, n_allowed, spanned, n_nodes),
                   "each rank bound to one NUMA node",
                   "numactl --cpunodebind=0 --membind=0 grpo ... (MPI: mpirun --map-by numa --bind-to numa)", v);
    else
        doctor_add(d, "cpus", DOCTOR_PASS,
                   xprintf("%d CPUs online, %d allowed, %d NUMA node%s", n_online, n_allowed, n_nodes, n_nodes > 1 ? "s" : ""),
                   "each rank bound to one NUMA node", "", v);
    free(on_text);
    free(status);
    free(nodes_text);
    free(online);
    free(allowed);
    free(node);
}

void doctor_check_thp(Doctor *d) {
    char *t = doctor_read(d, "/sys/kernel/mm/transparent_hugepage/enabled");
    const char *fix = "echo never > /sys/kernel/mm/transparent_hugepage/enabled", *want = "never (or madvise)";
    char mode[32] = "";
    const char *lb = t ? strchr(t, '[') : NULL, *rb = lb ? strchr(lb, ']') : NULL;
    if (rb && rb - lb - 1 < (long)sizeof mode) memcpy(mode, lb + 1, (size_t)(rb - lb - 1)), mode[rb - lb - 1] = 0;
    cJSON *v = cJSON_CreateObject();
    if (mode[0]) cJSON_AddStringToObject(v, "mode", mode);
    else cJSON_AddNullToObject(v, "mode");
    if (!t) doctor_add(d, "thp", DOCTOR_PASS, xprintf("not available (kernel without THP)"), want, "", v);
    else if (!mode[0]) doctor_add(d, "thp", DOCTOR_WARN, xprintf("unreadable: \"%s\"", t), want, fix, v);
    else if (strcmp(mode, "always") == 0)  // khugepaged stalls and memory bloat on large pinned slabs
        doctor_add(d, "thp", DOCTOR_WARN, xprintf("%s", mode), want, fix, v);
    else doctor_add(d, "thp", DOCTOR_PASS, xprintf("%s", mode), want, "", v);
    free(t);
}

void doctor_check_numa_balancing(Doctor *d) {
    char *t = doctor_read(d, "/proc/sys/kernel/numa_balancing");
    const char *fix = "sysctl -w kernel.numa_balancing=0", *want = "0";
    char *end = NULL;
    long x = t ? strtol(t, &end, 10) : 0;
    cJSON *v = cJSON_CreateObject();
    if (t && end != t && !*end) cJSON_AddNumberToObject(v, "numa_balancing", (double)x);
    else cJSON_AddNullToObject(v, "numa_balancing");
    cJSON_AddNumberToObject(v, "numa_nodes", d->numa_nodes);
    if (!t) doctor_add(d, "numa_balancing", DOCTOR_PASS, xprintf("not available"), want, "", v);
    else if (end == t || *end) doctor_add(d, "numa_balancing", DOCTOR_WARN, xprintf("unreadable: \"%s\"", t), want, fix, v);
    else if (x != 0 && d->numa_nodes > 1)  // page migration scans fight the explicit per-node binding
        doctor_add(d, "numa_balancing", DOCTOR_WARN, xprintf("%ld with %d NUMA nodes", x, d->numa_nodes), want, fix, v);
    else doctor_add(d, "numa_balancing", DOCTOR_PASS, xprintf("%ld with %d NUMA node%s", x, d->numa_nodes,
                                                                 d->numa_nodes > 1 ? "s" : ""), want, "", v);
    free(t);
}

// One limit from the root's proc/self/limits text, else from getrlimit. -1 = unlimited.
static const char *limit_get(const Doctor *d, const char *text, const char *label, int res, double *soft, double *hard) {
    const char *p = text ? strstr(text, label) : NULL;
    if (d->root[0] && p) {
        char a[32], b[32];
        if (sscanf(p + strlen(label), "%31s %31s", a, b) != 2) die("%s/proc/self/limits: malformed \"%s\" line", d->root, label);
        char *ea, *eb;
        *soft = strcmp(a, "unlimited") == 0 ? -1 : strtod(a, &ea);
        *hard = strcmp(b, "unlimited") == 0 ? -1 : strtod(b, &eb);
        if ((*soft >= 0 && *ea) || (*hard >= 0 && *eb)) die("%s/proc/self/limits: malformed \"%s\" line", d->root, label);
        return "proc/self/limits";
    }
    struct rlimit rl;
    if (getrlimit(res, &rl) != 0) die("getrlimit failed");
    *soft = rl.rlim_cur == RLIM_INFINITY ? -1 : (double)rl.rlim_cur;
    *hard = rl.rlim_max == RLIM_INFINITY ? -1 : (double)rl.rlim_max;
    return "getrlimit";
}

static cJSON *limit_values(double soft, double hard, const char *source) {
    cJSON *v = cJSON_CreateObject();
    if (soft < 0) cJSON_AddNullToObject(v, "soft");
    else cJSON_AddNumberToObject(v, "soft", soft);
    if (hard < 0) cJSON_AddNullToObject(v, "hard");
    else cJSON_AddNumberToObject(v, "hard", hard);
    cJSON_AddStringToObject(v, "source", source);
    return v;
}

static char *limit_text(double x) { return x < 0 ? xprintf("unlimited") : xprintf("%.0f", x); }

void doctor_check_limits(Doctor *d) {
    char *text = d->root[0] ? doctor_read(d, "/proc/self/limits") : NULL;
    double soft, hard;
    const char *src = limit_get(d, text, "Max open files", RLIMIT_NOFILE, &soft, &hard);
    char *s = limit_text(soft), *h = limit_text(hard);
    // MPI opens sockets per peer and checkpoints open shards: 1024 runs out at scale, below it sooner.
    DoctorStatus st = soft < 0 || soft >= 1048576 ? DOCTOR_PASS : soft < 1024 ? DOCTOR_FAIL : DOCTOR_WARN;
    doctor_add(d, "nofile", st, xprintf("soft %s, hard %s", s, h), "1048576",
               st == DOCTOR_PASS ? "" : "ulimit -n 1048576 (hard limit: \"* - nofile 1048576\" in /etc/security/limits.conf)",
               limit_values(soft, hard, src));
    free(s), free(h);
    src = limit_get(d, text, "Max locked memory", RLIMIT_MEMLOCK, &soft, &hard);
    s = limit_text(soft), h = limit_text(hard);
    // RDMA transports pin their buffers; a small limit makes registration fail or fall back.
    st = soft < 0 ? DOCTOR_PASS : DOCTOR_WARN;
    doctor_add(d, "memlock", st, xprintf("soft %s, hard %s", s, h), "unlimited",
               st == DOCTOR_PASS ? "" : "ulimit -l unlimited (hard limit: \"* - memlock unlimited\" in /etc/security/limits.conf)",
               limit_values(soft, hard, src));
    free(s), free(h);
    free(text);
}

// Value of the first "key<tabs>: value" line of /proc/cpuinfo, or NULL.
static char *cpuinfo_field(const char *text, const char *key) {
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        size_t k = strlen(key);
        if (strncmp(p, key, k) != 0 || (p[k] != '\t' && p[k] != ' ' && p[k] != ':')) continue;
        const char *c = strchr(p, ':'), *e = strchr(p, '\n');
        if (!c || (e && c > e)) continue;
        c++;
        while (*c == ' ') c++;
        size_t n = e ? (size_t)(e - c) : strlen(c);
        char *r = xmalloc(n + 1);
        memcpy(r, c, n), r[n] = 0;
        return r;
    }
    return NULL;
}

static int has_word(const char *list, const char *w) {
    size_t n = strlen(w);
    for (const char *p = strstr(list, w); p; p = strstr(p + 1, w))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0)) return 1;
    return 0;
}

// The vector features worth showing, as /proc/cpuinfo names them: the floor's and each level's.
static const char *const shown_features[] = {"avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "avx512f",
                                             "avx512dq", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16",
                                             "amx_tile"};

// The CPU's flags (of --root's /proc/cpuinfo) against the features the build uses, and what this process
// runs: its instruction-set level (base/cpu.h, capped by GRPO_CPU_ISA) and what bf16 products run on.
void doctor_check_cpu_features(Doctor *d) {
    char *info = doctor_read(d, "/proc/cpuinfo");
    char *model = info ? cpuinfo_field(info, "model name") : NULL, *flags = info ? cpuinfo_field(info, "flags") : NULL;
    cJSON *v = cJSON_CreateObject(), *cpu = cJSON_AddArrayToObject(v, "cpu_features"),
          *built = cJSON_AddArrayToObject(v, "build_features");
    if (model) cJSON_AddStringToObject(v, "model", model);
    else cJSON_AddNullToObject(v, "model");
    for (size_t i = 0; flags && i < sizeof shown_features / sizeof shown_features[0]; i++)
        if (has_word(flags, shown_features[i])) cJSON_AddItemToArray(cpu, cJSON_CreateString(shown_features[i]));
    Buf missing = {0};
    char *words = xstrdup(cpu_build_features), *save = NULL;
    for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        cJSON_AddItemToArray(built, cJSON_CreateString(w));
        if (flags && !has_word(flags, w)) buf_append(&missing, " ", 1), buf_append(&missing, w, strlen(w));
    }
    free(words);
    const CpuLevel *lv = cpu_level();
    int native = gemm_bf16_native();
    cJSON_AddStringToObject(v, "isa_level", cpu_isa_name(lv->level));
    cJSON_AddStringToObject(v, "isa_machine", cpu_isa_name(lv->machine));
    if (lv->cap) cJSON_AddStringToObject(v, "isa_cap", lv->cap);
    else cJSON_AddNullToObject(v, "isa_cap");
    cJSON_AddStringToObject(v, "onednn_isa", gemm_onednn_isa());
    cJSON_AddStringToObject(v, "bf16_matmul", native ? "onednn" : "widened");
    const char *decode = skinny_kernel_name(skinny_level_kernel(DTYPE_BF16));  // before measuring
    cJSON_AddStringToObject(v, "bf16_decode", decode);
    char *runs = xprintf("kernels %s, oneDNN %s; bf16 %s, decode %s", cpu_isa_name(lv->level), gemm_onednn_isa(),
                         native ? "on oneDNN's bf16 matmul" : "widened to fp32 in cache-sized tiles",
                         strcmp(decode, "avx512_bf16") == 0 ? "AVX512-BF16 dot products"
                         : strcmp(decode, "avx512") == 0    ? "AVX-512 widening in registers"
                                                            : "AVX2 widening in registers");
    const char *m = model ? model : "unknown CPU";
    if (!flags)
        doctor_add(d, "cpu", DOCTOR_WARN, xprintf("%s; no flags line in %s/proc/cpuinfo; %s", m, d->root, runs),
                   "a CPU with the features the build uses", "", v);
    else if (missing.len)  // the binary refuses to start there (base/cpu.c)
        doctor_add(d, "cpu", DOCTOR_FAIL, xprintf("%s lacks%s, which the build uses", m, missing.data),
                   "the features the build uses (x86-64-v3: AVX2 + FMA)",
                   "a CPU with AVX2 and FMA, or a build for this one: scripts/build.sh build -DGRPO_NATIVE=ON", v);
    else if (lv->level < lv->machine)
        doctor_add(d, "cpu", DOCTOR_WARN, xprintf("%s; %s caps this CPU's %s; %s", m, lv->cap,
                                                  cpu_isa_name(lv->machine), runs),
                   "the CPU's best level", "unset GRPO_CPU_ISA ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA", v);
    else
        doctor_add(d, "cpu", DOCTOR_PASS, xprintf("%s; %s", m, runs), "the CPU's best level", "", v);
    free(runs);
    buf_free(&missing);
    free(model), free(flags), free(info);
}

// The decode kernels measured on this CPU at this level (nn/skinny.h's tuning file), one per dtype; none
// yet is no fault: the first decode in a dtype measures it.
void doctor_check_decode_kernels(Doctor *d) {
    cJSON *v = cJSON_CreateObject(), *plans = skinny_tuning_entries();
    char *path = skinny_tuning_path();
    if (path) cJSON_AddStringToObject(v, "tuning_file", path);
    else cJSON_AddNullToObject(v, "tuning_file");
    Buf seen = {0};
    for (const cJSON *e = plans->child; e; e = e->next) {
        char *one = xprintf("%s%s: %s", seen.len ? "; " : "", e->string, e->valuestring);
        buf_append(&seen, one, strlen(one));
        free(one);
    }
    char *observed = plans->child ? xprintf("measured on this CPU (%s): %s", path ? path : "not kept", seen.data)
                                  : xprintf("not measured on this CPU yet: the first decode in each dtype "
                                            "measures them (a few seconds) and keeps them in %s",
                                            path ? path : "no file (GRPO_TUNING_FILE is empty)");
    cJSON_AddItemToObject(v, "plans", plans);
    doctor_add(d, "decode_kernels", DOCTOR_PASS, observed, "the fastest kernel measured, per dtype", "", v);
    buf_free(&seen);
    free(path);
}

// Leading positive integer of an OpenMP-style thread count ("8" or "8,2"); 0 when unset, -1 when malformed.
static long env_threads(const char *name) {
    const char *s = getenv(name);
    if (!s) return 0;
    char *end;
    long x = strtol(s, &end, 10);
    return end == s || x < 1 || (*end && *end != ',') ? -1 : x;
}

void doctor_check_threads(Doctor *d, int ranks) {
    long omp = env_threads("OMP_NUM_THREADS");  // oneDNN's GEMMs run on the same OpenMP threads
    long per_rank = omp > 0 ? omp : d->cpus_allowed;  // OpenMP's default: every CPU of the affinity mask
    long total = per_rank * ranks;
    cJSON *v = cJSON_CreateObject();
    if (omp > 0) cJSON_AddNumberToObject(v, "omp_num_threads", (double)omp);
    else cJSON_AddNullToObject(v, "omp_num_threads");
    cJSON_AddNumberToObject(v, "ranks", ranks);
    cJSON_AddNumberToObject(v, "threads_per_rank", (double)per_rank);
    cJSON_AddNumberToObject(v, "cpus_allowed", d->cpus_allowed);
    const char *env = getenv("OMP_NUM_THREADS");
    char *obs = xprintf("OMP_NUM_THREADS=%s, %d rank%s x %ld threads on %d CPUs", env ? env : "(unset)", ranks,
                        ranks > 1 ? "s" : "", per_rank, d->cpus_allowed);
    char *fix = xprintf("export OMP_NUM_THREADS=%d", d->cpus_allowed / ranks > 0 ? d->cpus_allowed / ranks : 1);
    const char *want = "ranks x OMP_NUM_THREADS <= allowed CPUs";
    if (omp < 0)
        doctor_add(d, "threads", DOCTOR_FAIL, obs, "positive integers", "unset it or export a positive integer", v);
    else if (total > d->cpus_allowed)  // oversubscribed cores stall at every barrier
        doctor_add(d, "threads", DOCTOR_WARN, obs, want, fix, v);
    else doctor_add(d, "threads", DOCTOR_PASS, obs, want, "", v);
    free(fix);
}

void doctor_check_mpi(Doctor *d, int ranks) {
    const char *path_env = getenv("PATH");
    char *found = NULL, *version = NULL;
    for (const char *p = path_env ? path_env : ""; !found && *p;) {
        size_t n = strcspn(p, ":");
        char *dir = xmalloc(n + 1);
        memcpy(dir, p, n), dir[n] = 0;
        char *cand = path_join(n ? dir : ".", "mpirun");
        if (access(cand, X_OK) == 0) found = cand;
        else free(cand);
        free(dir);
        p += n + (p[n] == ':');
    }
    if (found && !strchr(found, '\'')) {
        char *cmd = xprintf("'%s' --version 2>/dev/null", found), line[256] = "";
        FILE *f = popen(cmd, "r");
        if (f && fgets(line, sizeof line, f)) line[strcspn(line, "\r\n")] = 0, version = xstrdup(line);
        while (f && fgets(line, sizeof line, f)) {}  // drain so the child does not die of SIGPIPE
        if (f) pclose(f);
        free(cmd);
    }
    cJSON *v = cJSON_CreateObject();
    if (found) cJSON_AddStringToObject(v, "path", found);
    else cJSON_AddNullToObject(v, "path");
    if (version) cJSON_AddStringToObject(v, "version", version);
    else cJSON_AddNullToObject(v, "version");
    cJSON_AddNumberToObject(v, "ranks", ranks);
    const char *want = ranks > 1 ? "mpirun on PATH" : "mpirun on PATH for more than one rank";
    if (found)
        doctor_add(d, "mpi", DOCTOR_PASS, xprintf("%s (%s)", found, version ? version : "version unknown"), want, "", v);
    else
        doctor_add(d, "mpi", ranks > 1 ? DOCTOR_WARN : DOCTOR_PASS, xprintf("none (no mpirun on PATH)"), want,
                   ranks > 1 ? "apt-get install openmpi-bin libopenmpi-dev" : "", v);
    free(found), free(version);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// One check per display (class 0x03) or processing accelerator (0x12) device: link as trained vs capable.
static void pcie_device(Doctor *d, const char *name) {
    char path[512], *f[7];
    static const char *const files[7] = {"class", "vendor", "device", "current_link_width", "max_link_width",
                                         "current_link_speed", "max_link_speed"};
    for (int i = 0; i < 7; i++) {
        snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/%s", name, files[i]);
        f[i] = doctor_read(d, path);
    }
    unsigned long cls = f[0] ? strtoul(f[0], NULL, 16) : 0;
    if ((cls >> 16) == 0x03 || (cls >> 16) == 0x12) {
        double cw = f[3] ? atof(f[3]) : 0, mw = f[4] ? atof(f[4]) : 0, cs = f[5] ? atof(f[5]) : 0, ms = f[6] ? atof(f[6]) : 0;
        cJSON *v = cJSON_CreateObject();
        cJSON_AddStringToObject(v, "class", f[0]);
        cJSON_AddStringToObject(v, "vendor", f[1] ? f[1] : "");
        cJSON_AddStringToObject(v, "device", f[2] ? f[2] : "");
        cJSON_AddNumberToObject(v, "current_width", cw);
        cJSON_AddNumberToObject(v, "max_width", mw);
        cJSON_AddNumberToObject(v, "current_speed_gts", cs);
        cJSON_AddNumberToObject(v, "max_speed_gts", ms);
        char *id = xprintf("pcie:%s", name);
        char *obs = xprintf("%s %s:%s x%g at %g GT/s of x%g at %g GT/s", name, f[1] ? f[1] : "?", f[2] ? f[2] : "?",
                               cw, cs, mw, ms);
        if (cw <= 0 || mw <= 0)
            doctor_add(d, id, DOCTOR_PASS, obs, "current = maximum", "", v);  // virtual functions report no link
        else if (cw < mw || cs < ms)  // e.g. a firmware mismatch leaving an x16 card at x8
            doctor_add(d, id, DOCTOR_WARN, obs, "current = maximum (idle GPUs may lower the speed; check under load)",
                       "reseat the card or fix slot/BIOS/firmware settings; compare LnkCap and LnkSta in lspci -vv", v);
        else doctor_add(d, id, DOCTOR_PASS, obs, "current = maximum", "", v);
        free(id);
    }
    for (int i = 0; i < 7; i++) free(f[i]);
}

void doctor_check_pcie(Doctor *d) {
    char *dir = xprintf("%s/sys/bus/pci/devices", d->root);
    DIR *dp = opendir(dir);
    char **names = NULL;
    size_t n = 0;
    for (struct dirent *e; dp && (e = readdir(dp));) {
        if (e->d_name[0] == '.') continue;
        names = xrealloc(names, (n + 1) * sizeof *names);
        names[n++] = xstrdup(e->d_name);
    }
    if (dp) closedir(dp);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    int before = d->n;
    for (size_t i = 0; i < n; i++) pcie_device(d, names[i]), free(names[i]);
    free(names);
    if (d->n == before) doctor_add(d, "pcie", DOCTOR_PASS, xprintf("no display or accelerator devices in %s", dir),
                                   "current = maximum", "", cJSON_CreateObject());
    free(dir);
}

// NVML through dlopen: no build or run dependency on the NVIDIA driver. Types as in nvml.h.
typedef struct {
    unsigned long long total, free, used;
} NvmlMemory;

void doctor_check_gpus(Doctor *d) {
    const char *lib = getenv("GRPO_DOCTOR_NVML") ? getenv("GRPO_DOCTOR_NVML") : "libnvidia-ml.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    cJSON *v = cJSON_CreateObject();
    if (!h) {
        cJSON_AddNumberToObject(v, "count", 0);
        doctor_add(d, "gpu", DOCTOR_PASS, xprintf("none (%s not found)", lib), "", "", v);
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(h, "nvmlShutdown");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(h, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*name)(void *, char *, unsigned) = (int (*)(void *, char *, unsigned))dlsym(h, "nvmlDeviceGetName");
    int (*mem)(void *, NvmlMemory *) = (int (*)(void *, NvmlMemory *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*temp)(void *, int, unsigned *) = (int (*)(void *, int, unsigned *))dlsym(h, "nvmlDeviceGetTemperature");
    int (*ecc)(void *, int, int, unsigned long long *) =
        (int (*)(void *, int, int, unsigned long long *))dlsym(h, "nvmlDeviceGetTotalEccErrors");
    unsigned n = 0;
    int rc = init && shutdown && count && handle && name && mem ? init() : -1;
    if (rc != 0 || count(&n) != 0) {  // a library without a working driver: the GPUs are unusable
        cJSON_AddNullToObject(v, "count");
        doctor_add(d, "gpu", DOCTOR_FAIL, xprintf("%s loaded but NVML does not start (code %d)", lib, rc),
                   "a working NVIDIA driver", "check nvidia-smi; reinstall the driver matching the kernel module", v);
        if (rc == 0) shutdown();
        dlclose(h);
        return;
    }
    cJSON_AddNumberToObject(v, "count", n);
    doctor_add(d, "gpu", DOCTOR_PASS, xprintf("%u NVIDIA GPU%s", n, n == 1 ? "" : "s"), "", "", v);
    for (unsigned i = 0; i < n; i++) {
        void *dev = NULL;
        char nm[96] = "?";
        NvmlMemory m = {0};
        unsigned t = 0;
        unsigned long long errs = 0;
        int ok = handle(i, &dev) == 0 && mem(dev, &m) == 0, has_t = ok && temp && temp(dev, 0, &t) == 0,
            has_ecc = ok && ecc && ecc(dev, 1 /* uncorrected */, 0 /* volatile: since boot */, &errs) == 0;
        if (ok) name(dev, nm, sizeof nm);
        nm[sizeof nm - 1] = 0;
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "name", nm);
        cJSON_AddNumberToObject(g, "memory_total_bytes", (double)m.total);
        cJSON_AddNumberToObject(g, "memory_used_bytes", (double)m.used);
        if (has_t) cJSON_AddNumberToObject(g, "temperature_c", t);
        else cJSON_AddNullToObject(g, "temperature_c");
        if (has_ecc) cJSON_AddNumberToObject(g, "ecc_uncorrected", (double)errs);
        else cJSON_AddNullToObject(g, "ecc_uncorrected");
        char *id = xprintf("gpu:%u", i), *tot = doctor_gib((double)m.total), *used = doctor_gib((double)m.used);
        char *obs = xprintf("%s, %s used of %s, %u C, %llu uncorrected ECC errors", nm, used, tot, t, errs);
        char *fix = xprintf("nvidia-smi -q -i %u", i);
        if (!ok) doctor_add(d, id, DOCTOR_FAIL, obs, "a device NVML can query", fix, g);
        else if (errs > 0 || (has_t && t >= 85))  // failing memory or a cooling problem
            doctor_add(d, id, DOCTOR_WARN, obs, "no uncorrected ECC errors, below 85 C", fix, g);
        else doctor_add(d, id, DOCTOR_PASS, obs, "no uncorrected ECC errors, below 85 C", "", g);
        free(id), free(tot), free(used), free(fix);
    }
    shutdown();
    dlclose(h);
}
