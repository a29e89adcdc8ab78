/*
 * traits.c — the one table of ggml type ids the core knows.
 *
 * Sizes are ggml's (ggml-common.h block structs, ggml.c type_traits); the
 * vec_dot_type pairing is ggml-cpu's (ggml-cpu.c type_traits_cpu). Types with
 * vec_dot_type == -1 can still be read from a GGUF (their size is known) but
 * are refused by the kernels. Note gguf-py 0.19 lists Q8_1 as 40 bytes (an
 * old float layout); ggml's block_q8_1 is two fp16 + 32 int8 = 36.
 */
#include "quants.h"

#define T(id, nm, bs, ts, vdt, only) [id] = {nm, bs, ts, vdt, only}

const ds4_type_traits ds4_type_traits_table[DS4_TYPE_COUNT] = {
    T(DS4_TYPE_F32, "F32", 1, 4, DS4_TYPE_F32, 0),
    T(DS4_TYPE_F16, "F16", 1, 2, DS4_TYPE_F16, 0),
    T(DS4_TYPE_Q4_0, "Q4_0", 32, 18, DS4_TYPE_Q8_0, 0),
    T(DS4_TYPE_Q4_1, "Q4_1", 32, 20, DS4_TYPE_Q8_1, 0),
    T(DS4_TYPE_Q5_0, "Q5_0", 32, 22, DS4_TYPE_Q8_0, 0),
    T(DS4_TYPE_Q5_1, "Q5_1", 32, 24, DS4_TYPE_Q8_1, 0),
    T(DS4_TYPE_Q8_0, "Q8_0", 32, 34, DS4_TYPE_Q8_0, 0),
    T(DS4_TYPE_Q8_1, "Q8_1", 32, 36, -1, 0),
    T(DS4_TYPE_Q2_K, "Q2_K", 256, 84, -1, 0),
    T(DS4_TYPE_Q3_K, "Q3_K", 256, 110, -1, 0),
    T(DS4_TYPE_Q4_K, "Q4_K", 256, 144, DS4_TYPE_Q8_K, 0),
    T(DS4_TYPE_Q5_K, "Q5_K", 256, 176, DS4_TYPE_Q8_K, 0),
    T(DS4_TYPE_Q6_K, "Q6_K", 256, 210, DS4_TYPE_Q8_K, 0),
    T(DS4_TYPE_Q8_K, "Q8_K", 256, 292, -1, 0),
    T(DS4_TYPE_IQ2_XXS, "IQ2_XXS", 256, 66, -1, 0),
    T(DS4_TYPE_IQ2_XS, "IQ2_XS", 256, 74, -1, 0),
    T(DS4_TYPE_IQ3_XXS, "IQ3_XXS", 256, 98, -1, 0),
    T(DS4_TYPE_IQ1_S, "IQ1_S", 256, 50, -1, 0),
    T(DS4_TYPE_IQ4_NL, "IQ4_NL", 32, 18, DS4_TYPE_Q8_0, 0),
    T(DS4_TYPE_IQ3_S, "IQ3_S", 256, 110, -1, 0),
    T(DS4_TYPE_IQ2_S, "IQ2_S", 256, 82, -1, 0),
    T(DS4_TYPE_IQ4_XS, "IQ4_XS", 256, 136, DS4_TYPE_Q8_K, 0),
    T(DS4_TYPE_I8, "I8", 1, 1, -1, 0),
    T(DS4_TYPE_I16, "I16", 1, 2, -1, 0),
    T(DS4_TYPE_I32, "I32", 1, 4, -1, 0),
    T(DS4_TYPE_I64, "I64", 1, 8, -1, 0),
    T(DS4_TYPE_F64, "F64", 1, 8, -1, 0),
    T(DS4_TYPE_IQ1_M, "IQ1_M", 256, 56, -1, 0),
    T(DS4_TYPE_BF16, "BF16", 1, 2, DS4_TYPE_BF16, 0),
    T(DS4_TYPE_TQ1_0, "TQ1_0", 256, 54, -1, 0),
    T(DS4_TYPE_TQ2_0, "TQ2_0", 256, 66, -1, 0),
    /* ds4-only: ggml has no type at these ids (its IQ4_NL_4_4/_4_8 were removed). */
    T(DS4_TYPE_Q4_64A, "Q4_64A", 64, 36, DS4_TYPE_Q8_0, 1),
    T(DS4_TYPE_Q2_64A, "Q2_64A", 64, 20, DS4_TYPE_Q8_0, 1),
    T(DS4_TYPE_MXFP4, "MXFP4", 32, 17, -1, 0),
    T(DS4_TYPE_NVFP4, "NVFP4", 64, 36, -1, 0),
    T(DS4_TYPE_Q1_0, "Q1_0", 128, 18, -1, 0),
    T(DS4_TYPE_Q2_0, "Q2_0", 64, 18, -1, 0),
};
