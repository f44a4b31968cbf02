// Tensor-core GEMM: C[M, N] = A[M, K] @ B[K, N], row-major, bf16/fp16 in, fp32 accumulate, fp32 or input-type
// out. Two kernels; gemm_plan.h holds their table and picks one per shape (kernels.py can force either):
//
// mma_gemm_kernel ("mma_128x256", "mma_128x128"), the fast path, for K % 8 == 0 and N % 8 == 0:
// * mma.sync.m16n8k16 PTX with ldmatrix fragment loads (A with ldmatrix, row-major B with ldmatrix.trans),
//   64x64 warp tiles (4 x 8 MMAs per 16-deep k-step, 8 ldmatrix.x4 per 32 MMAs), fp32 accumulators in registers.
// * 3-stage cp.async.cg pipeline of 16-byte copies (zero-filled past the matrix edges), BK = 64: four k-steps
//   per barrier. The wait + barrier sits before the last k-step of a tile and the fragments of the next k-step
//   are loaded while the current one's MMAs run, across the tile boundary too (CUTLASS's MmaMultistage order).
// * XOR-swizzled shared tiles (16-byte chunk c of row r stored at c ^ (r % 8)): every ldmatrix phase and every
//   cp.async row write touches all 32 banks once, without padding.
// * Epilogue: accumulators rounded to the output type into a padded shared tile (conflict-free 4/8-byte
//   stores), then written out as coalesced 16-byte vectors, masked at the matrix edges.
// * The index maps live in gemm_layout.h, which tests/cuda_ext/gemm_layout_check.cpp checks on the host against
//   the PTX fragment layouts (copies, ldmatrix, staging, bank conflicts).
// Followed: Bruce-Lee-LY/cuda_hgemm src/mma/mma_async_stage4.cu (multistage cp.async + ldmatrix + mma.sync with
// register double buffering and permuted shared memory), DefTruth/CUDA-Learn-Notes hgemm/hgemm_mma_stage.cu
// (row-major B through ldmatrix .trans), NVIDIA CUTLASS include/cutlass/gemm/threadblock/mma_multistage.h (the
// pipeline order), and the PTX ISA sections "Matrix Fragments for mma.m16n8k16" and "ldmatrix" for the layouts.
//
// wmma_gemm_kernel ("wmma_128x256"), the first kernel, kept as the fallback for any shape and as the reference:
// * nvcuda::wmma 16x16x16, 128x256 block tile, BK = 32, 8 warps of 64x64.
// * 3-stage cp.async pipeline (16-byte copies, zero-fill at the edges); shared rows padded by 16 bytes so the
//   8 row addresses of a fragment load hit distinct bank groups.
// * Epilogue through shared memory: fragments are stored to a per-warp staging tile, then written as
//   coalesced 16-byte rows with bounds checks, converting to the output type on the way.
// Any M, N, K works: out-of-range rows/columns/k are zero-filled on load and masked on store. When K or N is
// not a multiple of 8 the 16-byte copies would be misaligned, so that variant loads element by element.
//
// Both walk the tiles in grouped order (bands of 8 tile rows), so blocks running together share A and B
// tiles in L2.
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "cuda_api.h"
#include "cuda_common.cuh"
#include "gemm_layout.h"
#include "gemm_plan.h"

