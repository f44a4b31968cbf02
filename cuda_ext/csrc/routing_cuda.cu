// Fused MoE routing on CUDA: the contract of pipeline/model/routing.py (see routing_cpu.cpp for the same
// rules as sequential loops).
//
// Forward, for T tokens, E experts, k choices:
//   1. route_topk_kernel      one warp per token: scores, top-k (ties to the lower id), renormalised weights.
//   2. admission (only with a capacity): per-chunk histograms of every choice rank j, an exclusive scan down
//      each expert's column in (j, chunk) order, then one warp per chunk walks its tokens in order and marks
//      assignments whose admission rank reaches the capacity as dropped.
//   3. grouping: per-chunk histograms of kept assignments, a scan per expert over chunks (giving the expert
//      counts), the offsets scan, then one warp per chunk writes each kept assignment's grouped position.
// Inside a chunk a warp takes 32 tokens at a time; a per-expert bitmask in shared memory gives each lane the
// number of lower lanes (earlier tokens) going to the same expert, so ranks stay in token order (stable)
// without sorting and without any atomics on global memory. The results are deterministic.
#include <climits>

#include "cuda_api.h"
#include "cuda_common.cuh"

namespace pp {
namespace cuda {
namespace {

// Warps per block for kernels keeping `words_per_warp` 4-byte words of shared memory per warp: at most four,
// and at most 32 KiB per block so every supported expert count fits the default 48 KiB limit.
int warps_for(int64_t words_per_warp) {
  const int64_t fit = 8192 / (words_per_warp > 0 ? words_per_warp : 1);
  return static_cast<int>(fit >= 4 ? 4 : (fit < 1 ? 1 : fit));
}

// Router scores of one token row into s[0, E), computed by one warp (lane-strided).
template <typename T>
__device__ void warp_row_scores(const T* row, int num_experts, int score, float* s, int lane) {
  float max_logit = -kFloatMax;
  for (int e = lane; e < num_experts; e += 32) {
    const float x = sanitize_logit(to_float(row[e]));
    s[e] = x;
    max_logit = fmaxf(max_logit, x);
  }
  if (score == kSoftmax) {
    max_logit = warp_max(max_logit);
    float sum = 0.f;
    for (int e = lane; e < num_experts; e += 32) {
      const float v = expf(s[e] - max_logit);
      s[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < num_experts; e += 32) s[e] = s[e] / sum;
  } else {
    for (int e = lane; e < num_experts; e += 32) s[e] = 1.f / (1.f + expf(-s[e]));
  }
  __syncwarp();  // later steps read slots written by other lanes
}

template <typename T>
__global__ void route_topk_kernel(const T* logits, int64_t num_tokens, int num_experts, int k, int score,
                                  float* weights, int32_t* ids) {
  extern __shared__ float topk_smem[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (t >= num_tokens) return;  // whole warps exit together; no block-wide barrier follows
  float* s = topk_smem + static_cast<int64_t>(warp) * num_experts;
  warp_row_scores(logits + t * num_experts, num_experts, score, s, lane);

  float total = 0.f;
  for (int j = 0; j < k; ++j) {
    // Each lane's best untaken expert among e = lane, lane + 32, ...; scores are >= 0 and taken slots hold
    // -1, so a taken slot never beats an untaken one (k <= E leaves at least one untaken).
    float best = -2.f;
    int best_id = INT_MAX;
    for (int e = lane; e < num_experts; e += 32) {
      const float v = s[e];
      if (ranks_before(v, e, best, best_id)) {
        best = v;
        best_id = e;
      }
    }
    // Butterfly argmax: the order is total, so every lane ends with the same winner.
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other = __shfl_xor_sync(kFullMask, best, offset);
      const int other_id = __shfl_xor_sync(kFullMask, best_id, offset);
      if (ranks_before(other, other_id, best, best_id)) {
        best = other;
        best_id = other_id;
      }
    }
    if (lane == (best_id & 31)) s[best_id] = -1.f;  // only the owning lane reads this slot again
    total += best;
    if (lane == 0) {
      ids[t * k + j] = best_id;
      weights[t * k + j] = best;
    }
  }
  if (lane == 0) {
    const float denom = fmaxf(total, kFloatTiny);  // the reference's clamp_min(tiny)
    for (int j = 0; j < k; ++j) weights[t * k + j] /= denom;
  }
}

// The chunk of tokens [begin, end) one warp walks (a block holds several warps, one chunk each), and the
// warp's slice of the block's dynamic shared memory (`words` 4-byte words per warp).
struct WarpChunk {
  int lane;
  int64_t index, begin, end;
  int32_t* smem;
};

__device__ __forceinline__ WarpChunk warp_chunk(int64_t num_tokens, int chunk, int32_t* block_smem, int64_t words) {
  const int warp = threadIdx.x / 32;
  WarpChunk w;
  w.lane = threadIdx.x % 32;
  w.index = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
  w.begin = w.index * chunk;
  w.end = min(num_tokens, w.begin + chunk);
  w.smem = block_smem + warp * words;
  return w;
}

// Per-chunk expert histograms, one warp per chunk of `chunk` tokens.
//   per_choice: hist[(j * chunks + c) * E + e] = tokens of chunk c whose choice j is e (admission order);
//   otherwise:  hist[c * E + e] = kept assignments of chunk c to e (dropped may be null: none dropped).
__global__ void chunk_histogram_kernel(const int32_t* ids, const uint8_t* dropped, int64_t num_tokens,
                                       int num_experts, int k, int chunk, int64_t chunks, bool per_choice,
                                       int32_t* hist) {
  extern __shared__ int32_t hist_smem[];
  const WarpChunk w = warp_chunk(num_tokens, chunk, hist_smem, num_experts);
  if (w.index >= chunks) return;
  const int lane = w.lane;
  const int64_t c = w.index, t0 = w.begin, t1 = w.end;
  int32_t* count = w.smem;
  const int rounds = per_choice ? k : 1;
  for (int r = 0; r < rounds; ++r) {
    for (int e = lane; e < num_experts; e += 32) count[e] = 0;
    __syncwarp();
    if (per_choice) {
      for (int64_t t = t0 + lane; t < t1; t += 32) atomicAdd(&count[ids[t * k + r]], 1);
    } else {
      for (int64_t a = t0 * k + lane; a < t1 * k; a += 32) {
        if (dropped == nullptr || !dropped[a]) atomicAdd(&count[ids[a]], 1);
      }
    }
    __syncwarp();
    int32_t* out = hist + (static_cast<int64_t>(r) * chunks + c) * num_experts;
    for (int e = lane; e < num_experts; e += 32) out[e] = count[e];
    __syncwarp();  // the next round clears count
  }
}

// Inclusive scan of one value per thread across the block (blockDim.x a multiple of 32, at most 1024);
// *tile_total receives the block's sum. warp_sums: 32 ints of shared memory.
__device__ int32_t block_inclusive_scan(int32_t x, int32_t* warp_sums, int32_t* tile_total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int32_t y = __shfl_up_sync(kFullMask, x, offset);
    if (lane >= offset) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int32_t w = lane < warps ? warp_sums[lane] : 0;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int32_t y = __shfl_up_sync(kFullMask, w, offset);
      if (lane >= offset) w += y;
    }
    if (lane < warps) warp_sums[lane] = w;
  }
  __syncthreads();
  const int32_t result = x + (warp > 0 ? warp_sums[warp - 1] : 0);
  *tile_total = warp_sums[warps - 1];
  __syncthreads();  // warp_sums is reused by the next call
  return result;
}

constexpr int kScanThreads = 1024;

// In-place exclusive scan down each column of a row-major [rows, cols] matrix, one block per column;
// totals[col] (if given) receives the column sum.
__global__ void scan_columns_kernel(int32_t* data, int64_t rows, int cols, int32_t* totals) {
  __shared__ int32_t warp_sums[32];
  const int col = blockIdx.x;
  int32_t carry = 0;
  for (int64_t base = 0; base < rows; base += blockDim.x) {
    const int64_t r = base + threadIdx.x;
    const int32_t x = r < rows ? data[r * cols + col] : 0;
    int32_t tile_total;
    const int32_t inclusive = block_inclusive_scan(x, warp_sums, &tile_total);
    if (r < rows) data[r * cols + col] = carry + inclusive - x;
    carry += tile_total;
  }
  if (totals != nullptr && threadIdx.x == 0) totals[col] = carry;
}

// offsets[e] = sum of counts before e, offsets[E] = N. One block.
__global__ void offsets_kernel(const int32_t* counts, int num_experts, int32_t* offsets) {
  __shared__ int32_t warp_sums[32];
  int32_t carry = 0;
  for (int base = 0; base < num_experts; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const int32_t x = e < num_experts ? counts[e] : 0;
    int32_t tile_total;
    const int32_t inclusive = block_inclusive_scan(x, warp_sums, &tile_total);
    if (e < num_experts) offsets[e] = carry + inclusive - x;
    carry += tile_total;
  }
  if (threadIdx.x == 0) offsets[num_experts] = carry;
}

// Capacity: one warp per chunk. For choice j, an assignment's admission rank is the count of earlier
// assignments to its expert in (j, t) order: the scanned histogram gives everything before this chunk,
// the cursor plus the lower-lane bitmask gives the rest.
__global__ void admission_kernel(const int32_t* ids, const int32_t* base, int64_t num_tokens, int num_experts,
                                 int k, int chunk, int64_t chunks, int64_t capacity, uint8_t* dropped) {
  extern __shared__ int32_t admit_smem[];
  const WarpChunk w = warp_chunk(num_tokens, chunk, admit_smem, 2 * int64_t{num_experts});
  if (w.index >= chunks) return;
  const int lane = w.lane;
  const int64_t c = w.index, t0 = w.begin, t1 = w.end;
  int32_t* cursor = w.smem;  // per expert: the next rank (admission) or grouped row (grouping)
  unsigned* lanes_of = reinterpret_cast<unsigned*>(cursor + num_experts);  // per expert: lanes of this slice
  const unsigned lower_lanes = (1u << lane) - 1u;
  for (int e = lane; e < num_experts; e += 32) lanes_of[e] = 0u;
  for (int j = 0; j < k; ++j) {
    const int32_t* before = base + (static_cast<int64_t>(j) * chunks + c) * num_experts;
    for (int e = lane; e < num_experts; e += 32) cursor[e] = before[e];
    __syncwarp();
    for (int64_t s = t0; s < t1; s += 32) {  // same trip count on every lane
      const int64_t t = s + lane;
      const bool valid = t < t1;
      const int e = valid ? ids[t * k + j] : 0;
      if (valid) atomicOr(&lanes_of[e], 1u << lane);
      __syncwarp();
      const unsigned same = valid ? lanes_of[e] : 0u;
      if (valid) dropped[t * k + j] = (cursor[e] + __popc(same & lower_lanes)) >= capacity;
      __syncwarp();
      if (valid && (same & lower_lanes) == 0u) {  // the lowest lane of each expert advances its cursor
        cursor[e] += __popc(same);
        lanes_of[e] = 0u;
      }
      __syncwarp();
    }
  }
}

// Grouped positions: one warp per chunk. Inside an expert, kept assignments go in token order, and a
// token sends at most one assignment to an expert, so a kept (t, j) lands at
// offsets[e] + kept tokens of earlier chunks (scanned histogram) + earlier tokens of this chunk.
__global__ void group_kernel(const int32_t* ids, const uint8_t* dropped, const int32_t* base,
                             const int32_t* offsets, int64_t num_tokens, int num_experts, int k, int chunk,
                             int64_t chunks, int32_t* source_index, int32_t* position) {
  extern __shared__ int32_t group_smem[];
  const WarpChunk w = warp_chunk(num_tokens, chunk, group_smem, 2 * int64_t{num_experts});
  if (w.index >= chunks) return;
  const int lane = w.lane;
  const int64_t c = w.index, t0 = w.begin, t1 = w.end;
  int32_t* cursor = w.smem;  // per expert: the next rank (admission) or grouped row (grouping)
  unsigned* lanes_of = reinterpret_cast<unsigned*>(cursor + num_experts);  // per expert: lanes of this slice
  const unsigned lower_lanes = (1u << lane) - 1u;
  for (int e = lane; e < num_experts; e += 32) {
    cursor[e] = offsets[e] + base[c * num_experts + e];
    lanes_of[e] = 0u;
  }
  __syncwarp();
  for (int64_t s = t0; s < t1; s += 32) {  // same trip count on every lane
    const int64_t t = s + lane;
    const bool valid = t < t1;
    // A lane's k experts are distinct, so it sets k different bits, and reads each expert's mask once.
    for (int j = 0; j < k; ++j) {
      if (valid && !dropped[t * k + j]) atomicOr(&lanes_of[ids[t * k + j]], 1u << lane);
    }
    __syncwarp();
    for (int j = 0; j < k; ++j) {
      if (!valid) continue;
      const int64_t a = t * k + j;
      if (dropped[a]) {
        position[a] = -1;
        continue;
      }
      const int e = ids[a];
      const int32_t p = cursor[e] + __popc(lanes_of[e] & lower_lanes);
      source_index[p] = static_cast<int32_t>(a);
      position[a] = p;
    }
    __syncwarp();
    for (int j = 0; j < k; ++j) {
      if (!valid || dropped[t * k + j]) continue;
      const int e = ids[t * k + j];
      const unsigned same = lanes_of[e];
      if ((same & lower_lanes) == 0u) cursor[e] += __popc(same);
    }
    __syncwarp();  // every lane has read the masks before they are cleared
    for (int j = 0; j < k; ++j) {
      if (valid && !dropped[t * k + j]) lanes_of[ids[t * k + j]] = 0u;
    }
    __syncwarp();
  }
}

template <typename T>
__global__ void route_backward_kernel(const T* logits, int64_t num_tokens, int num_experts, int k, int score,
                                      const int32_t* ids, const float* grad_weights, T* grad_logits) {
  extern __shared__ float backward_smem[];
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (t >= num_tokens) return;
  float* s = backward_smem + static_cast<int64_t>(warp) * 2 * num_experts;
  float* grad_s = s + num_experts;
  const T* row = logits + t * num_experts;
  warp_row_scores(row, num_experts, score, s, lane);  // recomputed: cheaper than saving [T, E] scores
  const int32_t* row_ids = ids + t * k;
  const float* g = grad_weights + t * k;

  float total = 0.f;  // same order as the forward, so the same value
  for (int j = 0; j < k; ++j) total += s[row_ids[j]];
  for (int e = lane; e < num_experts; e += 32) grad_s[e] = 0.f;
  __syncwarp();
  // weights = top / clamp_min(total, tiny); the clamp passes no gradient when active.
  const bool clamped = !(total >= kFloatTiny);
  float g_dot_w = 0.f;
  if (!clamped) {
    for (int j = 0; j < k; ++j) g_dot_w += g[j] * (s[row_ids[j]] / total);
  }
  for (int j = lane; j < k; j += 32) {
    grad_s[row_ids[j]] = clamped ? g[j] / kFloatTiny : (g[j] - g_dot_w) / total;
  }
  __syncwarp();
  float inner = 0.f;  // softmax backward: sum_e p_e dL/dp_e, nonzero only at the chosen experts
  for (int j = 0; j < k; ++j) inner += s[row_ids[j]] * grad_s[row_ids[j]];
  T* out = grad_logits + t * num_experts;
  for (int e = lane; e < num_experts; e += 32) {
    const float p = s[e];
    float grad = score == kSoftmax ? p * (grad_s[e] - inner) : grad_s[e] * p * (1.f - p);
    if (!is_finite_logit(to_float(row[e]))) grad = 0.f;  // nan_to_num passes no gradient there
    out[e] = from_float<T>(grad);
  }
}

constexpr int kRowWarps = 8;  // warps per block in the row kernels (one warp per row)

template <typename U>
__global__ void permute_kernel(const U* src, U* dst, const int32_t* source_index, int64_t num_rows, int k,
                               int64_t units_per_row) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp;
  if (p >= num_rows) return;
  const U* in = src + static_cast<int64_t>(source_index[p] / k) * units_per_row;
  U* out = dst + p * units_per_row;
  for (int64_t u = lane; u < units_per_row; u += 32) out[u] = in[u];
}

// VEC elements moved as one aligned vector (16 bytes when the row length allows, else one element).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

template <typename T, int VEC>
__global__ void unpermute_kernel(const T* rows, const int32_t* position, const float* weights,
                                 int64_t num_tokens, int k, int64_t hidden, T* out) {
  using A = Accum<T>;
  using Acc = typename A::type;
  using P = Pack<T, VEC>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp;
  if (t >= num_tokens) return;
  const int64_t packs = hidden / VEC;
  for (int64_t c = lane; c < packs; c += 32) {
    Acc acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = Acc(0);
    for (int j = 0; j < k; ++j) {
      const int32_t p = position[t * k + j];
      if (p < 0) continue;  // dropped: contributes nothing
      const Acc w = weights != nullptr ? Acc(weights[t * k + j]) : Acc(1);
      const P x = reinterpret_cast<const P*>(rows + static_cast<int64_t>(p) * hidden)[c];
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += w * A::load(x.v[i]);
    }
    P y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) y.v[i] = A::store(acc[i]);
    reinterpret_cast<P*>(out + t * hidden)[c] = y;
  }
}

