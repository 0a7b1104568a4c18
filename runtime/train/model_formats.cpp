// llm.c model files and Hugging Face GPT-2 safetensors <-> CheckpointData (model_formats.h).
#include "runtime/train/model_formats.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/train/step_metrics.h"

namespace berth {

static_assert(std::endian::native == std::endian::little,
              "model_formats reads and writes little-endian files with memcpy");

namespace {

namespace fs = std::filesystem;

// The fp32 weights are read whole: a model larger than the memory this process may use (a sparse
// file whose size matches its header, a config.json of another model) is said before the allocation
// fails.
void require_weights_fit_memory(const std::string& path, const std::string& dims, int64_t numel) {
  constexpr double kGiB = 1073741824.0;
  const double bytes = double(numel) * double(sizeof(float));
  const double memory = host_capacity_gib_per_rank(1) * kGiB;
  BERTH_CHECK(memory <= 0 || bytes <= memory,
              "'{}' describes a model of {} parameters ({}), {:.1f} GiB in fp32: more than this "
              "process may use ({:.1f} GiB: the host's memory or its cgroup's limit); import it "
              "on a larger machine, or check the file",
              path, numel, dims, bytes / kGiB, memory / kGiB);
}

constexpr int32_t kLlmcTokenMagic = 20240520;  // llm.c token files, a common mix-up
constexpr size_t kLlmcHeaderInts = 256;
constexpr uint64_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);
constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;  // the safetensors library's own limit

// ---- binary files: positioned reads, atomic writes ----------------------------------------------

class InputFile {
 public:
  InputFile(std::string path, const char* what) : path_(std::move(path)) {
    std::error_code ec;
    const fs::file_status st = fs::status(path_, ec);
    if (!fs::exists(st)) BERTH_FAIL("{} '{}' does not exist; check the path", what, path_);
    if (!fs::is_regular_file(st)) BERTH_FAIL("{} '{}' is not a regular file", what, path_);
    in_.open(path_, std::ios::binary);
    if (!in_) BERTH_FAIL("cannot read {} '{}': {}", what, path_, std::strerror(errno));
    size_ = fs::file_size(path_);
  }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Reads `nbytes` at byte `offset`; the callers have checked the range against size().
  void read(void* dst, uint64_t nbytes, uint64_t offset) {
    in_.seekg(static_cast<std::streamoff>(offset));
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(nbytes));
    if (!in_) {
      BERTH_FAIL("reading {} bytes at offset {} of '{}' failed (file truncated while reading?)",
                 nbytes, offset, path_);
    }
  }

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t size_ = 0;
};

// Writes to a temporary next to `final_path`; commit() renames it into place. Destroyed without
// commit() (an exception), it removes the temporary.
class OutputFile {
 public:
  explicit OutputFile(std::string final_path)
      : final_(std::move(final_path)), tmp_(temp_path_for(final_)) {
    out_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!out_) {
      BERTH_FAIL("cannot write '{}': {} (check that the directory exists and is writable)", final_,
                 std::strerror(errno));
    }
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    if (committed_) return;
    out_.close();
    std::remove(tmp_.c_str());
  }
  void write(const void* src, uint64_t nbytes) {
    out_.write(static_cast<const char*>(src), static_cast<std::streamsize>(nbytes));
    if (!out_) BERTH_FAIL("writing '{}' failed (disk full?)", final_);
  }
  void commit() {
    out_.flush();
    out_.close();
    if (out_.fail()) BERTH_FAIL("writing '{}' failed (disk full?)", final_);
    removed_if_killed_.release();
    commit_file(tmp_, final_);  // removes the temporary itself on failure
    committed_ = true;
  }

 private:
  std::string final_, tmp_;
  ScopedTemp removed_if_killed_{tmp_};
  std::ofstream out_;
  bool committed_ = false;
};

// ---- checks shared by readers and writers -------------------------------------------------------

