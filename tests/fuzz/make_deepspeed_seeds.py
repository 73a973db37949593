#!/usr/bin/python3
"""Writes the seed corpus of fuzz/fuzz_deepspeed.cc into tests/fuzz/corpus/deepspeed/.

    /usr/bin/python3 tests/fuzz/make_deepspeed_seeds.py [OUT_DIR]

Each fixture the harness knows (its kSpecs, in the same order) is made by
tests/deepspeed/make_ds_checkpoint.py as a small one-rank checkpoint; each of its two files
becomes two seeds: a selector byte (fixture index << 2, bit 1 for the model file, and the re-CRC
bit 2 set in one, clear in the other: "_crc_kept") and then the file's bytes. The harness takes
each fixture's pristine files from these seeds.
"""
import os
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
MAKER = os.path.join(HERE, "..", "deepspeed", "make_ds_checkpoint.py")
SMALL = ["--world", "1", "--hidden", "8", "--vocab", "11"]
# (name, make_ds_checkpoint.py arguments, model file, optimizer file): fuzz_deepspeed.cc's kSpecs.
FIXTURES = [
    ("zero2_bf16", ["--zero", "2", "--dtype", "bf16"], "mp_rank_00_model_states.pt",
     "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("zero3_fp32", ["--zero", "3", "--dtype", "fp32"], "zero_pp_rank_0_mp_rank_00_model_states.pt",
     "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("zero1_bf16opt", ["--zero", "1", "--dtype", "bf16", "--optimizer", "bf16"],
     "mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("zero2_fp32_frozen", ["--zero", "2", "--dtype", "fp32", "--blocks", "1", "--frozen-blocks",
                           "1", "--block-width", "8"],
     "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    # The same with every record deflated (torch.save stores them; a file rewritten by a zip
    # tool may not): records read through libzip's inflate, streams kept open between reads.
    ("zero2_fp32_frozen_deflated", ["--zero", "2", "--dtype", "fp32", "--blocks", "1",
                                    "--frozen-blocks", "1", "--block-width", "8"],
     "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
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
        for index, (name, args, model, optim) in enumerate(FIXTURES):
            root = os.path.join(tmp, name)
            subprocess.run([sys.executable, MAKER, root] + args + SMALL, check=True,
                           stdout=subprocess.DEVNULL)
            tag = os.path.join(root, "global_step7")
            if name.endswith("_deflated"):
                for fname in (model, optim):
                    deflate(os.path.join(tag, fname))
            for is_model, fname in ((1, model), (0, optim)):
                with open(os.path.join(tag, fname), "rb") as f:
                    data = f.read()
                for recrc, suffix in ((2, ""), (0, "_crc_kept")):
                    selector = index << 2 | recrc | is_model
                    seed = os.path.join(out, "%s_%s%s.seed" % (
                        name, "model" if is_model else "optim", suffix))
                    with open(seed, "wb") as f:
                        f.write(bytes([selector]) + data)
                    print(seed, len(data) + 1)


if __name__ == "__main__":
    main()
