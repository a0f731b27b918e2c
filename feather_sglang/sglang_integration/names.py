"""The names feather registers with SGLang, and where its configuration travels."""

from __future__ import annotations

from feather_sglang.config import FeatherConfig

SGLANG_VERSION = "0.5.23"
POLICY_NAME = "feather"  # --schedule-policy feather
ATTENTION_BACKEND_NAME = "feather"  # --attention-backend feather
PREFIX_GROUP = "prefix_group"  # --load-balance-method prefix_group (data-parallel routing)
CONFIG_ATTR = "_feather_config"  # the FeatherConfig's attribute on ServerArgs


def feather_config_of(server_args) -> FeatherConfig:
    """The FeatherConfig a ServerArgs carries (defaults if it carries none)."""
    return getattr(server_args, CONFIG_ATTR, None) or FeatherConfig()


def built_in_version():
    """The sglang version ``patches/`` was written for, if this sglang was patched; else None."""
    try:
        from sglang.srt import plugins
    except ImportError:
        return None
    return getattr(plugins, "FEATHER_BUILT_IN", None)
