// Fused FP8 absorbed-MLA decode in one launch, for sm_89+ (sm_90, sm_120): compiled at run time by
// NVRTC (harness/kernels/fused_mla_cuda.py), no headers needed. W warps per CTA (8 or 16).
//
// CTA (split, request b, head group) walks its share of b's token-level kv_indices in 64-token
// tiles. Each tile's 64 pool rows (576 e4m3 bytes: 512 latent + 64 RoPE) are gathered with
// 16-byte cp.async into a STAGES-deep shared-memory ring (rows padded to 592 bytes: ldmatrix
// reads them without bank conflicts), so up to STAGES - 1 tiles are in flight while one is used.
// The e4m3 bytes go from shared memory to registers with ldmatrix and are converted there
// (cvt.rn.f16x2.e4m3x2: exact, NaN codes stay NaN); the dots are fp16 mma.sync m16n8k16 with
// fp32 accumulation, tokens or latent channels as the M and the heads (8 per n-tile) as the N:
//   phase A  logits^T[64 tok, NH] = K[64, 576] . Q^T: warp w takes 16 tokens and 1 / (W / 4) of
//            the 576 channels; the parts meet in shared memory. The k order inside each
//            16-channel step is permuted the same way for K and Q (ldmatrix hands a lane 4
//            consecutive bytes), which leaves the dot unchanged.
//   phase B  online softmax in fp32 (base 2) on the first 256 threads, P rounded to fp16 into
//            shared memory; each thread keeps its share of the running sum (added up at the end).
//   phase C  O^T[512, NH] += V^T . P^T: warp w owns 512 / W latent channels; V^T comes
//            from ldmatrix.trans of 8 tokens x 8 byte pairs and one byte permute per register,
//            which splits the even and odd channels into two M-tiles.
// Q is bf16 in global memory and fp16 in shared memory (exact for |q| in [2^-14, 65504]).
// Output: with one split the final bf16 out and natural-log LSE. Otherwise each split writes its
// normalized output (fp16, before kv_scale: |o| <= 448) and base-2 LSE (fp32), merged into out
// and LSE in one of two ways (the tuning table picks): cta_merge: the last split of a (request,
// head group) to arrive (an atomic counter in arrivals, re-armed to 0 by that CTA) merges them,
// overlapped with other requests' splits; otherwise fused_mla_merge, launched right after as a
// programmatic dependent launch on sm_90+ (resident early, it waits for this grid): cheaper at
// many splits per request.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define D_CKV 512
#define D_ALL 576
#define TILE 64
#define ROW 592    // bytes per shared-memory KV row
#define QROW 592   // halves per shared-memory Q row (1184 bytes)
#define SROW 68    // floats per shared-memory logit row (one row per head)
#define SOFTMAX_THREADS 256  // phase B runs on the first 256 threads
#define IR 16      // kv_indices ring: tiles of token indices in shared memory
#define IAHEAD 8   // index tiles fetched ahead of the gather that needs them (>= STAGES - 1)

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

