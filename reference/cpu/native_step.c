/* A pass of the Llama model (reference/model.py) over T = 1..16 new positions of one sequence (a
 * decode step: T = 1; a verification of T - 1 drafted tokens, a short prompt or a prompt's chunk)
 * in a single OpenMP region: the same arithmetic as `Llama.forward` on a contiguous KV cache, with
 * the hundreds of small torch operators between the matrix products (norms, RoPE, the cache writes,
 * attention, SiLU, residual adds) replaced by loops the threads run between barriers. Built with
 * native_gemv.c (the packed products) and called by reference/native_step.py, which packs the
 * weights and says when and why.
 *
 * Every thread runs the whole pass, and each product is split so that a thread streams one
 * contiguous run of its weight, once for all T rows (`gemm_strips`, `gemm_panels`: a pass of a
 * few rows reads what a step of one reads, and costs about as much while the multiply-adds keep
 * up with memory):
 *  - QKV, gate/up and the LM head by columns (strips): thread t computes whole outputs, the t-th
 *    run of the matrix's strips of 32 columns. Its QKV columns it rotates (RoPE) and writes to
 *    the cache itself; gate/up is packed so that a strip holds 16 gate columns and the 16 up
 *    columns they pair with, so the thread computes silu(gate) * up for 16 hidden units a strip
 *    with nothing from another thread.
 *  - the output and down projections by input rows (panels): a thread needs only the rows of the
 *    input its panels multiply and writes a partial product; after a barrier every thread adds
 *    all partials into the residual streams, of which it keeps its own copy. The down
 *    projection's rows are the hidden units the thread computed itself, so gate/up and down run
 *    back to back, with no barrier between them.
 * Attention is split over key positions (flash decoding): each thread computes, for each of the T
 * queries, a softmax over its own positions among those the query sees (query i at position
 * pos + i sees [0, pos + i]: causal among the new positions) with its own running max and sum,
 * and the per-thread results are merged exactly after a barrier (the online-softmax rescaling of
 * chapters 06-07). Four barriers per layer: after QKV, after attention, after the output
 * projection, after down. Inputs that every thread needs whole (the RMSNorms, the merged attention
 * output: a few thousand floats a row) each thread computes itself: that costs less than sharing
 * them would, a barrier. */
#include <math.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("associative-math", "no-signed-zeros", "no-trapping-math")
#endif

#include "native_math.h"   /* after the pragma: its functions inline into loops compiled under it */

void gemm_panels(const float *x, long ldx, long rows, const float *packed, float *partial, long ldp,
                 long n_in, long n_out, long p0, long p1);
void gemm_strips(const float *x, long ldx, long rows, const float *strips, float *y, long ldy,
                 long n_in, long n_out, long first, long last);
long packed_width(long n_out);

#define STRIP_COLS 32   /* columns of a strip (native_gemv.c) */
#define PANEL_ROWS 32   /* input rows of a panel (native_gemv.c) */

enum { D_MODEL, N_LAYERS, N_HEADS, N_KV_HEADS, HEAD_DIM, D_FF, VOCAB, MAX_LEN, N_SHAPE };
enum { ATTN_NORM, QKV, O_PROJ, MLP_NORM, GATE_UP, DOWN, PER_LAYER };

static void barrier(void)
{
#ifdef _OPENMP
    #pragma omp barrier
#endif
}

