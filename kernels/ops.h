// The op list of berth: every forward and backward the GPT model needs, with shapes.
//
// Dimensions, named once:
//   B  micro-batch rows          T  sequence length (tokens per row)    N  = B*T tokens
//   C  model width (d_model)     NH attention heads                     HS = C/NH head size
//   V  real vocabulary size      Vp padded vocabulary (multiple of 128) L  layers
//   S  number of sequences (documents) described by cu_seqlens
//
// Conventions (all backends):
//   - Kernels take raw pointers and ints (llm.c style); shapes in the comment before each op.
//   - Tensors are contiguous, row-major. Linear weights are stored (OC, IC): out = inp · wᵀ + b.
//   - Parameter-gradient outputs ACCUMULATE (+=) so micro-batches sum into one buffer.
//   - Activation-gradient outputs OVERWRITE, except layernorm_backward's dinp, which accumulates:
//     every layernorm input is a residual stream whose gradient already holds the skip path.
//   - `cu_seqlens` (int32, S+1 entries, flash-attention varlen layout) cut the N tokens into
//     sequences; attention is causal within each and never crosses them. Rows of a (B,T) batch are
//     always sequence boundaries, so plain causal attention is cu_seqlens = {0, T, 2T, ..., N}.
//   - Targets of -1 are ignored by the loss (no prediction at a document end or on padding).
//   - Pointers may alias only where an op says so. No op allocates memory.
//
// The CPU reference (kernels/cpu) is templated on the scalar type: float for training, double for
// the finite-difference gradient tests. kernels/cuda implements the same names.
#pragma once

#include <cstdint>
#include <string>

namespace berth::cpu {

// ---- embeddings -------------------------------------------------------------------------------
// out (N,C) = wte[tokens[n]] + wpe[positions[n]]; tokens, positions (N); wte (Vp,C); wpe (maxT,C)
template <typename T>
void encoder_forward(T* out, const int32_t* tokens, const int32_t* positions, const T* wte,
                     const T* wpe, int N, int C);
// dwte (Vp,C) +=, dwpe (maxT,C) += scatter of dout (N,C)
template <typename T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens,
                      const int32_t* positions, int N, int C);

// ---- layernorm (eps 1e-5) ---------------------------------------------------------------------
// out (N,C); mean, rstd (N) saved for backward; inp (N,C); weight, bias (C)
template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int N, int C);
// dinp (N,C) += ; dweight, dbias (C) += ; dout (N,C)
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, const T* mean, const T* rstd, int N, int C);

// ---- linear layer (GEMM through BLAS) ---------------------------------------------------------
// out (N,OC) = inp (N,IC) · weightᵀ (OC,IC) + bias (OC, may be null)
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC);
// dinp (N,IC) = dout · weight (overwrite; skipped when null); dweight (OC,IC) += doutᵀ · inp
// (skipped when null); dbias (OC) += Σ_n dout (skipped when null)
template <typename T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                     int N, int IC, int OC);

// ---- bfloat16 rounding (bf16 GEMMs) -----------------------------------------------------------
// x rounded to the nearest bfloat16 (1 sign, 8 exponent, 7 mantissa bits), ties to even, kept in
// fp32: NaN stays NaN, values past bf16's largest finite value round to ±inf (as CUDA's
// __float2bfloat16_rn). A bf16 GEMM is, by definition here, matmul_* on inputs rounded so (the
// products of two bf16 values are exact in fp32; sums accumulate in fp32, outputs stay fp32).
float round_to_bf16(float x);
// out (n) = round_to_bf16(inp) element-wise (out may alias inp)
void round_to_bf16(float* out, const float* inp, int64_t n);

// ---- causal attention per sequence ------------------------------------------------------------
// qkv (N,3C) holds q | k | v, head h at columns [h*HS, (h+1)*HS) of each third.
// out (N,C); att (attention_att_size) saves the probabilities for backward: for sequence s of
// length L_s and head h, an L_s×L_s row-major block (zero above the diagonal).
int64_t attention_att_size(const int32_t* cu_seqlens, int S, int NH);
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, const int32_t* cu_seqlens, int S, int C,
                       int NH);
