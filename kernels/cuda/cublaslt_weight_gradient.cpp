// cuBLASLt's weight-gradient GEMM with the bias gradient in its epilogue (the header says why).
//
// In cuBLASLt's column-major terms, with N rows, `in` inputs and `out` outputs: D (in x out) =
// A (in x N) B^T, where A is the rows [N, in] read as they lie (in x N, ld in) and B is dy
// [N, out] read as it lies (out x N, ld out) and transposed. D column-major (in x out, ld in) is
// dW [out, in] row-major. BGRADB sums op(B) (N x out) over the GEMM's k = N: db[o] = sum_r
// dy[r, o], stored in D's type. The algorithm for each shape is asked of cuBLASLt's heuristic once
// and kept; a call then costs descriptor set-up and one launch, which a CUDA graph captures.
#include "cuda/cublaslt_weight_gradient.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace strata::kernels {
namespace {

// The cuBLASLt functions called here, found in the loaded library.
struct CublasLt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

// nullptr where the library, or one of the functions, is missing. libtorch_cuda has loaded the
// library already wherever a CUDA tensor exists; RTLD_NOLOAD finds that copy.
const CublasLt* cublaslt() {
  static const CublasLt* api = []() -> const CublasLt* {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib) lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    static CublasLt found;
    bool complete = true;
    const auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      complete = complete && fn != nullptr;
    };
    find(found.create, "cublasLtCreate");
    find(found.desc_create, "cublasLtMatmulDescCreate");
    find(found.desc_destroy, "cublasLtMatmulDescDestroy");
    find(found.desc_set, "cublasLtMatmulDescSetAttribute");
    find(found.layout_create, "cublasLtMatrixLayoutCreate");
    find(found.layout_destroy, "cublasLtMatrixLayoutDestroy");
    find(found.preference_create, "cublasLtMatmulPreferenceCreate");
    find(found.preference_destroy, "cublasLtMatmulPreferenceDestroy");
    find(found.preference_set, "cublasLtMatmulPreferenceSetAttribute");
    find(found.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    find(found.matmul, "cublasLtMatmul");
    return complete ? &found : nullptr;
  }();
  return api;
}

// One handle per thread (the autograd engine runs a GPU's backward on its own thread), kept for
// the thread's life as ATen keeps its own.
cublasLtHandle_t thread_handle(const CublasLt& lt) {
  thread_local cublasLtHandle_t handle = nullptr;
  if (!handle && lt.create(&handle) != CUBLAS_STATUS_SUCCESS) handle = nullptr;
  return handle;
}

// The descriptors of one call, destroyed with it.
struct Descriptors {
  const CublasLt& lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  explicit Descriptors(const CublasLt& api) : lt(api) {}
  ~Descriptors() {
    if (preference) lt.preference_destroy(preference);
    for (cublasLtMatrixLayout_t layout : {a, b, d})
      if (layout) lt.layout_destroy(layout);
    if (op) lt.desc_destroy(op);
  }
};

// cuBLASLt's heuristic assumes 256-byte aligned operands unless told otherwise; ATen's allocations
// are, and a call whose tensors are not goes to ATen.
bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 256 == 0; }

using ShapeKey = std::tuple<int, int, int64_t, int64_t, int64_t>;  // device, type, N, in, out
struct Chosen {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};
std::mutex chosen_mutex;
std::map<ShapeKey, Chosen> chosen_by_shape;

constexpr uint64_t max_workspace_bytes = 32ull << 20;

}  // namespace

bool weight_and_bias_gradient_cublaslt(const at::Tensor& rows, const at::Tensor& dy, at::Tensor& dw, at::Tensor& db) {
  const CublasLt* lt = cublaslt();
  const at::ScalarType dtype = rows.scalar_type();
  if (!lt || (dtype != at::kBFloat16 && dtype != at::kHalf) || dy.scalar_type() != dtype || !rows.is_cuda() ||
      dy.device() != rows.device() || rows.dim() != 2 || dy.dim() != 2 || rows.size(0) != dy.size(0) || !rows.is_contiguous() ||
      !dy.is_contiguous())
    return false;
  const int64_t n = rows.size(0), in = rows.size(1), out = dy.size(1);
  if (n == 0 || in == 0 || out == 0 || !aligned(rows.const_data_ptr()) || !aligned(dy.const_data_ptr())) return false;
  const c10::cuda::CUDAGuard guard(rows.device());
  cublasLtHandle_t handle = thread_handle(*lt);
  if (!handle) return false;
  at::Tensor w_grad = at::empty({out, in}, rows.options()), b_grad = at::empty({out}, rows.options());

  Descriptors desc(*lt);
  const cudaDataType_t type = dtype == at::kBFloat16 ? CUDA_R_16BF : CUDA_R_16F;
  const cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_T;
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BGRADB;
  void* bias = b_grad.mutable_data_ptr();
  const auto ok = [](cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; };
  if (!ok(lt->desc_create(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
      !ok(lt->desc_set(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa))) ||
      !ok(lt->desc_set(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb))) ||
      !ok(lt->desc_set(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue))) ||
      !ok(lt->desc_set(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias))) ||
      !ok(lt->layout_create(&desc.a, type, in, n, in)) || !ok(lt->layout_create(&desc.b, type, out, n, out)) ||
      !ok(lt->layout_create(&desc.d, type, in, out, in)))
    return false;

  const ShapeKey key{rows.get_device(), static_cast<int>(dtype), n, in, out};
  Chosen chosen;
  {
    const std::lock_guard<std::mutex> lock(chosen_mutex);
    auto it = chosen_by_shape.find(key);
    if (it == chosen_by_shape.end()) {
      cublasLtMatmulHeuristicResult_t result{};
      int count = 0;
      if (ok(lt->preference_create(&desc.preference)) &&
          ok(lt->preference_set(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace_bytes,
                                sizeof(max_workspace_bytes))) &&
          ok(lt->heuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.preference, 1, &result, &count)) && count > 0 &&
          ok(result.state))
        chosen = {true, result.algo, result.workspaceSize};
      it = chosen_by_shape.emplace(key, chosen).first;
    }
    chosen = it->second;
  }
  if (!chosen.found) return false;
  const at::Tensor workspace = at::empty({static_cast<int64_t>(chosen.workspace)}, rows.options().dtype(at::kByte));
  const float alpha = 1.0f, beta = 0.0f;
  if (!ok(lt->matmul(handle, desc.op, &alpha, rows.const_data_ptr(), desc.a, dy.const_data_ptr(), desc.b, &beta, w_grad.mutable_data_ptr(),
                     desc.d, w_grad.mutable_data_ptr(), desc.d, &chosen.algo, chosen.workspace ? workspace.mutable_data_ptr() : nullptr,
                     chosen.workspace, c10::cuda::getCurrentCUDAStream().stream())))
    return false;
  dw = std::move(w_grad);
  db = std::move(b_grad);
  return true;
}

}  // namespace strata::kernels
