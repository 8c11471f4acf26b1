#!/usr/bin/env python3
"""PyTorch FSDP2 side of the fsdpx-vs-FSDP2 benchmark: gpt trained the way fsdpx-train trains it.

Run under torchrun, one process per rank:

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 benchmarks/vs_fsdp2/gpt_fsdp2.py \
        --size tiny --data tokens.bin --steps 5 --sharding full_shard --precision fp32 \
        --optimizer sgd --init-from runs/x/init --out fsdp2.jsonl

What is mirrored from fsdpx (the file each piece follows, relative to the repository root):
  - the model: plugins/model/gpt/gpt.cpp, op for op and with the same parameter names, so that
    fsdpx's --save-init file loads with load_state_dict as it is;
  - the seeded initialisation (without --init-from): framework/engine/src/sharded_param.cpp and
    sdk/src/seeds.cpp (each whole parameter drawn from its own generator seeded with
    parameter_seed(seed, name));
  - the data: plugins/data/tokens/tokens.cpp and sdk/src/sampler.cpp (the global
    batch sampler, Fisher-Yates per epoch from the same --seed);
  - the step and its figures: framework/trainer/src/trainer.cpp and metrics.cpp (loss = mean over
    ranks of each rank's loss, summed in rank order; peak RSS from VmHWM, reset every step;
    bytes per collective counted as the logical payload of a group of more than one rank);
  - the lr schedule: framework/trainer/src/lr_schedule.cpp;
  - where the step goes: framework/runtime/src/step_clock.cpp's phases, marked the same way (the
    host's clock on the CPU, timing events on the compute stream on CUDA) around the forward,
    the backward, the optimizer, FSDP2's waits for its all-gathers (FSDPParamGroup.wait_for_unshard,
    and an all-gather that blocks at issue) and for its reductions (a reduce-scatter or all-reduce
    that blocks at issue, as Gloo's do, and FSDPParamGroup._wait_for_post_backward).

Checkpoints (tests/hf/dcp_interop_test.py): --resume-dcp goes on from fsdpx's sharded checkpoint
(or any folder DCP's safetensors layer reads) through dcp.load, and --save-dcp writes the model and
the optimizer's state through dcp.save, as docs/checkpoints.md shows a PyTorch loop doing it.

Device: --device cpu uses Gloo (tested). --device cuda uses NCCL with one GPU per local rank;
that path is written but could not be tested where this was written (a CPU-only machine).
"""
import argparse
import array
import json
import math
import os
import resource
import sys
import time
import types

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed._composable import checkpoint
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

MASK64 = (1 << 64) - 1

# --- the model: plugins/model/gpt/gpt.cpp -------------------------------------------------------

PRESETS = {  # dim, layers, heads, vocab, seq, ffn_hidden (0: the rule)
    "tiny": (64, 2, 4, 256, 64, 0),
    "small": (256, 4, 8, 256, 128, 0),
    "1b": (2048, 16, 32, 32000, 2048, 0),
    "7b": (4096, 32, 32, 32000, 4096, 11008),
}


