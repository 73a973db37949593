// Corruption suite: for each file kind (manifest.json, rank HDF5, latest, the safetensors export,
// the universal checkpoint) flip bytes at many offsets, truncate at many lengths, delete,
// replace with another tag's file and give a wrong format version. Each case is judged:
//   detected  the deep check reports a problem (`ckpt check --deep` exit 1, naming the file and,
//             for damage inside a dataset, the dataset);
//   refused   opening or loading fails with an error value (`ckpt check` / loaders exit 2);
//   benign    everything loads and equals what was saved (e.g. a dropped trailing newline);
//   other     `latest` names another committed tag (a valid pointer: nothing to detect);
//   silent    everything loads but differs from what was saved: a failure.
// A crash, sanitizer report or hang fails the test binary itself. Every 7th case is also run
// through the CLI (`ckpt check --deep`) to check its exit code and that it names the file.
// The counts are printed; docs/reliability.md records them.
#include <catch2/catch.hpp>

#include <hdf5.h>

#include <cstdio>
#include <map>
#include <random>

#include "ckpt/hash.h"
#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "ckpt/state_source.h"
#include "convert/export.h"
#include "safetensors/safetensors.h"
#include "convert/universal.h"
#include "manifest_util.h"
#include "reliability_util.h"

using namespace ckpt;
using namespace ckpt::reliability;
using ckpt::testing::ResealFile;
using ckpt::testing::ScratchDir;
using ckpt::testing::SealedText;

namespace {

enum class Outcome { kDetected, kRefused, kBenign, kOther, kSilent };
const char* Name(Outcome o) {
  switch (o) {
    case Outcome::kDetected: return "detected";
    case Outcome::kRefused: return "refused";
    case Outcome::kBenign: return "benign";
    case Outcome::kOther: return "other-tag";
    case Outcome::kSilent: return "SILENT";
  }
  return "?";
}

}  // namespace

namespace Catch {
template <>
struct StringMaker<Outcome> {
  static std::string convert(Outcome o) { return Name(o); }
};
}  // namespace Catch

namespace {

struct Verdict {
  Outcome outcome = Outcome::kSilent;
  std::string detail;
  std::vector<Problem> problems;
};

struct Tally {
  std::map<std::string, std::map<std::string, int>> by_kind;  // kind -> outcome -> count
  std::vector<std::string> silent;
  int cli_runs = 0;
  void Add(const std::string& kind, const std::string& what, const Verdict& v) {
    ++by_kind[kind][Name(v.outcome)];
    ++by_kind[kind]["cases"];
    if (v.outcome == Outcome::kSilent) silent.push_back(kind + ": " + what + ": " + v.detail);
  }
  void Print(const char* title) const {
    std::printf("corruption suite (%s):\n", title);
    for (const auto& [kind, counts] : by_kind) {
      std::printf("  %-28s", kind.c_str());
      for (const auto& [k, n] : counts) std::printf(" %s=%d", k.c_str(), n);
      std::printf("\n");
    }
    std::printf("  CLI cross-checks: %d\n", cli_runs);
    for (const auto& s : silent) std::printf("  silent: %s\n", s.c_str());
  }
};

// What a sharded checkpoint held when it was written: its manifest and every dataset.
struct ShardedReference {
  std::string tag;
  nlohmann::json manifest;
  std::map<std::pair<int, std::string>, std::vector<uint8_t>> datasets;
};

ShardedReference CaptureSharded(const std::string& root) {
  auto r = CheckpointReader::Open(root);
  REQUIRE(r.ok());
  ShardedReference ref;
  ref.tag = r->tag();
  ref.manifest = ManifestToJson(r->manifest());
  for (const auto& f : r->manifest().files)
    for (const auto& d : f.datasets) ref.datasets[{f.rank, d.name}] = r->ReadDatasetBytes(f.rank, d.name).value();
  return ref;
}

Verdict JudgeSharded(const std::string& root, const ShardedReference& ref) {
  auto dir = ResolveTagDir(root);
  if (!dir.ok()) {
    return {dir.status().code() == StatusCode::kDataLoss ? Outcome::kDetected : Outcome::kRefused,
            dir.status().ToString(), {{"latest", "", dir.status().message()}}};
  }
  auto problems = CheckCheckpoint(*dir, /*deep=*/true);
  if (!problems.ok()) return {Outcome::kRefused, problems.status().ToString(), {}};
  if (!problems->empty()) return {Outcome::kDetected, (*problems)[0].file + " " + (*problems)[0].what, *problems};
  // The deep check passed: the checkpoint must load and hold exactly what was saved.
  auto r = CheckpointReader::Open(*dir);
  if (!r.ok()) return {Outcome::kRefused, "load: " + r.status().ToString(), {}};
  if (r->tag() != ref.tag) return {Outcome::kOther, "latest names " + r->tag(), {}};
  if (ManifestToJson(r->manifest()) != ref.manifest) {
    nlohmann::json diff = nlohmann::json::diff(ref.manifest, ManifestToJson(r->manifest()));
    return {Outcome::kSilent, "manifest loads with different content: " + diff.dump().substr(0, 160), {}};
  }
  for (const auto& [key, bytes] : ref.datasets) {
    auto got = r->ReadDatasetBytes(key.first, key.second);
    if (!got.ok()) return {Outcome::kRefused, "load: " + got.status().ToString(), {}};
    if (*got != bytes) return {Outcome::kSilent, "dataset " + key.second + " differs", {}};
  }
  for (const auto& p : r->manifest().params) {
    auto v = r->ReadParamFull(p.name);
    if (!v.ok()) return {Outcome::kRefused, "load: " + v.status().ToString(), {}};
  }
  return {Outcome::kBenign, "", {}};
}

// Where each dataset's bytes lie in an HDF5 file: [begin, end) per stored chunk.
struct Region {
  uint64_t begin, end;
  std::string dataset;
};

herr_t CollectDatasets(hid_t obj, const char* name, const H5O_info_t* info, void* op) {
  if (info->type == H5O_TYPE_DATASET && std::string(name) != ".")
    static_cast<std::vector<std::string>*>(op)->push_back(name);
  return 0;
}

std::vector<Region> DataRegions(const std::string& path) {
  std::vector<Region> out;
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  std::vector<std::string> names;
  H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, CollectDatasets, &names, H5O_INFO_BASIC);
  for (const auto& name : names) {
    hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
    hid_t dcpl = H5Dget_create_plist(d);
    if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
      hsize_t n = 0;
      H5Dget_num_chunks(d, H5S_ALL, &n);
      for (hsize_t i = 0; i < n; ++i) {
        hsize_t offset[8];
        unsigned mask = 0;
        haddr_t addr = 0;
        hsize_t size = 0;
        if (H5Dget_chunk_info(d, H5S_ALL, i, offset, &mask, &addr, &size) >= 0 && size > 0)
          out.push_back({addr, addr + size, name});
      }
    } else {
      haddr_t addr = H5Dget_offset(d);
      hsize_t size = H5Dget_storage_size(d);
      if (addr != HADDR_UNDEF && size > 0) out.push_back({addr, addr + size, name});
    }
    H5Pclose(dcpl);
    H5Dclose(d);
  }
  H5Fclose(f);
  return out;
}

