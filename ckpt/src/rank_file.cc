#include "rank_file.h"

#include <zstd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/aligned_buffer.h"
#include "ckpt/env.h"
#include "ckpt/h5.h"
#include "ckpt/hash.h"
#include "ckpt/rank_threads.h"
#include "ckpt/run_ahead.h"
#include "ckpt/shape.h"
#include "ckpt/universal.h"
#include "zstd_filter.h"

namespace ckpt::internal {

void PieceDigests::Update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, piece_bytes_ - filled_));
    current_.Update(p, take);
    filled_ += take;
    p += take;
    n -= take;
    if (filled_ == piece_bytes_) {
      done_.push_back(current_.HexDigest());
      current_ = Xxh3Stream();
      filled_ = 0;
    }
  }
}

std::vector<std::string> PieceDigests::Finish() {
  if (filled_ > 0) done_.push_back(current_.HexDigest());
  filled_ = 0;
  current_ = Xxh3Stream();
  return std::move(done_);
}

uint64_t EffectivePieceBytes(uint64_t requested) { return std::max<uint64_t>(8, requested / 8 * 8); }

namespace {

#if defined(__SSE2__)
// One riffle of 64 bytes held in v[0..3]: byte j of the first half goes to 2j, byte j of the
// second half to 2j + 1 (position i moves to 2i mod 63).
inline void Riffle64(__m128i v[4]) {
  const __m128i a = _mm_unpacklo_epi8(v[0], v[2]), b = _mm_unpackhi_epi8(v[0], v[2]);
  const __m128i c = _mm_unpacklo_epi8(v[1], v[3]), d = _mm_unpackhi_epi8(v[1], v[3]);
  v[0] = a;
  v[1] = b;
  v[2] = c;
  v[3] = d;
}
#endif

// HDF5's shuffle filter: byte j of every element goes to plane j. fp32 (the bulk of a
// checkpoint) takes 16 elements a step with SSE2: the 16 x 4 byte transpose is four riffles
// (byte 4e + b goes to 16b + e = 16 (4e + b) mod 63); it was a tenth of a compressed save's CPU
// as a scalar loop. bf16/fp16 read each element once and write both planes in the same pass;
// the general case walks one plane at a time.
void ByteShuffle(const uint8_t* in, uint8_t* out, size_t nbytes, size_t elem) {
  const size_t n = nbytes / elem;
  if (elem == 4) {
    uint8_t* p0 = out;
    uint8_t* p1 = out + n;
    uint8_t* p2 = out + 2 * n;
    uint8_t* p3 = out + 3 * n;
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
      __m128i v[4];
      for (int k = 0; k < 4; ++k)
        v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 4 * i + 16 * k));
      for (int r = 0; r < 4; ++r) Riffle64(v);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p0 + i), v[0]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p1 + i), v[1]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p2 + i), v[2]);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p3 + i), v[3]);
    }
#endif
    for (; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, in + 4 * i, 4);
      p0[i] = static_cast<uint8_t>(v);
      p1[i] = static_cast<uint8_t>(v >> 8);
      p2[i] = static_cast<uint8_t>(v >> 16);
      p3[i] = static_cast<uint8_t>(v >> 24);
    }
  } else if (elem == 2) {
    uint8_t* p0 = out;
    uint8_t* p1 = out + n;
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, in + 2 * i, 2);
      p0[i] = static_cast<uint8_t>(v);
      p1[i] = static_cast<uint8_t>(v >> 8);
    }
  } else {
    for (size_t j = 0; j < elem; ++j) {
      uint8_t* dst = out + j * n;
      for (size_t i = 0; i < n; ++i) dst[i] = in[i * elem + j];
    }
  }
  std::memcpy(out + n * elem, in + n * elem, nbytes - n * elem);  // leftover bytes, as HDF5
}

// The inverse of ByteShuffle for elements [e0, e0 + count) of a chunk of n elements (plane j
// at in + j * n): element i gathers byte j from plane j; out gets count * elem bytes. The 2- and
// 4-byte cases interleave 16 elements a step with SSE2 (the scalar loop finishes the tail). A
// load unshuffles a chunk a block at a time into a buffer that stays in L1 (DecodeChunks).
void ByteUnshuffle(const uint8_t* in, size_t n, size_t elem, size_t e0, size_t count,
                   uint8_t* out) {
  if (elem == 4) {
    const uint8_t* p0 = in + e0;
    const uint8_t* p1 = in + n + e0;
    const uint8_t* p2 = in + 2 * n + e0;
    const uint8_t* p3 = in + 3 * n + e0;
    size_t i = 0;
#if defined(__SSE2__)
    // 16 elements a step: interleave the planes bytewise (0 with 1, 2 with 3), then the pairs.
    for (; i + 16 <= count; i += 16) {
      const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
      const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
      const __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p2 + i));
      const __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p3 + i));
      const __m128i lo01 = _mm_unpacklo_epi8(a0, a1), hi01 = _mm_unpackhi_epi8(a0, a1);
      const __m128i lo23 = _mm_unpacklo_epi8(a2, a3), hi23 = _mm_unpackhi_epi8(a2, a3);
      auto* o = reinterpret_cast<__m128i*>(out + 4 * i);
      _mm_storeu_si128(o, _mm_unpacklo_epi16(lo01, lo23));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi16(lo01, lo23));
      _mm_storeu_si128(o + 2, _mm_unpacklo_epi16(hi01, hi23));
      _mm_storeu_si128(o + 3, _mm_unpackhi_epi16(hi01, hi23));
    }
#endif
    for (; i < count; ++i) {
      const uint32_t v = static_cast<uint32_t>(p0[i]) | static_cast<uint32_t>(p1[i]) << 8 |
                         static_cast<uint32_t>(p2[i]) << 16 | static_cast<uint32_t>(p3[i]) << 24;
      std::memcpy(out + 4 * i, &v, 4);
    }
  } else if (elem == 2) {
    const uint8_t* p0 = in + e0;
    const uint8_t* p1 = in + n + e0;
    size_t i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= count; i += 16) {
      const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p0 + i));
      const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1 + i));
      auto* o = reinterpret_cast<__m128i*>(out + 2 * i);
      _mm_storeu_si128(o, _mm_unpacklo_epi8(a0, a1));
      _mm_storeu_si128(o + 1, _mm_unpackhi_epi8(a0, a1));
    }
#endif
    for (; i < count; ++i) {
      const uint16_t v = static_cast<uint16_t>(p0[i] | p1[i] << 8);
      std::memcpy(out + 2 * i, &v, 2);
    }
  } else {
    for (size_t j = 0; j < elem; ++j) {
      const uint8_t* src = in + j * n + e0;
      for (size_t i = 0; i < count; ++i) out[i * elem + j] = src[i];
    }
  }
}

// Copies n bytes to dst with streaming stores when dst is 16-byte aligned: a load's bytes go to
// memory its caller reads later, so they need not be read into the cache first nor evict what
// is being decompressed and hashed (unshuffle and hash from an L1 block, then this: 6.8-7.1
// GiB/s on one development VM against 4.5-4.8 for unshuffling into the destination and
// hashing it there; on another about even, median 6.7 against 6.4: docs/performance.md,
// 2026-12-03). Unaligned destinations and the tail use memcpy.
void StreamCopy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__SSE2__)
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      const auto* s = reinterpret_cast<const __m128i*>(src + i);
      auto* d = reinterpret_cast<__m128i*>(dst + i);
      const __m128i v0 = _mm_loadu_si128(s), v1 = _mm_loadu_si128(s + 1);
      const __m128i v2 = _mm_loadu_si128(s + 2), v3 = _mm_loadu_si128(s + 3);
      _mm_stream_si128(d, v0);
      _mm_stream_si128(d + 1, v1);
      _mm_stream_si128(d + 2, v2);
      _mm_stream_si128(d + 3, v3);
    }
    _mm_sfence();  // ordered before whatever the caller does next, as memcpy's stores
    std::memcpy(dst + i, src + i, n - i);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

// The number of threads a chunk pipeline of `items` items gets: the hardware's threads shared
// among the pipelines running now in this process (check --deep runs one per file, a loader
// may read several ranks at once), at least 1, at most 16 and `items`.
class PipelineThreads {
 public:
  explicit PipelineThreads(int64_t items, int requested = 0) {
    const int running = ++running_;
    int n = requested;
    if (n <= 0)
      n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / running;
    threads_ = static_cast<int>(std::clamp<int64_t>(std::min<int64_t>(n, 16), 1,
                                                    std::max<int64_t>(items, 1)));
  }
  ~PipelineThreads() { --running_; }
  PipelineThreads(const PipelineThreads&) = delete;
  PipelineThreads& operator=(const PipelineThreads&) = delete;
  int count() const { return threads_; }

 private:
  static inline std::atomic<int> running_{0};
  int threads_ = 1;
};

// Runs work(i, worker) for every i in [0, n) on `threads` threads (worker in [0, threads)),
// never more than `window` items ahead of the consumer, and consume(i) on the calling thread
// in the order of i as each item is done: the chunk pipeline of compressed reads and writes
// (workers compress or decompress outside HDF5's lock; the caller hashes, or hands chunks to
// HDF5, in order). The first error stops it: later items are not started and the error is
// returned once the workers have stopped. A failed allocation is ResourceExhausted; with
// threads <= 1, or when no thread can be started, everything runs on the calling thread.
// `on_error` (may be empty) is called on the failing thread as soon as work or consume fails,
// for whatever feeds the workers from outside the pipeline (DecodeChunks' FrameReader) to
// stop too. (ckpt::RunAhead's pipeline, with a worker index and allocation failures as a
// Status.)
Status RunOrdered(int64_t n, int threads, int64_t window,
                  const std::function<Status(int64_t, int)>& work,
                  const std::function<Status(int64_t)>& consume,
                  const std::function<void()>& on_error = {}) {
  auto failed = [&](Status s) {
    if (!s.ok() && on_error) on_error();
    return s;
  };
  auto guarded = [&](int64_t i, int w) {
    return failed(OutOfMemoryAsStatus("chunk", [&] { return work(i, w); }));
  };
  auto ordered = [&](int64_t i) { return failed(consume(i)); };
  if (threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) {
      CKPT_RETURN_IF_ERROR(guarded(i, 0));
      CKPT_RETURN_IF_ERROR(ordered(i));
    }
    return Status::Ok();
  }
  return RunAheadOnProducers(
      static_cast<uint64_t>(n), static_cast<int>(std::max<int64_t>(window, 1)),
      [&](uint64_t i, int, int w) { return guarded(static_cast<int64_t>(i), w); },
      [&](uint64_t i, int) { return ordered(static_cast<int64_t>(i)); }, threads);
}