def model_config(a):
    dim, layers, heads, vocab, seq, ffn = PRESETS[a.size]
    dim, layers, heads = a.dim or dim, a.layers or layers, a.heads or heads
    vocab, seq, ffn = a.vocab or vocab, a.model_seq or seq, a.ffn_hidden or ffn
    if dim % heads != 0 or (dim // heads) % 2 != 0:
        raise SystemExit(f"dim {dim} must split into {heads} heads of an even size")
    if ffn == 0:  # Llama's rule: 2/3 of 4 x dim, rounded up to a multiple
        multiple = 256 if dim >= 1024 else 32
        ffn = (8 * dim // 3 + multiple - 1) // multiple * multiple
    return dict(dim=dim, layers=layers, heads=heads, vocab=vocab, seq=seq, ffn_hidden=ffn,
                tie_embeddings=a.tie_embeddings, rope_theta=10000.0, norm_eps=1e-5)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        # Normalised in fp32 whatever the compute dtype (as fsdpx's gpt and transformers' Llama do).
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate(x, cos, sin):
    half = x.size(-1) // 2
    x1, x2 = x.narrow(-1, 0, half), x.narrow(-1, half, half)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


# The linear layers of the Blocks: F.linear, or torchao's float8 with --precision float8
# (use_float8_linears). The output projection is F.linear always, as torchtitan's float8 filter.
linear = F.linear


def use_float8_linears(all_gather=False):
    """torchao's float8 training for the Blocks' linears: the autograd function behind
    torchao.float8's Float8Linear.forward, with its default config (tensorwise dynamic scaling,
    e4m3 inputs and weights, e5m2 output gradients) and the three products' configs a Float8Linear
    makes. The model keeps its parameters (gpt.cpp's names) instead of nn.Linear modules, so the
    function is called as Float8Linear.forward calls it, for the weights torchtitan's filter keeps
    (both sizes multiples of 16). With `all_gather` (torchao's enable_fsdp_float8_all_gather),
    returns the function that wraps a module's weight as Float8Linear.from_float does, for
    shard_model to apply before fully_shard."""
    global linear
    from torchao.float8.config import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor
    config = Float8LinearConfig(enable_fsdp_float8_all_gather=all_gather)
    mm_config = Float8Linear(16, 16, bias=False, config=config).linear_mm_config

    def wrap_weight(module, name):
        w = getattr(module, name)
        if w.shape[0] % 16 or w.shape[1] % 16:
            return
        setattr(module, name, nn.Parameter(
            WeightWithDynamicFloat8CastTensor(w, mm_config, config.cast_config_weight.target_dtype),
            requires_grad=w.requires_grad))

    def float8_linear(x, w):
        if w.shape[0] % 16 or w.shape[1] % 16:
            return F.linear(x, w)
        return matmul_with_hp_or_float8_args.apply(x, w.t(), mm_config, config)
    linear = float8_linear
    return wrap_weight


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.heads, self.theta = c["heads"], c["rope_theta"]
        d = c["dim"]
        self.wq = nn.Parameter(torch.empty(d, d))
        self.wk = nn.Parameter(torch.empty(d, d))
        self.wv = nn.Parameter(torch.empty(d, d))
        self.wo = nn.Parameter(torch.empty(d, d))

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        D = C // H

        def split(t):
            return t.view(B, T, H, D).transpose(1, 2)

        q, k, v = split(linear(x, self.wq)), split(linear(x, self.wk)), split(linear(x, self.wv))
        # The rotary tables in x's dtype, computed in forward as gpt.cpp does.
        inv = torch.reciprocal(torch.pow(self.theta, torch.arange(0, D, 2, dtype=x.dtype, device=x.device) / float(D)))
        angles = torch.outer(torch.arange(T, dtype=x.dtype, device=x.device), inv)
        cos, sin = angles.cos(), angles.sin()
        q = rotate(q, cos, sin)
        k = rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return linear(y.transpose(1, 2).reshape(B, T, C), self.wo)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(hidden, dim))
        self.w2 = nn.Parameter(torch.empty(dim, hidden))
        self.w3 = nn.Parameter(torch.empty(hidden, dim))

    def forward(self, x):
        return linear(F.silu(linear(x, self.w1)) * linear(x, self.w3), self.w2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c["dim"], c["norm_eps"])
        self.feed_forward = FeedForward(c["dim"], c["ffn_hidden"])

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class VocabTable(nn.Module):
    """A [vocab, dim] table: the weight of gpt.cpp's Embedding and Output."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab, dim))


class Embedding(VocabTable):
    def forward(self, tokens):
        return F.embedding(tokens, self.weight)


class Output(VocabTable):
    def forward(self, h):
        return F.linear(h, self.weight)


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.tok_embeddings = Embedding(c["vocab"], c["dim"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.norm = RMSNorm(c["dim"], c["norm_eps"])
        self.output = None if c["tie_embeddings"] else Output(c["vocab"], c["dim"])

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for block in self.layers:
            h = block(h)
        h = self.norm(h)
        return F.linear(h, self.tok_embeddings.weight) if self.output is None else self.output(h)


def loss_of(model, inputs, targets):
    # fsdpx's Gpt::loss: logits in fp32 whatever the compute dtype, mean over every token.
    logits = model(inputs).float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


# --- seeds and initialisation: sdk/src/seeds.cpp, Gpt::init_parameter -----------------


def parameter_seed(seed, name):
    """FNV-1a over the name, then splitmix64 with the seed (64-bit arithmetic)."""
    h = 1469598103934665603
    for c in name.encode():
        h = ((h ^ c) * 1099511628211) & MASK64
    z = h ^ ((seed + 0x9E3779B97F4A7C15) & MASK64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@torch.no_grad()
def seeded_init(model, seed):
    """fsdpx's world-size-invariant initialisation: each whole parameter drawn in fp32 on the CPU
    from a generator seeded with parameter_seed(seed, name)."""
    layers = model.config["layers"]
    for name, p in model.named_parameters():
        full = torch.empty(p.shape, dtype=torch.float32)
        gen = torch.Generator().manual_seed(parameter_seed(seed, name))
        if name.endswith("norm.weight"):
            full.fill_(1.0)
        elif name.endswith(".wo") or name.endswith(".w2"):
            full.normal_(0.0, 0.02 / math.sqrt(2.0 * layers), generator=gen)
        else:
            full.normal_(0.0, 0.02, generator=gen)
        if hasattr(p, "device_mesh"):  # a sharded DTensor: this rank's rows of the whole
            from torch.distributed.tensor import distribute_tensor
            p.to_local().copy_(distribute_tensor(full.to(p.device), p.device_mesh, p.placements,
                                                 src_data_rank=None).to_local())
        else:
            p.copy_(full)


def load_init(model, path):
    from safetensors.torch import load_file

    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    state = load_file(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"--init-from {path}: missing {sorted(missing)}, unexpected {sorted(unexpected)}")


# --- data: plugins/data/tokens/tokens.cpp, sdk/src/sampler.cpp ------------------------


class GlobalBatchSampler:
    """fsdpx's GlobalBatchSampler: each epoch a Fisher-Yates shuffle of 0..n-1 driven by
    parameter_seed(seed, "epoch/E/i"); step s of an epoch is order[s*G : (s+1)*G], of which rank r
    takes order[s*G + r*per : +per]."""

    def __init__(self, num_samples, global_batch, rank, world, seed):
        if global_batch > num_samples:
            raise SystemExit(f"the global batch ({global_batch}) is larger than the data set ({num_samples} samples)")
        self.n, self.G, self.rank, self.world, self.seed = num_samples, global_batch, rank, world, seed
        self.epoch, self.step = 0, 0
        self.shuffle()

    def shuffle(self):
        order = list(range(self.n))
        prefix = f"epoch/{self.epoch}/"
        for i in range(self.n - 1, 0, -1):
            j = parameter_seed(self.seed, prefix + str(i)) % (i + 1)
            order[i], order[j] = order[j], order[i]
        self.order = order

    def next(self):
        if self.step >= self.n // self.G:
            self.epoch += 1
            self.step = 0
            self.shuffle()
        per = self.G // self.world
        first = self.step * self.G + self.rank * per
        self.step += 1
        return self.order[first:first + per]


class Tokens:
    def __init__(self, path, dtype, seq):
        self.width = 2 if dtype == "uint16" else 4
        self.code = "H" if self.width == 2 else "I"
        if array.array(self.code).itemsize != self.width:
            raise SystemExit(f"this Python's array '{self.code}' is not {self.width} bytes")
        with open(path, "rb") as f:
            self.bytes = f.read()
        if len(self.bytes) % self.width:
            raise SystemExit(f"token file {path} is not a whole number of {self.width}-byte tokens")
        self.count, self.seq = len(self.bytes) // self.width, seq
        if self.count < seq + 1:
            raise SystemExit(f"token file {path} holds fewer than {seq + 1} tokens")

    def num_samples(self):
        return (self.count - 1) // self.seq

    def batch(self, indices):
        rows = []
        for i in indices:
            a = array.array(self.code)
            first = i * self.seq * self.width
            a.frombytes(self.bytes[first:first + (self.seq + 1) * self.width])
            rows.append(torch.tensor(a.tolist(), dtype=torch.int64))
        seqs = torch.stack(rows)
        return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


# --- the lr schedule: framework/trainer/src/lr_schedule.cpp --------------------------------------


def lr_at(a, step):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    if a.lr_schedule == "constant":
        return a.lr
    span = max(1, a.steps - a.warmup_steps)
    progress = min(1.0, (step - a.warmup_steps) / span)
    return a.lr * (a.min_lr_ratio + (1.0 - a.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


# --- memory: framework/trainer/src/metrics.cpp ---------------------------------------------------


def proc_memory():
    rss = hwm = -1
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, hwm


class AllocatorCount:
    """fsdpx's counting CPU allocator (framework/runtime/src/memory_accounting.cpp) through ctypes: the
    bytes LibTorch's CPU allocator hands out, now and at peak, measured as fsdpx-train measures them."""

    def __init__(self, lib_path):
        import ctypes
        self.lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL) if lib_path else None
        if self.lib:
            for f in ("fsdpx_cpu_allocated_bytes", "fsdpx_cpu_peak_allocated_bytes"):
                getattr(self.lib, f).restype = ctypes.c_int64
            self.lib.fsdpx_install_cpu_memory_accounting()

    def peak(self):
        return self.lib.fsdpx_cpu_peak_allocated_bytes() if self.lib else -1

    def reset(self):
        """Before each step: the peak restarts, and the block cache is trimmed as fsdpx-train trims it."""
        if self.lib:
            self.lib.fsdpx_trim_cpu_block_cache()
            self.lib.fsdpx_reset_cpu_peak_memory()


