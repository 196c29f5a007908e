// grpo doctor: the production preflight checklist people otherwise run by hand (THP, NUMA balancing,
// ulimits, CPU features and affinity, threads, memory and disk for a config, MPI, PCIe link widths,
// GPUs), each check PASS / WARN / FAIL with the value seen, the value wanted and the fixing command.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "base/dtype.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/doctor.h"
#include "model/lora.h"
#include "model/decoder.h"
#include "train/grpo/grpo.h"

static const char *const status_names[] = {"PASS", "WARN", "FAIL"};

// Value of "Key:   123 kB" in /proc/meminfo, in bytes; -1 when absent.
static double meminfo_bytes(const char *text, const char *key) {
    const char *p = text ? strstr(text, key) : NULL;
    if (!p || p[strlen(key)] != ':') return -1;
    return strtod(p + strlen(key) + 1, NULL) * 1024.0;
}

typedef struct {
    int have;           // a config whose model could be sized
    const char *why;    // otherwise, why not (for the WARN)
    GrpoMemPlan plan;   // of one process (its peak times the ranks: this machine's)
    char *plan_text;    // grpo_plan_text of one process (malloc'd)
    size_t checkpoint;  // bytes of one checkpoint directory
    size_t result;      // bytes of the final model (or adapter)
    int64_t keep;
    const char *out_dir;
    const char *device;        // trainer.device when not the CPU: the plan is that device's memory
    const Backend *device_be;  // that device, open; NULL when it is not here (device_why says why)
    const Backend *sized_by;   // the backend that sized the plan (that device, or its stand-in): closed at the end
    char device_why[256];
} DoctorPlan;

// A config for a device: its plan against the device's free memory (grpo train makes the same check at its start).
static void check_device_memory(Doctor *d, const DoctorPlan *p) {
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "device", p->device);
    cJSON_AddNumberToObject(v, "needed_bytes", (double)p->plan.peak);
    cJSON_AddStringToObject(v, "plan_gib", p->plan_text);
    char *need = doctor_gib((double)p->plan.peak);
    const char *fix = "lower data.train_batch_size, rollout.n or the length limits, use LoRA, or set "
                      "actor.offload_optimizer=true";
    if (!p->device_be) {
        doctor_add(d, "device_memory", DOCTOR_WARN, xprintf("%s needed on %s [GiB: %s]; %s", need, p->device,
                   p->plan_text, p->device_why), "the device visible", "run grpo doctor where the GPU is", v);
        free(need);
        return;
    }
    size_t free_b = 0, total = 0;
    p->device_be->memory_info(p->device_be, &free_b, &total);
    cJSON_AddNumberToObject(v, "free_bytes", (double)free_b);
    cJSON_AddNumberToObject(v, "total_bytes", (double)total);
    char *f = doctor_gib((double)free_b), *t = doctor_gib((double)total);
    char *seen = xprintf("%s needed on %s [GiB: %s], %s free of %s", need, p->device, p->plan_text, f, t);
    if (p->plan.peak > free_b) doctor_add(d, "device_memory", DOCTOR_FAIL, seen, "needed <= free", fix, v);
    else if ((double)p->plan.peak > 0.9 * (double)free_b)  // the CUDA context and cuBLAS's workspaces take some
        doctor_add(d, "device_memory", DOCTOR_WARN, seen, "needed <= 90% of free", fix, v);
    else doctor_add(d, "device_memory", DOCTOR_PASS, seen, "needed <= 90% of free", "", v);
    free(need), free(f), free(t);
}