// A writer's input must be a consistent model: the layout of data.model fills data.params.
ParamLayout checked_layout(const CheckpointData& data, const std::string& out) {
  const GPTConfig& m = data.model;
  BERTH_CHECK(m.L > 0 && m.NH > 0 && m.C > 0 && m.V > 0 && m.maxT > 0 && m.C % m.NH == 0 &&
                  m.Vp == padded_vocab(m.V),
              "cannot write '{}': the checkpoint's model shape is invalid (L={} NH={} C={} V={} "
              "Vp={} maxT={})",
              out, m.L, m.NH, m.C, m.V, m.Vp, m.maxT);
  ParamLayout layout = gpt_param_layout(m);
  BERTH_CHECK(int64_t(data.params.size()) == layout.total,
              "cannot write '{}': the checkpoint holds {} parameters but its model (L={} C={} "
              "V={} maxT={}) has {}; the checkpoint is inconsistent",
              out, data.params.size(), m.L, m.C, m.V, m.maxT, layout.total);
  return layout;
}


std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

// ---- half precision -----------------------------------------------------------------------------

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

float f16_to_float(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);  // Inf, or NaN with its payload
  } else if (exp != 0) {
    out = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    out = sign;  // ±0
  } else {
    // subnormal: mant * 2^-24; shift the leading 1 up to the implicit bit
    exp = 113;  // exponent of 2^-14 in fp32 bias, before normalization
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      exp--;
    }
    out = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

// ---- llm.c model files --------------------------------------------------------------------------

namespace {

// The 16 llm.c tensors in file order; per_layer ones are stacked over L, one berth tensor each.
struct LlmcTensor {
  const char* name;
  bool per_layer;
};
constexpr LlmcTensor kLlmcTensors[] = {
    {"wte", false},
    {"wpe", false},
    {"ln_1.weight", true},
    {"ln_1.bias", true},
    {"attn.c_attn.weight", true},
    {"attn.c_attn.bias", true},
    {"attn.c_proj.weight", true},
    {"attn.c_proj.bias", true},
    {"ln_2.weight", true},
    {"ln_2.bias", true},
    {"mlp.c_fc.weight", true},
    {"mlp.c_fc.bias", true},
    {"mlp.c_proj.weight", true},
    {"mlp.c_proj.bias", true},
    {"ln_f.weight", false},
    {"ln_f.bias", false},
};

// The berth tensors in llm.c file order.
std::vector<const ParamSpec*> llmc_order(const ParamLayout& layout, int L) {
  std::map<std::string, const ParamSpec*> by_name;
  for (const ParamSpec& s : layout.specs) by_name[s.name] = &s;
  std::vector<const ParamSpec*> order;
  for (const LlmcTensor& t : kLlmcTensors) {
    if (!t.per_layer) {
      order.push_back(by_name.at(t.name));
      continue;
    }
    for (int l = 0; l < L; l++) order.push_back(by_name.at(fmt::format("h.{}.{}", l, t.name)));
  }
  return order;
}

// Reads n values of the file's dtype at `offset` into dst as float.
void read_llmc_values(InputFile& f, int32_t version, uint64_t offset, int64_t n, float* dst) {
  if (version == kLlmcModelVersionFp32) {
    f.read(dst, uint64_t(n) * 4, offset);
    return;
  }
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  f.read(raw.data(), uint64_t(n) * 2, offset);
  for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_float(raw[size_t(i)]);
}

}  // namespace

