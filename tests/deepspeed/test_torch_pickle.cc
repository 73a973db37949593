// The restricted unpickler (ckpt/torch_pickle.h) on hand-written pickles: containers are built,
// tensors are rebuilt from storages as references and checked against their storage, code-
// running globals are refused naming the file, self-referencing containers do not hang.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "ckpt/status.h"
#include "ckpt/torch_pickle.h"
#include "test_util.h"

namespace {

using ckpt::ParsePickle;
using ckpt::PyValue;
using ckpt::StatusCode;
using namespace std::string_literals;

// BINUNICODE of s.
std::string U(const std::string& s) {
  std::string out = "X";
  const uint32_t n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  return out + s;
}

// A protocol-2 pickle of _rebuild_tensor_v2(storage(numel), offset, (shape,), (1,), False,
// OrderedDict()).
std::string TensorPickle(int storage_numel, int offset, int shape) {
  return "\x80\x02"s + "ctorch._utils\n_rebuild_tensor_v2\n" + "((" + U("storage") +
         "ctorch\nFloatStorage\n" + U("0") + U("cpu") + "K" + char(storage_numel) + "tQ" + "K" +
         char(offset) + "K" + char(shape) + "\x85" + "K\x01\x85" + "\x89" +
         "ccollections\nOrderedDict\n)R" + "tR.";
}

}  // namespace

TEST_CASE("unpickler builds plain containers", "[unit]") {
  // {'a': 1, 'b': [2.5, None, True], 'c': (u'x',)} as protocol 2
  const std::string p = "\x80\x02}q\x00("s + U("a") + "K\x01" + U("b") + "]q\x01(G\x40\x04\x00\x00\x00\x00\x00\x00N\x88" "e"s +
                        U("c") + U("x") + "\x85u.";
  auto doc = ParsePickle(p, "t.pkl");
  REQUIRE(doc.ok());
  const PyValue& r = doc->root();
  REQUIRE(r.is_dict());
  REQUIRE(r.Get("a")->AsInt() == 1);
  REQUIRE(r.Get("b")->items.size() == 3);
  REQUIRE(r.Get("b")->items[0]->AsDouble() == 2.5);
  REQUIRE(r.Get("b")->items[1]->is_none());
  REQUIRE(r.Get("c")->items[0]->s == "x");
}

TEST_CASE("unpickler rebuilds a tensor as a storage reference", "[unit]") {
  auto doc = ParsePickle(TensorPickle(6, 2, 4), "t.pkl");
  REQUIRE(doc.ok());
  REQUIRE(doc->root().kind == PyValue::Kind::kTensor);
  const auto& t = doc->tensors()[static_cast<size_t>(doc->root().tensor)];
  CHECK(t.key == "0");
  CHECK(t.dtype_name == "fp32");
  CHECK(t.storage_numel == 6);
  CHECK(t.offset == 2);
  CHECK(t.numel() == 4);
  CHECK(t.contiguous());
}

TEST_CASE("unpickler refuses a view larger than its storage", "[unit]") {
  auto doc = ParsePickle(TensorPickle(3, 1, 4), "short.pkl");
  REQUIRE(!doc.ok());
  CHECK(doc.status().code() == StatusCode::kDataLoss);
  CHECK(doc.status().message().find("short.pkl") != std::string::npos);
  CHECK(doc.status().message().find("holds 3") != std::string::npos);
}

TEST_CASE("unpickler refuses globals that run code and names the file", "[unit]") {
  for (const auto& [global, expect] :
       {std::pair<std::string, std::string>{"cos\nsystem\n", "os.system"},
        {"cposix\nsystem\n", "posix.system"},
        {"c__builtin__\neval\n", "__builtin__.eval"},
        {"cbuiltins\nexec\n", "builtins.exec"},
        {"csubprocess\nPopen\n", "subprocess.Popen"},
        {"ctorch\nload\n", "torch.load"},
        {"cbuiltins\n__import__\n", "builtins.__import__"}}) {
    const std::string p = "\x80\x02"s + global + U("touch /tmp/x") + "\x85R.";
    auto doc = ParsePickle(p, "evil.pkl");
    REQUIRE(!doc.ok());
    CHECK(doc.status().code() == StatusCode::kDataLoss);
    CHECK(doc.status().message().find("evil.pkl") != std::string::npos);
    CHECK(doc.status().message().find(expect) != std::string::npos);
  }
  // getattr only as getattr(<class>, "member"): not on a module that runs code.
  const std::string via_getattr =
      "\x80\x02"s + "c__builtin__\ngetattr\n" + "ccollections\nOrderedDict\n" + U("x") + "\x86R.";
  REQUIRE(ParsePickle(via_getattr, "ok.pkl").ok());
  const std::string getattr_str =
      "\x80\x02"s + "c__builtin__\ngetattr\n" + U("os") + U("system") + "\x86R.";
  REQUIRE(!ParsePickle(getattr_str, "evil.pkl").ok());
  // getattr(<class>, "<member>") whose member is refused: the same refusal as a global.
  const std::string getattr_dunder = "\x80\x02"s + "c__builtin__\ngetattr\n" +
                                     "ccollections\nOrderedDict\n" + U("__init__") + "\x86R.";
  auto dunder = ParsePickle(getattr_dunder, "evil.pkl");
  REQUIRE(!dunder.ok());
  CHECK(dunder.status().code() == StatusCode::kDataLoss);
  CHECK(dunder.status().message().find("evil.pkl") != std::string::npos);
  CHECK(dunder.status().message().find("collections.OrderedDict.__init__ (a dunder attribute)") !=
        std::string::npos);
  CHECK(dunder.status().message().find("never runs code") != std::string::npos);
}

