// Token datasets on disk (HDF5 C API) and in memory; see token_dataset.h for the file layout.
#include "runtime/io/token_dataset.h"

#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "runtime/core/check.h"
#include "runtime/core/fnv.h"
#include "runtime/core/fs.h"
#include "runtime/core/host_memory.h"
#include "runtime/io/hdf5_util.h"
#include "runtime/io/importers.h"

namespace berth {
namespace {

using h5::describe_type;
using h5::file_access_plist;
using h5::h5_error_detail;
using h5::H5Id;
using h5::H5QuietErrors;
using h5::read_string_attr_value;

constexpr const char* kImportHint = "import it with `berth data import`";

// ---- writing ------------------------------------------------------------------------------------

void write_hdf5(const std::string& tmp, const std::string& path, const TokenDataset& ds) {
  const h5::FileWriter w("token dataset", path);
  H5Id file = w.create_temporary(tmp);
  const hid_t f = file.get();
  w.string_attr(f, "format", kTokenFormatName);
  w.i64_attr(f, "format_version", kTokenFormatVersion);
  w.i64_attr(f, "vocab_size", ds.vocab_size);
  w.i64_attr(f, "eot_token", ds.eot_token);
  w.string_attr(f, "tokenizer", ds.tokenizer);

  const hid_t token_type = ds.vocab_size <= 65536 ? H5T_STD_U16LE : H5T_STD_U32LE;
  w.dataset_1d(f, "tokens", token_type, H5T_NATIVE_UINT32, ds.tokens.data(), ds.tokens.size());
  w.dataset_1d(f, "doc_offsets", H5T_STD_U64LE, H5T_NATIVE_UINT64, ds.doc_offsets.data(),
               ds.doc_offsets.size());
  if (!ds.loss_mask.empty()) {
    w.dataset_1d(f, "loss_mask", H5T_STD_U8LE, H5T_NATIVE_UINT8, ds.loss_mask.data(),
                 ds.loss_mask.size());
  }
  w.finish(file);
}

// ---- reading ------------------------------------------------------------------------------------

[[noreturn]] void fail_corrupt(const std::string& path, const std::string& step) {
  BERTH_FAIL("'{}' is not a readable HDF5 file (corrupt or truncated?): {} failed: {}", path, step,
             h5_error_detail());
}

H5Id open_attr(hid_t file, const char* name, const std::string& path) {
  const htri_t exists = H5Aexists(file, name);
  if (exists < 0) fail_corrupt(path, fmt::format("looking up attribute '{}'", name));
  if (exists == 0) {
    BERTH_FAIL("'{}' has no '{}' attribute: not a berth token dataset; {}", path, name,
               kImportHint);
  }
  H5Id attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) fail_corrupt(path, fmt::format("opening attribute '{}'", name));
  H5Id space(H5Aget_space(attr.get()), H5Sclose);
  if (!space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1) {
    BERTH_FAIL("'{}': attribute '{}' must hold exactly one value; {}", path, name, kImportHint);
  }
  return attr;
}

std::string read_string_attr(hid_t file, const char* name, const std::string& path) {
  H5Id attr = open_attr(file, name, path);
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid()) fail_corrupt(path, fmt::format("reading attribute '{}'", name));
  if (H5Tget_class(type.get()) != H5T_STRING) {
    BERTH_FAIL("'{}': attribute '{}' is {}, expected a string; {}", path, name,
               describe_type(type.get()), kImportHint);
  }
  std::string value;
  if (!read_string_attr_value(attr.get(), type.get(), &value)) {
    fail_corrupt(path, fmt::format("reading attribute '{}'", name));
  }
  return value;
}

int64_t read_int_attr(hid_t file, const char* name, const std::string& path) {
  H5Id attr = open_attr(file, name, path);
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid()) fail_corrupt(path, fmt::format("reading attribute '{}'", name));
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    BERTH_FAIL("'{}': attribute '{}' is {}, expected an integer; {}", path, name,
               describe_type(type.get()), kImportHint);
  }
  int64_t value = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &value) < 0) {
    fail_corrupt(path, fmt::format("reading attribute '{}'", name));
  }
  return value;
}

