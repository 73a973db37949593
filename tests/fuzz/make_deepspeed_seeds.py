#!/usr/bin/python3
"""Writes the seed corpus of fuzz/fuzz_deepspeed.cc into tests/fuzz/corpus/deepspeed/.

    /usr/bin/python3 tests/fuzz/make_deepspeed_seeds.py [OUT_DIR]

Each fixture the harness knows (its Specs(), in the same order, with the same files in the same
order) is made by tests/deepspeed/make_ds_checkpoint.py as a small checkpoint; each of its files
becomes a seed: two header bytes (the fixture's index; the file's index << 1 | 1, the re-CRC
bit) and then the file's bytes. The files of the one-rank fixtures also get a seed with the
re-CRC bit clear ("_crc_kept"). The harness takes each fixture's files from these seeds.
"""
import os
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
MAKER = os.path.join(HERE, "..", "deepspeed", "make_ds_checkpoint.py")
SMALL = ["--hidden", "8", "--vocab", "11"]
MODEL = "mp_rank_00_model_states.pt"
FROZEN = ["--zero", "2", "--dtype", "fp32", "--blocks", "1", "--frozen-blocks", "1",
          "--block-width", "8"]


def optim(rank, bf16):
    return "%szero_pp_rank_%d_mp_rank_00_optim_states.pt" % ("bf16_" if bf16 else "", rank)


def z3model(rank):
    return "zero_pp_rank_%d_mp_rank_00_model_states.pt" % rank


# (name, ranks, make_ds_checkpoint.py arguments, files): fuzz_deepspeed.cc's Specs().
FIXTURES = [
    ("zero2_bf16", 1, ["--zero", "2", "--dtype", "bf16"], [MODEL, optim(0, True)]),
    ("zero3_fp32", 1, ["--zero", "3", "--dtype", "fp32"], [z3model(0), optim(0, False)]),
    ("zero1_bf16opt", 1, ["--zero", "1", "--dtype", "bf16", "--optimizer", "bf16"],
     [MODEL, optim(0, True)]),
    ("zero2_fp32_frozen", 1, FROZEN, [MODEL, optim(0, False)]),
    # The same with every record deflated (torch.save stores them; a file rewritten by a zip
    # tool may not): records read through libzip's inflate, streams kept open between reads.
    ("zero2_fp32_frozen_deflated", 1, FROZEN, [MODEL, optim(0, False)]),
    ("zero2_bf16_world2", 2, ["--zero", "2", "--dtype", "bf16"],
     [MODEL, optim(0, True), optim(1, True)]),
    ("zero3_bf16_world2", 2, ["--zero", "3", "--dtype", "bf16"],
     [z3model(0), z3model(1), optim(0, True), optim(1, True)]),
]


def deflate(path):
    """Rewrites the zip archive at `path` with every record deflated."""
    with zipfile.ZipFile(path) as src:
        items = [(i.filename, src.read(i)) for i in src.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in items:
            out.writestr(name, data)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "corpus", "deepspeed")
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, ranks, args, files) in enumerate(FIXTURES):
            root = os.path.join(tmp, name)
            subprocess.run([sys.executable, MAKER, root, "--world", str(ranks)] + args + SMALL,
                           check=True, stdout=subprocess.DEVNULL)
            tag = os.path.join(root, "global_step7")
            if sorted(os.listdir(tag)) != sorted(files):
                raise SystemExit("%s: the generator wrote %s, the table lists %s" %
                                 (name, sorted(os.listdir(tag)), sorted(files)))
            if name.endswith("_deflated"):
                for fname in files:
                    deflate(os.path.join(tag, fname))
            for k, fname in enumerate(files):
                with open(os.path.join(tag, fname), "rb") as f:
                    data = f.read()
                stem = fname.rsplit("_states.pt", 1)[0]
                variants = [(1, "")] + ([(0, "_crc_kept")] if ranks == 1 else [])
                for recrc, suffix in variants:
                    seed = os.path.join(out, "%s_%s%s.seed" % (name, stem, suffix))
                    with open(seed, "wb") as f:
                        f.write(bytes([index, k << 1 | recrc]) + data)
                    print(seed, len(data) + 2)


if __name__ == "__main__":
    main()
