#include "runtime/cluster/booking.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>

namespace berth {

std::string device_name(const Device& d) {
  return d.host + ":" + (d.kind == "gpu" ? "gpu" : "cpu") + std::to_string(d.index);
}

std::vector<const Device*> matching_devices(const std::vector<Device>& devices,
                                            const SlotRequest& req) {
  std::vector<const Device*> out;
  for (const Device& d : devices) {
    if (!req.model.empty() && d.model != req.model) continue;
    if (d.memory_bytes < req.min_memory_bytes) continue;
    out.push_back(&d);
  }
  return out;
}

std::vector<int64_t> choose_fewest_hosts(const std::vector<const Device*>& free, int64_t count) {
  std::map<std::string, std::vector<const Device*>> by_host;
  for (const Device* d : free) by_host[d->host].push_back(d);
  std::vector<std::pair<std::string, std::vector<const Device*>>> hosts(by_host.begin(),
                                                                         by_host.end());
  std::stable_sort(hosts.begin(), hosts.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  std::vector<int64_t> out;
  for (auto& [host, devs] : hosts) {
    std::sort(devs.begin(), devs.end(),
              [](const Device* a, const Device* b) { return a->index < b->index; });
    for (const Device* d : devs) {
      if (int64_t(out.size()) == count) return out;
      out.push_back(d->id);
    }
  }
  return out;
}

std::vector<int64_t> choose_least_preemption(const std::vector<const Device*>& preemptible,
                                             const std::vector<Busy>& busy, double start,
                                             double end, int64_t count,
                                             std::set<std::string> hosts) {
  std::map<int64_t, std::vector<const Busy*>> victims;  // device id -> bookings overlapping it
  for (const Busy& b : busy) {
    if (b.start < end && start < b.end) victims[b.device].push_back(&b);
  }
  std::set<int64_t> broken, taken;
  std::vector<int64_t> out;
  while (int64_t(out.size()) < count) {
    const Device* best = nullptr;
    std::tuple<int, int, int, int64_t, int, int64_t> best_key;
    for (const Device* d : preemptible) {
      if (taken.count(d->id)) continue;
      int running = 0, most_important = 4, fresh = 0;  // over the bookings not yet broken
      std::set<int64_t> would_break = broken;
      for (const Busy* b : victims[d->id]) {
        if (broken.count(b->reservation)) continue;
        ++fresh;
        running += b->running;
        most_important = std::min(most_important, b->priority);
        would_break.insert(b->reservation);
      }
      // The devices that breaking those frees (a booking is broken whole: its other devices
      // come free too), up to what is still needed: one booking of two devices beats two of one.
      int64_t frees = 0;
      for (const Device* e : preemptible) {
        if (taken.count(e->id)) continue;
        bool all = true;
        for (const Busy* b : victims[e->id]) all = all && would_break.count(b->reservation);
        frees += all;
      }
      frees = std::min(frees, count - int64_t(out.size()));
      const std::tuple<int, int, int, int64_t, int, int64_t> key{
          running, -most_important, fresh, -frees, hosts.count(d->host) ? 0 : 1, d->index};
      if (!best || key < best_key) best = d, best_key = key;
    }
    if (!best) break;
    taken.insert(best->id);
    hosts.insert(best->host);
    for (const Busy* b : victims[best->id]) broken.insert(b->reservation);
    out.push_back(best->id);
  }
  return out;
}

SlotAnswer find_slot(const std::vector<Device>& devices, const std::vector<Busy>& busy,
                     const SlotRequest& req) {
  SlotAnswer ans;
  const std::vector<const Device*> match = matching_devices(devices, req);
  ans.matching = int64_t(match.size());
  std::set<int64_t> ids;
  for (const Device* d : match) ids.insert(d->id);
  // Bookings that block: on a matching device, and not preemptible by this request. A running
  // one is preemptible only from notice_until: before it, that part of it blocks.
  std::vector<const Busy*> blocking;   // what the search avoids (a running one: until notice)
  std::vector<const Busy*> as_booked;  // each one's booking as it stands
  std::vector<Busy> noticed;
  noticed.reserve(busy.size());
  for (const Busy& b : busy) {
    if (!ids.count(b.device)) continue;
    if (req.preempt && b.priority > req.priority) {
      if (b.running && b.start < req.notice_until) {
        noticed.push_back(b);
        noticed.back().end = std::min(b.end, req.notice_until);
        blocking.push_back(&noticed.back());
        as_booked.push_back(&b);
      }
      continue;
    }
    blocking.push_back(&b);
    as_booked.push_back(&b);
  }
  auto overlaps = [](const Busy& b, double s, double e) { return b.start < e && s < b.end; };
  // What blocks the start asked for, as booked (a running one that blocks only until its notice
  // ends is listed whole); a booking this request would preempt is no blocker.
  for (size_t i = 0; i < blocking.size(); ++i) {
    if (overlaps(*blocking[i], req.start, req.start + req.duration_s))
      ans.blockers.push_back(*as_booked[i]);
  }
  if (int64_t(match.size()) < req.count) return ans;
  // Whole seconds, as bookings are shown: a start of 13:33:12.43 would print as 13:33:12, and
  // asking for that start again would overlap by 0.43 s, forever.
  std::vector<double> candidates = {std::ceil(req.start)};
  for (const Busy* b : blocking) {
    if (b->end > req.start) candidates.push_back(std::ceil(b->end));
  }
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (double t : candidates) {
    const double e = t + req.duration_s;
    std::set<int64_t> taken;
    for (const Busy* b : blocking) {
      if (overlaps(*b, t, e)) taken.insert(b->device);
    }
    std::vector<const Device*> free;
    for (const Device* d : match) {
      if (!taken.count(d->id)) free.push_back(d);
    }
    if (int64_t(free.size()) < req.count) continue;
    // Prefer devices nobody holds over preemptible ones.
    std::vector<const Device*> clean, preemptible;
    for (const Device* d : free) {
      bool held = false;
      for (const Busy& b : busy) held = held || (b.device == d->id && overlaps(b, t, e));
      (held ? preemptible : clean).push_back(d);
    }
    std::vector<int64_t> chosen;
    if (int64_t(clean.size()) >= req.count) {
      chosen = choose_fewest_hosts(clean, req.count);
    } else {
      chosen = choose_fewest_hosts(clean, int64_t(clean.size()));
      std::set<std::string> chosen_hosts;
      for (const Device* d : clean) chosen_hosts.insert(d->host);
      const std::vector<int64_t> more = choose_least_preemption(
          preemptible, busy, t, e, req.count - int64_t(clean.size()), chosen_hosts);
      chosen.insert(chosen.end(), more.begin(), more.end());
    }
    ans.found = true;
    ans.start = t;
    ans.devices = chosen;
    const std::set<int64_t> chosen_set(chosen.begin(), chosen.end());
    for (const Busy& b : busy) {
      if (chosen_set.count(b.device) && overlaps(b, t, e)) ans.preempted.push_back(b);
    }
    return ans;
  }
  return ans;  // unreachable: the latest end always frees every matching device
}

}  // namespace berth
