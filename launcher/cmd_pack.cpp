// `berth pack --data D.h5 --seq-len T [--algorithm bfd|next_fit|padded|balanced] [--window N]
//             [--seed S] [--drop-long] --out PLAN.h5`
// Packs the documents of a token dataset into rows of T tokens and writes the plan (with its key,
// see packing/plan_cache.h); prints the packing statistics.
#include <CLI/CLI.hpp>
#include <chrono>
#include <limits>

#include "launcher/commands.h"
#include "packing/packers.h"
#include "packing/plan_cache.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/limits.h"
#include "runtime/core/log.h"
#include "runtime/io/token_dataset.h"

namespace berth {
namespace {

struct PackArgs {
  std::string data, out, algorithm = "bfd";
  int64_t seq_len = 0;
  int64_t window = 1000;
  // run.seed's type and default, so a default plan is the one training looks for (which packs
  // with uint64_t(run.seed), negative seeds included).
  int64_t seed = 1337;
  bool drop_long = false;
  int64_t align = 1;
};

void run_pack(const PackArgs& a) {
  PackOptions o;
  o.seq_len = a.seq_len;
  o.algorithm = parse_pack_algorithm(a.algorithm);
  o.window = a.window;
  o.seed = static_cast<uint64_t>(a.seed);
  o.long_docs = a.drop_long ? LongDocs::DROP : LongDocs::SPLIT;
  o.align = a.align;
  require_plan_destination(a.out);  // before the packing: --out naming the dataset is refused
  check_output_file(a.out, "--out", "plan.h5");
  const TokenDataset ds = read_token_dataset(a.data);
  const std::vector<int64_t> lengths = doc_lengths_from_offsets(ds.doc_offsets);
  const auto t0 = std::chrono::steady_clock::now();
  const PackPlan plan = pack_documents(lengths, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (plan.n_rows() == 0) {
    const int64_t dropped = pack_stats(plan, lengths).docs_dropped;
    BERTH_CHECK(dropped == 0,
                "nothing to pack: {} of the {} documents are longer than --seq-len {} and "
                "--drop-long drops them; raise --seq-len or leave out --drop-long (long documents "
                "are then cut into --seq-len pieces)",
                dropped, lengths.size(), a.seq_len);
    BERTH_FAIL(
        "nothing to pack: the {} document(s) of '{}' hold no tokens; re-import the data "
        "with `berth data import`",
        lengths.size(), a.data);
  }
  const std::string key = plan_key(ds.doc_offsets, o);
  write_plan(a.out, plan, key);
  log_info("wrote packing plan {} (key {}, {} {}, seq_len {}{})\n{}", a.out, key, a.algorithm,
           a.drop_long ? "drop-long" : "split-long", a.seq_len,
           a.align > 1 ? fmt::format(", align {}", a.align) : std::string(),
           format_pack_stats(pack_stats(plan, lengths), seconds));
}

}  // namespace

void register_pack_command(CLI::App& app) {
  auto args = std::make_shared<PackArgs>();
  CLI::App* pack = app.add_subcommand("pack", "Pack a token dataset's documents into rows (plan)");
  pack->add_option("--data", args->data, "Token dataset (.h5)")->required()->check(CLI::ExistingFile);
  pack->add_option("--seq-len", args->seq_len, "Row length T in tokens")
      ->required()
      ->check(whole_number_in(1, limits::kMaxSeqLen - 1));  // as model.max_seq_len
  pack->add_option("--algorithm", args->algorithm, "bfd, next_fit, padded or balanced")
      ->check(CLI::IsMember({"bfd", "next_fit", "padded", "balanced"}))
      ->capture_default_str();
  pack->add_option("--window", args->window, "BFD window in pieces")
      ->check(positive_integer())
      ->capture_default_str();
  pack->add_option("--seed", args->seed, "Seed of the document order (the run.seed to train with)")
      ->capture_default_str()
      ->check(whole_number_at_least(std::numeric_limits<int64_t>::min()));
  pack->add_flag("--drop-long", args->drop_long, "Drop documents longer than T (default: split)");
  pack->add_option("--align", args->align,
                   "Pad every piece to a multiple of this many tokens (2·cp for training with "
                   "parallel.cp; must divide --seq-len)")
      ->capture_default_str()
      ->check(positive_integer());
  pack->add_option("--out", args->out, "Output plan (.h5)")->required();
  pack->callback([args]() { run_pack(*args); });
}

}  // namespace berth
