#include "runtime/model/gpt.h"

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>

#include "kernels/ops.h"
#include "parallel/context_parallel.h"
#include "runtime/core/check.h"

namespace berth {

// ---- construction and init ----------------------------------------------------------------------

template <typename T>
GPT<T>::GPT(const GPTConfig& cfg, int max_B, int max_T)
    : cfg_(cfg), layout_(gpt_param_layout(cfg)), max_B_(max_B), max_T_(max_T) {
  BERTH_CHECK(max_B > 0 && max_T > 0, "batch shape must be positive, got B={} T={}", max_B,
              max_T);
  BERTH_CHECK(max_T <= cfg.maxT, "seq_len ({}) > max_seq_len ({})", max_T, cfg.maxT);
  const size_t N = size_t(max_B) * size_t(max_T), C = size_t(cfg.C);
  // Causal blocks of sequences inside rows: Σ NH·L² <= B·NH·T².
  const size_t att = size_t(max_B) * size_t(cfg.NH) * size_t(max_T) * size_t(max_T);
  params_.assign(size_t(layout_.total), T(0));
  grads_.assign(size_t(layout_.total), T(0));
  int64_t elems = 0;
  auto alloc = [&](std::vector<T>& v, size_t n) {
    v.assign(n, T(0));
    elems += int64_t(n);
  };
  residual_.resize(size_t(cfg.L) + 1);
  for (auto& r : residual_) alloc(r, N * C);
  layers_.resize(size_t(cfg.L));
  for (LayerActs& a : layers_) {
    alloc(a.ln1, N * C);
    alloc(a.ln1_mean, N);
    alloc(a.ln1_rstd, N);
    alloc(a.qkv, N * 3 * C);
    alloc(a.atty, N * C);
    alloc(a.att, att);
    alloc(a.res2, N * C);
    alloc(a.ln2, N * C);
    alloc(a.ln2_mean, N);
    alloc(a.ln2_rstd, N);
    alloc(a.fch, N * 4 * C);
    alloc(a.fch_gelu, N * 4 * C);
  }
  alloc(lnf_, N * C);
  alloc(lnf_mean_, N);
  alloc(lnf_rstd_, N);
  alloc(logits_, N * size_t(cfg.Vp));
  alloc(losses_, N);
  alloc(scratch_, N * C);
  alloc(dres_, N * C);
  alloc(dln_, N * C);
  alloc(dqkv_, N * 3 * C);
  alloc(datty_, N * C);
  alloc(dfch_, N * 4 * C);
  alloc(datt_, att);
  activation_bytes_ = elems * int64_t(sizeof(T));
  // Offsets of every tensor, looked up once so a step does no name lookups.
  auto off = [&](const std::string& name) { return layout_.find(name).offset; };
  wte_ = off("wte");
  wpe_ = off("wpe");
  lnf_w_ = off("ln_f.weight");
  lnf_b_ = off("ln_f.bias");
  for (int l = 0; l < cfg.L; l++) {
    const std::string h = "h." + std::to_string(l) + ".";
    idx_.push_back({off(h + "ln_1.weight"), off(h + "ln_1.bias"), off(h + "attn.c_attn.weight"),
                    off(h + "attn.c_attn.bias"), off(h + "attn.c_proj.weight"),
                    off(h + "attn.c_proj.bias"), off(h + "ln_2.weight"), off(h + "ln_2.bias"),
                    off(h + "mlp.c_fc.weight"), off(h + "mlp.c_fc.bias"),
                    off(h + "mlp.c_proj.weight"), off(h + "mlp.c_proj.bias")});
  }
}

namespace {

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, keyed by the seed
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

// Normal samples from a 64-bit Mersenne Twister through Box–Muller, written out so the values are
// the same with every standard library.
template <typename T>
void fill_normal(T* out, int64_t n, double stddev, uint64_t seed) {
  std::mt19937_64 gen(seed);
  auto uniform = [&gen]() { return (double(gen() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
  for (int64_t i = 0; i < n; i += 2) {
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = T(stddev * r * std::cos(2.0 * M_PI * u2));
    if (i + 1 < n) out[i + 1] = T(stddev * r * std::sin(2.0 * M_PI * u2));
  }
}

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

template <typename T>
void GPT<T>::init_weights(uint64_t seed) {
  const double std_base = 0.02;
  const double std_proj = 0.02 / std::sqrt(2.0 * cfg_.L);
  for (const ParamSpec& s : layout_.specs) {
    T* p = params_.data() + s.offset;
    if (s.shape.size() == 1) {
      const T value = ends_with(s.name, ".weight") ? T(1) : T(0);  // LayerNorm weight 1, biases 0
      for (int64_t i = 0; i < s.numel; i++) p[i] = value;
      continue;
    }
    const bool proj = ends_with(s.name, "attn.c_proj.weight") || ends_with(s.name, "mlp.c_proj.weight");
    int64_t n = s.numel;
    if (s.name == "wte") n = int64_t(cfg_.V) * cfg_.C;  // padded rows stay 0
    fill_normal(p, n, proj ? std_proj : std_base, name_seed(seed, s.name));
    for (int64_t i = n; i < s.numel; i++) p[i] = T(0);
  }
}

template <typename T>
void GPT<T>::zero_grad() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

// ---- attention: per sequence on this rank, or ring attention over the cp group ------------------

namespace {

// qkv (N, 3C) → q, k, v (N, C) each: ring attention passes keys and values around on their own.
void split_qkv(const float* qkv, int N, int C, std::vector<float>* q, std::vector<float>* k,
               std::vector<float>* v) {
  for (auto* x : {q, k, v}) x->resize(size_t(N) * size_t(C));
  for (int n = 0; n < N; ++n) {
    const float* row = qkv + int64_t(n) * 3 * C;
    std::copy(row, row + C, q->data() + int64_t(n) * C);
    std::copy(row + C, row + 2 * C, k->data() + int64_t(n) * C);
    std::copy(row + 2 * C, row + 3 * C, v->data() + int64_t(n) * C);
  }
}

}  // namespace

template <typename T>
void GPT<T>::set_context_parallel(Communicator* cp) {
  const bool on = cp != nullptr && cp->size() > 1;
  constexpr bool fp32 = std::is_same_v<T, float>;
  BERTH_CHECK(!on || fp32, "context parallelism needs the fp32 model");
  cp_ = on ? cp : nullptr;
  if (!on) return;
  // Ring attention keeps the log-sum-exp (N × NH) per layer, not the probabilities (T² per row).
  const size_t lse = size_t(max_B_) * size_t(max_T_) * size_t(cfg_.NH);
  int64_t freed = int64_t(datt_.size());
  for (LayerActs& a : layers_) {
    freed += int64_t(a.att.size()) - int64_t(lse);
    std::vector<T>(lse, T(0)).swap(a.att);
  }
  std::vector<T>().swap(datt_);
  activation_bytes_ -= freed * int64_t(sizeof(T));
}

template <typename T>
void GPT<T>::attention_fwd(LayerActs& a, const PackedBatch& batch) {
  const int N = batch.N(), C = cfg_.C, NH = cfg_.NH, S = batch.n_seqs();
  if constexpr (std::is_same_v<T, float>) {
    if (cp_ != nullptr) {
      cp_seq_.resize(size_t(N));
      for (int s = 0; s < S; ++s) {
        for (int i = batch.cu_seqlens[size_t(s)]; i < batch.cu_seqlens[size_t(s) + 1]; ++i) {
          cp_seq_[size_t(i)] = s;
        }
      }
      split_qkv(a.qkv.data(), N, C, &cp_q_, &cp_k_, &cp_v_);
      // a.att (sized for B·T² probabilities) keeps the log-sum-exp (N × NH) instead.
      ring_attention_forward(*cp_, a.atty.data(), a.att.data(), cp_q_.data(), cp_k_.data(),
                             cp_v_.data(), cp_seq_.data(), batch.positions.data(), N, C, NH);
      return;
    }
  }
  cpu::attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), batch.cu_seqlens.data(), S, C,
                         NH);
}

template <typename T>
void GPT<T>::attention_bwd(LayerActs& a, const PackedBatch& batch) {
  const int N = batch.N(), C = cfg_.C, NH = cfg_.NH, S = batch.n_seqs();
  if constexpr (std::is_same_v<T, float>) {
    if (cp_ != nullptr) {
      split_qkv(a.qkv.data(), N, C, &cp_q_, &cp_k_, &cp_v_);
      for (auto* v : {&cp_dq_, &cp_dk_, &cp_dv_}) v->resize(size_t(N) * size_t(C));
      ring_attention_backward(*cp_, cp_dq_.data(), cp_dk_.data(), cp_dv_.data(), datty_.data(),
                              a.atty.data(), a.att.data(), cp_q_.data(), cp_k_.data(),
                              cp_v_.data(), cp_seq_.data(), batch.positions.data(), N, C, NH);
      for (int n = 0; n < N; ++n) {
        float* row = dqkv_.data() + int64_t(n) * 3 * C;
        std::copy(cp_dq_.data() + int64_t(n) * C, cp_dq_.data() + int64_t(n + 1) * C, row);
        std::copy(cp_dk_.data() + int64_t(n) * C, cp_dk_.data() + int64_t(n + 1) * C, row + C);
        std::copy(cp_dv_.data() + int64_t(n) * C, cp_dv_.data() + int64_t(n + 1) * C, row + 2 * C);
      }
      return;
    }
  }
  cpu::attention_backward(dqkv_.data(), datt_.data(), datty_.data(), a.qkv.data(), a.att.data(),
                          batch.cu_seqlens.data(), S, C, NH);
}

// ---- forward ------------------------------------------------------------------------------------

template <typename T>
double GPT<T>::forward(const PackedBatch& batch) {
  BERTH_CHECK(batch.B <= max_B_ && batch.T <= max_T_,
              "batch {}x{} is larger than the model was sized for ({}x{})", batch.B, batch.T,
              max_B_, max_T_);
  const int N = batch.N(), C = cfg_.C, L = cfg_.L;
  using namespace cpu;
  encoder_forward(residual_[0].data(), batch.tokens.data(), batch.positions.data(), P(wte_),
                  P(wpe_), N, C);
  for (int l = 0; l < L; l++) {
    const LayerIdx& ix = idx_[size_t(l)];
    LayerActs& a = layers_[size_t(l)];
    const T* x = residual_[size_t(l)].data();
    layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x,
                      P(ix.ln1_w), P(ix.ln1_b), N, C);
    matmul_forward(a.qkv.data(), a.ln1.data(), P(ix.qkv_w),
                   P(ix.qkv_b), N, C, 3 * C);
    attention_fwd(a, batch);
    matmul_forward(scratch_.data(), a.atty.data(), P(ix.proj_w),
                   P(ix.proj_b), N, C, C);
    residual_forward(a.res2.data(), x, scratch_.data(), int64_t(N) * C);
    layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(),
                      P(ix.ln2_w), P(ix.ln2_b), N, C);
    matmul_forward(a.fch.data(), a.ln2.data(), P(ix.fc_w),
                   P(ix.fc_b), N, C, 4 * C);
    gelu_forward(a.fch_gelu.data(), a.fch.data(), int64_t(N) * 4 * C);
    matmul_forward(scratch_.data(), a.fch_gelu.data(), P(ix.fcproj_w),
                   P(ix.fcproj_b), N, 4 * C, C);
    residual_forward(residual_[size_t(l) + 1].data(), a.res2.data(), scratch_.data(),
                     int64_t(N) * C);
  }
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), residual_[size_t(L)].data(),
                    P(lnf_w_), P(lnf_b_), N, C);
  matmul_forward(logits_.data(), lnf_.data(), P(wte_), static_cast<const T*>(nullptr), N, C,
                 cfg_.Vp);
  crossentropy_forward(losses_.data(), logits_.data(), batch.targets.data(), N, cfg_.V, cfg_.Vp);
  double total = 0;
  for (int n = 0; n < N; n++) total += double(losses_[size_t(n)]);
  return total;
}

