// Fused FP8 absorbed-MLA decode in one launch, for sm_89+ (sm_90, sm_120): compiled at run time by
// NVRTC (harness/kernels/fused_mla_cuda.py), no headers needed. W warps per CTA (8 or 16).
//
// CTA (split, request b, head group) walks its share of b's token-level kv_indices in 64-token
// tiles through a STAGES-deep shared-memory ring (rows of 576 e4m3 bytes: 512 latent + 64 RoPE,
// unpadded), up to STAGES - 1 tiles in flight while one is used. A tile whose valid rows are one
// run of consecutive pool rows (a page of a paged pool, checked per tile on its indices) is loaded
// by one bulk copy completing on the slot's mbarrier (sm_90+), rows past the request zeroed; any
// other tile of whole pool rows (kpe right after ckv) by one bulk copy per row (sm_90+, BULK_ROWS),
// else by 16-byte cp.async gathers of each row. The e4m3 bytes are converted in registers
// (cvt.rn.f16x2.e4m3x2: exact, NaN codes stay NaN); the dots are fp16 mma.sync m16n8k16 with
// fp32 accumulation, tokens or latent channels as the M and the heads (8 per n-tile) as the N:
//   phase A  logits^T[64 tok, NH] = K[64, 576] . Q^T: warp w takes 16 tokens and 1 / (W / 4) of
//            the channels (64-channel blocks and a share of the RoPE part); the parts meet in
//            shared memory. A lane's 128-bit load of a row (rows 576 bytes apart: conflict-free)
//            feeds four k-steps; the k order inside each 16-channel step is permuted the same way
//            for K and Q, which leaves the dot unchanged.
//   phase B  online softmax in fp32 (base 2) on the first 256 threads, P^T rounded to fp16 into
//            shared memory; each thread keeps its share of the running sum (added up at the end).
//            With one head per warp (8 per CTA) a head's max is one redux.sync of order-preserving
//            integer keys of its logits (exact: the same max as fmaxf, a positive NaN above all).
//   phase C  O^T[512, NH] += V^T . P^T: warp w owns a 64-channel block (two warps split its
//            tokens when W = 16); V^T comes from 128-bit row loads transposed by movmatrix, one
//            byte permute per register splitting even and odd channels into two M-tiles.
// Q is bf16 in global memory and fp16 in shared memory (exact for |q| in [2^-14, 65504]).
// Output: with one split the final bf16 out and natural-log LSE. Otherwise the splits are merged
// one of four ways (merge_mode; the tuning table picks): MERGE_CTA: each split writes its
// normalized output (fp16, before kv_scale: |o| <= 448) and base-2 LSE (fp32), and the last split
// of a (request, head group) to arrive (an atomic counter in arrivals, re-armed to 0 by that CTA)
// merges them, overlapped with other requests' splits; MERGE_GRID (a launch of one wave, checked by
// the host): the same partials, and once all of a request's splits have arrived each merges a
// 512 / num_splits channel slice (one CTA pulling every split's partials took 7.3 of b1-l4096's
// 12.7 us); MERGE_KERNEL: the same partials, merged by
// fused_mla_merge, launched right after as a programmatic dependent launch on sm_90+ (resident
// early, it waits for this grid); MERGE_CLUSTER (sm_90+): the request's splits are one
// thread-block cluster and merge their fp32 outputs through distributed shared memory (requests
// past one wave of clusters run in a second launch beside it: MERGE_CTA | WAIT_PRIOR).
// PP (ping-pong, 16 warps): two groups of 8 warps, each taking every other tile of the split through its
// own ring of STAGES slots with its own softmax state, barriers and O^T, so that two tiles are in the
// math at once without a second split to merge across SMs; at the end group 1's O^T joins group 0's in
// shared memory (each weighted by exp2(its max - the joint max)).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define D_CKV 512
#define D_ALL 576
#define TILE 64
#define ROW 576    // bytes per KV row, in the pool and in shared memory (no padding: a page run is one copy)
#define QROW 580   // halves per shared-memory Q row (1160 bytes: phase A's 64-bit Q loads are conflict-free)
#define SROW 68    // floats per shared-memory logit row (one row per head)
#define PROW 72    // halves per shared-memory P^T row (one row per head: phase B's stores and phase C's ldmatrix conflict-free)
#define SOFTMAX_THREADS 256  // phase B runs on the first 256 threads
#define IR 16      // kv_indices ring: tiles of token indices in shared memory
#define BARS 64    // bytes for the ring's mbarriers (8 each, STAGES <= 5; keeps what follows 16-byte aligned)
#define MERGE_KERNEL 0   // merge_mode: fused_mla_merge merges the splits' partials (launched after)
#define MERGE_CTA 1      // the last CTA of each request merges them
#define MERGE_CLUSTER 2  // the request's CTAs, one thread-block cluster, merge in distributed shared memory
#define MERGE_GRID 3     // every split merges 512 / num_splits channels once all have arrived (the launch is one wave)
#define CLUSTER_MAX 8    // the most CTAs in a cluster merge (portable cluster size)
#define WAIT_PRIOR 4     // merge_mode flag: wait for the grid this one was launched behind before exiting
#define INDICES_READY 8  // merge_mode flag: kv_indptr / kv_indices were written before the previous kernel started
#define IAHEAD 8   // index tiles fetched ahead of the gather that needs them (>= STAGES - 1)
// Diagnostics for ci/experiments/fused_variants (outputs wrong, never set by the harness): bounds on what the
// tile math and the merge cost a launch (docs/evidence/fused/grid-merge.json, "variants").
#ifndef DIAG_STREAM_ONLY
#define DIAG_STREAM_ONLY 0  // the ring's loads and barriers without phases A-C
#endif
#ifndef DIAG_NO_MERGE
#define DIAG_NO_MERGE 0  // splits end before they are merged
#endif
#ifndef DIAG_CLOCK
#define DIAG_CLOCK 0  // thread 0 of every CTA records its timeline in diag_clock (fused_variants timeline)
#endif
#ifndef DIAG_EARLY_Q
#define DIAG_EARLY_Q 0  // Q's loads before the wait on the previous kernel (unsafe where it writes Q): a bound
#endif
#ifndef EARLY_CTA_TILES
#define EARLY_CTA_TILES 2  // the most prologue tiles a CTA loads before the wait (its groups' first tiles first)
#endif
#ifndef Q_PREFETCH
#define Q_PREFETCH 1  // with the early tile loads, Q's lines prefetched into L2 before the wait
#endif
#ifndef EARLY_INDICES
#define EARLY_INDICES 1  // with the early tile loads, the index tiles after the prologue's fetched before the wait
#endif
#ifndef BULK_ROWS
#define BULK_ROWS 1  // a tile of whole pool rows that are not one run: one bulk copy per row (0: cp.async gathers)
#endif

__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async8(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void mbar_init(u32 bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
#if __CUDA_ARCH__ >= 900  // sm_89 never loads runs
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
#if __CUDA_ARCH__ >= 900  // sm_89 never loads runs
  asm volatile("{ .reg .pred p; WAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra WAIT_%=; }"
               ::"r"(bar), "r"(parity) : "memory");
#endif
}

// One bulk copy global -> shared (sm_90+), its bytes counted on mbarrier bar.
__device__ __forceinline__ void bulk_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
#if __CUDA_ARCH__ >= 900  // sm_89 never loads runs
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
#endif
}

