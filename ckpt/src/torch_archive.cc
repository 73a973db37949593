#include "torch_archive.h"

#include <libdeflate.h>
#include <zip.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/shared_library.h"

namespace ckpt {
namespace {

constexpr uint64_t kMaxPickleBytes = 256ull << 20;  // data.pkl of a checkpoint is kilobytes
constexpr uint64_t kMaxDeflateRatio = 1032;         // deflate's most: 258 bytes in 2 bits

// libzip, opened on first use (dlopen), not linked: it needs libcrypto, whose loading and
// relocation every process linking libzip paid at start (about 4 ms of ckpt --version's 14 on
// the development VM, issue 19), while only reading a PyTorch .pt file uses it. zip.h gives the
// types.
struct ZipApi {
  decltype(&zip_source_function_create) source_function_create = nullptr;
  decltype(&zip_source_free) source_free = nullptr;
  decltype(&zip_open_from_source) open_from_source = nullptr;
  decltype(&zip_error_init) error_init = nullptr;
  decltype(&zip_error_code_zip) error_code_zip = nullptr;
  decltype(&zip_discard) discard = nullptr;
  decltype(&zip_get_num_entries) get_num_entries = nullptr;
  decltype(&zip_get_name) get_name = nullptr;
  decltype(&zip_stat_init) stat_init = nullptr;
  decltype(&zip_stat_index) stat_index = nullptr;
  decltype(&zip_fopen_index) fopen_index = nullptr;
  decltype(&zip_fseek) fseek = nullptr;
  decltype(&zip_fread) fread = nullptr;
  decltype(&zip_fclose) fclose = nullptr;
  decltype(&zip_strerror) strerror = nullptr;
  decltype(&zip_file_strerror) file_strerror = nullptr;
  decltype(&zip_error_strerror) error_strerror = nullptr;
  decltype(&zip_error_fini) error_fini = nullptr;
};

// The library by its SONAME (the loader's search), else the file found at configure time;
// opened once per process. FailedPrecondition naming both when neither opens, or the function
// libzip lacks.
Result<const ZipApi*> LoadZip() {
  struct Loaded {
    ZipApi api;
    std::string error;  // empty: loaded
  };
  static const Loaded loaded = [] {
    Loaded l;
    auto lib = SharedLibrary::Open({CKPT_LIBZIP_SONAME, CKPT_LIBZIP_PATH},
                                   "libzip (Debian package libzip4)");
    if (!lib.ok()) {
      l.error = lib.status().message();
      return l;
    }
    auto find = [&](const char* name, auto** fn) {
      if (Status s = lib->Find(name, fn); !s.ok() && l.error.empty()) l.error = s.message();
    };
    find("zip_source_function_create", &l.api.source_function_create);
    find("zip_source_free", &l.api.source_free);
    find("zip_open_from_source", &l.api.open_from_source);
    find("zip_error_init", &l.api.error_init);
    find("zip_error_code_zip", &l.api.error_code_zip);
    find("zip_discard", &l.api.discard);
    find("zip_get_num_entries", &l.api.get_num_entries);
    find("zip_get_name", &l.api.get_name);
    find("zip_stat_init", &l.api.stat_init);
    find("zip_stat_index", &l.api.stat_index);
    find("zip_fopen_index", &l.api.fopen_index);
    find("zip_fseek", &l.api.fseek);
    find("zip_fread", &l.api.fread);
    find("zip_fclose", &l.api.fclose);
    find("zip_strerror", &l.api.strerror);
    find("zip_file_strerror", &l.api.file_strerror);
    find("zip_error_strerror", &l.api.error_strerror);
    find("zip_error_fini", &l.api.error_fini);
    return l;
  }();
  if (!loaded.error.empty()) return FailedPrecondition(loaded.error);
  return &loaded.api;
}

// The API once LoadZip succeeded (every TorchFile exists only after it did).
const ZipApi& Zip() { return **LoadZip(); }

struct ZipCloser {
  void operator()(zip_t* z) const { Zip().discard(z); }
};
struct ZipFileCloser {
  void operator()(zip_file_t* f) const { Zip().fclose(f); }
};

// The local-header offsets named by the central-directory entries in `p` (every occurrence of
// the entry signature with its fixed part inside; a zip64 offset from the entry's extra field).
// For hints only (ZipFileSource::Hint): an occurrence that is not an entry, inside a record's
// data, gives an offset whose hint costs a page read, nothing else.
std::vector<uint64_t> LocalHeaderOffsets(const uint8_t* p, size_t n) {
  constexpr size_t kEntry = 46;  // a central-directory entry's fixed part
  constexpr uint32_t kFull32 = 0xFFFFFFFFu;
  static constexpr char kSignature[4] = {'P', 'K', 1, 2};
  auto u16 = [&](size_t at) { return static_cast<uint32_t>(p[at] | p[at + 1] << 8); };
  auto u32 = [&](size_t at) { return u16(at) | u16(at + 2) << 16; };
  auto u64 = [&](size_t at) { return u32(at) | static_cast<uint64_t>(u32(at + 4)) << 32; };
  std::vector<uint64_t> out;
  for (size_t i = 0; i + kEntry <= n; ++i) {
    const void* hit = ::memmem(p + i, n - i, kSignature, sizeof kSignature);
    if (!hit) break;
    i = static_cast<size_t>(static_cast<const uint8_t*>(hit) - p);
    if (i + kEntry > n) break;
    const uint32_t comp_size = u32(i + 20), size = u32(i + 24);
    uint64_t at = u32(i + 42);
    if (at == kFull32) {  // zip64: the 8-byte values of the fields stored as 0xFFFFFFFF, in order
      const size_t end = std::min(n, i + kEntry + u16(i + 28) + u16(i + 30));
      bool found = false;
      for (size_t e = i + kEntry + u16(i + 28); e + 4 <= end; e += 4 + u16(e + 2)) {
        if (u16(e) != 1) continue;
        const size_t f = e + 4 + (size == kFull32 ? 8 : 0) + (comp_size == kFull32 ? 8 : 0);
        found = f + 8 <= std::min(end, e + 4 + u16(e + 2));
        if (found) at = u64(f);
        break;
      }
      if (!found) continue;
    }
    out.push_back(at);
  }
  return out;
}

// The archive's bytes as libzip reads them: a libzip source over the Env's file (a file inside
// a checkpoint: NewCheckpointFile refuses a symbolic link, so no file outside the checkpoint is
// read because one points there). A read of 4 MiB or more (zip_fread passes a tensor's
// storage down as one request) goes through RandomAccessFile::ReadLarge, past the page cache
// with O_DIRECT as a rank file's datasets do; smaller ones (the archive's structure, small
// tensors) through pread. (A window read ahead for runs of small reads, a ZeRO partition read
// parameter by parameter, was tried and not kept: docs/performance.md, 2026-12-03.)
//
// While the archive is opened, libzip reads the central directory and then, for ZIP_CHECKCONS,
// every record's local header, one small read after the other: a model-states file of 300
// parameters is 600 reads, each waiting for the disk when the file is not cached (about 40 ms
// of a 1 GB checkpoint's 70 ms `ckpt inspect` after a cache drop, docs/performance.md). The
// offsets the central directory names are hinted to the file system (RandomAccessFile::
// WillNeed) as soon as a read brings them, so the disk reads the headers together.
struct ZipFileSource {
  static constexpr uint64_t kNowhere = UINT64_MAX;
  static constexpr uint64_t kHeaderSpan = 512;  // a local header: 30 bytes, name, extra field
  static constexpr size_t kMaxHints = 1u << 16;
  std::unique_ptr<RandomAccessFile> file;
  bool hinting = true;        // the archive is being opened
  std::set<uint64_t> hinted;  // local-header offsets hinted so far
  uint64_t pos = 0;
  uint64_t last_read_at = kNowhere;  // where the last read began (TorchFile::ElementFileOffset)
  int zip_error = ZIP_ER_OK;  // of the last failed command
  Status read_error;          // the last failed read

