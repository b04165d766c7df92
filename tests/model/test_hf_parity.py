"""Our model against Hugging Face transformers loading the same GGUF file (the correctness peer)."""
import pytest
import torch

from reference.decoding import generate

PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "Write a short poem about memory bandwidth."]
LOGIT_TOLERANCE = 1e-3  # max |ours - HF| over all logits; both dequantize Q4_1 to float32


@pytest.fixture
def models(real_model, hf_peer):
    model, tok = real_model
    return model, tok, hf_peer


@pytest.mark.slow
def test_tokenizer_matches_hf(models):
    from reference.bench.hf_peer import load_hf_tokenizer

    _, tok, _ = models
    hf_tok = load_hf_tokenizer()
    texts = PROMPTS + ["In 1984, 12345 people said:\n\thello   world!!",
                       "<|im_start|>user\nnaïve café – 東京<|im_end|>\n"]
    for text in texts:
        ids = tok.encode(text)
        assert ids == hf_tok(text, add_special_tokens=False).input_ids, text
        assert tok.decode(ids) == text


@pytest.mark.slow
def test_logits_agree_with_hf(models):
    model, tok, hf = models
    ids = torch.tensor([tok.encode(PROMPTS[0] + " Paris, and the capital of Italy is")])
    with torch.inference_mode():
        expected = hf(ids).logits
    got = model(ids)
    err = (got - expected).abs().max().item()
    assert err < LOGIT_TOLERANCE, f"max |logit difference| {err:.2e} >= {LOGIT_TOLERANCE}"


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_identical_to_hf(models, prompt):
    model, tok, hf = models
    ids = tok.chat_ids(prompt)
    inputs = torch.tensor([ids])
    with torch.inference_mode():
        hf_out = hf.generate(inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=32,
                             min_new_tokens=32, do_sample=False, pad_token_id=tok.eos_id)
    assert generate(model, ids, 32) == hf_out[0, len(ids):].tolist()


@pytest.mark.slow
def test_hf_prompt_lookup_peer_returns_our_greedy_tokens(models):
    """The speculative benchmark's peer rows: transformers' plain and prompt-lookup generate
    reproduce our greedy reply on the grounded task (so their tok/s compare like for like)."""
    from reference.drafters import PromptLookupDrafter
    from reference.bench.speculative import TASKS, hf_generate
    from reference.speculative import speculative_generate

    model, tok, hf = models
    ids = tok.chat_ids(TASKS["grounded"])
    ours = generate(model, ids, 24, stop_ids=tok.stop_ids)
    assert speculative_generate(model, PromptLookupDrafter(max_ngram=3), ids, 24, k=4, stop_ids=tok.stop_ids)[0] == ours
    for lookup in (None, 4):
        seconds, theirs = hf_generate(hf, ids, 24, tok.stop_ids, lookup)
        assert seconds > 0 and theirs == ours, f"prompt_lookup_num_tokens={lookup}"
