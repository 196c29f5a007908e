// The features this build's code may use (the compiler's macros for its -march), checked against the CPU
// by cpu.c before main and shown by `grpo doctor`.
#include "base/cpu.h"

const char cpu_build_features[] = ""
#ifdef __AVX__
                                  " avx"
#endif
#ifdef __AVX2__
                                  " avx2"
#endif
#ifdef __FMA__
                                  " fma"
#endif
#ifdef __F16C__
                                  " f16c"
#endif
#ifdef __BMI__
                                  " bmi1"
#endif
#ifdef __BMI2__
                                  " bmi2"
#endif
#ifdef __LZCNT__
                                  " abm"
#endif
#ifdef __MOVBE__
                                  " movbe"
#endif
#ifdef __ADX__
                                  " adx"
#endif
#ifdef __SHA__
                                  " sha_ni"
#endif
#ifdef __GFNI__
                                  " gfni"
#endif
#ifdef __VAES__
                                  " vaes"
#endif
#ifdef __VPCLMULQDQ__
                                  " vpclmulqdq"
#endif
#ifdef __AVXVNNI__
                                  " avx_vnni"
#endif
#ifdef __AVX512F__
                                  " avx512f"
#endif
#ifdef __AVX512DQ__
                                  " avx512dq"
#endif
#ifdef __AVX512CD__
                                  " avx512cd"
#endif
#ifdef __AVX512BW__
                                  " avx512bw"
#endif
#ifdef __AVX512VL__
                                  " avx512vl"
#endif
#ifdef __AVX512IFMA__
                                  " avx512ifma"
#endif
#ifdef __AVX512VBMI__
                                  " avx512vbmi"
#endif
#ifdef __AVX512VBMI2__
                                  " avx512_vbmi2"
#endif
#ifdef __AVX512VNNI__
                                  " avx512_vnni"
#endif
#ifdef __AVX512BITALG__
                                  " avx512_bitalg"
#endif
#ifdef __AVX512VPOPCNTDQ__
                                  " avx512_vpopcntdq"
#endif
#ifdef __AVX512FP16__
                                  " avx512_fp16"
#endif
#ifdef __AVX512BF16__
                                  " avx512_bf16"
#endif
#ifdef __AMX_BF16__
                                  " amx_bf16"
#endif
#ifdef __AMX_TILE__
                                  " amx_tile"
#endif
#ifdef __AMX_INT8__
                                  " amx_int8"
#endif
    ;
