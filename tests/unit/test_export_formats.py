"""orchestrator/export/formats.py: a study's schedule rendered for vLLM, SGLang, an env file and JSON
(TensorRT-LLM: tests/unit/test_export_trtllm.py; the allreduce per engine: test_export_allreduce.py).
Pure string building: no GPU, no network. The shell lines are parsed back with shlex, and the JSON
inside --speculative-config with json, so every check is on the values an engine would receive.

    .venv/bin/python -m pytest -q tests/unit/test_export_formats.py
"""

from __future__ import annotations

import json
import shlex

import pytest

from orchestrator.export.formats import ENGINE_VERSIONS, FORMATS, render, to_env, to_json, to_sglang, to_trtllm, to_vllm

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
OPTIONS = {
    "ngram": {"ngram_max": 3, "ngram_min": 2},
    "draft_model": {"model_path": "/ckpt/draft-135m"},
    "eagle3": {"model_path": "/ckpt/eagle3-head"},
    "layer_skip": {"layers": 8},
    "mtp": {},  # the model's own MTP layer: no option (workers/spec DrafterSpec declares none for mtp)
    "none": {},
}


def winner(batch_size: int = 1, k: int = 4, drafter: str = "ngram", tp: int = 2, **kw) -> dict:
    row = {
        "batch_size": batch_size,
        "tp": tp,
        "num_draft_tokens": k,
        "drafter": drafter,
        "drafter_options": dict(OPTIONS[drafter]),
        "backend": "nccl",
        "nccl_env": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"},
        "engine": {"attention": "auto", "cuda_graphs": True},
        "throughput_tok_s": 442.2,
        "plain_throughput_tok_s": 200.1,
        "speedup_vs_plain": 2.21,
        "noise_band_tok_s": 3.1,
        "trial": 7,
    }
    row.update(kw)
    return row


def schedule(*rows: dict, model: str = "/models/llama-8b") -> dict:
    return {"model": model, "dtype": "bfloat16", "study": "tp2-pcie", "schedule": list(rows)}


def command(text: str) -> list[str]:
    """The command of an engine export as argv: the lines that are no comment and no export."""
    body = "\n".join(ln for ln in text.splitlines() if ln and not ln.startswith("#") and not ln.startswith("export "))
    return shlex.split(body.replace("\\\n", " "))


def flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in argv; None if the flag is absent (and never twice)."""
    assert argv.count(name) <= 1, f"{name} given twice"
    return argv[argv.index(name) + 1] if name in argv else None


def speculative_config(text: str) -> dict | None:
    value = flag(command(text), "--speculative-config")
    return None if value is None else json.loads(value)


def exports(text: str) -> dict[str, str]:
    out = {}
    for ln in text.splitlines():
        if ln.startswith("export "):
            key, _, value = ln[len("export ") :].partition("=")
            out[key] = shlex.split(value)[0]
    return out


def comments(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if ln.startswith("#"))


# ---------------------------------------------------------------------------- vLLM


def test_vllm_ngram():
    text = to_vllm(schedule(winner(k=5)))
    argv = command(text)
    assert argv[:3] == ["vllm", "serve", "/models/llama-8b"]
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--dtype") == "bfloat16"
    assert speculative_config(text) == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    # an NCCL winner: vLLM's PyNccl allreduce, its custom and torch symmetric-memory allreduces off
    assert exports(text) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128", **NVLS_OFF, "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"}
    assert "--disable-custom-all-reduce" in argv
    assert ENGINE_VERSIONS["vllm"] in text


def test_vllm_draft_model_and_eagle3():
    spec = speculative_config(to_vllm(schedule(winner(k=3, drafter="draft_model", tp=4))))
    assert spec == {"method": "draft_model", "model": "/ckpt/draft-135m", "num_speculative_tokens": 3}
    text = to_vllm(schedule(winner(k=6, drafter="eagle3", tp=8)))
    assert speculative_config(text) == {"method": "eagle3", "model": "/ckpt/eagle3-head", "num_speculative_tokens": 6}
    assert flag(command(text), "--tensor-parallel-size") == "8"


def test_vllm_mtp_is_method_mtp_without_a_model():
    """An mtp winner (DeepSeek-V3's own MTP layer): vLLM 0.25.0's method "mtp" ("deepseek_mtp" is a deprecated
    alias it rewrites), num_speculative_tokens k and no model key (vLLM reads the layer from the target)."""
    text = to_vllm(schedule(winner(k=3, drafter="mtp", tp=8), model="/models/deepseek-v3"))
    assert speculative_config(text) == {"method": "mtp", "num_speculative_tokens": 3}
    assert "deepseek_mtp" not in text and "None" not in text
    argv = command(text)
    assert argv[2] == "/models/deepseek-v3" and flag(argv, "--tensor-parallel-size") == "8"
    notes = comments(text)
    assert "batch size 1: mtp k=3 (the model's own MTP layer, reused for each draft)" in notes
    assert "one MTP layer k=3 times per step" in notes and "no model key" in notes and "k > 1 may accept less" in notes
    assert "k > 1" not in comments(to_vllm(schedule(winner(k=1, drafter="mtp"))))


def test_vllm_mtp_k_table_per_batch_size():
    """The per-batch-size k table and the adaptive lines work for an mtp winner as for any other: mtp rows are
    one drafter (no option tells them apart), plain decoding gets K 0, another drafter is left out."""
    rows = [
        winner(1, k=3, drafter="mtp", draft_ms_p50=0.6, verify_ms_p50=5.0),
        winner(8, k=1, drafter="mtp"),
        winner(32, k=0, drafter="none"),
    ]
    text = to_vllm(schedule(*rows))
    assert speculative_config(text) == {
        "method": "mtp",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 7, 3], [8, 31, 1], [32, 32, 0]],
    }
    notes = comments(text)
    assert "takes one drafter" not in notes
    assert "support the static per-batch-size table below (k measured at batch sizes 1, 8, 32)" in notes
    assert "0.600 ms of drafting for k=3 over a 5.000 ms verify pass = 0.0400 per draft token" in notes
    text = to_vllm(schedule(winner(1, k=3, drafter="mtp"), winner(8, k=2, drafter="eagle3"), winner(16, k=1, drafter="mtp")))
    assert speculative_config(text)["num_speculative_tokens_per_batch_size"] == [[1, 15, 3], [16, 16, 1]]
    assert "batch size 8 was won by eagle3 k=2 (/ckpt/eagle3-head)" in comments(text)
    assert "model" not in speculative_config(text)


def test_vllm_layer_skip_has_no_equivalent():
    text = to_vllm(schedule(winner(k=3, drafter="layer_skip")))
    assert speculative_config(text) is None
    assert "layer_skip" in comments(text) and "no --speculative-config" in comments(text)
    assert flag(command(text), "--tensor-parallel-size") == "2"
    assert exports(text)["NCCL_NVLS_ENABLE"] == "0"


@pytest.mark.parametrize("row", [winner(k=0, drafter="none"), winner(k=0, drafter="ngram"), winner(k=3, drafter="none")])
def test_vllm_plain_decoding_won(row):
    text = to_vllm(schedule(row))
    assert speculative_config(text) is None
    assert "plain decoding" in comments(text)
    assert flag(command(text), "--tensor-parallel-size") == "2"


def test_vllm_k_table_per_batch_size():
    # unsorted on purpose: the export sorts by batch size; plain decoding at 16 becomes K 0
    rows = [winner(16, k=0, drafter="none"), winner(1, k=4), winner(4, k=2), winner(8, k=2)]
    text = to_vllm(schedule(*rows))
    spec = speculative_config(text)
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 15, 2], [16, 16, 0]]
    assert spec["num_speculative_tokens"] == 4
    assert spec["method"] == "ngram" and spec["prompt_lookup_max"] == 3


def test_vllm_k_table_buffer_is_the_largest_k():
    # vLLM caps every K in the table at num_speculative_tokens: it must be the table's largest
    text = to_vllm(schedule(winner(1, k=2), winner(8, k=5)))
    spec = speculative_config(text)
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 7, 2], [8, 8, 5]]
    assert spec["num_speculative_tokens"] == 5


def test_vllm_k_table_starts_at_1_and_skips_other_drafters():
    rows = [winner(2, k=4, drafter="eagle3"), winner(8, k=3, drafter="draft_model"), winner(32, k=1, drafter="eagle3")]
    text = to_vllm(schedule(*rows))
    spec = speculative_config(text)
    assert spec["method"] == "eagle3" and spec["model"] == "/ckpt/eagle3-head"
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 31, 4], [32, 32, 1]]
    assert "takes one drafter" in comments(text) and "batch size 8 was won by draft_model k=3" in comments(text)


def test_an_eagle3_heads_placement_is_no_other_drafter():
    rows = [winner(1, k=4, drafter="eagle3"), winner(8, k=2, drafter="eagle3")]
    rows[0]["drafter_options"]["placement"] = "rank0"
    rows[1]["drafter_options"]["placement"] = "actor"
    text = to_vllm(schedule(*rows))
    assert speculative_config(text)["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 8, 2]]
    assert "takes one drafter" not in comments(text)
    rows[1]["drafter_options"]["model_path"] = "/ckpt/another-head"
    assert "takes one drafter" in comments(to_vllm(schedule(*rows)))


def test_an_eagle3_winner_with_lookup_exports_the_head_and_says_what_is_lost():
    """drafter.lookup (n-gram lookup before the head) has no vLLM or SGLang equivalent: both get the
    head alone, a comment says so, and the same head with another lookup is the same drafter for
    an engine (no "takes one drafter" note: both winners export that head)."""
    row = winner(1, k=4, drafter="eagle3")
    row["drafter_options"]["lookup"] = 3
    for text in (to_vllm(schedule(row)), to_sglang(schedule(row))):
        assert "last 3 tokens repeated" in comments(text) and "runs the head alone" in comments(text)
    assert speculative_config(to_vllm(schedule(row))) == {"method": "eagle3", "model": "/ckpt/eagle3-head", "num_speculative_tokens": 4}
    assert "repeated" not in comments(to_vllm(schedule(winner(1, k=4, drafter="eagle3"))))
    other = winner(8, k=2, drafter="eagle3")  # lookup 0
    assert "takes one drafter" not in comments(to_vllm(schedule(row, other)))
    other["drafter_options"]["model_path"] = "/ckpt/another-head"
    assert "takes one drafter" in comments(to_vllm(schedule(row, other)))


def test_an_eagle3_tree_winner_is_a_chain_for_vllm_with_a_note():
    """vLLM 0.25.0 has no tree drafting (speculative_token_tree went with tree attention, PR 42121):
    a tree winner (drafter.tree_width 3, k 4: 12 drafts) exports the head's chain of k and says so;
    the tree width is an engine option, not another drafter."""
    row = winner(1, k=4, drafter="eagle3")
    row["drafter_options"]["tree_width"] = 3
    text = to_vllm(schedule(row))
    assert speculative_config(text) == {"method": "eagle3", "model": "/ckpt/eagle3-head", "num_speculative_tokens": 4}
    assert "speculative_token_tree" not in speculative_config(text)
    notes = comments(text)
    assert "drafter.tree_width 3" in notes and "12 drafts" in notes and "chain of k=4" in notes
    assert "eagle3 k=4 tree=3 (/ckpt/eagle3-head)" in notes  # the winners' lines
    assert "tree" not in comments(to_vllm(schedule(winner(1, k=4, drafter="eagle3"))))
    chain = winner(8, k=2, drafter="eagle3")  # batch sizes > 1 draft a chain: the same head, another k
    assert "takes one drafter" not in comments(to_vllm(schedule(row, chain)))
    for text in (to_vllm(schedule(row, chain)), to_sglang(schedule(row, chain))):
        assert "winner's (a tree of width 3) is used; batch size 8 drafted a chain" in comments(text)
    assert "draft shape" not in comments(to_sglang(schedule(row)))


def test_vllm_same_k_everywhere_has_no_table():
    spec = speculative_config(to_vllm(schedule(winner(1, k=4), winner(4, k=4), winner(16, k=4))))
    assert spec == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def test_vllm_notes_a_tp_that_differs_and_uses_the_smallest_batch_winners():
    row8 = winner(8, k=4, tp=4, nccl_env={"NCCL_ALGO": "Tree"})
    text = to_vllm(schedule(winner(1, k=4, tp=2), row8))
    assert flag(command(text), "--tensor-parallel-size") == "2"
    assert exports(text)["NCCL_ALGO"] == "Ring"
    assert "one tensor-parallel size" in comments(text)


def test_vllm_without_cuda_graphs_and_a_quoted_model_path():
    model = "/models/it's a model"
    text = to_vllm(schedule(winner(engine={"attention": "auto", "cuda_graphs": False}), model=model))
    argv = command(text)
    assert argv[2] == model
    assert "--enforce-eager" in argv
    assert "--enforce-eager" not in command(to_vllm(schedule(winner())))


def test_vllm_has_no_adaptive_speculation_and_the_header_says_which_schedule_the_study_supports():
    """No released vLLM has adaptive k (SpeculativeConfig has no such field; enable_adaptive_k /
    adaptive_k_c_draft are PR 47111, open): nothing of it is emitted, the header says so and which of the
    two the study's measurements support, and gives the draft-to-target ratio it measured:
    draft_ms / (k x verify_ms) = 0.4 / (4 x 5.0) = 0.02 per draft token."""
    rows = [winner(1, k=4, draft_ms_p50=0.4, verify_ms_p50=5.0), winner(8, k=2)]
    text = to_vllm(schedule(*rows))
    notes = comments(text)
    assert "adaptive speculation: vLLM 0.25.0 has none" in notes and "PR 47111, open" in notes
    assert "support the static per-batch-size table below (k measured at batch sizes 1, 8)" in notes
    assert "0.400 ms of drafting for k=4 over a 5.000 ms verify pass = 0.0200 per draft token" in notes
    assert not any("adaptive" in key for key in speculative_config(text))
    same_k = comments(to_vllm(schedule(winner(1, k=4, draft_ms_p50=0.9, verify_ms_p50=3.0), winner(8, k=4))))
    assert "support one static k (the best k at every batch size measured: 1, 8)" in same_k
    assert "0.900 ms of drafting for k=4 over a 3.000 ms verify pass = 0.0750 per draft token" in same_k


def test_vllm_adaptive_lines_without_measured_times_or_speculation():
    notes = comments(to_vllm(schedule(winner(1, k=4))))  # a schedule without draft/verify times
    assert "adaptive speculation" in notes and "draft-to-target" not in notes
    assert "adaptive speculation" not in comments(to_vllm(schedule(winner(1, k=0, drafter="none"))))


# ---------------------------------------------------------------------------- SGLang


def test_sglang_ngram():
    text = to_sglang(schedule(winner(k=4)))
    argv = command(text)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert flag(argv, "--model-path") == "/models/llama-8b"
    assert flag(argv, "--tp-size") == "2"
    assert flag(argv, "--speculative-algorithm") == "NGRAM"
    assert flag(argv, "--speculative-num-draft-tokens") == "5"  # the last accepted token + k drafts
    assert flag(argv, "--speculative-ngram-min-bfs-breadth") == "1"
    assert flag(argv, "--speculative-ngram-max-bfs-breadth") == "1"
    assert flag(argv, "--speculative-ngram-max-trie-depth") == "7"  # ngram_max 3 + k 4
    # removed from SGLang (PR 21225) or set by SGLang itself for NGRAM
    for gone in (
        "--speculative-ngram-max-match-window-size",
        "--speculative-ngram-min-match-window-size",
        "--speculative-ngram-branch-length",
    ):
        assert gone not in argv
    assert flag(argv, "--speculative-num-steps") is None
    assert exports(text) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128", **NVLS_OFF}


@pytest.mark.parametrize(
    ("drafter", "algorithm", "path"), [("eagle3", "EAGLE3", "/ckpt/eagle3-head"), ("draft_model", "STANDALONE", "/ckpt/draft-135m")]
)
def test_sglang_chain_drafting(drafter, algorithm, path):
    argv = command(to_sglang(schedule(winner(k=3, drafter=drafter, tp=4))))
    assert flag(argv, "--speculative-algorithm") == algorithm
    assert flag(argv, "--speculative-draft-model-path") == path
    assert flag(argv, "--speculative-num-steps") == "3"
    assert flag(argv, "--speculative-eagle-topk") == "1"
    assert flag(argv, "--speculative-num-draft-tokens") == "4"
    assert flag(argv, "--tp-size") == "4"


@pytest.mark.parametrize("k", [1, 3, 5])
def test_sglang_mtp_is_eagle_on_the_target_checkpoint(k):
    """An mtp winner: SGLang serves DeepSeek-V3's MTP layer as --speculative-algorithm EAGLE (NEXTN is its alias),
    a chain of k steps (top-k 1, k+1 tokens verified), and no draft model path: SGLang uses the target's."""
    text = to_sglang(schedule(winner(k=k, drafter="mtp", tp=8), model="/models/deepseek-v3"))
    argv = command(text)
    assert flag(argv, "--model-path") == "/models/deepseek-v3"
    assert flag(argv, "--speculative-algorithm") == "EAGLE"
    assert flag(argv, "--speculative-num-steps") == str(k)
    assert flag(argv, "--speculative-eagle-topk") == "1"
    assert flag(argv, "--speculative-num-draft-tokens") == str(k + 1)
    assert flag(argv, "--speculative-draft-model-path") is None and "None" not in argv
    assert flag(argv, "--tp-size") == "8"
    assert "no --speculative-draft-model-path" in comments(text) and f"mtp k={k} (the model's own MTP layer" in comments(text)


def test_sglang_mtp_k_differs_is_a_comment_table():
    text = to_sglang(schedule(winner(1, k=3, drafter="mtp"), winner(8, k=1, drafter="mtp")))
    assert "#   1 -> 3" in comments(text) and "#   8 -> 1" in comments(text) and "takes one drafter" not in comments(text)
    assert flag(command(text), "--speculative-num-steps") == "3"


@pytest.mark.parametrize(("k", "width", "drafts"), [(4, 3, 12), (6, 3, 16), (3, 8, 16), (5, 2, 10)])
def test_sglang_eagle3_tree(k, width, drafts):
    """An eagle3 tree winner (drafter.tree_width w): k steps, top-k w, and num-draft-tokens = its
    drafts (k x w, at most 16) + the verified token SGLang counts as the tree's root."""
    row = winner(k=k, drafter="eagle3")
    row["drafter_options"]["tree_width"] = width
    text = to_sglang(schedule(row))
    argv = command(text)
    assert flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert flag(argv, "--speculative-draft-model-path") == "/ckpt/eagle3-head"
    assert flag(argv, "--speculative-num-steps") == str(k)
    assert flag(argv, "--speculative-eagle-topk") == str(width)
    assert flag(argv, "--speculative-num-draft-tokens") == str(drafts + 1)
    assert f"drafter.tree_width {width}" in comments(text) and "shape can differ" in comments(text)


@pytest.mark.parametrize("width", [0, 1])
def test_sglang_eagle3_tree_width_0_or_1_is_a_chain(width):
    row = winner(k=3, drafter="eagle3")
    row["drafter_options"]["tree_width"] = width
    text = to_sglang(schedule(row))
    argv = command(text)
    assert (flag(argv, "--speculative-eagle-topk"), flag(argv, "--speculative-num-draft-tokens")) == ("1", "4")
    assert "tree" not in comments(text)


@pytest.mark.parametrize("row", [winner(k=3, drafter="layer_skip"), winner(k=0, drafter="none")])
def test_sglang_without_speculation(row):
    text = to_sglang(schedule(row))
    argv = command(text)
    assert not [a for a in argv if a.startswith("--speculative")]
    assert flag(argv, "--tp-size") == "2"
    assert ("layer_skip" if row["drafter"] == "layer_skip" else "plain decoding") in comments(text)


def test_sglang_k_differs_is_a_comment_table():
    text = to_sglang(schedule(winner(1, k=4), winner(4, k=2), winner(16, k=0, drafter="none")))
    notes = comments(text)
    assert "SGLang takes one k" in notes
    assert "#   1 -> 4" in notes and "#   4 -> 2" in notes and "#   16 -> 0 (plain decoding)" in notes
    assert flag(command(text), "--speculative-num-draft-tokens") == "5"  # the batch-size-1 winner's k 4
    assert "takes one k" not in comments(to_sglang(schedule(winner(1, k=4), winner(4, k=4))))


def test_sglang_without_cuda_graphs():
    assert "--disable-cuda-graph" in command(to_sglang(schedule(winner(engine={"cuda_graphs": False}))))
    assert "--disable-cuda-graph" in command(to_sglang(schedule(winner(engine={"cuda_graphs": "False"}))))
    assert "--disable-cuda-graph" not in command(to_sglang(schedule(winner())))


# ---------------------------------------------------------------------------- env, json, render


def test_env_file():
    text = to_env(schedule(winner(4, k=2, nccl_env={"NCCL_ALGO": "Tree"}), winner(1, k=4, trial=12)))
    settings = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert dict(ln.split("=", 1) for ln in settings) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128", **NVLS_OFF}
    assert settings[-3:] == [f"{k}={v}" for k, v in NVLS_OFF.items()]
    assert "trial 12" in comments(text) and "batch size 1" in comments(text)


def test_env_without_nccl_settings_still_turns_nvls_off():
    text = to_env(schedule(winner(nccl_env={})))
    assert [ln for ln in text.splitlines() if not ln.startswith("#")] == [f"{k}={v}" for k, v in NVLS_OFF.items()]


@pytest.mark.parametrize("nccl_env", [{"NCCL_NVLS_ENABLE": "1"}, {"NCCL_ALGO": "NVLS"}, {"NCCL_NVLS_CHUNKSIZE": "128K"}])
@pytest.mark.parametrize("fmt", ["vllm", "sglang", "trtllm", "env"])
def test_nvls_on_is_refused(nccl_env, fmt):
    with pytest.raises(ValueError, match="NVLS"):
        render(schedule(winner(nccl_env=nccl_env)), fmt)


def test_an_nvls_off_setting_is_kept_once():
    text = to_env(schedule(winner(nccl_env={"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"})))
    assert [ln for ln in text.splitlines() if ln.startswith("NCCL_NVLS_ENABLE")] == ["NCCL_NVLS_ENABLE=0"]


def test_json_round_trips():
    s = schedule(winner(1, k=4), winner(8, k=2, drafter="eagle3"))
    assert json.loads(to_json(s)) == s


def test_render_dispatches_and_rejects_unknown_formats():
    s = schedule(winner())
    for fmt, fn in (("json", to_json), ("vllm", to_vllm), ("sglang", to_sglang), ("trtllm", to_trtllm), ("env", to_env)):
        assert render(s, fmt) == fn(s)
    with pytest.raises(ValueError) as err:
        render(s, "tensorrt")
    assert "tensorrt" in str(err.value) and all(f in str(err.value) for f in FORMATS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_empty_schedule_is_refused(fmt):
    with pytest.raises(ValueError, match="no complete trial"):
        render(schedule(), fmt)
    with pytest.raises(ValueError, match="no complete trial"):
        render({"model": "m", "study": "s"}, fmt)


def test_bad_drafters_are_refused():
    with pytest.raises(ValueError, match="unknown drafter"):
        to_vllm(schedule(winner(drafter="ngram") | {"drafter": "medusa"}))
    with pytest.raises(ValueError, match="model_path"):
        to_sglang(schedule(winner(drafter="eagle3") | {"drafter_options": {}}))
    for fmt in FORMATS:  # mtp names no checkpoint of its own: no model_path is asked for
        render(schedule(winner(drafter="mtp")), fmt)


def test_engine_versions_are_named():
    assert set(ENGINE_VERSIONS) == {"vllm", "sglang", "trtllm"}
    assert all(v.strip() for v in ENGINE_VERSIONS.values())


def test_measurements_that_do_not_transfer_say_so_in_the_first_line(tmp_path):
    """A CPU, float32, gloo study exported for a GPU engine: every text format opens with one line saying
    why its figures are not the engine's; JSON carries the reasons as a list. A GPU bf16 NCCL study: no line."""
    import optuna

    from orchestrator.export.schedule import build_schedule

    study = optuna.create_study(direction="maximize", study_name="smoke-cpu")
    params = {"parallel.tp": 2, "comm.backend": "gloo", "spec.num_draft_tokens": 4, "drafter.kind": "ngram", "drafter.ngram_max": 3}
    study.add_trial(optuna.trial.create_trial(value=5.0, user_attrs={"spectune.params": params, "spectune.repeat_tok_s": [5.0]}))
    cpu = build_schedule(study, model="/cache/smollm2-135m", dtype="float32", device="cpu")
    assert cpu["does_not_transfer"] == [
        "measured on CPU (engines serve on GPUs)",
        "in float32 (engines serve bfloat16 or float16)",
        "with gloo allreduces (engines use NCCL or their own)",
    ]
    for fmt in ("vllm", "sglang", "trtllm", "env"):
        first, *_ = render(cpu, fmt).splitlines()
        assert first.startswith("# CAUTION: these measurements do not transfer to a GPU server: measured on CPU"), (fmt, first)
        assert "float32" in first and "gloo" in first
    assert json.loads(render(cpu, "json"))["does_not_transfer"] == cpu["does_not_transfer"]
    gpu = {**schedule(winner()), "device": "cuda", "does_not_transfer": []}
    assert not any("CAUTION" in render(gpu, fmt) for fmt in FORMATS)
    assert build_schedule(study, dtype="bfloat16", device="cuda")["does_not_transfer"] == [
        "with gloo allreduces (engines use NCCL or their own)"
    ]
