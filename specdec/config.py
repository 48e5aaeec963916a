"""Typed configs for every Hydra group, registered with the ConfigStore.

YAML under ``configs/`` only composes and overrides these. Groups: ``target``, ``drafter``, ``sampling``,
``data``, ``logger`` (and Hydra's own ``hydra/launcher`` and ``hydra/help``); ``experiment`` holds override files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Optional, Union

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


def config_dir() -> str:
    """The Hydra config directory: the checkout's top-level ``configs/`` (editable installs, tests), else
    the copy an installed package ships as ``specdec/configs`` (``setup.py``)."""
    checkout = Path(__file__).resolve().parents[1] / "configs"
    if (checkout / "run.yaml").is_file():
        return str(checkout)
    return str(resources.files("specdec") / "configs")


@dataclass
class TargetConfig:
    name: str = "smollm2-135m"  # alias of the embedded default, a local directory, or a hub id
    dtype: str = "float32"
    device: str = "auto"  # "auto" = cuda when available, else cpu
    max_context: int = 2048  # slots in the static KV cache (prompt + new tokens + lookahead)
    # How the target's forwards run: "auto" = replayed CUDA graphs on a GPU (specdec.models.GraphedDecoder),
    # eager on CPU; "none" = eager everywhere; "cuda_graphs" = graphs, and an error where there is no GPU;
    # "compiled_graphs" = graphs of torch.compile'd forwards (a GPU's fastest step, ~9 s of compiling per shape).
    compile: str = "auto"
    # CPU: stream weights that are 4- or 8-bit codes with per-block scales (a dequantised GGUF model, as the
    # embedded default is) as those codes, 0.75-1.1 bytes a weight, the products bit for bit the same; false =
    # their float32 values (4 bytes: the memory-bound regime, where verifying a few extra tokens is nearly free).
    # The backend the target and the drafter are built on (specdec.models.Backend(weights="codes" | "float")); a draft
    # model with another tokenizer, a model of its own, streams its codes either way.
    coded_weights: bool = True
    # GPU: the fused forwards (the target's, EAGLE's, the block drafter's) on specdec's Triton kernels (five kernels a
    # layer, specdec.models.gpu_kernels); false = torch's ops (the reference; ~1,400 kernels a step for SmolLM2-135M)
    gpu_kernels: bool = True
    # GPU, with gpu_kernels: each RMSNorm (with the residual add before it) and SiLU·up run inside the product that
    # reads them, in steps of up to 64 rows (five kernels a layer; specdec.models.gpu_kernels.normed_product,
    # silu_product); false = apart, the products cuBLAS's. On by the design, its GPU gain not yet measured
    fused_products: bool = True
    # GPU, with gpu_kernels: the products and the attention compute each row in one order whatever the number of
    # tokens or rows a forward carries (specdec.models.gpu_kernels.invariant_linear, the ordered attention), so that
    # a verification (a chain or a tree) gives the plain steps' logits bit for bit; off until its GPU cost is measured
    exact_numerics: bool = False
    # GPU, with gpu_kernels: a step's verdict (greedy; sampled with fixed drafts, no top-k or top-p), a tree's path
    # move and the commit (the kept counts, the tokens written, the lengths moved) in one kernel each
    # (specdec.models.gpu_kernels.greedy_verdict, sampled_verdict, move_path, commit_step) where torch's ops take
    # ~20-180 small ones; false = torch's ops. Its GPU gain not yet measured
    fused_steps: bool = True
    # target=synthetic: the shape of its random weights (a preset of specdec.models.synthetic.SHAPES or a
    # config.json); costs only (experiments/benchmarks/step_costs.py), refused where τ or outputs are reported
    shape: Optional[str] = None


@dataclass
class DrafterConfig:
    name: str = MISSING  # registry key of the drafter class (specdec.drafters.DRAFTERS)
    # lookahead: draft tokens proposed per target forward; "auto" (the main job): chosen per run from a replay of
    # held-out prompts timed on this machine, 0 (no drafting) where nothing pays (RunConfig.auto)
    k: Union[int, str] = 4

    def check(self, job: Any) -> None:
        """Refuse, before any model loads, settings this drafter cannot run with in ``job`` (the composed job config:
        its target, sampling, data). Here the settings several drafters share, where a drafter has them (rounding
        its weights, a confidence threshold, prompt-lookup nodes); a drafter's own ``Config`` adds its rules."""
        bits = getattr(self, "weight_bits", None)
        if bits not in (None, 4, 8):
            raise ValueError(f"drafter.weight_bits must be 4, 8 or null (the weights as trained), got {bits!r}")
        for name in ("min_confidence", "confidence"):
            value = getattr(self, name, 0.0)
            if value is None and getattr(type(self), name, 0.0) is None:  # its default: chosen where it runs
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"drafter.{name} must be a number in [0, 1) (0 = off), got {value!r}")
        lookup = getattr(self, "lookup", 0)
        if isinstance(lookup, bool) or not isinstance(lookup, int) or lookup < 0:
            raise ValueError(f"drafter.lookup (prompt-lookup nodes per tree) must be an integer >= 0, got {lookup!r}")


