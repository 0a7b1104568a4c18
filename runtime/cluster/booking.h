// Booking arithmetic of the reservation ledger, pure: which devices match a request, when the
// earliest window of the requested length opens on enough of them, which devices to take (fewest
// hosts), and what blocks an earlier start. The SQLite store (ledger.h) runs this inside its
// serialized write transaction on the rows it read; tests compare it with brute force.
//
// Windows are half-open [start, end), in Unix seconds (UTC). Priorities: 0 (P0) is the highest.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace berth {

struct Device {
  int64_t id = 0;           // ledger row id
  std::string host;
  std::string kind;         // "gpu" or "cpu" (a CPU slot)
  int64_t index = 0;        // CUDA device index / slot number on the host
  std::string model;        // "H100", "cpu", ...
  int64_t memory_bytes = 0; // total memory of the device
  std::string uuid;         // CUDA UUID ("" for CPU slots)
};

// "host:gpu3" or "host:cpu0", as listings and messages name a device.
std::string device_name(const Device& d);

// One device's booking, as the arithmetic sees it.
struct Busy {
  int64_t device = 0;
  int64_t reservation = 0;
  double start = 0, end = 0;
  int priority = 3;
  std::string owner;
  bool running = false;  // a job holds its lease now (preempting it cuts a live run)
};

struct SlotRequest {
  int64_t count = 1;            // devices
  std::string model;            // "" = any model
  int64_t min_memory_bytes = 0; // per device
  double start = 0;             // earliest acceptable start
  double duration_s = 0;
  int priority = 3;
  bool preempt = false;  // bookings of lower priority (higher number) do not block
  // With preempt: a running booking (Busy::running) is not preemptible before this time (the
  // policy's minimum notice from now): until then it blocks like a booking of higher priority.
  double notice_until = 0;
};

struct SlotAnswer {
  bool found = false;
  double start = 0;                 // the earliest feasible start >= request.start
  std::vector<int64_t> devices;     // chosen device ids at that start (fewest hosts)
  std::vector<Busy> blockers;  // bookings that block [request.start, +duration) on matching devices
                               // (not those it may preempt)
  std::vector<Busy> preempted;      // with preempt: the lower-priority bookings the choice overlaps
  int64_t matching = 0;             // devices matching model and memory
};

// Devices that match model and memory.
std::vector<const Device*> matching_devices(const std::vector<Device>& devices,
                                            const SlotRequest& req);

// Exact earliest start in whole seconds: candidate starts are request.start and every end of a
// booking on a matching device after it, rounded up to the second (availability over [t, t + d)
// can only improve when t passes an end).
SlotAnswer find_slot(const std::vector<Device>& devices, const std::vector<Busy>& busy,
                     const SlotRequest& req);

// `count` of the `free` devices on the fewest hosts: hosts with the most free devices first, then
// lowest index. `free` must hold at least `count` devices.
std::vector<int64_t> choose_fewest_hosts(const std::vector<const Device*>& free, int64_t count);

// `count` of the `preemptible` devices for [start, end), given the bookings in `busy`, breaking as
// little as possible: a booking once broken is broken whole, so its other devices come free; then
// devices whose new victims are not running, of the lowest priority, fewest, on a host already
// chosen (`hosts`: those of the free devices taken), lowest index. `preemptible` must hold at
// least `count` devices.
std::vector<int64_t> choose_least_preemption(const std::vector<const Device*>& preemptible,
                                             const std::vector<Busy>& busy, double start,
                                             double end, int64_t count,
                                             std::set<std::string> hosts);

}  // namespace berth
