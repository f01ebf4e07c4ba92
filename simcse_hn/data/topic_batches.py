"""Topic-aware batches (TAS-B, arXiv 2104.06967): every gathered batch drawn from one k-means cluster of the corpus.

In-batch negatives of a random batch are mostly unrelated sentences; drawn from one topic cluster they are near
neighbours, i.e. hard negatives at no extra forward cost. The corpus (the `text` column, or `anchor` for paired data)
is embedded once by an encoder and clustered by k-means (`kmeans`: seeded Lloyd iterations in torch, or faiss when it
is installed); `TopicBatchSampler` then orders the dataset so that every window of `window` consecutive indices (one
gathered batch: per-device batch x processes, which accelerate deals out to the processes batch by batch) takes
`round(share x window)` rows from one cluster and the rest at random. Like simcse_hn.data.sampling.NoDuplicatesSampler
it is a plain index sampler: the order is a function of the seed, the epoch and the assignments in force only, so every
process draws the same windows and a resumed run skips exactly the batches it had trained on. A re-clustering
(`TopicBatchSampler.recluster`) puts a new assignment in force from a later window of the epoch on.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import Sampler

try:  # optional extra `faiss-cpu`: faster k-means on large corpora
    import faiss
except ImportError:  # pragma: no cover - depends on the environment
    faiss = None

logger = logging.getLogger(__name__)

TOPIC_CLUSTERS_FILE = "topic_clusters.pt"  # a checkpoint's assignments in force: a resume draws the same batches
LLOYD_ITERATIONS = 20  # TAS-B's clustering is coarse: a few iterations move few points after the first ten


def kmeans(embeddings: Tensor, clusters: int, seed: int = 0, iterations: int = LLOYD_ITERATIONS,
           use_faiss: bool | None = None) -> Tensor:  # fmt: skip
    """embeddings (n, D) -> the cluster of each row, (n,) int64 on the CPU, by cosine (rows normalised).

    Seeded: the same embeddings give the same assignment. torch: Lloyd iterations from a seeded k-means++ start;
    faiss (when installed and `use_faiss` is not False): `faiss.Kmeans` with the same seed."""
    x = torch.nn.functional.normalize(embeddings.float().cpu(), dim=-1)  # (n, D)
    n = x.shape[0]
    if not 1 <= clusters <= n:
        raise ValueError(f"clusters must be in 1..{n} (the corpus size), got {clusters}")
    if (faiss is not None) if use_faiss is None else use_faiss:
        model = faiss.Kmeans(x.shape[1], clusters, niter=iterations, seed=seed, spherical=True, verbose=False)
        model.train(x.numpy())
        return torch.from_numpy(model.index.search(x.numpy(), 1)[1][:, 0]).long()
    generator = torch.Generator().manual_seed(seed)
    centroids = _kmeans_plus_plus(x, clusters, generator)  # (K, D)
    assignment = torch.zeros(n, dtype=torch.long)
    for _ in range(iterations):
        assignment = (x @ centroids.T).argmax(dim=1)  # (n,)
        sums = torch.zeros_like(centroids).index_add_(0, assignment, x)  # (K, D)
        counts = torch.bincount(assignment, minlength=clusters)  # (K,)
        centroids = torch.nn.functional.normalize(sums, dim=-1)
        empty = (counts == 0).nonzero()[:, 0]  # re-seeded at the rows farthest from their centroid
        if len(empty):
            fit = (x * centroids[assignment]).sum(dim=1)  # (n,)
            centroids[empty] = x[fit.argsort()[: len(empty)]]
    return (x @ centroids.T).argmax(dim=1)


def _kmeans_plus_plus(x: Tensor, clusters: int, generator: torch.Generator) -> Tensor:
    """k-means++ seeding (Arthur & Vassilvitskii 2007) on unit rows x (n, D): each next centroid drawn with
    probability proportional to its squared distance from the nearest one chosen."""
    chosen = [int(torch.randint(x.shape[0], (1,), generator=generator))]
    nearest = 2 - 2 * (x @ x[chosen[0]])  # (n,) squared distance to the nearest centroid
    for _ in range(clusters - 1):
        weights = nearest.clamp_min(0)
        pick = int(torch.multinomial(weights, 1, generator=generator)) if weights.sum() > 0 else len(chosen)
        chosen.append(pick)
        nearest = torch.minimum(nearest, 2 - 2 * (x @ x[pick]))
    return x[chosen].clone()


def cluster_corpus(
    encode: Callable[[list[str]], Tensor], texts: Sequence[str], clusters: int, seed: int = 0
) -> Tensor:
    """Embed `texts` with `encode` and cluster them: (n,) int64. Logs the time it took."""
    start = time.perf_counter()
    embeddings = encode(list(texts))  # (n, D)
    encoded = time.perf_counter()
    assignment = kmeans(embeddings, clusters, seed=seed)
    logger.info("topic batches: %d texts encoded in %.1fs, clustered into %d in %.1fs", len(texts),
                encoded - start, clusters, time.perf_counter() - encoded)  # fmt: skip
    return assignment


@dataclass(frozen=True)
class InForce:
    """A cluster assignment ((n,) int64) in force from window `window` of epoch `epoch` on, made at optimizer step
    `step` (0: before training)."""

    epoch: int
    window: int
    step: int
    assignment: Tensor

    @property
    def start(self) -> tuple[int, int]:
        return (self.epoch, self.window)

    def as_dict(self) -> dict:
        return {"epoch": self.epoch, "window": self.window, "step": self.step, "assignment": self.assignment}


class TopicBatchSampler(Sampler[int]):
    """Yields len(self) indices in windows of `window`, each window's first round(share x window) rows from one
    cluster of `assignment` ((n,) int, one cluster per example) and the rest drawn at random from the other rows.

    rows: one tuple of texts per example (its column values), for `no_duplicates`: no window holds a text twice (a
    row that would repeat one waits for a later window, as in NoDuplicatesSampler). The order depends only on `seed`,
    the epoch (`set_epoch`) and the assignments in force (`assignment`, then those of `recluster`). Each epoch: every
    cluster's rows, in a seeded permutation's order, are cut into chunks of the cluster share, the rows a cluster
    leaves over (fewer than a chunk) are pooled and cut in the same way (those chunks mix clusters, and are used only
    when the one-cluster chunks run out: `mixed_windows` counts them), the first floor(n / window) chunks in a seeded
    random order begin the windows, and the rows of no chosen chunk, shuffled, complete them.
    Only floor(n / window) full windows are drawn (drop_last).

    Re-clustering: `recluster(assignment, epoch, window)` puts a new assignment in force from that window of that
    epoch on; the epoch's windows from there are drawn again, in the same way, from the rows its earlier windows left
    (seeded by seed, epoch and window). Windows are made as they are read, so a window not read yet can change;
    asking for one already read is an error. `schedule` (the assignments in force from the current epoch's start on,
    each an `InForce`) is what a checkpoint keeps to draw the same batches again.
    """

    def __init__(self, assignment: Tensor, window: int, share: float = 1.0, seed: int = 0,
                 rows: Sequence[tuple[str, ...]] | None = None, no_duplicates: bool = False):  # fmt: skip
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not 0.0 < share <= 1.0:
            raise ValueError(f"share must be in (0, 1], got {share}")
        assignment = torch.as_tensor(assignment, dtype=torch.long).cpu()
        if rows is not None and len(rows) != len(assignment):
            raise ValueError(f"{len(rows)} rows for {len(assignment)} assigned examples")
        ids: dict[str, int] = {}
        self.rows = None
        if no_duplicates and rows is not None:
            self.rows = [frozenset(ids.setdefault(text, len(ids)) for text in row) for row in rows]
        self.size = len(assignment)
        self.schedule: list[InForce] = [InForce(0, 0, 0, assignment)]
        self.window = window
        self.share = share
        self.seed = seed
        self.epoch = 0
        self.mixed_windows = 0
        self.read = (0, 0)  # (epoch, windows) read so far by the iterator of that epoch

    @property
    def assignment(self) -> Tensor:
        """The assignment in force last (the latest of the schedule)."""
        return self.schedule[-1].assignment

    @property
    def from_cluster(self) -> int:
        return max(1, round(self.share * self.window))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def recluster(self, assignment: Tensor, epoch: int, window: int, step: int = 0) -> None:
        """Put `assignment` (made at optimizer step `step`, a record) in force from `window` of `epoch` on."""
        assignment = torch.as_tensor(assignment, dtype=torch.long).cpu()
        if len(assignment) != self.size:
            raise ValueError(f"{len(assignment)} cluster assignments for {self.size} examples")
        last = self.schedule[-1]
        if (epoch, window) < last.start:
            raise ValueError(f"an assignment from epoch {epoch} window {window} is before the one in force from "
                             f"epoch {last.epoch} window {last.window}")  # fmt: skip
        if self.read[0] == epoch and window < self.read[1]:
            raise RuntimeError(f"topic batches: re-clustering from window {window} of epoch {epoch}, but the loader "
                               f"has already read {self.read[1]} windows of it")  # fmt: skip
        self.schedule = self._from_epoch_start(epoch, [e for e in self.schedule if e.start < (epoch, window)])
        self.schedule.append(InForce(epoch, window, step, assignment))

    def recluster_after(self, step: int, accumulation: int, assignment: Tensor) -> None:
        """Put `assignment`, made after `step` optimizer steps of `accumulation` windows each, in force. The loader has
        already drawn the next step's windows (and one more), so it takes effect from the step after it: window
        (s + 1) x accumulation of the epoch, s the steps done in it, or the next epoch's start. A function of the step
        only, so an uninterrupted and a resumed run re-cluster at the same windows."""
        full = self.size // self.window
        per_epoch = max(full // accumulation + int(full % accumulation > 0), 1)
        epoch, done = divmod(step, per_epoch)
        window = (done + 1) * accumulation if done else 0
        if window >= full:
            epoch, window = epoch + 1, 0
        self.recluster(assignment, epoch, window, step)

    @staticmethod
    def _from_epoch_start(epoch: int, schedule: list[InForce]) -> list[InForce]:
        """The entries an epoch from its start on can still read: the one in force at its window 0, and later ones."""
        first = max([i for i, e in enumerate(schedule) if e.start <= (epoch, 0)], default=0)
        return schedule[first:]

    def load_schedule(self, schedule: list[InForce]) -> None:
        """A checkpoint's schedule (`schedule` as saved): the same windows as the run that saved it."""
        if any(len(e.assignment) != self.size for e in schedule):
            raise ValueError(f"topic_batches: the checkpoint's cluster assignments are not of the {self.size} "
                             "training examples")  # fmt: skip
        self.schedule = sorted(schedule, key=lambda e: e.start)

    def __len__(self) -> int:
        return self.size // self.window * self.window

    def __iter__(self) -> Iterator[int]:
        for window in self._epoch_windows(track=True):
            yield from window

    def epoch_windows(self) -> list[list[int]]:
        """This epoch's windows, in order, as the iterator draws them (without counting them as read)."""
        return list(self._epoch_windows(track=False))

    def _epoch_windows(self, track: bool) -> Iterator[list[int]]:
        epoch, full = self.epoch, self.size // self.window
        if track:
            self.read = (epoch, 0)
        drawn: list[list[int]] = []
        drawn_with: InForce | None = None
        for position in range(full):
            in_force = self._in_force(epoch, position)
            if in_force is not drawn_with:  # the epoch's start, or a re-clustering from this window on
                used = {i for w in drawn[:position] for i in w}
                left = torch.tensor([i for i in range(self.size) if i not in used], dtype=torch.long)
                seed = self.seed + epoch if position == 0 else (self.seed + epoch) * 2**20 + position
                generator = torch.Generator().manual_seed(seed)
                drawn = drawn[:position] + self._draw(left, full - position, in_force.assignment, generator)
                drawn_with = in_force
            if track:
                self.read = (epoch, position + 1)
            yield drawn[position]

    def _in_force(self, epoch: int, position: int) -> InForce:
        """The latest entry of the schedule from (epoch, position) or before (the first, before any)."""
        return max((e for e in self.schedule if e.start <= (epoch, position)), key=lambda e: e.start,
                   default=self.schedule[0])  # fmt: skip

    def _draw(self, indices: Tensor, full: int, assignment: Tensor, generator: torch.Generator) -> list[list[int]]:
        """`full` windows from the rows `indices` under `assignment`, as the class docstring says."""
        inside = self.from_cluster
        permutation = indices[torch.randperm(len(indices), generator=generator)]
        members: dict[int, list[int]] = {}
        for index, cluster in zip(permutation.tolist(), assignment[permutation].tolist()):
            members.setdefault(cluster, []).append(index)
        chunks, pooled = [], []
        for cluster in sorted(members):
            taken, left = self._chunks(members[cluster], inside)
            chunks += taken
            pooled += left
        pure = len(chunks)
        chunks += self._chunks(pooled, inside)[0]
        order = torch.randperm(pure, generator=generator).tolist()
        chunks = [chunks[i] for i in order] + chunks[pure:]  # one-cluster chunks first, in a random order
        self.mixed_windows = max(0, full - pure)
        if self.mixed_windows:
            logger.warning("topic batches: %d of %d windows mix clusters (too few clusters of %d rows or more)",
                           self.mixed_windows, full, inside)  # fmt: skip
        chunks, used = chunks[:full], {i for chunk in chunks[:full] for i in chunk}
        chunks += [[] for _ in range(full - len(chunks))]  # too few chunks (repeated texts): windows of random rows
        spare = torch.tensor([i for i in permutation.tolist() if i not in used], dtype=torch.long)
        queue = deque(spare[torch.randperm(len(spare), generator=generator)].tolist())  # the random share's rows
        windows = [chunk + self._take(queue, self.window - len(chunk), self._texts(chunk)) for chunk in chunks]
        return [w for w in windows if len(w) == self.window] + self._fill(windows, list(queue))

    def epoch_order(self) -> list[int]:
        """The indices of this epoch, in order (len(self) of them)."""
        return list(self)

    def _texts(self, indices: list[int]) -> set[int]:
        return set().union(*(self.rows[i] for i in indices)) if self.rows is not None else set()

    def _take(self, queue: deque[int], count: int, seen: set[int]) -> list[int]:
        """Up to `count` indices from the front of `queue` (removed from it) adding no text to `seen`; the indices
        passed over stay at the front, in order. Costs the indices looked at, not the queue's length."""
        taken, passed = [], []
        while queue and len(taken) < count:
            index = queue.popleft()
            if self.rows is None or seen.isdisjoint(self.rows[index]):
                taken.append(index)
                if self.rows is not None:
                    seen |= self.rows[index]
            else:
                passed.append(index)
        queue.extendleft(reversed(passed))
        return taken

    def _chunks(self, indices: list[int], size: int) -> tuple[list[list[int]], list[int]]:
        """Chunks of `size` distinct-text indices cut greedily from `indices`; the indices no chunk took, in order."""
        chunks, queue = [], deque(indices)
        while len(queue) >= size:
            chunk = self._take(queue, size, set())
            if len(chunk) < size:
                queue.extendleft(reversed(chunk))
                break
            chunks.append(chunk)
        return chunks, list(queue)

    def _fill(self, windows: list[list[int]], queue: list[int]) -> list[list[int]]:
        """Windows that ran short of distinct texts, completed anyway (with a warning), keeping the count."""
        short = [w for w in windows if len(w) < self.window]
        if not short:
            return []
        logger.warning("topic batches: %d windows of %d hold a repeated text (too few distinct texts)",
                       len(short), self.window)  # fmt: skip
        out, queue = [], queue + [index for window in windows for index in window]  # never runs dry
        for window in short:
            need = self.window - len(window)
            out.append(window + queue[:need])
            queue = queue[need:]
        return out
