/* kernels_emul.c — the shared kernels compiled as C for the emulator. */
#include "../dialect/emul.h"
#include "../dialect/common.h"
#include "../kernels/all.h"