// Opens dataset /name; returns an invalid handle when it is absent and !required.
H5Id open_dataset(hid_t file, const char* name, bool required, const std::string& path) {
  const htri_t exists = H5Lexists(file, name, H5P_DEFAULT);
  if (exists < 0) fail_corrupt(path, fmt::format("looking up /{}", name));
  if (exists == 0) {
    if (!required) return H5Id();
    BERTH_FAIL("'{}' has no /{} dataset: not a berth token dataset; {}", path, name, kImportHint);
  }
  H5Id dset(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) {
    BERTH_FAIL("'{}': /{} exists but is not a readable dataset ({}); {}", path, name,
               h5_error_detail(), kImportHint);
  }
  return dset;
}

// Checks /name is an integer dataset (optionally of a set of sizes/unsignedness) and 1-D; returns
// its length and whether it is signed.
struct IntShape {
  size_t n = 0;
  bool is_signed = false;
  size_t nbytes = 0;
};
// `to_read`: the values are about to be read into memory (not only the shape, as for a plan).
IntShape check_int_1d(hid_t dset, const char* name, const char* expected, const std::string& path,
                      bool to_read) {
  H5Id type(H5Dget_type(dset), H5Tclose);
  if (!type.valid()) fail_corrupt(path, fmt::format("reading the type of /{}", name));
  if (H5Tget_class(type.get()) != H5T_INTEGER) {
    BERTH_FAIL("'{}': /{} has element type {}, expected {}; {}", path, name,
               describe_type(type.get()), expected, kImportHint);
  }
  IntShape shape;
  shape.is_signed = H5Tget_sign(type.get()) != H5T_SGN_NONE;
  shape.nbytes = H5Tget_size(type.get());
  // Every bit of the element is the number: a header that says otherwise (a damaged byte; the
  // checksum covers the data, not the header) would have HDF5 convert each value to another one.
  if (H5Tget_precision(type.get()) != 8 * shape.nbytes || H5Tget_offset(type.get()) != 0) {
    BERTH_FAIL(
        "'{}': /{} is a {}-byte integer whose header says only {} of its bits, from bit {}, are "
        "the number: a damaged type header, or a writer berth does not read; {}",
        path, name, shape.nbytes, H5Tget_precision(type.get()), H5Tget_offset(type.get()),
        kImportHint);
  }
  H5Id space(H5Dget_space(dset), H5Sclose);
  if (!space.valid()) fail_corrupt(path, fmt::format("reading the shape of /{}", name));
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  if (ndims != 1) {
    BERTH_FAIL("'{}': /{} has {} dimensions, expected a 1-D dataset; {}", path, name, ndims,
               kImportHint);
  }
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  shape.n = static_cast<size_t>(dims[0]);
  // Without compression a dataset's storage holds every value; less means a header that declares
  // more than was written (reading it would allocate for values that are not there).
  H5Id dcpl(H5Dget_create_plist(dset), H5Pclose);
  const bool filtered = !dcpl.valid() || H5Pget_nfilters(dcpl.get()) != 0;
  const double declared = double(shape.n) * double(shape.nbytes);
  const double stored = double(H5Dget_storage_size(dset));
  if (!filtered && stored < declared) {
    BERTH_FAIL(
        "'{}': /{} declares {} values ({:.0f} bytes) but the file stores {:.0f} bytes of "
        "it: truncated or corrupt; {}",
        path, name, shape.n, declared, stored, kImportHint);
  }
  // Compressed, the stored size says nothing; a chunk never written is read back as zeros (a
  // 10 KB file trained on 3 M zero tokens), so every chunk must have been written. (Counted:
  // H5Dget_space_status compares bytes before HDF5 1.10.9 and calls every compressed dataset
  // partly written.)
  if (const h5::ChunkCount c = h5::chunk_count(dset); shape.n > 0 && c.written < c.declared) {
    BERTH_FAIL(
        "'{}': /{} declares {} values in {:.0f} chunks but the file holds {:.0f} of them: "
        "truncated or corrupt; {}",
        path, name, shape.n, c.declared, std::max(c.written, 0.0), kImportHint);
  }
  // Reading allocates the declared size: more than this process may hold is a damaged header (or
  // a dataset for a bigger machine), said before the allocation fails (or the cgroup's OOM kill).
  const double memory = host_memory_limit_bytes();
  if (to_read && memory > 0 && declared > memory) {
    BERTH_FAIL(
        "'{}': /{} declares {} values ({:.1f} GiB), more than this process may use "
        "({:.1f} GiB: the host's memory or its cgroup's limit): a damaged header, or a dataset "
        "for a bigger machine",
        path, name, shape.n, declared / 1073741824.0, memory / 1073741824.0);
  }
  return shape;
}

