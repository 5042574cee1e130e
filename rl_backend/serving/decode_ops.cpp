/* The decode step's compiled torch operators, registered through torch's stable C ABI (see decode_kernels.py):
 *   agl::decode_attention   the attention kernel of decode_attention.c, its (row, key head) pairs shared among
 *                           torch's intra-op threads;
 *   agl::add_rms_norm, agl::rotary, agl::silu_mul
 *                           the operations between the products, one call each instead of five to ten;
 *   agl::panel_product      float32 products for weights packed in panels (`pack_panels`).
 * Called from TorchScript, they run without Python and without the GIL. No torch header is read: the few
 * functions of the ABI used here are declared below and handed over by address from Python
 * (`agl_register_operator`), so the build stays a few seconds long. Every operator computes each row by itself in
 * a fixed order, whatever else the batch holds and whichever thread computes it: batch invariant by construction.
 * A C++ exception thrown here reaches Python as a RuntimeError with its message.
 */
#include "decode_attention.c"

/* ---- the operator agl::decode_attention(Tensor q, Tensor kv, Tensor(a!) pointers, Tensor capacity,
 *      Tensor positions, int layer, int kv_heads) -> Tensor, as a boxed kernel of torch's stable C ABI ---- */
#include <stdexcept>
#include <string>

typedef struct AtenTensorOpaque *AtenTensorHandle;
typedef struct TorchLibraryOpaque *TorchLibraryHandle;
typedef uint64_t StableIValue; /* a tensor is its handle's address, an int its value */

/* What Python hands over (decode_kernels.py, `_TorchApi`): the ABI's functions by address, and its codes. */
struct torch_api {
    int32_t (*library_init_impl)(const char *ns, const char *key, const char *file, uint32_t line,
                                 TorchLibraryHandle *out);
    int32_t (*library_impl)(TorchLibraryHandle library, const char *name,
                            void (*fn)(StableIValue *, uint64_t, uint64_t));
    int32_t (*get_data_ptr)(AtenTensorHandle tensor, void **out);
    int32_t (*get_dim)(AtenTensorHandle tensor, int64_t *out);
    int32_t (*get_sizes)(AtenTensorHandle tensor, int64_t **out);
    int32_t (*get_strides)(AtenTensorHandle tensor, int64_t **out);
    int32_t (*get_dtype)(AtenTensorHandle tensor, int32_t *out);
    int32_t (*get_device_type)(AtenTensorHandle tensor, int32_t *out);
    int32_t (*empty_strided)(int64_t ndim, const int64_t *sizes, const int64_t *strides, int32_t dtype,
                             int32_t device_type, int32_t device_index, AtenTensorHandle *out);
    int32_t (*delete_tensor)(AtenTensorHandle tensor);
    int32_t (*parallel_for)(int64_t begin, int64_t end, int64_t grain, void (*fn)(int64_t, int64_t, void *),
                            void *context);
    int32_t float32, int64, cpu, bfloat16;
};

static struct torch_api api;

/* The call's tensor arguments, owned by the kernel (the ABI hands over new references): freed however it ends. */
struct Owned {
    AtenTensorHandle handles[8] = {};
    ~Owned() {
        for (AtenTensorHandle h : handles)
            if (h != nullptr) api.delete_tensor(h);
    }
};

static void check(int32_t status, const char *what) {
    if (status != 0) throw std::runtime_error(std::string("agl::decode_attention: torch could not ") + what);
}

static const char *dtype_name(int32_t dtype) {
    return dtype == api.float32 ? "float32" : dtype == api.bfloat16 ? "bfloat16" : "int64";
}

/* The data of a contiguous CPU tensor of `dtype` (or of `other`, when not -1) with `dim` dimensions; its sizes in
 * `sizes`, its dtype in `got`. */
