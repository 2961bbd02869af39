#include <unistd.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "slm/recipe/ensemble.h"
#include "slm/server/chat_client.h"
#include "slm/util/error.h"

namespace slm::cli {

namespace {

struct ChatFlags {
  std::string url, ensemble, recipe, checkpoint, tokenizer, api_key, system, prompt;
  // One person types: one sequence slot per specialist (the prefix cache still spares each turn the conversation's
  // earlier prefill).
  server::LoadOptions load = [] {
    server::LoadOptions o;
    o.slots = 1;
    return o;
  }();
  server::ChatOptions chat;
  std::vector<std::string> workspaces;  // in-process: directories whose files a message may name (@path)
};

const char* kHelp =
    "commands: /reset (forget the conversation), /model NAME (a specialist or auto), /quit; a line ending in \\ "
    "continues on the next\n";

// The server `slm chat` talks to when no model is given and the shipped models are missing.
const char* kDefaultUrl = "http://127.0.0.1:8000";

void run_chat(ChatFlags f) {
  if ((!f.checkpoint.empty() || !f.tokenizer.empty()) && f.recipe.empty())
    throw Error("chat: --checkpoint and --tokenizer go with --recipe");
  const int sources = !f.url.empty() + !f.ensemble.empty() + !f.recipe.empty();
  if (sources > 1) throw Error("chat: give one of --url, --ensemble or --recipe");
  if (sources == 0) {
    f.ensemble = default_ensemble_path();
    if (!f.ensemble.empty()) {
      std::cerr << "slm chat: no model given: the shipped ensemble " << f.ensemble << "\n";
    } else {
      f.url = kDefaultUrl;
      std::cerr << "slm chat: " << default_ensemble_missing_note() << "; talking to a server at " << f.url << "\n";
    }
  }
  server::Specialists specialists;  // in-process only
  std::vector<std::unique_ptr<workspace::Workspace>> workspaces;
  std::unique_ptr<server::ChatBackend> backend;
  if (!f.url.empty()) {
    if (!f.workspaces.empty())
      throw Error("chat: --workspace is for in-process chat; a server reads its own (slm serve --workspace)");
    backend = server::http_chat(f.url, f.api_key);
  } else {
    if (!f.ensemble.empty()) {
      specialists = server::Specialists::from_manifest(load_ensemble(f.ensemble), f.load);
    } else {
      if (f.tokenizer.empty()) throw Error("chat: --recipe needs --tokenizer (the code tokenizer .model)");
      specialists = server::Specialists::single(f.recipe, f.checkpoint, f.tokenizer, f.load);
    }
    for (const auto& s : specialists.all())
      if (s->weights == "random") std::cerr << "slm chat: warning: " << s->name << " runs RANDOM weights\n";
    // Indexed once before the first question (a server indexes in the background instead).
    for (const auto& dir : f.workspaces) {
      workspaces.push_back(std::make_unique<workspace::Workspace>(
          dir, workspace::WorkspaceLimits{},
          [](const std::string& line) { std::cerr << "slm chat: " << line << "\n"; }));
      workspaces.back()->refresh();
    }
    server::Workspaces ws;
    for (const auto& w : workspaces) ws.push_back(w.get());
    backend = server::in_process_chat(specialists, ws);
  }
  std::vector<text::ChatMessage> history;
  if (!f.system.empty()) history.push_back({"system", f.system});
  // One turn: the answer streams to stdout, who answered follows on stderr. Throws slm::Error when it fails.
  auto turn = [&](const std::string& text) {
    history.push_back({"user", text});
    try {
      const auto reply =
          backend->send(history, f.chat, [](const std::string& piece) { std::cout << piece << std::flush; });
      std::cout << "\n";
      if (!reply.context.empty()) std::cerr << "(workspace" << reply.context << ")\n";
      std::cerr << "(answered by " << reply.specialist << ", finish " << reply.finish_reason << ")\n";
      history.push_back({"assistant", reply.text});
    } catch (const Error&) {
      history.pop_back();
      throw;
    }
  };
  if (!f.prompt.empty()) {
    turn(f.prompt);
    return;
  }
  const bool tty = ::isatty(0);
  if (tty)
    std::cerr << "slm chat (" << (f.url.empty() ? "in-process" : f.url) << ", model " << f.chat.model << ")\n" << kHelp;
  int messages = 0, failures = 0;
  std::string line;
  for (;;) {
    if (tty) std::cerr << "you> " << std::flush;
    std::string text;
    while (std::getline(std::cin, line)) {
      if (!line.empty() && line.back() == '\\') {
        text += line.substr(0, line.size() - 1) + "\n";
        continue;
      }
      text += line;
      break;
    }
    if (!std::cin && text.empty()) break;  // end of input
    if (text == "/quit" || text == "/exit") break;
    if (text == "/reset") {
      history.resize(f.system.empty() ? 0 : 1);
      std::cerr << "(conversation cleared)\n";
      continue;
    }
    if (text.rfind("/model ", 0) == 0) {
      f.chat.model = text.substr(7);
      std::cerr << "(model " << f.chat.model << ")\n";
      continue;
    }
    if (text == "/help" || (text.empty() && tty)) {
      std::cerr << kHelp;
      continue;
    }
    if (text.empty()) continue;  // a blank line in piped input asks for nothing
    ++messages;
    try {
      turn(text);
    } catch (const Error& e) {
      ++failures;
      std::cerr << "slm chat: " << e.what() << "\n";
    }
  }
  // A person saw each failure and went on; a script reading piped messages learns of them from the exit status.
  if (!tty && failures > 0)
    throw Error("chat: " + std::to_string(failures) + " of " + std::to_string(messages) + " messages got no answer");
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto f = std::make_shared<ChatFlags>();
  auto* c = app.add_subcommand(
      "chat",
      "Chat in the terminal with specialists loaded in-process (the shipped models/ensemble.json when no model is "
      "given, or --ensemble, --recipe) or with a running `slm serve` (--url); with stdin not a terminal, answers each "
      "line it reads and exits at its end");
  c->add_option("--url", f->url,
                "talk to a running server (the default, http://127.0.0.1:8000, only when no model is given and the "
                "shipped models are missing)");
  c->add_option("--api-key", f->api_key, "the server's API key, if it wants one");
  c->add_option("--workspace", f->workspaces,
                "in-process: a directory of your code (repeatable); a message that names one of its files (@path) gets "
                "the file, what it calls elsewhere and its headers' outlines before the question");
  c->add_option("--ensemble", f->ensemble, "in-process: ensemble manifest (default: the shipped models/ensemble.json)");
  c->add_option("--recipe", f->recipe, "in-process: one model's recipe");
  c->add_option("--checkpoint", f->checkpoint, "in-process: its weights");
  c->add_option("--tokenizer", f->tokenizer, "in-process: its code tokenizer .model");
  c->add_flag("--random-weights", f->load.allow_random_weights, "in-process: allow specialists without a checkpoint");
  c->add_option("--model", f->chat.model, "specialist name or auto")->capture_default_str();
  c->add_option("--max-tokens", f->chat.max_tokens, "longest answer")->capture_default_str();
  c->add_option("--temperature", f->chat.temperature, "0 = greedy")->capture_default_str();
  c->add_option("--top-p", f->chat.top_p, "nucleus sampling mass")->capture_default_str();
  c->add_option("--seed", f->chat.seed, "sampling seed")->capture_default_str();
  c->add_option("--system", f->system, "a system message that starts the conversation");
  c->add_option("--prompt", f->prompt, "answer this one message and exit (stdin is not read)");
  c->callback([f] { run_chat(*f); });
}

}  // namespace slm::cli
