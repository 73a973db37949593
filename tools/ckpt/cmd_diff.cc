// ckpt diff A B: tensor-by-tensor comparison of two checkpoints (roots at latest, or tags).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>

#include "ckpt/reader.h"
#include "command.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

struct Difference {
  std::string what;
  std::optional<double> max_abs;
  std::optional<double> max_rel;
};

struct DiffArgs {
  std::string a, b;
  std::string tag_a, tag_b;
  double atol = 0.0, rtol = 0.0;
  bool json = false;
};

// Compares two float vectors; returns a difference when any element is outside tolerance
// (bitwise equality when both tolerances are 0).
std::optional<Difference> CompareFloats(const std::string& what, const std::vector<float>& x,
                                        const std::vector<float>& y, double atol, double rtol) {
  if (x.size() != y.size()) return Difference{what + ": sizes differ", {}, {}};
  const bool exact = atol == 0.0 && rtol == 0.0;
  if (exact && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0) return std::nullopt;
  double max_abs = 0, max_rel = 0;
  bool outside = false;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = x[i], b = y[i];
    if (std::isnan(a) || std::isnan(b)) {
      if (std::isnan(a) != std::isnan(b)) {
        outside = true;
        max_abs = max_rel = INFINITY;
      }
      continue;
    }
    const double d = std::fabs(a - b);
    const double rel = d / std::max(std::fabs(b), 1e-30);
    max_abs = std::max(max_abs, d);
    if (d > 0) max_rel = std::max(max_rel, rel);
    if (exact ? d != 0.0 || std::signbit(a) != std::signbit(b) : d > atol + rtol * std::fabs(b))
      outside = true;
  }
  if (!outside) return std::nullopt;
  return Difference{what, max_abs, max_rel};
}

Status RunDiff(const DiffArgs& a, std::vector<Difference>& diffs) {
  CKPT_ASSIGN_OR_RETURN(CheckpointReader ra, CheckpointReader::Open(a.a, a.tag_a), "A");
  CKPT_ASSIGN_OR_RETURN(CheckpointReader rb, CheckpointReader::Open(a.b, a.tag_b), "B");
  const Manifest& ma = ra.manifest();
  const Manifest& mb = rb.manifest();
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
    note("optimizer: " + ma.optimizer.dump() + " vs " + mb.optimizer.dump());
  if (ma.client_state != mb.client_state)
    note("client_state: " + ma.client_state.dump() + " vs " + mb.client_state.dump());

  // Parameter tables.
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
    for (auto state : states) {
      CKPT_ASSIGN_OR_RETURN(std::vector<float> x, ra.ReadParamFull(p.name, state), "A");
      CKPT_ASSIGN_OR_RETURN(std::vector<float> y, rb.ReadParamFull(p.name, state), "B");
      auto d = CompareFloats(std::string(state) + " " + p.name, x, y, a.atol, a.rtol);
      if (d) diffs.push_back(*d);
    }
  }
  for (const auto& q : mb.params)
    if (!ma.FindParam(q.name)) note("param " + q.name + ": only in B");

  // Per-rank state that is not the partitioned tensors: RNG, data position, scheduler, ...
  auto per_rank = [](const Manifest& m) {
    std::set<std::pair<int, std::string>> out;
    for (const auto& f : m.files)
      for (const auto& d : f.datasets)
        if (d.name != kMaster && d.name != kExpAvg && d.name != kExpAvgSq && d.name != kCompute &&
            d.name.rfind(kFrozenPrefix, 0) != 0)
          out.insert({f.rank, d.name});
    return out;
  };
  const auto sa = per_rank(ma), sb = per_rank(mb);
  std::set<std::pair<int, std::string>> all = sa;
  all.insert(sb.begin(), sb.end());
  for (const auto& [rank, name] : all) {
    const std::string what = "rank " + std::to_string(rank) + " " + name;
    if (!sa.count({rank, name})) {
      note(what + ": only in B");
      continue;
    }
    if (!sb.count({rank, name})) {
      note(what + ": only in A");
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> x, ra.ReadDatasetBytes(rank, name), "A");
    CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> y, rb.ReadDatasetBytes(rank, name), "B");
    const DatasetRecord* rec = ma.FindDataset(rank, name);
    if (rec && rec->kind == "json") {
      auto jx = json::parse(x.begin(), x.end(), nullptr, false);
      auto jy = json::parse(y.begin(), y.end(), nullptr, false);
      if (jx != jy) note(what + ": " + jx.dump() + " vs " + jy.dump());
    } else if (x != y) {
      note(what + ": bytes differ");
    }
  }
  return Status::Ok();
}

std::function<int()> SetupDiff(CLI::App& sub) {
  auto a = std::make_shared<DiffArgs>();
  sub.add_option("A", a->a, "first checkpoint (root at latest, or tag directory)")->required();
  sub.add_option("B", a->b, "second checkpoint")->required();
  sub.add_option("--tag-a", a->tag_a, "tag inside A");
  sub.add_option("--tag-b", a->tag_b, "tag inside B");
  sub.add_option("--atol", a->atol, "absolute tolerance (default 0: bitwise)")
      ->check(CLI::NonNegativeNumber);
  sub.add_option("--rtol", a->rtol, "relative tolerance (default 0: bitwise)")
      ->check(CLI::NonNegativeNumber);
  sub.add_flag("--json", a->json, "machine-readable output");
  return [a] {
    std::vector<Difference> diffs;
    Status s = RunDiff(*a, diffs);
    if (!s.ok()) return ReportError("diff", s, a->json);
    if (a->json) {
      json dj = json::array();
      for (const auto& d : diffs)
        dj.push_back({{"what", d.what},
                      {"max_abs", d.max_abs ? json(*d.max_abs) : json(nullptr)},
                      {"max_rel", d.max_rel ? json(*d.max_rel) : json(nullptr)}});
      PrintJson({{"identical", diffs.empty()}, {"differences", dj}});
    } else if (diffs.empty()) {
      std::printf("identical%s\n", a->atol > 0 || a->rtol > 0 ? " within tolerance" : "");
    } else {
      std::printf("%zu difference(s)\n", diffs.size());
      for (const auto& d : diffs) {
        std::printf("  %s", d.what.c_str());
        if (d.max_abs) std::printf("  max_abs %.6g", *d.max_abs);
        if (d.max_rel) std::printf("  max_rel %.6g", *d.max_rel);
        std::printf("\n");
      }
    }
    return diffs.empty() ? 0 : 1;
  };
}

}  // namespace

CKPT_REGISTER_COMMAND(diff, "diff", "compare two checkpoints tensor by tensor (exit 1 if they differ)",
                      SetupDiff);

}  // namespace ckpt::cli
