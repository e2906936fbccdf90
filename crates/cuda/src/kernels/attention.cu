// Paged grouped-query decode attention over a CSR page table, bf16 or fp8 K/V (kv_elem.cu,
// input16.cu and attention_mma.cu are compiled in front), f32 arithmetic; fp8 pages of the
// common geometry on the tensor cores (attention_mma.cu).
// Defines: KV_FP8, HEAD_DIM, PAGE_SIZE, GROUP (query heads per KV head), WARPS (per block),
// MIN_BLOCKS (blocks per multiprocessor that the register allocation must leave room for),
// PREFETCH (1: each warp loads its next page while it works on the current one),
// F16_INPUT_SHIFT (input16.cu), KV_SPLIT (work items per KV head, each for GROUP of its query
// heads: a KV head's query heads split into groups the kernel holds; kv_heads and an item's
// head then count items, KV head = head / KV_SPLIT), FIRST_SKIPS (1: a row's last_len also
// holds, in bits 16 and up, how many leading tokens of its first page it skips, for sliding-window
// layers; such builds read pages on the CUDA cores).
//
// One block runs one work item: pages [start, end) of one page-table row, for one KV head and
// all GROUP query heads that share it, so every key and value is read once. The block's warps
// take the item's pages in turn; in a warp, LPT lanes hold one token's row (8 dims each, one
// vector load), so a warp-wide load covers TPL tokens and a page takes LOADS loads of K and of V.
// A warp holds at most 8 loads of each at once: a page of longer rows (HEAD_DIM 256) is taken in
// STEPS steps of STEP_LOADS loads, which would otherwise spill its K and V rows to local memory.
// A token's GROUP dot products are summed over its LPT lanes. When GROUP is a power of two no
// larger than LPT, the sums are transposed as they go (each exchange step halves the heads a
// lane carries), so a lane ends with one head's score and the softmax runs once per score
// instead of once per lane; the probabilities are then broadcast to the lanes holding V.
// Each warp keeps an online softmax per query head; the block merges its warps in shared
// memory. An item that is a whole row writes the output; a row split into several items writes
// normalised partial outputs and their log-sums, and the block that finishes a row's last
// item merges them (the split-K merge, without a second launch).

#define LPT (HEAD_DIM / 8)
#define TPL (32 / LPT)
#define LOADS ((PAGE_SIZE + TPL - 1) / TPL)
#define STEP_LOADS (LOADS < 8 ? LOADS : 8)
#define STEPS ((LOADS + STEP_LOADS - 1) / STEP_LOADS)
#define STEP_TOKENS (STEP_LOADS * TPL)
#define ROW_VEC (HEAD_DIM / 8)
#define FULL 0xffffffffu
#define NEG_INF (__int_as_float(0xff800000))
#define PAGE_VEC (PAGE_SIZE * ROW_VEC)
#ifndef FIRST_SKIPS
#define FIRST_SKIPS 0
#endif
#define HEAD_LANES (LPT / GROUP)
// Launched as a dependent of the previous kernel (launch.rs), a grid may start while that
// kernel drains: nothing it wrote is read before this wait.
#if __CUDA_ARCH__ >= 900
#define DEPENDENT_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#else
#define DEPENDENT_WAIT()
#endif
#if (GROUP & (GROUP - 1)) == 0 && GROUP <= LPT
#define TRANSPOSED 1
#else
#define TRANSPOSED 0
#endif

struct __align__(16) Work {
    int row, head, start, end;   // pages [start, end) of `row`, read for KV head `head`
    int seq, part, first, count; // output sequence; partial slot; the row's first slot, items
};

// Loads step `step` of one page's K and V rows for this lane: of its tokens, those in
// [lo, valid), zeros for the others (never read).
__device__ __forceinline__ void load_step(const kv_vec* __restrict__ kpool,
                                          const kv_vec* __restrict__ vpool, unsigned int page,
                                          int step, int head, int kv_heads, int dl, int tg,
                                          int lo, int valid, kv_vec* kr, kv_vec* vr) {
    const size_t off = ((size_t)page * (kv_heads / KV_SPLIT) + head / KV_SPLIT) * PAGE_VEC + dl;
#pragma unroll
    for (int i = 0; i < STEP_LOADS; i++) {
        const int tok = step * STEP_TOKENS + i * TPL + tg;
        if (tok >= lo && tok < valid) {
            kr[i] = __ldg(kpool + off + tok * ROW_VEC);
            vr[i] = __ldg(vpool + off + tok * ROW_VEC);
        } else {
            kr[i] = kv_zero();
            vr[i] = kv_zero();
        }
    }
}