// Rewrites a fixed-length string attribute of the file root in place (same length).
void RewriteRootAttr(const std::string& path, const char* attr, const std::string& value) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  hid_t a = H5Aopen(f, attr, H5P_DEFAULT);
  REQUIRE(a >= 0);
  hid_t t = H5Aget_type(a);
  std::string padded = value;
  padded.resize(H5Tget_size(t), '\0');
  REQUIRE(H5Awrite(a, t, padded.data()) >= 0);
  H5Tclose(t);
  H5Aclose(a);
  H5Fclose(f);
}

// Offsets spread over [0, size): `n` evenly spaced (jittered) plus the first 16 bytes.
std::vector<uint64_t> SpreadOffsets(uint64_t size, int n, std::mt19937_64& rng) {
  std::vector<uint64_t> out;
  for (uint64_t i = 0; i < std::min<uint64_t>(16, size); ++i) out.push_back(i);
  for (int i = 0; i < n; ++i) {
    uint64_t base = size * static_cast<uint64_t>(i) / static_cast<uint64_t>(n);
    uint64_t span = std::max<uint64_t>(1, size / static_cast<uint64_t>(n));
    out.push_back(std::min(size - 1, base + rng() % span));
  }
  return out;
}

// `ckpt check --deep` must agree with the in-process verdict and name the damaged file.
void CrossCheckCli(const std::string& root, const Verdict& v, const std::string& file,
                   Tally& tally) {
  std::string out;
  const int rc = RunCli("check --deep " + root, &out);
  ++tally.cli_runs;
  INFO("ckpt check --deep " << root << " -> " << rc << "\n" << out);
  REQUIRE(rc >= 0);  // no crash, no hang
  switch (v.outcome) {
    case Outcome::kDetected:
      CHECK(rc == 1);
      CHECK(out.find(file) != std::string::npos);
      break;
    case Outcome::kRefused: CHECK((rc == 1 || rc == 2)); break;
    default: CHECK(rc == 0);
  }
}

// Runs one sharded case: restore the pristine root, mutate, judge, check the expectations.
class ShardedCases {
 public:
  ShardedCases(std::string pristine, std::string work, ShardedReference ref, Tally& tally)
      : pristine_(std::move(pristine)), work_(std::move(work)), ref_(std::move(ref)), tally_(tally) {}

  const std::string& work() const { return work_; }
  std::string TagDir() const { return work_ + "/" + ref_.tag; }

  // mutate(root) damages `file` (relative to the root); `dataset`: the dataset the damage lies
  // in (must then be named), empty when none in particular.
  template <typename Fn>
  Verdict Run(const std::string& kind, const std::string& what, const std::string& file,
              Fn mutate, const std::string& dataset = "") {
    CopyTree(pristine_, work_);
    mutate(work_);
    Verdict v = JudgeSharded(work_, ref_);
    tally_.Add(kind, what, v);
    last_ = kind + ": " + what + " -> " + Name(v.outcome) + ": " + v.detail;
    INFO(last_);
    const std::string base = std::filesystem::path(file).filename().string();
    if (v.outcome == Outcome::kDetected && base != "latest" && base != "manifest.json") {
      bool file_named = false, dataset_named = dataset.empty();
      for (const auto& p : v.problems) {
        file_named |= p.file == base;
        dataset_named |= p.file == base && p.dataset == dataset;
      }
      CHECK(file_named);
      CHECK(dataset_named);
    }
    if (++n_ % 7 == 0) CrossCheckCli(work_, v, base, tally_);
    return v;
  }