/* This thread's number and the region's thread count (0 and 1 without OpenMP). */
static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int thread_count(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* sum[j] (+)= partials[0][j] + ... + partials[n - 1][j] for j in [j0, j1); partials `ld` floats apart. */
static void add_partials(const float *partials, long ld, int n, long j0, long j1, float *sum,
                         int accumulate)
{
    if (!accumulate)
        memset(sum + j0, 0, (j1 - j0) * sizeof(float));
    for (int k = 0; k < n; k++)
        for (long j = j0; j < j1; j++)
            sum[j] += partials[k * ld + j];
}

/* out[:d] = x[:d] * rsqrt(mean(x^2) + eps) * weight[:d]. */
static void rms_norm(const float *x, const float *weight, float *out, long d, float eps)
{
    float scale = 1.0f / sqrtf(dot(x, x, d) / d + eps);
    for (long j = 0; j < d; j++)
        out[j] = x[j] * scale * weight[j];
}

/* hidden[16 g + k] = silu(gate) * up for the strips g in [first, last) of gate/up, whose products
 * gate_up holds: [gate | up] for hidden units 16 g ... 16 g + 15 at gate_up[32 g ...]. */
static void swiglu_strips(const float *gate_up, long first, long last, float *hidden)
{
    for (long g = first; g < last; g++)
        for (int k = 0; k < STRIP_COLS / 2; k++)
            hidden[g * STRIP_COLS / 2 + k] = silu(gate_up[g * STRIP_COLS + k])
                                             * gate_up[g * STRIP_COLS + STRIP_COLS / 2 + k];
}

/* Rotate the adjacent pairs (a, b) among the columns [c0, c1) (c0 even) of x, whose first
 * `rotated` columns are heads of hd, by turns [hd / 2][2] (cos, sin): (a + ib)(c + is), as
 * `rotate_complex_` does; the columns from `rotated` on are left. */
static void rotate_columns(float *x, long c0, long c1, long rotated, long hd, const float *turns)
{
    long end = c1 < rotated ? c1 : rotated;
    for (long head = c0 / hd * hd; head < end; head += hd)   /* column c of a head: turns[c - head] */
        for (long c = c0 > head ? c0 : head; c + 1 < end && c < head + hd; c += 2) {
            float a = x[c], b = x[c + 1], cosine = turns[c - head], sine = turns[c - head + 1];
            x[c] = a * cosine - b * sine;
            x[c + 1] = b * cosine + a * sine;
        }
}

/* Ask for the keys and values at positions [s0, s1) of every KV head of one layer's k, v
 * [n_kv, max_len, hd]. They come from memory (a step streams 0.5 GB of weights through the
 * caches); read as attention reads them, a run of one head at a time, most of their misses come
 * one after another. Asked for all at once, the misses overlap: at the start of attention (a
 * step 0.8% faster, paired C calls on a quiet host), and for the next layer before the down
 * projection streams (another 0.4%). */
static void prefetch_positions(const float *k, const float *v, long n_kv, long max_len, long hd,
                               long s0, long s1)
{
    for (long g = 0; g < n_kv; g++)
        for (long s = s0; s < s1; s++)
            for (long j = 0; j < hd; j += 16) {   /* 16 floats: a 64-byte line */
                __builtin_prefetch(k + (g * max_len + s) * hd + j);
                __builtin_prefetch(v + (g * max_len + s) * hd + j);
            }
}

/* Heads of a group that `attend_heads` takes at once: their queries' vectors and running sums, and
 * a key or value row, fit in AVX-512's 32 vector registers (without it a vector is two or four). */
#ifdef __AVX512F__
#define HEADS_AT_ONCE(NV) ((NV) <= 4 ? 4 : 2)
#else
#define HEADS_AT_ONCE(NV) 1
#endif

/* The part of attention of the query heads q + g * hd, g < heads <= HEADS_AT_ONCE(NV), which read
 * the same K/V head (grouped-query attention), over the key positions [s0, s1) of its k, v
 * [max_len, hd], hd = 16 NV: each key and value row read once for all the heads, their queries'
 * vectors and outputs' in registers (a head at a time read each row again, from L2, and summed
 * its output in memory, waiting for the store at every position). Per head g: the scores in
 * rows[g * max_len + s], top[g], sum[g] and out[g * hd :] as `attend_positions` says. Inlined
 * with NV a constant (`attend_positions`), so the loops over heads and vectors unroll. */
static inline __attribute__((always_inline)) void attend_heads(const float *q, long heads,
        const float *k, const float *v, long s0, long s1, float scale, float *rows, long max_len,
        float *top, float *sum, float *out, int NV)
{
    const int AT_ONCE = HEADS_AT_ONCE(NV);   /* the loops over heads run to it, skipping those */
    long hd = 16 * NV;                       /* past `heads`: constant bounds, so they unroll */
    lanes16 query[4][8], acc[4][8];          /* [AT_ONCE][NV] of them used */
    float best[4], total[4];
    for (int g = 0; g < AT_ONCE; g++) {
        best[g] = -INFINITY, total[g] = 0.0f;
        for (int j = 0; j < NV; j++) {
            query[g][j] = g < heads ? load16(q + g * hd + 16 * j) : (lanes16){0};
            acc[g][j] = (lanes16){0};
        }
    }
    for (long s = s0; s < s1; s++) {
        lanes16 key[8];
        for (int j = 0; j < NV; j++)
            key[j] = load16(k + s * hd + 16 * j);
        for (int g = 0; g < AT_ONCE; g++)
            if (g < heads) {
                lanes16 products = query[g][0] * key[0];
                for (int j = 1; j < NV; j++)
                    products += query[g][j] * key[j];
                float score = 0.0f;
                for (int lane = 0; lane < 16; lane++)
                    score += products[lane];
                rows[g * max_len + s] = score * scale;
                best[g] = score * scale > best[g] ? score * scale : best[g];
            }
    }
    for (int g = 0; g < AT_ONCE; g++)
        if (g < heads)
            for (long s = s0; s < s1; s++) {   /* apart from the sums below: vectorised */
                float *row = rows + g * max_len;
                row[s] = exp_nonpositive(row[s] - best[g]);
                total[g] += row[s];
            }
    for (long s = s0; s < s1; s++) {
        lanes16 value[8];
        for (int j = 0; j < NV; j++)
            value[j] = load16(v + s * hd + 16 * j);
        for (int g = 0; g < AT_ONCE; g++)
            if (g < heads)
                for (int j = 0; j < NV; j++)
                    acc[g][j] += rows[g * max_len + s] * value[j];
    }
    for (int g = 0; g < AT_ONCE; g++)
        if (g < heads) {
            for (int j = 0; j < NV; j++)
                store16(out + g * hd + 16 * j, acc[g][j]);
            top[g] = best[g];
            sum[g] = total[g];
        }
}

/* This thread's part of attention: query heads q [n_heads, hd] over key positions [s0, s1) of
 * one layer's k, v [n_kv_heads, max_len, hd] (head h reads K/V head h / group). Per head: the
 * largest score top[h], sum[h] = sum of exp(score - top[h]) and out[h] = the same weights times V,
 * unnormalised (top = -inf, sum = 0, out = 0 over no positions). scores: [n_heads, max_len]. Head
 * sizes of 16, 32, 64 or 128 go a group's heads at a time in vectors (`attend_heads`), others a
 * head and a float at a time. */
static void attend_positions(const long *shape, const float *q, const float *k, const float *v,
                             long s0, long s1, float *scores, float *top, float *sum, float *out)
{
    long hd = shape[HEAD_DIM], max_len = shape[MAX_LEN], n_heads = shape[N_HEADS];
    long group = n_heads / shape[N_KV_HEADS];
    float scale = 1.0f / sqrtf((float)hd);
    for (long h = 0; h < n_heads;) {
        const float *kh = k + (h / group) * max_len * hd, *vh = v + (h / group) * max_len * hd;
        long heads = group - h % group;   /* the rest of h's group, as many as go at once */
        switch (hd) {
#define HEADS(NV) case 16 * NV:                                                                 \
            heads = heads < HEADS_AT_ONCE(NV) ? heads : HEADS_AT_ONCE(NV);                      \
            attend_heads(q + h * hd, heads, kh, vh, s0, s1, scale, scores + h * max_len, max_len, \
                         top + h, sum + h, out + h * hd, NV);                                   \
            h += heads;                                                                         \
            continue;
        HEADS(1) HEADS(2) HEADS(4) HEADS(8)
#undef HEADS
        }
        float *row = scores + h * max_len, best = -INFINITY, total = 0.0f;
        for (long s = s0; s < s1; s++) {
            row[s] = dot(q + h * hd, kh + s * hd, hd) * scale;
            best = row[s] > best ? row[s] : best;
        }
        for (long s = s0; s < s1; s++) {
            row[s] = exp_nonpositive(row[s] - best);
            total += row[s];
        }
        memset(out + h * hd, 0, hd * sizeof(float));
        for (long s = s0; s < s1; s++)
            for (long j = 0; j < hd; j++)
                out[h * hd + j] += row[s] * vh[s * hd + j];
        top[h] = best;
        sum[h] = total;
        h++;
    }
}

/* att [n_heads * hd], attention's output merged from the n threads' parts (top, sum
 * [n][n_heads], out [n][n_heads * hd]): each part rescaled to the head's overall max. */
static void merge_attention(long n_heads, long hd, int n, const float *top, const float *sum,
                            const float *out, float *att)
{
    for (long h = 0; h < n_heads; h++) {
        float best = -INFINITY, weight = 0.0f, scale[n];
        for (int k = 0; k < n; k++)
            best = top[k * n_heads + h] > best ? top[k * n_heads + h] : best;
        for (int k = 0; k < n; k++) {
            scale[k] = sum[k * n_heads + h] > 0.0f ? exp_nonpositive(top[k * n_heads + h] - best)
                                                   : 0.0f;
            weight += scale[k] * sum[k * n_heads + h];
        }
        for (int k = 0; k < n; k++)   /* each part's factor folds in the division by the weight */
            scale[k] /= weight;
        for (long j = h * hd; j < (h + 1) * hd; j++)
            att[j] = scale[0] * out[j];
        for (int k = 1; k < n; k++)
            for (long j = h * hd; j < (h + 1) * hd; j++)
                att[j] += scale[k] * out[(long)k * n_heads * hd + j];
    }
}

/* Strips of each product split by columns: QKV and the head 32 columns a strip, gate/up 16 hidden
 * units (their gate and up columns). */
static long strips(long columns, long per_strip)
{
    return (columns + per_strip - 1) / per_strip;
}

/* What thread t of n reads of a pass whose last new position is `last`, the same in forward_pass
 * and stream_step: its runs of the QKV, gate/up and head strips, of the output projection's
 * panels, of the down projection's panels (the rows of its own hidden units) and of the key
 * positions [0, last]. Equal runs, fixed before the pass: sharing the panels out as the threads
 * go, so that a faster thread reads more (one core may be slower: the other then waits at the
 * next barrier, 0.3-1.4 ms of a step), cost more than it saved, in interleaved decode steps:
 * claimed a few at a time from one counter, 10% slower (the threads read interleaved pieces of
 * one run of memory); each thread's run taken from its front by its owner and from its back by a
 * thread done with its own, 6% slower. */
typedef struct {
    long qkv0, qkv1, gate_up0, gate_up1, head0, head1, o0, o1, down0, down1, s0, s1;
} ThreadShare;

static ThreadShare thread_share(const long *shape, long last, int t, int n)
{
    long qkv_out = (shape[N_HEADS] + 2 * shape[N_KV_HEADS]) * shape[HEAD_DIM];
    long gate_up = strips(shape[D_FF], STRIP_COLS / 2), down_panels = strips(shape[D_FF], PANEL_ROWS);
    long o_panels = strips(shape[N_HEADS] * shape[HEAD_DIM], PANEL_ROWS);
    long per_panel = PANEL_ROWS / (STRIP_COLS / 2);   /* gate/up strips whose units a panel multiplies */
    ThreadShare at;
    at.qkv0 = strips(qkv_out, STRIP_COLS) * t / n;
    at.qkv1 = strips(qkv_out, STRIP_COLS) * (t + 1) / n;
    at.head0 = strips(shape[VOCAB], STRIP_COLS) * t / n;
    at.head1 = strips(shape[VOCAB], STRIP_COLS) * (t + 1) / n;
    at.o0 = o_panels * t / n;
    at.o1 = o_panels * (t + 1) / n;
    at.down0 = down_panels * t / n;
    at.down1 = down_panels * (t + 1) / n;
    at.gate_up0 = per_panel * at.down0 < gate_up ? per_panel * at.down0 : gate_up;
    at.gate_up1 = per_panel * at.down1 < gate_up ? per_panel * at.down1 : gate_up;
    at.s0 = (last + 1) * t / n;
    at.s1 = (last + 1) * (t + 1) / n;
    return at;
}

/* The work buffer of forward_pass and stream_step for a pass of `rows` new positions, in floats
 * from its start: shared buffers, each thread writing only its own part of them, then buffers of
 * which each thread has its own part: the residual streams and inputs [threads][rows][...], the
 * partial products and attention's parts [rows][threads][...] (a row's parts side by side, as
 * add_partials and merge_attention read them). */
typedef struct {
    long scores, qkv, gate_up, hidden, sink;     /* shared; qkv, gate_up, hidden: [rows][*_ld] */
    long streams, ins, partials, att_out, att_top, att_sum, end;   /* one part per thread */
    long inputs;                                 /* floats of each row of a thread's `ins` */
    long qkv_ld, gate_up_ld, hidden_ld;
} WorkLayout;

static WorkLayout work_layout(const long *shape, long rows, int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long qkv_out = (n_heads + 2 * shape[N_KV_HEADS]) * hd, d_ff = shape[D_FF];
    long inputs = d > n_heads * hd ? d : n_heads * hd;
    inputs = inputs > d_ff ? inputs : d_ff;
    long qkv_strips = strips(qkv_out, STRIP_COLS), gate_up_strips = strips(d_ff, STRIP_COLS / 2);
    long head_strips = strips(shape[VOCAB], STRIP_COLS);
    long widest = head_strips > qkv_strips ? head_strips : qkv_strips;   /* what the floor drops */
    widest = widest > gate_up_strips ? widest : gate_up_strips;
    WorkLayout w;
    w.inputs = inputs;
    w.qkv_ld = qkv_strips * STRIP_COLS;
    w.gate_up_ld = gate_up_strips * STRIP_COLS;
    w.hidden_ld = gate_up_strips * STRIP_COLS / 2;
    w.scores = 0;
    w.qkv = w.scores + n_heads * shape[MAX_LEN];
    w.gate_up = w.qkv + rows * w.qkv_ld;
    w.hidden = w.gate_up + rows * w.gate_up_ld;
    w.sink = w.hidden + rows * w.hidden_ld;
    w.streams = w.sink + widest * STRIP_COLS;
    w.ins = w.streams + threads * rows * d;
    w.partials = w.ins + threads * rows * inputs;
    w.att_out = w.partials + 2 * threads * rows * packed_width(d);
    w.att_top = w.att_out + threads * rows * n_heads * hd;
    w.att_sum = w.att_top + threads * rows * n_heads;
    w.end = w.att_sum + threads * rows * n_heads;
    return w;
}

/* Floats of `work` that forward_pass (and stream_step) need for passes of up to `rows` new
 * positions with these sizes and threads. */
long step_work_floats(const long *shape, long rows, int threads)
{
    return work_layout(shape, rows, threads).end;
}

/* The columns [c0, c1) of one row of QKV's output that hold keys or values (from n_heads * hd on:
 * K heads, then V heads), written to the layer's k, v [n_kv, max_len, hd] at `position`. */
static void store_keys_values(const long *shape, const float *qkv, long c0, long c1, float *k,
                              float *v, long position)
{
    long hd = shape[HEAD_DIM], n_kv = shape[N_KV_HEADS], first = shape[N_HEADS] * hd;
    for (long head = first; head < first + 2 * n_kv * hd; head += hd) {   /* K heads, then V heads */
        long from = c0 > head ? c0 : head, to = c1 < head + hd ? c1 : head + hd, g = (head - first) / hd;
        float *cache = g < n_kv ? k : v;
        if (from < to)
            memcpy(cache + ((g % n_kv) * shape[MAX_LEN] + position) * hd + from - head, qkv + from,
                   (to - from) * sizeof(float));
    }
}

/* in[i * ld :][:d] = RMSNorm of the residual streams x[i * d :][:d] for the rows i < rows. */
static void norm_rows(const float *x, long d, long rows, const float *weight, float *in, long ld,
                      float eps)
{
    for (long i = 0; i < rows; i++)
        rms_norm(x + i * d, weight, in + i * ld, d, eps);
}

/* x[i * d :][:d] += the n threads' partial products of each row i < rows ([rows][n][width]). */
static void add_row_partials(const float *partials, long width, int n, long rows, long d, float *x)
{
    for (long i = 0; i < rows; i++)
        add_partials(partials + i * n * width, width, n, 0, d, x + i * d, 1);
}

/* Thread t of n's part of attention for the rows' queries (row i in qkv + i * qkv_ld, at position
 * pos + i, sees positions [0, pos + i]) over its key positions [s0, s1) of one layer's k, v; the
 * parts go to top, sum, out as [rows][n][...], a row's parts side by side for merge_rows. */
static void attend_rows(const long *shape, const float *qkv, long qkv_ld, long rows, long pos,
                        const float *k, const float *v, long s0, long s1, float *scores, float *top,
                        float *sum, float *out, int t, int n)
{
    long n_heads = shape[N_HEADS], hd = shape[HEAD_DIM];
    for (long i = 0; i < rows; i++) {
        long slot = i * n + t, end = s1 < pos + i + 1 ? s1 : pos + i + 1;
        attend_positions(shape, qkv + i * qkv_ld, k, v, s0, end, scores, top + slot * n_heads,
                         sum + slot * n_heads, out + slot * n_heads * hd);
    }
}

/* att[i * ld :][:n_heads * hd] = each row's attention output, merged from the n threads' parts
 * (`attend_rows`). */
static void merge_rows(long n_heads, long hd, int n, long rows, const float *top, const float *sum,
                       const float *out, float *att, long ld)
{
    for (long i = 0; i < rows; i++)
        merge_attention(n_heads, hd, n, top + i * n * n_heads, sum + i * n * n_heads,
                        out + i * n * n_heads * hd, att + i * ld);
}

/* logits [n_logits][vocab] for the tokens token_ids[:rows] (1 <= rows <= 16: native_gemv.c's
 * MAX_ROWS) at positions pos .. pos + rows - 1: rows logit_rows[:n_logits] of the pass's output
 * (each in [0, rows), 1 <= n_logits <= rows). Returns 0; -1, with nothing read or written, where
 * a token is outside [0, vocab). The pass's keys and values are written at its positions in every
 * layer of k_cache, v_cache [n_layers, n_kv_heads, max_len, hd] (positions < pos already hold the
 * prefix; pos + rows <= max_len); query i attends to positions [0, pos + i]. shape: the N_SHAPE
 * sizes above. embed: [vocab, d_model], the embedding (its row `token` is the token's vector);
 * head: the same matrix in strips (the tied LM head). layers: PER_LAYER pointers per layer: the
 * norms' weights [d], QKV [d, (n_heads + 2 n_kv) hd] and gate/up [d, 2 d_ff] in strips, O
 * [n_heads hd, d] and down [d_ff, d] in panels (native_gemv.c). turns: [rows][hd / 2][2] (cos,
 * sin), the rows of positions pos .. pos + rows - 1. work: `step_work_floats(shape, rows,
 * threads)` floats (or more). */
long forward_pass(const long *shape, long rows, const long *token_ids, long pos, const float *embed,
                  const float *head, const float *const *layers, const float *final_norm,
                  const float *turns, float *k_cache, float *v_cache, float eps,
                  const long *logit_rows, long n_logits, float *work, float *logits, int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long n_kv = shape[N_KV_HEADS], d_ff = shape[D_FF], vocab = shape[VOCAB];
    long max_len = shape[MAX_LEN], qkv_out = (n_heads + 2 * n_kv) * hd, layer_size = n_kv * max_len * hd;
    long width = packed_width(d);
    for (long i = 0; i < rows; i++)
        if (token_ids[i] < 0 || token_ids[i] >= vocab)
            return -1;
    WorkLayout at = work_layout(shape, rows, threads);
    float *scores = work + at.scores, *qkv = work + at.qkv, *gate_up = work + at.gate_up;
    float *hidden = work + at.hidden;

    #pragma omp parallel num_threads(threads)
    {
        int t = thread_id(), n = thread_count();
        float *x = work + at.streams + t * rows * d, *in = work + at.ins + t * rows * at.inputs;
        float *o_partials = work + at.partials, *down_partials = o_partials + n * rows * width;
        float *att_top = work + at.att_top, *att_sum = work + at.att_sum, *att_out = work + at.att_out;
        ThreadShare my = thread_share(shape, pos + rows - 1, t, n);
        long c0 = my.qkv0 * STRIP_COLS, c1 = my.qkv1 * STRIP_COLS < qkv_out ? my.qkv1 * STRIP_COLS : qkv_out;
        for (long i = 0; i < rows; i++)
            memcpy(x + i * d, embed + token_ids[i] * d, d * sizeof(float));
        for (long layer = 0; layer < shape[N_LAYERS]; layer++) {
            const float *const *w = layers + layer * PER_LAYER;
            float *k = k_cache + layer * layer_size, *v = v_cache + layer * layer_size;

            norm_rows(x, d, rows, w[ATTN_NORM], in, at.inputs, eps);
            gemm_strips(in, at.inputs, rows, w[QKV], qkv, at.qkv_ld, d, qkv_out, my.qkv0, my.qkv1);
            for (long i = 0; i < rows; i++) {
                rotate_columns(qkv + i * at.qkv_ld, c0, c1, (n_heads + n_kv) * hd, hd, turns + i * hd);
                store_keys_values(shape, qkv + i * at.qkv_ld, c0, c1, k, v, pos + i);
            }
            barrier();
            prefetch_positions(k, v, n_kv, max_len, hd, my.s0, my.s1);
            attend_rows(shape, qkv, at.qkv_ld, rows, pos, k, v, my.s0, my.s1, scores, att_top, att_sum,
                        att_out, t, n);
            barrier();
            merge_rows(n_heads, hd, n, rows, att_top, att_sum, att_out, in, at.inputs);
            gemm_panels(in, at.inputs, rows, w[O_PROJ], o_partials + t * width, n * width,
                        n_heads * hd, d, my.o0, my.o1);
            barrier();
            add_row_partials(o_partials, width, n, rows, d, x);

            norm_rows(x, d, rows, w[MLP_NORM], in, at.inputs, eps);
            gemm_strips(in, at.inputs, rows, w[GATE_UP], gate_up, at.gate_up_ld, d, at.gate_up_ld,
                        my.gate_up0, my.gate_up1);
            for (long i = 0; i < rows; i++)
                swiglu_strips(gate_up + i * at.gate_up_ld, my.gate_up0, my.gate_up1,
                              hidden + i * at.hidden_ld);
            if (layer + 1 < shape[N_LAYERS])   /* the next layer's keys and values this thread reads */
                prefetch_positions(k + layer_size, v + layer_size, n_kv, max_len, hd, my.s0,
                                   my.s1 < pos ? my.s1 : pos);
            gemm_panels(hidden, at.hidden_ld, rows, w[DOWN], down_partials + t * width, n * width, d_ff,
                        d, my.down0, my.down1);
            barrier();
            add_row_partials(down_partials, width, n, rows, d, x);
        }
        for (long r = 0; r < n_logits; r++)
            rms_norm(x + logit_rows[r] * d, final_norm, in + r * at.inputs, d, eps);
        gemm_strips(in, at.inputs, n_logits, head, logits, vocab, d, vocab, my.head0, my.head1);
    }
    return 0;
}

/* The floor of a one-position `forward_pass` (a decode step): the same reads of every weight
 * matrix and of the cached K/V at positions [0, pos], split over the threads in the same region
 * with the same barriers, and nothing else (no norms, RoPE, softmax merge, SiLU, residual sums:
 * inputs are zeros, outputs dropped). `Llama.forward`'s step can be no faster on the same
 * machine; the difference is what the step spends besides reading. Arguments as for
 * forward_pass, work `step_work_floats(shape, 1, threads)` floats. */
void stream_step(const long *shape, long pos, const float *head, const float *const *layers,
                 const float *k_cache, const float *v_cache, float *work, int threads)
{
    long d = shape[D_MODEL], hd = shape[HEAD_DIM], n_heads = shape[N_HEADS];
    long n_kv = shape[N_KV_HEADS], d_ff = shape[D_FF], vocab = shape[VOCAB];
    long max_len = shape[MAX_LEN], qkv_out = (n_heads + 2 * n_kv) * hd, layer_size = n_kv * max_len * hd;
    long width = packed_width(d);
    WorkLayout at = work_layout(shape, 1, threads);
    float *inputs = work + at.ins, *sink = work + at.sink, *scores = work + at.scores;
    memset(inputs, 0, (at.partials - at.ins) * sizeof(float));

    #pragma omp parallel num_threads(threads)
    {
        int t = thread_id(), n = thread_count();
        float *mine = work + at.partials + t * width;
        ThreadShare my = thread_share(shape, pos, t, n);
        for (long layer = 0; layer < shape[N_LAYERS]; layer++) {
            const float *const *w = layers + layer * PER_LAYER;
            const float *k = k_cache + layer * layer_size, *v = v_cache + layer * layer_size;
            gemm_strips(inputs, 0, 1, w[QKV], sink, 0, d, qkv_out, my.qkv0, my.qkv1);
            barrier();
            prefetch_positions(k, v, n_kv, max_len, hd, my.s0, my.s1);
            attend_positions(shape, inputs, k, v, my.s0, my.s1, scores, work + at.att_top + t * n_heads,
                             work + at.att_sum + t * n_heads, work + at.att_out + t * n_heads * hd);
            barrier();
            gemm_panels(inputs, 0, 1, w[O_PROJ], mine, 0, n_heads * hd, d, my.o0, my.o1);
            barrier();
            gemm_strips(inputs, 0, 1, w[GATE_UP], sink, 0, d, at.streams - at.sink, my.gate_up0,
                        my.gate_up1);
            gemm_panels(inputs, 0, 1, w[DOWN], mine, 0, d_ff, d, my.down0, my.down1);
            barrier();
        }
        gemm_strips(inputs, 0, 1, head, sink, 0, d, vocab, my.head0, my.head1);
    }
}
