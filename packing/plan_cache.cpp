// Packing plans as HDF5 files; see plan_cache.h for the layout.
#include "packing/plan_cache.h"

#include <hdf5.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/core/check.h"
#include "runtime/core/fnv.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/io/hdf5_util.h"

namespace berth {
namespace {

using h5::describe_type;
using h5::file_access_plist;
using h5::h5_error_detail;
using h5::H5Id;
using h5::H5QuietErrors;
using h5::read_string_attr_value;

constexpr const char* kPackHint = "rebuild it with `berth pack`";

const char* long_docs_name(LongDocs l) { return l == LongDocs::DROP ? "drop" : "split"; }

// ---- writing ------------------------------------------------------------------------------------

void write_hdf5(const std::string& tmp, const std::string& path, const PackPlan& plan,
                const std::string& key) {
  const h5::FileWriter w("packing plan", path);
  H5Id file = w.create_temporary(tmp);
  const hid_t f = file.get();
  const PackOptions& o = plan.options;
  w.string_attr(f, "format", kPlanFormatName);
  w.i64_attr(f, "format_version", kPlanFormatVersion);
  w.string_attr(f, "key", key);
  w.i64_attr(f, "seq_len", o.seq_len);
  w.string_attr(f, "algorithm", pack_algorithm_name(o.algorithm));
  w.i64_attr(f, "window", o.window);
  w.scalar_attr(f, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &o.seed);
  w.string_attr(f, "long_docs", long_docs_name(o.long_docs));
  w.scalar_attr(f, "alpha", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &o.alpha);
  w.scalar_attr(f, "beta", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &o.beta);
  w.i64_attr(f, "align", o.align);

  auto i64_dataset = [&](const char* name, const std::vector<int64_t>& v) {
    w.dataset_1d(f, name, H5T_STD_I64LE, H5T_NATIVE_INT64, v.data(), v.size());
  };
  i64_dataset("row_offsets", plan.row_offsets);
  std::vector<int64_t> col(plan.pieces.size());
  for (size_t i = 0; i < col.size(); ++i) col[i] = plan.pieces[i].doc;
  i64_dataset("piece_doc", col);
  for (size_t i = 0; i < col.size(); ++i) col[i] = plan.pieces[i].start;
  i64_dataset("piece_start", col);
  for (size_t i = 0; i < col.size(); ++i) col[i] = plan.pieces[i].length;
  i64_dataset("piece_length", col);
  w.finish(file);
}

// ---- reading ------------------------------------------------------------------------------------

[[noreturn]] void fail_corrupt(const std::string& path, const std::string& step) {
  BERTH_FAIL("packing plan '{}' is not a readable HDF5 file (corrupt or truncated?): {} failed: "
             "{}; {}",
             path, step, h5_error_detail(), kPackHint);
}

H5Id open_attr(hid_t file, const char* name, H5T_class_t expected, const std::string& path) {
  const htri_t exists = H5Aexists(file, name);
  if (exists < 0) fail_corrupt(path, fmt::format("looking up attribute '{}'", name));
  if (exists == 0) {
    BERTH_FAIL("'{}' has no '{}' attribute: not a berth packing plan; {}", path, name, kPackHint);
  }
  H5Id attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) fail_corrupt(path, fmt::format("opening attribute '{}'", name));
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  H5Id space(H5Aget_space(attr.get()), H5Sclose);
  if (!type.valid() || !space.valid()) fail_corrupt(path, fmt::format("attribute '{}'", name));
  if (H5Tget_class(type.get()) != expected || H5Sget_simple_extent_npoints(space.get()) != 1) {
    BERTH_FAIL("'{}': attribute '{}' is {} (or not a single value), expected one {}; {}", path,
               name, describe_type(type.get()),
               expected == H5T_STRING ? "string" : expected == H5T_FLOAT ? "float" : "integer",
               kPackHint);
  }
  return attr;
}

std::string read_string_attr(hid_t file, const char* name, const std::string& path) {
  H5Id attr = open_attr(file, name, H5T_STRING, path);
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  std::string value;
  if (!type.valid() || !read_string_attr_value(attr.get(), type.get(), &value)) {
    fail_corrupt(path, fmt::format("reading attribute '{}'", name));
  }
  return value;
}

template <typename V>
V read_num_attr(hid_t file, const char* name, H5T_class_t cls, hid_t mem_type,
                const std::string& path) {
  H5Id attr = open_attr(file, name, cls, path);
  V value{};
  if (H5Aread(attr.get(), mem_type, &value) < 0) {
    fail_corrupt(path, fmt::format("reading attribute '{}'", name));
  }
  return value;
}

std::vector<int64_t> read_i64_dataset(hid_t file, const char* name, const std::string& path) {
  const htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
  if (exists < 0) fail_corrupt(path, fmt::format("looking up /{}", name));
  if (exists == 0) {
    BERTH_FAIL("'{}' has no /{} dataset: not a complete berth packing plan; {}", path, name,
               kPackHint);
  }
  H5Id dset(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail_corrupt(path, fmt::format("opening /{}", name));
  H5Id type(H5Dget_type(dset.get()), H5Tclose);
  H5Id space(H5Dget_space(dset.get()), H5Sclose);
  if (!type.valid() || !space.valid()) fail_corrupt(path, fmt::format("reading /{}", name));
  if (H5Tget_class(type.get()) != H5T_INTEGER || H5Sget_simple_extent_ndims(space.get()) != 1) {
    BERTH_FAIL("'{}': /{} is not a 1-D integer dataset ({}); {}", path, name,
               describe_type(type.get()), kPackHint);
  }
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  std::vector<int64_t> v(static_cast<size_t>(dims[0]));
  if (!v.empty() &&
      H5Dread(dset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) < 0) {
    fail_corrupt(path, fmt::format("reading /{}", name));
  }
  return v;
}

PackPlan read_hdf5(const std::string& path, std::string* key, bool header_only = false) {
  H5Id fapl(file_access_plist(), H5Pclose);
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) fail_corrupt(path, "opening");
  const hid_t f = file.get();

  const std::string format = read_string_attr(f, "format", path);
  if (format != kPlanFormatName) {
    BERTH_FAIL("'{}' has format '{}', expected '{}': not a berth packing plan; {}", path, format,
               kPlanFormatName, kPackHint);
  }
  const auto version = read_num_attr<int64_t>(f, "format_version", H5T_INTEGER, H5T_NATIVE_INT64,
                                              path);
  if (version != kPlanFormatVersion) {
    BERTH_FAIL("packing plan '{}' has format_version {}, this build reads {}; {} (or delete it: a "
               "plan is rebuilt when missing)",
               path, version, kPlanFormatVersion, kPackHint);
  }
  PackPlan plan;
  PackOptions& o = plan.options;
  if (key != nullptr) *key = read_string_attr(f, "key", path);
  o.seq_len = read_num_attr<int64_t>(f, "seq_len", H5T_INTEGER, H5T_NATIVE_INT64, path);
  o.algorithm = parse_pack_algorithm(read_string_attr(f, "algorithm", path));
  o.window = read_num_attr<int64_t>(f, "window", H5T_INTEGER, H5T_NATIVE_INT64, path);
  o.seed = read_num_attr<uint64_t>(f, "seed", H5T_INTEGER, H5T_NATIVE_UINT64, path);
  const std::string long_docs = read_string_attr(f, "long_docs", path);
  BERTH_CHECK(long_docs == "split" || long_docs == "drop",
              "'{}': attribute long_docs is '{}', expected 'split' or 'drop'; {}", path, long_docs,
              kPackHint);
  o.long_docs = long_docs == "drop" ? LongDocs::DROP : LongDocs::SPLIT;
  o.alpha = read_num_attr<double>(f, "alpha", H5T_FLOAT, H5T_NATIVE_DOUBLE, path);
  o.beta = read_num_attr<double>(f, "beta", H5T_FLOAT, H5T_NATIVE_DOUBLE, path);
  // Plans written before the attribute existed are unaligned.
  o.align = H5Aexists(f, "align") > 0
                ? read_num_attr<int64_t>(f, "align", H5T_INTEGER, H5T_NATIVE_INT64, path)
                : 1;
  BERTH_CHECK(o.align >= 1 && o.seq_len % o.align == 0,
              "'{}': attribute align is {}, which does not divide seq_len {}; {}", path, o.align,
              o.seq_len, kPackHint);
  if (header_only) return plan;

  plan.row_offsets = read_i64_dataset(f, "row_offsets", path);
  const std::vector<int64_t> doc = read_i64_dataset(f, "piece_doc", path);
  const std::vector<int64_t> start = read_i64_dataset(f, "piece_start", path);
  const std::vector<int64_t> length = read_i64_dataset(f, "piece_length", path);

  // Consistency: a plan that passes these can be indexed without further checks.
  BERTH_CHECK(doc.size() == start.size() && doc.size() == length.size(),
              "'{}': piece_doc/piece_start/piece_length have {}/{}/{} entries, expected equal; {}",
              path, doc.size(), start.size(), length.size(), kPackHint);
  const auto& ro = plan.row_offsets;
  BERTH_CHECK(!ro.empty() && ro.front() == 0 && ro.back() == int64_t(doc.size()),
              "'{}': row_offsets must start at 0 and end at the piece count {}; {}", path,
              doc.size(), kPackHint);
  for (size_t r = 1; r < ro.size(); ++r) {
    BERTH_CHECK(ro[r] >= ro[r - 1], "'{}': row_offsets[{}] = {} < row_offsets[{}] = {}; {}", path,
                r, ro[r], r - 1, ro[r - 1], kPackHint);
  }
  plan.pieces.resize(doc.size());
  for (size_t i = 0; i < doc.size(); ++i) {
    BERTH_CHECK(doc[i] >= 0 && start[i] >= 0 && length[i] > 0 && length[i] <= o.seq_len,
                "'{}': piece {} (doc {}, start {}, length {}) is out of range for seq_len {}; {}",
                path, i, doc[i], start[i], length[i], o.seq_len, kPackHint);
    plan.pieces[i] = Piece{doc[i], start[i], length[i]};
  }
  return plan;
}

}  // namespace