namespace pp {
namespace cuda {
namespace {

using namespace nvcuda;

constexpr int kGroupM = 8;

// Grouped order: consecutive blocks walk down a band of kGroupM tile rows before moving right.
template <int BM, int BN>
__device__ __forceinline__ void grouped_tile_origin(int m, int n, int* row0, int* col0) {
  const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
  const int group_span = kGroupM * tiles_n;
  const int first_m = (static_cast<int>(blockIdx.x) / group_span) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int in_group = static_cast<int>(blockIdx.x) % group_span;
  *row0 = (first_m + in_group % group_rows) * BM;
  *col0 = (in_group / group_rows) * BN;
}

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, cached in L2 only. valid == false reads nothing and zero-fills the 16 bytes.
__device__ __forceinline__ void cp_async_16(unsigned smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  cp_async_16(shared_address(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---------------------------------------------------------------------------------------------------------------
// The WMMA kernel (fallback and reference).
namespace wmma_path {

constexpr int kBM = 128, kBN = 256, kBK = 32;
constexpr int kWM = 64, kWN = 64;
constexpr int kWarpsN = kBN / kWN;                    // 4
constexpr int kThreads = (kBM / kWM) * kWarpsN * 32;  // 256
constexpr int kStages = 3;
constexpr int kSkew = 8;               // 16 bytes of padding per shared row
constexpr int kLdA = kBK + kSkew;      // 40 elements = 80 bytes
constexpr int kLdB = kBN + kSkew;      // 264 elements = 528 bytes
constexpr int kAStage = kBM * kLdA;    // elements per stage
constexpr int kBStage = kBK * kLdB;
constexpr int kFragM = kWM / 16, kFragN = kWN / 16;
constexpr int kLdC = kWN + 4;          // fp32 staging row of one warp's 16 x 64 band
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * (kAStage + kBStage) * 2;
static_assert(static_cast<size_t>(kThreads / 32) * 16 * kLdC * sizeof(float) <= kSmemBytes,
              "the epilogue staging reuses the pipeline buffers");
static_assert((kAStage * 2) % 128 == 0 && (kBStage * 2) % 128 == 0, "stages keep 128-byte alignment");

static_assert(kSmemBytes == kGemmKernels[kGemmWmma128x256].smem_bytes, "gemm_plan.h's table matches");

// Loads the A tile [kBM, kBK] at (row0, k0) and the B tile [kBK, kBN] at (k0, col0) into one stage.
template <typename T, bool kVec>
__device__ __forceinline__ void load_tile(T* a_s, T* b_s, const T* a, const T* b, int m, int n, int k, int row0,
                                          int col0, int k0, int tid) {
  constexpr int kAVecs = kBM * kBK / 8, kBVecs = kBK * kBN / 8;  // 8 elements = 16 bytes
  static_assert(kAVecs % kThreads == 0 && kBVecs % kThreads == 0, "whole vectors per thread");
#pragma unroll
  for (int i = 0; i < kAVecs / kThreads; ++i) {
    const int v = tid + i * kThreads;
    const int r = v / (kBK / 8), c = (v % (kBK / 8)) * 8;
    const int grow = row0 + r, gk = k0 + c;
    T* dst = a_s + r * kLdA + c;
    if constexpr (kVec) {
      const bool ok = grow < m && gk < k;  // k % 8 == 0: a vector is wholly in or out
      cp_async_16(dst, ok ? a + static_cast<int64_t>(grow) * k + gk : a, ok);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        dst[e] = (grow < m && gk + e < k) ? a[static_cast<int64_t>(grow) * k + gk + e] : from_float<T>(0.f);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kBVecs / kThreads; ++i) {
    const int v = tid + i * kThreads;
    const int r = v / (kBN / 8), c = (v % (kBN / 8)) * 8;
    const int gk = k0 + r, gcol = col0 + c;
    T* dst = b_s + r * kLdB + c;
    if constexpr (kVec) {
      const bool ok = gk < k && gcol < n;  // n % 8 == 0
      cp_async_16(dst, ok ? b + static_cast<int64_t>(gk) * n + gcol : b, ok);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        dst[e] = (gk < k && gcol + e < n) ? b[static_cast<int64_t>(gk) * n + gcol + e] : from_float<T>(0.f);
      }
    }
  }
}

// Writes up to 8 consecutive outputs of one row from fp32 staging; 16-byte stores when the row is aligned.
template <typename T>
__device__ __forceinline__ void store_outputs(void* c, bool out_f32, int64_t offset, const float* src, int count,
                                              bool vec_ok) {
  if (out_f32) {
    float* dst = static_cast<float*>(c) + offset;
    if (vec_ok && count >= 8) {
      reinterpret_cast<float4*>(dst)[0] = reinterpret_cast<const float4*>(src)[0];
      reinterpret_cast<float4*>(dst)[1] = reinterpret_cast<const float4*>(src)[1];
    } else {
      for (int e = 0; e < count && e < 8; ++e) dst[e] = src[e];
    }
  } else {
    T* dst = static_cast<T*>(c) + offset;
    if (vec_ok && count >= 8) {
      union {
        uint4 vec;
        T elems[8];
      } pack;
#pragma unroll
      for (int e = 0; e < 8; ++e) pack.elems[e] = from_float<T>(src[e]);
      *reinterpret_cast<uint4*>(dst) = pack.vec;
    } else {
      for (int e = 0; e < count && e < 8; ++e) dst[e] = from_float<T>(src[e]);
    }
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 1)
    wmma_gemm_kernel(const T* __restrict__ a, const T* __restrict__ b, void* __restrict__ c, int m, int n, int k,
                     bool out_f32) {
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  T* a_s = reinterpret_cast<T*>(gemm_smem);
  T* b_s = a_s + kStages * kAStage;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;

  int row0, col0;
  grouped_tile_origin<kBM, kBN>(m, n, &row0, &col0);

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
  for (int i = 0; i < kFragM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  }

  const int k_tiles = (k + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile<T, kVec>(a_s + s * kAStage, b_s + s * kBStage, a, b, m, n, k, row0, col0, s * kBK, tid);
    cp_async_commit();  // empty groups keep the wait count below uniform
  }

  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (for this thread) ...
    __syncthreads();               // ... for every thread, and every warp is done with tile kt - 1
    const int next = kt + kStages - 1;
    if (next < k_tiles) {
      // Refills the stage read in iteration kt - 1, which the barrier above has released.
      const int s = next % kStages;
      load_tile<T, kVec>(a_s + s * kAStage, b_s + s * kBStage, a, b, m, n, k, row0, col0, next * kBK, tid);
    }
    cp_async_commit();

    const T* a_tile = a_s + (kt % kStages) * kAStage + warp_m * kWM * kLdA;
    const T* b_tile = b_s + (kt % kStages) * kBStage + warp_n * kWN;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[kFragM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb[kFragN];
#pragma unroll
      for (int i = 0; i < kFragM; ++i) wmma::load_matrix_sync(fa[i], a_tile + i * 16 * kLdA + kk, kLdA);
#pragma unroll
      for (int j = 0; j < kFragN; ++j) wmma::load_matrix_sync(fb[j], b_tile + kk * kLdB + j * 16, kLdB);
#pragma unroll
      for (int i = 0; i < kFragM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the epilogue staging area

  float* staging = reinterpret_cast<float*>(gemm_smem) + warp * 16 * kLdC;
  const bool vec_ok = (n % 8) == 0;
#pragma unroll
  for (int i = 0; i < kFragM; ++i) {
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::store_matrix_sync(staging + j * 16, acc[i][j], kLdC, wmma::mem_row_major);
    __syncwarp();
    // 16 rows x 64 columns as 8-column pieces: 4 pieces per lane, consecutive lanes on consecutive columns.
    for (int piece = lane; piece < 16 * (kWN / 8); piece += 32) {
      const int r = piece / (kWN / 8), col = (piece % (kWN / 8)) * 8;
      const int grow = row0 + warp_m * kWM + i * 16 + r;
      const int gcol = col0 + warp_n * kWN + col;
      if (grow < m && gcol < n) {
        store_outputs<T>(c, out_f32, static_cast<int64_t>(grow) * n + gcol, staging + r * kLdC + col, n - gcol,
                         vec_ok);
      }
    }
    __syncwarp();  // the next band overwrites the staging tile
  }
}

template <typename T, bool kVec>
void launch(const void* a, const void* b, void* c, int m, int n, int k, bool out_f32, cudaStream_t stream) {
  auto kernel = wmma_gemm_kernel<T, kVec>;
  // Above 48 KiB of dynamic shared memory a kernel must opt in (per device; cheap to repeat).
  PP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
  const int64_t tiles = gemm_tiles(kGemmWmma128x256, m, n);
  kernel<<<static_cast<unsigned>(tiles), kThreads, kSmemBytes, stream>>>(static_cast<const T*>(a),
                                                                         static_cast<const T*>(b), c, m, n, k, out_f32);
  PP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void gemm_typed(const void* a, const void* b, void* c, int m, int n, int k, bool out_f32, cudaStream_t stream) {
  if (k % 8 == 0 && n % 8 == 0) {
    launch<T, true>(a, b, c, m, n, k, out_f32, stream);
  } else {
    launch<T, false>(a, b, c, m, n, k, out_f32, stream);
  }
}

}  // namespace wmma_path

// ---------------------------------------------------------------------------------------------------------------
// The mma.sync kernel.
namespace mma_path {

template <int BM, int BN, int WarpsM, int WarpsN, int MinBlocksPerSm, int Kernel>
struct Tile {
  static constexpr int kBM = BM, kBN = BN, kBK = 64, kStages = 3;
  static constexpr int kWarpsN = WarpsN, kThreads = WarpsM * WarpsN * 32, kMinBlocks = MinBlocksPerSm;
  static constexpr int kWM = BM / WarpsM, kWN = BN / WarpsN;  // 64 x 64 per warp
  static constexpr int kFragsM = kWM / 16, kFragsN = kWN / 8;  // m16n8 accumulator tiles per warp
  static constexpr int kSteps = kBK / 16;                      // k-steps per shared tile
  static constexpr unsigned kAStageBytes = BM * kBK * 2, kBStageBytes = kBK * BN * 2;
  static constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * (kAStageBytes + kBStageBytes);
  static constexpr int kKernel = Kernel;

  static_assert(kWM == 64 && kWN == 64, "the register budget is sized for 64x64 warp tiles");
  static_assert(kSteps % 2 == 0, "fragment double buffering keeps its parity across tiles");
  static_assert(kSmemBytes == kGemmKernels[Kernel].smem_bytes, "gemm_plan.h's table matches");
  static_assert(kGemmKernels[Kernel].block_m == BM && kGemmKernels[Kernel].block_n == BN &&
                    kGemmKernels[Kernel].block_k == kBK && kGemmKernels[Kernel].stages == kStages &&
                    kGemmKernels[Kernel].threads == kThreads,
                "gemm_plan.h's table matches");
  // The epilogue stages the whole C tile (fp32 at most, rows padded by 8 elements) in the pipeline buffers.
  static_assert(static_cast<size_t>(BM) * (BN + 8) * sizeof(float) <= kSmemBytes, "C staging fits");
};
using Tile128x256 = Tile<128, 256, 2, 4, 1, kGemmMma128x256>;
using Tile128x128 = Tile<128, 128, 2, 2, 2, kGemmMma128x128>;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Transposed: from a [k][n] tile, the B fragments of two adjacent n8 tiles (k 0-7 and 8-15 of each).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&b_lo)[2], uint32_t (&b_hi)[2], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b_lo[0]), "=r"(b_lo[1]), "=r"(b_hi[0]), "=r"(b_hi[1])
               : "r"(addr));
}

// d += a @ b for one m16n8k16 tile, fp32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    static_assert(std::is_same_v<T, __half>, "bf16 or fp16 operands");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

// Global -> shared copies of one k-tile (gemm_layout::CopyPlan). M, N and K edges: a chunk is wholly inside or
// wholly outside, since K % 8 == 0 and N % 8 == 0; outside chunks are zero-filled.
template <typename T, class Cfg>
struct TileLoader {
  using APlan = gemm_layout::CopyPlan<Cfg::kThreads, Cfg::kBM, Cfg::kBK>;
  using BPlan = gemm_layout::CopyPlan<Cfg::kThreads, Cfg::kBK, Cfg::kBN>;

  const T* a_src;  // this thread's pass-0 chunk of k-tile 0
  const T* b_src;
  unsigned a_dst, b_dst;  // pass-0 destinations, bytes within a stage
  int a_rows_left;        // pass p is inside M when p * APlan::kRowsPerPass < a_rows_left
  int a_k_left;           // a k-tile starting at k0 is inside K for A when k0 < a_k_left
  int b_k_left;           // and B's pass p when k0 + p * BPlan::kRowsPerPass < b_k_left
  int n;
  bool b_col_ok;

  __device__ __forceinline__ TileLoader(const T* a, const T* b, int m_, int n_, int k, int row0, int col0, int tid) {
    const int a_row = APlan::row(tid, 0), a_col = APlan::chunk(tid) * gemm_layout::kChunkElems;
    const int b_row = BPlan::row(tid, 0), b_col = BPlan::chunk(tid) * gemm_layout::kChunkElems;
    a_src = a + static_cast<int64_t>(row0 + a_row) * k + a_col;
    b_src = b + static_cast<int64_t>(b_row) * n_ + col0 + b_col;
    a_dst = APlan::smem_offset(tid);
    b_dst = BPlan::smem_offset(tid);
    a_rows_left = m_ - row0 - a_row;
    a_k_left = k - a_col;
    b_k_left = k - b_row;
    n = n_;
    b_col_ok = col0 + b_col < n_;
  }

  // Issues the copies of k-tile k_tile into the stage at shared addresses a_stage / b_stage. A chunk outside
  // the matrix is copied with source size 0: nothing is read (its address may be past the end), 16 zero bytes
  // are written, as CUTLASS's cp_async_zfill does.
  __device__ __forceinline__ void load(unsigned a_stage, unsigned b_stage, int k_tile, int k) const {
    const int k0 = k_tile * Cfg::kBK;
    const bool a_k_ok = k0 < a_k_left;
#pragma unroll
    for (int p = 0; p < APlan::kPasses; ++p) {
      const bool ok = a_k_ok && p * APlan::kRowsPerPass < a_rows_left;
      const T* src = a_src + static_cast<int64_t>(p) * APlan::kRowsPerPass * k + k0;
      cp_async_16(a_stage + a_dst + p * APlan::kPassBytes, src, ok);
    }
#pragma unroll
    for (int p = 0; p < BPlan::kPasses; ++p) {
      const int kr = k0 + p * BPlan::kRowsPerPass;
      const bool ok = b_col_ok && kr < b_k_left;
      const T* src = b_src + static_cast<int64_t>(kr) * n;
      cp_async_16(b_stage + b_dst + p * BPlan::kPassBytes, src, ok);
    }
  }
};

// The warp's fragments of one 16-deep k-step, loaded with ldmatrix (gemm_layout.h has the addresses).
template <class Cfg>
struct Fragments {
  uint32_t a[Cfg::kFragsM][4];
  uint32_t b[Cfg::kFragsN][2];

  __device__ __forceinline__ void load(unsigned a_stage, unsigned b_stage, int step, int warp_m, int warp_n,
                                       int lane) {
#pragma unroll
    for (int i = 0; i < Cfg::kFragsM; ++i) {
      ldmatrix_x4(a[i], a_stage + gemm_layout::a_fragment_offset(warp_m * Cfg::kWM, i, step, lane, Cfg::kBK));
    }
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN / 2; ++j) {
      ldmatrix_x4_trans(b[2 * j], b[2 * j + 1],
                        b_stage + gemm_layout::b_fragment_offset(warp_n * Cfg::kWN, j, step, lane, Cfg::kBN));
    }
  }
};

__device__ __forceinline__ void store_pair(float* dst, float x, float y) {
  *reinterpret_cast<float2*>(dst) = make_float2(x, y);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* dst, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store_pair(__half* dst, float x, float y) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(x, y);
}

// Accumulators -> output type -> padded shared C tile (gemm_layout::c_staging_index) -> 16-byte coalesced
// global stores, masked at the edges.
template <typename OutT, class Cfg>
__device__ __forceinline__ void store_c_tile(const float (&acc)[Cfg::kFragsM][Cfg::kFragsN][4], void* smem,
                                             void* c_out, int m, int n, int row0, int col0, int warp_m, int warp_n,
                                             int lane, int tid) {
  constexpr int kLd = gemm_layout::c_staging_pitch(Cfg::kBN);
  OutT* staging = static_cast<OutT*>(smem);
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN; ++j) {
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        const int index =
            gemm_layout::c_staging_index(warp_m * Cfg::kWM, warp_n * Cfg::kWN, i, j, pair, lane, Cfg::kBN);
        store_pair(staging + index, acc[i][j][2 * pair], acc[i][j][2 * pair + 1]);
      }
    }
  }
  __syncthreads();
  constexpr int kVec = 16 / sizeof(OutT);  // elements per 16-byte store
  constexpr int kVecsPerRow = Cfg::kBN / kVec;
  constexpr int kIters = Cfg::kBM * kVecsPerRow / Cfg::kThreads;
  static_assert(Cfg::kBM * kVecsPerRow % Cfg::kThreads == 0, "whole vectors per thread");
  OutT* c = static_cast<OutT*>(c_out);
#pragma unroll 4
  for (int it = 0; it < kIters; ++it) {
    const int v = tid + it * Cfg::kThreads;
    const int r = v / kVecsPerRow, col = (v % kVecsPerRow) * kVec;
    const int grow = row0 + r, gcol = col0 + col;
    // n % 8 == 0 and gcol % kVec == 0: a vector is wholly inside N or wholly outside.
    if (grow < m && gcol < n) {
      *reinterpret_cast<uint4*>(c + static_cast<int64_t>(grow) * n + gcol) =
          *reinterpret_cast<const uint4*>(staging + r * kLd + col);
    }
  }
}

template <typename T, class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    mma_gemm_kernel(const T* __restrict__ a, const T* __restrict__ b, void* __restrict__ c, int m, int n, int k,
                    bool out_f32) {
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  const unsigned a_smem = shared_address(gemm_smem);
  const unsigned b_smem = a_smem + Cfg::kStages * Cfg::kAStageBytes;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / Cfg::kWarpsN, warp_n = warp % Cfg::kWarpsN;
  int row0, col0;
  grouped_tile_origin<Cfg::kBM, Cfg::kBN>(m, n, &row0, &col0);

  float acc[Cfg::kFragsM][Cfg::kFragsN][4];
#pragma unroll
  for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
    for (int j = 0; j < Cfg::kFragsN; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    }
  }