  const std::string& last() const { return last_; }

 private:
  std::string pristine_, work_, last_;
  ShardedReference ref_;
  Tally& tally_;
  int n_ = 0;
};

void FlipByte(const std::string& path, uint64_t offset, uint8_t mask) {
  std::string s = Slurp(path);
  s[offset] = static_cast<char>(static_cast<uint8_t>(s[offset]) ^ mask);
  Spit(path, s);
}

void Truncate(const std::string& path, uint64_t len) { std::filesystem::resize_file(path, len); }

// Reads every element of a dataset through CheckpointReader::ReadSlice (1-D datasets; others
// whole through ReadDataset).
Status SliceReadAll(const std::string& root, int rank, const std::string& dataset) {
  auto r = CheckpointReader::Open(root);
  if (!r.ok()) return r.status();
  const DatasetRecord* d = r->manifest().FindDataset(rank, dataset);
  if (!d) return NotFound(dataset);
  std::vector<uint8_t> buf(d->bytes);
  if (d->shape.size() != 1) return r->ReadDataset(rank, dataset, buf.data(), buf.size());
  return r->ReadSlice(rank, dataset, 0, d->shape[0], buf.data());
}

// The rank files, manifest and latest of one sharded root.
// A CHECK on the verdict of the case just run, printing which case it was.
#define EXPECT_CASE(cond) \
  do {                    \
    INFO(cases.last());   \
    CHECK(cond);          \
  } while (0)