// ---- public API ---------------------------------------------------------------------------------

std::string plan_key(const std::vector<uint64_t>& doc_offsets, const PackOptions& o) {
  Fnv1a h;
  h.u64(uint64_t(kPlanFormatVersion));
  h.u64(uint64_t(o.seq_len));
  h.u64(uint64_t(o.algorithm));
  h.u64(uint64_t(o.window));
  h.u64(uint64_t(o.long_docs));
  h.u64(o.seed);
  h.f64(o.alpha);
  h.f64(o.beta);
  if (o.align != 1) h.u64(uint64_t(o.align));  // (absent for 1: older keys stay valid)
  h.u64(doc_offsets.size());
  for (const uint64_t off : doc_offsets) h.u64(off);
  return fmt::format("{:016x}", h.h);
}

void require_plan_destination(const std::string& path) {
  // An unreadable file under a plan's default name (<data>.plan-….h5) is a broken cache.
  const std::string name = std::filesystem::path(path).filename().string();
  const bool plan_name = name.find(".plan-") != std::string::npos && name.ends_with(".h5");
  if (const std::string why = h5::foreign_file_reason(path, kPlanFormatName, plan_name);
      !why.empty()) {
    BERTH_FAIL(
        "refusing to write a packing plan to '{}': {}, and berth replaces only its own "
        "packing plans; choose another plan path (data.pack_plan, or berth pack --out)",
        path, why);
  }
}

