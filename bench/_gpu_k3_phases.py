"""What runs in each phase's process of `bench/gpu_k3.py` (see its docstring): the synthetic world, the
forward check, and the training runs with their anchor search. `gpu_k3.py --role ...` calls these; the
parent judges what they write (`world/world.json`, `forward.json`, `train-LABEL.json` in the work folder).
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import statistics
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30
SEED = 0

# The synthetic task (`synthetic_rollouts`).
CYCLE = tuple(11 + 13 * i for i in range(8))      # ordinary token ids in both profiles' vocabularies
PEAK_LOGIT = 16.0                                 # the teacher's logit of the next cycle token
TAP_NOISE = 0.1
HEAD_STD = 0.02                                   # the teacher's rows, as `init`'s matrices, except:
HEAD_REACH = 2 * PEAK_LOGIT                       # a head row's std x hidden: what a draft row can score

# The forward check's variants on the device: (name, bf16 autocast, parameter dtype); the parent judges them
# (gpu_k3.forward_checks). Serving keeps RoPE's frequencies in float32 (`from_pretrained(dtype=bfloat16)`
# does, and vLLM's cos/sin cache is float32); `model.to(torch.bfloat16)` casts the draft's
# `rotary_emb.inv_freq` buffer too, which is reported.
BF16_CAST_ROPE = "bf16 weights, RoPE frequencies cast too (model.to(bfloat16); reported)"
FORWARD_VARIANTS = (("float32", False, "float32"), ("bf16 autocast (training)", True, "float32"),
                    (BF16_CAST_ROPE, False, "bfloat16"), ("bf16 weights (serving)", False, "bfloat16"))
FINGERPRINT_SAMPLES = 256     # elements sampled per tensor to compare weights across runs


@dataclass(frozen=True)
class Scale:
    """The sizes of one mode: the K3 run on a GPU, or `--small` (the tiny profile, for the CPU test)."""

    name: str
    profile: str              # `init --profile`
    sequences: int            # rollouts in the synthetic data
    length: int               # tokens per sequence
    prompt: int               # unsupervised tokens at the start of each
    anchors: int              # --anchors
    loss_chunk: int           # --loss-chunk
    batch_size: int           # sequences per step (per rank = global at world size 1)
    steps: int
    lr: float
    warmup: int
    check_context: int        # context rows of the forward check
    max_probes: int           # steps the anchor search may take
    budget_s: float           # default --budget-s
    estimates: Mapping[str, float] = field(default_factory=dict)   # seconds per phase, to plan the budget

    @property
    def anchor_capacity(self) -> int:
        """Anchors a sequence has: positions whose token and next token are both supervised."""
        return self.length - self.prompt - 1


K3 = Scale("kimi-k3", "kimi-k3", sequences=2, length=4096, prompt=64, anchors=512, loss_chunk=409, batch_size=1,
           steps=8, lr=3e-4, warmup=2, check_context=256, max_probes=6, budget_s=450,
           estimates={"world": 90, "forward": 50, "plain": 80, "fsdp": 80, "smoke": 60})
SMALL = Scale("small", "tiny", sequences=4, length=96, prompt=8, anchors=16, loss_chunk=24, batch_size=1,
              steps=6, lr=3e-3, warmup=1, check_context=48, max_probes=6, budget_s=600,
              estimates={"world": 8, "forward": 8, "plain": 12, "fsdp": 15, "smoke": 60})


# ============================================================================ the world (child process)


def world_paths(workdir: Path) -> dict[str, Path]:
    world = workdir / "world"
    return {"root": world, "teacher": world / "teacher", "base": world / "base", "data": world / "data",
            "stamp": world / "world.json"}


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Write atomically: the parent may read while a child is ended mid-write."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(path)


def sample_indices(name: str, numel: int) -> Any:
    import torch

    generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randint(numel, (min(FINGERPRINT_SAMPLES, numel),), generator=generator)


def fingerprint(tensors: Iterable[tuple[str, Any]]) -> dict[str, list[float]]:
    """Name -> the values at fixed pseudo-random positions (the same positions in every run)."""
    return {name: tensor.reshape(-1)[sample_indices(name, tensor.numel())].float().tolist()
            for name, tensor in tensors}


def teacher_rows(vocab: int, hidden: int, seed: int, std: float = HEAD_STD) -> Any:
    """`[vocab, hidden]` N(0, std) in bf16, drawn a slab of rows at a time, each slab from a generator of its
    own (seeded from `seed` and the slab), on every core (torch's sampling releases the GIL; one core draws
    about 10^8 a second, and K3's head is 1.2 x 10^9)."""
    import torch

    out = torch.empty(vocab, hidden, dtype=torch.bfloat16)
    slab = 4096

    def draw(start: int) -> None:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + start)
        rows = out[start:start + slab]
        rows.copy_(torch.empty(rows.shape).normal_(0.0, std, generator=generator))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(draw, range(0, vocab, slab)))
    return out