static void check_memory(Doctor *d, const DoctorPlan *p, int has_config) {
    char *text = doctor_read(d, "/proc/meminfo");
    double total = meminfo_bytes(text, "MemTotal"), avail = meminfo_bytes(text, "MemAvailable");
    free(text);
    cJSON *v = cJSON_CreateObject();
    cJSON_AddNumberToObject(v, "mem_total_bytes", total);
    cJSON_AddNumberToObject(v, "mem_available_bytes", avail);
    if (p->have) cJSON_AddNumberToObject(v, "needed_bytes", (double)p->plan.peak);
    else cJSON_AddNullToObject(v, "needed_bytes");
    if (p->have) cJSON_AddStringToObject(v, "plan_gib", p->plan_text);  // per process, as grpo train prints it
    char *a = doctor_gib(avail), *t = doctor_gib(total), *need = doctor_gib((double)p->plan.peak);
    if (p->have) {  // the plan's parts, so a user sees what to shrink
        char *with_plan = xprintf("%s [per process, GiB: %s]", need, p->plan_text);
        free(need);
        need = with_plan;
    }
    const char *fix = "lower data.train_batch_size, rollout.n or the length limits, or set actor.recompute=true";
    if (total < 0 || avail < 0)
        doctor_add(d, "memory", DOCTOR_WARN, xprintf("no MemTotal/MemAvailable in %s/proc/meminfo", d->root),
                   "a readable procfs", "mount procfs (mount -t proc proc /proc)", v);
    else if (has_config && !p->have)
        doctor_add(d, "memory", DOCTOR_WARN, xprintf("%s available of %s; cannot size the run: %s", a, t, p->why),
                   "needed <= available", "set model.path to a Hugging Face model directory", v);
    else if (!p->have)
        doctor_add(d, "memory", DOCTOR_PASS, xprintf("%s available of %s (no --config to size)", a, t),
                   "needed <= available", "", v);
    else if ((double)p->plan.peak > avail)
        doctor_add(d, "memory", DOCTOR_FAIL, xprintf("%s needed, %s available of %s", need, a, t), "needed <= available", fix, v);
    else if ((double)p->plan.peak > 0.8 * avail)  // page cache, MPI buffers and the allocator need the rest
        doctor_add(d, "memory", DOCTOR_WARN, xprintf("%s needed, %s available of %s", need, a, t),
                   "needed <= 80% of available", fix, v);
    else doctor_add(d, "memory", DOCTOR_PASS, xprintf("%s needed, %s available of %s", need, a, t),
                    "needed <= 80% of available", "", v);
    free(a), free(t), free(need);
}

// Free space where checkpoints will go: the nearest existing ancestor of `dir` (a new run's
// directory does not exist yet).
static void check_disk(Doctor *d, const DoctorPlan *p, const char *dir) {
    char *path = xstrdup(dir && dir[0] ? dir : ".");
    struct stat sb;
    while (stat(path, &sb) != 0) {
        char *slash = strrchr(path, '/');
        if (!slash) strcpy(path, ".");
        else if (slash == path) path[1] = 0;
        else *slash = 0;
    }
    struct statvfs fs;
    if (statvfs(path, &fs) != 0) die("cannot stat the file system of %s", path);
    double free_b = (double)fs.f_bavail * (double)fs.f_frsize, total_b = (double)fs.f_blocks * (double)fs.f_frsize;
    // keep + 1 checkpoints exist while a new one is written and before the oldest is pruned, plus the final model.
    double need = p->have ? (double)p->checkpoint * (double)(p->keep + 1) + (double)p->result : -1;
    cJSON *v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "path", path);
    cJSON_AddNumberToObject(v, "free_bytes", free_b);
    cJSON_AddNumberToObject(v, "total_bytes", total_b);
    if (p->have) {
        cJSON_AddNumberToObject(v, "checkpoint_bytes", (double)p->checkpoint);
        cJSON_AddNumberToObject(v, "keep", (double)p->keep);
        cJSON_AddNumberToObject(v, "needed_bytes", need);
    } else {
        cJSON_AddNullToObject(v, "needed_bytes");
    }
    char *f = doctor_gib(free_b), *n = doctor_gib(need), *fix = xprintf("free space under %s, or lower trainer.keep", path);
    if (!p->have)
        doctor_add(d, "disk", free_b < 1073741824.0 ? DOCTOR_WARN : DOCTOR_PASS, xprintf("%s free in %s", f, path),
                   "at least 1 GiB free (with --config: room for keep+1 checkpoints)", free_b < 1073741824.0 ? fix : "", v);
    else if (free_b < need)
        doctor_add(d, "disk", DOCTOR_FAIL, xprintf("%s free in %s, %s needed", f, path, n), "free >= needed", fix, v);
    else if (free_b < 2 * need)  // logs, samples and other runs grow too
        doctor_add(d, "disk", DOCTOR_WARN, xprintf("%s free in %s, %s needed", f, path, n), "free >= 2 x needed", fix, v);
    else doctor_add(d, "disk", DOCTOR_PASS, xprintf("%s free in %s, %s needed", f, path, n), "free >= 2 x needed", "", v);
    free(path), free(f), free(n), free(fix);
}