void read_all(hid_t dset, hid_t mem_type, void* data, size_t n, const char* name,
              const std::string& path) {
  if (n > 0 && H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    fail_corrupt(path, fmt::format("reading /{}", name));
  }
}

// What read_hdf5 reads besides the attributes and shapes.
enum class Read { kShape, kOffsets, kAll };

// Reads the header and the datasets' shapes, and what `what` asks for: the document offsets, or
// every dataset's contents.
TokenDataset read_hdf5(const std::string& path, Read what, TokenDatasetShape* shape) {
  const bool data = what == Read::kAll, offsets_too = what != Read::kShape;
  H5Id fapl(file_access_plist(), H5Pclose);
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) fail_corrupt(path, "opening");
  const hid_t f = file.get();

  const std::string format = read_string_attr(f, "format", path);
  if (format != kTokenFormatName) {
    BERTH_FAIL("'{}' has format '{}', expected '{}': not a berth token dataset; {}", path, format,
               kTokenFormatName, kImportHint);
  }
  const int64_t version = read_int_attr(f, "format_version", path);
  if (version > kTokenFormatVersion) {
    BERTH_FAIL("'{}' has format_version {}, this build reads {}; upgrade berth or re-import the "
               "data with this build's `berth data import`",
               path, version, kTokenFormatVersion);
  }
  if (version < 1) {
    BERTH_FAIL("'{}' has invalid format_version {} (expected {}); {}", path, version,
               kTokenFormatVersion, kImportHint);
  }

  TokenDataset ds;
  ds.vocab_size = read_int_attr(f, "vocab_size", path);
  ds.eot_token = read_int_attr(f, "eot_token", path);
  ds.tokenizer = read_string_attr(f, "tokenizer", path);

  H5Id tokens = open_dataset(f, "tokens", true, path);
  H5Id offsets = open_dataset(f, "doc_offsets", true, path);
  H5Id mask = open_dataset(f, "loss_mask", false, path);

  const IntShape ts = check_int_1d(tokens.get(), "tokens", "uint16 or uint32", path, data);
  if (ts.is_signed || (ts.nbytes != 2 && ts.nbytes != 4)) {
    BERTH_FAIL("'{}': /tokens has element type {}int{}, expected uint16 or uint32; {}", path,
               ts.is_signed ? "" : "u", ts.nbytes * 8, kImportHint);
  }
  const IntShape os = check_int_1d(offsets.get(), "doc_offsets", "uint64", path, offsets_too);
  IntShape ms;
  if (mask.valid()) {
    ms = check_int_1d(mask.get(), "loss_mask", "uint8", path, data);
    if (ms.nbytes != 1) {
      BERTH_FAIL("'{}': /loss_mask has element type {}int{}, expected uint8; {}", path,
                 ms.is_signed ? "" : "u", ms.nbytes * 8, kImportHint);
    }
  }

  if (shape != nullptr) {
    shape->n_tokens = int64_t(ts.n);
    shape->n_docs = os.n > 0 ? int64_t(os.n) - 1 : 0;
    shape->has_loss_mask = mask.valid();
    shape->vocab_size = ds.vocab_size;
  }
  if (!offsets_too) return ds;
  // A signed file type is read with its own sign: a negative offset (mask value) shows up as a huge
  // (>= 128) value that validate_dataset then rejects, instead of being silently clipped to 0.
  ds.doc_offsets.resize(os.n);
  read_all(offsets.get(), os.is_signed ? H5T_NATIVE_INT64 : H5T_NATIVE_UINT64,
           ds.doc_offsets.data(), os.n, "doc_offsets", path);
  if (!data) return ds;
  ds.tokens.resize(ts.n);
  read_all(tokens.get(), H5T_NATIVE_UINT32, ds.tokens.data(), ts.n, "tokens", path);
  if (mask.valid()) {
    ds.loss_mask.resize(ms.n);
    read_all(mask.get(), ms.is_signed ? H5T_NATIVE_INT8 : H5T_NATIVE_UINT8, ds.loss_mask.data(),
             ms.n, "loss_mask", path);
  }
  return ds;
}

}  // namespace

// ---- validation ---------------------------------------------------------------------------------

namespace {
// A doc_offset as the file holds it: a negative one of a signed file type, read with its sign into
// uint64, is shown as the negative number it is, not wrapped to 2^64 - n.
std::string offset_text(uint64_t v) {
  if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::to_string(v);
  return std::to_string(static_cast<int64_t>(v)) + " (negative)";
}
}  // namespace

