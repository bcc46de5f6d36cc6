"""Create config-only (plus stand-in tokenizer) model folders in a private HF cache,
as `huggingface-cli download ORG/NAME config.json tokenizer.json tokenizer_config.json` would.
The tokenizer is a WordLevel stand-in with the real vocab size and special tokens (no weights anywhere)."""
import json, os, sys, hashlib
from tokenizers import Tokenizer, models, pre_tokenizers
HF = os.environ["HF_HOME"]
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
def llama(h, l, heads, kv, inter, vocab=32000, ctx=2048, theta=10000.0, **kw):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=h, num_hidden_layers=l,
             num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
             max_position_embeddings=ctx, rms_norm_eps=1e-6, rope_theta=theta, hidden_act="silu",
             bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="float16")
    c.update(kw); return c
CFG = {
 "huggyllama/llama-7b": (llama(4096, 32, 32, 32, 11008), dict(bos="<s>", eos="</s>", unk="<unk>")),
 "meta-llama/Llama-2-7b-hf": (llama(4096, 32, 32, 32, 11008, ctx=4096, rms_norm_eps=1e-5), dict(bos="<s>", eos="</s>", unk="<unk>")),
 "meta-llama/Meta-Llama-3-8B": (llama(4096, 32, 32, 8, 14336, vocab=128256, ctx=8192, theta=500000.0, bos_token_id=128000, eos_token_id=128001, torch_dtype="bfloat16", rms_norm_eps=1e-5), dict(bos="<|begin_of_text|>", eos="<|end_of_text|>")),
 "meta-llama/Meta-Llama-3-8B-Instruct": (llama(4096, 32, 32, 8, 14336, vocab=128256, ctx=8192, theta=500000.0, bos_token_id=128000, eos_token_id=128009, torch_dtype="bfloat16", rms_norm_eps=1e-5), dict(bos="<|begin_of_text|>", eos="<|eot_id|>", chat=True)),
 "meta-llama/Llama-2-70b-hf": (llama(8192, 80, 64, 8, 28672, ctx=4096, rms_norm_eps=1e-5), dict(bos="<s>", eos="</s>", unk="<unk>")),
 "mistralai/Mistral-7B-v0.1": (dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16"), dict(bos="<s>", eos="</s>", unk="<unk>")),
}
def qwen2(name, h, l, heads, kv, inter, vocab=152064, tie=False):
    CFG[name] = (dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=h, num_hidden_layers=l, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=tie, bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16", sliding_window=131072, use_sliding_window=False), dict(eos="<|im_end|>", pad="<|endoftext|>", chat=True, extra=["<|im_start|>"]))
qwen2("Qwen/Qwen2.5-32B-Instruct", 5120, 64, 40, 8, 27648)
qwen2("Qwen/Qwen2.5-7B-Instruct", 3584, 28, 28, 4, 18944)
qwen2("Qwen/Qwen2.5-1.5B-Instruct", 1536, 28, 12, 2, 8960, vocab=151936, tie=True)
qwen2("Qwen/Qwen2.5-0.5B-Instruct", 896, 24, 14, 2, 4864, vocab=151936, tie=True)
qwen2("Qwen/Qwen2.5-0.5B", 896, 24, 14, 2, 4864, vocab=151936, tie=True)
qwen2("Qwen/Qwen2.5-Math-7B", 3584, 28, 28, 4, 18944)
qwen2("open-r1/Qwen2.5-Math-7B-RoPE-300k", 3584, 28, 28, 4, 18944)
qwen2("Qwen/Qwen2-0.5B", 896, 24, 14, 2, 4864, vocab=151936, tie=True)
qwen2("Qwen/Qwen2-0.5B-Instruct", 896, 24, 14, 2, 4864, vocab=151936, tie=True)
qwen2("Qwen/Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, vocab=151936, tie=True)
CFG["gpt2"] = (dict(architectures=["GPT2LMHeadModel"], model_type="gpt2", n_embd=768, n_layer=12, n_head=12, n_positions=1024, vocab_size=50257, bos_token_id=50256, eos_token_id=50256), dict(bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>"))
CFG["EleutherAI/pythia-2.8b"] = (dict(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox", hidden_size=2560, num_hidden_layers=32, num_attention_heads=32, intermediate_size=10240, vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, torch_dtype="float16"), dict(bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>"))
CFG["EleutherAI/pythia-6.9b"] = (dict(architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=16384, vocab_size=50432, max_position_embeddings=2048, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, torch_dtype="float16"), dict(bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>"))
CFG["mistral-community/Mixtral-8x22B-v0.1"] = (dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=6144, num_hidden_layers=56, num_attention_heads=48, num_key_value_heads=8, intermediate_size=16384, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=65536, rms_norm_eps=1e-5, rope_theta=1000000.0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, torch_dtype="bfloat16"), dict(bos="<s>", eos="</s>", unk="<unk>"))
CFG["openai-community/gpt2"] = CFG["gpt2"]
CFG["NousResearch/Meta-Llama-3.1-8B"] = CFG["meta-llama/Meta-Llama-3-8B"]
CFG["bigcode/starcoder"] = (dict(architectures=["GPTBigCodeForCausalLM"], model_type="gpt_bigcode", n_embd=6144, n_layer=40, n_head=48, n_positions=8192, vocab_size=49152, multi_query=True, bos_token_id=0, eos_token_id=0), dict(bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>"))
CFG["google/gemma-2-2b"] = (dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_size=2304, num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000, max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=256, sliding_window=4096, final_logit_softcapping=30.0, attn_logit_softcapping=50.0, bos_token_id=2, eos_token_id=1, pad_token_id=0, torch_dtype="float32"), dict(bos="<bos>", eos="<eos>", unk="<unk>", pad="<pad>"))
def tokenizer(vocab, sp):
    specials = [t for k in ("unk", "bos", "eos", "pad") if (t := sp.get(k))] + sp.get("extra", [])
    specials = list(dict.fromkeys(specials))
    v = {t: i for i, t in enumerate(specials)}
    for i in range(len(v), vocab):
        v[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(v, unk_token=sp.get("unk", specials[0])))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tok
def make(name):
    cfg, sp = CFG[name]
    sha = hashlib.sha1(name.encode()).hexdigest()
    base = os.path.join(HF, "hub", "models--" + name.replace("/", "--"))
    snap = os.path.join(base, "snapshots", sha)
    os.makedirs(snap, exist_ok=True); os.makedirs(os.path.join(base, "refs"), exist_ok=True)
    open(os.path.join(base, "refs", "main"), "w").write(sha)
    json.dump(cfg, open(os.path.join(snap, "config.json"), "w"), indent=1)
    vocab = cfg["vocab_size"] - (0 if name.startswith("gpt2") or "pythia" in name else 0)
    if "Qwen" in name: vocab = 151643 + 22  # real Qwen2.5 tokenizer length 151665
    if "Llama-3" in name: vocab = 128256
    tokenizer(vocab, sp).save(os.path.join(snap, "tokenizer.json"))
    tc = dict(tokenizer_class="PreTrainedTokenizerFast", model_max_length=cfg.get("max_position_embeddings", 2048))
    for k in ("bos", "eos", "unk", "pad"):
        if sp.get(k): tc[k + "_token"] = sp[k]
    if sp.get("chat"): tc["chat_template"] = CHAT
    json.dump(tc, open(os.path.join(snap, "tokenizer_config.json"), "w"), indent=1)
    json.dump({k + "_token": sp[k] for k in ("bos", "eos", "unk", "pad") if sp.get(k)}, open(os.path.join(snap, "special_tokens_map.json"), "w"))
    json.dump(dict(bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id")), open(os.path.join(snap, "generation_config.json"), "w"))
    print(name, "->", snap)
for n in (sys.argv[1:] or CFG):
    make(n)
