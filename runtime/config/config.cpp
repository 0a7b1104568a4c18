// Typed run configuration: TOML file + "section.key=value" overrides -> RunConfig, validated.
//
// Every key is described once in kFields (section, key, pointer to the struct member); parsing,
// override handling, the "known keys" lists in error messages and config_to_toml all walk that
// table, so adding a key to config.h means adding one line here.
#include "runtime/config/config.h"

#include <toml++/toml.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <system_error>
#include <variant>
#include <vector>

#include "runtime/core/backend.h"
#include "runtime/core/check.h"
#include "runtime/core/clock.h"
#include "runtime/core/fs.h"
#include "runtime/core/limits.h"

namespace berth {
namespace {

// ---- the key table -------------------------------------------------------------------------

using FieldRef = std::variant<int64_t*, double*, bool*, std::string*>;

struct Field {
  std::string_view section;
  std::string_view key;
  FieldRef (*ref)(RunConfig&);
};

#define BERTH_CONFIG_FIELD(sec, name) \
  Field { #sec, #name, [](RunConfig& c) -> FieldRef { return &c.sec.name; } }

// Order = declaration order in config.h; it is the order of config_to_toml and error messages.
const Field kFields[] = {
    BERTH_CONFIG_FIELD(run, name),
    BERTH_CONFIG_FIELD(run, out_dir),
    BERTH_CONFIG_FIELD(run, seed),
    BERTH_CONFIG_FIELD(run, device),
    BERTH_CONFIG_FIELD(run, precision),
    BERTH_CONFIG_FIELD(model, n_layer),
    BERTH_CONFIG_FIELD(model, n_head),
    BERTH_CONFIG_FIELD(model, d_model),
    BERTH_CONFIG_FIELD(model, vocab_size),
    BERTH_CONFIG_FIELD(model, max_seq_len),
    BERTH_CONFIG_FIELD(model, init_from),
    BERTH_CONFIG_FIELD(data, train),
    BERTH_CONFIG_FIELD(data, val),
    BERTH_CONFIG_FIELD(data, mode),
    BERTH_CONFIG_FIELD(data, seq_len),
    BERTH_CONFIG_FIELD(data, shuffle),
    BERTH_CONFIG_FIELD(data, pack_algorithm),
    BERTH_CONFIG_FIELD(data, pack_window),
    BERTH_CONFIG_FIELD(data, pack_align),
    BERTH_CONFIG_FIELD(data, long_docs),
    BERTH_CONFIG_FIELD(data, pack_plan),
    BERTH_CONFIG_FIELD(train, micro_batch_size),
    BERTH_CONFIG_FIELD(train, steps),
    BERTH_CONFIG_FIELD(train, lr),
    BERTH_CONFIG_FIELD(train, lr_schedule),
    BERTH_CONFIG_FIELD(train, warmup_steps),
    BERTH_CONFIG_FIELD(train, min_lr),
    BERTH_CONFIG_FIELD(train, beta1),
    BERTH_CONFIG_FIELD(train, beta2),
    BERTH_CONFIG_FIELD(train, eps),
    BERTH_CONFIG_FIELD(train, weight_decay),
    BERTH_CONFIG_FIELD(train, grad_clip),
    BERTH_CONFIG_FIELD(train, log_interval),
    BERTH_CONFIG_FIELD(eval, interval),
    BERTH_CONFIG_FIELD(eval, batches),
    BERTH_CONFIG_FIELD(parallel, tp),
    BERTH_CONFIG_FIELD(parallel, pp),
    BERTH_CONFIG_FIELD(parallel, cp),
    BERTH_CONFIG_FIELD(parallel, dp),
    BERTH_CONFIG_FIELD(parallel, zero),
    BERTH_CONFIG_FIELD(parallel, microbatches),
    BERTH_CONFIG_FIELD(parallel, schedule),
    BERTH_CONFIG_FIELD(parallel, comm_timeout_s),
    BERTH_CONFIG_FIELD(checkpoint, dir),
    BERTH_CONFIG_FIELD(checkpoint, interval),
    BERTH_CONFIG_FIELD(checkpoint, keep_last),
    BERTH_CONFIG_FIELD(checkpoint, final),
    BERTH_CONFIG_FIELD(progress, interval),
    BERTH_CONFIG_FIELD(progress, warmup_steps),
    BERTH_CONFIG_FIELD(progress, peak_tflops),
    BERTH_CONFIG_FIELD(progress, mem_capacity_gib),
    BERTH_CONFIG_FIELD(progress, window_end),
    BERTH_CONFIG_FIELD(reservation, id),
    BERTH_CONFIG_FIELD(reservation, ledger),
    BERTH_CONFIG_FIELD(reservation, lease_ttl_s),
    BERTH_CONFIG_FIELD(reservation, stop_margin_s),
    BERTH_CONFIG_FIELD(reservation, checkpoint_estimate_s),
    BERTH_CONFIG_FIELD(reservation, without),
    BERTH_CONFIG_FIELD(reservation, on_demand_s),
    BERTH_CONFIG_FIELD(debug, fail_rank),
    BERTH_CONFIG_FIELD(debug, fail_step),
    BERTH_CONFIG_FIELD(debug, checkpoint_pause_s),
    BERTH_CONFIG_FIELD(debug, data_delay_s),
    BERTH_CONFIG_FIELD(debug, slow_rank),
    BERTH_CONFIG_FIELD(debug, slow_rank_s),
    BERTH_CONFIG_FIELD(debug, leak_mib_per_step),
    BERTH_CONFIG_FIELD(debug, stall_step),
    BERTH_CONFIG_FIELD(debug, stall_s),
};

#undef BERTH_CONFIG_FIELD

const std::string_view kSections[] = {"run",        "model",    "data",        "train",
                                      "eval",       "parallel", "checkpoint",  "progress",
                                      "reservation", "debug"};

bool is_section(std::string_view section) {
  for (std::string_view s : kSections) {
    if (s == section) return true;
  }
  return false;
}

const Field* find_field(std::string_view section, std::string_view key) {
  for (const Field& f : kFields) {
    if (f.section == section && f.key == key) return &f;
  }
  return nullptr;
}

std::string known_sections() {
  std::string out;
  for (std::string_view s : kSections) {
    if (!out.empty()) out += ", ";
    out += fmt::format("[{}]", s);
  }
  return out;
}

std::string known_keys(std::string_view section) {
  std::string out;
  for (const Field& f : kFields) {
    if (f.section != section) continue;
    if (!out.empty()) out += ", ";
    out += f.key;
  }
  return out;
}

// An unknown key's error (`line`: " (line N)" or ""): the section's known keys, and the sections
// that have a key of that name (`train.microbatches` is parallel.microbatches).
[[noreturn]] void fail_unknown_key(std::string_view where, std::string_view section,
                                   std::string_view key, std::string_view line) {
  std::string elsewhere;
  for (const Field& f : kFields) {
    if (f.key == key && f.section != section) {
      elsewhere += fmt::format("{}{}.{}", elsewhere.empty() ? "" : " or ", f.section, f.key);
    }
  }
  BERTH_FAIL("{}: unknown key '{}.{}'{}{}; known keys of [{}]: {}", where, section, key, line,
             elsewhere.empty() ? "" : fmt::format("; did you mean {}?", elsewhere), section,
             known_keys(section));
}

// ---- TOML values ---------------------------------------------------------------------------

// A TOML basic string literal with ", \ and control characters escaped.
std::string quote_toml(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          out += fmt::format("\\u{:04X}", static_cast<unsigned>(c));
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

// Shortest representation that reads back to the same double, always lexed as a TOML float.
std::string format_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

// "string \"abc\"", "float 2.5", "table" -- what the user wrote, for "got ..." in messages.
std::string describe(const toml::node& node) {
  if (const auto* s = node.as_string()) return fmt::format("string {}", quote_toml(s->get()));
  if (const auto* i = node.as_integer()) return fmt::format("integer {}", i->get());
  if (const auto* d = node.as_floating_point()) {
    return fmt::format("float {}", format_double(d->get()));
  }
  if (const auto* b = node.as_boolean()) return fmt::format("boolean {}", b->get());
  return std::string(type_name(node));
}

// " (line 5)" when the node came from a document with positions, "" otherwise.
std::string line_suffix(const toml::node& node) {
  const toml::source_region& src = node.source();
  if (src.begin.line == 0) return "";
  return fmt::format(" (line {})", src.begin.line);
}

// Stores `node` into the member `field` refers to, or throws "<where>: sec.key must be ...".
void set_field(RunConfig& cfg, const Field& field, const toml::node& node, std::string_view where,
               std::string_view suffix) {
  const FieldRef ref = field.ref(cfg);
  if (auto* p = std::get_if<int64_t*>(&ref)) {
    if (const auto* i = node.as_integer()) {
      **p = i->get();
      return;
    }
    BERTH_FAIL("{}: {}.{} must be an integer, got {}{}", where, field.section, field.key,
               describe(node), suffix);
  }
  if (auto* p = std::get_if<double*>(&ref)) {
    if (const auto* d = node.as_floating_point()) {
      **p = d->get();
      return;
    }
    if (const auto* i = node.as_integer()) {
      **p = static_cast<double>(i->get());
      return;
    }
    BERTH_FAIL("{}: {}.{} must be a number, got {}{}", where, field.section, field.key,
               describe(node), suffix);
  }
  if (auto* p = std::get_if<bool*>(&ref)) {
    if (const auto* b = node.as_boolean()) {
      **p = b->get();
      return;
    }
    BERTH_FAIL("{}: {}.{} must be a boolean (true or false), got {}{}", where, field.section,
               field.key, describe(node), suffix);
  }
  auto* p = std::get<std::string*>(ref);
  if (const auto* s = node.as_string()) {
    *p = s->get();
    return;
  }
  BERTH_FAIL("{}: {}.{} must be a string (in quotes), got {}{}", where, field.section, field.key,
             describe(node), suffix);
}

void apply_document(RunConfig& cfg, const toml::table& doc, std::string_view where) {
  for (auto&& [section_key, section_node] : doc) {
    const std::string_view section = section_key.str();
    const toml::table* section_table = section_node.as_table();
    if (section_table == nullptr) {
      BERTH_FAIL("{}: top-level key '{}' ({}) is not a section{}; put every key under one of "
                 "the sections {}",
                 where, section, type_name(section_node), line_suffix(section_node),
                 known_sections());
    }
    if (!is_section(section)) {
      BERTH_FAIL("{}: unknown section [{}]{}; known sections: {}", where, section,
                 line_suffix(section_node), known_sections());
    }
    for (auto&& [key, node] : *section_table) {
      const Field* field = find_field(section, key.str());
      if (field == nullptr) fail_unknown_key(where, section, key.str(), line_suffix(node));
      set_field(cfg, *field, node, where, line_suffix(node));
    }
  }
}

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

// Applies one "section.key=value" override (see config.h for how the value is read).
void apply_override(RunConfig& cfg, const std::string& override_text) {
  const std::string where = fmt::format("override '{}'", override_text);
  const auto eq = override_text.find('=');
  const std::string_view name = eq == std::string::npos
                                     ? std::string_view{}
                                     : trim(std::string_view(override_text).substr(0, eq));
  const auto dot = name.find('.');
  if (eq == std::string::npos || dot == std::string_view::npos || dot == 0 ||
      dot + 1 == name.size()) {
    BERTH_FAIL("{} is malformed: expected section.key=value, e.g. train.lr=3e-4 or "
               "run.name=my_run",
               where);
  }
  const std::string_view section = name.substr(0, dot);
  const std::string_view key = name.substr(dot + 1);
  if (!is_section(section)) {
    BERTH_FAIL("{}: unknown section [{}]; known sections: {}", where, section, known_sections());
  }
  const Field* field = find_field(section, key);
  if (field == nullptr) fail_unknown_key(where, section, key, "");

  const std::string_view raw = trim(std::string_view(override_text).substr(eq + 1));
  toml::table parsed;
  bool is_toml_value = false;
  std::string why_not_toml;
  try {
    const std::string doc = fmt::format("v = {}", raw);
    parsed = toml::parse(std::string_view(doc), std::string_view("override"));
    is_toml_value = parsed.size() == 1 && parsed.contains("v");
  } catch (const toml::parse_error& e) {
    is_toml_value = false;
    why_not_toml = std::string(e.description());
  }
  const bool string_field = std::holds_alternative<std::string*>(field->ref(cfg));
  // A number key whose value TOML cannot read says why ("n_layer=99999999999999999999" does not
  // fit 64 bits), not "got string".
  if (!is_toml_value && !string_field && !why_not_toml.empty() &&
      raw.find_first_of("0123456789") != std::string_view::npos) {
    BERTH_FAIL("{}: '{}' is not a value {}.{} can take: {}", where, raw, section, key,
               why_not_toml);
  }
  // Not valid TOML ("run.name=foo"), or a string key given a bare number/boolean
  // ("run.name=2024"): the text itself is the string.
  if (!is_toml_value || (string_field && !parsed["v"].is_string())) {
    const toml::value<std::string> as_string{std::string(raw)};
    set_field(cfg, *field, as_string, where, "");
    return;
  }
  set_field(cfg, *field, *parsed.get("v"), where, "");
}

// " (set by the override 'train.lr=5')" for each override whose key `message` names before its
// advice (the first "; ": a key the advice suggests is not what failed) (the last override of a
// key is the one in effect), "" when it names none.
std::string overrides_named_in(std::string_view message,
                               const std::vector<std::string>& overrides) {
  message = message.substr(0, message.find("; "));
  const auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  };
  std::map<std::string, std::string> last;  // key -> override text, in key order
  for (const std::string& o : overrides) {
    const auto eq = o.find('=');
    if (eq != std::string::npos) last[std::string(trim(std::string_view(o).substr(0, eq)))] = o;
  }
  std::string out;
  for (const auto& [key, text] : last) {
    for (size_t at = message.find(key); at != std::string_view::npos;
         at = message.find(key, at + 1)) {
      const size_t end = at + key.size();
      if ((at == 0 || !is_name_char(message[at - 1])) &&
          (end == message.size() || !is_name_char(message[end]) ||
           (message[end] == '.' &&
            (end + 1 == message.size() || !is_name_char(message[end + 1]))))) {
        out += fmt::format(" (set by the override '{}')", text);
        break;
      }
    }
  }
  return out;
}

}  // namespace

std::string with_overrides_named(const std::string& message,
                                 const std::vector<std::string>& overrides) {
  if (message.find("(set by the override '") != std::string::npos) return message;
  return message + overrides_named_in(message, overrides);
}

namespace {

std::string_view where_of(const RunConfig& cfg) {
  return cfg.source.empty() ? std::string_view("config") : std::string_view(cfg.source);
}

}  // namespace

// ---- public API ----------------------------------------------------------------------------

RunConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    BERTH_FAIL("config file '{}' not found; check the path (example configs are in configs/)",
               path);
  }
  if (std::filesystem::is_directory(path, ec)) {
    BERTH_FAIL("config file '{}' is a directory; pass the path of a .toml file", path);
  }
  return parse_config(read_text_file(path), path, overrides);
}

