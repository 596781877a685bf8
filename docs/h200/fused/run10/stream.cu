typedef unsigned char u8;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
#define ROWB 576
#define ROW 592
#define TILE 64

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ uint4 ldg_nc(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void split_range(const int* indptr, int num_splits, int& first, int& nt, int& end) {
  const int start = indptr[blockIdx.y];
  end = indptr[blockIdx.y + 1];
  const int tiles_all = (end - start + TILE - 1) / TILE;
  const int per_split = (tiles_all + num_splits - 1) / num_splits;
  const int t0 = min(tiles_all, (int)blockIdx.x * per_split);
  nt = min(tiles_all, t0 + per_split) - t0;
  first = start + t0 * TILE;
}

// P1: each warp streams U rows at a time into registers.
template <int U, int W>
__global__ void __launch_bounds__(32 * W) ldg_stream(const u8* __restrict__ pool, const int* __restrict__ indptr,
                                                      const int* __restrict__ indices, int num_splits, u32* sink) {
  int first, nt, end;
  split_range(indptr, num_splits, first, nt, end);
  const int t1 = min(end, first + nt * TILE);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  u32 acc = 0;
  for (int r0 = first + warp * U; r0 < t1; r0 += W * U) {
    uint4 a[U], c[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tok = r0 + u;
      const int row = tok < t1 ? indices[tok] : 0;
      a[u] = ldg_nc(pool + (i64)row * ROWB + 16 * lane);
      c[u] = lane < 4 ? ldg_nc(pool + (i64)row * ROWB + 512 + 16 * lane) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ c[u].x ^ c[u].w;
  }
  if (acc == 0x9e3779b9u) sink[threadIdx.x] = acc;
}

__device__ __forceinline__ void mbar_init(u32 a, int count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(count)); }
__device__ __forceinline__ void mbar_expect_tx(u32 a, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 a) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory"); }
__device__ __forceinline__ void mbar_wait(u32 a, u32 parity) {
  asm volatile("{ .reg .pred p; WAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra WAIT_%=; }" ::"r"(a), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 mbar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(mbar) : "memory");
}

// P2: one producer warp issues a 576-byte bulk copy per row into a STAGES-deep ring; CW consumer
// warps wait on the tile's full barrier, touch it, release it.
template <int STAGES, int CW>
__global__ void __launch_bounds__(32 * (CW + 1)) bulk_stream(const u8* __restrict__ pool, const int* __restrict__ indptr,
                                                              const int* __restrict__ indices, int num_splits, u32* sink) {
  extern __shared__ __align__(128) u8 smem[];
  u8* ring = smem;
  u64* bars = (u64*)(smem + STAGES * TILE * ROW);
  const u32 full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);
  int first, nt, end;
  split_range(indptr, num_splits, first, nt, end);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) { mbar_init(full0 + 8 * s, 1); mbar_init(empty0 + 8 * s, CW); }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (warp == CW) {
    for (int i = 0; i < nt; ++i) {
      const int s = i % STAGES;
      if (i >= STAGES) mbar_wait(empty0 + 8 * s, ((i / STAGES) - 1) & 1);
      const int tok0 = first + i * TILE, valid = min(TILE, end - tok0);
      if (lane == 0) mbar_expect_tx(full0 + 8 * s, valid * ROWB);
      __syncwarp();
      for (int r = lane; r < valid; r += 32)
        bulk_g2s(smem_addr(ring + (s * TILE + r) * ROW), pool + (i64)indices[tok0 + r] * ROWB, ROWB, full0 + 8 * s);
    }
  } else {
    u32 acc = 0;
    for (int i = 0; i < nt; ++i) {
      const int s = i % STAGES;
      mbar_wait(full0 + 8 * s, (i / STAGES) & 1);
      acc ^= *(const u32*)(ring + (s * TILE + (tid & 63)) * ROW + 4 * (tid >> 6));
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
    if (acc == 0x9e3779b9u) sink[tid] = acc;
  }
}

