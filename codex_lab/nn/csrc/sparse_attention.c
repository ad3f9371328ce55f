/* Fused block-sparse attention for the CPU in fp32: forward and backward, one task per
 * (batch-head, query unit), driven by a segment table built once per (pattern, N).
 *
 * Python side: codex_lab/nn/sparse_native.py (builds this file with the system C compiler,
 * loads it with ctypes, builds the table). The readable kernel is "blocks" in
 * codex_lab/nn/sparse.py; the tests hold this one equal to it and to the reference.
 *
 * Layout (row-major, contiguous): q, out, dout, dq (BH, nu*rows, D): query unit u of
 * batch-head b is rows (b*nu + u)*rows .. +rows; lse, delta (BH, nu*rows); k, v, dk, dv
 * (BH, n_keys, D). Unit u may see the keys of segments seg_ptr[u] .. seg_ptr[u+1]-1:
 * keys seg_start .. seg_start + seg_len - 1, under the additive mask masks[seg_mask ..]
 * of shape (rows, seg_len) when seg_mask >= 0 (0 = attend, NEG = not), unmasked otherwise.
 * A segment is at most max_keys long (the table splits longer runs).
 *
 * Matrix products go to the BLAS sgemm_ that libtorch_cpu exports (MKL on x86), one call
 * per (task, segment); called from inside the OpenMP region they run single-threaded.
 * BLAS is column-major: a row-major (r x c) matrix is the column-major (c x r) transpose.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>

/* masked scores and "no key yet" use this finite stand-in for -inf, so that a row with no
 * key computes no inf - inf; exp_neg(NEG - max) is exactly 0. NaN keeps its meaning (the
 * file is built with -fno-finite-math-only): a NaN score makes its row's output NaN. */
#define NEG (-1e30f)
#define NONE (-1e29f)

void sgemm_(const char *transa, const char *transb, const int *m, const int *n, const int *k,
            const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
            const float *beta, float *c, const int *ldc);

/* exp(x) for x <= 0 (scores minus their row max or log-sum-exp), in a form the compiler
 * vectorises: x = k ln2 + f with |f| <= ln2 / 2, exp(f) by its degree-6 Taylor polynomial
 * (relative error below 2e-7 there), times 2^k put in the exponent bits; x < -87 (masked
 * scores, near NEG) gives exactly 0 */
static inline float exp_neg(float x) {
    float xc = x < -87.0f ? -87.0f : x;
    /* k = round(x / ln2) */
    float kf = __builtin_roundf(xc * 1.44269504088896341f);
    /* f = x - k ln2, with ln2 split in two parts for precision (Cody-Waite) */
    float f = xc - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.6666667e-1f + f * (4.1666668e-2f + f * (8.3333338e-3f + f * 1.3888889e-3f)))));
    int32_t bits = ((int32_t)kf + 127) << 23; /* 2^k */
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return x < -87.0f ? 0.0f : p * two_k;
}

/* max(m, s[0..n-1]). Built assuming finite floats (this function only): the compiler then
 * vectorises the reduction. A NaN score may or may not be picked as the max; either way the
 * exp pass that follows turns its row to NaN (exp_neg(NaN - m) and exp_neg(s - NaN) are
 * NaN), so NaN still reaches the output. */
__attribute__((optimize("finite-math-only")))
static float row_max(const float *s, int64_t n, float m) {
    for (int64_t c = 0; c < n; c++) m = s[c] > m ? s[c] : m;
    return m;
}

/* C (r x len, leading dim ldc) = alpha * A (r x d) B^T, B (len x d) */
static void mm_abt(const float *a, const float *b, float *c, int r, int len, int d, int ldc, float alpha) {
    const float zero = 0.0f;
    sgemm_("T", "N", &len, &r, &d, &alpha, b, &d, a, &d, &zero, c, &ldc);
}

/* C (r x d) = beta * C + A (r x len, leading dim lda) B, B (len x d) */
static void mm_ab(const float *a, const float *b, float *c, int r, int len, int d, int lda, float beta) {
    const float one = 1.0f;
    sgemm_("N", "N", &d, &r, &len, &one, b, &d, a, &lda, &beta, c, &d);
}

/* C (len x d) += A^T B, A (r x len, leading dim lda), B (r x d) */
static void mm_atb(const float *a, const float *b, float *c, int r, int len, int d, int lda) {
    const float one = 1.0f;
    sgemm_("N", "T", &d, &len, &r, &one, b, &d, a, &lda, &one, c, &d);
}

/* S (rows x len, leading dim lds) += the segment's additive mask */
static void add_mask(float *s, const float *mask, int64_t rows, int64_t len, int64_t lds) {
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        const float *mr = mask + r * len;
        for (int64_t c = 0; c < len; c++) sr[c] += mr[c];
    }
}

