#include "jumbo/runtime/stop_signal.h"

#include <csignal>
#include <initializer_list>

namespace jumbo {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;

extern "C" void record_stop_signal(int signal) {
  if (g_stop_signal == 0) g_stop_signal = signal;
  // A person pressing Ctrl-C twice wants out now.
  if (signal == SIGINT) std::signal(SIGINT, SIG_DFL);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking reads and MPI progress carry on
  for (int signal : {SIGUSR1, SIGTERM, SIGINT}) sigaction(signal, &action, nullptr);
}

int stop_signal_received() { return g_stop_signal; }

void clear_stop_signal() { g_stop_signal = 0; }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

}  // namespace jumbo
