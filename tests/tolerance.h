// The one table of test tolerances (STYLE.md rule 12), by purpose and dtype, and the comparison
// every test uses: |got − ref| ≤ atol + rtol·|ref|, elementwise.
//
// Each tolerance states the worst error measured when it was set (tests/test_kernels.cpp on the
// CPU kernels, OpenBLAS, GCC -O3, x86-64) and keeps a margin of at least 8× over it ("used" below =
// worst |Δ| / (atol + rtol·|ref|)). Tighten freely; loosen only with the new measurement written
// next to the value. Run a test binary with BERTH_TOL_REPORT=1 to print the measured errors of
// every comparison (relative error counted only where |ref| ≥ 1e-3).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace berth::test {

struct Tol {
  double atol;
  double rtol;
};

// ---- the table ----------------------------------------------------------------------------------

// Same operations in the same order (a packed batch vs each sequence alone, in place vs out of
// place, exactly representable inputs): bit-identical results required.
inline constexpr Tol kExact{0.0, 0.0};

// fp64 analytic gradient vs central differences (f(x+h) − f(x−h)) / 2h, h = 1e-6, of a scalar
// loss Σ out·R over O(1) inputs: truncation O(h²) ≈ 1e-12 plus cancellation O(eps·|loss|/h) ≈
// 1e-10. Measured worst over all ops and a composed GPT-2 layer: |Δ| = 2.2e-9 (layernorm dbias),
// used 0.10.
inline constexpr Tol kFiniteDiffF64{1e-8, 1e-7};

// An fp64 kernel vs a direct double / long double evaluation of the same formula (layernorm,
// matmul, attention, GELU, cross-entropy loss, AdamW step, sum of 1000 squares): rounding only.
// Measured worst: |Δ| = 6.7e-16 on O(1) values; 4.1e-12 on a sum of squares of 3e3 (|Δ|/|ref| =
// 1.4e-15); used 0.014.
inline constexpr Tol kRoundingF64{1e-14, 1e-13};

// One double-accumulated reduction split over 1 vs 2 OpenMP threads: only the summation order of
// n positive terms changes, bounded by n·eps ≈ 1.1e-13 relative for n = 1000.
// Measured (sum_squares of 1000 values): |Δ|/|ref| = 1.2e-15, used 0.012.
inline constexpr Tol kSerialVsParallelSumF64{0.0, 1e-13};

// The float instantiation of an op vs the double one on the same float-representable inputs
// (O(1) values, logits in ±8, GELU inputs in ±5; reductions of ≤ 16 terms; the float kernels use
// the fast exp/tanh of kernels/cpu/fast_math.h). Measured worst: |Δ| = 1.2e-6 on gelu dinp at
// |x| ≈ 5, where 1 − tanh² cancels in float (used 0.12); every other op |Δ| ≤ 3.6e-7 (used ≤ 0.03).
inline constexpr Tol kFp32VsFp64{1e-5, 1e-5};

// Training losses of the same run with 1 vs 2 OpenMP/OpenBLAS threads over 20 steps (fp32): GEMM
// blocking and the grad-norm partial sums change with the thread count. The bound; measured
// worst |Δ|/|ref| over the 20 steps of tests/test_train.cpp: 2.9e-8.
inline constexpr Tol kThreadsLoss{0.0, 1e-6};

// dp ranks vs one rank on the same global batch, fp32, 20 AdamW steps (tests/test_data_parallel,
// mpirun -np 2 and 4): the gradient sums of B·dp rows are formed in another order (per-rank GEMMs,
// micro-batch accumulation, all-reduce). Losses: the 1e-5; measured worst 7.2e-8.
// Final parameters: the 1e-5 holds for the whole vector in relative L2 norm (measured
// worst 1.6e-6). Element-wise it does not: AdamW divides by sqrt(v), so an element whose
// gradient is near zero at some step turns a rounding difference into a visible one. Measured
// worst element: |Δ| 1.3e-5, |Δ|/|ref| 1.1e-3 (np 2, 3 micro-batches; 15 % of this bound).
inline constexpr Tol kDataParallelLoss{0.0, 1e-5};
inline constexpr double kDataParallelParamsL2 = 1e-5;
inline constexpr Tol kDataParallelParams{5e-5, 3e-3};

