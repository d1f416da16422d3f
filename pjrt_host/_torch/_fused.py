"""Fused eager: ops recorded into segments, each segment run as one program.

With ``pjrt_host.config(eager="fused")`` (or ``PJRT_HOST_EAGER=fused``) an op
that the engine would run as its own compiled program (a functional op with
one tensor result) is recorded instead: its result is a tensor whose
storage holds a :class:`~._tensor.Pending` value, and the op joins its
thread's open segment.  torch's meta kernel has already given the result's
shape and dtype and raised torch's errors at the call, as op by op.

A segment runs -- as one ``jax.jit`` of every recorded op, returning only the
results some tensor still holds -- when anything reads a pending array:
``.item()``, ``.cpu()``, printing, an op that is not recorded (copies,
collectives, data-dependent ops), or ``torch.jax.synchronize()``; when it
reaches :data:`LIMIT` ops; and where its last ops repeat the block before
them (:func:`_repeats`).  A segment that repeats (the same ops on the same
signatures: a layer, a loop body) reuses its program, so a training step's
forward compiles a few programs where op by op compiles one per op.
Intermediates nobody holds are never written out, and inputs only the
segment holds are donated to it (:func:`_only_here`).

Each thread records into its own segment (autograd's backward thread
included); reading a value another thread recorded runs that thread's
segment, under the segment's lock.
"""

from __future__ import annotations

import logging
import sys
import threading
import warnings
import weakref
from concurrent.futures import Future
from typing import Any

import jax
import numpy as _np

from .. import _env, _program_cache
from .._jax_settings import x64_scope
from .._lowerings._dtypes import jax_dtype
from . import _config, _padding
from ._devices import jax_device
from ._signatures import LANED, Traceable, difference, matches
from ._sync import note_result, open_segments
from ._tensor import DONATE, Pending, result_tensor

__all__ = ["LIMIT", "Lane", "Segment", "record", "replay", "resolve", "stats", "writing_back"]

#: A segment runs once it holds this many ops.
LIMIT = 256
#: A segment that leaves the script it replays where the ops before have
#: made this many results or more runs them as a piece of their own
#: (:attr:`Segment.diverged`): a program that large (an optimizer's
#: ``_foreach`` ops over every parameter) is worth compiling once, where a
#: few ops (a norm before a model's head) cost a program more per step.
SPLIT_RESULTS = 64

_local = threading.local()
_validated: set = set()  # traceable op functions known to trace with pending (abstract) inputs
_refused: set = set()  # those that do not (they need concrete values), or trace to other shapes than planned
_counts = {"segments": 0, "ops": 0, "programs": 0, "op_by_op": 0, "replayed": 0, "lane": 0, "lane_padded": 0}
_recompiles = logging.getLogger("pjrt_host.recompiles")
_SCALARS = (int, float, bool, complex)
#: ids of arrays that take a slot of their own at each use, as a Python
#: scalar does: a factory's run-time flag (``_factories._device_flag``) is
#: one cached array per value, so two flags that happen to hold the same
#: value sharing one slot would wire the segment by their values (a
#: generate() step whose two stopping flags differ only at its last token
#: compiled a program of its own for it)
unshared: set[int] = set()