// The compressed-chunk pipeline's memory, kept for every compressed dataset of a rank file
// (the writer's buffers per dataset were freshly mapped each time, and fresh memory costs its
// page faults: on the development VM 0.34 GiB/s in 4 KiB pages and 0.6 in 2 MiB pages,
// docs/performance.md). I/O memory (huge pages from 2 MiB up), grown as a dataset needs.
struct CompressScratch {
  std::vector<AlignedBuffer> out;     // the window's compressed chunks
  std::vector<size_t> out_size;       // bytes of each
  std::vector<AlignedBuffer> staged;  // per worker: the chunk as zstd sees it (shuffled, padded)
  std::vector<AlignedBuffer> plain;   // per worker: a short edge chunk padded before shuffling
  std::vector<AlignedBuffer> filled;  // a `fill` dataset's window of logical chunks
  std::vector<ZSTD_CCtx*> cctx;       // per worker
  CompressScratch() = default;
  CompressScratch(const CompressScratch&) = delete;
  CompressScratch& operator=(const CompressScratch&) = delete;
  ~CompressScratch() {
    for (ZSTD_CCtx* c : cctx) ZSTD_freeCCtx(c);
  }
  // At least `n` slots, each of at least `bytes` (std::bad_alloc when memory cannot be had).
  static void Ensure(std::vector<AlignedBuffer>& v, size_t n, size_t bytes) {
    if (v.size() < n) v.resize(n);
    for (size_t i = 0; i < n; ++i)
      if (v[i].size() < bytes) v[i] = AlignedBuffer(bytes);
  }
};

// Writes one chunked tensor with zstd through direct chunk writes: `threads` workers shuffle and
// compress chunks outside the HDF5 lock while the calling thread hands the finished ones to
// HDF5 in order and feeds their logical bytes to the dataset's digests (`digest`, `pieces`).
// A `fill` dataset is written in batches of the pipeline's window: the calling thread asks
// for the batch's chunks in order (in fill windows of at most `window_bytes`), then the batch
// goes through the pipeline; so at most one batch of its bytes is in memory.
// With `writeback` (the same file), each chunk's writeback starts as soon as HDF5 has written
// it, so the disk writes while the next chunks compress instead of all at the final fsync.
Status WriteCompressedChunks(hid_t dset, const DatasetSpec& spec, int64_t rows_per_chunk,
                             int64_t inner, const Compression& comp, int threads,
                             uint64_t window_bytes, Xxh3Stream* digest, PieceDigests* pieces,
                             RandomWriteFile* writeback, CompressScratch* scratch) {
  const size_t elem = DTypeSize(spec.dtype);
  const int64_t rows = spec.shape[0];
  const size_t chunk_bytes = static_cast<size_t>(rows_per_chunk * inner) * elem;
  const int64_t nchunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const auto* src = static_cast<const uint8_t*>(spec.data);
  PipelineThreads pool(nchunks, threads);
  const int workers = pool.count();
  const int64_t window = 2 * workers;
  auto have_bytes = [&](int64_t c) {
    const int64_t row0 = c * rows_per_chunk;
    return static_cast<size_t>(std::min(rows_per_chunk, rows - row0) * inner) * elem;
  };
  auto& out = scratch->out;
  auto& out_size = scratch->out_size;
  auto& cctx = scratch->cctx;
  const size_t bound = ZSTD_compressBound(chunk_bytes);
  CKPT_RETURN_IF_ERROR(OutOfMemoryAsStatus("chunk buffers", [&] {
    CompressScratch::Ensure(out, static_cast<size_t>(window), bound);
    if (out_size.size() < static_cast<size_t>(window)) out_size.resize(static_cast<size_t>(window));
    CompressScratch::Ensure(scratch->staged, static_cast<size_t>(workers), chunk_bytes);
    if (cctx.size() < static_cast<size_t>(workers))
      cctx.resize(static_cast<size_t>(workers), nullptr);
    if (spec.fill)
      CompressScratch::Ensure(scratch->filled, static_cast<size_t>(window), chunk_bytes);
    if (comp.shuffle && have_bytes(nchunks - 1) < chunk_bytes)  // a short edge chunk
      CompressScratch::Ensure(scratch->plain, static_cast<size_t>(workers), chunk_bytes);
    return Status::Ok();
  }));
  auto begin_byte = [&](int64_t c) {
    return static_cast<uint64_t>(c * rows_per_chunk * inner) * elem;
  };
  // Chunk c's logical bytes: in the caller's buffer, or in its fill slot.
  auto input_of = [&](int64_t c) -> const uint8_t* {
    return spec.fill ? scratch->filled[static_cast<size_t>(c % window)].data()
                     : src + begin_byte(c);
  };
  auto compress = [&](int64_t c, int w) -> Status {
    const size_t have = have_bytes(c);
    const uint8_t* base = input_of(c);
    // The edge chunk is stored full size, zero-padded, as HDF5 does.
    const uint8_t* input = base;
    uint8_t* st = scratch->staged[static_cast<size_t>(w)].data();
    if (comp.shuffle || have < chunk_bytes) {
      if (comp.shuffle) {
        const uint8_t* from = base;
        if (have < chunk_bytes) {
          uint8_t* pl = scratch->plain[static_cast<size_t>(w)].data();
          std::memcpy(pl, base, have);
          std::memset(pl + have, 0, chunk_bytes - have);
          from = pl;
        }
        ByteShuffle(from, st, chunk_bytes, elem);  // writes every byte of the chunk
      } else {
        std::memcpy(st, base, have);
        std::memset(st + have, 0, chunk_bytes - have);
      }
      input = st;
    }
    ZSTD_CCtx*& cc = cctx[static_cast<size_t>(w)];
    if (!cc && !(cc = ZSTD_createCCtx())) return ResourceExhausted("zstd: no compression context");
    AlignedBuffer& dst = out[static_cast<size_t>(c % window)];
    const size_t got = ZSTD_compressCCtx(cc, dst.data(), bound, input, chunk_bytes, comp.level);
    if (ZSTD_isError(got)) return Internal(std::string("zstd compress: ") + ZSTD_getErrorName(got));
    out_size[static_cast<size_t>(c % window)] = got;
    return Status::Ok();
  };
  auto write = [&](int64_t c) -> Status {
    const size_t have = have_bytes(c);
    const uint8_t* base = input_of(c);
    digest->Update(base, have);
    pieces->Update(base, have);
    hsize_t offset[H5S_MAX_RANK] = {0};
    offset[0] = static_cast<hsize_t>(c * rows_per_chunk);
    if (H5Dwrite_chunk(dset, H5P_DEFAULT, 0, offset, out_size[static_cast<size_t>(c % window)],
                       out[static_cast<size_t>(c % window)].data()) < 0)
      return IOError("write chunk: " + h5::ErrorText());
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (writeback && H5Dget_chunk_info_by_coord(dset, offset, &mask, &addr, &size) >= 0 &&
        addr != HADDR_UNDEF)
      writeback->StartWriteback(static_cast<uint64_t>(addr), static_cast<uint64_t>(size));
    return Status::Ok();
  };
  // A failed allocation, or a worker that cannot start, is this save's error
  // (ResourceExhausted), never an exception that aborts the process.
  if (!spec.fill) return RunOrdered(nchunks, workers, window, compress, write);
  for (int64_t first = 0; first < nchunks; first += window) {
    const int64_t count = std::min(window, nchunks - first);
    for (int64_t c = first; c < first + count; ++c) {
      AlignedBuffer& buf = scratch->filled[static_cast<size_t>(c % window)];
      const size_t have = have_bytes(c);
      for (size_t done = 0; done < have; done += window_bytes) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(window_bytes, have - done));
        CKPT_RETURN_IF_ERROR(spec.fill(begin_byte(c) + done, n, buf.data() + done), "");
        if (spec.filled) spec.filled();
      }
    }
    CKPT_RETURN_IF_ERROR(RunOrdered(
        count, workers, window, [&](int64_t i, int w) { return compress(first + i, w); },
        [&](int64_t i) { return write(first + i); }));
  }
  return Status::Ok();
}

// Where one uncompressed dataset's bytes go in the file: HDF5 allocates the region when the
// dataset is created and the data phase fills it with plain pwrite.
struct DirectSegment {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  const DatasetSpec* spec = nullptr;  // its `data` or `fill`
  size_t record = 0;                  // index into the records
};

// The digests of the compressed datasets, computed as their chunks are written: record index ->
// whole-dataset digest and piece digests.
using ChunkDigests = std::map<size_t, std::pair<Xxh3Stream, PieceDigests>>;

// Creates one dataset. Uncompressed data gets a contiguous layout allocated at creation and
// never filled, so HDF5 writes only metadata and the region is recorded in `direct`;
// compressed tensors are chunked and written now through direct chunk writes, hashed into
// `hashed` on the way.
Status CreateOne(hid_t file, const DatasetSpec& spec, size_t record, const SaveOptions& options,
                 bool portable, int threads, std::vector<DirectSegment>* direct,
                 ChunkDigests* hashed, RandomWriteFile* writeback, CompressScratch* scratch) {
  const size_t elem = DTypeSize(spec.dtype);
  const int64_t numel = Numel(spec.shape);
  const Compression& comp = options.compression;
  const bool zstd = comp.kind == Compression::Kind::kZstd && spec.kind == "tensor" &&
                    !spec.shape.empty() && numel > 0;
  std::vector<hsize_t> dims(spec.shape.begin(), spec.shape.end());
  h5::Handle space = h5::Space(spec.shape.empty()
                                   ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                      nullptr));
  h5::Handle dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
  if (portable) H5Pset_obj_track_times(dcpl.get(), false);
  int64_t rows_per_chunk = 0, inner = 1;
  if (zstd) {
    inner = numel / spec.shape[0];
    const int64_t chunk_elems =
        std::max<int64_t>(1, static_cast<int64_t>(options.chunk_bytes / elem));
    rows_per_chunk = std::clamp<int64_t>(chunk_elems / std::max<int64_t>(inner, 1), 1,
                                         spec.shape[0]);
    std::vector<hsize_t> cdims = dims;
    cdims[0] = static_cast<hsize_t>(rows_per_chunk);
    H5Pset_chunk(dcpl.get(), static_cast<int>(cdims.size()), cdims.data());
    if (comp.shuffle) H5Pset_shuffle(dcpl.get());
    const unsigned level = static_cast<unsigned>(comp.level);
    H5Pset_filter(dcpl.get(), h5::kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level);
  } else if (numel > 0) {
    H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);
    H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
  }
  h5::Handle lcpl = h5::Plist(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  h5::Handle dset = h5::Dataset(H5Dcreate2(file, spec.name.c_str(), h5::FileType(spec.dtype),
                                           space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT));
  if (!dset.valid()) return IOError("create dataset: " + h5::ErrorText());
  CKPT_RETURN_IF_ERROR(
      h5::WriteStringAttr(dset.get(), "dtype", std::string(DTypeName(spec.dtype))), "");
  CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(dset.get(), "kind", spec.kind), "");
  if (!spec.blob_kind.empty())
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(dset.get(), "blob_kind", spec.blob_kind), "");
  if (numel == 0) return Status::Ok();
  if (zstd) {
    auto& [digest, pieces] =
        hashed->try_emplace(record, Xxh3Stream(), PieceDigests(EffectivePieceBytes(options.piece_bytes)))
            .first->second;
    return WriteCompressedChunks(dset.get(), spec, rows_per_chunk, inner, comp, threads,
                                 EffectivePieceBytes(options.fill_window_bytes), &digest,
                                 &pieces, writeback, scratch);
  }
  const haddr_t addr = H5Dget_offset(dset.get());
  if (addr == HADDR_UNDEF) return Internal("dataset has no allocated storage: " + h5::ErrorText());
  DirectSegment seg;
  seg.offset = static_cast<uint64_t>(addr);
  seg.bytes = static_cast<uint64_t>(numel) * elem;
  seg.spec = &spec;
  seg.record = record;
  direct->push_back(seg);
  return Status::Ok();
}