  zip_int64_t Fail(int code) {
    zip_error = code;
    return -1;
  }
  void Hint(const void* data, uint64_t n) {
    for (uint64_t at : LocalHeaderOffsets(static_cast<const uint8_t*>(data), n)) {
      if (at >= file->size() || hinted.size() >= kMaxHints || !hinted.insert(at).second) continue;
      file->WillNeed(at, std::min(kHeaderSpan, file->size() - at));
    }
  }
  static zip_int64_t Callback(void* user, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    auto* s = static_cast<ZipFileSource*>(user);
    const uint64_t size = s->file->size();
    switch (cmd) {
      case ZIP_SOURCE_OPEN:
        s->pos = 0;
        return 0;
      case ZIP_SOURCE_READ: {
        const uint64_t n = std::min<uint64_t>(len, size - std::min(s->pos, size));
        if (n == 0) return 0;
        s->last_read_at = s->pos;
        // No exception may cross libzip's C frames.
        Status st = OutOfMemoryAsStatus("read", [&] {
          return n >= RandomAccessFile::kLargeReadBlock
                     ? s->file->ReadLarge(s->pos, n, data, nullptr)
                     : s->file->Read(s->pos, static_cast<size_t>(n), data);
        });
        if (!st.ok()) {
          s->read_error = std::move(st);
          return s->Fail(ZIP_ER_READ);
        }
        if (s->hinting && n < RandomAccessFile::kLargeReadBlock) {
          Status hinted = OutOfMemoryAsStatus("hint", [&] {
            s->Hint(data, n);
            return Status::Ok();
          });
          (void)hinted;  // a hint that could not be given changes nothing
        }
        s->pos += n;
        return static_cast<zip_int64_t>(n);
      }
      case ZIP_SOURCE_CLOSE:
      case ZIP_SOURCE_FREE:
        return 0;
      case ZIP_SOURCE_STAT: {
        if (len < sizeof(zip_stat_t)) return s->Fail(ZIP_ER_INVAL);
        auto* st = static_cast<zip_stat_t*>(data);
        Zip().stat_init(st);
        st->size = size;
        st->valid |= ZIP_STAT_SIZE;
        return sizeof(zip_stat_t);
      }
      case ZIP_SOURCE_ERROR: {
        if (len < 2 * sizeof(int)) return -1;
        auto* e = static_cast<int*>(data);
        e[0] = s->zip_error;
        e[1] = s->zip_error == ZIP_ER_READ ? EIO : 0;
        return 2 * sizeof(int);
      }
      case ZIP_SOURCE_SEEK: {
        if (len < sizeof(zip_source_args_seek_t)) return s->Fail(ZIP_ER_INVAL);
        const auto* a = static_cast<const zip_source_args_seek_t*>(data);
        const int64_t base = a->whence == SEEK_SET   ? 0
                             : a->whence == SEEK_CUR ? static_cast<int64_t>(s->pos)
                             : a->whence == SEEK_END ? static_cast<int64_t>(size)
                                                     : -1;
        if (base < 0 || a->offset < -base ||
            (a->offset > 0 &&
             static_cast<uint64_t>(a->offset) > size - static_cast<uint64_t>(base)))
          return s->Fail(ZIP_ER_INVAL);
        s->pos = static_cast<uint64_t>(base + a->offset);
        return 0;
      }
      case ZIP_SOURCE_TELL:
        return static_cast<zip_int64_t>(s->pos);
      case ZIP_SOURCE_SUPPORTS:
        return ZIP_SOURCE_SUPPORTS_SEEKABLE;
      default:
        return s->Fail(ZIP_ER_OPNOTSUPP);
    }
  }
};

std::string ZipErrorText(zip_error_t* e) { return Zip().error_strerror(e); }

// A record whose bytes do not give the CRC-32 the archive records for it.
Status CrcError(const std::string& path, const std::string& record, uint32_t recorded,
                uint32_t computed) {
  char text[96];
  std::snprintf(text, sizeof text, ": CRC error (the archive records %08x, the bytes give %08x)",
                static_cast<unsigned>(recorded), static_cast<unsigned>(computed));
  return DataLoss(path + ": record " + record + text);
}

}  // namespace

struct TorchFile::Impl {
  std::string path;
  std::unique_ptr<ZipFileSource> source;  // outlives `zip`, which reads through it
  std::unique_ptr<zip_t, ZipCloser> zip;
  std::string prefix;                       // "<name>/"
  std::map<std::string, zip_uint64_t> records;  // name below prefix -> index
  PickleDoc doc;
  uint64_t bytes_read = 0;
  uint64_t scanned_bytes = 0;  // VerifyRecords' bytes read from where they lie
  std::map<zip_uint64_t, std::optional<uint64_t>> data_at;  // DataFileOffset's answers
  // Records that cannot seek (compressed ones) left open where the last read of each ended,
  // the most recently used last: a record read in pieces front to back (export's pieces of a
  // partition; to-universal's three states side by side) goes on from there instead of being
  // decompressed again from its start for every piece, which made such a read quadratic
  // (13.4 s to export a 0.9 GB checkpoint rewritten with deflated records, docs/performance.md
  // 2026-12-05 11:00). Declared after `zip`: closed before it.
  struct Stream {
    zip_uint64_t idx;
    uint64_t pos;  // the record's bytes read so far
    std::unique_ptr<zip_file_t, ZipFileCloser> f;
  };
  // The three states of up to four parameter groups (to-universal reads them side by side);
  // each kept record holds libzip's inflate state, about 50 KiB.
  static constexpr size_t kStreams = 12;
  std::vector<Stream> streams;

