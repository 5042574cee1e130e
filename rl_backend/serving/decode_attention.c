/* One decode step's attention for one layer, every row of the batch in one call (see decode_kernels.py).
 *
 * Every row stores its new key and value at its position in its own cache, then each attends its queries over
 * its own keys. Every (row, key head) pair is computed by the same loops in the same order, by one thread, whatever other
 * rows the batch holds and however the pairs are shared among threads: that keeps the engine batch invariant;
 * torch's products cannot promise that for rows padded to a common length, and one product per row costs more in
 * fixed overhead than the arithmetic (a third of a decode step at 8 rows).
 *
 * Layouts (float32, contiguous):
 *   q       [rows, kv_heads, group, head_dim]   queries, already scaled by 1/sqrt(head_dim)
 *   kv      [rows, 2, kv_heads, head_dim]       this step's keys and values
 *   caches  per row: [layers, 2, kv_heads, capacity[row], head_dim]
 *   out     [rows, kv_heads, group, head_dim]
 * head_dim is a multiple of 8 (the caller checks).
 *
 * Built alone as C, `agl_decode_attention` is called through ctypes on one thread. decode_ops.cpp includes this
 * file and makes it, with the operations between a decode step's products, torch operators.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
#define EXTERN_C extern "C"
#else
#define EXTERN_C
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef int v8i __attribute__((vector_size(32)));

#define v8splat(x) ((v8){x, x, x, x, x, x, x, x})

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

/* Scores of every query in the group against 8 keys at once: 8 independent sums instead of one chain of
 * dependent additions (a single chain waits on each addition's latency). Each score's own arithmetic (the sum over
 * head_dim in 8-lane chunks, then the lanes in a fixed order) is that of a key scored alone, so blocks and the tail
 * give the same bits. */
static void score_block(const float *queries, const float *keys, long group, long head_dim, long stride,
                        float *scores) {
    long chunks = head_dim / 8;
    for (long g = 0; g < group; g++) {
        const float *qg = queries + g * head_dim;
        v8 acc[8] = {{0}};
        for (long c = 0; c < chunks; c++) {
            v8 qc = load8(qg + 8 * c);
            for (int i = 0; i < 8; i++) acc[i] += qc * load8(keys + i * head_dim + 8 * c);
        }
        for (int i = 0; i < 8; i++) scores[g * stride + i] = lane_sum(acc[i]);
    }
}

static void score_one(const float *queries, const float *key, long group, long head_dim, long stride,
                      float *scores) {
    long chunks = head_dim / 8;
    for (long g = 0; g < group; g++) {
        const float *qg = queries + g * head_dim;
        v8 acc = {0};
        for (long c = 0; c < chunks; c++) acc += load8(qg + 8 * c) * load8(key + 8 * c);
        scores[g * stride] = lane_sum(acc);
    }
}

/* e^x for x <= 0, 8 lanes: x = n ln2 + r with |r| <= ln2/2, e^r by Cephes' expf polynomial (about 1 ulp), 2^n from
 * the exponent bits; below -87.3 (where 2^n leaves float32's normal range) the result is 0, so e^-inf = 0. */
static inline v8 exp8(v8 x) {
    const v8 low = v8splat(-87.3f);
    v8i under = x < low;
    x = (v8)((v8i)x & ~under) + (v8)((v8i)low & under);
    const v8 magic = v8splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to the nearest integer */
    v8 n = (x * v8splat(1.44269504088896341f) + magic) - magic;
    v8 r = x - n * v8splat(0.693359375f) - n * v8splat(-2.12194440e-4f);
    v8 p = v8splat(1.9875691500e-4f);
    p = p * r + v8splat(1.3981999507e-3f);
    p = p * r + v8splat(8.3334519073e-3f);
    p = p * r + v8splat(4.1665795894e-2f);
    p = p * r + v8splat(1.6666665459e-1f);
    p = p * r + v8splat(5.0000001201e-1f);
    p = p * r * r + r + v8splat(1.0f);
    v8i bits = (__builtin_convertvector(n, v8i) + 127) << 23;
    return (v8)((v8i)(p * (v8)bits) & ~under);
}