// The transpose of the warp's 8x8 b16 matrix (lane (g, t) holding row g, columns 2t, 2t+1).
__device__ __forceinline__ u32 movmatrix_t(u32 x) {
  u32 y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// Thread-block clusters (sm_90+): this CTA's rank, a barrier over the cluster (release / acquire),
// the address of shared variable `a` in the CTA of rank `rank`, and loads from there.
__device__ __forceinline__ int cluster_ctarank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_sync_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
}

__device__ __forceinline__ u32 mapa(u32 a, int rank) {
  u32 r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}

__device__ __forceinline__ float ld_dsmem(u32 a) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
  return v;
}

__device__ __forceinline__ float4 ld_dsmem4(u32 a) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
  return v;
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2(u32 addr, u32& r0, u32& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// Four e4m3 bytes -> two fp16x2: bytes 0-1 -> lo, bytes 2-3 -> hi (lower byte in the lower half).
__device__ __forceinline__ void e4m3x4_to_f16(u32 x, u32& lo, u32& hi) {
  asm("{ .reg .b16 a, b; mov.b32 {a, b}, %2; cvt.rn.f16x2.e4m3x2 %0, a; cvt.rn.f16x2.e4m3x2 %1, b; }"
      : "=r"(lo), "=r"(hi) : "r"(x));
}

__device__ __forceinline__ u32 byte_perm(u32 x, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(r) : "r"(x), "r"(sel));
  return r;
}

__device__ __forceinline__ void mma16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The bits of a float as an int whose signed order is the float's (a positive NaN above everything,
// -inf below every number), and back: the map is its own inverse.
__device__ __forceinline__ int ordered_key(float x) {
  const int k = __float_as_int(x);
  return k ^ ((k >> 31) & 0x7fffffff);
}
__device__ __forceinline__ float ordered_key(int k) { return __int_as_float(k ^ ((k >> 31) & 0x7fffffff)); }

// A barrier over the thread group that streams tiles together: the CTA, or with two groups (PP) the group's
// 256 threads on named barrier 1 + grp; group_and also returns whether pred holds on all of them.
template <bool PP>
__device__ __forceinline__ void group_sync(int grp) {
  if constexpr (PP) asm volatile("bar.sync %0, 256;" ::"r"(grp + 1) : "memory");
  else __syncthreads();
}
template <bool PP>
__device__ __forceinline__ bool group_and(int grp, bool pred) {
  if constexpr (PP) {
    u32 r;
    asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.and.pred q, %2, 256, p; selp.u32 %0, 1, 0, q; }"
                 : "=r"(r) : "r"((u32)pred), "r"(grp + 1) : "memory");
    return r != 0;
  } else {
    return __syncthreads_and(pred);
  }
}