void RunShardedSuite(const char* compression, int zero, Tally& tally, bool strict_manifest_bits) {
  ScratchDir d("ckpt-corrupt");
  const std::string pristine = d / "pristine";
  auto tags = WriteSmallRoot(pristine, 2, zero, compression);
  const std::string latest_tag = tags.back(), older_tag = tags.front();
  ShardedCases cases(pristine, d / "work", CaptureSharded(pristine), tally);
  std::mt19937_64 rng(0xC0FFEE + static_cast<uint64_t>(zero));
  const std::string label = std::string(" (") + compression + ", ZeRO-" + std::to_string(zero) + ")";

  // --- rank files -----------------------------------------------------------------------
  for (int rank = 0; rank < 2; ++rank) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "rank_%05d.h5", rank);
    const std::string rel = latest_tag + "/" + buf;
    const std::string kind = "rank file" + label;
    const uint64_t size = std::filesystem::file_size(pristine + "/" + rel);
    for (uint64_t off : SpreadOffsets(size, 48, rng)) {
      const uint8_t mask = static_cast<uint8_t>(1u << (rng() % 8));
      Verdict v = cases.Run(kind, "flip bit at " + std::to_string(off), rel,
                            [&](const std::string& w) { FlipByte(w + "/" + rel, off, mask); });
      EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
    }
    // One flip inside every stored chunk of every dataset: the dataset must be named.
    for (const Region& reg : DataRegions(pristine + "/" + rel)) {
      const uint64_t off = reg.begin + (reg.end - reg.begin) / 2;
      Verdict v = cases.Run(kind, "flip inside " + reg.dataset + " at " + std::to_string(off), rel,
                            [&](const std::string& w) { FlipByte(w + "/" + rel, off, 0x10); },
                            reg.dataset);
      EXPECT_CASE(v.outcome == Outcome::kDetected);
      // Format 1.3: a slice read of the whole 1-D dataset catches it too (by its pieces, or,
      // compressed, by the chunk's decompression), without a whole-dataset digest.
      const Status slice = SliceReadAll(cases.work(), rank, reg.dataset);
      INFO(cases.last() << "; slice read: " << slice.ToString());
      CHECK(slice.code() == StatusCode::kDataLoss);
    }
    for (int i = 0; i <= 24; ++i) {
      const uint64_t len = i == 24 ? size - 1 : size * static_cast<uint64_t>(i) / 24;
      Verdict v = cases.Run(kind, "truncate to " + std::to_string(len), rel,
                            [&](const std::string& w) { Truncate(w + "/" + rel, len); });
      EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
    }
    Verdict v = cases.Run(kind, "delete", rel,
                          [&](const std::string& w) { std::filesystem::remove(w + "/" + rel); });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    v = cases.Run(kind, "replace with " + older_tag + "'s file", rel, [&](const std::string& w) {
      std::filesystem::copy_file(w + "/" + older_tag + "/" + buf, w + "/" + rel,
                                 std::filesystem::copy_options::overwrite_existing);
    });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    char other[32];
    std::snprintf(other, sizeof other, "rank_%05d.h5", 1 - rank);
    v = cases.Run(kind, std::string("replace with ") + other, rel, [&](const std::string& w) {
      std::filesystem::copy_file(w + "/" + latest_tag + "/" + other, w + "/" + rel,
                                 std::filesystem::copy_options::overwrite_existing);
    });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    v = cases.Run(kind, "format_version attribute 2.0", rel, [&](const std::string& w) {
      RewriteRootAttr(w + "/" + rel, "format_version", "2.0");
    });
    EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
    v = cases.Run(kind, "appended garbage", rel, [&](const std::string& w) {
      std::ofstream(w + "/" + rel, std::ios::app | std::ios::binary) << "garbage";
    });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
  }

  // --- manifest.json ----------------------------------------------------------------------
  {
    const std::string rel = latest_tag + "/manifest.json";
    const std::string text = Slurp(pristine + "/" + rel);
    const uint64_t size = text.size();
    const std::string kind_bytes = "manifest byte flip" + label;
    const std::string kind_bits = "manifest bit flip" + label;
    const std::string kind = "manifest" + label;
    for (uint64_t off : SpreadOffsets(size, 64, rng)) {
      Verdict v = cases.Run(kind_bytes, "invert byte at " + std::to_string(off), rel,
                            [&](const std::string& w) { FlipByte(w + "/" + rel, off, 0xFF); });
      EXPECT_CASE(v.outcome != Outcome::kSilent);
      const uint8_t mask = static_cast<uint8_t>(1u << (rng() % 7));  // stays ASCII
      v = cases.Run(kind_bits, "flip bit " + std::to_string(mask) + " at " + std::to_string(off) +
                                   " ('" + text[off] + "')",
                    rel, [&](const std::string& w) { FlipByte(w + "/" + rel, off, mask); });
      if (strict_manifest_bits) EXPECT_CASE(v.outcome != Outcome::kSilent);
    }
    for (int i = 0; i <= 32; ++i) {
      const uint64_t len = i == 32 ? size - 1 : size * static_cast<uint64_t>(i) / 32;
      Verdict v = cases.Run(kind, "truncate to " + std::to_string(len), rel,
                            [&](const std::string& w) { Truncate(w + "/" + rel, len); });
      EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused ||
             v.outcome == Outcome::kBenign));
    }
    Verdict v = cases.Run(kind, "delete", rel,
                          [&](const std::string& w) { std::filesystem::remove(w + "/" + rel); });
    EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
    v = cases.Run(kind, "replace with " + older_tag + "'s manifest", rel, [&](const std::string& w) {
      std::filesystem::copy_file(w + "/" + older_tag + "/manifest.json", w + "/" + rel,
                                 std::filesystem::copy_options::overwrite_existing);
    });
    EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
    for (const char* version : {"2.0", "99.1", "x", ""}) {
      v = cases.Run(kind, std::string("format_version '") + version + "'", rel,
                    [&](const std::string& w) {
                      auto j = nlohmann::json::parse(Slurp(w + "/" + rel));
                      j["format_version"] = version;
                      Spit(w + "/" + rel, j.dump(2));
                    });
      EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
      if (std::string(version) == "2.0") {
        std::string out;
        CHECK(RunCli("inspect " + cases.work(), &out) == 2);
        CHECK(out.find("upgrade ckpt") != std::string::npos);
      }
    }
    v = cases.Run(kind, "format 'safetensors'", rel, [&](const std::string& w) {
      auto j = nlohmann::json::parse(Slurp(w + "/" + rel));
      j["format"] = "safetensors";
      Spit(w + "/" + rel, j.dump(2));
    });
    EXPECT_CASE((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
  }

  // --- latest -----------------------------------------------------------------------------
  {
    const std::string rel = "latest";
    const std::string kind = "latest" + label;
    const uint64_t size = Slurp(pristine + "/latest").size();
    for (uint64_t off = 0; off < size; ++off) {
      for (uint8_t mask : {uint8_t{0xFF}, static_cast<uint8_t>(1u << (rng() % 8))}) {
        Verdict v = cases.Run(kind, "flip " + std::to_string(mask) + " at " + std::to_string(off), rel,
                              [&](const std::string& w) { FlipByte(w + "/latest", off, mask); });
        EXPECT_CASE(v.outcome != Outcome::kSilent);
      }
    }
    for (uint64_t len = 0; len < size; ++len) {
      Verdict v = cases.Run(kind, "truncate to " + std::to_string(len), rel,
                            [&](const std::string& w) { Truncate(w + "/latest", len); });
      EXPECT_CASE(v.outcome != Outcome::kSilent);
    }
    Verdict v = cases.Run(kind, "delete", rel,
                          [&](const std::string& w) { std::filesystem::remove(w + "/latest"); });
    // Without the pointer, readers resolve the newest committed tag, which is what `latest`
    // named here (docs/format.md: a first save killed before writing `latest`).
    EXPECT_CASE(v.outcome == Outcome::kBenign);
    v = cases.Run(kind, "names a tag that does not exist", rel,
                  [&](const std::string& w) { Spit(w + "/latest", "global_step999\n"); });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    v = cases.Run(kind, "names a temporary directory", rel, [&](const std::string& w) {
      std::filesystem::create_directories(w + "/.tmp-global_step300-abc");
      Spit(w + "/latest", ".tmp-global_step300-abc\n");
    });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    v = cases.Run(kind, "names ../ outside the root", rel,
                  [&](const std::string& w) { Spit(w + "/latest", "../pristine/" + latest_tag + "\n"); });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    v = cases.Run(kind, "binary garbage", rel,
                  [&](const std::string& w) { Spit(w + "/latest", std::string("\0\xff\x01\n", 4)); });
    EXPECT_CASE(v.outcome == Outcome::kDetected);
    // A newer committed tag exists, so readers resolve it (docs/format.md, "Commit point": a
    // save killed after its tag rename); a deliberate rollback is `ckpt rollback`.
    v = cases.Run(kind, "names the older committed tag", rel,
                  [&](const std::string& w) { Spit(w + "/latest", older_tag + "\n"); });
    EXPECT_CASE(v.outcome == Outcome::kBenign);
  }
}