def write_teacher(folder: Path, config: Mapping[str, Any]) -> Any:
    """A teacher folder holding only what training reads of a target: config, embedding, final norm, lm_head.

    The head's rows have std HEAD_STD, or HEAD_REACH / hidden where that is larger: a draft's final-normed row
    (norm about sqrt(hidden)) scores at most std x hidden on a head row, and must reach the teacher's peak
    logit to learn its distribution (K3's 0.02 x 7,168 = 143 does; the tiny profile's 0.02 x 64 = 1.3 would
    not). Returns the lm_head (bf16), which the data's final hidden states are built from.
    """
    import torch
    from safetensors.torch import save_file

    vocab, hidden = config["vocab_size"], config["target_hidden_size"]
    embedding = teacher_rows(vocab, hidden, SEED + 1)
    head = teacher_rows(vocab, hidden, SEED + 2, std=max(HEAD_STD, HEAD_REACH / hidden))
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "num_hidden_layers": config["target_num_hidden_layers"], "vocab_size": vocab, "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "_note": "a synthetic teacher head for bench/gpu_k3.py: no decoder layers"}, indent=1) + "\n")
    save_file({"model.embed_tokens.weight": embedding, "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
               "lm_head.weight": head}, str(folder / "model.safetensors"))
    return head


def synthetic_rollouts(config: Mapping[str, Any], scale: Scale, head: Any) -> list[Any]:
    """The learnable task: tokens cycle through CYCLE; each position's taps encode its token (plus noise),
    and its final hidden state gives the next token of the cycle a logit of PEAK_LOGIT (98% of the teacher's
    probability at K3's width, whose other logits are ~N(0, 0.19))."""
    import torch

    from dspark_hub.train.target.generate import Rollout

    taps, hidden = config["num_target_layers"], config["target_hidden_size"]
    generator = torch.Generator().manual_seed(SEED + 3)
    cycle = torch.tensor(CYCLE)
    rows = head[cycle].float()
    # final @ head[t] == PEAK_LOGIT for the next token t; other logits ~ N(0, PEAK_LOGIT / sqrt(hidden))
    next_rows = torch.roll(PEAK_LOGIT * rows / rows.pow(2).sum(-1, keepdim=True), -1, dims=0)
    tap_rows = torch.randn(len(CYCLE), taps * hidden, generator=generator)
    rollouts = []
    for index in range(scale.sequences):
        phase = (torch.arange(scale.length) + index) % len(CYCLE)
        noise = TAP_NOISE * torch.randn(scale.length, taps * hidden, generator=generator)
        rollouts.append(Rollout(index, "synthetic-cycle", cycle[phase], scale.prompt,
                                (tap_rows[phase] + noise).to(torch.bfloat16), next_rows[phase].to(torch.bfloat16)))
    return rollouts


def write_data(folder: Path, rollouts: list[Any], teacher: Path, config: Mapping[str, Any]) -> None:
    """A rollouts folder as `dspark-hub rollouts` writes it (one shard, a manifest with every setting the readers
    check: the draft's taps, widths and vocabulary; no prompts file, so its digest is the empty file's)."""
    import hashlib

    from dspark_hub.train.data.rollouts import SCHEMA, shard_name, write_manifest, write_shard

    folder.mkdir(parents=True)
    write_shard(folder / shard_name(0), rollouts)
    settings = {"teacher": str(teacher), "mode": "synthetic", "prompts_sha256": hashlib.sha256(b"").hexdigest(),
                "max_new_tokens": 0, **{key: config[key] for key in ("target_layer_ids", "target_hidden_size",
                                                                    "target_num_hidden_layers", "vocab_size")}}
    write_manifest(folder, {"schema": SCHEMA, "settings": settings, "teacher": {"label": f"{teacher.name} (synthetic)"},
                            "shards": [{"file": shard_name(0), "sequences": [r.entry() for r in rollouts]}]})