// The unit of the data pass: hashed (once or twice) and copied to or from the kernel while it
// is in the core's L2. 8 MiB pieces, which spill to L3 and DRAM between the passes, saved
// 25-40 % slower (4 ranks, 1 GiB, paired with the raw floor: 3 A/B runs of 3 pairs each).
constexpr size_t kBlockBytes = 1u << 20;

// Large allocations in a rank file start at 4 KiB boundaries (issue 19: O_DIRECT loads).
constexpr hsize_t kAlignThreshold = 1u << 20;
constexpr hsize_t kDataAlignment = 4096;

// Phase 1: the HDF5 structure (attributes, every dataset, compressed chunks); the file is
// closed when it returns, with its uncompressed regions allocated but not yet written. With
// `data_file`, the file is also opened through options.env as soon as HDF5 has created it: the
// compressed chunks start their writeback through it, and phase 2 writes through it. With
// `extents`, the file's raw-data regions for its seal, taken before it is closed.
Result<std::vector<DirectSegment>> WriteStructure(
    const std::string& path, const RankFileHeader& header, const std::vector<DatasetSpec>& datasets,
    const SaveOptions& options, hid_t fapl, bool need_data, std::vector<DatasetRecord>* records,
    ChunkDigests* hashed, std::unique_ptr<RandomWriteFile>* data_file, h5::Extents* extents) {
  h5::Init();
  int threads = options.compress_threads;
  if (threads <= 0) {
    threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()) /
                               static_cast<unsigned>(std::max(1, header.world)));
    threads = std::max(1, threads);
  }
  std::vector<DirectSegment> direct;
  CompressScratch scratch;  // shared by the file's compressed datasets
  // Every allocation of kAlignThreshold bytes or more (a large dataset, a compressed chunk)
  // starts on a kDataAlignment boundary, so a reader can move it with O_DIRECT straight into
  // aligned memory (direct_read.h). Costs under 4 KiB of padding per large dataset; readers of
  // any version see ordinary HDF5 allocations.
  h5::Handle aligned = h5::Plist(fapl == H5P_DEFAULT ? H5Pcreate(H5P_FILE_ACCESS) : H5Pcopy(fapl));
  // A portable file (universal.h5) allocates every dataset where the one created before it
  // ends instead: no alignment, whose gaps HDF5 fills with later small datasets, and no
  // small-data blocks, which hold small datasets created after larger ones. Its regions then
  // lie in the order the datasets were created, so phase 2 asks the fills in that order (the
  // order a converter's source stores them: its stream verification reads each once).
  if (!aligned.valid() ||
      (header.portable
           ? H5Pset_small_data_block_size(aligned.get(), 0) < 0 ||
                 H5Pset_libver_bounds(aligned.get(), H5F_LIBVER_EARLIEST, H5F_LIBVER_V18) < 0
           : H5Pset_alignment(aligned.get(), kAlignThreshold, kDataAlignment) < 0))
    return Internal("create " + path + ": file access properties: " + h5::ErrorText());
  h5::Handle file = h5::File(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, aligned.get()));
  if (!file.valid()) return IOError("create " + path + ": " + h5::ErrorText());
  if (data_file) {
    Env* env = options.env ? options.env : Env::Default();
    CKPT_ASSIGN_OR_RETURN(*data_file, env->OpenRandomWriteFile(path));
  }
  if (header.root) {
    CKPT_RETURN_IF_ERROR(header.root(file.get()), path);
  } else {
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(file.get(), "format", std::string(kFormatName)), path);
    CKPT_RETURN_IF_ERROR(
        h5::WriteStringAttr(file.get(), "format_version",
                            std::to_string(kFormatMajor) + "." + std::to_string(kFormatMinor)),
        path);
    CKPT_RETURN_IF_ERROR(h5::WriteStringAttr(file.get(), "tag", header.tag), path);
    CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(file.get(), "rank", header.rank), path);
    CKPT_RETURN_IF_ERROR(h5::WriteIntAttr(file.get(), "dp_world_size", header.world), path);
  }
  for (const auto& spec : datasets) {
    const std::string where = path + ": dataset /" + spec.name;
    int64_t numel = 1;
    for (int64_t d : spec.shape) {
      if (d < 0 || __builtin_mul_overflow(numel, d, &numel))
        return InvalidArgument(where + ": bad shape");
    }
    if (spec.data && spec.fill) return InvalidArgument(where + ": both data and fill");
    if (need_data && numel > 0 && spec.data == nullptr && !spec.fill)
      return InvalidArgument(where + ": no data");
    DatasetRecord rec;
    rec.name = spec.name;
    rec.kind = spec.kind;
    rec.blob_kind = spec.blob_kind;
    rec.dtype = spec.dtype;
    rec.shape = spec.shape;
    rec.bytes = static_cast<uint64_t>(numel) * DTypeSize(spec.dtype);
    CKPT_RETURN_IF_ERROR(
        CreateOne(file.get(), spec, records->size(), options, header.portable, threads, &direct,
                  hashed, data_file ? data_file->get() : nullptr, &scratch),
        where);
    records->push_back(std::move(rec));
  }
  if (extents) {
    CKPT_ASSIGN_OR_RETURN(*extents, h5::DataExtents(file.get(), path), "seal");
  }
  CKPT_RETURN_IF_ERROR(file.Close("close " + path), "");
  return direct;
}

// A slice [offset, offset + count) of a 1-D dataset, in elements: InvalidArgument naming the
// file and dataset when the dataset is not 1-D or the slice runs outside it.
Status CheckSlice(const std::string& label, const DatasetRecord& rec, int64_t offset,
                  int64_t count) {
  if (rec.shape.size() != 1)
    return InvalidArgument(label + ": dataset /" + rec.name + " is not 1-D");
  if (offset < 0 || count < 0 || offset + count > rec.shape[0])
    return InvalidArgument(label + ": dataset /" + rec.name + ": slice [" +
                           std::to_string(offset) + ", " + std::to_string(offset + count) +
                           ") outside length " + std::to_string(rec.shape[0]));
  return Status::Ok();
}

}  // namespace