ALLOCATOR = None


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# --- bytes moved: FSDP2's collectives, counted by wrapping torch.distributed's functions ---------
# FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) calls dist.all_gather_into_tensor,
# dist.reduce_scatter_tensor and (HSDP) dist.all_reduce through the module attribute at every call,
# so wrapping them sees every one. Counted as fsdpx's CountingCommunicator counts (payload_bytes):
# the all-gather's output, the reduce-scatter's input, the all-reduce's tensor; a group of one
# rank moves nothing and is not counted (fsdpx has no communicator there).

ORIGINAL = {"all_gather_into_tensor": dist.all_gather_into_tensor,
            "reduce_scatter_tensor": dist.reduce_scatter_tensor,
            "all_reduce": dist.all_reduce}


class StepClock:
    """framework/runtime/src/step_clock.cpp in Python: marks on the compute stream's timeline, spans
    by phase, waits taken out of the pass they fall in, 'other' = the step less the rest."""
    PHASES = ("forward", "backward", "all_gather_wait", "reduce_scatter_wait", "optimizer", "other")

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.spans, self.outer, self.stepping = [], "step", False

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def seconds(self, a, b):
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def span(self, phase):
        clock = self

        class Span:
            def __enter__(self):
                self.outer_before = clock.outer
                if phase in ("forward", "backward", "optimizer"):
                    clock.outer = phase
                clock.stepping = clock.stepping or phase == "step"
                self.begin = clock.mark()

            def __exit__(self, *exc):
                if clock.stepping:
                    clock.spans.append((phase, clock.outer, self.begin, clock.mark()))
                clock.outer = self.outer_before
                if phase == "step":
                    clock.stepping = False
                return False

        return Span()

    def wrap(self, phase, fn):
        def timed(*args, **kwargs):
            with self.span(phase):
                return fn(*args, **kwargs)
        return timed

    def take(self):
        if self.cuda and self.spans:
            self.spans[-1][3].synchronize()
        total, inside = {}, {}
        for phase, outer, a, b in self.spans:
            d = self.seconds(a, b)
            total[phase] = total.get(phase, 0.0) + d
            if phase.endswith("_wait"):
                inside[outer] = inside.get(outer, 0.0) + d
        self.spans = []
        out = {p: total.get(p, 0.0) - inside.get(p, 0.0) for p in ("forward", "backward", "optimizer")}
        out["all_gather_wait"] = total.get("all_gather_wait", 0.0)
        out["reduce_scatter_wait"] = total.get("reduce_scatter_wait", 0.0)
        out["other"] = total.get("step", 0.0) - sum(out.values())
        return [out[p] for p in self.PHASES]

    def install(self):
        """FSDP2's waits: for an all-gather (wait_for_unshard) and for the reductions
        (_wait_for_post_backward); collectives that block at issue are timed by CommCounter."""
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        FSDPParamGroup.wait_for_unshard = self.wrap("all_gather_wait", FSDPParamGroup.wait_for_unshard)
        FSDPParamGroup._wait_for_post_backward = self.wrap("reduce_scatter_wait", FSDPParamGroup._wait_for_post_backward)


