// ckpt diff (ckpt/diff.h): two StateSources compared table by table, tensor by tensor.
#include "ckpt/diff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "ckpt/json.h"
#include "ckpt/progress.h"
#include "ckpt/state_source.h"

namespace ckpt {
namespace {

using nlohmann::json;

constexpr int64_t kChunk = 1 << 20;  // elements per side per comparison step

// Running comparison of one tensor, fed in pieces.
class FloatCompare {
 public:
  FloatCompare(double atol, double rtol) : atol_(atol), rtol_(rtol) {}

  void Add(const float* x, const float* y, size_t n) {
    const bool exact = atol_ == 0.0 && rtol_ == 0.0;
    if (exact && std::memcmp(x, y, n * sizeof(float)) == 0) return;
    for (size_t i = 0; i < n; ++i) {
      const double a = x[i], b = y[i];
      if (std::isnan(a) || std::isnan(b)) {
        if (std::isnan(a) != std::isnan(b)) {
          outside_ = true;
          max_abs_ = max_rel_ = INFINITY;
        }
        continue;
      }
      const double d = std::fabs(a - b);
      const double rel = d / std::max(std::fabs(b), 1e-30);
      max_abs_ = std::max(max_abs_, d);
      if (d > 0) max_rel_ = std::max(max_rel_, rel);
      if (exact ? d != 0.0 || std::signbit(a) != std::signbit(b)
                : d > atol_ + rtol_ * std::fabs(b))
        outside_ = true;
    }
  }

  std::optional<Difference> Verdict(const std::string& what) const {
    if (!outside_) return std::nullopt;
    return Difference{what, max_abs_, max_rel_};
  }