  Result<zip_uint64_t> Index(const std::string& name) const {
    auto it = records.find(name);
    if (it == records.end())
      return DataLoss(path + ": archive has no record " + Excerpt(prefix + name, 200));
    return it->second;
  }

  // What a failed libzip call returns: the Env's error when a read of the file failed (it
  // names the file and the cause), else DataLoss with libzip's message.
  Status Failed(const std::string& what, const char* zip_message) const {
    if (!source->read_error.ok()) return source->read_error;
    return DataLoss(path + ": " + what + zip_message);
  }

  // Reads [offset, offset + n) of record `idx` into out. With `whole` (offset 0, n the record's
  // size) it also reads to the record's end, where libzip compares the CRC-32: a record parsed
  // whole (data.pkl) is checked before it is parsed, as a tensor's storage is by `check`.
  Status ReadAt(zip_uint64_t idx, uint64_t offset, uint64_t n, void* out, bool whole = false) {
    source->read_error = Status::Ok();
    // A stored record's bytes are read from where they lie (RandomAccessFile::ReadLarge: past
    // the page cache from 4 MiB), not through libzip, which CRCs them with zlib as they pass
    // (10 % of export-fp32's CPU on a LoRA checkpoint's frozen base: docs/performance.md,
    // 2026-12-05 17:00) for a comparison it makes only at the end of a record read whole in
    // one stream. The callers that check a range take its CRC themselves
    // (ReadElementsChecked, VerifyRecords, DeepSpeedReader's stream verification).
    if (!whole && n > 0) {
      if (const std::optional<uint64_t> base = DataFileOffset(idx)) {
        CKPT_ASSIGN_OR_RETURN(const uint64_t size, Size(idx), "");
        if (offset <= size && n <= size - offset) {
          CKPT_RETURN_IF_ERROR(source->file->ReadLarge(*base + offset, n, out, {}),
                               "record " + Excerpt(RecordName(idx), 200));
          bytes_read += n;
          return Status::Ok();
        }
      }
    }
    std::unique_ptr<zip_file_t, ZipFileCloser> f;
    uint64_t at = 0;      // the record's bytes `f` has read (or seeked past)
    bool stream = false;  // `f` cannot seek: kept open for the next read
    if (!whole) {
      for (auto it = streams.begin(); it != streams.end(); ++it) {
        if (it->idx == idx && it->pos <= offset) {
          f = std::move(it->f);
          at = it->pos;
          stream = true;
          streams.erase(it);
          break;
        }
      }
    }
    if (!f) {
      f.reset(Zip().fopen_index(zip.get(), idx, 0));
      if (!f) return Failed("cannot open " + Named(idx) + ": ", Zip().strerror(zip.get()));
      // A seek (to 0 too, unless the record is read whole) tells a record that cannot.
      if (offset > 0 || !whole) {
        if (Zip().fseek(f.get(), static_cast<zip_int64_t>(offset), SEEK_SET) == 0) {
          at = offset;
        } else {
          // Compressed records cannot seek: read up to the offset.
          f.reset(Zip().fopen_index(zip.get(), idx, 0));
          if (!f) return Failed("cannot open " + Named(idx) + ": ", Zip().strerror(zip.get()));
          stream = true;
        }
      }
    }
    if (at < offset) {
      std::vector<char> skip(1 << 16);
      while (at < offset) {
        const zip_int64_t got =
            Zip().fread(f.get(), skip.data(), std::min<uint64_t>(offset - at, skip.size()));
        if (got <= 0) return Failed(Named(idx) + " ends early", "");
        at += static_cast<uint64_t>(got);
      }
    }
    auto* dst = static_cast<char*>(out);
    uint64_t done = 0;
    while (done < n) {
      const zip_int64_t got = Zip().fread(f.get(), dst + done, n - done);
      if (got < 0) return Failed(Named(idx) + ": ", Zip().file_strerror(f.get()));
      if (got == 0) return DataLoss(path + ": " + Named(idx) + " ends early (truncated archive)");
      done += static_cast<uint64_t>(got);
    }
    if (whole) {
      char more = 0;
      const zip_int64_t got = Zip().fread(f.get(), &more, 1);
      if (got < 0) return Failed(Named(idx) + ": ", Zip().file_strerror(f.get()));
      if (got > 0) return DataLoss(path + ": " + Named(idx) + " holds more bytes than its size");
    }
    bytes_read += n;
    // Kept unless read to its end (a partition read through: its inflate state freed now,
    // not when the file closes).
    if (stream && !whole) {
      const Result<uint64_t> size = Size(idx);
      if (size.ok() && offset + n < *size) {
        if (streams.size() >= kStreams) streams.erase(streams.begin());
        streams.push_back({idx, offset + n, std::move(f)});
      }
    }
    return Status::Ok();
  }

