// ckpt verify: the CI bundle. The resume-parity and next-update cases need engine_min's run
// log and gradient; a checkpoint from another writer (no engine_config) skips them with a
// message rather than passing silently.
#include "verify/ci.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "ckpt/reader.h"
#include "ckpt/root.h"
#include "verify/next_update.h"
#include "verify/resume.h"
#include "verify/trainlog.h"

namespace ckpt::verify {
namespace {

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t' && c != '\r') {
          out += ' ';
        } else {
          out += c;
        }
    }
  }
  return out;
}

CiCase ErrorCase(std::string name, const Status& s) {
  CiCase c;
  c.name = std::move(name);
  c.outcome = ExitCodeFor(s) == 1 ? CiCase::Outcome::kFailed : CiCase::Outcome::kError;
  c.message = s.ToString();
  return c;
}

template <typename F>
CiCase Timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  CiCase c = f();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

}  // namespace

int CiReport::ExitCode() const {
  int rc = 0;
  for (const CiCase& c : cases) {
    if (c.outcome == CiCase::Outcome::kError) rc = 2;
    if (c.outcome == CiCase::Outcome::kFailed && rc == 0) rc = 1;
  }
  return rc;
}

CiReport RunCiVerify(const CiOptions& o) {
  CiReport rep;
  rep.target = o.root + (o.tag.empty() ? "" : " tag " + o.tag);
  // The one-step resume needs a logged step after the tag: by default the newest tag that has
  // one, not `latest` (the end of the run).
  auto choice = ChooseTagToVerify(o.root, o.tag, o.reference, /*steps=*/1);
  if (!choice.ok()) {
    rep.cases.push_back(ErrorCase("deep_check", choice.status()));
    return rep;
  }
  const std::string* tag_dir = &choice->tag_dir;
  rep.target = *tag_dir;
  rep.tag_note = choice->note;

  rep.cases.push_back(Timed([&] {
    CiCase c;
    c.name = "deep_check";
    auto problems = CheckCheckpoint(*tag_dir, /*deep=*/true);
    if (!problems.ok()) return ErrorCase("deep_check", problems.status());
    if (problems->empty()) {
      c.message = "manifest, every rank file and dataset checksum verified";
    } else {
      c.outcome = CiCase::Outcome::kFailed;
      c.message = std::to_string(problems->size()) +
                  " problem(s), first: " + problems->front().file + " " +
                  problems->front().dataset + ": " + problems->front().what;
      for (const Problem& p : *problems)
        c.details += p.file + " " + p.dataset + ": " + p.what + "\n";
    }
    return c;
  }));
  if (rep.cases.back().outcome != CiCase::Outcome::kPassed) {
    // A corrupt checkpoint: the other checks would only repeat the failure.
    for (const char* name : {"resume_parity", "next_update"}) {
      CiCase c;
      c.name = name;
      c.outcome = CiCase::Outcome::kSkipped;
      c.message = "skipped: the deep check failed";
      rep.cases.push_back(c);
    }
    return rep;
  }
  auto reader = CheckpointReader::Open(*tag_dir);
  const bool engine = reader.ok() && HasEngineConfig(reader->manifest().engine_config);

  rep.cases.push_back(Timed([&] {
    CiCase c;
    c.name = "resume_parity";
    if (!engine && o.launch.empty()) {
      c.outcome = CiCase::Outcome::kSkipped;
      c.message = "skipped: this checkpoint has no engine config, nothing to relaunch (pass --launch to relaunch your trainer)";
      return c;
    }
    ResumeOptions ro;
    ro.root = *tag_dir;
    ro.steps = 1;
    ro.reference = o.reference;
    ro.bin_dir = o.bin_dir;
    ro.checked = true;
    ro.launch = o.launch;
    auto r = RunVerifyResume(ro);
    if (!r.ok()) return ErrorCase("resume_parity", r.status());
    c.details = ResumeToText(*r);
    if (r->bitwise()) {
      c.message = "one-step resume is bitwise equal to the original run";
    } else {
      c.outcome = CiCase::Outcome::kFailed;
      c.message = "resume diverged at step " + std::to_string(r->plain.first->step) + " in " +
                  r->plain.first->quantity + ": " + r->plain.first->detail;
    }
    return c;
  }));

  rep.cases.push_back(Timed([&] {
    CiCase c;
    c.name = "next_update";
    if (!engine && o.grad_file.empty()) {
      c.outcome = CiCase::Outcome::kSkipped;
      c.message = "skipped: this checkpoint has no engine config: pass --grad";
      return c;
    }
    NextUpdateOptions no;
    no.root = *tag_dir;
    no.grad_file = o.grad_file;
    no.device = o.device;
    no.reference = o.reference;
    no.bin_dir = o.bin_dir;
    auto r = RunNextUpdate(no);
    if (!r.ok()) return ErrorCase("next_update", r.status());
    c.details = NextUpdateToText(*r);
    const PathReport wo = MakePathReport(r->overall, r->overall.weights_only);
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "weights-only restore would change the next update: max |dw| %.4g, rel L2 %.4g, "
                  "%.1f%% of elements",
                  wo.max_abs, wo.rel_l2, 100 * wo.frac_differ);
    c.message = buf;
    if (r->matches_reference.has_value() && !*r->matches_reference) {
      c.outcome = CiCase::Outcome::kFailed;
      c.message = "the replayed next update does not match the original run's logged weights";
    } else if (r->matches_reference.has_value()) {
      c.message += "; full-state replay matches the original run bitwise";
    }
    return c;
  }));
  return rep;
}

