// Index phase of the built-in double_sparse flow on the tensor cores: a page's score is the
// largest, over its tokens and the group's query heads, of the kept query channels dotted with
// the token's label (its key at those channels). topk.cu, mma.cu, scores.cu and index_row.cu
// are compiled in front of this file.
// Defines: HEAD_DIM, GROUP (at most 8), PAGE_SIZE (16), LABEL_COLS (kept channels, a multiple
// of 16). The label field is the generated cache phase's: [kv_head][pool page][PAGE_SIZE]
// [LABEL_COLS] bf16.
//
// One m16n8k16 product per 16 channels (two with more than 4 query heads) takes a page: its
// rows are the page's tokens, its columns the group's queries split into a bf16 part and the
// bf16 rest, as the centroid scorer's (QTILES). Lane (g, t) loads channels
// [16 c + 4 t, 16 c + 4 t + 4) of tokens g and g + 8 (8 bytes each), and its query fragments
// hold the same channels, so each dot product is unchanged by the permutation.

#define LABEL_CHUNKS (LABEL_COLS / 16)
#define LABEL_ROW (LABEL_COLS / 4)  // 8-byte pieces of a token's label
#define PAGES_AHEAD 8               // pages a warp has in flight

// grid: rows; block: TOPK_THREADS; dynamic shared memory: 4 bytes per candidate of the longest
// row. `channels` are the flow's kept channels; `tolerance > 0` selects the approximate top-k.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
label_index(const uint2* __restrict__ label, int num_pages,
            const unsigned int* __restrict__ dense_indptr,
            const unsigned int* __restrict__ dense_indices, const float* __restrict__ q,
            const int* __restrict__ channels, const SelRow* __restrict__ rows, int kv_heads,
            float tolerance, unsigned int* __restrict__ out, unsigned int* ready,
            int ready_at_block) {
    extern __shared__ unsigned int tk_keys[];
    __shared__ TopkShared s;
    const RowReady signal(ready, rows, kv_heads, ready_at_block);
    const SelRow r = rows[blockIdx.x];
    const unsigned int* logical = dense_indices + dense_indptr[r.seq];
    unsigned int* dst = out + r.out;
    write_edges(r, logical, dst);
    if (r.k <= 0) return;
    const int n = r.pages - r.sinks - r.recent;
    const unsigned int* cand = logical + r.sinks;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3, hq = QTILES == 1 ? g & 3 : g;

    const float* qrow = q + ((size_t)r.seq * kv_heads + r.head) * GROUP * HEAD_DIM;
    unsigned int qb[LABEL_CHUNKS][QTILES][2];
#pragma unroll
    for (int c = 0; c < LABEL_CHUNKS; c++)
#pragma unroll
        for (int k = 0; k < QTILES; k++) {
            float x[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                x[j] = hq < GROUP ? qrow[hq * HEAD_DIM + channels[16 * c + 4 * t + j]] : 0.f;
            bf16_words(x, QTILES == 1 ? g >= 4 : k == 1, qb[c][k][0], qb[c][k][1]);
        }

    const uint2* head_label = label + (size_t)r.head * num_pages * PAGE_SIZE * LABEL_ROW;
    const int step = TK_WARPS * PAGES_AHEAD;
    for (int base = warp * PAGES_AHEAD; base < n; base += step) {
        uint2 x[PAGES_AHEAD][2][LABEL_CHUNKS];
#pragma unroll
        for (int u = 0; u < PAGES_AHEAD; u++) {
            // Slots past the candidates read page 0 and are never written.
            const unsigned int id = base + u < n ? cand[base + u] : 0u;
            const uint2* page = head_label + (size_t)id * PAGE_SIZE * LABEL_ROW + t;
#pragma unroll
            for (int c = 0; c < LABEL_CHUNKS; c++) {
                x[u][0][c] = __ldg(page + g * LABEL_ROW + 4 * c);
                x[u][1][c] = __ldg(page + (g + 8) * LABEL_ROW + 4 * c);
            }
        }
#pragma unroll
        for (int u = 0; u < PAGES_AHEAD; u++) {
            float d[QTILES][4] = {};
#pragma unroll
            for (int c = 0; c < LABEL_CHUNKS; c++)
#pragma unroll
                for (int k = 0; k < QTILES; k++)
                    mma_bf16(d[k], x[u][0][c].x, x[u][1][c].x, x[u][0][c].y, x[u][1][c].y,
                             qb[c][k][0], qb[c][k][1]);
            // Heads 2t, 2t + 1 of tokens g and g + 8: on lanes t < 2 with their rests on lanes
            // t + 2 (one tile), or on every lane with their rests in the second tile.
            float best = __int_as_float(0xff800000);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float v = QTILES == 1 ? d[0][j] + __shfl_xor_sync(TK_FULL, d[0][j], 2)
                                            : d[0][j] + d[QTILES - 1][j];
                if ((QTILES == 2 || t < 2) && 2 * t + (j & 1) < GROUP) best = fmaxf(best, v);
            }
            const unsigned int key = __reduce_max_sync(TK_FULL, tk_key(best));
            if (lane == 0 && base + u < n) tk_keys[base + u] = key;
        }
    }
    __syncthreads();
    tk_select(s, tk_keys, n, r.k, required_of(r.k, tolerance),
              [&](int pos, int i) { dst[r.sinks + pos] = cand[i]; });
}