// P2b: as P2, the split's indices first copied to shared memory (up to 64 tiles).
template <int STAGES, int CW>
__global__ void __launch_bounds__(32 * (CW + 1)) bulk_stream2(const u8* __restrict__ pool, const int* __restrict__ indptr,
                                                               const int* __restrict__ indices, int num_splits, u32* sink) {
  extern __shared__ __align__(128) u8 smem[];
  u8* ring = smem;
  u64* bars = (u64*)(smem + STAGES * TILE * ROW);
  int* idx = (int*)(bars + 2 * STAGES);
  const u32 full0 = smem_addr(bars), empty0 = smem_addr(bars + STAGES);
  int first, nt, end;
  split_range(indptr, num_splits, first, nt, end);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ntok = min(end - first, nt * TILE);
  for (int k = tid; k < ntok; k += 32 * (CW + 1)) idx[k] = indices[first + k];
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) { mbar_init(full0 + 8 * s, 1); mbar_init(empty0 + 8 * s, CW); }
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  if (warp == CW) {
    for (int i = 0; i < nt; ++i) {
      const int s = i % STAGES;
      if (i >= STAGES) mbar_wait(empty0 + 8 * s, ((i / STAGES) - 1) & 1);
      const int valid = min(TILE, ntok - i * TILE);
      if (lane == 0) mbar_expect_tx(full0 + 8 * s, valid * ROWB);
      __syncwarp();
      for (int r = lane; r < valid; r += 32)
        bulk_g2s(smem_addr(ring + (s * TILE + r) * ROW), pool + (i64)idx[i * TILE + r] * ROWB, ROWB, full0 + 8 * s);
    }
  } else {
    u32 acc = 0;
    for (int i = 0; i < nt; ++i) {
      const int s = i % STAGES;
      mbar_wait(full0 + 8 * s, (i / STAGES) & 1);
      acc ^= *(const u32*)(ring + (s * TILE + (tid & 63)) * ROW + 4 * (tid >> 6));
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * s);
    }
    if (acc == 0x9e3779b9u) sink[tid] = acc;
  }
}

// P3: 16-byte cp.async ring, every warp gathering its rows (as the kernel does), indices in smem.
template <int STAGES, int W>
__global__ void __launch_bounds__(32 * W) ldgsts_stream(const u8* __restrict__ pool, const int* __restrict__ indptr,
                                                        const int* __restrict__ indices, int num_splits, u32* sink) {
  extern __shared__ __align__(128) u8 smem[];
  u8* ring = smem;
  int* idx = (int*)(smem + STAGES * TILE * ROW);
  int first, nt, end;
  split_range(indptr, num_splits, first, nt, end);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int ntok = min(end - first, nt * TILE);
  for (int k = tid; k < ntok; k += 32 * W) idx[k] = indices[first + k];
  __syncthreads();
  constexpr int RPW = TILE / W;
  auto issue = [&](int i) {
    if (i < nt) {
      u8* slot = ring + (i % STAGES) * TILE * ROW;
      for (int j = 0; j < RPW; ++j) {
        const int r = RPW * warp + j;
        const int row = i * TILE + r < ntok ? idx[i * TILE + r] : 0;
        const u8* src = pool + (i64)row * ROWB;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(slot + r * ROW + 16 * lane)), "l"(src + 16 * lane));
        if (lane < 4) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(slot + r * ROW + 512 + 16 * lane)), "l"(src + 512 + 16 * lane));
      }
    }
    asm volatile("cp.async.commit_group;");
  };
  for (int s = 0; s < STAGES - 1; ++s) issue(s);
  u32 acc = 0;
  for (int i = 0; i < nt; ++i) {
    asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2));
    __syncthreads();
    issue(i + STAGES - 1);
    acc ^= *(const u32*)(ring + ((i % STAGES) * TILE + (tid & 63)) * ROW + 4 * (tid >> 6));
  }
  if (acc == 0x9e3779b9u) sink[tid] = acc;
}
