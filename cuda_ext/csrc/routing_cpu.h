// CPU routing kernels. Pointers are raw buffers the Python wrapper allocated and validated
// (contiguous, row-major); shapes follow pipeline/model/routing.py.
#pragma once

#include <cstdint>

#include "common.h"

namespace pp {

// logits [T, E] (dtype) -> weights [T, k] f32, ids [T, k] i32, dropped [T, k] u8, counts [E] i32,
// offsets [E + 1] i32, source_index [T * k] i32 (first N used), position [T * k] i32 (grouped row or -1).
// capacity < 0 means unlimited. Returns N, the number of kept assignments.
int64_t route_forward_cpu(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k,
                          int64_t capacity, int score, float* weights, int32_t* ids, uint8_t* dropped,
                          int32_t* counts, int32_t* offsets, int32_t* source_index, int32_t* position);

// d loss / d logits [T, E] (dtype of logits) from d loss / d weights [T, k] f32.
void route_backward_cpu(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k,
                        int score, const int32_t* ids, const float* grad_weights, void* grad_logits);

// dst[p] = src[source_index[p] / k] for p < num_rows; rows of row_bytes bytes.
void permute_cpu(const void* src, void* dst, const int32_t* source_index, int64_t num_rows, int64_t k,
                 int64_t row_bytes);

// out[t] = sum_j weights[t, j] * rows[position[t, j]] over kept j; weights may be null (all ones).
void unpermute_cpu(int dtype, const void* expert_rows, const int32_t* position, const float* weights,
                   int64_t num_tokens, int64_t k, int64_t hidden, void* out);

// Gradients of unpermute: grad_rows[position[t, j]] = weights[t, j] * grad_out[t],
// grad_weights[t, j] = <grad_out[t], rows[position[t, j]]> (0 where dropped).
void unpermute_backward_cpu(int dtype, const void* grad_out, const void* expert_rows, const int32_t* position,
                            const float* weights, int64_t num_tokens, int64_t k, int64_t hidden,
                            void* grad_expert_rows, float* grad_weights);

}  // namespace pp
