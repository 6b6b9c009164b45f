#include "core/signal_watcher.h"

#include <pthread.h>

namespace eps {

// SIGUSR2 is the watcher's private wake-up call at destruction.
SignalWatcher::SignalWatcher() {
  sigemptyset(&signals_);
  sigaddset(&signals_, SIGTERM);
  sigaddset(&signals_, SIGINT);
  sigaddset(&signals_, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
}

SignalWatcher::~SignalWatcher() { Stop(); }

void SignalWatcher::Stop() {
  if (!thread_.joinable()) return;
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

void SignalWatcher::Start(std::function<void(int)> on_signal) {
  thread_ = std::thread([this, on_signal = std::move(on_signal)] {
    while (true) {
      int signal = 0;
      if (sigwait(&signals_, &signal) != 0) continue;
      if (signal == SIGUSR2) return;
      on_signal(signal);
    }
  });
}

}  // namespace eps