CLOCK = None  # the run's StepClock (main)


def blocking(phase, fn, async_op):
    """A collective that blocks the host at issue (async_op False) is a wait of the compute stream."""
    if async_op or CLOCK is None:
        return fn()
    with CLOCK.span(phase):
        return fn()


class CommCounter:
    def __init__(self):
        self.bytes = {"allgather_bytes": 0, "reduce_scatter_bytes": 0, "all_reduce_bytes": 0}
        self.on = False

    def _add(self, key, tensor, group):
        if self.on and dist.get_world_size(group) > 1:
            self.bytes[key] += tensor.numel() * tensor.element_size()

    def install(self):
        def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
            self._add("allgather_bytes", output_tensor, group)
            return blocking("all_gather_wait", lambda: ORIGINAL["all_gather_into_tensor"](
                output_tensor, input_tensor, group=group, async_op=async_op), async_op)

        def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
            self._add("reduce_scatter_bytes", input, group)
            return blocking("reduce_scatter_wait", lambda: ORIGINAL["reduce_scatter_tensor"](
                output, input, op=op, group=group, async_op=async_op), async_op)

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            self._add("all_reduce_bytes", tensor, group)
            return blocking("reduce_scatter_wait", lambda: ORIGINAL["all_reduce"](
                tensor, op=op, group=group, async_op=async_op), async_op)

        dist.all_gather_into_tensor = all_gather_into_tensor
        dist.reduce_scatter_tensor = reduce_scatter_tensor
        dist.all_reduce = all_reduce

    def take(self):
        out = dict(self.bytes)
        for k in self.bytes:
            self.bytes[k] = 0
        return out


