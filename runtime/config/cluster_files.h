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
std::vector<InventoryHost> read_cluster_inventory(const std::string& path);

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
