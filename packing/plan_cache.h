// Packing plans as files, so a large dataset is packed once and reused across runs.
//
// File layout (HDF5, format "berth-pack-plan", format_version 1):
//   /row_offsets    int64, rows + 1 entries into the pieces (starts at 0, non-decreasing)
//   /piece_doc      int64, one per piece: document index
//   /piece_start    int64, one per piece: first token, relative to the document
//   /piece_length   int64, one per piece
//   attributes on the root group: format, format_version, key (string, see plan_key), seq_len,
//   algorithm (string, e.g. "bfd"), window, seed (uint64), long_docs ("split"/"drop"), alpha,
//   beta (float64)
// Writers write a temporary and rename it into place (never a half-written plan).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "packing/packers.h"

namespace berth {

constexpr const char* kPlanFormatName = "berth-pack-plan";
constexpr int64_t kPlanFormatVersion = 1;

// 16 hex digits of a 64-bit FNV-1a over the plan format version, every PackOptions field and the
// document offsets: a plan built for other data or other options has another key.
std::string plan_key(const std::vector<uint64_t>& doc_offsets, const PackOptions& options);

// Throws Error unless a plan may be written at `path`: nothing is there, a packing plan (of any
// version), or an unreadable file named like a default plan (<data>.plan-….h5: a broken cache).
// Any other file (a token dataset named by mistake, another HDF5 file, a text file, a directory)
// is the user's and is never replaced.
void require_plan_destination(const std::string& path);

// Writes `plan` with `key` atomically (temporary + rename). Throws Error on failure, and where
// require_plan_destination(path) does.
void write_plan(const std::string& path, const PackPlan& plan, const std::string& key);

// Reads a plan and (when key != nullptr) its key. Missing file, not HDF5 / corrupt, wrong format
// name or version, inconsistent datasets -> Error naming the path and what to do.
PackPlan read_plan(const std::string& path, std::string* key);
// Only its options and key (attributes: a plan's pieces can be hundreds of megabytes), with
// read_plan's checks of the format.
PackOptions read_plan_header(const std::string& path, std::string* key);
// Why a plan whose key is not `key` (of `doc_offsets` and `options`) is stale, for a message:
// "built with seed 1337, expected 42; window 1000, expected 500" (the options that differ) or,
// with the same options, "built for other documents: the dataset changed".
std::string stale_plan_reason(const PackPlan& plan, const PackOptions& options);

// The `berth pack` command line that packs `data` with `options` into `out` (for messages).
std::string pack_command(const std::string& data, const PackOptions& options,
                         const std::string& out);

// Document lengths from dataset offsets (doc i = offsets[i+1] - offsets[i]).
std::vector<int64_t> doc_lengths_from_offsets(const std::vector<uint64_t>& doc_offsets);

// Reuses the plan at `cache_path` when its key equals plan_key(doc_offsets, options) (*reused =
// true) and its pieces match the documents (plan_mismatch); otherwise (absent, stale,
// unreadable, damaged) packs, writes the plan there and sets *reused =
// false. `reused` may be null. A file at `cache_path` that is not a packing plan is refused
// (require_plan_destination), never rebuilt over.
PackPlan load_or_build_plan(const std::string& cache_path, const std::vector<uint64_t>& doc_offsets,
                            const PackOptions& options, bool* reused);

}  // namespace berth
