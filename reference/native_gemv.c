/* One row times a weight matrix stored input-major: y[out] = x[in] @ w[in, out] (float32,
 * w row-major, so each input row of w is `out` consecutive floats). Built and called by
 * reference/native_gemv.py, which says why this is hand-written.
 *
 * The threads split the rows of w: thread t reads one contiguous block of rows, as a plain
 * `sum` reads memory, and adds their products into its own partial vector (thread 0's is y);
 * the partials are then summed, split by columns, into y (no atomics, no locks).
 * Splitting the columns instead (no sum) streamed SmolLM2's matrices 1.1-1.5x slower at 2
 * threads: each thread then reads short pieces of every row.
 *
 * Within a block, 8 or 16 rows are read side by side and their products added to y in one
 * pass over the columns (the loop over columns is vectorised by the compiler), so y is loaded
 * and stored once per 8 or 16 rows. Measured on SmolLM2's 121 matrices (2-core AMD EPYC): one
 * thread reading the whole matrix went 7-9% faster with 16 rows a pass than with 8. Split over
 * two threads, rows of at most NARROW floats (SmolLM2's QKV, O and down products, 960 and 576
 * wide) went 4-8% faster with 16 rows (a C loop over all 121 matrices as a decode step reads
 * them, interleaved runs, on ordinary and on huge pages), wider rows no faster, so 16 rows for
 * one thread or narrow rows, else 8 (4 rows was slower in every case). The threads are OpenMP's:
 * linked against the OpenMP runtime torch already loaded, they are torch's own pool.
 *
 * The batch-1 decode step (native_step.c) reads its own copy of the weights, packed so that each
 * thread's share is one stream (`gemv_panels` and `gemv_strips`, at the end of this file). */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define ROWS_PER_PASS 8  /* the threads' blocks are whole multiples of this */
#define NARROW 1024      /* rows of at most this many floats are read 16 a pass */

/* y[:n_out] += x[:R] @ w[:R, :n_out], w's rows ld floats apart. */
#define DEFINE_PASS(NAME, R)                                                                   \
    static void NAME(const float *restrict x, const float *restrict w, long ld,                \
                     float *restrict y, long n_out)                                            \
    {                                                                                          \
        for (long j = 0; j < n_out; j++) {                                                     \
            float s = y[j];                                                                    \
            _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) s += x[r] * w[r * ld + j];    \
            y[j] = s;                                                                          \
        }                                                                                      \
    }
DEFINE_PASS(pass_16, 16)
DEFINE_PASS(pass_8, 8)
DEFINE_PASS(pass_1, 1)

/* y[:n_out] = x[r0:r1] @ w[r0:r1, :], 16 rows a pass where `wide`, else 8. */
static void row_block(const float *x, const float *w, float *y, long r0, long r1, long n_out,
                      int wide)
{
    memset(y, 0, n_out * sizeof(float));
    long i = r0;
    if (wide)
        for (; i + 16 <= r1; i += 16)
            pass_16(x + i, w + i * n_out, n_out, y, n_out);
    for (; i + 8 <= r1; i += 8)
        pass_8(x + i, w + i * n_out, n_out, y, n_out);
    for (; i < r1; i++)
        pass_1(x + i, w + i * n_out, n_out, y, n_out);
}

/* The rows [*r0, *r1) of an n_in-row matrix that thread t of n reads: whole passes of
 * ROWS_PER_PASS rows each, the last thread taking the rest. */
static void gemv_rows(long n_in, int t, int n, long *r0, long *r1)
{
    long passes = n_in / ROWS_PER_PASS;
    *r0 = passes * t / n * ROWS_PER_PASS;
    *r1 = t == n - 1 ? n_in : passes * (t + 1) / n * ROWS_PER_PASS;
}

/* Called by every thread t of an enclosing region of n threads: this thread's share of
 * x[:n_in] @ w, the rows [r0, r1) of its `gemv_rows`, into `partial` [n_out] (reading only
 * x[r0:r1]). The product is the sum of the n threads' partials, once all have written theirs. */
static void gemv_partial(const float *x, const float *w, float *partial, long n_in, long n_out)
{
#ifdef _OPENMP
    int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
    int t = 0, n = 1;
#endif
    long r0, r1;
    gemv_rows(n_in, t, n, &r0, &r1);
    row_block(x, w, partial, r0, r1, n_out, n == 1 || n_out <= NARROW);
}

/* Called by every thread of an enclosing region of n threads: y[:n_out] = x[:n_in] @ w.
 * scratch: [n - 1, n_out] floats for the partials of threads 1, 2, ... (thread 0's is y), summed
 * into y split by columns; y is whole once the region ends. */
static void gemv_in_region(const float *x, const float *w, float *y, float *scratch, long n_in,
                           long n_out)
{
#ifdef _OPENMP
    int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
    int t = 0, n = 1;
#endif
    gemv_partial(x, w, t == 0 ? y : scratch + (t - 1) * n_out, n_in, n_out);
    if (n == 1)
        return;
#ifdef _OPENMP
    #pragma omp barrier
#endif
    long per = ((n_out + n - 1) / n + 15) / 16 * 16;  /* 64-byte aligned column ranges */
    long c0 = t * per < n_out ? t * per : n_out, c1 = c0 + per < n_out ? c0 + per : n_out;
    for (long k = 1; k < n; k++)
        for (long j = c0; j < c1; j++) y[j] += scratch[(k - 1) * n_out + j];
}

/* y[:n_out] = x[:n_in] @ w[:n_in, :n_out] on `threads` threads; scratch: [threads - 1, n_out]
 * floats (see gemv_in_region). */