class Segment:
    """The ops one thread has recorded and not yet run."""

    __slots__ = ("ops", "externals", "ext_ids", "results", "shared", "lock", "done", "device", "error", "after",
                 "expect", "script", "ended", "slots", "cuts", "prefix", "split", "diverged", "left",
                 "candidates", "may_end", "__weakref__")

    def __init__(self, device: int, after: Script | None = None) -> None:
        # (the op's Traceable, argument refs, one result): with the
        # externals' signatures, the program's key
        self.ops: list[tuple[Traceable, tuple[int, ...], bool]] = []
        self.externals: list[Any] = []  # arrays and run-time scalars the ops read
        self.ext_ids: dict[int, int] = {}
        self.results: list[tuple[Any, Pending]] = []  # (weakref to the Storage, its Pending)
        #: None, or per result index the other storages given it (:meth:`share`)
        self.shared: dict[int, list[Any]] | None = None
        self.lock = threading.RLock()
        self.done = False
        self.device = device
        self.error: BaseException | None = None  # why the segment's program failed, for later readers
        # Replay: the script of the thread's segment before this one, and
        # the script that followed it last time, which this segment
        # replays while its ops match (then another that followed it, whose
        # ops so far are the same; None once none is)
        self.after = after
        self.expect = after.following[0] if after is not None and after.following else None
        self.script: Script | None = None  # what it ran, once run
        self.ended = False  # it ended itself (a block repeated, or LIMIT), not at a read
        self.slots: list[int] = []  # per op, the index of its first result
        #: where it runs as pieces (:meth:`_run_pieces`): the ops that start
        #: each block after the first piece, found where a block repeated
        self.cuts: tuple[int, ...] = ()
        #: whether the first piece is what came before the block (after the
        #: one before where the segment left its script, if ``split``)
        self.prefix = 0
        #: whether the first piece is the ops before where the segment left
        #: the script it replayed (an ordinary piece: it donates, and gives
        #: the results held or read later)
        self.split = 0
        #: where the segment left the script it replayed (0: it did not): the
        #: ops before ran as a script already, with a program of their own
        #: (:meth:`flush` runs them as a piece of their own)
        self.diverged = 0
        self.left: Script | None = None  # the script it left there
        #: the scripts it may replay besides its expected one: those that
        #: followed the segment before, or (a segment that expected none)
        #: those that began with its first op (:data:`_starts`)
        self.candidates: list[Script] | None = None  # (None: the segment before's ``following``)
        #: the longer scripts a segment that replayed a whole script which
        #: ended itself may go on with (:func:`_may_go_on`)
        self.may_end: list[Script] | None = None
        open_segments.add(self)

    @x64_scope  # torch.jax.synchronize() and other readers may come from outside the dispatcher
    def flush(self) -> None:
        """Run the recorded ops (once; later calls return at once)."""
        with self.lock:
            if self.done:
                if self.error is not None:
                    raise RuntimeError(
                        f"pjrt_host: this tensor was to be computed by a fused eager segment of {len(self.ops)} ops "
                        f"that failed earlier ({type(self.error).__name__}: {str(self.error).splitlines()[0][:300]}); "
                        "its results do not exist. Recompute them (PJRT_HOST_EAGER=sync finds the op that "
                        "fails).") from self.error
                return
            self.done = True
            open_segments.discard(self)
            if getattr(_local, "segment", None) is self:
                _local.segment = None
            live = tuple(i for i, (ref, p) in enumerate(self.results) if (s := ref()) is not None and s._array is p)
            if self.shared:
                held = {i for i, refs in self.shared.items()
                        if any((s := r()) is not None and s._array is self.results[i][1] for r in refs)}
                live = tuple(sorted(held.union(live)))
            ext, self.externals = self.externals, []
            inputs = tuple([_signature(v) for v in ext])
            live = _with_dead_ends(self, live, inputs)
            if self.diverged or self.cuts or (self.expect is not None and self.expect.inputs != inputs):
                self._choose_pieces(ext, inputs)
            if self.cuts:
                try:
                    self._run_pieces(ext, live)
                except BaseException as err:
                    self.error = err
                    raise
                return
            script, replayed = self._noted(ext, inputs)
            if not live:
                # nothing to compute (no op made a result), but the next
                # segment replays after this one all the same
                return
            donated = _only_here(ext) if DONATE else ()
            try:
                self._run(script, replayed, ext, live, donated)  # takes ext's arrays: the list is emptied there
            except BaseException as err:
                self.error = err
                raise

    def share(self, pending: Pending, storage: Any) -> bool:
        """Give ``storage`` this segment's result ``pending`` too, still
        pending: an in-place op written back as its functional op's result
        (``_foreach_add_`` as ``_foreach_add``, an optimizer's whole step)
        stays in the segment instead of running it for each write.  False
        once the segment has run (the caller writes the array)."""
        with self.lock:
            if self.done:
                return False
            storage.commit(pending)
            if self.shared is None:
                self.shared = {}
            self.shared.setdefault(pending.index, []).append(weakref.ref(storage))
            return True

    def _noted(self, ext: list, inputs: tuple | None = None) -> tuple[Script, bool]:
        """The script of the recorded ops reading ``ext`` (``inputs``: their
        signatures), noted as what follows the segment before, and whether
        it is the one this segment replayed (every op matched: no key to
        build)."""
        if inputs is None:
            inputs = tuple([_signature(v) for v in ext])
        script = self.expect
        replayed = script is not None and script.n == len(self.ops) and script.inputs == inputs
        if not replayed:
            ops = tuple(self.ops)
            script = _scripts.get((ops, inputs))
            if script is None:
                if len(_scripts) > 2048:  # segments that never repeat: bound the memory
                    _forget()
                script = _scripts[(ops, inputs)] = Script(ops, inputs)
                if ops:
                    starting = _starts.setdefault(ops[0], [])
                    starting.insert(0, script)
                    del starting[FOLLOWING * 2:]
        self.script = script
        script.cut = script.cut or self.ended
        if self.after is not None:
            self.after.followed_by(script)  # what a segment after the one before expects next time
        return script, replayed

    def _choose_pieces(self, ext: list, inputs: tuple) -> None:
        """Where a segment that found a block or left the script it replayed
        runs as pieces: as the same ops on the same inputs ran before (a
        program per piece exists: the same pieces again, or no pieces where
        they ran whole), else where the block repeated and where the
        segment left its script.  The ops before that ran as a script
        already: as a piece of their own, their program is the one the next
        segment that leaves the script there reuses, so that only what
        changed compiles (a new bucket's training step compiled the
        optimizer's last ops of the step before with its first ops; a
        decoding step, its layer's ops before the cache's join)."""
        whole = (tuple(self.ops), inputs)
        known = _pieces.get(whole)
        if known is not None:
            self.cuts, self.prefix, self.split = known
            return
        left = self.left if self.diverged else self.expect
        if left is not None:
            # an input of another shape than the script's (an index check's
            # of a new length) leaves it at the first op that reads it, where
            # the ops may still be the script's
            e = next((i for i, (a, b) in enumerate(zip(inputs, left.inputs)) if a != b),
                     min(len(inputs), len(left.inputs)))
            k = next((k for k, (_, refs, _) in enumerate(self.ops) if any(r >= e for r in refs)), len(self.ops))
            k = min(k, self.diverged or k)
            self.diverged = k if 0 < k < len(self.ops) and self.slots[k] >= SPLIT_RESULTS else 0
        n = self.diverged
        if n and n < len(self.ops) and (not self.cuts or (self.prefix and n < self.cuts[0])):
            found = _scripts.get(whole)
            if found is not None and found.variants and not self.cuts:
                return  # it ran whole before: its program
            self.cuts = (n, *self.cuts)
            self.split = 1
        if self.cuts:
            if len(_pieces) > 2048:
                _pieces.clear()
            _pieces[whole] = (self.cuts, self.prefix, self.split)

    def _run_pieces(self, ext: list, live: tuple[int, ...]) -> None:
        """Run the segment as the pieces its cuts make: what came before a
        repeated block, the block's first occurrence, its second.  Each
        piece is a segment of its own, its inputs numbered as if it had
        been recorded alone, so the two occurrences of a block are one
        script and one program, and the same as the program of each later
        occurrence that ends a segment by itself: a model's layers compile
        one program whatever their number, not the first two layers and
        what comes before them together.  The scripts follow each other
        as separate segments' do, so the next occurrence replays them."""
        n = len(self.ops)
        bounds = [0, *self.cuts, n]
        starts = [*self.slots, len(self.results)]
        keep = set(live)
        # which results later pieces read: they come out of their piece even
        # when no tensor holds them
        read_later: dict[int, int] = {}  # result index -> the last piece that reads it
        for k in range(1, len(bounds) - 1):
            first = starts[bounds[k]]
            for _, refs, _ in self.ops[bounds[k]:bounds[k + 1]]:
                for r in refs:
                    if r < 0 and ~r < first:
                        read_later[~r] = k
        donated_here = set(_only_here(ext)) if DONATE else set()
        used_by: dict[int, int] = {}  # external index -> how many pieces read it
        pieces = []
        for k in range(len(bounds) - 1):
            a, b = bounds[k], bounds[k + 1]
            sa, sb = starts[a], starts[b]
            keys: list[tuple[str, int]] = []
            index: dict[tuple[str, int], int] = {}
            ops = []
            for op, refs, single in self.ops[a:b]:
                local = []
                for r in refs:
                    if r < 0 and ~r >= sa:
                        local.append(~(~r - sa))
                        continue
                    key = ("e", r) if r >= 0 else ("v", ~r)
                    i = index.get(key)
                    if i is None:
                        i = index[key] = len(keys)
                        keys.append(key)
                    local.append(i)
                ops.append((op, tuple(local), single))
            for kind, r in keys:
                if kind == "e":
                    used_by[r] = used_by.get(r, 0) + 1
            if self.split <= k < self.split + self.prefix:
                # what came before the block: a replay runs it as soon as it
                # ends, while the values its ops made are still held (an
                # autograd node's), so it comes out whole and donates
                # nothing; a program made for more results serves a run that
                # holds fewer, and the replay compiles no other
                out = tuple(range(sb - sa))
            else:
                out = tuple(i - sa for i in range(sa, sb) if i in keep or i in read_later)
            pieces.append((a, b, sa, sb, ops, keys, out))
        # the block's two occurrences: one program for the results either holds
        # (the first one's output read by the second, and not the second's)
        if len(pieces) >= 2 and pieces[-1][4] == pieces[-2][4]:
            both = tuple(sorted(set(pieces[-1][6]) | set(pieces[-2][6])))
            pieces[-2:] = [piece[:6] + (both,) for piece in pieces[-2:]]
        made: dict[int, Any] = {}
        after = self.after
        script = None
        for k, (a, b, sa, sb, ops, keys, out) in enumerate(pieces):
            piece = Segment(self.device, after)
            open_segments.discard(piece)
            piece.expect = None  # (a script with as many ops is not this piece's)
            piece.done = True
            # each piece ends where the next begins; the last, where the
            # segment ended (a replay that ended it at a read the segment
            # ran at held fewer results, and compiled a program for more)
            piece.ended = k < len(pieces) - 1 or self.ended
            piece.ops = ops
            piece.results = self.results[sa:sb]
            if self.shared:
                piece.shared = {i - sa: refs for i, refs in self.shared.items() if sa <= i < sb}
            values = [ext[r] if kind == "e" else made[r] for kind, r in keys]
            donated = () if self.split <= k < self.split + self.prefix else tuple(
                i for i, (kind, r) in enumerate(keys) if kind == "e" and r in donated_here and used_by[r] == 1)
            script, replayed = piece._noted(values)
            if out:
                held, outs = piece._run(script, replayed, values, out, donated)
                for i, arr in zip(held, outs):
                    if sa + i in read_later:
                        made[sa + i] = arr
            self.results[sa:sb] = piece.results  # (a result given to a storage it shares)
            for i in [i for i in made if read_later[i] <= k]:
                del made[i]  # no later piece reads it
            after = script
        self.script = script
        ext.clear()

    def _run(self, script: Script, replayed: bool, ext: list, live: tuple[int, ...],
             donated: tuple[int, ...]) -> tuple:
        _scalars_on_device(ext, self.device)
        _counts["segments"] += 1
        _counts["replayed"] += replayed
        variant = script.variant(live, donated)
        if variant is None:
            if script.variants:  # another set of held results: one program for them all
                live = tuple(sorted(set(live).union(*[v[0] for v in script.variants])))
            variant = [live, donated, None]
            script.variants.append(variant)
            if _recompiles.isEnabledFor(logging.INFO) and _counts["programs"]:
                _recompiles.info("fused eager: a segment of %d ops compiles a new program: %s", len(self.ops),
                                 _why_new(script, variant))
        live, program = variant[0], variant[2]
        if type(program) is Future:
            program = _ready(script, variant)
        elif program is None and _background() and all(op.run is not None for op, _, _ in self.ops):
            _later(script, variant, ext, self.device)  # (or at a later occurrence, when many are compiling)
            program = _OP_BY_OP
        if program is _OP_BY_OP:
            # its program is compiling in the background: each op through its own
            _counts["op_by_op"] += 1
            outs = _program(self.ops, live, own=True)(*ext)
        elif program is None:
            _counts["programs"] += 1
            with warnings.catch_warnings():  # a donated buffer no output can reuse is freed all the same
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                # keep_unused: an input only overwritten still places the program (_engine._build)
                jitted = _program_cache.jit(_program(self.ops, live), donate_argnums=donated, keep_unused=True,
                                 **_placement(ext, self.device))
                program = variant[2] = _kept(jitted, script, live, donated, ext, self.device)
                outs = program(*ext)
        else:
            outs = program(*ext)
        ext.clear()  # inputs nothing else holds are freed now, as before the results land
        for i, arr in zip(live, outs):
            ref, p = self.results[i]
            storage = ref()
            given = storage is not None and storage._array is p
            if given:  # (a program of more results: those held)
                storage._array = arr
            if self.shared and i in self.shared:
                for r in self.shared[i]:
                    s = r()
                    if s is not None and s._array is p:
                        s._array = arr
                        if not given:  # the storage _resolved reads the result from
                            self.results[i] = (r, p)
                            given = True
        note_result(self.device, outs[-1])
        return live, outs


