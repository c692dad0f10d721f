"""Allocation traces for the fragmentation benchmark (bench/allocator.py replays them; bench/targets.py
judges one target per trace). Each trace is a list of ("alloc", id, nbytes, stream) and ("free", id),
its sizes multiplied by `scale` (bench/allocator.py scales them down on the simulated device)."""
import random
from dataclasses import dataclass
from typing import Callable

KiB, MiB = 1 << 10, 1 << 20


class _Ops:
    """A trace being written: ("alloc", id, nbytes, stream) and ("free", id)."""

    def __init__(self, scale):
        self.scale = scale
        self.ops = []
        self.ids = iter(range(1 << 62))

    def alloc(self, nbytes, stream=0):
        key = next(self.ids)
        self.ops.append(("alloc", key, max(1, int(nbytes * self.scale)), stream))
        return key

    def free(self, *keys):
        self.ops.extend(("free", k) for k in keys)


def transformer_training(scale):
    """Training steps of a 12-layer transformer (batch 8, hidden 1024, 16 heads, fp32) whose sequence length
    grows step by step, 128 to 512 tokens: parameters and Adam states persist, each layer's saved activations
    live from its forward to its backward, temporaries die at once, gradients are freed after each step."""
    t = _Ops(scale)
    layers, batch, hidden, heads, f32 = 12, 8, 1024, 16, 4
    shapes = [3 * hidden * hidden, hidden * hidden, 4 * hidden * hidden, 4 * hidden * hidden, hidden, hidden]
    params = [t.alloc(n * f32) for _ in range(layers) for n in shapes]
    adam = []
    for seq in (128, 160, 192, 256, 320, 384, 448, 512):
        act = batch * seq * f32
        scores = batch * heads * seq * seq * f32
        x = t.alloc(hidden * act)
        saved = []
        for _ in range(layers):
            ln = t.alloc(hidden * act)
            qkv = t.alloc(3 * hidden * act)
            s = t.alloc(scores)
            probs = t.alloc(scores)
            t.free(s)
            ctx = t.alloc(hidden * act)
            out = t.alloc(hidden * act)
            h = t.alloc(4 * hidden * act)
            g = t.alloc(4 * hidden * act)
            y = t.alloc(hidden * act)
            t.free(out)
            saved.append((ln, qkv, probs, ctx, h, g, x))
            x = y
        grad = t.alloc(hidden * act)
        t.free(x)
        grads = []
        for layer in reversed(saved):
            tmp = [t.alloc(n * act) for n in (4 * hidden, 4 * hidden, hidden)]
            d_scores = t.alloc(scores)
            grads += [t.alloc(n * f32) for n in shapes]
            new_grad = t.alloc(hidden * act)
            t.free(*tmp, d_scores, grad, *layer)
            grad = new_grad
        t.free(grad)
        if not adam:
            adam = [t.alloc(n * f32) for _ in range(2 * layers) for n in shapes]
        t.free(*grads)
    t.free(*params, *adam)
    return t.ops


def kv_cache_decode(scale):
    """Generation for 8 requests of random prompt lengths over 24 layers (fp16, 16 heads of 128): each
    request's key and value caches grow by reallocation (new buffer, then free the old) every 32 tokens, and
    each step allocates and frees its logits; requests finish at random and new ones take their place."""
    rng = random.Random(1)
    t = _Ops(scale)
    layers, per_token = 24, 2 * 16 * 128 * 2  # k and v, heads x head_dim, fp16
    requests = []

    def start():
        length = rng.randint(64, 1024)
        return {"length": length, "left": rng.randint(64, 512),
                "cache": [t.alloc(_round_up(length, 32) * per_token) for _ in range(layers)]}

    requests = [start() for _ in range(8)]
    for _ in range(600):
        logits = t.alloc(8 * 32000 * 4)
        for r in requests:
            r["length"] += 1
            r["left"] -= 1
            if r["length"] % 32 == 1:
                grown = [t.alloc(_round_up(r["length"], 32) * per_token) for _ in range(layers)]
                t.free(*r["cache"])
                r["cache"] = grown
        t.free(logits)
        for i, r in enumerate(requests):
            if r["left"] <= 0:
                t.free(*r["cache"])
                requests[i] = start()
    for r in requests:
        t.free(*r["cache"])
    return t.ops


def two_streams(scale):
    """A loader stream stages input batches of varying size (stream 1) while the compute stream (0) allocates
    activations for them and frees each batch when it is done with it, so both streams' caches fill."""
    rng = random.Random(2)
    t = _Ops(scale)
    staged = []
    for _ in range(300):
        staged.append(t.alloc(rng.randint(1, 48) * MiB, stream=1))
        if len(staged) > 3:
            batch = staged.pop(0)
            acts = [t.alloc(rng.choice([256 * KiB, 3 * MiB, 12 * MiB, 40 * MiB])) for _ in range(rng.randint(2, 8))]
            t.free(batch, *acts)
    t.free(*staged)
    return t.ops


def random_mix(scale):
    """Sizes log-uniform from 512 bytes to 256 MiB with random lifetimes (mostly short), one stream."""
    rng = random.Random(3)
    t = _Ops(scale)
    live = []
    for _ in range(4000):
        if live and rng.random() < 0.48:
            t.free(live.pop(rng.randrange(len(live)) if rng.random() < 0.3 else -1))
        else:
            live.append(t.alloc(int(2 ** rng.uniform(9, 28))))
    t.free(*live)
    return t.ops


def growing_batch(scale):
    """Steps whose batch grows by one sample each (8 to 55), 24 layers deep: each step allocates its activations
    at the new size (1, 2 and 4 times batch x 256 KiB), frees the previous step's, and keeps one in eight of its
    own for good (a cache that grows with the batch). Each step's tensors are slightly larger than the holes the
    last step left: torch's default allocator peaked at 4.98x the allocated bytes on such a trace."""
    t = _Ops(scale)
    previous, kept = [], []
    for batch in range(8, 56):
        acts = [t.alloc(m * batch * 256 * KiB) for _ in range(8) for m in (1, 2, 4)]
        kept += acts[::8]
        t.free(*previous)
        previous = [a for i, a in enumerate(acts) if i % 8]
    t.free(*previous, *kept)
    return t.ops


def _round_up(n, k):
    return -(-n // k) * k


@dataclass(frozen=True)
class Trace:
    key: str
    name: str
    make: Callable[[float], list]


TRACES = [
    Trace("memory.training", "transformer training, growing seq len", transformer_training),
    Trace("memory.kv_cache", "KV caches growing during decode", kv_cache_decode),
    Trace("memory.two_streams", "loader + compute streams", two_streams),
    Trace("memory.random", "random sizes and lifetimes", random_mix),
]
# the trace expandable segments are for (bench/expandable.py); not one of the fragmentation targets above
GROWING_BATCH = Trace("memory.growing_batch", "growing batch, 24 layers", growing_batch)
