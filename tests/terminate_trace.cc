// Preloaded (LD_PRELOAD) into the processes of the Python and docs tests: when std::terminate
// runs, it writes the calling thread's native stack to stderr before libstdc++'s own message
// and the abort, so a CI log names the destructor or throw that ended a torch rank (a rank
// aborting with "terminate called without an active exception" is otherwise all a log shows).
#include <execinfo.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>

namespace {

std::terminate_handler g_previous = nullptr;

[[noreturn]] void TraceThenTerminate() {
  static const char kHead[] = "std::terminate called; native stack of the calling thread:\n";
  if (::write(2, kHead, sizeof kHead - 1) < 0) {
    // Nothing to do: stderr is gone.
  }
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, 2);
  if (g_previous) g_previous();
  std::abort();
}

__attribute__((constructor)) void Install() { g_previous = std::set_terminate(TraceThenTerminate); }

}  // namespace
