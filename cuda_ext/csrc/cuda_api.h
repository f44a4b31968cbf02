// Launchers of the CUDA kernels, callable from plain C++ (bindings.cpp): raw device pointers, shapes,
// dtype codes (common.h) and the cudaStream_t as void*. All launches are asynchronous on that stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gemm_plan.h"

namespace pp {
namespace cuda {

// Scratch bytes route_forward needs (per-chunk expert histograms); the caller allocates it on the device.
size_t route_workspace_bytes(int64_t num_tokens, int64_t num_experts, int64_t k);

// Same outputs as route_forward_cpu, except N is not returned: it is offsets[E] on the device.
void route_forward(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k,
                   int64_t capacity, int score, float* weights, int32_t* ids, uint8_t* dropped, int32_t* counts,
                   int32_t* offsets, int32_t* source_index, int32_t* position, void* workspace,
                   size_t workspace_bytes, void* stream);

void route_backward(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k, int score,
                    const int32_t* ids, const float* grad_weights, void* grad_logits, void* stream);

void permute(const void* src, void* dst, const int32_t* source_index, int64_t num_rows, int64_t k,
             int64_t row_bytes, void* stream);

void unpermute(int dtype, const void* expert_rows, const int32_t* position, const float* weights,
               int64_t num_tokens, int64_t k, int64_t hidden, void* out, void* stream);

void unpermute_backward(int dtype, const void* grad_out, const void* expert_rows, const int32_t* position,
                        const float* weights, int64_t num_tokens, int64_t k, int64_t hidden, void* grad_expert_rows,
                        float* grad_weights, void* stream);

// C[M, N] = A[M, K] @ B[K, N], all row-major. in_dtype: kFloat16 or kBFloat16 (A and B);
// out_dtype: kFloat32 or in_dtype. Accumulates in fp32 on tensor cores. kernel: a GemmKernel code (gemm_plan.h);
// kGemmAuto picks one for the shape and the current device, any other code forces that kernel and throws
// std::invalid_argument when it cannot run the shape.
void gemm(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, int in_dtype, int out_dtype,
          void* stream, int kernel = kGemmAuto);

// The GemmKernel code kGemmAuto runs for this shape on the current device.
int gemm_kernel_for(int64_t m, int64_t n, int64_t k);

}  // namespace cuda
}  // namespace pp