Result<RankFileWritten> WriteRankFile(const std::string& path, const RankFileHeader& header,
                                      const std::vector<DatasetSpec>& datasets,
                                      const SaveOptions& options) {
  RankFileWritten out;
  ChunkDigests hashed;
  std::unique_ptr<RandomWriteFile> file;
  CKPT_ASSIGN_OR_RETURN(
      std::vector<DirectSegment> direct,
      WriteStructure(path, header, datasets, options, H5P_DEFAULT,
                     /*need_data=*/true, &out.datasets, &hashed, &file, &out.data_extents),
      "");
  // Phase 2: the uncompressed bytes, outside HDF5 (and its global lock), in file order. Each
  // 1 MiB piece is hashed into its dataset's digest and, with file_checksum, into the file's
  // digest while it is in cache, then written and its writeback started: one pass over the
  // data, overlapped with the disk. A `fill` dataset's bytes arrive a window
  // (fill_window_bytes) at a time into one buffer and go through the same steps. The bytes
  // between the regions (HDF5 metadata, compressed chunks) are read back for the file digest.
  std::sort(direct.begin(), direct.end(),
            [](const DirectSegment& a, const DirectSegment& b) { return a.offset < b.offset; });
  CKPT_ASSIGN_OR_RETURN(uint64_t size, file->Size());
  for (const auto& seg : direct) size = std::max(size, seg.offset + seg.bytes);
  // Reserve the whole file first: a full disk fails here, before any data is written, with
  // the space it needed (file systems without fallocate just skip the reservation).
  CKPT_RETURN_IF_ERROR(file->Reserve(size));
  std::vector<std::optional<Xxh3Stream>> digests(out.datasets.size());
  const uint64_t piece_bytes = EffectivePieceBytes(options.piece_bytes);
  std::vector<std::optional<PieceDigests>> pieces(out.datasets.size());
  for (const auto& seg : direct) {
    digests[seg.record].emplace();
    pieces[seg.record].emplace(piece_bytes);
  }
  std::optional<Xxh3Stream> file_digest;
  if (options.file_checksum) file_digest.emplace();
  std::vector<uint8_t> gap;
  auto hash_gap = [&](uint64_t from, uint64_t to) -> Status {
    while (file_digest && from < to) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(to - from, kBlockBytes));
      gap.resize(n);
      CKPT_RETURN_IF_ERROR(file->Read(from, n, gap.data()));
      file_digest->Update(gap.data(), n);
      from += n;
    }
    return Status::Ok();
  };
  // The data pass in file order, as items: a dataset from memory is one item, a `fill`
  // dataset one item per window. A window is filled into one of two buffers of I/O memory on a
  // helper thread while the item before it is hashed and written (RunAhead: the source's
  // reads overlap the disk's writes, across datasets as within one).
  struct Item {
    size_t seg;
    uint64_t at, len;  // bytes [at, at + len) of the segment's dataset
  };
  const uint64_t window_bytes = EffectivePieceBytes(options.fill_window_bytes);
  std::vector<Item> items;
  bool any_fill = false;
  for (size_t k = 0; k < direct.size(); ++k) {
    const DirectSegment& seg = direct[k];
    if (!seg.spec->fill) {
      items.push_back({k, 0, seg.bytes});
      continue;
    }
    any_fill = true;
    for (uint64_t at = 0; at < seg.bytes; at += window_bytes)
      items.push_back({k, at, std::min(window_bytes, seg.bytes - at)});
  }
  constexpr int kFillWindows = 2;
  std::vector<AlignedBuffer> windows;
  // Where each window's bytes start in its buffer (DatasetSpec::fill_place), set by the fill
  // and read by the write of the same window (RunAhead hands a slot over in that order).
  uint64_t placed[kFillWindows] = {};
  if (any_fill) {
    try {
      for (int k = 0; k < kFillWindows; ++k)
        windows.emplace_back(window_bytes + AlignedBuffer::kAlign);
    } catch (const std::bad_alloc&) {
      return ResourceExhausted(path + ": " + std::to_string(kFillWindows) + " windows of " +
                               std::to_string(window_bytes) + " bytes: " + OutOfMemoryText());
    }
  }
  auto where = [&](const Item& it) {
    return "dataset /" + out.datasets[direct[it.seg].record].name;
  };
  // On a helper thread: a failed allocation in the fill (a reshard's reader) is this save's
  // ResourceExhausted, not an exception that would end the process.
  auto produce = [&](uint64_t i, int slot) -> Status {
    const Item& it = items[i];
    const DirectSegment& seg = direct[it.seg];
    if (!seg.spec->fill) return Status::Ok();
    uint64_t& at = placed[slot];
    at = 0;
    if (seg.spec->fill_place) {
      const std::optional<uint64_t> place =
          seg.spec->fill_place(it.at, static_cast<size_t>(it.len));
      if (place) at = *place % AlignedBuffer::kAlign;
    }
    return OutOfMemoryAsStatus(where(it), [&] {
      return seg.spec
          ->fill(it.at, static_cast<size_t>(it.len), windows[static_cast<size_t>(slot)].data() + at)
          .WithContext(where(it));
    });
  };
  uint64_t pos = 0;
  auto consume = [&](uint64_t i, int slot) -> Status {
    const Item& it = items[i];
    const DirectSegment& seg = direct[it.seg];
    if (it.at == 0) CKPT_RETURN_IF_ERROR(hash_gap(pos, seg.offset), "");
    const uint8_t* base = seg.spec->fill ? windows[static_cast<size_t>(slot)].data() + placed[slot]
                                         : static_cast<const uint8_t*>(seg.spec->data);
    if (seg.spec->fill && seg.spec->filled) seg.spec->filled();
    // Each 1 MiB piece is hashed just before it goes out, while it is in cache; the file
    // writes it past the page cache where it can (O_DIRECT from staging in huge pages, or in
    // place from I/O memory: DirectWriteStats) or with pwrite, its writeback started at once
    // (a hint, as RocksDB's bytes_per_sync: the disk works while the next pieces are hashed).
    CKPT_RETURN_IF_ERROR(file->WriteThrough(seg.offset + it.at,
                                            std::string_view(reinterpret_cast<const char*>(base),
                                                             static_cast<size_t>(it.len)),
                                            [&](const uint8_t* p, size_t n) {
                                              digests[seg.record]->Update(p, n);
                                              pieces[seg.record]->Update(p, n);
                                              if (file_digest) file_digest->Update(p, n);
                                            }),
                         where(it));
    pos = seg.offset + it.at + it.len;
    return Status::Ok();
  };
  if (any_fill) {
    CKPT_RETURN_IF_ERROR(RunAhead(items.size(), kFillWindows, produce, consume), "");
  } else {
    for (uint64_t i = 0; i < items.size(); ++i) CKPT_RETURN_IF_ERROR(consume(i, 0), "");
  }
  CKPT_RETURN_IF_ERROR(hash_gap(pos, size), "");
  // The seal: every byte outside the data extents (the HDF5 metadata, final since phase 1
  // closed the file), read back through the open file. The extents came from phase 1, so no
  // second H5Fopen of the file waits for the library's lock behind the other ranks' files.
  CKPT_ASSIGN_OR_RETURN(out.metadata_xxh3,
                        h5::MetadataDigest([&](uint64_t offset, size_t n,
                                               void* p) { return file->Read(offset, n, p); },
                                           size, out.data_extents, path),
                        "seal");
  CKPT_RETURN_IF_ERROR(file->Close());
  for (size_t i = 0; i < out.datasets.size(); ++i) {
    DatasetRecord& rec = out.datasets[i];
    if (auto it = hashed.find(i); it != hashed.end()) {  // compressed: hashed as written
      digests[i].emplace(std::move(it->second.first));
      pieces[i].emplace(std::move(it->second.second));
    } else if (!digests[i]) {  // empty or a scalar: hashed here
      digests[i].emplace();
      pieces[i].emplace(piece_bytes);
      const auto* p = static_cast<const uint8_t*>(datasets[i].data);
      for (uint64_t done = 0; done < rec.bytes; done += piece_bytes) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(rec.bytes - done, piece_bytes));
        digests[i]->Update(p + done, n);
        pieces[i]->Update(p + done, n);
      }
    }
    rec.xxh3 = digests[i]->HexDigest();
    rec.piece_bytes = piece_bytes;
    rec.piece_xxh3 = pieces[i]->Finish();
  }
  if (file_digest) out.file_xxh3 = file_digest->HexDigest();
  out.bytes = size;
  return out;
}

Status WriteRankFileStructure(const std::string& path, const RankFileHeader& header,
                              const std::vector<DatasetSpec>& datasets,
                              const SaveOptions& options, int64_t fapl) {
  if (options.compression.kind != Compression::Kind::kNone)
    return InvalidArgument("rank file structure without data: compressed chunks need the data");
  std::vector<DatasetRecord> records;
  ChunkDigests unused;
  CKPT_ASSIGN_OR_RETURN(std::vector<DirectSegment> direct,
                        WriteStructure(path, header, datasets, options, static_cast<hid_t>(fapl),
                                       /*need_data=*/false, &records, &unused, nullptr, nullptr),
                        "");
  (void)direct;
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------

namespace {

// One decompression slot's memory (a chunk before it is unshuffled; the frame ring of a
// FrameReader or, without one, a worker's frame) and a worker's zstd context. Reused across
// datasets and files instead of allocated per dataset read: fresh memory costs its page faults
// (on the development VM 0.34 GiB/s in 4 KiB pages, docs/performance.md), and these are I/O
// memory (huge pages from 2 MiB up), never zero-filled.
struct DecodeState {
  AlignedBuffer frame, plain;
  ZSTD_DCtx* dctx = nullptr;
  DecodeState() = default;
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;
  ~DecodeState() { ZSTD_freeDCtx(dctx); }
  // `buf` holds at least `n` bytes (std::bad_alloc when the memory cannot be had).
  static void Reserve(AlignedBuffer* buf, size_t n) {
    if (buf->size() < n) *buf = AlignedBuffer(n);
  }
};

// The idle DecodeStates of the process while a rank file is open: at most kKeep are kept
// (about 12 MiB each for the default 4 MiB chunks: a read span and a chunk), the rest freed
// when their pipeline ends, and all of them when the last rank file closes, so a loader's
// memory is back once it is done.
class DecodeStates {
 public:
  static constexpr size_t kKeep = 16;
  // Held by every open rank file.
  class Use {
   public:
    Use() { Pool().Enter(); }
    ~Use() { Pool().Leave(); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
  };
  // `n` states for one pipeline, given back when it ends.
  class Lease {
   public:
    explicit Lease(size_t n) {
      for (size_t i = 0; i < n; ++i) states_.push_back(Pool().Take());
    }
    ~Lease() {
      for (auto& s : states_) Pool().Give(std::move(s));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    DecodeState& operator[](size_t i) { return *states_[i]; }

   private:
    std::vector<std::unique_ptr<DecodeState>> states_;
  };

 private:
  static DecodeStates& Pool() {
    static DecodeStates* pool = new DecodeStates;  // never destroyed: used until exit
    return *pool;
  }
  void Enter() {
    std::lock_guard<std::mutex> lock(mu_);
    ++users_;
  }
  void Leave() {
    std::vector<std::unique_ptr<DecodeState>> freed;  // freed outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    if (--users_ == 0) freed.swap(idle_);
  }
  std::unique_ptr<DecodeState> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.empty()) return std::make_unique<DecodeState>();
    auto s = std::move(idle_.back());
    idle_.pop_back();
    return s;
  }
  void Give(std::unique_ptr<DecodeState> s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (users_ > 0 && idle_.size() < kKeep) idle_.push_back(std::move(s));
  }
  std::mutex mu_;
  int64_t users_ = 0;
  std::vector<std::unique_ptr<DecodeState>> idle_;
};

// Reads the zstd frames of chunks [c0, c1) on a thread of its own, ahead of the workers that
// decompress them, so the disk streams while the cores decompress (a worker that reads its
// own frame and then decompresses it leaves the disk idle meanwhile, and on two cores the
// workers were one per rank: docs/performance.md, 2026-12-03). Consecutive frames (gaps up to
// kGap) are read in one request of up to kSpanBytes into a ring of kRing buffers; a span of
// 1 MiB or more is read from its 4 KiB block, so it goes past the page cache with O_DIRECT
// into the buffer (direct_read.h). A buffer is reused once every chunk of its span is Done.
// A failed read fails the span's chunks and those after it.
class FrameReader {
 public:
  static constexpr int kRing = 3;
  static constexpr uint64_t kSpanBytes = 8u << 20, kGap = 64u << 10, kAlignFrom = 1u << 20;
  using Where = std::vector<std::pair<uint64_t, uint64_t>>;

  FrameReader(const RandomAccessFile& file, uint64_t file_bytes, const Where& where, int64_t c0,
              int64_t c1, DecodeStates::Lease& ring)
      : file_(file),
        file_bytes_(file_bytes),
        where_(where),
        c0_(c0),
        c1_(c1),
        ring_(ring),
        ready_(c0),
        frame_(static_cast<size_t>(c1 - c0), nullptr),
        slot_of_(static_cast<size_t>(c1 - c0), 0) {}
  ~FrameReader() {
    Stop();
    if (thread_.joinable()) thread_.join();
  }
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // Starts the reading thread; false when no thread can be started.
  bool Start() {
    try {
      thread_ = std::thread([this] { Run(); });
      return true;
    } catch (const std::system_error&) {
      return false;
    }
  }
  // Chunk c's frame once it has been read (waits until then), valid until Done(c).
  Result<const uint8_t*> Frame(int64_t c) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ready_ > c || stop_; });
    if (c >= failed_from_) return error_;
    if (ready_ <= c) return Internal("frame reader stopped");
    return frame_[static_cast<size_t>(c - c0_)];
  }
  void Done(int64_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_[slot_of_[static_cast<size_t>(c - c0_)]] == 0) cv_.notify_all();
  }
  // After the pipeline's first error: no more reads, and a Frame not yet read fails at once.
  // (Once the pipeline stops, a chunk it claimed may never be decompressed, so the buffer
  // its span holds would never come back.) The frames before the failed chunk were read.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    constexpr uint64_t kAlign = AlignedBuffer::kAlign;
    auto down = [](uint64_t x) { return x / kAlign * kAlign; };
    auto up = [](uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; };
    for (int64_t c = c0_, k = 0; c < c1_; ++k) {
      const uint64_t start = where_[static_cast<size_t>(c)].first;
      uint64_t end = start + where_[static_cast<size_t>(c)].second;
      int64_t e = c + 1;
      // kSpanBytes counts the whole 4 KiB blocks read: one O_DIRECT request of at most 8 MiB
      // (a larger one is split across helper threads: direct_read.h, kBlock).
      for (; e < c1_; ++e) {
        const auto [at, size] = where_[static_cast<size_t>(e)];
        if (at < end || at - end > kGap || up(at + size) - down(start) > kSpanBytes) break;
        end = at + size;
      }
      const int slot = static_cast<int>(k % kRing);
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || pending_[slot] == 0; });
        if (stop_) return;
        pending_[slot] = static_cast<int>(e - c);
      }
      uint64_t lo = start, hi = end;
      if (end - start >= kAlignFrom) {
        lo = down(start);
        hi = std::min(up(end), file_bytes_);
      }
      AlignedBuffer& buf = ring_[static_cast<size_t>(slot)].frame;
      Status s = OutOfMemoryAsStatus("frame buffer", [&] {
        // In whole MiB, so spans of slightly different sizes reuse the buffer.
        constexpr uint64_t kMiB = 1u << 20;
        if (buf.size() < hi - lo) buf = AlignedBuffer((hi - lo + kMiB - 1) / kMiB * kMiB);
        return Status::Ok();
      });
      if (s.ok()) s = file_.ReadLarge(lo, hi - lo, buf.data(), nullptr);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.ok()) {
          error_ = std::move(s);
          failed_from_ = c;
          ready_ = c1_;
        } else {
          for (int64_t i = c; i < e; ++i) {
            frame_[static_cast<size_t>(i - c0_)] =
                buf.data() + (where_[static_cast<size_t>(i)].first - lo);
            slot_of_[static_cast<size_t>(i - c0_)] = slot;
          }
          ready_ = e;
        }
      }
      cv_.notify_all();
      if (failed_from_ < c1_) return;  // only this thread writes it
      c = e;
    }
  }

  const RandomAccessFile& file_;
  const uint64_t file_bytes_;
  const Where& where_;
  const int64_t c0_, c1_;
  DecodeStates::Lease& ring_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t ready_;                    // chunks below have their frame (or failed)
  int64_t failed_from_ = INT64_MAX;  // chunks from here fail with error_
  Status error_;
  int pending_[kRing] = {0, 0, 0};     // chunks of each buffer's span not yet Done
  std::vector<const uint8_t*> frame_;  // per chunk from c0
  std::vector<int> slot_of_;           // per chunk from c0: its span's buffer
  std::thread thread_;
};

}  // namespace

