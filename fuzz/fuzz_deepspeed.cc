// libFuzzer target: the DeepSpeed reader (ckpt/deepspeed.h) and the `.pt` archive reader under
// it (zip records placed and read from where they lie, CRC-32s, the restricted unpickler, views
// against their storages), through every public way a DeepSpeed checkpoint is read: the
// reader's own reads, the state source export and to-universal use (ckpt/state_source.h), and
// `ckpt check`'s CheckSource.
//
// An input is two bytes of header and the bytes of one `.pt` file. The first byte picks a
// fixture (modulo the fixtures: small checkpoints of ZeRO-1 with BF16_Optimizer, ZeRO-2 bf16,
// ZeRO-2 fp32 with a frozen base, the same with every record deflated, and ZeRO-3 fp32, on one
// rank; ZeRO-2 and ZeRO-3 bf16 on two), the second which of its files the bytes replace (bits
// 1-7, modulo its files) and whether the harness first sets every stored record's CRC-32 in
// the archive (central directory, local header, data descriptor) to what its bytes give (bit
// 0: "re-CRC"). Without re-CRC a change to a record's bytes is caught by its CRC; with it,
// changed pickles and tensor bytes get past the CRCs to the unpickler, the layout checks and
// the reads, as a file written that way by a hostile or broken writer would. The fixture's
// other files stay as they were made. Half of the mutations (LLVMFuzzerCustomMutator, below)
// change one stored record's bytes in place and set the re-CRC bit, so the archive stays
// whole: in a first run of 120 s, 9 % of the inputs opened as a checkpoint with a changed file,
// against 3 % with libFuzzer's mutations alone. A third of those give one integer operand of a
// pickle another value (MutatePickleInt), or every operand of the same value at once: shapes,
// strides, storage offsets and sizes, partition counts and paddings that still parse, so the
// layout checks and the reads meet views and tables a byte flip rarely makes.
//
// CKPT_FUZZ_VERBOSE=1 prints every refusal (to see what an input met).
//
// Properties: no crash, no sanitizer report, no allocation beyond libFuzzer's limit; a refusal
// is DataLoss, Unimplemented or ResourceExhausted (never InvalidArgument or Internal: the
// harness asks only for what the manifest says exists); where the reader says a partition's
// or frozen tensor's bytes lie in the file (PartitionFileOffset, FrozenFileOffset), the file
// holds there the bytes the reader returned; a run of parameters read as one
// (ReadParamSlices) holds what reading each on its own gives, bit for bit.
//
// The harness asserts that it reaches the reader: every seed (tests/fuzz/corpus/deepspeed/,
// written by tests/fuzz/make_deepspeed_seeds.py) must open and read completely at start-up,
// and it prints, at every power of two, how many inputs opened as a checkpoint and how many of
// those differ from the file they replaced ("fuzz_deepspeed: N inputs, M re-CRC'd, K
// checkpoints opened, C of them changed, J read whole; M integer mutations, I opened", I the
// inputs opened with a pickle's integer operand changed): tools/fuzz.sh requires C to be
// non-zero (the seeds alone open; a changed file that opens shows mutations reach the reads).
#include <libdeflate.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "ckpt/deepspeed.h"
#include "ckpt/manifest.h"
#include "ckpt/state_source.h"
#include "fuzz_util.h"

#ifndef CKPT_FUZZ_DEEPSPEED_SEEDS
#error "fuzz/build.sh defines CKPT_FUZZ_DEEPSPEED_SEEDS (tests/fuzz/corpus/deepspeed)"
#endif