// Every parallel layout vs one rank with bf16 GEMMs (run.precision = "bf16"), 20 AdamW steps, 4
// micro-batches (tests/test_model_parallel, np 2, 4, 8). The layouts differ by fp32 summation
// order as in fp32, but a value that lands on the other side of a bf16 rounding boundary moves by
// 2^-8 relative, so the differences grow: measured worst loss |Δ|/|ref| 3.3e-5 and parameters
// rel L2 6.2e-4 (tp2 dp2 and tp2 pp2 dp2, 2026-12-03). bf16 vs fp32 on one rank differ by 1.37e-4
// and 2.34e-3, about 4× more, so the bounds sit between (1.8× and 1.9× the worst layout) and the
// test checks that bf16 vs fp32 exceeds them by 1.5×: the bounds tell the precisions apart.
inline constexpr Tol kBf16LayoutLoss{0.0, 6e-5};
inline constexpr double kBf16LayoutParamsL2 = 1.2e-3;

// The same with attention on the tiled tensor-core kernels too (bf16 on the CUDA backend's ops run
// on the host, heads of 32; tests/test_model_parallel EveryLayoutInBf16OnTheCudaBackendsOps…,
// np 2, 4, 8, 2026-12-03). Layouts without cp: worst loss |Δ|/|ref| 1.2e-4 (tp2), parameters rel
// L2 5.9e-4 (tp2 dp2); bounds 2×. bf16 vs fp32 on one rank: losses only 3e-4 to 7e-4 apart in
// this small model, parameters 5.3e-3 to 5.9e-3, so the parameters' bound is what tells the
// precisions apart (the test checks bf16 vs fp32 exceeds it by 1.5×).
inline constexpr Tol kBf16TensorCoreLayoutLoss{0.0, 2.5e-4};
inline constexpr double kBf16TensorCoreLayoutParamsL2 = 1.2e-3;
// With cp the ring merges per-block softmaxes whose P was rounded to bf16 block by block, so it
// differs from one rank's single online softmax by bf16 rounding itself: measured tp2 dp2 cp2
// losses 3.4e-4 and parameters 2.7e-3, about half of bf16 vs fp32's 5.3e-3 on the same rows.
// Bounds 1.8× and 1.5× the measured.
inline constexpr Tol kBf16RingLayoutLoss{0.0, 6e-4};
inline constexpr double kBf16RingLayoutParamsL2 = 4e-3;

// The same documents packed differently (BFD / next-fit / padded, other rows per batch), fp64
// model: per-document losses and summed gradients differ only by summation order. The issue's
// bound; measured worst: per-document losses bit-identical, gradients |Δ|/|ref| 4.4e-15.
inline constexpr Tol kPackingF64{1e-12, 1e-6};

// Tensor-parallel primitives (fp32) vs one rank: only the order of the sums changes (all-reduced
// partial GEMMs, OpenBLAS kernels chosen by shard shape, max/Σexp over vocabulary shards). Sums of
// up to 256 products of O(1) values. Measured worst (tests/test_tensor_parallel.cpp, np 2 and 4):
// |Δ| = 7.6e-6 (column dw), 4.3e-6 (column dinp, row out); used 0.10 at {4e-5, 1e-5}.
inline constexpr Tol kTensorParallel{4e-5, 1e-5};

// Ring attention (fp32, blocks merged by their log-sum-exp) vs single-rank attention (fp32,
// cpu::attention_*) and a double LSE, documents up to 2039 tokens, O(1) inputs. Measured worst
// (tests/test_context_parallel.cpp, np 1..4): |Δ| = 7.9e-6 (dv), used 0.063.
inline constexpr Tol kRingAttention{1e-5, 1e-4};

// A Backend's fp32 ops vs the CPU reference on the same float inputs (tests/test_backend.cpp: O(1)
// values, logits in ±4, GELU inputs in ±6, sums of ≤ 128 products). The CUDA thread bodies use
// libm-style expf/tanhf and sequential sums where the reference uses fast_math.h and BLAS.
// Measured worst on host-items (2026-12-03): |Δ| = 3.4e-6 on gelu dinp (1 − tanh² cancels at
// |x| ≈ 5, as in kFp32VsFp64; used 0.11), every other op |Δ| ≤ 1.9e-6 (used ≤ 0.02). On a GPU
// (cuBLAS blocking, device expf): not measured yet.
inline constexpr Tol kBackendF32{3e-5, 1e-4};

