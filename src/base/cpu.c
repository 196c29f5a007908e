// Compiled for plain x86-64 (CMakeLists.txt): the floor check below must run on a CPU without AVX to say
// so, before any code built for x86-64-v3 does.
#include "base/cpu.h"

#include <cpuid.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Register of a CPUID leaf, and the XCR0 state bits the OS must enable for the feature's registers.
enum { EAX, EBX, ECX, EDX };
#define XCR0_YMM 0x6u                 // SSE + AVX state
#define XCR0_ZMM (0xe0u | XCR0_YMM)   // + opmask, ZMM_Hi256, Hi16_ZMM
#define XCR0_TILE (0x60000u | XCR0_ZMM)  // + XTILECFG, XTILEDATA

static const struct {
    const char *name;  // as /proc/cpuinfo and cpu_build_features name it
    uint32_t leaf, sub;
    int reg, bit;
    uint32_t xcr0;
} features[] = {
    {"avx", 1, 0, ECX, 28, XCR0_YMM},
    {"avx2", 7, 0, EBX, 5, XCR0_YMM},
    {"fma", 1, 0, ECX, 12, XCR0_YMM},
    {"f16c", 1, 0, ECX, 29, XCR0_YMM},
    {"bmi1", 7, 0, EBX, 3, 0},
    {"bmi2", 7, 0, EBX, 8, 0},
    {"abm", 0x80000001u, 0, ECX, 5, 0},  // LZCNT
    {"movbe", 1, 0, ECX, 22, 0},
    {"adx", 7, 0, EBX, 19, 0},
    {"sha_ni", 7, 0, EBX, 29, 0},
    {"gfni", 7, 0, ECX, 8, 0},
    {"vaes", 7, 0, ECX, 9, XCR0_YMM},
    {"vpclmulqdq", 7, 0, ECX, 10, XCR0_YMM},
    {"avx_vnni", 7, 1, EAX, 4, XCR0_YMM},
    {"avx512f", 7, 0, EBX, 16, XCR0_ZMM},
    {"avx512dq", 7, 0, EBX, 17, XCR0_ZMM},
    {"avx512cd", 7, 0, EBX, 28, XCR0_ZMM},
    {"avx512bw", 7, 0, EBX, 30, XCR0_ZMM},
    {"avx512vl", 7, 0, EBX, 31, XCR0_ZMM},
    {"avx512ifma", 7, 0, EBX, 21, XCR0_ZMM},
    {"avx512vbmi", 7, 0, ECX, 1, XCR0_ZMM},
    {"avx512_vbmi2", 7, 0, ECX, 6, XCR0_ZMM},
    {"avx512_vnni", 7, 0, ECX, 11, XCR0_ZMM},
    {"avx512_bitalg", 7, 0, ECX, 12, XCR0_ZMM},
    {"avx512_vpopcntdq", 7, 0, ECX, 14, XCR0_ZMM},
    {"avx512_fp16", 7, 0, EDX, 23, XCR0_ZMM},
    {"avx512_bf16", 7, 1, EAX, 5, XCR0_ZMM},
    {"amx_bf16", 7, 0, EDX, 22, XCR0_TILE},
    {"amx_tile", 7, 0, EDX, 24, XCR0_TILE},
    {"amx_int8", 7, 0, EDX, 25, XCR0_TILE},
};

static const char *const isa_names[] = {"avx2", "avx512", "avx512_bf16", "amx"};

// What each level needs beyond the one below it.
static const char *const level_needs[][5] = {
    {"avx", "avx2", "fma", "f16c", NULL},  // (and bmi1, bmi2, abm, movbe: the floor check names them)
    {"avx512f", "avx512dq", "avx512bw", "avx512vl", NULL},
    {"avx512_bf16", "avx512_vnni", NULL},  // (every CPU with the one has the other)
    {"amx_bf16", "amx_tile", NULL},
};

static CpuLevel probed;
static char brand[49];

const CpuLevel *cpu_level(void) { return &probed; }

const char *cpu_brand(void) { return brand; }

const char *cpu_isa_name(CpuIsa isa) { return isa_names[isa]; }

static uint32_t xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // no OSXSAVE: no AVX state
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return lo;
}

