#include <torch/torch.h>

#include <iostream>

#include "commands.h"

namespace slm::cli {

void add_info_command(CLI::App& app) {
  auto* info = app.add_subcommand("info", "Print the build: libtorch version, CUDA support and visible devices");
  info->callback([] {
    std::cout << "slm " << SLM_VERSION << "\n";
    std::cout << "libtorch " << TORCH_VERSION << "\n";
#ifdef SLM_WITH_CUDA
    std::cout << "built with SLM_CUDA=ON (sm_90 kernels)\n";
#else
    std::cout << "built without SLM_CUDA (CPU kernels only)\n";
#endif
    std::cout << "CPU threads " << torch::get_num_threads() << "\n";
    bool cuda = torch::cuda::is_available();
    std::cout << "CUDA available: " << (cuda ? "yes" : "no");
    if (cuda) std::cout << ", " << static_cast<int>(torch::cuda::device_count()) << " device(s)";
    std::cout << "\n";
  });
}

}  // namespace slm::cli
