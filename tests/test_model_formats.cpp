// Model interop (runtime/train/model_formats.h): llm.c model files and HF GPT-2 safetensors.
// Round trips are byte-identical; the HF files of these tests are built by hand here (an
// independent writer and an independent Conv1D transpose), and an imported model's forward pass
// equals (==) the one of the same weights set directly. Every bad input has its specific error.
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/model/gpt.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/model_formats.h"
#include "tests/expect_error.h"

namespace berth {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

// ---- helpers ------------------------------------------------------------------------------------

class ModelFormats : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) / fmt::format("berth_mf_{}_{}", info->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Every path under the test directory whose name marks a leftover temporary.
  std::vector<std::string> temp_leftovers() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      if (e.path().filename().string().find(".tmp") != std::string::npos) {
        out.push_back(e.path().string());
      }
    }
    return out;
  }

  fs::path dir_;
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

int32_t get_i32(const std::string& b, size_t i) {
  int32_t v;
  std::memcpy(&v, b.data() + 4 * i, 4);
  return v;
}
void set_i32(std::string* b, size_t i, int32_t v) { std::memcpy(b->data() + 4 * i, &v, 4); }

// L=2, NH=2, C=32, V=100 (Vp 128), maxT=16 with distinct random values; wte's padding rows are
// zero (as berth's init leaves them). `bf16_exact` truncates every value to bf16.
CheckpointData small_model(uint32_t seed, bool bf16_exact = false) {
  CheckpointData d;
  d.model = make_gpt_config(2, 2, 32, 100, 16);
  const ParamLayout layout = gpt_param_layout(d.model);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  d.params.resize(size_t(layout.total));
  for (float& x : d.params) {
    x = normal(rng);
    if (bf16_exact) x = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u);
  }
  const int64_t real = int64_t(d.model.V) * d.model.C;
  std::fill(d.params.begin() + real, d.params.begin() + layout.find("wte").numel, 0.0f);
  return d;
}

// ---- an independent safetensors writer ----------------------------------------------------------

struct HfTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// header_len_override >= 0 writes that value as the header length instead of the real one.
void write_safetensors(const std::string& path, const std::vector<HfTensor>& tensors,
                       int64_t header_len_override = -1) {
  std::string header = "{\"__metadata__\":{\"format\":\"pt\"}", data;
  for (const HfTensor& t : tensors) {
    header +=
        fmt::format(",\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", t.name,
                    t.dtype, fmt::join(t.shape, ","), data.size(), data.size() + t.bytes.size());
    data += t.bytes;
  }
  header += "}";
  const uint64_t n = header_len_override >= 0 ? uint64_t(header_len_override) : header.size();
  std::string file(8, '\0');
  std::memcpy(file.data(), &n, 8);
  write_bytes(path, file + header + data);
}

void write_config(const std::string& dir, const GPTConfig& m) {
  write_bytes(dir + "/config.json",
              fmt::format("{{\"model_type\": \"gpt2\", \"n_layer\": {}, \"n_head\": {}, "
                          "\"n_embd\": {}, \"vocab_size\": {}, \"n_positions\": {}}}",
                          m.L, m.NH, m.C, m.V, m.maxT));
}

// F16 bits of a value that is exactly a normal f16 or zero (the tests only make such values).
uint16_t f16_exact(float x) {
  if (x == 0.0f) return std::signbit(x) ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::fabs(double(x)), &e);  // x = m * 2^e, m in [0.5, 1)
  const double mant = (m * 2.0 - 1.0) * 1024.0;
  EXPECT_EQ(mant, std::floor(mant)) << x << " is not f16-exact";
  EXPECT_TRUE(e - 1 + 15 > 0 && e - 1 + 15 < 31) << x << " is not a normal f16";
  return uint16_t((x < 0 ? 0x8000 : 0) | ((e - 1 + 15) << 10) | int(mant));
}

std::string encode(const std::vector<float>& v, const std::string& dtype) {
  std::string out;
  for (float x : v) {
    uint32_t bits = 0;
    size_t n = 4;
    if (dtype == "F32") {
      bits = std::bit_cast<uint32_t>(x);
    } else if (dtype == "BF16") {
      bits = std::bit_cast<uint32_t>(x) >> 16;
      n = 2;
    } else {
      bits = f16_exact(x);
      n = 2;
    }
    out.append(reinterpret_cast<const char*>(&bits), n);
  }
  return out;
}