__device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2_t(u32 addr, u32& r0, u32& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
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

template <int NH, int STAGES, int W>
__global__ void __launch_bounds__(32 * W, (W == 8 && STAGES == 2) ? 2 : 1)
fused_mla_decode(const u16* __restrict__ q_nope, const u16* __restrict__ q_pe, const u8* __restrict__ ckv,
                 const u8* __restrict__ kpe, const int* __restrict__ indptr, const int* __restrict__ indices,
                 u16* __restrict__ part_out, float* __restrict__ part_lse, int* __restrict__ arrivals,
                 u16* __restrict__ out, float* __restrict__ lse, int sqn_b, int sqn_h, int sqp_b, int sqp_h,
                 int s_ckv, int s_kpe, int so_b, int so_h, int sl_b, int num_heads, int num_splits,
                 int cta_merge, double scale_log2_d, double kv_scale_d) {
  constexpr int THREADS = 32 * W;
  constexpr int NT = NH / 8;             // n-tiles of 8 heads
  constexpr int KQ = W / 4;              // phase A: channel parts per 16-token group
  constexpr int DG = 16 / W;             // phase C: 32-channel groups per warp
  constexpr int RPW = TILE / W;          // rows each warp gathers
  constexpr int TPH = SOFTMAX_THREADS / NH;  // softmax threads per head
  constexpr int TPT = TILE / TPH;        // tokens per softmax thread
  extern __shared__ __align__(128) u8 smem[];
  u8* ring = smem;
  int* idx = (int*)(smem + STAGES * TILE * ROW);  // [IR][TILE] token indices, tile j in slot j % IR
  u16* qs = (u16*)(idx + IR * TILE);
  float* spart = (float*)(qs + NH * QROW);      // [KQ channel parts][NH][SROW]
  u16* ps = (u16*)(spart + KQ * NH * SROW);      // P [TILE][NH] fp16
  float* alpha_s = (float*)(ps + TILE * NH);     // [NH]
  float* ml_s = alpha_s + NH;                    // [2][NH]: m, l

  const float scale_log2 = (float)scale_log2_d, kv_scale = (float)kv_scale_d;
  const int split = blockIdx.x, b = blockIdx.y, h0 = blockIdx.z * NH;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

  const int start = indptr[b], end = indptr[b + 1];
  const int tiles_all = (end - start + TILE - 1) / TILE;
  const int per_split = (tiles_all + num_splits - 1) / num_splits;
  const int t0 = min(tiles_all, split * per_split);
  const int nt = min(tiles_all, t0 + per_split) - t0;
  const int first = start + t0 * TILE;  // first token of this split

  // Tile j's 64 token indices go to idx slot j % IR by cp.async (thread tid < TILE fetches one), IAHEAD
  // tiles before its gather is issued: the gathers never wait on an index load.
  auto fetch_indices = [&](int j) {
    if (tid < TILE && j < nt) {
      const int tok = first + j * TILE + tid;
      cp_async4(smem_addr(idx + (j % IR) * TILE + tid), indices + (tok < end ? tok : 0), tok < end ? 4 : 0);
    }
  };
  // Ring prologue: tiles 0 .. PRE-1 in flight before anything else, one cp.async group each: with 2
  // stages both slots (the first refill then waits for tile 1, not for tile 0's round trip), with
  // deeper rings STAGES - 1 (filling the last slot up front measured slower: docs/h200/fused/run12/variants14.json).
  // The first group also carries the indices of tiles PRE .. PRE-1+IAHEAD and Q (bf16, 4 channels
  // per 8-byte cp.async; zeros for heads past num_heads) staged in qs's rows.
  constexpr int PRE = STAGES == 2 ? 2 : STAGES - 1;
  const int my_tok = RPW * warp + lane % RPW;  // the tile row whose pool row this lane fetches
#pragma unroll
  for (int s = 0; s < PRE; ++s) {
    if (s < nt)
      issue_rows<RPW>(ring + s * TILE * ROW, pool_row(indices, first + s * TILE + my_tok, end), ckv, kpe, s_ckv, s_kpe,
                      warp, lane);
    if (s == 0) {
      for (int j = PRE; j < PRE + IAHEAD; ++j) fetch_indices(j);
      for (int e = tid; e < NH * (D_ALL / 4); e += THREADS) {
        const int h = e / (D_ALL / 4), k = 4 * (e % (D_ALL / 4));
        const bool ok = h0 + h < num_heads;
        const u16* src = k < D_CKV ? q_nope + (i64)b * sqn_b + (i64)(h0 + (ok ? h : 0)) * sqn_h + k
                                   : q_pe + (i64)b * sqp_b + (i64)(h0 + (ok ? h : 0)) * sqp_h + (k - D_CKV);
        cp_async8(smem_addr(qs + h * QROW + k), src, ok ? 8 : 0);
      }
    }
    cp_async_commit();
  }
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");  // fused_mla_merge may launch once every CTA is here
#endif

  // Q: bf16 -> fp16 in place once the first group has landed (each thread converts what it reads).
  cp_async_wait<PRE - 1>();
  __syncthreads();
  for (int e = tid; e < NH * (D_ALL / 4); e += THREADS) {
    const int h = e / (D_ALL / 4), k = 4 * (e % (D_ALL / 4));
    const uint2 v = *(const uint2*)(qs + h * QROW + k);
    const u32 f0 = f32_to_f16(bf16_to_f32(v.x & 0xFFFF)) | ((u32)f32_to_f16(bf16_to_f32(v.x >> 16)) << 16);
    const u32 f1 = f32_to_f16(bf16_to_f32(v.y & 0xFFFF)) | ((u32)f32_to_f16(bf16_to_f32(v.y >> 16)) << 16);
    *(uint2*)(qs + h * QROW + k) = make_uint2(f0, f1);
  }

  const float NEG_INF = __int_as_float(0xff800000);
  float m_run = NEG_INF, l_run = 0.f;  // softmax state of head (tid / TPH): its max, this thread's part of its sum
  float o[2 * DG][NT][4];
#pragma unroll
  for (int a = 0; a < 2 * DG; ++a)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[a][j][c] = 0.f;

  const int mi = lane >> 3, mr = lane & 7;  // ldmatrix: the matrix and row this lane addresses
  // Tile i is cp.async group i: the prologue's groups 0 .. PRE-1, then one per refill.
  for (int i = 0; i < nt; ++i) {
    if (PRE == STAGES && i == 0)
      cp_async_wait<STAGES - 1>();
    else
      cp_async_wait<STAGES - 2>();
    __syncthreads();
    const u8* tile = ring + (i % STAGES) * TILE * ROW;
    if (i + STAGES - 1 >= PRE) {  // every warp is past tile i - 1: refill its slot with tile i + STAGES - 1,
                                  // whose indices (fetched IAHEAD >= STAGES - 1 iterations ago) have landed
      const int j = i + STAGES - 1;
      if (j < nt) {
        const int tok = first + j * TILE + my_tok;
        issue_rows<RPW>(ring + (j % STAGES) * TILE * ROW, tok < end ? idx[(j % IR) * TILE + my_tok] : -1, ckv, kpe,
                        s_ckv, s_kpe, warp, lane);
      }
      fetch_indices(j + IAHEAD);
      cp_async_commit();
    }

    {  // phase A: partial logits^T of 16 tokens over one channel part (576 / KQ channels)
      const int tg = warp & 3, kq = warp >> 2;
      float acc[NT][2][4];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[j][0][c] = acc[j][1][c] = 0.f;
      const u16* qrow = qs + g * QROW + kq * (D_ALL / KQ) + 4 * t;
      if constexpr (KQ == 2) {  // 9 x (ldmatrix.x4: 16 tokens x 32 bytes = two k-steps)
        const u32 a_addr = smem_addr(tile + (tg * 16 + mr + 8 * (mi & 1)) * ROW + kq * (D_ALL / KQ) + 16 * (mi >> 1));
#pragma unroll
        for (int kk = 0; kk < 9; ++kk) {
          u32 r0, r1, r2, r3, a0, a1, a2, a3, a4, a5, a6, a7;
          ldsm_x4(a_addr + kk * 32, r0, r1, r2, r3);
          e4m3x4_to_f16(r0, a0, a2);
          e4m3x4_to_f16(r1, a1, a3);
          e4m3x4_to_f16(r2, a4, a6);
          e4m3x4_to_f16(r3, a5, a7);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint2 q0 = *(const uint2*)(qrow + j * 8 * QROW + kk * 32);
            const uint2 q1 = *(const uint2*)(qrow + j * 8 * QROW + kk * 32 + 16);
            mma16816(acc[j][0], a0, a1, a2, a3, q0.x, q0.y);
            mma16816(acc[j][1], a4, a5, a6, a7, q1.x, q1.y);
          }
        }
      } else {  // KQ == 4: 9 x (ldmatrix.x2: 16 tokens x 16 bytes = one k-step)
        const u32 a_addr = smem_addr(tile + (tg * 16 + mr + 8 * (mi & 1)) * ROW + kq * (D_ALL / KQ));
#pragma unroll
        for (int kk = 0; kk < 9; ++kk) {
          u32 r0, r1, a0, a1, a2, a3;
          ldsm_x2(a_addr + kk * 16, r0, r1);
          e4m3x4_to_f16(r0, a0, a2);
          e4m3x4_to_f16(r1, a1, a3);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            const uint2 q0 = *(const uint2*)(qrow + j * 8 * QROW + kk * 16);
            mma16816(acc[j][kk & 1], a0, a1, a2, a3, q0.x, q0.y);
          }
        }
      }
      float* sp = spart + kq * NH * SROW;
      const int ta = tg * 16 + g;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int h = 8 * j + 2 * t;
        sp[h * SROW + ta] = acc[j][0][0] + acc[j][1][0];
        sp[(h + 1) * SROW + ta] = acc[j][0][1] + acc[j][1][1];
        sp[h * SROW + ta + 8] = acc[j][0][2] + acc[j][1][2];
        sp[(h + 1) * SROW + ta + 8] = acc[j][0][3] + acc[j][1][3];
      }
    }
    __syncthreads();

    if (tid < SOFTMAX_THREADS) {  // phase B: online softmax, one head per TPH threads
      const int h = tid / TPH, jj = tid % TPH;
      const int valid = end - (first + i * TILE);
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
#pragma unroll
      for (int off = TPH / 2; off; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
      const float m_new = fmaxf(m_run, mt);
      const float alpha = ex2(m_run - m_new);
      float sum = 0.f;
#pragma unroll
      for (int u = 0; u < TPT; ++u) {
        const float p = ex2(s[u] - m_new);
        sum += p;
        ps[(jj + u * TPH) * NH + h] = f32_to_f16(p);
      }
      l_run = l_run * alpha + sum;  // this thread's share of the head's sum; added up after the loop
      m_run = m_new;
      if (jj == 0) alpha_s[h] = alpha;
    }
    __syncthreads();

    {  // phase C: O^T[this warp's 32 * DG channels, NH] += V^T . P^T
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float al0 = alpha_s[8 * j + 2 * t], al1 = alpha_s[8 * j + 2 * t + 1];
#pragma unroll
        for (int a = 0; a < 2 * DG; ++a) {
          o[a][j][0] *= al0;
          o[a][j][1] *= al1;
          o[a][j][2] *= al0;
          o[a][j][3] *= al1;
        }
      }
      const u32 v_addr = smem_addr(tile + (mr + 8 * (mi >> 1)) * ROW + 32 * DG * warp + 16 * (mi & 1));
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        u32 bp[NT][2];
        if constexpr (NT == 1) {
          ldsm_x2_t(smem_addr(ps + (16 * ks + mr + 8 * (mi & 1)) * NH), bp[0][0], bp[0][1]);
        } else {
          ldsm_x4_t(smem_addr(ps + (16 * ks + mr + 8 * (mi & 1)) * NH + 8 * (mi >> 1)), bp[0][0], bp[0][1],
                    bp[NT - 1][0], bp[NT - 1][1]);
        }
#pragma unroll
        for (int dg = 0; dg < DG; ++dg) {
          u32 r[4], ev[4], od[4];
          ldsm_x4_t(v_addr + 16 * ks * ROW + 32 * dg, r[0], r[1], r[2], r[3]);
#pragma unroll
          for (int q = 0; q < 4; ++q) e4m3x4_to_f16(byte_perm(r[q], 0x3120), ev[q], od[q]);
#pragma unroll
          for (int j = 0; j < NT; ++j) {
            mma16816(o[2 * dg][j], ev[0], ev[1], ev[2], ev[3], bp[j][0], bp[j][1]);
            mma16816(o[2 * dg + 1][j], od[0], od[1], od[2], od[3], bp[j][0], bp[j][1]);
          }
        }
      }
    }
  }

  {  // epilogue: normalize and store
#pragma unroll
    for (int off = TPH / 2; off; off >>= 1) l_run += __shfl_xor_sync(0xffffffffu, l_run, off);
    if (tid < SOFTMAX_THREADS && tid % TPH == 0) {
      ml_s[tid / TPH] = m_run;
      ml_s[NH + tid / TPH] = l_run;
    }
  }
  __syncthreads();
  const bool direct = num_splits == 1;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int hh = 8 * j + 2 * t + c, head = h0 + hh;
      if (head >= num_heads) continue;
      const float l = ml_s[NH + hh], m = ml_s[hh];
      const bool empty = m == NEG_INF;
      const float inv = empty ? 0.f : (direct ? kv_scale : 1.f) / l;  // partials: kv_scale is the merge's
      const float lse2 = empty ? NEG_INF : m + lg2(l);