void write_plan(const std::string& path, const PackPlan& plan, const std::string& key) {
  require_plan_destination(path);
  H5QuietErrors quiet;
  write_via_temp(path, [&](const std::string& tmp) { write_hdf5(tmp, path, plan, key); });
}

PackPlan read_plan(const std::string& path, std::string* key) {
  h5::require_hdf5_file(path, "packing plan", "build one with `berth pack`");
  H5QuietErrors quiet;
  return read_hdf5(path, key);
}

PackOptions read_plan_header(const std::string& path, std::string* key) {
  h5::require_hdf5_file(path, "packing plan", "build one with `berth pack`");
  H5QuietErrors quiet;
  return read_hdf5(path, key, true).options;
}

std::string stale_plan_reason(const PackPlan& plan, const PackOptions& now) {
  const PackOptions& was = plan.options;
  std::string out;
  auto differs = [&](const char* what, const std::string& a, const std::string& b) {
    if (a != b) out += fmt::format("{}{} {}, expected {}", out.empty() ? "" : "; ", what, a, b);
  };
  differs("seq_len", std::to_string(was.seq_len), std::to_string(now.seq_len));
  differs("algorithm", pack_algorithm_name(was.algorithm), pack_algorithm_name(now.algorithm));
  differs("window", std::to_string(was.window), std::to_string(now.window));
  differs("seed", std::to_string(was.seed), std::to_string(now.seed));
  differs("long_docs", long_docs_name(was.long_docs), long_docs_name(now.long_docs));
  differs("alpha", fmt::format("{}", was.alpha), fmt::format("{}", now.alpha));
  differs("beta", fmt::format("{}", was.beta), fmt::format("{}", now.beta));
  differs("align", std::to_string(was.align), std::to_string(now.align));
  return out.empty() ? std::string("built for other documents: the dataset changed")
                     : "built with " + out;
}

