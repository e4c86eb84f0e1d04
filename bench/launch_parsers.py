r"""Run the real tools' own parsers on the launch files of planned folders, one line per file.

    .venv/bin/python bench/launch_parsers.py /tmp/audit6/* \
        --titan-python /tmp/tt/bin/python --megatron-src /tmp/mds \
        --megatron-python /tmp/tt/bin/python

Each folder is one ``app.py plan ... --out FOLDER``. For every folder:

* shell: ``bash -n`` on launch.sh, launch_node{R}.sh and train.sbatch, a scan for variables a
  script reads that it neither sets, defaults nor checks (``set -u`` would end it with
  'unbound variable'), and a dry run of each script in a copy of the folder with stub commands
  on PATH (deepspeed, torchrun, srun, scontrol, scancel, python3) that record their arguments, in
  an environment holding only PATH, HOME, what the script's header says to export (MEGATRON_DIR)
  and, for train.sbatch, SLURM's variables. The recorded command lines are what the checks below
  parse, so they read the arguments as the launch passes them.
* launchers: torchrun's own parser (torch.distributed.run.get_args_parser) and DeepSpeed's
  (deepspeed.launcher.runner.parse_args) on the launcher's part of each command line.
* trainer/train.py: its parse_args and the argument checks it runs at start.
* torchtitan.toml: torchtitan's ConfigManager.parse_args on the arguments after
  ``-m torchtitan.train``, the flavor in the model's train spec, ParallelDims with the launch's
  world size, the batch and pipeline-microbatch checks of torchtitan/train.py and
  distributed/pipeline_parallel.py, and module_fqns_per_model_part against the model built on
  the meta device. Runs under ``--titan-python`` (a venv with torchtitan installed); skipped
  with one line when it is not given or cannot import torchtitan.
* Megatron-DeepSpeed: megatron.arguments.parse_args and validate_args from ``--megatron-src``
  (a checkout of github.com/deepspeedai/Megatron-DeepSpeed) with WORLD_SIZE the launch's; skipped
  with one line when it is not given.
* ds_config.json: deepspeed.runtime.config.DeepSpeedConfig with the data-parallel size the
  launch runs (Megatron's validate_args data_parallel_size through its mpu, else the world size: train.py
  passes no mpu, AutoTP included), which asserts
  train_batch_size = micro x accumulation x data-parallel size; any "auto" value is a finding.
  ds_config_hf.json (HF Trainer's, with "auto") is read by transformers' HfTrainerDeepSpeedConfig
  where transformers imports.

Nothing here is needed by the tests: CI has neither the torchtitan venv nor the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPTS = ("launch.sh", "launch_node*.sh", "train.sbatch", "convert_checkpoint.sh")
STUB = """#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
if name.startswith("python") and args[:1] == ["-c"] and "importlib.metadata" in args[1]:
    print("0.2.2")
    sys.exit(0)
if name == "scontrol":
    print("\\n".join(f"node{{i}}" for i in range(int(os.environ.get("SLURM_NNODES", "1")))))
    sys.exit(0)
if name == "scancel":
    sys.exit(0)
if name == "srun":
    while args and args[0].startswith("-"):
        args = args[1:]
    os.execvp(args[0], args)
with open(os.environ["TW_RECORD"], "a") as out:
    out.write(json.dumps({{"cmd": name, "argv": args, "cwd": os.getcwd()}}) + "\\n")