CheckpointData read_llmc_model(const std::string& path) {
  InputFile f(path, "llm.c model file");
  if (f.size() < kLlmcHeaderBytes) {
    BERTH_FAIL(
        "'{}' is {} bytes, shorter than the {}-byte header of an llm.c model file "
        "(truncated header)",
        path, f.size(), kLlmcHeaderBytes);
  }
  int32_t h[kLlmcHeaderInts];
  f.read(h, kLlmcHeaderBytes, 0);
  if (h[0] == kLlmcTokenMagic) {
    BERTH_FAIL(
        "'{}' is an llm.c token file (magic {}), not a model file: import tokens with "
        "`berth data import --format llmc`, and give `berth model import --format llmc` a "
        "model file such as gpt2_124M.bin (magic {})",
        path, kLlmcTokenMagic, kLlmcModelMagic);
  }
  if (h[0] != kLlmcModelMagic) {
    BERTH_FAIL(
        "'{}' has magic {}, expected {} (an llm.c model file such as gpt2_124M.bin); check "
        "the path and --format",
        path, h[0], kLlmcModelMagic);
  }
  const int32_t version = h[1];
  if (version != kLlmcModelVersionFp32 && version != kLlmcModelVersionBf16) {
    BERTH_FAIL(
        "'{}' is an llm.c model file version {}; berth reads version {} (fp32) and {} "
        "(bf16), the ones llm.c's train_gpt2.py writes: re-export the model with a current "
        "llm.c",
        path, version, kLlmcModelVersionFp32, kLlmcModelVersionBf16);
  }
  const int32_t maxT = h[2], V = h[3], L = h[4], NH = h[5], C = h[6], Vp_file = h[7];
  const std::string dims =
      fmt::format("maxT={} V={} L={} NH={} C={} Vp={}", maxT, V, L, NH, C, Vp_file);
  if (!(maxT > 0 && V > 0 && L > 0 && NH > 0 && C > 0 && Vp_file > 0 && L <= (1 << 16) &&
        C % NH == 0 && Vp_file >= V)) {
    BERTH_FAIL(
        "'{}': the llm.c header ({}) does not describe a GPT-2 (all must be positive, C "
        "divisible by NH, Vp >= V, L <= 65536); the file is corrupt",
        path, dims);
  }
  CheckpointData data;
  try {
    data.model = make_gpt_config(L, NH, C, V, maxT);
  } catch (const Error& e) {
    BERTH_FAIL("'{}': the llm.c header ({}) is not a model this build can hold: {}", path, dims,
               e.what());
  }
  const GPTConfig& cfg = data.model;
  const ParamLayout layout = gpt_param_layout(cfg);
  const int64_t file_numel = layout.total + (int64_t(Vp_file) - cfg.Vp) * C;
  const uint64_t elem_bytes = version == kLlmcModelVersionFp32 ? 4 : 2;
  const uint64_t expected = kLlmcHeaderBytes + uint64_t(file_numel) * elem_bytes;
  if (f.size() != expected) {
    BERTH_FAIL(
        "'{}': the header (version {}, {}) implies {} parameters, {} bytes with the header, "
        "but the file has {} bytes ({}); re-download or re-export the model",
        path, version, dims, file_numel, expected, f.size(),
        f.size() < expected ? "truncated"
                            : "data past the last tensor: the header disagrees with it");
  }
  if (Vp_file != cfg.Vp) {
    log_warn(
        "'{}': padded vocabulary Vp={} differs from berth's {} (V={} rounded up to a multiple "
        "of 128); keeping the {} real rows of wte and re-padding with zeros",
        path, Vp_file, cfg.Vp, V, V);
  }

  require_weights_fit_memory(path, dims, layout.total);
  data.params.assign(size_t(layout.total), 0.0f);
  uint64_t offset = kLlmcHeaderBytes;
  for (const ParamSpec* s : llmc_order(layout, L)) {
    float* dst = data.params.data() + s->offset;
    if (s->name == "wte" && Vp_file != cfg.Vp) {
      const int64_t real = int64_t(V) * C, pad = (int64_t(Vp_file) - V) * C;
      read_llmc_values(f, version, offset, real, dst);
      std::vector<float> dropped(static_cast<size_t>(pad));
      read_llmc_values(f, version, offset + uint64_t(real) * elem_bytes, pad, dropped.data());
      for (float x : dropped) {
        if (x != 0.0f) {
          log_warn(
              "'{}': dropped non-zero padding rows of wte (rows >= V={}); they never affect "
              "the loss",
              path, V);
          break;
        }
      }
      offset += uint64_t(real + pad) * elem_bytes;
      continue;
    }
    read_llmc_values(f, version, offset, s->numel, dst);
    offset += uint64_t(s->numel) * elem_bytes;
  }
  warn_non_finite(data, layout, path);
  data.meta.source = "import llmc " + path;
  return data;
}

bool is_llmc_model_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  int32_t magic = 0;
  return in.read(reinterpret_cast<char*>(&magic), sizeof magic) && magic == kLlmcModelMagic;
}

