// libFuzzer target: the rank-file reader. A one-rank synthetic checkpoint is written once at
// start-up; each input replaces its rank_00000.h5 (the manifest is patched to the input's size
// with the file checksum left empty, so the reader gets past the size check and into HDF5),
// then the checkpoint is checked (ckpt::CheckCheckpoint, deep) and read the way a resume does
// (every dataset whole, with its XXH3; every parameter). Any outcome but a crash or a
// sanitizer report is fine: corrupt input must come back as an error value.
//
// CKPT_FUZZ_WRITE_SEEDS=DIR writes the fixture's rank file (uncompressed and zstd) into DIR
// and exits: how tests/fuzz/corpus/rank_file/none.h5 and zstd.h5 were made
// (`CKPT_FUZZ_WRITE_SEEDS=tests/fuzz/corpus/rank_file build-fuzz/bin/fuzz_rank_file`).
// none_chunked_legacy.h5 is an uncompressed file from before the contiguous layout (chunked
// tensors), which readers still accept.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/reader.h"
#include "ckpt/synth.h"

namespace {

struct Fixture {
  std::string dir;            // the tag directory
  nlohmann::json manifest;    // as written, for patching
};

std::string WriteRoot(const std::string& root, const char* compression) {
  ckpt::SynthOptions o;
  o.ranks = 1;
  o.params = 300;
  o.zero_stage = 2;
  o.chunk_bytes = 256;  // several chunks per tensor
  o.compression = ckpt::Compression::Parse(compression).value();
  auto tags = ckpt::WriteSynthetic(root, o);
  if (!tags.ok()) std::abort();
  return root + "/" + tags->front();
}

const Fixture& GetFixture() {
  static const Fixture f = [] {
    char tmpl[] = "/tmp/fuzz-rank-XXXXXX";
    const char* base = mkdtemp(tmpl);
    if (!base) std::abort();
    Fixture fx;
    fx.dir = WriteRoot(std::string(base) + "/root", "none");
    std::ifstream in(fx.dir + "/manifest.json");
    fx.manifest = nlohmann::json::parse(in);
    return fx;
  }();
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* out = std::getenv("CKPT_FUZZ_WRITE_SEEDS")) {
    std::filesystem::create_directories(out);
    for (const char* c : {"none", "zstd:1"}) {
      char tmpl[] = "/tmp/fuzz-seed-XXXXXX";
      const char* base = mkdtemp(tmpl);
      if (!base) std::abort();
      const std::string dir = WriteRoot(std::string(base) + "/root", c);
      std::filesystem::copy_file(dir + "/rank_00000.h5",
                                 std::string(out) + "/" + (c[0] == 'n' ? "none" : "zstd") + ".h5",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::remove_all(base);
    }
    std::exit(0);
  }
  GetFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& fx = GetFixture();
  {
    std::ofstream out(fx.dir + "/rank_00000.h5", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  nlohmann::json m = fx.manifest;
  m["files"][0]["bytes"] = size;
  m["files"][0]["xxh3"] = "";
  std::ofstream(fx.dir + "/manifest.json", std::ios::trunc) << m.dump();

  auto problems = ckpt::CheckCheckpoint(fx.dir, /*deep=*/true);
  (void)problems;
  auto reader = ckpt::CheckpointReader::Open(fx.dir);
  if (!reader.ok()) return 0;
  for (const auto& f : reader->manifest().files)
    for (const auto& d : f.datasets) (void)reader->ReadDatasetBytes(f.rank, d.name);
  for (const auto& p : reader->manifest().params) (void)reader->ReadParamFull(p.name);
  return 0;
}
