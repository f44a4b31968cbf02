// Device helpers shared by the .cu files: error checks, dtype conversions, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "common.h"

#define PP_CUDA_CHECK(expr)                                                                            \
  do {                                                                                                 \
    const cudaError_t pp_err_ = (expr);                                                                \
    if (pp_err_ != cudaSuccess) {                                                                      \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(pp_err_) + " (" #expr \
                               ") at " __FILE__ ":" + std::to_string(__LINE__));                       \
    }                                                                                                  \
  } while (0)

namespace pp {
namespace cuda {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double from_float<double>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Accumulator type: fp32 for 16/32-bit data, fp64 for fp64 data.
template <typename T>
struct Accum {
  using type = float;
  __device__ static float load(T x) { return to_float(x); }
  __device__ static T store(float x) { return from_float<T>(x); }
};
template <>
struct Accum<double> {
  using type = double;
  __device__ static double load(double x) { return x; }
  __device__ static double store(double x) { return x; }
};

template <typename V>
__device__ __forceinline__ V warp_sum(V v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace cuda
}  // namespace pp
