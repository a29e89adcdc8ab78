/*
 * test_gpu_moe.h — suite "moe" of test_gpu_emul.c (included there, after
 * its helpers): the routed-MoE kernels of gpu/kernels/moe.h against
 * references computed here.
 *
 *  - moe_logits (the F32 router): within the float reordering bound of the
 *    exact (double) dot; every width 1..19 bit-identical to width 1 per row.
 *  - moe_route on logits made here: the chosen experts equal the exact
 *    softmax's top-k (logits on a 1/8 grid, so distinct ones are far apart
 *    and equal ones are exact ties, which must go to the lower id), the
 *    weights within the stated relative bound of the exact ones, the shared
 *    gate's sigmoid bit for bit (exp is libm under the emulator; built for
 *    CUDA, within 10u: its expf is not glibc's, as in suite glue).
 *  - moe_gate_up + moe_down: h (CUDA: within 10u, exp) and y bit-identical
 *    to the same operations
 *    done on the DENSE matvec kernels' outputs for the chosen experts (so
 *    each expert dot has the dense matvec's bits), y within the matvec
 *    bound of the CPU's scalar dots combined in double; experts never
 *    chosen have NaN scales, so reading one shows; mixed types per layer
 *    (Q8_0/Q4_K/Q5_K/Q6_K for gate, up, down, shared), a fused gate_up
 *    tensor, no shared expert, k 1..8, odd sizes.
 *  - batch invariance: every row of a launch of 1..16 rows equals the
 *    row launched alone, bit for bit (route weights, h, y).
 */

typedef struct {
    uint32_t n_in, n_ff, n_ff_sh, ne, k;
    int t_gate, t_up, t_down, t_sgate, t_sup, t_sdown;
    int fused_gu, shgate;
    uint32_t max_rows;
    const uint32_t *widths; /* zero-terminated */
} moe_case;

static const char *moe_tname(int t) {
    return t == DS4_TYPE_Q8_0 ? "Q8_0" : t == DS4_TYPE_Q4_K ? "Q4_K" : t == DS4_TYPE_Q5_K ? "Q5_K" : "Q6_K";
}
static size_t moe_bs(int t) { return t == DS4_TYPE_Q4_K ? 144 : t == DS4_TYPE_Q5_K ? 176 : 210; }
static size_t moe_rowb(int t, uint32_t n) { return t == DS4_TYPE_Q8_0 ? n / 32 * 34 : n / 256 * moe_bs(t); }
static size_t moe_actb(int t, uint32_t n) { return t == DS4_TYPE_Q8_0 ? n / 32 * 34 : n / 256 * 292; }

/* rows x n_in weights of type t: Q8_0 from random floats by the CPU's
 * quantizer, K-quants as random bytes with finite small scales. */
static void moe_fill(int t, uint8_t *w, uint32_t rows, uint32_t n_in) {
    if (t == DS4_TYPE_Q8_0) {
        float *f = malloc(sizeof(float) * n_in);
        for (uint32_t r = 0; r < rows; r++) {
            for (uint32_t i = 0; i < n_in; i++) f[i] = frand(-1, 1);
            scalar.from_float[DS4_TYPE_Q8_0](f, w + r * moe_rowb(t, n_in), n_in);
        }
        free(f);
        return;
    }
    const size_t bs = moe_bs(t), nblk = (size_t)rows * (n_in / 256);
    for (size_t i = 0; i < nblk * bs; i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < nblk; b++) {
        uint16_t *dd = (uint16_t *)(w + b * bs + (t == DS4_TYPE_Q6_K ? 208 : 0));
        dd[0] = ds4_f32_to_fp16(frand(0.001f, 0.03f));
        if (t != DS4_TYPE_Q6_K) dd[1] = ds4_f32_to_fp16(frand(0.0f, 0.02f));
    }
}

/* Every block scale of the matrix set to an fp16 NaN: a dot that reads
 * any of its rows is NaN. */
static void moe_poison(int t, uint8_t *w, uint32_t rows, uint32_t n_in) {
    const size_t bs = t == DS4_TYPE_Q8_0 ? 34 : moe_bs(t), nblk = (size_t)rows * (n_in / (t == DS4_TYPE_Q8_0 ? 32 : 256));
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *d = w + b * bs + (t == DS4_TYPE_Q6_K ? 208 : 0);
        d[0] = 0x00, d[1] = 0x7e;
    }
}

/* Activation rows quantized by the CPU for weights of type t. */
static void moe_quant(int t, const float *x, uint32_t rows, uint32_t n, uint32_t stride, uint8_t *q) {
    const int at = t == DS4_TYPE_Q8_0 ? DS4_TYPE_Q8_0 : DS4_TYPE_Q8_K;
    for (uint32_t r = 0; r < rows; r++) scalar.from_float[at](x + (size_t)r * stride, q + r * moe_actb(t, n), n);
}

/* The dense matvec kernel of type t (matvec_q8_0 / matvec_kq*) over
 * `width` activation rows: y[r][o], stride n_out. */
static int moe_dense(int t, const uint8_t *w, uint32_t n_in, uint32_t n_out, const uint8_t *xq, uint32_t width,
                     float *y) {
    if (width > K_MATVEC_MAX_ROWS) { /* the matvecs take 16 rows a launch */
        for (uint32_t r0 = 0; r0 < width; r0 += K_MATVEC_MAX_ROWS) {
            const uint32_t nr = width - r0 < K_MATVEC_MAX_ROWS ? width - r0 : K_MATVEC_MAX_ROWS;
            if (moe_dense(t, w, n_in, n_out, xq + r0 * moe_actb(t, n_in), nr, y + (size_t)r0 * n_out)) return -1;
        }
        return 0;
    }
    if (t == DS4_TYPE_Q8_0) {
        k_matvec_q8_0_params p = {K_TAG_OF(matvec_q8_0), n_in, n_out, width, n_out};
        k_binding b[] = {K_BIND(matvec_q8_0, status, status, 8), K_BIND(matvec_q8_0, p, &p, sizeof p),
                         K_BIND(matvec_q8_0, w, w, n_out * moe_rowb(t, n_in)),
                         K_BIND(matvec_q8_0, xq, xq, width * moe_actb(t, n_in)),
                         K_BIND(matvec_q8_0, y, y, sizeof(float) * width * n_out)};
        return launch(K_ID_matvec_q8_0, K_MATVEC_GROUPS(n_out, 4), 1, 1, 128, b, 5, 0, "dense matvec_q8_0");
    }
    const int kid = K_MATVEC_KQ_KERNEL(width);
    k_matvec_kq_params p = {K_TAG(kid), (uint32_t)t, n_in, n_out, width, n_out};
    k_binding b[] = {K_BIND(matvec_kq, status, status, 8), K_BIND(matvec_kq, p, &p, sizeof p),
                     K_BIND(matvec_kq, w, w, n_out * moe_rowb(t, n_in)),
                     K_BIND(matvec_kq, xq, xq, width * moe_actb(t, n_in)),
                     K_BIND(matvec_kq, y, y, sizeof(float) * width * n_out)};
    return launch(kid, K_MATVEC_KQ_GROUPS(width, n_out, 4), 1, 1, 128, b, 5, 0, "dense matvec_kq");
}

/* One layer's weights and inputs for up to max_rows token rows. */
typedef struct {
    const moe_case *c;
    uint8_t *wgu, *wdn;                 /* the two weight buffers in the file's layout (CPU references) */
    uint8_t *dgu, *ddn;                 /* the same in the device layout (q8_0_rows.h): what kernels read */
    uint8_t *wg, *wu, *wd, *sg, *su, *sd; /* the matrices inside them */
    size_t ebg, ebu, ebd;                 /* bytes per expert */
    size_t u_base, sg_base, su_base, gu_bytes, sd_base, dn_bytes;
    uint32_t gu_rows, u_row0;
    float *logits; /* [rows][ne + 1] */
    float *x;      /* [rows][n_in] */
    uint8_t *xq8, *xqk;
    int *used; /* experts the exact routing picks for some row */
} moe_layer_t;

