/*
 * gdn.h — one decode token of the gated DeltaNet mixer (csrc/forward/gdn.c,
 * the CPU's fast precision): the causal conv with its state shift, then the
 * gated delta rule and the gated RMSNorm per value head. The projections
 * before (attn_qkv, attn_gate, ssm_beta, ssm_alpha) and ssm_out after are
 * matvecs.
 */

/* One thread per channel: the taps oldest -> newest summed in the CPU's
 * order (bit-identical sum), SiLU as x / (1 + exp(-x)) (exp is the GPU's:
 * the only difference, docs/gpu.md), then the channel's state column shifts
 * by one row. A thread touches only its own channel. */
K_KERNEL(gdn_conv) {
    K_CHECK_TAG(gdn_conv);
    if (p.k < 2u || p.k > K_GDN_MAX_CONV) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 ch = K_GX * K_TG_SIZE + K_TID;
    if (ch >= p.n_ch) return; /* no barriers here */
    /* loops to the constant K_GDN_MAX_CONV with guards: seq[] stays in registers */
    float seq[K_GDN_MAX_CONV];
    K_UNROLL for (k_u32 kk = 0; kk < K_GDN_MAX_CONV; kk++)
        seq[kk] = kk + 1u < p.k ? K_LD(state, kk * p.n_ch + ch) : kk + 1u == p.k ? K_LD(x, ch) : 0.0f;
    float acc = 0.0f;
    K_UNROLL for (k_u32 kk = 0; kk < K_GDN_MAX_CONV; kk++)
        if (kk < p.k) acc += K_LD(cw, ch * p.k + kk) * seq[kk];
    K_ST(out, ch, acc / (1.0f + k_exp(-acc)));
    K_UNROLL for (k_u32 kk = 0; kk + 1u < K_GDN_MAX_CONV; kk++)
        if (kk + 1u < p.k) K_ST(state, kk * p.n_ch + ch, seq[kk + 1u]);
}

/* Sum over a threadgroup of one value per thread: butterfly per SIMD-group,
 * then the SIMD-group partials in ascending order (every thread gets the
 * same bits). Called by all threads; uses `part` (tgs/32 floats) between
 * two barriers. Helpers take the thread position as arguments (tid,
 * tgs = K_TID, K_TG_SIZE): on Metal those are kernel parameters. */
K_FN float k_tg_sum(float v, K_TGM float *part, k_u32 tid, k_u32 tgs) {
    v = k_simd_sum(v);
    if ((tid & 31u) == 0u) K_ST(part, tid >> 5, v);
    K_BARRIER();
    float s = 0.0f;
    for (k_u32 g = 0; g < (tgs >> 5); g++) s += K_LD(part, g);
    K_BARRIER(); /* part is free again */
    return s;
}

/* llama.cpp's GDN L2 norm of `d` values in threadgroup memory, in place,
 * for two arrays at once (q and k): rms_norm with eps/d (mean in float,
 * 1/sqrt), then * 1/sqrt(d); the CPU's ds4_l2norm_ggml, with a float sum
 * where the CPU sums in double. Each array's sum is k_tg_sum's (butterfly
 * per SIMD-group, partials in ascending order); the two sums share their
 * barriers (3 per token where two calls of a one-array norm took 6).
 * `part` holds 2 (tgs/32) floats. */
K_FN void k_gdn_l2norm2(K_TGM float *a, K_TGM float *b, k_u32 d, float eps, K_TGM float *part, k_u32 tid, k_u32 tgs) {
    float sa = 0.0f, sb = 0.0f;
    for (k_u32 i = tid; i < d; i += tgs) sa += K_LD(a, i) * K_LD(a, i), sb += K_LD(b, i) * K_LD(b, i);
    sa = k_simd_sum(sa), sb = k_simd_sum(sb);
    const k_u32 nw = tgs >> 5;
    if ((tid & 31u) == 0u) K_ST(part, tid >> 5, sa), K_ST(part, nw + (tid >> 5), sb);
    K_BARRIER();
    float ta = 0.0f, tb = 0.0f;
    for (k_u32 g = 0; g < nw; g++) ta += K_LD(part, g), tb += K_LD(part, nw + g);
    K_BARRIER(); /* part is free again */
    const float nf = (float)d, s2 = 1.0f / k_sqrt(nf);
    const float ca = 1.0f / k_sqrt(ta / nf + eps / nf), cb = 1.0f / k_sqrt(tb / nf + eps / nf);
    for (k_u32 i = tid; i < d; i += tgs) K_ST(a, i, (K_LD(a, i) * ca) * s2), K_ST(b, i, (K_LD(b, i) * cb) * s2);
    K_BARRIER();
}

/* One threadgroup per value head j (K_GX); one SIMD-group per state row
 * (below): decay, S.k, the rank-1 update and S.q in float (the CPU's dot
 * sums in its own order: the tolerance is derived in docs/gpu.md). */
