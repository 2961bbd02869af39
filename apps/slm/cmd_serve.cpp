#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include "commands.h"
#include "slm/model/backend_summary.h"
#include "slm/recipe/ensemble.h"
#include "slm/server/http_server.h"
#include "slm/util/error.h"
#include "slm/util/format.h"
#include "slm/workspace/workspace.h"

namespace slm::cli {

namespace {

std::atomic<int> g_signal{0};
void on_serve_signal(int sig) {
  g_signal = sig;
}

struct ServeFlags {
  std::string ensemble, recipe, checkpoint, tokenizer;
  server::LoadOptions load;
  server::ServerOptions http;
  std::vector<std::string> workspaces;
  double workspace_poll_s = 2;
  bool quiet = false;
};

void run_serve(ServeFlags f) {
  const char* usage = "serve: give --ensemble MANIFEST, or --recipe R (with --checkpoint C and --tokenizer T)";
  if (!f.ensemble.empty() && !f.recipe.empty()) throw Error(usage);
  if ((!f.checkpoint.empty() || !f.tokenizer.empty()) && f.recipe.empty())
    throw Error(std::string(usage) + ": --checkpoint and --tokenizer go with --recipe");
  if (f.ensemble.empty() && f.recipe.empty()) {
    f.ensemble = default_ensemble_path();
    if (f.ensemble.empty()) throw Error(std::string(usage) + "; " + default_ensemble_missing_note());
    std::cerr << "slm serve: no model given: the shipped ensemble " << f.ensemble << "\n";
  }
  if (f.http.api_key.empty())
    if (const char* k = std::getenv("SLM_API_KEY")) f.http.api_key = k;
  server::Specialists specialists;
  const auto t0 = std::chrono::steady_clock::now();
  auto say = [](const std::string& line) { std::cerr << "slm serve: " << line << "\n"; };
  if (!f.ensemble.empty()) {
    specialists = server::Specialists::from_manifest(load_ensemble(f.ensemble), f.load, say);
  } else {
    if (f.tokenizer.empty()) throw Error("serve: --recipe needs --tokenizer (the code tokenizer .model)");
    specialists = server::Specialists::single(f.recipe, f.checkpoint, f.tokenizer, f.load);
  }
  int64_t bytes = 0;
  for (const auto& s : specialists.all()) {
    bytes += s->weight_bytes;
    if (s->weights == "random")
      say("warning: " + s->name + " runs RANDOM weights (no checkpoint): its answers are noise");
    const std::lock_guard<std::mutex> turn(*s->model.in_use);  // the engine's thread may be warming the model up
    say(s->name + " runs " + model::backend_summary(*s->model.model));
  }
  say(std::to_string(specialists.all().size()) + " specialist(s) loaded in " +
      std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()).substr(0, 5) +
      " s, weights " + human_bytes(static_cast<double>(bytes)) +
      (specialists.has_router() ? ", router loaded (model \"auto\")" : ", no router"));
  if (!f.quiet) f.http.log = [](const std::string& line) { std::cerr << "slm serve: " << line << "\n"; };
  // Each workspace indexes on its own thread from now on; requests meanwhile get what is linked (nothing at first).
  std::vector<std::unique_ptr<workspace::Workspace>> workspaces;
  for (const auto& dir : f.workspaces) {
    workspaces.push_back(std::make_unique<workspace::Workspace>(dir, workspace::WorkspaceLimits{}, say));
    workspaces.back()->start(f.workspace_poll_s);
    f.http.workspaces.push_back(workspaces.back().get());
    say("indexing workspace " + workspaces.back()->root() + " (C++ files; progress in the log and /metrics)");
  }
  server::Server srv(specialists, f.http);
  const int port = srv.start();
  say("listening on http://" + f.http.host + ":" + std::to_string(port) +
      (f.http.api_key.empty() ? "" : " (API key required)") + "  (Ctrl+C stops)");
  std::signal(SIGINT, on_serve_signal);
  std::signal(SIGTERM, on_serve_signal);
  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  say("stopping (signal " + std::to_string(g_signal.load()) + ")");
  srv.stop();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  auto* s = app.add_subcommand("serve",
                               "OpenAI-compatible HTTP server for an ensemble or one model: /v1/chat/completions, "
                               "/v1/completions, /v1/models, /health, /metrics, a chat page at / (docs/serving.md)");
  s->add_option("--ensemble", f->ensemble,
                "ensemble manifest with checkpoints, tokenizers and a router (default: the shipped "
                "models/ensemble.json, looked for in the working directory, then next to the program's build "
                "directory)");
  s->add_option("--recipe", f->recipe, "one model: its recipe (instead of --ensemble)");
  s->add_option("--checkpoint", f->checkpoint, "one model: weights file, checkpoint or run directory");
  s->add_option("--tokenizer", f->tokenizer, "one model: the code tokenizer .model it was trained with");
  s->add_flag("--random-weights", f->load.allow_random_weights,
              "serve specialists without a checkpoint on random weights (smoke tests)");
  s->add_option("--seed", f->load.seed, "seed of the random weights (specialist i: seed + i)")->capture_default_str();
  s->add_option("--device", f->load.device, "where the models run: cpu or cuda")->capture_default_str();
  s->add_option("--host", f->http.host, "address to bind (0.0.0.0 exposes the server to the network)")
      ->capture_default_str();
  s->add_option("--port", f->http.port, "port (0: any free port)")->capture_default_str();
  s->add_option("--threads", f->http.threads, "HTTP worker threads (concurrent connections)")->capture_default_str();
  s->add_option("--max-queue", f->load.max_queue, "waiting requests per specialist before 503")->capture_default_str();
  s->add_option("--slots", f->load.slots, "sequences each specialist generates at once (continuous batching)")
      ->check(CLI::Range(int64_t{1}, int64_t{256}))
      ->capture_default_str();
  s->add_option("--prefix-cache-mib", f->load.prefix_cache_mib,
                "memory each specialist may keep for the states of recent prompt prefixes (KV caches and recurrent "
                "states at every 512-token boundary), reused by later prompts that start the same; 0: off")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  s->add_option("--default-max-tokens", f->http.default_max_tokens, "max_tokens when a request gives none")
      ->capture_default_str();
  s->add_option("--timeout", f->http.request_timeout_s, "seconds before a generation is cut")->capture_default_str();
  s->add_option("--max-body", f->http.max_body_bytes, "largest request body in bytes")->capture_default_str();
  s->add_option("--api-key", f->http.api_key,
                "require \"Authorization: Bearer KEY\" on every endpoint but /health and / (or set SLM_API_KEY)");
  s->add_option("--workspace", f->workspaces,
                "a repository whose context graph /infill requests get: the definitions the function at the cursor "
                "calls, its class, its callers and included headers, indexed in the background and kept fresh; only "
                "files under DIR are read, symlinks are not followed (repeatable; docs/serving.md)")
      ->type_name("DIR")
      ->check(CLI::ExistingDirectory);
  s->add_option("--workspace-poll", f->workspace_poll_s, "seconds between checks of the workspaces for changed files")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  s->add_flag("--quiet", f->quiet, "no per-request log lines");
  s->callback([f] { run_serve(*f); });
}

}  // namespace slm::cli
