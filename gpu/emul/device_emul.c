/*
 * device_emul.c — the emulator as a k_device (host/device.h): memory is
 * host memory, a launch runs the kernel's threadgroups as fibers through
 * emul_launch with every access checked, and launches complete in order,
 * so sync() has nothing to wait for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../host/device.h"
#include "emul.h"

static void *emul_alloc(k_device *d, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) snprintf(d->err, sizeof d->err, "out of host memory for %zu bytes", bytes);
    return p;
}

static void emul_release(k_device *d, void *p) { free(p); }

static int emul_copy(k_device *d, void *dst, const void *src, size_t bytes) {
    memcpy(dst, src, bytes);
    return 0;
}

static int emul_dev_launch(k_device *d, int id, const uint32_t grid[3], uint32_t tg, const k_binding *b,
                           int nb) {
    return emul_launch(id, grid, tg, b, nb, NULL, d->err, sizeof d->err);
}

static int emul_sync(k_device *d) { return 0; }

static void emul_close(k_device *d) { free(d); }

k_device *k_device_emul_open(void) {
    k_device *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->name = "emul";
    d->alloc = emul_alloc;
    d->release = emul_release;
    d->upload = emul_copy;
    d->download = emul_copy;
    d->copy = emul_copy;
    d->launch = emul_dev_launch;
    d->sync = emul_sync;
    d->close = emul_close;
    return d;
}