#pragma unroll
      for (int dg = 0; dg < DG; ++dg) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int d = 32 * DG * warp + 32 * dg + 2 * g + 16 * half;
          const float ve = o[2 * dg][j][c + 2 * half] * inv, vo = o[2 * dg + 1][j][c + 2 * half] * inv;
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
  if (direct || !cta_merge) return;  // one split, or fused_mla_merge merges

  // CTA merge: the last split of (request, head group) to finish merges all of them, then re-arms
  // the arrival counter for the next launch.
  __shared__ int is_last;
  __threadfence();
  __syncthreads();
  int* arrived = arrivals + b * gridDim.z + blockIdx.z;
  if (tid == 0) is_last = atomicAdd(arrived, 1) == num_splits - 1;
  __syncthreads();
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

// Stage 2 of a split launch: out[b, head] = the splits' partial outputs weighted by exp2(their LSE),
// one CTA per (request, head), each thread 4 channels, MB splits' loads in flight at a time.
template <int MB>
__global__ void __launch_bounds__(D_CKV / 4)
fused_mla_merge(const u16* __restrict__ part_out, const float* __restrict__ part_lse, u16* __restrict__ out,
                float* __restrict__ lse, int so_b, int so_h, int sl_b, int num_heads, int num_splits, double kv_scale_d) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // fused_mla_decode has finished and its writes are visible