K_KERNEL(gdn_delta) {
    K_CHECK_TAG(gdn_delta);
    if (p.d == 0u || p.d > K_GDN_MAX_D || p.n_k == 0u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(float, qn, K_GDN_MAX_D);
    K_TG_ARRAY(float, kn, K_GDN_MAX_D);
    K_TG_ARRAY(float, on, K_GDN_MAX_D);
    K_TG_ARRAY(float, part, 32);
#ifdef PLANT_GDN_WRONG_KHEAD
    /* planted fault (tests must turn red): grouped instead of tiled v -> k heads */
    const k_u32 j = K_GX, d = p.d, kh = j / ((p.n_v + p.n_k - 1u) / p.n_k);
#else
    const k_u32 j = K_GX, d = p.d, kh = j % p.n_k; /* tiled (spec §3.8, pitfall 3) */
#endif
    if (j >= p.n_v) return; /* a whole threadgroup */
    for (k_u32 i = K_TID; i < d; i += K_TG_SIZE) {
        K_ST(qn, i, K_LD(cv, kh * d + i));
        K_ST(kn, i, K_LD(cv, (p.n_k + kh) * d + i));
    }
    K_BARRIER();
    k_gdn_l2norm2(qn, kn, d, p.eps, part, K_TID, K_TG_SIZE);
    const float beta = 1.0f / (1.0f + k_exp(-K_LD(ab, j)));
    const float a = K_LD(ab, p.n_v + j) + K_LD(hp, p.n_v + j);
    const float sp = a > 20.0f ? a : k_log(1.0f + k_exp(a)); /* ggml's softplus */
    const float decay = k_exp(K_LD(hp, j) * sp);
    const float oscale = 1.0f / k_sqrt((float)d);
    K_DEV float *S = s + j * d * d;
    /* One SIMD-group per state row (rows m = SIMD-group, + K_NSIMD, ...):
     * lane l holds the row's elements l, l + 32, ... in registers, so the
     * row is read and written once, coalesced. S.k and S.q are each lane's
     * strided partial sum (ascending i) then the butterfly: a fixed order,
     * the same in every launch (not the CPU's: the tolerance is in
     * docs/gpu.md). One thread per row walking it serially left the H200
     * latency-bound (56 us per launch at 16 heads x d 128). */
    const k_u32 per = (d + 31u) / 32u; /* <= K_GDN_MAX_D / 32 */
    for (k_u32 m = K_SIMD; m < d; m += K_NSIMD) {
        K_DEV float *Sm = S + m * d;
        float row[K_GDN_MAX_D / 32];
        float u = 0.0f;
        K_UNROLL for (k_u32 c = 0; c < K_GDN_MAX_D / 32; c++) {
            const k_u32 i = c * 32u + K_LANE;
            row[c] = 0.0f;
            if (c < per && i < d) {
                row[c] = K_LD(Sm, i) * decay;
                u += row[c] * K_LD(kn, i);
            }
        }
        u = k_simd_sum(u);
        const float dm = (K_LD(cv, (2u * p.n_k + j) * d + m) - u) * beta;
        float o = 0.0f;
        K_UNROLL for (k_u32 c = 0; c < K_GDN_MAX_D / 32; c++) {
            const k_u32 i = c * 32u + K_LANE;
            if (c < per && i < d) {
                row[c] = row[c] + K_LD(kn, i) * dm;
                K_ST(Sm, i, row[c]);
                o += row[c] * K_LD(qn, i);
            }
        }
        o = k_simd_sum(o);
        if (K_LANE == 0u) K_ST(on, m, o * oscale);
    }
    K_BARRIER();
    /* gated RMSNorm: rmsnorm(o) * norm_w * SiLU(z) (ds4_rmsnorm, ds4_silu) */
    float ss = 0.0f;
    for (k_u32 m = K_TID; m < d; m += K_TG_SIZE) ss += K_LD(on, m) * K_LD(on, m);
    const float mean = k_tg_sum(ss, part, K_TID, K_TG_SIZE) / (float)d;
    const float scale = 1.0f / k_sqrt(mean + p.eps);
    for (k_u32 m = K_TID; m < d; m += K_TG_SIZE) {
        const float zm = K_LD(z, j * d + m);
        const float y = (K_LD(on, m) * scale) * K_LD(hp, 2u * p.n_v + m);
        K_ST(o, j * d + m, y * (zm / (1.0f + k_exp(-zm))));
    }
}

/* Register tile of gdn_seq's state: rows per SIMD-group and elements per
 * lane of a row kept in registers between tokens (d = 128 with 8
 * SIMD-groups: 16 x 4 = 64 floats per lane). Rows past K_GDN_SEQ_RPS, or
 * every row when d > 32 K_GDN_SEQ_COLS, are read and written in device
 * memory each token, as gdn_delta does: the same values either way. */
/* (K_GDN_SEQ_RPS, K_GDN_SEQ_COLS: table.h, which the hosts read too) */

/* A state row held in registers (lane l: elements c 32 + l, c <
 * K_GDN_SEQ_COLS), and one token's step of the delta rule on it:
 * gdn_delta's operations in its order -- decay, u = S.k (the lane's
 * strided sum, then the butterfly), the rank-1 update with (v - u) beta,
 * then S.q the same way. gdn_seq's register rows and gdn_rows both call
 * it, so their bits are one code's. */
typedef struct {
    float e[K_GDN_SEQ_COLS];
} k_gdn_cols;
typedef struct {
    k_gdn_cols st; /* the row after the step */
    float o;       /* its S.q (every lane) */
} k_gdn_row_step_t;
/* The step's two halves, each with its lane's partial dot before the
 * butterfly: decay the row and S.k (u), then the update and S.q (o). */
typedef struct {
    k_gdn_cols st;
    float part;
} k_gdn_half_t;
K_FN k_gdn_half_t k_gdn_row_decay_part(k_gdn_cols st, const k_gdn_cols kx, float decay, k_u32 per, k_u32 d,
                                       k_u32 lane) {
    float u = 0.0f;
    K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {
        const k_u32 i = c * 32u + lane;
        if (c < per && i < d) {
            st.e[c] = st.e[c] * decay;
            u += st.e[c] * kx.e[c];
        }
    }
    k_gdn_half_t h;
    h.st = st;
    h.part = u;
    return h;
}
K_FN k_gdn_half_t k_gdn_row_update_part(k_gdn_cols st, const k_gdn_cols kx, const k_gdn_cols qx, float dm,
                                        k_u32 per, k_u32 d, k_u32 lane) {
    float o = 0.0f;
    K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {
        const k_u32 i = c * 32u + lane;
        if (c < per && i < d) {
            st.e[c] = st.e[c] + kx.e[c] * dm;
            o += st.e[c] * qx.e[c];
        }
    }
    k_gdn_half_t h;
    h.st = st;
    h.part = o;
    return h;
}
K_FN k_gdn_row_step_t k_gdn_row_step(k_gdn_cols st, const k_gdn_cols kx, const k_gdn_cols qx, float v, float beta,
                                     float decay, k_u32 per, k_u32 d, k_u32 lane) {
    const k_gdn_half_t hu = k_gdn_row_decay_part(st, kx, decay, per, d, lane);
    const float u = k_simd_sum(hu.part);
    const k_gdn_half_t ho = k_gdn_row_update_part(hu.st, kx, qx, (v - u) * beta, per, d, lane);
    k_gdn_row_step_t R;
    R.st = ho.st;
    R.o = k_simd_sum(ho.part);
    return R;
}

/* gdn_conv + gdn_delta for n_tok tokens of one value head, or of d / split
 * of its state rows, per threadgroup (table.h gdn_seq). Per token: the conv
 * of the channels this threadgroup reads (q and k of k head j % n_k, the v
 * of its rows of head j; the q/k channels are computed by every
 * threadgroup that reads them: the same bits), then gdn_delta's body
 * verbatim on its rows, with the state rows in registers instead of device
 * memory, and (split 1) the gated norm; split > 1 stores the raw rows for
 * gdn_norm. The conv window of token t is [the state rows, half cur of
 * conv ; in rows 0..t]: read (into registers, below), never shifted in
 * place in memory; the new state goes to the other half. Bit-identity
 * with the single-token kernels is tested (test_gpu_emul gdnseq). */
K_KERNEL_BOUNDED(gdn_seq, K_GDN_SEQ_MAX_TG, 1) {
    K_CHECK_TAG(gdn_seq);
    const k_u32 d = p.d, cd = (2u * p.n_k + p.n_v) * d, G = p.split > 1u ? p.split : 1u;
    if (d == 0u || d > K_GDN_MAX_D || p.n_k == 0u || p.n_v < p.n_k || p.k < 2u || p.k > K_GDN_MAX_CONV ||
        p.n_tok == 0u || p.cur > 1u || p.z_off < cd || p.ab_off < p.z_off + p.n_v * d || p.o_stride < p.n_v * d ||
        K_TG_SIZE > K_GDN_SEQ_MAX_TG || d % G != 0u || K_NGX < p.n_v * G) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    /* the conv outputs of token t in half t & 1 (double-buffered: see
     * "Barriers" below) */
    K_TG_ARRAY(float, qn, 2 * K_GDN_MAX_D);
    K_TG_ARRAY(float, kn, 2 * K_GDN_MAX_D);
    K_TG_ARRAY(float, vn, 2 * K_GDN_MAX_D);
    K_TG_ARRAY(float, on, K_GDN_MAX_D);
    K_TG_ARRAY(float, part, 32);
    K_TG_ARRAY(float, npart, 32);
    /* value head j, state rows [m0, m0 + dr) of it (G threadgroups a head) */
    const k_u32 j = K_GX / G, kh = j % p.n_k; /* tiled (spec §3.8, pitfall 3) */
    const k_u32 dr = d / G, m0 = (K_GX % G) * dr, m1 = m0 + dr;
    if (j >= p.n_v) return; /* a whole threadgroup */
    K_DEV float *S = s + j * d * d;
    const k_u32 cin = p.cur * (p.k - 1u) * cd, cout = (1u - p.cur) * (p.k - 1u) * cd;
    const k_u32 per = (d + 31u) / 32u, nch = 2u * d + dr, nw = K_TG_SIZE >> 5;
    const int in_regs = per <= K_GDN_SEQ_COLS;
    const k_u32 reg_rows = in_regs ? K_GDN_SEQ_RPS : 0u; /* rows m = SIMD + r NSIMD, r < reg_rows */
    k_gdn_cols st[K_GDN_SEQ_RPS];
    K_UNROLL for (k_u32 r = 0; r < K_GDN_SEQ_RPS; r++) {
        const k_u32 m = m0 + K_SIMD + r * K_NSIMD;
        K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {
            const k_u32 i = c * 32u + K_LANE;
            st[r].e[c] = r < reg_rows && m < m1 && i < d ? K_LD(S, m * d + i) : 0.0f;
        }
    }
    const float oscale = 1.0f / k_sqrt((float)d);
    const float ssm_a = K_LD(hp, j), dt_bias = K_LD(hp, p.n_v + j); /* the same every token */
    /* local channel c < d: q of kh; < 2d: k of kh; else v row m0 + c - 2d of j
     * (the q/k channels are computed by every threadgroup that reads them:
     * the same bits) */
#define K_GDN_SEQ_CH_(c) \
    ((c) < d ? kh * d + (c) : (c) < 2u * d ? (p.n_k + kh) * d + ((c) - d) : (2u * p.n_k + j) * d + m0 + ((c) - 2u * d))
    /* Loaded a token ahead (the same values, only earlier: the same bits):
     * the newest conv input of this thread's first two channels, the
     * token's beta / alpha logits and the z of its first two rows. Every
     * token otherwise waited on device memory three times over (the conv's
     * new row, then ab, then z), each wait a whole memory latency with
     * nothing else in flight. */
#define K_GDN_SEQ_FETCH_(t_, NX, ZV, AB)                                                            \
    do {                                                                                           \
        K_DEV_IN float *r_ = in + (t_) * p.in_stride;                                              \
        K_UNROLL for (k_u32 q_ = 0; q_ < 2u; q_++) {                                              \
            const k_u32 c_ = K_TID + q_ * K_TG_SIZE, m_ = K_TID + q_ * K_TG_SIZE;                   \
            NX[q_] = c_ < nch ? K_LD(r_, K_GDN_SEQ_CH_(c_)) : 0.0f;                                 \
            ZV[q_] = m_ < d ? K_LD(r_, p.z_off + j * d + m_) : 0.0f;                                 \
        }                                                                                          \
        AB[0] = K_LD(r_, p.ab_off + j), AB[1] = K_LD(r_, p.ab_off + p.n_v + j);                     \
    } while (0)
    /* a row's output o S q / sqrt(d): to `on` for the gated norm below, or
     * (split) raw to o for gdn_norm */
#define K_GDN_SEQ_OUT_(m, v)                                                                       \
    do {                                                                                           \
        if (G > 1u) K_ST(o_raw, t * p.o_stride + j * d + (m), (v));                                \
        else K_ST(on, (m), (v));                                                                   \
    } while (0)
    K_DEV float *const o_raw = o; /* the rows loops name their sums o */
    /* The conv of the thread's first two channels (c = tid, tid + tgs) in
     * registers: their taps, and the window of the k - 1 inputs before
     * the token (win[q][kk] = the input of position t - (k - 1) + kk;
     * before token 0 the stored state rows), shifted by one after each
     * token. The values gdn_conv reads from the state and from earlier
     * rows of `in`, without a device-memory wait per token. Channels
     * past 2 tgs (d > 170 at 256 threads) read them as before. */
    float cwr[2][K_GDN_MAX_CONV], win[2][K_GDN_MAX_CONV];
    K_UNROLL for (k_u32 q = 0; q < 2u; q++) {
        const k_u32 c = K_TID + q * K_TG_SIZE;
        K_UNROLL for (k_u32 kk = 0; kk < K_GDN_MAX_CONV; kk++) {
            const int tap = c < nch && kk < p.k;
            cwr[q][kk] = tap ? K_LD(cw, K_GDN_SEQ_CH_(c) * p.k + kk) : 0.0f;
            win[q][kk] = tap && kk + 1u < p.k ? K_LD(conv, cin + kk * cd + K_GDN_SEQ_CH_(c)) : 0.0f;
        }
    }
    /* Barriers. Per token two: B1 after the conv (its outputs complete),
     * B2 after the l2 norms' SIMD-group partials; the split kernel needs
     * no third one, because the conv outputs are double-buffered by token
     * parity: a thread writes half (t + 1) & 1 only after B2 of token t,
     * which every thread passed after its reads of token t - 1's half,
     * and the rows of token t read half t & 1 alone. `part` is written
     * after B1 of a token and read after its B2: a thread reaching the
     * next token's writes has passed B1 of it, after every thread's reads.
     * The unsplit kernel's gated norm (on, npart) keeps its barriers. */
    float nx[2], zv[2], abv[2];
    K_GDN_SEQ_FETCH_(0u, nx, zv, abv);
    for (k_u32 t = 0; t < p.n_tok; t++) {
        const k_u32 hb = (t & 1u) * K_GDN_MAX_D; /* this token's half of qn / kn / vn */
        float nx1[2] = {0.0f, 0.0f}, zv1[2] = {0.0f, 0.0f}, abv1[2] = {0.0f, 0.0f};
        if (t + 1u < p.n_tok) K_GDN_SEQ_FETCH_(t + 1u, nx1, zv1, abv1); /* uniform */
        /* the token's gates (gdn_delta's expressions), ahead of the barriers */
        const float beta = 1.0f / (1.0f + k_exp(-abv[0]));
        const float a = abv[1] + dt_bias;
        const float sp = a > 20.0f ? a : k_log(1.0f + k_exp(a)); /* ggml's softplus */
        const float decay = k_exp(ssm_a * sp);
        /* the conv (gdn_conv) of the local channels: taps oldest -> newest */
        K_UNROLL for (k_u32 q = 0; q < 2u; q++) {
            const k_u32 c = K_TID + q * K_TG_SIZE;
            if (c >= nch) continue;
            float acc = 0.0f;
            K_UNROLL for (k_u32 kk = 0; kk < K_GDN_MAX_CONV; kk++)
                if (kk < p.k) acc += cwr[q][kk] * (kk + 1u < p.k ? win[q][kk] : nx[q]);
#ifndef PLANT_GDN_SEQ_STALE_CONV /* planted fault (tests must turn red): the window never moves */
            K_UNROLL for (k_u32 kk = 0; kk + 1u < K_GDN_MAX_CONV; kk++) {
                if (kk + 2u < p.k) win[q][kk] = win[q][kk + 1u];
                else if (kk + 2u == p.k) win[q][kk] = nx[q];
            }
#endif
            const float y = acc / (1.0f + k_exp(-acc));
            if (c < d) K_ST(qn, hb + c, y);
            else if (c < 2u * d) K_ST(kn, hb + c - d, y);
            else K_ST(vn, hb + m0 + (c - 2u * d), y);
        }
        for (k_u32 c = K_TID + 2u * K_TG_SIZE; c < nch; c += K_TG_SIZE) {
            const k_u32 ch = K_GDN_SEQ_CH_(c);
            float seq[K_GDN_MAX_CONV];
            K_UNROLL for (k_u32 kk = 0; kk < K_GDN_MAX_CONV; kk++) {
#ifdef PLANT_GDN_SEQ_STALE_CONV
                const int pos = (int)kk - (int)(p.k - 1u);
#else
                const int pos = (int)t + (int)kk - (int)(p.k - 1u);
#endif
                seq[kk] = kk >= p.k  ? 0.0f
                          : pos >= 0 ? K_LD(in, (k_u32)pos * p.in_stride + ch)
                                     : K_LD(conv, cin + (k_u32)((int)p.k - 1 + pos) * cd + ch);
            }
            float acc = 0.0f;
            K_UNROLL for (k_u32 kk = 0; kk < K_GDN_MAX_CONV; kk++)
                if (kk < p.k) acc += K_LD(cw, ch * p.k + kk) * seq[kk];
            const float y = acc / (1.0f + k_exp(-acc));
            if (c < d) K_ST(qn, hb + c, y);
            else if (c < 2u * d) K_ST(kn, hb + c - d, y);
            else K_ST(vn, hb + m0 + (c - 2u * d), y);
        }
        K_BARRIER(); /* B1 */
        /* k_gdn_l2norm2 on q and k, operation for operation, with the
         * scaled values kept in registers (lane's elements c 32 + lane)
         * instead of stored back: its third barrier goes */
        float sa = 0.0f, sb = 0.0f;
        for (k_u32 i = K_TID; i < d; i += K_TG_SIZE)
            sa += K_LD(qn, hb + i) * K_LD(qn, hb + i), sb += K_LD(kn, hb + i) * K_LD(kn, hb + i);
        sa = k_simd_sum(sa), sb = k_simd_sum(sb);
        if (K_LANE == 0u) K_ST(part, K_SIMD, sa), K_ST(part, nw + K_SIMD, sb);
        K_BARRIER(); /* B2 */
        float ta = 0.0f, tb = 0.0f;
        for (k_u32 g = 0; g < nw; g++) ta += K_LD(part, g), tb += K_LD(part, nw + g);
        const float nf = (float)d, s2 = 1.0f / k_sqrt(nf);
        const float ca = 1.0f / k_sqrt(ta / nf + p.eps / nf), cb = 1.0f / k_sqrt(tb / nf + p.eps / nf);
        float qr[K_GDN_MAX_D / 32], kr[K_GDN_MAX_D / 32];
        K_UNROLL for (k_u32 c = 0; c < K_GDN_MAX_D / 32; c++) {
            const k_u32 i = c * 32u + K_LANE;
            qr[c] = c < per && i < d ? (K_LD(qn, hb + i) * ca) * s2 : 0.0f;
            kr[c] = c < per && i < d ? (K_LD(kn, hb + i) * cb) * s2 : 0.0f;
        }
        /* rows in registers: gdn_delta's operations on st[r] */
        k_gdn_cols kc, qc;
        K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) kc.e[c] = kr[c], qc.e[c] = qr[c];
        K_UNROLL for (k_u32 r = 0; r < K_GDN_SEQ_RPS; r++) {
            const k_u32 m = m0 + K_SIMD + r * K_NSIMD;
            if (r >= reg_rows || m >= m1) continue; /* uniform per SIMD-group */
            const k_gdn_row_step_t R = k_gdn_row_step(st[r], kc, qc, K_LD(vn, hb + m), beta, decay, per, d, K_LANE);
            st[r] = R.st;
            if (K_LANE == 0u) K_GDN_SEQ_OUT_(m, R.o * oscale);
        }
        /* the other rows in device memory: gdn_delta's loop verbatim */
        for (k_u32 m = m0 + K_SIMD + reg_rows * K_NSIMD; m < m1; m += K_NSIMD) {
            K_DEV float *Sm = S + m * d;
            float rw[K_GDN_MAX_D / 32];
            float u = 0.0f;
            K_UNROLL for (k_u32 c = 0; c < K_GDN_MAX_D / 32; c++) {
                const k_u32 i = c * 32u + K_LANE;
                rw[c] = 0.0f;
                if (c < per && i < d) {
                    rw[c] = K_LD(Sm, i) * decay;
                    u += rw[c] * kr[c];
                }
            }
            u = k_simd_sum(u);
            const float dm = (K_LD(vn, hb + m) - u) * beta;
            float o = 0.0f;
            K_UNROLL for (k_u32 c = 0; c < K_GDN_MAX_D / 32; c++) {
                const k_u32 i = c * 32u + K_LANE;
                if (c < per && i < d) {
                    rw[c] = rw[c] + kr[c] * dm;
                    K_ST(Sm, i, rw[c]);
                    o += rw[c] * qr[c];
                }
            }
            o = k_simd_sum(o);
            if (K_LANE == 0u) K_GDN_SEQ_OUT_(m, o * oscale);
        }
        K_UNROLL for (k_u32 q = 0; q < 2u; q++) nx[q] = nx1[q];
        if (G > 1u) { /* uniform: gdn_norm finishes the raw rows */
            K_UNROLL for (k_u32 q = 0; q < 2u; q++) zv[q] = zv1[q], abv[q] = abv1[q];
            continue;
        }
        K_BARRIER(); /* every row of `on` written */
        /* gated RMSNorm (gdn_delta's): rmsnorm(o) * norm_w * SiLU(z) */
        float ss = 0.0f;
        for (k_u32 m = K_TID; m < d; m += K_TG_SIZE) ss += K_LD(on, m) * K_LD(on, m);
        const float mean = k_tg_sum(ss, npart, K_TID, K_TG_SIZE) / (float)d;
        const float scale = 1.0f / k_sqrt(mean + p.eps);
        for (k_u32 m = K_TID, q = 0; m < d; m += K_TG_SIZE, q++) {
            const float zm = q == 0u ? zv[0] : q == 1u ? zv[1] : K_LD(in, t * p.in_stride + p.z_off + j * d + m);
            const float y = (K_LD(on, m) * scale) * K_LD(hp, 2u * p.n_v + m);
            K_ST(o, t * p.o_stride + j * d + m, y * (zm / (1.0f + k_exp(-zm))));
        }
        K_UNROLL for (k_u32 q = 0; q < 2u; q++) zv[q] = zv1[q], abv[q] = abv1[q];
    }
    K_UNROLL for (k_u32 r = 0; r < K_GDN_SEQ_RPS; r++) {
        const k_u32 m = m0 + K_SIMD + r * K_NSIMD;
        if (r >= reg_rows || m >= m1) continue;
        K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {
            const k_u32 i = c * 32u + K_LANE;
            if (c < per && i < d) K_ST(S, m * d + i, st[r].e[c]);
        }
    }
    /* the conv state after the last token: the window's last k - 1 rows,
     * written by this head for its v channels and, for its k head's q/k
     * channels, by head kh alone (j == kh exactly when j < n_k) */
    for (k_u32 c = K_TID; c < nch; c += K_TG_SIZE) {
        if (c < 2u * d && (j >= p.n_k || m0 != 0u)) continue;
        const k_u32 ch = K_GDN_SEQ_CH_(c);
        for (k_u32 kk = 0; kk + 1u < p.k; kk++) {
            const int pos = (int)p.n_tok - (int)(p.k - 1u) + (int)kk;
            const float v = pos >= 0 ? K_LD(in, (k_u32)pos * p.in_stride + ch)
                                     : K_LD(conv, cin + (k_u32)((int)p.k - 1 + pos) * cd + ch);
            K_ST(conv, cout + kk * cd + ch, v);
        }
    }
#undef K_GDN_SEQ_CH_
#undef K_GDN_SEQ_FETCH_
#undef K_GDN_SEQ_OUT_
}

