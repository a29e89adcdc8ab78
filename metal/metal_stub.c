/*
 * metal_stub.c — the Metal backend on platforms without Metal. On macOS the
 * build compiles the Objective-C files in metal/ instead of this file (none exist yet: the GPU
 * issue adds them, and until then macOS also builds this stub).
 */
#include "../csrc/ds4.h"
#include "../csrc/error.h"

int ds4_metal_available(ds4_error *err) {
    ds4_fail(err, DS4_ERR_UNSUPPORTED, "Metal is not available on this platform");
    return 0;
}
