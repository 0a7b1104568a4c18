#include "runtime/train/packed_loader.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "packing/plan_cache.h"
#include "runtime/core/check.h"
#include "runtime/io/token_dataset.h"

namespace berth {

std::vector<int64_t> document_lengths(const TokenDataset& ds) {
  std::vector<int64_t> lengths(size_t(ds.n_docs()));
  for (int64_t d = 0; d < ds.n_docs(); d++) {
    lengths[size_t(d)] = int64_t(ds.doc_offsets[size_t(d) + 1] - ds.doc_offsets[size_t(d)]);
  }
  return lengths;
}

void fill_packed_rows(const TokenDataset& ds, const PackPlan& plan,
                      const std::vector<int64_t>& rows, int T, PackedBatch* b) {
  const int B = int(rows.size());
  if (b->B != B || b->T != T) reset_rows(b, B, T);
  b->cu_seqlens.clear();
  b->max_seqlen = 0;
  b->n_padding = 0;
  const int32_t pad_token = ds.eot_token >= 0 ? int32_t(ds.eot_token) : 0;
  const bool masked = !ds.loss_mask.empty();
  const int64_t align = plan.options.align;
  for (int r = 0; r < B; r++) {
    const int64_t row = rows[size_t(r)];
    BERTH_CHECK(row >= 0 && row < plan.n_rows(), "plan row {} outside [0, {})", row, plan.n_rows());
    const int base = r * T;
    int pos = 0;
    for (int64_t p = plan.row_offsets[size_t(row)]; p < plan.row_offsets[size_t(row) + 1]; p++) {
      const Piece& piece = plan.pieces[size_t(p)];
      const int64_t slots = (piece.length + align - 1) / align * align;  // padded to align
      BERTH_CHECK(piece.doc >= 0 && piece.doc < ds.n_docs() && piece.length > 0 &&
                      pos + slots <= T,
                  "packing plan does not fit this dataset (piece doc {} start {} length {}); the "
                  "plan is stale: delete it to rebuild",
                  piece.doc, piece.start, piece.length);
      const uint64_t doc_begin = ds.doc_offsets[size_t(piece.doc)];
      const uint64_t doc_end = ds.doc_offsets[size_t(piece.doc) + 1];
      BERTH_CHECK(doc_begin + uint64_t(piece.start + piece.length) <= doc_end,
                  "packing plan piece runs past document {}; the plan is stale: delete it to "
                  "rebuild",
                  piece.doc);
      b->cu_seqlens.push_back(base + pos);
      b->max_seqlen = std::max<int32_t>(b->max_seqlen, int32_t(piece.length));
      // A document's last token predicts the EOT that follows it, where one does and the document
      // does not end with its own (llm.c files put EOT before each document, so it opens the next
      // one): without it the model never learns where a document ends. Text imports end each
      // document with its own EOT.
      const auto is_eot = [&](uint64_t at) { return int64_t(ds.tokens[at]) == ds.eot_token; };
      const uint64_t last =
          ds.eot_token >= 0 && doc_end < ds.tokens.size() && is_eot(doc_end) && !is_eot(doc_end - 1)
              ? doc_end + 1
              : doc_end;
      for (int64_t j = 0; j < piece.length; j++) {
        const uint64_t at = doc_begin + uint64_t(piece.start + j);
        const size_t i = size_t(base + pos + j);
        b->tokens[i] = int32_t(ds.tokens[at]);
        b->positions[i] = int32_t(j);
        int32_t target = at + 1 < last ? int32_t(ds.tokens[at + 1]) : -1;
        if (target >= 0 && masked && ds.loss_mask[at + 1] == 0) target = -1;
        b->targets[i] = target;
      }
      // Padding to the alignment belongs to the piece's sequence: after its tokens (so causal
      // attention keeps the real tokens from seeing it), positions continuing, no targets.
      for (int64_t j = piece.length; j < slots; j++) {
        const size_t i = size_t(base + pos + j);
        b->tokens[i] = pad_token;
        b->positions[i] = int32_t(j);
        b->targets[i] = -1;
      }
      b->max_seqlen = std::max<int32_t>(b->max_seqlen, int32_t(slots));
      b->n_padding += slots - piece.length;
      pos += int(slots);
    }
    if (pos < T) {  // padding: one sequence of its own that predicts nothing
      b->n_padding += T - pos;
      b->cu_seqlens.push_back(base + pos);
      b->max_seqlen = std::max(b->max_seqlen, int32_t(T - pos));
      for (int j = 0; pos + j < T; j++) {
        const size_t i = size_t(base + pos + j);
        b->tokens[i] = pad_token;
        b->positions[i] = j;
        b->targets[i] = -1;
      }
    }
  }
  b->cu_seqlens.push_back(B * T);
}

PackedLoader::PackedLoader(const TokenDataset* ds, PackPlan plan, int B, int T, bool shuffle,
                           uint64_t seed, StreamLoader::Shard shard)
    : ds_(ds), plan_(std::move(plan)), B_(B), T_(T), shuffle_(shuffle), seed_(seed), shard_(shard) {
  BERTH_CHECK(plan_.n_rows() > 0 || plan_.options.long_docs != LongDocs::DROP,
              "the packing plan has no rows: every document of the dataset is longer than "
              "data.seq_len ({}) and data.long_docs = \"drop\" drops them; use \"split\" or a "
              "larger seq_len",
              T);
  BERTH_CHECK(plan_.n_rows() > 0,
              "the packing plan has no rows: the dataset has no tokens to train on");
  BERTH_CHECK(plan_.options.seq_len == T, "packing plan is for seq_len {}, the run uses {}",
              plan_.options.seq_len, T);
  BERTH_CHECK(shard.count > 0 && shard.index >= 0 && shard.index < shard.count,
              "loader shard {} of {} is invalid", shard.index, shard.count);
  row_ids_.resize(size_t(B));
}

int64_t PackedLoader::row_of(int64_t global_row) const {
  const int64_t n = plan_.n_rows();
  const int64_t in_epoch = global_row % n;
  if (!shuffle_) return in_epoch;
  const int64_t epoch = global_row / n;
  if (perm_epoch_ != epoch) {
    perm_.resize(size_t(n));
    std::iota(perm_.begin(), perm_.end(), int64_t(0));
    std::mt19937_64 gen(seed_ * 0x9E3779B97F4A7C15ull + uint64_t(epoch) + 1);
    for (int64_t i = n - 1; i > 0; i--) {
      std::swap(perm_[size_t(i)], perm_[size_t(gen() % uint64_t(i + 1))]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[size_t(in_epoch)];
}

void PackedLoader::next(PackedBatch* batch) {
  for (int r = 0; r < B_; r++) row_ids_[size_t(r)] = row_of(rows_ + int64_t(shard_.index) * B_ + r);
  fill_packed_rows(*ds_, plan_, row_ids_, T_, batch);
  rows_ += int64_t(shard_.count) * B_;
}

PackOptions pack_options(const RunConfig& cfg, int cp) {
  PackOptions o;
  o.seq_len = cfg.data.seq_len;
  o.algorithm = cfg.data.mode == "padded" ? PackAlgorithm::PADDED
                                           : parse_pack_algorithm(cfg.data.pack_algorithm);
  o.window = cfg.data.pack_window;
  o.long_docs = cfg.data.long_docs == "drop" ? LongDocs::DROP : LongDocs::SPLIT;
  o.seed = uint64_t(cfg.run.seed);
  // Under context parallelism every document takes a multiple of 2·cp slots, so the zigzag split
  // of each row is exact (docs/parallelism.md).
  o.align = cfg.data.pack_align > 0 ? cfg.data.pack_align : (cp > 1 ? 2 * int64_t(cp) : 1);
  return o;
}

PackOptions eval_pack_options(const RunConfig& cfg, int cp) {
  PackOptions o = pack_options(cfg, cp);
  o.seed = kEvalPackSeed;
  return o;
}

std::string packed_plan_path(const RunConfig& cfg, const std::string& data_path,
                             const PackOptions& o, bool eval) {
  if (!eval && data_path == cfg.data.train && !cfg.data.pack_plan.empty()) {
    return cfg.data.pack_plan;
  }
  return fmt::format("{}.plan-{}-T{}{}{}.h5", data_path, pack_algorithm_name(o.algorithm),
                     o.seq_len, o.align > 1 ? fmt::format("-a{}", o.align) : std::string(),
                     eval ? "-eval" : "");
}

void require_named_plan_is_this_runs(const RunConfig& cfg, const PackOptions& o,
                                     const std::vector<uint64_t>* doc_offsets) {
  const std::string& path = cfg.data.pack_plan;
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return;
  std::string key;
  PackPlan theirs;
  try {
    theirs.options = read_plan_header(path, &key);
  } catch (const Error&) {
    return;
  }
  // Switching between cp 1 and 2 (the automatic alignment) rewrote the named plan each time, and
  // runs of two option sets raced on it.
  // The dataset's offsets are read only now, where a named plan is there to compare.
  const std::vector<uint64_t> read =
      doc_offsets != nullptr ? std::vector<uint64_t>{} : read_token_dataset_offsets(cfg.data.train);
  BERTH_CHECK(key == plan_key(doc_offsets != nullptr ? *doc_offsets : read, o),
              "data.pack_plan '{}' is a plan {}: berth rebuilds only its automatic plans "
              "(data.pack_plan = \"\": one file per option set beside the data). Pack it again "
              "for this run with `{}`, or point data.pack_plan elsewhere",
              path, stale_plan_reason(theirs, o), pack_command(cfg.data.train, o, path));
}

}  // namespace berth