  // Where record idx's data starts in the file, for a record stored uncompressed: where libzip
  // reads its first byte from (a stored record is read through a window onto the archive),
  // checked against that byte read from the file directly. Learned once per record.
  std::optional<uint64_t> DataFileOffset(zip_uint64_t idx) {
    auto it = data_at.find(idx);
    if (it != data_at.end()) return it->second;
    std::optional<uint64_t> at;
    zip_stat_t st;
    Zip().stat_init(&st);
    if (Zip().stat_index(zip.get(), idx, 0, &st) == 0 && (st.valid & ZIP_STAT_COMP_METHOD) &&
        st.comp_method == ZIP_CM_STORE && (st.valid & ZIP_STAT_SIZE) && st.size > 0) {
      std::unique_ptr<zip_file_t, ZipFileCloser> f(Zip().fopen_index(zip.get(), idx, 0));
      char via_zip = 0, direct = 0;
      source->last_read_at = ZipFileSource::kNowhere;
      if (f && Zip().fread(f.get(), &via_zip, 1) == 1 &&
          source->last_read_at != ZipFileSource::kNowhere &&
          source->file->Read(source->last_read_at, 1, &direct).ok() && direct == via_zip)
        at = source->last_read_at;
      source->read_error = Status::Ok();
    }
    data_at.emplace(idx, at);
    return at;
  }