void gemv_input_major(const float *x, const float *w, float *y, float *scratch, long n_in,
                      long n_out, int threads)
{
    if (threads <= 1 || n_in < 2 * ROWS_PER_PASS) {
        row_block(x, w, y, 0, n_in, n_out, 1);
        return;
    }
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
    gemv_in_region(x, w, y, scratch, n_in, n_out);
#else
    row_block(x, w, y, 0, n_in, n_out, 1);
#endif
}

/* The packed layout of the decode step's weights (reference/native_step.py packs them): w [n_in,
 * n_out] as [ceil(n_in / 8)][ceil(n_out / 16)][8][16], zeros past n_in or n_out. A panel (8 rows
 * of w) is one contiguous run of memory in which each 8 x 16 block is read whole, in order: one
 * stream per thread, where the input-major layout's passes read 8 or 16 rows side by side (16
 * streams). Measured on SmolLM2's matrices (2-core AMD EPYC, quiet host, interleaved): 52-55 GB/s
 * against 46-48 for the input-major passes, a plain sum of the same bytes 58-62. */
#define PANEL_ROWS 8
#define PANEL_COLS 16

/* y[:chunks * 16] += x[:rows] @ one panel [chunks][8][16] (its first `rows` <= 8 rows). */
static void panel_pass(const float *restrict x, const float *restrict panel, float *restrict y,
                       long chunks, long rows)
{
    for (long c = 0; c < chunks; c++) {
        const float *block = panel + c * PANEL_ROWS * PANEL_COLS;
        float acc[PANEL_COLS];
        for (int k = 0; k < PANEL_COLS; k++)
            acc[k] = y[c * PANEL_COLS + k];
        if (rows == PANEL_ROWS) {
            _Pragma("GCC unroll 8") for (int r = 0; r < PANEL_ROWS; r++)
                for (int k = 0; k < PANEL_COLS; k++)
                    acc[k] += x[r] * block[r * PANEL_COLS + k];
        } else {
            for (long r = 0; r < rows; r++)
                for (int k = 0; k < PANEL_COLS; k++)
                    acc[k] += x[r] * block[r * PANEL_COLS + k];
        }
        for (int k = 0; k < PANEL_COLS; k++)
            y[c * PANEL_COLS + k] = acc[k];
    }
}

/* Floats of a partial product of a packed matrix with n_out columns (its padded width). */
long packed_width(long n_out)
{
    return (n_out + PANEL_COLS - 1) / PANEL_COLS * PANEL_COLS;
}

/* partial [packed_width(n_out)] = x[:n_in] @ the panels [p0, p1) of a packed matrix (the rows
 * [8 p0, 8 p1) of w): one contiguous stream. The product is the sum of such partials over panel
 * ranges that cover the matrix. */
void gemv_panels(const float *x, const float *packed, float *partial, long n_in, long n_out,
                 long p0, long p1)
{
    long width = packed_width(n_out);
    memset(partial, 0, width * sizeof(float));
    for (long p = p0; p < p1; p++) {
        long rows = n_in - p * PANEL_ROWS < PANEL_ROWS ? n_in - p * PANEL_ROWS : PANEL_ROWS;
        panel_pass(x + p * PANEL_ROWS, packed + p * PANEL_ROWS * width, partial, width / PANEL_COLS,
                   rows);
    }
}

/* Called by every thread t of an enclosing region of n threads: this thread's share of
 * x[:n_in] @ packed into partial [packed_width(n_out)]: the sum over its panels, the t-th of n
 * equal runs of them (one contiguous stream). The product is the sum of the n threads' partials
 * once all have returned. Sharing the panels out as the threads go, so that a faster thread reads
 * more (one core may be slower: the other then waits at the next barrier, 0.3-1.4 ms of a step),
 * cost more than it saved, in interleaved decode steps: claimed a few at a time from one counter,
 * 10% slower (the threads read interleaved pieces of one run of memory); each thread's run taken
 * from its front by its owner and from its back by a thread done with its own, 6% slower. */
void gemv_packed(const float *x, const float *packed, float *partial, long n_in, long n_out)
{
#ifdef _OPENMP
    int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
    int t = 0, n = 1;
#endif
    long panels = (n_in + PANEL_ROWS - 1) / PANEL_ROWS;
    gemv_panels(x, packed, partial, n_in, n_out, panels * t / n, panels * (t + 1) / n);
}

/* The strip layout, for the products a thread computes whole columns of (native_step.c): w
 * [n_in, n_out] as [strips][n_in][32], strip g holding 32 columns of w (which ones is the packer's
 * choice: native_step.py), zeros for columns past the edge. A strip is one contiguous run; the
 * 32 sums of a strip stay in registers over all n_in rows, so y is written once, whole: no
 * partials to add across threads, and the same sums at any thread count. */
#define STRIP_COLS 32

/* y[32 g + k] = x[:n_in] @ strips[g][:, k] for the strips g in [first, last), k < 32 and
 * 32 g + k < n_out (y holds n_out floats). */
void gemv_strips(const float *x, const float *strips, float *y, long n_in, long n_out, long first,
                 long last)
{
    for (long g = first; g < last; g++) {
        const float *strip = strips + g * n_in * STRIP_COLS;
        float acc[STRIP_COLS] = {0.0f};
        for (long r = 0; r < n_in; r++)
            for (int k = 0; k < STRIP_COLS; k++)
                acc[k] += x[r] * strip[r * STRIP_COLS + k];
        long cols = n_out - g * STRIP_COLS < STRIP_COLS ? n_out - g * STRIP_COLS : STRIP_COLS;
        memcpy(y + g * STRIP_COLS, acc, cols * sizeof(float));
    }
}
