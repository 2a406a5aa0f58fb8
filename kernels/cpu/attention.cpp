// Blocked attention with an online softmax (flash-attention-2's scheme, written from its
// formulas). For each tile of block_q queries and block_k keys:
//   forward:  S = scale q k^T + additive, hidden pairs -inf; m' = max(m, rowmax S);
//             acc = acc exp(m - m') + exp(S - m') v;  l = l exp(m - m') + rowsum exp(S - m');
//             at the end out = acc / l, lse = m + log l (zeros and -inf where l = 0).
//   backward: P = exp(S - lse); dV += P^T dO; dP = dO v^T; dS = P (dP - delta), with
//             delta = rowsum(dO o out) - dlse (d lse / dS = P); dK += scale dS^T q;
//             dQ += scale dS k.
// Only q, k, v, out and lse are kept between the passes; scores and masks exist one tile at a
// time. Tiles no query can see (later window positions under causality, keys beyond a sliding
// window, no shared document) are never computed, and under causality a tile stops at the last
// key its queries can see. q, k, v and dO are read through their strides (views of a fused qkv
// projection need no copy), and out, dq, dk, dv are laid out [B, T, H, D], so merging heads
// afterwards is a view too. Matrix products run on raw tile pointers (blas.h), one thread each
// inside at::parallel_for: the plain A B products through tile_gemm (oneDNN's micro-kernel for
// fp32, ~20% faster than MKL's sgemm on these tiles), for which the forward keeps scale K^T of the
// kv slab in use and the backward scale K^T and V^T of its key block (transposed once, read by
// every query block; the scale rides on that copy and, in the backward, on dS); dV and dK, whose
// products need P^T and dS^T, stay with sgemm. The softmax bookkeeping is vectorised row
// arithmetic (attention_rows.h).
#include "attention.h"
#include "linear_onednn.h"

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "attention_rows.h"
#include "blas.h"

namespace strata::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a block of queries sees of a block of keys, decided from the smallest and largest window
// position and document id in each block, without looking at the pairs.
enum class Sight { none, some, all };

// min and max of x[0..n) per block of `block` entries.
void block_bounds(const int64_t* x, int64_t n, int64_t block, std::vector<int64_t>& lo, std::vector<int64_t>& hi) {
  for (int64_t start = 0; start < n; start += block) {
    const int64_t* end = x + std::min(n, start + block);
    const auto [mn, mx] = std::minmax_element(x + start, end);
    lo.push_back(*mn);
    hi.push_back(*mx);
  }
}

// Shapes, mask and block layout of one call; forward and backward build the same one.
struct Layout {
  int64_t batch = 0, heads = 0, kv_heads = 0, group = 1, tq = 0, tk = 0, block_q = 0, block_k = 0, q_blocks = 0, k_blocks = 0;
  bool causal = false, documents = false;
  bool kv_sorted = false;      // causal and key positions non-decreasing (the default arange): visible keys are a range
  int64_t sliding_window = 0;  // causal only; 0: none
  at::Tensor q_pos, kv_pos;  // [Tq], [Tk] window positions (causal only)
  at::Tensor q_doc, kv_doc;  // [B, Tq], [B, Tk] document ids (documents only)
  at::Tensor additive;       // [B, H, Tq, Tk] as an expanded view (stride 0 where broadcast), compute dtype
  std::vector<int64_t> q_pos_lo, q_pos_hi, kv_pos_lo, kv_pos_hi;  // per block
  std::vector<int64_t> q_doc_lo, q_doc_hi, kv_doc_lo, kv_doc_hi;  // per batch row and block

