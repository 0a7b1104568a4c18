// The reservation ledger's commands: devices, devices register, reserve, reservations,
// reservation show, cancel, extend, timeline (docs/reservation.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "launcher/commands.h"
#include "runtime/cluster/ledger.h"
#include "runtime/cluster/nvml.h"
#include "runtime/cluster/plan.h"
#include "runtime/config/cluster_files.h"
#include "runtime/config/config.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"
#include "runtime/core/host_memory.h"
#include "runtime/train/lease_keeper.h"
#include "runtime/train/preflight.h"
#include "runtime/train/step_metrics.h"

#if BERTH_CUDA
#include "kernels/cuda/device.h"
#endif

namespace berth {
namespace {

// `reserve --gpus` not given (any number a user can type, -1 included, goes to the ledger's
// range check)
constexpr int64_t kGpusNotGiven = INT64_MIN;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string local_minute(double t) {
  const std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[48];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M %Z", &tm);
  return buf;
}

std::string window_text(double start, double end) {
  return fmt::format("{} → {} ({}; local {} → {})", format_utc_iso(start), format_utc_iso(end),
                     format_duration(end - start), local_minute(start), local_minute(end));
}

std::string devices_text(const std::vector<Device>& devs) {
  std::string out;
  for (const Device& d : devs) out += (out.empty() ? "" : ", ") + device_name(d);
  return out;
}

nlohmann::json to_json(const Reservation& r) {
  nlohmann::json devs = nlohmann::json::array();
  for (const Device& d : r.devices) {
    devs.push_back({{"id", d.id}, {"host", d.host}, {"kind", d.kind}, {"index", d.index},
                    {"model", d.model}, {"memory_bytes", d.memory_bytes}});
  }
  return {{"id", r.id},
          {"name", r.name},
          {"owner", r.owner},
          {"state", r.state},
          {"priority", fmt::format("P{}", r.priority)},
          {"start", format_utc_iso(r.start)},
          {"end", format_utc_iso(r.end)},
          {"model", r.model},
          {"min_free_mem_bytes", r.min_free_mem_bytes},
          {"chain_prev", r.chain_prev},
          {"preempted_by", r.preempted_by},
          {"devices", devs}};
}

void print_reservation(const Reservation& r) {
  std::printf("reservation %lld%s | %s | P%d | %s | %s\n  window  %s\n  devices %s\n",
              static_cast<long long>(r.id), r.name.empty() ? "" : (" '" + r.name + "'").c_str(),
              r.owner.c_str(), r.priority, r.state.c_str(),
              r.model.empty() ? "any model" : r.model.c_str(),
              window_text(r.start, r.end).c_str(), devices_text(r.devices).c_str());
  if (r.min_free_mem_bytes > 0) {
    std::printf("  min free mem %s per device\n", format_bytes(double(r.min_free_mem_bytes)).c_str());
  }
  if (r.chain_prev) std::printf("  follows reservation %lld\n", static_cast<long long>(r.chain_prev));
  if (r.preempted_by) {
    std::printf("  preempted by reservation %lld\n", static_cast<long long>(r.preempted_by));
  }
}

// JSON text of `j`. A name stored before names had to be valid UTF-8 is printed with U+FFFD where
// its bad bytes are, rather than failing every --json listing of the ledger.
std::string dump_json(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// How a timeline page begins (berth timeline --html): how a page is told from other files.
constexpr const char* kTimelineTitle = "<title>berth timeline</title>";

// The timeline page replaces nothing but an earlier page: `--html ledger.db` replaced the ledger,
// and the rename replaced FIFOs, device nodes and links alike.
void check_timeline_destination(const std::string& path) {
  check_output_file(path, "--html", "timeline.html");
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::symlink_status(path, ec);
  if (!std::filesystem::exists(st)) return;
  BERTH_CHECK(std::filesystem::is_regular_file(st),
              "--html {} exists and is not a regular file (a link, FIFO or device): the page "
              "replaces only an earlier timeline page; choose another path",
              path);
  if (std::filesystem::file_size(path, ec) == 0 && !ec) return;  // made for it (mktemp)
  std::ifstream in(path, std::ios::binary);
  std::string head(256, '\0');
  in.read(head.data(), std::streamsize(head.size()));
  head.resize(size_t(std::max<std::streamsize>(0, in.gcount())));
  BERTH_CHECK(head.find(kTimelineTitle) != std::string::npos,
              "--html {} exists and is not a berth timeline page (it could be the ledger or "
              "another document): the page replaces only an earlier one; choose another path",
              path);
}

struct LedgerArgs {
  std::string ledger;
  bool json = false;
};

// `create`: a ledger that does not exist yet is made (registering devices only); otherwise
// (booking, listing, showing, cancelling, extending) a mistyped path or an empty file is an error,
// not an empty new ledger that would answer "no reservations" or "no devices".
std::unique_ptr<LedgerStore> open_ledger(const LedgerArgs& a, bool create = false) {
  const std::string path = resolve_ledger_path(a.ledger, "");
  // A ledger named by the user goes into a directory that exists (a typo's directories were
  // made); only the default one's (~/.local/share/berth) is created.
  if (create && path != default_ledger_path()) {
    check_output_file(path, a.ledger.empty() ? "$BERTH_LEDGER" : "--ledger", "ledger.db");
  }
  LedgerOptions o = ledger_options_for(path);
  o.create = create;
  return open_sqlite_ledger(path, o);
}

void add_ledger_option(CLI::App* cmd, LedgerArgs* a, bool json = true) {
  // An empty --ledger ("--ledger \"$UNSET\"" in a script) would fall back to the default ledger.
  cmd->add_option("--ledger", a->ledger,
                  "Ledger file (default: $BERTH_LEDGER, else ~/.local/share/berth/ledger.db)")
      ->check(non_empty("give a ledger file, or leave --ledger out for $BERTH_LEDGER or the "
                        "default ledger",
                        "FILE"));
  if (json) cmd->add_flag("--json", a->json, "Print JSON");
}

// ---- timeline ----------------------------------------------------------------------------------

// The mark of the i-th reservation shown: by its place in the listing, not its id, so the 62
// marks tell apart the reservations of one chart (ids 1 and 63 both drew 'A'). Past 62, one mark,
// '+', for all the others: a mark is never two reservations in the legend.
constexpr size_t kMarkCount = 62;
char mark_of(size_t i) {
  static const char* kMarks = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  return i < kMarkCount ? kMarks[i] : '+';
}

std::string timeline_text(const std::vector<Device>& devs, const std::vector<Reservation>& rs,
                          double t0, double hours) {
  constexpr int kCols = 72;
  const double span = hours * 3600, cell = span / kCols;
  size_t w = 6;
  for (const Device& d : devs) w = std::max(w, device_name(d).size());
  std::string out = fmt::format("timeline {} → {} (UTC), one column = {}\n",
                                format_utc_minute(t0), format_utc_minute(t0 + span),
                                format_duration(cell));
  out += fmt::format("{:<{}} |{}|\n", "device", w,
                     [&] {
                       std::string axis(kCols, ' ');
                       for (int c = 0; c < kCols; c += 12) {
                         const std::string lbl = format_duration(c * cell);
                         for (size_t k = 0; k < lbl.size() && c + k < size_t(kCols); ++k)
                           axis[size_t(c) + k] = lbl[k];
                       }
                       return axis;
                     }());
  bool shared = false;  // a column that holds several reservations of one device
  for (const Device& d : devs) {
    std::string row(kCols, '.');
    for (size_t i = 0; i < rs.size(); ++i) {
      const Reservation& r = rs[i];
      bool on = false;
      for (const Device& x : r.devices) on = on || x.id == d.id;
      if (!on) continue;
      for (int c = 0; c < kCols; ++c) {
        const double a = t0 + c * cell, b = a + cell;
        if (!(r.start < b && a < r.end)) continue;
        char& m = row[size_t(c)];
        if (m != '.' && m != mark_of(i)) {
          m = '*';
          shared = true;
        } else if (m != '*') {
          m = mark_of(i);
        }
      }
    }
    out += fmt::format("{:<{}} |{}|\n", device_name(d), w, row);
  }
  for (size_t i = 0; i < std::min(rs.size(), kMarkCount); ++i) {
    const Reservation& r = rs[i];
    out += fmt::format("  {} = reservation {} {} P{} {} ({} device{}) {}\n", mark_of(i), r.id,
                       r.owner, r.priority, r.name.empty() ? "-" : r.name, r.devices.size(),
                       r.devices.size() == 1 ? "" : "s", window_text(r.start, r.end));
  }
  if (rs.size() > kMarkCount) {
    out += fmt::format(
        "  + = the {} other reservations (from reservation {}): `berth reservations` lists them, "
        "a shorter --hours charts fewer\n",
        rs.size() - kMarkCount, rs[kMarkCount].id);
  }
  if (shared) out += "  * = several reservations in one column (--hours fewer to tell them apart)\n";
  return out;
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string timeline_html(const std::vector<Device>& devs, const std::vector<Reservation>& rs,
                          double t0, double hours) {
  const int label_w = 220, width = 1100, row_h = 26, top = 40;
  const double span = hours * 3600, px = (width - label_w) / span;
  const int height = top + row_h * int(devs.size()) + 20;
  static const char* kColors[] = {"#c0392b", "#e67e22", "#2980b9", "#7f8c8d"};  // P0..P3
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"monospace\" font-size=\"12\">\n",
      width, height);
  for (double h = 0; h <= hours + 1e-9; h += std::max(1.0, std::round(hours / 12))) {
    const double x = label_w + h * 3600 * px;
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#ddd\"/>"
                       "<text x=\"{:.1f}\" y=\"{}\">{}</text>\n",
                       x, top - 5, x, height - 20, x + 2, top - 10,
                       html_escape(format_utc_minute(t0 + h * 3600).substr(5, 11)));
  }
  for (size_t i = 0; i < devs.size(); ++i) {
    const int y = top + row_h * int(i);
    svg += fmt::format("<text x=\"4\" y=\"{}\">{} {}</text>\n", y + 17,
                       html_escape(device_name(devs[i])), html_escape(devs[i].model));
    for (const Reservation& r : rs) {
      bool on = false;
      for (const Device& x : r.devices) on = on || x.id == devs[i].id;
      const double a = std::max(r.start, t0), b = std::min(r.end, t0 + span);
      if (!on || b <= a) continue;
      svg += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\" rx=\"3\">"
          "<title>{}</title></rect><text x=\"{:.1f}\" y=\"{}\" fill=\"white\">#{}</text>\n",
          label_w + (a - t0) * px, y + 3, std::max(1.0, (b - a) * px), row_h - 6,
          kColors[std::clamp(r.priority, 0, 3)],
          html_escape(fmt::format("reservation {} {} P{} {} {}", r.id, r.owner, r.priority,
                                  r.name, window_text(r.start, r.end))),
          label_w + (a - t0) * px + 3, y + 17, r.id);
    }
  }
  svg += "</svg>\n";
  std::string rows;
  for (const Reservation& r : rs) {
    rows += fmt::format("<tr><td>{}</td><td>{}</td><td>P{}</td><td>{}</td><td>{}</td><td>{}</td>"
                        "</tr>\n",
                        r.id, html_escape(r.owner), r.priority, html_escape(r.name),
                        html_escape(window_text(r.start, r.end)),
                        html_escape(devices_text(r.devices)));
  }
  return fmt::format(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">{}"
      "<style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:left}}</style>"
      "</head><body>\n<h1>berth timeline</h1>\n<p>{} → {} (UTC). Colors: P0 red, P1 orange, P2 "
      "blue, P3 grey.</p>\n{}<table><tr><th>id</th><th>owner</th><th>priority</th><th>name</th>"
      "<th>window</th><th>devices</th></tr>\n{}</table>\n</body></html>\n",
      kTimelineTitle, html_escape(format_utc_minute(t0)), html_escape(format_utc_minute(t0 + span)),
      svg, rows);
}

// reserve --config: the devices, minimum free memory and duration a run config needs, from its
// plan on the profile of --gpu (or of --model); explicit --gpus / --min-free-mem / --duration win.
// Prints what it assumed; `ledger_models`: the models of the ledger's devices, for the advice on
// --model.
void size_from_plan(const std::string& config, const std::vector<std::string>& overrides,
                    std::string gpu, double margin, std::string* model, int64_t* gpus,
                    std::string* min_free_mem, std::string* duration,
                    const std::vector<std::string>& ledger_models, FILE* out) {
  const RunConfig cfg = load_config(config, overrides);
  const auto lower = [](std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  if (gpu.empty()) {
    const std::string m = lower(*model);
    BERTH_CHECK(m == "a100" || m == "h100" || m == "h200" || m == "cpu",
                "reserve --config: say which hardware to plan for with --gpu a100|h100|h200|cpu|"
                "FILE (or --model A100/H100/H200/cpu)");
    gpu = m;
  }
  const HardwareProfile hw = resolve_hardware_profile(gpu);
  const int64_t inner = cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp;
  int64_t devices = std::max<int64_t>(0, *gpus);
  std::string how = "--gpus";
  if (devices == 0 && cfg.parallel.dp > 0) {
    devices = inner * cfg.parallel.dp;
    how = "the config's layout";
  }
  if (devices == 0) {
    PlanInput in = plan_input_from_config(cfg, inner);
    devices = std::max<int64_t>(inner, smallest_fitting_devices(in, hw));
    BERTH_CHECK(devices % inner == 0,
                "the smallest device count that fits ({}) is not a multiple of tp·pp·cp = {}: "
                "give --gpus", devices, inner);
    how = "the smallest count that fits";
  }
  std::string sharing;  // a calibrated CPU profile of another rank count, given this one's memory
  const PlanInput in = plan_input_from_config(cfg, devices);
  require_trainable(in);
  const Plan p = make_plan(in, profile_for_planned_devices(hw, devices, &sharing));
  BERTH_CHECK(p.input.layout.world() == devices,
              "reserve --config: the config's layout uses {} devices, not {}: set parallel.dp = 0 "
              "or --gpus {}", p.input.layout.world(), devices, p.input.layout.world());
  // The smallest count is that of any layout: the config's own may not fit there.
  BERTH_CHECK(p.fits, "reserve --config: {} does not fit {} x {}{}: {} (see berth plan {})", config,
              devices, hw.name,
              how == "the smallest count that fits"
                  ? fmt::format(" in its own layout, though other layouts fit there (`berth plan "
                                "{} --gpu {} --gpus {}` lists them: set one in the config, or "
                                "give --gpus)",
                                config, gpu, devices)
                  : std::string(),
              p.why_not, config);
  BERTH_CHECK(std::isfinite(p.total_s) && p.total_s > 0,
              "reserve --config: the plan of {} on {} predicts no time ({} s); give --duration",
              config, hw.name, p.total_s);
  std::fprintf(out, "sized from %s on %s (%s):\n", config.c_str(), hw.name.c_str(), hw.source.c_str());
  if (!sharing.empty()) std::fprintf(out, "  note: %s\n", sharing.c_str());
  for (const std::string& note : in.notes) std::fprintf(out, "  note: %s\n", note.c_str());
  if (model->empty()) {  // the profile sizes the booking; the model decides which devices
    // The ledger's models of the profile's devices: CPU slots ("cpu") for the cpu profile and a
    // calibrated one (`berth plan --calibrate` measures this host's CPU kernels and is named after
    // the host, which no device is), else the models that name the GPU ("NVIDIA H100 80GB HBM3"
    // for h100: a host's CUDA devices are registered by their CUDA names).
    const bool cpu = lower(gpu) == "cpu" || !hw.gemm_rates.empty();
    std::set<std::string> match, all(ledger_models.begin(), ledger_models.end());
    for (const std::string& m : all) {
      if (cpu ? m == "cpu" : lower(m).find(lower(hw.name)) != std::string::npos) match.insert(m);
    }
    std::string known;
    for (const std::string& m : all) known += (known.empty() ? "'" : ", '") + m + "'";
    const std::string advice =
        match.size() == 1 ? fmt::format("add --model '{}' to book only those", *match.begin())
        : all.empty()     ? std::string("add --model M to book only devices of model M")
                          : fmt::format(
                                "add --model with one of the ledger's models ({}) to "
                                    "book only those",
                                known);
    std::fprintf(out, "  model          any (the plan assumed %s: %s)\n", hw.name.c_str(),
                 advice.c_str());
  }
  if (*gpus == kGpusNotGiven) {
    *gpus = devices;
    std::fprintf(out, "  devices        %lld (%s)\n", static_cast<long long>(devices), how.c_str());
  }
  if (*min_free_mem == "0") {
    const double bytes = std::ceil(p.peak.total() * 1.1 / (1024.0 * 1024.0)) * 1024.0 * 1024.0;
    *min_free_mem = fmt::format("{}MiB", int64_t(bytes / (1024.0 * 1024.0)));
    std::fprintf(out, "  min free mem   %s (predicted peak %s per rank + 10 %%)\n", min_free_mem->c_str(),
                format_bytes(p.peak.total()).c_str());
  }
  if (duration->empty()) {
    // The plan's time is the training steps alone. The window must also hold the checkpoint
    // saves (reservation.checkpoint_estimate_s each), the evaluations (a forward pass, about a
    // third of a step, per eval.batches) and the stop reserve a leased run keeps before the
    // window's end (1.5 × checkpoint_estimate_s + stop_margin_s, and the next step with its
    // pauses): a window of the predicted time alone was refused by `berth train` at start.
    const ReservationSection& rc = cfg.reservation;
    const int64_t steps = cfg.train.steps;
    const int64_t saves = (cfg.checkpoint.interval > 0 ? (steps - 1) / cfg.checkpoint.interval : 0);
    // (once before training, after every eval.interval-th step, and after the last)
    const int64_t evals = cfg.eval.interval > 0 ? 1 + steps / cfg.eval.interval +
                                                      (steps % cfg.eval.interval != 0 ? 1 : 0)
                                                : 0;
    const double pauses_s = double(saves) * rc.checkpoint_estimate_s +
                            double(evals * cfg.eval.batches) * p.step.total() / 3;
    const double reserve_s = stop_reserve_s(rc) + 2 * p.step.total();
    const double needed_s = p.total_s * margin + pauses_s + reserve_s;
    // A request covers at most a year (in 7-day segments with --allow-split); a longer one was
    // refused naming a --duration the user never gave.
    BERTH_CHECK(needed_s <= kMaxRequestS,
                "reserve --config: {} needs {} on {} x {} ({} for {} steps × margin {:.2f}, with "
                "its checkpoint saves, evaluations and stop reserve): more than the year one "
                "booking request may cover. Book and train it in parts (fewer train.steps per "
                "booking, each part resuming with --resume auto), or check train.steps and the "
                "plan (berth plan {})",
                config, format_duration(needed_s), devices, hw.name, format_duration(p.total_s),
                steps, margin, config);
    const int64_t minutes = std::max<int64_t>(1, int64_t(std::ceil(needed_s / 60.0)));
    *duration = fmt::format("{}m", minutes);
    std::fprintf(out,
                 "  duration       %s (predicted %s for %lld steps × margin %.2f, + %s for %lld "
                 "checkpoint save(s) and %lld evaluation(s), + the stop reserve %s: 1.5 × "
                 "checkpoint_estimate_s + stop_margin_s + 2 steps)\n",
                 format_duration(double(minutes) * 60).c_str(), format_duration(p.total_s).c_str(),
                 static_cast<long long>(steps), margin, format_duration(pauses_s).c_str(),
                 static_cast<long long>(saves), static_cast<long long>(evals),
                 format_duration(reserve_s).c_str());
  }
}

}  // namespace

void register_ledger_commands(CLI::App& app) {
  // ---- devices -----------------------------------------------------------------------------------
  {
    struct Args {
      LedgerArgs l;
      std::string from;
      int64_t cpu_slots = 0;
      double cpu_slot_gib = 0;
      std::string host;
    };
    auto a = std::make_shared<Args>();
    CLI::App* cmd = app.add_subcommand("devices", "This host's devices; `register` records them");
    cmd->callback([cmd] {
      if (!cmd->get_subcommands().empty()) return;
      const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
      std::printf("host %s: %ld CPU cores, %.1f GiB memory\n", host_name().c_str(), cpus,
                  host_meminfo_bytes("MemTotal") / kGiB);
#if BERTH_CUDA
      const std::vector<cuda::DeviceInfo> gpus = cuda::device_inventory();
      if (gpus.empty()) std::printf("%s", cuda::describe_devices().c_str());
      for (const cuda::DeviceInfo& g : gpus) {
        std::string why;
        const std::optional<NvmlReading> n = nvml_reading(g.uuid, &why);
        std::printf("cuda:%d %s %s | %.1f GiB total, %.1f GiB free | %s\n", g.index,
                    g.name.c_str(), g.uuid.c_str(), double(g.total_bytes) / kGiB,
                    double(g.free_bytes) / kGiB,
                    n ? fmt::format("{} C, {}% busy", n->temperature_c, n->utilization_pct).c_str()
                      : why.c_str());
      }
#else
      std::printf("no CUDA devices: this berth was built without CUDA (CPU slots can be "
                  "registered with `berth devices register --cpu-slots N`)\n");
#endif
    });
    CLI::App* reg = cmd->add_subcommand(
        "register", "Record devices in the ledger: this host's GPUs, --from FILE or --cpu-slots N");
    add_ledger_option(reg, &a->l, false);
    reg->add_option("--from", a->from, "Cluster inventory (TOML: [[hosts]] name, model, "
                                       "memory_gib, gpus)");
    reg->add_option("--cpu-slots", a->cpu_slots,
                    "Register N CPU slots of this host (model "
                    "'cpu')")
        ->check(whole_number_in(1, 4096));
    reg->add_option("--slot-memory-gib", a->cpu_slot_gib,
                    "Memory per CPU slot (default: host memory / N)")
        ->check(number_in(1.0 / 1024, 1e6));
    reg->add_option("--host", a->host, "Host name for --cpu-slots (default: this host)");
    reg->callback([a] {
      std::vector<Device> devs;
      BERTH_CHECK(a->from.empty() || a->cpu_slots == 0,
                  "give either --from FILE or --cpu-slots N, not both");
      if (!a->from.empty()) {
        for (const InventoryHost& h : read_cluster_inventory(a->from)) {
          for (int64_t i = 0; i < h.count; ++i) {
            devs.push_back(Device{0, h.name, h.kind, i, h.model,
                                  static_cast<int64_t>(h.memory_gib * kGiB), ""});
          }
        }
      } else if (a->cpu_slots > 0) {
        if (!a->host.empty()) check_host_name(a->host, "--host");
        const double mem = a->cpu_slot_gib > 0 ? a->cpu_slot_gib * kGiB
                                                : host_meminfo_bytes("MemTotal") / double(a->cpu_slots);
        for (int64_t i = 0; i < a->cpu_slots; ++i) {
          devs.push_back(Device{0, a->host.empty() ? host_name() : a->host, "cpu", i, "cpu",
                                static_cast<int64_t>(mem), ""});
        }
      } else {
#if BERTH_CUDA
        for (const cuda::DeviceInfo& g : cuda::device_inventory()) {
          devs.push_back(Device{0, host_name(), "gpu", g.index, g.name, g.total_bytes, g.uuid});
        }
        if (devs.empty()) {
          // "no usable CUDA device (why)", or one line per device, each ending '\n'
          std::string why = cuda::describe_devices();
          while (!why.empty() && why.back() == '\n') why.pop_back();
          BERTH_FAIL(
              "this host has {}; register a cluster with --from cluster.toml, or CPU slots with "
              "--cpu-slots N",
              why.rfind("no usable CUDA device", 0) == 0 ? why
                                                         : "no usable CUDA device (" + why + ")");
        }
#else
        BERTH_FAIL("this berth was built without CUDA, so it sees no GPUs here; register a "
                   "cluster with --from cluster.toml, or CPU slots with --cpu-slots N");
#endif
      }
      for (const Device& d : devs) validate_device(d);  // before a new ledger file is made
      auto ledger = open_ledger(a->l, true);
      const int64_t n = ledger->register_devices(devs);
      std::printf("registered %zu device(s) (%lld new or changed); the ledger now has %zu\n",
                  devs.size(), static_cast<long long>(n), ledger->devices().size());
    });
  }

  // ---- reserve -----------------------------------------------------------------------------------
  {
    struct Args {
      LedgerArgs l;
      int64_t gpus = kGpusNotGiven;
      std::string model, min_free_mem = "0", duration, start = "earliest", priority = "P3", name,
                  key;
      bool preempt = false, allow_split = false, print_id = false;
      std::string config, gpu;  // --config: size the booking from the plan
      std::vector<std::string> overrides;  // --set on that config, as `berth train` takes them
      double margin = 1.25;
    };
    auto a = std::make_shared<Args>();
    CLI::App* cmd = app.add_subcommand("reserve", "Book devices for a window");
    CLI::Option* print_id = cmd->add_flag(
        "--print-id", a->print_id,
        "On success print only the reservation id, one line per segment with --allow-split (for "
        "batch scripts)");
    add_ledger_option(cmd, &a->l);
    print_id->excludes("--json");  // two different stdout formats
    cmd->add_option("--gpus", a->gpus, "Number of devices (with --config: from the plan)")
        ->check(whole_number_at_least(std::numeric_limits<int64_t>::min()));  // the ledger judges
    cmd->add_option("--config", a->config,
                    "Size the booking from this run config's plan (berth plan): devices, minimum "
                    "free memory (peak + 10 %) and duration (predicted time × --margin)");
    cmd->add_option("--gpu", a->gpu, "Hardware profile for --config (default: from --model: "
                                     "a100, h100, h200 or cpu)");
    cmd->add_option("--margin", a->margin, "Duration margin over the predicted time for --config")
        ->check(number_in(1.0, 10.0));
    cmd->add_option("--set", a->overrides,
                    "Override a value of the --config config, as for berth train: --set "
                    "section.key=value (repeatable)")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);
    cmd->add_option("--model", a->model, "Device model (e.g. H100, cpu); default: any");
    cmd->add_option("--min-free-mem", a->min_free_mem, "Minimum memory per device, e.g. 75GiB");
    cmd->add_option("--duration", a->duration, "Length of the window, e.g. 72h, 1h30m (with "
                                                "--config: from the plan)");
    cmd->add_option("--start", a->start, "Start (2026-12-03T08:00Z) or 'earliest' (default)");
    cmd->add_option("--priority", a->priority, "P0 (highest) .. P3 (lowest, default)");
    cmd->add_option("--name", a->name, "A name for the booking");
    // An empty key ("--idempotency-key \"$UNSET\"") would book again on every retry.
    cmd->add_option("--idempotency-key", a->key,
                    "Retrying with the same key returns the same "
                    "booking")
        ->check(
            non_empty("give a key (e.g. the job's name and date), or leave the option out", "KEY"));
    cmd->add_flag("--preempt", a->preempt, "Take lower-priority bookings' devices (if allowed)");
    cmd->add_flag("--allow-split", a->allow_split, "Book more than 7 days as chained segments");
    cmd->callback([a, cmd] {
      for (const char* o : {"--gpu", "--margin", "--set"}) {
        BERTH_CHECK(cmd->count(o) == 0 || !a->config.empty(),
                    "reserve {} sizes the booking from a config's plan: give --config CONFIG "
                    "too (without it, book --gpus N --duration D and, for a device model, --model)",
                    o);
      }
      // What the plan assumed goes to stderr under --json and --print-id, so stdout stays one
      // JSON document, or the ids alone (`id=$(berth reserve --config ... --print-id)`).
      if (!a->config.empty()) {
        std::vector<std::string> models;  // for the advice on --model
        try {
          for (const Device& d : open_ledger(a->l)->devices()) models.push_back(d.model);
        } catch (const Error&) {  // no ledger yet: the booking below says what to do
        }
        naming_overrides(a->overrides, [&] {
          size_from_plan(a->config, a->overrides, a->gpu, a->margin, &a->model, &a->gpus,
                         &a->min_free_mem, &a->duration, models,
                         a->l.json || a->print_id ? stderr : stdout);
        });
      }
      BERTH_CHECK(a->gpus != kGpusNotGiven,
                  "reserve needs --gpus N (or --config CONFIG to size the booking)");
      BERTH_CHECK(!a->duration.empty(),
                  "reserve needs --duration (e.g. 72h), or --config CONFIG to size it");
      ReserveRequest q;
      q.count = a->gpus;
      q.model = a->model;
      q.min_free_mem_bytes = parse_bytes(a->min_free_mem);
      q.duration_s = parse_duration(a->duration);
      if (a->start != "earliest") q.start = parse_utc_time(a->start);
      q.priority = parse_priority(a->priority);
      q.name = a->name;
      q.idempotency_key = a->key;
      q.owner = current_user();
      q.preempt = a->preempt;
      q.allow_split = a->allow_split;
      auto ledger = open_ledger(a->l);
      const BookingResult r = ledger->reserve(q);
      if (a->l.json) {
        nlohmann::json j = {{"booked", r.booked}, {"replayed", r.replayed}, {"reason", r.reason}};
        j["reservations"] = nlohmann::json::array();
        for (const Reservation& x : r.reservations) j["reservations"].push_back(to_json(x));
        j["preempted"] = nlohmann::json::array();
        for (const Reservation& x : r.preempted) j["preempted"].push_back(x.id);
        if (r.earliest_start > 0) {
          j["earliest_start"] = format_utc_iso(r.earliest_start);
          // What to pass as --start to book it: that start, or "earliest" where the start is now
          // plus a running holder's notice (it moves with the clock: a script that passed it
          // back a few seconds later was refused again, in a loop).
          j["earliest_moves"] = r.earliest_moves;
          j["book_with_start"] = r.earliest_moves ? "earliest" : format_utc_iso(r.earliest_start);
        }
        j["blockers"] = nlohmann::json::array();
        std::set<int64_t> seen;  // a booking blocks once, however many of its devices do
        for (const Busy& b : r.blockers) {
          if (!seen.insert(b.reservation).second) continue;
          j["blockers"].push_back({{"reservation", b.reservation}, {"owner", b.owner},
                                   {"priority", fmt::format("P{}", b.priority)},
                                   {"start", format_utc_iso(b.start)},
                                   {"end", format_utc_iso(b.end)}});
        }
        std::printf("%s\n", dump_json(j).c_str());
        if (!r.booked) throw ExitStatus{kExitNotNow};
        return;
      }
      if (r.booked && a->print_id) {  // every segment's, in order (--allow-split)
        for (const Reservation& x : r.reservations)
          std::printf("%lld\n", static_cast<long long>(x.id));
        return;
      }
      if (r.booked) {
        if (r.replayed) std::printf("already booked with this idempotency key:\n");
        for (const Reservation& x : r.reservations) print_reservation(x);
        for (const Reservation& x : r.preempted) {
          std::printf("preempted reservation %lld (%s, P%d)%s\n", static_cast<long long>(x.id),
                      x.owner.c_str(), x.priority,
                      x.state == "active" ? ": running, its window now ends at the new start"
                                          : "");
        }
        return;
      }
      // Under --print-id stdout holds ids only: a refusal goes to stderr with the exit status.
      FILE* refusal = a->print_id ? stderr : stdout;
      std::fprintf(refusal, "not booked: %s\n", r.reason.c_str());
      if (r.earliest_start > 0) {
        std::fprintf(refusal, "earliest feasible start: %s (local %s)\n",
                     format_utc_iso(r.earliest_start).c_str(),
                     local_minute(r.earliest_start).c_str());
        std::set<int64_t> seen;
        for (const Busy& b : r.blockers) {
          if (!seen.insert(b.reservation).second) continue;
          std::fprintf(refusal, "  blocked by reservation %lld (%s, P%lld) %s\n",
                       static_cast<long long>(b.reservation), b.owner.c_str(),
                       static_cast<long long>(b.priority), window_text(b.start, b.end).c_str());
        }
        if (r.earliest_moves) {
          std::fprintf(refusal,
                       "book it with: --start earliest (that start is now + the notice a running "
                       "holder gets: it moves with the clock)\n");
        } else {
          std::fprintf(refusal, "book it with: --start %s\n",
                       format_utc_iso(r.earliest_start).c_str());
        }
      }
      for (const auto& [s, e] : r.proposed_split) {
        std::fprintf(refusal, "  segment %s\n", window_text(s, e).c_str());
      }
      throw ExitStatus{kExitNotNow};
    });
  }