/* gdn_seq's gated RMSNorm after a split run (table.h gdn_norm): one
 * threadgroup per (value head K_GX, token K_GY), in place on o's raw rows.
 * gdn_delta's norm operation for operation at the same threadgroup size:
 * each thread reads its own elements m = tid, tid + tgs, ... (so it alone
 * writes them back: no other thread's value is overwritten before it is
 * read), the sum of squares in that order, then k_tg_sum. */
K_KERNEL(gdn_norm) {
    K_CHECK_TAG(gdn_norm);
    if (p.d == 0u || p.d > K_GDN_MAX_D || p.o_stride < p.n_v * p.d || p.z_off + p.n_v * p.d > p.in_stride ||
        K_TG_SIZE > 1024u) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(float, part, 32);
    const k_u32 j = K_GX, t = K_GY, d = p.d;
    if (j >= p.n_v || t >= p.n_tok) return; /* a whole threadgroup */
    const k_u32 ob = t * p.o_stride + j * d, zb = t * p.in_stride + p.z_off + j * d;
    float ss = 0.0f;
    for (k_u32 m = K_TID; m < d; m += K_TG_SIZE) ss += K_LD(o, ob + m) * K_LD(o, ob + m);
    const float mean = k_tg_sum(ss, part, K_TID, K_TG_SIZE) / (float)d;
    const float scale = 1.0f / k_sqrt(mean + p.eps);
    for (k_u32 m = K_TID; m < d; m += K_TG_SIZE) {
        const float zm = K_LD(in, zb + m);
        const float y = (K_LD(o, ob + m) * scale) * K_LD(hp, 2u * p.n_v + m);
        K_ST(o, ob + m, y * (zm / (1.0f + k_exp(-zm))));
    }
}

