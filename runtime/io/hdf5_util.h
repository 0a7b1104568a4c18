// Small RAII and error helpers over the HDF5 C API, shared by every berth file format written in
// HDF5 (token datasets, checkpoints). Header-only; include only from .cpp files that link HDF5.
#pragma once

#include <hdf5.h>

#include <filesystem>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "runtime/core/check.h"

namespace berth::h5 {

// Owns one HDF5 identifier and closes it with the matching H5*close on every path.
class H5Id {
 public:
  using Closer = herr_t (*)(hid_t);
  H5Id() = default;
  H5Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      close();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  ~H5Id() { close(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now; returns false when HDF5 reports a failure (e.g. flushing the file failed).
  bool close() {
    if (id_ < 0) return true;
    const herr_t rc = closer_(id_);
    id_ = H5I_INVALID_HID;
    return rc >= 0;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Turns off HDF5's automatic printing of its error stack for this scope (we report our own
// messages) and restores the previous handler afterwards.
class H5QuietErrors {
 public:
  H5QuietErrors() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~H5QuietErrors() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  H5QuietErrors(const H5QuietErrors&) = delete;
  H5QuietErrors& operator=(const H5QuietErrors&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// The innermost message on HDF5's error stack (the most specific one), then clears the stack.
inline std::string h5_error_detail() {
  std::string detail;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* err, void* out) -> herr_t {
        auto* s = static_cast<std::string*>(out);
        if (s->empty() && err != nullptr && err->desc != nullptr) *s = err->desc;
        return 0;
      },
      &detail);
  H5Eclear2(H5E_DEFAULT);
  if (detail.empty()) return "no detail from HDF5";
  // The open/create failure of a file: "unable to open file: name = '...', errno = 2, error
  // message = 'No such file or directory', flags = 13, o_flags = 242" -> the system's reason (the
  // callers name the file).
  const std::string mark = "error message = '";
  if (const size_t at = detail.find(mark); at != std::string::npos) {
    const size_t from = at + mark.size();
    const size_t to = detail.find('\'', from);
    if (to != std::string::npos && to > from) return detail.substr(from, to - from);
  }
  return detail;
}

inline hid_t file_access_plist() {
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl < 0) return fapl;
#if H5_VERSION_GE(1, 12, 1) || (H5_VERS_MAJOR == 1 && H5_VERS_MINOR == 10 && H5_VERS_RELEASE >= 7)
  // Lock where the file system supports it, carry on where it does not (Lustre/NFS mounts).
  H5Pset_file_locking(fapl, true, true);
#endif
  // Files berth writes use the HDF5 1.10 format, whose metadata carries checksums (superblock,
  // object headers, the chunk index): in the 1.8-compatible default one flipped bit of a chunk
  // index reads a whole checkpoint tensor back as zeros without an error. (Reading needs
  // HDF5 1.10 or later.) A file opened only to read is not affected.
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_LATEST);
  return fapl;
}

// How many chunks a chunked dataset declares (the product over its dimensions of
// ceil(extent / chunk)) and how many the file holds. A chunk the file lacks reads back as the
// fill value (zeros) without an error: a dataset cut short, or a damaged chunk index. Both 0 for
// a dataset that is not chunked; written < 0 when HDF5 cannot count them.
struct ChunkCount {
  double declared = 0, written = 0;
};
inline ChunkCount chunk_count(hid_t dset) {
  ChunkCount out;
  H5Id dcpl(H5Dget_create_plist(dset), H5Pclose);
  H5Id space(H5Dget_space(dset), H5Sclose);
  if (!dcpl.valid() || !space.valid() || H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return out;
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank <= 0 || rank > 32) return out;
  hsize_t dims[32], chunk[32];
  if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0 ||
      H5Pget_chunk(dcpl.get(), rank, chunk) != rank) {
    out.written = -1;
    return out;
  }
  out.declared = 1;
  for (int i = 0; i < rank; ++i)
    out.declared *= chunk[i] > 0 ? static_cast<double>((dims[i] + chunk[i] - 1) / chunk[i]) : 0;
  hsize_t n = 0;
  out.written = H5Dget_num_chunks(dset, space.get(), &n) < 0 ? -1 : static_cast<double>(n);
  return out;
}

inline std::string describe_type(hid_t type) {
  const size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_FLOAT: return fmt::format("float{}", bits);
    case H5T_STRING: return "string";
    case H5T_ENUM: return "enum";
    case H5T_COMPOUND: return "compound";
    default: return fmt::format("HDF5 type class {}", static_cast<int>(H5Tget_class(type)));
  }
}

// Scalar attribute writers on a file, group or dataset. They return false when HDF5 fails, and the
// caller raises its own format's error (with h5_error_detail()).
inline bool write_scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                              const void* value) {
  H5Id space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Id attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  return space.valid() && attr.valid() && H5Awrite(attr.get(), mem_type, value) >= 0;
}
inline bool write_i64_attr(hid_t obj, const char* name, int64_t value) {
  return write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
// A fixed-length, null-terminated UTF-8 string. Fixed, not variable-length as h5py writes a
// Python str: a variable-length value lives in the file's global heap, which has no checksum,
// and HDF5 1.10 loops forever reading a heap object whose length a flipped bit enlarged; a
// fixed one is in the attribute's own object header, checksummed. (h5py reads it as bytes.)
inline bool write_string_attr(hid_t obj, const char* name, const std::string& value) {
  H5Id type(H5Tcopy(H5T_C_S1), H5Tclose);
  if (!type.valid() || H5Tset_size(type.get(), value.size() + 1) < 0 ||
      H5Tset_strpad(type.get(), H5T_STR_NULLTERM) < 0 ||
      H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0) {
    return false;
  }
  return write_scalar_attr(obj, name, type.get(), type.get(), value.c_str());
}

// Writes the parts of one file of a berth HDF5 format (`what`: "token dataset", "packing plan",
// "checkpoint file") at `path`. Every failure throws one message naming the format, the file, the
// step and HDF5's reason: "writing <what> '<path>' failed at <step>: <reason> (disk full or
// directory not writable?)".
class FileWriter {
 public:
  FileWriter(const char* what, std::string path) : what_(what), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& step) const {
    BERTH_FAIL("writing {} '{}' failed at {}: {} (disk full or directory not writable?)", what_,
               path_, step, h5_error_detail());
  }
  // Creates (truncates) `tmp`, the temporary the caller renames to `path` once it is complete.
  H5Id create_temporary(const std::string& tmp) const {
    H5Id fapl(file_access_plist(), H5Pclose);
    H5Id file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
    if (!file.valid()) {
      BERTH_FAIL(
          "cannot create '{}' (temporary for '{}'): {}; check that the directory exists "
          "and is writable",
          tmp, path_, h5_error_detail());
    }
    return file;
  }
  // Flushes and closes a file that create_temporary made.
  void finish(H5Id& file) const {
    if (H5Fflush(file.get(), H5F_SCOPE_LOCAL) < 0) fail("flush");
    if (!file.close()) fail("close");
  }
  void scalar_attr(hid_t obj, const char* name, hid_t file_type, hid_t mem_type,
                   const void* value) const {
    if (!write_scalar_attr(obj, name, file_type, mem_type, value)) {
      fail(fmt::format("attribute '{}'", name));
    }
  }
  void i64_attr(hid_t obj, const char* name, int64_t value) const {
    scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
  }
  void string_attr(hid_t obj, const char* name, const std::string& value) const {
    if (!write_string_attr(obj, name, value)) fail(fmt::format("attribute '{}'", name));
  }
  // A 1-D dataset of `n` values, `mem_type` in memory and `file_type` in the file (HDF5 converts
  // in strips, e.g. uint32 in memory to uint16 on disk).
  void dataset_1d(hid_t loc, const char* name, hid_t file_type, hid_t mem_type, const void* data,
                  size_t n) const {
    const hsize_t dims[1] = {static_cast<hsize_t>(n)};
    H5Id space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    if (!space.valid()) fail(fmt::format("/{} dataspace", name));
    H5Id dset(H5Dcreate2(loc, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
              H5Dclose);
    if (!dset.valid()) fail(fmt::format("creating /{}", name));
    if (n > 0 && H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
      fail(fmt::format("writing /{}", name));
    }
    if (!dset.close()) fail(fmt::format("closing /{}", name));
  }

 private:
  const char* what_;
  std::string path_;
};

// Reads the value of a string attribute `attr` of string type `type` (variable or fixed length;
// trailing space padding dropped) into *out. Returns false when HDF5 fails; the caller raises its
// own format's error.
inline bool read_string_attr_value(hid_t attr, hid_t type, std::string* out) {
  const htri_t is_vlen = H5Tis_variable_str(type);
  if (is_vlen < 0) return false;
  if (is_vlen > 0) {
    H5Id mem(H5Tcopy(H5T_C_S1), H5Tclose);
    char* buf = nullptr;
    if (!mem.valid() || H5Tset_size(mem.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(mem.get(), H5Tget_cset(type)) < 0 || H5Aread(attr, mem.get(), &buf) < 0) {
      return false;
    }
    *out = buf != nullptr ? buf : "";
    H5free_memory(buf);
    return true;
  }
  // Fixed length: read the raw bytes with the file's own type, then drop the padding.
  std::string raw(H5Tget_size(type), '\0');
  if (!raw.empty() && H5Aread(attr, type, raw.data()) < 0) return false;
  *out = raw.c_str();
  if (H5Tget_strpad(type) == H5T_STR_SPACEPAD) {
    while (!out->empty() && out->back() == ' ') out->pop_back();
  }
  return true;
}

// Why `path` must not be replaced by a file of berth's format `format` ("" when it may: absent, a
// file of that format (any version), or, with `unreadable_ok`, a file that is not a readable HDF5
// file). A berth command replaces only its own kind of output; anything else at the path (a
// checkpoint's model.h5, another HDF5 file, a text file) is the user's and stays.
inline std::string foreign_file_reason(const std::string& path, const char* format,
                                       bool unreadable_ok) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return "";
  if (fs::is_directory(st)) return "it is a directory";
  H5QuietErrors quiet;
  if (H5Fis_hdf5(path.c_str()) <= 0) return unreadable_ok ? "" : "it is not an HDF5 file";
  H5Id fapl(file_access_plist(), H5Pclose);
  H5Id file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!file.valid()) return unreadable_ok ? "" : "it is an HDF5 file that cannot be opened";
  const htri_t has_format = H5Aexists(file.get(), "format");
  if (has_format < 0) return unreadable_ok ? "" : "it is an HDF5 file whose header cannot be read";
  if (has_format == 0) return "it is an HDF5 file without berth's 'format'";
  H5Id attr(H5Aopen(file.get(), "format", H5P_DEFAULT), H5Aclose);
  H5Id type(attr.valid() ? H5Aget_type(attr.get()) : H5I_INVALID_HID, H5Tclose);
  std::string found;
  if (!type.valid() || H5Tget_class(type.get()) != H5T_STRING ||
      !read_string_attr_value(attr.get(), type.get(), &found)) {
    return "it is an HDF5 file whose 'format' is not a string";
  }
  if (found == format) return "";
  return fmt::format("it is a '{}' file", found);
}

// Throws a specific Error unless `path` is an existing file with an HDF5 signature:
//   "<what> '<path>' does not exist; <hint>", "<what> path '<path>' is a directory; ...",
//   "'<path>' is not a readable HDF5 file (corrupt or truncated?): ...; <hint>".
inline void require_hdf5_file(const std::string& path, const char* what, const char* hint) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) BERTH_FAIL("{} '{}' does not exist; {}", what, path, hint);
  if (fs::is_directory(st)) {
    BERTH_FAIL("{} path '{}' is a directory; expected an HDF5 file ({})", what, path, hint);
  }
  H5QuietErrors quiet;
  const htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 == 0) {
    BERTH_FAIL("'{}' is not a readable HDF5 file (corrupt or truncated?): it has no HDF5 "
               "signature; {}",
               path, hint);
  }
  if (is_hdf5 < 0) {
    BERTH_FAIL("'{}' is not a readable HDF5 file (corrupt or truncated?): checking its signature "
               "failed: {}",
               path, h5_error_detail());
  }
}

}  // namespace berth::h5