// The HF tensors of berth weights: "wte.weight" with V rows, Conv1D weights transposed to (in,
// out) here (not by the code under test). `prefix` is "" or "transformer.".
std::vector<HfTensor> hf_tensors(const CheckpointData& d, const std::string& dtype,
                                 const std::string& prefix = "") {
  std::vector<HfTensor> out;
  for (const ParamSpec& s : gpt_param_layout(d.model).specs) {
    const float* p = d.params.data() + s.offset;
    HfTensor t;
    t.dtype = dtype;
    std::vector<float> v(p, p + s.numel);
    if (s.name == "wte" || s.name == "wpe") {
      t.name = prefix + s.name + ".weight";
      t.shape = {s.name == "wte" ? d.model.V : s.shape[0], s.shape[1]};
      v.resize(size_t(t.shape[0] * t.shape[1]));
    } else if (s.shape.size() == 2) {
      t.name = prefix + s.name;
      const int64_t rows = s.shape[0], cols = s.shape[1];  // berth (out, in)
      t.shape = {cols, rows};
      for (int64_t o = 0; o < rows; o++) {
        for (int64_t i = 0; i < cols; i++) v[size_t(i * rows + o)] = p[o * cols + i];
      }
    } else {
      t.name = prefix + s.name;
      t.shape = s.shape;
    }
    t.bytes = encode(v, dtype);
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<HfTensor> without(std::vector<HfTensor> ts, const std::string& name) {
  std::erase_if(ts, [&](const HfTensor& t) { return t.name == name; });
  return ts;
}

// ---- llm.c --------------------------------------------------------------------------------------

TEST_F(ModelFormats, LlmcExportImportExportIsByteIdentical) {
  const CheckpointData a = small_model(1);
  write_llmc_model(path("a.bin"), a);
  const CheckpointData b = read_llmc_model(path("a.bin"));
  EXPECT_EQ(b.params, a.params);
  EXPECT_EQ(b.model.L, 2);
  EXPECT_EQ(b.model.NH, 2);
  EXPECT_EQ(b.model.C, 32);
  EXPECT_EQ(b.model.V, 100);
  EXPECT_EQ(b.model.Vp, 128);
  EXPECT_EQ(b.model.maxT, 16);
  EXPECT_EQ(b.meta.step, 0);
  EXPECT_EQ(b.meta.source, "import llmc " + path("a.bin"));
  EXPECT_FALSE(b.has_optimizer());
  write_llmc_model(path("b.bin"), b);
  EXPECT_EQ(read_bytes(path("b.bin")), read_bytes(path("a.bin")));
  EXPECT_TRUE(temp_leftovers().empty());
}

TEST_F(ModelFormats, LlmcFileLayoutFollowsTheSpec) {
  const CheckpointData a = small_model(2);
  write_llmc_model(path("a.bin"), a);
  const std::string f = read_bytes(path("a.bin"));
  const int64_t L = 2, C = 32, V = 100, Vp = 128, maxT = 16;
  const std::vector<int32_t> header = {20240326,   3, int32_t(maxT), int32_t(V),
                                       int32_t(L), 2, int32_t(C),    int32_t(Vp)};
  for (size_t i = 0; i < header.size(); i++) EXPECT_EQ(get_i32(f, i), header[i]) << i;
  for (size_t i = header.size(); i < 256; i++) EXPECT_EQ(get_i32(f, i), 0) << i;
  const int64_t per_layer = 12 * C * C + 13 * C;
  ASSERT_EQ(int64_t(f.size()), 1024 + 4 * (Vp * C + maxT * C + L * per_layer + 2 * C));
  // Offsets from the spec's tensor order: wte, wpe, ln_1.w (L,C), ln_1.b (L,C), c_attn.w ...
  auto at = [&](int64_t elem) {
    float x;
    std::memcpy(&x, f.data() + 1024 + 4 * elem, 4);
    return x;
  };
  const ParamLayout lay = gpt_param_layout(a.model);
  auto berth = [&](const std::string& name, int64_t i) {
    return a.params[size_t(lay.find(name).offset + i)];
  };
  const int64_t ln1w = Vp * C + maxT * C, ln1b = ln1w + L * C, qkvw = ln1b + L * C;
  EXPECT_EQ(at(ln1b + 1 * C + 5), berth("h.1.ln_1.bias", 5));
  EXPECT_EQ(at(qkvw + 1 * 3 * C * C + 7 * C + 3), berth("h.1.attn.c_attn.weight", 7 * C + 3));
  EXPECT_EQ(at(int64_t(f.size() / 4) - 256 - 1), berth("ln_f.bias", C - 1));
}

TEST_F(ModelFormats, LlmcBf16Version5IsRead) {
  const CheckpointData a = small_model(3, /*bf16_exact=*/true);
  write_llmc_model(path("fp32.bin"), a);
  const std::string fp32 = read_bytes(path("fp32.bin"));
  std::string bf16 = fp32.substr(0, 1024);
  set_i32(&bf16, 1, 5);
  for (size_t i = 1024; i < fp32.size(); i += 4) bf16 += fp32.substr(i + 2, 2);  // high halves
  write_bytes(path("bf16.bin"), bf16);
  EXPECT_EQ(read_llmc_model(path("bf16.bin")).params, a.params);
}

TEST_F(ModelFormats, LlmcOtherVpIsRepadded) {
  const CheckpointData a = small_model(4);
  write_llmc_model(path("a.bin"), a);
  std::string f = read_bytes(path("a.bin"));
  set_i32(&f, 7, 100);                        // Vp = V: no padding rows
  f.erase(1024 + 4 * 100 * 32, 4 * 28 * 32);  // drop wte rows 100..127
  write_bytes(path("vp100.bin"), f);
  const CheckpointData b = read_llmc_model(path("vp100.bin"));
  EXPECT_EQ(b.model.Vp, 128);
  EXPECT_EQ(b.params, a.params);
}

TEST_F(ModelFormats, LlmcBadInput) {
  const CheckpointData a = small_model(5);
  write_llmc_model(path("a.bin"), a);
  const std::string good = read_bytes(path("a.bin"));
  auto variant = [&](const std::string& name, const std::string& bytes) {
    write_bytes(path(name), bytes);
    return path(name);
  };
  expect_error([&] { read_llmc_model(path("missing.bin")); }, {"does not exist"});
  expect_error([&] { read_llmc_model(variant("short.bin", good.substr(0, 100))); },
               {"short.bin", "truncated header"});
  std::string tokens = good;
  set_i32(&tokens, 0, 20240520);
  expect_error([&] { read_llmc_model(variant("tokens.bin", tokens)); },
               {"token file", "berth data import --format llmc"});
  std::string magic = good;
  set_i32(&magic, 0, 12345);
  expect_error([&] { read_llmc_model(variant("magic.bin", magic)); }, {"magic 12345", "20240326"});
  std::string v4 = good;
  set_i32(&v4, 1, 4);
  expect_error([&] { read_llmc_model(variant("v4.bin", v4)); },
               {"version 4", "3 (fp32)", "5 (bf16)", "re-export"});
  expect_error([&] { read_llmc_model(variant("cut.bin", good.substr(0, good.size() - 4))); },
               {"cut.bin", "truncated"});
  std::string more_layers = good;  // header claims 3 layers, data holds 2
  set_i32(&more_layers, 4, 3);
  expect_error([&] { read_llmc_model(variant("l3.bin", more_layers)); }, {"L=3", "truncated"});
  std::string fewer_layers = good;  // header claims 1 layer: data left over
  set_i32(&fewer_layers, 4, 1);
  expect_error([&] { read_llmc_model(variant("l1.bin", fewer_layers)); },
               {"L=1", "header disagrees"});
  std::string bad_heads = good;  // C=32 not divisible by NH=3
  set_i32(&bad_heads, 5, 3);
  expect_error([&] { read_llmc_model(variant("nh3.bin", bad_heads)); },
               {"NH=3", "does not describe a GPT-2"});
  std::string small_vp = good;
  set_i32(&small_vp, 7, 64);
  expect_error([&] { read_llmc_model(variant("vp64.bin", small_vp)); }, {"Vp=64", "Vp >= V"});
}

TEST_F(ModelFormats, LlmcNanIsAWarningNamingTheTensor) {
  CheckpointData a = small_model(6);
  const ParamLayout layout = gpt_param_layout(a.model);  // kept alive: s refers into it
  const ParamSpec& s = layout.find("h.1.ln_2.bias");
  a.params[size_t(s.offset + 3)] = std::numeric_limits<float>::quiet_NaN();
  write_llmc_model(path("nan.bin"), a);
  ::testing::internal::CaptureStderr();
  const CheckpointData b = read_llmc_model(path("nan.bin"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("h.1.ln_2.bias"), std::string::npos) << err;
  EXPECT_NE(err.find("NaN"), std::string::npos) << err;
  EXPECT_EQ(err.find("h.0."), std::string::npos) << "only the bad tensor is named: " << err;
  EXPECT_TRUE(std::isnan(b.params[size_t(s.offset + 3)]));
}

TEST_F(ModelFormats, ImportSaveLoadExportThroughACheckpoint) {
  write_llmc_model(path("a.bin"), small_model(7));
  save_checkpoint(path("ckpt"), read_llmc_model(path("a.bin")));
  const CheckpointData c = load_checkpoint(path("ckpt"), /*with_optimizer=*/false);
  EXPECT_EQ(c.model.Vp, 128);
  write_llmc_model(path("b.bin"), c);
  EXPECT_EQ(read_bytes(path("b.bin")), read_bytes(path("a.bin")));
}

// ---- half precision -----------------------------------------------------------------------------

TEST(HalfPrecision, F16EveryBitPattern) {
  for (uint32_t bits = 0; bits < 65536; bits++) {
    const int sign = (bits & 0x8000) ? -1 : 1, exp = (bits >> 10) & 0x1f, mant = bits & 0x3ff;
    const float got = f16_to_float(uint16_t(bits));
    if (exp == 31) {
      if (mant == 0) {
        EXPECT_EQ(got, sign * std::numeric_limits<float>::infinity()) << bits;
      } else {
        EXPECT_TRUE(std::isnan(got)) << bits;
      }
      continue;
    }
    const double want = exp == 0 ? std::ldexp(double(mant), -24)  // subnormal
                                 : std::ldexp(double(1024 + mant), exp - 25);
    EXPECT_EQ(double(got), sign * want) << bits;
    EXPECT_EQ(std::signbit(got), sign < 0) << bits;
  }
}

TEST(HalfPrecision, Bf16IsTheHighHalf) {
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0xc040), -3.0f);
  EXPECT_EQ(bf16_to_float(0x0001), std::ldexp(1.0f, -133));  // subnormal
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc1)));
}