/* gdn_norm followed by the out projection's quantizer, in one launch
 * (table.h gdn_norm_quant; a decode step's GDN layer had gdn_norm then
 * quantize_q8_K / _q8_0, each a few microseconds of mostly launch).
 * Threadgroup (K_GX, token K_GY) of 256 threads takes the 256 values
 * 256 K_GX + tid of o's row: element m = e % d of head e / d.
 * Why these are gdn_norm's bits at its threadgroup of 256: there a thread m
 * < d held element m alone (d <= 256), SIMD-group m / 32's butterfly summed
 * the squares, and k_tg_sum added the 8 partials in ascending order after 0,
 * the partials of SIMD-groups past d / 32 being +0.0 (threads without an
 * element), which leave a sum of squares unchanged. Here a head's elements
 * sit in d / 32 consecutive SIMD-groups, element m in lane m % 32, and its
 * partials are added in ascending order after 0: the same additions. Each
 * thread then computes its y with gdn_norm's expression and stores it, and
 * the quantizer runs on the stored row's values: Q8_0, each SIMD-group's 32
 * values are one block (k_q8_0_store, quantize_q8_0's body); Q8_K, the 256
 * values are one block: every SIMD-group reads them back from threadgroup
 * memory, finds the block's max (k_q8_K_block_max: a total order, so all
 * eight find quantize_q8_K's winner) and writes its own 32-value chunk
 * (k_q8_K_chunk). */
