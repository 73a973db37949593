// libFuzzer target: the parsers of human input. The first byte picks the parser:
//   0 ckpt::ParseCount   1 ckpt::ParseByteSize   2 ckpt::Compression::Parse
//   3 the `latest` pointer (ckpt::ReadLatest / ResolveTagDir on a root holding one tag)
// Properties: Compression round-trips through ToString(); ReadLatest only ever returns a
// valid committed tag name.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "ckpt/root.h"
#include "ckpt/units.h"
#include "ckpt/writer.h"
#include "fuzz_util.h"

namespace {

// A root with one committed-looking tag directory (an empty manifest is enough for
// ReadLatest, which only checks that the named tag exists).
const std::string& FuzzRoot() {
  static const std::string root = [] {
    const std::string dir = ckpt_fuzz::TempDir("fuzz-latest");
    std::filesystem::create_directories(dir + "/global_step100");
    std::ofstream(dir + "/global_step100/manifest.json") << "{}";
    return dir;
  }();
  return root;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      auto n = ckpt::ParseCount(text);
      if (n.ok() && *n < 0) __builtin_trap();
      break;
    }
    case 1: {
      auto n = ckpt::ParseByteSize(text);
      (void)n;
      break;
    }
    case 2: {
      auto c = ckpt::Compression::Parse(text);
      if (c.ok()) {
        auto again = ckpt::Compression::Parse(c->ToString());
        if (!again.ok() || again->ToString() != c->ToString()) __builtin_trap();
      }
      break;
    }
    case 3: {
      const std::string& root = FuzzRoot();
      ckpt_fuzz::WriteFile(root + "/latest", text.data(), text.size());
      auto tag = ckpt::ReadLatest(root);
      if (tag.ok()) {
        if (tag->empty() || tag->find('/') != std::string::npos || (*tag)[0] == '.')
          __builtin_trap();
        if (!std::filesystem::is_directory(root + "/" + *tag)) __builtin_trap();
      }
      auto dir = ckpt::ResolveTagDir(root);
      (void)dir;
      break;
    }
  }
  return 0;
}