struct RankFile::Impl {
  DecodeStates::Use decode_states;  // first: the pool's idle states live while files are open
  std::string label;
  std::string path;        // opened by libhdf5 in Parse
  bool universal = false;  // a universal checkpoint's file (Parse checks its format)
  h5::Handle file;
  h5::Handle dapl;          // slices: a one-chunk cache
  h5::Handle dapl_whole;    // whole-dataset reads: no cache, chunks go straight to the caller
  // The dataset of the last slice read stays open, so consecutive slices of one compressed
  // chunk decompress it once; only one is kept per file, which bounds the cache memory to
  // one chunk per rank file however many datasets a converter walks through.
  std::map<std::string, h5::Handle> open;
  std::map<std::string, h5::Handle> open_whole;  // cacheless handles cost no buffer memory
  // Uncompressed contiguous datasets are read at offsets through the Env, outside HDF5.
  std::unique_ptr<RandomAccessFile> data;
  uint64_t file_bytes = 0;
  std::map<std::string, std::optional<uint64_t>> direct;  // name -> file offset, if direct
  std::set<std::string> shape_ok;  // datasets whose stored shape and type match their record
  std::map<std::string, size_t> chunk_bytes;  // chunked datasets: bytes of one chunk
  Result<hid_t> Dataset(const DatasetRecord& rec, bool whole = false);
  // A zstd-compressed dataset as this library writes it: chunks of whole rows (of
  // rows_per_chunk, the last one zero-padded), each one zstd frame of the chunk's bytes,
  // byte-shuffled first when `shuffle`. Read with pread through the Env and decompressed on
  // threads, outside HDF5 and its global lock.
  struct ZstdChunks {
    bool shuffle = false;
    size_t elem = 0;
    int64_t rows = 0, rows_per_chunk = 0, inner = 1;
    size_t chunk_bytes = 0;                            // decompressed size of every chunk
    std::vector<std::pair<uint64_t, uint64_t>> where;  // each chunk's frame: file offset, size
    int64_t count() const { return static_cast<int64_t>(where.size()); }
    uint64_t first_byte(int64_t c) const {  // of chunk c in the dataset's logical bytes
      return static_cast<uint64_t>(c * rows_per_chunk * inner) * elem;
    }
    size_t have(int64_t c) const {  // logical bytes of chunk c (the last may be shorter)
      return static_cast<size_t>(std::min(rows_per_chunk, rows - c * rows_per_chunk) * inner) *
             elem;
    }
  };
  std::map<std::string, std::optional<ZstdChunks>> zstd;  // name -> layout; none: through HDF5
  // The layout when the dataset's chunks can be read outside HDF5: chunked as the writer does,
  // zstd (after shuffle or alone) on every chunk, the record's little-endian type, every chunk
  // allocated inside the file. Anything else (none) is read through HDF5's filter pipeline.
  Result<const ZstdChunks*> Zstd(const DatasetRecord& rec);
  // Decompresses chunks [c0, c1) of `z`: a FrameReader reads their frames ahead, a pool of
  // threads decompresses them, and the calling thread puts each chunk back together in order
  // (unshuffled a block at a time in L1), hands its logical bytes to consume(c, at, bytes, n)
  // in consecutive parts (`at` counts from the chunk's first byte) and copies them to dest(c)
  // unless that is nullptr. A damaged chunk is DataLoss naming the file, dataset and chunk.
  using ChunkPartFn = std::function<Status(int64_t c, size_t at, const uint8_t* bytes, size_t n)>;
  Status DecodeChunks(const DatasetRecord& rec, const ZstdChunks& z, int64_t c0, int64_t c1,
                      const std::function<uint8_t*(int64_t)>& dest, const ChunkPartFn& consume);
  // The last chunk a slice read decompressed but did not use whole (the next slice usually
  // starts in it): one chunk per rank file, as HDF5's one-chunk cache before.
  std::string cached_name;
  int64_t cached_chunk = -1;
  std::vector<uint8_t> cached;
  // The file offset of the dataset's bytes when they can be read as they are: contiguous, no
  // filter, the record's little-endian type, allocated to exactly rec.bytes inside the file.
  Result<std::optional<uint64_t>> DirectOffset(const DatasetRecord& rec);
};

RankFile::~RankFile() = default;

Result<std::unique_ptr<RankFile>> RankFile::Open(const std::string& path, std::string label,
                                                 const FileRecord& record, Env* env,
                                                 bool universal) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RankFile> rf,
                        OpenUnparsed(path, std::move(label), record, env, universal), "");
  CKPT_RETURN_IF_ERROR(rf->Parse(), "");
  return rf;
}

Result<std::unique_ptr<RankFile>> RankFile::OpenUnparsed(const std::string& path, std::string label,
                                                         const FileRecord& record, Env* env,
                                                         bool universal) {
  if (!env) env = Env::Default();
  std::unique_ptr<RankFile> rf(new RankFile());
  rf->impl_ = std::make_unique<Impl>();
  rf->impl_->label = std::move(label);
  rf->impl_->path = path;
  rf->impl_->universal = universal;
  // The same file serves the seal check and the direct (outside HDF5) reads.
  CKPT_ASSIGN_OR_RETURN(rf->impl_->data, env->NewCheckpointFile(path));
  rf->impl_->file_bytes = rf->impl_->data->size();
  CKPT_RETURN_IF_ERROR(h5::VerifySeal(*rf->impl_->data, rf->impl_->label, record.bytes,
                                      record.data_extents, record.metadata_xxh3, record.xxh3),
                       "");
  CKPT_RETURN_IF_ERROR(h5::ProbeStructure(path, rf->impl_->label), "");
  return rf;
}

Status RankFile::Parse() {
  Impl& im = *impl_;
  if (im.file.valid()) return Status::Ok();
  h5::Init();
  CKPT_ASSIGN_OR_RETURN(im.file, h5::OpenSealed(im.path, im.label));
  const hid_t fid = im.file.get();
  // The file says what it is: refuse foreign files and newer major versions before reading.
  const std::string_view expected = im.universal ? kUniversalFormat : kFormatName;
  const int supported_major = im.universal ? kUniversalMajor : kFormatMajor;
  const Result<std::string> format = h5::ReadStringAttr(fid, "format");
  if (!format.ok() || *format != expected) {
    H5Eclear2(H5E_DEFAULT);
    return DataLoss(im.label + ": not a " +
                    (im.universal ? std::string("universal checkpoint file") : "ckpt rank file") +
                    " (attribute 'format' is " +
                    (format.ok() ? "'" + Excerpt(*format, 64) + "'" : std::string("missing")) +
                    ")");
  }
  const Result<std::string> version = h5::ReadStringAttr(fid, "format_version");
  int major = -1, minor = -1;
  if (!version.ok() || std::sscanf(version->c_str(), "%d.%d", &major, &minor) != 2 || major < 0) {
    return DataLoss(im.label + ": missing or malformed attribute 'format_version'");
  }
  if (major > supported_major) {
    return Unimplemented(im.label + ": written by format version " + Excerpt(*version, 64) +
                         ", this reader supports " + std::to_string(supported_major) +
                         ".x; upgrade ckpt to read it");
  }
  im.dapl = h5::NoExternalLinks();
  // A chunk cache that holds one default (4 MiB) chunk; fully read chunks are evicted first.
  H5Pset_chunk_cache(im.dapl.get(), 521, (4u << 20) + (64u << 10), 1.0);
  // Whole-dataset reads bypass the cache: HDF5 then reads (and decompresses) each chunk
  // directly into the caller's buffer instead of staging it in the cache and copying.
  im.dapl_whole = h5::NoExternalLinks();
  H5Pset_chunk_cache(im.dapl_whole.get(), 0, 0, 1.0);
  return Status::Ok();
}

Result<hid_t> RankFile::Impl::Dataset(const DatasetRecord& rec, bool whole) {
  auto& handles = whole ? open_whole : open;
  auto it = handles.find(rec.name);
  if (it != handles.end()) return it->second.get();
  if (!file.valid())
    return FailedPrecondition(label + ": dataset /" + rec.name + ": HDF5 handles closed");
  if (H5Lexists(file.get(), rec.name.c_str(), dapl.get()) <= 0) {
    H5Eclear2(H5E_DEFAULT);  // a missing intermediate group is an error, not just "false"
    return DataLoss(label + ": dataset /" + rec.name + " is missing");
  }
  hid_t d = H5Dopen2(file.get(), rec.name.c_str(), whole ? dapl_whole.get() : dapl.get());
  if (d < 0) return DataLoss(label + ": dataset /" + rec.name + ": " + h5::ErrorText());
  h5::Handle handle = h5::Dataset(d);
  if (!chunk_bytes.count(rec.name)) {
    const size_t n = h5::ChunkBytes(d);
    if (n == 0)
      return DataLoss(label + ": dataset /" + rec.name + ": unreadable type or chunk size");
    chunk_bytes[rec.name] = n;
  }
  if (!whole) handles.clear();
  handles.emplace(rec.name, std::move(handle));
  return d;
}

