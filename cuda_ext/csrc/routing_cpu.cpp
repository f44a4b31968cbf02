// CPU routing kernels: the contract of pipeline/model/routing.py written as plain loops.
// The CUDA kernels (routing_cuda.cu) compute the same results with a parallel decomposition.
#include "routing_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_dtype.h"

namespace pp {
namespace {

// Calls fn(T{}) with T the element type of a dtype code.
template <typename Fn>
void dispatch_float(int dtype, Fn&& fn) {
  switch (dtype) {
    case kFloat32: fn(float{}); return;
    case kFloat64: fn(double{}); return;
    case kFloat16: fn(Float16{}); return;
    case kBFloat16: fn(BFloat16{}); return;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
}

template <typename T>
inline T store_as(double x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return from_float<T>(static_cast<float>(x));
  }
}

template <typename T>
inline double load_as_double(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return to_float(x);
  }
}

// Router scores of one row, in float32 like the reference: sanitize, then softmax or sigmoid.
template <typename T>
void row_scores(const T* row, int64_t num_experts, int score, float* out) {
  float max_logit = -kFloatMax;
  for (int64_t e = 0; e < num_experts; ++e) {
    out[e] = sanitize_logit(to_float(row[e]));
    max_logit = std::max(max_logit, out[e]);
  }
  if (score == kSoftmax) {
    float sum = 0.f;
    for (int64_t e = 0; e < num_experts; ++e) {
      out[e] = std::exp(out[e] - max_logit);
      sum += out[e];
    }
    for (int64_t e = 0; e < num_experts; ++e) out[e] /= sum;
  } else {
    for (int64_t e = 0; e < num_experts; ++e) out[e] = 1.f / (1.f + std::exp(-out[e]));
  }
}

// The k best experts of a row of scores, best first; sum of their scores.
float row_top_k(const float* scores, int64_t num_experts, int64_t k, int32_t* ids, float* top, std::vector<char>& taken) {
  std::fill(taken.begin(), taken.end(), 0);
  float total = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    int best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (!taken[e] && (best < 0 || ranks_before(scores[e], static_cast<int>(e), scores[best], best))) {
        best = static_cast<int>(e);
      }
    }
    taken[best] = 1;
    ids[j] = best;
    top[j] = scores[best];
    total += scores[best];
  }
  return total;
}

}  // namespace

int64_t route_forward_cpu(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k,
                          int64_t capacity, int score, float* weights, int32_t* ids, uint8_t* dropped,
                          int32_t* counts, int32_t* offsets, int32_t* source_index, int32_t* position) {
  std::vector<float> scores(num_experts);
  std::vector<char> taken(num_experts);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* rows = static_cast<const T*>(logits);
    for (int64_t t = 0; t < num_tokens; ++t) {
      row_scores(rows + t * num_experts, num_experts, score, scores.data());
      float* w = weights + t * k;
      const float total = row_top_k(scores.data(), num_experts, k, ids + t * k, w, taken);
      const float denom = std::max(total, kFloatTiny);
      for (int64_t j = 0; j < k; ++j) w[j] /= denom;
    }
  });

  // Admission in (choice rank j, token t) order; an assignment past the capacity is dropped.
  std::vector<int64_t> load(num_experts, 0);
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      const int32_t e = ids[t * k + j];
      const bool drop = capacity >= 0 && load[e] >= capacity;
      dropped[t * k + j] = drop;
      if (!drop) ++load[e];
    }
  }
  offsets[0] = 0;
  for (int64_t e = 0; e < num_experts; ++e) {
    counts[e] = static_cast<int32_t>(load[e]);
    offsets[e + 1] = offsets[e] + counts[e];
  }

  // Group kept assignments by expert, in token order inside an expert (a counting sort, stable).
  std::vector<int64_t> cursor(offsets, offsets + num_experts);
  for (int64_t a = 0; a < num_tokens * k; ++a) {
    if (dropped[a]) {
      position[a] = -1;
      continue;
    }
    const int64_t p = cursor[ids[a]]++;
    source_index[p] = static_cast<int32_t>(a);
    position[a] = static_cast<int32_t>(p);
  }
  return offsets[num_experts];
}

