"""``python -m gguf_tools extract-mtp | attach-mtp``: split a model's nextn
(MTP) head into its own file, and put one back.

    python -m gguf_tools extract-mtp model.gguf mtp-model.gguf [--head-only]
    python -m gguf_tools attach-mtp trunk.gguf mtp-model.gguf model.gguf [--replace]

extract-mtp writes the layout llama.cpp's converter writes for MTP-only
output (conversion/qwen.py _QwenMtpMixin with mtp_only; qwen35-spec.md §2,
last paragraph), which is also what ``ds4py.load(trunk, draft_head=...)``
takes: every metadata key of SRC unchanged (so block_count still counts the
head block and nextn_predict_layers stays 1), SRC's ``blk.N.*`` tensors for
the head block N = block_count - nextn_predict_layers, and the shared
``token_embd`` / ``output_norm`` / ``output`` tensors SRC has (the converter
keeps embed_tokens / norm / lm_head; llama.cpp's graph_mtp reads the head
file's own). ``--head-only`` leaves those three out: the smallest file the
loader takes, which then runs on the trunk's own embedding, norm and LM head.
Tensors keep SRC's order, type, shape and bytes. A SRC without a head
(nextn_predict_layers absent or 0, or no blk.N tensor) is refused; so is one
with more than one nextn block (the loader runs one).

attach-mtp writes TRUNK's metadata and tensors plus HEAD's ``blk.N.*``
tensors (N = TRUNK's trunk depth). HEAD is first loaded as TRUNK's draft head
(``ds4py.load(TRUNK, draft_head=HEAD)``), so a head the loader refuses (a
full model, another architecture, depth, width or vocabulary, differing
rope/eps/scale/top-k, stray tensors) is refused here with the loader's
message. A TRUNK that already has a head is refused unless ``--replace``
(its blk.N.* tensors are then dropped). Metadata: TRUNK's keys in TRUNK's
order with their stored types, ``<arch>.block_count`` = N + 1,
``<arch>.nextn_predict_layers`` = 1 (appended as UINT32 when TRUNK has no
such key), and the per-block arrays TRUNK stores as arrays (PER_BLOCK_KEYS)
cut to N entries and given HEAD's entry N.

What the attached file computes: what TRUNK + draft_head=HEAD computes. The
loader runs a head file's own token_embd / output (else its token_embd, when
tied) / output_norm in place of blk.N.nextn.embed_tokens /
shared_head_head / shared_head_norm (csrc/model.c attach_checked). A full
model has only one token_embd / output / output_norm, TRUNK's, so each of
the head's that differs from what the trunk would give the head (type, shape
or bytes) is written as that blk.N.nextn.* tensor instead (unless HEAD's
blk.N already has one). When HEAD was extracted from a model with the same
shared tensors (the round trip), nothing is added.

Tensor order in the output: TRUNK's tensors (less its blk.N.* with
``--replace``), in TRUNK's order, then HEAD's blk.N.* in HEAD's order, then
any blk.N.nextn.* added as above. For a trunk written by the converter's
--no-mtp (or tests/nextn_files.py trunk_parts) that is the original model's
order. The alignment is TRUNK's (extract: SRC's). Both commands write
through ds4py.gguf_writer.GGUFWriter: a temporary file next to DST, renamed
into place only on success.
"""

from __future__ import annotations

import os
import warnings
from typing import TextIO

from ds4py import gguf
from ds4py.errors import DS4Error
from ds4py.gguf import ValueType
from ds4py.gguf_writer import GGUFWriter

__all__ = ["MtpError", "GLOBALS", "PER_BLOCK_KEYS", "extract_mtp", "attach_mtp",
           "cmd_extract_mtp", "cmd_attach_mtp"]

GLOBALS = ("token_embd.weight", "output_norm.weight", "output.weight")
# llama.cpp hparams read per layer when stored as arrays (llama-model.cpp
# get_key_or_arr for head_count / head_count_kv / feed_forward_length;
# qwen35*.cpp reads attention.recurrent_layers per block). Only these keys
# are treated as per-block: a length match alone (rope.dimension_sections
# has 4 entries, like a 4-layer trunk) says nothing.
PER_BLOCK_KEYS = ("attention.recurrent_layers", "attention.head_count",
                  "attention.head_count_kv", "feed_forward_length")