  Sight sight(int64_t b, int64_t qb, int64_t kb) const {
    bool all = true;
    if (causal) {
      if (kv_pos_lo[kb] > q_pos_hi[qb]) return Sight::none;  // every key after every query
      all = kv_pos_hi[kb] <= q_pos_lo[qb];
      if (sliding_window > 0) {
        if (kv_pos_hi[kb] <= q_pos_lo[qb] - sliding_window) return Sight::none;  // every key too old for every query
        all = all && kv_pos_lo[kb] > q_pos_hi[qb] - sliding_window;
      }
    }
    if (documents) {
      const int64_t qi = b * q_blocks + qb, ki = b * k_blocks + kb;
      if (kv_doc_lo[ki] > q_doc_hi[qi] || kv_doc_hi[ki] < q_doc_lo[qi]) return Sight::none;  // no id in common
      all = all && q_doc_lo[qi] == q_doc_hi[qi] && kv_doc_lo[ki] == kv_doc_hi[ki] && q_doc_lo[qi] == kv_doc_lo[ki];
    }
    return all ? Sight::all : Sight::some;
  }

  // How many of key block kb's nk keys a tile computes: under causality with sorted key
  // positions, the keys after query block qb's last position are hidden from all its queries, so
  // the tile stops before them (a 64 x 128 diagonal tile computes 64 x 64 where half the keys
  // come later than every query).
  int64_t keys_computed(int64_t qb, int64_t kb, int64_t nk) const {
    if (!kv_sorted) return nk;
    const int64_t* kp = kv_pos.data_ptr<int64_t>() + kb * block_k;
    return std::upper_bound(kp, kp + nk, q_pos_hi[qb]) - kp;
  }
};

Layout make_layout(const at::Tensor& q, const at::Tensor& k, const ops::AttentionMask& mask, const at::Tensor& additive,
                   at::ScalarType compute, int64_t block_q, int64_t block_k) {
  Layout L;
  L.batch = q.size(0);
  L.heads = q.size(1);
  L.kv_heads = k.size(1);
  L.group = L.heads / L.kv_heads;
  L.tq = q.size(2);
  L.tk = k.size(2);
  L.block_q = block_q;
  L.block_k = block_k;
  L.q_blocks = (L.tq + block_q - 1) / block_q;
  L.k_blocks = (L.tk + block_k - 1) / block_k;
  const auto longs = at::TensorOptions().dtype(at::kLong);
  if (mask.sliding_window < 0 || (mask.sliding_window > 0 && !mask.causal))
    throw std::invalid_argument("attention: sliding_window " + std::to_string(mask.sliding_window) +
                                " needs a causal mask and a positive size (0: none)");
  if (mask.causal) {
    L.causal = true;
    L.sliding_window = mask.sliding_window;
    // Undefined positions: the ends aligned (queries are the last Tq of the Tk keys).
    L.q_pos = mask.q_index.defined() ? mask.q_index.to(at::kLong).contiguous() : at::arange(L.tk - L.tq, L.tk, longs);
    L.kv_pos = mask.kv_index.defined() ? mask.kv_index.to(at::kLong).contiguous() : at::arange(L.tk, longs);
    block_bounds(L.q_pos.data_ptr<int64_t>(), L.tq, block_q, L.q_pos_lo, L.q_pos_hi);
    block_bounds(L.kv_pos.data_ptr<int64_t>(), L.tk, block_k, L.kv_pos_lo, L.kv_pos_hi);
    const int64_t* kp = L.kv_pos.data_ptr<int64_t>();
    L.kv_sorted = std::is_sorted(kp, kp + L.tk);
  }
  if (mask.q_document.defined() != mask.kv_document.defined())
    throw std::invalid_argument("attention: a document mask needs the documents of both queries and keys");
  if (mask.q_document.defined()) {
    L.documents = true;
    L.q_doc = mask.q_document.to(at::kLong).expand({L.batch, L.tq}).contiguous();
    L.kv_doc = mask.kv_document.to(at::kLong).expand({L.batch, L.tk}).contiguous();
    for (int64_t b = 0; b < L.batch; ++b) {
      block_bounds(L.q_doc.data_ptr<int64_t>() + b * L.tq, L.tq, block_q, L.q_doc_lo, L.q_doc_hi);
      block_bounds(L.kv_doc.data_ptr<int64_t>() + b * L.tk, L.tk, block_k, L.kv_doc_lo, L.kv_doc_hi);
    }
  }
  // A view: the broadcast dimensions keep stride 0, so nothing [B, H, Tq, Tk] is allocated.
  if (additive.defined()) L.additive = additive.to(compute).expand({L.batch, L.heads, L.tq, L.tk});
  return L;
}

