"""Real models from Hugging Face `transformers` through torch.compile(backend="tracecomp"):
GPT-2, BERT, Llama, ViT, ResNet and T5, small configurations with random weights (built
from config objects, nothing downloaded), against the same model run eagerly.

Each model trains in model.train() with its dropout probabilities set to 0 in the config,
so that eager and compiled compute the same function (tracecomp draws dropout masks from
its own generator, test_torch_models.py checks that path); ResNet's batch norms use the
batch statistics and move their running statistics, which must match eager's after the
step.  The backend runs strict: a node tracecomp cannot compile raises instead of falling
back to PyTorch.  Checked: the loss and logits, every parameter's gradient and every
buffer after a training step (in float32, and in float64 to rounding for the models that
cast nothing to float32 themselves); the logits in model.eval() under torch.no_grad(); and the
loss curve of AdamW steps, which must not compile anything after the first step beyond
what Dynamo recompiles (ViT and ResNet write to their config on the first call)."""
import copy
import os

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (a test-only dependency)")
if not hasattr(torch, "compile"):          # tests/torch/ itself, seen as a namespace package
    pytest.skip("torch not installed (a test-only dependency)", allow_module_level=True)
os.environ["HF_HUB_OFFLINE"] = "1"         # configs only: a download attempt fails instead of hanging
transformers = pytest.importorskip("transformers", reason="transformers not installed (a test-only dependency)")

import tracecomp.torch as tt  # noqa: E402

BATCH, TOKENS, VOCAB, IMAGE, LABELS = 2, 16, 128, 32, 10
TOL = dict(rtol=1e-4, atol=2e-5)            # float32: reassociated sums over widths of 64-128


def _tokens(g, low=0):
    return torch.randint(low, VOCAB, (BATCH, TOKENS), generator=g)


def _language_model(g):
    ids = _tokens(g)
    return dict(input_ids=ids, labels=ids)


def _masked_language_model(g):
    """Padding at the end of the second sequence: BERT's attention takes a mask."""
    mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    mask[1, -4:] = 0
    return dict(input_ids=_tokens(g), attention_mask=mask, labels=_tokens(g))


def _images(g):
    return dict(pixel_values=torch.randn(BATCH, 3, IMAGE, IMAGE, generator=g),
                labels=torch.randint(0, LABELS, (BATCH,), generator=g))


