// Pre-flight plan (docs/plan.md): what a training config needs — parameters, FLOPs, per-rank
// memory as berth's kernels keep it, step time and cost on a hardware profile — and which parallel
// layout of N devices fits best. Pure arithmetic: no MPI, no allocation of the model.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace berth {

// One device type. GPU profiles describe berth's CUDA backend as it is: fp32 weights, gradients,
// moments and activations; GEMMs in fp32 without tensor cores (run.precision = "fp32") or on bf16
// inputs with fp32 accumulation (run.precision = "bf16", at the bf16 peak); attention in fp32
// keeping only the log-sum-exp. The CPU profile describes berth's fp32 reference kernels (the
// attention probabilities kept for backward; bf16 GEMMs emulated at the fp32 rate).
struct HardwareProfile {
  std::string name;                 // "h100", "cpu", or the calibrated host's name
  std::string source;               // "built-in" or how it was measured
  double peak_flops = 0;            // dense FLOP/s per device: bf16 tensor cores on a GPU, fp32 on
                                    // the CPU (what MFU is measured against)
  double fp32_flops = 0;            // GPUs: dense fp32 FLOP/s without tensor cores (0 = peak)
  double matmul_efficiency = 0.5;   // share of peak the model's GEMMs reach (built-in profiles)
  // Measured GEMM rate by size (cube root of M·N·K) → FLOP/s per device, ascending; when set,
  // used instead of peak × efficiency (interpolated in log size).
  std::vector<std::pair<double, double>> gemm_rates;
  double mem_bandwidth = 0;         // bytes/s per device, for memory-bound ops
  // Measured rates of berth's own CPU kernels (calibrated profiles; 0 / empty = derive from the
  // figures above): causal attention forward + backward by sequence length → FLOP/s, the ring
  // attention block kernel's FLOP/s, and seconds per element (forward + backward) of the
  // memory-bound ops.
  std::vector<std::pair<double, double>> attention_rates;
  double block_attention_rate = 0;
  double layernorm_s = 0, gelu_s = 0, residual_s = 0, crossentropy_s = 0, adamw_s = 0;
  double grad_pass_s = 0;  // per parameter and step: zeroing the gradients and their norm
  double mem_capacity = 0;          // bytes per device
  double intra_bandwidth = 0;       // bytes/s per device between devices of one node (ring bus bw)
  double inter_bandwidth = 0;       // bytes/s per device between nodes
  double latency_s = 0;             // per collective or transfer
  int devices_per_node = 8;
  // GPUs: the shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin), in
  // bytes; berth's tiled attention needs tiled_attention_shared_bytes (runtime/core/backend.h).
  // 0 = not given (taken to be enough).
  double block_shared_bytes = 0;
  bool cpu = false;  // fp32 reference kernels (else the CUDA backend)
};

// "a100", "h100", "h200" or "cpu" (an uncalibrated guess: run `berth plan --calibrate`); throws
// Error naming the known profiles otherwise.
HardwareProfile builtin_profile(const std::string& name);

// A profile as JSON (what `berth plan --calibrate` writes) and back. Reading checks every key:
// unknown keys, missing or non-positive figures are errors naming the file and the key.
std::string hardware_profile_json(const HardwareProfile& h);
HardwareProfile read_hardware_profile(const std::string& path);
// Whether `path` holds a hardware profile (a JSON object of format "berth-hardware-profile"):
// `berth plan --calibrate` replaces only such a file.
bool is_hardware_profile_file(const std::string& path);

struct PlanModel {
  int64_t L = 0, NH = 0, C = 0, V = 0, maxT = 0;
};

struct PlanLayout {
  int64_t tp = 1, pp = 1, cp = 1, dp = 1, zero = 0, microbatches = 1;
  bool afab = false;  // schedule "afab" (else 1F1B)
  int64_t world() const { return tp * pp * cp * dp; }
};

struct PlanInput {
  PlanModel model;
  int64_t seq_len = 0, micro_batch_size = 0, steps = 0;
  PlanLayout layout;
  // Σ over the documents of a row of L², averaged over rows: the attention work of packed rows
  // (T² for one sequence per row, the default when 0).
  double attn_sq_per_row = 0;
  // The share of row slots that are document tokens (packed and padded rows; 0 = full rows):
  // tokens per step, tokens/s and MFU count document tokens, as berth train does.
  double token_fill = 0;
  double data_bytes = 0;      // the token datasets a rank holds in memory (berth loads them whole)
  bool bf16 = false;          // run.precision = "bf16": GEMMs on bf16 inputs (else fp32)
  // data.pack_align of a packed or padded run (0: automatic, 2·cp, or stream mode): under cp it
  // must be a multiple of 2·cp.
  int64_t pack_align = 0;
  // An evaluation reads eval_batches batches of dp × micro_batch_size rows of data.val, which
  // holds val_rows_by_cp[cp] rows in one pass (packed and padded rows depend on cp through the
  // automatic alignment 2·cp); a cp not listed (no evaluation, or rows unknown) is not checked.
  // berth train refuses a layout whose evaluation needs more rows; make_plan says it does not fit.
  int64_t eval_batches = 0;
  std::vector<std::pair<int64_t, int64_t>> val_rows_by_cp;
  int64_t val_rows(int64_t cp) const {  // -1: not known
    for (const auto& [c, rows] : val_rows_by_cp)
      if (c == cp) return rows;
    return -1;
  }
  // The run saves checkpoints (checkpoint.interval > 0 or checkpoint.final).
  bool saves_checkpoints = true;
  std::vector<std::string> notes;  // what the input could not account for, printed with the plan
  // What berth train refuses in this config besides its layout (its data settings and files),
  // each with its advice: berth plan and reserve --config refuse the config too.
  std::vector<std::string> refusals;
};

