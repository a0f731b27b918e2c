"""``python -m feather_cpu {install,uninstall,status}``."""

from __future__ import annotations

import argparse
import json

from . import install_pth, status, uninstall_pth


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m feather_cpu",
        description="Install, remove or inspect the CPU runtime that lets stock SGLang run without a GPU.",
    )
    parser.add_argument("command", choices=["install", "uninstall", "status"])
    commands = {"install": install_pth, "uninstall": uninstall_pth}
    command = parser.parse_args().command
    print(commands[command]() if command in commands else json.dumps(status(), indent=2))


if __name__ == "__main__":
    main()
