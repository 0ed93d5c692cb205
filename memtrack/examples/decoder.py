"""A transformer decoder generating with a KV cache at its longest supported request:
several sessions batched (`decoder_generate`), or served concurrently, each session a
request of its own with its own KV cache (`decoder_serve`)."""

from __future__ import annotations

import torch
from torch import nn

import memtrack


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: int
    ) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        k_cache[:, pos : pos + t] = k  # the cache is preallocated at the longest request
        v_cache[:, pos : pos + t] = v
        keys, values = k_cache[:, : pos + t], v_cache[:, : pos + t]
        attn = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=t > 1
        )
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.heads, self.max_len = heads, max_len
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab, bias=False)

    def new_cache(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        p = self.head.weight
        d = p.shape[1]
        shape = (batch, self.max_len, self.heads, d // self.heads)
        return [(p.new_zeros(shape), p.new_zeros(shape)) for _ in self.blocks]

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, new_tokens: int, cache: list) -> torch.Tensor:
        tokens, pos = prompt, 0
        x = prompt
        for _ in range(new_tokens):
            t = x.shape[1]
            h = self.embed(x) + self.pos(torch.arange(pos, pos + t, device=x.device))
            for block, (kc, vc) in zip(self.blocks, cache, strict=True):
                h = block(h, kc, vc, pos)
            pos += t
            x = self.head(h[:, -1:]).argmax(-1)  # greedy: deterministic
            tokens = torch.cat([tokens, x], dim=1)
        return tokens


MODEL = {"d_model": 128, "heads": 4, "layers": 2, "vocab": 1024, "dtype": "float32"}
"""One model, served two ways: a batch of requests, and concurrent sessions."""


@memtrack.workload(params={"sessions": [1, 4], "max_len": 256, "new_tokens": 16, **MODEL})
def decoder_generate(ctx: memtrack.Context):
    """Greedy generation that fills the KV cache to the longest supported request."""
    p = ctx.params
    model = Decoder(p["vocab"], p["d_model"], p["heads"], p["layers"], p["max_len"])
    model = model.to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)
    prompt = ctx.randint(p["vocab"], p["sessions"], p["max_len"] - p["new_tokens"])

    def step() -> torch.Tensor:
        cache = model.new_cache(p["sessions"])
        ctx.tag_cache(*(t for pair in cache for t in pair))
        return model.generate(prompt, p["new_tokens"], cache)

    return step


@memtrack.workload(params={"concurrency": 4, "max_len": 256, "new_tokens": 8, **MODEL})
def decoder_serve(ctx: memtrack.Context):
    """`concurrency` requests at their longest supported input served at once: each session
    generates for one request with its own KV cache, the weights shared. memtrack runs the
    sessions overlapping (threads, a CUDA stream each), so the peak is measured, not N x one."""
    p = ctx.params
    model = Decoder(p["vocab"], p["d_model"], p["heads"], p["layers"], p["max_len"])
    model = model.to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)
    prompt = ctx.randint(p["vocab"], 1, p["max_len"] - p["new_tokens"])

    def session() -> torch.Tensor:
        cache = model.new_cache(1)
        ctx.tag_cache(*(t for pair in cache for t in pair))
        return model.generate(prompt, p["new_tokens"], cache)

    return session
