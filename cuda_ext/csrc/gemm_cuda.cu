// Tensor-core GEMM with nvcuda::wmma: C[M, N] = A[M, K] @ B[K, N], row-major, bf16/fp16 in, fp32 accumulate,
// fp32 or input-type out.
//
// Why each piece is there (simple WMMA kernels reach under 10% of cuBLAS on Hopper, starved of data):
// * 128x256 block tile, BK = 32, 8 warps of 64x64: each warp issues 16 MMAs per 8 fragment loads, and each
//   block reads 128 + 256 rows of K per 128 x 256 outputs, so shared-memory and L2 traffic per FLOP is low.
// * 3-stage cp.async pipeline (16-byte copies, zero-fill at the edges): global loads of tile k+2 overlap
//   the MMAs on tile k without staging through registers.
// * Shared rows padded by 16 bytes: the 8 row addresses of a fragment load hit distinct bank groups.
// * Grouped block order (GROUP_M tiles of M per band): blocks running together share A and B tiles in L2.
// * Epilogue through shared memory: fragments are stored to a per-warp staging tile, then written as
//   coalesced 16-byte rows with bounds checks, converting to the output type on the way.
// Any M, N, K works: out-of-range rows/columns/k are zero-filled on load and masked on store. When K or N is
// not a multiple of 8 the 16-byte copies would be misaligned, so that variant loads element by element.
#include <mma.h>

#include "cuda_api.h"
#include "cuda_common.cuh"

namespace pp {
namespace cuda {
namespace {

using namespace nvcuda;

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
constexpr int kGroupM = 8;
constexpr size_t kSmemBytes = static_cast<size_t>(kStages) * (kAStage + kBStage) * 2;
static_assert(static_cast<size_t>(kThreads / 32) * 16 * kLdC * sizeof(float) <= kSmemBytes,
              "the epilogue staging reuses the pipeline buffers");
static_assert((kAStage * 2) % 128 == 0 && (kBStage * 2) % 128 == 0, "stages keep 128-byte alignment");

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

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

  // Grouped order: consecutive blocks walk down a band of kGroupM tile rows before moving right.
  const int tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  const int group_span = kGroupM * tiles_n;
  const int first_m = (static_cast<int>(blockIdx.x) / group_span) * kGroupM;
  const int group_rows = min(tiles_m - first_m, kGroupM);
  const int in_group = static_cast<int>(blockIdx.x) % group_span;
  const int row0 = (first_m + in_group % group_rows) * kBM;
  const int col0 = (in_group / group_rows) * kBN;

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
void launch_gemm(const void* a, const void* b, void* c, int m, int n, int k, bool out_f32, cudaStream_t stream) {
  auto kernel = wmma_gemm_kernel<T, kVec>;
  // Above 48 KiB of dynamic shared memory a kernel must opt in (per device; cheap to repeat).
  PP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmemBytes)));
  const int64_t tiles = static_cast<int64_t>((m + kBM - 1) / kBM) * ((n + kBN - 1) / kBN);
  kernel<<<static_cast<unsigned>(tiles), kThreads, kSmemBytes, stream>>>(static_cast<const T*>(a),
                                                                         static_cast<const T*>(b), c, m, n, k, out_f32);
  PP_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void gemm_typed(const void* a, const void* b, void* c, int m, int n, int k, bool out_f32, cudaStream_t stream) {
  if (k % 8 == 0 && n % 8 == 0) {
    launch_gemm<T, true>(a, b, c, m, n, k, out_f32, stream);
  } else {
    launch_gemm<T, false>(a, b, c, m, n, k, out_f32, stream);
  }
}

}  // namespace

void gemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, int in_dtype, int out_dtype,
          void* stream_ptr) {
  if (in_dtype != kFloat16 && in_dtype != kBFloat16) throw std::invalid_argument("gemm inputs must be fp16 or bf16");
  if (out_dtype != kFloat32 && out_dtype != in_dtype) {
    throw std::invalid_argument("gemm output must be fp32 or the input dtype");
  }
  if (m < 0 || n < 0 || k < 0 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) {
    throw std::invalid_argument("gemm dimensions must be in [0, 2^31)");
  }
  if (m == 0 || n == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const bool out_f32 = out_dtype == kFloat32;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (in_dtype == kBFloat16) {
    gemm_typed<__nv_bfloat16>(a, b, c, mi, ni, ki, out_f32, stream);
  } else {
    gemm_typed<__half>(a, b, c, mi, ni, ki, out_f32, stream);
  }
}

}  // namespace cuda
}  // namespace pp