// trainer.device opened for its memory, or NULL with the reason in why when it is not on this machine.
static const Backend *doctor_open_device(const char *spec, char *why, size_t n) {
    if (strncmp(spec, "cuda", 4) != 0) return backend_open(spec, "trainer.device");
    char cuda_why[200];
    int ordinal = spec[4] == ':' ? atoi(spec + 5) : 0, count = backend_cuda_devices(cuda_why, sizeof cuda_why);
    if (count > ordinal) return backend_open(spec, "trainer.device");
    if (count < 0) snprintf(why, n, "CUDA cannot be used here: %s", cuda_why);
    else if (count == 0) snprintf(why, n, "no GPU is visible here (%s)", cuda_why);
    else snprintf(why, n, "GPU %d is not here (%d visible)", ordinal, count);
    return NULL;
}

// The backend whose op table sizes a device's plan when the device is not here: the emulated device runs the CUDA
// backend's table (without it, the CPU's sizes).
static const Backend *plan_stand_in(void) {
#ifdef GRPO_HAVE_EMU
    return backend_open("emu", "trainer.device");
#else
    return backend_cpu();
#endif
}

// Sizes the run of a `grpo train` config on this machine: peak memory of its `ranks` processes and
// the bytes of one checkpoint.
static void plan_config(DoctorPlan *p, const GrpoConfig *c, int ranks) {
    GrpoSettings s;
    grpo_settings_resolve(&s, c);
    p->keep = s.keep;
    p->out_dir = s.out_dir;
    if (!s.model_dir) {
        p->why = "model.path is not set";
        return;
    }
    char *cfg = path_join(s.model_dir, "config.json");
    int ok = file_exists(cfg);
    free(cfg);
    if (!ok) {
        p->why = "model.path has no config.json";
        return;
    }
    DecoderConfig mc;
    decoder_config_load_vl(&mc, s.model_dir);  // grpo train takes VL models: the plan counts their tower
    const Backend *be = backend_cpu();
    if (s.device && strcmp(s.device, "cpu") != 0) {
        p->device = s.device;
        be = p->device_be = doctor_open_device(s.device, p->device_why, sizeof p->device_why);
        // a GPU that is not here: the emulated device, whose table is the CUDA backend's, sizes the plan
        if (!be) be = plan_stand_in();
        p->sized_by = be;
    }
    grpo_memory_plan(&s, &mc, be, ranks, &p->plan);
    p->plan_text = grpo_plan_text(&p->plan);
    p->plan.peak *= (size_t)ranks;  // every rank of this machine holds its own plan
    // The model in save_dtype, Adam's two moments (whole, also under ZeRO), and fp32 master weights
    // when the model file is not f32; with LoRA the fp32 adapters and their two moments.
    size_t params = p->plan.policy / sizeof(float);
    p->checkpoint = params * dtype_size(s.save_dtype) + 2 * p->plan.policy + (s.save_dtype == DTYPE_F32 ? 0 : p->plan.policy);
    p->result = p->plan.policy;
    size_t tower = p->plan.vision / sizeof(float) * dtype_size(s.save_dtype);  // a VL model's, saved beside it
    p->checkpoint += tower;
    p->result += tower;
    if (grpo_has_lora(&s)) {
        p->result = lora_params(&mc, &s.lora.spec) * sizeof(float);
        p->checkpoint = 3 * p->result;
    }
    p->have = 1;
}

static void print_text(const Doctor *d) {
    int count[3] = {0};
    for (int i = 0; i < d->n; i++) {
        const DoctorCheck *c = &d->checks[i];
        count[c->status]++;
        printf("%s  %-16s %s", status_names[c->status], c->id, c->observed);
        if (c->recommended[0]) printf("  (want: %s)", c->recommended);
        printf("\n");
        if (c->fix[0]) printf("      fix: %s\n", c->fix);
    }
    printf("grpo doctor: %d PASS, %d WARN, %d FAIL\n", count[0], count[1], count[2]);
}

