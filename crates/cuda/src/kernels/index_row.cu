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