// The output as the next product's input (input16.cu's to_input) instead of f32, where set.
struct Out16 {
    unsigned short* values;
    int f16;
};

__device__ __forceinline__ void put(float* out, Out16 out16, size_t i, float v) {
    if (out16.values != nullptr)
        out16.values[i] = to_input(v, out16.f16);
    else
        out[i] = v;
}

template <class Ids>
__device__ __forceinline__ void run_item(
    const Work w, const kv_vec* __restrict__ kpool, const kv_vec* __restrict__ vpool,
    const unsigned int* __restrict__ indptr, const Ids indices,
    const unsigned int* __restrict__ last_len, const float* __restrict__ q, int kv_heads,
    float scale_log2, float* __restrict__ out, float* __restrict__ part_o,
    float* __restrict__ part_lse, unsigned int* __restrict__ counters, Out16 out16) {
    __shared__ float sm_acc[WARPS][GROUP][HEAD_DIM];
    __shared__ float sm_m[WARPS][GROUP];
    __shared__ float sm_l[WARPS][GROUP];
    __shared__ unsigned int sm_last;
    __shared__ float sm_row_m[GROUP], sm_row_inv[GROUP];

    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
#if MMA_PAGES
    mma_pages(w, kpool, vpool, indptr, indices, last_len, q, kv_heads, scale_log2, warp, lane,
              sm_acc[warp], sm_m[warp], sm_l[warp]);
#else
    const int tg = lane / LPT;  // token within a load
    const int dl = lane % LPT;  // dims [8 dl, 8 dl + 8)

    // This lane's 8 dims of every query head of the group, pre-scaled for exp2.
    float qr[GROUP][8];
    const float* qg = q + ((size_t)w.seq * kv_heads + w.head) * GROUP * HEAD_DIM + dl * 8;
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        const float4 a = *reinterpret_cast<const float4*>(qg + h * HEAD_DIM);
        const float4 b = *reinterpret_cast<const float4*>(qg + h * HEAD_DIM + 4);
        qr[h][0] = a.x * scale_log2; qr[h][1] = a.y * scale_log2;
        qr[h][2] = a.z * scale_log2; qr[h][3] = a.w * scale_log2;
        qr[h][4] = b.x * scale_log2; qr[h][5] = b.y * scale_log2;
        qr[h][6] = b.z * scale_log2; qr[h][7] = b.w * scale_log2;
    }
    float m[GROUP], l[GROUP], acc[GROUP][8];
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        m[h] = NEG_INF;
        l[h] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[h][j] = 0.f;
    }

    const unsigned int base = indptr[w.row];
    const int row_pages = (int)(indptr[w.row + 1] - base);
#if FIRST_SKIPS
    const int last = (int)(last_len[w.row] & 0xffffu), skip = (int)(last_len[w.row] >> 16);
#else
    const int last = (int)last_len[w.row], skip = 0;
#endif
#if TRANSPOSED
    float ml = NEG_INF, ll = 0.f;  // running max and sum of this lane's head
#endif
    kv_vec kr[STEP_LOADS], vr[STEP_LOADS];
#if PREFETCH
    // The next step's K and V (and the page id after them) are in flight while this one is used.
    unsigned int page = w.start + warp < w.end ? indices[base + w.start + warp] : 0u;
    unsigned int next = w.start + warp + WARPS < w.end ? indices[base + w.start + warp + WARPS] : 0u;
    if (w.start + warp < w.end)
        load_step(kpool, vpool, page, 0, w.head, kv_heads, dl, tg, w.start + warp == 0 ? skip : 0,
                  w.start + warp == row_pages - 1 ? last : PAGE_SIZE, kr, vr);