// The rows of a [B, H, T, D] operand whose last dimension is contiguous, whatever its other
// strides: q, k, v as views of a fused qkv projection ([B, T, 3 H D] split and transposed) and
// outputs kept as [B, T, H, D] are read and written in place, no copy either way. A tile is
// `at(slab, start)` (slab = b H + h) with row stride `ld`, what the BLAS calls take.
template <class T>
struct Rows {
  T* data;
  int64_t heads, batch_stride, head_stride, ld;
  explicit Rows(const at::Tensor& x)
      : data(x.data_ptr<T>()), heads(x.size(1)), batch_stride(x.stride(0)), head_stride(x.stride(1)),
        ld(x.size(2) > 1 ? x.stride(2) : x.size(3)) {}
  T* at(int64_t slab, int64_t start) const { return data + (slab / heads) * batch_stride + (slab % heads) * head_stride + start * ld; }
};

// x as the kernel reads it: itself where it is in the compute dtype with rows Rows can address
// (contiguous last dimension, rows at least D apart), else a contiguous copy.
at::Tensor as_rows(const at::Tensor& x, at::ScalarType compute) {
  const bool usable = x.scalar_type() == compute && x.stride(3) == 1 && (x.size(2) <= 1 || x.stride(2) >= x.size(3));
  return usable ? x : x.to(compute).contiguous();
}

// A [B, H, T, D] tensor laid out as [B, T, H, D] (strides, not a view, so in-place use stays
// allowed): what the model does next with an attention output or gradient ([B, T, H D]) is then
// a view, not a copy. `parts` > 0 puts a leading dimension of that many such tensors in front.
at::Tensor token_major(int64_t b, int64_t h, int64_t t, int64_t d, const at::TensorOptions& options, bool zeroed, int64_t parts = 0) {
  std::vector<int64_t> sizes{b, h, t, d}, strides{t * h * d, d, h * d, 1};
  if (parts > 0) {
    sizes.insert(sizes.begin(), parts);
    strides.insert(strides.begin(), b * t * h * d);
  }
  at::Tensor x = at::empty_strided(sizes, strides, options);
  return zeroed ? x.zero_() : x;
}

// s[nq, nk] += additive[b, h, i0.., j0..].
template <class T>
void add_bias(const Layout& L, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, T* s) {
  const auto st = L.additive.strides();
  const T* base = L.additive.data_ptr<T>() + b * st[0] + h * st[1] + i0 * st[2] + j0 * st[3];
  for (int64_t i = 0; i < nq; ++i) {
    const T* a = base + i * st[2];
    T* row = s + i * nk;
    for (int64_t j = 0; j < nk; ++j) row[j] += a[j * st[3]];
  }
}

// -inf where query i0 + i may not see key j0 + j (later position, beyond the sliding window, other
// document).
template <class T>
void hide_invisible(const Layout& L, int64_t b, int64_t i0, int64_t nq, int64_t j0, int64_t nk, T* s) {
  const T hidden = -std::numeric_limits<T>::infinity();
  const int64_t* qp = L.causal ? L.q_pos.data_ptr<int64_t>() + i0 : nullptr;
  const int64_t* kp = L.causal ? L.kv_pos.data_ptr<int64_t>() + j0 : nullptr;
  const int64_t* qd = L.documents ? L.q_doc.data_ptr<int64_t>() + b * L.tq + i0 : nullptr;
  const int64_t* kd = L.documents ? L.kv_doc.data_ptr<int64_t>() + b * L.tk + j0 : nullptr;
  const int64_t window = L.sliding_window > 0 ? L.sliding_window : std::numeric_limits<int64_t>::max();
  if (L.kv_sorted && !qd) {
    // Sorted keys: row i sees the range of keys with qp[i] - window < kp[j] <= qp[i]; hide the rest.
    for (int64_t i = 0; i < nq; ++i) {
      T* row = s + i * nk;
      const int64_t end = std::upper_bound(kp, kp + nk, qp[i]) - kp;
      const int64_t begin = L.sliding_window > 0 ? std::upper_bound(kp, kp + nk, qp[i] - window) - kp : 0;
      std::fill(row, row + std::min(begin, end), hidden);
      std::fill(row + end, row + nk, hidden);
    }
    return;
  }
  for (int64_t i = 0; i < nq; ++i) {
    T* row = s + i * nk;
    for (int64_t j = 0; j < nk; ++j) {
      const bool seen = (!qp || (kp[j] <= qp[i] && qp[i] - kp[j] < window)) && (!qd || kd[j] == qd[i]);
      if (!seen) row[j] = hidden;
    }
  }
}