template <typename T, int VEC>
__global__ void unpermute_backward_kernel(const T* grad_out, const T* rows, const int32_t* position,
                                          const float* weights, int64_t num_tokens, int k, int64_t hidden,
                                          T* grad_rows, float* grad_weights) {
  using A = Accum<T>;
  using Acc = typename A::type;
  using P = Pack<T, VEC>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRowWarps + warp;
  if (t >= num_tokens) return;
  const int64_t packs = hidden / VEC;
  const P* g = reinterpret_cast<const P*>(grad_out + t * hidden);
  for (int j = 0; j < k; ++j) {
    const int32_t p = position[t * k + j];  // the same on every lane: the branch is warp-uniform
    if (p < 0) {
      if (lane == 0) grad_weights[t * k + j] = 0.f;
      continue;
    }
    const Acc w = Acc(weights[t * k + j]);
    const P* x = reinterpret_cast<const P*>(rows + static_cast<int64_t>(p) * hidden);
    P* gx = reinterpret_cast<P*>(grad_rows + static_cast<int64_t>(p) * hidden);
    Acc dot = Acc(0);
    for (int64_t c = lane; c < packs; c += 32) {
      const P gv = g[c];
      const P xv = x[c];
      P out;
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        const Acc gi = A::load(gv.v[i]);
        dot += gi * A::load(xv.v[i]);
        out.v[i] = A::store(w * gi);
      }
      gx[c] = out;
    }
    dot = warp_sum(dot);
    if (lane == 0) grad_weights[t * k + j] = static_cast<float>(dot);
  }
}