Status RankFile::CheckShape(const DatasetRecord& rec) const {
  if (impl_->shape_ok.count(rec.name)) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(hid_t d, impl_->Dataset(rec, /*whole=*/true), "");
  h5::Handle space = h5::Space(H5Dget_space(d));
  int nd = H5Sget_simple_extent_ndims(space.get());
  if (nd < 0) return DataLoss(impl_->label + ": dataset /" + rec.name + ": bad dataspace");
  std::vector<hsize_t> dims(static_cast<size_t>(nd));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  std::vector<int64_t> got(dims.begin(), dims.end());
  if (got != rec.shape)
    return DataLoss(impl_->label + ": dataset /" + rec.name + ": stored shape differs from manifest");
  h5::Handle type = h5::Type(H5Dget_type(d));
  const H5T_class_t cls = H5Tget_class(type.get());
  if ((cls != H5T_INTEGER && cls != H5T_FLOAT) ||
      (H5Tequal(type.get(), h5::FileType(rec.dtype)) <= 0 &&
       H5Tget_size(type.get()) != DTypeSize(rec.dtype)))
    return DataLoss(impl_->label + ": dataset /" + rec.name + ": stored type differs from manifest");
  impl_->shape_ok.insert(rec.name);
  return Status::Ok();
}

Result<std::optional<uint64_t>> RankFile::Impl::DirectOffset(const DatasetRecord& rec) {
  auto it = direct.find(rec.name);
  if (it != direct.end()) return it->second;
  CKPT_ASSIGN_OR_RETURN(hid_t d, Dataset(rec, /*whole=*/true), "");
  std::optional<uint64_t> offset;
  h5::Handle dcpl = h5::Plist(H5Dget_create_plist(d));
  h5::Handle type = h5::Type(H5Dget_type(d));
  const haddr_t addr = H5Dget_offset(d);
  const bool little = H5Tget_size(type.get()) == 1 || H5Tget_order(type.get()) == H5T_ORDER_LE;
  if (dcpl.valid() && H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS &&
      H5Pget_nfilters(dcpl.get()) == 0 && addr != HADDR_UNDEF &&
      H5Tequal(type.get(), h5::FileType(rec.dtype)) > 0 && little &&
      H5Dget_storage_size(d) == rec.bytes) {
    if (static_cast<uint64_t>(addr) > file_bytes || rec.bytes > file_bytes - addr)
      return DataLoss(label + ": dataset /" + rec.name + ": its data at byte " +
                      std::to_string(addr) + " extends past the end of the file (" +
                      std::to_string(file_bytes) + " bytes)");
    offset = static_cast<uint64_t>(addr);
  }
  H5Eclear2(H5E_DEFAULT);
  direct.emplace(rec.name, offset);
  return offset;
}

Result<const RankFile::Impl::ZstdChunks*> RankFile::Impl::Zstd(const DatasetRecord& rec) {
  auto it = zstd.find(rec.name);
  if (it != zstd.end()) return it->second ? &*it->second : nullptr;
  CKPT_ASSIGN_OR_RETURN(hid_t d, Dataset(rec, /*whole=*/true), "");
  std::optional<ZstdChunks> z;
  auto plan = [&]() -> Status {
    h5::Handle dcpl = h5::Plist(H5Dget_create_plist(d));
    h5::Handle type = h5::Type(H5Dget_type(d));
    if (!dcpl.valid() || !type.valid() || H5Pget_layout(dcpl.get()) != H5D_CHUNKED ||
        rec.shape.empty() || rec.bytes == 0 || H5Tequal(type.get(), h5::FileType(rec.dtype)) <= 0 ||
        (H5Tget_size(type.get()) > 1 && H5Tget_order(type.get()) != H5T_ORDER_LE))
      return Status::Ok();
    const int nfilters = H5Pget_nfilters(dcpl.get());
    std::vector<H5Z_filter_t> ids;
    for (int i = 0; i < nfilters; ++i) {
      unsigned flags = 0;
      size_t nelmts = 0;
      ids.push_back(H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &nelmts,
                                   nullptr, 0, nullptr, nullptr));
    }
    ZstdChunks zc;
    if (ids == std::vector<H5Z_filter_t>{H5Z_FILTER_SHUFFLE, h5::kZstdFilterId})
      zc.shuffle = true;
    else if (ids != std::vector<H5Z_filter_t>{h5::kZstdFilterId})
      return Status::Ok();
    std::vector<hsize_t> cdims(H5S_MAX_RANK, 0);
    if (H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, cdims.data()) != static_cast<int>(rec.shape.size()))
      return Status::Ok();
    for (size_t i = 1; i < rec.shape.size(); ++i)
      if (cdims[i] != static_cast<hsize_t>(rec.shape[i])) return Status::Ok();
    zc.elem = DTypeSize(rec.dtype);
    zc.rows = rec.shape[0];
    if (cdims[0] < 1 || cdims[0] > static_cast<hsize_t>(zc.rows)) return Status::Ok();
    zc.rows_per_chunk = static_cast<int64_t>(cdims[0]);
    zc.inner = static_cast<int64_t>(rec.bytes / zc.elem) / zc.rows;
    zc.chunk_bytes = static_cast<size_t>(zc.rows_per_chunk * zc.inner) * zc.elem;
    const int64_t n = (zc.rows + zc.rows_per_chunk - 1) / zc.rows_per_chunk;
    if (n > (1 << 20)) return Status::Ok();  // tiny chunks: not worth a table of their own
    const uint64_t max_frame = ZSTD_compressBound(zc.chunk_bytes);
    zc.where.reserve(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c) {
      hsize_t offset[H5S_MAX_RANK] = {0};
      offset[0] = static_cast<hsize_t>(c * zc.rows_per_chunk);
      unsigned mask = 0;
      haddr_t addr = HADDR_UNDEF;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(d, offset, &mask, &addr, &size) < 0 || mask != 0 ||
          addr == HADDR_UNDEF)
        return Status::Ok();  // a skipped filter: HDF5 knows what to do (unwritten chunks are
                              // refused at open: h5::CheckStorage)
      if (size == 0 || size > max_frame || addr > file_bytes || size > file_bytes - addr)
        return DataLoss(label + ": dataset /" + rec.name + ": chunk " + std::to_string(c) +
                        " of " + std::to_string(n) + " (" + std::to_string(size) +
                        " bytes at byte " + std::to_string(addr) +
                        ") lies outside the file or exceeds any zstd frame of a " +
                        std::to_string(zc.chunk_bytes) + "-byte chunk");
      zc.where.emplace_back(static_cast<uint64_t>(addr), static_cast<uint64_t>(size));
    }
    z = std::move(zc);
    return Status::Ok();
  };
  const Status s = plan();
  H5Eclear2(H5E_DEFAULT);
  CKPT_RETURN_IF_ERROR(s, "");
  auto& slot = zstd[rec.name];
  slot = std::move(z);
  return slot ? &*slot : nullptr;
}

Status RankFile::Impl::DecodeChunks(const DatasetRecord& rec, const ZstdChunks& z, int64_t c0,
                                    int64_t c1, const std::function<uint8_t*(int64_t)>& dest,
                                    const ChunkPartFn& consume) {
  // The workers only decompress: the frames are read by the FrameReader's thread, the
  // chunks put back together on this one. Four ranks loading zstd:1+shuffle as threads on two
  // cores get one worker each (docs/performance.md, 2026-12-03).
  PipelineThreads pool(c1 - c0);
  const int64_t chunks = std::max<int64_t>(c1 - c0, 1);
  const int workers = static_cast<int>(std::min<int64_t>(pool.count(), chunks));
  const int64_t window = workers + 2;
  DecodeStates::Lease state(static_cast<size_t>(std::max<int64_t>(window, FrameReader::kRing)));
  std::optional<FrameReader> reader;
  if (c1 - c0 > 1) {
    reader.emplace(*data, file_bytes, z.where, c0, c1, state);
    if (!reader->Start()) reader.reset();  // no thread: each worker reads its own frame
  }
  std::vector<uint8_t*> out(static_cast<size_t>(window));          // per slot: dest(c)
  std::vector<const uint8_t*> plain(static_cast<size_t>(window));  // per slot: decompressed
  auto decode = [&](int64_t i, int w) -> Status {
    const int64_t c = c0 + i;
    const size_t slot = static_cast<size_t>(i % window);
    DecodeState& worker = state[static_cast<size_t>(w)];
    out[slot] = dest(c);
    const auto [at, size] = z.where[static_cast<size_t>(c)];
    const std::string chunk = label + ": dataset /" + rec.name + ": chunk " + std::to_string(c) +
                              " of " + std::to_string(z.count()) + " (" + std::to_string(size) +
                              " bytes at byte " + std::to_string(at) + ")";
    const uint8_t* frame = nullptr;
    if (reader) {
      Result<const uint8_t*> f = reader->Frame(c);
      CKPT_RETURN_IF_ERROR(f, chunk);
      frame = *f;
    } else {
      DecodeState::Reserve(&worker.frame, static_cast<size_t>(size));
      // Into aligned memory: a frame the writer aligned to 4 KiB (every allocation from
      // 1 MiB) is read with O_DIRECT past the page cache (direct_read.h, kMinIntoBytes).
      CKPT_RETURN_IF_ERROR(data->ReadLarge(at, size, worker.frame.data(), nullptr), chunk);
      frame = worker.frame.data();
    }
    struct Release {  // the frame's buffer may be read into again once it is decompressed
      FrameReader* r;
      int64_t c;
      ~Release() {
        if (r) r->Done(c);
      }
    } release{reader ? &*reader : nullptr, c};
    const unsigned long long content = ZSTD_getFrameContentSize(frame, size);
    if (content != z.chunk_bytes)
      return DataLoss(chunk + ": not a zstd frame of the chunk's " +
                      std::to_string(z.chunk_bytes) + " bytes (corrupt)");
    // A whole unshuffled chunk is decompressed where it goes; anything else into the slot.
    uint8_t* to = out[slot];
    if (z.shuffle || !to || z.have(c) != z.chunk_bytes) {
      DecodeState& ws = state[slot];
      DecodeState::Reserve(&ws.plain, z.chunk_bytes);
      to = ws.plain.data();
    }
    plain[slot] = to;
    if (!worker.dctx && !(worker.dctx = ZSTD_createDCtx()))
      return ResourceExhausted("zstd: no decompression context");
    const size_t got = ZSTD_decompressDCtx(worker.dctx, to, z.chunk_bytes, frame, size);
    if (ZSTD_isError(got) || got != z.chunk_bytes)
      return DataLoss(chunk + ": corrupt zstd data (" +
                      (ZSTD_isError(got) ? std::string(ZSTD_getErrorName(got))
                                         : std::to_string(got) + " bytes") +
                      ")");
    return Status::Ok();
  };
  // In order on this thread, a block of 16 KiB at a time: unshuffled into a buffer in L1,
  // hashed there and streamed to the destination, so each byte crosses the memory bus once on
  // its way out (the planes are read once, the destination written once, never read back).
  auto deliver = [&](int64_t i) -> Status {
    const int64_t c = c0 + i;
    const size_t slot = static_cast<size_t>(i % window);
    uint8_t* to = out[slot];
    const uint8_t* from = plain[slot];
    const size_t have = z.have(c);
    if (from == to) return consume(c, 0, to, have);  // decompressed in place
    constexpr size_t kBlock = 16u << 10;
    alignas(64) uint8_t block[kBlock];
    const size_t per = kBlock / z.elem;  // elements a block
    for (size_t e = 0, n = have / z.elem; e < n; e += per) {
      const size_t count = std::min(per, n - e);
      const size_t at = e * z.elem, bytes = count * z.elem;
      const uint8_t* part = from + at;
      if (z.shuffle) {
        ByteUnshuffle(from, z.chunk_bytes / z.elem, z.elem, e, count, block);
        part = block;
      }
      CKPT_RETURN_IF_ERROR(consume(c, at, part, bytes), "");
      if (to) StreamCopy(to + at, part, bytes);
    }
    return Status::Ok();
  };
  // The first error stops the reader too (FrameReader::Stop), so no worker waits for it.
  return RunOrdered(c1 - c0, workers, window, decode, deliver, [&] {
    if (reader) reader->Stop();
  });
}

