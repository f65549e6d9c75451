// A piece of code run with the synchronous fault signals caught, so a start-up probe of an
// instruction set can say "this faulted" and let the run choose another path instead of
// dying: an AMX tile instruction raises SIGILL where Linux has not granted the tile state and
// SIGSEGV (#GP) on a tile configuration the CPU does not take.
#pragma once

namespace minicp::kernels {

// Runs fn(arg) on the calling thread with SIGILL, SIGSEGV, SIGBUS and SIGFPE caught. Returns
// 0 when fn returned, else the signal that stopped it; the handlers in place before are back
// either way. A fault leaves fn by siglongjmp, so fn must own nothing with a destructor (plain
// data and calls only). One call at a time in a process (a mutex keeps it so); a fault on
// another thread meanwhile is not caught: it gets the signal's default action.
int run_catching_faults(void (*fn)(void*), void* arg);

// "SIGILL (illegal instruction)" and so on, for a message; "a signal" for one not caught here.
const char* fault_name(int sig);

}  // namespace minicp::kernels