// ---- backward -----------------------------------------------------------------------------------

template <typename T>
void GPT<T>::backward(const PackedBatch& batch, T dloss) {
  const int N = batch.N(), C = cfg_.C, L = cfg_.L;
  using namespace cpu;
  // LM head (tied): dlogits overwrite the logits in place
  crossentropy_backward(logits_.data(), logits_.data(), batch.targets.data(), dloss, N, cfg_.V,
                        cfg_.Vp);
  matmul_backward(dln_.data(), G(wte_), static_cast<T*>(nullptr), logits_.data(), lnf_.data(),
                  P(wte_), N, C, cfg_.Vp);
  std::fill(dres_.begin(), dres_.begin() + int64_t(N) * C, T(0));
  layernorm_backward(dres_.data(), G(lnf_w_), G(lnf_b_), dln_.data(),
                     residual_[size_t(L)].data(), P(lnf_w_), lnf_mean_.data(),
                     lnf_rstd_.data(), N, C);
  // dres_ holds d(loss)/d(residual) and is updated in place through every block.
  for (int l = L - 1; l >= 0; l--) {
    const LayerIdx& ix = idx_[size_t(l)];
    LayerActs& a = layers_[size_t(l)];
    matmul_backward(dfch_.data(), G(ix.fcproj_w), G(ix.fcproj_b),
                    dres_.data(), a.fch_gelu.data(), P(ix.fcproj_w), N, 4 * C, C);
    gelu_backward(dfch_.data(), a.fch.data(), dfch_.data(), int64_t(N) * 4 * C);
    matmul_backward(dln_.data(), G(ix.fc_w), G(ix.fc_b),
                    dfch_.data(), a.ln2.data(), P(ix.fc_w), N, C, 4 * C);
    layernorm_backward(dres_.data(), G(ix.ln2_w), G(ix.ln2_b), dln_.data(),
                       a.res2.data(), P(ix.ln2_w), a.ln2_mean.data(),
                       a.ln2_rstd.data(), N, C);
    matmul_backward(datty_.data(), G(ix.proj_w), G(ix.proj_b),
                    dres_.data(), a.atty.data(), P(ix.proj_w), N, C, C);
    attention_bwd(a, batch);
    matmul_backward(dln_.data(), G(ix.qkv_w), G(ix.qkv_b),
                    dqkv_.data(), a.ln1.data(), P(ix.qkv_w), N, C, 3 * C);
    layernorm_backward(dres_.data(), G(ix.ln1_w), G(ix.ln1_b), dln_.data(),
                       residual_[size_t(l)].data(), P(ix.ln1_w), a.ln1_mean.data(),
                       a.ln1_rstd.data(), N, C);
  }
  encoder_backward(G(wte_), G(wpe_), dres_.data(), batch.tokens.data(),
                   batch.positions.data(), N, C);
}

template class GPT<float>;
template class GPT<double>;

}  // namespace berth
