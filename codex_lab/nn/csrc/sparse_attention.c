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

/* ---------------------------------------------------------------------------------------
 * Learned block sparsity (MoBA): every query token chose its own key blocks, so the work is
 * organised by key block (MoBA's own scheme): task (bk, j) = K/V head bk, key block j takes
 * every query row that chose block j (listed in a table built by moba_table) plus the rows
 * of block j itself (causally), and writes each row's partial result into that row's slot:
 * opart (n_rows, n_slots, D) for the K/V head being worked on (one head at a time, so that
 * it stays in cache until merged), lpart (BK, n_rows, n_slots) (slot n_slots-1 = the own
 * block). The slots of a row are then merged exactly through log-sum-exp. No two tasks write
 * the same (row, slot) or the same key block's gradients: no races, no atomics.
 *
 * Layout: q, out, dout, dq (BK, n_rows, D) with n_rows = g*n (the g query heads of K/V head
 * bk, each n tokens: row r is head r / n, token r % n); k, v, dk, dv (BK, n, D); block j =
 * keys j*bs .. min(n, (j+1)*bs) - 1. Table: task t = bk*nb + j lists rows
 * row_idx[task_ptr[t] .. task_ptr[t+1]-1] with their slots row_slot[...].
 * --------------------------------------------------------------------------------------- */

/* Counting sort of the choices sel (BK, n_rows, k_sel), -1 = none, into the task table:
 * task_ptr (BK*nb + 1), row_idx and row_slot (as many as the choices). Sequential, O(choices). */
void moba_table(const int64_t *sel, int64_t bk, int64_t n_rows, int64_t k_sel, int64_t nb,
                int64_t *task_ptr, int64_t *row_idx, int64_t *row_slot) {
    int64_t tasks = bk * nb;
    memset(task_ptr, 0, sizeof(int64_t) * (tasks + 1));
    for (int64_t b = 0; b < bk; b++)
        for (int64_t x = 0; x < n_rows * k_sel; x++) {
            int64_t j = sel[b * n_rows * k_sel + x];
            if (j >= 0) task_ptr[b * nb + j + 1]++;
        }
    for (int64_t t = 0; t < tasks; t++) task_ptr[t + 1] += task_ptr[t];
    int64_t *fill = (int64_t *)malloc(sizeof(int64_t) * (tasks > 0 ? tasks : 1));
    memcpy(fill, task_ptr, sizeof(int64_t) * tasks);
    for (int64_t b = 0; b < bk; b++)
        for (int64_t x = 0; x < n_rows * k_sel; x++) {
            int64_t j = sel[b * n_rows * k_sel + x];
            if (j < 0) continue;
            int64_t at = fill[b * nb + j]++;
            row_idx[at] = x / k_sel;
            row_slot[at] = x % k_sel;
        }
    free(fill);
}

/* rows of the own block computed at once: half a block (from 64 up), so that the first half
 * is scored against the first half of the keys only */
#define OWN_ROWS(bs) ((bs) >= 64 && (bs) % 2 == 0 ? (bs) / 2 : (bs))

/* causal mask of the own block: S (r x len) rows are tokens first .. first+r-1 of a block
 * whose keys start at key0; key c is allowed when key0 + c <= token */
static void mask_future(float *s, int64_t first, int64_t r, int64_t key0, int64_t len) {
    for (int64_t a = 0; a < r; a++)
        for (int64_t c = 0; c < len; c++)
            if (key0 + c > first + a) s[a * len + c] = NEG;
}

/* softmax partial of r rows of scores s (r x len): s <- exp(s - m), returns per row
 * m + log(sum) into lrow and 1/sum into inv */
static void partial_softmax(float *s, int64_t r, int64_t len, float *lrow, float *inv) {
    for (int64_t a = 0; a < r; a++) {
        float *sr = s + a * len;
        float mx = row_max(sr, len, NEG);
        float sum = 0.0f;
        for (int64_t c = 0; c < len; c++) { float e = exp_neg(sr[c] - mx); sr[c] = e; sum += e; }
        /* every row here holds at least one allowed key (its block, or its own token) */
        lrow[a] = mx + __builtin_logf(sum);
        inv[a] = 1.0f / sum;
    }
}

/* task (b, j) of the forward: the rows that chose block j of K/V head b, and block j's own
 * rows, into their slots: lpart (global) and op (head b's opart). Buffers: qb, ob (max_rows x
 * d), s (max_rows x bs), lr, inv (max_rows). */
