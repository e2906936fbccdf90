// Causal prefill attention on the tensor cores (m16n8k16, bf16 operands, f32 accumulation),
// flash-style. A block of PM_WARPS warps takes PM_ROWS rows of one sequence and one KV head:
// TT = rows / GROUP consecutive query tokens with their GROUP heads each (row = token * GROUP +
// head), 16 * PM_MT rows a warp, so that each key and value fragment a warp loads feeds PM_MT
// products. The queries are staged once in shared memory as bf16 rows. Tiles of PM_KN keys and
// their values are staged there too; the next tile is copied asynchronously while the current
// one is used (an fp8 pool's as stored, widened to bf16 in shared memory when its turn comes).
// Each query row keeps an online softmax: scores S = Q Kᵀ and the output O += P V are both
// tensor-core products (operands read with ldmatrix, values transposed by it), P staying in
// registers. Defines as prefill.cu, and PM_WARPS, PM_MT (16-row tiles a warp), PM_KN (keys a
// tile, a multiple of 16) and PM_MIN_BLOCKS (blocks an SM the launch bounds ask for); HEAD_DIM a
// multiple of 32, at most 128. mma.cu is compiled in front. Dynamic shared memory:
// PM_SMEM_BYTES.

#define PM_ROWS (16 * PM_MT * PM_WARPS)
#define PM_TT (PM_ROWS / GROUP)
#define PM_KS (HEAD_DIM / 16)
// bf16 elements per staged row, 8 spare: the eight rows an ldmatrix reads fall in distinct
// banks.
#define PM_STRIDE (HEAD_DIM + 8)
// A tile of keys, then its values, as bf16 rows (shorts).
#define PM_BUF (2 * PM_KN * PM_STRIDE)
// Two tile buffers, then the block's queries (shorts).
#define PM_Q_AT (2 * PM_BUF)
#define PM_SMEM_BYTES ((PM_Q_AT + PM_ROWS * PM_STRIDE) * 2)
// Where (in shorts) a step's copies land and where its bf16 tile is read: a bf16 pool's go
// straight to two tiles in turn; an fp8 pool's to two stored tiles behind the one bf16 tile
// they are widened into.
#if KV_FP8
#define PM_STAGE_AT(t) (PM_BUF + (t) * PM_KN * HEAD_DIM)
#define PM_TILE_AT(t) 0
#else
#define PM_STAGE_AT(t) ((t) * PM_BUF)
#define PM_TILE_AT(t) ((t) * PM_BUF)
#endif

__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    return (unsigned int)kv_f32_to_bf16(lo) | ((unsigned int)kv_f32_to_bf16(hi) << 16);
}

#if KV_FP8
// Eight fp8 elements as four packed bf16 pairs.
__device__ __forceinline__ uint4 pm_widen8(uint2 w) {
    return make_uint4(kv_fp8x2_to_bf16x2(__byte_perm(w.x, 0, 0x4140)),
                      kv_fp8x2_to_bf16x2(__byte_perm(w.x, 0, 0x4342)),
                      kv_fp8x2_to_bf16x2(__byte_perm(w.y, 0, 0x4140)),
                      kv_fp8x2_to_bf16x2(__byte_perm(w.y, 0, 0x4342)));
}
#endif

// Four 8 x 8 b16 matrices from shared memory, rows addressed by lanes 8i..8i+7 for matrix i;
// `trans` delivers them transposed.
__device__ __forceinline__ void pm_ldsm4(unsigned int* r, const unsigned short* p) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void pm_ldsm4_trans(unsigned int* r, const unsigned short* p) {
    const unsigned int a = (unsigned int)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// Copies 16 bytes from global to shared memory asynchronously; zeros where `!in` (a source size
// of 0 reads nothing).
__device__ __forceinline__ void pm_copy16(void* dst, const void* src, bool in) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                     (unsigned int)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(in ? 16 : 0));
}