static void *tensor_data(AtenTensorHandle t, const char *op, const char *name, int32_t dtype, int32_t other,
                         int64_t dim, int64_t **sizes, int32_t *got = nullptr) {
    int64_t got_dim, *strides;
    int32_t got_dtype, device;
    void *data;
    check(api.get_dim(t, &got_dim), "read a dimension count");
    check(api.get_dtype(t, &got_dtype), "read a dtype");
    check(api.get_device_type(t, &device), "read a device");
    if (got_dim != dim || (got_dtype != dtype && got_dtype != other) || device != api.cpu)
        throw std::runtime_error(std::string(op) + ": " + name + " must be a " + std::to_string(dim) +
                                 "-dimensional " + dtype_name(dtype) + (other != -1 ? " or " : "") +
                                 (other != -1 ? dtype_name(other) : "") + " CPU tensor");
    check(api.get_sizes(t, sizes), "read sizes");
    check(api.get_strides(t, &strides), "read strides");
    int64_t expected = 1, numel = 1;
    for (int64_t d = 0; d < dim; d++) numel *= (*sizes)[d];
    for (int64_t d = dim - 1; d >= 0 && numel > 0; d--) {
        if ((*sizes)[d] != 1 && strides[d] != expected)
            throw std::runtime_error(std::string(op) + ": " + name + " must be contiguous");
        expected *= (*sizes)[d];
    }
    check(api.get_data_ptr(t, &data), "read a data pointer");
    if (got != nullptr) *got = got_dtype;
    return data;
}

static void *contiguous_data(AtenTensorHandle t, const char *name, int32_t dtype, int64_t dim, int64_t **sizes) {
    return tensor_data(t, "agl::decode_attention", name, dtype, -1, dim, sizes);
}

struct Call {
    long count, kv_heads, group, head_dim, layer;
    const float *q, *kv;
    float *const *caches;
    const long *capacity, *positions;
    float *out;
};

static void run_pairs(int64_t begin, int64_t end, void *context) {
    const Call *c = (const Call *)context;
    attend_pairs(begin, end, c->count, c->kv_heads, c->group, c->head_dim, c->layer, c->q, c->caches, c->capacity,
                 c->positions, c->out);
}

static void decode_attention_kernel(StableIValue *stack, uint64_t arguments, uint64_t returns) {
    if (arguments != 7 || returns != 1) throw std::runtime_error("agl::decode_attention: unexpected schema");
    Owned owned;
    for (int i = 0; i < 5; i++) owned.handles[i] = (AtenTensorHandle)stack[i];
    int64_t layer = (int64_t)stack[5], kv_heads = (int64_t)stack[6];
    int64_t *q_sizes, *kv_sizes, *pointer_sizes, *capacity_sizes, *position_sizes;
    Call call;
    call.q = (const float *)contiguous_data(owned.handles[0], "q", api.float32, 3, &q_sizes);
    call.kv = (const float *)contiguous_data(owned.handles[1], "kv", api.float32, 4, &kv_sizes);
    call.caches = (float *const *)contiguous_data(owned.handles[2], "pointers", api.int64, 1, &pointer_sizes);
    call.capacity = (const long *)contiguous_data(owned.handles[3], "capacity", api.int64, 1, &capacity_sizes);
    call.positions = (const long *)contiguous_data(owned.handles[4], "positions", api.int64, 1, &position_sizes);
    int64_t rows = q_sizes[0], heads = q_sizes[1], head_dim = q_sizes[2];
    if (kv_heads < 1 || heads % kv_heads != 0 || head_dim % 8 != 0 || layer < 0)
        throw std::runtime_error("agl::decode_attention: heads must be a multiple of kv_heads, head_dim of 8, "
                                 "and layer at least 0");
    if (kv_sizes[0] != rows || kv_sizes[1] != 2 || kv_sizes[2] != kv_heads || kv_sizes[3] != head_dim ||
        pointer_sizes[0] != rows || capacity_sizes[0] != rows || position_sizes[0] != rows)
        throw std::runtime_error("agl::decode_attention: kv must be [rows, 2, kv_heads, head_dim] and pointers, "
                                 "capacity and positions hold one entry per row of q");
    for (int64_t r = 0; r < rows; r++)
        if (call.positions[r] < 0 || call.positions[r] >= call.capacity[r])
            throw std::runtime_error("agl::decode_attention: a position lies outside its cache's capacity");
    int64_t sizes[2] = {rows, heads * head_dim}, strides[2] = {heads * head_dim, 1};
    AtenTensorHandle out;
    check(api.empty_strided(2, sizes, strides, api.float32, api.cpu, 0, &out), "allocate the output");
    void *out_data;
    check(api.get_data_ptr(out, &out_data), "read a data pointer");
    call.out = (float *)out_data;
    call.count = rows * kv_heads, call.kv_heads = kv_heads, call.group = heads / kv_heads, call.head_dim = head_dim, call.layer = layer;
    store_rows(rows, kv_heads, head_dim, layer, call.kv, call.caches, call.capacity, call.positions);
    if (api.parallel_for(0, rows * kv_heads, 1, run_pairs, &call) != 0) {
        api.delete_tensor(out);
        throw std::runtime_error("agl::decode_attention: torch could not run the pairs on its threads");
    }
    stack[0] = (StableIValue)out; /* torch owns it from here */
}

