"""Where feather touches SGLang 0.5.23: its ``HookRegistry`` only (``docs/design.md``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import sys

from feather_sglang.sglang_integration.names import (
    ATTENTION_BACKEND_NAME,
    SGLANG_VERSION,
    built_in_version,
)

logger = logging.getLogger(__name__)

_SCHED = "sglang.srt.managers.scheduler"
_installed = False


def after_import(module_name: str, patch) -> None:
    """Run ``patch(module)`` now if ``module_name`` is imported, else right after its import."""
    module = sys.modules.get(module_name)
    if module is not None:
        patch(module)
        return
    sys.meta_path.insert(0, _PostImportFinder(module_name, patch))


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds one module with the other finders, and runs ``patch`` once the module has executed."""

    def __init__(self, module_name: str, patch) -> None:
        self.module_name, self.patch = module_name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.module_name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        real_exec, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            real_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module  # this spec's own loader
        return spec


def install_hooks() -> None:
    """Register feather's hooks with SGLang's HookRegistry (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    import feather_cpu
    from feather_sglang.sglang_integration import args, dp_routing, policy

    if getattr(sglang, "__version__", SGLANG_VERSION) != SGLANG_VERSION:
        logger.warning(
            "feather-sglang was written for sglang %s; found %s", SGLANG_VERSION, sglang.__version__
        )
    reg = HookRegistry.register
    reg(
        "sglang.srt.distributed.bootstrap._init_cpu_threads_env",
        feather_cpu.bind_rank_threads_around,
        HookType.AROUND,
    )
    built_in = built_in_version()
    if built_in is not None:
        # Installing the hooks too would run every seam twice (two planners per pass).
        logger.info(
            "feather is built into this sglang (patches/, %s): plugin hooks not installed", built_in
        )
    else:
        reg("sglang.srt.server_args.ServerArgs.add_cli_args", args.add_cli_args_after)
        reg("sglang.srt.server_args.ServerArgs.from_cli_args", args.from_cli_args_after)
        after_import("sglang.srt.entrypoints.engine", args.patch_engine)
        # --attention-backend feather: the choice now, the class where the registry is loaded.
        from sglang.srt.arg_groups.choices import (
            ATTENTION_BACKEND_CHOICES,
            add_attention_backend_choices,
        )

        if ATTENTION_BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
            add_attention_backend_choices([ATTENTION_BACKEND_NAME])
        after_import(
            "sglang.srt.layers.attention.attention_registry",
            lambda registry: importlib.import_module(f"{__name__}.attention").register(registry),
        )
        reg(f"{_SCHED}.SchedulePolicy", policy.FeatherSchedulePolicy, HookType.REPLACE)
        reg(
            "sglang.srt.managers.data_parallel_controller.DataParallelController.__init__",
            dp_routing.data_parallel_controller_init_around,
            HookType.AROUND,
        )
        for method, (hook, kind) in policy.SCHEDULER_HOOKS.items():
            reg(f"{_SCHED}.Scheduler.{method}", hook, HookType[kind])