// ---- Hugging Face GPT-2 -------------------------------------------------------------------------

TEST_F(ModelFormats, HfExportImportExportIsByteIdentical) {
  const CheckpointData a = small_model(8);
  write_hf_gpt2(path("hf1"), a);
  const CheckpointData b = read_hf_gpt2(path("hf1"));
  EXPECT_EQ(b.params, a.params);
  EXPECT_EQ(b.model.Vp, 128);
  EXPECT_EQ(b.meta.source, "import hf-gpt2 " + path("hf1"));
  EXPECT_EQ(read_hf_gpt2(path("hf1") + "/model.safetensors").params, a.params);  // file path
  write_hf_gpt2(path("hf2"), b);
  for (const char* f : {"/model.safetensors", "/config.json"}) {
    EXPECT_EQ(read_bytes(path("hf2") + f), read_bytes(path("hf1") + f)) << f;
  }
  // The header is padded to 8 bytes; the file holds V (not Vp) rows of wte and no lm_head.
  const std::string st = read_bytes(path("hf1/model.safetensors"));
  uint64_t n;
  std::memcpy(&n, st.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  const std::string header = st.substr(8, n);
  EXPECT_NE(header.find("\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[100,32]"), std::string::npos)
      << header;
  EXPECT_EQ(header.find("lm_head"), std::string::npos);
  EXPECT_TRUE(temp_leftovers().empty());
}

TEST_F(ModelFormats, HfConv1dWeightsAreTransposed) {
  // Hand-built file (with the "transformer." prefix): HF c_attn.weight[i][o] = 1000 i + o must
  // land at berth's c_attn.weight[o][i]; buffers and an equal lm_head are ignored quietly.
  CheckpointData a = small_model(9);
  const GPTConfig& m = a.model;
  std::vector<HfTensor> ts = hf_tensors(a, "F32", "transformer.");
  for (HfTensor& t : ts) {
    if (t.name != "transformer.h.1.attn.c_attn.weight") continue;
    ASSERT_EQ(t.shape, (std::vector<int64_t>{m.C, 3 * m.C}));
    std::vector<float> v;
    for (int64_t i = 0; i < m.C; i++) {
      for (int64_t o = 0; o < 3 * m.C; o++) v.push_back(float(1000 * i + o));
    }
    t.bytes = encode(v, "F32");
  }
  ts.push_back({"transformer.h.0.attn.bias", "F32", {1, 1, 16, 16}, std::string(4 * 256, '\0')});
  ts.push_back({"lm_head.weight", "F32", ts[0].shape, ts[0].bytes});
  write_config(dir_.string(), m);
  write_safetensors(path("model.safetensors"), ts);
  ::testing::internal::CaptureStderr();
  const CheckpointData b = read_hf_gpt2(dir_.string());
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  const float* w = b.params.data() + gpt_param_layout(m).find("h.1.attn.c_attn.weight").offset;
  for (int64_t o = 0; o < 3 * m.C; o++) {
    for (int64_t i = 0; i < m.C; i++)
      ASSERT_EQ(w[o * m.C + i], float(1000 * i + o)) << o << "," << i;
  }
}

TEST_F(ModelFormats, HfHalfPrecisionInputs) {
  // BF16: values truncated to bf16; F16: random normal f16 values decoded here with ldexp.
  const CheckpointData a = small_model(10, /*bf16_exact=*/true);
  fs::create_directories(path("bf16"));
  write_config(path("bf16"), a.model);
  write_safetensors(path("bf16/model.safetensors"), hf_tensors(a, "BF16"));
  EXPECT_EQ(read_hf_gpt2(path("bf16")).params, a.params);

  CheckpointData h = small_model(11);
  std::mt19937 rng(12);
  for (size_t k = 0; k < size_t(h.model.V) * h.model.C; k++) {  // wte padding rows stay 0
    h.params[k] = float(std::ldexp(double(1024 + rng() % 1024), int(rng() % 8) - 15)) *
                  (rng() % 2 ? -1.0f : 1.0f);
  }
  for (size_t k = size_t(h.model.Vp) * h.model.C; k < h.params.size(); k++) {
    h.params[k] = float(std::ldexp(double(1024 + rng() % 1024), int(rng() % 8) - 15)) *
                  (rng() % 2 ? -1.0f : 1.0f);
  }
  fs::create_directories(path("f16"));
  write_config(path("f16"), h.model);
  write_safetensors(path("f16/model.safetensors"), hf_tensors(h, "F16"));
  EXPECT_EQ(read_hf_gpt2(path("f16")).params, h.params);
}

// The forward pass of an imported model equals (==) the one of the same weights set directly.
void expect_same_forward(const CheckpointData& imported, const std::vector<float>& direct) {
  const GPTConfig& m = imported.model;
  GPT<float> ref(m, 2, 8), imp(m, 2, 8);
  ref.set_params(direct);
  imp.set_params(imported.params);
  PackedBatch batch;
  reset_rows(&batch, 2, 8);
  std::mt19937 rng(13);
  for (int n = 0; n < batch.N(); n++) {
    batch.tokens[size_t(n)] = int32_t(rng() % uint32_t(m.V));
    batch.targets[size_t(n)] = int32_t(rng() % uint32_t(m.V));
  }
  const double loss_ref = ref.forward(batch), loss_imp = imp.forward(batch);
  EXPECT_EQ(loss_imp, loss_ref);
  EXPECT_TRUE(std::isfinite(loss_ref));
  for (int n = 0; n < batch.N(); n++) EXPECT_EQ(imp.losses()[n], ref.losses()[n]) << n;
}

TEST_F(ModelFormats, HfImportedForwardEqualsDirect) {
  const GPTConfig m = make_gpt_config(2, 2, 32, 100, 16);
  GPT<float> init(m, 1, 1);
  init.init_weights(42);
  for (const char* dtype : {"F32", "BF16"}) {
    CheckpointData d;
    d.model = m;
    d.params = init.params_host();
    if (std::string(dtype) == "BF16") {
      for (float& x : d.params) x = std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0xffff0000u);
    }
    const std::string dir = path(dtype);
    fs::create_directories(dir);
    write_config(dir, m);
    write_safetensors(dir + "/model.safetensors", hf_tensors(d, dtype));
    SCOPED_TRACE(dtype);
    expect_same_forward(read_hf_gpt2(dir), d.params);
  }
}

