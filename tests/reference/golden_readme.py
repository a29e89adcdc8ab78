# ruff: noqa: E501  (prose template: the README lines are long by nature)
"""Writes the "models and logits" section of tests/golden/README.md from what
make_golden.py measured (build/golden/meta.json, tests/golden/logits/summary.json),
leaving the rest of the README (other fixtures' sections) untouched."""

from __future__ import annotations

import glob
import os
from collections import Counter
from pathlib import Path

import golden_models as G

BEGIN = "<!-- BEGIN models-and-logits (written by tests/reference/make_golden.py) -->"
END = "<!-- END models-and-logits -->"

CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF "
    "-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF"
)


def _f(x, nd=4):
    if x is None:
        return "-"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) < 1e-3 or abs(x) >= 1e4:
            return f"{x:.1e}"
        return f"{x:.{nd}g}"
    return str(x)


def _types(path: Path) -> str:
    import gguf

    c = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors)
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def _lib_versions() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    d = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(d, "lib*.so.*.*.*")))
    return ", ".join(names)


def section(meta: dict, summary: dict, mg) -> str:
    import llama_cpp

    v = meta["versions"]
    L = []
    a = L.append
    a(BEGIN)
    a("## models and logits (forward-pass reference set)")
    a("")
    a(
        "Small random-weight Qwen3.5 models (GGUF, in `models/`) and reference logits for them "
        "(`logits/`), made by `make golden` (`python tests/reference/make_golden.py`; "
        "`--stage logits` keeps the committed GGUFs and only re-records). CI never runs it: the "
        "forward-pass tests read these committed files. Everything below is written by the script "
        "from what it measured; do not edit it by hand."
    )
    a("")
    a("### How they were made")
    a("")
    a(
        f"- Versions: torch {v['torch']}, transformers {v['transformers']}, numpy {v['numpy']}, "
        f"llama-cpp-python {v['llama_cpp']} (its vendored llama.cpp is commit "
        f"`{meta['llama_cpp_commit']}`; shared libraries {_lib_versions()}), the converter "
        "`vendor/llama.cpp/convert_hf_to_gguf.py` of that sdist with its own `gguf-py` (0.19.0)."
    )
    a(
        f'- llama-cpp-python was built with `CMAKE_ARGS="{CMAKE_ARGS}"` (no AMX: the hypervisor '
        "faults on it). Its system info: `"
        + llama_cpp.llama_print_system_info().decode().strip()
        + "`."
    )
    a(
        "- Models: built with transformers' `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM` "
        "(float32, eager attention) from `tests/reference/golden_models.py`: fixed configs, weights "
        f"drawn from `torch.Generator().manual_seed(seed)` (dense seed {G.DENSE.seed}, moe seed "
        f"{G.MOE.seed}). GDN key rows are a noisy copy of the query rows of the same k-head (and their "
        "conv taps too), attention keys are correlated with the queries of their group, zero-centred "
        "norm weights are N(0, 0.15) (so the converter's +1 fold matters), the GDN gated-norm weight "
        "is 1 + N(0, 0.15), A is uniform in [0.05, 0.5], and the LM head is scaled so the logits' "
        "standard deviation is about 4. The MTP block (one layer) is made from transformers' own "
        "decoder-layer and RMSNorm classes (transformers 5.24 has no MTP module and drops `mtp.*` on "
        "load) and written as `mtp.*` tensors in a second safetensors shard, with "
        "`mtp_num_hidden_layers: 1` in config.json."
    )
    a(
        f"- Tokenizer (`models/tokenizer.json`): a byte-level BPE trained with `tokenizers` on a "
        f"seeded synthetic text ({G.VOCAB - len(G.SPECIALS)} tokens: 256 bytes + 248 merges), the "
        f"Qwen3.5 split regex, and {len(G.SPECIALS)} specials appended at ids "
        f"{G.EOT_ID}..{G.VOCAB - 1} ({', '.join(f'`{s}`' for s in G.SPECIALS)}); eos `<|im_end|>` "
        f"= {G.IM_END_ID}, pad `<|endoftext|>` = {G.EOT_ID}, no BOS, a ChatML chat template."
    )
    a(
        "- Conversion: `python tests/reference/golden_convert.py SRC HF_DIR OUT {f32|bf16|q8_0}`, "
        "which runs the converter's `main()` unchanged except that it sets `tokenizer.ggml.pre = "
        '"qwen35"` (the converter identifies a pre-tokenizer by a hash of token ids and refuses an '
        "unknown one, as every fresh test tokenizer is). `full_attention_interval` is put back into "
        "config.json (transformers' `save_pretrained` folds it into `layer_types` and drops it; the "
        "converter would otherwise write the default 4 next to a `recurrent_layers` array that says 2)."
    )
    a(
        "- Q4_K_M: `llama_model_quantize(f32.gguf, q4_k_m.gguf, params)` through llama-cpp-python's "
        "low-level binding, `params = llama_model_quantize_default_params()` with `ftype = "
        "LLAMA_FTYPE_MOSTLY_Q4_K_M` (15), `nthread = 2`, no imatrix (no llama-quantize binary is "
        "installed; this is the same library function)."
    )
    a(
        f"- A check (`check_bf16_file`): the BF16 file equals the F32 file with exactly its BF16-typed "
        f"tensors rounded to nearest-even, and the number of BF16 elements "
        f"(dense {meta['bf16_check']['dense']['bf16_elements']}, moe "
        f"{meta['bf16_check']['moe']['bf16_elements']}) equals what the transformers-side rounding "
        "touches (every 2+-D weight except the router, the shared-expert gate and the conv kernel)."
    )
    a("")
    a("### Models")
    a("")
    a("| | dense (`qwen35`) | moe (`qwen35moe`) |")
    a("|---|---|---|")
    d, m = G.DENSE.hf, G.MOE.hf
    rows = [
        ("n_embd", d["hidden_size"], m["hidden_size"]),
        ("trunk layers (GDN=G, attention=A)", "GAGAG", "GAGA"),
        ("block_count (trunk + 1 MTP)", d["num_hidden_layers"] + 1, m["num_hidden_layers"] + 1),
        ("vocab", G.VOCAB, G.VOCAB),
        ("LM head", "tied (no `output.weight`)", "`output.weight`"),
        ("GDN n_k / n_v / d_k = d_v / conv K", "2 / 4 / 16 / 4", "2 / 4 / 16 / 4"),
        ("attention heads / kv heads / head dim", "4 / 2 / 16", "4 / 2 / 32"),
        ("rotated dims (rope.dimension_count)", "8 (partial 0.5)", "8 (partial 0.25)"),
        ("rope theta, sections", "1e4, [2,1,1,0]", "1e6, [2,1,1,0]"),
        ("FFN", "dense, n_ff 64", "8 experts, top-3, n_ff_exp 32, shared expert 32"),
        (
            "parameters",
            meta.get("models", {}).get("dense", {}).get("n_params", "-"),
            meta.get("models", {}).get("moe", {}).get("n_params", "-"),
        ),
    ]
    for r in rows:
        a(f"| {r[0]} | {r[1]} | {r[2]} |")
    a("")
    a(
        "The dense model's residual width is 256 so its input projections, embedding and head are "
        "real K-quants in Q4_K_M; its inner dims (64) are not multiples of 256, so ssm_out, "
        "attn_output and ffn_down take llama.cpp's fallbacks (Q4_K -> Q5_0, Q6_K -> Q8_0). The MoE "
        "model is 128 wide (8 experts would otherwise dominate the size), so its Q4_K_M file is "
        "mostly Q5_0/Q5_1/Q8_0 with one K-quant (eh_proj, rows of 256)."
    )
    a("")
    a("| file | bytes | sha256 (first 16) | tensor types |")
    a("|---|---|---|---|")
    for name, info in meta["files"].items():
        a(
            f"| `models/{name}` | {info['bytes']} | `{info['sha256'][:16]}` | "
            f"{_types(mg.MODELS / name)} |"
        )
    a("")
    a("### How the logits were recorded")
    a("")
    a(
        f"Token sequences (`logits/sequences.npz`, keys `s16`, `s100`, `s700`): ids drawn uniformly "
        f"from the {G.EOT_ID} ordinary tokens by one `numpy.random.default_rng({mg.SEQ_SEED})`, "
        f"drawn in the order 16, 100, 700 (`integers(0, {G.EOT_ID}, size=n)`). Two-batch split points: "
        + ", ".join(f"{n}: {s}" for n, s in mg.SPLITS.items())
        + "."
    )
    a("")
    a("llama.cpp (`tests/reference/golden_llama.py`, low-level API):")
    a(
        "- model params: `n_gpu_layers 0`, `use_extra_bufts = false` (no CPU_REPACK weight "
        "repacking: the plain `vec_dot` path), `load_mtp = true`, mmap default."
    )
    a(
        f"- context params: `n_ctx = n_batch = n_ubatch = {1024}` (a whole sequence is one ubatch), "
        "`n_seq_max 1`, `n_outputs_max = n_outputs_max_per_seq = 0` (every row output), "
        f"`n_threads = n_threads_batch = 2`, `type_k = type_v = F16` (the defaults), "
        f"`flash_attn_type = ENABLED`. With the default AUTO, llama.cpp resolves flash attention "
        f"on this CPU backend to **{'enabled' if meta.get('flash_attn_auto_on') else 'disabled'}** "
        "(read from its log), so ENABLED is the default behaviour made explicit. The fused "
        "Gated-DeltaNet ops are on (llama-context.cpp sets `fused_gdn_ar = fused_gdn_ch = true`)."
    )
    a(
        "- `one`: the whole sequence in one `llama_decode`, all rows output. `two`: the same context "
        "cleared, the sequence decoded in two calls (split point above): llama.cpp against itself."
    )
    a(
        "- MTP: a second context of type `LLAMA_CONTEXT_TYPE_MTP` on the same model. The trunk "
        "context exports its post-final-norm hidden rows (`llama_set_embeddings_nextn(ctx, true, "
        "false)`, `llama_get_embeddings_nextn`; both from `src/llama-ext.h`, C++ linkage, called "
        "through ctypes by mangled name). MTP row k = token x_k with the trunk's hidden row k-1 as "
        "its embedding (`llama_batch_ext_add_token` + `llama_batch_ext_set_pos({k,0,0,0})` + "
        "`llama_batch_ext_set_embd_token` + `llama_process(DECODE)`, as common_batch does). "
        "`mtp0`: rows 0..n-1, row 0 paired with a zero hidden row (what the draft driver in "
        "common/speculative.cpp does on a fresh sequence: its pending_h starts at zero); `mtp1`: "
        "rows 1..n-1 only. Row k's logits predict x_{k+2}."
    )
    a(
        "- `chain`: after `mtp0`'s rows, x_n = argmax of the trunk's last row; MTP row (x_n, h_{n-1}) "
        "at position n, then (its argmax, the MTP's own output hidden `hm`, from "
        "`llama_get_embeddings_nextn_ith` with masked=true) at n+1, ... for 4 steps. "
        "`chain_tokens` = [x_n, d1, d2, d3, d4]."
    )
    a(
        "- `greedy16` / `greedy100`: the 16- / 100-token prompt in one call, then 32 single-token "
        "`llama_decode` calls on the argmax; `greedy*_tokens` are the 32 generated ids, "
        "`greedy*_margin` the top-1 minus top-2 logit of each step."
    )
    a("")
    a(
        "transformers (`hf-f32`, `hf-bf16`): the same model objects in float32 (eager attention, "
        "transformers' torch fallbacks for the conv and the chunked delta rule); `hf-bf16` has the "
        "weights the BF16 file stores as BF16 rounded to bfloat16 (nearest-even) first, so it is the "
        "exact float32 function of what that file holds. Trunk logits are one forward over the "
        "sequence. The MTP reference (`golden_models.MTPHead`) computes, per row, "
        "`fc([enorm(embed(x_k)) ; hnorm(h_{k-1})])` -> decoder layer (RoPE at position k, causal over "
        "the MTP rows) -> `mtp.norm` -> lm_head, with h = transformers' own post-norm hidden rows; "
        "chain and greedy are recomputed without a cache."
    )
    a("")
    a("### File format")
    a("")
    a(
        "`logits/{dense,moe}-{f32,bf16,q8_0,q4_k_m}.npz` (llama.cpp) and "
        "`logits/{dense,moe}-hf-{f32,bf16}.npz` (transformers; no `two` record). For each record "
        f"`R` in `s{{16,100,700}}_{{one,two,mtp0,mtp1,chain}}`, `greedy{{16,100}}`: "
        f"`R_topk_ids` int32 [rows, {mg.TOPK}] (descending logit, ties by lower id), `R_topk_vals` "
        "float32, `R_lse` float32 [rows] (log-sum-exp of the full row, in float64, so the stored "
        "ids' log-probabilities are exact), `R_full_rows` int32 and `R_full` float32 [len, vocab] "
        "(complete logits of those rows: all rows of s16 and of chains, 9-11 spread rows of the "
        "other trunk and MTP records, including both sides of the split, none for greedy; indices "
        "are into the record's own rows, so `mtp1` row j is position j+1). Also `sN_split`, "
        "`sN_chain_tokens`, `greedyN_tokens`, "
        "`greedyN_margin`, and for llama.cpp files `gguf_sha256` of the GGUF they came from. "
        "`logits/summary.json` holds every comparison below in full."
    )
    a("")
    a("### Measured")
    a("")
    a(
        "Metrics: max |Δlogit| over all rows and the vocabulary; mean KL(first || second) over rows "
        "(float64); top-1 agreement over all rows, and over rows whose first top-1 margin is >= 0.5."
    )
    a("")
    a(
        "**llama.cpp against itself** (one batch vs two; thread count 1 vs 2; exporting the hidden "
        "rows on vs off):"
    )
    a("")
    a(
        "| file | s16 max / KL | s100 max / KL / top-1 | s700 max / KL / top-1 | threads 1 vs 2 | h export |"
    )
    a("|---|---|---|---|---|---|")
    for key, s in summary["llama"].items():
        c16, c100, c700 = (s[f"s{n}_one_vs_two"] for n in (16, 100, 700))
        thr = max(s[f"s{n}_threads2_vs_1"] for n in (16, 100, 700))
        hx = max(s[f"s{n}_one_vs_export_h"] for n in (16, 100, 700))
        a(
            f"| {key} | {_f(c16['max_abs'])} / {_f(c16['mean_kl'])} | {_f(c100['max_abs'])} / "
            f"{_f(c100['mean_kl'])} / {_f(c100['top1'])} | {_f(c700['max_abs'])} / "
            f"{_f(c700['mean_kl'])} / {_f(c700['top1'])} | {_f(thr)} | {_f(hx)} |"
        )
    a("")
    pp = summary.get("prefix_probe", {})
    if pp:
        ks = list(next(iter(pp.values())).keys())
        a(
            "Where that comes from: the first k rows decoded as a k-token batch vs the same rows of a "
            "200-token batch (dense, s700 prefix), max |Δlogit|:"
        )
        a("")
        a("| file | " + " | ".join(f"k={k}" for k in ks) + " |")
        a("|---|" + "---|" * len(ks))
        for f, row in pp.items():
            a(f"| {f} | " + " | ".join(_f(row[k]) for k in ks) + " |")
        a("")
        a(
            "llama.cpp's CPU flash attention (ggml-cpu/ops.cpp `ggml_compute_forward_flash_attn_ext_f16`) "
            "uses a tiled kernel when a ubatch has >= 64 query rows (`GGML_FA_TILE_Q`): Q stays F32, "
            "K/V are widened from F16 and V is accumulated in F32. Below 64 rows it uses "
            "`flash_attn_ext_f16_one_chunk`: Q rounded to F16 and V accumulated in F16 (spec section "
            "10 describes only this one; ops.cpp `ggml_compute_forward_flash_attn_ext_f16_one_chunk`). "
            "From the same function: a single-row decode over >= 512 KV cells takes a third, split-KV "
            "path (by that rule the s700 chain steps use it; not measured separately here). "
            "So the `one` records of s100/s700 are the tiled path, those of s16 and "
            "each greedy step the one-chunk path; a split whose parts are both >= 64 rows reproduces "
            "`one` bit for bit. Thread count does not change the results. The F32 differences are "
            "amplified in quantized files by the Q8_0/Q8_K activation rounding downstream."
        )
        a("")
    a(
        "**llama.cpp vs transformers** (F32 and BF16 files against their exact float32 reference; the "
        "quantized files against hf-f32, i.e. the quantization error, for scale):"
    )
    a("")
    a(
        "| comparison | s16 max / KL / top-1 | s100 max / KL / top-1 (clear) | s700 max / KL / top-1 (clear) |"
    )
    a("|---|---|---|---|")
    for key, s in summary["hf_vs_llama"].items():
        c16, c100, c700 = s["s16"], s["s100"], s["s700"]
        a(
            f"| {key} | {_f(c16['max_abs'])} / {_f(c16['mean_kl'])} / {_f(c16['top1'])} | "
            f"{_f(c100['max_abs'])} / {_f(c100['mean_kl'])} / {_f(c100['top1'])} ({_f(c100['top1_clear'])}) | "
            f"{_f(c700['max_abs'])} / {_f(c700['mean_kl'])} / {_f(c700['top1'])} ({_f(c700['top1_clear'])}) |"
        )
    a("")
    a(
        "**MTP head, llama.cpp vs the transformers-module reference** (each teacher-forced on its own "
        "trunk's hidden rows):"
    )
    a("")
    a(
        "| comparison | s16 mtp0 max / top-1 | s100 mtp0 max / KL / top-1 | s700 mtp0 max / KL / top-1 | s700 mtp1 max / top-1 | chains equal |"
    )
    a("|---|---|---|---|---|---|")
    for key, s in summary["mtp"].items():
        ch = summary["chain"][key]
        same = sum(ch[f"s{n}"]["llama_tokens"] == ch[f"s{n}"]["hf_tokens"] for n in (16, 100, 700))
        a(
            f"| {key} | {_f(s['s16_mtp0']['max_abs'])} / {_f(s['s16_mtp0']['top1'])} | "
            f"{_f(s['s100_mtp0']['max_abs'])} / {_f(s['s100_mtp0']['mean_kl'])} / {_f(s['s100_mtp0']['top1'])} | "
            f"{_f(s['s700_mtp0']['max_abs'])} / {_f(s['s700_mtp0']['mean_kl'])} / {_f(s['s700_mtp0']['top1'])} | "
            f"{_f(s['s700_mtp1']['max_abs'])} / {_f(s['s700_mtp1']['top1'])} | {same}/3 |"
        )
    a("")
    a(
        "**Greedy continuations**: steps (of 32) before llama.cpp's and transformers' tokens first differ:"
    )
    a("")
    a("| comparison | greedy16 | greedy100 |")
    a("|---|---|---|")
    for key, s in summary["greedy"].items():
        a(f"| {key} | {s['greedy16']['same_tokens']} | {s['greedy100']['same_tokens']} |")
    a("")
    sens = summary.get("sensitivity")
    if sens:
        a(
            "**How discriminating the models are** (transformers, float32, s100; each bug simulated by "
            "editing the weights so the result equals that of a runtime with the bug):"
        )
        a("")
        a("| change | dense max / KL / top-1 | moe max / KL / top-1 |")
        a("|---|---|---|")
        for cname in sens["dense"]:
            dd, mm = sens["dense"][cname], sens["moe"][cname]
            a(
                f"| {cname} | {_f(dd['max_abs'])} / {_f(dd['mean_kl'])} / {_f(dd['top1'])} | "
                f"{_f(mm['max_abs'])} / {_f(mm['mean_kl'])} / {_f(mm['top1'])} |"
            )
        a("")
        a(
            "Every simulated bug moves the logits by far more than llama.cpp's own noise or its "
            "distance from transformers on the F32 files; small weight noise moves them a little "
            "(the MoE's largest changes come from a router near-tie flipping an expert choice)."
        )
        a("")
    a("### Notes for the forward pass")
    a("")
    a(
        "- `attention.recurrent_layers` (bool array over all blocks, MTP block false) and "
        "`full_attention_interval` are both written; llama.cpp reads the array first."
    )
    a("- The dense file has no `output.weight` (tied head = `token_embd`); the MoE file has one.")
    a(
        "- `ssm_alpha`/`ssm_beta` are quantized like other matrices in Q4_K_M (Q4_K in the dense file); "
        "`ffn_gate_inp`, `ffn_gate_inp_shexp` (1-D, {n_embd}), `ssm_conv1d`, `ssm_a`, `ssm_dt.bias` "
        "and all norms stay F32 in every file."
    )
    a(
        "- The converter splits HF's fused `experts.gate_up_proj` into `ffn_gate_exps` and "
        "`ffn_up_exps` (gate = first half)."
    )
    a(
        "- Q4_K_M with these shapes also contains Q5_0, Q5_1 and Q8_0 (fallbacks for rows that are "
        "not multiples of 256): a runtime claiming Q4_K_M support needs all of them."
    )
    a(
        "- The quantized dense model is far from its float model (Q4_K_M top-1 agreement with hf-f32 "
        "about 50%): compare quantized files with llama.cpp on the same file, never with transformers."
    )
    a(END)
    return "\n".join(L) + "\n"


def write(meta: dict, summary: dict, mg) -> Path:
    readme = mg.GOLDEN / "README.md"
    text = (
        readme.read_text()
        if readme.exists()
        else "# tests/golden\n\nCommitted reference fixtures; CI reads them and never runs "
        "llama.cpp or transformers.\n\n"
    )
    new = section(meta, summary, mg)
    if BEGIN in text and END in text:
        pre = text[: text.index(BEGIN)]
        post = text[text.index(END) + len(END) :].lstrip("\n")
        text = pre + new + ("\n" + post if post else "")
    else:
        text = text.rstrip("\n") + "\n\n" + new
    readme.write_text(text)
    return readme