void validate_dataset(const TokenDataset& ds, const std::string& what) {
  if (ds.vocab_size <= 0 || ds.vocab_size > (int64_t{1} << 32)) {
    BERTH_FAIL("'{}': vocab_size {} must be in [1, 2^32]", what, ds.vocab_size);
  }
  if (ds.eot_token < -1 || ds.eot_token >= ds.vocab_size) {
    BERTH_FAIL("'{}': eot_token {} must be -1 (none) or in [0, vocab_size {})", what, ds.eot_token,
               ds.vocab_size);
  }
  const auto& off = ds.doc_offsets;
  if (off.empty()) {
    BERTH_FAIL("'{}': doc_offsets is empty; it needs n_docs + 1 entries starting at 0", what);
  }
  if (off.front() != 0) {
    BERTH_FAIL("'{}': doc_offsets[0] is {}, expected 0", what, offset_text(off.front()));
  }
  for (size_t i = 1; i < off.size(); ++i) {
    if (off[i] > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      BERTH_FAIL("'{}': doc_offsets[{}] is {}; offsets are token positions and cannot be negative",
                 what, i, offset_text(off[i]));
    }
    if (off[i] < off[i - 1]) {
      BERTH_FAIL(
          "'{}': doc_offsets[{}] = {} is less than doc_offsets[{}] = {}; offsets must be "
          "non-decreasing",
          what, i, offset_text(off[i]), i - 1, offset_text(off[i - 1]));
    }
  }
  if (off.back() != ds.tokens.size()) {
    BERTH_FAIL("'{}': the last doc_offset is {} but there are {} tokens; they must be equal", what,
               offset_text(off.back()), ds.tokens.size());
  }
  const uint64_t vocab = static_cast<uint64_t>(ds.vocab_size);
  for (size_t i = 0; i < ds.tokens.size(); ++i) {
    if (ds.tokens[i] >= vocab) {
      BERTH_FAIL("'{}': token {} at index {} is >= vocab_size {}", what, ds.tokens[i], i,
                 ds.vocab_size);
    }
  }
  if (!ds.loss_mask.empty()) {
    if (ds.loss_mask.size() != ds.tokens.size()) {
      BERTH_FAIL("'{}': loss_mask has {} entries but there are {} tokens; it must be empty or one "
                 "per token",
                 what, ds.loss_mask.size(), ds.tokens.size());
    }
    for (size_t i = 0; i < ds.loss_mask.size(); ++i) {
      if (ds.loss_mask[i] > 1) {
        BERTH_FAIL("'{}': loss_mask[{}] is {}, expected 0 or 1", what, i, ds.loss_mask[i]);
      }
    }
  }
}

// ---- write / read -------------------------------------------------------------------------------

namespace {

// An HDF5 file, or a specific error; an llm.c token file (what `data import --format llmc`
// reads) is named as such, with the command that converts it.
void require_dataset_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path, ec)) {
    int32_t magic = 0;
    std::ifstream in(path, std::ios::binary);
    if (in.read(reinterpret_cast<char*>(&magic), sizeof magic) && magic == kLlmcTokenMagic) {
      BERTH_FAIL(
          "'{}' is an llm.c token file, not a berth token dataset: convert it with "
          "`berth data import --format llmc {} --out DATA.h5`",
          path, path);
    }
  }
  h5::require_hdf5_file(path, "dataset file", "create one with `berth data import`");
}

}  // namespace

TokenDatasetShape read_token_dataset_shape(const std::string& path) {
  require_dataset_file(path);
  H5QuietErrors quiet;
  TokenDatasetShape shape;
  read_hdf5(path, Read::kShape, &shape);
  return shape;
}

std::vector<uint64_t> read_token_dataset_offsets(const std::string& path) {
  require_dataset_file(path);
  H5QuietErrors quiet;
  TokenDatasetShape shape;
  TokenDataset ds = read_hdf5(path, Read::kOffsets, &shape);
  const auto& off = ds.doc_offsets;
  BERTH_CHECK(!off.empty() && off.front() == 0 && std::is_sorted(off.begin(), off.end()) &&
                  off.back() == uint64_t(shape.n_tokens),
              "'{}': doc_offsets must start at 0, never decrease and end at the {} tokens; {}",
              path, shape.n_tokens, kImportHint);
  return std::move(ds.doc_offsets);
}

