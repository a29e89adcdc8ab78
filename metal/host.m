/*
 * host.m — the Metal host: compiles the shared kernels (gpu/kernels/, inlined
 * into metal/kernels_source.h by gpu/tools/amalgamate.py) at load time and
 * launches them through the argument tables (gpu/kernels/table.h). Mirrors
 * cuda/host.cu function for function.
 *
 * UNTESTED: written without a Mac; it has never been compiled. build_core.py
 * builds it only with DS4PY_BUILD_METAL=1 (default macOS builds keep
 * metal/metal_stub.c), until a Mac has compiled it and run `make test-metal`
 * (docs/gpu.md, "Untested on Metal"). Manual retain/release (no ARC), so it
 * needs no flag beyond -framework Metal -framework Foundation.
 */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include "../csrc/ds4.h"
#include "../csrc/error.h"
#include "../gpu/host/bind.h"
#include "kernels_source.h"

int ds4_metal_available(ds4_error *err) {
    id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
    if (!dev) {
        ds4_fail(err, DS4_ERR_UNSUPPORTED, "no Metal device on this Mac");
        return 0;
    }
    [dev release];
    return 1;
}

/* One per process: the device, a queue, a pipeline per kernel of the
 * table and the status word every kernel reports into. */
typedef struct {
    id<MTLDevice> dev;
    id<MTLCommandQueue> queue;
    id<MTLComputePipelineState> pipe[K_ID_END_];
    id<MTLBuffer> status; /* k_u32[2], shared storage */
} ds4_metal_ctx;

#define NAME_(id, K) [id] = "k_" #K,
static const char *const kernel_names[K_ID_END_] = {K_KERNEL_LIST(NAME_)};

int ds4_metal_ctx_new(ds4_metal_ctx **out, ds4_error *err);
int ds4_metal_ctx_new(ds4_metal_ctx **out, ds4_error *err) {
    *out = NULL;
    char msg[300];
    if (k_check_tables(msg, sizeof msg)) return ds4_fail(err, DS4_ERR_UNSUPPORTED, "%s", msg);
    ds4_metal_ctx *c = calloc(1, sizeof *c);
    if (!c) return ds4_fail(err, DS4_ERR_NOMEM, "Metal context");
    c->dev = MTLCreateSystemDefaultDevice();
    if (!c->dev) {
        free(c);
        return ds4_fail(err, DS4_ERR_UNSUPPORTED, "no Metal device on this Mac");
    }
    c->queue = [c->dev newCommandQueue];
    MTLCompileOptions *opt = [[MTLCompileOptions alloc] init];
    /* The kernels promise the emulator's bits: no fast math, no contraction
     * (the source also says so with #pragma METAL fp). */
    opt.fastMathEnabled = NO;
    NSError *e = nil;
    NSString *src = [NSString stringWithUTF8String:ds4_metal_source];
    id<MTLLibrary> lib = [c->dev newLibraryWithSource:src options:opt error:&e];
    [opt release];
    if (!lib) {
        ds4_fail(err, DS4_ERR_UNSUPPORTED, "Metal kernel compile failed: %s",
                 e ? [[e localizedDescription] UTF8String] : "unknown error");
        [c->queue release];
        [c->dev release];
        free(c);
        return err ? err->code : DS4_ERR_UNSUPPORTED;
    }
    for (int id = 1; id < K_ID_END_; id++) {
        if (!kernel_names[id]) continue;
        id<MTLFunction> fn = [lib newFunctionWithName:[NSString stringWithUTF8String:kernel_names[id]]];
        if (fn) c->pipe[id] = [c->dev newComputePipelineStateWithFunction:fn error:&e];
        [fn release];
        if (!c->pipe[id]) {
            ds4_fail(err, DS4_ERR_UNSUPPORTED, "Metal pipeline %s: %s", kernel_names[id],
                     e ? [[e localizedDescription] UTF8String] : "function missing");
            [lib release];
            return err ? err->code : DS4_ERR_UNSUPPORTED;
        }
    }
    [lib release];
    c->status = [c->dev newBufferWithLength:8 options:MTLResourceStorageModeShared];
    memset([c->status contents], 0, 8);
    *out = c;
    return DS4_OK;
}

/* Encode kernel `id`: bindings hold id<MTLBuffer> (as void *) for buffers,
 * a host pointer for the params (setBytes). k_check_bindings first, so a
 * slot bound twice or never, a short buffer or foreign params refuse the
 * launch before anything is encoded. */
int ds4_metal_encode(ds4_metal_ctx *c, id<MTLComputeCommandEncoder> enc, int id, const uint32_t grid[3],
                     uint32_t tg, const k_binding *b, int nb, ds4_error *err);
int ds4_metal_encode(ds4_metal_ctx *c, id<MTLComputeCommandEncoder> enc, int id, const uint32_t grid[3],
                     uint32_t tg, const k_binding *b, int nb, ds4_error *err) {
    const k_kernel_desc *d = k_kernel_desc_of(id);
    char msg[300];
    if (!d || id <= 0 || id >= K_ID_END_ || !c->pipe[id])
        return ds4_fail(err, DS4_ERR_ARG, "no Metal kernel with id %d", id);
    if (k_check_bindings(d, b, nb, msg, sizeof msg)) return ds4_fail(err, DS4_ERR_ARG, "%s", msg);
    if (tg == 0 || tg % 32 || tg > [c->pipe[id] maxTotalThreadsPerThreadgroup])
        return ds4_fail(err, DS4_ERR_ARG, "kernel %s: threadgroup size %u", d->name, tg);
    [enc setComputePipelineState:c->pipe[id]];
    for (int i = 0; i < nb; i++) {
        const int slot = b[i].slot;
        if (d->args[slot].kind == K_PARAMS)
            [enc setBytes:b[i].ptr length:b[i].bytes atIndex:(NSUInteger)slot];
        else
            [enc setBuffer:(id<MTLBuffer>)b[i].ptr offset:0 atIndex:(NSUInteger)slot];
    }
    [enc dispatchThreadgroups:MTLSizeMake(grid[0] ? grid[0] : 1, grid[1] ? grid[1] : 1, grid[2] ? grid[2] : 1)
        threadsPerThreadgroup:MTLSizeMake(tg, 1, 1)];
    return DS4_OK;
}

/* After a command buffer completes: a raised status word is an error
 * (K_ERR_TAG: mis-bound arguments; K_ERR_SHAPE: bad params), never a
 * silent success. */
int ds4_metal_check_status(ds4_metal_ctx *c, ds4_error *err);
int ds4_metal_check_status(ds4_metal_ctx *c, ds4_error *err) {
    uint32_t *s = (uint32_t *)[c->status contents];
    if (!s[0]) return DS4_OK;
    const uint32_t bits = s[0];
    s[0] = s[1] = 0;
    return ds4_fail(err, DS4_ERR_UNSUPPORTED, "Metal kernel raised status 0x%x (%s)", bits,
                    bits & K_ERR_TAG ? "arguments bound to the wrong slots" : "bad shape parameters");
}

void ds4_metal_ctx_free(ds4_metal_ctx *c);
void ds4_metal_ctx_free(ds4_metal_ctx *c) {
    if (!c) return;
    for (int i = 0; i < K_ID_END_; i++) [c->pipe[i] release];
    [c->status release];
    [c->queue release];
    [c->dev release];
    free(c);
}