static void moba_fwd_task(const float *q, const float *k, const float *v, float *op, float *lpart, int64_t b,
                          int64_t j, int64_t g, int64_t n, int64_t nb, int64_t bs, int64_t d, int64_t n_slots,
                          float scale, const int64_t *task_ptr, const int64_t *row_idx, const int64_t *row_slot,
                          int64_t max_rows, float *qb, float *s, float *ob, float *lr, float *inv) {
    int64_t n_rows = g * n, own = n_slots - 1, own_rows = OWN_ROWS(bs), t = b * nb + j;
    int64_t len = (j + 1) * bs <= n ? bs : n - j * bs;
    const float *kj = k + (b * n + j * bs) * d, *vj = v + (b * n + j * bs) * d;
    const float *qh = q + b * n_rows * d;
    float *lp = lpart + b * n_rows * n_slots;
    /* the rows that chose block j (always a whole block), in chunks of max_rows */
    for (int64_t i = task_ptr[t]; i < task_ptr[t + 1]; i += max_rows) {
        int64_t r = task_ptr[t + 1] - i < max_rows ? task_ptr[t + 1] - i : max_rows;
        for (int64_t a = 0; a < r; a++) memcpy(qb + a * d, qh + row_idx[i + a] * d, sizeof(float) * d);
        /* S = scale Q K_j^T; P = exp(S - m); O = P V_j / sum */
        mm_abt(qb, kj, s, (int)r, (int)len, (int)d, (int)len, scale);
        partial_softmax(s, r, len, lr, inv);
        mm_ab(s, vj, ob, (int)r, (int)len, (int)d, (int)len, 0.0f);
        for (int64_t a = 0; a < r; a++) {
            int64_t at = row_idx[i + a] * n_slots + row_slot[i + a];
            float *o = op + at * d;
            for (int64_t c = 0; c < d; c++) o[c] = ob[a * d + c] * inv[a];
            lp[at] = lr[a];
        }
    }
    /* block j's own tokens, each head: causal inside the block, slot `own`; in two halves,
     * the first against the first half of the keys only (a quarter less work) */
    for (int64_t h = 0; h < g; h++)
        for (int64_t a0 = 0; a0 < len; a0 += own_rows) {
            int64_t r = len - a0 < own_rows ? len - a0 : own_rows, kl = a0 + r;
            int64_t r0 = h * n + j * bs + a0;
            mm_abt(qh + r0 * d, kj, s, (int)r, (int)kl, (int)d, (int)kl, scale);
            mask_future(s, j * bs + a0, r, j * bs, kl);
            partial_softmax(s, r, kl, lr, inv);
            mm_ab(s, vj, ob, (int)r, (int)kl, (int)d, (int)kl, 0.0f);
            for (int64_t a = 0; a < r; a++) {
                int64_t at = (r0 + a) * n_slots + own;
                float *o = op + at * d;
                for (int64_t c = 0; c < d; c++) o[c] = ob[a * d + c] * inv[a];
                lp[at] = lr[a];
            }
        }
}

/* merge of global row x (head b, op its opart): lse = log sum_s exp(lpart_s);
 * out = sum_s exp(lpart_s - lse) opart_s (unused slots: NEG, skipped) */
static void moba_merge_row(int64_t x, int64_t b, int64_t n_rows, int64_t n_slots, int64_t d, const float *op,
                           const float *lpart, float *out, float *lse) {
    const float *lp = lpart + x * n_slots;
    float mx = NEG;
    for (int64_t sl = 0; sl < n_slots; sl++) mx = lp[sl] > mx ? lp[sl] : mx;
    float sum = 0.0f;
    for (int64_t sl = 0; sl < n_slots; sl++) if (lp[sl] > NONE) sum += exp_neg(lp[sl] - mx);
    float l = mx + __builtin_logf(sum);
    lse[x] = l;
    float *o = out + x * d;
    for (int64_t c = 0; c < d; c++) o[c] = 0.0f;
    for (int64_t sl = 0; sl < n_slots; sl++) {
        if (lp[sl] <= NONE) continue;
        float w = exp_neg(lp[sl] - l);
        const float *src = op + ((x - b * n_rows) * n_slots + sl) * d;
        for (int64_t c = 0; c < d; c++) o[c] += w * src[c];
    }
}

/* Forward. One K/V head at a time, so that its partials (opart: one head's rows) stay in
 * cache between the tasks that write them and the merge that reads them. per_thread = 1
 * (the caller's choice when there are enough heads: bk a multiple of threads, or >= 4x):
 * each thread takes whole heads, tasks and merge, into its own opart + thread * head size,
 * with no barrier; else the threads share each head's tasks, a barrier before its merge.
 * Returns 0, or 1 when a buffer could not be allocated. */