  // Record idx's size as its headers claim it, held to what its compressed bytes can hold: a
  // record stored as it is holds exactly them, a deflated one at most kMaxDeflateRatio times
  // as many (a 258-byte match coded in two bits). A larger claim, with a pickle that sizes a
  // tensor to match, would have a reader allocate and fill memory no byte of the file backs.
  // Other zip methods are refused: torch.save stores records, zip tools deflate them.
  Result<uint64_t> ClaimedSize(zip_uint64_t idx) const {
    zip_stat_t st;
    Zip().stat_init(&st);
    constexpr zip_uint64_t kNeed = ZIP_STAT_SIZE | ZIP_STAT_COMP_SIZE | ZIP_STAT_COMP_METHOD;
    if (Zip().stat_index(zip.get(), idx, 0, &st) != 0 || (st.valid & kNeed) != kNeed)
      return DataLoss(path + ": cannot stat a record: " + Zip().strerror(zip.get()));
    const std::string name = "record " + Excerpt(RecordName(idx), 200);
    const uint64_t size = st.size, comp = st.comp_size;
    if (comp > source->file->size())
      return DataLoss(path + ": " + name + " claims " + std::to_string(comp) +
                      " compressed bytes, more than the file's " +
                      std::to_string(source->file->size()));
    if (st.comp_method == ZIP_CM_STORE) {
      if (size != comp)
        return DataLoss(path + ": " + name + " is stored as it is but claims " +
                        std::to_string(size) + " bytes from " + std::to_string(comp));
    } else if (st.comp_method == ZIP_CM_DEFLATE) {
      if (size / kMaxDeflateRatio > comp)
        return DataLoss(path + ": " + name + " claims " + std::to_string(size) + " bytes from " +
                        std::to_string(comp) + " deflated, more than deflate can hold (" +
                        std::to_string(kMaxDeflateRatio) + " to 1)");
    } else {
      return Unimplemented(path + ": " + name + " is compressed with zip method " +
                           std::to_string(st.comp_method) +
                           "; records stored as they are (torch.save) or deflated are read");
    }
    return size;
  }

  Result<uint64_t> Size(zip_uint64_t idx) const {
    zip_stat_t st;
    Zip().stat_init(&st);
    if (Zip().stat_index(zip.get(), idx, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE))
      return DataLoss(path + ": cannot stat a record: " + Zip().strerror(zip.get()));
    return static_cast<uint64_t>(st.size);
  }

  // A record stored as it is, placed in the file: its bytes are [at, at + size), `want` the
  // CRC-32 the archive records, `crc` the one computed over them so far.
  struct Placed {
    uint64_t at, size;
    uint32_t want, crc;
    const std::string* name;  // below prefix
  };

