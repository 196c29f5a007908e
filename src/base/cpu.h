// The CPU's instruction-set level, probed once per process: which of our own kernels run (nn/), and the
// cap oneDNN is given. One portable binary: everything is compiled for x86-64-v3 (AVX2 + FMA, the floor),
// the kernels of higher levels in files of their own, chosen here at run time.
#pragma once

typedef enum {
    CPU_ISA_AVX2,         // AVX2 + FMA (+ F16C, BMI1/2, LZCNT, MOVBE: x86-64-v3), the floor
    CPU_ISA_AVX512,       // + AVX-512 F/DQ/BW/VL (oneDNN's avx512_core)
    CPU_ISA_AVX512_BF16,  // + AVX512_BF16 and AVX512_VNNI: the bf16 and int8 dot products
    CPU_ISA_AMX,          // + AMX-BF16 tiles (oneDNN's avx512_core_amx)
} CpuIsa;

typedef struct {
    CpuIsa machine;   // the best level this CPU and its OS offer
    CpuIsa level;     // what runs: machine, capped by the variable below
    const char *cap;  // "GRPO_CPU_ISA=avx2" (or ONEDNN_MAX_CPU_ISA=..., DNNL_MAX_CPU_ISA=...) or NULL
    int cap_onednn;   // the cap came from GRPO_CPU_ISA: gemm.c passes it on to oneDNN
} CpuLevel;

// The probe's result. The probe runs before main (a constructor that also refuses a CPU below the floor,
// or a GRPO_CPU_ISA that names no level, with one `grpo: error:` line).
const CpuLevel *cpu_level(void);
const char *cpu_isa_name(CpuIsa isa);  // "avx2", "avx512", "avx512_bf16", "amx": GRPO_CPU_ISA's values
const char *cpu_brand(void);  // the CPU's brand string ("AMD EPYC 9R14 96-Core Processor"), "" if none

// The features the build's own code was compiled for, as /proc/cpuinfo names them (space-separated):
// x86-64-v3's, or more with -DGRPO_NATIVE=ON. Defined in cpu_build.c, compiled with the build's flags.
extern const char cpu_build_features[];