template <typename Fn>
void dispatch_float(int dtype, Fn&& fn) {
  switch (dtype) {
    case kFloat32: fn(float{}); return;
    case kFloat64: fn(double{}); return;
    case kFloat16: fn(__half{}); return;
    case kBFloat16: fn(__nv_bfloat16{}); return;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(dtype));
}

void check_shapes(int64_t num_tokens, int64_t num_experts, int64_t k) {
  if (num_experts < 1 || num_experts > kMaxCudaExperts) {
    throw std::invalid_argument("CUDA routing supports 1.." + std::to_string(kMaxCudaExperts) +
                                " experts, got " + std::to_string(num_experts));
  }
  if (k < 1 || k > num_experts) throw std::invalid_argument("top_k must be in [1, num_experts]");
  if (num_tokens < 0 || num_tokens * k >= INT32_MAX) {
    throw std::invalid_argument("num_tokens * top_k must fit int32 (the index dtype)");
  }
}

// Tokens per chunk: small chunks give more warps to the sequential walks, but every chunk adds (k + 1) * E
// histogram entries to the workspace and to the column scans, so chunks grow until that stays below 4M entries.
int route_chunk(int64_t num_tokens, int64_t num_experts, int64_t k) {
  int chunk = kMinRouteChunk;
  while (chunk < kMaxRouteChunk && (k + 1) * ((num_tokens + chunk - 1) / chunk) * num_experts > (int64_t{1} << 22)) {
    chunk *= 2;
  }
  return chunk;
}