# --- the run ------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("model (gpt; 0 keeps the preset's value)")
    g.add_argument("--size", choices=sorted(PRESETS), default="tiny")
    g.add_argument("--dim", type=int, default=0)
    g.add_argument("--layers", type=int, default=0)
    g.add_argument("--heads", type=int, default=0)
    g.add_argument("--vocab", type=int, default=0)
    g.add_argument("--model-seq", type=int, default=0, help="the model's context length (fsdpx --model.seq)")
    g.add_argument("--ffn-hidden", type=int, default=0)
    g.add_argument("--tie-embeddings", action="store_true")
    g = p.add_argument_group("data (fsdpx's tokens source)")
    g.add_argument("--data", required=True, help="a flat file of token ids")
    g.add_argument("--data-dtype", choices=["uint16", "uint32"], default="uint16")
    g.add_argument("--seq", type=int, default=0, help="tokens per sample (fsdpx --data.seq; 0: the model's context)")
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, default=8, help="samples per rank per micro-batch")
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--steps", type=int, default=10)
    g.add_argument("--seed", type=int, default=0, help="seed of the data order (and of the parameters without --init-from)")
    g.add_argument("--sharding", choices=["full_shard", "shard_grad_op", "no_shard"], default="full_shard")
    g.add_argument("--root-only", action="store_true",
                   help="no unit but the root: fully_shard on the model alone, FSDP's default (fsdpx --wrap.name root)")
    g.add_argument("--embedding-units", action="store_true",
                   help="tok_embeddings and output are units of their own, as torchtitan shards them "
                        "(fsdpx: --wrap.layer_types Block,Embedding,Output)")
    g.add_argument("--activation-checkpointing", action="store_true",
                   help="every Block recomputes its forward in backward (torch.distributed._composable's "
                        "checkpoint before fully_shard, as torchtitan; fsdpx: --activation-checkpointing Block)")
    g.add_argument("--precision", choices=["fp32", "bf16_mixed", "float8"], default="fp32",
                   help="float8: bf16_mixed with the Blocks' linears in torchao's float8")
    g.add_argument("--float8-all-gather", action="store_true",
                   help="with --precision float8: the Blocks' linear weights all-gathered in float8 "
                        "(torchao's enable_fsdp_float8_all_gather; fsdpx: --precision.float8_all_gather true)")
    g.add_argument("--optimizer", choices=["sgd", "adamw"], default="adamw")
    g.add_argument("--lr", type=float, default=None, help="peak lr (default: the optimizer's fsdpx default, 1e-2 sgd, 1e-3 adamw)")
    g.add_argument("--momentum", type=float, default=0.0)
    g.add_argument("--dampening", type=float, default=0.0)
    g.add_argument("--nesterov", action="store_true")
    g.add_argument("--weight-decay", type=float, default=None, help="default: 0 for sgd, 1e-2 for adamw (fsdpx's)")
    g.add_argument("--betas", default="0.9,0.999")
    g.add_argument("--eps", type=float, default=1e-8)
    g.add_argument("--lr-schedule", choices=["constant", "cosine"], default="constant")
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--min-lr-ratio", type=float, default=0.1)
    g.add_argument("--clip-grad-norm", type=float, default=0.0)
    g.add_argument("--init-from", default="", help="safetensors file, or a directory holding model.safetensors "
                   "(fsdpx-train --save-init); without it, fsdpx's seeded initialisation from --seed")
    g.add_argument("--resume-dcp", default="", metavar="DIR",
                   help="go on from a folder DCP's safetensors layer reads (fsdpx's sharded step-N, or --save-dcp's): "
                   "the model and the optimizer's state under fsdpx's names (optim/<p>/<key>) or DCP's flattened "
                   "ones (state.<p>.<key>); the step and the data position from its trainer_state.json (fsdpx's), "
                   "else the step from the optimizer's and the data from its beginning, as fsdpx-train --resume")
    g.add_argument("--save-dcp", default="", metavar="DIR",
                   help="after the last step, the model and the optimizer's state through dcp.save, under DCP's "
                   "flattened names (param_groups, not tensors, are left out: DCP's safetensors layer holds tensors)")
    g.add_argument("--save-dcp-way", default="hf",
                   help="hf: HuggingFaceStorageWriter(save_distributed=True); hf-consolidated: with "
                   "enable_consolidation; filesystem-safetensors: FileSystemWriter(serialization_format=SAFETENSORS); "
                   "several, comma-separated, each into DIR/<way>")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    g.add_argument("--out", default="", help="rank 0 writes one JSON line per step here")
    g.add_argument("--quiet", action="store_true", help="no per-step line on stdout")
    g.add_argument("--fsdpx-lib", default="", help="fsdpx's libfsdpx.so: count CPU memory with its counting allocator "
                   "(bytes allocated, as fsdpx-train reports them) from the first tensor on")
    a = p.parse_args(argv)
    a.save_dcp_ways = a.save_dcp_way.split(",")
    for way in a.save_dcp_ways:
        if way not in SAVE_WAYS:
            p.error(f"--save-dcp-way {way}: not one of {', '.join(SAVE_WAYS)}")
    if a.root_only and (a.embedding_units or a.activation_checkpointing):
        p.error("--root-only makes no unit but the root: drop --embedding-units and --activation-checkpointing")
    if a.lr is None:
        a.lr = 1e-2 if a.optimizer == "sgd" else 1e-3
    if a.weight_decay is None:
        a.weight_decay = 0.0 if a.optimizer == "sgd" else 1e-2
    return a