def _with_dead_ends(seg: Segment, live: tuple[int, ...], inputs: tuple) -> tuple[int, ...]:
    """``live`` and the first result of each op whose results nothing
    holds and no later op of the segment reads: every op queued runs, as
    on torch's other devices, though nothing reads what it made (a timing
    loop's ``a @ b`` then ``torch.jax.synchronize()`` measured nothing,
    and the report card printed 85 TFLOP/s for a 2-core CPU); its result
    is dropped as the program returns.  Which ops no later op reads is the
    script's (found once per script: a replayed segment has its ops)."""
    script = seg.expect
    if script is not None and script.n == len(seg.ops) and script.inputs == inputs:  # (as _noted's replayed)
        ends = script.ends
        if ends is None:
            ends = script.ends = _unread(seg)
    else:
        ends = _unread(seg)
    held = set(live)
    extra = [first for first, stop in ends if held.isdisjoint(range(first, stop))]
    return tuple(sorted(held.union(extra))) if extra else live


def _unread(seg: Segment) -> tuple[tuple[int, int], ...]:
    """The result ranges ``(first, stop)`` of the ops of ``seg`` whose
    results no later op of it reads."""
    read = set()
    for _, refs, _ in seg.ops:
        for r in refs:
            if r < 0:
                read.add(~r)
    ends = []
    stop = len(seg.results)
    for first in reversed(seg.slots):
        if first < stop and read.isdisjoint(range(first, stop)):
            ends.append((first, stop))
        stop = first
    return tuple(ends)


class Script:
    """A segment's ops as recorded, and the signatures of the inputs they
    read: the programs made for them (``variants``: one per set of held
    results and of donated inputs) and the scripts that came next in the
    thread after it (``following``, the latest first: what the thread's
    next segment replays; a layer's script is followed by the same layer's,
    then by what comes after the last layer).  A segment that replays a
    script matches it op by op (:func:`record`), ends where it ended, and
    finds its program without building the key of its ops."""

    __slots__ = ("ops", "inputs", "n", "variants", "following", "cut", "ends")

    def __init__(self, ops: tuple, inputs: tuple) -> None:
        self.ops = ops
        self.inputs = inputs
        self.n = len(ops)
        self.variants: list[list] = []  # [live, donated, program]
        self.following: list[Script] = []
        # whether a segment of these ops ended itself there (a replay ends
        # there too; where a read ended it, the read ends the replay)
        self.cut = False
        #: the result ranges of its ops that no later op reads (_unread)
        self.ends: tuple | None = None

    def followed_by(self, script: Script) -> None:
        global replaying
        following = self.following
        if following and following[0] is script:
            return
        replaying = True
        with _following_lock:  # (two threads' segments may follow one script)
            self.following = [script, *[s for s in following if s is not script]][:FOLLOWING]

    def variant(self, live: tuple[int, ...], donated: tuple[int, ...]) -> list | None:
        """A program for a run that holds the results ``live`` and may
        donate the inputs ``donated``: one that returns those (and maybe
        more) and donates none that others still hold."""
        for v in self.variants:
            if v[0] == live and v[1] == donated:
                return v
        for v in self.variants:
            if set(live) <= set(v[0]) and set(v[1]) <= set(donated):
                return v
        return None


_scripts: dict[tuple, Script] = {}
#: A script's first op (its entry in the script) -> the scripts that begin
#: with it, the latest first: what a segment that expects no script (the
#: segment before it was new: a new bucket's) replays from its first op on,
#: so that one new segment does not leave the rest of the step unreplayed
#: and, where it changes, unsplit (:attr:`Segment.diverged`).
_starts: dict[tuple, list] = {}
#: (ops, input signatures) of a segment run as pieces -> its cuts and how
#: many first pieces came before its block (:meth:`Segment._choose_pieces`)
_pieces: dict[tuple, tuple] = {}
#: Whether any script has been followed by another in this process: until
#: then there is nothing to replay, and the dispatcher does not ask
#: :func:`replay` (an op-by-op process never does).
replaying = False
_following_lock = threading.Lock()
#: How many scripts that followed one a segment may replay after it.
FOLLOWING = 4


def _candidates(seg: Segment, entry: tuple | None = None) -> Any:
    """The scripts ``seg`` may replay: those that followed the segment
    before (or, where none did, those :data:`_starts` gave it), and those
    that begin with its first op, so that a script run whole once (a new
    bucket's first step, before its ops ran as pieces) is found again
    after the pieces' scripts that have followed since (``entry``: the
    first op of a segment that has none yet)."""
    found = seg.candidates
    if found is None:
        found = seg.after.following if seg.after is not None else ()
    more = _starts.get(seg.ops[0] if seg.ops else entry)
    if more and more is not found:
        return [*found, *[s for s in more if s not in found]]
    return found