  // Where record `name` (index idx) lies when it is stored as it is (all that torch.save
  // writes; DataFileOffset) and its bytes lie inside the file; nullopt otherwise (a compressed
  // or empty record: read through libzip).
  std::optional<Placed> Place(const std::string& name, zip_uint64_t idx) {
    zip_stat_t st;
    Zip().stat_init(&st);
    if (Zip().stat_index(zip.get(), idx, 0, &st) != 0 || !(st.valid & ZIP_STAT_CRC) ||
        !(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || st.comp_size != st.size)
      return std::nullopt;
    const std::optional<uint64_t> at = DataFileOffset(idx);  // one byte or more only
    const uint64_t file_size = source->file->size();
    if (!at || *at > file_size || st.size > file_size - *at) return std::nullopt;
    return Placed{*at, static_cast<uint64_t>(st.size), static_cast<uint32_t>(st.crc), 0, &name};
  }

  // Reads placed[first, last) (in file order, none overlapping the one before) as one range
  // from where it lies, past the page cache with the reads ahead of the CRC
  // (RandomAccessFile::Scan), each record's CRC-32 computed by libdeflate over its own bytes as
  // they pass; CrcError naming the first record whose CRC is not the archive's. Through libzip
  // each 16 MiB was read, then copied, then CRC'd by zlib, one after the other on one thread:
  // `ckpt check` of a DeepSpeed checkpoint ran at 0.27 of a cold read (issue 19,
  // docs/performance.md, 2026-12-05 04:30).
  Status ScanRun(std::vector<Placed>& placed, size_t first, size_t last,
                 const std::function<void(uint64_t)>& on_bytes) {
    const uint64_t begin = placed[first].at;
    const uint64_t end = placed[last - 1].at + placed[last - 1].size;
    size_t k = first;  // the first record of the run not yet wholly passed
    const auto consume = [&](uint64_t off, const uint8_t* p, size_t n) {
      const uint64_t hi = off + n;
      while (k < last && placed[k].at + placed[k].size <= off) ++k;
      for (size_t j = k; j < last && placed[j].at < hi; ++j) {
        Placed& r = placed[j];
        const uint64_t lo = std::max(off, r.at);
        const uint64_t up = std::min(hi, r.at + r.size);
        if (lo < up) r.crc = ZipCrc32(r.crc, p + (lo - off), up - lo);
      }
      if (on_bytes) on_bytes(n);
      return Status::Ok();
    };
    CKPT_RETURN_IF_ERROR(source->file->Scan(begin, end - begin, consume),
                         last - first == 1
                             ? "record " + Excerpt(prefix + *placed[first].name, 200)
                             : "records " + Excerpt(prefix + *placed[first].name, 100) + " to " +
                                   Excerpt(prefix + *placed[last - 1].name, 100));
    bytes_read += end - begin;
    scanned_bytes += end - begin;
    for (size_t j = first; j < last; ++j)
      if (placed[j].crc != placed[j].want)
        return CrcError(path, Excerpt(prefix + *placed[j].name, 200), placed[j].want,
                        placed[j].crc);
    return Status::Ok();
  }

  // Reads record `name` (index idx) to its end through libzip, which compares the CRC-32
  // there. Reads of 16 MiB, so a storage's bytes leave the disk past the page cache
  // (ZipFileSource), into `buf`: I/O memory that is not zero-filled first
  // (ckpt/aligned_buffer.h), allocated on first use.
  Status VerifyThroughZip(const std::string& name, zip_uint64_t idx, AlignedBuffer& buf,
                          const std::function<void(uint64_t)>& on_bytes) {
    const std::string record = Excerpt(prefix + name, 200);
    source->read_error = Status::Ok();
    if (buf.size() == 0) buf = AlignedBuffer(16u << 20);
    std::unique_ptr<zip_file_t, ZipFileCloser> f(Zip().fopen_index(zip.get(), idx, 0));
    if (!f) return Failed("record " + Excerpt(name, 200) + ": ", Zip().strerror(zip.get()));
    while (true) {
      const zip_int64_t got = Zip().fread(f.get(), buf.data(), buf.size());
      if (got < 0) return Failed("record " + record + ": ", Zip().file_strerror(f.get()));
      if (got == 0) break;
      bytes_read += static_cast<uint64_t>(got);
      if (on_bytes) on_bytes(static_cast<uint64_t>(got));
    }
    return Status::Ok();
  }

  // The name libzip gives record idx (for errors).
  std::string RecordName(zip_uint64_t idx) const {
    const char* name = Zip().get_name(zip.get(), idx, 0);
    return name ? name : "?";
  }
  // "record NAME", as messages name the record a read failed in (escaped where not printable).
  std::string Named(zip_uint64_t idx) const { return "record " + Excerpt(RecordName(idx), 200); }
};

TorchFile::TorchFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TorchFile::TorchFile(TorchFile&&) noexcept = default;
TorchFile& TorchFile::operator=(TorchFile&&) noexcept = default;
TorchFile::~TorchFile() = default;

const std::string& TorchFile::path() const { return impl_->path; }
const PickleDoc& TorchFile::doc() const { return impl_->doc; }
uint64_t TorchFile::bytes_read() const { return impl_->bytes_read; }
uint64_t TorchFile::file_size() const { return impl_->source->file->size(); }
const TorchTensorRef& TorchFile::tensor(const PyValue& v) const {
  return impl_->doc.tensors()[static_cast<size_t>(v.tensor)];
}

Result<TorchFile> TorchFile::Open(const std::string& path, Env* env) {
  CKPT_RETURN_IF_ERROR(LoadZip().status(), path);
  if (!env) env = Env::Default();
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->source = std::make_unique<ZipFileSource>();
  CKPT_ASSIGN_OR_RETURN(impl->source->file, env->NewCheckpointFile(path), "");
  zip_error_t err;
  Zip().error_init(&err);
  struct ErrorFini {
    zip_error_t* e;
    ~ErrorFini() { Zip().error_fini(e); }
  } fini{&err};
  zip_source_t* src =
      Zip().source_function_create(&ZipFileSource::Callback, impl->source.get(), &err);
  if (!src) return ResourceExhausted(path + ": libzip: " + ZipErrorText(&err));
  impl->zip.reset(Zip().open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &err));
  if (!impl->zip) {
    Zip().source_free(src);  // the archive owns it only once open
    if (!impl->source->read_error.ok()) return impl->source->read_error;
    if (Zip().error_code_zip(&err) == ZIP_ER_MEMORY)
      return ResourceExhausted(path + ": libzip: " + ZipErrorText(&err));
    return DataLoss(path + ": not a readable PyTorch zip archive (" + ZipErrorText(&err) +
                    "; truncated or damaged?)");
  }
  impl->source->hinting = false;
  impl->source->hinted.clear();
  const zip_int64_t n = Zip().get_num_entries(impl->zip.get(), 0);
  if (n <= 0) return DataLoss(path + ": empty archive");
  for (zip_int64_t i = 0; i < n; ++i) {
    const char* name = Zip().get_name(impl->zip.get(), static_cast<zip_uint64_t>(i), 0);
    if (!name) return DataLoss(path + ": unreadable record name");
    std::string s(name);
    const size_t slash = s.find('/');
    if (slash == std::string::npos)
      return DataLoss(path + ": record '" + Excerpt(s, 200) + "' outside a directory");
    const std::string prefix = s.substr(0, slash + 1);
    if (impl->prefix.empty()) impl->prefix = prefix;
    if (prefix != impl->prefix)
      return DataLoss(path + ": records under two top-level directories ('" +
                      Excerpt(impl->prefix, 200) + "', '" + Excerpt(prefix, 200) + "')");
    impl->records[s.substr(slash + 1)] = static_cast<zip_uint64_t>(i);
  }
  if (auto it = impl->records.find("byteorder"); it != impl->records.end()) {
    CKPT_ASSIGN_OR_RETURN(uint64_t size, impl->Size(it->second), path);
    if (size > 16) return DataLoss(path + ": byteorder record too large");
    std::string order(size, '\0');
    CKPT_RETURN_IF_ERROR(impl->ReadAt(it->second, 0, size, order.data()), "");
    if (order != "little")
      return Unimplemented(path + ": tensors stored " + Excerpt(order) +
                           "-endian; only little is read");
  }
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t pkl, impl->Index("data.pkl"), "");
  CKPT_ASSIGN_OR_RETURN(uint64_t pkl_size, impl->ClaimedSize(pkl), "");
  if (pkl_size > kMaxPickleBytes)
    return DataLoss(path + ": data.pkl is " + std::to_string(pkl_size) + " bytes (limit " +
                    std::to_string(kMaxPickleBytes) + ")");
  std::string pickle(pkl_size, '\0');
  CKPT_RETURN_IF_ERROR(impl->ReadAt(pkl, 0, pkl_size, pickle.data(), /*whole=*/true), "");
  impl->bytes_read = 0;  // count tensor data only
  CKPT_ASSIGN_OR_RETURN(impl->doc, ParsePickle(pickle, path), "");
  for (const auto& t : impl->doc.tensors()) {
    CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl->Index("data/" + t.key), "");
    CKPT_ASSIGN_OR_RETURN(uint64_t size, impl->ClaimedSize(idx), "");
    const uint64_t need = static_cast<uint64_t>(t.storage_numel) * t.itemsize;
    if (size < need)
      return DataLoss(path + ": storage record data/" + Excerpt(t.key, 80) + " holds " +
                      std::to_string(size) + " bytes, the pickle says " +
                      std::to_string(t.storage_numel) + " " + t.dtype_name + " elements (" +
                      std::to_string(need) + " bytes)");
  }
  return TorchFile(std::move(impl));
}