namespace {

// The fixtures, in selector order, and their files: tests/fuzz/make_deepspeed_seeds.py makes
// them with these names (DeepSpeed's own for each layout) in this order.
struct FixtureSpec {
  const char* name;
  std::vector<const char*> files;
};
const std::vector<FixtureSpec>& Specs() {
  static const std::vector<FixtureSpec> specs = {
      {"zero2_bf16",
       {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"}},
      {"zero3_fp32",
       {"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"}},
      {"zero1_bf16opt",
       {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"}},
      {"zero2_fp32_frozen",
       {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"}},
      // The same with every record deflated (read through libzip's inflate).
      {"zero2_fp32_frozen_deflated",
       {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"}},
      // Two ranks: parameters split across partitions, the ranks' files checked against each
      // other.
      {"zero2_bf16_world2",
       {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"}},
      {"zero3_bf16_world2",
       {"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt",
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"}},
  };
  return specs;
}

// An input's two bytes of header: the fixture, then the file (bits 1-7) and re-CRC (bit 0).
constexpr size_t kHeader = 2;
constexpr uint8_t kReCrc = 1;
size_t FixtureOf(const uint8_t* header) { return header[0] % Specs().size(); }
size_t FileOf(const uint8_t* header) {
  return (header[1] >> 1) % Specs()[FixtureOf(header)].files.size();
}

struct Fixture {
  std::string dir;                             // the tag directory
  std::vector<std::vector<uint8_t>> pristine;  // its files as made, in FixtureSpec order
};

struct Counts {
  uint64_t inputs = 0, recrc = 0, opened = 0, changed_opened = 0, read_whole = 0;
  uint64_t int_mutations = 0;  // by MutatePickleInt
  uint64_t ints_opened = 0;    // opened with integer operands of a pickle changed
} counts;

std::vector<Fixture>& Fixtures() {
  static std::vector<Fixture> fixtures = [] {
    const std::string base = ckpt_fuzz::TempDir("fuzz-deepspeed");
    std::vector<Fixture> fx(Specs().size());
    for (size_t i = 0; i < fx.size(); ++i) fx[i].pristine.resize(Specs()[i].files.size());
    // Each fixture's files are its seeds' bytes (the re-CRC bit clear or set).
    for (const auto& e : std::filesystem::directory_iterator(CKPT_FUZZ_DEEPSPEED_SEEDS)) {
      const std::vector<uint8_t> seed = ckpt_fuzz::ReadFile(e.path());
      if (seed.size() <= kHeader) continue;
      fx[FixtureOf(seed.data())].pristine[FileOf(seed.data())].assign(seed.begin() + kHeader,
                                                                      seed.end());
    }
    for (size_t i = 0; i < fx.size(); ++i) {
      Fixture& f = fx[i];
      f.dir = base + "/" + Specs()[i].name + "/global_step7";
      std::filesystem::create_directories(f.dir);
      for (size_t k = 0; k < f.pristine.size(); ++k) {
        if (f.pristine[k].empty()) {
          std::fprintf(stderr, "fuzz_deepspeed: no seed holds fixture %s's %s\n", Specs()[i].name,
                       Specs()[i].files[k]);
          std::abort();
        }
        ckpt_fuzz::WriteFile(f.dir + "/" + Specs()[i].files[k], f.pristine[k].data(),
                             f.pristine[k].size());
      }
    }
    return fx;
  }();
  return fixtures;
}

uint32_t Get16(const uint8_t* b, size_t at) { return b[at] | b[at + 1] << 8; }
uint32_t Get32(const uint8_t* b, size_t at) { return Get16(b, at) | Get16(b, at + 2) << 16; }
void Put32(uint8_t* b, size_t at, uint32_t v) {
  for (int k = 0; k < 4; ++k) b[at + static_cast<size_t>(k)] = static_cast<uint8_t>(v >> (8 * k));
}

// A record stored uncompressed whose local header and bytes lie inside the archive, as the
// central directory names it.
struct StoredRecord {
  size_t central, local, data, size;
  bool descriptor;  // followed by a data descriptor (general-purpose flag bit 3)
  bool pickle;      // its name ends in "data.pkl"
};

// The stored records of the zip archive b[0, n), in central-directory order. Finds the
// end-of-central-directory record by its signature and follows the entries while they are
// where they say; whatever it cannot follow it leaves out.
std::vector<StoredRecord> StoredRecords(const uint8_t* b, size_t n) {
  std::vector<StoredRecord> out;
  if (n < 22) return out;
  size_t eocd = n - 22;
  for (size_t stop = n > 22 + 65535 ? n - 22 - 65535 : 0;; --eocd) {
    if (Get32(b, eocd) == 0x06054b50) break;
    if (eocd == stop) return out;
  }
  const uint64_t entries = Get16(b, eocd + 10);
  uint64_t at = Get32(b, eocd + 16);
  for (uint64_t k = 0; k < entries && at + 46 <= n && Get32(b, at) == 0x02014b50; ++k) {
    const uint32_t flags = Get16(b, at + 8), method = Get16(b, at + 10);
    const uint64_t comp = Get32(b, at + 20), size = Get32(b, at + 24);
    const uint64_t local = Get32(b, at + 42), name_len = Get16(b, at + 28);
    const uint64_t next = at + 46 + name_len + Get16(b, at + 30) + Get16(b, at + 32);
    if (method == 0 && comp == size && local + 30 <= n && Get32(b, local) == 0x04034b50) {
      const uint64_t data = local + 30 + Get16(b, local + 26) + Get16(b, local + 28);
      if (data <= n && comp <= n - data) {
        static constexpr char kPickle[] = "data.pkl";
        const size_t kp = sizeof kPickle - 1;
        const bool pickle = name_len >= kp && at + 46 + name_len <= n &&
                            std::memcmp(b + at + 46 + name_len - kp, kPickle, kp) == 0;
        out.push_back({static_cast<size_t>(at), static_cast<size_t>(local),
                       static_cast<size_t>(data), static_cast<size_t>(comp), (flags & 8) != 0,
                       pickle});
      }
    }
    at = next;
  }
  return out;
}

// Sets the CRC-32 of every stored record to what its bytes give: in its central-directory
// entry, in its local header when that records one, and in its data descriptor when it has one.
void ReCrc(uint8_t* b, size_t n) {
  for (const StoredRecord& r : StoredRecords(b, n)) {
    const uint32_t crc = static_cast<uint32_t>(libdeflate_crc32(0, b + r.data, r.size));
    Put32(b, r.central + 16, crc);
    if (Get32(b, r.local + 14) != 0) Put32(b, r.local + 14, crc);
    size_t desc = r.data + r.size;
    if (r.descriptor && desc + 4 <= n && Get32(b, desc) == 0x08074b50) desc += 4;
    if (r.descriptor && desc + 4 <= n) Put32(b, desc, crc);
  }
}

// An integer operand of a pickle: where its bytes start and how many (BININT1 'K' 1, BININT2
// 'M' 2, BININT 'J' 4, little-endian; J signed).
struct IntOperand {
  size_t at, width;
};

// The integer operands of the pickle p[0, n), found by walking its opcodes from the start as
// protocol 2 (torch.save's) and 4 lay them out; the walk stops at an opcode it does not know or
// an operand that runs past the end. Shapes, strides, offsets, storage sizes, partition counts,
// paddings and steps are all such operands in a DeepSpeed file.
std::vector<IntOperand> PickleInts(const uint8_t* p, size_t n) {
  std::vector<IntOperand> out;
  auto u32 = [&](size_t at) { return static_cast<size_t>(Get32(p, at)); };
  auto line = [&](size_t at) -> size_t {  // past the next newline, or n + 1 when there is none
    const void* nl = std::memchr(p + at, '\n', n - at);
    return nl ? static_cast<size_t>(static_cast<const uint8_t*>(nl) - p) + 1 : n + 1;
  };
  for (size_t i = 0; i < n;) {
    const uint8_t op = p[i++];
    // The opcode's class by the bytes of its operand (0 for none); STOP ('.') and an opcode
    // not named here end the walk.
    auto in = [&](const char* set) { return op != 0 && std::strchr(set, op) != nullptr; };
    size_t len = 0;  // the operand's bytes after the opcode
    if (in("Kqh\x80")) {
      len = 1;
    } else if (op == 'M') {
      len = 2;
    } else if (in("Jrj")) {
      len = 4;
    } else if (in("G\x95")) {
      len = 8;
    } else if (in("UC\x8a\x8c")) {  // one byte of length, then that many
      len = i < n ? 1 + p[i] : n + 1;
    } else if (in("XTB\x8b")) {  // four bytes of length, then that many
      len = i + 4 <= n ? 4 + u32(i) : n + 1;
    } else if (op == 'c') {  // module and name, each ending in a newline
      len = line(i) <= n ? line(line(i)) - i : n + 1;
    } else if (in("ILFSVPgp")) {  // ends in a newline
      len = line(i) - i;
    } else if (!in("()]}NtaesuRbQ012ld\x81\x85\x86\x87\x88\x89\x8f\x90\x91\x92\x93\x94")) {
      return out;
    }
    if (len > n - i) return out;
    if (op == 'K' || op == 'M' || op == 'J') out.push_back({i, len});
    i += len;
  }
  return out;
}

int64_t GetInt(const uint8_t* b, const IntOperand& o) {
  if (o.width == 1) return b[o.at];
  if (o.width == 2) return Get16(b, o.at);
  return static_cast<int32_t>(Get32(b, o.at));
}
void PutInt(uint8_t* b, const IntOperand& o, int64_t v) {
  for (size_t k = 0; k < o.width; ++k) b[o.at + k] = static_cast<uint8_t>(v >> (8 * k));
}

// Gives one integer operand of the pickle p[0, n) another value of its width: 0, 1, one more
// or less, twice or half, the width's largest, -1, or another operand's value; a quarter of the
// time every operand holding the same value gets the new one (a dimension changed everywhere
// it is named, shapes and storage sizes still agreeing). False when the pickle has none.
bool MutatePickleInt(uint8_t* p, size_t n, std::minstd_rand& rng) {
  const std::vector<IntOperand> ints = PickleInts(p, n);
  if (ints.empty()) return false;
  const IntOperand& o = ints[rng() % ints.size()];
  const int64_t v = GetInt(p, o);
  const int64_t most = o.width == 1 ? 0xFF : o.width == 2 ? 0xFFFF : INT32_MAX;
  const int64_t choices[] = {
      0, 1, v + 1, v - 1, v * 2, v / 2, most, -1, GetInt(p, ints[rng() % ints.size()])};
  int64_t w = choices[rng() % std::size(choices)];
  w = o.width == 4 ? std::clamp<int64_t>(w, INT32_MIN, INT32_MAX) : w & most;
  if (rng() % 4 == 0) {
    for (const IntOperand& e : ints)
      if (GetInt(p, e) == v && (e.width == 4 || (w >= 0 && w <= (e.width == 1 ? 0xFF : 0xFFFF))))
        PutInt(p, e, w);
  } else {
    PutInt(p, o, w);
  }
  return true;
}

// True when a pickle of `changed` (the same length as `pristine`) holds its opcodes where
// the pristine file's does, with an integer operand of another value: what MutatePickleInt
// does, whatever other changes the input carries.
bool PickleIntsDiffer(const std::vector<uint8_t>& pristine, const std::vector<uint8_t>& changed) {
  if (pristine.size() != changed.size()) return false;
  for (const StoredRecord& r : StoredRecords(pristine.data(), pristine.size())) {
    if (!r.pickle) continue;
    const uint8_t* a = pristine.data() + r.data;
    const uint8_t* b = changed.data() + r.data;
    const std::vector<IntOperand> ints = PickleInts(a, r.size);
    const std::vector<IntOperand> now = PickleInts(b, r.size);
    if (now.size() != ints.size()) continue;
    bool same_places = true, differ = false;
    for (size_t k = 0; k < ints.size() && same_places; ++k) {
      same_places = now[k].at == ints[k].at && now[k].width == ints[k].width;
      differ = differ || GetInt(a, ints[k]) != GetInt(b, ints[k]);
    }
    if (same_places && differ) return true;
  }
  return false;
}

// A refusal the reader may give for a damaged file.
bool Refusal(const ckpt::Status& s) {
  return s.code() == ckpt::StatusCode::kDataLoss || s.code() == ckpt::StatusCode::kUnimplemented ||
         s.code() == ckpt::StatusCode::kResourceExhausted;
}
bool Verbose() {
  static const bool verbose = std::getenv("CKPT_FUZZ_VERBOSE") != nullptr;
  return verbose;
}
void Expect(const ckpt::Status& s, const char* what) {
  if (Verbose() && !s.ok())
    std::fprintf(stderr, "fuzz_deepspeed: %s: %s\n", what, s.ToString().c_str());
  ckpt_fuzz::RequireTerminalSafe(s);  // whatever a .pt file holds reaches a message escaped
  if (s.ok() || Refusal(s)) return;
  std::fprintf(stderr, "fuzz_deepspeed: %s: unexpected %s\n", what, s.ToString().c_str());
  std::abort();
}

// The bytes at [at, at + n) of `path`, or empty when the file is shorter.
std::vector<uint8_t> Pread(const std::string& path, uint64_t at, size_t n) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> out(n);
  in.seekg(static_cast<std::streamoff>(at));
  if (!in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(n))) return {};
  return out;
}

constexpr int64_t kMaxElements = 1 << 16;  // per read: the fixtures' tensors are far smaller
const std::string_view kStates[] = {ckpt::kMaster, ckpt::kExpAvg, ckpt::kExpAvgSq};

// Everything DeepSpeedReader offers, on the parameters and partitions its manifest names.
// True when every read succeeded.
bool ReadThroughReader(ckpt::DeepSpeedReader& r) {
  bool all_ok = true;
  auto note = [&](const ckpt::Status& s, const char* what) {
    Expect(s, what);
    all_ok = all_ok && s.ok();
  };
  const ckpt::Manifest& m = r.manifest();
  std::vector<float> buf;
  for (const ckpt::ParamEntry& p : m.params) {
    if (p.numel < 0 || p.numel > kMaxElements || !p.tied_to.empty()) continue;
    if (p.trainable()) {
      buf.assign(static_cast<size_t>(p.numel), 0.f);
      for (std::string_view state : kStates)
        note(r.ReadParamRange(p.name, state, 0, p.numel, buf.data()), "ReadParamRange");
      if (p.numel >= 3)
        note(r.ReadParamRange(p.name, ckpt::kMaster, p.numel / 3, p.numel / 2, buf.data()),
             "ReadParamRange (a middle range)");
    } else {
      auto bytes = r.ReadFrozenBytes(p.name);
      note(bytes.status(), "ReadFrozenBytes");
      const std::optional<uint64_t> at = r.FrozenFileOffset(p.name);
      if (bytes.ok() && at && !bytes->empty()) {
        const size_t k = std::min<size_t>(bytes->size(), 64);
        const std::vector<uint8_t> there =
            Pread(r.dir() + "/" + r.info().model_files.at(0), *at, k);
        if (!std::equal(there.begin(), there.end(), bytes->begin()) || there.size() != k) {
          std::fprintf(stderr,
                       "fuzz_deepspeed: FrozenFileOffset of %s is not where its bytes lie\n",
                       p.name.c_str());
          std::abort();
        }
      }
    }
  }
  const auto& shards = m.partition.shard_numel;
  for (size_t rank = 0; rank < shards.size() && rank < r.info().optim_files.size(); ++rank) {
    const int64_t n = std::min<int64_t>(shards[rank], kMaxElements);
    if (n <= 0) continue;
    buf.assign(static_cast<size_t>(n), 0.f);
    for (std::string_view state : kStates) {
      const ckpt::Status s = r.ReadPartition(static_cast<int>(rank), state, 0, n, buf.data());
      note(s, "ReadPartition");
      const std::optional<uint64_t> at = r.PartitionFileOffset(static_cast<int>(rank), state, 0);
      if (s.ok() && at) {
        const std::vector<uint8_t> there =
            Pread(r.dir() + "/" + r.info().optim_files[rank], *at, sizeof(float));
        if (there.size() != sizeof(float) || std::memcmp(there.data(), buf.data(), 4) != 0) {
          std::fprintf(stderr,
                       "fuzz_deepspeed: PartitionFileOffset(%zu, %s) is not where the "
                       "partition's first element lies\n",
                       rank, std::string(state).c_str());
          std::abort();
        }
      }
    }
  }
  auto problems = r.Check();
  note(problems.status(), "Check");
  if (problems.ok())
    for (const ckpt::Problem& p : *problems)
      if (!ckpt_fuzz::TerminalSafe(p.file + p.dataset + p.what)) __builtin_trap();
  if (problems.ok() && Verbose())
    for (const ckpt::Problem& p : *problems)
      std::fprintf(stderr, "fuzz_deepspeed: Check: %s: %s\n", p.file.c_str(), p.what.c_str());
  all_ok = all_ok && problems.ok() && problems->empty();
  return all_ok;
}

// The state source over the checkpoint as export-fp32 opens it (its reads verified as they
// stream, placed reads, runs of parameters), then its verification. True when all succeeded.
bool ReadThroughSource(const std::string& dir) {
  ckpt::SourceOptions o;
  o.stream_verify = true;
  o.defer_stream_hashes = true;
  auto src = ckpt::OpenStateSource(dir, o);
  Expect(src.status(), "OpenStateSource");
  if (!src.ok()) return false;
  ckpt::StateSource& s = **src;
  (void)ckpt::InspectSourceToJson(s).dump();
  if (!ckpt_fuzz::TerminalSafe(ckpt::InspectSourceToText(s))) __builtin_trap();
  bool all_ok = true;
  std::vector<ckpt::StateSource::ParamSlice> slices;
  int64_t total = 0;
  std::vector<float> buf;
  for (const ckpt::ParamEntry& p : s.manifest().params) {
    if (p.numel < 0 || p.numel > kMaxElements || !p.tied_to.empty()) continue;
    if (p.frozen) {
      std::vector<uint8_t> bytes(static_cast<size_t>(p.numel) * ckpt::DTypeSize(p.dtype));
      const ckpt::Status st = s.ReadFrozenInto(p.name, bytes.data(), bytes.size());
      Expect(st, "ReadFrozenInto");
      all_ok = all_ok && st.ok();
      continue;
    }
    // Placed where a direct read would put it, as export does.
    const std::optional<uint64_t> shift = s.ReadShift(p.name, ckpt::kMaster, 0, p.numel);
    // Memory at that place in a 4 KiB block (where the shift keeps fp32 alignment).
    buf.assign(static_cast<size_t>(p.numel) + 2048, 0.f);
    auto addr = reinterpret_cast<uintptr_t>(buf.data());
    addr = (addr + 4095) & ~uintptr_t{4095};
    if (shift && *shift % sizeof(float) == 0) addr += *shift % 4096;
    float* out = reinterpret_cast<float*>(addr);
    const ckpt::Status st = s.ReadParamRange(p.name, ckpt::kMaster, 0, p.numel, out);
    Expect(st, "StateSource::ReadParamRange");
    all_ok = all_ok && st.ok();
    s.HashReadBytes();
    if (total + p.numel <= kMaxElements) {
      slices.push_back({p.name, 0, p.numel});
      total += p.numel;
    }
  }
  // A run of parameters read as one (ReadParamSlices merges neighbours in a partition) holds
  // what reading each parameter on its own gives, bit for bit.
  buf.assign(static_cast<size_t>(total), 0.f);
  std::vector<float> each(static_cast<size_t>(total));
  for (std::string_view state : kStates) {
    const ckpt::Status st = s.ReadParamSlices(slices, state, buf.data());
    Expect(st, "ReadParamSlices");
    all_ok = all_ok && st.ok();
    bool each_ok = true;
    size_t at = 0;
    for (const auto& sl : slices) {
      const ckpt::Status one =
          s.ReadParamRange(sl.param, state, sl.begin, sl.end, each.data() + at);
      Expect(one, "StateSource::ReadParamRange (one of a run)");
      each_ok = each_ok && one.ok();
      at += static_cast<size_t>(sl.end - sl.begin);
    }
    if (st.ok() && each_ok && !each.empty() &&
        std::memcmp(buf.data(), each.data(), each.size() * sizeof(float)) != 0) {
      std::fprintf(stderr,
                   "fuzz_deepspeed: ReadParamSlices of %s differs from its parameters "
                   "read one by one\n",
                   std::string(state).c_str());
      std::abort();
    }
  }
  s.HashReadBytes();
  const ckpt::Status v = s.FinishVerification({std::string(ckpt::kMaster)});
  Expect(v, "FinishVerification");
  return all_ok && v.ok();
}

// Installs the input's bytes as the file its header selects, reads everything, and puts the
// file back. Returns true when every read succeeded.
bool RunOne(const uint8_t* data, size_t size) {
  if (size < kHeader) return false;
  Fixture& f = Fixtures()[FixtureOf(data)];
  const std::string path = f.dir + "/" + Specs()[FixtureOf(data)].files[FileOf(data)];
  const std::vector<uint8_t>& pristine = f.pristine[FileOf(data)];
  std::vector<uint8_t> bytes(data + kHeader, data + size);
  ++counts.inputs;
  if (data[1] & kReCrc) {
    ReCrc(bytes.data(), bytes.size());
    ++counts.recrc;
  }
  ckpt_fuzz::WriteFile(path, bytes.data(), bytes.size());

  bool all_ok = false;
  auto r = ckpt::DeepSpeedReader::Open(f.dir);
  Expect(r.status(), "DeepSpeedReader::Open");
  if (r.ok()) {
    ++counts.opened;
    if (bytes != pristine) ++counts.changed_opened;
    if (PickleIntsDiffer(pristine, bytes)) ++counts.ints_opened;
    all_ok = ReadThroughReader(*r);
    all_ok = ReadThroughSource(f.dir) && all_ok;
    if (all_ok) ++counts.read_whole;
  }
  ckpt::DeepSpeedReader::OpenOptions checked;
  checked.check_records = true;
  auto rc = ckpt::DeepSpeedReader::Open(f.dir, "", nullptr, checked);
  Expect(rc.status(), "DeepSpeedReader::Open (check_records)");
  if (rc.ok()) Expect(rc->Check().status(), "Check after check_records");
  auto check = ckpt::CheckSource(f.dir, "", /*deep=*/true);
  Expect(check.status(), "CheckSource");
  if (check.ok())
    for (const ckpt::Problem& p : check->problems)
      if (!ckpt_fuzz::TerminalSafe(p.file + p.dataset + p.what)) __builtin_trap();
  all_ok = all_ok && check.ok() && check->problems.empty();

  ckpt_fuzz::WriteFile(path, pristine.data(), pristine.size());
  if ((counts.inputs & (counts.inputs - 1)) == 0)
    std::fprintf(stderr,
                 "fuzz_deepspeed: %llu inputs, %llu re-CRC'd, %llu checkpoints opened, %llu of "
                 "them changed, %llu read whole; %llu integer mutations, %llu opened\n",
                 static_cast<unsigned long long>(counts.inputs),
                 static_cast<unsigned long long>(counts.recrc),
                 static_cast<unsigned long long>(counts.opened),
                 static_cast<unsigned long long>(counts.changed_opened),
                 static_cast<unsigned long long>(counts.read_whole),
                 static_cast<unsigned long long>(counts.int_mutations),
                 static_cast<unsigned long long>(counts.ints_opened));
  // A harness that stops reaching the reader is broken, not lucky.
  if (counts.inputs == 4096 && counts.changed_opened == 0) __builtin_trap();
  return all_ok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Fixtures();
  // Every seed must open and read completely: proof that inputs reach the reader.
  for (const auto& e : std::filesystem::directory_iterator(CKPT_FUZZ_DEEPSPEED_SEEDS)) {
    const std::vector<uint8_t> seed = ckpt_fuzz::ReadFile(e.path());
    if (!RunOne(seed.data(), seed.size())) {
      std::fprintf(stderr, "fuzz_deepspeed: seed %s does not read through the harness\n",
                   e.path().c_str());
      std::abort();
    }
  }
  return 0;
}

// Half of the mutations are libFuzzer's own over the whole input; the other half change the
// bytes of one stored record in place, keeping its length, and set the re-CRC bit: the archive
// stays whole, so the change reaches the unpickler, the layout checks and the reads instead of
// dying in libzip. Of those, a third change an integer operand of a pickle (MutatePickleInt:
// shapes, strides, offsets, storage sizes), the rest libFuzzer's mutations of a pickle or a
// tensor's storage.
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  std::minstd_rand rng(seed);
  if (size <= kHeader || rng() % 2 == 0) return LLVMFuzzerMutate(data, size, max_size);
  const std::vector<StoredRecord> records = StoredRecords(data + kHeader, size - kHeader);
  if (rng() % 3 == 0) {
    std::vector<const StoredRecord*> pickles;
    for (const StoredRecord& r : records)
      if (r.pickle && r.size > 0) pickles.push_back(&r);
    if (!pickles.empty()) {
      const StoredRecord& r = *pickles[rng() % pickles.size()];
      if (MutatePickleInt(data + kHeader + r.data, r.size, rng)) {
        ++counts.int_mutations;
        data[1] |= kReCrc;
        return size;
      }
    }
  }
  const bool pickle = rng() % 2 == 0;
  std::vector<const StoredRecord*> pool;
  for (const StoredRecord& r : records)
    if (r.size > 0 && r.pickle == pickle) pool.push_back(&r);
  if (pool.empty())
    for (const StoredRecord& r : records)
      if (r.size > 0) pool.push_back(&r);
  if (pool.empty()) return LLVMFuzzerMutate(data, size, max_size);
  const StoredRecord& r = *pool[rng() % pool.size()];
  uint8_t* bytes = data + kHeader + r.data;
  std::vector<uint8_t> scratch(bytes, bytes + r.size);
  const size_t n = LLVMFuzzerMutate(scratch.data(), scratch.size(), scratch.size());
  std::memcpy(bytes, scratch.data(), std::min(n, scratch.size()));  // the tail kept when shorter
  data[1] |= kReCrc;
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RunOne(data, size);
  return 0;
}