def _another_script(seg: Segment, entry: tuple) -> Script | None:
    """Another of ``seg``'s candidate scripts (its expected script did not
    go on as the segment does), whose ops so far are the segment's and whose next op
    is ``entry``; None when there is none."""
    n = len(seg.ops)
    for script in _candidates(seg, entry):
        if script is not seg.expect and script.n > n and script.ops[n] == entry and list(script.ops[:n]) == seg.ops:
            return script
    return None


def _may_go_on(seg: Segment, script: Script) -> bool:
    """Whether the segment, which has replayed the whole of ``script`` (a
    script that ended itself there), waits for its next op before it ends:
    another of its candidate scripts begins with ``script``'s ops and goes
    on.  A script that ran as the first piece of a segment
    (:meth:`Segment._choose_pieces`) is the beginning of others (a layer's
    ops, ended by the next layer's first op or by the head): ending there
    at once, the replay left the longer ones for a new segment, which
    compiled a program at a bucket seen before (:func:`_ends_before`)."""
    n = script.n
    longer = [s for s in _candidates(seg) if s is not script and s.n > n and s.ops[:n] == script.ops]
    if longer:
        seg.may_end = longer
    return bool(longer)


def _ends_before(seg: Segment, op: Traceable) -> bool:
    """Whether ``seg``, replaying, ends before ``op``, which its script
    does not go on with: it waited at the end of a script that ended itself
    (:func:`_may_go_on`) and no longer one goes on with ``op``, or another
    of its candidate scripts is its ops so far and ended itself there (a
    model's head begins with the ops of its layers' norm: the script of the
    norm alone, run as a piece, ends there, and the head's after it)."""
    longer, seg.may_end = seg.may_end, None
    script = seg.expect
    n = len(seg.ops)
    if seg.done or script is None:
        return False
    if longer is not None:
        return not any(s.ops[n][0] is op for s in longer)
    if n < script.n and script.ops[n][0] is op:
        return False
    return any(s.n == n and s.cut and s is not script and list(s.ops) == seg.ops for s in _candidates(seg))


def _forget() -> None:
    """Drop every script and its programs (open segments may still point
    at some: they replay nothing and keep no program)."""
    for script in _scripts.values():
        script.variants = []
        script.following = []
    _scripts.clear()
    _starts.clear()
    _pieces.clear()


def _why_new(script: Script, variant: list) -> str:
    """What sets a new segment's program apart from the closest one made
    before (the same number of ops, the most of them the same), in a
    user's terms: which op's arguments changed, which input's shape, or
    which results are still held.  Only for the ``pjrt_host.recompiles``
    log at INFO: it looks at every program made."""
    ops, inputs = script.ops, script.inputs
    live, donated = variant[0], variant[1]
    names = [op[0].name for op in ops]
    same_length = [(s.ops, s.inputs, v[0], v[1]) for s in reversed(_scripts.values()) if s.n == len(ops)
                   for v in s.variants if v is not variant]  # of equals, the latest
    if not same_length:
        return f"no earlier segment has {len(ops)} ops (this one: {names[0]} ... {names[-1]})"
    closest = min(same_length, key=lambda k: sum(a != b for a, b in zip(k[0], ops)))
    changes = []
    for i, (old, new) in enumerate(zip(closest[0], ops)):
        if old == new:
            continue
        if old[0] is not new[0] and old[0].name == new[0].name:
            changes.append(f"op {i} ({names[i]}): {difference(old[0].key, new[0].key)}")
        elif old[0] is not new[0]:
            changes.append(f"op {i} is {names[i]} where the closest earlier segment has {old[0].name}")
        else:
            changes.append(f"op {i} ({names[i]}) reads other values (the ops are wired otherwise)")
        if len(changes) == 3:
            break
    for i, (old, new) in enumerate(zip(closest[1], inputs)):
        if old != new and len(changes) < 4:
            changes.append(f"input {i} {_input_text(old)} -> {_input_text(new)}")
    if closest[2] != live:
        changes.append(f"other results are still held ({len(closest[2])} -> {len(live)} of them)")
    if closest[3] != donated:
        changes.append("other inputs are held only by the segment (donated)")
    return "; ".join(changes) or "the same segment (its earlier program was dropped)"


def _input_text(signature: Any) -> str:
    if isinstance(signature, tuple):
        shape, dtype = signature
        return f"{dtype}{list(shape)}"
    return f"a {signature.__name__}"


def _kept(jitted: Any, script: Script, live: tuple, donated: tuple, ext: list, device: int) -> Any:
    """What runs a new segment program: ``jitted`` compiled through the
    program cache, so that a later process loads it from disk without
    tracing, when every op in it has a signature there (the engine gives
    its ops one, ``Traceable.signature``, while the cache is on); else
    ``jitted`` itself."""
    signature = _disk_signature(script, live, donated, ext)
    if signature is None:
        return jitted
    compiled = _program_cache.compiled("pjrt_host.fused", signature, jitted, tuple(ext), jax_device(device))
    return _program_cache.with_retrace(compiled, jitted)


#: The device arrays that stand for a segment's Python ints (views'
#: run-time offsets, logical sizes) and a join's int32 lengths, one per
#: value, dtype and device (bounded); and the values seen once, which are
#: given an array at their second sighting.
_scalar_arrays: dict = {}
_scalars_seen: set = set()


def _scalars_on_device(ext: list, device: Any) -> None:
    """Each Python int and NumPy int32 among a segment's inputs replaced by
    a device array of the value, of the dtype and weak type jit gives it
    (so the program and its signature do not change), made once per value:
    a host scalar is a transfer at every call of the program, and a GPT-2
    layer's program took 16 ints and 4 int32 lengths (its call cost
    about 200 us on cpu_ref, 20-40 us of it per 10 host ints in a
    measurement of jax alone).  A value met for the first time stays a
    host scalar: making its array (``jax.device_put``) costs more than
    jit's own transfer, and a value that changes at every call (a loop's
    counter) would pay that each time."""
    if type(device) is not int:
        return
    wide = None
    for i, v in enumerate(ext):
        t = type(v)
        if t is int:
            if wide is None:
                wide = jax.dtypes.canonicalize_dtype(_np.int64)
            key = (v, wide, device)
        elif t is _np.int32:
            key = (int(v), t, device)
        else:
            continue
        found = _scalar_arrays.get(key)
        if found is None:
            if key not in _scalars_seen:
                if len(_scalars_seen) > 4096:
                    _scalars_seen.clear()
                _scalars_seen.add(key)
                continue
            if t is _np.int32:
                found = _padding.device_scalar(key[0], device)  # (the padded route's kept int32 scalars)
            else:
                try:
                    found = jax.device_put(v, jax_device(device))  # (a Python int stays weakly typed)
                except OverflowError:
                    continue  # (jit raises its own error)
            if len(_scalar_arrays) > 4096:
                _scalar_arrays.clear()
            _scalar_arrays[key] = found
        ext[i] = found


def _placement(ext: Any, device: int) -> dict:
    """``jax.jit``'s options that place a segment's results on its device:
    a segment that reads no array (factories only, as the seed of a
    backward) would put them on jax's default device, uncommitted -- the
    ones of ``jax:1`` on device 0, and the next program that read them
    along with committed arrays compiled again, unseen."""
    if _reads_arrays(ext):
        return {}
    return {"out_shardings": jax.sharding.SingleDeviceSharding(jax_device(device))}


def _reads_arrays(ext: Any) -> bool:
    """Whether a segment's inputs (or their shapes) hold a jax array."""
    return any(isinstance(v, (jax.Array, jax.ShapeDtypeStruct)) for v in ext)


