// ffn1 + GELU and its gradient in cuBLASLt GEMM epilogues (kernels/ffn/epilogue.py builds and calls this).
//
// Row-major torch tensors are column-major matrices transposed, so Y[M, N] = X[M, K] W[N, K]^T is,
// column-major, Y^T (N x M) = W (N x K, stored as K x N: op T) * X^T (K x M, stored as is: op N),
// and a bias of N features is a vector over the rows of D, as cuBLASLt lays its bias and its aux.
//
// linear_gelu_aux(x [M, K], w [N, K], b [N]) -> (a, h), both [M, N]:
//   h = x w^T + b (the GELU's input, the epilogue's aux output), a = gelu_tanh(h)   (GELU_AUX_BIAS)
// linear_dgelu_bgrad(dy [M, N2], w2 [N2, N], h [M, N], bgrad) -> (dh [M, N], db [N] or None):
//   dh = (dy w2) * gelu_tanh'(h), db = sum over M of dh                (DGELU_BGRAD; DGELU alone: no db)
// linear_wgrad_bgrad(dh [M, N], x [M, K]) -> (dW [N, K], db [N]): the weight gradient with the bias
//   gradient in its epilogue                                                          (BGRADB)
// cuBLASLt's GELU is the tanh approximation. All tensors bf16, contiguous, on one CUDA device;
// fp32 accumulation (CUBLAS_COMPUTE_32F).
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>

#include <cstdint>

namespace {

#define LT_CHECK(expr)                                                                              \
  do {                                                                                              \
    cublasStatus_t st_ = (expr);                                                                    \
    TORCH_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLASLt: ", #expr, " failed with status ", (int)st_); \
  } while (0)

constexpr size_t kWorkspace = 32u << 20;  // 32 MiB, as torch gives cuBLASLt on Hopper

struct Desc {  // the descriptors of one matmul, destroyed with it
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Desc() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// D (m x n, ld m) = op(A) (m x k) * op(B) (k x n) with ``epilogue``; A is stored (ta == T) as k x m
// with ld k, or (ta == N) as m x k with ld m; B (tb == N) as k x n with ld k, or (tb == T) as n x k
// with ld n. ``bias``: the bias, or the bias gradient's output; ``aux``: the GELU's input (ld m).
void matmul(cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k, const at::Tensor& A,
            const at::Tensor& B, at::Tensor& D, cublasLtEpilogue_t epilogue, void* bias, void* aux) {
  Desc desc;
  const cudaDataType_t bf16 = CUDA_R_16BF;
  LT_CHECK(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  LT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias) {
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  if (aux) {
    int64_t ld_aux = m;
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof(ld_aux)));
  }
  if (ta == CUBLAS_OP_T) {
    LT_CHECK(cublasLtMatrixLayoutCreate(&desc.a, bf16, k, m, k));
  } else {
    LT_CHECK(cublasLtMatrixLayoutCreate(&desc.a, bf16, m, k, m));
  }
  if (tb == CUBLAS_OP_T) {
    LT_CHECK(cublasLtMatrixLayoutCreate(&desc.b, bf16, n, k, n));
  } else {
    LT_CHECK(cublasLtMatrixLayoutCreate(&desc.b, bf16, k, n, k));
  }
  LT_CHECK(cublasLtMatrixLayoutCreate(&desc.d, bf16, m, n, m));
  LT_CHECK(cublasLtMatmulPreferenceCreate(&desc.pref));
  size_t ws = kWorkspace;
  LT_CHECK(cublasLtMatmulPreferenceSetAttribute(desc.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc.op, desc.a, desc.b, desc.d, desc.d, desc.pref, 1, &heuristic,
                                          &found));
  TORCH_CHECK(found > 0, "cuBLASLt has no algorithm for this epilogue at m=", m, " n=", n, " k=", k);
  auto workspace = at::empty({static_cast<int64_t>(heuristic.workspaceSize)},
                             A.options().dtype(at::kByte));
  const float alpha = 1.0f, beta = 0.0f;
  LT_CHECK(cublasLtMatmul(handle, desc.op, &alpha, A.data_ptr(), desc.a, B.data_ptr(), desc.b, &beta, D.data_ptr(),
                          desc.d, D.data_ptr(), desc.d, &heuristic.algo, workspace.data_ptr(), heuristic.workspaceSize,
                          at::cuda::getCurrentCUDAStream()));
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kBFloat16 && t.is_contiguous(), name,
              " must be a contiguous bf16 CUDA tensor");
}

std::tuple<at::Tensor, at::Tensor> linear_gelu_aux(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
  check(x, "x");
  check(w, "w");
  check(b, "b");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && b.numel() == N && N % 8 == 0, "linear_gelu_aux: x [M, K], w [N, K], b [N], N % 8 == 0");
  auto a = at::empty({M, N}, x.options());
  auto h = at::empty({M, N}, x.options());
  matmul(CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, w, x, a, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, b.data_ptr(), h.data_ptr());
  return {a, h};
}

