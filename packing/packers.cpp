// Packing plans (pure; no I/O); see packers.h for the algorithms.
//
// Every step is deterministic: the document order is a seeded Fisher–Yates shuffle written out
// here (std::shuffle and the std distributions differ between standard libraries), sorts are
// stable, and best-fit ties go to the lowest row number.
#include "packing/packers.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <tuple>
#include <utility>

#include "runtime/core/check.h"

namespace berth {
namespace {

// ---- pieces -------------------------------------------------------------------------------------

// Seeded document order: Fisher–Yates with gen() % (i+1) (the tiny modulo bias is irrelevant here
// and keeps the order identical on every platform).
std::vector<int64_t> seeded_order(int64_t n, uint64_t seed) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::mt19937_64 gen(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(gen() % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

// Pieces in the seeded document order; a long document becomes consecutive T-token chunks (SPLIT)
// or nothing (DROP); empty documents produce nothing.
std::vector<Piece> make_pieces(const std::vector<int64_t>& lengths, const PackOptions& o) {
  const int64_t T = o.seq_len;
  std::vector<Piece> pieces;
  pieces.reserve(lengths.size());
  for (const int64_t doc : seeded_order(int64_t(lengths.size()), o.seed)) {
    const int64_t len = lengths[static_cast<size_t>(doc)];
    BERTH_CHECK(len >= 0, "document {} has negative length {}", doc, len);
    if (len == 0) continue;
    if (len > T && o.long_docs == LongDocs::DROP) continue;
    for (int64_t start = 0; start < len; start += T) {
      pieces.push_back(Piece{doc, start, std::min(T, len - start)});
    }
  }
  return pieces;
}

void append_row(PackPlan* plan, const std::vector<Piece>& row) {
  plan->pieces.insert(plan->pieces.end(), row.begin(), row.end());
  plan->row_offsets.push_back(int64_t(plan->pieces.size()));
}

// ---- algorithms ---------------------------------------------------------------------------------

void pack_padded(const std::vector<Piece>& pieces, PackPlan* plan) {
  for (const Piece& p : pieces) {
    plan->pieces.push_back(p);
    plan->row_offsets.push_back(int64_t(plan->pieces.size()));
  }
}

void pack_next_fit(const std::vector<Piece>& pieces, int64_t T, PackPlan* plan) {
  std::vector<Piece> row;
  int64_t used = 0;
  for (const Piece& p : pieces) {
    if (used + p.length > T) {
      append_row(plan, row);
      row.clear();
      used = 0;
    }
    row.push_back(p);
    used += p.length;
  }
  if (!row.empty()) append_row(plan, row);
}

// Best-fit decreasing over windows. Rows open inside a window live in an ordered set keyed on
// (token room, row number): lower_bound finds the fullest row that still fits in O(log rows), and
// equal rooms resolve to the lowest row number.
//
// BALANCED (cost c(L) = α·L + β·L², capacity c(T)): with α, β >= 0 the cost is superadditive, so
// any row within T tokens is within the cost capacity and the token room is the binding limit.
// The cost decides between the rows that fit: among the first kBalancedCandidates rows from
// lower_bound (the tightest token fits), the piece goes to the row with the most cost room left
// (ties: the tightest in tokens), so heavy rows stop attracting more work.
constexpr int kBalancedCandidates = 64;

void pack_best_fit(const std::vector<Piece>& pieces, const PackOptions& o, bool balanced,
                   PackPlan* plan) {
  const int64_t T = o.seq_len;
  auto cost = [&](int64_t len) {
    const double l = double(len);
    return o.alpha * l + o.beta * l * l;
  };

  std::vector<size_t> idx;
  std::vector<std::vector<Piece>> rows;
  std::vector<int64_t> row_room;
  std::vector<double> row_cost_room;
  std::set<std::pair<int64_t, int64_t>> open;  // (token room, row)
  const size_t window = static_cast<size_t>(o.window);

  for (size_t begin = 0; begin < pieces.size(); begin += window) {
    const size_t end = std::min(pieces.size(), begin + window);
    idx.resize(end - begin);
    std::iota(idx.begin(), idx.end(), begin);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      return pieces[a].length > pieces[b].length;
    });
    rows.clear();
    row_room.clear();
    row_cost_room.clear();
    open.clear();
    for (const size_t i : idx) {
      const Piece& p = pieces[i];
      auto it = open.lower_bound({p.length, int64_t{-1}});
      if (balanced && it != open.end()) {
        auto best = it;
        int scanned = 0;
        for (; it != open.end() && scanned < kBalancedCandidates; ++it, ++scanned) {
          if (row_cost_room[size_t(it->second)] > row_cost_room[size_t(best->second)]) best = it;
        }
        it = best;
      }
      int64_t target;
      if (it == open.end()) {
        target = int64_t(rows.size());
        rows.emplace_back();
        row_room.push_back(T);
        row_cost_room.push_back(cost(T));
      } else {
        target = it->second;
        open.erase(it);
      }
      const auto r = size_t(target);
      rows[r].push_back(p);
      row_room[r] -= p.length;
      row_cost_room[r] -= cost(p.length);
      if (row_room[r] > 0) open.insert({row_room[r], target});
    }
    for (const auto& row : rows) append_row(plan, row);
  }
}

}  // namespace

// ---- public API ---------------------------------------------------------------------------------

PackAlgorithm parse_pack_algorithm(const std::string& name) {
  if (name == "bfd") return PackAlgorithm::BFD;
  if (name == "next_fit") return PackAlgorithm::NEXT_FIT;
  if (name == "padded") return PackAlgorithm::PADDED;
  if (name == "balanced") return PackAlgorithm::BALANCED;
  BERTH_FAIL("unknown packing algorithm '{}'; use one of bfd, next_fit, padded, balanced", name);
}

std::string pack_algorithm_name(PackAlgorithm a) {
  switch (a) {
    case PackAlgorithm::BFD: return "bfd";
    case PackAlgorithm::NEXT_FIT: return "next_fit";
    case PackAlgorithm::PADDED: return "padded";
    case PackAlgorithm::BALANCED: return "balanced";
  }
  return "unknown";
}

PackPlan pack_documents(const std::vector<int64_t>& doc_lengths, const PackOptions& options) {
  BERTH_CHECK(options.seq_len > 0, "packing seq_len must be > 0, got {}", options.seq_len);
  BERTH_CHECK(options.window > 0, "packing window must be > 0 pieces, got {}", options.window);
  if (options.algorithm == PackAlgorithm::BALANCED) {
    BERTH_CHECK(options.alpha >= 0 && options.beta >= 0 && options.alpha + options.beta > 0,
                "balanced packing needs alpha >= 0, beta >= 0, not both 0 (got alpha {}, beta {})",
                options.alpha, options.beta);
  }
  BERTH_CHECK(options.align >= 1 && options.seq_len % options.align == 0,
              "packing align must be >= 1 and divide seq_len {}, got {}", options.seq_len,
              options.align);
  PackPlan plan;
  plan.options = options;
  plan.row_offsets.push_back(0);
  std::vector<Piece> pieces = make_pieces(doc_lengths, options);
  // Aligned: pack the pieces by their padded lengths, then give them back their own.
  const int64_t a = options.align;
  if (a > 1) {
    for (Piece& p : pieces) p.length = (p.length + a - 1) / a * a;
  }
  plan.pieces.reserve(pieces.size());
  switch (options.algorithm) {
    case PackAlgorithm::PADDED: pack_padded(pieces, &plan); break;
    case PackAlgorithm::NEXT_FIT: pack_next_fit(pieces, options.seq_len, &plan); break;
    case PackAlgorithm::BFD: pack_best_fit(pieces, options, false, &plan); break;
    case PackAlgorithm::BALANCED: pack_best_fit(pieces, options, true, &plan); break;
  }
  if (a > 1) {
    for (Piece& p : plan.pieces) {
      p.length = std::min(options.seq_len, doc_lengths[size_t(p.doc)] - p.start);
    }
  }
  return plan;
}

// ---- validation ---------------------------------------------------------------------------------

std::string plan_mismatch(const PackPlan& plan, const std::vector<int64_t>& doc_lengths) {
  const PackOptions& o = plan.options;
  const int64_t n_docs = int64_t(doc_lengths.size());
  for (int64_t r = 0; r < plan.n_rows(); ++r) {
    int64_t used = 0;
    for (int64_t k = plan.row_offsets[size_t(r)]; k < plan.row_offsets[size_t(r) + 1]; ++k) {
      const Piece& p = plan.pieces[size_t(k)];
      if (p.doc < 0 || p.doc >= n_docs) {
        return fmt::format("piece {} names document {}, the dataset has {}", k, p.doc, n_docs);
      }
      if (p.start < 0 || p.length <= 0 || p.start > doc_lengths[size_t(p.doc)] - p.length) {
        // (start and length as stored: their sum may overflow in a damaged plan)
        return fmt::format(
            "piece {} ({} tokens from token {} of document {}) is not inside the document's "
            "{} tokens",
            k, p.length, p.start, p.doc, doc_lengths[size_t(p.doc)]);
      }
      used += (p.length + o.align - 1) / o.align * o.align;
    }
    if (used > o.seq_len) {
      return fmt::format("row {} holds {} tokens, more than seq_len {}", r, used, o.seq_len);
    }
  }
  // Coverage: the pieces of each document, in order of their start, tile it.
  std::vector<int64_t> order(plan.pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const Piece &x = plan.pieces[size_t(a)], &y = plan.pieces[size_t(b)];
    return std::tie(x.doc, x.start) < std::tie(y.doc, y.start);
  });
  std::vector<int64_t> covered(size_t(n_docs), 0);
  for (const int64_t k : order) {
    const Piece& p = plan.pieces[size_t(k)];
    const int64_t next = covered[size_t(p.doc)];
    if (p.start < next) {
      return fmt::format("document {}: two pieces hold token {}", p.doc, p.start);
    }
    if (p.start > next) {
      return fmt::format("document {}: no piece holds tokens {}..{}", p.doc, next, p.start);
    }
    covered[size_t(p.doc)] += p.length;
  }
  for (int64_t d = 0; d < n_docs; ++d) {
    const int64_t len = doc_lengths[size_t(d)];
    const bool dropped =
        covered[size_t(d)] == 0 && o.long_docs == LongDocs::DROP && len > o.seq_len;
    if (covered[size_t(d)] != len && !dropped) {
      return fmt::format("document {} has {} of its {} tokens in the plan", d, covered[size_t(d)],
                         len);
    }
  }
  return "";
}