"""
STUBBED = (
    "deepspeed",
    "torchrun",
    "srun",
    "scontrol",
    "scancel",
    "python",
    "python3",
    "accelerate",
)
KNOWN = {"HOME", "PWD", "PATH", "SLURM_JOB_NODELIST", "SLURM_NODEID", "SLURM_PROCID"}
SLURM_SET = {"SLURM_JOB_ID", "SLURM_SUBMIT_DIR", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}


def unguarded_vars(text: str, sbatch: bool) -> list[str]:
    """Variables the script reads that it neither sets, defaults nor checks."""
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", body))
    assigned = set(re.findall(r"(?:^|[\s;|&(])(?:export\s+|local\s+)?([A-Za-z_]\w*)=", body, re.M))
    assigned |= set(re.findall(r"mapfile\s+-t\s+(\w+)", body))
    assigned |= set(re.findall(r"\bfor\s+(\w+)\s+in\b", body))
    guarded = set(re.findall(r"\$\{([A-Za-z_]\w*):?[-+?=]", body))
    known = KNOWN | (SLURM_SET if sbatch else set())
    return sorted(used - assigned - guarded - known)


def dry_run(folder: Path, script: Path, megatron_src: str | None) -> tuple[int, str, list[dict]]:
    """Run one script in a copy of its folder with stub launchers; (rc, stderr tail, records)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "plan"
        shutil.copytree(folder, work)
        # What TORCHTITAN.md says to put there; launch.sh stops with one line without them.
        (work / "assets" / "tokenizer").mkdir(parents=True)
        (work / "assets" / "tokenizer" / "tokenizer.json").write_text("{}")
        (work / "hf_checkpoint").mkdir(exist_ok=True)
        (work / "hf_checkpoint" / "model.safetensors").write_text("")
        # What MEGATRON.md says: convert_checkpoint.sh HF_MODEL_DIR, then launch.sh.
        (work / "checkpoints" / "converted").mkdir(parents=True, exist_ok=True)
        (work / "checkpoints" / "converted" / "latest").write_text("global_step0")
        (work / "hf_checkpoint" / "config.json").write_text("{}")
        stubs = Path(tmp) / "bin"
        stubs.mkdir()
        for name in STUBBED:
            stub = stubs / name
            stub.write_text(STUB.format(python=sys.executable))
            stub.chmod(0o755)
        record = Path(tmp) / "record.jsonl"
        env = {"PATH": f"{stubs}:/usr/bin:/bin", "HOME": tmp, "TW_RECORD": str(record)}
        if script.name == "convert_checkpoint.sh":
            env["HF_MODEL"] = str(work / "hf_checkpoint")
        text = script.read_text()
        if "MEGATRON_DIR" in text:
            env["MEGATRON_DIR"] = megatron_src or tmp
        if script.name == "train.sbatch":
            nodes = re.search(r"#SBATCH --nodes=(\d+)", text)
            count = nodes.group(1) if nodes else "1"
            env |= {"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(work), "SLURM_NNODES": count}
            env |= {"SLURM_JOB_NODELIST": f"node[0-{int(count) - 1}]", "SLURM_NODEID": "0"}
        proc = subprocess.run(
            ["bash", str(work / script.name)], env=env, capture_output=True, text=True, timeout=60
        )
        records = (
            [json.loads(line) for line in record.read_text().splitlines()]
            if record.exists()
            else []
        )
        return proc.returncode, proc.stderr.strip()[-300:], records


def world_of(record: dict) -> tuple[int, list[str], list[str]]:
    """(world size, launcher options, program and its arguments), as the launcher parses them."""
    argv = record["argv"]
    program = next(i for i, arg in enumerate(argv) if arg.endswith(".py") or arg == "-m")
    launcher, rest = argv[:program], argv[program:]
    try:
        if record["cmd"] == "torchrun":
            from torch.distributed.run import get_args_parser

            opts = get_args_parser().parse_args(argv)
            return int(opts.nnodes) * int(opts.nproc_per_node), launcher, rest
        from deepspeed.launcher.runner import parse_args as ds_parse

        opts = ds_parse(argv)
        # -1: every host of the hostfile, one (this machine) without one.
        nodes = int(opts.num_nodes) if int(opts.num_nodes) > 0 else 1
        return nodes * int(opts.num_gpus), launcher, rest
    except SystemExit:  # check_launcher says why
        return 0, launcher, rest


def check_launcher(record: dict) -> str:
    """The launcher's own parser (torchrun's or DeepSpeed's) on its options."""
    _, launcher, rest = world_of(record)
    try:
        if record["cmd"] == "torchrun":
            from torch.distributed.run import get_args_parser

            get_args_parser().parse_args([*launcher, *rest])
        else:
            from deepspeed.launcher.runner import parse_args as ds_parse

            ds_parse([*launcher, *rest])
    except SystemExit as stop:
        return f"FAIL {record['cmd']} parser exit {stop.code}"
    return f"ok {record['cmd']} parser"


def check_train_py(folder: Path, rest: list[str]) -> str:
    """trainer/train.py's parse_args and its start-up argument checks."""
    code = (
        "import sys; sys.path.insert(0, 'trainer'); import train\n"
        "a = train.parse_args(sys.argv[1:]); p = train._argument_problem(a)\n"
        "print('problem: ' + p if p else 'ok')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, *rest[1:]],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode or out != "ok":
        return f"FAIL train.py rc={proc.returncode} {out} {proc.stderr.strip()[-200:]}"
    return "ok train.py parse_args"


TITAN = r"""
import json, sys, torch
from torchtitan.config import ConfigManager
from torchtitan.protocols.train_spec import get_train_spec
from torchtitan.distributed.parallel_dims import ParallelDims
import torchtitan.models
req = json.load(sys.stdin)
cfg = ConfigManager().parse_args(req["args"])
spec = get_train_spec(cfg.model.name)
problems = []
if cfg.model.flavor not in spec.model_args:
    problems.append(f"flavor {cfg.model.flavor} not in {sorted(spec.model_args)}")
from torchtitan.hf_datasets.text_datasets import DATASETS
if cfg.checkpoint.initial_load_in_hf and spec.state_dict_adapter is None:
    problems.append(f"{cfg.model.name} has no state_dict_adapter to load Hugging Face weights")
if cfg.training.dataset not in DATASETS:
    problems.append(f"training dataset {cfg.training.dataset} not in {sorted(DATASETS)}")
if cfg.validation.enable and cfg.validation.dataset not in DATASETS:
    problems.append(f"validation dataset {cfg.validation.dataset} not in {sorted(DATASETS)}")
p = cfg.parallelism
dims = ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
    cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
    ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=req["world"])
batch_degree = dims.dp_replicate * dims.dp_shard
t = cfg.training
gbs = t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * batch_degree
if gbs % (t.local_batch_size * batch_degree):
    problems.append(f"global batch {gbs} % (local {t.local_batch_size} x dp {batch_degree}) != 0")
if dims.pp > 1:
    if t.local_batch_size % p.pipeline_parallel_microbatch_size:
        problems.append("local batch not divisible by pipeline microbatch size")
    elif t.local_batch_size // p.pipeline_parallel_microbatch_size < dims.pp:
        problems.append("fewer microbatches than stages (torchtitan warns: bubble)")
    if problems == [] or cfg.model.flavor in spec.model_args:
        args = spec.model_args[cfg.model.flavor]
        with torch.device("meta"):
            model = spec.model_cls(args)
        tops = [n for n, _ in model.named_children() if n != "layers"]
        want = ["tok_embeddings"] + [f"layers.{n}" for n, _ in model.layers.named_children()] + ["norm", "output"]
        got = [f for part in p.module_fqns_per_model_part or [] for f in part]
        if p.module_fqns_per_model_part and got != want:
            problems.append(f"module_fqns_per_model_part covers {len(got)} of {len(want)} modules or out of order")
        if p.module_fqns_per_model_part and len(p.module_fqns_per_model_part) % dims.pp:
            problems.append("stage count not a multiple of pipeline degree")
print(json.dumps({"problems": problems, "dp": batch_degree, "flavor": cfg.model.flavor,
                  "degrees": [dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.pp]}))
"""


def check_titan(folder: Path, rest: list[str], world: int, titan_python: str | None) -> str:
    """The config the launch passes through torchtitan's ConfigManager and checks."""
    if not titan_python:
        return "SKIP torchtitan: no --titan-python (a venv with torchtitan==0.2.2)"
    args = rest[rest.index("torchtitan.train") + 1 :]
    proc = subprocess.run(
        [titan_python, "-c", TITAN],
        input=json.dumps({"args": args, "world": world}),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode:
        tail = [line for line in proc.stderr.splitlines() if "Error" in line or "error" in line]
        return f"FAIL torchtitan: {' | '.join(tail[-2:])[:400]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    verdict = "FAIL" if result["problems"] else "ok"
    return f"{verdict} torchtitan flavor {result['flavor']} degrees {result['degrees']} world {world} {result['problems'] or ''}"


MEGATRON = r"""
import json, os, sys
req = json.load(sys.stdin)
os.environ["WORLD_SIZE"] = str(req["world"]); os.environ["RANK"] = "0"
sys.argv = [req["program"], *req["args"]]
from megatron.arguments import parse_args, validate_args
import importlib.machinery, importlib.util, types
from unittest import mock
stubbed = []
if importlib.util.find_spec("torchvision") is None:  # megatron.training's imports reach a
    class _Stub(types.ModuleType):  # vision dataset module; nothing here runs it
        def __getattr__(self, name):
            return mock.MagicMock(name=f"{self.__name__}.{name}")
    for name in ("torchvision", "torchvision.transforms", "torchvision.datasets"):
        module = _Stub(name)
        module.__spec__, module.__path__ = importlib.machinery.ModuleSpec(name, None), []
        sys.modules[name] = module
    stubbed.append("torchvision")
try:  # what torchrun runs first: the script's imports (megatron.training among them)
    if req["program"].endswith("hf2megads_weight_converter.py"):
        import tools.hf2megads_weight_converter
    else:
        import pretrain_gpt
    imports = "ok"
except Exception as err:
    imports = f"{type(err).__name__}: {err}"
if imports != "ok" and req["program"].endswith("hf2megads_weight_converter.py"):
    print(json.dumps({"imports": imports, "stubbed": stubbed, "dp": None}))
    sys.exit(0)
if req["program"].endswith("hf2megads_weight_converter.py"):
    from tools.hf2megads_weight_converter import add_extra_args  # its initialize_megatron's
    args = parse_args(add_extra_args)
    validate_args(args, {})
else:  # pretrain_gpt.py's pretrain(..., args_defaults=...)
    args = parse_args()
    validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
print(json.dumps({"dp": args.data_parallel_size, "tp": args.tensor_model_parallel_size,
                  "pp": args.pipeline_model_parallel_size, "gbs": args.global_batch_size,
                  "micro": args.micro_batch_size, "zero": args.zero_stage,
                  "ds_config": args.deepspeed_config, "imports": imports, "stubbed": stubbed}))
"""


def check_megatron(
    folder: Path, rest: list[str], world: int, src: str | None, python: str
) -> tuple[str, int | None]:
    """Megatron-DeepSpeed's parse_args and validate_args on pretrain_gpt.py's arguments."""
    if not src:
        return "SKIP megatron: no --megatron-src (a Megatron-DeepSpeed checkout)", None
    proc = subprocess.run(
        [python, "-c", MEGATRON],
        input=json.dumps({"args": rest[1:], "world": world, "program": rest[0]}),
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=src,
    )
    if proc.returncode:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-2:]
        return f"FAIL megatron parse/validate: {' | '.join(tail)[:300]}", None
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["imports"] != "ok":
        return f"FAIL megatron import of {Path(rest[0]).name}: {result['imports']}", result["dp"]
    # DeepSpeed runs the config's batch and ZeRO stage; Megatron loads data by its own flags.
    name = result.pop("ds_config")
    config = json.loads((folder / name).read_text()) if name else {}
    stated = (
        config.get("train_batch_size"),
        config.get("train_micro_batch_size_per_gpu"),
        (config.get("zero_optimization") or {}).get("stage", 0),
    )
    if config and stated != (result["gbs"], result["micro"], result["zero"]):
        return f"FAIL megatron flags vs {name} (batch, micro, zero): {result} vs {stated}", None
    return f"ok megatron parse_args+validate_args, agrees with {name} {result}", result["dp"]


def check_ds_config(path: Path, dp: int, megatron: bool) -> str:
    """DeepSpeedConfig as deepspeed.initialize builds it for the launch.

    Megatron-DeepSpeed passes its mpu (or a PipelineModule's grid): DeepSpeed counts the
    data-parallel group. train.py passes none: DeepSpeed counts dist.get_world_size(), the
    launch's world (AutoTP included).
    """
    import types

    import deepspeed.runtime.config as ds_config

    raw = json.loads(path.read_text())
    autos = [k for k, v in _flatten(raw) if v == "auto"]
    if autos:
        return f"FAIL {path.name}: auto values {autos}"
    ds_config.dist = types.SimpleNamespace(get_rank=lambda: 0, get_world_size=lambda group=None: dp)
    mpu = types.SimpleNamespace(get_data_parallel_world_size=lambda: dp) if megatron else None
    try:
        cfg = ds_config.DeepSpeedConfig(str(path), mpu=mpu)
    except Exception as err:  # noqa: BLE001 - the verdict is the error
        return f"FAIL {path.name} DeepSpeedConfig (dp {dp}): {str(err)[:300]}"
    return (
        f"ok {path.name} DeepSpeedConfig: {cfg.train_batch_size} = {cfg.train_micro_batch_size_per_gpu}"
        f" x {cfg.gradient_accumulation_steps} x {'dp' if megatron else 'world'} {dp},"
        f" zero {cfg.zero_optimization_stage}"
    )


def _check_hf(path: Path) -> str:
    """HF Trainer's flavour: its "auto" values are the Trainer's to fill; parsed, not sized."""
    autos = [k for k, v in _flatten(json.loads(path.read_text())) if v == "auto"]
    try:
        from transformers.integrations.deepspeed import HfDeepSpeedConfig
    except Exception as err:  # noqa: BLE001
        return f"SKIP {path.name}: transformers does not import ({err})"
    HfDeepSpeedConfig(str(path))
    return f"ok {path.name} HfDeepSpeedConfig (autos for HF Trainer: {len(autos)})"


def _flatten(value: object, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _flatten(v, f"{prefix}{k}.")]
    return [(prefix.rstrip("."), value)]


def check_folder(
    folder: Path, titan_python: str | None, megatron_src: str | None, megatron_python: str
) -> list[str]:
    """One line per launch file and parser of one plan folder."""
    lines: list[str] = []
    ranks: dict[str, int] = {}  # ds_config file -> the ranks DeepSpeed counts for it
    worlds: dict[str, int] = {}  # script -> the world its training launch starts
    scripts = sorted({p for pattern in SCRIPTS for p in folder.glob(pattern)})
    for script in scripts:
        name = f"{folder.name}/{script.name}"
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        loose = unguarded_vars(script.read_text(), script.name == "train.sbatch")
        rc, err, records = dry_run(folder, script, megatron_src)
        records = [r for r in records if r["cmd"] in ("torchrun", "deepspeed")]
        run_ok = rc == 0 and records
        verdict = "ok" if syntax.returncode == 0 and not loose and run_ok else "FAIL"
        lines.append(
            f"{verdict} {name}: bash -n rc={syntax.returncode}; unguarded vars {loose or 'none'};"
            f" dry run rc={rc}, {len(records)} launch(es){'; ' + err if rc else ''}"
        )
        for record in records:
            world, _, rest = world_of(record)
            if not rest[0].endswith("hf2megads_weight_converter.py"):
                worlds[script.name] = world
            config = (
                rest[rest.index("--deepspeed_config") + 1] if "--deepspeed_config" in rest else None
            )
            lines.append(f"  {check_launcher(record)} {name}")
            if rest[0].endswith("train.py") and "trainer" in rest[0]:
                lines.append(f"  {check_train_py(folder, rest)} {name}")
                if config:
                    ranks[config] = world  # train.py passes no mpu
            elif rest[:2] == ["-m", "torchtitan.train"]:
                lines.append(f"  {check_titan(folder, rest, world, titan_python)} {name}")
            elif rest[0].endswith(("pretrain_gpt.py", "hf2megads_weight_converter.py")):
                line, dp = check_megatron(folder, rest, world, megatron_src, megatron_python)
                lines.append(f"  {line} {name}")
                if config and dp is not None:
                    ranks[config] = dp  # Megatron's mpu: the data-parallel group
    if len(set(worlds.values())) > 1:
        lines.append(f"FAIL {folder.name}: the scripts start different worlds {worlds}")
    megatron = (folder / "MEGATRON.md").exists()
    for config_path in sorted(folder.glob("ds_config*.json")):
        if config_path.name == "ds_config_hf.json":
            lines.append(f"{_check_hf(config_path)} ({folder.name})")
        elif config_path.name not in ranks:
            lines.append(
                f"SKIP {folder.name}/{config_path.name}: no launch passes it a known rank count"
            )
        else:
            count = ranks[config_path.name]
            lines.append(f"{check_ds_config(config_path, count, megatron)} ({folder.name})")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Check every plan folder given; exit 1 when any line fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--titan-python", help="python of a venv with torchtitan==0.2.2")
    parser.add_argument("--megatron-src", help="a Megatron-DeepSpeed checkout")
    parser.add_argument(
        "--megatron-python",
        default=sys.executable,
        help="the Python Megatron-DeepSpeed runs under (torch, deepspeed, transformers)",
    )
    args = parser.parse_args(argv)
    failed = 0
    for folder in args.folders:
        if not (folder / "plan.json").exists():
            continue
        for line in check_folder(
            folder, args.titan_python, args.megatron_src, args.megatron_python
        ):
            failed += line.lstrip().startswith("FAIL")
            print(line, flush=True)
    print(f"{failed} failing line(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
