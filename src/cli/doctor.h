// grpo doctor's checks: each one PASS / WARN / FAIL with what it saw, what it wants and the command
// that fixes it. System files are read under a root prefix so tests can feed a fake /sys and /proc.
#pragma once
#include <cjson/cJSON.h>

#include "base/util.h"

typedef enum { DOCTOR_PASS, DOCTOR_WARN, DOCTOR_FAIL } DoctorStatus;

typedef struct {
    char *id;           // stable key: "thp", "nofile", "pcie:0000:01:00.0", "gpu:0", ...
    DoctorStatus status;
    char *observed, *recommended, *fix;  // fix: "" when there is nothing to do
    cJSON *values;      // the raw values behind `observed` (bytes, counts; null = unknown/unlimited)
} DoctorCheck;

typedef struct {
    const char *root;   // "" or a directory standing in for / when reading /sys and /proc
    DoctorCheck *checks;
    int n;
    int cpus_allowed;   // filled by doctor_check_cpus, used by the thread check
    int numa_nodes;
} Doctor;

// The check list and the system checks live in doctor_sys.c; cmd_doctor.c (the command, the memory and
// disk checks that need a config) calls them.

// Appends a check; takes ownership of `observed` (malloc'd, e.g. by xprintf) and `values`.
void doctor_add(Doctor *d, const char *id, DoctorStatus st, char *observed, const char *recommended,
                const char *fix, cJSON *values);
// Text of ROOT/path with trailing whitespace removed (malloc'd), or NULL when it cannot be read.
char *doctor_read(const Doctor *d, const char *path);
// "%.1f GiB"
char *doctor_gib(double bytes);
// Frees every check (and its values) and empties the list.
void doctor_free(Doctor *d);

// System checks, in the order they are reported.
void doctor_check_cpus(Doctor *d);  // cores, affinity, NUMA nodes (sets cpus_allowed, numa_nodes)
void doctor_check_thp(Doctor *d);
void doctor_check_numa_balancing(Doctor *d);
void doctor_check_limits(Doctor *d);
void doctor_check_cpu_features(Doctor *d);
void doctor_check_decode_kernels(Doctor *d);
void doctor_check_threads(Doctor *d, int ranks);
void doctor_check_mpi(Doctor *d, int ranks);
void doctor_check_pcie(Doctor *d);
void doctor_check_gpus(Doctor *d);
