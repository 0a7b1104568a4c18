// `berth data import --format text|llmc [INPUTS...] [--files-from LIST] --out D.h5
//      [--val-out V.h5 --val-fraction F]`
// `berth data info D.h5 [--seq-len T]` (with T: BFD vs padded packing statistics)
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "launcher/commands.h"
#include "packing/packers.h"
#include "packing/plan_cache.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/limits.h"
#include "runtime/core/log.h"
#include "runtime/io/importers.h"
#include "runtime/io/token_dataset.h"

namespace berth {
namespace {

struct ImportArgs {
  std::string format = "text";
  std::vector<std::string> inputs;
  std::string files_from;  // a list of inputs, one path a line ("-": standard input)
  std::string out, val_out;
  double val_fraction = 0.0;
};

// The inputs a --files-from list names, one path a line (blank lines skipped, a CRLF's \r
// dropped): a corpus of many files passed on the command line went past the system's argument
// limit (ARG_MAX) before berth saw it. Each must be a regular file.
std::vector<std::string> read_file_list(const std::string& list) {
  const std::string named = list == "-" ? std::string("(standard input)") : "'" + list + "'";
  std::ifstream file;
  if (list != "-") {
    file.open(list);
    BERTH_CHECK(file.good(), "--files-from '{}': cannot read it: {}", list, std::strerror(errno));
  }
  std::istream& in = list == "-" ? std::cin : file;
  std::vector<std::string> paths;
  int64_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    std::error_code ec;
    BERTH_CHECK(std::filesystem::is_regular_file(line, ec),
                "--files-from {} line {}: '{}' {}; fix the list (one file path a line)", named,
                line_no, line,
                std::filesystem::exists(line, ec) ? "is not a regular file" : "does not exist");
    paths.push_back(line);
  }
  BERTH_CHECK(!paths.empty(), "--files-from {} names no file", named);
  return paths;
}

void run_import(ImportArgs a) {
  BERTH_CHECK(!a.inputs.empty() || !a.files_from.empty(),
              "berth data import needs its inputs: files on the command line, or --files-from "
              "LIST (one path a line; - reads them from standard input)");
  if (!a.files_from.empty()) {
    const std::vector<std::string> listed = read_file_list(a.files_from);
    a.inputs.insert(a.inputs.end(), listed.begin(), listed.end());
  }
  // A file named twice (overlapping globs, a --files-from list that repeats the command line, a
  // link to it) was imported twice without a word: its documents counted double, and a copy
  // could land in the validation split of its own training data. It is imported once, at its
  // first name, and the others are named in a warning (refusing them failed the glob of a
  // directory with links in it, /usr/share/common-licenses/* on Debian: GPL -> GPL-3). By
  // device and inode, so links count, in one pass over thousands of files.
  {
    std::map<std::pair<dev_t, ino_t>, std::string> seen;
    std::vector<std::string> unique, skipped;
    for (std::string& in : a.inputs) {
      struct stat st {};
      if (::stat(in.c_str(), &st) != 0) {  // the importer names what is missing
        unique.push_back(std::move(in));
        continue;
      }
      const auto [it, fresh] = seen.emplace(std::pair{st.st_dev, st.st_ino}, in);
      if (fresh) {
        unique.push_back(std::move(in));
      } else {
        skipped.push_back(in == it->second ? fmt::format("'{}' (named again)", in)
                                           : fmt::format("'{}' (= '{}')", in, it->second));
      }
    }
    if (!skipped.empty()) {
      std::string list;
      for (size_t i = 0; i < skipped.size() && i < 5; ++i) list += (i ? ", " : "") + skipped[i];
      if (skipped.size() > 5) list += fmt::format(" and {} more", skipped.size() - 5);
      log_warn(
          "{} input(s) name a file already among the inputs, imported once at its first "
          "name: {}",
          skipped.size(), list);
    }
    a.inputs = std::move(unique);
  }
  BERTH_CHECK(a.val_out.empty() == (a.val_fraction == 0.0),
              "--val-out and --val-fraction go together: give both, the fraction above 0 (e.g. "
              "--val-out val.h5 --val-fraction 0.1), or neither");
  BERTH_CHECK(a.val_out.empty() || !same_file_path(a.out, a.val_out),
              "--out and --val-out are the same file ({}): the validation split would replace "
              "the training data; give --val-out another path",
              a.out);
  check_output_file(a.out, "--out", "train.h5");  // before reading the inputs, which can take long
  if (!a.val_out.empty()) check_output_file(a.val_out, "--val-out", "val.h5");
  for (const std::string& in : a.inputs) {
    BERTH_CHECK(!same_file_path(a.out, in) && (a.val_out.empty() || !same_file_path(a.val_out, in)),
                "--out or --val-out names the input '{}': the import would replace it; give "
                "another path",
                in);
  }
  // A file there that is not a token dataset (notes, a checkpoint's model.h5) stays.
  require_dataset_destination(a.out, "--out");
  if (!a.val_out.empty()) require_dataset_destination(a.val_out, "--val-out");
  TokenDataset all;
  if (a.format == "text") {
    all = import_text_files(a.inputs);
  } else {
    BERTH_CHECK(a.inputs.size() == 1, "--format llmc takes exactly one token file, got {}",
                a.inputs.size());
    all = import_llmc_tokens(a.inputs[0]);
  }
  BERTH_CHECK(all.n_docs() > 0, "the inputs hold no tokens (all files are empty); nothing to import");
  if (a.val_out.empty()) {
    write_token_dataset(a.out, all);
    log_info("wrote {}: {} documents, {} tokens, vocab {}", a.out, all.n_docs(), all.n_tokens(),
             all.vocab_size);
    return;
  }
  BERTH_CHECK(all.n_docs() >= 2,
              "--val-out needs at least 2 documents to split (train and validation), the inputs "
              "hold {}; import more files or drop --val-out",
              all.n_docs());
  TokenDataset train, val;
  split_validation(all, a.val_fraction, &train, &val);
  // Both files are written under temporary names first and renamed only when both succeeded, so
  // a failure never leaves one of the pair behind.
  const std::string train_tmp = temp_path_for(a.out), val_tmp = temp_path_for(a.val_out);
  ScopedTemp train_removed_if_killed(train_tmp), val_removed_if_killed(val_tmp);
  try {
    write_token_dataset(train_tmp, train);
    write_token_dataset(val_tmp, val);
  } catch (...) {
    std::remove(train_tmp.c_str());
    std::remove(val_tmp.c_str());
    throw;
  }
  train_removed_if_killed.release();
  val_removed_if_killed.release();
  commit_file(train_tmp, a.out);
  commit_file(val_tmp, a.val_out);
  log_info("wrote {}: {} documents, {} tokens; {}: {} documents, {} tokens (vocab {})", a.out,
           train.n_docs(), train.n_tokens(), a.val_out, val.n_docs(), val.n_tokens(),
           all.vocab_size);
}

// What `berth pack` would achieve at seq_len T: BFD against one document per row (padded).
std::string packing_preview(const TokenDataset& ds, int64_t seq_len) {
  const std::vector<int64_t> lengths = doc_lengths_from_offsets(ds.doc_offsets);
  std::string text;
  for (const PackAlgorithm a : {PackAlgorithm::BFD, PackAlgorithm::PADDED}) {
    PackOptions o;
    o.seq_len = seq_len;
    o.algorithm = a;
    const auto t0 = std::chrono::steady_clock::now();
    const PackPlan plan = pack_documents(lengths, o);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    text += fmt::format("{}packing at seq_len {} ({}):\n{}", text.empty() ? "" : "\n", seq_len,
                        pack_algorithm_name(a), format_pack_stats(pack_stats(plan, lengths), seconds));
  }
  return text;
}

}  // namespace