/* ---- the ops between a decode step's products: each row by itself, in a fixed order (batch invariant), in one
 * call instead of the five to ten torch operations each replaces. A product's output comes in as float32 or
 * bfloat16 (widened exactly); what feeds the next product goes out as that product wants it (`mode`, as in
 * scripted.py: 0 and 3 float32, 1 bfloat16, 2 float32 rounded to bfloat16), rounded to nearest even as torch
 * rounds. ---- */

static inline float widen(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t to_bfloat16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

/* Element i of a row that is float32 or bfloat16. */
struct Row {
    const void *data;
    bool bf16;
    inline float operator[](int64_t i) const {
        return bf16 ? widen(((const uint16_t *)data)[i]) : ((const float *)data)[i];
    }
    inline v8 load8(int64_t i) const {
        if (!bf16) return ::load8((const float *)data + i);
        v8 v;
        for (int k = 0; k < 8; k++) v[k] = widen(((const uint16_t *)data)[i + k]);
        return v;
    }
};

/* Writes a row of float32 values in the mode's dtype. */
static void store(float *values, int64_t n, int64_t mode, void *out) {
    if (mode == 1) {
        uint16_t *o = (uint16_t *)out;
        for (int64_t i = 0; i < n; i++) o[i] = to_bfloat16(values[i]);
    } else if (mode == 2) {
        float *o = (float *)out;
        for (int64_t i = 0; i < n; i++) o[i] = widen(to_bfloat16(values[i]));
    } else {
        memcpy(out, values, sizeof(float) * (size_t)n);
    }
}

static AtenTensorHandle new_tensor(int64_t rows, int64_t columns, int32_t dtype, void **data) {
    int64_t sizes[2] = {rows, columns}, strides[2] = {columns, 1};
    AtenTensorHandle out;
    check(api.empty_strided(2, sizes, strides, dtype, api.cpu, 0, &out), "allocate an output");
    if (api.get_data_ptr(out, data) != 0) {
        api.delete_tensor(out);
        throw std::runtime_error("agl: torch could not read a data pointer");
    }
    return out;
}

/* Outputs made so far, freed if the op fails before handing them to torch. */
struct Made {
    AtenTensorHandle handles[2] = {};
    int count = 0;
    AtenTensorHandle add(AtenTensorHandle h) { return handles[count++] = h; }
    void release() { count = 0; }
    ~Made() {
        for (int i = 0; i < count; i++) api.delete_tensor(handles[i]);
    }
};

static int32_t mode_dtype(int64_t mode, const char *op) {
    if (mode < 0 || mode > 3) throw std::runtime_error(std::string(op) + ": mode must be 0, 1, 2 or 3");
    return mode == 1 ? api.bfloat16 : api.float32;
}

/* x * rsqrt(mean(x^2) + eps) * weight for one row of d values (d a multiple of 8): the squares summed 8 lanes at
 * a time, then the lanes in a fixed order. */
static void rms_norm_row(const float *x, const float *weight, int64_t d, double eps, float *out) {
    v8 acc = {0};
    for (int64_t i = 0; i < d; i += 8) {
        v8 v = load8(x + i);
        acc += v * v;
    }
    float inverse = 1.0f / sqrtf(lane_sum(acc) / (float)d + (float)eps);
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * inverse * weight[i];
}

/* add_rms_norm(Tensor x, Tensor delta, Tensor weight, float eps, int mode) -> (Tensor, Tensor): x + delta (the
 * residual stream, float32) and its norm in the next product's dtype. An empty delta adds nothing. */
static void add_rms_norm_kernel(StableIValue *stack, uint64_t arguments, uint64_t returns) {
    const char *op = "agl::add_rms_norm";
    if (arguments != 5 || returns != 2) throw std::runtime_error("agl::add_rms_norm: unexpected schema");
    Owned owned;
    for (int i = 0; i < 3; i++) owned.handles[i] = (AtenTensorHandle)stack[i];
    double eps;
    memcpy(&eps, &stack[3], sizeof eps);
    int64_t mode = (int64_t)stack[4];
    int32_t out_dtype = mode_dtype(mode, op), delta_dtype;
    int64_t *x_sizes, *delta_sizes, *weight_sizes;
    const float *x = (const float *)tensor_data(owned.handles[0], op, "x", api.float32, -1, 2, &x_sizes);
    const void *delta = tensor_data(owned.handles[1], op, "delta", api.float32, api.bfloat16, 2, &delta_sizes,
                                    &delta_dtype);
    const float *weight = (const float *)tensor_data(owned.handles[2], op, "weight", api.float32, -1, 1,
                                                     &weight_sizes);
    int64_t rows = x_sizes[0], d = x_sizes[1];
    bool adds = delta_sizes[0] * delta_sizes[1] != 0;
    if (d % 8 != 0 || weight_sizes[0] != d || (adds && (delta_sizes[0] != rows || delta_sizes[1] != d)))
        throw std::runtime_error("agl::add_rms_norm: x must be [rows, d] with d a multiple of 8, delta empty or "
                                 "[rows, d], weight [d]");
    Made made;
    void *sum_data, *norm_data;
    made.add(new_tensor(rows, d, api.float32, &sum_data));
    made.add(new_tensor(rows, d, out_dtype, &norm_data));
    float *sum = (float *)sum_data, *normed = (float *)malloc(sizeof(float) * (size_t)d);
    if (normed == nullptr) abort();
    Row added = {delta, delta_dtype == api.bfloat16};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < d; i++) sum[r * d + i] = adds ? x[r * d + i] + added[r * d + i] : x[r * d + i];
        rms_norm_row(sum + r * d, weight, d, eps, normed);
        store(normed, d, mode, (char *)norm_data + r * d * (mode == 1 ? 2 : 4));
    }
    free(normed);
    stack[0] = (StableIValue)made.handles[0];
    stack[1] = (StableIValue)made.handles[1];
    made.release();
}