int moba_fwd(const float *q, const float *k, const float *v, float *out, float *lse, float *opart, float *lpart,
             int64_t bk, int64_t g, int64_t n, int64_t nb, int64_t bs, int64_t d, int64_t n_slots, float scale,
             const int64_t *task_ptr, const int64_t *row_idx, const int64_t *row_slot, int64_t max_rows,
             int threads, int per_thread) {
    int failed = 0;
    int64_t n_rows = g * n, head = n_rows * n_slots;
#pragma omp parallel num_threads(threads)
    {
        float *qb = (float *)malloc(sizeof(float) * max_rows * d);
        float *s = (float *)malloc(sizeof(float) * max_rows * bs);
        float *ob = (float *)malloc(sizeof(float) * max_rows * d);
        float *lr = (float *)malloc(sizeof(float) * max_rows);
        float *inv = (float *)malloc(sizeof(float) * max_rows);
        if (!qb || !s || !ob || !lr || !inv) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (per_thread) {
            float *op = opart + (int64_t)omp_get_thread_num() * head * d;
#pragma omp for schedule(dynamic, 1)
            for (int64_t b = 0; b < bk; b++) {
                if (failed) continue;
                for (int64_t x = b * head; x < (b + 1) * head; x++) lpart[x] = NEG;
                for (int64_t j = 0; j < nb; j++)
                    moba_fwd_task(q, k, v, op, lpart, b, j, g, n, nb, bs, d, n_slots, scale, task_ptr, row_idx,
                                  row_slot, max_rows, qb, s, ob, lr, inv);
                for (int64_t x = b * n_rows; x < (b + 1) * n_rows; x++)
                    moba_merge_row(x, b, n_rows, n_slots, d, op, lpart, out, lse);
            }
        } else if (!failed) {
#pragma omp for schedule(static)
            for (int64_t x = 0; x < bk * head; x++) lpart[x] = NEG;
            for (int64_t b = 0; b < bk; b++) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t j = 0; j < nb; j++)
                    moba_fwd_task(q, k, v, opart, lpart, b, j, g, n, nb, bs, d, n_slots, scale, task_ptr, row_idx,
                                  row_slot, max_rows, qb, s, ob, lr, inv);
#pragma omp for schedule(static)
                for (int64_t x = b * n_rows; x < (b + 1) * n_rows; x++)
                    moba_merge_row(x, b, n_rows, n_slots, d, opart, lpart, out, lse);
            }
        }
        free(qb); free(s); free(ob); free(lr); free(inv);
    }
    return failed;
}

/* One chunk's backward (FlashAttention-2 with the merged lse): r rows of q (qb), dout (gb),
 * lse (lb), delta (db) against key block kj/vj of len keys (with first >= 0: rows are tokens
 * first.., keys key0.., causal); P = exp(scale q K^T (+ mask) - lse),
 * dV += P^T dO, dS = scale P (dO V^T - delta), dQ = dS K (into dqb), dK += dS^T q. */
static void moba_bwd_chunk(const float *qb, const float *gb, const float *lb, const float *db, int64_t r,
                           const float *kj, const float *vj, float *dkj, float *dvj, int64_t len, int64_t d,
                           float scale, int64_t first, int64_t key0, float *p, float *dp, float *dqb) {
    mm_abt(qb, kj, p, (int)r, (int)len, (int)d, (int)len, scale);
    if (first >= 0) mask_future(p, first, r, key0, len);
    for (int64_t a = 0; a < r; a++)
        for (int64_t c = 0; c < len; c++) p[a * len + c] = exp_neg(p[a * len + c] - lb[a]);
    mm_atb(p, gb, dvj, (int)r, (int)len, (int)d, (int)len);
    mm_abt(gb, vj, dp, (int)r, (int)len, (int)d, (int)len, 1.0f);
    for (int64_t a = 0; a < r; a++)
        for (int64_t c = 0; c < len; c++) p[a * len + c] = scale * p[a * len + c] * (dp[a * len + c] - db[a]);
    mm_ab(p, kj, dqb, (int)r, (int)len, (int)d, (int)len, 0.0f);
    mm_atb(p, qb, dkj, (int)r, (int)len, (int)d, (int)len);
}

/* task (b, j) of the backward: key block j of K/V head b's gradients (dk, dv: owned), and
 * the query gradient shares of its rows into their slots of dqp (head b's dq_part). */
