"""What an SLA may hand vLLM besides the search space: options, command-line words, variables.

The engine runs as the tuner's user (the daemon's, for SLAs that come over HTTP or through the
spool), so everything an SLA passes it is allow-listed here and refused otherwise:

* options (``engine.params``, ``engine.args``): those ``search_spaces/vllm.yaml`` declares, plus
  :data:`OPTIONS` below: what is served and how it is laid out, never a path, a plugin, a class
  to import or a network address (``--config``, ``--middleware``, ``--trust-remote-code``,
  ``--tool-parser-plugin``, ``--chat-template``... stay out);
* environment variables (``engine.env``): :data:`ENV_VARS`, each with the shape of its value
  (no paths, no code): thread counts, switches between kernels, timeouts, log levels. Refused
  above all: ``PYTHON*``, ``LD_*``, ``BROWSER`` and the like (they run code), and vLLM's
  variables that name plugins, files, directories, hosts, ports, keys or endpoints
  (``VLLM_PLUGINS``, ``VLLM_LOGGING_CONFIG_PATH``, ``VLLM_ALLOW_INSECURE_SERIALIZATION``,
  ``VLLM_RPC_BASE_PATH``, ``VLLM_HOST_IP``, ``VLLM_API_KEY``, ...);
* :data:`RESERVED_ENV`: variables the launcher sets itself, last (the leased GPUs, offline hub).

To allow another option or variable, add it here with the shape of its value.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

from autotuner.core.options import (
    COUNT,
    FLAG,
    NUMBER,
    WORD,
    EnvRule,
    OptionRule,
    OptionType,
    words,
)
from autotuner.engines.vllm.flags import RESERVED_PARAMS, flag_of

_HERE = "engines/vllm/options.py"


def _opt(
    kind: OptionType,
    low: float | None = None,
    high: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> OptionRule:
    return OptionRule(kind, low, high, choices, _HERE)


# Options an SLA may fix that the search space does not tune (what is served, how it is laid
# out, logging); the space's own options are allowed too, with the space's rules.
OPTIONS: dict[str, OptionRule] = {
    "max_model_len": _opt("int", 1, 10_000_000),
    "dtype": _opt(
        "categorical", choices=("auto", "half", "float16", "bfloat16", "float", "float32")
    ),
    "load_format": _opt(
        "categorical",
        choices=("auto", "pt", "safetensors", "npcache", "dummy", "fastsafetensors"),
    ),
    "seed": _opt("int", 0, 2**32 - 1),
    "max_logprobs": _opt("int", -1, 1_000_000),
    "disable_log_stats": _opt("bool"),
    "enable_log_requests": _opt("bool"),
    "disable_sliding_window": _opt("bool"),
    "disable_cascade_attn": _opt("bool"),
    "disable_custom_all_reduce": _opt("bool"),
    "enable_expert_parallel": _opt("bool"),
    "pipeline_parallel_size": _opt("int", 1, 1024),
    "data_parallel_size": _opt("int", 1, 1024),
    "distributed_executor_backend": _opt("categorical", choices=("mp", "ray", "uni")),
    "max_seq_len_to_capture": _opt("int", 1, 10_000_000),
    "swap_space": _opt("float", 0, 1_000_000),
    "cpu_offload_gb": _opt("float", 0, 1_000_000),
    "kv_cache_memory_bytes": _opt("int", 1, 2**62),
    "num_gpu_blocks_override": _opt("int", 1, 2**31),
    "max_num_partial_prefills": _opt("int", 1, 1024),
    "max_long_partial_prefills": _opt("int", 1, 1024),
    "tokenizer_mode": _opt("categorical", choices=("auto", "hf", "slow", "mistral")),
}

_CPU_LIST = EnvRule(r"auto|nobind|[0-9,|-]{1,200}", "auto, nobind or CPU lists like 0-31|32-63")

# Environment variables an SLA may set, with the shape of their values.
ENV_VARS: dict[str, EnvRule] = {
    # threads of the math libraries and the tokenizer
    "OMP_NUM_THREADS": COUNT,
    "MKL_NUM_THREADS": COUNT,
    "OPENBLAS_NUM_THREADS": COUNT,
    "TORCHINDUCTOR_COMPILE_THREADS": COUNT,
    "TOKENIZERS_PARALLELISM": words("true", "false"),
    # the CPU engine
    "VLLM_CPU_KVCACHE_SPACE": COUNT,
    "VLLM_CPU_OMP_THREADS_BIND": _CPU_LIST,
    "VLLM_CPU_NUM_OF_RESERVED_CPU": COUNT,
    # kernels and compilation
    "VLLM_ATTENTION_BACKEND": EnvRule(r"[A-Z0-9_]{1,64}", "a backend name like FLASH_ATTN"),
    "VLLM_FLASH_ATTN_VERSION": words("2", "3"),
    "VLLM_USE_FLASHINFER_SAMPLER": FLAG,
    "VLLM_USE_DEEP_GEMM": FLAG,
    "VLLM_USE_TRITON_AWQ": FLAG,
    "VLLM_MARLIN_USE_ATOMIC_ADD": FLAG,
    "VLLM_MLA_DISABLE": FLAG,
    "VLLM_KV_CACHE_LAYOUT": words("NHD", "HND"),
    "VLLM_DISABLED_KERNELS": WORD,
    "VLLM_FLOAT32_MATMUL_PRECISION": words("highest", "high", "medium"),
    "VLLM_DISABLE_COMPILE_CACHE": FLAG,
    "VLLM_USE_STANDALONE_COMPILE": FLAG,
    "VLLM_USE_AOT_COMPILE": FLAG,
    "VLLM_ENABLE_INDUCTOR_MAX_AUTOTUNE": FLAG,
    "VLLM_ENABLE_INDUCTOR_COORDINATE_DESCENT_TUNING": FLAG,
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": FLAG,
    "PYTORCH_CUDA_ALLOC_CONF": EnvRule(
        r"[A-Za-z0-9_.,:]{1,200}", "allocator settings like expandable_segments:True"
    ),
    "CUDA_LAUNCH_BLOCKING": FLAG,
    # processes, communication and timeouts
    "VLLM_ENABLE_V1_MULTIPROCESSING": FLAG,
    "VLLM_WORKER_MULTIPROC_METHOD": words("fork", "spawn"),
    "VLLM_ENGINE_READY_TIMEOUT_S": COUNT,
    "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": COUNT,
    "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": COUNT,
    "VLLM_V1_OUTPUT_PROC_CHUNK_SIZE": COUNT,
    "VLLM_DISABLE_PYNCCL": FLAG,
    "VLLM_SKIP_P2P_CHECK": FLAG,
    "VLLM_ALLREDUCE_USE_SYMM_MEM": FLAG,
    "VLLM_USE_NCCL_SYMM_MEM": FLAG,
    "NCCL_P2P_DISABLE": FLAG,
    "NCCL_IB_DISABLE": FLAG,
    "NCCL_SHM_DISABLE": FLAG,
    "NCCL_CUMEM_ENABLE": FLAG,
    "NCCL_DEBUG": words("VERSION", "WARN", "INFO", "TRACE"),
    # logging and telemetry
    "VLLM_LOGGING_LEVEL": words("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    "VLLM_LOG_STATS_INTERVAL": NUMBER,
    "VLLM_NO_USAGE_STATS": FLAG,
    "VLLM_DO_NOT_TRACK": FLAG,
    "DO_NOT_TRACK": FLAG,
}

_LEASE = "set by the autotuner from the devices leased for the run (see 'target')"
_OFFLINE = "set by the autotuner: engines never download (the model is local or generated)"

# Set by the launcher itself, after the SLA's variables.
RESERVED_ENV: dict[str, str] = {
    "CUDA_VISIBLE_DEVICES": _LEASE,
    "NVIDIA_VISIBLE_DEVICES": _LEASE,
    "HIP_VISIBLE_DEVICES": _LEASE,
    "ROCR_VISIBLE_DEVICES": _LEASE,
    "CUDA_DEVICE_ORDER": _LEASE,
    "HF_HUB_OFFLINE": _OFFLINE,
    "TRANSFORMERS_OFFLINE": _OFFLINE,
    "AUTOTUNER_VLLM_PYTHON": "picks the engine's interpreter: use engine.name instead",
}

# Variables that make a program run other code, whatever program it is.
_CODE_VARS = frozenset(
    {"BROWSER", "EDITOR", "VISUAL", "PAGER", "SHELL", "BASH_ENV", "ENV", "PATH", "HOME"}
)
_CODE_PREFIXES = ("PYTHON", "LD_", "DYLD_", "PERL", "RUBY", "NODE_", "GIT_", "SSL_", "GCONV")
# Parts of vLLM's variable names that name code, files, hosts or secrets.
_VLLM_RISKY = re.compile(
    r"PLUGIN|PATH|DIR|ROOT|CACHE|CONFIG|FOLDER|HOST|PORT|_IP|URL|KEY|SERVER|TRACE|INSECURE"
    r"|SERIALIZ|MODELSCOPE|REDIRECT|LORA|MEDIA|RAY|MASTER|SIDE_CHANNEL|DEBUG|DEV_MODE"
)


def _refusal(name: str) -> str:
    if name in _CODE_VARS or name.startswith(_CODE_PREFIXES):
        why = "it can make the engine run other code"
    elif name.startswith("VLLM_") and _VLLM_RISKY.search(name):
        why = "it names code, files, hosts or secrets the engine would use"
    else:
        why = "it is not on the list of harmless variables"
    close = difflib.get_close_matches(name, list(ENV_VARS), n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"an SLA may not set this variable: {why}{hint}; allowed ones: ENV_VARS in {_HERE}"


def check_env(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(name, why)`` for every variable an SLA may not set, or not to that value."""
    problems: list[tuple[str, str]] = []
    for name, value in env.items():
        rule = ENV_VARS.get(name)
        if name in RESERVED_ENV:
            problems.append((name, f"cannot be set here: {RESERVED_ENV[name]}"))
        elif rule is None:
            problems.append((name, _refusal(name)))
        elif (why := rule.problem(value)) is not None:
            problems.append((name, why))
    return problems