/* Exact routing of one row in double: softmax, top-k by (p desc, id asc),
 * weights p / sum. */
static void moe_route_ref(const float *l, uint32_t ne, uint32_t k, uint32_t *sel, double *w) {
    double mx = l[0], sum = 0, p[K_MOE_MAX_EXPERTS], ws = 0;
    for (uint32_t e = 1; e < ne; e++) mx = l[e] > mx ? l[e] : mx;
    for (uint32_t e = 0; e < ne; e++) sum += p[e] = exp((double)l[e] - mx);
    for (uint32_t e = 0; e < ne; e++) p[e] /= sum;
    for (uint32_t s = 0; s < k; s++) {
        int best = -1;
        for (uint32_t e = 0; e < ne; e++) {
            int taken = 0;
            for (uint32_t q = 0; q < s; q++) taken |= sel[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = (int)e;
        }
        sel[s] = (uint32_t)best, w[s] = p[best], ws += p[best];
    }
    for (uint32_t s = 0; s < k; s++) w[s] /= ws;
}

/* The device-layout twin of a pointer into wgu / wdn (the repack keeps
 * every row at its offset). */
static const uint8_t *moe_dev(const moe_layer_t *L, const uint8_t *p) {
    return p >= L->wdn && p < L->wdn + L->dn_bytes ? L->ddn + (p - L->wdn) : L->dgu + (p - L->wgu);
}

/* A weight buffer's device twin: each Q8_0 region repacked in place of a
 * copy (every other type as it is). */
static uint8_t *moe_dev_buf(const uint8_t *w, size_t bytes, const int *type, const size_t *off, const size_t *rows,
                            const uint32_t *n_in, int k) {
    uint8_t *d = malloc(bytes);
    memcpy(d, w, bytes);
    for (int i = 0; i < k; i++)
        if (type[i] == DS4_TYPE_Q8_0 && rows[i]) k_q8_0_rows_to_device(d + off[i], w + off[i], rows[i], n_in[i]);
    return d;
}

static void moe_layer_make(moe_layer_t *L, const moe_case *c) {
    memset(L, 0, sizeof *L);
    L->c = c;
    const uint32_t R = c->max_rows, ne = c->ne;
    L->gu_rows = c->fused_gu ? 2 * c->n_ff : c->n_ff;
    L->u_row0 = c->fused_gu ? c->n_ff : 0;
    L->ebg = L->gu_rows * moe_rowb(c->t_gate, c->n_in);
    L->ebu = L->gu_rows * moe_rowb(c->t_up, c->n_in);
    L->ebd = c->n_in * moe_rowb(c->t_down, c->n_ff);
    /* [gate experts | up experts (unless fused) | shared gate | shared up],
     * each at a multiple of 16 bytes, as the runner uploads them */
#define PAD16(x) (((x) + 15) / 16 * 16)
    L->u_base = c->fused_gu ? 0 : PAD16(ne * L->ebg);
    L->sg_base = PAD16(c->fused_gu ? ne * L->ebg : L->u_base + ne * L->ebu);
    L->su_base = PAD16(L->sg_base + c->n_ff_sh * moe_rowb(c->t_sgate, c->n_in));
    L->gu_bytes = L->su_base + c->n_ff_sh * moe_rowb(c->t_sup, c->n_in) + 16;
    L->sd_base = PAD16(ne * L->ebd);
    L->dn_bytes = L->sd_base + (c->n_ff_sh ? c->n_in * moe_rowb(c->t_sdown, c->n_ff_sh) : 0) + 16;
#undef PAD16
    L->wgu = calloc(1, L->gu_bytes);
    L->wdn = calloc(1, L->dn_bytes);
    L->wg = L->wgu, L->wu = L->wgu + L->u_base, L->sg = L->wgu + L->sg_base, L->su = L->wgu + L->su_base;
    L->wd = L->wdn, L->sd = L->wdn + L->sd_base;
    moe_fill(c->t_gate, L->wg, ne * L->gu_rows, c->n_in);
    if (!c->fused_gu) moe_fill(c->t_up, L->wu, ne * L->gu_rows, c->n_in);
    moe_fill(c->t_down, L->wd, ne * c->n_in, c->n_ff);
    if (c->n_ff_sh) {
        moe_fill(c->t_sgate, L->sg, c->n_ff_sh, c->n_in);
        moe_fill(c->t_sup, L->su, c->n_ff_sh, c->n_in);
        moe_fill(c->t_sdown, L->sd, c->n_in, c->n_ff_sh);
    }
    /* Logits on a 1/8 grid: distinct values are >= 1/8 apart (a ratio of
     * e^(1/8) between probabilities, far beyond any rounding), equal ones
     * are exact ties. Each row gets ties at and across the k-th place;
     * expert ne - 1 is far below everyone (never chosen); the shared gate
     * logit in [-4, 4]. */
    L->logits = malloc(sizeof(float) * R * (ne + 1));
    for (uint32_t t = 0; t < R; t++) {
        float *l = L->logits + t * (ne + 1);
        for (uint32_t e = 0; e < ne; e++) l[e] = (float)(int)(rnd() % 41) / 8.0f - 2.5f;
        if (ne > 2) l[ne - 1] = -40.0f;
        if (ne > 3) l[1 + rnd() % (ne - 2)] = l[0]; /* a tie with expert 0 */
        if (ne > 4) {                               /* a tie straddling the k-th place */
            uint32_t sel[K_MOE_MAX_K + 1];
            double w[K_MOE_MAX_K + 1];
            const uint32_t kk = c->k < ne - 1 ? c->k + 1 : c->k;
            moe_route_ref(l, ne - 1, kk, sel, w);
            if (kk > c->k) l[sel[kk - 1]] = l[sel[c->k - 1]];
        }
        l[ne] = frand(-4, 4);
    }
    L->x = malloc(sizeof(float) * R * c->n_in);
    for (uint32_t i = 0; i < R * c->n_in; i++) L->x[i] = frand(-2, 2);
    L->xq8 = malloc(R * moe_actb(DS4_TYPE_Q8_0, c->n_in));
    L->xqk = malloc(R * moe_actb(DS4_TYPE_Q4_K, c->n_in) + 4);
    moe_quant(DS4_TYPE_Q8_0, L->x, R, c->n_in, c->n_in, L->xq8);
    if (c->n_in % 256 == 0) moe_quant(DS4_TYPE_Q4_K, L->x, R, c->n_in, c->n_in, L->xqk);
    /* experts no row picks: NaN scales */
    L->used = calloc(ne, sizeof(int));
    for (uint32_t t = 0; t < R; t++) {
        uint32_t sel[K_MOE_MAX_K];
        double w[K_MOE_MAX_K];
        moe_route_ref(L->logits + t * (ne + 1), ne, c->k, sel, w);
        for (uint32_t s = 0; s < c->k; s++) L->used[sel[s]] = 1;
    }
    for (uint32_t e = 0; e < ne; e++)
        if (!L->used[e]) {
            moe_poison(c->t_gate, L->wg + e * L->ebg, L->gu_rows, c->n_in);
            if (!c->fused_gu) moe_poison(c->t_up, L->wu + e * L->ebu, L->gu_rows, c->n_in);
            moe_poison(c->t_down, L->wd + e * L->ebd, c->n_in, c->n_ff);
        }
    const int tgu[4] = {c->t_gate, c->t_up, c->t_sgate, c->t_sup}, tdn[2] = {c->t_down, c->t_sdown};
    const size_t ogu[4] = {0, L->u_base, L->sg_base, L->su_base}, odn[2] = {0, L->sd_base};
    const size_t rgu[4] = {(size_t)ne * L->gu_rows, c->fused_gu ? 0 : (size_t)ne * L->gu_rows, c->n_ff_sh, c->n_ff_sh};
    const size_t rdn[2] = {(size_t)ne * c->n_in, c->n_ff_sh ? c->n_in : 0};
    const uint32_t igu[4] = {c->n_in, c->n_in, c->n_in, c->n_in}, idn[2] = {c->n_ff, c->n_ff_sh};
    L->dgu = moe_dev_buf(L->wgu, L->gu_bytes, tgu, ogu, rgu, igu, 4);
    L->ddn = moe_dev_buf(L->wdn, L->dn_bytes, tdn, odn, rdn, idn, 2);
}

static void moe_layer_free(moe_layer_t *L) {
    free(L->dgu), free(L->ddn), free(L->wgu), free(L->wdn), free(L->logits), free(L->x), free(L->xq8), free(L->xqk), free(L->used);
}

/* What one run over rows [row0, row0 + n) returns. */
typedef struct {
    uint32_t *sel;
    float *wt, *h, *y;
    uint8_t *hq8, *hqk;
    size_t hq8_bytes, hqk_bytes;
} moe_out;

static uint32_t moe_pairs(const moe_case *c, uint32_t n) { return n * c->k + (c->n_ff_sh ? n : 0); }

/* route -> gate_up -> (the CPU quantizes h, as the runner's quantize
 * kernels do bit for bit) -> down, for rows [row0, row0 + n). */
static int moe_run(const moe_layer_t *L, uint32_t row0, uint32_t n, moe_out *o) {
    const moe_case *c = L->c;
    const uint32_t ne = c->ne, k = c->k, E = c->n_in, nf = c->n_ff > c->n_ff_sh ? c->n_ff : c->n_ff_sh;
    const uint32_t P = moe_pairs(c, n);
    o->sel = malloc(4 * n * k);
    o->wt = malloc(sizeof(float) * n * (k + 1));
    o->h = malloc(sizeof(float) * P * nf);
    o->y = malloc(sizeof(float) * n * E);
    fill_nan(o->h, P * nf);
    fill_nan(o->y, n * E);
    char what[200];
    snprintf(what, sizeof what, "moe_route ne=%u k=%u rows=%u", ne, k, n);
    k_moe_route_params pr = {K_TAG_OF(moe_route), ne, k, n, ne + 1, c->shgate ? K_MOE_SHGATE : 0u};
    k_binding br[] = {K_BIND(moe_route, status, status, 8), K_BIND(moe_route, p, &pr, sizeof pr),
                      K_BIND(moe_route, logits, L->logits + row0 * (ne + 1), sizeof(float) * n * (ne + 1)),
                      K_BIND(moe_route, sel, o->sel, 4 * n * k),
                      K_BIND(moe_route, wt, o->wt, sizeof(float) * n * (k + 1))};
    /* 2 SIMD-groups a threadgroup (rows): the row count and the threadgroup
     * size must not matter */
    if (launch(K_ID_moe_route, (n + 1) / 2, 1, 1, 64, br, 5, (int)(n & 1), what)) return -1;
    k_moe_gate_up_params pg = {K_TAG_OF(moe_gate_up), E, c->n_ff, c->n_ff_sh, k, n, ne,
                               (uint32_t)c->t_gate, (uint32_t)c->t_up, (uint32_t)c->t_sgate, (uint32_t)c->t_sup,
                               (uint32_t)L->ebg, (uint32_t)L->u_base, (uint32_t)L->ebu, L->u_row0,
                               (uint32_t)L->sg_base, (uint32_t)L->su_base, nf};
    const size_t a8 = moe_actb(DS4_TYPE_Q8_0, E), ak = moe_actb(DS4_TYPE_Q4_K, E);
    /* the rows at the start of their own buffer: Q8_0 activation bindings
     * are 4-aligned (the runner's are), row0 * a8 need not be */
    uint8_t *x8 = malloc(n * a8 + 4);
    memcpy(x8, L->xq8 + row0 * a8, n * a8);
    k_binding bg[] = {K_BIND(moe_gate_up, status, status, 8), K_BIND(moe_gate_up, p, &pg, sizeof pg),
                      K_BIND(moe_gate_up, sel, o->sel, 4 * n * k),
                      K_BIND(moe_gate_up, xq8, x8, n * a8),
                      K_BIND(moe_gate_up, xqk, L->xqk + row0 * ak, ak ? n * ak : 1),
                      K_BIND(moe_gate_up, w, L->dgu, L->gu_bytes), K_BIND(moe_gate_up, h, o->h, sizeof(float) * P * nf)};
    snprintf(what, sizeof what, "moe_gate_up rows=%u", n);
    /* 1..4 SIMD-groups a threadgroup by the row count (no effect on bits) */
    const uint32_t nsg = 1 + n % 4;
    const int gu_rc = launch(K_ID_moe_gate_up, (nf + nsg - 1) / nsg, P, 1, 32 * nsg, bg, 7, (int)(n & 1), what);
    free(x8);
    if (gu_rc) return -1;
    /* h quantized for the down types, in the layout moe_down reads */
    o->hq8_bytes = n * k * moe_actb(DS4_TYPE_Q8_0, c->n_ff) + (c->n_ff_sh ? n * moe_actb(DS4_TYPE_Q8_0, c->n_ff_sh) : 0) + 1;
    o->hqk_bytes = n * k * moe_actb(DS4_TYPE_Q4_K, c->n_ff) + (c->n_ff_sh ? n * moe_actb(DS4_TYPE_Q4_K, c->n_ff_sh) : 0) + 4;
    o->hq8 = calloc(1, o->hq8_bytes);
    o->hqk = calloc(1, o->hqk_bytes);
    uint8_t *hd = c->t_down == DS4_TYPE_Q8_0 ? o->hq8 : o->hqk;
    moe_quant(c->t_down, o->h, n * k, c->n_ff, nf, hd);
    if (c->n_ff_sh) {
        uint8_t *hs = c->t_sdown == DS4_TYPE_Q8_0 ? o->hq8 : o->hqk;
        moe_quant(c->t_sdown, o->h + (size_t)n * k * nf, n, c->n_ff_sh, nf, hs + n * k * moe_actb(c->t_sdown, c->n_ff));
    }
    k_moe_down_params pd = {K_TAG_OF(moe_down), c->n_ff, c->n_ff_sh, E, k, n, ne, (uint32_t)c->t_down,
                            (uint32_t)c->t_sdown, (uint32_t)L->sd_base, E};
    k_binding bd[] = {K_BIND(moe_down, status, status, 8), K_BIND(moe_down, p, &pd, sizeof pd),
                      K_BIND(moe_down, sel, o->sel, 4 * n * k), K_BIND(moe_down, wt, o->wt, sizeof(float) * n * (k + 1)),
                      K_BIND(moe_down, hq8, o->hq8, o->hq8_bytes), K_BIND(moe_down, hqk, o->hqk, o->hqk_bytes),
                      K_BIND(moe_down, w, L->ddn, L->dn_bytes), K_BIND(moe_down, out, o->y, sizeof(float) * n * E)};
    snprintf(what, sizeof what, "moe_down rows=%u", n);
    return launch(K_ID_moe_down, (E + nsg - 1) / nsg, n, 1, 32 * nsg, bd, 8, (int)(n & 1), what);
}

static void moe_out_free(moe_out *o) { free(o->sel), free(o->wt), free(o->h), free(o->y), free(o->hq8), free(o->hqk); }

/* The checks of one case on its widest run (n = max_rows rows). */
static void moe_check_case(const moe_layer_t *L, const moe_out *o, uint32_t n, const char *name) {
    const moe_case *c = L->c;
    const uint32_t ne = c->ne, k = c->k, E = c->n_in, nf = c->n_ff > c->n_ff_sh ? c->n_ff : c->n_ff_sh;
    /* 1. routing vs the exact softmax: the same experts in the same slots
     * (ties to the lower id); weights within (2 (12 + ceil(ne/32)) + k) u
     * relative: exp within 5u (docs/gpu.md, GDN), the float sum of ne
     * positive terms (ceil(ne/32) per lane + 5 butterfly levels), 1/sum
     * and the product (2): p within 12 + ceil(ne/32) u; w = p / ws with ws
     * the k-term sum of such p's: twice that + (k - 1) + 1 roundings. */
    int sel_ok = 1, w_ok = 1, g_ok = 1;
    double worst = 0;
    for (uint32_t t = 0; t < n; t++) {
        uint32_t sel[K_MOE_MAX_K];
        double w[K_MOE_MAX_K];
        const float *l = L->logits + t * (ne + 1);
        moe_route_ref(l, ne, k, sel, w);
        const double rel = (2.0 * (12 + (ne + 31) / 32) + k) * U;
        for (uint32_t s = 0; s < k; s++) {
            if (o->sel[t * k + s] != sel[s]) sel_ok = 0;
            const double e = fabs(o->wt[t * (k + 1) + s] - w[s]) / (rel * w[s]);
            if (!(e <= 1.0)) w_ok = 0;
            if (e > worst) worst = e;
        }
        const float gm = c->shgate ? 1.0f / (1.0f + expf(-l[ne])) : 1.0f;
        if (!exp_close(&o->wt[t * (k + 1) + k], &gm, 1)) g_ok = 0; /* exp: the target's (CUDA: within 10u) */
    }
    check(sel_ok, "%s route: experts and slots = the exact softmax's top-%u, ties to the lower id", name, k);
    check(w_ok, "%s route: weights within the stated relative bound of the exact ones (worst %.2f of it)", name, worst);
    check(g_ok, "%s route: shared gate sigmoid %s", name, c->shgate ? EXP_PROMISE " the host's" : "1 without a gate");
    /* 2. gate_up: h bit-identical to SwiGLU of the dense matvecs' outputs of
     * the chosen experts (exp is libm on both sides here). */
    float *G = malloc(sizeof(float) * n * (nf + 1)), *Uu = malloc(sizeof(float) * n * (nf + 1));
    float *D = malloc(sizeof(float) * n * E);
    int h_ok = 1, run_ok = 1;
    for (uint32_t e = 0; e <= ne && run_ok; e++) {
        const int shared = e == ne;
        if (shared ? !c->n_ff_sh : !L->used[e]) continue;
        const uint32_t rows = shared ? c->n_ff_sh : c->n_ff;
        const int tg = shared ? c->t_sgate : c->t_gate, tu = shared ? c->t_sup : c->t_up;
        const uint8_t *wg = shared ? L->sg : L->wg + e * L->ebg;
        const uint8_t *wu = shared ? L->su : L->wu + e * L->ebu + L->u_row0 * moe_rowb(tu, E);
        if (moe_dense(tg, moe_dev(L, wg), E, rows, tg == DS4_TYPE_Q8_0 ? L->xq8 : L->xqk, n, G) ||
            moe_dense(tu, moe_dev(L, wu), E, rows, tu == DS4_TYPE_Q8_0 ? L->xq8 : L->xqk, n, Uu)) {
            run_ok = 0;
            break;
        }
        for (uint32_t t = 0; t < n; t++) {
            uint32_t P = 0xffffffffu;
            if (shared) P = n * k + t;
            else
                for (uint32_t s = 0; s < k; s++)
                    if (o->sel[t * k + s] == e) P = t * k + s;
            if (P == 0xffffffffu) continue;
            for (uint32_t j = 0; j < rows; j++) {
                const float g = G[t * rows + j], u = Uu[t * rows + j], want = (g / (1.0f + expf(-g))) * u;
                if (!exp_close(&o->h[P * nf + j], &want, 1)) h_ok = 0;
            }
        }
    }
    check(run_ok && h_ok, "%s gate_up: h " EXP_PROMISE " SwiGLU of the dense %s/%s matvecs of the chosen experts",
          name, moe_tname(c->t_gate), moe_tname(c->t_up));
    /* 3. down: y bit-identical to the combine (slot order, then the shared
     * expert) of the dense matvecs' outputs over the same quantized rows;
     * and within the matvec bound of the CPU's scalar dots combined in
     * double: per dot the bound of docs/gpu.md §4 (K-quant: (nb + 9) + (2
     * ceil(nb/4) + 6); Q8_0: (nb - 1) + ceil(nb/32) + 5) u sum|t| times
     * |w|, plus (k + 1) roundings of the float combine of sum|w d|. */
    float *y = malloc(sizeof(float) * n * E);
    double *acc = calloc((size_t)n * E, sizeof(double)), *tol = calloc((size_t)n * E, sizeof(double));
    int y_ok = 1, cpu_ok = 1;
    double cworst = 0;
    uint8_t *rowsq = malloc(o->hq8_bytes + o->hqk_bytes);
    for (uint32_t s = 0; s <= k && run_ok; s++) {
        for (uint32_t t = 0; t < n && run_ok; t++) {
            const int shared = s == k;
            if (shared && !c->n_ff_sh) continue;
            const int td = shared ? c->t_sdown : c->t_down;
            const uint32_t nin = shared ? c->n_ff_sh : c->n_ff, e = shared ? 0 : o->sel[t * k + s];
            const size_t ab = moe_actb(td, nin);
            const uint8_t *hq = (td == DS4_TYPE_Q8_0 ? o->hq8 : o->hqk) +
                                (shared ? n * k * moe_actb(td, c->n_ff) + t * ab : (t * k + s) * ab);
            const uint8_t *wd = shared ? L->sd : L->wd + e * L->ebd;
            memcpy(rowsq, hq, ab);
            if (moe_dense(td, moe_dev(L, wd), nin, E, rowsq, 1, D)) {
                run_ok = 0;
                break;
            }
            const float w = o->wt[t * (k + 1) + s];
            const uint32_t nb = td == DS4_TYPE_Q8_0 ? nin / 32 : nin / 256;
            const double kb = td == DS4_TYPE_Q8_0 ? (nb - 1) + (nb + 31) / 32 + 5 : (nb + 9) + (2 * ((nb + 3) / 4) + 6);
            for (uint32_t i = 0; i < E; i++) {
                float *yi = &y[t * E + i];
                *yi = s == 0 ? D[i] * w : *yi + (shared ? w * D[i] : D[i] * w);
                float ref;
                const uint8_t *wrow = wd + i * moe_rowb(td, nin);
                scalar.vec_dot[td](nin, &ref, wrow, hq);
                const double at = td == DS4_TYPE_Q8_0 ? abs_terms(wrow, hq, nb) : kq_abs_terms(td, wrow, hq, nb, moe_bs(td));
                acc[t * E + i] += (double)w * ref;
                tol[t * E + i] += fabs((double)w) * (kb * U * at * 1.0000001) + (k + 1) * U * fabs((double)w * ref);
            }
        }
    }
    for (uint32_t i = 0; i < n * E && run_ok; i++) {
        if (memcmp(&y[i], &o->y[i], 4)) y_ok = 0;
        const double e = fabs(o->y[i] - acc[i]) / (tol[i] + 1e-30);
        if (!(e <= 1.0)) cpu_ok = 0;
        if (e > cworst) cworst = e;
    }
    check(run_ok && y_ok, "%s down: y bit-identical to the slot-order combine of the dense %s matvecs (+ shared %s)",
          name, moe_tname(c->t_down), c->n_ff_sh ? moe_tname(c->t_sdown) : "none");
    check(run_ok && cpu_ok, "%s down: y within the matvec bound of the CPU's dots combined in double (worst %.2f of it)",
          name, cworst);
    free(G), free(Uu), free(D), free(y), free(acc), free(tol), free(rowsq);
}

/* The grouped path (moe_gemm.h) over the rows of `o` (a moe_run of rows
 * [row0, row0 + n)), from o's routing: moe_group, moe_gemm (gate and up),
 * swiglu_quant, moe_gemm (down), moe_combine. Checks moe_group's order and
 * tiles, then y and the quantized SwiGLU rows bit-identical to o's. mma:
 * moe_gemm_mma (gemm_mma.h, tiles of K_MMA_KQ_TR pairs) instead of moe_gemm,
 * as the runner takes it where every matrix of the layer is a K-quant. */
static void moe_check_grouped(const moe_layer_t *L, uint32_t row0, uint32_t n, const moe_out *o, const char *name,
                              int schedule, int mma) {
    const moe_case *c = L->c;
    const uint32_t ne = c->ne, k = c->k, E = c->n_in, nf = c->n_ff > c->n_ff_sh ? c->n_ff : c->n_ff_sh;
    const uint32_t nk = n * k, P = moe_pairs(c, n), sh = c->n_ff_sh != 0;
#ifdef K_HAS_MMA_KERNELS
    const uint32_t TR = mma ? K_MMA_KQ_TR : K_GEMM_TR, WR = mma ? K_MMA_KQ_WR : K_GEMM_NSG * K_GEMM_TOS;
    const uint32_t TG = mma ? K_MMA_KQ_TG : K_GEMM_TG, GEMM = mma ? K_ID_moe_gemm_mma : K_ID_moe_gemm;
#else
    const uint32_t TR = K_GEMM_TR, WR = K_GEMM_NSG * K_GEMM_TOS, TG = K_GEMM_TG, GEMM = K_ID_moe_gemm;
    if (mma) return;
#endif
    const uint32_t T = K_MOE_GROUP_TILES(n, k, ne, sh, TR);
    uint32_t *order = malloc(4 * P), *tiles = malloc(8 * T);
    memset(order, 0xab, 4 * P), memset(tiles, 0xab, 8 * T);
    char what[200];
    snprintf(what, sizeof what, "%s grouped%s rows=%u", name, mma ? " (moe_gemm_mma)" : "", n);
    int ok = 1;
    {
        k_moe_group_params pg = {K_TAG_OF(moe_group), n, k, ne, sh, T, TR};
        k_binding b[] = {K_BIND(moe_group, status, status, 8), K_BIND(moe_group, p, &pg, sizeof pg),
                         K_BIND(moe_group, sel, o->sel, 4 * nk), K_BIND(moe_group, order, order, 4 * P),
                         K_BIND(moe_group, tiles, tiles, 8 * T)};
        /* a threadgroup smaller than the expert count, or larger */
        ok = launch(K_ID_moe_group, 1, 1, 1, schedule ? 32 : 256, b, 5, schedule, what) == 0;
    }
    /* order: every pair once, grouped by expert ascending, pairs ascending
     * inside; tiles: one expert's consecutive pairs each, <= TR,
     * covering order in sequence, then K_MOE_TILE_EMPTY */
    int order_ok = ok, tiles_ok = ok;
    uint32_t *seen = calloc(P, sizeof *seen);
    for (uint32_t i = 0; i < P && order_ok; i++) {
        const uint32_t q = order[i];
        if (q >= P || seen[q]++) order_ok = 0;
        else if (i > 0) {
            const uint32_t a = order[i - 1], ea = a < nk ? o->sel[a] : ne, eq = q < nk ? o->sel[q] : ne;
            if (ea > eq || (ea == eq && a >= q)) order_ok = 0;
        }
    }
    uint32_t next = 0, i = 0;
    for (; i < T && tiles_ok && tiles[2 * i] != K_MOE_TILE_EMPTY; i++) {
        const uint32_t e = tiles[2 * i], st = tiles[2 * i + 1] & 0xffff, cn = tiles[2 * i + 1] >> 16;
        if (st != next || cn == 0 || cn > TR || st + cn > P) tiles_ok = 0;
        for (uint32_t j = 0; j < cn && tiles_ok; j++) {
            const uint32_t q = order[st + j];
            if (q >= P || (q < nk ? o->sel[q] : ne) != e) tiles_ok = 0;
        }
        next = st + cn;
    }
    if (next != P) tiles_ok = 0;
    for (; i < T && tiles_ok; i++)
        if (tiles[2 * i] != K_MOE_TILE_EMPTY) tiles_ok = 0;
    check(order_ok && tiles_ok, "%s: moe_group orders all %u pairs by expert and tiles them (%u tile slots)", what, P, T);
    free(seen);
    /* gate and up into [g | u] rows */
    float *gu = malloc(sizeof(float) * P * 2 * nf), *dn = malloc(sizeof(float) * P * E), *y = malloc(sizeof(float) * n * E);
    fill_nan(gu, P * 2 * nf), fill_nan(dn, P * E), fill_nan(y, n * E);
    const size_t a8 = moe_actb(DS4_TYPE_Q8_0, E), ak = moe_actb(DS4_TYPE_Q4_K, E);
    const uint32_t tile_rows = WR;
    if (ok) {
        k_moe_gemm_params pm = {K_TAG(GEMM), n, k, ne, T, 0, E, E, c->n_ff, c->n_ff_sh,
                                (uint32_t)c->t_gate, (uint32_t)c->t_up, (uint32_t)c->t_sgate, (uint32_t)c->t_sup,
                                0, (uint32_t)L->ebg, (uint32_t)(L->u_base + L->u_row0 * moe_rowb(c->t_up, E)),
                                (uint32_t)L->ebu, (uint32_t)L->sg_base, (uint32_t)L->su_base, 2 * nf, nf};
        k_binding b[] = {K_BIND(moe_gemm, status, status, 8), K_BIND(moe_gemm, p, &pm, sizeof pm),
                         K_BIND(moe_gemm, tiles, tiles, 8 * T), K_BIND(moe_gemm, order, order, 4 * P),
                         K_BIND(moe_gemm, xq8, L->xq8 + row0 * a8, n * a8),
                         K_BIND(moe_gemm, xqk, L->xqk + row0 * ak, ak ? n * ak : 1),
                         K_BIND(moe_gemm, w, L->dgu, L->gu_bytes), K_BIND(moe_gemm, y, gu, sizeof(float) * P * 2 * nf)};
        ok = launch(GEMM, T, (nf + tile_rows - 1) / tile_rows, 2, TG, b, 8, schedule, what) == 0;
    }
    /* SwiGLU + the down type's quantizer, in moe_down's layout */
    const size_t hq8_bytes = o->hq8_bytes, hqk_bytes = o->hqk_bytes;
    uint8_t *hq8 = calloc(1, hq8_bytes), *hqk = calloc(1, hqk_bytes);
    for (int part = 0; part < (sh ? 2 : 1) && ok; part++) {
        const int td = part ? c->t_sdown : c->t_down;
        const uint32_t nn = part ? c->n_ff_sh : c->n_ff, rows = part ? n : nk;
        const size_t qoff = part ? nk * moe_actb(td, c->n_ff) : 0;
        const uint32_t fl = td == DS4_TYPE_Q8_0 ? K_NQ_Q8_0 : K_NQ_Q8_K;
        k_swiglu_quant_params ps = {K_TAG_OF(swiglu_quant), nn, rows, 2 * nf, nf, fl};
        uint8_t *q8 = fl == K_NQ_Q8_0 ? hq8 + qoff : hq8, *qk = fl == K_NQ_Q8_K ? hqk + qoff : hqk;
        k_binding b[] = {K_BIND(swiglu_quant, status, status, 8), K_BIND(swiglu_quant, p, &ps, sizeof ps),
                         K_BIND(swiglu_quant, gu, gu + (part ? nk * 2 * nf : 0), sizeof(float) * rows * 2 * nf),
                         K_BIND(swiglu_quant, q8, q8, fl == K_NQ_Q8_0 ? hq8_bytes - qoff : 1),
                         K_BIND(swiglu_quant, qk, qk, fl == K_NQ_Q8_K ? hqk_bytes - qoff : 1)};
        ok = launch(K_ID_swiglu_quant, (K_SWIGLU_QUANT_UNITS(ps) + 3) / 4, 1, 1, 128, b, 5, schedule, what) == 0;
    }
    int hq_ok = ok;
    for (int part = 0; part < (sh ? 2 : 1) && ok; part++) {
        const int td = part ? c->t_sdown : c->t_down;
        const size_t qoff = part ? nk * moe_actb(td, c->n_ff) : 0;
        const size_t len = part ? n * moe_actb(td, c->n_ff_sh) : nk * moe_actb(td, c->n_ff);
        if (memcmp((td == DS4_TYPE_Q8_0 ? hq8 : hqk) + qoff, (td == DS4_TYPE_Q8_0 ? o->hq8 : o->hqk) + qoff, len))
            hq_ok = 0;
    }
    check(hq_ok, "%s: gate/up GEMM + swiglu_quant = the per-pair SwiGLU rows quantized, byte for byte", what);
    if (ok) {
        k_moe_gemm_params pm = {K_TAG(GEMM), n, k, ne, T, 1, c->n_ff, c->n_ff_sh, E, sh ? E : 0,
                                (uint32_t)c->t_down, (uint32_t)c->t_down, (uint32_t)c->t_sdown, (uint32_t)c->t_sdown,
                                0, (uint32_t)L->ebd, 0, 0, (uint32_t)L->sd_base, 0, E, 0};
        k_binding b[] = {K_BIND(moe_gemm, status, status, 8), K_BIND(moe_gemm, p, &pm, sizeof pm),
                         K_BIND(moe_gemm, tiles, tiles, 8 * T), K_BIND(moe_gemm, order, order, 4 * P),
                         K_BIND(moe_gemm, xq8, hq8, hq8_bytes), K_BIND(moe_gemm, xqk, hqk, hqk_bytes),
                         K_BIND(moe_gemm, w, L->ddn, L->dn_bytes), K_BIND(moe_gemm, y, dn, sizeof(float) * P * E)};
        ok = launch(GEMM, T, (E + tile_rows - 1) / tile_rows, 1, TG, b, 8, schedule, what) == 0;
    }
    if (ok) {
        k_moe_combine_params pc = {K_TAG_OF(moe_combine), n, k, E, sh, E, E};
        k_binding b[] = {K_BIND(moe_combine, status, status, 8), K_BIND(moe_combine, p, &pc, sizeof pc),
                         K_BIND(moe_combine, wt, o->wt, sizeof(float) * n * (k + 1)),
                         K_BIND(moe_combine, dn, dn, sizeof(float) * P * E), K_BIND(moe_combine, out, y, sizeof(float) * n * E)};
        ok = launch(K_ID_moe_combine, (E + 63) / 64, n, 1, 64, b, 5, schedule, what) == 0;
    }
    check(ok && !memcmp(y, o->y, sizeof(float) * n * E), "%s: y bit-identical to moe_gate_up + moe_down's", what);
    free(order), free(tiles), free(gu), free(dn), free(y), free(hq8), free(hqk);
}

static void moe_logits_checks(void) {
    /* 777 and 2048 (the 35B-A3B router's width): past the loads a lane
     * issues ahead per trip (K_MOE_LOGITS_AHEAD), with a tail and without.
     * Split S = 1, 2, 3, 8 and 32 SIMD-groups per router row (one threadgroup
     * each): every width bit-identical to width 1 at the same split (the
     * host launches one split for all widths), within the float bound of the
     * exact dot at every split; S = 32 leaves SIMD-groups with no inputs at
     * the small widths. */
    const uint32_t n_ins[] = {33, 128, 257, 777, 2048}, n_outs[] = {1, 9}, splits[] = {1, 2, 3, 8, 32};
    for (size_t ii = 0; ii < sizeof n_ins / sizeof n_ins[0]; ii++)
        for (size_t io = 0; io < 2; io++)
            for (size_t is = 0; is < sizeof splits / sizeof splits[0]; is++) {
                const uint32_t n_in = n_ins[ii], n_out = n_outs[io], R = 19, xs = n_in + 3, ys = n_out + 2;
                const uint32_t S = splits[is];
                float *w = malloc(sizeof(float) * n_out * n_in), *x = malloc(sizeof(float) * R * xs);
                float *y1 = malloc(sizeof(float) * R * ys), *yw = malloc(sizeof(float) * R * ys);
                for (uint32_t i = 0; i < n_out * n_in; i++) w[i] = frand(-1, 1);
                for (uint32_t i = 0; i < R * xs; i++) x[i] = frand(-3, 3);
                int ok = 1, inv = 1;
                double worst = 0;
                for (uint32_t width = 1; width <= R && ok; width++) {
                    if ((ii + io > 0 || S != 2) && width != 1 && width != 5 && width != 16 && width != R) continue;
                    const uint32_t reps = width == 1 ? R : 1;
                    for (uint32_t rep = 0; rep < reps; rep++) {
                        float *y = width == 1 ? y1 + rep * ys : yw;
                        fill_nan(y, width == 1 ? ys : R * ys);
                        k_moe_logits_params p = {K_TAG_OF(moe_logits), n_in, n_out, width, xs, ys};
                        k_binding b[] = {K_BIND(moe_logits, status, status, 8), K_BIND(moe_logits, p, &p, sizeof p),
                                         K_BIND(moe_logits, w, w, sizeof(float) * n_out * n_in),
                                         K_BIND(moe_logits, x, x + (width == 1 ? rep * xs : 0),
                                                sizeof(float) * width * xs),
                                         K_BIND(moe_logits, y, y, sizeof(float) * width * ys)};
                        /* extra threadgroups past n_out return at once */
                        if (launch(K_ID_moe_logits, n_out + (width & 1), 1, 1, 32 * S, b, 5, (int)(width & 1),
                                   "moe_logits")) {
                            ok = 0;
                            break;
                        }
                    }
                    if (!ok) break;
                    if (width == 1) {
                        /* per lane ceil(n_in/32) products added serially, then
                         * 5 butterfly levels and S - 1 partial sums, each
                         * product rounded once: within (ceil(n_in/32) + 6 + S)
                         * u sum|w x| of the exact dot */
                        for (uint32_t r = 0; r < R; r++)
                            for (uint32_t o = 0; o < n_out; o++) {
                                double ex = 0, at = 0;
                                for (uint32_t i = 0; i < n_in; i++) {
                                    ex += (double)w[o * n_in + i] * x[r * xs + i];
                                    at += fabs((double)w[o * n_in + i] * x[r * xs + i]);
                                }
                                const double e =
                                    fabs(y1[r * ys + o] - ex) / (((n_in + 31) / 32 + 6 + S) * U * at + 1e-30);
                                if (!(e <= 1.0)) ok = 0;
                                if (e > worst) worst = e;
                            }
                    } else {
                        for (uint32_t r = 0; r < width; r++)
                            if (memcmp(yw + r * ys, y1 + r * ys, sizeof(float) * n_out)) inv = 0;
                    }
                }
                check(ok && inv,
                      "moe_logits n_in=%u n_out=%u split %u: within the float reordering bound of the exact dot "
                      "(worst %.2f of it); widths up to 19 bit-identical to width 1 per row",
                      n_in, n_out, S, worst);
                free(w), free(x), free(y1), free(yw);
            }
}

static void moe_logits_wide_checks(void) {
    /* moe_logits_wide against moe_logits at the same split (whose widths are
     * bit-identical to width 1 per row, moe_logits_checks): n_in below
     * 32 S (idle SIMD-groups), with and without a tail past the loads a lane
     * issues ahead; router rows not a multiple of K_MOE_LOGITS_WIDE_O;
     * token rows over one, two and three row blocks with tails; a grid one
     * threadgroup larger each way (those return at once); y's padding
     * columns untouched. */
    static const uint32_t cs[][4] = {/* n_in, n_out, rows, split */
                                     {33, 9, 70, 3},    {257, 13, 5, 1},  {777, 4, 129, 8},
                                     {2048, 9, 70, 16}, {128, 257, 20, 16}, {96, 6, 64, 2}};
    const uint32_t O = K_MOE_LOGITS_WIDE_O, RB = K_MOE_LOGITS_WIDE_ROWS;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const uint32_t n_in = cs[ci][0], n_out = cs[ci][1], R = cs[ci][2], S = cs[ci][3];
        const uint32_t xs = n_in + 3, ys = n_out + 2;
        float *w = malloc(sizeof(float) * n_out * n_in), *x = malloc(sizeof(float) * R * xs);
        float *y1 = malloc(sizeof(float) * R * ys), *yw = malloc(sizeof(float) * R * ys);
        for (uint32_t i = 0; i < n_out * n_in; i++) w[i] = frand(-1, 1);
        for (uint32_t i = 0; i < R * xs; i++) x[i] = frand(-3, 3);
        fill_nan(y1, (size_t)R * ys);
        fill_nan(yw, (size_t)R * ys);
        k_moe_logits_params p = {K_TAG_OF(moe_logits), n_in, n_out, R, xs, ys};
        k_binding b[] = {K_BIND(moe_logits, status, status, 8), K_BIND(moe_logits, p, &p, sizeof p),
                         K_BIND(moe_logits, w, w, sizeof(float) * n_out * n_in),
                         K_BIND(moe_logits, x, x, sizeof(float) * R * xs),
                         K_BIND(moe_logits, y, y1, sizeof(float) * R * ys)};
        int ok = launch(K_ID_moe_logits, n_out, 1, 1, 32 * S, b, 5, 0, "moe_logits") == 0;
        k_moe_logits_wide_params pw = {K_TAG_OF(moe_logits_wide), n_in, n_out, R, xs, ys};
        k_binding bw[] = {K_BIND(moe_logits_wide, status, status, 8), K_BIND(moe_logits_wide, p, &pw, sizeof pw),
                          K_BIND(moe_logits_wide, w, w, sizeof(float) * n_out * n_in),
                          K_BIND(moe_logits_wide, x, x, sizeof(float) * R * xs),
                          K_BIND(moe_logits_wide, y, yw, sizeof(float) * R * ys)};
        ok = ok && launch(K_ID_moe_logits_wide, (n_out + O - 1) / O + 1, (R + RB - 1) / RB + 1, 1, 32 * S, bw, 5,
                          (int)(ci & 1), "moe_logits_wide") == 0;
        int same = ok, pad = ok;
        for (uint32_t r = 0; r < R && ok; r++) {
            if (memcmp(yw + (size_t)r * ys, y1 + (size_t)r * ys, sizeof(float) * n_out)) same = 0;
            if (!isnan(yw[(size_t)r * ys + n_out]) || !isnan(yw[(size_t)r * ys + n_out + 1])) pad = 0;
        }
        check(ok && same && pad,
              "moe_logits_wide n_in=%u n_out=%u rows=%u split %u: bit-identical to moe_logits, padding untouched",
              n_in, n_out, R, S);
        free(w), free(x), free(y1), free(yw);
    }
    { /* a grid short of the router rows or of the token rows, or more
       * SIMD-groups than K_MOE_LOGITS_WIDE_MAX_SPLIT: K_ERR_SHAPE */
        float w[64 * 5], x[64 * 70], y[70 * 5];
        for (int g = 0; g < 3; g++) {
            k_moe_logits_wide_params p = {K_TAG_OF(moe_logits_wide), 64, 5, 70, 64, 5};
            k_binding b[] = {K_BIND(moe_logits_wide, status, status, 8), K_BIND(moe_logits_wide, p, &p, sizeof p),
                             K_BIND(moe_logits_wide, w, w, sizeof w), K_BIND(moe_logits_wide, x, x, sizeof x),
                             K_BIND(moe_logits_wide, y, y, sizeof y)};
            const uint32_t grid[3] = {g == 1 ? 1u : 2u, g == 0 ? 1u : 2u, 1};
            const uint32_t tg = g == 2 ? 32u * (K_MOE_LOGITS_WIDE_MAX_SPLIT + 1u) : 64u;
            emul_options opt = {0, 0};
            char err[600];
            status[0] = status[1] = 0;
            const int rc = emul_launch(K_ID_moe_logits_wide, grid, tg, b, 5, &opt, err, sizeof err);
            /* over the cap, a GPU may refuse the launch itself (an H100 does:
             * too many registers for 544 threads); either way nothing runs */
            check((rc == 0 && (status[0] & K_ERR_SHAPE)) || (g == 2 && rc != 0),
                  "moe_logits_wide: a grid of %u x %u for 5 x 70 at %u threads is refused (K_ERR_SHAPE%s)", grid[0],
                  grid[1], tg, g == 2 ? ", or the launch" : "");
        }
    }
}