// Copies the stored keys and values k0..k0 + PM_KN - 1 of the tile's sequence (zeros past
// last_pos) to `buf` asynchronously (pm_commit and pm_wait order them): a bf16 pool's straight
// into a tile of bf16 rows (keys, then values), an fp8 pool's as they are stored, PM_KN rows of
// HEAD_DIM bytes for the keys, then the values, for pm_widen_tile.
__device__ __forceinline__ void pm_stage(void* buf, const kv_t* __restrict__ kpool,
                                         const kv_t* __restrict__ vpool,
                                         const unsigned int* pages, int hkv, int kh, int k0,
                                         int last_pos) {
    // Stored elements a 16-byte copy takes.
    constexpr int per = 16 / sizeof(kv_t);
#if KV_FP8
    constexpr int stride = HEAD_DIM;
#else
    constexpr int stride = PM_STRIDE;
#endif
    for (int e = threadIdx.x; e < PM_KN * (HEAD_DIM / per); e += PM_WARPS * 32) {
        const int j = e / (HEAD_DIM / per), c = e % (HEAD_DIM / per), p = k0 + j;
        kv_t* kd = reinterpret_cast<kv_t*>(buf) + j * stride + c * per;
        kv_t* vd = kd + PM_KN * stride;
        const bool in = p <= last_pos;
        const unsigned long long base =
            in ? (((unsigned long long)pages[p / PAGE_SIZE] * hkv + kh) * PAGE_SIZE +
                  p % PAGE_SIZE) * HEAD_DIM + c * per
               : 0;
        pm_copy16(kd, kpool + base, in);
        pm_copy16(vd, vpool + base, in);
    }
}

#if KV_FP8
// An fp8 tile staged by pm_stage as bf16 rows in `tile`.
__device__ __forceinline__ void pm_widen_tile(unsigned short* tile, const unsigned char* raw) {
    for (int e = threadIdx.x; e < 2 * PM_KN * (HEAD_DIM / 8); e += PM_WARPS * 32) {
        const int j = e / (HEAD_DIM / 8), c = e % (HEAD_DIM / 8);
        *reinterpret_cast<uint4*>(tile + j * PM_STRIDE + c * 8) =
            pm_widen8(*reinterpret_cast<const uint2*>(raw + j * HEAD_DIM + c * 8));
    }
}
#endif

__device__ __forceinline__ void pm_commit() { asm volatile("cp.async.commit_group;"); }

// Whether either bf16 of a pair is an infinity or NaN.
__device__ __forceinline__ bool pm_nonfinite2(unsigned int w) {
    return (w & 0x7f80u) == 0x7f80u || (w & 0x7f800000u) == 0x7f800000u;
}

// A pair of bf16 with each infinity or NaN made zero.
__device__ __forceinline__ unsigned int pm_finite2(unsigned int w) {
    return w & (((w & 0x7f80u) == 0x7f80u ? 0u : 0xffffu) |
                ((w & 0x7f800000u) == 0x7f800000u ? 0u : 0xffff0000u));
}

// The tile's staged values with each infinity or NaN made zero.
__device__ __forceinline__ void pm_make_values_finite(unsigned short* vs) {
    for (int e = threadIdx.x; e < PM_KN * (HEAD_DIM / 8); e += PM_WARPS * 32) {
        uint4* w = reinterpret_cast<uint4*>(vs + e / (HEAD_DIM / 8) * PM_STRIDE +
                                            e % (HEAD_DIM / 8) * 8);
        *w = make_uint4(pm_finite2(w->x), pm_finite2(w->y), pm_finite2(w->z), pm_finite2(w->w));
    }
}

