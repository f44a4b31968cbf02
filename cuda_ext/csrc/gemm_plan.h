// Which GEMM kernel serves a shape: the kernel table and the choice, in plain C++ so bindings.cpp exposes them
// in every build (the CPU tests check the choice; gemm_cuda.cu launches what it returns).
#pragma once

#include <cstddef>
#include <cstdint>

namespace pp {

// Kernel codes, as the Python wrapper encodes them (cuda_ext/kernels.py keeps the same table).
enum GemmKernel : int {
  kGemmAuto = -1,
  // The first kernel, kept as the fallback and the reference: nvcuda::wmma, 128x256x32 tiles, 3 stages. Any shape,
  // including K or N not a multiple of 8 (element-wise loads there).
  kGemmWmma128x256 = 0,
  // mma.sync m16n8k16 + ldmatrix on XOR-swizzled tiles, BK = 64, 3 stages, 64x64 warp tiles. Need K % 8 == 0 and
  // N % 8 == 0 (16-byte cp.async of every row).
  kGemmMma128x256 = 1,  // 8 warps, one block per SM: the least shared-memory and L2 traffic per FLOP
  kGemmMma128x128 = 2,  // 4 warps, two blocks per SM on sm_90: twice the tiles, for shapes that fill few SMs
};
constexpr int kNumGemmKernels = 3;

struct GemmKernelInfo {
  const char* name;
  int block_m, block_n, block_k, stages, threads;
  size_t smem_bytes;  // dynamic shared memory per block
};

// bf16/fp16 operands: 2 bytes. The WMMA kernel pads each shared row by 16 bytes (see gemm_cuda.cu).
constexpr size_t mma_smem_bytes(int bm, int bn, int bk, int stages) {
  return static_cast<size_t>(stages) * (static_cast<size_t>(bm) * bk + static_cast<size_t>(bk) * bn) * 2;
}
constexpr GemmKernelInfo kGemmKernels[kNumGemmKernels] = {
    {"wmma_128x256", 128, 256, 32, 3, 256, 3 * (128 * (32 + 8) + 32 * (256 + 8)) * 2},
    {"mma_128x256", 128, 256, 64, 3, 256, mma_smem_bytes(128, 256, 64, 3)},
    {"mma_128x128", 128, 128, 64, 3, 128, mma_smem_bytes(128, 128, 64, 3)},
};

inline bool gemm_kernel_known(int kernel) { return kernel >= 0 && kernel < kNumGemmKernels; }

inline int64_t gemm_tiles(int kernel, int64_t m, int64_t n) {
  const GemmKernelInfo& info = kGemmKernels[kernel];
  return ((m + info.block_m - 1) / info.block_m) * ((n + info.block_n - 1) / info.block_n);
}

// Whether `kernel` can compute this shape on a device with `smem_optin` bytes of opt-in shared memory per block.
inline bool gemm_kernel_supports(int kernel, int64_t n, int64_t k, int64_t smem_optin) {
  if (!gemm_kernel_known(kernel) || static_cast<int64_t>(kGemmKernels[kernel].smem_bytes) > smem_optin) return false;
  // cp.async copies 16 bytes (8 elements) per instruction: every row of A (K elements) and of B (N elements)
  // must start 16-byte aligned, given 16-byte aligned base addresses (kernels.py checks those).
  return kernel == kGemmWmma128x256 || (k % 8 == 0 && n % 8 == 0);
}

// The kernel `auto` runs. The 128x256 tile moves the least data per FLOP, so it wins whenever its tiles keep
// every SM busy; below one tile per SM the 128x128 tile (two blocks per SM on sm_90) spreads the work wider.
// Shapes the mma kernels cannot load with 16-byte copies go to the WMMA kernel.
inline int choose_gemm_kernel(int64_t m, int64_t n, int64_t k, int64_t sm_count, int64_t smem_optin) {
  if (gemm_kernel_supports(kGemmMma128x256, n, k, smem_optin) && gemm_tiles(kGemmMma128x256, m, n) >= sm_count) {
    return kGemmMma128x256;
  }
  if (gemm_kernel_supports(kGemmMma128x128, n, k, smem_optin)) return kGemmMma128x128;
  return kGemmWmma128x256;
}

}  // namespace pp
