// pybind11 module cuda_ext._C. Every function takes raw buffer addresses (tensor.data_ptr()), shapes, dtype
// codes and, for CUDA, the stream handle, so the extension never links libtorch: the Python wrapper
// (cuda_ext/kernels.py) allocates the tensors, validates them and passes their addresses.
#include <pybind11/pybind11.h>

#include <cstdint>

#include "common.h"
#include "gemm_plan.h"
#include "routing_cpu.h"
#ifdef PRETRAIN_WITH_CUDA
#include "cuda_api.h"
#endif

namespace py = pybind11;

namespace {

template <typename T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

void* stream_of(uintptr_t handle) { return reinterpret_cast<void*>(handle); }

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "cuda_ext kernels: MoE routing (CPU and CUDA) and a WMMA GEMM (CUDA), on raw buffer addresses";
  using pybind11::arg;
  const auto release = py::call_guard<py::gil_scoped_release>();

  m.attr("MAX_CUDA_EXPERTS") = pp::kMaxCudaExperts;
  // The GEMM kernel table and choice (gemm_plan.h), in every build so the CPU tests can check them.
  py::list gemm_kernels;
  for (const pp::GemmKernelInfo& info : pp::kGemmKernels) gemm_kernels.append(info.name);
  m.attr("GEMM_KERNELS") = gemm_kernels;
  m.def("gemm_kernel_supports", &pp::gemm_kernel_supports, arg("kernel"), arg("n"), arg("k"), arg("smem_optin"),
        "Whether a GEMM kernel (code) can run [., K] @ [K, N] with this much opt-in shared memory per block.");
  m.def("choose_gemm_kernel", &pp::choose_gemm_kernel, arg("m"), arg("n"), arg("k"), arg("sm_count"),
        arg("smem_optin"), "The GEMM kernel code `auto` runs for a shape on a device with these limits.");
#ifdef PRETRAIN_WITH_CUDA
  m.attr("WITH_CUDA") = true;
#else
  m.attr("WITH_CUDA") = false;
#endif