int64_t route_chunks(int64_t num_tokens, int chunk) { return (num_tokens + chunk - 1) / chunk; }

}  // namespace

size_t route_workspace_bytes(int64_t num_tokens, int64_t num_experts, int64_t k) {
  // [k * chunks, E] admission histogram, then [chunks, E] kept histogram.
  const int64_t chunks = route_chunks(num_tokens, route_chunk(num_tokens, num_experts, k));
  return static_cast<size_t>((k + 1) * chunks * num_experts) * sizeof(int32_t);
}

void route_forward(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k,
                   int64_t capacity, int score, float* weights, int32_t* ids, uint8_t* dropped, int32_t* counts,
                   int32_t* offsets, int32_t* source_index, int32_t* position, void* workspace,
                   size_t workspace_bytes, void* stream_ptr) {
  check_shapes(num_tokens, num_experts, k);
  if (workspace_bytes < route_workspace_bytes(num_tokens, num_experts, k)) {
    throw std::invalid_argument("route workspace too small");
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int E = static_cast<int>(num_experts), K = static_cast<int>(k);
  if (num_tokens == 0) {
    PP_CUDA_CHECK(cudaMemsetAsync(counts, 0, num_experts * sizeof(int32_t), stream));
    PP_CUDA_CHECK(cudaMemsetAsync(offsets, 0, (num_experts + 1) * sizeof(int32_t), stream));
    return;
  }
  const int chunk = route_chunk(num_tokens, num_experts, k);
  const int64_t chunks = route_chunks(num_tokens, chunk);
  int32_t* admission_hist = static_cast<int32_t*>(workspace);
  int32_t* kept_hist = admission_hist + k * chunks * num_experts;

  {
    const int warps = warps_for(num_experts);
    const size_t smem = static_cast<size_t>(warps) * num_experts * sizeof(float);
    dispatch_float(dtype, [&](auto tag) {
      using T = decltype(tag);
      route_topk_kernel<T><<<ceil_div(num_tokens, warps), warps * 32, smem, stream>>>(
          static_cast<const T*>(logits), num_tokens, E, K, score, weights, ids);
    });
    PP_CUDA_CHECK(cudaGetLastError());
  }

  const int hist_warps = warps_for(num_experts);
  const size_t hist_smem = static_cast<size_t>(hist_warps) * num_experts * sizeof(int32_t);
  const int walk_warps = warps_for(2 * num_experts);
  const size_t walk_smem = static_cast<size_t>(walk_warps) * 2 * num_experts * sizeof(int32_t);
  if (capacity >= 0) {
    chunk_histogram_kernel<<<ceil_div(chunks, hist_warps), hist_warps * 32, hist_smem, stream>>>(
        ids, nullptr, num_tokens, E, K, chunk, chunks, true, admission_hist);
    PP_CUDA_CHECK(cudaGetLastError());
    scan_columns_kernel<<<E, kScanThreads, 0, stream>>>(admission_hist, k * chunks, E, nullptr);
    PP_CUDA_CHECK(cudaGetLastError());
    admission_kernel<<<ceil_div(chunks, walk_warps), walk_warps * 32, walk_smem, stream>>>(
        ids, admission_hist, num_tokens, E, K, chunk, chunks, capacity, dropped);
    PP_CUDA_CHECK(cudaGetLastError());
  } else {
    PP_CUDA_CHECK(cudaMemsetAsync(dropped, 0, num_tokens * k, stream));
  }
  chunk_histogram_kernel<<<ceil_div(chunks, hist_warps), hist_warps * 32, hist_smem, stream>>>(
      ids, dropped, num_tokens, E, K, chunk, chunks, false, kept_hist);
  PP_CUDA_CHECK(cudaGetLastError());
  scan_columns_kernel<<<E, kScanThreads, 0, stream>>>(kept_hist, chunks, E, counts);
  PP_CUDA_CHECK(cudaGetLastError());
  offsets_kernel<<<1, 1024, 0, stream>>>(counts, E, offsets);
  PP_CUDA_CHECK(cudaGetLastError());
  group_kernel<<<ceil_div(chunks, walk_warps), walk_warps * 32, walk_smem, stream>>>(
      ids, dropped, kept_hist, offsets, num_tokens, E, K, chunk, chunks, source_index, position);
  PP_CUDA_CHECK(cudaGetLastError());
}

void route_backward(const void* logits, int dtype, int64_t num_tokens, int64_t num_experts, int64_t k, int score,
                    const int32_t* ids, const float* grad_weights, void* grad_logits, void* stream_ptr) {
  check_shapes(num_tokens, num_experts, k);
  if (num_tokens == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int warps = warps_for(2 * num_experts);
  const size_t smem = static_cast<size_t>(warps) * 2 * num_experts * sizeof(float);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    route_backward_kernel<T><<<ceil_div(num_tokens, warps), warps * 32, smem, stream>>>(
        static_cast<const T*>(logits), num_tokens, static_cast<int>(num_experts), static_cast<int>(k), score, ids,
        grad_weights, static_cast<T*>(grad_logits));
  });
  PP_CUDA_CHECK(cudaGetLastError());
}