// The warp's maximum (sm_80+ redux).
__device__ __forceinline__ int redux_max(int x) {
  int y;
  asm volatile("redux.sync.max.s32 %0, %1, 0xffffffff;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ u16 f32_to_f16(float x) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

__device__ __forceinline__ float bf16_to_f32(u32 bits) { return __int_as_float(bits << 16); }

// bf16x2 of (a, b): a in the lower half.
__device__ __forceinline__ u32 f32x2_to_bf16x2(float a, float b) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

// fp16x2 of (a, b): a in the lower half.
__device__ __forceinline__ u32 f32x2_to_f16x2(float a, float b) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
  return r;
}

__device__ __forceinline__ float4 f16x4_to_f32(uint2 h) {
  float4 v;
  asm("{ .reg .f16 a, b, c, d; mov.b32 {a, b}, %4; mov.b32 {c, d}, %5; cvt.f32.f16 %0, a; cvt.f32.f16 %1, b;"
      " cvt.f32.f16 %2, c; cvt.f32.f16 %3, d; }"
      : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(h.x), "r"(h.y));
  return v;
}

// Loads that bypass L1 (other CTAs wrote these partials; L1 is not coherent).
__device__ __forceinline__ float ld_cg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ uint2 ld_cg2(const u16* p) {
  uint2 v;
  asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Split u into an online-softmax merge: m, l the running max and sum (base 2), acc the weighted sum
// of CPT float4 chunks; ls the split's LSE, v its chunks.
template <int CPT>
__device__ __forceinline__ void merge_split(float& m, float& l, float4* acc, float ls, const float4* v) {
  const float m_new = fmaxf(m, ls);
  const float base = m_new == __int_as_float(0xff800000) ? 0.f : m_new;  // all empty so far: weights exp2(-inf) = 0
  const float alpha = ex2(m - base), w = ex2(ls - base);
  l = l * alpha + w;
#pragma unroll
  for (int k = 0; k < CPT; ++k) {
    acc[k].x = acc[k].x * alpha + w * v[k].x;
    acc[k].y = acc[k].y * alpha + w * v[k].y;
    acc[k].z = acc[k].z * alpha + w * v[k].z;
    acc[k].w = acc[k].w * alpha + w * v[k].w;
  }
  m = m_new;
}

// The online-softmax state (m, l, acc) of channels d0 .. d0+3 of (request b, head) over splits s0, s0 + step, ...
// (< num_splits): their partial outputs weighted by exp2(their LSE), MB splits' loads in flight at a time
// (read past L1: other CTAs wrote them).
template <int MB>
__device__ __forceinline__ void merge_splits(const u16* part_out, const float* part_lse, int b, int head, int d0,
                                             int num_heads, int num_splits, int s0, int step, float& m, float& l,
                                             float4& acc) {
  const float NEG_INF = __int_as_float(0xff800000);
  const i64 row0 = (i64)b * num_splits * num_heads + head;  // (request b, split 0, head)
  for (int sp0 = s0; sp0 < num_splits; sp0 += MB * step) {
    float ls[MB];
    float4 v[MB];
#pragma unroll
    for (int u = 0; u < MB; ++u) {
      const bool ok = sp0 + u * step < num_splits;
      const i64 row = row0 + (i64)(sp0 + u * step) * num_heads;
      ls[u] = ok ? ld_cg(part_lse + row) : NEG_INF;
      v[u] = f16x4_to_f32(ok ? ld_cg2(part_out + row * D_CKV + d0) : make_uint2(0, 0));
    }
#pragma unroll
    for (int u = 0; u < MB; ++u) merge_split<1>(m, l, &acc, ls[u], &v[u]);
  }
}

// out[b, head, d0 .. d0+3] = acc / l times kv_scale (bf16), and lse[b, head] (natural log) for d0 = 0.
__device__ __forceinline__ void write_merged(u16* out, float* lse, int so_b, int so_h, int sl_b, int b, int head, int d0,
                                             float m, float l, float4 acc, float kv_scale) {
  const bool empty = m == __int_as_float(0xff800000);
  const float inv = empty ? 0.f : kv_scale / l;
  *(uint2*)(out + (i64)b * so_b + (i64)head * so_h + d0) =
      make_uint2(f32x2_to_bf16x2(acc.x * inv, acc.y * inv), f32x2_to_bf16x2(acc.z * inv, acc.w * inv));
  if (d0 == 0) lse[(i64)b * sl_b + head] = empty ? __int_as_float(0xff800000) : (m + lg2(l)) * 0.6931471805599453f;
}

__device__ __forceinline__ int pool_row(const int* indices, int tok, int end) { return tok < end ? indices[tok] : -1; }

// Gather warp w's RPW rows of a tile (tile rows RPW*w ..; lane r < RPW holds row r's pool row, -1
// past the end) into the ring slot `slot`: the latent part one row per instruction (32 lanes x 16
// contiguous bytes), then the RoPE parts (4 lanes a row). Zeros for a row past the end.
template <int RPW>
__device__ __forceinline__ void issue_rows(u8* slot, int my_row, const u8* ckv, const u8* kpe, int s_ckv, int s_kpe,
                                           int warp, int lane) {
#pragma unroll
  for (int j = 0; j < RPW; ++j) {
    const int row = __shfl_sync(0xffffffffu, my_row, j);
    cp_async16(smem_addr(slot + (RPW * warp + j) * ROW + 16 * lane), ckv + (i64)(row < 0 ? 0 : row) * s_ckv + 16 * lane,
               row < 0 ? 0 : 16);
  }
  const int row = __shfl_sync(0xffffffffu, my_row, (lane >> 2) % RPW);
  if (lane < 4 * RPW)
    cp_async16(smem_addr(slot + (RPW * warp + (lane >> 2)) * ROW + D_CKV + 16 * (lane & 3)),
               kpe + (i64)(row < 0 ? 0 : row) * s_kpe + 16 * (lane & 3), row < 0 ? 0 : 16);
}

// Whether tile rows k and k + 1 (k = my_k) are consecutive pool rows, or past the tile's valid rows.
__device__ __forceinline__ bool rows_follow(int row, int next_row, int k, int valid) {
  return k + 1 >= valid || next_row == row + 1;
}

// Load a tile's page run: `valid` consecutive 576-byte pool rows from `src` into `slot` by one bulk
// copy (thread 0, completing on mbarrier `bar`), rows valid .. TILE-1 zeroed by every thread.
__device__ __forceinline__ void zero_tail(u8* slot, int valid, int tid, int threads) {
  for (int e = valid * (ROW / 16) + tid; e < TILE * (ROW / 16); e += threads) ((uint4*)slot)[e] = make_uint4(0, 0, 0, 0);
  if (valid < TILE) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void issue_run(u8* slot, const u8* src, int valid, u32 bar, int tid, int threads) {
#if __CUDA_ARCH__ >= 900
  if (tid == 0) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // earlier generic accesses of the slot first
    mbar_expect_tx(bar, valid * ROW);
    bulk_g2s(smem_addr(slot), src, valid * ROW, bar);
  }
  zero_tail(slot, valid, tid, threads);
#endif
}

// Load a tile of whole 576-byte pool rows in any order (a page-size-1 pool) by one bulk copy per row
// (sm_90+): a lane with `copies` fetches tile row my_tok (pool row my_row, -1 past the end) into
// `slot`; thread 0 arms mbarrier `bar` for the `valid` rows' bytes (the copies may complete first:
// the phase waits for that arrival too); rows valid .. TILE-1 zeroed by every thread.
__device__ __forceinline__ void issue_row_copies(u8* slot, const u8* ckv, int s_ckv, int my_tok, int my_row, bool copies,
                                                 int valid, u32 bar, int tid, int threads) {
#if __CUDA_ARCH__ >= 900
  if (copies && my_row >= 0) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // earlier generic accesses of the slot first
    bulk_g2s(smem_addr(slot + my_tok * ROW), ckv + (i64)my_row * s_ckv, ROW, bar);
  }
  if (tid == 0) mbar_expect_tx(bar, valid * ROW);
  zero_tail(slot, valid, tid, threads);
#endif
}

// Phase A's dots over one channel chunk of the tile: rows g and g + 8 of the warp's 16 tokens, L bytes
// per lane from channel c0 + L * t (L = 16: one conflict-free 128-bit load per row; 8, 4 for the
// RoPE part). K-step s takes each lane's bytes 4s .. 4s+3; Q is read with the same channel order.
template <int L, int NT>
__device__ __forceinline__ void qk_chunk(const u8* rows_g, const u16* q_g, int c0, int t, float (*acc)[2][4]) {
  u32 x[L / 4], y[L / 4];
  const u8* p = rows_g + c0 + L * t;
  if constexpr (L == 16) {
    const uint4 a = *(const uint4*)p, b = *(const uint4*)(p + 8 * ROW);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w; y[0] = b.x; y[1] = b.y; y[2] = b.z; y[3] = b.w;
  } else if constexpr (L == 8) {
    const uint2 a = *(const uint2*)p, b = *(const uint2*)(p + 8 * ROW);
    x[0] = a.x; x[1] = a.y; y[0] = b.x; y[1] = b.y;
  } else {
    x[0] = *(const u32*)p; y[0] = *(const u32*)(p + 8 * ROW);
  }
#pragma unroll
  for (int s = 0; s < L / 4; ++s) {
    u32 a0, a1, a2, a3;
    e4m3x4_to_f16(x[s], a0, a2);
    e4m3x4_to_f16(y[s], a1, a3);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint2 q = *(const uint2*)(q_g + j * 8 * QROW + c0 + L * t + 4 * s);
      mma16816(acc[j][s & 1], a0, a1, a2, a3, q.x, q.y);
    }
  }
}

// V^T fragments of 8 tokens x 4 channel words: lane (g, t)'s 128-bit load of token row g (bytes
// 16t .. 16t+15 of the warp's 64 channels) is four 8x8 b16 matrices (matrix m: word m of each lane),
// transposed in registers; byte_perm + cvt split each into even / odd channels over token pairs.
__device__ __forceinline__ void v_fragments(uint4 w, u32 (&ev)[4], u32 (&od)[4]) {
  const u32 in[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int m = 0; m < 4; ++m) e4m3x4_to_f16(byte_perm(movmatrix_t(in[m]), 0x3120), ev[m], od[m]);
}

// f(x, k) for each of a thread's O^T accumulators o[p][e][jn][c], k = ((2p + e) NT + jn) 4 + c: the order in
// which the 16-warp and ping-pong joins pass them through shared memory.
template <int NT, typename F>
__device__ __forceinline__ void for_each_acc(float (&o)[2][2][NT][4], F f) {
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int jn = 0; jn < NT; ++jn)
#pragma unroll
        for (int c = 0; c < 4; ++c) f(o[p][e][jn][c], ((p * 2 + e) * NT + jn) * 4 + c);
}

// merge_mode may carry WAIT_PRIOR: the launch is a programmatic dependent of the one before it on
// the stream (the cluster launch of the requests that fit one wave, beside which this one runs the
// rest) and waits for it when it exits, so whatever the stream runs next finds both done.
struct WaitPriorAtExit {
  bool on;
  __device__ ~WaitPriorAtExit() {
#if __CUDA_ARCH__ >= 900
    if (on) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  }
};

// DIAG_CLOCK: one record of DIAG_WORDS words per CTA, in the order the CTAs exit: the pool (ckv: which
// layer's launch), the CTA (x | y << 8 | z << 20 | smid << 24 | merge_mode << 32 | tiles << 40), the
// globaltimer (ns) at entry, before and past the wait on the previous kernel, when Q is in shared memory,
// when the first tile has landed, past the last tile, when its partial output is published to the request's
// other splits (cluster, grid and last-CTA merges), once they have all published, and at exit (a mark a launch
// does not reach takes the one before it), and the SM clocks spent waiting for tiles | in the tile loop << 32.
#define DIAG_RECORDS 16384
#define DIAG_MARKS 9
#define DIAG_WORDS (3 + DIAG_MARKS)
#if DIAG_CLOCK
__device__ unsigned long long diag_clock[DIAG_RECORDS * DIAG_WORDS];
__device__ unsigned int diag_count;
#endif