def _translation(g):
    return dict(input_ids=_tokens(g, low=1), labels=_tokens(g, low=1))


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _bert():
    return transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
        max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _llama():
    """Grouped-query attention: 4 query heads over 2 key/value heads."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0))


def _vit():
    return transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=IMAGE, patch_size=8, num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
        intermediate_size=128, num_labels=LABELS, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _resnet():
    return transformers.ResNetForImageClassification(transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=LABELS))


def _t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))


# name -> (model builder, input builder)
MODELS = {"gpt2": (_gpt2, _language_model), "bert": (_bert, _masked_language_model),
          "llama": (_llama, _language_model), "vit": (_vit, _images), "resnet": (_resnet, _images),
          "t5": (_t5, _translation)}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def pair(name: str, training: bool):
    """(model, an eager copy with the same weights, inputs), both in training or eval mode."""
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build().train(training)
    return model, copy.deepcopy(model), inputs(torch.Generator().manual_seed(1))


def strict(model, reports: list):
    return torch.compile(model, backend="tracecomp", options={"strict": True, "report": reports.append})


def check_training_step(name: str, dtype=torch.float32, tol=TOL):
    model, eager, inputs = pair(name, training=True)
    model.to(dtype)
    eager.to(dtype)
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    reports = []
    out = strict(model, reports)(**inputs)
    expected = eager(**inputs)
    torch.testing.assert_close(out.logits, expected.logits, **tol)
    torch.testing.assert_close(out.loss, expected.loss, **tol)
    out.loss.backward()
    expected.loss.backward()
    assert sorted({r.kind for r in reports}) == ["backward", "forward"], [r.kind for r in reports]
    assert all(not r.fallback and r.partitions == 1 for r in reports), [dict(r.fallback) for r in reports]
    for (n, p), q in zip(model.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), n
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, **tol, msg=lambda m: f"{name} {n}.grad: {m}")
    for (n, b), c in zip(model.named_buffers(), eager.buffers()):     # ResNet's running statistics
        torch.testing.assert_close(b, c, **tol, msg=lambda m: f"{name} buffer {n}: {m}")


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_matches_eager_in_every_gradient_and_buffer(name):
    check_training_step(name)


# In float64 the models that compute nothing in float32 themselves (Llama's and T5's norms
# and rotary embeddings and the causal-LM loss cast to it) match eager to rounding: a
# float32 slip inside tracecomp would show as 1e-7, which float32's tolerance hides.
@pytest.mark.parametrize("name", ["resnet", pytest.param("bert", marks=pytest.mark.slow),
                                  pytest.param("vit", marks=pytest.mark.slow)])
def test_training_step_in_float64_matches_eager_to_rounding(name):
    check_training_step(name, torch.float64, dict(rtol=1e-10, atol=1e-12))


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_under_no_grad_matches_eager(name):
    model, eager, inputs = pair(name, training=False)
    reports = []
    with torch.no_grad():
        out = strict(model, reports)(**inputs)
        expected = eager(**inputs)
    assert not out.logits.requires_grad
    torch.testing.assert_close(out.logits, expected.logits, **TOL)
    assert reports and all(r.kind == "inference" and not r.fallback for r in reports), \
        [(r.kind, dict(r.fallback)) for r in reports]


def test_other_batch_sizes_match_eager():
    """Dynamo makes the batch size dynamic (SymInts) on the second size it sees; the
    graphs it then hands over still give eager's values and gradients."""
    model, eager, inputs = pair("gpt2", training=True)
    reports = []
    compiled = strict(model, reports)
    for batch in (2, 3):
        sized = {k: torch.cat([v, v])[:batch] for k, v in inputs.items()}
        out, expected = compiled(**sized), eager(**sized)
        out.loss.backward()
        expected.loss.backward()
        torch.testing.assert_close(out.logits, expected.logits, **TOL)
        for (n, p), q in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"batch {batch} {n}.grad: {m}")
        model.zero_grad()
        eager.zero_grad()
    assert all(not r.fallback for r in reports), [dict(r.fallback) for r in reports]


KEYS = ("dynamo", "forward", "backward", "traces")
# Dynamo recompiles these on the second step: their classification loss sets
# config.problem_type on the first call, which the first graph's guards read.
RECOMPILED = ("vit", "resnet")


def adamw_losses(model, step, inputs, steps: int) -> tuple[list[float], list[dict]]:
    """The loss of each AdamW step, and tracecomp's counts after each."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, counts = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = step(**inputs).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        counts.append(dict(tt.counts))
    return losses, counts


def check_adamw_curve(name: str, steps: int):
    model, eager, inputs = pair(name, training=True)
    reports = []
    start = dict(tt.counts)
    losses, counts = adamw_losses(model, strict(model, reports), inputs, steps)
    expected, _ = adamw_losses(eager, eager, inputs, steps)
    assert losses == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert expected[-1] < expected[0]
    # parameters are graph inputs: after the first step the optimizer's in-place updates
    # need no new graph or trace, except where Dynamo recompiles once (RECOMPILED)
    settled = counts[1] if name in RECOMPILED else counts[0]
    first = {k: counts[0].get(k, 0) - start.get(k, 0) for k in KEYS}
    later = {k: counts[-1].get(k, 0) - settled.get(k, 0) for k in KEYS}
    assert first["forward"] == first["backward"] == first["dynamo"] and first["traces"] == 2 * first["dynamo"], first
    assert later == dict.fromkeys(KEYS, 0), later
    assert all(not r.fallback for r in reports)


def test_adamw_steps_give_eager_losses_short():
    check_adamw_curve("gpt2", 4)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_twenty_adamw_steps_give_eager_losses(name):
    check_adamw_curve(name, 20)