/* Forward: out = softmax(scale q K^T + mask) V over the unit's segments, lse = the row
 * log-sum-exp (0 with out = 0 for a row that sees no key). Segments are taken in chunks
 * of up to max_keys columns; each chunk updates the row max m, sum l and output acc the
 * online-softmax way. Returns 0, or 1 when a buffer could not be allocated. */
int sparse_fwd(const float *q, const float *k, const float *v, float *out, float *lse,
               int64_t bh, int64_t nu, int64_t rows, int64_t n_keys, int64_t d, float scale,
               const int64_t *seg_ptr, const int64_t *seg_start, const int64_t *seg_len,
               const int64_t *seg_mask, const float *masks, int64_t max_keys, int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)malloc(sizeof(float) * rows * max_keys);
        float *acc = (float *)malloc(sizeof(float) * rows * d);
        float *m = (float *)malloc(sizeof(float) * rows);
        float *l = (float *)malloc(sizeof(float) * rows);
        if (!s || !acc || !m || !l) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < bh * nu; t++) {
            if (failed) continue;
            int64_t b = t / nu, u = t % nu;
            const float *qt = q + t * rows * d;
            const float *kb = k + b * n_keys * d, *vb = v + b * n_keys * d;
            for (int64_t r = 0; r < rows; r++) { m[r] = NEG; l[r] = 0.0f; }
            int started = 0;
            int64_t i = seg_ptr[u], end = seg_ptr[u + 1];
            while (i < end) {
                /* a chunk: whole segments, at most max_keys columns */
                int64_t j = i, cols = 0;
                while (j < end && cols + seg_len[j] <= max_keys) { cols += seg_len[j]; j++; }
                int64_t off = 0;
                for (int64_t x = i; x < j; x++) {
                    /* S = scale q K_seg^T (+ mask) */
                    mm_abt(qt, kb + seg_start[x] * d, s + off, (int)rows, (int)seg_len[x], (int)d, (int)cols, scale);
                    if (seg_mask[x] >= 0) add_mask(s + off, masks + seg_mask[x], rows, seg_len[x], cols);
                    off += seg_len[x];
                }
                for (int64_t r = 0; r < rows; r++) {
                    float *sr = s + r * cols;
                    float mx = row_max(sr, cols, m[r]);
                    float sum = 0.0f;
                    /* p = exp(s - m_new); a row with no key so far keeps p = 0, except
                     * NaN scores (which no comparison picked as a max): they stay NaN, and
                     * so does the row's output */
                    if (mx < NONE) {
                        for (int64_t c = 0; c < cols; c++) { float z = sr[c] != sr[c] ? sr[c] : 0.0f; sr[c] = z; sum += z; }
                    } else {
                        for (int64_t c = 0; c < cols; c++) { float e = exp_neg(sr[c] - mx); sr[c] = e; sum += e; }
                    }
                    if (started) {
                        /* l = l exp(m_old - m_new) + sum(p); acc likewise rescaled */
                        float corr = m[r] < NONE ? 0.0f : exp_neg(m[r] - mx);
                        l[r] = l[r] * corr + sum;
                        float *ar = acc + r * d;
                        for (int64_t c = 0; c < d; c++) ar[c] *= corr;
                    } else {
                        l[r] = sum;
                    }
                    m[r] = mx;
                }
                off = 0;
                for (int64_t x = i; x < j; x++) {
                    /* acc += P_seg V_seg */
                    mm_ab(s + off, vb + seg_start[x] * d, acc, (int)rows, (int)seg_len[x], (int)d, (int)cols,
                          (started || x > i) ? 1.0f : 0.0f);
                    off += seg_len[x];
                }
                started = 1;
                i = j;
            }
            float *ot = out + t * rows * d;
            float *lt = lse + t * rows;
            for (int64_t r = 0; r < rows; r++) {
                float *orow = ot + r * d;
                if (!started || l[r] == 0.0f) {
                    for (int64_t c = 0; c < d; c++) orow[c] = 0.0f;
                    lt[r] = 0.0f;
                } else {
                    /* out = acc / l; lse = m + log(l) */
                    float inv = 1.0f / l[r];
                    const float *ar = acc + r * d;
                    for (int64_t c = 0; c < d; c++) orow[c] = ar[c] * inv;
                    lt[r] = m[r] + __builtin_logf(l[r]);
                }
            }
        }
        free(s); free(acc); free(m); free(l);
    }
    return failed;
}