void permute(const void* src, void* dst, const int32_t* source_index, int64_t num_rows, int64_t k,
             int64_t row_bytes, void* stream_ptr) {
  if (num_rows == 0 || row_bytes == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int blocks = ceil_div(num_rows, kRowWarps);
  const int K = static_cast<int>(k);
  // Widest copy unit dividing the row (buffers are 16-byte aligned, so every row is aligned to it).
  if (row_bytes % 16 == 0) {
    permute_kernel<uint4><<<blocks, kRowWarps * 32, 0, stream>>>(
        static_cast<const uint4*>(src), static_cast<uint4*>(dst), source_index, num_rows, K, row_bytes / 16);
  } else if (row_bytes % 4 == 0) {
    permute_kernel<uint32_t><<<blocks, kRowWarps * 32, 0, stream>>>(static_cast<const uint32_t*>(src),
                                                                     static_cast<uint32_t*>(dst), source_index,
                                                                     num_rows, K, row_bytes / 4);
  } else if (row_bytes % 2 == 0) {
    permute_kernel<uint16_t><<<blocks, kRowWarps * 32, 0, stream>>>(static_cast<const uint16_t*>(src),
                                                                     static_cast<uint16_t*>(dst), source_index,
                                                                     num_rows, K, row_bytes / 2);
  } else {
    permute_kernel<uint8_t><<<blocks, kRowWarps * 32, 0, stream>>>(
        static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), source_index, num_rows, K, row_bytes);
  }
  PP_CUDA_CHECK(cudaGetLastError());
}

