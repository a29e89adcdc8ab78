"""Small random-weight Qwen3.5 models for the forward-pass fixtures.

Builds, with transformers' own classes, a dense (`Qwen3_5ForCausalLM`) and a
MoE (`Qwen3_5MoeForCausalLM`) model, adds one MTP block (transformers has no
MTP module and drops `mtp.*` on load, so the block's weights are made here and
written beside the trunk's in the checkpoint), and saves an HF checkpoint
directory that llama.cpp's converter reads.

Why the weights are not plain N(0, 1/fan_in): a random model with independent
weights is a poor fixture. Its GDN keys are uncorrelated with its queries (the
delta rule then contributes almost nothing, so a GDN bug barely moves the
logits), and its logits are either flat or saturated. Here the GDN key rows are
a noisy copy of the query rows of the same k-head (and their conv taps too),
attention keys are correlated with the queries of their group, norm weights
are visibly different from 1 (so a runtime that adds 1 twice, or never, is
caught), and the LM head is scaled so logits spread over a few units.

Sizes are chosen for the GGUF files, which are committed (see README):
- dense: n_embd 256, so every matrix that reads the residual stream, the token
  embedding and the head have 256-long rows and become real K-quants
  (Q4_K/Q6_K) in the Q4_K_M file. The inner dims (64) are not multiples of
  256, so ssm_out, attn_output and ffn_down fall back (Q5_0/Q8_0) there.
- moe: n_embd 128 (the 8 experts would otherwise dominate the size), so its
  Q4_K_M file is mostly the 32-block fallbacks Q5_0/Q8_0; only eh_proj
  (rows of 2*n_embd = 256) is a K-quant.
Both have n_k = 2, n_v = 4 GDN heads (Hv = 2*Hk, so the converter's tiled
V-head reorder is exercised), GQA 4:2 attention with partial rotary, and
layers alternating GDN/attention (full_attention_interval 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Test tokenizer: 256 byte tokens + BPE merges + these specials (appended last,
# as Qwen does). Their ids are VOCAB - len(SPECIALS) ... VOCAB - 1.
VOCAB = 512
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<|golden_test|>",
]
EOT_ID = VOCAB - len(SPECIALS)  # <|endoftext|>
IM_END_ID = EOT_ID + 2  # <|im_end|>

# The Qwen3.5 pre-tokenizer split (tokenizer.json of the released models; the
# same pattern llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35 uses, spec section 8).
QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass
class ModelSpec:
    name: str  # "dense" or "moe"
    seed: int
    hf: dict  # text-config kwargs
    moe: bool
    mtp_layers: int = 1
    # initialisation gains (see module doc)
    head_logit_std: float = 4.0
    extra: dict = field(default_factory=dict)


DENSE = ModelSpec(
    name="dense",
    seed=1234,
    moe=False,
    hf=dict(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        # partial rotary: 0.5 of 16 dims = 8 rotated (the released models use 0.25 of 256);
        # the sections sum to n_rot/2 as in the released config ([11,11,10] for 64).
        rope_parameters=dict(
            rope_type="default",
            rope_theta=10000.0,
            partial_rotary_factor=0.5,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
        full_attention_interval=2,
    ),
)

MOE = ModelSpec(
    name="moe",
    seed=5678,
    moe=True,
    hf=dict(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=3,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        # partial rotary 0.25 of 32 = 8 rotated dims (the released ratio)
        rope_parameters=dict(
            rope_type="default",
            rope_theta=1000000.0,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
        full_attention_interval=2,
    ),
)

SPECS = {"dense": DENSE, "moe": MOE}


# ---------------------------------------------------------------------------
# tokenizer


def corpus_text(seed: int = 7) -> str:
    """A deterministic training text for the test BPE: words, numbers,
    punctuation, code-ish lines and some non-ASCII (accents, CJK, emoji), so
    the merges cover the byte-level paths a real tokenizer meets."""
    import random

    rng = random.Random(seed)
    words = (
        "the of and to in is that it for on with as was at by be this from or an are "
        "model token layer state delta gate norm head attention expert value key query "
        "hidden logits weight matrix vector batch cache rope sequence draft verify accept "
        "Qwen llama ggml gguf python numpy tensor float quant block scale"
    ).split()
    extra = [
        "café",
        "naïve",
        "über",
        "señor",
        "中文",
        "模型",
        "注意力",
        "😀",
        "🚀",
        "日本語",
        "Ωmega",
        "Привет",
        "مرحبا",
    ]
    lines = []
    for _ in range(400):
        n = rng.randint(4, 14)
        toks = []
        for _ in range(n):
            r = rng.random()
            if r < 0.75:
                w = rng.choice(words)
                if rng.random() < 0.15:
                    w = w.capitalize()
                toks.append(w)
            elif r < 0.85:
                toks.append(str(rng.randint(0, 99999)))
            elif r < 0.93:
                toks.append(rng.choice(extra))
            else:
                toks.append(
                    rng.choice(["(", ")", "[", "]", "{", "}", "==", "->", "...", "'s", "'ll"])
                )
        sep = rng.choice([". ", ", ", "; ", "!\n", "?\n", ":\n\t", "\n\n"])
        lines.append(" ".join(toks) + sep)
        if rng.random() < 0.1:
            lines.append(
                f"def f_{rng.randint(0, 99)}(x, y):\n    return x * {rng.randint(2, 9)} + y\n"
            )
    return "".join(lines)


def build_tokenizer(out_dir: Path) -> None:
    """Train the tiny byte-level BPE and write tokenizer.json and
    tokenizer_config.json into out_dir."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from tokenizers.processors import ByteLevel as ByteLevelProcessor

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = ByteLevelProcessor(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(SPECIALS),
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([corpus_text()], trainer=trainer)
    n_base = tok.get_vocab_size()
    if n_base != VOCAB - len(SPECIALS):
        raise RuntimeError(f"BPE trained to {n_base} tokens, wanted {VOCAB - len(SPECIALS)}")
    tok.add_special_tokens(SPECIALS)
    assert tok.token_to_id(SPECIALS[0]) == EOT_ID
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_prefix_space": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# ---------------------------------------------------------------------------
# model


def hf_config(spec: ModelSpec):
    if spec.moe:
        from transformers import Qwen3_5MoeTextConfig as C
    else:
        from transformers import Qwen3_5TextConfig as C
    kw = dict(spec.hf)
    kw.update(bos_token_id=None, eos_token_id=IM_END_ID, pad_token_id=EOT_ID)
    cfg = C(**kw)
    cfg.architectures = ["Qwen3_5MoeForCausalLM" if spec.moe else "Qwen3_5ForCausalLM"]
    return cfg


def mtp_layer_config(cfg):
    """A copy of cfg with one more layer, a full-attention one, so that
    transformers' own decoder layer class can be built at index n_layer."""
    import copy

    c = copy.deepcopy(cfg)
    c.layer_types = list(cfg.layer_types) + ["full_attention"]
    c.num_hidden_layers = cfg.num_hidden_layers + 1
    return c


def _normal(gen, shape, std):
    import torch

    return torch.randn(*shape, generator=gen, dtype=torch.float32) * std


def init_weights(spec: ModelSpec, model, mtp: dict, gen) -> None:
    """Fill every parameter (trunk and the MTP dict) as described in the
    module doc. Deterministic given gen's seed and the parameter order."""
    import torch

    cfg = model.config
    E = cfg.hidden_size
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk = cfg.linear_key_head_dim
    key_dim = nk * dk
    nh, nkv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def lin(shape, gain=1.0):
        return _normal(gen, shape, gain / math.sqrt(shape[-1]))

    def fill_attn(prefix_get):
        q = lin((2 * nh * dh, E))
        # keys correlated with the queries of the first head of their group
        # (q head h uses kv head h // (nh/nkv)), gates stay independent
        qv = q.view(nh, 2, dh, E)
        grp = nh // nkv
        k = torch.stack([0.8 * qv[j * grp, 0] + 0.6 * lin((dh, E)) for j in range(nkv)]).reshape(
            nkv * dh, E
        )
        prefix_get("q_proj.weight").copy_(q)
        prefix_get("k_proj.weight").copy_(k)
        prefix_get("v_proj.weight").copy_(lin((nkv * dh, E)))
        prefix_get("o_proj.weight").copy_(lin((E, nh * dh)))
        prefix_get("q_norm.weight").copy_(_normal(gen, (dh,), 0.15))
        prefix_get("k_norm.weight").copy_(_normal(gen, (dh,), 0.15))

    def fill_mlp(get, ff):
        get("gate_proj.weight").copy_(lin((ff, E)))
        get("up_proj.weight").copy_(lin((ff, E)))
        get("down_proj.weight").copy_(lin((E, ff)))

    def fill_ffn(get):
        if not spec.moe:
            fill_mlp(get, cfg.intermediate_size)
            return
        ne, ffe = cfg.num_experts, cfg.moe_intermediate_size
        get("gate.weight").copy_(_normal(gen, (ne, E), 2.0 / math.sqrt(E)))
        get("experts.gate_up_proj").copy_(_normal(gen, (ne, 2 * ffe, E), 1.0 / math.sqrt(E)))
        get("experts.down_proj").copy_(_normal(gen, (ne, E, ffe), 1.0 / math.sqrt(ffe)))
        fill_mlp(lambda n: get("shared_expert." + n), cfg.shared_expert_intermediate_size)
        get("shared_expert_gate.weight").copy_(_normal(gen, (1, E), 1.0 / math.sqrt(E)))

    params = dict(model.named_parameters())
    with torch.no_grad():
        emb = params["model.embed_tokens.weight"]
        if cfg.tie_word_embeddings:
            # one matrix is both the embedding and the head: scale it for the head
            emb.copy_(_normal(gen, tuple(emb.shape), spec.head_logit_std / math.sqrt(E)))
        else:
            emb.copy_(_normal(gen, tuple(emb.shape), 1.0))
            params["lm_head.weight"].copy_(
                _normal(gen, tuple(emb.shape), spec.head_logit_std / math.sqrt(E))
            )
        params["model.norm.weight"].copy_(_normal(gen, (E,), 0.15))
        for i, layer_type in enumerate(cfg.layer_types):
            p = f"model.layers.{i}."

            def get(n, p=p):
                return params[p + n]

            get("input_layernorm.weight").copy_(_normal(gen, (E,), 0.15))
            get("post_attention_layernorm.weight").copy_(_normal(gen, (E,), 0.15))
            if layer_type == "linear_attention":
                a = "linear_attn."
                q = lin((key_dim, E))
                # key rows: a noisy copy of the query rows of the same k-head
                k = 0.8 * q + 0.6 * lin((key_dim, E))
                v = lin((nv * dk, E))
                get(a + "in_proj_qkv.weight").copy_(torch.cat([q, k, v]))
                get(a + "in_proj_z.weight").copy_(lin((nv * dk, E)))
                get(a + "in_proj_b.weight").copy_(lin((nv, E)))
                get(a + "in_proj_a.weight").copy_(lin((nv, E), 0.5))
                K = cfg.linear_conv_kernel_dim
                conv = _normal(gen, (2 * key_dim + nv * dk, 1, K), 0.35)
                conv[:, 0, K - 1] += 1.0  # mostly pass the current token through
                conv[key_dim : 2 * key_dim] = (
                    0.8 * conv[:key_dim] + 0.2 * conv[key_dim : 2 * key_dim]
                )
                get(a + "conv1d.weight").copy_(conv)
                get(a + "dt_bias").copy_(_normal(gen, (nv,), 0.5))
                # A in [0.05, 0.5]: decays exp(-A*softplus(.)) roughly 0.7 .. 0.97
                A = torch.rand(nv, generator=gen) * 0.45 + 0.05
                get(a + "A_log").copy_(torch.log(A))
                get(a + "norm.weight").copy_(1.0 + _normal(gen, (dk,), 0.15))
                get(a + "out_proj.weight").copy_(lin((E, nv * dk)))
            else:
                fill_attn(lambda n, p=p: params[p + "self_attn." + n])
            fill_ffn(lambda n, p=p: params[p + "mlp." + n])

        # MTP block (names as in the released checkpoints, model-relative "mtp.")
        for n in ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
            mtp["mtp." + n].copy_(_normal(gen, (E,), 0.15))
        mtp["mtp.fc.weight"].copy_(lin((E, 2 * E)))
        lp = "mtp.layers.0."
        mtp[lp + "input_layernorm.weight"].copy_(_normal(gen, (E,), 0.15))
        mtp[lp + "post_attention_layernorm.weight"].copy_(_normal(gen, (E,), 0.15))
        fill_attn(lambda n: mtp[lp + "self_attn." + n])
        fill_ffn(lambda n: mtp[lp + "mlp." + n])


class MTPHead:
    """The MTP block built from transformers' own modules (decoder layer and
    zero-centred RMSNorm of the model's family). Forward, per row k:
        e = enorm(embed(x_k)), hn = hnorm(h_{k-1}), u = fc([e ; hn]),
        u = decoder_layer(u) (gated attention over the MTP rows, RoPE at the
        row's position), out = norm(u), logits = lm_head(out).
    h_{k-1} is the trunk's post-final-norm hidden state of the previous
    position (spec section 7)."""

    def __init__(self, model):
        import torch

        cfg = model.config
        self.model = model
        lcfg = mtp_layer_config(cfg)
        if "Moe" in type(model).__name__:
            from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
                Qwen3_5MoeDecoderLayer as Layer,
            )
            from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (
                Qwen3_5MoeRMSNorm as Norm,
            )
        else:
            from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer as Layer
            from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm as Norm
        E = cfg.hidden_size
        lcfg._attn_implementation = "eager"
        self.layer = Layer(lcfg, cfg.num_hidden_layers)
        self.enorm = Norm(E, eps=cfg.rms_norm_eps)
        self.hnorm = Norm(E, eps=cfg.rms_norm_eps)
        self.norm = Norm(E, eps=cfg.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * E, E, bias=False)
        for m in (self.layer, self.enorm, self.hnorm, self.norm, self.fc):
            m.eval()

    def state_dict(self) -> dict:
        """Parameters under the checkpoint names (mtp.*)."""
        d = {
            "mtp.pre_fc_norm_embedding.weight": self.enorm.weight,
            "mtp.pre_fc_norm_hidden.weight": self.hnorm.weight,
            "mtp.norm.weight": self.norm.weight,
            "mtp.fc.weight": self.fc.weight,
        }
        for n, p in self.layer.named_parameters():
            d["mtp.layers.0." + n] = p
        return d

    def to(self, dtype):
        for m in (self.layer, self.enorm, self.hnorm, self.norm, self.fc):
            m.to(dtype)
        return self

    def forward(self, tokens, h_prev, positions):
        """tokens [T] int, h_prev [T, E] (row k: trunk hidden at k-1),
        positions [T] int. Rows attend causally to each other in order.
        Returns (logits [T, V], out [T, E] = the post-norm MTP hidden)."""
        import torch

        m = self.model
        dt = self.fc.weight.dtype
        e = m.model.embed_tokens(tokens[None]).to(dt)
        u = self.fc(torch.cat([self.enorm(e), self.hnorm(h_prev[None].to(dt))], dim=-1))
        pos = positions[None]
        pe = m.model.rotary_emb(u, pos[None].expand(3, 1, -1))
        T = tokens.shape[0]
        mask = torch.full((T, T), float("-inf"), dtype=dt).triu(1)[None, None]
        out = self.layer(u, position_embeddings=pe, attention_mask=mask, position_ids=pos)
        if isinstance(out, tuple):
            out = out[0]
        hn = self.norm(out)
        return m.lm_head(hn)[0], hn[0]


