// SignalWatcher: turns SIGTERM and SIGINT into calls on a thread of its own.
//
// Construct it first thing in main(), before any thread starts: it blocks
// the signals in the calling thread, and threads created later inherit the
// mask, so the signals are only ever taken by the watcher's sigwait and no
// work runs inside a signal handler.
//
// Thread-safety: construct, Start and destroy from the main thread.

#ifndef EPS_CORE_SIGNAL_WATCHER_H_
#define EPS_CORE_SIGNAL_WATCHER_H_

#include <csignal>
#include <functional>
#include <thread>

namespace eps {

class SignalWatcher {
 public:
  SignalWatcher();
  // Stop()s.
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // Calls `on_signal(signal_number)` on the watcher's thread for every
  // SIGTERM or SIGINT received from now on.
  void Start(std::function<void(int)> on_signal);

  // Stops watching and joins the thread; call it before destroying what
  // `on_signal` touches. Idempotent.
  void Stop();

 private:
  sigset_t signals_;
  std::thread thread_;
};

}  // namespace eps

#endif  // EPS_CORE_SIGNAL_WATCHER_H_