TEST_F(ModelFormats, HfBadInput) {
  const CheckpointData a = small_model(14);
  const GPTConfig& m = a.model;
  write_config(dir_.string(), m);
  const std::string st = path("model.safetensors");
  write_hf_gpt2(path("good"), a);
  const std::string good = read_bytes(path("good/model.safetensors"));
  auto fails_with = [&](const std::string& bytes, const std::vector<std::string>& parts) {
    write_bytes(st, bytes);
    expect_error([&] { read_hf_gpt2(dir_.string()); }, parts);
  };
  // A config.json of a model larger than this machine (4096 layers of 8192): named before the
  // weights are allocated (it was the generic out-of-memory message).
  GPTConfig huge = m;
  huge.L = 4096;
  huge.NH = 64;
  huge.C = 8192;
  write_config(dir_.string(), huge);
  write_bytes(st, good);
  expect_error([&] { read_hf_gpt2(dir_.string()); },
               {"config.json' describes a model of", "n_layer=4096",
                "more than this process may use", "cgroup's limit"});
  write_config(dir_.string(), m);
  // A sharded checkpoint: "model.safetensors does not exist" said nothing of the shards.
  fs::create_directories(path("sharded"));
  write_config(path("sharded"), m);
  write_bytes(path("sharded/model.safetensors.index.json"), "{}");
  expect_error([&] { read_hf_gpt2(path("sharded")); },
               {"holds a sharded checkpoint", "max_shard_size"});
  fails_with(good.substr(0, 5), {"shorter than the 8-byte header length", "truncated"});
  fails_with(good.substr(0, 200), {"header length", "runs past the end of the file"});
  uint64_t n;
  std::memcpy(&n, good.data(), 8);
  std::string half_header = good;  // a length inside the file that cuts the JSON
  const uint64_t half = n / 2;
  std::memcpy(half_header.data(), &half, 8);
  fails_with(half_header, {"not valid JSON"});
  fails_with(good.substr(0, good.size() - 16), {"ln_f.bias", "data_offsets", "truncated"});
  // The header edited: a fractional dimension (it was read as 100), a shape whose element count
  // overflows (it said "needs 0 bytes"), a negative offset (it wrapped to 2^64 - 1).
  auto with_header = [&](const std::string& from, const std::string& to) {
    std::string header = good.substr(8, n);
    const size_t at = header.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    header.replace(at, from.size(), to);
    const uint64_t len = header.size();
    return std::string(reinterpret_cast<const char*>(&len), 8) + header + good.substr(8 + n);
  };
  const std::string wte_shape = "\"shape\":[100,32]";
  fails_with(with_header(wte_shape, "\"shape\":[100.5,32]"),
             {"entry 'wte.weight' is malformed", "shape must hold whole numbers"});
  fails_with(with_header(wte_shape, "\"shape\":[4294967296,4294967296]"),
             {"'wte.weight' has shape [4294967296, 4294967296], more elements than 2^64"});
  fails_with(with_header(wte_shape, "\"shape\":[2147483648,2147483648]"),
             {"'wte.weight' (F32 [2147483648, 2147483648]) needs more than 2^64 bytes"});
  fails_with(with_header("\"data_offsets\":[0,", "\"data_offsets\":[-1,"),
             {"is malformed", "data_offsets must hold whole numbers >= 0"});
  // Offsets that overlap (wpe read from the first tensor's bytes) or leave bytes over: the format
  // says the tensors tile the data.
  const std::string header = good.substr(8, n);
  const size_t wpe_at = header.find("\"data_offsets\":[", header.find("\"wpe.weight\"")) + 16;
  const std::string wpe_offsets =
      "\"data_offsets\":[" + header.substr(wpe_at, header.find(']', wpe_at) - wpe_at) + "]";
  fails_with(with_header(wpe_offsets, "\"data_offsets\":[0,2048]"),
             {"starts at data byte 0, inside the tensor before it", "overlap in the data"});
  fails_with(good + "tail", {"4 bytes follow the last tensor's data", "corrupt"});

  write_safetensors(st, without(hf_tensors(a, "F32"), "h.1.mlp.c_fc.weight"));
  expect_error([&] { read_hf_gpt2(st); }, {"'h.1.mlp.c_fc.weight' is missing", "transformer."});
  std::vector<HfTensor> wrong = hf_tensors(a, "F32");
  for (HfTensor& t : wrong) {
    if (t.name == "h.0.attn.c_attn.weight") t.shape = {3 * m.C, m.C};  // berth orientation
  }
  write_safetensors(st, wrong);
  expect_error([&] { read_hf_gpt2(st); },
               {"'h.0.attn.c_attn.weight' has shape [96, 32], expected [32, 96]", "disagree"});
  std::vector<HfTensor> f64 = hf_tensors(a, "F32");
  f64[2].dtype = "F64";  // h.0.ln_1.weight as 32 doubles
  f64[2].bytes = std::string(8 * size_t(m.C), '\0');
  write_safetensors(st, f64);
  expect_error([&] { read_hf_gpt2(st); }, {"dtype F64", "F32, F16 and BF16"});
  std::vector<HfTensor> extra = hf_tensors(a, "F32");
  extra.push_back({"h.2.ln_1.weight", "F32", {m.C}, std::string(4 * size_t(m.C), '\0')});
  write_safetensors(st, extra);
  expect_error([&] { read_hf_gpt2(st); }, {"h.2.ln_1.weight", "n_layer=2"});
  // Both spellings of a tensor: one was read and the other dropped as "not part of GPT-2".
  std::vector<HfTensor> twice = hf_tensors(a, "F32");
  for (const HfTensor& t : hf_tensors(a, "F32"))
    if (t.name == "wpe.weight")
      twice.push_back({"transformer.wpe.weight", t.dtype, t.shape, t.bytes});
  write_safetensors(st, twice);
  expect_error([&] { read_hf_gpt2(st); },
               {"holds both 'wpe.weight' and 'transformer.wpe.weight'", "keep one"});

  write_safetensors(st, hf_tensors(a, "F32"));
  write_bytes(path("config.json"),
              "{\"n_layer\": 2, \"n_embd\": 32, \"vocab_size\": 100, "
              "\"n_positions\": 16}");
  expect_error([&] { read_hf_gpt2(st); }, {"no integer 'n_head'"});
  fs::remove(path("config.json"));
  expect_error([&] { read_hf_gpt2(st); }, {"config.json", "not found"});
}