// Whether this thread's share of the staged values of the keys some row does not see (of the
// tile's keys k0.., up to last: keys past first, the block's first query, and with a window
// keys before the last query's window) holds an infinity or NaN.
__device__ __forceinline__ bool pm_late_value_nonfinite(const unsigned short* vs, int k0,
                                                        int first, int last, int window) {
    bool any = false;
    for (int e = threadIdx.x; e < PM_KN * (HEAD_DIM / 8); e += PM_WARPS * 32) {
        const int j = e / (HEAD_DIM / 8), c = e % (HEAD_DIM / 8);
        const int key = k0 + j;
        if (key <= last && (key > first || (window > 0 && key <= last - window))) {
            const uint4 w = *reinterpret_cast<const uint4*>(vs + j * PM_STRIDE + c * 8);
            any |= pm_nonfinite2(w.x) | pm_nonfinite2(w.y) | pm_nonfinite2(w.z) |
                   pm_nonfinite2(w.w);
        }
    }
    return any;
}

// Waits for all but the newest `n` committed groups of this thread's copies.
template <int n>
__device__ __forceinline__ void pm_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(n));
}

// The block's query rows as bf16 rows at `qs`, zeros past its tokens.
__device__ __forceinline__ void pm_stage_queries(unsigned short* qs, const float* __restrict__ q,
                                                 int4 tile, int hq, int kh) {
    for (int e = threadIdx.x; e < PM_ROWS * (HEAD_DIM / 4); e += PM_WARPS * 32) {
        const int r = e / (HEAD_DIM / 4), c = e % (HEAD_DIM / 4) * 4;
        const int tok = r / GROUP;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok < tile.y && r < PM_TT * GROUP) {
            x = *reinterpret_cast<const float4*>(
                q + ((unsigned long long)(tile.x + tok) * hq + kh * GROUP + r % GROUP) * HEAD_DIM +
                c);
        }
        *reinterpret_cast<uint2*>(qs + r * PM_STRIDE + c) =
            make_uint2(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w));
    }
}

// Adds each infinity or NaN among the tile's values (keys k0.., up to last) to this thread's
// outputs of the rows that see its key, in its columns (pair * 2 + 0, 1 of each 8).
__device__ __forceinline__ void pm_add_nonfinite_values(float (&o)[PM_MT][HEAD_DIM / 8][4],
                                                        const unsigned short* vs, int k0,
                                                        int last, const bool (&live)[PM_MT][2],
                                                        const int (&qpos)[PM_MT][2], int pair,
                                                        int window) {
    for (int j = 0; j < PM_KN && k0 + j <= last; j++) {
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; n++) {
            const unsigned int w =
                *reinterpret_cast<const unsigned int*>(vs + j * PM_STRIDE + n * 8 + pair * 2);
            if (!pm_nonfinite2(w)) continue;
            const float v[2] = {__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u)};
#pragma unroll
            for (int mt = 0; mt < PM_MT; mt++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int i = c >> 1;
                    const bool sees = k0 + j <= qpos[mt][i] &&
                                      (window == 0 || k0 + j > qpos[mt][i] - window);
                    if (live[mt][i] && sees && !isfinite(v[c & 1])) {
                        o[mt][n][c] += v[c & 1];
                    }
                }
            }
        }
    }
}

