// Rank threads: running the ranks of a ThreadGroup (or any N workers) on threads of this
// process without an exception or a failed thread start aborting the whole process.
#pragma once

#include <functional>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/status.h"

namespace ckpt {

// Runs body(i) for i in [0, n) on n threads and joins them; results[i] is body(i)'s status.
// One body (n == 1) runs on the calling thread: no thread is started, so none can be refused.
// For rank threads: a failed allocation inside body(i) becomes ResourceExhausted (an escaping
// exception would abort the process, staging left behind), and a thread that cannot be started
// (EAGAIN under a memory limit) gives ResourceExhausted for it and every later i. Either way
// `group` (if given) is aborted, so the ranks already running stop waiting for the missing one.
std::vector<Status> RunOnThreads(int n, const std::function<Status(int)>& body,
                                 ThreadGroup* group = nullptr);

}  // namespace ckpt