// Has this CPU (and its OS) the feature /proc/cpuinfo calls `name`? Unknown names count as present.
static int has(const char *name, size_t len, uint32_t xcr) {
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        if (strlen(features[i].name) != len || strncmp(features[i].name, name, len) != 0) continue;
        unsigned r[4] = {0};
        if (!__get_cpuid_count(features[i].leaf, features[i].sub, &r[EAX], &r[EBX], &r[ECX], &r[EDX])) return 0;
        return (r[features[i].reg] >> features[i].bit & 1) && (xcr & features[i].xcr0) == features[i].xcr0;
    }
    return 1;
}

// GRPO_CPU_ISA's value as a level; -1: no cap ("native" or empty); -2: not a value it takes.
static int parse_grpo_cap(const char *v) {
    if (!*v || strcmp(v, "native") == 0) return -1;
    for (int i = 0; i <= CPU_ISA_AMX; i++)
        if (strcmp(v, isa_names[i]) == 0) return i;
    return -2;
}

// oneDNN's own cap (ONEDNN_MAX_CPU_ISA): our kernels follow it, so the two never disagree.
static int parse_onednn_cap(const char *v) {
    if (strncmp(v, "AVX512_CORE_AMX", 15) == 0) return CPU_ISA_AMX;
    if (strcmp(v, "AVX512_CORE_BF16") == 0) return CPU_ISA_AVX512_BF16;
    if (strncmp(v, "AVX512_CORE", 11) == 0) return CPU_ISA_AVX512;
    if (strcmp(v, "SSE41") == 0 || strcmp(v, "AVX") == 0 || strncmp(v, "AVX2", 4) == 0) return CPU_ISA_AVX2;
    return -1;
}

__attribute__((constructor)) static void cpu_probe(void) {
    uint32_t xcr = xcr0();
    char missing[256] = "";
    for (const char *p = cpu_build_features; *p;) {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " ");
        if (n && !has(p, n, xcr) && strlen(missing) + n + 2 < sizeof missing)
            strncat(strcat(missing, " "), p, n);
        p += n;
    }
    if (*missing) {
#ifdef GRPO_BUILD_NATIVE
        const char *why = "it was built with -DGRPO_NATIVE=ON on another CPU: build it here with scripts/build.sh";
#else
        const char *why = "grpo needs x86-64-v3: AVX2 and FMA, Intel Haswell, AMD Zen or later";
#endif
        fprintf(stderr, "grpo: error: this CPU lacks%s, which this grpo binary uses (%s)\n", missing, why);
        exit(1);
    }
    unsigned r[12] = {0};
    for (unsigned i = 0; i < 3; i++)
        if (!__get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3])) break;
    char raw[sizeof r + 1] = {0};
    memcpy(raw, r, sizeof r);
    const char *b = raw + strspn(raw, " ");  // older Intel brands are right-aligned
    size_t n = strlen(b);
    while (n && b[n - 1] == ' ') n--;
    memcpy(brand, b, n);
    probed.machine = CPU_ISA_AVX2;
    for (int l = CPU_ISA_AVX512; l <= CPU_ISA_AMX; l++) {
        int ok = 1;
        for (int i = 0; level_needs[l][i]; i++) ok = ok && has(level_needs[l][i], strlen(level_needs[l][i]), xcr);
        if (!ok) break;
        probed.machine = (CpuIsa)l;
    }
    static char cap[96];
    int c = -1;
    const char *v = getenv("GRPO_CPU_ISA"), *var = "GRPO_CPU_ISA";
    if (v && (c = parse_grpo_cap(v)) == -2) {
        fprintf(stderr, "grpo: error: GRPO_CPU_ISA=%s: expected avx2, avx512, avx512_bf16, amx or native\n", v);
        exit(1);
    }
    if (c >= 0) probed.cap_onednn = 1;
    if (!v || !*v) {
        var = getenv("ONEDNN_MAX_CPU_ISA") ? "ONEDNN_MAX_CPU_ISA" : "DNNL_MAX_CPU_ISA";
        v = getenv(var);
        c = v ? parse_onednn_cap(v) : -1;
    }
    probed.level = probed.machine;
    if (c >= 0) {
        snprintf(cap, sizeof cap, "%s=%s", var, v);
        probed.cap = cap;
        if ((CpuIsa)c < probed.level) probed.level = (CpuIsa)c;
    }
}
