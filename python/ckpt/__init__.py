"""ckpt: atomic, checksummed, sharded training checkpoints (docs/python.md).

A thin layer over the C++ library (``ckpt._ckpt``): nothing here reads or writes the format
itself. ``ckpt.torch`` saves and resumes a torch.distributed run.

Low level, mirroring the C++ API:
  plan(params, world, zero_stage=None, owners=None)  -> {"partition", "params" with ranges}
  save_shard(root, manifest, datasets, collective)   -> collective atomic save of one rank's shard
  AsyncSaver().save(root, manifest, datasets, ...)   -> the same, persisted in the background
  Reader(path, tag="")                                -> read a committed checkpoint
  load_resharded(path, world, zero_stage, rank, tag="") -> one rank's state on another topology
  ls(root), inspect(path, tag=""), check(path, tag="", deep=False) -> dicts as the CLI's --json
  xxh3(array), Xxh3()                                 -> the digests the format and run logs use
  write_safetensors(path, [(name, array)]), read_safetensors(path)

Errors raise ckpt.CorruptionError (data loss: checksum mismatch, truncation) or ckpt.Error
(everything else), carrying the C++ Status text and ``.code`` / ``.exit_code``.
"""

import json as _json
import os as _os

import numpy as _np

from ._ckpt import (  # noqa: F401  (re-exported)
    CorruptionError,
    Error,
    Reader as _Reader,
    Xxh3,
    check,
    inspect,
    load_resharded,
    ls,
    plan,
    probe,
    read_safetensors as _read_safetensors,
    write_safetensors as _write_safetensors,
    xxh3,
)
from . import _ckpt