// dqkv (N,3C) overwritten; datt is scratch of attention_att_size (contents undefined after)
template <typename T>
void attention_backward(T* dqkv, T* datt, const T* dout, const T* qkv, const T* att,
                        const int32_t* cu_seqlens, int S, int C, int NH);

// ---- attention of a query block against a key/value block (ring attention) ------------------
// q (nq, C), k and v (nk, C), heads at column blocks of HS = C/NH. Token i of a block belongs to
// sequence seq[i] >= 0 at global position pos[i]; query i sees key j when seq[j] == seq[i] and
// pos[j] <= pos[i]. out (nq, C) = softmax-weighted values within this block (0 where a query sees
// no key), lse (nq, NH) = log Σ exp(scores) over the keys it sees (−inf where none).
void attention_block_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const int32_t* q_seq, const int32_t* q_pos,
                             const int32_t* k_seq, const int32_t* k_pos, int nq, int nk, int C,
                             int NH);
// Merges a block's (out_b, lse_b) into the running (out, lse) of the same queries:
// lse' = logaddexp(lse, lse_b), out' = e^(lse−lse')·out + e^(lse_b−lse')·out_b (fp32, stable).
void attention_lse_merge(float* out, float* lse, const float* out_b, const float* lse_b, int nq,
                         int C, int NH);
// Backward of one block given the final out, lse of the queries and dout: dq (nq, C), dk and dv
// (nk, C) are accumulated (+=). P = exp(scores − lse); dV += Pᵀ dout; dS = P ∘ (dout·vᵀ − D) with
// D = rowsum(dout ∘ out); dQ += dS k / √HS; dK += dSᵀ q / √HS.
void attention_block_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                              const float* lse, const float* q, const float* k, const float* v,
                              const int32_t* q_seq, const int32_t* q_pos, const int32_t* k_seq,
                              const int32_t* k_pos, int nq, int nk, int C, int NH);

// ---- causal attention per sequence, flash-style (never an L×L matrix) -------------------------
// The same attention as attention_forward on qkv (N,3C) and cu_seqlens (S+1 entries, N tokens),
// by an online softmax per (query, head): out (N,C), and lse (N,NH) = log Σ exp(scores) over the
// keys the query sees instead of the probabilities. fp32, exact exp.
void attention_varlen_forward(float* out, float* lse, const float* qkv, const int32_t* cu_seqlens,
                              int S, int C, int NH);
// dqkv (N,3C) overwritten, from the forward's out and lse and dout (scores recomputed):
// D = rowsum(dout ∘ out); P = exp(scores − lse); dV = Pᵀ dout; dS = P ∘ (dout·vᵀ − D);
// dQ = dS k / √HS; dK = dSᵀ q / √HS.
void attention_varlen_backward(float* dqkv, const float* dout, const float* out, const float* lse,
                               const float* qkv, const int32_t* cu_seqlens, int S, int C, int NH);

// ---- GELU (tanh approximation) ----------------------------------------------------------------
// out (n) = gelu(inp); dinp (n) = gelu'(inp) * dout (overwrite; dinp may alias dout)
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n);
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n);

// ---- residual ---------------------------------------------------------------------------------
// out (n) = a + b (out may alias a or b). Its backward is the identity to both inputs.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n);

// ---- softmax + cross-entropy over the real vocabulary -----------------------------------------
// logits (N,Vp), only columns < V take part (padded columns never receive probability);
// losses (N) = logsumexp(logits[n,:V]) - logits[n, targets[n]], 0 where targets[n] == -1.
template <typename T>
void crossentropy_forward(T* losses, const T* logits, const int32_t* targets, int N, int V,
                          int Vp);
// dlogits (N,Vp) = dloss * (softmax(logits[n,:V]) - onehot(target)), 0 in padded columns and on
// rows with target -1. `dloss` is the gradient of the total loss w.r.t. each token's loss
// (1/number of target tokens for a mean). dlogits may alias logits (in place).
template <typename T>
void crossentropy_backward(T* dlogits, const T* logits, const int32_t* targets, T dloss, int N,
                           int V, int Vp);

