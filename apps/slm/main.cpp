// slm: build, train, quantize and serve the SLM Ensemble. Exit codes: 0 ok, 1 internal failure,
// 2 bad input (malformed recipe, missing file, bad flag, a training step that does not fit in memory).
#include <c10/util/Exception.h>

#include <iostream>

#include "commands.h"
#include "slm/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"slm — SLM Ensemble: pattern-driven hybrid specialist language models for C++ work"};
  app.set_version_flag("--version", std::string("slm ") + SLM_VERSION);
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("--verbose", verbose, "on an internal libtorch error, print its C++ backtrace too");
  app.fallthrough();  // --verbose may follow the subcommand's own options
  slm::cli::add_recipe_command(app);
  slm::cli::add_ensemble_command(app);
  slm::cli::add_info_command(app);
  slm::cli::add_model_command(app);
  slm::cli::add_generate_command(app);
  slm::cli::add_tokenizer_command(app);
  slm::cli::add_data_command(app);
  slm::cli::add_nvfp4_command(app);
  slm::cli::add_quantize_command(app);
  slm::cli::add_train_command(app);
  slm::cli::add_eval_command(app);
  slm::cli::add_demo_command(app);
  slm::cli::add_router_command(app);
  slm::cli::add_serve_command(app);
  slm::cli::add_chat_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::RuntimeError& e) {
    return e.get_exit_code();  // a command's own status (e.g. 130 after SIGINT stopped training cleanly)
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const slm::Error& e) {
    std::cerr << "slm: error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    // libtorch's what() carries a C++ stack of dozens of frames: for developers, not for the message.
    if (verbose)
      std::cerr << "slm: internal error: " << e.what() << "\n";
    else
      std::cerr << "slm: internal error: " << e.what_without_backtrace() << "\n(--verbose adds libtorch's backtrace)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "slm: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