  const TileLoader<T, Cfg> loader(a, b, m, n, k, row0, col0, tid);
  const int k_tiles = (k + Cfg::kBK - 1) / Cfg::kBK;
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < k_tiles) loader.load(a_smem + s * Cfg::kAStageBytes, b_smem + s * Cfg::kBStageBytes, s, k);
    cp_async_commit();  // empty groups keep the wait counts below uniform
  }
  cp_async_wait<Cfg::kStages - 2>();  // k-tile 0 has landed (for this thread) ...
  __syncthreads();                     // ... for every thread

  Fragments<Cfg> frag[2];
  int read_stage = 0, write_stage = Cfg::kStages - 1;
  frag[0].load(a_smem, b_smem, 0, warp_m, warp_n, lane);
  for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
    for (int step = 0; step < Cfg::kSteps; ++step) {
      if (step == Cfg::kSteps - 1) {
        // Next k-tile: its copies have landed once at most kStages - 2 newer groups are pending; the barrier
        // also tells every warp that all fragment loads of k-tile kt - 1 are done, which frees its stage for
        // the copies issued at step 0 of the next iteration.
        read_stage = read_stage == Cfg::kStages - 1 ? 0 : read_stage + 1;
        cp_async_wait<Cfg::kStages - 2>();
        __syncthreads();
      }
      // Fragments of the next k-step (step 0 of the next k-tile after the last step) load while this step's
      // MMAs run. After the last k-tile this reads a stale stage, harmlessly.
      frag[(step + 1) % 2].load(a_smem + read_stage * Cfg::kAStageBytes, b_smem + read_stage * Cfg::kBStageBytes,
                                (step + 1) % Cfg::kSteps, warp_m, warp_n, lane);
      if (step == 0) {
        // Refill the stage k-tile kt - 1 used (released by the barrier in the previous iteration).
        const int next = kt + Cfg::kStages - 1;
        if (next < k_tiles) {
          loader.load(a_smem + write_stage * Cfg::kAStageBytes, b_smem + write_stage * Cfg::kBStageBytes, next, k);
        }
        cp_async_commit();
        write_stage = write_stage == Cfg::kStages - 1 ? 0 : write_stage + 1;
      }
      const Fragments<Cfg>& f = frag[step % 2];
#pragma unroll
      for (int i = 0; i < Cfg::kFragsM; ++i) {
#pragma unroll
        for (int jj = 0; jj < Cfg::kFragsN; ++jj) {
          const int j = (i % 2) ? Cfg::kFragsN - 1 - jj : jj;  // serpentine: consecutive MMAs share a B fragment
          mma_16816<T>(acc[i][j], f.a[i], f.b[j]);
        }
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline buffers become the C staging tile

  if (out_f32) {
    store_c_tile<float, Cfg>(acc, gemm_smem, c, m, n, row0, col0, warp_m, warp_n, lane, tid);
  } else {
    store_c_tile<T, Cfg>(acc, gemm_smem, c, m, n, row0, col0, warp_m, warp_n, lane, tid);
  }
}

template <typename T, class Cfg>
void launch(const void* a, const void* b, void* c, int m, int n, int k, bool out_f32, cudaStream_t stream) {
  auto kernel = mma_gemm_kernel<T, Cfg>;
  PP_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::kSmemBytes)));
  // All of the unified L1/shared array as shared memory, so two 96 KiB blocks of the 128x128 kernel fit an SM.
  PP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  const int64_t tiles = gemm_tiles(Cfg::kKernel, m, n);
  kernel<<<static_cast<unsigned>(tiles), Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), c, m, n, k, out_f32);
  PP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace mma_path