void register_data_commands(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "Token datasets: import, inspect");
  data->require_subcommand(1);

  auto imp = std::make_shared<ImportArgs>();
  CLI::App* import = data->add_subcommand("import", "Import text or llm.c tokens into HDF5");
  import->add_option("--format", imp->format, "Input format: text (bytes, EOT 256) or llmc")
      ->check(CLI::IsMember({"text", "llmc"}))
      ->capture_default_str();
  import->add_option("inputs", imp->inputs, "Input files (text: one document per file)")
      ->check(CLI::ExistingFile);
  import
      ->add_option("--files-from", imp->files_from,
                   "A file listing more inputs, one path a line (- reads standard input)")
      ->check(non_empty("give a file, or - for standard input", "LIST"));
  import->add_option("--out", imp->out, "Output dataset (.h5)")->required();
  import->add_option("--val-out", imp->val_out, "Validation dataset (.h5), split off the end");
  import
      ->add_option("--val-fraction", imp->val_fraction,
                   "Fraction of documents for validation (with --val-out)")
      ->check(number_in(0.0, 0.99, true));
  import->callback([imp]() { run_import(*imp); });

  auto path = std::make_shared<std::string>();
  auto info_seq_len = std::make_shared<int64_t>(0);
  CLI::App* info = data->add_subcommand("info", "Summarize a token dataset");
  info->add_option("dataset", *path, "Dataset (.h5)")->required()->check(CLI::ExistingFile);
  info->add_option("--seq-len", *info_seq_len, "Also show what packing into T-token rows achieves")
      ->check(whole_number_in(1, limits::kMaxSeqLen - 1));  // as model.max_seq_len
  info->callback([path, info_seq_len]() {
    const TokenDataset ds = read_token_dataset(*path);
    log_info("{}", format_dataset_info(*path, dataset_info(ds)));
    if (*info_seq_len > 0) log_info("{}", packing_preview(ds, *info_seq_len));
  });
}

}  // namespace berth
