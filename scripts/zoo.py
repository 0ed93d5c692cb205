"""The model zoo: one workload per family of models people measure, each built in code from
a config with pinned seeds (random weights, nothing downloaded), at a size the CPU runs in
seconds. `scripts/bench_zoo.py` measures them against the malloc interposer.

Needs the `zoo` extra (`pip install -e ".[zoo]"`): transformers, peft, torchvision, timm,
diffusers, torchao. Each workload imports its package itself, so one that is missing fails
only its own case, with the package's name.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

import memtrack

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=UserWarning)

VOCAB = 2000


def _llama(layers: int = 4) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    return LlamaForCausalLM(config)


def _lora(model: nn.Module) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))


def _train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: object) -> object:
    def step() -> torch.Tensor:
        loss = loss_fn()  # type: ignore[operator]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _kv_tensors(cache: object) -> list[torch.Tensor]:
    """The key and value tensors of a transformers cache (DynamicCache, EncoderDecoderCache)."""
    found: list[torch.Tensor] = []
    for inner in (cache, getattr(cache, "self_attention_cache", None)):
        for layer in getattr(inner, "layers", None) or ():
            found += [t for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)]
    return found


def _tag_kv_cache(ctx: memtrack.Context, model: nn.Module) -> None:
    """Tag the KV cache each forward returns: it is made and grown inside `generate`."""

    def hook(_module: nn.Module, _args: object, out: object) -> None:
        tensors = _kv_tensors(getattr(out, "past_key_values", None))
        if tensors:
            ctx.tag_cache(*tensors)

    model.register_forward_hook(hook)


@memtrack.workload
def llama_lora_train(ctx):
    """A LoRA fine-tune step: frozen Llama weights, trainable adapters, AdamW over them."""
    model = _lora(_llama()).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, foreach=False)
    ctx.mark(model, optimizer)
    ids = ctx.randint(VOCAB, 2, 128)
    return _train_step(model, optimizer, lambda: model(input_ids=ids, labels=ids).loss)


@memtrack.workload
def llama_lora_generate(ctx):
    """Greedy decoding with the LoRA model, its KV cache tagged."""
    model = _lora(_llama()).eval()
    ctx.mark(model)
    _tag_kv_cache(ctx, model.get_base_model())  # peft's generate calls the base model
    prompt = ctx.randint(VOCAB, 2, 96)

    @torch.no_grad()
    def step():
        return model.generate(input_ids=prompt, max_new_tokens=24, do_sample=False, pad_token_id=0)

    return step


@memtrack.workload
def llama_checkpointing(ctx):
    """A full fine-tune step with gradient checkpointing: activations recomputed."""
    model = _llama()
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    ctx.mark(model, optimizer)
    ids = ctx.randint(VOCAB, 2, 128)
    return _train_step(model, optimizer, lambda: model(input_ids=ids, labels=ids).loss)


@memtrack.workload
def frozen_encoder_head(ctx):
    """A frozen BERT encoder with a trainable classification head."""
    from transformers import BertConfig, BertModel

    encoder = BertModel(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
        )
    ).requires_grad_(False)
    head = nn.Linear(256, 4)
    optimizer = torch.optim.AdamW(head.parameters(), lr=1e-3, foreach=False)
    ctx.mark(encoder, head, optimizer)
    ids = ctx.randint(VOCAB, 8, 128)
    labels = ctx.randint(4, 8)

    def loss():
        pooled = encoder(input_ids=ids).last_hidden_state[:, 0]
        return nn.functional.cross_entropy(head(pooled), labels)

    return _train_step(head, optimizer, loss)


@memtrack.workload
def t5_generate(ctx):
    """T5 encoder-decoder, greedy generation, the decoder's KV cache tagged."""
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(
        T5Config(
            vocab_size=VOCAB,
            d_model=256,
            d_kv=32,
            d_ff=1024,
            num_layers=3,
            num_heads=8,
            decoder_start_token_id=0,
        )
    ).eval()
    ctx.mark(model)
    _tag_kv_cache(ctx, model)
    source = ctx.randint(VOCAB, 2, 128)

    @torch.no_grad()
    def step():
        return model.generate(input_ids=source, max_new_tokens=24, do_sample=False)

    return step


@memtrack.workload(params={"experts": ["eager", "grouped_mm"]})
def mixtral_moe(ctx):
    """A small Mixture-of-Experts decoder (Mixtral: 4 experts, 2 per token), forward pass,
    its experts run one by one (eager) or in one grouped matmul (transformers' default)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    model = MixtralForCausalLM(
        MixtralConfig(
            vocab_size=VOCAB,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            num_local_experts=4,
            num_experts_per_tok=2,
            max_position_embeddings=512,
            experts_implementation=ctx["experts"],
        )
    ).eval()
    ctx.mark(model)
    ids = ctx.randint(VOCAB, 2, 128)

    @torch.no_grad()
    def step():
        return model(input_ids=ids, use_cache=False).logits

    return step


@memtrack.workload
def clip_encoders(ctx):
    """CLIP's text and vision encoders (ViT-B/32-shaped, smaller), one forward."""
    from transformers import CLIPConfig, CLIPModel

    text = {
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
    }
    vision = {
        "hidden_size": 256,
        "intermediate_size": 1024,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "image_size": 224,
        "patch_size": 32,
    }
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision)).eval()
    ctx.mark(model)
    ids = ctx.randint(VOCAB, 4, 32)
    pixels = ctx.randn(4, 3, 224, 224)

    @torch.no_grad()
    def step():
        return model(input_ids=ids, pixel_values=pixels).logits_per_image

    return step


