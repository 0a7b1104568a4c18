// Token datasets on disk (HDF5) and in memory.
//
// File layout (format "berth-tokens", format_version 1):
//   /tokens        uint16 (vocab_size <= 65536) or uint32, 1-D: all documents concatenated
//   /doc_offsets   uint64, n_docs + 1 entries, doc i is tokens[doc_offsets[i], doc_offsets[i+1])
//   /loss_mask     optional uint8, one per token (1 = train on this token's prediction)
//   attributes on the root group: format (string "berth-tokens"), format_version (int64 1),
//   vocab_size (int64), eot_token (int64, -1 when none), tokenizer (string, e.g. "bytes", "gpt2")
//
// Readers check every one of these and say which is wrong; writers write to a temporary file and
// rename it into place, so a failed import never leaves a half-written dataset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace berth {

struct TokenDataset {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> doc_offsets;  // n_docs + 1, starts at 0, ends at tokens.size()
  std::vector<uint8_t> loss_mask;     // empty or tokens.size()
  int64_t vocab_size = 0;
  int64_t eot_token = -1;
  std::string tokenizer;

  int64_t n_docs() const { return doc_offsets.empty() ? 0 : int64_t(doc_offsets.size()) - 1; }
  int64_t n_tokens() const { return int64_t(tokens.size()); }
};

constexpr const char* kTokenFormatName = "berth-tokens";
constexpr int64_t kTokenFormatVersion = 1;

// Checks the in-memory invariants (offsets monotone and in range, every token < vocab_size,
// mask length); throws Error naming `what` (usually the file) and the first offending index.
void validate_dataset(const TokenDataset& ds, const std::string& what);

// Throws Error unless `path` may receive a token dataset: absent, or a token dataset already
// (`what`: the option naming it, e.g. "--out"). Anything else there stays the user's.
void require_dataset_destination(const std::string& path, const char* what);

// Writes atomically (temporary + rename). Validates first.
void write_token_dataset(const std::string& path, const TokenDataset& ds);

// Reads and validates. Missing file, not HDF5, wrong format name/version, missing datasets,
// token >= vocab_size, ... -> Error naming the path and what to do.
TokenDataset read_token_dataset(const std::string& path);

// The header and sizes of a dataset file, without reading its tokens (the same checks of the
// format as read_token_dataset, not of the contents).
struct TokenDatasetShape {
  int64_t n_tokens = 0, n_docs = 0, vocab_size = 0;
  bool has_loss_mask = false;
  // Bytes the trainer holds for it in memory: uint32 tokens, uint64 offsets, the mask.
  double memory_bytes() const {
    return 4.0 * double(n_tokens) + 8.0 * double(n_docs + 1) + (has_loss_mask ? double(n_tokens) : 0);
  }
};
TokenDatasetShape read_token_dataset_shape(const std::string& path);
// The document offsets alone (what a packing plan's key hashes), checked as read_token_dataset
// checks them.
std::vector<uint64_t> read_token_dataset_offsets(const std::string& path);

// "N tokens in M documents, <16 hex digits>": what a checkpoint records of the data it trained
// on, so that a resume on other data at the same path is noticed. The hash (FNV-1a) covers the
// vocabulary size, every document offset, whether a loss mask is present and up to 2^20 tokens
// evenly spaced over the data (first and last included); a change that touches none of those is
// missed, and a billion-token dataset costs the offsets' pass and 4 MiB of tokens.
std::string dataset_fingerprint(const TokenDataset& ds);

// Summary statistics for `berth data info`.
struct DatasetInfo {
  int64_t n_docs = 0;
  int64_t n_tokens = 0;
  int64_t vocab_size = 0;
  int64_t eot_token = -1;
  std::string tokenizer;
  int64_t min_len = 0, max_len = 0;
  double mean_len = 0.0;
  int64_t p50_len = 0, p90_len = 0, p99_len = 0;
  int64_t distinct_tokens = 0;
  bool has_loss_mask = false;
};
DatasetInfo dataset_info(const TokenDataset& ds);
std::string format_dataset_info(const std::string& path, const DatasetInfo& info);

}  // namespace berth