// tiles[b] = (first query row, tokens, page-table row, position of the first token), TT tokens
// at most; blocks take them last first, so the longest pasts start earliest. With `window` > 0 a
// token sees only the last `window` positions, its own included.
extern "C" __global__ void __launch_bounds__(PM_WARPS * 32, PM_MIN_BLOCKS)
    prefill_attention_mma(const kv_t* __restrict__ kpool, const kv_t* __restrict__ vpool,
                          const unsigned int* __restrict__ indptr,
                          const unsigned int* __restrict__ indices, const float* __restrict__ q,
                          const int4* __restrict__ tiles, int hq, int hkv, float scale_log2,
                          int window, float* __restrict__ out) {
    extern __shared__ __align__(16) unsigned short pm_smem[];
    const int4 tile = tiles[gridDim.x - 1 - blockIdx.x];
    const int kh = blockIdx.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int quad = lane >> 2, pair = lane & 3;
    const unsigned int* pages = indices + indptr[tile.z];
    const int last_pos = tile.w + tile.y - 1;
    // Key tiles before the first query's window are skipped.
    const int k_first = window > 0 ? max(0, tile.w - window + 1) / PM_KN * PM_KN : 0;
    pm_stage(pm_smem + PM_STAGE_AT(0), kpool, vpool, pages, hkv, kh, k_first, last_pos);
    pm_commit();
    unsigned short* qs = pm_smem + PM_Q_AT;
    pm_stage_queries(qs, q, tile, hq, kh);
    // The warp's first row; this thread's rows of its tile mt are quad and quad + 8 past
    // row0 + 16 mt.
    const int row0 = warp * 16 * PM_MT;
    int tok[PM_MT][2], qpos[PM_MT][2];
    bool live[PM_MT][2];
#pragma unroll
    for (int mt = 0; mt < PM_MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = row0 + mt * 16 + quad + 8 * i;
            tok[mt][i] = r / GROUP;
            live[mt][i] = tok[mt][i] < tile.y && r < PM_TT * GROUP;
            qpos[mt][i] = tile.w + tok[mt][i];
        }
    }
    float m[PM_MT][2], l[PM_MT][2];
    float o[PM_MT][HEAD_DIM / 8][4];
#pragma unroll
    for (int mt = 0; mt < PM_MT; mt++) {
        m[mt][0] = m[mt][1] = NEG_INF;
        l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < HEAD_DIM / 8; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    }
    for (int k0 = k_first, t = 0; k0 <= last_pos; k0 += PM_KN, t ^= 1) {
        // The next tile goes to the other buffer, whose last readers finished at the end of
        // the previous step.
        if (k0 + PM_KN <= last_pos) {
            pm_stage(pm_smem + PM_STAGE_AT(t ^ 1), kpool, vpool, pages, hkv, kh, k0 + PM_KN,
                     last_pos);
        }
        pm_commit();
        pm_wait<1>();
        __syncthreads();
#if KV_FP8
        pm_widen_tile(pm_smem, reinterpret_cast<const unsigned char*>(pm_smem + PM_STAGE_AT(t)));
        __syncthreads();
#endif
        const unsigned short* ks = pm_smem + PM_TILE_AT(t);
        const unsigned short* vs = ks + PM_KN * PM_STRIDE;
        // Only tiles that reach past the block's first query, or (with a window) start before
        // its last query's window, need the mask.
        const bool masked = k0 + PM_KN - 1 > tile.w || (window > 0 && k0 <= last_pos - window);
        // A key's value must add nothing to the rows before it, but a product of a weight of 0
        // and an infinity is NaN: a masked tile holding a later infinity or NaN adds each such
        // value to the rows that see it, then multiplies its values with those made zero.
        const bool nonfinite =
            masked &&
            __syncthreads_or(pm_late_value_nonfinite(vs, k0, tile.w, last_pos, window));
        float s[PM_MT][PM_KN / 8][4];
#pragma unroll
        for (int mt = 0; mt < PM_MT; mt++) {
#pragma unroll
            for (int n = 0; n < PM_KN / 8; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
        }
        // Queries as A operands, keys as B operands (dimension x key): two 16-dimension steps
        // of 8 keys a load.
#pragma unroll
        for (int d = 0; d < PM_KS; d += 2) {
            unsigned int qa[PM_MT][2][4];
#pragma unroll
            for (int mt = 0; mt < PM_MT; mt++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    pm_ldsm4(qa[mt][h], qs + (row0 + mt * 16 + (lane & 15)) * PM_STRIDE +
                                            (d + h) * 16 + (lane >> 4) * 8);
                }
            }
#pragma unroll
            for (int n = 0; n < PM_KN / 8; n++) {
                unsigned int b[4];
                pm_ldsm4(b, ks + (n * 8 + (lane & 7)) * PM_STRIDE + d * 16 + (lane >> 3) * 8);
#pragma unroll
                for (int mt = 0; mt < PM_MT; mt++) {
                    mma_bf16(s[mt][n], qa[mt][0][0], qa[mt][0][1], qa[mt][0][2], qa[mt][0][3],
                             b[0], b[1]);
                    mma_bf16(s[mt][n], qa[mt][1][0], qa[mt][1][1], qa[mt][1][2], qa[mt][1][3],
                             b[2], b[3]);
                }
            }
        }
        // Online softmax over the tile, a row's PM_KN keys spread over the four lanes of a quad.
        // The maxima are of the unscaled scores (the scale is positive), so that each weight is
        // one fused multiply-add and an exp2.
#pragma unroll
        for (int mt = 0; mt < PM_MT; mt++) {
            float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int n = 0; n < PM_KN / 8; n++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int i = c >> 1, key = k0 + n * 8 + pair * 2 + (c & 1);
                    const bool sees = key <= qpos[mt][i] &&
                                      (window == 0 || key > qpos[mt][i] - window);
                    if (masked && !(live[mt][i] && sees)) s[mt][n][c] = NEG_INF;
                    mx[i] = fmaxf(mx[i], s[mt][n][c]);
                }
            }
            float corr[2], shift[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                const float m_new = fmaxf(m[mt][i], mx[i]);
                // A row with no key yet (padding) keeps weights of zero.
                const float base = m_new == NEG_INF ? 0.0f : m_new;
                corr[i] = exp2f((m[mt][i] - base) * scale_log2);
                m[mt][i] = m_new;
                shift[i] = -base * scale_log2;
                l[mt][i] *= corr[i];
            }