# Each drafter's own config subclasses DrafterConfig and sits beside it as ``DrafterClass.Config``;
# registering a drafter (specdec.drafters.register) stores it as drafter/<name>_schema. A drafter with weights names
# where they are ``path`` ("default": those shipped for the default target); specdec.load_drafter composes the
# same config from Python (specdec/drafters/loading.py).


@dataclass
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int = 0


@dataclass
class DataConfig:
    sources: list[str] = field(default_factory=lambda: ["mtbench", "humaneval"])
    limit_per_source: Optional[int] = 8  # prompts taken from each source; null = all
    max_new_tokens: int = 64
    batch_size: int = 1
    max_prompt_tokens: Optional[int] = None  # longer prompts are rejected with an error; null = context limit


@dataclass
class LoggerConfig:
    name: str = "none"  # "none" or "wandb"
    project: str = "specdec"
    entity: Optional[str] = None
    mode: str = "offline"  # wandb mode: offline works without a network; `wandb sync` later
    tags: list[str] = field(default_factory=list)


def job_defaults(sampling: str, drafter: str) -> list[Any]:
    """The Hydra defaults list of a decoding job (run, verify_dist): one choice per config group."""
    return [{"target": "smollm2"}, {"drafter": drafter}, {"sampling": sampling}, {"data": "mtbench_humaneval"},
            {"logger": "none"}, "_self_"]


@dataclass
class JobConfig:
    """The config groups a decoding job composes."""

    target: TargetConfig = MISSING
    drafter: DrafterConfig = MISSING
    sampling: SamplingConfig = MISSING
    data: DataConfig = MISSING
    logger: LoggerConfig = MISSING


@dataclass
class AutoConfig:
    """drafter.k=auto (specdec/replay/auto.py): the lookahead is chosen from a replay of held-out prompts (the next
    ones of each of data.sources after the job's own), timed by costs measured at data.batch_size rows."""

    prompts_per_source: int = 4  # held-out calibration prompts from each source (the job's own where none are left)
    max_new_tokens: int = 48  # tokens logged per calibration prompt
    seeds: int = 1  # temperature > 0: sampled continuations logged per calibration prompt
    ks: Optional[list[int]] = None  # sizes tried; null = chains 1..8, trees 4, 8, 12, 16, 24
    margin: float = 0.05  # draft only where the best predicted decode speedup reaches 1 + margin
    log_dir: Optional[str] = None  # where its logs and costs are kept; null = replay/ under specdec's cache


@dataclass
class RunConfig(JobConfig):
    # The main job drafts by prompt lookup (n-gram): the fastest drafter measured on its prompts on a 2-core CPU
    # under greedy decoding (README), its lookahead chosen by drafter.k=auto (configs/run.yaml, which names these
    # choices and sets drafter.k: auto; the drafter presets keep the fixed k other jobs use).
    defaults: list[Any] = field(default_factory=lambda: job_defaults("greedy", "ngram"))
    baseline: bool = True  # also run plain autoregressive decoding on the same prompts (for speedup)
    auto: AutoConfig = field(default_factory=lambda: AutoConfig())  # how drafter.k=auto chooses
    warmup: bool = True  # one untimed short generation first, so timings exclude one-off costs
    results_file: str = "results.json"


# Each entry point's --help (hydra/help=specdec in its YAML): Hydra's own template, whose group list would also
# offer the typed schemas (stored beside the YAML options they extend, e.g. drafter/eagle_schema) and every
# other entry point's groups (train's method group in run's help); this one lists only the groups the entry
# point composes, each with its YAML options.
HELP_TEMPLATE = """${hydra.help.header}
== Configuration groups ==
Compose your configuration from those groups (group=option)

${specdec_help_groups:}

== Config ==
Override anything in the config (foo.bar=value)

$CONFIG

${hydra.help.footer}
"""


def help_groups() -> str:
    """The groups of the job being composed (Hydra's runtime choices), one line each with its options: the
    YAML files in ``configs/<group>/``."""
    from hydra.core.hydra_config import HydraConfig

    groups = sorted(g for g in HydraConfig.get().runtime.choices if not g.startswith("hydra/"))
    return "\n".join(f"{g}: {', '.join(sorted(p.stem for p in Path(config_dir(), g).glob('*.yaml')))}"
                     for g in groups)


def register_configs() -> None:
    """Store the job's typed configs (Hydra's ``*_schema`` nodes) and its help. Each drafter stores its own schema
    when it registers (:func:`specdec.drafters.register`): an entry point imports the drafters before composing."""
    cs = ConfigStore.instance()
    OmegaConf.register_new_resolver("specdec_help_groups", help_groups, replace=True)
    cs.store(group="hydra/help", name="specdec", node={"defaults": ["default", "_self_"], "template": HELP_TEMPLATE})
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="target", name="target_schema", node=TargetConfig)
    cs.store(group="sampling", name="sampling_schema", node=SamplingConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="logger", name="logger_schema", node=LoggerConfig)