RunConfig parse_config(const std::string& toml_text, const std::string& source_name,
                       const std::vector<std::string>& overrides) {
  RunConfig cfg;
  cfg.source = source_name;
  const std::string_view where = where_of(cfg);
  toml::table doc;
  try {
    doc = toml::parse(std::string_view(toml_text), std::string_view(source_name));
  } catch (const toml::parse_error& e) {
    BERTH_FAIL("{}:{}:{}: TOML syntax error: {}", where, e.source().begin.line,
               e.source().begin.column, e.description());
  }
  apply_document(cfg, doc, where);
  for (const std::string& o : overrides) apply_override(cfg, o);
  try {
    validate_config(cfg);
  } catch (const Error& e) {
    // The checks name the config file; a value an override set is not in it: say so.
    throw Error(with_overrides_named(e.what(), overrides), e.where());
  }
  return cfg;
}

void validate_config(const RunConfig& cfg) {
  const std::string_view w = where_of(cfg);

  // Each size is > 0 and below what this build supports: kernels, schedules and loaders count in
  // 32-bit ints, so a bigger value would wrap (micro_batch_size 2^32 + 2 trained 2 rows a step).
  using limits::kMaxCount;
  const struct {
    const char* name;
    int64_t value, below;
  } sizes[] = {
      {"model.n_layer", cfg.model.n_layer, limits::kMaxLayers},
      {"model.n_head", cfg.model.n_head, limits::kMaxHeads},
      {"model.d_model", cfg.model.d_model, limits::kMaxWidth},
      {"model.vocab_size", cfg.model.vocab_size, limits::kMaxVocab},
      {"model.max_seq_len", cfg.model.max_seq_len, limits::kMaxSeqLen},
      {"data.seq_len", cfg.data.seq_len, limits::kMaxSeqLen},
      {"train.micro_batch_size", cfg.train.micro_batch_size, kMaxCount},
      {"train.steps", cfg.train.steps, std::numeric_limits<int64_t>::max()},  // below, with why
      {"train.log_interval", cfg.train.log_interval, kMaxCount},
      {"eval.batches", cfg.eval.batches, kMaxCount},
      {"parallel.tp", cfg.parallel.tp, kMaxCount},
      {"parallel.pp", cfg.parallel.pp, kMaxCount},
      {"parallel.cp", cfg.parallel.cp, kMaxCount},
      {"parallel.microbatches", cfg.parallel.microbatches, kMaxCount},
  };
  for (const auto& s : sizes) {
    if (s.value <= 0) BERTH_FAIL("{}: {} must be > 0, got {}", w, s.name, s.value);
    if (s.value >= s.below) {
      BERTH_FAIL("{}: {} = {} is beyond what this build supports (it must be below {})", w, s.name,
                 s.value, s.below);
    }
  }
  if (cfg.parallel.dp >= kMaxCount) {
    BERTH_FAIL("{}: parallel.dp = {} is beyond what this build supports (it must be below {})", w,
               cfg.parallel.dp, kMaxCount);
  }
  // The progress predictor forecasts the remaining steps one by one.
  if (cfg.train.steps > limits::kMaxSteps) {
    BERTH_FAIL(
        "{}: train.steps = {} is more than {}, the most berth plans and predicts (real runs "
        "have 10^4..10^6 steps)",
        w, cfg.train.steps, limits::kMaxSteps);
  }
  // One micro-batch's tokens (rows × seq_len) are indexed with an int.
  if (cfg.train.micro_batch_size * cfg.data.seq_len >= limits::kMaxTokensPerPass) {
    BERTH_FAIL(
        "{}: train.micro_batch_size × data.seq_len = {} × {} tokens is beyond what this "
        "build supports (it must be below 2^31); lower train.micro_batch_size and use "
        "parallel.microbatches for a bigger batch",
        w, cfg.train.micro_batch_size, cfg.data.seq_len);
  }
  // A step's tokens, each factor within its bound, can still overflow a count: microbatches and
  // micro_batch_size near their bounds planned -2.1 ZFLOP and -1.55 tok/s.
  {
    const double replica = double(cfg.parallel.microbatches) * double(cfg.train.micro_batch_size) *
                           double(cfg.data.seq_len);
    const double step = replica * double(std::max<int64_t>(1, cfg.parallel.dp));
    if (step >= double(limits::kMaxTokensPerStep)) {
      BERTH_FAIL(
          "{}: a step of {}parallel.microbatches × train.micro_batch_size × data.seq_len = "
          "{}{} × {} × {} = {:.3g} tokens is beyond what this build supports (it must be below "
          "2^46); check these values",
          w, cfg.parallel.dp > 0 ? "parallel.dp × " : "",
          cfg.parallel.dp > 0 ? fmt::format("{} × ", cfg.parallel.dp) : std::string(),
          cfg.parallel.microbatches, cfg.train.micro_batch_size, cfg.data.seq_len, step);
    }
  }
  if (cfg.model.d_model % cfg.model.n_head != 0) {
    BERTH_FAIL("{}: model.d_model ({}) must be divisible by model.n_head ({}); choose d_model "
               "as a multiple of n_head",
               w, cfg.model.d_model, cfg.model.n_head);
  }
  if (cfg.data.seq_len > cfg.model.max_seq_len) {
    BERTH_FAIL("{}: data.seq_len ({}) > model.max_seq_len ({}): lower data.seq_len or raise "
               "model.max_seq_len",
               w, cfg.data.seq_len, cfg.model.max_seq_len);
  }
  // run.name is one directory under run.out_dir: empty, "..", or a path would put the run's
  // files (and checkpoints) somewhere else, e.g. straight into out_dir among other runs'.
  const std::string& run_name = cfg.run.name;
  if (run_name.empty() || run_name == "." || run_name == ".." ||
      run_name.find('/') != std::string::npos) {
    BERTH_FAIL(
        "{}: run.name {} must be one directory name (no '/', not empty, '.' or '..'): the "
        "run's files go to run.out_dir/run.name",
        w, quote_toml(run_name));
  }
  // An empty out_dir (a template's variable left unset) put the run beside the config, in the
  // current directory, without a word.
  if (cfg.run.out_dir.empty()) {
    BERTH_FAIL(
        "{}: run.out_dir is empty; give the directory that holds run directories (\".\" "
        "for the current one)",
        w);
  }
  if (cfg.run.device != "cpu" && cfg.run.device != "cuda" && cfg.run.device != "auto") {
    BERTH_FAIL("{}: unknown run.device {}; use \"cpu\", \"cuda\" or \"auto\"", w,
               quote_toml(cfg.run.device));
  }
  try {
    parse_matmul_precision(cfg.run.precision);  // the one list of precisions
  } catch (const Error& e) {
    BERTH_FAIL("{}: {}", w, e.what());
  }
  if (cfg.data.mode != "stream" && cfg.data.mode != "packed" && cfg.data.mode != "padded") {
    BERTH_FAIL("{}: unknown data.mode {}; use \"stream\", \"packed\" or \"padded\"", w,
               quote_toml(cfg.data.mode));
  }
  const std::string& a = cfg.data.pack_algorithm;
  if (a != "bfd" && a != "next_fit" && a != "balanced") {
    BERTH_FAIL("{}: unknown data.pack_algorithm {}; use \"bfd\", \"next_fit\" or \"balanced\" "
               "(one document per row is data.mode = \"padded\")",
               w, quote_toml(a));
  }
  if (cfg.data.pack_align < 0 || (cfg.data.pack_align > 0 &&
                                   cfg.data.seq_len % cfg.data.pack_align != 0)) {
    BERTH_FAIL("{}: data.pack_align must be 0 (automatic: 2·cp) or a divisor of data.seq_len "
               "({}), got {}",
               w, cfg.data.seq_len, cfg.data.pack_align);
  }
  if (cfg.data.pack_window <= 0) {
    BERTH_FAIL("{}: data.pack_window must be > 0, got {}", w, cfg.data.pack_window);
  }
  if (cfg.data.long_docs != "split" && cfg.data.long_docs != "drop") {
    BERTH_FAIL("{}: unknown data.long_docs {}; use \"split\" (cut into seq_len pieces) or "
               "\"drop\"",
               w, quote_toml(cfg.data.long_docs));
  }

  const TrainSection& t = cfg.train;
  // The optimizer runs in fp32: a value that passes in double can be 0, 1 or inf there (lr 1e-46
  // froze the model without a word, beta2 0.99999999 is 1 and divided by a zero bias correction,
  // and the NaN said to lower train.lr).
  constexpr float kFloatMin = std::numeric_limits<float>::min();
  constexpr double kFloatMax = std::numeric_limits<float>::max();
  // (the range is checked in double first: converting a double beyond it to float is undefined)
  const auto fp32_finite = [](double x) { return std::isfinite(x) && std::fabs(x) <= kFloatMax; };
  const auto fp32_normal = [&](double x) {  // a finite, normal (or zero) fp32 value
    if (!fp32_finite(x)) return false;
    const float f = static_cast<float>(x);
    return f == 0 || std::fabs(f) >= kFloatMin;
  };
  const std::string fp32_range =
      fmt::format("between {:.9g} and {:.9g}, as fp32 holds it", double(kFloatMin), kFloatMax);
  if (!(std::isfinite(t.lr) && t.lr > 0 && fp32_normal(t.lr) && static_cast<float>(t.lr) > 0)) {
    BERTH_FAIL("{}: train.lr must be a number > 0 {}, got {}", w, fp32_range, t.lr);
  }
  if (!(std::isfinite(t.min_lr) && t.min_lr >= 0 && t.min_lr <= t.lr)) {
    BERTH_FAIL("{}: train.min_lr ({}) must be >= 0 and <= train.lr ({})", w, t.min_lr, t.lr);
  }
  if (t.warmup_steps < 0) {
    BERTH_FAIL("{}: train.warmup_steps must be >= 0, got {}", w, t.warmup_steps);
  }
  if (t.lr_schedule != "constant" && t.lr_schedule != "cosine") {
    BERTH_FAIL("{}: unknown train.lr_schedule {}; use \"constant\" or \"cosine\"", w,
               quote_toml(t.lr_schedule));
  }
  for (const auto& [key, beta] : {std::pair{"train.beta1", t.beta1}, {"train.beta2", t.beta2}}) {
    if (!(beta >= 0 && beta < 1 && static_cast<float>(beta) < 1.0f)) {
      BERTH_FAIL(
          "{}: {} must be in [0, 1) as fp32 holds it (at most {:.9g}: a larger value is 1 in "
          "fp32, where AdamW's bias correction 1 - beta^t is then 0), got {}",
          w, key, double(std::nextafter(1.0f, 0.0f)), beta);
    }
  }
  // An eps below the smallest normal float (1e-46: 0 in fp32) divided by zero at the first
  // gradient of 0, and the run diverged with advice to lower train.lr.
  if (!(fp32_normal(t.eps) && static_cast<float>(t.eps) >= kFloatMin)) {
    BERTH_FAIL(
        "{}: train.eps must be a finite number >= {:.9g} (the smallest normal fp32 value: AdamW "
        "updates in fp32, where a smaller eps rounds to 0 or loses its precision), got {}",
        w, double(kFloatMin), t.eps);
  }
  if (!(fp32_finite(t.weight_decay) && t.weight_decay >= 0)) {
    BERTH_FAIL(
        "{}: train.weight_decay must be a number >= 0 that fp32 holds (at most {:.9g}), got {}", w,
        kFloatMax, t.weight_decay);
  }
  if (!(std::isfinite(t.grad_clip) && t.grad_clip >= 0 && fp32_normal(t.grad_clip) &&
        (t.grad_clip == 0 || static_cast<float>(t.grad_clip) > 0))) {
    BERTH_FAIL("{}: train.grad_clip must be 0 (off) or a number {}, got {}", w, fp32_range,
               t.grad_clip);
  }
  if (cfg.eval.interval < 0) {
    BERTH_FAIL("{}: eval.interval must be >= 0 (0 = never), got {}", w, cfg.eval.interval);
  }
  if (cfg.parallel.dp < 0) {
    BERTH_FAIL("{}: parallel.dp must be >= 1, or 0 to take world size / (tp·pp·cp); got {}", w,
               cfg.parallel.dp);
  }
  // Under a second, the watchdog would end healthy jobs: starting up, or one rank saving a
  // checkpoint while the others wait, keeps a collective waiting longer than that.
  if (!(cfg.parallel.comm_timeout_s == 0 || cfg.parallel.comm_timeout_s >= 1) ||
      !std::isfinite(cfg.parallel.comm_timeout_s)) {
    BERTH_FAIL(
        "{}: parallel.comm_timeout_s must be 0 (no timeout) or a number of seconds >= 1, got {}; "
        "it must exceed the longest time one rank keeps the others waiting (default 600)",
        w, cfg.parallel.comm_timeout_s);
  }
  if (cfg.parallel.zero != 0 && cfg.parallel.zero != 1) {
    BERTH_FAIL("{}: parallel.zero must be 0 (replicated optimizer state) or 1 (moments sharded "
               "over dp×cp), got {}",
               w, cfg.parallel.zero);
  }
  if (cfg.parallel.schedule != "1f1b" && cfg.parallel.schedule != "afab") {
    BERTH_FAIL("{}: unknown parallel.schedule {}; use \"1f1b\" (one forward, one backward: at "
               "most pp micro-batches in flight) or \"afab\" (all forwards, then all backwards)",
               w, quote_toml(cfg.parallel.schedule));
  }
  if (cfg.checkpoint.interval < 0 || cfg.checkpoint.keep_last < 0) {
    BERTH_FAIL("{}: checkpoint.interval and checkpoint.keep_last must be >= 0 (0 = off / keep "
               "all), got {} and {}",
               w, cfg.checkpoint.interval, cfg.checkpoint.keep_last);
  }
  const ProgressSection& pr = cfg.progress;
  if (pr.interval <= 0 || pr.warmup_steps < 0) {
    BERTH_FAIL("{}: progress.interval must be > 0 and progress.warmup_steps >= 0, got {} and {}",
               w, pr.interval, pr.warmup_steps);
  }
  // 0 = unknown / detect; otherwise what a device can be (1e-9 TFLOP/s printed an MFU of
  // 1780991509 %, 1e-9 GiB a capacity of 0.0 GiB).
  if (!(pr.peak_tflops == 0 || (pr.peak_tflops >= 1e-3 && pr.peak_tflops <= 1e6))) {
    BERTH_FAIL("{}: progress.peak_tflops = {} must be 0 (unknown) or in [0.001, 1e6] TFLOP/s", w,
               pr.peak_tflops);
  }
  if (!(pr.mem_capacity_gib == 0 ||
        (pr.mem_capacity_gib >= 1.0 / 1024 && pr.mem_capacity_gib <= 1e6))) {
    BERTH_FAIL("{}: progress.mem_capacity_gib = {} must be 0 (detect) or in [1/1024, 1e6] GiB", w,
               pr.mem_capacity_gib);
  }
  if (!pr.window_end.empty()) {
    try {
      parse_utc_time(pr.window_end);
    } catch (const Error& e) {
      BERTH_FAIL("{}: progress.window_end: {}", w, e.what());
    }
  }
  const ReservationSection& rv = cfg.reservation;
  if (rv.id < 0) BERTH_FAIL("{}: reservation.id must be >= 1, or 0 for none; got {}", w, rv.id);
  if (rv.without != "none" && rv.without != "refuse" && rv.without != "on-demand") {
    BERTH_FAIL("{}: unknown reservation.without {}; use \"none\" (train without a lease), "
               "\"refuse\" or \"on-demand\"",
               w, quote_toml(rv.without));
  }
  for (const auto& [name, v] : {std::pair{"lease_ttl_s", rv.lease_ttl_s},
                                {"checkpoint_estimate_s", rv.checkpoint_estimate_s}}) {
    if (!(std::isfinite(v) && v > 0)) BERTH_FAIL("{}: reservation.{} must be > 0, got {}", w, name, v);
  }
  if (!(std::isfinite(rv.on_demand_s) && rv.on_demand_s >= 1)) {  // the ledger books whole seconds
    BERTH_FAIL("{}: reservation.on_demand_s must be at least 1 (seconds), got {}", w,
               rv.on_demand_s);
  }
  if (!(std::isfinite(rv.stop_margin_s) && rv.stop_margin_s >= 0)) {
    BERTH_FAIL("{}: reservation.stop_margin_s must be >= 0, got {}", w, rv.stop_margin_s);
  }
  // An on-demand booking no longer than the stop reserve could run no step: the launch was
  // refused after booking (and cancelling) it, advising an extension of a booking now gone.
  const double reserve_s = stop_reserve_s(rv);
  if (rv.id == 0 && rv.without == "on-demand" && rv.on_demand_s <= reserve_s) {
    BERTH_FAIL(
        "{}: reservation.on_demand_s = {} s is no longer than the stop reserve a leased run "
        "keeps before its window ends ({} s: 1.5 × checkpoint_estimate_s {} + "
        "stop_margin_s {}), so no step could run: raise on_demand_s (e.g. 3600)",
        w, rv.on_demand_s, reserve_s, rv.checkpoint_estimate_s, rv.stop_margin_s);
  }
  const DebugSection& d = cfg.debug;
  for (const auto& [name, v] : {std::pair{"checkpoint_pause_s", d.checkpoint_pause_s},
                                {"data_delay_s", d.data_delay_s},
                                {"slow_rank_s", d.slow_rank_s},
                                {"stall_s", d.stall_s},
                                {"leak_mib_per_step", d.leak_mib_per_step}}) {
    if (!(std::isfinite(v) && v >= 0)) BERTH_FAIL("{}: debug.{} must be >= 0, got {}", w, name, v);
  }
  // Seconds become clock durations in nanoseconds (int64): 1e300 s wrapped to no wait at all.
  using limits::kMaxSeconds;
  for (const auto& [name, v] : {std::pair{"parallel.comm_timeout_s", cfg.parallel.comm_timeout_s},
                                {"reservation.lease_ttl_s", rv.lease_ttl_s},
                                {"reservation.checkpoint_estimate_s", rv.checkpoint_estimate_s},
                                {"reservation.on_demand_s", rv.on_demand_s},
                                {"reservation.stop_margin_s", rv.stop_margin_s},
                                {"debug.checkpoint_pause_s", d.checkpoint_pause_s},
                                {"debug.data_delay_s", d.data_delay_s},
                                {"debug.slow_rank_s", d.slow_rank_s},
                                {"debug.stall_s", d.stall_s}}) {
    if (v > kMaxSeconds) {
      BERTH_FAIL("{}: {} = {} s is more than {:.0e} s (31 years): not a duration berth can wait", w,
                 name, v, kMaxSeconds);
    }
  }
  if (d.leak_mib_per_step > 1e6) {
    BERTH_FAIL("{}: debug.leak_mib_per_step = {} is more than 1e6 MiB (a TiB) a step", w,
               d.leak_mib_per_step);
  }
  if (d.slow_rank < -1) BERTH_FAIL("{}: debug.slow_rank must be >= -1 (-1 = off)", w);
  if (d.stall_step < -1) BERTH_FAIL("{}: debug.stall_step must be >= -1 (-1 = off)", w);
  if (cfg.debug.fail_rank < -1 || cfg.debug.fail_step < -1) {
    BERTH_FAIL("{}: debug.fail_rank and debug.fail_step must be >= -1 (-1 = off)", w);
  }
  // A fault that cannot fire makes a fault test pass without testing anything.
  if ((d.fail_rank >= 0) != (d.fail_step >= 0)) {
    BERTH_FAIL(
        "{}: debug.fail_rank = {} and debug.fail_step = {}: set both (a rank and a 0-based "
        "step) or neither",
        w, d.fail_rank, d.fail_step);
  }
  if ((d.slow_rank >= 0) != (d.slow_rank_s > 0)) {
    BERTH_FAIL(
        "{}: debug.slow_rank = {} and debug.slow_rank_s = {}: set both (a rank and the "
        "seconds it sleeps per step) or neither",
        w, d.slow_rank, d.slow_rank_s);
  }
  if ((d.stall_step >= 0) != (d.stall_s > 0)) {
    BERTH_FAIL(
        "{}: debug.stall_step = {} and debug.stall_s = {}: set both (a 0-based step and "
        "the seconds rank 0 stops) or neither",
        w, d.stall_step, d.stall_s);
  }
  for (const auto& [name, step] :
       {std::pair{"debug.fail_step", d.fail_step}, {"debug.stall_step", d.stall_step}}) {
    if (step >= cfg.train.steps) {
      BERTH_FAIL(
          "{}: {} = {} is past the last step ({} of train.steps = {}, 0-based): it would "
          "never fire",
          w, name, step, cfg.train.steps - 1, cfg.train.steps);
    }
  }
}

