// kernels.cu — the shared kernels (gpu/kernels/) compiled as CUDA.
#include "../gpu/dialect/cuda.h"
#include "../gpu/dialect/common.h"
#include "../gpu/kernels/all.h"