static void moba_bwd_task(const float *q, const float *k, const float *v, const float *dout, const float *lse,
                          const float *delta, float *dqp, float *dk, float *dv, int64_t b, int64_t j, int64_t g,
                          int64_t n, int64_t nb, int64_t bs, int64_t d, int64_t n_slots, float scale,
                          const int64_t *task_ptr, const int64_t *row_idx, const int64_t *row_slot, int64_t max_rows,
                          float *qb, float *gb, float *dqb, float *lb, float *db, float *p, float *dp) {
    int64_t n_rows = g * n, own = n_slots - 1, own_rows = OWN_ROWS(bs), t = b * nb + j;
    int64_t len = (j + 1) * bs <= n ? bs : n - j * bs;
    int64_t base = b * n_rows;
    const float *kj = k + (b * n + j * bs) * d, *vj = v + (b * n + j * bs) * d;
    float *dkj = dk + (b * n + j * bs) * d, *dvj = dv + (b * n + j * bs) * d;
    for (int64_t i = task_ptr[t]; i < task_ptr[t + 1]; i += max_rows) {
        int64_t r = task_ptr[t + 1] - i < max_rows ? task_ptr[t + 1] - i : max_rows;
        for (int64_t a = 0; a < r; a++) {
            int64_t row = base + row_idx[i + a];
            memcpy(qb + a * d, q + row * d, sizeof(float) * d);
            memcpy(gb + a * d, dout + row * d, sizeof(float) * d);
            lb[a] = lse[row];
            db[a] = delta[row];
        }
        moba_bwd_chunk(qb, gb, lb, db, r, kj, vj, dkj, dvj, len, d, scale, -1, 0, p, dp, dqb);
        for (int64_t a = 0; a < r; a++)
            memcpy(dqp + (row_idx[i + a] * n_slots + row_slot[i + a]) * d, dqb + a * d, sizeof(float) * d);
    }
    for (int64_t h = 0; h < g; h++)
        for (int64_t a0 = 0; a0 < len; a0 += own_rows) {
            int64_t r = len - a0 < own_rows ? len - a0 : own_rows;
            int64_t row = base + h * n + j * bs + a0;
            moba_bwd_chunk(q + row * d, dout + row * d, lse + row, delta + row, r, kj, vj, dkj, dvj, a0 + r, d, scale,
                           j * bs + a0, j * bs, p, dp, dqb);
            for (int64_t a = 0; a < r; a++)
                memcpy(dqp + ((row - base + a) * n_slots + own) * d, dqb + a * d, sizeof(float) * d);
        }
}

/* dq of global row x (head b) = the sum of its used slots (lpart > NONE) in dqp */
static void moba_dq_row(int64_t x, int64_t b, int64_t n_rows, int64_t n_slots, int64_t d, const float *dqp,
                        const float *lpart, float *dq) {
    float *o = dq + x * d;
    for (int64_t c = 0; c < d; c++) o[c] = 0.0f;
    for (int64_t sl = 0; sl < n_slots; sl++) {
        if (lpart[x * n_slots + sl] <= NONE) continue;
        const float *src = dqp + ((x - b * n_rows) * n_slots + sl) * d;
        for (int64_t c = 0; c < d; c++) o[c] += src[c];
    }
}

/* Backward: dk, dv (zeroed by the caller) get every task's share (task (b, j) owns key
 * block j of head b), dq_part (one head's rows, n_slots, D; per thread with per_thread, as in
 * the forward) each row's share per slot, summed into dq over the slots the forward used.
 * Returns 0, or 1 on a failed allocation. */
