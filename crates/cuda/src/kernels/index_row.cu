// One row of an index phase: what the index kernels (block_topk.cu, h2o.cu and the generated
// flow_index) share. block_topk.rs mirrors SelRow.

// The pages `first..first + pages` of the dense table are the sequence's logical pages; pages
// `sinks..pages - recent` are candidates, `k` of them are kept.
struct __align__(16) SelRow {
    int seq, head, pages, sinks;
    int recent, k, out, dense;  // out: first slot in the sparse indices; dense: no index phase
};

// The row's sink and recent pages into its sparse table row `dst`, around the `k` kept.
__device__ __forceinline__ void write_edges(const SelRow& r, const unsigned int* logical,
                                            unsigned int* dst) {
    for (int j = threadIdx.x; j < r.sinks; j += blockDim.x) dst[j] = logical[j];
    for (int j = threadIdx.x; j < r.recent; j += blockDim.x)
        dst[r.sinks + r.k + j] = logical[r.pages - r.recent + j];
}

// Of `k` kept, how many must be in the exact top-k: all of them, or with a recall tolerance
// ceil((1 - tolerance) k), as topk.rs's `required`.
__device__ __forceinline__ int required_of(int k, float tolerance) {
    return tolerance > 0.f ? min(k, (int)ceil((1.0 - (double)tolerance) * k)) : k;
}

// The ready flag of the block's row of the sparse table (DeviceTable::ready; `ready` may be
// null), held for the kernel's whole run: constructed first, it clears the flag and then lets
// the attention launched after this kernel start, so that no attention block can see the flag
// of an earlier step; destroyed at the kernel's return (every return must be taken by the whole
// block), it sets the flag once the row's pages are written. The attention of a row then waits
// for that row alone, not the grid. A table whose rows go to several flows, or to requests of
// several recall tolerances, gets one index launch for each: the flag is then that of the row's
// (sequence, KV head), read first; with `at_block` the launch's rows are the table's in order,
// and the flag of the launch's row `row` is the table's row `row` without waiting for that read.
// Where several blocks take one row, its `owner` alone clears and sets the flag.
struct RowReady {
    unsigned int* ready;
    __device__ RowReady(unsigned int* flags, const SelRow* rows, int kv_heads, int at_block,
                        int row = blockIdx.x, bool owner = true)
        : ready(flags == nullptr || !owner
                    ? nullptr
                    : flags + (at_block ? row : rows[row].seq * kv_heads + rows[row].head)) {
        if (ready != nullptr && threadIdx.x == 0) {
            *ready = 0u;
            __threadfence();
        }
        __syncthreads();
#if __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    }
    __device__ ~RowReady() {
        if (ready == nullptr) return;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(ready), "r"(1u)
                         : "memory");
    }
};
