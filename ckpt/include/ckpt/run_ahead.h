// Overlapping a producer with a consumer: reads ahead of hashing (O_DIRECT reads), reads ahead
// of writes (export-fp32).
#pragma once

#include <cstdint>
#include <functional>

#include "ckpt/status.h"

namespace ckpt {

// Runs produce(i, slot) for i = 0 .. n-1 on `producers` helper threads, which claim the items
// in order, and consume(i, slot) for the same i in order on the calling thread; production runs
// at most `slots` items ahead: item i lives in slot i % slots (the caller owns the slots'
// storage) from the start of produce(i) to the end of consume(i). Several producers keep
// several requests in flight (a disk serves one stream of 8 MiB reads at about half the rate of
// two). The first error ends the run: a producer's error is returned once the items before it
// were consumed (no later item is claimed); a consumer's error stops the producers. When no
// thread can be started, or n is 1, the items are produced and consumed alternately on the
// calling thread. slots and producers below 1 count as 1.
Status RunAhead(uint64_t n, int slots, const std::function<Status(uint64_t i, int slot)>& produce,
                const std::function<Status(uint64_t i, int slot)>& consume, int producers = 1);

// As RunAhead; produce also gets the index of the producer running it, 0 .. producers - 1 (0
// on the calling thread), for state kept per producer thread (a zstd context).
Status RunAheadOnProducers(
    uint64_t n, int slots, const std::function<Status(uint64_t i, int slot, int producer)>& produce,
    const std::function<Status(uint64_t i, int slot)>& consume, int producers);

}  // namespace ckpt
