// The ledger's TOML files (docs/reservation.md): a cluster inventory for `berth devices register
// --from FILE`, and the ledger policy (<ledger>.policy.toml). Strict like run configs: unknown
// keys, wrong types and bad values are errors that name the file and the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace berth {

// [[hosts]] name = "node01", model = "H100", memory_gib = 80, gpus = 8 (kind = "gpu" | "cpu")
struct InventoryHost {
  std::string name;
  std::string model;
  double memory_gib = 0;
  int64_t count = 0;
  std::string kind = "gpu";
};
// Each host once; names of letters, digits, '.', '-' and '_'; memory_gib in [1/1024, 10^6].
std::vector<InventoryHost> read_cluster_inventory(const std::string& path);
// A host name as devices are named ("node01:gpu3"): 1..253 letters, digits, '.', '-' or '_'.
// Throws Error starting with `where` otherwise.
void check_host_name(const std::string& name, const std::string& where);

// admins = [...], preemptors = [...], max_p0_per_owner = 1, min_notice_s = 600,
// start_slack_s = 300, max_advance_s = 366 days
struct PolicyFile {
  std::vector<std::string> admins, preemptors;
  int64_t max_p0_per_owner = 1;
  double min_notice_s = 600;
  double start_slack_s = 300;
  double max_advance_s = 366 * 86400.0;
};
PolicyFile read_policy_file(const std::string& path);

}  // namespace berth