void write_llmc_model(const std::string& path, const CheckpointData& data) {
  const ParamLayout layout = checked_layout(data, path);
  const GPTConfig& m = data.model;
  int32_t h[kLlmcHeaderInts] = {};
  h[0] = kLlmcModelMagic;
  h[1] = kLlmcModelVersionFp32;
  h[2] = m.maxT;
  h[3] = m.V;
  h[4] = m.L;
  h[5] = m.NH;
  h[6] = m.C;
  h[7] = m.Vp;
  OutputFile out(path);
  out.write(h, kLlmcHeaderBytes);
  for (const ParamSpec* s : llmc_order(layout, m.L)) {
    out.write(data.params.data() + s->offset, uint64_t(s->numel) * sizeof(float));
  }
  out.commit();
}

// ---- safetensors --------------------------------------------------------------------------------

namespace {

struct StTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, nbytes = 0;  // absolute file offset of the data, its length
};

// Bytes per element of the safetensors dtypes (0 = unknown: only its bounds are checked).
uint64_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, uint64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  const auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

std::map<std::string, StTensor> read_safetensors_header(InputFile& f) {
  const std::string& path = f.path();
  if (f.size() < 8) {
    BERTH_FAIL(
        "'{}' is {} bytes, shorter than the 8-byte header length of a safetensors file "
        "(truncated)",
        path, f.size());
  }
  uint64_t n = 0;
  f.read(&n, 8, 0);
  if (n > f.size() - 8) {
    BERTH_FAIL(
        "'{}': the safetensors header length {} runs past the end of the file ({} bytes): "
        "truncated or not a safetensors file",
        path, n, f.size());
  }
  if (n > kMaxSafetensorsHeader) {
    BERTH_FAIL("'{}': safetensors header length {} exceeds {} bytes: not a safetensors file", path,
               n, kMaxSafetensorsHeader);
  }
  std::string text(size_t(n), '\0');
  f.read(text.data(), n, 8);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    BERTH_FAIL("'{}': the safetensors header is not valid JSON ({}): truncated or corrupt file",
               path, e.what());
  }
  if (!header.is_object()) BERTH_FAIL("'{}': the safetensors header is not a JSON object", path);
  const uint64_t data_start = 8 + n, data_bytes = f.size() - data_start;
  std::map<std::string, StTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    StTensor t;
    uint64_t b = 0, e = 0;
    try {
      t.dtype = entry.at("dtype").get<std::string>();
      // get<> would truncate 8.5 to 8 and wrap -1 to 2^64 - 1: whole numbers are checked first.
      for (const auto& d : entry.at("shape")) {
        if (!d.is_number_integer()) throw std::runtime_error("shape must hold whole numbers");
      }
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      for (const auto& o : entry.at("data_offsets")) {
        if (!o.is_number_unsigned()) {
          throw std::runtime_error("data_offsets must hold whole numbers >= 0");
        }
      }
      const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2) throw std::runtime_error("data_offsets must have 2 values");
      b = offsets[0];
      e = offsets[1];
    } catch (const std::exception& ex) {
      BERTH_FAIL("'{}': safetensors header entry '{}' is malformed ({})", path, name, ex.what());
    }
    if (b > e || e > data_bytes) {
      BERTH_FAIL(
          "'{}': tensor '{}' data_offsets [{}, {}) lie outside the {} data bytes: truncated "
          "or corrupt file",
          path, name, b, e, data_bytes);
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) BERTH_FAIL("'{}': tensor '{}' has a negative dimension", path, name);
      if (__builtin_mul_overflow(numel, uint64_t(d), &numel)) {
        BERTH_FAIL("'{}': tensor '{}' has shape {}, more elements than 2^64: corrupt header", path,
                   name, shape_str(t.shape));
      }
    }
    const uint64_t eb = dtype_bytes(t.dtype);
    uint64_t need = 0;
    const bool too_big = __builtin_mul_overflow(numel, eb, &need);
    if (eb != 0 && (too_big || need != e - b)) {
      BERTH_FAIL("'{}': tensor '{}' ({} {}) needs {} bytes but its data_offsets span {}", path,
                 name, t.dtype, shape_str(t.shape),
                 too_big ? std::string("more than 2^64") : std::to_string(need), e - b);
    }
    t.begin = data_start + b;
    t.nbytes = e - b;
    tensors.emplace(name, std::move(t));
  }
  // The format's rule: the tensors tile the data bytes, without overlap or holes. Overlapping
  // offsets read one tensor's bytes as another's (wpe from wte's), silently.
  // (Empty tensors, [X, X], first among those starting at X.)
  std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> starts;
  for (const auto& [name, t] : tensors) starts.emplace_back(t.begin, t.nbytes, &name);
  std::sort(starts.begin(), starts.end());
  uint64_t next = data_start;
  for (const auto& [begin, nbytes, name] : starts) {
    if (begin != next) {
      BERTH_FAIL(
          "'{}': tensor '{}' starts at data byte {}, {} {}: the safetensors header's "
          "data_offsets {} the data; the file is corrupt",
          path, *name, begin - data_start,
          begin < next ? "inside the tensor before it, which ends at" : "after a hole from",
          next - data_start, begin < next ? "overlap in" : "leave holes in");
    }
    next = begin + nbytes;
  }
  if (next != f.size()) {
    BERTH_FAIL(
        "'{}': {} bytes follow the last tensor's data: the header does not describe the "
        "whole file; the file is corrupt",
        path, f.size() - next);
  }
  return tensors;
}

