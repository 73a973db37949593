// Independent cross-check: /usr/bin/python3 with h5py reads compressed rank files (through
// the ckpt_h5zstd plugin, and independently through raw chunks + python zstandard) and must
// see exactly the bytes ckpt wrote and reads.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "ckpt/reader.h"
#include "ckpt_test_helpers.h"
#include "test_util.h"

using namespace ckpt;
using namespace ckpt::testing;

TEST_CASE("h5py reads compressed rank files with the values ckpt reads", "[io]") {
  if (!HaveH5pyCrosscheck()) {
    WARN("skipped: /usr/bin/python3 lacks h5py, numpy or zstandard");
    return;
  }
  const std::string comp = GENERATE(as<std::string>{}, "zstd:3", "zstd:5+shuffle", "none");
  ScratchDir d;
  Manifest m = SmallModel("global_step12", 2, 3);
  SaveOptions o;
  o.compression = Compression::Parse(comp).value();
  o.chunk_bytes = 64;  // many chunks and a partial edge chunk
  REQUIRE(SaveWithThreads(d.str(), m, o).ok());
  auto r = CheckpointReader::Open(d.str());
  REQUIRE(r.ok());
  // What ckpt reads, as raw files for the script.
  const std::string expect = d / "expect";
  std::filesystem::create_directories(expect);
  for (const auto& f : r->manifest().files) {
    for (const auto& ds : f.datasets) {
      auto bytes = r->ReadDatasetBytes(f.rank, ds.name);
      REQUIRE(bytes.ok());
      WriteExpected(expect, f.rank, ds.name, std::string(bytes->begin(), bytes->end()));
    }
  }
  CHECK(RunH5pyCrosscheck(d / "global_step12", expect) == 0);
}
