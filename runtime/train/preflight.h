// The plan of a run config (runtime/cluster/plan.h) and the hardware profiles it is made for:
// built-in GPU profiles, a calibrated profile of this machine, or a profile file.
#pragma once

#include <cstdint>
#include <string>

#include "packing/packers.h"
#include "runtime/cluster/plan.h"
#include "runtime/comm/communicator.h"
#include "runtime/config/config.h"

namespace berth {

// The plan's input from a run config: model, batch, layout (parallel.dp = 0 is derived from
// `world`), steps, the training and validation datasets' in-memory size (read from their
// headers), the rows an evaluation can read and, in the packed and padded modes, the rows' Σ L²
// and fill, from the packing berth train makes: its plan on disk, else packed here. With
// `pack_when_absent` false nothing is packed here (the trainer's pre-flight, which packs next):
// without a plan on disk, full rows of T² are assumed, and evaluation rows are counted in stream
// mode only. Nothing is packed for a layout that cannot run (layout_invalid_reason). What berth
// train would refuse in the data settings and files goes into `refusals`.
PlanInput plan_input_from_config(const RunConfig& cfg, int64_t world, bool pack_when_absent = true);

// The data settings berth train refuses before it reads anything: data.train not set, an
// evaluation without data.val. Throws Error naming the config.
void check_data_settings(const RunConfig& cfg);

// Throws Error when the input has refusals (what berth train would refuse in the config's data
// settings and files): a plan or a booking of a config that cannot train misleads.
void require_trainable(const PlanInput& in);

// Sets the input's attention work (Σ L² a row) and token fill from a packing plan of its seq_len:
// the trainer's rank 0 gives it the plan its loader holds.
void set_row_packing(PlanInput* in, const PackPlan& plan);

// Where `berth plan --calibrate` saves this host's profile by default:
// $XDG_DATA_HOME/berth/profiles/<host>.json (~/.local/share/berth/profiles/<host>.json).
std::string default_profile_path();

// "a100" | "h100" | "h200" | "cpu" | a profile file. "cpu" is this host's calibrated profile when
// one was saved at default_profile_path(), else the built-in guess.
HardwareProfile resolve_hardware_profile(const std::string& spec);

// A calibrated CPU profile describes one rank of the sharing it was measured under: its share of
// the host's memory and cores with `hw.devices_per_node` ranks. For a plan of `ranks` ranks on
// this host, the profile of this host (by name) gets the memory share of `ranks` instead, and a
// note (`*note`) says so, and that its kernel rates are still those measured at the other sharing.
// Other profiles, and one of this sharing, are returned as they are (note "").
HardwareProfile profile_for_ranks_here(const HardwareProfile& hw, int64_t ranks, std::string* note);
// The same for `berth plan` and `reserve --config`, which know a device count, not its hosts:
// fewer devices than the profile's ranks per host are planned on one host of this sharing; more,
// on hosts of the profile's own.
HardwareProfile profile_for_planned_devices(const HardwareProfile& hw, int64_t devices,
                                            std::string* note);

// Measures this machine with every rank of `world` running at once (so the figures are per rank
// under the same sharing as a run with this many ranks): sgemm rates at sizes 64..1024, memory
// bandwidth (a triad over 64 MiB), and the all-reduce bus bandwidth and latency between the ranks
// (with one rank: a memory copy). Collective; rank 0's return value holds the slowest rank's
// figures.
// Before measuring, the host's local rank 0 warns (busy_host_warning) when other work is running:
// it reads /proc/stat across half a second in which every rank sleeps.
HardwareProfile calibrate_profile(Communicator& world);

// Cores kept busy between two readings of /proc/stat's first line ("cpu user nice system idle
// iowait irq softirq steal ..."; busy is all but idle and iowait), on a host of `cores` cores;
// -1 when either line is not such a line or no time passed.
double busy_cores_between(const std::string& stat_before, const std::string& stat_after, int cores);
// "" on a quiet host; else a warning that a calibration would measure only the share of the host
// that other work leaves: it kept at least half a core and a quarter of the `cores` busy.
std::string busy_host_warning(double busy_cores, int cores);

}  // namespace berth