// dst [cols, rows] (row stride ld_dst) = alpha src^T, src [rows, cols] with row stride ld_src. In
// blocks of 16 rows so that writes run along dst's rows.
template <class T>
void transpose_scaled(const T* src, int64_t ld_src, int64_t rows, int64_t cols, T alpha, T* dst, int64_t ld_dst) {
  constexpr int64_t block = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t r1 = std::min(rows, r0 + block);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = r0; r < r1; ++r) dst[c * ld_dst + r] = alpha * src[r * ld_src + c];
  }
}

// Scores of one tile into s [nq, nk]: Q scaled K^T (+ bias), hidden pairs at -inf. Q [nq, D] with
// row stride ldq; KT = scale K^T [D, >= nk] with row stride ldkt (transposed once per key block or
// slab, so that the product is the plain A B the tile GEMM takes).
template <class T>
void scores(const Layout& L, Sight sight, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t d,
            const T* Q, int64_t ldq, const T* KT, int64_t ldkt, T* s) {
  tile_gemm(nq, nk, d, Q, ldq, KT, ldkt, false, s, nk);
  if (L.additive.defined()) add_bias(L, b, h, i0, nq, j0, nk, s);
  if (sight == Sight::some) hide_invisible(L, b, i0, nq, j0, nk, s);
}

template <class T>
const AttentionRowOps<T>& row_ops() {
  if constexpr (std::is_same_v<T, float>)
    return attention_row_ops_float();
  else
    return attention_row_ops_double();
}

// Query blocks in the order 0, n-1, 1, n-2, ...: at::parallel_for hands each thread a contiguous
// range of tasks, and under causality late query blocks see many more keys than early ones.
int64_t zigzag(int64_t p, int64_t n) { return p % 2 == 0 ? p / 2 : n - 1 - p / 2; }

// The tiles' arithmetic runs on raw pointers: BLAS for the products (kernels/cpu/blas.h) and the
// vectorised row operations (attention_rows.h), no ATen call inside the loops, so a tile costs
// its flops and not a dozen dispatches.