TEST_CASE("unpickler keeps other classes as inert records", "[unit]") {
  // argparse.Namespace via NEWOBJ + BUILD; an enum via REDUCE(cls, (2,)).
  const std::string p = "\x80\x02("s + "cargparse\nNamespace\n)\x81}" + U("seed") + "K\x07sb" +
                        "cdeepspeed.runtime.zero.config\nZeroStageEnum\nK\x02\x85R" + "l.";
  auto doc = ParsePickle(p, "t.pkl");
  REQUIRE(doc.ok());
  const PyValue& r = doc->root();
  REQUIRE(r.items.size() == 2);
  CHECK(r.items[0]->kind == PyValue::Kind::kObject);
  CHECK(r.items[0]->s == "argparse.Namespace");
  CHECK(r.items[0]->Get("seed")->AsInt() == 7);
  CHECK(r.items[1]->AsInt() == 2);
}

TEST_CASE("unpickler: a list holding itself renders in bounded time", "[unit]") {
  // L = []; L.append(L) x 40 (each element the list itself)
  std::string p = "\x80\x02]q\x00("s;
  for (int i = 0; i < 40; ++i) p += "h\x00"s;
  p += "e.";
  auto doc = ParsePickle(p, "cycle.pkl");
  REQUIRE(doc.ok());
  const auto j = ckpt::PyToJson(*doc, doc->root(), 16);
  CHECK(j.dump().size() > 0);
}

TEST_CASE("unpickler refuses truncated and malformed input", "[unit]") {
  for (const std::string& p : {"\x80\x02}q\x00(X\x05\x00\x00\x00ab"s, "\x80\x02."s, "\x80\x02K"s,
                              "\x80\x09N."s, "\x80\x02h\x05."s, "\x80\x02N\x82\x01."s, ""s}) {
    auto doc = ParsePickle(p, "bad.pkl");
    REQUIRE(!doc.ok());
    CHECK(doc.status().code() == StatusCode::kDataLoss);
    CHECK(doc.status().message().find("bad.pkl") != std::string::npos);
  }
}

TEST_CASE("unpickler quotes names from the file escaped, never raw", "[unit]") {
  // An unknown storage type and a refused global whose names hold invalid UTF-8 and a terminal
  // escape sequence: the message says what they were, escaped.
  const std::string storage = "\x80\x02"s + "ctorch._utils\n_rebuild_tensor_v2\n" + "((" +
                              U("storage") + "ctorch\nFloat\xff\x1b[31mStorage\n" + U("0") +
                              U("cpu") + "K\x04tQ" + "K\x00K\x04\x85" + "K\x01\x85" + "\x89" +
                              "ccollections\nOrderedDict\n)R" + "tR.";
  const std::string global = "\x80\x02"s + "cos\nsystem\n" + U("x") + "\x85R.";
  auto a = ParsePickle(storage, "evil.pkl");
  REQUIRE(!a.ok());
  CHECK(a.status().message().find("unknown storage type torch.Float\\xff\\x1b[31mStorage") !=
        std::string::npos);
  CHECK(a.status().message().find('\xff') == std::string::npos);
  CHECK(a.status().message().find('\x1b') == std::string::npos);
  // A view too large for its storage quotes the storage's key, a string of the pickle (a raw
  // \x01 in it reached the message until 2026-12-07; found by fuzz_torch_pickle's TerminalSafe).
  std::string view = TensorPickle(3, 1, 4);
  view.replace(view.find(U("0")), U("0").size(), U("\x01\x1b[31m"));
  auto v = ParsePickle(view, "evil.pkl");
  REQUIRE(!v.ok());
  CHECK(v.status().message().find("of storage '\\x01\\x1b[31m'") != std::string::npos);
  CHECK(ckpt::PrintableUtf8(v.status().message()));
  auto b = ParsePickle(global, "evil.pkl");
  REQUIRE(!b.ok());
  CHECK(b.status().message().find("os.system") != std::string::npos);
  CHECK(ckpt::Excerpt("a\nb\x01'\\", 40) == "a\\nb\\x01\\x27\\x5c");
  CHECK(ckpt::Excerpt(std::string(50, 'x'), 40) == std::string(40, 'x') + "... (50 bytes)");
}

TEST_CASE("fuzz seed corpus parses (the fuzzer's inputs reach the parser)", "[unit]") {
  const std::filesystem::path dir =
      std::filesystem::path(CKPT_SOURCE_DIR) / "tests/fuzz/corpus/torch_pickle";
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string data = ckpt::testing::Slurp(e.path().string());
    auto doc = ParsePickle(data, e.path().string());
    INFO(e.path().string() << ": " << doc.status().ToString());
    REQUIRE(doc.ok());
    CHECK(!doc->tensors().empty());
    ++n;
  }
  CHECK(n >= 5);
}