#pragma unroll
            for (int n = 0; n < PM_KN / 8; n++) {
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    s[mt][n][c] = exp2f(fmaf(s[mt][n][c], scale_log2, shift[c >> 1]));
                    l[mt][c >> 1] += s[mt][n][c];
                }
            }
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; n++) {
                o[mt][n][0] *= corr[0];
                o[mt][n][1] *= corr[0];
                o[mt][n][2] *= corr[1];
                o[mt][n][3] *= corr[1];
            }
        }
        if (nonfinite) {
            pm_add_nonfinite_values(o, vs, k0, last_pos, live, qpos, pair, window);
            __syncthreads();
            pm_make_values_finite(pm_smem + PM_TILE_AT(t) + PM_KN * PM_STRIDE);
            __syncthreads();
        }
#pragma unroll
        for (int kk = 0; kk < PM_KN / 16; kk++) {
            unsigned int pa[PM_MT][4];
#pragma unroll
            for (int mt = 0; mt < PM_MT; mt++) {
                pa[mt][0] = pack_bf16x2(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack_bf16x2(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack_bf16x2(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack_bf16x2(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
            // Values as B operands (key x dimension), transposed by the load: 16 keys of two
            // 8-dimension tiles a load.
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; n += 2) {
                unsigned int b[4];
                pm_ldsm4_trans(b, vs + (kk * 16 + (lane & 15)) * PM_STRIDE + n * 8 +
                                      (lane >> 4) * 8);
#pragma unroll
                for (int mt = 0; mt < PM_MT; mt++) {
                    mma_bf16(o[mt][n], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b[0], b[1]);
                    mma_bf16(o[mt][n + 1], pa[mt][0], pa[mt][1], pa[mt][2], pa[mt][3], b[2],
                             b[3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < PM_MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float sum = l[mt][i];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (!live[mt][i]) continue;
            const float inv = 1.0f / sum;
            const int r = row0 + mt * 16 + quad + 8 * i;
            float* row = out + ((unsigned long long)(tile.x + tok[mt][i]) * hq + kh * GROUP +
                                r % GROUP) *
                                   HEAD_DIM;
#pragma unroll
            for (int n = 0; n < HEAD_DIM / 8; n++) {
                *reinterpret_cast<float2*>(row + n * 8 + pair * 2) =
                    make_float2(o[mt][n][2 * i] * inv, o[mt][n][2 * i + 1] * inv);
            }
        }
    }
}
