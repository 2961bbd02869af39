#pragma once
// What the HTTP server tests share beyond serving_test_util.h: a raw client socket (for what cpp-httplib's client
// never sends: half requests, false lengths, hang-ups), waits with deadlines, the server's log lines as events, and
// an engine wrapper that tells when the server cancels a request. A test holds an engine by locking its model's
// `in_use` mutex (engine::EngineModel): every engine over that model waits for it before its next step, so requests
// stay running or queued for exactly as long as the test wants.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "slm/engine/engine.h"
#include "slm/server/specialists.h"

namespace slm::test {

using Clock = std::chrono::steady_clock;

// Waits until pred() holds, at most `limit`; returns whether it held. It polls: what the tests wait for this way (an
// engine's queue, a metric) changes on another thread with no event to wait on.
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto deadline = Clock::now() + limit;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

struct RawResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;                            // de-chunked
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// One TCP connection to the server on the loopback. Every read waits at most `deadline` (SO_RCVTIMEO), so a server
// that never answers fails the test instead of hanging it.
class RawClient {
 public:
  explicit RawClient(int port, std::chrono::seconds deadline = std::chrono::seconds(30)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_GE(fd_, 0);
    timeval tv{static_cast<time_t>(deadline.count()), 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    EXPECT_TRUE(connected_) << "connect to port " << port;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool send(const std::string& bytes) {
    size_t at = 0;
    while (at < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // True when nothing has arrived and the server has not closed the connection, at this moment.
  bool silent() {
    if (!buffer_.empty()) return false;
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }
  // Waits for the first bytes of an answer (the status line of a stream comes before any token).
  bool wait_for_bytes() { return fill(); }
  // Reads one whole response (Content-Length or chunked body); nullopt when the connection ends or the deadline
  // passes first.
  std::optional<RawResponse> read_response() {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos)
      if (!fill()) return std::nullopt;
    RawResponse r;
    const std::string head = buffer_.substr(0, end);
    buffer_.erase(0, end + 4);
    size_t line_end = head.find("\r\n");
    const std::string status_line = head.substr(0, line_end);
    if (status_line.rfind("HTTP/1.1 ", 0) != 0) return std::nullopt;
    r.status = std::atoi(status_line.c_str() + 9);
    while (line_end != std::string::npos) {
      const size_t next = head.find("\r\n", line_end + 2);
      const std::string line = head.substr(line_end + 2, next == std::string::npos ? std::string::npos : next - line_end - 2);
      line_end = next;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      const size_t value = line.find_first_not_of(' ', colon + 1);
      r.headers[name] = value == std::string::npos ? "" : line.substr(value);
    }
    if (r.header("transfer-encoding") == "chunked") {
      for (;;) {
        size_t eol;
        while ((eol = buffer_.find("\r\n")) == std::string::npos)
          if (!fill()) return std::nullopt;
        const size_t size = std::stoul(buffer_.substr(0, eol), nullptr, 16);
        while (buffer_.size() < eol + 2 + size + 2)
          if (!fill()) return std::nullopt;
        r.body += buffer_.substr(eol + 2, size);
        buffer_.erase(0, eol + 2 + size + 2);
        if (size == 0) break;
      }
    } else {
      const size_t length = r.header("content-length").empty() ? 0 : std::stoul(r.header("content-length"));
      while (buffer_.size() < length)
        if (!fill()) return std::nullopt;
      r.body = buffer_.substr(0, length);
      buffer_.erase(0, length);
    }
    return r;
  }

 private:
  bool fill() {
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

// A request as bytes: the head with a Content-Length (unless the caller's headers give the length or the chunked
// encoding) and the body.
inline std::string http_request(const std::string& method, const std::string& path, const std::string& body,
                                const std::string& headers = "Content-Type: application/json\r\n",
                                bool with_length = true) {
  std::string r = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers;
  if (with_length) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

// A body in chunks of at most `piece` bytes, ended by the zero chunk.
inline std::string chunked(const std::string& body, size_t piece) {
  std::string out;
  char size[32];
  for (size_t at = 0; at < body.size(); at += piece) {
    const std::string part = body.substr(at, piece);
    std::snprintf(size, sizeof(size), "%zx\r\n", part.size());
    out += size + part + "\r\n";
  }
  return out + "0\r\n\r\n";
}

// The server's log (ServerOptions::log) as events to wait for.
class LogLines {
 public:
  std::function<void(const std::string&)> sink() {
    return [this](const std::string& line) {
      {
        std::lock_guard lock(mu_);
        lines_.push_back(line);
      }
      cv_.notify_all();
    };
  }
  size_t count(const std::string& fragment) {
    std::lock_guard lock(mu_);
    return count_locked(fragment);
  }
  // Waits until `n` lines hold `fragment`, at most `limit`.
  bool wait_for(const std::string& fragment, size_t n, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return count_locked(fragment) >= n; });
  }

 private:
  size_t count_locked(const std::string& fragment) const {
    return static_cast<size_t>(std::count_if(lines_.begin(), lines_.end(), [&](const std::string& l) {
      return l.find(fragment) != std::string::npos;
    }));
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// A specialist's engine behind a wrapper that forwards every call and records the ids submitted and cancelled: the
// server cancels a request when its client goes away or its time runs out, and a test waits for that event. While
// cancellations are held (hold_cancels), a cancel() waits in the wrapper, recorded as asked for, so that a request
// whose time has run out stays where it is (queued or running) until the test lets the cancellation through.
class EngineProbe final : public engine::Engine {
 public:
  // Replaces the specialist's engine (before a server uses it); the specialist owns the probe.
  static EngineProbe& install(server::Specialist& s) {
    auto probe = std::make_unique<EngineProbe>(std::move(s.engine));
    EngineProbe& p = *probe;
    s.engine = std::move(probe);
    return p;
  }
  explicit EngineProbe(std::unique_ptr<engine::Engine> inner) : inner_(std::move(inner)) {}

  engine::RequestId submit(engine::Request request, engine::Callbacks callbacks) override {
    // Serialized, so that the ids are listed in the order the engine took them: a test that waits for the engine to
    // take one request before it sends the next would otherwise find a slower thread's id listed second.
    std::lock_guard order(submit_mu_);
    const auto id = inner_->submit(std::move(request), std::move(callbacks));
    {
      std::lock_guard lock(mu_);
      submitted_.push_back(id);
    }
    cv_.notify_all();
    return id;
  }
  void cancel(engine::RequestId id) override {
    {
      std::unique_lock lock(mu_);
      asked_.insert(id);
      cv_.notify_all();
      cv_.wait(lock, [&] { return !cancels_held_; });
    }
    inner_->cancel(id);
    {
      std::lock_guard lock(mu_);
      cancelled_.insert(id);
    }
    cv_.notify_all();
  }
  engine::Stats stats() const override { return inner_->stats(); }
  int64_t context_length() const override { return inner_->context_length(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }

  // The id of the n-th request accepted (0 first), once it has been; 0 when the wait runs out.
  engine::RequestId submitted(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return submitted_.size() > n; }) ? submitted_[n] : 0;
  }
  // Waits until the server has cancelled request `id` (the engine has been told).
  bool wait_cancelled(engine::RequestId id, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return cancelled_.count(id) > 0; });
  }
  // Waits until the server has asked to cancel request `id` (held or not).
  bool wait_cancel_asked(engine::RequestId id, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return asked_.count(id) > 0; });
  }

  // Holds cancellations until the returned guard is released or destroyed (before the server: a server thread
  // waiting in cancel() would keep the server from stopping).
  class CancelHold {
   public:
    explicit CancelHold(EngineProbe& p) : p_(&p) { p_->set_held(true); }
    ~CancelHold() { release(); }
    CancelHold(const CancelHold&) = delete;
    CancelHold& operator=(const CancelHold&) = delete;
    void release() {
      if (p_) p_->set_held(false);
      p_ = nullptr;
    }

   private:
    EngineProbe* p_;
  };
  CancelHold hold_cancels() { return CancelHold(*this); }

 private:
  void set_held(bool held) {
    {
      std::lock_guard lock(mu_);
      cancels_held_ = held;
    }
    cv_.notify_all();
  }

  std::unique_ptr<engine::Engine> inner_;
  std::mutex submit_mu_, mu_;
  std::condition_variable cv_;
  std::vector<engine::RequestId> submitted_;
  std::set<engine::RequestId> asked_, cancelled_;
  bool cancels_held_ = false;
};

// The "type" of the error object the server sends with each status (server/openai.h).
inline std::string error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 404) return "not_found_error";
  if (status == 429 || status == 503) return "server_overloaded";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

// An answer that must be an OpenAI error object, {"error": {"message", "type", "param", "code"}}: this status, this
// code and param ("" for null), and a message that holds `fragment`.
inline void expect_error(int status, const std::string& body, int want_status, const std::string& code,
                         const std::string& param, const std::string& fragment = "") {
  EXPECT_EQ(status, want_status) << body;
  const auto j = nlohmann::json::parse(body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.size() == 1 && j.contains("error") && j["error"].is_object()) << body;
  const auto& e = j["error"];
  ASSERT_TRUE(e["message"].is_string()) << body;
  EXPECT_NE(e["message"].get<std::string>().find(fragment), std::string::npos) << body;
  EXPECT_EQ(e["type"], error_type(want_status)) << body;
  EXPECT_EQ(e["param"], param.empty() ? nlohmann::json() : nlohmann::json(param)) << body;
  EXPECT_EQ(e["code"], code.empty() ? nlohmann::json() : nlohmann::json(code)) << body;
}

// Holds every engine over a specialist's model (its own, and the mixtures it is part of) before their next step.
inline std::unique_lock<std::mutex> hold_engine(server::Specialist& s) {
  return std::unique_lock<std::mutex>(*s.model.in_use);
}

}  // namespace slm::test