def shard_model(model, a, world, device_type):
    """fsdpx's strategies as FSDP2 calls: every Block a unit (fsdpx's layer_type wrap of Block),
    with --embedding-units tok_embeddings and output too (Block,Embedding,Output), the rest the root's;
    with --root-only no unit but the root (fsdpx's root wrap).

    full_shard:    fully_shard(reshard_after_forward=True) on every Block; the root as below.
    shard_grad_op: the same with reshard_after_forward=False (ZeRO-2: gathered once per step).
    no_shard:      fully_shard on a 2-D mesh (world, 1) named ("replicate", "shard"): HSDP with
                   shard groups of one rank, so parameters are whole on every rank and gradients
                   are all-reduced over "replicate" (DDP). This is FSDP2's public API; torch 2.11
                   also has a private replicate() built on FSDP2
                   (torch.distributed._composable.replicate_with_fsdp), left aside as private.
                   Parameters are kept gathered (reshard_after_forward=False): with one rank per
                   shard group there is nothing to free.
    """
    if a.sharding == "no_shard":
        mesh = init_device_mesh(device_type, (world, 1), mesh_dim_names=("replicate", "shard"))
        reshard = False
    else:
        mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
        reshard = a.sharding == "full_shard"
    if a.precision == "float8":
        wrap_weight = use_float8_linears(a.float8_all_gather)
        if a.float8_all_gather:
            # Each weight's shard cast to e4m3 before its all-gather (torchao's fsdp_pre_all_gather).
            # Its scale: the whole weight's amax, all-reduced (max) over the mesh in that hook, as
            # torchao does without precompute_float8_dynamic_scale_for_fsdp, which looks for
            # Float8Linear modules this model has none of; the scales are the same (the amax of
            # the fp32 shards, torchao's float64 division), one all-reduce per weight instead of one.
            for block in model.layers:
                for name in ("wq", "wk", "wv", "wo"):
                    wrap_weight(block.attention, name)
                for name in ("w1", "w2", "w3"):
                    wrap_weight(block.feed_forward, name)
    if a.precision in ("bf16_mixed", "float8"):
        # fsdpx's bf16_mixed defaults: param_dtype bf16, reduce_dtype fp32, cast_forward_inputs on,
        # and output_dtype fp32 for the model's output only (FSDP2 applies output_dtype to every
        # module's output that has the policy, so the Blocks get none: their bf16 output goes on
        # to the next unit as in fsdpx).
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=True)
        mp_root = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                       output_dtype=torch.float32, cast_forward_inputs=True)
    else:
        mp = mp_root = MixedPrecisionPolicy()
    units = [] if a.root_only else list(model.layers)
    if a.embedding_units:  # torchtitan's: the embedding and the output projection on their own
        if model.output is None:
            raise SystemExit("--embedding-units needs untied embeddings (the output projection uses the embedding)")
        units = [model.tok_embeddings] + units + [model.output]
    if a.activation_checkpointing:  # each Block's saved tensors: its input alone, the rest recomputed
        for block in model.layers:
            checkpoint(block)
    for unit in units:
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    # The root: fsdpx never reshards its root unit after forward (its backward starts with it).
    # FSDP2 does the same when reshard_after_forward is left unset (None) on the root; set to True
    # explicitly, torch 2.11 frees the root's parameters after forward and gathers them again in
    # backward (one more all-gather of the root per step than fsdpx).
    fully_shard(model, mesh=mesh, reshard_after_forward=None if reshard else False, mp_policy=mp_root)
    return model


def make_optimizer(model, a):
    params = list(model.parameters())
    if a.optimizer == "sgd":
        # fsdpx calls ATen's fused SGD kernel. torch.optim.SGD(fused=True) has no DTensor rule for
        # _fused_sgd_ in torch 2.11, so the default (foreach) implementation runs: checked bitwise
        # equal to the fused kernel on the CPU, with and without momentum.
        return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum, dampening=a.dampening,
                               weight_decay=a.weight_decay, nesterov=a.nesterov)
    b1, b2 = (float(x) for x in a.betas.split(","))
    # fsdpx calls at::_fused_adamw_, the kernel behind fused=True (DTensor has a rule for it).
    return torch.optim.AdamW(params, lr=a.lr, betas=(b1, b2), eps=a.eps, weight_decay=a.weight_decay, fused=True)


def init_distributed(a):
    """The process group (Gloo on the CPU, NCCL on a GPU) and this rank's device."""
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    if a.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return device, threads


def build(a, device, world):
    """The sharded model, its optimizer, the data and the sampler, as fsdpx builds them."""
    cfg = model_config(a)
    seq = a.seq or cfg["seq"]
    if seq > cfg["seq"]:
        raise SystemExit(f"--seq {seq} is more than the model's context of {cfg['seq']}")
    counter = CommCounter()
    if a.init_from:
        model = Transformer(cfg)
        load_init(model, a.init_from)
        model.to(device)
        counter.install()
        shard_model(model, a, world, device.type)
    else:
        # FSDP2's way for models that do not fit whole on a rank: built on the meta device,
        # sharded, then given this rank's memory and its rows of fsdpx's seeded values (each
        # whole parameter drawn alone, as fsdpx does), so that no rank ever holds the whole model.
        with torch.device("meta"):
            model = Transformer(cfg)
        counter.install()
        shard_model(model, a, world, device.type)
        model.to_empty(device=device)
        seeded_init(model, a.seed)
    opt = make_optimizer(model, a)
    data = Tokens(a.data, a.data_dtype, seq)
    sampler = GlobalBatchSampler(data.num_samples(), a.batch_size * world, dist.get_rank(), world, a.seed)
    return types.SimpleNamespace(cfg=cfg, seq=seq, model=model, counter=counter, opt=opt, data=data, sampler=sampler)


