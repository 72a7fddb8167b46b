#!/usr/bin/env python3
"""The DSpark / DFlash2 layouts kquant detects (src/checkpoint/block.rs `Layout`) that have no
trained fixture, as small random checkpoints for the engine-loader tier (run with an engine
venv's torch and safetensors):

    python blocks.py OUT [--seed 0]

writes, next to the trained fixtures' layouts (fixtures/kimi-k2.5-tiny/dspark: vLLM
`Qwen3DSparkModel`; fixtures/kimi-k2.5-tiny/dflash2: `DFlash2DraftModel`), each with the
trained fixture's tensor names and shapes (hidden 256, two layers, taps [0, 2] of the tiny
Kimi-K2.5 target) filled with seeded random bf16 values:

- OUT/dspark-specforge: SpecForge's `DSparkDraftModel` (model_type `qwen3`), the DSpark keys in
  `dflash_config` and copied at the root; `num_target_layers` the target's depth;
- OUT/dspark-specforge-nested: the same with the DSpark keys only in `dflash_config` (as
  `specforge export` writes them);
- OUT/dspark-speculators: speculators `dspark` (`speculators_model_type`, the Qwen3 fields in
  `transformer_layer_config`, raw `aux_hidden_state_layer_ids`, the 1 + N block);
- OUT/dspark-k3: `K3DSparkModel` (model_type `k3_dspark`): MLA with q-LoRA, `context_proj`,
  `context_norm`, `final_norm`, the target's embedding in the file (training's copy);
- OUT/dflash2-mla: DFlash2 with `dflash_config.attention_mode: mla` (MLA q_a/q_b/kv_a/kv_b
  projections in place of q/k/v).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "fixtures", "kimi-k2.5-tiny")
# The DSpark keys SpecForge nests in `dflash_config` (vLLM reads them at the root only).
DSPARK_KEYS = ["markov_rank", "markov_head_type", "enable_confidence_head",
               "confidence_head_with_markov"]
# K3's MLA geometry (small; hidden and vocab are the target's: K3 shares its embedding).
MLA = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
       "v_head_dim": 32}


def fixture(name):
    from safetensors import safe_open

    path = os.path.join(FIX, name)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with safe_open(os.path.join(path, "model.safetensors"), framework="pt") as sf:
        shapes = {k: list(sf.get_slice(k).get_shape()) for k in sf.keys()}
    return cfg, shapes


def mla_attention(cfg, layer):
    """The MLA self-attention tensors of one layer: {name: shape}."""
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    qk = MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"]
    p = f"layers.{layer}.self_attn."
    return {
        p + "q_a_proj.weight": [MLA["q_lora_rank"], h],
        p + "q_a_layernorm.weight": [MLA["q_lora_rank"]],
        p + "q_b_proj.weight": [nh * qk, MLA["q_lora_rank"]],
        p + "kv_a_proj_with_mqa.weight": [MLA["kv_lora_rank"] + MLA["qk_rope_head_dim"], h],
        p + "kv_a_layernorm.weight": [MLA["kv_lora_rank"]],
        p + "kv_b_proj.weight": [
            nh * (MLA["qk_nope_head_dim"] + MLA["v_head_dim"]), MLA["kv_lora_rank"]],
        p + "o_proj.weight": [h, nh * MLA["v_head_dim"]],
    }


def with_mla(shapes, cfg):
    """`shapes` with every layer's GQA attention replaced by MLA attention."""
    out = {k: v for k, v in shapes.items() if ".self_attn." not in k}
    for i in range(cfg["num_hidden_layers"]):
        out.update(mla_attention(cfg, i))
    return out


