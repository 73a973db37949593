"""The binding: every dtype and shape round-trips through save_shard / Reader, without copies
where promised; ls/inspect/check equal the CLI's --json; errors are exceptions; the GIL is
released during I/O."""
import json
import os
import signal
import threading
import unittest

import numpy as np
import torch

import ckpt
import util

SHAPES = [(), (0,), (7,), (2, 3, 5)]
NUMPY = {"fp32": np.float32, "fp64": np.float64, "fp16": np.float16, "int64": np.int64,
         "int32": np.int32, "uint8": np.uint8, "uint16": np.uint16}
TORCH = {"fp32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
         "fp16": torch.float16, "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8}
PARAMS = [{"name": "w", "shape": [3, 4]}, {"name": "b", "shape": [5]}]


def save_one(root, datasets, step=1, params=PARAMS):
    planned = ckpt.plan(params, 1, zero_stage=0)
    n = planned["partition"]["shard_numel"][0]
    state = np.arange(n, dtype=np.float32)
    manifest = {"tag": f"global_step{step}", "counters": {"global_step": step},
                "topology": {"dp_world_size": 1, "zero_stage": 0},
                "optimizer": {"type": "adamw", "lr": 1e-3, "step": step},
                "partition": planned["partition"], "params": planned["params"]}
    base = [ckpt.Dataset.tensor(k, state * (i + 1))
            for i, k in enumerate(("master", "exp_avg", "exp_avg_sq"))]
    ckpt.save_shard(root, manifest, base + datasets)
    return state


class Binding(unittest.TestCase):
    def test_every_dtype_and_shape_round_trips(self):
        root = util.tempdir(self)
        rng = np.random.default_rng(1)
        want = {}
        datasets = []
        for dt, npt in NUMPY.items():
            for shape in SHAPES:
                a = (rng.standard_normal(shape) * 100).astype(npt)
                name = f"np/{dt}/{len(shape)}_{int(np.prod(shape))}"
                want[name] = a
                datasets.append(ckpt.Dataset.tensor(name, a))
        for dt, tt in TORCH.items():
            for shape in SHAPES:
                t = (torch.randn(shape, dtype=torch.float64) * 100).to(tt)
                name = f"torch/{dt}/{len(shape)}_{t.numel()}"
                want[name] = t
                datasets.append(ckpt.Dataset.tensor(name, t))
        bits = torch.randn(4, 3).to(torch.bfloat16)
        want["np/bf16_bits"] = bits.view(torch.int16).numpy().view(np.uint16)
        datasets.append(ckpt.Dataset.tensor("np/bf16_bits", want["np/bf16_bits"], "bf16"))
        save_one(root, datasets)
        r = ckpt.Reader(root)
        for name, a in want.items():
            rec = r.dataset_record(0, name)
            self.assertEqual(rec["shape"], list(a.shape), name)
            if isinstance(a, torch.Tensor):
                out = torch.empty_like(a)
                ptr = out.data_ptr()
                r.read_dataset(0, name, out)
                self.assertEqual(out.data_ptr(), ptr)  # filled in place
                self.assertTrue(torch.equal(out.view(-1).view(torch.uint8) if a.numel() else out,
                                            a.view(-1).view(torch.uint8) if a.numel() else a), name)
                self.assertEqual(rec["dtype"], [k for k, v in TORCH.items() if v == a.dtype][0])
            else:
                got = r.read_dataset(0, name)
                self.assertEqual(got.tobytes(), a.tobytes(), name)
                self.assertEqual(got.shape, a.shape, name)
                # Allocated on a 4 KiB boundary, as large datasets lie in the file: a large
                # one is then read with O_DIRECT straight into it (docs/performance.md).
                if got.size:
                    self.assertEqual(got.ctypes.data % 4096, 0, name)
                self.assertTrue(got.flags.writeable and got.flags.c_contiguous, name)
        self.assertEqual(r.dataset_record(0, "np/bf16_bits")["dtype"], "bf16")
        got = torch.from_numpy(r.read_dataset(0, "np/bf16_bits").view(np.int16)).view(torch.bfloat16)
        self.assertTrue(torch.equal(got, bits))

    def test_zero_copy_and_refusals(self):
        root = util.tempdir(self)
        save_one(root, [])
        r = ckpt.Reader(root)
        out = np.zeros(12, dtype=np.float32)
        self.assertIs(r.read_param_range("w", "master", 0, 12, out), out)
        np.testing.assert_array_equal(out, np.arange(12, dtype=np.float32))
        # A view into a larger buffer is written through: no hidden copy.
        big = np.full(20, -1, dtype=np.float32)
        r.read_param_range("w", "exp_avg", 2, 7, big[5:10])
        np.testing.assert_array_equal(big[5:10], 2 * np.arange(2, 7, dtype=np.float32))
        self.assertEqual(big[4], -1)
        with self.assertRaises(ckpt.Error):  # strided: would need a copy, refused
            r.read_param_range("w", "master", 0, 6, np.zeros(12, dtype=np.float32)[::2])
        with self.assertRaises(ckpt.Error):
            ckpt.save_shard(util.tempdir(self), {}, [("x", "tensor", torch.zeros(4, 4).t(), "")])
        with self.assertRaises(ckpt.Error):  # wrong size
            r.read_param_range("w", "master", 0, 12, np.zeros(11, dtype=np.float32))

    def test_dicts_match_cli_json(self):
        root = util.tempdir(self)
        save_one(root, [], step=1)
        save_one(root, [], step=2)
        for fn, args in ((ckpt.ls, [root]), (ckpt.inspect, [root])):
            got = fn(*args)
            want, _ = util.cli_json(fn.__name__, *args)
            self.assertEqual(got, want)
        got = ckpt.check(root, deep=True)
        want, rc = util.cli_json("check", root, "--deep")
        self.assertEqual(got, want)
        self.assertTrue(got["ok"])
        self.assertEqual([t["tag"] for t in ckpt.ls(root)["tags"]], ["global_step1", "global_step2"])

    def test_probe(self):
        d = util.tempdir(self)
        got = ckpt.probe(d, size=16 << 20, ranks=2, pairs=1, memory_dir="")
        # The keys and the saves of `ckpt probe --json` (the timings differ run to run).
        want, rc = util.cli_json("probe", d, "--size", "16MiB", "--ranks", "2", "--pairs", "1",
                                 "--memory-dir", "")
        self.assertEqual(rc, 0)
        self.assertEqual(set(got), set(want))
        for k in ("dir", "from", "bytes", "ranks", "pairs", "compress", "memory", "memory_note",
                  "compression_ratio"):
            self.assertEqual(got[k], want[k], k)
        self.assertEqual(got["disk"]["none_file_bytes"], want["disk"]["none_file_bytes"])
        self.assertIn(got["recommended"], ("none", "zstd:1+shuffle"))
        self.assertEqual(got["recommended"] != "none", got["disk"]["speedup"] > 1)
        self.assertEqual(os.listdir(d), [])
        with self.assertRaises(ckpt.Error) as e:
            ckpt.probe(os.path.join(d, "missing"))
        self.assertEqual(e.exception.code, "NotFound")
        with self.assertRaises(ckpt.Error):
            ckpt.probe(d, compression="none")

    def test_errors_are_exceptions(self):
        root = util.tempdir(self)
        with self.assertRaises(ckpt.Error) as e:
            ckpt.Reader(os.path.join(root, "missing"))
        self.assertNotIsInstance(e.exception, ckpt.CorruptionError)
        self.assertEqual(e.exception.code, "NotFound")
        self.assertIn("missing", str(e.exception))
        save_one(root, [ckpt.Dataset.tensor("payload", np.arange(1000, dtype=np.float32))])
        r = ckpt.Reader(root)
        path = os.path.join(r.dir, "rank_00000.h5")
        raw = r.read_dataset(0, "payload").tobytes()
        with open(path, "r+b") as f:  # flip one byte of the payload's data
            data = f.read()
            off = data.find(raw[400:432])
            self.assertGreater(off, 0)
            f.seek(off)
            f.write(bytes([data[off] ^ 0xFF]))
        with self.assertRaises(ckpt.CorruptionError) as e:
            ckpt.Reader(root).read_dataset(0, "payload")
        self.assertIn("rank_00000.h5", str(e.exception))
        self.assertEqual(e.exception.exit_code, 1)
        report = ckpt.check(root, deep=True)
        self.assertFalse(report["ok"])
        with open(os.path.join(r.dir, "manifest.json"), "w") as f:
            f.write("{ not json")
        with self.assertRaises(ckpt.CorruptionError):
            ckpt.Reader(root)
        with self.assertRaises(ckpt.Error):  # a collective that raises: an error, not a crash
            class Broken(ckpt.SingleCollective):
                def gather(self, payload):
                    raise RuntimeError("peer died")
            planned = ckpt.plan(PARAMS, 1, zero_stage=0)
            ckpt.save_shard(util.tempdir(self), {
                "tag": "t", "topology": {"dp_world_size": 1, "zero_stage": 0},
                "partition": planned["partition"], "params": planned["params"]},
                [ckpt.Dataset.tensor(k, np.zeros(32, np.float32))
                 for k in ("master", "exp_avg", "exp_avg_sq")], Broken())

    def test_hdf5_metadata_that_crashes_libhdf5_is_refused(self):
        """A rank file whose object header crashes libhdf5 (XOR 0x02 into byte 1188 of the
        issue's checkpoint), its manifest resealed as whoever hands it over can (size, XXH3, no
        metadata seal): the probe process (build/bin/ckpt) crashes instead of this one, and the
        file is refused. Until 2026-12-07 this ended the Python process with SIGSEGV."""
        root = util.tempdir(self)
        util.run([util.CLI, "synth", root, "--params", "50k", "--ranks", "2", "--zero", "2",
                  "--tags", "3"])
        tag = os.path.join(root, "global_step300")
        path = os.path.join(tag, "rank_00000.h5")
        with open(path, "rb") as f:
            data = bytearray(f.read())
        data[1188] ^= 0x02
        with open(path, "wb") as f:
            f.write(data)
        with open(os.path.join(tag, "manifest.json")) as f:
            m = json.load(f)
        rec = next(r for r in m["files"] if r["rank"] == 0)
        rec.update(bytes=len(data), xxh3=ckpt.xxh3(bytes(data)))
        rec.pop("metadata_xxh3", None)
        rec.pop("data_extents", None)
        m["manifest_xxh3"] = "0" * 16
        text = json.dumps(m, indent=1) + "\n"
        text = text.replace('"' + "0" * 16 + '"', '"' + ckpt.xxh3(text.encode()) + '"', 1)
        with open(os.path.join(tag, "manifest.json"), "w") as f:
            f.write(text)
        report = ckpt.check(root, deep=True)
        self.assertFalse(report["ok"])
        self.assertIn("libhdf5 crashed", json.dumps(report))
        with self.assertRaises(ckpt.CorruptionError) as e:
            ckpt.Reader(root).read_dataset(0, "master")
        self.assertIn("rank_00000.h5: libhdf5 crashed", str(e.exception))
        self.assertIn("global_step200", ckpt.Reader(root, "global_step200").dir)  # still reads
        # With SIGCHLD ignored the probe is reaped before anyone can ask how it ended: it is
        # still refused (the probe says on a pipe that it finished; this one never does).
        old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        try:
            with self.assertRaises(ckpt.CorruptionError) as e:
                ckpt.Reader(root).read_dataset(0, "master")
        finally:
            signal.signal(signal.SIGCHLD, old)
        self.assertIn("rank_00000.h5: libhdf5 ended before it finished", str(e.exception))

    def test_gil_released_during_io(self):
        root = util.tempdir(self)
        big = np.random.default_rng(0).standard_normal(16 << 20).astype(np.float32)  # 64 MiB
        save_one(root, [ckpt.Dataset.tensor("big", big)])
        r = ckpt.Reader(root)
        out = np.empty_like(big)
        ticks = 0
        done = threading.Event()

        def read():
            r.read_dataset(0, "big", out)
            done.set()
        t = threading.Thread(target=read)
        t.start()
        while not done.is_set():
            ticks += 1
        t.join()
        self.assertGreater(ticks, 1000)  # this thread kept running while the read went on
        np.testing.assert_array_equal(out, big)

    def test_load_resharded(self):
        # A 4-rank ZeRO-2 checkpoint loaded as 3 ranks with ZeRO-3: the shards, put back
        # together through the new ranges, are the source's parameters bit for bit.
        root = util.tempdir(self)
        util.run([util.CLI, "synth", root, "--ranks", "4", "--zero", "2", "--params", "20000"])
        r = ckpt.Reader(root)
        loaded = [ckpt.load_resharded(root, 3, 3, j) for j in range(3)]
        for j, part in enumerate(loaded):
            self.assertEqual(part["master"].dtype, np.float32)
            self.assertEqual(part["master"].size, part["partition"]["shard_numel"][j])
            acct = part["accounting"]
            self.assertGreater(acct["bytes_owned"], 0)
            self.assertLessEqual(acct["bytes_read"], 1.05 * acct["bytes_owned"] +
                                 2 * acct["slices"] * acct["piece_bytes"])
            self.assertEqual(bool(part["frozen"]), j == 0)
            self.assertIn("data_position", part["extras"])
            self.assertNotIn("rng/dropout", part["extras"])  # another world size: fresh RNG
        for p in loaded[0]["params"]:
            if p["frozen"] or p["tied_to"]:
                continue
            for state in ("master", "exp_avg", "exp_avg_sq"):
                got = np.empty(int(np.prod(p["shape"], dtype=np.int64)), dtype=np.float32)
                for rg in p["ranges"]:
                    src = loaded[rg["rank"]][state]
                    n = rg["end"] - rg["begin"]
                    got[rg["begin"]:rg["end"]] = src[rg["shard_offset"]:rg["shard_offset"] + n]
                want = r.read_param_range(p["name"], state).reshape(-1)
                self.assertEqual(got.tobytes(), want.tobytes(), (p["name"], state))
        with self.assertRaises(ckpt.Error):
            ckpt.load_resharded(root, 3, 3, 5)

    def test_xxh3_and_safetensors(self):
        a = np.arange(10, dtype=np.float32)
        h = ckpt.Xxh3()
        h.update(a[:4])
        h.update(torch.from_numpy(a[4:].copy()))
        self.assertEqual(h.hexdigest(), ckpt.xxh3(a))
        path = os.path.join(util.tempdir(self), "t.safetensors")
        ckpt.write_safetensors(path, {"a": a, "b": torch.ones(2, 2, dtype=torch.bfloat16)})
        got = ckpt.read_safetensors(path)
        np.testing.assert_array_equal(got["a"], a)
        self.assertEqual(got["b"].dtype, np.uint16)
        check, rc = util.cli_json("check", path, "--deep")
        self.assertTrue(check["ok"])


if __name__ == "__main__":
    unittest.main()
