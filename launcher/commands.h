// CLI11 registration of berth's subcommands; each cmd_*.cpp adds its own. The callbacks run inside
// app.parse(), so errors they throw reach main's handler.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace berth {

std::string version_text();  // "berth 0.1.0 (CUDA: ...)"

void register_train_command(CLI::App& app);  // berth train CONFIG [--set k=v]...
void register_data_commands(CLI::App& app);  // berth data import|info
void register_model_commands(CLI::App& app);  // berth model import|export
void register_pack_command(CLI::App& app);  // berth pack --data D.h5 --seq-len T --out PLAN.h5
void register_eta_commands(CLI::App& app);  // berth eta replay|bench (progress prediction)

}  // namespace berth