def world_bytes(config: Mapping[str, Any], scale: Scale) -> int:
    """Disk the world takes: teacher (embedding + head, bf16), draft (bf16), data (bf16 states)."""
    from dspark_hub.format import contract

    width = config["target_hidden_size"]
    teacher = 2 * config["vocab_size"] * width * 2
    data = scale.sequences * scale.length * (config["num_target_layers"] + 1) * width * 2
    return teacher + contract.expected_file_size(dict(config)) + data


def build_world(workdir: Path, scale: Scale) -> dict[str, Any]:
    """Teacher head, draft, data, and the draft's fingerprint; reused when `world.json` says the same scale."""
    import torch

    from dspark_hub import init_checkpoint, parameter_counts
    from dspark_hub.format import contract

    paths = world_paths(workdir)
    if paths["stamp"].is_file():
        stamp = json.loads(paths["stamp"].read_text())
        if stamp.get("scale") == scale.name:
            print(f"world: reusing {paths['root']}")
            return dict(stamp, reused=True)
        raise SystemExit(f"world: {paths['root']} holds a {stamp.get('scale')} world; pass another --workdir")
    config = contract.profile_config(scale.profile)
    need = world_bytes(config, scale)
    workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(workdir).free
    if free < need * 1.1:
        raise SystemExit(f"world: {workdir} has {free / GIB:.1f} GiB free; the world needs {need / GIB:.1f} GiB "
                         "(pass --workdir on a larger disk)")
    if paths["root"].exists():
        shutil.rmtree(paths["root"])   # an unfinished world (no stamp) from an earlier, ended run
    started = time.perf_counter()
    head = write_teacher(paths["teacher"], config)
    print(f"world: teacher head {config['vocab_size']:,} x {config['target_hidden_size']:,} "
          f"({time.perf_counter() - started:.1f} s)", flush=True)
    init_checkpoint(paths["base"], profile=scale.profile, seed=SEED, embed_from=paths["teacher"])
    print(f"world: draft `init --profile {scale.profile}` ({time.perf_counter() - started:.1f} s)", flush=True)
    write_data(paths["data"], synthetic_rollouts(config, scale, head), paths["teacher"], config)
    from safetensors import safe_open

    with safe_open(str(paths["base"] / contract.WEIGHTS_NAME), framework="pt") as handle:
        prints = fingerprint((name, handle.get_tensor(name)) for name in handle.keys())  # noqa: SIM118
    stamp = {"scale": scale.name, "profile": scale.profile, "parameters": parameter_counts(config).to_dict(),
             "bytes": need, "seconds": time.perf_counter() - started, "fingerprint": prints,
             "frozen": list(contract.FROZEN_TENSORS), "torch": torch.__version__}
    write_json(paths["stamp"], stamp)
    print(f"world: {need / GIB:.1f} GiB in {paths['root']} ({stamp['seconds']:.1f} s)")
    return stamp


# ============================================================================ the forward check (child process)