// Parameter counts. `total` counts the real vocabulary (GPT-2 124M: 124,439,808 at V = 50257);
// `padded` the model as stored (Vp rows of wte, padded to 128·tp).
struct ParamCounts {
  int64_t total = 0, embedding = 0, padded = 0;
  std::vector<int64_t> per_stage;  // parameters each pipeline stage holds (its tp slice × tp)
};
ParamCounts count_params(const PlanModel& m, const PlanLayout& l);

// Model FLOPs per token of training (forward + backward): 6 × (non-embedding parameters + LM head)
// plus attention 12·L·C·(Σ L²)/T (the CPU kernels compute whole L×L blocks; the GPU kernels skip
// the masked half, so 6 instead of 12 there). Per step and per run multiply by the tokens.
double flops_per_token(const PlanModel& m, double seq_len, double attn_sq_per_row, bool cpu);

// One rank's memory, bytes.
struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, workspace = 0, comm = 0,
         data = 0;
  double total() const { return params + grads + optimizer + activations + workspace + comm + data; }
};

struct CommVolume {  // bytes one rank moves per step, by group
  double tp = 0, cp = 0, pp = 0, dp = 0;
};

struct StepTime {  // seconds of one step on the critical path
  double compute = 0, tp_comm = 0, cp_comm = 0, pp_comm = 0, dp_comm = 0, bubble = 0,
         optimizer = 0;
  double total() const { return compute + tp_comm + cp_comm + pp_comm + dp_comm + bubble + optimizer; }
};

struct Plan {
  PlanInput input;
  HardwareProfile hw;
  ParamCounts params;
  double flops_per_token = 0, tokens_per_step = 0, flops_per_step = 0, flops_total = 0;
  std::vector<MemoryBreakdown> stage_memory;  // per pipeline stage (tp rank 0, dp 0, cp 0)
  MemoryBreakdown peak;                       // the largest of them
  int peak_stage = 0;
  double checkpoint_gather_bytes = 0;  // rank 0's extra during a save: the whole model, m and v
  // On the CPU, where a save's tensors take the devices' own memory (the host's): a rank's share
  // of the host during a save, the peak plus every rank's copy of its moments and rank 0's whole
  // tensors over the host's ranks; 0 on GPUs or when the run saves nothing. It must fit too.
  double save_share_bytes = 0;
  double activation_slots = 0;         // micro-batches in flight on the peak stage
  CommVolume comm;
  StepTime step;
  double tokens_per_s = 0, mfu = 0;
  double total_s = 0;        // train.steps steps (checkpoint and evaluation pauses not included)
  double device_hours = 0;
  bool fits = false;
  std::string why_not;       // "" when it fits
};

Plan make_plan(const PlanInput& in, const HardwareProfile& hw);

// Why the layout cannot run the model at all ("" when it can): heads not divisible by tp, more
// stages than layers, seq_len not divisible by 2·cp. make_plan reports it as why_not, and an
// evaluation needing more rows than data.val holds too.
std::string layout_invalid_reason(const PlanInput& in);

// Every layout (tp ≤ devices per node dividing NH, pp ≤ L, cp dividing seq_len/2, dp, ZeRO 0/1,
// micro-batches) of `devices` that keeps the config's global batch (dp × microbatches ×
// micro_batch_size rows; micro_batch_size may shrink to fit), ranked by predicted tokens/s;
// rejected ones carry why_not.
struct LayoutChoice {
  PlanLayout layout;
  int64_t micro_batch_size = 0;
  Plan plan;
};
std::vector<LayoutChoice> rank_layouts(const PlanInput& in, const HardwareProfile& hw,
                                       int64_t devices);
// The smallest device count (a power of two up to max_devices) with a layout that fits; 0 if none.
int64_t smallest_fitting_devices(const PlanInput& in, const HardwareProfile& hw,
                                 int64_t max_devices = 65536);

// Human-readable report of a plan (what `berth plan` prints) and its JSON form.
std::string format_plan(const Plan& p, double price_per_device_hour);
std::string plan_to_json(const Plan& p, double price_per_device_hour,
                         const std::vector<LayoutChoice>& layouts, int64_t smallest);

// "12.3 GiB", "812 MiB"
std::string format_bytes(double bytes);

}  // namespace berth