#endif
    for (int p = w.start + warp; p < w.end; p += WARPS) {
        const int valid = p == row_pages - 1 ? last : PAGE_SIZE;
        // Tokens of the row's first page before a sliding window.
        const int lo = p == 0 ? skip : 0;
#if !PREFETCH
        const unsigned int page = indices[base + p];
#endif
#pragma unroll
        for (int step = 0; step < STEPS; step++) {
#if PREFETCH
            kv_vec kn[STEP_LOADS], vn[STEP_LOADS];
            const int pn = p + WARPS;
            if (step + 1 < STEPS) {
                load_step(kpool, vpool, page, step + 1, w.head, kv_heads, dl, tg, lo, valid, kn,
                          vn);
            } else if (pn < w.end) {
                load_step(kpool, vpool, next, 0, w.head, kv_heads, dl, tg, 0,
                          pn == row_pages - 1 ? last : PAGE_SIZE, kn, vn);
                page = next;
                if (pn + WARPS < w.end) next = indices[base + pn + WARPS];
            }
#else
            load_step(kpool, vpool, page, step, w.head, kv_heads, dl, tg, lo, valid, kr, vr);
#endif
#if TRANSPOSED
            float sc[STEP_LOADS];
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                float kf[8], v[GROUP];
                kv_unpack8(kr[i], kf);
#pragma unroll
                for (int h = 0; h < GROUP; h++) {
                    float a = 0.f;
#pragma unroll
                    for (int j = 0; j < 8; j++) a = fmaf(qr[h][j], kf[j], a);
                    v[h] = a;
                }
                // Halve the heads per lane at each exchange: the upper lane keeps the upper half.
#pragma unroll
                for (int n = GROUP, o = LPT / 2; n > 1; n >>= 1, o >>= 1) {
                    const bool upper = (lane & o) != 0;
#pragma unroll
                    for (int j = 0; j < n / 2; j++) {
                        const float send = upper ? v[j] : v[j + n / 2];
                        const float keep = upper ? v[j + n / 2] : v[j];
                        v[j] = keep + __shfl_xor_sync(FULL, send, o);
                    }
                }
#pragma unroll
                for (int o = HEAD_LANES / 2; o > 0; o >>= 1) v[0] += __shfl_xor_sync(FULL, v[0], o);
                const int tok = step * STEP_TOKENS + i * TPL + tg;
                sc[i] = tok >= lo && tok < valid ? v[0] : NEG_INF;
            }
            float mx = sc[0];
#pragma unroll
            for (int i = 1; i < STEP_LOADS; i++) mx = fmaxf(mx, sc[i]);
#pragma unroll
            for (int o = LPT; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
            const float mn = fmaxf(ml, mx);
            // A step with no token in [lo, valid) (half of a row's last page) before any that
            // has one leaves the maximum at -inf: subtract 0 then, not -inf.
            const float mb = mn == NEG_INF ? 0.f : mn;
            const float corr = exp2f(ml - mb);
            ml = mn;
            ll *= corr;
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                sc[i] = exp2f(sc[i] - mb);
                ll += sc[i];
            }
#pragma unroll
            for (int h = 0; h < GROUP; h++) {
                const float c = __shfl_sync(FULL, corr, h * HEAD_LANES);
#pragma unroll
                for (int j = 0; j < 8; j++) acc[h][j] *= c;
            }
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                float vf[8];
                kv_unpack8(vr[i], vf);
#pragma unroll
                for (int h = 0; h < GROUP; h++) {
                    const float pr = __shfl_sync(FULL, sc[i], tg * LPT + h * HEAD_LANES);
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[h][j] = fmaf(pr, vf[j], acc[h][j]);
                }
            }
#else
            float s[STEP_LOADS][GROUP];
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                float kf[8];
                kv_unpack8(kr[i], kf);
#pragma unroll
                for (int h = 0; h < GROUP; h++) {
                    float a = 0.f;
#pragma unroll
                    for (int j = 0; j < 8; j++) a = fmaf(qr[h][j], kf[j], a);
                    s[i][h] = a;
                }
            }
#pragma unroll
            for (int o = LPT / 2; o > 0; o >>= 1) {
#pragma unroll
                for (int i = 0; i < STEP_LOADS; i++)
#pragma unroll
                    for (int h = 0; h < GROUP; h++) s[i][h] += __shfl_xor_sync(FULL, s[i][h], o);
            }
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                const int tok = step * STEP_TOKENS + i * TPL + tg;
                if (tok < lo || tok >= valid)