#endif
  const float NEG_INF = __int_as_float(0xff800000);
  const int b = blockIdx.x, head = blockIdx.y, d0 = 4 * threadIdx.x;
  const i64 row0 = (i64)b * num_splits * num_heads + head;  // (request b, split 0, head)
  float m = NEG_INF, l = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int sp0 = 0; sp0 < num_splits; sp0 += MB) {
    float ls[MB];
    float4 v[MB];
#pragma unroll
    for (int u = 0; u < MB; ++u) {
      const bool ok = sp0 + u < num_splits;
      const i64 row = row0 + (i64)(sp0 + u) * num_heads;
      ls[u] = ok ? part_lse[row] : NEG_INF;
      v[u] = f16x4_to_f32(ok ? *(const uint2*)(part_out + row * D_CKV + d0) : make_uint2(0, 0));
    }
#pragma unroll
    for (int u = 0; u < MB; ++u) merge_split<1>(m, l, &acc, ls[u], &v[u]);
  }
  const bool empty = m == NEG_INF;
  const float inv = empty ? 0.f : (float)kv_scale_d / l;
  *(uint2*)(out + (i64)b * so_b + (i64)head * so_h + d0) =
      make_uint2(f32x2_to_bf16x2(acc.x * inv, acc.y * inv), f32x2_to_bf16x2(acc.z * inv, acc.w * inv));
  if (d0 == 0) lse[(i64)b * sl_b + head] = empty ? NEG_INF : (m + lg2(l)) * 0.6931471805599453f;
}