TEST_F(ModelFormats, HfWarnings) {
  CheckpointData a = small_model(15);
  a.params[size_t(gpt_param_layout(a.model).find("wpe").offset + 7)] =
      std::numeric_limits<float>::infinity();
  std::vector<HfTensor> ts = hf_tensors(a, "F32");
  HfTensor head = ts[0];
  head.name = "lm_head.weight";
  head.bytes[0] ^= 1;
  ts.push_back(head);
  write_config(dir_.string(), a.model);
  std::string config = read_bytes(path("config.json"));
  config.insert(config.size() - 1,
                ", \"layer_norm_epsilon\": 1e-6, \"scale_attn_weights\": false, "
                "\"scale_attn_by_inverse_layer_idx\": true, \"n_inner\": null");
  write_bytes(path("config.json"), config);
  write_safetensors(path("model.safetensors"), ts);
  ::testing::internal::CaptureStderr();
  read_hf_gpt2(dir_.string());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("layer_norm_epsilon is 1e-06; berth's LayerNorm uses 1e-5"), std::string::npos)
      << err;
  EXPECT_NE(err.find("lm_head.weight differs from wte.weight"), std::string::npos) << err;
  EXPECT_NE(err.find("tensor wpe holds 1 NaN/Inf"), std::string::npos) << err;
  for (const char* key : {"scale_attn_weights is false", "scale_attn_by_inverse_layer_idx is true"})
    EXPECT_NE(err.find(key + std::string("; berth's GPT-2 scales attention scores")),
              std::string::npos)
        << key << ": " << err;
  // An MLP of another width is refused by name (n_inner null: 4 × n_embd, as berth's).
  write_config(dir_.string(), a.model);
  config = read_bytes(path("config.json"));
  config.insert(config.size() - 1, ", \"n_inner\": 48");
  write_bytes(path("config.json"), config);
  expect_error([&] { read_hf_gpt2(dir_.string()); },
               {"n_inner is 48; berth's GPT-2 MLP is 4 × n_embd = 128 wide"});
}

