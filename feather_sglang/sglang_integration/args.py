"""``--feather-*`` flags and ``feather_*`` Engine keyword arguments (``docs/design.md``)."""

from __future__ import annotations

import argparse
import logging
import sys

import msgspec

from feather_sglang.config import FeatherConfig, FeatherConfigError
from feather_sglang.sglang_integration import refusals
from feather_sglang.sglang_integration.names import (
    ATTENTION_BACKEND_NAME,
    CONFIG_ATTR,
    POLICY_NAME,
    PREFIX_GROUP,
    SGLANG_VERSION,
    built_in_version,
    feather_config_of,
)

logger = logging.getLogger(__name__)


def _configure(server_args, config: FeatherConfig, given: list[str], setting: str) -> list[str]:
    """Attach ``config`` unless feather refuses ``server_args`` (returns why)."""
    problems = startup_refusals(server_args, check_hooks=True, config=config)
    if problems:
        return problems
    policy = getattr(server_args, "schedule_policy", None)
    if given and policy != POLICY_NAME:
        logger.warning(
            f"feather options {', '.join(given)} are ignored: {setting} is {policy!r}, not 'feather'"
        )
    backend = server_args.attention_backend
    if backend == ATTENTION_BACKEND_NAME and not server_args.disable_cuda_graph:
        server_args.disable_cuda_graph = True
        logger.warning(
            "CUDA graphs are disabled because of --attention-backend feather (as SGLang does for "
            "torch_native): feather's backend does not capture graphs"
        )
    msgspec.Struct.__setattr__(server_args, CONFIG_ATTR, config)
    return []


def _argparse_type(name: str, check):
    def convert(text: str):
        try:
            return check(name, text)
        except FeatherConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name
    return convert


def add_cli_args_after(result, parser: argparse.ArgumentParser):
    """AFTER hook on ``ServerArgs.add_cli_args`` (its None keeps the result): ``--feather-*``."""
    for action in parser._actions:
        if "--schedule-policy" in action.option_strings and action.choices is not None:
            if POLICY_NAME not in action.choices:
                action.choices = list(action.choices) + [POLICY_NAME]
            action.help = (action.help or "") + (
                " 'feather' (feather-sglang plugin): admits the waiting requests that keep the"
                " running batch's shared prefix deepest (chunked hash tree + stop/add agent)."
            )
        if "--load-balance-method" in action.option_strings and action.choices is not None:
            if PREFIX_GROUP not in action.choices:
                action.choices = list(action.choices) + [PREFIX_GROUP]
            action.help = (action.help or "") + (
                f" '{PREFIX_GROUP}' (feather-sglang plugin): a request goes to the worker that"
                " already serves its prefix group, while loads stay within bounds."
            )
    if any(a.dest == "feather_chunk_size" for a in parser._actions):
        return  # already added (parsers are built more than once in some paths)
    group = parser.add_argument_group(
        "feather schedule policy", "Options of --schedule-policy feather (feather-sglang plugin)."
    )
    defaults = FeatherConfig()
    for flag, field in FeatherConfig.options():
        group.add_argument(
            flag,
            dest="feather_" + field.name,
            default=None,
            type=_argparse_type(field.name, field.metadata["check"]),
            help=f"{field.metadata['help']} Default: {getattr(defaults, field.name)}.",
        )


def from_cli_args_after(result, cls, args: argparse.Namespace):
    """AFTER hook on ``ServerArgs.from_cli_args``: validate the flags into a FeatherConfig."""
    values = {k: v for k, v in vars(args).items() if k.startswith("feather_")}
    given = ["--" + k.replace("_", "-") for k, v in values.items() if v is not None]
    try:
        config = FeatherConfig.from_prefixed(values)
        problems = _configure(result, config, given, "--schedule-policy")
    except FeatherConfigError as exc:
        problems = [exc]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(2)
    for name, value in _cpu_defaults(msgspec.structs.asdict(result)).items():
        setattr(result, name, value)
    return result


def _cpu_defaults(values: dict) -> dict:
    """The ServerArgs fields the CPU runtime changes on a GPU-less host (logged)."""
    from feather_cpu import server_defaults

    changes = server_defaults(values)
    if changes:
        logger.warning(
            "feather-sglang CPU runtime (no GPU on this host) set %s; pass them explicitly to "
            "override, or set FEATHER_CPU_RUNTIME_DISABLE=1",
            ", ".join(f"{k}={v}" for k, v in changes.items()),
        )
    return {k: v for k, v in changes.items() if k.islower()}  # not the environment variables


def startup_refusals(
    server_args, check_hooks: bool = False, config: FeatherConfig | None = None
) -> list[str]:
    """Everything about ``server_args`` feather refuses to start with (see ``refusals``)."""
    problems = []
    if getattr(server_args, "schedule_policy", None) == POLICY_NAME:
        config = config or feather_config_of(server_args)
        problems += refusals.policy_refusals(server_args, config.agent)
        missing = refusals.missing_hooks() if check_hooks and built_in_version() is None else []
        if missing:
            problems.append(
                "--schedule-policy feather needs scheduler hooks that SGLang's HookRegistry did "
                f"not apply ({', '.join(missing)}); feather-sglang supports sglang "
                f"{SGLANG_VERSION} (see the log above for why a hook failed)"
            )
    if getattr(server_args, "attention_backend", None) == ATTENTION_BACKEND_NAME:
        problems += refusals.backend_refusals(server_args)
    return problems


def make_engine_server_args_factory(server_args_class):
    """``Engine.server_args_class`` replacement accepting ``feather_*=`` keyword arguments."""

    def build(**kwargs):
        feather_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("feather_")}
        config = FeatherConfig.from_prefixed(feather_kwargs)  # FeatherConfigError: clear message
        kwargs.update(_cpu_defaults(kwargs))
        server_args = server_args_class(**kwargs)
        problems = _configure(server_args, config, list(feather_kwargs), "schedule_policy")
        if problems:
            raise FeatherConfigError("; ".join(problems))
        return server_args

    build.__feather__ = True
    return staticmethod(build)


def patch_engine(engine_module) -> None:
    """Install the factory on ``engine_module.Engine`` (idempotent)."""
    engine = engine_module.Engine
    current = engine.__dict__.get("server_args_class")
    if not getattr(getattr(current, "__func__", None), "__feather__", False):
        engine.server_args_class = make_engine_server_args_factory(engine.server_args_class)
