"""Every training method end to end with target.device=cuda (experiments/gpu/train.sh's path): the data phase through
the target's graphs, features read in padded batches, training and the held-out evaluation on the GPU, an export
the drafter decodes exactly with. The same tests run on CPU (target.device=cpu), so CI checks them where it has no
GPU; the data phase on CUDA is checked against the CPU's store."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from helpers import CHAT_TEMPLATE, tiny_config

from specdec import autoregressive_generate, speculative_generate
from specdec.training.trainer import train

DEVICES = [pytest.param("cuda", marks=pytest.mark.gpu), "cpu"]

PROMPTS = ["Explain how a river shapes its valley.", "Write a short poem about the sea.",
           "List three uses of a paper clip.", "What makes a good cup of tea?", "Describe a busy market at dawn.",
           "Write a function that reverses a list.", "Why is the sky blue?", "Summarise the plot of a fairy tale."]


def file_config(out, folder):
    """:func:`tiny_config` reading its prompts and held-out sets from JSONL files written to ``folder`` (as
    experiments/gpu/train.sh does: the GPU machine has none of the corpora's packages)."""
    folder.mkdir(parents=True, exist_ok=True)

    def write(name, rows, kind):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": f"{name}/{i}", "source": name, "category": name, "kind": kind,
                                            "text": text}) + "\n" for i, text in enumerate(rows)))
        return str(path)

    cfg = tiny_config(out)
    cfg.data.prompts_file = write("prompts", PROMPTS[:6], "chat")
    cfg.eval.answer_sources = [write("mtbench", PROMPTS[6:], "chat")]
    cfg.eval.text_sources = [write("wikipedia", [" ".join(PROMPTS)], "completion")]
    return cfg


def method_config(name: str):
    from specdec.training.methods.dflash import DFlashMethodConfig
    from specdec.training.methods.draft_model import DraftModelMethodConfig
    from specdec.training.methods.eagle import EagleMethodConfig
    from specdec.training.methods.medusa import MedusaMethodConfig

    return {"medusa": lambda: MedusaMethodConfig(num_heads=3, tree_nodes=5, draft_vocab=None, token_aware=True),
            "eagle": lambda: EagleMethodConfig(aux_layers=[0, 0, 0], draft_vocab=20, ttt_steps=2, chunk_len=32,
                                               eval_depth=3),
            "dflash": lambda: DFlashMethodConfig(aux_layers=[0, 0, 0], num_layers=1, block_size=4, draft_vocab=20,
                                                 anchors=4, chunk_len=32, tree_nodes=6, max_rank=3),
            "draft_model": lambda: DraftModelMethodConfig(layers=[0], loss="tv", prompt_loss=True, chunk_len=32,
                                                          on_policy_fraction=0.5, on_policy_tokens=4, eval_depth=3),
            }[name]()


def drafter_from_export(name: str, path, model):
    from specdec.drafters import DraftModelDrafter
    from specdec.drafters.dflash import DFlashDrafter, load_dflash
    from specdec.drafters.draft_model.student import load_student
    from specdec.drafters.eagle import EagleDrafter, load_eagle
    from specdec.drafters.medusa import MedusaDrafter, load_heads

    embeddings = model.get_input_embeddings().weight
    if name == "medusa":
        heads, meta = load_heads(path / "heads.safetensors", hidden_size=model.config.hidden_size,
                                 vocab_size=model.config.vocab_size)
        return MedusaDrafter(heads, model.get_output_embeddings().weight, paths=meta["tree"],
                             embed_weight=embeddings), len(meta["tree"])
    if name == "eagle":
        return EagleDrafter(load_eagle(path, target_config=model.config).attach(embeddings)), 3
    if name == "dflash":
        return DFlashDrafter(load_dflash(path, target_config=model.config).attach(embeddings), None), 3
    return DraftModelDrafter(load_student(path, model)), 3


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["medusa", "eagle", "dflash", "draft_model"])
def test_each_method_trains_on_the_device_it_names_and_its_export_decodes_exactly(tmp_path, tiny_pair, name, device):
    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    cfg = file_config(tmp_path / "run", tmp_path / "prompts")
    cfg.method = method_config(name)
    cfg.target.device, cfg.data.feature_batch, cfg.optim.epochs, cfg.optim.lr = device, 3, 2, 3e-3
    cfg.export = str(tmp_path / "export")
    metrics = train(cfg, target=copy.deepcopy(model), tokenizer=tokenizer)  # moved to the device there
    assert metrics["finished"] and metrics["device"].startswith(device)
    assert set(metrics["eval"]) >= {"val", "answers_mtbench"}
    provenance = json.loads((tmp_path / "export" / "provenance.json").read_text())
    assert provenance["method"]["name"] == name and provenance["data"]["size"]["train"]["tokens"] > 0
    assert provenance["machine"] == (torch.cuda.get_device_name() if device == "cuda" else provenance["machine"])
    drafter, k = drafter_from_export(name, tmp_path / "export", model)
    ids = torch.tensor([[2, 4, 6, 7, 3, 2, 5]])
    ref = autoregressive_generate(model, ids, max_new_tokens=12, eos_token_id=[])
    assert speculative_generate(model, drafter, ids, k=k, max_new_tokens=12, eos_token_id=[]).sequences == \
        ref.sequences


@pytest.mark.gpu
def test_the_data_phase_on_cuda_builds_the_cpu_store(tmp_path, tiny_pair):
    """The target's answers through CUDA graphs and the feature layers in padded batches: the tokens the CPU's store
    holds, the hidden states and features to float32 rounding."""
    from specdec.training.distill.store import DataNeeds, load_or_build

    model, tokenizer = tiny_pair
    tokenizer.chat_template = CHAT_TEMPLATE
    needs = DataNeeds(layers=(0, 1), context=True)
    cpu = load_or_build(file_config(tmp_path / "cpu", tmp_path / "prompts"), model, tokenizer, needs,
                        tmp_path / "cpu.safetensors")
    cfg = file_config(tmp_path / "cuda", tmp_path / "prompts")
    cfg.data.feature_batch = 4
    cuda = load_or_build(cfg, copy.deepcopy(model).to("cuda"), tokenizer, needs, tmp_path / "cuda.safetensors")
    assert cuda.keys() == cpu.keys()
    for name, split in cpu.items():
        assert torch.equal(cuda[name].tokens, split.tokens) and torch.equal(cuda[name].context, split.context), name
        for field in ("hidden", "features", "context_hidden", "context_features"):
            torch.testing.assert_close(getattr(cuda[name], field), getattr(split, field), atol=1e-4, rtol=1e-4)