def synchronize(device: Any) -> None:
    """Wait for the device's queued work, so that a timer read next measures it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reserved_bytes(device: Any) -> int | None:
    """What the CUDA caching allocator holds (it keeps its high-water mark until emptied); None on CPU."""
    import torch

    return int(torch.cuda.memory_reserved(device)) if device.type == "cuda" else None


def describe_device(device: Any) -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
                            "python": platform.python_version()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        nccl = torch.cuda.nccl.version()
        info.update(name=props.name, total_memory_bytes=int(props.total_memory),
                    capability=f"{props.major}.{props.minor}",
                    nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl))
    else:
        info.update(name=f"CPU ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)")
    return info


def relative_error(got: Any, want: Any) -> float:
    """`||got - want|| / ||want||` in float32 (NaN when either holds a NaN, which fails every tolerance)."""
    got, want = got.float().cpu(), want.float().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def forward_inputs(rollout: Any, scale: Scale) -> tuple[Any, Any, Any]:
    """The first `check_context` positions of a sequence, and four anchors among them."""
    import torch

    rows = scale.check_context
    anchors = sorted({rows // 8, rows // 3, rows // 2, rows - 8})
    return rollout.aux_hidden_states[None, :rows], rollout.input_ids[None, :rows], torch.tensor([anchors])


def teacher_forced(model: Any, context: Any, ids: Any, anchors: Any, head: Any, *, autocast: bool) -> tuple[Any, Any]:
    """The draft's last hidden rows and logits (with the Markov bias) for every anchor's block."""
    import torch

    from dspark_hub.train.finetuning.config import default

    with torch.no_grad(), torch.autocast(context.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model.teacher_forced(context, ids, anchors, block_size=default("block_size"), lm_head_weight=head)
    return out.last_hidden_state, out.logits


def compare_forward(got: tuple[Any, Any], want: tuple[Any, Any], seconds: float) -> dict[str, Any]:
    """Relative L2 errors of the last hidden rows and of the logits, and how often the top-1 tokens agree
    (the parent judges them: `gpu_k3.forward_checks`)."""
    top1 = float((got[1].argmax(-1).cpu() == want[1].argmax(-1)).float().mean())
    return {"hidden": relative_error(got[0], want[0]), "logits": relative_error(got[1], want[1]),
            "top1_agreement": top1, "seconds": seconds}


def forward_check(workdir: Path, scale: Scale, device_name: str) -> dict[str, Any]:
    """The draft's forward on the device (float32, bf16 autocast, bf16 weights) against float32 on the CPU."""
    import torch

    from dspark_hub.modeling import load_checkpoint
    from dspark_hub.train.data.rollouts import RolloutData
    from dspark_hub.train.target.target import Target

    torch.set_float32_matmul_precision("highest")   # IEEE float32 matrix products on the device too (no TF32)
    paths = world_paths(workdir)
    device = torch.device(device_name)
    started = time.perf_counter()
    model = load_checkpoint(paths["base"], dtype=torch.float32).model.eval()
    head = Target.open(paths["teacher"]).lm_head().float()
    context, ids, anchors = forward_inputs(RolloutData(paths["data"])[0], scale)
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    reference = teacher_forced(model, context.float(), ids, anchors, head, autocast=False)
    doc: dict[str, Any] = {"device": describe_device(device), "load_seconds": loaded,
                           "reference_seconds": time.perf_counter() - started, "context_rows": int(ids.shape[1]),
                           "anchors": anchors[0].tolist(), "variants": {}}
    print(f"forward: float32 on the CPU, {len(doc['anchors'])} anchors over {doc['context_rows']} context rows "
          f"({doc['reference_seconds']:.1f} s)", flush=True)
    model.to(device)
    on_device = [t.to(device) for t in (context, ids, anchors, head)]
    rope = model.rotary_emb.inv_freq.detach().clone()   # float32, on the device
    for name, autocast, dtype_name in FORWARD_VARIANTS:
        started = time.perf_counter()
        dtype = getattr(torch, dtype_name)
        try:
            model.to(dtype)
            if name != BF16_CAST_ROPE:
                model.rotary_emb.inv_freq = rope
            doc["variants"][name] = result = device_forward(model, on_device, reference, dtype, autocast=autocast)
        except Exception as exc:   # one variant's failure (a kernel refusing a dtype) must not hide the others'
            doc["variants"][name] = {"error": f"{type(exc).__name__}: {exc}"[:500], "ok": False,
                                     "seconds": time.perf_counter() - started}
            print(f"forward: {name} on {device}: FAILED {doc['variants'][name]['error']}", flush=True)
            continue
        print(f"forward: {name} on {device}: hidden {result['hidden']:.2e}, logits {result['logits']:.2e}, "
              f"top-1 agreement {result['top1_agreement']:.2f}", flush=True)
    return doc


def device_forward(model: Any, on_device: list[Any], reference: tuple[Any, Any], dtype: Any, *,
                   autocast: bool) -> dict[str, Any]:
    """One timed forward on the device (synchronized before and after), compared with the CPU's."""
    context, ids, anchors, head = on_device
    device = context.device
    synchronize(device)
    started = time.perf_counter()
    got = teacher_forced(model, context.to(dtype), ids, anchors, head.to(dtype), autocast=autocast)
    synchronize(device)
    return compare_forward(got, reference, time.perf_counter() - started)


# ============================================================================ training (child process)


class StepClock:
    """The trainer's progress callback: each step's wall time, read after the device has finished the step
    (synchronized), and the allocator's reserved bytes then."""

    def __init__(self) -> None:
        self.device: Any = None
        self.marks: list[dict[str, Any]] = []
        self.last = time.perf_counter()

    def start(self) -> None:
        synchronize(self.device)
        self.last = time.perf_counter()

    def __call__(self, done: int) -> None:
        synchronize(self.device)
        now = time.perf_counter()
        self.marks.append({"wall_seconds": now - self.last, "reserved_bytes": reserved_bytes(self.device)})
        self.last = now


@dataclass
class Probe:
    """One step of the anchor search."""

    anchors: int
    fits: bool
    seconds: float
    peak_bytes: int | None = None
    reserved_bytes: int | None = None
    error: str | None = None
    fatal: bool = False       # an error other than running out of memory: the search stops there