# --- checkpoints through PyTorch's DCP: docs/checkpoints.md ------------------------------------


def flat_optimizer_state(run):
    """The optimizer's state as get_optimizer_state_dict flattens it: {"state.<p>.<key>": tensor, ...}
    (and "param_groups.<p>.<key>" hyperparameters). Before a first step it holds zeros."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    return get_optimizer_state_dict(run.model, run.opt, options=StateDictOptions(flatten_optimizer_state_dict=True))


def folder_names(folder):
    from safetensors import safe_open
    names = set()
    for f in sorted(os.listdir(folder)):
        if f.endswith((".safetensors", ".distcp")):
            with safe_open(os.path.join(folder, f), "pt") as h:
                names.update(h.keys())
    return names


def resume_from_dcp(a, run):
    """The model and optimizer state from a.resume_dcp; returns the step to go on from."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    osd = flat_optimizer_state(run)
    held = folder_names(a.resume_dcp)

    def stored(key):  # "state.<p>.<key>" under the folder's names: fsdpx's optim/<p>/<key>, or DCP's own
        param, _, name = key[len("state."):].rpartition(".")
        fsdpx = f"optim/{param}/{name}"
        return fsdpx if fsdpx in held else key

    want = dict(run.model.state_dict())
    renamed = {stored(k): k for k, v in osd.items() if k.startswith("state.") and torch.is_tensor(v)}
    want.update({s: osd[k] for s, k in renamed.items()})
    dcp.load(want, storage_reader=HuggingFaceStorageReader(a.resume_dcp))
    for s, k in renamed.items():
        osd[k] = want[s]
    set_optimizer_state_dict(run.model, run.opt, osd, options=StateDictOptions(flatten_optimizer_state_dict=True))
    state_file = os.path.join(a.resume_dcp, "trainer_state.json")
    if os.path.exists(state_file):  # fsdpx's: the step and where the data was
        with open(state_file) as f:
            ts = json.load(f)
        run.sampler.epoch, run.sampler.step = ts["data"]["epoch"], ts["data"]["step"]
        run.sampler.shuffle()
        return ts["step"]
    steps = {float(v) for k, v in osd.items() if k.startswith("state.") and k.endswith(".step")}
    if len(steps) != 1:
        raise SystemExit(f"{a.resume_dcp}: the optimizer's steps are {sorted(steps)}, not one step")
    return int(steps.pop())


SAVE_WAYS = ("hf", "hf-consolidated", "filesystem-safetensors")


def save_to_dcp(a, run):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, HuggingFaceStorageWriter
    from torch.distributed.checkpoint.filesystem import SerializationFormat
    sd = dict(run.model.state_dict())
    sd.update({k: v for k, v in flat_optimizer_state(run).items() if k.startswith("state.") and torch.is_tensor(v)})
    for way in a.save_dcp_ways:
        out = a.save_dcp if len(a.save_dcp_ways) == 1 else os.path.join(a.save_dcp, way)
        if way == "filesystem-safetensors":
            writer = FileSystemWriter(out, serialization_format=SerializationFormat.SAFETENSORS)
        else:
            writer = HuggingFaceStorageWriter(out, save_distributed=True, enable_consolidation=way == "hf-consolidated")
        dcp.save(sd, storage_writer=writer)


def forward_backward(a, run, device):
    """One optimizer step's micro-batches and the step; returns (this rank's loss, grad norm)."""
    loss_sum = 0.0
    vocab = run.cfg["vocab"]
    for m in range(a.grad_accum):
        run.model.set_requires_gradient_sync(m == a.grad_accum - 1)
        inputs, targets = run.data.batch(run.sampler.next())
        if inputs.max().item() >= vocab:
            raise SystemExit(f"the data holds token id {inputs.max().item()}, outside the vocabulary of {vocab}")
        inputs, targets = inputs.to(device), targets.to(device)
        with CLOCK.span("forward"):
            loss = loss_of(run.model, inputs, targets) / float(a.grad_accum)
        with CLOCK.span("backward"):
            loss.backward()
        loss_sum += loss.item()
    grad_norm = None
    with CLOCK.span("optimizer"):
        if a.clip_grad_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), a.clip_grad_norm)
            grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        run.opt.step()
        run.opt.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def gather_figures(mine, world, device):
    """Every rank's figures in one all-gather (fsdpx's gather_step), outside the counted ones."""
    t = torch.tensor(mine, dtype=torch.float64, device=device)
    allv = torch.empty(world * t.numel(), dtype=torch.float64, device=device)
    ORIGINAL["all_gather_into_tensor"](allv, t)
    return allv.view(world, -1).tolist()