K_KERNEL(gdn_norm_quant) {
    K_CHECK_TAG(gdn_norm_quant);
    K_TG_ARRAY(float, part, 8);
    K_TG_ARRAY(float, ys, 256);
    const k_u32 d = p.d, fl = p.flags;
    if (K_TG_SIZE != 256u || d == 0u || d % 32u || 256u % d || (p.n_v * d) % 256u || p.o_stride < p.n_v * d ||
        p.z_off + p.n_v * d > p.in_stride || !(fl & (K_NQ_Q8_0 | K_NQ_Q8_K))) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 blk = K_GX, t = K_GY, nbk = p.n_v * d / 256u;
    if (blk >= nbk || t >= p.n_tok) return; /* a whole threadgroup */
    const k_u32 e = 256u * blk + K_TID, m = e % d, ob = t * p.o_stride + e;
    const float ov = K_LD(o, ob);
    float ss = 0.0f;
    ss += ov * ov;
    ss = k_simd_sum(ss);
    if (K_LANE == 0u) K_ST(part, K_SIMD, ss);
    K_BARRIER();
    const k_u32 gs = d / 32u, g0 = K_SIMD / gs * gs; /* the head's SIMD-groups */
    float s = 0.0f;
    for (k_u32 g = 0; g < gs; g++) s += K_LD(part, g0 + g);
    const float scale = 1.0f / k_sqrt(s / (float)d + p.eps);
    const float zm = K_LD(in, t * p.in_stride + p.z_off + e);
    const float y = (ov * scale) * K_LD(hp, 2u * p.n_v + m);
    const float yo = y * (zm / (1.0f + k_exp(-zm)));
    K_ST(o, ob, yo);
    if (fl & K_NQ_Q8_0) k_q8_0_store(yo, K_LANE, q8, (t * (p.n_v * d / 32u) + e / 32u) * 34u);
    if (!(fl & K_NQ_Q8_K)) return; /* uniform: params */
    K_ST(ys, K_TID, yo);
#ifndef PLANT_GDN_NQ_NO_BARRIER /* planted fault (tests must turn red): ys read unsynchronised */
    K_BARRIER();
#endif
    k_q8_K_lanes X;
    K_UNROLL for (k_u32 i = 0; i < 8u; i++) X.v[i] = K_LD(ys, K_LANE + 32u * i);
    const k_q8_K_win W = k_q8_K_block_max(X, K_LANE);
    k_q8_K_chunk(yo, W.amax, W.mx, K_LANE, K_SIMD, qk, (t * nbk + blk) * 292u);
}

