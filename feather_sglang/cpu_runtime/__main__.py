"""``python -m feather_sglang.cpu_runtime {install,uninstall,status}``."""

from __future__ import annotations

import argparse
import json

from . import install_pth, status, uninstall_pth


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m feather_sglang.cpu_runtime",
        description="Install, remove or inspect the CPU runtime that lets stock SGLang run without a GPU.",
    )
    parser.add_argument("command", choices=["install", "uninstall", "status"])
    args = parser.parse_args()
    if args.command == "install":
        print(install_pth())
    elif args.command == "uninstall":
        print(uninstall_pth())
    else:
        print(json.dumps(status(), indent=2))


if __name__ == "__main__":
    main()