def train_step(a, run, device, world, step, startup_rss, run_peak):
    """Step `step` (0-based); returns rank 0's metrics line (None elsewhere) and the run's peak."""
    t0 = time.perf_counter()
    lr = lr_at(a, step)
    for group in run.opt.param_groups:
        group["lr"] = lr
    rss_before, hwm_before = proc_memory()
    run_peak = max(run_peak, hwm_before)
    measured = reset_peak_rss() and rss_before >= 0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    run.counter.on = True
    ALLOCATOR.reset()
    with CLOCK.span("step"):
        loss_sum, grad_norm = forward_backward(a, run, device)
    breakdown = CLOCK.take()
    allocated_peak = ALLOCATOR.peak()
    run.counter.on = False
    comm = run.counter.take()
    _, step_peak = proc_memory()
    run_peak = max(run_peak, step_peak)
    rise = step_peak - rss_before if measured else -1
    cuda_peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else -1
    rows = gather_figures([loss_sum, float(rise), float(step_peak), float(run_peak), float(cuda_peak), float(startup_rss),
                           float(allocated_peak)] + breakdown, world, device)
    loss_world = 0.0
    for r in range(world):  # in rank order, as fsdpx sums
        loss_world += rows[r][0]
    loss_world /= world
    step_time = time.perf_counter() - t0
    if not math.isfinite(loss_world):
        raise SystemExit(f"the loss is {loss_world} at step {step + 1}")
    if dist.get_rank() != 0:
        return None, run_peak
    tokens = a.batch_size * a.grad_accum * world * run.seq
    line = {"step": step + 1, "loss": loss_world, "lr": lr, "step_time_s": step_time,
            "tokens_per_s": tokens / step_time,
            "peak_memory_bytes": [int(r[3]) for r in rows],
            "peak_rss_bytes": int(max(r[3] for r in rows)),
            "memory_kind": "rss",
            "step_rss_rise_bytes": int(max(r[1] for r in rows)),
            "startup_rss_bytes": int(max(r[5] for r in rows)), **comm,
            "step_breakdown_s": [dict(zip(StepClock.PHASES, r[7:13])) for r in rows]}
    if device.type == "cuda":
        line["cuda_peak_allocated_bytes"] = int(max(r[4] for r in rows))
    if a.fsdpx_lib:
        line["step_peak_allocated_bytes"] = int(max(r[6] for r in rows))
    if grad_norm is not None:
        line["grad_norm"] = grad_norm
    return line, run_peak


def main(argv=None):
    global ALLOCATOR, CLOCK
    a = parse_args(argv)
    ALLOCATOR = AllocatorCount(a.fsdpx_lib)  # before the first tensor of the run
    startup_rss = proc_memory()[0]  # the interpreter and torch, before any process group or model
    device, threads = init_distributed(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    run = build(a, device, world)
    CLOCK = StepClock(device)
    CLOCK.install()
    out = open(a.out, "w") if (rank == 0 and a.out) else None
    if rank == 0 and not a.quiet:
        n_params = sum(p.numel() for p in run.model.parameters())
        print(f"fsdp2: gpt {a.size} ({n_params} parameters), {world} rank(s) of {threads} thread(s), {a.sharding}, "
              f"{a.precision}, {a.optimizer} lr {a.lr}, {a.batch_size} samples per rank, seq {run.seq}, "
              f"init {'from ' + a.init_from if a.init_from else 'seeded (' + str(a.seed) + ')'}", flush=True)
    rss, hwm = proc_memory()
    run_peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, hwm)
    first = resume_from_dcp(a, run) if a.resume_dcp else 0
    if rank == 0 and a.resume_dcp and not a.quiet:
        print(f"fsdp2: resumed from {a.resume_dcp} at step {first}", flush=True)
    dist.barrier()
    losses = []
    t_train = time.perf_counter()
    for step in range(first, a.steps):
        line, run_peak = train_step(a, run, device, world, step, startup_rss, run_peak)
        if line is None:
            continue
        losses.append(line["loss"])
        if out:
            out.write(json.dumps(line) + "\n")
            out.flush()
        if not a.quiet:
            print(f"step {step + 1}/{a.steps} | loss {line['loss']:.6f} | lr {line['lr']:.2e} | "
                  f"{line['step_time_s']:.4f} s/step | peak rss {line['peak_rss_bytes'] / 2**20:.1f} MiB", flush=True)
    if rank == 0 and not a.quiet:
        print(f"done: {a.steps - first} steps in {time.perf_counter() - t_train:.2f} s, loss {losses[0]:.4f} -> {losses[-1]:.4f}",
              flush=True)
    if out:
        out.close()
    if a.save_dcp:
        save_to_dcp(a, run)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    status = main() or 0
    sys.stdout.flush()
    sys.stderr.flush()
    # Straight out, without the interpreter's teardown: after a complete run and
    # destroy_process_group, torch 2.11 with Gloo was seen to abort in about one run in ten at
    # teardown ("terminate called without an active exception": a C++ thread still joinable).
    os._exit(status)