/* gdn_prep (table.h): token t's conv, q/k L2 norms and gates for every
 * token of a run at once, gdn_seq's operations in its thread mapping. */
K_KERNEL(gdn_prep) {
    K_CHECK_TAG(gdn_prep);
    const k_u32 d = p.d, cd = (2u * p.n_k + p.n_v) * d, nk = p.n_k;
    if (d == 0u || d > K_GDN_MAX_D || nk == 0u || p.n_v < nk || p.k < 2u || p.k > K_GDN_MAX_CONV ||
        p.n_tok == 0u || p.cur > 1u || p.z_off < cd || p.ab_off < p.z_off + p.n_v * d || K_TG_SIZE > 1024u ||
        K_NGX < nk + p.n_v || K_NGY < p.n_tok) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    K_TG_ARRAY(float, part, 64);
    const k_u32 g = K_GX, t = K_GY;
    if (g >= nk + p.n_v || t >= p.n_tok) return; /* a whole threadgroup */
    const k_u32 cin = p.cur * (p.k - 1u) * cd, cout = (1u - p.cur) * (p.k - 1u) * cd;
    K_DEV float *row = pq + t * K_GDN_PQ_STRIDE(nk, p.n_v, d);
    /* gdn_conv's value of channel ch at token t: taps oldest -> newest over
     * [the stored state ; rows of in], then SiLU */
#define K_GDN_PREP_CONV_(ch, y)                                                                    \
    do {                                                                                           \
        float acc_ = 0.0f;                                                                         \
        for (k_u32 kk = 0; kk < p.k; kk++) {                                                       \
            const int pos = (int)t + (int)kk - (int)(p.k - 1u);                                    \
            const float x_ = pos >= 0 ? K_LD(in, (k_u32)pos * p.in_stride + (ch))                   \
                                      : K_LD(conv, cin + (k_u32)((int)p.k - 1 + pos) * cd + (ch));  \
            acc_ += K_LD(cw, (ch) * p.k + kk) * x_;                                                \
        }                                                                                          \
        (y) = acc_ / (1.0f + k_exp(-acc_));                                                        \
    } while (0)
    k_u32 c0, c1; /* this threadgroup's channels: [c0, c0 + d) and, for a k head, [c1, c1 + d) */
    if (g < nk) {
        /* q and k of k head g, then k_gdn_l2norm2's sums: thread tid's
         * elements tid, tid + tgs, ... in ascending order, butterfly per
         * SIMD-group, the partials in ascending order */
        c0 = g * d, c1 = (nk + g) * d;
        float yq[K_GDN_MAX_D / 32], yk[K_GDN_MAX_D / 32];
        float sa = 0.0f, sb = 0.0f;
        K_UNROLL for (k_u32 e = 0; e < K_GDN_MAX_D / 32; e++) {
            const k_u32 i = K_TID + e * K_TG_SIZE;
            yq[e] = 0.0f, yk[e] = 0.0f;
            if (i < d) {
                K_GDN_PREP_CONV_(c0 + i, yq[e]);
                K_GDN_PREP_CONV_(c1 + i, yk[e]);
                sa += yq[e] * yq[e], sb += yk[e] * yk[e];
            }
        }
        sa = k_simd_sum(sa), sb = k_simd_sum(sb);
        const k_u32 nw = K_TG_SIZE >> 5;
        if (K_LANE == 0u) K_ST(part, K_SIMD, sa), K_ST(part, nw + K_SIMD, sb);
        K_BARRIER();
        float ta = 0.0f, tb = 0.0f;
        for (k_u32 w = 0; w < nw; w++) ta += K_LD(part, w), tb += K_LD(part, nw + w);
        const float nf = (float)d, s2 = 1.0f / k_sqrt(nf);
        const float ca = 1.0f / k_sqrt(ta / nf + p.eps / nf), cb = 1.0f / k_sqrt(tb / nf + p.eps / nf);
        K_UNROLL for (k_u32 e = 0; e < K_GDN_MAX_D / 32; e++) {
            const k_u32 i = K_TID + e * K_TG_SIZE;
            if (i < d) K_ST(row, c0 + i, (yq[e] * ca) * s2), K_ST(row, c1 + i, (yk[e] * cb) * s2);
        }
    } else {
        /* v of value head j and its gates */
        const k_u32 j = g - nk;
        c0 = (2u * nk + j) * d, c1 = c0;
        for (k_u32 i = K_TID; i < d; i += K_TG_SIZE) {
            float y;
            K_GDN_PREP_CONV_(c0 + i, y);
            K_ST(row, c0 + i, y);
        }
        if (K_TID == 0u) {
            K_DEV_IN float *r_ = in + t * p.in_stride;
            const float beta = 1.0f / (1.0f + k_exp(-K_LD(r_, p.ab_off + j)));
            const float a = K_LD(r_, p.ab_off + p.n_v + j) + K_LD(hp, p.n_v + j);
            const float sp = a > 20.0f ? a : k_log(1.0f + k_exp(a)); /* ggml's softplus */
            K_ST(row, cd + j, beta);
            K_ST(row, cd + p.n_v + j, k_exp(K_LD(hp, j) * sp));
        }
    }
#undef K_GDN_PREP_CONV_
    /* the conv state after the last token (gdn_seq's), each channel once */
    if (t + 1u == p.n_tok)
        for (k_u32 c = K_TID; c < (g < nk ? 2u * d : d); c += K_TG_SIZE) {
            const k_u32 ch = c < d ? c0 + c : c1 + (c - d);
            for (k_u32 kk = 0; kk + 1u < p.k; kk++) {
                const int pos = (int)p.n_tok - (int)(p.k - 1u) + (int)kk;
                const float v = pos >= 0 ? K_LD(in, (k_u32)pos * p.in_stride + ch)
                                         : K_LD(conv, cin + (k_u32)((int)p.k - 1 + pos) * cd + ch);
                K_ST(conv, cout + kk * cd + ch, v);
            }
        }
}