#pragma unroll
                    for (int h = 0; h < GROUP; h++) s[i][h] = NEG_INF;
            }
#pragma unroll
            for (int h = 0; h < GROUP; h++) {
                float mx = s[0][h];
#pragma unroll
                for (int i = 1; i < STEP_LOADS; i++) mx = fmaxf(mx, s[i][h]);
#pragma unroll
                for (int o = LPT; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
                const float mn = fmaxf(m[h], mx);
                const float mb = mn == NEG_INF ? 0.f : mn;  // as in the transposed sums
                const float corr = exp2f(m[h] - mb);
                m[h] = mn;
                l[h] *= corr;
#pragma unroll
                for (int j = 0; j < 8; j++) acc[h][j] *= corr;
#pragma unroll
                for (int i = 0; i < STEP_LOADS; i++) {
                    const float e = exp2f(s[i][h] - mb);
                    s[i][h] = e;
                    l[h] += e;
                }
            }
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                float vf[8];
                kv_unpack8(vr[i], vf);
#pragma unroll
                for (int h = 0; h < GROUP; h++)
#pragma unroll
                    for (int j = 0; j < 8; j++) acc[h][j] = fmaf(s[i][h], vf[j], acc[h][j]);
            }
#endif
#if PREFETCH
#pragma unroll
            for (int i = 0; i < STEP_LOADS; i++) {
                kr[i] = kn[i];
                vr[i] = vn[i];
            }
#endif
        }
    }
#if TRANSPOSED
    // Every lane holding head h has its max; sum the token groups, then spread per head.
#pragma unroll
    for (int o = LPT; o < 32; o <<= 1) ll += __shfl_xor_sync(FULL, ll, o);
#pragma unroll
    for (int h = 0; h < GROUP; h++) {
        m[h] = __shfl_sync(FULL, ml, h * HEAD_LANES);
        l[h] = __shfl_sync(FULL, ll, h * HEAD_LANES);
    }
#endif

    // Sum the token groups of the warp: lanes with the same dims then hold the warp's totals.
#pragma unroll
    for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
#if !TRANSPOSED
            l[h] += __shfl_xor_sync(FULL, l[h], o);
#endif
#pragma unroll
            for (int j = 0; j < 8; j++) acc[h][j] += __shfl_xor_sync(FULL, acc[h][j], o);
        }
    }
    if (lane < LPT) {
#pragma unroll
        for (int h = 0; h < GROUP; h++)
#pragma unroll
            for (int j = 0; j < 8; j++) sm_acc[warp][h][lane * 8 + j] = acc[h][j];
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < GROUP; h++) {
            sm_m[warp][h] = m[h];
            sm_l[warp][h] = l[h];
        }
    }