// ---- nothing half-written -----------------------------------------------------------------------

TEST_F(ModelFormats, FailedWritesLeaveNothing) {
  CheckpointData bad = small_model(16);
  bad.params.pop_back();
  expect_error([&] { write_llmc_model(path("x.bin"), bad); }, {"inconsistent"});
  expect_error([&] { write_hf_gpt2(path("x_hf"), bad); }, {"inconsistent"});
  EXPECT_FALSE(fs::exists(path("x.bin")));
  EXPECT_FALSE(fs::exists(path("x_hf")));

  const CheckpointData a = small_model(17);
  fs::create_directories(path("busy.bin/inside"));  // rename onto a non-empty directory fails
  expect_error([&] { write_llmc_model(path("busy.bin"), a); }, {"busy.bin"});
  EXPECT_TRUE(fs::is_directory(path("busy.bin/inside")));
  expect_error([&] { write_hf_gpt2(path("no/such/parent/hf"), a); }, {"cannot create"});
  EXPECT_FALSE(fs::exists(path("no")));
  fs::create_directories(path("hf/model.safetensors/inside"));  // existing dir, blocked file
  expect_error([&] { write_hf_gpt2(path("hf"), a); }, {"model.safetensors"});
  EXPECT_FALSE(fs::exists(path("hf/config.json")));
  EXPECT_TRUE(temp_leftovers().empty()) << temp_leftovers().front();
}