Status TorchFile::ReadElements(const TorchTensorRef& t, int64_t first, int64_t count, void* out) {
  if (first < 0 || count < 0 || first + count > t.numel())
    return InvalidArgument(impl_->path + ": element range outside tensor");
  if (count == 0) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl_->Index("data/" + t.key), "");
  const uint64_t is = t.itemsize;
  if (t.contiguous())
    return impl_->ReadAt(idx, static_cast<uint64_t>(t.offset + first) * is,
                         static_cast<uint64_t>(count) * is, out);
  // Strided: read the span the view covers (checked at parse time to fit the storage), gather.
  int64_t hi = t.offset;
  for (size_t k = 0; k < t.shape.size(); ++k) hi += (t.shape[k] - 1) * t.stride[k];
  std::vector<char> span(static_cast<size_t>(hi - t.offset + 1) * is);
  CKPT_RETURN_IF_ERROR(
      impl_->ReadAt(idx, static_cast<uint64_t>(t.offset) * is, span.size(), span.data()), "");
  auto* dst = static_cast<char*>(out);
  std::vector<int64_t> pos(t.shape.size(), 0);
  // Position of element `first` in row-major order.
  int64_t rem = first;
  for (size_t k = t.shape.size(); k-- > 0;) {
    pos[k] = rem % t.shape[k];
    rem /= t.shape[k];
  }
  for (int64_t e = 0; e < count; ++e) {
    int64_t at = 0;
    for (size_t k = 0; k < pos.size(); ++k) at += pos[k] * t.stride[k];
    std::memcpy(dst + static_cast<size_t>(e) * is, span.data() + static_cast<size_t>(at) * is, is);
    for (size_t k = pos.size(); k-- > 0;) {
      if (++pos[k] < t.shape[k]) break;
      pos[k] = 0;
    }
  }
  return Status::Ok();
}

std::optional<uint64_t> TorchFile::ElementFileOffset(const TorchTensorRef& t, int64_t first) {
  if (!t.contiguous() || first < 0 || first > t.numel()) return std::nullopt;
  auto idx = impl_->Index("data/" + t.key);
  if (!idx.ok()) return std::nullopt;
  const std::optional<uint64_t> at = impl_->DataFileOffset(*idx);
  if (!at) return std::nullopt;
  return *at + static_cast<uint64_t>(t.offset + first) * t.itemsize;
}

Status TorchFile::ReadFloats(const TorchTensorRef& t, int64_t first, int64_t count, float* out) {
  if (!t.dtype || (*t.dtype != DType::kF32 && *t.dtype != DType::kF64 &&
                   *t.dtype != DType::kBF16 && *t.dtype != DType::kF16))
    return DataLoss(impl_->path + ": tensor of " + t.dtype_name + " where floats were expected");
  if (*t.dtype == DType::kF32) return ReadElements(t, first, count, out);
  std::vector<char> raw(static_cast<size_t>(count) * t.itemsize);
  CKPT_RETURN_IF_ERROR(ReadElements(t, first, count, raw.data()), "");
  FloatsToF32(*t.dtype, raw.data(), static_cast<size_t>(count), out);
  return Status::Ok();
}

Status TorchFile::VerifyRecords(const std::function<void(uint64_t)>& on_bytes) {
  Impl& I = *impl_;
  // Every record stored as it is, in file order: records no further apart than kMaxRunGap (a
  // local header and its padding lie between two) are read as one range (Impl::ScanRun). One
  // Scan per record, in name order, made a model file of 300 parameters of 512 KiB 300
  // requests of one block each, and its records under 64 KiB went through libzip
  // (docs/performance.md, 2026-12-05 17:00). A record libzip cannot place (a compressed one)
  // is read through libzip.
  std::vector<Impl::Placed> placed;
  AlignedBuffer buf;  // the libzip path's reads, allocated on first use
  for (const auto& [name, idx] : I.records) {
    if (std::optional<Impl::Placed> p = I.Place(name, idx)) {
      placed.push_back(*p);
      continue;
    }
    CKPT_RETURN_IF_ERROR(I.VerifyThroughZip(name, idx, buf, on_bytes), "");
  }
  std::sort(placed.begin(), placed.end(),
            [](const Impl::Placed& a, const Impl::Placed& b) { return a.at < b.at; });
  constexpr uint64_t kMaxRunGap = 64u << 10;
  for (size_t first = 0; first < placed.size();) {
    // The run [first, last): none overlapping the one before (a hostile archive's overlapping
    // records start runs of their own).
    size_t last = first + 1;
    uint64_t end = placed[first].at + placed[first].size;
    while (last < placed.size() && placed[last].at >= end && placed[last].at - end <= kMaxRunGap) {
      end = placed[last].at + placed[last].size;
      ++last;
    }
    CKPT_RETURN_IF_ERROR(I.ScanRun(placed, first, last, on_bytes), "");
    first = last;
  }
  return Status::Ok();
}