/* rotary(Tensor qkv, Tensor cos, Tensor sin, int heads, int kv_heads, float scale) -> (Tensor q, Tensor kv): the
 * q/k/v product's output [rows, (heads + 2 kv_heads) head_dim] as the attention takes it, rotary embeddings as
 * Hugging Face's Llama applies them (rotate_half), queries then scaled: q [rows, heads, head_dim], kv [rows, 2,
 * kv_heads, head_dim] (keys rotated, values as they are). cos and sin: [rows, head_dim]. */
static void rotary_kernel(StableIValue *stack, uint64_t arguments, uint64_t returns) {
    const char *op = "agl::rotary";
    if (arguments != 6 || returns != 2) throw std::runtime_error("agl::rotary: unexpected schema");
    Owned owned;
    for (int i = 0; i < 3; i++) owned.handles[i] = (AtenTensorHandle)stack[i];
    int64_t heads = (int64_t)stack[3], kv_heads = (int64_t)stack[4];
    double scale_d;
    memcpy(&scale_d, &stack[5], sizeof scale_d);
    float scale = (float)scale_d;
    int32_t qkv_dtype;
    int64_t *qkv_sizes, *cos_sizes, *sin_sizes;
    const void *qkv = tensor_data(owned.handles[0], op, "qkv", api.float32, api.bfloat16, 2, &qkv_sizes, &qkv_dtype);
    const float *cos = (const float *)tensor_data(owned.handles[1], op, "cos", api.float32, -1, 2, &cos_sizes);
    const float *sin = (const float *)tensor_data(owned.handles[2], op, "sin", api.float32, -1, 2, &sin_sizes);
    int64_t rows = qkv_sizes[0], head_dim = cos_sizes[1], all = heads + 2 * kv_heads;
    if (heads < 1 || kv_heads < 1 || head_dim % 2 != 0 || qkv_sizes[1] != all * head_dim || cos_sizes[0] != rows ||
        sin_sizes[0] != rows || sin_sizes[1] != head_dim)
        throw std::runtime_error("agl::rotary: qkv must be [rows, (heads + 2 kv_heads) head_dim], cos and sin "
                                 "[rows, head_dim] with head_dim even");
    Made made;
    void *q_data, *kv_data;
    made.add(new_tensor(rows, heads * head_dim, api.float32, &q_data));
    made.add(new_tensor(rows, 2 * kv_heads * head_dim, api.float32, &kv_data));
    float *q = (float *)q_data, *kv = (float *)kv_data;
    Row in = {qkv, qkv_dtype == api.bfloat16};
    int64_t half = head_dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos + r * head_dim, *s = sin + r * head_dim;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            int64_t at = (r * all + h) * head_dim;
            float *o = h < heads ? q + (r * heads + h) * head_dim : kv + (r * 2 * kv_heads + h - heads) * head_dim;
            for (int64_t i = 0; i < head_dim; i++) {
                float turned = i < half ? -in[at + i + half] : in[at + i - half];
                float value = in[at + i] * c[i] + turned * s[i];
                o[i] = h < heads ? value * scale : value;
            }
        }
        for (int64_t h = 0; h < kv_heads; h++) {
            int64_t at = (r * all + heads + kv_heads + h) * head_dim;
            float *o = kv + ((r * 2 + 1) * kv_heads + h) * head_dim;
            for (int64_t i = 0; i < head_dim; i++) o[i] = in[at + i];
        }
    }
    stack[0] = (StableIValue)made.handles[0];
    stack[1] = (StableIValue)made.handles[1];
    made.release();
}

