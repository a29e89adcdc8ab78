/*
 * all.h — every shared kernel, in one translation unit per target:
 * after a dialect header (metal.h, cuda.h, emul.h) and common.h.
 * tools/amalgamate.py inlines these includes into one Metal source.
 */
#include "rmsnorm.h"
#include "quant_q8_0.h"
#include "rope.h"
#include "attn.h"
#include "quant_kq.h"
#include "gdn.h"
#include "argmax.h"
#include "elementwise.h"
#include "fused.h"
#include "moe.h"
#include "gemm.h"
#include "moe_gemm.h"
#include "quant_q4_64a.h"
/* int8 tensor-core GEMMs: CUDA and the emulator (K_HAS_MMA); the Metal
 * amalgamation leaves the file out (gpu/tools/amalgamate.py) */
#ifdef K_HAS_MMA
#include "gemm_mma.h"
#endif