std::vector<float> read_st_values(InputFile& f, const std::string& name, const StTensor& t) {
  const uint64_t eb = dtype_bytes(t.dtype);
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") {
    BERTH_FAIL(
        "'{}': tensor '{}' has dtype {}; berth reads F32, F16 and BF16 (convert the model, "
        "e.g. model.to(torch.float32).save_pretrained(...))",
        f.path(), name, t.dtype);
  }
  std::vector<float> out(size_t(t.nbytes / eb));
  if (eb == 4) {
    f.read(out.data(), t.nbytes, t.begin);
    return out;
  }
  std::vector<uint16_t> raw(out.size());
  f.read(raw.data(), t.nbytes, t.begin);
  const bool bf16 = t.dtype == "BF16";
  for (size_t i = 0; i < out.size(); i++)
    out[i] = bf16 ? bf16_to_float(raw[i]) : f16_to_float(raw[i]);
  return out;
}

// HF name of a berth tensor, and whether it is a Conv1D weight stored (in, out).
std::string hf_name(const ParamSpec& s) {
  return (s.name == "wte" || s.name == "wpe") ? s.name + ".weight" : s.name;
}
bool is_conv1d(const ParamSpec& s) {
  return s.shape.size() == 2 && s.name != "wte" && s.name != "wpe";
}

std::vector<int64_t> hf_shape(const ParamSpec& s, const GPTConfig& cfg) {
  if (s.name == "wte") return {cfg.V, cfg.C};
  if (is_conv1d(s)) return {s.shape[1], s.shape[0]};
  return s.shape;
}

int64_t get_config_int(const nlohmann::json& j, const std::string& path, const char* key,
                       const char* fallback = nullptr) {
  const char* k =
      (!j.contains(key) && fallback != nullptr && j.contains(fallback)) ? fallback : key;
  if (!j.contains(k) || !j.at(k).is_number_integer()) {
    BERTH_FAIL(
        "'{}' has no integer '{}' (a GPT-2 config.json has n_layer, n_head, n_embd, "
        "vocab_size, n_positions)",
        path, key);
  }
  return j.at(k).get<int64_t>();
}

// Resolves `dir_or_file` to the safetensors file and its config.json.
std::pair<std::string, std::string> hf_paths(const std::string& dir_or_file) {
  if (fs::is_directory(dir_or_file)) {
    const fs::path dir(dir_or_file);
    if (!fs::exists(dir / "model.safetensors") && fs::exists(dir / "pytorch_model.bin")) {
      BERTH_FAIL(
          "'{}' holds pytorch_model.bin but no model.safetensors; berth reads safetensors "
          "only: re-save with transformers' save_pretrained(..., safe_serialization=True)",
          dir_or_file);
    }
    if (!fs::exists(dir / "model.safetensors") &&
        fs::exists(dir / "model.safetensors.index.json")) {
      BERTH_FAIL(
          "'{}' holds a sharded checkpoint (model.safetensors.index.json and its shards); berth "
          "reads one model.safetensors: re-save it unsharded with transformers' "
          "save_pretrained(..., max_shard_size=\"100GB\")",
          dir_or_file);
    }
    return {(dir / "model.safetensors").string(), (dir / "config.json").string()};
  }
  return {dir_or_file, (fs::path(dir_or_file).parent_path() / "config.json").string()};
}

}  // namespace