def _option_of(flag: str) -> str:
    # vLLM reads `--max_num_seqs` as `--max-num-seqs` (up to the first '.').
    return flag[2:].split(".", 1)[0].replace("-", "_")


def _reserved_refusal(name: str) -> str | None:
    """Why ``--<name>`` rebinds what the tuner owns: the name itself, or an abbreviation
    of it (argparse accepts unambiguous prefixes)."""
    if name in RESERVED_PARAMS:
        return f"cannot be set here: {RESERVED_PARAMS[name]}"
    owned = [r for r in RESERVED_PARAMS if r.startswith(name)]
    if name and owned:
        return f"abbreviates {flag_of(owned[0])}: {RESERVED_PARAMS[owned[0]]}"
    return None


def args_settings(
    args: Sequence[str], rules: Mapping[str, OptionRule]
) -> list[tuple[int, str, bool | int | float | str]]:
    """The options ``engine.args`` sets, in order: ``(index, option, value)`` per option, its
    value typed by its rule (``--enforce-eager`` -> True, ``--no-enforce-eager`` -> False,
    ``--max-num-seqs 3`` / ``--max-num-seqs=3`` -> 3). Words :func:`check_args` refuses are
    skipped: read args it accepted. With this, ``engine.args`` is one more source of the
    options a launch is given (``params``), merged with ``engine.params`` before the engine's
    command line is made, never appended to it as words."""
    out: list[tuple[int, str, bool | int | float | str]] = []
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--") or word == "--":
            i += 1
            continue
        flag, eq, value = word.partition("=")
        name = _option_of(flag)
        negated = name.startswith("no_") and name[3:] in rules
        rule = rules.get(name[3:] if negated else name)
        takes_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        if rule is None or _reserved_refusal(name) is not None:
            i += 2 if takes_next else 1
            continue
        if rule.type == "bool":
            out.append((i, name[3:] if negated else name, not negated))
            i += 1
            continue
        if not eq and not takes_next:
            i += 1
            continue
        out.append((i, name, rule.from_word(value if eq else args[i + 1])))
        i += 1 if eq else 2
    return out