 private:
  double atol_, rtol_;
  double max_abs_ = 0, max_rel_ = 0;
  bool outside_ = false;
};

struct Sources {
  std::unique_ptr<StateSource> a, b;
};

Status Compare(const DiffOptions& o, Sources& s, DiffReport& report) {
  const Manifest& ma = s.a->manifest();
  const Manifest& mb = s.b->manifest();
  auto& diffs = report.differences;
  auto note = [&](std::string what) { diffs.push_back({std::move(what), {}, {}}); };

  const std::pair<const char*, std::pair<int64_t, int64_t>> counters[] = {
      {"global_step", {ma.counters.global_step, mb.counters.global_step}},
      {"micro_step", {ma.counters.micro_step, mb.counters.micro_step}},
      {"skipped_steps", {ma.counters.skipped_steps, mb.counters.skipped_steps}},
      {"samples_seen", {ma.counters.samples_seen, mb.counters.samples_seen}},
      {"tokens_seen", {ma.counters.tokens_seen, mb.counters.tokens_seen}},
  };
  for (const auto& [name, v] : counters) {
    if (v.first != v.second)
      diffs.push_back({std::string("counters.") + name + ": " + std::to_string(v.first) + " vs " +
                           std::to_string(v.second),
                       std::fabs(static_cast<double>(v.first - v.second)), {}});
  }
  if (ma.optimizer != mb.optimizer)
    note("optimizer: " + JsonText(ma.optimizer) + " vs " + JsonText(mb.optimizer));
  if (ma.client_state != mb.client_state)
    note("client_state: " + JsonText(ma.client_state) + " vs " + JsonText(mb.client_state));

  // Parameter tables, then the values of every parameter both hold alike.
  std::vector<std::pair<const ParamEntry*, std::vector<std::string_view>>> compared;
  uint64_t total = 0;
  for (const auto& p : ma.params) {
    const ParamEntry* q = mb.FindParam(p.name);
    if (!q) {
      note("param " + p.name + ": only in A");
      continue;
    }
    if (p.shape != q->shape || p.dtype != q->dtype || p.frozen != q->frozen ||
        p.tied_to != q->tied_to) {
      note("param " + p.name + ": shape, dtype, frozen or tied_to differ");
      continue;
    }
    if (!p.tied_to.empty()) continue;  // compared at its owner
    std::vector<std::string_view> states = {kMaster};
    if (!p.frozen) states = {kMaster, kExpAvg, kExpAvgSq};
    total += static_cast<uint64_t>(p.numel) * states.size() * 8;
    compared.push_back({&p, std::move(states)});
  }
  for (const auto& q : mb.params)
    if (!ma.FindParam(q.name)) note("param " + q.name + ": only in B");

  Progress bar("diff", total, o.progress);
  std::vector<float> x, y;
  for (const auto& [p, states] : compared) {
    for (std::string_view state : states) {
      FloatCompare cmp(o.atol, o.rtol);
      for (int64_t begin = 0; begin < p->numel; begin += kChunk) {
        const int64_t end = std::min(p->numel, begin + kChunk);
        x.resize(static_cast<size_t>(end - begin));
        y.resize(x.size());
        CKPT_RETURN_IF_ERROR(s.a->ReadParamRange(p->name, state, begin, end, x.data()), "A");
        CKPT_RETURN_IF_ERROR(s.b->ReadParamRange(p->name, state, begin, end, y.data()), "B");
        cmp.Add(x.data(), y.data(), x.size());
        bar.Add(static_cast<uint64_t>(end - begin) * 8);
      }
      if (auto d = cmp.Verdict(std::string(state) + " " + p->name)) diffs.push_back(*d);
    }
  }
  bar.Finish();
  const std::vector<std::string> all_states = {std::string(kMaster), std::string(kExpAvg),
                                               std::string(kExpAvgSq)};
  CKPT_RETURN_IF_ERROR(s.a->FinishVerification(all_states), "A");
  CKPT_RETURN_IF_ERROR(s.b->FinishVerification(all_states), "B");

  // Per-rank state that is not the partitioned tensors: RNG, data position, scheduler, ...
  auto per_rank = [](StateSource& src) {
    std::map<std::pair<int, std::string>, RankExtra> out;
    for (int r = 0; r < src.source_ranks(); ++r)
      for (auto& ex : src.RankExtras(r)) out.emplace(std::make_pair(r, ex.name), ex);
    return out;
  };
  const auto sa = per_rank(*s.a), sb = per_rank(*s.b);
  std::set<std::pair<int, std::string>> all;
  for (const auto& [k, v] : sa) all.insert(k);
  for (const auto& [k, v] : sb) all.insert(k);
  for (const auto& key : all) {
    const auto& [rank, name] = key;
    const std::string what = "rank " + std::to_string(rank) + " " + name;
    auto ia = sa.find(key), ib = sb.find(key);
    if (ia == sa.end()) {
      note(what + ": only in B");
      continue;
    }
    if (ib == sb.end()) {
      note(what + ": only in A");
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> xa, s.a->ReadRankExtra(rank, ia->second), "A");
    CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> xb, s.b->ReadRankExtra(rank, ib->second), "B");
    if (ia->second.record.kind == "json") {
      auto ja = ParseJson(
          std::string_view(reinterpret_cast<const char*>(xa.data()), xa.size()), "A");
      auto jb = ParseJson(
          std::string_view(reinterpret_cast<const char*>(xb.data()), xb.size()), "B");
      if (!ja.ok() || !jb.ok()) {
        note(what + ": " + (ja.ok() ? jb.status() : ja.status()).message());
      } else if (*ja != *jb) {
        note(what + ": " + ja->dump() + " vs " + jb->dump());
      }
    } else if (xa != xb) {
      note(what + ": bytes differ");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<DiffReport> DiffCheckpoints(const std::string& a, const std::string& b,
                                   const DiffOptions& o) {
  SourceOptions oa, ob;
  oa.env = ob.env = o.env;
  oa.stream_verify = ob.stream_verify = true;
  oa.probe_all = ob.probe_all = true;
  oa.tag = o.tag_a;
  ob.tag = o.tag_b;
  Sources s;
  CKPT_ASSIGN_OR_RETURN(s.a, OpenStateSource(a, oa), "A");
  CKPT_ASSIGN_OR_RETURN(s.b, OpenStateSource(b, ob), "B");
  DiffReport report;
  report.dir_a = s.a->dir();
  report.dir_b = s.b->dir();
  CKPT_RETURN_IF_ERROR(Compare(o, s, report), "");
  return report;
}

json DiffReportToJson(const DiffReport& r) {
  json dj = json::array();
  for (const auto& d : r.differences)
    dj.push_back({{"what", d.what},
                  {"max_abs", d.max_abs ? json(*d.max_abs) : json(nullptr)},
                  {"max_rel", d.max_rel ? json(*d.max_rel) : json(nullptr)}});
  return {{"identical", r.identical()}, {"differences", dj}};
}

std::string DiffReportToText(const DiffReport& r, bool tolerance) {
  if (r.identical()) return tolerance ? "identical within tolerance\n" : "identical\n";
  std::string out = std::to_string(r.differences.size()) + " difference(s)\n";
  char buf[64];
  for (const auto& d : r.differences) {
    out += "  " + d.what;
    if (d.max_abs) {
      std::snprintf(buf, sizeof buf, "  max_abs %.6g", *d.max_abs);
      out += buf;
    }
    if (d.max_rel) {
      std::snprintf(buf, sizeof buf, "  max_rel %.6g", *d.max_rel);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

}  // namespace ckpt