def _disk_signature(script: Script, live: tuple, donated: tuple, ext: list) -> Any:
    """What the program cache keys a segment's program by on disk: its ops'
    signatures, how they are wired, and the argument types (shapes, dtypes;
    a Python scalar may come weakly or strongly typed); None with the cache
    off, or when an op has no signature."""
    if _program_cache.directory() is None:
        return None
    ops = []
    for op, refs, _ in script.ops:
        if op.signature is None:
            return None
        ops.append((op.signature, refs))
    types = tuple(str(jax.typeof(x)) for x in ext)
    # (a segment that reads no array is compiled for its device: _placement)
    return (tuple(ops), live, donated, types) + (() if _reads_arrays(ext) else ("placed",))


def _only_here(ext: list) -> tuple[int, ...]:
    """Positions of the arrays in ``ext`` (a segment's inputs) that nothing
    but ``ext`` holds: the old arrays of storages the segment writes in
    place (an optimizer's parameters and state), values whose tensors were
    deleted after the segment read them (gradients after ``zero_grad``).
    The program is given them (donated), so it writes its results into
    their buffers or frees them as it runs, as op by op's in-place writes
    do: without that a segment's peak holds each buffer twice.  Arrays
    under DONATE_MIN_BYTES are not given: holding them twice costs
    nothing to speak of, and whether a small value (a flag, a token, a
    mask's row) is still held elsewhere changes from one run to the next,
    each change a program of its own (a tiny Llama's generate() compiled
    one more per bucket for a (1,) array)."""
    positions = []
    for i in range(len(ext)):
        # the list's reference and getrefcount's argument: nothing else
        a = ext[i]
        if sys.getrefcount(a) == 3 and isinstance(a, jax.Array) and a.nbytes >= DONATE_MIN_BYTES:
            positions.append(i)
    return tuple(positions)


#: The smallest array a segment is given to write into (:func:`_only_here`).
DONATE_MIN_BYTES = 1 << 16


def _program(ops: list, live: tuple[int, ...], own: bool = False) -> Any:
    """The segment's function of its inputs: its ops' traceable functions
    in order (``own``: each op's own program instead)."""
    def segment(*ext: Any) -> tuple:
        values: list[Any] = []  # one per result slot (an op with several results has several)
        for op, refs, single in ops:
            out = (op.run if own else op.fn)(*[values[~r] if r < 0 else ext[r] for r in refs])
            if single:
                values.append(out)
            else:
                values.extend(out)
        return tuple(values[i] for i in live)

    return segment


#: A segment whose program is compiling in the background (or failed to)
#: runs op by op.
_OP_BY_OP = object()
#: Segment programs compiling or queued at once, at most: more new segments
#: run op by op and start their compile at a later occurrence (a process
#: exits once the queued compiles end).
PENDING_LIMIT = 4
_pool: Any = None
_pending: set = set()


def _background() -> bool:
    from .._env import fused_compile

    return fused_compile() == "background"


def _later(script: Script, variant: list, ext: list, device: int) -> None:
    """Start compiling the segment's program on the background thread,
    unless PENDING_LIMIT compiles are pending already (a later occurrence
    of the segment starts it then)."""
    global _pool
    if len(_pending) >= PENDING_LIMIT:
        return
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pjrt_host-fused-compile")
    dev = jax_device(device)
    sharding = jax.sharding.SingleDeviceSharding(dev)
    # shapes, not the arrays: an input may be donated or freed before the thread reads it
    example = tuple(jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding, weak_type=v.weak_type)
                    if isinstance(v, jax.Array) else v for v in ext)
    _counts["programs"] += 1
    live, donated = variant[0], variant[1]
    future = _pool.submit(_compile, script.ops, live, donated, example,
                          _disk_signature(script, live, donated, ext), device)
    _pending.add(future)
    future.add_done_callback(_pending.discard)
    variant[2] = future