namespace {

// `word` as one shell word: as it is when plain, else in single quotes ('\'' for a quote).
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./-+=:,@%", c) != nullptr;
  });
  if (plain) return word;
  std::string out = "'";
  for (const char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string pack_command(const std::string& data, const PackOptions& o, const std::string& out) {
  return fmt::format(
      "berth pack --data {} --seq-len {} --algorithm {} --window {} --seed {}{}{} "
      "--out {}",
      shell_word(data), o.seq_len, pack_algorithm_name(o.algorithm), o.window,
      static_cast<int64_t>(o.seed), o.long_docs == LongDocs::DROP ? " --drop-long" : "",
      o.align > 1 ? fmt::format(" --align {}", o.align) : std::string(), shell_word(out));
}

std::vector<int64_t> doc_lengths_from_offsets(const std::vector<uint64_t>& doc_offsets) {
  std::vector<int64_t> lengths(doc_offsets.empty() ? 0 : doc_offsets.size() - 1);
  for (size_t i = 0; i < lengths.size(); ++i) {
    BERTH_CHECK(doc_offsets[i + 1] >= doc_offsets[i],
                "doc_offsets[{}] = {} < doc_offsets[{}] = {}; offsets must be non-decreasing",
                i + 1, doc_offsets[i + 1], i, doc_offsets[i]);
    lengths[i] = int64_t(doc_offsets[i + 1] - doc_offsets[i]);
  }
  return lengths;
}

PackPlan load_or_build_plan(const std::string& cache_path, const std::vector<uint64_t>& doc_offsets,
                            const PackOptions& options, bool* reused) {
  const std::string key = plan_key(doc_offsets, options);
  const std::vector<int64_t> doc_lengths = doc_lengths_from_offsets(doc_offsets);
  if (reused != nullptr) *reused = false;
  std::error_code ec;
  if (std::filesystem::exists(cache_path, ec)) {
    std::string old_key;
    try {
      PackPlan cached = read_plan(cache_path, &old_key);
      if (old_key == key) {
        // The key names the dataset and the options; the pieces can still have been damaged or
        // edited since (they trained on a slice of the data, or failed hundreds of steps in).
        const std::string why = plan_mismatch(cached, doc_lengths);
        if (why.empty()) {
          if (reused != nullptr) *reused = true;
          return cached;
        }
        log_warn(
            "packing plan {} has this dataset's key but not its documents ({}): damaged "
            "or edited; rebuilding",
            cache_path, why);
      } else {
        log_info("packing plan {} is stale ({}), rebuilding", cache_path,
                 stale_plan_reason(cached, options));
      }
    } catch (const Error& e) {
      // A cache: an unreadable or old-format plan is rebuilt, not fatal; any other file stays.
      require_plan_destination(cache_path);
      log_info("packing plan {} is unreadable (key {}), rebuilding: {}", cache_path, key, e.what());
    }
  }
  PackPlan plan = pack_documents(doc_lengths, options);
  write_plan(cache_path, plan, key);
  return plan;
}

}  // namespace berth