static void moe_refusals(void) {
    /* a NaN / Inf router logit: K_ERR_MOE_LOGIT, not an arbitrary route */
    for (int inf = 0; inf < 2; inf++) {
        float l[2 * 9];
        for (int i = 0; i < 18; i++) l[i] = (float)(i % 5);
        l[9 + 4] = inf ? INFINITY : NAN;
        uint32_t sel[6];
        float wt[8];
        k_moe_route_params p = {K_TAG_OF(moe_route), 8, 3, 2, 9, K_MOE_SHGATE};
        k_binding b[] = {K_BIND(moe_route, status, status, 8), K_BIND(moe_route, p, &p, sizeof p),
                         K_BIND(moe_route, logits, l, sizeof l), K_BIND(moe_route, sel, sel, sizeof sel),
                         K_BIND(moe_route, wt, wt, sizeof wt)};
        const uint32_t grid[3] = {2, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_moe_route, grid, 32, b, 5, &opt, err, sizeof err);
        check(rc == 0 && status[0] == K_ERR_MOE_LOGIT, "route: a%s logit raises K_ERR_MOE_LOGIT (status 0x%x)",
              inf ? "n infinite" : " NaN", status[0]);
    }
    /* k > n_expert: K_ERR_SHAPE */
    {
        float l[4] = {0, 1, 2, 3};
        uint32_t sel[5];
        float wt[6];
        k_moe_route_params p = {K_TAG_OF(moe_route), 4, 5, 1, 4, 0};
        k_binding b[] = {K_BIND(moe_route, status, status, 8), K_BIND(moe_route, p, &p, sizeof p),
                         K_BIND(moe_route, logits, l, sizeof l), K_BIND(moe_route, sel, sel, sizeof sel),
                         K_BIND(moe_route, wt, wt, sizeof wt)};
        const uint32_t grid[3] = {1, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_moe_route, grid, 32, b, 5, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "route: k=5 > n_expert=4 raises K_ERR_SHAPE");
    }
    /* an expert id out of range in sel (a corrupted route): K_ERR_SHAPE,
     * never a read past the expert tensor */
    {
        const uint32_t E = 64, F = 32, ne = 3;
        uint8_t *w = calloc(ne * F, E / 32 * 34), xq[E / 32 * 34];
        memset(xq, 0, sizeof xq);
        uint32_t sel[1] = {ne};
        float h[F];
        const uint32_t eb = F * (E / 32) * 34;
        k_moe_gate_up_params p = {K_TAG_OF(moe_gate_up), E, F, 0, 1, 1, ne, K_TYPE_Q8_0, K_TYPE_Q8_0,
                                  K_TYPE_Q8_0, K_TYPE_Q8_0, eb, 0, eb, 0, 0, 0, F};
        k_binding b[] = {K_BIND(moe_gate_up, status, status, 8), K_BIND(moe_gate_up, p, &p, sizeof p),
                         K_BIND(moe_gate_up, sel, sel, 4), K_BIND(moe_gate_up, xq8, xq, sizeof xq),
                         K_BIND(moe_gate_up, xqk, xq, 1), K_BIND(moe_gate_up, w, w, ne * eb),
                         K_BIND(moe_gate_up, h, h, sizeof h)};
        const uint32_t grid[3] = {F / 4, 1, 1};
        emul_options opt = {0, 0};
        char err[600];
        status[0] = status[1] = 0;
        const int rc = emul_launch(K_ID_moe_gate_up, grid, 128, b, 7, &opt, err, sizeof err);
        check(rc == 0 && (status[0] & K_ERR_SHAPE), "gate_up: expert id %u of %u raises K_ERR_SHAPE", ne, ne);
        free(w);
    }
}