@x64_scope
def _compile(ops: tuple, live: tuple, donated: tuple, example: tuple, signature: Any, device: int) -> Any:
    """The background thread's work: the segment's program, compiled for
    ``example`` (through the program cache, as an inline compile, when it
    has a ``signature`` there)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        jitted = _program_cache.jit(_program(ops, live), donate_argnums=donated, keep_unused=True, **_placement(example, device))
        if signature is None:
            return _program_cache.with_retrace(jitted.lower(*example).compile(), jitted)
        compiled = _program_cache.compiled("pjrt_host.fused", signature, jitted, example, jax_device(device))
        return _program_cache.with_retrace(compiled, jitted)


def _ready(script: Script, variant: list) -> Any:
    """The program of a variant compiling in the background: once it is
    ready, it becomes the variant's program; :data:`_OP_BY_OP` until then,
    and for good when it failed (the ops run through their own programs,
    which raise what there is to raise)."""
    future = variant[2]
    if not future.done():
        return _OP_BY_OP
    try:
        variant[2] = future.result()
    except Exception as err:  # noqa: BLE001  (any failure: the segment runs op by op)
        _recompiles.info("fused eager: a segment of %d ops failed to compile in the background (%s: %s); it runs "
                         "op by op", script.n, type(err).__name__, str(err).splitlines()[0][:200] if str(err) else "")
        variant[2] = _OP_BY_OP
    return variant[2]


def _fusable(op: Traceable, dyn: list, plan: Any) -> bool:
    """Whether ``op`` traces with pending (abstract) inputs to the shapes
    torch planned; remembered on disk by the op's signature, so a warm
    process does not trace its ops to find out."""
    signature = op.signature
    if signature is not None:
        signature = (signature, tuple(_signature(v) for v in dyn), plan is None)
    return _program_cache.learnt("fusable", signature, lambda: _traces_as_planned(op.fn, dyn, plan))


def _traces_as_planned(fn: Any, dyn: list, plan: Any) -> bool:
    try:
        shapes = jax.eval_shape(fn, *[abstract(v) for v in dyn])
        # torch's meta kernel and the lowering may disagree on a result's
        # shape (native_batch_norm in eval gives CPU's empty saved
        # statistics where the meta kernel gives a full-size one): op by
        # op, the tensor takes the shape the lowering computes.
        return plan is None or _as_planned(shapes, plan)
    except Exception:
        return False  # the op needs concrete values (or fails): op by op


def _segment(device: int) -> Segment:
    seg = getattr(_local, "segment", None)
    if seg is None or seg.done or seg.device != device:
        if seg is not None and not seg.done:
            seg.flush()
        before = getattr(_local, "previous", None)  # this thread's segment before (it has run)
        seg = _local.segment = _local.previous = Segment(device, before.script if before is not None else None)
    return seg


def _as_planned(shapes: Any, plan: Any) -> bool:
    """Whether the lowering's result shapes are the shapes torch's meta
    kernel gave (the shapes the recorded tensors report)."""
    results = (shapes,) if plan.container == "single" else tuple(shapes)
    return len(results) == len(plan.outputs) and all(
        tuple(r.shape) == tuple(spec.shape) for r, spec in zip(results, plan.outputs))


def host_op(table: dict, name: str, key: Any, make: Any, spelt: Any = None) -> Traceable:
    """The op of one of the host's own recorded computations (a factory, a
    copy through a view, an index check's bounds, a join), one per ``key``
    in ``table`` (bounded): ``make()`` gives its traceable function and its
    own program (or None).  Kept on disk under ``(name, spelt or key)``
    while the program cache is on."""
    op = table.get(key)
    if op is None:
        fn, run = make()
        if len(table) > 1024:  # signatures long gone: bound the memory
            table.clear()
        signature = (_program_cache.Spelt((name, key if spelt is None else spelt))
                     if _program_cache.directory() is not None else None)
        op = table[key] = Traceable(fn, name, key, signature, run)
    return op


def abstract(v: Any) -> Any:
    return jax.ShapeDtypeStruct(v.shape, v.dtype) if type(v) is Pending else v


def record(op: Traceable, dyn: list, plan: Any, index: int, place: Any, into: list | None = None,
           returns_one: bool = True, padded: list | None = None) -> Any:
    """Record ``op.fn(*dyn)`` (an op's traceable function and its arguments) and
    return its results as 'jax' tensors (``plan``: their specs and
    container) whose arrays are pending; with ``into`` (the storages an
    in-place or out= op writes) the results become those storages' new
    arrays instead (``returns_one``: ``fn`` returns one array, not a
    tuple), and True is returned.  ``padded``: per result of a call on
    padded inputs (``_dynamic_dims``), its logical shape, the shape of
    its array and its padding (the plan's shapes are those of the call
    that built the op).  None when the op cannot be fused (the caller
    runs it itself)."""
    if op not in _validated:
        if op in _refused:
            return None
        if len(_validated) + len(_refused) > 8192:  # op functions of signatures long gone: bound the memory
            _validated.clear()
            _refused.clear()
        if not _fusable(op, dyn, plan if padded is None else None):
            _refused.add(op)
            return None
        _validated.add(op)
    seg = _segment(index)
    if seg.expect is not None and seg.ops:
        with seg.lock:
            if _ends_before(seg, op):
                seg.flush()
        seg = _segment(index)
    with seg.lock:
        if seg.done:  # another thread ran it meanwhile
            seg = _segment(index)
        refs = []
        for v in dyn:
            if type(v) is Pending:
                if v.segment is seg:
                    refs.append(~v.index)
                    continue
                v.segment.flush()
                v = _resolved(v)
            if type(v) in _SCALARS or id(v) in unshared:
                # a Python scalar takes a slot of its own: shared by identity,
                # the segment's structure would depend on its value (CPython
                # shares the ints -5..256, so a random draw's counter that
                # reached a view's offset of 128 changed the segment, and a
                # training step compiled new programs every few hundred draws)
                i = len(seg.externals)
                seg.externals.append(v)
            else:
                i = seg.ext_ids.get(id(v))
                if i is None:
                    i = seg.ext_ids[id(v)] = len(seg.externals)
                    seg.externals.append(v)
            refs.append(i)
        refs_t = tuple(refs)
        single = plan.container == "single" if into is None else returns_one
        script = seg.expect
        if script is None and not seg.ops:
            starting = _starts.get((op, refs_t, single))
            if starting:  # the segment before was new: scripts that begin here
                seg.candidates = starting
                script = seg.expect = starting[0]
        if script is not None:
            n = len(seg.ops)
            if n == script.n or script.ops[n][0] is not op or script.ops[n][1] != refs_t \
                    or script.ops[n][2] is not single:
                left = script
                script = seg.expect = _another_script(seg, (op, refs_t, single))
                if script is None:  # recorded from here on as new
                    # repeats are looked for over the segment's ops (the
                    # replayed ones were not noted): a replay that began at a
                    # script of another block's first op hid the block before
                    _noted_again(seg.ops)
                    # (past the end of a script a read ended, the segment
                    # goes on as one: the read was elsewhere this time)
                    if len(seg.results) >= SPLIT_RESULTS and (n < left.n or left.cut):
                        seg.diverged = n
                        seg.left = left
        seg.ops.append((op, refs_t, single))
        seg.slots.append(len(seg.results))
        _counts["ops"] += 1
        _local.recorded = op
        if into is not None:
            result: Any = True
            for storage in into:
                pending = Pending(seg, len(seg.results), storage.shape, storage.jax_dtype)
                storage.commit(pending)
                seg.results.append((weakref.ref(storage), pending))
        else:
            tensors = []
            for i, spec in enumerate(plan.outputs):
                shape = physical = spec.shape
                padding = None
                if padded is not None:
                    shape, physical, padding = padded[i]
                pending = Pending(seg, len(seg.results), physical, jax_dtype(spec.dtype))
                t = result_tensor(pending, shape, spec.dtype, index, place, padding)
                seg.results.append((weakref.ref(t._storage), pending))
                tensors.append(t)
            result = tensors[0] if single else (tuple(tensors) if plan.container == "tuple" else tensors)
        n = len(seg.ops)
        if script is not None:  # replayed: it ends where the script ended itself
            full = n == script.n and script.cut and not _may_go_on(seg, script)
        else:
            period = _repeats(id(op), n)
            if period and not _small_body(period):
                full = True
                # a layer repeated: the segment runs as what came before it,
                # its first occurrence and its second (Segment._run_pieces)
                seg.cuts = tuple(c for c in (n - 2 * period, n - period) if c > 0)
                seg.prefix = int(n != 2 * period)  # (less: the block's first occurrence began in the segment before)
            else:
                full = n >= LIMIT or (period and n % period == 0 and n >= REPEAT_SEGMENT)
    if full:
        _end(seg)
    return result


def recorded_lane() -> Lane | None:
    """The replay lane of the op this thread recorded last (None: none,
    or one without a lane), which :func:`forget_recorded` forgets."""
    op = getattr(_local, "recorded", None)
    lane = None if op is None else op.lane
    return lane if type(lane) is Lane else None


def forget_recorded() -> None:
    _local.recorded = None


def _end(seg: Segment) -> None:
    """The segment ends itself (a block repeated, LIMIT, or the script it
    replays ended there): it runs now, or once the caller has written the
    results back (:func:`writing_back`)."""
    seg.ended = True
    if getattr(_local, "held", 0):
        _local.ending = seg
    else:
        seg.flush()


class Lane:
    """How a call of one engine op (one key) is replayed without the engine
    where a segment replays a script (:func:`replay`): the torch op, the
    settings and device of the key, its argument entries, the engine op
    and its entry's use count (a replayed call counts as a hit, so the
    entry stays among those the op keeps), and its results' shapes and
    dtypes.  Only for an op whose whole handler is the engine's call, with
    no out= targets, no random draw and no padded read."""

    __slots__ = ("func", "cfg", "place", "args", "kwargs", "op", "traced", "used", "outputs", "container", "padded",
                 "noted")

    def __init__(self, func: Any, key: tuple, op: Any, used: list, plan: Any, padded: Any = None) -> None:
        self.func = func
        LANED.add(func)
        #: A padded call's lane (``_dynamic_dims.PaddedLane``): it reads the
        #: arguments and gives the results' shapes and padding per call.
        self.padded = padded
        self.args, self.kwargs, _, self.cfg, self.place = key
        self.op = op
        # whether the op's scalars were traced (the key's rule for them):
        # an op whose scalars became traced since keys them otherwise
        self.traced = op.dynamic is True
        self.used = used
        self.outputs = tuple((spec.shape, spec.dtype, jax_dtype(spec.dtype)) for spec in plan.outputs)
        self.container = plan.container
        #: An exact cat's note of a replayed result at its places
        #: (``_dynamic_dims.note_on_replay``), as the cat's handler notes its
        #: own (it may come back as an accumulator); None: not such an op
        self.noted: Any = None


class _NoLane:
    """The lane of an op whose calls of one key take the engine's way."""

    __slots__ = ()
    func = None


