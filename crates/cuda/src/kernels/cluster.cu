// The blocks of a cluster (compute capability 9.0 and later) and each other's shared memory. A
// block launched without a cluster is a cluster of one; before 9.0 every block is.

#if __CUDA_ARCH__ >= 900
__device__ __forceinline__ unsigned int cluster_ranks() {
    unsigned int n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return n;
}
__device__ __forceinline__ unsigned int cluster_rank() {
    unsigned int n;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(n));
    return n;
}
// Every thread of every block of the cluster arrives here before any goes on; shared memory
// written before it is visible to the cluster after it.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                     : "memory");
}
// The two halves of cluster_sync, the arrival ordering no memory (relaxed): every block of a
// cluster has started once each has arrived, which a block must know before it writes another's
// shared memory.
__device__ __forceinline__ void cluster_arrive() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned int remote(const void* p, unsigned int rank) {
    unsigned int a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(a)
                 : "r"((unsigned int)__cvta_generic_to_shared(p)), "r"(rank));
    return a;
}
// The value at `p` in this block's shared memory, read from the same place in block `rank`.
__device__ __forceinline__ unsigned int load_u32(const unsigned int* p, unsigned int rank) {
    unsigned int v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote(p, rank)) : "memory");
    return v;
}
__device__ __forceinline__ unsigned long long load_u64(const unsigned long long* p,
                                                       unsigned int rank) {
    unsigned long long v;
    asm volatile("ld.shared::cluster.u64 %0, [%1];" : "=l"(v) : "r"(remote(p, rank)) : "memory");
    return v;
}
__device__ __forceinline__ float load_f32(const float* p, unsigned int rank) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote(p, rank)) : "memory");
    return v;
}
// Writes v at `at`, an address from remote().
__device__ __forceinline__ void store_at(unsigned int at, unsigned int v) {
    asm volatile("st.shared::cluster.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
}
#else
__device__ __forceinline__ unsigned int cluster_ranks() { return 1; }
__device__ __forceinline__ unsigned int cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_sync() { __syncthreads(); }
__device__ __forceinline__ void cluster_arrive() {}
__device__ __forceinline__ void cluster_wait() {}
__device__ __forceinline__ unsigned int remote(const void* p, unsigned int) {
    return (unsigned int)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void store_at(unsigned int at, unsigned int v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int load_u32(const unsigned int* p, unsigned int) {
    return *(volatile const unsigned int*)p;
}
__device__ __forceinline__ unsigned long long load_u64(const unsigned long long* p,
                                                       unsigned int) {
    return *(volatile const unsigned long long*)p;
}
__device__ __forceinline__ float load_f32(const float* p, unsigned int) {
    return *(volatile const float*)p;
}
#endif
