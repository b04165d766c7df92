/* The products of the batch-1 decode step (native_step.c), on the weights reference/cpu/
 * native_step.py packs for them: panels (`gemv_panels`, `gemv_packed`) for the products split by
 * input rows, strips (`gemv_strips`) for those whose outputs a thread computes whole. Built and
 * called through reference/cpu/native_gemv.py. The threads are OpenMP's: linked against the
 * OpenMP runtime torch already loaded, they are torch's own pool. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* The packed layout of the decode step's weights (reference/cpu/native_step.py packs them): w
 * [n_in, n_out] as [ceil(n_in / 8)][ceil(n_out / 16)][8][16], zeros past n_in or n_out. A panel
 * (8 rows of w) is one contiguous run of memory in which each 8 x 16 block is read whole, in
 * order: one stream per thread, where reading 8 or 16 rows of an [in, out] matrix side by side
 * would be 16 streams. */
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
