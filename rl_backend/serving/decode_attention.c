/* One decode step's attention for one layer, every row of the batch in one call (see attention_kernel.py).
 *
 * Each row stores its new key and value at its position in its own cache, then attends its queries over its own
 * keys. Every row is computed by the same loops in the same order whatever other rows the batch holds, which is
 * what keeps the engine batch invariant; torch's products cannot promise that for rows padded to a common length,
 * and one product per row costs more in fixed overhead than the arithmetic (a third of a decode step at 8 rows).
 *
 * Layouts (float32, contiguous):
 *   q       [rows, kv_heads, group, head_dim]   queries, already scaled by 1/sqrt(head_dim)
 *   kv      [rows, 2, kv_heads, head_dim]       this step's keys and values
 *   caches  per row: [layers, 2, kv_heads, capacity[row], head_dim]
 *   out     [rows, kv_heads, group, head_dim]
 *   scores  scratch of group * (max position + 1) floats
 * head_dim is a multiple of 8 and group * head_dim at most 2048 (the caller checks).
 */
#include <math.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

#define MAX_GROUP_DIM 2048

static inline v8 load8(const float *p) {
    v8 a;
    memcpy(&a, p, sizeof a);
    return a;
}

/* The lanes summed in a fixed order. */
static inline float lane_sum(v8 a) {
    v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

static void attend_head(const float *queries, const float *keys, const float *values, long group, long head_dim,
                        long len, float *out, float *scores) {
    long chunks = head_dim / 8;
    for (long j = 0; j < len; j++) {
        const float *k = keys + j * head_dim;
        for (long g = 0; g < group; g++) {
            const float *qg = queries + g * head_dim;
            v8 acc = {0};
            for (long c = 0; c < chunks; c++) acc += load8(qg + 8 * c) * load8(k + 8 * c);
            scores[g * len + j] = lane_sum(acc);
        }
    }
    for (long g = 0; g < group; g++) {
        float *s = scores + g * len;
        float top = -INFINITY, total = 0.f;
        for (long j = 0; j < len; j++) top = s[j] > top ? s[j] : top;
        for (long j = 0; j < len; j++) {
            s[j] = expf(s[j] - top);
            total += s[j];
        }
        float inverse = 1.f / total;
        for (long j = 0; j < len; j++) s[j] *= inverse;
    }
    v8 acc[MAX_GROUP_DIM / 8];
    for (long i = 0; i < group * chunks; i++) acc[i] = (v8){0};
    for (long j = 0; j < len; j++) {
        const float *v = values + j * head_dim;
        for (long c = 0; c < chunks; c++) {
            v8 vc = load8(v + 8 * c);
            for (long g = 0; g < group; g++) acc[g * chunks + c] += scores[g * len + j] * vc;
        }
    }
    memcpy(out, acc, (size_t)(group * head_dim) * sizeof(float));
}

void agl_decode_attention(long rows, long kv_heads, long group, long head_dim, long layer, const float *q,
                          const float *kv, float *const *caches, const long *capacity, const long *positions,
                          float *out, float *scores) {
    long head = head_dim, span = group * head_dim;
    for (long r = 0; r < rows; r++) {
        long n = positions[r], cap = capacity[r];
        float *base = caches[r] + layer * 2 * kv_heads * cap * head;
        for (long h = 0; h < kv_heads; h++) {
            float *keys = base + h * cap * head, *values = base + (kv_heads + h) * cap * head;
            memcpy(keys + n * head, kv + (r * 2 * kv_heads + h) * head, (size_t)head * sizeof(float));
            memcpy(values + n * head, kv + ((r * 2 + 1) * kv_heads + h) * head, (size_t)head * sizeof(float));
            long at = (r * kv_heads + h) * span;
            attend_head(q + at, keys, values, group, head_dim, n + 1, out + at, scores);
        }
    }
}