class MtpError(DS4Error, ValueError):
    pass


def _block(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    s = name.split(".", 2)[1]
    return int(s) if s.isdigit() else None


def _meta_items(f: gguf.GGUFFile):
    """(key, value, type, element type) in file order, with stored types."""
    types = f.metadata_types
    for k, v in f.metadata.items():
        ty = types[k]
        yield k, v, ty[0], (ty[1] if len(ty) > 1 else None)


def _depth(f: gguf.GGUFFile, what: str) -> tuple[str, int, int]:
    """(arch, block_count, nextn_predict_layers) of a model file."""
    arch = f.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise MtpError(f"{what} has no general.architecture; not a model file")
    bc = f.metadata.get(f"{arch}.block_count")
    if not isinstance(bc, int) or isinstance(bc, bool) or bc < 0:
        raise MtpError(f"{what} has no usable {arch}.block_count")
    nx = f.metadata.get(f"{arch}.nextn_predict_layers", 0)
    if not isinstance(nx, int) or isinstance(nx, bool) or not 0 <= nx <= bc:
        raise MtpError(f"{what}: {arch}.nextn_predict_layers is {nx!r}; "
                       f"expected 0..{arch}.block_count ({bc})")
    return arch, bc, nx


def _check_dst(dst: str, *srcs: str) -> None:
    if os.path.exists(dst):
        for s in srcs:
            if os.path.exists(s) and os.path.samefile(s, dst):
                raise MtpError(f"DST {dst} is an input file; write to another path")


def _write(dst: str, alignment: int, meta, tensors) -> None:
    """meta: (key, value, type, element type); tensors: (name, shape, type
    name, GGUFFile) whose raw bytes are copied."""
    with GGUFWriter(dst, alignment=alignment) as w:
        for k, v, ty, et in meta:
            w.add_metadata(k, v, ty, et)
        for name, shape, tname, _src, _sname in tensors:
            w.add_tensor_info(name, shape, tname)
        for name, _shape, _tname, src, sname in tensors:
            w.write_tensor_data(name, src.raw(sname))


def extract_mtp(src: str, dst: str, head_only: bool = False,
                out: TextIO | None = None) -> list[str]:
    """Write SRC's nextn head as a standalone head file; returns the tensor
    names written (module docstring)."""
    _check_dst(dst, src)
    with gguf.open(src) as f:
        arch, bc, nx = _depth(f, f"SRC {src}")
        if nx == 0:
            have = f"{arch}.nextn_predict_layers" in f.metadata
            raise MtpError(f"SRC {src} has no nextn (MTP) head "
                           f"({arch}.nextn_predict_layers is {'0' if have else 'absent'})")
        if nx != 1:
            raise MtpError(f"SRC {src} has {nx} nextn blocks; only one (as llama.cpp's "
                           "qwen35 graph_mtp asserts) is supported")
        n = bc - nx
        head = [t for t in f.tensors.values() if _block(t.name) == n]
        if not head:
            raise MtpError(f"SRC {src} has no blk.{n}.* tensors: no nextn (MTP) head")
        keep = [t for t in f.tensors.values()
                if _block(t.name) == n or (not head_only and t.name in GLOBALS)]
        _write(dst, f.alignment, list(_meta_items(f)),
               [(t.name, t.shape, t.type_name, f, t.name) for t in keep])
    if out is not None:
        out.write(f"wrote {dst}: head blk.{n} ({len(head)} tensors)"
                  + ("" if head_only else
                     f" + {len(keep) - len(head)} shared tensor(s)") + "\n")
    return [t.name for t in keep]


def _same(a: gguf.GGUFFile, an: str, b: gguf.GGUFFile, bn: str) -> bool:
    ta, tb = a.tensors[an], b.tensors[bn]
    return (ta.type_name == tb.type_name and tuple(ta.shape) == tuple(tb.shape)
            and bytes(a.raw(an)) == bytes(b.raw(bn)))


def attach_mtp(trunk: str, head: str, dst: str, replace: bool = False,
               out: TextIO | None = None) -> list[str]:
    """Write TRUNK + HEAD's blk.N as one model file; returns the tensor names
    written (module docstring)."""
    _check_dst(dst, trunk, head)
    with gguf.open(trunk) as t:
        arch, bc, nx = _depth(t, f"TRUNK {trunk}")
        n = bc - nx
        if nx and not replace:
            raise MtpError(f"TRUNK {trunk} already has a nextn (MTP) head (blk.{n}); "
                           "pass --replace to replace it")
    # the loader's own structural checks on HEAD against TRUNK (its message
    # names the tensor or key); a bundled head it would replace warns
    import ds4py
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ds4py.load(trunk, draft_head=head, n_threads=1).close()

    with gguf.open(trunk) as t, gguf.open(head) as h:
        harch, _hbc, _hnx = _depth(h, f"HEAD {head}")
        tensors = [(x.name, x.shape, x.type_name, t, x.name) for x in t.tensors.values()
                   if _block(x.name) != n]
        hblk = [x for x in h.tensors.values() if _block(x.name) == n]
        if not hblk:   # the loader takes an empty head only if none is required
            raise MtpError(f"HEAD {head} has no blk.{n}.* tensors")
        tensors += [(x.name, x.shape, x.type_name, h, x.name) for x in hblk]
        names = {x.name for x in hblk}

        # the head file's shared tensors, where they differ from what the
        # trunk would give the head (module docstring)
        def add(slot: str, hname: str | None, tname: str | None) -> None:
            full = f"blk.{n}.nextn.{slot}.weight"
            if hname is None or full in names:
                return
            if tname is not None and _same(h, hname, t, tname):
                return
            x = h.tensors[hname]
            tensors.append((full, x.shape, x.type_name, h, hname))
            names.add(full)

        def has(f, k):
            return k if k in f.tensors else None

        add("embed_tokens", has(h, "token_embd.weight"), has(t, "token_embd.weight"))
        add("shared_head_head", has(h, "output.weight") or has(h, "token_embd.weight"),
            has(t, "output.weight") or has(t, "token_embd.weight"))
        add("shared_head_norm", has(h, "output_norm.weight"), has(t, "output_norm.weight"))

        hmeta = h.metadata
        meta = []
        seen_nextn = False
        for k, v, ty, et in _meta_items(t):
            if k == f"{arch}.block_count":
                v = n + 1
            elif k == f"{arch}.nextn_predict_layers":
                v, seen_nextn = 1, True
            elif k.startswith(arch + ".") and k[len(arch) + 1:] in PER_BLOCK_KEYS \
                    and ty == ValueType.ARRAY:
                hv = hmeta.get(f"{harch}.{k[len(arch) + 1:]}")
                if not isinstance(hv, list) or len(hv) != n + 1:
                    raise MtpError(f"{k} is per block in TRUNK, but HEAD has no "
                                   f"{n + 1}-entry {k} to take block {n}'s entry from")
                if len(v) < n:
                    raise MtpError(f"{k} in TRUNK has {len(v)} entries; expected {n}")
                v = list(v[:n]) + [hv[n]]
            meta.append((k, v, ty, et))
        if not seen_nextn:
            meta.append((f"{arch}.nextn_predict_layers", 1, ValueType.UINT32, None))
        _write(dst, t.alignment, meta, tensors)
    if out is not None:
        out.write(f"wrote {dst}: {len(tensors)} tensors, head blk.{n} from {head}"
                  + (" (replaced TRUNK's)" if nx else "") + "\n")
    return [x[0] for x in tensors]


def cmd_extract_mtp(args, out: TextIO, err: TextIO) -> int:
    extract_mtp(args.src, args.dst, args.head_only, out)
    return 0


def cmd_attach_mtp(args, out: TextIO, err: TextIO) -> int:
    attach_mtp(args.trunk, args.head, args.dst, args.replace, out)
    return 0