/* e^x for any x, 8 lanes: exp8 of x <= 0, and of x > 0 as 1 / e^-x. */
static inline v8 sigmoid8(v8 x) {
    v8i positive = x > v8splat(0.0f);
    v8 e = exp8((v8)((v8i)(-x) & positive) + (v8)((v8i)x & ~positive)); /* e^-|x| */
    v8 one = v8splat(1.0f);
    /* x > 0: 1 / (1 + e^-x); else e^x / (1 + e^x) */
    return (v8)(((v8i)(one / (one + e)) & positive) + ((v8i)(e / (one + e)) & ~positive));
}

/* silu_mul(Tensor gate_up, int mode) -> Tensor: silu(gate) * up for the gate/up product's output [rows, 2 f]
 * (gate first), in the down product's dtype. */
static void silu_mul_kernel(StableIValue *stack, uint64_t arguments, uint64_t returns) {
    const char *op = "agl::silu_mul";
    if (arguments != 2 || returns != 1) throw std::runtime_error("agl::silu_mul: unexpected schema");
    Owned owned;
    owned.handles[0] = (AtenTensorHandle)stack[0];
    int64_t mode = (int64_t)stack[1];
    int32_t out_dtype = mode_dtype(mode, op), in_dtype;
    int64_t *sizes;
    const void *gate_up = tensor_data(owned.handles[0], op, "gate_up", api.float32, api.bfloat16, 2, &sizes, &in_dtype);
    int64_t rows = sizes[0], f = sizes[1] / 2;
    if (sizes[1] % 16 != 0) throw std::runtime_error("agl::silu_mul: gate_up must be [rows, 2 f], f a multiple of 8");
    Made made;
    void *out_data;
    made.add(new_tensor(rows, f, out_dtype, &out_data));
    float *values = (float *)malloc(sizeof(float) * (size_t)f);
    if (values == nullptr) abort();
    Row in = {gate_up, in_dtype == api.bfloat16};
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < f; i += 8) {
            v8 g = in.load8(r * 2 * f + i), u = in.load8(r * 2 * f + f + i);
            v8 v = g * sigmoid8(g) * u;
            memcpy(values + i, &v, sizeof v);
        }
        store(values, f, mode, (char *)out_data + r * f * (mode == 1 ? 2 : 4));
    }
    free(values);
    stack[0] = (StableIValue)made.handles[0];
    made.release();
}