// q, k, v, out: compute dtype T, addressed through Rows (any strides, contiguous last dimension).
// Fills out and lse [B, H, Tq].
template <class T>
void forward_kernel(const Layout& L, T scale, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                    const at::Tensor& lse) {
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t d = q.size(-1), dv = v.size(-1);
  const AttentionRowOps<T>& ops = row_ops<T>();
  const Rows<T> Rq(q), Rk(k), Rv(v), Ro(out);
  at::parallel_for(0, L.batch * L.heads * L.q_blocks, 1, [&](int64_t begin, int64_t end) {
    const SequentialBlas one_thread;
    std::vector<T> s(L.block_q * L.block_k), m(L.block_q), l(L.block_q), alpha(L.block_q);
    std::vector<T> kt(d * L.tk);  // scale K^T of kv slab `kt_slab`; a thread's tasks run slab after slab
    int64_t kt_slab = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bh = task / L.q_blocks, qb = zigzag(task % L.q_blocks, L.q_blocks);
      const int64_t b = bh / L.heads, h = bh % L.heads, kv_slab = b * L.kv_heads + h / L.group;
      if (kv_slab != kt_slab) {
        transpose_scaled(Rk.at(kv_slab, 0), Rk.ld, L.tk, d, scale, kt.data(), L.tk);
        kt_slab = kv_slab;
      }
      const int64_t i0 = qb * L.block_q, nq = std::min(L.block_q, L.tq - i0);
      const T* Q = Rq.at(bh, i0);
      T* o = Ro.at(bh, i0);
      for (int64_t i = 0; i < nq; ++i) std::fill(o + i * Ro.ld, o + i * Ro.ld + dv, T(0));
      std::fill(m.begin(), m.end(), -inf);
      std::fill(l.begin(), l.end(), T(0));
      for (int64_t kb = 0; kb < L.k_blocks; ++kb) {
        const Sight sight = L.sight(b, qb, kb);
        if (sight == Sight::none) continue;
        const int64_t j0 = kb * L.block_k, nk = L.keys_computed(qb, kb, std::min(L.block_k, L.tk - j0));
        scores<T>(L, sight, b, h, i0, nq, j0, nk, d, Q, Rq.ld, kt.data() + j0, L.tk, s.data());
        ops.online_softmax(s.data(), nq, nk, nk, m.data(), l.data(), alpha.data());
        ops.scale_rows(o, nq, dv, Ro.ld, alpha.data());
        tile_gemm(nq, dv, nk, s.data(), nk, Rv.at(kv_slab, j0), Rv.ld, true, o, Ro.ld);  // O += P V
      }
      T* lse_row = lse.data_ptr<T>() + bh * L.tq + i0;
      for (int64_t i = 0; i < nq; ++i) {
        // A row that saw no key: zeros (already) and lse -inf.
        alpha[i] = l[i] == T(0) ? T(1) : T(1) / l[i];
        lse_row[i] = l[i] == T(0) ? -inf : m[i] + std::log(l[i]);
      }
      ops.scale_rows(o, nq, dv, Ro.ld, alpha.data());
    }
  });
}

// Gradients. dout, lse, delta ([B, H, Tq]: rowsum(dout o out) - dlse, 0 where lse = -inf) in
// compute dtype T. Tasks are (batch, kv head, split): a task owns the key blocks kb = split,
// split + splits, ... of its kv head, so dk and dv rows have one writer and need no reduction,
// and it adds the dq of every query head of the group into dq_parts[split], summed afterwards
// (more than one split only when there are fewer (batch, kv head) pairs than threads).
template <class T>
void backward_kernel(const Layout& L, T scale, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta, int64_t splits,
                     const at::Tensor& dq_parts, const at::Tensor& dk, const at::Tensor& dv, const at::Tensor& dbias) {
  const T inf = std::numeric_limits<T>::infinity();
  const int64_t d = q.size(-1), dvd = v.size(-1);
  const AttentionRowOps<T>& ops = row_ops<T>();
  const Rows<T> Rq(q), Rk(k), Rv(v), Rdo(dout), Rdk(dk), Rdv(dv);
  std::vector<Rows<T>> Rdq;
  for (int64_t split = 0; split < splits; ++split) Rdq.emplace_back(dq_parts[split]);
  at::parallel_for(0, L.batch * L.kv_heads * splits, 1, [&](int64_t begin, int64_t end) {
    const SequentialBlas one_thread;
    std::vector<T> p(L.block_q * L.block_k), dp(L.block_q * L.block_k), shift(L.block_q);
    std::vector<T> kt(d * L.block_k), vt(dvd * L.block_k);  // scale K^T and V^T of the key block
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kv_slab = task / splits, split = task % splits;
      const int64_t b = kv_slab / L.kv_heads, hk = kv_slab % L.kv_heads;
      for (int64_t kb = split; kb < L.k_blocks; kb += splits) {
        const int64_t j0 = kb * L.block_k, nk_block = std::min(L.block_k, L.tk - j0);
        const T *K = Rk.at(kv_slab, j0), *V = Rv.at(kv_slab, j0);
        T *dK = Rdk.at(kv_slab, j0), *dV = Rdv.at(kv_slab, j0);
        transpose_scaled(K, Rk.ld, nk_block, d, scale, kt.data(), nk_block);
        transpose_scaled(V, Rv.ld, nk_block, dvd, T(1), vt.data(), nk_block);
        for (int64_t h = hk * L.group; h < (hk + 1) * L.group; ++h) {
          const int64_t bh = b * L.heads + h;
          for (int64_t qb = 0; qb < L.q_blocks; ++qb) {
            const Sight sight = L.sight(b, qb, kb);
            if (sight == Sight::none) continue;
            const int64_t i0 = qb * L.block_q, nq = std::min(L.block_q, L.tq - i0);
            const int64_t nk = L.keys_computed(qb, kb, nk_block);
            const T *Q = Rq.at(bh, i0), *dO = Rdo.at(bh, i0);
            scores<T>(L, sight, b, h, i0, nq, j0, nk, d, Q, Rq.ld, kt.data(), nk_block, p.data());
            const T* lse_row = lse.data_ptr<T>() + bh * L.tq + i0;
            // lse = -inf: the row sees no key, every score is -inf; +inf keeps exp at 0.
            for (int64_t i = 0; i < nq; ++i) shift[i] = lse_row[i] == -inf ? inf : lse_row[i];
            ops.exp_shifted(p.data(), nq, nk, nk, shift.data());                                    // P
            gemm(Trans::yes, Trans::no, nk, dvd, nq, T(1), p.data(), nk, dO, Rdo.ld, T(1), dV, Rdv.ld);  // dV += P^T dO
            tile_gemm(nq, nk, dvd, dO, Rdo.ld, vt.data(), nk_block, false, dp.data(), nk);             // dP = dO V^T
            ops.softmax_backward(p.data(), dp.data(), nq, nk, nk, delta.data_ptr<T>() + bh * L.tq + i0);  // dS
            if (dbias.defined()) {
              T* db = dbias.data_ptr<T>() + (bh * L.tq + i0) * L.tk + j0;
              for (int64_t i = 0; i < nq; ++i) std::copy(dp.data() + i * nk, dp.data() + (i + 1) * nk, db + i * L.tk);
            }
            for (int64_t i = 0; i < nq * nk; ++i) dp[i] *= scale;                                    // scale dS
            gemm(Trans::yes, Trans::no, nk, d, nq, T(1), dp.data(), nk, Q, Rq.ld, T(1), dK, Rdk.ld);  // dK += scale dS^T q
            tile_gemm(nq, d, nk, dp.data(), nk, K, Rk.ld, true, Rdq[split].at(bh, i0), Rdq[split].ld);  // dQ += scale dS K
          }
        }
      }
    }
  });
}

