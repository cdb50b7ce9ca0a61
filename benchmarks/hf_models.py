"""W14 (issue 38): real Hugging Face models through torch.compile, tracecomp's backend
against Inductor and eager.

Six models from `transformers`, built from config objects with random weights (nothing
downloaded): GPT-2, BERT, Llama, ViT, ResNet and T5, each at a small configuration of its
architecture (two layers of width 256 for the transformers; ResNet's basic blocks at widths
32-256), batch 8, 128 tokens or 224x224 images.  Two cases per model:

- W14-<model>-train: one training step, the forward with the model's own loss, the backward
  and an AdamW step (dropout 0, so every implementation computes the same function);
- W14-<model>-infer: the forward in model.eval() under torch.no_grad(), its logits.

Implementations: "torch" (eager), "torch.compile" (Inductor, its default options) and
"tracecomp" (`torch.compile(model, backend="tracecomp")`).  The first call is each one's
compile (bench.py's "first call" column); its result is checked against eager in float64
(the loss before the step, or the logits).  Every implementation starts from the same
weights: the model is built under torch.manual_seed(0) in each child process.
"""
from __future__ import annotations

import os

import numpy as np

BATCH, TOKENS, VOCAB, IMAGE, LABELS = 8, 128, 8192, 224, 1000
LR = 1e-4


def _configs():
    import transformers as hf
    text = dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                vocab_size=VOCAB, max_position_embeddings=TOKENS)
    return {
        "gpt2": lambda: hf.GPT2LMHeadModel(hf.GPT2Config(
            n_layer=2, n_embd=256, n_head=4, n_inner=1024, vocab_size=VOCAB, n_positions=TOKENS,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)),
        "bert": lambda: hf.BertForMaskedLM(hf.BertConfig(
            **text, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        "llama": lambda: hf.LlamaForCausalLM(hf.LlamaConfig(**text, num_key_value_heads=2, bos_token_id=0,
                                                            eos_token_id=0, pad_token_id=0)),
        "vit": lambda: hf.ViTForImageClassification(hf.ViTConfig(
            image_size=IMAGE, patch_size=16, num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
            intermediate_size=1024, num_labels=LABELS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        "resnet": lambda: hf.ResNetForImageClassification(hf.ResNetConfig(
            embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="basic",
            num_labels=LABELS)),
        "t5": lambda: hf.T5ForConditionalGeneration(hf.T5Config(
            vocab_size=VOCAB, d_model=256, d_kv=64, d_ff=1024, num_layers=2, num_decoder_layers=2, num_heads=4,
            dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)),
    }


MODELS = ("gpt2", "bert", "llama", "vit", "resnet", "t5")
IMAGES = ("vit", "resnet")


def _inputs(name: str) -> list[np.ndarray]:
    """The batch as NumPy arrays: token ids (and labels), or images and class labels."""
    rng = np.random.default_rng(14)
    if name in IMAGES:
        return [rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32),
                rng.integers(0, LABELS, BATCH).astype(np.int64)]
    return [rng.integers(1, VOCAB, (BATCH, TOKENS)).astype(np.int64),
            rng.integers(1, VOCAB, (BATCH, TOKENS)).astype(np.int64)]


def _batch(name: str, arrays: list, dtype=None) -> dict:
    import torch
    x, labels = (torch.from_numpy(np.array(a)) for a in arrays)
    if name in IMAGES:
        return dict(pixel_values=x if dtype is None else x.to(dtype), labels=labels)
    return dict(input_ids=x, labels=x if name in ("gpt2", "llama") else labels)     # (causal LMs shift their own)


def _inference_batch(name: str, arrays: list, dtype=None) -> dict:
    """The batch without labels, but for T5, whose decoder reads its inputs from them."""
    batch = _batch(name, arrays, dtype)
    if name != "t5":
        del batch["labels"]
    return batch


def _model(name: str, training: bool, dtype=None):
    import torch
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    model = _configs()[name]().train(training)
    return model if dtype is None else model.to(dtype)


def _step(name: str, compile_with: str | None):
    """builder(inputs) -> call: one training step, returning the loss before it."""
    def build(arrays):
        import torch
        model = _model(name, training=True)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        run = model if compile_with is None else torch.compile(model, backend=compile_with)
        batch = _batch(name, arrays)

        def call():
            opt.zero_grad(set_to_none=True)
            loss = run(**batch).loss
            loss.backward()
            opt.step()
            return loss.detach().numpy()
        return call
    return build


def _forward(name: str, compile_with: str | None):
    """builder(inputs) -> call: the logits in eval mode under no_grad."""
    def build(arrays):
        import torch
        model = _model(name, training=False)
        run = model if compile_with is None else torch.compile(model, backend=compile_with)
        batch = _inference_batch(name, arrays)

        def call():
            with torch.no_grad():
                return run(**batch).logits.numpy()
        return call
    return build


def _reference(name: str, training: bool):
    """Eager PyTorch in float64 from the same weights: the loss, or the logits."""
    def reference(arrays):
        import torch
        model = _model(name, training=training, dtype=torch.float64)
        batch = (_batch if training else _inference_batch)(name, arrays, torch.float64)
        with torch.no_grad():
            out = model(**batch)
        return (out.loss if training else out.logits).numpy()
    return reference


def w14_cases(case_type, impls_wanted=None) -> list:
    """bench.py's Cases for W14 (`case_type`: its Case class)."""
    cases = []
    for name in MODELS:
        for training in (True, False):
            build = _step if training else _forward
            impls = {"tracecomp": build(name, "tracecomp"), "torch": build(name, None),
                     "torch.compile": build(name, "inductor")}
            kind = "train" if training else "infer"
            what = ("training step (forward, backward, AdamW)" if training
                    else "inference forward (eval, no_grad)")
            shape = f"{BATCH}x3x{IMAGE}x{IMAGE}" if name in IMAGES else f"{BATCH}x{TOKENS} tokens"
            cases.append(case_type(f"W14-{name}-{kind}", "W14", f"{name} {what}, {shape}",
                                   lambda name=name: _inputs(name), _reference(name, training), 2e-3, impls,
                                   note="transformers model, random weights; torch.compile backends",
                                   env={"HF_HUB_OFFLINE": "1"}))
    return cases