CheckpointData read_hf_gpt2(const std::string& dir_or_file) {
  const auto [st_path, config_path] = hf_paths(dir_or_file);
  if (!fs::is_regular_file(config_path)) {
    BERTH_FAIL(
        "'{}' not found: a Hugging Face GPT-2 model needs its config.json (n_head cannot be "
        "read from the weights); put it next to the .safetensors file",
        config_path);
  }
  nlohmann::json hc;
  try {
    hc = nlohmann::json::parse(read_text_file(config_path));
  } catch (const nlohmann::json::exception& e) {
    BERTH_FAIL("'{}' is not valid JSON: {}", config_path, e.what());
  }
  if (hc.contains("model_type") && hc["model_type"] != "gpt2") {
    log_warn("'{}': model_type is {}, not \"gpt2\"; reading it as GPT-2", config_path,
             hc["model_type"].dump());
  }
  if (hc.contains("activation_function") && hc["activation_function"] != "gelu_new" &&
      hc["activation_function"] != "gelu_pytorch_tanh") {
    log_warn(
        "'{}': activation_function is {}; berth's GPT-2 uses the tanh GELU (gelu_new), so "
        "outputs will differ",
        config_path, hc["activation_function"].dump());
  }
  if (hc.contains("layer_norm_epsilon") && hc["layer_norm_epsilon"].is_number() &&
      std::fabs(hc["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12) {
    log_warn("'{}': layer_norm_epsilon is {}; berth's LayerNorm uses 1e-5, so outputs will differ",
             config_path, hc["layer_norm_epsilon"].dump());
  }
  // Other keys of GPT2Config that change what the weights compute (HF's defaults are berth's).
  for (const auto& [key, berths] : {std::pair{"scale_attn_weights", true},
                                    std::pair{"scale_attn_by_inverse_layer_idx", false}}) {
    if (hc.contains(key) && hc[key].is_boolean() && hc[key].get<bool>() != berths) {
      log_warn(
          "'{}': {} is {}; berth's GPT-2 scales attention scores by 1/sqrt(head size) only, so "
          "outputs will differ",
          config_path, key, hc[key].dump());
    }
  }
  if (hc.contains("n_inner") && !hc["n_inner"].is_null() && hc.contains("n_embd") &&
      hc["n_embd"].is_number_integer() &&
      hc["n_inner"] != nlohmann::json(4 * hc["n_embd"].get<int64_t>())) {
    BERTH_FAIL(
        "'{}': n_inner is {}; berth's GPT-2 MLP is 4 × n_embd = {} wide, so this model cannot be "
        "imported",
        config_path, hc["n_inner"].dump(), 4 * hc["n_embd"].get<int64_t>());
  }
  CheckpointData data;
  try {
    data.model = make_gpt_config(
        get_config_int(hc, config_path, "n_layer"), get_config_int(hc, config_path, "n_head"),
        get_config_int(hc, config_path, "n_embd"), get_config_int(hc, config_path, "vocab_size"),
        get_config_int(hc, config_path, "n_positions", "n_ctx"));
  } catch (const Error& e) {
    BERTH_FAIL("'{}': {}", config_path, e.what());
  }
  const GPTConfig& cfg = data.model;
  const ParamLayout layout = gpt_param_layout(cfg);

  InputFile f(st_path, "safetensors file");
  const std::map<std::string, StTensor> tensors = read_safetensors_header(f);
  std::set<std::string> used;
  auto lookup = [&](const std::string& name) -> std::pair<std::string, const StTensor*> {
    for (const std::string& n : {name, "transformer." + name}) {
      const auto it = tensors.find(n);
      if (it != tensors.end()) return {n, &it->second};
    }
    return {name, nullptr};
  };

  require_weights_fit_memory(
      config_path,
      fmt::format("n_layer={} n_head={} n_embd={} vocab_size={}", cfg.L, cfg.NH, cfg.C, cfg.V),
      layout.total);
  data.params.assign(size_t(layout.total), 0.0f);
  for (const ParamSpec& s : layout.specs) {
    const auto [name, t] = lookup(hf_name(s));
    // Both spellings of one tensor: which one is the model? (The second was dropped as "not part
    // of GPT-2".)
    BERTH_CHECK(t == nullptr || name != hf_name(s) || !tensors.count("transformer." + name),
                "'{}' holds both '{}' and 'transformer.{}': two copies of one tensor; keep one",
                st_path, name, name);
    if (t == nullptr) {
      BERTH_FAIL(
          "'{}': tensor '{}' is missing (also looked for 'transformer.{}'); config.json says "
          "n_layer={}: is this the GPT-2 checkpoint that goes with this config.json?",
          st_path, hf_name(s), hf_name(s), cfg.L);
    }
    used.insert(name);
    const std::vector<int64_t> want = hf_shape(s, cfg);
    if (t->shape != want) {
      BERTH_FAIL(
          "'{}': tensor '{}' has shape {}, expected {} for n_embd={} vocab_size={} "
          "n_positions={} from config.json: the weights and config.json disagree",
          st_path, name, shape_str(t->shape), shape_str(want), cfg.C, cfg.V, cfg.maxT);
    }
    const std::vector<float> v = read_st_values(f, name, *t);
    float* dst = data.params.data() + s.offset;
    if (is_conv1d(s)) {  // (in, out) -> (out, in)
      const int64_t out = s.shape[0], in = s.shape[1];
      for (int64_t o = 0; o < out; o++) {
        for (int64_t i = 0; i < in; i++) dst[o * in + i] = v[size_t(i * out + o)];
      }
    } else {
      std::copy(v.begin(), v.end(), dst);  // wte: V rows, rows V..Vp-1 stay zero
    }
  }

  std::vector<std::string> unknown;
  for (const auto& [name, t] : tensors) {
    if (used.count(name) != 0) continue;
    const std::string n = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (n.ends_with(".attn.bias") || n.ends_with(".attn.masked_bias")) continue;  // buffers
    if (n == "lm_head.weight") {
      const float* wte = data.params.data() + layout.find("wte").offset;
      const bool readable = t.dtype == "F32" || t.dtype == "F16" || t.dtype == "BF16";
      if (t.shape != hf_shape(layout.find("wte"), cfg) || !readable ||
          !std::ranges::equal(read_st_values(f, name, t), std::span(wte, size_t(cfg.V) * cfg.C))) {
        log_warn(
            "'{}': lm_head.weight differs from wte.weight; berth ties the LM head to wte and "
            "ignores lm_head.weight",
            st_path);
      }
      continue;
    }
    int layer = -1;
    if (std::sscanf(n.c_str(), "h.%d.", &layer) == 1 && layer >= cfg.L) {
      BERTH_FAIL(
          "'{}' holds tensor '{}' but config.json says n_layer={}: the weights and "
          "config.json disagree",
          st_path, name, cfg.L);
    }
    unknown.push_back(name);
  }
  if (!unknown.empty()) {
    log_warn("'{}': ignored {} tensor(s) that are not part of GPT-2 (first: '{}')", st_path,
             unknown.size(), unknown.front());
  }
  warn_non_finite(data, layout, st_path);
  data.meta.source = "import hf-gpt2 " + dir_or_file;
  return data;
}

// Why `file` (model.safetensors or config.json) of an existing --out directory must not be
// replaced ("" when it may: absent, or an earlier GPT-2 export: a config.json of model_type
// "gpt2", a model.safetensors whose header reads). Anything else there (a project's config.json,
// a directory in the way) is the user's.
std::string foreign_hf_file(const fs::path& file) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(file, ec);
  if (!fs::exists(st)) return "";
  if (!fs::is_regular_file(st)) return "it is not a regular file";
  if (file.filename() == "config.json") {
    std::ifstream in(file);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("model_type", nlohmann::json()) != "gpt2")
      return "it is not the config.json of a GPT-2 model (model_type \"gpt2\")";
    return "";
  }
  try {
    InputFile f(file.string(), "safetensors file");
    read_safetensors_header(f);
  } catch (const Error&) {
    return "it is not a safetensors file";
  }
  return "";
}