/* ---- float32 products x @ W.T for W packed in panels: [panels, K, PANEL], panel p holding the outputs
 * p PANEL .. p PANEL + PANEL - 1 of every k together (`pack_panels` in decode_kernels.py). Each output is one
 * chain of fused multiply-adds over k in order: what else the batch holds, how rows are grouped in blocks and
 * panels in items, and which thread computes them change nothing in it. At a decode step's 8 rows this reads the
 * weights at about 26 GB/s on 2 cores where oneDNN's float32 product read them at about 16; at a prefill's
 * hundreds of rows it computes as fast as oneDNN. ---- */
#ifdef __AVX512F__
#define PANEL 16
#define PANELS_PER_ITEM 3 /* 3 panels of 8 rows: 24 accumulators of the 32 vector registers */
#define BLOCK_ROWS 8
#else
#define PANEL 8
#define PANELS_PER_ITEM 2 /* 2 panels of 4 rows: 8 accumulators of the 16 vector registers */
#define BLOCK_ROWS 4
#endif
typedef float vpanel __attribute__((vector_size(PANEL * sizeof(float))));

extern "C" long agl_panel_width(void) { return PANEL; }

/* Each thread streams its panels from memory, three streams at a time; the hardware prefetcher alone left the
 * decode step's products at about 22 GB/s of the 27-28 a plain read reaches on 2 cores here. Asking for the
 * weights 2 KiB ahead of each stream brings them to about 26. A prefetch past the end of the weights is harmless:
 * it never faults. */
#define PREFETCH_STEPS (2048 / (PANEL * (int)sizeof(float)))

/* `count` panels from `w` for one block of `rows` rows of x (row stride `k_size`); rows past the last repeat it
 * (computed, not stored), so the block's loop is the same whatever the batch. */
template <int count>
static void panel_block(const float *x, int64_t k_size, const float *w, float *y, int64_t rows, int64_t n) {
    const float *xr[BLOCK_ROWS];
    for (int r = 0; r < BLOCK_ROWS; r++) xr[r] = x + (r < rows ? r : rows - 1) * k_size;
    vpanel acc[count][BLOCK_ROWS] = {};
    for (int64_t k = 0; k < k_size; k++) {
        for (int p = 0; p < count; p++) {
            __builtin_prefetch(w + (p * k_size + k + PREFETCH_STEPS) * PANEL, 0, 3);
            vpanel wk;
            memcpy(&wk, w + (p * k_size + k) * PANEL, sizeof wk);
            for (int r = 0; r < BLOCK_ROWS; r++) acc[p][r] += xr[r][k] * wk;
        }
    }
    for (int p = 0; p < count; p++)
        for (int64_t r = 0; r < rows; r++) memcpy(y + r * n + p * PANEL, &acc[p][r], sizeof(vpanel));
}