// --- universal checkpoint -------------------------------------------------------------------
struct UniversalReference {
  nlohmann::json manifest;
  std::map<std::string, std::vector<uint8_t>> datasets;
};

// The reader opens the directory (manifest, file size, format attributes: a refusal), then the
// deep check it gets, `ckpt check --deep` (CheckSource: one pass over the file for the
// whole-file XXH3 and every dataset's against the manifest). When it passes, a loader's view.
Verdict JudgeUniversal(const std::string& dir, const UniversalReference* ref) {
  auto r = UniversalReader::Open(dir);
  if (!r.ok()) return {Outcome::kRefused, r.status().ToString(), {}};
  auto check = CheckSource(dir, "", /*deep=*/true);
  if (!check.ok()) return {Outcome::kRefused, check.status().ToString(), {}};
  if (!check->problems.empty()) {
    const Problem& p = check->problems.front();
    return {Outcome::kDetected, p.file + " " + p.dataset + " " + p.what, check->problems};
  }
  if (!ref) return {Outcome::kBenign, "", {}};
  if (ManifestToJson(r->manifest()) != ref->manifest)
    return {Outcome::kSilent, "manifest loads with different content", {}};
  for (const auto& [name, bytes] : ref->datasets) {
    auto got = r->ReadDatasetBytes(name);
    if (!got.ok()) return {Outcome::kRefused, got.status().ToString(), {}};
    if (*got != bytes) return {Outcome::kSilent, name + " differs", {}};
  }
  return {Outcome::kBenign, "", {}};
}

// --- safetensors export ----------------------------------------------------------------------
struct SafetensorsReference {
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::vector<uint8_t>> tensors;
};

SafetensorsReference CaptureSafetensors(const std::string& path) {
  auto h = safetensors::ReadSafetensorsHeader(path);
  REQUIRE(h.ok());
  SafetensorsReference ref;
  ref.metadata = h->metadata;
  for (const auto& t : h->tensors)
    ref.tensors[t.name] = safetensors::ReadSafetensorsTensor(path, *h, t.name).value();
  return ref;
}

// An export's reference: every file's tensors, read before any damage.
using ExportReference = std::map<std::string, SafetensorsReference>;  // file -> its content

ExportReference CaptureExport(const std::string& dir) {
  ExportReference ref;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors")
      ref[e.path().filename().string()] = CaptureSafetensors(e.path().string());
  return ref;
}

// `ckpt check --deep --tag TAG` (CheckExport) first: problems = detected, could not run =
// refused. When it passes, a loader's view: every file's header parses (verifying its digest),
// every tensor reads back (verifying its digest) and must equal what was exported.
Verdict JudgeExport(const std::string& dir, const std::string& tag, const ExportReference& ref) {
  convert::CheckExportOptions opts;
  opts.deep = true;
  opts.expected_tag = tag;
  auto check = convert::CheckExport(dir, opts);
  if (!check.ok()) return {Outcome::kRefused, check.status().ToString(), {}};
  if (!check->problems.empty()) {
    const Problem& p = check->problems.front();
    return {Outcome::kDetected, p.file + " " + p.dataset + " " + p.what, check->problems};
  }
  for (const auto& [file, fref] : ref) {
    const std::string path = dir + "/" + file;
    auto h = safetensors::ReadSafetensorsHeader(path);
    if (!h.ok()) return {Outcome::kRefused, h.status().ToString(), {}};
    if (h->tensors.size() != fref.tensors.size())
      return {Outcome::kSilent, file + ": tensor count differs", {}};
    for (const auto& [name, bytes] : fref.tensors) {
      if (!h->Find(name)) return {Outcome::kSilent, file + ": tensor " + name + " renamed", {}};
      auto got = safetensors::ReadSafetensorsTensor(path, *h, name);
      if (!got.ok()) return {Outcome::kRefused, got.status().ToString(), {}};
      if (*got != bytes) return {Outcome::kSilent, file + ": tensor " + name + " bytes differ", {}};
    }
    if (h->metadata != fref.metadata) return {Outcome::kSilent, file + ": __metadata__ differs", {}};
  }
  return {Outcome::kBenign, "", {}};
}

