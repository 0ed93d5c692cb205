"""A GPT-2-style decoder that builds its KV cache inside its own forward, as serving models
do: each attention layer returns its keys and values joined to the past ones
(`past_key_values`), and generation feeds them back. Nothing is preallocated: the prompt's
forward (prefill) creates the cache, each decode step grows it by concatenation, and the
step's peak is inside prefill, where the logits of every prompt position exist beside it.
"""

from __future__ import annotations

import torch
from torch import nn

import memtrack

KV = tuple[torch.Tensor, torch.Tensor]


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if past is None:  # the cache's own storage, not a view of the projection's
            k, v = k.contiguous(), v.contiguous()
        else:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=past is None)
        return self.proj(out.transpose(1, 2).reshape(b, t, d)), (k, v)


class Block(nn.Module):
    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        a, present = self.attn(self.ln1(x), past)
        x = x + a
        return x + self.mlp(self.ln2(x)), present


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(
        self, ids: torch.Tensor, past: list[KV] | None = None
    ) -> tuple[torch.Tensor, list[KV]]:
        """Logits of every position, and the cache: the past's keys and values with these."""
        start = 0 if past is None else past[0][0].shape[2]
        h = self.embed(ids) + self.pos(torch.arange(start, start + ids.shape[1], device=ids.device))
        presents = []
        for i, block in enumerate(self.blocks):
            h, present = block(h, None if past is None else past[i])
            presents.append(present)
        return self.head(self.ln_f(h)), presents


def generate(
    model: GPT, prompt: torch.Tensor, new_tokens: int, on_cache: memtrack.Context
) -> torch.Tensor:
    """Greedy decoding that feeds the cache back, tagging it after every forward."""
    tokens, ids, past = prompt, prompt, None
    for _ in range(new_tokens):
        logits, past = model(ids, past)
        on_cache.tag_cache(*(t for kv in past for t in kv))
        ids = logits[:, -1:].argmax(-1)  # greedy: deterministic
        del logits  # every position's logits: not kept through the next forward
        tokens = torch.cat([tokens, ids], dim=1)
    return tokens


MODEL = {"d_model": 128, "heads": 4, "layers": 2, "vocab": 2048, "dtype": "float32"}


@memtrack.workload(params={"sessions": [1, 4], "max_len": 256, "new_tokens": 16, **MODEL})
def gpt_generate(ctx: memtrack.Context):
    """Greedy generation, the cache built by the model's forward: at the peak (prefill's
    logits) it holds 2 x layers x sessions x prompt x d_model values."""
    p = ctx.params
    model = GPT(p["vocab"], p["d_model"], p["heads"], p["layers"], p["max_len"])
    model = model.to(ctx.device, ctx.dtype).eval()
    ctx.mark(model)
    prompt = ctx.randint(p["vocab"], p["sessions"], p["max_len"] - p["new_tokens"])

    @torch.no_grad()
    def step() -> torch.Tensor:
        return generate(model, prompt, p["new_tokens"], ctx)

    return step
