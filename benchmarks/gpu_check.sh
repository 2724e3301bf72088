#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): bash benchmarks/gpu_check.sh --out gpu-check
# Add --cpu to run the same flow on the CPU with small shapes.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/gpu_check.py" "$@"