static void print_json(Doctor *d) {
    int count[3] = {0}, worst = 0;
    cJSON *root = cJSON_CreateObject(), *checks = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "root", d->root[0] ? d->root : "/");
    for (int i = 0; i < d->n; i++) {
        DoctorCheck *c = &d->checks[i];
        count[c->status]++;
        if ((int)c->status > worst) worst = (int)c->status;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "id", c->id);
        cJSON_AddStringToObject(o, "status", status_names[c->status]);
        cJSON_AddStringToObject(o, "observed", c->observed);
        cJSON_AddStringToObject(o, "recommended", c->recommended);
        cJSON_AddStringToObject(o, "fix", c->fix);
        cJSON_AddItemToObject(o, "values", c->values);
        c->values = NULL;  // now owned by the document
        cJSON_AddItemToArray(checks, o);
    }
    cJSON_AddStringToObject(root, "status", status_names[worst]);
    cJSON *counts = cJSON_AddObjectToObject(root, "counts");
    for (int s = 0; s < 3; s++) cJSON_AddNumberToObject(counts, status_names[s], count[s]);
    cJSON_AddItemToObject(root, "checks", checks);
    char *text = cJSON_Print(root);
    if (!text) die("out of memory printing JSON");
    printf("%s\n", text);
    free(text);
    cJSON_Delete(root);
}

int cmd_doctor(int argc, char **argv) {
    CliOpt opts[] = {
        {"--json", NULL, "print one JSON object with every check instead of text", NULL, 0},
        {"--config", "FILE", "a grpo train YAML config: check memory and checkpoint disk space for it", NULL, 0},
        {"--dir", "DIR", "checkpoint directory for the disk check (default: trainer.out_dir, else .)", NULL, 0},
        {"--ranks", "N", "MPI ranks planned on this machine (threads and MPI checks)", "1", 0},
        {"--root", "DIR", "read /sys and /proc under DIR (tests; default: $GRPO_DOCTOR_ROOT, else /)", NULL, 0},
    };
    CliSpec spec = {"grpo doctor [--json] [--config FILE.yaml [key=value ...]] [--dir DIR] [--ranks N] [--root DIR]",
                    "System preflight: every check PASS, WARN or FAIL with the value seen, the value wanted and the\n"
                    "command that fixes it. Exit status 1 when any check FAILs.",
                    opts, sizeof opts / sizeof opts[0], 256};
    cli_parse(&spec, argc, argv);
    int ranks = (int)cli_int(&spec, "--ranks", 1, 1 << 20);
    const char *root = cli_str(&spec, "--root") ? cli_str(&spec, "--root") : getenv("GRPO_DOCTOR_ROOT");
    if (!root) root = "";
    struct stat sb;
    if (root[0] && (stat(root, &sb) != 0 || !S_ISDIR(sb.st_mode))) die("--root %s is not a directory", root);
    if (spec.n_args && !cli_str(&spec, "--config")) die("argument \"%s\": overrides need --config", spec.args[0]);

    Doctor d = {.root = strcmp(root, "/") == 0 ? "" : root};
    DoctorPlan plan = {0};
    GrpoConfig c;
    const char *config = cli_str(&spec, "--config");
    if (config) {
        file_check_readable("option --config", config);
        grpo_config_defaults(&c);
        grpo_config_load(&c, config, spec.args, spec.n_args);
        plan_config(&plan, &c, ranks);
    }
    doctor_check_cpus(&d);
    doctor_check_thp(&d);
    doctor_check_numa_balancing(&d);
    doctor_check_limits(&d);
    doctor_check_cpu_features(&d);
    doctor_check_decode_kernels(&d);
    doctor_check_threads(&d, ranks);
    if (plan.device && plan.have) check_device_memory(&d, &plan);
    else check_memory(&d, &plan, config != NULL);
    check_disk(&d, &plan, cli_str(&spec, "--dir") ? cli_str(&spec, "--dir") : plan.out_dir);
    doctor_check_mpi(&d, ranks);
    doctor_check_pcie(&d);
    doctor_check_gpus(&d);
    backend_close(plan.sized_by);

    int failed = 0;
    for (int i = 0; i < d.n; i++) failed |= d.checks[i].status == DOCTOR_FAIL;
    if (cli_opt(&spec, "--json")->value) print_json(&d);
    else print_text(&d);
    if (fflush(stdout) != 0) die("cannot write to standard output");
    doctor_free(&d);
    free(spec.args);
    if (config) grpo_config_free(&c);
    free(plan.plan_text);
    return failed ? 1 : 0;
}
