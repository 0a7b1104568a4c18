// Pipeline parallelism as data: which layers a stage holds, and what each stage does in one
// training step, in order (docs/parallelism.md, "Pipeline schedules"). Pure functions, tested by
// playing every stage's list together (play_schedules) for deadlocks, unmatched transfers and the
// number of micro-batches in flight.
//
// An executor runs a stage's list in order; consecutive transfer actions form one group
// (group_begin/group_end on the pp communicator), so e.g. 1F1B's "send this activation, receive
// that gradient" is posted at once, as Megatron-LM's send_forward_recv_backward does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"

namespace berth {

struct LayerRange {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return end - begin; }
};

// Contiguous split of n_layer layers over pp stages; the first n_layer % pp stages get one more.
// Throws Error unless 1 <= pp <= n_layer and 0 <= stage < pp.
LayerRange stage_layers(int64_t n_layer, int pp, int stage);

enum class PipeOp {
  kRecvForward,   // activation of micro-batch m from stage − 1
  kForward,
  kSendForward,   // activation to stage + 1
  kRecvBackward,  // gradient of micro-batch m from stage + 1
  kBackward,
  kSendBackward,  // gradient to stage − 1
};

struct PipeAction {
  PipeOp op;
  int microbatch;
  bool operator==(const PipeAction& o) const { return op == o.op && microbatch == o.microbatch; }
};

bool is_transfer(PipeOp op);
std::string describe(const std::vector<PipeAction>& actions);  // "F0 SF0 RB0 B0 ..."

// All forwards, then all backwards (GPipe): M micro-batches in flight at once.
std::vector<PipeAction> schedule_afab(int pp, int stage, int microbatches);
// One forward, one backward (PipeDream-flush / Megatron 1F1B): warm-up of
// min(pp − stage − 1, M) forwards, steady 1F1B, cool-down backwards; at most min(pp − stage, M)
// micro-batches in flight on a stage.
std::vector<PipeAction> schedule_1f1b(int pp, int stage, int microbatches);

// Forward passes only (evaluation): receive, forward, send each micro-batch in turn; one
// micro-batch in flight.
std::vector<PipeAction> schedule_forward_only(int pp, int stage, int microbatches);

// The most micro-batches a stage's list holds at once (forwards done − backwards done; a
// forward-only list holds 1): the activation slots the stage needs.
int max_in_flight(const std::vector<PipeAction>& actions);

// What the executor drives on one stage. Buffers are fp32, activation_count(m) elements each;
// a receive buffer must stay untouched until the group that fills it ends, and a send buffer
// until the group that sends it ends.
class PipelineStage {
 public:
  virtual ~PipelineStage() = default;
  virtual void forward(int m) = 0;
  virtual void backward(int m) = 0;
  virtual float* recv_activation(int m) = 0;   // where the previous stage's output of m lands
  virtual const float* send_activation(int m) = 0;
  virtual float* recv_grad(int m) = 0;         // where d(loss)/d(output of m) lands
  virtual const float* send_grad(int m) = 0;   // d(loss)/d(input of m), after backward(m)
  virtual size_t activation_count(int m) = 0;
};

struct PipelineTimes {
  double compute_s = 0;   // in forward/backward
  double transfer_s = 0;  // blocked in transfer groups: the bubble plus exposed p2p time
};

// Runs one stage's list in order on the pp group (peers stage ± 1); consecutive transfers form
// one group (group_begin/group_end), so a send and the receive that follows are posted together.
PipelineTimes run_schedule(Communicator& pp, const std::vector<PipeAction>& actions,
                           PipelineStage& stage);

struct PlayResult {
  bool ok = false;
  std::string error;           // why not: a deadlock (each stage's blocked group) or a bad list
  std::vector<int> max_in_flight;  // per stage: forwards done − backwards done, at most
  int rounds = 0;              // synchronous rounds until every list finished
};

// Plays every stage's list together: a compute action finishes in its round; a group of
// consecutive transfers finishes once each of its transfers has met the matching transfer posted
// by the neighbour (send forward m on stage s ↔ receive forward m on s + 1; send backward m on s ↔
// receive backward m on s − 1). Checks that each micro-batch is computed forward then backward
// exactly once per stage, after its input arrived.
PlayResult play_schedules(const std::vector<std::vector<PipeAction>>& stages, int microbatches);

}  // namespace berth
