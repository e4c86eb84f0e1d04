"""Issue 16 part 5: inference is its own plan.

The request table (requests read as inference, and the fields each must yield), the KV-cache
and tensor-parallel arithmetic against hand calculations, the reviewer's checks of an
inference plan, and real CLI runs: a serving request gets a serving plan with a KV-cache
budget and an engine command, no DeepSpeed config and no training smoke run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from inproc import run_main

from tools.artifacts.serving import emit_serving
from tools.core.errors import InputError
from tools.core.outputs import listed
from tools.core.schemas import LaunchSpec, SmokeResult, TrainingBrief
from tools.intake.brief import brief_from_dict, request_fields
from tools.planning.inference import kv_bytes_per_token, plan_inference, weights_bytes
from tools.research.hardware import parse_hardware
from tools.research.model_catalog import list_models, lookup_model
from tools.review.inference import check_inference

ROOT = Path(__file__).resolve().parents[2]
MODELS = list_models()

# request -> the fields it must yield (None: the field must be absent).
SERVING_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    (
        "serve qwen2.5-72b for inference on 4 H100",
        {"task": "inference", "model": "qwen2.5-72b", "hardware": "1x4xH100-80GB", "engine": None},
    ),
    (
        "deploy llama-3-8b with TGI for 64 concurrent users, 32k context",
        {"task": "inference", "engine": "tgi", "context_len": 32768, "concurrency": 64},
    ),
    (
        "host llama-3-70b on 8 H100 with DeepSpeed-Inference, context window of 16k, int8",
        {
            "task": "inference",
            "engine": "deepspeed-inference",
            "context_len": 16384,
            "weight_dtype": "int8",
        },
    ),
    (
        "serve our fine-tuned mistral-7b on 2 A100 with fp8 weights for 100 users",
        {"task": "inference", "model": "mistral-7b", "concurrency": 100, "weight_dtype": "fp8"},
    ),
    (
        "We need 2000 tokens/s for users from llama-3-8b on a 4xL40S box, vllm, max-model-len 4096",
        {"task": "inference", "engine": "vllm", "context_len": 4096},
    ),
    (
        "inference endpoint for Qwen/Qwen2.5-7B-Instruct, concurrency 32, 8k context, AWQ 4-bit",
        {
            "task": "inference",
            "model": "Qwen/Qwen2.5-7B-Instruct",  # served as named, not the base weights
            "concurrency": 32,
            "context_len": 8192,
            "weight_dtype": "int4",
        },
    ),
    (
        "用 vLLM 部署 qwen2.5-7b，64 并发，上下文 16k",
        {"task": "inference", "engine": "vllm", "concurrency": 64, "context_len": 16384},
    ),
    (
        "在 8 张 H100 上推理 llama-3-70b，并发数 128",
        {"task": "inference", "model": "llama-3-70b", "concurrency": 128},
    ),
    (
        "serve mixtral-8x7b via text-generation-inference with 16 simultaneous requests",
        {"task": "inference", "engine": "tgi", "concurrency": 16},
    ),
    (
        "serve a chatbot on llama-3-8b for 50 parallel sessions in fp16",
        {"task": "inference", "concurrency": 50, "weight_dtype": "fp16"},
    ),
    # Training verbs win over serving words; a serving word alone names no model.
    (
        "fine-tune llama-3-8b on 8 A100, then serve it with vLLM",
        {"task": "finetune", "engine": None, "concurrency": None},
    ),
    (
        "Our company serves a stable ViT-base model in production; retrain it on 8 A100s",
        {"task": "finetune", "context_len": None},
    ),
    ("pretrain a 7B model from scratch for fast inference", {"task": "pretrain"}),
    ("build an inference assistant for our sales team", {"task": "agent-app", "engine": None}),
]


@pytest.mark.parametrize(
    ("text", "expected"), SERVING_REQUESTS, ids=[r[0][:40] for r in SERVING_REQUESTS]
)
def test_request_table(text: str, expected: dict[str, Any]) -> None:
    fields = request_fields(text, MODELS)
    for key, value in expected.items():
        assert fields.get(key) == value, (key, fields)


def test_a_brief_reads_inference_fields_and_refuses_bad_ones() -> None:
    brief = brief_from_dict(
        {"model": "llama-3-8b", "task": "inference", "context_len": 4096, "concurrency": 8}
    )
    assert (brief.context_len, brief.concurrency, brief.engine) == (4096, 8, None)
    for bad, field in (
        ({"concurrency": 0}, "brief.concurrency"),
        ({"engine": "triton"}, "brief.engine"),
        ({"weight_dtype": "int3"}, "brief.weight_dtype"),
        ({"context_len": True}, "brief.context_len"),
    ):
        with pytest.raises(InputError) as err:
            brief_from_dict({"model": "llama-3-8b", "task": "inference", **bad})
        assert str(err.value).startswith(field), err.value


# ---- arithmetic against hand calculations ------------------------------------------------------


def test_kv_cache_bytes_gqa_by_hand() -> None:
    llama = lookup_model("llama-3-8b", 2048)
    # 32 layers x 8 kv heads x 128 head_dim x 2 bytes x 2 (K and V) = 128 KiB per token.
    assert kv_bytes_per_token(llama) == 32 * 8 * 128 * 2 * 2 == 128 * 1024
    # GQA: the 32 query heads do not count; under TP 4 each GPU keeps 2 of the 8 kv heads.
    assert kv_bytes_per_token(llama, tp=4) == 32 * 2 * 128 * 2 * 2
    # TP 16 > 8 kv heads: vLLM replicates a head, never fewer than one per GPU.
    assert kv_bytes_per_token(llama, tp=16) == 32 * 1 * 128 * 2 * 2
    qwen = lookup_model("qwen2.5-72b", 2048)
    assert kv_bytes_per_token(qwen) == 80 * 8 * 128 * 2 * 2 == 327_680
    gpt2 = lookup_model("gpt2", 1024)  # multi-head attention: every head keeps K and V
    assert kv_bytes_per_token(gpt2) == 12 * 12 * 64 * 2 * 2


def test_qwen_72b_on_4_h100_needs_tp4_not_tp2() -> None:
    model = lookup_model("qwen2.5-72b", 2048)
    brief = TrainingBrief(model="qwen2.5-72b", task="inference")
    plan = plan_inference(model, parse_hardware("1x4xH100-80GB"), brief)
    assert weights_bytes(model, "bf16") == plan.weights_bytes
    assert 145e9 < plan.weights_bytes < 146e9  # 72.7 B params x 2 bytes
    assert plan.tensor_parallel == 4 and plan.pipeline_parallel == 1
    assert "> the 72.0 GB budget" in plan.why_not["tp2"]  # 72.7 GB of weights alone
    assert plan.budget_bytes_per_gpu == int(0.9 * 80e9)
    assert plan.context_len == 8192 and plan.concurrency == 16 and len(plan.defaults) == 3
    assert plan.kv_cache_bytes == 327_680 * 8192 * 16
    assert plan.kv_cache_bytes_per_gpu == plan.kv_cache_bytes // 4
    # (budget - weights/4 - allowance) / (KV per token per GPU x context)
    room = plan.budget_bytes_per_gpu - plan.weights_bytes_per_gpu - plan.activation_bytes_per_gpu
    assert plan.max_concurrency == room // (81_920 * 8192) == 50
    assert plan.fits
    # Decode is memory bound: weights/TP over 80% of 3.35 TB/s is at least 13.5 ms per token.
    assert plan.decode_step_s is not None and 0.0135 < plan.decode_step_s < 0.05
    assert plan.decode_tokens_per_s_total == pytest.approx(16 / plan.decode_step_s)
    assert plan.time_to_first_token_s and plan.time_to_first_token_s > 0.1
    assert plan.command[:5] == [
        "vllm",
        "serve",
        "Qwen/Qwen2.5-72B",
        "--tensor-parallel-size",
        "4",
    ]
    assert "--gpu-memory-utilization" in plan.command and "0.9" in plan.command


def test_small_model_takes_one_gpu_and_replicates() -> None:
    model = lookup_model("llama-3-8b", 2048)
    brief = TrainingBrief(model="llama-3-8b", task="inference", concurrency=8, context_len=4096)
    plan = plan_inference(model, parse_hardware("1x8xH100-80GB"), brief)
    assert (plan.tensor_parallel, plan.replicas, plan.gpus_used) == (1, 8, 8)
    assert plan.defaults == ["bf16 weights (default; fp8, int8 or int4 when asked)"]


def test_pipeline_only_across_nodes_when_a_node_is_not_enough() -> None:
    model = lookup_model("llama-3.1-405b", 2048)
    brief = TrainingBrief(model="llama-3.1-405b", task="inference", concurrency=4, context_len=4096)
    plan = plan_inference(model, parse_hardware("2x8xH100-80GB", "ib400"), brief)
    # 810 GB of bf16 weights > 8 x 72 GB: TP 8 inside each node, PP 2 across the two.
    assert (plan.tensor_parallel, plan.pipeline_parallel) == (8, 2)
    assert "--pipeline-parallel-size" in plan.command
    fp8 = plan_inference(
        model,
        parse_hardware("2x8xH100-80GB", "ib400"),
        brief.model_copy(update={"weight_dtype": "fp8"}),
    )
    # fp8 halves the weights to 405 GB: one node holds them, no pipeline.
    assert (fp8.tensor_parallel, fp8.pipeline_parallel, fp8.replicas) == (8, 1, 2)
    assert fp8.command[-2:] == ["--quantization", "fp8"]


def test_engines_get_their_own_commands(tmp_path: Path) -> None:
    model = lookup_model("llama-3-70b", 2048)
    hw = parse_hardware("1x8xA100-80GB")
    tgi = plan_inference(
        model, hw, TrainingBrief(model="llama-3-70b", task="inference", engine="tgi")
    )
    assert tgi.command[:5] == [
        "text-generation-launcher",
        "--model-id",
        "meta-llama/Meta-Llama-3-70B",
        "--num-shard",
        str(tgi.tensor_parallel),
    ]
    ds = plan_inference(
        model,
        hw,
        TrainingBrief(model="llama-3-70b", task="inference", engine="deepspeed-inference"),
    )
    assert ds.command[:4] == ["deepspeed", "--num_gpus", str(ds.tensor_parallel), "serve_ds.py"]
    launch = emit_serving(tmp_path, ds)
    assert set(launch.files) == {"serve.sh", "serve_ds.py"}
    assert set(listed(tmp_path)) == {"serve.sh", "serve_ds.py"}  # through the manifest
    assert "deepspeed.init_inference" in (tmp_path / "serve_ds.py").read_text()
    compile((tmp_path / "serve_ds.py").read_text(), "serve_ds.py", "exec")


# ---- the reviewer ------------------------------------------------------------------------------


def _reviewed(tmp_path: Path, **change: Any) -> list[Any]:
    model = lookup_model("qwen2.5-72b", 2048)
    hw = parse_hardware("1x4xH100-80GB")
    plan = plan_inference(model, hw, TrainingBrief(model="qwen2.5-72b", task="inference"))
    launch = emit_serving(tmp_path, plan)
    plan = plan.model_copy(update=change)
    skipped = SmokeResult(status="skipped", reason="inference plan: no training smoke run")
    return check_inference(plan, launch, skipped, model, hw, None)


def test_reviewer_approves_the_plan_and_catches_a_bad_one(tmp_path: Path) -> None:
    good = _reviewed(tmp_path)
    assert not [f for f in good if f.severity == "error"], good
    assert any("fits" in f.message for f in good if f.check == "inference_memory")
    bad_tp = _reviewed(tmp_path, tensor_parallel=3)
    assert any("does not divide the 64 attention heads" in f.message for f in bad_tp)
    assert any(f.check == "launch_agrees" and f.severity == "error" for f in bad_tp)
    no_room = _reviewed(tmp_path, max_concurrency=0, fits=False)
    assert any(f.severity == "error" and f.check == "inference_memory" for f in no_room)
    short = _reviewed(tmp_path, concurrency=80, fits=False)
    assert any(f.severity == "warning" and "at most 50" in f.message for f in short)
    ran = check_inference(
        plan_inference(
            lookup_model("gpt2", 1024),
            parse_hardware("1x1xH100-80GB"),
            TrainingBrief(model="gpt2", task="inference"),
        ),
        LaunchSpec(command=["deepspeed"]),
        SmokeResult(status="passed"),
    )
    assert any(f.check == "smoke_verdict" and f.severity == "error" for f in ran)


# ---- the CLI, as a user runs it ------------------------------------------------------------------


def _plan(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    res = run_main("plan", *args, "--out", "o", "--json", "p.json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    return res, json.loads((tmp_path / "p.json").read_text())


@pytest.mark.parametrize("smoke", [False, True], ids=["no-smoke", "smoke-on"])
def test_cli_serves_qwen_72b_on_4_h100(tmp_path: Path, smoke: bool) -> None:
    args = ["serve qwen2.5-72b for inference on 4 H100", *([] if smoke else ["--no-smoke"])]
    res, plan = _plan(tmp_path, *args)
    inference = plan["inference"]
    assert plan["brief"]["task"] == "inference"
    assert inference["tensor_parallel"] == 4 and inference["kv_cache_bytes"] == 327_680 * 8192 * 16
    assert inference["command"][:2] == ["vllm", "serve"]
    assert plan["deepspeed_config"] is None and plan["memory"] is None
    assert plan["smoke_test"] == {
        **plan["smoke_test"],
        "status": "skipped",
        "reason": "inference plan: no training smoke run",
    }
    assert plan["review"]["verdict"] == "approved"
    out = tmp_path / "o"
    assert not (out / "ds_config.json").exists() and not (out / "trainer").exists()
    assert "smoke run:" not in res.stdout + res.stderr  # no training run started
    serve = (out / "serve.sh").read_text()
    assert "vllm serve Qwen/Qwen2.5-72B --tensor-parallel-size 4" in serve
    assert "serve.sh" in listed(out)
    report = (out / "report.md").read_text()
    assert "## Inference" in report and "KV-cache budget" in report and "vllm serve" in report
    assert "inference: vllm, tensor parallel 4" in res.stdout
    from graphs.adapters.core import summarize_plan
    from tools.artifacts.text import summary_paragraph

    said = summary_paragraph(summarize_plan(plan))  # what the LangChain/CrewAI/AutoGen tools say
    assert "tensor parallel 4" in said and "launch: vllm serve" in said and "None" not in said


def test_cli_brief_file_with_tgi(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text(
        "model: llama-3-8b\ntask: inference\nhardware: 1x2xA100-80GB\nengine: tgi\n"
        "context_len: 4096\nconcurrency: 32\n"
    )
    _, plan = _plan(tmp_path, "--brief", "b.yaml")
    assert plan["inference"]["command"][0] == "text-generation-launcher"
    assert "--max-total-tokens" in plan["inference"]["command"]
    assert plan["inference"]["defaults"] == ["bf16 weights (default; fp8, int8 or int4 when asked)"]
    assert (tmp_path / "o" / "serve.sh").exists()


def test_cli_bad_inference_brief_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "b.yaml").write_text("model: llama-3-8b\ntask: inference\nconcurrency: -3\n")
    res = run_main("plan", "--brief", "b.yaml", "--out", "o", cwd=tmp_path)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "brief.concurrency" in lines[0], res.stderr


# ---- an LLM reads the request (the real HTTP client against the tests' fake server) -------------

# Nothing here the parser reads: no catalog id, no size, no serving word it knows ("seventy-two
# billion qwen" is read now: numbers in words are, tools/intake/spelt_text.py).
WORDY_SERVE = "put the biggest qwen behind an API on four H100 cards"


@pytest.fixture
def llm_server() -> Any:
    from test_llm_http import _FakeOpenAI, _serve

    served = _serve("tools")
    url = next(served)
    # What a real model reads from WORDY_SERVE through the RequestBrief tool.
    _FakeOpenAI.brief_args = json.dumps(
        {"model": "Qwen/Qwen2.5-72B-Instruct", "task": "inference", "hardware": "1x4xH100-80GB"}
    )
    yield url, _FakeOpenAI
    served.close()


def test_llm_read_serving_request_gets_the_inference_plan(
    llm_server: Any, settings: Any, tmp_path: Path
) -> None:
    from dataclasses import replace

    from agents.chat_models import load_chat_model
    from graphs import build_graph

    url, fake = llm_server
    # The parser reads the hardware ("four H100 cards") but neither the model nor the task
    # (issue 28: it also says it took the SXM H100, a "_" field that is no brief field).
    read = {k for k in request_fields(WORDY_SERVE, MODELS) if not k.startswith("_")}
    assert read == {"goal", "hardware"}
    settings = replace(settings, llm="openai:fake", base_url=url, llm_timeout_s=5.0)
    model = load_chat_model("openai:fake", base_url=url, timeout_s=5.0)
    plan = build_graph(model, settings=settings).invoke(
        {"request": WORDY_SERVE, "out_dir": str(tmp_path / "p")}
    )["plan"]
    assert plan["brief"]["task"] == "inference" and plan["brief"]["model"] == "qwen2.5-72b"
    assert plan["inference"]["tensor_parallel"] == 4
    assert plan["deepspeed_config"] is None and plan["memory"] is None
    assert plan["smoke_test"]["reason"] == "inference plan: no training smoke run"
    # The engineer's model was never asked: no tool call can make it a training plan.
    offered = {t["function"]["name"] for r in fake.requests for t in r["body"].get("tools", [])}
    assert "plan_parallelism" not in offered and "review_plan" in offered
    assert not (tmp_path / "p" / "ds_config.json").exists()


def test_serve_sh_quotes_the_model_folder_as_one_argument(tmp_path: Path) -> None:
    import shlex

    from tools.planning.inference import serving_command

    model = lookup_model("gpt2", 1024)
    plan = plan_inference(
        model, parse_hardware("1x1xA100-80GB"), TrainingBrief(model="gpt2", task="inference")
    )
    evil = "/models/x; rm -rf ~ $(touch pwned) `id`"
    plan = plan.model_copy(update={"hf_id": evil})
    plan.command = serving_command(plan)
    emit_serving(tmp_path, plan)
    line = next(
        x for x in (tmp_path / "serve.sh").read_text().splitlines() if x.startswith("exec ")
    )
    assert shlex.split(line)[1:] == plan.command and plan.command[2] == evil
    res = subprocess.run(
        ["bash", "-n", str(tmp_path / "serve.sh")], capture_output=True, timeout=30
    )
    assert res.returncode == 0


def test_follow_ups_change_the_serving_fields() -> None:
    from tools.intake.follow_up import follow_up_fields

    brief = {"model": "qwen2.5-72b", "task": "inference", "hardware": "1x4xH100-80GB"}
    assert follow_up_fields("and 64 concurrent users with TGI?", brief, MODELS) == {
        "concurrency": 64,
        "engine": "tgi",
    }
    said = follow_up_fields("what if fp8 weights and a 16k context?", brief, MODELS)
    assert (said["weight_dtype"], said["context_len"]) == ("fp8", 16384)
    # A training verb makes it a training plan again; a training brief gets no serving fields.
    assert follow_up_fields("fine-tune it instead", brief, MODELS)["task"] == "finetune"
    assert "concurrency" not in follow_up_fields("64 users", {**brief, "task": "finetune"}, MODELS)


def test_nothing_fits_names_what_would() -> None:
    model = lookup_model("llama-3.1-405b", 2048)
    brief = TrainingBrief(model="llama-3.1-405b", task="inference")
    plan = plan_inference(model, parse_hardware("1x8xA100-80GB"), brief)
    # 810 GB of bf16 weights on 8 x 72 GB: not one sequence fits; fp8 (405 GB) would.
    assert plan.max_concurrency == 0 and not plan.fits and plan.decode_step_s is None
    assert plan.alternatives[0].startswith("fp8 weights: 50.7 GB per GPU")
    assert any("A100" in a and "GPUs" in a for a in plan.alternatives)
    findings = check_inference(plan, LaunchSpec(command=plan.command), None, model, None, None)
    (error,) = [f for f in findings if f.check == "inference_memory"]
    assert error.severity == "error" and "fp8 weights" in error.fix
    from tools.artifacts.inference_report import inference_line

    assert "does not fit, not even one sequence" in inference_line(plan.model_dump())


def test_an_encoder_has_no_kv_cache_and_keeps_its_own_length() -> None:
    model = lookup_model("vit-base", 197)
    plan = plan_inference(
        model, parse_hardware("1x1xA10G"), TrainingBrief(model="vit-base", task="inference")
    )
    assert (plan.decoder, plan.kv_bytes_per_token, plan.context_len) == (False, 0, 197)
    assert plan.decode_step_s is None and plan.time_to_first_token_s
    assert any("encoder" in a for a in plan.assumptions)


def test_fewer_sequences_than_asked_say_so_on_the_line() -> None:
    from tools.artifacts.inference_report import inference_line

    model = lookup_model("llama-3.1-70b", 16384)
    brief = TrainingBrief(
        model="llama-3.1-70b", task="inference", context_len=16384, concurrency=32
    )
    plan = plan_inference(model, parse_hardware("1x4xL40S"), brief)
    assert not plan.fits and 0 < plan.max_concurrency < 32
    line = inference_line(plan.model_dump())
    assert f"up to {plan.max_concurrency} sequences (not the 32 asked" in line
    enough = plan_inference(
        model, parse_hardware("1x4xL40S"), brief.model_copy(update={"concurrency": 2})
    )
    assert "asked" not in inference_line(enough.model_dump())