void RunConvertSuite(Tally& tally) {
  ScratchDir d("ckpt-corrupt-conv");
  const std::string root = d / "root";
  auto tags = WriteSmallRoot(root, 2, 3, "zstd:1");
  std::mt19937_64 rng(4242);

  // Universal: both files.
  const std::string uni = d / "universal", uni_old = d / "universal-old", work = d / "uwork";
  REQUIRE(convert::ConvertToUniversal(root, uni).ok());
  convert::ToUniversalOptions old_opts;
  old_opts.tag = tags.front();
  REQUIRE(convert::ConvertToUniversal(root, uni_old, old_opts).ok());
  UniversalReference uref;
  {
    auto r = UniversalReader::Open(uni);
    REQUIRE(r.ok());
    uref.manifest = ManifestToJson(r->manifest());
    for (const auto& ds : r->manifest().files.at(0).datasets)
      uref.datasets[ds.name] = r->ReadDatasetBytes(ds.name).value();
  }
  REQUIRE(JudgeUniversal(uni, &uref).outcome == Outcome::kBenign);
  int n_uni = 0;
  auto run_uni = [&](const std::string& kind, const std::string& what, auto mutate) {
    CopyTree(uni, work);
    mutate(work);
    Verdict v = JudgeUniversal(work, &uref);
    tally.Add(kind, what, v);
    if (++n_uni % 7 == 0) {
      // `ckpt export-fp32` of a damaged universal directory must fail (exit 1 or 2), or succeed
      // only when nothing it reads was damaged.
      std::string out;
      const int rc = RunCli("export-fp32 " + work + " " + d / ("uexp" + std::to_string(n_uni)), &out);
      ++tally.cli_runs;
      INFO(what << ": export-fp32 exit " << rc << "\n" << out);
      CHECK(rc >= 0);
    }
    return v;
  };
  for (const char* file : {"universal.h5", "manifest.json"}) {
    const std::string kind = std::string("universal ") + file;
    const uint64_t size = std::filesystem::file_size(uni + "/" + file);
    for (uint64_t off : SpreadOffsets(size, 48, rng)) {
      const uint8_t mask = file[0] == 'u' ? static_cast<uint8_t>(1u << (rng() % 8)) : 0xFF;
      Verdict v = run_uni(kind, "flip " + std::to_string(mask) + " at " + std::to_string(off),
                          [&](const std::string& w) { FlipByte(w + "/" + file, off, mask); });
      INFO(kind << " flip at " << off << ": " << v.detail);
      CHECK((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
      if (file[0] == 'm') {  // ASCII bit flips keep the JSON valid; manifest_xxh3 catches them
        const uint8_t bit = static_cast<uint8_t>(1u << (rng() % 7));
        v = run_uni("universal manifest.json bit flip", "flip bit " + std::to_string(bit) + " at " + std::to_string(off),
                    [&](const std::string& w) { FlipByte(w + "/" + file, off, bit); });
        CHECK((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
      }
    }
    for (int i = 0; i <= 16; ++i) {
      const uint64_t len = i == 16 ? size - 1 : size * static_cast<uint64_t>(i) / 16;
      Verdict v = run_uni(kind, "truncate to " + std::to_string(len),
                          [&](const std::string& w) { Truncate(w + "/" + file, len); });
      INFO(kind << " truncate to " << len << ": " << v.detail);
      CHECK((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused ||
             (file[0] == 'm' && v.outcome == Outcome::kBenign)));
    }
    Verdict v = run_uni(kind, "delete", [&](const std::string& w) { std::filesystem::remove(w + "/" + file); });
    CHECK(v.outcome == Outcome::kRefused);
    v = run_uni(kind, "replace with " + tags.front() + "'s", [&](const std::string& w) {
      std::filesystem::copy_file(uni_old + "/" + file, w + "/" + file,
                                 std::filesystem::copy_options::overwrite_existing);
    });
    CHECK((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused));
  }
  for (const auto& [what, mutate] :
       std::vector<std::pair<std::string, std::function<void(const std::string&)>>>{
           {"universal.h5 format_version 2.0 (manifest resealed to match)",
            [](const std::string& w) {
              RewriteRootAttr(w + "/universal.h5", "format_version", "2.0");
              ResealFile(w, 0);
            }},
           {"manifest format_version 2.0 (resealed)",
            [](const std::string& w) {
              auto j = nlohmann::json::parse(Slurp(w + "/manifest.json"));
              j["format_version"] = "2.0";
              Spit(w + "/manifest.json", SealedText(j));
            }},
           {"manifest kind sharded (resealed)",
            [](const std::string& w) {
              auto j = nlohmann::json::parse(Slurp(w + "/manifest.json"));
              j["kind"] = "sharded";
              Spit(w + "/manifest.json", SealedText(j));
            }}}) {
    Verdict v = run_uni("universal version/kind", what, mutate);
    INFO(what << ": " << v.detail);
    CHECK(v.outcome == Outcome::kRefused);
    // Refused for what was changed (a newer version; a sharded manifest's one file for two
    // ranks), not by a checksum the edit broke.
    CHECK(v.detail.find("checksum") == std::string::npos);
    CHECK(v.detail.find(what.find("kind") != std::string::npos ? "rank files listed" : "2.0") !=
          std::string::npos);
  }

  // Safetensors exports: one file, and sharded (several files + index).
  const std::string exp = d / "export", exp_old = d / "export-old";
  const std::string shd = d / "sharded", shd_old = d / "sharded-old", ework = d / "ework";
  REQUIRE(convert::ExportFp32(root, exp).ok());
  convert::ExportOptions eo;
  eo.tag = tags.front();
  REQUIRE(convert::ExportFp32(root, exp_old, eo).ok());
  convert::ExportOptions so;
  so.max_shard_bytes = 4000;
  REQUIRE(convert::ExportFp32(root, shd, so).ok());
  so.tag = tags.front();
  REQUIRE(convert::ExportFp32(root, shd_old, so).ok());
  const std::string tag = tags.back();
  const std::string st_rel = "model.safetensors", st = exp + "/" + st_rel;
  const ExportReference sref = CaptureExport(exp), shref = CaptureExport(shd);
  REQUIRE(JudgeExport(exp, tag, sref).outcome == Outcome::kBenign);
  REQUIRE(JudgeExport(shd, tag, shref).outcome == Outcome::kBenign);
  auto header = safetensors::ReadSafetensorsHeader(st).value();
  REQUIRE(header.checksummed);
  const uint64_t size = std::filesystem::file_size(st);
  int n_exp = 0;
  // Every 7th case also through the CLI: exit 1 naming the file when detected, 2 when refused.
  auto run_export = [&](const std::string& src, const ExportReference& ref, const std::string& kind,
                        const std::string& what, auto mutate) {
    CopyTree(src, ework);
    mutate(ework);
    Verdict v = JudgeExport(ework, tag, ref);
    tally.Add(kind, what, v);
    if (++n_exp % 7 == 0) {
      std::string out;
      const int rc = RunCli("check --deep --tag " + tag + " " + ework, &out);
      ++tally.cli_runs;
      INFO(kind << " " << what << ": ckpt check exit " << rc << "\n" << out);
      if (v.outcome == Outcome::kDetected) {
        CHECK(rc == 1);
        CHECK(out.find(v.problems.front().file) != std::string::npos);
      } else if (v.outcome == Outcome::kRefused) {
        CHECK(rc == 2);
      } else {
        CHECK(rc == 0);
      }
    }
    INFO(kind << " " << what << ": " << v.detail);
    // Another tag's index is byte-identical when the shard layout is the same (it names files
    // and tensors, not values): loading then gives exactly what was exported.
    const bool same_index = kind == "sharded index.json" && what.rfind("replace with", 0) == 0 &&
                            Slurp(src + "/model.safetensors.index.json") ==
                                Slurp(ework + "/model.safetensors.index.json");
    CHECK((v.outcome == Outcome::kDetected || v.outcome == Outcome::kRefused ||
           (same_index && v.outcome == Outcome::kBenign)));
    return v;
  };
  auto run_st = [&](const std::string& kind, const std::string& what, auto mutate) {
    return run_export(exp, sref, kind, what,
                      [&](const std::string& w) { mutate(w + "/" + st_rel); });
  };
  for (uint64_t off = 0; off < 8; ++off) {
    run_st("safetensors length field", "flip at " + std::to_string(off),
           [&](const std::string& p) { FlipByte(p, off, static_cast<uint8_t>(1u << (rng() % 8))); });
  }
  for (uint64_t off : SpreadOffsets(header.data_start - 8, 64, rng)) {
    run_st("safetensors JSON header", "invert byte at " + std::to_string(8 + off),
           [&](const std::string& p) { FlipByte(p, 8 + off, 0xFF); });
  }
  for (uint64_t off : SpreadOffsets(header.data_start - 8, 96, rng)) {
    // Bit flips that stay ASCII turn one valid header into another (a digit in a shape or
    // offset, a letter in a name or in __metadata__): caught by ckpt_header_xxh3.
    const uint8_t bit = static_cast<uint8_t>(1u << (rng() % 7));
    run_st("safetensors JSON header bit flip", "flip bit " + std::to_string(bit) + " at " + std::to_string(8 + off),
           [&](const std::string& p) { FlipByte(p, 8 + off, bit); });
  }
  for (uint64_t off : SpreadOffsets(size - header.data_start, 64, rng)) {
    const uint8_t bit = static_cast<uint8_t>(1u << (rng() % 8));
    Verdict v = run_st("safetensors tensor data", "flip at " + std::to_string(header.data_start + off),
                       [&](const std::string& p) { FlipByte(p, header.data_start + off, bit); });
    // The tensor holding the flipped byte is named.
    if (v.outcome == Outcome::kDetected) CHECK(!v.problems.front().dataset.empty());
  }
  for (int i = 0; i <= 24; ++i) {
    const uint64_t len = i == 24 ? size - 1 : size * static_cast<uint64_t>(i) / 24;
    run_st("safetensors truncation", "truncate to " + std::to_string(len),
           [&](const std::string& p) { Truncate(p, len); });
  }
  run_st("safetensors file", "appended garbage",
         [&](const std::string& p) { std::ofstream(p, std::ios::app) << "garbage!"; });
  run_st("safetensors file", "delete", [&](const std::string& p) { std::filesystem::remove(p); });
  // Same names and shapes, other values, a valid file of its own: only the expected tag
  // (`ckpt check --tag`) tells them apart.
  run_st("safetensors file", "replace with " + tags.front() + "'s export", [&](const std::string& p) {
    std::filesystem::copy_file(exp_old + "/" + st_rel, p, std::filesystem::copy_options::overwrite_existing);
  });

  // Sharded: the index and the shards.
  std::vector<std::string> shards;
  for (const auto& [file, unused] : shref) shards.push_back(file);
  REQUIRE(shards.size() >= 3);
  const std::string index = "model.safetensors.index.json";
  const uint64_t isize = std::filesystem::file_size(shd + "/" + index);
  for (uint64_t off : SpreadOffsets(isize, 48, rng)) {
    run_export(shd, shref, "sharded index.json", "invert byte at " + std::to_string(off),
               [&](const std::string& w) { FlipByte(w + "/" + index, off, 0xFF); });
    const uint8_t bit = static_cast<uint8_t>(1u << (rng() % 7));
    run_export(shd, shref, "sharded index.json bit flip",
               "flip bit " + std::to_string(bit) + " at " + std::to_string(off),
               [&](const std::string& w) { FlipByte(w + "/" + index, off, bit); });
  }
  for (int i = 0; i < 8; ++i) {
    const uint64_t len = isize * static_cast<uint64_t>(i) / 8;
    run_export(shd, shref, "sharded index.json", "truncate to " + std::to_string(len),
               [&](const std::string& w) { Truncate(w + "/" + index, len); });
  }
  run_export(shd, shref, "sharded index.json", "delete",
             [&](const std::string& w) { std::filesystem::remove(w + "/" + index); });
  run_export(shd, shref, "sharded index.json", "replace with " + tags.front() + "'s",
             [&](const std::string& w) {
               std::filesystem::copy_file(shd_old + "/" + index, w + "/" + index,
                                          std::filesystem::copy_options::overwrite_existing);
             });
  for (size_t k = 0; k < shards.size(); ++k) {
    const std::string& f = shards[k];
    const uint64_t fsize = std::filesystem::file_size(shd + "/" + f);
    run_export(shd, shref, "sharded shard", f + " delete",
               [&](const std::string& w) { std::filesystem::remove(w + "/" + f); });
    run_export(shd, shref, "sharded shard", f + " replace with " + tags.front() + "'s",
               [&](const std::string& w) {
                 std::filesystem::copy_file(shd_old + "/" + f, w + "/" + f,
                                            std::filesystem::copy_options::overwrite_existing);
               });
    run_export(shd, shref, "sharded shard", f + " swapped with the next shard",
               [&](const std::string& w) {
                 const std::string g = shards[(k + 1) % shards.size()];
                 std::filesystem::rename(w + "/" + f, w + "/tmp");
                 std::filesystem::rename(w + "/" + g, w + "/" + f);
                 std::filesystem::rename(w + "/tmp", w + "/" + g);
               });
    run_export(shd, shref, "sharded shard", f + " truncate by 4 bytes",
               [&](const std::string& w) { Truncate(w + "/" + f, fsize - 4); });
    for (uint64_t off : SpreadOffsets(fsize, 8, rng)) {
      const uint8_t bit = static_cast<uint8_t>(1u << (rng() % 7));
      run_export(shd, shref, "sharded shard", f + " flip bit at " + std::to_string(off),
                 [&](const std::string& w) { FlipByte(w + "/" + f, off, bit); });
    }
  }
  run_export(shd, shref, "sharded shard", "an extra shard from another export",
             [&](const std::string& w) {
               std::filesystem::copy_file(shd_old + "/" + shards.front(),
                                          w + "/model-00009-of-00009.safetensors");
             });
}

}  // namespace

TEST_CASE("every corruption of a sharded checkpoint is detected or refused, never silent", "[io]") {
  Tally tally;
  // manifest.json carries its own XXH3 (manifest_xxh3), so even ASCII bit flips that keep
  // the JSON valid must be caught.
  RunShardedSuite("none", 2, tally, /*strict_manifest_bits=*/true);
  RunShardedSuite("zstd:1", 3, tally, true);
  tally.Print("sharded");
  CHECK(tally.silent.empty());
}

TEST_CASE("every corruption of the universal checkpoint and the safetensors export is caught",
          "[io]") {
  Tally tally;
  RunConvertSuite(tally);
  tally.Print("convert outputs");
  CHECK(tally.silent.empty());
}

// A newer writer would keep the manifest consistent with the file; the reader must still refuse.
TEST_CASE("a rank file claiming a newer format version is refused", "[io]") {
  ScratchDir d("ckpt-corrupt-ver");
  auto tags = WriteSmallRoot(d / "root", 2, 2, "none", 1);
  const std::string dir = d / ("root/" + tags.back());
  RewriteRootAttr(dir + "/rank_00001.h5", "format_version", "2.0");
  // Keep the manifest consistent with the rewritten file, as a newer writer would: until
  // 2026-12-07 this test left the manifest's own checksum stale, so the refusal it saw was that
  // checksum's, never the version's.
  ResealFile(dir, 1);
  auto problems = CheckCheckpoint(dir, true);
  REQUIRE(problems.ok());
  REQUIRE(problems->size() == 1);
  INFO(problems->front().what);
  CHECK(problems->front().file == "rank_00001.h5");
  CHECK(problems->front().what.find("format version 2.0") != std::string::npos);
  auto r = CheckpointReader::Open(dir);
  REQUIRE(r.ok());
  auto read = r->ReadDatasetBytes(1, "master");
  REQUIRE_FALSE(read.ok());
  CHECK(read.status().code() == StatusCode::kUnimplemented);
  CHECK(read.status().message().find("upgrade ckpt") != std::string::npos);
}