// ---- tensor parallelism: vocabulary shards, bias after a reduction --------------------------------
// This rank holds wte rows [offset, offset + Vp_local). out (N,C) = wte_local[tokens[n] − offset]
// where the token is this rank's, else 0, plus wpe[positions[n]] when wpe is not null. Summed over
// the tp ranks (one of them passing wpe) it is encoder_forward.
template <typename T>
void vocab_embedding_forward(T* out, const int32_t* tokens, const int32_t* positions,
                             const T* wte_local, const T* wpe, int N, int C, int Vp_local,
                             int offset);
// dwte_local += dout at this rank's tokens; dwpe += dout at the positions when not null.
template <typename T>
void vocab_embedding_backward(T* dwte_local, T* dwpe, const T* dout, const int32_t* tokens,
                              const int32_t* positions, int N, int C, int Vp_local, int offset);
// Cross-entropy over vocabulary shards, in three steps around two all-reduces over tp. logits_local
// (N, Vp_local) hold global columns [offset, offset + Vp_local), of which the first `real` are
// real vocabulary (global index < V).
//   mx (N) = max over the row's real columns (−inf where none)              → all-reduce MAX
template <typename T>
void vocab_ce_max(T* mx, const T* logits_local, int N, int real, int Vp_local);
//   st (2N): st[2n] = Σ exp(x − mx[n]) over the real columns, st[2n+1] = the target's logit when
//   this rank holds it, else 0                                               → all-reduce SUM
template <typename T>
void vocab_ce_partials(T* st, const T* logits_local, const T* mx, const int32_t* targets, int N,
                       int real, int Vp_local, int offset);
//   lse (N) = mx + log st[2n]; losses (N) = lse − st[2n+1], 0 where the target is −1
template <typename T>
void vocab_ce_finish(T* losses, T* lse, const T* mx, const T* st, const int32_t* targets, int N);
// dlogits_local = dloss · (exp(x − lse) − onehot(target)) on the real columns, 0 on the others and
// on rows with target −1. May alias logits_local.
template <typename T>
void vocab_ce_backward(T* dlogits_local, const T* logits_local, const T* lse,
                       const int32_t* targets, T dloss, int N, int real, int Vp_local, int offset);
// out (N,OC) += bias (OC) on every row (a row-parallel linear's bias, after its all-reduce).
template <typename T>
void bias_add(T* out, const T* bias, int N, int OC);

// ---- optimizer --------------------------------------------------------------------------------
// AdamW step t (1-based) on n contiguous parameters, bias-corrected, decoupled weight decay:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g²;  p -= lr (m̂/(sqrt(v̂)+eps) + wd p)
// grads are multiplied by grad_scale first (global-norm clipping).
template <typename T>
void adamw_update(T* params, const T* grads, T* m, T* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, float grad_scale, int64_t t);
// Σ x² over n values, accumulated in double; deterministic for a fixed thread count.
template <typename T>
double sum_squares(const T* x, int64_t n);

// ---- threads ----------------------------------------------------------------------------------
// Threads used by the CPU kernels: the OpenMP loops and OpenBLAS (n <= 0: leave as is).
void set_num_threads(int n);
int num_threads();
// The cores this process may run on (its CPU affinity) and the host's online cores.
int affinity_cores();
int online_cores();
// "" when `ranks_on_host` ranks of `threads` threads each fit the cores (or run one thread each),
// else a warning that says how they are oversubscribed and what to set: threads beyond a rank's
// own cores, or the host's ranks together beyond its cores (ranks not bound: `--bind-to none`).
// OpenMP threads that share a core wait for each other at every parallel loop: steps become several
// times slower (the tiny config, 2 ranks x 2 threads on 2 cores: 60 steps in 47 s, not 10 s).
std::string oversubscription_warning(int ranks_on_host, int threads, int affinity_cores,
                                     int online_cores);

}  // namespace berth::cpu
