#include "runtime/config/cluster_files.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "runtime/core/check.h"
#include "runtime/core/fs.h"

namespace berth {
namespace {

toml::table parse_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return toml::parse(std::string_view(text), std::string_view(path));
  } catch (const toml::parse_error& e) {
    BERTH_FAIL("{}:{}:{}: TOML syntax error: {}", path, e.source().begin.line,
               e.source().begin.column, e.description());
  }
}

void only_keys(const toml::table& t, const std::set<std::string>& known, const std::string& where) {
  for (const auto& [k, v] : t) {
    if (!known.count(std::string(k.str()))) {
      std::string list;
      for (const std::string& x : known) list += (list.empty() ? "" : ", ") + x;
      BERTH_FAIL("{}: unknown key '{}' (known: {})", where, k.str(), list);
    }
  }
}

std::vector<std::string> string_list(const toml::table& t, const char* key,
                                     const std::string& where) {
  std::vector<std::string> out;
  const toml::node* n = t.get(key);
  if (!n) return out;
  const toml::array* a = n->as_array();
  BERTH_CHECK(a, "{}: '{}' must be a list of user names", where, key);
  for (const toml::node& x : *a) {
    const auto s = x.value<std::string>();
    BERTH_CHECK(s && !s->empty(), "{}: '{}' must hold non-empty strings", where, key);
    out.push_back(*s);
  }
  return out;
}

}  // namespace

void check_host_name(const std::string& name, const std::string& where) {
  const bool ok = !name.empty() && name.size() <= 253 &&
                  std::all_of(name.begin(), name.end(), [](unsigned char c) {
                    return std::isalnum(c) || c == '.' || c == '-' || c == '_';
                  });
  BERTH_CHECK(ok,
              "{}: host name '{}' must be 1..253 letters, digits, '.', '-' or '_' (as `hostname` "
              "prints it)",
              where, name);
}

std::vector<InventoryHost> read_cluster_inventory(const std::string& path) {
  const toml::table doc = parse_file(path);
  only_keys(doc, {"hosts"}, path);
  const toml::array* hosts = doc["hosts"].as_array();
  BERTH_CHECK(hosts && !hosts->empty(),
              "{}: expected [[hosts]] entries with name, model, memory_gib and gpus", path);
  std::vector<InventoryHost> out;
  int i = 0;
  for (const toml::node& n : *hosts) {
    const std::string where = fmt::format("{} [[hosts]] entry {}", path, ++i);
    const toml::table* t = n.as_table();
    BERTH_CHECK(t, "{}: must be a table", where);
    only_keys(*t, {"name", "model", "memory_gib", "gpus", "kind"}, where);
    InventoryHost h;
    const auto name = (*t)["name"].value<std::string>();
    const auto model = (*t)["model"].value<std::string>();
    const auto mem = (*t)["memory_gib"].value<double>();
    const auto count = (*t)["gpus"].value<int64_t>();
    BERTH_CHECK(name && !name->empty(), "{}: 'name' (host name) is required", where);
    check_host_name(*name, where);
    for (size_t k = 0; k < out.size(); ++k) {
      BERTH_CHECK(out[k].name != *name,
                  "{}: host '{}' is listed already (entry {}); list each host once, with all "
                  "its devices in 'gpus'",
                  where, *name, k + 1);
    }
    BERTH_CHECK(model && !model->empty(), "{}: 'model' (e.g. \"H100\") is required", where);
    BERTH_CHECK(mem && std::isfinite(*mem) && *mem >= 1.0 / 1024 && *mem <= 1e6,
                "{}: 'memory_gib' must be a number of GiB per device in [1/1024, 1000000]", where);
    BERTH_CHECK(count && *count > 0 && *count <= 4096, "{}: 'gpus' must be an integer in 1..4096",
                where);
    h.name = *name, h.model = *model, h.memory_gib = *mem, h.count = *count;
    if (t->contains("kind")) {
      const auto kind = (*t)["kind"].value<std::string>();
      BERTH_CHECK(kind && (*kind == "gpu" || *kind == "cpu"), "{}: 'kind' must be \"gpu\" or "
                  "\"cpu\"", where);
      h.kind = *kind;
    }
    out.push_back(h);
  }
  return out;
}

PolicyFile read_policy_file(const std::string& path) {
  const toml::table doc = parse_file(path);
  only_keys(doc,
            {"admins", "preemptors", "max_p0_per_owner", "min_notice_s", "start_slack_s",
             "max_advance_s"},
            path);
  PolicyFile p;
  p.admins = string_list(doc, "admins", path);
  p.preemptors = string_list(doc, "preemptors", path);
  if (doc.contains("max_p0_per_owner")) {
    const auto v = doc["max_p0_per_owner"].value<int64_t>();
    BERTH_CHECK(v && *v >= 0, "{}: 'max_p0_per_owner' must be an integer >= 0", path);
    p.max_p0_per_owner = *v;
  }
  for (auto [key, field] : {std::pair{"min_notice_s", &p.min_notice_s},
                            {"start_slack_s", &p.start_slack_s},
                            {"max_advance_s", &p.max_advance_s}}) {
    if (!doc.contains(key)) continue;
    const auto v = doc[key].value<double>();
    BERTH_CHECK(v && std::isfinite(*v) && *v >= 0, "{}: '{}' must be a number >= 0", path, key);
    *field = *v;
  }
  return p;
}

}  // namespace berth
