"""Prefix cache: reuse the longest evaluated prefix of a prompt across calls.

    cache = ds4py.PrefixCache(model, budget_bytes=2 << 30)
    g1 = ds4py.generate(model, messages, cache=cache)           # evaluates it all
    g2 = ds4py.generate(model, messages + more, cache=cache)    # only the new part
    g2.cached_tokens                                            # prompt tokens reused

What is kept
  Session snapshots (:class:`ds4py.Snapshot`: KV pages shared copy-on-write,
  the recurrent states and the last logits/hidden row), keyed by the exact
  token ids from position 0 that produced them. :func:`ds4py.generate` with
  ``cache=`` takes one at every multiple of 256 tokens its prompt crosses
  (``BLOCK``, the KV page size: a snapshot there shares only full pages and
  costs no page copy later), one at the end of the prompt, and one at the end
  of generation (prompt + the generated tokens it evaluated; the last sampled
  token is never evaluated, see ds4py.generate). A follow-up request then
  restores the longest cached prefix of its own ids and evaluates only the
  rest. A chat turn re-renders the whole conversation: its prompt extends the
  previous turn's end-of-generation key when the template re-renders the
  earlier reply to the same tokens (a ChatML template does); where it does
  not (Qwen3.5's template drops earlier ``<think>`` blocks, or a reply
  re-tokenizes differently) reuse stops at the last snapshot point before
  the first differing token: the previous prompt's end if that still
  matches, else the last 256-aligned point before the difference.

Lookup
  A radix tree over token ids: :meth:`PrefixCache.lookup` walks the query's
  ids and returns the deepest entry whose whole key is a prefix of them,
  compared id by id (no hashing, so no collision can give a wrong state).
  A request that drafts with the nextn head (``prefill(head=True)``) takes
  the deepest entry whose snapshot carries the head's history
  (``Snapshot.nextn_covered``: taken from a session with head priming), so
  a hit keeps its draft history and drafting continues at once; an entry
  without it is replaced when a priming session reaches the same key.
  A restored session continues bit for bit as a fresh evaluation of the same
  tokens (ds4py.session, Snapshots), and a hit on the whole prompt samples
  from the snapshot's last logits row without evaluating anything.

Isolation
  A snapshot never changes after it is taken: restoring it gives a session
  references to its KV pages, and the session copies a shared page before
  writing into it (copy-on-write, csrc/forward/kv.c), and copies the
  recurrent states. Two requests forked from one entry therefore cannot see
  each other, and the entry stays what it was (tests/test_prefix_cache.py).

Bytes charged (the budget)
  Exactly the memory the entries hold: each entry's own bytes
  (``Snapshot.nbytes``: the recurrent states, the last logits + hidden row and
  its page table) plus every KV page referenced by at least one entry,
  counted ONCE however many entries share it (a 512-token entry and the
  256-token entry it grew from share their first page). Page identities are
  tracked here in Python, following the core's copy-on-write rule: the cache
  does every write of the sessions it fills between a restore and its
  snapshots, so it knows which page each write lands in and when the write
  had to copy a page a snapshot shares. A page is ``2 * attention layers``
  allocations of ``n_kv_heads * 256 * head_dim * (2 bytes in fast precision,
  4 in exact) + 64`` bytes (the reference-count header; forward.h
  DS4_KV_PAGE_HEADER). A page also held by a live session is still charged
  (it stays alive while an entry holds it). The nextn head's KV (a session
  with head priming keeps it for positions [1, n)) is charged the same way:
  its pages (one K and one V allocation of the head's one attention layer,
  ``head_page_bytes``, counted from the head's first position) are tracked
  by identity like the trunk's and charged once. A snapshot taken through a
  DFlash drafter's TapSession carries the taps of its history (n x n_taps x
  n_embd floats: the drafter's context, so a hit keeps drafting); the
  snapshots of one history share one buffer, which is charged once, whole
  (its spare capacity is memory held too). When the total
  exceeds ``budget_bytes`` the least recently used entries (an entry is used
  when it is taken or restored from) are evicted, which closes their
  snapshots; a page is freed when no entry or session holds it any more.

Not thread-safe: use one cache from one thread at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ModelError
from .session import Session, Snapshot

__all__ = ["PrefixCache", "CacheStats", "BLOCK"]

BLOCK = 256  # == DS4_KV_PAGE (csrc/forward/forward.h): positions per KV page
_PAGE_HEADER = 64  # DS4_KV_PAGE_HEADER (csrc/forward/forward.h)


@dataclass
class CacheStats:
    """Counts since the cache was made (or :meth:`PrefixCache.clear`)."""

    lookups: int = 0          # prefills that consulted the cache
    hits: int = 0             # ... of them that reused at least one token
    reused_tokens: int = 0    # prompt tokens restored instead of evaluated
    evaluated_tokens: int = 0  # prompt tokens evaluated by those prefills
    inserted: int = 0         # snapshots taken into the cache
    evicted: int = 0          # entries evicted (budget)


class _Node:
    """A radix-tree node: ``edge`` is the run of ids from the parent to here;
    ``depth`` the length of the key that ends here."""

    __slots__ = ("edge", "children", "entry", "parent", "depth")

    def __init__(self, edge: tuple, parent, depth: int):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.entry: _Entry | None = None
        self.parent = parent
        self.depth = depth


class _Entry:
    __slots__ = ("node", "snap", "pages", "head_pages", "own", "taps")

    def __init__(self, node: _Node, snap: Snapshot, pages: tuple, head_pages: tuple, own: int,
                 taps=None):
        self.node = node
        self.snap = snap
        self.pages = pages  # the ids of KV pages [0, ceil(n / BLOCK)) it holds
        self.head_pages = head_pages  # the ids of the nextn head's KV pages
        self.own = own      # Snapshot.nbytes
        self.taps = taps    # the DFlash tap buffer its snapshot records (or None)


class _Track:
    """What the cache knows of a session it is filling: the id of each KV page
    it holds and whether its last (partial) page is shared with a snapshot,
    so that the next write into it makes a copy (kv.c ds4_kv_layer_reserve)."""

    __slots__ = ("session", "pages", "last_shared", "ids", "head_first", "head_pages",
                 "head_shared")

    def __init__(self, session: Session, pages: list, last_shared: bool, ids: list,
                 head_first: int = 0, head_pages: list | None = None,
                 head_shared: bool = False):
        self.session = session
        self.pages = pages
        self.last_shared = last_shared
        self.ids = ids  # the tokens the session holds, from position 0
        # the nextn head's KV: its first position, its pages' ids, and whether
        # its last (partial) page is shared with a snapshot
        self.head_first = head_first
        self.head_pages = head_pages if head_pages is not None else []
        self.head_shared = head_shared


class PrefixCache:
    """Snapshots of evaluated token prefixes of one model, LRU-evicted under
    ``budget_bytes`` (module doc: what is charged). Pass it to
    :func:`ds4py.generate` / :func:`ds4py.stream_generate` as ``cache=``."""

    def __init__(self, model, budget_bytes: int = 2 << 30):
        model._live()
        self.model = model
        self._root = _Node((), None, 0)
        self._lru: OrderedDict[_Entry, None] = OrderedDict()  # least recent first
        self._page_refs: dict[int, int] = {}  # page id -> entries holding it
        self._head_refs: dict[int, int] = {}  # nextn head page id -> entries holding it
        self._next_page = 0
        self._own_bytes = 0
        # id(DFlash tap buffer) -> [buffer, entries holding it]
        self._tap_refs: dict[int, list] = {}
        self._tap_bytes = 0
        cfg = model.config
        n_attn = cfg.layer_kinds[:cfg.n_layers].count("attn")
        elem = 4 if model.precision == "exact" else 2  # KV type: session.c ds4_session_new
        self.page_bytes = 2 * n_attn * (cfg.n_kv_heads * BLOCK * cfg.head_dim * elem
                                        + _PAGE_HEADER)
        # the head is one attention layer of the trunk's shape (forward/nextn.c)
        self.head_page_bytes = (2 * (cfg.n_kv_heads * BLOCK * cfg.head_dim * elem + _PAGE_HEADER)
                                if model.nextn_source is not None else 0)
        from .gpu_backend import on_gpu

        if on_gpu(model):
            # a GPU snapshot holds its own copy of its KV pages, charged in its
            # nbytes (ds4py.gpu_backend.GpuSnapshot), and no nextn head KV: no
            # shared pages to charge once
            self.page_bytes = self.head_page_bytes = 0
        self.stats = CacheStats()
        self._budget = 0
        self.budget_bytes = budget_bytes

    # -- accounting -------------------------------------------------------
    @property
    def budget_bytes(self) -> int:
        return self._budget

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"budget_bytes must be an int >= 0, got {value!r}")
        self._budget = int(value)
        self._evict()

    @property
    def kv_pages(self) -> int:
        """Distinct KV page indices (each: K and V of every attention layer)
        held by the entries."""
        return len(self._page_refs)

    @property
    def head_kv_pages(self) -> int:
        """Distinct pages of the nextn head's KV held by the entries."""
        return len(self._head_refs)

    @property
    def nbytes(self) -> int:
        """Bytes charged against the budget: the entries' own bytes plus their
        distinct KV pages, trunk and head, and distinct DFlash tap buffers
        (module doc)."""
        return (self._own_bytes + len(self._page_refs) * self.page_bytes
                + len(self._head_refs) * self.head_page_bytes + self._tap_bytes)

    def __len__(self) -> int:
        return len(self._lru)

    def entries(self) -> list[tuple[int, int]]:
        """(tokens, own bytes) of each entry, least recently used first."""
        return [(e.node.depth, e.own) for e in self._lru]

    def keys(self) -> list[tuple[int, ...]]:
        """The token ids of each entry, least recently used first."""
        return [self._key(e.node) for e in self._lru]

    @staticmethod
    def _key(node: _Node) -> tuple[int, ...]:
        parts = []
        while node is not None:
            parts.append(node.edge)
            node = node.parent
        return tuple(t for edge in reversed(parts) for t in edge)

    # -- lookup -----------------------------------------------------------
    def _find(self, q: tuple, head: bool = False) -> _Entry | None:
        """The entry with the longest key that is a prefix of q (with
        ``head``: among those whose snapshot carries the head's history)."""
        node, d, best, n = self._root, 0, None, len(q)
        while d < n:
            child = node.children.get(q[d])
            if child is None:
                break
            e = child.edge
            if q[d:d + len(e)] != e:  # a short q slice never equals a longer edge
                break
            d += len(e)
            node = child
            if node.entry is not None and (not head or node.entry.snap.nextn_covered):
                best = node.entry
        return best

    def lookup(self, ids: Sequence[int]) -> tuple[int, Snapshot | None]:
        """``(n, snapshot)``: the longest cached prefix ``ids[:n]`` and its
        snapshot (restore it with ``Session.restore``), or ``(0, None)``.
        Marks the entry used. The snapshot belongs to the cache: do not
        close it; it is closed when evicted, so restore it right away."""
        e = self._find(_as_key(ids))
        if e is None:
            return 0, None
        self._lru.move_to_end(e)
        return e.node.depth, e.snap

    def __contains__(self, ids) -> bool:
        q = _as_key(ids)
        e = self._find(q)
        return e is not None and e.node.depth == len(q)

    # -- insertion / removal ------------------------------------------------
    def _node_for(self, key: tuple) -> _Node:
        """The node whose key is ``key``, made (splitting an edge) if needed."""
        node, d, n = self._root, 0, len(key)
        while d < n:
            child = node.children.get(key[d])
            if child is None:
                leaf = _Node(key[d:], node, n)
                node.children[key[d]] = leaf
                return leaf
            e = child.edge
            m = 0
            lim = min(len(e), n - d)
            while m < lim and e[m] == key[d + m]:
                m += 1
            if m == len(e):
                d += m
                node = child
                continue
            # split child's edge after m ids (m >= 1: the first id matched)
            mid = _Node(e[:m], node, d + m)
            node.children[key[d]] = mid
            child.edge = e[m:]
            child.parent = mid
            mid.children[child.edge[0]] = child
            if d + m == n:
                return mid
            leaf = _Node(key[d + m:], mid, n)
            mid.children[key[d + m]] = leaf
            return leaf
        return node

    def _prune(self, node: _Node) -> None:
        """Drop nodes left without an entry or children; merge a node with a
        lone child into it."""
        while node is not self._root and node.entry is None:
            parent = node.parent
            if not node.children:
                del parent.children[node.edge[0]]
                node = parent
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                child.edge = node.edge + child.edge
                child.parent = parent
                parent.children[child.edge[0]] = child
            break

    def _insert(self, track: _Track) -> None:
        """Snapshot the session under ``track.ids`` (unless that key is
        cached: then mark it used), then evict down to the budget."""
        if self._budget == 0:
            return  # it would be evicted at once
        key = tuple(track.ids)
        s = track.session
        if s.n_past != len(key):
            raise ModelError(f"prefix cache: the session is at {s.n_past}, expected "
                             f"{len(key)} (was it used during the request?)")
        node = self._node_for(key)
        if node.entry is not None:
            old = node.entry
            if old.snap.nextn_covered or not s.nextn_covered:
                self._lru.move_to_end(old)
                return
            # this session carries the head's history and the entry does not:
            # the new snapshot replaces it (a drafting request can use it)
            self._remove(old)
            node = self._node_for(key)
        try:
            snap = s.snapshot()
        except BaseException:
            self._prune(node)
            raise
        pages = tuple(track.pages)
        assert len(pages) == -(-len(key) // BLOCK)
        head_pages = self._head_track(track)
        from .dflash import snapshot_tap_buffer  # here: dflash imports the spec package

        e = _Entry(node, snap, pages, head_pages, snap.nbytes, snapshot_tap_buffer(snap))
        node.entry = e
        self._lru[e] = None
        self._own_bytes += e.own
        if e.taps is not None:
            ref = self._tap_refs.setdefault(id(e.taps), [e.taps, 0])
            if ref[1] == 0:
                self._tap_bytes += e.taps.nbytes
            ref[1] += 1
        for p in pages:
            self._page_refs[p] = self._page_refs.get(p, 0) + 1
        for p in head_pages:
            self._head_refs[p] = self._head_refs.get(p, 0) + 1
        if len(key) % BLOCK:
            track.last_shared = True  # the session's next write copies that page
        if head_pages and (len(key) - track.head_first) % BLOCK:
            track.head_shared = True
        self.stats.inserted += 1
        self._evict()

    def _remove(self, e: _Entry) -> None:
        del self._lru[e]
        self._own_bytes -= e.own
        if e.taps is not None:
            ref = self._tap_refs[id(e.taps)]
            ref[1] -= 1
            if ref[1] == 0:
                del self._tap_refs[id(e.taps)]
                self._tap_bytes -= e.taps.nbytes
        for refs, pages in ((self._page_refs, e.pages), (self._head_refs, e.head_pages)):
            for p in pages:
                c = refs[p] - 1
                if c:
                    refs[p] = c
                else:
                    del refs[p]
        e.snap.close()
        e.node.entry = None
        self._prune(e.node)

    def _evict(self) -> None:
        while self._lru and self.nbytes > self._budget:
            e = next(iter(self._lru))
            self._remove(e)
            self.stats.evicted += 1

    def clear(self) -> None:
        """Evict everything (closing every snapshot) and zero the stats."""
        while self._lru:
            self._remove(next(iter(self._lru)))
        self.stats = CacheStats()

    close = clear

    # -- filling a session (ds4py.generate) ---------------------------------
    def _write(self, track: _Track, n_new: int) -> None:
        """Account for the session writing positions [len(ids), len(ids) + n_new)."""
        start, pages = len(track.ids), track.pages
        if start % BLOCK and track.last_shared:
            pages[start // BLOCK] = self._new_page()  # copy-on-write of the partial page
        end_pages = -(-(start + n_new) // BLOCK)
        while len(pages) < end_pages:
            pages.append(self._new_page())
        track.last_shared = False
        # the head's writes start at the same position (its row p is the
        # trunk's position p); its pages are counted from head_first
        hi = start - track.head_first
        if track.head_shared and hi % BLOCK and hi // BLOCK < len(track.head_pages):
            track.head_pages[hi // BLOCK] = self._new_page()
        track.head_shared = False

    def _head_track(self, track: _Track) -> tuple:
        """The ids of the head pages the session holds now (after a
        snapshot): pages already known keep their ids (the session has not
        written into them since, or _write renamed them), new ones get new
        ids. A head that moved its first position is all new."""
        if not self.head_page_bytes:
            return ()
        first, nxt = self.model.nextn_range(track.session)
        n = -(-(nxt - first) // BLOCK) if nxt > first else 0
        if first != track.head_first:
            track.head_first, track.head_pages = first, []
        hp = track.head_pages
        del hp[n:]
        while len(hp) < n:
            hp.append(self._new_page())
        return tuple(hp)

    def _new_page(self) -> int:
        self._next_page += 1
        return self._next_page

    def prefill(self, session: Session, ids: Sequence[int], *, reuse: bool = True,
                all_logits: bool = False, head: bool = False, prepare=None):
        """Put ``session`` at ``ids`` (the whole sequence from position 0):
        restore the longest cached prefix (or empty the session), evaluate
        the rest in pieces that end at each multiple of ``BLOCK`` and at the
        end, snapshotting there. ``reuse=False`` evaluates every token (the
        snapshots are still taken). ``head``: the request drafts with the
        nextn head: restore only a snapshot that carries the head's history
        (module doc, Lookup); without it a session with head priming on has
        it turned off, so that any entry can be restored. ``prepare()`` is
        called once the session is at the restored prefix (or empty), before
        the rest is evaluated (admission: ds4py.spec.runner). Returns
        ``(n_reused, logits, rows, track)``:
        ``logits`` the last row (a view, as Session.eval's), ``rows`` every
        evaluated row (a copy; with ``all_logits``, else None), ``track`` for
        :meth:`_extend`."""
        if session._model_ptr != self.model._live():
            raise ValueError("the prefix cache belongs to another model")
        q = list(ids)
        if not q:
            raise ValueError("the prompt is empty")
        if not head and session.nextn_prime:
            session.nextn_prime = False
        e = self._find(tuple(q), head) if reuse else None
        self.stats.lookups += 1
        if e is not None:
            self._lru.move_to_end(e)
            session.restore(e.snap)
            n0 = e.node.depth
            track = _Track(session, list(e.pages), n0 % BLOCK != 0, q[:n0])
            if e.head_pages:
                first = self.model.nextn_range(session)[0]
                track.head_first, track.head_pages = first, list(e.head_pages)
                track.head_shared = (n0 - first) % BLOCK != 0
            self.stats.hits += 1
        else:
            n0 = 0
            if session.n_past != 0:
                self._empty(session)
            track = _Track(session, [], False, [])
        if prepare is not None:
            prepare()
        self.stats.reused_tokens += n0
        self.stats.evaluated_tokens += len(q) - n0
        logits = session.last_logits() if n0 else None
        rows = [] if all_logits else None
        pos, n = n0, len(q)
        while pos < n:
            end = min((pos // BLOCK + 1) * BLOCK, n)
            self._write(track, end - pos)
            out = session.eval(q[pos:end], all_logits=all_logits)
            track.ids.extend(q[pos:end])
            if all_logits:
                rows.append(np.array(out))
                logits = out[-1]
            else:
                logits = out
            pos = end
            self._insert(track)
        if all_logits:
            rows = np.concatenate(rows) if rows else None
        return n0, logits, rows, track

    def _empty(self, session: Session) -> None:
        """Put a session back at position 0: restore the state of a fresh one."""
        with self.model.new_session() as fresh:
            snap = fresh.snapshot()
        try:
            session.restore(snap)
        finally:
            snap.close()

    def _extend(self, track: _Track, tokens: Sequence[int]) -> None:
        """After generation: the session evaluated ``tokens`` after the
        prompt; snapshot it there."""
        if not tokens:
            return
        s = track.session
        if s.closed or s.n_past != len(track.ids) + len(tokens):
            return  # the session was used otherwise in between: nothing known
        self._write(track, len(tokens))
        track.ids.extend(int(t) for t in tokens)
        self._insert(track)

    def __repr__(self) -> str:
        return (f"<ds4py.PrefixCache {len(self)} entries, {self.nbytes} of "
                f"{self._budget} bytes>")


def _as_key(ids) -> tuple:
    if isinstance(ids, np.ndarray):
        return tuple(int(t) for t in ids.ravel())
    return tuple(int(t) for t in ids)

