#include "runtime/model/gpt.h"

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>

#include "kernels/backend.h"
#include "parallel/context_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "runtime/core/check.h"

namespace berth {

// ---- construction and init ----------------------------------------------------------------------

template <typename T>
GPT<T>::GPT(const GPTConfig& cfg, int max_B, int max_T, const ModelShard& shard, Communicator* tp,
            int slots, Backend* backend)
    : cfg_(cfg),
      shard_(shard),
      be_(backend),
      mem_(backend != nullptr ? backend : &cpu_backend()),
      ops_(backend),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      layout_(gpt_param_layout(cfg, shard)),
      max_B_(max_B),
      max_T_(max_T) {
  BERTH_CHECK(max_B > 0 && max_T > 0, "batch shape must be positive, got B={} T={}", max_B,
              max_T);
  BERTH_CHECK(max_T <= cfg.maxT, "seq_len ({}) > max_seq_len ({})", max_T, cfg.maxT);
  BERTH_CHECK(slots >= 1, "a model needs at least one activation slot, got {}", slots);
  BERTH_CHECK(shard.tp == 1 || (tp_ != nullptr && tp_->size() == shard.tp &&
                                tp_->rank() == shard.tp_rank),
              "the model is split over tp = {} but the tp group has {} ranks", shard.tp,
              tp == nullptr ? 1 : tp->size());
  BERTH_CHECK(shard.tp == 1 || (std::is_same_v<T, float>), "tensor parallelism needs the fp32 model");
  Cq_ = cfg.C / shard.tp;
  NHl_ = cfg.NH / shard.tp;
  F_ = 4 * cfg.C / shard.tp;
  Vpl_ = cfg.Vp / shard.tp;
  voff_ = shard.tp_rank * Vpl_;
  const LayerRange range = stage_layers(cfg.L, shard.pp, shard.stage);
  const int L = int(range.size());
  const size_t N = size_t(max_B) * size_t(max_T), C = size_t(cfg.C);
  // Attention keeps, per layer, the probabilities of the causal blocks of sequences inside rows
  // (Σ NH·L² <= B·NH·T², this rank's heads) for the BLAS kernels of the CPU, or the log-sum-exp
  // (N × NH) for the flash-style kernels a GPU backend prefers.
  flash_ = std::is_same_v<T, float> && mem_->prefers_flash_attention();
  const size_t att = flash_ ? N * size_t(NHl_)
                            : size_t(max_B) * size_t(NHl_) * size_t(max_T) * size_t(max_T);
  Backend& m = *mem_;
  params_ = Buf(m, layout_.total);
  grads_ = Buf(m, layout_.total);
  m.zero(params_.data(), params_.bytes());
  m.zero(grads_.data(), grads_.bytes());
  int64_t elems = 0;
  auto alloc = [&](Buf& v, size_t n) {
    v = Buf(m, int64_t(n));
    m.zero(v.data(), v.bytes());
    elems += int64_t(n);
  };
  slots_.resize(size_t(slots));
  for (Slot& s : slots_) {
    s.residual.resize(size_t(L) + 1);
    for (auto& r : s.residual) alloc(r, N * C);
    s.layers.resize(size_t(L));
    for (LayerActs& a : s.layers) {
      alloc(a.ln1, N * C);
      alloc(a.ln1_mean, N);
      alloc(a.ln1_rstd, N);
      alloc(a.qkv, N * 3 * size_t(Cq_));
      alloc(a.atty, N * size_t(Cq_));
      alloc(a.att, att);
      alloc(a.res2, N * C);
      alloc(a.ln2, N * C);
      alloc(a.ln2_mean, N);
      alloc(a.ln2_rstd, N);
      alloc(a.fch, N * size_t(F_));
      alloc(a.fch_gelu, N * size_t(F_));
    }
    if (shard.last()) {
      alloc(s.lnf, N * C);
      alloc(s.lnf_mean, N);
      alloc(s.lnf_rstd, N);
      alloc(s.logits, N * size_t(Vpl_));
      alloc(s.losses, N);
      alloc(s.lse, N);
      s.losses_host.assign(N, T(0));
    }
    // the batch's index arrays (not activations: the plan does not count them)
    for (auto* b : {&s.tokens, &s.targets, &s.positions, &s.seq_ids})
      *b = DeviceBuffer<int32_t>(m, int64_t(N));
    s.cu_seqlens = DeviceBuffer<int32_t>(m, int64_t(N) + 1);
  }
  alloc(scratch_, N * C);
  alloc(dres_, N * C);
  if (!shard.last()) alloc(dout_, N * C);
  alloc(dln_, N * C);
  alloc(dqkv_, N * 3 * size_t(Cq_));
  alloc(datty_, N * size_t(Cq_));
  alloc(dfch_, N * size_t(F_));
  if (!flash_) alloc(datt_, att);
  activation_bytes_ = elems * int64_t(sizeof(T));
  // Offsets of every tensor, looked up once so a step does no name lookups.
  auto off = [&](const std::string& name) { return layout_.find(name).offset; };
  if (shard.first() || shard.last()) wte_ = off("wte");
  if (shard.first()) wpe_ = off("wpe");
  if (shard.last()) {
    lnf_w_ = off("ln_f.weight");
    lnf_b_ = off("ln_f.bias");
  }
  for (int64_t l = range.begin; l < range.end; l++) {
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
  std::vector<T> full, host(size_t(layout_.total), T(0));
  for (const ParamSpec& s : layout_.specs) {
    T* p = host.data() + s.offset;
    if (s.shape.size() == 1 && s.shard == ShardDim::kNone) {
      const T value = ends_with(s.name, ".weight") ? T(1) : T(0);  // LayerNorm weight 1, biases 0
      for (int64_t i = 0; i < s.numel; i++) p[i] = value;
      continue;
    }
    if (s.full_shape.size() == 1) {  // a sliced bias
      for (int64_t i = 0; i < s.numel; i++) p[i] = T(0);
      continue;
    }
    // The full tensor, drawn as one rank would, then this rank's slice.
    const int64_t full_numel = s.full_shape[0] * s.full_shape[1];
    full.assign(size_t(full_numel), T(0));
    const bool proj = ends_with(s.name, "attn.c_proj.weight") || ends_with(s.name, "mlp.c_proj.weight");
    const int64_t n = s.name == "wte" ? int64_t(cfg_.V) * cfg_.C : full_numel;  // padded rows 0
    fill_normal(full.data(), n, proj ? std_proj : std_base, name_seed(seed, s.name));
    slice_from_full(s, shard_.tp_rank, full.data(), p);
  }
  set_params(host);
}

template <typename T>
void GPT<T>::zero_grad() {
  mem_->zero(grads_.data(), grads_.bytes());
}

template <typename T>
std::vector<T> GPT<T>::params_host() const {
  std::vector<T> h(size_t(params_.size()));
  mem_->download(h.data(), params_.data(), params_.bytes());
  return h;
}

template <typename T>
std::vector<T> GPT<T>::grads_host() const {
  std::vector<T> h(size_t(grads_.size()));
  mem_->download(h.data(), grads_.data(), grads_.bytes());
  return h;
}

template <typename T>
void GPT<T>::set_params(const std::vector<T>& host) {
  BERTH_CHECK(int64_t(host.size()) == params_.size(),
              "set_params: {} values for a model of {} parameters", host.size(), params_.size());
  mem_->upload(params_.data(), host.data(), params_.bytes());
}

template <typename T>
void GPT<T>::upload_batch(Slot& sl, const PackedBatch& batch) {
  const size_t n = size_t(batch.N()) * sizeof(int32_t);
  BERTH_CHECK(batch.cu_seqlens.size() <= size_t(sl.cu_seqlens.size()),
              "batch has {} sequences, more than the {} tokens", batch.n_seqs(), batch.N());
  mem_->upload(sl.tokens.data(), batch.tokens.data(), n);
  mem_->upload(sl.targets.data(), batch.targets.data(), n);
  mem_->upload(sl.positions.data(), batch.positions.data(), n);
  mem_->upload(sl.cu_seqlens.data(), batch.cu_seqlens.data(),
               batch.cu_seqlens.size() * sizeof(int32_t));
  if (cp_ != nullptr) {  // ring attention masks by sequence id
    std::vector<int32_t> ids(size_t(batch.N()));
    for (int s = 0; s < batch.n_seqs(); ++s) {
      for (int i = batch.cu_seqlens[size_t(s)]; i < batch.cu_seqlens[size_t(s) + 1]; ++i) {
        ids[size_t(i)] = s;
      }
    }
    mem_->upload(sl.seq_ids.data(), ids.data(), n);  // consumed on return
  }
}

// ---- attention: per sequence on this rank, or ring attention over the cp group ------------------

template <typename T>
void GPT<T>::set_context_parallel(Communicator* cp) {
  const bool on = cp != nullptr && cp->size() > 1;
  constexpr bool fp32 = std::is_same_v<T, float>;
  BERTH_CHECK(!on || fp32, "context parallelism needs the fp32 model");
  cp_ = on ? cp : nullptr;
  if (!on) return;
  // Ring attention keeps the log-sum-exp (N × NH) per layer, not the probabilities (T² per row).
  const size_t lse = size_t(max_B_) * size_t(max_T_) * size_t(NHl_);
  int64_t freed = datt_.size();
  for (Slot& s : slots_) {
    for (LayerActs& a : s.layers) {
      freed += a.att.size() - int64_t(lse);
      a.att = Buf(*mem_, int64_t(lse));
    }
  }
  datt_ = Buf();
  const int64_t nc = int64_t(max_B_) * max_T_ * Cq_;
  for (Buf* b : {&cp_q_, &cp_k_, &cp_v_, &cp_dq_, &cp_dk_, &cp_dv_}) *b = Buf(*mem_, nc);
  activation_bytes_ -= freed * int64_t(sizeof(T));
}

template <typename T>
void GPT<T>::split_qkv_for_ring(const LayerActs& a, int N) {
  // qkv (N, 3C) → q, k, v (N, C): ring attention passes keys and values around on their own.
  const size_t row = sizeof(T) * size_t(Cq_), pitch = 3 * row;
  mem_->copy_2d(cp_q_.data(), row, a.qkv.data(), pitch, row, size_t(N));
  mem_->copy_2d(cp_k_.data(), row, a.qkv.data() + Cq_, pitch, row, size_t(N));
  mem_->copy_2d(cp_v_.data(), row, a.qkv.data() + 2 * Cq_, pitch, row, size_t(N));
}

template <typename T>
void GPT<T>::attention_fwd(LayerActs& a, Slot& sl, const PackedBatch& batch) {
  const int N = batch.N(), S = batch.n_seqs(), C = Cq_;
  if constexpr (std::is_same_v<T, float>) {
    if (cp_ != nullptr) {
      split_qkv_for_ring(a, N);
      // a.att keeps the log-sum-exp (N × NH), not probabilities.
      ring_attention_forward(*mem_, *cp_, a.atty.data(), a.att.data(), cp_q_.data(),
                             cp_k_.data(), cp_v_.data(), sl.seq_ids.data(), sl.positions.data(),
                             N, C, NHl_);
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (flash_) {  // a.att keeps the log-sum-exp (N × NH)
      ops_.attention_varlen_forward(a.atty.data(), a.att.data(), a.qkv.data(),
                                    sl.cu_seqlens.data(), batch.cu_seqlens.data(), S, C, NHl_);
      return;
    }
  }
  ops_.attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), sl.cu_seqlens.data(),
                         batch.cu_seqlens.data(), S, C, NHl_);
}

template <typename T>
void GPT<T>::attention_bwd(LayerActs& a, Slot& sl, const PackedBatch& batch) {
  const int N = batch.N(), S = batch.n_seqs(), C = Cq_;
  if constexpr (std::is_same_v<T, float>) {
    if (cp_ != nullptr) {
      split_qkv_for_ring(a, N);
      const size_t row = sizeof(T) * size_t(C), pitch = 3 * row;
      ring_attention_backward(*mem_, *cp_, cp_dq_.data(), cp_dk_.data(), cp_dv_.data(),
                              datty_.data(), a.atty.data(), a.att.data(), cp_q_.data(),
                              cp_k_.data(), cp_v_.data(), sl.seq_ids.data(),
                              sl.positions.data(), N, C, NHl_);
      mem_->copy_2d(dqkv_.data(), pitch, cp_dq_.data(), row, row, size_t(N));
      mem_->copy_2d(dqkv_.data() + C, pitch, cp_dk_.data(), row, row, size_t(N));
      mem_->copy_2d(dqkv_.data() + 2 * C, pitch, cp_dv_.data(), row, row, size_t(N));
      return;
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (flash_) {
      ops_.attention_varlen_backward(dqkv_.data(), datty_.data(), a.atty.data(), a.att.data(),
                                     a.qkv.data(), sl.cu_seqlens.data(), batch.cu_seqlens.data(),
                                     S, C, NHl_);
      return;
    }
  }
  ops_.attention_backward(dqkv_.data(), datt_.data(), datty_.data(), a.qkv.data(), a.att.data(),
                          sl.cu_seqlens.data(), batch.cu_seqlens.data(), S, C, NHl_);
}

// ---- forward ------------------------------------------------------------------------------------

template <typename T>
double GPT<T>::forward(const PackedBatch& batch, int slot) {
  BERTH_CHECK(batch.B <= max_B_ && batch.T <= max_T_,
              "batch {}x{} is larger than the model was sized for ({}x{})", batch.B, batch.T,
              max_B_, max_T_);
  BERTH_CHECK(slot >= 0 && slot < slots(), "activation slot {} of {}", slot, slots());
  Slot& sl = slots_[size_t(slot)];
  const int N = batch.N(), C = cfg_.C, L = int(idx_.size());
  upload_batch(sl, batch);
  if (shard_.first()) {
    vocab_parallel_embedding_forward(be_, tp_, sl.residual[0].data(), sl.tokens.data(),
                                     sl.positions.data(), P(wte_), P(wpe_), N, C, Vpl_, voff_);
  }
  for (int l = 0; l < L; l++) {
    const LayerIdx& ix = idx_[size_t(l)];
    LayerActs& a = sl.layers[size_t(l)];
    const T* x = sl.residual[size_t(l)].data();
    ops_.layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, P(ix.ln1_w),
                           P(ix.ln1_b), N, C);
    column_linear_forward(be_, a.qkv.data(), a.ln1.data(), P(ix.qkv_w), P(ix.qkv_b), N, C, 3 * Cq_);
    attention_fwd(a, sl, batch);
    row_linear_forward(be_, tp_, scratch_.data(), a.atty.data(), P(ix.proj_w), P(ix.proj_b), N, Cq_,
                       C);
    ops_.residual_forward(a.res2.data(), x, scratch_.data(), int64_t(N) * C);
    ops_.layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(),
                           P(ix.ln2_w), P(ix.ln2_b), N, C);
    column_linear_gelu_forward(be_, a.fch_gelu.data(), a.fch.data(), a.ln2.data(), P(ix.fc_w),
                               P(ix.fc_b), N, C, F_);
    row_linear_forward(be_, tp_, scratch_.data(), a.fch_gelu.data(), P(ix.fcproj_w), P(ix.fcproj_b),
                       N, F_, C);
    ops_.residual_forward(sl.residual[size_t(l) + 1].data(), a.res2.data(), scratch_.data(),
                          int64_t(N) * C);
  }
  if (!shard_.last()) return 0;
  ops_.layernorm_forward(sl.lnf.data(), sl.lnf_mean.data(), sl.lnf_rstd.data(),
                         sl.residual[size_t(L)].data(), P(lnf_w_), P(lnf_b_), N, C);
  // LM head tied to wte: a column-parallel linear over this rank's vocabulary rows.
  column_linear_forward(be_, sl.logits.data(), sl.lnf.data(), P(wte_),
                        static_cast<const T*>(nullptr), N, C, Vpl_);
  vocab_parallel_cross_entropy_forward(be_, tp_, sl.losses.data(), sl.lse.data(), sl.logits.data(),
                                       sl.targets.data(), N, cfg_.V, Vpl_, voff_);
  mem_->download(sl.losses_host.data(), sl.losses.data(), size_t(N) * sizeof(T));
  double total = 0;
  for (int n = 0; n < N; n++) total += double(sl.losses_host[size_t(n)]);
  return total;
}

