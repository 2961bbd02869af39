#pragma once
// Each subcommand file registers its CLI11 subcommand; the callback runs the library and prints.
#include <CLI/CLI.hpp>

namespace slm::cli {
void add_recipe_command(CLI::App& app);
void add_ensemble_command(CLI::App& app);
void add_info_command(CLI::App& app);
void add_model_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_tokenizer_command(CLI::App& app);
void add_data_command(CLI::App& app);
void add_nvfp4_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_router_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_chat_command(CLI::App& app);
}  // namespace slm::cli