struct ClockAtExit {
  unsigned long long key, ids, t[DIAG_MARKS];
  long long wait, loop;
  __device__ static unsigned long long now() {
    unsigned long long v;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
    return v;
  }
  __device__ void mark(int k) {
    if (DIAG_CLOCK && threadIdx.x == 0) t[k] = now();
  }
  __device__ ~ClockAtExit() {
#if DIAG_CLOCK
    if (threadIdx.x != 0) return;
    mark(DIAG_MARKS - 1);
    for (int k = 1; k < DIAG_MARKS - 1; ++k)
      if (!t[k]) t[k] = t[k - 1];
    const unsigned int r = atomicAdd(&diag_count, 1u);
    if (r >= DIAG_RECORDS) return;
    unsigned long long* w = diag_clock + (unsigned long long)r * DIAG_WORDS;
    w[0] = key;
    w[1] = ids;
    for (int k = 0; k < DIAG_MARKS; ++k) w[2 + k] = t[k];
    w[2 + DIAG_MARKS] = (unsigned long long)(u32)wait | ((unsigned long long)(u32)loop << 32);
#endif
  }
};

template <int NH, int STAGES, int W, bool PP>
__global__ void __launch_bounds__(32 * W, (W == 8 && STAGES == 2) ? 2 : 1)
fused_mla_decode(const u16* __restrict__ q_nope, const u16* __restrict__ q_pe, const u8* __restrict__ ckv,
                 const u8* __restrict__ kpe, const int* __restrict__ indptr, const int* __restrict__ indices,
                 u16* __restrict__ part_out, float* __restrict__ part_lse, int* __restrict__ arrivals,
                 u16* __restrict__ out, float* __restrict__ lse, int sqn_b, int sqn_h, int sqp_b, int sqp_h,
                 int s_ckv, int s_kpe, int so_b, int so_h, int sl_b, int num_heads, int num_splits,
                 int merge_mode, int whole_rows, int new_tokens, double scale_log2_d, double kv_scale_d) {
  const WaitPriorAtExit wait_prior{(merge_mode & WAIT_PRIOR) != 0};
  ClockAtExit clk{};
  clk.mark(0);
  // sm_90+: launched as a programmatic dependent of the stream's previous kernel (a no-op otherwise),
  // it waits for that kernel's writes before it reads anything, or with INDICES_READY once it has
  // issued its reads of kv_indptr and the first tiles' kv_indices, and with new_tokens >= 0 also the
  // loads of its first tiles that end before the request's last new_tokens tokens (rows no kernel still
  // running before it writes; Q, the other KV rows and every write still come after). A WAIT_PRIOR launch
  // runs beside the cluster launch before it and waits for it at its end instead.
  const bool wait_first = !wait_prior.on && !(merge_mode & INDICES_READY);
  const bool wait_after_indices = !wait_prior.on && (merge_mode & INDICES_READY);
#if __CUDA_ARCH__ >= 900
  if (wait_first) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  merge_mode &= ~(WAIT_PRIOR | INDICES_READY);
  static_assert(!PP || W == 16, "two tile groups are two groups of 8 warps");
  constexpr int GROUPS = PP ? 2 : 1;     // thread groups streaming every GROUPS-th tile (own ring slots and softmax)
  constexpr int WG = W / GROUPS;         // warps per group
  constexpr int TG = 32 * WG;            // threads per group
  constexpr int THREADS = 32 * W;
  constexpr int NT = NH / 8;             // n-tiles of 8 heads
  constexpr int KQ = WG / 4;             // phase A: channel parts per 16-token group
  constexpr int KS = 4 / (WG / 8);       // phase C: 16-token steps per warp (WG = 16: two warps per channel block)
  constexpr int RPW = TILE / WG;         // rows each warp gathers
  constexpr int TPH = SOFTMAX_THREADS / NH;  // softmax threads per head
  constexpr int TPT = TILE / TPH;        // tokens per softmax thread
  extern __shared__ __align__(128) u8 smem[];
  u8* ring = smem;
  unsigned long long* bars = (unsigned long long*)(smem + GROUPS * STAGES * TILE * ROW);  // [GROUPS][STAGES] run-load barriers
  int* idx_all = (int*)(smem + GROUPS * STAGES * TILE * ROW + BARS);  // [GROUPS][IR][TILE] token indices, the group's tile j in slot j % IR
  u16* qs = (u16*)(idx_all + GROUPS * IR * TILE);
  // per group: partial logits [KQ channel parts][NH][SROW], P^T [NH][PROW] fp16, alpha [NH], softmax state [2][NH]
  u8* const group_smem = (u8*)(qs + NH * QROW);
  constexpr int GROUP_BYTES = KQ * NH * SROW * 4 + NH * PROW * 2 + 3 * NH * 4;

  const float scale_log2 = (float)scale_log2_d, kv_scale = (float)kv_scale_d;
  const int split = blockIdx.x, b = blockIdx.y, h0 = blockIdx.z * NH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int grp = warp / WG, gtid = tid - grp * TG, gwarp = warp - grp * WG;  // the group, and places in it
  u8* ring_g = ring + grp * STAGES * TILE * ROW;
  int* idx = idx_all + grp * IR * TILE;
  float* spart = (float*)(group_smem + grp * GROUP_BYTES);
  u16* ps = (u16*)(spart + KQ * NH * SROW);
  float* alpha_s = (float*)(ps + NH * PROW);
  auto ml_of = [&](int gi) { return (float*)(group_smem + gi * GROUP_BYTES) + KQ * NH * SROW + NH * PROW / 2 + NH; };
  float* ml_s = ml_of(grp);

  const int start = indptr[b], end = indptr[b + 1];
  const int tiles_all = (end - start + TILE - 1) / TILE;
  const int per_split = (tiles_all + num_splits - 1) / num_splits;
  const int t0 = min(tiles_all, split * per_split);
  const int nt = min(tiles_all, t0 + per_split) - t0;
  const int first = start + t0 * TILE;  // first token of this split
  // The group's tiles: tile j of the group is tile grp + GROUPS * j of the split, from token tok0(j).
  const int ntg = max(0, nt - grp + GROUPS - 1) / GROUPS;
  auto tok0 = [&](int j) { return first + (grp + GROUPS * j) * TILE; };
#if __CUDA_ARCH__ < 900
  whole_rows = 0;  // no bulk copies before sm_90
#endif
  const u32 bar0 = smem_addr(bars) + 8 * STAGES * grp;
  if (whole_rows && gtid == 0)
    for (int s = 0; s < STAGES; ++s) mbar_init(bar0 + 8 * s, 1);  // visible after the prologue's first barrier

  // The group's tile j's 64 token indices go to idx slot j % IR by cp.async (thread gtid < TILE fetches one),
  // IAHEAD tiles before its load is issued: the loads never wait on an index load.
  auto fetch_indices = [&](int j) {
    if (gtid < TILE && j < ntg) {
      const int tok = tok0(j) + gtid;
      cp_async4(smem_addr(idx + (j % IR) * TILE + gtid), indices + (tok < end ? tok : 0), tok < end ? 4 : 0);
    }
  };
  // A tile is loaded one of three ways, chosen per tile (the same for every thread). Where the pool
  // rows are whole (kpe right after ckv, 576-byte stride), by bulk copies completing on the slot's
  // mbarrier: one when its valid rows are consecutive pool rows (a page of a paged pool: issue_run),
  // else one per row (issue_row_copies; BULK_ROWS); otherwise by 16-byte cp.async gathers of each row
  // (issue_rows). bulk_bits: slots whose pending load completes on the mbarrier; phase_bits: the
  // parity each slot's barrier waits for next. row0: the tile's first pool row (used by thread 0),
  // my_row: the pool row of this lane's tile row my_tok (-1 past the end).
  u32 bulk_bits = 0, phase_bits = 0;
  const int my_tok = RPW * gwarp + lane % RPW;  // the tile row whose pool row this lane fetches
  auto load_tile = [&](int j, bool run, int row0, int my_row) {
    const int s = j % STAGES, valid = min(TILE, end - tok0(j));
    if (run) {
      issue_run(ring_g + s * TILE * ROW, ckv + (i64)row0 * s_ckv, valid, bar0 + 8 * s, gtid, TG);
      bulk_bits |= 1u << s;
    } else if (BULK_ROWS && whole_rows) {
      issue_row_copies(ring_g + s * TILE * ROW, ckv, s_ckv, my_tok, my_row, lane < RPW, valid, bar0 + 8 * s, gtid, TG);
      bulk_bits |= 1u << s;
    } else {
      issue_rows<RPW>(ring_g + s * TILE * ROW, my_row, ckv, kpe, s_ckv, s_kpe, gwarp, lane);
      bulk_bits &= ~(1u << s);
    }
  };
  // Ring prologue: tiles 0 .. PRE-1 in flight before anything else, one cp.async group each: with 2
  // stages both slots (the first refill then waits for tile 1, not for tile 0's round trip), with
  // deeper rings STAGES - 1 (filling the last slot up front measured slower: docs/h200/fused/run12/variants14.json).
  // The first group also carries the indices of tiles PRE .. PRE-1+IAHEAD (issued before the wait with
  // EARLY_INDICES) and Q (issue_q, after the wait).
  constexpr int PRE = STAGES == 2 ? 2 : STAGES - 1;
  // Q (bf16, 4 channels per 8-byte cp.async; zeros for heads past num_heads) into qs's rows.
  auto issue_q = [&]() {
    for (int e = tid; e < NH * (D_ALL / 4); e += THREADS) {
      const int h = e / (D_ALL / 4), k = 4 * (e % (D_ALL / 4));
      const bool ok = h0 + h < num_heads;
      const u16* src = k < D_CKV ? q_nope + (i64)b * sqn_b + (i64)(h0 + (ok ? h : 0)) * sqn_h + k
                                 : q_pe + (i64)b * sqp_b + (i64)(h0 + (ok ? h : 0)) * sqp_h + (k - D_CKV);
      cp_async8(smem_addr(qs + h * QROW + k), src, ok ? 8 : 0);
    }
  };
  // Q_PREFETCH: Q's 128-byte lines (each head's 1024 latent and 128 RoPE bytes, any alignment: a line per 128
  // bytes and the last byte's) fetched into L2 before the wait. L2 is where a kernel still writing Q writes,
  // so the loads after the wait read the written values whether or not the prefetch came first.
  if (Q_PREFETCH && wait_after_indices && tid < NH * 11 && h0 + tid / 11 < num_heads) {
    const int h = h0 + tid / 11, k = tid % 11;
    const u8* a = k < 9 ? (const u8*)(q_nope + (i64)b * sqn_b + (i64)h * sqn_h) + min(128 * k, 2 * D_CKV - 1)
                        : (const u8*)(q_pe + (i64)b * sqp_b + (i64)h * sqp_h) + (k == 9 ? 0 : 127);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
  }
  const bool early_indices = EARLY_INDICES && wait_after_indices;
  if (early_indices)
    for (int j = PRE; j < PRE + IAHEAD; ++j) fetch_indices(j);
  int pre_row[PRE], pre_next[PRE];  // all of the prologue's index loads in flight at once
#pragma unroll
  for (int s = 0; s < PRE; ++s) {
    const int tok = tok0(s) + my_tok;
    pre_row[s] = pool_row(indices, tok, end);
    pre_next[s] = pool_row(indices, tok + 1, end);
  }
  // Tile s's load (bulk copies only: the cp.async groups stay in tile order) may come before the wait when
  // its rows end before the request's last new_tokens tokens, which a kernel before it may be writing, and it
  // is one of the CTA's first EARLY_CTA_TILES (with more, issuing them kept DeepSeek-V3's ping-pong CTAs past
  // the wait's release: docs/evidence/fused/tail-h100).
  auto early = [&](int s) { return wait_after_indices && whole_rows && new_tokens >= 0 && s < ntg && GROUPS * s < EARLY_CTA_TILES && tok0(s) + TILE <= end - new_tokens; };
  auto prologue_load = [&](int s) {
    const int valid = min(TILE, end - tok0(s)), row = pre_row[s];
    const bool run = group_and<PP>(grp, whole_rows && s < ntg && rows_follow(row, pre_next[s], my_tok, valid));
    if (s < ntg) load_tile(s, run, __shfl_sync(0xffffffffu, row, 0), row);  // lane 0 of the group's warp 0 holds row 0
  };
#pragma unroll
  for (int s = 0; s < PRE; ++s)
    if (early(s)) prologue_load(s);
  if (DIAG_EARLY_Q) issue_q();
  clk.mark(1);
#if __CUDA_ARCH__ >= 900
  if (wait_after_indices) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  clk.mark(2);
#pragma unroll
  for (int s = 0; s < PRE; ++s) {
    if (!early(s)) prologue_load(s);
    if (s == 0) {
      if (!early_indices)
        for (int j = PRE; j < PRE + IAHEAD; ++j) fetch_indices(j);
      if (!DIAG_EARLY_Q) issue_q();
    }
    cp_async_commit();
  }
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");  // fused_mla_merge may launch once every CTA is here
#endif

  // Q: bf16 -> fp16 in place once the first group has landed (each thread converts what it reads).
  cp_async_wait<PRE - 1>();
  __syncthreads();
  clk.mark(3);
  for (int e = tid; e < NH * (D_ALL / 4); e += THREADS) {
    const int h = e / (D_ALL / 4), k = 4 * (e % (D_ALL / 4));
    const uint2 v = *(const uint2*)(qs + h * QROW + k);
    const u32 f0 = f32_to_f16(bf16_to_f32(v.x & 0xFFFF)) | ((u32)f32_to_f16(bf16_to_f32(v.x >> 16)) << 16);
    const u32 f1 = f32_to_f16(bf16_to_f32(v.y & 0xFFFF)) | ((u32)f32_to_f16(bf16_to_f32(v.y >> 16)) << 16);
    *(uint2*)(qs + h * QROW + k) = make_uint2(f0, f1);
  }
  if constexpr (PP) __syncthreads();  // the groups' barriers below do not order the other group's conversions

  const float NEG_INF = __int_as_float(0xff800000);
  float m_run = NEG_INF, l_run = 0.f;  // softmax state of head (gtid / TPH): its max, this thread's part of its sum
  // O^T accumulators: [matrix pair p][even / odd channels][n-tile][4]; see the epilogue for the channels
  float o[2][2][NT][4];
  for_each_acc(o, [](float& x, int) { x = 0.f; });

  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: the matrix and row this lane addresses
  const int cb = gwarp % 8, ks0 = (gwarp / 8) * KS;  // phase C: this warp's 64-channel block and first token step
  // The group's tile i is cp.async group i: the prologue's groups 0 .. PRE-1, then one per refill.
  if (DIAG_CLOCK && tid == 0) {
    u32 smid;
    asm("mov.u32 %0, %%smid;" : "=r"(smid));
    clk.key = (unsigned long long)ckv;
    clk.ids = blockIdx.x | (blockIdx.y << 8) | (blockIdx.z << 20) | ((unsigned long long)smid << 24)
              | ((unsigned long long)(merge_mode | (wait_prior.on ? WAIT_PRIOR : 0)) << 32) | ((unsigned long long)ntg << 40);
    clk.loop = clock64();
  }
  for (int i = 0; i < ntg; ++i) {
    const int si = i % STAGES;
    const long long wait0 = DIAG_CLOCK ? clock64() : 0;
    if ((bulk_bits >> si) & 1) {  // bulk copies: its barrier; the cp.async groups since tile i hold only index tiles
      cp_async_wait<STAGES - 1>();
      mbar_wait(bar0 + 8 * si, (phase_bits >> si) & 1);
      phase_bits ^= 1u << si;
    } else if (PRE == STAGES && i == 0) {
      cp_async_wait<STAGES - 1>();
    } else {
      cp_async_wait<STAGES - 2>();
    }
    if (DIAG_CLOCK && tid == 0) {
      clk.wait += clock64() - wait0;
      if (i == 0) clk.mark(4);
    }
    // Every warp is past tile i - 1: its slot takes tile j = i + STAGES - 1, whose indices (fetched
    // IAHEAD >= STAGES - 1 iterations ago, visible since an earlier barrier) decide how it is loaded.
    const int j = i + STAGES - 1;
    bool follows = true;
    if (gtid < TILE && j < ntg) {
      const int* ix = idx + (j % IR) * TILE;
      follows = rows_follow(ix[gtid], gtid + 1 < TILE ? ix[gtid + 1] : 0, gtid, min(TILE, end - tok0(j)));
    }
    const bool run = group_and<PP>(grp, whole_rows && follows);
    const u8* tile = ring_g + si * TILE * ROW;
    if (i + STAGES - 1 >= PRE) {
      if (j < ntg) {
        const int* ix = idx + (j % IR) * TILE;
        load_tile(j, run, ix[0], tok0(j) + my_tok < end ? ix[my_tok] : -1);
      }
      fetch_indices(j + IAHEAD);
      cp_async_commit();
    }

    if (DIAG_STREAM_ONLY) { group_sync<PP>(grp); continue; }
    {  // phase A: partial logits^T of 16 tokens over one channel part: 64-channel blocks kq, kq + KQ, ...
       // of the latent and a 64 / KQ-channel share of the RoPE part
      const int tg = gwarp & 3, kq = gwarp >> 2;
      float acc[NT][2][4];
#pragma unroll
      for (int jn = 0; jn < NT; ++jn)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[jn][0][c] = acc[jn][1][c] = 0.f;
      const u8* rows_g = tile + (tg * 16 + g) * ROW;
      const u16* q_g = qs + g * QROW;
#pragma unroll
      for (int blk = 0; blk < 8 / KQ; ++blk) qk_chunk<16, NT>(rows_g, q_g, 64 * (kq + KQ * blk), t, acc);
      qk_chunk<64 / KQ / 4, NT>(rows_g, q_g, D_CKV + (64 / KQ) * kq, t, acc);
      float* sp = spart + kq * NH * SROW;
      const int ta = tg * 16 + g;
#pragma unroll
      for (int jn = 0; jn < NT; ++jn) {
        const int h = 8 * jn + 2 * t;
        sp[h * SROW + ta] = acc[jn][0][0] + acc[jn][1][0];
        sp[(h + 1) * SROW + ta] = acc[jn][0][1] + acc[jn][1][1];
        sp[h * SROW + ta + 8] = acc[jn][0][2] + acc[jn][1][2];
        sp[(h + 1) * SROW + ta + 8] = acc[jn][0][3] + acc[jn][1][3];
      }
    }
    group_sync<PP>(grp);

    if (gtid < SOFTMAX_THREADS) {  // phase B: online softmax, one head per TPH threads
      const int h = gtid / TPH, jj = gtid % TPH;
      const int valid = end - tok0(i);
      float s[TPT], mt = NEG_INF;
#pragma unroll
      for (int u = 0; u < TPT; ++u) {
        const int tok = jj + u * TPH;
        float v = 0.f;
#pragma unroll
        for (int q = 0; q < KQ; ++q) v += spart[(q * NH + h) * SROW + tok];
        s[u] = tok < valid ? v * scale_log2 : NEG_INF;
        mt = fmaxf(mt, s[u]);
      }
      if constexpr (TPH == 32) {  // one head per warp: one warp-wide integer max of order-preserving keys
        mt = ordered_key(redux_max(ordered_key(mt)));
      } else {
#pragma unroll
        for (int off = TPH / 2; off; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
      }
      const float m_new = fmaxf(m_run, mt);
      const float alpha = ex2(m_run - m_new);
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < TPT; ++u) {
        const float p = ex2(s[u] - m_new);
        sum += p;
        ps[h * PROW + jj + u * TPH] = f32_to_f16(p);
      }
      l_run = l_run * alpha + sum;  // this thread's share of the head's sum; added up after the loop
      m_run = m_new;
      if (jj == 0) alpha_s[h] = alpha;
    }
    group_sync<PP>(grp);

    {  // phase C: O^T[this warp's 64 channels, NH] += V^T . P^T over its KS 16-token steps
#pragma unroll
      for (int jn = 0; jn < NT; ++jn) {
        const float al0 = alpha_s[8 * jn + 2 * t], al1 = alpha_s[8 * jn + 2 * t + 1];
#pragma unroll
        for (int p = 0; p < 2; ++p)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            o[p][e][jn][0] *= al0;
            o[p][e][jn][1] *= al1;
            o[p][e][jn][2] *= al0;
            o[p][e][jn][3] *= al1;
          }
      }
      const u8* v_g = tile + g * ROW + 64 * cb + 16 * t;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        const int ks = ks0 + kk;
        u32 bp[NT][2];
        if constexpr (NT == 1) {
          ldsm_x2(smem_addr(ps + mr * PROW + 16 * ks + 8 * (mi & 1)), bp[0][0], bp[0][1]);
        } else {
          ldsm_x4(smem_addr(ps + (mr + 8 * (mi >> 1)) * PROW + 16 * ks + 8 * (mi & 1)), bp[0][0], bp[0][1],
                    bp[NT - 1][0], bp[NT - 1][1]);
        }
        u32 ev0[4], od0[4], ev1[4], od1[4];  // tokens 16ks + 0..7 and 16ks + 8..15
        v_fragments(*(const uint4*)(v_g + 16 * ks * ROW), ev0, od0);
        v_fragments(*(const uint4*)(v_g + (16 * ks + 8) * ROW), ev1, od1);
#pragma unroll
        for (int p = 0; p < 2; ++p)
#pragma unroll
          for (int jn = 0; jn < NT; ++jn) {
            mma16816(o[p][0][jn], ev0[2 * p], ev0[2 * p + 1], ev1[2 * p], ev1[2 * p + 1], bp[jn][0], bp[jn][1]);
            mma16816(o[p][1][jn], od0[2 * p], od0[2 * p + 1], od1[2 * p], od1[2 * p + 1], bp[jn][0], bp[jn][1]);
          }
      }
    }
  }

  if (DIAG_CLOCK && tid == 0) {
    clk.loop = clock64() - clk.loop;
    clk.mark(5);
  }
  {  // epilogue: the softmax sums; with 16 warps the second token half's O^T is added to the first's
#pragma unroll
    for (int off = TPH / 2; off; off >>= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, off);
    if (gtid < SOFTMAX_THREADS && gtid % TPH == 0) {
      ml_s[gtid / TPH] = m_run;
      ml_s[NH + gtid / TPH] = l_run;
    }
  }
  if constexpr (PP) {
    // Two groups: group 1's O^T through the ring (every tile is consumed) into group 0's, each weighted by
    // exp2(its max - the joint max); group 0's softmax state becomes the joint one.
    float* red = (float*)ring;
    __syncthreads();
    if (grp == 1) for_each_acc(o, [&](float& x, int k) { red[(k * 8 + gwarp) * 32 + lane] = x; });
    __syncthreads();
    const float* ml1 = ml_of(1);
    float m_joint[NT][2], l_joint[NT][2], a0[NT][2], a1[NT][2];  // per head 8jn + 2t + c: joint state, weights
    if (grp == 0) {
#pragma unroll
      for (int jn = 0; jn < NT; ++jn)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int hh = 8 * jn + 2 * t + c;
          const float m0 = ml_s[hh], m1 = ml1[hh], m = fmaxf(m0, m1), base = m == NEG_INF ? 0.f : m;
          a0[jn][c] = ex2(m0 - base);
          a1[jn][c] = ex2(m1 - base);
          m_joint[jn][c] = m;
          l_joint[jn][c] = ml_s[NH + hh] * a0[jn][c] + ml1[NH + hh] * a1[jn][c];
        }
      for_each_acc(o, [&](float& x, int k) {
        const int jn = k / 4 % NT, c = k % 2;  // o[..][jn][c + 2r] is head 8jn + 2t + c
        x = x * a0[jn][c] + a1[jn][c] * red[(k * 8 + gwarp) * 32 + lane];
      });
    }
    __syncthreads();
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int jn = 0; jn < NT; ++jn)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          ml_s[8 * jn + 2 * t + c] = m_joint[jn][c];
          ml_s[NH + 8 * jn + 2 * t + c] = l_joint[jn][c];
        }
    }
    ml_s = ml_of(0);  // the joint state, for every thread from here
    __syncthreads();
  } else if constexpr (W == 16) {
    float* red = (float*)ring;  // every tile is consumed: the ring is free
    __syncthreads();
    if (warp >= 8) for_each_acc(o, [&](float& x, int k) { red[(k * 8 + warp - 8) * 32 + lane] = x; });
    __syncthreads();
    if (warp < 8) for_each_acc(o, [&](float& x, int k) { x += red[(k * 8 + warp) * 32 + lane]; });
  } else {
    __syncthreads();
  }
  const bool direct = num_splits == 1;
  if (DIAG_NO_MERGE && !direct) return;
