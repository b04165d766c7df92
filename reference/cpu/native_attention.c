/* Decode attention over a paged K/V pool, read in place: one query row per sequence, its keys
 * and values found through the sequence's block table (reference/attention.py's
 * `decode_rows_attention`, chapter 08). Built with native_gemv.c and called by
 * reference/native_attention.py, which says when and why.
 *
 * The torch path copies every sequence's keys and values out of the pool (a gather) and pads them
 * to the longest context before SDPA reads them again; here each key and value row is read once,
 * where it lies, and every query head keeps a running max, sum and weighted sum of values (the
 * online softmax of chapter 06), so one pass over the keys suffices. The query heads of a group
 * read the same K/V head (GQA) from the same slot row, while it is in the cache. */
#include <math.h>
#include <string.h>

/* Sums may be reordered (GCC here, clang in `dot`): vectorised reductions. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("associative-math", "no-signed-zeros", "no-trapping-math")
#endif

#include "native_math.h"   /* after the pragma: its functions inline into loops compiled under it */

enum { N_HEADS, N_KV_HEADS, HEAD_DIM, BLOCK_SIZE, TABLE_WIDTH, N_SHAPE };

#define MAX_HEADS 64  /* query heads: native_attention.py checks the model against it */
#define RUN 16        /* keys scored together: at most a block's worth, consecutive in the pool */

/* Hint the caches to fetch `bytes` from each of a and b into L2 (a prefetch never faults, even past
 * an end). */
static void prefetch(const char *a, const char *b, long bytes)
{
    for (long offset = 0; offset < bytes; offset += 64) {
        __builtin_prefetch(a + offset, 0, 1);
        __builtin_prefetch(b + offset, 0, 1);
    }
}

/* One run of n keys and values (slot rows `stride` floats apart) for query head `query` [hd]:
 * the scores go to w[:n] and become weights exp(score - top); top, sum and row (the head's
 * unnormalised output [hd]) are rescaled first when the run holds a new max. */
static void score_run(const float *query, const float *keys, long stride, long n, long hd,
                      float scale, float *w, float *top, float *sum, float *row)
{
    float run_top = *top;
    for (long t = 0; t < n; t++) {
        w[t] = dot(query, keys + t * stride, hd) * scale;
        run_top = w[t] > run_top ? w[t] : run_top;
    }
    if (run_top > *top) {
        float shrink = exp_nonpositive(*top - run_top);
        *sum *= shrink;
        for (long i = 0; i < hd; i++)
            row[i] *= shrink;
        *top = run_top;
    }
    float run_sum = 0.0f;
    for (long t = 0; t < n; t++) {
        w[t] = exp_nonpositive(w[t] - run_top);
        run_sum += w[t];
    }
    *sum += run_sum;
}

/* row[:hd] += sum over t < n of w[t] * values[t * stride : t * stride + hd]. Sixteen columns at a
 * time are summed over the whole run in registers (adding a value row at a time loaded and
 * stored the output row for every key, the kernel's largest cost). */
static void add_weighted_values(const float *values, long stride, const float *w, long n, long hd,
                                float *row)
{
    long i = 0;
    for (; i + 16 <= hd; i += 16) {
        lanes16 sum = load16(row + i);
        for (long t = 0; t < n; t++)
            sum += w[t] * load16(values + t * stride + i);
        memcpy(row + i, &sum, sizeof sum);
    }
    for (; i < hd; i++)
        for (long t = 0; t < n; t++)
            row[i] += w[t] * values[t * stride + i];
}

/* out[b] = softmax(q[b] . keys / sqrt(head_dim)) @ values over sequence b's context_lens[b]
 * positions, for b in [0, n_seqs).
 *   q: row b at q + b * q_stride, [n_heads, head_dim] contiguous; out [n_seqs, n_heads, head_dim].
 *   k, v: one layer of the pool [num_blocks, block_size, n_kv_heads, head_dim].
 *   block_tables [n_seqs, table_width] int32: position p of sequence b is slot p % block_size of
 *   block block_tables[b][p / block_size]. context_lens [n_seqs] int32, each >= 1.
 * Query head h reads K/V head h / (n_heads / n_kv_heads). A thread takes a whole sequence (its
 * slot rows, all heads side by side, are read front to back) and its keys a run at a time: up to
 * RUN consecutive slots of one block, scored for every head, then their values added with those
 * weights. The next run is prefetched into L2 meanwhile, a share of its lines before each head:
 * measured on a 2-core AMD EPYC at 16 sequences of 290 positions in shuffled blocks, medians of 7
 * interleaved rounds, a layer took 0.62 ms without prefetching, 0.51 with the whole next run
 * fetched at once (the core waits on that burst of misses instead of computing), 0.35 with the
 * fetches spread over the heads (0.36 two runs ahead, 0.48 into L1); a plain read of the same rows
 * takes 0.24 ms, their arithmetic from the caches 0.2. */
void paged_decode_attention(const long *shape, const float *q, long q_stride, const float *k,
                            const float *v, const int *block_tables, const int *context_lens,
                            long n_seqs, float *out, int threads)
{
    long n_heads = shape[N_HEADS], n_kv = shape[N_KV_HEADS], hd = shape[HEAD_DIM];
    long block_size = shape[BLOCK_SIZE], width = shape[TABLE_WIDTH];
    long group = n_heads / n_kv, stride = n_kv * hd;   /* floats from one slot's row to the next's */
    long run_bytes = RUN * stride * (long)sizeof(float);  /* K (and V) bytes of a whole run */
    long share = (run_bytes / 64 + n_heads - 1) / n_heads * 64;   /* prefetched per head, in lines */
    float scale = 1.0f / sqrtf((float)hd);
    #pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (long b = 0; b < n_seqs; b++) {
        const int *table = block_tables + b * width;
        long length = context_lens[b];
        float *acc = out + b * n_heads * hd;                            /* [n_heads, hd] */
        float top[MAX_HEADS], sum[MAX_HEADS], weights[MAX_HEADS][RUN];
        for (long h = 0; h < n_heads; h++)
            top[h] = -INFINITY, sum[h] = 0.0f;
        memset(acc, 0, n_heads * hd * sizeof(float));
        for (long p = 0; p < length;) {
            long n = block_size - p % block_size;   /* the run: to the block's end, at most RUN, */
            n = n < RUN ? n : RUN;                  /* not past the context */
            n = n < length - p ? n : length - p;
            long slot = (long)table[p / block_size] * block_size + p % block_size;
            /* The next run's bytes, a share of them fetched before each head is scored. */
            long ahead = p + n, next = -1;
            if (ahead < length)
                next = ((long)table[ahead / block_size] * block_size + ahead % block_size) * stride;
            const float *keys = k + slot * stride, *values = v + slot * stride;
            for (long h = 0; h < n_heads; h++) {
                long from = h * share, to = from + share < run_bytes ? from + share : run_bytes;
                if (next >= 0 && from < to)
                    prefetch((const char *)(k + next) + from, (const char *)(v + next) + from, to - from);
                score_run(q + b * q_stride + h * hd, keys + h / group * hd, stride, n, hd, scale,
                          weights[h], &top[h], &sum[h], acc + h * hd);
            }
            for (long h = 0; h < n_heads; h++)
                add_weighted_values(values + h / group * hd, stride, weights[h], n, hd, acc + h * hd);
            p += n;
        }
        for (long h = 0; h < n_heads; h++)
            for (long i = 0; i < hd; i++)
                acc[h * hd + i] /= sum[h];
    }
}
