#include "parallel/pipeline.h"

#include <algorithm>
#include <chrono>

#include "runtime/core/check.h"

namespace berth {

LayerRange stage_layers(int64_t n_layer, int pp, int stage) {
  BERTH_CHECK(pp >= 1 && pp <= n_layer,
              "pipeline: {} stages for {} layers; every stage needs a layer (parallel.pp <= "
              "model.n_layer)",
              pp, n_layer);
  BERTH_CHECK(stage >= 0 && stage < pp, "pipeline: stage {} is not in 0..{}", stage, pp - 1);
  const int64_t base = n_layer / pp, extra = n_layer % pp;
  const int64_t begin = stage * base + std::min<int64_t>(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

bool is_transfer(PipeOp op) { return op != PipeOp::kForward && op != PipeOp::kBackward; }

std::string describe(const std::vector<PipeAction>& actions) {
  static const char* kNames[] = {"RF", "F", "SF", "RB", "B", "SB"};
  std::string out;
  for (const PipeAction& a : actions) {
    out += fmt::format("{}{}{}", out.empty() ? "" : " ", kNames[int(a.op)], a.microbatch);
  }
  return out;
}

namespace {

void check_args(int pp, int stage, int microbatches) {
  BERTH_CHECK(pp >= 1 && stage >= 0 && stage < pp && microbatches >= 1,
              "pipeline schedule: pp {} stage {} microbatches {}", pp, stage, microbatches);
}

struct Builder {
  int pp, stage;
  std::vector<PipeAction> out;
  bool first() const { return stage == 0; }
  bool last() const { return stage == pp - 1; }
  void recv_forward(int m) { if (!first()) out.push_back({PipeOp::kRecvForward, m}); }
  void forward(int m) { out.push_back({PipeOp::kForward, m}); }
  void send_forward(int m) { if (!last()) out.push_back({PipeOp::kSendForward, m}); }
  void recv_backward(int m) { if (!last()) out.push_back({PipeOp::kRecvBackward, m}); }
  void backward(int m) { out.push_back({PipeOp::kBackward, m}); }
  void send_backward(int m) { if (!first()) out.push_back({PipeOp::kSendBackward, m}); }
};

}  // namespace

std::vector<PipeAction> schedule_forward_only(int pp, int stage, int microbatches) {
  check_args(pp, stage, microbatches);
  Builder b{pp, stage, {}};
  for (int m = 0; m < microbatches; ++m) {
    b.recv_forward(m);
    b.forward(m);
    b.send_forward(m);
  }
  return b.out;
}

std::vector<PipeAction> schedule_afab(int pp, int stage, int microbatches) {
  // All forwards (the forward-only list), then all backwards.
  Builder b{pp, stage, schedule_forward_only(pp, stage, microbatches)};
  for (int m = 0; m < microbatches; ++m) {
    b.recv_backward(m);
    b.backward(m);
    b.send_backward(m);
  }
  return b.out;
}

std::vector<PipeAction> schedule_1f1b(int pp, int stage, int microbatches) {
  check_args(pp, stage, microbatches);
  Builder b{pp, stage, {}};
  const int warmup = std::min(pp - stage - 1, microbatches);
  const int steady = microbatches - warmup;
  for (int m = 0; m < warmup; ++m) {
    b.recv_forward(m);
    b.forward(m);
    b.send_forward(m);
  }
  if (steady > 0) b.recv_forward(warmup);
  for (int i = 0; i < steady; ++i) {
    const int f = warmup + i;
    b.forward(f);
    b.send_forward(f);   // grouped with the next receive: send_forward_recv_backward
    b.recv_backward(i);
    b.backward(i);
    b.send_backward(i);  // grouped with the next receive: send_backward_recv_forward
    if (i + 1 < steady) b.recv_forward(f + 1);
  }
  for (int m = steady; m < microbatches; ++m) {  // cool-down
    b.recv_backward(m);
    b.backward(m);
    b.send_backward(m);
  }
  return b.out;
}

int max_in_flight(const std::vector<PipeAction>& actions) {
  int now = 0, most = 0;
  bool backward = false;
  for (const PipeAction& a : actions) {
    if (a.op == PipeOp::kForward) most = std::max(most, ++now);
    if (a.op == PipeOp::kBackward) {
      --now;
      backward = true;
    }
  }
  return backward ? most : std::min(most, 1);
}

PipelineTimes run_schedule(Communicator& pp, const std::vector<PipeAction>& actions,
                           PipelineStage& stage) {
  using clock = std::chrono::steady_clock;
  PipelineTimes times;
  const int me = pp.rank();
  size_t i = 0;
  while (i < actions.size()) {
    const auto t0 = clock::now();
    const PipeAction a = actions[i];
    if (!is_transfer(a.op)) {
      if (a.op == PipeOp::kForward) stage.forward(a.microbatch);
      else stage.backward(a.microbatch);
      times.compute_s += std::chrono::duration<double>(clock::now() - t0).count();
      ++i;
      continue;
    }
    pp.group_begin();
    for (; i < actions.size() && is_transfer(actions[i].op); ++i) {
      const int m = actions[i].microbatch;
      const size_t n = stage.activation_count(m);
      switch (actions[i].op) {
        case PipeOp::kRecvForward: pp.recv(stage.recv_activation(m), n, DType::F32, me - 1); break;
        case PipeOp::kSendForward: pp.send(stage.send_activation(m), n, DType::F32, me + 1); break;
        case PipeOp::kRecvBackward: pp.recv(stage.recv_grad(m), n, DType::F32, me + 1); break;
        case PipeOp::kSendBackward: pp.send(stage.send_grad(m), n, DType::F32, me - 1); break;
        default: break;
      }
    }
    pp.group_end();
    times.transfer_s += std::chrono::duration<double>(clock::now() - t0).count();
  }
  return times;
}

PlayResult play_schedules(const std::vector<std::vector<PipeAction>>& stages, int microbatches) {
  PlayResult res;
  const int pp = int(stages.size());
  const size_t M = size_t(microbatches);
  struct State {
    size_t pc = 0;
    std::vector<bool> got_f, got_b, fwd, bwd;  // per micro-batch
    std::vector<bool> done;                    // per op of the current group
    int in_flight = 0;
  };
  std::vector<State> st(static_cast<size_t>(pp));
  for (State& s : st) {
    s.got_f.assign(M, false), s.got_b.assign(M, false), s.fwd.assign(M, false),
        s.bwd.assign(M, false);
  }
  res.max_in_flight.assign(size_t(pp), 0);
  auto fail = [&](const std::string& why) {
    res.ok = false;
    res.error = why;
    return res;
  };
  // The current group of stage s: [pc, group_end(s)).
  auto group_end = [&](int s) {
    size_t e = st[size_t(s)].pc;
    while (e < stages[size_t(s)].size() && is_transfer(stages[size_t(s)][e].op)) ++e;
    return e;
  };
  auto peer_of = [](int s, PipeOp op) {
    return (op == PipeOp::kSendForward || op == PipeOp::kRecvBackward) ? s + 1 : s - 1;
  };
  auto match_of = [](PipeOp op) {
    switch (op) {
      case PipeOp::kSendForward: return PipeOp::kRecvForward;
      case PipeOp::kRecvForward: return PipeOp::kSendForward;
      case PipeOp::kSendBackward: return PipeOp::kRecvBackward;
      default: return PipeOp::kSendBackward;
    }
  };
  for (int s = 0; s < pp; ++s) {
    for (const PipeAction& a : stages[size_t(s)]) {
      if (a.microbatch < 0 || size_t(a.microbatch) >= M) {
        return fail(fmt::format("stage {}: micro-batch {} out of range", s, a.microbatch));
      }
      if (is_transfer(a.op)) {
        const int p = peer_of(s, a.op);
        if (p < 0 || p >= pp) {
          return fail(fmt::format("stage {}: {} has no neighbour stage {}", s,
                                  describe({a}), p));
        }
      }
    }
  }
  for (;;) {
    bool finished = true;
    for (int s = 0; s < pp; ++s) finished = finished && st[size_t(s)].pc >= stages[size_t(s)].size();
    if (finished) break;
    bool progress = false;
    ++res.rounds;
    // Transfers meet the matching transfer in the neighbour's posted group.
    for (int s = 0; s < pp; ++s) {
      State& me = st[size_t(s)];
      const size_t end = group_end(s);
      if (me.pc >= end) continue;
      me.done.resize(end - me.pc, false);
      for (size_t k = me.pc; k < end; ++k) {
        if (me.done[k - me.pc]) continue;
        const PipeAction& a = stages[size_t(s)][k];
        const int p = peer_of(s, a.op);
        State& peer = st[size_t(p)];
        const size_t pend = group_end(p);
        peer.done.resize(pend - peer.pc, false);
        for (size_t q = peer.pc; q < pend; ++q) {
          const PipeAction& b = stages[size_t(p)][q];
          if (peer.done[q - peer.pc] || b.op != match_of(a.op) || b.microbatch != a.microbatch) {
            continue;
          }
          const bool send_me = a.op == PipeOp::kSendForward || a.op == PipeOp::kSendBackward;
          const int sender = send_me ? s : p;
          const PipeOp sop = send_me ? a.op : b.op;
          const State& snd = st[size_t(sender)];
          const size_t m = size_t(a.microbatch);
          if (sop == PipeOp::kSendForward && !snd.fwd[m]) {
            return fail(fmt::format("stage {} sends the activation of micro-batch {} before "
                                    "computing it", sender, m));
          }
          if (sop == PipeOp::kSendBackward && !snd.bwd[m]) {
            return fail(fmt::format("stage {} sends the gradient of micro-batch {} before "
                                    "computing it", sender, m));
          }
          me.done[k - me.pc] = true;
          peer.done[q - peer.pc] = true;
          const int receiver = send_me ? p : s;
          if (sop == PipeOp::kSendForward) st[size_t(receiver)].got_f[m] = true;
          else st[size_t(receiver)].got_b[m] = true;
          progress = true;
          break;
        }
      }
    }
    // Finished groups and compute actions advance.
    for (int s = 0; s < pp; ++s) {
      State& me = st[size_t(s)];
      const std::vector<PipeAction>& list = stages[size_t(s)];
      if (me.pc >= list.size()) continue;
      const size_t end = group_end(s);
      if (end > me.pc) {
        if (std::all_of(me.done.begin(), me.done.end(), [](bool d) { return d; }) &&
            me.done.size() == end - me.pc) {
          me.pc = end;
          me.done.clear();
          progress = true;
        }
        continue;
      }
      const PipeAction& a = list[me.pc];
      const size_t m = size_t(a.microbatch);
      if (a.op == PipeOp::kForward) {
        if (me.fwd[m]) return fail(fmt::format("stage {} runs forward {} twice", s, m));
        if (s > 0 && !me.got_f[m]) {
          return fail(fmt::format("stage {} runs forward {} before receiving its input", s, m));
        }
        me.fwd[m] = true;
        res.max_in_flight[size_t(s)] = std::max(res.max_in_flight[size_t(s)], ++me.in_flight);
      } else {
        if (me.bwd[m] || !me.fwd[m]) {
          return fail(fmt::format("stage {} runs backward {} twice or before its forward", s, m));
        }
        if (s < pp - 1 && !me.got_b[m]) {
          return fail(fmt::format("stage {} runs backward {} before receiving its gradient", s,
                                  m));
        }
        me.bwd[m] = true;
        --me.in_flight;
      }
      ++me.pc;
      progress = true;
    }
    if (!progress) {
      std::string where;
      for (int s = 0; s < pp; ++s) {
        const size_t end = group_end(s);
        const std::vector<PipeAction> blocked(stages[size_t(s)].begin() + long(st[size_t(s)].pc),
                                              stages[size_t(s)].begin() + long(end));
        where += fmt::format("; stage {} waits in [{}]", s, describe(blocked));
      }
      return fail("deadlock" + where);
    }
  }
  for (int s = 0; s < pp; ++s) {
    for (size_t m = 0; m < M; ++m) {
      if (!st[size_t(s)].fwd[m] || !st[size_t(s)].bwd[m]) {
        return fail(fmt::format("stage {} never completes micro-batch {}", s, m));
      }
    }
  }
  res.ok = true;
  return res;
}

}  // namespace berth