def check_args(args: Sequence[str], rules: Mapping[str, OptionRule]) -> list[tuple[int, str]]:
    """``(index, why)`` for every word of ``engine.args`` that is refused.

    Words are ``--option value``, ``--option=value``, or ``--switch`` / ``--no-switch`` for
    true/false options; an option must be in ``rules`` (the space's and :data:`OPTIONS`) and
    its value must pass its rule. A refused option's value is not reported a second time.
    """
    problems: list[tuple[int, str]] = []
    i = 0
    while i < len(args):
        word = args[i]
        if not word.startswith("--") or word == "--":
            if word.startswith("-") and not word.startswith("--"):
                why = "write options in their long form (--option value)"
            else:
                why = f"{word!r} follows no option (options start with '--')"
            problems.append((i, why))
            i += 1
            continue
        flag, eq, value = word.partition("=")
        name = _option_of(flag)
        takes_next = not eq and i + 1 < len(args) and not args[i + 1].startswith("--")
        refused = _reserved_refusal(name)
        negated = name.startswith("no_") and name[3:] in rules
        rule = rules.get(name[3:] if negated else name)
        if refused is None and (rule is None or (negated and rule.type != "bool")):
            close = difflib.get_close_matches(name, list(rules), n=1)
            hint = f" (did you mean {flag_of(close[0])!r}?)" if close else ""
            refused = (
                f"{flag} is not an option an SLA may set{hint}: only the search space's "
                f"options and those in {_HERE}"
            )
        if refused is not None or rule is None:
            problems.append((i, refused or "refused"))
            i += 2 if takes_next else 1
            continue
        if rule.type == "bool":
            if eq:
                problems.append((i, f"a switch takes no value: write {flag} or --no-{flag[2:]}"))
            i += 1
            continue
        if not eq and not takes_next:
            problems.append((i, f"{flag} needs a value"))
            i += 1
            continue
        at = i if eq else i + 1
        text = value if eq else args[i + 1]
        bad = rule.problem(rule.from_word(text))
        if bad is not None:
            problems.append((at, bad))
        i += 1 if eq else 2
    return problems
