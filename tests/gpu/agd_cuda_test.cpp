// agd_update.fused_cuda (kernels/cuda/agd_kernels.cu) against core's agd_update.reference on the
// same GPU: five steps with every option AGD has (decoupled, coupled and fixed weight decay,
// amsgrad, win, clip) on parameters of several sizes (one element, sizes off any vector width,
// a large one) and a strided parameter. Skips without a CUDA device (or a build without nvcc).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "cuda/agd_cuda.h"
#include "strata/core/operator_table.h"

namespace strata {
namespace {

#ifdef STRATA_HAVE_CUDA_KERNELS

TEST(AgdCuda, MatchesTheReferenceWithEveryOption) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  OperatorTable::global().reset();
  const auto& ref =
      static_cast<const ops::OperatorImpl<ops::AgdUpdate>&>(*OperatorTable::global().implementations("agd_update").back());
  ASSERT_EQ(ref.name(), "agd_update.reference");
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  struct Options {
    const char* what;
    double weight_decay, clip;
    bool decouple, fixed, amsgrad, win;
  };
  const Options cases[] = {{"plain", 0.0, 0.0, true, false, false, false},   {"decoupled decay", 0.1, 0.0, true, false, false, false},
                           {"coupled decay", 0.1, 0.0, false, false, false, false}, {"fixed decay", 0.01, 0.0, true, true, false, false},
                           {"amsgrad, clip", 0.1, 0.5, true, false, true, false},  {"win", 0.1, 0.0, true, false, false, true},
                           {"win, amsgrad", 0.1, 1.0, true, false, true, true}};
  at::manual_seed(0);
  for (const Options& o : cases)
    for (int64_t n : {1, 7, 33, 1000, 1 << 20}) {
      SCOPED_TRACE(std::string(o.what) + ", numel " + std::to_string(n));
      const at::Tensor p0 = at::randn({n}, cuda);
      at::Tensor p[2], m[2], b[2], bmax[2], z[2];
      for (int k = 0; k < 2; ++k)
        p[k] = p0.clone(), m[k] = at::zeros({n}, cuda), b[k] = at::zeros({n}, cuda), bmax[k] = at::zeros({n}, cuda), z[k] = p0.clone();
      for (int64_t step = 1; step <= 5; ++step) {
        const at::Tensor g = at::randn({n}, cuda) * (step == 3 ? 1e-3 : 1.0);  // a small gradient: delta matters
        ops::AgdHyper h;
        h.lr = 1e-2, h.beta1 = 0.9, h.beta2 = 0.999, h.delta = 1e-5, h.weight_decay = o.weight_decay, h.clip = o.clip, h.step = step;
        h.weight_decouple = o.decouple, h.fixed_decay = o.fixed, h.amsgrad = o.amsgrad, h.win = o.win;
        kernels::agd_update_fused_cuda(p[0], g, m[0], b[0], o.amsgrad ? bmax[0] : at::Tensor(), o.win ? z[0] : at::Tensor(), h);
        ref.fn()(p[1], g, m[1], b[1], o.amsgrad ? bmax[1] : at::Tensor(), o.win ? z[1] : at::Tensor(), h);
      }
      // fp32 arithmetic in the same order, but nvcc may contract a multiply and an add into one
      // fma where ATen's kernels round between them: a few ulps after five steps.
      for (auto [ours, theirs, what] : {std::tuple{p[0], p[1], "param"}, {m[0], m[1], "exp_avg"}, {b[0], b[1], "exp_avg_diff_sq"},
                                        {bmax[0], bmax[1], "max_exp_avg_diff_sq"}, {z[0], z[1], "z"}}) {
        const double err = (ours - theirs).abs().max().item<double>(), scale = theirs.abs().max().item<double>();
        EXPECT_LE(err, 1e-5 * std::max(1.0, scale)) << what;
      }
    }
}

TEST(AgdCuda, StridedTensorsAreWrittenBack) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  OperatorTable::global().reset();
  const auto& ref =
      static_cast<const ops::OperatorImpl<ops::AgdUpdate>&>(*OperatorTable::global().implementations("agd_update").back());
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::manual_seed(1);
  at::Tensor p = at::randn({12, 10}, cuda).t(), m = at::zeros({10, 12}, cuda), b = at::zeros({10, 12}, cuda);  // p transposed
  at::Tensor p_ref = p.contiguous(), m_ref = m.clone(), b_ref = b.clone();
  const at::Tensor g = at::randn({10, 12}, cuda);
  ops::AgdHyper h;
  h.lr = 1e-2, h.weight_decay = 0.1;
  kernels::agd_update_fused_cuda(p, g, m, b, {}, {}, h);
  ref.fn()(p_ref, g, m_ref, b_ref, {}, {}, h);
  EXPECT_LE((p - p_ref).abs().max().item<double>(), 1e-6);
  EXPECT_LE((b - b_ref).abs().max().item<double>(), 1e-6);
}

#else
TEST(AgdCuda, BuiltWithoutNvcc) { GTEST_SKIP() << "this build has no CUDA kernels (nvcc not found)"; }
#endif

}  // namespace
}  // namespace strata