NO_LANE = _NoLane()


def replay(func: Any, args: tuple, kwargs: dict, into: list | None = None) -> Any:
    """The replay lane: the call ``func(*args, **kwargs)`` recorded as the
    next op of the script this thread's segment replays (or of the script
    that followed the segment before, which opens one) without the engine
    (no key, no cache lookup, no meta kernel), when the call is the one the
    script recorded there: the same op, arguments that encode to the same
    key (:func:`~._signatures.matches`) and are wired to the same values.
    None when it is not, or the op has no lane: the caller takes the
    engine's way, which records it (or finds the segment is new from here).

    ``into``: the writable, unpadded storages (no views) that take the
    results in order instead of new tensors, each of its result's shape
    and dtype (an in-place foreach op replayed as its functional op: an
    optimizer step writes each parameter and state tensor so, without a
    tensor per result); True when they took them."""
    seg = getattr(_local, "segment", None)
    if seg is not None and seg.done:
        # another thread ran it (autograd's device thread read the loss):
        # the call opens the next segment, as the engine's way does (``_segment``)
        seg = None
    if seg is None:
        before = getattr(_local, "previous", None)
        if before is None or before.script is None or not before.script.following:
            return None
        script = before.script.following[0]
        n = 0
    else:
        script = seg.expect
        if script is None:
            return None
        n = len(seg.ops)
        if n >= script.n:
            return None
    expected = script
    others: list | None = None
    while True:
        step = script.ops[n]
        found = _lane_match(step[0].lane, func, args, kwargs, into, seg)
        if found is not None:
            lane, dyn, padded = found
            if len(dyn) == len(step[1]):
                break
        # the script's next op is another op than this call's: another script
        # the thread may be replaying (what followed the segment before,
        # whose ops so far are the segment's) may go on with it, as the
        # engine's way finds one (``record``'s ``_another_script``): a loop's
        # last pass leaves its body for what comes after (the layers'
        # script, then the head's), at the op where the two part.  A call of
        # the op the script has there, with other arguments, takes the
        # engine's way: its handler decides anew (a cache's cat joins in
        # its bucket where an earlier call's script has an exact cat)
        if others is None:
            lane = step[0].lane
            if lane is None or lane.func is func or func not in LANED:
                return None
            others = _lane_others(seg, before if seg is None else None, script, n, func)
        if not others:
            return None
        script = others.pop()
    op = lane.op
    place = lane.place
    refs = step[1]
    if CHECK:
        _check_replay(lane, step[0], args, kwargs, dyn, padded)
    if seg is None:  # the call opens the segment that replays the script
        seg = _local.segment = _local.previous = Segment(place, before.script)
    with seg.lock:
        if seg.done or seg.expect is not expected or len(seg.ops) != n:
            return None
        externals = seg.externals
        added: list | None = None
        added_ids: dict | None = None  # id -> slot of the shared values among ``added`` (a foreach op adds hundreds)
        for v, r in zip(dyn, refs):
            if type(v) is Pending:
                if v.segment is seg:
                    if r != ~v.index:
                        return None
                    continue
                # a value of another segment still open (autograd's device
                # thread computed the last gradients an optimizer step
                # reads): it runs first, as in ``record``, and its array is
                # an input here as it was where the script was recorded
                v.segment.flush()
                v = _resolved(v)
            i = None
            shared = type(v) not in _SCALARS and id(v) not in unshared  # (else a slot of its own: record())
            if shared:
                i = seg.ext_ids.get(id(v))
                if i is None and added_ids:
                    i = added_ids.get(id(v))
            if i is None:
                if added is None:
                    added, added_ids = [], {}
                i = len(externals) + len(added)
                added.append(v)
                if shared:
                    added_ids[id(v)] = i
            if r != i:
                return None
        if added:
            for v in added:
                if type(v) not in _SCALARS and id(v) not in unshared:
                    seg.ext_ids[id(v)] = len(externals)
                externals.append(v)
        seg.expect = script
        seg.ops.append(step)
        seg.slots.append(len(seg.results))
        _counts["ops"] += 1
        _counts["lane"] += 1
        op.hits += 1
        lane.used[0] = op.hits
        results = seg.results
        if into is not None:
            for storage, (shape, _, jdtype) in zip(into, lane.outputs):
                pending = Pending(seg, len(results), shape, jdtype)
                storage.commit(pending)
                results.append((weakref.ref(storage), pending))
            result = True
        elif padded is not None:
            tensors = []
            for (shape, physical, padding), (_, dtype, jdtype) in zip(padded[0], lane.outputs):
                pending = Pending(seg, len(results), physical, jdtype)
                t = result_tensor(pending, shape, dtype, place, place, padding)
                results.append((weakref.ref(t._storage), pending))
                tensors.append(t)
            result = tensors[0] if lane.container == "single" else (
                tuple(tensors) if lane.container == "tuple" else tensors)
        elif lane.container == "single":
            shape, dtype, jdtype = lane.outputs[0]
            pending = Pending(seg, len(results), shape, jdtype)
            result: Any = result_tensor(pending, shape, dtype, place, place)
            results.append((weakref.ref(result._storage), pending))
            if lane.noted is not None:  # an exact cat: noted at its places, as its handler notes it
                lane.noted(result)
        else:
            tensors = []
            for shape, dtype, jdtype in lane.outputs:
                pending = Pending(seg, len(results), shape, jdtype)
                t = result_tensor(pending, shape, dtype, place, place)
                results.append((weakref.ref(t._storage), pending))
                tensors.append(t)
            result = tuple(tensors) if lane.container == "tuple" else tensors
        full = n + 1 == script.n and script.cut and not _may_go_on(seg, script)
    if padded is not None and padded[1] is not None:  # (a factory's lane reads nothing padded)
        _counts["lane_padded"] += 1
        lane.op.note_padded_call(args, kwargs, padded[1])
    if full:
        _end(seg)
    return result


def _lane_match(lane: Lane | None, func: Any, args: tuple, kwargs: dict, into: list | None,
                seg: Segment | None) -> tuple | None:
    """``lane``, the call's run-time values and its padded match (None: an
    exact call) when the call is the one ``lane`` recorded: the same op and
    settings, arguments that encode to the same key; None when it is not."""
    if lane is None or lane.func is not func or lane.cfg is not _config.current():
        return None
    op = lane.op
    if op.in_trial or (op.dynamic is True) is not lane.traced:
        return None
    place = lane.place
    if into is not None:
        outputs = lane.outputs
        if lane.padded is not None or len(outputs) != len(into) or any(
                s.place != place or s.shape != o[0] or s.jax_dtype != o[2] for s, o in zip(into, outputs)):
            return None
    if seg is not None and seg.device != place:
        return None
    dyn: list = []
    padded = lane.padded
    if padded is None:
        keys = lane.args
        if len(args) != len(keys):
            return None
        for v, k in zip(args, keys):
            if not matches(v, k, dyn, place):
                return None
        if kwargs or lane.kwargs:
            if len(kwargs) != len(lane.kwargs):
                return None
            for name, k in lane.kwargs:
                if name not in kwargs or not matches(kwargs[name], k, dyn, place):
                    return None
    else:
        padded = padded.match(args, kwargs, dyn, place)
        if padded is None:
            return None
    return lane, dyn, padded