#if __CUDA_ARCH__ >= 900
  if (!direct && merge_mode == MERGE_CLUSTER) {
    // Cluster merge: the num_splits CTAs of (request, head group) are one thread-block cluster. Each
    // puts its unnormalized O (fp32, in the ring: every tile is consumed) beside its softmax state
    // (ml_s), and after a cluster barrier CTA r merges channels [r, r + 1) * 512 / num_splits of
    // every head from all of them through distributed shared memory; a second barrier keeps each
    // CTA's shared memory alive until the others have read it. Nothing goes through global memory.
    float* xo = (float*)ring;  // [NH][D_CKV]
    if (W == 8 || warp < 8) {
#pragma unroll
      for (int jn = 0; jn < NT; ++jn)
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
          for (int p = 0; p < 2; ++p)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int d = 64 * cb + 16 * (g >> 1) + 4 * (2 * p + r) + 2 * (g & 1);
              *(float2*)(xo + (8 * jn + 2 * t + c) * D_CKV + d) = make_float2(o[p][0][jn][c + 2 * r], o[p][1][jn][c + 2 * r]);
            }
    }
    clk.mark(6);
    cluster_sync();
    clk.mark(7);
    const int cw = D_CKV / num_splits, rank = cluster_ctarank();  // channels per CTA; rank == split
    const u32 xo_a = smem_addr(xo), ml_a = smem_addr(ml_s);
    for (int e = tid; e < NH * cw / 4; e += THREADS) {
      const int hh = e / (cw / 4), d = rank * cw + 4 * (e % (cw / 4)), head = h0 + hh;
      // every CTA's (m, l) and channels issued at once (CLUSTER_MAX loads in flight, not one round
      // trip per CTA), then weighted
      float mk[CLUSTER_MAX], lk[CLUSTER_MAX];
      float4 vk[CLUSTER_MAX];
#pragma unroll
      for (int k = 0; k < CLUSTER_MAX; ++k) {
        const bool in = k < num_splits;
        mk[k] = in ? ld_dsmem(mapa(ml_a + 4 * hh, k)) : NEG_INF;
        lk[k] = in ? ld_dsmem(mapa(ml_a + 4 * (NH + hh), k)) : 0.f;
        vk[k] = in ? ld_dsmem4(mapa(xo_a + 4 * (hh * D_CKV + d), k)) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float m = NEG_INF;
#pragma unroll
      for (int k = 0; k < CLUSTER_MAX; ++k) m = fmaxf(m, mk[k]);
      float l = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      if (m != NEG_INF) {
#pragma unroll
        for (int k = 0; k < CLUSTER_MAX; ++k) {
          const float w = ex2(mk[k] - m);  // 0 past num_splits (m - (-inf))
          l += w * lk[k];
          acc.x += w * vk[k].x;
          acc.y += w * vk[k].y;
          acc.z += w * vk[k].z;
          acc.w += w * vk[k].w;
        }
      }
      if (head < num_heads) write_merged(out, lse, so_b, so_h, sl_b, b, head, d, m, l, acc, kv_scale);
    }
    cluster_sync_relaxed();  // publishes nothing: only keeps this CTA's shared memory alive for the others' loads
    return;
  }