// ---- statistics ---------------------------------------------------------------------------------

PackStats pack_stats(const PackPlan& plan, const std::vector<int64_t>& doc_lengths) {
  PackStats s;
  const int64_t T = plan.options.seq_len;
  s.rows = plan.n_rows();
  s.documents = int64_t(doc_lengths.size());
  s.pieces = int64_t(plan.pieces.size());
  std::vector<int32_t> pieces_per_doc(doc_lengths.size(), 0);
  for (const Piece& p : plan.pieces) {
    BERTH_CHECK(p.doc >= 0 && p.doc < s.documents, "plan piece names document {} of {}", p.doc,
                s.documents);
    ++pieces_per_doc[size_t(p.doc)];
    s.real_tokens += p.length;
  }
  for (size_t d = 0; d < doc_lengths.size(); ++d) {
    if (pieces_per_doc[d] > 1) ++s.docs_cut;
    if (pieces_per_doc[d] == 0 && doc_lengths[d] > 0) ++s.docs_dropped;
  }
  s.slots = s.rows * T;
  s.efficiency = s.slots > 0 ? double(s.real_tokens) / double(s.slots) : 0.0;
  s.padding_waste = s.slots > 0 ? 1.0 - s.efficiency : 0.0;
  double total_sq = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    double sq = 0;
    for (int64_t k = plan.row_offsets[size_t(r)]; k < plan.row_offsets[size_t(r) + 1]; ++k) {
      const double l = double(plan.pieces[size_t(k)].length);
      sq += l * l;
    }
    total_sq += sq;
    s.max_sum_sq = std::max(s.max_sum_sq, sq);
  }
  s.mean_sum_sq = s.rows > 0 ? total_sq / double(s.rows) : 0.0;
  return s;
}

std::string format_pack_stats(const PackStats& s, double seconds) {
  return fmt::format(
      "rows {}  documents {}  pieces {}\n"
      "efficiency {:.2f}%  padding waste {:.2f}%  ({} real tokens in {} slots)\n"
      "docs cut {}  docs dropped {}\n"
      "sum L^2 per row: mean {:.4g}  max {:.4g}\n"
      "pack time {:.3f} s",
      s.rows, s.documents, s.pieces, 100.0 * s.efficiency, 100.0 * s.padding_waste, s.real_tokens,
      s.slots, s.docs_cut, s.docs_dropped, s.mean_sum_sq, s.max_sum_sq, seconds);
}

}  // namespace berth