namespace {

// A field's value as config_to_toml writes it.
std::string toml_value(const Field& f, RunConfig& cfg) {
  const FieldRef ref = f.ref(cfg);
  if (auto* i = std::get_if<int64_t*>(&ref)) return fmt::format("{}", **i);
  if (auto* d = std::get_if<double*>(&ref)) return format_double(**d);
  if (auto* b = std::get_if<bool*>(&ref)) return **b ? "true" : "false";
  return quote_toml(*std::get<std::string*>(ref));
}

}  // namespace

std::string config_to_toml(const RunConfig& cfg) {
  RunConfig copy = cfg;  // Field::ref takes a mutable config; nothing is written through it
  std::string out;
  std::string_view section;
  for (const Field& f : kFields) {
    if (f.section != section) {
      section = f.section;
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    out += fmt::format("{} = {}\n", f.key, toml_value(f, copy));
  }
  return out;
}

double stop_reserve_s(const ReservationSection& r, double checkpoint_s) {
  return 1.5 * checkpoint_s + r.stop_margin_s;
}

std::vector<std::string> config_differences(const RunConfig& a, const RunConfig& b) {
  RunConfig ca = a, cb = b;  // Field::ref takes a mutable config; nothing is written through it
  std::vector<std::string> out;
  for (const Field& f : kFields) {
    const std::string va = toml_value(f, ca), vb = toml_value(f, cb);
    if (va != vb) out.push_back(fmt::format("{}.{} = {} vs {}", f.section, f.key, va, vb));
  }
  return out;
}

}  // namespace berth