void route_backward_cpu(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k,
                        int score, const int32_t* ids, const float* grad_weights, void* grad_logits) {
  std::vector<float> scores(num_experts);
  std::vector<float> grad_scores(num_experts);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* rows = static_cast<const T*>(logits);
    T* grad_rows = static_cast<T*>(grad_logits);
    for (int64_t t = 0; t < num_tokens; ++t) {
      const T* row = rows + t * num_experts;
      row_scores(row, num_experts, score, scores.data());
      const int32_t* row_ids = ids + t * k;
      const float* g = grad_weights + t * k;
      float total = 0.f;
      for (int64_t j = 0; j < k; ++j) total += scores[row_ids[j]];
      // weights = top / clamp_min(total, tiny): the clamp passes no gradient when it is active.
      std::fill(grad_scores.begin(), grad_scores.end(), 0.f);
      if (total >= kFloatTiny) {
        float g_dot_w = 0.f;
        for (int64_t j = 0; j < k; ++j) g_dot_w += g[j] * (scores[row_ids[j]] / total);
        for (int64_t j = 0; j < k; ++j) grad_scores[row_ids[j]] = (g[j] - g_dot_w) / total;
      } else {
        for (int64_t j = 0; j < k; ++j) grad_scores[row_ids[j]] = g[j] / kFloatTiny;
      }
      float inner = 0.f;  // softmax: sum_e p_e * dL/dp_e, nonzero only at the chosen experts
      for (int64_t j = 0; j < k; ++j) inner += scores[row_ids[j]] * grad_scores[row_ids[j]];
      T* out = grad_rows + t * num_experts;
      for (int64_t e = 0; e < num_experts; ++e) {
        const float p = scores[e];
        float grad = score == kSoftmax ? p * (grad_scores[e] - inner) : grad_scores[e] * p * (1.f - p);
        if (!is_finite_logit(to_float(row[e]))) grad = 0.f;  // nan_to_num passes no gradient there
        out[e] = store_as<T>(grad);
      }
    }
  });
}

void permute_cpu(const void* src, void* dst, const int32_t* source_index, int64_t num_rows, int64_t k,
                 int64_t row_bytes) {
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(dst);
  for (int64_t p = 0; p < num_rows; ++p) {
    std::memcpy(out + p * row_bytes, in + (source_index[p] / k) * row_bytes, row_bytes);
  }
}

void unpermute_cpu(int dtype, const void* expert_rows, const int32_t* position, const float* weights,
                   int64_t num_tokens, int64_t k, int64_t hidden, void* out) {
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* y = static_cast<const T*>(expert_rows);
    T* o = static_cast<T*>(out);
    std::vector<double> acc(hidden);
    for (int64_t t = 0; t < num_tokens; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = position[t * k + j];
        if (p < 0) continue;  // dropped: contributes nothing
        const double w = weights ? weights[t * k + j] : 1.0;
        const T* row = y + static_cast<int64_t>(p) * hidden;
        for (int64_t h = 0; h < hidden; ++h) acc[h] += w * load_as_double(row[h]);
      }
      for (int64_t h = 0; h < hidden; ++h) o[t * hidden + h] = store_as<T>(acc[h]);
    }
  });
}

void unpermute_backward_cpu(int dtype, const void* grad_out, const void* expert_rows, const int32_t* position,
                            const float* weights, int64_t num_tokens, int64_t k, int64_t hidden,
                            void* grad_expert_rows, float* grad_weights) {
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(grad_out);
    const T* y = static_cast<const T*>(expert_rows);
    T* gy = static_cast<T*>(grad_expert_rows);
    for (int64_t t = 0; t < num_tokens; ++t) {
      const T* g_row = g + t * hidden;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t p = position[t * k + j];
        if (p < 0) {
          grad_weights[t * k + j] = 0.f;
          continue;
        }
        const double w = weights[t * k + j];
        const T* y_row = y + static_cast<int64_t>(p) * hidden;
        T* gy_row = gy + static_cast<int64_t>(p) * hidden;
        double dot = 0.0;
        for (int64_t h = 0; h < hidden; ++h) {
          const double gh = load_as_double(g_row[h]);
          dot += gh * load_as_double(y_row[h]);
          gy_row[h] = store_as<T>(w * gh);
        }
        grad_weights[t * k + j] = static_cast<float>(dot);
      }
    }
  });
}

}  // namespace pp