// The GELU of cuBLASLt's GELU_AUX_BIAS epilogue (the CUDA backend's fused MLP layer in bf16)
// against kernels/ops.h gelu_forward: the same tanh form, but cuBLASLt does not document how it
// evaluates tanh. A hardware tanh.approx (relative error 2^-11) moves gelu by up to 5e-4 near
// x = -2, where 1 + tanh is small; this allows that. Not measured: no GPU has run it yet.
inline constexpr Tol kCublasLtGelu{1e-3, 1e-3};

// The GELU derivative of cuBLASLt's DGELU epilogue (the MLP's backward in bf16) against
// kernels/ops.h gelu_backward, on a gradient (dout·W) of O(1) and pre-activations from N(0, 1).
// gelu'(x) = ½(1 + t) + ½·x·(1 − t²)·u' moves by δt·|½ − x·t·u'| for an error δt in t = tanh(u):
// with a tanh.approx (2^-11) that is 8.6e-4 at x = -2 and 2.3e-3 at x = -3 (one value in 700
// lies beyond). This allows x = -3 at |dout·W| = 2. Not measured: no GPU has run it yet.
inline constexpr Tol kCublasLtDgelu{5e-3, 5e-3};

// Mean training losses over 20 AdamW steps of the tiny packed model (tests/test_model_backend.cpp),
// the CUDA backend's ops (run on the host) vs the CPU backend: the bound for CPU vs GPU in
// fp32 mode. Measured worst |Δ|/|ref| = 8.8e-7 (2026-12-03, used 0.088).
inline constexpr Tol kBackendLoss{0.0, 1e-5};

// ---- comparison ---------------------------------------------------------------------------------

// Checks |got[i] − ref[i]| ≤ atol + rtol·|ref[i]| for i < n; a NaN anywhere fails. Each failure is
// a gtest non-fatal failure naming `what`, the index and both values; after kMaxReported the rest
// are only counted. Returns true when all elements pass.
inline bool expect_close(const double* got, const double* ref, int64_t n, Tol tol,
                         const char* what) {
  constexpr int64_t kMaxReported = 5;
  int64_t n_bad = 0;
  double max_abs = 0, max_rel = 0, max_used = 0;  // for BERTH_TOL_REPORT
  for (int64_t i = 0; i < n; i++) {
    const double diff = std::fabs(got[i] - ref[i]);
    const double bound = tol.atol + tol.rtol * std::fabs(ref[i]);
    const bool ok = diff <= bound;  // false for NaN
    if (!(diff <= max_abs)) max_abs = diff;
    if (std::fabs(ref[i]) >= 1e-3 && !(diff / std::fabs(ref[i]) <= max_rel)) {
      max_rel = diff / std::fabs(ref[i]);
    }
    if (bound > 0 && !(diff / bound <= max_used)) max_used = diff / bound;
    if (ok) continue;
    if (n_bad < kMaxReported) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "[%lld]: got %.17g, expected %.17g (|diff| %.3g > %.3g = atol %.3g + "
                    "rtol %.3g * |expected|)",
                    static_cast<long long>(i), got[i], ref[i], diff, bound, tol.atol, tol.rtol);
      ADD_FAILURE() << what << msg;
    }
    n_bad++;
  }
  if (n_bad > kMaxReported) {
    ADD_FAILURE() << what << ": " << n_bad << " of " << n << " elements out of tolerance ("
                  << n_bad - kMaxReported << " more not shown)";
  }
  if (std::getenv("BERTH_TOL_REPORT") != nullptr) {
    std::printf(
        "[tol] %-36s n=%-4lld max|diff| %.2g, max|diff|/|ref| (|ref|>=1e-3) %.2g, "
        "tolerance used %.2g\n",
        what, static_cast<long long>(n), max_abs, max_rel, max_used);
  }
  return n_bad == 0;
}

}  // namespace berth::test