/* One token's inputs to gdn_rows (q^, k^ elements of the lane, v of the
 * SIMD-group's rows, beta, decay). */
typedef struct {
    k_gdn_cols q, k;
    float v[K_GDN_ROWS_MAX], beta, decay;
} k_gdn_rows_in;

/* gdn_rows (table.h): p.rows state rows of one value head per
 * SIMD-group through n_tok tokens, gdn_seq's row operations (lane l holds
 * elements c 32 + l of a row, c < ceil(d / 32)) on pq's token rows, which
 * do not depend on the recurrence and are loaded K_GDN_AHEAD tokens ahead. */
K_KERNEL(gdn_rows) {
    K_CHECK_TAG(gdn_rows);
    const k_u32 d = p.d, per = (d + 31u) / 32u, R = p.rows;
    if (d == 0u || per > K_GDN_SEQ_COLS || p.n_k == 0u || p.n_v < p.n_k || p.n_tok == 0u || p.o_stride < p.n_v * d ||
        R == 0u || R > K_GDN_ROWS_MAX || K_NGX * K_NSIMD < K_GDN_ROWS_WARPS(p.n_v, d, R)) {
        k_raise(status, K_ERR_SHAPE);
        return;
    }
    const k_u32 wi = K_GX * K_NSIMD + K_SIMD, wph = (d + R - 1u) / R; /* SIMD-groups a head */
    if (wi >= K_GDN_ROWS_WARPS(p.n_v, d, R)) return; /* a whole SIMD-group: no barrier here */
    const k_u32 j = wi / wph, kh = j % p.n_k, m0 = (wi % wph) * R; /* tiled (spec §3.8, pitfall 3) */
    const k_u32 qs = K_GDN_PQ_STRIDE(p.n_k, p.n_v, d), cd = (2u * p.n_k + p.n_v) * d;
    K_DEV float *S = s + j * d * d;
    k_gdn_cols st[K_GDN_ROWS_MAX];
    K_UNROLL for (k_u32 r = 0; r < K_GDN_ROWS_MAX; r++)
        K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {
            const k_u32 i = c * 32u + K_LANE;
            st[r].e[c] = r < R && m0 + r < d && c < per && i < d ? K_LD(S, (m0 + r) * d + i) : 0.0f;
        }
    const float oscale = 1.0f / k_sqrt((float)d);
    /* token t's inputs: q^ and k^ (the lane's elements), v of the rows,
     * beta, decay; a clamped t reads the last token (uniform: no branch) */
#define K_GDN_ROWS_FETCH_(t_, X)                                                                   \
    do {                                                                                           \
        const k_u32 tc_ = (t_) < p.n_tok ? (t_) : p.n_tok - 1u;                                    \
        K_DEV_IN float *r_ = pq + tc_ * qs;                                                        \
        K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {                                     \
            const k_u32 i = c * 32u + K_LANE;                                                      \
            X.q.e[c] = c < per && i < d ? K_LD(r_, kh * d + i) : 0.0f;                             \
            X.k.e[c] = c < per && i < d ? K_LD(r_, (p.n_k + kh) * d + i) : 0.0f;                   \
        }                                                                                          \
        K_UNROLL for (k_u32 r = 0; r < K_GDN_ROWS_MAX; r++)                                        \
            X.v[r] = r < R && m0 + r < d ? K_LD(r_, (2u * p.n_k + j) * d + m0 + r) : 0.0f;         \
        X.beta = K_LD(r_, cd + j), X.decay = K_LD(r_, cd + p.n_v + j);                             \
    } while (0)
#ifdef PLANT_GDN_ROWS_LAG
    /* planted fault (tests must turn red): each token after the first
     * meets the previous token's inputs */
#define K_GDN_ROWS_SRC_(t_) ((t_) > 0u ? (t_) - 1u : 0u)
#else
#define K_GDN_ROWS_SRC_(t_) (t_)
#endif
    /* Tokens go in groups of K_GDN_AHEAD: a group's inputs are loaded
     * while the group before it runs, so a load has a whole group's steps
     * (each a latency chain of two butterflies) to arrive in. */
    k_gdn_rows_in cur[K_GDN_AHEAD], nxt[K_GDN_AHEAD];
    K_UNROLL for (k_u32 a = 0; a < K_GDN_AHEAD; a++) K_GDN_ROWS_FETCH_(K_GDN_ROWS_SRC_(a), cur[a]);
#if K_GDN_ROWS_PIPE
    /* Pipelined: token t's S.q butterfly runs beside token t + 1's S.k one
     * (k_simd_sum2: each value's own butterfly), so the o reduction, which
     * the recurrence does not wait for, no longer sits between two u
     * reductions. The same operations on the same values as
     * k_gdn_row_step, token by token. */
    float u[K_GDN_ROWS_MAX];
    K_UNROLL for (k_u32 r = 0; r < K_GDN_ROWS_MAX; r++) {
        u[r] = 0.0f;
        if (r >= R || m0 + r >= d) continue; /* uniform per SIMD-group */
        const k_gdn_half_t h = k_gdn_row_decay_part(st[r], cur[0].k, cur[0].decay, per, d, K_LANE);
        st[r] = h.st;
        u[r] = k_simd_sum(h.part);
    }
#endif
    for (k_u32 t0 = 0; t0 < p.n_tok; t0 += K_GDN_AHEAD) {
        K_UNROLL for (k_u32 a = 0; a < K_GDN_AHEAD; a++)
            K_GDN_ROWS_FETCH_(K_GDN_ROWS_SRC_(t0 + K_GDN_AHEAD + a), nxt[a]);
        K_UNROLL for (k_u32 a = 0; a < K_GDN_AHEAD; a++) {
            const k_u32 t = t0 + a;
            if (t >= p.n_tok) continue; /* uniform */
#if K_GDN_ROWS_PIPE
            const k_gdn_rows_in nx = a + 1u < K_GDN_AHEAD ? cur[a + 1u] : nxt[0];
            const int more = t + 1u < p.n_tok; /* uniform */
#endif
            K_UNROLL for (k_u32 r = 0; r < K_GDN_ROWS_MAX; r++) {
                const k_u32 m = m0 + r;
                if (r >= R || m >= d) continue; /* uniform per SIMD-group */
#if K_GDN_ROWS_PIPE
                const k_gdn_half_t h =
                    k_gdn_row_update_part(st[r], cur[a].k, cur[a].q, (cur[a].v[r] - u[r]) * cur[a].beta, per, d, K_LANE);
                float ov;
                if (more) {
                    const k_gdn_half_t g = k_gdn_row_decay_part(h.st, nx.k, nx.decay, per, d, K_LANE);
                    st[r] = g.st;
                    const k_f32x2 ou = k_simd_sum2(h.part, g.part);
                    ov = ou.a, u[r] = ou.b;
                } else {
                    st[r] = h.st;
                    ov = k_simd_sum(h.part);
                }
                if (K_LANE == 0u) K_ST(o, t * p.o_stride + j * d + m, ov * oscale);
#else
                const k_gdn_row_step_t Rs =
                    k_gdn_row_step(st[r], cur[a].k, cur[a].q, cur[a].v[r], cur[a].beta, cur[a].decay, per, d, K_LANE);
                st[r] = Rs.st;
                if (K_LANE == 0u) K_ST(o, t * p.o_stride + j * d + m, Rs.o * oscale);
#endif
            }
        }
        K_UNROLL for (k_u32 a = 0; a < K_GDN_AHEAD; a++) cur[a] = nxt[a];
    }
#undef K_GDN_ROWS_SRC_
#undef K_GDN_ROWS_FETCH_
    K_UNROLL for (k_u32 r = 0; r < K_GDN_ROWS_MAX; r++)
        K_UNROLL for (k_u32 c = 0; c < K_GDN_SEQ_COLS; c++) {
            const k_u32 i = c * 32u + K_LANE;
            if (r < R && m0 + r < d && c < per && i < d) K_ST(S, (m0 + r) * d + i, st[r].e[c]);
        }
}