@memtrack.workload
def resnet18_train(ctx):
    """torchvision ResNet-18, one SGD training step at 224 px."""
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=10).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    ctx.mark(model, optimizer)
    images, labels = ctx.randn(4, 3, 224, 224), ctx.randint(10, 4)
    return _train_step(model, optimizer, lambda: nn.functional.cross_entropy(model(images), labels))


@memtrack.workload
def ssdlite_detect(ctx):
    """torchvision SSDlite (MobileNetV3 backbone), detection at 320 px, boxes out."""
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    model = ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=10
    ).eval()
    ctx.mark(model)
    images = [ctx.randn(3, 320, 320, offset=i) for i in range(2)]

    @torch.no_grad()
    def step():
        return [d["boxes"] for d in model(images)]

    return step


@memtrack.workload
def convnext_train(ctx):
    """timm ConvNeXt-Atto, one AdamW training step at 160 px."""
    import timm

    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ctx.mark(model, optimizer)
    images, labels = ctx.randn(4, 3, 160, 160), ctx.randint(10, 4)
    return _train_step(model, optimizer, lambda: nn.functional.cross_entropy(model(images), labels))


@memtrack.workload
def unet_step(ctx):
    """A diffusers UNet2DConditionModel denoising step, text-conditioned."""
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(
        sample_size=32,
        in_channels=4,
        out_channels=4,
        block_out_channels=(64, 128),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=128,
        attention_head_dim=8,
    ).eval()
    ctx.mark(model)
    latents, text = ctx.randn(2, 4, 32, 32), ctx.randn(2, 16, 128, offset=1)
    timestep = torch.tensor([10, 10])

    @torch.no_grad()
    def step():
        return model(latents, timestep, encoder_hidden_states=text).sample

    return step


class _Shared(nn.Module):
    """An encoder whose two blocks are one module (weights shared), and an output layer
    tied to the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 256)
        block = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
        self.blocks = nn.ModuleList([block, block])
        self.out = nn.Linear(256, VOCAB, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return self.out(x)


@memtrack.workload
def tied_shared_train(ctx):
    """Tied input/output embeddings and a block applied twice: each storage once."""
    model = _Shared().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ctx.mark(model, optimizer)
    ids = ctx.randint(VOCAB, 4, 128)
    return _train_step(
        model,
        optimizer,
        lambda: nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten()),
    )


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 512)
    )


@memtrack.workload
def compiled_mlp(ctx):
    """torch.compile (the eager backend: no compiler needed) of an MLP, inference."""
    model = _mlp().eval()
    compiled = torch.compile(model, backend="eager")
    ctx.mark(model)
    x = ctx.randn(64, 512)

    @torch.no_grad()
    def step():
        return compiled(x)

    return step


@memtrack.workload
def autocast_train(ctx):
    """bf16 autocast training step: float32 weights, bfloat16 activations."""
    model = _mlp().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ctx.mark(model, optimizer)
    x = ctx.randn(64, 512)

    def loss():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float().square().mean()

    return _train_step(model, optimizer, loss)


@memtrack.workload(
    params={"quant": ["none", "int8"]}, precision_params=("quant",), tolerance={"cosine": 0.99}
)
def ao_int8_dynamic(ctx):
    """torch.ao dynamic int8 quantization (packed weights) against its float model."""
    model = _mlp().eval()
    if ctx["quant"] == "int8":
        model = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    ctx.mark(model)
    x = ctx.randn(64, 512)

    @torch.no_grad()
    def step():
        return model(x)

    return step


@memtrack.workload
def torchao_int8_weight_only(ctx):
    """torchao int8 weight-only quantization (a tensor subclass per weight)."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    model = _mlp().eval()
    quantize_(model, Int8WeightOnlyConfig())
    ctx.mark(model)
    x = ctx.randn(64, 512)

    @torch.no_grad()
    def step():
        return model(x)

    return step


class _Tokens(torch.utils.data.Dataset):
    """Pinned token ids, a causal LM's inputs and labels alike."""

    def __init__(self, n: int, length: int):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@memtrack.workload
def hf_trainer_train(ctx):
    """HF `Trainer.train()` of a Llama, AdamW, two DataLoader workers: one optimizer step per
    iteration (memtrack.integrations.huggingface)."""
    from transformers import Trainer, TrainingArguments

    from memtrack.integrations.huggingface import train_steps

    args = TrainingArguments(
        output_dir=str(ctx.scratch_dir),
        per_device_train_batch_size=4,
        use_cpu=True,
        dataloader_num_workers=2,
        dataloader_persistent_workers=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=_llama(2), args=args, train_dataset=_Tokens(32, 64))
    return train_steps(ctx, trainer)


@memtrack.workload
def lightning_fit(ctx):
    """Lightning `Trainer.fit()` of an MLP regressor, AdamW, two DataLoader workers: one
    optimizer step per iteration (memtrack.integrations.lightning)."""
    import lightning as L

    from memtrack.integrations.lightning import fit_steps

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=False)

    g = torch.Generator().manual_seed(ctx.seed)
    data = torch.utils.data.TensorDataset(
        torch.randn(256, 512, generator=g), torch.randn(256, 512, generator=g)
    )
    loader = torch.utils.data.DataLoader(
        data, batch_size=64, num_workers=2, persistent_workers=True
    )
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return fit_steps(ctx, trainer, Regressor(), train_dataloaders=loader)