Result<TorchFile::StorageRecord> TorchFile::Storage(const TorchTensorRef& t) {
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl_->Index("data/" + t.key), "");
  zip_stat_t st;
  Zip().stat_init(&st);
  if (Zip().stat_index(impl_->zip.get(), idx, 0, &st) != 0 || !(st.valid & ZIP_STAT_SIZE) ||
      !(st.valid & ZIP_STAT_CRC))
    return DataLoss(impl_->path + ": cannot stat record " +
                    Excerpt(impl_->prefix + "data/" + t.key, 200) + ": " +
                    Zip().strerror(impl_->zip.get()));
  const bool stored = (st.valid & ZIP_STAT_COMP_METHOD) && st.comp_method == ZIP_CM_STORE &&
                      (st.valid & ZIP_STAT_COMP_SIZE) && st.comp_size == st.size;
  return StorageRecord{static_cast<uint64_t>(st.size), static_cast<uint32_t>(st.crc), stored};
}

Status TorchFile::CrcStorageBytes(const TorchTensorRef& t, uint64_t from, uint64_t to,
                                  uint32_t* crc) {
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl_->Index("data/" + t.key), "");
  CKPT_ASSIGN_OR_RETURN(uint64_t size, impl_->Size(idx), "");
  if (from > to || to > size)
    return InvalidArgument(impl_->path + ": byte range outside record " +
                           Excerpt(impl_->prefix + "data/" + t.key, 200));
  constexpr uint64_t kChunk = 4u << 20;
  std::vector<uint8_t> buf(static_cast<size_t>(std::min(kChunk, to - from)));
  for (uint64_t at = from; at < to;) {
    const uint64_t n = std::min(kChunk, to - at);
    CKPT_RETURN_IF_ERROR(impl_->ReadAt(idx, at, n, buf.data()), "");
    *crc = ZipCrc32(*crc, buf.data(), static_cast<size_t>(n));
    at += n;
  }
  return Status::Ok();
}

Status TorchFile::CompareStorageCrc(const TorchTensorRef& t, uint32_t crc) {
  CKPT_ASSIGN_OR_RETURN(const StorageRecord rec, Storage(t), "");
  if (crc == rec.crc) return Status::Ok();
  return CrcError(impl_->path, Excerpt(impl_->prefix + "data/" + t.key, 200), rec.crc, crc);
}

Status TorchFile::VerifyStorage(const TorchTensorRef& t) {
  const std::string name = "data/" + t.key;
  CKPT_ASSIGN_OR_RETURN(zip_uint64_t idx, impl_->Index(name), "");
  if (std::optional<Impl::Placed> p = impl_->Place(name, idx)) {
    std::vector<Impl::Placed> one = {*p};
    return impl_->ScanRun(one, 0, 1, {});
  }
  AlignedBuffer buf;
  return impl_->VerifyThroughZip(name, idx, buf, {});
}

Status TorchFile::ReadElementsChecked(const TorchTensorRef& t, int64_t first, int64_t count,
                                      void* out) {
  if (first < 0 || count < 0 || first + count > t.numel())
    return InvalidArgument(impl_->path + ": element range outside tensor");
  CKPT_ASSIGN_OR_RETURN(const StorageRecord rec, Storage(t), "");
  if (!t.contiguous() || !rec.stored) {
    CKPT_RETURN_IF_ERROR(VerifyStorage(t), "");
    return ReadElements(t, first, count, out);
  }
  const uint64_t at = static_cast<uint64_t>(t.offset + first) * t.itemsize;
  const uint64_t n = static_cast<uint64_t>(count) * t.itemsize;
  uint32_t crc = 0;
  CKPT_RETURN_IF_ERROR(CrcStorageBytes(t, 0, at, &crc), "");
  CKPT_RETURN_IF_ERROR(ReadElements(t, first, count, out), "");
  crc = ZipCrc32(crc, out, static_cast<size_t>(n));
  CKPT_RETURN_IF_ERROR(CrcStorageBytes(t, at + n, rec.size, &crc), "");
  return CompareStorageCrc(t, crc);
}

uint32_t ZipCrc32(uint32_t crc, const void* bytes, size_t n) {
  return static_cast<uint32_t>(libdeflate_crc32(crc, bytes, n));
}

uint64_t TorchFile::scanned_bytes() const { return impl_->scanned_bytes; }

}  // namespace ckpt
