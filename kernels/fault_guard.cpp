#include "kernels/fault_guard.hpp"

#include <csetjmp>
#include <csignal>
#include <mutex>

namespace minicp::kernels {

namespace {
constexpr int kFaults[] = {SIGILL, SIGSEGV, SIGBUS, SIGFPE};
thread_local sigjmp_buf* t_armed = nullptr;            // this thread's return point while fn runs
thread_local volatile std::sig_atomic_t t_caught = 0;  // the signal that jumped back to it

void on_fault(int sig) {
  if (sigjmp_buf* back = t_armed) {
    t_armed = nullptr;
    t_caught = sig;
    siglongjmp(*back, 1);
  }
  // Another thread's fault: the default action, as if no handler had been installed.
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
}  // namespace

int run_catching_faults(void (*fn)(void*), void* arg) {
  static std::mutex one_at_a_time;
  const std::lock_guard<std::mutex> lock(one_at_a_time);
  struct sigaction caught = {}, before[4] = {};
  caught.sa_handler = on_fault;
  sigemptyset(&caught.sa_mask);
  for (int i = 0; i < 4; ++i) sigaction(kFaults[i], &caught, &before[i]);
  sigjmp_buf back;
  t_caught = 0;
  // savemask 1: the signal, blocked while its handler runs, is unblocked again on the jump.
  // (sigsetjmp compared with a constant: one of the uses the standard allows.)
  if (sigsetjmp(back, 1) == 0) {
    t_armed = &back;
    fn(arg);
  }
  t_armed = nullptr;
  for (int i = 0; i < 4; ++i) sigaction(kFaults[i], &before[i], nullptr);
  return t_caught;
}

const char* fault_name(int sig) {
  switch (sig) {
    case SIGILL: return "SIGILL (illegal instruction)";
    case SIGSEGV: return "SIGSEGV (segmentation fault or general protection)";
    case SIGBUS: return "SIGBUS (bus error)";
    case SIGFPE: return "SIGFPE (arithmetic exception)";
    default: return "a signal";
  }
}

}  // namespace minicp::kernels
