#!/usr/bin/env bash
# Checks the accelerator install route without installing it (the CUDA wheels are gigabytes): pip's dry run
# of a fresh `pip install '.[EXTRA]'` for each extra, then that the CUDA plugin and jaxlib it would install
# are the jax release it would install. Prints one line per extra; exits non-zero if any does not resolve.
#   bash benchmarks/check_gpu_install.sh                 # cuda12 and cuda13
#   bash benchmarks/check_gpu_install.sh cuda12          # or: make check-gpu-install EXTRAS=cuda12
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3
status=0
extras=("$@")
[ ${#extras[@]} -gt 0 ] || extras=(cuda12 cuda13)
for extra in "${extras[@]}"; do
  report="$(mktemp)" log="$(mktemp)"
  # --ignore-installed: resolve as a new environment would, whatever this one already holds
  if ! "$python" -m pip install --dry-run --quiet --ignore-installed --report "$report" ".[$extra]" >"$log" 2>&1; then
    tail -n 20 "$log"; echo "$extra: does not resolve (pip's last lines above)"; status=1; continue
  fi
  "$python" - "$report" "$extra" <<'PY' || status=1
import json
import sys

report, extra = sys.argv[1:]
versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.load(open(report))["install"]}
plugin = f"jax-{extra}-plugin"
jax, wanted = versions.get("jax"), [plugin, f"jax-{extra}-pjrt", "jaxlib"]
missing = [name for name in wanted if name not in versions]
off = {name: versions[name] for name in wanted if name in versions and versions[name] != jax}
cuda = sorted(name for name in versions if name.startswith("nvidia-"))
if missing or off:
    sys.exit(f"{extra}: jax {jax} but missing {missing}, other releases {off}")
print(f"{extra}: resolves to jax {jax} with {plugin}, {plugin.replace('plugin', 'pjrt')} and jaxlib {jax}, "
      f"{len(cuda)} NVIDIA library wheels ({', '.join(cuda[:3])}, ...), {len(versions)} packages in all")
PY
  rm -f "$report" "$log"
done
exit $status