void write_token_dataset(const std::string& path, const TokenDataset& ds) {
  validate_dataset(ds, path);
  H5QuietErrors quiet;
  write_via_temp(path, [&](const std::string& tmp) { write_hdf5(tmp, path, ds); });
}

void require_dataset_destination(const std::string& path, const char* what) {
  if (const std::string why = h5::foreign_file_reason(path, kTokenFormatName, false);
      !why.empty()) {
    BERTH_FAIL(
        "refusing to replace {} '{}': {}, and berth replaces only a token dataset there; "
        "choose another path",
        what, path, why);
  }
}

std::string dataset_fingerprint(const TokenDataset& ds) {
  Fnv1a h;
  h.u64(uint64_t(ds.vocab_size));
  h.u64(ds.doc_offsets.size());
  for (const uint64_t off : ds.doc_offsets) h.u64(off);
  h.u64(ds.loss_mask.empty() ? 0 : 1);
  const uint64_t n = ds.tokens.size();
  const uint64_t samples = std::min<uint64_t>(n, uint64_t(1) << 20);
  for (uint64_t k = 0; k < samples; ++k) {
    const uint64_t i = samples == 1 ? 0 : k * (n - 1) / (samples - 1);
    h.u64(ds.tokens[i]);
  }
  return fmt::format("{} tokens in {} documents, {:016x}", n, ds.n_docs(), h.h);
}

TokenDataset read_token_dataset(const std::string& path) {
  require_dataset_file(path);
  H5QuietErrors quiet;
  TokenDataset ds = read_hdf5(path, Read::kAll, nullptr);
  validate_dataset(ds, path);
  return ds;
}

// ---- statistics ---------------------------------------------------------------------------------

DatasetInfo dataset_info(const TokenDataset& ds) {
  DatasetInfo info;
  info.n_docs = ds.n_docs();
  info.n_tokens = ds.n_tokens();
  info.vocab_size = ds.vocab_size;
  info.eot_token = ds.eot_token;
  info.tokenizer = ds.tokenizer;
  info.has_loss_mask = !ds.loss_mask.empty();
  if (info.n_docs > 0) {
    std::vector<int64_t> lens(static_cast<size_t>(info.n_docs));
    for (size_t i = 0; i < lens.size(); ++i) {
      lens[i] = static_cast<int64_t>(ds.doc_offsets[i + 1] - ds.doc_offsets[i]);
    }
    std::sort(lens.begin(), lens.end());
    const size_t n = lens.size();
    // Nearest-rank percentile: the smallest length with at least p% of documents at or below it.
    auto pct = [&](double p) {
      const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(n)));
      return lens[std::clamp<size_t>(rank, 1, n) - 1];
    };
    info.min_len = lens.front();
    info.max_len = lens.back();
    info.mean_len = static_cast<double>(info.n_tokens) / static_cast<double>(n);
    info.p50_len = pct(50);
    info.p90_len = pct(90);
    info.p99_len = pct(99);
  }
  if (!ds.tokens.empty()) {
    const uint32_t max_token = *std::max_element(ds.tokens.begin(), ds.tokens.end());
    std::vector<bool> seen(size_t{max_token} + 1, false);
    for (uint32_t t : ds.tokens) {
      if (!seen[t]) {
        seen[t] = true;
        ++info.distinct_tokens;
      }
    }
  }
  return info;
}

std::string format_dataset_info(const std::string& path, const DatasetInfo& info) {
  const double used_pct =
      info.vocab_size > 0
          ? 100.0 * static_cast<double>(info.distinct_tokens) / static_cast<double>(info.vocab_size)
          : 0.0;
  std::string out;
  out += fmt::format("dataset      {}\n", path);
  out += fmt::format("documents    {}\n", info.n_docs);
  out += fmt::format("tokens       {}\n", info.n_tokens);
  out += fmt::format("doc length   min {}  mean {:.1f}  p50 {}  p90 {}  p99 {}  max {}\n",
                     info.min_len, info.mean_len, info.p50_len, info.p90_len, info.p99_len,
                     info.max_len);
  out += fmt::format("vocab        {} (tokenizer '{}', eot {})\n", info.vocab_size, info.tokenizer,
                     info.eot_token < 0 ? std::string("none") : std::to_string(info.eot_token));
  out += fmt::format("distinct     {} tokens used ({:.1f}% of vocab)\n", info.distinct_tokens,
                     used_pct);
  out += fmt::format("loss mask    {}\n", info.has_loss_mask ? "yes" : "no");
  return out;
}

}  // namespace berth