@dataclass
class SearchResult:
    """The largest --anchors whose step ran (`fits`) and the smallest that did not (`fails`, None: none did)."""

    start: int
    capacity: int
    fits: int
    fails: int | None
    probes: list[Probe]
    stopped: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "probes": [asdict(p) for p in self.probes]}


def search_anchors(probe: Callable[[int], Probe], *, start: int, start_seconds: float, capacity: int,
                   max_probes: int, time_left: Callable[[], float], recovers: bool) -> SearchResult:
    """Doubling from `start` (which ran) up to `capacity` (every anchor a sequence has), then halving the gap
    after the first failure, until the gap is under 1/16 of the fit, `max_probes` steps were taken, or the
    next step would not finish in `time_left()` (estimated from the largest step that ran, as if its time
    grew with the square of the anchors, as attention's does). With `recovers` False a failure ends it (a
    torch whose FSDP2 cannot reset after an exception)."""
    fits, fails = min(start, capacity), None
    base_anchors, base_seconds = fits, start_seconds
    probes: list[Probe] = []
    while True:
        if fails is None and fits >= capacity:
            stopped = f"every anchor of the sequence ({capacity}) fits"
            break
        if fails is not None and fails - fits <= max(1, fits // 16):
            stopped = "converged"
            break
        if len(probes) >= max_probes:
            stopped = f"{max_probes} probes taken"
            break
        candidate = min(2 * fits, capacity) if fails is None else (fits + fails) // 2
        if time_left() < base_seconds * (candidate / base_anchors) ** 2:
            stopped = f"budget: a step at {candidate} anchors would not finish in time"
            break
        result = probe(candidate)
        probes.append(result)
        if result.fatal:
            stopped = f"error at {candidate} anchors: {result.error}"
            break
        if result.fits:
            fits, base_anchors, base_seconds = candidate, candidate, result.seconds
        else:
            fails = candidate
            if not recovers:
                stopped = "a step failed, and this torch's FSDP2 cannot reset after it (no reset_iter_state)"
                break
    return SearchResult(start, capacity, fits, fails, probes, stopped)


def recover(trainer: Any, device: Any) -> None:
    """After a step ended in an out-of-memory error: reset FSDP2's iteration state (torch >= 2.13), drop the
    partial gradients, free what the failed step held, and restart the peak count."""
    import torch

    reset = getattr(trainer.module, "reset_iter_state", None)
    if reset is not None:
        reset()
    trainer.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def trainer_probe(trainer: Any, first_step: int) -> Callable[[int], Probe]:
    """A probe that runs one real training step at `anchors`. Out of memory: it does not fit. Another error
    (a shape the kernels refuse, an index past int32) is a finding: printed with its traceback, it ends the
    search and fails the run's search check."""
    import torch

    device = trainer.device
    local_step = [first_step]

    def probe(anchors: int) -> Probe:
        trainer.config.max_anchors = anchors
        synchronize(device)
        started = time.perf_counter()
        error, fatal = None, False
        try:
            entry = trainer.train_step(trainer.data, local_step[0])
        except torch.cuda.OutOfMemoryError as exc:   # the traceback (and the step's tensors) go with the block
            error = (str(exc).strip().splitlines() or ["out of memory"])[0][:300]
        except Exception as exc:
            traceback.print_exc(file=sys.stdout)
            error, fatal = f"{type(exc).__name__}: {exc}"[:300], True
        local_step[0] += 1
        if error is not None:
            recover(trainer, device)
            print(f"search: {anchors} anchors: {'FAILED' if fatal else 'out of memory'} ({error})", flush=True)
            return Probe(anchors, False, time.perf_counter() - started, error=error, fatal=fatal)
        synchronize(device)
        result = Probe(anchors, True, time.perf_counter() - started, int(entry["peak_memory_bytes"]),
                       reserved_bytes(device))
        print(f"search: {anchors} anchors: fits, {result.seconds:.2f} s, peak {result.peak_bytes / GIB:.2f} GiB",
              flush=True)
        return result

    return probe


def simulate_oom(trainer: Any, spec: str) -> None:
    """`forward:N` / `backward:N`: a step with more than N anchors raises CUDA's out-of-memory error in the
    last decoder layer's forward, or in the backward through it (after FSDP2 has gathered that layer)."""
    import torch

    where, _, limit = spec.partition(":")

    def raise_oom(*_: Any) -> None:
        raise torch.cuda.OutOfMemoryError(f"simulated: {where} of a step with more than {limit} anchors")

    def pre_hook(module: Any, args: tuple[Any, ...]) -> None:
        if trainer.config.max_anchors <= int(limit):
            return
        if where == "forward":
            raise_oom()
        if args[0].requires_grad:
            args[0].register_hook(raise_oom)

    trainer.model.layers[-1].register_forward_pre_hook(pre_hook)


def step_records(trainer: Any, clock: StepClock) -> list[dict[str, Any]]:
    """The trainer's log entries with the clock's synchronized wall time and reserved bytes, and the
    distillation loss: the loss without its confidence term (`loss` weights x `ce`, `kl`, `tv`)."""
    keys = ("step", "loss", "ce", "kl", "tv", "confidence", "tokens", "step_seconds", "peak_memory_bytes",
            "grad_norm", "lr", "accuracy")
    log = [json.loads(line) for line in trainer.log_text().splitlines() if line.strip()]
    return [{**{k: entry[k] for k in keys if k in entry}, **mark,
             "distillation": sum(weight * entry[term] for term, weight in trainer.config.loss.items())}
            for entry, mark in zip(log, clock.marks, strict=False)]


def train_run(workdir: Path, scale: Scale, device_name: str, label: str, *, fsdp: bool, deadline: float,
              simulate: str | None) -> None:
    """`finetune`'s Trainer on the synthetic world: steps, the weights' fingerprint, the anchor search.

    Writes `train-LABEL.json` after each part, so an ended run still reports what it measured.
    """
    import torch.distributed as dist

    from dspark_hub.train import TrainConfig, Trainer
    from dspark_hub.train.finetuning.checkpointer import full_model_state

    paths = world_paths(workdir)
    config = TrainConfig(base=str(paths["base"]), out=str(workdir / f"out-{label}"), data=str(paths["data"]),
                         target=str(paths["teacher"]), steps=scale.steps, batch_size=scale.batch_size,
                         max_anchors=scale.anchors, loss_chunk=scale.loss_chunk, dtype="bfloat16", lr=scale.lr,
                         warmup=scale.warmup, seed=SEED, fsdp=fsdp, device=device_name, force=True)
    started = time.perf_counter()
    clock = StepClock()
    trainer = Trainer(config, clock)
    clock.device = trainer.device
    doc: dict[str, Any] = {"label": label, "fsdp": fsdp, "world_size": trainer.world,
                           "device": describe_device(trainer.device), "setup_seconds": time.perf_counter() - started,
                           "settings": {k: config.to_dict()[k] for k in ("steps", "batch_size", "max_anchors",
                                                                          "loss_chunk", "dtype", "lr", "warmup",
                                                                          "loss", "alpha")},
                           "parameters": dict(zip(("trained", "frozen"), trainer.parameter_counts, strict=True))}
    save = (lambda: write_json(workdir / f"train-{label}.json", doc)) if trainer.rank == 0 else (lambda: None)
    save()
    print(f"{label}: Trainer ready on {trainer.device}, world size {trainer.world} ({doc['setup_seconds']:.1f} s)",
          flush=True)
    clock.start()
    trainer.run_steps(trainer.data, 0, scale.steps)
    doc["steps"] = step_records(trainer, clock)
    doc["plan"] = trainer.plan.to_dict() if trainer.plan else None
    for step in doc["steps"]:
        print(f"{label}: step {step['step']}: loss {step['loss']:.4f} (distillation {step['distillation']:.4f}, "
              f"confidence {step.get('confidence', 0.0):.4f}), {step['wall_seconds']:.2f} s, "
              f"peak {step['peak_memory_bytes'] / GIB:.2f} GiB", flush=True)
    save()
    state = full_model_state(trainer.module, trainer.model, trainer.rank, sharded=fsdp and dist.is_initialized())
    if state is not None:
        doc["fingerprint"] = fingerprint(state.items())
    del state
    save()
    if simulate:
        simulate_oom(trainer, simulate)
    seconds = statistics.median(m["wall_seconds"] for m in clock.marks[1:] or clock.marks)
    search = search_anchors(trainer_probe(trainer, scale.steps), start=scale.anchors, start_seconds=seconds,
                            capacity=scale.anchor_capacity, max_probes=scale.max_probes,
                            time_left=lambda: deadline - time.time(), recovers=not fsdp
                            or hasattr(trainer.module, "reset_iter_state"))
    doc["search"] = search.to_dict()
    save()
    print(f"{label}: largest --anchors that fits: {search.fits} ({search.stopped})", flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