static void suite_moe(void) {
    moe_logits_checks();
    moe_logits_wide_checks();
    moe_refusals();
    static const uint32_t w_all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0};
    static const uint32_t w_few[] = {1, 3, 16, 0};
    static const uint32_t w_two[] = {1, 5, 0};
    static const uint32_t w_wide[] = {17, 64, 0}; /* 64: clipped to the case's rows */
    const int Q8 = DS4_TYPE_Q8_0, Q4 = DS4_TYPE_Q4_K, Q5 = DS4_TYPE_Q5_K, Q6 = DS4_TYPE_Q6_K;
    const moe_case cases[] = {
        /* n_in, n_ff, n_ff_sh, ne, k, gate, up, down, sgate, sup, sdown, fused, shgate, rows, widths */
        {96, 64, 32, 13, 3, Q8, Q8, Q8, Q8, Q8, Q8, 0, 1, 16, w_all},  /* every width 1..16 */
        {64, 32, 0, 6, 1, Q8, Q8, Q8, Q8, Q8, Q8, 0, 0, 5, w_two},    /* k 1, no shared expert */
        {32, 96, 64, 37, 8, Q8, Q8, Q8, Q8, Q8, Q8, 1, 1, 3, w_few},  /* k 8 of 37 (2 lanes' worth), fused gate_up */
        {256, 256, 256, 9, 2, Q4, Q5, Q6, Q6, Q4, Q5, 0, 1, 4, w_few}, /* mixed K-quants */
        {512, 256, 256, 7, 5, Q6, Q8, Q4, Q8, Q5, Q8, 0, 0, 3, w_two}, /* K-quants and Q8_0 mixed, no gate */
        {256, 256, 0, 5, 4, Q5, Q5, Q5, Q8, Q8, Q8, 1, 0, 2, w_two},   /* fused Q5_K gate_up, no shared */
        {64, 64, 32, 20, 6, Q8, Q8, Q8, Q8, Q8, Q8, 0, 1, 3, w_two},  /* k 6 */
        {256, 32, 256, 9, 7, Q4, Q6, Q8, Q5, Q5, Q6, 0, 1, 2, w_two},  /* k 7, n_ff 32 (Q8_0 down), K-quant shared */
        /* prefill widths (the grouped path's; each row alone and the widest) */
        {96, 64, 32, 13, 3, Q8, Q8, Q8, Q8, Q8, Q8, 0, 1, 40, w_wide}, /* tiles of 16 and partial ones */
        {256, 256, 256, 9, 2, Q4, Q5, Q6, Q6, Q4, Q5, 0, 1, 33, w_wide}, /* mixed K-quants */
        {32, 96, 0, 37, 8, Q8, Q8, Q8, Q8, Q8, Q8, 1, 0, 19, w_wide},  /* fused gate_up, no shared expert */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const moe_case *c = &cases[ci];
        char name[160];
        snprintf(name, sizeof name, "n_in=%u n_ff=%u n_ff_sh=%u ne=%u k=%u %s/%s/%s sh %s/%s/%s%s", c->n_in, c->n_ff,
                 c->n_ff_sh, c->ne, c->k, moe_tname(c->t_gate), moe_tname(c->t_up), moe_tname(c->t_down),
                 moe_tname(c->t_sgate), moe_tname(c->t_sup), moe_tname(c->t_sdown), c->fused_gu ? " fused" : "");
        moe_layer_t L;
        moe_layer_make(&L, c);
        /* each row alone, then every width: row t of a launch of w rows
         * must equal row t alone, bit for bit */
        moe_out *alone = calloc(c->max_rows, sizeof *alone);
        int ok = 1, inv = 1;
        for (uint32_t t = 0; t < c->max_rows && ok; t++) ok = moe_run(&L, t, 1, &alone[t]) == 0;
        const uint32_t nf = c->n_ff > c->n_ff_sh ? c->n_ff : c->n_ff_sh;
        moe_out widest = {0};
        for (const uint32_t *w = c->widths; *w && ok; w++) {
            const uint32_t n = *w > c->max_rows ? c->max_rows : *w;
            moe_out o = {0};
            if (moe_run(&L, 0, n, &o)) {
                ok = 0;
                moe_out_free(&o);
                break;
            }
            for (uint32_t t = 0; t < n; t++) {
                const moe_out *a = &alone[t];
                if (memcmp(o.sel + t * c->k, a->sel, 4 * c->k) ||
                    memcmp(o.wt + t * (c->k + 1), a->wt, 4 * (c->k + 1)) ||
                    memcmp(o.y + t * c->n_in, a->y, 4 * c->n_in))
                    inv = 0;
                for (uint32_t s = 0; s < c->k; s++)
                    if (memcmp(o.h + (t * c->k + s) * nf, a->h + s * nf, 4 * c->n_ff)) inv = 0;
                if (c->n_ff_sh && memcmp(o.h + (n * c->k + t) * nf, a->h + c->k * nf, 4 * c->n_ff_sh)) inv = 0;
            }
            if (n == c->max_rows) {
                moe_out_free(&widest);
                widest = o;
            } else {
                moe_out_free(&o);
            }
        }
        check(ok && inv, "%s: rows of launches of 1..%u rows bit-identical to each row alone (route, h, y)", name,
              c->max_rows);
        if (ok && widest.y) moe_check_case(&L, &widest, c->max_rows, name);
        if (ok && widest.y) moe_check_grouped(&L, 0, c->max_rows, &widest, name, (int)(ci & 1), 0);
        const int all_kq = c->t_gate != Q8 && c->t_up != Q8 && c->t_down != Q8 &&
                           (!c->n_ff_sh || (c->t_sgate != Q8 && c->t_sup != Q8 && c->t_sdown != Q8));
        if (ok && widest.y && all_kq) moe_check_grouped(&L, 0, c->max_rows, &widest, name, (int)(ci & 1), 1);
        moe_out_free(&widest);
        for (uint32_t t = 0; t < c->max_rows; t++) moe_out_free(&alone[t]);
        free(alone);
        moe_layer_free(&L);
    }
}