static void attend_head(const float *queries, const float *keys, const float *values, long group, long head_dim,
                        long len, float *out, float *scores) {
    long chunks = head_dim / 8, stride = (len + 7) & ~7L;
    long j = 0;
    for (; j + 8 <= len; j += 8) score_block(queries, keys + j * head_dim, group, head_dim, stride, scores + j);
    for (; j < len; j++) score_one(queries, keys + j * head_dim, group, head_dim, stride, scores + j);
    for (long g = 0; g < group; g++) {
        float *s = scores + g * stride;
        for (long i = len; i < stride; i++) s[i] = -INFINITY; /* the last block's padding: e^-inf = 0 */
        float top = -INFINITY;
        for (long i = 0; i < len; i++) top = s[i] > top ? s[i] : top;
        v8 sum = {0};
        for (long i = 0; i < stride; i += 8) {
            v8 e = exp8(load8(s + i) - v8splat(top));
            memcpy(s + i, &e, sizeof e);
            sum += e;
        }
        float inverse = 1.f / lane_sum(sum);
        for (long i = 0; i < len; i++) s[i] *= inverse;
    }
    /* out = scores @ values: each output chunk sums over the keys in order, 8 chunks (one 64-wide head) at a
     * time so that 8 sums proceed side by side. */
    for (long g = 0; g < group; g++) {
        const float *s = scores + g * stride;
        float *o = out + g * head_dim;
        long c = 0;
        for (; c + 8 <= chunks; c += 8) {
            v8 acc[8] = {{0}};
            for (long k = 0; k < len; k++) {
                const float *v = values + k * head_dim + 8 * c;
                v8 w = v8splat(s[k]);
                for (int i = 0; i < 8; i++) acc[i] += w * load8(v + 8 * i);
            }
            memcpy(o + 8 * c, acc, sizeof acc);
        }
        for (; c < chunks; c++) {
            v8 acc = {0};
            for (long k = 0; k < len; k++) acc += v8splat(s[k]) * load8(values + k * head_dim + 8 * c);
            memcpy(o + 8 * c, &acc, sizeof acc);
        }
    }
}

/* The pair (row * kv_heads + head) at place k of `count`: the first, the last, the second, the one before last...
 * Threads take places in contiguous ranges, and the batch's rows are often in order of length: so each range holds
 * short and long rows alike. Which thread computes a pair changes nothing in it. */
static inline long pair_at(long k, long count) { return k % 2 == 0 ? k / 2 : count - 1 - k / 2; }

/* Every row's new key and value, stored at its position in its cache before any row attends: a step may hold
 * several positions of one sequence (a draft being checked, engine.py), and the later ones read the earlier ones'
 * keys, whichever thread attends them. */
static void store_rows(long rows, long kv_heads, long head_dim, long layer, const float *kv, float *const *caches,
                       const long *capacity, const long *positions) {
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < kv_heads; h++) {
            long n = positions[r], cap = capacity[r];
            float *base = caches[r] + layer * 2 * kv_heads * cap * head_dim;
            memcpy(base + (h * cap + n) * head_dim, kv + (r * 2 * kv_heads + h) * head_dim,
                   (size_t)head_dim * sizeof(float));
            memcpy(base + ((kv_heads + h) * cap + n) * head_dim, kv + ((r * 2 + 1) * kv_heads + h) * head_dim,
                   (size_t)head_dim * sizeof(float));
        }
}

/* The pairs at places [begin, end) of `count` (see pair_at), their keys and values already stored. */
static void attend_pairs(long begin, long end, long count, long kv_heads, long group, long head_dim, long layer,
                         const float *q, float *const *caches, const long *capacity, const long *positions,
                         float *out) {
    long head = head_dim, span = group * head_dim, longest = 0;
    for (long k = begin; k < end; k++) {
        long n = positions[pair_at(k, count) / kv_heads];
        longest = n > longest ? n : longest;
    }
    float *scores = (float *)malloc(sizeof(float) * (size_t)(group * ((longest + 8) / 8 * 8)));
    if (scores == NULL) abort(); /* a few kilobytes */
    for (long k = begin; k < end; k++) {
        long i = pair_at(k, count);
        long r = i / kv_heads, h = i % kv_heads, n = positions[r], cap = capacity[r];
        float *base = caches[r] + layer * 2 * kv_heads * cap * head;
        float *keys = base + h * cap * head, *values = base + (kv_heads + h) * cap * head;
        attend_head(q + i * span, keys, values, group, head_dim, n + 1, out + i * span, scores);
    }
    free(scores);
}

EXTERN_C void agl_decode_attention(long rows, long kv_heads, long group, long head_dim, long layer, const float *q,
                                   const float *kv, float *const *caches, const long *capacity, const long *positions,
                                   float *out) {
    store_rows(rows, kv_heads, head_dim, layer, kv, caches, capacity, positions);
    attend_pairs(0, rows * kv_heads, rows * kv_heads, kv_heads, group, head_dim, layer, q, caches, capacity, positions,
                 out);
}
