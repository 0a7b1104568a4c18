// `berth model import --format llmc|hf-gpt2 INPUT --out CKPT`
// `berth model export --format llmc|hf-gpt2 CKPT --out OUTPUT`
// Import writes a weights-only berth checkpoint directory (step 0, no optimizer state) that
// `init_from` can start a run from; export writes an llm.c model file (fp32, version 3) or a
// Hugging Face GPT-2 directory (model.safetensors + config.json). Both are atomic.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>

#include "launcher/commands.h"
#include "runtime/core/check.h"
#include "runtime/core/fs.h"
#include "runtime/core/log.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/model_formats.h"

namespace berth {
namespace {

struct ModelArgs {
  std::string format;
  std::string input;
  std::string out;
};

std::string describe(const GPTConfig& m) {
  return fmt::format("L={} NH={} C={} V={} (Vp {}) maxT={}", m.L, m.NH, m.C, m.V, m.Vp, m.maxT);
}

void run_import(const ModelArgs& a) {
  BERTH_CHECK(!a.out.empty(), "--out is empty: give the checkpoint directory to create");
  // Checked first so a long conversion does not end in "already exists".
  BERTH_CHECK(!std::filesystem::exists(a.out),
              "--out '{}' already exists; a checkpoint is written to a new directory: choose "
              "another path or remove it",
              a.out);
  check_output_file(a.out, "--out", "model");  // its directory exists and is writable
  const CheckpointData data = a.format == "llmc" ? read_llmc_model(a.input) : read_hf_gpt2(a.input);
  save_checkpoint(a.out, data);
  log_info("wrote checkpoint {}: {} parameters, {} (from {} '{}')", a.out, data.params.size(),
           describe(data.model), a.format, a.input);
}

void run_export(const ModelArgs& a) {
  BERTH_CHECK(!a.out.empty(), "--out is empty: give a file (llmc) or directory (hf-gpt2) name");
  // The export is written beside the checkpoint, never into it: a file there (model.h5 above
  // all) would be replaced.
  std::error_code ec;
  const std::filesystem::path ck = std::filesystem::weakly_canonical(a.input, ec);
  const std::filesystem::path out = std::filesystem::weakly_canonical(a.out, ec);
  BERTH_CHECK(std::mismatch(ck.begin(), ck.end(), out.begin(), out.end()).first != ck.end(),
              "--out '{}' is inside the checkpoint '{}': the export would replace its files; "
              "write it elsewhere",
              a.out, a.input);
  // An earlier llm.c export may be replaced; any other file (a dataset, a config) is not ours.
  BERTH_CHECK(
      a.format != "llmc" || !std::filesystem::exists(a.out, ec) || is_llmc_model_file(a.out),
      "--out '{}' exists and is not an llm.c model file: the export would replace it; "
      "choose another name, or remove it first",
      a.out);
  const CheckpointData data = load_checkpoint(a.input, /*with_optimizer=*/false);
  if (a.format == "llmc") {
    write_llmc_model(a.out, data);
  } else {
    write_hf_gpt2(a.out, data);
  }
  log_info("wrote {} {}: {} parameters, {} (from checkpoint '{}')", a.format, a.out,
           data.params.size(), describe(data.model), a.input);
}

}  // namespace

void register_model_commands(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model",
                                       "Model weights: import from / export to llm.c "
                                       "and Hugging Face GPT-2");
  model->require_subcommand(1);

  auto imp = std::make_shared<ModelArgs>();
  CLI::App* import = model->add_subcommand("import",
                                           "Convert llm.c or HF GPT-2 weights into a "
                                           "berth checkpoint (weights only, step 0)");
  import
      ->add_option("--format", imp->format,
                   "llmc (model .bin, version 3 or 5) or hf-gpt2 (directory with "
                   "model.safetensors + config.json, or the .safetensors file)")
      ->required()
      ->check(CLI::IsMember({"llmc", "hf-gpt2"}));
  import->add_option("input", imp->input, "llm.c model file or HF model directory/file")
      ->required()
      ->check(CLI::ExistingPath);
  import->add_option("--out", imp->out, "Checkpoint directory to create")
      ->required()
      ->transform(without_trailing_slashes);
  import->callback([imp]() { run_import(*imp);
});

auto exp = std::make_shared<ModelArgs>();
CLI::App* export_cmd = model->add_subcommand("export",
                                             "Convert a berth checkpoint's weights "
                                             "into llm.c or HF GPT-2 format");
export_cmd
    ->add_option("--format", exp->format,
                 "llmc (one fp32 .bin file, version 3) or hf-gpt2 (a directory: "
                 "model.safetensors F32 + config.json)")
    ->required()
    ->check(CLI::IsMember({"llmc", "hf-gpt2"}));
export_cmd->add_option("checkpoint", exp->input, "Checkpoint directory")
    ->required()
    ->check(CLI::ExistingDirectory);
export_cmd->add_option("--out", exp->out, "Output .bin file (llmc) or directory (hf-gpt2)")
    ->required()
    ->transform(without_trailing_slashes);
export_cmd->callback([exp]() { run_export(*exp); });
}  // namespace berth

}  // namespace berth