Status RankFile::ReadAll(const DatasetRecord& rec, void* out, Xxh3Stream* digest) const {
  CKPT_RETURN_IF_ERROR(CheckShape(rec), "");
  if (rec.bytes == 0) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> at, impl_->DirectOffset(rec), "");
  if (at) {
    // One pass over the bytes: each part is hashed as soon as it has arrived, while it is in
    // cache.
    RandomAccessFile::PartFn hash;
    if (digest)
      hash = [digest](uint64_t, const uint8_t* p, size_t n) {
        digest->Update(p, n);
        return Status::Ok();
      };
    return impl_->data->ReadLarge(*at, rec.bytes, out, hash).WithContext("dataset /" + rec.name);
  }
  CKPT_ASSIGN_OR_RETURN(const Impl::ZstdChunks* z, impl_->Zstd(rec), "");
  if (z) {
    auto* p = static_cast<uint8_t*>(out);
    return impl_->DecodeChunks(
        rec, *z, 0, z->count(), [&](int64_t c) { return p + z->first_byte(c); },
        [&](int64_t, size_t, const uint8_t* bytes, size_t n) {
          if (digest) digest->Update(bytes, n);
          return Status::Ok();
        });
  }
  CKPT_ASSIGN_OR_RETURN(hid_t d, impl_->Dataset(rec, /*whole=*/true), "");
  h5::ExpectChunkBytes expect(impl_->chunk_bytes[rec.name]);
  if (H5Dread(d, h5::MemType(rec.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    return DataLoss(impl_->label + ": dataset /" + rec.name + ": read failed (" +
                    h5::ErrorText() + ")");
  if (digest) digest->Update(out, rec.bytes);
  return Status::Ok();
}

Status CompareDigests(const std::string& label, const DatasetRecord& rec, const std::string& got,
                      const std::vector<std::string>* pieces) {
  if (pieces && rec.has_pieces()) {
    for (size_t k = 0; k < pieces->size() && k < rec.piece_xxh3.size(); ++k) {
      if ((*pieces)[k] == rec.piece_xxh3[k]) continue;
      const uint64_t pb = k * rec.piece_bytes;
      const uint64_t pe = std::min(pb + rec.piece_bytes, rec.bytes);
      return DataLoss(label + ": dataset /" + rec.name + ": checksum mismatch in piece " +
                      std::to_string(k) + " of " + std::to_string(rec.piece_count()) +
                      " (bytes [" + std::to_string(pb) + ", " + std::to_string(pe) +
                      "); manifest " + rec.piece_xxh3[k] + ", data " + (*pieces)[k] + ")");
    }
  }
  if (got != rec.xxh3)
    return DataLoss(label + ": dataset /" + rec.name + ": checksum mismatch (manifest " +
                    rec.xxh3 + ", data " + got + ")");
  return Status::Ok();
}

Status RankFile::VerifyDataset(const DatasetRecord& rec) const {
  CKPT_RETURN_IF_ERROR(CheckShape(rec), "");
  const Impl::ZstdChunks* z = nullptr;
  if (rec.bytes > 0) {
    CKPT_ASSIGN_OR_RETURN(z, impl_->Zstd(rec), "");
  }
  if (z) {  // chunk by chunk, decompressed on threads, hashed in order: memory of a few chunks
    Xxh3Stream h;
    std::optional<PieceDigests> pieces;
    if (rec.has_pieces()) pieces.emplace(rec.piece_bytes);
    CKPT_RETURN_IF_ERROR(impl_->DecodeChunks(
        rec, *z, 0, z->count(), [](int64_t) { return nullptr; },
        [&](int64_t, size_t, const uint8_t* bytes, size_t n) {
          h.Update(bytes, n);
          if (pieces) pieces->Update(bytes, n);
          return Status::Ok();
        }));
    std::vector<std::string> piece_hex;
    if (pieces) piece_hex = pieces->Finish();
    return CompareDigests(impl_->label, rec, h.HexDigest(), pieces ? &piece_hex : nullptr);
  }
  if (rec.shape.size() != 1) {
    std::vector<uint8_t> buf(rec.bytes);
    Xxh3Stream h;
    CKPT_RETURN_IF_ERROR(ReadAll(rec, buf.data(), &h), "");
    return CompareDigests(impl_->label, rec, h.HexDigest(), nullptr);
  }
  CKPT_RETURN_IF_ERROR(CheckShape(rec), "");
  const size_t elem = DTypeSize(rec.dtype);
  const int64_t block = std::max<int64_t>(1, static_cast<int64_t>(kBlockBytes / elem));  // in L2
  std::vector<uint8_t> buf(static_cast<size_t>(std::min<int64_t>(block, rec.shape[0])) * elem);
  Xxh3Stream h;
  std::optional<PieceDigests> pieces;
  if (rec.has_pieces()) pieces.emplace(rec.piece_bytes);
  for (int64_t off = 0; off < rec.shape[0]; off += block) {
    const int64_t n = std::min(block, rec.shape[0] - off);
    CKPT_RETURN_IF_ERROR(ReadSlice(rec, off, n, buf.data(), /*sequential=*/true), "");
    h.Update(buf.data(), static_cast<size_t>(n) * elem);
    if (pieces) pieces->Update(buf.data(), static_cast<size_t>(n) * elem);
  }
  std::vector<std::string> piece_hex;
  if (pieces) piece_hex = pieces->Finish();
  return CompareDigests(impl_->label, rec, h.HexDigest(), pieces ? &piece_hex : nullptr);
}

Result<RankFile::WholeFileCheck> RankFile::CheckWholeFile(
    const std::vector<DatasetRecord>& datasets,
    const std::function<void(uint64_t)>& progress) const {
  CKPT_ASSIGN_OR_RETURN(WholeFilePlan plan, PlanWholeFile(datasets), "");
  return RunWholeFile(datasets, plan, progress);
}

Result<RankFile::WholeFilePlan> RankFile::PlanWholeFile(
    const std::vector<DatasetRecord>& datasets) const {
  WholeFilePlan plan;
  plan.early.resize(datasets.size());
  for (size_t i = 0; i < datasets.size(); ++i) {
    const DatasetRecord& rec = datasets[i];
    Status s = CheckShape(rec);
    if (!s.ok()) {
      plan.early[i] = s;
      continue;
    }
    if (rec.bytes == 0) {
      plan.early[i] = CompareDigests(impl_->label, rec, Xxh3Stream().HexDigest(), nullptr);
      continue;
    }
    Result<std::optional<uint64_t>> at = impl_->DirectOffset(rec);
    if (!at.ok()) {
      plan.early[i] = at.status();
    } else if (!*at) {
      plan.through_hdf5.push_back(i);
    } else {
      plan.regions.push_back({**at, **at + rec.bytes, i});
    }
  }
  std::sort(plan.regions.begin(), plan.regions.end(),
            [](const WholeFilePlan::Region& a, const WholeFilePlan::Region& b) {
              return a.begin < b.begin;
            });
  return plan;
}

void RankFile::CloseHdf5() {
  // Datasets first: a file with objects open stays open inside HDF5.
  impl_->open.clear();
  impl_->open_whole.clear();
  impl_->dapl = h5::Handle();
  impl_->dapl_whole = h5::Handle();
  impl_->file = h5::Handle();
}

Result<RankFile::WholeFileCheck> RankFile::RunWholeFile(
    const std::vector<DatasetRecord>& datasets, const WholeFilePlan& plan,
    const std::function<void(uint64_t)>& progress) const {
  WholeFileCheck out;
  out.datasets = plan.early;
  // The datasets whose bytes lie in the file as they are, in file order.
  struct Region {
    uint64_t begin, end;
    size_t index;
    Xxh3Stream digest;
    std::optional<PieceDigests> pieces;
  };
  std::vector<Region> regions;
  for (const auto& p : plan.regions) {
    Region& r = regions.emplace_back();
    r.begin = p.begin;
    r.end = p.end;
    r.index = p.index;
    if (datasets[p.index].has_pieces()) r.pieces.emplace(datasets[p.index].piece_bytes);
  }
  // One sequential pass in large reads (Scan: O_DIRECT ahead of the hashing when the file is
  // not cached); the hashing of each part runs in L2-sized steps of 1 MiB.
  Xxh3Stream file_digest;
  size_t next = 0;  // first region not yet finished
  CKPT_RETURN_IF_ERROR(
      impl_->data->Scan(0, impl_->file_bytes,
                        [&](uint64_t pos, const uint8_t* buf, size_t n) -> Status {
                          for (size_t step = 0; step < n; step += kBlockBytes) {
                            const uint64_t lo = pos + step,
                                           hi = pos + std::min<uint64_t>(n, step + kBlockBytes);
                            file_digest.Update(buf + step, static_cast<size_t>(hi - lo));
                            for (size_t k = next; k < regions.size() && regions[k].begin < hi;
                                 ++k) {
                              Region& r = regions[k];
                              const uint64_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
                              if (a >= b) continue;
                              const uint8_t* p = buf + (a - pos);
                              r.digest.Update(p, static_cast<size_t>(b - a));
                              if (r.pieces) r.pieces->Update(p, static_cast<size_t>(b - a));
                            }
                            while (next < regions.size() && regions[next].end <= hi) ++next;
                          }
                          if (progress) progress(n);
                          return Status::Ok();
                        }),
      "");
  out.file_xxh3 = file_digest.HexDigest();
  for (Region& r : regions) {
    std::vector<std::string> piece_hex;
    if (r.pieces) piece_hex = r.pieces->Finish();
    out.datasets[r.index] = CompareDigests(impl_->label, datasets[r.index], r.digest.HexDigest(),
                                           r.pieces ? &piece_hex : nullptr);
  }
  for (size_t i : plan.through_hdf5) out.datasets[i] = VerifyDataset(datasets[i]);
  return out;
}

const uint8_t* PieceCache::Find(const void* file, const std::string& dataset, uint64_t index) {
  for (Entry& e : entries_) {
    if (e.file == file && e.index == index && e.dataset == dataset) {
      e.used = ++clock_;
      return e.bytes.data();
    }
  }
  return nullptr;
}

uint8_t* PieceCache::Insert(const void* file, const std::string& dataset, uint64_t index,
                            size_t bytes) {
  Entry* slot = nullptr;
  if (entries_.size() < capacity_) {
    slot = &entries_.emplace_back();
  } else {
    slot = &*std::min_element(entries_.begin(), entries_.end(),
                              [](const Entry& a, const Entry& b) { return a.used < b.used; });
  }
  slot->file = nullptr;  // until the room is had
  if (slot->bytes.size() < bytes) {
    slot->bytes = AlignedBuffer();  // the old room goes first
    slot->bytes = AlignedBuffer(bytes);
  }
  slot->file = file;
  slot->dataset = dataset;
  slot->index = index;
  slot->used = ++clock_;
  return slot->bytes.data();
}

void PieceCache::Erase(const void* file, const std::string& dataset, uint64_t index) {
  for (Entry& e : entries_) {
    if (e.file == file && e.index == index && e.dataset == dataset) {
      e.file = nullptr;  // the slot keeps its room for the next piece
      e.used = 0;
      return;
    }
  }
}

Status RankFile::ReadSliceVerified(const DatasetRecord& rec, int64_t offset, int64_t count,
                                   void* out, uint64_t* bytes_read, PieceCache* cache) const {
  if (!rec.has_pieces() || rec.piece_xxh3.size() != rec.piece_count())
    return InvalidArgument(impl_->label + ": dataset /" + rec.name + " records no piece digests");
  CKPT_RETURN_IF_ERROR(CheckSlice(impl_->label, rec, offset, count));
  if (count == 0) return Status::Ok();
  const uint64_t elem = DTypeSize(rec.dtype);
  const uint64_t piece = rec.piece_bytes;  // a multiple of elem (ValidateManifest)
  const uint64_t begin = static_cast<uint64_t>(offset) * elem;
  const uint64_t end = static_cast<uint64_t>(offset + count) * elem;
  auto* dst = static_cast<uint8_t*>(out);
  // Piece k's bytes hashed to `got`: ok, or DataLoss naming the piece.
  auto check_piece = [&](uint64_t k, const std::string& got) -> Status {
    if (got == rec.piece_xxh3[k]) return Status::Ok();
    const uint64_t pb = k * piece, pe = std::min(pb + piece, rec.bytes);
    return DataLoss(impl_->label + ": dataset /" + rec.name + ": checksum mismatch in piece " +
                    std::to_string(k) + " of " + std::to_string(rec.piece_count()) + " (bytes [" +
                    std::to_string(pb) + ", " + std::to_string(pe) + "); manifest " +
                    rec.piece_xxh3[k] + ", data " + got + ")");
  };
  // Reads piece k whole into `to` and checks it.
  auto read_piece = [&](uint64_t k, uint8_t* to) -> Status {
    const uint64_t pb = k * piece, pe = std::min(pb + piece, rec.bytes);
    CKPT_RETURN_IF_ERROR(
        ReadSlice(rec, static_cast<int64_t>(pb / elem), static_cast<int64_t>((pe - pb) / elem), to),
        "");
    if (bytes_read) *bytes_read += pe - pb;
    return check_piece(k, DigestHex(Xxh3(to, pe - pb)));
  };
  // The pieces the slice covers whole, [k0, k1) (the short last piece is whole when the slice
  // reaches the dataset's end). Two or more of them in a contiguous dataset are one large read
  // straight into the caller's buffer (O_DIRECT ahead of the caller where the file system
  // allows), each piece hashed as its bytes arrive: a piece at a time was one synchronous 4 MiB
  // pread each through the page cache (docs/performance.md, 2026-12-06 12:30).
  const uint64_t k0 = (begin + piece - 1) / piece;
  const uint64_t k1 = end == rec.bytes ? rec.piece_count() : end / piece;
  bool run_read = false;
  if (k1 >= k0 + 2) {
    CKPT_RETURN_IF_ERROR(CheckShape(rec), "");
    CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> at, impl_->DirectOffset(rec), "");
    if (at) {
      const uint64_t rb = k0 * piece, re = std::min(k1 * piece, rec.bytes);
      PieceDigests digests(piece);
      CKPT_RETURN_IF_ERROR(impl_->data
                               ->ReadLarge(*at + rb, re - rb, dst + (rb - begin),
                                           [&](uint64_t, const uint8_t* p, size_t n) {
                                             digests.Update(p, n);
                                             return Status::Ok();
                                           })
                               .WithContext("dataset /" + rec.name),
                           "");
      if (bytes_read) *bytes_read += re - rb;
      const std::vector<std::string> got = digests.Finish();
      for (uint64_t k = k0; k < k1; ++k)
        CKPT_RETURN_IF_ERROR(check_piece(k, got[static_cast<size_t>(k - k0)]), "");
      run_read = true;
    }
  }
  for (uint64_t k = begin / piece; k * piece < end; ++k) {
    if (run_read && k >= k0 && k < k1) continue;
    const uint64_t pb = k * piece, pe = std::min(pb + piece, rec.bytes);
    const uint64_t lo = std::max(begin, pb), hi = std::min(end, pe);
    if (lo == pb && hi == pe) {  // the whole piece is wanted: straight into the caller's buffer
      CKPT_RETURN_IF_ERROR(read_piece(k, dst + (lo - begin)), "");
      continue;
    }
    const uint8_t* piece_bytes = cache ? cache->Find(this, rec.name, k) : nullptr;
    AlignedBuffer scratch;
    if (!piece_bytes) {
      uint8_t* buf = nullptr;
      if (cache) {
        buf = cache->Insert(this, rec.name, k, static_cast<size_t>(pe - pb));
      } else {
        scratch = AlignedBuffer(static_cast<size_t>(pe - pb));
        buf = scratch.data();
      }
      Status s = read_piece(k, buf);
      if (!s.ok()) {
        if (cache) cache->Erase(this, rec.name, k);
        return s;
      }
      piece_bytes = buf;
    }
    std::memcpy(dst + (lo - begin), piece_bytes + (lo - pb), hi - lo);
  }
  return Status::Ok();
}

Result<std::optional<uint64_t>> RankFile::SliceFileOffset(const DatasetRecord& rec,
                                                          int64_t offset) const {
  CKPT_RETURN_IF_ERROR(CheckSlice(impl_->label, rec, offset, 0));
  CKPT_RETURN_IF_ERROR(CheckShape(rec), "");
  CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> at, impl_->DirectOffset(rec), "");
  if (at) *at += static_cast<uint64_t>(offset) * DTypeSize(rec.dtype);
  return at;
}