#endif
    __syncthreads();

    const size_t out_base = ((size_t)w.seq * kv_heads + w.head) * GROUP * HEAD_DIM;
    for (int idx = threadIdx.x; idx < GROUP * HEAD_DIM; idx += WARPS * 32) {
        const int h = idx / HEAD_DIM;
        float mx = NEG_INF;
#pragma unroll
        for (int i = 0; i < WARPS; i++) mx = fmaxf(mx, sm_m[i][h]);
        float sum = 0.f, o = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; i++) {
            const float c = exp2f(sm_m[i][h] - mx);  // 0 for a warp that had no page
            sum += sm_l[i][h] * c;
            o += sm_acc[i][h][idx % HEAD_DIM] * c;
        }
        if (w.count == 1) {
            put(out, out16, out_base + idx, o / sum);
        } else {
            part_o[(size_t)w.part * GROUP * HEAD_DIM + idx] = o / sum;
            if (idx % HEAD_DIM == 0) part_lse[(size_t)w.part * GROUP + h] = mx + log2f(sum);
        }
    }
    if (w.count == 1) return;

    // The last item of a split row to finish merges the row's partial results.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sm_last = atomicAdd(&counters[w.first], 1u) == (unsigned int)(w.count - 1);
    __syncthreads();
    if (!sm_last) return;
    __threadfence();
    // Each query head's largest log-sum over the row's items and its softmax denominator, a warp
    // a head with the items across its lanes; then every output sums the items' partial outputs
    // several loads at a time (a row of HEAD_DIM 256 split in 24 items waited on 48 dependent
    // loads per output before).
    const float* lse = part_lse + (size_t)w.first * GROUP;
    for (int h = warp; h < GROUP; h += WARPS) {
        float mx = NEG_INF;
        for (int c = lane; c < w.count; c += 32) mx = fmaxf(mx, __ldcg(lse + (size_t)c * GROUP + h));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
        float sum = 0.f;
        for (int c = lane; c < w.count; c += 32) sum += exp2f(__ldcg(lse + (size_t)c * GROUP + h) - mx);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL, sum, o);
        if (lane == 0) {
            sm_row_m[h] = mx;
            sm_row_inv[h] = 1.f / sum;
        }
    }
    __syncthreads();
    const float* parts = part_o + (size_t)w.first * GROUP * HEAD_DIM;
    for (int idx = threadIdx.x; idx < GROUP * HEAD_DIM; idx += WARPS * 32) {
        const int h = idx / HEAD_DIM;
        const float mx = sm_row_m[h];
        float o = 0.f;
#pragma unroll 8
        for (int c = 0; c < w.count; c++)
            o += exp2f(__ldcg(lse + (size_t)c * GROUP + h) - mx) *
                 __ldcg(parts + (size_t)c * GROUP * HEAD_DIM + idx);
        put(out, out16, out_base + idx, o * sm_row_inv[h]);
    }
    if (threadIdx.x == 0) counters[w.first] = 0;  // ready for the next launch
}

// One block per work item; the planner lists the items longest first, as the hardware tends to
// hand out blocks in index order. READY (the kernel paged_decode_ready): an item waits for its
// row's flag in `ready` (DeviceTable::ready) instead of the whole previous grid, for a table
// whose rows an index kernel writes (index_row.cu's RowReady); paged_decode takes a null
// `ready`. With `out16` (else null) the output is written there as the next product's input,
// `f16` saying which (input16.cu), and `out` is not written.
#define DECODE_PARAMS                                                                          \
    const kv_vec *__restrict__ kpool, const kv_vec *__restrict__ vpool,                        \
        const unsigned int *__restrict__ indptr, const unsigned int *__restrict__ indices,     \
        const unsigned int *__restrict__ last_len, const float *__restrict__ q,                \
        const Work *__restrict__ work, unsigned int items, int kv_heads, float scale_log2,     \
        float *__restrict__ out, float *__restrict__ part_o, float *__restrict__ part_lse,     \
        unsigned int *__restrict__ counters, const unsigned int *ready,                        \
        unsigned short *__restrict__ out16, int f16
#define DECODE_ARGS                                                                            \
    kpool, vpool, indptr, indices, last_len, q, work, items, kv_heads, scale_log2, out, part_o, \
        part_lse, counters, ready, out16, f16

template <bool READY>
__device__ __forceinline__ void decode_items(DECODE_PARAMS) {
    if (!READY) DEPENDENT_WAIT();
    if (blockIdx.x >= items) return;
    const Work w = work[blockIdx.x];
    if (READY) {
        // The row's pages are read only once the index block writing them has set its flag.
        // A flag still clear after half a minute or more means no index kernel ran before this
        // launch: that is a fault, not a wait.
        if (threadIdx.x == 0) {
            for (unsigned int spins = 0;; spins++) {
                unsigned int f;
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(f)
                             : "l"(ready + w.row)
                             : "memory");
                if (f != 0u) break;
                if (spins == (1u << 28)) __trap();
                __nanosleep(64);
            }
        }
        __syncthreads();
    }
    run_item(w, kpool, vpool, indptr, PageIds<READY>{indices}, last_len, q, kv_heads,
             scale_log2, out, part_o, part_lse, counters, Out16{out16, f16});
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
paged_decode(DECODE_PARAMS) {
    decode_items<false>(DECODE_ARGS);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_BLOCKS)
paged_decode_ready(DECODE_PARAMS) {
    decode_items<true>(DECODE_ARGS);
}
