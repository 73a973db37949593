// libFuzzer target: the restricted unpickler (ckpt/torch_pickle.h), the parser every DeepSpeed
// `.pt` file goes through. Each input is a data.pkl record. Properties: parsing never crashes,
// never runs anything (there is nothing it could run), returns a value or a DataLoss error;
// every tensor it returns fits its storage; rendering the value as JSON (bounded depth) works
// on whatever came back, cycles included.
//
// CKPT_FUZZ_EXPECT_PARSE=1 makes an input that fails to parse abort: `tools/fuzz.sh` runs the
// seed corpus that way first, which shows the seeds (real torch.save pickles of DeepSpeed-layout
// files, from tests/deepspeed/make_ds_checkpoint.py) reach the parser and parse, so the fuzzer
// mutates inputs that get deep into it. The refused seed (refused_os_system) is kept apart in
// tests/fuzz/corpus/torch_pickle_refused/.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ckpt/torch_pickle.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool expect_parse = std::getenv("CKPT_FUZZ_EXPECT_PARSE") != nullptr;
  ckpt::PickleLimits limits;
  limits.max_values = 1u << 20;
  auto doc = ckpt::ParsePickle(
      std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.pkl", limits);
  if (!doc.ok()) {
    if (doc.status().code() != ckpt::StatusCode::kDataLoss) std::abort();
    ckpt_fuzz::RequireTerminalSafe(doc.status());  // the pickle's bytes escaped, if quoted
    if (expect_parse) {
      std::fprintf(stderr, "seed did not parse: %s\n", doc.status().ToString().c_str());
      std::abort();
    }
    return 0;
  }
  for (const auto& t : doc->tensors()) {
    if (t.storage_numel < 0 || t.offset < 0 || t.shape.size() != t.stride.size()) std::abort();
  }
  (void)ckpt::PyToJson(*doc, doc->root(), 12).dump();
  return 0;
}