#endif
  // Lane (g, t)'s accumulator o[p][e][jn][c + 2r] is head 8jn + 2t + c, channel
  // 64cb + 16(g / 2) + 4(2p + r) + 2(g % 2) + e (movmatrix_t and v_fragments' channel order).
#pragma unroll
  for (int jn = 0; jn < NT; ++jn) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int hh = 8 * jn + 2 * t + c, head = h0 + hh;
      if (head >= num_heads || warp >= 8) continue;  // 16 warps: the first 8 hold the sums
      const float l = ml_s[NH + hh], m = ml_s[hh];
      const bool empty = m == NEG_INF;
      const float inv = empty ? 0.f : (direct ? kv_scale : 1.f) / l;  // partials: kv_scale is the merge's
      const float lse2 = empty ? NEG_INF : m + lg2(l);
#pragma unroll
      for (int p = 0; p < 2; ++p) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int d = 64 * cb + 16 * (g >> 1) + 4 * (2 * p + r) + 2 * (g & 1);
          const float ve = o[p][0][jn][c + 2 * r] * inv, vo = o[p][1][jn][c + 2 * r] * inv;
          if (direct) {
            *(u32*)(out + (i64)b * so_b + (i64)head * so_h + d) = f32x2_to_bf16x2(ve, vo);
          } else {
            const i64 slot = ((i64)b * num_splits + split) * num_heads + head;
            *(u32*)(part_out + slot * D_CKV + d) = f32x2_to_f16x2(ve, vo);
          }
        }
      }
      if (warp == 0 && g == 0) {
        if (direct)
          lse[(i64)b * sl_b + head] = lse2 * 0.6931471805599453f;
        else
          part_lse[((i64)b * num_splits + split) * num_heads + head] = lse2;
      }
    }
  }
  if (direct || (merge_mode != MERGE_CTA && merge_mode != MERGE_GRID)) return;  // one split, or fused_mla_merge merges

  // CTA merge: the last split of (request, head group) to finish merges all of them, then re-arms
  // the arrival counter for the next launch.
  int* arrived = arrivals + b * gridDim.z + blockIdx.z;
  if (merge_mode == MERGE_GRID) {
    // Grid merge: once every split of (request, head group) has written its partials (an arrival count;
    // the launch is one wave, so they all run at once), split s merges channels [s, s + 1) * 512 /
    // num_splits of every head: each 4-channel chunk by G lanes, each lane every G-th split, then the
    // lanes' states combined; the count goes on to 2 * num_splits as the splits finish, and the last
    // re-arms it. One thread fences for the CTA after the barrier (as a cooperative grid sync does).
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      clk.mark(6);
      atomicAdd(arrived, 1);
      while (ld_acquire(arrived) < num_splits) __nanosleep(32);
      __threadfence();
      clk.mark(7);
    }
    __syncthreads();
    const int cw = D_CKV / num_splits, chunks = NH * cw / 4;
    const int G = chunks >= THREADS ? 1 : min(32, THREADS / chunks);  // lanes per chunk (a power of two)
    for (int e0 = 0; e0 < chunks * G; e0 += THREADS) {
      const int e = (e0 + tid) / G, r = (e0 + tid) % G;
      if (e0 + tid - r >= chunks * G) break;  // whole groups past the last chunk (whole warps: G divides 32)
      const int head = h0 + e / (cw / 4), d0 = split * cw + 4 * (e % (cw / 4));
      float m = NEG_INF, l = 0.f;
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      if (head < num_heads) merge_splits<8>(part_out, part_lse, b, head, d0, num_heads, num_splits, r, G, m, l, acc);
      for (int off = G / 2; off; off >>= 1) {  // the group's states, combined (a fixed tree: deterministic)
        const float mo = __shfl_xor_sync(0xffffffffu, m, off), lo = __shfl_xor_sync(0xffffffffu, l, off);
        const float4 ao = make_float4(__shfl_xor_sync(0xffffffffu, acc.x, off), __shfl_xor_sync(0xffffffffu, acc.y, off),
                                      __shfl_xor_sync(0xffffffffu, acc.z, off), __shfl_xor_sync(0xffffffffu, acc.w, off));
        const float mn = fmaxf(m, mo), base = mn == NEG_INF ? 0.f : mn, a = ex2(m - base), w = ex2(mo - base);
        l = l * a + lo * w;
        acc = make_float4(acc.x * a + ao.x * w, acc.y * a + ao.y * w, acc.z * a + ao.z * w, acc.w * a + ao.w * w);
        m = mn;
      }
      if (head < num_heads && r == 0) write_merged(out, lse, so_b, so_h, sl_b, b, head, d0, m, l, acc, kv_scale);
    }
    __syncthreads();
    if (tid == 0 && atomicAdd(arrived, 1) == 2 * num_splits - 1) *arrived = 0;
    return;
  }
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  clk.mark(6);
  if (tid == 0) is_last = atomicAdd(arrived, 1) == num_splits - 1;
  __syncthreads();
  clk.mark(7);
  if (!is_last) return;
  __threadfence();
  // Each thread merges CPT float4 chunks of one head: an online softmax over the splits, MB splits'
  // LSEs and partial outputs loaded at a time (one round trip per MB splits).
  constexpr int CPT = NH * (D_CKV / 4) / THREADS;
  constexpr int MB = 16 / CPT > 0 ? 16 / CPT : 1;
  const int hh = tid * CPT / (D_CKV / 4), d0 = 4 * (tid * CPT % (D_CKV / 4)), head = h0 + hh;
  if (head < num_heads) {
    const i64 row0 = (i64)b * num_splits * num_heads + head;  // (request b, split 0, head)
    float m = NEG_INF, l = 0.f;
    float4 acc[CPT];
#pragma unroll
    for (int k = 0; k < CPT; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int sp0 = 0; sp0 < num_splits; sp0 += MB) {
      float ls[MB];
      float4 v[MB][CPT];
#pragma unroll
      for (int u = 0; u < MB; ++u) {
        const bool ok = sp0 + u < num_splits;
        const i64 row = row0 + (i64)(sp0 + u) * num_heads;
        ls[u] = ok ? ld_cg(part_lse + row) : NEG_INF;
#pragma unroll
        for (int k = 0; k < CPT; ++k) v[u][k] = f16x4_to_f32(ok ? ld_cg2(part_out + row * D_CKV + d0 + 4 * k) : make_uint2(0, 0));
      }
#pragma unroll
      for (int u = 0; u < MB; ++u) merge_split<CPT>(m, l, acc, ls[u], v[u]);
    }
    const bool empty = m == NEG_INF;
    const float inv = empty ? 0.f : kv_scale / l;
#pragma unroll
    for (int k = 0; k < CPT; ++k)
      *(uint2*)(out + (i64)b * so_b + (i64)head * so_h + d0 + 4 * k) =
          make_uint2(f32x2_to_bf16x2(acc[k].x * inv, acc[k].y * inv), f32x2_to_bf16x2(acc[k].z * inv, acc[k].w * inv));
    if (d0 == 0) lse[(i64)b * sl_b + head] = empty ? NEG_INF : (m + lg2(l)) * 0.6931471805599453f;
  }
  if (tid == 0) *arrived = 0;
}

// Stage 2 of a split launch: out[b, head] = the splits' partial outputs merged (merge_splits), one CTA per
// (request, head), each thread 4 channels.
template <int MB>
__global__ void __launch_bounds__(D_CKV / 4)
fused_mla_merge(const u16* __restrict__ part_out, const float* __restrict__ part_lse, u16* __restrict__ out,
                float* __restrict__ lse, int so_b, int so_h, int sl_b, int num_heads, int num_splits, double kv_scale_d) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // fused_mla_decode has finished and its writes are visible
#endif
  float m = __int_as_float(0xff800000), l = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  merge_splits<MB>(part_out, part_lse, blockIdx.x, blockIdx.y, 4 * threadIdx.x, num_heads, num_splits, 0, 1, m, l, acc);
  write_merged(out, lse, so_b, so_h, sl_b, blockIdx.x, blockIdx.y, 4 * threadIdx.x, m, l, acc, (float)kv_scale_d);
}