def _set_hdf5_probe():
    """HDF5 files this process reads are first walked by the `ckpt` executable beside the
    package (build/bin/ckpt next to build/python), in a process of its own: crafted HDF5
    metadata that crashes libhdf5 then crashes that process, and the file is refused, instead
    of ending this one (docs/reliability.md, "Hostile files"). Without the executable, no probe;
    CKPT_HDF5_PROBE names another."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    program = _os.environ.get("CKPT_HDF5_PROBE") or _os.path.join(here, "..", "..", "bin", "ckpt")
    if _os.access(program, _os.X_OK):
        _ckpt.set_hdf5_probe(_os.path.realpath(program))


_set_hdf5_probe()

__all__ = [
    "Error", "CorruptionError", "Reader", "Dataset", "plan", "save_shard", "AsyncSaver", "load_resharded", "ls", "inspect",
    "check", "probe", "xxh3", "Xxh3", "write_safetensors", "read_safetensors", "SingleCollective",
]

_NUMPY_DTYPES = {
    "fp32": _np.float32, "fp64": _np.float64, "fp16": _np.float16, "bf16": _np.uint16,
    "int64": _np.int64, "int32": _np.int32, "uint8": _np.uint8, "uint16": _np.uint16,
}


class Dataset:
    """One dataset of a rank's shard, for save_shard.

    Dataset.tensor(name, array, dtype="")  array: numpy array or CPU torch tensor, saved without a
                                           copy; dtype "bf16" reinterprets a uint16 array.
    Dataset.blob(name, data, blob_kind)    opaque bytes (an RNG state).
    Dataset.json(name, obj)                a JSON value (data position, scheduler state).
    """

    def __init__(self, name, kind, value, extra=""):
        self.name, self.kind, self.value, self.extra = name, kind, value, extra

    @classmethod
    def tensor(cls, name, array, dtype=""):
        return cls(name, "tensor", array, dtype)

    @classmethod
    def blob(cls, name, data, blob_kind):
        return cls(name, "blob", bytes(data), blob_kind)

    @classmethod
    def json(cls, name, obj):
        return cls(name, "json", _json.dumps(obj, sort_keys=True), "")

    def _tuple(self):
        return (self.name, self.kind, self.value, self.extra)


class SingleCollective:
    """A one-rank group (world size 1): what save_shard needs outside a distributed run."""

    def rank(self):
        return 0

    def world_size(self):
        return 1

    def barrier(self):
        pass

    def gather(self, payload):
        return [payload]

    def broadcast(self, payload):
        return payload


def save_shard(root, manifest, datasets, collective=None, *, compression="none", keep_last=0):
    """Collective save: every rank calls it with its own datasets and the same manifest.

    manifest: {"tag", "counters", "topology": {"dp_world_size", "zero_stage"}, "optimizer",
    "dtypes", "partition", "params" (with ranges, as plan() returns them), "client_state",
    "engine_config"}. collective: an object with rank(), world_size(), barrier(),
    gather(bytes) -> list[bytes] on rank 0, broadcast(bytes) -> bytes (ckpt.torch has one over
    torch.distributed); None for a single process. The tag appears atomically on success; on
    failure the previous checkpoint and ``latest`` are untouched and ckpt.Error is raised on
    every rank. The GIL is released while the files are written.
    """
    items = [d._tuple() if isinstance(d, Dataset) else tuple(d) for d in datasets]
    _ckpt.save_shard(root, manifest, items, collective or SingleCollective(),
                     compression, keep_last)


class AsyncSaver:
    """save_shard in the background (docs/async.md): save() copies the datasets into memory the
    saver owns and returns; a background thread writes, fsyncs and commits exactly as save_shard
    does. One per rank; saves persist one at a time in call order (save() first waits for the
    previous one). A background failure is raised, once, by the next wait() or save() (then
    prefixed "previous async save:", and that save starts nothing). done() tells without
    blocking whether no save is persisting.

    The collective is called from the background thread (with the GIL taken) while the caller
    goes on: give the saver a group of its own that nothing else uses meanwhile (ckpt.torch
    makes a separate gloo group). Call wait() before the interpreter exits.
    """

    def __init__(self):
        self._s = _ckpt.AsyncShardSaver()

    def save(self, root, manifest, datasets, collective=None, *, compression="none",
             keep_last=0):
        items = [d._tuple() if isinstance(d, Dataset) else tuple(d) for d in datasets]
        self._s.save(root, manifest, items, collective or SingleCollective(), compression,
                     keep_last)

    def wait(self):
        self._s.wait()

    def done(self):
        return self._s.done()


def _aligned_empty(shape, dtype):
    """An uninitialised array whose data starts on a 4 KiB boundary: a large dataset of a rank
    file starts on a 4 KiB boundary too, so it is read with O_DIRECT straight into the array
    instead of through a bounce buffer. From 2 MiB up it starts on a 2 MiB boundary, so the
    transparent huge pages numpy asks for large arrays cover it and the disk moves it in
    larger requests (ckpt/aligned_buffer.h, docs/performance.md)."""
    dtype = _np.dtype(dtype)
    nbytes = int(_np.prod(shape, dtype=_np.int64)) * dtype.itemsize
    align = (2 << 20) if nbytes >= (2 << 20) else 4096
    raw = _np.empty(nbytes + align, dtype=_np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip:skip + nbytes].view(dtype).reshape(shape)


class Reader:
    """A committed checkpoint (a root at ``tag``/latest, or a tag directory).

    Reads verify dataset checksums; CorruptionError on a mismatch. Thread-safe (one read at a
    time, without the GIL).
    """

    def __init__(self, path, tag="", verify_checksums=True):
        self._r = _Reader(path, tag or "", verify_checksums)
        self.manifest = self._r.manifest
        self.dir = self._r.dir
        self.tag = self._r.tag

    def param(self, name):
        for p in self.manifest["params"]:
            if p["name"] == name:
                return p
        raise Error(f"NotFound: parameter {name!r} is not in {self.dir}")

    def dataset_record(self, rank, name):
        for f in self.manifest["files"]:
            if f["rank"] == rank:
                for d in f["datasets"]:
                    if d["name"] == name:
                        return d
        return None

    def read_dataset(self, rank, name, out=None):
        """The whole dataset into ``out`` (a writable array of its byte size) or a new numpy
        array (bf16 as uint16 bit patterns)."""
        if out is None:
            rec = self.dataset_record(rank, name)
            if rec is None:
                raise Error(f"NotFound: rank {rank} of {self.dir} has no dataset {name!r}")
            out = _aligned_empty(rec["shape"], _NUMPY_DTYPES[rec["dtype"]])
        self._r.read_dataset_into(rank, name, out)
        return out

    def read_blob(self, rank, name):
        return self._r.read_blob(rank, name)

    def read_json(self, rank, name):
        return self._r.read_json(rank, name)

    def read_param_range(self, name, state="master", begin=0, end=None, out=None):
        """Elements [begin, end) of a parameter's state (master, exp_avg, exp_avg_sq) as fp32,
        gathered from the owning ranks, into ``out`` or a new array."""
        numel = self.param(name)["numel"]
        end = numel if end is None else end
        if out is None:
            out = _np.empty(end - begin, dtype=_np.float32)
        self._r.read_param_range_into(name, state, begin, end, out)
        return out

    def read_param(self, name, state="master"):
        """The whole parameter's state as an fp32 array of its shape."""
        p = self.param(name)
        if p["tied_to"]:
            return self.read_param(p["tied_to"], state)
        if p["frozen"]:
            return self.read_dataset(0, "frozen/" + name)
        return self.read_param_range(name, state).reshape(p["shape"])

    def verify_dataset(self, rank, name):
        self._r.verify_dataset(rank, name)


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: array} (or [(name, array)]) as safetensors with ckpt's integrity record,
    through a temporary name (nothing under ``path`` on failure)."""
    items = list(tensors.items()) if isinstance(tensors, dict) else list(tensors)
    _write_safetensors(path, items, dict(metadata or {}))


def read_safetensors(path, with_metadata=False):
    """{name: numpy array} (bf16 as uint16 bit patterns), verified against the file's integrity
    record when it has one (CorruptionError on a mismatch); with_metadata: (tensors, metadata)."""
    tensors, metadata = _read_safetensors(path)
    out = {}
    for name, (dtype, shape, data) in tensors.items():
        out[name] = _np.frombuffer(data, dtype=_NUMPY_DTYPES[dtype]).reshape(shape).copy()
    return (out, metadata) if with_metadata else out