int moba_bwd(const float *q, const float *k, const float *v, const float *dout, const float *lse,
             const float *delta, const float *lpart, float *dq, float *dq_part, float *dk, float *dv,
             int64_t bk, int64_t g, int64_t n, int64_t nb, int64_t bs, int64_t d, int64_t n_slots, float scale,
             const int64_t *task_ptr, const int64_t *row_idx, const int64_t *row_slot, int64_t max_rows,
             int threads, int per_thread) {
    int failed = 0;
    int64_t n_rows = g * n;
#pragma omp parallel num_threads(threads)
    {
        float *qb = (float *)malloc(sizeof(float) * max_rows * d);
        float *gb = (float *)malloc(sizeof(float) * max_rows * d);
        float *dqb = (float *)malloc(sizeof(float) * max_rows * d);
        float *lb = (float *)malloc(sizeof(float) * max_rows);
        float *db = (float *)malloc(sizeof(float) * max_rows);
        float *p = (float *)malloc(sizeof(float) * max_rows * bs);
        float *dp = (float *)malloc(sizeof(float) * max_rows * bs);
        if (!qb || !gb || !dqb || !lb || !db || !p || !dp) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (per_thread) {
            float *dqp = dq_part + (int64_t)omp_get_thread_num() * n_rows * n_slots * d;
#pragma omp for schedule(dynamic, 1)
            for (int64_t b = 0; b < bk; b++) {
                if (failed) continue;
                for (int64_t j = 0; j < nb; j++)
                    moba_bwd_task(q, k, v, dout, lse, delta, dqp, dk, dv, b, j, g, n, nb, bs, d, n_slots, scale,
                                  task_ptr, row_idx, row_slot, max_rows, qb, gb, dqb, lb, db, p, dp);
                for (int64_t x = b * n_rows; x < (b + 1) * n_rows; x++)
                    moba_dq_row(x, b, n_rows, n_slots, d, dqp, lpart, dq);
            }
        } else if (!failed) {
            for (int64_t b = 0; b < bk; b++) {
#pragma omp for schedule(dynamic, 1)
                for (int64_t j = 0; j < nb; j++)
                    moba_bwd_task(q, k, v, dout, lse, delta, dq_part, dk, dv, b, j, g, n, nb, bs, d, n_slots, scale,
                                  task_ptr, row_idx, row_slot, max_rows, qb, gb, dqb, lb, db, p, dp);
#pragma omp for schedule(static)
                for (int64_t x = b * n_rows; x < (b + 1) * n_rows; x++)
                    moba_dq_row(x, b, n_rows, n_slots, d, dq_part, lpart, dq);
            }
        }
        free(qb); free(gb); free(dqb); free(lb); free(db); free(p); free(dp);
    }
    return failed;
}

/* the k_sel highest of s[0..n-1] into idx, in descending order, ties to the lower index (as
 * k_sel rounds of "first maximum" pick them), non-finite-below (-inf, NaN) skipped, -1 past
 * the candidates; k_sel <= 64 */
static void topk_row(const float *s, int64_t n, int64_t k_sel, int64_t *idx) {
    float best[64];
    int64_t have = 0;
    for (int64_t j = 0; j < n; j++) {
        float val = s[j];
        if (!(val > -__builtin_inff())) continue;
        if (have == k_sel && !(val > best[have - 1])) continue;
        /* insert after every kept score >= val (earlier blocks win ties) */
        int64_t at = have < k_sel ? have : k_sel - 1;
        while (at > 0 && best[at - 1] < val) { best[at] = best[at - 1]; idx[at] = idx[at - 1]; at--; }
        best[at] = val;
        idx[at] = j;
        if (have < k_sel) have++;
    }
    for (int64_t a = have; a < k_sel; a++) idx[a] = -1;
}

/* MoBA's top-k on given scores (n_rows, nb) (non-candidates -inf): sel (n_rows, k_sel). */
void moba_topk(const float *scores, int64_t n_rows, int64_t nb, int64_t k_sel, int64_t *sel, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t x = 0; x < n_rows; x++) topk_row(scores + x * nb, nb, k_sel, sel + x * k_sel);
}

/* MoBA's whole gate for queries and keys at positions 0..n-1: q (BK, g*n, D) as moba_fwd
 * takes it, kbar (BK, nb, D) the block means; query t of block i scores the earlier blocks
 * only, score(t, j) = q_t . kbar_j for j < i (one BLAS product per (head, query block)),
 * and keeps their top k_sel: sel (BK, g*n, k_sel). Returns 0, or 1 on a failed allocation. */
int moba_gate(const float *q, const float *kbar, int64_t *sel, int64_t bk, int64_t g, int64_t n, int64_t nb,
              int64_t bs, int64_t d, int64_t k_sel, int threads) {
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *s = (float *)malloc(sizeof(float) * bs * (nb > 0 ? nb : 1));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t t = 0; t < bk * g * nb; t++) {
            if (failed) continue;
            int64_t b = t / (g * nb), h = (t / nb) % g, i = t % nb;
            int64_t r = (i + 1) * bs <= n ? bs : n - i * bs;
            int64_t row = b * g * n + h * n + i * bs;
            if (i > 0) mm_abt(q + row * d, kbar + b * nb * d, s, (int)r, (int)i, (int)d, (int)i, 1.0f);
            for (int64_t a = 0; a < r; a++) topk_row(s + a * i, i, k_sel, sel + (row + a) * k_sel);
        }
        free(s);
    }
    return failed;
}