/* One query unit's share of the backward (task t = b*nu + u), FlashAttention-2's, per
 * segment, from the saved lse: P = exp(scale q K^T + mask - lse), dV += P^T dO,
 * dP = dO V^T, dS = P (dP - delta) with delta = rowsum(dO * out), dQ = scale dS K (written),
 * dK += scale dS^T q into dkb/dvb (batch-head b's key gradients). p and dp: rows x max_keys. */
static void bwd_unit(const float *q, const float *k, const float *v, const float *dout, const float *lse,
                     const float *delta, float *dq, float *dkb, float *dvb, int64_t t, int64_t nu,
                     int64_t rows, int64_t n_keys, int64_t d, float scale, const int64_t *seg_ptr,
                     const int64_t *seg_start, const int64_t *seg_len, const int64_t *seg_mask,
                     const float *masks, float *p, float *dp) {
    int64_t b = t / nu, u = t % nu;
    const float *qt = q + t * rows * d, *dot = dout + t * rows * d;
    const float *lt = lse + t * rows, *dlt = delta + t * rows;
    const float *kb = k + b * n_keys * d, *vb = v + b * n_keys * d;
    float *dqt = dq + t * rows * d;
    memset(dqt, 0, sizeof(float) * rows * d);
    for (int64_t x = seg_ptr[u]; x < seg_ptr[u + 1]; x++) {
        int len = (int)seg_len[x];
        const float *ks = kb + seg_start[x] * d, *vs = vb + seg_start[x] * d;
        /* P = exp(scale q K^T + mask - lse) */
        mm_abt(qt, ks, p, (int)rows, len, (int)d, len, scale);
        if (seg_mask[x] >= 0) add_mask(p, masks + seg_mask[x], rows, len, len);
        for (int64_t r = 0; r < rows; r++) {
            float *pr = p + r * len;
            float lr = lt[r];
            for (int64_t c = 0; c < len; c++) pr[c] = exp_neg(pr[c] - lr);
        }
        /* dV_seg += P^T dO */
        mm_atb(p, dot, dvb + seg_start[x] * d, (int)rows, len, (int)d, len);
        /* dP = dO V_seg^T */
        mm_abt(dot, vs, dp, (int)rows, len, (int)d, len, 1.0f);
        /* dS = scale P (dP - delta) (scale folded in once for dQ and dK) */
        for (int64_t r = 0; r < rows; r++) {
            float *pr = p + r * len;
            const float *dpr = dp + r * len;
            float dl = dlt[r];
            for (int64_t c = 0; c < len; c++) pr[c] = scale * pr[c] * (dpr[c] - dl);
        }
        /* dQ += dS K_seg; dK_seg += dS^T q */
        mm_ab(p, ks, dqt, (int)rows, len, (int)d, len, 1.0f);
        mm_atb(p, qt, dkb + seg_start[x] * d, (int)rows, len, (int)d, len);
    }
}

/* Backward over every (batch-head, query unit). Two query units of one batch-head may add
 * into the same keys' gradients, so with parts == 1 each task is a whole batch-head (its
 * units in order, one thread: no race, no extra memory; for bh >= threads), and otherwise
 * task t = b*nu + u adds into its thread's own copy dk_part/dv_part + i * bh*n_keys*d
 * (parts = threads copies, zeroed and summed over by the caller). dq is written. Returns 0,
 * or 1 on a failed allocation. */
int sparse_bwd(const float *q, const float *k, const float *v, const float *dout, const float *lse,
               const float *delta, float *dq, float *dk_part, float *dv_part,
               int64_t bh, int64_t nu, int64_t rows, int64_t n_keys, int64_t d, float scale,
               const int64_t *seg_ptr, const int64_t *seg_start, const int64_t *seg_len,
               const int64_t *seg_mask, const float *masks, int64_t max_keys, int threads, int parts) {
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *p = (float *)malloc(sizeof(float) * rows * max_keys);
        float *dp = (float *)malloc(sizeof(float) * rows * max_keys);
        if (!p || !dp) {
#pragma omp atomic write
            failed = 1;
        }
        int64_t part = parts == 1 ? 0 : (int64_t)omp_get_thread_num() * bh * n_keys * d;
        int64_t tasks = parts == 1 ? bh : bh * nu;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < tasks; i++) {
            if (failed) continue;
            int64_t first = parts == 1 ? i * nu : i, last = parts == 1 ? (i + 1) * nu : i + 1;
            for (int64_t t = first; t < last; t++) {
                int64_t b = t / nu;
                bwd_unit(q, k, v, dout, lse, delta, dq, dk_part + part + b * n_keys * d, dv_part + part + b * n_keys * d,
                         t, nu, rows, n_keys, d, scale, seg_ptr, seg_start, seg_len, seg_mask, masks, p, dp);
            }
        }
        free(p); free(dp);
    }
    return failed;
}
