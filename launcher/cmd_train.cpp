// `berth train CONFIG [--set section.key=value]...`
#include <mpi.h>

#include <CLI/CLI.hpp>

#include "launcher/commands.h"
#include "runtime/config/config.h"
#include "runtime/core/check.h"
#include "runtime/train/trainer.h"

#if BERTH_CUDA
#include "kernels/cuda/device.h"
#endif

namespace berth {

std::string version_text() {
#if BERTH_CUDA
  const int n = cuda::device_count();
  return fmt::format("berth {} (CUDA: built, {} device{} visible)", BERTH_VERSION, n,
                     n == 1 ? "" : "s");
#else
  return fmt::format("berth {} (CUDA: not built)", BERTH_VERSION);
#endif
}

void register_train_command(CLI::App& app) {
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a TOML config");
  cmd->add_option("config", args->config, "Run config (TOML), e.g. configs/tiny.toml")->required();
  cmd->add_option("--set", args->overrides,
                  "Override a config value: --set section.key=value (repeatable)")
      ->type_name("KEY=VALUE");
  cmd->callback([args]() {
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    BERTH_CHECK(world == 1,
                "berth train was started on {} ranks, but this build trains on one rank only "
                "(data, tensor and pipeline parallelism are not in this build yet): run with "
                "`mpirun -np 1`",
                world);
    const RunConfig cfg = load_config(args->config, args->overrides);
    Trainer trainer(cfg);
    trainer.run();
  });
}

}  // namespace berth
