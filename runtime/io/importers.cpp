// Importers into berth token datasets: byte-level text files and llm.c token files.
#include "runtime/io/importers.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "runtime/core/check.h"
#include "runtime/core/fs.h"

namespace berth {
namespace {

constexpr int64_t kGpt2Eot = 50256;
constexpr int64_t kGpt2Vocab = 50257;
constexpr int32_t kLlmcModelMagic = 20240326;  // llm.c model files, a common mix-up
constexpr size_t kLlmcHeaderInts = 256;
constexpr size_t kLlmcHeaderBytes = kLlmcHeaderInts * sizeof(int32_t);

// Fails with a message naming `path` when it is missing or not a regular file.
void require_regular_file(const std::string& path, const char* what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) BERTH_FAIL("{} '{}' does not exist; check the path", what, path);
  if (!fs::is_regular_file(st)) BERTH_FAIL("{} '{}' is not a regular file", what, path);
}

std::string read_binary_file(const std::string& path, const char* what) {
  require_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) BERTH_FAIL("cannot read {} '{}': {}", what, path, std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) BERTH_FAIL("reading {} '{}' failed: {}", what, path, std::strerror(errno));
  return bytes;
}

int32_t load_le_i32(const unsigned char* p) {
  const uint32_t u = uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                     (uint32_t{p[3]} << 24);
  return static_cast<int32_t>(u);
}

void store_le_i32(unsigned char* p, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(u >> (8 * i));
}

// Copies documents [first_doc, last_doc) of `all` into `out`, offsets re-based to 0.
void copy_docs(const TokenDataset& all, int64_t first_doc, int64_t last_doc, TokenDataset* out) {
  const uint64_t begin = all.doc_offsets[static_cast<size_t>(first_doc)];
  const uint64_t end = all.doc_offsets[static_cast<size_t>(last_doc)];
  out->tokens.assign(all.tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                     all.tokens.begin() + static_cast<std::ptrdiff_t>(end));
  out->doc_offsets.clear();
  for (int64_t d = first_doc; d <= last_doc; ++d) {
    out->doc_offsets.push_back(all.doc_offsets[static_cast<size_t>(d)] - begin);
  }
  if (all.loss_mask.empty()) {
    out->loss_mask.clear();
  } else {
    out->loss_mask.assign(all.loss_mask.begin() + static_cast<std::ptrdiff_t>(begin),
                          all.loss_mask.begin() + static_cast<std::ptrdiff_t>(end));
  }
  out->vocab_size = all.vocab_size;
  out->eot_token = all.eot_token;
  out->tokenizer = all.tokenizer;
}

}  // namespace

// ---- byte-level text ----------------------------------------------------------------------------

TokenDataset import_text_files(const std::vector<std::string>& files) {
  TokenDataset ds;
  ds.vocab_size = kByteVocab;
  ds.eot_token = kByteEot;
  ds.tokenizer = "bytes";
  ds.doc_offsets.push_back(0);
  for (const std::string& path : files) {
    const std::string bytes = read_binary_file(path, "text file");
    if (bytes.empty()) continue;
    ds.tokens.reserve(ds.tokens.size() + bytes.size() + 1);
    for (char c : bytes) ds.tokens.push_back(static_cast<unsigned char>(c));
    ds.tokens.push_back(static_cast<uint32_t>(kByteEot));
    ds.doc_offsets.push_back(ds.tokens.size());
  }
  return ds;
}

void split_validation(const TokenDataset& all, double val_fraction, TokenDataset* train,
                      TokenDataset* val) {
  BERTH_CHECK(train != nullptr && val != nullptr && train != val,
              "split_validation needs two distinct output datasets");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    BERTH_FAIL("validation fraction {} must be in [0, 1)", val_fraction);
  }
  BERTH_CHECK(!all.doc_offsets.empty(), "split_validation: dataset has no doc_offsets");
  const int64_t n_docs = all.n_docs();
  int64_t n_val = 0;
  if (val_fraction > 0.0 && n_docs > 0) {
    n_val = std::llround(val_fraction * static_cast<double>(n_docs));
    if (n_docs >= 2) n_val = std::max<int64_t>(n_val, 1);
    n_val = std::min(n_val, n_docs - 1);  // the training set never ends up empty
  }
  // Build into locals first: `all` may alias *train or *val.
  TokenDataset t, v;
  copy_docs(all, 0, n_docs - n_val, &t);
  copy_docs(all, n_docs - n_val, n_docs, &v);
  *train = std::move(t);
  *val = std::move(v);
}