def build_hf(spec: ModelSpec):
    """Returns (model, mtp_head) in float32 with the golden weights."""
    import torch

    if spec.moe:
        from transformers import Qwen3_5MoeForCausalLM as M
    else:
        from transformers import Qwen3_5ForCausalLM as M
    cfg = hf_config(spec)
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)  # module constructors draw from the global RNG
    model = M(cfg).eval()
    head = MTPHead(model)
    gen = torch.Generator().manual_seed(spec.seed)
    init_weights(spec, model, head.state_dict(), gen)
    if cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model, head


def save_checkpoint(spec: ModelSpec, model, head, out_dir: Path) -> None:
    """save_pretrained + the MTP tensors in a second safetensors shard, with
    config.json extended by mtp_num_hidden_layers."""
    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    mtp = {k: v.detach().contiguous().clone() for k, v in head.state_dict().items()}
    save_file(mtp, str(out_dir / "mtp.safetensors"), metadata={"format": "pt"})
    # index every shard so the converter loads both files
    idx_path = out_dir / "model.safetensors.index.json"
    weight_map = {}
    if idx_path.exists():
        weight_map = json.loads(idx_path.read_text())["weight_map"]
    else:
        from safetensors import safe_open

        with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    for k in mtp:
        weight_map[k] = "mtp.safetensors"
    idx_path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    cfg = json.loads((out_dir / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = spec.mtp_layers
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    del torch


def round_params_like_bf16_file(model, head) -> int:
    """Round, in place, the parameters that llama.cpp's converter stores as
    BF16 in an `--outtype bf16` file (conversion/base.py prepare_tensors):
    every tensor of 2+ dims except ffn_gate_inp (router), ffn_gate_inp_shexp
    and ssm_conv1d, which stay F32, as do all 1-D tensors (norms, A, dt_bias).
    Returns the number of elements rounded (checked against the file)."""
    import torch

    n = 0
    seen = set()
    named = list(model.named_parameters()) + list(head.state_dict().items())
    with torch.no_grad():
        for name, p in named:
            if p.data_ptr() in seen:
                continue
            seen.add(p.data_ptr())
            if p.ndim < 2:
                continue
            if name.endswith("mlp.gate.weight") or name.endswith("shared_expert_gate.weight"):
                continue
            if name.endswith("conv1d.weight"):
                continue
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
            n += p.numel()
    return n


def bf16_round_np(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest-even), returned as float32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)