std::tuple<at::Tensor, at::Tensor> linear_dgelu_bgrad(const at::Tensor& dy, const at::Tensor& w2, const at::Tensor& h,
                                                      bool bgrad) {
  check(dy, "dy");
  check(w2, "w2");
  check(h, "h");
  const int64_t M = dy.size(0), N2 = dy.size(1), N = w2.size(1);
  TORCH_CHECK(w2.size(0) == N2 && h.size(0) == M && h.size(1) == N && N % 8 == 0,
              "linear_dgelu_bgrad: dy [M, N2], w2 [N2, N], h [M, N], N % 8 == 0");
  auto dh = at::empty({M, N}, dy.options());
  if (!bgrad) {  // DGELU alone: the bias gradient is the caller's
    matmul(CUBLAS_OP_N, CUBLAS_OP_N, N, M, N2, w2, dy, dh, CUBLASLT_EPILOGUE_DGELU, nullptr, h.data_ptr());
    return {dh, at::Tensor()};
  }
  auto db = at::empty({N}, dy.options());
  matmul(CUBLAS_OP_N, CUBLAS_OP_N, N, M, N2, w2, dy, dh, CUBLASLT_EPILOGUE_DGELU_BGRAD, db.data_ptr(), h.data_ptr());
  return {dh, db};
}

// dW = dh^T x, column-major dW^T (K x N) = x^T (K x M: x stored K x M, op N) * dh (M x N: dh stored
// N x M, op T), the contraction over the tokens; db = sum over the tokens of dh, the reduction of B
// over k in the same GEMM (BGRADB: a vector over D's columns, N).
std::tuple<at::Tensor, at::Tensor> linear_wgrad_bgrad(const at::Tensor& dh, const at::Tensor& x) {
  check(dh, "dh");
  check(x, "x");
  const int64_t M = dh.size(0), N = dh.size(1), K = x.size(1);
  TORCH_CHECK(x.size(0) == M, "linear_wgrad_bgrad: dh [M, N], x [M, K]");
  auto dw = at::empty({N, K}, dh.options());
  auto db = at::empty({N}, dh.options());
  matmul(CUBLAS_OP_N, CUBLAS_OP_T, K, N, M, x, dh, dw, CUBLASLT_EPILOGUE_BGRADB, db.data_ptr(), nullptr);
  return {dw, db};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("linear_gelu_aux", &linear_gelu_aux, "(a, h): h = x w^T + b, a = gelu_tanh(h), in one cuBLASLt GEMM");
  m.def("linear_dgelu_bgrad", &linear_dgelu_bgrad,
        "(dh, db): dh = (dy w2) * gelu_tanh'(h), db = dh summed over rows (bgrad; else None), in one cuBLASLt GEMM");
  m.def("linear_wgrad_bgrad", &linear_wgrad_bgrad, "(dW, db): dW = dh^T x, db = dh summed over rows, in one cuBLASLt GEMM");
}