  // ---- reservations, reservation show, cancel, extend ----------------------------------------
  {
    auto a = std::make_shared<LedgerArgs>();
    auto all = std::make_shared<bool>(false);
    CLI::App* cmd = app.add_subcommand("reservations", "List bookings (active ones by default)");
    add_ledger_option(cmd, a.get());
    cmd->add_flag("--all", *all, "Include cancelled and preempted ones and past windows");
    cmd->callback([a, all] {
      const std::vector<Reservation> rs = open_ledger(*a)->reservations(*all, "");
      if (a->json) {
        nlohmann::json j = nlohmann::json::array();
        for (const Reservation& r : rs) j.push_back(to_json(r));
        std::printf("%s\n", dump_json(j).c_str());
        return;
      }
      if (rs.empty()) std::printf("no %sreservations\n", *all ? "" : "active ");
      for (const Reservation& r : rs) print_reservation(r);
    });
  }
  {
    auto a = std::make_shared<LedgerArgs>();
    auto id = std::make_shared<int64_t>(0);
    CLI::App* grp = app.add_subcommand("reservation", "One booking");
    CLI::App* show = grp->add_subcommand("show", "Show a booking and its lease");
    grp->require_subcommand(1);
    add_ledger_option(show, a.get());
    show->add_option("id", *id, "Reservation id")->required()->check(positive_integer());
    show->callback([a, id] {
      auto ledger = open_ledger(*a);
      const Reservation r = ledger->reservation(*id);
      const std::optional<Lease> l = ledger->lease(*id);
      if (a->json) {
        nlohmann::json j = to_json(r);
        if (l) {
          j["lease"] = {
              {"token", l->token},       {"host", l->host},
              {"pid", l->pid},           {"expires", format_utc_iso(l->expires)},
              {"released", l->released}, {"lapsed", !l->released && l->expires <= unix_now()}};
        }
        std::printf("%s\n", dump_json(j).c_str());
        return;
      }
      print_reservation(r);
      if (l) {
        // A holder that stopped renewing (killed, stopped) left its expiry behind: "until" a
        // time past read as held.
        const char* state = l->released                ? "released; would have lapsed at"
                            : l->expires <= unix_now() ? "not renewed: lapsed at"
                                                       : "until";
        std::printf("  lease   token %lld, pid %lld on %s, %s %s\n",
                    static_cast<long long>(l->token), static_cast<long long>(l->pid),
                    l->host.c_str(), state, format_utc_iso(l->expires).c_str());
      }
    });
  }
  {
    auto a = std::make_shared<LedgerArgs>();
    auto id = std::make_shared<int64_t>(0);
    CLI::App* cmd = app.add_subcommand("cancel", "Cancel a booking (owner or admin)");
    add_ledger_option(cmd, a.get(), false);
    cmd->add_option("id", *id, "Reservation id")->required()->check(positive_integer());
    cmd->callback([a, id] {
      const Reservation r = open_ledger(*a)->cancel(*id, current_user());
      std::printf("cancelled reservation %lld\n", static_cast<long long>(r.id));
    });
  }
  {
    auto a = std::make_shared<LedgerArgs>();
    auto id = std::make_shared<int64_t>(0);
    auto by = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand("extend", "Make a booking longer (owner or admin)");
    add_ledger_option(cmd, a.get(), false);
    cmd->add_option("id", *id, "Reservation id")->required()->check(positive_integer());
    cmd->add_option("--by", *by, "How much longer, e.g. 6h")->required();
    cmd->callback([a, id, by] {
      const Reservation r = open_ledger(*a)->extend(*id, parse_duration(*by), current_user());
      print_reservation(r);
    });
  }