at::ScalarType compute_type(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

double softmax_scale(const at::Tensor& q) { return 1.0 / std::sqrt(static_cast<double>(q.size(-1))); }

// Mask tensors kept for the backward, by name (undefined ones too).
void save_mask(AutogradContext* ctx, const ops::AttentionMask& mask) {
  ctx->saved_data["causal"] = mask.causal;
  ctx->saved_data["sliding_window"] = mask.sliding_window;
  ctx->saved_data["q_index"] = mask.q_index;
  ctx->saved_data["kv_index"] = mask.kv_index;
  ctx->saved_data["q_document"] = mask.q_document;
  ctx->saved_data["kv_document"] = mask.kv_document;
}

// A saved tensor; an undefined one may come back as None.
at::Tensor saved_tensor(AutogradContext* ctx, const std::string& name) {
  const at::IValue& value = ctx->saved_data.at(name);
  return value.isTensor() ? value.toTensor() : at::Tensor();
}

ops::AttentionMask load_mask(AutogradContext* ctx) {
  ops::AttentionMask mask;
  mask.causal = ctx->saved_data.at("causal").toBool();
  mask.sliding_window = ctx->saved_data.at("sliding_window").toInt();
  mask.q_index = saved_tensor(ctx, "q_index");
  mask.kv_index = saved_tensor(ctx, "kv_index");
  mask.q_document = saved_tensor(ctx, "q_document");
  mask.kv_document = saved_tensor(ctx, "kv_document");
  return mask;
}

// The backward pass: the gradients of q, k, v (and of the additive mask where `bias_grad`) from
// the output, its lse and their gradients (dlse undefined: 0).
struct Gradients {
  at::Tensor dq, dk, dv, dadd;
};
Gradients blocked_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                           const at::Tensor& d_out, const at::Tensor& d_lse, const ops::AttentionMask& mask, const at::Tensor& additive,
                           bool bias_grad, int64_t block_q, int64_t block_k) {
  const at::ScalarType compute = compute_type(q);
  const Layout L = make_layout(q, k, mask, additive, compute, block_q, block_k);
  const at::Tensor dout = as_rows(d_out, compute), lse_c = lse.to(compute).contiguous();
  // delta = rowsum(dO o O) - dlse; 0 on rows that see nothing (their P is 0, keep it finite).
  at::Tensor delta = (dout * out.to(compute)).sum(-1);
  if (d_lse.defined()) delta = delta - d_lse.to(compute);
  delta = at::where(lse_c.isneginf(), at::zeros_like(delta), delta).contiguous();
  const at::Tensor qc = as_rows(q, compute), kc = as_rows(k, compute), vc = as_rows(v, compute);
  // More than one split of the key blocks only to keep every thread busy.
  const int64_t pairs = L.batch * L.kv_heads, threads = at::get_num_threads();
  const int64_t splits = pairs >= threads ? 1 : std::max<int64_t>(1, std::min(L.k_blocks, (threads + pairs - 1) / pairs));
  const auto opts = q.options().dtype(compute);
  // Gradients laid out [B, T, H, D] like the output (token_major).
  at::Tensor dq_parts = token_major(L.batch, L.heads, L.tq, q.size(-1), opts, /*zeroed=*/true, splits);
  at::Tensor dk = token_major(L.batch, L.kv_heads, L.tk, k.size(-1), opts, /*zeroed=*/true);
  at::Tensor dv = token_major(L.batch, L.kv_heads, L.tk, v.size(-1), opts, /*zeroed=*/true);
  at::Tensor dbias = bias_grad ? at::zeros({L.batch, L.heads, L.tq, L.tk}, opts) : at::Tensor();
  if (compute == at::kDouble)
    backward_kernel<double>(L, softmax_scale(q), qc, kc, vc, dout, lse_c, delta, splits, dq_parts, dk, dv, dbias);
  else
    backward_kernel<float>(L, static_cast<float>(softmax_scale(q)), qc, kc, vc, dout, lse_c, delta, splits, dq_parts, dk, dv, dbias);
  at::Tensor dq = splits > 1 ? dq_parts.sum(0) : dq_parts[0];
  at::Tensor dadd = bias_grad ? at::sum_to(dbias, additive.sizes()).to(additive.scalar_type()) : at::Tensor();
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dadd};
}

