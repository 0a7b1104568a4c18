#include "runtime/core/host_memory.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "runtime/core/decimal.h"

namespace berth {
namespace {

// v1's "no limit" is PAGE_COUNTER_MAX pages (9223372036854771712 bytes with 4 KiB pages): anything
// this large is no limit.
constexpr double kNoLimit = 1152921504606846976.0;  // 2^60

// The whole number of bytes that is `file`'s first token; false when missing or not one.
bool read_bytes(const std::string& file, double* out) {
  std::ifstream in(file);
  std::string token;
  int64_t v = 0;
  if (!(in >> token) || !parse_whole_number(token, &v) || v < 0) return false;
  *out = double(v);
  return true;
}

// The limit in `file`: 0 when missing, "max", 0 or not a number.
double read_limit(const std::string& file) {
  double v = 0;
  return read_bytes(file, &v) && v > 0 && v < kNoLimit ? v : 0;
}

// The value of `key` in a memory.stat file ("key value" lines); 0 when absent.
double stat_value(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string k;
  double v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// One cgroup hierarchy's file names: v2, or v1's memory controller.
struct Hierarchy {
  std::string mount, limit, usage, inactive_file;
};

// Folds every group from mount + path up to the mount point that has a limit into `m`: the
// tightest limit, and the least headroom: the limit less the group's working set (its usage less
// the inactive page cache, which the kernel reclaims before it kills; what kubelet evicts by).
void fold_up_to(const Hierarchy& h, std::string path, CgroupMemory* m) {
  for (;;) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    const std::string dir = h.mount + path + "/";
    const double limit = read_limit(dir + h.limit);
    double usage = 0;
    if (limit > 0) {
      if (m->limit_bytes == 0 || limit < m->limit_bytes) m->limit_bytes = limit;
      if (read_bytes(dir + h.usage, &usage)) {
        const double working =
            std::max(0.0, usage - stat_value(dir + "memory.stat", h.inactive_file));
        const double headroom = std::max(0.0, limit - working);
        if (m->headroom_bytes < 0 || headroom < m->headroom_bytes) m->headroom_bytes = headroom;
      }
    }
    if (path.empty()) return;
    const size_t slash = path.rfind('/');
    path = slash == std::string::npos ? std::string() : path.substr(0, slash);
  }
}

// Whether the comma-separated controller list `controllers` names `name`.
bool names_controller(const std::string& controllers, const std::string& name) {
  std::stringstream ss(controllers);
  std::string c;
  while (std::getline(ss, c, ','))
    if (c == name) return true;
  return false;
}

}  // namespace

double host_meminfo_bytes(const std::string& field) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == field + ":") return kib * 1024;
    in.ignore(256, '\n');
  }
  return 0;
}

CgroupMemory cgroup_memory(const std::string& proc_self_cgroup, const std::string& cgroup_root) {
  std::ifstream in(proc_self_cgroup);
  std::string line;
  CgroupMemory m;
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path (the path may itself hold ':')
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    if (id == "0" && controllers.empty()) {
      fold_up_to({cgroup_root, "memory.max", "memory.current", "inactive_file"}, path, &m);
    } else if (names_controller(controllers, "memory")) {
      fold_up_to({cgroup_root + "/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                  "total_inactive_file"},
                 path, &m);
    }
  }
  return m;
}

double host_memory_limit_bytes() {
  const double total = host_meminfo_bytes("MemTotal"), cgroup = cgroup_memory().limit_bytes;
  if (total <= 0) return cgroup;
  return cgroup > 0 && cgroup < total ? cgroup : total;
}

double host_memory_available_bytes() {
  const double avail = host_meminfo_bytes("MemAvailable");
  const double headroom = cgroup_memory().headroom_bytes;
  if (headroom < 0) return avail;
  return avail > 0 && avail < headroom ? avail : headroom;
}

}  // namespace berth