void write_hf_gpt2(const std::string& out_dir, const CheckpointData& data) {
  const ParamLayout layout = checked_layout(data, out_dir);
  const GPTConfig& m = data.model;

  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t data_bytes = 0;
  for (const ParamSpec& s : layout.specs) {
    const std::vector<int64_t> shape = hf_shape(s, m);
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= uint64_t(d);
    header[hf_name(s)] = {
        {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {data_bytes, data_bytes + numel * 4}}};
    data_bytes += numel * 4;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  nlohmann::ordered_json config = {{"architectures", {"GPT2LMHeadModel"}},
                                   {"model_type", "gpt2"},
                                   {"n_layer", m.L},
                                   {"n_head", m.NH},
                                   {"n_embd", m.C},
                                   {"vocab_size", m.V},
                                   {"n_positions", m.maxT},
                                   {"n_ctx", m.maxT},
                                   {"activation_function", "gelu_new"},
                                   {"layer_norm_epsilon", 1e-5},
                                   {"tie_word_embeddings", true},
                                   {"torch_dtype", "float32"}};
  const std::string config_text = config.dump(2) + "\n";

  // A new directory is built under a temporary name and renamed; into an existing one the two
  // files go as temporaries that are renamed at the end.
  std::error_code ec;
  const bool exists = fs::exists(out_dir, ec);
  if (exists && !fs::is_directory(out_dir)) {
    BERTH_FAIL(
        "'{}' exists and is not a directory; hf-gpt2 export writes a directory "
        "(model.safetensors + config.json)",
        out_dir);
  }
  // Into an existing directory both files are checked before either is written: a failed
  // second rename would leave the first file replaced.
  for (const char* name : {"model.safetensors", "config.json"}) {
    if (!exists) break;
    const std::string why = foreign_hf_file(fs::path(out_dir) / name);
    BERTH_CHECK(why.empty(),
                "'{}' exists and {}: the export would replace it; export into a new directory, "
                "or remove it first",
                (fs::path(out_dir) / name).string(), why);
  }
  const std::string dir = exists ? out_dir : temp_path_for(out_dir);
  ScopedTemp dir_removed_if_killed(exists ? std::string() : dir);
  if (!exists && !fs::create_directory(dir, ec)) {
    BERTH_FAIL("cannot create '{}': {} (check that the parent directory exists and is writable)",
               out_dir, ec ? ec.message() : "already exists");
  }
  try {
    OutputFile st((fs::path(dir) / "model.safetensors").string());
    OutputFile cf((fs::path(dir) / "config.json").string());
    const uint64_t n = text.size();
    st.write(&n, 8);
    st.write(text.data(), n);
    std::vector<float> buf;
    for (const ParamSpec& s : layout.specs) {
      const float* src = data.params.data() + s.offset;
      if (s.name == "wte") {
        st.write(src, uint64_t(m.V) * m.C * 4);  // real rows only: HF's vocab_size is V
      } else if (is_conv1d(s)) {                 // (out, in) -> (in, out)
        const int64_t out = s.shape[0], in = s.shape[1];
        buf.resize(size_t(s.numel));
        for (int64_t i = 0; i < in; i++) {
          for (int64_t o = 0; o < out; o++) buf[size_t(i * out + o)] = src[o * in + i];
        }
        st.write(buf.data(), uint64_t(s.numel) * 4);
      } else {
        st.write(src, uint64_t(s.numel) * 4);
      }
    }
    cf.write(config_text.data(), config_text.size());
    // Committed inside a new directory's temporary, the files are still temporaries until it is
    // renamed: a signal removes them, then the directory (newest first).
    const std::string st_in_dir = exists ? "" : (fs::path(dir) / "model.safetensors").string();
    const std::string cf_in_dir = exists ? "" : (fs::path(dir) / "config.json").string();
    ScopedTemp st_removed_if_killed(st_in_dir), cf_removed_if_killed(cf_in_dir);
    st.commit();
    cf.commit();
    if (!exists) {
      st_removed_if_killed.release();
      cf_removed_if_killed.release();
      dir_removed_if_killed.release();
      fs::rename(dir, out_dir, ec);
      if (ec) BERTH_FAIL("cannot move '{}' into place as '{}': {}", dir, out_dir, ec.message());
    }
  } catch (...) {
    if (!exists) fs::remove_all(dir, ec);
    throw;
  }
}

}  // namespace berth
