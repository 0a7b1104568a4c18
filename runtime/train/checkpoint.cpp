// Checkpoint directories in HDF5 + JSON; see checkpoint.h for the layout and the guarantees.
#include "runtime/train/checkpoint.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <thread>

#include "runtime/config/config.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/core/process.h"
#include "runtime/io/hdf5_util.h"

namespace berth {
namespace {

namespace fs = std::filesystem;
using h5::H5Id;

constexpr const char* kStepPrefix = "step-";
constexpr const char* kTmpMarker = ".tmp-";

// ---- writing ------------------------------------------------------------------------------------

// An int64 array attribute (an empty one has a null dataspace).
void write_i64_array_attr(hid_t obj, const char* name, const std::vector<int64_t>& v,
                          const h5::FileWriter& w) {
  const hsize_t dims[1] = {hsize_t(v.size())};
  H5Id space(v.empty() ? H5Screate(H5S_NULL) : H5Screate_simple(1, dims, nullptr), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!space.valid() || !attr.valid() ||
      (!v.empty() && H5Awrite(attr.get(), H5T_NATIVE_INT64, v.data()) < 0)) {
    w.fail(fmt::format("attribute '{}'", name));
  }
}

// One float32 dataset `name` (inside `loc`) with the tensor's shape, Fletcher-32 checksummed
// chunks of at most ~16 Mi elements, and the full_shape/offset attributes of a whole tensor.
void write_tensor(hid_t loc, const std::string& name, const float* data,
                  const std::vector<int64_t>& shape, const h5::FileWriter& w) {
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  std::vector<hsize_t> chunk = dims;
  hsize_t rest = 1;
  for (size_t i = 1; i < chunk.size(); i++) rest *= chunk[i];
  chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(dims[0], (hsize_t(1) << 24) / std::max<hsize_t>(rest, 1)));
  H5Id space(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose);
  H5Id dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  if (!space.valid() || !dcpl.valid() || H5Pset_chunk(dcpl.get(), int(chunk.size()), chunk.data()) < 0 ||
      H5Pset_fletcher32(dcpl.get()) < 0) {
    w.fail(fmt::format("dataset '{}' properties", name));
  }
  H5Id dset(H5Dcreate2(loc, name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, dcpl.get(),
                       H5P_DEFAULT),
            H5Dclose);
  if (!dset.valid() || H5Dwrite(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    w.fail(fmt::format("dataset '{}'", name));
  }
  write_i64_array_attr(dset.get(), "full_shape", shape, w);
  write_i64_array_attr(dset.get(), "offset", std::vector<int64_t>(shape.size(), 0), w);
  if (!dset.close()) w.fail(fmt::format("closing dataset '{}'", name));
}

// A new checkpoint file (never one that exists) with the format's attributes.
H5Id create_checkpoint_file(const h5::FileWriter& w, const std::string& path) {
  H5Id fapl(h5::file_access_plist(), H5Pclose);  // (the format with checksummed metadata)
  H5Id file(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!file.valid()) w.fail("creating the file");
  w.string_attr(file.get(), "format", kCheckpointFormat);
  w.i64_attr(file.get(), "format_version", kCheckpointFormatVersion);
  return file;
}

void write_model_file(const std::string& path, const CheckpointData& d, const ParamLayout& layout) {
  const h5::FileWriter w("checkpoint file", path);
  H5Id file = create_checkpoint_file(w, path);
  const hid_t f = file.get();
  w.i64_attr(f, "n_layer", d.model.L);
  w.i64_attr(f, "n_head", d.model.NH);
  w.i64_attr(f, "d_model", d.model.C);
  w.i64_attr(f, "vocab_size", d.model.V);
  w.i64_attr(f, "padded_vocab_size", d.model.Vp);
  w.i64_attr(f, "max_seq_len", d.model.maxT);
  // The step its weights are of (meta.json's), as optimizer.h5 has adam_step: a model.h5 copied
  // in from another step of the run is named at load.
  w.i64_attr(f, "step", d.meta.step);
  for (const ParamSpec& s : layout.specs) {
    write_tensor(f, s.name, d.params.data() + s.offset, s.shape, w);
  }
  if (!file.close()) w.fail("closing the file");
}

void write_optimizer_file(const std::string& path, const CheckpointData& d,
                          const ParamLayout& layout) {
  const h5::FileWriter w("checkpoint file", path);
  H5Id file = create_checkpoint_file(w, path);
  w.i64_attr(file.get(), "adam_step", d.adam_step);
  for (const char* moment : {"m", "v"}) {
    H5Id group(H5Gcreate2(file.get(), moment, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    if (!group.valid()) w.fail(fmt::format("group '{}'", moment));
    const std::vector<float>& buf = moment[0] == 'm' ? d.adam_m : d.adam_v;
    for (const ParamSpec& s : layout.specs) {
      write_tensor(group.get(), s.name, buf.data() + s.offset, s.shape, w);
    }
  }
  if (!file.close()) w.fail("closing the file");
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---- reading ------------------------------------------------------------------------------------

[[noreturn]] void fail_read(const std::string& path, const std::string& what) {
  BERTH_FAIL_AS(DamagedCheckpoint,
                "checkpoint file '{}' is unreadable at {}: {} (corrupt or truncated? use an older "
                "checkpoint)",
                path, what, h5::h5_error_detail());
}

// Whether `obj` has the attribute (the link) `name`. A lookup that fails is a damaged object
// header (a flipped bit fails its checksum), not an absent name: it was read as "not a berth
// checkpoint file", which sent users after a mixed-up file instead of an older checkpoint.
bool has_attr(hid_t obj, const char* name, const std::string& path) {
  const htri_t found = H5Aexists(obj, name);
  if (found < 0) fail_read(path, fmt::format("looking up attribute '{}'", name));
  return found > 0;
}
bool has_link(hid_t loc, const std::string& name, const std::string& path) {
  const htri_t found = H5Lexists(loc, name.c_str(), H5P_DEFAULT);
  if (found < 0) fail_read(path, fmt::format("looking up '{}'", name));
  return found > 0;
}

// How many of p[0..n) are NaN/Inf (or, `non_negative`, below 0), and the first one's index.
struct BadValues {
  int64_t count = 0, first = -1;
};
BadValues bad_values(const float* p, int64_t n, bool non_negative) {
  BadValues out;
  for (int64_t i = 0; i < n; i++) {
    if (!std::isfinite(p[i]) || (non_negative && p[i] < 0.f)) {
      if (out.count++ == 0) out.first = i;
    }
  }
  return out;
}

[[noreturn]] void fail_tensor_type(const std::string& path, const std::string& name, hid_t type) {
  const bool f32 = H5Tget_class(type) == H5T_FLOAT && H5Tget_size(type) == sizeof(float);
  BERTH_FAIL_AS(
      DamagedCheckpoint,
      "checkpoint file '{}': tensor '{}' is stored as {}, berth writes IEEE 754 4-byte "
      "little-endian floats: a file from another writer, or a corrupt one",
      path, name,
      f32 ? std::string("a 4-byte float of another layout (byte order, exponent bias or field "
                        "positions: a damaged type header?)")
          : fmt::format("a {}-byte {}", H5Tget_size(type),
                        H5Tget_class(type) == H5T_FLOAT ? "float" : "non-float"));
}

int64_t read_i64_attr(hid_t obj, const char* name, const std::string& path) {
  if (!has_attr(obj, name, path)) {
    BERTH_FAIL("checkpoint file '{}' has no attribute '{}': not a berth checkpoint file", path,
               name);
  }
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) fail_read(path, fmt::format("attribute '{}'", name));
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid() || H5Tget_class(type.get()) != H5T_INTEGER) {
    BERTH_FAIL_AS(DamagedCheckpoint,
                  "checkpoint file '{}': attribute '{}' is not an integer: not a berth checkpoint "
                  "file, or a corrupt one",
                  path, name);
  }
  int64_t v = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &v) < 0) {
    fail_read(path, fmt::format("attribute '{}'", name));
  }
  return v;
}

// The root attribute `format` of a checkpoint file: a file without it, or with another value, is
// some other HDF5 file put in the checkpoint's place.
void check_format_attr(hid_t file, const std::string& path) {
  if (!has_attr(file, "format", path)) {
    BERTH_FAIL("checkpoint file '{}' has no attribute 'format': not a berth checkpoint file", path);
  }
  H5Id attr(H5Aopen(file, "format", H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) fail_read(path, "attribute 'format'");
  H5Id type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.valid()) fail_read(path, "attribute 'format'");
  if (H5Tget_class(type.get()) != H5T_STRING) {
    BERTH_FAIL(
        "checkpoint file '{}': attribute 'format' is {}, not a string: not a berth "
        "checkpoint file",
        path, h5::describe_type(type.get()));
  }
  std::string value;
  if (!h5::read_string_attr_value(attr.get(), type.get(), &value)) {
    fail_read(path, "attribute 'format'");
  }
  if (value != kCheckpointFormat) {
    BERTH_FAIL("checkpoint file '{}' has format '{}', expected '{}': not a berth checkpoint file",
               path, value, kCheckpointFormat);
  }
}

// A one-dimensional integer attribute of a dataset (nullopt when it is missing, not of integers
// or of more dimensions).
std::optional<std::vector<int64_t>> read_i64_array_attr(hid_t obj, const char* name,
                                                        const std::string& path) {
  if (!has_attr(obj, name, path)) return std::nullopt;
  H5Id attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  H5Id type(attr.valid() ? H5Aget_type(attr.get()) : H5I_INVALID_HID, H5Tclose);
  H5Id space(attr.valid() ? H5Aget_space(attr.get()) : H5I_INVALID_HID, H5Sclose);
  if (!type.valid() || !space.valid() || H5Tget_class(type.get()) != H5T_INTEGER) {
    return std::nullopt;
  }
  const hssize_t n = H5Sget_simple_extent_npoints(space.get());
  if (n < 0 || H5Sget_simple_extent_ndims(space.get()) > 1) return std::nullopt;
  std::vector<int64_t> v(static_cast<size_t>(n));
  if (n > 0 && H5Aread(attr.get(), H5T_NATIVE_INT64, v.data()) < 0) return std::nullopt;
  return v;
}

// The names in group `loc` that `expected` does not list (datasets or groups a berth writer did
// not write for this model).
std::vector<std::string> unexpected_links(hid_t loc, const std::vector<std::string>& expected,
                                          const std::string& path) {
  std::vector<std::string> names;
  auto collect = [](hid_t, const char* name, const H5L_info_t*, void* out) -> herr_t {
    try {  // nothing may throw through HDF5's C frames
      static_cast<std::vector<std::string>*>(out)->push_back(name);
      return 0;
    } catch (...) {
      return -1;
    }
  };

  if (H5Literate(loc, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect, &names) < 0) {
    fail_read(path, "listing its tensors");
  }
  std::vector<std::string> extra;
  for (const std::string& n : names) {
    if (std::find(expected.begin(), expected.end(), n) == expected.end()) extra.push_back(n);
  }
  return extra;
}

void check_no_extra_tensors(hid_t loc, const std::vector<std::string>& expected,
                            const std::string& path, const std::string& prefix) {
  std::vector<std::string> extra = unexpected_links(loc, expected, path);
  if (extra.empty()) return;
  for (std::string& e : extra) e = prefix + e;
  const size_t shown = std::min<size_t>(extra.size(), 5);
  BERTH_FAIL_AS(DamagedCheckpoint,
                "checkpoint file '{}' holds {} tensor(s) the model of its attributes does not have "
                "({}{}): its attributes or tensors were edited, or it was written by another tool; "
                "the checkpoint is corrupt",
                path, extra.size(), fmt::join(extra.begin(), extra.begin() + shown, ", "),
                extra.size() > shown ? ", ..." : "");
}

void read_tensor(hid_t loc, const std::string& name, float* out, const std::vector<int64_t>& shape,
                 const std::string& path) {
  if (!has_link(loc, name, path)) {
    BERTH_FAIL_AS(DamagedCheckpoint,
                  "checkpoint file '{}' has no tensor '{}': the file is corrupt (its attributes "
                  "describe a model whose tensors it does not hold)",
                  path, name);
  }
  H5Id dset(H5Dopen2(loc, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!dset.valid()) fail_read(path, fmt::format("opening '{}'", name));
  H5Id space(H5Dget_space(dset.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(size_t(std::max(rank, 0)));
  if (rank < 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
    fail_read(path, fmt::format("shape of '{}'", name));
  }
  const std::vector<int64_t> got(dims.begin(), dims.end());
  if (got != shape) {
    BERTH_FAIL("checkpoint file '{}': tensor '{}' has shape [{}], the model expects [{}]", path,
               name, fmt::join(got, ", "), fmt::join(shape, ", "));
  }
  // berth saves every tensor whole: a slice of a bigger tensor (a shard another writer made, or
  // an edited attribute) would load as if it were all of it.
  const auto full = read_i64_array_attr(dset.get(), "full_shape", path);
  const auto offset = read_i64_array_attr(dset.get(), "offset", path);
  const bool at_zero =
      offset && offset->size() == shape.size() &&
      std::all_of(offset->begin(), offset->end(), [](int64_t o) { return o == 0; });
  if (!full || !at_zero || *full != shape) {
    BERTH_FAIL_AS(
        DamagedCheckpoint,
        "checkpoint file '{}': tensor '{}' is not a whole tensor (full_shape [{}], offset "
        "[{}]; berth writes full_shape [{}] and offset zeros): a shard from another "
        "writer, or a corrupt file",
        path, name, full ? fmt::format("{}", fmt::join(*full, ", ")) : "missing or not int64[]",
        offset ? fmt::format("{}", fmt::join(*offset, ", ")) : "missing or not int64[]",
        fmt::join(shape, ", "));
  }
  // HDF5 converts any number type to float on read: an integer or double tensor (another
  // writer's file) would load as weights without a word, and so would a float whose type header
  // was damaged (one byte of its exponent bias scales every value by a power of two; the
  // checksums cover the data, not the header). berth writes exactly IEEE 754 binary32, LE.
  H5Id type(H5Dget_type(dset.get()), H5Tclose);
  if (!type.valid()) fail_read(path, fmt::format("type of '{}'", name));
  if (H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0) fail_tensor_type(path, name, type.get());
  // Every chunk written and checksummed: a chunk the file lacks reads back as zeros without an
  // error (a damaged chunk index of a checkpoint in the 1.8 format, whose metadata has no
  // checksums), and data without its Fletcher-32 filter would be read unchecked.
  H5Id dcpl(H5Dget_create_plist(dset.get()), H5Pclose);
  unsigned flags = 0;
  size_t nelmts = 0;
  const bool checksummed =
      dcpl.valid() && H5Pget_filter_by_id2(dcpl.get(), H5Z_FILTER_FLETCHER32, &flags, &nelmts,
                                           nullptr, 0, nullptr, nullptr) >= 0;
  const h5::ChunkCount chunks = h5::chunk_count(dset.get());
  if (!checksummed || chunks.declared <= 0 || chunks.written != chunks.declared) {
    BERTH_FAIL_AS(
        DamagedCheckpoint,
        "checkpoint file '{}': tensor '{}' is not stored as berth writes it ({}): the file is "
        "corrupt (use an older checkpoint)",
        path, name,
        !checksummed           ? "its data has no Fletcher-32 checksum"
        : chunks.declared <= 0 ? "it is not in checksummed chunks"
        : chunks.written < 0   ? "its chunk index cannot be read"
                               : fmt::format("the file holds {:.0f} of its {:.0f} chunks",
                                             chunks.written, chunks.declared));
  }
  if (H5Dread(dset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0) {
    fail_read(path, fmt::format("reading '{}'", name));
  }
}

H5Id open_file(const std::string& path) {
  if (!fs::exists(path)) {
    BERTH_FAIL_AS(
        DamagedCheckpoint,
        "checkpoint file '{}' is missing (a damaged or partly copied checkpoint): use an older "
        "checkpoint",
        path);
  }
  if (!fs::is_regular_file(path)) BERTH_FAIL("checkpoint file '{}' is not a file", path);
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.valid()) fail_read(path, "opening");
  return file;
}

int64_t step_of_name(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0 || name.find(kTmpMarker) != std::string::npos) return -1;
  const std::string digits = name.substr(std::strlen(kStepPrefix));
  int64_t step = -1;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (digits.empty() || err != std::errc() || end != digits.data() + digits.size()) return -1;
  return step;  // not a step-N name: no digits, other characters, or beyond int64
}

// The step-NNNNNNNN directories in `dir` (not temporaries) with meta.json (`complete`) or
// without, sorted by step.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const std::string& dir, bool complete) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const int64_t step = step_of_name(e.path().filename().string());
    // (an entry that cannot be followed, e.g. a symbolic link loop, holds no meta.json)
    std::error_code unreadable;
    if (step >= 0 && fs::exists(e.path() / "meta.json", unreadable) == complete)
      out.emplace_back(step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}
std::vector<std::pair<int64_t, fs::path>> complete_checkpoints(const std::string& dir) {
  return step_dirs(dir, true);
}

// Fencing of checkpoint commits: the checkpoint directory's FENCE file holds the highest lease
// token that committed there. Under an exclusive lock, a commit with a lower token is refused (a
// holder that lost its lease, e.g. paused past its TTL, cannot overwrite newer state); an equal or
// higher one records its token and commits while the lock is held.
class FenceLock {
 public:
  FenceLock(const std::optional<int64_t>& token, const fs::path& parent) {
    if (!token) return;
    const fs::path dir = parent.empty() ? fs::path(".") : parent;
    const std::string lock = (dir / ".fence.lock").string();
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    BERTH_CHECK(fd_ >= 0, "cannot open {}: {}", lock, std::strerror(errno));
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      BERTH_FAIL("cannot lock {}: {}", lock, std::strerror(errno));
    }
    try {
      const std::string fence = (dir / "FENCE").string();
      std::error_code ec;
      if (fs::exists(fence, ec)) {
        const std::string text = read_text_file(fence);
        int64_t recorded = 0;
        try {
          recorded = std::stoll(text);
        } catch (const std::exception&) {
          BERTH_FAIL("{} does not hold a fencing token ('{}'); remove it if no job is running", fence,
                     text);
        }
        BERTH_CHECK(*token >= recorded,
                    "checkpoint commit refused: this process holds fencing token {}, but token {} "
                    "already committed in {}: another launch took over the reservation's lease, "
                    "so this one must not write. If no other launch uses this directory, the "
                    "ledger was replaced or restored from a backup (its tokens restarted lower): "
                    "remove {} to accept its tokens",
                    *token, recorded, dir.string(), fence);
      }
      write_file_atomic(fence, fmt::format("{}\n", *token));
    } catch (...) {
      ::close(fd_);
      throw;
    }
  }
  ~FenceLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FenceLock(const FenceLock&) = delete;
  FenceLock& operator=(const FenceLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

void claim_checkpoint_fence(const std::string& checkpoint_dir, int64_t token) {
  const FenceLock fence(token, fs::path(checkpoint_dir));
}

int64_t checkpoint_step(const std::string& path) {
  return step_of_name(fs::path(path).filename().string());
}

std::string checkpoint_dir_name(int64_t step) { return fmt::format("{}{:08d}", kStepPrefix, step); }

double save_checkpoint(const std::string& dir, const CheckpointData& d, double pause_s) {
  const auto t0 = std::chrono::steady_clock::now();
  h5::H5QuietErrors quiet;
  const ParamLayout layout = gpt_param_layout(d.model);
  BERTH_CHECK(int64_t(d.params.size()) == layout.total,
              "checkpoint of {} parameters does not match the model's {}", d.params.size(),
              layout.total);
  BERTH_CHECK(!d.has_optimizer() || (int64_t(d.adam_m.size()) == layout.total &&
                                     int64_t(d.adam_v.size()) == layout.total),
              "optimizer moments do not match the {} parameters", layout.total);
  const fs::path final_dir(dir);
  BERTH_CHECK(!fs::exists(final_dir), "checkpoint '{}' already exists; choose another path", dir);
  std::error_code ec;
  if (final_dir.has_parent_path()) fs::create_directories(final_dir.parent_path(), ec);
  const fs::path tmp = final_dir.string() + kTmpMarker + std::to_string(::getpid());
  fs::remove_all(tmp, ec);
  BERTH_CHECK(fs::create_directory(tmp, ec) && !ec, "cannot create checkpoint directory '{}': {}",
              tmp.string(), ec.message());
  // `berth model import` writes one (gigabytes) outside training: a signal there removes these
  // files, then the directory (train stops at a step instead, and saves whole).
  ScopedTemp tmp_removed(tmp.string());
  ScopedTemp model_removed((tmp / "model.h5").string());
  ScopedTemp optimizer_removed((tmp / "optimizer.h5").string());
  ScopedTemp meta_removed((tmp / "meta.json").string());
  try {
    write_model_file((tmp / "model.h5").string(), d, layout);
    if (d.has_optimizer()) write_optimizer_file((tmp / "optimizer.h5").string(), d, layout);
    if (pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(pause_s));
    nlohmann::json meta = {
        {"format", kCheckpointFormat},
        {"format_version", kCheckpointFormatVersion},
        {"step", d.meta.step},
        {"lr_schedule_step", d.meta.step},
        {"rows_consumed", d.meta.rows_consumed},
        {"rows_per_step", d.meta.rows_per_step},
        {"skipped_steps", d.meta.skipped_steps},
        {"seed", d.meta.seed},
        // berth draws no random numbers while training: init and the shuffle
        // order are functions of (seed, tensor name) and (seed, epoch), so
        // the seed and the data position are the whole RNG state.
        {"rng", {{"seed", d.meta.seed}, {"rows_consumed", d.meta.rows_consumed}}},
        {"config", d.meta.config_toml},
        {"layout", d.meta.layout},
        {"source", d.meta.source},
        {"optimizer", d.has_optimizer()},
        {"saved_at", utc_now()}};
    if (!d.meta.data_fingerprint.empty()) meta["data_fingerprint"] = d.meta.data_fingerprint;
    meta["fencing_token"] = d.meta.fencing_token ? nlohmann::json(*d.meta.fencing_token) : nullptr;
    write_file_atomic((tmp / "meta.json").string(), meta.dump(2) + "\n");
    // On disk before the rename that publishes them: after a power loss the rename alone could
    // survive, and `--resume auto` would pick a step-N with an empty model.h5.
    sync_to_disk((tmp / "model.h5").string());
    if (d.has_optimizer()) sync_to_disk((tmp / "optimizer.h5").string());
    sync_to_disk((tmp / "meta.json").string());
    sync_to_disk(tmp.string());
    const FenceLock fence(d.meta.fencing_token, final_dir.parent_path());
    for (ScopedTemp* t : {&meta_removed, &optimizer_removed, &model_removed, &tmp_removed})
      t->release();
    fs::rename(tmp, final_dir, ec);
    BERTH_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp.string(), dir, ec.message());
    sync_to_disk(final_dir.has_parent_path() ? final_dir.parent_path().string() : ".");
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

namespace {

// Refuses a tensor of a checkpoint to resume from with NaN/Inf values (or, `non_negative`,
// values below 0: AdamW's second moment is a mean of squares).
void require_trainable(const float* p, int64_t n, bool non_negative, const std::string& path,
                       const std::string& name) {
  const BadValues bad = bad_values(p, n, non_negative);
  BERTH_CHECK_AS(DamagedCheckpoint, bad.count == 0,
                 "'{}': tensor '{}' holds {} {} value(s) (first at element {}: {}), which training "
                 "never leaves: the checkpoint is corrupt (or was edited); resume from an earlier "
                 "one",
                 path, name, bad.count, non_negative ? "NaN/Inf or negative" : "NaN/Inf", bad.first,
                 bad.first >= 0 ? p[bad.first] : 0.f);
}

}  // namespace

CheckpointData load_checkpoint(const std::string& dir, bool with_optimizer) {
  h5::H5QuietErrors quiet;
  std::error_code ec;
  if (fs::is_regular_file(dir, ec)) {
    // What the file is decides the advice: a file of a checkpoint (model.h5), a Hugging Face
    // safetensors file, or an llm.c model file.
    const fs::path parent = fs::path(dir).parent_path();
    if (fs::exists(parent / "meta.json", ec)) {
      BERTH_FAIL("checkpoint '{}' is a file of the checkpoint '{}': give the directory", dir,
                 parent.string());
    }
    const bool safetensors = fs::path(dir).extension() == ".safetensors";
    BERTH_FAIL(
        "checkpoint '{}' is a file, and a berth checkpoint is a directory; import it "
        "first: berth model import --format {} {} --out DIR, then give DIR",
        dir, safetensors ? "hf-gpt2" : "llmc", safetensors ? parent.string() : dir);
  }
  BERTH_CHECK(fs::is_directory(dir, ec), "checkpoint '{}' does not exist", dir);
  const fs::path meta_path = fs::path(dir) / "meta.json";
  BERTH_CHECK(fs::exists(meta_path, ec) || !fs::exists(fs::path(dir) / "config.json", ec),
              "'{}' holds config.json and no meta.json: a Hugging Face model directory, not a "
              "berth checkpoint; import it first: berth model import --format hf-gpt2 {} --out "
              "DIR, then give DIR",
              dir, dir);
  if (!fs::exists(meta_path)) {
    // A run directory or a checkpoint.dir given instead of one of its checkpoints.
    for (const fs::path& inside : {fs::path(dir), fs::path(dir) / "checkpoints"}) {
      if (const std::optional<std::string> newest = latest_checkpoint(inside.string())) {
        BERTH_FAIL(
            "'{}' is not a checkpoint but holds checkpoints: give one of them, e.g. the "
            "newest, '{}' (`--resume auto` picks it in checkpoint.dir)",
            dir, *newest);
      }
    }
  }
  BERTH_CHECK(fs::exists(meta_path),
              "'{}' has no meta.json: an incomplete checkpoint (interrupted save) or not a berth "
              "checkpoint; use another one (`--resume auto` picks the newest complete one)",
              dir);
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(read_text_file(meta_path.string()));
  } catch (const nlohmann::json::exception& e) {
    BERTH_FAIL_AS(DamagedCheckpoint, "'{}' is not valid JSON ({}): the checkpoint is corrupt",
                  meta_path.string(), e.what());
  }
  BERTH_CHECK(meta.is_object() && meta.contains("format") && meta["format"].is_string() &&
                  meta["format"].get<std::string>() == kCheckpointFormat,
              "'{}' is not a berth checkpoint (no \"format\": \"{}\")", meta_path.string(),
              kCheckpointFormat);
  BERTH_CHECK_AS(DamagedCheckpoint,
                 meta.contains("format_version") && meta["format_version"].is_number_integer(),
                 "'{}' has no whole-number format_version ({}): the checkpoint is corrupt",
                 meta_path.string(),
                 meta.contains("format_version") ? meta["format_version"].dump() : "missing");
  const int64_t version = meta["format_version"].get<int64_t>();
  BERTH_CHECK(version == kCheckpointFormatVersion,
              "checkpoint '{}' has format_version {}, this build reads {}; use the berth version "
              "that wrote it",
              dir, version, kCheckpointFormatVersion);
  // Counts are whole numbers of 64 bits: nlohmann's get<int64_t> truncates 10.5 and wraps 1e30.
  for (const auto& [key, optional] : {std::pair{"step", false},
                                      {"rows_consumed", false},
                                      {"seed", false},
                                      {"rows_per_step", true},
                                      {"skipped_steps", true},
                                      {"fencing_token", true}}) {
    if (optional && (!meta.contains(key) || meta[key].is_null())) continue;
    BERTH_CHECK_AS(DamagedCheckpoint, meta.contains(key) && meta[key].is_number_integer(),
                   "'{}': '{}' must be a whole number, got {}: the checkpoint is corrupt",
                   meta_path.string(), key, meta.contains(key) ? meta[key].dump() : "nothing");
  }
  CheckpointData d;
  bool saved_optimizer = false;
  try {
    d.meta.step = meta.at("step").get<int64_t>();
    d.meta.rows_consumed = meta.at("rows_consumed").get<int64_t>();
    d.meta.seed = meta.at("seed").get<int64_t>();
    d.meta.rows_per_step = meta.value("rows_per_step", int64_t(0));
    d.meta.skipped_steps = meta.value("skipped_steps", int64_t(0));
    d.meta.config_toml = meta.at("config").get<std::string>();
    d.meta.layout = meta.value("layout", "");
    d.meta.source = meta.value("source", "");
    d.meta.data_fingerprint = meta.value("data_fingerprint", "");
    if (meta.contains("fencing_token") && !meta["fencing_token"].is_null()) {
      d.meta.fencing_token = meta["fencing_token"].get<int64_t>();
    }
    saved_optimizer = meta.value("optimizer", false);
  } catch (const nlohmann::json::exception& e) {
    BERTH_FAIL_AS(DamagedCheckpoint,
                  "'{}' lacks a field or has a wrong type ({}): the checkpoint is corrupt",
                  meta_path.string(), e.what());
  }
  // (at most 2^62: the loaders add rows to it, which must not overflow)
  constexpr int64_t kMost = int64_t(1) << 62;
  BERTH_CHECK_AS(DamagedCheckpoint,
                 d.meta.skipped_steps >= 0 && d.meta.skipped_steps <= d.meta.step,
                 "'{}': skipped_steps {} must be in [0, step {}]: the checkpoint is corrupt",
                 meta_path.string(), d.meta.skipped_steps, d.meta.step);
  BERTH_CHECK_AS(
      DamagedCheckpoint,
      d.meta.step >= 0 && d.meta.rows_consumed >= 0 && d.meta.rows_per_step >= 0 &&
          d.meta.step < kMost && d.meta.rows_consumed < kMost && d.meta.rows_per_step < kMost,
      "'{}': step {}, rows_consumed {} and rows_per_step {} must be >= 0 and < 2^62: the "
      "checkpoint is corrupt",
      meta_path.string(), d.meta.step, d.meta.rows_consumed, d.meta.rows_per_step);
  // A directory named by the writer (step-N) must hold step N: a meta.json edited or copied
  // from another checkpoint would resume at the wrong step of the schedule and the data.
  fs::path named_dir = fs::path(dir);
  if (named_dir.filename().empty()) named_dir = named_dir.parent_path();  // "…/step-N/"
  if (const int64_t named = step_of_name(named_dir.filename().string());
      named >= 0 && named != d.meta.step) {
    BERTH_FAIL_AS(DamagedCheckpoint,
                  "'{}' says step {}, but its directory is named for step {}: the checkpoint is "
                  "corrupt (or meta.json was copied from another one)",
                  meta_path.string(), d.meta.step, named);
  }

  const std::string model_path = (fs::path(dir) / "model.h5").string();
  H5Id file = open_file(model_path);
  const hid_t f = file.get();
  check_format_attr(f, model_path);
  const int64_t file_version = read_i64_attr(f, "format_version", model_path);
  BERTH_CHECK(file_version == kCheckpointFormatVersion, "'{}' has format_version {}, expected {}",
              model_path, file_version, kCheckpointFormatVersion);
  const int64_t L = read_i64_attr(f, "n_layer", model_path),
                NH = read_i64_attr(f, "n_head", model_path),
                C = read_i64_attr(f, "d_model", model_path),
                V = read_i64_attr(f, "vocab_size", model_path),
                maxT = read_i64_attr(f, "max_seq_len", model_path);
  try {
    d.model = make_gpt_config(L, NH, C, V, maxT);
  } catch (const Error& e) {  // it names no file
    BERTH_FAIL_AS(DamagedCheckpoint,
                  "'{}': its attributes (n_layer {}, n_head {}, d_model {}, vocab_size {}, "
                  "max_seq_len {}) are no model: {}; the checkpoint is corrupt",
                  model_path, L, NH, C, V, maxT, e.what());
  }
  if (has_attr(f, "step", model_path)) {  // (absent in checkpoints saved before it was written)
    const int64_t step = read_i64_attr(f, "step", model_path);
    BERTH_CHECK_AS(DamagedCheckpoint, step == d.meta.step,
                   "'{}' holds the weights of step {}, but meta.json says step {}: model.h5 is not "
                   "this checkpoint's (copied from another one?); the checkpoint is corrupt",
                   model_path, step, d.meta.step);
  }
  const int64_t vp = read_i64_attr(f, "padded_vocab_size", model_path);
  BERTH_CHECK(vp == d.model.Vp, "'{}': padded_vocab_size {} but vocab_size {} pads to {}",
              model_path, vp, d.model.V, d.model.Vp);
  // model.h5 holds the model of the run whose config meta.json recorded; one copied in from
  // another checkpoint is named here, before optimizer.h5 is blamed for not matching it.
  if (!d.meta.config_toml.empty()) {
    std::optional<RunConfig> saved;
    try {
      saved = parse_config(d.meta.config_toml, meta_path.string());
    } catch (const Error&) {  // an older or edited config: nothing to compare with
    }
    if (saved) {
      const GPTConfig recorded =
          make_gpt_config(saved->model.n_layer, saved->model.n_head, saved->model.d_model,
                          saved->model.vocab_size, saved->model.max_seq_len);
      const std::string diff = describe_shape_mismatch(d.model, recorded);
      BERTH_CHECK_AS(
          DamagedCheckpoint, diff.empty(),
          "'{}' holds another model than the config in meta.json ({}; \"checkpoint\" is "
          "model.h5, \"config\" meta.json's): model.h5 was copied from another checkpoint; "
          "the checkpoint is corrupt",
          model_path, diff);
    }
  }
  const ParamLayout layout = gpt_param_layout(d.model);
  d.params.assign(size_t(layout.total), 0.f);
  std::vector<std::string> names;
  for (const ParamSpec& s : layout.specs) names.push_back(s.name);
  check_no_extra_tensors(f, names, model_path, "");
  for (const ParamSpec& s : layout.specs) read_tensor(f, s.name, d.params.data() + s.offset, s.shape, model_path);

  const std::string opt_path = (fs::path(dir) / "optimizer.h5").string();
  if (with_optimizer && saved_optimizer) {
    H5Id of = open_file(opt_path);
    check_format_attr(of.get(), opt_path);
    d.adam_step = read_i64_attr(of.get(), "adam_step", opt_path);
    // AdamW steps once per optimizer step that updated: another count is an optimizer.h5 from
    // elsewhere, and its bias correction would be wrong.
    BERTH_CHECK_AS(
        DamagedCheckpoint, d.adam_step == d.meta.step - d.meta.skipped_steps,
        "'{}' has adam_step {}, but meta.json says step {}{}: the optimizer state is not "
        "this checkpoint's (copied from another one?); the checkpoint is corrupt",
        opt_path, d.adam_step, d.meta.step,
        d.meta.skipped_steps > 0
            ? fmt::format(" with {} skipped (no targets)", d.meta.skipped_steps)
            : std::string());
    check_no_extra_tensors(of.get(), {"m", "v"}, opt_path, "");
    for (const char* moment : {"m", "v"}) {
      if (!has_link(of.get(), moment, opt_path)) continue;  // read_tensor names it
      H5Id group(H5Gopen2(of.get(), moment, H5P_DEFAULT), H5Gclose);
      if (!group.valid()) fail_read(opt_path, fmt::format("group '{}'", moment));
      check_no_extra_tensors(group.get(), names, opt_path, std::string(moment) + "/");
    }
    d.adam_m.assign(size_t(layout.total), 0.f);
    d.adam_v.assign(size_t(layout.total), 0.f);
    for (const ParamSpec& s : layout.specs) {
      read_tensor(of.get(), "m/" + s.name, d.adam_m.data() + s.offset, s.shape, opt_path);
      read_tensor(of.get(), "v/" + s.name, d.adam_v.data() + s.offset, s.shape, opt_path);
    }
    // A checkpoint to resume from: AdamW's moments are finite and v >= 0, and so are weights a
    // step can train (a berth run stops at a non-finite loss). A damaged one would end in a NaN
    // loss a step later, blamed on train.lr.
    for (const ParamSpec& s : layout.specs) {
      require_trainable(d.params.data() + s.offset, s.numel, false, model_path, s.name);
      require_trainable(d.adam_m.data() + s.offset, s.numel, false, opt_path, "m/" + s.name);
      require_trainable(d.adam_v.data() + s.offset, s.numel, true, opt_path, "v/" + s.name);
    }
  }
  warn_non_finite(d, layout, dir);
  return d;
}

// One warning per tensor holding NaN/Inf: an imported model with them would train or evaluate to
// NaN, but the user may want to inspect or repair it, so it is not an error.
void warn_non_finite(const CheckpointData& data, const ParamLayout& layout,
                     const std::string& source) {
  for (const ParamSpec& s : layout.specs) {
    const BadValues bad = bad_values(data.params.data() + s.offset, s.numel, false);
    if (bad.count > 0) {
      log_warn(
          "'{}': tensor {} holds {} NaN/Inf value(s) (first at element {}); the model will "
          "produce NaN losses unless this is repaired",
          source, s.name, bad.count, bad.first);
    }
  }
}

std::optional<std::string> latest_checkpoint(const std::string& checkpoint_dir) {
  const auto all = complete_checkpoints(checkpoint_dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

std::vector<std::pair<int64_t, std::string>> incomplete_checkpoints(
    const std::string& checkpoint_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& [step, path] : step_dirs(checkpoint_dir, false))
    out.emplace_back(step, path.string());
  return out;
}

int clean_partial_checkpoints(const std::string& checkpoint_dir) {
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(checkpoint_dir, ec)) return 0;
  for (const fs::directory_entry& e : fs::directory_iterator(checkpoint_dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(kTmpMarker);
    if (name.rfind(kStepPrefix, 0) != 0 || tmp == std::string::npos) continue;
    // A save still in progress by a live process of this host is left alone (a paused holder's
    // late commit is then refused by the fence, not by a vanished directory).
    const long pid = std::strtol(name.c_str() + tmp + std::strlen(kTmpMarker), nullptr, 10);
    if (pid > 0 && pid != long(::getpid()) && process_running(pid)) {
      log_warn("checkpoint: {} belongs to running process {}; leaving it", e.path().string(), pid);
      continue;
    }
    fs::remove_all(e.path(), ec);
    removed++;
  }
  return removed;
}

int prune_checkpoints(const std::string& checkpoint_dir, int64_t keep_last) {
  if (keep_last <= 0) return 0;
  auto all = complete_checkpoints(checkpoint_dir);
  int removed = 0;
  std::error_code ec;
  for (size_t i = 0; i + size_t(keep_last) < all.size(); i++) {
    fs::remove_all(all[i].second, ec);
    removed++;
  }
  return removed;
}

std::string describe_shape_mismatch(const GPTConfig& ck, const GPTConfig& cfg) {
  std::vector<std::string> diffs;
  auto cmp = [&](const char* name, int a, int b) {
    if (a != b) diffs.push_back(fmt::format("{}: checkpoint {}, config {}", name, a, b));
  };
  cmp("n_layer", ck.L, cfg.L);
  cmp("n_head", ck.NH, cfg.NH);
  cmp("d_model", ck.C, cfg.C);
  cmp("vocab_size", ck.V, cfg.V);
  cmp("max_seq_len", ck.maxT, cfg.maxT);
  return fmt::format("{}", fmt::join(diffs, "; "));
}

}  // namespace berth