// The autograd function: inputs q, k, v and the additive mask (an optional tensor input, so that
// a learned bias gets its gradient; autograd refuses undefined tensor inputs); outputs out (q's
// dtype) and lse. needs_input_grad counts tensor inputs only: the additive mask is input 3.
class BlockedAttention : public torch::autograd::Function<BlockedAttention> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::optional<at::Tensor>& additive_mask, const ops::AttentionMask& mask, int64_t block_q,
                               int64_t block_k) {
    const at::Tensor additive = additive_mask ? *additive_mask : at::Tensor();
    const at::ScalarType compute = compute_type(q);
    const Layout L = make_layout(q, k, mask, additive, compute, block_q, block_k);
    const at::Tensor qc = as_rows(q, compute), kc = as_rows(k, compute), vc = as_rows(v, compute);
    at::Tensor out = token_major(L.batch, L.heads, L.tq, v.size(-1), q.options().dtype(compute), /*zeroed=*/false);
    at::Tensor lse = at::empty({L.batch, L.heads, L.tq}, q.options().dtype(compute));
    if (compute == at::kDouble)
      forward_kernel<double>(L, softmax_scale(q), qc, kc, vc, out, lse);
    else
      forward_kernel<float>(L, static_cast<float>(softmax_scale(q)), qc, kc, vc, out, lse);
    out = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse});
    save_mask(ctx, mask);
    ctx->saved_data["additive"] = additive;
    ctx->saved_data["block_q"] = block_q;
    ctx->saved_data["block_k"] = block_k;
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor additive = saved_tensor(ctx, "additive");
    // Undefined output gradients arrive as zeros (materialised by autograd).
    const bool bias_grad = additive.defined() && ctx->needs_input_grad(3);
    Gradients g = blocked_backward(saved[0], saved[1], saved[2], saved[3], saved[4], grads[0], grads[1], load_mask(ctx), additive,
                                   bias_grad, ctx->saved_data["block_q"].toInt(), ctx->saved_data["block_k"].toInt());
    return {g.dq, g.dk, g.dv, g.dadd, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

void check_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4)
    throw std::invalid_argument("attention.fused_cpu: q, k, v must be [B, H, T, D]");
  if (k.size(1) == 0 || q.size(1) % k.size(1) != 0 || v.size(1) != k.size(1))
    throw std::invalid_argument("attention.fused_cpu: " + std::to_string(q.size(1)) + " query heads do not group over " +
                                std::to_string(k.size(1)) + " key/value heads");
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || v.size(2) != k.size(2) || k.size(3) != q.size(3))
    throw std::invalid_argument("attention.fused_cpu: q, k, v shapes do not match");
}

}  // namespace