  m.def(
      "route_forward_cpu",
      [](uintptr_t logits, int dtype, int64_t tokens, int64_t experts, int64_t k, int64_t capacity, int score,
         uintptr_t weights, uintptr_t ids, uintptr_t dropped, uintptr_t counts, uintptr_t offsets,
         uintptr_t source_index, uintptr_t position) {
        return pp::route_forward_cpu(ptr<const void>(logits), dtype, tokens, experts, k, capacity, score,
                                     ptr<float>(weights), ptr<int32_t>(ids), ptr<uint8_t>(dropped),
                                     ptr<int32_t>(counts), ptr<int32_t>(offsets), ptr<int32_t>(source_index),
                                     ptr<int32_t>(position));
      },
      "Routing forward on CPU buffers; returns N, the number of kept assignments.", release);
  m.def(
      "route_backward_cpu",
      [](uintptr_t logits, int dtype, int64_t tokens, int64_t experts, int64_t k, int score, uintptr_t ids,
         uintptr_t grad_weights, uintptr_t grad_logits) {
        pp::route_backward_cpu(ptr<const void>(logits), dtype, tokens, experts, k, score, ptr<const int32_t>(ids),
                               ptr<const float>(grad_weights), ptr<void>(grad_logits));
      },
      release);
  m.def(
      "permute_cpu",
      [](uintptr_t src, uintptr_t dst, uintptr_t source_index, int64_t rows, int64_t k, int64_t row_bytes) {
        pp::permute_cpu(ptr<const void>(src), ptr<void>(dst), ptr<const int32_t>(source_index), rows, k, row_bytes);
      },
      release);
  m.def(
      "unpermute_cpu",
      [](int dtype, uintptr_t rows, uintptr_t position, uintptr_t weights, int64_t tokens, int64_t k,
         int64_t hidden, uintptr_t out) {
        pp::unpermute_cpu(dtype, ptr<const void>(rows), ptr<const int32_t>(position), ptr<const float>(weights),
                          tokens, k, hidden, ptr<void>(out));
      },
      "weights may be 0 (all ones).", release);
  m.def(
      "unpermute_backward_cpu",
      [](int dtype, uintptr_t grad_out, uintptr_t rows, uintptr_t position, uintptr_t weights, int64_t tokens,
         int64_t k, int64_t hidden, uintptr_t grad_rows, uintptr_t grad_weights) {
        pp::unpermute_backward_cpu(dtype, ptr<const void>(grad_out), ptr<const void>(rows),
                                   ptr<const int32_t>(position), ptr<const float>(weights), tokens, k, hidden,
                                   ptr<void>(grad_rows), ptr<float>(grad_weights));
      },
      release);

#ifdef PRETRAIN_WITH_CUDA
  m.def("route_workspace_bytes", &pp::cuda::route_workspace_bytes, arg("tokens"), arg("experts"), arg("k"));
  m.def(
      "route_forward_cuda",
      [](uintptr_t logits, int dtype, int64_t tokens, int64_t experts, int64_t k, int64_t capacity, int score,
         uintptr_t weights, uintptr_t ids, uintptr_t dropped, uintptr_t counts, uintptr_t offsets,
         uintptr_t source_index, uintptr_t position, uintptr_t workspace, size_t workspace_bytes, uintptr_t stream) {
        pp::cuda::route_forward(ptr<const void>(logits), dtype, tokens, experts, k, capacity, score,
                                ptr<float>(weights), ptr<int32_t>(ids), ptr<uint8_t>(dropped), ptr<int32_t>(counts),
                                ptr<int32_t>(offsets), ptr<int32_t>(source_index), ptr<int32_t>(position),
                                ptr<void>(workspace), workspace_bytes, stream_of(stream));
      },
      release);
  m.def(
      "route_backward_cuda",
      [](uintptr_t logits, int dtype, int64_t tokens, int64_t experts, int64_t k, int score, uintptr_t ids,
         uintptr_t grad_weights, uintptr_t grad_logits, uintptr_t stream) {
        pp::cuda::route_backward(ptr<const void>(logits), dtype, tokens, experts, k, score, ptr<const int32_t>(ids),
                                 ptr<const float>(grad_weights), ptr<void>(grad_logits), stream_of(stream));
      },
      release);
  m.def(
      "permute_cuda",
      [](uintptr_t src, uintptr_t dst, uintptr_t source_index, int64_t rows, int64_t k, int64_t row_bytes,
         uintptr_t stream) {
        pp::cuda::permute(ptr<const void>(src), ptr<void>(dst), ptr<const int32_t>(source_index), rows, k, row_bytes,
                          stream_of(stream));
      },
      release);
  m.def(
      "unpermute_cuda",
      [](int dtype, uintptr_t rows, uintptr_t position, uintptr_t weights, int64_t tokens, int64_t k,
         int64_t hidden, uintptr_t out, uintptr_t stream) {
        pp::cuda::unpermute(dtype, ptr<const void>(rows), ptr<const int32_t>(position), ptr<const float>(weights),
                            tokens, k, hidden, ptr<void>(out), stream_of(stream));
      },
      release);
  m.def(
      "unpermute_backward_cuda",
      [](int dtype, uintptr_t grad_out, uintptr_t rows, uintptr_t position, uintptr_t weights, int64_t tokens,
         int64_t k, int64_t hidden, uintptr_t grad_rows, uintptr_t grad_weights, uintptr_t stream) {
        pp::cuda::unpermute_backward(dtype, ptr<const void>(grad_out), ptr<const void>(rows),
                                     ptr<const int32_t>(position), ptr<const float>(weights), tokens, k, hidden,
                                     ptr<void>(grad_rows), ptr<float>(grad_weights), stream_of(stream));
      },
      release);
  m.def(
      "gemm_cuda",
      [](uintptr_t a, uintptr_t b, uintptr_t c, int64_t m_rows, int64_t n_cols, int64_t k_depth, int in_dtype,
         int out_dtype, uintptr_t stream, int kernel) {
        pp::cuda::gemm(ptr<const void>(a), ptr<const void>(b), ptr<void>(c), m_rows, n_cols, k_depth, in_dtype,
                       out_dtype, stream_of(stream), kernel);
      },
      "C[M, N] = A[M, K] @ B[K, N] (row-major) on tensor cores; kernel -1 picks one for the shape.", arg("a"),
      arg("b"), arg("c"), arg("m"), arg("n"), arg("k"), arg("in_dtype"), arg("out_dtype"), arg("stream"),
      arg("kernel") = static_cast<int>(pp::kGemmAuto), release);
  m.def("gemm_cuda_kernel_for", &pp::cuda::gemm_kernel_for, arg("m"), arg("n"), arg("k"),
        "The GEMM kernel code `auto` runs for this shape on the current CUDA device.", release);
#endif
}