void unpermute(int dtype, const void* expert_rows, const int32_t* position, const float* weights,
               int64_t num_tokens, int64_t k, int64_t hidden, void* out, void* stream_ptr) {
  if (num_tokens == 0 || hidden == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int blocks = ceil_div(num_tokens, kRowWarps);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if ((hidden * sizeof(T)) % 16 == 0) {
      unpermute_kernel<T, kVec><<<blocks, kRowWarps * 32, 0, stream>>>(
          static_cast<const T*>(expert_rows), position, weights, num_tokens, static_cast<int>(k), hidden,
          static_cast<T*>(out));
    } else {
      unpermute_kernel<T, 1><<<blocks, kRowWarps * 32, 0, stream>>>(static_cast<const T*>(expert_rows), position,
                                                                     weights, num_tokens, static_cast<int>(k),
                                                                     hidden, static_cast<T*>(out));
    }
  });
  PP_CUDA_CHECK(cudaGetLastError());
}

void unpermute_backward(int dtype, const void* grad_out, const void* expert_rows, const int32_t* position,
                        const float* weights, int64_t num_tokens, int64_t k, int64_t hidden, void* grad_expert_rows,
                        float* grad_weights, void* stream_ptr) {
  if (num_tokens == 0) return;
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int blocks = ceil_div(num_tokens, kRowWarps);
  dispatch_float(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    if ((hidden * sizeof(T)) % 16 == 0) {
      unpermute_backward_kernel<T, kVec><<<blocks, kRowWarps * 32, 0, stream>>>(
          static_cast<const T*>(grad_out), static_cast<const T*>(expert_rows), position, weights, num_tokens,
          static_cast<int>(k), hidden, static_cast<T*>(grad_expert_rows), grad_weights);
    } else {
      unpermute_backward_kernel<T, 1><<<blocks, kRowWarps * 32, 0, stream>>>(
          static_cast<const T*>(grad_out), static_cast<const T*>(expert_rows), position, weights, num_tokens,
          static_cast<int>(k), hidden, static_cast<T*>(grad_expert_rows), grad_weights);
    }
  });
  PP_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cuda
}  // namespace pp
