#include "runtime/core/host_memory.h"

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

// The limit in `file`: its first token as a whole number of bytes, 0 when missing, "max" or not
// one.
double read_limit(const std::string& file) {
  std::ifstream in(file);
  std::string token;
  int64_t v = 0;
  if (!(in >> token) || !parse_whole_number(token, &v)) return 0;
  return v > 0 && double(v) < kNoLimit ? double(v) : 0;
}

// The smallest limit in `file_name` of `dir` = mount + path and its ancestors up to `mount`.
double tightest_up_to(const std::string& mount, std::string path, const std::string& file_name) {
  double best = 0;
  for (;;) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    const double v = read_limit(mount + path + "/" + file_name);
    if (v > 0 && (best == 0 || v < best)) best = v;
    if (path.empty()) return best;
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

double cgroup_memory_limit_bytes(const std::string& proc_self_cgroup,
                                 const std::string& cgroup_root) {
  std::ifstream in(proc_self_cgroup);
  std::string line;
  double best = 0;
  while (std::getline(in, line)) {
    // hierarchy-id:controllers:path (the path may itself hold ':')
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    double v = 0;
    if (id == "0" && controllers.empty()) {
      v = tightest_up_to(cgroup_root, path, "memory.max");
    } else if (names_controller(controllers, "memory")) {
      v = tightest_up_to(cgroup_root + "/memory", path, "memory.limit_in_bytes");
    }
    if (v > 0 && (best == 0 || v < best)) best = v;
  }
  return best;
}

double host_memory_limit_bytes() {
  const double total = host_meminfo_bytes("MemTotal"), cgroup = cgroup_memory_limit_bytes();
  if (total <= 0) return cgroup;
  return cgroup > 0 && cgroup < total ? cgroup : total;
}

}  // namespace berth