def layouts():
    """{name: (config, {tensor: shape})}."""
    ds_cfg, ds = fixture("dspark")
    d2_cfg, d2 = fixture("dflash2")
    target = json.load(open(os.path.join(FIX, "target", "config.json")))
    out = {}

    sf = {k: v for k, v in ds_cfg.items() if k not in ("target_hidden_size",)}
    sf["architectures"] = ["DSparkDraftModel"]
    sf["num_target_layers"] = target["num_hidden_layers"]
    sf["dflash_config"] = {**ds_cfg["dflash_config"], "attention_mode": "gqa",
                           "projector_type": "dspark",
                           **{k: ds_cfg[k] for k in DSPARK_KEYS}}
    out["dspark-specforge"] = (sf, ds)
    nested = {k: v for k, v in sf.items() if k not in DSPARK_KEYS}
    out["dspark-specforge-nested"] = (nested, ds)

    qwen3 = ["model_type", "hidden_size", "intermediate_size", "num_attention_heads",
             "num_key_value_heads", "head_dim", "num_hidden_layers", "hidden_act",
             "rms_norm_eps", "rope_theta", "max_position_embeddings", "vocab_size",
             "attention_bias", "tie_word_embeddings"]
    spec = {
        "architectures": ["Qwen3DSparkModel"], "speculators_model_type": "dspark",
        "transformer_layer_config": {k: ds_cfg[k] for k in qwen3},
        # speculators' raw ids: vLLM taps aux_id - 1 (the fixture's [0, 2]).
        "aux_hidden_state_layer_ids": [i + 1 for i in ds_cfg["dflash_config"]["target_layer_ids"]],
        "sample_from_anchor": False, "block_size": ds_cfg["block_size"],
        "speculators_config": {
            "algorithm": "dspark", "default_proposal_method": "dspark",
            "proposal_methods": [{"proposal_type": "dspark",
                                  "speculative_tokens": ds_cfg["block_size"] - 1}],
            "verifier": {"name_or_path": "tiny-kimi-k2.5",
                         "architectures": target["architectures"]},
        },
        **{k: ds_cfg[k] for k in DSPARK_KEYS + ["draft_vocab_size", "mask_token_id",
                                                 "target_hidden_size"]},
    }
    out["dspark-speculators"] = (spec, ds)

    taps = ds_cfg["dflash_config"]["target_layer_ids"]
    k3 = {
        "architectures": ["K3DSparkModel"], "model_type": "k3_dspark",
        "_torchspec_version": "0.1.0", "hidden_size": ds_cfg["hidden_size"],
        "intermediate_size": ds_cfg["intermediate_size"], "num_hidden_layers": 2,
        "num_attention_heads": ds_cfg["num_attention_heads"],
        "num_key_value_heads": ds_cfg["num_attention_heads"], **MLA,
        "mla_use_nope": False, "mla_use_output_gate": False, "hidden_act": "silu",
        "rms_norm_eps": 1e-6, "rope_theta": 50000.0, "max_position_embeddings": 4096,
        "vocab_size": ds_cfg["vocab_size"], "draft_vocab_size": ds_cfg["vocab_size"],
        "target_hidden_size": target["hidden_size"], "num_target_layers": len(taps),
        "target_num_hidden_layers": target["num_hidden_layers"], "target_layer_ids": taps,
        "mask_token_id": ds_cfg["mask_token_id"], "block_size": ds_cfg["block_size"],
        "markov_rank": ds_cfg["markov_rank"], "markov_head_type": "vanilla",
        "enable_confidence_head": True, "confidence_head_with_markov": False,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    rename = {"fc.weight": "context_proj.weight", "hidden_norm.weight": "context_norm.weight",
              "norm.weight": "final_norm.weight"}
    k3_shapes = {rename.get(k, k): v for k, v in with_mla(ds, k3).items()}
    k3_shapes["confidence_head.proj.weight"] = [1, k3["hidden_size"]]
    k3_shapes["embed_tokens.weight"] = [k3["vocab_size"], k3["hidden_size"]]
    out["dspark-k3"] = (k3, k3_shapes)

    mla2 = {**d2_cfg, **MLA, "dflash_config": {**d2_cfg["dflash_config"], "attention_mode": "mla"}}
    out["dflash2-mla"] = (mla2, with_mla(d2, mla2))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    for i, (name, (cfg, shapes)) in enumerate(sorted(layouts().items())):
        g = torch.Generator().manual_seed(a.seed + i)
        tensors = {}
        for k, shape in sorted(shapes.items()):
            if k.endswith(("norm.weight", "layernorm.weight")):
                t = 1.0 + 0.1 * torch.randn(shape, generator=g)
            else:
                t = torch.randn(shape, generator=g) / max(shape[-1], 1) ** 0.5
            tensors[k] = t.to(torch.bfloat16).contiguous()
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        print(d, len(tensors), "tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