  // ---- timeline --------------------------------------------------------------------------------
  {
    auto a = std::make_shared<LedgerArgs>();
    auto hours = std::make_shared<double>(72);
    auto html = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand("timeline", "Per-device timeline of the bookings");
    add_ledger_option(cmd, a.get(), false);
    cmd->add_option("--hours", *hours, "Hours from now to show (default 72)")
        ->check(number_in(1.0, 24.0 * 366));
    cmd->add_option("--html", *html, "Also write a self-contained HTML/SVG page");
    cmd->callback([a, hours, html, cmd] {
      // Before the ledger is read: a page that cannot be written is known at once.
      if (cmd->count("--html") > 0) check_timeline_destination(*html);
      auto ledger = open_ledger(*a);
      const double t0 = std::floor(unix_now() / 3600) * 3600;
      std::vector<Reservation> rs;
      for (const Reservation& r : ledger->reservations(false, "")) {
        if (r.start < t0 + *hours * 3600) rs.push_back(r);
      }
      const std::vector<Device> devs = ledger->devices();
      std::printf("%s", timeline_text(devs, rs, t0, *hours).c_str());
      if (!html->empty()) {
        write_file_atomic(*html, timeline_html(devs, rs, t0, *hours));
        std::printf("wrote %s\n", html->c_str());
      }
    });
  }
}

}  // namespace berth