// ---- backward -----------------------------------------------------------------------------------

template <typename T>
void GPT<T>::backward(const PackedBatch& batch, T dloss, int slot) {
  BERTH_CHECK(slot >= 0 && slot < slots(), "activation slot {} of {}", slot, slots());
  Slot& sl = slots_[size_t(slot)];
  const int N = batch.N(), C = cfg_.C, L = int(idx_.size());
  if (shard_.last()) {
    // LM head (tied): dlogits overwrite the logits in place
    vocab_parallel_cross_entropy_backward(be_, tp_, sl.logits.data(), sl.logits.data(),
                                          sl.lse.data(), sl.targets.data(), dloss, N, cfg_.V,
                                          Vpl_, voff_);
    column_linear_backward(be_, tp_, dln_.data(), G(wte_), static_cast<T*>(nullptr),
                           sl.logits.data(), sl.lnf.data(), P(wte_), N, C, Vpl_);
    mem_->zero(dres_.data(), size_t(N) * size_t(C) * sizeof(T));
    ops_.layernorm_backward(dres_.data(), G(lnf_w_), G(lnf_b_), dln_.data(),
                            sl.residual[size_t(L)].data(), P(lnf_w_), sl.lnf_mean.data(),
                            sl.lnf_rstd.data(), N, C);
  } else {
    mem_->copy(dres_.data(), dout_.data(), size_t(N) * size_t(C) * sizeof(T));
  }
  // dres_ holds d(loss)/d(residual) and is updated in place through every block.
  for (int l = L - 1; l >= 0; l--) {
    const LayerIdx& ix = idx_[size_t(l)];
    LayerActs& a = sl.layers[size_t(l)];
    row_linear_gelu_backward(be_, dfch_.data(), G(ix.fcproj_w), G(ix.fcproj_b), dres_.data(),
                             a.fch_gelu.data(), P(ix.fcproj_w), a.fch.data(), N, F_, C);
    column_linear_backward(be_, tp_, dln_.data(), G(ix.fc_w), G(ix.fc_b), dfch_.data(),
                           a.ln2.data(), P(ix.fc_w), N, C, F_);
    ops_.layernorm_backward(dres_.data(), G(ix.ln2_w), G(ix.ln2_b), dln_.data(), a.res2.data(),
                            P(ix.ln2_w), a.ln2_mean.data(), a.ln2_rstd.data(), N, C);
    row_linear_backward(be_, datty_.data(), G(ix.proj_w), G(ix.proj_b), dres_.data(), a.atty.data(),
                        P(ix.proj_w), N, Cq_, C);
    attention_bwd(a, sl, batch);
    column_linear_backward(be_, tp_, dln_.data(), G(ix.qkv_w), G(ix.qkv_b), dqkv_.data(),
                           a.ln1.data(), P(ix.qkv_w), N, C, 3 * Cq_);
    ops_.layernorm_backward(dres_.data(), G(ix.ln1_w), G(ix.ln1_b), dln_.data(),
                            sl.residual[size_t(l)].data(), P(ix.ln1_w), a.ln1_mean.data(),
                            a.ln1_rstd.data(), N, C);
  }
  if (shard_.first()) {
    vocab_parallel_embedding_backward(be_, tp_, G(wte_), G(wpe_), dres_.data(), sl.tokens.data(),
                                      sl.positions.data(), N, C, Vpl_, voff_);
  }
}

template class GPT<float>;
template class GPT<double>;

}  // namespace berth
