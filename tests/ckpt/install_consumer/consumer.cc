// Writes and reads back a one-rank checkpoint through the installed libraries: ckpt writes and
// reads it, convert exports it, verify replays its next update, estimate counts it.
#include <cstdio>
#include <vector>

#include "ckpt/collective.h"
#include "ckpt/reader.h"
#include "ckpt/writer.h"
#include "convert/export.h"
#include "estimate/param_count.h"
#include "verify/resume.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  ckpt::Manifest m;
  m.tag = "global_step1";
  ckpt::ParamEntry p;
  p.name = "w";
  p.shape = {4};
  p.numel = 4;
  m.params.push_back(p);
  m.partition = ckpt::BuildPartition(m.params, 1, 1).value();
  std::vector<float> w(static_cast<size_t>(m.partition.shard_numel[0]), 0.5f);
  ckpt::RankContents c;
  for (const char* s : {"master", "exp_avg", "exp_avg_sq"})
    c.datasets.push_back(ckpt::DatasetSpec::Tensor(s, ckpt::DType::kF32, {m.partition.shard_numel[0]}, w.data()));
  ckpt::SingleCollective one;
  ckpt::Status s = ckpt::SaveCheckpoint(argv[1], m, c, one);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  auto r = ckpt::CheckpointReader::Open(argv[1]);
  if (!r.ok() || (*r->ReadParamFull("w"))[3] != 0.5f) return 1;
  auto exported = ckpt::convert::ExportFp32(argv[1], std::string(argv[1]) + "-export");
  if (!exported.ok() || exported->tensors != 1) return 1;
  if (ckpt::verify::ParseAblate("all").value().size() != 5) return 1;
  auto table = ckpt::estimate::ParamTableFromCheckpoint(argv[1]);
  if (!table.ok() || ckpt::estimate::CountParams(*table).total_params != 4) return 1;
  std::printf("consumer ok\n");
  return 0;
}