ops::AttentionResult attention_blocked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const ops::AttentionMask& mask, bool with_lse, int64_t block_q, int64_t block_k) {
  check_shapes(q, k, v);
  ops::AttentionMask index_mask = mask;
  index_mask.additive.reset();
  variable_list result = BlockedAttention::apply(q, k, v, mask.additive, index_mask, block_q, block_k);
  return {result[0], with_lse ? result[1] : at::Tensor()};
}

ops::AttentionGradients attention_backward_blocked_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_out,
                                                       const ops::AttentionMask& mask, int64_t block_q, int64_t block_k) {
  check_shapes(q, k, v);
  if (mask.additive) throw std::invalid_argument("attention_backward.fused_cpu: an additive mask is not supported");
  const Gradients g = blocked_backward(q, k, v, out, lse, d_out, at::Tensor(), mask, at::Tensor(), false, block_q, block_k);
  return {g.dq, g.dk, g.dv};
}

ops::AttentionGradients attention_backward_fused_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& out, const at::Tensor& lse, const at::Tensor& d_out,
                                                     const ops::AttentionMask& mask) {
  return attention_backward_blocked_cpu(q, k, v, out, lse, d_out, mask);
}

// fp32 and fp64 calls run the blocked kernel: measured (bench/results/attention_cpu.md, 2
// threads) its forward+backward takes 0.53-0.89x ATen's CPU flash kernel's time on plain causal
// calls from T 128 to 4096 since a tile stops at the last key its queries see, and it never
// materialises [Tq, Tk] where ATen needs a boolean mask (documents: 1.4-5.8x faster). Plain
// bfloat16/half calls (no lse, no documents, no additive mask, as many kv heads as query heads,
// unmasked or causal over the same tokens with the ends aligned) go to ATen's fused SDPA, as the
// reference sends them: ATen computes them in their own dtype where the blocked kernel would
// convert q, k, v to fp32 and back. Except where ATen's oneDNN has no GEMM in that dtype on this
// CPU (half_gemms_via_fp32, linear_onednn.h): there ATen's flash kernel multiplies its tiles in a
// scalar GEMM, and the blocked kernel's fp32 tiles are the fast path (bench/results/amp_cpu.md).
ops::AttentionResult attention_fused_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                         const ops::AttentionMask& mask, bool with_lse) {
  const bool aligned = !mask.q_index.defined() && !mask.kv_index.defined() && q.size(2) == k.size(2);
  const bool plain = !with_lse && !mask.q_document.defined() && !mask.kv_document.defined() && !mask.additive &&
                     k.size(1) == q.size(1) && (!mask.causal || (aligned && mask.sliding_window == 0));
  const bool reduced = q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble;
  if (plain && reduced && !half_gemms_via_fp32(q.scalar_type()))
    return {at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, mask.causal), {}};
  return attention_blocked_cpu(q, k, v, mask, with_lse);
}

}  // namespace strata::kernels
