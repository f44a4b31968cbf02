// Shared by the CPU (g++) and CUDA (nvcc) sources: dtype codes, the routing score rules, and the launcher
// declarations. It includes no CUDA header, so bindings.cpp builds with a plain C++ compiler.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#if defined(__CUDACC__)
#define PP_HD __host__ __device__ __forceinline__
#else
#define PP_HD inline
#endif

namespace pp {

// Element type of a buffer, as the Python wrapper encodes it (cuda_ext/kernels.py keeps the same table).
enum DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

enum ScoreKind : int { kSoftmax = 0, kSigmoid = 1 };

inline int dtype_size(int dtype) {
  switch (dtype) {
    case kFloat32: return 4;
    case kFloat64: return 8;
    case kFloat16:
    case kBFloat16: return 2;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
}

// float32 limits spelled out so host and device code agree without <limits> on the device.
constexpr float kFloatMax = 3.40282346638528859812e+38f;
constexpr float kFloatTiny = 1.17549435082228750797e-38f;  // smallest normal, the reference's clamp

// nan_to_num(nan=lowest, posinf=max, neginf=lowest), as routing.router_scores does before scoring.
PP_HD float sanitize_logit(float x) {
  if (x != x) return -kFloatMax;
  if (x > kFloatMax) return kFloatMax;
  if (x < -kFloatMax) return -kFloatMax;
  return x;
}

PP_HD bool is_finite_logit(float x) { return x == x && x <= kFloatMax && x >= -kFloatMax; }

// Top-k order: higher score first, equal scores to the lower expert id (a stable descending sort).
PP_HD bool ranks_before(float score_a, int id_a, float score_b, int id_b) {
  return score_a > score_b || (score_a == score_b && id_a < id_b);
}

// Tokens per chunk in the CUDA routing kernels (one warp walks one chunk in token order): a power of two
// between these bounds, chosen per call (routing_cuda.cu, route_chunk).
constexpr int kMinRouteChunk = 64;
constexpr int kMaxRouteChunk = 1 << 20;
// The CUDA routing kernels keep per-expert state in shared memory, which bounds the expert count.
constexpr int kMaxCudaExperts = 4096;

}  // namespace pp