// Into an existing directory an export replaces only an earlier GPT-2 export's files, and checks
// both before it writes either: a project's config.json, another file named model.safetensors
// or a directory in the way is refused with everything as it was (a config.json directory used
// to fail after model.safetensors had been replaced).
TEST_F(ModelFormats, HfExportIntoADirectoryReplacesOnlyAnEarlierExport) {
  const CheckpointData a = small_model(21), b = small_model(22);
  write_hf_gpt2(path("again"), a);
  write_hf_gpt2(path("again"), b);  // a re-export
  EXPECT_EQ(read_hf_gpt2(path("again")).params, b.params);

  fs::create_directories(path("project"));
  const std::string settings = "{\"my\": \"project settings\"}";
  std::ofstream(path("project/config.json")) << settings;
  expect_error([&] { write_hf_gpt2(path("project"), a); },
               {"project/config.json' exists and it is not the config.json of a GPT-2 model",
                "export into a new directory, or remove it first"});
  EXPECT_EQ(read_bytes(path("project/config.json")), settings);
  EXPECT_FALSE(fs::exists(path("project/model.safetensors")));

  write_hf_gpt2(path("other"), a);
  std::ofstream(path("other/model.safetensors"), std::ios::trunc) << "not safetensors";
  expect_error([&] { write_hf_gpt2(path("other"), b); },
               {"model.safetensors' exists and it is not a safetensors file"});
  EXPECT_EQ(read_bytes(path("other/model.safetensors")), "not safetensors");

  write_hf_gpt2(path("blocked"), a);
  const std::string before = read_bytes(path("blocked/model.safetensors"));
  fs::remove(path("blocked/config.json"));
  fs::create_directories(path("blocked/config.json"));
  expect_error([&] { write_hf_gpt2(path("blocked"), b); },
               {"config.json' exists and it is not a regular file"});
  EXPECT_EQ(read_bytes(path("blocked/model.safetensors")), before);
  EXPECT_TRUE(temp_leftovers().empty()) << temp_leftovers().front();
}

}  // namespace
}  // namespace berth
