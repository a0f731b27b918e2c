# Sourced by the setup scripts: `lock FILE` prints a CPU lock file for pip. The lock files name
# PyTorch's CPU wheel index; an index pip cannot reach costs seconds per package, so where it is
# unreachable (an offline mirror) the line is left out and pip's configured indexes must hold
# torch==2.13.0+cpu. Probed once, with the python in $VENV.
torch_index=https://download.pytorch.org/whl/cpu
if "$VENV/bin/python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)" "$torch_index/torch/" 2>/dev/null; then
  lock() { cat "$1"; }
else
  echo "setup: $torch_index cannot be reached; torch==2.13.0+cpu must come from pip's configured indexes"
  lock() { grep -v -- "^--extra-index-url $torch_index\$" "$1"; }
fi