Status RankFile::ReadSlice(const DatasetRecord& rec, int64_t offset, int64_t count, void* out,
                           bool sequential) const {
  CKPT_RETURN_IF_ERROR(CheckSlice(impl_->label, rec, offset, count));
  if (count == 0) return Status::Ok();
  CKPT_RETURN_IF_ERROR(CheckShape(rec), "");
  CKPT_ASSIGN_OR_RETURN(std::optional<uint64_t> at, impl_->DirectOffset(rec), "");
  if (at) {
    const size_t elem = DTypeSize(rec.dtype);
    return impl_->data
        ->ReadLarge(*at + static_cast<uint64_t>(offset) * elem, static_cast<uint64_t>(count) * elem,
                    out, nullptr)
        .WithContext("dataset /" + rec.name);
  }
  CKPT_ASSIGN_OR_RETURN(const Impl::ZstdChunks* z, impl_->Zstd(rec), "");
  if (z) {
    // Chunks the slice covers whole are decompressed straight into `out`; a chunk it covers
    // only partly goes through a buffer and stays cached for the next slice.
    const uint64_t begin = static_cast<uint64_t>(offset) * z->elem;
    const uint64_t end = static_cast<uint64_t>(offset + count) * z->elem;
    auto* dst = static_cast<uint8_t*>(out);
    int64_t c0 = offset / z->rows_per_chunk;
    int64_t c1 = (offset + count - 1) / z->rows_per_chunk + 1;
    auto copy_part = [&](int64_t c, const uint8_t* bytes) {
      const uint64_t cb = z->first_byte(c), ce = cb + z->have(c);
      const uint64_t lo = std::max(begin, cb), hi = std::min(end, ce);
      std::memcpy(dst + (lo - begin), bytes + (lo - cb), hi - lo);
    };
    auto whole = [&](int64_t c) {
      return z->first_byte(c) >= begin && z->first_byte(c) + z->have(c) <= end;
    };
    Impl& im = *impl_;
    if (im.cached_name == rec.name && im.cached_chunk >= c0 && im.cached_chunk < c1 &&
        (im.cached_chunk == c0 || im.cached_chunk == c1 - 1)) {
      copy_part(im.cached_chunk, im.cached.data());
      if (im.cached_chunk == c0) ++c0;
      else --c1;
    }
    if (c0 >= c1) return Status::Ok();
    return im.DecodeChunks(
        rec, *z, c0, c1,
        [&](int64_t c) { return whole(c) ? dst + (z->first_byte(c) - begin) : nullptr; },
        [&](int64_t c, size_t at, const uint8_t* bytes, size_t n) {
          if (whole(c)) return Status::Ok();
          if (at == 0) {
            im.cached_name.clear();  // not valid while it is being replaced
            im.cached.resize(z->have(c));
          }
          std::memcpy(im.cached.data() + at, bytes, n);
          if (at + n < z->have(c)) return Status::Ok();
          copy_part(c, im.cached.data());
          im.cached_name = rec.name;
          im.cached_chunk = c;
          return Status::Ok();
        });
  }
  CKPT_ASSIGN_OR_RETURN(hid_t d, impl_->Dataset(rec, sequential), "");
  h5::Handle fspace = h5::Space(H5Dget_space(d));
  hsize_t start = static_cast<hsize_t>(offset), cnt = static_cast<hsize_t>(count);
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr);
  h5::Handle mspace = h5::Space(H5Screate_simple(1, &cnt, nullptr));
  h5::ExpectChunkBytes expect(impl_->chunk_bytes[rec.name]);
  if (H5Dread(d, h5::MemType(rec.dtype), mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
    return DataLoss(impl_->label + ": dataset /" + rec.name + ": read failed (" +
                    h5::ErrorText() + ")");
  return Status::Ok();
}

}  // namespace ckpt::internal