def _lane_others(seg: Segment | None, before: Segment | None, script: Script, n: int, func: Any) -> list:
    """The scripts besides ``script`` that the replay lane may go on with at
    op ``n`` for a call of ``func`` (the last to try first): those of
    :func:`_candidates` whose ops so far are the segment's (for a call that
    opens a segment, those that followed the segment before, ``before``).
    None of them (an empty list) where the engine's way ends the segment
    before the call instead (:func:`_ends_before`: another candidate ended
    itself at these ops), or waits at the end of a script that may go on."""
    if seg is None:
        found = before.script.following
        ops: list = []
    else:
        if seg.may_end is not None:
            return []
        found = _candidates(seg)
        ops = seg.ops
        if any(s.n == n and s.cut and s is not script and list(s.ops) == ops for s in found):
            return []
    others = [s for s in found if s is not script and s.n > n and (lane := s.ops[n][0].lane) is not None
              and lane.func is func and lane.noted is None and (not n or list(s.ops[:n]) == ops)]
    others.reverse()
    return others


#: Whether each replayed call is checked against the engine's key
#: (``PJRT_HOST_CHECK_REPLAY=1``: the test suite runs so).
CHECK = _env.check_replay()


def _check_replay(lane: Lane, op: Traceable, args: tuple, kwargs: dict, dyn: list, padded: Any = None) -> None:
    """The replay lane's verdict checked against the engine's rule: the key
    the engine builds for the call is the recorded op's, and its run-time
    values are the lane's (for a padded call, the engine's padded key, and
    the results' shapes and padding it gives them)."""
    if padded is not None:
        key, values = lane.padded.engine_key(args, kwargs, lane.cfg, padded[0])
    else:
        key, values = lane.op._key(args, kwargs, [])
    if key != op.key or len(values) != len(dyn) or any(a is not b and not _same_value(a, b) for a, b in zip(values, dyn)):
        raise AssertionError(f"pjrt_host: fused eager's replay lane took a call of {op.name} as the one recorded, "
                             f"but the engine keys it otherwise:\n  recorded {op.key}\n  engine's {key}")


def _same_value(a: Any, b: Any) -> bool:
    """Whether run-time values ``a`` and ``b`` are one value: Python
    scalars, and the NumPy scalars a join's lengths travel as, are values
    (each call makes its own)."""
    return (type(a) in _SCALARS or isinstance(a, _np.generic)) and type(a) is type(b) and a == b


class writing_back:
    """Around an in-place op run as its functional op and a write of each
    result into its target: a segment that ends itself at the functional
    op runs after the writes, not before them.  Run before, it returned
    the temporary results and the targets' old values, and the targets
    read the arrays afterwards (one more program per step, a new one at
    the first replay)."""

    __slots__ = ()

    def __enter__(self) -> None:
        _local.held = getattr(_local, "held", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        _local.held -= 1
        if not _local.held:
            seg = getattr(_local, "ending", None)
            if seg is not None:
                _local.ending = None
                seg.flush()


#: A segment also ends where the ops recorded last repeat the ones before
#: them, a block of 10 to 128 ops (a layer, a loop body), so that segments
#: line up with the blocks and each later block reuses one program.
REPEAT_MIN, REPEAT_MAX = 10, 128
#: A block made of a loop body shorter than REPEAT_MIN (``x = x * a + b``
#: in a loop: a block of 10 ops that is five bodies) ends a segment only
#: once the segment holds a whole number of blocks and at least this many
#: ops: each later segment then holds the same number of blocks and reuses
#: one program, and a chain of small ops is not run a few ops at a time.
#: Other blocks (a layer) end a segment each, so that segments line up
#: with them wherever the loop around them stops.
REPEAT_SEGMENT = 64


def _small_body(period: int) -> bool:
    """Whether this thread's last block of ``period`` ops repeats a body
    shorter than REPEAT_MIN.  While every op ends a repeat of the same
    length (a loop running), the answer stays the one found at its first."""
    window = _local.window
    last = getattr(_local, "small", None)
    if last is not None and last[0] == period and last[1] == len(window) - 1:
        small = last[2]
    else:
        block = window[-period:]
        small = any(period % q == 0 and block[q:] == block[:-q] for q in range(1, REPEAT_MIN))
    _local.small = (period, len(window), small)
    return small


def _noted_again(ops: list) -> None:
    """Start this thread's window of recorded ops (:func:`_repeats`) over
    ``ops`` (a segment's, replayed so far)."""
    window = _local.window = [id(op) for op, _, _ in ops[-2 * REPEAT_MAX:]]
    seen: dict[int, list[int]] = {}
    for j, o in enumerate(window):
        seen.setdefault(o, []).append(j)
    for places in seen.values():
        del places[:-16]
    _local.seen = seen


def _repeats(op: int, recorded: int) -> int:
    """The length of the block this thread's last ops (``op`` the newest,
    ``recorded`` in the open segment) end, where that block of REPEAT_MIN
    to REPEAT_MAX ops repeats the block before it and the segment holds at
    least that block; else 0.
    The block is the shortest one from REPEAT_MIN up, measured from an
    earlier place of the same op (a block with a shorter repeat inside, as
    three identical sublayers, is a multiple of it)."""
    window = getattr(_local, "window", None)
    if window is None:
        window = _local.window = []
        _local.seen = {}
    elif len(window) > 4 * REPEAT_MAX:
        # Keep the last two blocks' worth, not nothing: where segments end
        # must not depend on how many ops ran before (a loop whose history
        # was cleared at another place each time cut its blocks elsewhere,
        # and compiled new programs, every run).
        del window[:-2 * REPEAT_MAX]
        _local.seen = {}
        for j, o in enumerate(window):
            _local.seen.setdefault(o, []).append(j)
        for places in _local.seen.values():
            del places[:-16]
    seen = _local.seen
    i = len(window)
    window.append(op)
    places = seen.get(op)
    if places is None:
        seen[op] = [i]
        return 0
    found = 0
    for p in reversed(places):
        period = i - p
        if period > REPEAT_MAX or period > recorded or i + 1 < 2 * period:
            break
        # the nearest place is not always the block's: an op a layer runs
        # twice (a residual add after attention and after the MLP) is
        # nearer than its place in the layer before
        if period >= REPEAT_MIN and window[i - 1] == window[i - 1 - period] \
                and window[i - period + 1:] == window[i - 2 * period + 1:i - period + 1]:
            found = period
            break
    places.append(i)
    if len(places) > 16:
        del places[:8]
    return found


def _signature(v: Any) -> Any:
    """What a program is specialised on for one external value: its type
    for a Python scalar (jit traces it), its shape and dtype for an array."""
    shape = getattr(v, "shape", None)
    if shape is None:
        return type(v)
    return (tuple(shape), v.dtype)  # (a numpy dtype: its str() costs more than the rest of the check)


def _resolved(p: Pending) -> Any:
    """The array of a Pending whose segment has run (for an input whose
    storage still holds it, the storage has the array now)."""
    seg = p.segment
    ref, _ = seg.results[p.index]
    storage = ref()
    if storage is None or type(storage._array) is Pending:
        raise RuntimeError("pjrt_host: a fused-eager value was read after nothing held it (internal error)")
    return storage._array


def resolve(dyn: list) -> list:
    """``dyn`` with every pending value computed (for an op run op by op)."""
    if not any(type(v) is Pending for v in dyn):
        return dyn
    out = []
    for v in dyn:
        if type(v) is Pending:
            v.segment.flush()
            v = _resolved(v)
        out.append(v)
    return out


def stats() -> dict[str, int]:
    """Segments run, ops recorded and programs made by fused eager."""
    return dict(_counts)