std::string CiToJUnit(const CiReport& r) {
  int failures = 0, errors = 0, skipped = 0;
  double total = 0;
  for (const CiCase& c : r.cases) {
    failures += c.outcome == CiCase::Outcome::kFailed;
    errors += c.outcome == CiCase::Outcome::kError;
    skipped += c.outcome == CiCase::Outcome::kSkipped;
    total += c.seconds;
  }
  std::ostringstream os;
  char buf[128];
  os << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  std::snprintf(buf, sizeof buf, "%.3f", total);
  os << "<testsuites>\n  <testsuite name=\"ckpt verify\" tests=\"" << r.cases.size()
     << "\" failures=\"" << failures << "\" errors=\"" << errors << "\" skipped=\"" << skipped
     << "\" time=\"" << buf << "\">\n";
  os << "    <properties><property name=\"checkpoint\" value=\"" << XmlEscape(r.target)
     << "\"/></properties>\n";
  for (const CiCase& c : r.cases) {
    std::snprintf(buf, sizeof buf, "%.3f", c.seconds);
    os << "    <testcase classname=\"ckpt.verify\" name=\"" << XmlEscape(c.name) << "\" time=\""
       << buf << "\">\n";
    switch (c.outcome) {
      case CiCase::Outcome::kFailed:
        os << "      <failure message=\"" << XmlEscape(c.message) << "\">" << XmlEscape(c.details)
           << "</failure>\n";
        break;
      case CiCase::Outcome::kError:
        os << "      <error message=\"" << XmlEscape(c.message) << "\"/>\n";
        break;
      case CiCase::Outcome::kSkipped:
        os << "      <skipped message=\"" << XmlEscape(c.message) << "\"/>\n";
        break;
      case CiCase::Outcome::kPassed:
        break;
    }
    if (!c.details.empty() || !c.message.empty()) {
      os << "      <system-out>" << XmlEscape(c.message + "\n" + c.details) << "</system-out>\n";
    }
    os << "    </testcase>\n";
  }
  os << "  </testsuite>\n</testsuites>\n";
  return os.str();
}

std::string CiToText(const CiReport& r) {
  std::ostringstream os;
  os << "ckpt verify " << r.target << "\n";
  if (!r.tag_note.empty()) os << r.tag_note << "\n";
  for (const CiCase& c : r.cases) {
    const char* tag = c.outcome == CiCase::Outcome::kPassed    ? "PASS"
                      : c.outcome == CiCase::Outcome::kFailed  ? "FAIL"
                      : c.outcome == CiCase::Outcome::kSkipped ? "SKIP"
                                                               : "ERROR";
    char buf[64];
    std::snprintf(buf, sizeof buf, "  %-5s %-14s (%.1fs) ", tag, c.name.c_str(), c.seconds);
    os << buf << c.message << "\n";
  }
  return os.str();
}

}  // namespace ckpt::verify