// ---- llm.c token files --------------------------------------------------------------------------

TokenDataset import_llmc_tokens(const std::string& path) {
  const std::string bytes = read_binary_file(path, "llm.c token file");
  if (bytes.size() < kLlmcHeaderBytes) {
    BERTH_FAIL("'{}' is {} bytes, shorter than the {}-byte header of an llm.c token file "
               "(truncated header)",
               path, bytes.size(), kLlmcHeaderBytes);
  }
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const int32_t magic = load_le_i32(p);
  const int32_t version = load_le_i32(p + 4);
  const int32_t count = load_le_i32(p + 8);
  if (magic != kLlmcTokenMagic) {
    if (magic == kLlmcModelMagic) {
      BERTH_FAIL("'{}' has magic {}, expected {} (an llm.c token .bin file); it is an llm.c model "
                 "file (weights), not tokens: give `berth data import --format llmc` a token file "
                 "such as fineweb_train_000001.bin",
                 path, magic, kLlmcTokenMagic);
    }
    BERTH_FAIL("'{}' has magic {}, expected {} (an llm.c token .bin file); is this a model file?",
               path, magic, kLlmcTokenMagic);
  }
  if (version != kLlmcTokenVersion) {
    BERTH_FAIL("'{}' is an llm.c token file version {}, this build reads version {}", path,
               version, kLlmcTokenVersion);
  }
  if (count < 0) BERTH_FAIL("'{}': llm.c header has a negative token count {}", path, count);
  const uint64_t expected = kLlmcHeaderBytes + uint64_t{2} * static_cast<uint64_t>(count);
  if (bytes.size() != expected) {
    BERTH_FAIL(
        "'{}': header says {} tokens ({} bytes with the header) but the file has {} bytes "
        "({})",
        path, count, expected, bytes.size(),
        bytes.size() < expected ? "truncated, or not an llm.c token file"
                                : "data past the last token: the header disagrees with it");
  }

  TokenDataset ds;
  ds.vocab_size = kGpt2Vocab;
  ds.eot_token = kGpt2Eot;
  ds.tokenizer = "gpt2";
  ds.tokens.resize(static_cast<size_t>(count));
  const unsigned char* q = p + kLlmcHeaderBytes;
  for (size_t i = 0; i < ds.tokens.size(); ++i) {
    const uint32_t t = uint32_t{q[2 * i]} | (uint32_t{q[2 * i + 1]} << 8);
    if (t >= kGpt2Vocab) {
      BERTH_FAIL("'{}': token {} at index {} is >= the GPT-2 vocab size {}", path, t, i,
                 kGpt2Vocab);
    }
    ds.tokens[i] = t;
  }
  // A document starts at every EOT; tokens before the first EOT form document 0.
  ds.doc_offsets.push_back(0);
  for (size_t i = 1; i < ds.tokens.size(); ++i) {
    if (ds.tokens[i] == kGpt2Eot) ds.doc_offsets.push_back(i);
  }
  if (!ds.tokens.empty()) ds.doc_offsets.push_back(ds.tokens.size());
  return ds;
}

void write_llmc_tokens(const std::string& path, const std::vector<uint32_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    BERTH_FAIL("'{}': {} tokens do not fit an llm.c token file header (int32 count); split the "
               "data into shards",
               path, tokens.size());
  }
  std::string bytes(kLlmcHeaderBytes + 2 * tokens.size(), '\0');
  auto* p = reinterpret_cast<unsigned char*>(bytes.data());
  store_le_i32(p, kLlmcTokenMagic);
  store_le_i32(p + 4, kLlmcTokenVersion);
  store_le_i32(p + 8, static_cast<int32_t>(tokens.size()));
  unsigned char* q = p + kLlmcHeaderBytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] > 65535) {
      BERTH_FAIL("'{}': token {} at index {} does not fit uint16 (llm.c token files store "
                 "uint16)",
                 path, tokens[i], i);
    }
    q[2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
    q[2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
  }
  write_file_atomic(path, bytes);
}

}  // namespace berth