struct PanelCall {
    const float *x, *w;
    float *y;
    int64_t rows, k_size, n, panels;
};

static void run_panels(int64_t begin, int64_t end, void *context) {
    const PanelCall *c = (const PanelCall *)context;
    for (int64_t item = begin; item < end; item++) {
        int64_t first = item * PANELS_PER_ITEM, count = c->panels - first;
        const float *w = c->w + first * c->k_size * PANEL;
        for (int64_t row = 0; row < c->rows; row += BLOCK_ROWS) {
            const float *x = c->x + row * c->k_size;
            float *y = c->y + row * c->n + first * PANEL;
            int64_t rows = c->rows - row < BLOCK_ROWS ? c->rows - row : BLOCK_ROWS;
            if (count >= 3 && PANELS_PER_ITEM >= 3) panel_block<PANELS_PER_ITEM>(x, c->k_size, w, y, rows, c->n);
            else if (count >= 2) panel_block<2>(x, c->k_size, w, y, rows, c->n);
            else panel_block<1>(x, c->k_size, w, y, rows, c->n);
        }
    }
}

/* panel_product(Tensor x, Tensor panels) -> Tensor: x [rows, K] float32 times the packed weight [panels, K,
 * PANEL]: [rows, panels * PANEL]. */
static void panel_product_kernel(StableIValue *stack, uint64_t arguments, uint64_t returns) {
    const char *op = "agl::panel_product";
    if (arguments != 2 || returns != 1) throw std::runtime_error("agl::panel_product: unexpected schema");
    Owned owned;
    owned.handles[0] = (AtenTensorHandle)stack[0];
    owned.handles[1] = (AtenTensorHandle)stack[1];
    int64_t *x_sizes, *w_sizes;
    const float *x = (const float *)tensor_data(owned.handles[0], op, "x", api.float32, -1, 2, &x_sizes);
    const float *w = (const float *)tensor_data(owned.handles[1], op, "panels", api.float32, -1, 3, &w_sizes);
    int64_t rows = x_sizes[0], k_size = x_sizes[1], panels = w_sizes[0];
    if (w_sizes[1] != k_size || w_sizes[2] != PANEL)
        throw std::runtime_error("agl::panel_product: panels must be [panels, K, " + std::to_string(PANEL) +
                                 "] for x [rows, K]");
    Made made;
    void *y;
    made.add(new_tensor(rows, panels * PANEL, api.float32, &y));
    PanelCall call = {x, w, (float *)y, rows, k_size, panels * PANEL, panels};
    int32_t status = rows == 0 ? 0 : api.parallel_for(0, (panels + PANELS_PER_ITEM - 1) / PANELS_PER_ITEM, 1,
                                                      run_panels, &call);
    check(status, "run the panels on its threads");
    stack[0] = (StableIValue)made.handles[0];
    made.release();
}

extern "C" int agl_register_operator(const struct torch_api *given) {
    api = *given;
    TorchLibraryHandle library;
    if (api.library_init_impl("agl", "CPU", __FILE__, __LINE__, &library) != 0) return 1;
    /* The library object stays registered for the life of the process, as a TORCH_LIBRARY_IMPL would. */
    if (api.library_impl(library, "decode_attention", decode_attention_kernel) != 0) return 2;
    if (api.library_impl(library, "add_rms_norm", add_rms_norm_kernel) != 0) return 3;
    if (api.library_impl(library, "rotary", rotary_kernel) != 0) return 4;
    if (api.library_impl(library, "silu_mul", silu_mul_kernel) != 0) return 5;
    return api.library_impl(library, "panel_product", panel_product_kernel) != 0 ? 6 : 0;
}
