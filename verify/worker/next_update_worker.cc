// build/bin/next_update_worker DIR RANK: one process of a split `ckpt next-update` (started by
// it once per GPU or --procs process; verify/next_update.h, RunNextUpdateWorker).
#include "verify/next_update.h"

int main(int argc, char** argv) { return ckpt::verify::NextUpdateWorkerMain(argc, argv); }
