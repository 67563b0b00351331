"""trainer.models.presets and trainer.models.flops: presets, model directories, parameter and FLOPs formulas."""

from __future__ import annotations

import json

import pytest
import torch

from trainer.models.flops import DecoderArch, flops_params, parameter_count, train_flops
from trainer.models.presets import PRESETS, ModelError, build_model, load_tokenizer, model_spec, save_preset


def test_r1_distill_architectures_have_the_published_parameter_counts():
    # DeepSeek-R1-Distill-Qwen-1.5B and -7B: 1,777,088,000 and 7,615,616,512 parameters.
    assert model_spec("r1-distill-qwen-1.5b").parameter_count == 1_777_088_000
    assert model_spec("r1-distill-qwen-7b").parameter_count == 7_615_616_512


def test_the_1_5b_preset_is_the_model_cards_config():
    # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B config.json (head_dim = 1536 / 12).
    assert PRESETS["r1-distill-qwen-1.5b"] == {
        "vocab_size": 151936,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
    }
    assert PRESETS["tiny"]["tie_word_embeddings"] is True


def test_parameter_count_formula_matches_the_built_model():
    model = build_model("tiny")
    assert sum(p.numel() for p in model.parameters()) == model_spec("tiny").parameter_count


def test_flops_params_by_hand():
    # L=2, H=4, I=8, n_h=2, n_kv=1, d=2, V=10: q=4, k=v=2, o=4
    # per layer 3*4*8 + 4*(4+2+2+4) = 96 + 48 = 144; N = 2*144 + 2*10*4 = 368
    arch = DecoderArch(2, 4, 8, 2, 1, 2, 10)
    assert flops_params(arch) == 368
    # train: 6*368*(3+5) + 6*(9+25)*2*2*2 = 17664 + 1632
    assert train_flops(arch, [3, 5]) == 17664 + 1632
    # parameters: attn 4*4+4 + 2*(4*2+2) + 4*4 = 56; mlp 96; norms 8 -> 160 per layer;
    # embeddings untied 2*40 = 80; final norm 4 -> 2*160 + 80 + 4 = 404
    assert parameter_count(arch) == 404


def test_r1_distill_1_5b_flops_per_token():
    # N for the 1.5B: 28*(3*1536*8960 + 1536*(1536+256+256+1536)) + 2*151936*1536
    expected = 28 * (3 * 1536 * 8960 + 1536 * (1536 + 256 + 256 + 1536)) + 2 * 151936 * 1536
    assert model_spec("r1-distill-qwen-1.5b").flops_params == expected


def test_model_directory_round_trip(tmp_path):
    path = save_preset("tiny", tmp_path / "m", seed=3)
    spec = model_spec(str(path))
    assert spec.source == str(path) and spec.arch == model_spec("tiny").arch
    a = build_model("tiny", seed=3)
    b = build_model(str(path))
    for (name, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb), name
    tok = load_tokenizer(str(path))
    assert tok.decode(tok("12+3")["input_ids"]) == "12+3"


def test_bad_model_paths_name_the_path(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        model_spec(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match=r"empty.*is not a model directory: no config.json"):
        model_spec(str(tmp_path / "empty"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match=r"broken/config.json: not readable JSON"):
        model_spec(str(broken))
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text(json.dumps(model_spec("tiny").arch.to_dict()))
    with pytest.raises(ModelError, match="weightless"):
        build_model(str(weightless))