struct DeviceLimits {
  int sm_count, smem_optin;
};

DeviceLimits current_device_limits() {
  int device = 0;
  DeviceLimits limits{};
  PP_CUDA_CHECK(cudaGetDevice(&device));
  PP_CUDA_CHECK(cudaDeviceGetAttribute(&limits.sm_count, cudaDevAttrMultiProcessorCount, device));
  PP_CUDA_CHECK(cudaDeviceGetAttribute(&limits.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return limits;
}

template <typename T>
void gemm_typed(int kernel, const void* a, const void* b, void* c, int m, int n, int k, bool out_f32,
                cudaStream_t stream) {
  switch (kernel) {
    case kGemmMma128x256: mma_path::launch<T, mma_path::Tile128x256>(a, b, c, m, n, k, out_f32, stream); break;
    case kGemmMma128x128: mma_path::launch<T, mma_path::Tile128x128>(a, b, c, m, n, k, out_f32, stream); break;
    default: wmma_path::gemm_typed<T>(a, b, c, m, n, k, out_f32, stream); break;
  }
}

}  // namespace

int gemm_kernel_for(int64_t m, int64_t n, int64_t k) {
  const DeviceLimits limits = current_device_limits();
  return choose_gemm_kernel(m, n, k, limits.sm_count, limits.smem_optin);
}

void gemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, int in_dtype, int out_dtype,
          void* stream_ptr, int kernel) {
  if (in_dtype != kFloat16 && in_dtype != kBFloat16) throw std::invalid_argument("gemm inputs must be fp16 or bf16");
  if (out_dtype != kFloat32 && out_dtype != in_dtype) {
    throw std::invalid_argument("gemm output must be fp32 or the input dtype");
  }
  if (m < 0 || n < 0 || k < 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    throw std::invalid_argument("gemm dimensions must be in [0, 2^31)");
  }
  if (kernel != kGemmAuto && !gemm_kernel_known(kernel)) {
    throw std::invalid_argument("unknown gemm kernel code " + std::to_string(kernel));
  }
  const DeviceLimits limits = current_device_limits();
  if (kernel == kGemmAuto) {
    kernel = choose_gemm_kernel(m, n, k, limits.sm_count, limits.smem_optin);
  } else if (!gemm_kernel_supports(kernel, n, k, limits.smem_optin)) {
    throw std::invalid_argument(std::string("gemm kernel ") + kGemmKernels[kernel].name + " cannot run N = " +
                                std::to_string(n) + ", K = " + std::to_string(k) +
                                " on this device (the mma kernels need K and N multiples of 8)");
  }
  if (m == 0 || n == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool out_f32 = out_dtype == kFloat32;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (in_dtype == kBFloat16) {
    gemm_typed<__nv_bfloat16>(kernel, a, b, c, mi, ni, ki, out_f32, stream);
  } else {
    gemm_typed<__half>(kernel, a, b, c, mi, ni, ki, out_f32, stream);
  }
}

}  // namespace cuda
}  // namespace pp
